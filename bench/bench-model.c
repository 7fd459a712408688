/* bench-model: prefill, single-stream decode and batched decode (--batch
 * sequences decoding together) tokens/s of a GGUF Llama model on one
 * backend, with its weights as in the file (--weights native, the default)
 * or widened to f32, beside the bounds measured in the same run:
 *   prefill bound = GEMM peak / weight FLOPs per token, where the peak is
 *                   the backend's best f32 GEMM rate over square sizes
 *                   512..2048 and the model's FFN shape, before and after
 *                   the forward passes (the FFN shape's rate is printed too)
 *   decode bound  = the host's all-core STREAM-style read bandwidth (best
 *                   of 10 passes before and 10 after the forward passes),
 *                   or on a device backend the device's own copy
 *                   bandwidth (bench-device.h), / bytes of weights and K/V
 *                   a decode step reads
 * the host time of a single-stream decode step (inside pv_llama_forward,
 * which returns once the step is enqueued) beside the whole step's time
 * and the device's time for it (timing markers, pv_marker_*, recorded
 * before the step's first launch and after its last: the kernels and any
 * gap where the device waited for the host's next launch; on the CPU
 * backend, whose ops run inside the call, the host's time for the call),
 * with the cores' nominal FMA rate (bench-util.h) beside the GEMM peak,
 * and the kernel launches each kind of step enqueues (pv_backend_launches),
 * with the model's fused ops (--fuse 1, the default) or without (--fuse 0):
 *   launches_per_step   the launches of one forward call: the prefill; the
 *                       first decode step (one token at context prompt + 1)
 *                       of the last repetition; the first batched step
 *   launches_per_layer  (launches counted when layer n_layers - 1 starts
 *                       writing the pool - when layer 0 does) / (n_layers -
 *                       1): one layer's launches, counted in the steady
 *                       state between two layers' before_layer hooks (null
 *                       for a one-layer model)
 *   launches_outside    launches_per_step - n_layers x launches_per_layer:
 *                       the embedding, the first norm, the last residual,
 *                       the picked rows' norm and the output projection
 * Prints a table, or JSON with --json. */
#include "bench-device.h"
#include "bench-util.h"

#include <pensieve/llama.h>

#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The process's resident set in bytes (VmRSS), 0 where /proc says nothing. */
static uint64_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %" SCNu64 " kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib * 1024;
}

static int fail(const char *what)
{
    fprintf(stderr, "bench-model: %s: %s\n", what, pv_last_error());
    return 1;
}

/* Launch counts of one kind of step, taken through the batch's
 * before_layer hook (see the top). */
typedef struct launch_probe {
    pv_backend *be;
    uint32_t n_layers;
    uint64_t at_first, at_last; /* when layers 0 and n_layers - 1 started writing the pool */
    double enqueue_s; /* host time inside pv_llama_forward, summed over the calls */
} launch_probe;

/* Per-step times of the timed single-stream decode steps: the host's
 * inside pv_llama_forward, and the device's between a marker recorded
 * before the call and one after it. */
typedef struct step_times {
    pv_marker *start, *end;
    double *host_s, *device_s; /* [capacity] */
    int n, capacity;
} step_times;

typedef struct launch_count {
    uint64_t per_step;
    double per_layer; /* < 0: not defined (one layer) */
} launch_count;

static pv_status probe_layer(void *ctx, uint32_t layer)
{
    launch_probe *p = ctx;
    if (layer == 0)
        p->at_first = pv_backend_launches(p->be);
    if (layer + 1 == p->n_layers)
        p->at_last = pv_backend_launches(p->be);
    return PV_OK;
}

/* One forward call of b, finished, with its launches counted into *out
 * (when out is not NULL) and its times appended to *times (when times is
 * not NULL). */
static pv_status counted_forward(pv_llama *model, pv_backend *be, pv_llama_batch *b, launch_probe *probe,
                                 launch_count *out, step_times *times)
{
    b->before_layer = probe_layer;
    b->before_layer_ctx = probe;
    const uint64_t before = pv_backend_launches(be);
    pv_status st = times ? pv_marker_record(be, times->start) : PV_OK;
    if (st != PV_OK)
        return st;
    const double t0 = bench_now_s();
    st = pv_llama_forward(model, b);
    const double host_s = bench_now_s() - t0;
    probe->enqueue_s += host_s;
    if (st == PV_OK && times)
        st = pv_marker_record(be, times->end);
    if (st == PV_OK)
        st = pv_backend_finish(be);
    if (st == PV_OK && times && times->n < times->capacity) {
        st = pv_marker_elapsed(be, times->start, times->end, &times->device_s[times->n]);
        times->host_s[times->n++] = host_s;
    }
    if (st == PV_OK && out) {
        out->per_step = pv_backend_launches(be) - before;
        out->per_layer = probe->n_layers > 1 ? (double)(probe->at_last - probe->at_first) / (probe->n_layers - 1)
                                             : -1.0;
    }
    return st;
}

static void launch_count_json(const char *name, const launch_count *c, uint32_t n_layers, int last)
{
    printf("\"%s\": {\"launches_per_step\": %" PRIu64, name, c->per_step);
    if (c->per_layer >= 0)
        printf(", \"launches_per_layer\": %.2f, \"launches_outside\": %.2f}%s", c->per_layer,
               (double)c->per_step - n_layers * c->per_layer, last ? "" : ", ");
    else
        printf(", \"launches_per_layer\": null, \"launches_outside\": null}%s", last ? "" : ", ");
}

/* The backend's f32 GEMM rate at m x n x k, GFLOP/s, median of reps. */
static double gemm_gflops(pv_backend *be, int64_t m, int64_t n, int64_t k, int reps)
{
    pv_buffer *a, *b, *c;
    double t[16], rate = 0;
    if (pv_buffer_init(&a, be, PV_MEM_DEVICE, (uint64_t)(m * k) * 4) != PV_OK)
        return 0;
    if (pv_buffer_init(&b, be, PV_MEM_DEVICE, (uint64_t)(n * k) * 4) != PV_OK) {
        pv_buffer_free(a);
        return 0;
    }
    if (pv_buffer_init(&c, be, PV_MEM_DEVICE, (uint64_t)(m * n) * 4) == PV_OK) {
        float *fill = calloc((size_t)(n * k > m * k ? n * k : m * k), sizeof *fill);
        if (fill && pv_buffer_write(a, 0, fill, (uint64_t)(m * k) * 4) == PV_OK &&
            pv_buffer_write(b, 0, fill, (uint64_t)(n * k) * 4) == PV_OK) {
            pv_gemm_args g = {.dtype = PV_F32, .trans_b = 1, .m = m, .n = n, .k = k, .alpha = 1,
                              .a = a, .lda = k, .b = b, .ldb = k, .c = c, .ldc = n};
            int good = pv_gemm(be, &g) == PV_OK && pv_backend_finish(be) == PV_OK; /* warm-up */
            for (int r = 0; good && r < reps; r++) {
                double t0 = bench_now_s();
                good = pv_gemm(be, &g) == PV_OK && pv_backend_finish(be) == PV_OK;
                t[r] = bench_now_s() - t0;
            }
            if (good)
                rate = 2.0 * m * n * k / bench_median(t, reps) / 1e9;
        }
        free(fill);
        pv_buffer_free(c);
    }
    pv_buffer_free(a);
    pv_buffer_free(b);
    return rate;
}

/* The GEMM peak: the best rate over square sizes and the model's FFN shape
 * (whose own rate goes to *ffn_rate). */
static double gemm_peak(pv_backend *be, const pv_llama_hparams *hp, int prompt, int reps, double *ffn_rate)
{
    static const int64_t sizes[] = {512, 1024, 1536, 2048};
    *ffn_rate = gemm_gflops(be, prompt, hp->n_ff, hp->n_embd, reps);
    double peak = *ffn_rate;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        double rate = gemm_gflops(be, sizes[i], sizes[i], sizes[i], reps);
        peak = rate > peak ? rate : peak;
    }
    return peak;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *backend = "cpu";
    int prompt = 256, decode = 32, reps = 3, json = 0, batch = 16, fuse = 1, graphs = 1, n_sets = 0;
    const char *kernel_sets[8];
    pv_llama_weights weights = PV_LLAMA_WEIGHTS_NATIVE;
    pv_dtype kv_dtype = PV_F32;
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'}, {"backend", required_argument, 0, 'b'},
        {"prompt", required_argument, 0, 'p'}, {"decode", required_argument, 0, 'd'},
        {"reps", required_argument, 0, 'r'},   {"json", no_argument, 0, 'j'},
        {"batch", required_argument, 0, 'B'},  {"weights", required_argument, 0, 'w'},
        {"kv", required_argument, 0, 'k'},     {"fuse", required_argument, 0, 'f'},
        {"graphs", required_argument, 0, 'g'}, {"help", no_argument, 0, 'h'},
        {"kernel", required_argument, 0, 'K'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'b': backend = optarg; break;
        case 'p': prompt = atoi(optarg); break;
        case 'd': decode = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'j': json = 1; break;
        case 'B': batch = atoi(optarg); break;
        case 'K':
            if (n_sets == (int)(sizeof kernel_sets / sizeof kernel_sets[0]) || !strchr(optarg, ':'))
                goto usage;
            kernel_sets[n_sets++] = optarg;
            break;
        case 'f':
        case 'g':
            if (strcmp(optarg, "0") == 0 || strcmp(optarg, "1") == 0) {
                *(c == 'f' ? &fuse : &graphs) = optarg[0] == '1';
                break;
            }
            goto usage;
        case 'h':
            printf("usage: bench-model [--model GGUF] [--backend NAME] [--weights native|f32] [--kv f32|f16] "
                   "[--fuse 0|1] [--graphs 0|1] [--kernel BUCKET:PARAMS]... [--prompt N] [--decode N] [--batch N]\n"
                   "       [--reps N] [--json]\n"
                   "Prefill, decode and batched decode tokens/s (medians of --reps after a warm-up) beside\n"
                   "their bounds, and the kernel launches of each kind of step (pv_backend_launches):\n"
                   "  --fuse 1 (default) the model's fused ops where the backend has them; 0 without\n"
                   "  --graphs 1 (default) decode steps run as graphs where the backend has them; 0 not\n"
                   "  --kernel        a kernel parameter set, as pensieve-tune keeps one (pv_backend_kernel_set),\n"
                   "                  e.g. qmatmul:PV_GEMM=1 (prefill's GEMMs in f16); at most 8\n"
                   "  launches/step   one forward call: the prefill, the first decode step of the last\n"
                   "                  repetition (context prompt + 1), the first batched step\n"
                   "  launches/layer  (count when layer n_layers - 1 starts writing the KV pool - count\n"
                   "                  when layer 0 does) / (n_layers - 1): one layer in the steady state\n"
                   "  outside         launches/step - n_layers x launches/layer (embedding, first norm,\n"
                   "                  last residual, the output rows' norm and projection)\n"
                   "A single-stream decode step's times (--json: decode_host_s, decode_step_s, decode_device_s,\n"
                   "decode_host_over_device):\n"
                   "  host            inside pv_llama_forward, which returns once the step is enqueued\n"
                   "  in all          the step waited for, on the host's clock\n"
                   "  device          between timing markers (pv_marker_*) before the step's first launch and\n"
                   "                  after its last, on the device's clock (CUDA events, OpenCL profiling):\n"
                   "                  the kernels and the gaps where the device waited for the host; the\n"
                   "                  median over the timed steps. On the CPU backend, whose ops run inside\n"
                   "                  the call, the host's clock around the call: about the host time\n"
                   "  host/device     the median step's host time over the median device time\n");
            return 0;
        case 'k':
            if (strcmp(optarg, "f32") == 0 || strcmp(optarg, "f16") == 0) {
                kv_dtype = optarg[1] == '3' ? PV_F32 : PV_F16;
                break;
            }
            goto usage;
        case 'w':
            if (strcmp(optarg, "native") == 0 || strcmp(optarg, "f32") == 0) {
                weights = optarg[0] == 'n' ? PV_LLAMA_WEIGHTS_NATIVE : PV_LLAMA_WEIGHTS_F32;
                break;
            }
            goto usage;
        default:
        usage:
            fprintf(stderr, "usage: bench-model [--model GGUF] [--backend NAME] [--weights native|f32] "
                            "[--kv f32|f16] [--fuse 0|1] [--graphs 0|1] [--kernel BUCKET:PARAMS]... [--prompt N] "
                            "[--decode N] [--batch N] [--reps N] [--json] [--help]\n");
            return 2;
        }
    }
    if (prompt < 1 || prompt > 512 || decode < 1 || decode > 1 << 20 || reps < 1 || reps > 16 || batch < 1 ||
        batch > 64) {
        fprintf(stderr, "bench-model: --prompt in [1, 512], --decode in [1, 2^20], --reps in [1, 16], --batch in "
                        "[1, 64]\n");
        return 2;
    }
    char default_path[4096];
    if (!model_path) {
        if (pv_default_model_path(default_path, sizeof default_path) != PV_OK)
            return fail("default model path");
        model_path = default_path;
    }
    pv_gguf file;
    pv_backend *be;
    pv_llama *model;
    if (pv_gguf_init(&file, model_path) != PV_OK)
        return fail(model_path);
    if (pv_backend_init(&be, backend, 0) != PV_OK)
        return fail(backend);
    for (int i = 0; i < n_sets; i++) {
        char bucket[64];
        const size_t len = strcspn(kernel_sets[i], ":");
        snprintf(bucket, sizeof bucket, "%.*s", (int)(len < sizeof bucket ? len : sizeof bucket - 1), kernel_sets[i]);
        if (pv_backend_kernel_set(be, bucket, kernel_sets[i] + len + 1) != PV_OK)
            return fail(kernel_sets[i]);
    }
    char qmatmul_set[96] = "";
    if (pv_backend_kernels_tunable(be) && pv_backend_kernel_get(be, "qmatmul", qmatmul_set, sizeof qmatmul_set) != PV_OK)
        return fail("qmatmul's kernel set");
    pv_llama_options lo;
    pv_llama_options_default(&lo);
    lo.weights = weights;
    lo.kv_dtype = kv_dtype;
    lo.fuse = fuse;
    lo.graphs = graphs;
    if (pv_llama_init(&model, be, &file, &lo) != PV_OK)
        return fail("model");
    pv_gguf_free(&file);
    /* Before the KV pool and the STREAM arrays: the model and the library. */
    const uint64_t rss_model = resident_bytes();
    const pv_llama_hparams *hp = pv_llama_hparams_of(model);

    /* batch sequences; slot = (layer * batch + sequence) * max_chunks + chunk.
     * The single-stream passes use sequence 0. */
    const int ctx = prompt + decode;
    const int32_t max_chunks = (ctx + lo.chunk_tokens - 1) / lo.chunk_tokens;
    const int64_t n_slots = (int64_t)hp->n_layers * batch * max_chunks;
    pv_buffer *pool;
    if (pv_buffer_init(&pool, be, PV_MEM_DEVICE, (uint64_t)n_slots * pv_llama_slot_bytes(model)) != PV_OK)
        return fail("kv pool");
    int32_t *tables = malloc(sizeof *tables * (size_t)n_slots);
    int32_t *tokens = malloc(sizeof *tokens * (size_t)ctx), *seq = calloc((size_t)prompt, sizeof *seq);
    int32_t *pos = malloc(sizeof *pos * (size_t)ctx);
    int32_t *step_tokens = malloc(sizeof *step_tokens * (size_t)batch);
    int32_t *step_seq = malloc(sizeof *step_seq * (size_t)batch);
    int32_t *step_pos = malloc(sizeof *step_pos * (size_t)batch);
    int32_t *step_rows = malloc(sizeof *step_rows * (size_t)batch);
    if (!tables || !tokens || !seq || !pos || !step_tokens || !step_seq || !step_pos || !step_rows) {
        fprintf(stderr, "bench-model: cannot allocate the batch arrays\n");
        return 1;
    }
    for (int64_t i = 0; i < n_slots; i++)
        tables[i] = (int32_t)i;
    for (int i = 0; i < ctx; i++) {
        tokens[i] = (int32_t)((i * 7919u + 13u) % hp->n_vocab);
        pos[i] = i;
    }
    int32_t last = prompt - 1;
    pv_llama_batch b = {.n_tokens = prompt, .tokens = tokens, .token_seq = seq, .token_pos = pos,
                        .n_seqs = batch, .max_chunks = max_chunks, .slot_tables = tables,
                        .kv_pool = pool, .n_slots = n_slots, .n_logits = 1, .logit_rows = &last};
    /* The references before the forward passes and after them, the higher
     * of each kept: on a shared machine either may land in a busy minute. */
    bench_stream mem;
    if (bench_stream_measure(&mem, 10) != 0) {
        fprintf(stderr, "bench-model: cannot allocate the STREAM arrays\n");
        return 1;
    }
    double gemm_rate, gemm_rate_after;
    double gemm_best = gemm_peak(be, hp, prompt, reps, &gemm_rate);
    double t_prefill[16], t_decode[16], t_enqueue[16];
    launch_probe probe = {.be = be, .n_layers = hp->n_layers};
    step_times steps = {.capacity = reps * decode};
    steps.host_s = malloc(sizeof *steps.host_s * (size_t)steps.capacity);
    steps.device_s = malloc(sizeof *steps.device_s * (size_t)steps.capacity);
    if (!steps.host_s || !steps.device_s) {
        fprintf(stderr, "bench-model: cannot allocate the step times\n");
        return 1;
    }
    if (pv_marker_init(&steps.start, be) != PV_OK || pv_marker_init(&steps.end, be) != PV_OK)
        return fail("timing markers");
    launch_count prefill_launches = {0}, decode_launches = {0}, batch_launches = {0, -1.0};
    for (int r = 0; r <= reps; r++) { /* run 0 warms up */
        double t0 = bench_now_s();
        b.n_tokens = prompt;
        b.tokens = tokens;
        b.token_pos = pos;
        last = prompt - 1;
        if (counted_forward(model, be, &b, &probe, &prefill_launches, NULL) != PV_OK)
            return fail("prefill");
        double t1 = bench_now_s();
        last = 0;
        probe.enqueue_s = 0;
        for (int i = prompt; i < ctx; i++) {
            b.n_tokens = 1;
            b.tokens = tokens + i;
            b.token_pos = pos + i;
            if (counted_forward(model, be, &b, &probe, i == prompt ? &decode_launches : NULL, r > 0 ? &steps : NULL) !=
                PV_OK)
                return fail("decode");
        }
        double t2 = bench_now_s();
        if (r > 0) {
            t_prefill[r - 1] = t1 - t0;
            t_decode[r - 1] = (t2 - t1) / decode;
            t_enqueue[r - 1] = probe.enqueue_s / decode;
        }
    }
    double prefill_tps = prompt / bench_median(t_prefill, reps);
    double decode_tps = 1.0 / bench_median(t_decode, reps);
    /* A step's host time is what pv_llama_forward takes to enqueue it (the
     * bench reads no logits, so the call returns before the device is done);
     * a step's whole time is that plus the wait. Host time near the step
     * time means the device waits for the host. */
    const double enqueue_s = bench_median(t_enqueue, reps), step_s = bench_median(t_decode, reps);
    /* The device's time for a step, between markers before its first
     * launch and after its last, and the median step's host time against
     * it: far under 1 when the device, not the host, sets the pace. */
    const double device_s = bench_median(steps.device_s, steps.n);
    const double host_over_device = bench_median(steps.host_s, steps.n) / device_s;

    /* Batched decode: every sequence holds the same prompt (prefilled once),
     * then each step decodes one token of each, with logits for all, at the
     * same positions as the single stream. */
    double batch_tps = 0;
    if (batch > 1) {
        for (int s = 1; s < batch; s++) {
            for (int i = 0; i < prompt; i++)
                seq[i] = s;
            b.n_tokens = prompt;
            b.tokens = tokens;
            b.token_pos = pos;
            last = prompt - 1;
            if (counted_forward(model, be, &b, &probe, NULL, NULL) != PV_OK)
                return fail("batch prefill");
        }
        double t_batch[16];
        for (int r = 0; r <= reps; r++) {
            double t0 = bench_now_s();
            for (int i = prompt; i < ctx; i++) {
                for (int s = 0; s < batch; s++) {
                    step_tokens[s] = tokens[i];
                    step_seq[s] = s;
                    step_pos[s] = i;
                    step_rows[s] = s;
                }
                pv_llama_batch d = b;
                d.n_tokens = batch;
                d.tokens = step_tokens;
                d.token_seq = step_seq;
                d.token_pos = step_pos;
                d.n_logits = batch < lo.max_logit_rows ? batch : lo.max_logit_rows;
                d.logit_rows = step_rows;
                if (counted_forward(model, be, &d, &probe, i == prompt ? &batch_launches : NULL, NULL) != PV_OK)
                    return fail("batch decode");
            }
            if (r > 0)
                t_batch[r - 1] = (bench_now_s() - t0) / decode;
        }
        batch_tps = batch / bench_median(t_batch, reps);
    }
    pv_llama_weight_bytes wb;
    pv_llama_weight_bytes_of(model, &wb);

    /* Bounds from this run's GEMM peak and memory bandwidth. */
    const double q_dim = (double)hp->n_heads * hp->head_dim, kv_dim = (double)hp->n_kv_heads * hp->head_dim;
    const double layer_params = hp->n_embd * (2 * q_dim + 2 * kv_dim) + 3.0 * hp->n_embd * hp->n_ff;
    const double weight_params = hp->n_layers * layer_params + (double)hp->n_embd * hp->n_vocab;
    const double flops_per_token = 2.0 * weight_params;
    double gemm_best_after = gemm_peak(be, hp, prompt, reps, &gemm_rate_after);
    gemm_best = gemm_best_after > gemm_best ? gemm_best_after : gemm_best;
    gemm_rate = gemm_rate_after > gemm_rate ? gemm_rate_after : gemm_rate;
    bench_cpu cpu;
    bench_cpu_detect(&cpu);
    bench_stream after;
    if (bench_stream_measure(&after, 10) != 0) {
        fprintf(stderr, "bench-model: cannot allocate the STREAM arrays\n");
        return 1;
    }
    bench_stream_merge(&mem, &after);
    /* A device's reference is its own copy bandwidth, not the host's STREAM. */
    const int on_device = strcmp(backend, "cpu") != 0;
    bench_device_copy dev = {0};
    if (on_device && bench_device_copy_measure(be, 10, &dev) != PV_OK)
        return fail("device copy");
    const double read_best = on_device ? dev.copy.best : mem.read.best;
    const char *read_name = on_device ? "device copy" : "STREAM read";
    double prefill_bound = gemm_best * 1e9 / flops_per_token;
    /* A decode step reads the weights and the K and V rows of its context:
     * positions prompt .. ctx - 1 attend over prompt + 1 .. ctx rows. */
    const double mean_context = prompt + (decode + 1) / 2.0;
    const double kv_bytes = hp->n_layers * mean_context * 2.0 * kv_dim * (double)pv_dtype_size(kv_dtype);
    const double step_bytes = (double)wb.per_token + kv_bytes;
    double decode_bound = read_best * 1e9 / step_bytes;
    double decode_gbs = decode_tps * step_bytes / 1e9;

    /* For the JSON string: the message's quotes and backslashes as spaces. */
    char graph_failure[256];
    snprintf(graph_failure, sizeof graph_failure, "%s", pv_llama_graph_failure(model));
    for (char *ch = graph_failure; *ch; ch++)
        if (*ch == '"' || *ch == '\\' || (unsigned char)*ch < 0x20)
            *ch = ' ';
    if (json) {
        printf("{\"backend\": \"%s\", \"model\": \"%s\", \"prompt_tokens\": %d, \"decode_tokens\": %d, "
               "\"reps\": %d, \"prefill_tps\": %.2f, \"decode_tps\": %.2f, \"gemm_ffn_gflops\": %.2f, "
               "\"gemm_peak_gflops\": %.2f, \"prefill_bound_tps\": %.2f, \"decode_bound_tps\": %.2f,\n"
               " \"weights\": \"%s\", \"weight_bytes_resident\": %" PRIu64 ", \"weight_bytes_file\": %" PRIu64
               ", \"weight_bytes_per_token\": %" PRIu64 ", \"process_rss_after_load\": %" PRIu64
               ", \"kv\": \"%s\", \"kv_bytes_per_token\": %.0f, \"decode_gbs\": %.3f, \"batch\": %d, "
               "\"batch_decode_tps\": %.2f,\n \"decode_host_s\": %.9f, \"decode_step_s\": %.9f, "
               "\"decode_host_fraction\": %.4f, \"decode_device_s\": %.9f, \"decode_host_over_device\": %.4f, "
               "\"decode_bound_reference\": \"%s\",\n"
               " \"fuse\": %d, \"graphs\": %d, \"qmatmul_set\": \"%s\", \"graph_runs\": %" PRIu64
               ", \"graph_replays\": %" PRIu64 ", \"graph_failure\": \"%s\", "
               "\"n_layers\": %u, \"launches\": {",
               backend, model_path, prompt, decode, reps, prefill_tps, decode_tps, gemm_rate, gemm_best,
               prefill_bound, decode_bound, pv_llama_weights_name(weights), wb.resident, wb.file, wb.per_token,
               rss_model, pv_dtype_name(kv_dtype), kv_bytes, decode_gbs, batch, batch_tps, enqueue_s, step_s,
               enqueue_s / step_s, device_s, host_over_device, read_name, fuse, graphs, qmatmul_set, pv_backend_graph_runs(be),
               pv_backend_graph_replays(be), graph_failure, hp->n_layers);
        launch_count_json("prefill", &prefill_launches, hp->n_layers, 0);
        launch_count_json("decode", &decode_launches, hp->n_layers, batch <= 1);
        if (batch > 1)
            launch_count_json("batch_decode", &batch_launches, hp->n_layers, 1);
        printf("},\n \"cpu\": ");
        bench_cpu_json(&cpu);
        printf(",\n \"stream\": ");
        bench_stream_json(&mem);
        if (on_device) {
            printf(",\n \"device_copy\": ");
            bench_device_copy_json(&dev);
        }
        printf("}\n");
    } else {
        printf("model %s on %s (%s), %.1fM weight parameters\n", model_path, backend, be->info.name,
               weight_params / 1e6);
        printf("weights %s: %.1f MB resident, %.1f MB of GGUF tensors (%.2fx); the process held %.1f MB once "
               "the model was loaded\n",
               pv_llama_weights_name(weights), wb.resident / 1e6, wb.file / 1e6,
               (double)wb.resident / (double)wb.file, rss_model / 1e6);
        printf("a decode step reads %.1f MB of weights and %.1f MB of K/V (%s, mean context %.0f tokens)\n",
               wb.per_token / 1e6, kv_bytes / 1e6, pv_dtype_name(kv_dtype), mean_context);
        bench_cpu_print(&cpu);
        bench_stream_print(&mem);
        if (on_device)
            bench_device_copy_print(&dev);
        printf("GEMM f32 through the backend: %d x %u x %u (FFN) %.1f GFLOP/s; peak (best of it and "
               "512..2048 square) %.1f GFLOP/s",
               prompt, hp->n_ff, hp->n_embd, gemm_rate, gemm_best);
        if (cpu.peak_gflops > 0)
            printf(", %.2f of the nominal FMA peak", gemm_best / cpu.peak_gflops);
        printf("\nbounds: prefill = GEMM peak / %.0f MFLOP per token; decode = %s (best) / %.1f MB "
               "read per step\n",
               flops_per_token / 1e6, read_name, step_bytes / 1e6);
        printf("launches with fusions %s: per step, per layer (steady state) and outside the %u layers\n",
               fuse ? "on" : "off", hp->n_layers);
        printf("%-26s %12s %12s %10s %9s %9s %9s\n", "measure", "tokens/s", "bound", "of bound", "launches",
               "/layer", "outside");
        const launch_count *counts[3] = {&prefill_launches, &decode_launches, &batch_launches};
        char per_layer[3][16], outside[3][16];
        for (int k = 0; k < 3; k++) {
            snprintf(per_layer[k], sizeof per_layer[k], counts[k]->per_layer < 0 ? "n/a" : "%.1f",
                     counts[k]->per_layer);
            snprintf(outside[k], sizeof outside[k], counts[k]->per_layer < 0 ? "n/a" : "%.1f",
                     (double)counts[k]->per_step - hp->n_layers * counts[k]->per_layer);
        }
        printf("%-26s %12.1f %12.1f %9.0f%% %9" PRIu64 " %9s %9s\n", "prefill (one batch)", prefill_tps,
               prefill_bound, 100 * prefill_tps / prefill_bound, prefill_launches.per_step, per_layer[0], outside[0]);
        printf("%-26s %12.1f %12.1f %9.0f%% %9" PRIu64 " %9s %9s\n", "decode (single stream)", decode_tps,
               decode_bound, 100 * decode_tps / decode_bound, decode_launches.per_step, per_layer[1], outside[1]);
        if (batch > 1)
            printf("%-26s %12.1f %12s %10s %9" PRIu64 " %9s %9s   (%.2fx single stream)\n", "decode (batch)",
                   batch_tps, "", "", batch_launches.per_step, per_layer[2], outside[2], batch_tps / decode_tps);
        printf("decode streams %.2f GB/s of weights and K/V: %.0f%% of the %s bandwidth (best %.1f GB/s)\n",
               decode_gbs, 100 * decode_gbs / read_best, read_name, read_best);
        printf("decode step (single stream): %.1f us on the host enqueueing, %.1f us in all (%.0f%%); "
               "graphs %s, %" PRIu64 " run, %" PRIu64 " of them replayed without recording\n",
               enqueue_s * 1e6, step_s * 1e6, 100 * enqueue_s / step_s,
               !graphs ? "off" : pv_backend_graphs(be) ? "on" : "not on this backend", pv_backend_graph_runs(be),
               pv_backend_graph_replays(be));
        if (qmatmul_set[0])
            printf("qmatmul kernel set: %s\n", qmatmul_set);
        printf("decode step on the device's clock (timing markers around it%s): %.1f us; the median step's host "
               "time / device time %.2f\n",
               on_device ? "" : "; the CPU's are the host's clock around the call", device_s * 1e6,
               host_over_device);
        if (graph_failure[0])
            printf("the last step that did not run as a graph: %s\n", graph_failure);
        printf("(timings: median of %d after a warm-up)\n", reps);
    }
    free(tables);
    free(tokens);
    free(seq);
    free(pos);
    free(step_tokens);
    free(step_seq);
    free(step_pos);
    free(step_rows);
    free(steps.host_s);
    free(steps.device_s);
    pv_marker_free(steps.start);
    pv_marker_free(steps.end);
    pv_buffer_free(pool);
    pv_llama_free(model);
    pv_backend_free(be);
    return 0;
}
