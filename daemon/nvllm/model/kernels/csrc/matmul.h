/* What step.c calls of matmul.c: a product's output rows, a chunk at a time, on the team step.c runs. */
#ifndef NVLLM_MATMUL_H
#define NVLLM_MATMUL_H

#include <stdint.h>

/* Rows per chunk of a product of `rows` output rows on `threads` threads (whole panels). */
int64_t matmul_chunk_rows(int64_t rows, int threads);

/* Output rows r0 .. r1 of y [T, rows] = x @ W.T (fmt with PACKED_FLAG where W is packed; qx: x quantized
 * by dot.c for variant qv, or NULL: x stays float). */
void matmul_rows(int fmt, const uint8_t *w, int64_t row_bytes, int64_t rows, int64_t in, const float *x,
                 int64_t x_stride, int64_t T, float *y, int64_t y_stride, int qv, const void *qx, int64_t r0,
                 int64_t r1);

#endif
