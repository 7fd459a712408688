/* pensieve-bench's workload (bench/workload.h): generated conversations
 * match the dataset means and the requested rates, the scales multiply
 * exactly, the same seed gives the same workload, the context cap holds,
 * bad options are refused naming the field, and JSONL replay reads good
 * files (system messages as the conversation's system text, content
 * parts, an unanswered turn) and refuses bad ones naming path:line. Shared preambles (issue 28): the workloads
 * of before them are unchanged (digests recorded from the code of
 * before), a preamble only takes its room under the cap, the choice is
 * uniform, and the in-process driver's token ids of a preamble are the
 * same in every conversation that drew it and differ within the first
 * chunk between preambles. */
#include "bench/bench-inproc.h"
#include "bench/workload.h"
#include "tap.h"

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static int near(double got, double want, double rel)
{
    return fabs(got - want) <= rel * fabs(want);
}

/* Every field equal, times bit for bit. */
static int same_workload(const wl_workload *a, const wl_workload *b)
{
    if (a->n != b->n)
        return 0;
    for (int32_t i = 0; i < a->n; i++) {
        const wl_conversation *x = &a->conv[i], *y = &b->conv[i];
        if (x->arrival_s != y->arrival_s || x->n_turns != y->n_turns || x->system_tokens != y->system_tokens ||
            !x->system_text != !y->system_text || (x->system_text && strcmp(x->system_text, y->system_text) != 0))
            return 0;
        for (int32_t k = 0; k < x->n_turns; k++) {
            const wl_turn *s = &x->turns[k], *t = &y->turns[k];
            if (s->input_tokens != t->input_tokens || s->output_tokens != t->output_tokens ||
                s->think_s != t->think_s || !s->text != !t->text ||
                (s->text && strcmp(s->text, t->text) != 0))
                return 0;
        }
    }
    return 1;
}

static int64_t context_of(const wl_conversation *c)
{
    int64_t sum = 0;
    for (int32_t k = 0; k < c->n_turns; k++)
        sum += (int64_t)c->turns[k].input_tokens + c->turns[k].output_tokens;
    return sum;
}

/* Shape every generated workload has: turns >= 1, lengths >= 1, no text,
 * no think before the first turn, arrivals increasing from above 0. */
static int well_formed(const wl_workload *w)
{
    double last = 0;
    for (int32_t i = 0; i < w->n; i++) {
        const wl_conversation *c = &w->conv[i];
        if (c->n_turns < 1 || !(c->arrival_s > last) || c->turns[0].think_s != 0)
            return 0;
        last = c->arrival_s;
        for (int32_t k = 0; k < c->n_turns; k++)
            if (c->turns[k].input_tokens < 1 || c->turns[k].output_tokens < 1 || c->turns[k].text ||
                c->turns[k].think_s < 0)
                return 0;
    }
    return 1;
}

static void test_datasets(void)
{
    const wl_dataset_stats *s = wl_dataset_stats_of(WL_SHAREGPT);
    const wl_dataset_stats *u = wl_dataset_stats_of(WL_ULTRACHAT);
    ok(s && strcmp(s->name, "sharegpt") == 0 && s->turns == 5.56 && s->input_tokens == 37.77 &&
           s->output_tokens == 204.58,
       "sharegpt: 5.56 turns, 37.77 in, 204.58 out");
    ok(u && strcmp(u->name, "ultrachat") == 0 && u->turns == 3.86 && u->input_tokens == 51.78 &&
           u->output_tokens == 257.81,
       "ultrachat: 3.86 turns, 51.78 in, 257.81 out");
    ok(wl_dataset_stats_of((wl_dataset)2) == NULL, "no stats past the enum");
    wl_dataset d = WL_SHAREGPT;
    int p1 = wl_dataset_parse("ultrachat", &d);
    wl_dataset d1 = d;
    int p2 = wl_dataset_parse("ShareGPT", &d);
    ok(p1 == 0 && d1 == WL_ULTRACHAT && p2 == 0 && d == WL_SHAREGPT &&
           wl_dataset_parse("lmsys", &d) == -1 && wl_dataset_parse(NULL, &d) == -1 && d == WL_SHAREGPT,
       "dataset names parse, unknown ones are -1 and leave the value");
    wl_options o;
    wl_options_default(&o);
    ok(o.dataset == WL_SHAREGPT && o.seed == 1 && o.n_conversations == 100 && o.rate == 1 &&
           o.think_mean_s == 60 && o.time_scale == 1 && o.length_scale == 1 &&
           o.context_cap == 16384 && o.system_prompt_tokens == 0 && o.system_prompts == 4,
       "defaults: sharegpt, seed 1, 100 conversations, rate 1, think 60, scales 1, cap 16384, no "
       "preamble, 4 to draw from");
}

/* Means of 10,000 conversations; the time and length scales against the
 * unscaled run. */
static void test_means(wl_dataset d)
{
    const wl_dataset_stats *ds = wl_dataset_stats_of(d);
    wl_options o;
    wl_options_default(&o);
    o.dataset = d;
    o.seed = 7;
    o.n_conversations = 10000;
    o.rate = 2;
    o.think_mean_s = 60;
    wl_workload w = {0}, t = {0}, l = {0};
    pv_clear_error();
    if (!ok(wl_generate(&o, &w) == PV_OK, "%s: generates 10,000 conversations: %s", ds->name,
            pv_last_error()))
        return;
    wl_summary s;
    wl_summarise(&w, &s);
    tap_diag("%s: %.4f turns, %.2f in, %.2f out, gap %.4f s, think %.2f s, %lld requests",
             ds->name, s.mean_turns, s.mean_input, s.mean_output, s.mean_gap_s, s.mean_think_s,
             (long long)s.requests);
    ok(s.conversations == 10000 && well_formed(&w), "%s: well formed", ds->name);
    ok(near(s.mean_turns, ds->turns, 0.05), "%s: mean turns %.4f within 5%% of %.2f", ds->name,
       s.mean_turns, ds->turns);
    ok(near(s.mean_input, ds->input_tokens, 0.05), "%s: mean input %.2f within 5%% of %.2f",
       ds->name, s.mean_input, ds->input_tokens);
    ok(near(s.mean_output, ds->output_tokens, 0.05), "%s: mean output %.2f within 5%% of %.2f",
       ds->name, s.mean_output, ds->output_tokens);
    ok(near(s.mean_gap_s, 0.5, 0.05), "%s: mean arrival gap %.4f s within 5%% of 1/rate 0.5",
       ds->name, s.mean_gap_s);
    ok(near(s.mean_think_s, 60, 0.05), "%s: mean think %.2f s within 5%% of 60", ds->name,
       s.mean_think_s);

    o.time_scale = 0.01;
    if (ok(wl_generate(&o, &t) == PV_OK && t.n == w.n, "%s: time_scale 0.01 generates", ds->name)) {
        int same_lengths = 1, scaled = 1;
        for (int32_t i = 0; i < w.n; i++) {
            const wl_conversation *a = &w.conv[i], *b = &t.conv[i];
            if (a->n_turns != b->n_turns) {
                same_lengths = 0;
                break;
            }
            if (b->arrival_s != a->arrival_s * 0.01)
                scaled = 0;
            for (int32_t k = 0; k < a->n_turns; k++) {
                if (a->turns[k].input_tokens != b->turns[k].input_tokens ||
                    a->turns[k].output_tokens != b->turns[k].output_tokens)
                    same_lengths = 0;
                if (b->turns[k].think_s != a->turns[k].think_s * 0.01)
                    scaled = 0;
            }
        }
        ok(same_lengths, "%s: time_scale leaves turns and lengths alone", ds->name);
        ok(scaled, "%s: time_scale 0.01: every arrival and think time is exactly 0.01 x unscaled",
           ds->name);
    }
    o.time_scale = 1;
    o.length_scale = 0.25;
    if (ok(wl_generate(&o, &l) == PV_OK, "%s: length_scale 0.25 generates", ds->name)) {
        wl_summary q;
        wl_summarise(&l, &q);
        tap_diag("%s x0.25: %.4f turns, %.2f in, %.2f out", ds->name, q.mean_turns, q.mean_input,
                 q.mean_output);
        ok(near(q.mean_input, ds->input_tokens / 4, 0.05) &&
               near(q.mean_output, ds->output_tokens / 4, 0.05) &&
               near(q.mean_turns, ds->turns, 0.05) && well_formed(&l),
           "%s: length_scale 0.25: in %.2f, out %.2f within 5%% of %.2f, %.2f", ds->name,
           q.mean_input, q.mean_output, ds->input_tokens / 4, ds->output_tokens / 4);
    }
    wl_free(&w);
    wl_free(&t);
    wl_free(&l);
}

static void test_determinism(void)
{
    wl_options o;
    wl_options_default(&o);
    o.n_conversations = 500;
    o.seed = 42;
    wl_workload a = {0}, b = {0}, c = {0};
    pv_status s1 = wl_generate(&o, &a), s2 = wl_generate(&o, &b);
    o.seed = 43;
    pv_status s3 = wl_generate(&o, &c);
    ok(s1 == PV_OK && s2 == PV_OK && s3 == PV_OK, "three workloads generate");
    ok(same_workload(&a, &b), "seed 42 twice: identical workloads, every field");
    ok(!same_workload(&a, &c), "seed 43 differs from seed 42");
    wl_free(&a);
    wl_free(&b);
    wl_free(&c);
    wl_free(&a); /* zeroed now: a no-op */
    wl_free(NULL);
    ok(a.conv == NULL && a.n == 0, "wl_free zeroes and is a no-op after");
}

/* Whether every conversation o generates is one turn of 1 input and 1
 * output token (a cap that leaves room for no more). */
static int one_turn_of_two(const wl_options *o)
{
    wl_workload w = {0};
    int ones = wl_generate(o, &w) == PV_OK;
    for (int32_t i = 0; ones && i < w.n; i++)
        ones = w.conv[i].n_turns == 1 && w.conv[i].turns[0].input_tokens == 1 &&
               w.conv[i].turns[0].output_tokens == 1;
    wl_free(&w);
    return ones;
}

/* Cap 300 against the same seed with no effective cap: each capped
 * conversation is the longest prefix that fits, its first turn shortened
 * by the documented rule when alone past the cap. */
static void test_cap(void)
{
    wl_options o;
    wl_options_default(&o);
    o.n_conversations = 3000;
    o.seed = 11;
    o.context_cap = INT32_MAX;
    wl_workload ref = {0}, w = {0};
    pv_status s1 = wl_generate(&o, &ref);
    o.context_cap = 300;
    pv_status s2 = wl_generate(&o, &w);
    if (!ok(s1 == PV_OK && s2 == PV_OK && w.n == ref.n, "cap 300 and uncapped generate"))
        return;
    int under = 1, kept = 1, prefix = 1, longest = 1, rule = 1;
    int shortened = 0, cut = 0;
    for (int32_t i = 0; i < w.n; i++) {
        const wl_conversation *c = &w.conv[i], *r = &ref.conv[i];
        if (context_of(c) > 300)
            under = 0;
        if (c->n_turns < 1 || c->n_turns > r->n_turns) {
            kept = 0;
            continue;
        }
        const wl_turn *f = &c->turns[0], *g = &r->turns[0];
        if ((int64_t)g->input_tokens + g->output_tokens > 300) {
            shortened++;
            int32_t out_keep = g->output_tokens < 150 ? g->output_tokens : 150;
            int32_t in = g->input_tokens < 300 - out_keep ? g->input_tokens : 300 - out_keep;
            int32_t out = g->output_tokens < 300 - in ? g->output_tokens : 300 - in;
            if (c->n_turns != 1 || f->input_tokens != in || f->output_tokens != out)
                rule = 0;
        } else if (f->input_tokens != g->input_tokens || f->output_tokens != g->output_tokens) {
            prefix = 0;
        }
        for (int32_t k = 1; k < c->n_turns; k++)
            if (c->turns[k].input_tokens != r->turns[k].input_tokens ||
                c->turns[k].output_tokens != r->turns[k].output_tokens ||
                c->turns[k].think_s != r->turns[k].think_s)
                prefix = 0;
        if (c->n_turns < r->n_turns) {
            cut++;
            const wl_turn *next = &r->turns[c->n_turns];
            if (context_of(c) + next->input_tokens + next->output_tokens <= 300)
                longest = 0;
        }
    }
    tap_diag("cap 300: %d of %d conversations cut short, %d first turns shortened", cut, w.n,
             shortened);
    ok(under, "cap 300: no conversation's context is past 300 tokens");
    ok(kept, "cap 300: every conversation keeps at least one turn");
    ok(prefix, "cap 300: each conversation is a prefix of the uncapped one");
    ok(longest && cut > 0, "cap 300: ends only before the turn that would pass the cap (%d cut)",
       cut);
    ok(rule && shortened > 0,
       "cap 300: a first turn alone past it keeps out min(out, 150), in cut to fit, out to 300 - in "
       "(%d shortened)",
       shortened);
    wl_free(&w);
    o.context_cap = 2;
    ok(one_turn_of_two(&o), "cap 2: every conversation is one turn of 1 input and 1 output token");
    wl_free(&ref);
}

static void refused(const wl_options *o, const char *field, const char *what)
{
    wl_workload w = {(wl_conversation *)&w, 5}; /* must be cleared */
    pv_status st = wl_generate(o, &w);
    ok(st == PV_ERR_INVALID_ARG && strstr(pv_last_error(), field) && w.conv == NULL && w.n == 0,
       "refused %s: %s", what, pv_last_error());
}

static void test_refusals(void)
{
    wl_options d, o;
    wl_options_default(&d);
    o = d, o.n_conversations = 0, refused(&o, "n_conversations = 0", "n_conversations 0");
    o = d, o.n_conversations = -3, refused(&o, "n_conversations = -3", "n_conversations -3");
    o = d, o.rate = 0, refused(&o, "rate = 0", "rate 0");
    o = d, o.rate = -1, refused(&o, "rate = -1", "rate -1");
    o = d, o.rate = NAN, refused(&o, "rate = nan", "rate NaN");
    o = d, o.rate = INFINITY, refused(&o, "rate = inf", "rate inf");
    o = d, o.think_mean_s = -1, refused(&o, "think_mean_s = -1", "think -1");
    o = d, o.think_mean_s = NAN, refused(&o, "think_mean_s = nan", "think NaN");
    o = d, o.time_scale = 0, refused(&o, "time_scale = 0", "time_scale 0");
    o = d, o.time_scale = -0.5, refused(&o, "time_scale = -0.5", "time_scale -0.5");
    o = d, o.length_scale = 0, refused(&o, "length_scale = 0", "length_scale 0");
    o = d, o.length_scale = INFINITY, refused(&o, "length_scale = inf", "length_scale inf");
    o = d, o.context_cap = 1, refused(&o, "context_cap = 1", "context_cap 1");
    o = d, o.dataset = (wl_dataset)9, refused(&o, "dataset = 9", "dataset 9");
    o = d, o.system_prompt_tokens = -1, refused(&o, "system_prompt_tokens = -1", "system_prompt_tokens -1");
    o = d, o.system_prompt_tokens = 16383,
    refused(&o, "system_prompt_tokens = 16383: must be in [0, context_cap - 2 = 16382]",
            "a preamble with no room for a turn under the cap");
    o = d, o.system_prompts = 0, refused(&o, "system_prompts = 0", "system_prompts 0");
    o = d, o.system_prompts = -2, refused(&o, "system_prompts = -2", "system_prompts -2");
    refused(NULL, "NULL", "NULL options");
    o = d, o.think_mean_s = 0;
    wl_workload w = {0};
    int zero = wl_generate(&o, &w) == PV_OK;
    for (int32_t i = 0; zero && i < w.n; i++)
        for (int32_t k = 0; k < w.conv[i].n_turns; k++)
            zero = zero && w.conv[i].turns[k].think_s == 0;
    ok(zero, "think_mean_s 0 is allowed: no think time");
    wl_free(&w);
}

/* ---- shared preambles (issue 28) ------------------------------------------------ */

static uint64_t fnv(uint64_t h, int64_t v)
{
    for (int b = 0; b < 8; b++) {
        h ^= (uint64_t)(v >> (8 * b)) & 0xff;
        h *= UINT64_C(0x100000001B3);
    }
    return h;
}

/* FNV-1a over every conversation's arrival, turns, lengths and think
 * times (times in whole microseconds, so a last-bit difference between
 * libms does not count). */
static uint64_t digest(const wl_workload *w)
{
    uint64_t h = UINT64_C(0xCBF29CE484222325);
    h = fnv(h, w->n);
    for (int32_t i = 0; i < w->n; i++) {
        const wl_conversation *c = &w->conv[i];
        h = fnv(h, llround(c->arrival_s * 1e6));
        h = fnv(h, c->n_turns);
        for (int32_t k = 0; k < c->n_turns; k++) {
            h = fnv(h, c->turns[k].input_tokens);
            h = fnv(h, c->turns[k].output_tokens);
            h = fnv(h, llround(c->turns[k].think_s * 1e6));
        }
    }
    return h;
}

/* Two workloads' digests, recorded from bench/workload.c as it was before
 * preambles (commit 0b94d1b): seed 42, 300 conversations, the defaults;
 * and ultrachat at cap 300, length scale 2, rate 3, time scale 0.1. */
#define DIGEST_DEFAULT UINT64_C(0xe181eeb4687838f9)
#define DIGEST_CAPPED UINT64_C(0x39391baa836c0277)

static int digest_is(const wl_options *o, uint64_t want, const char *what)
{
    wl_workload w = {0};
    pv_status st = wl_generate(o, &w);
    const uint64_t got = st == PV_OK ? digest(&w) : 0;
    int none = 1;
    for (int32_t i = 0; i < w.n; i++)
        none = none && w.conv[i].system_tokens == (o->system_prompt_tokens > 0 ? o->system_prompt_tokens : 0);
    wl_free(&w);
    return ok(st == PV_OK && got == want && none, "%s: digest 0x%016llx, want 0x%016llx", what,
              (unsigned long long)got, (unsigned long long)want);
}

static void test_preamble_workload(void)
{
    wl_options o;
    wl_options_default(&o);
    o.seed = 42;
    o.n_conversations = 300;
    digest_is(&o, DIGEST_DEFAULT, "no preamble: the workload of before preambles");
    wl_options c = o;
    c.dataset = WL_ULTRACHAT;
    c.context_cap = 300;
    c.length_scale = 2;
    c.rate = 3;
    c.time_scale = 0.1;
    digest_is(&c, DIGEST_CAPPED, "no preamble, cap 300: the workload of before preambles");
    /* A preamble takes its tokens off the cap and draws nothing else: with
     * the cap raised by as much, the turns are those of before. */
    o.system_prompt_tokens = 64;
    o.context_cap += 64;
    o.system_prompts = 3;
    digest_is(&o, DIGEST_DEFAULT, "preamble 64, cap 16384 + 64: the same turns, arrivals and thinks");
    c.system_prompt_tokens = 100;
    c.context_cap += 100;
    digest_is(&c, DIGEST_CAPPED, "preamble 100, cap 300 + 100: the same turns, cut where they were");

    /* The choice: uniform over the preambles, per conversation, and not
     * moved by how many conversations there are. */
    wl_options u;
    wl_options_default(&u);
    u.seed = 5;
    u.n_conversations = 4000;
    u.system_prompt_tokens = 200;
    u.system_prompts = 4;
    u.context_cap = 1000;
    wl_workload w = {0}, few = {0};
    pv_clear_error();
    if (!ok(wl_generate(&u, &w) == PV_OK, "4,000 conversations with a preamble of 200 tokens: %s",
            pv_last_error()))
        return;
    int counts[4] = {0}, in_range = 1, under = 1;
    for (int32_t i = 0; i < w.n; i++) {
        const wl_conversation *cv = &w.conv[i];
        in_range = in_range && cv->system_tokens == 200 && cv->system_prompt >= 0 && cv->system_prompt < 4;
        if (in_range)
            counts[cv->system_prompt]++;
        under = under && cv->n_turns >= 1 && 200 + context_of(cv) <= 1000;
    }
    ok(in_range, "every conversation has a preamble of 200 tokens, one of 4");
    ok(under, "cap 1000: the preamble and the turns fit under it");
    int even = 1;
    for (int k = 0; k < 4; k++)
        even = even && near(counts[k], 1000, 0.1);
    ok(even, "the 4 preambles drawn about 1,000 times each: %d %d %d %d", counts[0], counts[1], counts[2],
       counts[3]);
    u.n_conversations = 50;
    int same = wl_generate(&u, &few) == PV_OK;
    for (int32_t i = 0; same && i < few.n; i++)
        same = few.conv[i].system_prompt == w.conv[i].system_prompt;
    ok(same, "50 conversations draw the preambles the first 50 of 4,000 drew");
    wl_free(&few);
    wl_free(&w);

    /* The whole cap but two tokens: every conversation one turn of 1 + 1. */
    u.system_prompt_tokens = 998;
    ok(one_turn_of_two(&u), "preamble 998 under cap 1000: one turn of 1 input and 1 output token each");

    wl_options r;
    wl_options_default(&r);
    r.system_prompt_tokens = 10;
    pv_status st = wl_load_jsonl("/nonexistent/pv-workload.jsonl", &r, NULL, NULL, &w);
    ok(st == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "system_prompt_tokens = 10") &&
           strstr(pv_last_error(), "replay") && w.n == 0,
       "a replay refuses a preamble: %s", pv_last_error());
}

/* The first position where a and b differ, n if none. */
static int32_t first_difference(const int32_t *a, const int32_t *b, int32_t n)
{
    int32_t k = 0;
    while (k < n && a[k] == b[k])
        k++;
    return k;
}

/* The in-process driver's prompts (bi_prompt_ids): a first turn is its
 * preamble's ids then the message's; conversations that drew the same
 * preamble start with the same ids, different preambles differ within
 * the first chunk (32 tokens: no full chunk in common); later turns and
 * conversations without a preamble are the message alone, its ids drawn
 * from the run's stream as before preambles. */
static void test_preamble_ids(void)
{
    enum { N = 80, VOCAB = 49152 };
    wl_options o;
    wl_options_default(&o);
    o.seed = 9;
    o.n_conversations = 40;
    o.system_prompt_tokens = N;
    o.system_prompts = 3;
    wl_workload w = {0};
    if (!ok(wl_generate(&o, &w) == PV_OK, "40 conversations with 3 preambles of 80 tokens"))
        return;
    int32_t first[40][N];
    int32_t *ids = NULL;
    size_t n = 0;
    uint64_t rng = 123;
    int shaped = 1, later = 1, ranged = 1;
    for (int32_t i = 0; i < w.n && shaped; i++) {
        const wl_conversation *c = &w.conv[i];
        shaped = bi_prompt_ids(c, 0, o.seed, VOCAB, &rng, &ids, &n) == PV_OK &&
                 n == (size_t)N + (size_t)c->turns[0].input_tokens;
        if (!shaped)
            break;
        memcpy(first[i], ids, sizeof first[i]);
        for (size_t k = 0; k < n; k++)
            ranged = ranged && ids[k] >= VOCAB / 4 && ids[k] < VOCAB / 4 + VOCAB / 2;
        for (int32_t t = 1; t < c->n_turns && later; t++)
            later = bi_prompt_ids(c, t, o.seed, VOCAB, &rng, &ids, &n) == PV_OK &&
                    n == (size_t)c->turns[t].input_tokens;
    }
    ok(shaped, "a first turn is 80 preamble ids and its message's");
    ok(later, "a later turn is its message alone: the preamble is already in the history");
    ok(ranged, "every id in the vocabulary's middle half");
    int same = 1, differ = 1, pairs_same = 0, pairs_differ = 0;
    for (int32_t i = 0; shaped && i < w.n; i++)
        for (int32_t j = i + 1; j < w.n; j++) {
            const int32_t at = first_difference(first[i], first[j], N);
            if (w.conv[i].system_prompt == w.conv[j].system_prompt) {
                same = same && at == N;
                pairs_same++;
            } else {
                differ = differ && at < 32;
                pairs_differ++;
            }
        }
    ok(shaped && same && pairs_same > 0,
       "conversations that drew the same preamble send the same 80 ids first (%d pairs)", pairs_same);
    ok(shaped && differ && pairs_differ > 0,
       "different preambles differ within the first 32 ids (%d pairs)", pairs_differ);
    int32_t again[N], other[N];
    wl_system_prompt_ids(o.seed, w.conv[0].system_prompt, N, VOCAB, again);
    wl_system_prompt_ids(o.seed + 1, w.conv[0].system_prompt, N, VOCAB, other);
    ok(shaped && memcmp(again, first[0], sizeof again) == 0 && first_difference(again, other, N) < 32,
       "a preamble is a function of the seed and its index: the same again, another seed another");

    /* Without a preamble: the message's ids exactly as drawn before. */
    wl_conversation plain = w.conv[0];
    plain.system_tokens = 0;
    rng = 77;
    uint64_t ref = 77;
    int before = bi_prompt_ids(&plain, 0, o.seed, VOCAB, &rng, &ids, &n) == PV_OK &&
                 n == (size_t)plain.turns[0].input_tokens;
    for (size_t k = 0; before && k < n; k++)
        before = ids[k] == (int32_t)(VOCAB / 4 + wl_splitmix64(&ref) % (VOCAB / 2));
    ok(before && rng == ref, "no preamble: the message's ids, drawn from the run's stream as before");
    free(ids);
    wl_free(&w);
}

/* ---- JSONL replay ---------------------------------------------------------- */

static char paths[16][64];
static int n_paths;

/* A temporary file holding `text`; its path (unlinked at the end). */
static const char *temp_file(const char *text)
{
    char *p = paths[n_paths++];
    snprintf(p, sizeof paths[0], "/tmp/pv-workload-XXXXXX");
    int fd = mkstemp(p);
    if (fd < 0)
        return "/nonexistent/mkstemp-failed";
    size_t n = strlen(text);
    if (write(fd, text, n) != (ssize_t)n)
        tap_diag("short write to %s", p);
    close(fd);
    return p;
}

static int word_calls;

/* Tokens as whitespace-separated words. */
static int32_t count_words(void *ctx, const char *text)
{
    int *calls = ctx;
    (*calls)++;
    int32_t n = 0;
    for (int in = 0; *text; text++) {
        int sp = isspace((unsigned char)*text);
        n += !sp && !in;
        in = !sp;
    }
    return n;
}

static int turn_is(const wl_conversation *c, int k, int32_t in, int32_t out, const char *text)
{
    if (k >= c->n_turns)
        return 0;
    const wl_turn *t = &c->turns[k];
    int good = t->input_tokens == in && t->output_tokens == out && t->text &&
               strcmp(t->text, text) == 0;
    if (!good)
        tap_diag("turn %d: %d in, %d out, \"%s\"; want %d, %d, \"%s\"", k, t->input_tokens,
                 t->output_tokens, t->text ? t->text : "(null)", in, out, text);
    return good;
}

static const char good_file[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
    "{\"role\":\"user\",\"content\":\"hello there\"},"
    "{\"role\":\"assistant\",\"content\":\"hi how are you\"},"
    "{\"role\":\"user\",\"content\":\"fine thanks\"},{\"role\":\"assistant\",\"content\":\"good\"}]}\n"
    "\n"
    "   \t\n"
    "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"look at\"},"
    "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}},"
    "{\"type\":\"text\",\"text\":\"this picture now\"}]},"
    "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"a cat\"}]}]}\n"
    "{\"messages\":[{\"role\":\"user\",\"content\":\"one two three\"},"
    "{\"role\":\"assistant\",\"content\":\"four five\"},"
    "{\"role\":\"user\",\"content\":\"unanswered question here please\"}]}";

static void test_replay_good(void)
{
    const char *path = temp_file(good_file);
    wl_options o;
    wl_options_default(&o);
    o.seed = 7;
    o.rate = 2;
    o.n_conversations = 0;
    wl_workload w = {0}, g = {0};
    word_calls = 0;
    pv_clear_error();
    pv_status st = wl_load_jsonl(path, &o, count_words, &word_calls, &w);
    if (!ok(st == PV_OK && w.n == 3, "good file: 3 conversations (%s)", pv_last_error()))
        return;
    ok(w.conv[0].n_turns == 2 && w.conv[1].n_turns == 1 && w.conv[2].n_turns == 2,
       "turns: 2 (the system message is no turn), 1, 2 (got %d, %d, %d)", w.conv[0].n_turns,
       w.conv[1].n_turns, w.conv[2].n_turns);
    ok(w.conv[0].system_text && strcmp(w.conv[0].system_text, "be brief") == 0 && w.conv[0].system_tokens == 2,
       "conversation 1: its system message is its system text, 2 words (\"%s\", %d)",
       w.conv[0].system_text ? w.conv[0].system_text : "(null)", w.conv[0].system_tokens);
    ok(!w.conv[1].system_text && w.conv[1].system_tokens == 0 && !w.conv[2].system_text &&
           w.conv[2].system_tokens == 0,
       "conversations without a system message have no system text (%d, %d tokens)", w.conv[1].system_tokens,
       w.conv[2].system_tokens);
    ok(turn_is(&w.conv[0], 0, 2, 4, "hello there") && turn_is(&w.conv[0], 1, 2, 1, "fine thanks"),
       "conversation 1: texts and word counts, answers give the outputs");
    ok(turn_is(&w.conv[1], 0, 5, 2, "look at\nthis picture now"),
       "conversation 2: text parts joined with a newline, the image part skipped");
    ok(turn_is(&w.conv[2], 0, 3, 2, "one two three") &&
           turn_is(&w.conv[2], 1, 4, 205, "unanswered question here please"),
       "conversation 3: the unanswered turn gets sharegpt's mean output, 205");
    ok(word_calls == 10, "the counter saw the 9 user and assistant messages and the system text (%d calls)",
       word_calls);
    /* Same seed and rate: the arrivals and think times of a generated run. */
    o.n_conversations = 3;
    int same_times = wl_generate(&o, &g) == PV_OK;
    for (int32_t i = 0; same_times && i < 3; i++) {
        same_times = w.conv[i].arrival_s == g.conv[i].arrival_s && w.conv[i].turns[0].think_s == 0;
        for (int32_t k = 1; k < w.conv[i].n_turns && k < g.conv[i].n_turns; k++)
            same_times = same_times && w.conv[i].turns[k].think_s == g.conv[i].turns[k].think_s;
    }
    ok(same_times && w.conv[2].turns[1].think_s > 0,
       "replay arrivals and think times are those of wl_generate with the same seed");
    wl_free(&w);
    wl_free(&g);

    o.n_conversations = 2;
    st = wl_load_jsonl(path, &o, NULL, NULL, &w);
    ok(st == PV_OK && w.n == 2 && turn_is(&w.conv[0], 0, 3, 4, "hello there") &&
           turn_is(&w.conv[1], 0, 6, 2, "look at\nthis picture now"),
       "n_conversations 2 reads two; without a counter tokens are ceil(bytes / 4)");
    wl_free(&w);

    o.n_conversations = 0;
    o.dataset = WL_ULTRACHAT;
    o.length_scale = 0.5;
    o.context_cap = 6;
    st = wl_load_jsonl(path, &o, count_words, &word_calls, &w);
    ok(st == PV_OK && w.n == 3 && w.conv[0].n_turns == 1 && turn_is(&w.conv[0], 0, 2, 2, "hello there") &&
           w.conv[2].n_turns == 1,
       "cap 6: conversations stop before the turn past it; the system text's 2 words count, so the "
       "first turn's 4-word answer is cut to 2");
    wl_free(&w);
    o.context_cap = 16384;
    st = wl_load_jsonl(path, &o, count_words, &word_calls, &w);
    ok(st == PV_OK && w.n == 3 && turn_is(&w.conv[2], 1, 4, 129, "unanswered question here please"),
       "ultrachat x0.5: the unanswered turn gets round(257.81 * 0.5) = 129");
    wl_free(&w);
}

/* A file that must be PV_ERR_FORMAT with a message naming path:line. */
static void bad_file(const char *text, int line, const char *says, const char *what)
{
    const char *path = temp_file(text);
    wl_options o;
    wl_options_default(&o);
    o.n_conversations = 0;
    wl_workload w = {(wl_conversation *)&w, 5};
    pv_status st = wl_load_jsonl(path, &o, count_words, &word_calls, &w);
    char where[128];
    snprintf(where, sizeof where, "%s:%d:", path, line);
    ok(st == PV_ERR_FORMAT && strstr(pv_last_error(), where) && strstr(pv_last_error(), says) &&
           w.conv == NULL && w.n == 0,
       "%s: refused naming line %d: %s", what, line, pv_last_error());
}

#define GOOD_LINE "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n"

static void test_replay_bad(void)
{
    bad_file(GOOD_LINE "{\"messages\": [\n" GOOD_LINE, 2, "not JSON", "not JSON on line 2");
    bad_file(GOOD_LINE "\n{\"msgs\":[]}\n", 3, "no \"messages\"", "no messages array");
    bad_file(GOOD_LINE "{\"messages\":\"hi\"}\n", 2, "no \"messages\"", "messages not an array");
    bad_file(GOOD_LINE GOOD_LINE "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                                 "{\"content\":\"b\"}]}\n",
             3, "message 1 has no \"role\"", "a message without role");
    bad_file("{\"messages\":[{\"role\":\"user\"}]}\n", 1, "no \"content\"",
             "a message without content");
    bad_file("{\"messages\":[{\"role\":\"user\",\"content\":7}]}\n", 1, "no \"content\"",
             "content a number");
    bad_file(GOOD_LINE "{\"messages\":[{\"role\":\"system\",\"content\":\"x\"},"
                       "{\"role\":\"assistant\",\"content\":\"y\"}]}\n",
             2, "no user message", "a conversation with no user message");
    bad_file("{\"messages\":[{\"role\":\"human\",\"content\":\"x\"}]}\n", 1, "unknown role",
             "an unknown role");
    bad_file("[1, 2]\n", 1, "no \"messages\"", "a line that is not an object");

    const char *path = temp_file("\n  \n");
    wl_options o;
    wl_options_default(&o);
    wl_workload w = {0};
    pv_status st = wl_load_jsonl(path, &o, NULL, NULL, &w);
    ok(st == PV_ERR_FORMAT && strstr(pv_last_error(), "no conversation") && w.n == 0,
       "a file of blank lines: no conversation: %s", pv_last_error());
    st = wl_load_jsonl("/nonexistent/pv-workload.jsonl", &o, NULL, NULL, &w);
    ok(st == PV_ERR_IO && strstr(pv_last_error(), "/nonexistent/pv-workload.jsonl") && w.n == 0,
       "a missing file: PV_ERR_IO: %s", pv_last_error());
    o.rate = -2;
    st = wl_load_jsonl(path, &o, NULL, NULL, &w);
    ok(st == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "rate = -2"),
       "replay checks the options too: %s", pv_last_error());
}

/* System messages (and developer ones, OpenAI's newer name for them):
 * every one, wherever it is, joined in file order as the
 * conversation's system text, counted under the cap; the turns are those
 * of the same conversation without them; the in-process driver sends the
 * text as a system message before the first turn's only. */
static void test_replay_system(void)
{
    static const char with[] =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"you are terse\"},"
        "{\"role\":\"developer\",\"content\":\"briefly\"},"
        "{\"role\":\"user\",\"content\":\"hello there\"},{\"role\":\"assistant\",\"content\":\"hi\"},"
        "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"and polite\"}]},"
        "{\"role\":\"user\",\"content\":\"bye now\"},{\"role\":\"assistant\",\"content\":\"bye\"}]}\n"
        "{\"messages\":[{\"role\":\"user\",\"content\":\"no system here\"}]}\n";
    static const char without[] =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hello there\"},{\"role\":\"assistant\",\"content\":\"hi\"},"
        "{\"role\":\"user\",\"content\":\"bye now\"},{\"role\":\"assistant\",\"content\":\"bye\"}]}\n"
        "{\"messages\":[{\"role\":\"user\",\"content\":\"no system here\"}]}\n";
    wl_options o;
    wl_options_default(&o);
    o.n_conversations = 0;
    wl_workload w = {0}, plain = {0};
    pv_clear_error();
    pv_status st = wl_load_jsonl(temp_file(with), &o, count_words, &word_calls, &w);
    pv_status sp = wl_load_jsonl(temp_file(without), &o, count_words, &word_calls, &plain);
    if (!ok(st == PV_OK && sp == PV_OK && w.n == 2 && plain.n == 2, "files with and without system messages load (%s)",
            pv_last_error()))
        return;
    const wl_conversation *c = &w.conv[0];
    ok(c->system_text && strcmp(c->system_text, "you are terse\nbriefly\nand polite") == 0 && c->system_tokens == 6,
       "the system messages and the developer one (pensieve-serve reads it as system), the last after a turn, "
       "joined in order (\"%s\", %d tokens)",
       c->system_text ? c->system_text : "(null)", c->system_tokens);
    /* Alike but for the system text: the same turns, times and arrivals. */
    wl_workload bare = w;
    wl_conversation bare_conv[2] = {w.conv[0], w.conv[1]};
    bare_conv[0].system_text = NULL;
    bare_conv[0].system_tokens = 0;
    bare.conv = bare_conv;
    ok(same_workload(&bare, &plain) && !w.conv[1].system_text,
       "the turns, think times and arrivals are those of the file without them; a conversation without one is "
       "unchanged");
    pv_chat_message m[2];
    const size_t n0 = bi_turn_messages(c, 0, m);
    ok(n0 == 2 && strcmp(m[0].role, "system") == 0 && m[0].content == c->system_text &&
           strcmp(m[1].role, "user") == 0 && strcmp(m[1].content, "hello there") == 0,
       "in process, the first turn sends the system text, then the user's message (%zu messages)", n0);
    const size_t n1 = bi_turn_messages(c, 1, m), n_other = n1 == 1 ? bi_turn_messages(&w.conv[1], 0, m) : 0;
    ok(n1 == 1 && n_other == 1 && strcmp(m[0].role, "user") == 0 && strcmp(m[0].content, "no system here") == 0,
       "a later turn sends only its message (the session has the rest); so does a conversation without one");
    wl_free(&w);
    wl_free(&plain);

    /* The cap: the 6 words leave 3 of a cap of 9, which the first turn (2
     * in, 1 out) fills: the second is not sent. Past cap - 2, refused. */
    o.context_cap = 9;
    st = wl_load_jsonl(temp_file(with), &o, count_words, &word_calls, &w);
    ok(st == PV_OK && w.n == 2 && w.conv[0].n_turns == 1 && turn_is(&w.conv[0], 0, 2, 1, "hello there"),
       "cap 9: the system text's 6 words count against it (%s)", pv_last_error());
    wl_free(&w);
    o.context_cap = 7;
    const char *path = temp_file(with);
    st = wl_load_jsonl(path, &o, count_words, &word_calls, &w);
    char where[128];
    snprintf(where, sizeof where, "%s:1:", path);
    ok(st == PV_ERR_FORMAT && strstr(pv_last_error(), where) && strstr(pv_last_error(), "6 tokens") &&
           strstr(pv_last_error(), "cap of 7") && w.n == 0,
       "cap 7: system text past cap - 2 is refused naming path:line: %s", pv_last_error());
}

static int32_t count_negative(void *ctx, const char *text)
{
    return -1;
}

int main(void)
{
    test_datasets();
    test_means(WL_SHAREGPT);
    test_means(WL_ULTRACHAT);
    test_determinism();
    test_cap();
    test_refusals();
    test_preamble_workload();
    test_preamble_ids();
    test_replay_good();
    test_replay_bad();
    test_replay_system();
    wl_options o;
    wl_options_default(&o);
    wl_workload w = {0};
    pv_status st = wl_load_jsonl(temp_file(GOOD_LINE), &o, count_negative, NULL, &w);
    ok(st == PV_ERR_INVALID_ARG && strstr(pv_last_error(), ":1:") && w.n == 0,
       "a negative token count is refused naming the line: %s", pv_last_error());
    for (int i = 0; i < n_paths; i++)
        unlink(paths[i]);
    return tap_done();
}
