/* The trace of a recorded graph (graph-trace.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/graph-trace.h"

#include <stdlib.h>
#include <string.h>

/* An item's header: kind and size, then its bytes padded to 8. */
#define ITEM_HEADER 8

static size_t padded(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

void pv_graph_trace_free(pv_graph_trace *t)
{
    if (!t)
        return;
    free(t->log);
    memset(t, 0, sizeof *t);
}

static void step_start(pv_graph_trace *t, pv_trace_mode mode)
{
    t->mode = mode;
    t->cursor = 0;
    t->item = 0;
    t->arena_cursor = 0;
    t->diverged = 0;
    t->diverged_item = 0;
    t->diverged_kind = 0;
}

void pv_graph_trace_record_start(pv_graph_trace *t)
{
    t->len = 0;
    t->items = 0;
    t->arena_used = 0;
    t->complete = 0;
    step_start(t, PV_TRACE_RECORD);
}

pv_status pv_graph_trace_check_start(pv_graph_trace *t)
{
    if (!t->complete)
        return pv_error(PV_ERR_STATE, "graph trace: no complete recording to check a step against");
    step_start(t, PV_TRACE_CHECK);
    return PV_OK;
}

static int diverge(pv_graph_trace *t, pv_trace_kind kind)
{
    if (!t->diverged) {
        t->diverged = 1;
        t->diverged_item = t->item;
        t->diverged_kind = kind;
    }
    return 0;
}

void pv_graph_trace_opaque(pv_graph_trace *t, pv_trace_kind kind)
{
    if (t->mode != PV_TRACE_OFF)
        diverge(t, kind);
}

static int append(pv_graph_trace *t, pv_trace_kind kind, const void *bytes, size_t n)
{
    if (n > UINT32_MAX)
        return diverge(t, kind);
    const size_t need = ITEM_HEADER + padded(n);
    if (t->cap - t->len < need) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap - t->len < need) {
            if (cap > SIZE_MAX / 2)
                return diverge(t, kind);
            cap *= 2;
        }
        unsigned char *grown = realloc(t->log, cap);
        if (!grown)
            return diverge(t, kind);
        t->log = grown;
        t->cap = cap;
    }
    const uint32_t header[2] = {(uint32_t)kind, (uint32_t)n};
    memcpy(t->log + t->len, header, sizeof header);
    memcpy(t->log + t->len + ITEM_HEADER, bytes, n);
    memset(t->log + t->len + ITEM_HEADER + n, 0, padded(n) - n);
    t->len += need;
    return 1;
}

static int compare(pv_graph_trace *t, pv_trace_kind kind, const void *bytes, size_t n)
{
    if (t->len - t->cursor < ITEM_HEADER)
        return diverge(t, kind); /* the step has more items than the recording */
    uint32_t header[2];
    memcpy(header, t->log + t->cursor, sizeof header);
    if (header[0] != (uint32_t)kind || header[1] != n || t->len - t->cursor - ITEM_HEADER < padded(n) ||
        memcmp(t->log + t->cursor + ITEM_HEADER, bytes, n) != 0)
        return diverge(t, kind);
    t->cursor += ITEM_HEADER + padded(n);
    return 1;
}

int pv_graph_trace_item(pv_graph_trace *t, pv_trace_kind kind, const void *bytes, size_t n)
{
    if (t->mode == PV_TRACE_OFF)
        return 1;
    if (t->diverged)
        return 0;
    const int kept = t->mode == PV_TRACE_RECORD ? append(t, kind, bytes, n) : compare(t, kind, bytes, n);
    if (kept)
        t->item++;
    return kept;
}

int pv_graph_trace_place(pv_graph_trace *t, size_t bytes, size_t align, size_t capacity, size_t *offset)
{
    const size_t at = (t->arena_cursor + align - 1) & ~(align - 1);
    if (at < t->arena_cursor || bytes > SIZE_MAX - at)
        return diverge(t, PV_TRACE_ARRAY);
    const size_t end = at + bytes;
    if (end > t->arena_need)
        t->arena_need = end;
    if (end > capacity)
        return diverge(t, PV_TRACE_ARRAY);
    const uint64_t place[2] = {at, bytes};
    if (!pv_graph_trace_item(t, PV_TRACE_ARRAY, place, sizeof place))
        return 0;
    t->arena_cursor = end;
    *offset = at;
    return 1;
}

int pv_graph_trace_end(pv_graph_trace *t)
{
    int usable = 0;
    if (t->mode == PV_TRACE_RECORD) {
        t->items = t->item;
        t->arena_used = t->arena_cursor;
        t->complete = !t->diverged;
        usable = t->complete;
    } else if (t->mode == PV_TRACE_CHECK) {
        if (!t->diverged && t->cursor != t->len)
            diverge(t, 0); /* the step has fewer items than the recording */
        usable = !t->diverged; /* the arrays' places were items: the arena's size is the recording's */
    }
    t->mode = PV_TRACE_OFF;
    return usable;
}

const char *pv_graph_trace_kind_name(pv_trace_kind kind)
{
    switch (kind) {
    case PV_TRACE_LAUNCH: return "kernel launch";
    case PV_TRACE_LIBRARY: return "library call";
    case PV_TRACE_COPY: return "copy";
    case PV_TRACE_EVENT: return "event";
    case PV_TRACE_ARRAY: return "host array";
    }
    return "end of the step";
}
