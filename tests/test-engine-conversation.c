/* Whole-conversation turns, cancellation, NULL sessions and the engine on a
 * thread of its own, on the synthetic model (cpu backend).
 *
 * The oracle throughout is a fresh answer: the same conversation run from
 * scratch, as one turn of a new session, on a stateless engine. Whatever a
 * stateful engine keeps, truncates, swaps, drops, recovers or cancels, its
 * next answer must be that one exactly; and its accounting (context kept,
 * where it came from) must say it reused what it could. pv_engine_check()
 * runs after every step. The loop's idle checks sleep about 7 s in all. */
#include "engine-util.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

/* Odd: a chunk whose layers sit in different tiers is counted per layer and
 * rounded; with an odd layer count the device and host shares still add up
 * to the context exactly. */
#define LAYERS 3
#define CHUNK 16
#define N_CTX 512
#define MAX_CONV (N_CTX + 8)

static eu_model M;
static uint64_t SLOT;       /* bytes of one (chunk, layer) slot */
static pv_engine *REF;      /* stateless, roomy: fresh answers */
static int exploring;       /* PV_CONV_SEED given: coverage counts are reported, not required */

/* ---- invariant bookkeeping -------------------------------------------------------- */

static int bad_checks;
static char first_bad[512];

static void note_bad(const char *fmt, ...)
{
    if (bad_checks++)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(first_bad, sizeof first_bad, fmt, ap);
    va_end(ap);
}

static void check_engine(pv_engine *e, const char *when)
{
    if (pv_engine_check(e) != PV_OK)
        note_bad("%s: %s", when, pv_last_error());
}

/* Reports and resets the count of failed pv_engine_check()s. */
static void report_checks(const char *what)
{
    ok(bad_checks == 0, "%s: pv_engine_check passes after every step (%d failed%s%s)", what, bad_checks,
       bad_checks ? "; first: " : "", first_bad);
    bad_checks = 0;
    first_bad[0] = '\0';
}

/* Steps until nothing is pending, checking the invariants after each. */
static pv_status drive(pv_engine *e)
{
    while (pv_engine_pending(e) > 0) {
        int worked = 0;
        pv_status st = pv_engine_step(e, &worked);
        if (st != PV_OK)
            return st;
        if (!worked)
            return pv_error(PV_ERR_STATE, "%zu turns pending, no progress", pv_engine_pending(e));
        check_engine(e, "after a step");
    }
    return PV_OK;
}

/* ---- engines, conversations, answers ------------------------------------------------ */

static pv_engine *new_engine(pv_engine_mode mode, uint64_t device_slots, uint64_t host_slots,
                             int32_t token_budget, int32_t max_running)
{
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = device_slots * SLOT;
    cc.host_bytes = host_slots * SLOT;
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    ec.mode = mode;
    ec.token_budget = token_budget;
    ec.max_running = max_running;
    ec.swap_out_chunks = 4;
    pv_engine *e = NULL;
    if (pv_engine_init(&e, M.be, M.model, &M.tok, &cc, &ec) != PV_OK) {
        ok(0, "engine init (%s, %" PRIu64 " device, %" PRIu64 " host slots): %s", pv_engine_mode_name(mode),
           device_slots, host_slots, pv_last_error());
        return NULL;
    }
    return e;
}

typedef struct conv {
    int32_t v[MAX_CONV];
    int n;
} conv;

static uint64_t rng_state = 0x5eed;

static uint32_t rnd(uint32_t n)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((rng_state >> 33) % n);
}

/* An ordinary token (past the specials). */
static int32_t any_token(void)
{
    return 3 + (int32_t)rnd(M.tok.n_vocab - 3);
}

/* An ordinary token other than `not`. */
static int32_t other_token(int32_t not)
{
    int32_t t;
    do
        t = any_token();
    while (t == not);
    return t;
}

static void conv_add_random(conv *c, int n)
{
    for (int i = 0; i < n && c->n < MAX_CONV; i++)
        c->v[c->n++] = any_token();
}

static void conv_add(conv *c, const int32_t *t, int n)
{
    for (int i = 0; i < n && c->n < MAX_CONV; i++)
        c->v[c->n++] = t[i];
}

/* Greedy (the task's default) or sampled at temperature 1 with a seed: a
 * sampled answer moves with any change in the logits, a greedy one only
 * when the argmax does. */
static pv_sampling sampling(int max_tokens, uint64_t seed)
{
    pv_sampling s;
    pv_sampling_defaults(&s);
    s.max_tokens = max_tokens;
    s.ignore_eos = 1;
    if (seed) {
        s.temperature = 1.0f;
        s.top_p = 0.95f;
        s.seed = seed;
    }
    return s;
}

static pv_status submit(pv_engine *e, const char *sid, const conv *c, int whole, const pv_sampling *s,
                        eu_result *out, uint64_t *id)
{
    memset(out, 0, sizeof *out);
    pv_turn t = {.tokens = c->v, .n_tokens = (size_t)c->n, .sampling = *s, .whole_conversation = whole};
    pv_turn_callbacks cb = {eu_on_token, eu_on_done, out};
    return pv_engine_submit(e, sid, &t, &cb, id);
}

/* One turn run to its end. */
static pv_status turn(pv_engine *e, const char *sid, const conv *c, int whole, const pv_sampling *s,
                      eu_result *out)
{
    pv_status st = submit(e, sid, c, whole, s, out, NULL);
    return st == PV_OK ? drive(e) : st;
}

/* The fresh answer: the conversation as the first turn of a new session on
 * the stateless engine. */
static void fresh(const conv *c, const pv_sampling *s, eu_result *out)
{
    pv_status st = turn(REF, "fresh", c, 0, s, out);
    if (st == PV_OK)
        st = pv_engine_end_session(REF, "fresh");
    if (st != PV_OK || out->done != 1 || out->status != PV_OK) {
        out->n = -1; /* matches nothing */
        tap_diag("fresh answer failed: %s", pv_last_error());
    }
}

static int same(const eu_result *a, const eu_result *b)
{
    return a->done == 1 && b->done == 1 && a->status == PV_OK && b->status == PV_OK && a->n == b->n &&
           memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n) == 0;
}

/* The conversation as the client sees it after an answer: its input, then
 * what was streamed. */
static void conv_answered(conv *c, const eu_result *r)
{
    conv_add(c, r->tokens, r->n);
}

static size_t session_tokens(pv_engine *e, const char *sid)
{
    size_t n = 0;
    if (pv_engine_session_tokens(e, sid, &n) != PV_OK)
        return (size_t)-1;
    return n;
}

static uint64_t all_records(pv_engine *e)
{
    pv_cache_stats cs;
    pv_cache_stats_get(pv_engine_cache(e), &cs);
    return cs.records[0] + cs.records[1] + cs.records[2];
}

static uint32_t chunks_of(uint64_t tokens)
{
    return (uint32_t)((tokens + CHUNK - 1) / CHUNK);
}

static int lcp(const conv *a, const conv *b)
{
    int p = 0;
    while (p < a->n && p < b->n && a->v[p] == b->v[p])
        p++;
    return p;
}

/* ---- 1. whole conversations --------------------------------------------------------- */

/* What a whole-conversation turn keeps: the common prefix of the new
 * conversation and what the session knows (its history, whose KV is
 * computed, then the last answer's final token, sampled but not yet run),
 * short of the conversation's last token, and never more than the
 * history. */
static uint32_t expected_context(const conv *next, const conv *known)
{
    int p = lcp(next, known);
    if (p > next->n - 1)
        p = next->n - 1;
    if (p > known->n - 1)
        p = known->n - 1; /* the last known token is pending, not history */
    return p < 0 ? 0 : (uint32_t)p;
}

typedef struct step_case {
    const char *what;
    int keep;          /* tokens of the known conversation kept; -1: resubmit the last input */
    int add;           /* new tokens after them (the first differs from the known one) */
} step_case;

static void extend_and_diverge(void)
{
    pv_engine *e = new_engine(PV_MODE_PENSIEVE, 512, 64, 48, 4);
    if (!e)
        return;
    const char *sid = "conv";
    conv known = {.n = 0}, input = {.n = 0};
    conv_add_random(&input, 21);
    /* Greedy turns, then sampled ones: the checks hold for both. */
    for (int pass = 0; pass < 2; pass++) {
        uint64_t seed = pass ? 77 : 0;
        static const step_case cases[] = {
            {"the first turn", 0, 0},
            {"an extension (previous answer + new tokens)", -2, 9},
            {"an extension", -2, 14},
            {"a divergence inside a chunk", 37, 8},
            {"a divergence at a chunk boundary", 2 * CHUNK, 5},
            {"a divergence at the pending (last answered) token", -3, 6},
            {"the same conversation resubmitted unchanged", -1, 0},
            {"a shorter conversation (a strict prefix)", 20, 0},
            {"a divergence at token 0 (another conversation)", 0, 30},
            {"an extension after the divergences", -2, 3},
            {"a one-token conversation (its first token again)", 1, 0},
            {"a divergence one token into the conversation", 1, 4},
        };
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            const step_case *sc = &cases[k];
            conv next = {.n = 0};
            if (k == 0) {
                next = input;
                if (pass)
                    next.v[0] = other_token(next.v[0]); /* not the greedy pass's session */
            } else if (sc->keep == -1) {
                next = input;
            } else if (sc->keep == -2) {
                next = known;
                conv_add_random(&next, sc->add);
            } else {
                /* -3: keep all but the last answered token, which is
                 * replaced; otherwise keep `keep`, then a different token. */
                int keep = sc->keep == -3 ? known.n - 1 : sc->keep;
                conv_add(&next, known.v, keep);
                if (sc->add > 0) {
                    next.v[next.n] = other_token(keep < known.n ? known.v[keep] : -1);
                    next.n++;
                    conv_add_random(&next, sc->add - 1);
                }
            }
            pv_sampling s = sampling(6 + (int)k % 3, seed ? seed + k : 0);
            uint32_t want_ctx = k == 0 ? 0 : expected_context(&next, &known);
            pv_engine_stats before, after;
            pv_engine_stats_get(e, &before);
            eu_result got, ref;
            pv_status st = turn(e, sid, &next, 1, &s, &got);
            pv_engine_stats_get(e, &after);
            fresh(&next, &s, &ref);
            /* And the same conversation as a NULL-session turn here. */
            eu_result alone;
            pv_status st2 = turn(e, NULL, &next, 0, &s, &alone);
            const pv_turn_result *r = &got.res;
            const char *mode = pass ? "sampled" : "greedy";
            ok(st == PV_OK && same(&got, &ref) && st2 == PV_OK && same(&alone, &ref),
               "%s, %s: the answer equals the fresh one and a NULL-session turn's (%d vs %d, %d tokens; %s)",
               sc->what, mode, got.n, ref.n, alone.n, st == PV_OK ? "ok" : pv_last_error());
            ok(r->context_tokens == want_ctx && r->new_tokens == (uint32_t)next.n - want_ctx,
               "%s, %s: context %u of %d tokens kept (want %u), %u new", sc->what, mode, r->context_tokens,
               next.n, want_ctx, r->new_tokens);
            /* Everything is on DEVICE in this roomy engine: all of the kept
             * context is read from there, and only the rest is run. */
            ok(r->reused_device == r->context_tokens && r->reused_host == 0 && r->recomputed == 0 &&
                   after.prefill_tokens - before.prefill_tokens == r->new_tokens,
               "%s, %s: the kept context is reused from device (%u device, %u host, %u recomputed), "
               "%" PRIu64 " tokens prefilled",
               sc->what, mode, r->reused_device, r->reused_host, r->recomputed,
               after.prefill_tokens - before.prefill_tokens);
            /* The history is the conversation and the answer but its final
             * token; the cache stores the chunks of that and nothing past. */
            size_t n_known = session_tokens(e, sid);
            uint64_t records = all_records(e);
            ok(n_known == (size_t)(next.n + got.n) && records == (uint64_t)chunks_of(n_known - 1) * LAYERS,
               "%s, %s: the session knows %zu tokens (want %d), the cache holds %" PRIu64
               " chunk records (want %u)",
               sc->what, mode, n_known, next.n + got.n, records, chunks_of(n_known - 1) * LAYERS);
            input = next;
            known = next;
            conv_answered(&known, &got);
        }
        pv_engine_end_session(e, sid);
    }
    report_checks("extend and diverge on a roomy engine");
    pv_engine_free(e);
}

/* ---- 1b. the property: divergence under pressure ------------------------------------ */

#define P_SESSIONS 4
#define P_ROUNDS 60
#define P_MAX_CONV 100

typedef struct psession {
    char id[8];
    conv known;   /* the conversation as its client sees it: input and answer */
    conv input;   /* the last turn's input */
    int started;
    int exact;    /* 0 after a cancel: how much ran is the engine's to know */
} psession;

/* The next conversation a client might send: the previous one extended, an
 * edit at a random point, a regenerated answer (the same input again), a
 * cut to a prefix, or a new conversation. */
static void next_conversation(const psession *p, conv *next)
{
    next->n = 0;
    uint32_t op = p->started ? rnd(10) : 9;
    if (p->started && p->known.n > P_MAX_CONV - 20)
        op = rnd(2) ? 9 : 3; /* room to grow again */
    if (op < 4) {                      /* extend */
        *next = p->known;
        conv_add_random(next, 1 + (int)rnd(20));
    } else if (op < 7) {               /* edit at a random point */
        int keep = (int)rnd((uint32_t)p->known.n);
        conv_add(next, p->known.v, keep);
        next->v[next->n++] = other_token(p->known.v[keep]);
        conv_add_random(next, (int)rnd(16));
    } else if (op == 7) {              /* regenerate */
        *next = p->input;
    } else if (op == 8) {              /* cut to a prefix */
        conv_add(next, p->known.v, 1 + (int)rnd((uint32_t)p->known.n));
    } else {                           /* another conversation */
        if (p->started) {
            next->v[next->n++] = other_token(p->known.v[0]);
            conv_add_random(next, 4 + (int)rnd(36));
        } else {
            conv_add_random(next, 5 + (int)rnd(36));
        }
    }
    if (next->n > P_MAX_CONV)
        next->n = P_MAX_CONV;
}

typedef struct cut_census {
    uint64_t cut_in[4];   /* the partly kept chunk at the cut, by tier (layer 0) */
    uint64_t freed[4];    /* (chunk, layer) records past the cut, by tier */
} cut_census;

/* Where the chunks a truncation touches are now: history of h tokens cut
 * to p. */
static void census(pv_engine *e, const char *sid, uint32_t h, uint32_t p, cut_census *c)
{
    pv_cache *cache = pv_engine_cache(e);
    pv_tier tier;
    if (p % CHUNK && pv_cache_peek(cache, sid, p / CHUNK, 0, &tier, NULL, NULL) == PV_OK)
        c->cut_in[tier]++;
    for (uint32_t ch = chunks_of(p); ch < chunks_of(h); ch++)
        for (uint32_t l = 0; l < LAYERS; l++)
            if (pv_cache_peek(cache, sid, ch, l, &tier, NULL, NULL) == PV_OK)
                c->freed[tier]++;
}

static void property(pv_engine_mode mode)
{
    /* 27 device slots hold one 9-chunk context (a 100-token conversation
     * and its answer need 7 chunks of 3 layers), 18 host slots 6 more
     * chunks: with up to three sessions in a batch, chunks are swapped out,
     * dropped and suspended, so cuts land in every tier (no host in
     * gpu-only mode). */
    pv_engine *e = new_engine(mode, 27, 18, 32, 3);
    if (!e)
        return;
    const char *mn = pv_engine_mode_name(mode);
    const int host = mode == PV_MODE_PENSIEVE;
    /* Coverage: the default seed's conversations reach every tier there is. */
    const int cover = !exploring;
    static psession ps[P_SESSIONS];
    for (int i = 0; i < P_SESSIONS; i++) {
        memset(&ps[i], 0, sizeof ps[i]);
        snprintf(ps[i].id, sizeof ps[i].id, "p%d", i);
    }
    cut_census cc = {{0}, {0}};
    int turns = 0, wrong = 0, ctx_wrong = 0, sum_wrong = 0, failed = 0, cancels = 0, cancel_wrong = 0;
    char why[256] = "";
    static eu_result res[P_SESSIONS], ref;
    for (int round = 0; round < P_ROUNDS; round++) {
        int order[P_SESSIONS], k = 1 + (int)rnd(3);
        for (int i = 0; i < P_SESSIONS; i++)
            order[i] = i;
        for (int i = P_SESSIONS - 1; i > 0; i--) {
            int j = (int)rnd((uint32_t)i + 1), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        static conv next[P_SESSIONS];
        pv_sampling smp[P_SESSIONS];
        uint32_t want[P_SESSIONS];
        uint64_t rid[P_SESSIONS];
        for (int q = 0; q < k; q++) {
            psession *p = &ps[order[q]];
            next_conversation(p, &next[q]);
            want[q] = p->started ? expected_context(&next[q], &p->known) : 0;
            if (p->started && p->exact && want[q] < (uint32_t)p->known.n - 1)
                census(e, p->id, (uint32_t)p->known.n - 1, want[q], &cc);
            turns++;
            smp[q] = sampling(3 + (int)rnd(8), turns % 4 == 0 ? 0 : (uint64_t)turns);
            if (submit(e, p->id, &next[q], 1, &smp[q], &res[q], &rid[q]) != PV_OK) {
                if (!failed++)
                    snprintf(why, sizeof why, "submit: %s", pv_last_error());
                res[q].done = -1;
            }
        }
        /* Now and then a turn is cancelled a few steps in: mid-recovery,
         * mid-prefill or mid-decode, whatever it is doing then. */
        int victim = rnd(6) == 0 ? 0 : -1, cancel_after = 1 + (int)rnd(6), steps = 0;
        while (pv_engine_pending(e) > 0) {
            int worked = 0;
            if (pv_engine_step(e, &worked) != PV_OK || !worked) {
                if (!failed++)
                    snprintf(why, sizeof why, "step: %s", worked ? pv_last_error() : "no progress");
                pv_engine_cancel_all(e);
                break;
            }
            check_engine(e, "property: after a step");
            if (++steps == cancel_after && victim >= 0 && res[victim].done == 0) {
                cancels++;
                if (pv_engine_cancel(e, rid[victim]) != PV_OK || res[victim].done != 1 ||
                    res[victim].res.finish != PV_FINISH_CANCELLED)
                    cancel_wrong++;
                check_engine(e, "property: after a cancel");
            }
        }
        for (int q = 0; q < k; q++) {
            psession *p = &ps[order[q]];
            eu_result *r = &res[q];
            if (r->done == -1)
                continue;
            int cancelled = r->done == 1 && r->res.finish == PV_FINISH_CANCELLED;
            if (!cancelled) {
                fresh(&next[q], &smp[q], &ref);
                if (!same(r, &ref) && !wrong++)
                    snprintf(why, sizeof why, "round %d session %s: %d tokens vs the fresh %d", round, p->id,
                             r->n, ref.n);
                if (p->exact && r->res.context_tokens != want[q])
                    ctx_wrong++;
                if (r->res.suspensions == 0 &&
                    r->res.reused_device + r->res.reused_host + r->res.recomputed != r->res.context_tokens)
                    sum_wrong++;
            }
            /* Cancelled or not, the session knows what its client saw. */
            if (session_tokens(e, p->id) != (size_t)(next[q].n + r->n))
                cancel_wrong += cancelled, ctx_wrong += !cancelled;
            p->input = next[q];
            p->known = next[q];
            conv_answered(&p->known, r);
            p->started = 1;
            p->exact = !cancelled;
        }
    }
    pv_engine_stats es;
    pv_engine_stats_get(e, &es);
    ok(failed == 0, "property, %s: %d turns over %d sessions submit and run (%s)", mn, turns, P_SESSIONS,
       failed ? why : "ok");
    ok(wrong == 0, "property, %s: every answer equals the fresh one (%d differ%s%s)", mn, wrong,
       wrong ? "; " : "", wrong ? why : "");
    ok(ctx_wrong == 0,
       "property, %s: context kept is the common prefix, and the session knows input + answer (%d wrong)", mn,
       ctx_wrong);
    ok(sum_wrong == 0,
       "property, %s: device + host + recomputed context adds up to the context kept (%d wrong)", mn,
       sum_wrong);
    ok((exploring || cancels > 0) && cancel_wrong == 0,
       "property, %s: %d turns cancelled a few steps in end cancelled, their sessions knowing what ran "
       "(%d wrong)", mn, cancels, cancel_wrong);
    if (mode != PV_MODE_STATELESS) {
        const uint64_t *cut = cc.cut_in, *freed = cc.freed;
        ok(!cover || (cut[PV_TIER_DEVICE] && !cut[PV_TIER_HOST] == !host && cut[PV_TIER_DROPPED]),
           "property, %s: cuts inside a chunk on device (%" PRIu64 "), on host (%" PRIu64
           ") and dropped (%" PRIu64 ")",
           mn, cut[PV_TIER_DEVICE], cut[PV_TIER_HOST], cut[PV_TIER_DROPPED]);
        ok(!cover || (freed[PV_TIER_DEVICE] && !freed[PV_TIER_HOST] == !host && freed[PV_TIER_DROPPED]),
           "property, %s: chunks past a cut freed on device (%" PRIu64 "), on host (%" PRIu64
           ") and dropped (%" PRIu64 ")",
           mn, freed[PV_TIER_DEVICE], freed[PV_TIER_HOST], freed[PV_TIER_DROPPED]);
        ok(!cover || (!es.swap_in_chunks == !host && es.dropped_chunks > 0 && es.recomputed_tokens > 0 &&
                         es.suspensions > 0),
           "property, %s: the budgets forced swap-ins (%" PRIu64 "), drops (%" PRIu64
           "), recomputation (%" PRIu64 " tokens) and suspensions (%" PRIu64 ")",
           mn, es.swap_in_chunks, es.dropped_chunks, es.recomputed_tokens, es.suspensions);
    } else {
        ok(es.reused_device_tokens == 0 && es.reused_host_tokens == 0,
           "property, %s: nothing is reused, every context recomputed (%" PRIu64 " tokens)", mn,
           es.recomputed_tokens);
    }
    char what[64];
    snprintf(what, sizeof what, "property, %s", mn);
    report_checks(what);
    for (int i = 0; i < P_SESSIONS; i++)
        pv_engine_end_session(e, ps[i].id);
    pv_cache_stats cs;
    pv_cache_stats_get(pv_engine_cache(e), &cs);
    ok(cs.sessions == 0 && cs.used_bytes[PV_TIER_DEVICE] == 0 && cs.used_bytes[PV_TIER_HOST] == 0,
       "property, %s: ending the sessions frees every tier (%" PRIu64 " device, %" PRIu64 " host bytes left)",
       mn, cs.used_bytes[PV_TIER_DEVICE], cs.used_bytes[PV_TIER_HOST]);
    pv_engine_free(e);
}

/* ---- 2. cancellation ------------------------------------------------------------------- */

/* One turn on `sid` run to its end, its answer checked against the fresh
 * one and the context it kept against `want_ctx` (-1: not checked). */
static void answer_check(pv_engine *e, const char *sid, const conv *c, int want_ctx, const char *what,
                         eu_result *got)
{
    pv_sampling s = sampling(7, 1000 + (uint64_t)c->n);
    eu_result ref;
    pv_status st = turn(e, sid, c, 1, &s, got);
    fresh(c, &s, &ref);
    const pv_turn_result *r = &got->res;
    ok(st == PV_OK && same(got, &ref) &&
           (want_ctx < 0 || r->context_tokens == (uint32_t)want_ctx) &&
           r->reused_device + r->reused_host + r->recomputed == r->context_tokens,
       "%s: the answer equals the fresh one, context %u (want %d: %u device, %u host, %u recomputed; %s)",
       what, r->context_tokens, want_ctx, r->reused_device, r->reused_host, r->recomputed,
       st == PV_OK ? "ok" : pv_last_error());
}

static uint64_t cancelled_count(pv_engine *e)
{
    pv_engine_stats es;
    pv_engine_stats_get(e, &es);
    return es.turns_cancelled;
}

static void cancel_queued_and_running(void)
{
    /* One turn runs at a time: a second one waits in the queue. */
    pv_engine *e = new_engine(PV_MODE_PENSIEVE, 256, 32, 48, 1);
    if (!e)
        return;
    conv a = {.n = 0}, b = {.n = 0};
    eu_result ra, rb, rbusy, ref;
    conv_add_random(&a, 40);
    answer_check(e, "q", &a, 0, "cancel: the queued session's first turn", &ra);
    conv known_a = a;
    conv_answered(&known_a, &ra);

    /* A turn of another session runs; q's diverging turn queues behind it.
     * Its submit has already cut q's history to the common prefix. */
    conv_add_random(&b, 30);
    pv_sampling sb = sampling(20, 5);
    pv_status st = submit(e, "busy", &b, 1, &sb, &rbusy, NULL);
    if (st == PV_OK)
        st = pv_engine_step(e, NULL);
    conv q1 = {.n = 0};
    conv_add(&q1, known_a.v, 25);
    q1.v[q1.n++] = other_token(known_a.v[25]);
    conv_add_random(&q1, 10);
    uint64_t id = 0, before = cancelled_count(e);
    pv_sampling sq = sampling(6, 6);
    if (st == PV_OK)
        st = submit(e, "q", &q1, 1, &sq, &rb, &id);
    pv_engine_stats es;
    pv_engine_stats_get(e, &es);
    ok(st == PV_OK && es.running == 1 && es.waiting == 1, "cancel: one turn running, q's waiting (%s)",
       st == PV_OK ? "ok" : pv_last_error());
    /* Refused submits change nothing: the session is busy. */
    size_t n_q = session_tokens(e, "q");
    conv other = {.n = 0};
    conv_add_random(&other, 9);
    eu_result rx;
    pv_status busy = submit(e, "q", &other, 1, &sq, &rx, NULL);
    ok(busy == PV_ERR_BUSY && session_tokens(e, "q") == n_q && n_q == 25,
       "a whole conversation for a session with a turn queued: PV_ERR_BUSY, its %zu tokens kept (%s)", n_q,
       pv_last_error());
    st = pv_engine_cancel(e, id);
    check_engine(e, "after cancelling a queued turn");
    ok(st == PV_OK && rb.done == 1 && rb.status == PV_OK && rb.res.finish == PV_FINISH_CANCELLED &&
           rb.res.generated == 0 && rb.n == 0,
       "cancel of a queued turn: on_done at once, PV_OK, finish %s, %u generated",
       pv_finish_reason_name(rb.res.finish), rb.res.generated);
    ok(cancelled_count(e) == before + 1 && pv_engine_pending(e) == 1,
       "cancel of a queued turn: turns_cancelled %" PRIu64 " -> %" PRIu64 ", the running turn stays",
       before, cancelled_count(e));
    /* Nothing of it ran: the history is the prefix its submit kept, the
     * rest of its input waits as the next turn's first tokens. */
    ok(session_tokens(e, "q") == (size_t)q1.n,
       "cancel of a queued turn: the session knows its input, %zu tokens (want %d)", session_tokens(e, "q"),
       q1.n);
    st = drive(e);
    fresh(&b, &sb, &ref);
    ok(st == PV_OK && same(&rbusy, &ref) && rb.done == 1,
       "cancel of a queued turn: the running one goes on to the fresh answer, no second on_done");
    pv_engine_cancel(e, id);
    ok(rb.done == 1, "cancel of a queued turn: cancelling it again calls nothing");

    /* A conversation with no room left to answer: refused, no cut. */
    conv huge = q1;
    huge.v[0] = other_token(huge.v[0]);
    conv_add_random(&huge, N_CTX - huge.n);
    st = submit(e, "q", &huge, 1, &sq, &rx, NULL);
    ok(st == PV_ERR_CAPACITY && session_tokens(e, "q") == (size_t)q1.n && pv_engine_pending(e) == 0,
       "a diverging conversation of %d tokens (no room to answer) is refused (PV_ERR_CAPACITY) before any cut: %s",
       huge.n, pv_last_error());

    /* q goes on: its input extended. Only the prefix kept at the cut has
     * KV; the rest runs. */
    conv q2 = q1;
    conv_add_random(&q2, 6);
    answer_check(e, "q", &q2, 25, "cancel of a queued turn, then an extension", &rb);

    /* A running turn, mid-decode. */
    conv known = q2;
    conv_answered(&known, &rb);
    conv q3 = known;
    conv_add_random(&q3, 12);
    eu_result rc;
    pv_sampling s3 = sampling(40, 8);
    before = cancelled_count(e);
    st = submit(e, "q", &q3, 1, &s3, &rc, &id);
    while (st == PV_OK && rc.n < 4 && pv_engine_pending(e))
        st = pv_engine_step(e, NULL);
    size_t streamed = (size_t)rc.n;
    if (st == PV_OK)
        st = pv_engine_cancel(e, id);
    check_engine(e, "after cancelling a running turn");
    ok(st == PV_OK && rc.done == 1 && rc.res.finish == PV_FINISH_CANCELLED && rc.res.generated == streamed &&
           streamed == 4 && cancelled_count(e) == before + 1 && pv_engine_pending(e) == 0,
       "cancel mid-decode: on_done once, finish %s, %u generated of 40 (%zu streamed)",
       pv_finish_reason_name(rc.res.finish), rc.res.generated, streamed);
    ok(session_tokens(e, "q") == (size_t)q3.n + streamed,
       "cancel mid-decode: what ran stays, the session knows %zu tokens (want %zu)", session_tokens(e, "q"),
       (size_t)q3.n + streamed);
    /* The next turn keeps the first streamed token and edits the second:
     * the cut needs the session unpinned. */
    conv q4 = q3;
    conv_add(&q4, rc.tokens, 1);
    q4.v[q4.n++] = other_token(rc.tokens[1]);
    conv_add_random(&q4, 4);
    answer_check(e, "q", &q4, q3.n + 1, "cancel mid-decode, then an edit of the streamed answer", &rc);
    ok(rc.res.reused_device == rc.res.context_tokens,
       "cancel mid-decode: the next turn reads its context from device (%u of %u)", rc.res.reused_device,
       rc.res.context_tokens);
    report_checks("cancel queued and running");
    pv_engine_free(e);
}

static void cancel_mid_recovery(void)
{
    /* 18 device slots: one 5-chunk context (15 slots) at a time; 3 host
     * slots take one chunk, the rest of an evicted session is dropped.
     * Recovery runs 16 tokens an iteration. */
    pv_engine *e = new_engine(PV_MODE_PENSIEVE, 18, 3, 16, 2);
    if (!e)
        return;
    conv a = {.n = 0}, b = {.n = 0};
    eu_result ra, rb, rc;
    conv_add_random(&a, 60);
    answer_check(e, "old", &a, 0, "mid-recovery: the first turn", &ra);
    conv_add_random(&b, 60);
    answer_check(e, "other", &b, 0, "mid-recovery: another session's turn", &rb);
    pv_tier t0 = PV_TIER_NONE;
    pv_cache_peek(pv_engine_cache(e), "old", 0, 0, &t0, NULL, NULL);
    ok(t0 == PV_TIER_DROPPED, "mid-recovery: the first session's first chunk was dropped (%s)",
       pv_tier_name(t0));

    conv known = a;
    conv_answered(&known, &ra);
    conv c = known;
    conv_add_random(&c, 5);
    uint64_t id = 0;
    pv_sampling s = sampling(8, 3);
    pv_engine_stats before, after;
    pv_engine_stats_get(e, &before);
    pv_status st = submit(e, "old", &c, 1, &s, &rc, &id);
    if (st == PV_OK)
        st = pv_engine_step(e, NULL);
    pv_engine_stats_get(e, &after);
    uint64_t ran = after.recomputed_tokens - before.recomputed_tokens;
    ok(st == PV_OK && ran > 0 && ran < (uint64_t)known.n - 1 && rc.done == 0,
       "mid-recovery: one step recomputed %" PRIu64 " of the dropped history", ran);
    st = pv_engine_cancel(e, id);
    check_engine(e, "after cancelling mid-recovery");
    ok(st == PV_OK && rc.done == 1 && rc.res.finish == PV_FINISH_CANCELLED && rc.res.recomputed > 0 &&
           rc.res.generated == 0 && pv_engine_pending(e) == 0,
       "cancel mid-recovery: cancelled with %u tokens to recompute, nothing generated", rc.res.recomputed);
    ok(session_tokens(e, "old") == (size_t)c.n, "cancel mid-recovery: the session knows %zu tokens (want %d)",
       session_tokens(e, "old"), c.n);
    conv d = c;
    conv_add_random(&d, 4);
    answer_check(e, "old", &d, known.n - 1, "cancel mid-recovery, then an extension", &rc);
    conv known_d = d;
    conv_answered(&known_d, &rc);
    conv f = {.n = 0};
    conv_add(&f, known_d.v, 50);
    f.v[f.n++] = other_token(known_d.v[50]);
    answer_check(e, "old", &f, 50, "cancel mid-recovery, then an edit", &rc);
    answer_check(e, "other", &b, b.n - 1, "cancel mid-recovery: the other session regenerates", &rb);
    report_checks("cancel mid-recovery");
    pv_engine_free(e);
}

/* A returning session whose history is partly dropped, partly on HOST,
 * partly in the same chunks (a dropped layer beside kept ones): its turn
 * needs a DEVICE slot per (chunk, layer) of its context, no more. 21
 * device slots (7 chunks of 3 layers), 5 host slots. */
static void recovery_needs_its_context(void)
{
    pv_engine *e = new_engine(PV_MODE_PENSIEVE, 21, 5, 16, 2);
    if (!e)
        return;
    conv a = {.n = 0}, b = {.n = 0};
    eu_result ra, rb;
    conv_add_random(&a, 58);
    answer_check(e, "old", &a, 0, "partly dropped: the first turn", &ra);
    conv_add_random(&b, 60);
    answer_check(e, "other", &b, 0, "partly dropped: another session fills the device", &rb);
    /* The first session's records: chunks through the last one with a
     * dropped layer are recomputed; their layers kept elsewhere are
     * replaced there, not added. */
    pv_cache *cache = pv_engine_cache(e);
    uint32_t recompute_chunks = 0, kept_below = 0, on_device = 0, per_tier[3] = {0, 0, 0};
    for (uint32_t c = 0; c < 7; c++)
        for (uint32_t l = 0; l < LAYERS; l++) {
            pv_tier t = PV_TIER_NONE;
            uint32_t shadow = UINT32_MAX;
            if (pv_cache_peek(cache, "old", c, l, &t, NULL, &shadow) == PV_OK && t != PV_TIER_NONE) {
                per_tier[t]++;
                on_device += t == PV_TIER_DEVICE || shadow != UINT32_MAX;
                if (t == PV_TIER_DROPPED)
                    recompute_chunks = c + 1;
            }
        }
    for (uint32_t c = 0; c < recompute_chunks; c++)
        for (uint32_t l = 0; l < LAYERS; l++) {
            pv_tier t = PV_TIER_NONE;
            kept_below += pv_cache_peek(cache, "old", c, l, &t, NULL, NULL) == PV_OK &&
                          (t == PV_TIER_DEVICE || t == PV_TIER_HOST);
        }
    /* The next turn's context is 7 chunks through its answer, the whole
     * pool: it needs the slots not on DEVICE already, which the pool can
     * give with nothing else running; counting the kept layers of the
     * recomputed chunks again would ask for more. */
    const uint32_t need = 7 * LAYERS - on_device;
    ok(per_tier[PV_TIER_HOST] > 0 && kept_below > 0 && need + kept_below > 7 * LAYERS - on_device,
       "partly dropped: %u records on device, %u on host (%u with a device shadow), %u dropped; %u kept inside "
       "the %u chunks to recompute: %u new slots needed",
       per_tier[PV_TIER_DEVICE], per_tier[PV_TIER_HOST], on_device - per_tier[PV_TIER_DEVICE],
       per_tier[PV_TIER_DROPPED], kept_below, recompute_chunks, need);
    conv c = a;
    conv_answered(&c, &ra);
    conv_add_random(&c, 112 - 7 - c.n);
    eu_result rc;
    answer_check(e, "old", &c, (int)(a.n + ra.n - 1), "partly dropped: the next turn, 7 chunks of context", &rc);
    /* 7 chunks, the whole pool: past it less the reserve, so it runs
     * alone, nothing else running. */
    conv d = {.n = 0};
    conv_add_random(&d, 112 - 7);
    answer_check(e, "whole", &d, 0, "a first turn whose context is the whole device pool", &rc);
    report_checks("partly dropped");
    pv_engine_free(e);
}

static void cancel_unknown_and_all(void)
{
    pv_engine *e = new_engine(PV_MODE_PENSIEVE, 256, 32, 48, 2);
    if (!e)
        return;
    conv c = {.n = 0};
    conv_add_random(&c, 12);
    eu_result r;
    uint64_t id = 0;
    pv_sampling s = sampling(3, 0);
    pv_status st = submit(e, "u", &c, 1, &s, &r, &id);
    if (st == PV_OK)
        st = drive(e);
    ok(pv_engine_cancel(e, id) == PV_ERR_NOT_FOUND && r.done == 1,
       "cancel of a finished turn: PV_ERR_NOT_FOUND (%s)", pv_last_error());
    ok(pv_engine_cancel(e, id + 1000) == PV_ERR_NOT_FOUND, "cancel of an unknown id: PV_ERR_NOT_FOUND (%s)",
       pv_last_error());
    ok(pv_engine_cancel(NULL, id) == PV_ERR_INVALID_ARG, "cancel on a NULL engine: PV_ERR_INVALID_ARG");

    /* Five sessions, two running at a time: some with history, some new. */
    enum { N = 5 };
    static conv in[N], known[N];
    static eu_result rr[N];
    char sid[N][8];
    uint64_t before = cancelled_count(e);
    st = PV_OK;
    for (int i = 0; i < N && st == PV_OK; i++) {
        snprintf(sid[i], sizeof sid[i], "all%d", i);
        in[i].n = 0;
        conv_add_random(&in[i], 20 + 7 * i);
        pv_sampling si = sampling(30, 10 + (uint64_t)i);
        if (i < 2) {
            st = turn(e, sid[i], &in[i], 1, &si, &rr[i]);
            conv_answered(&in[i], &rr[i]);
            conv_add_random(&in[i], 3);
        }
    }
    for (int i = 0; i < N && st == PV_OK; i++) {
        pv_sampling si = sampling(30, 10 + (uint64_t)i);
        st = submit(e, sid[i], &in[i], 1, &si, &rr[i], NULL);
    }
    for (int k = 0; k < 3 && st == PV_OK; k++)
        st = pv_engine_step(e, NULL);
    pv_engine_stats es;
    pv_engine_stats_get(e, &es);
    ok(st == PV_OK && es.running == 2 && es.waiting == 3,
       "cancel all: 2 turns running, 3 queued (%u, %u; %s)", es.running, es.waiting,
       st == PV_OK ? "ok" : pv_last_error());
    pv_engine_cancel_all(e);
    check_engine(e, "after cancel_all");
    int once = 0, cancelled = 0;
    for (int i = 0; i < N; i++) {
        once += rr[i].done == 1;
        cancelled += rr[i].status == PV_OK && rr[i].res.finish == PV_FINISH_CANCELLED;
    }
    pv_engine_stats_get(e, &es);
    ok(once == N && cancelled == N && pv_engine_pending(e) == 0 && es.running == 0 && es.waiting == 0 &&
           cancelled_count(e) == before + N,
       "cancel all: every turn's on_done once (%d), cancelled with PV_OK (%d), nothing pending", once,
       cancelled);
    pv_engine_cancel_all(e);
    once = 0;
    for (int i = 0; i < N; i++)
        once += rr[i].done == 1;
    ok(once == N, "cancel all again: no callback runs twice");
    /* Every session goes on from what its client saw. */
    int right = 0;
    for (int i = 0; i < N; i++) {
        known[i] = in[i];
        conv_answered(&known[i], &rr[i]);
        conv_add_random(&known[i], 2);
        pv_sampling si = sampling(5, 20 + (uint64_t)i);
        eu_result ref;
        if (submit(e, sid[i], &known[i], 1, &si, &rr[i], NULL) != PV_OK)
            continue;
        if (drive(e) != PV_OK)
            break;
        fresh(&known[i], &si, &ref);
        right += same(&rr[i], &ref);
    }
    ok(right == N, "cancel all: each session's next turn gives the fresh answer (%d of %d)", right, N);
    report_checks("cancel unknown and all");
    pv_engine_free(e);
}

/* ---- 3. NULL sessions -------------------------------------------------------------------- */

static void count_session(void *user, const char *session)
{
    (void)session;
    (*(int *)user)++;
}

static int listed(pv_engine *e)
{
    int n = 0;
    pv_engine_foreach_session(e, count_session, &n);
    return n;
}

static void null_session(void)
{
    pv_engine *e = new_engine(PV_MODE_PENSIEVE, 256, 32, 48, 4);
    if (!e)
        return;
    conv named = {.n = 0}, x = {.n = 0};
    eu_result rn, rx, ry, ref;
    conv_add_random(&named, 30);
    answer_check(e, "named", &named, 0, "NULL session: a named session's turn first", &rn);
    pv_cache_stats c0, c1, c2;
    pv_engine_stats e0, e2;
    pv_cache_stats_get(pv_engine_cache(e), &c0);
    pv_engine_stats_get(e, &e0);

    conv_add_random(&x, 50);
    pv_sampling s = sampling(9, 31);
    pv_status st = submit(e, NULL, &x, 0, &s, &rx, NULL);
    if (st == PV_OK)
        st = pv_engine_step(e, NULL);
    pv_cache_stats_get(pv_engine_cache(e), &c1);
    ok(st == PV_OK && listed(e) == 1 && c1.sessions == c0.sessions + 1,
       "NULL session: while it runs, the cache holds it (%u sessions) but no listing shows it (%d listed)",
       c1.sessions, listed(e));
    if (st == PV_OK)
        st = drive(e);
    fresh(&x, &s, &ref);
    ok(st == PV_OK && same(&rx, &ref) && rx.res.context_tokens == 0,
       "NULL session: the answer equals the fresh one, no context (%u)", rx.res.context_tokens);
    pv_cache_stats_get(pv_engine_cache(e), &c2);
    pv_engine_stats_get(e, &e2);
    ok(listed(e) == 1 && c2.sessions == c0.sessions && e2.sessions == e0.sessions &&
           c2.used_bytes[PV_TIER_DEVICE] == c0.used_bytes[PV_TIER_DEVICE] &&
           c2.used_bytes[PV_TIER_HOST] == c0.used_bytes[PV_TIER_HOST],
       "NULL session: after it ends nothing of it stays (%u cache sessions, %u engine sessions, device %" PRIu64
       " -> %" PRIu64 " bytes, host %" PRIu64 " -> %" PRIu64 ")",
       c2.sessions, e2.sessions, c0.used_bytes[PV_TIER_DEVICE], c2.used_bytes[PV_TIER_DEVICE],
       c0.used_bytes[PV_TIER_HOST], c2.used_bytes[PV_TIER_HOST]);

    /* The same input again: it remembers nothing, as whole conversation
     * too, and two at once beside a named turn keep apart. */
    conv named2 = named;
    conv_answered(&named2, &rn);
    conv_add_random(&named2, 4);
    conv y = x;
    y.v[10] = other_token(y.v[10]);
    pv_sampling sn = sampling(6, 32);
    st = submit(e, NULL, &x, 1, &s, &rx, NULL);
    if (st == PV_OK)
        st = submit(e, NULL, &y, 0, &s, &ry, NULL);
    if (st == PV_OK)
        st = submit(e, "named", &named2, 1, &sn, &rn, NULL);
    if (st == PV_OK)
        st = drive(e);
    eu_result refy, refn;
    fresh(&y, &s, &refy);
    fresh(&named2, &sn, &refn);
    ok(st == PV_OK && same(&rx, &ref) && same(&ry, &refy) && same(&rn, &refn) && rx.res.context_tokens == 0 &&
           rn.res.context_tokens == (uint32_t)named2.n - 5,
       "NULL sessions: two at once beside a named turn, each the fresh answer; the named one kept %u",
       rn.res.context_tokens);
    /* A NULL-session turn cancelled mid-decode goes too. */
    uint64_t id = 0;
    s.max_tokens = 30;
    st = submit(e, NULL, &x, 0, &s, &rx, &id);
    while (st == PV_OK && rx.n < 2 && pv_engine_pending(e))
        st = pv_engine_step(e, NULL);
    if (st == PV_OK)
        st = pv_engine_cancel(e, id);
    check_engine(e, "after cancelling a NULL-session turn");
    pv_cache_stats_get(pv_engine_cache(e), &c2);
    pv_engine_stats_get(e, &e2);
    ok(st == PV_OK && rx.done == 1 && rx.res.finish == PV_FINISH_CANCELLED && listed(e) == 1 &&
           c2.sessions == c0.sessions && e2.sessions == e0.sessions,
       "NULL session cancelled mid-decode: it ends and leaves no session (%u cache, %u engine)", c2.sessions,
       e2.sessions);
    report_checks("NULL sessions");
    pv_engine_free(e);
}

/* ---- 4. the engine on a thread of its own ------------------------------------------------ */

/* A turn handed to the loop: its callbacks run on the loop's thread, the
 * submitting thread waits on the condition variable. */
typedef struct loop_turn {
    const char *sid;
    const conv *c;
    pv_sampling s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    eu_result r;
    int done_calls;
    uint64_t id;
} loop_turn;

static void lt_init(loop_turn *t, const char *sid, const conv *c, pv_sampling s)
{
    memset(t, 0, sizeof *t);
    t->sid = sid;
    t->c = c;
    t->s = s;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
}

static void lt_destroy(loop_turn *t)
{
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
}

static void lt_on_token(void *user, int32_t token, const char *text, size_t len)
{
    loop_turn *t = user;
    pthread_mutex_lock(&t->mu);
    eu_on_token(&t->r, token, text, len);
    pthread_mutex_unlock(&t->mu);
}

static void lt_on_done(void *user, pv_status st, const pv_turn_result *res)
{
    loop_turn *t = user;
    pthread_mutex_lock(&t->mu);
    eu_on_done(&t->r, st, res);
    t->done_calls++;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* Runs on the loop's thread. */
static pv_status lt_submit(pv_engine *e, void *arg)
{
    loop_turn *t = arg;
    pv_turn turn = {
        .tokens = t->c->v, .n_tokens = (size_t)t->c->n, .sampling = t->s, .whole_conversation = 1};
    pv_turn_callbacks cb = {lt_on_token, lt_on_done, t};
    return pv_engine_submit(e, t->sid, &turn, &cb, &t->id);
}

static void lt_wait(loop_turn *t)
{
    pthread_mutex_lock(&t->mu);
    while (t->done_calls == 0)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

#define L_THREADS 4
#define L_TURNS 3

typedef struct loop_client {
    pv_engine_loop *loop;
    char sid[8];
    int32_t news[L_TURNS][12];       /* each turn's new tokens, drawn beforehand */
    conv inputs[L_TURNS];
    eu_result answers[L_TURNS];
    pv_status status;
} loop_client;

/* A client thread: a conversation of L_TURNS turns, each the previous
 * conversation, its answer and new tokens. */
static void *client_main(void *arg)
{
    loop_client *cl = arg;
    conv c = {.n = 0};
    for (int k = 0; k < L_TURNS && cl->status == PV_OK; k++) {
        conv_add(&c, cl->news[k], 12);
        cl->inputs[k] = c;
        loop_turn t;
        lt_init(&t, cl->sid, &cl->inputs[k], sampling(6, 50 + (uint64_t)k));
        cl->status = pv_engine_loop_call(cl->loop, lt_submit, &t);
        if (cl->status == PV_OK) {
            lt_wait(&t);
            cl->answers[k] = t.r;
            if (t.done_calls != 1 || t.r.status != PV_OK)
                cl->status = PV_ERR_STATE;
            conv_answered(&c, &t.r);
        }
        lt_destroy(&t);
    }
    return NULL;
}

static int call_log[8], n_call_log;

static pv_status log_call(pv_engine *e, void *arg)
{
    (void)e;
    if (n_call_log < 8)
        call_log[n_call_log++] = (int)(intptr_t)arg;
    return PV_OK;
}

static pv_status failing_call(pv_engine *e, void *arg)
{
    (void)e;
    return pv_error(PV_ERR_INVALID_ARG, "a planted failure number %d", (int)(intptr_t)arg);
}

static pthread_mutex_t ran_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ran_cv = PTHREAD_COND_INITIALIZER;
static int ran_flag;

static pv_status flag_call(pv_engine *e, void *arg)
{
    (void)e;
    (void)arg;
    pthread_mutex_lock(&ran_mu);
    ran_flag = 1;
    pthread_cond_broadcast(&ran_cv);
    pthread_mutex_unlock(&ran_mu);
    return PV_OK;
}

static pv_status sleep_call(pv_engine *e, void *arg)
{
    (void)e;
    struct timespec ts = {0, (long)(intptr_t)arg * 1000000L};
    nanosleep(&ts, NULL);
    return PV_OK;
}

typedef struct tokens_query {
    const char *sid;
    size_t n;
} tokens_query;

static pv_status tokens_call(pv_engine *e, void *arg)
{
    tokens_query *q = arg;
    return pv_engine_session_tokens(e, q->sid, &q->n);
}

static double now_s(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void loop_threads(void)
{
    pv_engine *e = new_engine(PV_MODE_PENSIEVE, 96, 32, 48, 4);
    pv_engine *direct = new_engine(PV_MODE_PENSIEVE, 96, 32, 48, 4);
    pv_engine_loop *loop = NULL;
    if (!e || !direct || !ok(pv_engine_loop_start(&loop, e) == PV_OK, "loop: started")) {
        pv_engine_free(e);
        pv_engine_free(direct);
        return;
    }
    static loop_client cl[L_THREADS];
    pthread_t th[L_THREADS];
    for (int i = 0; i < L_THREADS; i++) {
        memset(&cl[i], 0, sizeof cl[i]);
        cl[i].loop = loop;
        snprintf(cl[i].sid, sizeof cl[i].sid, "t%d", i);
        for (int k = 0; k < L_TURNS; k++)
            for (int j = 0; j < 12; j++)
                cl[i].news[k][j] = any_token();
    }
    int started = 0;
    for (int i = 0; i < L_THREADS; i++)
        started += pthread_create(&th[i], NULL, client_main, &cl[i]) == 0;
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    /* The same turns, one after another, on an engine driven directly. */
    int good = 0, equal = 0;
    for (int i = 0; i < started; i++) {
        good += cl[i].status == PV_OK;
        for (int k = 0; k < L_TURNS && cl[i].status == PV_OK; k++) {
            eu_result r;
            pv_sampling s = sampling(6, 50 + (uint64_t)k);
            pv_status st = turn(direct, cl[i].sid, &cl[i].inputs[k], 1, &s, &r);
            equal += st == PV_OK && same(&r, &cl[i].answers[k]) &&
                     r.res.context_tokens == cl[i].answers[k].res.context_tokens;
        }
    }
    ok(started == L_THREADS && good == L_THREADS,
       "loop: %d threads' turns through loop_call all end once with PV_OK (%d)", started, good);
    ok(equal == L_THREADS * L_TURNS,
       "loop: every answer and context equals the same turn run directly on another engine (%d of %d)", equal,
       L_THREADS * L_TURNS);

    /* Posts and calls run in the order made. */
    n_call_log = 0;
    pv_status p1 = pv_engine_loop_post(loop, log_call, (void *)1);
    pv_status c2 = pv_engine_loop_call(loop, log_call, (void *)2);
    pv_status p3 = pv_engine_loop_post(loop, log_call, (void *)3);
    pv_status p4 = pv_engine_loop_post(loop, log_call, (void *)4);
    pv_status c5 = pv_engine_loop_call(loop, log_call, (void *)5);
    ok(p1 == PV_OK && c2 == PV_OK && p3 == PV_OK && p4 == PV_OK && c5 == PV_OK && n_call_log == 5 &&
           call_log[0] == 1 && call_log[1] == 2 && call_log[2] == 3 && call_log[3] == 4 && call_log[4] == 5,
       "loop: posts and calls run in the order made (%d ran: %d %d %d %d %d)", n_call_log, call_log[0],
       call_log[1], call_log[2], call_log[3], call_log[4]);

    /* A call's failure and message reach the caller's thread. */
    pv_error(PV_ERR_STATE, "a stale message of the caller");
    pv_status st = pv_engine_loop_call(loop, failing_call, (void *)42);
    ok(st == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "a planted failure number 42"),
       "loop: a call's status and message reach the caller (%d: %s)", (int)st, pv_last_error());
    conv busy_in = cl[0].inputs[L_TURNS - 1];
    conv_add_random(&busy_in, 3);
    loop_turn lb, lb2;
    lt_init(&lb, "t0", &busy_in, sampling(60, 3));
    lt_init(&lb2, "t0", &busy_in, sampling(60, 3));
    pv_status s1 = pv_engine_loop_call(loop, lt_submit, &lb);
    pv_status s2 = pv_engine_loop_call(loop, lt_submit, &lb2);
    ok(s1 == PV_OK && s2 == PV_ERR_BUSY && strstr(pv_last_error(), "\"t0\"") &&
           strstr(pv_last_error(), "queued or running"),
       "loop: a submit to a busy session fails with PV_ERR_BUSY, its message on the caller (%s)",
       pv_last_error());
    st = pv_engine_loop_call(loop, log_call, (void *)6);
    ok(st == PV_OK, "loop: a call after a failed one succeeds");
    lt_wait(&lb);
    ok(lb.done_calls == 1 && lb2.done_calls == 0 && lb.r.status == PV_OK,
       "loop: the busy session's turn ends once, the refused one never calls back");
    lt_destroy(&lb);
    lt_destroy(&lb2);

    /* Idle: the loop sleeps instead of spinning. */
    sleep_s(0.2);
    double cpu0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    sleep_s(1.5);
    double idle_cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    ok(idle_cpu < 0.1, "loop: idle for 1.5 s, the process used %.3f s of CPU", idle_cpu);
    /* A post wakes it at once: right after a call the loop has just gone
     * back to sleep for a second. */
    pv_engine_loop_call(loop, log_call, (void *)7);
    double t0 = now_s(CLOCK_MONOTONIC);
    ran_flag = 0;
    st = pv_engine_loop_post(loop, flag_call, NULL);
    pthread_mutex_lock(&ran_mu);
    while (!ran_flag && st == PV_OK)
        pthread_cond_wait(&ran_cv, &ran_mu);
    pthread_mutex_unlock(&ran_mu);
    double latency = now_s(CLOCK_MONOTONIC) - t0;
    ok(st == PV_OK && latency < 0.3, "loop: a post to an idle loop runs within %.3f s", latency);

    /* Stop with turns running and queued: each ends cancelled, once. The
     * loop is held in a sleeping call meanwhile, so they cannot finish. */
    enum { S = 3 };
    static conv sin[S];
    loop_turn ls[S];
    char sid[S][8];
    int submitted = 0;
    for (int i = 0; i < S; i++) {
        snprintf(sid[i], sizeof sid[i], "stop%d", i);
        sin[i].n = 0;
        conv_add_random(&sin[i], 20);
        lt_init(&ls[i], sid[i], &sin[i], sampling(0, 9)); /* up to the context's end */
        submitted += pv_engine_loop_call(loop, lt_submit, &ls[i]) == PV_OK;
    }
    pv_engine_loop_post(loop, sleep_call, (void *)300);
    pv_engine_loop_stop(loop);
    int once = 0, cancelled = 0;
    for (int i = 0; i < S; i++) {
        once += ls[i].done_calls == 1;
        cancelled += ls[i].r.status == PV_OK && ls[i].r.res.finish == PV_FINISH_CANCELLED;
    }
    ok(submitted == S && once == S && cancelled == S && pv_engine_pending(e) == 0,
       "loop stop: the %d pending turns end cancelled (%d), on_done once each (%d)", S, cancelled, once);
    check_engine(e, "after the loop stopped");
    /* The engine is the caller's again, its sessions usable. */
    conv next = sin[1];
    conv_answered(&next, &ls[1].r);
    conv_add_random(&next, 2);
    eu_result r;
    answer_check(e, "stop1", &next, next.n - 3, "loop stop: the engine driven directly afterwards", &r);
    for (int i = 0; i < S; i++)
        lt_destroy(&ls[i]);
    pv_engine_loop_stop(NULL);
    report_checks("loop");
    pv_engine_free(direct);
    pv_engine_free(e);
}

/* Sessions idle past the timeout end on the loop's thread, whether it
 * sleeps undisturbed or keeps serving calls that run no turn. */
static void loop_idle_timeout(void)
{
    for (int busy = 0; busy < 2; busy++) {
        pv_cache_config cc;
        pv_cache_config_defaults(&cc);
        cc.device_bytes = 64 * SLOT;
        pv_engine_config ec;
        pv_engine_config_defaults(&ec);
        ec.idle_timeout_s = 0.5;
        pv_engine *e = NULL;
        pv_engine_loop *loop = NULL;
        if (pv_engine_init(&e, M.be, M.model, &M.tok, &cc, &ec) != PV_OK ||
            pv_engine_loop_start(&loop, e) != PV_OK) {
            ok(0, "idle timeout: engine and loop (%s)", pv_last_error());
            pv_engine_free(e);
            return;
        }
        conv c = {.n = 0};
        conv_add_random(&c, 10);
        loop_turn t;
        lt_init(&t, "idle", &c, sampling(2, 0));
        pv_status st = pv_engine_loop_call(loop, lt_submit, &t);
        if (st == PV_OK)
            lt_wait(&t);
        tokens_query q = {"idle", 0};
        double t0 = now_s(CLOCK_MONOTONIC);
        pv_status found = PV_OK;
        /* Within 3 s: 0.5 s of idleness, scans at most a second apart. */
        if (busy) {
            while (found == PV_OK && now_s(CLOCK_MONOTONIC) - t0 < 3.0) {
                found = pv_engine_loop_call(loop, tokens_call, &q);
                sleep_s(0.1);
            }
        } else {
            sleep_s(2.2);
            found = pv_engine_loop_call(loop, tokens_call, &q);
        }
        ok(st == PV_OK && t.done_calls == 1 && found == PV_ERR_NOT_FOUND,
           "idle timeout on the loop, %s: the idle session ends within %.1f s (%s)",
           busy ? "calls arriving every 0.1 s" : "no calls", now_s(CLOCK_MONOTONIC) - t0,
           found == PV_ERR_NOT_FOUND ? "ended" : "still there");
        pv_engine_loop_stop(loop);
        lt_destroy(&t);
        pv_engine_free(e);
    }
}

int main(int argc, char **argv)
{
    eu_passive_openmp(argc, argv);
    pv_status st = eu_model_init(&M, "cpu", LAYERS, N_CTX, PV_F32, CHUNK);
    if (!ok(st == PV_OK, "cpu: synthetic model, %d layers, %d-token chunks (%s)", LAYERS, CHUNK,
            st == PV_OK ? "ok" : pv_last_error())) {
        eu_model_free(&M);
        return tap_done();
    }
    SLOT = pv_llama_slot_bytes(M.model);
    /* PV_CONV_SEED explores other conversations. */
    const char *seed = getenv("PV_CONV_SEED");
    if (seed && *seed)
        rng_state = strtoull(seed, NULL, 0), exploring = 1;
    tap_diag("conversations from seed %" PRIu64, rng_state);
    REF = new_engine(PV_MODE_STATELESS, 1024, 0, 128, 16);
    if (REF) {
        extend_and_diverge();
        property(PV_MODE_PENSIEVE);
        property(PV_MODE_GPU_ONLY);
        property(PV_MODE_STATELESS);
        if (!exploring) {
            /* A seed whose rounds suspend a turn right after a batch given
             * up for room stored its next chunk (that chunk must not
             * outlive the turn); the rest keep the default seed's draws. */
            uint64_t saved = rng_state;
            rng_state = 5;
            exploring = 1;
            tap_diag("pensieve mode again, conversations from seed 5");
            property(PV_MODE_PENSIEVE);
            exploring = 0;
            rng_state = saved;
        }
        cancel_queued_and_running();
        cancel_mid_recovery();
        recovery_needs_its_context();
        cancel_unknown_and_all();
        null_session();
        loop_threads();
        loop_idle_timeout();
    }
    pv_engine_free(REF);
    eu_model_free(&M);
    return tap_done();
}
