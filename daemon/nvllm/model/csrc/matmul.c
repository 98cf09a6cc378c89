/* y = x @ W.T with W kept in its GGUF block format, called through ctypes (nvllm/model/matmul_kernels.py).
 *
 * x is float32 [T, in] (rows may be strided), W is [rows, in] stored as rows of blocks (model/quants.py's
 * QuantizedWeight), y is float32 [T, rows]. The work is cut into tiles of RT output rows: a tile's
 * blocks are decoded, KC values at a time, into a small float buffer that stays in L1, and multiplied
 * there by every row of x, three rows of x by four rows of W per pass of the micro-kernel (TT rows of x
 * at a time for prefill), so each weight byte is read once per call (once per TT rows of x), whatever
 * T is. Activations are never quantized: a decoded weight is exactly what quants.py's NumPy dequantizer
 * gives, bit for bit, and the products are summed in float32.
 *
 * Fixed order: each output is summed in VL lanes, lane j taking the products at k = j mod VL in
 * increasing k, and the lanes are added in one fixed tree at the end. That order does not depend on
 * T, on which other rows of x or W share a tile, nor on the thread count, so a row of x gets the same
 * bits alone or in a batch (the engine's exactness invariant) and with 1 or N threads. Within one
 * build: the AVX2 clone below fuses each multiply-add (FMA), the baseline one does not.
 *
 * Threads: the output tiles are split in contiguous ranges over `threads` threads, the caller's being
 * one of them. The others are a small persistent pool (created on first use, grown when a call asks for
 * more, reset in a forked child); one call runs at a time, later callers wait on a mutex. A pool, as
 * creating and joining a thread costs ~170 us here against ~7 us to wake a pooled one, and a step makes
 * ~100 calls.
 *
 * Plain C99 with GCC vector extensions (one vector type, lowered to SSE2, AVX2 or NEON by the compiler)
 * and POSIX threads; no Python headers. Built without -ffinite-math-only: NaN and inf in x or W come out
 * as NaN or inf. Sizes are checked by the caller (matmul_kernels.py); the entry point checks only that
 * the format is known and the row stride fits it.
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "GGUF blocks are little-endian; this file reads them as the host's integers"
#endif

/* As in kernels.c: on x86-64 the entry points are also built for AVX2+FMA and picked at load time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ENTRY __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ENTRY
#endif
#define INLINE static inline __attribute__((always_inline))
/* The helpers that take or return vectors are always inlined: no call crosses the ABI GCC warns of. */
#pragma GCC diagnostic ignored "-Wpsabi"
/* The products' multiply-adds are fused where the target has FMA (the AVX2 clone, aarch64): faster
 * and no less exact. Only there: the decoders keep quants.py's separate roundings (d * q, then + m). */
#define FUSED __attribute__((noinline, optimize("fp-contract=fast")))

/* Bumped with every change to the entry point's arguments or meaning (matmul_kernels.py checks it). */
int matmul_abi(void) { return 1; }

enum { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30 };

#define VL 8       /* lanes per accumulator */
#define RT 4       /* output rows per tile */
#define TT 64      /* rows of x per tile */
#define KC 1024    /* values of a row decoded at a time: RT * KC floats = 16 KiB, in L1 */
#define MAX_THREADS 64

typedef float v8 __attribute__((vector_size(VL * sizeof(float))));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));

#define LOAD8(v, p) memcpy(&(v), (p), sizeof(v8))   /* unaligned load */

/* ---------------------------------------------------------------- decoding */

/* IEEE half -> float, exactly (subnormals, inf and NaN included), branch-free so loops vectorise:
 * the half's exponent and mantissa shifted into a float's place are the value times 2^-112. */
INLINE float half_to_float(uint16_t h) {
    uint32_t mag = (uint32_t)(h & 0x7fffu) << 13;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    float f;
    memcpy(&f, &mag, sizeof f);
    f *= 0x1p112f;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits = (h & 0x7c00u) == 0x7c00u ? (0x7f800000u | mag) : bits;   /* inf, NaN (payload kept) */
    bits |= sign;
    memcpy(&f, &bits, sizeof f);
    return f;
}

INLINE float le_half(const uint8_t *p) { return half_to_float((uint16_t)(p[0] | (p[1] << 8))); }

/* Each decoder writes the values of one block in quants.py's float order (d * q, then + m or - dmin * m). */

INLINE void dec_q8_0(const uint8_t *b, float *out) {
    const float d = le_half(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) out[j] = (float)qs[j] * d;
}

/* Bytes are decoded eight at a time, each moved into a 32-bit lane by a per-lane shift, then handled as
 * int32 lanes: GCC 12 compiles byte loops and vector conversions of bytes one lane at a time. */
INLINE u32x8 bytes8(const uint8_t *p) {
    uint32_t w[2];
    memcpy(w, p, sizeof w);
    const u32x8 shift = {0, 8, 16, 24, 0, 8, 16, 24};
    return ((u32x8){w[0], w[0], w[0], w[0], w[1], w[1], w[1], w[1]} >> shift) & 0xffu;
}

/* Eight little-endian 16-bit values, zero-extended into 32-bit lanes in the same way. */
INLINE u32x8 words8(const uint8_t *p) {
    uint32_t w[4];
    memcpy(w, p, sizeof w);
    const u32x8 shift = {0, 16, 0, 16, 0, 16, 0, 16};
    return ((u32x8){w[0], w[0], w[1], w[1], w[2], w[2], w[3], w[3]} >> shift) & 0xffffu;
}

#define TO_FLOAT(v) __builtin_convertvector((i32x8)(v), v8)

INLINE void nibbles8(const uint8_t *qs, v8 *lo, v8 *hi) {
    const u32x8 v = bytes8(qs);
    *lo = TO_FLOAT(v & 15u);
    *hi = TO_FLOAT(v >> 4);
}

INLINE void dec_q4_0(const uint8_t *b, float *out) {
    const float d = le_half(b);
    for (int h = 0; h < 16; h += 8) {
        v8 lo, hi;
        nibbles8(b + 2 + h, &lo, &hi);
        lo = (lo - 8.0f) * d, hi = (hi - 8.0f) * d;
        memcpy(out + h, &lo, sizeof lo);
        memcpy(out + 16 + h, &hi, sizeof hi);
    }
}

INLINE void dec_q4_1(const uint8_t *b, float *out) {
    const float d = le_half(b), m = le_half(b + 2);
    for (int h = 0; h < 16; h += 8) {
        v8 lo, hi;
        nibbles8(b + 4 + h, &lo, &hi);
        lo = lo * d + m, hi = hi * d + m;   /* two roundings, as quants.py: no FMA outside FUSED */
        memcpy(out + h, &lo, sizeof lo);
        memcpy(out + 16 + h, &hi, sizeof hi);
    }
}

/* The j-th 6-bit scale and min of a Q4_K/Q5_K block's 12 scale bytes (llama.cpp's get_scale_min_k4). */
INLINE void scale_min_k4(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K (qh == NULL) and Q5_K: 8 sub-blocks of 32; sub-block 2i is the low nibbles of qs[32i:32i+32],
 * 2i+1 the high ones; Q5_K's fifth bit of value l of sub-block s is bit s of qh[l]. */
INLINE void dec_k4(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *out) {
    const float d = le_half(b), dmin = le_half(b + 2);
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        scale_min_k4(b + 4, s, &sc, &mn);
        const float ds = d * (float)sc, dm = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (s / 2);
        const int shift = 4 * (s & 1);
        for (int l = 0; l < 32; l += 8) {
            u32x8 v = (bytes8(q + l) >> shift) & 15u;
            if (qh) v |= ((bytes8(qh + l) >> s) & 1u) << 4;
            const v8 f = TO_FLOAT(v) * ds - dm;   /* two roundings, as quants.py */
            memcpy(out + 32 * s + l, &f, sizeof f);
        }
    }
}

/* Q6_K: two halves of 128; in half h, value 32k + l is nibble k/2 of ql[64h + l + 32(k%2)] with bits
 * 2k, 2k+1 of qh[32h + l] above it, less 32; int8 scale i covers values 16i .. 16i+15. */
INLINE void dec_q6_k(const uint8_t *b, float *out) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = le_half(b + 208);
    for (int h = 0; h < 2; h++) {
        for (int k = 0; k < 4; k++) {
            const uint8_t *q = ql + 64 * h + 32 * (k & 1);
            const int shift = 4 * (k >> 1);
            for (int l = 0; l < 32; l += 8) {
                const u32x8 v = ((bytes8(q + l) >> shift) & 15u) | (((bytes8(qh + 32 * h + l) >> (2 * k)) & 3u) << 4);
                const int i = 128 * h + 32 * k + l;
                const v8 f = __builtin_convertvector((i32x8)v - 32, v8) * (d * (float)sc[i / 16]);
                memcpy(out + i, &f, sizeof f);
            }
        }
    }
}

/* half_to_float on 8 values at once (little-endian halves, as GGUF stores them on the hosts nvllm runs on). */
INLINE void halves8(const uint8_t *p, float *out) {
    const u32x8 h = words8(p);
    const u32x8 mag = (h & 0x7fffu) << 13;
    v8 f;
    memcpy(&f, &mag, sizeof f);
    f *= 0x1p112f;
    u32x8 bits;
    memcpy(&bits, &f, sizeof bits);
    const u32x8 special = (u32x8)((h & 0x7c00u) == 0x7c00u);   /* all ones where inf or NaN */
    bits = (bits & ~special) | ((mag | 0x7f800000u) & special);
    bits |= (h & 0x8000u) << 16;
    memcpy(out, &bits, sizeof bits);
}

INLINE void dec_f16(const uint8_t *p, int64_t n, float *out) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) halves8(p + 2 * j, out + j);
    for (; j < n; j++) out[j] = half_to_float((uint16_t)(p[2 * j] | (p[2 * j + 1] << 8)));
}

INLINE void dec_bf16(const uint8_t *p, int64_t n, float *out) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const u32x8 bits = words8(p + 2 * j) << 16;   /* bfloat16 is the top half of a float */
        memcpy(out + j, &bits, sizeof bits);
    }
    for (; j < n; j++) {
        uint32_t bits = ((uint32_t)p[2 * j] | ((uint32_t)p[2 * j + 1] << 8)) << 16;
        memcpy(out + j, &bits, sizeof bits);
    }
}

/* Values per block and bytes per block of a format; 0 for an unknown one. */
static int block_elems(int fmt) {
    switch (fmt) {
    case F32: case F16: case BF16: return 1;
    case Q4_0: case Q4_1: case Q8_0: return 32;
    case Q4_K: case Q5_K: case Q6_K: return 256;
    default: return 0;
    }
}

static int block_bytes(int fmt) {
    switch (fmt) {
    case F32: return 4;
    case F16: case BF16: return 2;
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
    }
}

/* Values k0 .. k0+n of one row (k0 and n whole blocks, but for the last chunk of the plain floats). */
INLINE void decode_span(int fmt, const uint8_t *row, int64_t k0, int64_t n, float *out) {
    switch (fmt) {
    case F32: memcpy(out, row + 4 * k0, (size_t)n * 4); break;
    case F16: dec_f16(row + 2 * k0, n, out); break;
    case BF16: dec_bf16(row + 2 * k0, n, out); break;
    case Q8_0: for (int64_t j = 0; j < n; j += 32) dec_q8_0(row + (k0 + j) / 32 * 34, out + j); break;
    case Q4_0: for (int64_t j = 0; j < n; j += 32) dec_q4_0(row + (k0 + j) / 32 * 18, out + j); break;
    case Q4_1: for (int64_t j = 0; j < n; j += 32) dec_q4_1(row + (k0 + j) / 32 * 20, out + j); break;
    case Q4_K:
        for (int64_t j = 0; j < n; j += 256) {
            const uint8_t *b = row + (k0 + j) / 256 * 144;
            dec_k4(b, NULL, b + 16, out + j);
        }
        break;
    case Q5_K:
        for (int64_t j = 0; j < n; j += 256) {
            const uint8_t *b = row + (k0 + j) / 256 * 176;
            dec_k4(b, b + 16, b + 48, out + j);
        }
        break;
    case Q6_K: for (int64_t j = 0; j < n; j += 256) dec_q6_k(row + (k0 + j) / 256 * 210, out + j); break;
    default: break;
    }
}

/* ---------------------------------------------------------------- the products */

/* acc[t * RT + r] += lanes of x_t . w_r over n values, for two rows of x and RT = 4 rows of w (stride ws).
 * The tail past the last whole vector goes into lanes 0 .. n%VL - 1, as a longer row would. */
ENTRY FUSED void kern_2x4(const float *x0, const float *x1, const float *w, int64_t ws, int64_t n, v8 *acc) {
    v8 a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    v8 b0 = acc[4], b1 = acc[5], b2 = acc[6], b3 = acc[7];
    const float *w0 = w, *w1 = w + ws, *w2 = w + 2 * ws, *w3 = w + 3 * ws;
    int64_t k = 0;
    for (; k + VL <= n; k += VL) {
        v8 p, q, c0, c1, c2, c3;
        LOAD8(p, x0 + k), LOAD8(q, x1 + k);
        LOAD8(c0, w0 + k), LOAD8(c1, w1 + k), LOAD8(c2, w2 + k), LOAD8(c3, w3 + k);
        a0 += p * c0, a1 += p * c1, a2 += p * c2, a3 += p * c3;
        b0 += q * c0, b1 += q * c1, b2 += q * c2, b3 += q * c3;
    }
    for (int j = 0; k + j < n; j++) {
        const float p = x0[k + j], q = x1[k + j];
        a0[j] += p * w0[k + j], a1[j] += p * w1[k + j], a2[j] += p * w2[k + j], a3[j] += p * w3[k + j];
        b0[j] += q * w0[k + j], b1[j] += q * w1[k + j], b2[j] += q * w2[k + j], b3[j] += q * w3[k + j];
    }
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
    acc[4] = b0, acc[5] = b1, acc[6] = b2, acc[7] = b3;
}

/* The same for three rows of x (12 accumulators, which AVX2's 16 registers still hold). */
ENTRY FUSED void kern_3x4(const float *x0, const float *x1, const float *x2, const float *w, int64_t ws, int64_t n,
                          v8 *acc) {
    v8 a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    v8 b0 = acc[4], b1 = acc[5], b2 = acc[6], b3 = acc[7];
    v8 e0 = acc[8], e1 = acc[9], e2 = acc[10], e3 = acc[11];
    const float *w0 = w, *w1 = w + ws, *w2 = w + 2 * ws, *w3 = w + 3 * ws;
    int64_t k = 0;
    for (; k + VL <= n; k += VL) {
        v8 p, q, u, c;
        LOAD8(p, x0 + k), LOAD8(q, x1 + k), LOAD8(u, x2 + k);
        LOAD8(c, w0 + k), a0 += p * c, b0 += q * c, e0 += u * c;
        LOAD8(c, w1 + k), a1 += p * c, b1 += q * c, e1 += u * c;
        LOAD8(c, w2 + k), a2 += p * c, b2 += q * c, e2 += u * c;
        LOAD8(c, w3 + k), a3 += p * c, b3 += q * c, e3 += u * c;
    }
    for (int j = 0; k + j < n; j++) {
        const float p = x0[k + j], q = x1[k + j], u = x2[k + j];
        a0[j] += p * w0[k + j], a1[j] += p * w1[k + j], a2[j] += p * w2[k + j], a3[j] += p * w3[k + j];
        b0[j] += q * w0[k + j], b1[j] += q * w1[k + j], b2[j] += q * w2[k + j], b3[j] += q * w3[k + j];
        e0[j] += u * w0[k + j], e1[j] += u * w1[k + j], e2[j] += u * w2[k + j], e3[j] += u * w3[k + j];
    }
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
    acc[4] = b0, acc[5] = b1, acc[6] = b2, acc[7] = b3;
    acc[8] = e0, acc[9] = e1, acc[10] = e2, acc[11] = e3;
}

/* The same for one row of x: what kern_2x4 does to its first row, lane for lane. */
ENTRY FUSED void kern_1x4(const float *x0, const float *w, int64_t ws, int64_t n, v8 *acc) {
    v8 a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    const float *w0 = w, *w1 = w + ws, *w2 = w + 2 * ws, *w3 = w + 3 * ws;
    int64_t k = 0;
    for (; k + VL <= n; k += VL) {
        v8 p, c0, c1, c2, c3;
        LOAD8(p, x0 + k);
        LOAD8(c0, w0 + k), LOAD8(c1, w1 + k), LOAD8(c2, w2 + k), LOAD8(c3, w3 + k);
        a0 += p * c0, a1 += p * c1, a2 += p * c2, a3 += p * c3;
    }
    for (int j = 0; k + j < n; j++) {
        const float p = x0[k + j];
        a0[j] += p * w0[k + j], a1[j] += p * w1[k + j], a2[j] += p * w2[k + j], a3[j] += p * w3[k + j];
    }
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
}

INLINE float lanes_sum(const v8 *p) {
    const v8 a = *p;
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

typedef struct {
    int fmt;
    const uint8_t *w;
    int64_t row_bytes, rows, in;
    const float *x;
    int64_t x_stride, T;
    float *y;
    int64_t y_stride;
    int parts;
} job_t;

/* Rows of x t0 .. t0+tn against output rows o0 .. o0+RT-1 (those past the end read as zeros). */
INLINE void tile(const job_t *j, int64_t t0, int64_t tn, int64_t o0, float *wbuf, v8 *acc) {
    const int64_t live = j->rows - o0 < RT ? j->rows - o0 : RT;
    memset(acc, 0, sizeof(v8) * RT * (size_t)(tn + 1));
    for (int64_t k0 = 0; k0 < j->in; k0 += KC) {
        const int64_t n = j->in - k0 < KC ? j->in - k0 : KC;
        const float *w;
        int64_t ws;
        /* plain floats are read where they are for one or two rows of x; for more, a copy in L1 is
         * faster than four rows read again from L2 for every pair */
        if (j->fmt == F32 && live == RT && tn <= 2) {
            w = (const float *)(j->w + o0 * j->row_bytes) + k0;
            ws = j->row_bytes / 4;
        } else {
            for (int64_t r = 0; r < RT; r++) {
                if (r < live) decode_span(j->fmt, j->w + (o0 + r) * j->row_bytes, k0, n, wbuf + r * KC);
                else memset(wbuf + r * KC, 0, (size_t)n * sizeof(float));
            }
            w = wbuf;
            ws = KC;
        }
        const float *x = j->x + t0 * j->x_stride + k0;
        int64_t t = 0;
        for (; t + 3 <= tn; t += 3)
            kern_3x4(x + t * j->x_stride, x + (t + 1) * j->x_stride, x + (t + 2) * j->x_stride, w, ws, n, acc + t * RT);
        for (; t + 2 <= tn; t += 2) kern_2x4(x + t * j->x_stride, x + (t + 1) * j->x_stride, w, ws, n, acc + t * RT);
        if (t < tn) kern_1x4(x + t * j->x_stride, w, ws, n, acc + t * RT);
    }
    for (int64_t t = 0; t < tn; t++)
        for (int64_t r = 0; r < live; r++) j->y[(t0 + t) * j->y_stride + o0 + r] = lanes_sum(&acc[t * RT + r]);
}

/* Part `part` of `parts`: a contiguous range of output tiles, for every row of x. */
ENTRY void matmul_part(const job_t *j, int part) {
    float wbuf[RT * KC] __attribute__((aligned(64)));
    v8 acc[RT * (TT + 1)];
    const int64_t tiles = (j->rows + RT - 1) / RT;
    const int64_t first = tiles * part / j->parts, last = tiles * (part + 1) / j->parts;
    for (int64_t t0 = 0; t0 < j->T; t0 += TT) {
        const int64_t tn = j->T - t0 < TT ? j->T - t0 : TT;
        for (int64_t i = first; i < last; i++) tile(j, t0, tn, i * RT, wbuf, acc);
    }
}

/* ---------------------------------------------------------------- the pool */

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;   /* one call at a time */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;   /* guards what follows */
static pthread_cond_t go = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
static int workers;                      /* threads 1 .. workers exist */
static unsigned long generation;         /* bumped for every job */
static unsigned long born[MAX_THREADS];  /* the generation each worker was created in */
static int pending;                      /* participants still working */
static int cur_parts;
static const job_t *cur_job;
static int atfork_set;

static void *worker(void *arg) {
    const int me = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool_lock);
    unsigned long seen = born[me];
    for (;;) {
        while (generation == seen) pthread_cond_wait(&go, &pool_lock);
        seen = generation;
        if (me >= cur_parts) continue;   /* not needed this time */
        const job_t *j = cur_job;
        pthread_mutex_unlock(&pool_lock);
        matmul_part(j, me);
        pthread_mutex_lock(&pool_lock);
        if (--pending == 0) pthread_cond_signal(&done);
    }
    return NULL;
}

/* In a forked child only the forking thread exists: start the pool afresh. */
static void pool_after_fork(void) {
    pthread_mutex_init(&call_lock, NULL);
    pthread_mutex_init(&pool_lock, NULL);
    pthread_cond_init(&go, NULL);
    pthread_cond_init(&done, NULL);
    workers = 0;
}

/* Threads 1 .. want-1 exist when this returns, or as many as could be made; returns the parts usable. */
static int grow_pool(int want) {
    if (!atfork_set) {
        pthread_atfork(NULL, NULL, pool_after_fork);
        atfork_set = 1;
    }
    if (want <= workers + 1) return want;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);   /* workers take no signals: Python's stay on its threads */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 1 << 20);
    while (workers + 1 < want) {
        pthread_t th;
        born[workers + 1] = generation;
        if (pthread_create(&th, &attr, worker, (void *)(intptr_t)(workers + 1)) != 0) break;
        workers++;
    }
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return workers + 1 < want ? workers + 1 : want;
}

/* y [T, rows] (row stride y_stride) = x [T, in] (row stride x_stride) @ W.T, W of `rows` rows of
 * row_bytes bytes in format fmt (the GGUF type id). Returns 0, or -1 for an unknown format, -2 for a
 * row stride that does not fit `in` values of the format. threads < 1 counts as 1. */
int quant_matmul(int fmt, const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t in, const float *x,
                 int64_t x_stride, int64_t T, float *y, int64_t y_stride, int threads) {
    const int be = block_elems(fmt);
    if (be == 0) return -1;
    if (in < 0 || in % be || row_bytes != in / be * block_bytes(fmt)) return -2;
    if (rows <= 0 || T <= 0) return 0;
    const int64_t tiles = (rows + RT - 1) / RT;
    int parts = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if (parts > tiles) parts = (int)tiles;
    job_t j = {fmt, w, row_bytes, rows, in, x, x_stride, T, y, y_stride, parts};
    if (parts == 1) {
        matmul_part(&j, 0);
        return 0;
    }
    pthread_mutex_lock(&call_lock);
    pthread_mutex_lock(&pool_lock);
    j.parts = parts = grow_pool(parts);
    if (parts > 1) {
        cur_job = &j;
        cur_parts = parts;
        pending = parts - 1;
        generation++;
        pthread_cond_broadcast(&go);
    }
    pthread_mutex_unlock(&pool_lock);
    matmul_part(&j, 0);
    pthread_mutex_lock(&pool_lock);
    while (pending > 0) pthread_cond_wait(&done, &pool_lock);
    pthread_mutex_unlock(&pool_lock);
    pthread_mutex_unlock(&call_lock);
    return 0;
}

/* Worker threads in the pool now (for the wrapper's describe()). */
int matmul_pool_threads(void) {
    pthread_mutex_lock(&pool_lock);
    const int n = workers;
    pthread_mutex_unlock(&pool_lock);
    return n;
}
