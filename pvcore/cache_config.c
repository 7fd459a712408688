/* Cache configuration: defaults, range checks and the [cache] INI file,
 * read by the strict reader of ini.h (which says why not iniparser); unknown
 * sections and keys are refused here. */
#include <pensieve/cache.h>

#include "pvcore/ini.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static const char *const policy_names[] = {"pensieve", "weighted", "lru"};

const char *pv_policy_name(pv_policy policy)
{
    if ((unsigned)policy < sizeof policy_names / sizeof policy_names[0])
        return policy_names[policy];
    return "unknown";
}

pv_status pv_policy_parse(const char *name, pv_policy *policy)
{
    if (!name || !policy)
        return pv_error(PV_ERR_INVALID_ARG, "pv_policy_parse: name and policy must not be NULL");
    for (unsigned i = 0; i < sizeof policy_names / sizeof policy_names[0]; i++) {
        if (strcasecmp(name, policy_names[i]) == 0) {
            *policy = (pv_policy)i;
            return PV_OK;
        }
    }
    return pv_error(PV_ERR_INVALID_ARG,
                    "unknown eviction policy \"%s\" (expected pensieve, weighted or lru)", name);
}

pv_status pv_cache_config_defaults(pv_cache_config *cfg)
{
    if (!cfg)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_config_defaults: cfg is NULL");
    /* alpha, beta, c: the shape of the paper's Fig. 4 (attention of a chunk
     * at 1K context ~ 0.1 of a layer's other work), in seconds; the tuner
     * replaces them per device. */
    cfg->policy = PV_POLICY_PENSIEVE;
    cfg->alpha = 1e-6;
    cfg->beta = 1e-4;
    cfg->c = 1e-3;
    cfg->chunk_tokens = 32;
    cfg->n_layers = 32;
    cfg->slot_bytes = 64u << 10;
    cfg->device_bytes = 1ull << 30;
    cfg->host_bytes = 4ull << 30;
    cfg->high_water = 0.75;
    cfg->reserve = 0.10;
    cfg->device_limit_bytes = 0;
    return PV_OK;
}

pv_status pv_cache_config_validate(const pv_cache_config *cfg)
{
    if (!cfg)
        return pv_error(PV_ERR_INVALID_ARG, "cache config is NULL");
    if ((unsigned)cfg->policy > PV_POLICY_LRU)
        return pv_error(PV_ERR_INVALID_ARG, "policy %d out of range [0, %d]", (int)cfg->policy,
                        (int)PV_POLICY_LRU);
    if (!isfinite(cfg->alpha) || cfg->alpha < 0 || !isfinite(cfg->beta) || cfg->beta < 0 ||
        !isfinite(cfg->c) || cfg->c < 0)
        return pv_error(PV_ERR_INVALID_ARG,
                        "cost constants alpha %g, beta %g, c %g must be finite and >= 0",
                        cfg->alpha, cfg->beta, cfg->c);
    /* Retention values divide by cost: a zero-cost leading chunk would
     * compare equal at every idle time. */
    if (!(cfg->beta + cfg->c > 0))
        return pv_error(PV_ERR_INVALID_ARG, "beta + c = %g must be > 0 (cost of a chunk at context 0)",
                        cfg->beta + cfg->c);
    if (cfg->chunk_tokens < 1 || cfg->chunk_tokens > 4096)
        return pv_error(PV_ERR_INVALID_ARG, "chunk_tokens %u out of range [1, 4096]", cfg->chunk_tokens);
    if (cfg->n_layers < 1 || cfg->n_layers > 65535)
        return pv_error(PV_ERR_INVALID_ARG, "n_layers %u out of range [1, 65535]", cfg->n_layers);
    if (cfg->slot_bytes < 1)
        return pv_error(PV_ERR_INVALID_ARG, "slot_bytes is 0; a slot holds K and V of one chunk");
    if (cfg->device_bytes < cfg->slot_bytes)
        return pv_error(PV_ERR_INVALID_ARG,
                        "device budget %llu bytes is smaller than one slot (%llu bytes)",
                        (unsigned long long)cfg->device_bytes, (unsigned long long)cfg->slot_bytes);
    /* 0 is no host tier (gpu-only serving): evicted chunks are dropped. */
    if (cfg->host_bytes != 0 && cfg->host_bytes < cfg->slot_bytes)
        return pv_error(PV_ERR_INVALID_ARG,
                        "host budget %llu bytes is smaller than one slot (%llu bytes); 0 means no host tier",
                        (unsigned long long)cfg->host_bytes, (unsigned long long)cfg->slot_bytes);
    for (int t = 0; t < PV_SLOT_TIERS; t++) {
        uint64_t budget = t == PV_TIER_DEVICE ? cfg->device_bytes : cfg->host_bytes;
        if (budget / cfg->slot_bytes >= UINT32_MAX)
            return pv_error(PV_ERR_INVALID_ARG,
                            "%s budget %llu bytes is %llu slots, above the limit of %u slots",
                            pv_tier_name((pv_tier)t), (unsigned long long)budget,
                            (unsigned long long)(budget / cfg->slot_bytes), UINT32_MAX - 1);
    }
    /* A budget the memory cannot hold is an error now, not a huge
     * allocation later (the pools' bookkeeping alone is 12 bytes a slot). */
    if (cfg->device_limit_bytes && cfg->device_bytes > cfg->device_limit_bytes)
        return pv_error(PV_ERR_INVALID_ARG,
                        "device budget %llu bytes exceeds the device's memory of %llu bytes "
                        "(device_limit_bytes)",
                        (unsigned long long)cfg->device_bytes,
                        (unsigned long long)cfg->device_limit_bytes);
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0 &&
        cfg->host_bytes / (uint64_t)page_size >= (uint64_t)pages)
        return pv_error(PV_ERR_INVALID_ARG,
                        "host budget %llu bytes exceeds the physical memory of %llu bytes",
                        (unsigned long long)cfg->host_bytes,
                        (unsigned long long)pages * (unsigned long long)page_size);
    if (!(cfg->high_water > 0 && cfg->high_water <= 1))
        return pv_error(PV_ERR_INVALID_ARG, "high_water %g out of range (0, 1]", cfg->high_water);
    if (!(cfg->reserve >= 0 && cfg->reserve < 1))
        return pv_error(PV_ERR_INVALID_ARG, "reserve %g out of range [0, 1)", cfg->reserve);
    return PV_OK;
}

/* Where a value came from, for messages: "file:line: key cache:name". */
typedef struct ini_where {
    const char *path;
    unsigned line;
    const char *key;
} ini_where;

#define INI_FAIL(w, fmt, ...)                                                                 \
    pv_error(PV_ERR_FORMAT, "%s:%u: key cache:%s " fmt, (w)->path, (w)->line, (w)->key,        \
             __VA_ARGS__)

static pv_status parse_double(const ini_where *w, const char *text, double lo, double hi,
                              int lo_open, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || errno == ERANGE || !isfinite(v) || v < lo ||
        (lo_open && v == lo) || v > hi)
        return INI_FAIL(w, "= \"%s\" is not a number in %s%g, %g]", text, lo_open ? "(" : "[", lo,
                        hi);
    *out = v;
    return PV_OK;
}

static pv_status parse_bytes(const ini_where *w, const char *text, uint64_t *out)
{
    char *end;
    /* strtoull would take a sign (and wrap "-5" to 2^64 - 5) or spaces. */
    if (!isdigit((unsigned char)text[0]))
        goto bad;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno == ERANGE)
        goto bad;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I'))
        end++;
    if (shift && (*end == 'b' || *end == 'B'))
        end++;
    if (*end != '\0' || v == 0 || (shift && v > (UINT64_MAX >> shift)))
        goto bad;
    *out = (uint64_t)v << shift;
    return PV_OK;
bad:
    return INI_FAIL(w, "= \"%s\" is not a byte count in [1, 2^64) (digits, optional K/M/G/T suffix)",
                    text);
}

static const char *const known_keys[] = {"policy", "alpha", "beta", "c", "chunk_tokens",
                                         "device_bytes", "host_bytes", "high_water", "reserve"};
#define N_KEYS (sizeof known_keys / sizeof known_keys[0])

/* Applies key k (an index into known_keys) of [cache] to cfg. */
static pv_status apply_key(pv_cache_config *cfg, const ini_where *w, size_t k, const char *val)
{
    double d;
    switch (k) {
    case 0:
        if (pv_policy_parse(val, &cfg->policy) != PV_OK)
            return INI_FAIL(w, "= \"%s\" is not one of pensieve, weighted, lru", val);
        return PV_OK;
    case 1: return parse_double(w, val, 0, 1e6, 0, &cfg->alpha);
    case 2: return parse_double(w, val, 0, 1e6, 0, &cfg->beta);
    case 3: return parse_double(w, val, 0, 1e6, 0, &cfg->c);
    case 4: {
        pv_status st = parse_double(w, val, 1, 4096, 0, &d);
        if (st != PV_OK)
            return st;
        if (d != floor(d))
            return INI_FAIL(w, "= \"%s\" is not an integer in [1, 4096]", val);
        cfg->chunk_tokens = (uint32_t)d;
        return PV_OK;
    }
    case 5: return parse_bytes(w, val, &cfg->device_bytes);
    case 6: return parse_bytes(w, val, &cfg->host_bytes);
    case 7: return parse_double(w, val, 0, 1, 1, &cfg->high_water);
    default: return parse_double(w, val, 0, 0.99, 0, &cfg->reserve);
    }
}

/* What the walk over the file keeps: the config being built, and the line
 * each key was first set on. */
typedef struct config_load {
    pv_cache_config next;
    const char *path;
    unsigned seen_on[N_KEYS];
} config_load;

static pv_status on_section(void *ctx, unsigned line, size_t offset, const char *name)
{
    (void)offset;
    const config_load *ld = ctx;
    if (strcasecmp(name, "cache") != 0)
        return pv_error(PV_ERR_FORMAT, "%s:%u: unknown section [%.64s] (a cache config has only [cache])",
                        ld->path, line, name);
    return PV_OK;
}

static pv_status on_key(void *ctx, unsigned line, const char *section, const char *key, const char *val)
{
    (void)section;
    config_load *ld = ctx;
    size_t k = 0;
    while (k < N_KEYS && strcasecmp(key, known_keys[k]) != 0)
        k++;
    if (k == N_KEYS)
        return pv_error(PV_ERR_FORMAT,
                        "%s:%u: unknown key cache:%.64s (known: policy, alpha, beta, c, "
                        "chunk_tokens, device_bytes, host_bytes, high_water, reserve)",
                        ld->path, line, key);
    ini_where w = {ld->path, line, known_keys[k]};
    if (ld->seen_on[k])
        return INI_FAIL(&w, "is set again (first on line %u)", ld->seen_on[k]);
    ld->seen_on[k] = line;
    return apply_key(&ld->next, &w, k, val);
}

pv_status pv_cache_config_load(pv_cache_config *cfg, const char *path)
{
    if (!cfg || !path)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_config_load: cfg and path must not be NULL");
    size_t size = 0;
    pv_status st = PV_OK;
    char *text = pv_ini_read_file(path, "cache config", &size, &st);
    if (!text)
        return st;
    config_load ld = {.next = *cfg, .path = path};
    static const pv_ini_handler handler = {.section = on_section, .key = on_key};
    st = pv_ini_parse(path, text, size, &handler, &ld);
    free(text);
    if (st != PV_OK)
        return st;
    if (!(ld.next.beta + ld.next.c > 0))
        return pv_error(PV_ERR_FORMAT, "%s: keys cache:beta + cache:c = %g must be > 0", path,
                        ld.next.beta + ld.next.c);
    *cfg = ld.next;
    return PV_OK;
}
