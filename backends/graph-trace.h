/* What a recorded graph launches, kept so that a later step of the same
 * shape can run the graph again without recording it.
 *
 * A step recorded as a graph bakes in every launch's parameters: kernel,
 * geometry, scalars and device pointers. A later step may run that graph
 * instead of recording its own only if its ops would launch exactly the
 * same, so while a graph is recorded each launch (and each other stream
 * command) appends its full description to the trace, and a later step's
 * ops, instead of launching, compare theirs with it item by item ("check"
 * mode). Per-step data (token ids, positions, slot tables, sampling
 * parameters) is the one thing allowed to differ: the ops write it into
 * fixed buffers (the arena) at the offsets the recording gave each array,
 * and the backend copies the arena to the device in one transfer before it
 * runs the graph. The trace checks that every array has the recording's
 * size and place; the arena's bytes are the step's own.
 *
 * Backend-independent and host-only, so tests/test-graph-trace checks it
 * without a GPU. */
#ifndef PV_GRAPH_TRACE_H
#define PV_GRAPH_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include <pensieve/status.h>

/* Kinds of trace items; a backend describes each of its stream commands
 * as one of these with the bytes that determine what it does. */
typedef enum pv_trace_kind {
    PV_TRACE_LAUNCH = 1, /* a kernel: handle, geometry, every argument's bytes */
    PV_TRACE_LIBRARY,    /* a library call (cuBLAS): its arguments */
    PV_TRACE_COPY,       /* a device copy: addresses and bytes */
    PV_TRACE_EVENT,      /* a wait for or record of an event */
    PV_TRACE_ARRAY       /* a host array placed in the arena: offset and size */
} pv_trace_kind;

typedef enum pv_trace_mode {
    PV_TRACE_OFF = 0,
    PV_TRACE_RECORD, /* a graph is being recorded: items are appended */
    PV_TRACE_CHECK   /* a step walks its ops against a recording: items are compared */
} pv_trace_mode;

typedef struct pv_graph_trace {
    pv_trace_mode mode;
    unsigned char *log; /* items: kind (u32), size (u32), bytes; padded to 8 */
    size_t len, cap;
    uint32_t items;      /* items of the recording */
    size_t arena_used;   /* arena bytes the recording placed */
    int complete;        /* the recording ended with every item described */
    /* During a step (RECORD or CHECK): */
    size_t cursor;       /* CHECK: the log offset of the next item */
    uint32_t item;       /* the step's items so far */
    size_t arena_cursor; /* the step's arena bytes so far */
    size_t arena_need;   /* the most arena bytes a step asked for (to grow the arena) */
    int diverged;        /* CHECK: an item differed (or RECORD: one could not be kept) */
    uint32_t diverged_item;
    pv_trace_kind diverged_kind;
} pv_graph_trace;

/* t zeroed; pv_graph_trace_free releases its log (t itself is the
 * caller's). */
void pv_graph_trace_free(pv_graph_trace *t);

/* A recording starts: the old one is forgotten. */
void pv_graph_trace_record_start(pv_graph_trace *t);
/* A check against the recording starts (it must be complete). */
pv_status pv_graph_trace_check_start(pv_graph_trace *t);

/* One stream command of the step, described by `bytes`. RECORD: appended
 * (on allocation failure the recording is marked unusable and 0 is
 * returned); CHECK: compared with the recording's next item; 0 once the
 * step has diverged. OFF: 1, nothing kept. */
int pv_graph_trace_item(pv_graph_trace *t, pv_trace_kind kind, const void *bytes, size_t n);

/* A command the backend cannot describe: the recording will never be
 * checked against (RECORD), or the step diverges (CHECK). */
void pv_graph_trace_opaque(pv_graph_trace *t, pv_trace_kind kind);

/* A host array of `bytes` gets its place in an arena of `capacity` bytes,
 * aligned to `align` (a power of two): *offset, recorded as an ARRAY item.
 * 0 when it does not fit (arena_need then says how much would), or when
 * the step diverged. */
int pv_graph_trace_place(pv_graph_trace *t, size_t bytes, size_t align, size_t capacity, size_t *offset);

/* The step ends. RECORD: the recording is kept when nothing failed;
 * returns 1 when it can be checked against later. CHECK: 1 when the step
 * matched the whole recording (same items, same arena size), 0 otherwise.
 * Either way the mode goes back to OFF. */
int pv_graph_trace_end(pv_graph_trace *t);

/* "item N (launch)" style text for the first divergence, for messages. */
const char *pv_graph_trace_kind_name(pv_trace_kind kind);

#endif
