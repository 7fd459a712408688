/* The default location of the reference model (see scripts/get-model). */
#include <pensieve/gguf.h>

#include <stdio.h>
#include <stdlib.h>

pv_status pv_default_model_path(char *out, size_t cap)
{
    if (!out || cap == 0)
        return pv_error(PV_ERR_INVALID_ARG, "pv_default_model_path: no output buffer");
    const char *model = getenv("PV_MODEL");
    const char *dir = getenv("PV_MODEL_DIR");
    const char *cache = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (model && *model)
        n = snprintf(out, cap, "%s", model);
    else if (dir && *dir)
        n = snprintf(out, cap, "%s/%s", dir, PV_DEFAULT_MODEL_NAME);
    else if (cache && *cache)
        n = snprintf(out, cap, "%s/pensieve/models/%s", cache, PV_DEFAULT_MODEL_NAME);
    else if (home && *home)
        n = snprintf(out, cap, "%s/.cache/pensieve/models/%s", home, PV_DEFAULT_MODEL_NAME);
    else
        return pv_error(PV_ERR_NOT_FOUND, "no model location: PV_MODEL, PV_MODEL_DIR, "
                        "XDG_CACHE_HOME and HOME are all unset");
    if (n < 0 || (size_t)n >= cap)
        return pv_error(PV_ERR_INVALID_ARG, "default model path needs %d bytes, buffer holds %zu",
                        n, cap);
    return PV_OK;
}
