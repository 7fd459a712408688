/* /v1/session-states/{id}: a session's state file (include/pensieve/state.h)
 * over HTTP, for moving a session between replicas while both run (a
 * drain, docs/scaling.md): GET exports the session as a file, PUT imports
 * one into this server's engine. A file carries the client's own id, never
 * the API key's namespace: a PUT must name the id the file holds, and the
 * session lands in the caller's namespace, so no key reaches another's. */
#define _GNU_SOURCE /* O_TMPFILE */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "server/server_internal.h"

#include <pensieve/state.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct state_call {
    const char *engine_id;
    const pv_session_image *in;  /* PUT */
    pv_session_image *out;       /* GET */
    pv_import_result res;
    size_t tokens;
    size_t max_sessions, sessions; /* PUT: the server's limit (0: none), and how many it held */
} state_call;

/* An unnamed file for a PUT's body: in $TMPDIR (else /tmp), gone when
 * closed. */
static int spool_open(void)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL))
        return fd;
    /* A file system without O_TMPFILE: a named file, unlinked at once. */
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/pensieve-put.XXXXXX", dir) >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    fd = mkstemp(path);
    if (fd >= 0)
        unlink(path);
    return fd;
}

int srv_spool_add(srv_req *r, const char *data, size_t n, pv_api_error *err)
{
    if (r->spool_fd < 0 && (r->spool_fd = spool_open()) < 0) {
        pv_api_fail(err, 500, "server_error", NULL, NULL, "cannot create a file for the request body: %s",
                    strerror(errno));
        return -1;
    }
    while (n > 0) {
        ssize_t w = write(r->spool_fd, data, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            pv_api_fail(err, 500, "server_error", NULL, NULL, "cannot store the request body: %s",
                        w < 0 ? strerror(errno) : "no space");
            return -1;
        }
        data += w;
        n -= (size_t)w;
        r->spooled += (size_t)w;
    }
    return 0;
}

static void count_session(void *user, const char *session)
{
    ((state_call *)user)->sessions++;
}

static pv_status export_on_engine(pv_engine *e, void *arg)
{
    state_call *c = arg;
    return pv_engine_session_export(e, c->engine_id, 1, &c->out, NULL);
}

static pv_status import_on_engine(pv_engine *e, void *arg)
{
    state_call *c = arg;
    size_t have;
    if (c->max_sessions && pv_engine_session_tokens(e, c->engine_id, &have) == PV_ERR_NOT_FOUND) {
        pv_engine_foreach_session(e, count_session, c);
        if (c->sessions >= c->max_sessions)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "the server holds its limit of %zu sessions", c->max_sessions);
    }
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
        /* The file names the client's id only: the namespace is this
         * server's business, and a hash of a key is not for export. */
        char *public_id = st == PV_OK ? strdup(id) : NULL;
        if (st == PV_OK && !public_id)
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "session id");
        if (st == PV_OK) {
            free(c.out->id);
            c.out->id = public_id;
            st = pv_session_image_encode(c.out, &file, &size);
        }
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
    /* One import at a time holds its image in memory; the body waits on
     * disk (mapped: the kernel may drop its pages and read them again). */
    pthread_mutex_lock(&r->srv->import_mu);
    void *map = MAP_FAILED;
    if (r->spooled && (map = mmap(NULL, r->spooled, PROT_READ, MAP_PRIVATE, r->spool_fd, 0)) == MAP_FAILED)
        st = pv_api_fail(&err, 500, "server_error", NULL, NULL, "cannot map the request body: %s", strerror(errno));
    else if ((st = pv_session_image_decode(map != MAP_FAILED ? map : "", r->spooled, &ident, "the request body",
                                           &img)) != PV_OK)
        pv_api_fail(&err, 400, "invalid_request_error", NULL, "invalid_session_state", "%s", pv_last_error());
    if (map != MAP_FAILED)
        munmap(map, r->spooled);
    char *namespaced = NULL;
    if (st == PV_OK && strcmp(img->id, id) != 0) {
        pv_api_fail(&err, 400, "invalid_request_error", "session_id", "session_mismatch",
                    "The state holds session '%.128s', not '%.128s'.", img->id, id);
        st = PV_ERR_INVALID_ARG;
    } else if (st == PV_OK && !(namespaced = strdup(engine_id))) {
        pv_api_fail(&err, 500, "server_error", NULL, NULL, "out of memory");
        st = PV_ERR_OUT_OF_MEMORY;
    }
    if (st == PV_OK) {
        /* The session lands in the caller's own namespace. */
        free(img->id);
        img->id = namespaced;
        c.in = img;
        c.max_sessions = r->srv->cfg.max_sessions;
        st = pv_engine_loop_call(r->srv->loop, import_on_engine, &c);
        if (st == PV_ERR_BUSY)
            pv_api_fail(&err, 409, "invalid_request_error", "session_id", "session_exists",
                        "Session '%.128s' exists on this server already; DELETE it first to replace it.", id);
        else if (st == PV_ERR_OUT_OF_MEMORY && c.max_sessions && c.sessions >= c.max_sessions)
            pv_api_fail(&err, 429, "rate_limit_error", NULL, "too_many_sessions",
                        "The server holds its limit of %zu sessions (--max-sessions): end one with "
                        "DELETE /v1/sessions/{id}, or wait for idle ones to time out.",
                        c.max_sessions);
        else if (st == PV_ERR_FORMAT)
            pv_api_fail(&err, 400, "invalid_request_error", NULL, "invalid_session_state", "%s", pv_last_error());
        else if (st != PV_OK)
            pv_api_fail(&err, 500, "server_error", NULL, NULL, "session state: %s", pv_last_error());
    }
    pv_session_image_free(img);
    pthread_mutex_unlock(&r->srv->import_mu);
    free(engine_id);
    if (st != PV_OK)
        return srv_respond_error(r, &err);
    return srv_respond_json(r, 201,
                            json_pack("{s:s, s:s, s:I, s:I, s:I}", "id", id, "object", "session", "tokens",
                                      (json_int_t)c.tokens, "records_kept", (json_int_t)c.res.records_kept,
                                      "records_dropped", (json_int_t)c.res.records_dropped));
}
