/* What dot_neon.c and dot_dotprod.c share (aarch64 only): a strip's weights unpacked to int8 "lane
 * layout", its scales as float vectors, and the driver that walks panels, strips and rows of x. Each file
 * includes this after defining its own integer products (see ARM_SUMS below), so the unpacking and the
 * float arithmetic exist once, compiled for each file's target.
 *
 * Lane layout of a unit (32 values of 8 rows): 16 vectors w[2 g + h8], g = 0..7 the group of values
 * 4 g .. 4 g + 3, h8 = 0 for rows 0..3, 1 for rows 4..7; byte 4 r + k of w[2 g + h8] is value 4 g + k of
 * row 4 h8 + r. Group g meets x's bytes 4 g .. 4 g + 3: lane g % 4 of the 16-byte load of x's values
 * 16 (g / 4) ..; groups 0..3 are a unit's first half (values 0..15), 4..7 its second. The weights are the
 * file's integer quants plus a per-format offset `off` (a constant, so that nibbles need no subtraction):
 * p = sum (w - off) q = sum w q - off * (sum of x's quants), exact in int32 either way.
 *
 * The float work is packed.h's (the twin's order): per unit and x row, acc = acc + (dw * dx) * (float)p,
 * then the min term; separate multiplies and adds, never fused (fp-contract is off here).
 */
#ifndef NVLLM_DOT_ARM_H
#define NVLLM_DOT_ARM_H

#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>

#include "packed.h"
#include "peak.h"

#pragma GCC optimize("fp-contract=off", "no-schedule-insns")

#define ARM_INLINE static inline __attribute__((always_inline))
#define ARM_KEEP(a) __asm__ volatile("" : "+w"(a))   /* the peak's: a register the compiler must not see through */

/* The float scales of a strip, per unit u, half h (0 where a unit has one scale) and row half h8. */
typedef struct {
    float32x4_t dw[8][2][2];
    float32x4_t mw[8][2];       /* Q4_1, Q5_1, Q4_K, Q5_K: the min, per unit */
    float32x4_t hmw[8][2][2];   /* Q2_K: each half's min */
} arm_scales_t;

ARM_INLINE int arm_halves(const int fmt) { return fmt == Q6_K || fmt == Q3_K || fmt == Q2_K; }
ARM_INLINE int arm_min32(const int fmt) { return fmt == Q4_1 || fmt == Q5_1 || fmt == Q4_K || fmt == Q5_K; }
/* The offset the unpacked weights carry (w = quant + off). */
ARM_INLINE int arm_off(const int fmt) {
    switch (fmt) {
    case Q4_0: return 8;
    case Q5_1: return -16;   /* Q5's weights are unpacked as nib + 16 bit - 16 (Q5_0's own quants) */
    case Q6_K: return 32;
    case Q3_K: return 4;
    default: return 0;
    }
}

/* 8 fp16 values side by side (a d, m or dmin field: rows 0..7) as two float vectors. */
ARM_INLINE void arm_halves8(const uint8_t *p, float32x4_t f[2]) {
    const float16x8_t h = vreinterpretq_f16_u8(vld1q_u8(p));
    f[0] = vcvt_f32_f16(vget_low_f16(h));
    f[1] = vcvt_high_f32_f16(h);
}

/* Byte j of each 32-bit lane of v, zero-extended (tbl: an index of 255 reads 0). */
static const uint8_t arm_lane_byte[4][16] = {
    {0, 255, 255, 255, 4, 255, 255, 255, 8, 255, 255, 255, 12, 255, 255, 255},
    {1, 255, 255, 255, 5, 255, 255, 255, 9, 255, 255, 255, 13, 255, 255, 255},
    {2, 255, 255, 255, 6, 255, 255, 255, 10, 255, 255, 255, 14, 255, 255, 255},
    {3, 255, 255, 255, 7, 255, 255, 255, 11, 255, 255, 255, 15, 255, 255, 255}};
/* Byte j of each lane at the lane's top (a signed byte, then converted with 24 fraction bits). */
static const uint8_t arm_lane_top[4][16] = {
    {255, 255, 255, 0, 255, 255, 255, 4, 255, 255, 255, 8, 255, 255, 255, 12},
    {255, 255, 255, 1, 255, 255, 255, 5, 255, 255, 255, 9, 255, 255, 255, 13},
    {255, 255, 255, 2, 255, 255, 255, 6, 255, 255, 255, 10, 255, 255, 255, 14},
    {255, 255, 255, 3, 255, 255, 255, 7, 255, 255, 255, 11, 255, 255, 255, 15}};

ARM_INLINE float32x4_t arm_ubyte_f(uint8x16_t v, int j) {
    return vcvtq_f32_u32(vreinterpretq_u32_u8(vqtbl1q_u8(v, vld1q_u8(arm_lane_byte[j]))));
}
ARM_INLINE float32x4_t arm_sbyte_f(uint8x16_t v, int j) {
    return vcvtq_n_f32_s32(vreinterpretq_s32_u8(vqtbl1q_u8(v, vld1q_u8(arm_lane_top[j]))), 24);
}

/* Scales computed in C, sc[k][row] (k: unit for one scale per unit, 2 u + h for halves), times d. */
ARM_INLINE void arm_int_scales(const int32_t sc[16][PANEL], int nk, const float32x4_t d[2], float32x4_t *out) {
    for (int k = 0; k < nk; k++)
        for (int h8 = 0; h8 < 2; h8++) out[2 * k + h8] = vmulq_f32(d[h8], vcvtq_f32_s32(vld1q_s32(&sc[k][4 * h8])));
}

/* A strip's scales (only what its format uses is written). */
ARM_INLINE void arm_scales(const int fmt, const uint8_t *strip, arm_scales_t *sc) {
    float32x4_t d[2], m[2];
    switch (fmt) {
    case Q4_0: case Q5_0: case Q8_0: case IQ4_NL:
        arm_halves8(strip, d);
        sc->dw[0][0][0] = d[0], sc->dw[0][0][1] = d[1];
        break;
    case Q4_1: case Q5_1:
        arm_halves8(strip, d);
        arm_halves8(strip + PANEL * 2, m);
        sc->dw[0][0][0] = d[0], sc->dw[0][0][1] = d[1];
        sc->mw[0][0] = m[0], sc->mw[0][1] = m[1];
        break;
    case Q4_K: case Q5_K: {
        arm_halves8(strip, d);
        arm_halves8(strip + PANEL * K_DMIN, m);
        m[0] = vnegq_f32(m[0]), m[1] = vnegq_f32(m[1]);   /* -(dmin * mn) = (-dmin) * mn, exactly */
        const uint8x16_t m63 = vdupq_n_u8(63), m15 = vdupq_n_u8(15);
        for (int h8 = 0; h8 < 2; h8++) {
            const uint8_t *s = strip + PANEL * K_SCALES + 16 * h8;   /* chunks: bytes 0..3, 4..7, 8..11 */
            const uint8x16_t A = vld1q_u8(s), B = vld1q_u8(s + 32), C = vld1q_u8(s + 64);
            const uint8x16_t sc_lo = vandq_u8(A, m63), mn_lo = vandq_u8(B, m63);
            const uint8x16_t sc_hi = vbslq_u8(m15, C, vshrq_n_u8(A, 2));   /* (C & 15) | (A >> 6) << 4 */
            const uint8x16_t mn_hi = vsriq_n_u8(vshrq_n_u8(B, 2), C, 4);   /* (C >> 4) | (B >> 6) << 4 */
            for (int j = 0; j < 4; j++) {
                sc->dw[j][0][h8] = vmulq_f32(d[h8], arm_ubyte_f(sc_lo, j));
                sc->dw[4 + j][0][h8] = vmulq_f32(d[h8], arm_ubyte_f(sc_hi, j));
                sc->mw[j][h8] = vmulq_f32(m[h8], arm_ubyte_f(mn_lo, j));
                sc->mw[4 + j][h8] = vmulq_f32(m[h8], arm_ubyte_f(mn_hi, j));
            }
        }
        break;
    }
    case Q6_K:
        arm_halves8(strip + PANEL * Q6_K_D, d);
        for (int h8 = 0; h8 < 2; h8++)
            for (int c = 0; c < 4; c++) {   /* chunk c: scales 4 c .. 4 c + 3, of units 2 c, 2 c + 1 */
                const uint8x16_t v = vld1q_u8(strip + PANEL * Q6_K_SCALES + 32 * c + 16 * h8);
                for (int j = 0; j < 4; j++) sc->dw[2 * c + j / 2][j % 2][h8] = vmulq_f32(d[h8], arm_sbyte_f(v, j));
            }
        break;
    case Q2_K: {
        arm_halves8(strip + PANEL * Q2_K_D, d);
        arm_halves8(strip + PANEL * Q2_K_DMIN, m);
        m[0] = vnegq_f32(m[0]), m[1] = vnegq_f32(m[1]);
        for (int h8 = 0; h8 < 2; h8++)
            for (int c = 0; c < 4; c++) {
                const uint8x16_t v = vld1q_u8(strip + 32 * c + 16 * h8);
                for (int j = 0; j < 4; j++) {
                    const uint32x4_t b = vreinterpretq_u32_u8(vqtbl1q_u8(v, vld1q_u8(arm_lane_byte[j])));
                    sc->dw[2 * c + j / 2][j % 2][h8] = vmulq_f32(d[h8], vcvtq_f32_u32(vandq_u32(b, vdupq_n_u32(15))));
                    sc->hmw[2 * c + j / 2][j % 2][h8] = vmulq_f32(m[h8], vcvtq_f32_u32(vshrq_n_u32(b, 4)));
                }
            }
        break;
    }
    case Q3_K: {   /* the 6-bit scales in C (a rarer format), then converted as vectors */
        int32_t s[16][PANEL];
        arm_halves8(strip + PANEL * Q3_K_D, d);
        for (int r = 0; r < PANEL; r++) {
            uint8_t b[12];
            for (int k = 0; k < 12; k++) b[k] = *strip_byte(strip, Q3_K_SCALES, 12, r, k);
            for (int k = 0; k < 16; k++) s[k][r] = scale_q3_k(b, k);
        }
        arm_int_scales(s, 16, d, &sc->dw[0][0][0]);
        break;
    }
    case IQ4_XS: {
        int32_t s[16][PANEL];
        arm_halves8(strip, d);
        for (int r = 0; r < PANEL; r++) {
            uint8_t b[IQ4_XS_QS];
            for (int k = 0; k < 2; k++) b[IQ4_XS_SCALES_H + k] = *strip_byte(strip, IQ4_XS_SCALES_H, 2, r, k);
            for (int k = 0; k < 4; k++) b[IQ4_XS_SCALES_L + k] = *strip_byte(strip, IQ4_XS_SCALES_L, 4, r, k);
            for (int u = 0; u < 8; u++) s[u][r] = scale_iq4_xs(b, u);
        }
        float32x4_t t[16];
        arm_int_scales(s, 8, d, t);
        for (int u = 0; u < 8; u++) sc->dw[u][0][0] = t[2 * u], sc->dw[u][0][1] = t[2 * u + 1];
        break;
    }
    default: break;
    }
}

/* Q5_0/Q5_1's fifth bits: each 32-bit lane of qh is a row's; group c's values 4 c + k are bits of byte
 * c / 2 (the high nibbles' group c + 4: byte 2 + c / 2), bit 4 (c % 2) + k. */
static const uint8_t arm_q5_idx[4][16] = {
    {0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12},
    {1, 1, 1, 1, 5, 5, 5, 5, 9, 9, 9, 9, 13, 13, 13, 13},
    {2, 2, 2, 2, 6, 6, 6, 6, 10, 10, 10, 10, 14, 14, 14, 14},
    {3, 3, 3, 3, 7, 7, 7, 7, 11, 11, 11, 11, 15, 15, 15, 15}};
static const uint8_t arm_q5_bit[2][16] = {{1, 2, 4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 1, 2, 4, 8},
                                          {16, 32, 64, 128, 16, 32, 64, 128, 16, 32, 64, 128, 16, 32, 64, 128}};

/* Unit u of a strip in lane layout: w[2 g + h8] (the weights plus arm_off(fmt)). */
ARM_INLINE void arm_unpack(const int fmt, const uint8_t *strip, const int u, int8x16_t *w) {
    const uint8x16_t m15 = vdupq_n_u8(15);
#define ARM_LD(p) vld1q_u8(p)
#define ARM_W(i, v) (w[i] = vreinterpretq_s8_u8(v))
    switch (fmt) {
    case Q8_0:
        for (int i = 0; i < 16; i++) w[i] = vld1q_s8((const int8_t *)strip + PANEL * Q8_0_QS + 16 * i);
        break;
    case Q4_0: case Q4_1: case IQ4_NL: case IQ4_XS: {
        const uint8_t *qs = strip + PANEL * (fmt == Q4_1 ? Q4_1_QS : fmt == IQ4_XS ? IQ4_XS_QS + 16 * u : Q4_0_QS);
        for (int i = 0; i < 8; i++) {   /* chunk c = i / 2: values 4 c + k (low nibbles) and 16 + 4 c + k */
            const uint8x16_t v = ARM_LD(qs + 16 * i);
            uint8x16_t lo = vandq_u8(v, m15), hi = vshrq_n_u8(v, 4);
            if (fmt == IQ4_NL || fmt == IQ4_XS) {
                const uint8x16_t table = vld1q_u8((const uint8_t *)iq4_values);
                lo = vqtbl1q_u8(table, lo), hi = vqtbl1q_u8(table, hi);
            }
            ARM_W(i, lo), ARM_W(8 + i, hi);
        }
        break;
    }
    case Q5_0: case Q5_1: {   /* nib + 16 bit - 16: the high nibble 15 where the bit is 0, else 0 */
        const uint8_t *qh = strip + PANEL * (fmt == Q5_0 ? Q5_0_QH : Q5_1_QH);
        const uint8_t *qs = strip + PANEL * (fmt == Q5_0 ? Q5_0_QS : Q5_1_QS);
        for (int h8 = 0; h8 < 2; h8++) {
            const uint8x16_t nh = vmvnq_u8(ARM_LD(qh + 16 * h8));
            for (int c = 0; c < 4; c++) {
                const uint8x16_t v = ARM_LD(qs + 32 * c + 16 * h8), bit = vld1q_u8(arm_q5_bit[c % 2]);
                const uint8x16_t zl = vtstq_u8(vqtbl1q_u8(nh, vld1q_u8(arm_q5_idx[c / 2])), bit);
                const uint8x16_t zh = vtstq_u8(vqtbl1q_u8(nh, vld1q_u8(arm_q5_idx[2 + c / 2])), bit);
                ARM_W(2 * c + h8, vbslq_u8(m15, v, zl));
                ARM_W(2 * (c + 4) + h8, vsriq_n_u8(zh, v, 4));
            }
        }
        break;
    }
    case Q4_K: {
        const uint8_t *qs = strip + PANEL * Q4_K_QS + 256 * (u / 2);
        for (int i = 0; i < 16; i++) {
            const uint8x16_t v = ARM_LD(qs + 16 * i);
            ARM_W(i, u % 2 ? vshrq_n_u8(v, 4) : vandq_u8(v, m15));
        }
        break;
    }
    case Q5_K: {
        const uint8_t *qs = strip + PANEL * Q5_K_QS + 256 * (u / 2), *qh = strip + PANEL * Q5_K_QH;
        const int8x16_t up = vdupq_n_s8((int8_t)(4 - u));   /* bit u of qh to bit 4 */
        const uint8x16_t m16 = vdupq_n_u8(16);
        for (int i = 0; i < 16; i++) {
            const uint8x16_t v = ARM_LD(qs + 16 * i), hb = vandq_u8(vshlq_u8(ARM_LD(qh + 16 * i), up), m16);
            ARM_W(i, u % 2 ? vsriq_n_u8(hb, v, 4) : vbslq_u8(m15, v, hb));
        }
        break;
    }
    case Q6_K: {   /* unit 4 n + k: ql chunks 16 n + 8 (k % 2) + g, nibble k / 2; qh chunks 8 n + g, bits 2 k, 2 k + 1 */
        const int n = u / 4, k = u % 4;
        const uint8_t *ql = strip + 256 * (2 * n + k % 2), *qh = strip + PANEL * Q6_K_QH + 256 * n;
        if (k < 2) {
            const int8x16_t down = vdupq_n_s8((int8_t)(-2 * k));
            const uint8x16_t m3 = vdupq_n_u8(3);
            for (int i = 0; i < 16; i++)
                ARM_W(i, vsliq_n_u8(ARM_LD(ql + 16 * i), vandq_u8(vshlq_u8(ARM_LD(qh + 16 * i), down), m3), 4));
        } else {
            const int8x16_t sh = vdupq_n_s8((int8_t)(4 - 2 * k));
            const uint8x16_t m48 = vdupq_n_u8(48);
            for (int i = 0; i < 16; i++)
                ARM_W(i, vsriq_n_u8(vandq_u8(vshlq_u8(ARM_LD(qh + 16 * i), sh), m48), ARM_LD(ql + 16 * i), 4));
        }
        break;
    }
    case Q2_K: case Q3_K: {   /* unit 4 n + k: crumb k of qs chunks 8 n + g; Q3_K: bit u of hmask chunk g, as 4 */
        const int n = u / 4, k = u % 4;
        const uint8_t *qs = strip + PANEL * (fmt == Q2_K ? Q2_K_QS : Q3_K_QS) + 256 * n;
        const int8x16_t down = vdupq_n_s8((int8_t)(-2 * k)), hup = vdupq_n_s8((int8_t)(2 - u));
        const uint8x16_t m3 = vdupq_n_u8(3), m4 = vdupq_n_u8(4);
        for (int i = 0; i < 16; i++) {
            uint8x16_t q = vandq_u8(vshlq_u8(ARM_LD(qs + 16 * i), down), m3);
            if (fmt == Q3_K) q = vorrq_u8(q, vandq_u8(vshlq_u8(ARM_LD(strip + 16 * i), hup), m4));
            ARM_W(i, q);
        }
        break;
    }
    default: break;
    }
#undef ARM_LD
#undef ARM_W
}

/* x's block: d, s and the half sums sit where both xq8_t and xq16_t have them. */
ARM_INLINE float arm_xd(const uint8_t *xb) { return ((const xq8_t *)xb)->d; }
ARM_INLINE float arm_xs(const uint8_t *xb) { return ((const xq8_t *)xb)->s; }
ARM_INLINE int32_t arm_xsum(const uint8_t *xb, int h) { return ((const xq8_t *)xb)->sum[h]; }

/* One unit's products p (s[2 h + h8]: half h, rows 4 h8 ..) into one row of x's accumulators. */
ARM_INLINE void arm_update(const int fmt, const arm_scales_t *sc, int u, const int32x4_t s[4], const uint8_t *xb,
                           float32x4_t acc[2]) {
    const float dx = arm_xd(xb);
    const int off = arm_off(fmt);
    if (arm_halves(fmt)) {
        for (int h = 0; h < 2; h++) {
            const int32x4_t o = vdupq_n_s32(off * arm_xsum(xb, h));
            for (int h8 = 0; h8 < 2; h8++) {
                const int32x4_t p = off ? vsubq_s32(s[2 * h + h8], o) : s[2 * h + h8];
                acc[h8] = vaddq_f32(acc[h8], vmulq_f32(vmulq_n_f32(sc->dw[u][h][h8], dx), vcvtq_f32_s32(p)));
            }
        }
        if (fmt == Q2_K)
            for (int h = 0; h < 2; h++) {
                const float32x4_t sh = vdupq_n_f32((float)arm_xsum(xb, h));
                for (int h8 = 0; h8 < 2; h8++)
                    acc[h8] = vaddq_f32(acc[h8], vmulq_f32(vmulq_n_f32(sc->hmw[u][h][h8], dx), sh));
            }
    } else {
        const int32x4_t o = vdupq_n_s32(off * (arm_xsum(xb, 0) + arm_xsum(xb, 1)));
        for (int h8 = 0; h8 < 2; h8++) {
            int32x4_t p = vaddq_s32(s[h8], s[2 + h8]);
            if (off) p = vsubq_s32(p, o);
            acc[h8] = vaddq_f32(acc[h8], vmulq_f32(vmulq_n_f32(sc->dw[u][0][h8], dx), vcvtq_f32_s32(p)));
            if (arm_min32(fmt)) acc[h8] = vaddq_f32(acc[h8], vmulq_n_f32(sc->mw[u][h8], arm_xs(xb)));
        }
    }
}

/* A panel's 8 outputs for x row t, only the live rows stored. */
ARM_INLINE void arm_store(float *y, const float32x4_t acc[2], int live) {
    if (live >= PANEL) {
        vst1q_f32(y, acc[0]), vst1q_f32(y + 4, acc[1]);
        return;
    }
    float t[PANEL];
    vst1q_f32(t, acc[0]), vst1q_f32(t + 4, acc[1]);
    for (int r = 0; r < live; r++) y[r] = t[r];
}

#endif

/* ---------------------------------------------------------------- the driver, once per including file
 * The file defines, before including this header:
 *   ARM_SUMS(w, xb, wide, halves, s)    s[4] = one unit's products with the x block at xb (1 row); where
 *                                       !halves only s[0] + s[2] and s[1] + s[3] matter;
 *   ARM_SUMS_N(w, xb, xstride, wide, halves, nr, s)  the same for nr rows of x at once (s[nr][4]), xstride
 *                                       bytes apart;
 *   ARM_NR_8, ARM_NR_16, ARM_NR_MAX     rows of x per pass for int8 and exact x, the larger;
 *   ARM_PREFIX                          the kernel functions' prefix (neon, dotprod). */
#if defined(ARM_PREFIX) && !defined(NVLLM_DOT_ARM_DRIVER)
#define NVLLM_DOT_ARM_DRIVER

#define ARM_TB 64          /* rows of x whose accumulators a pass over a panel keeps */
#define ARM_PREFETCH 1024  /* bytes ahead of the strip being read */

ARM_INLINE void arm_panels(const int fmt, const int wide, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1,
                           const void *qx, int64_t T, float *y, int64_t ys, int64_t rows) {
    const int units = block_elems(fmt) / 32;
    const int64_t sb = (int64_t)PANEL * block_bytes(fmt), nx = nb * units;
    const size_t xs = wide ? sizeof(xq16_t) : sizeof(xq8_t);
    const uint8_t *x = (const uint8_t *)qx;
    if (T == 1) {   /* decode: the weights streamed once, the strip's units straight from loads to products */
        for (int64_t p = p0; p < p1; p++) {
            float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
            const uint8_t *strip = packed + p * nb * sb;
            for (int64_t b = 0; b < nb; b++, strip += sb) {
#pragma GCC unroll 32
                for (int64_t o = 0; o < sb; o += 64) __builtin_prefetch(strip + ARM_PREFETCH + o);
                arm_scales_t sc;
                arm_scales(fmt, strip, &sc);
                /* unrolled: every offset a constant, and the loads units share (Q4_K's pairs, Q6_K's qh) made once */
#pragma GCC unroll 8
                for (int u = 0; u < units; u++) {
                    const uint8_t *xb = x + (size_t)(b * units + u) * xs;
                    int8x16_t w[16];
                    int32x4_t s[4];
                    arm_unpack(fmt, strip, u, w);
                    ARM_SUMS(w, xb, wide, arm_halves(fmt), s);
                    arm_update(fmt, &sc, u, s, xb, acc);
                    /* the next unit loads its bytes again (from L1) rather than keeping shared ones in registers */
                    __asm__ volatile("" ::: "memory");
                }
            }
            arm_store(y + p * PANEL, acc, (int)(rows - p * PANEL));
        }
        return;
    }
    /* prefill: each strip unpacked once into L1, then every row of x served from it, NR rows at a time */
    const int NR = wide ? ARM_NR_16 : ARM_NR_8;
    int8x16_t wb[8][16];
    float32x4_t accb[ARM_TB][2];
    for (int64_t p = p0; p < p1; p++)
        for (int64_t t0 = 0; t0 < T; t0 += ARM_TB) {
            const int tn = T - t0 < ARM_TB ? (int)(T - t0) : ARM_TB;
            for (int t = 0; t < tn; t++) accb[t][0] = accb[t][1] = vdupq_n_f32(0.0f);
            const uint8_t *strip = packed + p * nb * sb;
            for (int64_t b = 0; b < nb; b++, strip += sb) {
                if (t0 == 0)   /* as one row's: a few rows of x do not hide the strips' loads from DRAM */
                    for (int64_t o = 0; o < sb; o += 64) __builtin_prefetch(strip + ARM_PREFETCH + o);
                arm_scales_t sc;
                arm_scales(fmt, strip, &sc);
                for (int u = 0; u < units; u++) arm_unpack(fmt, strip, u, wb[u]);
                for (int u = 0; u < units; u++) {
                    const uint8_t *xu = x + (size_t)((t0 * nx) + b * units + u) * xs;
                    const size_t xstride = (size_t)nx * xs;
                    int t = 0;
                    for (; t + NR <= tn; t += NR) {
                        int32x4_t s[ARM_NR_MAX][4];
                        if (wide) ARM_SUMS_N(wb[u], xu + t * xstride, xstride, 1, arm_halves(fmt), ARM_NR_16, s);
                        else ARM_SUMS_N(wb[u], xu + t * xstride, xstride, 0, arm_halves(fmt), ARM_NR_8, s);
                        for (int i = 0; i < NR; i++) arm_update(fmt, &sc, u, s[i], xu + (t + i) * xstride, accb[t + i]);
                    }
                    for (; t < tn; t++) {
                        int32x4_t s[4];
                        ARM_SUMS(wb[u], xu + t * xstride, wide, arm_halves(fmt), s);
                        arm_update(fmt, &sc, u, s, xu + t * xstride, accb[t]);
                    }
                }
            }
            for (int t = 0; t < tn; t++) arm_store(y + (t0 + t) * ys + p * PANEL, accb[t], (int)(rows - p * PANEL));
        }
}

/* Each format its own copy of the driver, the format a constant in it. */
#define ARM_FORMATS(X) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(IQ4_NL) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ4_XS)
#define ARM_CAT_(a, b) a##b
#define ARM_CAT(a, b) ARM_CAT_(a, b)
#define ARM_FN(F, W) ARM_CAT(ARM_PREFIX, _##F##_##W)
#define ARM_DEFINE(F)                                                                                                  \
    static void ARM_FN(F, 8)(const uint8_t *pk, int64_t nb, int64_t p0, int64_t p1, const void *qx, int64_t T,      \
                             float *y, int64_t ys, int64_t rows) {                                                     \
        arm_panels(F, 0, pk, nb, p0, p1, qx, T, y, ys, rows);                                                          \
    }                                                                                                                  \
    static void ARM_FN(F, 16)(const uint8_t *pk, int64_t nb, int64_t p0, int64_t p1, const void *qx, int64_t T,     \
                              float *y, int64_t ys, int64_t rows) {                                                    \
        arm_panels(F, 1, pk, nb, p0, p1, qx, T, y, ys, rows);                                                          \
    }
ARM_FORMATS(ARM_DEFINE)

#define ARM_CASE8(F) case F: ARM_FN(F, 8)(packed, nb, p0, p1, qx, T, y, ys, rows); break;
#define ARM_CASE16(F) case F: ARM_FN(F, 16)(packed, nb, p0, p1, qx, T, y, ys, rows); break;
static void ARM_CAT(ARM_PREFIX, _int8)(int fmt, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1,
                                       const void *qx, int64_t T, float *y, int64_t ys, int64_t rows) {
    switch (fmt) { ARM_FORMATS(ARM_CASE8) default: break; }
}
static void ARM_CAT(ARM_PREFIX, _exact)(int fmt, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1,
                                        const void *qx, int64_t T, float *y, int64_t ys, int64_t rows) {
    switch (fmt) { ARM_FORMATS(ARM_CASE16) default: break; }
}

#endif
