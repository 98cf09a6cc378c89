/* x quantized for the integer kernels, and the variant that multiplies it by the packed weights
 * (packed.h says what is computed; each dot_*.c is one instruction set's kernels).
 *
 * Variants are numbered as matmul.py's INT_VARIANTS has them: 1 .. 3 with int8 activations (portable C,
 * then the SIMD set without and with its 8-bit dot instruction: AVX2 / AVX-512 VNNI on x86-64, NEON /
 * NEON with dotprod on aarch64), 4 .. 6 the same with exact ones; 0 is no integer kernel at all (the
 * weights decoded to float). The instruction-set files are linked in when the build has them: a missing
 * one (a weak symbol left NULL) is a variant this build does not run. Picked at run time from what the
 * CPU has, never from the flags this file is built with.
 */
#include <string.h>

#include "packed.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define DOT_X86 1
extern const dot_isa_t dot_avx2 __attribute__((weak));
extern const dot_isa_t dot_avx512vnni __attribute__((weak));
#define DOT_SIMD_NAME "avx2"
#define DOT_DOT_NAME "avx512vnni"
#elif defined(__aarch64__) && defined(__GNUC__)
#define DOT_ARM 1
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
extern const dot_isa_t dot_neon __attribute__((weak));
extern const dot_isa_t dot_dotprod __attribute__((weak));
#define DOT_SIMD_NAME "neon"
#define DOT_DOT_NAME "neon-dotprod"
#else
#define DOT_SIMD_NAME "simd"
#define DOT_DOT_NAME "dot"
#endif

enum { V_SCALAR = 1, V_SIMD = 2, V_DOT = 3, V_EXACT = 3, V_COUNT = 7 };   /* v > V_EXACT: exact activations */

/* The instruction set of variant v, or NULL where this build or CPU lacks it. */
static const dot_isa_t *isa_of(int v) {
    const int kind = v > V_EXACT ? v - V_EXACT : v;
    if (v <= 0 || v >= V_COUNT) return NULL;
    if (kind == V_SCALAR) return &dot_scalar;
#ifdef DOT_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (kind == V_SIMD) return avx2 && &dot_avx2 ? &dot_avx2 : NULL;
    const int vnni = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                     __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
    return vnni && &dot_avx512vnni ? &dot_avx512vnni : NULL;
#elif defined(DOT_ARM)
    if (kind == V_SIMD) return &dot_neon ? &dot_neon : NULL;   /* NEON is part of every ARMv8-A */
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) && &dot_dotprod ? &dot_dotprod : NULL;
#else
    return NULL;
#endif
}

/* Bit v set for each variant this build runs on this CPU; bit 0 (the float path) always. */
int dot_variants(void) {
    int mask = 1;
    for (int v = 1; v < V_COUNT; v++)
        if (isa_of(v)) mask |= 1 << v;
    return mask;
}

const char *dot_variant_name(int v) {
    static const char *const names[V_COUNT] = {"float", "scalar", DOT_SIMD_NAME, DOT_DOT_NAME,
                                               "scalar-i16", DOT_SIMD_NAME "-i16", DOT_DOT_NAME "-i16"};
    return v >= 0 && v < V_COUNT && (v == 0 || isa_of(v) || v == V_SCALAR || v == V_SCALAR + V_EXACT) ? names[v] : "";
}

static int chosen = -1;   /* the variant in use; -1 until the first call picks the best */

/* Makes packed weights use variant v (a bit of dot_variants; 0: decoded to float) from the next call on
 * and returns v, or -1 if this machine cannot run it; a negative v changes nothing and returns the variant
 * in use: unless set, the fastest SIMD one with exact (16-bit) activations (model.activations' default), or 0
 * where there is none (the portable C is the reference, slower than decoding to float). */
int dot_variant(int v) {
    if (v >= 0) {
        if (v >= V_COUNT || !(dot_variants() >> v & 1)) return -1;
        __atomic_store_n(&chosen, v, __ATOMIC_RELAXED);
        return v;
    }
    int c = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (c < 0) {
        const int mask = dot_variants();
        c = mask >> (V_DOT + V_EXACT) & 1 ? V_DOT + V_EXACT : mask >> (V_SIMD + V_EXACT) & 1 ? V_SIMD + V_EXACT : 0;
        __atomic_store_n(&chosen, c, __ATOMIC_RELAXED);
    }
    return c;
}

/* Bytes T rows of `in` values take quantized for variant v. */
size_t dot_x_bytes(int v, int64_t T, int64_t in) {
    return (size_t)T * (size_t)(in / 32) * (v > V_EXACT ? sizeof(xq16_t) : sizeof(xq8_t));
}

/* Round to nearest, ties to even, for |v| < 2^22: adding and taking away 1.5 * 2^23 leaves the integer. */
INLINE float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }

/* One block of 32 values: d, the quants, their half sums and s, as packed.h says. */
INLINE void quantize_block(const float *v, float qmax, float *d_out, float *s_out, int32_t *sum, int32_t *q) {
    float amax = 0.0f;
    int finite = 1;
    for (int j = 0; j < 32; j++) {
        const float a = v[j] < 0 ? -v[j] : v[j];
        finite &= a <= 3.4028234663852886e38f;   /* false for inf and NaN */
        amax = a > amax ? a : amax;
    }
    if (!finite) {
        *d_out = *s_out = __builtin_nanf("");
        memset(q, 0, 32 * sizeof *q);
        sum[0] = sum[1] = 0;
        return;
    }
    const float d = amax / qmax;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    sum[0] = sum[1] = 0;
    for (int j = 0; j < 32; j++) {
        q[j] = (int32_t)round_even(v[j] * id);
        sum[j / 16] += q[j];
    }
    *d_out = d;
    *s_out = d * (float)(sum[0] + sum[1]);
}

/* Built for AVX2 as well on x86-64 (GCC picks at load): the loops of a block vectorise there, the same
 * operations in the same order, so the same bits. */
#if defined(DOT_X86) && !defined(__clang__)
#define QUANTIZE_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define QUANTIZE_CLONES
#endif

/* Rows t0 .. t0 + tn of x (row stride x_stride floats, `in` a multiple of 32) into qx, laid out for
 * variant v as dot_x_bytes counts; each row on its own. */
QUANTIZE_CLONES void dot_quantize_x(int v, const float *x, int64_t x_stride, int64_t in, int64_t t0, int64_t tn, void *qx) {
    const int64_t nb = in / 32;
    for (int64_t t = t0; t < t0 + tn; t++)
        for (int64_t b = 0; b < nb; b++) {
            int32_t q[32];
            const float *v32 = x + t * x_stride + 32 * b;
            if (v > V_EXACT) {
                xq16_t *o = (xq16_t *)qx + t * nb + b;
                quantize_block(v32, QMAX16, &o->d, &o->s, o->sum, q);
                for (int j = 0; j < 32; j++) {
                    const int32_t hi = (q[j] + 127 + 255 * 128) / 255 - 128;   /* floor: divided while positive */
                    o->hi[j] = (int8_t)hi;
                    o->lo[j] = (int8_t)(q[j] - 255 * hi);
                }
            } else {
                xq8_t *o = (xq8_t *)qx + t * nb + b;
                quantize_block(v32, QMAX8, &o->d, &o->s, o->sum, q);
                for (int j = 0; j < 32; j++) o->q[j] = (int8_t)q[j];
            }
        }
}

/* y for the rows of panels p0 .. p1 of a packed W [rows, in] (qx: T rows quantized for v). 0, or -1 for
 * a variant this machine does not run. */
int dot_panels(int v, int fmt, const uint8_t *packed, int64_t in, int64_t p0, int64_t p1, const void *qx, int64_t T,
               float *y, int64_t ys, int64_t rows) {
    const dot_isa_t *isa = isa_of(v);
    if (!isa) return -1;
    (v > V_EXACT ? isa->exact : isa->int8)(fmt, packed, in / block_elems(fmt), p0, p1, qx, T, y, ys, rows);
    return 0;
}

/* y for the rows of panels p0 .. p1 of a packed F16 or BF16 W [rows, in], x float32: variant v's
 * instruction set (the best this machine runs where v has none: 0, the float path, among them), each
 * giving the same bits. 0, or -1 for a format that is not plain floats. */
int dot_float_panels(int v, int fmt, const uint8_t *packed, int64_t in, int64_t p0, int64_t p1, const float *x,
                     int64_t xs, int64_t T, float *y, int64_t ys, int64_t rows) {
    if (!pack_floats(fmt)) return -1;
    const dot_isa_t *isa = isa_of(v);
    if (!isa) isa = isa_of(V_DOT) ? isa_of(V_DOT) : isa_of(V_SIMD) ? isa_of(V_SIMD) : &dot_scalar;
    isa->floats(fmt, packed, in, p0, p1, x, xs, T, y, ys, rows);
    return 0;
}

/* `reps` iterations of variant v's peak loop (peak.h): the multiply-accumulates made, in its activations' width
 * (exact ones take two of the 8-bit instruction's: half as many); 0 for a variant this machine does not run. */
int64_t dot_peak(int v, int64_t reps) {
    const dot_isa_t *isa = isa_of(v);
    if (!isa || !isa->peak || reps <= 0) return 0;
    const int64_t macs = isa->peak(reps);
    return v > V_EXACT ? macs / 2 : macs;
}

/* dot_peak on the kernels' thread team (matmul_team_run): part p runs job->reps iterations into job->done[p]. */
#define PEAK_PARTS 64   /* team.c's MAX_THREADS, and peak.py's PeakJob */
typedef struct {
    int v;
    int64_t reps;
    int64_t done[PEAK_PARTS];
} peak_job_t;

void dot_peak_part(void *arg, int part) {
    peak_job_t *j = (peak_job_t *)arg;
    if (part >= 0 && part < PEAK_PARTS) j->done[part] = dot_peak(j->v, j->reps);
}
