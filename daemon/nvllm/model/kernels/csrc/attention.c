/* Paged attention over the page pool, called through ctypes (nvllm/model/kernels/ops.py) and from step.c.
 *
 * - paged_decode_attention: one query token per sequence against its pages, read in place through the
 *   block table.
 * - paged_prefill_part: a chunk's query tokens against their pages, a task (a tile of tokens, one KV head
 *   and its query heads) at a time, the tasks shared out over the kernels' thread team. No score matrix is
 *   ever held: each tile keeps its rows' running max, sum and output, and a page of keys in scratch.
 * - softmax_causal_rows: the NumPy path's score tiles (models whose scores are soft-capped).
 *
 * Decode and prefill give each query row the same arithmetic, so a token's attention has the same bits
 * whether it was prefilled, in whatever chunk, or decoded. A row sees the keys [first, pos]: its position
 * and, in a sliding-window layer, the window's start. They are taken a page at a time, from the page that
 * holds `first`; per page, the keys the row sees [lo, hi) get their scores, each q . k summed in one fixed
 * order (score: eight lanes, then a fixed tree; a multiply and an add per term, as -std=c99 does not
 * contract them into FMA, and nothing reassociates them). Then an online softmax:
 * the row's running max m rises to the page's max (its running sum l and output acc are scaled by
 * exp(m_old - m_new) when it does), and each key adds p = exp(s - m) to l and p * v to acc, in key order.
 * At the end out = acc * (1 / l). No tile, chunk or thread split changes a row's operations.
 *
 * NaN and inf are carried as in ops.c: a NaN score reaches its own exp, the sum and the output.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "fmath.h"
#include "kv.h"
#include "ops.h"

enum { LANES = 8 };   /* a score's partial sums: the head's dims d = l mod 8 go to lane l */

/* Ask for the next page while this one is worked on: pages lie anywhere in the pool, and the
 * hardware prefetcher does not follow a jump, nor cross a 4 KiB boundary on its own. */
static inline void prefetch(const uint8_t *p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 3);
}

INLINE f32x8 load8(const float *p) {
    f32x8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void store8(float *p, f32x8 v) { memcpy(p, &v, sizeof v); }

/* One KV head's keys (or values) of a page, n of them (rows row_bytes apart from src, the head's slice at
 * `skip`): a pointer to key j's floats at [j * *stride], in place for F32, else converted into buf. */
INLINE const float *head_rows(const uint8_t *src, int64_t row_bytes, int64_t skip, int64_t n, int64_t hd, int fmt,
                              float *buf, int64_t *stride) {
    if (fmt == F32) {
        *stride = row_bytes / (int64_t)sizeof(float);
        return (const float *)(src + skip);
    }
    for (int64_t j = 0; j < n; j++) kv_load(src + j * row_bytes + skip, buf + j * hd, hd, fmt);
    *stride = hd;
    return buf;
}

/* The one order a score's eight lanes are added in (lane l summed the terms d = l mod 8): an 8-wide
 * vector's halves, then its pairs, as every instruction set's reduction goes. */
INLINE float lanes_sum(f32x8 a) { return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])); }

/* q . k over hd: lane l sums q[d] k[d] for d = l, l + 8, ... in order, lanes_sum adds the lanes, then the
 * dims past the last multiple of 8 are added in order. score4 gives four keys (ks floats apart) at once,
 * each with the bits score gives it. */
INLINE float score(const float *q, const float *k, int64_t hd) {
    const int64_t hd8 = hd / LANES * LANES;
    f32x8 a = {0};
    for (int64_t d = 0; d < hd8; d += LANES) a += load8(q + d) * load8(k + d);
    float s = lanes_sum(a);
    for (int64_t d = hd8; d < hd; d++) s += q[d] * k[d];
    return s;
}

/* Four scores' lanes summed as lanes_sum sums each (the same additions, four at a time): the halves,
 * then (u0 + u2) + (u1 + u3) of each, by shuffles. */
INLINE void lanes_sum4(f32x8 a0, f32x8 a1, f32x8 a2, f32x8 a3, float *s) {
    f32x4 h[4][2];
    memcpy(h[0], &a0, sizeof a0), memcpy(h[1], &a1, sizeof a1), memcpy(h[2], &a2, sizeof a2);
    memcpy(h[3], &a3, sizeof a3);
    const f32x4 u0 = h[0][0] + h[0][1], u1 = h[1][0] + h[1][1], u2 = h[2][0] + h[2][1], u3 = h[3][0] + h[3][1];
    const i32x4 even = {0, 1, 4, 5}, odd = {2, 3, 6, 7}, firsts = {0, 2, 4, 6}, seconds = {1, 3, 5, 7};
    const f32x4 r01 = __builtin_shuffle(u0, u1, even) + __builtin_shuffle(u0, u1, odd);
    const f32x4 r23 = __builtin_shuffle(u2, u3, even) + __builtin_shuffle(u2, u3, odd);
    const f32x4 t = __builtin_shuffle(r01, r23, firsts) + __builtin_shuffle(r01, r23, seconds);
    memcpy(s, &t, sizeof t);
}

/* Scores of one row against four keys (ks floats apart) at once -> s[0 .. 3], each with the bits score
 * gives it; score4x2 does two rows, which share the keys' loads. */
INLINE void score4(const float *q, const float *k, int64_t ks, int64_t hd, float *s) {
    const int64_t hd8 = hd / LANES * LANES;
    f32x8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (int64_t d = 0; d < hd8; d += LANES) {
        const f32x8 qd = load8(q + d);
        a0 += qd * load8(k + d);
        a1 += qd * load8(k + ks + d);
        a2 += qd * load8(k + 2 * ks + d);
        a3 += qd * load8(k + 3 * ks + d);
    }
    lanes_sum4(a0, a1, a2, a3, s);
    for (int64_t d = hd8; d < hd; d++)
        for (int u = 0; u < 4; u++) s[u] += q[d] * k[u * ks + d];
}

INLINE void score4x2(const float *q, const float *q2, const float *k, int64_t ks, int64_t hd, float *s, float *s2) {
    const int64_t hd8 = hd / LANES * LANES;
    f32x8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
    for (int64_t d = 0; d < hd8; d += LANES) {
        const f32x8 k0 = load8(k + d), k1 = load8(k + ks + d), k2 = load8(k + 2 * ks + d), k3 = load8(k + 3 * ks + d);
        const f32x8 qa = load8(q + d), qb = load8(q2 + d);
        a0 += qa * k0, a1 += qa * k1, a2 += qa * k2, a3 += qa * k3;
        b0 += qb * k0, b1 += qb * k1, b2 += qb * k2, b3 += qb * k3;
    }
    lanes_sum4(a0, a1, a2, a3, s);
    lanes_sum4(b0, b1, b2, b3, s2);
    for (int64_t d = hd8; d < hd; d++)
        for (int u = 0; u < 4; u++) s[u] += q[d] * k[u * ks + d], s2[u] += q2[d] * k[u * ks + d];
}

/* One row's online softmax over the keys lo .. hi - 1 of a page, up to the values: scores s[j] -> exps
 * p[j]; ml = {running max, running sum} and acc [hd] (the running output) rescaled where the max rose. */
INLINE void row_softmax(const float *s, int64_t lo, int64_t hi, int64_t hd, float *ml, float *acc, float *p) {
    float pm = s[lo];
    for (int64_t j = lo + 1; j < hi; j++) pm = s[j] > pm ? s[j] : pm;
    float m = ml[0], l = ml[1];
    if (pm > m) {                                       /* the max rose: what was summed scales down */
        if (l != 0.0f) {                                /* (nothing yet on a row's first page) */
            const float c = exp_nonpos(m - pm);
            l *= c;
            for (int64_t d = 0; d < hd; d++) acc[d] *= c;
        }
        m = pm;
    }
#pragma omp simd
    for (int64_t j = lo; j < hi; j++) p[j] = exp_nonpos(s[j] - m);
    for (int64_t j = lo; j < hi; j++) l += p[j];        /* in key order */
    ml[0] = m, ml[1] = l;
}

/* acc[d] += p[j] * v[j * vs + d] over the keys lo .. hi - 1 in order, each d on its own (vectors across d,
 * 32 dims at a time in registers); pv2 does two rows, which share the values' loads. */
INLINE void pv(float *acc, const float *p, int64_t lo, int64_t hi, const float *v, int64_t vs, int64_t hd) {
    int64_t d = 0;
    for (; d + 4 * LANES <= hd; d += 4 * LANES) {
        f32x8 a0 = load8(acc + d), a1 = load8(acc + d + 8), a2 = load8(acc + d + 16), a3 = load8(acc + d + 24);
        for (int64_t j = lo; j < hi; j++) {
            const float *vj = v + j * vs + d;
            const float pj = p[j];
            a0 += pj * load8(vj), a1 += pj * load8(vj + 8), a2 += pj * load8(vj + 16), a3 += pj * load8(vj + 24);
        }
        store8(acc + d, a0), store8(acc + d + 8, a1), store8(acc + d + 16, a2), store8(acc + d + 24, a3);
    }
    for (; d + LANES <= hd; d += LANES) {
        f32x8 a0 = load8(acc + d);
        for (int64_t j = lo; j < hi; j++) a0 += p[j] * load8(v + j * vs + d);
        store8(acc + d, a0);
    }
    for (; d < hd; d++)
        for (int64_t j = lo; j < hi; j++) acc[d] += p[j] * v[j * vs + d];
}

INLINE void pv2(float *acc, float *acc2, const float *p, const float *p2, int64_t lo, int64_t hi, const float *v,
                int64_t vs, int64_t hd) {
    int64_t d = 0;
    for (; d + 4 * LANES <= hd; d += 4 * LANES) {
        f32x8 a0 = load8(acc + d), a1 = load8(acc + d + 8), a2 = load8(acc + d + 16), a3 = load8(acc + d + 24);
        f32x8 b0 = load8(acc2 + d), b1 = load8(acc2 + d + 8), b2 = load8(acc2 + d + 16), b3 = load8(acc2 + d + 24);
        for (int64_t j = lo; j < hi; j++) {
            const float *vj = v + j * vs + d;
            const f32x8 v0 = load8(vj), v1 = load8(vj + 8), v2 = load8(vj + 16), v3 = load8(vj + 24);
            const float pa = p[j], pb = p2[j];
            a0 += pa * v0, a1 += pa * v1, a2 += pa * v2, a3 += pa * v3;
            b0 += pb * v0, b1 += pb * v1, b2 += pb * v2, b3 += pb * v3;
        }
        store8(acc + d, a0), store8(acc + d + 8, a1), store8(acc + d + 16, a2), store8(acc + d + 24, a3);
        store8(acc2 + d, b0), store8(acc2 + d + 8, b1), store8(acc2 + d + 16, b2), store8(acc2 + d + 24, b3);
    }
    if (d < hd) {
        pv(acc + d, p, lo, hi, v + d, vs, hd - d);
        pv(acc2 + d, p2, lo, hi, v + d, vs, hd - d);
    }
}

/* Rows q[r] (nr of them, all seeing keys lo .. hi - 1 of a page: k[j * ks], v[j * vs]) through the page,
 * two at a time: their scores into s, their softmax, their values. ml[r] and acc[r] are the rows' states;
 * s and p hold two rows of a page (bs) each. */
INLINE void page_rows(const float *const *q, int nr, const float *k, int64_t ks, int64_t lo, int64_t hi,
                      const float *v, int64_t vs, int64_t hd, float *const *ml, float *const *acc, float *s,
                      float *p, int64_t bs) {
    float *s2 = s + bs, *p2 = p + bs;
    int r = 0;
    for (; r + 2 <= nr; r += 2) {
        int64_t j = lo;
        for (; j + 4 <= hi; j += 4) score4x2(q[r], q[r + 1], k + j * ks, ks, hd, s + j, s2 + j);
        for (; j < hi; j++) s[j] = score(q[r], k + j * ks, hd), s2[j] = score(q[r + 1], k + j * ks, hd);
        row_softmax(s, lo, hi, hd, ml[r], acc[r], p);
        row_softmax(s2, lo, hi, hd, ml[r + 1], acc[r + 1], p2);
        pv2(acc[r], acc[r + 1], p, p2, lo, hi, v, vs, hd);
    }
    if (r < nr) {
        int64_t j = lo;
        for (; j + 4 <= hi; j += 4) score4(q[r], k + j * ks, ks, hd, s + j);
        for (; j < hi; j++) s[j] = score(q[r], k + j * ks, hd);
        row_softmax(s, lo, hi, hd, ml[r], acc[r], p);
        pv(acc[r], p, lo, hi, v, vs, hd);
    }
}

/* Scratch of one caller: a page's keys and values of one KV head as floats, two rows' scores and exps, and
 * `extra` floats after them (rest). */
typedef struct {
    float *keys, *vals, *s, *p, *rest;
} page_scratch_t;

static float *page_scratch(page_scratch_t *w, int64_t bs, int64_t hd, int64_t extra) {
    float *base = malloc(sizeof(float) * (size_t)(2 * bs * hd + 4 * bs + extra));
    if (base) w->keys = base, w->vals = base + bs * hd, w->s = w->vals + bs * hd, w->p = w->s + 2 * bs, w->rest = w->p + 2 * bs;
    return base;
}

/* q [S, nh, hd] (already scaled; q_stride floats from one sequence's row to the next), k_pool and v_pool
 * [num_blocks, bs, nkv, hd] in KV format fmt, block_tables [S, table_stride], context_lens [S] -> out
 * [S, nh, hd], for query heads q0 .. q1 (the others are neither read nor written; a thread of a team takes
 * some heads of a sequence, step.c); window > 0 (a sliding-window layer) attends to the last `window` keys
 * only, and pages before them are not read. Pages are read front to back, each KV head's slice converted
 * once for its query heads. Returns 0, or -1 if scratch could not be allocated. */
static inline __attribute__((always_inline)) int
decode_impl(const float *q, int64_t q_stride, const uint8_t *k_pool, const uint8_t *v_pool, const int32_t *block_tables,
            int64_t table_stride, const int64_t *context_lens, float *out, int64_t S, int64_t nh, int64_t nkv,
            int64_t hd, int64_t bs, int fmt, int64_t window, int64_t q0, int64_t q1) {
    const int64_t g = nh / nkv, row_bytes = kv_bytes(fmt, nkv * hd), page = bs * row_bytes, nq = q1 - q0;
    const int64_t kh0 = q0 / g, kh1 = (q1 - 1) / g + 1;
    page_scratch_t w;
    float *base = page_scratch(&w, bs, hd, nq * (hd + 2));
    if (!base) return -1;
    float *acc = w.rest, *ml = acc + nq * hd;
    const float *qr[64];
    float *mr[64], *ar[64];
    for (int64_t s = 0; s < S; s++) {
        const int64_t ctx = context_lens[s];
        const int32_t *table = block_tables + s * table_stride;
        const float *qs = q + s * q_stride;
        const int64_t pages = (ctx + bs - 1) / bs;
        const int64_t first = window > 0 && ctx > window ? ctx - window : 0, b0 = first / bs;
        memset(acc, 0, sizeof(float) * (size_t)(nq * hd));
        for (int64_t i = 0; i < nq; i++) ml[2 * i] = -INFINITY, ml[2 * i + 1] = 0.0f;
        for (int64_t b = b0; b < pages; b++) {
            const uint8_t *kp = k_pool + (int64_t)table[b] * page, *vp = v_pool + (int64_t)table[b] * page;
            if (b + 1 < pages) {
                prefetch(k_pool + (int64_t)table[b + 1] * page, page);
                prefetch(v_pool + (int64_t)table[b + 1] * page, page);
            }
            const int64_t t0 = b * bs, n = ctx - t0 < bs ? ctx - t0 : bs, lo = first > t0 ? first - t0 : 0;
            for (int64_t h = kh0; h < kh1; h++) {
                const int64_t skip = kv_bytes(fmt, h * hd);
                const int64_t i0 = h * g > q0 ? h * g : q0, i1 = (h + 1) * g < q1 ? (h + 1) * g : q1;
                int64_t ks, vs;
                const float *k = head_rows(kp, row_bytes, skip, n, hd, fmt, w.keys, &ks);
                const float *v = head_rows(vp, row_bytes, skip, n, hd, fmt, w.vals, &vs);
                for (int64_t r0 = i0; r0 < i1; r0 += 64) {
                    const int nr = (int)(i1 - r0 < 64 ? i1 - r0 : 64);
                    for (int r = 0; r < nr; r++) {
                        qr[r] = qs + (r0 + r) * hd;
                        mr[r] = ml + 2 * (r0 + r - q0), ar[r] = acc + (r0 + r - q0) * hd;
                    }
                    page_rows(qr, nr, k, ks, lo, n, v, vs, hd, mr, ar, w.s, w.p, bs);
                }
            }
        }
        for (int64_t i = 0; i < nq; i++) {
            float *o = out + (s * nh + q0 + i) * hd;
            const float inv = 1.0f / ml[2 * i + 1];
            for (int64_t d = 0; d < hd; d++) o[d] = acc[i * hd + d] * inv;
        }
    }
    free(base);
    return 0;
}

/* The common head sizes get their own copy of the loops, unrolled for a length known when compiled. */
ENTRY int paged_decode_heads(const float *q, int64_t q_stride, const void *k_pool, const void *v_pool,
                             const int32_t *block_tables, int64_t table_stride, const int64_t *context_lens,
                             float *out, int64_t S, int64_t nh, int64_t nkv, int64_t hd, int64_t bs, int fmt,
                             int64_t window, int64_t q0, int64_t q1) {
    const uint8_t *k = k_pool, *v = v_pool;
    if (q1 <= q0) return 0;
    if (hd == 64)
        return decode_impl(q, q_stride, k, v, block_tables, table_stride, context_lens, out, S, nh, nkv, 64, bs, fmt,
                           window, q0, q1);
    if (hd == 128)
        return decode_impl(q, q_stride, k, v, block_tables, table_stride, context_lens, out, S, nh, nkv, 128, bs, fmt,
                           window, q0, q1);
    return decode_impl(q, q_stride, k, v, block_tables, table_stride, context_lens, out, S, nh, nkv, hd, bs, fmt,
                       window, q0, q1);
}

int paged_decode_attention(const float *q, int64_t q_stride, const void *k_pool, const void *v_pool,
                           const int32_t *block_tables, int64_t table_stride, const int64_t *context_lens,
                           float *out, int64_t S, int64_t nh, int64_t nkv, int64_t hd, int64_t bs, int fmt,
                           int64_t window) {
    return paged_decode_heads(q, q_stride, k_pool, v_pool, block_tables, table_stride, context_lens, out, S, nh, nkv,
                              hd, bs, fmt, window, 0, nh);
}

/* decode_job_t: ops.h. */
void paged_decode_part(void *arg, int part) {
    decode_job_t *j = arg;
    const int64_t s0 = j->bounds[part], s1 = j->bounds[part + 1];
    if (s1 > s0 && paged_decode_attention(j->q + s0 * j->q_stride, j->q_stride, j->k_pool, j->v_pool,
                                          j->block_tables + s0 * j->table_stride, j->table_stride,
                                          j->context_lens + s0, j->out + s0 * j->nh * j->hd, s1 - s0, j->nh,
                                          j->nkv, j->hd, j->bs, j->fmt, j->window) != 0)
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
}

/* One prefill task: tokens t0 .. t1 - 1 (rows of q and out; all of one sequence, whose pages `table`
 * lists), KV head h and its g query heads. Each token sees the keys up to its position (and from its
 * window's start); the tile reads the pages from the first token's first key to the last token's
 * position, each page's slice of head h converted once for all the tile's rows. acc [(t1 - t0) g hd] and
 * ml [(t1 - t0) g 2] are the rows' states. */
static inline __attribute__((always_inline)) void
prefill_impl(const prefill_job_t *j, const int64_t *task, int64_t hd, page_scratch_t *w, float *acc, float *ml) {
    const int64_t nh = j->nh, g = nh / j->nkv, bs = j->bs, h = task[1], t0 = task[2], t1 = task[3];
    const int64_t row_bytes = kv_bytes(j->fmt, j->nkv * hd), page = bs * row_bytes, skip = kv_bytes(j->fmt, h * hd);
    const int64_t nr = (t1 - t0) * g, window = j->window;
    const int32_t *table = j->block_tables + task[0] * j->table_stride;
    const uint8_t *k_pool = j->k_pool, *v_pool = j->v_pool;
    const int64_t *pos = j->positions;
    int64_t lo_key = pos[t0], hi_key = 0;                       /* the keys any row sees: [lo_key, hi_key) */
    for (int64_t t = t0; t < t1; t++) {
        const int64_t first = window > 0 && pos[t] + 1 > window ? pos[t] + 1 - window : 0;
        lo_key = first < lo_key ? first : lo_key;
        hi_key = pos[t] + 1 > hi_key ? pos[t] + 1 : hi_key;
    }
    memset(acc, 0, sizeof(float) * (size_t)(nr * hd));
    for (int64_t r = 0; r < nr; r++) ml[2 * r] = -INFINITY, ml[2 * r + 1] = 0.0f;
    const float *qr[64];
    float *mr[64], *ar[64];
    for (int64_t b = lo_key / bs; b * bs < hi_key; b++) {
        const int64_t k0 = b * bs, n = hi_key - k0 < bs ? hi_key - k0 : bs;
        const uint8_t *kp = k_pool + (int64_t)table[b] * page, *vp = v_pool + (int64_t)table[b] * page;
        if ((b + 1) * bs < hi_key) {
            prefetch(k_pool + (int64_t)table[b + 1] * page, page);
            prefetch(v_pool + (int64_t)table[b + 1] * page, page);
        }
        int64_t ks, vs;
        const float *k = head_rows(kp, row_bytes, skip, n, hd, j->fmt, w->keys, &ks);
        const float *v = head_rows(vp, row_bytes, skip, n, hd, j->fmt, w->vals, &vs);
        for (int64_t t = t0; t < t1; t++) {
            const int64_t first = window > 0 && pos[t] + 1 > window ? pos[t] + 1 - window : 0;
            const int64_t lo = first > k0 ? first - k0 : 0, hi = pos[t] + 1 - k0 < n ? pos[t] + 1 - k0 : n;
            if (hi <= lo) continue;                             /* this token sees no key of the page */
            const int64_t r0 = (t - t0) * g;
            for (int64_t i0 = 0; i0 < g; i0 += 64) {
                const int nq = (int)(g - i0 < 64 ? g - i0 : 64);
                for (int r = 0; r < nq; r++) {
                    qr[r] = j->q + t * j->q_stride + (h * g + i0 + r) * hd;
                    mr[r] = ml + 2 * (r0 + i0 + r), ar[r] = acc + (r0 + i0 + r) * hd;
                }
                page_rows(qr, nq, k, ks, lo, hi, v, vs, hd, mr, ar, w->s, w->p, bs);
            }
        }
    }
    for (int64_t t = t0; t < t1; t++)
        for (int64_t i = 0; i < g; i++) {
            const int64_t r = (t - t0) * g + i;
            float *o = j->out + t * nh * hd + (h * g + i) * hd;
            const float inv = 1.0f / ml[2 * r + 1];
            for (int64_t d = 0; d < hd; d++) o[d] = acc[r * hd + d] * inv;
        }
}

ENTRY static void prefill_task(const prefill_job_t *j, const int64_t *task, page_scratch_t *w, float *acc,
                               float *ml) {
    if (j->hd == 64) prefill_impl(j, task, 64, w, acc, ml);
    else if (j->hd == 128) prefill_impl(j, task, 128, w, acc, ml);
    else prefill_impl(j, task, j->hd, w, acc, ml);
}

/* prefill_job_t: ops.h. Each part takes tasks from the shared counter until none is left (the tasks come
 * heaviest first, so the parts finish together). */
void paged_prefill_part(void *arg, int part) {
    (void)part;
    prefill_job_t *j = arg;
    const int64_t g = j->nh / j->nkv, rows = j->tile * g;
    page_scratch_t w;
    float *base = page_scratch(&w, j->bs, j->hd, rows * (j->hd + 2));
    if (!base) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *acc = w.rest, *ml = acc + rows * j->hd;
    for (;;) {
        const int64_t t = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (t >= j->n_tasks) break;
        prefill_task(j, j->tasks + 4 * t, &w, acc, ml);
    }
    free(base);
}

/* sc[0:n] in place -> exp(sc - max); returns their sum (the softmax's denominator). A NaN may or may
 * not win the max, but either way it reaches its own exp and the sum. */
static inline float softmax_row(float *sc, int64_t n) {
    float m = sc[0], sum = 0.0f;
#pragma omp simd reduction(max : m)
    for (int64_t t = 1; t < n; t++) m = sc[t] > m ? sc[t] : m;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < n; t++) {
        sc[t] = exp_nonpos(sc[t] - m);
        sum += sc[t];
    }
    return sum;
}

/* scores [rows, width] in place: row r keeps keys [starts[r % period], limits[r % period]) (starts NULL: from
 * 0; a sliding window's rows start later) and gets exp(x - max) there and 0 elsewhere; sums[r] receives the
 * row's sum. (period lets one limit array serve every KV head.) */
ENTRY void softmax_causal_rows(float *scores, int64_t rows, int64_t width, const int64_t *limits, int64_t period,
                               float *sums, const int64_t *starts) {
    for (int64_t r = 0; r < rows; r++) {
        float *sc = scores + r * width;
        const int64_t n = limits[r % period], a = starts ? starts[r % period] : 0;
        sums[r] = softmax_row(sc + a, n - a);
        if (a > 0) memset(sc, 0, sizeof(float) * (size_t)a);
        if (n < width) memset(sc + n, 0, sizeof(float) * (size_t)(width - n));
    }
}

/* An encoder's attention (BERT's: every token of a sequence sees all of it, nothing cached) as tasks for a
 * team of threads: each task a tile of one sequence's query rows and one head, its keys and values read in
 * place from the step's qkv rows, a block of EB keys at a time with the same online softmax as the paged
 * kernels (page_rows). encoder_job_t: ops.h. */
#define EB 64
static inline __attribute__((always_inline)) void encoder_task(const encoder_job_t *j, const int64_t *task, float *s, float *p, float *qs, float *acc,
                         float *ml) {
    const int64_t hd = j->hd, stride = 3 * j->nh * hd, a = task[0], n = task[1], h = task[2], t0 = task[3];
    const int64_t t1 = t0 + j->tile < n ? t0 + j->tile : n, nr = t1 - t0;
    const float *k = j->qkv + a * stride + j->nh * hd + h * hd, *v = k + j->nh * hd;
    const float *qr[64];
    float *mr[64], *ar[64];
    for (int64_t r = 0; r < nr; r++) {
        const float *q = j->qkv + (a + t0 + r) * stride + h * hd;
        for (int64_t d = 0; d < hd; d++) qs[r * hd + d] = q[d] * j->scale;
        qr[r] = qs + r * hd, mr[r] = ml + 2 * r, ar[r] = acc + r * hd;
        ml[2 * r] = -INFINITY, ml[2 * r + 1] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)(nr * hd));
    for (int64_t k0 = 0; k0 < n; k0 += EB) {
        const int64_t nb = n - k0 < EB ? n - k0 : EB;
        page_rows(qr, (int)nr, k + k0 * stride, stride, 0, nb, v + k0 * stride, stride, hd, mr, ar, s, p, EB);
    }
    for (int64_t r = 0; r < nr; r++) {
        float *o = j->out + (a + t0 + r) * j->nh * hd + h * hd;
        const float inv = 1.0f / ml[2 * r + 1];
        for (int64_t d = 0; d < hd; d++) o[d] = acc[r * hd + d] * inv;
    }
}

ENTRY static void encoder_run(encoder_job_t *j, float *s, float *p, float *qs, float *acc, float *ml) {
    for (;;) {
        const int64_t t = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (t >= j->n_tasks) break;
        encoder_task(j, j->tasks + 4 * t, s, p, qs, acc, ml);
    }
}

void encoder_attention_part(void *arg, int part) {
    (void)part;
    encoder_job_t *j = arg;
    float *base = malloc(sizeof(float) * (size_t)(4 * EB + j->tile * (2 * j->hd + 2)));
    if (!base || j->tile > 64) {
        free(base);
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *s = base, *p = s + 2 * EB, *qs = p + 2 * EB, *acc = qs + j->tile * j->hd, *ml = acc + j->tile * j->hd;
    encoder_run(j, s, p, qs, acc, ml);
    free(base);
}
