/* A device profile from measurements (tune.h): the cost model fitted to the
 * times of one chunk's attention and forward pass, and the kernel sets an
 * earlier run left in the device's section. Shared by pensieve-tune and
 * pensieve-chat's /tune. */
#include "config.h"

#include "tuning/tune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void tune_setup_init(tune_setup *s, pv_backend *be, pv_llama *model, int repeats)
{
    const pv_llama_hparams *hp = pv_llama_hparams_of(model);
    const pv_llama_options *lo = pv_llama_options_of(model);
    *s = (tune_setup){.be = be, .model = model, .n_heads = (int32_t)hp->n_heads,
                      .n_kv_heads = (int32_t)hp->n_kv_heads, .head_dim = (int32_t)hp->head_dim,
                      .n_layers = (int32_t)hp->n_layers, .chunk_tokens = lo->chunk_tokens,
                      .kv_dtype = lo->kv_dtype, .warmup = 1, .repeats = repeats};
}

/* One chunk's attention at one context, as a point of the cost curve. */
static pv_status measure_point(const tune_setup *s, int64_t context, const char *label, int done, int total,
                               tune_step_fn step, void *step_ctx, pv_cost_point *out)
{
    if (step) {
        char what[64];
        snprintf(what, sizeof what, "%sattention at %lld", label, (long long)context);
        step(step_ctx, done, total, what);
    }
    tune_timing t;
    pv_status st = tune_attention(s, context, &t);
    if (st == PV_OK)
        *out = (pv_cost_point){(double)context, t.median, t.spread};
    return st;
}

pv_status tune_cost_model(const tune_setup *s, int64_t max_context, pv_profile *p, tune_cost_report *rep,
                          tune_step_fn step, void *step_ctx)
{
    memset(rep, 0, sizeof *rep);
    /* Contexts: the powers of two from one chunk up, for the fit; three
     * quarters of each power above the first, held out to check it. */
    int64_t fit_ctx[PV_PROFILE_MAX_POINTS], held_ctx[PV_PROFILE_MAX_POINTS];
    int n_fit = 0;
    for (int64_t l = s->chunk_tokens; l <= max_context && n_fit < PV_PROFILE_MAX_POINTS; l *= 2) {
        fit_ctx[n_fit++] = l;
        if (l > s->chunk_tokens)
            held_ctx[rep->n_held++] = l * 3 / 4;
    }
    if (n_fit < 2)
        return pv_error(PV_ERR_INVALID_ARG,
                        "tune: contexts up to %lld tokens give %d power(s) of two from the chunk's %d; the fit "
                        "needs two",
                        (long long)max_context, n_fit, s->chunk_tokens);
    const int total = n_fit + rep->n_held + 2;
    int done = 0;
    if (step)
        step(step_ctx, done, total, "forward pass");
    pv_status st = tune_forward_per_layer(s, &rep->forward);
    if (step)
        step(step_ctx, ++done, total, "attention at 0");
    if (st == PV_OK)
        st = tune_attention(s, 0, &rep->attention0);
    for (int i = 0; st == PV_OK && i < n_fit; i++)
        st = measure_point(s, fit_ctx[i], "", ++done, total, step, step_ctx, &p->points[i]);
    for (int i = 0; st == PV_OK && i < rep->n_held; i++)
        st = measure_point(s, held_ctx[i], "held out: ", ++done, total, step, step_ctx, &rep->held[i]);
    if (step)
        step(step_ctx, total, total, "done");
    if (st != PV_OK)
        return st;

    p->n_points = (uint32_t)n_fit;
    if ((st = pv_cost_fit_linear(p->points, p->n_points, &rep->fit)) != PV_OK)
        return st;
    snprintf(p->backend, sizeof p->backend, "%s", s->be->ops->name);
    snprintf(p->device, sizeof p->device, "%s", s->be->info.name);
    snprintf(p->shape, sizeof p->shape, "%d,%d,%d,%d", s->n_heads, s->n_kv_heads, s->head_dim, s->n_layers);
    p->alpha = rep->fit.alpha;
    p->beta = rep->fit.beta;
    p->r2 = rep->fit.r2;
    /* The chunk's other work: the forward pass per layer less its attention
     * (at least a tenth of the pass, should noise put the two close). */
    p->c = fmax(rep->forward.median - rep->attention0.median, 0.1 * rep->forward.median);
    p->chunk_tokens = (uint32_t)s->chunk_tokens;
    double err = 0;
    for (int i = 0; i < rep->n_held; i++)
        err += fabs(pv_cost_fit_predict(&rep->fit, rep->held[i].context) - rep->held[i].seconds) /
               rep->held[i].seconds / rep->n_held;
    p->heldout_error = rep->n_held ? err : -1;
    time_t now = time(NULL);
    strftime(p->date, sizeof p->date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    snprintf(p->version, sizeof p->version, "%s", PACKAGE_VERSION);
    return PV_OK;
}

static int bucket_family(const char *bucket)
{
    const size_t len = strcspn(bucket, ".");
    for (int f = 0; f < TUNE_FAMILY_COUNT; f++)
        if (strlen(tune_family_name((tune_family)f)) == len &&
            strncmp(bucket, tune_family_name((tune_family)f), len) == 0)
            return f;
    return -1;
}

pv_status tune_keep_kernel_sets(const char *path, pv_backend *be, unsigned families, pv_profile *p)
{
    if (!pv_backend_kernels_tunable(be))
        return PV_OK;
    pv_profile *old = calloc(1, sizeof *old);
    if (!old)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "tune: no memory for the old profile");
    pv_status st = pv_profile_load(path, be->ops->name, be->info.name, old);
    if (st == PV_ERR_NOT_FOUND || st == PV_ERR_IO) {
        st = PV_OK;
        old->n_kernels = 0;
    }
    for (uint32_t i = 0; st == PV_OK && i < old->n_kernels; i++) {
        const int f = bucket_family(old->kernels[i].bucket);
        if (f >= 0 && (families & (1u << f)))
            continue;
        if (p->n_kernels >= PV_PROFILE_MAX_KERNELS)
            st = pv_error(PV_ERR_FORMAT, "%s: more than %d kernel sets", path, PV_PROFILE_MAX_KERNELS);
        else if (pv_backend_kernel_set(be, old->kernels[i].bucket, old->kernels[i].params) != PV_OK)
            st = pv_error(PV_ERR_FORMAT, "%s:%u: kernel.%s: %s", path, old->kernels[i].line, old->kernels[i].bucket,
                          pv_last_error());
        else
            p->kernels[p->n_kernels++] = old->kernels[i];
    }
    free(old);
    return st;
}
