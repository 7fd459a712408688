/* pensieve-bench's reading of a sweep (bench/bench-sweep.c): the
 * throughput at the latency target, on hand-made curves whose answers are
 * worked out here. */
#include "config.h"

#include "bench/bench-sweep.h"
#include "tap.h"

#include <math.h>

static int near(double got, double want)
{
    return fabs(got - want) <= 1e-9 * fmax(1, fabs(want));
}

int main(void)
{
    /* rates 1, 2, 4 (offered 5, 10, 20 requests/s), latency 0.05, 0.08,
     * 0.14 against 0.1: the crossing is a third of the way from 10 to 20 */
    const bs_point curve[] = {
        {1, 5, 0.05, 1, 0}, {2, 10, 0.08, 1, 0}, {4, 20, 0.14, 0, 0},
    };
    bs_at_target t = bs_throughput_at_target(curve, 3, 0.1);
    ok(t.best == 1 && t.miss == 2 && !t.lower_bound && near(t.requests_per_s, 10 + 10.0 / 3),
       "interpolated between the last met and the first missed rate: %g (want %g)", t.requests_per_s,
       10 + 10.0 / 3);

    /* the same points in another order */
    const bs_point shuffled[] = {curve[2], curve[0], curve[1]};
    t = bs_throughput_at_target(shuffled, 3, 0.1);
    ok(t.best == 2 && t.miss == 0 && near(t.requests_per_s, 10 + 10.0 / 3), "order of the points does not matter");

    /* a curve that dips past the miss (noise): the miss is the first rate
     * above the best met one, not the last */
    const bs_point dip[] = {
        {1, 5, 0.05, 1, 0}, {2, 10, 0.2, 0, 0}, {4, 20, 0.09, 1, 0}, {8, 40, 0.3, 0, 0},
    };
    t = bs_throughput_at_target(dip, 4, 0.1);
    ok(t.best == 2 && t.miss == 3 && near(t.requests_per_s, 20 + 20 * (0.01 / 0.21)),
       "the highest met rate and the next miss above it: %g", t.requests_per_s);

    /* two misses above the best: the crossing lies before the first */
    const bs_point two[] = {{1, 5, 0.05, 1, 0}, {4, 20, 0.4, 0, 0}, {2, 10, 0.15, 0, 0}};
    t = bs_throughput_at_target(two, 3, 0.1);
    ok(t.best == 0 && t.miss == 2 && near(t.requests_per_s, 5 + 5 * 0.5), "the first miss above: %g (want 7.5)",
       t.requests_per_s);

    /* every rate met: the highest rate's offered load, a lower bound */
    t = bs_throughput_at_target(curve, 2, 0.1);
    ok(t.best == 1 && t.miss == -1 && t.lower_bound && near(t.requests_per_s, 10), "no miss: a lower bound");

    /* none met */
    t = bs_throughput_at_target(curve + 2, 1, 0.1);
    ok(t.best == -1 && isnan(t.requests_per_s), "no rate met: NaN");
    t = bs_throughput_at_target(curve, 0, 0.1);
    ok(t.best == -1 && isnan(t.requests_per_s), "no points: NaN");

    /* a miss by failed requests: no latency to interpolate by */
    const bs_point failed[] = {{1, 5, 0.05, 1, 0}, {2, 10, 0.06, 0, 1}};
    t = bs_throughput_at_target(failed, 2, 0.1);
    ok(t.best == 0 && t.miss == 1 && !t.lower_bound && near(t.requests_per_s, 5), "a miss by failures: the met rate");
    return tap_done();
}
