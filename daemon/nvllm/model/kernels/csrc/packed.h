/* The repacked weights and the integer kernels that read them: the one header every dot_*.c file
 * implements and dot.c dispatches to.
 *
 * ---------------------------------------------------------------- the layout (pack.c writes it at load)
 * A matrix W [rows, in] in a GGUF block format is cut into panels of PANEL = 8 rows (the last one padded
 * with zero rows: a zero block is a block of zeros in every format, and padded outputs are never
 * stored). A panel is nb strips, one per block of a row (nb = in / values per block, 32 or 256); a strip
 * holds the 8 rows' copies of that block, 8 * block_bytes bytes, field by field in the block's own order
 * (pack_fields gives the fields: d, m, qh, qs, scales, ...). A field of F bytes takes 8 F bytes of the
 * strip: its bytes in chunks of g = min(4, F), chunk c of every row in turn, row r's at
 *     strip + 8 * field_offset + 8 g c + g r.
 * So a 256-bit vector of a quant field is 8 lanes of 32 bits, lane r holding four consecutive bytes of
 * row r (the 4 values of a nibble or byte field the kernels multiply by a broadcast of x's 4 matching
 * values: no horizontal sum, each lane its own output); d, m and dmin are 8 halves side by side (one
 * conversion gives the panel's scales); the K-quants' packed scale bytes come as whole 32-bit lanes,
 * unpacked for 8 rows at once. Nothing is decoded and nothing added: the packed matrix is exactly as big
 * as the file's blocks (plus the padding rows), and unpack_rows gives the blocks back byte for byte
 * (prefill's decoders and the embedding lookup read them so).
 *
 * ---------------------------------------------------------------- x (dot.c quantizes it, per call)
 * Each row of x in blocks of 32 values, each with one float scale d = amax / QMAX and integer quants
 * q = v / d rounded to nearest, ties to even (a block with NaN or inf: d = s = NaN, q = 0):
 *   int8:  QMAX = 127, q in one int8 plane (llama.cpp's activations);
 *   exact: QMAX = 32512 = 127 * 255 + 127, q in two int8 planes, q = 255 hi + lo (hi = floor((q + 127) / 255),
 *          lo = q - 255 hi, both in -127 .. 127): the 8-bit dot instructions multiply each plane exactly,
 *          and 255 p_hi + p_lo is the 16-bit product. Base 255, not 256: both planes then stay off -128,
 *          which AVX2's sign trick (maddubs of |w| by x with w's sign) cannot negate.
 * sum[h] is the sum of the quants of values 16 h .. 16 h + 15 (the kernels' offset corrections), and
 * s = d * (float)(sum[0] + sum[1]) (the min term of Q4_1, Q5_1, Q4_K and Q5_K).
 *
 * ---------------------------------------------------------------- what every kernel computes
 * The arithmetic of kernels/qdot.py, bit for bit: per output, from acc = 0, the units of the row in
 * order (32 values; 16 for Q6_K, Q3_K and Q2_K, the halves of each 32):
 *   p = sum of w_j * q_j, exact in int32, w_j the weight's integer quant as qdot.py's weight_quants has it;
 *   acc = acc + (dw * d) * (float)p                       (two roundings, no FMA)
 *   Q4_1, Q5_1, Q4_K, Q5_K (per 32): acc = acc + mw * s;  Q2_K (per 16, after both halves' products):
 *   acc = acc + (d * mw) * (float)(sum of the half's quants of x).
 * How p is found is the kernel's business (an offset added to make the weights unsigned and taken away
 * as off * sum; byte planes; any order of the products): every variant, thread count and batch gives a
 * row the same bits.
 *
 * ---------------------------------------------------------------- plain floats: F16 and BF16
 * Their blocks are one value (2 bytes), so a strip is the 8 rows' values at one k, side by side: a vector
 * of 8 lanes, one per row. x stays float32. Per output, four sums from 0, sum j taking the products at
 * k = j mod 4 in increasing k, each step s = s + w * x (two roundings, no FMA), then (s0 + s1) + (s2 + s3):
 * kernels/fdot.py is the twin, dot_float.h the one body every instruction set compiles.
 */
#ifndef NVLLM_PACKED_H
#define NVLLM_PACKED_H

#include <stddef.h>
#include <stdint.h>

#include "blocks.h"

#define PANEL 8            /* rows per panel */
#define PACKED_FLAG 0x100  /* in a format id passed to matmul.c: the weights are packed (this layout) */
#define QMAX8 127.0f
#define QMAX16 32512.0f    /* 127 * 255 + 127: hi and lo both in -127 .. 127 */

/* A block of 32 values of x, int8 activations: 48 bytes. */
typedef struct {
    float d, s;
    int32_t sum[2];
    int8_t q[32];
} xq8_t;

/* The same with exact (16-bit) activations as two planes: 80 bytes. */
typedef struct {
    float d, s;
    int32_t sum[2];
    int8_t hi[32], lo[32];
} xq16_t;

/* One field of a block: where it starts and how many bytes it has. */
typedef struct {
    int offset, size;
} field_t;

/* ---------------------------------------------------------------- pack.c */

/* The fields of a block of fmt, in order, into out (at most PACK_FIELDS); returns how many (0: a format
 * that is not packed). */
#define PACK_FIELDS 6
int pack_fields(int fmt, field_t *out);
/* 1 if fmt is packed, 0 if not. */
int pack_format(int fmt);
/* Bytes of the packed form of W [rows, in]: rows rounded up to a panel. 0 for a format not packed. */
int64_t pack_bytes(int fmt, int64_t rows, int64_t in);
/* Panels p0 .. p1 of W [rows, in] into packed (the whole matrix's, laid out as pack_bytes counts) from
 * `blocks`, W's rows from row 8 p0 on [.., row_bytes] (so a matrix can be packed a chunk at a time). */
void pack_panels(int fmt, const uint8_t *blocks, int64_t rows, int64_t in, int64_t p0, int64_t p1, uint8_t *packed);
/* Rows r0 .. r1 of the packed W back to GGUF blocks [r1 - r0, row_bytes]. */
void unpack_rows(int fmt, const uint8_t *packed, int64_t in, int64_t r0, int64_t r1, uint8_t *blocks);

/* Blocks b0 .. b1 of row `row` of the packed W back to GGUF blocks, one after the other into out. */
void unpack_row_blocks(int fmt, const uint8_t *packed, int64_t in, int64_t row, int64_t b0, int64_t b1, uint8_t *out);

/* F16 and BF16: packed, multiplied in float (dot_floats_fn), x never quantized. */
static inline int pack_floats(int fmt) { return fmt == F16 || fmt == BF16; }

/* Byte k of the field at `offset` (`size` bytes) of row r in a strip. */
static inline const uint8_t *strip_byte(const uint8_t *strip, int offset, int size, int r, int k) {
    const int g = size < 4 ? size : 4;
    return strip + PANEL * offset + PANEL * g * (k / g) + g * r + k % g;
}

/* ---------------------------------------------------------------- the kernels (dot_*.c)
 *
 * y[t, r] for the rows r of panels p0 .. p1 (only r < rows stored) and every row t < T of x, qx being T
 * rows of nb32 = in / 32 blocks (xq8_t or xq16_t as the function's mode), y with row stride ys. nb is W's
 * blocks per row (in / 32 or in / 256). Every format pack_fields knows. */
typedef void (*dot_panels_fn)(int fmt, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1, const void *qx,
                              int64_t T, float *y, int64_t ys, int64_t rows);

/* The same for F16 and BF16 weights (pack_floats), x float32 [T, in] with row stride xs. */
typedef void (*dot_floats_fn)(int fmt, const uint8_t *packed, int64_t in, int64_t p0, int64_t p1, const float *x,
                              int64_t xs, int64_t T, float *y, int64_t ys, int64_t rows);

/* An instruction set: its kernels for each mode and for plain floats, and its peak loop (peak.h): the
 * multiply-accumulates of `reps` iterations of its 8-bit dot instruction on registers. */
typedef struct {
    dot_panels_fn int8, exact;
    dot_floats_fn floats;
    int64_t (*peak)(int64_t reps);
} dot_isa_t;

extern const dot_isa_t dot_scalar;
#if defined(__x86_64__)
extern const dot_isa_t dot_avx2, dot_avx512vnni;
#endif
#if defined(__aarch64__)
extern const dot_isa_t dot_neon, dot_dotprod;
#endif

/* ---------------------------------------------------------------- dot.c: the entry points (matmul.c's) */

int dot_variants(void);
const char *dot_variant_name(int v);
int dot_variant(int v);
size_t dot_x_bytes(int v, int64_t T, int64_t in);
void dot_quantize_x(int v, const float *x, int64_t x_stride, int64_t in, int64_t t0, int64_t tn, void *qx);
int dot_panels(int v, int fmt, const uint8_t *packed, int64_t in, int64_t p0, int64_t p1, const void *qx, int64_t T,
               float *y, int64_t ys, int64_t rows);
int dot_float_panels(int v, int fmt, const uint8_t *packed, int64_t in, int64_t p0, int64_t p1, const float *x,
                     int64_t xs, int64_t T, float *y, int64_t ys, int64_t rows);
int64_t dot_peak(int v, int64_t reps);

#endif
