/* What matmul.c and the integer kernels (dot_*.c) share: the GGUF block layouts, fp16 -> float, the
 * K-quants' 6-bit scales, the vector types and the inline macro. One copy, so that the float path
 * (matmul.c) and the integer path (dot_*.c) cannot come to read a block differently. */
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
enum { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13,
       Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23, BF16 = 30 };

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
    Q2_K_BYTES = 84, Q2_K_QS = 16, Q2_K_D = 80, Q2_K_DMIN = 82,         /* scales[16] at 0 (scale | min << 4), qs[64], d, dmin */
    Q3_K_BYTES = 110, Q3_K_QS = 32, Q3_K_SCALES = 96, Q3_K_D = 108,     /* hmask[32] at 0, qs[64], 6-bit scales[12], d */
    IQ4_NL_BYTES = 18, IQ4_NL_QS = 2,                                   /* d, qs[16] as Q4_0's, indices into iq4_values */
    IQ4_XS_BYTES = 136, IQ4_XS_SCALES_H = 2, IQ4_XS_SCALES_L = 4, IQ4_XS_QS = 8,   /* d, u16, 4 bytes, qs[128] */
};

/* IQ4_NL's and IQ4_XS's 4-bit quants index this non-linear table (ggml's kvalues_iq4nl). */
static const int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* Values per block of a format; 0 for an unknown one. */
static inline int block_elems(int fmt) {
    switch (fmt) {
    case F32: case F16: case BF16: return 1;
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: case IQ4_NL: return QK;
    case Q2_K: case Q3_K: case Q4_K: case Q5_K: case Q6_K: case IQ4_XS: return QK_K;
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
    case Q2_K: return Q2_K_BYTES;
    case Q3_K: return Q3_K_BYTES;
    case IQ4_NL: return IQ4_NL_BYTES;
    case IQ4_XS: return IQ4_XS_BYTES;
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

/* Scale k (0..15) of a Q3_K block's 12 scale bytes, less 32: its low four bits are nibble k / 8 of byte k % 8,
 * its top two bits bits 2 (k / 4), 2 (k / 4) + 1 of byte 8 + k % 4. */
INLINE int scale_q3_k(const uint8_t *s, int k) {
    return (((s[k % 8] >> (4 * (k / 8))) & 15) | (((s[8 + k % 4] >> (2 * (k / 4))) & 3) << 4)) - 32;
}

/* Sub-block scale s (0..7) of an IQ4_XS block b, less 32: nibble s % 2 of scales_l[s / 2], with bits 2s, 2s + 1
 * of the little-endian u16 scales_h above it. */
INLINE int scale_iq4_xs(const uint8_t *b, int s) {
    const int h = b[IQ4_XS_SCALES_H] | (b[IQ4_XS_SCALES_H + 1] << 8);
    return (((b[IQ4_XS_SCALES_L + s / 2] >> (4 * (s % 2))) & 15) | (((h >> (2 * s)) & 3) << 4)) - 32;
}

#endif
