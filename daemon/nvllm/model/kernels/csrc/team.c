/* The persistent thread team of the _matmul library (team.h): a team of threads runs one function at once,
 * the caller being thread 0, so that a whole decode step (step.c) is one job: its ops split across the
 * team with a barrier between dependent ones, not a job (two lock round trips and a wake-up) per matrix.
 *
 * Workers are created on first use, grown when a call asks for more, started afresh in a forked child
 * (only the forking thread exists there), and take no signals (Python's stay on its own threads).
 *
 * Waiting (a worker for the next job, a thread at a barrier) spins first: waking a sleeping thread costs
 * 60-70 us on the development VM (a futex round trip through the hypervisor's scheduler), more than most
 * ops of a step. Each turn is a pause (yield on aarch64), every YIELD_EVERY-th a sched_yield: with the
 * cores oversubscribed a spin that never yields holds up the very thread it waits for. After an idle
 * spell of IDLE_NS the waiter sleeps on a condition variable, so idle workers do not burn a core between
 * steps. Whoever releases the waiters broadcasts only when someone sleeps (a Dekker pair of sequentially
 * consistent stores and loads: the sleeper counts itself, then checks; the releaser publishes, then looks).
 *
 * Plain C99 and POSIX threads (sched_setaffinity for pinning, where the C library has it).
 */
#define _GNU_SOURCE
#include "team.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define IDLE_NS 100000   /* spin this long (100 us) before sleeping */
#define YIELD_EVERY 16

struct team {
    void (*fn)(void *, team_ctx_t *);
    void *arg;
    int count;
    /* the barrier */
    int arrived;
    unsigned gen;
    int sleepers;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int64_t counters[TEAM_COUNTERS];
};

static team_t team = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

/* What the barriers cost (team_stats): barriers passed, and summed over the threads that waited, the
 * nanoseconds they waited and the times they fell asleep; with a member descheduled by another process
 * the waits grow to the scheduler's time slices. Counted only while stats_on (a bench), so that a
 * serving step reads no clock it does not need. */
static int stats_on;
static int64_t stat_barriers, stat_wait_ns, stat_sleeps;

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;   /* one team at a time */
static pthread_mutex_t workers_lock = PTHREAD_MUTEX_INITIALIZER;   /* workers' creation and sleep */
static pthread_cond_t go = PTHREAD_COND_INITIALIZER;
static int workers;                      /* threads 1 .. workers exist */
/* The job: generation << 8 | team size, in one word so a worker reads both at once (a worker outside a
 * team must not mistake the next team's size for this one's). */
static unsigned long job;
static int job_sleepers;
static unsigned long born[TEAM_MAX_THREADS];   /* the job word each worker was created at */
static int atfork_set;
static __thread int in_team;             /* 1 on a thread running a team's function */

/* Pinning: pin_gen bumped by every team_pin; each thread applies it when it next joins a team. */
static int pin_on, pin_gen, pin_ncpus, pin_have_set;
static int pin_cpus[CPU_SETSIZE];
static cpu_set_t pin_allowed;
static __thread int pin_seen;

/* One turn of a spin: a pause, and now and then the core offered to whatever else wants to run. */
static inline void relax(int i) {
    if (i % YIELD_EVERY == YIELD_EVERY - 1) {
        sched_yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins while *word == seen for up to IDLE_NS; returns 1 if it changed. */
static int spin_while(const unsigned long *word, unsigned long seen) {
    int64_t start = 0;
    for (int i = 0;; i++) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen) return 1;
        if (i % 64 == 63) {   /* the clock every 64 turns: a vDSO call, not a system call */
            const int64_t t = now_ns();
            if (!start) start = t;
            else if (t - start > IDLE_NS) return 0;
        }
        relax(i);
    }
}

static void apply_pin(int index) {
    const int g = __atomic_load_n(&pin_gen, __ATOMIC_ACQUIRE);
    if (g == pin_seen) return;
    pin_seen = g;
    if (!pin_have_set) return;
    cpu_set_t set;
    if (__atomic_load_n(&pin_on, __ATOMIC_RELAXED)) {
        CPU_ZERO(&set);
        CPU_SET(pin_cpus[index % pin_ncpus], &set);
    } else {
        set = pin_allowed;
    }
    sched_setaffinity(0, sizeof set, &set);
}

void team_barrier(team_ctx_t *ctx) {
    team_t *t = ctx->team;
    if (ctx->count <= 1) {
        memset(t->counters, 0, sizeof t->counters);
        return;
    }
    const unsigned g = __atomic_load_n(&t->gen, __ATOMIC_ACQUIRE);   /* cannot move before we arrive */
    const int counted = __atomic_load_n(&stats_on, __ATOMIC_RELAXED);
    const int64_t arrived_ns = counted ? now_ns() : 0;
    if (__atomic_add_fetch(&t->arrived, 1, __ATOMIC_ACQ_REL) == ctx->count) {   /* the last: release all */
        if (counted) __atomic_add_fetch(&stat_barriers, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&t->arrived, 0, __ATOMIC_RELAXED);
        for (int i = 0; i < TEAM_COUNTERS; i++) __atomic_store_n(&t->counters[i], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&t->gen, g + 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&t->sleepers, __ATOMIC_SEQ_CST)) {
            pthread_mutex_lock(&t->lock);
            pthread_cond_broadcast(&t->cond);
            pthread_mutex_unlock(&t->lock);
        }
        return;
    }
    int64_t start = 0;
    for (int i = 0; __atomic_load_n(&t->gen, __ATOMIC_ACQUIRE) == g; i++) {
        if (i % 64 == 63) {
            const int64_t now = now_ns();
            if (!start) start = now;
            else if (now - start > IDLE_NS) break;
        }
        relax(i);
    }
    if (__atomic_load_n(&t->gen, __ATOMIC_ACQUIRE) == g) {
        if (counted) __atomic_add_fetch(&stat_sleeps, 1, __ATOMIC_RELAXED);
        pthread_mutex_lock(&t->lock);
        __atomic_add_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&t->gen, __ATOMIC_SEQ_CST) == g) pthread_cond_wait(&t->cond, &t->lock);
        __atomic_sub_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&t->lock);
    }
    if (counted) __atomic_add_fetch(&stat_wait_ns, now_ns() - arrived_ns, __ATOMIC_RELAXED);
}

/* A worker leaving a team's last barrier may still add its wait after the caller has returned: that wait
 * lands in the next reading (a bench's figures, not a count anything depends on). */
void team_stats(int on, int64_t *out) {
    __atomic_store_n(&stats_on, on, __ATOMIC_RELAXED);
    out[0] = __atomic_exchange_n(&stat_barriers, 0, __ATOMIC_RELAXED);
    out[1] = __atomic_exchange_n(&stat_wait_ns, 0, __ATOMIC_RELAXED);
    out[2] = __atomic_exchange_n(&stat_sleeps, 0, __ATOMIC_RELAXED);
}

int64_t team_chunk(team_ctx_t *ctx, int slot, int64_t n, int64_t *state) {
    if (*state < 0) {   /* the first: this thread's own chunk */
        *state = 0;
        if (ctx->index < n) return ctx->index;
    }
    const int64_t c = __atomic_fetch_add(&ctx->team->counters[slot], 1, __ATOMIC_RELAXED) + ctx->count;
    return c < n ? c : -1;
}

static void *worker(void *arg) {
    const int me = (int)(intptr_t)arg;
    unsigned long seen = born[me];
    for (;;) {
        if (!spin_while(&job, seen)) {
            pthread_mutex_lock(&workers_lock);
            __atomic_add_fetch(&job_sleepers, 1, __ATOMIC_SEQ_CST);
            while (__atomic_load_n(&job, __ATOMIC_SEQ_CST) == seen) pthread_cond_wait(&go, &workers_lock);
            __atomic_sub_fetch(&job_sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&workers_lock);
        }
        seen = __atomic_load_n(&job, __ATOMIC_ACQUIRE);
        const int count = (int)(seen & 0xff);
        if (me >= count) continue;   /* not needed this time */
        apply_pin(me);
        team_ctx_t ctx = {me, count, &team};
        in_team = 1;
        team.fn(team.arg, &ctx);
        team_barrier(&ctx);   /* the caller returns once every member has finished */
        in_team = 0;
    }
    return NULL;
}

/* In a forked child only the forking thread exists: start the team afresh. */
static void team_after_fork(void) {
    pthread_mutex_init(&call_lock, NULL);
    pthread_mutex_init(&workers_lock, NULL);
    pthread_cond_init(&go, NULL);
    pthread_mutex_init(&team.lock, NULL);
    pthread_cond_init(&team.cond, NULL);
    team.arrived = team.sleepers = 0;
    job_sleepers = 0;
    workers = 0;
}

/* Threads 1 .. want-1 exist when this returns, or as many as could be made; returns the team size usable.
 * Under call_lock (no job runs). */
static int grow_team(int want) {
    if (!atfork_set) {
        pthread_atfork(NULL, NULL, team_after_fork);
        atfork_set = 1;
    }
    if (want <= workers + 1) return want;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);   /* workers take no signals */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 1 << 20);
    pthread_mutex_lock(&workers_lock);
    while (workers + 1 < want) {
        pthread_t th;
        born[workers + 1] = __atomic_load_n(&job, __ATOMIC_RELAXED);
        if (pthread_create(&th, &attr, worker, (void *)(intptr_t)(workers + 1)) != 0) break;
        workers++;
    }
    pthread_mutex_unlock(&workers_lock);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return workers + 1 < want ? workers + 1 : want;
}

int team_run(void (*fn)(void *, team_ctx_t *), void *arg, int threads) {
    int n = threads < 1 ? 1 : threads > TEAM_MAX_THREADS ? TEAM_MAX_THREADS : threads;
    team_ctx_t ctx = {0, 1, NULL};
    const int repin = __atomic_load_n(&pin_on, __ATOMIC_RELAXED) || pin_seen != __atomic_load_n(&pin_gen, __ATOMIC_RELAXED);
    if (in_team || (n == 1 && !repin)) {   /* no lock, no workers: a team of one (inside a team: always) */
        team_t solo;
        memset(solo.counters, 0, sizeof solo.counters);
        ctx.team = &solo;
        const int was = in_team;
        in_team = 1;
        fn(arg, &ctx);
        in_team = was;
        return 1;
    }
    pthread_mutex_lock(&call_lock);
    n = grow_team(n);
    apply_pin(0);
    team.fn = fn, team.arg = arg, team.count = n;
    team.arrived = 0;
    memset(team.counters, 0, sizeof team.counters);
    ctx.count = n, ctx.team = &team;
    if (n > 1) {
        const unsigned long next = ((job >> 8) + 1) << 8 | (unsigned long)n;
        __atomic_store_n(&job, next, __ATOMIC_SEQ_CST);   /* what spinning workers see */
        if (__atomic_load_n(&job_sleepers, __ATOMIC_SEQ_CST)) {
            pthread_mutex_lock(&workers_lock);
            pthread_cond_broadcast(&go);
            pthread_mutex_unlock(&workers_lock);
        }
    }
    in_team = 1;
    fn(arg, &ctx);
    team_barrier(&ctx);
    in_team = 0;
    pthread_mutex_unlock(&call_lock);
    return n;
}

static void nothing(void *arg, team_ctx_t *ctx) { (void)arg, (void)ctx; }

int team_pin(int on) {
    pthread_mutex_lock(&call_lock);
    if (!pin_have_set) {   /* the allowed set, read once: later it may be a pinned thread's one CPU */
        if (sched_getaffinity(0, sizeof pin_allowed, &pin_allowed) != 0) {
            pthread_mutex_unlock(&call_lock);
            return -1;
        }
        pin_ncpus = 0;
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &pin_allowed)) pin_cpus[pin_ncpus++] = c;
        pin_have_set = pin_ncpus > 0;
    }
    __atomic_store_n(&pin_on, on ? 1 : 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&pin_gen, 1, __ATOMIC_RELEASE);
    const int n = workers + 1;
    pthread_mutex_unlock(&call_lock);
    team_run(nothing, NULL, n);   /* every thread there is applies it now */
    return 0;
}

int team_workers(void) {
    pthread_mutex_lock(&workers_lock);
    const int n = workers;
    pthread_mutex_unlock(&workers_lock);
    return n;
}
