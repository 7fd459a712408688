/* What every pensieve-bench driver shares (bench-run.h): freeing a run's
 * records, and the progress line. */
#include "config.h"

#include "bench/bench-run.h"
#include "bench/bench-util.h"

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
