/* Float helpers ops.c and attention.c share: the ENTRY attribute (an AVX2+FMA clone beside the baseline
 * on x86-64) and exp for scores after the max is taken off. */
#ifndef NVLLM_FMATH_H
#define NVLLM_FMATH_H

#include <stdint.h>
#include <string.h>

/* On x86-64 each entry point is also built for AVX2+FMA and picked at load time by the CPU it finds;
 * the baseline (SSE2) build stays for older CPUs. aarch64's baseline already has NEON and FMA. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ENTRY __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ENTRY
#endif

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

#endif
