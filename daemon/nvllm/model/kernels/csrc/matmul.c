/* y = x @ W.T with W kept in its GGUF block format, called through ctypes (nvllm/model/kernels/matmul.py).
 *
 * x is float32 [T, in] (rows may be strided), W is [rows, in] stored as rows of blocks (quant/blocks.py's
 * BlockMatrix), y is float32 [T, rows]. The work is cut into tiles of RT output rows: a tile's
 * blocks are decoded, KC values at a time, into a small float buffer that stays in L1, and multiplied
 * there by every row of x, three rows of x by four rows of W per pass of the micro-kernel (TT rows of x
 * at a time for prefill), so each weight byte is read once per call (once per TT rows of x), whatever
 * T is (F32, F16 and BF16 have a tile of their own: "plain floats", below; F16 and BF16 reach it only as
 * unpacked blocks from a C caller: matmul.py packs them, and packed ones go to dot.c's float panels).
 * Here activations are never quantized: a decoded weight is exactly what dequantize.py's NumPy
 * dequantizer gives, bit for bit, and the products are summed in float32. Weights packed at load
 * (packed.h; PACKED_FLAG in the format id) go to dot.c's integer kernels instead (x quantized to 8 bits,
 * or 16, per dot_variant; by the team itself for prefill-sized x), for any number of rows of x, unless
 * dot_variant is 0; then these tiles decode their rows from the panels, and the caller sends only
 * decode-sized x here (up to 64 rows): prefill goes to BLAS on rows that quant_dequantize decodes (the
 * same decoders, on the same team), as it does for F16 and BF16.
 *
 * Fixed order: each output is summed in VL lanes, lane j taking the products at k = j mod VL in
 * increasing k, and the lanes are added in one fixed tree at the end. That order does not depend on
 * T, on which other rows of x or W share a tile, nor on the thread count, so a row of x gets the same
 * bits alone or in a batch (the engine's exactness invariant) and with 1 or N threads. Within one
 * build: the AVX2 clone below fuses each multiply-add (FMA), the baseline one does not.
 *
 * Threads: the output rows are handed out in chunks of PANEL-row panels to a team of `threads` threads
 * of team.c's persistent team, the caller's being one of them ("on the team", below). step.c runs a
 * whole decode step as one team and calls matmul_rows for its chunks.
 *
 * Plain C99 with GCC vector extensions (one vector type, lowered to SSE2, AVX2 or NEON by the compiler)
 * and POSIX threads; no Python headers. Built without -ffinite-math-only: NaN and inf in x or W come out
 * as NaN or inf. Sizes are checked by the caller (matmul.py); the entry point checks only that
 * the format is known and the row stride fits it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"
#include "matmul.h"
#include "packed.h"
#include "team.h"

/* As in ops.c: on x86-64 the entry points are also built for AVX2+FMA and picked at load time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ENTRY __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ENTRY
#endif
/* The products' multiply-adds are fused where the target has FMA (the AVX2 clone, aarch64): faster
 * and no less exact. Only there: the decoders keep dequantize.py's separate roundings (d * q, then + m). */
#define FUSED __attribute__((noinline, optimize("fp-contract=fast")))

/* Bumped with every change to the entry point's arguments or meaning (matmul_library.py checks it). */
int matmul_abi(void) { return 20; }   /* 9: step.c's decode_layers; 10: its KV formats; 11: Q2_K, Q3_K, IQ4_NL, IQ4_XS;
                                         12: step.c's windows, output norms, GeGLU, local rope;
                                         13: the step's NoPE layers and partial rotary order;
                                         14: its slots and block tables per group of layers;
                                         15: one team per step (team.c), qk_scratch per row, pinning;
                                         16: packed weights (PACKED_FLAG in the format id);
                                         17: F16 and BF16 packed too;
                                         18: the thread team's entry points named for it (team.c);
                                         19: step.c's prefill steps (attention tasks) and its out buffer;
                                         20: the team's barrier counts (matmul_team_stats) */

#define VL 8       /* lanes per accumulator */
#define RT 4       /* output rows per tile */
#define TT 64      /* rows of x per tile */
#define KC 1024    /* values of a row decoded at a time: RT * KC floats = 16 KiB, in L1 */
#define MAX_THREADS TEAM_MAX_THREADS
/* A product is handed out in chunks of whole panels (packed.h's PANEL rows: a multiple of RT and FR_MAX). */
#define CHUNKS_PER_THREAD 4   /* chunks per thread and product: the first static, the rest for whoever is free */

typedef float v8 __attribute__((vector_size(VL * sizeof(float))));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

#define LOAD8(v, p) memcpy(&(v), (p), sizeof(v8))   /* unaligned load */

/* ---------------------------------------------------------------- decoding */

/* Each decoder writes the values of one block in dequantize.py's float order (d * q, then + m or - dmin * m). */

INLINE void dec_q8_0(const uint8_t *b, float *out) {
    const float d = le_half(b);
    const int8_t *qs = (const int8_t *)(b + Q8_0_QS);
    for (int j = 0; j < QK; j++) out[j] = (float)qs[j] * d;
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
        nibbles8(b + Q4_0_QS + h, &lo, &hi);
        lo = (lo - 8.0f) * d, hi = (hi - 8.0f) * d;
        memcpy(out + h, &lo, sizeof lo);
        memcpy(out + 16 + h, &hi, sizeof hi);
    }
}

INLINE void dec_q4_1(const uint8_t *b, float *out) {
    const float d = le_half(b), m = le_half(b + Q4_1_M);
    for (int h = 0; h < 16; h += 8) {
        v8 lo, hi;
        nibbles8(b + Q4_1_QS + h, &lo, &hi);
        lo = lo * d + m, hi = hi * d + m;   /* two roundings, as dequantize.py: no FMA outside FUSED */
        memcpy(out + h, &lo, sizeof lo);
        memcpy(out + 16 + h, &hi, sizeof hi);
    }
}

/* Q5_0 (m == NULL: (q - 16) * d) and Q5_1 (q * d + m): value j < 16 the low nibble of qs[j], j >= 16 the
 * high nibble of qs[j - 16], with bit j of the little-endian uint32 qh as its fifth bit. */
INLINE void dec_q5(const uint8_t *b, const uint8_t *m, const uint8_t *qh, const uint8_t *qs, float *out) {
    const float d = le_half(b), mv = m ? le_half(m) : 0.0f;
    uint32_t h32;
    memcpy(&h32, qh, sizeof h32);
    const u32x8 hv = (u32x8){0} + h32, lane = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int h = 0; h < 16; h += 8) {
        const u32x8 v = bytes8(qs + h);
        const u32x8 q0 = (v & 15u) | (((hv >> (lane + (uint32_t)h)) & 1u) << 4);
        const u32x8 q1 = (v >> 4) | (((hv >> (lane + (uint32_t)(h + 16))) & 1u) << 4);
        v8 lo = TO_FLOAT(q0), hi = TO_FLOAT(q1);
        if (m) lo = lo * d + mv, hi = hi * d + mv;   /* two roundings, as dequantize.py */
        else lo = (lo - 16.0f) * d, hi = (hi - 16.0f) * d;
        memcpy(out + h, &lo, sizeof lo);
        memcpy(out + 16 + h, &hi, sizeof hi);
    }
}

/* Q4_K (qh == NULL) and Q5_K: 8 sub-blocks of 32; sub-block 2i is the low nibbles of qs[32i:32i+32],
 * 2i+1 the high ones; Q5_K's fifth bit of value l of sub-block s is bit s of qh[l]. */
INLINE void dec_k4(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *out) {
    const float d = le_half(b), dmin = le_half(b + K_DMIN);
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        scale_min_k4(b + K_SCALES, s, &sc, &mn);
        const float ds = d * (float)sc, dm = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (s / 2);
        const int shift = 4 * (s & 1);
        for (int l = 0; l < 32; l += 8) {
            u32x8 v = (bytes8(q + l) >> shift) & 15u;
            if (qh) v |= ((bytes8(qh + l) >> s) & 1u) << 4;
            const v8 f = TO_FLOAT(v) * ds - dm;   /* two roundings, as dequantize.py */
            memcpy(out + 32 * s + l, &f, sizeof f);
        }
    }
}

/* Q6_K: two halves of 128; in half h, value 32k + l is nibble k/2 of ql[64h + l + 32(k%2)] with bits
 * 2k, 2k+1 of qh[32h + l] above it, less 32; int8 scale i covers values 16i .. 16i+15. */
INLINE void dec_q6_k(const uint8_t *b, float *out) {
    const uint8_t *ql = b, *qh = b + Q6_K_QH;
    const int8_t *sc = (const int8_t *)(b + Q6_K_SCALES);
    const float d = le_half(b + Q6_K_D);
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

/* Q2_K and Q3_K: two halves of 128; in half h, value 32j + l takes bits 2j, 2j+1 of qs[32h + l]; each 16 values
 * have a scale (Q2_K: d * (sc & 15), less dmin * (sc >> 4); Q3_K: d * (6-bit scale - 32)). Q3_K's quant is less
 * 4 where its bit (bit 4h + j of hmask[l]) is clear. */
INLINE void dec_q2_k(const uint8_t *b, float *out) {
    const float d = le_half(b + Q2_K_D), dmin = le_half(b + Q2_K_DMIN);
    for (int i = 0; i < QK_K; i += 8) {
        const int h = i / 128, j = (i / 32) % 4, l = i % 32, g = i / 16;
        const float dl = d * (float)(b[g] & 15), ml = dmin * (float)(b[g] >> 4);
        const v8 f = TO_FLOAT((bytes8(b + Q2_K_QS + 32 * h + l) >> (2 * j)) & 3u) * dl - ml;   /* two roundings */
        memcpy(out + i, &f, sizeof f);
    }
}

INLINE void dec_q3_k(const uint8_t *b, float *out) {
    const float d = le_half(b + Q3_K_D);
    for (int i = 0; i < QK_K; i += 8) {
        const int h = i / 128, j = (i / 32) % 4, l = i % 32;
        const float dl = d * (float)scale_q3_k(b + Q3_K_SCALES, i / 16);
        const u32x8 q = (bytes8(b + Q3_K_QS + 32 * h + l) >> (2 * j)) & 3u;
        const u32x8 low = (((bytes8(b + l) >> (4 * h + j)) & 1u) ^ 1u) << 2;   /* 4 where the bit is clear */
        const v8 f = __builtin_convertvector((i32x8)q - (i32x8)low, v8) * dl;
        memcpy(out + i, &f, sizeof f);
    }
}

/* IQ4_NL (one block of 32) and each 32-value sub-block of IQ4_XS: the nibbles of 16 bytes as Q4_0's, each
 * the index of its value in iq4_values, times the scale. */
INLINE void dec_iq4(const uint8_t *qs, float d, float *out) {
    for (int j = 0; j < 16; j++) {
        out[j] = (float)iq4_values[qs[j] & 15] * d;
        out[j + 16] = (float)iq4_values[qs[j] >> 4] * d;
    }
}

INLINE void dec_iq4_xs(const uint8_t *b, float *out) {
    const float d = le_half(b);
    for (int s = 0; s < 8; s++) dec_iq4(b + IQ4_XS_QS + 16 * s, d * (float)scale_iq4_xs(b, s), out + 32 * s);
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

/* Values k0 .. k0+n of one row (k0 and n whole blocks, but for the last chunk of the plain floats). */
INLINE void decode_span(int fmt, const uint8_t *row, int64_t k0, int64_t n, float *out) {
    switch (fmt) {
    case F32: memcpy(out, row + 4 * k0, (size_t)n * 4); break;
    case F16: dec_f16(row + 2 * k0, n, out); break;
    case BF16: dec_bf16(row + 2 * k0, n, out); break;
    case Q8_0: for (int64_t j = 0; j < n; j += QK) dec_q8_0(row + (k0 + j) / QK * Q8_0_BYTES, out + j); break;
    case Q4_0: for (int64_t j = 0; j < n; j += QK) dec_q4_0(row + (k0 + j) / QK * Q4_0_BYTES, out + j); break;
    case Q4_1: for (int64_t j = 0; j < n; j += QK) dec_q4_1(row + (k0 + j) / QK * Q4_1_BYTES, out + j); break;
    case Q5_0:
        for (int64_t j = 0; j < n; j += QK) {
            const uint8_t *b = row + (k0 + j) / QK * Q5_0_BYTES;
            dec_q5(b, NULL, b + Q5_0_QH, b + Q5_0_QS, out + j);
        }
        break;
    case Q5_1:
        for (int64_t j = 0; j < n; j += QK) {
            const uint8_t *b = row + (k0 + j) / QK * Q5_1_BYTES;
            dec_q5(b, b + Q5_1_M, b + Q5_1_QH, b + Q5_1_QS, out + j);
        }
        break;
    case Q4_K:
        for (int64_t j = 0; j < n; j += QK_K) {
            const uint8_t *b = row + (k0 + j) / QK_K * Q4_K_BYTES;
            dec_k4(b, NULL, b + Q4_K_QS, out + j);
        }
        break;
    case Q5_K:
        for (int64_t j = 0; j < n; j += QK_K) {
            const uint8_t *b = row + (k0 + j) / QK_K * Q5_K_BYTES;
            dec_k4(b, b + Q5_K_QH, b + Q5_K_QS, out + j);
        }
        break;
    case Q6_K: for (int64_t j = 0; j < n; j += QK_K) dec_q6_k(row + (k0 + j) / QK_K * Q6_K_BYTES, out + j); break;
    case Q2_K: for (int64_t j = 0; j < n; j += QK_K) dec_q2_k(row + (k0 + j) / QK_K * Q2_K_BYTES, out + j); break;
    case Q3_K: for (int64_t j = 0; j < n; j += QK_K) dec_q3_k(row + (k0 + j) / QK_K * Q3_K_BYTES, out + j); break;
    case IQ4_XS: for (int64_t j = 0; j < n; j += QK_K) dec_iq4_xs(row + (k0 + j) / QK_K * IQ4_XS_BYTES, out + j); break;
    case IQ4_NL:
        for (int64_t j = 0; j < n; j += QK) {
            const uint8_t *b = row + (k0 + j) / QK * IQ4_NL_BYTES;
            dec_iq4(b + IQ4_NL_QS, le_half(b), out + j);
        }
        break;
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
    const void *qx;   /* x quantized by dot.c (w packed), or NULL: x stays float32 */
    int qv;           /* the variant for qx */
    int packed;       /* w is packed (packed.h) */
} job_t;

/* Values k0 .. k0+n of row `row` of W decoded (k0 and n as decode_span takes them): from the row's blocks,
 * or from a packed W by way of a copy of them, KC values at a time. */
INLINE void row_span(int fmt, const uint8_t *w, int64_t row_bytes, int64_t in, int packed, int64_t row, int64_t k0,
                     int64_t n, float *out) {
    if (!packed) {
        decode_span(fmt, w + row * row_bytes, k0, n, out);
        return;
    }
    const int be = block_elems(fmt);
    uint8_t blocks[KC / QK * Q8_0_BYTES];   /* KC values' blocks in the widest format per value */
    for (int64_t at = 0; at < n; at += KC) {
        const int64_t m = n - at < KC ? n - at : KC, b0 = (k0 + at) / be;
        unpack_row_blocks(fmt, w, in, row, b0, b0 + (m + be - 1) / be, blocks);
        decode_span(fmt, blocks, 0, m, out + at);
    }
}

/* Rows of x t0 .. t0+tn against output rows o0 .. o0+RT-1 (those past the end read as zeros). */
INLINE void tile(const job_t *j, int64_t t0, int64_t tn, int64_t o0, float *wbuf, v8 *acc) {
    const int64_t live = j->rows - o0 < RT ? j->rows - o0 : RT;
    memset(acc, 0, sizeof(v8) * RT * (size_t)(tn + 1));
    for (int64_t k0 = 0; k0 < j->in; k0 += KC) {
        const int64_t n = j->in - k0 < KC ? j->in - k0 : KC;
        for (int64_t r = 0; r < RT; r++) {
            if (r < live) row_span(j->fmt, j->w, j->row_bytes, j->in, j->packed, o0 + r, k0, n, wbuf + r * KC);
            else memset(wbuf + r * KC, 0, (size_t)n * sizeof(float));
        }
        const float *w = wbuf;
        const int64_t ws = KC;
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

/* ---------------------------------------------------------------- plain floats (F32, F16, BF16)
 *
 * Their own tile, built for a few rows of x (a decode step's 1 .. 64 tokens) as much as for many: a tile
 * is R output rows (FR_MAX at most); up to FKC values of them at a time (F32 read in place, F16/BF16
 * decoded into an L1 buffer) are multiplied by every row of x, M rows of x by the R rows of W per pass
 * of the micro-kernel, with R * M accumulators held in registers, so each weight byte comes from memory
 * once per call (once per FTT rows of x), nothing is packed, and the FMA units, not the loads, set the
 * pace for more than a few rows.
 *
 * Fixed order, as above but in FL lanes: lane j of an output takes the products at k = j mod FL in
 * increasing k (the last partial vector's into the low lanes), then the lanes are added in one fixed
 * tree. R and M change which outputs share a pass, never an output's order: a row of x gets the same
 * bits alone, in a batch and on any number of threads, within one variant. The variants (picked at
 * first use from what the CPU has, or by matmul_float_variant) differ in blocking and in fusing the
 * multiply-adds: the portable one is this code for the build's baseline target (SSE2 on x86-64: no
 * FMA), avx2 and avx512 are it for x86-64-v3 and -v4, neon for aarch64 (NEON is its baseline). FL is
 * the same for every variant of an architecture (16 on x86-64), so avx2 and avx512, both fused, give
 * the same bits. */

#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")   /* a + x * w fused where the target has FMA */

#if defined(__aarch64__)
#define FL 4       /* lanes: one NEON register */
#else
#define FL 16      /* one AVX-512 register; two AVX2 or four SSE2 ones */
#endif
#define FR_MAX 4   /* output rows per tile, at most */
#define FM_MAX 6   /* rows of x per pass of the micro-kernel, at most */
#define FKC 640    /* values of a row per chunk, at most: FR_MAX * FKC floats = 10 KiB */
#define FTT 64     /* rows of x per pass over a tile */

enum { FV_PORTABLE = 0, FV_AVX2 = 1, FV_AVX512 = 2, FV_NEON = 3, FV_COUNT = 4 };

/* An accumulator is FL floats in memory (acc[]); in registers it is FL / W vectors of the variant's
 * native width W (16 for AVX-512, 8 for AVX2, 4 for SSE2 and NEON), lane j of the accumulator being lane
 * j % W of vector j / W: the same lanes, so the same order, whatever the width. */
typedef float f32x16 __attribute__((vector_size(64)));   /* f32x4 and f32x8: blocks.h */

/* acc[(t * R + r) * FL ...] += lanes of x_t . w_r over n values, for M rows of x (stride xs) and R rows
 * of w (stride ws), in vectors of type VT: one pass over the values per vector of the accumulators
 * (lanes s*W .. s*W+W-1, reading the values at k = s*W mod FL), R * M accumulators in registers (R and
 * M are constants where this is inlined). The last partial vector goes through zero-padded copies:
 * 0 * 0 leaves the other lanes as they are. */
#define FSTEP(VT, XP, XS, WP, WS)                                                                          \
    do {                                                                                                   \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) memcpy(&c[r], (WP) + r * (WS), sizeof(VT));    \
        _Pragma("GCC unroll 8") for (int t = 0; t < M; t++) {                                              \
            memcpy(&p, (XP) + t * (XS), sizeof(VT));                                                       \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) a[t][r] += p * c[r];                       \
        }                                                                                                  \
    } while (0)

#define DEFINE_FMICRO(NAME, VT)                                                                            \
    INLINE void NAME(const float *x, int64_t xs, const float *w, int64_t ws, int64_t n, float *acc,        \
                     const int R, const int M, int pf) {                                                   \
        enum { W = sizeof(VT) / sizeof(float), S = FL / W };                                               \
        const int64_t full = n / FL * FL;                                                                  \
        float xt[FM_MAX][FL], wt[FR_MAX][FL];                                                              \
        if (full < n) {                                                                                    \
            memset(xt, 0, sizeof xt);                                                                      \
            memset(wt, 0, sizeof wt);                                                                      \
            for (int r = 0; r < R; r++) memcpy(wt[r], w + r * ws + full, (size_t)(n - full) * sizeof(float)); \
            for (int t = 0; t < M; t++) memcpy(xt[t], x + t * xs + full, (size_t)(n - full) * sizeof(float)); \
        }                                                                                                  \
        for (int s = 0; s < S; s++) {                                                                      \
            VT a[FM_MAX][FR_MAX], c[FR_MAX], p;                                                            \
            _Pragma("GCC unroll 8") for (int t = 0; t < M; t++)                                            \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                        \
                    memcpy(&a[t][r], acc + (t * R + r) * FL + s * W, sizeof(VT));                          \
            for (int64_t k = s * W; k < full; k += FL) {                                                   \
                if (pf && s == 0 && k % 16 == 0)   /* 2 tiles on, to L2 */                                 \
                    for (int r = 0; r < R; r++) __builtin_prefetch(w + (2 * R + r) * ws + k, 0, 1);        \
                FSTEP(VT, x + k, xs, w + k, ws);                                                           \
            }                                                                                              \
            if (full < n) FSTEP(VT, xt[0] + s * W, FL, wt[0] + s * W, FL);                                 \
            _Pragma("GCC unroll 8") for (int t = 0; t < M; t++)                                            \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                        \
                    memcpy(acc + (t * R + r) * FL + s * W, &a[t][r], sizeof(VT));                          \
        }                                                                                                  \
    }

DEFINE_FMICRO(fmicro4, f32x4)
#if FL >= 8
DEFINE_FMICRO(fmicro8, f32x8)
#endif
#if FL >= 16
DEFINE_FMICRO(fmicro16, f32x16)
#endif

/* The micro-kernel of native width W (a constant where inlined: the others are never called). */
INLINE void fmicro(const int W, const float *x, int64_t xs, const float *w, int64_t ws, int64_t n, float *acc,
                   const int R, const int M, int pf) {
#if FL >= 16
    if (W == 16) {
        fmicro16(x, xs, w, ws, n, acc, R, M, pf);
        return;
    }
#endif
#if FL >= 8
    if (W == 8) {
        fmicro8(x, xs, w, ws, n, acc, R, M, pf);
        return;
    }
#endif
    fmicro4(x, xs, w, ws, n, acc, R, M, pf);
}

/* The lanes of an accumulator added pairwise, halves first: one fixed tree. */
INLINE float acc_sum(const float *a) {
    float s[FL];
    memcpy(s, a, sizeof s);
    for (int h = FL / 2; h >= 1; h /= 2)
        for (int i = 0; i < h; i++) s[i] += s[i + h];
    return s[0];
}

/* Rows of x t0 .. t0+tn (tn <= FTT) against output rows o0 .. o0+R-1 (those past the end read as zeros). */
INLINE void ftile(const job_t *j, int64_t t0, int64_t tn, int64_t o0, float *wbuf, float *acc, const int W,
                  const int R, const int M) {
    const int64_t live = j->rows - o0 < R ? j->rows - o0 : R, xs = j->x_stride;
    /* chunks of whole vectors, as even as can be: no short last chunk paying a pass of its own */
    const int64_t chunks = j->in > FKC ? (j->in + FKC - 1) / FKC : 1, step = ((j->in + chunks - 1) / chunks + FL - 1) / FL * FL;
    memset(acc, 0, sizeof(float) * FL * (size_t)(R * tn));
    for (int64_t k0 = 0; k0 < j->in; k0 += step) {
        const int64_t n = j->in - k0 < step ? j->in - k0 : step;
        const float *w;
        int64_t ws;
        const int pf = j->fmt == F32 && live == R;   /* prefetched in place (the others are in wbuf) */
        if (pf) {   /* read in place: the tile's chunk stays in L1 for every x */
            w = (const float *)(j->w + o0 * j->row_bytes) + k0;
            ws = j->row_bytes / 4;
        } else {
            for (int64_t r = 0; r < R; r++) {
                if (r < live) decode_span(j->fmt, j->w + (o0 + r) * j->row_bytes, k0, n, wbuf + r * FKC);
                else memset(wbuf + r * FKC, 0, (size_t)n * sizeof(float));
            }
            w = wbuf;
            ws = FKC;
        }
        const float *x = j->x + t0 * xs + k0;
        int64_t t = 0;
        for (; t + M <= tn; t += M) fmicro(W, x + t * xs, xs, w, ws, n, acc + t * R * FL, R, M, pf);
        switch (tn - t) {   /* the rows left: one pass of fewer rows, its count a constant too */
        case 1: fmicro(W, x + t * xs, xs, w, ws, n, acc + t * R * FL, R, 1, pf); break;
        case 2: fmicro(W, x + t * xs, xs, w, ws, n, acc + t * R * FL, R, 2, pf); break;
        case 3: fmicro(W, x + t * xs, xs, w, ws, n, acc + t * R * FL, R, 3, pf); break;
        case 4: fmicro(W, x + t * xs, xs, w, ws, n, acc + t * R * FL, R, 4, pf); break;
        case 5: fmicro(W, x + t * xs, xs, w, ws, n, acc + t * R * FL, R, 5, pf); break;
        default: break;
        }
    }
    for (int64_t t = 0; t < tn; t++)
        for (int64_t r = 0; r < live; r++) j->y[(t0 + t) * j->y_stride + o0 + r] = acc_sum(acc + (t * R + r) * FL);
}

/* Output rows r0 .. r1 (r0 a multiple of FR_MAX), for every row of x, blocked R x M in vectors of W floats. */
INLINE void frows(const job_t *j, int64_t r0, int64_t r1, const int W, const int R, const int M) {
    float wbuf[FR_MAX * FKC] __attribute__((aligned(64)));
    float acc[FR_MAX * FTT * FL] __attribute__((aligned(64)));
    const int64_t end = r1 < j->rows ? r1 : j->rows;
    for (int64_t t0 = 0; t0 < j->T; t0 += FTT) {
        const int64_t tn = j->T - t0 < FTT ? j->T - t0 : FTT;
        for (int64_t o = r0; o < end; o += R) ftile(j, t0, tn, o, wbuf, acc, W, R, M);
    }
}

/* The register budgets: R * M accumulators, R vectors of w and one of x. */
static void frows_portable(const job_t *j, int64_t r0, int64_t r1) {
#if defined(__aarch64__)
    frows(j, r0, r1, 4, 2, 2);   /* 32 NEON registers, without the unrolling the neon variant has */
#else
    frows(j, r0, r1, 4, 2, 5);   /* 16 SSE2 registers: 10 accumulators, a product apart from its sum */
#endif
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* 16 AVX2 registers: 4 x 3 accumulators (measured: a little faster than 2 x 6) */
__attribute__((target("arch=x86-64-v3"))) static void frows_avx2(const job_t *j, int64_t r0, int64_t r1) {
    frows(j, r0, r1, 8, 4, 3);
}
/* 32 AVX-512 registers: 4 x 6 accumulators */
__attribute__((target("arch=x86-64-v4"))) static void frows_avx512(const job_t *j, int64_t r0, int64_t r1) {
    frows(j, r0, r1, 16, 4, 6);
}
#define FLOAT_X86 1
#endif
#if defined(__aarch64__)
/* 32 NEON registers: 4 x 5 accumulators (GCC 12 spills three of 4 x 6) */
static void frows_neon(const job_t *j, int64_t r0, int64_t r1) { frows(j, r0, r1, 4, 4, 5); }
#endif

#pragma GCC pop_options

/* Bit v set when this machine runs variant v. */
int matmul_float_variants(void) {
    int mask = 1 << FV_PORTABLE;
#if defined(FLOAT_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v3")) mask |= 1 << FV_AVX2;
    if (__builtin_cpu_supports("x86-64-v4")) mask |= 1 << FV_AVX512;
#endif
#if defined(__aarch64__)
    mask |= 1 << FV_NEON;
#endif
    return mask;
}

static int float_variant = -1;   /* -1 until the first call picks the best */

static int best_float_variant(void) {
    const int mask = matmul_float_variants();
    for (int v = FV_COUNT - 1; v > 0; v--)
        if (mask & (1 << v)) return v;
    return FV_PORTABLE;
}

static void float_rows(const job_t *j, int64_t r0, int64_t r1) {
    int v = __atomic_load_n(&float_variant, __ATOMIC_RELAXED);
    if (v < 0) {
        v = best_float_variant();
        __atomic_store_n(&float_variant, v, __ATOMIC_RELAXED);
    }
    switch (v) {
#if defined(FLOAT_X86)
    case FV_AVX2: frows_avx2(j, r0, r1); break;
    case FV_AVX512: frows_avx512(j, r0, r1); break;
#endif
#if defined(__aarch64__)
    case FV_NEON: frows_neon(j, r0, r1); break;
#endif
    default: frows_portable(j, r0, r1); break;
    }
}

/* Output rows r0 .. r1 of the product (r0 a multiple of PANEL; r1 one too, or past the end), for every row
 * of x: whoever computes them, each gets the same bits. */
ENTRY void job_rows(const job_t *j, int64_t r0, int64_t r1) {
    if (r1 > j->rows) r1 = j->rows;
    if (r0 >= r1) return;
    if (j->packed && pack_floats(j->fmt)) {   /* dot.c: packed F16 and BF16, x float */
        dot_float_panels(j->qv, j->fmt, j->w, j->in, r0 / PANEL, (r1 + PANEL - 1) / PANEL, j->x, j->x_stride, j->T,
                         j->y, j->y_stride, j->rows);
        return;
    }
    if (j->qx) {   /* dot.c: whole panels */
        dot_panels(j->qv, j->fmt, j->w, j->in, r0 / PANEL, (r1 + PANEL - 1) / PANEL, j->qx, j->T, j->y, j->y_stride,
                   j->rows);
        return;
    }
    if (j->fmt == F32 || j->fmt == F16 || j->fmt == BF16) {   /* their own tile, above */
        float_rows(j, r0, r1);
        return;
    }
    float wbuf[RT * KC] __attribute__((aligned(64)));
    v8 acc[RT * (TT + 1)];
    for (int64_t t0 = 0; t0 < j->T; t0 += TT) {
        const int64_t tn = j->T - t0 < TT ? j->T - t0 : TT;
        for (int64_t o = r0; o < r1; o += RT) tile(j, t0, tn, o, wbuf, acc);
    }
}

/* ---------------------------------------------------------------- on the team (team.c)
 *
 * A product is split by output panels of PANEL rows, handed out a chunk of panels at a time: each
 * thread's first chunk is its own, the rest go by an atomic counter to whoever is free (team_chunk),
 * so a thread slowed by another process does not hold the others up. No lock per product: a team runs
 * a whole decode step (step.c); a call from Python is a team run of one product. */

int64_t matmul_chunk_rows(int64_t rows, int threads) {
    const int64_t want = (int64_t)(threads < 1 ? 1 : threads) * CHUNKS_PER_THREAD;
    const int64_t panels = (rows + PANEL - 1) / PANEL, per = (panels + want - 1) / want;
    return (per < 1 ? 1 : per) * PANEL;
}

void matmul_rows(int fmt, const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t in, const float *x,
                 int64_t x_stride, int64_t T, float *y, int64_t y_stride, int qv, const void *qx, int64_t r0,
                 int64_t r1) {
    const job_t j = {fmt & ~PACKED_FLAG, w, row_bytes, rows, in, x, x_stride, T, y, y_stride, qx, qv,
                     (fmt & PACKED_FLAG) != 0};
    job_rows(&j, r0, r1);
}

/* A product on the team: its job, and where x is to be quantized by the team first (NULL where it was
 * before the run, or stays float). */
typedef struct {
    job_t j;
    void *qx_by_team;
} product_t;

/* Rows of x from which the team quantizes them (each thread its share, then a barrier): below, one
 * thread does it before the run (a decode-sized x, where a barrier costs more than it saves). */
#define TEAM_QUANTIZE_ROWS 8

static void product_team(void *arg, team_ctx_t *ctx) {
    const product_t *pr = arg;
    const job_t *j = &pr->j;
    if (pr->qx_by_team) {
        const int64_t t0 = j->T * ctx->index / ctx->count, t1 = j->T * (ctx->index + 1) / ctx->count;
        if (t1 > t0) dot_quantize_x(j->qv, j->x, j->x_stride, j->in, t0, t1 - t0, pr->qx_by_team);
        team_barrier(ctx);
    }
    const int64_t step = matmul_chunk_rows(j->rows, ctx->count), n = (j->rows + step - 1) / step;
    int64_t state = -1;
    for (int64_t c; (c = team_chunk(ctx, 0, n, &state)) >= 0;) job_rows(j, c * step, (c + 1) * step);
}

/* y [T, rows] (row stride y_stride) = x [T, in] (row stride x_stride) @ W.T, W of `rows` rows of
 * row_bytes bytes in format fmt (the GGUF type id, PACKED_FLAG added where packed). Packed weights quantize x
 * and use integer dot products (dot.c), unless dot_variant was set to 0. Returns 0, or -1 for an unknown
 * format, -2 for a row stride that does not fit `in` values of the format, -3 when out of memory for
 * the quantized x. threads < 1 counts as 1. */
int quant_matmul(int fmt, const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t in, const float *x,
                 int64_t x_stride, int64_t T, float *y, int64_t y_stride, int threads) {
    const int packed = (fmt & PACKED_FLAG) != 0;
    fmt &= ~PACKED_FLAG;
    const int be = block_elems(fmt);
    if (be == 0 || (packed && !pack_format(fmt))) return -1;
    if (in < 0 || in % be || row_bytes != in / be * block_bytes(fmt)) return -2;
    if (rows <= 0 || T <= 0) return 0;
    const int64_t panels = (rows + PANEL - 1) / PANEL;
    int parts = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if (parts > panels) parts = (int)panels;
    product_t pr = {{fmt, w, row_bytes, rows, in, x, x_stride, T, y, y_stride, NULL, 0, packed}, NULL};
    void *qx = NULL;
    if (packed) {   /* dot.c's kernels, unless the float path was chosen (F16 and BF16: x stays float) */
        if ((pr.j.qv = dot_variant(-1)) > 0 && in > 0 && !pack_floats(fmt)) {
            if (!(qx = malloc(dot_x_bytes(pr.j.qv, T, in)))) return -3;
            if (T >= TEAM_QUANTIZE_ROWS && parts > 1) pr.qx_by_team = qx;
            else dot_quantize_x(pr.j.qv, x, x_stride, in, 0, T, qx);
            pr.j.qx = qx;
        }
    }
    team_run(product_team, &pr, parts);
    free(qx);
    return 0;
}

typedef struct {
    int fmt, packed;
    const uint8_t *w;
    int64_t row_bytes, row0, rows, in;
    float *out;
} dequant_job_t;

/* Rows r0 .. r1 of the job. Built for AVX2 as well (ENTRY): the decoders' per-lane shifts are one
 * instruction there and lane by lane in the baseline's SSE2 (measured, one thread: F16 0.17 -> 5.6 G
 * values/s, Q4_K 0.55 -> 5.6). */
ENTRY static void dequant_part(const dequant_job_t *j, int64_t r0, int64_t r1) {
    if (!j->packed) {
        for (int64_t r = r0; r < r1; r++)
            decode_span(j->fmt, j->w + (j->row0 + r) * j->row_bytes, 0, j->in, j->out + r * j->in);
        return;
    }
    if (pack_floats(j->fmt)) {   /* F16, BF16: a strip is the panel's 8 values at one k, decoded at once */
        for (int64_t r = r0; r < r1;) {
            const int64_t row = j->row0 + r, first = row % PANEL;
            const int64_t n = PANEL - first < r1 - r ? PANEL - first : r1 - r;
            const uint8_t *strip = j->w + (row - first) * 2 * j->in;
            float *out = j->out + r * j->in;
            for (int64_t k = 0; k < j->in; k++, strip += 2 * PANEL) {
                float v[PANEL];
                if (j->fmt == F16) halves8(strip, v);
                else {
                    const u32x8 bits = words8(strip) << 16;
                    memcpy(v, &bits, sizeof bits);
                }
                for (int64_t i = 0; i < n; i++) out[i * j->in + k] = v[first + i];
            }
            r += n;
        }
        return;
    }
    /* a packed W a panel at a time: its strips read once for the 8 rows (row by row, each strip would come
     * from memory for every row), the rows' blocks put back in a scratch, then decoded */
    uint8_t *blocks = malloc((size_t)PANEL * (size_t)j->row_bytes);
    for (int64_t r = r0; r < r1;) {
        const int64_t row = j->row0 + r, end = (row / PANEL + 1) * PANEL - j->row0, n = (end < r1 ? end : r1) - r;
        if (blocks) unpack_rows(j->fmt, j->w, j->in, row, row + n, blocks);
        for (int64_t i = 0; i < n; i++) {
            float *out = j->out + (r + i) * j->in;
            if (blocks) decode_span(j->fmt, blocks + i * j->row_bytes, 0, j->in, out);
            else row_span(j->fmt, j->w, j->row_bytes, j->in, 1, row + i, 0, j->in, out);   /* no memory: the slow way */
        }
        r += n;
    }
    free(blocks);
}

static void dequant_team(void *arg, team_ctx_t *ctx) {
    const dequant_job_t *j = arg;
    dequant_part(j, j->rows * ctx->index / ctx->count, j->rows * (ctx->index + 1) / ctx->count);
}

/* Rows r0 .. r1 of W (as quant_matmul's) decoded to float32 into out [r1 - r0, in] (row stride in),
 * each value exactly what dequantize.py gives, on `threads` threads: for BLAS to multiply by
 * (matmul.py, for prefill-sized x). Returns 0, or quant_matmul's -1 / -2. */
int quant_dequantize(int fmt, const uint8_t *w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t in, float *out,
                     int threads) {
    const int packed = (fmt & PACKED_FLAG) != 0;
    fmt &= ~PACKED_FLAG;
    const int be = block_elems(fmt);
    if (be == 0 || (packed && !pack_format(fmt))) return -1;
    if (in < 0 || in % be || row_bytes != in / be * block_bytes(fmt)) return -2;
    if (r1 <= r0 || in == 0) return 0;
    /* a part is at least 16 rows: waking a thread for less costs more than it saves */
    const int64_t most = (r1 - r0 + 15) / 16;
    int parts = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if (parts > most) parts = (int)most;
    dequant_job_t j = {fmt, packed, w, row_bytes, r0, r1 - r0, in, out};
    team_run(dequant_team, &j, parts);
    return 0;
}

typedef struct {
    void (*fn)(void *, int);
    void *arg;
    int parts;
} parts_job_t;

static void parts_team(void *arg, team_ctx_t *ctx) {
    const parts_job_t *j = arg;
    for (int p = ctx->index; p < j->parts; p += ctx->count) j->fn(j->arg, p);   /* dealt round the team */
}

/* Runs fn(arg, p) for p = 0 .. parts - 1 on the team's threads and the caller's, one part per thread
 * (several on one if the team could not grow): for another library's kernels to share these threads
 * rather than start their own (ops.c's paged_decode_part, through ops.py). Returns 0. */
int matmul_team_run(void (*fn)(void *, int), void *arg, int parts) {
    if (parts < 1) return 0;
    parts_job_t j = {fn, arg, parts};
    team_run(parts_team, &j, parts > MAX_THREADS ? MAX_THREADS : parts);
    return 0;
}

/* Worker threads in the team now (for the wrapper's describe()). */
int matmul_team_threads(void) { return team_workers(); }

/* 1: pin the team's threads to the process's CPUs one each (model.pin_threads); 0: unpin. Returns 0, or -1
 * when the allowed CPUs could not be read. */
int matmul_pin_threads(int on) { return team_pin(on); }

/* The team's barrier counts since the last call (team_stats), counting on or off from now. */
void matmul_team_stats(int on, int64_t *out) { team_stats(on, out); }

/* Makes plain floats use variant v (a bit of matmul_float_variants) from the next call on and returns v,
 * or -1 if this machine cannot run it; a negative v changes nothing and returns the variant in use.
 * Not while a product runs: its chunks could then use different variants. */
int matmul_float_variant(int v) {
    if (v < 0) {
        const int cur = __atomic_load_n(&float_variant, __ATOMIC_RELAXED);
        return cur < 0 ? best_float_variant() : cur;
    }
    if (v >= FV_COUNT || !(matmul_float_variants() & (1 << v))) return -1;
    __atomic_store_n(&float_variant, v, __ATOMIC_RELAXED);
    return v;
}
