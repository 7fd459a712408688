/* libFuzzer target: the device profile reader on arbitrary file contents
 * (an in-memory file named through /proc/self/fd, as fuzz-ini). A load
 * either fails with a message naming the file, or gives a profile whose
 * constants the cache accepts once applied. */
#define _GNU_SOURCE /* memfd_create */
#include "fuzz-file.h"
#include <pensieve/profile.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

FUZZ_FILE_INITIALIZE("fuzz-profile")

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file_write(data, size);
    pv_profile p;
    pv_status st = pv_profile_load(path, "cpu", "x", &p);
    if (st != PV_OK) {
        if (!strstr(pv_last_error(), path)) {
            fprintf(stderr, "fuzz-profile: an error that does not name the file: %s\n", pv_last_error());
            abort();
        }
        return 0;
    }
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    if (pv_profile_apply(&p, &cfg) == PV_OK && pv_cache_config_validate(&cfg) != PV_OK) {
        fprintf(stderr, "fuzz-profile: a loaded profile gave a config the cache refuses: %s\n", pv_last_error());
        abort();
    }
    if (p.n_points > PV_PROFILE_MAX_POINTS || p.chunk_tokens < 1 || !(p.alpha >= 0) || !isfinite(p.alpha)) {
        fprintf(stderr, "fuzz-profile: a loaded profile out of range\n");
        abort();
    }
    return 0;
}
