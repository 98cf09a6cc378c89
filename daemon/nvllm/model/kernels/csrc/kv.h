/* The KV pool's formats, for the kernels that write the pool (ops.c's rope_write_kv) and read it
 * (attention.c). */
#ifndef NVLLM_KV_H
#define NVLLM_KV_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"

/* A token's keys (or values) are nkv * hd values stored as GGUF's F32, F16, BF16 or Q8_0 (blocks.h's
 * type ids; Q8_0 in blocks of 32 along each head, so hd is a multiple of 32). Writes round to nearest
 * even as NumPy's astype does (f16) and as nvllm's quantizers do (bf16, q8_0: model/quant/quantize.py),
 * so kv_format.encode is their twin bit for bit; reads are exact conversions. */

/* Bytes of n values in fmt. */
static inline int64_t kv_bytes(int fmt, int64_t n) {
    return fmt == Q8_0 ? n / QK * Q8_0_BYTES : n * block_bytes(fmt);
}

/* float -> IEEE half, to nearest even; overflow gives inf, NaN stays NaN (its top payload bits kept). */
static inline uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    uint16_t h;
    if (x > 0x7f800000u) {                       /* NaN */
        h = (uint16_t)(0x7c00u + (x >> 13 & 0x3ffu));
        h = h == 0x7c00u ? 0x7c01u : h;
    } else if (x >= 0x477ff000u) {               /* 65520 and up (inf included) round to inf */
        h = 0x7c00u;
    } else if (x < 0x38800000u) {                /* below 2^-14: a subnormal half; adding 0.5 rounds it */
        float a;
        memcpy(&a, &x, sizeof a);
        a += 0.5f;                               /* 0.5's ulp is the half subnormal's step, 2^-24 */
        uint32_t b;
        memcpy(&b, &a, sizeof b);
        h = (uint16_t)(b - 0x3f000000u);
    } else {                                     /* rebias the exponent, round the 13 bits dropped */
        x += 0xc8000fffu + ((x >> 13) & 1u);
        h = (uint16_t)(x >> 13);
    }
    return (uint16_t)(sign | h);
}

/* float -> bfloat16, to nearest even; a NaN stays a quiet NaN. */
static inline uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) x = (x & 0xffff0000u) | 0x00400000u;
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* One Q8_0 block from 32 floats: d = max|x| / 127, q = roundf(x / d) (0 where that is NaN, clamped to
 * +-127 where 1/d overflowed: the block's d carries NaN or inf on), d kept as fp16. */
static inline void q8_0_block(const float *x, uint8_t *out) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        const float a = fabsf(x[j]);
        amax = a > amax || a != a ? a : amax;    /* a NaN wins and stays */
    }
    const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = float_to_half(d);
    memcpy(out, &dh, sizeof dh);
    for (int j = 0; j < QK; j++) {
        float v = x[j] * inv;
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        out[Q8_0_QS + j] = (uint8_t)(int8_t)(v == v ? roundf(v) : 0.0f);
    }
}

/* n values from float to fmt at dst. */
static inline void kv_store(const float *src, uint8_t *dst, int64_t n, int fmt) {
    if (fmt == F32) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
    } else if (fmt == F16 || fmt == BF16) {
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = fmt == F16 ? float_to_half(src[i]) : float_to_bf16(src[i]);
            memcpy(dst + 2 * i, &h, sizeof h);
        }
    } else {
        for (int64_t b = 0; b < n / QK; b++) q8_0_block(src + b * QK, dst + b * Q8_0_BYTES);
    }
}

/* n values in fmt (not F32, which is read in place) at src -> float dst, exactly. */
static inline void kv_load(const uint8_t *src, float *dst, int64_t n, int fmt) {
    if (fmt == F16) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = half_to_float((uint16_t)(src[2 * i] | src[2 * i + 1] << 8));
    } else if (fmt == BF16) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            const uint32_t bits = (uint32_t)(src[2 * i] | src[2 * i + 1] << 8) << 16;
            memcpy(dst + i, &bits, sizeof bits);
        }
    } else {
        for (int64_t b = 0; b < n / QK; b++) {
            const uint8_t *blk = src + b * Q8_0_BYTES;
            const float d = le_half(blk);
            float *o = dst + b * QK;
#pragma omp simd
            for (int j = 0; j < QK; j++) o[j] = (float)(int8_t)blk[Q8_0_QS + j] * d;
        }
    }
}

#endif
