/* The iteration scheduler: admission, unified batches, sampling, the end of
 * a turn, suspension.
 *
 * A running request's work is a list of tokens to run at explicit
 * positions: first the history it must recompute (positions 0..R-1, the
 * session's dropped leading chunks), then its feed list (the new prompt,
 * then each sampled token) from the history's end on. One iteration takes
 * one token from every request with a single token left (decode), then
 * prefill pieces first come first served until the token budget is spent,
 * and runs them all in one forward pass. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "engine/engine_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t div_up(uint64_t a, uint32_t b)
{
    return (uint32_t)((a + b - 1) / b);
}

/* ---- the waiting queue and the running set ------------------------------------ */

static pv_request *queue_pop(pv_engine *e)
{
    pv_request *r = e->wait_head;
    e->wait_head = r->next;
    if (!e->wait_head)
        e->wait_tail = NULL;
    r->next = NULL;
    e->n_waiting--;
    return r;
}

static void queue_push_front(pv_engine *e, pv_request *r)
{
    r->next = e->wait_head;
    e->wait_head = r;
    if (!e->wait_tail)
        e->wait_tail = r;
    e->n_waiting++;
}

static void running_remove(pv_engine *e, pv_request *r)
{
    for (size_t i = 0; i < e->n_running; i++)
        if (e->running[i] == r) {
            memmove(e->running + i, e->running + i + 1, (e->n_running - i - 1) * sizeof *e->running);
            e->n_running--;
            return;
        }
}

/* ---- slot tables ------------------------------------------------------------------ */

static int32_t *slot_ref(pv_request *r, uint32_t layer, uint32_t chunk)
{
    return &r->slots[(size_t)layer * r->cap_chunks + chunk];
}

/* Room for `chunks` chunks in r's table, growing by doubling. */
static pv_status table_reserve(pv_engine *e, pv_request *r, uint32_t chunks)
{
    if (chunks <= r->cap_chunks)
        return PV_OK;
    uint32_t cap = r->cap_chunks ? r->cap_chunks : 8;
    while (cap < chunks)
        cap *= 2;
    int32_t *t = malloc((size_t)e->n_layers * cap * sizeof *t);
    if (!t)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "engine: slot table of %u layers x %u chunks", e->n_layers, cap);
    for (uint32_t l = 0; l < e->n_layers; l++)
        for (uint32_t c = 0; c < cap; c++)
            t[(size_t)l * cap + c] = c < r->cap_chunks ? r->slots[(size_t)l * r->cap_chunks + c] : -1;
    free(r->slots);
    r->slots = t;
    r->cap_chunks = cap;
    return PV_OK;
}

/* Stores (chunk, layer) on DEVICE, making room once by eviction. */
static pv_status store_device(pv_engine *e, pv_request *r, uint32_t chunk, uint32_t layer, uint32_t *slot)
{
    pv_status st = pv_cache_store_chunk(e->cache, r->session->id, chunk, layer, PV_TIER_DEVICE, slot);
    if (st == PV_ERR_OUT_OF_MEMORY && (st = pv_engine_make_room(e, 1)) == PV_OK)
        st = pv_cache_store_chunk(e->cache, r->session->id, chunk, layer, PV_TIER_DEVICE, slot);
    return st;
}

/* Every layer of chunk `chunk` has a DEVICE slot in r's table. */
static pv_status ensure_chunk(pv_engine *e, pv_request *r, uint32_t chunk)
{
    pv_status st = table_reserve(e, r, chunk + 1);
    if (st != PV_OK)
        return st;
    if (*slot_ref(r, e->n_layers - 1, chunk) >= 0)
        return PV_OK;
    /* Room for the whole chunk at once, so eviction plans batch. */
    uint32_t missing = 0;
    for (uint32_t l = 0; l < e->n_layers; l++)
        missing += *slot_ref(r, l, chunk) < 0;
    pv_cache_stats cs;
    pv_cache_stats_get(e->cache, &cs);
    uint64_t free_slots = (cs.capacity_bytes[PV_TIER_DEVICE] - cs.used_bytes[PV_TIER_DEVICE]) / e->slot_bytes;
    if (free_slots < missing && (st = pv_engine_make_room(e, missing)) != PV_OK)
        return st;
    for (uint32_t l = 0; l < e->n_layers; l++) {
        int32_t *ref = slot_ref(r, l, chunk);
        if (*ref >= 0)
            continue;
        uint32_t slot;
        if ((st = store_device(e, r, chunk, l, &slot)) != PV_OK)
            return st;
        *ref = (int32_t)slot;
    }
    if (chunk + 1 > r->n_chunks)
        r->n_chunks = chunk + 1;
    return PV_OK;
}

/* ---- admission ---------------------------------------------------------------------- */

/* Tokens of chunk c in a history of h tokens. */
static uint32_t chunk_fill(const pv_engine *e, uint32_t c, uint64_t h)
{
    uint64_t start = (uint64_t)c * e->chunk_tokens;
    return start >= h ? 0 : (uint32_t)(h - start < e->chunk_tokens ? h - start : e->chunk_tokens);
}

static pv_status fail_request(pv_engine *e, pv_request *r, pv_status st);

pv_status pv_engine_admit(pv_engine *e, pv_request *r, int *admitted)
{
    *admitted = 0;
    pv_esession *s = r->session;
    const char *id = s->id;
    int touched = 0;
    /* Chunks under a background copy can be neither read for writing nor
     * replaced: let it land first. */
    pv_status st = pv_engine_swap_out_reap(e);
    if (st != PV_OK)
        return st;
    if (!s->opened) {
        if ((st = pv_cache_session_open(e->cache, id)) != PV_OK)
            return st;
        s->opened = 1;
    }
    if ((st = pv_cache_pin(e->cache, id)) != PV_OK)
        return st;
    /* Leading chunks of the turn that other sessions of the namespace hold
     * already are linked, not computed: their tokens join the history. */
    uint32_t shared_end;
    if ((st = pv_cache_share_prefix(e->cache, id, s->history.v, s->history.n, r->feed.v + r->fed,
                                    r->feed.n - r->fed, &shared_end)) != PV_OK)
        goto unpin;
    if (shared_end > s->history.n) {
        size_t n = shared_end - s->history.n;
        if ((st = pv_ivec_append(&s->history, r->feed.v + r->fed, n)) != PV_OK)
            goto unpin;
        r->fed += n;
        e->stats.shared_prompt_tokens += n;
        if (r->t_admit == 0) {
            r->result.context_tokens += (uint32_t)n;
            r->result.new_tokens -= (uint32_t)n;
        }
    }
    pv_session_view view;
    if ((st = pv_cache_session_restore(e->cache, id, &view)) != PV_OK)
        goto unpin;
    /* A shared chunk another running turn is copying in or recomputing is
     * read once that turn has run. */
    if (view.shared_busy && e->n_running > 0) {
        st = PV_OK;
        goto unpin;
    }
    const uint64_t H = s->history.n;
    /* A cache history shorter than ours (a fresh cache session: stateless
     * mode, or after a suspension mid-recovery) means recompute it all. */
    uint64_t R = view.n_tokens < H ? H : view.recompute_tokens;
    if (R > H)
        R = H;
    const uint32_t L = e->n_layers, Rc = div_up(R, e->chunk_tokens), Hc = div_up(H, e->chunk_tokens);
    const uint32_t end_chunks = div_up(H + (r->feed.n - r->fed), e->chunk_tokens);
    /* New DEVICE slots: every (chunk, layer) of the context through this
     * turn's tokens, less those on DEVICE already (records and the shadows
     * of host records). A recomputed chunk's layers kept on HOST or DEVICE
     * are replaced, not added to (the cache holds nothing past the
     * history: pv_cache_session_trim). */
    const uint64_t on_device = (uint64_t)view.records[PV_TIER_DEVICE] + view.shadows +
                               view.shared_records[PV_TIER_DEVICE] + view.shared_shadows;
    const uint64_t context = (uint64_t)(end_chunks > Hc ? end_chunks : Hc) * L;
    if (on_device > context) {
        st = pv_error(PV_ERR_STATE,
                      "engine: session \"%.64s\" has %" PRIu64 " chunk records on device, more than the %" PRIu64
                      " of its context",
                      id, on_device, context);
        goto unpin;
    }
    const uint64_t need = context - on_device;
    if (need > (uint64_t)e->n_device_slots) {
        pv_cache_unpin(e->cache, id);
        /* Never admissible: the turn fails alone. */
        *admitted = 1;
        return fail_request(e, r, pv_error(PV_ERR_OUT_OF_MEMORY,
                                           "session \"%.64s\": this turn's context needs %" PRIu64
                                           " new device slots; the device pool has %" PRId64,
                                           id, need, e->n_device_slots));
    }
    /* Past the pool less the admission reserve, a turn runs only alone. */
    pv_cache_admission adm = {0, 0};
    if (pv_cache_admit(e->cache, need, &adm) != PV_OK)
        adm.admit = 0;
    /* With nothing running, waiting frees nothing: the reserve kept for
     * other admissions gives way, and the turn runs if its context fits. */
    uint64_t room = adm.admit ? adm.free_bytes / e->slot_bytes : e->n_running == 0 ? need : 0;
    if (!adm.admit && e->n_running > 0) {
        st = PV_OK;
        goto unpin;
    }
    if (room && (st = pv_engine_make_room(e, room)) == PV_ERR_OUT_OF_MEMORY) {
        pv_cache_unpin(e->cache, id);
        if (e->n_running > 0) /* pinned chunks of running turns: wait for them */
            return PV_OK;
        *admitted = 1;
        return fail_request(e, r, pv_error(PV_ERR_OUT_OF_MEMORY,
                                           "session \"%.64s\": its context and this turn need %" PRIu64
                                           " more device slots than the %" PRId64 "-slot pool can free",
                                           id, need, e->n_device_slots));
    }
    if (st != PV_OK)
        goto unpin;
    if ((st = table_reserve(e, r, end_chunks > Hc ? end_chunks : Hc)) != PV_OK)
        goto unpin;
    touched = 1;
    for (size_t i = 0; i < (size_t)L * r->cap_chunks; i++)
        r->slots[i] = -1;
    r->n_chunks = Hc;

    /* Where the kept history is. A chunk's layers may sit in different
     * tiers; reuse is counted per layer and averaged. */
    uint64_t dev_tok_layers = 0, host_tok_layers = 0;
    const uint32_t partial = H % e->chunk_tokens ? Hc - 1 : UINT32_MAX;
    for (uint32_t c = Rc; c < Hc; c++)
        for (uint32_t l = 0; l < L; l++) {
            pv_tier tier;
            uint32_t slot;
            if ((st = pv_cache_lookup(e->cache, id, c, l, &tier, &slot)) != PV_OK)
                goto unpin;
            uint32_t fill = chunk_fill(e, c, H);
            if (tier == PV_TIER_DEVICE) {
                dev_tok_layers += fill;
            } else if (tier == PV_TIER_HOST) {
                host_tok_layers += fill;
            } else {
                st = pv_error(PV_ERR_STATE,
                              "engine: session \"%.64s\" chunk %u layer %u is %s outside the %" PRIu64
                              " tokens to recompute",
                              id, c, l, pv_tier_name(tier), R);
                goto unpin;
            }
            if (c == partial) {
                /* The last, partly filled chunk gets this turn's first
                 * tokens: give it a DEVICE slot of its own (not a shadow
                 * whose host copy would go stale), with its rows. */
                uint32_t fresh;
                if ((st = store_device(e, r, c, l, &fresh)) != PV_OK ||
                    (st = pv_engine_copy_slot(e, tier, slot, fresh)) != PV_OK)
                    goto unpin;
                slot = fresh;
                tier = PV_TIER_DEVICE;
            }
            if (tier == PV_TIER_DEVICE)
                *slot_ref(r, l, c) = (int32_t)slot;
        }
    /* Dropped leading chunks: fresh slots, filled by the recomputation. */
    for (uint32_t c = 0; c < Rc; c++)
        for (uint32_t l = 0; l < L; l++) {
            uint32_t slot;
            if ((st = store_device(e, r, c, l, &slot)) != PV_OK)
                goto unpin;
            *slot_ref(r, l, c) = (int32_t)slot;
        }
    /* Host chunks: layer-pipelined swap-in, after room for them. */
    if (e->n_host_slots > 0) {
        pv_cache_plan_clear(&e->scratch);
        if ((st = pv_cache_plan_swap_in(e->cache, id, &e->scratch)) != PV_OK ||
            (st = pv_engine_swap_in_issue(e, r, &e->scratch)) != PV_OK)
            goto unpin;
        for (size_t i = 0; i < r->n_swap_in; i++)
            *slot_ref(r, r->swap_in[i].layer, r->swap_in[i].chunk) = (int32_t)r->swap_in[i].to_slot;
    }
    r->recompute = (uint32_t)R;
    r->recompute_done = 0;
    /* The turn's result says where its history came from: the first
     * admission's view, so the three add up to context_tokens. A request
     * resumed after a suspension reads its history (and its own tokens so
     * far) again; that work shows in the engine's statistics only. */
    if (r->t_admit == 0) {
        uint64_t shared = (uint64_t)view.shared_chunks * e->chunk_tokens;
        r->result.shared_tokens = shared > R ? (uint32_t)((shared < H ? shared : H) - R) : 0;
        r->result.reused_device = (uint32_t)((dev_tok_layers + L / 2) / L);
        r->result.reused_host = (uint32_t)((host_tok_layers + L / 2) / L);
        r->result.recomputed = (uint32_t)R;
    }
    e->stats.reused_device_tokens += (dev_tok_layers + L / 2) / L;
    e->stats.reused_host_tokens += (host_tok_layers + L / 2) / L;
    r->state = PV_REQ_RUNNING;
    if (r->t_admit == 0)
        r->t_admit = pv_engine_now(e);
    if (!r->result.queue_ms)
        r->result.queue_ms = (r->t_admit - r->t_submit) * 1e3;
    e->running[e->n_running++] = r;
    *admitted = 1;
    return PV_OK;
unpin:
    if (r->layer_ready || r->n_swap_in)
        pv_engine_swap_in_finish(e, r);
    pv_cache_unpin(e->cache, id);
    if (touched) {
        /* Slots stored for recomputation hold no KV yet: the cache's copy
         * of this session cannot be trusted; it is recomputed whole. */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", pv_last_error());
        if (pv_cache_end_session(e->cache, id, NULL) == PV_OK)
            s->opened = 0;
        pv_error(st, "%s", msg);
    }
    return st;
}

/* ---- the end of a turn ---------------------------------------------------------------- */

static void end_turn(pv_engine *e, pv_request *r, pv_status status)
{
    pv_esession *s = r->session;
    /* Tokens decided but not run stay for the next turn. */
    s->pending.n = 0;
    pv_status st = pv_ivec_append(&s->pending, r->feed.v + r->fed, r->feed.n - r->fed);
    if (status == PV_OK && st != PV_OK)
        status = st;
    s->request = NULL;
    s->turns++;
    s->last_active = pv_engine_now(e);
    r->result.generated = (uint32_t)r->generated;
    if (r->t_first > 0) {
        r->result.ttft_ms = (r->t_first - r->t_submit) * 1e3;
        r->result.prefill_ms = (r->t_first - r->t_admit) * 1e3;
        r->result.decode_ms = (r->t_last - r->t_first) * 1e3;
    }
    if (status != PV_OK) {
        r->result.finish = PV_FINISH_ERROR;
        e->stats.turns_failed++;
    } else if (r->result.finish == PV_FINISH_CANCELLED) {
        e->stats.turns_cancelled++;
    } else {
        e->stats.turns_done++;
    }
    if (r->cb.on_done)
        r->cb.on_done(r->cb.user, status, &r->result);
    pv_engine_request_free(r);
    /* A stateless turn's session goes with it. Should freeing fail (a
     * backend error while a copy lands), the session stays unreachable by
     * name until the engine is freed. */
    if (s->anonymous)
        (void)pv_engine_forget_session(e, s);
}

/* Unpins (and in stateless mode closes) the cache session of a request
 * leaving the running set. */
static pv_status release_session(pv_engine *e, pv_request *r, int save)
{
    pv_esession *s = r->session;
    pv_status st = PV_OK;
    if (r->layer_ready || r->n_swap_in)
        st = pv_engine_swap_in_finish(e, r);
    if (save && st == PV_OK && s->opened)
        st = pv_cache_session_save(e->cache, s->id, (uint32_t)s->history.n);
    if (s->opened) {
        pv_status st2 = pv_cache_unpin(e->cache, s->id);
        /* A batch given up for room may have stored the next chunk of a
         * turn that now leaves without running it: no KV, no token; a later
         * admission would take it for history. */
        if (st2 == PV_OK)
            st2 = pv_cache_session_trim(e->cache, s->id);
        if (st == PV_OK)
            st = st2;
    }
    if (e->cfg.mode == PV_MODE_STATELESS && s->opened && st == PV_OK) {
        if ((st = pv_cache_end_session(e->cache, s->id, NULL)) == PV_OK)
            s->opened = 0;
    }
    return st;
}

static pv_status finish_request(pv_engine *e, pv_request *r)
{
    pv_engine_flush(r);
    running_remove(e, r);
    pv_status st = release_session(e, r, 1);
    end_turn(e, r, PV_OK);
    return st;
}

/* A turn that fails for its own reasons ends through on_done; the engine
 * goes on. */
static pv_status fail_request(pv_engine *e, pv_request *r, pv_status status)
{
    /* Keep the message: releasing may overwrite it. */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", pv_last_error());
    if (r->state == PV_REQ_RUNNING) {
        running_remove(e, r);
        pv_status st = release_session(e, r, 1);
        if (st != PV_OK)
            return st;
    } else if (e->wait_head == r) {
        queue_pop(e);
    }
    pv_error(status, "%s", msg);
    end_turn(e, r, status);
    return PV_OK;
}

/* Takes a request out of the running set or the waiting queue, keeping
 * what ran as history. */
static pv_status withdraw(pv_engine *e, pv_request *r)
{
    pv_esession *s = r->session;
    if (r->state == PV_REQ_RUNNING) {
        running_remove(e, r);
        int mid_recovery = r->recompute_done < r->recompute;
        pv_status st = release_session(e, r, !mid_recovery);
        /* Recomputation that has not run left slots without KV: forget the
         * cache's copy; the engine's history recovers it next turn. */
        if (st == PV_OK && mid_recovery && s->opened) {
            if ((st = pv_cache_end_session(e->cache, s->id, NULL)) == PV_OK)
                s->opened = 0;
        }
        return st;
    }
    pv_request **p = &e->wait_head, *prev = NULL;
    while (*p != r) {
        prev = *p;
        p = &(*p)->next;
    }
    *p = r->next;
    if (e->wait_tail == r)
        e->wait_tail = prev;
    r->next = NULL;
    e->n_waiting--;
    return PV_OK;
}

pv_status pv_engine_cancel(pv_engine *e, uint64_t request_id)
{
    if (!e)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_cancel: engine is NULL");
    pv_request *r = NULL;
    for (size_t i = 0; i < e->n_running && !r; i++)
        if (e->running[i]->id == request_id)
            r = e->running[i];
    for (pv_request *w = e->wait_head; w && !r; w = w->next)
        if (w->id == request_id)
            r = w;
    if (!r)
        return pv_error(PV_ERR_NOT_FOUND, "pv_engine_cancel: no queued or running turn %" PRIu64, request_id);
    pv_status st = withdraw(e, r);
    r->result.finish = PV_FINISH_CANCELLED;
    end_turn(e, r, PV_OK);
    return st;
}

void pv_engine_end_all(pv_engine *e, pv_status status)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", pv_last_error());
    while (e->n_running || e->wait_head) {
        pv_request *r = e->n_running ? e->running[0] : e->wait_head;
        withdraw(e, r);
        if (status == PV_OK)
            r->result.finish = PV_FINISH_CANCELLED;
        else
            pv_error(status, "%s", msg);
        end_turn(e, r, status);
    }
}

void pv_engine_cancel_all(pv_engine *e)
{
    if (e)
        pv_engine_end_all(e, PV_OK);
}

/* Decode ran out of device slots: the newest running request gives its
 * slots back (unpinned, its chunks evictable) and waits at the queue's
 * head; its tokens so far are history, recovered when it is readmitted. */
static pv_status suspend(pv_engine *e, pv_request *r)
{
    pv_esession *s = r->session;
    running_remove(e, r);
    int mid_recovery = r->recompute_done < r->recompute;
    pv_status st = release_session(e, r, 0);
    /* Slots stored for recomputation that has not run hold no KV: forget
     * the cache's copy of this session, so readmission recomputes it all. */
    if (st == PV_OK && mid_recovery && s->opened) {
        if ((st = pv_cache_end_session(e->cache, s->id, NULL)) == PV_OK)
            s->opened = 0;
    }
    r->state = PV_REQ_WAITING;
    r->recompute = r->recompute_done = 0;
    r->n_chunks = 0;
    r->result.suspensions++;
    e->stats.suspensions++;
    queue_push_front(e, r);
    return st;
}

/* ---- one iteration ----------------------------------------------------------------------- */

typedef struct layer_gate {
    pv_engine *e;
    size_t n_seqs;
} layer_gate;

/* Before layer l touches the pool: its swapped-in chunks have landed. */
static pv_status wait_layer(void *ctx, uint32_t layer)
{
    layer_gate *g = ctx;
    pv_engine *e = g->e;
    for (size_t i = 0; i < g->n_seqs; i++) {
        pv_request *r = e->b_reqs[i];
        if (r->layer_ready && r->layer_ready[layer]) {
            pv_status st = pv_queue_wait(e->be, PV_QUEUE_COMPUTE, r->layer_ready[layer]);
            if (st != PV_OK)
                return st;
        }
    }
    return PV_OK;
}

static uint64_t work_left(const pv_request *r)
{
    return (uint64_t)(r->recompute - r->recompute_done) + (r->feed.n - r->fed);
}

/* Appends `take` tokens of r to the batch, with DEVICE slots for them. */
static pv_status add_piece(pv_engine *e, pv_request *r, uint32_t take, size_t *n_tok)
{
    const pv_esession *s = r->session;
    uint32_t rec = r->recompute_done, feed = (uint32_t)r->fed;
    for (uint32_t k = 0; k < take; k++) {
        uint64_t pos;
        int32_t token;
        if (rec < r->recompute) {
            pos = rec;
            token = s->history.v[rec++];
        } else {
            pos = s->history.n + (feed - r->fed);
            token = r->feed.v[feed++];
        }
        /* Recomputed chunks have their slots from admission. */
        if (pos >= r->recompute) {
            pv_status st = ensure_chunk(e, r, (uint32_t)(pos / e->chunk_tokens));
            if (st != PV_OK)
                return st;
        }
        e->b_tokens[*n_tok] = token;
        e->b_pos[*n_tok] = (int32_t)pos;
        e->b_seq[*n_tok] = r->in_batch - 1;
        (*n_tok)++;
    }
    return PV_OK;
}

/* Fills the batch; PV_ERR_OUT_OF_MEMORY when a request's next chunk found
 * no room (nothing evictable). */
static pv_status build_batch(pv_engine *e, size_t *n_tok, size_t *n_seqs, size_t *n_logits, uint32_t *take_of)
{
    *n_tok = *n_seqs = *n_logits = 0;
    size_t budget = (size_t)e->cfg.token_budget;
    for (size_t i = 0; i < e->n_running; i++)
        e->running[i]->in_batch = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < e->n_running && *n_tok < budget; i++) {
            pv_request *r = e->running[i];
            uint64_t left = work_left(r);
            if ((pass == 0) != (left == 1) || left == 0)
                continue;
            uint32_t take = (uint32_t)(left < budget - *n_tok ? left : budget - *n_tok);
            r->in_batch = (int)*n_seqs + 1;
            e->b_reqs[*n_seqs] = r;
            take_of[*n_seqs] = take;
            (*n_seqs)++;
            pv_status st = add_piece(e, r, take, n_tok);
            if (st != PV_OK)
                return st;
            if (take == left) {
                e->b_logit_rows[*n_logits] = (int32_t)(*n_tok - 1);
                e->b_logit_req[*n_logits] = r;
                (*n_logits)++;
            }
        }
    return PV_OK;
}

/* The slot tables' width is rounded up to this many chunks (the rest of
 * a row is -1): the width is part of a decode graph's key (models/llama.c
 * forward_graph) and sets attention's split count on the GPUs
 * (backends/attention-split.h), so a key, recorded once, replays while the
 * longest context grows by up to this many chunks, not one. */
#define TABLE_WIDTH_STEP 8u

/* The slot tables of the batch: [n_layers][n_seqs][max_chunks]. */
static pv_status build_tables(pv_engine *e, size_t n_seqs, int32_t *max_chunks)
{
    uint32_t mc = 1;
    for (size_t i = 0; i < n_seqs; i++)
        if (e->b_reqs[i]->n_chunks > mc)
            mc = e->b_reqs[i]->n_chunks;
    mc = (mc + TABLE_WIDTH_STEP - 1) / TABLE_WIDTH_STEP * TABLE_WIDTH_STEP;
    size_t need = (size_t)e->n_layers * n_seqs * mc;
    if (need > e->b_tables_cap) {
        int32_t *t = realloc(e->b_tables, need * sizeof *t);
        if (!t)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "engine: batch slot tables of %zu entries", need);
        e->b_tables = t;
        e->b_tables_cap = need;
    }
    for (uint32_t l = 0; l < e->n_layers; l++)
        for (size_t i = 0; i < n_seqs; i++) {
            const pv_request *r = e->b_reqs[i];
            int32_t *row = e->b_tables + ((size_t)l * n_seqs + i) * mc;
            memcpy(row, r->slots + (size_t)l * r->cap_chunks, r->n_chunks * sizeof *row);
            for (uint32_t c = r->n_chunks; c < mc; c++)
                row[c] = -1;
        }
    *max_chunks = (int32_t)mc;
    return PV_OK;
}

/* The logit bias of the step's rows, each its request's, as the lists
 * pv_sample_batch takes (a row without bias has an empty range); a's
 * bias_start stays NULL when no row has one. The lists grow to the largest
 * step's and are kept. */
static pv_status fill_bias(pv_engine *e, size_t n_logits, pv_sample_batch_args *a)
{
    size_t total = 0;
    for (size_t i = 0; i < n_logits; i++)
        total += e->b_logit_req[i]->sampling.n_bias;
    if (total == 0)
        return PV_OK;
    if (total > e->b_bias_cap) {
        int32_t *t = realloc(e->b_bias_token, total * sizeof *t);
        if (t)
            e->b_bias_token = t;
        float *v = realloc(e->b_bias_value, total * sizeof *v);
        if (v)
            e->b_bias_value = v;
        if (!t || !v)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "engine: a step's logit bias lists of %zu entries", total);
        e->b_bias_cap = total;
    }
    size_t k = 0;
    e->b_bias_start[0] = 0;
    for (size_t i = 0; i < n_logits; i++) {
        const pv_request *r = e->b_logit_req[i];
        const size_t n = r->sampling.n_bias;
        if (n) {
            memcpy(e->b_bias_token + k, r->bias_tokens, n * sizeof *e->b_bias_token);
            memcpy(e->b_bias_value + k, r->bias_values, n * sizeof *e->b_bias_value);
        }
        k += n;
        e->b_bias_start[i + 1] = (int32_t)k; /* at most max_running x PV_SAMPLING_MAX_BIAS (pv_engine_init) */
    }
    a->bias_start = e->b_bias_start;
    a->bias_token = e->b_bias_token;
    a->bias_value = e->b_bias_value;
    return PV_OK;
}

/* Every logit row's token in one backend call and one wait: on a GPU a
 * wait per row would cost a device synchronisation each. Greedy rows
 * (temperature <= 0) take the argmax; each sampled row draws its request's
 * next uniform, in row order, as it always has, so a seed gives the same
 * tokens. Each row's logits are biased by its request's logit bias. */
static pv_status sample(pv_engine *e, size_t n_logits, int on_device)
{
    for (size_t i = 0; i < n_logits; i++) {
        pv_request *r = e->b_logit_req[i];
        e->b_temperature[i] = r->sampling.temperature;
        e->b_top_p[i] = r->sampling.top_p;
        e->u[i] = r->sampling.temperature > 0.0f ? pv_engine_uniform(&r->rng) : 0.0f;
    }
    pv_sample_batch_args a = {.rows = (int64_t)n_logits, .cols = e->n_vocab,
                              .logits = pv_llama_logits_buffer(e->model), .temperature = e->b_temperature,
                              .top_p = e->b_top_p, .u = e->u};
    pv_status st = fill_bias(e, n_logits, &a);
    if (st != PV_OK)
        return st;
    if (on_device)
        a.out_dev = e->sampled_dev; /* the next chained step reads them there */
    else
        a.out = e->b_sampled;
    return pv_sample_batch(e->be, &a);
}

/* r's `take` tokens of a batch ran: its history grows, the cache learns
 * the new tokens. */
static pv_status advance_one(pv_engine *e, pv_request *r, uint32_t take)
{
    pv_esession *s = r->session;
    uint32_t rec = r->recompute - r->recompute_done;
    if (rec > take)
        rec = take;
    r->recompute_done += rec;
    e->stats.recomputed_tokens += rec;
    size_t from = r->fed, n = take - rec;
    pv_status st = pv_ivec_append(&s->history, r->feed.v + from, n);
    if (st != PV_OK)
        return st;
    r->fed += n;
    if (take == 1 && rec == 0 && r->generated > 0)
        e->stats.decode_tokens++;
    else
        e->stats.prefill_tokens += take;
    /* The cache keeps the history too (its source for recomputation). */
    pv_session_view view;
    if ((st = pv_cache_session_restore(e->cache, s->id, &view)) != PV_OK)
        return st;
    uint64_t known = view.n_tokens, have = r->recompute_done < r->recompute ? r->recompute_done
                                                                            : s->history.n;
    if (have > known &&
        (st = pv_cache_append_tokens(e->cache, s->id, s->history.v + known, have - known)) != PV_OK)
        return st;
    /* Shared chunks this batch recomputed are readable by the others. */
    if (view.shared_chunks && (st = pv_cache_share_filled(e->cache, s->id, (uint32_t)have)) != PV_OK)
        return st;
    return PV_OK;
}

static pv_status advance(pv_engine *e, size_t n_seqs, const uint32_t *take_of)
{
    pv_status st = PV_OK;
    for (size_t i = 0; i < n_seqs && st == PV_OK; i++)
        st = advance_one(e, e->b_reqs[i], take_of[i]);
    return st;
}

uint64_t pv_engine_device_tokens(const pv_engine *e)
{
    return (uint64_t)(e->n_device_slots / e->n_layers) * e->chunk_tokens;
}

/* Whether r's turn ends for length once it has `generated` tokens and a
 * history of `history` tokens: at max_tokens, or when the next token would
 * pass the model's context or the device pool (unbounded turns; bounded
 * ones were checked to fit). */
static int turn_full(const pv_engine *e, const pv_request *r, uint64_t history, int64_t generated)
{
    return (r->sampling.max_tokens && generated >= r->sampling.max_tokens) || history + 1 >= e->n_ctx ||
           history >= pv_engine_device_tokens(e);
}

/* A sampled token for r: stream it, decide whether the turn ends: at a stop
 * or for length (turn_full). *ended = 1 when it did: r is freed. */
static pv_status take_token(pv_engine *e, pv_request *r, int32_t token, int *ended)
{
    *ended = 0;
    double now = pv_engine_now(e);
    if (r->t_first == 0)
        r->t_first = now;
    r->t_last = now;
    r->generated++;
    pv_status st = pv_ivec_push(&r->feed, token); /* run next, or pending */
    if (st != PV_OK)
        return st;
    int stopped = 0;
    if (!r->sampling.ignore_eos && pv_tokenizer_is_end(e->tok, token))
        stopped = 1;
    else if ((st = pv_engine_emit(e, r, token, &stopped)) != PV_OK)
        return st;
    if (stopped)
        r->result.finish = PV_FINISH_STOP;
    else if (turn_full(e, r, r->session->history.n, r->generated))
        r->result.finish = PV_FINISH_LENGTH;
    if (!r->result.finish)
        return PV_OK;
    *ended = 1;
    return finish_request(e, r);
}

/* Suspends the request the cache names (the newest running one); if it is
 * the only one running, its turn cannot fit and fails. */
static pv_status relieve_pressure(pv_engine *e, pv_request *stuck)
{
    const char *id;
    pv_status st = pv_cache_choose_suspend(e->cache, &id);
    if (st != PV_OK)
        return st;
    pv_esession *s = pv_engine_find_session(e, id);
    if (!s || !s->request || s->request->state != PV_REQ_RUNNING)
        return pv_error(PV_ERR_STATE, "engine: the cache names \"%.64s\" to suspend; it is not running", id);
    if (e->n_running == 1)
        return fail_request(e, stuck,
                            pv_error(PV_ERR_OUT_OF_MEMORY,
                                     "session \"%.64s\": its context (%zu tokens) outgrew the device "
                                     "pool of %" PRId64 " slots",
                                     stuck->session->id, stuck->session->history.n, e->n_device_slots));
    return suspend(e, s->request);
}

/* The forward pass of the batch in e->b_* and its sampling: into the
 * host's e->b_sampled, waited for; or, `chained`, into the device's
 * sampled_dev, which the next chained step reads, and from there into
 * host slot `slot` of sampled_host without waiting (*ready completes when
 * the tokens have landed there). */
static pv_status run_batch(pv_engine *e, size_t n_tok, size_t n_seqs, size_t n_logits, int chained, int slot,
                           pv_event **ready)
{
    int32_t max_chunks = 0;
    pv_status st = build_tables(e, n_seqs, &max_chunks);
    if (st != PV_OK)
        return st;
    layer_gate gate = {e, n_seqs};
    pv_llama_batch b = {
        .n_tokens = (int32_t)n_tok, .tokens = e->b_tokens, .token_seq = e->b_seq, .token_pos = e->b_pos,
        .n_seqs = (int32_t)n_seqs, .max_chunks = max_chunks, .slot_tables = e->b_tables,
        .kv_pool = e->device_pool, .n_slots = e->n_device_slots + 1,
        .n_logits = (int32_t)n_logits, .logit_rows = e->b_logit_rows,
        .before_layer = wait_layer, .before_layer_ctx = &gate,
        .prev_tokens = e->sampled_dev, .n_prev_tokens = e->sampled_dev ? e->cfg.max_running : 0,
        .pad_decode = 1, .pad_slot = e->n_device_slots,
    };
    double t1 = pv_engine_now(e);
    st = pv_llama_forward(e->model, &b);
    if (st == PV_OK && n_logits)
        st = sample(e, n_logits, chained);
    if (st == PV_OK && chained)
        st = pv_copy_async(PV_QUEUE_COMPUTE, e->sampled_host, (uint64_t)slot * e->cfg.max_running * sizeof(int32_t),
                           e->sampled_dev, 0, n_logits * sizeof(int32_t), NULL, ready);
    e->stats.forward_s += pv_engine_now(e) - t1;
    e->stats.iterations++;
    return st;
}

/* One step of a chain: row i decodes for reqs[i] (NULL once its turn has
 * ended meanwhile); its tokens land in host slot `slot` once `ready`. */
typedef struct chain_step {
    pv_request **reqs;
    size_t n;
    int slot;
    pv_event *ready;
} chain_step;

/* The next chained step after `prev`: each request of prev whose turn
 * cannot end for length with prev's token decodes that token, which only
 * the device knows yet (id -(row + 1) of sampled_dev), at the position
 * after its history. e->chain_next[i]: prev's row i's row in it, or -1. */
static pv_status build_chained(pv_engine *e, const chain_step *prev, chain_step *next)
{
    next->n = 0;
    for (size_t i = 0; i < e->n_running; i++)
        e->running[i]->in_batch = 0;
    for (size_t i = 0; i < prev->n; i++) {
        pv_request *r = prev->reqs[i];
        e->chain_next[i] = -1;
        if (!r || turn_full(e, r, r->session->history.n, r->generated + 1))
            continue;
        const uint64_t pos = r->session->history.n;
        pv_status st = ensure_chunk(e, r, (uint32_t)(pos / e->chunk_tokens));
        if (st != PV_OK)
            return st;
        const size_t row = next->n++;
        e->chain_next[i] = (int32_t)row;
        next->reqs[row] = e->b_reqs[row] = e->b_logit_req[row] = r;
        r->in_batch = (int)row + 1;
        e->b_tokens[row] = -(int32_t)i - 1;
        e->b_pos[row] = (int32_t)pos;
        e->b_seq[row] = (int32_t)row;
        e->b_logit_rows[row] = (int32_t)row;
    }
    return PV_OK;
}

/* prev's tokens, once landed, go to their requests in row order as an
 * unchained step's would; a turn that ends here leaves the chain (its row
 * in `next`, already enqueued, is work thrown away). */
static pv_status take_chained(pv_engine *e, const chain_step *prev, chain_step *next)
{
    /* The wait is the device finishing prev's pass and sampling: forward
     * time, as an unchained step's blocking read of its tokens is. */
    const double t0 = pv_engine_now(e);
    pv_status st = pv_event_wait(prev->ready);
    e->stats.forward_s += pv_engine_now(e) - t0;
    const int32_t *tokens = (const int32_t *)e->sampled_host->host_ptr + (size_t)prev->slot * e->cfg.max_running;
    for (size_t i = 0; i < prev->n && st == PV_OK; i++) {
        if (!prev->reqs[i])
            continue;
        int ended = 0;
        st = take_token(e, prev->reqs[i], tokens[i], &ended);
        if (ended && next && e->chain_next[i] >= 0) {
            next->reqs[e->chain_next[i]] = NULL;
            e->stats.discarded_tokens++;
        }
    }
    return st;
}

/* After a step of decodes only (its tokens on their way to host slot 0,
 * `ready`), up to decode_steps - 1 more steps run as a chain: each is
 * enqueued before the host has read the tokens it decodes, so the device
 * goes from step to step while the host streams the tokens, checks stops
 * and ends turns one step behind. A chain ends early when a step would
 * need room the pool does not have; every token read back, nothing is left
 * in flight when it returns. */
static pv_status run_chain(pv_engine *e, size_t n, pv_event *ready)
{
    chain_step prev = {e->chain_reqs[0], n, 0, ready};
    memcpy(prev.reqs, e->b_logit_req, n * sizeof *prev.reqs);
    pv_status st = PV_OK;
    for (int32_t j = 1; j < e->decode_steps && st == PV_OK; j++) {
        chain_step next = {e->chain_reqs[j % 2], 0, j % 2, NULL};
        st = build_chained(e, &prev, &next);
        if (st == PV_ERR_OUT_OF_MEMORY) { /* no room for a new chunk: the next iteration makes it */
            pv_clear_error();
            st = PV_OK;
            break;
        }
        if (st != PV_OK || next.n == 0)
            break;
        st = run_batch(e, next.n, next.n, next.n, 1, next.slot, &next.ready);
        e->stats.chained_iterations++;
        if (st == PV_OK)
            st = take_chained(e, &prev, &next);
        for (size_t i = 0; i < next.n && st == PV_OK; i++)
            if (next.reqs[i])
                st = advance_one(e, next.reqs[i], 1);
        if (prev.ready != ready)
            pv_event_free(prev.ready);
        prev = next;
    }
    if (st == PV_OK)
        st = take_chained(e, &prev, NULL);
    if (prev.ready != ready)
        pv_event_free(prev.ready);
    return st;
}

pv_status pv_engine_step(pv_engine *e, int *worked)
{
    if (worked)
        *worked = 0;
    if (!e)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_step: engine is NULL");
    double t0 = pv_engine_now(e), forward_before = e->stats.forward_s;
    pv_status st = pv_engine_expire_idle(e);
    if (st != PV_OK)
        return st;
    int progress = 0;
    /* First come, first served: a head that cannot be admitted blocks
     * those behind it. */
    while (e->wait_head && e->n_running < (size_t)e->cfg.max_running) {
        int admitted;
        pv_request *r = e->wait_head;
        if ((st = pv_engine_admit(e, r, &admitted)) != PV_OK)
            return st;
        if (!admitted)
            break;
        if (e->wait_head == r)
            queue_pop(e);
        progress = 1;
    }
    if (e->n_running == 0) {
        e->stats.schedule_s += pv_engine_now(e) - t0;
        if (worked)
            *worked = progress;
        return PV_OK;
    }

    size_t n_tok, n_seqs, n_logits;
    uint32_t *take_of = e->b_take;
    for (;;) {
        st = build_batch(e, &n_tok, &n_seqs, &n_logits, take_of);
        if (st != PV_ERR_OUT_OF_MEMORY)
            break;
        pv_request *stuck = NULL;
        for (size_t i = 0; i < e->n_running; i++)
            if (e->running[i]->in_batch)
                stuck = e->running[i];
        if ((st = relieve_pressure(e, stuck ? stuck : e->running[e->n_running - 1])) != PV_OK)
            return st;
        progress = 1;
        if (e->n_running == 0)
            break;
    }
    if (st != PV_OK)
        return st;
    if (n_tok == 0) {
        e->stats.schedule_s += pv_engine_now(e) - t0;
        if (worked)
            *worked = progress;
        return PV_OK;
    }
    /* A step of decodes only, with nobody waiting, goes on as a chain. */
    const int chain = e->decode_steps > 1 && n_logits == n_tok && n_seqs == n_tok && !e->wait_head;
    pv_event *ready = NULL;
    if ((st = run_batch(e, n_tok, n_seqs, n_logits, chain, 0, &ready)) != PV_OK) {
        pv_event_free(ready);
        return st;
    }
    /* The copies the forward pass waited for have landed. */
    for (size_t i = 0; i < n_seqs && st == PV_OK; i++)
        if (e->b_reqs[i]->layer_ready)
            st = pv_engine_swap_in_finish(e, e->b_reqs[i]);
    if (st == PV_OK)
        st = advance(e, n_seqs, take_of);
    if (st == PV_OK && chain)
        st = run_chain(e, n_logits, ready);
    pv_event_free(ready);
    for (size_t i = 0; i < n_logits && st == PV_OK && !chain; i++) {
        int ended;
        st = take_token(e, e->b_logit_req[i], e->b_sampled[i], &ended);
    }
    if (st != PV_OK)
        return st;
    /* Ahead-of-time swap-out overlaps the next iteration. */
    if ((st = pv_engine_swap_out_issue(e)) != PV_OK)
        return st;
    e->stats.schedule_s += (pv_engine_now(e) - t0) - (e->stats.forward_s - forward_before);
    if (worked)
        *worked = 1;
    return PV_OK;
}
