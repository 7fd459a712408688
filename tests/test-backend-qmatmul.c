/* qmatmul and embed_gather over weights in their GGUF types, on every built
 * backend: every weight type x batch size (1, 2, 7, 16, 64, 300 rows of x)
 * against a double-precision product with the weights as models/quant.c
 * dequantises them (a decoder independent of the backends'), with guard
 * bytes around the output; groups of products sharing x against the same
 * products run one by one; then the shapes GGUF forbids, refused with a
 * message; the SwiGLU product of two such matrices (pv_qmatmul_swiglu)
 * against its double value and against the unfused ops; the larger
 * batches in every tensor-core GEMM mode a backend runs, alone, grouped and
 * in the SwiGLU product; the block types' decode-sized products again with
 * x rounded to 16 bits (PV_ACT16); the one-token kernels with 4 and 8 rows
 * a work-group (PV_QMV_ROWS), and over rows long enough for their passes;
 * every decode-sized kernel with 8 row lanes a work-group (PV_QMV_LANES).
 * Usage: test-backend-qmatmul [backend] */
#define _POSIX_C_SOURCE 200809L
#include "backend-check.h"
#include "backends/kernel-params.h"
#include "llama-ref.h"

#include <pensieve/gguf.h>

#include <stdio.h>
#include <string.h>

static const pv_wtype types[] = {PV_W_F32, PV_W_F16, PV_W_BF16, PV_W_Q8_0, PV_W_Q4_0, PV_W_Q4_1};
#define N_TYPES (int)(sizeof types / sizeof types[0])
static const int64_t batches[] = {1, 2, 7, 16, 64, 300};
#define N_BATCHES (int)(sizeof batches / sizeof batches[0])

/* Every type is compared with its own dequantised weights, so the only
 * error is f32 accumulation in another order (observed below 1e-6 of the
 * largest output at n_in 576), far below what a decoding mistake costs: one
 * wrong element of a Q4 row moves its dot product by a quantisation step,
 * about 1/16 of the row's range. One limit serves every type for that reason.
 * Backends may run the block types against activations rounded to 16 bits
 * per block of 32 (backend.h, pv_device_info.activation_bits; steps of
 * max |x| / 32512), whose error is some 1e-5; such a result must then
 * match, to the same limit, the product with x rounded that way (a backend
 * reporting other bits has no reference here and fails). */
#define ERROR_LIMIT 1e-5

/* Set while check_act16 runs the checks below under PV_ACT16=1
 * (backends/kernel-params.h): decode-sized products (T <= 16) of the block
 * types then take x rounded as the CPU's integer kernels round it, and x
 * gets one large element per block (spike_blocks), which makes that
 * rounding cost some 5e-5 of the largest output: a kernel ignoring the
 * mode, or rounding otherwise, misses the rounded product's limit. */
static int act16_pass;

/* The PV_GEMM mode check_gemm_modes has set while it runs the grouped and
 * SwiGLU products under it, else PV_GEMM_F32. */
static int gemm_pass = PV_GEMM_F32;

/* x[i] for i a multiple of 32: +-1000, so a block's other elements sit a
 * few steps of its 16-bit rounding (max |x| / 32512) from their values. */
static void spike_blocks(float *x, size_t n)
{
    for (size_t i = 0; i < n; i += 32)
        x[i] = (i / 32) % 2 ? -1000.0f : 1000.0f;
}

/* Whether a product of type t over T tokens takes x rounded to 16 bits. */
static int rounds_x(const pv_backend *be, pv_wtype t, int64_t T)
{
    uint32_t block = 1;
    pv_wtype_block(t, &block, NULL);
    return block == 32 && (be->info.activation_bits == 16 || (act16_pass && T <= 16));
}

/* Leading blocks before W in its buffer, so w_off is tested non-zero. */
#define PAD_BLOCKS 3

typedef struct weights {
    pv_buffer *buf;
    uint64_t off;    /* elements */
    float *deq;      /* [n_out][n_in] as models/quant.c decodes them */
} weights;

static int make_weights(pv_backend *be, pv_wtype t, int64_t n_out, int64_t n_in, uint64_t *rng, weights *w)
{
    uint32_t be_elems = 0, bb = 0;
    pv_wtype_block(t, &be_elems, &bb);
    size_t n = (size_t)(n_out * n_in);
    float *src = xmalloc(n * sizeof *src);
    /* Rows with different ranges and offsets, so Q4_1's minimum and every
     * block's scale differ. */
    for (int64_t r = 0; r < n_out; r++) {
        float lo = rng_range(rng, -2.0f, 0.5f), hi = lo + rng_range(rng, 0.1f, 3.0f);
        rng_fill(rng, src + r * n_in, (size_t)n_in, lo, hi);
    }
    uint64_t bytes = n / be_elems * bb, pad = PAD_BLOCKS * (uint64_t)bb;
    unsigned char *img = xmalloc((size_t)(pad + bytes));
    memset(img, SENTINEL_BYTE, (size_t)pad);
    w->deq = xmalloc(n * sizeof *w->deq);
    int good = pv_ggml_quantize((uint32_t)t, src, n, img + pad, bytes) == PV_OK &&
               pv_ggml_dequantize_f32((uint32_t)t, img + pad, bytes, w->deq, n) == PV_OK &&
               pv_buffer_init(&w->buf, be, PV_MEM_DEVICE, pad + bytes) == PV_OK &&
               pv_buffer_write(w->buf, 0, img, pad) == PV_OK &&
               pv_weights_write(w->buf, pad, t, n_out, n_in, img + pad) == PV_OK;
    w->off = PAD_BLOCKS * (uint64_t)be_elems;
    free(src);
    free(img);
    return good;
}

static void free_weights(weights *w)
{
    pv_buffer_free(w->buf);
    free(w->deq);
}

/* got = x W^T [T][n_out] on the backend: x uploaded into *tx, the product
 * into the guarded *ty (both for the caller to free). */
static pv_status run_qmatmul(pv_backend *be, pv_wtype t, const weights *w, int64_t T, int64_t n_in, int64_t n_out,
                             const float *x, tensor *tx, tensor *ty, float *got)
{
    pv_status st = tensor_init(tx, be, PV_MEM_DEVICE, 4, (uint64_t)(T * n_in), x);
    if (st == PV_OK)
        st = tensor_init(ty, be, PV_MEM_DEVICE, 4, (uint64_t)(T * n_out), NULL);
    if (st != PV_OK)
        return st;
    pv_qmatmul_args a = {.w_type = t, .n_tokens = T, .n_in = n_in, .n_out = n_out, .w = w->buf, .w_off = w->off,
                         .x = tx->buf, .x_off = tx->off, .y = ty->buf, .y_off = ty->off};
    st = pv_qmatmul(be, &a);
    return st == PV_OK ? tensor_read(ty, got) : st;
}

static void check_qmatmul(pv_backend *be, const char *name, pv_wtype t, int64_t n_out, int64_t n_in, uint64_t *rng)
{
    weights w = {0};
    if (!make_weights(be, t, n_out, n_in, rng, &w)) {
        ok(0, "%s: qmatmul %s %lld x %lld: weights upload: %s", name, pv_wtype_name(t), (long long)n_out,
           (long long)n_in, pv_last_error());
        free_weights(&w);
        return;
    }
    for (int bi = 0; bi < N_BATCHES; bi++) {
        const int64_t T = batches[bi];
        float *x = xmalloc((size_t)(T * n_in) * sizeof *x);
        rng_fill(rng, x, (size_t)(T * n_in), -1.0f, 1.0f);
        if (act16_pass)
            spike_blocks(x, (size_t)(T * n_in));
        float *xq = xmalloc((size_t)(T * n_in) * sizeof *xq);
        memcpy(xq, x, (size_t)(T * n_in) * sizeof *xq);
        const int rounds = rounds_x(be, t, T);
        if (rounds)
            llama_ref_round16(x, xq, (size_t)(T * n_in));
        double *want = xmalloc((size_t)(T * n_out) * sizeof *want);
        for (int64_t i = 0; i < T; i++)
            for (int64_t o = 0; o < n_out; o++) {
                double s = 0;
                for (int64_t k = 0; k < n_in; k++)
                    s += (double)xq[i * n_in + k] * (double)w.deq[o * n_in + k];
                want[i * n_out + o] = s;
            }
        tensor tx = {0}, ty = {0};
        float *got = xmalloc((size_t)(T * n_out) * sizeof *got);
        pv_status st = run_qmatmul(be, t, &w, T, n_in, n_out, x, &tx, &ty, got);
        const double err = st == PV_OK ? normalized_error_f64(got, want, (size_t)(T * n_out)) : INFINITY;
        const double limit = ERROR_LIMIT;
        const int guards = st == PV_OK && guards_intact(&ty);
        ok(st == PV_OK && err <= limit && guards,
           "%s: qmatmul %s T %lld x n_in %lld -> n_out %lld: error %.3g against %s x (limit %.3g)%s%s", name,
           pv_wtype_name(t), (long long)T, (long long)n_in, (long long)n_out, err,
           rounds ? "rounded" : "f32", limit, guards ? "" : ", output guard bytes overwritten",
           st == PV_OK ? "" : pv_last_error());
        /* The batch-size invariance stateful serving relies on: the last
         * row of x alone gives the same bits as in the batch (backends that
         * round activations promise it for every type except F32, which may
         * go to BLAS for large batches). */
        if (st == PV_OK && T > 1 && be->info.activation_bits && t != PV_W_F32) {
            tensor t1;
            float *alone = xmalloc((size_t)n_out * sizeof *alone);
            pv_status s1 = tensor_init(&t1, be, PV_MEM_DEVICE, 4, (uint64_t)n_out, NULL);
            if (s1 == PV_OK) {
                pv_qmatmul_args a1 = {.w_type = t, .n_tokens = 1, .n_in = n_in, .n_out = n_out, .w = w.buf,
                                      .w_off = w.off, .x = tx.buf, .x_off = tx.off + (uint64_t)((T - 1) * n_in),
                                      .y = t1.buf, .y_off = t1.off};
                s1 = pv_qmatmul(be, &a1);
                if (s1 == PV_OK)
                    s1 = tensor_read(&t1, alone);
                tensor_free(&t1);
            }
            ok(s1 == PV_OK && memcmp(alone, got + (T - 1) * n_out, (size_t)n_out * sizeof *alone) == 0,
               "%s: qmatmul %s: row %lld of a batch of %lld is the same bits run alone", name, pv_wtype_name(t),
               (long long)(T - 1), (long long)T);
            free(alone);
        }
        tensor_free(&tx);
        tensor_free(&ty);
        free(x);
        free(xq);
        free(want);
        free(got);
    }
    free_weights(&w);
}

/* v as the 16-bit GEMM inputs hold it: bf16 rounded to nearest even, or
 * IEEE half (pensieve/half.h, the host's own conversion). */
static float round16(float v, int bf16)
{
    if (!bf16)
        return pv_half_to_float(pv_float_to_half(v));
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; /* the test's values are finite */
    memcpy(&v, &u, sizeof v);
    return v;
}

/* qmatmul's larger batches in each PV_GEMM mode (backends/kernel-params.h)
 * the backend runs, selected as pensieve-tune does. The 16-bit modes must
 * equal the product of x and the dequantised W each rounded to the mode's
 * type as specified (round to nearest even), to ROUNDED_ERROR_LIMIT: the
 * products of 16-bit values are exact in f32, but tensor cores add a
 * block's products with a few bits less than f32's rounding (up to some
 * 1e-5 of the largest output here), while a tile or activation not rounded,
 * or rounded otherwise, is off by 2-3e-4 (shown on PoCL with the device
 * limit lifted). TF32 rounds inside cuBLAS: its 10-bit significand gives
 * some 1e-3 against the f32 product. A mode the backend does not run is
 * refused by name. */
#define ROUNDED_ERROR_LIMIT 5e-5
#define TF32_ERROR_LIMIT 4e-3

static void check_group(pv_backend *be, const char *name, const pv_wtype *ts, const int64_t *n_outs, int n,
                        uint64_t *rng);
static void check_swiglu(pv_backend *be, const char *name, pv_wtype t, int64_t n_out, int64_t n_in, uint64_t *rng);

static void check_gemm_modes(pv_backend *be, const char *name, uint64_t *rng)
{
    static const pv_wtype mode_types[] = {PV_W_Q4_1, PV_W_F16, PV_W_BF16, PV_W_F32};
    const int64_t n_out = 192, n_in = 576, T = 64;
    for (int mode = PV_GEMM_F16; mode < PV_GEMM_MODES; mode++) {
        char set[32];
        snprintf(set, sizeof set, "PV_GEMM=%d", mode);
        const pv_status st_set = pv_backend_kernel_set(be, "qmatmul", set);
        if (st_set != PV_OK) {
            ok(st_set == PV_ERR_UNSUPPORTED && strcmp(name, "cuda") != 0 &&
                   (strstr(pv_last_error(), "PV_GEMM") || strstr(pv_last_error(), "no tunable kernels")),
               "%s: PV_GEMM %s refused by name (%s)", name, pv_gemm_mode_name(mode), pv_last_error());
            continue;
        }
        const int narrow = mode != PV_GEMM_TF32, bf16 = mode == PV_GEMM_BF16;
        for (size_t ti = 0; ti < sizeof mode_types / sizeof mode_types[0]; ti++) {
            const pv_wtype t = mode_types[ti];
            weights w = {0};
            const size_t x_n = (size_t)(T * n_in), y_n = (size_t)(T * n_out);
            float *x = xmalloc(x_n * sizeof *x), *got = xmalloc(y_n * sizeof *got);
            double *want = xmalloc(y_n * sizeof *want);
            rng_fill(rng, x, x_n, -1.0f, 1.0f);
            tensor tx = {0}, ty = {0};
            const int made = make_weights(be, t, n_out, n_in, rng, &w);
            const pv_status st = made ? run_qmatmul(be, t, &w, T, n_in, n_out, x, &tx, &ty, got) : PV_ERR_INVALID_ARG;
            for (int64_t i = 0; i < T && made; i++)
                for (int64_t o = 0; o < n_out; o++) {
                    double sum = 0;
                    for (int64_t k = 0; k < n_in; k++) {
                        const float xv = x[i * n_in + k], wv = w.deq[o * n_in + k];
                        sum += narrow ? (double)round16(xv, bf16) * (double)round16(wv, bf16) : (double)xv * wv;
                    }
                    want[i * n_out + o] = sum;
                }
            const double err = st == PV_OK ? normalized_error_f64(got, want, y_n) : INFINITY;
            const double limit = narrow ? ROUNDED_ERROR_LIMIT : TF32_ERROR_LIMIT;
            const int guards = st == PV_OK && guards_intact(&ty);
            ok(st == PV_OK && err <= limit && guards,
               "%s: qmatmul %s T %lld with PV_GEMM %s: error %.3g against the %s product (limit %.3g)%s%s", name,
               pv_wtype_name(t), (long long)T, pv_gemm_mode_name(mode), err, narrow ? "rounded" : "f32", limit,
               guards ? "" : ", output guard bytes overwritten", st == PV_OK ? "" : pv_last_error());
            tensor_free(&tx);
            tensor_free(&ty);
            free_weights(&w);
            free(x);
            free(got);
            free(want);
        }
        /* Products of one x narrow it once (the grouped Q, K and V; gate
         * and up): each the same bits as alone, the SwiGLU product against
         * the rounded reference and the unfused ops. */
        gemm_pass = mode;
        check_group(be, name, (const pv_wtype[]){PV_W_Q4_1, PV_W_F16, PV_W_Q4_1}, (const int64_t[]){67, 24, 40}, 3,
                    rng);
        check_group(be, name, (const pv_wtype[]){PV_W_Q4_0, PV_W_Q4_0, PV_W_Q4_0}, (const int64_t[]){67, 5, 192}, 3,
                    rng);
        check_swiglu(be, name, PV_W_Q4_1, 37, 160, rng);
        gemm_pass = PV_GEMM_F32;
    }
    if (pv_backend_kernels_tunable(be) && pv_backend_kernel_set(be, "qmatmul", "PV_GEMM=0") != PV_OK)
        ok(0, "%s: back to PV_GEMM f32: %s", name, pv_last_error());
}

static void check_embed(pv_backend *be, const char *name, pv_wtype t, uint64_t *rng)
{
    const int64_t n_rows = 50, dim = 96;
    weights w = {0};
    int32_t ids[9];
    for (int i = 0; i < 9; i++)
        ids[i] = rng_below(rng, n_rows);
    ids[8] = (int32_t)n_rows - 1; /* the last row: an off-by-one reads past the table */
    tensor out;
    float got[9 * 96];
    pv_status st = make_weights(be, t, n_rows, dim, rng, &w) ? PV_OK : PV_ERR_BACKEND;
    if (st == PV_OK)
        st = tensor_init(&out, be, PV_MEM_DEVICE, 4, 9 * dim, NULL);
    const int have_out = st == PV_OK;
    if (st == PV_OK) {
        pv_embed_gather_args a = {.table_type = t, .n_rows = n_rows, .dim = dim, .table = w.buf,
                                  .table_off = w.off, .ids = ids, .n_ids = 9, .out = out.buf,
                                  .out_off = out.off};
        st = pv_embed_gather(be, &a);
        if (st == PV_OK)
            st = tensor_read(&out, got);
    }
    double want[9 * 96];
    for (int i = 0; i < 9; i++)
        for (int64_t d = 0; d < dim; d++)
            want[i * dim + d] = w.deq[ids[i] * dim + d];
    /* Widening is exact up to how d * q + m rounds (fused or not). */
    const double err = st == PV_OK ? normalized_error_f64(got, want, 9 * (size_t)dim) : INFINITY;
    const int guards = st == PV_OK && guards_intact(&out);
    ok(st == PV_OK && err <= 1e-6 && guards, "%s: embed_gather %s, 9 rows of %lld x %lld: error %.3g (limit 1e-06)%s",
       name, pv_wtype_name(t), (long long)n_rows, (long long)dim, err, guards ? "" : ", guard bytes overwritten");
    if (have_out)
        tensor_free(&out);
    free_weights(&w);
}

/* pv_qmatmul_group: every product's y the same bits as pv_qmatmul gives it
 * alone, the outputs side by side in one buffer with guards around them. */
/* check_group_n at rows of 160: five blocks, an odd number. */
static void check_group_n(pv_backend *be, const char *name, const pv_wtype *ts, const int64_t *n_outs, int n,
                          int64_t n_in, uint64_t *rng);
static void check_group(pv_backend *be, const char *name, const pv_wtype *ts, const int64_t *n_outs, int n,
                        uint64_t *rng)
{
    check_group_n(be, name, ts, n_outs, n, 160, rng);
}

static void check_group_n(pv_backend *be, const char *name, const pv_wtype *ts, const int64_t *n_outs, int n,
                          int64_t n_in, uint64_t *rng)
{
    char what[128];
    int len = snprintf(what, sizeof what, "%d products", n);
    for (int i = 0; i < n; i++)
        len += snprintf(what + len, sizeof what - (size_t)len, "%s%s x %lld", i ? ", " : " (",
                        pv_wtype_name(ts[i]), (long long)n_outs[i]);
    snprintf(what + len, sizeof what - (size_t)len, ")");
    for (int i = 0; i < n; i++)
        if (!pv_backend_supports_weights(be, PV_OP_QMATMUL, ts[i])) {
            tap_skip("%s: qmatmul_group of %s: %s is not supported", name, what, pv_wtype_name(ts[i]));
            return;
        }
    weights w[PV_QMATMUL_GROUP_MAX] = {{0}};
    int made = 1;
    int64_t out_total = 0;
    for (int i = 0; i < n; i++) {
        made = made && make_weights(be, ts[i], n_outs[i], n_in, rng, &w[i]);
        out_total += n_outs[i];
    }
    static const int64_t group_batches[] = {1, 3, 7, 300}; /* the token classes 1, 4, 16, then GEMMs */
    for (size_t bi = 0; made && bi < sizeof group_batches / sizeof group_batches[0]; bi++) {
        const int64_t T = group_batches[bi];
        float *x = xmalloc((size_t)(T * n_in) * sizeof *x);
        rng_fill(rng, x, (size_t)(T * n_in), -1.0f, 1.0f);
        float *together = xmalloc((size_t)(T * out_total) * sizeof *together);
        float *alone = xmalloc((size_t)(T * out_total) * sizeof *alone);
        tensor tx, ty, t1;
        pv_status st = tensor_init(&tx, be, PV_MEM_DEVICE, 4, (uint64_t)(T * n_in), x);
        if (st == PV_OK)
            st = tensor_init(&ty, be, PV_MEM_DEVICE, 4, (uint64_t)(T * out_total), NULL);
        if (st == PV_OK)
            st = tensor_init(&t1, be, PV_MEM_DEVICE, 4, (uint64_t)(T * out_total), NULL);
        pv_qmatmul_args q[PV_QMATMUL_GROUP_MAX];
        uint64_t at = 0;
        for (int i = 0; i < n; i++) {
            q[i] = (pv_qmatmul_args){.w_type = ts[i], .n_tokens = T, .n_in = n_in, .n_out = n_outs[i],
                                     .w = w[i].buf, .w_off = w[i].off, .x = tx.buf, .x_off = tx.off,
                                     .y = ty.buf, .y_off = ty.off + at};
            at += (uint64_t)(T * n_outs[i]);
        }
        if (st == PV_OK)
            st = pv_qmatmul_group(be, q, n);
        for (int i = 0; i < n && st == PV_OK; i++) {
            pv_qmatmul_args one = q[i];
            one.y = t1.buf;
            one.y_off = t1.off + (q[i].y_off - ty.off);
            st = pv_qmatmul(be, &one);
        }
        if (st == PV_OK)
            st = tensor_read(&ty, together);
        if (st == PV_OK)
            st = tensor_read(&t1, alone);
        size_t differ = 0;
        for (int64_t e = 0; st == PV_OK && e < T * out_total; e++)
            differ += memcmp(&together[e], &alone[e], sizeof(float)) != 0;
        const int guards = st == PV_OK && guards_intact(&ty);
        ok(st == PV_OK && differ == 0 && guards,
           "%s: qmatmul_group of %s, T %lld: the same bits as one by one (%zu of %lld differ)%s%s", name, what,
           (long long)T, differ, (long long)(T * out_total), guards ? "" : ", output guard bytes overwritten",
           st == PV_OK ? "" : pv_last_error());
        tensor_free(&tx);
        tensor_free(&ty);
        tensor_free(&t1);
        free(x);
        free(together);
        free(alone);
    }
    if (!made)
        ok(0, "%s: qmatmul_group of %s: weights upload: %s", name, what, pv_last_error());
    for (int i = 0; i < n; i++)
        free_weights(&w[i]);
}

/* pv_qmatmul_swiglu: y = silu(x Wg^T) * (x Wu^T) against the double
 * products (x rounded as the backend rounds it), and against
 * pv_qmatmul_group then pv_swiglu on the same backend, for decode-sized
 * batches (one pass on the GPUs) and larger ones (two products, then the
 * element-wise kernel); guards around y and the up scratch. The error of
 * silu(g) u is that of g and u (ERROR_LIMIT) times silu's slope, at most
 * 1.1: hence 2 ERROR_LIMIT. */
static void check_swiglu(pv_backend *be, const char *name, pv_wtype t, int64_t n_out, int64_t n_in, uint64_t *rng)
{
    weights wg = {0}, wu = {0};
    if (!make_weights(be, t, n_out, n_in, rng, &wg) || !make_weights(be, t, n_out, n_in, rng, &wu)) {
        ok(0, "%s: qmatmul_swiglu %s: weights upload: %s", name, pv_wtype_name(t), pv_last_error());
        free_weights(&wg);
        free_weights(&wu);
        return;
    }
    static const int64_t swiglu_batches[] = {1, 3, 16, 17, 300};
    for (size_t bi = 0; bi < sizeof swiglu_batches / sizeof swiglu_batches[0]; bi++) {
        const int64_t T = swiglu_batches[bi];
        const int rounds = rounds_x(be, t, T);
        /* past the decode-sized kernels (16 tokens), the GEMMs of a 16-bit
         * PV_GEMM mode take x and W rounded to it (check_gemm_modes) */
        const int gemm = T > 16 && gemm_pass != PV_GEMM_F32;
        const int narrowed = gemm && gemm_pass != PV_GEMM_TF32, bf16 = gemm_pass == PV_GEMM_BF16;
        const size_t x_n = (size_t)(T * n_in), y_n = (size_t)(T * n_out);
        float *x = xmalloc(x_n * sizeof *x), *xq = xmalloc(x_n * sizeof *xq);
        rng_fill(rng, x, x_n, -1.0f, 1.0f);
        if (act16_pass)
            spike_blocks(x, x_n);
        memcpy(xq, x, x_n * sizeof *xq);
        if (rounds)
            llama_ref_round16(x, xq, x_n);
        for (size_t i = 0; narrowed && i < x_n; i++)
            xq[i] = round16(x[i], bf16);
        double *want = xmalloc(y_n * sizeof *want);
        for (int64_t i = 0; i < T; i++)
            for (int64_t o = 0; o < n_out; o++) {
                double g = 0, u = 0;
                for (int64_t k = 0; k < n_in; k++) {
                    const float wgv = wg.deq[o * n_in + k], wuv = wu.deq[o * n_in + k];
                    g += (double)xq[i * n_in + k] * (narrowed ? round16(wgv, bf16) : wgv);
                    u += (double)xq[i * n_in + k] * (narrowed ? round16(wuv, bf16) : wuv);
                }
                want[i * n_out + o] = g / (1.0 + exp(-g)) * u;
            }
        float *got = xmalloc(y_n * sizeof *got), *unfused = xmalloc(y_n * sizeof *unfused);
        tensor tx, ty, tup, tg, tu;
        memset(&ty, 0, sizeof ty);
        memset(&tup, 0, sizeof tup);
        memset(&tg, 0, sizeof tg);
        memset(&tu, 0, sizeof tu);
        pv_status st = tensor_init(&tx, be, PV_MEM_DEVICE, 4, x_n, x);
        if (st == PV_OK)
            st = tensor_init(&ty, be, PV_MEM_DEVICE, 4, y_n, NULL);
        if (st == PV_OK)
            st = tensor_init(&tup, be, PV_MEM_DEVICE, 4, y_n, NULL);
        if (st == PV_OK)
            st = tensor_init(&tg, be, PV_MEM_DEVICE, 4, y_n, NULL);
        if (st == PV_OK)
            st = tensor_init(&tu, be, PV_MEM_DEVICE, 4, y_n, NULL);
        if (st == PV_OK) {
            pv_qmatmul_swiglu_args a = {.w_type = t, .n_tokens = T, .n_in = n_in, .n_out = n_out, .w_gate = wg.buf,
                                        .w_gate_off = wg.off, .w_up = wu.buf, .w_up_off = wu.off, .x = tx.buf,
                                        .x_off = tx.off, .y = ty.buf, .y_off = ty.off, .up = tup.buf,
                                        .up_off = tup.off};
            st = pv_qmatmul_swiglu(be, &a);
        }
        if (st == PV_OK) {
            pv_qmatmul_args q[2] = {
                {.w_type = t, .n_tokens = T, .n_in = n_in, .n_out = n_out, .w = wg.buf, .w_off = wg.off,
                 .x = tx.buf, .x_off = tx.off, .y = tg.buf, .y_off = tg.off},
                {.w_type = t, .n_tokens = T, .n_in = n_in, .n_out = n_out, .w = wu.buf, .w_off = wu.off,
                 .x = tx.buf, .x_off = tx.off, .y = tu.buf, .y_off = tu.off},
            };
            pv_swiglu_args sw = {.n = (int64_t)y_n, .gate = tg.buf, .gate_off = tg.off, .up = tu.buf,
                                 .up_off = tu.off, .out = tg.buf, .out_off = tg.off};
            st = pv_qmatmul_group(be, q, 2);
            if (st == PV_OK)
                st = pv_swiglu(be, &sw);
        }
        if (st == PV_OK)
            st = tensor_read(&ty, got);
        if (st == PV_OK)
            st = tensor_read(&tg, unfused);
        const double err = st == PV_OK ? normalized_error_f64(got, want, y_n) : INFINITY;
        const double apart = st == PV_OK ? normalized_error(got, unfused, y_n) : INFINITY;
        const int guards = st == PV_OK && guards_intact(&ty) && guards_intact(&tup);
        const double limit = 2 * (narrowed ? ROUNDED_ERROR_LIMIT : gemm ? TF32_ERROR_LIMIT : ERROR_LIMIT);
        ok(st == PV_OK && err <= limit && guards,
           "%s: qmatmul_swiglu %s T %lld x n_in %lld -> n_out %lld%s%s: error %.3g against %s x (limit %.3g)%s%s",
           name, pv_wtype_name(t), (long long)T, (long long)n_in, (long long)n_out, gemm ? " with PV_GEMM " : "",
           gemm ? pv_gemm_mode_name(gemm_pass) : "", err, rounds || narrowed ? "rounded" : "f32", limit,
           guards ? "" : ", guard bytes of y or up overwritten", st == PV_OK ? "" : pv_last_error());
        ok(st == PV_OK && apart <= 1e-6,
           "%s: qmatmul_swiglu %s T %lld%s%s: as qmatmul_group then swiglu give it: error %.3g (limit 1e-06)", name,
           pv_wtype_name(t), (long long)T, gemm ? " with PV_GEMM " : "", gemm ? pv_gemm_mode_name(gemm_pass) : "",
           apart);
        tensor_free(&tx);
        tensor_free(&ty);
        tensor_free(&tup);
        tensor_free(&tg);
        tensor_free(&tu);
        free(x);
        free(xq);
        free(want);
        free(got);
        free(unfused);
    }
    free_weights(&wg);
    free_weights(&wu);
}

/* Under PV_ACT16, a NaN in one token's x reaches every output of that
 * token (the rounding keeps it in the block's scale) and no other token's. */
static void check_act16_nan(pv_backend *be, const char *name, pv_wtype t, uint64_t *rng)
{
    const int64_t T = 2, n_in = 576, n_out = 67;
    weights w = {0};
    float x[2 * 576], got[2 * 67];
    rng_fill(rng, x, (size_t)(T * n_in), -1.0f, 1.0f);
    x[100] = NAN;
    tensor tx = {0}, ty = {0};
    const int made = make_weights(be, t, n_out, n_in, rng, &w);
    const pv_status st = made ? run_qmatmul(be, t, &w, T, n_in, n_out, x, &tx, &ty, got) : PV_ERR_INVALID_ARG;
    int nan_first = 1, finite_second = 1;
    for (int64_t o = 0; o < n_out; o++) {
        nan_first &= isnan(got[o]) != 0;
        finite_second &= isfinite(got[n_out + o]) != 0;
    }
    ok(st == PV_OK && nan_first && finite_second,
       "%s: qmatmul %s with PV_ACT16: a NaN in token 0's x makes its every output NaN (%s), token 1's stay finite "
       "(%s)%s",
       name, pv_wtype_name(t), nan_first ? "yes" : "no", finite_second ? "yes" : "no",
       st == PV_OK ? "" : pv_last_error());
    tensor_free(&tx);
    tensor_free(&ty);
    free_weights(&w);
}

/* The checks of the block types (and F16, which the mode leaves alone)
 * again under PV_ACT16=1, set as pensieve-tune sets it; a backend without
 * tunable kernels refuses the set. */
static void check_act16(pv_backend *be, const char *name, uint64_t *rng)
{
    const pv_status st = pv_backend_kernel_set(be, "qmatmul", "PV_ACT16=1");
    if (st != PV_OK) {
        ok(st == PV_ERR_UNSUPPORTED && !pv_backend_kernels_tunable(be),
           "%s: PV_ACT16 is refused only by a backend without tunable kernels (%s)", name, pv_last_error());
        return;
    }
    act16_pass = 1;
    static const pv_wtype act16_types[] = {PV_W_Q8_0, PV_W_Q4_0, PV_W_Q4_1, PV_W_F16};
    for (size_t ti = 0; ti < sizeof act16_types / sizeof act16_types[0]; ti++) {
        const pv_wtype t = act16_types[ti];
        const int blocks = t != PV_W_F16;
        check_qmatmul(be, name, t, 67, blocks ? 160 : 37, rng);
        if (!blocks)
            continue;
        check_qmatmul(be, name, t, 5, 64, rng);
        check_qmatmul(be, name, t, 192, 576, rng);
        check_swiglu(be, name, t, 37, 160, rng);
        check_act16_nan(be, name, t, rng);
    }
    /* one rounding of x for the group's block types, bit for bit as each
     * rounds it alone */
    check_group(be, name, (const pv_wtype[]){PV_W_Q4_1, PV_W_Q8_0, PV_W_Q4_0}, (const int64_t[]){67, 5, 192}, 3,
                rng);
    check_group(be, name, (const pv_wtype[]){PV_W_F16, PV_W_Q4_1}, (const int64_t[]){24, 40}, 2, rng);
    check_group(be, name, (const pv_wtype[]){PV_W_Q4_0, PV_W_Q4_0, PV_W_Q4_0, PV_W_Q4_0},
                (const int64_t[]){67, 5, 192, 3}, 4, rng);
    act16_pass = 0;
    if (pv_backend_kernel_set(be, "qmatmul", "PV_ACT16=0") != PV_OK)
        ok(0, "%s: back to PV_ACT16 0: %s", name, pv_last_error());
}

/* Under a kernel set just made: every weight type at every batch over 67
 * rows (a last group with fewer rows than the others), a Q4_0 SwiGLU
 * product and a group of Q, K and V shapes. */
static void check_decode_kernels(pv_backend *be, const char *name, uint64_t *rng)
{
    for (int ti = 0; ti < N_TYPES; ti++)
        if (pv_backend_supports_weights(be, PV_OP_QMATMUL, types[ti]))
            check_qmatmul(be, name, types[ti], 67, types[ti] == PV_W_F32 || types[ti] == PV_W_F16 ? 37 : 160, rng);
    if (pv_backend_supports_weights(be, PV_OP_QMATMUL_SWIGLU, PV_W_Q4_0))
        check_swiglu(be, name, PV_W_Q4_0, 37, 160, rng);
    check_group(be, name, (const pv_wtype[]){PV_W_Q4_0, PV_W_Q4_0, PV_W_Q4_0}, (const int64_t[]){67, 5, 192}, 3,
                rng);
}

/* The one-token kernels again with 4 and 8 rows a work-group (PV_QMV_ROWS;
 * the other classes keep theirs), f32 x and, with 8, x rounded
 * (PV_ACT16): every weight type alone, a SwiGLU product and a group of
 * Q, K and V shapes, whose products at 1 token the rows change (the
 * batch loops' other sizes run the unchanged kernels again). A backend
 * without tunable kernels refuses the set. */
static void check_rows(pv_backend *be, const char *name, uint64_t *rng)
{
    static const char *const sets[] = {"PV_QMV_ROWS=4", "PV_QMV_ROWS=8", "PV_QMV_ROWS=8 PV_ACT16=1"};
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        const pv_status st = pv_backend_kernel_set(be, "qmatmul", sets[si]);
        if (st != PV_OK) {
            ok(st == PV_ERR_UNSUPPORTED && !pv_backend_kernels_tunable(be),
               "%s: %s is refused only by a backend without tunable kernels (%s)", name, sets[si], pv_last_error());
            return;
        }
        act16_pass = strstr(sets[si], "PV_ACT16=1") != NULL;
        tap_diag("%s: the checks up to the next such line run with %s", name, sets[si]);
        check_decode_kernels(be, name, rng);
        act16_pass = 0;
    }
    if (pv_backend_kernel_set(be, "qmatmul", "PV_QMV_ROWS=2 PV_ACT16=0") != PV_OK)
        ok(0, "%s: back to PV_QMV_ROWS 2: %s", name, pv_last_error());
}

/* One token's product of type t, n_out x n_in, with x shift floats past a
 * 16-byte boundary (CUDA loads x 16 bytes at a time only at 0) and
 * followed by 8 more, not zeros: a kernel that reads past the row's end
 * adds them. */
static void check_one_token(pv_backend *be, const char *name, pv_wtype t, int64_t n_out, int64_t n_in, int shift,
                            uint64_t *rng)
{
    weights w = {0};
    const int64_t x_n = n_in + shift + 8;
    float *xs = xmalloc((size_t)x_n * sizeof *xs), *got = xmalloc((size_t)n_out * sizeof *got);
    float *xq = xmalloc((size_t)n_in * sizeof *xq);
    double *want = xmalloc((size_t)n_out * sizeof *want);
    float *x = xs + shift;
    rng_fill(rng, xs, (size_t)x_n, -1.0f, 1.0f);
    if (act16_pass)
        spike_blocks(x, (size_t)n_in);
    memcpy(xq, x, (size_t)n_in * sizeof *xq);
    const int rounds = rounds_x(be, t, 1);
    if (rounds)
        llama_ref_round16(x, xq, (size_t)n_in);
    tensor tx = {0}, ty = {0};
    pv_status st = make_weights(be, t, n_out, n_in, rng, &w) ? PV_OK : PV_ERR_BACKEND;
    for (int64_t o = 0; st == PV_OK && o < n_out; o++) {
        double sum = 0;
        for (int64_t k = 0; k < n_in; k++)
            sum += (double)xq[k] * (double)w.deq[o * n_in + k];
        want[o] = sum;
    }
    if (st == PV_OK)
        st = tensor_init(&tx, be, PV_MEM_DEVICE, 4, (uint64_t)x_n, xs);
    if (st == PV_OK)
        st = tensor_init(&ty, be, PV_MEM_DEVICE, 4, (uint64_t)n_out, NULL);
    if (st == PV_OK) {
        pv_qmatmul_args a = {.w_type = t, .n_tokens = 1, .n_in = n_in, .n_out = n_out, .w = w.buf, .w_off = w.off,
                             .x = tx.buf, .x_off = tx.off + (uint64_t)shift, .y = ty.buf, .y_off = ty.off};
        st = pv_qmatmul(be, &a);
    }
    if (st == PV_OK)
        st = tensor_read(&ty, got);
    const double err = st == PV_OK ? normalized_error_f64(got, want, (size_t)n_out) : INFINITY;
    ok(st == PV_OK && err <= ERROR_LIMIT && guards_intact(&ty),
       "%s: qmatmul %s T 1 x n_in %lld -> n_out %lld, x %d floats past 16 bytes: error %.3g against %s x "
       "(limit %.3g)%s",
       name, pv_wtype_name(t), (long long)n_in, (long long)n_out, shift, err, rounds ? "rounded" : "f32",
       ERROR_LIMIT, st == PV_OK ? "" : pv_last_error());
    tensor_free(&tx);
    tensor_free(&ty);
    free_weights(&w);
    free(xs);
    free(xq);
    free(got);
    free(want);
}

/* The one-token kernels' passes (kernels/qmatmul.cl, PV_QMV_FLIGHT): with
 * a work-item's octets `stride` apart (PV_WG / PV_QMV_LANES), a pass covers
 * 32 stride elements of a block type's row at 2 rows and 16 stride at 4,
 * 16 stride of F16 and BF16 at 2 rows. The rows below, sized from the
 * stride (a multiple of 32), give work-items no pass, one, or several
 * (each of the two buffers in turn) followed by octets one at a time, and
 * odd float rows a short last octet; f32 x at both alignments, and x
 * rounded (PV_ACT16); a SwiGLU product and a group over such rows. F32
 * rows take no passes. Each of sets runs the checks (its programs the
 * checks before have built, where PoCL's compiles are slow). */
static void check_passes_at(pv_backend *be, const char *name, const char *const *sets, int n_sets, int64_t stride,
                            uint64_t *rng)
{
    /* 56 stride + 32 and 24 stride + 21: a work-item whose last pass ends
     * on the row's last octet exactly (at 2 and at 4 rows) */
    const int64_t block_rows[] = {31 * stride, 32 * stride, 56 * stride + 32, 3 * 32 * stride + 160},
                  float_rows[] = {16 * stride - 3, 24 * stride + 21, 3 * 16 * stride + 9};
    for (int si = 0; si < n_sets; si++) {
        if (pv_backend_kernel_set(be, "qmatmul", sets[si]) != PV_OK) {
            ok(0, "%s: %s: %s", name, sets[si], pv_last_error());
            break;
        }
        act16_pass = strstr(sets[si], "PV_ACT16=1") != NULL;
        tap_diag("%s: the checks up to the next such line run with %s, octets %lld apart", name, sets[si],
                 (long long)stride);
        for (int ti = 0; ti < N_TYPES; ti++) {
            const pv_wtype t = types[ti];
            uint32_t block = 1;
            pv_wtype_block(t, &block, NULL);
            if (t == PV_W_F32 || !pv_backend_supports_weights(be, PV_OP_QMATMUL, t) || (act16_pass && block == 1))
                continue;
            const int64_t *rows = block == 1 ? float_rows : block_rows;
            const int n_rows = block == 1 ? 3 : 4;
            for (int ri = 0; ri < n_rows; ri++)
                check_one_token(be, name, t, 9, rows[ri], ri % 2, rng);
        }
        if (pv_backend_supports_weights(be, PV_OP_QMATMUL_SWIGLU, PV_W_Q4_1))
            check_swiglu(be, name, PV_W_Q4_1, 9, block_rows[3], rng);
        check_group_n(be, name, (const pv_wtype[]){PV_W_Q8_0, PV_W_Q8_0, PV_W_Q8_0}, (const int64_t[]){9, 3, 5}, 3,
                      block_rows[3], rng);
        act16_pass = 0;
    }
}

/* The passes at the backend's own PV_WG and one lane, octets PV_WG apart. */
static void check_passes(pv_backend *be, const char *name, uint64_t *rng)
{
    static const char *const sets[] = {"PV_QMV_ROWS=2", "PV_QMV_ROWS=4", "PV_QMV_ROWS=2 PV_ACT16=1"};
    char before[256];
    const char *wg_at = NULL;
    if (pv_backend_kernel_get(be, "qmatmul", before, sizeof before) == PV_OK)
        wg_at = strstr(before, "PV_WG=");
    if (!wg_at) {
        ok(!pv_backend_kernels_tunable(be), "%s: the qmatmul set names PV_WG where kernels are tunable (%s)", name,
           pv_backend_kernels_tunable(be) ? before : "none");
        return;
    }
    check_passes_at(be, name, sets, 3, atoi(wg_at + strlen("PV_WG=")), rng);
    if (pv_backend_kernel_set(be, "qmatmul", before) != PV_OK)
        ok(0, "%s: back to %s: %s", name, before, pv_last_error());
}

/* Every decode-sized kernel again with 8 row lanes a work-group
 * (PV_QMV_LANES), at PV_WG 256 so that a lane's octets are 32 apart: every
 * weight type at every batch (the token classes 1, 4 and 16, whose groups
 * take 16, 32 and 16 rows: 67 rows leave a last group with lanes past the
 * end, some partly), a SwiGLU product, groups of products (5 rows: one
 * group, its lanes 3 to 7 idle), the one-token passes; f32 x and x rounded
 * (PV_ACT16). One program a weight type (PoCL compiles each for seconds). */
static void check_lanes(pv_backend *be, const char *name, uint64_t *rng)
{
    static const char *const sets[] = {"PV_WG=256 PV_QMV_LANES=8 PV_QMV_ROWS=2 PV_ACT16=0",
                                       "PV_WG=256 PV_QMV_LANES=8 PV_QMV_ROWS=2 PV_ACT16=1"};
    char before[256];
    if (pv_backend_kernel_get(be, "qmatmul", before, sizeof before) != PV_OK) {
        ok(!pv_backend_kernels_tunable(be), "%s: a backend with tunable kernels has a qmatmul set (%s)", name,
           pv_last_error());
        return;
    }
    for (int si = 0; si < 2; si++) {
        const pv_status st = pv_backend_kernel_set(be, "qmatmul", sets[si]);
        if (!ok(st == PV_OK, "%s: qmatmul takes %s (%s)", name, sets[si], st == PV_OK ? "" : pv_last_error()))
            return;
        act16_pass = si == 1;
        tap_diag("%s: the checks up to the next such line run with %s", name, sets[si]);
        check_decode_kernels(be, name, rng);
        act16_pass = 0;
    }
    check_passes_at(be, name, sets, 2, 256 / 8, rng);
    if (pv_backend_kernel_set(be, "qmatmul", before) != PV_OK)
        ok(0, "%s: back to %s: %s", name, before, pv_last_error());
}

static void expect_refused(const char *name, const char *what, pv_status st, pv_status want, const char *needle)
{
    const char *msg = st == PV_OK ? "" : pv_last_error();
    ok(st == want && strstr(msg, needle) != NULL, "%s: %s is refused (%s)", name, what, msg);
}

/* The shapes GGUF cannot hold, and aliasing the kernels cannot serve. */
static void check_refusals(pv_backend *be, const char *name)
{
    pv_buffer *w = NULL, *x = NULL;
    if (pv_buffer_init(&w, be, PV_MEM_DEVICE, 4096) != PV_OK || pv_buffer_init(&x, be, PV_MEM_DEVICE, 4096) != PV_OK) {
        ok(0, "%s: buffers for the refusal checks: %s", name, pv_last_error());
        pv_buffer_free(w);
        return;
    }
    pv_qmatmul_args a = {.w_type = PV_W_Q4_1, .n_tokens = 1, .n_in = 48, .n_out = 2, .w = w, .x = x, .y = x,
                         .y_off = 64};
    expect_refused(name, "Q4_1 with n_in 48 (not whole blocks)", pv_qmatmul(be, &a), PV_ERR_INVALID_ARG,
                   "n_in = 48 is not a multiple of Q4_1's block of 32");
    a.n_in = 64;
    a.w_off = 16;
    expect_refused(name, "Q4_1 at w_off 16 (mid-block)", pv_qmatmul(be, &a), PV_ERR_INVALID_ARG,
                   "w_off = 16 is not a multiple");
    a.w_off = 0;
    a.n_out = 1000;
    expect_refused(name, "1000 Q4_1 rows of 64 in 4096 bytes", pv_qmatmul(be, &a), PV_ERR_INVALID_ARG,
                   "buffer w too small");
    a.n_out = 2;
    a.y_off = 32;
    expect_refused(name, "y overlapping x", pv_qmatmul(be, &a), PV_ERR_INVALID_ARG, "y overlaps x");
    a.y_off = 64;
    a.w_type = (pv_wtype)6; /* Q5_0: a GGUF type no kernel reads */
    expect_refused(name, "weight type 6 (Q5_0)", pv_qmatmul(be, &a), PV_ERR_INVALID_ARG,
                   "not a known weight type");
    a.w_type = PV_W_Q8_0;
    a.n_in = 32;
    a.n_tokens = (int64_t)1 << 40;
    expect_refused(name, "2^40 tokens", pv_qmatmul(be, &a), PV_ERR_UNSUPPORTED, "n_tokens = 1099511627776 exceeds");
    a.n_tokens = 1;
    a.n_in = 64;
    a.w_type = PV_W_Q4_1;
    pv_qmatmul_args g[PV_QMATMUL_GROUP_MAX + 1];
    for (int i = 0; i <= PV_QMATMUL_GROUP_MAX; i++) {
        g[i] = a;
        g[i].y_off = 64 + 16 * (uint64_t)i;
    }
    expect_refused(name, "a group of no products", pv_qmatmul_group(be, g, 0), PV_ERR_INVALID_ARG,
                   "n = 0 out of range");
    expect_refused(name, "a group over the most products", pv_qmatmul_group(be, g, PV_QMATMUL_GROUP_MAX + 1),
                   PV_ERR_INVALID_ARG, "out of range [1, 8]");
    expect_refused(name, "a group of NULL", pv_qmatmul_group(be, NULL, 2), PV_ERR_INVALID_ARG,
                   "products is NULL");
    g[1].x_off = 8;
    expect_refused(name, "a group reading two x", pv_qmatmul_group(be, g, 2), PV_ERR_INVALID_ARG,
                   "product 1 reads x at offset 8");
    g[1].x_off = 0;
    g[1].y_off = 65;
    expect_refused(name, "a group whose outputs overlap", pv_qmatmul_group(be, g, 2), PV_ERR_INVALID_ARG,
                   "products 0 and 1 write overlapping y");
    g[1].y_off = 80;
    g[1].n_out = 1000;
    expect_refused(name, "a group with a product too large for its w", pv_qmatmul_group(be, g, 2),
                   PV_ERR_INVALID_ARG, "product 1: qmatmul: buffer w too small");
    pv_qmatmul_swiglu_args sw = {.w_type = PV_W_Q4_1, .n_tokens = 1, .n_in = 64, .n_out = 2, .w_gate = w,
                                 .w_up = w, .w_up_off = 64, .x = x, .y = x, .y_off = 64, .up = x, .up_off = 128};
    pv_buffer *other = NULL;
    if (pv_buffer_init(&other, be, PV_MEM_DEVICE, 4096) == PV_OK) {
        expect_refused(name, "qmatmul_swiglu of NULL", pv_qmatmul_swiglu(be, NULL), PV_ERR_INVALID_ARG,
                       "args is NULL");
        sw.up_off = 65;
        expect_refused(name, "qmatmul_swiglu with y and up overlapping", pv_qmatmul_swiglu(be, &sw),
                       PV_ERR_INVALID_ARG, "y (bytes 256 to 264) overlaps up");
        sw.up_off = 128;
        sw.w_up = other;
        sw.up = w;
        expect_refused(name, "qmatmul_swiglu writing up over w_gate", pv_qmatmul_swiglu(be, &sw), PV_ERR_INVALID_ARG,
                       "up (bytes 512 to 520) overlaps w_gate (bytes 0 to 4096)");
        sw.up = x;
        sw.y = other;
        expect_refused(name, "qmatmul_swiglu writing y over w_up", pv_qmatmul_swiglu(be, &sw), PV_ERR_INVALID_ARG,
                       "y (bytes 256 to 264) overlaps w_up (bytes 0 to 4096)");
        sw.y = x;
        sw.w_up_off = 4096 / 20 * 32;
        expect_refused(name, "qmatmul_swiglu with w_up too small", pv_qmatmul_swiglu(be, &sw), PV_ERR_INVALID_ARG,
                       "the up product (w_up into up): qmatmul: buffer w too small");
        sw.w_up = w;
        sw.w_up_off = 64;
        sw.n_in = 48;
        expect_refused(name, "qmatmul_swiglu Q4_1 with n_in 48", pv_qmatmul_swiglu(be, &sw), PV_ERR_INVALID_ARG,
                       "n_in = 48 is not a multiple of Q4_1's block");
        sw.n_in = 64;
        sw.w_type = (pv_wtype)6;
        expect_refused(name, "qmatmul_swiglu of weight type 6", pv_qmatmul_swiglu(be, &sw), PV_ERR_INVALID_ARG,
                       "qmatmul_swiglu: weight type 6 is not a known weight type");
        sw.w_type = PV_W_Q4_1;
        sw.n_tokens = (int64_t)1 << 40;
        expect_refused(name, "qmatmul_swiglu of 2^40 tokens", pv_qmatmul_swiglu(be, &sw), PV_ERR_UNSUPPORTED,
                       "n_tokens = 1099511627776 exceeds");
    } else {
        ok(0, "%s: a buffer for the qmatmul_swiglu refusals: %s", name, pv_last_error());
    }
    pv_buffer_free(other);
    pv_embed_gather_args e = {.table_type = PV_W_Q8_0, .n_rows = 4, .dim = 40, .table = w,
                              .ids = (const int32_t[]){0}, .n_ids = 1, .out = x};
    expect_refused(name, "a Q8_0 table of dim 40", pv_embed_gather(be, &e), PV_ERR_INVALID_ARG,
                   "dim = 40 is not a multiple of Q8_0's block");
    pv_buffer_free(w);
    pv_buffer_free(x);
}

static void run_backend(pv_backend *be, const char *name, uint64_t seed)
{
    uint64_t rng = seed;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const pv_wtype t = types[ti];
        if (!pv_backend_supports_weights(be, PV_OP_QMATMUL, t)) {
            tap_skip("%s: qmatmul %s is not supported by this backend", name, pv_wtype_name(t));
            continue;
        }
        uint32_t block = 1;
        pv_wtype_block(t, &block, NULL);
        /* Odd row counts everywhere; odd row lengths where the type allows
         * (unblocked types), else an odd number of blocks. */
        check_qmatmul(be, name, t, 67, block == 1 ? 37 : 160, &rng);
        /* Fewer rows than the CPU's interleaved group of 8: only its tail path. */
        check_qmatmul(be, name, t, 5, block == 1 ? 37 : 64, &rng);
        /* SmolLM2's attention shape, where the kernels' full vector paths run. */
        check_qmatmul(be, name, t, 192, 576, &rng);
        if (pv_backend_supports_weights(be, PV_OP_EMBED_GATHER, t))
            check_embed(be, name, t, &rng);
        else
            tap_skip("%s: embed_gather %s is not supported by this backend", name, pv_wtype_name(t));
        if (pv_backend_supports_weights(be, PV_OP_QMATMUL_SWIGLU, t)) {
            /* an odd row count and an odd number of blocks; SmolLM2's FFN rows */
            check_swiglu(be, name, t, 37, block == 1 ? 37 : 160, &rng);
            check_swiglu(be, name, t, 1536, 576, &rng);
        } else {
            tap_skip("%s: qmatmul_swiglu %s is not supported by this backend", name, pv_wtype_name(t));
        }
    }
    check_gemm_modes(be, name, &rng);
    check_act16(be, name, &rng);
    check_rows(be, name, &rng);
    check_passes(be, name, &rng);
    check_lanes(be, name, &rng);
    /* The block types only (the CPU runs them in one pass), and with F16 */
    check_group(be, name, (const pv_wtype[]){PV_W_Q4_1, PV_W_Q8_0, PV_W_Q4_0}, (const int64_t[]){67, 5, 192}, 3,
                &rng);
    check_group(be, name, (const pv_wtype[]){PV_W_Q4_1, PV_W_F16}, (const int64_t[]){24, 40}, 2, &rng);
    /* One weight type, as a model's Q, K and V: the GPU backends run three
     * products a launch (four: three, then one), K and V's rows beside Q's */
    check_group(be, name, (const pv_wtype[]){PV_W_Q4_0, PV_W_Q4_0, PV_W_Q4_0, PV_W_Q4_0},
                (const int64_t[]){67, 5, 192, 3}, 4, &rng);
    check_group(be, name, (const pv_wtype[]){PV_W_F16, PV_W_F16}, (const int64_t[]){24, 40}, 2, &rng);
    if (pv_backend_supports_weights(be, PV_OP_QMATMUL, PV_W_Q4_1) &&
        pv_backend_supports_weights(be, PV_OP_QMATMUL, PV_W_Q8_0) &&
        pv_backend_supports_weights(be, PV_OP_EMBED_GATHER, PV_W_Q8_0))
        check_refusals(be, name);
    else
        tap_skip("%s: the refusal checks need Q4_1 and Q8_0 weights, which this backend does not read", name);
}

static void check_opened(pv_backend *be, const char *name, void *arg)
{
    const uint64_t seed = *(const uint64_t *)arg;
    run_backend(be, name, seed);
    /* The CPU backend picks AVX2 kernels where the CPU has them; the
     * portable ones, which every other CPU runs, are checked too. */
    if (strcmp(name, "cpu") == 0 && setenv("PV_CPU_KERNELS", "portable", 1) == 0) {
        pv_backend *portable = NULL;
        if (ok(pv_backend_init(&portable, "cpu", 0) == PV_OK, "cpu opens with PV_CPU_KERNELS=portable"))
            run_backend(portable, "cpu (portable kernels)", seed);
        pv_backend_free(portable);
        unsetenv("PV_CPU_KERNELS");
    }
}

/* usage: test-backend-qmatmul [BACKEND] */
int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    uint64_t seed = 0x5eed0011;
    if (!check_each_backend(only, 0, check_opened, &seed))
        ok(0, "backend %s is built into this library", only);
    return tap_done();
}
