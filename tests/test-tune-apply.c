/* A profile written by pensieve-tune reaches the cache and the backend:
 * usage test-tune-apply PROFILE [BACKEND]. The backend's section (cpu by
 * default) is applied as the engine applies it (pv_engine_profile_apply),
 * its constants read back from the file itself, and a cache built with
 * them gives every chunk the retention value (alpha l + beta + c) / idle
 * time of the profile, not of the defaults; every kernel set of the
 * section is the one the backend now uses for its bucket. */
#include "tap.h"

#include <pensieve/engine.h>

#include <math.h>
#include <string.h>

static double fake_now;
static double fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: test-tune-apply PROFILE [BACKEND]\n");
        return 2;
    }
    const char *backend = argc == 3 ? argv[2] : "cpu";
    pv_backend *be = NULL;
    if (!ok(pv_backend_init(&be, backend, 0) == PV_OK, "the %s backend opens", backend))
        return tap_done();
    pv_cache_config defaults, cfg;
    pv_cache_config_defaults(&defaults);
    cfg = defaults;
    pv_engine_profile_use use;
    pv_status st = pv_engine_profile_apply(be, argv[1], &cfg, &use);
    pv_profile in_file;
    pv_status st_file = pv_profile_load(argv[1], backend, be->info.name, &in_file);
    ok(st == PV_OK && use.applied && st_file == PV_OK, "the profile for [%s: %s] is found and applied (%s)",
       backend, be->info.name, st == PV_OK && use.applied ? "ok" : pv_last_error());
    int sets_good = st_file == PV_OK && use.kernel_sets == (pv_backend_kernels_tunable(be) ? (int)in_file.n_kernels : 0);
    for (uint32_t i = 0; sets_good && use.kernel_sets && i < in_file.n_kernels; i++) {
        char now[96];
        sets_good = pv_backend_kernel_get(be, in_file.kernels[i].bucket, now, sizeof now) == PV_OK &&
                    strcmp(now, in_file.kernels[i].params) == 0;
        if (!sets_good)
            tap_diag("%s: the backend uses \"%s\", the file says \"%s\"", in_file.kernels[i].bucket, now,
                     in_file.kernels[i].params);
    }
    ok(sets_good, "the backend uses the file's %d kernel sets (of %u in the section)", use.kernel_sets,
       in_file.n_kernels);
    ok(cfg.alpha == in_file.alpha && cfg.beta == in_file.beta && cfg.c == in_file.c && in_file.chunk_tokens == 32,
       "the cache config holds the file's constants: alpha %g, beta %g, c %g", cfg.alpha, cfg.beta, cfg.c);
    ok(cfg.alpha != defaults.alpha && cfg.c != defaults.c, "and they are not the defaults (alpha %g, c %g)",
       defaults.alpha, defaults.c);

    /* Retention values of the chunks of one session under both configs. */
    const pv_cache_config *configs[2] = {&defaults, &cfg};
    double values[2][4];
    int good = 1;
    for (int k = 0; k < 2; k++) {
        pv_cache *cache = NULL;
        fake_now = 100.0;
        good = good && pv_cache_init(&cache, configs[k], fake_clock, NULL) == PV_OK &&
               pv_cache_session_open(cache, "s") == PV_OK;
        for (uint32_t chunk = 0; good && chunk < 4; chunk++)
            good = pv_cache_store_chunk(cache, "s", chunk, 0, PV_TIER_DEVICE, NULL) == PV_OK;
        fake_now = 110.0; /* idle 10 s */
        for (uint32_t chunk = 0; good && chunk < 4; chunk++)
            good = pv_cache_retention_value(cache, "s", chunk, 0, &values[k][chunk]) == PV_OK;
        pv_cache_free(cache);
    }
    double worst = 0;
    for (uint32_t chunk = 0; good && chunk < 4; chunk++) {
        const double want = (cfg.alpha * chunk * cfg.chunk_tokens + cfg.beta + cfg.c) / 10.0;
        worst = fmax(worst, fabs(values[1][chunk] / want - 1));
    }
    ok(good && worst < 1e-12, "retention values follow the profile: (alpha l + beta + c) / idle, worst error %.2g (%s)",
       worst, good ? "ok" : pv_last_error());
    ok(good && values[1][3] != values[0][3] && values[1][3] / values[1][0] != values[0][3] / values[0][0],
       "and differ from the defaults' (chunk 3 / chunk 0: %.4g with the profile, %.4g without)",
       values[1][3] / values[1][0], values[0][3] / values[0][0]);
    pv_backend_free(be);
    return tap_done();
}
