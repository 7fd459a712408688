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

/* A session's records, or none: a session the cache does not hold (every
 * session between turns in stateless mode, or one whose cached copy was
 * given up) has its history in the engine only. *cached says which. */
static pv_status session_view(chat *ch, pv_cache *cache, const char *name, pv_session_view *v, int *cached)
{
    memset(v, 0, sizeof *v);
    pv_status st = pv_cache_session_restore(cache, name, v);
    *cached = st == PV_OK;
    if (st == PV_ERR_NOT_FOUND)
        st = pv_engine_session_tokens(ch->stack.engine, name, &v->n_tokens);
    return st;
}

/* The checkerboard of one session: a row per layer, a column per chunk. */
static int print_session_grid(chat *ch, pv_cache *cache, const char *name, uint32_t n_layers)
{
    pv_session_view v;
    int cached;
    pv_status st = session_view(ch, cache, name, &v, &cached);
    if (st != PV_OK)
        return chat_error("/cache", st);
    const char *mark = strcmp(name, ch->session) == 0 ? "> " : "";
    if (!cached) {
        printf("%s%s%s%s: %zu tokens, no KV kept (the next turn recomputes them)\n", BOLD(ch), mark, name,
               RESET(ch), v.n_tokens);
        return 0;
    }
    printf("%s%s%s%s: %zu tokens, %u chunks (%u shared); own (chunk, layer) records: %u device, %u host "
           "(%u with a device copy), %u dropped\n",
           BOLD(ch), mark, name, RESET(ch), v.n_tokens, v.n_chunks, v.shared_chunks, v.records[PV_TIER_DEVICE],
           v.records[PV_TIER_HOST], v.shadows, v.records[PV_TIER_DROPPED]);
    if (!v.n_chunks)
        return 0;
    /* Chunk indices every ten columns. */
    printf("%11s", "chunk ");
    for (uint32_t c = 0; c < v.n_chunks; c += 10)
        printf(c + 10 < v.n_chunks ? "%-10u" : "%u", c);
    printf("\n");
    if (v.shared_chunks) {
        printf("  shared   ");
        for (uint32_t c = 0; c < v.shared_chunks; c++)
            putchar('=');
        printf("  (chunks 0-%u held once with other sessions that start the same way)\n", v.shared_chunks - 1);
    }
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

enum { BAR_CELLS = 20 };

/* A bar of BAR_CELLS cells split between device, device copies of host
 * records, host and dropped by their share of the session's records
 * (largest remainder, so the cells add up). */
static void print_bar(const chat *ch, const pv_session_view *v)
{
    const int kinds[4] = {CELL_DEVICE, CELL_SHADOW, CELL_HOST, CELL_DROPPED};
    const uint64_t counts[4] = {v->records[PV_TIER_DEVICE], v->shadows, v->records[PV_TIER_HOST] - v->shadows,
                                v->records[PV_TIER_DROPPED]};
    const uint64_t total = counts[0] + counts[1] + counts[2] + counts[3];
    unsigned cells[4] = {0}, given = 0;
    uint64_t rem[4] = {0};
    for (int k = 0; k < 4 && total; k++) {
        cells[k] = (unsigned)(counts[k] * BAR_CELLS / total);
        rem[k] = counts[k] * BAR_CELLS % total;
        given += cells[k];
    }
    while (total && given < BAR_CELLS) {
        int best = 0;
        for (int k = 1; k < 4; k++)
            if (rem[k] > rem[best])
                best = k;
        cells[best]++;
        rem[best] = 0;
        given++;
    }
    putchar('[');
    for (int k = 0; k < 4; k++) {
        if (cells[k] && ch->color)
            printf("%s", cell_color[kinds[k]]);
        for (unsigned i = 0; i < cells[k]; i++)
            putchar(cell_char[kinds[k]]);
        if (cells[k] && ch->color)
            printf("%s", RESET(ch));
    }
    printf("%*s]", (int)(BAR_CELLS - given), "");
}

/* One line per session: its tokens, chunks, records per tier and a bar. */
static int print_summary(chat *ch, pv_cache *cache, char **names, size_t n)
{
    int width = 7; /* "session" */
    for (size_t i = 0; i < n; i++)
        if ((int)strlen(names[i]) > width)
            width = strlen(names[i]) < 24 ? (int)strlen(names[i]) : 24;
    printf("  %-*s %7s %6s %7s %7s %7s  (chunk, layer) records\n", width, "session", "tokens", "chunks", "device",
           "host", "dropped");
    for (size_t i = 0; i < n; i++) {
        pv_session_view v;
        int cached;
        pv_status st = session_view(ch, cache, names[i], &v, &cached);
        if (st != PV_OK)
            return chat_error("/cache", st);
        printf("%s%-*s %7zu %6u %7u %7u %7u  ", strcmp(names[i], ch->session) == 0 ? "> " : "  ", width,
               names[i], v.n_tokens, v.n_chunks, v.records[PV_TIER_DEVICE], v.records[PV_TIER_HOST],
               v.records[PV_TIER_DROPPED]);
        print_bar(ch, &v);
        printf("%s\n", cached ? "" : " no KV kept");
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
    printf("device %s of %s used (shadows %s), host %s of %s (%s allocated)\n",
           fmt_size(cs.used_bytes[PV_TIER_DEVICE]).s, fmt_size(cs.capacity_bytes[PV_TIER_DEVICE]).s,
           fmt_size(cs.shadow_bytes).s, fmt_size(cs.used_bytes[PV_TIER_HOST]).s,
           fmt_size(cs.capacity_bytes[PV_TIER_HOST]).s, fmt_size(cs.host_backed_bytes).s);
    if (cs.shared_chunks)
        printf("shared prefixes: %llu chunks held once for %llu session links, %s saved\n",
               (unsigned long long)cs.shared_chunks, (unsigned long long)cs.shared_links,
               fmt_size(cs.shared_saved_bytes[PV_TIER_DEVICE] + cs.shared_saved_bytes[PV_TIER_HOST]).s);
    if (ch->o->mode == PV_MODE_STATELESS)
        printf("stateless mode keeps no KV between turns: every turn recomputes its history\n");
    print_legend(ch);

    name_list l = {0};
    pv_engine_foreach_session(ch->stack.engine, collect_name, &l);
    int rc = 0;
    if (l.failed) {
        fprintf(stderr, "pensieve-chat: /cache: out of memory listing sessions\n");
        rc = -1;
    } else if (only) {
        size_t i = 0;
        while (i < l.n && strcmp(only, l.names[i]) != 0)
            i++;
        if (i < l.n) {
            rc = print_session_grid(ch, cache, l.names[i], pv_llama_hparams_of(ch->stack.model)->n_layers);
        } else {
            fprintf(stderr, "pensieve-chat: /cache: no session named '%s'\n", only);
            rc = -1;
        }
    } else if (!l.n) {
        printf("(no sessions)\n");
    } else {
        qsort(l.names, l.n, sizeof *l.names, by_name);
        rc = print_summary(ch, cache, l.names, l.n);
        if (rc == 0)
            printf("/cache NAME draws where every (chunk, layer) of one session lives.\n");
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
    printf("  sessions %u, running %u, waiting %u; turns done %llu, failed %llu; iterations %llu (%llu chained, "
           "%llu rows discarded)\n",
           es.sessions, es.running, es.waiting, (unsigned long long)es.turns_done,
           (unsigned long long)es.turns_failed, (unsigned long long)es.iterations,
           (unsigned long long)es.chained_iterations, (unsigned long long)es.discarded_tokens);
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
