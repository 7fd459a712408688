/* What pensieve-chat shows of the engine: the status line after an answer,
 * the picture of the tiers (/cache) and the counters (/stats). Read-only
 * views through the engine's API. */
#include "apps/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM(ch) ((ch)->color ? "\033[2m" : "")
#define BOLD(ch) ((ch)->color ? "\033[1m" : "")
#define RESET(ch) ((ch)->color ? "\033[0m" : "")

/* Bytes in the largest binary unit that keeps the number at least 1. */
typedef struct size_text {
    char s[32];
} size_text;

static size_text fmt_size(uint64_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    size_text t;
    snprintf(t.s, sizeof t.s, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return t;
}

void chat_print_status(const chat *ch, const pv_turn_result *r)
{
    printf("%s[%s] reused %u device + %u host | recomputed %u | new %u | prefill %.1f ms | ", DIM(ch),
           ch->session, r->reused_device, r->reused_host, r->recomputed, r->new_tokens, r->prefill_ms);
    /* decode_ms spans first to last token: generated - 1 decode steps. */
    if (r->generated > 1 && r->decode_ms > 0)
        printf("decode %.1f tokens/s", (r->generated - 1) * 1000.0 / r->decode_ms);
    else
        printf("decode - tokens/s");
    printf(" (%u tokens, %s", r->generated, pv_finish_reason_name(r->finish));
    if (r->suspensions)
        printf(", suspended %u times", r->suspensions);
    printf(")%s\n", RESET(ch));
    fflush(stdout);
}

/* ---- /cache ----------------------------------------------------------------- */

typedef struct name_list {
    char **names;
    size_t n, cap;
    int failed;
} name_list;

static void collect_name(void *user, const char *session)
{
    name_list *l = user;
    if (l->failed)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        char **names = realloc(l->names, cap * sizeof *names);
        if (!names) {
            l->failed = 1;
            return;
        }
        l->names = names;
        l->cap = cap;
    }
    if (!(l->names[l->n] = strdup(session)))
        l->failed = 1;
    else
        l->n++;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* What one (chunk, layer) cell shows: its tier, or SHADOW for a chunk
 * swapped out ahead of time whose device slot is still held (it is read on
 * the device until the slot is reclaimed). */
enum { CELL_DEVICE, CELL_HOST, CELL_DROPPED, CELL_NONE, CELL_SHADOW };
/* One character per cell kind; on a terminal a background colour too. */
static const char cell_char[] = {'#', '+', '.', ' ', '*'};
static const char *const cell_color[] = {"\033[42;30m", "\033[43;30m", "\033[41;30m", "",
                                         "\033[46;30m"};

static void print_legend(const chat *ch)
{
    static const struct {
        int cell;
        const char *name;
    } items[] = {{CELL_DEVICE, "device"},
                 {CELL_SHADOW, "host, device copy still held"},
                 {CELL_HOST, "host"},
                 {CELL_DROPPED, "dropped (recomputed on return)"}};
    printf("legend:");
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++)
        printf("  %s%c%s %s", ch->color ? cell_color[items[i].cell] : "", cell_char[items[i].cell],
               RESET(ch), items[i].name);
    printf("  (blank: not stored)\n");
}

/* The cell of (chunk, layer), read without counting a cache hit. */
static pv_status lookup_cell(pv_cache *cache, const char *name, uint32_t chunk, uint32_t layer,
                             int *cell)
{
    pv_tier tier;
    uint32_t shadow;
    pv_status st = pv_cache_peek(cache, name, chunk, layer, &tier, NULL, &shadow);
    if (st == PV_OK)
        *cell = shadow != UINT32_MAX ? CELL_SHADOW : (int)tier;
    return st;
}

/* The checkerboard of one session: a row per layer, a column per chunk. */
static int print_session_grid(chat *ch, pv_cache *cache, const char *name, uint32_t n_layers)
{
    pv_session_view v;
    pv_status st = pv_cache_session_restore(cache, name, &v);
    if (st != PV_OK)
        return chat_error("/cache", st);
    printf("%s%s%s%s: %zu tokens, %u chunks; (chunk, layer) records: %u device, %u host "
           "(%u with a device copy), %u dropped\n",
           BOLD(ch), strcmp(name, ch->session) == 0 ? "> " : "", name, RESET(ch), v.n_tokens,
           v.n_chunks, v.records[PV_TIER_DEVICE], v.records[PV_TIER_HOST], v.shadows,
           v.records[PV_TIER_DROPPED]);
    if (!v.n_chunks)
        return 0;
    /* Chunk indices every ten columns. */
    printf("%11s", "chunk ");
    for (uint32_t c = 0; c < v.n_chunks; c += 10)
        printf(c + 10 < v.n_chunks ? "%-10u" : "%u", c);
    printf("\n");
    for (uint32_t layer = 0; layer < n_layers; layer++) {
        printf("  layer %2u ", layer);
        int prev = CELL_NONE;
        for (uint32_t c = 0; c < v.n_chunks; c++) {
            int cell;
            if ((st = lookup_cell(cache, name, c, layer, &cell)) != PV_OK) {
                printf("%s\n", RESET(ch));
                return chat_error("/cache", st);
            }
            /* Colour codes only where the cell kind changes, to keep lines short. */
            if (ch->color && cell != prev)
                printf("%s%s", RESET(ch), cell_color[cell]);
            prev = cell;
            putchar(cell_char[cell]);
        }
        printf("%s\n", RESET(ch));
    }
    return 0;
}

int chat_print_cache(chat *ch, const char *only)
{
    pv_cache *cache = pv_engine_cache(ch->stack.engine);
    pv_cache_stats cs;
    pv_status st = pv_cache_stats_get(cache, &cs);
    if (st != PV_OK)
        return chat_error("/cache", st);
    printf("device %s of %s used (shadows %s), host %s of %s\n",
           fmt_size(cs.used_bytes[PV_TIER_DEVICE]).s, fmt_size(cs.capacity_bytes[PV_TIER_DEVICE]).s,
           fmt_size(cs.shadow_bytes).s, fmt_size(cs.used_bytes[PV_TIER_HOST]).s,
           fmt_size(cs.capacity_bytes[PV_TIER_HOST]).s);
    print_legend(ch);

    name_list l = {0};
    pv_engine_foreach_session(ch->stack.engine, collect_name, &l);
    int rc = 0;
    if (l.failed) {
        fprintf(stderr, "pensieve-chat: /cache: out of memory listing sessions\n");
        rc = -1;
    } else {
        qsort(l.names, l.n, sizeof *l.names, by_name);
        const uint32_t n_layers = pv_llama_hparams_of(ch->stack.model)->n_layers;
        size_t shown = 0;
        for (size_t i = 0; i < l.n && rc == 0; i++) {
            if (only && strcmp(only, l.names[i]) != 0)
                continue;
            rc = print_session_grid(ch, cache, l.names[i], n_layers);
            shown++;
        }
        if (rc == 0 && only && !shown) {
            fprintf(stderr, "pensieve-chat: /cache: no session named '%s'\n", only);
            rc = -1;
        } else if (rc == 0 && !shown) {
            printf("(no sessions)\n");
        }
    }
    for (size_t i = 0; i < l.n; i++)
        free(l.names[i]);
    free(l.names);
    return rc;
}

/* ---- /stats ------------------------------------------------------------------- */

int chat_print_stats(chat *ch)
{
    pv_engine_stats es;
    pv_cache_stats cs;
    pv_status st = pv_engine_stats_get(ch->stack.engine, &es);
    if (st == PV_OK)
        st = pv_cache_stats_get(pv_engine_cache(ch->stack.engine), &cs);
    if (st != PV_OK)
        return chat_error("/stats", st);
    const double busy = es.forward_s + es.schedule_s;
    printf("%sengine%s (%s mode)\n", BOLD(ch), RESET(ch), pv_engine_mode_name(ch->o->mode));
    printf("  sessions %u, running %u, waiting %u; turns done %llu, failed %llu; iterations %llu\n",
           es.sessions, es.running, es.waiting, (unsigned long long)es.turns_done,
           (unsigned long long)es.turns_failed, (unsigned long long)es.iterations);
    printf("  tokens: prefill %llu (recomputed history %llu), decode %llu; "
           "history reused from device %llu, from host %llu\n",
           (unsigned long long)es.prefill_tokens, (unsigned long long)es.recomputed_tokens,
           (unsigned long long)es.decode_tokens, (unsigned long long)es.reused_device_tokens,
           (unsigned long long)es.reused_host_tokens);
    printf("  (chunk, layer) records: swapped in %llu, swapped out %llu, dropped %llu; "
           "suspensions %llu; sessions timed out %llu\n",
           (unsigned long long)es.swap_in_chunks, (unsigned long long)es.swap_out_chunks,
           (unsigned long long)es.dropped_chunks, (unsigned long long)es.suspensions,
           (unsigned long long)es.sessions_timed_out);
    printf("  time: forward %.3f s, scheduling %.3f s (%.1f%% of the engine's time)\n", es.forward_s,
           es.schedule_s, busy > 0 ? 100.0 * es.schedule_s / busy : 0.0);

    printf("%scache%s (%s policy)\n", BOLD(ch), RESET(ch), pv_policy_name(ch->stack.policy));
    for (int t = 0; t < PV_SLOT_TIERS; t++)
        printf("  %-7s %12s of %12s used, %llu records\n", pv_tier_name((pv_tier)t),
               fmt_size(cs.used_bytes[t]).s, fmt_size(cs.capacity_bytes[t]).s,
               (unsigned long long)cs.records[t]);
    printf("  %-7s %35s%llu records\n", pv_tier_name(PV_TIER_DROPPED), "",
           (unsigned long long)cs.records[PV_TIER_DROPPED]);
    printf("  lookups: device %llu (shadows %llu), host %llu, dropped %llu, "
           "misses %llu\n",
           (unsigned long long)cs.hits[PV_TIER_DEVICE], (unsigned long long)cs.shadow_hits,
           (unsigned long long)cs.hits[PV_TIER_HOST], (unsigned long long)cs.hits[PV_TIER_DROPPED],
           (unsigned long long)cs.misses);
    printf("  swap out %llu chunks (%s), in %llu chunks (%s); delayed swap-outs %llu\n",
           (unsigned long long)cs.swap_out_chunks, fmt_size(cs.swap_out_bytes).s,
           (unsigned long long)cs.swap_in_chunks, fmt_size(cs.swap_in_bytes).s,
           (unsigned long long)cs.swap_out_delayed);
    printf("  dropped %llu, recomputed %llu chunks (%llu tokens); shadows held %llu (%s), "
           "reclaimed %llu\n",
           (unsigned long long)cs.dropped_chunks, (unsigned long long)cs.recomputed_chunks,
           (unsigned long long)cs.recomputed_tokens, (unsigned long long)cs.shadow_chunks,
           fmt_size(cs.shadow_bytes).s, (unsigned long long)cs.shadow_reclaimed);
    return 0;
}
