/* Logit bias through the engine (pv_sampling.bias_tokens/bias_values):
 * copied and checked at pv_engine_submit, handed to pv_sample_batch as the
 * step's per-row lists.
 *
 * The oracle for greedy turns is a brute-force generation with the model
 * API: the prompt in one forward pass, then one token a pass, host logits,
 * the bias applied here as backend.h documents it (f32 addition, -100 and
 * below bans), the lowest index of the maximum. A turn alone in the engine
 * runs the very same passes, so its tokens must be the reference's. Then:
 * a ban (-100) on the first unbiased token, a mixed list whose soft entries
 * change the answer, +100 forcing every token, four turns at once with
 * different biases (each row its own request's list: a turn's tokens are
 * its turn alone's) in pensieve and stateless modes and with decode_steps
 * 1 and 3 (sampling into the device buffer of chained steps), seeded
 * sampled turns whose bans hold, the copy made at submit, and every
 * refusal. Synthetic model on the CPU backend, and on OpenCL where
 * present. */
#include "engine-util.h"

#include <inttypes.h>
#include <math.h>

#define LAYERS 2
#define CHUNK 8
#define N_CTX 256
#define GEN 12
#define MAX_ENTRIES 8
#define SESSIONS 4
#define ROUNDS 2

static eu_model M;

typedef struct bias_list {
    int32_t tok[MAX_ENTRIES];
    float val[MAX_ENTRIES];
    size_t n;
} bias_list;

static void bias_add(bias_list *b, int32_t token, float value)
{
    b->tok[b->n] = token;
    b->val[b->n] = value;
    b->n++;
}

/* The lowest index of the maximum of the biased logits (backend.h's
 * pv_sample_batch_args). */
static int32_t biased_argmax(const float *logits, uint32_t n_vocab, const bias_list *b)
{
    int32_t best = -1;
    float best_v = -INFINITY;
    for (uint32_t c = 0; c < n_vocab; c++) {
        float v = logits[c];
        for (size_t k = 0; b && k < b->n; k++)
            if (b->tok[k] == (int32_t)c)
                v = b->val[k] <= PV_LOGIT_BIAS_BAN ? -INFINITY : logits[c] + b->val[k];
        if (best < 0 || v > best_v) {
            best = (int32_t)c;
            best_v = v;
        }
    }
    return best;
}

/* n_gen greedy tokens after prompt with bias b (NULL: none), brute force:
 * the prompt in one pass, then each token in a pass of its own, as the
 * engine runs a turn alone. */
static pv_status reference(const int32_t *prompt, int n_prompt, const bias_list *b, int n_gen, int32_t *out)
{
    const uint32_t V = M.tok.n_vocab;
    const int total = n_prompt + n_gen, chunks = (total + CHUNK - 1) / CHUNK;
    pv_buffer *pool = NULL;
    int32_t *tables = malloc(sizeof *tables * LAYERS * (size_t)chunks);
    float *logits = malloc(sizeof *logits * V);
    pv_status st = pv_buffer_init(&pool, M.be, PV_MEM_DEVICE, (uint64_t)LAYERS * chunks * pv_llama_slot_bytes(M.model));
    if (st == PV_OK && (!tables || !logits))
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "reference: tables and logits");
    int32_t tokens[128], seq[128], pos[128];
    for (int g = 0, at = 0; g < n_gen && st == PV_OK; g++) {
        const int n = g == 0 ? n_prompt : 1;
        for (int i = 0; i < n; i++) {
            tokens[i] = g == 0 ? prompt[i] : out[g - 1];
            seq[i] = 0;
            pos[i] = at + i;
        }
        at += n;
        const int32_t mc = (at + CHUNK - 1) / CHUNK, last = n - 1;
        for (int l = 0; l < LAYERS; l++)
            for (int c = 0; c < mc; c++)
                tables[l * mc + c] = l * chunks + c;
        pv_llama_batch batch = {
            .n_tokens = n, .tokens = tokens, .token_seq = seq, .token_pos = pos, .n_seqs = 1, .max_chunks = mc,
            .slot_tables = tables, .kv_pool = pool, .n_slots = (int64_t)LAYERS * chunks,
            .n_logits = 1, .logit_rows = &last, .logits = logits,
        };
        if ((st = pv_llama_forward(M.model, &batch)) == PV_OK)
            out[g] = biased_argmax(logits, V, b);
    }
    pv_buffer_free(pool);
    free(tables);
    free(logits);
    return st;
}

/* One turn of a run: its session, prompt, sampling and bias. */
typedef struct turn_spec {
    const char *session;
    int32_t prompt[40];
    int n_prompt;
    float temperature;      /* 0: greedy */
    uint64_t seed;
    const bias_list *bias;  /* NULL: none */
} turn_spec;

static void spec_sampling(const turn_spec *t, pv_sampling *s)
{
    pv_sampling_defaults(s);
    s->max_tokens = GEN;
    s->ignore_eos = 1;
    s->temperature = t->temperature;
    s->seed = t->seed;
    if (t->bias) {
        s->bias_tokens = t->bias->tok;
        s->bias_values = t->bias->val;
        s->n_bias = t->bias->n;
    }
}

typedef struct run_info {
    int check_failures;
    char first_failure[256];
    uint64_t chained;
} run_info;

/* Rounds of turns on a fresh engine: specs[round * n + i]; a round's turns
 * are submitted together and stepped to the end, pv_engine_check after
 * every step. */
static pv_status run(pv_engine_mode mode, int32_t decode_steps, const turn_spec *specs, int n, int rounds,
                     eu_result *out, run_info *info)
{
    memset(out, 0, sizeof *out * (size_t)(n * rounds));
    memset(info, 0, sizeof *info);
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = 512 * pv_llama_slot_bytes(M.model);
    cc.host_bytes = 64 * pv_llama_slot_bytes(M.model);
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    ec.mode = mode;
    ec.decode_steps = decode_steps;
    pv_engine *e = NULL;
    pv_status st = pv_engine_init(&e, M.be, M.model, &M.tok, &cc, &ec);
    for (int round = 0; round < rounds && st == PV_OK; round++) {
        for (int i = 0; i < n && st == PV_OK; i++) {
            const turn_spec *t = &specs[round * n + i];
            pv_turn turn = {.tokens = t->prompt, .n_tokens = (size_t)t->n_prompt};
            spec_sampling(t, &turn.sampling);
            pv_turn_callbacks cb = {eu_on_token, eu_on_done, &out[round * n + i]};
            st = pv_engine_submit(e, t->session, &turn, &cb, NULL);
        }
        if (st == PV_OK)
            st = eu_drain(e, &info->check_failures, info->first_failure, sizeof info->first_failure, NULL);
    }
    if (e) {
        pv_engine_stats es;
        pv_engine_stats_get(e, &es);
        info->chained = es.chained_iterations;
    }
    pv_engine_free(e);
    return st;
}

/* One turn alone, greedy unless said otherwise, on a fresh pensieve engine. */
static pv_status alone(const turn_spec *t, eu_result *out)
{
    run_info info;
    pv_status st = run(PV_MODE_PENSIEVE, 1, t, 1, 1, out, &info);
    if (st == PV_OK && (out->done != 1 || out->status != PV_OK))
        st = pv_error(PV_ERR_STATE, "the turn ended %d times, status %d", out->done, (int)out->status);
    return st;
}

static int same_tokens(const eu_result *r, const int32_t *want, int n)
{
    return r->done == 1 && r->status == PV_OK && r->n == n && memcmp(r->tokens, want, sizeof *want * (size_t)n) == 0;
}

static int count_token(const eu_result *r, int32_t token)
{
    int c = 0;
    for (int i = 0; i < r->n; i++)
        c += r->tokens[i] == token;
    return c;
}

static void show(const char *what, const int32_t *t, int n)
{
    char line[512];
    size_t at = 0;
    for (int i = 0; i < n && at < sizeof line - 16; i++)
        at += (size_t)snprintf(line + at, sizeof line - at, " %d", t[i]);
    tap_diag("%s:%s", what, line);
}

static void make_prompt(turn_spec *t, uint64_t seed, int len)
{
    uint64_t x = seed;
    t->n_prompt = len;
    for (int i = 0; i < len; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        t->prompt[i] = 3 + (int32_t)((x >> 33) % (M.tok.n_vocab - 3));
    }
}

/* The greedy checks against the brute-force reference. mixed and force
 * are filled for the concurrent runs. */
static int greedy_against_reference(const char *be, const turn_spec *base, bias_list *ban, bias_list *mixed,
                                    bias_list *force)
{
    int32_t want[GEN], banned_ref[GEN], mixed_ref[GEN];
    eu_result got;
    turn_spec t = *base;
    pv_status st = reference(t.prompt, t.n_prompt, NULL, GEN, want);
    if (st == PV_OK)
        st = alone(&t, &got);
    if (!ok(st == PV_OK && same_tokens(&got, want, GEN),
            "%s: a greedy turn without bias gives the brute-force reference's tokens (%s)", be,
            st == PV_OK ? "ok" : pv_last_error())) {
        show("engine", got.tokens, got.n);
        show("reference", want, GEN);
        return 0;
    }
    const int32_t first = want[0];

    /* -100 on the first token the unbiased turn generates. */
    memset(ban, 0, sizeof *ban);
    bias_add(ban, first, -100.0f);
    t.bias = ban;
    st = reference(t.prompt, t.n_prompt, ban, GEN, banned_ref);
    if (st == PV_OK)
        st = alone(&t, &got);
    ok(st == PV_OK && count_token(&got, first) == 0 && got.n == GEN && got.tokens[0] != first,
       "%s: with bias -100 on token %d (the unbiased turn's first) the turn never generates it (%d times)", be, first,
       count_token(&got, first));
    if (!ok(st == PV_OK && same_tokens(&got, banned_ref, GEN),
            "%s: ... and its tokens are the reference's with the ban (%s)", be, st == PV_OK ? "ok" : pv_last_error())) {
        show("engine", got.tokens, got.n);
        show("reference", banned_ref, GEN);
    }

    /* Soft entries that change the answer: -2.5 on the banned turn's first
     * token, +1.5 on the first token (tried in order) that then changes the
     * reference; a planted sign error or dropped soft entry shows. */
    memset(mixed, 0, sizeof *mixed);
    bias_add(mixed, first, -100.0f);
    bias_add(mixed, banned_ref[0], -2.5f);
    int changed = 0;
    for (int32_t cand = 3; cand < 3 + 64 && st == PV_OK && !changed; cand++) {
        if (cand == first || cand == banned_ref[0])
            continue;
        mixed->n = 2;
        bias_add(mixed, cand, 1.5f);
        st = reference(t.prompt, t.n_prompt, mixed, GEN, mixed_ref);
        changed = memcmp(mixed_ref, banned_ref, sizeof mixed_ref) != 0 && mixed_ref[0] != banned_ref[0];
    }
    t.bias = mixed;
    if (st == PV_OK && changed)
        st = alone(&t, &got);
    if (!ok(st == PV_OK && changed && same_tokens(&got, mixed_ref, GEN),
            "%s: a mixed bias {%d: -100, %d: -2.5, %d: +1.5} gives the reference's tokens, which differ from the "
            "ban alone's (%s)",
            be, mixed->tok[0], mixed->tok[1], mixed->tok[2], st != PV_OK ? pv_last_error() : changed ? "ok" : "no "
            "candidate changed the reference")) {
        show("engine", got.tokens, got.n);
        show("reference", mixed_ref, GEN);
    }

    /* +100 on a token the unbiased turn never says: every token is it. */
    int32_t forced = 3;
    for (int i = 0; i < GEN; i++)
        if (want[i] == forced) {
            forced++;
            i = -1; /* check the next candidate against every token */
        }
    memset(force, 0, sizeof *force);
    bias_add(force, forced, 100.0f);
    t.bias = force;
    st = alone(&t, &got);
    ok(st == PV_OK && got.n == GEN && count_token(&got, forced) == GEN,
       "%s: with bias +100 on token %d every greedy token is it (%d of %d)", be, forced, count_token(&got, forced),
       got.n);
    return 1;
}

/* Four sessions at once, two rounds: a forced token, no bias, the mixed
 * list (greedy) and a sampled turn with bans. Each in pensieve mode with
 * decode_steps 1 is checked against its own turn alone (the rows map to
 * their requests); then stateless mode and decode_steps 3 must give the
 * same tokens. */
static void concurrent(const char *be, const turn_spec *base, const bias_list *mixed, const bias_list *force)
{
    static turn_spec specs[ROUNDS * SESSIONS];
    static eu_result ref[ROUNDS * SESSIONS], got[ROUNDS * SESSIONS], solo[ROUNDS];
    static const char *const names[SESSIONS] = {"force", "plain", "mixed", "sampled"};
    for (int r = 0; r < ROUNDS; r++)
        for (int s = 0; s < SESSIONS; s++) {
            turn_spec *t = &specs[r * SESSIONS + s];
            memset(t, 0, sizeof *t);
            t->session = names[s];
            make_prompt(t, 77 + (uint64_t)(r * SESSIONS + s), 6 + 5 * s + 3 * r);
            if (r == 0 && s == 2)
                *t = *base; /* the mixed list's own prompt */
            t->session = names[s];
        }
    /* The sampled session's bans: the tokens its unbiased turns draw most. */
    static bias_list sampled_bias;
    memset(&sampled_bias, 0, sizeof sampled_bias);
    for (int r = 0; r < ROUNDS; r++) {
        specs[r * SESSIONS + 0].bias = force;
        specs[r * SESSIONS + 2].bias = mixed;
        specs[r * SESSIONS + 3].temperature = 1.0f;
        specs[r * SESSIONS + 3].seed = 4242 + (uint64_t)r;
    }
    turn_spec sampled_pair[ROUNDS] = {specs[3], specs[SESSIONS + 3]};
    run_info info;
    pv_status st = run(PV_MODE_PENSIEVE, 1, sampled_pair, 1, ROUNDS, solo, &info);
    const int32_t soft = 5; /* and +2 on this one */
    int *counts = calloc(M.tok.n_vocab, sizeof *counts);
    if (!counts && st == PV_OK)
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "token counts");
    for (int r = 0; r < ROUNDS && st == PV_OK; r++)
        for (int i = 0; i < solo[r].n; i++)
            counts[solo[r].tokens[i]] += solo[r].tokens[i] != soft;
    for (int k = 0; k < 4 && st == PV_OK; k++) {
        int32_t best = 0;
        for (int32_t c = 1; c < (int32_t)M.tok.n_vocab; c++)
            if (counts[c] > counts[best])
                best = c;
        if (counts[best] == 0)
            break;
        bias_add(&sampled_bias, best, -100.0f);
        counts[best] = 0;
    }
    free(counts);
    bias_add(&sampled_bias, soft, 2.0f);
    for (int r = 0; r < ROUNDS; r++)
        specs[r * SESSIONS + 3].bias = &sampled_bias;

    if (st == PV_OK)
        st = run(PV_MODE_PENSIEVE, 1, specs, SESSIONS, ROUNDS, ref, &info);
    if (!ok(st == PV_OK && info.check_failures == 0, "%s: four biased sessions at once, two rounds (%s%s)", be,
            st == PV_OK ? "ok" : pv_last_error(), info.first_failure))
        return;

    /* Each session against itself alone: the rows took their own lists. */
    int alone_same = 0;
    for (int s = 0; s < SESSIONS && st == PV_OK; s++) {
        turn_spec pair[ROUNDS] = {specs[s], specs[SESSIONS + s]};
        st = run(PV_MODE_PENSIEVE, 1, pair, 1, ROUNDS, solo, &info);
        int same = 1;
        for (int r = 0; r < ROUNDS; r++)
            same &= same_tokens(&ref[r * SESSIONS + s], solo[r].tokens, solo[r].n) && solo[r].n == GEN;
        alone_same += same;
        if (!same) {
            tap_diag("session %s differs from its turns alone:", names[s]);
            show("together, round 1", ref[s].tokens, ref[s].n);
            show("alone, round 1", solo[0].tokens, solo[0].n);
        }
    }
    ok(st == PV_OK && alone_same == SESSIONS,
       "%s: together, each session's turns give its turns alone's tokens (%d of %d sessions; %s)", be, alone_same,
       SESSIONS, st == PV_OK ? "ok" : pv_last_error());
    int forced = 0, banned_seen = 0, sampled_n = 0;
    for (int r = 0; r < ROUNDS; r++) {
        forced += count_token(&ref[r * SESSIONS], force->tok[0]);
        for (size_t k = 0; k + 1 < sampled_bias.n; k++)
            banned_seen += count_token(&ref[r * SESSIONS + 3], sampled_bias.tok[k]);
        sampled_n += ref[r * SESSIONS + 3].n;
    }
    ok(forced == ROUNDS * GEN, "%s: together, the forced session says token %d every time (%d of %d)", be,
       force->tok[0], forced, ROUNDS * GEN);
    ok(sampled_bias.n >= 3 && banned_seen == 0 && sampled_n == ROUNDS * GEN,
       "%s: sampled (temperature 1) with -100 on the %zu tokens its unbiased turns drew most: none drawn in %d tokens",
       be, sampled_bias.n - 1, sampled_n);

    const struct {
        pv_engine_mode mode;
        int32_t steps;
        const char *name;
    } setups[] = {{PV_MODE_STATELESS, 1, "stateless"}, {PV_MODE_PENSIEVE, 3, "pensieve, decode_steps 3"},
                  {PV_MODE_STATELESS, 3, "stateless, decode_steps 3"}};
    for (size_t k = 0; k < sizeof setups / sizeof setups[0]; k++) {
        st = run(setups[k].mode, setups[k].steps, specs, SESSIONS, ROUNDS, got, &info);
        int same = 0, first_diff = -1;
        for (int i = 0; i < ROUNDS * SESSIONS; i++) {
            if (same_tokens(&got[i], ref[i].tokens, ref[i].n))
                same++;
            else if (first_diff < 0)
                first_diff = i;
        }
        ok(st == PV_OK && same == ROUNDS * SESSIONS && info.check_failures == 0 &&
               (setups[k].steps == 1 || info.chained > 0),
           "%s: %s: %d of %d biased turns (greedy and sampled) give pensieve decode_steps 1's tokens; %" PRIu64
           " chained passes (%s%s)",
           be, setups[k].name, same, ROUNDS * SESSIONS, info.chained, st == PV_OK ? "ok" : pv_last_error(),
           info.first_failure);
        if (first_diff >= 0) {
            tap_diag("turn %d (session %s):", first_diff, names[first_diff % SESSIONS]);
            show("got", got[first_diff].tokens, got[first_diff].n);
            show("want", ref[first_diff].tokens, ref[first_diff].n);
        }
    }
}

/* The list is the engine's own from submit on: the caller's arrays may
 * change or go. */
static void copied_at_submit(const char *be, const turn_spec *base, const bias_list *ban)
{
    int32_t want[GEN];
    pv_status st = reference(base->prompt, base->n_prompt, ban, GEN, want);
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = 64 * pv_llama_slot_bytes(M.model);
    cc.host_bytes = 64 * pv_llama_slot_bytes(M.model);
    pv_engine *e = NULL;
    if (st == PV_OK)
        st = pv_engine_init(&e, M.be, M.model, &M.tok, &cc, NULL);
    bias_list mine = *ban;
    turn_spec t = *base;
    t.bias = &mine;
    pv_turn turn = {.tokens = t.prompt, .n_tokens = (size_t)t.n_prompt};
    spec_sampling(&t, &turn.sampling);
    eu_result got = {0};
    pv_turn_callbacks cb = {eu_on_token, eu_on_done, &got};
    if (st == PV_OK)
        st = pv_engine_submit(e, "copied", &turn, &cb, NULL);
    mine.val[0] = 100.0f; /* the ban becomes a force in the caller's copy */
    mine.tok[0] = 4;
    while (st == PV_OK && pv_engine_pending(e) > 0)
        st = pv_engine_step(e, NULL);
    pv_engine_free(e);
    ok(st == PV_OK && same_tokens(&got, want, GEN),
       "%s: the bias is copied at submit: changing the caller's list afterwards changes nothing (%s)", be,
       st == PV_OK ? "ok" : pv_last_error());
}

static void test_backend(const char *backend)
{
    if (!eu_model_ready(&M, backend, LAYERS, N_CTX, PV_F32, CHUNK))
        return;
    turn_spec base = {.session = "alone"};
    make_prompt(&base, 2024, 17);
    static bias_list ban, mixed, force;
    if (greedy_against_reference(backend, &base, &ban, &mixed, &force)) {
        concurrent(backend, &base, &mixed, &force);
        copied_at_submit(backend, &base, &ban);
    }
    eu_model_free(&M);
}

/* Every submit-time check refuses its case with a message naming the
 * entry, the value and the limit, and queues nothing; the boundaries are
 * accepted. */
static void refusals(void)
{
    pv_status st = eu_model_init(&M, "cpu", LAYERS, N_CTX, PV_F32, CHUNK);
    if (!ok(st == PV_OK, "cpu: synthetic model for the refusals (%s)", st == PV_OK ? "ok" : pv_last_error())) {
        eu_model_free(&M);
        return;
    }
    const int32_t V = (int32_t)M.tok.n_vocab;
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = 64 * pv_llama_slot_bytes(M.model);
    pv_engine *e = NULL;
    static int32_t toks[PV_SAMPLING_MAX_BIAS + 1];
    static float vals[PV_SAMPLING_MAX_BIAS + 1];
    const int32_t prompt[] = {5, 6, 7, 8};
    char want[160];
    enum { TOO_MANY, NULL_TOKENS, NULL_VALUES, NEGATIVE, PAST, NAN_VALUE, INF_VALUE, OVER, UNDER, TWICE, ALL_BANNED };
    static const char *const what[] = {"more than PV_SAMPLING_MAX_BIAS entries", "bias_tokens NULL",
                                       "bias_values NULL", "token -1", "token n_vocab", "value NaN", "value +inf",
                                       "value 100.5", "value -100.25", "a token twice", "every token banned"};
    for (int c = TOO_MANY; c <= ALL_BANNED; c++) {
        pv_turn t = {.tokens = prompt, .n_tokens = 4};
        pv_sampling_defaults(&t.sampling);
        t.sampling.max_tokens = 2;
        for (int k = 0; k < 4; k++) {
            toks[k] = 10 + k;
            vals[k] = 1.0f;
        }
        t.sampling.bias_tokens = toks;
        t.sampling.bias_values = vals;
        t.sampling.n_bias = 4;
        switch (c) {
        case TOO_MANY:
            for (int k = 0; k <= PV_SAMPLING_MAX_BIAS; k++) {
                toks[k] = k % V;
                vals[k] = 0;
            }
            t.sampling.n_bias = PV_SAMPLING_MAX_BIAS + 1;
            snprintf(want, sizeof want, "%d logit bias entries: at most %d", PV_SAMPLING_MAX_BIAS + 1,
                     PV_SAMPLING_MAX_BIAS);
            break;
        case NULL_TOKENS:
            t.sampling.bias_tokens = NULL;
            snprintf(want, sizeof want, "4 logit bias entries but bias_tokens is NULL");
            break;
        case NULL_VALUES:
            t.sampling.bias_values = NULL;
            snprintf(want, sizeof want, "4 logit bias entries but bias_values is NULL");
            break;
        case NEGATIVE:
            toks[1] = -1;
            snprintf(want, sizeof want, "entry 1: token -1 out of range [0, %d)", V);
            break;
        case PAST:
            toks[2] = V;
            snprintf(want, sizeof want, "entry 2: token %d out of range [0, %d)", V, V);
            break;
        case NAN_VALUE:
        case INF_VALUE:
        case OVER:
        case UNDER: {
            /* Entry k (token 10 + k) gets the bad value. */
            static const float bad_values[] = {NAN, INFINITY, 100.5f, -100.25f};
            const int k = (3 + c - NAN_VALUE) % 4;
            vals[k] = bad_values[c - NAN_VALUE];
            snprintf(want, sizeof want, "entry %d: value %g for token %d out of range [-100, 100]", k,
                     (double)vals[k], 10 + k);
            break;
        }
        case TWICE:
            toks[3] = 11;
            snprintf(want, sizeof want, "entry 3: token 11 is listed twice");
            break;
        case ALL_BANNED:
            if (V > PV_SAMPLING_MAX_BIAS) {
                tap_skip("every token banned: the vocabulary of %d is past the %d entries a list holds", V,
                         PV_SAMPLING_MAX_BIAS);
                continue;
            }
            for (int k = 0; k < V; k++) {
                toks[k] = V - 1 - k;
                vals[k] = -100.0f;
            }
            t.sampling.n_bias = (size_t)V;
            snprintf(want, sizeof want, "the logit bias bans all %d tokens of the vocabulary", V);
            break;
        }
        /* An engine of its own: a case wrongly accepted stays queued there. */
        eu_result r = {0};
        pv_turn_callbacks cb = {eu_on_token, eu_on_done, &r};
        if ((st = pv_engine_init(&e, M.be, M.model, &M.tok, &cc, NULL)) == PV_OK)
            st = pv_engine_submit(e, "refused", &t, &cb, NULL);
        ok(st == PV_ERR_INVALID_ARG && pv_engine_pending(e) == 0 && r.done == 0 && strstr(pv_last_error(), want),
           "a logit bias with %s is refused: %s", what[c], pv_last_error());
        pv_engine_free(e);
        e = NULL;
    }

    /* The boundaries pass: values -100 and +100, tokens 0 and n_vocab - 1,
     * and (the vocabulary allowing) every token banned but one, which then
     * is every token said. */
    const int32_t keep = V / 2;
    size_t n = 0;
    toks[n] = 0, vals[n++] = -100.0f;
    toks[n] = V - 1, vals[n++] = 100.0f;
    if (V <= PV_SAMPLING_MAX_BIAS + 1) {
        n = 0;
        for (int32_t k = 0; k < V; k++)
            if (k != keep)
                toks[n] = k, vals[n++] = -100.0f;
    }
    pv_turn t = {.tokens = prompt, .n_tokens = 4};
    pv_sampling_defaults(&t.sampling);
    t.sampling.max_tokens = 5;
    t.sampling.ignore_eos = 1;
    t.sampling.temperature = 1.0f;
    t.sampling.bias_tokens = toks;
    t.sampling.bias_values = vals;
    t.sampling.n_bias = n;
    eu_result r = {0};
    pv_turn_callbacks cb = {eu_on_token, eu_on_done, &r};
    if ((st = pv_engine_init(&e, M.be, M.model, &M.tok, &cc, NULL)) == PV_OK)
        st = pv_engine_submit(e, "boundaries", &t, &cb, NULL);
    while (st == PV_OK && pv_engine_pending(e) > 0)
        st = pv_engine_step(e, NULL);
    const int32_t said = n == 2 ? V - 1 : keep;
    ok(st == PV_OK && r.done == 1 && r.n == 5 && count_token(&r, said) == 5,
       "a sampled turn with %zu entries at the limits (-100, +100, tokens 0 .. %d) runs, and says token %d only (%s)",
       n, V - 1, said, st == PV_OK ? "ok" : pv_last_error());
    pv_engine_free(e);
    eu_model_free(&M);

    /* A step samples every running turn's list in one call: max_running
     * past PV_LOGIT_BIAS_MAX / PV_SAMPLING_MAX_BIAS is refused at init. */
    const int32_t rows = PV_LOGIT_BIAS_MAX / PV_SAMPLING_MAX_BIAS;
    st = eu_model_init_rows(&M, NULL, "cpu", LAYERS, 64, PV_F32, CHUNK, rows + 1);
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    ec.max_running = rows + 1;
    pv_status refused = st == PV_OK ? pv_engine_init(&e, M.be, M.model, &M.tok, &cc, &ec) : st;
    snprintf(want, sizeof want, "max_running %d: more than %d turns of %d logit bias entries", rows + 1, rows,
             PV_SAMPLING_MAX_BIAS);
    ok(refused == PV_ERR_INVALID_ARG && strstr(pv_last_error(), want), "max_running %d is refused at init: %s",
       rows + 1, pv_last_error());
    ec.max_running = rows;
    cc.device_bytes = 64 * pv_llama_slot_bytes(M.model);
    st = st == PV_OK ? pv_engine_init(&e, M.be, M.model, &M.tok, &cc, &ec) : st;
    ok(st == PV_OK, "max_running %d is accepted (%s)", rows, st == PV_OK ? "ok" : pv_last_error());
    pv_engine_free(e);
    eu_model_free(&M);
}

int main(int argc, char **argv)
{
    eu_passive_openmp(argc, argv);
    refusals();
    test_backend("cpu");
    test_backend("opencl");
    test_backend("cuda");
    return tap_done();
}
