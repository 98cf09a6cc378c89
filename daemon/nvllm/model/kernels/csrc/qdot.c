/* Integer dot products for weights in Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and the K-quants (Q2_K .. Q6_K, IQ4_XS):
 * y = x @ W.T
 * with x quantized to 16 or 8 bits.
 *
 * Decoding every weight to float is what bounds matmul.c's tiles for the 4- and 8-bit formats (about
 * 4 GB/s of blocks per core). Here each row of x is first quantized, a block of 32 values at a time, to
 * int16 or int8 with one float scale (and the block's scaled sum, for Q4_1's and Q5_1's mins), and each block of x
 * meets a block of W as 32 products of integers summed exactly in int32; only then are the scales
 * applied, in float32. The weights' quants are used as stored (widened to int16 lanes for 16-bit x):
 * nothing is decoded to float.
 *
 * Why 16 bits by default: x in int8 (llama.cpp's way) moves each output by up to amax / 254 per block,
 * which through SmolLM2-135M's 30 layers changed 3% of its top-1 tokens (tools/quality.py); int16 moves
 * it 258 times less and changes none there, at a cost in speed (the K-quants' one-row products are
 * 1.2-1.3x faster with 8-bit x, on Zen 4). The 8-bit variants are model.activations = "int8".
 *
 * The arithmetic, which kernels/qdot.py repeats in NumPy bit for bit (Q = 32767 for 16 bits, 127 for 8):
 *   x block (32 values v):  amax = max |v|; d = amax / Q; id = d ? 1 / d : 0;
 *                           q = v * id rounded to nearest (ties to even), in -Q .. Q;
 *                           s = d * (float)sum(q). A block holding NaN or inf gets d = s = NaN, q = 0,
 *                           so the whole output row is NaN, as the float path would make it.
 *   one output, from acc = 0, over the blocks b of the row in order:
 *                           p = sum of the 32 products w_j * q_j (int32, exact: |p| <= 32*128*32767 < 2^27),
 *                           acc = acc + (dw * d) * (float)p        (two roundings, no FMA);
 *                           Q4_1 and Q5_1 also, after it: acc = acc + mw * s;
 *   y = acc.
 * w_j is the weight's quant: Q8_0's int8; Q4_0's nibble - 8; Q4_1's nibble (0..15), value j < 16 the
 * low nibble of qs[j], j >= 16 the high nibble of qs[j - 16]; Q5_1's nibble with bit j of qh above it
 * (0..31); Q5_0's that less 16; IQ4_NL's the table value its nibble (placed as Q4_0's) indexes (the K-quants and
 * IQ4_XS: below, at QDOT_KTILES and Q2_K's).
 * Every variant below computes exactly that (only the integer sums are found in different ways), so
 * the variant, the thread count and the other rows of x change no bit of a row's result.
 *
 * Variants, picked at run time from what the CPU has (never from the flags this file is built with):
 * 16-bit x (the default; names end in "-i16"): x86-64: AVX-512 VNNI (vpdpwssd on 512-bit vectors, one
 * block each), AVX2 (pmaddwd), portable C; aarch64: NEON (smull/smlal to int32), portable C.
 * 8-bit x: x86-64: AVX-512 VNNI (vpdpbusd on 256-bit vectors), AVX2 (pmaddubsw + pmaddwd), portable C;
 * aarch64: NEON with the ARMv8.2 dot product (sdot), plain NEON (smull + pairwise adds), portable C.
 * The portable C is the reference every variant is tested against, on every machine; where no SIMD
 * variant runs (an x86-64 without AVX2), the float path is the default, being faster there.
 * matmul.c calls qdot_quantize_x once per call, then qdot_rows from each of its threads, with the
 * variant qdot_variant gives (the best 16-bit one unless a test or a measurement picked another).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define QDOT_X86 1
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__GNUC__)
#define QDOT_ARM 1
#include <arm_neon.h>
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#endif

enum { V_SCALAR = 1, V_SIMD = 2, V_DOT = 3,              /* the variants (0: none, x stays float); x in 8 bits */
       V_SCALAR16 = 4, V_SIMD16 = 5, V_DOT16 = 6 };   /* x in 16 bits (no V_DOT16 on aarch64) */

/* One block of a quantized row of x: 40 bytes. */
typedef struct {
    float d, s;
    int8_t q[32];
} xblock_t;

/* The same block with 16-bit quants (the "-i16" variants): 72 bytes. */
typedef struct {
    float d, s;
    int16_t q[32];
} xblock16_t;

/* ---------------------------------------------------------------- quantizing x */

/* Round to nearest, ties to even, for |v| < 2^22: adding and taking away 1.5 * 2^23 leaves the integer. */
INLINE float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }

/* A block of x to int8 (q in -127 .. 127, d = amax / 127) or int16 (q in -32767 .. 32767, d = amax / 32767;
 * |sum| < 2^20: exact in float), as the header says. */
#define QUANTIZE_BLOCK(NAME, XB, lane_t, QMAX)                                                                         \
    static void NAME(const float *v, XB *out) {                                                                        \
        float amax = 0.0f;                                                                                             \
        int finite = 1;                                                                                                \
        for (int j = 0; j < 32; j++) {                                                                                 \
            const float a = v[j] < 0 ? -v[j] : v[j];                                                                   \
            finite &= a <= 3.4028234663852886e38f;   /* false for inf and NaN */                                       \
            amax = a > amax ? a : amax;                                                                                \
        }                                                                                                              \
        if (!finite) {                                                                                                 \
            out->d = out->s = __builtin_nanf("");                                                                      \
            memset(out->q, 0, sizeof out->q);                                                                          \
            return;                                                                                                    \
        }                                                                                                              \
        const float d = amax / QMAX;                                                                                   \
        const float id = d != 0.0f ? 1.0f / d : 0.0f;                                                                  \
        int sum = 0;                                                                                                   \
        for (int j = 0; j < 32; j++) {                                                                                 \
            const int q = (int)round_even(v[j] * id);                                                                  \
            out->q[j] = (lane_t)q;                                                                                     \
            sum += q;                                                                                                  \
        }                                                                                                              \
        out->d = d;                                                                                                    \
        out->s = d * (float)sum;                                                                                       \
    }
QUANTIZE_BLOCK(quantize_block, xblock_t, int8_t, 127.0f)
QUANTIZE_BLOCK(quantize_block16, xblock16_t, int16_t, 32767.0f)

/* The first `live` of four results to y (a whole vector when all four are). */
INLINE void qdot_store(float *y, const void *v, int live) {
    if (live == 4) memcpy(y, v, 16);
    else memcpy(y, v, (size_t)live * sizeof(float));
}

/* How far ahead the tiles prefetch the weights: the same blocks PREFETCH_TILES tiles (of four rows) on, into
 * L2 only. Measured on SmolLM2's matrices, one row of x, 2 threads (the layers' and lm_head's matmuls in
 * turn): the next tile into L1 streamed 12-16 GB/s; two tiles on into L2, 18-26 GB/s (Q8_0) and 16-21 GB/s
 * (Q4_1); into L1 or to three and four tiles on, less. */
#define PREFETCH_TILES 2

/* The four rows of W a tile from row r reads into wr (those past r1 read as row r1 - 1, never stored);
 * returns how many are real. */
INLINE int tile_rows(const uint8_t *w, int64_t row_bytes, int64_t r, int64_t r1, const uint8_t **wr) {
    const int live = r1 - r < 4 ? (int)(r1 - r) : 4;
    for (int i = 0; i < 4; i++) wr[i] = w + (i < live ? r + i : r1 - 1) * row_bytes;
    return live;
}

/* ---------------------------------------------------------------- Q5_0 and Q5_1's quants
 *
 * A Q5_0 / Q5_1 block's 32 quants as bytes, in block order (value j < 16 the low nibble of qs[j], j >= 16
 * the high nibble of qs[j - 16], bit j of the little-endian uint32 qh its fifth bit): Q5_1's q in 0..31,
 * Q5_0's q - 16 in -16..15 as int8. Built eight at a time in a 64-bit word, then loaded by the variant's
 * V_load as Q8_0's int8 quants are. FIFTH[b] has 0x10 in byte k where bit k of b is set. */
#define FIFTH_BIT(b, k) ((uint64_t)(((b) >> (k)) & 1) << (8 * (k) + 4))
#define FIFTH(b)                                                                                                       \
    (FIFTH_BIT(b, 0) | FIFTH_BIT(b, 1) | FIFTH_BIT(b, 2) | FIFTH_BIT(b, 3) | FIFTH_BIT(b, 4) | FIFTH_BIT(b, 5) |       \
     FIFTH_BIT(b, 6) | FIFTH_BIT(b, 7))
#define FIFTH4(b) FIFTH(b), FIFTH((b) + 1), FIFTH((b) + 2), FIFTH((b) + 3)
#define FIFTH16(b) FIFTH4(b), FIFTH4((b) + 4), FIFTH4((b) + 8), FIFTH4((b) + 12)
#define FIFTH64(b) FIFTH16(b), FIFTH16((b) + 16), FIFTH16((b) + 32), FIFTH16((b) + 48)
static const uint64_t fifth_bits[256] = {FIFTH64(0), FIFTH64(64), FIFTH64(128), FIFTH64(192)};

INLINE void q5_bytes(const uint8_t *qh, const uint8_t *qs, int centred, int8_t *out) {
    const uint64_t low = 0x0f0f0f0f0f0f0f0fULL, fives = 0x1010101010101010ULL;
    uint64_t q[2], v[4];
    memcpy(q, qs, sizeof q);
    v[0] = q[0] & low, v[1] = q[1] & low, v[2] = (q[0] >> 4) & low, v[3] = (q[1] >> 4) & low;
    for (int i = 0; i < 4; i++) {
        const uint64_t f = fifth_bits[qh[i]];
        /* q - 16: the nibble where the fifth bit is set, else the nibble | 0xf0 (its int8 less 16) */
        v[i] |= centred ? (f ^ fives) * 15u : f;
    }
    memcpy(out, v, sizeof v);
}

/* V_q5(qh, qs, centred) from those bytes and V_load, for the variants without a SIMD form of it. */
#define Q5_FROM_BYTES(V, ATTR)                                                                                         \
    ATTR INLINE V##_bv V##_q5(const uint8_t *qh, const uint8_t *qs, int centred) {                                     \
        int8_t q[32];                                                                                                  \
        q5_bytes(qh, qs, centred, q);                                                                                  \
        return V##_load(q);                                                                                            \
    }

/* The formats with a min term (mw * sx after the scaled sum); Q5_1's m is where Q4_1's is. */
#define HAS_MIN(fmt) ((fmt) == Q4_1 || (fmt) == Q5_1)

/* ---------------------------------------------------------------- the kernel, once per variant
 *
 * QDOT_KERNEL(V, ATTR, XB) defines V_rows(fmt, ...) for x in blocks XB (xblock_t or xblock16_t) from the
 * variant's primitives, all always inlined:
 *   V_bv                 a block's 32 quants in the variant's registers (int8, or int16 lanes)
 *   V_load(p)            32 int8 from p
 *   V_loadx(p)           the 32 quants of a block of x
 *   V_nibbles(p)         the 32 nibbles of the 16 bytes at p, in block order (low nibbles, then high)
 *   V_sub8(b)            b - 8 in every lane
 *   V_sums_ss(w, x)      i32x4: the four dot products w[i] . x, all signed (|w| <= 128, |x| <= 127 or 32767)
 *   V_sums_us(w, x)      the same with every w in 0..15
 *   V_sums8_ss(w, x0, x1), V_sums8_us   i32x8: the sums with x0, then those with x1
 *   V_halves(p0..p3)     f32x4: the four little-endian halves at p0 .. p3
 * A tile is 4 rows of W by 1 to 8 rows of x, its outputs in vectors (lane 4 (t % 2) + r of vector t / 2),
 * the blocks of a row taken in order. Rows of W past r1 are read as row r1 - 1 and not stored.
 */
#define QDOT_KERNEL(V, ATTR, XB)                                                                                       \
    ATTR INLINE void V##_wblocks(const int fmt, const uint8_t *const *blk, V##_bv *wv) {                               \
        for (int i = 0; i < 4; i++) {                                                                                  \
            if (fmt == Q8_0) wv[i] = V##_load((const int8_t *)(blk[i] + Q8_0_QS));                                     \
            else if (fmt == Q4_0) wv[i] = V##_sub8(V##_nibbles(blk[i] + Q4_0_QS));                                     \
            else if (fmt == Q4_1) wv[i] = V##_nibbles(blk[i] + Q4_1_QS);                                               \
            else if (fmt == Q5_0) wv[i] = V##_q5(blk[i] + Q5_0_QH, blk[i] + Q5_0_QS, 1);                               \
            else if (fmt == IQ4_NL) wv[i] = V##_iq4(blk[i] + IQ4_NL_QS);                                               \
            else wv[i] = V##_q5(blk[i] + Q5_1_QH, blk[i] + Q5_1_QS, 0);                                                \
        }                                                                                                              \
    }                                                                                                                  \
    /* 4 rows of W by 1 row of x */                                                                                    \
    ATTR INLINE f32x4 V##_tile1(const int fmt, const uint8_t *const *wr, int64_t ahead, int64_t nb,                    \
                                const XB *x) {                                                                         \
        f32x4 acc = {0};                                                                                               \
        const int bb = block_bytes(fmt);                                                                               \
        for (int64_t b = 0; b < nb; b++) {                                                                             \
            const uint8_t *blk[4] = {wr[0] + b * bb, wr[1] + b * bb, wr[2] + b * bb, wr[3] + b * bb};                  \
            for (int i = 0; i < 4; i++) __builtin_prefetch(blk[i] + ahead, 0, 1);   /* to L2: see PREFETCH_TILES */    \
            V##_bv wv[4];                                                                                              \
            V##_wblocks(fmt, blk, wv);                                                                                 \
            const V##_bv xv = V##_loadx(x[b].q);                                                                       \
            const i32x4 s = HAS_MIN(fmt) ? V##_sums_us(wv, xv) : V##_sums_ss(wv, xv);                                  \
            const f32x4 dd = V##_halves(blk[0], blk[1], blk[2], blk[3]) * x[b].d;                                      \
            acc = acc + dd * __builtin_convertvector(s, f32x4);                                                        \
            if (HAS_MIN(fmt))                                                                                          \
                acc = acc + V##_halves(blk[0] + Q4_1_M, blk[1] + Q4_1_M, blk[2] + Q4_1_M, blk[3] + Q4_1_M) * x[b].s;   \
        }                                                                                                              \
        return acc;                                                                                                    \
    }                                                                                                                  \
    /* 4 rows of W by NT = 2 .. 8 rows of x (x + t * xs): output (t, r) in lane 4 (t % 2) + r of out[t / 2]; an odd   \
     * NT's last row is paired with itself (its twin's lanes are not stored): one unpacking of W for all NT */    \
    ATTR INLINE void V##_tile24(const int fmt, const int NT, const uint8_t *const *wr, int64_t ahead, int64_t nb,      \
                                const XB *x, int64_t xs, f32x8 *out) {                                                 \
        f32x8 acc[4] = {{0}, {0}, {0}, {0}};                                                                           \
        const int bb = block_bytes(fmt);                                                                               \
        for (int64_t b = 0; b < nb; b++) {                                                                             \
            const uint8_t *blk[4] = {wr[0] + b * bb, wr[1] + b * bb, wr[2] + b * bb, wr[3] + b * bb};                  \
            for (int i = 0; i < 4; i++) __builtin_prefetch(blk[i] + ahead, 0, 1);   /* to L2: see PREFETCH_TILES */    \
            V##_bv wv[4];                                                                                              \
            V##_wblocks(fmt, blk, wv);                                                                                 \
            const f32x4 dw = V##_halves(blk[0], blk[1], blk[2], blk[3]);                                               \
            const f32x8 dw8 = {dw[0], dw[1], dw[2], dw[3], dw[0], dw[1], dw[2], dw[3]};                                \
            f32x8 mw8 = {0};                                                                                           \
            if (HAS_MIN(fmt)) {                                                                                        \
                const f32x4 mw = V##_halves(blk[0] + Q4_1_M, blk[1] + Q4_1_M, blk[2] + Q4_1_M, blk[3] + Q4_1_M);       \
                mw8 = (f32x8){mw[0], mw[1], mw[2], mw[3], mw[0], mw[1], mw[2], mw[3]};                                 \
            }                                                                                                          \
            for (int h = 0; h < (NT + 1) / 2; h++) {                                                                   \
                const XB *x0 = x + 2 * h * xs + b, *x1 = 2 * h + 1 < NT ? x0 + xs : x0;                                \
                const V##_bv xv0 = V##_loadx(x0->q), xv1 = V##_loadx(x1->q);                                           \
                const i32x8 s = HAS_MIN(fmt) ? V##_sums8_us(wv, xv0, xv1) : V##_sums8_ss(wv, xv0, xv1);                \
                const f32x8 dx8 = {x0->d, x0->d, x0->d, x0->d, x1->d, x1->d, x1->d, x1->d};                            \
                acc[h] = acc[h] + (dw8 * dx8) * __builtin_convertvector(s, f32x8);                                     \
                if (HAS_MIN(fmt)) {                                                                                    \
                    const f32x8 sx8 = {x0->s, x0->s, x0->s, x0->s, x1->s, x1->s, x1->s, x1->s};                        \
                    acc[h] = acc[h] + mw8 * sx8;                                                                       \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        for (int h = 0; h < (NT + 1) / 2; h++) out[h] = acc[h];                                                        \
    }                                                                                                                  \
    ATTR INLINE void V##_fmt_rows(const int fmt, const uint8_t *w, int64_t row_bytes, int64_t nb, int64_t r0,          \
                                  int64_t r1, const XB *x, int64_t t0, int64_t tn, float *y, int64_t ys) {             \
        const int64_t ahead = PREFETCH_TILES * 4 * row_bytes;                                                          \
        for (int64_t r = r0; r < r1; r += 4) {                                                                         \
            const uint8_t *wr[4];                                                                                      \
            const int live = tile_rows(w, row_bytes, r, r1, wr);                                                       \
            f32x8 v[4];                                                                                                \
            for (int64_t t = t0; t < t0 + tn; t += 8) {                                                                \
                /* each count its own constant (the tile unrolls): W unpacked once for all of them */                \
                const int n = t0 + tn - t < 8 ? (int)(t0 + tn - t) : 8;                                                \
                const XB *xt = x + t * nb;                                                                             \
                switch (n) {                                                                                           \
                case 1: {                                                                                              \
                    const f32x4 one = V##_tile1(fmt, wr, ahead, nb, xt);                                               \
                    qdot_store(y + t * ys + r, &one, live);                                                            \
                    continue;                                                                                          \
                }                                                                                                      \
                case 2: V##_tile24(fmt, 2, wr, ahead, nb, xt, nb, v); break;                                           \
                case 3: V##_tile24(fmt, 3, wr, ahead, nb, xt, nb, v); break;                                           \
                case 4: V##_tile24(fmt, 4, wr, ahead, nb, xt, nb, v); break;                                           \
                case 5: V##_tile24(fmt, 5, wr, ahead, nb, xt, nb, v); break;                                           \
                case 6: V##_tile24(fmt, 6, wr, ahead, nb, xt, nb, v); break;                                           \
                case 7: V##_tile24(fmt, 7, wr, ahead, nb, xt, nb, v); break;                                           \
                default: V##_tile24(fmt, 8, wr, ahead, nb, xt, nb, v); break;                                          \
                }                                                                                                      \
                for (int i = 0; i < n; i++)                                                                            \
                    qdot_store(y + (t + i) * ys + r, (const float *)&v[i / 2] + 4 * (i % 2), live);                    \
            }                                                                                                          \
        }                                                                                                              \
    }                                                                                                                  \
    ATTR __attribute__((noinline)) static void V##_rows(int fmt, const uint8_t *w, int64_t row_bytes, int64_t nb,      \
                                                        int64_t r0, int64_t r1, const XB *x, int64_t t0,               \
                                                        int64_t tn, float *y, int64_t ys) {                            \
        switch (fmt) {                                                                                                 \
        case Q8_0: V##_fmt_rows(Q8_0, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                              \
        case Q4_0: V##_fmt_rows(Q4_0, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                              \
        case Q4_1: V##_fmt_rows(Q4_1, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                              \
        case Q5_0: V##_fmt_rows(Q5_0, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                              \
        case Q5_1: V##_fmt_rows(Q5_1, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                              \
        case IQ4_NL: V##_fmt_rows(IQ4_NL, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                          \
        default: break;                                                                                                \
        }                                                                                                              \
    }

/* ---------------------------------------------------------------- portable C */

/* ---------------------------------------------------------------- Q4_K, Q5_K and Q6_K
 *
 * A super-block of 256 values is 8 sub-blocks of 32, each an x block's width: value j of sub-block s is
 * d * sc_s * q_j - dmin * m_s (q in 0..15, or 0..31 for Q5_K), so a sub-block meets its x block as a Q4_1
 * block would, with dw = d * sc_s and mw = -(dmin * m_s) (both exact in float32: an 11-bit mantissa by a
 * 6-bit integer). The arithmetic is then Q4_1's: acc = acc + (dw * dx) * (float)p; acc = acc + mw * sx.
 * Q6_K's sub-block of 32 has two scales, one per 16 values: value j is d * sc_g * (q_j - 32) with g = 2s
 * for j < 16 and 2s + 1 above; the halves' sums p_lo and p_hi (exact in int32: |p| <= 16 * 32 * 32767)
 * are scaled apart: acc = acc + (dw_lo * dx) * (float)p_lo; acc = acc + (dw_hi * dx) * (float)p_hi, with
 * dw_g = d * sc_g (exact: 11 bits by 8).
 * QDOT_KTILES(V, ATTR, XB) defines V_krows from the variant's V_sums_us, V_loadx and
 *   V_kquants(qs, qh, shift, bit, hbits)   the 32 values ((qs[j] >> shift) & 15) | (((qh[j] >> bit) & m) << 4),
 *                                   m = 2^hbits - 1 (no high bits where qh is NULL), in the variant's
 *                                   registers (in the order K_EVEN_ODD gives x's blocks), less 32 when hbits
 *                                   is 2 (Q6_K's quants are signed);
 *   V_sums_halves(w, x, lo, hi)     the four rows' sums over values 0..15 and over 16..31, apart.
 */

/* The scales of four rows' super-blocks are unpacked for the four rows at once, in the portable vector types
 * (each variant's compiler turns them into its own shuffles and conversions): transposed to lane i for row
 * i and converted in eights, rather than gathered a byte at a time (which, with the portable half_to_float
 * before V_halves replaced it, had taken 40% of a one-row Q6_K product on Zen 4). */
typedef uint8_t u8x32 __attribute__((vector_size(32)));
typedef uint64_t u64x4 __attribute__((vector_size(32)));

/* From four rows' 8 bytes (row i's in bytes 8i .. 8i + 7 of r), bytes k = 2h and 2h + 1 of every row as
 * int32 lanes, row i in lane i, then lane 4 + i (ZX: zero-extended; SX: the byte at the top of its lane,
 * for an arithmetic shift to sign-extend it). One shuffle each: gcc's own widening of byte vectors to
 * float goes a byte at a time. SRC(h, j) is the byte of r that lane j takes; 32 is a zero of z. */
#define SRC(h, j) (8 * ((j) % 4) + 2 * (h) + (j) / 4)
#define ZX(r, z, h)                                                                                                    \
    __builtin_shufflevector((r), (z), SRC(h, 0), 32, 32, 32, SRC(h, 1), 32, 32, 32, SRC(h, 2), 32, 32, 32,            \
                            SRC(h, 3), 32, 32, 32, SRC(h, 4), 32, 32, 32, SRC(h, 5), 32, 32, 32, SRC(h, 6), 32, 32,   \
                            32, SRC(h, 7), 32, 32, 32)
#define SX(r, z, h)                                                                                                    \
    __builtin_shufflevector((r), (z), 32, 32, 32, SRC(h, 0), 32, 32, 32, SRC(h, 1), 32, 32, 32, SRC(h, 2), 32, 32,    \
                            32, SRC(h, 3), 32, 32, 32, SRC(h, 4), 32, 32, 32, SRC(h, 5), 32, 32, 32, SRC(h, 6), 32,   \
                            32, 32, SRC(h, 7))

/* out[2h], out[2h + 1] = d * bytes 2h, 2h + 1 (lane i row i) of the four rows' 8 bytes in r */
INLINE void scale_pairs(u8x32 r, int sign, f32x4 d, f32x4 *out) {
    const u8x32 z = {0};
    const f32x8 d8 = __builtin_shufflevector(d, d, 0, 1, 2, 3, 0, 1, 2, 3);
    i32x8 v[4];
    if (sign)
        v[0] = (i32x8)SX(r, z, 0) >> 24, v[1] = (i32x8)SX(r, z, 1) >> 24, v[2] = (i32x8)SX(r, z, 2) >> 24,
        v[3] = (i32x8)SX(r, z, 3) >> 24;
    else
        v[0] = (i32x8)ZX(r, z, 0), v[1] = (i32x8)ZX(r, z, 1), v[2] = (i32x8)ZX(r, z, 2), v[3] = (i32x8)ZX(r, z, 3);
    for (int h = 0; h < 4; h++) {
        const f32x8 f = d8 * __builtin_convertvector(v[h], f32x8);
        out[2 * h] = __builtin_shufflevector(f, f, 0, 1, 2, 3);
        out[2 * h + 1] = __builtin_shufflevector(f, f, 4, 5, 6, 7);
    }
}

/* Q6_K's 16 scales of the super-blocks at sb[0..3]: dw[g] = d * sc_g, lane i for row i, with d the four
 * rows' d as the variant's V_halves converts them. */
INLINE void k6scales(const uint8_t *const *sb, f32x4 d, f32x4 *dw) {
    for (int half = 0; half < 2; half++) {   /* scales 0..7, then 8..15 */
        u64x4 r;
        for (int i = 0; i < 4; i++) memcpy((uint64_t *)&r + i, sb[i] + Q6_K_SCALES + 8 * half, 8);
        scale_pairs((u8x32)r, 1, d, dw + 8 * half);
    }
}

/* dw[s] = d * sc_s and mw[s] = -(dmin * m_s) of the super-blocks at sb[0..3] (four rows), lane i for row i; d
 * and dmin as k6scales'. The 8 six-bit scales and 8 mins of each row's 12 scale bytes are what
 * scale_min_k4 gives for each j, unpacked in 64-bit lanes, a row a lane. */
INLINE void kscales(const uint8_t *const *sb, f32x4 d, f32x4 dmin, f32x4 *dw, f32x4 *mw) {
    u64x4 a, b = {0};
    for (int i = 0; i < 4; i++) {
        memcpy((uint64_t *)&a + i, sb[i] + K_SCALES, 8);
        memcpy((uint64_t *)&b + i, sb[i] + K_SCALES + 8, 4);
    }
    const uint64_t six = 0x3f3f3f3fu, four = 0x0f0f0f0fu, two = 0x03030303u;
    const u64x4 sc = (a & six) | (((b & four) | ((a >> 6) & two) << 4) << 32);
    const u64x4 mn = ((a >> 32) & six) | ((((b >> 4) & four) | ((a >> 38) & two) << 4) << 32);
    f32x4 m[8];
    scale_pairs((u8x32)sc, 0, d, dw);
    scale_pairs((u8x32)mn, 0, dmin, m);
    for (int s = 0; s < 8; s++) mw[s] = -m[s];
}

/* ---------------------------------------------------------------- Q2_K, Q3_K, IQ4_XS (and IQ4_NL)
 *
 * Q2_K and Q3_K have Q6_K's shape: 16 scales, one per 16 values, so a sub-block of 32 meets its x block as two
 * halves summed apart. Q3_K: dw_g = d * (sc_g - 32) (exact: 11 bits by 6), quants in -4..3, no min. Q2_K:
 * dw_g = d * (sc_g & 15), quants in 0..3, and a min per 16 values, mw_g = -(dmin * (sc_g >> 4)), which meets
 * the sum of the half's quants of x, sx_g (an integer: exact):
 *   acc = acc + (dw_lo * dx) * (float)p_lo; acc = acc + (dw_hi * dx) * (float)p_hi;
 *   Q2_K then: acc = acc + (mw_lo * dx) * (float)sx_lo; acc = acc + (mw_hi * dx) * (float)sx_hi.
 * IQ4_XS is Q4_0's shape in sub-blocks of 32 (dw_s = d * (sc_s - 32), exact; no min), IQ4_NL Q8_0's (dw = d);
 * their quants are the table values the nibbles index (iq4_values: -127..113), found with the variant's
 * V_iq4(qs): the 32 values of 16 bytes of nibbles (low nibbles, then high) in its registers. Q2_K's and Q3_K's
 * come from V_k23(qs, hm, shift, bit): the 32 values (qs[l] >> shift) & 3, with Q3_K's (hm not NULL) third bit
 * ((hm[l] >> bit) & 1) << 2 and less 4, in the variant's registers in the order K_EVEN_ODD gives x (where the
 * variant's V_EO is 1).
 */
/* Where a Q2_K, Q3_K or IQ4_XS super-block's d is. */
#define LOW_K_D(fmt) ((fmt) == Q2_K ? Q2_K_D : (fmt) == Q3_K ? Q3_K_D : 0)

/* dw[g] (and for Q2_K mw[g]) of four rows' Q2_K or Q3_K super-blocks (16 scales), or dw[s] of IQ4_XS's (8),
 * lane i for row i; d and dmin as the variant's V_halves gives them. */
INLINE void low_k_scales(int fmt, const uint8_t *const *sb, f32x4 d, f32x4 dmin, f32x4 *dw, f32x4 *mw) {
    const int n = fmt == IQ4_XS ? 8 : 16;
    for (int g = 0; g < n; g++)
        for (int i = 0; i < 4; i++) {
            if (fmt == Q2_K) {
                dw[g][i] = d[i] * (float)(sb[i][g] & 15);
                mw[g][i] = -(dmin[i] * (float)(sb[i][g] >> 4));
            } else if (fmt == Q3_K) {
                dw[g][i] = d[i] * (float)scale_q3_k(sb[i] + Q3_K_SCALES, g);
            } else {
                dw[g][i] = d[i] * (float)scale_iq4_xs(sb[i], g);
            }
        }
}

#define KT 8   /* rows of x per K-quant tile at most (8 f32x4 accumulators) */
#define QDOT_KTILES(V, ATTR, XB)                                                                                       \
    ATTR INLINE void V##_kwblocks(const int fmt, const uint8_t *const *sb, int s, V##_bv *wv) {                        \
        for (int i = 0; i < 4; i++) {                                                                                  \
            if (fmt == Q6_K)   /* half s / 4, sub-block s % 4 of it */                                                 \
                wv[i] = V##_kquants(sb[i] + 64 * (s / 4) + 32 * (s & 1), sb[i] + Q6_K_QH + 32 * (s / 4),               \
                                    4 * ((s / 2) & 1), 2 * (s & 3), 2);                                                \
            else if (fmt == Q2_K || fmt == Q3_K)   /* bits 2j, 2j + 1 of qs[32 (s / 4) + l], j = s % 4 */           \
                wv[i] = V##_k23(sb[i] + (fmt == Q2_K ? Q2_K_QS : Q3_K_QS) + 32 * (s / 4), fmt == Q3_K ? sb[i] : NULL,   \
                                2 * (s % 4), s);                                                                       \
            else if (fmt == IQ4_XS)                                                                                    \
                wv[i] = V##_iq4(sb[i] + IQ4_XS_QS + 16 * s);                                                           \
            else                                                                                                       \
                wv[i] = V##_kquants(sb[i] + (fmt == Q4_K ? Q4_K_QS : Q5_K_QS) + 32 * (s / 2),                          \
                                    fmt == Q5_K ? sb[i] + Q5_K_QH : NULL, 4 * (s & 1), s, 1);                          \
        }                                                                                                              \
    }                                                                                                                  \
    /* 4 rows of W by NT = 1 .. KT rows of x (x + t * xs): output (t, r) in lane r of out[t] */                        \
    ATTR INLINE void V##_ktile(const int fmt, const int NT, const uint8_t *const *wr, int64_t ahead, int64_t nsb,      \
                               const XB *x, int64_t xs, f32x4 *out) {                                                  \
        f32x4 acc[KT] = {{0}};                                                                                         \
        const int bb = block_bytes(fmt);                                                                               \
        for (int64_t b = 0; b < nsb; b++) {                                                                            \
            const uint8_t *sb[4] = {wr[0] + b * bb, wr[1] + b * bb, wr[2] + b * bb, wr[3] + b * bb};                   \
            for (int i = 0; i < 4; i++)   /* every line of the super-block, to L2: see PREFETCH_TILES */               \
                for (int o = 0; o < bb; o += 64) __builtin_prefetch(sb[i] + ahead + o, 0, 1);                          \
            f32x4 dw[16], mw[16];                                                                                      \
            if (fmt == Q6_K)                                                                                           \
                k6scales(sb, V##_halves(sb[0] + Q6_K_D, sb[1] + Q6_K_D, sb[2] + Q6_K_D, sb[3] + Q6_K_D), dw);          \
            else if (fmt == Q2_K || fmt == Q3_K || fmt == IQ4_XS) {                                                    \
                const int o = LOW_K_D(fmt), m = fmt == Q2_K ? Q2_K_DMIN : o;                                           \
                low_k_scales(fmt, sb, V##_halves(sb[0] + o, sb[1] + o, sb[2] + o, sb[3] + o),                          \
                             V##_halves(sb[0] + m, sb[1] + m, sb[2] + m, sb[3] + m), dw, mw);                          \
            } else kscales(sb, V##_halves(sb[0], sb[1], sb[2], sb[3]),                                                   \
                         V##_halves(sb[0] + K_DMIN, sb[1] + K_DMIN, sb[2] + K_DMIN, sb[3] + K_DMIN), dw, mw);        \
            for (int s = 0; s < 8; s++) {                                                                              \
                V##_bv wv[4];                                                                                          \
                V##_kwblocks(fmt, sb, s, wv);                                                                          \
                for (int t = 0; t < NT; t++) {                                                                         \
                    const XB *xb = x + t * xs + 8 * b + s;                                                             \
                    if (fmt == Q6_K || fmt == Q3_K || fmt == Q2_K) {                                                   \
                        i32x4 lo, hi;                                                                                  \
                        V##_sums_halves(wv, V##_loadx(xb->q), &lo, &hi);                                               \
                        acc[t] = acc[t] + (dw[2 * s] * xb->d) * __builtin_convertvector(lo, f32x4);                    \
                        acc[t] = acc[t] + (dw[2 * s + 1] * xb->d) * __builtin_convertvector(hi, f32x4);                \
                        if (fmt == Q2_K) {   /* the halves' sums of x, wherever K_EVEN_ODD put their values */         \
                            int sl = 0, sh = 0;                                                                        \
                            for (int j = 0; j < 16; j++) {                                                             \
                                sl += xb->q[V##_EO ? (j % 2) * 16 + j / 2 : j];                                        \
                                sh += xb->q[V##_EO ? (j % 2) * 16 + 8 + j / 2 : 16 + j];                               \
                            }                                                                                          \
                            acc[t] = acc[t] + (mw[2 * s] * xb->d) * (float)sl;                                         \
                            acc[t] = acc[t] + (mw[2 * s + 1] * xb->d) * (float)sh;                                     \
                        }                                                                                              \
                    } else if (fmt == IQ4_XS) {                                                                        \
                        const i32x4 p = V##_sums_ss(wv, V##_loadx(xb->q));                                             \
                        acc[t] = acc[t] + (dw[s] * xb->d) * __builtin_convertvector(p, f32x4);                         \
                    } else {                                                                                           \
                        const i32x4 p = V##_sums_us(wv, V##_loadx(xb->q));                                             \
                        acc[t] = acc[t] + (dw[s] * xb->d) * __builtin_convertvector(p, f32x4);                         \
                        acc[t] = acc[t] + mw[s] * xb->s;                                                               \
                    }                                                                                                  \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        for (int t = 0; t < NT; t++) out[t] = acc[t];                                                                  \
    }                                                                                                                  \
    ATTR INLINE void V##_kfmt_rows(const int fmt, const uint8_t *w, int64_t row_bytes, int64_t nb, int64_t r0,         \
                                   int64_t r1, const XB *x, int64_t t0, int64_t tn, float *y, int64_t ys) {            \
        const int64_t ahead = PREFETCH_TILES * 4 * row_bytes;                                                          \
        for (int64_t r = r0; r < r1; r += 4) {                                                                         \
            const uint8_t *wr[4];                                                                                      \
            const int live = tile_rows(w, row_bytes, r, r1, wr);                                                       \
            f32x4 v[KT];                                                                                               \
            for (int64_t t = t0; t < t0 + tn; t += KT) {                                                               \
                /* each count its own constant, so every tile unrolls: a tile's scales and quants are unpacked      \
                 * once for all its rows of x, so 3 rows in one tile cost less than 2 tiles (or 3) would */          \
                const int n = t0 + tn - t < KT ? (int)(t0 + tn - t) : KT;                                              \
                const XB *xt = x + t * nb;                                                                             \
                switch (n) {                                                                                           \
                case 1: V##_ktile(fmt, 1, wr, ahead, nb / 8, xt, nb, v); break;                                        \
                case 2: V##_ktile(fmt, 2, wr, ahead, nb / 8, xt, nb, v); break;                                        \
                case 3: V##_ktile(fmt, 3, wr, ahead, nb / 8, xt, nb, v); break;                                        \
                case 4: V##_ktile(fmt, 4, wr, ahead, nb / 8, xt, nb, v); break;                                        \
                case 5: V##_ktile(fmt, 5, wr, ahead, nb / 8, xt, nb, v); break;                                        \
                case 6: V##_ktile(fmt, 6, wr, ahead, nb / 8, xt, nb, v); break;                                        \
                case 7: V##_ktile(fmt, 7, wr, ahead, nb / 8, xt, nb, v); break;                                        \
                default: V##_ktile(fmt, KT, wr, ahead, nb / 8, xt, nb, v); break;                                      \
                }                                                                                                      \
                for (int i = 0; i < n; i++) qdot_store(y + (t + i) * ys + r, &v[i], live);                             \
            }                                                                                                          \
        }                                                                                                              \
    }                                                                                                                  \
    ATTR __attribute__((noinline)) static void V##_krows(int fmt, const uint8_t *w, int64_t row_bytes, int64_t nb,     \
                                                         int64_t r0, int64_t r1, const XB *x, int64_t t0,              \
                                                         int64_t tn, float *y, int64_t ys) {                           \
        switch (fmt) {                                                                                                 \
        case Q4_K: V##_kfmt_rows(Q4_K, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                             \
        case Q5_K: V##_kfmt_rows(Q5_K, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                             \
        case Q6_K: V##_kfmt_rows(Q6_K, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                             \
        case Q2_K: V##_kfmt_rows(Q2_K, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                             \
        case Q3_K: V##_kfmt_rows(Q3_K, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                             \
        case IQ4_XS: V##_kfmt_rows(IQ4_XS, w, row_bytes, nb, r0, r1, x, t0, tn, y, ys); break;                         \
        default: break;                                                                                                \
        }                                                                                                              \
    }

/* The portable variants, one per width of x: the weights' quants in lanes of lane_t (int8 for 8-bit x,
 * int16 for 16-bit x: 32 products of |w| <= 128 by |x| <= 32767, each below 2^22, their sum below 2^27,
 * summed exactly in int32). */
#define SCALAR_LANES(P, lane_t)                                                                                        \
    typedef struct {                                                                                                   \
        lane_t b[32];                                                                                                  \
    } P##_bv;                                                                                                          \
    INLINE P##_bv P##_load(const int8_t *p) {                                                                          \
        P##_bv v;                                                                                                      \
        for (int j = 0; j < 32; j++) v.b[j] = p[j];                                                                    \
        return v;                                                                                                      \
    }                                                                                                                  \
    INLINE P##_bv P##_nibbles(const uint8_t *p) {                                                                      \
        P##_bv v;                                                                                                      \
        for (int j = 0; j < 16; j++) v.b[j] = (lane_t)(p[j] & 15), v.b[j + 16] = (lane_t)(p[j] >> 4);                  \
        return v;                                                                                                      \
    }                                                                                                                  \
    INLINE P##_bv P##_sub8(P##_bv v) {                                                                                 \
        for (int j = 0; j < 32; j++) v.b[j] = (lane_t)(v.b[j] - 8);                                                    \
        return v;                                                                                                      \
    }                                                                                                                  \
    INLINE i32x4 P##_sums_ss(const P##_bv *w, P##_bv x) {                                                              \
        i32x4 s = {0};                                                                                                 \
        for (int i = 0; i < 4; i++) {                                                                                  \
            int32_t sum = 0;                                                                                           \
            for (int j = 0; j < 32; j++) sum += (int32_t)w[i].b[j] * (int32_t)x.b[j];                                  \
            s[i] = sum;                                                                                                \
        }                                                                                                              \
        return s;                                                                                                      \
    }                                                                                                                  \
    INLINE i32x8 P##_sums8_ss(const P##_bv *w, P##_bv x0, P##_bv x1) {                                                 \
        const i32x4 a = P##_sums_ss(w, x0), b = P##_sums_ss(w, x1);                                                    \
        return (i32x8){a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]};                                                \
    }

SCALAR_LANES(sc, int8_t)
SCALAR_LANES(s16, int16_t)
#define sc_sums_us sc_sums_ss
#define sc_sums8_us sc_sums8_ss
#define s16_sums_us s16_sums_ss
#define s16_sums8_us s16_sums8_ss

INLINE f32x4 sc_halves(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3) {
    return (f32x4){le_half(p0), le_half(p1), le_half(p2), le_half(p3)};
}
#define s16_halves sc_halves

#define sc_loadx sc_load
INLINE s16_bv s16_loadx(const int16_t *p) {
    s16_bv v;
    memcpy(v.b, p, sizeof v.b);
    return v;
}

Q5_FROM_BYTES(sc, )
Q5_FROM_BYTES(s16, )

/* IQ4's table values of 16 bytes of nibbles, in the portable lanes. */
#define SCALAR_IQ4(P, lane_t)                                                                                          \
    INLINE P##_bv P##_iq4(const uint8_t *qs) {                                                                         \
        P##_bv v;                                                                                                      \
        for (int j = 0; j < 16; j++) v.b[j] = (lane_t)iq4_values[qs[j] & 15], v.b[j + 16] = (lane_t)iq4_values[qs[j] >> 4]; \
        return v;                                                                                                      \
    }
SCALAR_IQ4(sc, int8_t)
SCALAR_IQ4(s16, int16_t)
#define sc_EO 0   /* V_EO: 1 where the variant's K tiles take x's blocks in K_EVEN_ODD's order */
#define s16_EO 0
QDOT_KERNEL(sc, , xblock_t)
QDOT_KERNEL(s16, , xblock16_t)

/* The K-quants' 32 quants of a sub-block, and Q6_K's half sums, in the portable lanes. */
#define SCALAR_K(P, lane_t)                                                                                            \
    INLINE P##_bv P##_kquants(const uint8_t *qs, const uint8_t *qh, int shift, int bit, int hbits) {                   \
        P##_bv v;                                                                                                      \
        const int m = (1 << hbits) - 1, zero = hbits == 2 ? 32 : 0;                                                    \
        for (int j = 0; j < 32; j++)                                                                                   \
            v.b[j] = (lane_t)((((qs[j] >> shift) & 15) | (qh ? ((qh[j] >> bit) & m) << 4 : 0)) - zero);                \
        return v;                                                                                                      \
    }                                                                                                                  \
    INLINE void P##_sums_halves(const P##_bv *w, P##_bv x, i32x4 *lo, i32x4 *hi) {                                     \
        for (int i = 0; i < 4; i++) {                                                                                  \
            int32_t a = 0, b = 0;                                                                                      \
            for (int j = 0; j < 16; j++) a += (int32_t)w[i].b[j] * (int32_t)x.b[j];                                    \
            for (int j = 16; j < 32; j++) b += (int32_t)w[i].b[j] * (int32_t)x.b[j];                                   \
            (*lo)[i] = a, (*hi)[i] = b;                                                                                \
        }                                                                                                              \
    }
SCALAR_K(sc, int8_t)
SCALAR_K(s16, int16_t)
#define SCALAR_K23(P, lane_t)                                                                                          \
    INLINE P##_bv P##_k23(const uint8_t *qs, const uint8_t *hm, int shift, int bit) {                                  \
        P##_bv v;                                                                                                      \
        for (int j = 0; j < 32; j++)                                                                                   \
            v.b[j] = (lane_t)(hm ? (((qs[j] >> shift) & 3) | (((hm[j] >> bit) & 1) << 2)) - 4 : (qs[j] >> shift) & 3);  \
        return v;                                                                                                      \
    }
SCALAR_K23(sc, int8_t)
SCALAR_K23(s16, int16_t)
QDOT_KTILES(sc, , xblock_t)
QDOT_KTILES(s16, , xblock16_t)

/* ---------------------------------------------------------------- x86-64: AVX2, AVX-512 VNNI */
#ifdef QDOT_X86
#define AVX2_ATTR __attribute__((target("avx2,f16c")))
#define VNNI_ATTR __attribute__((target("avx2,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

typedef __m256i av_bv;
typedef __m256i vn_bv;
#define X86_PRIMITIVES(V, ATTR)                                                                                        \
    ATTR INLINE __m256i V##_load(const int8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }                   \
    ATTR INLINE __m256i V##_nibbles(const uint8_t *p) {                                                                \
        const __m128i b = _mm_loadu_si128((const __m128i *)p);                                                         \
        const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);                                                \
        return _mm256_and_si256(both, _mm256_set1_epi8(15));                                                           \
    }                                                                                                                  \
    ATTR INLINE __m256i V##_sub8(__m256i v) { return _mm256_sub_epi8(v, _mm256_set1_epi8(8)); }                        \
    ATTR INLINE f32x4 V##_halves(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3) {         \
        uint16_t h0, h1, h2, h3;                                                                                       \
        memcpy(&h0, p0, 2), memcpy(&h1, p1, 2), memcpy(&h2, p2, 2), memcpy(&h3, p3, 2);                                \
        return (f32x4)_mm_cvtph_ps(_mm_setr_epi16((short)h0, (short)h1, (short)h2, (short)h3, 0, 0, 0, 0));            \
    }                                                                                                                  \
    /* eight lanes of four-byte sums each, for four rows -> the four totals */                                         \
    ATTR INLINE i32x4 V##_total4(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {                                     \
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));                     \
        return (i32x4)_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));                        \
    }                                                                                                                  \
    /* the same for two rows of x at once: x0's four totals, then x1's */                                              \
    ATTR INLINE i32x8 V##_total8(const __m256i *p, const __m256i *q) {                                                 \
        const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));             \
        const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(q[0], q[1]), _mm256_hadd_epi32(q[2], q[3]));             \
        return (i32x8)_mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));  \
    }
X86_PRIMITIVES(av, AVX2_ATTR)
X86_PRIMITIVES(vn, VNNI_ATTR)

/* Q5_0 / Q5_1's 32 quants as q5_bytes gives them: the nibbles, and bit j of qh spread to byte j. AVX2
 * spreads the bits with a shuffle and a compare; AVX-512 takes qh as a byte mask (one masked add). */
AVX2_ATTR INLINE __m256i av_q5(const uint8_t *qh, const uint8_t *qs, int centred) {
    uint32_t h;
    memcpy(&h, qh, sizeof h);
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), pick);
    const __m256i fifth = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                                           _mm256_set1_epi8(16));
    const __m256i q = _mm256_or_si256(av_nibbles(qs), fifth);
    return centred ? _mm256_sub_epi8(q, _mm256_set1_epi8(16)) : q;
}
VNNI_ATTR INLINE __m256i vn_q5(const uint8_t *qh, const uint8_t *qs, int centred) {
    uint32_t h;
    memcpy(&h, qh, sizeof h);
    const __m256i nib = vn_nibbles(qs), sixteen = _mm256_set1_epi8(16);
    /* q - 16 for Q5_0: the nibble where the bit is set, the nibble less 16 where not */
    return centred ? _mm256_mask_sub_epi8(nib, (__mmask32)~h, nib, sixteen)
                   : _mm256_mask_add_epi8(nib, (__mmask32)h, nib, sixteen);
}

/* The four rows' sums from a variant's one-vector dot product V_dot_us (unsigned w by signed x); the
 * signed form moves w's sign onto x (|w| <= 128, |x| <= 127: nothing saturates). */
#define X86_SUMS(V, ATTR)                                                                                              \
    ATTR INLINE __m256i V##_dot_ss(__m256i w, __m256i x) {                                                             \
        return V##_dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));                                             \
    }                                                                                                                  \
    ATTR INLINE i32x4 V##_sums_us(const __m256i *w, __m256i x) {                                                       \
        return V##_total4(V##_dot_us(w[0], x), V##_dot_us(w[1], x), V##_dot_us(w[2], x), V##_dot_us(w[3], x));         \
    }                                                                                                                  \
    ATTR INLINE i32x4 V##_sums_ss(const __m256i *w, __m256i x) {                                                       \
        return V##_total4(V##_dot_ss(w[0], x), V##_dot_ss(w[1], x), V##_dot_ss(w[2], x), V##_dot_ss(w[3], x));         \
    }                                                                                                                  \
    ATTR INLINE i32x8 V##_sums8_us(const __m256i *w, __m256i x0, __m256i x1) {                                         \
        __m256i p[4], q[4];                                                                                            \
        for (int i = 0; i < 4; i++) p[i] = V##_dot_us(w[i], x0), q[i] = V##_dot_us(w[i], x1);                          \
        return V##_total8(p, q);                                                                                       \
    }                                                                                                                  \
    ATTR INLINE i32x8 V##_sums8_ss(const __m256i *w, __m256i x0, __m256i x1) {                                         \
        __m256i a[4], p[4], q[4];                                                                                      \
        for (int i = 0; i < 4; i++) a[i] = _mm256_sign_epi8(w[i], w[i]);   /* |w| once for both rows of x */         \
        for (int i = 0; i < 4; i++) p[i] = V##_dot_us(a[i], _mm256_sign_epi8(x0, w[i]));                               \
        for (int i = 0; i < 4; i++) q[i] = V##_dot_us(a[i], _mm256_sign_epi8(x1, w[i]));                               \
        return V##_total8(p, q);                                                                                       \
    }

/* maddubs multiplies unsigned by signed bytes into pair sums, madd adds those pairs into int32 lanes. */
AVX2_ATTR INLINE __m256i av_dot_us(__m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}
VNNI_ATTR INLINE __m256i vn_dot_us(__m256i w, __m256i x) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
}
X86_SUMS(av, AVX2_ATTR)
X86_SUMS(vn, VNNI_ATTR)

#define av_loadx av_load
#define vn_loadx vn_load
/* IQ4's nibbles look their values up in the table with one byte shuffle (within each 128-bit lane). */
#define X86_IQ4(V, ATTR)                                                                                               \
    ATTR INLINE __m256i V##_iq4(const uint8_t *qs) {                                                                   \
        const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4_values));              \
        return _mm256_shuffle_epi8(table, V##_nibbles(qs));                                                            \
    }
X86_IQ4(av, AVX2_ATTR)
X86_IQ4(vn, VNNI_ATTR)
#define av_EO 0
#define vn_EO 0
QDOT_KERNEL(av, AVX2_ATTR, xblock_t)
QDOT_KERNEL(vn, VNNI_ATTR, xblock_t)

/* The K-quants with 8-bit x: a sub-block's 32 quants as bytes (unsigned, or Q6_K's less 32), and Q6_K's
 * sums over values 0..15 and 16..31 apart: the two hadds leave the low halves' sums in the low 128 bits. */
#define X86_K8(V, ATTR)                                                                                                \
    ATTR INLINE __m256i V##_kquants(const uint8_t *qs, const uint8_t *qh, int shift, int bit, int hbits) {             \
        const __m256i q = _mm256_loadu_si256((const __m256i *)qs);                                                     \
        __m256i b = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(15));             \
        if (qh) {                                                                                                      \
            const __m256i h = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)qh), _mm_cvtsi32_si128(bit));       \
            const __m256i m = _mm256_set1_epi8((char)((1 << hbits) - 1));                                              \
            b = _mm256_or_si256(b, _mm256_slli_epi16(_mm256_and_si256(h, m), 4));                                      \
        }                                                                                                              \
        return hbits == 2 ? _mm256_sub_epi8(b, _mm256_set1_epi8(32)) : b;                                              \
    }                                                                                                                  \
    ATTR INLINE void V##_sums_halves(const __m256i *w, __m256i x, i32x4 *lo, i32x4 *hi) {                              \
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(V##_dot_ss(w[0], x), V##_dot_ss(w[1], x)),               \
                                            _mm256_hadd_epi32(V##_dot_ss(w[2], x), V##_dot_ss(w[3], x)));              \
        *lo = (i32x4)_mm256_castsi256_si128(h);                                                                        \
        *hi = (i32x4)_mm256_extracti128_si256(h, 1);                                                                   \
    }
X86_K8(av, AVX2_ATTR)
X86_K8(vn, VNNI_ATTR)
/* Q2_K's and Q3_K's quants as bytes: shifts within 16-bit lanes, the bits that cross from the upper byte masked
 * off. */
#define X86_K23(V, ATTR)                                                                                               \
    ATTR INLINE __m256i V##_k23(const uint8_t *qs, const uint8_t *hm, int shift, int bit) {                            \
        const __m256i q = _mm256_loadu_si256((const __m256i *)qs);                                                     \
        __m256i b = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(3));             \
        if (hm) {                                                                                                      \
            const __m256i h = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)hm), _mm_cvtsi32_si128(bit));       \
            b = _mm256_or_si256(b, _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(1)), 2));                    \
            b = _mm256_sub_epi8(b, _mm256_set1_epi8(4));                                                               \
        }                                                                                                              \
        return b;                                                                                                      \
    }
X86_K23(av, AVX2_ATTR)
X86_K23(vn, VNNI_ATTR)
QDOT_KTILES(av, AVX2_ATTR, xblock_t)
QDOT_KTILES(vn, VNNI_ATTR, xblock_t)

/* 16-bit x: a block in two vectors of 16 int16 (values 0..15, then 16..31), the weights' quants widened
 * to the same lanes. The variants differ only in V_pairs(acc, w, x), which adds the products' pair sums
 * into int32 lanes (exact: |pair| < 2^23): AVX2's pmaddwd and an add, AVX-512 VNNI's vpdpwssd (on 256-bit
 * vectors: measured faster than one 512-bit vector per block on Zen 4). B is the variant whose total4 and
 * total8 reduce the lanes. */
typedef struct {
    __m256i lo, hi;
} av16_bv;
typedef av16_bv vn16_bv;
AVX2_ATTR INLINE __m256i av16_pairs(__m256i acc, __m256i w, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
}
VNNI_ATTR INLINE __m256i vn16_pairs(__m256i acc, __m256i w, __m256i x) { return _mm256_dpwssd_epi32(acc, w, x); }

/* Bytes shifted within 16-bit lanes in V_kquants: the bits that cross from the upper byte are masked off. */
#define X86_16(V, B, ATTR)                                                                                             \
    ATTR INLINE av16_bv V##_load(const int8_t *p) {                                                                    \
        return (av16_bv){_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)),                                    \
                         _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)))};                            \
    }                                                                                                                  \
    ATTR INLINE av16_bv V##_loadx(const int16_t *p) {                                                                  \
        return (av16_bv){_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 16))};       \
    }                                                                                                                  \
    ATTR INLINE av16_bv V##_nibbles(const uint8_t *p) {                                                                \
        const __m128i b = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(15);                                  \
        return (av16_bv){_mm256_cvtepu8_epi16(_mm_and_si128(b, m)),                                                    \
                         _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), m))};                                \
    }                                                                                                                  \
    ATTR INLINE av16_bv V##_q5(const uint8_t *qh, const uint8_t *qs, int centred) {                                    \
        const __m256i q = B##_q5(qh, qs, centred);                                                                     \
        return (av16_bv){_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),                                              \
                         _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1))};                                        \
    }                                                                                                                  \
    ATTR INLINE av16_bv V##_iq4(const uint8_t *qs) {                                                                   \
        const __m256i q = B##_iq4(qs);                                                                                 \
        return (av16_bv){_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),                                              \
                         _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1))};                                        \
    }                                                                                                                  \
    ATTR INLINE av16_bv V##_sub8(av16_bv v) {                                                                          \
        const __m256i e = _mm256_set1_epi16(8);                                                                        \
        return (av16_bv){_mm256_sub_epi16(v.lo, e), _mm256_sub_epi16(v.hi, e)};                                        \
    }                                                                                                                  \
    ATTR INLINE __m256i V##_dot(av16_bv w, av16_bv x) {                                                                \
        return V##_pairs(V##_pairs(_mm256_setzero_si256(), w.lo, x.lo), w.hi, x.hi);                                   \
    }                                                                                                                  \
    ATTR INLINE i32x4 V##_sums_ss(const av16_bv *w, av16_bv x) {                                                       \
        return B##_total4(V##_dot(w[0], x), V##_dot(w[1], x), V##_dot(w[2], x), V##_dot(w[3], x));                     \
    }                                                                                                                  \
    ATTR INLINE i32x8 V##_sums8_ss(const av16_bv *w, av16_bv x0, av16_bv x1) {                                         \
        __m256i p[4], q[4];                                                                                            \
        for (int i = 0; i < 4; i++) p[i] = V##_dot(w[i], x0), q[i] = V##_dot(w[i], x1);                                \
        return B##_total8(p, q);                                                                                       \
    }                                                                                                                  \
    /* The K-quants: a sub-block's quants as K_EVEN_ODD lays x out, values 0, 2, .., 30 in lo and 1, 3, .., 31 in hi,  \
     * cut from the 16-bit pairs of bytes with shifts and masks (no widening shuffles); Q6_K's less 32.           */ \
    ATTR INLINE av16_bv V##_kquants(const uint8_t *qs, const uint8_t *qh, int shift, int bit, int hbits) {             \
        const __m256i q = _mm256_loadu_si256((const __m256i *)qs), m4 = _mm256_set1_epi16(15);                         \
        __m256i lo = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift)), m4);                              \
        __m256i hi = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift + 8)), m4);                          \
        if (qh) {                                                                                                      \
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh), m = _mm256_set1_epi16((1 << hbits) - 1);        \
            const __m256i hl = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(bit)), m);                      \
            const __m256i hh = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(bit + 8)), m);                  \
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(hl, 4)), hi = _mm256_or_si256(hi, _mm256_slli_epi16(hh, 4));   \
        }                                                                                                              \
        if (hbits == 2) {                                                                                              \
            const __m256i c = _mm256_set1_epi16(32);                                                                   \
            lo = _mm256_sub_epi16(lo, c), hi = _mm256_sub_epi16(hi, c);                                                \
        }                                                                                                              \
        return (av16_bv){lo, hi};                                                                                      \
    }                                                                                                                  \
    /* Q2_K's and Q3_K's quants in the same layout: the even bytes' 2-bit fields in lo, the odd ones' in hi */        \
    ATTR INLINE av16_bv V##_k23(const uint8_t *qs, const uint8_t *hm, int shift, int bit) {                            \
        const __m256i q = _mm256_loadu_si256((const __m256i *)qs), m2 = _mm256_set1_epi16(3);                          \
        __m256i lo = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift)), m2);                              \
        __m256i hi = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(shift + 8)), m2);                          \
        if (hm) {                                                                                                      \
            const __m256i h = _mm256_loadu_si256((const __m256i *)hm), one = _mm256_set1_epi16(1);                     \
            const __m256i four = _mm256_set1_epi16(4);                                                                 \
            const __m256i hl = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(bit)), one);                     \
            const __m256i hh = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(bit + 8)), one);                 \
            lo = _mm256_sub_epi16(_mm256_or_si256(lo, _mm256_slli_epi16(hl, 2)), four);                                \
            hi = _mm256_sub_epi16(_mm256_or_si256(hi, _mm256_slli_epi16(hh, 2)), four);                                \
        }                                                                                                              \
        return (av16_bv){lo, hi};                                                                                      \
    }                                                                                                                  \
    /* Q6_K: the sums over values 0..15 and 16..31 apart, which that layout keeps in the low and high 128 bits */    \
    ATTR INLINE void V##_sums_halves(const av16_bv *w, av16_bv x, i32x4 *lo, i32x4 *hi) {                              \
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(V##_dot(w[0], x), V##_dot(w[1], x)),                     \
                                            _mm256_hadd_epi32(V##_dot(w[2], x), V##_dot(w[3], x)));                    \
        *lo = (i32x4)_mm256_castsi256_si128(h);                                                                        \
        *hi = (i32x4)_mm256_extracti128_si256(h, 1);                                                                   \
    }
X86_16(av16, av, AVX2_ATTR)
X86_16(vn16, vn, VNNI_ATTR)
#define av16_sums_us av16_sums_ss
#define av16_sums8_us av16_sums8_ss
#define av16_halves av_halves
#define vn16_sums_us vn16_sums_ss
#define vn16_sums8_us vn16_sums8_ss
#define vn16_halves vn_halves
#define av16_EO 1
#define vn16_EO 1

QDOT_KERNEL(av16, AVX2_ATTR, xblock16_t)
QDOT_KERNEL(vn16, VNNI_ATTR, xblock16_t)
QDOT_KTILES(av16, AVX2_ATTR, xblock16_t)
QDOT_KTILES(vn16, VNNI_ATTR, xblock16_t)
#endif

/* ---------------------------------------------------------------- aarch64: NEON, NEON + sdot */
#ifdef QDOT_ARM
#define NEON_ATTR
#define SDOT_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))

typedef struct {
    int8x16_t lo, hi;
} ne_bv;
typedef ne_bv sd_bv;

#define ARM_PRIMITIVES(V, ATTR)                                                                                        \
    ATTR INLINE ne_bv V##_load(const int8_t *p) { return (ne_bv){vld1q_s8(p), vld1q_s8(p + 16)}; }                     \
    ATTR INLINE ne_bv V##_nibbles(const uint8_t *p) {                                                                  \
        const uint8x16_t b = vld1q_u8(p);                                                                              \
        return (ne_bv){vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(15))), vreinterpretq_s8_u8(vshrq_n_u8(b, 4))};       \
    }                                                                                                                  \
    ATTR INLINE ne_bv V##_sub8(ne_bv v) {                                                                              \
        return (ne_bv){vsubq_s8(v.lo, vdupq_n_s8(8)), vsubq_s8(v.hi, vdupq_n_s8(8))};                                  \
    }                                                                                                                  \
    ATTR INLINE f32x4 V##_halves(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3) {         \
        uint16_t h[4];                                                                                                 \
        memcpy(&h[0], p0, 2), memcpy(&h[1], p1, 2), memcpy(&h[2], p2, 2), memcpy(&h[3], p3, 2);                        \
        const float32x4_t f = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));                                         \
        f32x4 out;                                                                                                     \
        memcpy(&out, &f, sizeof out);                                                                                  \
        return out;                                                                                                    \
    }                                                                                                                  \
    /* four lanes of partial sums each, for four rows -> the four totals */                                            \
    ATTR INLINE i32x4 V##_total4(int32x4_t p0, int32x4_t p1, int32x4_t p2, int32x4_t p3) {                             \
        const int32x4_t s = vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3));                                        \
        i32x4 out;                                                                                                     \
        memcpy(&out, &s, sizeof out);                                                                                  \
        return out;                                                                                                    \
    }
ARM_PRIMITIVES(ne, NEON_ATTR)
ARM_PRIMITIVES(sd, SDOT_ATTR)

/* smull to 16-bit products, pairwise adds to 16 bits (|pair| <= 2 * 128 * 127 fits), then to 32 bits. */
INLINE int32x4_t ne_dot(ne_bv w, ne_bv x) {
    const int16x8_t a = vpaddq_s16(vmull_s8(vget_low_s8(w.lo), vget_low_s8(x.lo)), vmull_high_s8(w.lo, x.lo));
    const int16x8_t b = vpaddq_s16(vmull_s8(vget_low_s8(w.hi), vget_low_s8(x.hi)), vmull_high_s8(w.hi, x.hi));
    return vaddq_s32(vpaddlq_s16(a), vpaddlq_s16(b));
}
INLINE i32x4 ne_sums_ss(const ne_bv *w, ne_bv x) {
    return ne_total4(ne_dot(w[0], x), ne_dot(w[1], x), ne_dot(w[2], x), ne_dot(w[3], x));
}
#define ne_sums_us ne_sums_ss
INLINE i32x8 ne_sums8_ss(const ne_bv *w, ne_bv x0, ne_bv x1) {
    const i32x4 a = ne_sums_ss(w, x0), b = ne_sums_ss(w, x1);
    return (i32x8){a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]};
}
#define ne_sums8_us ne_sums8_ss

SDOT_ATTR INLINE int32x4_t sd_dot(ne_bv w, ne_bv x) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w.lo, x.lo), w.hi, x.hi);
}
SDOT_ATTR INLINE i32x4 sd_sums_ss(const ne_bv *w, ne_bv x) {
    return sd_total4(sd_dot(w[0], x), sd_dot(w[1], x), sd_dot(w[2], x), sd_dot(w[3], x));
}
#define sd_sums_us sd_sums_ss
SDOT_ATTR INLINE i32x8 sd_sums8_ss(const ne_bv *w, ne_bv x0, ne_bv x1) {
    const i32x4 a = sd_sums_ss(w, x0), b = sd_sums_ss(w, x1);
    return (i32x8){a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]};
}
#define sd_sums8_us sd_sums8_ss

#define ne_loadx ne_load
#define sd_loadx sd_load
/* IQ4's nibbles look their values up in the table with tbl. */
#define ARM_IQ4(V, ATTR)                                                                                               \
    ATTR INLINE ne_bv V##_iq4(const uint8_t *qs) {                                                                     \
        const ne_bv n = V##_nibbles(qs);                                                                               \
        const int8x16_t table = vld1q_s8(iq4_values);                                                                  \
        return (ne_bv){vqtbl1q_s8(table, vreinterpretq_u8_s8(n.lo)), vqtbl1q_s8(table, vreinterpretq_u8_s8(n.hi))};    \
    }
ARM_IQ4(ne, NEON_ATTR)
ARM_IQ4(sd, SDOT_ATTR)
#define ne_EO 0
#define sd_EO 0
Q5_FROM_BYTES(ne, NEON_ATTR)
Q5_FROM_BYTES(sd, SDOT_ATTR)
QDOT_KERNEL(ne, NEON_ATTR, xblock_t)
QDOT_KERNEL(sd, SDOT_ATTR, xblock_t)

/* The K-quants with 8-bit x: a sub-block's quants as two vectors of 16 bytes (lo: values 0..15). */
INLINE ne_bv ne_kquants(const uint8_t *qs, const uint8_t *qh, int shift, int bit, int hbits) {
    uint8x16_t a = vandq_u8(vshlq_u8(vld1q_u8(qs), vdupq_n_s8((int8_t)-shift)), vdupq_n_u8(15));
    uint8x16_t b = vandq_u8(vshlq_u8(vld1q_u8(qs + 16), vdupq_n_s8((int8_t)-shift)), vdupq_n_u8(15));
    if (qh) {
        const int8x16_t down = vdupq_n_s8((int8_t)-bit);
        const uint8x16_t m = vdupq_n_u8((uint8_t)((1 << hbits) - 1));
        a = vorrq_u8(a, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh), down), m), 4));
        b = vorrq_u8(b, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(qh + 16), down), m), 4));
    }
    ne_bv v = {vreinterpretq_s8_u8(a), vreinterpretq_s8_u8(b)};
    if (hbits == 2) v.lo = vsubq_s8(v.lo, vdupq_n_s8(32)), v.hi = vsubq_s8(v.hi, vdupq_n_s8(32));
    return v;
}
#define sd_kquants ne_kquants
/* Q2_K's and Q3_K's quants as two vectors of 16 bytes (lo: values 0..15). */
INLINE ne_bv ne_k23(const uint8_t *qs, const uint8_t *hm, int shift, int bit) {
    const int8x16_t down = vdupq_n_s8((int8_t)-shift);
    uint8x16_t a = vandq_u8(vshlq_u8(vld1q_u8(qs), down), vdupq_n_u8(3));
    uint8x16_t b = vandq_u8(vshlq_u8(vld1q_u8(qs + 16), down), vdupq_n_u8(3));
    if (!hm) return (ne_bv){vreinterpretq_s8_u8(a), vreinterpretq_s8_u8(b)};
    const int8x16_t hdown = vdupq_n_s8((int8_t)-bit);
    a = vorrq_u8(a, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(hm), hdown), vdupq_n_u8(1)), 2));
    b = vorrq_u8(b, vshlq_n_u8(vandq_u8(vshlq_u8(vld1q_u8(hm + 16), hdown), vdupq_n_u8(1)), 2));
    return (ne_bv){vsubq_s8(vreinterpretq_s8_u8(a), vdupq_n_s8(4)), vsubq_s8(vreinterpretq_s8_u8(b), vdupq_n_s8(4))};
}
#define sd_k23 ne_k23
INLINE int32x4_t ne_half_dot(int8x16_t w, int8x16_t x) {
    return vpaddlq_s16(vpaddq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)), vmull_high_s8(w, x)));
}
INLINE void ne_sums_halves(const ne_bv *w, ne_bv x, i32x4 *lo, i32x4 *hi) {
    *lo = ne_total4(ne_half_dot(w[0].lo, x.lo), ne_half_dot(w[1].lo, x.lo), ne_half_dot(w[2].lo, x.lo),
                    ne_half_dot(w[3].lo, x.lo));
    *hi = ne_total4(ne_half_dot(w[0].hi, x.hi), ne_half_dot(w[1].hi, x.hi), ne_half_dot(w[2].hi, x.hi),
                    ne_half_dot(w[3].hi, x.hi));
}
SDOT_ATTR INLINE void sd_sums_halves(const ne_bv *w, ne_bv x, i32x4 *lo, i32x4 *hi) {
    const int32x4_t z = vdupq_n_s32(0);
    *lo = sd_total4(vdotq_s32(z, w[0].lo, x.lo), vdotq_s32(z, w[1].lo, x.lo), vdotq_s32(z, w[2].lo, x.lo),
                    vdotq_s32(z, w[3].lo, x.lo));
    *hi = sd_total4(vdotq_s32(z, w[0].hi, x.hi), vdotq_s32(z, w[1].hi, x.hi), vdotq_s32(z, w[2].hi, x.hi),
                    vdotq_s32(z, w[3].hi, x.hi));
}
QDOT_KTILES(ne, NEON_ATTR, xblock_t)
QDOT_KTILES(sd, SDOT_ATTR, xblock_t)

/* 16-bit x on NEON: a block in four vectors of 8 int16; smull/smlal to int32 lanes (8 products each,
 * below 2^25). */
typedef struct {
    int16x8_t v[4];
} n16_bv;
INLINE n16_bv n16_load(const int8_t *p) {
    const int8x16_t a = vld1q_s8(p), b = vld1q_s8(p + 16);
    return (n16_bv){{vmovl_s8(vget_low_s8(a)), vmovl_high_s8(a), vmovl_s8(vget_low_s8(b)), vmovl_high_s8(b)}};
}
INLINE n16_bv n16_loadx(const int16_t *p) {
    return (n16_bv){{vld1q_s16(p), vld1q_s16(p + 8), vld1q_s16(p + 16), vld1q_s16(p + 24)}};
}
INLINE n16_bv n16_nibbles(const uint8_t *p) {
    const uint8x16_t b = vld1q_u8(p);
    const uint8x16_t lo = vandq_u8(b, vdupq_n_u8(15)), hi = vshrq_n_u8(b, 4);
    return (n16_bv){{vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(lo))), vreinterpretq_s16_u16(vmovl_high_u8(lo)),
                     vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(hi))), vreinterpretq_s16_u16(vmovl_high_u8(hi))}};
}
INLINE n16_bv n16_sub8(n16_bv v) {
    for (int i = 0; i < 4; i++) v.v[i] = vsubq_s16(v.v[i], vdupq_n_s16(8));
    return v;
}
INLINE int32x4_t n16_dot(n16_bv w, n16_bv x) {
    int32x4_t a = vmull_s16(vget_low_s16(w.v[0]), vget_low_s16(x.v[0]));
    a = vmlal_high_s16(a, w.v[0], x.v[0]);
    for (int i = 1; i < 4; i++) {
        a = vmlal_s16(a, vget_low_s16(w.v[i]), vget_low_s16(x.v[i]));
        a = vmlal_high_s16(a, w.v[i], x.v[i]);
    }
    return a;
}
INLINE i32x4 n16_sums_ss(const n16_bv *w, n16_bv x) {
    return ne_total4(n16_dot(w[0], x), n16_dot(w[1], x), n16_dot(w[2], x), n16_dot(w[3], x));
}
INLINE i32x8 n16_sums8_ss(const n16_bv *w, n16_bv x0, n16_bv x1) {
    const i32x4 a = n16_sums_ss(w, x0), b = n16_sums_ss(w, x1);
    return (i32x8){a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]};
}
#define n16_sums_us n16_sums_ss
#define n16_sums8_us n16_sums8_ss
#define n16_halves ne_halves

Q5_FROM_BYTES(n16, NEON_ATTR)
INLINE n16_bv n16_iq4(const uint8_t *qs) {
    const ne_bv b = ne_iq4(qs);
    return (n16_bv){{vmovl_s8(vget_low_s8(b.lo)), vmovl_high_s8(b.lo), vmovl_s8(vget_low_s8(b.hi)), vmovl_high_s8(b.hi)}};
}
#define n16_EO 0
QDOT_KERNEL(n16, NEON_ATTR, xblock16_t)

INLINE n16_bv n16_k23(const uint8_t *qs, const uint8_t *hm, int shift, int bit) {
    const ne_bv b = ne_k23(qs, hm, shift, bit);   /* Q3_K's already less 4: sign-extended */
    return (n16_bv){{vmovl_s8(vget_low_s8(b.lo)), vmovl_high_s8(b.lo), vmovl_s8(vget_low_s8(b.hi)), vmovl_high_s8(b.hi)}};
}
INLINE n16_bv n16_kquants(const uint8_t *qs, const uint8_t *qh, int shift, int bit, int hbits) {
    const ne_bv b = ne_kquants(qs, qh, shift, bit, hbits);   /* Q6_K's already less 32: sign-extended */
    return (n16_bv){{vmovl_s8(vget_low_s8(b.lo)), vmovl_high_s8(b.lo), vmovl_s8(vget_low_s8(b.hi)), vmovl_high_s8(b.hi)}};
}
/* values 0..15 are v[0], v[1]; 16..31 are v[2], v[3] */
INLINE int32x4_t n16_half_dot(n16_bv w, n16_bv x, int h) {
    int32x4_t a = vmull_s16(vget_low_s16(w.v[2 * h]), vget_low_s16(x.v[2 * h]));
    a = vmlal_high_s16(a, w.v[2 * h], x.v[2 * h]);
    a = vmlal_s16(a, vget_low_s16(w.v[2 * h + 1]), vget_low_s16(x.v[2 * h + 1]));
    return vmlal_high_s16(a, w.v[2 * h + 1], x.v[2 * h + 1]);
}
INLINE void n16_sums_halves(const n16_bv *w, n16_bv x, i32x4 *lo, i32x4 *hi) {
    *lo = ne_total4(n16_half_dot(w[0], x, 0), n16_half_dot(w[1], x, 0), n16_half_dot(w[2], x, 0),
                    n16_half_dot(w[3], x, 0));
    *hi = ne_total4(n16_half_dot(w[0], x, 1), n16_half_dot(w[1], x, 1), n16_half_dot(w[2], x, 1),
                    n16_half_dot(w[3], x, 1));
}
QDOT_KTILES(n16, NEON_ATTR, xblock16_t)
#endif

/* ---------------------------------------------------------------- choosing, and the entry points */

/* The variants this CPU can run, as bits 1 << V_*; bit 0 (no integer kernel: matmul.c decodes the
 * weights to float and keeps x in float32) is always set, and so are the two portable C ones. */
int qdot_variants(void) {
    int mask = 1 | 1 << V_SCALAR | 1 << V_SCALAR16;
#ifdef QDOT_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) mask |= 1 << V_SIMD | 1 << V_SIMD16;
    if ((mask & (1 << V_SIMD)) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"))
        mask |= 1 << V_DOT | 1 << V_DOT16;
#endif
#ifdef QDOT_ARM
    mask |= 1 << V_SIMD | 1 << V_SIMD16;   /* NEON is part of every ARMv8-A */
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) mask |= 1 << V_DOT;   /* sdot has no 16-bit form */
#endif
    return mask;
}

/* The name of variant v (for logs and tests), or "" where it does not exist on this architecture. */
const char *qdot_variant_name(int v) {
    switch (v) {
    case 0: return "float";
    case V_SCALAR: return "scalar";
    case V_SCALAR16: return "scalar-i16";
#ifdef QDOT_X86
    case V_SIMD: return "avx2";
    case V_DOT: return "avx512vnni";
    case V_SIMD16: return "avx2-i16";
    case V_DOT16: return "avx512vnni-i16";
#endif
#ifdef QDOT_ARM
    case V_SIMD: return "neon";
    case V_DOT: return "neon-dotprod";
    case V_SIMD16: return "neon-i16";
#endif
    default: return "";
    }
}

/* ---------------------------------------------------------------- the integer peak
 *
 * What nvllm bench sets the integer kernels beside, as it sets the float ones beside BLAS's sgemm: rounds of
 * independent multiply-accumulates of a variant's own dot instruction (the one its tiles are built on), on
 * registers, so nothing but the instruction's throughput bounds them. An instruction that adds into its
 * accumulator itself (vpdpbusd, vpdpwssd, sdot, smlal, sadalp) waits 3-5 cycles for the one before it into
 * the same register and issues 2-4 a cycle: it takes 10 or more chains in flight to measure its throughput,
 * not its latency (4 gave half of Zen 4's vpdpbusd rate). Those chains share one a and b: the compiler cannot
 * split such an instruction's product from its add. Where it can (AVX2's maddubs + madd, then an add; NEON's
 * smull, then sadalp; the scalar loop), each chain has an a of its own, changed each round by an empty asm,
 * so that no product is shared among chains nor taken out of the loop; there only the add carries from round
 * to round, and fewer chains keep the registers free of spills (4 of AVX2's 16, 8 of NEON's 32). The chains
 * start apart (equal ones would be merged into one), b's value is hidden (a product by 1 or by a zero half
 * would fold), and each iteration is two rounds (gcc 12 copies every accumulator to another register and back
 * once an iteration: 8% of Zen 4's vpdpbusd rate at one round). Check a change with objdump -d: every step's
 * instruction there, and no rsp or sp in these loops. */
#define PEAK_EACH1(F, X, Y) F(0, X, Y)
#define PEAK_EACH4(F, X, Y) F(0, X, Y) F(1, X, Y) F(2, X, Y) F(3, X, Y)
#define PEAK_EACH8(F, X, Y) PEAK_EACH4(F, X, Y) F(4, X, Y) F(5, X, Y) F(6, X, Y) F(7, X, Y)
#define PEAK_EACH12(F, X, Y) PEAK_EACH8(F, X, Y) F(8, X, Y) F(9, X, Y) F(10, X, Y) F(11, X, Y)
#define PEAK_EACH16(F, X, Y) PEAK_EACH12(F, X, Y) F(12, X, Y) F(13, X, Y) F(14, X, Y) F(15, X, Y)
/* Named variables a0, c0, c1, ..., not arrays: gcc keeps an array of vectors that an asm touches in memory.
 * CHAINS: the accumulators c; AS: the a's (CHAINS, or PEAK_EACH1 for one); A(i): chain i's a. */
#define PEAK_OWN(i) a##i
#define PEAK_SHARED(i) a0
#define PEAK_A(i, T, Y) T a##i = b;
#define PEAK_C(i, T, SPLAT) T c##i = SPLAT(i);
#define PEAK_KEEP(i, KEEP, Y) KEEP(a##i);
#define PEAK_STEP(i, STEP, A) c##i = STEP(c##i, A(i), b);
#define PEAK_FOLD(i, XOR, Y) t = XOR(t, c##i);
#define PEAK_ONE(i, X, Y) +1
#define PEAK_BODY(T, CT, CHAINS, AS, A, KEEP, STEP, SPLAT, XOR)                                                        \
    KEEP(b);                                                                                                           \
    AS(PEAK_A, T, _) CHAINS(PEAK_C, CT, SPLAT)                                                                         \
    for (int64_t r = 0; r < reps; r++) {                                                                               \
        AS(PEAK_KEEP, KEEP, _) CHAINS(PEAK_STEP, STEP, A)                                                              \
        AS(PEAK_KEEP, KEEP, _) CHAINS(PEAK_STEP, STEP, A)                                                              \
    }                                                                                                                  \
    CT t = SPLAT(0);                                                                                                   \
    CHAINS(PEAK_FOLD, XOR, _)                                                                                          \
    KEEP(t);                                                                                                           \
    const int64_t steps = 2 * (0 CHAINS(PEAK_ONE, _, _));   /* an iteration's: two rounds of every chain */

#ifdef QDOT_X86
#define X86_KEEP(a) __asm__ volatile("" : "+x"(a))
#define X86_PEAK(NAME, ATTR, MACS, STEP, CHAINS, AS, A)                                                                \
    ATTR static int64_t NAME(int64_t reps, const uint8_t *seed) {                                                      \
        __m256i b = _mm256_loadu_si256((const __m256i *)seed);                                                         \
        PEAK_BODY(__m256i, __m256i, CHAINS, AS, A, X86_KEEP, STEP, _mm256_set1_epi32, _mm256_xor_si256)                \
        return reps * steps * (MACS);                                                                                  \
    }
#define AV_STEP(c, a, b) _mm256_add_epi32((c), _mm256_madd_epi16(_mm256_maddubs_epi16((a), (b)), _mm256_set1_epi16(1)))
#define AV16_STEP(c, a, b) _mm256_add_epi32((c), _mm256_madd_epi16((a), (b)))
X86_PEAK(av_peak, AVX2_ATTR, 32, AV_STEP, PEAK_EACH4, PEAK_EACH4, PEAK_OWN)
X86_PEAK(av16_peak, AVX2_ATTR, 16, AV16_STEP, PEAK_EACH4, PEAK_EACH4, PEAK_OWN)
X86_PEAK(vn_peak, VNNI_ATTR, 32, _mm256_dpbusd_epi32, PEAK_EACH12, PEAK_EACH1, PEAK_SHARED)
X86_PEAK(vn16_peak, VNNI_ATTR, 16, _mm256_dpwssd_epi32, PEAK_EACH12, PEAK_EACH1, PEAK_SHARED)
#endif

#ifdef QDOT_ARM
#define ARM_KEEP(a) __asm__ volatile("" : "+w"(a))
#define ARM_PEAK(NAME, ATTR, MACS, T, LOAD, STEP, CHAINS, AS, A)                                                       \
    ATTR static int64_t NAME(int64_t reps, const uint8_t *seed) {                                                      \
        T b = LOAD(seed);                                                                                              \
        PEAK_BODY(T, int32x4_t, CHAINS, AS, A, ARM_KEEP, STEP, vdupq_n_s32, veorq_s32)                                 \
        return reps * steps * (MACS);                                                                                  \
    }
#define NE_LOAD8(p) vld1q_s8((const int8_t *)(p))
#define NE_LOAD16(p) vld1q_s16((const int16_t *)(p))
/* plain NEON's 8-bit product is smull + a pairwise add (16 products); 16-bit, smlal and smlal2 (8) */
#define NE_STEP(c, a, b) vpadalq_s16((c), vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), (a), (b)))
#define N16_STEP(c, a, b) vmlal_high_s16(vmlal_s16((c), vget_low_s16(a), vget_low_s16(b)), (a), (b))
ARM_PEAK(ne_peak, NEON_ATTR, 16, int8x16_t, NE_LOAD8, NE_STEP, PEAK_EACH8, PEAK_EACH8, PEAK_OWN)
ARM_PEAK(n16_peak, NEON_ATTR, 8, int16x8_t, NE_LOAD16, N16_STEP, PEAK_EACH16, PEAK_EACH1, PEAK_SHARED)
ARM_PEAK(sd_peak, SDOT_ATTR, 16, int8x16_t, NE_LOAD8, vdotq_s32, PEAK_EACH16, PEAK_EACH1, PEAK_SHARED)
#endif

/* The portable variants' own loop: what the compiler makes of int32 multiply-accumulates. Each sum is hidden
 * after its step, or c + a * b + a' * b is made c + (a + a') * b, one product for two. */
#define SCALAR_KEEP(a) __asm__ volatile("" : "+r"(a))
static inline int32_t scalar_step(int32_t c, int32_t a, int32_t b) {
    c += a * b;
    SCALAR_KEEP(c);
    return c;
}
static int64_t scalar_peak(int64_t reps, const uint8_t *seed) {
    int32_t b = (int8_t)seed[0];
#define SCALAR_SPLAT(i) (i)
#define SCALAR_XOR(t, c) ((t) ^ (c))
    PEAK_BODY(int32_t, int32_t, PEAK_EACH4, PEAK_EACH4, PEAK_OWN, SCALAR_KEEP, scalar_step, SCALAR_SPLAT, SCALAR_XOR)
    return reps * steps;
}

/* `reps` iterations of variant v's peak loop; returns the multiply-accumulates made (0 for a variant this machine
 * does not run). */
int64_t qdot_peak(int v, int64_t reps) {
    static const uint8_t seed[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    if (v <= 0 || v > V_DOT16 || !(qdot_variants() >> v & 1) || reps <= 0) return 0;
    switch (v) {
#ifdef QDOT_X86
    case V_SIMD: return av_peak(reps, seed);
    case V_SIMD16: return av16_peak(reps, seed);
    case V_DOT: return vn_peak(reps, seed);
    case V_DOT16: return vn16_peak(reps, seed);
#endif
#ifdef QDOT_ARM
    case V_SIMD: return ne_peak(reps, seed);
    case V_SIMD16: return n16_peak(reps, seed);
    case V_DOT: return sd_peak(reps, seed);
#endif
    default: return scalar_peak(reps, seed);
    }
}

/* qdot_peak on the matmul pool's threads (matmul_pool_run): part p runs job->reps rounds into job->done[p]. */
#define PEAK_PARTS 64   /* matmul.c's MAX_THREADS, and matmul.py's _PeakJob */
typedef struct {
    int v;
    int64_t reps;
    int64_t done[PEAK_PARTS];
} peak_job_t;
void qdot_peak_part(void *arg, int part) {
    peak_job_t *j = (peak_job_t *)arg;
    if (part >= 0 && part < PEAK_PARTS) j->done[part] = qdot_peak(j->v, j->reps);
}

static int chosen = -1;   /* the variant in use; -1 until the first call picks the best */

/* Makes the formats with integer kernels use variant v (a bit of qdot_variants; 0: float) from the next
 * call on and returns v, or -1 if this machine cannot run it; a negative v changes nothing and returns
 * the variant in use: unless set, the fastest 16-bit SIMD one, or 0 where there is none (x86-64 without
 * AVX2). */
int qdot_variant(int v) {
    if (v >= 0) {
        if (v > V_DOT16 || !(qdot_variants() >> v & 1)) return -1;
        __atomic_store_n(&chosen, v, __ATOMIC_RELAXED);
        return v;
    }
    int c = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (c < 0) {
        const int mask = qdot_variants();
        /* 16-bit x: the 8-bit one moves too many top-1 tokens of a small model (docs in the header). The
         * portable C is the reference the tests hold the others to, but slower than decoding to float
         * (matmul.c's tiles, which the compiler vectorises): a CPU with neither kind of SIMD gets that */
        c = mask & (1 << V_DOT16) ? V_DOT16 : mask & (1 << V_SIMD16) ? V_SIMD16 : 0;
        __atomic_store_n(&chosen, c, __ATOMIC_RELAXED);
    }
    return c;
}

INLINE int wide(int v) { return v >= V_SCALAR16; }   /* variant v takes x in 16-bit blocks */

/* 1 where variant v's kernels for fmt take each 16-bit block of x as its even values, then its odd ones (the
 * x86 K-quant tiles: their weights' quants come out of 16-bit pairs of bytes that way); the integer sums,
 * and so every result, are the same in any order of a block's values. */
#ifdef QDOT_X86
#define K_EVEN_ODD(v, fmt)                                                                                             \
    (((v) == V_SIMD16 || (v) == V_DOT16) &&                                                                            \
     ((fmt) == Q4_K || (fmt) == Q5_K || (fmt) == Q6_K || (fmt) == Q2_K || (fmt) == Q3_K))
#else
#define K_EVEN_ODD(v, fmt) 0
#endif

/* 1 if variant v (one of qdot_variants, not 0) has an integer kernel for fmt. */
int qdot_format(int fmt, int v) {
    return v > 0 && (fmt == Q8_0 || fmt == Q4_0 || fmt == Q4_1 || fmt == Q5_0 || fmt == Q5_1 || fmt == Q4_K ||
                     fmt == Q5_K || fmt == Q6_K || fmt == Q2_K || fmt == Q3_K || fmt == IQ4_NL || fmt == IQ4_XS);
}

/* Bytes the rows of x quantized for variant v take: T rows of in / 32 blocks. */
size_t qdot_x_bytes(int v, int64_t T, int64_t in) {
    return (size_t)T * (size_t)(in / 32) * (wide(v) ? sizeof(xblock16_t) : sizeof(xblock_t));
}

/* Rows t0 .. t0+tn of x (row stride x_stride floats, `in` a multiple of 32) into qx for variant v and weights
 * in format fmt, laid out as qdot_x_bytes counts (and K_EVEN_ODD orders a block): each row on its own, so its
 * blocks do not depend on the others. */
void qdot_quantize_x(int v, int fmt, const float *x, int64_t x_stride, int64_t in, int64_t t0, int64_t tn,
                     void *qx) {
    const int64_t nb = in / 32;
    const int even_odd = K_EVEN_ODD(v, fmt);
    for (int64_t t = t0; t < t0 + tn; t++)
        for (int64_t b = 0; b < nb; b++) {
            if (wide(v)) {
                xblock16_t *xb = (xblock16_t *)qx + t * nb + b;
                quantize_block16(x + t * x_stride + 32 * b, xb);
                if (even_odd) {
                    int16_t q[32];
                    for (int j = 0; j < 16; j++) q[j] = xb->q[2 * j], q[16 + j] = xb->q[2 * j + 1];
                    memcpy(xb->q, q, sizeof q);
                }
            } else quantize_block(x + t * x_stride + 32 * b, (xblock_t *)qx + t * nb + b);
        }
}

#define QDOT_TT 64   /* rows of x per pass over a range of W's rows: their quantized blocks stay in L2 */

/* y[t, r] for rows r0 .. r1 of W and every row t of x (qx from qdot_quantize_x for the same v), with
 * variant v (one qdot_variants allows). y has row stride y_stride. */
void qdot_rows(int v, int fmt, const uint8_t *w, int64_t row_bytes, int64_t in, int64_t r0, int64_t r1,
               const void *qx, int64_t T, float *y, int64_t y_stride) {
    const xblock_t *x = (const xblock_t *)qx;
    const xblock16_t *x16 = (const xblock16_t *)qx;
    const int64_t nb = in / 32;
    for (int64_t t0 = 0; t0 < T; t0 += QDOT_TT) {
        const int64_t tn = T - t0 < QDOT_TT ? T - t0 : QDOT_TT;
        if (fmt == Q4_K || fmt == Q5_K || fmt == Q6_K || fmt == Q2_K || fmt == Q3_K || fmt == IQ4_XS) {
            switch (v) {
#ifdef QDOT_X86
            case V_DOT16: vn16_krows(fmt, w, row_bytes, nb, r0, r1, x16, t0, tn, y, y_stride); break;
            case V_SIMD16: av16_krows(fmt, w, row_bytes, nb, r0, r1, x16, t0, tn, y, y_stride); break;
            case V_DOT: vn_krows(fmt, w, row_bytes, nb, r0, r1, x, t0, tn, y, y_stride); break;
            case V_SIMD: av_krows(fmt, w, row_bytes, nb, r0, r1, x, t0, tn, y, y_stride); break;
#endif
#ifdef QDOT_ARM
            case V_SIMD16: n16_krows(fmt, w, row_bytes, nb, r0, r1, x16, t0, tn, y, y_stride); break;
            case V_DOT: sd_krows(fmt, w, row_bytes, nb, r0, r1, x, t0, tn, y, y_stride); break;
            case V_SIMD: ne_krows(fmt, w, row_bytes, nb, r0, r1, x, t0, tn, y, y_stride); break;
#endif
            case V_SCALAR16: s16_krows(fmt, w, row_bytes, nb, r0, r1, x16, t0, tn, y, y_stride); break;
            default: sc_krows(fmt, w, row_bytes, nb, r0, r1, x, t0, tn, y, y_stride); break;
            }
            continue;
        }
        switch (v) {
#ifdef QDOT_X86
        case V_DOT: vn_rows(fmt, w, row_bytes, nb, r0, r1, x, t0, tn, y, y_stride); break;
        case V_SIMD: av_rows(fmt, w, row_bytes, nb, r0, r1, x, t0, tn, y, y_stride); break;
        case V_DOT16: vn16_rows(fmt, w, row_bytes, nb, r0, r1, x16, t0, tn, y, y_stride); break;
        case V_SIMD16: av16_rows(fmt, w, row_bytes, nb, r0, r1, x16, t0, tn, y, y_stride); break;
#endif
#ifdef QDOT_ARM
        case V_DOT: sd_rows(fmt, w, row_bytes, nb, r0, r1, x, t0, tn, y, y_stride); break;
        case V_SIMD: ne_rows(fmt, w, row_bytes, nb, r0, r1, x, t0, tn, y, y_stride); break;
        case V_SIMD16: n16_rows(fmt, w, row_bytes, nb, r0, r1, x16, t0, tn, y, y_stride); break;
#endif
        case V_SCALAR16: s16_rows(fmt, w, row_bytes, nb, r0, r1, x16, t0, tn, y, y_stride); break;
        default: sc_rows(fmt, w, row_bytes, nb, r0, r1, x, t0, tn, y, y_stride); break;
        }
    }
}
