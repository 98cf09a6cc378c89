/* A decode step's layers in one call (nvllm/model/kernels/step.py): for every layer, the kernels that
 * decoder.py's forward pass calls one by one from Python (ops.c's norm, rope with the KV write, paged
 * attention and SwiGLU; matmul.c's products), called here in the same order on the same buffers with
 * the same arguments, and the few additions between them (bias, residual) done as NumPy does them. So a
 * step gives the same bits either way; what goes is ~10 Python calls per layer, their checks and
 * temporaries (~5 us each: a fifth of SmolLM2-135M's decode step on two threads).
 *
 * Everything is checked by step.py before the call (shapes, formats, block ids and slots against the
 * pool); this file trusts its sizes, as the kernels it calls do.
 */
#include <stdint.h>
#include <string.h>

#include "ops.h"

int quant_matmul(int fmt, const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t in, const float *x,
                 int64_t x_stride, int64_t T, float *y, int64_t y_stride, int threads);
int matmul_pool_run(void (*fn)(void *, int), void *arg, int parts);

/* One storage of a matrix: `rows` output rows in GGUF type fmt, written to columns col .. col+rows of
 * the product (a fused q|k|v or gate|up whose parts the file stores in different formats has several). */
typedef struct {
    int64_t fmt;
    const uint8_t *w;
    int64_t row_bytes, rows, in, col;
} step_part_t;

typedef struct {
    const step_part_t *parts;
    int64_t count;
} step_matrix_t;

typedef struct {
    const float *input_norm, *post_norm;
    const float *qkv_bias;          /* or NULL */
    const float *q_norm, *k_norm;   /* or NULL: Qwen3's per-head norms */
    step_matrix_t qkv, o, gate_up, down;
    void *k_pool, *v_pool;          /* this layer's pages [blocks, bs, nkv, hd] each, in the step's KV format */
    const float *attn_out_norm, *ffn_out_norm;   /* or NULL: Gemma 3's norms of the attention's and MLP's outputs */
    int64_t window;                 /* > 0: a sliding-window layer's keys */
    int64_t local;                  /* 1: rope from cos_local, sin_local (a sliding layer's own base) */
    int64_t nope;                   /* SmolLM3: 1 where the layer takes no rope (the step's nope tables) */
    int64_t group;                  /* its group of the pool's layout (kv_layout.py): whose slots and tables */
} step_layer_t;

typedef struct {
    const step_layer_t *layers;
    int64_t num_layers;
    int64_t T, H, nq, nkv, hd, inter, bs;
    float eps, q_scale;
    float *x;                       /* [T, H]: the residual stream, in and out */
    float *h, *qkv, *attn, *gu, *act;   /* scratch: [T, H], [T, (nq + 2 nkv) hd], [T, nq hd], [T, 2I], [T, I] */
    const float *cos, *sin;         /* [T, hd/2] */
    const int64_t *const *slots;          /* per group: [T] */
    const int32_t *const *block_tables;   /* per group: [T, table_stride[group]], one sequence per row */
    const int64_t *table_stride;          /* per group */
    const int64_t *context_lens;    /* [T] */
    const int64_t *bounds;          /* [attn_parts + 1]: the sequences each thread attends for */
    int64_t attn_parts, threads;
    int64_t kv_fmt;                 /* the pool's KV format, a GGUF type id (ops.c) */
    const float *cos_local, *sin_local;   /* [T, hd/2], or NULL where no layer is local */
    int64_t gelu;                   /* 1: GeGLU (gelu_tanh_mul), 0: SwiGLU (silu_mul) */
    const float *nope_cos, *nope_sin;   /* [T, hd/2] of 1 and 0, or NULL: no layer is NoPE */
    const int64_t *qk_order;        /* [(nq + nkv) hd] or NULL: partial rotary's column order (decoder.py) */
    float *qk_scratch;              /* [(nq + nkv) hd] when qk_order is set */
} step_t;

/* y [T, width] = x [T, in] @ W.T, part by part, as FusedWeight.apply and quant_matmul's wrapper do. */
static int product(const step_matrix_t *m, const float *x, int64_t x_stride, int64_t T, float *y, int64_t width,
                   int threads) {
    for (int64_t i = 0; i < m->count; i++) {
        const step_part_t *p = m->parts + i;
        const int rc = quant_matmul((int)p->fmt, p->w, p->row_bytes, p->rows, p->in, x, x_stride, T, y + p->col,
                                    T > 1 ? width : p->rows, threads);
        if (rc != 0) return rc;
    }
    return 0;
}

/* x += y over n values: decoder.py's x = x + y, the same single rounding per value. */
static void add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* Every layer of the step on s->x. Returns 0; -3 when a product could not allocate its quantized x,
 * -4 when attention could not allocate its scratch (quant_matmul's other codes cannot happen after
 * step.py's checks, but are passed on all the same). */
int decode_layers(const step_t *s) {
    const int64_t T = s->T, H = s->H, hd = s->hd, q_width = s->nq * hd;
    const int64_t width = (s->nq + 2 * s->nkv) * hd;
    const int threads = (int)s->threads;
    for (int64_t l = 0; l < s->num_layers; l++) {
        const step_layer_t *L = s->layers + l;
        int rc;
        rms_norm(s->x, L->input_norm, s->h, T, H, s->eps);
        if ((rc = product(&L->qkv, s->h, H, T, s->qkv, width, threads))) return rc;
        if (L->qkv_bias)
            for (int64_t t = 0; t < T; t++) add(s->qkv + t * width, L->qkv_bias, width);
        if (L->q_norm)   /* each head's values normed in place, as decoder.py's _norm_heads */
            for (int64_t t = 0; t < T; t++) {
                float *row = s->qkv + t * width;
                rms_norm(row, L->q_norm, row, s->nq, hd, s->eps);
                rms_norm(row + q_width, L->k_norm, row + q_width, s->nkv, hd, s->eps);
            }
        if (s->qk_order)   /* as decoder.py's qkv[:, :qk] = qkv[:, rope_perm] */
            for (int64_t t = 0; t < T; t++) {
                float *row = s->qkv + t * width;
                const int64_t qk = (s->nq + s->nkv) * hd;
                memcpy(s->qk_scratch, row, (size_t)qk * sizeof(float));
                for (int64_t j = 0; j < qk; j++) row[j] = s->qk_scratch[s->qk_order[j]];
            }
        rope_write_kv(s->qkv, T, width, s->nq, s->nkv, hd,
                      L->nope ? s->nope_cos : L->local ? s->cos_local : s->cos,
                      L->nope ? s->nope_sin : L->local ? s->sin_local : s->sin,
                      s->q_scale, s->slots[L->group], L->k_pool, L->v_pool, (int)s->kv_fmt);
        const int32_t *tables = s->block_tables[L->group];
        const int64_t stride = s->table_stride[L->group];
        if (s->attn_parts < 2) {
            rc = paged_decode_attention(s->qkv, width, L->k_pool, L->v_pool, tables, stride,
                                        s->context_lens, s->attn, T, s->nq, s->nkv, hd, s->bs, (int)s->kv_fmt,
                                        L->window);
        } else {
            decode_job_t job = {s->qkv, width, L->k_pool, L->v_pool, tables, stride,
                                s->context_lens, s->attn, s->nq, s->nkv, hd, s->bs, s->bounds, 0, (int)s->kv_fmt,
                                L->window};
            matmul_pool_run(paged_decode_part, &job, (int)s->attn_parts);
            rc = job.failed;
        }
        if (rc != 0) return -4;
        if ((rc = product(&L->o, s->attn, q_width, T, s->h, H, threads))) return rc;
        if (L->attn_out_norm) rms_norm(s->h, L->attn_out_norm, s->h, T, H, s->eps);
        add(s->x, s->h, T * H);
        rms_norm(s->x, L->post_norm, s->h, T, H, s->eps);
        if ((rc = product(&L->gate_up, s->h, H, T, s->gu, 2 * s->inter, threads))) return rc;
        if (s->gelu)
            gelu_tanh_mul(s->gu, s->act, T, s->inter);
        else
            silu_mul(s->gu, s->act, T, s->inter);
        if ((rc = product(&L->down, s->act, s->inter, T, s->h, H, threads))) return rc;
        if (L->ffn_out_norm) rms_norm(s->h, L->ffn_out_norm, s->h, T, H, s->eps);
        add(s->x, s->h, T * H);
    }
    return 0;
}
