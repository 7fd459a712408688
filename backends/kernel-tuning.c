/* Tuned kernel parameters per shape bucket (kernel-tuning.h), and the
 * public string API over them (backend.h, "kernel tuning"). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/kernel-tuning.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pv_kernel_tuning_reset(pv_kernel_tuning *t)
{
    memset(t, 0, sizeof *t);
    for (int f = 0; f < PV_KERNEL_FAMILY_COUNT; f++)
        pv_kernel_params_default((pv_kernel_family)f, &t->defaults[f]);
}

static const pv_kparam_spec *param_spec(pv_kernel_family family, pv_kparam param)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(family);
    for (int i = 0; spec && i < spec->n_params; i++)
        if (spec->params[i].param == param)
            return &spec->params[i];
    return NULL;
}

static int listed(const pv_kparam_spec *ps, int value)
{
    for (int v = 0; v < ps->n_values; v++)
        if (ps->values[v] == value)
            return 1;
    return 0;
}

static int above_limit(const pv_kernel_tuning *t, pv_kparam param, int value)
{
    if (!t)
        return 0;
    if (param == PV_KPARAM_GEMM)
        return value > t->max_gemm;
    return param == PV_KPARAM_WG && t->max_work_group > 0 && value > t->max_work_group;
}

pv_status pv_kernel_tuning_default(pv_kernel_tuning *t, pv_kernel_family family, pv_kparam param, int value)
{
    const pv_kparam_spec *ps = param_spec(family, param);
    if (!ps || ps->role == PV_KPARAM_VARIANT || !listed(ps, value))
        return pv_error(PV_ERR_INVALID_ARG, "kernel tuning: %s = %d is not a tuned value of the %s kernels",
                        pv_kparam_define(param), value,
                        pv_kernel_family_spec_of(family) ? pv_kernel_family_spec_of(family)->name : "?");
    int best = -1; /* the largest listed value within the limit, up to `value` */
    for (int v = 0; v < ps->n_values; v++)
        if (ps->values[v] <= value && !above_limit(t, param, ps->values[v]) && ps->values[v] > best)
            best = ps->values[v];
    if (best < 0)
        return pv_error(PV_ERR_UNSUPPORTED, "kernel tuning: no %s of the %s kernels fits the device's limit %d",
                        pv_kparam_define(param), pv_kernel_family_spec_of(family)->name, t->max_work_group);
    t->defaults[family].value[param] = best;
    return PV_OK;
}

void pv_kernel_bucket_of_attention(const pv_attention_args *a, pv_kernel_bucket *out)
{
    memset(out, 0, sizeof *out);
    out->family = PV_KERNEL_ATTENTION;
    out->head_dim = a->head_dim <= 64 ? 64 : a->head_dim <= 128 ? 128 : 256;
    const int32_t ratio = a->n_heads / a->n_kv_heads;
    out->gqa = 1;
    while (out->gqa < ratio && out->gqa < 8)
        out->gqa *= 2;
    out->prefill = a->n_tokens > PV_KERNEL_DECODE_TOKENS;
    int32_t longest = 0;
    for (int32_t i = 0; i < a->n_tokens; i++)
        longest = a->token_pos[i] + 1 > longest ? a->token_pos[i] + 1 : longest;
    out->long_context = longest >= PV_KERNEL_LONG_CONTEXT;
}

static int find_bucket(const pv_kernel_tuning *t, const pv_kernel_bucket *b)
{
    for (int i = 0; t && i < t->n; i++)
        if (memcmp(&t->bucket[i], b, sizeof *b) == 0)
            return i;
    return -1;
}

pv_kernel_params pv_kernel_tuned(const pv_kernel_tuning *t, const pv_kernel_bucket *b)
{
    const int i = find_bucket(t, b);
    if (i >= 0)
        return t->params[i];
    pv_kernel_params p;
    if (t)
        p = t->defaults[b->family];
    else
        pv_kernel_params_default(b->family, &p);
    return p;
}

int pv_qmatmul_group_rounds(const pv_kernel_tuning *t, const pv_qmatmul_args *products, int n, int64_t fused_max_t)
{
    if (n < 1 || products[0].n_tokens > fused_max_t)
        return -1;
    const pv_kernel_bucket b = {.family = PV_KERNEL_QMATMUL};
    const pv_kernel_params p = pv_kernel_tuned(t, &b);
    for (int i = 0; i < n; i++)
        if (pv_qmatmul_act16(&p, (int)products[i].w_type))
            return i;
    return -1;
}

/* ---- text forms ---------------------------------------------------------------- */

static int family_named(const char *name, size_t len, pv_kernel_family *out)
{
    for (int f = 0; f < PV_KERNEL_FAMILY_COUNT; f++) {
        const char *n = pv_kernel_family_spec_of((pv_kernel_family)f)->name;
        if (strlen(n) == len && strncmp(n, name, len) == 0) {
            *out = (pv_kernel_family)f;
            return 1;
        }
    }
    return 0;
}

pv_status pv_kernel_bucket_parse(const char *text, pv_kernel_bucket *out)
{
    memset(out, 0, sizeof *out);
    if (!text)
        return pv_error(PV_ERR_INVALID_ARG, "kernel bucket is NULL");
    const char *dot = strchr(text, '.');
    const size_t family_len = dot ? (size_t)(dot - text) : strlen(text);
    if (!family_named(text, family_len, &out->family))
        return pv_error(PV_ERR_INVALID_ARG,
                        "kernel bucket \"%.64s\": the family must be attention, gather, qmatmul or recompute",
                        text);
    if (out->family != PV_KERNEL_ATTENTION) {
        if (dot)
            return pv_error(PV_ERR_INVALID_ARG, "kernel bucket \"%.64s\": %.*s has one bucket, named %.*s", text,
                            (int)family_len, text, (int)family_len, text);
        return PV_OK;
    }
    char decode_or_prefill[16], short_or_long[16], tail;
    if (!dot || sscanf(dot, ".hd%d.g%d.%15[a-z].%15[a-z]%c", &out->head_dim, &out->gqa, decode_or_prefill,
                       short_or_long, &tail) != 4)
        return pv_error(PV_ERR_INVALID_ARG,
                        "kernel bucket \"%.64s\" is not attention.hd<64|128|256>.g<1|2|4|8>.<decode|prefill>."
                        "<short|long>",
                        text);
    char canonical[PV_KERNEL_BUCKET_NAME_MAX];
    out->prefill = strcmp(decode_or_prefill, "prefill") == 0;
    out->long_context = strcmp(short_or_long, "long") == 0;
    pv_kernel_bucket_format(out, canonical, sizeof canonical);
    const pv_kparam_spec *head_dims = param_spec(PV_KERNEL_ATTENTION, PV_KPARAM_MAX_HEAD_DIM);
    const pv_kparam_spec *groups = param_spec(PV_KERNEL_ATTENTION, PV_KPARAM_ATT_MAX_GROUP);
    /* the canonical text differs for a stray character or a word off the lists */
    if (strcmp(canonical, text) != 0 || !listed(head_dims, out->head_dim) || !listed(groups, out->gqa))
        return pv_error(PV_ERR_INVALID_ARG,
                        "kernel bucket \"%.64s\" is not attention.hd<64|128|256>.g<1|2|4|8>.<decode|prefill>."
                        "<short|long>",
                        text);
    return PV_OK;
}

void pv_kernel_bucket_format(const pv_kernel_bucket *b, char *buf, size_t size)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(b->family);
    if (b->family != PV_KERNEL_ATTENTION)
        snprintf(buf, size, "%s", spec ? spec->name : "?");
    else
        snprintf(buf, size, "attention.hd%d.g%d.%s.%s", b->head_dim, b->gqa, b->prefill ? "prefill" : "decode",
                 b->long_context ? "long" : "short");
}

pv_status pv_kernel_params_parse(const char *text, pv_kernel_params *inout)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(inout->family);
    if (!text || !spec)
        return pv_error(PV_ERR_INVALID_ARG, "kernel parameters: no text or no family");
    int seen[PV_KPARAM_COUNT] = {0};
    const char *at = text;
    while (*at) {
        while (*at == ' ')
            at++;
        if (!*at)
            break;
        const char *eq = strchr(at, '=');
        const char *end = strchr(at, ' ');
        if (!end)
            end = at + strlen(at);
        const pv_kparam_spec *ps = NULL;
        for (int i = 0; eq && eq < end && i < spec->n_params; i++) {
            const char *name = pv_kparam_define(spec->params[i].param);
            if (spec->params[i].role != PV_KPARAM_VARIANT && strlen(name) == (size_t)(eq - at) &&
                strncmp(name, at, (size_t)(eq - at)) == 0)
                ps = &spec->params[i];
        }
        if (!ps)
            return pv_error(PV_ERR_INVALID_ARG,
                            "kernel parameters \"%.80s\": \"%.*s\" is not NAME=VALUE with a tuned parameter of "
                            "the %s kernels",
                            text, (int)(end - at), at, spec->name);
        char *stop = NULL;
        errno = 0;
        long value = strtol(eq + 1, &stop, 10);
        if (stop != end || eq + 1 == end || errno || !listed(ps, (int)value) || value != (int)value) {
            char list[96] = "";
            for (int v = 0; v < ps->n_values; v++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", v ? ", " : "", ps->values[v]);
            return pv_error(PV_ERR_INVALID_ARG, "kernel parameters \"%.80s\": %s = \"%.*s\" is not one of %s", text,
                            pv_kparam_define(ps->param), (int)(end - eq - 1), eq + 1, list);
        }
        if (seen[ps->param]++)
            return pv_error(PV_ERR_INVALID_ARG, "kernel parameters \"%.80s\": %s is given twice", text,
                            pv_kparam_define(ps->param));
        inout->value[ps->param] = (int)value;
        at = end;
    }
    return PV_OK;
}

void pv_kernel_params_format(const pv_kernel_params *p, char *buf, size_t size)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(p->family);
    size_t len = 0;
    if (size)
        buf[0] = '\0';
    for (int i = 0; spec && i < spec->n_params && len < size; i++) {
        if (spec->params[i].role == PV_KPARAM_VARIANT)
            continue;
        int n = snprintf(buf + len, size - len, "%s%s=%d", len ? " " : "", pv_kparam_define(spec->params[i].param),
                         p->value[spec->params[i].param]);
        if (n < 0)
            return;
        len += (size_t)n;
    }
}

/* ---- the public API (backend.h) --------------------------------------------------- */

int pv_backend_kernels_tunable(const pv_backend *be)
{
    return be && be->tuning && be->ops->tunable_kernels;
}

/* *b = the bucket named, on a backend that has tunable kernels. */
static pv_status tunable_bucket(const pv_backend *be, const char *what, const char *bucket, pv_kernel_bucket *b)
{
    if (!be)
        return pv_error(PV_ERR_INVALID_ARG, "%s: backend is NULL", what);
    if (!pv_backend_kernels_tunable(be))
        return pv_error(PV_ERR_UNSUPPORTED, "%s: the %s backend has no tunable kernels (it does not run kernels/)",
                        what, be->ops->name);
    return pv_kernel_bucket_parse(bucket, b);
}

pv_status pv_attention_bucket(const pv_attention_args *a, char *buf, size_t size)
{
    if (!a || !buf || !size)
        return pv_error(PV_ERR_INVALID_ARG, "pv_attention_bucket: arguments and buffer must not be NULL or empty");
    if (a->n_tokens <= 0 || !a->token_pos || a->n_kv_heads <= 0 || a->n_heads <= 0 ||
        a->n_heads % a->n_kv_heads != 0 || !pv_attention_head_dim_supported(a->head_dim))
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_attention_bucket: n_tokens %d (> 0, with token_pos), heads %d / kv heads %d (a "
                        "multiple), head_dim %d (supported) out of range",
                        a->n_tokens, a->n_heads, a->n_kv_heads, a->head_dim);
    pv_kernel_bucket b;
    pv_kernel_bucket_of_attention(a, &b);
    pv_kernel_bucket_format(&b, buf, size);
    return PV_OK;
}

pv_status pv_kernel_candidate(const pv_backend *be, const char *bucket, int index, char *buf, size_t size,
                              int *count)
{
    pv_kernel_bucket b;
    pv_status st = pv_kernel_bucket_parse(bucket, &b);
    if (st != PV_OK)
        return st;
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(b.family);
    const pv_kernel_tuning *t = be ? be->tuning : NULL;
    /* The tuned and launch parameters' values within the device's limit, as
     * a mixed-radix number (first parameter fastest). */
    int values[PV_KPARAM_MAX_PER_FAMILY][PV_KPARAM_MAX_VALUES], n_values[PV_KPARAM_MAX_PER_FAMILY] = {0};
    int total = 1;
    for (int i = 0; i < spec->n_params; i++) {
        const pv_kparam_spec *ps = &spec->params[i];
        if (ps->role == PV_KPARAM_VARIANT)
            continue;
        for (int v = 0; v < ps->n_values; v++)
            if (!above_limit(t, ps->param, ps->values[v]))
                values[i][n_values[i]++] = ps->values[v];
        total *= n_values[i];
    }
    if (count)
        *count = total;
    if (!buf)
        return PV_OK;
    if (index < 0 || index >= total)
        return pv_error(PV_ERR_INVALID_ARG, "kernel candidate %d of bucket %s out of range [0, %d)", index, bucket,
                        total);
    pv_kernel_params p = t ? t->defaults[b.family] : (pv_kernel_params){0};
    if (!t)
        pv_kernel_params_default(b.family, &p);
    for (int i = 0, rest = index; i < spec->n_params; i++) {
        if (!n_values[i])
            continue;
        p.value[spec->params[i].param] = values[i][rest % n_values[i]];
        rest /= n_values[i];
    }
    pv_kernel_params_format(&p, buf, size);
    return PV_OK;
}

pv_status pv_backend_kernel_set(pv_backend *be, const char *bucket, const char *params)
{
    pv_kernel_bucket b;
    pv_status st = tunable_bucket(be, "pv_backend_kernel_set", bucket, &b);
    if (st != PV_OK)
        return st;
    pv_kernel_tuning *t = be->tuning;
    int i = find_bucket(t, &b);
    if (!params || !*params) { /* back to the defaults */
        if (i >= 0) {
            t->n--;
            t->bucket[i] = t->bucket[t->n];
            t->params[i] = t->params[t->n];
        }
        return PV_OK;
    }
    pv_kernel_params p = pv_kernel_tuned(t, &b);
    if ((st = pv_kernel_params_parse(params, &p)) != PV_OK)
        return st;
    if (above_limit(t, PV_KPARAM_WG, p.value[PV_KPARAM_WG]))
        return pv_error(PV_ERR_UNSUPPORTED, "kernel parameters \"%.80s\" for %s: PV_WG = %d is above the device's "
                        "work-group limit %d",
                        params, bucket, p.value[PV_KPARAM_WG], t->max_work_group);
    if (above_limit(t, PV_KPARAM_GEMM, p.value[PV_KPARAM_GEMM]))
        return pv_error(PV_ERR_UNSUPPORTED, "kernel parameters \"%.80s\" for %s: PV_GEMM = %d (%s) is not run by "
                        "this device (at most %d, %s)",
                        params, bucket, p.value[PV_KPARAM_GEMM], pv_gemm_mode_name(p.value[PV_KPARAM_GEMM]),
                        t->max_gemm, pv_gemm_mode_name(t->max_gemm));
    if (i < 0) {
        if (t->n == PV_KERNEL_BUCKETS_MAX) /* a guard: there are no more buckets than that */
            return pv_error(PV_ERR_INVALID_ARG, "kernel tuning: more than %d buckets", PV_KERNEL_BUCKETS_MAX);
        i = t->n++;
        t->bucket[i] = b;
    }
    t->params[i] = p;
    return PV_OK;
}

pv_status pv_backend_kernel_get(const pv_backend *be, const char *bucket, char *buf, size_t size)
{
    pv_kernel_bucket b;
    pv_status st = tunable_bucket(be, "pv_backend_kernel_get", bucket, &b);
    if (st != PV_OK)
        return st;
    if (!buf || !size)
        return pv_error(PV_ERR_INVALID_ARG, "pv_backend_kernel_get: no buffer");
    const pv_kernel_params p = pv_kernel_tuned(be->tuning, &b);
    pv_kernel_params_format(&p, buf, size);
    return PV_OK;
}
