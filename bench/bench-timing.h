/* Alternating median timing of backend work, shared by the benchmarks that
 * compare a kernel with its reference in the same run (bench-kernels and
 * its swap section, bench-swap.c). */
#ifndef PV_BENCH_TIMING_H
#define PV_BENCH_TIMING_H

#include "bench-util.h"

#include <pensieve/backend.h>

/* Most timed runs of one action. */
#define BENCH_MAX_REPS 64
/* Short actions get more runs, up to BENCH_MAX_REPS, until one median
 * covers about this much work. */
#define BENCH_MIN_TOTAL_MS 1500.0
/* Most actions timed together. */
#define BENCH_MAX_ACTIONS 4

/* A timed action: returns a status; it waits for its own work. */
typedef pv_status (*bench_action_fn)(void *state);

/* Median wall times ms[i] of n actions run in turn, the order rotating
 * from one round to the next (a b c, b c a, c a b, ...), after one warm-up
 * each, so load from other processes and the order of runs hit all alike
 * and their ratios stay meaningful. reps rounds at least (more for short
 * actions). Returns a status; a failure's message is left in
 * pv_last_error(). */
static inline pv_status bench_time_alternating(const bench_action_fn *fns, void *const *states, int n, int reps,
                                               double *ms)
{
    double samples[BENCH_MAX_ACTIONS][BENCH_MAX_REPS];
    if (n < 1 || n > BENCH_MAX_ACTIONS)
        return pv_error(PV_ERR_INVALID_ARG, "bench: %d actions to time, 1 to %d allowed", n, BENCH_MAX_ACTIONS);
    double start = 1e3 * bench_now_s();
    pv_status st = PV_OK;
    for (int i = 0; i < n && st == PV_OK; i++)
        st = fns[i](states[i]);
    double warm_ms = 1e3 * bench_now_s() - start;
    if (reps > BENCH_MAX_REPS)
        reps = BENCH_MAX_REPS;
    while (reps < BENCH_MAX_REPS && reps * warm_ms < BENCH_MIN_TOTAL_MS)
        reps++;
    for (int r = 0; r < reps && st == PV_OK; r++)
        for (int k = 0; k < n && st == PV_OK; k++) {
            int i = (r + k) % n;
            start = 1e3 * bench_now_s();
            st = fns[i](states[i]);
            samples[i][r] = 1e3 * bench_now_s() - start;
        }
    if (st != PV_OK)
        return st;
    for (int i = 0; i < n; i++)
        ms[i] = bench_median(samples[i], reps);
    return PV_OK;
}

#endif
