/* The CUDA backend's graphs and timing markers (backend.h): a decode
 * step recorded once per key and run again from a check of its ops
 * against the recording's trace (backends/graph-trace.h), with the
 * step's host arrays in the graph's own arena. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/cuda/cuda_impl.h"

#include <inttypes.h>
#include <string.h>

/* Why a graph step cannot go on: its arrays outgrew the arena (it grows
 * before the next recording), or, checked against a recording, the step
 * differs from it (the next step records anew). */
pv_status pv_cuda_graph_step_error(const graph_slot *g, const char *op)
{
    const pv_graph_trace *t = &g->trace;
    if (t->arena_need > g->arena_bytes)
        return pv_error(PV_ERR_UNSUPPORTED, "cuda %s: the graph's %zu-byte arena is full (the step needs %zu)", op,
                        g->arena_bytes, t->arena_need);
    return pv_error(PV_ERR_UNSUPPORTED, "cuda %s: the step differs from graph %#" PRIx64 "'s recording at item %u (%s)",
                    op, g->key, t->diverged_item, pv_graph_trace_kind_name(t->diverged_kind));
}

/* ---- timing markers ---------------------------------------------------------------------
 * A marker is a timing event recorded on the compute stream. While a graph
 * is recorded, cudaEventRecordExternal makes the record an event record
 * node of the graph (a plain record there would only mark the capture's
 * dependencies and leave the event without a time), so the event takes its
 * time whenever the graph runs. */

pv_status pv_cuda_marker_init(pv_backend *be, pv_marker *m)
{
    PV_TRY(enter(impl_of(be)));
    cudaEvent_t ev;
    CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDefault), "%s", "timing marker");
    m->handle = ev;
    return PV_OK;
}

/* A kept graph that recorded the marker would record its event again when
 * replayed, and a later marker may get the same handle, so that a step's
 * trace matches: every kept graph is recorded anew (markers are freed
 * rarely: at the end of a measurement). */
void pv_cuda_marker_free(pv_backend *be, pv_marker *m)
{
    cuda_impl *cu = impl_of(be);
    for (int i = 0; i < GRAPH_EXECS; i++)
        cu->graphs[i].trace.complete = 0;
    if (cu->graph)
        cu->graph->run_once = 1;
    pv_cuda_event_destroy(be, (cudaEvent_t)m->handle);
}

pv_status pv_cuda_marker_record(pv_backend *be, pv_marker *m)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    const uint64_t item[2] = {(uint64_t)(uintptr_t)m->handle, 1};
    if (graph_traced(cu, PV_TRACE_EVENT, item, sizeof item)) /* the recording's record node takes the time */
        return PV_OK;
    CUDA_TRY(cudaEventRecordWithFlags((cudaEvent_t)m->handle, cu->stream[PV_QUEUE_COMPUTE],
                                      cu->graph ? cudaEventRecordExternal : cudaEventRecordDefault),
             "timing marker%s", cu->graph ? " in a graph" : "");
    return PV_OK;
}

pv_status pv_cuda_marker_elapsed(pv_backend *be, const pv_marker *start, const pv_marker *end, double *seconds)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    PV_TRY(not_capturing(cu, "the time between markers"));
    CUDA_TRY(cudaEventSynchronize((cudaEvent_t)start->handle), "%s", "start marker");
    CUDA_TRY(cudaEventSynchronize((cudaEvent_t)end->handle), "%s", "end marker");
    float ms = 0;
    CUDA_TRY(cudaEventElapsedTime(&ms, (cudaEvent_t)start->handle, (cudaEvent_t)end->handle), "%s",
             "the time between markers");
    *seconds = ms * 1e-3;
    return PV_OK;
}

/* ---- graphs (backend.h) ------------------------------------------------------------------
 * A key's first step is captured, instantiated (or updated into the
 * slot's graph) and run. Each later step of the key first walks its ops
 * without launching anything, checking them against the recording's trace
 * and writing its host arrays into the slot's arena; if they match, one
 * copy of the arena and one graph launch run the step (a replay). A step
 * that differs (a launch parameter that depends on the data, such as the
 * split count of a longer context) runs op by op, and the next step of
 * the key is captured again. */

/* The slot of key (kept even when its recording failed, so its arena
 * grows to what the step needed), or the least recently used one,
 * emptied, for it. */
static graph_slot *graph_slot_for(cuda_impl *cu, uint64_t key)
{
    graph_slot *oldest = &cu->graphs[0];
    for (int i = 0; i < GRAPH_EXECS; i++) {
        graph_slot *g = &cu->graphs[i];
        if (g->used && g->key == key)
            return g;
        if (!g->used || (oldest->used && g->last_run < oldest->last_run))
            oldest = g;
    }
    if (oldest->exec)
        cudaGraphExecDestroy(oldest->exec);
    oldest->exec = NULL;
    oldest->key = key;
    oldest->used = 1;
    oldest->last_run = ++cu->graph_clock;
    oldest->trace.complete = 0;
    return oldest;
}

/* The slot's arena holds at least `bytes` (twice what was short), and its
 * host side is free to write: the copy out of it that the last run
 * enqueued has completed. */
static pv_status arena_ready(cuda_impl *cu, graph_slot *g, size_t bytes)
{
    if (!g->arena_copied) {
        cudaEvent_t ev;
        CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "%s", "graph arena event");
        g->arena_copied = ev;
    }
    if (g->copy_pending)
        CUDA_TRY(cudaEventSynchronize(g->arena_copied), "%s", "graph arena copy");
    g->copy_pending = 0;
    if (g->arena_bytes >= bytes && g->arena_host)
        return PV_OK;
    size_t grown = bytes > 2 * g->arena_bytes ? bytes : 2 * g->arena_bytes;
    grown = grown < GRAPH_ARENA_MIN ? GRAPH_ARENA_MIN : grown;
    /* The slot's graph reads the device side until it has run. */
    CUDA_TRY(cudaStreamSynchronize(cu->stream[PV_QUEUE_COMPUTE]), "%s", "compute stream, growing a graph arena");
    cudaFreeHost(g->arena_host);
    cudaFree(g->arena_dev);
    g->arena_host = g->arena_dev = NULL;
    g->arena_bytes = 0;
    g->trace.complete = 0; /* its kernels read the old arena */
    void *mem = NULL;
    CUDA_TRY(cudaHostAlloc(&mem, grown, cudaHostAllocDefault), "%zu bytes of a graph arena", grown);
    g->arena_host = mem;
    CUDA_TRY(cudaMalloc(&mem, grown), "%zu bytes of a graph arena", grown);
    g->arena_dev = mem;
    g->arena_bytes = grown;
    return PV_OK;
}

pv_status pv_cuda_graph_begin(pv_backend *be, uint64_t key)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    PV_TRY(not_capturing(cu, "graph_begin"));
    graph_slot *g = graph_slot_for(cu, key);
    PV_TRY(arena_ready(cu, g, g->trace.arena_need));
    if (g->exec && g->trace.complete) {
        PV_TRY(pv_graph_trace_check_start(&g->trace));
        cu->capturing = 0;
    } else {
        /* Relaxed: the ops' host-side calls (event queries of the staging
         * ring, the first load of a kernel) stay legal while the stream
         * records. */
        CUDA_TRY(cudaStreamBeginCapture(cu->stream[PV_QUEUE_COMPUTE], cudaStreamCaptureModeRelaxed), "%s",
                 "compute stream");
        pv_graph_trace_record_start(&g->trace);
        cu->capturing = 1;
    }
    g->run_once = 0;
    cu->graph = g;
    cu->kernels.trace = &g->trace;
    cu->kernels.check = !cu->capturing;
    return PV_OK;
}

/* The arena's bytes to the device, then the slot's graph. */
static cudaError_t graph_launch(cuda_impl *cu, graph_slot *g)
{
    cudaStream_t s = cu->stream[PV_QUEUE_COMPUTE];
    cudaError_t err = cudaSuccess;
    if (g->trace.arena_cursor) {
        err = cudaMemcpyAsync(g->arena_dev, g->arena_host, g->trace.arena_cursor, cudaMemcpyHostToDevice, s);
        if (err == cudaSuccess && (err = cudaEventRecord(g->arena_copied, s)) == cudaSuccess)
            g->copy_pending = 1;
    }
    if (err == cudaSuccess)
        err = cudaGraphLaunch(g->exec, s);
    if (err == cudaSuccess)
        g->last_run = ++cu->graph_clock;
    return err;
}

/* Runs a fresh recording through the slot's graph: updated in place when
 * the recording has its shape, instantiated anew when not. */
static cudaError_t graph_run_recording(cuda_impl *cu, graph_slot *g, cudaGraph_t graph)
{
    if (g->exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(g->exec, graph, &info) != cudaSuccess) {
            (void)cudaGetLastError();
            cudaGraphExecDestroy(g->exec);
            g->exec = NULL;
        }
    }
    if (!g->exec) {
        cudaError_t err = cudaGraphInstantiate(&g->exec, graph, 0);
        if (err != cudaSuccess) {
            g->exec = NULL;
            return err;
        }
    }
    return graph_launch(cu, g);
}

static pv_status graph_end_step(pv_backend *be, int run, int *ran)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    *ran = 0;
    graph_slot *g = cu->graph;
    if (!g)
        return pv_error(PV_ERR_INVALID_ARG, "cuda: graph_end without graph_begin");
    const int captured = cu->capturing;
    cu->graph = NULL;
    cu->capturing = 0;
    cu->kernels.trace = NULL;
    cu->kernels.check = 0;
    const int matched = pv_graph_trace_end(&g->trace);
    if (!captured) {
        if (run && matched) {
            *ran = graph_launch(cu, g) == cudaSuccess;
            (void)cudaGetLastError();
            *cu->graph_replays += *ran;
            if (!*ran) { /* the caller runs the ops; the next step records and instantiates anew */
                cudaGraphExecDestroy(g->exec);
                g->exec = NULL;
                g->trace.complete = 0;
            }
        } else if (!matched) { /* the caller runs the ops; its next step of this key is recorded anew */
            g->trace.complete = 0;
            pv_cuda_graph_step_error(g, "graph_end");
        }
        return PV_OK;
    }
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(cu->stream[PV_QUEUE_COMPUTE], &graph);
    /* A recording that an op broke (an illegal call invalidates the
     * capture) or that the caller drops (run = 0: an op failed) runs
     * nothing; the caller enqueues the work again. */
    if (err == cudaSuccess && graph && run)
        *ran = graph_run_recording(cu, g, graph) == cudaSuccess;
    (void)cudaGetLastError();
    if (graph)
        cudaGraphDestroy(graph);
    if (!*ran || g->run_once)
        g->trace.complete = 0;
    return PV_OK;
}

pv_status pv_cuda_graph_end(pv_backend *be, int run, int *ran)
{
    const pv_status st = graph_end_step(be, run, ran);
    /* behind the step's work, now enqueued (or not run at all) */
    pv_cuda_release_graph_frees(impl_of(be));
    return st;
}
