/* ops.c's and attention.c's entry points, for step.c (a decode step's layers call the same kernels in one
 * pass) and for the jobs ops.py hands the kernels' thread team. */
#ifndef NVLLM_OPS_H
#define NVLLM_OPS_H

#include <stdint.h>

/* k_pool, v_pool: pages in KV format fmt, a GGUF type id (F32, F16, BF16 or Q8_0: ops.c) */
int paged_decode_attention(const float *q, int64_t q_stride, const void *k_pool, const void *v_pool,
                           const int32_t *block_tables, int64_t table_stride, const int64_t *context_lens,
                           float *out, int64_t S, int64_t nh, int64_t nkv, int64_t hd, int64_t bs, int fmt,
                           int64_t window);
void silu_mul(const float *gate_up, float *out, int64_t T, int64_t inter);
void gelu_tanh_mul(const float *gate_up, float *out, int64_t T, int64_t inter);
void gelu_erf(float *x, int64_t n);
void rms_norm(const float *x, const float *weight, float *out, int64_t T, int64_t H, float eps);
void rope_write_kv(float *qkv, int64_t T, int64_t row_stride, int64_t nq, int64_t nk, int64_t hd,
                   const float *cos_t, const float *sin_t, float q_scale, const int64_t *slots, void *k_pool,
                   void *v_pool, int fmt);

/* The same split finer, for step.c's team: query heads q0 .. q1 of every sequence; columns c0 .. c1 of one
 * row; rms_norm's scale of a row (rms_inv) and its columns c0 .. c1 (rms_scale); one head of one row of
 * rope_write_kv (h < nq: a q head; nq + i: KV head i, stored at `slot`). Each gives the bits the whole
 * call gives for its part. */
int paged_decode_heads(const float *q, int64_t q_stride, const void *k_pool, const void *v_pool,
                       const int32_t *block_tables, int64_t table_stride, const int64_t *context_lens, float *out,
                       int64_t S, int64_t nh, int64_t nkv, int64_t hd, int64_t bs, int fmt, int64_t window, int64_t q0,
                       int64_t q1);
void silu_mul_cols(const float *gate_up, float *out, int64_t inter, int64_t c0, int64_t c1);
void gelu_tanh_mul_cols(const float *gate_up, float *out, int64_t inter, int64_t c0, int64_t c1);
float rms_inv(const float *x, int64_t H, float eps);
void rms_scale(const float *x, const float *weight, float *out, float inv, int64_t c0, int64_t c1);
void rope_write_kv_head(float *row, int64_t nq, int64_t nk, int64_t hd, const float *c, const float *s,
                        float q_scale, int64_t slot, void *k_pool, void *v_pool, int fmt, int64_t h);

/* paged_decode_attention over a range of sequences per part, for a team of threads to run (matmul.c's
 * matmul_team_run): part p takes sequences bounds[p] .. bounds[p+1]. Each sequence is computed exactly
 * as alone, so the split changes no bit. failed is set when a part could not allocate its scratch. */
typedef struct {
    const float *q;
    int64_t q_stride;
    const void *k_pool, *v_pool;
    const int32_t *block_tables;
    int64_t table_stride;
    const int64_t *context_lens;
    float *out;
    int64_t nh, nkv, hd, bs;
    const int64_t *bounds;
    int failed;
    int fmt;                        /* the pool's KV format */
    int64_t window;                 /* > 0: a sliding-window layer's keys (paged_decode_attention) */
} decode_job_t;

void paged_decode_part(void *arg, int part);

/* A step's prefill chunks' attention as tasks for a team of threads: each task a tile of a chunk's tokens
 * against one KV head's keys, with that head's query heads (attention.c). Every part takes tasks from
 * `next` until none is left; a token's rows get the bits paged_decode_attention gives them. */
typedef struct {
    const float *q;                 /* [T, nh, hd] rows q_stride floats apart, already scaled */
    int64_t q_stride;
    const void *k_pool, *v_pool;    /* in KV format fmt */
    const int32_t *block_tables;    /* [sequences, table_stride] */
    int64_t table_stride;
    const int64_t *tasks;           /* [n_tasks, 4]: block-table row, KV head, first token, end token */
    const int64_t *positions;       /* [T]: each token's position; it sees keys up to it */
    float *out;                     /* [T, nh, hd] */
    int64_t n_tasks, tile;          /* tile: the most tokens in a task */
    int64_t nh, nkv, hd, bs, window;
    int fmt;
    int failed;                     /* set when a part could not allocate its scratch */
    int64_t next;                   /* tasks handed out so far */
} prefill_job_t;

void paged_prefill_part(void *arg, int part);

/* An encoder's bidirectional attention as tasks for a team of threads (attention.c): each task a tile of one
 * sequence's query rows and one head against all of that sequence's keys, read in place from qkv. */
typedef struct {
    const float *qkv;               /* [T, 3, nh, hd]: each token's q, k and v (q not yet scaled) */
    float *out;                     /* [T, nh, hd] */
    const int64_t *tasks;           /* [n_tasks, 4]: the sequence's first row, its length, head, first query */
    int64_t n_tasks, tile, nh, hd;  /* tile: the most query rows in a task (at most 64) */
    float scale;
    int failed;                     /* set when a part could not allocate its scratch */
    int64_t next;                   /* tasks handed out so far */
} encoder_job_t;

void encoder_attention_part(void *arg, int part);

#endif
