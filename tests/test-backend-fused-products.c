/* Ops fused with the products that consume their output, on every backend
 * that opens: a RMSNorm with its products (pv_add_rmsnorm_group,
 * pv_add_rmsnorm_swiglu) and paged attention with its output projection
 * (pv_attention_qmatmul), against the same ops one after the other on the
 * same backend (each checked against the CPU reference by
 * test-backend-ops and test-backend-qmatmul): the same bits in every
 * output (x, the norm or the attention output, the products), at decode
 * sizes (the fused kernels' token classes) and past them, with PV_ACT16
 * off and on where the backend's kernels are tunable, attention with one
 * split and with four; guard bytes around every output. With PV_ACT16 on,
 * a decode-sized op whose product takes x rounded costs one launch fewer
 * than the ops apart where the first kernel can round it (a norm; a split
 * attention's combining kernel, head_dim a multiple of 32), every other
 * the same. Then arguments that do not describe a producer feeding its
 * products, refused with a message.
 * Usage: test-backend-fused-products [--backend NAME] */
#define _POSIX_C_SOURCE 200809L
#include "backend-check.h"
#include "kv-scenario.h"

#include <pensieve/gguf.h>

#include <stdio.h>
#include <string.h>

/* One matrix [n_out][n_in] of type t, random, written as a model's are. */
typedef struct matrix {
    pv_buffer *buf;
    pv_wtype type;
    int64_t n_out;
} matrix;

static pv_status matrix_init(matrix *m, pv_backend *be, pv_wtype t, int64_t n_out, int64_t n_in, uint64_t *rng)
{
    uint32_t block_elems = 1, block_bytes = 4;
    pv_wtype_block(t, &block_elems, &block_bytes);
    const size_t n = (size_t)(n_out * n_in), bytes = n / block_elems * block_bytes;
    float *src = xmalloc(n * sizeof *src);
    unsigned char *img = xmalloc(bytes);
    rng_fill(rng, src, n, -1.0f, 1.0f);
    *m = (matrix){.type = t, .n_out = n_out};
    pv_status st = pv_ggml_quantize((uint32_t)t, src, n, img, bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&m->buf, be, PV_MEM_DEVICE, bytes);
    if (st == PV_OK)
        st = pv_weights_write(m->buf, 0, t, n_out, n_in, img);
    free(src);
    free(img);
    return st;
}

/* What one run of a case leaves: x, out and the products' outputs, and
 * whether every guard held. */
typedef struct result {
    float *x, *out, *y;
    uint64_t launches;
    int guards;
} result;

static void result_free(result *r)
{
    free(r->x);
    free(r->out);
    free(r->y);
}

/* A case: rows x dim of the residual stream, the norm's weight, and the
 * products of its output: up to 3 matrices, or with swiglu a gate and up
 * pair. */
typedef struct norm_case {
    pv_backend *be;
    int64_t rows, dim;
    const float *x0, *y0, *weight;
    const matrix *m;
    int n, swiglu;
    int64_t y_elems; /* of every product's output, one after the other */
} norm_case;

/* The case on fresh tensors, fused (the new op) or as the two ops. */
static pv_status run_case(const norm_case *c, int fused, result *r)
{
    const uint64_t n = (uint64_t)(c->rows * c->dim);
    tensor tx, ty, tw, tout, tprod, tup;
    memset(r, 0, sizeof *r);
    pv_status st = tensor_init(&tx, c->be, PV_MEM_DEVICE, 4, n, c->x0);
    if (st == PV_OK)
        st = tensor_init(&ty, c->be, PV_MEM_DEVICE, 4, n, c->y0);
    if (st == PV_OK)
        st = tensor_init(&tw, c->be, PV_MEM_DEVICE, 4, (uint64_t)c->dim, c->weight);
    if (st == PV_OK)
        st = tensor_init(&tout, c->be, PV_MEM_DEVICE, 4, n, NULL);
    if (st == PV_OK)
        st = tensor_init(&tprod, c->be, PV_MEM_DEVICE, 4, (uint64_t)c->y_elems, NULL);
    if (st == PV_OK)
        st = tensor_init(&tup, c->be, PV_MEM_DEVICE, 4, (uint64_t)c->y_elems, NULL);
    const pv_add_rmsnorm_args norm = {.rows = c->rows, .dim = c->dim, .eps = 1e-5f, .x = tx.buf, .x_off = tx.off,
                                      .y = ty.buf, .y_off = ty.off, .weight = tw.buf, .weight_off = tw.off,
                                      .out = tout.buf, .out_off = tout.off};
    pv_qmatmul_args q[3];
    uint64_t at = 0;
    for (int i = 0; i < c->n; i++) {
        q[i] = (pv_qmatmul_args){.w_type = c->m[i].type, .n_tokens = c->rows, .n_in = c->dim,
                                 .n_out = c->m[i].n_out, .w = c->m[i].buf, .x = tout.buf, .x_off = tout.off,
                                 .y = tprod.buf, .y_off = tprod.off + at};
        at += (uint64_t)(c->rows * c->m[i].n_out);
    }
    const pv_qmatmul_swiglu_args sw = {
        .w_type = c->m[0].type, .n_tokens = c->rows, .n_in = c->dim, .n_out = c->m[0].n_out, .w_gate = c->m[0].buf,
        .w_up = c->swiglu ? c->m[1].buf : NULL, .x = tout.buf, .x_off = tout.off, .y = tprod.buf,
        .y_off = tprod.off, .up = tup.buf, .up_off = tup.off};
    const uint64_t before = pv_backend_launches(c->be);
    if (st == PV_OK && fused)
        st = c->swiglu ? pv_add_rmsnorm_swiglu(c->be, &norm, &sw) : pv_add_rmsnorm_group(c->be, &norm, q, c->n);
    else if (st == PV_OK && (st = pv_add_rmsnorm(c->be, &norm)) == PV_OK)
        st = c->swiglu ? pv_qmatmul_swiglu(c->be, &sw) : pv_qmatmul_group(c->be, q, c->n);
    r->launches = pv_backend_launches(c->be) - before;
    r->x = xmalloc(n * sizeof *r->x);
    r->out = xmalloc(n * sizeof *r->out);
    r->y = xmalloc((size_t)c->y_elems * sizeof *r->y);
    if (st == PV_OK && (st = tensor_read(&tx, r->x)) == PV_OK && (st = tensor_read(&tout, r->out)) == PV_OK)
        st = tensor_read(&tprod, r->y);
    r->guards = st == PV_OK && guards_intact(&tx) && guards_intact(&tout) && guards_intact(&tprod) &&
                guards_intact(&tup);
    tensor_free(&tx);
    tensor_free(&ty);
    tensor_free(&tw);
    tensor_free(&tout);
    tensor_free(&tprod);
    tensor_free(&tup);
    return st;
}

static size_t differing(const float *a, const float *b, size_t n)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

/* Whether the backend's products of this case take x rounded to 16 bits
 * (PV_ACT16 on, decode-sized, a block type among them): then the fused op
 * saves the rounding launch. */
static int block_type(pv_wtype t)
{
    uint32_t block = 1;
    pv_wtype_block(t, &block, NULL);
    return block == 32;
}

static int saves_launch(const norm_case *c, int act16)
{
    if (!act16 || c->rows > 16)
        return 0;
    for (int i = 0; i < c->n; i++)
        if (block_type(c->m[i].type))
            return 1;
    return 0;
}

/* A product of m over other values of an x [T][n_in]: where the backend
 * rounds x into scratch, the scratch then holds other bits, so a fused op
 * that left part of it unwritten reads them. */
static pv_status poison_scratch(pv_backend *be, const matrix *m, int64_t T, int64_t n_in, uint64_t *rng)
{
    const uint64_t n = (uint64_t)(T * n_in);
    float *x = xmalloc((size_t)n * sizeof *x);
    rng_fill(rng, x, (size_t)n, -3.0f, 3.0f);
    tensor tx, ty;
    pv_status st = tensor_init(&tx, be, PV_MEM_DEVICE, 4, n, x);
    if (st == PV_OK)
        st = tensor_init(&ty, be, PV_MEM_DEVICE, 4, (uint64_t)(T * m->n_out), NULL);
    const pv_qmatmul_args q = {.w_type = m->type, .n_tokens = T, .n_in = n_in, .n_out = m->n_out, .w = m->buf,
                               .x = tx.buf, .x_off = tx.off, .y = ty.buf, .y_off = ty.off};
    if (st == PV_OK)
        st = pv_qmatmul(be, &q);
    if (st == PV_OK)
        st = pv_backend_finish(be);
    tensor_free(&tx);
    tensor_free(&ty);
    free(x);
    return st;
}

static void check_case(const char *name, const char *what, const norm_case *c, int act16, uint64_t *rng)
{
    result fused, apart;
    memset(&fused, 0, sizeof fused);
    pv_status st = run_case(c, 0, &apart);
    if (st == PV_OK)
        st = poison_scratch(c->be, &c->m[0], c->rows, c->dim, rng);
    if (st == PV_OK)
        st = run_case(c, 1, &fused);
    char label[200];
    snprintf(label, sizeof label, "%s: %s, %lld x %lld, PV_ACT16 %d", name, what, (long long)c->rows,
             (long long)c->dim, act16);
    if (ok(st == PV_OK, "%s: both ways run (%s)", label, st == PV_OK ? "ok" : pv_last_error())) {
        const size_t n = (size_t)(c->rows * c->dim);
        const size_t dx = differing(fused.x, apart.x, n), dout = differing(fused.out, apart.out, n),
                     dy = differing(fused.y, apart.y, (size_t)c->y_elems);
        ok(dx == 0 && dout == 0 && dy == 0 && fused.guards,
           "%s: the same bits as the two ops (x %zu, out %zu, products %zu of %lld differ)%s", label, dx, dout, dy,
           (long long)c->y_elems, fused.guards ? "" : "; guard bytes overwritten");
        const uint64_t want = apart.launches - (uint64_t)saves_launch(c, act16);
        ok(fused.launches == want, "%s: %llu launches, the two ops %llu (expected %llu)", label,
           (unsigned long long)fused.launches, (unsigned long long)apart.launches, (unsigned long long)want);
    }
    result_free(&fused);
    result_free(&apart);
}

/* Every case at every batch size, on be as it is set now. */
static void check_cases(pv_backend *be, const char *name, int act16, uint64_t *rng)
{
    /* Q, K and V as a model's (one type: one launch on the GPUs), a mixed
     * group (each product alone, x rounded once for the block types),
     * gate and up of a SwiGLU product in a block type and in F16. */
    static const struct {
        const char *what;
        pv_wtype types[3];
        int64_t n_outs[3];
        int n, swiglu;
    } cases[] = {
        {"Q4_0 Q, K and V", {PV_W_Q4_0, PV_W_Q4_0, PV_W_Q4_0}, {160, 64, 64}, 3, 0},
        {"Q4_1 and F16 products", {PV_W_Q4_1, PV_W_F16}, {96, 37}, 2, 0},
        {"Q8_0 SwiGLU", {PV_W_Q8_0, PV_W_Q8_0}, {200, 200}, 2, 1},
        {"F16 SwiGLU", {PV_W_F16, PV_W_F16}, {72, 72}, 2, 1},
    };
    static const int64_t batches[] = {1, 3, 16, 17, 64}; /* the token classes, then past the fused kernels */
    const int64_t dim = 160;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int usable = 1;
        for (int i = 0; i < cases[ci].n; i++)
            usable &= pv_backend_supports_weights(be, cases[ci].swiglu ? PV_OP_QMATMUL_SWIGLU : PV_OP_QMATMUL,
                                                  cases[ci].types[i]);
        if (!usable) {
            tap_skip("%s: %s: a weight type is not supported here", name, cases[ci].what);
            continue;
        }
        matrix m[3] = {{0}};
        pv_status st = PV_OK;
        for (int i = 0; i < cases[ci].n && st == PV_OK; i++)
            st = matrix_init(&m[i], be, cases[ci].types[i], cases[ci].n_outs[i], dim, rng);
        float *weight = xmalloc((size_t)dim * sizeof *weight);
        rng_fill(rng, weight, (size_t)dim, 0.5f, 1.5f);
        for (size_t bi = 0; st == PV_OK && bi < sizeof batches / sizeof batches[0]; bi++) {
            const int64_t rows = batches[bi], n = rows * dim;
            float *x0 = xmalloc((size_t)n * sizeof *x0), *y0 = xmalloc((size_t)n * sizeof *y0);
            rng_fill(rng, x0, (size_t)n, -2.0f, 2.0f);
            rng_fill(rng, y0, (size_t)n, -1.0f, 1.0f);
            int64_t y_elems = 0;
            for (int i = 0; i < (cases[ci].swiglu ? 1 : cases[ci].n); i++)
                y_elems += rows * cases[ci].n_outs[i];
            const norm_case c = {.be = be, .rows = rows, .dim = dim, .x0 = x0, .y0 = y0, .weight = weight, .m = m,
                                 .n = cases[ci].n, .swiglu = cases[ci].swiglu, .y_elems = y_elems};
            check_case(name, cases[ci].what, &c, act16, rng);
            free(x0);
            free(y0);
        }
        if (st != PV_OK)
            ok(0, "%s: %s: weights upload: %s", name, cases[ci].what, pv_last_error());
        free(weight);
        for (int i = 0; i < cases[ci].n; i++)
            pv_buffer_free(m[i].buf);
    }
}

/* ---- attention with its output projection ------------------------------------ */

/* The scenario's attention and the product of its output by wo, fused or
 * as the two ops: out and y into r (x unused). */
static pv_status run_attention(pv_backend *be, const kv_scenario *sc, const matrix *wo, int fused, result *r)
{
    const int64_t T = sc->n_tokens, n_in = (int64_t)sc->n_heads * sc->head_dim;
    const size_t pool_bytes = (size_t)sc->pool_elems * pv_dtype_size(sc->kv_dtype);
    tensor tq, tout, ty;
    pv_buffer *pool = NULL;
    memset(r, 0, sizeof *r);
    pv_status st = tensor_init(&tq, be, PV_MEM_DEVICE, 4, (uint64_t)(T * n_in), sc->q);
    if (st == PV_OK)
        st = tensor_init(&tout, be, PV_MEM_DEVICE, 4, (uint64_t)(T * n_in), NULL);
    if (st == PV_OK)
        st = tensor_init(&ty, be, PV_MEM_DEVICE, 4, (uint64_t)(T * wo->n_out), NULL);
    if (st == PV_OK)
        st = pv_buffer_init(&pool, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_write(pool, 0, sc->pool, pool_bytes);
    const pv_attention_args a = kv_scenario_args(sc, &tq, pool, &tout);
    const pv_qmatmul_args p = {.w_type = wo->type, .n_tokens = T, .n_in = n_in, .n_out = wo->n_out, .w = wo->buf,
                               .x = tout.buf, .x_off = tout.off, .y = ty.buf, .y_off = ty.off};
    const uint64_t before = pv_backend_launches(be);
    if (st == PV_OK && fused)
        st = pv_attention_qmatmul(be, &a, &p);
    else if (st == PV_OK && (st = pv_attention(be, &a)) == PV_OK)
        st = pv_qmatmul(be, &p);
    r->launches = pv_backend_launches(be) - before;
    r->out = xmalloc((size_t)(T * n_in) * sizeof *r->out);
    r->y = xmalloc((size_t)(T * wo->n_out) * sizeof *r->y);
    if (st == PV_OK && (st = tensor_read(&tout, r->out)) == PV_OK)
        st = tensor_read(&ty, r->y);
    r->guards = st == PV_OK && guards_intact(&tq) && guards_intact(&tout) && guards_intact(&ty);
    tensor_free(&tq);
    tensor_free(&tout);
    tensor_free(&ty);
    pv_buffer_free(pool);
    return st;
}

/* Decode steps of T sequences (contexts of 40 to 200 tokens) with head_dim
 * 64 (blocks of 32 within a head) and 48 (blocks across heads: the product
 * rounds its x itself), Q4_0 and F16 projections; `splits` is the backend's
 * forced split count (PV_ATTENTION_SPLITS). */
static void check_attention_cases(pv_backend *be, const char *name, int splits, int act16, uint64_t *rng)
{
    static const int32_t head_dims[] = {64, 48};
    static const pv_wtype types[] = {PV_W_Q4_0, PV_W_F16};
    static const int32_t batches[] = {1, 3, 16, 17};
    for (size_t hi = 0; hi < sizeof head_dims / sizeof head_dims[0]; hi++)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const int32_t head_dim = head_dims[hi], n_heads = 4;
            const pv_wtype t = types[ti];
            matrix wo;
            pv_status st = matrix_init(&wo, be, t, 96, (int64_t)n_heads * head_dim, rng);
            for (size_t bi = 0; st == PV_OK && bi < sizeof batches / sizeof batches[0]; bi++) {
                const int32_t T = batches[bi];
                int32_t *lens = xmalloc((size_t)T * sizeof *lens);
                for (int32_t i = 0; i < T; i++)
                    lens[i] = 40 + rng_below(rng, 161);
                kv_scenario sc;
                kv_scenario_init(&sc, rng, PV_F16, n_heads, 2, head_dim, 16, lens, T, QUERY_DECODE, 1);
                result fused, apart;
                memset(&fused, 0, sizeof fused);
                st = run_attention(be, &sc, &wo, 0, &apart);
                if (st == PV_OK)
                    st = poison_scratch(be, &wo, T, (int64_t)n_heads * head_dim, rng);
                if (st == PV_OK)
                    st = run_attention(be, &sc, &wo, 1, &fused);
                char label[200];
                snprintf(label, sizeof label, "%s: attention (head_dim %d, %d splits) and a %s projection, T %d, PV_ACT16 %d",
                         name, head_dim, splits, pv_wtype_name(t), T, act16);
                if (ok(st == PV_OK, "%s: both ways run (%s)", label, st == PV_OK ? "ok" : pv_last_error())) {
                    const size_t n_out = (size_t)T * (size_t)n_heads * (size_t)head_dim, n_y = (size_t)T * 96;
                    const size_t dout = differing(fused.out, apart.out, n_out), dy = differing(fused.y, apart.y, n_y);
                    ok(dout == 0 && dy == 0 && fused.guards,
                       "%s: the same bits as the two ops (attention output %zu, product %zu of %zu differ)%s", label,
                       dout, dy, n_y, fused.guards ? "" : "; guard bytes overwritten");
                    const int saves = act16 && T <= 16 && splits > 1 && head_dim % 32 == 0 && block_type(t);
                    const uint64_t want = apart.launches - (uint64_t)saves;
                    ok(fused.launches == want, "%s: %llu launches, the two ops %llu (expected %llu)", label,
                       (unsigned long long)fused.launches, (unsigned long long)apart.launches,
                       (unsigned long long)want);
                }
                result_free(&fused);
                result_free(&apart);
                kv_scenario_free(&sc);
                free(lens);
            }
            if (st != PV_OK)
                ok(0, "%s: attention with a %s projection: %s", name, pv_wtype_name(t), pv_last_error());
            pv_buffer_free(wo.buf);
        }
}

/* The attention cases on `name` opened again with one split forced and
 * with four (PV_ATTENTION_SPLITS is read when a backend opens). */
static void check_attention(const char *name, uint64_t *rng)
{
    static const char *const splits[] = {"1", "4"};
    for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++) {
        pv_backend *be = NULL;
        setenv("PV_ATTENTION_SPLITS", splits[si], 1);
        pv_status st = pv_backend_init(&be, name, 0);
        unsetenv("PV_ATTENTION_SPLITS");
        if (!ok(st == PV_OK, "%s opens with PV_ATTENTION_SPLITS=%s (%s)", name, splits[si], pv_last_error()))
            continue;
        check_attention_cases(be, name, atoi(splits[si]), 0, rng);
        if (pv_backend_kernels_tunable(be) && pv_backend_kernel_set(be, "qmatmul", "PV_ACT16=1") == PV_OK)
            check_attention_cases(be, name, atoi(splits[si]), 1, rng);
        pv_backend_free(be);
    }
}

static void expect_refused(const char *name, const char *what, pv_status st, const char *needle)
{
    ok(st == PV_ERR_INVALID_ARG && strstr(pv_last_error(), needle) != NULL, "%s: %s is refused (%s)", name, what,
       pv_last_error());
}

/* Products that do not read the norm's whole output, and a bad norm, are
 * refused before anything runs. */
static void check_refusals(pv_backend *be, const char *name, uint64_t *rng)
{
    const int64_t rows = 2, dim = 64;
    matrix m;
    pv_buffer *a = NULL, *other = NULL;
    pv_status st = matrix_init(&m, be, PV_W_F16, 32, dim, rng);
    if (st == PV_OK)
        st = pv_buffer_init(&a, be, PV_MEM_DEVICE, 6 * rows * dim * 4);
    if (st == PV_OK)
        st = pv_buffer_init(&other, be, PV_MEM_DEVICE, rows * dim * 4);
    if (!ok(st == PV_OK, "%s: refusal checks set up (%s)", name, st == PV_OK ? "ok" : pv_last_error())) {
        pv_buffer_free(m.buf);
        pv_buffer_free(a);
        pv_buffer_free(other);
        return;
    }
    /* x, y, weight, out, product output at element offsets 0, 1, 2, 3, 4 x rows x dim */
    const uint64_t s = (uint64_t)(rows * dim);
    const pv_add_rmsnorm_args norm = {.rows = rows, .dim = dim, .eps = 1e-5f, .x = a, .y = a, .y_off = s,
                                      .weight = a, .weight_off = 2 * s, .out = a, .out_off = 3 * s};
    const pv_qmatmul_args good = {.w_type = PV_W_F16, .n_tokens = rows, .n_in = dim, .n_out = 32, .w = m.buf,
                                  .x = a, .x_off = 3 * s, .y = a, .y_off = 4 * s};
    ok(pv_add_rmsnorm_group(be, &norm, &good, 1) == PV_OK, "%s: a norm feeding one product runs (%s)", name,
       pv_last_error());
    pv_qmatmul_args q = good;
    q.x = other;
    q.x_off = 0;
    expect_refused(name, "a product reading another buffer", pv_add_rmsnorm_group(be, &norm, &q, 1),
                   "not the norm's out");
    q = good;
    q.x = a;
    q.x_off = 3 * s + (uint64_t)dim; /* inside out, a row on */
    q.n_tokens = rows - 1;
    expect_refused(name, "a product reading part of the norm's out", pv_add_rmsnorm_group(be, &norm, &q, 1),
                   "not the norm's out");
    pv_qmatmul_args two[2] = {good, good};
    two[1].y_off = 5 * s;
    two[1].n_tokens = rows - 1;
    two[1].x_off = 3 * s;
    expect_refused(name, "a second product over fewer rows", pv_add_rmsnorm_group(be, &norm, two, 2),
                   "product 1");
    pv_add_rmsnorm_args bad = norm;
    bad.out_off = 0; /* out over x */
    q = good;
    q.x_off = 0;
    expect_refused(name, "a norm writing out over x", pv_add_rmsnorm_group(be, &bad, &q, 1), "its norm");
    expect_refused(name, "a NULL norm", pv_add_rmsnorm_group(be, NULL, &good, 1), "its norm");
    const pv_qmatmul_swiglu_args sw = {.w_type = PV_W_F16, .n_tokens = rows, .n_in = dim, .n_out = 32,
                                       .w_gate = m.buf, .w_up = m.buf, .x = other, .y = a, .y_off = 4 * s,
                                       .up = a, .up_off = 5 * s};
    if (pv_backend_supports_weights(be, PV_OP_QMATMUL_SWIGLU, PV_W_F16))
        expect_refused(name, "a SwiGLU product reading another buffer", pv_add_rmsnorm_swiglu(be, &norm, &sw),
                       "not the norm's out");
    else
        tap_skip("%s: qmatmul_swiglu F16 is not supported here", name);
    /* attention: a projection reading another buffer, or fewer tokens, and none */
    kv_scenario sc;
    kv_scenario_init(&sc, rng, PV_F16, 2, 1, dim / 2, 16, (const int32_t[]){20, 33}, 2, QUERY_DECODE, 1);
    const size_t pool_bytes = (size_t)sc.pool_elems * 2;
    tensor tq, tout;
    pv_buffer *pool = NULL;
    st = tensor_init(&tq, be, PV_MEM_DEVICE, 4, (uint64_t)s, sc.q);
    if (st == PV_OK)
        st = tensor_init(&tout, be, PV_MEM_DEVICE, 4, (uint64_t)s, NULL);
    if (st == PV_OK)
        st = pv_buffer_init(&pool, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_write(pool, 0, sc.pool, pool_bytes);
    if (ok(st == PV_OK, "%s: attention refusal checks set up (%s)", name, st == PV_OK ? "ok" : pv_last_error())) {
        const pv_attention_args att = kv_scenario_args(&sc, &tq, pool, &tout);
        q = good;
        q.x = tout.buf;
        q.x_off = tout.off;
        q.y = other;
        q.y_off = 0;
        ok(pv_attention_qmatmul(be, &att, &q) == PV_OK, "%s: attention feeding its projection runs (%s)", name,
           pv_last_error());
        pv_qmatmul_args wrong = q;
        wrong.x = a;
        wrong.x_off = 0;
        expect_refused(name, "a projection reading another buffer", pv_attention_qmatmul(be, &att, &wrong),
                       "not the attention's out");
        wrong = q;
        wrong.n_tokens = 1;
        expect_refused(name, "a projection of fewer tokens", pv_attention_qmatmul(be, &att, &wrong),
                       "not the attention's out");
        expect_refused(name, "a NULL projection", pv_attention_qmatmul(be, &att, NULL), "product is NULL");
    }
    tensor_free(&tq);
    tensor_free(&tout);
    pv_buffer_free(pool);
    kv_scenario_free(&sc);
    pv_buffer_free(m.buf);
    pv_buffer_free(a);
    pv_buffer_free(other);
}

static void check_backend(pv_backend *be, const char *name, void *arg)
{
    uint64_t rng = *(const uint64_t *)arg;
    check_cases(be, name, 0, &rng);
    if (pv_backend_kernels_tunable(be)) {
        if (ok(pv_backend_kernel_set(be, "qmatmul", "PV_ACT16=1") == PV_OK, "%s: PV_ACT16 set (%s)", name,
               pv_last_error()))
            check_cases(be, name, 1, &rng);
        pv_backend_kernel_set(be, "qmatmul", "PV_ACT16=0");
    } else {
        tap_skip("%s: PV_ACT16: the backend's kernels are not tunable", name);
    }
    check_attention(name, &rng);
    check_refusals(be, name, &rng);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    int usage = check_args(argc, argv, &only, NULL);
    if (usage)
        return usage;
    uint64_t seed = 0x5eed0017;
    if (!check_each_backend(only, 0, check_backend, &seed))
        ok(0, "backend %s is built into this library", only);
    return tap_done();
}
