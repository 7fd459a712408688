/* pensieve-serve's /metrics: latency histograms and request counters kept by
 * the server (any thread may record; a mutex guards them), and the
 * Prometheus text exposition (format 0.0.4) of those plus a snapshot of the
 * engine's and the cache's counters. Every name is prefixed pensieve_. */
#ifndef PV_SERVER_METRICS_H
#define PV_SERVER_METRICS_H

#include <pensieve/cache.h>
#include <pensieve/engine.h>
#include <pensieve/status.h>

#include <stddef.h>
#include <stdint.h>

typedef enum pv_metric_hist {
    PV_HIST_TTFT = 0,      /* pensieve_time_to_first_token_seconds */
    PV_HIST_ITL,           /* pensieve_inter_token_latency_seconds */
    PV_HIST_E2E,           /* pensieve_request_duration_seconds (end to end) */
    PV_HIST_COUNT
} pv_metric_hist;

typedef struct pv_metrics pv_metrics;

pv_status pv_metrics_init(pv_metrics **out);
void pv_metrics_free(pv_metrics *m); /* NULL: no-op */

/* Thread-safe. Negative or NaN values are ignored. */
void pv_metrics_observe(pv_metrics *m, pv_metric_hist which, double seconds);
/* One finished HTTP request (pensieve_http_requests_total{code="..."}),
 * its prompt tokens, those served from cache, and tokens generated. */
void pv_metrics_request_done(pv_metrics *m, int http_status, uint64_t prompt_tokens,
                             uint64_t cached_tokens, uint64_t generated_tokens);

/* What the engine thread reports at scrape time. */
typedef struct pv_metrics_snapshot {
    pv_engine_stats engine;
    pv_cache_stats cache;
} pv_metrics_snapshot;

/* The whole exposition into a malloc'd NUL-terminated buffer. */
pv_status pv_metrics_render(pv_metrics *m, const pv_metrics_snapshot *snap, char **out,
                            size_t *len);

#endif
