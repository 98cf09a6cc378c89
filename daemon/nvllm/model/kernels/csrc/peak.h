/* The integer peak: what nvllm bench sets the integer kernels beside, as it sets the float ones beside BLAS's
 * sgemm. Each dot_*.c times its own 8-bit dot instruction (the one its kernels are built on) with these macros,
 * and hands the loop to dot.c in its dot_isa_t.
 *
 * Rounds of independent multiply-accumulates of that instruction, on registers, so nothing but the
 * instruction's throughput bounds them. An instruction that adds into its accumulator itself (vpdpbusd,
 * vpdpwssd, sdot, smlal, sadalp) waits 3-5 cycles for the one before it into the same register and issues 2-4 a
 * cycle: it takes 10 or more chains in flight to measure its throughput, not its latency (4 gave half of Zen
 * 4's vpdpbusd rate). Those chains share one a and b: the compiler cannot split such an instruction's product
 * from its add. Where it can (AVX2's maddubs + madd, then an add; NEON's smull, then sadalp; the scalar loop),
 * each chain has an a of its own, changed each round by an empty asm, so that no product is shared among chains
 * nor taken out of the loop; there only the add carries from round to round, and fewer chains keep the
 * registers free of spills (4 of AVX2's 16, 8 of NEON's 32). The chains start apart (equal ones would be merged
 * into one), b's value is hidden (a product by 1 or by a zero half would fold), and each iteration is two
 * rounds (gcc 12 copies every accumulator to another register and back once an iteration: 8% of Zen 4's
 * vpdpbusd rate at one round). Check a change with objdump -d: every step's instruction there, and no rsp or sp
 * in these loops. */
#ifndef NVLLM_PEAK_H
#define NVLLM_PEAK_H

#include <stdint.h>

#define PEAK_EACH1(F, X, Y) F(0, X, Y)
#define PEAK_EACH4(F, X, Y) F(0, X, Y) F(1, X, Y) F(2, X, Y) F(3, X, Y)
#define PEAK_EACH8(F, X, Y) PEAK_EACH4(F, X, Y) F(4, X, Y) F(5, X, Y) F(6, X, Y) F(7, X, Y)
#define PEAK_EACH12(F, X, Y) PEAK_EACH8(F, X, Y) F(8, X, Y) F(9, X, Y) F(10, X, Y) F(11, X, Y)
#define PEAK_EACH16(F, X, Y) PEAK_EACH12(F, X, Y) F(12, X, Y) F(13, X, Y) F(14, X, Y) F(15, X, Y)
/* Named variables a0, c0, c1, ..., not arrays: gcc keeps an array of vectors that an asm touches in memory.
 * CHAINS: the accumulators c; AS: the a's (CHAINS, or PEAK_EACH1 for one); A(i): chain i's a. */
#define PEAK_OWN(i) a##i
#define PEAK_SHARED(i) a0
#define PEAK_A(i, T, Y) T a##i = b;
#define PEAK_C(i, T, SPLAT) T c##i = SPLAT(i);
#define PEAK_KEEP(i, KEEP, Y) KEEP(a##i);
#define PEAK_STEP(i, STEP, A) c##i = STEP(c##i, A(i), b);
#define PEAK_FOLD(i, XOR, Y) t = XOR(t, c##i);
#define PEAK_ONE(i, X, Y) +1
#define PEAK_BODY(T, CT, CHAINS, AS, A, KEEP, STEP, SPLAT, XOR)                                                        \
    KEEP(b);                                                                                                           \
    AS(PEAK_A, T, _) CHAINS(PEAK_C, CT, SPLAT)                                                                         \
    for (int64_t r = 0; r < reps; r++) {                                                                               \
        AS(PEAK_KEEP, KEEP, _) CHAINS(PEAK_STEP, STEP, A)                                                              \
        AS(PEAK_KEEP, KEEP, _) CHAINS(PEAK_STEP, STEP, A)                                                              \
    }                                                                                                                  \
    CT t = SPLAT(0);                                                                                                   \
    CHAINS(PEAK_FOLD, XOR, _)                                                                                          \
    KEEP(t);                                                                                                           \
    const int64_t steps = 2 * (0 CHAINS(PEAK_ONE, _, _));   /* an iteration's: two rounds of every chain */

#endif
