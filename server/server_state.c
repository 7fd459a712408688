/* /v1/session-states/{id}: a session's state file (include/pensieve/state.h)
 * over HTTP, for moving a session between replicas while both run (a
 * drain, docs/scaling.md): GET exports the session as a file, PUT imports
 * one into this server's engine. The file's own session id must be the one
 * the URL and the caller's API key name, so no key reaches another's
 * namespace. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "server/server_internal.h"

#include <pensieve/state.h>

#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct state_call {
    const char *engine_id;
    const pv_session_image *in;  /* PUT */
    pv_session_image *out;       /* GET */
    pv_import_result res;
    size_t tokens;
} state_call;

static pv_status export_on_engine(pv_engine *e, void *arg)
{
    state_call *c = arg;
    return pv_engine_session_export(e, c->engine_id, 1, &c->out, NULL);
}

static pv_status import_on_engine(pv_engine *e, void *arg)
{
    state_call *c = arg;
    pv_status st = pv_engine_session_import(e, c->in, &c->res);
    if (st == PV_OK)
        st = pv_engine_session_tokens(e, c->engine_id, &c->tokens);
    return st;
}

enum MHD_Result srv_serve_session_state(srv_req *r, const char *id, int put)
{
    pv_api_error err;
    if (!srv_session_id_ok(id)) {
        pv_api_fail(&err, 400, "invalid_request_error", "session_id", NULL,
                    "A session id is 1 to 128 bytes of UTF-8 without control characters.");
        return srv_respond_error(r, &err);
    }
    char *engine_id = srv_engine_session_id(r->srv, r->key_index, id);
    if (!engine_id) {
        pv_api_fail(&err, 500, "server_error", NULL, NULL, "out of memory");
        return srv_respond_error(r, &err);
    }
    state_call c = {.engine_id = engine_id};
    pv_status st;
    if (!put) {
        uint8_t *file = NULL;
        size_t size = 0;
        st = pv_engine_loop_call(r->srv->loop, export_on_engine, &c);
        if (st == PV_OK)
            st = pv_session_image_encode(c.out, &file, &size);
        pv_session_image_free(c.out);
        free(engine_id);
        if (st == PV_OK)
            return srv_respond(r, 200, "application/octet-stream", (char *)file, size);
        if (st == PV_ERR_NOT_FOUND)
            pv_api_fail(&err, 404, "not_found_error", "session_id", "session_not_found", "No session '%.128s'.", id);
        else if (st == PV_ERR_BUSY)
            pv_api_fail(&err, 409, "invalid_request_error", "session_id", "session_busy",
                        "Session '%.128s' has a request in progress; try again when it ends.", id);
        else
            pv_api_fail(&err, 500, "server_error", NULL, NULL, "session state: %s", pv_last_error());
        return srv_respond_error(r, &err);
    }
    pv_state_identity ident;
    pv_engine_state_identity(r->srv->engine, &ident);
    pv_session_image *img = NULL;
    st = pv_session_image_decode(r->body.s ? r->body.s : "", r->body.n, &ident, "the request body", &img);
    if (st != PV_OK) {
        pv_api_fail(&err, 400, "invalid_request_error", NULL, "invalid_session_state", "%s", pv_last_error());
    } else if (strcmp(img->id, engine_id) != 0) {
        /* Another session's file, or another key's namespace. */
        pv_api_fail(&err, 400, "invalid_request_error", "session_id", "session_mismatch",
                    "The state holds another session than '%.128s' (or one of another API key).", id);
        st = PV_ERR_INVALID_ARG;
    } else {
        c.in = img;
        st = pv_engine_loop_call(r->srv->loop, import_on_engine, &c);
        if (st == PV_ERR_BUSY)
            pv_api_fail(&err, 409, "invalid_request_error", "session_id", "session_exists",
                        "Session '%.128s' exists on this server already; DELETE it first to replace it.", id);
        else if (st == PV_ERR_FORMAT)
            pv_api_fail(&err, 400, "invalid_request_error", NULL, "invalid_session_state", "%s", pv_last_error());
        else if (st != PV_OK)
            pv_api_fail(&err, 500, "server_error", NULL, NULL, "session state: %s", pv_last_error());
    }
    pv_session_image_free(img);
    free(engine_id);
    if (st != PV_OK)
        return srv_respond_error(r, &err);
    return srv_respond_json(r, 201,
                            json_pack("{s:s, s:s, s:I, s:I, s:I}", "id", id, "object", "session", "tokens",
                                      (json_int_t)c.tokens, "records_kept", (json_int_t)c.res.records_kept,
                                      "records_dropped", (json_int_t)c.res.records_dropped));
}
