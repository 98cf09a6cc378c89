/* What matmul.c and qdot.c share: the GGUF block layouts, fp16 -> float, the K-quants' 6-bit scales,
 * the vector types and the inline macro. One copy, so that the float path (matmul.c) and the integer
 * path (qdot.c) cannot come to read a block differently. */
#ifndef NVLLM_BLOCKS_H
#define NVLLM_BLOCKS_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "GGUF blocks are little-endian; these files read them as the host's integers"
#endif

#define INLINE static inline __attribute__((always_inline))
/* The helpers that take or return vectors are always inlined: no call crosses the ABI GCC warns of. */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float f32x4 __attribute__((vector_size(16)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x4 __attribute__((vector_size(16)));
typedef int32_t i32x8 __attribute__((vector_size(32)));

/* ---------------------------------------------------------------- the formats (ggml's block_* structs) */

/* GGUF type ids, as the Python side passes them. */
enum { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30 };

enum { QK = 32, QK_K = 256 };   /* values per block; per K-quant super-block */

/* Bytes per block, and where each part starts; d, m and dmin are fp16. */
enum {
    Q8_0_BYTES = 34, Q8_0_QS = 2,                   /* d, int8 qs[32] */
    Q4_0_BYTES = 18, Q4_0_QS = 2,                   /* d, qs[16]: value j < 16 the low nibble of qs[j] */
    Q4_1_BYTES = 20, Q4_1_M = 2, Q4_1_QS = 4,       /* d, m, qs[16] as Q4_0's */
    Q5_0_BYTES = 22, Q5_0_QH = 2, Q5_0_QS = 6,      /* d, qh[4] (bit j of the uint32: value j's fifth bit), qs[16] */
    Q5_1_BYTES = 24, Q5_1_M = 2, Q5_1_QH = 4, Q5_1_QS = 8,   /* d, m (where Q4_1's is), qh[4], qs[16] as Q5_0's */
    K_DMIN = 2, K_SCALES = 4,                       /* Q4_K, Q5_K: d, dmin, 12 bytes of scales and mins */
    Q4_K_BYTES = 144, Q4_K_QS = 16,                 /* ..., qs[128] */
    Q5_K_BYTES = 176, Q5_K_QH = 16, Q5_K_QS = 48,   /* ..., qh[32] (the fifth bits), qs[128] */
    Q6_K_BYTES = 210, Q6_K_QH = 128, Q6_K_SCALES = 192, Q6_K_D = 208,   /* ql[128] at 0, qh[64], int8 scales[16], d */
};

/* Values per block of a format; 0 for an unknown one. */
static inline int block_elems(int fmt) {
    switch (fmt) {
    case F32: case F16: case BF16: return 1;
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: return QK;
    case Q4_K: case Q5_K: case Q6_K: return QK_K;
    default: return 0;
    }
}

/* Bytes per block of a format; 0 for an unknown one. */
static inline int block_bytes(int fmt) {
    switch (fmt) {
    case F32: return 4;
    case F16: case BF16: return 2;
    case Q4_0: return Q4_0_BYTES;
    case Q4_1: return Q4_1_BYTES;
    case Q5_0: return Q5_0_BYTES;
    case Q5_1: return Q5_1_BYTES;
    case Q8_0: return Q8_0_BYTES;
    case Q4_K: return Q4_K_BYTES;
    case Q5_K: return Q5_K_BYTES;
    case Q6_K: return Q6_K_BYTES;
    default: return 0;
    }
}

/* ---------------------------------------------------------------- the parts of a block */

/* IEEE half -> float, exactly (subnormals, inf and NaN included), branch-free so loops vectorise:
 * the half's exponent and mantissa shifted into a float's place are the value times 2^-112. */
INLINE float half_to_float(uint16_t h) {
    uint32_t mag = (uint32_t)(h & 0x7fffu) << 13;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    float f;
    memcpy(&f, &mag, sizeof f);
    f *= 0x1p112f;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits = (h & 0x7c00u) == 0x7c00u ? (0x7f800000u | mag) : bits;   /* inf, NaN (payload kept) */
    bits |= sign;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The fp16 at p (a block's d, m or dmin). */
INLINE float le_half(const uint8_t *p) { return half_to_float((uint16_t)(p[0] | (p[1] << 8))); }

/* The j-th 6-bit scale and min of a Q4_K/Q5_K block's 12 scale bytes (llama.cpp's get_scale_min_k4). */
INLINE void scale_min_k4(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#endif
