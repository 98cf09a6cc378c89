/* The packed kernels (packed.h) on aarch64 without the dot product (plain NEON, every ARMv8-A): a unit of
 * 8 rows is 16 vectors of int8 weights (dot_arm.h's lane layout); each meets its 4-byte group of x
 * broadcast to all four lanes (dup), smull/smlal add two groups' products in int16 (|w q| <= 128 * 127,
 * two fit), sadalp folds them into int32 pairs per row, one addp per unit finishes the rows' sums.
 * dot_arm.h has the unpacking, the scales and the driver; this file the products. */
#if defined(__aarch64__) && defined(__GNUC__)

#include "dot_arm.h"

ARM_INLINE int8x16_t ne_dup(int8x16_t x, const int lane) {
    return vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(x), lane));
}

/* Rows 4 h8 .. 4 h8 + 3's sums over half h: groups 4 h .. 4 h + 3 against x's lanes d[0..3]. */
ARM_INLINE int32x4_t ne_half(const int8x16_t *w, const int8x16_t d[4]) {
    int16x8_t m = vmull_s8(vget_low_s8(w[0]), vget_low_s8(d[0]));
    m = vmlal_s8(m, vget_low_s8(w[2]), vget_low_s8(d[1]));
    int16x8_t n = vmull_s8(vget_low_s8(w[4]), vget_low_s8(d[2]));
    n = vmlal_s8(n, vget_low_s8(w[6]), vget_low_s8(d[3]));
    int16x8_t mh = vmull_high_s8(w[0], d[0]);
    mh = vmlal_high_s8(mh, w[2], d[1]);
    int16x8_t nh = vmull_high_s8(w[4], d[2]);
    nh = vmlal_high_s8(nh, w[6], d[3]);
    const int32x4_t lo = vpadalq_s16(vpaddlq_s16(m), n);    /* rows 0, 1: two partial sums each */
    const int32x4_t hi = vpadalq_s16(vpaddlq_s16(mh), nh);  /* rows 2, 3 */
    return vpaddq_s32(lo, hi);
}

ARM_INLINE void ne_plane(const int8x16_t *w, const int8_t *q, int32x4_t s[4]) {
    for (int h = 0; h < 2; h++) {
        const int8x16_t X = vld1q_s8(q + 16 * h);
        const int8x16_t d[4] = {ne_dup(X, 0), ne_dup(X, 1), ne_dup(X, 2), ne_dup(X, 3)};
        s[2 * h] = ne_half(w + 8 * h, d);
        s[2 * h + 1] = ne_half(w + 8 * h + 1, d);
    }
}

ARM_INLINE void ne_sums(const int8x16_t *w, const uint8_t *xb, const int wide, const int halves, int32x4_t s[4]) {
    (void)halves;
    if (!wide) {
        ne_plane(w, ((const xq8_t *)xb)->q, s);
        return;
    }
    int32x4_t hi[4];
    ne_plane(w, ((const xq16_t *)xb)->hi, hi);
    ne_plane(w, ((const xq16_t *)xb)->lo, s);
    for (int i = 0; i < 4; i++) s[i] = vmlaq_n_s32(s[i], hi[i], 255);
}

ARM_INLINE void ne_sums_n(const int8x16_t *w, const uint8_t *xb, size_t xstride, const int wide, const int halves,
                          const int nr, int32x4_t s[][4]) {
    for (int i = 0; i < nr; i++) ne_sums(w, xb + i * xstride, wide, halves, s[i]);
}

#define ARM_PREFIX neon
#define ARM_NR_8 2
#define ARM_NR_16 1
#define ARM_NR_MAX 2
#define ARM_SUMS(w, xb, wide, halves, s) ne_sums(w, xb, wide, halves, s)
#define ARM_SUMS_N(w, xb, xstride, wide, halves, nr, s) ne_sums_n(w, xb, xstride, wide, halves, nr, s)
#include "dot_arm.h"

/* The peak (peak.h): plain NEON's 8-bit product, smull + smlal2 and a pairwise add into int32 (16 products),
 * eight chains with their own a. */
#define NE_PEAK_STEP(c, a, b) vpadalq_s16((c), vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), (a), (b)))
static int64_t neon_peak(int64_t reps) {
    static const int8_t seed[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    int8x16_t b = vld1q_s8(seed);
    PEAK_BODY(int8x16_t, int32x4_t, PEAK_EACH8, PEAK_EACH8, PEAK_OWN, ARM_KEEP, NE_PEAK_STEP, vdupq_n_s32, veorq_s32)
    return reps * steps * 16;
}

/* F16 and BF16 (dot_float.h): two rows of x a pass, sixteen q registers of sums */
#define FP_PREFIX neon
#define FP_M 2
#include "dot_float.h"

const dot_isa_t dot_neon = {neon_int8, neon_exact, neon_floats, neon_peak};

#endif
