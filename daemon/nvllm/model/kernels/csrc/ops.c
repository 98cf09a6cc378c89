/* The few loops NumPy cannot do at memory speed, called through ctypes (nvllm/model/kernels/ops.py);
 * attention has its own file, attention.c.
 *
 * - silu_mul: SwiGLU's silu(gate) * up in one pass; gelu_tanh_mul, GeGLU's (Gemma's) likewise.
 * - rms_norm, and rope_write_kv (rotary embedding of q and k in place, then k and v to their pool slots,
 *   stored in the pool's KV format): one call per layer where NumPy makes five to ten, each with its own
 *   pass and temporary.
 *
 * Plain C99, no Python headers, no intrinsics: loops are written so that -O3 vectorises them on any
 * target (SSE2/AVX on x86-64, NEON on aarch64). Every function has a NumPy twin in attention.py or
 * decoder.py that the tests compare it with.
 *
 * Built without -ffinite-math-only: a diverging model does produce NaN and inf, and they must come out
 * as NaN or inf (the model then refuses its logits), never as undefined behaviour. No loop bound and no
 * index depends on a float, and nothing converts a float to an integer. Clamps and selects are
 * ternaries, not fmaxf: its NaN rule (return the other operand) would hide a NaN, and without
 * -ffinite-math-only it is a library call that stops the loops vectorising. Array bounds are checked
 * by the callers in ops.py; these functions trust their sizes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fmath.h"
#include "kv.h"
#include "ops.h"

/* Bumped with every change to an entry point's arguments or meaning: ops.py refuses a library
 * built from another version (an editable install not rebuilt after a pull) rather than misuse it. */
int kernels_abi(void) { return 7; }   /* 2: NaN and inf defined, carried through; 3: paged_decode_part; 4: KV formats;
                                         5: sliding windows (decode window, softmax starts); 6: paged prefill,
                                         decode and prefill by one online softmax (attention.c); 7: gelu_erf,
                                         encoder_attention_part
                                         (step.c's entry points per head, column and row: not called from Python) */

/* Columns c0 .. c1 of one row: gate_up [2I] (gate then up) -> out [I] = silu(gate) * up. Each value on its own,
 * so a row split across threads gets the same bits. */
ENTRY void silu_mul_cols(const float *gate_up, float *out, int64_t inter, int64_t c0, int64_t c1) {
    const float *gt = gate_up, *up = gt + inter;
#pragma omp simd
    for (int64_t i = c0; i < c1; i++) {
        /* sigmoid from e = exp(-|x|), which cannot overflow: 1/(1+e) for x >= 0, e/(1+e) below (NaN
         * takes the second, so it stays NaN); a select, not a branch, so that the loop vectorises */
        const float x = gt[i], e = exp_nonpos(-fabsf(x));
        out[i] = x * (x >= 0.0f ? 1.0f : e) / (1.0f + e) * up[i];
    }
}

/* gate_up [T, 2I] (gate then up, per row) -> out [T, I] = silu(gate) * up. */
void silu_mul(const float *gate_up, float *out, int64_t T, int64_t inter) {
    for (int64_t t = 0; t < T; t++) silu_mul_cols(gate_up + t * 2 * inter, out + t * inter, inter, 0, inter);
}

/* gelu_tanh_mul's columns c0 .. c1 of one row, as silu_mul_cols. */
ENTRY void gelu_tanh_mul_cols(const float *gate_up, float *out, int64_t inter, int64_t c0, int64_t c1) {
    const float *gt = gate_up, *up = gt + inter;
    for (int64_t i = c0; i < c1; i++) {
        const float x = gt[i];
        out[i] = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))) * up[i];
    }
}

/* gate_up [T, 2I] -> out [T, I] = gelu_tanh(gate) * up: GeGLU, with PyTorch's tanh approximation of gelu. */
void gelu_tanh_mul(const float *gate_up, float *out, int64_t T, int64_t inter) {
    for (int64_t t = 0; t < T; t++) gelu_tanh_mul_cols(gate_up + t * 2 * inter, out + t * inter, inter, 0, inter);
}

/* x [n] in place -> x (1 + erf(x / sqrt 2)) / 2: transformers' "gelu" (BERT's MLP), erf by Abramowitz and
 * Stegun 7.1.26 (within 1.5e-7) with exp_nonpos, so the loop has no calls and vectorises; the same formula
 * as its NumPy twin (model/encoder.py's gelu). NaN stays NaN. */
ENTRY void gelu_erf(float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i], z = fabsf(v) * 0.70710678f;
        const float t = 1.0f / (1.0f + 0.3275911f * z);
        const float poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t +
                            0.254829592f) * t;
        const float e = 1.0f - poly * exp_nonpos(-z * z);
        x[i] = 0.5f * v * (1.0f + (v < 0.0f ? -e : e));
    }
}

/* 1 / sqrt(mean(x^2) + eps) of one row of H: rms_norm's scale. Not inlined, so the sum of squares is the same
 * code (the same order of additions) wherever it is called: step.c's threads each compute it for a row
 * whose columns they share out. */
ENTRY __attribute__((noinline)) float rms_inv(const float *x, int64_t H, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < H; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)H + eps);
}

/* Columns c0 .. c1 of one row: out = x * inv * weight (inv from rms_inv). */
ENTRY void rms_scale(const float *x, const float *weight, float *out, float inv, int64_t c0, int64_t c1) {
#pragma omp simd
    for (int64_t i = c0; i < c1; i++) out[i] = x[i] * inv * weight[i];
}

/* x [T, H] -> out [T, H] = x / sqrt(mean(x^2) + eps) * weight, one row at a time. */
void rms_norm(const float *x, const float *weight, float *out, int64_t T, int64_t H, float eps) {
    for (int64_t t = 0; t < T; t++) rms_scale(x + t * H, weight, out + t * H, rms_inv(x + t * H, H, eps), 0, H);
}

/* One head of one row of rope_write_kv: head h < nq is a q head (rope and scale in place); head nq + i is
 * KV head i (rope on its keys in place, then its keys and values stored at the row's slot). Heads are
 * independent, so a team may share a row's heads out. */
ENTRY void rope_write_kv_head(float *row, int64_t nq, int64_t nk, int64_t hd, const float *c, const float *s,
                              float q_scale, int64_t slot, void *k_pool, void *v_pool, int fmt, int64_t h) {
    const int64_t half = hd / 2;
    float *x1 = row + h * hd, *x2 = x1 + half;
    const float f = h < nq ? q_scale : 1.0f;
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        const float a = x1[i], b = x2[i];
        x1[i] = (a * c[i] - b * s[i]) * f;
        x2[i] = (b * c[i] + a * s[i]) * f;
    }
    if (h < nq) return;
    const int64_t kv = h - nq, row_bytes = kv_bytes(fmt, nk * hd), at = slot * row_bytes + kv_bytes(fmt, kv * hd);
    kv_store(row + h * hd, (uint8_t *)k_pool + at, hd, fmt);
    kv_store(row + (nq + nk + kv) * hd, (uint8_t *)v_pool + at, hd, fmt);
}

/* One layer's new q, k and v, in the qkv rows [T, row_stride] the projection wrote (q heads, then k,
 * then v): q and k get the rotary embedding in place, as transformers' rotate_half does for Llama and
 * Qwen2 (a head's two halves are the pairs; cos and sin are [T, hd/2]), q also the softmax scale; then
 * k and v are stored in KV format fmt at their slots of the page pools [num_slots, nk * hd]. */
void rope_write_kv(float *qkv, int64_t T, int64_t row_stride, int64_t nq, int64_t nk, int64_t hd,
                   const float *cos_t, const float *sin_t, float q_scale, const int64_t *slots,
                   void *k_pool, void *v_pool, int fmt) {
    const int64_t half = hd / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nq + nk; h++)
            rope_write_kv_head(qkv + t * row_stride, nq, nk, hd, cos_t + t * half, sin_t + t * half, q_scale,
                               slots[t], k_pool, v_pool, fmt, h);
}

