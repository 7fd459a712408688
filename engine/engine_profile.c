/* The device profile of the backend an engine runs on (engine.h,
 * pv_engine_profile_apply): the engine is where backend and cache meet, so
 * the lookup by device lives here rather than in pvcore or the apps. */
#include "config.h"

#include <pensieve/engine.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

pv_status pv_engine_profile_apply(const pv_backend *be, const char *path, pv_cache_config *cfg,
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
    if ((st = pv_profile_apply(&use->profile, cfg)) != PV_OK)
        return st;
    use->applied = 1;
    return PV_OK;
}
