/* pensieve-serve's /metrics (server/metrics.h): exact cumulative bucket
 * counts, sums and counts of the latency histograms, the request counters,
 * the snapshot's gauges and counters with their labels, values that are
 * ignored, concurrent recording, and every line of the exposition checked
 * against the Prometheus text format. */
#include "server/metrics.h"
#include "tap.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value of the sample line "<series> <value>", NAN when absent. */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *line = text; *line; ) {
        if (strncmp(line, series, n) == 0 && line[n] == ' ')
            return strtod(line + n + 1, NULL);
        const char *nl = strchr(line, '\n');
        if (!nl)
            break;
        line = nl + 1;
    }
    return NAN;
}

static int has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return 1;
    return 0;
}

static int count_prefix(const char *text, const char *prefix)
{
    int k = 0;
    size_t n = strlen(prefix);
    for (const char *line = text; *line; ) {
        if (strncmp(line, prefix, n) == 0)
            k++;
        const char *nl = strchr(line, '\n');
        if (!nl)
            break;
        line = nl + 1;
    }
    return k;
}

static int expect(const char *text, const char *series, double want)
{
    double got = sample(text, series);
    if (got == want)
        return 1;
    tap_diag("%s: got %.17g, want %.17g", series, got, want);
    return 0;
}

static char *render(pv_metrics *m, const pv_metrics_snapshot *snap)
{
    char *text = NULL;
    size_t len = 0;
    if (pv_metrics_render(m, snap, &text, &len) != PV_OK) {
        tap_diag("pv_metrics_render: %s", pv_last_error());
        return NULL;
    }
    if (strlen(text) != len) {
        tap_diag("length %zu but strlen %zu", len, strlen(text));
        free(text);
        return NULL;
    }
    return text;
}

/* ---- the text-format checker ------------------------------------------------ */

#define MAX_FAMILIES 128

static int name_char(char c, int first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

/* Length of a metric name at p, 0 if none. */
static size_t name_len(const char *p)
{
    size_t n = 0;
    while (p[n] && name_char(p[n], n == 0))
        n++;
    return n;
}

static int bad(int lineno, const char *line, const char *why)
{
    tap_diag("line %d: %s: %.*s", lineno, why, (int)strcspn(line, "\n"), line);
    return 0;
}

/* Every line is "# HELP name text", "# TYPE name type" or a sample
 * "name{label="value",...} value"; each family has one HELP then one TYPE
 * before its samples, samples of a family are contiguous and named after it
 * (histograms: _bucket with an le label, _sum, _count); every name starts
 * with pensieve_. */
static int valid_exposition(const char *text)
{
    char families[MAX_FAMILIES][96];
    int n_fam = 0;
    char cur[96] = "", cur_type[16] = "", help_for[96] = "";
    int lineno = 0;
    if (!*text || text[strlen(text) - 1] != '\n')
        return bad(0, text, "empty or no final newline");
    for (const char *line = text; *line; line = strchr(line, '\n') + 1) {
        lineno++;
        size_t len = strcspn(line, "\n");
        char buf[512];
        if (len == 0 || len >= sizeof buf)
            return bad(lineno, line, "empty or too long");
        memcpy(buf, line, len);
        buf[len] = '\0';
        if (buf[0] == '#') {
            int help = strncmp(buf, "# HELP ", 7) == 0, type = strncmp(buf, "# TYPE ", 7) == 0;
            if (!help && !type)
                return bad(lineno, line, "comment that is neither HELP nor TYPE");
            const char *name = buf + 7;
            size_t nl = name_len(name);
            if (nl == 0 || nl >= sizeof cur || name[nl] != ' ' || !name[nl + 1])
                return bad(lineno, line, "malformed HELP/TYPE");
            if (strncmp(name, "pensieve_", 9) != 0)
                return bad(lineno, line, "name without the pensieve_ prefix");
            char fam[96];
            memcpy(fam, name, nl);
            fam[nl] = '\0';
            if (help) {
                for (int i = 0; i < n_fam; i++)
                    if (strcmp(families[i], fam) == 0)
                        return bad(lineno, line, "family declared twice");
                snprintf(help_for, sizeof help_for, "%s", fam);
                continue;
            }
            const char *t = name + nl + 1;
            if (strcmp(t, "counter") != 0 && strcmp(t, "gauge") != 0 && strcmp(t, "histogram") != 0)
                return bad(lineno, line, "unknown type");
            if (strcmp(help_for, fam) != 0)
                return bad(lineno, line, "TYPE without a HELP just before it");
            if (n_fam == MAX_FAMILIES)
                return bad(lineno, line, "too many families for the checker");
            snprintf(families[n_fam++], sizeof families[0], "%s", fam);
            snprintf(cur, sizeof cur, "%s", fam);
            snprintf(cur_type, sizeof cur_type, "%s", t);
            help_for[0] = '\0';
            continue;
        }
        size_t nl = name_len(buf);
        if (nl == 0)
            return bad(lineno, line, "sample without a name");
        if (strncmp(buf, "pensieve_", 9) != 0)
            return bad(lineno, line, "name without the pensieve_ prefix");
        size_t fl = strlen(cur);
        const char *suffix = buf + fl;
        if (!cur[0] || strncmp(buf, cur, fl) != 0)
            return bad(lineno, line, "sample outside its family");
        int is_bucket = 0;
        if (nl != fl) {
            size_t sl = nl - fl;
            is_bucket = sl == 7 && strncmp(suffix, "_bucket", 7) == 0;
            if (strcmp(cur_type, "histogram") != 0 ||
                !(is_bucket || (sl == 4 && strncmp(suffix, "_sum", 4) == 0) ||
                  (sl == 6 && strncmp(suffix, "_count", 6) == 0)))
                return bad(lineno, line, "sample name is not its family's");
        } else if (strcmp(cur_type, "histogram") == 0) {
            return bad(lineno, line, "histogram sample without _bucket/_sum/_count");
        }
        const char *p = buf + nl;
        int has_le = 0;
        if (*p == '{') {
            p++;
            for (;;) {
                size_t ll = name_len(p);
                if (ll == 0 || p[0] == ':' || p[ll] != '=' || p[ll + 1] != '"')
                    return bad(lineno, line, "malformed label");
                if (ll == 2 && strncmp(p, "le", 2) == 0)
                    has_le = 1;
                p += ll + 2;
                while (*p && *p != '"') {
                    if (*p == '\\' && !*++p)
                        return bad(lineno, line, "dangling escape");
                    p++;
                }
                if (*p != '"')
                    return bad(lineno, line, "unterminated label value");
                p++;
                if (*p == ',') {
                    p++;
                    continue;
                }
                if (*p != '}')
                    return bad(lineno, line, "malformed label list");
                p++;
                break;
            }
        }
        if (is_bucket != has_le)
            return bad(lineno, line, "le label on a non-bucket or a bucket without it");
        if (*p != ' ' || !p[1])
            return bad(lineno, line, "no single space before the value");
        p++;
        if (strcmp(p, "+Inf") != 0 && strcmp(p, "-Inf") != 0 && strcmp(p, "NaN") != 0) {
            char *end;
            strtod(p, &end);
            if (end == p || *end || *p == ' ')
                return bad(lineno, line, "value is not a number");
        }
    }
    if (help_for[0])
        return bad(lineno, text, "HELP without a TYPE");
    return 1;
}

/* Buckets never decrease, +Inf equals _count. */
static int cumulative(const char *text, const char *name)
{
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s_bucket{le=\"", name);
    double last = 0;
    int n = 0;
    for (const char *line = text; (line = strstr(line, prefix)) != NULL; line++) {
        const char *v = strchr(line, ' ');
        double x = strtod(v + 1, NULL);
        if (x < last) {
            tap_diag("%s: bucket %.*s below the one before (%g)", name, (int)(v - line), line,
                     last);
            return 0;
        }
        last = x;
        n++;
    }
    char series[160];
    snprintf(series, sizeof series, "%s_bucket{le=\"+Inf\"}", name);
    double inf = sample(text, series);
    snprintf(series, sizeof series, "%s_count", name);
    return n > 1 && inf == last && inf == sample(text, series);
}

/* ---- the checks -------------------------------------------------------------- */

#define TTFT "pensieve_time_to_first_token_seconds"
#define ITL "pensieve_inter_token_latency_seconds"
#define E2E "pensieve_request_duration_seconds"

static void empty(void)
{
    pv_metrics *m = NULL;
    ok(pv_metrics_init(&m) == PV_OK && m, "init");
    char *text = render(m, NULL);
    ok(text && valid_exposition(text), "an empty registry renders valid text");
    ok(text && expect(text, TTFT "_count", 0) && expect(text, TTFT "_sum", 0) &&
           expect(text, TTFT "_bucket{le=\"+Inf\"}", 0) && expect(text, ITL "_bucket{le=\"0.001\"}", 0),
       "zero counts before any observation");
    ok(text && count_prefix(text, "pensieve_http_requests_total{") == 0 &&
           has_line(text, "# TYPE pensieve_http_requests_total counter"),
       "no status code series before any request, the family still declared");
    ok(text && !strstr(text, "pensieve_cache_") && !strstr(text, "pensieve_requests_running"),
       "no snapshot: no engine or cache metrics");
    free(text);
    pv_metrics_free(m);
    pv_metrics_free(NULL);
}

static void histograms(void)
{
    pv_metrics *m = NULL;
    pv_metrics_init(&m);
    /* TTFT: below the first bound, on it (le is inclusive), two in the
     * middle and one past the last bound. */
    const double ttft[] = {0.003, 0.005, 0.02, 0.5, 100.0};
    for (size_t i = 0; i < sizeof ttft / sizeof ttft[0]; i++)
        pv_metrics_observe(m, PV_HIST_TTFT, ttft[i]);
    pv_metrics_observe(m, PV_HIST_ITL, 0.001);
    pv_metrics_observe(m, PV_HIST_ITL, 0.1);
    pv_metrics_observe(m, PV_HIST_ITL, 3.0);
    pv_metrics_observe(m, PV_HIST_E2E, 1.25);
    /* Ignored: NaN, negative, infinite, an unknown histogram. */
    pv_metrics_observe(m, PV_HIST_TTFT, NAN);
    pv_metrics_observe(m, PV_HIST_TTFT, -0.5);
    pv_metrics_observe(m, PV_HIST_ITL, -1e-9);
    pv_metrics_observe(m, PV_HIST_E2E, INFINITY);
    pv_metrics_observe(m, (pv_metric_hist)PV_HIST_COUNT, 0.5);

    char *text = render(m, NULL);
    if (!text) {
        ok(0, "render");
        pv_metrics_free(m);
        return;
    }
    ok(valid_exposition(text), "the text is valid after observations");
    ok(expect(text, TTFT "_bucket{le=\"0.005\"}", 2) && expect(text, TTFT "_bucket{le=\"0.01\"}", 2) &&
           expect(text, TTFT "_bucket{le=\"0.025\"}", 3) && expect(text, TTFT "_bucket{le=\"0.25\"}", 3) &&
           expect(text, TTFT "_bucket{le=\"0.5\"}", 4) && expect(text, TTFT "_bucket{le=\"60\"}", 4) &&
           expect(text, TTFT "_bucket{le=\"+Inf\"}", 5),
       "TTFT buckets are cumulative, le inclusive, 100 s only in +Inf");
    ok(expect(text, TTFT "_count", 5) && fabs(sample(text, TTFT "_sum") - 100.528) < 1e-12,
       "TTFT count 5, sum 100.528 (NaN and negative ignored)");
    ok(expect(text, ITL "_bucket{le=\"0.001\"}", 1) && expect(text, ITL "_bucket{le=\"0.075\"}", 1) &&
           expect(text, ITL "_bucket{le=\"0.1\"}", 2) && expect(text, ITL "_bucket{le=\"2.5\"}", 2) &&
           expect(text, ITL "_bucket{le=\"+Inf\"}", 3) && expect(text, ITL "_count", 3),
       "ITL buckets from 1 ms, 3 s past the last (2.5 s)");
    ok(has_line(text, ITL "_sum 3.101"), "a sum prints as the shortest exact decimal (3.101)");
    ok(expect(text, E2E "_bucket{le=\"1\"}", 0) && expect(text, E2E "_bucket{le=\"1.5\"}", 1) &&
           expect(text, E2E "_count", 1) && expect(text, E2E "_sum", 1.25),
       "E2E: 1.25 s in le=1.5, infinity ignored");
    ok(cumulative(text, TTFT) && cumulative(text, ITL) && cumulative(text, E2E),
       "every histogram's buckets never decrease and end at _count");
    ok(count_prefix(text, TTFT "_bucket{") >= 10 && count_prefix(text, ITL "_bucket{") >= 10 &&
           count_prefix(text, E2E "_bucket{") >= 10,
       "each histogram has at least ten buckets");
    const char *fams[] = {TTFT, ITL, E2E, "pensieve_http_requests_total",
                          "pensieve_prompt_tokens_total", "pensieve_prompt_tokens_cached_total",
                          "pensieve_generation_tokens_total"};
    int once = 1;
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        char h[128], t[128];
        snprintf(h, sizeof h, "# HELP %s ", fams[i]);
        snprintf(t, sizeof t, "# TYPE %s ", fams[i]);
        if (count_prefix(text, h) != 1 || count_prefix(text, t) != 1) {
            tap_diag("%s: HELP %d times, TYPE %d times", fams[i], count_prefix(text, h),
                     count_prefix(text, t));
            once = 0;
        }
    }
    ok(once && has_line(text, "# TYPE " TTFT " histogram"),
       "HELP and TYPE once per family, histograms typed histogram");
    free(text);
    pv_metrics_free(m);
}

static void counters(void)
{
    pv_metrics *m = NULL;
    pv_metrics_init(&m);
    pv_metrics_request_done(m, 200, 10, 4, 8);
    pv_metrics_request_done(m, 200, 20, 16, 3);
    pv_metrics_request_done(m, 200, 5, 0, 1);
    pv_metrics_request_done(m, 400, 0, 0, 0);
    pv_metrics_request_done(m, 401, 0, 0, 0);
    pv_metrics_request_done(m, 99, 1, 0, 0);  /* no such status: tokens only */
    pv_metrics_request_done(m, 600, 0, 0, 1);
    char *text = render(m, NULL);
    ok(text && valid_exposition(text), "valid text with request counters");
    ok(text && expect(text, "pensieve_http_requests_total{code=\"200\"}", 3) &&
           expect(text, "pensieve_http_requests_total{code=\"400\"}", 1) &&
           expect(text, "pensieve_http_requests_total{code=\"401\"}", 1) &&
           count_prefix(text, "pensieve_http_requests_total{") == 3,
       "one series per status code seen, codes outside 100-599 not counted");
    ok(text && expect(text, "pensieve_prompt_tokens_total", 36) &&
           expect(text, "pensieve_prompt_tokens_cached_total", 20) &&
           expect(text, "pensieve_generation_tokens_total", 13),
       "prompt, cached and generated token counters");
    free(text);

    /* Every code once: 500 series, far past the first buffer. */
    for (int c = 100; c < 600; c++)
        pv_metrics_request_done(m, c, 0, 0, 0);
    text = render(m, NULL);
    ok(text && valid_exposition(text) && count_prefix(text, "pensieve_http_requests_total{") == 500 &&
           expect(text, "pensieve_http_requests_total{code=\"200\"}", 4) &&
           expect(text, "pensieve_http_requests_total{code=\"599\"}", 1),
       "500 status code series: the buffer grows (%zu bytes)", text ? strlen(text) : 0);
    free(text);
    pv_metrics_free(m);
}

static void snapshot(void)
{
    pv_metrics *m = NULL;
    pv_metrics_init(&m);
    pv_metrics_snapshot snap;
    memset(&snap, 0, sizeof snap);
    snap.engine.iterations = 1001;
    snap.engine.turns_done = 1002;
    snap.engine.turns_failed = 1003;
    snap.engine.prefill_tokens = 1004;
    snap.engine.recomputed_tokens = 1005;
    snap.engine.decode_tokens = 1006;
    snap.engine.reused_device_tokens = 1007;
    snap.engine.reused_host_tokens = 1008;
    snap.engine.suspensions = 1009;
    snap.engine.sessions_timed_out = 1010;
    snap.engine.graph_runs = 1011;
    snap.engine.graph_replays = 1012;
    snap.engine.host_segments_refused = 1013;
    snap.engine.forward_s = 1.5;
    snap.engine.schedule_s = 0.25;
    snap.engine.sessions = 11;
    snap.engine.running = 12;
    snap.engine.waiting = 13;
    snap.cache.used_bytes[PV_TIER_DEVICE] = 2001;
    snap.cache.used_bytes[PV_TIER_HOST] = 2002;
    snap.cache.capacity_bytes[PV_TIER_DEVICE] = 1ULL << 30;
    snap.cache.capacity_bytes[PV_TIER_HOST] = 4ULL << 30;
    snap.cache.host_backed_bytes = 3ULL << 28;
    snap.cache.hits[PV_TIER_DEVICE] = 3001;
    snap.cache.hits[PV_TIER_HOST] = 3002;
    snap.cache.hits[PV_TIER_DROPPED] = 3003;
    snap.cache.swap_in_chunks = 3005;
    snap.cache.swap_in_bytes = 3006;
    snap.cache.swap_out_chunks = 3007;
    snap.cache.swap_out_bytes = 3008;
    snap.cache.dropped_chunks = 3009;
    snap.cache.shared_chunks = 3010;
    snap.cache.shared_links = 3011;
    snap.cache.shared_saved_bytes[PV_TIER_DEVICE] = 3012;
    snap.cache.shared_saved_bytes[PV_TIER_HOST] = 3013;
    snap.engine.shared_prompt_tokens = 3014;
    /* Past 2^53: printed as an integer, not through a double. */
    snap.cache.misses = 18446744073709551615ULL;

    char *text = render(m, &snap);
    if (!text) {
        ok(0, "render with a snapshot");
        pv_metrics_free(m);
        return;
    }
    ok(valid_exposition(text), "valid text with a snapshot");
    ok(has_line(text, "pensieve_cache_used_bytes{tier=\"device\"} 2001") &&
           has_line(text, "pensieve_cache_used_bytes{tier=\"host\"} 2002") &&
           has_line(text, "pensieve_cache_capacity_bytes{tier=\"device\"} 1073741824") &&
           has_line(text, "pensieve_cache_capacity_bytes{tier=\"host\"} 4294967296") &&
           has_line(text, "pensieve_cache_host_backed_bytes 805306368") &&
           has_line(text, "# TYPE pensieve_cache_used_bytes gauge") &&
           has_line(text, "# TYPE pensieve_cache_capacity_bytes gauge"),
       "tier used and capacity bytes: gauges labelled by tier");
    ok(has_line(text, "pensieve_cache_hits_total{tier=\"device\"} 3001") &&
           has_line(text, "pensieve_cache_hits_total{tier=\"host\"} 3002") &&
           has_line(text, "pensieve_cache_hits_total{tier=\"dropped\"} 3003") &&
           has_line(text, "pensieve_cache_misses_total 18446744073709551615"),
       "hits per tier and misses (full 64-bit value)");
    ok(has_line(text, "pensieve_cache_swap_in_chunks_total 3005") &&
           has_line(text, "pensieve_cache_swap_in_bytes_total 3006") &&
           has_line(text, "pensieve_cache_swap_out_chunks_total 3007") &&
           has_line(text, "pensieve_cache_swap_out_bytes_total 3008") &&
           has_line(text, "pensieve_cache_dropped_chunks_total 3009"),
       "swap-in, swap-out (chunks and bytes) and dropped chunks");
    ok(has_line(text, "pensieve_cache_shared_chunks 3010") && has_line(text, "pensieve_cache_shared_links 3011") &&
           has_line(text, "pensieve_cache_shared_saved_bytes{tier=\"device\"} 3012") &&
           has_line(text, "pensieve_cache_shared_saved_bytes{tier=\"host\"} 3013") &&
           has_line(text, "pensieve_engine_shared_prompt_tokens_total 3014") &&
           has_line(text, "# TYPE pensieve_cache_shared_chunks gauge"),
       "shared prefixes: chunks, links, bytes saved per tier, prompt tokens not computed");
    ok(has_line(text, "pensieve_requests_running 12") &&
           has_line(text, "pensieve_requests_waiting 13") && has_line(text, "pensieve_sessions 11") &&
           has_line(text, "# TYPE pensieve_requests_running gauge") &&
           has_line(text, "# TYPE pensieve_requests_waiting gauge") &&
           has_line(text, "# TYPE pensieve_sessions gauge"),
       "running, waiting and sessions gauges");
    ok(has_line(text, "pensieve_engine_iterations_total 1001") &&
           has_line(text, "pensieve_engine_turns_total{result=\"done\"} 1002") &&
           has_line(text, "pensieve_engine_turns_total{result=\"failed\"} 1003") &&
           has_line(text, "pensieve_engine_prefill_tokens_total 1004") &&
           has_line(text, "pensieve_engine_recomputed_tokens_total 1005") &&
           has_line(text, "pensieve_engine_decode_tokens_total 1006") &&
           has_line(text, "pensieve_engine_reused_tokens_total{tier=\"device\"} 1007") &&
           has_line(text, "pensieve_engine_reused_tokens_total{tier=\"host\"} 1008") &&
           has_line(text, "pensieve_engine_suspensions_total 1009") &&
           has_line(text, "pensieve_engine_sessions_timed_out_total 1010") &&
           has_line(text, "pensieve_engine_graph_runs_total 1011") &&
           has_line(text, "pensieve_engine_graph_replays_total 1012") &&
           has_line(text, "pensieve_engine_host_segments_refused_total 1013") &&
           has_line(text, "pensieve_engine_forward_seconds_total 1.5") &&
           has_line(text, "pensieve_engine_schedule_seconds_total 0.25"),
       "the engine's counters");
    ok(has_line(text, "# TYPE pensieve_engine_decode_tokens_total counter") &&
           has_line(text, "# TYPE pensieve_cache_hits_total counter") &&
           count_prefix(text, "# HELP pensieve_cache_hits_total ") == 1 &&
           count_prefix(text, "# TYPE pensieve_cache_used_bytes ") == 1,
       "snapshot families typed and declared once");
    free(text);
    pv_metrics_free(m);
}

/* ---- concurrency --------------------------------------------------------------- */

#define THREADS 4
#define PER_THREAD 10000

static void *worker(void *arg)
{
    pv_metrics *m = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        /* Quarters add up exactly in binary: the sum is checked exactly. */
        double v = (i % 4) * 0.25;
        pv_metrics_observe(m, PV_HIST_TTFT, v);
        pv_metrics_observe(m, PV_HIST_ITL, v);
        pv_metrics_observe(m, PV_HIST_E2E, v);
        pv_metrics_request_done(m, i % 2 ? 200 : 429, 3, 1, 2);
    }
    return NULL;
}

static void concurrency(void)
{
    pv_metrics *m = NULL;
    pv_metrics_init(&m);
    pthread_t th[THREADS];
    int started = 0;
    for (int i = 0; i < THREADS; i++)
        started += pthread_create(&th[i], NULL, worker, m) == 0;
    /* Scrapes while the workers record: each must be self-consistent. */
    int scrapes_ok = 1;
    for (int i = 0; i < 20; i++) {
        char *text = scrapes_ok ? render(m, NULL) : NULL;
        scrapes_ok = text && valid_exposition(text) && cumulative(text, TTFT);
        free(text);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    ok(started == THREADS, "%d threads started", THREADS);
    ok(scrapes_ok, "scrapes during recording are valid and cumulative");
    char *text = render(m, NULL);
    const double n = THREADS * PER_THREAD;
    ok(text && expect(text, TTFT "_count", n) && expect(text, ITL "_count", n) &&
           expect(text, E2E "_count", n) && expect(text, TTFT "_bucket{le=\"+Inf\"}", n),
       "%d x %d observations per histogram all counted", THREADS, PER_THREAD);
    ok(text && expect(text, TTFT "_sum", n * 0.375) && expect(text, E2E "_sum", n * 0.375) &&
           expect(text, TTFT "_bucket{le=\"0.25\"}", n / 2) &&
           expect(text, ITL "_bucket{le=\"0.5\"}", n * 3 / 4) &&
           expect(text, E2E "_bucket{le=\"0.75\"}", n),
       "sums and bucket counts exact after concurrent recording");
    ok(text && expect(text, "pensieve_http_requests_total{code=\"200\"}", n / 2) &&
           expect(text, "pensieve_http_requests_total{code=\"429\"}", n / 2) &&
           expect(text, "pensieve_prompt_tokens_total", 3 * n) &&
           expect(text, "pensieve_prompt_tokens_cached_total", n) &&
           expect(text, "pensieve_generation_tokens_total", 2 * n),
       "request counters add up");
    free(text);
    pv_metrics_free(m);
}

int main(void)
{
    empty();
    histograms();
    counters();
    snapshot();
    concurrency();
    return tap_done();
}
