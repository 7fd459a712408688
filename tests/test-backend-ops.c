/* Every op of backends/backend.h on every backend against the CPU reference.
 *
 * First the CPU backend itself is checked against closed forms (double
 * precision formulas, exact data movement, known sampling answers). Then
 * each other built backend that opens runs the same random cases and is
 * compared with the CPU's output: normalised error max|got - want| / max|want|
 * under a per-op limit (stricter for f32 than f16), NaN or inf never passes,
 * and sentinel guard bytes around every output must survive. A backend with
 * no device (CUDA here) is a SKIP.
 * Usage: test-backend-ops [--backend NAME] [--seed N] */
#include "config.h"

#include "kv-scenario.h"

#include <stdarg.h>
#include <stdio.h>

typedef check_ctx ctx;

/* One TAP line: passes when the op ran, err <= limit and the guards held. */
static void report(const ctx *c, pv_status st, double err, double limit, int guards_ok, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (st != PV_OK) {
        ok(0, "%s: %s: %s", c->name, what, pv_last_error());
        return;
    }
    ok(err <= limit && guards_ok, "%s: %s: error %.3g (limit %.1g)%s", c->name, what, err, limit,
       guards_ok ? "" : ", guard bytes CHANGED");
}

static int supported(const ctx *c, pv_op op, pv_dtype dtype, const char *what)
{
    if (pv_backend_supports(c->be, op, dtype))
        return 1;
    if (c->cpu_pass)
        ok(0, "cpu: %s (%s) must be supported by the reference", pv_op_name(op), pv_dtype_name(dtype));
    else
        tap_skip("%s: %s: %s not supported for %s", c->name, what, pv_op_name(op), pv_dtype_name(dtype));
    return 0;
}

/* Number of bytes that differ: exact data movement allows none. */
static double bytes_differing(const void *a, const void *b, size_t n)
{
    const unsigned char *x = a, *y = b;
    size_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff += x[i] != y[i];
    return (double)diff;
}

static float *f32_copy(const float *x, size_t n)
{
    float *y = xmalloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

/* ---- GEMM ------------------------------------------------------------------- */

typedef struct gemm_case {
    int64_t m, n, k;
    int trans_a, trans_b;
    int64_t pad; /* extra leading-dimension elements */
} gemm_case;

/* Element (r, col) of a row-major matrix with leading dimension ld, seen
 * through an optional transpose. */
static double at(const float *x, int64_t ld, int trans, int64_t r, int64_t col)
{
    return trans ? x[col * ld + r] : x[r * ld + col];
}

static pv_status run_gemm(pv_backend *be, pv_dtype dtype, const pv_gemm_args *shape, const float *a, size_t a_n,
                          const float *b, size_t b_n, float *c, size_t c_n, int *guards_ok)
{
    tensor ta, tb, tc;
    memset(&tb, 0, sizeof tb);
    memset(&tc, 0, sizeof tc);
    size_t es = pv_dtype_size(dtype);
    const float *host[3] = {a, b, c};
    size_t count[3] = {a_n, b_n, c_n};
    tensor *dev[3] = {&ta, &tb, &tc};
    pv_status st = PV_OK;
    for (int i = 0; i < 3; i++) {
        void *data = xmalloc(count[i] * es);
        for (size_t e = 0; e < count[i]; e++) {
            if (dtype == PV_F32)
                ((float *)data)[e] = host[i][e];
            else
                ((pv_half *)data)[e] = pv_float_to_half(host[i][e]);
        }
        if (st == PV_OK)
            st = tensor_init(dev[i], be, PV_MEM_DEVICE, es, count[i], data);
        else
            memset(dev[i], 0, sizeof *dev[i]);
        free(data);
    }
    if (st == PV_OK) {
        pv_gemm_args g = *shape;
        g.dtype = dtype;
        g.a = ta.buf;
        g.a_off = ta.off;
        g.b = tb.buf;
        g.b_off = tb.off;
        g.c = tc.buf;
        g.c_off = tc.off;
        st = pv_gemm(be, &g);
    }
    if (st == PV_OK) {
        void *data = xmalloc(c_n * es);
        st = tensor_read(&tc, data);
        for (size_t e = 0; st == PV_OK && e < c_n; e++)
            c[e] = dtype == PV_F32 ? ((float *)data)[e] : pv_half_to_float(((pv_half *)data)[e]);
        free(data);
        *guards_ok = guards_intact(&ta) && guards_intact(&tb) && guards_intact(&tc);
    }
    for (int i = 0; i < 3; i++)
        tensor_free(dev[i]);
    return st;
}

static void check_gemm(ctx *c, const gemm_case *gc, pv_dtype dtype)
{
    if (!supported(c, PV_OP_GEMM, dtype, "gemm"))
        return;
    int64_t a_rows = gc->trans_a ? gc->k : gc->m, a_cols = gc->trans_a ? gc->m : gc->k;
    int64_t b_rows = gc->trans_b ? gc->n : gc->k, b_cols = gc->trans_b ? gc->k : gc->n;
    pv_gemm_args shape = {
        .m = gc->m, .n = gc->n, .k = gc->k, .trans_a = gc->trans_a, .trans_b = gc->trans_b,
        .alpha = 0.75f, .beta = 0.5f,
        .lda = a_cols + gc->pad, .ldb = b_cols + gc->pad, .ldc = gc->n + gc->pad,
    };
    size_t a_n = (size_t)(a_rows * shape.lda), b_n = (size_t)(b_rows * shape.ldb), c_n = (size_t)(gc->m * shape.ldc);
    float *a = xmalloc(a_n * sizeof *a), *b = xmalloc(b_n * sizeof *b), *c0 = xmalloc(c_n * sizeof *c0);
    rng_fill(&c->rng, a, a_n, -1.0f, 1.0f);
    rng_fill(&c->rng, b, b_n, -1.0f, 1.0f);
    rng_fill(&c->rng, c0, c_n, -1.0f, 1.0f);
    if (dtype == PV_F16) { /* both sides see the same rounded inputs */
        round_to_half(a, a_n);
        round_to_half(b, b_n);
        round_to_half(c0, c_n);
    }
    float *got = f32_copy(c0, c_n), *want = f32_copy(c0, c_n);
    int guards_ok = 0, ref_guards = 1;
    pv_status st = run_gemm(c->be, dtype, &shape, a, a_n, b, b_n, got, c_n, &guards_ok);
    if (c->cpu_pass || dtype == PV_F16) {
        /* C = alpha op(A) op(B) + beta C in double; padding columns keep C0. */
        for (int64_t i = 0; i < gc->m; i++)
            for (int64_t j = 0; j < gc->n; j++) {
                double sum = 0.0;
                for (int64_t p = 0; p < gc->k; p++)
                    sum += at(a, shape.lda, gc->trans_a, i, p) * at(b, shape.ldb, gc->trans_b, p, j);
                want[i * shape.ldc + j] = (float)(shape.alpha * sum + shape.beta * c0[i * shape.ldc + j]);
            }
    } else if (st == PV_OK) {
        st = run_gemm(c->cpu, PV_F32, &shape, a, a_n, b, b_n, want, c_n, &ref_guards);
    }
    double err = normalized_error(got, want, c_n);
    report(c, st, err, dtype == PV_F32 ? 1e-5 : 3e-3, guards_ok && ref_guards, "gemm %s m %lld n %lld k %lld%s%s pad %lld",
           pv_dtype_name(dtype), (long long)gc->m, (long long)gc->n, (long long)gc->k, gc->trans_a ? " A^T" : "",
           gc->trans_b ? " B^T" : "", (long long)gc->pad);
    free(a);
    free(b);
    free(c0);
    free(got);
    free(want);
}

/* ---- attention ----------------------------------------------------------------- */

typedef struct attention_case {
    const char *what;
    int32_t n_heads, n_kv_heads, head_dim, chunk_tokens;
    query_shape shape;
    int32_t n_query;
    int32_t n_seqs;
    int32_t seq_len[5];
} attention_case;

static const attention_case attention_cases[] = {
    {"decode, lengths 1 31 32 33 47", 4, 4, 64, 32, QUERY_DECODE, 1, 5, {1, 31, 32, 33, 47}},
    {"prefill, ragged", 6, 2, 128, 32, QUERY_PREFILL, 33, 4, {1, 31, 32, 33}},
    {"recovery, dropped range then prompt", 6, 2, 64, 32, QUERY_RECOVERY, 24, 3, {33, 64, 90}},
    {"prefill, chunk 16", 2, 2, 128, 16, QUERY_PREFILL, 12, 3, {17, 31, 40}},
    {"decode, context over 1000", 6, 2, 128, 32, QUERY_DECODE, 1, 2, {1025, 1300}},
    {"recovery, context over 1000", 4, 4, 64, 32, QUERY_RECOVERY, 16, 1, {1100}},
};

static void check_attention(ctx *c, const attention_case *ac, pv_dtype kv_dtype)
{
    if (!supported(c, PV_OP_ATTENTION, kv_dtype, ac->what))
        return;
    kv_scenario sc;
    kv_scenario_init(&sc, &c->rng, kv_dtype, ac->n_heads, ac->n_kv_heads, ac->head_dim, ac->chunk_tokens,
                     ac->seq_len, ac->n_seqs, ac->shape, ac->n_query);
    size_t n = (size_t)sc.n_tokens * sc.n_heads * sc.head_dim;
    float *got = xmalloc(n * sizeof *got);
    float *want = xmalloc(n * sizeof *want);
    int guards_ok = 0, ref_guards = 1;
    pv_status st = kv_scenario_run(&sc, c->be, got, &guards_ok);
    if (c->cpu_pass) {
        double *exact = xmalloc(n * sizeof *exact);
        kv_scenario_reference(&sc, exact);
        for (size_t i = 0; i < n; i++)
            want[i] = (float)exact[i];
        free(exact);
    } else if (st == PV_OK) {
        st = kv_scenario_run(&sc, c->cpu, want, &ref_guards);
    }
    double err = normalized_error(got, want, n);
    report(c, st, err, kv_dtype == PV_F32 ? 5e-5 : 5e-4, guards_ok && ref_guards,
           "attention %s KV, %s, heads %d/%d, head_dim %d, T %d", pv_dtype_name(kv_dtype), ac->what, ac->n_heads,
           ac->n_kv_heads, ac->head_dim, sc.n_tokens);
    free(got);
    free(want);
    kv_scenario_free(&sc);
}

/* ---- kv_write ------------------------------------------------------------------------ */

static pv_status run_kv_write(pv_backend *be, const kv_scenario *sc, const float *k, const float *v, void *pool_out,
                              int *guards_ok)
{
    size_t rows = (size_t)sc->n_tokens * sc->n_kv_heads * sc->head_dim;
    size_t pool_bytes = (size_t)sc->pool_elems * pv_dtype_size(sc->kv_dtype);
    tensor tk, tv;
    pv_buffer *pool = NULL;
    memset(&tv, 0, sizeof tv);
    pv_status st = tensor_init(&tk, be, PV_MEM_DEVICE, sizeof(float), rows, k);
    if (st == PV_OK)
        st = tensor_init(&tv, be, PV_MEM_DEVICE, sizeof(float), rows, v);
    if (st == PV_OK)
        st = pv_buffer_init(&pool, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_write(pool, 0, sc->pool, pool_bytes);
    if (st == PV_OK) {
        pv_kv_write_args a = {
            .kv_dtype = sc->kv_dtype,
            .n_tokens = sc->n_tokens,
            .n_kv_heads = sc->n_kv_heads,
            .head_dim = sc->head_dim,
            .chunk_tokens = sc->chunk_tokens,
            .k = tk.buf,
            .k_off = tk.off,
            .v = tv.buf,
            .v_off = tv.off,
            .kv_pool = pool,
            .n_slots = sc->n_slots,
            .token_seq = sc->token_seq,
            .token_pos = sc->token_pos,
            .slot_table = sc->slot_table,
            .n_seqs = sc->n_seqs,
            .max_chunks = sc->max_chunks,
        };
        st = pv_kv_write(be, &a);
    }
    if (st == PV_OK)
        st = pv_buffer_read(pool, 0, pool_out, pool_bytes);
    *guards_ok = st == PV_OK && guards_intact(&tk) && guards_intact(&tv);
    pv_buffer_free(pool);
    tensor_free(&tk);
    tensor_free(&tv);
    return st;
}

/* f16 values may differ by one unit in the last place: backends may round
 * f32 -> f16 differently at exact ties. Returns the number of elements off
 * by more (or NaN). */
static double half_mismatches(const pv_half *got, const pv_half *want, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        int diff = (int)got[i] - (int)want[i];
        float g = pv_half_to_float(got[i]);
        bad += isnan(g) || (diff != 0 && ((got[i] ^ want[i]) & 0x8000u)) || diff > 1 || diff < -1;
    }
    return (double)bad;
}

static void check_kv_write(ctx *c, pv_dtype kv_dtype, query_shape shape, int32_t n_query, const char *what)
{
    if (!supported(c, PV_OP_KV_WRITE, kv_dtype, what))
        return;
    /* Write the rows the scenario's query tokens would produce. */
    const int32_t seq_len[4] = {1, 33, 64, 70};
    kv_scenario sc;
    kv_scenario_init(&sc, &c->rng, kv_dtype, 2, 2, 64, 32, seq_len, 4, shape, n_query);
    size_t rows = (size_t)sc.n_tokens * sc.n_kv_heads * sc.head_dim;
    float *k = xmalloc(rows * sizeof *k), *v = xmalloc(rows * sizeof *v);
    rng_fill(&c->rng, k, rows, -4.0f, 4.0f);
    rng_fill(&c->rng, v, rows, -4.0f, 4.0f);
    size_t es = pv_dtype_size(kv_dtype);
    size_t pool_bytes = (size_t)sc.pool_elems * es;
    void *got = xmalloc(pool_bytes), *want = xmalloc(pool_bytes);
    int guards_ok = 0, ref_guards = 1;
    pv_status st = run_kv_write(c->be, &sc, k, v, got, &guards_ok);
    if (c->cpu_pass) {
        /* The initial pool with each token's rows stored at its slot/row. */
        memcpy(want, sc.pool, pool_bytes);
        kv_scenario expected = sc;
        expected.pool = want;
        size_t row = (size_t)sc.n_kv_heads * sc.head_dim;
        size_t slot_elems = 2 * (size_t)sc.chunk_tokens * row;
        for (int32_t i = 0; i < sc.n_tokens; i++) {
            int32_t p = sc.token_pos[i];
            int32_t slot = sc.slot_table[(size_t)sc.token_seq[i] * sc.max_chunks + p / sc.chunk_tokens];
            uint64_t k_at = (uint64_t)slot * slot_elems + (uint64_t)(p % sc.chunk_tokens) * row;
            for (size_t e = 0; e < row; e++) {
                pool_store(&expected, k_at + e, k[i * row + e]);
                pool_store(&expected, k_at + (uint64_t)sc.chunk_tokens * row + e, v[i * row + e]);
            }
        }
    } else if (st == PV_OK) {
        st = run_kv_write(c->cpu, &sc, k, v, want, &ref_guards);
    }
    double err = kv_dtype == PV_F16 && !c->cpu_pass ? half_mismatches(got, want, (size_t)sc.pool_elems)
                                                     : bytes_differing(got, want, pool_bytes);
    report(c, st, err, 0, guards_ok && ref_guards, "kv_write %s, %s, T %d (whole pool compared)",
           pv_dtype_name(kv_dtype), what, sc.n_tokens);
    free(k);
    free(v);
    free(got);
    free(want);
    kv_scenario_free(&sc);
}

/* ---- slot gather / scatter ----------------------------------------------------------- */

static pv_status run_slot_copy(pv_backend *be, int gather, pv_dtype dtype, int64_t slot_elems, int64_t n_slots,
                               const int32_t *slots, int32_t n_moved, void *pool, void *staging, int *guards_ok)
{
    size_t es = pv_dtype_size(dtype);
    size_t pool_bytes = (size_t)(n_slots * slot_elems) * es;
    tensor ts;
    pv_buffer *tp = NULL;
    pv_status st = tensor_init(&ts, be, PV_MEM_DEVICE, es, (uint64_t)(n_moved * slot_elems), staging);
    if (st == PV_OK)
        st = pv_buffer_init(&tp, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_write(tp, 0, pool, pool_bytes);
    if (st == PV_OK) {
        pv_slot_copy_args a = {
            .dtype = dtype, .slot_elems = slot_elems, .pool = tp, .n_slots = n_slots,
            .staging = ts.buf, .staging_off = ts.off, .slots = slots, .n_slots_moved = n_moved,
        };
        st = gather ? pv_slot_gather(be, &a) : pv_slot_scatter(be, &a);
    }
    if (st == PV_OK)
        st = tensor_read(&ts, staging);
    if (st == PV_OK)
        st = pv_buffer_read(tp, 0, pool, pool_bytes);
    *guards_ok = st == PV_OK && guards_intact(&ts);
    pv_buffer_free(tp);
    tensor_free(&ts);
    return st;
}

static void check_slot_copy(ctx *c, int gather, pv_dtype dtype, int64_t slot_elems, int64_t n_slots, int32_t n_moved)
{
    pv_op op = gather ? PV_OP_SLOT_GATHER : PV_OP_SLOT_SCATTER;
    if (!supported(c, op, dtype, "slot copy"))
        return;
    size_t es = pv_dtype_size(dtype);
    size_t pool_bytes = (size_t)(n_slots * slot_elems) * es;
    size_t staging_bytes = (size_t)(n_moved * slot_elems) * es;
    int32_t *order = xmalloc((size_t)n_slots * sizeof *order);
    for (int32_t i = 0; i < n_slots; i++)
        order[i] = i;
    rng_shuffle(&c->rng, order, (size_t)n_slots); /* distinct, non-contiguous slots */
    unsigned char *pool0 = xmalloc(pool_bytes), *staging0 = xmalloc(staging_bytes);
    for (size_t i = 0; i < pool_bytes; i++)
        pool0[i] = (unsigned char)rng_next(&c->rng);
    for (size_t i = 0; i < staging_bytes; i++)
        staging0[i] = (unsigned char)rng_next(&c->rng);
    unsigned char *pool = xmalloc(pool_bytes), *staging = xmalloc(staging_bytes);
    unsigned char *want_pool = xmalloc(pool_bytes), *want_staging = xmalloc(staging_bytes);
    memcpy(pool, pool0, pool_bytes);
    memcpy(staging, staging0, staging_bytes);
    int guards_ok = 0, ref_guards = 1;
    pv_status st = run_slot_copy(c->be, gather, dtype, slot_elems, n_slots, order, n_moved, pool, staging, &guards_ok);
    memcpy(want_pool, pool0, pool_bytes);
    memcpy(want_staging, staging0, staging_bytes);
    if (c->cpu_pass) {
        size_t slot_bytes = (size_t)slot_elems * es;
        for (int32_t i = 0; i < n_moved; i++) {
            unsigned char *slot = want_pool + (size_t)order[i] * slot_bytes;
            unsigned char *row = want_staging + (size_t)i * slot_bytes;
            if (gather)
                memcpy(row, slot, slot_bytes);
            else
                memcpy(slot, row, slot_bytes);
        }
    } else if (st == PV_OK) {
        st = run_slot_copy(c->cpu, gather, dtype, slot_elems, n_slots, order, n_moved, want_pool, want_staging,
                           &ref_guards);
    }
    double err = bytes_differing(pool, want_pool, pool_bytes) + bytes_differing(staging, want_staging, staging_bytes);
    report(c, st, err, 0, guards_ok && ref_guards, "%s %s, %d of %lld slots of %lld elements (pool and staging compared)",
           gather ? "slot_gather" : "slot_scatter", pv_dtype_name(dtype), n_moved, (long long)n_slots,
           (long long)slot_elems);
    free(order);
    free(pool0);
    free(staging0);
    free(pool);
    free(staging);
    free(want_pool);
    free(want_staging);
}

/* ---- embed_gather ----------------------------------------------------------------------- */

static pv_status run_embed(pv_backend *be, pv_dtype dtype, const void *table, int64_t n_rows, int64_t dim,
                           const int32_t *ids, int32_t n_ids, float *out, int *guards_ok)
{
    tensor tt, to;
    memset(&to, 0, sizeof to);
    pv_status st = tensor_init(&tt, be, PV_MEM_DEVICE, pv_dtype_size(dtype), (uint64_t)(n_rows * dim), table);
    if (st == PV_OK)
        st = tensor_init(&to, be, PV_MEM_DEVICE, sizeof(float), (uint64_t)n_ids * (uint64_t)dim, NULL);
    if (st == PV_OK) {
        pv_embed_gather_args a = {
            .table_type = (pv_wtype)dtype, .n_rows = n_rows, .dim = dim, .table = tt.buf, .table_off = tt.off,
            .ids = ids, .n_ids = n_ids, .out = to.buf, .out_off = to.off,
        };
        st = pv_embed_gather(be, &a);
    }
    if (st == PV_OK)
        st = tensor_read(&to, out);
    *guards_ok = st == PV_OK && guards_intact(&to) && guards_intact(&tt);
    tensor_free(&tt);
    tensor_free(&to);
    return st;
}

static void check_embed(ctx *c, pv_dtype dtype, int64_t n_rows, int64_t dim, int32_t n_ids)
{
    if (!supported(c, PV_OP_EMBED_GATHER, dtype, "embed_gather"))
        return;
    size_t es = pv_dtype_size(dtype), n = (size_t)(n_rows * dim);
    float *values = xmalloc(n * sizeof *values);
    rng_fill(&c->rng, values, n, -1.0f, 1.0f);
    void *table = xmalloc(n * es);
    for (size_t i = 0; i < n; i++) {
        if (dtype == PV_F32)
            ((float *)table)[i] = values[i];
        else
            ((pv_half *)table)[i] = pv_float_to_half(values[i]);
    }
    int32_t *ids = xmalloc((size_t)n_ids * sizeof *ids);
    for (int32_t i = 0; i < n_ids; i++) /* repeats allowed, last row included */
        ids[i] = i == 0 ? (int32_t)(n_rows - 1) : rng_below(&c->rng, n_rows);
    size_t out_n = (size_t)n_ids * (size_t)dim;
    float *got = xmalloc(out_n * sizeof *got), *want = xmalloc(out_n * sizeof *want);
    int guards_ok = 0, ref_guards = 1;
    pv_status st = run_embed(c->be, dtype, table, n_rows, dim, ids, n_ids, got, &guards_ok);
    if (c->cpu_pass) {
        for (int32_t i = 0; i < n_ids; i++)
            for (int64_t d = 0; d < dim; d++) {
                size_t src = (size_t)ids[i] * (size_t)dim + (size_t)d;
                want[(size_t)i * dim + d] = dtype == PV_F32 ? values[src] : pv_half_to_float(((pv_half *)table)[src]);
            }
    } else if (st == PV_OK) {
        st = run_embed(c->cpu, dtype, table, n_rows, dim, ids, n_ids, want, &ref_guards);
    }
    report(c, st, normalized_error(got, want, out_n), 0, guards_ok && ref_guards, "embed_gather %s, %d ids of %lld x %lld",
           pv_dtype_name(dtype), n_ids, (long long)n_rows, (long long)dim);
    free(values);
    free(table);
    free(ids);
    free(got);
    free(want);
}

/* ---- element-wise and row ops -------------------------------------------------------------
 * These share one runner: up to three f32 inputs and one f32 output (or in
 * place on input 0), each in its own guarded tensor. */

typedef enum row_op { ROW_RMSNORM, ROW_SWIGLU, ROW_ADD, ROW_SOFTMAX } row_op;

typedef struct row_args {
    row_op op;
    int64_t rows, cols; /* n = rows * cols for the element-wise ops */
    float eps, scale;
    int in_place;
} row_args;

static pv_status run_row_op(pv_backend *be, const row_args *r, const float *x, const float *y, float *out,
                            int *guards_ok)
{
    size_t n = (size_t)(r->rows * r->cols);
    size_t y_n = r->op == ROW_RMSNORM ? (size_t)r->cols : n;
    tensor tx, ty, to;
    memset(&ty, 0, sizeof ty);
    memset(&to, 0, sizeof to);
    pv_status st = tensor_init(&tx, be, PV_MEM_DEVICE, sizeof(float), n, x);
    if (st == PV_OK && y)
        st = tensor_init(&ty, be, PV_MEM_DEVICE, sizeof(float), y_n, y);
    if (st == PV_OK && !r->in_place)
        st = tensor_init(&to, be, PV_MEM_DEVICE, sizeof(float), n, NULL);
    tensor *dst = r->in_place ? &tx : &to;
    if (st == PV_OK) {
        switch (r->op) {
        case ROW_RMSNORM: {
            pv_rmsnorm_args a = {.rows = r->rows, .dim = r->cols, .eps = r->eps, .x = tx.buf, .x_off = tx.off,
                                 .weight = ty.buf, .weight_off = ty.off, .out = dst->buf, .out_off = dst->off};
            st = pv_rmsnorm(be, &a);
            break;
        }
        case ROW_SWIGLU: {
            pv_swiglu_args a = {.n = (int64_t)n, .gate = tx.buf, .gate_off = tx.off, .up = ty.buf, .up_off = ty.off,
                                .out = dst->buf, .out_off = dst->off};
            st = pv_swiglu(be, &a);
            break;
        }
        case ROW_ADD: {
            pv_add_args a = {.n = (int64_t)n, .a = tx.buf, .a_off = tx.off, .b = ty.buf, .b_off = ty.off,
                             .out = dst->buf, .out_off = dst->off};
            st = pv_add(be, &a);
            break;
        }
        case ROW_SOFTMAX: {
            pv_softmax_args a = {.rows = r->rows, .cols = r->cols, .scale = r->scale, .x = tx.buf, .x_off = tx.off,
                                 .out = dst->buf, .out_off = dst->off};
            st = pv_softmax(be, &a);
            break;
        }
        }
    }
    if (st == PV_OK)
        st = tensor_read(dst, out);
    *guards_ok = st == PV_OK && guards_intact(&tx) && (!y || guards_intact(&ty)) && (r->in_place || guards_intact(&to));
    tensor_free(&tx);
    tensor_free(&ty);
    tensor_free(&to);
    return st;
}

/* Closed forms of the row ops in double. */
static void row_op_exact(const row_args *r, const float *x, const float *y, float *out)
{
    size_t cols = (size_t)r->cols;
    for (int64_t row = 0; row < r->rows; row++) {
        const float *xr = x + (size_t)row * cols;
        float *o = out + (size_t)row * cols;
        double acc = 0.0, max = -INFINITY;
        switch (r->op) {
        case ROW_RMSNORM:
            for (size_t i = 0; i < cols; i++)
                acc += (double)xr[i] * xr[i];
            for (size_t i = 0; i < cols; i++)
                o[i] = (float)(xr[i] / sqrt(acc / (double)cols + r->eps) * y[i]);
            break;
        case ROW_SWIGLU:
            for (size_t i = 0; i < cols; i++) {
                double g = xr[i];
                o[i] = (float)(g / (1.0 + exp(-g)) * y[(size_t)row * cols + i]);
            }
            break;
        case ROW_ADD: /* one f32 rounding, the same on every IEEE backend */
            for (size_t i = 0; i < cols; i++)
                o[i] = xr[i] + y[(size_t)row * cols + i];
            break;
        case ROW_SOFTMAX:
            for (size_t i = 0; i < cols; i++)
                max = fmax(max, (double)xr[i] * r->scale);
            for (size_t i = 0; i < cols; i++)
                acc += exp((double)xr[i] * r->scale - max);
            for (size_t i = 0; i < cols; i++)
                o[i] = (float)(exp((double)xr[i] * r->scale - max) / acc);
            break;
        }
    }
}

static const char *row_op_name(row_op op)
{
    static const char *const names[] = {"rmsnorm", "swiglu", "add", "softmax"};
    return names[op];
}

static void check_row_op(ctx *c, const row_args *r)
{
    static const pv_op ops[] = {PV_OP_RMSNORM, PV_OP_SWIGLU, PV_OP_ADD, PV_OP_SOFTMAX};
    if (!supported(c, ops[r->op], PV_F32, row_op_name(r->op)))
        return;
    size_t n = (size_t)(r->rows * r->cols);
    float *x = xmalloc(n * sizeof *x), *y = NULL;
    rng_fill(&c->rng, x, n, -6.0f, 6.0f);
    if (r->op != ROW_SOFTMAX) {
        size_t y_n = r->op == ROW_RMSNORM ? (size_t)r->cols : n;
        y = xmalloc(y_n * sizeof *y);
        rng_fill(&c->rng, y, y_n, -2.0f, 2.0f);
    }
    float *got = xmalloc(n * sizeof *got), *want = xmalloc(n * sizeof *want);
    int guards_ok = 0, ref_guards = 1;
    pv_status st = run_row_op(c->be, r, x, y, got, &guards_ok);
    if (c->cpu_pass)
        row_op_exact(r, x, y, want);
    else if (st == PV_OK)
        st = run_row_op(c->cpu, r, x, y, want, &ref_guards);
    double limit = r->op == ROW_ADD ? 0 : c->cpu_pass ? 1e-6 : 1e-5;
    report(c, st, normalized_error(got, want, n), limit, guards_ok && ref_guards, "%s %lld x %lld%s", row_op_name(r->op),
           (long long)r->rows, (long long)r->cols, r->in_place ? " in place" : "");
    if (c->cpu_pass && r->op == ROW_SOFTMAX && st == PV_OK) {
        double worst = 0.0;
        for (int64_t row = 0; row < r->rows; row++) {
            double sum = 0.0;
            for (int64_t i = 0; i < r->cols; i++)
                sum += got[row * r->cols + i];
            worst = fmax(worst, isnan(sum) ? INFINITY : fabs(sum - 1.0));
        }
        ok(worst <= 1e-5, "cpu: softmax rows sum to 1: worst |sum - 1| %.3g", worst);
    }
    free(x);
    free(y);
    free(got);
    free(want);
}

/* ---- rope --------------------------------------------------------------------------------- */

static pv_status run_rope(pv_backend *be, int32_t n_tokens, int32_t n_heads, int32_t head_dim, float base, int neox,
                          const int32_t *pos, const float *x, float *out, int *guards_ok)
{
    size_t n = (size_t)n_tokens * n_heads * head_dim;
    tensor tx;
    pv_status st = tensor_init(&tx, be, PV_MEM_DEVICE, sizeof(float), n, x);
    if (st == PV_OK) {
        pv_rope_args a = {.n_tokens = n_tokens, .n_heads = n_heads, .head_dim = head_dim, .base = base,
                          .neox = neox, .x = tx.buf, .x_off = tx.off, .pos = pos};
        st = pv_rope(be, &a);
    }
    if (st == PV_OK)
        st = tensor_read(&tx, out);
    *guards_ok = st == PV_OK && guards_intact(&tx);
    tensor_free(&tx);
    return st;
}

/* Every pair of every head at every position against a double-precision
 * rotation: pair i turns by pos * base^(-2i/head_dim), so a wrong frequency
 * for any pair shows. Random positions up to 4095, x in [-1, 1). Each
 * element may be off by 1e-6 (f32 rounding) plus 2^-20 x its angle in
 * radians: what an angle formed in f32 costs a device without double.
 * Scaling by the angle keeps slow pairs strict (pair 63 of 128 at base
 * 5e5 turns 0.01 rad by position 4095), so their frequencies are checked
 * too. Reported: the worst error over its allowance; 1 passes. */
static void check_rope(ctx *c, int32_t head_dim, float base, int neox)
{
    if (!supported(c, PV_OP_ROPE, PV_F32, "rope"))
        return;
    int32_t n_tokens = 37, n_heads = 3, half = head_dim / 2;
    size_t n = (size_t)n_tokens * n_heads * head_dim;
    int32_t *pos = xmalloc((size_t)n_tokens * sizeof *pos);
    for (int32_t t = 0; t < n_tokens; t++)
        pos[t] = t < 3 ? t * 2047 : rng_below(&c->rng, 4096);
    float *x = xmalloc(n * sizeof *x), *got = xmalloc(n * sizeof *got);
    double *want = xmalloc(n * sizeof *want), *allowed = xmalloc(n * sizeof *allowed);
    rng_fill(&c->rng, x, n, -1.0f, 1.0f);
    for (int32_t t = 0; t < n_tokens; t++)
        for (int32_t h = 0; h < n_heads; h++)
            for (int32_t i = 0; i < half; i++) {
                size_t head = ((size_t)t * n_heads + h) * head_dim;
                size_t first = head + (size_t)(neox ? i : 2 * i), second = head + (size_t)(neox ? i + half : 2 * i + 1);
                double angle = pos[t] * pow((double)base, -2.0 * i / head_dim);
                want[first] = x[first] * cos(angle) - x[second] * sin(angle);
                want[second] = x[first] * sin(angle) + x[second] * cos(angle);
                allowed[first] = allowed[second] = 1e-6 + angle * 0x1p-20;
            }
    int guards_ok = 0;
    pv_status st = run_rope(c->be, n_tokens, n_heads, head_dim, base, neox, pos, x, got, &guards_ok);
    double worst = 0.0;
    for (size_t e = 0; e < n; e++)
        worst = isfinite(got[e]) ? fmax(worst, fabs(got[e] - want[e]) / allowed[e]) : INFINITY;
    report(c, st, worst, 1.0, guards_ok, "rope %s head_dim %d base %g: every pair against a double rotation",
           neox ? "neox" : "normal", head_dim, (double)base);
    free(pos);
    free(x);
    free(got);
    free(want);
    free(allowed);
}

/* Closed forms on the CPU: pair 0 turns by exactly pos radians (base^0 = 1),
 * so (1, 0) -> (cos pos, sin pos); and rotations preserve dot products up to
 * the relative position: <rope(q, m), rope(k, n)> = <rope(q, m + s), rope(k, n + s)>. */
static void check_rope_closed_form(ctx *c, int neox)
{
    enum { HEAD_DIM = 64, TOKENS = 4 };
    int32_t pos[TOKENS] = {0, 1, 100, 1000};
    float x[TOKENS * HEAD_DIM], got[TOKENS * HEAD_DIM];
    memset(x, 0, sizeof x);
    int32_t second = neox ? HEAD_DIM / 2 : 1;
    for (int t = 0; t < TOKENS; t++)
        x[t * HEAD_DIM] = 1.0f;
    int guards_ok = 0;
    pv_status st = run_rope(c->be, TOKENS, 1, HEAD_DIM, 10000.0f, neox, pos, x, got, &guards_ok);
    double err = 0.0;
    for (int t = 0; st == PV_OK && t < TOKENS; t++) {
        err = fmax(err, fabs(got[t * HEAD_DIM] - cos(pos[t])));
        err = fmax(err, fabs(got[t * HEAD_DIM + second] - sin(pos[t])));
        for (int d = 0; d < HEAD_DIM; d++)
            if (d != 0 && d != second)
                err = fmax(err, fabs(got[t * HEAD_DIM + d]));
    }
    report(c, st, err, 1e-6, guards_ok, "rope %s: pair 0 of (1, 0) at pos p is (cos p, sin p)", neox ? "neox" : "normal");

    /* q at positions (m, m+s), k at (n, n+s): tokens interleaved q, k, q, k. */
    float qk[4 * HEAD_DIM], turned[4 * HEAD_DIM];
    rng_fill(&c->rng, qk, 2 * HEAD_DIM, -1.0f, 1.0f);
    memcpy(qk + 2 * HEAD_DIM, qk, 2 * HEAD_DIM * sizeof(float));
    int32_t rel_pos[4] = {17, 5, 17 + 900, 5 + 900};
    st = run_rope(c->be, 4, 1, HEAD_DIM, 500000.0f, neox, rel_pos, qk, turned, &guards_ok);
    double dot_near = 0.0, dot_far = 0.0, q_norm = 0.0, k_norm = 0.0;
    for (int d = 0; d < HEAD_DIM; d++) {
        dot_near += (double)turned[d] * turned[HEAD_DIM + d];
        dot_far += (double)turned[2 * HEAD_DIM + d] * turned[3 * HEAD_DIM + d];
        q_norm += (double)qk[d] * qk[d];
        k_norm += (double)qk[HEAD_DIM + d] * qk[HEAD_DIM + d];
    }
    report(c, st, fabs(dot_near - dot_far) / sqrt(q_norm * k_norm), 1e-6, guards_ok,
           "rope %s: q.k depends only on the relative position", neox ? "neox" : "normal");
}

/* ---- fused ops: add_rmsnorm, rope_kv_write -------------------------------------------------
 * Each fused op must give what the ops it stands for give. In the CPU pass
 * the CPU's fused op (the reference) is held to the CPU's unfused ops;
 * elsewhere a backend's fused op is held to the CPU's. */

/* x += y, out = rmsnorm(x) * w, fused or as pv_add then pv_rmsnorm. */
static pv_status run_add_rmsnorm(pv_backend *be, int fused, int64_t rows, int64_t dim, const float *x, const float *y,
                                 const float *w, float *x_out, float *out, int *guards_ok)
{
    const size_t n = (size_t)(rows * dim);
    tensor tx, ty, tw, to;
    memset(&ty, 0, sizeof ty);
    memset(&tw, 0, sizeof tw);
    memset(&to, 0, sizeof to);
    pv_status st = tensor_init(&tx, be, PV_MEM_DEVICE, 4, n, x);
    if (st == PV_OK)
        st = tensor_init(&ty, be, PV_MEM_DEVICE, 4, n, y);
    if (st == PV_OK)
        st = tensor_init(&tw, be, PV_MEM_DEVICE, 4, (size_t)dim, w);
    if (st == PV_OK)
        st = tensor_init(&to, be, PV_MEM_DEVICE, 4, n, NULL);
    if (st == PV_OK && fused) {
        pv_add_rmsnorm_args a = {.rows = rows, .dim = dim, .eps = 1e-5f, .x = tx.buf, .x_off = tx.off, .y = ty.buf,
                                 .y_off = ty.off, .weight = tw.buf, .weight_off = tw.off, .out = to.buf,
                                 .out_off = to.off};
        st = pv_add_rmsnorm(be, &a);
    } else if (st == PV_OK) {
        pv_add_args add = {.n = (int64_t)n, .a = tx.buf, .a_off = tx.off, .b = ty.buf, .b_off = ty.off,
                           .out = tx.buf, .out_off = tx.off};
        pv_rmsnorm_args norm = {.rows = rows, .dim = dim, .eps = 1e-5f, .x = tx.buf, .x_off = tx.off,
                                .weight = tw.buf, .weight_off = tw.off, .out = to.buf, .out_off = to.off};
        st = pv_add(be, &add);
        if (st == PV_OK)
            st = pv_rmsnorm(be, &norm);
    }
    if (st == PV_OK)
        st = tensor_read(&tx, x_out);
    if (st == PV_OK)
        st = tensor_read(&to, out);
    *guards_ok = st == PV_OK && guards_intact(&tx) && guards_intact(&ty) && guards_intact(&tw) && guards_intact(&to);
    tensor_free(&tx);
    tensor_free(&ty);
    tensor_free(&tw);
    tensor_free(&to);
    return st;
}

/* The sum is one f32 rounding (bit-exact everywhere); the norm is held to
 * pv_rmsnorm's limits. */
static void check_add_rmsnorm(ctx *c, int64_t rows, int64_t dim)
{
    if (!supported(c, PV_OP_ADD_RMSNORM, PV_F32, "add_rmsnorm"))
        return;
    const size_t n = (size_t)(rows * dim);
    float *x = xmalloc(n * sizeof *x), *y = xmalloc(n * sizeof *y), *w = xmalloc((size_t)dim * sizeof *w);
    rng_fill(&c->rng, x, n, -6.0f, 6.0f);
    rng_fill(&c->rng, y, n, -2.0f, 2.0f);
    rng_fill(&c->rng, w, (size_t)dim, -2.0f, 2.0f);
    float *got_x = xmalloc(n * sizeof *got_x), *got = xmalloc(n * sizeof *got);
    float *want_x = xmalloc(n * sizeof *want_x), *want = xmalloc(n * sizeof *want);
    int guards_ok = 0, ref_guards = 1;
    pv_status st = run_add_rmsnorm(c->be, 1, rows, dim, x, y, w, got_x, got, &guards_ok);
    if (st == PV_OK)
        st = run_add_rmsnorm(c->cpu, !c->cpu_pass, rows, dim, x, y, w, want_x, want, &ref_guards);
    report(c, st, bytes_differing(got_x, want_x, n * sizeof *got_x), 0, guards_ok && ref_guards,
           "add_rmsnorm %lld x %lld: x + y as %s", (long long)rows, (long long)dim,
           c->cpu_pass ? "pv_add gives it" : "the CPU's");
    report(c, st, normalized_error(got, want, n), c->cpu_pass ? 1e-6 : 1e-5, guards_ok && ref_guards,
           "add_rmsnorm %lld x %lld: the norm as %s", (long long)rows, (long long)dim,
           c->cpu_pass ? "pv_rmsnorm gives it" : "the CPU's");
    free(x);
    free(y);
    free(w);
    free(got_x);
    free(got);
    free(want_x);
    free(want);
}

typedef struct rope_kv_case {
    const char *what;
    int32_t n_heads, n_kv_heads, head_dim, chunk_tokens;
    query_shape shape;
    int32_t n_query, n_seqs;
    int32_t seq_len[4];
} rope_kv_case;

/* q, k, v in; q rotated, the pool and k out: pv_rope_kv_write (fused), or
 * pv_rope on q and k then pv_kv_write. */
static pv_status run_rope_kv_write(pv_backend *be, int fused, const kv_scenario *sc, int neox, float base,
                                   const float *q, const float *k, const float *v, float *q_out, void *pool_out,
                                   float *k_out, int *guards_ok)
{
    const size_t q_n = (size_t)sc->n_tokens * sc->n_heads * sc->head_dim;
    const size_t kv_n = (size_t)sc->n_tokens * sc->n_kv_heads * sc->head_dim;
    const size_t pool_bytes = (size_t)sc->pool_elems * pv_dtype_size(sc->kv_dtype);
    tensor tq, tk, tv;
    pv_buffer *pool = NULL;
    memset(&tk, 0, sizeof tk);
    memset(&tv, 0, sizeof tv);
    pv_status st = tensor_init(&tq, be, PV_MEM_DEVICE, 4, q_n, q);
    if (st == PV_OK)
        st = tensor_init(&tk, be, PV_MEM_DEVICE, 4, kv_n, k);
    if (st == PV_OK)
        st = tensor_init(&tv, be, PV_MEM_DEVICE, 4, kv_n, v);
    if (st == PV_OK)
        st = pv_buffer_init(&pool, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_write(pool, 0, sc->pool, pool_bytes);
    pv_rope_kv_write_args a = {
        .kv_dtype = sc->kv_dtype, .n_tokens = sc->n_tokens, .n_heads = sc->n_heads, .n_kv_heads = sc->n_kv_heads,
        .head_dim = sc->head_dim, .chunk_tokens = sc->chunk_tokens, .base = base, .neox = neox, .q = tq.buf,
        .q_off = tq.off, .k = tk.buf, .k_off = tk.off, .v = tv.buf, .v_off = tv.off, .kv_pool = pool,
        .n_slots = sc->n_slots, .token_seq = sc->token_seq, .token_pos = sc->token_pos,
        .slot_table = sc->slot_table, .n_seqs = sc->n_seqs, .max_chunks = sc->max_chunks,
    };
    if (st == PV_OK && fused) {
        st = pv_rope_kv_write(be, &a);
    } else if (st == PV_OK) {
        pv_rope_args rq = {.n_tokens = sc->n_tokens, .n_heads = sc->n_heads, .head_dim = sc->head_dim, .base = base,
                           .neox = neox, .x = tq.buf, .x_off = tq.off, .pos = sc->token_pos};
        pv_rope_args rk = rq;
        rk.n_heads = sc->n_kv_heads;
        rk.x = tk.buf;
        rk.x_off = tk.off;
        pv_kv_write_args w = {
            .kv_dtype = sc->kv_dtype, .n_tokens = sc->n_tokens, .n_kv_heads = sc->n_kv_heads,
            .head_dim = sc->head_dim, .chunk_tokens = sc->chunk_tokens, .k = tk.buf, .k_off = tk.off, .v = tv.buf,
            .v_off = tv.off, .kv_pool = pool, .n_slots = sc->n_slots, .token_seq = sc->token_seq,
            .token_pos = sc->token_pos, .slot_table = sc->slot_table, .n_seqs = sc->n_seqs,
            .max_chunks = sc->max_chunks,
        };
        st = pv_rope(be, &rq);
        if (st == PV_OK)
            st = pv_rope(be, &rk);
        if (st == PV_OK)
            st = pv_kv_write(be, &w);
        if (st == PV_OK) /* the fused op leaves k as it was: so does this */
            st = tensor_write(&tk, k);
    }
    if (st == PV_OK)
        st = tensor_read(&tq, q_out);
    if (st == PV_OK)
        st = tensor_read(&tk, k_out);
    if (st == PV_OK)
        st = pv_buffer_read(pool, 0, pool_out, pool_bytes);
    *guards_ok = st == PV_OK && guards_intact(&tq) && guards_intact(&tk) && guards_intact(&tv);
    pv_buffer_free(pool);
    tensor_free(&tq);
    tensor_free(&tk);
    tensor_free(&tv);
    return st;
}

/* What a rotated element of pair i at position pos may be off by, for
 * inputs in [-1, 1): check_rope's allowance. */
static double rope_allowance(int32_t pos, int32_t i, int32_t head_dim, float base)
{
    return 1e-6 + pos * pow((double)base, -2.0 * i / head_dim) * 0x1p-20;
}

/* Worst |got - want| / allowed over n; an element allowed 0 must be equal. */
static double worst_over_allowance(const float *got, const float *want, const double *allowed, size_t n)
{
    double worst = 0.0;
    for (size_t e = 0; e < n; e++) {
        if (isnan(got[e]) != isnan(want[e]))
            return INFINITY;
        double diff = isnan(got[e]) ? 0.0 : fabs((double)got[e] - (double)want[e]);
        if (diff > 0.0)
            worst = fmax(worst, allowed[e] > 0.0 ? diff / allowed[e] : INFINITY);
    }
    return worst;
}

/* q against the reference within rope's allowance; the pool: the rotated K
 * elements within it, everything else (V rows, the rows and slots nobody
 * writes) exact, or with f16 within one unit in the last place; k intact. */
static void check_rope_kv_write(ctx *c, const rope_kv_case *rc, pv_dtype kv_dtype, int neox)
{
    if (!supported(c, PV_OP_ROPE_KV_WRITE, kv_dtype, rc->what))
        return;
    const float base = 10000.0f;
    kv_scenario sc;
    kv_scenario_init(&sc, &c->rng, kv_dtype, rc->n_heads, rc->n_kv_heads, rc->head_dim, rc->chunk_tokens,
                     rc->seq_len, rc->n_seqs, rc->shape, rc->n_query);
    const int32_t half = rc->head_dim / 2;
    const size_t q_n = (size_t)sc.n_tokens * sc.n_heads * sc.head_dim;
    const size_t kv_n = (size_t)sc.n_tokens * sc.n_kv_heads * sc.head_dim;
    const size_t pool_bytes = (size_t)sc.pool_elems * pv_dtype_size(kv_dtype);
    float *q = xmalloc(q_n * sizeof *q), *k = xmalloc(kv_n * sizeof *k), *v = xmalloc(kv_n * sizeof *v);
    rng_fill(&c->rng, q, q_n, -1.0f, 1.0f);
    rng_fill(&c->rng, k, kv_n, -1.0f, 1.0f);
    rng_fill(&c->rng, v, kv_n, -1.0f, 1.0f);
    float *got_q = xmalloc(q_n * sizeof *got_q), *want_q = xmalloc(q_n * sizeof *want_q);
    float *got_k = xmalloc(kv_n * sizeof *got_k), *want_k = xmalloc(kv_n * sizeof *want_k);
    void *got_pool = xmalloc(pool_bytes), *want_pool = xmalloc(pool_bytes);
    double *q_allowed = xmalloc(q_n * sizeof *q_allowed);
    double *pool_allowed = xmalloc((size_t)sc.pool_elems * sizeof *pool_allowed);
    memset(pool_allowed, 0, (size_t)sc.pool_elems * sizeof *pool_allowed);
    const size_t row = (size_t)sc.n_kv_heads * sc.head_dim, slot_elems = 2 * (size_t)sc.chunk_tokens * row;
    for (int32_t t = 0; t < sc.n_tokens; t++) {
        const int32_t p = sc.token_pos[t];
        const size_t k_at = (size_t)sc.slot_table[(size_t)sc.token_seq[t] * sc.max_chunks + p / sc.chunk_tokens] *
                                slot_elems + (size_t)(p % sc.chunk_tokens) * row;
        for (int32_t i = 0; i < half; i++) {
            const double allowed = rope_allowance(p, i, sc.head_dim, base);
            const int32_t first = neox ? i : 2 * i, second = neox ? i + half : 2 * i + 1;
            for (int32_t h = 0; h < sc.n_heads; h++) {
                const size_t head = ((size_t)t * sc.n_heads + h) * sc.head_dim;
                q_allowed[head + first] = q_allowed[head + second] = allowed;
            }
            for (int32_t h = 0; h < sc.n_kv_heads; h++)
                pool_allowed[k_at + (size_t)h * sc.head_dim + first] =
                    pool_allowed[k_at + (size_t)h * sc.head_dim + second] = allowed;
        }
    }
    int guards_ok = 0, ref_guards = 1;
    pv_status st = run_rope_kv_write(c->be, 1, &sc, neox, base, q, k, v, got_q, got_pool, got_k, &guards_ok);
    if (st == PV_OK)
        st = run_rope_kv_write(c->cpu, !c->cpu_pass, &sc, neox, base, q, k, v, want_q, want_pool, want_k,
                               &ref_guards);
    const char *ref = c->cpu_pass ? "rope then kv_write" : "the CPU";
    report(c, st, worst_over_allowance(got_q, want_q, q_allowed, q_n), 1.0, guards_ok && ref_guards,
           "rope_kv_write %s %s, %s, T %d: q as %s turns it (error over allowance)", pv_dtype_name(kv_dtype),
           neox ? "neox" : "normal", rc->what, sc.n_tokens, ref);
    double pool_err = kv_dtype == PV_F16
                          ? half_mismatches(got_pool, want_pool, (size_t)sc.pool_elems)
                          : worst_over_allowance(got_pool, want_pool, pool_allowed, (size_t)sc.pool_elems);
    report(c, st, pool_err, kv_dtype == PV_F16 ? 0.0 : 1.0, 1,
           "rope_kv_write %s %s, %s: the whole pool as %s writes it", pv_dtype_name(kv_dtype),
           neox ? "neox" : "normal", rc->what, ref);
    report(c, st, bytes_differing(got_k, k, kv_n * sizeof *k), 0, 1, "rope_kv_write %s %s, %s: k unchanged",
           pv_dtype_name(kv_dtype), neox ? "neox" : "normal", rc->what);
    free(q);
    free(k);
    free(v);
    free(got_q);
    free(want_q);
    free(got_k);
    free(want_k);
    free(got_pool);
    free(want_pool);
    free(q_allowed);
    free(pool_allowed);
    kv_scenario_free(&sc);
}

/* ---- argmax and top-p sampling ------------------------------------------------------------ */

static pv_status run_pick(pv_backend *be, int sample, int64_t rows, int64_t cols, const float *x, float temperature,
                          float top_p, const float *u, int32_t *out, int *guards_ok)
{
    tensor tx;
    pv_status st = tensor_init(&tx, be, PV_MEM_DEVICE, sizeof(float), (uint64_t)(rows * cols), x);
    if (st == PV_OK && sample) {
        pv_sample_args a = {.rows = rows, .cols = cols, .temperature = temperature, .top_p = top_p,
                            .logits = tx.buf, .logits_off = tx.off, .u = u, .out = out};
        st = pv_sample_top_p(be, &a);
    } else if (st == PV_OK) {
        pv_argmax_args a = {.rows = rows, .cols = cols, .x = tx.buf, .x_off = tx.off, .out = out};
        st = pv_argmax(be, &a);
    }
    *guards_ok = st == PV_OK && guards_intact(&tx);
    tensor_free(&tx);
    return st;
}

static double mismatches(const int32_t *a, const int32_t *b, int64_t n)
{
    double bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += a[i] != b[i];
    return bad;
}

/* Each row's maximum appears twice; the lower index must win. */
static void check_argmax(ctx *c, int64_t rows, int64_t cols)
{
    if (!supported(c, PV_OP_ARGMAX, PV_F32, "argmax"))
        return;
    float *x = xmalloc((size_t)(rows * cols) * sizeof *x);
    rng_fill(&c->rng, x, (size_t)(rows * cols), -10.0f, 10.0f);
    int32_t *got = xmalloc((size_t)rows * sizeof *got), *want = xmalloc((size_t)rows * sizeof *want);
    for (int64_t r = 0; r < rows; r++) {
        int32_t a = rng_below(&c->rng, cols), b = rng_below(&c->rng, cols);
        x[r * cols + a] = 11.0f;
        x[r * cols + b] = 11.0f;
        want[r] = a < b ? a : b;
    }
    int guards_ok = 0, ref_guards = 1;
    pv_status st = run_pick(c->be, 0, rows, cols, x, 0, 0, NULL, got, &guards_ok);
    if (!c->cpu_pass && st == PV_OK)
        st = run_pick(c->cpu, 0, rows, cols, x, 0, 0, NULL, want, &ref_guards);
    report(c, st, mismatches(got, want, rows), 0, guards_ok && ref_guards, "argmax %lld x %lld, ties to the lowest index",
           (long long)rows, (long long)cols);
    free(x);
    free(got);
    free(want);
}

/* Random logits, random u: every backend must draw the CPU's token, up to
 * rounding. Over tens of thousands of tokens, f32 sums on a device and the
 * CPU's double sums differ by ~1e-6, which moves the u * mass target or the
 * top_p threshold across a token boundary now and then. So a different token
 * passes only if the CPU itself draws it for some u and top_p within
 * SAMPLE_SLACK: the range of tokens the CPU draws over that box. */
#define SAMPLE_SLACK 1e-4f

static void check_sample_cross(ctx *c, int64_t rows, int64_t cols, float temperature, float top_p)
{
    if (!supported(c, PV_OP_SAMPLE_TOP_P, PV_F32, "sample_top_p"))
        return;
    float *x = xmalloc((size_t)(rows * cols) * sizeof *x), *u = xmalloc((size_t)rows * sizeof *u);
    rng_fill(&c->rng, x, (size_t)(rows * cols), -8.0f, 8.0f);
    rng_fill(&c->rng, u, (size_t)rows, SAMPLE_SLACK, 1.0f - SAMPLE_SLACK);
    int32_t *got = xmalloc((size_t)rows * sizeof *got), *want = xmalloc((size_t)rows * sizeof *want);
    int32_t *lo = xmalloc((size_t)rows * sizeof *lo), *hi = xmalloc((size_t)rows * sizeof *hi);
    float *u_near = xmalloc((size_t)rows * sizeof *u_near);
    int32_t *near = xmalloc((size_t)rows * sizeof *near);
    int guards_ok = 0, ref_guards = 1;
    pv_status st = run_pick(c->be, 1, rows, cols, x, temperature, top_p, u, got, &guards_ok);
    if (st == PV_OK)
        st = run_pick(c->cpu, 1, rows, cols, x, temperature, top_p, u, want, &ref_guards);
    for (int64_t r = 0; r < rows; r++)
        lo[r] = hi[r] = want[r];
    for (int du = -1; du <= 1 && st == PV_OK; du++)
        for (int dp = -1; dp <= 1 && st == PV_OK; dp++) {
            float p_near = top_p + (float)dp * SAMPLE_SLACK;
            p_near = p_near > 1.0f ? 1.0f : p_near;
            for (int64_t r = 0; r < rows; r++)
                u_near[r] = u[r] + (float)du * SAMPLE_SLACK;
            st = run_pick(c->cpu, 1, rows, cols, x, temperature, p_near, u_near, near, &ref_guards);
            for (int64_t r = 0; st == PV_OK && r < rows; r++) {
                lo[r] = near[r] < lo[r] ? near[r] : lo[r];
                hi[r] = near[r] > hi[r] ? near[r] : hi[r];
            }
        }
    double outside = 0;
    for (int64_t r = 0; r < rows; r++)
        outside += got[r] < lo[r] || got[r] > hi[r];
    if (st == PV_OK && mismatches(got, want, rows) > 0)
        tap_diag("%s: %.0f of %lld rows drew a token next to the CPU's (rounding at a boundary)", c->name,
                 mismatches(got, want, rows), (long long)rows);
    report(c, st, outside, 0, guards_ok && ref_guards,
           "sample_top_p %lld x %lld, temperature %g, top_p %g: the CPU's tokens, up to rounding", (long long)rows,
           (long long)cols, (double)temperature, (double)top_p);
    free(x);
    free(u);
    free(got);
    free(want);
    free(lo);
    free(hi);
    free(u_near);
    free(near);
}

/* Known answers, on every backend: logits log(p) give p exactly enough.
 *   p = (.5, .25, .125, .125), top_p .7: keep {0, 1} (mass .75);
 *     u .5 -> target .375 -> token 0; u .7 -> target .525 -> token 1.
 *   p = (.4, .2, .2, .2), top_p .5: the threshold .2 is tied, so all four
 *     are kept; u .99 -> token 3.
 *   top_p tiny keeps only the most likely token, whatever u.
 *   temperature 2 flattens (.5, .25, .125, .125) to ~(.37, .26, .18, .18);
 *     top_p 1 keeps all; u .6 -> target .6 -> token 1 (cumulative .63). */
static void check_sample_known(ctx *c)
{
    if (!supported(c, PV_OP_SAMPLE_TOP_P, PV_F32, "sample_top_p"))
        return;
    static const struct {
        double p[4];
        float temperature, top_p, u;
        int32_t want;
    } known[] = {
        {{.5, .25, .125, .125}, 1.0f, 0.7f, 0.5f, 0},
        {{.5, .25, .125, .125}, 1.0f, 0.7f, 0.7f, 1},
        {{.4, .2, .2, .2}, 1.0f, 0.5f, 0.99f, 3},
        {{.125, .125, .5, .25}, 1.0f, 1e-6f, 0.99f, 2},
        {{.5, .25, .125, .125}, 2.0f, 1.0f, 0.6f, 1},
    };
    int n = (int)(sizeof known / sizeof known[0]);
    for (int i = 0; i < n; i++) {
        float logits[4];
        for (int j = 0; j < 4; j++)
            logits[j] = (float)log(known[i].p[j]);
        int32_t got = -1;
        int guards_ok = 0;
        pv_status st = run_pick(c->be, 1, 1, 4, logits, known[i].temperature, known[i].top_p, &known[i].u, &got,
                                &guards_ok);
        report(c, st, got == known[i].want ? 0 : 1, 0, guards_ok,
               "sample_top_p p (%.3g %.3g %.3g %.3g) T %g top_p %g u %g -> token %d (got %d)", known[i].p[0],
               known[i].p[1], known[i].p[2], known[i].p[3], (double)known[i].temperature, (double)known[i].top_p,
               (double)known[i].u, known[i].want, got);
    }
}

/* ---- copies and events ---------------------------------------------------------------------- */

/* host -> device on the copy queue, device -> device on compute after an
 * event, device -> host; the bytes must come back unchanged. */
static void check_copies(ctx *c)
{
    enum { BYTES = 1 << 16 };
    unsigned char *data = xmalloc(BYTES), *back = xmalloc(BYTES);
    for (int i = 0; i < BYTES; i++)
        data[i] = (unsigned char)rng_next(&c->rng);
    memset(back, 0, BYTES);
    pv_buffer *host = NULL, *dev = NULL, *dev2 = NULL;
    pv_event *copied = NULL, *moved = NULL, *mark = NULL;
    pv_status st = pv_buffer_init(&host, c->be, PV_MEM_HOST, BYTES + 64);
    if (st == PV_OK)
        st = pv_buffer_init(&dev, c->be, PV_MEM_DEVICE, BYTES);
    if (st == PV_OK)
        st = pv_buffer_init(&dev2, c->be, PV_MEM_DEVICE, BYTES + 128);
    if (st == PV_OK && !host->host_ptr)
        st = pv_error(PV_ERR_STATE, "a PV_MEM_HOST buffer has no host_ptr");
    if (st == PV_OK) {
        memcpy((unsigned char *)host->host_ptr + 64, data, BYTES);
        st = pv_copy_async(PV_QUEUE_COPY, dev, 0, host, 64, BYTES, NULL, &copied);
    }
    if (st == PV_OK)
        st = pv_queue_wait(c->be, PV_QUEUE_COMPUTE, copied);
    if (st == PV_OK)
        st = pv_copy_async(PV_QUEUE_COMPUTE, dev2, 128, dev, 0, BYTES, copied, &moved);
    if (st == PV_OK)
        st = pv_event_record(c->be, PV_QUEUE_COMPUTE, &mark);
    if (st == PV_OK)
        st = pv_event_wait(mark);
    if (st == PV_OK)
        st = pv_event_wait(moved);
    if (st == PV_OK)
        st = pv_buffer_read(dev2, 128, back, BYTES);
    if (st == PV_OK)
        st = pv_backend_finish(c->be);
    report(c, st, bytes_differing(back, data, BYTES), 0, 1,
           "copy_async host -> device -> device -> host with events, %d bytes at offsets", BYTES);
    pv_event_free(copied);
    pv_event_free(moved);
    pv_event_free(mark);
    pv_buffer_free(host);
    pv_buffer_free(dev);
    pv_buffer_free(dev2);
    free(data);
    free(back);
}

/* ---- attention split-K (GPU backends) ------------------------------------------------- */

/* The GPU backends cut a decode token's context into S ranges of whole
 * chunks and combine the partial softmax rows, and serve the query heads
 * of a KV head in blocks of up to 8 per work-group (kernels/attention.cl,
 * backends/attention-split.h). The defaults depend on the device (compute
 * units; CPU devices take one query head a group), so these cases force
 * them through PV_ATTENTION_SPLITS and PV_ATTENTION_GROUP on a fresh
 * backend: the defaults, a few splits, more splits than the short sequences
 * have chunks (empty ranges), the limit, and blocks of 8, 4 and 2 query
 * heads. SmolLM2's 9 query heads over 3 KV heads, and 12 over 1. */
static const attention_case split_cases[] = {
    {"decode, context 1300", 9, 3, 64, 32, QUERY_DECODE, 1, 1, {1300}},
    {"decode, contexts 1300 and 40", 9, 3, 64, 32, QUERY_DECODE, 1, 2, {1300, 40}},
    {"2 tokens at the end of context 1100", 9, 3, 64, 32, QUERY_PREFILL, 2, 1, {1100}},
    {"decode, head_dim 128, contexts 2049 and 700", 9, 3, 128, 32, QUERY_DECODE, 1, 2, {2049, 700}},
    {"decode, 12 query heads on 1 KV head", 12, 1, 64, 32, QUERY_DECODE, 1, 2, {999, 64}},
    {"prefill, ragged", 9, 3, 64, 32, QUERY_PREFILL, 33, 3, {1, 70, 600}},
};

static void check_attention_splits(ctx *c)
{
    static const char *const settings[][2] = {{"0", "0"}, {"3", "8"}, {"7", "8"}, {"64", "8"},
                                              {"0", "8"}, {"5", "4"}, {"2", "2"}};
    for (size_t s = 0; s < sizeof settings / sizeof settings[0]; s++) {
        char name[128];
        snprintf(name, sizeof name, "%s (PV_ATTENTION_SPLITS=%s PV_ATTENTION_GROUP=%s)", c->name, settings[s][0],
                 settings[s][1]);
        pv_backend *be = NULL;
        pv_status st = setenv("PV_ATTENTION_SPLITS", settings[s][0], 1) == 0 &&
                               setenv("PV_ATTENTION_GROUP", settings[s][1], 1) == 0
                           ? pv_backend_init(&be, c->name, 0)
                           : pv_error(PV_ERR_STATE, "setenv PV_ATTENTION_SPLITS or PV_ATTENTION_GROUP failed");
        unsetenv("PV_ATTENTION_SPLITS");
        unsetenv("PV_ATTENTION_GROUP");
        if (!ok(st == PV_OK, "%s opens", name)) {
            tap_diag("%s", pv_last_error());
            continue;
        }
        ctx split_ctx = *c;
        split_ctx.be = be;
        split_ctx.name = name;
        for (size_t i = 0; i < sizeof split_cases / sizeof split_cases[0]; i++) {
            check_attention(&split_ctx, &split_cases[i], PV_F32);
            check_attention(&split_ctx, &split_cases[i], PV_F16);
        }
        c->rng = split_ctx.rng;
        pv_backend_free(be);
    }
}

/* The GPU backends' attention has two kernels (kernels/attention.cl):
 * pv_attention_teams where a work-group holds a team of PV_MAX_HEAD_DIM / 8
 * work-items (backends/attention-split.h), pv_attention below that. These
 * cases set every work-group size the tuner may pick on their buckets, with
 * and without split-K, so both kernels meet 1 to 8 teams a group: head dims
 * filling their class (128 at Llama 3's 4 query heads a KV head; 256, a
 * team of 32), 96 and 48, which leave team members idle, and chunks
 * smaller than a step. */
static const attention_case work_group_cases[] = {
    {"decode, Llama 3 grouping", 8, 2, 128, 32, QUERY_DECODE, 1, 3, {1, 300, 1100}},
    {"decode, head_dim 256, chunk 16", 4, 1, 256, 16, QUERY_DECODE, 1, 2, {500, 47}},
    {"prefill, head_dim 96", 6, 2, 96, 32, QUERY_PREFILL, 20, 2, {33, 90}},
    {"decode, head_dim 48", 9, 3, 48, 32, QUERY_DECODE, 1, 2, {700, 5}},
    /* chunks of 8: a team's rows of one step lie in different chunks
     * (4 of them at PV_WG 64), each found through its own slot */
    {"decode, chunk 8", 4, 1, 64, 8, QUERY_DECODE, 1, 2, {300, 29}},
};

static void check_attention_work_groups(ctx *c)
{
    static const char *const phases[] = {"decode.short", "decode.long", "prefill.short", "prefill.long"};
    for (int wg = 16; wg <= 64; wg *= 2)
        for (int splits = 0; splits <= 4; splits += 4)
            for (size_t i = 0; i < sizeof work_group_cases / sizeof work_group_cases[0]; i++) {
                const attention_case *ac = &work_group_cases[i];
                const int hd = ac->head_dim <= 64 ? 64 : ac->head_dim <= 128 ? 128 : 256;
                int gqa = 1;
                while (gqa < ac->n_heads / ac->n_kv_heads && gqa < 8)
                    gqa *= 2;
                char set[64], bucket[64], name[96];
                snprintf(set, sizeof set, "PV_WG=%d PV_SPLITS=%d", wg, splits);
                pv_status st = PV_OK;
                for (size_t f = 0; f < sizeof phases / sizeof phases[0] && st == PV_OK; f++) {
                    snprintf(bucket, sizeof bucket, "attention.hd%d.g%d.%s", hd, gqa, phases[f]);
                    st = pv_backend_kernel_set(c->be, bucket, set);
                }
                if (!ok(st == PV_OK, "%s: %s on %s", c->name, set, bucket)) {
                    tap_diag("%s", pv_last_error());
                    continue;
                }
                ctx set_ctx = *c;
                snprintf(name, sizeof name, "%s (%s)", c->name, set);
                set_ctx.name = name;
                check_attention(&set_ctx, ac, PV_F32);
                check_attention(&set_ctx, ac, PV_F16);
                c->rng = set_ctx.rng;
                for (size_t f = 0; f < sizeof phases / sizeof phases[0]; f++) {
                    snprintf(bucket, sizeof bucket, "attention.hd%d.g%d.%s", hd, gqa, phases[f]);
                    pv_backend_kernel_set(c->be, bucket, NULL);
                }
            }
}

/* ---- the run ------------------------------------------------------------------------------------ */

static void run_all(ctx *c)
{
    pv_device_info *info = &c->be->info;
    tap_diag("%s: %s (%s), %u compute units, %.1f GiB", c->name, info->name, info->vendor, info->compute_units,
             (double)info->global_mem_bytes / (1u << 30));
    check_copies(c);

    static const gemm_case gemms[] = {
        {1, 1, 1, 0, 0, 0}, {7, 13, 5, 1, 0, 3}, {33, 64, 17, 0, 1, 1}, {64, 31, 128, 1, 1, 0}, {128, 96, 200, 0, 0, 5},
        /* one row: a decode step, which the CPU backend runs as GEMV */
        {1, 96, 200, 0, 1, 3}, {1, 50, 70, 1, 0, 2}, {1, 33, 17, 1, 1, 0}, {1, 40, 24, 0, 0, 1},
        /* a decode batch against weights [n][k]: the CPU's small-m kernel
         * (even and odd row counts, padded leading dimensions) */
        {2, 96, 200, 0, 1, 3}, {3, 36, 48, 0, 1, 0}, {16, 192, 64, 0, 1, 2}, {32, 40, 576, 0, 1, 1},
    };
    for (size_t i = 0; i < sizeof gemms / sizeof gemms[0]; i++) {
        check_gemm(c, &gemms[i], PV_F32);
        /* f16 GEMM is optional (not on the CPU): test it where it exists. */
        if (pv_backend_supports(c->be, PV_OP_GEMM, PV_F16))
            check_gemm(c, &gemms[i], PV_F16);
    }

    for (size_t i = 0; i < sizeof attention_cases / sizeof attention_cases[0]; i++) {
        check_attention(c, &attention_cases[i], PV_F32);
        check_attention(c, &attention_cases[i], PV_F16);
    }

    for (int dt = 0; dt < 2; dt++) {
        pv_dtype dtype = dt ? PV_F16 : PV_F32;
        check_kv_write(c, dtype, QUERY_DECODE, 1, "decode rows");
        check_kv_write(c, dtype, QUERY_PREFILL, 40, "prefill rows");
        check_kv_write(c, dtype, QUERY_RECOVERY, 30, "recovery rows at non-contiguous positions");
        check_slot_copy(c, 1, dtype, 2 * 32 * 2 * 64, 37, 11);
        check_slot_copy(c, 0, dtype, 2 * 32 * 2 * 64, 37, 11);
        check_slot_copy(c, 1, dtype, 40, 300, 1);
        check_slot_copy(c, 0, dtype, 40, 300, 299);
        check_embed(c, dtype, 1000, 96, 33);
    }

    const row_args rows[] = {
        {ROW_RMSNORM, 5, 576, 1e-5f, 0, 0}, {ROW_RMSNORM, 3, 4096, 1e-6f, 0, 1},
        {ROW_SWIGLU, 1, 12345, 0, 0, 0},    {ROW_SWIGLU, 4, 1536, 0, 0, 1},
        {ROW_ADD, 1, 10001, 0, 0, 0},       {ROW_ADD, 3, 960, 0, 0, 1},
        {ROW_SOFTMAX, 7, 1000, 0, 0.125f, 0}, {ROW_SOFTMAX, 2, 49152, 0, 1.0f, 1},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        check_row_op(c, &rows[i]);

    for (int neox = 0; neox < 2; neox++) {
        if (c->cpu_pass)
            check_rope_closed_form(c, neox);
        check_rope(c, 64, 10000.0f, neox);
        check_rope(c, 128, 500000.0f, neox);
    }

    /* rows of a decode step, a prefill, one shorter than a work-group, and odd sizes */
    static const int64_t add_norms[][2] = {{1, 576}, {5, 1000}, {33, 17}, {3, 4096}, {7, 333}};
    for (size_t i = 0; i < sizeof add_norms / sizeof add_norms[0]; i++)
        check_add_rmsnorm(c, add_norms[i][0], add_norms[i][1]);
    /* SmolLM2's heads, prefill and recovery batches, and an odd shape: 9
     * pairs a head, 7 query heads on 1 KV head, chunks of 16. */
    static const rope_kv_case rope_kvs[] = {
        {"decode, 9/3 heads of 64", 9, 3, 64, 32, QUERY_DECODE, 1, 4, {1, 33, 64, 70}},
        {"prefill, 9/3 heads of 64", 9, 3, 64, 32, QUERY_PREFILL, 40, 4, {1, 33, 64, 70}},
        {"recovery, 4/2 heads of 128", 4, 2, 128, 32, QUERY_RECOVERY, 30, 3, {33, 64, 90}},
        {"prefill, 7/1 heads of 18, chunk 16", 7, 1, 18, 16, QUERY_PREFILL, 21, 2, {5, 1500}},
    };
    for (size_t i = 0; i < sizeof rope_kvs / sizeof rope_kvs[0]; i++)
        for (int neox = 0; neox < 2; neox++) {
            check_rope_kv_write(c, &rope_kvs[i], PV_F32, neox);
            check_rope_kv_write(c, &rope_kvs[i], PV_F16, neox);
        }

    check_argmax(c, 5, 32000);
    check_argmax(c, 1, 3);
    check_sample_known(c);
    if (!c->cpu_pass) {
        check_sample_cross(c, 4, 32000, 0.8f, 0.9f);
        check_sample_cross(c, 3, 1000, 1.0f, 1.0f);
        check_sample_cross(c, 2, 4096, 1.5f, 0.5f);
    }
}

/* The attention checks that set the backend's environment or shapes of
 * their own, on every device backend. */
static void check_device_attention(ctx *c)
{
    check_attention_splits(c);
    check_attention_work_groups(c);
}

int main(int argc, char **argv)
{
    return check_main(argc, argv, 20261122, run_all, check_device_attention);
}
