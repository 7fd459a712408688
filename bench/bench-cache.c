/* bench-cache: operations per second of the tiered KV cache core for store,
 * lookup, touch, shadow reclaim and evict, at 1,000 and 10,000 sessions of 30 layers x 64
 * chunks (1.92M and 19.2M chunk records), so the cost of a victim choice can
 * be compared across a 10x change in the number of chunks.
 *
 * Usage: bench-cache [--json] [--plan] [--sessions N]... [--repeats R]
 * Each phase runs R batches (default 5); the table gives the median batch.
 * Budgets are counted in nominal slots the core never allocates, so they fit
 * any machine the records themselves fit (see usage()). */
#include "bench-util.h"

#include <pensieve/cache.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

enum { LAYERS = 30, CHUNKS = 64, MAX_SIZES = 8 };

/* The core's work depends on the number of slots, not their size, and it
 * holds no slot bytes: a nominal 64-byte slot keeps the budgets (checked
 * against physical memory at init) far below what the records cost. */
enum { NOMINAL_SLOT_BYTES = 64 };
/* What the core holds per (chunk, layer) record with every record on device
 * and half on host: 8 bytes of record, 16 per device slot, 20 per host slot
 * (docs/PERFORMANCE.md), and the eviction leads; measured 39 at 10,000
 * sessions. */
enum { BYTES_PER_RECORD = 40 };

/* The cache of one size: budgets in nominal slots. */
static void size_config(uint32_t n_sessions, pv_cache_config *cfg)
{
    const uint64_t records = (uint64_t)n_sessions * CHUNKS * LAYERS;
    pv_cache_config_defaults(cfg);
    cfg->n_layers = LAYERS;
    cfg->chunk_tokens = 32;
    cfg->slot_bytes = NOMINAL_SLOT_BYTES;
    cfg->device_bytes = records * cfg->slot_bytes;
    cfg->host_bytes = records / 2 * cfg->slot_bytes;
}

static void usage(FILE *f)
{
    pv_cache_config cfg;
    size_config(10000, &cfg);
    fprintf(f,
            "usage: bench-cache [--json] [--plan] [--sessions N]... [--repeats R]\n"
            "  --sessions N   sessions of %d layers x %d chunks (1 to 100000; repeatable;\n"
            "                 default 1000 and 10000)\n"
            "  --repeats R    batches per phase, the table gives the median (default 5)\n"
            "  --json         the figures as JSON\n"
            "  --plan         print each size's records, budgets and memory, check them\n"
            "                 against this machine, and exit without running\n"
            "Budgets: every record fits on device and half of them on host, counted in\n"
            "nominal %d-byte slots (the core allocates no slot bytes, and the slot size\n"
            "does not change its work): 10000 sessions ask for %.2f GiB of device and\n"
            "%.2f GiB of host budget and take about %.2f GiB of memory. Every size is\n"
            "checked against this machine's memory before any runs.\n",
            LAYERS, CHUNKS, NOMINAL_SLOT_BYTES, cfg.device_bytes / 1073741824.0,
            cfg.host_bytes / 1073741824.0, 10000.0 * CHUNKS * LAYERS * BYTES_PER_RECORD / 1073741824.0);
}

/* A size this machine cannot run: its budgets (the core's own check) or
 * the memory its records take. Prints why and returns -1. */
static int check_size(uint32_t n_sessions, int print)
{
    pv_cache_config cfg;
    size_config(n_sessions, &cfg);
    const uint64_t records = (uint64_t)n_sessions * CHUNKS * LAYERS, memory = records * BYTES_PER_RECORD;
    if (print)
        printf("%u sessions: %" PRIu64 " records; budgets %.2f GiB device, %.2f GiB host "
               "(%d-byte slots); about %.2f GiB of memory\n",
               n_sessions, records, cfg.device_bytes / 1073741824.0, cfg.host_bytes / 1073741824.0,
               NOMINAL_SLOT_BYTES, memory / 1073741824.0);
    if (pv_cache_config_validate(&cfg) != PV_OK) {
        fprintf(stderr, "bench-cache: %u sessions: %s\n", n_sessions, pv_last_error());
        return -1;
    }
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0 && memory / (uint64_t)page_size >= (uint64_t)pages) {
        fprintf(stderr, "bench-cache: %u sessions take about %" PRIu64 " bytes, more than the physical "
                "memory of %llu bytes: ask for fewer with --sessions\n",
                n_sessions, memory, (unsigned long long)pages * (unsigned long long)page_size);
        return -1;
    }
    return 0;
}

typedef struct bench_clock {
    double now;
} bench_clock;

static double bench_clock_read(void *ctx)
{
    return ((bench_clock *)ctx)->now;
}

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

typedef struct result {
    uint32_t sessions;
    uint64_t records;
    double store_ops, lookup_ops, touch_ops, evict_ops, evict_us;
    double evict_us_min, evict_us_max;
    double reclaim_us;  /* per shadow reclaimed by evict_to_free (no copy) */
    uint64_t reclaims;
    uint64_t evictions, to_host, dropped;
    double seconds_total;
    long max_rss_mb;
} result;

static int fail(const char *what)
{
    fprintf(stderr, "bench-cache: %s: %s\n", what, pv_last_error());
    return 1;
}

/* n calls of evict_to_free(DEVICE), each asking for one more free slot,
 * with the clock moving and one session in 16 touched between calls so the
 * order across sessions keeps changing. *busy gets the seconds spent in the
 * calls; with shadows_only, each call must reclaim exactly one shadow. */
static int timed_evictions(pv_cache *cache, bench_clock *clk, char (*ids)[16], uint32_t n_sessions,
                           const pv_cache_config *cfg, uint64_t n, int shadows_only,
                           pv_cache_plan *plan, double *busy)
{
    pv_cache_stats st;
    pv_cache_stats_get(cache, &st);
    uint64_t free_slots = (cfg->device_bytes - st.used_bytes[PV_TIER_DEVICE]) / cfg->slot_bytes;
    *busy = 0;
    for (uint64_t i = 0; i < n; i++) {
        clk->now += 1e-4;
        if (i % 16 == 0 && pv_cache_touch(cache, ids[rng() % n_sessions]) != PV_OK)
            return fail("touch");
        pv_cache_plan_clear(plan);
        free_slots++;
        double t0 = bench_now_s();
        if (pv_cache_evict_to_free(cache, PV_TIER_DEVICE, free_slots * cfg->slot_bytes, plan) != PV_OK)
            return fail(shadows_only ? "reclaim" : "evict");
        *busy += bench_now_s() - t0;
        if (shadows_only && (plan->n_moves != 1 || plan->moves[0].to != PV_TIER_NONE)) {
            fprintf(stderr, "bench-cache: device pressure did not reclaim a shadow alone\n");
            return 1;
        }
    }
    return 0;
}

static int run_size(uint32_t n_sessions, int repeats, result *res)
{
    double t_start = bench_now_s();
    uint64_t records = (uint64_t)n_sessions * CHUNKS * LAYERS;
    bench_clock clk = {0};
    pv_cache_config cfg;
    size_config(n_sessions, &cfg);
    pv_cache *cache = NULL;
    if (pv_cache_init(&cache, &cfg, bench_clock_read, &clk) != PV_OK)
        return fail("init");
    char (*ids)[16] = malloc((size_t)n_sessions * sizeof *ids);
    double *rates = malloc((size_t)repeats * sizeof *rates);
    double *per = malloc((size_t)repeats * sizeof *per);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    if (!ids || !rates || !per) {
        fprintf(stderr, "bench-cache: out of memory\n");
        return 1;
    }
    for (uint32_t s = 0; s < n_sessions; s++) {
        snprintf(ids[s], sizeof ids[s], "user-%06u", s);
        clk.now += 0.01;
        if (pv_cache_session_open(cache, ids[s]) != PV_OK)
            return fail("open");
    }

    /* store: every (chunk, layer) of every session; sessions split into
     * `repeats` batches. */
    uint32_t per_batch = (n_sessions + (uint32_t)repeats - 1) / (uint32_t)repeats;
    int batches = 0;
    for (uint32_t first = 0; first < n_sessions; first += per_batch) {
        uint32_t last = first + per_batch < n_sessions ? first + per_batch : n_sessions;
        double t0 = bench_now_s();
        for (uint32_t s = first; s < last; s++) {
            for (uint32_t c = 0; c < CHUNKS; c++)
                for (uint32_t l = 0; l < LAYERS; l++)
                    if (pv_cache_store_chunk(cache, ids[s], c, l, PV_TIER_DEVICE, NULL) != PV_OK)
                        return fail("store");
            clk.now += 0.01;
            if (pv_cache_touch(cache, ids[s]) != PV_OK)
                return fail("touch");
        }
        rates[batches++] = (double)(last - first) * CHUNKS * LAYERS / (bench_now_s() - t0);
    }
    res->store_ops = bench_median(rates, batches);

    /* lookup: random (session, chunk, layer) */
    const uint64_t n_lookup = 1000000;
    for (int r = 0; r < repeats; r++) {
        double t0 = bench_now_s();
        for (uint64_t i = 0; i < n_lookup; i++) {
            uint64_t x = rng();
            pv_tier tier;
            uint32_t slot;
            if (pv_cache_lookup(cache, ids[x % n_sessions], (uint32_t)(x >> 32) % CHUNKS,
                                (uint32_t)(x >> 48) % LAYERS, &tier, &slot) != PV_OK)
                return fail("lookup");
        }
        rates[r] = (double)n_lookup / (bench_now_s() - t0);
    }
    res->lookup_ops = bench_median(rates, repeats);

    /* touch: random sessions become active as time passes */
    const uint64_t n_touch = 200000;
    for (int r = 0; r < repeats; r++) {
        double t0 = bench_now_s();
        for (uint64_t i = 0; i < n_touch; i++) {
            clk.now += 1e-4;
            if (pv_cache_touch(cache, ids[rng() % n_sessions]) != PV_OK)
                return fail("touch");
        }
        rates[r] = (double)n_touch / (bench_now_s() - t0);
    }
    res->touch_ops = bench_median(rates, repeats);

    /* shadow reclaim: ahead-of-time copies of the coldest chunks complete,
     * leaving their device slots as shadows; device pressure then reclaims
     * them one slot per call, lowest retention value first, with no copy.
     * Storing the chunks again afterwards (a recompute replaces both copies)
     * puts every record back on device for the evict phase. */
    const uint32_t n_shadows = records / 4 < 100000 ? (uint32_t)(records / 4) : 100000;
    pv_cache_stats before;
    pv_cache_stats_get(cache, &before);
    if (pv_cache_plan_swap_out(cache, n_shadows, &plan) != PV_OK ||
        pv_cache_complete(cache, plan.moves, plan.n_moves) != PV_OK)
        return fail("swap-out");
    size_t n_copied = plan.n_moves;
    pv_cache_move *copied = malloc((n_copied ? n_copied : 1) * sizeof *copied);
    if (!copied) {
        fprintf(stderr, "bench-cache: out of memory\n");
        return 1;
    }
    memcpy(copied, plan.moves, n_copied * sizeof *copied);
    uint64_t per_repeat = n_copied / (uint64_t)repeats;
    res->reclaims = 0;
    for (int r = 0; r < repeats && per_repeat > 0; r++) {
        double busy;
        if (timed_evictions(cache, &clk, ids, n_sessions, &cfg, per_repeat, 1, &plan, &busy))
            return 1;
        res->reclaims += per_repeat;
        per[r] = 1e6 * busy / (double)per_repeat;
    }
    res->reclaim_us = per_repeat > 0 ? bench_median(per, repeats) : 0;
    pv_cache_plan_clear(&plan);
    /* Whatever is still shadowed goes for free too, then all return. */
    if (pv_cache_evict_to_free(cache, PV_TIER_DEVICE, cfg.device_bytes - before.used_bytes[PV_TIER_DEVICE] +
                                                          n_copied * cfg.slot_bytes,
                               &plan) != PV_OK)
        return fail("reclaim the rest");
    for (size_t i = 0; i < n_copied; i++)
        if (pv_cache_store_chunk(cache, pv_cache_session_name(cache, copied[i].session),
                                 copied[i].chunk, copied[i].layer, PV_TIER_DEVICE, NULL) != PV_OK)
            return fail("store after reclaim");
    free(copied);

    /* evict: one slot per call, time moving and sessions touched between
     * calls so the order across sessions keeps changing. The first half
     * goes to host; once host is full, the colder of host and device
     * victims is dropped. */
    /* Every eviction empties one device slot: small sizes run fewer. */
    const uint64_t n_evict = records / (uint64_t)(repeats + 1) < 200000 ? records / (uint64_t)(repeats + 1)
                                                                         : 200000;
    res->evictions = 0;
    res->evict_us_min = 1e30;
    res->evict_us_max = 0;
    for (int r = 0; r < repeats; r++) {
        double busy;
        if (timed_evictions(cache, &clk, ids, n_sessions, &cfg, n_evict, 0, &plan, &busy))
            return 1;
        res->evictions += n_evict;
        per[r] = 1e6 * busy / (double)n_evict;
        rates[r] = (double)n_evict / busy;
        if (per[r] < res->evict_us_min)
            res->evict_us_min = per[r];
        if (per[r] > res->evict_us_max)
            res->evict_us_max = per[r];
    }
    res->evict_ops = bench_median(rates, repeats);
    res->evict_us = bench_median(per, repeats);
    pv_cache_stats st;
    pv_cache_stats_get(cache, &st);
    res->to_host = st.swap_out_chunks - before.swap_out_chunks - n_copied;
    res->dropped = st.dropped_chunks;
    if (pv_cache_check(cache) != PV_OK)
        return fail("check after the run");
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    res->max_rss_mb = ru.ru_maxrss / 1024;
    res->sessions = n_sessions;
    res->records = records;
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
    free(ids);
    free(rates);
    free(per);
    res->seconds_total = bench_now_s() - t_start;
    return 0;
}

int main(int argc, char **argv)
{
    int json = 0, plan = 0, repeats = 5, n_sizes = 0;
    uint32_t sizes[MAX_SIZES];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--plan") == 0) {
            plan = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--sessions") == 0 && i + 1 < argc && n_sizes < MAX_SIZES) {
            long v = strtol(argv[++i], NULL, 10);
            if (v < 1 || v > 100000) {
                fprintf(stderr, "bench-cache: --sessions %s out of range [1, 100000]\n", argv[i]);
                return 2;
            }
            sizes[n_sizes++] = (uint32_t)v;
        } else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
            repeats = atoi(argv[++i]);
            if (repeats < 1 || repeats > 100) {
                fprintf(stderr, "bench-cache: --repeats %s out of range [1, 100]\n", argv[i]);
                return 2;
            }
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (n_sizes == 0) {
        sizes[n_sizes++] = 1000;
        sizes[n_sizes++] = 10000;
    }
    /* A size that cannot run fails now, not after the sizes before it. */
    int fits = 1;
    for (int i = 0; i < n_sizes; i++)
        fits &= check_size(sizes[i], plan) == 0;
    if (!fits || plan)
        return fits ? 0 : 1;
    result res[MAX_SIZES];
    for (int i = 0; i < n_sizes; i++) {
        memset(&res[i], 0, sizeof res[i]);
        if (run_size(sizes[i], repeats, &res[i]) != 0)
            return 1;
    }
    if (json) {
        printf("{\"bench\": \"cache\", \"layers\": %d, \"chunks\": %d, \"repeats\": %d, \"results\": [", LAYERS,
               CHUNKS, repeats);
        for (int i = 0; i < n_sizes; i++)
            printf("%s\n  {\"sessions\": %u, \"records\": %" PRIu64 ", \"store_ops\": %.0f, "
                   "\"lookup_ops\": %.0f, \"touch_ops\": %.0f, \"evict_ops\": %.0f, "
                   "\"evict_us\": %.3f, \"evict_us_min\": %.3f, \"evict_us_max\": %.3f, "
                   "\"evictions\": %" PRIu64 ", \"to_host\": %" PRIu64 ", \"dropped\": %" PRIu64 ", "
                   "\"reclaims\": %" PRIu64 ", \"reclaim_us\": %.3f, "
                   "\"max_rss_mb\": %ld, \"seconds\": %.1f}",
                   i ? "," : "", res[i].sessions, res[i].records, res[i].store_ops, res[i].lookup_ops,
                   res[i].touch_ops, res[i].evict_ops, res[i].evict_us, res[i].evict_us_min,
                   res[i].evict_us_max, res[i].evictions, res[i].to_host, res[i].dropped,
                   res[i].reclaims, res[i].reclaim_us, res[i].max_rss_mb, res[i].seconds_total);
        printf("\n]}\n");
        return 0;
    }
    printf("bench-cache: %d layers x %d chunks per session, median of %d batches\n", LAYERS, CHUNKS,
           repeats);
    printf("%9s %11s %12s %12s %12s %12s %10s %13s %9s\n", "sessions", "records", "store/s",
           "lookup/s", "touch/s", "evict/s", "evict us", "(min-max)", "RSS MB");
    for (int i = 0; i < n_sizes; i++)
        printf("%9u %11" PRIu64 " %12.0f %12.0f %12.0f %12.0f %10.3f %6.3f-%-6.3f %9ld\n", res[i].sessions,
               res[i].records, res[i].store_ops, res[i].lookup_ops, res[i].touch_ops, res[i].evict_ops,
               res[i].evict_us, res[i].evict_us_min, res[i].evict_us_max, res[i].max_rss_mb);
    for (int i = 0; i < n_sizes; i++)
        printf("%u sessions: %" PRIu64 " evictions, %" PRIu64 " to host, %" PRIu64 " dropped; %" PRIu64
               " shadows reclaimed, %.3f us each; %.1f s\n",
               res[i].sessions, res[i].evictions, res[i].to_host, res[i].dropped, res[i].reclaims,
               res[i].reclaim_us, res[i].seconds_total);
    return 0;
}
