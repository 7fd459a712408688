/* What every pensieve-bench driver shares (bench-run.h): freeing a run's
 * records, the progress line and the stop signal. */
#include "config.h"

#include "bench/bench-run.h"
#include "bench/bench-util.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void br_run_free(br_run *r)
{
    if (!r)
        return;
    free(r->records);
    memset(r, 0, sizeof *r);
}

void br_progress(const char *label, int64_t done, int64_t total, double elapsed_s)
{
    /* When the line was last written; -1 once a run's last update ended
     * it, so the next run's first update shows at once. */
    static double last_s = -1;
    if (!isatty(STDERR_FILENO))
        return;
    const int final = done >= total;
    const double now = bench_now_s();
    if (!final && last_s >= 0 && now - last_s < 0.2) /* five a second: a terminal need not see more */
        return;
    last_s = final ? -1 : now;
    fprintf(stderr, "\r%s  %lld/%lld requests  %.0fs%s", label ? label : "", (long long)done, (long long)total,
            elapsed_s, final ? "\n" : "");
}

static volatile sig_atomic_t stop_signal;

void br_on_stop_signal(int sig)
{
    stop_signal = sig;
}

int br_stop_signal(void)
{
    return stop_signal;
}

static double stop_at_s = INFINITY;

void br_stop_at(double now_s)
{
    stop_at_s = now_s;
}

int br_stopping(void)
{
    return stop_signal || bench_now_s() >= stop_at_s;
}
