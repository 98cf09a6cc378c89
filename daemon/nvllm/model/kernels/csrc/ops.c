/* The few loops NumPy cannot do at memory speed, called through ctypes (nvllm/model/kernels/ops.py).
 *
 * - paged_decode_attention: one query token per sequence against its pages, read in place through the
 *   block table. NumPy would gather every page into a copy and then run one tiny gemm per (sequence,
 *   KV head); both cost far more than reading the keys once.
 * - softmax_causal_rows: max, exp and sum of attention scores in one pass, each row up to its causal
 *   limit. NumPy needs a mask, three passes and a scalar exp.
 * - silu_mul: SwiGLU's silu(gate) * up in one pass; gelu_tanh_mul, GeGLU's (Gemma's) likewise.
 * - rms_norm, and rope_write_kv (rotary embedding of q and k in place, then k and v to their pool slots,
 *   stored in the pool's KV format): one call per layer where NumPy makes five to ten, each with its own
 *   pass and temporary.
 *
 * Plain C99, no Python headers, no intrinsics: loops are written so that -O3 vectorises them on any
 * target (SSE2/AVX on x86-64, NEON on aarch64). Every function has a NumPy twin in attention.py or
 * decoder.py that the tests compare it with.
 *
 * Built without -ffinite-math-only: a diverging model does produce NaN and inf, and they must come out
 * as NaN or inf (the model then refuses its logits), never as undefined behaviour. No loop bound and no
 * index depends on a float, and nothing converts a float to an integer. Clamps and selects are
 * ternaries, not fmaxf: its NaN rule (return the other operand) would hide a NaN, and without
 * -ffinite-math-only it is a library call that stops the loops vectorising. Array bounds are checked
 * by the callers in ops.py; these functions trust their sizes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "ops.h"

/* On x86-64 each entry point is also built for AVX2+FMA and picked at load time by the CPU it finds;
 * the baseline (SSE2) build stays for older CPUs. aarch64's baseline already has NEON and FMA. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ENTRY __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ENTRY
#endif

/* Bumped with every change to an entry point's arguments or meaning: ops.py refuses a library
 * built from another version (an editable install not rebuilt after a pull) rather than misuse it. */
int kernels_abi(void) { return 5; }   /* 2: NaN and inf defined, carried through; 3: paged_decode_part; 4: KV formats;
                                         5: sliding windows (decode window, softmax starts)
                                         (step.c's entry points per head, column and row: not called from Python) */

/* exp(x) for x <= 0 (scores after subtracting the row max), within 2 ulp; no calls, so loops vectorise.
 * x = n*ln2 + r with |r| <= ln2/2, e^r by Cephes' polynomial, 2^n built in the exponent bits. n is
 * rounded by adding 1.5 * 2^23, which leaves it in the low bits of k: no float-to-int conversion (it
 * is undefined for NaN, and stops the AVX2 build vectorising). Defined for every x: NaN gives NaN,
 * below -87 (-inf included) gives e^-87, above 0 a finite or NaN value that is not e^x. */
static inline float exp_nonpos(float x) {
    const float shifter = 12582912.0f;                  /* 1.5 * 2^23 */
    const float c = x < -87.0f ? -87.0f : x;            /* keeps 2^n normal (e^-87 is 1.6e-38); NaN stays */
    const float k = c * 1.44269504f + shifter;          /* rounds c / ln2 to the nearest integer */
    const float n = k - shifter;
    float r = c - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;               /* NaN if x is */
    uint32_t bits;
    memcpy(&bits, &k, sizeof bits);
    bits = (bits + 127u) << 23;                         /* n + 127 in the exponent (n's low bits, mod 512) */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
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

static inline float dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Four dot products against one query at once: the query is loaded once for all four keys. */
static inline void dot4(const float *q, const float *k0, const float *k1, const float *k2, const float *k3,
                        int64_t n, float *out) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t i = 0; i < n; i++) {
        s0 += q[i] * k0[i];
        s1 += q[i] * k1[i];
        s2 += q[i] * k2[i];
        s3 += q[i] * k3[i];
    }
    out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

/* Ask for the next page while this one is worked on: pages lie anywhere in the pool, and the
 * hardware prefetcher does not follow a jump, nor cross a 4 KiB boundary on its own. */
static inline void prefetch(const uint8_t *p, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 3);
}

/* ---------------------------------------------------------------- the KV pool's formats
 * A token's keys (or values) are nkv * hd values stored as GGUF's F32, F16, BF16 or Q8_0 (blocks.h's
 * type ids; Q8_0 in blocks of 32 along each head, so hd is a multiple of 32). Writes round to nearest
 * even as NumPy's astype does (f16) and as nvllm's quantizers do (bf16, q8_0: model/quant/quantize.py),
 * so kv_format.encode is their twin bit for bit; reads are exact conversions. */

/* Bytes of n values in fmt. */
static inline int64_t kv_bytes(int fmt, int64_t n) {
    return fmt == Q8_0 ? n / QK * Q8_0_BYTES : n * block_bytes(fmt);
}

/* float -> IEEE half, to nearest even; overflow gives inf, NaN stays NaN (its top payload bits kept). */
static inline uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    uint16_t h;
    if (x > 0x7f800000u) {                       /* NaN */
        h = (uint16_t)(0x7c00u + (x >> 13 & 0x3ffu));
        h = h == 0x7c00u ? 0x7c01u : h;
    } else if (x >= 0x477ff000u) {               /* 65520 and up (inf included) round to inf */
        h = 0x7c00u;
    } else if (x < 0x38800000u) {                /* below 2^-14: a subnormal half; adding 0.5 rounds it */
        float a;
        memcpy(&a, &x, sizeof a);
        a += 0.5f;                               /* 0.5's ulp is the half subnormal's step, 2^-24 */
        uint32_t b;
        memcpy(&b, &a, sizeof b);
        h = (uint16_t)(b - 0x3f000000u);
    } else {                                     /* rebias the exponent, round the 13 bits dropped */
        x += 0xc8000fffu + ((x >> 13) & 1u);
        h = (uint16_t)(x >> 13);
    }
    return (uint16_t)(sign | h);
}

/* float -> bfloat16, to nearest even; a NaN stays a quiet NaN. */
static inline uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) x = (x & 0xffff0000u) | 0x00400000u;
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* One Q8_0 block from 32 floats: d = max|x| / 127, q = roundf(x / d) (0 where that is NaN, clamped to
 * +-127 where 1/d overflowed: the block's d carries NaN or inf on), d kept as fp16. */
static inline void q8_0_block(const float *x, uint8_t *out) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        const float a = fabsf(x[j]);
        amax = a > amax || a != a ? a : amax;    /* a NaN wins and stays */
    }
    const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = float_to_half(d);
    memcpy(out, &dh, sizeof dh);
    for (int j = 0; j < QK; j++) {
        float v = x[j] * inv;
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        out[Q8_0_QS + j] = (uint8_t)(int8_t)(v == v ? roundf(v) : 0.0f);
    }
}

/* n values from float to fmt at dst. */
static void kv_store(const float *src, uint8_t *dst, int64_t n, int fmt) {
    if (fmt == F32) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
    } else if (fmt == F16 || fmt == BF16) {
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = fmt == F16 ? float_to_half(src[i]) : float_to_bf16(src[i]);
            memcpy(dst + 2 * i, &h, sizeof h);
        }
    } else {
        for (int64_t b = 0; b < n / QK; b++) q8_0_block(src + b * QK, dst + b * Q8_0_BYTES);
    }
}

/* n values in fmt (not F32, which is read in place) at src -> float dst, exactly. */
static void kv_load(const uint8_t *src, float *dst, int64_t n, int fmt) {
    if (fmt == F16) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = half_to_float((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
    } else if (fmt == BF16) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const uint32_t bits = (uint32_t)(src[2 * i] | src[2 * i + 1] << 8) << 16;
            memcpy(dst + i, &bits, sizeof bits);
        }
    } else {
        for (int64_t b = 0; b < n / QK; b++) {
            const uint8_t *blk = src + b * Q8_0_BYTES;
            const float d = le_half(blk);
            float *o = dst + b * QK;
#pragma omp simd
            for (int j = 0; j < QK; j++) o[j] = (float)(int8_t)blk[Q8_0_QS + j] * d;
        }
    }
}

/* q [S, nh, hd] (already scaled; q_stride floats from one sequence's row to the next), k_pool and v_pool
 * [num_blocks, bs, nkv, hd] in KV format fmt, block_tables [S, table_stride], context_lens [S] -> out
 * [S, nh, hd], for query heads q0 .. q1 (the others are neither read nor written; a thread of a team takes
 * some heads of a sequence, step.c); window > 0 (a sliding-window layer) attends to the last `window` keys only, and pages before
 * them are not read. Pages are read front to back, every head of a token row at once, so each page streams from
 * memory once for keys and once for values; a page in another format than F32 is first converted into a
 * page of floats in scratch (it stays in cache; only the KV heads of q0 .. q1), so the loops below are the
 * same for every format. A head's arithmetic does not depend on which other heads are computed with it.
 * Returns 0, or -1 if scratch could not be allocated. */
static inline __attribute__((always_inline)) int
decode_impl(const float *q, int64_t q_stride, const uint8_t *k_pool, const uint8_t *v_pool, const int32_t *block_tables,
            int64_t table_stride, const int64_t *context_lens, float *out, int64_t S, int64_t nh, int64_t nkv,
            int64_t hd, int64_t bs, int fmt, int64_t window, int64_t q0, int64_t q1) {
    const int64_t g = nh / nkv, row = nkv * hd;                    /* floats of one token */
    const int64_t row_bytes = kv_bytes(fmt, row), page = bs * row_bytes;
    const int64_t kh0 = q0 / g, kh1 = (q1 - 1) / g + 1, nq = q1 - q0;   /* the KV heads read */
    const int64_t whole = kh0 == 0 && kh1 == nkv, crow = (kh1 - kh0) * hd, skip = kv_bytes(fmt, kh0 * hd);
    int64_t max_ctx = 0;
    for (int64_t s = 0; s < S; s++) max_ctx = context_lens[s] > max_ctx ? context_lens[s] : max_ctx;
    const int64_t converted = fmt == F32 ? 0 : bs * crow;
    const int64_t ks = fmt == F32 ? row : crow;                   /* floats from one token's keys to the next */
    float *scores = malloc(sizeof(float) * (size_t)(nq * max_ctx + nq * hd + nq + converted));
    if (!scores) return -1;
    float *acc = scores + nq * max_ctx, *sums = acc + nq * hd, *floats = sums + nq;
    for (int64_t s = 0; s < S; s++) {
        const int64_t ctx = context_lens[s];
        const int32_t *table = block_tables + s * table_stride;
        const float *qs = q + s * q_stride;
        const int64_t pages = (ctx + bs - 1) / bs;
        /* the window's first key, and its page: keys from b0 * bs up to `first` get a score of 0 */
        const int64_t first = window > 0 && ctx > window ? ctx - window : 0, b0 = first / bs;
        for (int64_t b = b0; b < pages; b++) {          /* page by page: no division per token */
            const uint8_t *kp = k_pool + (int64_t)table[b] * page;
            const uint8_t *next = b + 1 < pages ? k_pool + (int64_t)table[b + 1] * page : v_pool + (int64_t)table[b0] * page;
            const int64_t t0 = b * bs, n = ctx - t0 < bs ? ctx - t0 : bs;
            const float *k = (const float *)kp + kh0 * hd;
            if (converted) {
                if (whole) kv_load(kp, floats, n * row, fmt);
                else for (int64_t o = 0; o < n; o++) kv_load(kp + o * row_bytes + skip, floats + o * crow, crow, fmt);
                k = floats;
            }
            int64_t o = 0;
            for (; o + 4 <= n; o += 4, k += 4 * ks) {    /* four keys per pass: each query load serves four */
                prefetch(next + o * row_bytes, 4 * row_bytes);   /* the next page, a slice per pass, as fast as it is used */
                for (int64_t h = kh0; h < kh1; h++)
                    for (int64_t i = h * g > q0 ? h * g : q0; i < (h + 1) * g && i < q1; i++) {
                        const float *qi = qs + i * hd, *k0 = k + (h - kh0) * hd;
                        float *sc = scores + (i - q0) * ctx + t0 + o;
                        dot4(qi, k0, k0 + ks, k0 + 2 * ks, k0 + 3 * ks, hd, sc);
                    }
            }
            if (o < bs) prefetch(next + o * row_bytes, (bs - o) * row_bytes);
            for (; o < n; o++, k += ks)
                for (int64_t h = kh0; h < kh1; h++)
                    for (int64_t i = h * g > q0 ? h * g : q0; i < (h + 1) * g && i < q1; i++)
                        scores[(i - q0) * ctx + t0 + o] = dot(qs + i * hd, k + (h - kh0) * hd, hd);
        }
        for (int64_t i = 0; i < nq; i++) {
            sums[i] = softmax_row(scores + i * ctx + first, ctx - first);
            if (first > b0 * bs) memset(scores + i * ctx + b0 * bs, 0, sizeof(float) * (size_t)(first - b0 * bs));
        }
        memset(acc, 0, sizeof(float) * (size_t)(nq * hd));
        for (int64_t b = b0; b < pages; b++) {
            const uint8_t *vp = v_pool + (int64_t)table[b] * page;
            const uint8_t *next = b + 1 < pages ? v_pool + (int64_t)table[b + 1] * page
                                  : s + 1 < S ? k_pool + (int64_t)block_tables[(s + 1) * table_stride] * page : NULL;
            const int64_t t0 = b * bs, n = ctx - t0 < bs ? ctx - t0 : bs;
            const float *v = (const float *)vp + kh0 * hd;
            if (converted) {
                if (whole) kv_load(vp, floats, n * row, fmt);
                else for (int64_t o = 0; o < n; o++) kv_load(vp + o * row_bytes + skip, floats + o * crow, crow, fmt);
                v = floats;
            }
            int64_t o = 0;
            for (; o + 4 <= n; o += 4, v += 4 * ks) {    /* four values per pass: a quarter of the acc traffic */
                if (next) prefetch(next + o * row_bytes, 4 * row_bytes);
                for (int64_t h = kh0; h < kh1; h++)
                    for (int64_t i = h * g > q0 ? h * g : q0; i < (h + 1) * g && i < q1; i++) {
                        const float *p = scores + (i - q0) * ctx + t0 + o, *v0 = v + (h - kh0) * hd;
                        const float *v1 = v0 + ks, *v2 = v1 + ks, *v3 = v2 + ks;
                        const float p0 = p[0], p1 = p[1], p2 = p[2], p3 = p[3];
                        float *a = acc + (i - q0) * hd;
#pragma omp simd
                        for (int64_t d = 0; d < hd; d++) a[d] += p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d];
                    }
            }
            if (next && o < bs) prefetch(next + o * row_bytes, (bs - o) * row_bytes);
            for (; o < n; o++, v += ks)
                for (int64_t h = kh0; h < kh1; h++)
                    for (int64_t i = h * g > q0 ? h * g : q0; i < (h + 1) * g && i < q1; i++) {
                        const float p = scores[(i - q0) * ctx + t0 + o], *vh = v + (h - kh0) * hd;
                        float *a = acc + (i - q0) * hd;
#pragma omp simd
                        for (int64_t d = 0; d < hd; d++) a[d] += p * vh[d];
                    }
        }
        for (int64_t i = 0; i < nq; i++) {
            float *o = out + (s * nh + q0 + i) * hd;
            const float inv = 1.0f / sums[i];
            for (int64_t d = 0; d < hd; d++) o[d] = acc[i * hd + d] * inv;
        }
    }
    free(scores);
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

/* Columns c0 .. c1 of one row: gate_up [2I] (gate then up) -> out [I] = silu(gate) * up. Each value on its own,
 * so a row split across threads gets the same bits. */
ENTRY void silu_mul_cols(const float *gate_up, float *out, int64_t inter, int64_t c0, int64_t c1) {
    const float *gt = gate_up, *up = gt + inter;
#pragma omp simd
    for (int64_t i = c0; i < c1; i++) {
        /* sigmoid from e = exp(-|x|), which cannot overflow: 1/(1+e) for x >= 0, e/(1+e) below (NaN
         * takes the second, so it stays NaN); a select, not a branch, so that the loop vectorises */
        const float x = gt[i], e = exp_nonpos(-fabsf(x));
        out[i] = x * (x >= 0.0f ? 1.0f : e) / (1.0f + e) * up[i];
    }
}

/* gate_up [T, 2I] (gate then up, per row) -> out [T, I] = silu(gate) * up. */
void silu_mul(const float *gate_up, float *out, int64_t T, int64_t inter) {
    for (int64_t t = 0; t < T; t++) silu_mul_cols(gate_up + t * 2 * inter, out + t * inter, inter, 0, inter);
}

/* gelu_tanh_mul's columns c0 .. c1 of one row, as silu_mul_cols. */
ENTRY void gelu_tanh_mul_cols(const float *gate_up, float *out, int64_t inter, int64_t c0, int64_t c1) {
    const float *gt = gate_up, *up = gt + inter;
    for (int64_t i = c0; i < c1; i++) {
        const float x = gt[i];
        out[i] = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))) * up[i];
    }
}

/* gate_up [T, 2I] -> out [T, I] = gelu_tanh(gate) * up: GeGLU, with PyTorch's tanh approximation of gelu. */
void gelu_tanh_mul(const float *gate_up, float *out, int64_t T, int64_t inter) {
    for (int64_t t = 0; t < T; t++) gelu_tanh_mul_cols(gate_up + t * 2 * inter, out + t * inter, inter, 0, inter);
}

/* 1 / sqrt(mean(x^2) + eps) of one row of H: rms_norm's scale. Not inlined, so the sum of squares is the same
 * code (the same order of additions) wherever it is called: step.c's threads each compute it for a row
 * whose columns they share out. */
ENTRY __attribute__((noinline)) float rms_inv(const float *x, int64_t H, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < H; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)H + eps);
}

/* Columns c0 .. c1 of one row: out = x * inv * weight (inv from rms_inv). */
ENTRY void rms_scale(const float *x, const float *weight, float *out, float inv, int64_t c0, int64_t c1) {
#pragma omp simd
    for (int64_t i = c0; i < c1; i++) out[i] = x[i] * inv * weight[i];
}

/* x [T, H] -> out [T, H] = x / sqrt(mean(x^2) + eps) * weight, one row at a time. */
void rms_norm(const float *x, const float *weight, float *out, int64_t T, int64_t H, float eps) {
    for (int64_t t = 0; t < T; t++) rms_scale(x + t * H, weight, out + t * H, rms_inv(x + t * H, H, eps), 0, H);
}

/* One head of one row of rope_write_kv: head h < nq is a q head (rope and scale in place); head nq + i is
 * KV head i (rope on its keys in place, then its keys and values stored at the row's slot). Heads are
 * independent, so a team may share a row's heads out. */
ENTRY void rope_write_kv_head(float *row, int64_t nq, int64_t nk, int64_t hd, const float *c, const float *s,
                              float q_scale, int64_t slot, void *k_pool, void *v_pool, int fmt, int64_t h) {
    const int64_t half = hd / 2;
    float *x1 = row + h * hd, *x2 = x1 + half;
    const float f = h < nq ? q_scale : 1.0f;
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        const float a = x1[i], b = x2[i];
        x1[i] = (a * c[i] - b * s[i]) * f;
        x2[i] = (b * c[i] + a * s[i]) * f;
    }
    if (h < nq) return;
    const int64_t kv = h - nq, row_bytes = kv_bytes(fmt, nk * hd), at = slot * row_bytes + kv_bytes(fmt, kv * hd);
    kv_store(row + h * hd, (uint8_t *)k_pool + at, hd, fmt);
    kv_store(row + (nq + nk + kv) * hd, (uint8_t *)v_pool + at, hd, fmt);
}

/* One layer's new q, k and v, in the qkv rows [T, row_stride] the projection wrote (q heads, then k,
 * then v): q and k get the rotary embedding in place, as transformers' rotate_half does for Llama and
 * Qwen2 (a head's two halves are the pairs; cos and sin are [T, hd/2]), q also the softmax scale; then
 * k and v are stored in KV format fmt at their slots of the page pools [num_slots, nk * hd]. */
void rope_write_kv(float *qkv, int64_t T, int64_t row_stride, int64_t nq, int64_t nk, int64_t hd,
                   const float *cos_t, const float *sin_t, float q_scale, const int64_t *slots,
                   void *k_pool, void *v_pool, int fmt) {
    const int64_t half = hd / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nq + nk; h++)
            rope_write_kv_head(qkv + t * row_stride, nq, nk, hd, cos_t + t * half, sin_t + t * half, q_scale,
                               slots[t], k_pool, v_pool, fmt, h);
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
