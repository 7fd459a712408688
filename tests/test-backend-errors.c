/* Bad input through the front end, on every backend that opens: each case
 * must return the expected status with a message naming the argument and
 * the value at fault, and must leave the output untouched. Never a crash,
 * never a silently wrong answer.
 * Usage: test-backend-errors [--backend NAME] */
#include "config.h"

#include "backend-check.h"

#include <stdio.h>

/* A small valid attention problem: 2 sequences of 40 tokens in 4 slots,
 * 2 query tokens; each case breaks one thing. */
enum { HEADS = 4, KV_HEADS = 2, HEAD_DIM = 64, CHUNK = 32, SLOTS = 4, MAX_CHUNKS = 2, TOKENS = 2 };
#define SLOT_ELEMS (2 * CHUNK * KV_HEADS * HEAD_DIM)
#define Q_ELEMS (TOKENS * HEADS * HEAD_DIM)

typedef struct fixture {
    pv_backend *be;
    tensor q, out;
    pv_buffer *pool;
    int32_t token_seq[TOKENS], token_pos[TOKENS];
    int32_t slot_table[2 * MAX_CHUNKS];
    pv_attention_args args;
} fixture;

static pv_status fixture_init(fixture *f, pv_backend *be)
{
    memset(f, 0, sizeof *f);
    f->be = be;
    static float q[Q_ELEMS];
    for (int i = 0; i < Q_ELEMS; i++)
        q[i] = (float)(i % 7) * 0.125f;
    pv_status st = tensor_init(&f->q, be, PV_MEM_DEVICE, sizeof(float), Q_ELEMS, q);
    if (st == PV_OK)
        st = tensor_init(&f->out, be, PV_MEM_DEVICE, sizeof(float), Q_ELEMS, NULL);
    if (st == PV_OK)
        st = pv_buffer_init(&f->pool, be, PV_MEM_DEVICE, (uint64_t)SLOTS * SLOT_ELEMS * sizeof(float));
    if (st != PV_OK)
        return st;
    float *pool = xmalloc((size_t)SLOTS * SLOT_ELEMS * sizeof(float));
    for (size_t i = 0; i < (size_t)SLOTS * SLOT_ELEMS; i++)
        pool[i] = (float)(i % 13) * 0.0625f;
    st = pv_buffer_write(f->pool, 0, pool, (uint64_t)SLOTS * SLOT_ELEMS * sizeof(float));
    free(pool);
    const int32_t table[2 * MAX_CHUNKS] = {2, 0, 3, 1};
    memcpy(f->slot_table, table, sizeof table);
    f->token_seq[0] = 0;
    f->token_pos[0] = 39;
    f->token_seq[1] = 1;
    f->token_pos[1] = 35;
    f->args = (pv_attention_args){
        .kv_dtype = PV_F32,
        .n_tokens = TOKENS,
        .n_heads = HEADS,
        .n_kv_heads = KV_HEADS,
        .head_dim = HEAD_DIM,
        .chunk_tokens = CHUNK,
        .scale = 0.125f,
        .q = f->q.buf,
        .q_off = f->q.off,
        .kv_pool = f->pool,
        .n_slots = SLOTS,
        .token_seq = f->token_seq,
        .token_pos = f->token_pos,
        .slot_table = f->slot_table,
        .n_seqs = 2,
        .max_chunks = MAX_CHUNKS,
        .out = f->out.buf,
        .out_off = f->out.off,
    };
    return st;
}

static void fixture_free(fixture *f)
{
    tensor_free(&f->q);
    tensor_free(&f->out);
    pv_buffer_free(f->pool);
}

/* 1 when the output region still holds only the sentinel. */
static int output_untouched(const tensor *t)
{
    size_t bytes = (size_t)(t->n * t->elem_size);
    unsigned char *data = xmalloc(bytes);
    int untouched = tensor_read(t, data) == PV_OK && guards_intact(t);
    for (size_t i = 0; untouched && i < bytes; i++)
        untouched = data[i] == SENTINEL_BYTE;
    free(data);
    return untouched;
}

/* The status is `want`, the message mentions every string in `names`
 * (NULL-terminated), and `out` (if any) was not written. */
static void expect(const char *backend, const char *what, pv_status got, pv_status want, const char *const *names,
                   const tensor *out)
{
    const char *msg = pv_last_error();
    int named = 1;
    for (const char *const *n = names; *n; n++)
        named &= strstr(msg, *n) != NULL;
    int untouched = out ? output_untouched(out) : 1;
    ok(got == want && named && untouched, "%s: %s -> %s, message names the argument%s", backend, what,
       pv_status_str(want), out ? ", output untouched" : "");
    if (got != want || !named || !untouched)
        tap_diag("got status '%s', message '%s', output %s", pv_status_str(got), msg,
                 untouched ? "untouched" : "WRITTEN");
}

#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})

static void attention_cases(const char *name, pv_backend *be)
{
    fixture f;
    if (!ok(fixture_init(&f, be) == PV_OK, "%s: error fixture allocates", name)) {
        tap_diag("%s", pv_last_error());
        fixture_free(&f);
        return;
    }
    pv_attention_args a;

    a = f.args;
    a.head_dim = 72;
    expect(name, "attention head_dim 72", pv_attention(be, &a), PV_ERR_UNSUPPORTED, NAMES("head_dim", "72"), &f.out);
    a = f.args;
    a.head_dim = 512;
    expect(name, "attention head_dim 512", pv_attention(be, &a), PV_ERR_UNSUPPORTED, NAMES("head_dim", "512"), &f.out);

    a = f.args;
    a.n_kv_heads = 3;
    expect(name, "attention n_heads 4 over n_kv_heads 3", pv_attention(be, &a), PV_ERR_INVALID_ARG,
           NAMES("n_kv_heads", "3"), &f.out);

    f.slot_table[1] = SLOTS; /* sequence 0, chunk 1: one past the pool */
    expect(name, "attention slot index = n_slots", pv_attention(be, &f.args), PV_ERR_INVALID_ARG,
           NAMES("slot_table", "4"), &f.out);
    f.slot_table[1] = -1; /* a hole inside the context */
    expect(name, "attention slot -1 inside the context", pv_attention(be, &f.args), PV_ERR_INVALID_ARG,
           NAMES("slot_table", "-1"), &f.out);
    /* Two tokens of sequence 0 (a prefill): the second reaches chunk 1,
     * which the first did not need, and finds a hole there. */
    f.token_seq[1] = 0;
    f.token_pos[0] = 5;
    f.token_pos[1] = 38;
    expect(name, "attention: a later token of a sequence reaching a hole its first did not", pv_attention(be, &f.args),
           PV_ERR_INVALID_ARG, NAMES("slot_table[0][1] = -1", "token 1 at position 38"), &f.out);
    f.token_seq[1] = 1;
    f.token_pos[0] = 39;
    f.token_pos[1] = 35;
    f.slot_table[1] = 0;

    f.token_seq[1] = 2;
    expect(name, "attention token_seq 2 of 2 sequences", pv_attention(be, &f.args), PV_ERR_INVALID_ARG,
           NAMES("token_seq", "2"), &f.out);
    f.token_seq[1] = 1;
    f.token_pos[0] = MAX_CHUNKS * CHUNK;
    expect(name, "attention token_pos past max_chunks x chunk_tokens", pv_attention(be, &f.args),
           PV_ERR_INVALID_ARG, NAMES("token_pos", "64"), &f.out);
    f.token_pos[0] = 39;

    /* A pool one element short of n_slots slots. */
    pv_buffer *small_pool = NULL;
    if (pv_buffer_init(&small_pool, be, PV_MEM_DEVICE, ((uint64_t)SLOTS * SLOT_ELEMS - 1) * sizeof(float)) == PV_OK) {
        a = f.args;
        a.kv_pool = small_pool;
        expect(name, "attention kv_pool too small", pv_attention(be, &a), PV_ERR_INVALID_ARG, NAMES("kv_pool"),
               &f.out);
    }
    pv_buffer_free(small_pool);

    a = f.args;
    a.out_off = f.out.off + 1 + f.out.n + GUARD_BYTES / sizeof(float) - Q_ELEMS; /* one element past the end */
    expect(name, "attention out too small for its offset", pv_attention(be, &a), PV_ERR_INVALID_ARG,
           NAMES("buffer out"), &f.out);
    a = f.args;
    a.out = NULL;
    expect(name, "attention out NULL", pv_attention(be, &a), PV_ERR_INVALID_ARG, NAMES("buffer out"), &f.out);

    /* Absurd shapes whose element counts pass 2^64: a wrapped product
     * would pass the size check and send the kernel outside the pool. The
     * slot indices stay small, so a backend that accepted them would run. */
    a = f.args;
    a.n_slots = (int64_t)1 << 51; /* x 8192 elements per slot = 2^64 */
    expect(name, "attention n_slots 2^51 (pool elements past 2^64)", pv_attention(be, &a), PV_ERR_INVALID_ARG,
           NAMES("kv_pool", "n_slots x 2 x chunk_tokens", "2251799813685248"), &f.out);

    /* The unbroken fixture runs: the cases above failed for their reason. */
    ok(pv_attention(be, &f.args) == PV_OK && !output_untouched(&f.out), "%s: the valid fixture runs and writes out",
       name);

    pv_kv_write_args w = {
        .kv_dtype = PV_F32,
        .n_tokens = 1,
        .n_kv_heads = KV_HEADS,
        .head_dim = HEAD_DIM,
        .chunk_tokens = CHUNK,
        .k = f.q.buf,
        .k_off = f.q.off,
        .v = f.q.buf,
        .v_off = f.q.off,
        .kv_pool = f.pool,
        .n_slots = SLOTS,
        .token_seq = f.token_seq,
        .token_pos = f.token_pos,
        .slot_table = f.slot_table,
        .n_seqs = 2,
        .max_chunks = MAX_CHUNKS,
    };
    f.slot_table[1] = 9;
    expect(name, "kv_write slot 9 of 4", pv_kv_write(be, &w), PV_ERR_INVALID_ARG, NAMES("slot_table", "9"), NULL);
    f.slot_table[1] = 0;

    /* Two rows for one (sequence, position): which lands would be a race. */
    w.n_tokens = 2;
    f.token_seq[1] = 0;
    f.token_pos[1] = 39;
    expect(name, "kv_write two rows for sequence 0 position 39", pv_kv_write(be, &w), PV_ERR_INVALID_ARG,
           NAMES("rows 0 and 1", "sequence 0", "position 39"), NULL);
    f.token_pos[1] = 38;
    ok(pv_kv_write(be, &w) == PV_OK, "%s: kv_write of two positions of one sequence runs", name);

    /* The pool of the absurd shape above. */
    w.n_slots = (int64_t)1 << 51;
    expect(name, "kv_write n_slots 2^51 (pool elements past 2^64)", pv_kv_write(be, &w), PV_ERR_INVALID_ARG,
           NAMES("kv_pool", "n_slots x 2 x chunk_tokens", "2251799813685248"), NULL);
    fixture_free(&f);
}

/* kv_write of many rows with one repeat at the end: found by a sort, not
 * by comparing every pair (2^34 pairs would take minutes). */
static void many_rows_case(const char *name, pv_backend *be)
{
    enum { ROWS = 1 << 18, CHUNK_T = 32, CHUNKS = ROWS / CHUNK_T };
    int32_t *seq = xmalloc(ROWS * sizeof *seq), *pos = xmalloc(ROWS * sizeof *pos);
    int32_t *table = xmalloc(CHUNKS * sizeof *table);
    for (int32_t i = 0; i < ROWS; i++) {
        seq[i] = 0;
        pos[i] = ROWS - 1 - i;
    }
    for (int32_t c = 0; c < CHUNKS; c++)
        table[c] = c;
    pv_buffer *rows = NULL, *pool = NULL;
    pv_status st = pv_buffer_init(&rows, be, PV_MEM_DEVICE, (uint64_t)ROWS * sizeof(float));
    if (st == PV_OK)
        st = pv_buffer_init(&pool, be, PV_MEM_DEVICE, (uint64_t)2 * ROWS * sizeof(float));
    if (!ok(st == PV_OK, "%s: buffers for %d rows allocate", name, ROWS)) {
        tap_diag("%s", pv_last_error());
    } else {
        pv_kv_write_args w = {
            .kv_dtype = PV_F32, .n_tokens = ROWS, .n_kv_heads = 1, .head_dim = 1, .chunk_tokens = CHUNK_T,
            .k = rows, .v = rows, .kv_pool = pool, .n_slots = CHUNKS, .token_seq = seq, .token_pos = pos,
            .slot_table = table, .n_seqs = 1, .max_chunks = CHUNKS,
        };
        ok(pv_kv_write(be, &w) == PV_OK, "%s: kv_write of %d distinct rows runs", name, ROWS);
        pos[ROWS - 1] = 12345; /* row ROWS - 1 - 12345 already writes position 12345 */
        expect(name, "kv_write of 2^18 rows, the last repeating position 12345", pv_kv_write(be, &w),
               PV_ERR_INVALID_ARG, NAMES("position 12345", "rows 249798 and 262143"), NULL);
    }
    pv_buffer_free(rows);
    pv_buffer_free(pool);
    free(seq);
    free(pos);
    free(table);
}

static void other_op_cases(const char *name, pv_backend *be)
{
    tensor x, out;
    float data[64];
    for (int i = 0; i < 64; i++)
        data[i] = (float)i;
    if (tensor_init(&x, be, PV_MEM_DEVICE, sizeof(float), 64, data) != PV_OK ||
        tensor_init(&out, be, PV_MEM_DEVICE, sizeof(float), 64, NULL) != PV_OK) {
        ok(0, "%s: buffers allocate: %s", name, pv_last_error());
        return;
    }

    int32_t slots[2] = {1, 4};
    pv_slot_copy_args sc = {
        .dtype = PV_F32, .slot_elems = 16, .pool = x.buf, .n_slots = 4, .staging = out.buf,
        .staging_off = out.off, .slots = slots, .n_slots_moved = 2,
    };
    expect(name, "slot_gather slots[1] = 4 of 4", pv_slot_gather(be, &sc), PV_ERR_INVALID_ARG,
           NAMES("slots[1]", "4"), &out);
    slots[1] = 1;
    sc.pool = out.buf;
    sc.staging = x.buf;
    sc.staging_off = x.off;
    expect(name, "slot_scatter slot 1 twice", pv_slot_scatter(be, &sc), PV_ERR_INVALID_ARG, NAMES("slots", "1"), &out);

    int32_t ids[3] = {0, 7, 8};
    pv_embed_gather_args eg = {
        .table_type = PV_W_F32, .n_rows = 8, .dim = 8, .table = x.buf, .table_off = x.off,
        .ids = ids, .n_ids = 3, .out = out.buf, .out_off = out.off,
    };
    expect(name, "embed_gather ids[2] = 8 of 8 rows", pv_embed_gather(be, &eg), PV_ERR_INVALID_ARG,
           NAMES("ids[2]", "8"), &out);

    pv_gemm_args g = {
        .dtype = PV_F32, .m = 8, .n = 8, .k = 8, .alpha = 1.0f,
        .a = x.buf, .a_off = x.off, .lda = 4, .b = x.buf, .b_off = x.off, .ldb = 8,
        .c = out.buf, .c_off = out.off, .ldc = 8,
    };
    expect(name, "gemm lda 4 < k 8", pv_gemm(be, &g), PV_ERR_INVALID_ARG, NAMES("lda", "4"), &out);
    g.lda = 8;
    g.ldc = 9; /* C spans 7 * 9 + 8 = 71 elements from out's offset */
    g.c_off = out.buf->bytes / sizeof(float) - 70;
    expect(name, "gemm C past the end of its buffer", pv_gemm(be, &g), PV_ERR_INVALID_ARG, NAMES("buffer c"), &out);
    if (!pv_backend_supports(be, PV_OP_GEMM, PV_F16)) {
        g.ldc = 8;
        g.c_off = out.off;
        g.dtype = PV_F16;
        expect(name, "gemm f16 unsupported", pv_gemm(be, &g), PV_ERR_UNSUPPORTED, NAMES("f16"), &out);
    }

    pv_rmsnorm_args rn = {
        .rows = 2, .dim = 32, .eps = 1e-5f, .x = x.buf, .x_off = x.off, .weight = x.buf,
        .weight_off = x.buf->bytes / sizeof(float) - 31, /* dim 32: one past the end */ .out = out.buf, .out_off = out.off,
    };
    expect(name, "rmsnorm weight past the buffer", pv_rmsnorm(be, &rn), PV_ERR_INVALID_ARG, NAMES("weight"), &out);

    int32_t pos[2] = {0, -5};
    pv_rope_args rp = {.n_tokens = 2, .n_heads = 1, .head_dim = 32, .base = 10000.0f,
                       .x = out.buf, .x_off = out.off, .pos = pos};
    expect(name, "rope pos[1] = -5", pv_rope(be, &rp), PV_ERR_INVALID_ARG, NAMES("pos[1]", "-5"), &out);

    float u[2] = {0.5f, 0.25f};
    int32_t picked[2] = {-1, -1};
    pv_sample_args sa = {.rows = 2, .cols = 32, .temperature = 1.0f, .top_p = 1.5f,
                         .logits = x.buf, .logits_off = x.off, .u = u, .out = picked};
    expect(name, "sample_top_p top_p 1.5", pv_sample_top_p(be, &sa), PV_ERR_INVALID_ARG, NAMES("top_p", "1.5"), NULL);
    sa.top_p = 0.9f;
    u[1] = 1.0f;
    expect(name, "sample_top_p u[1] = 1", pv_sample_top_p(be, &sa), PV_ERR_INVALID_ARG, NAMES("u[1]"), NULL);
    ok(picked[0] == -1 && picked[1] == -1, "%s: rejected sampling wrote no token", name);

    /* Absurd shapes: every element count past 2^64 is named, never wrapped. */
    int32_t zeros[16] = {0};
    pv_rope_args huge_rope = {.n_tokens = 16, .n_heads = 1 << 30, .head_dim = 1 << 30, .base = 10000.0f,
                              .x = out.buf, .x_off = out.off, .pos = zeros}; /* 2^4 x 2^30 x 2^30 = 2^64 */
    expect(name, "rope 16 tokens x 2^30 heads x head_dim 2^30", pv_rope(be, &huge_rope), PV_ERR_INVALID_ARG,
           NAMES("n_tokens x n_heads x head_dim", "1073741824"), &out);
    pv_embed_gather_args huge_embed = {.table_type = PV_W_F32, .n_rows = 1, .dim = (int64_t)1 << 62,
                                       .table = x.buf, .table_off = x.off, .ids = zeros, .n_ids = 4,
                                       .out = out.buf, .out_off = out.off};
    expect(name, "embed_gather 4 ids x dim 2^62", pv_embed_gather(be, &huge_embed), PV_ERR_INVALID_ARG,
           NAMES("n_ids x dim", "4611686018427387904"), &out);
    pv_softmax_args huge_softmax = {.rows = (int64_t)1 << 33, .cols = (int64_t)1 << 31, .scale = 1.0f,
                                    .x = x.buf, .x_off = x.off, .out = out.buf, .out_off = out.off};
    expect(name, "softmax 2^33 rows x 2^31 cols", pv_softmax(be, &huge_softmax), PV_ERR_INVALID_ARG,
           NAMES("rows x cols", "8589934592"), &out);
    pv_rmsnorm_args huge_norm = rn;
    huge_norm.rows = (int64_t)1 << 40;
    huge_norm.dim = (int64_t)1 << 24;
    expect(name, "rmsnorm 2^40 rows x dim 2^24", pv_rmsnorm(be, &huge_norm), PV_ERR_INVALID_ARG,
           NAMES("rows x dim", "1099511627776"), &out);
    pv_argmax_args huge_argmax = {.rows = (int64_t)1 << 40, .cols = 1 << 24, .x = x.buf, .x_off = x.off,
                                  .out = picked};
    expect(name, "argmax 2^40 rows x 2^24 cols", pv_argmax(be, &huge_argmax), PV_ERR_INVALID_ARG,
           NAMES("rows x cols", "1099511627776"), NULL);
    sc.n_slots = (int64_t)1 << 40;
    sc.slot_elems = (int64_t)1 << 24;
    slots[1] = 2;
    expect(name, "slot_gather 2^40 slots x 2^24 elements", pv_slot_gather(be, &sc), PV_ERR_INVALID_ARG,
           NAMES("n_slots x slot_elems", "1099511627776"), &out);

    unsigned char bytes[16];
    expect(name, "buffer_read past the end", pv_buffer_read(x.buf, x.buf->bytes - 8, bytes, 16), PV_ERR_INVALID_ARG,
           NAMES("src"), NULL);

    tensor_free(&x);
    tensor_free(&out);
}

/* The fused ops: their shapes, their indices, and the aliasing that would
 * let a kernel read what it has already overwritten. */
static void fused_op_cases(const char *name, pv_backend *be)
{
    tensor x, y, out;
    float data[256];
    for (int i = 0; i < 256; i++)
        data[i] = (float)(i % 17) * 0.25f;
    memset(&y, 0, sizeof y);
    memset(&out, 0, sizeof out);
    if (tensor_init(&x, be, PV_MEM_DEVICE, sizeof(float), 256, data) != PV_OK ||
        tensor_init(&y, be, PV_MEM_DEVICE, sizeof(float), 256, data) != PV_OK ||
        tensor_init(&out, be, PV_MEM_DEVICE, sizeof(float), 256, NULL) != PV_OK) {
        ok(0, "%s: buffers allocate: %s", name, pv_last_error());
        tensor_free(&x);
        tensor_free(&y);
        return;
    }
    pv_add_rmsnorm_args an = {.rows = 4, .dim = 64, .eps = 1e-5f, .x = x.buf, .x_off = x.off, .y = y.buf,
                              .y_off = y.off, .weight = y.buf, .weight_off = y.off, .out = out.buf,
                              .out_off = out.off};
    an.eps = -1.0f;
    expect(name, "add_rmsnorm eps -1", pv_add_rmsnorm(be, &an), PV_ERR_INVALID_ARG, NAMES("eps", "-1"), &out);
    an.eps = 1e-5f;
    an.out = x.buf;
    an.out_off = x.off + 8;
    expect(name, "add_rmsnorm out overlapping x", pv_add_rmsnorm(be, &an), PV_ERR_INVALID_ARG,
           NAMES("x (bytes", "overlaps out"), &out);
    an.out = out.buf;
    an.out_off = out.off;
    an.weight = out.buf;
    an.weight_off = out.off + 300;
    expect(name, "add_rmsnorm weight past its buffer", pv_add_rmsnorm(be, &an), PV_ERR_INVALID_ARG,
           NAMES("buffer weight too small"), &out);
    an.weight_off = out.off + 100;
    expect(name, "add_rmsnorm writing out over weight", pv_add_rmsnorm(be, &an), PV_ERR_INVALID_ARG,
           NAMES("out (bytes", "overlaps weight"), NULL);
    an.weight = y.buf;
    an.weight_off = y.off;
    an.rows = (int64_t)1 << 40;
    an.dim = (int64_t)1 << 24;
    expect(name, "add_rmsnorm 2^40 rows x dim 2^24", pv_add_rmsnorm(be, &an), PV_ERR_INVALID_ARG,
           NAMES("rows x dim", "1099511627776"), &out);

    /* rope_kv_write: 2 tokens of one sequence, 1 KV head of 16 in chunks of
     * 4, into a pool of 2 slots (256 floats) held by out. */
    int32_t seq[2] = {0, 0}, pos[2] = {1, 6}, table[2] = {1, 0};
    pv_rope_kv_write_args rk = {
        .kv_dtype = PV_F32, .n_tokens = 2, .n_heads = 2, .n_kv_heads = 1, .head_dim = 16, .chunk_tokens = 4,
        .base = 10000.0f, .q = x.buf, .q_off = x.off, .k = y.buf, .k_off = y.off, .v = y.buf, .v_off = y.off + 32,
        .kv_pool = out.buf, .n_slots = 2, .token_seq = seq, .token_pos = pos, .slot_table = table, .n_seqs = 1,
        .max_chunks = 2,
    };
    rk.head_dim = 15;
    expect(name, "rope_kv_write head_dim 15", pv_rope_kv_write(be, &rk), PV_ERR_INVALID_ARG,
           NAMES("head_dim = 15", "even"), &out);
    rk.head_dim = 16;
    pos[1] = 8;
    expect(name, "rope_kv_write token_pos[1] = 8 of 2 chunks of 4", pv_rope_kv_write(be, &rk), PV_ERR_INVALID_ARG,
           NAMES("token_pos[1]", "8"), &out);
    pos[1] = 1;
    expect(name, "rope_kv_write two rows for position 1", pv_rope_kv_write(be, &rk), PV_ERR_INVALID_ARG,
           NAMES("rope_kv_write", "position 1"), &out);
    pos[1] = 6;
    rk.k = x.buf;
    rk.k_off = x.off + 40;
    expect(name, "rope_kv_write q overlapping k", pv_rope_kv_write(be, &rk), PV_ERR_INVALID_ARG,
           NAMES("q (bytes", "overlaps k"), &out);
    rk.k = y.buf;
    rk.k_off = y.off;
    rk.v = out.buf;
    rk.v_off = out.off;
    expect(name, "rope_kv_write v inside the pool", pv_rope_kv_write(be, &rk), PV_ERR_INVALID_ARG,
           NAMES("v (bytes", "overlaps kv_pool"), NULL);
    rk.v = y.buf;
    rk.v_off = y.off + 32;
    rk.kv_dtype = PV_F16;
    rk.n_slots = (int64_t)1 << 40;
    rk.chunk_tokens = 1 << 20;
    rk.n_kv_heads = 1 << 10;
    expect(name, "rope_kv_write a pool of 2^40 slots x 2 x 2^20 x 2^10 x 16", pv_rope_kv_write(be, &rk),
           PV_ERR_INVALID_ARG, NAMES("n_slots x 2 x chunk_tokens x n_kv_heads x head_dim", "1099511627776"), &out);
    tensor_free(&x);
    tensor_free(&y);
    tensor_free(&out);
}

/* Advice is only advice: a buffer advised as streamed (small, and large
 * enough for the CPU backend's 2 MiB pages) keeps what is written to it. */
/* The ops that take a step's host work in one call: slot_transfer and
 * sample_batch. */
static void batch_op_cases(const char *name, pv_backend *be)
{
    tensor dev, host;
    float data[64];
    for (int i = 0; i < 64; i++)
        data[i] = (float)i;
    if (tensor_init(&dev, be, PV_MEM_DEVICE, sizeof(float), 64, NULL) != PV_OK ||
        tensor_init(&host, be, PV_MEM_HOST, sizeof(float), 64, data) != PV_OK) {
        ok(0, "%s: buffers allocate: %s", name, pv_last_error());
        return;
    }
    /* 4 slots of 16 f32 in each pool (the guard bytes before them too). */
    int32_t to[2] = {0, 3}, from[2] = {1, 2};
    pv_slot_transfer_args t = {.dtype = PV_F32, .slot_elems = 16, .dst = dev.buf, .dst_n_slots = 4,
                               .src = host.buf, .src_n_slots = 4, .dst_slots = to, .src_slots = from, .n = 2};
    pv_event *done = (pv_event *)&t; /* must come back NULL */
    to[1] = 4;
    expect(name, "slot_transfer dst_slots[1] = 4 of 4", pv_slot_transfer(be, &t, NULL, &done), PV_ERR_INVALID_ARG,
           NAMES("dst_slots[1]", "4"), &dev);
    ok(done == NULL, "%s: a refused slot_transfer hands back no event", name);
    to[1] = 3;
    from[0] = -1;
    expect(name, "slot_transfer src_slots[0] = -1", pv_slot_transfer(be, &t, NULL, NULL), PV_ERR_INVALID_ARG,
           NAMES("src_slots[0]", "-1"), &dev);
    from[0] = 1;
    to[1] = 0;
    expect(name, "slot_transfer writing slot 0 twice", pv_slot_transfer(be, &t, NULL, NULL), PV_ERR_INVALID_ARG,
           NAMES("dst_slots", "0"), &dev);
    to[1] = 3;
    t.src_n_slots = 40; /* 640 floats: past the host buffer */
    expect(name, "slot_transfer src of 40 slots of 16 in a buffer of 192 floats", pv_slot_transfer(be, &t, NULL, NULL),
           PV_ERR_INVALID_ARG, NAMES("buffer src"), &dev);
    t.src_n_slots = 4;
    t.src = dev.buf;
    expect(name, "slot_transfer from a buffer to itself", pv_slot_transfer(be, &t, NULL, NULL), PV_ERR_INVALID_ARG,
           NAMES("same buffer"), &dev);
    t.src = host.buf;
    t.dtype = PV_F16;
    t.slot_elems = 3;
    expect(name, "slot_transfer slots of 3 f16 (6 bytes)", pv_slot_transfer(be, &t, NULL, NULL), PV_ERR_INVALID_ARG,
           NAMES("3 f16", "4-byte words"), &dev);
    t.dtype = PV_F32;
    t.slot_elems = (int64_t)1 << 40;
    t.dst_n_slots = (int64_t)1 << 30;
    expect(name, "slot_transfer 2^30 slots x 2^40 elements", pv_slot_transfer(be, &t, NULL, NULL), PV_ERR_INVALID_ARG,
           NAMES("dst_n_slots x slot_elems"), &dev);

    float temperature[3] = {0.0f, 0.8f, -1.0f}, top_p[3] = {0.0f, 0.9f, 0.0f}, u[3] = {2.0f, 0.5f, 7.0f};
    int32_t picked[3] = {-1, -1, -1};
    pv_sample_batch_args sb = {.rows = 3, .cols = 16, .logits = host.buf, .logits_off = host.off,
                               .temperature = temperature, .top_p = top_p, .u = u, .out = picked};
    top_p[1] = 0.0f;
    expect(name, "sample_batch top_p[1] = 0 (a sampled row)", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("top_p[1]", "0"), NULL);
    top_p[1] = 0.9f;
    u[1] = 1.0f;
    expect(name, "sample_batch u[1] = 1 (a sampled row)", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("u[1]", "1"), NULL);
    u[1] = 0.5f;
    temperature[2] = NAN;
    expect(name, "sample_batch temperature[2] NaN", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("temperature[2]", "NaN"), NULL);
    temperature[2] = -1.0f;
    sb.cols = 64; /* 3 x 64 floats from offset 64 of a buffer of 192 */
    expect(name, "sample_batch logits 3 x 64 past the buffer", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("logits"), NULL);
    sb.cols = 16;
    sb.top_p = NULL;
    expect(name, "sample_batch top_p NULL", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG, NAMES("top_p"), NULL);
    ok(picked[0] == -1 && picked[1] == -1 && picked[2] == -1, "%s: rejected batch sampling wrote no token", name);
    /* Greedy rows read neither top_p nor u: these pass as they are. */
    sb.top_p = top_p;
    pv_status st = pv_sample_batch(be, &sb);
    ok(st == PV_OK && picked[0] == 15 && picked[2] == 15,
       "%s: greedy rows with top_p 0 and u out of range are fine (%s; picked %d and %d of 0..15)", name,
       st == PV_OK ? "ok" : pv_last_error(), picked[0], picked[2]);
    tensor_free(&dev);
    tensor_free(&host);
}

/* sample_batch into the device and with a logit bias, and embed_gather
 * of device ids: each argument the front end checks, refused with its
 * value and limit named, the output untouched. */
static void device_sample_cases(const char *name, pv_backend *be)
{
    float data[64]; /* 4 rows of 16: row r is c + r / 4 */
    for (int i = 0; i < 64; i++)
        data[i] = (float)(i % 16) + 0.25f * (float)(i / 16);
    tensor logits, tokens, out;
    pv_buffer *ids_dev = NULL;
    const int32_t dev_ids[4] = {3, 1, 2, 0};
    if (tensor_init(&logits, be, PV_MEM_DEVICE, sizeof(float), 64, data) != PV_OK ||
        tensor_init(&tokens, be, PV_MEM_DEVICE, sizeof(int32_t), 4, NULL) != PV_OK ||
        tensor_init(&out, be, PV_MEM_DEVICE, sizeof(float), 3 * 16, NULL) != PV_OK ||
        pv_buffer_init(&ids_dev, be, PV_MEM_DEVICE, sizeof dev_ids) != PV_OK ||
        pv_buffer_write(ids_dev, 0, dev_ids, sizeof dev_ids) != PV_OK) {
        ok(0, "%s: buffers allocate: %s", name, pv_last_error());
        return;
    }
    /* 4 rows of 16: greedy, sampled, greedy, sampled. */
    float temperature[4] = {0.0f, 0.8f, 0.0f, 1.0f}, top_p[4] = {0.0f, 0.9f, 0.0f, 1.0f}, u[4] = {0, 0.5f, 0, 0.25f};
    int32_t picked[4] = {-1, -1, -1, -1};
    pv_sample_batch_args sb = {.rows = 4, .cols = 16, .logits = logits.buf, .logits_off = logits.off,
                               .temperature = temperature, .top_p = top_p, .u = u, .out_dev = tokens.buf,
                               .out_dev_off = tokens.off};
    sb.out = picked;
    expect(name, "sample_batch with both out and out_dev", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("out", "out_dev", "both"), &tokens);
    sb.out = NULL;
    sb.out_dev = NULL;
    expect(name, "sample_batch with neither out nor out_dev", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("out", "out_dev", "neither"), &tokens);
    sb.out_dev = tokens.buf;
    sb.out_dev_off = tokens.buf->bytes / 4 - 3;
    expect(name, "sample_batch 4 tokens from the last 3 elements of out_dev", pv_sample_batch(be, &sb),
           PV_ERR_INVALID_ARG, NAMES("out_dev", "too small"), &tokens);
    sb.out_dev_off = UINT64_MAX - 1; /* (off + rows) * 4 wraps */
    expect(name, "sample_batch out_dev_off 2^64 - 2", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("out_dev", "18446744073709551614"), &tokens);
    sb.out_dev = logits.buf;
    sb.out_dev_off = logits.off + 60;
    expect(name, "sample_batch out_dev over the last logits", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("out_dev", "overlaps", "logits"), &tokens);
    sb.out_dev = tokens.buf;
    sb.out_dev_off = tokens.off;

    /* The bias: row 1 has tokens 5 and 9, row 3 token 5 (a token may recur in another row). */
    int32_t start[5] = {0, 0, 2, 2, 3}, token[3] = {5, 9, 5};
    float value[3] = {1.5f, -2.0f, PV_LOGIT_BIAS_BAN};
    sb.bias_start = start;
    sb.bias_token = token;
    sb.bias_value = value;
    start[0] = 1;
    expect(name, "sample_batch bias_start[0] = 1", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("bias_start[0]", "1"), &tokens);
    start[0] = 0;
    start[3] = 1;
    expect(name, "sample_batch bias_start[3] = 1 below bias_start[2] = 2", pv_sample_batch(be, &sb),
           PV_ERR_INVALID_ARG, NAMES("bias_start[3] = 1", "bias_start[2] = 2"), &tokens);
    start[3] = 2;
    start[4] = PV_LOGIT_BIAS_MAX + 1;
    expect(name, "sample_batch 2^20 + 1 bias entries", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("bias_start[4]", "1048577", "1048576"), &tokens);
    start[4] = 3;
    token[1] = 16;
    expect(name, "sample_batch bias_token[1] = 16 of 16 columns", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("bias_token[1] = 16", "row 1", "16)"), &tokens);
    token[1] = -3;
    expect(name, "sample_batch bias_token[1] = -3", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("bias_token[1] = -3"), &tokens);
    token[1] = 9;
    value[2] = NAN;
    expect(name, "sample_batch bias_value[2] NaN", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("bias_value[2]", "nan", "not finite"), &tokens);
    value[2] = -INFINITY;
    expect(name, "sample_batch bias_value[2] -inf", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("bias_value[2]", "inf", "not finite"), &tokens);
    value[2] = PV_LOGIT_BIAS_BAN;
    token[1] = 5;
    expect(name, "sample_batch row 1 biasing token 5 twice", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("row 1", "token 5 twice", "bias_token[0]", "bias_token[1]"), &tokens);
    token[1] = 9;
    sb.bias_token = NULL;
    expect(name, "sample_batch bias_token NULL with 3 entries", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("bias_token", "NULL"), &tokens);
    sb.bias_token = token;
    sb.bias_value = NULL;
    expect(name, "sample_batch bias_value NULL with 3 entries", pv_sample_batch(be, &sb), PV_ERR_INVALID_ARG,
           NAMES("bias_value", "NULL"), &tokens);
    sb.bias_value = value;
    /* Row 2 bans all 16 of its tokens. */
    int32_t ban_start[5] = {0, 0, 0, 16, 16}, ban_token[16];
    float ban_value[16];
    for (int i = 0; i < 16; i++) {
        ban_token[i] = 15 - i;
        ban_value[i] = i == 7 ? -1e30f : PV_LOGIT_BIAS_BAN;
    }
    pv_sample_batch_args all_banned = sb;
    all_banned.bias_start = ban_start;
    all_banned.bias_token = ban_token;
    all_banned.bias_value = ban_value;
    expect(name, "sample_batch row 2 banning all 16 tokens", pv_sample_batch(be, &all_banned), PV_ERR_INVALID_ARG,
           NAMES("row 2", "all its 16 tokens"), &tokens);
    ban_value[7] = -99.0f; /* one token left: fine, and it is the one picked */
    pv_status st = pv_sample_batch(be, &all_banned);
    int32_t got[4] = {-1, -1, -1, -1};
    if (st == PV_OK)
        st = pv_buffer_read(tokens.buf, tokens.off * 4, got, sizeof got);
    ok(st == PV_OK && got[2] == 8, "%s: a row with one token not banned picks it (%s; picked %d, want 8)", name,
       st == PV_OK ? "ok" : pv_last_error(), got[2]);
    st = pv_sample_batch(be, &sb);
    ok(st == PV_OK, "%s: one token biased in two rows, a ban among them, is fine (%s)", name,
       st == PV_OK ? "ok" : pv_last_error());

    /* embed_gather of device ids: 3 ids into out, the table the logits (4 rows of 16). */
    int32_t ids[3] = {2, -1, -4};
    pv_embed_gather_args eg = {.table_type = PV_W_F32, .n_rows = 4, .dim = 16, .table = logits.buf,
                               .table_off = logits.off, .ids = ids, .n_ids = 3, .out = out.buf, .out_off = out.off,
                               .ids_dev = ids_dev, .n_ids_dev = 4};
    ids[2] = -5;
    expect(name, "embed_gather ids[2] = -5 with 4 device ids", pv_embed_gather(be, &eg), PV_ERR_INVALID_ARG,
           NAMES("ids[2] = -5", "device id 4", "n_ids_dev = 4"), &out);
    ids[2] = -4;
    eg.ids_dev = NULL;
    eg.n_ids_dev = 0;
    expect(name, "embed_gather ids[1] = -1 without ids_dev", pv_embed_gather(be, &eg), PV_ERR_INVALID_ARG,
           NAMES("ids[1] = -1", "device id 0", "ids_dev is NULL"), &out);
    eg.n_ids_dev = 4;
    expect(name, "embed_gather n_ids_dev = 4 without ids_dev", pv_embed_gather(be, &eg), PV_ERR_INVALID_ARG,
           NAMES("n_ids_dev = 4", "without ids_dev"), &out);
    eg.ids_dev = ids_dev;
    eg.n_ids_dev = -2;
    expect(name, "embed_gather n_ids_dev = -2", pv_embed_gather(be, &eg), PV_ERR_INVALID_ARG,
           NAMES("n_ids_dev = -2"), &out);
    eg.n_ids_dev = 5;
    expect(name, "embed_gather 5 device ids in a buffer of 4", pv_embed_gather(be, &eg), PV_ERR_INVALID_ARG,
           NAMES("ids_dev", "too small", "16 bytes"), &out);
    eg.n_ids_dev = 4;
    eg.ids_dev_off = UINT64_MAX - 2;
    expect(name, "embed_gather ids_dev_off 2^64 - 3", pv_embed_gather(be, &eg), PV_ERR_INVALID_ARG,
           NAMES("ids_dev", "18446744073709551613"), &out);
    eg.ids_dev = out.buf;
    eg.ids_dev_off = out.off + 40;
    expect(name, "embed_gather ids_dev inside out", pv_embed_gather(be, &eg), PV_ERR_INVALID_ARG,
           NAMES("out", "overlaps", "ids_dev"), &out);
    eg.ids_dev = ids_dev;
    eg.ids_dev_off = 0;
    st = pv_embed_gather(be, &eg);
    float rows[3 * 16];
    if (st == PV_OK)
        st = tensor_read(&out, rows);
    ok(st == PV_OK && rows[0] == 0.5f && rows[16] == 0.75f && rows[32] == 0.0f,
       "%s: embed_gather of ids 2, -1 and -4 takes rows 2, 3 (device id 0) and 0 (device id 3) (%s)", name,
       st == PV_OK ? "ok" : pv_last_error());
    tensor_free(&logits);
    tensor_free(&tokens);
    tensor_free(&out);
    pv_buffer_free(ids_dev);
}

static void streamed_advice_case(const char *name, pv_backend *be)
{
    static const uint64_t sizes[] = {4096, (uint64_t)12 << 20};
    for (int i = 0; i < 2; i++) {
        pv_buffer *buf = NULL;
        const uint64_t n = sizes[i] / sizeof(uint32_t);
        uint32_t *data = malloc(sizes[i]), *back = malloc(sizes[i]);
        pv_status st = data && back ? pv_buffer_init(&buf, be, PV_MEM_DEVICE, sizes[i]) : PV_ERR_OUT_OF_MEMORY;
        if (st == PV_OK)
            st = pv_buffer_advise_streamed(buf);
        for (uint64_t k = 0; data && k < n; k++)
            data[k] = (uint32_t)(k * 2654435761u);
        if (st == PV_OK)
            st = pv_buffer_write(buf, 0, data, sizes[i]);
        if (st == PV_OK)
            st = pv_buffer_read(buf, 0, back, sizes[i]);
        ok(st == PV_OK && memcmp(data, back, sizes[i]) == 0,
           "%s: a buffer of %llu bytes advised as streamed keeps its contents (%s)", name,
           (unsigned long long)sizes[i], st == PV_OK ? "ok" : pv_last_error());
        pv_buffer_free(buf);
        free(data);
        free(back);
    }
}

/* pv_weights_write checks the matrix against the buffer before a backend
 * reorders a byte of it. */
static void weights_write_cases(const char *name, pv_backend *be)
{
    pv_buffer *buf = NULL;
    if (!ok(pv_buffer_init(&buf, be, PV_MEM_DEVICE, 4096) == PV_OK, "%s: a buffer for pv_weights_write", name))
        return;
    static uint8_t src[4096];
    expect(name, "weights into a NULL buffer", pv_weights_write(NULL, 0, PV_W_Q4_1, 8, 32, src), PV_ERR_INVALID_ARG,
           NAMES("dst", "NULL"), NULL);
    expect(name, "weights from NULL", pv_weights_write(buf, 0, PV_W_Q4_1, 8, 32, NULL), PV_ERR_INVALID_ARG,
           NAMES("src", "NULL"), NULL);
    expect(name, "weight type 6", pv_weights_write(buf, 0, (pv_wtype)6, 8, 32, src), PV_ERR_INVALID_ARG,
           NAMES("weight type 6"), NULL);
    expect(name, "Q4_1 rows of 48", pv_weights_write(buf, 0, PV_W_Q4_1, 8, 48, src), PV_ERR_INVALID_ARG,
           NAMES("8 x 48", "multiple of 32"), NULL);
    expect(name, "0 rows", pv_weights_write(buf, 0, PV_W_Q8_0, 0, 32, src), PV_ERR_INVALID_ARG, NAMES("0 x 32"),
           NULL);
    expect(name, "2^62 x 2^20 Q8_0", pv_weights_write(buf, 0, PV_W_Q8_0, (int64_t)1 << 62, 1 << 20, src),
           PV_ERR_INVALID_ARG, NAMES("4611686018427387904 x 1048576", "more than"), NULL);
    /* 205 Q4_1 rows of 32: 4100 bytes, 4 more than the buffer */
    expect(name, "4100 bytes of weights in 4096", pv_weights_write(buf, 0, PV_W_Q4_1, 205, 32, src),
           PV_ERR_INVALID_ARG, NAMES("4100 bytes", "4096"), NULL);
    expect(name, "weights from offset 4000", pv_weights_write(buf, 4000, PV_W_Q4_1, 8, 32, src), PV_ERR_INVALID_ARG,
           NAMES("offset 4000"), NULL);
    pv_buffer_free(buf);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--backend NAME]\n", argv[0]);
            return 2;
        }
    }

    /* A message that wraps the one before it reads the buffer it replaces. */
    pv_error(PV_ERR_IO, "inner %d", 7);
    pv_error(PV_ERR_IO, "outer: %s; again: %s", pv_last_error(), pv_last_error());
    ok(strcmp(pv_last_error(), "outer: inner 7; again: inner 7") == 0, "pv_error wraps pv_last_error(): '%s'",
       pv_last_error());

    pv_backend *none = NULL;
    expect("front end", "unknown backend 'tpu'", pv_backend_init(&none, "tpu", 0), PV_ERR_NOT_FOUND,
           NAMES("tpu", "cpu"), NULL);
    ok(none == NULL, "front end: a failed init leaves no backend");
    pv_backend *cpu = NULL;
    expect("front end", "cpu device 1 of 1", pv_backend_init(&cpu, "cpu", 1), PV_ERR_INVALID_ARG, NAMES("device", "1"),
           NULL);

    expect("front end", "advice on a NULL buffer", pv_buffer_advise_streamed(NULL), PV_ERR_INVALID_ARG,
           NAMES("buf", "NULL"), NULL);

    for (const char *const *name = pv_backend_names(); *name; name++) {
        if (only && strcmp(only, *name) != 0)
            continue;
        pv_backend *be = NULL;
        pv_status st = pv_backend_init(&be, *name, 0);
        if (st == PV_ERR_NO_DEVICE) {
            /* The "no device" path itself is under test: a status and a message. */
            ok(pv_last_error()[0] != '\0' && be == NULL, "%s: no device is a status with a message: %s", *name,
               pv_last_error());
            continue;
        }
        if (!ok(st == PV_OK, "backend %s opens", *name)) {
            tap_diag("%s", pv_last_error());
            continue;
        }
        attention_cases(*name, be);
        other_op_cases(*name, be);
        fused_op_cases(*name, be);
        batch_op_cases(*name, be);
        device_sample_cases(*name, be);
        many_rows_case(*name, be);
        streamed_advice_case(*name, be);
        weights_write_cases(*name, be);
        pv_backend_free(be);
    }
    return tap_done();
}
