/* The packed kernels (packed.h) on aarch64 with the dot product (ARMv8.2-A dotprod: sdot): a unit of 8
 * rows is 16 vectors of int8 weights, each meeting one 4-byte group of x by sdot's lane form, every
 * 32-bit lane its own row's sum: no horizontal sums, no widening of the weights. dot_arm.h has the
 * unpacking, the scales and the driver; this file the products. */
#if defined(__aarch64__) && defined(__GNUC__)
#pragma GCC target("arch=armv8.2-a+dotprod")

#include "dot_arm.h"

/* s[2 h + h8] = products of one plane of x (32 int8) with a unit's weights: half h, rows 4 h8 .. (a unit
 * with one scale: both halves in s[h8], s[2 + h8] = 0, one chain per row half; the units of a strip are
 * independent chains for the out-of-order core to overlap). */
ARM_INLINE void dp_plane(const int8x16_t *w, const int8_t *q, const int halves, int32x4_t s[4]) {
    const int8x16_t X0 = vld1q_s8(q), X1 = vld1q_s8(q + 16);
    int32x4_t a0 = vdupq_n_s32(0), a1 = a0, b0 = a0, b1 = a0;
    if (!halves) {
#define DP_G(g, X) a0 = vdotq_laneq_s32(a0, w[2 * (g)], X, (g) % 4), a1 = vdotq_laneq_s32(a1, w[2 * (g) + 1], X, (g) % 4)
        DP_G(0, X0); DP_G(1, X0); DP_G(2, X0); DP_G(3, X0); DP_G(4, X1); DP_G(5, X1); DP_G(6, X1); DP_G(7, X1);
#undef DP_G
        s[0] = a0, s[1] = a1, s[2] = s[3] = b0;
        return;
    }
#define DP_G(g, A0, A1, X) A0 = vdotq_laneq_s32(A0, w[2 * (g)], X, (g) % 4), A1 = vdotq_laneq_s32(A1, w[2 * (g) + 1], X, (g) % 4)
    DP_G(0, a0, a1, X0); DP_G(1, a0, a1, X0); DP_G(2, a0, a1, X0); DP_G(3, a0, a1, X0);
    DP_G(4, b0, b1, X1); DP_G(5, b0, b1, X1); DP_G(6, b0, b1, X1); DP_G(7, b0, b1, X1);
#undef DP_G
    s[0] = a0, s[1] = a1, s[2] = b0, s[3] = b1;
}

/* One row of x: int8 (one plane) or exact (255 hi + lo). */
ARM_INLINE void dp_sums(const int8x16_t *w, const uint8_t *xb, const int wide, const int halves, int32x4_t s[4]) {
    if (!wide) {
        dp_plane(w, ((const xq8_t *)xb)->q, halves, s);
        return;
    }
    int32x4_t hi[4];
    dp_plane(w, ((const xq16_t *)xb)->hi, halves, hi);
    dp_plane(w, ((const xq16_t *)xb)->lo, halves, s);
    for (int i = 0; i < 4; i++) s[i] = vmlaq_n_s32(s[i], hi[i], 255);
}

/* nr rows of x against weights in L1: each weight vector loaded once for all of them. */
ARM_INLINE void dp_sums_n(const int8x16_t *w, const uint8_t *xb, size_t xstride, const int wide, const int halves,
                          const int nr, int32x4_t s[][4]) {
    const int planes = wide ? 2 : 1;
    int8x16_t X[4][2][2];   /* [row][plane][16-byte half] */
    int32x4_t a[4][2][4];   /* [row][plane][2 h + h8] */
    for (int i = 0; i < nr; i++)
        for (int pl = 0; pl < planes; pl++) {
            const int8_t *q = wide ? (pl ? ((const xq16_t *)(xb + i * xstride))->lo : ((const xq16_t *)(xb + i * xstride))->hi)
                                   : ((const xq8_t *)(xb + i * xstride))->q;
            X[i][pl][0] = vld1q_s8(q), X[i][pl][1] = vld1q_s8(q + 16);
            for (int k = 0; k < 4; k++) a[i][pl][k] = vdupq_n_s32(0);
        }
#define DPN_G(g)                                                                                                       \
    do {                                                                                                               \
        const int8x16_t w0 = w[2 * (g)], w1 = w[2 * (g) + 1];                                                          \
        const int k = halves ? 2 * ((g) / 4) : 0;                                                                      \
        for (int i = 0; i < nr; i++)                                                                                   \
            for (int pl = 0; pl < planes; pl++) {                                                                      \
                a[i][pl][k] = vdotq_laneq_s32(a[i][pl][k], w0, X[i][pl][(g) / 4], (g) % 4);                            \
                a[i][pl][k + 1] = vdotq_laneq_s32(a[i][pl][k + 1], w1, X[i][pl][(g) / 4], (g) % 4);                    \
            }                                                                                                          \
    } while (0)
    DPN_G(0); DPN_G(1); DPN_G(2); DPN_G(3); DPN_G(4); DPN_G(5); DPN_G(6); DPN_G(7);
#undef DPN_G
    for (int i = 0; i < nr; i++)
        for (int k = 0; k < 4; k++) s[i][k] = wide ? vmlaq_n_s32(a[i][1][k], a[i][0][k], 255) : a[i][0][k];
}

#define ARM_PREFIX dotprod
#define ARM_NR_8 4
#define ARM_NR_16 2
#define ARM_NR_MAX 4
#define ARM_SUMS(w, xb, wide, halves, s) dp_sums(w, xb, wide, halves, s)
#define ARM_SUMS_N(w, xb, xstride, wide, halves, nr, s) dp_sums_n(w, xb, xstride, wide, halves, nr, s)
#include "dot_arm.h"

/* The peak (peak.h): sdot, 16 products, sixteen chains sharing one a (it adds into its accumulator itself). */
static int64_t dotprod_peak(int64_t reps) {
    static const int8_t seed[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    int8x16_t b = vld1q_s8(seed);
    PEAK_BODY(int8x16_t, int32x4_t, PEAK_EACH16, PEAK_EACH1, PEAK_SHARED, ARM_KEEP, vdotq_s32, vdupq_n_s32, veorq_s32)
    return reps * steps * 16;
}

/* F16 and BF16 (dot_float.h): as plain NEON's, no dot instruction in float */
#define FP_PREFIX dotprod
#define FP_M 2
#include "dot_float.h"

const dot_isa_t dot_dotprod = {dotprod_int8, dotprod_exact, dotprod_floats, dotprod_peak};

#endif
