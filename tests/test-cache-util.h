/* Helpers shared by the cache tests: a manual clock and a small cache. */
#ifndef PV_TESTS_CACHE_UTIL_H
#define PV_TESTS_CACHE_UTIL_H

#include "tap.h"

#include <pensieve/cache.h>

#include <stdint.h>
#include <string.h>

/* The randomized tests' generator (xorshift64*: small, fast, the same on
 * every platform); seed rng_state with a nonzero value. */
static uint64_t rng_state;

static inline uint64_t rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static inline uint32_t pick(uint32_t n)
{
    return (uint32_t)(rng() % n);
}

/* A clock the test moves by hand, so eviction order is deterministic. */
typedef struct test_clock {
    double now;
} test_clock;

static inline double test_clock_read(void *ctx)
{
    return ((test_clock *)ctx)->now;
}

#define TEST_SLOT_BYTES 1024u

/* A cache of device_slots + host_slots slots of TEST_SLOT_BYTES bytes. */
static inline pv_cache *test_cache(pv_policy policy, uint32_t n_layers, uint32_t device_slots,
                                   uint32_t host_slots, test_clock *clock)
{
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.policy = policy;
    cfg.n_layers = n_layers;
    cfg.slot_bytes = TEST_SLOT_BYTES;
    cfg.device_bytes = (uint64_t)device_slots * TEST_SLOT_BYTES;
    cfg.host_bytes = (uint64_t)host_slots * TEST_SLOT_BYTES;
    pv_cache *cache = NULL;
    if (pv_cache_init(&cache, &cfg, test_clock_read, clock) != PV_OK) {
        tap_diag("pv_cache_init: %s", pv_last_error());
        return NULL;
    }
    return cache;
}

/* ok() on pv_cache_check, with the violation on failure. */
static inline int check_ok(const pv_cache *cache, const char *what)
{
    pv_status st = pv_cache_check(cache);
    if (st != PV_OK)
        tap_diag("%s", pv_last_error());
    return ok(st == PV_OK, "invariants hold: %s", what);
}

static inline pv_tier tier_of(pv_cache *cache, const char *id, uint32_t chunk, uint32_t layer)
{
    pv_tier tier = PV_TIER_NONE;
    if (pv_cache_lookup(cache, id, chunk, layer, &tier, NULL) != PV_OK)
        return PV_TIER_NONE;
    return tier;
}

/* Field by field: padding bytes of a struct are not part of its value. */
static inline int same_view(const pv_session_view *a, const pv_session_view *b)
{
    return a->tokens == b->tokens && a->n_tokens == b->n_tokens &&
           a->committed_tokens == b->committed_tokens && a->turns == b->turns &&
           a->n_chunks == b->n_chunks && a->records[0] == b->records[0] &&
           a->records[1] == b->records[1] && a->records[2] == b->records[2] &&
           a->recompute_tokens == b->recompute_tokens && a->shadows == b->shadows &&
           a->held_bytes[0] == b->held_bytes[0] &&
           a->held_bytes[1] == b->held_bytes[1] && a->pins == b->pins &&
           a->last_active == b->last_active;
}

#endif
