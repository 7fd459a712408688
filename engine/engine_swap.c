/* The swap executor: turns the cache's plans into backend transfers.
 *
 * Ordering (backend.h's contract): kernels run on the compute queue, swap
 * traffic on the copy queue, events order the two. Every batch of moves is
 * one pv_slot_transfer between the pools, whatever its number of chunks
 * (docs/swap.md): on a GPU each backend call costs the host microseconds,
 * and a swap-in of thousands of chunks must not cost thousands of calls.
 * - Swap-out (DEVICE -> HOST): an event recorded on the compute queue
 *   (after every kernel that wrote the slots), then one transfer on the
 *   copy queue waiting for it, straight into the host pool's slots.
 *   Evictions wait for it at once (their device slots are reused next);
 *   ahead-of-time swap-outs run in the background and are reaped after the
 *   next forward pass.
 * - Swap-in (HOST -> DEVICE): one transfer per layer on the copy queue,
 *   whose event the forward pass waits for just before layer L writes or
 *   reads the pool, so later layers' transfers overlap earlier layers'
 *   compute. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "engine/engine_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The cache's HOST growth hook: the next segment, allocated now. */
static uint32_t grow_host(void *ctx, uint32_t n_backed)
{
    pv_engine *e = ctx;
    if (e->host_grow_refused || e->n_host_segs == e->max_host_segs)
        return n_backed;
    int64_t first = (int64_t)e->n_host_segs * e->host_seg_slots;
    int64_t n = e->n_host_slots - first < e->host_seg_slots ? e->n_host_slots - first : e->host_seg_slots;
    if (pv_buffer_init(&e->host_segs[e->n_host_segs], e->be, PV_MEM_HOST, (uint64_t)n * e->slot_bytes) != PV_OK) {
        /* Trying again at every eviction would cost a failed allocation
         * each; HOST stays the size it reached. */
        e->host_grow_refused = 1;
        e->stats.host_segments_refused++;
        fprintf(stderr, "pensieve: host tier: segment %zu (%" PRIu64 " bytes) not allocated: %s; the host tier "
                "stays at %" PRId64 " of its %" PRId64 " slots\n", e->n_host_segs, (uint64_t)n * e->slot_bytes,
                pv_last_error(), first, e->n_host_slots);
        return n_backed;
    }
    e->n_host_segs++;
    e->stats.host_segments++;
    return (uint32_t)(first + n);
}

pv_status pv_engine_swap_init(pv_engine *e)
{
    pv_cache_plan_init(&e->out.plan);
    if (e->n_host_slots == 0)
        return PV_OK;
    if (e->cfg.swap_out_chunks > (uint64_t)e->n_device_slots)
        e->cfg.swap_out_chunks = (uint32_t)e->n_device_slots;
    uint64_t seg_bytes = e->cfg.host_segment_bytes ? e->cfg.host_segment_bytes : PV_ENGINE_HOST_SEGMENT_BYTES;
    if (e->be->info.max_alloc_bytes && seg_bytes > e->be->info.max_alloc_bytes)
        seg_bytes = e->be->info.max_alloc_bytes;
    e->host_seg_slots = (int64_t)(seg_bytes / e->slot_bytes);
    if (e->host_seg_slots < 1)
        e->host_seg_slots = 1;
    if (e->host_seg_slots > e->n_host_slots)
        e->host_seg_slots = e->n_host_slots;
    e->max_host_segs = (size_t)((e->n_host_slots + e->host_seg_slots - 1) / e->host_seg_slots);
    e->host_segs = calloc(e->max_host_segs, sizeof *e->host_segs);
    e->host_seg_fill = calloc(e->max_host_segs + 1, sizeof *e->host_seg_fill);
    if (!e->host_segs || !e->host_seg_fill)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_init: host tier of %zu segments", e->max_host_segs);
    return pv_cache_host_growth(e->cache, 0, grow_host, e);
}

void pv_engine_swap_free(pv_engine *e)
{
    if (e->out.in_flight && e->out.done)
        pv_event_wait(e->out.done);
    pv_event_free(e->out.done);
    pv_cache_plan_free(&e->out.plan);
    pv_ivec_free(&e->xfer_dst);
    pv_ivec_free(&e->xfer_src);
    pv_ivec_free(&e->seg_dst);
    pv_ivec_free(&e->seg_src);
    for (size_t i = 0; i < e->n_host_segs; i++)
        pv_buffer_free(e->host_segs[i]);
    free(e->host_segs);
    free(e->host_seg_fill);
}

pv_buffer *pv_engine_host_slot(const pv_engine *e, uint32_t slot, uint64_t *offset)
{
    *offset = (uint64_t)(slot % e->host_seg_slots) * e->slot_bytes;
    return e->host_segs[slot / e->host_seg_slots];
}

/* Room for n entries in the transfer lists, emptied. */
static pv_status xfer_reserve(pv_engine *e, size_t n)
{
    e->xfer_dst.n = e->xfer_src.n = 0;
    pv_status st = pv_ivec_reserve(&e->xfer_dst, n);
    return st == PV_OK ? pv_ivec_reserve(&e->xfer_src, n) : st;
}

/* The n (> 0) slots listed from entry `first` of the transfer lists, from
 * pool `from` to the other pool, after `wait`: one transfer for each HOST
 * segment they touch, in segment order; the copy queue runs them in order,
 * so *done, the last one's event, completes when all have landed. */
static pv_status transfer(pv_engine *e, pv_tier from, size_t first, size_t n, pv_event *wait, pv_event **done)
{
    const int out = from == PV_TIER_DEVICE;
    const int32_t *host = (out ? e->xfer_dst.v : e->xfer_src.v) + first;
    const int32_t *dev = (out ? e->xfer_src.v : e->xfer_dst.v) + first;
    /* A counting sort by segment; within one, the lists' order. */
    size_t *fill = e->host_seg_fill;
    memset(fill, 0, (e->max_host_segs + 1) * sizeof *fill);
    for (size_t i = 0; i < n; i++)
        fill[host[i] / e->host_seg_slots + 1]++;
    for (size_t g = 0; g < e->max_host_segs; g++)
        fill[g + 1] += fill[g];
    e->seg_dst.n = e->seg_src.n = 0;
    pv_status st = pv_ivec_reserve(&e->seg_dst, n);
    if (st != PV_OK || (st = pv_ivec_reserve(&e->seg_src, n)) != PV_OK)
        return st;
    int32_t *seg_host = out ? e->seg_dst.v : e->seg_src.v, *seg_dev = out ? e->seg_src.v : e->seg_dst.v;
    for (size_t i = 0; i < n; i++) {
        size_t at = fill[host[i] / e->host_seg_slots]++;
        seg_host[at] = (int32_t)(host[i] % e->host_seg_slots);
        seg_dev[at] = dev[i];
    }
    /* fill[g] now ends segment g's run. */
    size_t begin = 0;
    for (size_t g = 0; g < e->max_host_segs && st == PV_OK; g++) {
        size_t end = fill[g];
        if (end == begin)
            continue;
        pv_buffer *seg = e->host_segs[g];
        int64_t seg_slots = (int64_t)(seg->bytes / e->slot_bytes);
        pv_slot_transfer_args t = {
            .dtype = e->kv_dtype, .slot_elems = e->slot_elems,
            .dst = out ? seg : e->device_pool, .dst_n_slots = out ? seg_slots : e->n_device_slots,
            .src = out ? e->device_pool : seg, .src_n_slots = out ? e->n_device_slots : seg_slots,
            .dst_slots = e->seg_dst.v + begin, .src_slots = e->seg_src.v + begin, .n = (int32_t)(end - begin),
        };
        st = pv_slot_transfer(e->be, &t, wait, end == n ? done : NULL);
        begin = end;
    }
    return st;
}

/* The listed DEVICE -> HOST moves in one transfer, after the compute work
 * enqueued so far (the kernels that wrote the slots); *done completes when
 * the bytes are in the host pool. */
static pv_status transfer_out(pv_engine *e, pv_event **done)
{
    pv_event *written = NULL;
    pv_status st = pv_event_record(e->be, PV_QUEUE_COMPUTE, &written);
    if (st == PV_OK)
        st = transfer(e, PV_TIER_DEVICE, 0, e->xfer_dst.n, written, done);
    pv_event_free(written);
    return st;
}

/* A DEVICE -> HOST move of a plan and its place in it. */
typedef struct out_move {
    uint32_t to_slot, from_slot;
    size_t order;
} out_move;

static int by_host_slot_then_order(const void *pa, const void *pb)
{
    const out_move *a = pa, *b = pb;
    if (a->to_slot != b->to_slot)
        return a->to_slot < b->to_slot ? -1 : 1;
    return (a->order > b->order) - (a->order < b->order);
}

/* Copies the DEVICE -> HOST moves of moves[0..n) and waits for them. A
 * plan may fill a host slot twice (a chunk moved down, dropped later in
 * the plan for room, its slot refilled): only the last move into a host
 * slot carries bytes anyone will read, and one transfer may write a slot
 * only once. */
static pv_status copy_out_now(pv_engine *e, const pv_cache_move *moves, size_t n)
{
    out_move *outs = malloc((n ? n : 1) * sizeof *outs);
    if (!outs)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "engine: eviction plan of %zu moves", n);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (moves[i].from == PV_TIER_DEVICE && moves[i].to == PV_TIER_HOST)
            outs[k++] = (out_move){moves[i].to_slot, moves[i].from_slot, i};
    qsort(outs, k, sizeof *outs, by_host_slot_then_order);
    pv_status st = xfer_reserve(e, k);
    for (size_t i = 0; i < k && st == PV_OK; i++)
        if (i + 1 == k || outs[i + 1].to_slot != outs[i].to_slot) {
            e->xfer_dst.v[e->xfer_dst.n++] = (int32_t)outs[i].to_slot;
            e->xfer_src.v[e->xfer_src.n++] = (int32_t)outs[i].from_slot;
        }
    free(outs);
    pv_event *done = NULL;
    if (st == PV_OK)
        st = transfer_out(e, &done);
    if (st == PV_OK)
        st = pv_event_wait(done);
    pv_event_free(done);
    return st;
}

pv_status pv_engine_run_plan(pv_engine *e, const pv_cache_plan *plan)
{
    /* Drops and shadow notes move no bytes; a move to HOST does. A
     * background swap-out in flight may stay so: its slots are held, and
     * the copy queue runs the two transfers in order. */
    for (size_t i = 0; i < plan->n_moves; i++) {
        const pv_cache_move *m = &plan->moves[i];
        if (m->two_phase)
            return pv_error(PV_ERR_STATE, "engine: eviction plan move %zu is two-phase", i);
        if (m->from == PV_TIER_DEVICE && m->to == PV_TIER_HOST) {
            if (e->n_host_slots == 0)
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
    if (e->cfg.mode != PV_MODE_PENSIEVE || e->n_host_slots == 0)
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
    if ((st = xfer_reserve(e, o->plan.n_moves)) != PV_OK)
        return st;
    for (size_t i = 0; i < o->plan.n_moves; i++)
        if (o->plan.moves[i].two_phase) {
            e->xfer_dst.v[e->xfer_dst.n++] = (int32_t)o->plan.moves[i].to_slot;
            e->xfer_src.v[e->xfer_src.n++] = (int32_t)o->plan.moves[i].from_slot;
        }
    if (e->xfer_dst.n == 0)
        return PV_OK;
    if ((st = transfer_out(e, &o->done)) != PV_OK) {
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
    /* The moves in layer order (a counting sort): end[l] ends layer l's
     * run of the transfer lists once they are filled. */
    size_t *end = calloc((size_t)e->n_layers + 1, sizeof *end);
    if (!end)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "engine: swap-in of %u layers", e->n_layers);
    if ((st = xfer_reserve(e, n_two)) != PV_OK) {
        free(end);
        return st;
    }
    for (size_t i = 0; i < r->n_swap_in; i++)
        end[r->swap_in[i].layer + 1]++;
    for (uint32_t l = 0; l < e->n_layers; l++)
        end[l + 1] += end[l];
    for (size_t i = 0; i < r->n_swap_in; i++) {
        const pv_cache_move *m = &r->swap_in[i];
        size_t at = end[m->layer]++;
        e->xfer_dst.v[at] = (int32_t)m->to_slot;
        e->xfer_src.v[at] = (int32_t)m->from_slot;
    }
    e->xfer_dst.n = e->xfer_src.n = n_two;
    /* One transfer a layer, in layer order: the copy queue runs them in
     * order, so layer L's event fires before layer L + 1's bytes move. */
    for (uint32_t l = 0; l < e->n_layers && st == PV_OK; l++) {
        size_t begin = l ? end[l - 1] : 0;
        if (end[l] > begin)
            st = transfer(e, PV_TIER_HOST, begin, end[l] - begin, NULL, &r->layer_ready[l]);
    }
    free(end);
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
    if (from == PV_TIER_DEVICE && from_slot == to_slot)
        return PV_OK;
    uint64_t src_off = (uint64_t)from_slot * e->slot_bytes;
    const pv_buffer *src = from == PV_TIER_HOST ? pv_engine_host_slot(e, from_slot, &src_off) : e->device_pool;
    pv_event *done = NULL;
    pv_status st = pv_copy_async(PV_QUEUE_COMPUTE, e->device_pool, (uint64_t)to_slot * e->slot_bytes,
                                 src, src_off, e->slot_bytes, NULL, &done);
    if (st == PV_OK)
        st = pv_event_wait(done);
    pv_event_free(done);
    return st;
}
