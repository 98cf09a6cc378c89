/* The packed kernels (packed.h) for AVX2: maddubs multiplies a row's unsigned weight bytes by x's signed
 * bytes into int16 pairs, madd with ones sums them into the row's int32 lane. The int16 sums stay exact:
 * x's planes are in -127 .. 127, so a pair of products is at most 2 * 127 * w; several maddubs are added
 * in int16 before the madd while that allows (8 for 4-bit weights, 4 for 5-bit and Q3_K/Q2_K's, 2 for
 * Q6_K's 6 bits). Q8_0's and the IQ4 tables' weights stay signed: maddubs(|w|, x with w's sign), |w| <= 128
 * (x is never -128, so its sign flip is exact). The loops and the unpacking are dot_x86.h's. */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2,fma,f16c")

#include <immintrin.h>

#include "packed.h"
#include "peak.h"

#define DOT_X86_SIGNED 1
#define X86_WIDE 0
#define X86_SFX _avx2
#define X86_TB 2   /* rows of x a pass: 16 registers hold two rows' sums (four spill) */
#include "dot_x86.h"

/* maddubs products of weight bytes added in int16 before one madd: 2 * 127 * max weight * G <= 32767. */
INLINE int avx2_group(int fmt) {
    switch (fmt) {
    case Q4_0: case Q4_1: case Q4_K: return 8;   /* 0 .. 15 */
    case Q5_0: case Q5_1: case Q5_K: case Q3_K: case Q2_K: return 4;   /* 0 .. 31; 0 .. 7; 0 .. 3 (per half) */
    case Q6_K: return 2;   /* 0 .. 63 */
    default: return 1;   /* signed: |w| <= 128 */
    }
}

INLINE vi avx2_pairs(int fmt, vi w, vi x) {
    if (fmt == Q8_0 || fmt == IQ4_NL || fmt == IQ4_XS) return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_maddubs_epi16(w, x);
}

/* A unit's products with x's 32 quants xq: the halves (vectors 0..3, 4..7) or their sum. */
INLINE void isa_dot(int fmt, const vi w[8], const int8_t *xq, int halves, vi *p0, vi *p1) {
    const int g = avx2_group(fmt);
    const vi ones = _mm256_set1_epi16(1);
    vi s[2] = {vzero(), vzero()};
    for (int k = 0; k < 8; k += g) {
        vi a = avx2_pairs(fmt, w[k], x86_x4(xq + 4 * k));
        for (int i = 1; i < g; i++) a = _mm256_add_epi16(a, avx2_pairs(fmt, w[k + i], x86_x4(xq + 4 * (k + i))));
        s[g == 8 ? 0 : k / 4 % 2] = vadd32(s[g == 8 ? 0 : k / 4 % 2], _mm256_madd_epi16(a, ones));
    }
    if (halves) {
        *p0 = s[0];
        *p1 = s[1];
    } else *p0 = vadd32(s[0], s[1]);
}

static void avx2_int8(int fmt, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1, const void *qx, int64_t T,
                      float *y, int64_t ys, int64_t rows) {
    x86_panels(0, fmt, packed, nb, p0, p1, qx, T, y, ys, rows);
}

static void avx2_exact(int fmt, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1, const void *qx, int64_t T,
                       float *y, int64_t ys, int64_t rows) {
    x86_panels(1, fmt, packed, nb, p0, p1, qx, T, y, ys, rows);
}

/* The peak (peak.h): maddubs + madd into int32, then an add (32 products), four chains with their own a. */
#define AV_KEEP(a) __asm__ volatile("" : "+x"(a))
#define AV_STEP(c, a, b) _mm256_add_epi32((c), _mm256_madd_epi16(_mm256_maddubs_epi16((a), (b)), _mm256_set1_epi16(1)))
static int64_t avx2_peak(int64_t reps) {
    static const uint8_t seed[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    __m256i b = _mm256_loadu_si256((const __m256i *)seed);
    PEAK_BODY(__m256i, __m256i, PEAK_EACH4, PEAK_EACH4, PEAK_OWN, AV_KEEP, AV_STEP, _mm256_set1_epi32, _mm256_xor_si256)
    return reps * steps * 32;
}

/* F16 and BF16 (dot_float.h): two rows of x a pass, eight ymm sums */
#define FP_PREFIX avx2
#define FP_M 2
#include "dot_float.h"

const dot_isa_t dot_avx2 = {avx2_int8, avx2_exact, avx2_floats, avx2_peak};

#endif
