/* libFuzzer target: the cache's INI loader on arbitrary file contents. The
 * loader takes a path, so the input goes into an in-memory file (memfd)
 * named through /proc/self/fd: no disk traffic per input. A config that
 * loads must, with a slot size that keeps its pools small, validate into a
 * cache that starts, stores a chunk and passes pv_cache_check(). On failure
 * the config must be unchanged (the header's promise). */
#define _GNU_SOURCE /* memfd_create */
#include "fuzz-file.h"
#include <pensieve/cache.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Slots per pool of the cache started from a loaded config: enough for
 * every path of init, few enough that the target measures the loader and
 * not the allocator (huge pools are item 4 of issue 8). */
#define MAX_SLOTS 1024u

FUZZ_FILE_INITIALIZE("fuzz-ini")

static int same_config(const pv_cache_config *a, const pv_cache_config *b)
{
    return a->policy == b->policy && a->alpha == b->alpha && a->beta == b->beta && a->c == b->c &&
           a->chunk_tokens == b->chunk_tokens && a->n_layers == b->n_layers &&
           a->slot_bytes == b->slot_bytes && a->device_bytes == b->device_bytes &&
           a->host_bytes == b->host_bytes && a->high_water == b->high_water && a->reserve == b->reserve;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file_write(data, size);
    pv_cache_config cfg, before;
    pv_cache_config_defaults(&cfg);
    before = cfg;
    if (pv_cache_config_load(&cfg, path) != PV_OK) {
        if (!same_config(&cfg, &before)) {
            fprintf(stderr, "fuzz-ini: a failed load changed the config\n");
            abort();
        }
        return 0;
    }
    /* slot_bytes comes from the model, not the file: choose it so the
     * larger pool has at most MAX_SLOTS slots (validation may then refuse
     * a pool smaller than one slot). */
    uint64_t larger = cfg.device_bytes > cfg.host_bytes ? cfg.device_bytes : cfg.host_bytes;
    if (larger / MAX_SLOTS > cfg.slot_bytes)
        cfg.slot_bytes = larger / MAX_SLOTS;
    if (pv_cache_config_validate(&cfg) != PV_OK)
        return 0;
    pv_cache *cache = NULL;
    if (pv_cache_init(&cache, &cfg, NULL, NULL) != PV_OK)
        return 0;
    (void)pv_cache_session_open(cache, "s");
    (void)pv_cache_store_chunk(cache, "s", 0, cfg.n_layers - 1, PV_TIER_DEVICE, NULL);
    if (pv_cache_check(cache) != PV_OK) {
        fprintf(stderr, "fuzz-ini: %s\n", pv_last_error());
        abort();
    }
    pv_cache_free(cache);
    return 0;
}
