/* Cache configuration: defaults, range checks and the [cache] INI section. */
#include <pensieve/cache.h>

#include <errno.h>
#include <iniparser.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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
    if (cfg->host_bytes < cfg->slot_bytes)
        return pv_error(PV_ERR_INVALID_ARG,
                        "host budget %llu bytes is smaller than one slot (%llu bytes)",
                        (unsigned long long)cfg->host_bytes, (unsigned long long)cfg->slot_bytes);
    for (int t = 0; t < PV_SLOT_TIERS; t++) {
        uint64_t budget = t == PV_TIER_DEVICE ? cfg->device_bytes : cfg->host_bytes;
        if (budget / cfg->slot_bytes >= UINT32_MAX)
            return pv_error(PV_ERR_INVALID_ARG,
                            "%s budget %llu bytes is %llu slots, above the limit of %u slots",
                            pv_tier_name((pv_tier)t), (unsigned long long)budget,
                            (unsigned long long)(budget / cfg->slot_bytes), UINT32_MAX - 1);
    }
    if (!(cfg->high_water > 0 && cfg->high_water <= 1))
        return pv_error(PV_ERR_INVALID_ARG, "high_water %g out of range (0, 1]", cfg->high_water);
    if (!(cfg->reserve >= 0 && cfg->reserve < 1))
        return pv_error(PV_ERR_INVALID_ARG, "reserve %g out of range [0, 1)", cfg->reserve);
    return PV_OK;
}

static pv_status parse_double(const char *path, const char *key, const char *text, double lo,
                              double hi, int lo_open, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    while (*end == ' ' || *end == '\t')
        end++;
    if (end == text || *end != '\0' || errno == ERANGE || !isfinite(v) || v < lo ||
        (lo_open && v == lo) || v > hi)
        return pv_error(PV_ERR_FORMAT, "%s: key %s = \"%s\" is not a number in %s%g, %g]", path, key,
                        text, lo_open ? "(" : "[", lo, hi);
    *out = v;
    return PV_OK;
}

static pv_status parse_bytes(const char *path, const char *key, const char *text, uint64_t *out)
{
    char *end;
    if (text[0] == '-' || text[0] == '\0')
        goto bad;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || errno == ERANGE)
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
    while (*end == ' ' || *end == '\t')
        end++;
    if (*end != '\0' || v == 0 || (shift && v > (UINT64_MAX >> shift)))
        goto bad;
    *out = (uint64_t)v << shift;
    return PV_OK;
bad:
    return pv_error(PV_ERR_FORMAT,
                    "%s: key %s = \"%s\" is not a byte count in [1, 2^64) (integer, optional K/M/G/T suffix)",
                    path, key, text);
}

static int quiet_ini_error(const char *fmt, ...)
{
    (void)fmt;
    return 0;
}

/* Applies one key of [cache] to cfg. */
static pv_status apply_key(pv_cache_config *cfg, const char *path, const char *key, const char *val)
{
    const char *name = key + strlen("cache:");
    double d;
    pv_status st;
    if (strcmp(name, "policy") == 0) {
        st = pv_policy_parse(val, &cfg->policy);
        if (st != PV_OK)
            return pv_error(PV_ERR_FORMAT, "%s: key %s = \"%s\" is not one of pensieve, weighted, lru",
                            path, key, val);
    } else if (strcmp(name, "alpha") == 0) {
        if ((st = parse_double(path, key, val, 0, 1e6, 0, &cfg->alpha)) != PV_OK)
            return st;
    } else if (strcmp(name, "beta") == 0) {
        if ((st = parse_double(path, key, val, 0, 1e6, 0, &cfg->beta)) != PV_OK)
            return st;
    } else if (strcmp(name, "c") == 0) {
        if ((st = parse_double(path, key, val, 0, 1e6, 0, &cfg->c)) != PV_OK)
            return st;
    } else if (strcmp(name, "chunk_tokens") == 0) {
        if ((st = parse_double(path, key, val, 1, 4096, 0, &d)) != PV_OK)
            return st;
        if (d != floor(d))
            return pv_error(PV_ERR_FORMAT, "%s: key %s = \"%s\" is not an integer in [1, 4096]", path,
                            key, val);
        cfg->chunk_tokens = (uint32_t)d;
    } else if (strcmp(name, "device_bytes") == 0) {
        if ((st = parse_bytes(path, key, val, &cfg->device_bytes)) != PV_OK)
            return st;
    } else if (strcmp(name, "host_bytes") == 0) {
        if ((st = parse_bytes(path, key, val, &cfg->host_bytes)) != PV_OK)
            return st;
    } else if (strcmp(name, "high_water") == 0) {
        if ((st = parse_double(path, key, val, 0, 1, 1, &cfg->high_water)) != PV_OK)
            return st;
    } else if (strcmp(name, "reserve") == 0) {
        if ((st = parse_double(path, key, val, 0, 0.99, 0, &cfg->reserve)) != PV_OK)
            return st;
    } else {
        return pv_error(PV_ERR_FORMAT,
                        "%s: unknown key %s (known: policy, alpha, beta, c, chunk_tokens, "
                        "device_bytes, host_bytes, high_water, reserve)",
                        path, key);
    }
    return PV_OK;
}

pv_status pv_cache_config_load(pv_cache_config *cfg, const char *path)
{
    if (!cfg || !path)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_config_load: cfg and path must not be NULL");
    FILE *f = fopen(path, "r");
    if (!f)
        return pv_error(PV_ERR_IO, "%s: cannot open cache config", path);
    fclose(f);

    /* iniparser reports syntax errors through a process-wide callback that
     * prints to stderr; silence it while loading, our status says it. */
    iniparser_set_error_callback(quiet_ini_error);
    dictionary *ini = iniparser_load(path);
    iniparser_set_error_callback(NULL);
    if (!ini)
        return pv_error(PV_ERR_FORMAT, "%s: not a valid INI file", path);

    pv_cache_config next = *cfg;
    pv_status st = PV_OK;
    int n_keys = iniparser_getsecnkeys(ini, "cache");
    if (n_keys > 0) {
        const char **keys = calloc((size_t)n_keys, sizeof *keys);
        if (!keys) {
            iniparser_freedict(ini);
            return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: no memory for %d keys", path, n_keys);
        }
        iniparser_getseckeys(ini, "cache", keys);
        for (int i = 0; i < n_keys && st == PV_OK; i++) {
            const char *val = iniparser_getstring(ini, keys[i], NULL);
            if (!val || val[0] == '\0')
                st = pv_error(PV_ERR_FORMAT, "%s: key %s has no value", path, keys[i]);
            else
                st = apply_key(&next, path, keys[i], val);
        }
        free(keys);
    }
    iniparser_freedict(ini);
    if (st != PV_OK)
        return st;
    if (!(next.beta + next.c > 0))
        return pv_error(PV_ERR_FORMAT, "%s: keys cache:beta + cache:c = %g must be > 0", path,
                        next.beta + next.c);
    *cfg = next;
    return PV_OK;
}
