/* pensieve-tune: tunes the kernel parameters and fits the eviction cost
 * model of one backend device, and writes both to the device profile file
 * (include/pensieve/profile.h).
 *
 * On a backend that runs the portable kernels (OpenCL, CUDA) it first
 * searches each shape bucket's candidate parameter sets (tune-kernels.c),
 * each checked against the CPU backend before it is timed, and keeps the
 * fastest; the cost model is then measured with those sets.
 *
 * It times one chunk's attention at one layer over contexts of 2^k tokens
 * through the real attention kernel over the paged pool, fits
 * alpha * l + beta to those times (pv_cost_fit_linear), checks the fit at
 * contexts between the powers of two (held out of the fit), and takes the
 * chunk's other work per layer (c) from the real model's forward pass. */
#include "config.h"

#include "tuning/tune.h"

#include <pensieve/gguf.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct tune_options {
    const char *backend, *model, *shape, *out, *plot, *kernels;
    int device, quick, json, chunk_tokens, repeats;
    int64_t max_context;
    pv_dtype kv_dtype;
} tune_options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pensieve-tune [options]\n"
            "  --backend NAME       cpu, opencl or cuda (default cpu)\n"
            "  --device N           device index (default 0)\n"
            "  --model PATH         GGUF file whose shape is measured (default: scripts/get-model's)\n"
            "  --shape H,KV,D,L     heads, kv heads, head dim, layers of a synthetic model instead\n"
            "  --out FILE           profile file (default $PV_PROFILE, else\n"
            "                       $XDG_CONFIG_HOME/pensieve/profiles.ini or ~/.config/...)\n"
            "  --chunk N            tokens per chunk (default 32)\n"
            "  --kv f16|f32         KV pool type (default f16)\n"
            "  --max-context N      longest context measured (default 16384, or the model's)\n"
            "  --repeats N          timed runs per point (default 15; --quick 5)\n"
            "  --kernels LIST       kernel families to search: all (default), none, or a comma list of\n"
            "                       attention, gather, qmatmul, recompute (OpenCL and CUDA only)\n"
            "  --quick              contexts up to 1024, 5 repeats: seconds, for tests\n"
            "  --json               print the profile as JSON instead of the table\n"
            "  --plot FILE.png      measured points and the fitted line (gnuplot)\n");
}

static int parse_options(int argc, char **argv, tune_options *o)
{
    *o = (tune_options){.backend = "cpu", .kernels = "all", .chunk_tokens = 32, .kv_dtype = PV_F16,
                        .max_context = 16384};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (strcmp(a, "--quick") == 0)
            o->quick = 1, takes = 0;
        else if (strcmp(a, "--json") == 0)
            o->json = 1, takes = 0;
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (!v) {
            fprintf(stderr, "pensieve-tune: %s needs a value (or is unknown)\n", a);
            return -1;
        } else if (strcmp(a, "--backend") == 0)
            o->backend = v;
        else if (strcmp(a, "--model") == 0)
            o->model = v;
        else if (strcmp(a, "--shape") == 0)
            o->shape = v;
        else if (strcmp(a, "--out") == 0)
            o->out = v;
        else if (strcmp(a, "--plot") == 0)
            o->plot = v;
        else if (strcmp(a, "--kernels") == 0)
            o->kernels = v;
        else if (strcmp(a, "--kv") == 0 && (strcmp(v, "f16") == 0 || strcmp(v, "f32") == 0))
            o->kv_dtype = strcmp(v, "f16") == 0 ? PV_F16 : PV_F32;
        else {
            char *end;
            long n = strtol(v, &end, 10);
            int bad = *end != '\0' || end == v;
            if (strcmp(a, "--device") == 0 && !bad && n >= 0 && n < 64)
                o->device = (int)n;
            else if (strcmp(a, "--chunk") == 0 && !bad && n >= 1 && n <= 4096)
                o->chunk_tokens = (int)n;
            else if (strcmp(a, "--repeats") == 0 && !bad && n >= 3 && n <= 1000)
                o->repeats = (int)n;
            else if (strcmp(a, "--max-context") == 0 && !bad && n >= 64 && n <= (1L << 24))
                o->max_context = n;
            else {
                fprintf(stderr,
                        "pensieve-tune: %s '%s' is unknown or out of range (--device 0-63, --chunk 1-4096, "
                        "--repeats 3-1000, --max-context 64-16777216, --kv f16|f32)\n",
                        a, v);
                return -1;
            }
        }
        i += takes;
    }
    if (o->quick && o->max_context > 1024)
        o->max_context = 1024;
    if (!o->repeats)
        o->repeats = o->quick ? 5 : 15;
    return 0;
}

/* The model whose shape is measured: --shape builds a synthetic one with
 * those heads (width heads x head dim, FFN 4x wider), else the GGUF file. */
static pv_status open_model(const tune_options *o, pv_backend *be, pv_llama **model)
{
    pv_gguf g;
    uint8_t *image = NULL;
    pv_status st;
    if (o->shape) {
        unsigned h, kv, d, l;
        char extra;
        if (sscanf(o->shape, "%u,%u,%u,%u%c", &h, &kv, &d, &l, &extra) != 4 || h == 0 || kv == 0 || h % kv ||
            d == 0 || d > 256 || l == 0 || l > 1024 || h > 256 || (uint64_t)h * d % 32)
            return pv_error(PV_ERR_INVALID_ARG,
                            "--shape '%s': want heads,kv_heads,head_dim,layers with kv_heads dividing heads, "
                            "head_dim 1-256, heads x head_dim a multiple of 32, at most 1024 layers",
                            o->shape);
        pv_synth_config sc;
        pv_synth_config_default(&sc);
        sc.n_heads = h;
        sc.n_kv_heads = kv;
        sc.n_embd = h * d;
        sc.n_ff = 4 * h * d;
        sc.n_layers = l;
        sc.n_ctx = (uint32_t)(o->max_context * 2 > 4096 ? o->max_context * 2 : 4096);
        uint64_t size = 0;
        st = pv_synth_to_memory(&sc, &image, &size);
        if (st == PV_OK)
            st = pv_gguf_init_memory(&g, image, size);
    } else {
        char path[4096];
        st = o->model ? (snprintf(path, sizeof path, "%s", o->model), PV_OK)
                      : pv_default_model_path(path, sizeof path);
        if (st == PV_OK && access(path, R_OK) != 0)
            st = pv_error(PV_ERR_IO, "no model at %s: run scripts/get-model, or pass --model or --shape", path);
        if (st == PV_OK)
            st = pv_gguf_init(&g, path);
    }
    if (st != PV_OK) {
        free(image);
        return st;
    }
    pv_llama_options lo;
    pv_llama_options_default(&lo);
    lo.kv_dtype = o->kv_dtype;
    lo.chunk_tokens = o->chunk_tokens;
    lo.max_batch_tokens = o->chunk_tokens;
    st = pv_llama_init(model, be, &g, &lo);
    pv_gguf_free(&g);
    free(image);
    return st;
}

/* A bar on stderr when it is a terminal; nothing otherwise. */
static void progress(void *ctx, int done, int total, const char *what)
{
    (void)ctx;
    if (!isatty(STDERR_FILENO))
        return;
    const int width = 30, filled = total ? done * width / total : width;
    fprintf(stderr, "\r[%.*s%*s] %d/%d %-28s", filled, "##############################", width - filled, "",
            done, total, what);
    if (done == total)
        fputc('\n', stderr);
    fflush(stderr);
}

/* --kernels: a mask of 1 << tune_family. */
static int parse_families(const char *text, unsigned *mask)
{
    *mask = 0;
    if (strcmp(text, "none") == 0)
        return 0;
    if (strcmp(text, "all") == 0) {
        *mask = (1u << TUNE_FAMILY_COUNT) - 1;
        return 0;
    }
    const char *at = text;
    while (*at) {
        const size_t len = strcspn(at, ",");
        int f = 0;
        while (f < TUNE_FAMILY_COUNT && !(strlen(tune_family_name((tune_family)f)) == len &&
                                          strncmp(tune_family_name((tune_family)f), at, len) == 0))
            f++;
        if (f == TUNE_FAMILY_COUNT)
            return -1;
        *mask |= 1u << f;
        at += len + (at[len] == ',');
    }
    return *mask ? 0 : -1;
}

static void search_progress(void *ctx, const char *what)
{
    int *tried = ctx;
    ++*tried;
    if (!isatty(STDERR_FILENO))
        return;
    fprintf(stderr, "\rkernel search: %3d tried, now %-60.60s", *tried, what);
    fflush(stderr);
}

/* The kernel sets: those of the device's section in the file at path whose
 * family is not searched now are kept (and set in s->be, so the cost model
 * is measured with them); the searched buckets get the search's best. All
 * end up in p->kernels. */
static pv_status kernel_stage(const tune_options *o, const char *path, const tune_setup *s, unsigned families,
                              pv_profile *p, tune_bucket_result *res, int *n_res)
{
    *n_res = 0;
    if (!pv_backend_kernels_tunable(s->be))
        return strcmp(o->kernels, "all") == 0 || strcmp(o->kernels, "none") == 0
                   ? PV_OK
                   : pv_error(PV_ERR_INVALID_ARG, "--kernels %s: the %s backend has no tunable kernels", o->kernels,
                              o->backend);
    pv_status st = tune_keep_kernel_sets(path, s->be, families, p);
    if (st != PV_OK || !families)
        return st;
    pv_backend *ref = NULL;
    if ((st = pv_backend_init(&ref, "cpu", 0)) != PV_OK)
        return st;
    tune_setup search = *s;
    search.repeats = o->quick ? 3 : 7;
    int tried = 0;
    st = tune_kernels(&search, ref, families, o->quick, res, n_res, search_progress, &tried);
    if (isatty(STDERR_FILENO) && tried)
        fputc('\n', stderr);
    pv_backend_free(ref);
    for (int i = 0; st == PV_OK && i < *n_res; i++) {
        struct pv_profile_kernel *k = &p->kernels[p->n_kernels++];
        _Static_assert(sizeof k->bucket == sizeof res->bucket && sizeof k->params == sizeof res->candidates->params,
                       "a profile's kernel set holds a search result");
        memcpy(k->bucket, res[i].bucket, sizeof k->bucket);
        memcpy(k->params, res[i].candidates[res[i].best].params, sizeof k->params);
        k->line = 0;
    }
    return st;
}

static int imax(int a, int b)
{
    return a > b ? a : b;
}

static void print_kernels(const tune_bucket_result *res, int n, int repeats)
{
    if (!n)
        return;
    int staged = 0; /* qmatmul searched */
    for (int i = 0; i < n; i++)
        staged |= res[i].candidates[0].timed != TUNE_ALL;
    printf("\nkernel search: every candidate checked against the cpu backend, then timed (median of %d runs);\n%s"
           "the default and the fastest timed again on the whole workload, alternating, for the speedup;\n"
           "the default is kept (*) unless the fastest gains %.0f%% in those runs\n",
           repeats,
           staged ? "qmatmul in two stages: its decode parameters on its decode products at the default PV_GEMM,\n"
                    "then each PV_GEMM on its prefill product with the fastest of those (tried: both stages);\n"
                  : "",
           100 * TUNE_MIN_GAIN);
    /* columns as wide as their widest entry: qmatmul's sets name 6 parameters */
    int w_bucket = (int)strlen("bucket"), w_what = (int)strlen("workload"), w_params = (int)strlen("default");
    for (int i = 0; i < n; i++) {
        w_bucket = imax(w_bucket, (int)strlen(res[i].bucket));
        w_what = imax(w_what, (int)strlen(res[i].what));
        w_params = imax(w_params, imax((int)strlen(res[i].default_params),
                                       (int)strlen(res[i].candidates[res[i].best].params)));
    }
    printf("%-*s %-*s %5s %5s  %-*s %10s  %-*s %10s %7s\n", w_bucket, "bucket", w_what, "workload", "tried",
           "wrong", w_params, "default", "s", w_params, "best", "s", "speedup");
    for (int i = 0; i < n; i++) {
        const tune_bucket_result *r = &res[i];
        int wrong = 0;
        for (int c = 0; c < r->n_candidates; c++)
            wrong += r->candidates[c].rejected;
        printf("%-*s %-*s %5d %5d  %-*s %10.4g  %-*s %10.4g %6.2fx%s\n", w_bucket, r->bucket, w_what, r->what,
               r->n_candidates, wrong, w_params, r->default_params, r->default_s, w_params,
               r->candidates[r->best].params, r->best_s, r->default_s / r->best_s, r->kept_default ? " *" : "");
        for (int c = 0; c < r->n_candidates; c++)
            if (r->candidates[c].rejected)
                printf("    rejected %s: error %.3g against the cpu backend (limit %g)\n", r->candidates[c].params,
                       r->candidates[c].error, r->candidates[c].limit);
    }
}

static json_t *number_or_null(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

static json_t *kernels_json(const tune_bucket_result *res, int n)
{
    json_t *list = json_array();
    for (int i = 0; i < n; i++) {
        const tune_bucket_result *r = &res[i];
        json_t *cands = json_array();
        for (int c = 0; c < r->n_candidates; c++) {
            const tune_candidate *k = &r->candidates[c];
            json_array_append_new(cands, json_pack("{s:s,s:s,s:o,s:f,s:b,s:o,s:o}", "params", k->params, "timed",
                                                   tune_products_name(k->timed), "error", number_or_null(k->error),
                                                   "limit", k->limit, "rejected", k->rejected, "seconds",
                                                   k->rejected ? json_null() : json_real(k->seconds), "spread",
                                                   k->rejected ? json_null() : json_real(k->spread)));
        }
        json_array_append_new(list, json_pack("{s:s,s:s,s:f,s:s,s:o,s:s,s:f,s:o,s:b,s:o}", "bucket", r->bucket,
                                              "workload", r->what, "limit", r->limit, "default", r->default_params,
                                              "default_s", number_or_null(r->default_s), "best",
                                              r->candidates[r->best].params, "best_s", r->best_s, "speedup",
                                              number_or_null(r->default_s / r->best_s), "kept_default",
                                              r->kept_default, "candidates", cands));
    }
    return list;
}

static pv_status plot(const char *file, const pv_profile *p, const pv_cost_point *held, int n_held)
{
    FILE *g = popen("gnuplot 2>&1", "w");
    if (!g)
        return pv_error(PV_ERR_IO, "--plot: cannot run gnuplot");
    fprintf(g,
            "set terminal pngcairo size 900,600\nset output '%s'\n"
            "set title 'pensieve-tune: one chunk (%u tokens) of attention at one layer, %s: %s'\n"
            "set xlabel 'context (tokens)'\nset ylabel 'seconds'\nset logscale xy\nset key left top\n"
            "plot '-' with points pt 7 title 'measured (fit)', '-' with points pt 6 title 'held out', "
            "%.9g*x+%.9g with lines title 'alpha*l + beta (R^2 %.4f)'\n",
            file, p->chunk_tokens, p->backend, p->device, p->alpha, p->beta, p->r2);
    for (uint32_t i = 0; i < p->n_points; i++)
        fprintf(g, "%g %g\n", p->points[i].context, p->points[i].seconds);
    fputs("e\n", g);
    for (int i = 0; i < n_held; i++)
        fprintf(g, "%g %g\n", held[i].context, held[i].seconds);
    fputs("e\n", g);
    const int rc = pclose(g);
    if (rc != 0)
        return pv_error(PV_ERR_IO, "--plot %s: gnuplot failed (exit status %d; is gnuplot installed?)", file, rc);
    return PV_OK;
}

static void print_json(const pv_profile *p, const char *path, const pv_cost_point *held, int n_held,
                       const tune_timing *forward, const tune_bucket_result *kernels, int n_kernels)
{
    json_t *points = json_array(), *heldout = json_array();
    for (uint32_t i = 0; i < p->n_points; i++)
        json_array_append_new(points, json_pack("{s:f,s:f,s:f}", "context", p->points[i].context, "seconds",
                                                p->points[i].seconds, "spread", p->points[i].spread));
    for (int i = 0; i < n_held; i++)
        json_array_append_new(heldout, json_pack("{s:f,s:f,s:f,s:f}", "context", held[i].context, "seconds",
                                                 held[i].seconds, "spread", held[i].spread, "predicted",
                                                 p->alpha * held[i].context + p->beta));
    json_t *root = json_pack("{s:s,s:s,s:s,s:f,s:f,s:f,s:f,s:f,s:i,s:s,s:f,s:o,s:o,s:s,s:s}", "profile", path,
                             "backend", p->backend, "device", p->device, "alpha", p->alpha, "beta", p->beta, "c",
                             p->c, "r2", p->r2, "heldout_error", p->heldout_error, "chunk_tokens",
                             (int)p->chunk_tokens, "shape", p->shape, "forward_per_layer_s", forward->median,
                             "points", points, "heldout", heldout, "date", p->date, "version", p->version);
    json_object_set_new(root, "kernels", kernels_json(kernels, n_kernels));
    char *text = json_dumps(root, JSON_INDENT(2));
    if (text)
        puts(text);
    free(text);
    json_decref(root);
}

static int fail(const char *what, pv_status st)
{
    fprintf(stderr, "pensieve-tune: %s: %s (%s)\n", what, pv_last_error(), pv_status_str(st));
    return 1;
}

int main(int argc, char **argv)
{
    tune_options o;
    unsigned families = 0;
    if (parse_options(argc, argv, &o) != 0) {
        usage(stderr);
        return 2;
    }
    if (parse_families(o.kernels, &families) != 0) {
        fprintf(stderr, "pensieve-tune: --kernels '%s': want all, none, or a comma list of attention, gather, "
                        "qmatmul, recompute\n",
                o.kernels);
        return 2;
    }
    pv_profile p;
    memset(&p, 0, sizeof p);
    char path[4096];
    pv_status st = o.out ? (snprintf(path, sizeof path, "%s", o.out), PV_OK)
                         : pv_profile_default_path(path, sizeof path);
    if (st != PV_OK)
        return fail("--out", st);
    pv_backend *be = NULL;
    if ((st = pv_backend_init(&be, o.backend, o.device)) != PV_OK)
        return fail("--backend", st);
    pv_llama *model = NULL;
    if ((st = open_model(&o, be, &model)) != PV_OK) {
        pv_backend_free(be);
        return fail("model", st);
    }
    tune_setup s;
    tune_setup_init(&s, be, model, o.repeats);
    static tune_bucket_result kernels[TUNE_MAX_BUCKETS];
    int n_kernels = 0;
    if ((st = kernel_stage(&o, path, &s, families, &p, kernels, &n_kernels)) != PV_OK) {
        pv_llama_free(s.model);
        pv_backend_free(be);
        return fail("kernel search", st);
    }

    tune_cost_report rep;
    st = tune_cost_model(&s, o.max_context, &p, &rep, progress, NULL);
    pv_llama_free(s.model);
    pv_backend_free(be);
    if (st != PV_OK)
        return fail("measuring", st);
    const pv_cost_point *held = rep.held;
    const int n_held = rep.n_held;
    if ((st = pv_profile_save(path, &p)) != PV_OK)
        return fail("--out", st);
    if (o.plot && (st = plot(o.plot, &p, held, n_held)) != PV_OK)
        return fail("plot", st);

    if (o.json) {
        print_json(&p, path, held, n_held, &rep.forward, kernels, n_kernels);
        return 0;
    }
    printf("pensieve-tune: %s device %d (%s), shape %s (heads, kv heads, head dim, layers), chunk %d tokens, "
           "KV %s, median of %d runs\n",
           o.backend, o.device, p.device, p.shape, o.chunk_tokens, pv_dtype_name(o.kv_dtype), o.repeats);
    printf("%10s %14s %8s %14s %9s\n", "context", "attention s", "spread", "fit s", "error");
    for (uint32_t i = 0; i < p.n_points; i++)
        printf("%10.0f %14.4g %7.1f%% %14.4g %8.1f%%\n", p.points[i].context, p.points[i].seconds,
               100 * p.points[i].spread, pv_cost_fit_predict(&rep.fit, p.points[i].context),
               100 * (pv_cost_fit_predict(&rep.fit, p.points[i].context) / p.points[i].seconds - 1));
    for (int i = 0; i < n_held; i++)
        printf("%10.0f %14.4g %7.1f%% %14.4g %8.1f%%  (held out)\n", held[i].context, held[i].seconds,
               100 * held[i].spread, pv_cost_fit_predict(&rep.fit, held[i].context),
               100 * (pv_cost_fit_predict(&rep.fit, held[i].context) / held[i].seconds - 1));
    printf("forward pass of one chunk: %.4g s per layer; its attention at context 0: %.4g s\n", rep.forward.median,
           rep.attention0.median);
    printf("alpha %.4g s/token, beta %.4g s, c %.4g s; R^2 %.4f, held-out mean error %.1f%%\n", p.alpha, p.beta,
           p.c, p.r2, 100 * p.heldout_error);
    printf("attention share of a chunk's cost: %.2f at 1K context, %.2f at 4K (paper, Fig. 4: 0.1 and 0.38 of "
           "the other work)\n",
           (p.alpha * 1024 + p.beta) / p.c, (p.alpha * 4096 + p.beta) / p.c);
    print_kernels(kernels, n_kernels, o.quick ? 3 : 7);
    printf("profile [%s: %s] written to %s\n", p.backend, p.device, path);
    return 0;
}
