/* Shared prefixes (issue 28): a randomized property test over sessions in
 * two namespaces whose histories start with a few common prefixes and
 * diverge, with turns (share, recompute, store, save), returns after swaps
 * and drops, evictions, ahead-of-time copies completed or abandoned,
 * truncations, ends and pins held across operations. After EVERY operation
 * pv_cache_check() must pass (reference counts, links, the share map) and:
 *   - sharing equals a brute-force model: a session's first turn shares
 *     exactly the longest run of full chunks from position 0 that some
 *     other live session of its namespace has published with the same
 *     tokens (the model keeps each session's published count by its own
 *     rule, never reading the cache's);
 *   - a pinned session's chunks, shared ones included, never move;
 *   - bytes: device + host bytes held are the sessions' own plus one copy
 *     of each shared chunk (counted from the views), and the cache's saved
 *     bytes are what one copy per session would add.
 *
 * Usage: test-cache-share [seed [ops]]; the seed is printed first. */
#include "test-cache-util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

enum {
    NAMES = 24,        /* a:s00..a:s11 and b:s00..b:s11 */
    CT = 4,            /* tokens per chunk */
    LAYERS = 2,
    FAMILIES = 4,      /* common prefixes per namespace (the same in both) */
    FAMILY_CHUNKS = 6,
    MAX_TOKENS = 40,
    DEVICE_SLOTS = 40,
    HOST_SLOTS = 24,
};

typedef struct model_session {
    int live, pinned;
    int32_t tokens[MAX_TOKENS];
    uint32_t n_tokens;
    uint32_t shared;    /* chunks linked */
    uint32_t published; /* chunks findable, by the model's own rule */
} model_session;

static model_session model[NAMES];
static int32_t family[FAMILIES][FAMILY_CHUNKS * CT];
static test_clock clk;
static pv_cache *cache;
static uint64_t op;
static int failed;

static void name_of(int i, char *buf)
{
    snprintf(buf, 16, "%c:s%02d", i < NAMES / 2 ? 'a' : 'b', i % (NAMES / 2));
}

static int same_ns(int i, int j)
{
    return (i < NAMES / 2) == (j < NAMES / 2);
}

static int fail(const char *what)
{
    if (!failed)
        tap_diag("op %" PRIu64 ": %s (%s)", op, what, pv_last_error());
    failed = 1;
    return 0;
}

/* Some other live session of i's namespace published chunk c with the
 * same tokens through it (tokens t). */
static int findable(int i, const int32_t *t, uint32_t c)
{
    for (int j = 0; j < NAMES; j++)
        if (j != i && model[j].live && same_ns(i, j) && model[j].published > c &&
            memcmp(model[j].tokens, t, (size_t)(c + 1) * CT * sizeof *t) == 0)
            return 1;
    return 0;
}

/* The model's publication at a save: committed full chunks, stopping at
 * one another session published first. */
static void model_publish(int i)
{
    model_session *m = &model[i];
    while ((m->published + 1) * CT <= m->n_tokens && !findable(i, m->tokens, m->published))
        m->published++;
}

/* Evicts until `slots` DEVICE slots are free; 0 when it cannot. */
static int make_room(uint32_t slots)
{
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_status st = pv_cache_evict_to_free(cache, PV_TIER_DEVICE, (uint64_t)slots * TEST_SLOT_BYTES, &plan);
    pv_cache_plan_free(&plan);
    return st == PV_OK;
}

/* Stores every layer of chunk c of session id on DEVICE. */
static int store_chunk(const char *id, uint32_t c)
{
    for (uint32_t l = 0; l < LAYERS; l++) {
        uint32_t slot;
        pv_status st = pv_cache_store_chunk(cache, id, c, l, PV_TIER_DEVICE, &slot);
        if (st == PV_ERR_OUT_OF_MEMORY && make_room(1))
            st = pv_cache_store_chunk(cache, id, c, l, PV_TIER_DEVICE, &slot);
        if (st != PV_OK)
            return 0;
    }
    return 1;
}

/* A turn as the engine runs it: pin, share, bring the history to DEVICE
 * (swap-in, recomputation), store the new chunks, save, unpin. Returns 0
 * on a failure of the cache (a full device ends the session instead). */
static int turn(int i, const int32_t *more, uint32_t n_more)
{
    char id[16];
    name_of(i, id);
    model_session *m = &model[i];
    if (m->n_tokens + n_more > MAX_TOKENS)
        n_more = MAX_TOKENS - m->n_tokens;
    if (!m->live) {
        if (pv_cache_session_open(cache, id) != PV_OK)
            return fail("open");
        m->live = 1;
        m->n_tokens = m->shared = m->published = 0;
    }
    if (pv_cache_pin(cache, id) != PV_OK)
        return fail("pin");
    /* The expected sharing, by brute force over the other sessions. */
    int32_t all[MAX_TOKENS];
    memcpy(all, m->tokens, m->n_tokens * sizeof *all);
    memcpy(all + m->n_tokens, more, n_more * sizeof *all);
    uint32_t total = m->n_tokens + n_more, stored_chunks = (m->n_tokens + CT - 1) / CT;
    uint32_t expect = m->shared;
    while (expect >= stored_chunks && (expect + 1) * CT < total && findable(i, all, expect))
        expect++;
    uint32_t shared_tokens;
    if (pv_cache_share_prefix(cache, id, m->tokens, m->n_tokens, more, n_more, &shared_tokens) != PV_OK)
        return fail("share_prefix");
    if (shared_tokens != expect * CT) {
        tap_diag("%s shares %u tokens, the model %u", id, shared_tokens, expect * CT);
        return fail("sharing differs from the model");
    }
    /* A chunk only its first session had becomes shared by both. */
    for (uint32_t c = m->shared; c < expect; c++)
        for (int j = 0; j < NAMES; j++)
            if (j != i && model[j].live && same_ns(i, j) && model[j].published > c && model[j].shared == c &&
                memcmp(model[j].tokens, all, (size_t)(c + 1) * CT * sizeof *all) == 0)
                model[j].shared = c + 1;
    if (expect > m->shared)
        m->published = expect;
    m->shared = expect;
    uint32_t have = m->n_tokens > expect * CT ? m->n_tokens : expect * CT;
    memcpy(m->tokens, all, total * sizeof *all);
    m->n_tokens = have;
    pv_session_view v;
    if (pv_cache_session_restore(cache, id, &v) != PV_OK || v.n_tokens != have)
        return fail("restore after sharing");
    if (v.shared_busy)
        return fail("a shared chunk is busy with no copy in flight");
    /* Swap-in of HOST chunks, then recomputation of the dropped prefix. */
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_status st = pv_cache_plan_swap_in(cache, id, &plan);
    int ok_turn = st == PV_OK;
    if (ok_turn) {
        size_t n = 0;
        for (size_t k = 0; k < plan.n_moves; k++)
            if (plan.moves[k].two_phase)
                plan.moves[n++] = plan.moves[k];
        ok_turn = pv_cache_complete(cache, plan.moves, n) == PV_OK;
        if (!ok_turn)
            return fail("complete swap-in");
    }
    pv_cache_plan_free(&plan);
    uint32_t rc = ok_turn ? (v.recompute_tokens + CT - 1) / CT : 0;
    for (uint32_t c = 0; c < rc && ok_turn; c++)
        ok_turn = store_chunk(id, c);
    if (ok_turn && pv_cache_share_filled(cache, id, v.recompute_tokens) != PV_OK)
        return fail("share_filled");
    /* The turn's own tokens. */
    if (ok_turn && total > have &&
        pv_cache_append_tokens(cache, id, all + have, total - have) != PV_OK)
        return fail("append");
    for (uint32_t c = have / CT; ok_turn && c < (total + CT - 1) / CT; c++)
        ok_turn = store_chunk(id, c);
    if (!ok_turn) {
        /* No room: the engine ends a session it cannot serve. */
        if (pv_cache_unpin(cache, id) != PV_OK || pv_cache_end_session(cache, id, NULL) != PV_OK)
            return fail("end after a full device");
        m->live = 0;
        return 1;
    }
    m->n_tokens = total;
    if (pv_cache_session_save(cache, id, total) != PV_OK || pv_cache_unpin(cache, id) != PV_OK)
        return fail("save/unpin");
    model_publish(i);
    /* Every chunk of the session reads on DEVICE after its turn. */
    for (uint32_t c = 0; c < (total + CT - 1) / CT; c++)
        for (uint32_t l = 0; l < LAYERS; l++) {
            pv_tier t;
            uint32_t slot, shadow;
            if (pv_cache_peek(cache, id, c, l, &t, &slot, &shadow) != PV_OK ||
                !(t == PV_TIER_DEVICE || shadow != UINT32_MAX))
                return fail("a chunk of a finished turn is not on device");
        }
    return 1;
}

/* Tokens of a new conversation: a family's prefix up to a random chunk,
 * then its own. Families 1 and 3 differ from 0 and 2 in chunk 0 only, so
 * a match that ignored the parent would share their later chunks. */
static uint32_t new_tokens(int32_t *t)
{
    int f = (int)pick(FAMILIES);
    uint32_t keep = pick(FAMILY_CHUNKS * CT + 1), n = 1 + pick(MAX_TOKENS);
    for (uint32_t k = 0; k < n; k++)
        t[k] = k < keep ? family[f][k] : (int32_t)(1000 + pick(50000));
    return n;
}

/* Where a pinned session's chunks read: 0 DEVICE (at slot), 1 HOST, 2
 * DROPPED. Moving up (a swap-in, a recomputation by another session) is
 * allowed; down, or to another DEVICE slot, is an eviction. */
typedef struct pinned_where {
    int rank[MAX_TOKENS / CT + 1][LAYERS];
    uint32_t slot[MAX_TOKENS / CT + 1][LAYERS];
} pinned_where;

static void where(const char *id, uint32_t n_tokens, pinned_where *w)
{
    memset(w, 0, sizeof *w);
    for (uint32_t c = 0; c < (n_tokens + CT - 1) / CT; c++)
        for (uint32_t l = 0; l < LAYERS; l++) {
            pv_tier t;
            uint32_t slot, shadow;
            pv_cache_peek(cache, id, c, l, &t, &slot, &shadow);
            w->rank[c][l] = t == PV_TIER_DEVICE || shadow != UINT32_MAX ? 0 : t == PV_TIER_HOST ? 1 : 2;
            w->slot[c][l] = t == PV_TIER_DEVICE ? slot : shadow;
        }
}

static int moved_down(const pinned_where *before, const pinned_where *after)
{
    for (uint32_t c = 0; c < MAX_TOKENS / CT + 1; c++)
        for (uint32_t l = 0; l < LAYERS; l++)
            if (after->rank[c][l] > before->rank[c][l] ||
                (before->rank[c][l] == 0 && after->slot[c][l] != before->slot[c][l])) {
                tap_diag("chunk %u layer %u: rank %d slot %u -> rank %d slot %u", c, l, before->rank[c][l],
                         before->slot[c][l], after->rank[c][l], after->slot[c][l]);
                return 1;
            }
    return 0;
}

/* Device + host bytes: the sessions' own, and each holder once. */
static int bytes_ok(void)
{
    pv_cache_stats cs;
    pv_cache_stats_get(cache, &cs);
    uint64_t own = 0, links = 0;
    for (int i = 0; i < NAMES; i++) {
        if (!model[i].live)
            continue;
        char id[16];
        name_of(i, id);
        pv_session_view v;
        pv_cache_session_restore(cache, id, &v);
        own += v.held_bytes[0] + v.held_bytes[1];
        links += v.shared_chunks;
        if (v.shared_chunks != model[i].shared) {
            tap_diag("%s shares %u chunks, the model %u", id, v.shared_chunks, model[i].shared);
            return fail("a session's shared chunks differ from the model");
        }
    }
    if (links != cs.shared_links)
        return fail("links differ from the sessions' shared chunks");
    /* What is not the sessions' own is the holders': one copy each. */
    uint64_t used = cs.used_bytes[0] + cs.used_bytes[1];
    if (used < own || (cs.shared_chunks == 0 && used != own))
        return fail("bytes held exceed the sessions' own with no shared chunk");
    return 1;
}

/* One session's first chunk stored and saved; a second session's first
 * turn with the same tokens: shared tokens. */
static uint32_t shares_with(pv_cache *c, const char *first, const char *second)
{
    const int32_t t[2 * CT + 1] = {5, 6, 7, 8, 9, 10, 11, 12, 13};
    uint32_t shared = 0;
    if (pv_cache_session_open(c, first) != PV_OK ||
        pv_cache_share_prefix(c, first, NULL, 0, t, 2 * CT + 1, &shared) != PV_OK || shared)
        return UINT32_MAX;
    for (uint32_t k = 0; k < 2; k++)
        for (uint32_t l = 0; l < LAYERS; l++)
            if (pv_cache_store_chunk(c, first, k, l, PV_TIER_DEVICE, NULL) != PV_OK)
                return UINT32_MAX;
    if (pv_cache_append_tokens(c, first, t, 2 * CT + 1) != PV_OK ||
        pv_cache_session_save(c, first, 2 * CT + 1) != PV_OK || pv_cache_session_open(c, second) != PV_OK ||
        pv_cache_share_prefix(c, second, NULL, 0, t, 2 * CT + 1, &shared) != PV_OK)
        return UINT32_MAX;
    pv_cache_end_session(c, first, NULL);
    pv_cache_end_session(c, second, NULL);
    return shared;
}

/* A namespace is the bytes before an id's first ':', empty without one. */
static void namespaces(void)
{
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.n_layers = LAYERS;
    cfg.chunk_tokens = CT;
    cfg.slot_bytes = TEST_SLOT_BYTES;
    cfg.device_bytes = 64 * TEST_SLOT_BYTES;
    cfg.host_bytes = 0;
    cfg.share_prefixes = 1;
    pv_cache *c = NULL;
    if (pv_cache_init(&c, &cfg, test_clock_read, &clk) != PV_OK) {
        ok(0, "namespaces: cache");
        return;
    }
    uint32_t plain = shares_with(c, "x", "y"), same = shares_with(c, "k:x", "k:y:z"),
             other = shares_with(c, "k:x", "q:x"), mixed = shares_with(c, "x", "k:y"),
             prefix = shares_with(c, "k:x", "kk:x");
    ok(plain == 2 * CT && same == 2 * CT && other == 0 && mixed == 0 && prefix == 0,
       "namespaces: ids without ':' share (%u tokens), k:x and k:y:z share (%u), k:x and q:x do not (%u), "
       "x and k:y do not (%u), k:x and kk:x do not (%u)",
       plain, same, other, mixed, prefix);
    check_ok(c, "after the namespace cases");
    pv_cache_free(c);
}

int main(int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0x5eed28;
    uint64_t ops = argc > 2 ? strtoull(argv[2], NULL, 0) : 20000;
    printf("# seed %" PRIu64 ", %" PRIu64 " operations\n", seed, ops);
    rng_state = seed | 1;
    for (int f = 0; f < FAMILIES; f++)
        for (int k = 0; k < FAMILY_CHUNKS * CT; k++)
            family[f][k] = (f & 1) && k < CT ? 900 + k : 100 + 10 * (f >> 1) + k;
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.n_layers = LAYERS;
    cfg.chunk_tokens = CT;
    cfg.slot_bytes = TEST_SLOT_BYTES;
    cfg.device_bytes = (uint64_t)DEVICE_SLOTS * TEST_SLOT_BYTES;
    cfg.host_bytes = (uint64_t)HOST_SLOTS * TEST_SLOT_BYTES;
    cfg.reserve = 0;
    cfg.share_prefixes = 1;
    if (pv_cache_init(&cache, &cfg, test_clock_read, &clk) != PV_OK)
        return tap_skip_all("pv_cache_init failed");
    uint64_t counts[8] = {0};
    uint64_t max_links = 0, saved_seen = 0;
    for (op = 0; op < ops && !failed; op++) {
        clk.now += 0.001 * (1 + pick(100));
        int i = (int)pick(NAMES);
        char id[16];
        name_of(i, id);
        model_session *m = &model[i];
        /* Pinned sessions (running requests) must not move. */
        pinned_where before[NAMES];
        int was_pinned[NAMES];
        for (int j = 0; j < NAMES; j++)
            if ((was_pinned[j] = model[j].live && model[j].pinned)) {
                char jd[16];
                name_of(j, jd);
                where(jd, model[j].n_tokens, &before[j]);
            }
        uint32_t kind = pick(100);
        if (kind < 30 && !m->pinned) {
            int32_t t[MAX_TOKENS];
            uint32_t n = m->live ? 1 + pick(8) : new_tokens(t);
            if (m->live)
                for (uint32_t k = 0; k < n; k++)
                    t[k] = (int32_t)(1000 + pick(50000));
            counts[0]++;
            turn(i, t, n);
        } else if (kind < 45) {
            pv_cache_plan plan;
            pv_cache_plan_init(&plan);
            pv_tier tier = pick(3) ? PV_TIER_DEVICE : PV_TIER_HOST;
            uint32_t slots = 1 + pick(tier == PV_TIER_DEVICE ? DEVICE_SLOTS / 2 : HOST_SLOTS / 2);
            pv_status st = pv_cache_evict_to_free(cache, tier, (uint64_t)slots * TEST_SLOT_BYTES, &plan);
            if (st != PV_OK && st != PV_ERR_OUT_OF_MEMORY && st != PV_ERR_INVALID_ARG)
                fail("evict_to_free");
            counts[1]++;
            pv_cache_plan_free(&plan);
        } else if (kind < 55) {
            pv_cache_plan plan;
            pv_cache_plan_init(&plan);
            if (pv_cache_plan_swap_out(cache, 1 + pick(8), &plan) != PV_OK)
                fail("plan_swap_out");
            size_t n = 0;
            for (size_t k = 0; k < plan.n_moves; k++)
                if (plan.moves[k].two_phase)
                    plan.moves[n++] = plan.moves[k];
            /* Some copies land after their session ended. */
            if (n && pick(3) == 0) {
                int j = (int)pick(NAMES);
                char jd[16];
                name_of(j, jd);
                if (model[j].live && !model[j].pinned) {
                    pv_status st = pv_cache_end_session(cache, jd, NULL);
                    if (st == PV_OK)
                        model[j].live = 0;
                    else if (st != PV_ERR_BUSY)
                        fail("end during a copy");
                }
            }
            if ((pick(2) ? pv_cache_complete(cache, plan.moves, n) : pv_cache_abort(cache, plan.moves, n)) != PV_OK)
                fail("complete/abort");
            counts[2]++;
            pv_cache_plan_free(&plan);
        } else if (kind < 65 && m->live && !m->pinned) {
            uint32_t keep = pick(m->n_tokens + 1);
            if (pv_cache_session_truncate(cache, id, keep) != PV_OK)
                fail("truncate");
            if (keep < m->n_tokens) {
                m->n_tokens = keep;
                if (m->shared > keep / CT)
                    m->shared = keep / CT;
                if (m->published > keep / CT)
                    m->published = keep / CT;
            }
            counts[3]++;
        } else if (kind < 75 && m->live && !m->pinned) {
            if (pv_cache_end_session(cache, id, NULL) != PV_OK)
                fail("end");
            m->live = 0;
            counts[4]++;
        } else if (kind < 85 && m->live) {
            if ((m->pinned ? pv_cache_unpin(cache, id) : pv_cache_pin(cache, id)) != PV_OK)
                fail("pin/unpin");
            m->pinned = !m->pinned;
            counts[5]++;
        } else if (m->live) {
            if (pv_cache_touch(cache, id) != PV_OK)
                fail("touch");
            counts[6]++;
        }
        for (int j = 0; j < NAMES && !failed; j++)
            if (was_pinned[j] && model[j].live && model[j].pinned) {
                char jd[16];
                name_of(j, jd);
                pinned_where after;
                where(jd, model[j].n_tokens, &after);
                if (moved_down(&before[j], &after))
                    fail("a pinned session's chunk moved down");
            }
        if (!failed && pv_cache_check(cache) != PV_OK)
            fail("pv_cache_check");
        if (!failed)
            bytes_ok();
        pv_cache_stats cs;
        pv_cache_stats_get(cache, &cs);
        if (cs.shared_links > max_links)
            max_links = cs.shared_links;
        saved_seen += cs.shared_saved_bytes[0] + cs.shared_saved_bytes[1] > 0;
    }
    ok(!failed, "%" PRIu64 " operations: invariants, the sharing model and pinned chunks hold after each "
       "(turns %" PRIu64 ", evictions %" PRIu64 ", copies %" PRIu64 ", truncations %" PRIu64 ", ends %" PRIu64
       ", pins %" PRIu64 ")",
       op, counts[0], counts[1], counts[2], counts[3], counts[4], counts[5]);
    ok(max_links >= 8 && saved_seen > ops / 4, "sharing happened: up to %" PRIu64 " links, bytes saved after %"
       PRIu64 " operations", max_links, saved_seen);
    /* Everything ends: no holder, entry or byte stays behind. */
    for (int i = 0; i < NAMES; i++) {
        char id[16];
        name_of(i, id);
        if (model[i].live && model[i].pinned)
            pv_cache_unpin(cache, id);
        if (model[i].live)
            pv_cache_end_session(cache, id, NULL);
    }
    pv_cache_stats cs;
    pv_cache_stats_get(cache, &cs);
    ok(cs.shared_chunks == 0 && cs.shared_links == 0 && cs.used_bytes[0] == 0 && cs.used_bytes[1] == 0,
       "every session ended: %" PRIu64 " holders, %" PRIu64 " links, %" PRIu64 " + %" PRIu64 " bytes left",
       cs.shared_chunks, cs.shared_links, cs.used_bytes[0], cs.used_bytes[1]);
    check_ok(cache, "after every session ended");
    pv_cache_free(cache);
    namespaces();
    return tap_done();
}
