/* libFuzzer target: the cache API driven by a byte string. The first bytes
 * choose the configuration (policy, layers, device and host slots, high
 * water, reserve); every following op is one byte (low 5 bits: the call;
 * high 3 bits: how far the clock moves first, zero included, so idle times
 * of zero and ties happen) and its arguments are the bytes after it.
 * Two-phase moves of the plans wait in a list until an op completes or
 * aborts a slice of it; another op hands in a move forged from the bytes,
 * which the cache must refuse unless it is one in flight. After every call
 * pv_cache_check() must hold: a violation aborts with its message.
 *
 * Session ids come from a small set, with the empty id, an over-long one
 * and NULL mixed in; chunk indices stay small (see take_chunk). Statuses
 * are not judged: tests/test-cache-property does that against a model. */
#include <pensieve/cache.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SLOT_BYTES 1024u
#define N_NAMES 6
#define MAX_INFLIGHT 64

typedef struct input {
    const uint8_t *p;
    size_t left;
} input;

/* Next byte, 0 once the input is spent (so every op has arguments). */
static unsigned take(input *in)
{
    if (in->left == 0)
        return 0;
    in->left--;
    return *in->p++;
}

static const char *const names[N_NAMES] = {"s0", "s1", "s2", "s3", "s4", "s5"};
static char long_id[PV_SESSION_ID_MAX + 2];

static const char *take_id(input *in)
{
    unsigned v = take(in);
    if (v == 255)
        return NULL;
    switch (v % 8) {
    case 6: return "";
    case 7: return long_id; /* one byte over PV_SESSION_ID_MAX */
    default: return names[v % 8 % N_NAMES];
    }
}

/* Small indices, where sessions collide and chunks get evicted; one value
 * in 256 is PV_CACHE_MAX_CHUNKS, the first one out of range. (Indices near
 * the top of the range are item 5 of issue 8: each costs a 256 MiB index
 * today, which would make the target measure the allocator.) */
static uint32_t take_chunk(input *in)
{
    unsigned v = take(in);
    return v == 255 ? PV_CACHE_MAX_CHUNKS : v % 8;
}

typedef struct state {
    pv_cache *cache;
    uint32_t n_layers;
    double now;
    pv_cache_plan plan;
    pv_cache_move inflight[MAX_INFLIGHT];
    size_t n_inflight;
    int lost; /* a two-phase move did not fit in inflight */
    uint64_t op;
} state;

static double read_clock(void *ctx)
{
    return ((const state *)ctx)->now;
}

static void check(const state *s, const char *call)
{
    if (pv_cache_check(s->cache) != PV_OK) {
        fprintf(stderr, "fuzz-cache: op %llu (%s) broke an invariant: %s\n", (unsigned long long)s->op, call,
                pv_last_error());
        abort();
    }
}

/* Keep the plan's two-phase moves for a later complete or abort. */
static void keep_two_phase(state *s)
{
    for (size_t i = 0; i < s->plan.n_moves; i++) {
        if (!s->plan.moves[i].two_phase)
            continue;
        if (s->n_inflight < MAX_INFLIGHT)
            s->inflight[s->n_inflight++] = s->plan.moves[i];
        else
            s->lost = 1;
    }
}

/* Complete or abort a slice of the moves in flight; drop it from the list
 * when the cache took it. */
static void finish(state *s, input *in, int complete)
{
    if (s->n_inflight == 0)
        return;
    size_t first = take(in) % s->n_inflight;
    size_t n = 1 + take(in) % (s->n_inflight - first);
    pv_status st = complete ? pv_cache_complete(s->cache, s->inflight + first, n)
                            : pv_cache_abort(s->cache, s->inflight + first, n);
    if (st == PV_OK) {
        memmove(s->inflight + first, s->inflight + first + n, (s->n_inflight - first - n) * sizeof *s->inflight);
        s->n_inflight -= n;
    }
}

static int same_move(const pv_cache_move *a, const pv_cache_move *b)
{
    return a->session == b->session && a->chunk == b->chunk && a->layer == b->layer && a->from == b->from &&
           a->to == b->to && a->from_slot == b->from_slot && a->to_slot == b->to_slot &&
           a->two_phase == b->two_phase;
}

static void forged(state *s, input *in)
{
    pv_cache_move m = {
        .session = take(in) % 8,
        .chunk = take_chunk(in),
        .layer = take(in) % (s->n_layers + 1),
        .from = (pv_tier)(take(in) % 4),
        .to = (pv_tier)(take(in) % 4),
        .from_slot = take(in) % 32,
        .to_slot = take(in) % 32,
        .two_phase = (int)(take(in) % 2),
    };
    int complete = take(in) % 2;
    pv_status st = complete ? pv_cache_complete(s->cache, &m, 1) : pv_cache_abort(s->cache, &m, 1);
    if (st != PV_OK)
        return;
    /* Taken: it must have been one in flight; forget that one. */
    for (size_t i = 0; i < s->n_inflight; i++)
        if (same_move(&s->inflight[i], &m)) {
            memmove(s->inflight + i, s->inflight + i + 1, (s->n_inflight - i - 1) * sizeof m);
            s->n_inflight--;
            return;
        }
    if (s->lost)
        return;
    fprintf(stderr, "fuzz-cache: op %llu: a forged move (session %u chunk %u layer %u %s -> %s) was accepted\n",
            (unsigned long long)s->op, m.session, m.chunk, m.layer, pv_tier_name(m.from), pv_tier_name(m.to));
    abort();
}

static const char *one_op(state *s, input *in)
{
    unsigned code = take(in);
    s->now += 0.5 * (code >> 5);
    pv_cache_plan_clear(&s->plan);
    const char *id;
    uint32_t chunk, layer, slot;
    pv_tier tier;
    unsigned lo;
    switch (code & 31u) {
    case 0:
        (void)pv_cache_session_open(s->cache, take_id(in));
        return "open";
    case 1: {
        uint64_t freed;
        (void)pv_cache_end_session(s->cache, take_id(in), take(in) % 2 ? &freed : NULL);
        return "end_session";
    }
    case 2: {
        id = take_id(in);
        int32_t tokens[16];
        size_t n = take(in) % 17;
        for (size_t i = 0; i < n; i++)
            tokens[i] = (int32_t)take(in) - 8;
        (void)pv_cache_append_tokens(s->cache, id, tokens, n);
        return "append_tokens";
    }
    case 3:
        (void)pv_cache_touch(s->cache, take_id(in));
        return "touch";
    case 4:
        (void)pv_cache_pin(s->cache, take_id(in));
        return "pin";
    case 5:
        (void)pv_cache_unpin(s->cache, take_id(in));
        return "unpin";
    case 6:
        id = take_id(in);
        lo = take(in);
        (void)pv_cache_session_save(s->cache, id, lo | take(in) << 8);
        return "session_save";
    case 7: {
        pv_session_view view;
        (void)pv_cache_session_restore(s->cache, take_id(in), &view);
        return "session_restore";
    }
    case 8: {
        uint64_t dev, host;
        (void)pv_cache_held_bytes(s->cache, take_id(in), &dev, &host);
        return "held_bytes";
    }
    case 9:
    case 10:
    case 11: /* stores are most of an engine's calls */
        id = take_id(in);
        chunk = take_chunk(in);
        layer = take(in) % (s->n_layers + 1);
        tier = (pv_tier)(take(in) % 4);
        (void)pv_cache_store_chunk(s->cache, id, chunk, layer, tier, &slot);
        return "store_chunk";
    case 12:
        id = take_id(in);
        chunk = take_chunk(in);
        layer = take(in) % (s->n_layers + 1);
        (void)pv_cache_lookup(s->cache, id, chunk, layer, &tier, &slot);
        return "lookup";
    case 13: {
        double v;
        id = take_id(in);
        chunk = take_chunk(in);
        layer = take(in) % (s->n_layers + 1);
        (void)pv_cache_retention_value(s->cache, id, chunk, layer, &v);
        return "retention_value";
    }
    case 14:
    case 15:
        tier = (pv_tier)(take(in) % 4);
        if (pv_cache_evict_to_free(s->cache, tier, (uint64_t)take(in) * (SLOT_BYTES / 2), &s->plan) == PV_OK)
            keep_two_phase(s);
        return "evict_to_free";
    case 16:
        if (pv_cache_plan_swap_out(s->cache, take(in) % 8, &s->plan) == PV_OK)
            keep_two_phase(s);
        return "plan_swap_out";
    case 17:
        if (pv_cache_plan_swap_in(s->cache, take_id(in), &s->plan) == PV_OK)
            keep_two_phase(s);
        return "plan_swap_in";
    case 18:
    case 19:
        finish(s, in, (code & 31u) == 18);
        return "complete/abort";
    case 20:
        forged(s, in);
        return "forged complete/abort";
    case 21: {
        pv_cache_admission adm;
        (void)pv_cache_admit(s->cache, take(in) % 32, &adm);
        return "admit";
    }
    case 22: {
        const char *victim;
        (void)pv_cache_choose_suspend(s->cache, &victim);
        return "choose_suspend";
    }
    case 23:
        /* One byte of cut: histories grow by at most 16 tokens an op, so
         * cuts inside, at and past their end all come up. */
        id = take_id(in);
        (void)pv_cache_session_truncate(s->cache, id, take(in));
        return "session_truncate";
    default: {
        pv_cache_stats stats;
        pv_cache_stats_get(s->cache, &stats);
        (void)pv_cache_session_name(s->cache, take(in));
        return "stats";
    }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input in = {data, size};
    memset(long_id, 'x', sizeof long_id - 1);
    static state s;
    memset(&s, 0, sizeof s);
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.policy = (pv_policy)(take(&in) % 3);
    cfg.n_layers = s.n_layers = 1 + take(&in) % 4;
    cfg.chunk_tokens = 1 + take(&in) % 64;
    cfg.slot_bytes = SLOT_BYTES;
    cfg.device_bytes = (uint64_t)(1 + take(&in) % 16) * SLOT_BYTES;
    cfg.host_bytes = (uint64_t)(take(&in) % 17) * SLOT_BYTES;
    cfg.high_water = (take(&in) % 11) / 10.0;
    cfg.reserve = (take(&in) % 6) / 10.0;
    if (pv_cache_init(&s.cache, &cfg, read_clock, &s) != PV_OK)
        return 0;
    pv_cache_plan_init(&s.plan);
    check(&s, "init");
    while (in.left > 0) {
        s.op++;
        check(&s, one_op(&s, &in));
    }
    pv_cache_plan_free(&s.plan);
    pv_cache_free(s.cache);
    return 0;
}
