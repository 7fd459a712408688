#include "config.h"

#include "bench/bench-sweep.h"

#include <math.h>

bs_at_target bs_throughput_at_target(const bs_point *p, int n, double target)
{
    bs_at_target t = {-1, -1, NAN, 0};
    for (int i = 0; i < n; i++)
        if (p[i].meets_target && (t.best < 0 || p[i].rate > p[t.best].rate))
            t.best = i;
    if (t.best < 0)
        return t;
    const bs_point *b = &p[t.best];
    for (int i = 0; i < n; i++)
        if (!p[i].meets_target && p[i].rate > b->rate && (t.miss < 0 || p[i].rate < p[t.miss].rate))
            t.miss = i;
    t.requests_per_s = b->offered_requests_per_s;
    t.lower_bound = t.miss < 0;
    if (t.miss >= 0 && !p[t.miss].failed && p[t.miss].norm_latency_mean > b->norm_latency_mean) {
        const bs_point *m = &p[t.miss];
        const double f = (target - b->norm_latency_mean) / (m->norm_latency_mean - b->norm_latency_mean);
        t.requests_per_s += f * (m->offered_requests_per_s - b->offered_requests_per_s);
    }
    return t;
}
