/* Reading a mode's throughput at a normalized-latency target off its sweep,
 * as the paper reads Fig. 10: the offered requests/s where the mean
 * normalized latency crosses the target, interpolated linearly between the
 * highest rate that met the target and the next rate (which missed). With
 * no miss among the rates tried it is the highest rate's, a lower bound. A
 * miss by failed requests has no latency to interpolate by: the value is
 * then the highest met rate's. Bench-internal (bs_ prefix). */
#ifndef PV_BENCH_SWEEP_H
#define PV_BENCH_SWEEP_H

typedef struct bs_point {
    double rate;                   /* the run's --rate */
    double offered_requests_per_s; /* the workload's */
    double norm_latency_mean;
    int meets_target;              /* every turn answered, mean within the target */
    int failed;                    /* some request failed */
} bs_point;

typedef struct bs_at_target {
    int best;              /* index of the highest-rate point that met the target; -1: none */
    int miss;              /* index of the lowest-rate point above it that missed; -1: none */
    double requests_per_s; /* offered, at the target; NaN when best is -1 */
    int lower_bound;       /* no point above best missed */
} bs_at_target;

/* Over one mode's points, in any order. */
bs_at_target bs_throughput_at_target(const bs_point *points, int n, double target);

#endif
