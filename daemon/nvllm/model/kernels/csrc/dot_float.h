/* The packed F16 and BF16 kernels: one body for every instruction set. A dot_*.c file includes this after
 * defining FP_PREFIX (its name) and FP_M (rows of x a pass: what its registers hold), and FP_PORTABLE
 * where it is the portable C (no intrinsics). GCC's f32x8 is a ymm register on x86, two q registers on
 * NEON, two xmm in the portable build, so each file runs the same arithmetic (packed.h's "plain floats")
 * in its own registers: the same bits everywhere.
 *
 * A strip of these is one value of each of the panel's 8 rows (16 bytes): each lane of a vector is its
 * own output row, so nothing is reduced across lanes. Four sums per output (the products at k = j mod 4
 * in sum j: four independent chains), separate multiplies and adds (fp-contract is off), and the fixed
 * tree (s0 + s1) + (s2 + s3) at the end. x stays float32: nothing is quantized.
 */
#ifndef NVLLM_DOT_FLOAT_H
#define NVLLM_DOT_FLOAT_H

#include <stdint.h>
#include <string.h>

#include "packed.h"

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

#define FP_CAT_(a, b) a##b
#define FP_CAT(a, b) FP_CAT_(a, b)

/* The 8 halves at p (one strip: a value of each row) as floats, exactly: F16 the IEEE half's value, BF16
 * its bits in a float's top half. */
#if defined(FP_PORTABLE)
INLINE f32x8 fp_load(const int fmt, const uint8_t *p) {
    f32x8 v;
    for (int r = 0; r < PANEL; r++) {
        const uint16_t h = (uint16_t)(p[2 * r] | (p[2 * r + 1] << 8));
        const uint32_t bits = (uint32_t)h << 16;
        float b;
        memcpy(&b, &bits, sizeof b);
        v[r] = fmt == F16 ? half_to_float(h) : b;
    }
    return v;
}
#elif defined(__x86_64__)
#include <immintrin.h>
INLINE f32x8 fp_load(const int fmt, const uint8_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (fmt == F16) return (f32x8)_mm256_cvtph_ps(h);
    return (f32x8)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#elif defined(__aarch64__)
#include <arm_neon.h>
INLINE f32x8 fp_load(const int fmt, const uint8_t *p) {
    const uint16x8_t h = vld1q_u16((const uint16_t *)(const void *)p);
    float32x4_t v[2];
    if (fmt == F16) {
        v[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
        v[1] = vcvt_high_f32_f16(vreinterpretq_f16_u16(h));
    } else {
        v[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        v[1] = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    }
    f32x8 r;
    memcpy(&r, v, sizeof r);
    return r;
}
#endif

/* Rows t .. t + M of x (stride xs) by one panel of `in` strips into y (stride ys), its first `live` rows.
 * fmt and M are constants where this is inlined. */
INLINE void fp_pass(const int fmt, const int M, const uint8_t *pan, int64_t in, const float *x, int64_t xs, float *y,
                    int64_t ys, int live) {
    f32x8 s[FP_M][4];
    for (int t = 0; t < M; t++)
        for (int j = 0; j < 4; j++) s[t][j] = (f32x8){0};
    const int64_t in4 = in & ~(int64_t)3;
    int64_t k = 0;
    for (; k < in4; k += 4) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const f32x8 w = fp_load(fmt, pan + 16 * (k + j));
#pragma GCC unroll 8
            for (int t = 0; t < M; t++) s[t][j] += w * x[t * xs + k + j];
        }
    }
    for (int j = 0; k + j < in; j++) {   /* the last in % 4 values: sums 0 .. in % 4 - 1 take one more */
        const f32x8 w = fp_load(fmt, pan + 16 * (k + j));
        for (int t = 0; t < M; t++) s[t][j] += w * x[t * xs + k + j];
    }
    for (int t = 0; t < M; t++) {
        const f32x8 tot = (s[t][0] + s[t][1]) + (s[t][2] + s[t][3]);
        for (int r = 0; r < live; r++) y[t * ys + r] = tot[r];
    }
}

/* A panel's rows for every row of x, FP_M rows of x a pass (each pass reads the panel again: from cache,
 * a panel being at most 8 * in * 2 bytes). */
INLINE void fp_panel(const int fmt, const uint8_t *pan, int64_t in, const float *x, int64_t xs, int64_t T, float *y,
                     int64_t ys, int live) {
    int64_t t = 0;
    for (; t + FP_M <= T; t += FP_M) fp_pass(fmt, FP_M, pan, in, x + t * xs, xs, y + t * ys, ys, live);
    switch (T - t) {   /* the rest, with M a constant in each case */
#if FP_M > 3
    case 3: fp_pass(fmt, 3, pan, in, x + t * xs, xs, y + t * ys, ys, live); break;
#endif
#if FP_M > 2
    case 2: fp_pass(fmt, 2, pan, in, x + t * xs, xs, y + t * ys, ys, live); break;
#endif
    case 1: fp_pass(fmt, 1, pan, in, x + t * xs, xs, y + t * ys, ys, live); break;
    default: break;
    }
}

/* dot_floats_fn (packed.h) */
static void FP_CAT(FP_PREFIX, _floats)(int fmt, const uint8_t *packed, int64_t in, int64_t p0, int64_t p1,
                                       const float *x, int64_t xs, int64_t T, float *y, int64_t ys, int64_t rows) {
    for (int64_t p = p0; p < p1; p++) {
        const uint8_t *pan = packed + p * in * 2 * PANEL;
        const int live = rows - p * PANEL < PANEL ? (int)(rows - p * PANEL) : PANEL;
        if (fmt == F16) fp_panel(F16, pan, in, x, xs, T, y + p * PANEL, ys, live);
        else fp_panel(BF16, pan, in, x, xs, T, y + p * PANEL, ys, live);
    }
}

#pragma GCC pop_options

#endif
