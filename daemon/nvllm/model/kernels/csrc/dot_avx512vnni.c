/* The packed kernels (packed.h) for AVX-512 VNNI: dpbusd multiplies 4 unsigned weight bytes of a row by 4
 * signed bytes of x and adds them to the row's int32 lane, so every weight is made unsigned (Q8_0 and the
 * IQ4 tables + 128, the others by their format's offset: dot_x86.h) and the offset taken away as off *
 * x's sum. On 512-bit vectors, two panels a vector (X86_WIDE): Zen 4 runs a 512-bit dpbusd as fast as a
 * 256-bit one (1.8 a ns each, measured), so 16 rows an instruction is twice the products (T = 1: Q4_K
 * 25 -> 40 GB/s, Q4_0 35 -> 48 from L3). The loops and the unpacking are dot_x86.h's. */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")

#include <immintrin.h>

#include "packed.h"
#include "peak.h"

#define DOT_X86_SIGNED 0

/* dpbusd of w by 4 bytes of x (at x) broadcast to every lane, the broadcast folded into the instruction
 * ({1to16}): GCC emits a vpbroadcastd of its own for each (the 16 a unit of exact x), which costs Zen 4
 * about 4% of the one-row rate from cache. */
INLINE __m512i vnni_dpbusd_x4(__m512i acc, __m512i w, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x));
    return acc;
}
INLINE __m256i vnni_dpbusd_x4_n(__m256i acc, __m256i w, const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_dpbusd_epi32(acc, w, _mm256_set1_epi32(v));
}

/* A unit's products with x's 32 quants xq: two chains (vectors 0..3, 4..7), the halves or summed. */
#define VNNI_ISA_DOT(dpbusd)                                                                                           \
    INLINE void isa_dot(int fmt, const vi w[8], const int8_t *xq, int halves, vi *p0, vi *p1) {                        \
        (void)fmt;                                                                                                     \
        vi a = vzero(), b = vzero();                                                                                   \
        for (int k = 0; k < 4; k++) {                                                                                  \
            a = dpbusd(a, w[k], xq + 4 * k);                                                                           \
            b = dpbusd(b, w[k + 4], xq + 16 + 4 * k);                                                                  \
        }                                                                                                              \
        if (halves) {                                                                                                  \
            *p0 = a;                                                                                                   \
            *p1 = b;                                                                                                   \
        } else *p0 = vadd32(a, b);                                                                                     \
    }

/* 512 bits, two panels a vector: x86_panels_w */
#define X86_WIDE 1
#define X86_SFX _w
#include "dot_x86.h"
VNNI_ISA_DOT(vnni_dpbusd_x4)

/* 256 bits, one panel: x86_panels_1_n, for Q6_K's one row of x */
#undef X86_WIDE
#undef X86_SFX
#define X86_WIDE 0
#define X86_SFX _n
#include "dot_x86.h"
VNNI_ISA_DOT(vnni_dpbusd_x4_n)

/* Q6_K's one row of x goes on one panel a vector: read two panels at once, its strips (the scales at their
 * end, the units out of the order of their bytes) stream from DRAM at 16 GB/s, one at once at 29 (Zen 4,
 * one thread); everything else on two panels a vector, as fast or faster. */

static void vnni_int8(int fmt, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1, const void *qx, int64_t T,
                      float *y, int64_t ys, int64_t rows) {
    if (fmt == Q6_K && T == 1) x86_panels_1_n(Q6_K, 0, packed, nb, p0, p1, qx, y, rows);
    else x86_panels_w(0, fmt, packed, nb, p0, p1, qx, T, y, ys, rows);
}

static void vnni_exact(int fmt, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1, const void *qx, int64_t T,
                       float *y, int64_t ys, int64_t rows) {
    if (fmt == Q6_K && T == 1) x86_panels_1_n(Q6_K, 1, packed, nb, p0, p1, qx, y, rows);
    else x86_panels_w(1, fmt, packed, nb, p0, p1, qx, T, y, ys, rows);
}

/* The peak (peak.h): a 512-bit vpdpbusd, as the kernels use it (64 products), twelve chains sharing one a. */
#define VN_KEEP(a) __asm__ volatile("" : "+v"(a))
static int64_t vnni_peak(int64_t reps) {
    static const uint8_t seed[64] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    __m512i b = _mm512_loadu_si512((const void *)seed);
    PEAK_BODY(__m512i, __m512i, PEAK_EACH12, PEAK_EACH1, PEAK_SHARED, VN_KEEP, _mm512_dpbusd_epi32, _mm512_set1_epi32,
              _mm512_xor_si512)
    return reps * steps * 64;
}

/* F16 and BF16 (dot_float.h): four rows of x a pass, sixteen ymm sums (AVX-512 has 32 registers) */
#define FP_PREFIX vnni
#define FP_M 4
#include "dot_float.h"

const dot_isa_t dot_avx512vnni = {vnni_int8, vnni_exact, vnni_floats, vnni_peak};

#endif
