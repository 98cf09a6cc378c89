/* A step's layers in one call (nvllm/model/kernels/step.py), decode alone or with prefill chunks (whose
 * attention is paged_prefill_part's tasks, every sequence's rows among them): for every layer, the kernels that
 * decoder.py's forward pass calls one by one from Python (ops.c's norm, rope with the KV write, paged
 * attention and SwiGLU; matmul.c's products), on the same buffers with the same per-value arithmetic in
 * the same order, and the few additions between them (bias, residual) done as NumPy does them. So a
 * step gives the same bits either way; what goes is ~10 Python calls per layer, their checks and
 * temporaries (~5 us each: a fifth of SmolLM2-135M's decode step on two threads).
 *
 * The whole step is one team job on team.c's threads: every op is split across the team (norms, adds and
 * SwiGLU by rows, or by columns for one row; x's quantization by rows; the products by output panels,
 * handed out by an atomic counter, the parts of a fused matrix in one panel space; bias, head norms,
 * rope and the KV write by head; attention by sequence and query heads), with a barrier only where an op
 * reads what another thread wrote. Who computes a value never changes how: every result has the bits
 * of the one-thread step, whatever the thread count and whatever the other rows (the engine's exactness
 * invariant), which tests/model/kernels/test_decode_step.py holds.
 *
 * Everything is checked by step.py before the call (shapes, formats, block ids and slots against the
 * pool); this file trusts its sizes, as the kernels it calls do.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "matmul.h"
#include "packed.h"
#include "team.h"

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
    float *out;                     /* [T, H]: o's and down's products (may share memory with qkv and gu) */
    const float *cos, *sin;         /* [T, hd/2] */
    const int64_t *const *slots;          /* per group: [T] */
    const int32_t *const *block_tables;   /* per group: [T, table_stride[group]], one sequence per row (tasks:
                                             [sequences, table_stride[group]], a row per sequence) */
    const int64_t *table_stride;          /* per group */
    const int64_t *context_lens;    /* [T]; NULL with tasks */
    int64_t threads;
    int64_t kv_fmt;                 /* the pool's KV format, a GGUF type id (ops.c) */
    const float *cos_local, *sin_local;   /* [T, hd/2], or NULL where no layer is local */
    int64_t gelu;                   /* 1: GeGLU (gelu_tanh_mul), 0: SwiGLU (silu_mul) */
    const float *nope_cos, *nope_sin;   /* [T, hd/2] of 1 and 0, or NULL: no layer is NoPE */
    const int64_t *qk_order;        /* [(nq + nkv) hd] or NULL: partial rotary's column order (decoder.py) */
    float *qk_scratch;              /* [T, (nq + nkv) hd] when qk_order is set */
    /* A step with prefill chunks (NULL for decode alone): attention as paged_prefill_part's tasks over every
     * sequence of the step (a decode row a task of one token), rows seeing keys up to their positions. */
    const int64_t *tasks;           /* [n_tasks, 4]: block-table row, KV head, first row, end row */
    int64_t n_tasks, tile;          /* tile: the most rows in a task */
    const int64_t *positions;       /* [T] */
} step_t;

/* The step as the team shares it. */
typedef struct {
    const step_t *s;
    int qv;               /* dot.c's variant (0: x stays float for every format) */
    uint8_t *qx;          /* quantized x of the product being prepared: one per distinct format of its parts */
    int failed;           /* set (atomically) when attention could not allocate its scratch */
    int split;            /* 1: one row's blocks are quantized a range per thread */
    prefill_job_t *jobs;  /* with tasks: each layer's attention job (its own counter) */
} run_t;

/* [*a, *b): share i of k of n things, the bounds multiples of `align` (but n). */
static void share(int64_t n, int i, int k, int64_t align, int64_t *a, int64_t *b) {
    const int64_t units = (n + align - 1) / align;
    *a = units * i / k * align;
    *b = units * (i + 1) / k * align;
    if (*a > n) *a = n;
    if (*b > n) *b = n;
}

/* Where part i's quantized x starts in run->qx, or -1 where the part takes float x (its weights not packed,
 * or packed F16 / BF16):
 * the packed parts share one (dot.c's x does not depend on the format). Returns the bytes needed. */
static size_t qx_plan(const run_t *r, const step_matrix_t *m, int64_t T, int64_t *at) {
    size_t bytes = 0;
    for (int64_t i = 0; i < m->count; i++) {
        const step_part_t *p = m->parts + i;
        at[i] = -1;
        if (p->in <= 0 || r->qv <= 0 || !(p->fmt & PACKED_FLAG) || pack_floats(p->fmt & ~PACKED_FLAG)) continue;
        for (int64_t j = 0; j < i; j++)
            if (at[j] >= 0) at[i] = at[j];
        if (at[i] < 0) {
            at[i] = (int64_t)bytes;
            bytes += dot_x_bytes(r->qv, T, p->in);
        }
    }
    return bytes;
}

/* x [T, in] quantized once for m's packed parts: by rows (the rows this thread owns for T > 1, so the norm
 * before needs no barrier); for one row, the blocks of the columns this thread normed (r->split: dot.c
 * quantizes each block of 32 on its own, at t * nb + b). Returns 1 if anything was quantized (the team then needs a barrier
 * before the product). */
static int quantize(team_ctx_t *c, const run_t *r, const step_matrix_t *m, const float *x, int64_t x_stride,
                    int64_t T) {
    int64_t at[m->count];
    qx_plan(r, m, T, at);
    int any = 0, k = 0;
    int64_t t0, t1, done = -1;
    share(T, c->index, c->count, 1, &t0, &t1);
    for (int64_t i = 0; i < m->count; i++) {
        if (at[i] <= done) continue;   /* float x, or the x an earlier part has */
        done = at[i], any = 1;
        const step_part_t *p = m->parts + i;
        if (T > 1) {
            if (t1 > t0) dot_quantize_x(r->qv, x, x_stride, p->in, t0, t1 - t0, r->qx + at[i]);
        } else if (r->split) {
            int64_t b0, b1;
            share(p->in / 32, c->index, c->count, 1, &b0, &b1);
            if (b1 > b0)
                dot_quantize_x(r->qv, x + 32 * b0, x_stride, 32 * (b1 - b0), 0, 1,
                               r->qx + at[i] + (size_t)b0 * dot_x_bytes(r->qv, 1, 32));
        } else if (k++ % c->count == c->index) {
            dot_quantize_x(r->qv, x, x_stride, p->in, 0, 1, r->qx + at[i]);
        }
    }
    return any;
}

/* Rows of x a unit of a product works on: a prefill's x is cut into tiles, so that a tile's quantized rows stay
 * in cache while the weights stream past them once per tile (not the whole x read again for every panel),
 * 64 being the multi-row kernels' pass over a panel. */
#define ROW_TILE 64

/* y [T, width] = x [T, in] @ W.T, part by part as FusedWeight.apply does, the parts' output rows in one
 * space of chunks (a chunk never spans two parts), for each tile of ROW_TILE rows of x: (tile, chunk) units
 * handed out by the atomic counter, a tile's chunks together. A row's values do not depend on the rows
 * beside it in a call (packed.h), so the tiles change no bit. */
static void product(team_ctx_t *c, const run_t *r, const step_matrix_t *m, const float *x, int64_t x_stride,
                    int64_t T, float *y, int64_t width) {
    int64_t at[m->count];
    qx_plan(r, m, T, at);
    int64_t rows = 0;
    for (int64_t i = 0; i < m->count; i++) rows += m->parts[i].rows;
    const int64_t step = matmul_chunk_rows(rows, c->count);
    int64_t n = 0;
    for (int64_t i = 0; i < m->count; i++) n += (m->parts[i].rows + step - 1) / step;
    const int64_t tiles = (T + ROW_TILE - 1) / ROW_TILE;
    int64_t state = -1;
    for (int64_t u; (u = team_chunk(c, 0, n * tiles, &state)) >= 0;) {
        const int64_t ch = u % n, t0 = u / n * ROW_TILE, tn = T - t0 < ROW_TILE ? T - t0 : ROW_TILE;
        int64_t i = 0, first = ch;
        while (first >= (m->parts[i].rows + step - 1) / step) first -= (m->parts[i++].rows + step - 1) / step;
        const step_part_t *p = m->parts + i;
        const uint8_t *qx = at[i] >= 0 ? r->qx + at[i] + dot_x_bytes(r->qv, t0, p->in) : NULL;
        matmul_rows((int)p->fmt, p->w, p->row_bytes, p->rows, p->in, x + t0 * x_stride, x_stride, tn,
                    y + t0 * width + p->col, T > 1 ? width : p->rows, r->qv, qx, first * step, (first + 1) * step);
    }
}

/* out = rms_norm(x) [T, H]: by rows, or by columns of the one row (each thread computing the row's scale
 * itself, in the same order; in place, once every thread has read the row). */
static void norm(team_ctx_t *c, const float *x, const float *w, float *out, int64_t T, int64_t H, float eps) {
    int64_t a, b;
    if (T > 1) {
        share(T, c->index, c->count, 1, &a, &b);
        for (int64_t t = a; t < b; t++) rms_scale(x + t * H, w, out + t * H, rms_inv(x + t * H, H, eps), 0, H);
        return;
    }
    const float inv = rms_inv(x, H, eps);
    if (out == x) team_barrier(c);
    share(H, c->index, c->count, 32, &a, &b);
    rms_scale(x, w, out, inv, a, b);
}

/* x += y over [T, H], decoder.py's x = x + y: the rows (or columns of the one row) norm gave this thread. */
static void add(team_ctx_t *c, float *x, const float *y, int64_t T, int64_t H) {
    int64_t a, b;
    share(T > 1 ? T : H, c->index, c->count, T > 1 ? 1 : 32, &a, &b);
    if (T > 1) a *= H, b *= H;
    for (int64_t i = a; i < b; i++) x[i] += y[i];
}

/* One head's bias, head norm and rope (with the KV write for a KV head), as the whole-row calls do them in
 * turn: item h < nq is q head h; nq + i is KV head i with its values' bias. rope: 0 when qk_order moves the
 * columns first (rope comes later, by row). */
static void head_item(const step_t *s, const step_layer_t *L, int64_t t, int64_t h, int rope) {
    const int64_t hd = s->hd, nq = s->nq, nkv = s->nkv, width = (nq + 2 * nkv) * hd, half = hd / 2;
    float *row = s->qkv + t * width;
    const int kv = h >= nq;
    for (int pass = 0; pass < 1 + kv; pass++) {   /* a KV head's keys, then its values */
        const int64_t col = pass ? (nq + nkv + h - nq) * hd : h * hd;
        if (L->qkv_bias)
            for (int64_t i = col; i < col + hd; i++) row[i] += L->qkv_bias[i];
        if (L->q_norm && !pass) {
            const float *w = kv ? L->k_norm : L->q_norm;
            rms_scale(row + col, w, row + col, rms_inv(row + col, hd, s->eps), 0, hd);
        }
    }
    if (!rope) return;
    const float *cos = L->nope ? s->nope_cos : L->local ? s->cos_local : s->cos;
    const float *sin = L->nope ? s->nope_sin : L->local ? s->sin_local : s->sin;
    rope_write_kv_head(row, nq, nkv, hd, cos + t * half, sin + t * half, s->q_scale, s->slots[L->group][t],
                       L->k_pool, L->v_pool, (int)s->kv_fmt, h);
}

/* Bias, head norms, rope and the KV write: by (row, head). With qk_order (partial rotary), the bias and
 * norms first, then each row's columns reordered and roped by the thread that owns the row. */
static void heads(team_ctx_t *c, const step_t *s, const step_layer_t *L) {
    const int64_t T = s->T, nq = s->nq, nkv = s->nkv, hd = s->hd, width = (nq + 2 * nkv) * hd, per = nq + nkv;
    int64_t a, b;
    share(T * per, c->index, c->count, 1, &a, &b);
    for (int64_t k = a; k < b; k++) head_item(s, L, k / per, k % per, !s->qk_order);
    if (!s->qk_order) return;
    team_barrier(c);
    const int64_t qk = (nq + nkv) * hd;
    share(T, c->index, c->count, 1, &a, &b);
    for (int64_t t = a; t < b; t++) {   /* as decoder.py's qkv[:, :qk] = qkv[:, rope_perm] */
        float *row = s->qkv + t * width, *old = s->qk_scratch + t * qk;
        memcpy(old, row, (size_t)qk * sizeof(float));
        for (int64_t j = 0; j < qk; j++) row[j] = old[s->qk_order[j]];
        for (int64_t h = 0; h < per; h++) {
            const float *cos = L->nope ? s->nope_cos : L->local ? s->cos_local : s->cos;
            const float *sin = L->nope ? s->nope_sin : L->local ? s->sin_local : s->sin;
            rope_write_kv_head(row, nq, nkv, hd, cos + t * (hd / 2), sin + t * (hd / 2), s->q_scale,
                               s->slots[L->group][t], L->k_pool, L->v_pool, (int)s->kv_fmt, h);
        }
    }
}

/* Paged attention. With tasks (a step with prefill chunks), paged_prefill_part's. Else by (sequence, query heads): whole sequences when there are enough to go round, else
 * each sequence's heads in pieces (whole KV groups where that makes enough), handed out by the counter. */
static void attention(team_ctx_t *c, run_t *r, const step_layer_t *L, int64_t l) {
    const step_t *s = r->s;
    if (s->tasks) {   /* a step with prefill chunks: the layer's tasks, by its job's own counter */
        paged_prefill_part(r->jobs + l, c->index);
        return;
    }
    const int64_t T = s->T, nq = s->nq, nkv = s->nkv, width = (nq + 2 * nkv) * s->hd;
    int64_t pieces = T >= 2 * c->count ? 1 : (2 * c->count + T - 1) / T;
    if (pieces > nq) pieces = nq;
    const int kv_whole = pieces <= nkv;
    const int32_t *tables = s->block_tables[L->group];
    const int64_t stride = s->table_stride[L->group], g = nq / nkv;
    int64_t state = -1;
    for (int64_t it; (it = team_chunk(c, 0, T * pieces, &state)) >= 0;) {
        const int64_t t = it / pieces, p = it % pieces;
        const int64_t q0 = kv_whole ? nkv * p / pieces * g : nq * p / pieces;
        const int64_t q1 = kv_whole ? nkv * (p + 1) / pieces * g : nq * (p + 1) / pieces;
        if (paged_decode_heads(s->qkv + t * width, width, L->k_pool, L->v_pool, tables + t * stride, stride,
                               s->context_lens + t, s->attn + t * nq * s->hd, 1, nq, nkv, s->hd, s->bs,
                               (int)s->kv_fmt, L->window, q0, q1) != 0)
            __atomic_store_n(&r->failed, 1, __ATOMIC_RELAXED);
    }
}

/* x [T, in] -> its quantized rows (if any part takes them), a barrier, the product, a barrier. For T > 1 (and
 * for one row split by blocks) the rows or columns of x were written by their owners just before, so the
 * product waits for them all in any case; else the caller has waited already. */
static void full_product(team_ctx_t *c, const run_t *r, const step_matrix_t *m, const float *x, int64_t x_stride,
                         float *y, int64_t width) {
    const int64_t T = r->s->T;
    if (quantize(c, r, m, x, x_stride, T) || T > 1 || r->split) team_barrier(c);
    product(c, r, m, x, x_stride, T, y, width);
    team_barrier(c);
}

/* SwiGLU or GeGLU: this thread's rows, or its columns of the one row. */
static void glu(team_ctx_t *c, const step_t *s) {
    const int64_t T = s->T, I = s->inter;
    int64_t a, b;
    share(T > 1 ? T : I, c->index, c->count, T > 1 ? 1 : 32, &a, &b);
    for (int64_t t = T > 1 ? a : 0; t < (T > 1 ? b : 1); t++) {
        const int64_t c0 = T > 1 ? 0 : a, c1 = T > 1 ? I : b;
        if (s->gelu) gelu_tanh_mul_cols(s->gu + t * 2 * I, s->act + t * I, I, c0, c1);
        else silu_mul_cols(s->gu + t * 2 * I, s->act + t * I, I, c0, c1);
    }
}

static void layers_team(void *arg, team_ctx_t *c) {
    run_t *r = arg;
    const step_t *s = r->s;
    const int64_t T = s->T, H = s->H, q_width = s->nq * s->hd, width = (s->nq + 2 * s->nkv) * s->hd;
    for (int64_t l = 0; l < s->num_layers; l++) {
        const step_layer_t *L = s->layers + l;
        /* T > 1: the norms, adds, SwiGLU and quantizing of a row are all its owner's: no barrier between them */
        norm(c, s->x, L->input_norm, s->h, T, H, s->eps);
        if (T == 1 && !r->split) team_barrier(c);
        full_product(c, r, &L->qkv, s->h, H, s->qkv, width);
        heads(c, s, L);
        team_barrier(c);
        attention(c, r, L, l);
        team_barrier(c);
        full_product(c, r, &L->o, s->attn, q_width, s->out, H);
        if (L->attn_out_norm) norm(c, s->out, L->attn_out_norm, s->out, T, H, s->eps);
        add(c, s->x, s->out, T, H);
        if (T == 1) team_barrier(c);
        norm(c, s->x, L->post_norm, s->h, T, H, s->eps);
        if (T == 1 && !r->split) team_barrier(c);
        full_product(c, r, &L->gate_up, s->h, H, s->gu, 2 * s->inter);
        glu(c, s);
        if (T == 1 && !r->split) team_barrier(c);
        full_product(c, r, &L->down, s->act, s->inter, s->out, H);
        if (L->ffn_out_norm) norm(c, s->out, L->ffn_out_norm, s->out, T, H, s->eps);
        add(c, s->x, s->out, T, H);
        if (T == 1) team_barrier(c);
    }
}

/* Each layer's attention job for a step with tasks (its pool, window and group's tables; its counter at 0). */
static void prefill_jobs(const step_t *s, prefill_job_t *jobs) {
    const int64_t width = (s->nq + 2 * s->nkv) * s->hd;
    for (int64_t l = 0; l < s->num_layers; l++) {
        const step_layer_t *L = s->layers + l;
        jobs[l] = (prefill_job_t){.q = s->qkv, .q_stride = width, .k_pool = L->k_pool, .v_pool = L->v_pool,
                                  .block_tables = s->block_tables[L->group], .table_stride = s->table_stride[L->group],
                                  .tasks = s->tasks, .positions = s->positions, .out = s->attn, .n_tasks = s->n_tasks,
                                  .tile = s->tile, .nh = s->nq, .nkv = s->nkv, .hd = s->hd, .bs = s->bs,
                                  .window = L->window, .fmt = (int)s->kv_fmt, .failed = 0, .next = 0};
    }
}

/* Every layer of the step on s->x, on s->threads threads. Returns 0; -3 when the quantized x (or the
 * attention jobs) could not be allocated, -4 when attention could not allocate its scratch. */
int decode_layers(const step_t *s) {
    run_t r = {s, dot_variant(-1), NULL, 0, s->T == 1, NULL};
    size_t bytes = 0;
    for (int64_t l = 0; l < s->num_layers; l++) {
        const step_layer_t *L = s->layers + l;
        const step_matrix_t *ms[4] = {&L->qkv, &L->o, &L->gate_up, &L->down};
        for (int i = 0; i < 4; i++) {
            int64_t at[ms[i]->count];
            const size_t b = qx_plan(&r, ms[i], s->T, at);
            bytes = b > bytes ? b : bytes;
        }
    }
    if (bytes && !(r.qx = malloc(bytes))) return -3;
    if (s->tasks) {
        if (!(r.jobs = malloc(sizeof *r.jobs * (size_t)s->num_layers))) {
            free(r.qx);
            return -3;
        }
        prefill_jobs(s, r.jobs);
    }
    team_run(layers_team, &r, (int)s->threads);
    for (int64_t l = 0; r.jobs && l < s->num_layers; l++) r.failed |= r.jobs[l].failed;
    free(r.jobs);
    free(r.qx);
    return r.failed ? -4 : 0;
}
