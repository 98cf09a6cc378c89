/* The persistent thread team every C kernel of the _matmul library runs on (team.c): a team of threads
 * runs one function together, with a spinning barrier between dependent ops and an atomic counter for
 * dynamic chunks of work. */
#ifndef NVLLM_TEAM_H
#define NVLLM_TEAM_H

#include <stdint.h>

#define TEAM_MAX_THREADS 64
#define TEAM_COUNTERS 4   /* work counters per phase (between two barriers), zeroed by each barrier */

typedef struct team team_t;

/* What a team member knows: its index (0: the caller) and the team's size. */
typedef struct {
    int index, count;
    team_t *team;
} team_ctx_t;

/* Runs fn(arg, ctx) on `threads` threads at once, the caller being thread 0 (fewer if the team could not
 * grow: ctx.count says). One team at a time; a team run from inside a team runs on the calling thread
 * alone. Returns the team's size. */
int team_run(void (*fn)(void *, team_ctx_t *), void *arg, int threads);

/* Waits until every thread of the team has called it (as often): what one op wrote is then visible to
 * all. It also zeroes the work counters for the next phase. Spins (pause or yield) a while, then sleeps. */
void team_barrier(team_ctx_t *ctx);

/* Chunks 0 .. n-1 of the phase's work, each handed out once: call until it returns -1. Thread i first
 * takes chunk i (no atomic), then the rest go by fetch-add on work counter `slot` (0 .. TEAM_COUNTERS-1),
 * so a thread that finishes early takes more. `*state` starts at -1 for each phase. */
int64_t team_chunk(team_ctx_t *ctx, int slot, int64_t n, int64_t *state);

/* 1: each team thread i (the caller of a team run being 0) is pinned to the i-th CPU of the process's
 * allowed set as it was when pinning was turned on; 0: the threads are unpinned (the whole set).
 * Returns 0, or -1 when the allowed set could not be read. */
int team_pin(int on);

/* out[0..2]: the barriers passed, the nanoseconds threads waited at them (summed over the threads) and the
 * times one fell asleep there, since the last call, which zeroes them; then counting is turned on or off
 * (off by default: a serving step reads no clock for it). */
void team_stats(int on, int64_t *out);

/* Worker threads that exist now (the caller's not counted). */
int team_workers(void);

#endif
