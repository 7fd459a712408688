/* The paged forward pass against the contiguous host reference, on every
 * backend that opens, with the synthetic model: a ragged two-sequence
 * prefill, prefill then decode, and recovery (dropped leading chunks
 * recomputed in the same batch as a new prompt, into fresh slots). Unwritten
 * pool memory is NaN, so reading a slot that was not written fails loudly.
 * Copies of the synthetic file made wrong on purpose (a vocabulary larger
 * than the embedding, each tensor a row too big) fail to load, naming why. */
#define _POSIX_C_SOURCE 200809L
#include "llama-ref.h"
#include "tap.h"

#include <pensieve/llama.h>
#include <pensieve/tokenizer.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 8
#define MAX_CHUNKS 16 /* 128 positions per sequence */
#define LEN_A 45
#define LEN_B 20
#define EXTRA_A 6 /* new prompt after recovery */

typedef struct fixture {
    pv_backend *be;
    pv_llama *model;
    pv_buffer *pool;
    int64_t n_slots;
    int32_t *tables; /* [n_layers][2][MAX_CHUNKS] */
    int32_t *free_slots; /* shuffled, consumed from the end */
    int64_t n_free;
    uint32_t n_layers, n_vocab;
} fixture;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* weight_buffer: the model's max_weight_buffer_bytes, 0 for the default;
 * fuse, graphs: pv_llama_options.fuse, .graphs. */
static pv_status fixture_init(fixture *f, const char *backend, const pv_gguf *g, pv_dtype kv,
                              uint64_t weight_buffer, int fuse, int graphs)
{
    memset(f, 0, sizeof *f);
    pv_status st = pv_backend_init(&f->be, backend, 0);
    if (st != PV_OK)
        return st;
    pv_llama_options o;
    pv_llama_options_default(&o);
    o.kv_dtype = kv;
    o.chunk_tokens = CHUNK;
    o.max_batch_tokens = 96;
    o.max_logit_rows = 96;
    if (weight_buffer)
        o.max_weight_buffer_bytes = weight_buffer;
    o.fuse = fuse;
    o.graphs = graphs;
    if ((st = pv_llama_init(&f->model, f->be, g, &o)) != PV_OK)
        return st;
    f->n_layers = pv_llama_hparams_of(f->model)->n_layers;
    f->n_vocab = pv_llama_hparams_of(f->model)->n_vocab;
    f->n_slots = (int64_t)f->n_layers * 2 * MAX_CHUNKS + 64;
    uint64_t bytes = (uint64_t)f->n_slots * pv_llama_slot_bytes(f->model);
    if ((st = pv_buffer_init(&f->pool, f->be, PV_MEM_DEVICE, bytes)) != PV_OK)
        return st;
    unsigned char *nan_fill = malloc(bytes);
    if (!nan_fill)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "test: pool fill");
    memset(nan_fill, 0xff, bytes); /* all-ones is a NaN in f32 and f16 */
    st = pv_buffer_write(f->pool, 0, nan_fill, bytes);
    free(nan_fill);
    f->tables = malloc(sizeof(int32_t) * f->n_layers * 2 * MAX_CHUNKS);
    f->free_slots = malloc(sizeof(int32_t) * (size_t)f->n_slots);
    if (!f->tables || !f->free_slots)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "test: tables");
    for (int64_t i = 0; i < f->n_slots; i++)
        f->free_slots[i] = (int32_t)i;
    for (int64_t i = f->n_slots - 1; i > 0; i--) { /* non-contiguous slot tables */
        int64_t j = rng() % (i + 1);
        int32_t t = f->free_slots[i];
        f->free_slots[i] = f->free_slots[j];
        f->free_slots[j] = t;
    }
    f->n_free = f->n_slots;
    for (size_t i = 0; i < (size_t)f->n_layers * 2 * MAX_CHUNKS; i++)
        f->tables[i] = -1;
    return st;
}

static void fixture_free(fixture *f)
{
    free(f->tables);
    free(f->free_slots);
    pv_buffer_free(f->pool);
    pv_llama_free(f->model);
    pv_backend_free(f->be);
}

static int32_t *table_at(fixture *f, uint32_t layer, int seq, int chunk)
{
    return &f->tables[((size_t)layer * 2 + seq) * MAX_CHUNKS + chunk];
}

/* Give every layer's chunk holding positions [from, to) of seq a fresh slot. */
static void assign_slots(fixture *f, int seq, int from, int to)
{
    for (int c = from / CHUNK; c <= (to - 1) / CHUNK; c++)
        for (uint32_t l = 0; l < f->n_layers; l++)
            if (*table_at(f, l, seq, c) < 0)
                *table_at(f, l, seq, c) = f->free_slots[--f->n_free];
}

/* Largest |got - want| over max |want|; NaN anywhere fails. */
static double rel_err(const float *got, const float *want, size_t n)
{
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(want[i]))
            return INFINITY;
        double d = fabs((double)got[i] - want[i]);
        if (d > diff)
            diff = d;
        if (fabs(want[i]) > scale)
            scale = fabs(want[i]);
    }
    return scale > 0 ? diff / scale : diff;
}

typedef struct batch_builder {
    int32_t n, tokens[96], seq[96], pos[96], rows[96];
} batch_builder;

static void add_tokens(batch_builder *b, const int *tokens, int seq, int from, int to)
{
    for (int p = from; p < to; p++) {
        b->tokens[b->n] = tokens[p];
        b->seq[b->n] = seq;
        b->pos[b->n] = p;
        b->rows[b->n] = b->n;
        b->n++;
    }
}

static pv_status run(fixture *f, batch_builder *b, float *logits)
{
    pv_llama_batch batch = {
        .n_tokens = b->n, .tokens = b->tokens, .token_seq = b->seq, .token_pos = b->pos,
        .n_seqs = 2, .max_chunks = MAX_CHUNKS, .slot_tables = f->tables, .kv_pool = f->pool,
        .n_slots = f->n_slots, .n_logits = b->n, .logit_rows = b->rows, .logits = logits,
    };
    return pv_llama_forward(f->model, &batch);
}

/* Reference logits for every position of one sequence. */
static float *reference(const pv_gguf *g, const int *tokens, int len, uint32_t vocab, int activation_bits)
{
    llama_ref r;
    float *out = malloc(sizeof(float) * (size_t)len * vocab);
    if (!out || llama_ref_init(&r, g, len) != PV_OK) {
        free(out);
        return NULL;
    }
    r.activation_bits = activation_bits;
    for (int p = 0; p < len; p++)
        if (llama_ref_step(&r, tokens[p], p, out + (size_t)p * vocab) != PV_OK) {
            free(out);
            out = NULL;
            break;
        }
    llama_ref_free(&r);
    return out;
}

/* Compare batch rows [first, first + count) with reference positions. */
static int compare_rows(const float *logits, const batch_builder *b, int first, int count,
                        const float *ref, uint32_t vocab, double tol, const char *what)
{
    double worst = 0;
    for (int i = first; i < first + count; i++) {
        double e = rel_err(logits + (size_t)i * vocab, ref + (size_t)b->pos[i] * vocab, vocab);
        if (!(e <= worst))
            worst = e;
    }
    return ok(worst <= tol, "%s: max relative logit error %.2e <= %.2g", what, worst, tol);
}

/* References for every position of sequences A and B: exact, and with the
 * block-type matrices' inputs rounded as the CPU's integer kernels run them. */
typedef struct references {
    const float *a, *b;
    int bits; /* of the rounded references */
    const float *a_rounded, *b_rounded;
    double rounded_tol; /* limit against a_rounded/b_rounded with an f32 pool */
} references;

static void run_backend(const char *name, const pv_gguf *g, pv_dtype kv, const int *tok_a,
                        const int *tok_b, const references *refs)
{
    double tol = kv == PV_F32 ? 1e-4 : 2e-2;
    char what[96];
    fixture f;
    pv_status st = fixture_init(&f, name, g, kv, 0, 1, 1);
    if (st == PV_ERR_NO_DEVICE) {
        tap_skip("backend %s: %s", name, pv_last_error());
        fixture_free(&f);
        return;
    }
    /* A backend that rounds activations is held to the reference that
     * rounds them the same way. */
    const int rounds = st == PV_OK && f.be->info.activation_bits != 0;
    if (rounds && f.be->info.activation_bits != refs->bits) {
        ok(0, "%s: rounds activations to %d bits; the references round to %d", name,
           f.be->info.activation_bits, refs->bits);
        fixture_free(&f);
        return;
    }
    const float *ref_a = rounds ? refs->a_rounded : refs->a, *ref_b = rounds ? refs->b_rounded : refs->b;
    if (rounds && kv == PV_F32)
        tol = refs->rounded_tol;
    if (!ok(st == PV_OK, "%s %s: model and pool set up (%s)", name, pv_dtype_name(kv),
            st == PV_OK ? "ok" : pv_last_error())) {
        fixture_free(&f);
        return;
    }
    float *logits = malloc(sizeof(float) * 96 * f.n_vocab);

    /* 1. one ragged batch: all of A and all of B. */
    batch_builder b = {0};
    assign_slots(&f, 0, 0, LEN_A);
    assign_slots(&f, 1, 0, LEN_B);
    add_tokens(&b, tok_a, 0, 0, LEN_A);
    add_tokens(&b, tok_b, 1, 0, LEN_B);
    st = run(&f, &b, logits);
    snprintf(what, sizeof what, "%s %s prefill A", name, pv_dtype_name(kv));
    if (ok(st == PV_OK, "%s+B in one batch runs (%s)", what, st == PV_OK ? "ok" : pv_last_error())) {
        compare_rows(logits, &b, 0, LEN_A, ref_a, f.n_vocab, tol, what);
        snprintf(what, sizeof what, "%s %s prefill B", name, pv_dtype_name(kv));
        compare_rows(logits, &b, LEN_A, LEN_B, ref_b, f.n_vocab, tol, what);
    }

    /* 2. recovery: A's first two chunks were dropped; they are recomputed into
     * fresh slots in the same batch as A's new prompt. The old slots are
     * poisoned so any read of them shows. */
    unsigned char *poison = malloc(pv_llama_slot_bytes(f.model));
    memset(poison, 0xff, pv_llama_slot_bytes(f.model));
    for (uint32_t l = 0; l < f.n_layers; l++)
        for (int c = 0; c < 2; c++) {
            pv_buffer_write(f.pool, (uint64_t)*table_at(&f, l, 0, c) * pv_llama_slot_bytes(f.model),
                            poison, pv_llama_slot_bytes(f.model));
            *table_at(&f, l, 0, c) = -1;
        }
    free(poison);
    assign_slots(&f, 0, 0, 2 * CHUNK);
    assign_slots(&f, 0, LEN_A, LEN_A + EXTRA_A);
    batch_builder r = {0};
    add_tokens(&r, tok_a, 0, 0, 2 * CHUNK);
    add_tokens(&r, tok_a, 0, LEN_A, LEN_A + EXTRA_A);
    st = run(&f, &r, logits);
    snprintf(what, sizeof what, "%s %s recovery", name, pv_dtype_name(kv));
    if (ok(st == PV_OK, "%s batch runs (%s)", what, st == PV_OK ? "ok" : pv_last_error()))
        compare_rows(logits, &r, 0, r.n, ref_a, f.n_vocab, tol, what);

    /* 3. decode B one token at a time after its prefill (B continues A's text). */
    assign_slots(&f, 1, LEN_B, LEN_B + 4);
    double worst = 0;
    int decode_ok = 1;
    for (int p = LEN_B; p < LEN_B + 4; p++) {
        batch_builder d = {0};
        add_tokens(&d, tok_b, 1, p, p + 1);
        if (run(&f, &d, logits) != PV_OK) {
            decode_ok = 0;
            break;
        }
        double e = rel_err(logits, ref_b + (size_t)p * f.n_vocab, f.n_vocab);
        if (!(e <= worst))
            worst = e;
    }
    ok(decode_ok && worst <= tol, "%s %s decode: 4 single-token steps, max error %.2e <= %.2g (%s)",
       name, pv_dtype_name(kv), worst, tol, decode_ok ? "ok" : pv_last_error());

    /* 4. bad batches are refused with a message. */
    batch_builder bad = {.n = 1, .tokens = {tok_b[0]}, .seq = {1}, .pos = {100}};
    /* position 100 of B has no slot */
    st = run(&f, &bad, logits);
    ok(st == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "slot_table"),
       "%s: a token whose chunk has no slot is refused (%s)", name, pv_last_error());

    free(logits);
    fixture_free(&f);
}

/* ---- fused against unfused ------------------------------------------------- */

/* A fused op gives its unfused ops' values up to f32 rounding in another
 * order (on the CPU and PoCL, bit for bit); over a whole forward pass that
 * stays far below the references' limits above. */
#define FUSION_TOL 1e-5

/* The row's argmax (the lowest index on ties), as greedy sampling takes it. */
static int argmax_row(const float *row, uint32_t n)
{
    int best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (row[i] > row[best])
            best = (int)i;
    return best;
}

#define GREEDY_STEPS 8

/* A prefill of sequence A (logits for every row), then GREEDY_STEPS greedy
 * decode steps, each feeding back its own argmax: tokens[] gets them,
 * logits[] every row's logits, *step_launches the launches of the last
 * decode step. */
static pv_status greedy_run(fixture *f, const int *prompt, float *logits, int *tokens, uint64_t *step_launches)
{
    batch_builder b = {0};
    assign_slots(f, 0, 0, LEN_A + GREEDY_STEPS);
    add_tokens(&b, prompt, 0, 0, LEN_A);
    pv_status st = run(f, &b, logits);
    int seq[LEN_A + GREEDY_STEPS];
    memcpy(seq, prompt, sizeof(int) * LEN_A);
    const float *last = logits + (size_t)(LEN_A - 1) * f->n_vocab;
    for (int i = 0; st == PV_OK && i < GREEDY_STEPS; i++) {
        tokens[i] = seq[LEN_A + i] = argmax_row(last, f->n_vocab);
        batch_builder d = {0};
        add_tokens(&d, seq, 0, LEN_A + i, LEN_A + i + 1);
        float *row = logits + (size_t)(LEN_A + i) * f->n_vocab;
        const uint64_t before = pv_backend_launches(f->be);
        st = run(f, &d, row);
        *step_launches = pv_backend_launches(f->be) - before;
        last = row;
    }
    return st;
}

/* Two models on one backend, with options a and b (pv_llama_options.fuse
 * and .graphs), each through greedy_run from the same prompt. */
typedef struct paired {
    fixture a, b;
    size_t n; /* floats in each logits array */
    float *logits_a, *logits_b;
    int tokens_a[GREEDY_STEPS], tokens_b[GREEDY_STEPS];
    uint64_t launches_a, launches_b; /* of each one's last decode step */
    uint64_t graph_runs_a;           /* graphs a ran */
    uint64_t graph_replays_a;        /* of those, run again without recording */
} paired;

/* Opens both models: PV_ERR_NO_DEVICE when the backend has no device (a
 * is then free and b untouched, so paired_free is safe either way). */
static pv_status paired_init(paired *p, const pv_gguf *g, const char *backend, pv_dtype kv, int fuse_a,
                             int graphs_a, int fuse_b, int graphs_b)
{
    memset(p, 0, sizeof *p);
    pv_status st = fixture_init(&p->a, backend, g, kv, 0, fuse_a, graphs_a);
    if (st == PV_OK)
        st = fixture_init(&p->b, backend, g, kv, 0, fuse_b, graphs_b);
    return st;
}

static pv_status paired_run(paired *p, const int *prompt)
{
    p->n = (size_t)(LEN_A + GREEDY_STEPS) * p->a.n_vocab;
    p->logits_a = calloc(p->n, sizeof(float));
    p->logits_b = calloc(p->n, sizeof(float));
    if (!p->logits_a || !p->logits_b)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "test: logits");
    const uint64_t runs_before = pv_backend_graph_runs(p->a.be);
    const uint64_t replays_before = pv_backend_graph_replays(p->a.be);
    pv_status st = greedy_run(&p->a, prompt, p->logits_a, p->tokens_a, &p->launches_a);
    p->graph_runs_a = pv_backend_graph_runs(p->a.be) - runs_before;
    p->graph_replays_a = pv_backend_graph_replays(p->a.be) - replays_before;
    return st == PV_OK ? greedy_run(&p->b, prompt, p->logits_b, p->tokens_b, &p->launches_b) : st;
}

static void paired_free(paired *p)
{
    free(p->logits_a);
    free(p->logits_b);
    fixture_free(&p->b);
    fixture_free(&p->a);
}

/* The forward pass with fusions (pv_llama_options.fuse 1, the default)
 * against the same model without them, on one backend: the prefill's and
 * every decode step's logits within tol of each other, the same greedy
 * tokens, and fewer launches a decode step. */
static void test_fusion(const char *label, const pv_gguf *g, const char *backend, pv_dtype kv, const int *prompt,
                        double tol)
{
    paired p;
    pv_status st = paired_init(&p, g, backend, kv, 1, 1, 0, 1);
    if (st == PV_ERR_NO_DEVICE) {
        tap_skip("%s: backend %s: %s", label, backend, pv_last_error());
        paired_free(&p);
        return;
    }
    if (st == PV_OK)
        st = paired_run(&p, prompt);
    char what[160];
    snprintf(what, sizeof what, "%s on %s, %s KV: fused and unfused", label, backend, pv_dtype_name(kv));
    if (ok(st == PV_OK, "%s run (%s)", what, st == PV_OK ? "ok" : pv_last_error())) {
        const uint32_t vocab = p.a.n_vocab;
        double worst = 0;
        for (int r = 0; r < LEN_A + GREEDY_STEPS; r++) {
            double e = rel_err(p.logits_a + (size_t)r * vocab, p.logits_b + (size_t)r * vocab, vocab);
            worst = e <= worst ? worst : e;
        }
        ok(worst <= tol, "%s: logits of %d prefill rows and %d decode steps within %.2e (limit %.2g)", what, LEN_A,
           GREEDY_STEPS, worst, tol);
        ok(memcmp(p.tokens_a, p.tokens_b, sizeof p.tokens_a) == 0,
           "%s: the same %d greedy tokens (%d %d %d ... against %d %d %d ...)", what, GREEDY_STEPS, p.tokens_a[0],
           p.tokens_a[1], p.tokens_a[2], p.tokens_b[0], p.tokens_b[1], p.tokens_b[2]);
        ok(p.launches_a < p.launches_b, "%s: a decode step launches %llu fused, %llu unfused", what,
           (unsigned long long)p.launches_a, (unsigned long long)p.launches_b);
    }
    paired_free(&p);
}

/* On a backend with tunable kernels, the model with qmatmul's PV_ACT16 on
 * (decode-sized products of the block types from x rounded to 16 bits)
 * against the same model without: the prefill (45 tokens, past the fused
 * kernels' 16) bit for bit the same, every decode step's logits within
 * tol (the references' limit for rounded activations) but not all the
 * same bits (the mode took effect), the same greedy tokens, and per decode
 * step no more rounding launches than the products and groups whose input
 * no norm rounds (pv_add_rmsnorm_group and _swiglu round theirs in the
 * norm's kernel): the attention output's (which a split attention's
 * combining kernel rounds) and the SwiGLU output's products, 2 a layer,
 * the first layer's Q, K and V after the one norm that stands alone, and
 * the output's. */
static void test_act16(const char *label, const pv_gguf *g, const char *backend, pv_dtype kv, const int *prompt,
                       double tol)
{
    paired p;
    pv_status st = paired_init(&p, g, backend, kv, 1, 1, 1, 1);
    if (st == PV_ERR_NO_DEVICE || (st == PV_OK && !pv_backend_kernels_tunable(p.a.be))) {
        tap_skip("%s: PV_ACT16 on %s: %s", label, backend, st == PV_OK ? "no tunable kernels" : pv_last_error());
        paired_free(&p);
        return;
    }
    if (st == PV_OK)
        st = pv_backend_kernel_set(p.a.be, "qmatmul", "PV_ACT16=1");
    if (st == PV_OK)
        st = paired_run(&p, prompt);
    char what[160];
    snprintf(what, sizeof what, "%s on %s, %s KV: PV_ACT16 1 against 0", label, backend, pv_dtype_name(kv));
    if (ok(st == PV_OK, "%s run (%s)", what, st == PV_OK ? "ok" : pv_last_error())) {
        const uint32_t vocab = p.a.n_vocab;
        const size_t prefill = (size_t)LEN_A * vocab;
        double worst = 0;
        for (int r = LEN_A; r < LEN_A + GREEDY_STEPS; r++) {
            double e = rel_err(p.logits_a + (size_t)r * vocab, p.logits_b + (size_t)r * vocab, vocab);
            worst = e <= worst ? worst : e;
        }
        ok(memcmp(p.logits_a, p.logits_b, prefill * sizeof(float)) == 0,
           "%s: the %d prefill rows' logits are the same bits", what, LEN_A);
        ok(worst > 0 && worst <= tol, "%s: %d decode steps' logits differ, by at most %.2e (limit %.2g)", what,
           GREEDY_STEPS, worst, tol);
        ok(memcmp(p.tokens_a, p.tokens_b, sizeof p.tokens_a) == 0,
           "%s: the same %d greedy tokens (%d %d %d ... against %d %d %d ...)", what, GREEDY_STEPS, p.tokens_a[0],
           p.tokens_a[1], p.tokens_a[2], p.tokens_b[0], p.tokens_b[1], p.tokens_b[2]);
        const uint64_t most = 2ull * p.a.n_layers + 2;
        ok(p.launches_a > p.launches_b && p.launches_a - p.launches_b <= most,
           "%s: a decode step launches %llu, %llu more than without (at most %llu roundings)", what,
           (unsigned long long)p.launches_a, (unsigned long long)(p.launches_a - p.launches_b),
           (unsigned long long)most);
    }
    paired_free(&p);
}

/* ---- graphs ------------------------------------------------------------------ */

/* On a backend with graphs, the model with graphs (pv_llama_options.graphs
 * 1, the default) against the same model launching op by op: the same
 * kernels in the same order, so the same logits bit for bit, for the
 * prefill and every decode step; every decode step ran as a graph (the
 * first pass, the prefill, may not: it grows the backend's scratch, which
 * a recording cannot). The decode steps share one shape (the slot table's
 * width is fixed, the split count stays 1 at these contexts), so the
 * first is recorded and the others replay it with their own positions
 * and token ids: a replay that ran on stale arrays would give other
 * logits. */
static void test_graphs(const pv_gguf *g, const char *backend, pv_dtype kv, const int *prompt)
{
    paired p;
    pv_status st = paired_init(&p, g, backend, kv, 1, 1, 1, 0);
    if (st == PV_ERR_NO_DEVICE || (st == PV_OK && !pv_backend_graphs(p.a.be))) {
        tap_skip("graphs on %s: %s", backend, st == PV_OK ? "the backend has none" : pv_last_error());
        paired_free(&p);
        return;
    }
    if (st == PV_OK)
        st = paired_run(&p, prompt);
    char what[160];
    snprintf(what, sizeof what, "graphs on %s, %s KV", backend, pv_dtype_name(kv));
    if (ok(st == PV_OK, "%s: run with and without (%s)", what, st == PV_OK ? "ok" : pv_last_error())) {
        const char *failure = pv_llama_graph_failure(p.a.model);
        ok(p.graph_runs_a >= GREEDY_STEPS && p.graph_runs_a <= GREEDY_STEPS + 1,
           "%s: %llu of %d forward passes ran as graphs, every decode step's at least%s%s", what,
           (unsigned long long)p.graph_runs_a, GREEDY_STEPS + 1, failure[0] ? "; the last failure: " : "", failure);
        ok(p.graph_replays_a >= GREEDY_STEPS - 1,
           "%s: %llu decode steps replayed the first one's graph without recording (expected %d)%s%s", what,
           (unsigned long long)p.graph_replays_a, GREEDY_STEPS - 1, failure[0] ? "; the last failure: " : "",
           failure);
        ok(memcmp(p.logits_a, p.logits_b, sizeof(float) * p.n) == 0,
           "%s: the logits of %d prefill rows and %d decode steps equal op by op's, bit for bit", what, LEN_A,
           GREEDY_STEPS);
        ok(memcmp(p.tokens_a, p.tokens_b, sizeof p.tokens_a) == 0, "%s: the same %d greedy tokens", what,
           GREEDY_STEPS);
        ok(pv_backend_graph_runs(p.b.be) == 0, "%s: graphs 0 runs none", what);
    }
    paired_free(&p);
}

/* The front end of graphs on a backend without them. */
static void test_graph_front_end(void)
{
    pv_backend *be = NULL;
    if (!ok(pv_backend_init(&be, "cpu", 0) == PV_OK, "cpu backend opens"))
        return;
    int ran = 1;
    ok(!pv_backend_graphs(be) && pv_backend_graph_begin(be, 1) == PV_ERR_UNSUPPORTED &&
           strstr(pv_last_error(), "cpu"),
       "graphs: the CPU backend has none, and begin says so: %s", pv_last_error());
    ok(pv_backend_graph_end(be, 1, &ran) == PV_ERR_UNSUPPORTED && ran == 0, "graphs: end on it runs nothing");
    ok(pv_backend_graph_end(be, 1, NULL) == PV_ERR_INVALID_ARG && pv_backend_graph_begin(NULL, 1) == PV_ERR_INVALID_ARG,
       "graphs: NULL arguments are refused");
    pv_backend_free(be);
}

/* Batch-size buckets (pv_llama_options.graph_buckets; the padding itself
 * is checked through the engine in test-engine-chain): the bucket of each
 * batch size, and a spare slot outside the pool refused. */
static void test_buckets_front_end(const pv_gguf *g)
{
    static const int32_t sizes[][2] = {{1, 1}, {2, 2}, {3, 4}, {5, 8}, {8, 8}, {9, 16}, {17, 24}, {64, 64}, {65, 65}};
    int right = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        right += pv_llama_decode_bucket(sizes[i][0]) == sizes[i][1];
    ok(right == (int)(sizeof sizes / sizeof sizes[0]),
       "buckets: 1, 2, 4, 8, then multiples of 8 to %d, past it the size itself (%d of %zu right)",
       PV_LLAMA_GRAPH_MAX_TOKENS, right, sizeof sizes / sizeof sizes[0]);
    fixture f;
    pv_status st = fixture_init(&f, "cpu", g, PV_F32, 0, 1, 1);
    if (ok(st == PV_OK, "buckets: cpu model (%s)", st == PV_OK ? "ok" : pv_last_error())) {
        int32_t tok[3] = {1, 2, 3}, seq[3] = {0, 1, 2}, pos[3] = {0, 0, 0}, rows[3] = {0, 1, 2};
        const int64_t bad[2] = {-1, f.n_slots};
        for (int i = 0; i < 2; i++) {
            pv_llama_batch b = {.n_tokens = 3, .tokens = tok, .token_seq = seq, .token_pos = pos, .n_seqs = 3,
                                .max_chunks = 1, .slot_tables = f.tables, .kv_pool = f.pool, .n_slots = f.n_slots,
                                .n_logits = 3, .logit_rows = rows, .pad_decode = 1, .pad_slot = bad[i]};
            st = pv_llama_forward(f.model, &b);
            ok(st == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "pad_slot"),
               "buckets: a spare slot of %lld in a pool of %lld is refused (%s)", (long long)bad[i],
               (long long)f.n_slots, pv_last_error());
        }
    }
    fixture_free(&f);
}

/* ---- files wrong on purpose ------------------------------------------------ */

/* What to change when copying a model file. */
typedef struct file_edit {
    const char *drop_key;  /* left out, or NULL */
    uint32_t extra_tokens; /* appended to tokenizer.ggml.tokens and token_type */
    const char *tensor;    /* this tensor gets one more row (zeros), or NULL */
    const char *retype;    /* tensors whose names end so are written as retype_to, or NULL */
    uint32_t retype_to;
} file_edit;

static pv_status copy_kv(pv_gguf_writer *w, const pv_gguf_kv *kv, uint32_t extra)
{
    if (kv->type == PV_GGUF_STRING) {
        char *v = malloc(kv->str_len + 1);
        if (!v)
            return PV_ERR_OUT_OF_MEMORY;
        memcpy(v, kv->str, kv->str_len);
        v[kv->str_len] = '\0';
        pv_status st = pv_gguf_writer_add_string(w, kv->key, v);
        free(v);
        return st;
    }
    if (kv->type == PV_GGUF_UINT32)
        return pv_gguf_writer_add_u32(w, kv->key, (uint32_t)kv->v.u64);
    if (kv->type == PV_GGUF_FLOAT32)
        return pv_gguf_writer_add_f32(w, kv->key, (float)kv->v.f64);
    if (kv->type == PV_GGUF_BOOL)
        return pv_gguf_writer_add_bool(w, kv->key, (int)kv->v.u64);
    if (kv->type != PV_GGUF_ARRAY)
        return pv_error(PV_ERR_UNSUPPORTED, "copy: key '%s' of type %s", kv->key,
                        pv_gguf_type_name(kv->type));
    int is_vocab = strcmp(kv->key, "tokenizer.ggml.tokens") == 0 ||
                   strcmp(kv->key, "tokenizer.ggml.token_type") == 0;
    uint64_t n = kv->array_len + (is_vocab ? extra : 0);
    pv_status st = PV_OK;
    if (kv->array_type == PV_GGUF_STRING) {
        char **v = calloc(n, sizeof *v);
        for (uint64_t i = 0; v && i < n && st == PV_OK; i++) {
            const char *s = "";
            uint64_t len = 0;
            char extra_name[32];
            if (i < kv->array_len) {
                st = pv_gguf_array_string(kv, i, &s, &len);
            } else {
                len = (uint64_t)snprintf(extra_name, sizeof extra_name, "<extra_%llu>",
                                         (unsigned long long)i);
                s = extra_name;
            }
            if (st == PV_OK && (v[i] = malloc(len + 1)) != NULL) {
                memcpy(v[i], s, len);
                v[i][len] = '\0';
            }
        }
        st = !v ? PV_ERR_OUT_OF_MEMORY
                : st != PV_OK ? st : pv_gguf_writer_add_strings(w, kv->key, (const char *const *)v, n);
        for (uint64_t i = 0; v && i < n; i++)
            free(v[i]);
        free(v);
        return st;
    }
    int32_t *v = malloc(n * sizeof *v);
    for (uint64_t i = 0; v && i < n && st == PV_OK; i++) {
        int64_t x = PV_TOKEN_NORMAL;
        if (i < kv->array_len)
            st = pv_gguf_array_int(kv, i, &x);
        v[i] = (int32_t)x;
    }
    st = !v ? PV_ERR_OUT_OF_MEMORY : st != PV_OK ? st : pv_gguf_writer_add_i32s(w, kv->key, v, n);
    free(v);
    return st;
}

/* An image of `src` with the edit applied; tensors keep their types but
 * those the edit retypes. */
static pv_status edited_copy(const pv_gguf *src, const file_edit *e, uint8_t **img, uint64_t *size)
{
    pv_gguf_writer w;
    pv_status st = pv_gguf_writer_init(&w, src->version, 0);
    for (uint64_t i = 0; i < src->n_kv && st == PV_OK; i++)
        if (!e->drop_key || strcmp(src->kv[i].key, e->drop_key) != 0)
            st = copy_kv(&w, &src->kv[i], e->extra_tokens);
    for (uint64_t i = 0; i < src->n_tensors && st == PV_OK; i++) {
        const pv_gguf_tensor *t = &src->tensors[i];
        uint64_t ne[PV_GGUF_MAX_DIMS] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        uint32_t n_dims = t->n_dims;
        int grow = e->tensor && strcmp(t->name, e->tensor) == 0;
        if (grow) {
            ne[1]++;
            n_dims = n_dims < 2 ? 2 : n_dims;
        }
        uint64_t n = ne[0] * ne[1] * ne[2] * ne[3];
        float *x = calloc(n, sizeof *x);
        st = !x ? PV_ERR_OUT_OF_MEMORY : grow ? PV_OK : pv_gguf_tensor_f32(t, x, n);
        const size_t name_len = strlen(t->name), suffix_len = e->retype ? strlen(e->retype) : 0;
        const int retype = e->retype && name_len >= suffix_len && strcmp(t->name + name_len - suffix_len, e->retype) == 0;
        if (st == PV_OK)
            st = pv_gguf_writer_add_tensor(&w, t->name, retype ? e->retype_to : t->type, n_dims, ne, x);
        free(x);
    }
    if (st == PV_OK)
        st = pv_gguf_writer_to_memory(&w, img, size);
    pv_gguf_writer_free(&w);
    return st;
}

/* pv_llama_init on an edited copy of g (CPU backend); the status. */
static pv_status init_edited(const pv_gguf *g, const file_edit *e)
{
    uint8_t *img = NULL;
    uint64_t size;
    pv_gguf bad;
    pv_backend *be = NULL;
    pv_llama *m = NULL;
    pv_status st = edited_copy(g, e, &img, &size);
    if (st == PV_OK && (st = pv_gguf_init_memory(&bad, img, size)) == PV_OK) {
        if ((st = pv_backend_init(&be, "cpu", 0)) == PV_OK)
            st = pv_llama_init(&m, be, &bad, NULL);
        pv_llama_free(m);
        pv_backend_free(be);
        pv_gguf_free(&bad);
    }
    free(img);
    return st;
}

/* Every tensor's shape and the vocabulary are checked against the metadata
 * when the model loads, with a message naming the tensor; a vocabulary
 * larger than the embedding used to load and fail at the first large id. */
/* The synthetic model's gate and up matrices are of two types, which the
 * fused SwiGLU product does not take (the forward pass falls back to the
 * unfused ops, checked above): a copy with both in Q4_1 takes it. */
static void test_fused_swiglu(const pv_gguf *g, const int *prompt)
{
    const file_edit same_types = {.retype = "ffn_up.weight", .retype_to = PV_GGML_Q4_1};
    uint8_t *img = NULL;
    uint64_t size = 0;
    pv_gguf copy;
    pv_status st = edited_copy(g, &same_types, &img, &size);
    if (st == PV_OK)
        st = pv_gguf_init_memory(&copy, img, size);
    if (!ok(st == PV_OK, "synthetic model with Q4_1 ffn_up (the gate's type) builds (%s)",
            st == PV_OK ? "ok" : pv_last_error())) {
        free(img);
        return;
    }
    for (const char *const *name = pv_backend_names(); *name; name++) {
        test_fusion("synthetic model, gate and up in Q4_1", &copy, *name, PV_F32, prompt, FUSION_TOL);
        test_fusion("synthetic model, gate and up in Q4_1", &copy, *name, PV_F16, prompt, FUSION_TOL);
    }
    pv_gguf_free(&copy);
    free(img);
}

static void test_wrong_files(const pv_gguf *g)
{
    file_edit unchanged = {0};
    pv_status st = init_edited(g, &unchanged);
    ok(st == PV_OK, "an unedited copy of the synthetic model loads (%s)",
       st == PV_OK ? "ok" : pv_last_error());
    file_edit vocab = {.drop_key = "llama.vocab_size", .extra_tokens = 7};
    ok(init_edited(g, &vocab) == PV_ERR_FORMAT && strstr(pv_last_error(), "token_embd.weight") &&
           strstr(pv_last_error(), "tokenizer.ggml.tokens") && strstr(pv_last_error(), "300"),
       "7 tokens more than embedding rows (no llama.vocab_size): %s", pv_last_error());
    vocab.drop_key = NULL;
    ok(init_edited(g, &vocab) == PV_ERR_FORMAT && strstr(pv_last_error(), "token_embd.weight") &&
           strstr(pv_last_error(), "tokenizer.ggml.tokens"),
       "the same with llama.vocab_size matching the rows: %s", pv_last_error());
    int named = 0, tried = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        file_edit grow = {.tensor = g->tensors[i].name};
        st = init_edited(g, &grow);
        tried++;
        if (st == PV_ERR_FORMAT && strstr(pv_last_error(), g->tensors[i].name))
            named++;
        else
            tap_diag("tensor '%s' with a row more: %s", g->tensors[i].name, pv_last_error());
    }
    ok(named == tried, "each of %d tensors with one row too many is refused naming it (%d)",
       tried, named);
}

/* All scenarios on every backend for one model file. */
/* The weight matrices in one shared buffer, one buffer each (1 byte per
 * buffer: every matrix overflows it) or a few (a third of the total): the
 * same logits, bit for bit, on the CPU backend, so every offset into a shared
 * buffer lands where the matrix was written. */
static void test_weight_buffers(const pv_gguf *g, const int *tokens)
{
    uint64_t total = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        total += g->tensors[i].n_bytes;
    const uint64_t limits[] = {0, 1, total / 3};
    float *logits[3] = {NULL, NULL, NULL};
    uint32_t vocab = 0;
    int ran = 0;
    for (int k = 0; k < 3; k++) {
        fixture f;
        pv_status st = fixture_init(&f, "cpu", g, PV_F32, limits[k], 1, 1);
        if (st == PV_OK) {
            vocab = f.n_vocab;
            logits[k] = malloc(sizeof(float) * LEN_A * vocab);
            batch_builder b = {0};
            assign_slots(&f, 0, 0, LEN_A);
            add_tokens(&b, tokens, 0, 0, LEN_A);
            st = logits[k] ? run(&f, &b, logits[k]) : PV_ERR_OUT_OF_MEMORY;
        }
        ran += ok(st == PV_OK, "weight buffers of at most %llu bytes (0: the default): the model loads and runs (%s)",
                  (unsigned long long)limits[k], st == PV_OK ? "ok" : pv_last_error());
        fixture_free(&f);
    }
    for (int k = 1; k < 3; k++)
        ok(ran == 3 && memcmp(logits[0], logits[k], sizeof(float) * LEN_A * vocab) == 0,
           "weight buffers of at most %llu bytes give the default layout's logits bit for bit",
           (unsigned long long)limits[k]);
    for (int k = 0; k < 3; k++)
        free(logits[k]);
}

/* rounded_tol: the limit for backends that round activations (to 16 bits,
 * against the reference that rounds them the same way). The last bits of
 * their f32 against the reference's doubles move a rounding by a step
 * (1/32512 of its block's largest) now and then: measured 3.5-4.2e-5 of the
 * largest logit on the 2-layer synthetic model, 1.1-5.3e-4 over SmolLM2's
 * 30 layers. */
static void run_model(const char *label, const pv_gguf *g, int with_f16, double rounded_tol)
{
    pv_llama_hparams hp;
    pv_status st = pv_llama_hparams_read(g, &hp);
    if (!ok(st == PV_OK, "%s: Llama hyperparameters (%s)", label, st == PV_OK ? "ok" : pv_last_error()))
        return;
    int tok_a[LEN_A + EXTRA_A], tok_b[LEN_B + 4];
    for (int i = 0; i < LEN_A + EXTRA_A; i++)
        tok_a[i] = (int)(rng() % hp.n_vocab);
    for (int i = 0; i < LEN_B + 4; i++)
        tok_b[i] = (int)(rng() % hp.n_vocab);
    float *ref_a = reference(g, tok_a, LEN_A + EXTRA_A, hp.n_vocab, 0);
    float *ref_b = reference(g, tok_b, LEN_B + 4, hp.n_vocab, 0);
    float *ref_a16 = reference(g, tok_a, LEN_A + EXTRA_A, hp.n_vocab, 16);
    float *ref_b16 = reference(g, tok_b, LEN_B + 4, hp.n_vocab, 16);
    const references refs = {ref_a, ref_b, 16, ref_a16, ref_b16, rounded_tol};
    if (ok(ref_a && ref_b && ref_a16 && ref_b16, "%s: contiguous references run", label)) {
        for (const char *const *name = pv_backend_names(); *name; name++) {
            run_backend(*name, g, PV_F32, tok_a, tok_b, &refs);
            if (with_f16)
                run_backend(*name, g, PV_F16, tok_a, tok_b, &refs);
        }
        for (const char *const *name = pv_backend_names(); *name; name++) {
            test_fusion(label, g, *name, PV_F32, tok_a, FUSION_TOL);
            if (with_f16)
                test_fusion(label, g, *name, PV_F16, tok_a, FUSION_TOL);
            test_act16(label, g, *name, PV_F32, tok_a, rounded_tol);
        }
        /* The CPU's portable kernels (exact f32), which CPUs without AVX2 run. */
        if (setenv("PV_CPU_KERNELS", "portable", 1) == 0) {
            run_backend("cpu", g, PV_F32, tok_a, tok_b, &refs);
            unsetenv("PV_CPU_KERNELS");
        }
    }
    free(ref_a);
    free(ref_b);
    free(ref_a16);
    free(ref_b16);
}

int main(void)
{
    pv_synth_config c;
    pv_synth_config_default(&c);
    uint8_t *image;
    uint64_t size;
    pv_gguf g;
    pv_status st = pv_synth_to_memory(&c, &image, &size);
    if (st == PV_OK)
        st = pv_gguf_init_memory(&g, image, size);
    if (!ok(st == PV_OK, "synthetic model builds (%s)", st == PV_OK ? "ok" : pv_last_error()))
        return tap_done();
    run_model("synthetic model", &g, 1, 2e-4);
    pv_llama_hparams hp;
    if (pv_llama_hparams_read(&g, &hp) == PV_OK) {
        int tokens[LEN_A];
        for (int i = 0; i < LEN_A; i++)
            tokens[i] = (int)(rng() % hp.n_vocab);
        test_weight_buffers(&g, tokens);
        test_fused_swiglu(&g, tokens);
        for (const char *const *name = pv_backend_names(); *name; name++) {
            test_graphs(&g, *name, PV_F32, tokens);
            test_graphs(&g, *name, PV_F16, tokens);
        }
        test_graph_front_end();
        test_buckets_front_end(&g);
    }
    test_wrong_files(&g);
    pv_gguf_free(&g);
    free(image);

    /* The real model when scripts/get-model has fetched it (not in CI). */
    char path[4096] = "";
    FILE *f = NULL;
    if (pv_default_model_path(path, sizeof path) == PV_OK)
        f = fopen(path, "rb");
    if (!f) {
        tap_skip("real model absent (%s): run scripts/get-model", path);
        return tap_done();
    }
    fclose(f);
    st = pv_gguf_init(&g, path);
    if (ok(st == PV_OK, "real model %s opens (%s)", path, st == PV_OK ? "ok" : pv_last_error())) {
        run_model("SmolLM2", &g, 0, 2e-3);
        pv_gguf_free(&g);
    }
    return tap_done();
}
