/* Launch counts (pv_backend_launches) on every backend that opens: a known
 * sequence of ops, each of which must add exactly what its backend
 * enqueues for it, and copies, reads, writes, events and refused calls
 * nothing. The CPU backend counts one per op call. The kernel backends
 * (OpenCL, CUDA) count each kernel and each BLAS call: one for most ops;
 * split-K attention adds its combine kernel; a product of more rows than
 * the fused kernels take widens W into a tile for the BLAS GEMM (two),
 * f32 weights going to the GEMM directly (one); a group of products has no
 * op of its own there (one each); the SwiGLU product of such a batch is
 * the two products and the element-wise kernel. A slot transfer is one
 * launch (one kernel; one op on the CPU), or one copy a slot where an
 * OpenCL device has memory of its own. Copies (pv_backend_copies): each
 * copy_async is one, and nothing else here is.
 * Usage: test-backend-launches [--backend NAME] */
#include "config.h"

#include "backend-check.h"

#include <stdio.h>

enum { FLOATS = 8192, N_IN = 64, N_OUT = 64, BIG_T = 32 };
/* The KV pool: 1 KV head of 16 in chunks of 4, 4 slots; 2 query heads. */
enum { HEAD_DIM = 16, CHUNK = 4, SLOTS = 4, HEADS = 2 };
#define POOL_FLOATS (SLOTS * 2 * CHUNK * HEAD_DIM)

typedef struct fixture {
    pv_backend *be;
    int kernels; /* 1: a kernel backend (its ops run the portable kernels) */
    pv_buffer *a, *b, *c, *host, *wq, *wf, *pool;
    uint64_t total_expected; /* the sum of every step's expectation */
    uint64_t start;
} fixture;

/* One step: the launches status `st` took must be `cpu` on the CPU
 * backend, `kernels` on a kernel backend. */
static void step(fixture *f, const char *what, uint64_t before, pv_status st, pv_status want, uint64_t cpu,
                 uint64_t kernels)
{
    const uint64_t expected = f->kernels ? kernels : cpu;
    const uint64_t got = pv_backend_launches(f->be) - before;
    f->total_expected += expected;
    ok(st == want && got == expected, "%s: %s: %llu launches (expected %llu)%s%s", f->be->ops->name, what,
       (unsigned long long)got, (unsigned long long)expected, st == want ? "" : ": ",
       st == want ? "" : pv_last_error());
}

#define STEP(f, what, call, cpu, kernels)                                                          \
    do {                                                                                           \
        uint64_t before_ = pv_backend_launches((f)->be);                                           \
        step((f), (what), before_, (call), PV_OK, (cpu), (kernels));                               \
    } while (0)

static pv_status fixture_init(fixture *f, pv_backend *be)
{
    memset(f, 0, sizeof *f);
    f->be = be;
    f->kernels = pv_backend_kernels_tunable(be);
    float *zeros = xmalloc(FLOATS * sizeof *zeros);
    memset(zeros, 0, FLOATS * sizeof *zeros);
    uint8_t *q8 = xmalloc((size_t)N_OUT * N_IN / 32 * 34);
    memset(q8, 0, (size_t)N_OUT * N_IN / 32 * 34);
    pv_buffer **bufs[] = {&f->a, &f->b, &f->c};
    pv_status st = PV_OK;
    for (int i = 0; i < 3 && st == PV_OK; i++)
        if ((st = pv_buffer_init(bufs[i], be, PV_MEM_DEVICE, FLOATS * sizeof(float))) == PV_OK)
            st = pv_buffer_write(*bufs[i], 0, zeros, FLOATS * sizeof(float));
    if (st == PV_OK)
        st = pv_buffer_init(&f->host, be, PV_MEM_HOST, 4096);
    if (st == PV_OK)
        st = pv_buffer_init(&f->wq, be, PV_MEM_DEVICE, (uint64_t)N_OUT * N_IN / 32 * 34);
    if (st == PV_OK)
        st = pv_weights_write(f->wq, 0, PV_W_Q8_0, N_OUT, N_IN, q8);
    if (st == PV_OK)
        st = pv_buffer_init(&f->wf, be, PV_MEM_DEVICE, (uint64_t)N_OUT * N_IN * sizeof(float));
    if (st == PV_OK)
        st = pv_weights_write(f->wf, 0, PV_W_F32, N_OUT, N_IN, zeros);
    if (st == PV_OK)
        st = pv_buffer_init(&f->pool, be, PV_MEM_DEVICE, POOL_FLOATS * sizeof(float));
    if (st == PV_OK)
        st = pv_buffer_write(f->pool, 0, zeros, POOL_FLOATS * sizeof(float));
    if (st == PV_OK)
        st = pv_backend_finish(be);
    free(zeros);
    free(q8);
    return st;
}

static void fixture_free(fixture *f)
{
    pv_buffer *bufs[] = {f->a, f->b, f->c, f->host, f->wq, f->wf, f->pool};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        pv_buffer_free(bufs[i]);
}

/* Copies and events enqueue no kernel; a copy_async is one copy, and
 * reads, writes and events none. */
static void copy_steps(fixture *f)
{
    float data[64] = {0};
    pv_event *ev = NULL;
    const uint64_t copies = pv_backend_copies(f->be);
    STEP(f, "buffer_write", pv_buffer_write(f->a, 0, data, sizeof data), 0, 0);
    STEP(f, "buffer_read", pv_buffer_read(f->a, 0, data, sizeof data), 0, 0);
    STEP(f, "copy_async on the copy queue", pv_copy_async(PV_QUEUE_COPY, f->host, 0, f->a, 0, 256, NULL, &ev), 0, 0);
    ok(pv_backend_copies(f->be) - copies == 1, "%s: reads, writes and a copy_async: %llu copies (expected 1)",
       f->be->ops->name, (unsigned long long)(pv_backend_copies(f->be) - copies));
    STEP(f, "event_wait", pv_event_wait(ev), 0, 0);
    pv_event_free(ev);
    ev = NULL;
    STEP(f, "event_record", pv_event_record(f->be, PV_QUEUE_COMPUTE, &ev), 0, 0);
    pv_event_free(ev);
    STEP(f, "finish", pv_backend_finish(f->be), 0, 0);
}

static pv_qmatmul_args product(const fixture *f, int f32, int64_t T, pv_buffer *y)
{
    return (pv_qmatmul_args){.w_type = f32 ? PV_W_F32 : PV_W_Q8_0, .n_tokens = T, .n_in = N_IN, .n_out = N_OUT,
                             .w = f32 ? f->wf : f->wq, .x = f->a, .y = y};
}

static void matmul_steps(fixture *f)
{
    pv_gemm_args g = {.dtype = PV_F32, .trans_b = 1, .m = 4, .n = 8, .k = 16, .alpha = 1.0f, .a = f->a, .lda = 16,
                      .b = f->b, .ldb = 16, .c = f->c, .ldc = 8};
    STEP(f, "gemm 4 x 8 x 16", pv_gemm(f->be, &g), 1, 1);
    g.k = 0;
    g.beta = 0.5f;
    STEP(f, "gemm with k 0 (C = beta C, packed)", pv_gemm(f->be, &g), 1, 1);

    pv_qmatmul_args q = product(f, 0, 1, f->c);
    STEP(f, "qmatmul Q8_0, 1 token", pv_qmatmul(f->be, &q), 1, 1);
    q.n_tokens = 16;
    STEP(f, "qmatmul Q8_0, 16 tokens (the largest fused class)", pv_qmatmul(f->be, &q), 1, 1);
    q.n_tokens = BIG_T;
    STEP(f, "qmatmul Q8_0, 32 tokens (kernel backends: widen + GEMM)", pv_qmatmul(f->be, &q), 1, 2);
    q = product(f, 1, BIG_T, f->c);
    STEP(f, "qmatmul F32, 32 tokens (kernel backends: GEMM on W in place)", pv_qmatmul(f->be, &q), 1, 1);

    pv_qmatmul_args group[3] = {product(f, 0, 1, f->b), product(f, 0, 1, f->c), product(f, 1, 1, f->pool)};
    group[1].y_off = 1024;
    STEP(f, "qmatmul_group of 3 products", pv_qmatmul_group(f->be, group, 3), 1, 3);

    pv_qmatmul_swiglu_args sw = {.w_type = PV_W_Q8_0, .n_tokens = 1, .n_in = N_IN, .n_out = N_OUT, .w_gate = f->wq,
                                 .w_up = f->wq, .x = f->a, .y = f->b, .up = f->c};
    STEP(f, "qmatmul_swiglu Q8_0, 1 token", pv_qmatmul_swiglu(f->be, &sw), 1, 1);
    sw.n_tokens = 16;
    STEP(f, "qmatmul_swiglu Q8_0, 16 tokens", pv_qmatmul_swiglu(f->be, &sw), 1, 1);
    sw.n_tokens = BIG_T;
    STEP(f, "qmatmul_swiglu Q8_0, 32 tokens (kernel backends: 2 x (widen + GEMM) + swiglu)", pv_qmatmul_swiglu(f->be, &sw), 1, 5);
    sw.w_type = PV_W_F32;
    sw.w_gate = sw.w_up = f->wf;
    STEP(f, "qmatmul_swiglu F32, 32 tokens (kernel backends: 2 GEMMs + swiglu)", pv_qmatmul_swiglu(f->be, &sw), 1, 3);

    int32_t ids[3] = {0, 5, 63};
    pv_embed_gather_args e = {.table_type = PV_W_Q8_0, .n_rows = N_OUT, .dim = N_IN, .table = f->wq, .ids = ids,
                              .n_ids = 3, .out = f->c};
    STEP(f, "embed_gather of 3 rows", pv_embed_gather(f->be, &e), 1, 1);
}

/* Attention with its split count forced where the backend tunes one. */
static void attention_step(fixture *f, const pv_attention_args *a, const char *splits, uint64_t kernels)
{
    char bucket[96], what[128];
    pv_status st = pv_attention_bucket(a, bucket, sizeof bucket);
    if (st == PV_OK && f->kernels) {
        char params[32];
        snprintf(params, sizeof params, "PV_SPLITS=%s", splits);
        st = pv_backend_kernel_set(f->be, bucket, params);
    }
    snprintf(what, sizeof what, "attention, decode, PV_SPLITS=%s where tuned", splits);
    if (st != PV_OK) {
        ok(0, "%s: %s: %s", f->be->ops->name, what, pv_last_error());
        return;
    }
    STEP(f, what, pv_attention(f->be, a), 1, kernels);
}

static void kv_steps(fixture *f)
{
    int32_t seq[2] = {0, 1}, pos[2] = {6, 3}, table[4] = {2, 0, 3, -1};
    pv_kv_write_args w = {.kv_dtype = PV_F32, .n_tokens = 2, .n_kv_heads = 1, .head_dim = HEAD_DIM,
                          .chunk_tokens = CHUNK, .k = f->a, .v = f->b, .kv_pool = f->pool, .n_slots = SLOTS,
                          .token_seq = seq, .token_pos = pos, .slot_table = table, .n_seqs = 2, .max_chunks = 2};
    STEP(f, "kv_write of 2 rows", pv_kv_write(f->be, &w), 1, 1);
    pv_rope_kv_write_args rk = {.kv_dtype = PV_F32, .n_tokens = 2, .n_heads = HEADS, .n_kv_heads = 1,
                                .head_dim = HEAD_DIM, .chunk_tokens = CHUNK, .base = 10000.0f, .q = f->c, .k = f->a,
                                .v = f->b, .kv_pool = f->pool, .n_slots = SLOTS, .token_seq = seq, .token_pos = pos,
                                .slot_table = table, .n_seqs = 2, .max_chunks = 2};
    STEP(f, "rope_kv_write of 2 tokens", pv_rope_kv_write(f->be, &rk), 1, 1);
    rk.token_pos = (const int32_t[]){6, 6};
    rk.token_seq = (const int32_t[]){0, 0};
    uint64_t before = pv_backend_launches(f->be);
    step(f, "rope_kv_write refused (one position twice)", before, pv_rope_kv_write(f->be, &rk), PV_ERR_INVALID_ARG, 0,
         0);
    pv_attention_args a = {.kv_dtype = PV_F32, .n_tokens = 2, .n_heads = HEADS, .n_kv_heads = 1,
                           .head_dim = HEAD_DIM, .chunk_tokens = CHUNK, .scale = 0.25f, .q = f->c, .kv_pool = f->pool,
                           .n_slots = SLOTS, .token_seq = seq, .token_pos = pos, .slot_table = table, .n_seqs = 2,
                           .max_chunks = 2, .out = f->b};
    attention_step(f, &a, "1", 1);
    attention_step(f, &a, "2", 2); /* and the combine kernel */

    int32_t slots[2] = {3, 1};
    pv_slot_copy_args sc = {.dtype = PV_F32, .slot_elems = 2 * CHUNK * HEAD_DIM, .pool = f->pool, .n_slots = SLOTS,
                            .staging = f->c, .slots = slots, .n_slots_moved = 2};
    STEP(f, "slot_gather of 2 slots", pv_slot_gather(f->be, &sc), 1, 1);
    STEP(f, "slot_scatter of 2 slots", pv_slot_scatter(f->be, &sc), 1, 1);

    /* 3 slots of the pool into the host buffer's first 3 (of 4 that fit). */
    const int32_t to[3] = {2, 0, 1}, from[3] = {3, 1, 0};
    pv_slot_transfer_args t = {.dtype = PV_F32, .slot_elems = 2 * CHUNK * HEAD_DIM, .dst = f->host, .dst_n_slots = 4,
                               .src = f->pool, .src_n_slots = SLOTS, .dst_slots = to, .src_slots = from, .n = 3};
    pv_event *done = NULL;
    const uint64_t launches = pv_backend_launches(f->be), copies = pv_backend_copies(f->be);
    pv_status st = pv_slot_transfer(f->be, &t, NULL, &done);
    if (st == PV_OK)
        st = pv_event_wait(done);
    pv_event_free(done);
    const uint64_t l = pv_backend_launches(f->be) - launches, c = pv_backend_copies(f->be) - copies;
    f->total_expected += l; /* checked here */
    ok(st == PV_OK && ((l == 1 && c == 0) || (f->kernels && l == 0 && c == 3)),
       "%s: slot_transfer of 3 slots: %llu launches, %llu copies (expected 1 launch, or 3 copies on an OpenCL "
       "device with memory of its own)%s%s",
       f->be->ops->name, (unsigned long long)l, (unsigned long long)c, st == PV_OK ? "" : ": ",
       st == PV_OK ? "" : pv_last_error());
}

static void recompute_steps(fixture *f)
{
    pv_rmsnorm_args rn = {.rows = 3, .dim = 64, .eps = 1e-5f, .x = f->a, .weight = f->b, .out = f->c};
    STEP(f, "rmsnorm of 3 rows", pv_rmsnorm(f->be, &rn), 1, 1);
    pv_add_rmsnorm_args an = {.rows = 3, .dim = 64, .eps = 1e-5f, .x = f->a, .y = f->b, .weight = f->b, .out = f->c};
    STEP(f, "add_rmsnorm of 3 rows", pv_add_rmsnorm(f->be, &an), 1, 1);
    an.out = f->a;
    an.out_off = 8;
    uint64_t before = pv_backend_launches(f->be);
    step(f, "add_rmsnorm refused (out overlapping x)", before, pv_add_rmsnorm(f->be, &an), PV_ERR_INVALID_ARG, 0, 0);
    pv_rope_args rp = {.n_tokens = 2, .n_heads = HEADS, .head_dim = HEAD_DIM, .base = 10000.0f, .x = f->a,
                       .pos = (const int32_t[]){0, 9}};
    STEP(f, "rope of 2 tokens", pv_rope(f->be, &rp), 1, 1);
    pv_swiglu_args sw = {.n = 1000, .gate = f->a, .up = f->b, .out = f->c};
    STEP(f, "swiglu of 1000", pv_swiglu(f->be, &sw), 1, 1);
    pv_add_args ad = {.n = 1000, .a = f->a, .b = f->b, .out = f->a};
    STEP(f, "add of 1000", pv_add(f->be, &ad), 1, 1);
    pv_softmax_args sm = {.rows = 2, .cols = 100, .scale = 1.0f, .x = f->a, .out = f->c};
    STEP(f, "softmax of 2 rows", pv_softmax(f->be, &sm), 1, 1);
    int32_t picked[2];
    pv_argmax_args am = {.rows = 2, .cols = 100, .x = f->c, .out = picked};
    STEP(f, "argmax of 2 rows", pv_argmax(f->be, &am), 1, 1);
    pv_sample_args sa = {.rows = 2, .cols = 100, .temperature = 1.0f, .top_p = 0.9f, .logits = f->c,
                         .u = (const float[]){0.5f, 0.25f}, .out = picked};
    STEP(f, "sample_top_p of 2 rows", pv_sample_top_p(f->be, &sa), 1, 1);
    pv_sample_batch_args sb = {.rows = 2, .cols = 100, .logits = f->c, .temperature = (const float[]){0.0f, 1.0f},
                               .top_p = (const float[]){0.0f, 0.9f}, .u = (const float[]){0.0f, 0.25f},
                               .out = picked};
    STEP(f, "sample_batch of 2 rows, one greedy and one sampled", pv_sample_batch(f->be, &sb), 1, 1);
}

static void run_backend(pv_backend *be)
{
    fixture f;
    if (!ok(fixture_init(&f, be) == PV_OK, "%s: buffers and weights set up", be->ops->name)) {
        tap_diag("%s", pv_last_error());
        fixture_free(&f);
        return;
    }
    f.start = pv_backend_launches(be);
    copy_steps(&f);
    matmul_steps(&f);
    kv_steps(&f);
    recompute_steps(&f);
    const uint64_t total = pv_backend_launches(be) - f.start;
    ok(total == f.total_expected, "%s: the whole sequence: %llu launches (expected %llu)", be->ops->name,
       (unsigned long long)total, (unsigned long long)f.total_expected);
    fixture_free(&f);
}

static void check_opened(pv_backend *be, const char *name, void *arg)
{
    (void)arg;
    ok(pv_backend_launches(be) == 0, "%s: a backend just opened has launched nothing", name);
    run_backend(be);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    const int usage = check_args(argc, argv, &only, NULL);
    if (usage)
        return usage;
    ok(pv_backend_launches(NULL) == 0, "front end: a NULL backend has launched nothing");
    if (!check_each_backend(only, 0, check_opened, NULL))
        ok(0, "backend %s is built into this library", only);
    return tap_done();
}
