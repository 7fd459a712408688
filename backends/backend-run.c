/* What a backend has run and when: its launch and copy counts, graphs
 * (recorded steps and their replays) and timing markers, each call
 * checked before it reaches the backend (backend.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/backend.h"

#include <stdlib.h>

uint64_t pv_backend_launches(const pv_backend *be)
{
    return be ? be->launches : 0;
}

uint64_t pv_backend_copies(const pv_backend *be)
{
    return be ? be->copies : 0;
}

int pv_backend_graphs(const pv_backend *be)
{
    return be && be->ops->graph_begin && be->ops->graph_end;
}

pv_status pv_backend_graph_begin(pv_backend *be, uint64_t key)
{
    if (!be)
        return pv_error(PV_ERR_INVALID_ARG, "pv_backend_graph_begin: backend is NULL");
    if (!pv_backend_graphs(be))
        return pv_error(PV_ERR_UNSUPPORTED, "pv_backend_graph_begin: the %s backend has no graphs", be->ops->name);
    return be->ops->graph_begin(be, key);
}

pv_status pv_backend_graph_end(pv_backend *be, int run, int *ran)
{
    if (!be || !ran)
        return pv_error(PV_ERR_INVALID_ARG, "pv_backend_graph_end: backend or ran is NULL");
    *ran = 0;
    if (!pv_backend_graphs(be))
        return pv_error(PV_ERR_UNSUPPORTED, "pv_backend_graph_end: the %s backend has no graphs", be->ops->name);
    pv_status st = be->ops->graph_end(be, run, ran);
    if (st == PV_OK && *ran)
        be->graph_runs++;
    return st;
}

uint64_t pv_backend_graph_runs(const pv_backend *be)
{
    return be ? be->graph_runs : 0;
}

uint64_t pv_backend_graph_replays(const pv_backend *be)
{
    return be ? be->graph_replays : 0;
}

/* ---- timing markers ------------------------------------------------------------ */

pv_status pv_marker_init(pv_marker **out, pv_backend *be)
{
    if (!out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_marker_init: out is NULL");
    *out = NULL;
    if (!be)
        return pv_error(PV_ERR_INVALID_ARG, "pv_marker_init: backend is NULL");
    pv_marker *m = calloc(1, sizeof *m);
    if (!m)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_marker_init: cannot allocate the marker record");
    m->backend = be;
    pv_status st = be->ops->marker_init(be, m);
    if (st != PV_OK) {
        free(m);
        return st;
    }
    *out = m;
    return PV_OK;
}

void pv_marker_free(pv_marker *m)
{
    if (!m)
        return;
    m->backend->ops->marker_free(m->backend, m);
    free(m);
}

/* A marker of be, by name in the messages. */
static pv_status need_marker(const char *fn, const char *arg, const pv_backend *be, const pv_marker *m)
{
    if (!m)
        return pv_error(PV_ERR_INVALID_ARG, "%s: %s is NULL", fn, arg);
    if (m->backend != be)
        return pv_error(PV_ERR_INVALID_ARG, "%s: %s belongs to backend '%s', not to this '%s'", fn, arg,
                        m->backend->ops->name, be->ops->name);
    return PV_OK;
}

pv_status pv_marker_record(pv_backend *be, pv_marker *m)
{
    if (!be)
        return pv_error(PV_ERR_INVALID_ARG, "pv_marker_record: backend is NULL");
    PV_TRY(need_marker("pv_marker_record", "marker", be, m));
    PV_TRY(be->ops->marker_record(be, m));
    m->recorded = 1;
    return PV_OK;
}

pv_status pv_marker_elapsed(pv_backend *be, const pv_marker *start, const pv_marker *end, double *seconds)
{
    if (!be || !seconds)
        return pv_error(PV_ERR_INVALID_ARG, "pv_marker_elapsed: %s is NULL", be ? "seconds" : "backend");
    *seconds = 0;
    PV_TRY(need_marker("pv_marker_elapsed", "start", be, start));
    PV_TRY(need_marker("pv_marker_elapsed", "end", be, end));
    if (!start->recorded || !end->recorded)
        return pv_error(PV_ERR_INVALID_ARG, "pv_marker_elapsed: the %s marker was never recorded",
                        start->recorded ? "end" : "start");
    return be->ops->marker_elapsed(be, start, end, seconds);
}
