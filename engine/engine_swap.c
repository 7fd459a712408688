/* The swap executor: turns the cache's plans into backend copies.
 *
 * Ordering (backend.h's contract): kernels run on the compute queue, swap
 * traffic on the copy queue, events order the two.
 * - Swap-out (DEVICE -> HOST): one slot_gather launch on the compute queue
 *   packs the slots into device staging (after any kernel that wrote them),
 *   the copy queue moves the staging to pinned host staging, and the host
 *   places each slot in the host pool. Evictions wait for it at once (their
 *   device slots are reused next); ahead-of-time swap-outs run in the
 *   background and are reaped after the next forward pass.
 * - Swap-in (HOST -> DEVICE): each layer's chunks are copied on the copy
 *   queue and an event recorded per layer; the forward pass waits for layer
 *   L's event just before layer L writes or reads the pool, so later layers'
 *   copies overlap earlier layers' compute. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "engine/engine_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

pv_status pv_engine_swap_init(pv_engine *e)
{
    pv_cache_plan_init(&e->out.plan);
    if (!e->host_pool)
        return PV_OK; /* gpu-only: nothing ever moves to host */
    uint64_t n = e->cfg.swap_out_chunks;
    if (n > (uint64_t)e->n_device_slots)
        n = (uint64_t)e->n_device_slots;
    e->cfg.swap_out_chunks = (uint32_t)n;
    pv_status st = pv_buffer_init(&e->dev_staging, e->be, PV_MEM_DEVICE, n * e->slot_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&e->host_staging, e->be, PV_MEM_HOST, n * e->slot_bytes);
    if (st == PV_OK && !(e->staging_slots = malloc(n * sizeof *e->staging_slots)))
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "engine: staging slot list of %" PRIu64 " entries", n);
    return st;
}

void pv_engine_swap_free(pv_engine *e)
{
    if (e->out.in_flight && e->out.done)
        pv_event_wait(e->out.done);
    pv_event_free(e->out.done);
    pv_cache_plan_free(&e->out.plan);
    pv_buffer_free(e->dev_staging);
    pv_buffer_free(e->host_staging);
    free(e->staging_slots);
}

/* Gathers n device slots (e->staging_slots) into device staging on the
 * compute queue and copies them to host staging on the copy queue; *done
 * completes when the bytes are in host staging. */
static pv_status gather_to_host(pv_engine *e, int32_t n, pv_event **done)
{
    pv_slot_copy_args g = {
        .dtype = e->kv_dtype, .slot_elems = e->slot_elems,
        .pool = e->device_pool, .n_slots = e->n_device_slots,
        .staging = e->dev_staging, .staging_off = 0,
        .slots = e->staging_slots, .n_slots_moved = n,
    };
    pv_event *gathered = NULL;
    pv_status st = pv_slot_gather(e->be, &g);
    if (st == PV_OK)
        st = pv_event_record(e->be, PV_QUEUE_COMPUTE, &gathered);
    if (st == PV_OK)
        st = pv_copy_async(PV_QUEUE_COPY, e->host_staging, 0, e->dev_staging, 0,
                           (uint64_t)n * e->slot_bytes, gathered, done);
    pv_event_free(gathered);
    return st;
}

/* Host staging entry i -> host pool slot. */
static void place_in_host(pv_engine *e, int32_t i, uint32_t host_slot)
{
    memcpy((char *)e->host_pool->host_ptr + (uint64_t)host_slot * e->slot_bytes,
           (const char *)e->host_staging->host_ptr + (uint64_t)i * e->slot_bytes, e->slot_bytes);
}

/* Copies the DEVICE -> HOST moves moves[0..n) that carry bytes, in order,
 * waiting for each staging batch. */
static pv_status copy_out_now(pv_engine *e, const pv_cache_move *moves, size_t n)
{
    size_t i = 0;
    while (i < n) {
        int32_t k = 0;
        size_t first = i;
        for (; i < n && k < (int32_t)e->cfg.swap_out_chunks; i++)
            if (moves[i].from == PV_TIER_DEVICE && moves[i].to == PV_TIER_HOST)
                e->staging_slots[k++] = (int32_t)moves[i].from_slot;
        if (k == 0)
            continue;
        pv_event *done = NULL;
        pv_status st = gather_to_host(e, k, &done);
        if (st == PV_OK)
            st = pv_event_wait(done);
        pv_event_free(done);
        if (st != PV_OK)
            return st;
        k = 0;
        for (size_t j = first; j < i; j++)
            if (moves[j].from == PV_TIER_DEVICE && moves[j].to == PV_TIER_HOST)
                place_in_host(e, k++, moves[j].to_slot);
    }
    return PV_OK;
}

pv_status pv_engine_run_plan(pv_engine *e, const pv_cache_plan *plan)
{
    if (plan->n_moves == 0)
        return PV_OK;
    /* The staging buffers are shared with the background swap-out. */
    pv_status st = pv_engine_swap_out_reap(e);
    if (st != PV_OK)
        return st;
    /* Drops and shadow notes move no bytes; a move to HOST does. Host
     * slots a drop frees may be refilled later in the same plan, so the
     * copies are placed in plan order. */
    for (size_t i = 0; i < plan->n_moves; i++) {
        const pv_cache_move *m = &plan->moves[i];
        if (m->two_phase)
            return pv_error(PV_ERR_STATE, "engine: eviction plan move %zu is two-phase", i);
        if (m->from == PV_TIER_DEVICE && m->to == PV_TIER_HOST) {
            if (!e->host_pool)
                return pv_error(PV_ERR_STATE, "engine: a move to HOST in gpu-only mode");
            return copy_out_now(e, plan->moves + i, plan->n_moves - i);
        }
    }
    return PV_OK;
}

pv_status pv_engine_make_room(pv_engine *e, uint64_t slots)
{
    pv_cache_plan_clear(&e->scratch);
    pv_status st = pv_cache_evict_to_free(e->cache, PV_TIER_DEVICE, slots * e->slot_bytes, &e->scratch);
    if (st == PV_OK)
        st = pv_engine_run_plan(e, &e->scratch);
    return st;
}

pv_status pv_engine_swap_out_reap(pv_engine *e)
{
    pv_swap_out *o = &e->out;
    if (!o->in_flight)
        return PV_OK;
    pv_status st = pv_event_wait(o->done);
    pv_event_free(o->done);
    o->done = NULL;
    o->in_flight = 0;
    int32_t k = 0;
    for (size_t i = 0; i < o->plan.n_moves; i++) {
        const pv_cache_move *m = &o->plan.moves[i];
        if (!m->two_phase)
            continue;
        if (st == PV_OK)
            place_in_host(e, k, m->to_slot);
        k++;
    }
    /* Complete or abort the two-phase moves; the others were applied. */
    pv_status st2 = PV_OK;
    for (size_t i = 0; i < o->plan.n_moves; i++) {
        const pv_cache_move *m = &o->plan.moves[i];
        if (m->two_phase) {
            st2 = st == PV_OK ? pv_cache_complete(e->cache, m, 1) : pv_cache_abort(e->cache, m, 1);
            if (st2 != PV_OK)
                break;
        }
    }
    pv_cache_plan_clear(&o->plan);
    return st != PV_OK ? st : st2;
}

pv_status pv_engine_swap_out_issue(pv_engine *e)
{
    if (e->cfg.mode != PV_MODE_PENSIEVE || !e->host_pool)
        return PV_OK;
    /* A batch still in flight is left to land: the next iteration looks
     * again, so the host never waits here for swap traffic. */
    if (e->out.in_flight) {
        int done = 0;
        pv_status qs = pv_event_query(e->out.done, &done);
        if (qs != PV_OK)
            return qs;
        if (!done)
            return PV_OK;
    }
    pv_status st = pv_engine_swap_out_reap(e);
    if (st != PV_OK)
        return st;
    pv_swap_out *o = &e->out;
    pv_cache_plan_clear(&o->plan);
    if ((st = pv_cache_plan_swap_out(e->cache, e->cfg.swap_out_chunks, &o->plan)) != PV_OK)
        return st;
    int32_t k = 0;
    for (size_t i = 0; i < o->plan.n_moves; i++)
        if (o->plan.moves[i].two_phase)
            e->staging_slots[k++] = (int32_t)o->plan.moves[i].from_slot;
    if (k == 0)
        return PV_OK;
    if ((st = gather_to_host(e, k, &o->done)) != PV_OK) {
        for (size_t i = 0; i < o->plan.n_moves; i++)
            if (o->plan.moves[i].two_phase)
                pv_cache_abort(e->cache, &o->plan.moves[i], 1);
        pv_cache_plan_clear(&o->plan);
        return st;
    }
    o->in_flight = 1;
    return PV_OK;
}

pv_status pv_engine_swap_in_issue(pv_engine *e, pv_request *r, const pv_cache_plan *plan)
{
    /* Room first: the plan's evictions of other sessions' chunks, applied
     * already, must have their bytes out before the slots are overwritten. */
    size_t n_two = 0;
    for (size_t i = 0; i < plan->n_moves; i++)
        n_two += plan->moves[i].two_phase != 0;
    pv_status st = PV_OK;
    if (n_two < plan->n_moves) {
        pv_cache_plan evictions = {.moves = plan->moves, .n_moves = 0};
        while (evictions.n_moves < plan->n_moves && !plan->moves[evictions.n_moves].two_phase)
            evictions.n_moves++;
        if ((st = pv_engine_run_plan(e, &evictions)) != PV_OK)
            return st;
    }
    if (n_two == 0)
        return PV_OK;
    r->swap_in = malloc(n_two * sizeof *r->swap_in);
    r->layer_ready = calloc(e->n_layers, sizeof *r->layer_ready);
    if (!r->swap_in || !r->layer_ready)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "engine: swap-in of %zu chunks", n_two);
    for (size_t i = 0; i < plan->n_moves; i++)
        if (plan->moves[i].two_phase)
            r->swap_in[r->n_swap_in++] = plan->moves[i];
    /* Layer by layer, so layer L's event fires before layer L+1's copies. */
    for (uint32_t l = 0; l < e->n_layers && st == PV_OK; l++) {
        int any = 0;
        for (size_t i = 0; i < r->n_swap_in && st == PV_OK; i++) {
            const pv_cache_move *m = &r->swap_in[i];
            if (m->layer != l)
                continue;
            st = pv_copy_async(PV_QUEUE_COPY, e->device_pool, (uint64_t)m->to_slot * e->slot_bytes,
                               e->host_pool, (uint64_t)m->from_slot * e->slot_bytes, e->slot_bytes,
                               NULL, NULL);
            any = 1;
        }
        if (st == PV_OK && any)
            st = pv_event_record(e->be, PV_QUEUE_COPY, &r->layer_ready[l]);
    }
    return st;
}

pv_status pv_engine_swap_in_finish(pv_engine *e, pv_request *r)
{
    pv_status st = PV_OK;
    if (r->layer_ready) {
        for (uint32_t l = 0; l < e->n_layers; l++) {
            if (r->layer_ready[l] && st == PV_OK)
                st = pv_event_wait(r->layer_ready[l]);
            pv_event_free(r->layer_ready[l]);
        }
        free(r->layer_ready);
        r->layer_ready = NULL;
    }
    if (r->n_swap_in) {
        pv_status st2 = st == PV_OK ? pv_cache_complete(e->cache, r->swap_in, r->n_swap_in)
                                    : pv_cache_abort(e->cache, r->swap_in, r->n_swap_in);
        if (st == PV_OK)
            st = st2;
    }
    free(r->swap_in);
    r->swap_in = NULL;
    r->n_swap_in = 0;
    return st;
}

pv_status pv_engine_copy_slot(pv_engine *e, pv_tier from, uint32_t from_slot, uint32_t to_slot)
{
    const pv_buffer *src = from == PV_TIER_HOST ? e->host_pool : e->device_pool;
    if (from == PV_TIER_DEVICE && from_slot == to_slot)
        return PV_OK;
    pv_event *done = NULL;
    pv_status st = pv_copy_async(PV_QUEUE_COMPUTE, e->device_pool, (uint64_t)to_slot * e->slot_bytes,
                                 src, (uint64_t)from_slot * e->slot_bytes, e->slot_bytes, NULL, &done);
    if (st == PV_OK)
        st = pv_event_wait(done);
    pv_event_free(done);
    return st;
}
