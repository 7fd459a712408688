/* The applications' shared set-up: option values, the serving stack and
 * stop signals. */
#include "apps/setup.h"

#include <pensieve/gguf.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int app_opt_long(const char *prog, const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "%s: %s '%s' is not an integer in [%ld, %ld]\n", prog, opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int app_opt_float(const char *prog, const char *opt, const char *s, double lo, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: %s '%s' is not a number in [%g, %g]\n", prog, opt, s, lo, hi);
        return -1;
    }
    *out = (float)v;
    return 0;
}

int app_opt_weights(const char *prog, const char *s, pv_llama_weights *out)
{
    if (strcmp(s, "native") == 0)
        *out = PV_LLAMA_WEIGHTS_NATIVE;
    else if (strcmp(s, "f32") == 0)
        *out = PV_LLAMA_WEIGHTS_F32;
    else {
        fprintf(stderr, "%s: --weights '%s' is neither native nor f32\n", prog, s);
        return -1;
    }
    return 0;
}

int app_stack_option(const char *prog, const char *name, const char *value, app_stack_options *o)
{
    if (strcmp(name, "model") == 0)
        o->model = value;
    else if (strcmp(name, "synthetic") == 0)
        o->synthetic = 1;
    else if (strcmp(name, "backend") == 0)
        o->backend = value;
    else if (strcmp(name, "config") == 0)
        o->config = value;
    else if (strcmp(name, "profile") == 0)
        o->profile = value;
    else if (strcmp(name, "decode-steps") == 0) {
        long steps = 0;
        if (app_opt_long(prog, "--decode-steps", value, 0, PV_ENGINE_MAX_DECODE_STEPS, &steps))
            return -1;
        o->decode_steps = (int)steps;
    } else if (strcmp(name, "device-mem") == 0)
        return app_opt_size(prog, "--device-mem", value, &o->device_bytes) ? -1 : 1;
    else if (strcmp(name, "host-mem") == 0)
        return app_opt_size(prog, "--host-mem", value, &o->host_bytes) ? -1 : 1;
    else if (strcmp(name, "mode") == 0) {
        if (pv_engine_mode_parse(value, &o->mode) != PV_OK) {
            fprintf(stderr, "%s: --mode '%s' is not pensieve, gpu-only or stateless\n", prog, value);
            return -1;
        }
    } else if (strcmp(name, "policy") == 0) {
        if (pv_policy_parse(value, &o->policy) != PV_OK) {
            fprintf(stderr, "%s: --policy '%s' is not pensieve, weighted or lru\n", prog, value);
            return -1;
        }
        o->have_policy = 1;
    } else {
        return 0;
    }
    return 1;
}

int app_stack_options_check(const char *prog, const app_stack_options *o)
{
    if (o->synthetic && o->model) {
        fprintf(stderr, "%s: --model and --synthetic exclude each other\n", prog);
        return -1;
    }
    return 0;
}

int app_opt_size(const char *prog, const char *opt, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = 0;
    if (end != s && *end && !end[1]) {
        switch (*end) {
        case 'k': case 'K': shift = 10; end++; break;
        case 'm': case 'M': shift = 20; end++; break;
        case 'g': case 'G': shift = 30; end++; break;
        case 't': case 'T': shift = 40; end++; break;
        default: break;
        }
    }
    if (end == s || *end || errno || s[0] == '-' || v == 0 || v > (UINT64_MAX >> shift)) {
        fprintf(stderr, "%s: %s '%s' is not a positive size (bytes, or a number with K, M, G or T)\n",
                prog, opt, s);
        return -1;
    }
    *out = (uint64_t)v << shift;
    return 0;
}

static int stack_error(const char *prog, const char *what, pv_status st)
{
    fprintf(stderr, "%s: %s: %s: %s\n", prog, what, pv_status_str(st), pv_last_error());
    return -1;
}

/* The file to load: --model, the synthetic model in memory, or the default
 * path. *image is the synthetic image to free after the model is built. */
static pv_status open_model(app_stack *st, const app_stack_options *o, pv_gguf *g, uint8_t **image)
{
    *image = NULL;
    if (o->synthetic) {
        pv_synth_config sc;
        pv_synth_config_default(&sc);
        /* Room for a few turns of a conversation; the default 256 fills in two. */
        sc.n_ctx = o->synthetic_n_ctx ? o->synthetic_n_ctx : 2048;
        uint64_t size;
        pv_status s = pv_synth_to_memory(&sc, image, &size);
        if (s != PV_OK)
            return s;
        snprintf(st->model_name, sizeof st->model_name, "the synthetic test model");
        snprintf(st->model_id, sizeof st->model_id, "synthetic");
        return pv_gguf_init_memory(g, *image, size);
    }
    char path[4096];
    if (o->model)
        snprintf(path, sizeof path, "%s", o->model);
    else {
        pv_status s = pv_default_model_path(path, sizeof path);
        if (s != PV_OK)
            return s;
        if (access(path, R_OK) != 0)
            return pv_error(PV_ERR_IO, "no model at %s: run scripts/get-model, or pass --model PATH "
                            "(or --synthetic)", path);
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(st->model_name, sizeof st->model_name, "%.200s", base);
    size_t n = strlen(base);
    if (n > 5 && strcmp(base + n - 5, ".gguf") == 0)
        n -= 5;
    snprintf(st->model_id, sizeof st->model_id, "%.*s", (int)(n < 200 ? n : 200), base);
    return pv_gguf_init(g, path);
}

/* One line: the profile in use and its constants, or that there is none. */
static void say_profile(const app_stack *st, const app_stack_options *o, const char *prog, const pv_cache_config *cc,
                        const pv_engine_profile_use *use)
{
    if (use->applied)
        fprintf(stderr, "%s: profile %s [%s: %s] (%s): alpha %.3g s/token, beta %.3g s, c %.3g s; %d tuned kernel "
                "sets\n",
                prog, use->path, use->profile.backend, use->profile.device,
                use->profile.date[0] ? use->profile.date : "undated", cc->alpha, cc->beta, cc->c, use->kernel_sets);
    else if (!use->path[0])
        fprintf(stderr, "%s: no profile location (HOME unset): default cost model\n", prog);
    else
        fprintf(stderr, "%s: no tuned profile for this %s device: default cost model (%s)\n", prog,
                st->be->ops->name, o->tune_hint ? o->tune_hint : "pensieve-tune fits one");
}

/* Cache settings: defaults, then the device's profile, then --config, then
 * the options; with `say`, one line on the profile. The profile is per
 * device: the backend is open. */
static int stack_cache_config(app_stack *st, const app_stack_options *o, const char *prog, int say,
                              pv_cache_config *cc, pv_engine_profile_use *use)
{
    pv_status s = pv_cache_config_defaults(cc);
    if (s == PV_OK && (s = pv_engine_profile_apply(st->be, o->profile, cc, use)) != PV_OK)
        return stack_error(prog, "--profile", s);
    if (say)
        say_profile(st, o, prog, cc, use);
    const pv_cache_config profiled = *cc;
    if (o->config && (s = pv_cache_config_load(cc, o->config)) != PV_OK)
        return stack_error(prog, "--config", s);
    /* Chunks of another size than the profile was scaled to: scale again,
     * unless the file set the constants itself. */
    if (use->applied && cc->chunk_tokens != profiled.chunk_tokens && cc->alpha == profiled.alpha &&
        cc->beta == profiled.beta && cc->c == profiled.c && (s = pv_profile_apply(&use->profile, cc)) != PV_OK)
        return stack_error(prog, "--profile", s);
    if (o->have_policy)
        cc->policy = o->policy;
    if (o->device_bytes)
        cc->device_bytes = o->device_bytes;
    if (o->host_bytes)
        cc->host_bytes = o->host_bytes;
    return 0;
}

static int stack_engine(app_stack *st, const app_stack_options *o, const char *prog, const pv_cache_config *cc)
{
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    ec.mode = o->mode;
    ec.idle_timeout_s = o->idle_timeout_s;
    ec.prefix_sharing = !o->no_prefix_sharing;
    ec.decode_steps = o->decode_steps;
    ec.clock = o->clock;
    ec.clock_ctx = o->clock_ctx;
    pv_status s = pv_engine_init(&st->engine, st->be, st->model, &st->tok, cc, &ec);
    return s == PV_OK ? 0 : stack_error(prog, "engine", s);
}

int app_stack_init(app_stack *st, const app_stack_options *o, const char *prog)
{
    memset(st, 0, sizeof *st);
    pv_status s = pv_backend_init(&st->be, o->backend, 0);
    if (s != PV_OK)
        return stack_error(prog, "--backend", s);
    /* Once a process: a program that builds several stacks (pensieve-bench,
     * a stack per mode) has one device and one profile. */
    static int said;
    const int say = !said;
    said = 1;
    pv_cache_config cc;
    pv_engine_profile_use use;
    if (stack_cache_config(st, o, prog, say, &cc, &use) != 0)
        return -1;
    st->policy = cc.policy;

    pv_gguf g;
    uint8_t *image;
    if ((s = open_model(st, o, &g, &image)) != PV_OK) {
        free(image);
        return stack_error(prog, "model", s);
    }
    pv_llama_options lo;
    pv_llama_options_default(&lo);
    lo.kv_dtype = o->kv_dtype;
    lo.weights = o->weights;
    /* The model's slots are the cache's chunks: a chunk size from --config
     * must reach the model, which the engine takes it from. */
    lo.chunk_tokens = (int32_t)cc.chunk_tokens;
    const char *what = "tokenizer";
    if ((s = pv_tokenizer_init(&st->tok, &g)) == PV_OK) {
        st->have_tok = 1;
        what = "model";
        s = pv_llama_init(&st->model, st->be, &g, &lo);
    }
    pv_gguf_free(&g);
    free(image);
    if (s != PV_OK)
        return stack_error(prog, what, s);
    const pv_llama_hparams *hp = pv_llama_hparams_of(st->model);
    char shape[64];
    snprintf(shape, sizeof shape, "%u,%u,%u,%u", hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->n_layers);
    if (say && use.applied && use.profile.shape[0] && strcmp(shape, use.profile.shape) != 0)
        fprintf(stderr, "%s: note: the profile was measured on heads,kv_heads,head_dim,layers %s, this model is %s "
                "(pensieve-tune --model or --shape measures it)\n", prog, use.profile.shape, shape);
    return stack_engine(st, o, prog, &cc);
}

int app_stack_restart_engine(app_stack *st, const app_stack_options *o, const char *prog)
{
    pv_cache_config cc;
    pv_engine_profile_use use;
    if (stack_cache_config(st, o, prog, 1, &cc, &use) != 0)
        return -1;
    pv_engine_free(st->engine);
    st->engine = NULL;
    st->policy = cc.policy;
    return stack_engine(st, o, prog, &cc);
}

void app_stack_free(app_stack *st)
{
    pv_engine_free(st->engine);
    pv_llama_free(st->model);
    if (st->have_tok)
        pv_tokenizer_free(&st->tok);
    pv_backend_free(st->be);
    memset(st, 0, sizeof *st);
}

void app_catch_stop_signals(void (*handler)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}
