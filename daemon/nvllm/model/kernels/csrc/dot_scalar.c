/* The reference kernels: packed.h's arithmetic in portable C, one row and one unit at a time, from the
 * GGUF blocks a strip holds (read back with strip_byte). Every SIMD variant is tested against these and
 * against kernels/qdot.py; where no SIMD variant runs, dot.c prefers the float path (faster than this). */
#include <string.h>

#include "packed.h"
#include "peak.h"

/* Row r's block of a strip, as the file stored it. */
static void row_block(int fmt, const uint8_t *strip, int r, uint8_t *blk) {
    field_t f[PACK_FIELDS];
    const int nf = pack_fields(fmt, f);
    for (int i = 0; i < nf; i++)
        for (int k = 0; k < f[i].size; k++) blk[f[i].offset + k] = *strip_byte(strip, f[i].offset, f[i].size, r, k);
}

/* A unit's weights: 32 integer quants (w), the scale of each half (dw[0] = dw[1] but for Q6_K, Q3_K and
 * Q2_K), the min (mw; 0 where none) and, for Q2_K, each half's min (hmw). */
typedef struct {
    int8_t w[32];
    float dw[2], mw, hmw[2];
} unit_t;

/* Sub-block s (values 32 s .. 32 s + 31) of a block, as qdot.py's weight_quants has it. */
static void unit_of(int fmt, const uint8_t *b, int s, unit_t *u) {
    u->mw = u->hmw[0] = u->hmw[1] = 0.0f;
    const float d = le_half(b + (fmt == Q6_K ? Q6_K_D : fmt == Q2_K ? Q2_K_D : fmt == Q3_K ? Q3_K_D : 0));
    u->dw[0] = u->dw[1] = d;
    for (int j = 0; j < 32; j++) {
        const int l = j % 16, hi = j / 16;   /* legacy blocks: low nibbles, then high */
        int q;
        switch (fmt) {
        case Q8_0: q = (int8_t)b[Q8_0_QS + j]; break;
        case Q4_0: q = ((b[Q4_0_QS + l] >> (4 * hi)) & 15) - 8; break;
        case Q4_1: q = (b[Q4_1_QS + l] >> (4 * hi)) & 15; break;
        case Q5_0: case Q5_1: {
            const int qs = fmt == Q5_0 ? Q5_0_QS : Q5_1_QS, qh = fmt == Q5_0 ? Q5_0_QH : Q5_1_QH;
            q = ((b[qs + l] >> (4 * hi)) & 15) | (((b[qh + j / 8] >> (j % 8)) & 1) << 4);
            if (fmt == Q5_0) q -= 16;
            break;
        }
        case IQ4_NL: q = iq4_values[(b[IQ4_NL_QS + l] >> (4 * hi)) & 15]; break;
        case IQ4_XS: q = iq4_values[(b[IQ4_XS_QS + 16 * s + l] >> (4 * hi)) & 15]; break;
        case Q4_K: case Q5_K: {
            const int qs = fmt == Q4_K ? Q4_K_QS : Q5_K_QS;
            q = (b[qs + 32 * (s / 2) + j] >> (4 * (s % 2))) & 15;
            if (fmt == Q5_K) q |= ((b[Q5_K_QH + j] >> s) & 1) << 4;
            break;
        }
        case Q6_K: {   /* value 128 n + 32 k + j */
            const int n = s / 4, k = s % 4;
            q = ((b[64 * n + j + 32 * (k % 2)] >> (4 * (k / 2))) & 15) | (((b[Q6_K_QH + 32 * n + j] >> (2 * k)) & 3) << 4);
            q -= 32;
            break;
        }
        case Q2_K: case Q3_K: {   /* crumb k of qs[32 n + j] */
            const int n = s / 4, k = s % 4, qs = fmt == Q2_K ? Q2_K_QS : Q3_K_QS;
            q = (b[qs + 32 * n + j] >> (2 * k)) & 3;
            if (fmt == Q3_K && !((b[j] >> s) & 1)) q -= 4;   /* hmask at 0: bit s of hmask[j] */
            break;
        }
        default: q = 0;
        }
        u->w[j] = (int8_t)q;
    }
    int sc, mn;
    switch (fmt) {
    case Q4_1: case Q5_1: u->mw = le_half(b + Q4_1_M); break;
    case Q4_K: case Q5_K:
        scale_min_k4(b + K_SCALES, s, &sc, &mn);
        u->dw[0] = u->dw[1] = d * (float)sc;
        u->mw = -(le_half(b + K_DMIN) * (float)mn);
        break;
    case IQ4_XS: u->dw[0] = u->dw[1] = d * (float)scale_iq4_xs(b, s); break;
    case Q6_K:
        for (int h = 0; h < 2; h++) u->dw[h] = d * (float)(int8_t)b[Q6_K_SCALES + 2 * s + h];
        break;
    case Q3_K:
        for (int h = 0; h < 2; h++) u->dw[h] = d * (float)scale_q3_k(b + Q3_K_SCALES, 2 * s + h);
        break;
    case Q2_K:
        for (int h = 0; h < 2; h++) {
            u->dw[h] = d * (float)(b[2 * s + h] & 15);
            u->hmw[h] = -(le_half(b + Q2_K_DMIN) * (float)(b[2 * s + h] >> 4));
        }
        break;
    default: break;
    }
}

/* The products of unit u with x's block xb over values j0 .. j1, exactly. */
static int32_t sum8(const unit_t *u, const xq8_t *xb, int j0, int j1) {
    int32_t p = 0;
    for (int j = j0; j < j1; j++) p += (int32_t)u->w[j] * xb->q[j];
    return p;
}

static int32_t sum16(const unit_t *u, const xq16_t *xb, int j0, int j1) {
    int32_t hi = 0, lo = 0;
    for (int j = j0; j < j1; j++) hi += (int32_t)u->w[j] * xb->hi[j], lo += (int32_t)u->w[j] * xb->lo[j];
    return 255 * hi + lo;
}

#define TMAX 64   /* rows of x per pass over a panel */

static void panels(int fmt, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1, const void *qx, int64_t T,
                   float *y, int64_t ys, int64_t rows, int wide) {
    const int bb = block_bytes(fmt), units = block_elems(fmt) / 32;
    const int halves = fmt == Q6_K || fmt == Q3_K || fmt == Q2_K;
    const int min32 = fmt == Q4_1 || fmt == Q5_1 || fmt == Q4_K || fmt == Q5_K;
    const int64_t nx = nb * units;   /* x's blocks per row */
    for (int64_t p = p0; p < p1; p++)
        for (int64_t t0 = 0; t0 < T; t0 += TMAX) {
            const int64_t tn = T - t0 < TMAX ? T - t0 : TMAX;
            float acc[TMAX][PANEL];
            memset(acc, 0, sizeof acc);
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *strip = packed + (p * nb + b) * PANEL * bb;
                for (int r = 0; r < PANEL; r++) {
                    uint8_t blk[QK_K];
                    row_block(fmt, strip, r, blk);
                    for (int s = 0; s < units; s++) {
                        unit_t u;
                        unit_of(fmt, blk, s, &u);
                        for (int64_t t = 0; t < tn; t++) {
                            const int64_t xi = (t0 + t) * nx + b * units + s;
                            const xq8_t *x8 = (const xq8_t *)qx + xi;
                            const xq16_t *x16 = (const xq16_t *)qx + xi;
                            const float d = wide ? x16->d : x8->d, sx = wide ? x16->s : x8->s;
                            const int32_t *sums = wide ? x16->sum : x8->sum;
                            float a = acc[t][r];
                            if (halves) {
                                for (int h = 0; h < 2; h++) {
                                    const int32_t q = wide ? sum16(&u, x16, 16 * h, 16 * h + 16) : sum8(&u, x8, 16 * h, 16 * h + 16);
                                    a = a + (u.dw[h] * d) * (float)q;
                                }
                                if (fmt == Q2_K)
                                    for (int h = 0; h < 2; h++) a = a + (d * u.hmw[h]) * (float)sums[h];
                            } else {
                                const int32_t q = wide ? sum16(&u, x16, 0, 32) : sum8(&u, x8, 0, 32);
                                a = a + (u.dw[0] * d) * (float)q;
                                if (min32) a = a + u.mw * sx;
                            }
                            acc[t][r] = a;
                        }
                    }
                }
            }
            for (int64_t t = 0; t < tn; t++)
                for (int r = 0; r < PANEL && p * PANEL + r < rows; r++) y[(t0 + t) * ys + p * PANEL + r] = acc[t][r];
        }
}

static void scalar_int8(int fmt, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1, const void *qx, int64_t T,
                        float *y, int64_t ys, int64_t rows) {
    panels(fmt, packed, nb, p0, p1, qx, T, y, ys, rows, 0);
}

static void scalar_exact(int fmt, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1, const void *qx,
                         int64_t T, float *y, int64_t ys, int64_t rows) {
    panels(fmt, packed, nb, p0, p1, qx, T, y, ys, rows, 1);
}

/* The portable kernels' own loop: what the compiler makes of int32 multiply-accumulates. Each sum is hidden
 * after its step, or c + a * b + a' * b is made c + (a + a') * b, one product for two. */
#define SCALAR_KEEP(a) __asm__ volatile("" : "+r"(a))
static inline int32_t scalar_step(int32_t c, int32_t a, int32_t b) {
    c += a * b;
    SCALAR_KEEP(c);
    return c;
}

static int64_t scalar_peak(int64_t reps) {
    int32_t b = 3;
#define SCALAR_SPLAT(i) (i)
#define SCALAR_XOR(t, c) ((t) ^ (c))
    PEAK_BODY(int32_t, int32_t, PEAK_EACH4, PEAK_EACH4, PEAK_OWN, SCALAR_KEEP, scalar_step, SCALAR_SPLAT, SCALAR_XOR)
    return reps * steps;
}

/* F16 and BF16 (dot_float.h), in portable C: one row of x a pass */
#define FP_PREFIX scalar
#define FP_M 1
#define FP_PORTABLE 1
#include "dot_float.h"

const dot_isa_t dot_scalar = {scalar_int8, scalar_exact, scalar_floats, scalar_peak};
