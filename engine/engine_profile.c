/* The device profile of the backend an engine runs on (engine.h,
 * pv_engine_profile_apply): the engine is where backend and cache meet, so
 * the lookup by device lives here rather than in pvcore or the apps. */
#include "config.h"

#include <pensieve/engine.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The profile's kernel sets into be, all or none. */
static pv_status apply_kernel_sets(pv_backend *be, pv_engine_profile_use *use)
{
    const pv_profile *p = &use->profile;
    if (!p->n_kernels || !pv_backend_kernels_tunable(be))
        return PV_OK;
    char before[PV_PROFILE_MAX_KERNELS][sizeof p->kernels[0].params];
    for (uint32_t i = 0; i < p->n_kernels; i++) {
        pv_status st = pv_backend_kernel_get(be, p->kernels[i].bucket, before[i], sizeof before[i]);
        if (st == PV_OK)
            st = pv_backend_kernel_set(be, p->kernels[i].bucket, p->kernels[i].params);
        if (st != PV_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", pv_last_error());
            for (uint32_t j = i; j-- > 0;) /* last first: a bucket named twice ends as it began */
                pv_backend_kernel_set(be, p->kernels[j].bucket, before[j]);
            return pv_error(PV_ERR_FORMAT, "%s:%u: key [%s: %s] kernel.%s: %s", use->path, p->kernels[i].line,
                            p->backend, p->device, p->kernels[i].bucket, why);
        }
    }
    use->kernel_sets = (int)p->n_kernels;
    return PV_OK;
}

pv_status pv_engine_profile_apply(pv_backend *be, const char *path, pv_cache_config *cfg,
                                  pv_engine_profile_use *use)
{
    if (!be || !cfg || !use)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_profile_apply: backend, config and use must not be NULL");
    memset(use, 0, sizeof *use);
    pv_status st = PV_OK;
    if (path)
        snprintf(use->path, sizeof use->path, "%s", path);
    else if ((st = pv_profile_default_path(use->path, sizeof use->path)) != PV_OK)
        return st == PV_ERR_NOT_FOUND ? PV_OK : st; /* no default location: the defaults */
    /* A file named on purpose must exist; the default one may not. */
    if (!path && access(use->path, F_OK) != 0 && errno == ENOENT) {
        pv_error(PV_ERR_NOT_FOUND, "%s: no profile file (pensieve-tune writes one)", use->path);
        return PV_OK;
    }
    st = pv_profile_load(use->path, be->ops->name, be->info.name, &use->profile);
    if (st == PV_ERR_NOT_FOUND)
        return PV_OK; /* pv_last_error() names the device and the sections present */
    if (st != PV_OK)
        return st;
    /* all or nothing: cfg changes once the kernel sets are in */
    pv_cache_config scaled = *cfg;
    if ((st = pv_profile_apply(&use->profile, &scaled)) != PV_OK || (st = apply_kernel_sets(be, use)) != PV_OK)
        return st;
    *cfg = scaled;
    use->applied = 1;
    return PV_OK;
}
