/* What dot_avx2.c and dot_avx512vnni.c share: reading a strip (packed.h) into vectors of 32-bit lanes, a
 * lane an output row, and the loops over panels, strips, units and rows of x. A file includes it after its
 * `#pragma GCC target` (so this code is compiled for that instruction set) and after defining
 *   DOT_X86_SIGNED  1 where Q8_0's and the IQ4 tables' weights stay signed (AVX2's sign trick), 0 where
 *                   they are made unsigned by + 128 (VNNI's dpbusd takes unsigned weights);
 *   X86_WIDE        0: 256-bit vectors, one panel each; 1: 512 bits, two panels (below);
 *   X86_SFX         a suffix for every name defined here, so that a file may include it once for each
 *                   width: the plain names stay mapped to the last inclusion's, and x86_panels##X86_SFX
 *                   (the entry) names each;
 * and then defines (as isa_dot, after each inclusion) the one function declared here:
 *   isa_dot(fmt, w, xq, halves, &p0, &p1)  the exact int32 products of a unit's 8 weight vectors with 32
 *                   int8 values of x (xq; vector k meets xq[4k .. 4k + 3]): *p0 the whole sum, or with
 *                   halves the sums of vectors 0..3 (*p0) and 4..7 (*p1).
 *
 * A unit (32 values of each row) is 8 vectors of bytes, vector k lane r holding values 4k .. 4k + 3 of
 * row r, as integers w + off >= 0 (off: the format's offset, taken away afterwards as off * x's sum). Its
 * scales are float lanes: dw (per half for Q6_K, Q3_K, Q2_K), mw (the min of Q4_1, Q5_1, Q4_K, Q5_K;
 * Q2_K's two half mins). Every product and sum is packed.h's, in its order. */
#include <immintrin.h>

#include "packed.h"

#ifndef X86_SFX
#error "dot_x86.h: define X86_SFX (and X86_WIDE, DOT_X86_SIGNED) first"
#endif
#ifndef X86_CAT
#define X86_CAT_(a, b) a##b
#define X86_CAT(a, b) X86_CAT_(a, b)
#endif
/* every name below, suffixed: this inclusion's */
#undef vi
#define vi X86_CAT(vi, X86_SFX)
#undef vf
#define vf X86_CAT(vf, X86_SFX)
#undef vld
#define vld X86_CAT(vld, X86_SFX)
#undef vld16x2
#define vld16x2 X86_CAT(vld16x2, X86_SFX)
#undef vhalf
#define vhalf X86_CAT(vhalf, X86_SFX)
#undef vu16
#define vu16 X86_CAT(vu16, X86_SFX)
#undef vand
#define vand X86_CAT(vand, X86_SFX)
#undef vor
#define vor X86_CAT(vor, X86_SFX)
#undef vxor
#define vxor X86_CAT(vxor, X86_SFX)
#undef vadd32
#define vadd32 X86_CAT(vadd32, X86_SFX)
#undef vsub32
#define vsub32 X86_CAT(vsub32, X86_SFX)
#undef vmullo32
#define vmullo32 X86_CAT(vmullo32, X86_SFX)
#undef vsrl32
#define vsrl32 X86_CAT(vsrl32, X86_SFX)
#undef vsll32
#define vsll32 X86_CAT(vsll32, X86_SFX)
#undef vsra32
#define vsra32 X86_CAT(vsra32, X86_SFX)
#undef vsrl16
#define vsrl16 X86_CAT(vsrl16, X86_SFX)
#undef vshuf8
#define vshuf8 X86_CAT(vshuf8, X86_SFX)
#undef vset32
#define vset32 X86_CAT(vset32, X86_SFX)
#undef vset8
#define vset8 X86_CAT(vset8, X86_SFX)
#undef vzero
#define vzero X86_CAT(vzero, X86_SFX)
#undef vtable16
#define vtable16 X86_CAT(vtable16, X86_SFX)
#undef vcvt
#define vcvt X86_CAT(vcvt, X86_SFX)
#undef vmul
#define vmul X86_CAT(vmul, X86_SFX)
#undef vaddf
#define vaddf X86_CAT(vaddf, X86_SFX)
#undef vsetf
#define vsetf X86_CAT(vsetf, X86_SFX)
#undef vzerof
#define vzerof X86_CAT(vzerof, X86_SFX)
#undef vneg
#define vneg X86_CAT(vneg, X86_SFX)
#undef vlow
#define vlow X86_CAT(vlow, X86_SFX)
#undef vhigh
#define vhigh X86_CAT(vhigh, X86_SFX)
#undef x86_st_t
#define x86_st_t X86_CAT(x86_st_t, X86_SFX)
#undef x86_scales_t
#define x86_scales_t X86_CAT(x86_scales_t, X86_SFX)
#undef x86_ld
#define x86_ld X86_CAT(x86_ld, X86_SFX)
#undef x86_half8
#define x86_half8 X86_CAT(x86_half8, X86_SFX)
#undef x86_c32
#define x86_c32 X86_CAT(x86_c32, X86_SFX)
#undef x86_byte
#define x86_byte X86_CAT(x86_byte, X86_SFX)
#undef x86_x4
#define x86_x4 X86_CAT(x86_x4, X86_SFX)
#undef isa_dot
#define isa_dot X86_CAT(isa_dot, X86_SFX)
#undef x86_units
#define x86_units X86_CAT(x86_units, X86_SFX)
#undef x86_halves
#define x86_halves X86_CAT(x86_halves, X86_SFX)
#undef x86_min32
#define x86_min32 X86_CAT(x86_min32, X86_SFX)
#undef x86_offset
#define x86_offset X86_CAT(x86_offset, X86_SFX)
#undef x86_iq4_table
#define x86_iq4_table X86_CAT(x86_iq4_table, X86_SFX)
#undef x86_nib
#define x86_nib X86_CAT(x86_nib, X86_SFX)
#undef x86_q5_high
#define x86_q5_high X86_CAT(x86_q5_high, X86_SFX)
#undef x86_nib16
#define x86_nib16 X86_CAT(x86_nib16, X86_SFX)
#undef x86_bit_to
#define x86_bit_to X86_CAT(x86_bit_to, X86_SFX)
#undef x86_unit_w
#define x86_unit_w X86_CAT(x86_unit_w, X86_SFX)
#undef x86_strip_scales
#define x86_strip_scales X86_CAT(x86_strip_scales, X86_SFX)
#undef x86_step
#define x86_step X86_CAT(x86_step, X86_SFX)
#undef x86_store8
#define x86_store8 X86_CAT(x86_store8, X86_SFX)
#undef x86_store
#define x86_store X86_CAT(x86_store, X86_SFX)
#undef x86_panels_1
#define x86_panels_1 X86_CAT(x86_panels_1, X86_SFX)
#undef x86_tile
#define x86_tile X86_CAT(x86_tile, X86_SFX)
#undef x86_panels_t
#define x86_panels_t X86_CAT(x86_panels_t, X86_SFX)
#undef x86_panels
#define x86_panels X86_CAT(x86_panels, X86_SFX)
#undef x86_pf_t
#define x86_pf_t X86_CAT(x86_pf_t, X86_SFX)
#undef x86_pf_next
#define x86_pf_next X86_CAT(x86_pf_next, X86_SFX)
#undef X86_NP

/* The vector: 256 bits, one panel (lane r row r); or with X86_WIDE 512 bits, two panels side by side
 * (lanes 0..7 panel p, 8..15 panel p + 1: each load is a strip's 32 bytes and the next panel's, so every
 * instruction serves 16 rows; AVX-512 VNNI's dpbusd on 512 bits is as many instructions a cycle as on 256
 * on the machines measured, twice the products). Everything below is per lane, whichever. */
#if X86_WIDE
typedef __m512i vi;
typedef __m512 vf;
#define X86_NP 2   /* panels a vector */
INLINE vi vld(const uint8_t *a, const uint8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}
INLINE __m256i vld16x2(const uint8_t *a, const uint8_t *b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                   _mm_loadu_si128((const __m128i *)b), 1);
}
INLINE vf vhalf(const uint8_t *a, const uint8_t *b) { return _mm512_cvtph_ps(vld16x2(a, b)); }
INLINE vi vu16(const uint8_t *a, const uint8_t *b) { return _mm512_cvtepu16_epi32(vld16x2(a, b)); }
INLINE vi vand(vi a, vi b) { return _mm512_and_si512(a, b); }
INLINE vi vor(vi a, vi b) { return _mm512_or_si512(a, b); }
INLINE vi vxor(vi a, vi b) { return _mm512_xor_si512(a, b); }
INLINE vi vadd32(vi a, vi b) { return _mm512_add_epi32(a, b); }
INLINE vi vsub32(vi a, vi b) { return _mm512_sub_epi32(a, b); }
INLINE vi vmullo32(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
INLINE vi vsrl32(vi a, int n) { return _mm512_srli_epi32(a, (unsigned)n); }
INLINE vi vsll32(vi a, int n) { return _mm512_slli_epi32(a, (unsigned)n); }
INLINE vi vsra32(vi a, int n) { return _mm512_srai_epi32(a, (unsigned)n); }
INLINE vi vsrl16(vi a, int n) { return _mm512_srli_epi16(a, (unsigned)n); }
INLINE vi vshuf8(vi t, vi i) { return _mm512_shuffle_epi8(t, i); }
INLINE vi vset32(int32_t v) { return _mm512_set1_epi32(v); }
INLINE vi vset8(char v) { return _mm512_set1_epi8(v); }
INLINE vi vzero(void) { return _mm512_setzero_si512(); }
INLINE vi vtable16(__m128i t) { return _mm512_broadcast_i32x4(t); }
INLINE vf vcvt(vi a) { return _mm512_cvtepi32_ps(a); }
INLINE vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
INLINE vf vaddf(vf a, vf b) { return _mm512_add_ps(a, b); }
INLINE vf vsetf(float v) { return _mm512_set1_ps(v); }
INLINE vf vzerof(void) { return _mm512_setzero_ps(); }
INLINE vf vneg(vf a) { return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN))); }
/* The two panels' halves. */
INLINE __m256 vlow(vf a) { return _mm512_castps512_ps256(a); }
INLINE __m256 vhigh(vf a) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)); }
#else
typedef __m256i vi;
typedef __m256 vf;
#define X86_NP 1
INLINE vi vld(const uint8_t *a, const uint8_t *b) {
    (void)b;
    return _mm256_loadu_si256((const __m256i *)a);
}
INLINE vf vhalf(const uint8_t *a, const uint8_t *b) {
    (void)b;
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)a));
}
INLINE vi vu16(const uint8_t *a, const uint8_t *b) {
    (void)b;
    return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)a));
}
INLINE vi vand(vi a, vi b) { return _mm256_and_si256(a, b); }
INLINE vi vor(vi a, vi b) { return _mm256_or_si256(a, b); }
INLINE vi vxor(vi a, vi b) { return _mm256_xor_si256(a, b); }
INLINE vi vadd32(vi a, vi b) { return _mm256_add_epi32(a, b); }
INLINE vi vsub32(vi a, vi b) { return _mm256_sub_epi32(a, b); }
INLINE vi vmullo32(vi a, vi b) { return _mm256_mullo_epi32(a, b); }
INLINE vi vsrl32(vi a, int n) { return _mm256_srli_epi32(a, n); }
INLINE vi vsll32(vi a, int n) { return _mm256_slli_epi32(a, n); }
INLINE vi vsra32(vi a, int n) { return _mm256_srai_epi32(a, n); }
INLINE vi vsrl16(vi a, int n) { return _mm256_srli_epi16(a, n); }
INLINE vi vshuf8(vi t, vi i) { return _mm256_shuffle_epi8(t, i); }
INLINE vi vset32(int32_t v) { return _mm256_set1_epi32(v); }
INLINE vi vset8(char v) { return _mm256_set1_epi8(v); }
INLINE vi vzero(void) { return _mm256_setzero_si256(); }
INLINE vi vtable16(__m128i t) { return _mm256_broadcastsi128_si256(t); }
INLINE vf vcvt(vi a) { return _mm256_cvtepi32_ps(a); }
INLINE vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
INLINE vf vaddf(vf a, vf b) { return _mm256_add_ps(a, b); }
INLINE vf vsetf(float v) { return _mm256_set1_ps(v); }
INLINE vf vzerof(void) { return _mm256_setzero_ps(); }
INLINE vf vneg(vf a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
INLINE __m256 vlow(vf a) { return a; }
INLINE __m256 vhigh(vf a) { return a; }
#endif

/* The strips a vector reads: panel p's (a) and, X86_WIDE, panel p + 1's (b; = a past the last panel). */
typedef struct {
    const uint8_t *a, *b;
} x86_st_t;

INLINE vi x86_ld(x86_st_t st, int off) { return vld(st.a + off, st.b + off); }
INLINE vf x86_half8(x86_st_t st, int off) { return vhalf(st.a + off, st.b + off); }
INLINE vi x86_c32(uint32_t v) { return vset32((int32_t)v); }
/* Byte i of each 32-bit lane, unsigned. */
INLINE vi x86_byte(vi v, int i) { return vand(vsrl32(v, 8 * i), x86_c32(255)); }
/* 4 bytes of x broadcast to every lane. */
INLINE vi x86_x4(const int8_t *q) {
    int32_t v;
    memcpy(&v, q, 4);
    return vset32(v);
}

typedef struct {
    vf dw[2], mw[2];
} x86_scales_t;

INLINE void isa_dot(int fmt, const vi w[8], const int8_t *xq, int halves, vi *p0, vi *p1);

INLINE int x86_units(int fmt) { return block_elems(fmt) / 32; }
INLINE int x86_halves(int fmt) { return fmt == Q6_K || fmt == Q3_K || fmt == Q2_K; }
INLINE int x86_min32(int fmt) { return fmt == Q4_1 || fmt == Q5_1 || fmt == Q4_K || fmt == Q5_K; }
INLINE int x86_offset(int fmt) {
    switch (fmt) {
    case Q4_0: return 8;
    case Q5_0: return 16;
    case Q6_K: return 32;
    case Q3_K: return 4;
    case Q8_0: case IQ4_NL: case IQ4_XS: return DOT_X86_SIGNED ? 0 : 128;
    default: return 0;
    }
}

/* The IQ4 table for pshufb (in every 128 bits), + 128 unless signed. */
INLINE vi x86_iq4_table(void) {
    const vi t = vtable16(_mm_loadu_si128((const __m128i *)iq4_values));
    return DOT_X86_SIGNED ? t : vxor(t, vset8((char)0x80));
}

/* The low (n = 0) or high (n = 1) nibbles of every byte. */
INLINE vi x86_nib(vi v, int n) {
    return vand(n ? vsrl16(v, 4) : v, vset8(15));
}

/* Q5_0's and Q5_1's fifth bits (qh: each lane's 32-bit qh, bit j value j's) added to w as 16: vector k
 * takes bits 4k .. 4k + 3, which are byte k / 2 of the lane, low or high half. That byte copied to the
 * lane's four bytes (pshufb), byte i tests bit i (k even) or 4 + i (k odd). */
INLINE void x86_q5_high(vi qh, vi w[8]) {
    const vi lo = x86_c32(0x08040201u), hi = x86_c32(0x80402010u);
    for (int j = 0; j < 4; j++) {
        const vi idx = x86_c32(0x01010101u * (uint32_t)j);   /* + 4 d in dword d of each 128 bits */
#if X86_WIDE
        const vi t = vshuf8(qh, vadd32(idx, _mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0)));
        w[2 * j] = _mm512_mask_add_epi8(w[2 * j], _mm512_test_epi8_mask(t, lo), w[2 * j], vset8(16));
        w[2 * j + 1] = _mm512_mask_add_epi8(w[2 * j + 1], _mm512_test_epi8_mask(t, hi), w[2 * j + 1], vset8(16));
#else
        const vi t = vshuf8(qh, vadd32(idx, _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0, 0x04040404,
                                                              0x08080808, 0x0c0c0c0c)));
        w[2 * j] = vor(w[2 * j], vand(_mm256_cmpeq_epi8(vand(t, lo), lo), vset8(16)));
        w[2 * j + 1] = vor(w[2 * j + 1], vand(_mm256_cmpeq_epi8(vand(t, hi), hi), vset8(16)));
#endif
    }
}

/* Whether unit s of fmt is read as 16 times its weights (the high nibbles left in place: one and, no shift),
 * its product shifted back once (exact: a multiple of 16, at most 16 * 15 * 32512 * 32 < 2^31). Only where
 * the dot instruction takes the bytes whole (VNNI; AVX2's maddubs would saturate in int16). */
INLINE int x86_nib16(int fmt, int s) { return !DOT_X86_SIGNED && fmt == Q4_K && s % 2; }

/* Bit b of every byte, moved to bit `to` (b, to constants after inlining). */
INLINE vi x86_bit_to(vi v, int b, int to, uint32_t mask) {
    const vi s = b > to ? vsrl32(v, b - to) : b < to ? vsll32(v, to - b) : v;
    return vand(s, x86_c32(mask));
}

/* Unit s of a strip st: its weights, unsigned but for DOT_X86_SIGNED's Q8_0 and IQ4. */
INLINE void x86_unit_w(int fmt, x86_st_t st, int s, vi w[8]) {
    switch (fmt) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case IQ4_NL: case IQ4_XS: {
        const int qs = fmt == Q4_0 || fmt == IQ4_NL ? Q4_0_QS : fmt == Q4_1 ? Q4_1_QS : fmt == Q5_0 ? Q5_0_QS
                     : fmt == Q5_1 ? Q5_1_QS : IQ4_XS_QS + 16 * s;
        for (int c = 0; c < 4; c++) {
            const vi v = x86_ld(st, PANEL * qs + 32 * c);
            w[c] = x86_nib(v, 0);
            w[c + 4] = x86_nib(v, 1);
        }
        if (fmt == Q5_0 || fmt == Q5_1) {
            const vi qh = x86_ld(st, PANEL * (fmt == Q5_0 ? Q5_0_QH : Q5_1_QH));
            x86_q5_high(qh, w);
        }
        if (fmt == IQ4_NL || fmt == IQ4_XS) {
            const vi t = x86_iq4_table();
            for (int k = 0; k < 8; k++) w[k] = vshuf8(t, w[k]);
        }
        break;
    }
    case Q8_0:
        for (int k = 0; k < 8; k++) {
            w[k] = x86_ld(st, PANEL * Q8_0_QS + 32 * k);
            if (!DOT_X86_SIGNED) w[k] = vxor(w[k], vset8((char)0x80));
        }
        break;
    case Q4_K: case Q5_K: {
        const int qs = fmt == Q4_K ? Q4_K_QS : Q5_K_QS;
        for (int k = 0; k < 8; k++) {
            const vi v = x86_ld(st, PANEL * qs + 32 * (8 * (s / 2) + k));
            w[k] = x86_nib16(fmt, s) ? vand(v, vset8((char)0xf0)) : x86_nib(v, s % 2);
            if (fmt == Q5_K) w[k] = vor(w[k], x86_bit_to(x86_ld(st, PANEL * Q5_K_QH + 32 * k), s, 4, 0x10101010u));
        }
        break;
    }
    case Q6_K: {
        const int n = s / 4, k = s % 4;
        for (int j = 0; j < 8; j++) {
            const vi lo = x86_nib(x86_ld(st, 32 * (16 * n + 8 * (k % 2) + j)), k / 2);
            const vi hi = x86_bit_to(x86_ld(st, PANEL * Q6_K_QH + 32 * (8 * n + j)), 2 * k, 4, 0x30303030u);
            w[j] = vor(lo, hi);
        }
        break;
    }
    case Q2_K: case Q3_K: {
        const int n = s / 4, k = s % 4, qs = fmt == Q2_K ? Q2_K_QS : Q3_K_QS;
        for (int j = 0; j < 8; j++) {
            w[j] = x86_bit_to(x86_ld(st, PANEL * qs + 32 * (8 * n + j)), 2 * k, 0, 0x03030303u);
            if (fmt == Q3_K) w[j] = vor(w[j], x86_bit_to(x86_ld(st, 32 * j), s, 2, 0x04040404u));
        }
        break;
    }
    default:
        for (int k = 0; k < 8; k++) w[k] = vzero();
    }
}

/* The scales of every unit of a strip (u[units]). */
INLINE void x86_strip_scales(int fmt, x86_st_t st, x86_scales_t *u) {
    switch (fmt) {
    case Q4_0: case Q5_0: case Q8_0: case IQ4_NL:
        u[0].dw[0] = x86_half8(st, 0);
        break;
    case Q4_1: case Q5_1:
        u[0].dw[0] = x86_half8(st, 0);
        u[0].mw[0] = x86_half8(st, PANEL * Q4_1_M);
        break;
    case Q4_K: case Q5_K: {
        /* scale_min_k4 for 8 rows: the 4 scales (mins) of sub-blocks 0..3, then 4..7, as a lane's bytes */
        const vi c0 = x86_ld(st, PANEL * K_SCALES), c1 = x86_ld(st, PANEL * K_SCALES + 32),
                 c2 = x86_ld(st, PANEL * K_SCALES + 64), m6 = x86_c32(0x3f3f3f3fu), m4 = x86_c32(0x0f0f0f0fu),
                 m45 = x86_c32(0x30303030u);
        const vi sc[2] = {vand(c0, m6), vor(vand(c2, m4), vand(vsrl32(c0, 2), m45))};
        const vi mn[2] = {vand(c1, m6), vor(vand(vsrl32(c2, 4), m4), vand(vsrl32(c1, 2), m45))};
        const vf d = x86_half8(st, 0), ndmin = vneg(x86_half8(st, PANEL * K_DMIN));
        for (int s = 0; s < 8; s++) {
            u[s].dw[0] = vmul(d, vcvt(x86_byte(sc[s / 4], s % 4)));
            u[s].mw[0] = vmul(ndmin, vcvt(x86_byte(mn[s / 4], s % 4)));   /* -(dmin * mn) */
        }
        break;
    }
    case Q6_K: {
        const vf d = x86_half8(st, PANEL * Q6_K_D);
        for (int c = 0; c < 4; c++) {
            const vi v = x86_ld(st, PANEL * Q6_K_SCALES + 32 * c);
            for (int i = 0; i < 4; i++) {   /* scale 4 c + i: unit (4 c + i) / 2, half i % 2; signed */
                const vi sc = vsra32(vsll32(v, 24 - 8 * i), 24);
                u[(4 * c + i) / 2].dw[i % 2] = vmul(d, vcvt(sc));
            }
        }
        break;
    }
    case Q3_K: {
        const vi c0 = x86_ld(st, PANEL * Q3_K_SCALES), c1 = x86_ld(st, PANEL * Q3_K_SCALES + 32),
                 c2 = x86_ld(st, PANEL * Q3_K_SCALES + 64), m4 = x86_c32(0x0f0f0f0fu), m45 = x86_c32(0x30303030u);
        /* scales 4 g .. 4 g + 3 as the bytes of a lane: low four bits, then the top two */
        const vi g[4] = {
            vor(vand(c0, m4), vand(vsll32(c2, 4), m45)),
            vor(vand(c1, m4), vand(vsll32(c2, 2), m45)),
            vor(vand(vsrl32(c0, 4), m4), vand(c2, m45)),
            vor(vand(vsrl32(c1, 4), m4), vand(vsrl32(c2, 2), m45))};
        const vf d = x86_half8(st, PANEL * Q3_K_D);
        for (int k = 0; k < 16; k++) {
            const vi sc = vsub32(x86_byte(g[k / 4], k % 4), x86_c32(32));
            u[k / 2].dw[k % 2] = vmul(d, vcvt(sc));
        }
        break;
    }
    case Q2_K: {
        const vf d = x86_half8(st, PANEL * Q2_K_D), ndmin = vneg(x86_half8(st, PANEL * Q2_K_DMIN));
        for (int c = 0; c < 4; c++) {
            const vi v = x86_ld(st, 32 * c);
            for (int i = 0; i < 4; i++) {   /* scale byte 4 c + i: unit (4 c + i) / 2, half i % 2 */
                const vi b = x86_byte(v, i);
                x86_scales_t *o = &u[(4 * c + i) / 2];
                o->dw[i % 2] = vmul(d, vcvt(vand(b, x86_c32(15))));
                o->mw[i % 2] = vmul(ndmin, vcvt(vsrl32(b, 4)));
            }
        }
        break;
    }
    case IQ4_XS: {
        const vf d = x86_half8(st, 0);
        const vi sh = vu16(st.a + PANEL * IQ4_XS_SCALES_H, st.b + PANEL * IQ4_XS_SCALES_H);
        const vi sl = x86_ld(st, PANEL * IQ4_XS_SCALES_L);
        for (int s = 0; s < 8; s++) {
            const vi lo = vand(vsrl32(sl, 4 * s), x86_c32(15));
            const vi hi = vsll32(vand(vsrl32(sh, 2 * s), x86_c32(3)), 4);
            u[s].dw[0] = vmul(d, vcvt(vsub32(vor(lo, hi), x86_c32(32))));
        }
        break;
    }
    default: break;
    }
}

/* Unit s of a strip, of one row of x (xb: its block, xq8_t or xq16_t as wide) into acc: packed.h's arithmetic. */
INLINE vf x86_step(int fmt, int wide, int s, const vi w[8], const x86_scales_t *u, const void *xb, vf acc) {
    const int halves = x86_halves(fmt), off = x86_offset(fmt);
    const xq8_t *x8 = (const xq8_t *)xb;
    const xq16_t *x16 = (const xq16_t *)xb;
    const float d = wide ? x16->d : x8->d;
    const int32_t *sum = wide ? x16->sum : x8->sum;
    vi p0, p1 = vzero();
    if (wide) {   /* 255 p_hi + p_lo */
        vi h0, h1 = p1, l0, l1 = p1;
        isa_dot(fmt, w, x16->hi, halves, &h0, &h1);
        isa_dot(fmt, w, x16->lo, halves, &l0, &l1);
        p0 = vadd32(vsub32(vsll32(h0, 8), h0), l0);
        if (halves) p1 = vadd32(vsub32(vsll32(h1, 8), h1), l1);
    } else isa_dot(fmt, w, x8->q, halves, &p0, &p1);
    if (x86_nib16(fmt, s)) p0 = vsra32(p0, 4);
    const vf dx = vsetf(d);
    if (halves) {
        if (off) {
            p0 = vsub32(p0, vset32(off * sum[0]));
            p1 = vsub32(p1, vset32(off * sum[1]));
        }
        acc = vaddf(acc, vmul(vmul(u->dw[0], dx), vcvt(p0)));
        acc = vaddf(acc, vmul(vmul(u->dw[1], dx), vcvt(p1)));
        if (fmt == Q2_K) {
            acc = vaddf(acc, vmul(vmul(dx, u->mw[0]), vsetf((float)sum[0])));
            acc = vaddf(acc, vmul(vmul(dx, u->mw[1]), vsetf((float)sum[1])));
        }
    } else {
        if (off) p0 = vsub32(p0, vset32(off * (sum[0] + sum[1])));
        acc = vaddf(acc, vmul(vmul(u->dw[0], dx), vcvt(p0)));
        if (x86_min32(fmt)) acc = vaddf(acc, vmul(u->mw[0], vsetf(wide ? x16->s : x8->s)));
    }
    return acc;
}

/* A panel's 8 outputs of one row of x (only the `live` first stored). */
INLINE void x86_store8(float *y, __m256 acc, int64_t live) {
    if (live >= PANEL) {
        _mm256_storeu_ps(y, acc);
        return;
    }
    float t[PANEL];
    _mm256_storeu_ps(t, acc);
    for (int64_t r = 0; r < live; r++) y[r] = t[r];
}

/* The vector's panels' outputs of one row of x: panel p's at y, p + 1's (two) after them. */
INLINE void x86_store(float *y, vf acc, int64_t live, int two) {
    x86_store8(y, vlow(acc), live);
    if (X86_NP == 2 && two) x86_store8(y + PANEL, vhigh(acc), live - PANEL);
}

/* How far ahead (bytes) the multi-row kernel prefetches each stream of strips on its first pass, into L2:
 * four strips, at least 4 KB; Q8_0 1 KB. Measured from DRAM on Zen 4 for the one-row kernel, before it had
 * its own cursor (x86_pf_t) (GB/s, against two strips / 1 KB into L1): Q4_K
 * 19 -> 28, Q4_0 22 -> 28, Q4_1 23 -> 29, Q5_0 22 -> 28, Q6_K 8 -> 16, while Q8_0 (read in order, the
 * least work a byte) loses 27 -> 23 at 4 KB and keeps 1 KB. */
#define X86_PREFETCH(fmt, bb) ((fmt) == Q8_0 ? 1024 : 4 * PANEL * (bb) < 4096 ? 4096 : 4 * PANEL * (bb))
#define X86_TMAX 64   /* rows of x per pass over a panel */

/* The one-row kernel's prefetch: a cursor X86_AHEAD bytes of strips ahead of the strip being read in each
 * of the vector's panels, walking the call's panels in the order they are read (a vector's panels strip by
 * strip, then the next vector's), so the next panels' first strips are on their way before the current
 * ones end, and nothing past p1 (another thread's chunk) is fetched. Into L2. Measured from DRAM here
 * (Zen 4, one thread, 96 MiB of 8960 x 1536 matrices, GB/s), against the earlier 4 KB a stream restarted at
 * each panel: Q4_K 13 -> 25, Q5_0 16 -> 25, Q4_1 16 -> 25, Q6_K 18 -> 25, Q5_K 13 -> 19 at 8 KB; Q8_0
 * (the least work a byte, read fastest) 17 -> 25 at 16 KB. 4 KB restarted at each panel left each vector's
 * first strips to come from DRAM on demand. */
#ifndef X86_AHEAD
#define X86_AHEAD(fmt) ((fmt) == Q8_0 ? 16384 : 8192)
#endif
#ifndef X86_PF_HINT
#define X86_PF_HINT _MM_HINT_T1
#endif
typedef struct {
    const uint8_t *packed;
    int64_t pb, sb, nb, p1;   /* bytes a panel, a strip; strips a panel; the call's end */
    int64_t p, k;             /* the next strip to fetch: panel p's (and p + 1's) strip k */
} x86_pf_t;

/* Fetches the cursor's strip in each of its panels and moves it on; nothing past the call's panels. */
INLINE void x86_pf_next(x86_pf_t *c) {
    if (c->p >= c->p1) return;
    const uint8_t *a = c->packed + c->p * c->pb + c->k * c->sb;
    const uintptr_t end = (uintptr_t)a + (uintptr_t)c->sb;
    const int two = X86_NP == 2 && c->p + 1 < c->p1;
    for (uintptr_t l = (uintptr_t)a & ~(uintptr_t)63; l < end; l += 64) {
        _mm_prefetch((const char *)l, X86_PF_HINT);
        if (two) _mm_prefetch((const char *)(l + (uintptr_t)c->pb), X86_PF_HINT);
    }
    if (++c->k == c->nb) c->k = 0, c->p += X86_NP;
}

/* One row of x (the decode step): the weights streamed once, everything in registers. */
INLINE void x86_panels_1(int fmt, int wide, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1,
                         const void *qx, float *y, int64_t rows) {
    const int bb = block_bytes(fmt), units = x86_units(fmt);
    const size_t xs = wide ? sizeof(xq16_t) : sizeof(xq8_t);
    const int64_t pb = nb * PANEL * bb;   /* bytes a panel */
    x86_pf_t pf = {packed, pb, PANEL * bb, nb, p1, p0, 0};
    for (int64_t n = (X86_AHEAD(fmt) + PANEL * bb - 1) / (PANEL * bb); n > 0; n--) x86_pf_next(&pf);
    for (int64_t p = p0; p < p1; p += X86_NP) {
        const int two = p + 1 < p1;
        vf acc = vzerof();
        x86_st_t st = {packed + p * pb, packed + (p + (X86_NP == 2 && two)) * pb};
        const uint8_t *xb = (const uint8_t *)qx;
        for (int64_t b = 0; b < nb; b++, st.a += PANEL * bb, st.b += PANEL * bb) {
            x86_pf_next(&pf);
            x86_scales_t u[8];
            x86_strip_scales(fmt, st, u);
#pragma GCC unroll 8
            for (int s = 0; s < units; s++, xb += xs) {
                vi w[8];
                x86_unit_w(fmt, st, s, w);
                acc = x86_step(fmt, wide, s, w, &u[s], xb, acc);
            }
        }
        x86_store(y + p * PANEL, acc, rows - p * PANEL, two);
    }
}

/* Rows of x served together from the unpacked strip, their accumulators in registers (the including
 * file may set it: how many the registers hold). */
#ifndef X86_TB
#define X86_TB 4
#endif

/* tb (a constant) rows of x, xb[j] their blocks of the strip's first unit, through the strip's units. */
INLINE void x86_tile(int fmt, int wide, int tb, const vi *wbuf, const x86_scales_t *u, const uint8_t *const *xb,
                     size_t xs, vf *acc) {
    vf a[X86_TB];
    for (int j = 0; j < tb; j++) a[j] = acc[j];
#pragma GCC unroll 8
    for (int s = 0; s < x86_units(fmt); s++)
#pragma GCC unroll 8
        for (int j = 0; j < tb; j++) a[j] = x86_step(fmt, wide, s, wbuf + 8 * s, &u[s], xb[j] + s * xs, a[j]);
    for (int j = 0; j < tb; j++) acc[j] = a[j];
}

/* Several rows of x: each strip unpacked once into L1 (its units' weight vectors and scales) and served
 * to every row of x (up to X86_TMAX a pass over the panel), X86_TB rows at a time. */
INLINE void x86_panels_t(int fmt, int wide, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1,
                         const void *qx, int64_t T, float *y, int64_t ys, int64_t rows) {
    const int bb = block_bytes(fmt), units = x86_units(fmt);
    const size_t xs = wide ? sizeof(xq16_t) : sizeof(xq8_t);
    const int64_t nx = nb * units, pb = nb * PANEL * bb;
    for (int64_t p = p0; p < p1; p += X86_NP) {
        const int two = p + 1 < p1;
        for (int64_t t0 = 0; t0 < T; t0 += X86_TMAX) {
            const int64_t tn = T - t0 < X86_TMAX ? T - t0 : X86_TMAX;
            vf acc[X86_TMAX];
            for (int64_t t = 0; t < tn; t++) acc[t] = vzerof();
            x86_st_t st = {packed + p * pb, packed + (p + (X86_NP == 2 && two)) * pb};
            /* prefetched as the one-row kernel does, on the first pass over the panel: with a few rows of x
             * the strips' compute does not hide their loads from DRAM (Q4_K 17920 x 1536, 14 rows: 4.9 ms
             * in a prefill against 2.1 from cache) */
            uintptr_t pfa = ((uintptr_t)st.a + X86_PREFETCH(fmt, bb)) & ~(uintptr_t)63, pfb = pfa + (uintptr_t)(st.b - st.a);
            for (int64_t b = 0; b < nb; b++, st.a += PANEL * bb, st.b += PANEL * bb) {
                for (; t0 == 0 && pfa < (uintptr_t)st.a + PANEL * bb + X86_PREFETCH(fmt, bb); pfa += 64, pfb += 64) {
                    _mm_prefetch((const char *)pfa, _MM_HINT_T1);
                    if (X86_NP == 2 && st.b != st.a) _mm_prefetch((const char *)pfb, _MM_HINT_T1);
                }
                x86_scales_t u[8];
                vi wbuf[8 * 8];
                x86_strip_scales(fmt, st, u);
#pragma GCC unroll 8
                for (int s = 0; s < units; s++) x86_unit_w(fmt, st, s, wbuf + 8 * s);
                const uint8_t *xb[X86_TB];
                int64_t t = 0;
                for (; t + X86_TB <= tn; t += X86_TB) {
                    for (int j = 0; j < X86_TB; j++) xb[j] = (const uint8_t *)qx + (size_t)((t0 + t + j) * nx + b * units) * xs;
                    x86_tile(fmt, wide, X86_TB, wbuf, u, xb, xs, acc + t);
                }
                for (; t < tn; t++) {
                    xb[0] = (const uint8_t *)qx + (size_t)((t0 + t) * nx + b * units) * xs;
                    x86_tile(fmt, wide, 1, wbuf, u, xb, xs, acc + t);
                }
            }
            for (int64_t t = 0; t < tn; t++) x86_store(y + (t0 + t) * ys + p * PANEL, acc[t], rows - p * PANEL, two);
        }
    }
}

/* Every format, each its own copy of the loops (fmt and wide constants inside). */
#define X86_FORMATS(X) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(IQ4_NL) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ4_XS)

#define X86_CASE(F)                                                                                                    \
    case F:                                                                                                            \
        if (T == 1) x86_panels_1(F, wide, packed, nb, p0, p1, qx, y, rows);                                           \
        else x86_panels_t(F, wide, packed, nb, p0, p1, qx, T, y, ys, rows);                                           \
        break;

INLINE void x86_panels(int wide, int fmt, const uint8_t *packed, int64_t nb, int64_t p0, int64_t p1, const void *qx,
                       int64_t T, float *y, int64_t ys, int64_t rows) {
    switch (fmt) {
        X86_FORMATS(X86_CASE)
    default: break;
    }
}
