/* Weights repacked at load into panels of 8 rows (the layout: packed.h), and back. Portable C: it runs
 * once per matrix at load (and unpack_rows per chunk of prefill's decoding), a copy of bytes. */
#include <string.h>

#include "packed.h"

int pack_fields(int fmt, field_t *out) {
    static const field_t q4_0[] = {{0, 2}, {Q4_0_QS, 16}};
    static const field_t q4_1[] = {{0, 2}, {Q4_1_M, 2}, {Q4_1_QS, 16}};
    static const field_t q5_0[] = {{0, 2}, {Q5_0_QH, 4}, {Q5_0_QS, 16}};
    static const field_t q5_1[] = {{0, 2}, {Q5_1_M, 2}, {Q5_1_QH, 4}, {Q5_1_QS, 16}};
    static const field_t q8_0[] = {{0, 2}, {Q8_0_QS, 32}};
    static const field_t q4_k[] = {{0, 2}, {K_DMIN, 2}, {K_SCALES, 12}, {Q4_K_QS, 128}};
    static const field_t q5_k[] = {{0, 2}, {K_DMIN, 2}, {K_SCALES, 12}, {Q5_K_QH, 32}, {Q5_K_QS, 128}};
    static const field_t q6_k[] = {{0, 128}, {Q6_K_QH, 64}, {Q6_K_SCALES, 16}, {Q6_K_D, 2}};
    static const field_t q2_k[] = {{0, 16}, {Q2_K_QS, 64}, {Q2_K_D, 2}, {Q2_K_DMIN, 2}};
    static const field_t q3_k[] = {{0, 32}, {Q3_K_QS, 64}, {Q3_K_SCALES, 12}, {Q3_K_D, 2}};
    static const field_t iq4_xs[] = {{0, 2}, {IQ4_XS_SCALES_H, 2}, {IQ4_XS_SCALES_L, 4}, {IQ4_XS_QS, 128}};
    static const field_t half[] = {{0, 2}};   /* F16, BF16: a block is one value */
    const field_t *f;
    int n;
#define USE(T) (f = (T), n = (int)(sizeof(T) / sizeof(T[0])))
    switch (fmt) {
    case Q4_0: case IQ4_NL: USE(q4_0); break;   /* IQ4_NL's block is Q4_0's: d, qs[16] */
    case Q4_1: USE(q4_1); break;
    case Q5_0: USE(q5_0); break;
    case Q5_1: USE(q5_1); break;
    case Q8_0: USE(q8_0); break;
    case Q4_K: USE(q4_k); break;
    case Q5_K: USE(q5_k); break;
    case Q6_K: USE(q6_k); break;
    case Q2_K: USE(q2_k); break;
    case Q3_K: USE(q3_k); break;
    case IQ4_XS: USE(iq4_xs); break;
    case F16: case BF16: USE(half); break;
    default: return 0;
    }
#undef USE
    memcpy(out, f, (size_t)n * sizeof *f);
    return n;
}

int pack_format(int fmt) {
    field_t f[PACK_FIELDS];
    return pack_fields(fmt, f) > 0;
}

int64_t pack_bytes(int fmt, int64_t rows, int64_t in) {
    field_t f[PACK_FIELDS];
    const int be = block_elems(fmt);
    if (!pack_fields(fmt, f) || be <= 0 || in % be || rows < 0) return 0;
    return (rows + PANEL - 1) / PANEL * PANEL * (in / be) * block_bytes(fmt);
}

/* g bytes (2 or 4: the fields' chunks) from s to d, as one load and store. */
static inline void chunk(uint8_t *d, const uint8_t *s, int g) {
    if (g == 4) memcpy(d, s, 4);
    else memcpy(d, s, 2);
}

/* One strip from the 8 rows' blocks (rows at or past `live` are zeros), or back (to_blocks): each field's
 * chunks of g bytes moved whole. */
static void strip_copy(const field_t *f, int nf, uint8_t *strip, uint8_t *const *blk, int live, int to_blocks) {
    for (int i = 0; i < nf; i++) {
        const int g = f[i].size < 4 ? f[i].size : 4;
        for (int c = 0; c < f[i].size / g; c++)
            for (int r = 0; r < PANEL; r++) {
                uint8_t *s = strip + PANEL * f[i].offset + PANEL * g * c + g * r;
                uint8_t *b = blk[r] + f[i].offset + g * c;
                if (to_blocks) {
                    if (r < live) chunk(b, s, g);
                } else if (r < live) chunk(s, b, g);
                else memset(s, 0, (size_t)g);
            }
    }
}

void pack_panels(int fmt, const uint8_t *blocks, int64_t rows, int64_t in, int64_t p0, int64_t p1, uint8_t *packed) {
    field_t f[PACK_FIELDS];
    const int nf = pack_fields(fmt, f), bb = block_bytes(fmt);
    const int64_t nb = in / block_elems(fmt), row_bytes = nb * bb;
    for (int64_t p = p0; p < p1; p++) {
        const int64_t r0 = p * PANEL;
        const int live = rows - r0 < PANEL ? (int)(rows - r0) : PANEL;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk[PANEL];
            for (int r = 0; r < PANEL; r++)
                blk[r] = (uint8_t *)blocks + (r0 - p0 * PANEL + (r < live ? r : 0)) * row_bytes + b * bb;
            strip_copy(f, nf, packed + (p * nb + b) * PANEL * bb, blk, live, 0);
        }
    }
}

void unpack_rows(int fmt, const uint8_t *packed, int64_t in, int64_t r0, int64_t r1, uint8_t *blocks) {
    field_t f[PACK_FIELDS];
    const int nf = pack_fields(fmt, f), bb = block_bytes(fmt);
    const int64_t nb = in / block_elems(fmt), row_bytes = nb * bb;
    for (int64_t p = r0 / PANEL; p * PANEL < r1; p++) {
        /* the panel's rows inside r0 .. r1 to their places, a block further each strip; the others to a
         * scratch block, over and over */
        uint8_t spare[QK_K + 64], *blk[PANEL];
        int64_t step[PANEL];
        for (int r = 0; r < PANEL; r++) {
            const int64_t row = p * PANEL + r;
            const int in_range = row >= r0 && row < r1;
            blk[r] = in_range ? blocks + (row - r0) * row_bytes : spare;
            step[r] = in_range ? bb : 0;
        }
        const uint8_t *strip = packed + p * nb * PANEL * bb;
        for (int64_t b = 0; b < nb; b++, strip += PANEL * bb) {
            strip_copy(f, nf, (uint8_t *)strip, blk, PANEL, 1);
            for (int r = 0; r < PANEL; r++) blk[r] += step[r];
        }
    }
}

void unpack_row_blocks(int fmt, const uint8_t *packed, int64_t in, int64_t row, int64_t b0, int64_t b1, uint8_t *out) {
    field_t f[PACK_FIELDS];
    const int nf = pack_fields(fmt, f), bb = block_bytes(fmt);
    const int64_t nb = in / block_elems(fmt), p = row / PANEL;
    const int r = (int)(row % PANEL);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *strip = packed + (p * nb + b) * PANEL * bb;
        uint8_t *blk = out + (b - b0) * bb;
        for (int i = 0; i < nf; i++) {
            const int g = f[i].size < 4 ? f[i].size : 4;
            for (int c = 0; c < f[i].size / g; c++)
                chunk(blk + f[i].offset + g * c, strip + PANEL * f[i].offset + PANEL * g * c + g * r, g);
        }
    }
}
