/* Device profiles: the eviction cost model fitted on one backend device by
 * pensieve-tune, with the measurements behind it.
 *
 * The cache ranks a chunk (chunk_tokens tokens of one layer) by
 * cost / idle time with cost(l) = alpha * l + beta + c at context l
 * (include/pensieve/cache.h). pensieve-tune times the attention of one
 * chunk at one layer over l tokens of paged context at powers of two and
 * fits alpha and beta to those times; c is the chunk's other work in one
 * layer (projections, norms, FFN). Profiles live in one INI file, a
 * section per device, named "backend: device name":
 *
 *   [cpu: AMD EPYC 7B13]
 *   alpha = 1.2e-08          ; seconds per context token
 *   beta = 3.1e-05           ; seconds
 *   c = 4.0e-04              ; seconds
 *   r2 = 0.9991
 *   heldout_error = 0.034    ; mean |relative error| between the powers of two
 *   chunk_tokens = 32
 *   points = 32:3.3e-05:0.02 64:3.6e-05:0.03 ...   ; context:seconds:spread
 *   shape = 9,3,64,30        ; heads, kv heads, head dim, layers measured
 *   date = 2026-11-23T22:50:00Z
 *   version = 0.1.0
 *   kernel.attention.hd64.g4.decode.long = PV_WG=16 PV_SPLITS=4
 *   kernel.gather = PV_WG=64 PV_ITEM_ELEMS=4
 *
 * The kernel.* keys are the tuned kernel parameters per shape bucket
 * (backend.h, "kernel tuning"), for the backends that run the portable
 * kernels. The reader checks their form (a bucket of lower-case words,
 * NAME=VALUE pairs); what they mean is checked where they are applied
 * (pv_engine_profile_apply), with the line they came from.
 *
 * Reading is strict (pvcore/ini.h): a malformed line, an unknown key or a
 * value out of range anywhere in the file is PV_ERR_FORMAT naming file,
 * line and key. */
#ifndef PENSIEVE_PROFILE_H
#define PENSIEVE_PROFILE_H

#include <pensieve/cache.h>
#include <pensieve/status.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Most measured points a profile keeps (2^5 .. 2^36 would be 32). */
#define PV_PROFILE_MAX_POINTS 32
/* Most kernel.* keys: more than there are buckets (backend.h). */
#define PV_PROFILE_MAX_KERNELS 64

typedef struct pv_cost_point {
    double context; /* tokens before the chunk */
    double seconds; /* median time of the chunk's attention at one layer */
    double spread;  /* (third quartile - first quartile) / median of the repeats */
} pv_cost_point;

/* seconds(l) = alpha * l + beta, fitted by least squares weighted by
 * 1 / seconds^2 (relative residuals: the short contexts, microseconds
 * each, count as much as the long ones); r2 is the plain coefficient of
 * determination over the points, max_rel_residual the largest
 * |fit - measured| / measured. */
typedef struct pv_cost_fit {
    double alpha, beta, r2, max_rel_residual;
} pv_cost_fit;

/* At least two points at distinct contexts, every value finite and
 * seconds > 0; PV_ERR_INVALID_ARG naming the point otherwise. A negative
 * slope or intercept (noise on a flat curve) is clamped to 0 and the other
 * constant refitted, as the cache requires alpha, beta >= 0. */
pv_status pv_cost_fit_linear(const pv_cost_point *points, size_t n, pv_cost_fit *out);
double pv_cost_fit_predict(const pv_cost_fit *fit, double context);

typedef struct pv_profile {
    char backend[32];  /* "cpu", "opencl", "cuda" */
    char device[128];  /* the backend's device name */
    double alpha, beta, c, r2;
    double heldout_error; /* < 0: not measured */
    uint32_t chunk_tokens;
    uint32_t n_points;
    pv_cost_point points[PV_PROFILE_MAX_POINTS];
    char shape[64];
    char date[32];
    char version[32];
    uint32_t n_kernels;
    struct pv_profile_kernel {
        char bucket[48];  /* "attention.hd64.g4.decode.long" */
        char params[96];  /* "PV_WG=16 PV_SPLITS=4" */
        unsigned line;    /* where it was read (0: not read from a file) */
    } kernels[PV_PROFILE_MAX_KERNELS];
} pv_profile;

/* The file pensieve-tune writes and the engine reads when none is named:
 * $PV_PROFILE if set, else $XDG_CONFIG_HOME/pensieve/profiles.ini, else
 * $HOME/.config/pensieve/profiles.ini. PV_ERR_NOT_FOUND when neither
 * XDG_CONFIG_HOME nor HOME is set; PV_ERR_INVALID_ARG when it does not fit. */
pv_status pv_profile_default_path(char *buf, size_t size);

/* Writes p's section into the file at path, keeping every other section
 * (and the lines before the first) as they were; creates the file and its
 * directory if missing. The existing file must parse: a corrupt one is left
 * alone and its error returned. Written to a temporary file and renamed, so
 * a reader sees the old or the new file, never half of one. */
pv_status pv_profile_save(const char *path, const pv_profile *p);

/* The section of backend and device in the file at path. PV_ERR_NOT_FOUND
 * (message naming the sections present) when the file has none for this
 * device; PV_ERR_IO when the file cannot be read; PV_ERR_FORMAT for a
 * corrupt file. */
pv_status pv_profile_load(const char *path, const char *backend, const char *device, pv_profile *out);

/* The section name of a device: "backend: device", with the characters an
 * INI section name cannot hold ([ ] ; # and control characters) as '_'. */
void pv_profile_section_name(const char *backend, const char *device, char *buf, size_t size);

/* cfg's alpha, beta and c from the profile, scaled by cfg->chunk_tokens /
 * p->chunk_tokens when the cache's chunks differ from the measured ones
 * (a chunk's attention and other work both grow with its tokens). */
pv_status pv_profile_apply(const pv_profile *p, pv_cache_config *cfg);

#ifdef __cplusplus
}
#endif

#endif
