/* pensieve-serve: the OpenAI-compatible HTTP server. Options, the serving
 * stack, and the signals that stop it; the serving itself is server/. */
#include "apps/setup.h"
#include "server/server.h"

#include <pensieve/state.h>

#include <errno.h>
#include <inttypes.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *prog = "pensieve-serve";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pensieve-serve [options]\n"
            "  --model PATH              GGUF file (default: the one scripts/get-model installs)\n"
            "  --synthetic               serve the tiny synthetic test model (no download)\n"
            "  --backend NAME            cpu, opencl or cuda (default cpu)\n"
            "  --host ADDR               IPv4 address to listen on (default 127.0.0.1)\n"
            "  --allowed-host NAME       on a loopback address, also answer requests whose Host is\n"
            "                            NAME (others than the address and localhost get 403)\n"
            "  --port N                  port (default 8080; 0 = any free port)\n"
            "  --port-file PATH          write the port to PATH once listening\n"
            "  --mode MODE               pensieve, gpu-only or stateless (default pensieve)\n"
            "  --policy NAME             eviction policy: pensieve, weighted or lru\n"
            "  --config FILE             cache settings from the [cache] section of an INI file\n"
            "  --profile FILE            device profile of pensieve-tune (default\n"
            "                            $XDG_CONFIG_HOME/pensieve/profiles.ini)\n"
            "  --device-mem SIZE         device tier budget, e.g. 512M, 2G\n"
            "  --host-mem SIZE           host tier budget\n"
            "  --kv f32|f16              KV cache type (default f32)\n"
            "  --weights native|f32      weights as in the file (default) or widened to f32\n"
            "  --max-sessions N          named sessions at most (default 0 = no limit)\n"
            "  --session-idle-timeout S  end sessions idle for S seconds (default 0 = never)\n"
            "  --no-prefix-sharing       every session keeps its own copy of a common prefix (a\n"
            "                            system prompt), for comparison; by default sessions of one\n"
            "                            API key share its full chunks\n"
            "  --decode-steps N          decode steps chained on the device per engine step, the\n"
            "                            host reading tokens one step behind (default 0: 1 on the\n"
            "                            CPU backend, 4 elsewhere)\n"
            "  --api-key KEY             require 'Authorization: Bearer KEY' on /v1/\n"
            "  --api-keys FILE           one key per line; each key's sessions are its own\n"
            "  --max-body SIZE           largest request body (default 8M)\n"
            "  --max-state-body SIZE     largest session state PUT to /v1/session-states (default 1G)\n"
            "  --threads N               HTTP threads (default 4)\n"
            "  --http-timeout S          close a connection silent for S seconds while it sends a\n"
            "                            request or between requests (default 30)\n"
            "  --model-id NAME           the model's id in /v1/models (default: the file name)\n"
            "  --state-dir DIR           keep sessions across restarts: restore them from DIR at start,\n"
            "                            save them there at shutdown and when idle\n"
            "  --state-save-idle S       save sessions idle for S seconds in the background\n"
            "                            (default 30; 0 = only at shutdown)\n"
            "  --state-max-size SIZE     size limit of DIR; the lowest retention values go first\n"
            "                            (default 0 = none)\n"
            "  -h, --help                this text\n");
}

typedef struct serve_options {
    app_stack_options stack;
    const char *host, *port_file, *keys_file, *model_id, *state_dir;
    double state_save_idle_s;
    uint64_t state_max_bytes;
    long port, threads, max_sessions, http_timeout_s;
    uint64_t max_body, max_state_body;
    char **keys;
    size_t n_keys;
    const char **allowed_hosts;
    size_t n_allowed_hosts;
} serve_options;

static int add_allowed_host(serve_options *o, const char *name)
{
    for (const char *c = name; *c; c++)
        if (*c <= ' ' || *c == 0x7f || *c == '/' || *c == ':' || *c == '@') {
            fprintf(stderr, "%s: --allowed-host '%s': a host name without port, spaces or slashes\n", prog, name);
            return -1;
        }
    const char **h = realloc(o->allowed_hosts, (o->n_allowed_hosts + 1) * sizeof *h);
    if (!h) {
        fprintf(stderr, "%s: out of memory for --allowed-host\n", prog);
        return -1;
    }
    o->allowed_hosts = h;
    h[o->n_allowed_hosts++] = name;
    return 0;
}

static int add_key(serve_options *o, const char *key, const char *where)
{
    if (!*key) {
        fprintf(stderr, "%s: %s: an empty API key\n", prog, where);
        return -1;
    }
    char **k = realloc(o->keys, (o->n_keys + 1) * sizeof *k);
    if (!k || !(k[o->n_keys] = strdup(key))) {
        if (k)
            o->keys = k;
        fprintf(stderr, "%s: out of memory for API keys\n", prog);
        return -1;
    }
    o->keys = k;
    o->n_keys++;
    return 0;
}

/* One key per line; blank lines and lines starting with '#' are skipped. */
static int read_keys(serve_options *o, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: --api-keys '%s': %s\n", prog, path, strerror(errno));
        return -1;
    }
    char line[1024];
    unsigned no = 0;
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        no++;
        size_t n = strlen(line);
        if (n == sizeof line - 1 && line[n - 1] != '\n') {
            fprintf(stderr, "%s: %s:%u: a key longer than %zu bytes\n", prog, path, no, sizeof line - 2);
            rc = -1;
            break;
        }
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' '))
            line[--n] = '\0';
        if (n == 0 || line[0] == '#')
            continue;
        char where[64];
        snprintf(where, sizeof where, "%s:%u", path, no);
        rc = add_key(o, line, where);
    }
    fclose(f);
    if (rc == 0 && o->n_keys == 0) {
        fprintf(stderr, "%s: --api-keys '%s' holds no key\n", prog, path);
        rc = -1;
    }
    return rc;
}

static int parse_args(int argc, char **argv, serve_options *o)
{
    enum { OPT_MODEL = 256, OPT_SYNTH, OPT_BACKEND, OPT_HOST, OPT_PORT, OPT_PORTFILE, OPT_MODE, OPT_POLICY,
           OPT_CONFIG, OPT_PROFILE, OPT_DEVMEM, OPT_HOSTMEM, OPT_KV, OPT_WEIGHTS, OPT_MAXSESS, OPT_IDLE, OPT_KEY, OPT_KEYS, OPT_BODY,
           OPT_THREADS, OPT_MODELID, OPT_STATEDIR, OPT_STATEIDLE, OPT_STATEMAX, OPT_STATEBODY, OPT_ALLOWHOST,
           OPT_HTTPTIMEOUT, OPT_NOSHARE, OPT_STEPS };
    static const struct option longopts[] = {
        {"model", required_argument, 0, OPT_MODEL},
        {"synthetic", no_argument, 0, OPT_SYNTH},
        {"backend", required_argument, 0, OPT_BACKEND},
        {"host", required_argument, 0, OPT_HOST},
        {"port", required_argument, 0, OPT_PORT},
        {"port-file", required_argument, 0, OPT_PORTFILE},
        {"mode", required_argument, 0, OPT_MODE},
        {"policy", required_argument, 0, OPT_POLICY},
        {"config", required_argument, 0, OPT_CONFIG},
        {"profile", required_argument, 0, OPT_PROFILE},
        {"device-mem", required_argument, 0, OPT_DEVMEM},
        {"host-mem", required_argument, 0, OPT_HOSTMEM},
        {"kv", required_argument, 0, OPT_KV},
        {"weights", required_argument, 0, OPT_WEIGHTS},
        {"max-sessions", required_argument, 0, OPT_MAXSESS},
        {"session-idle-timeout", required_argument, 0, OPT_IDLE},
        {"no-prefix-sharing", no_argument, 0, OPT_NOSHARE},
        {"decode-steps", required_argument, 0, OPT_STEPS},
        {"api-key", required_argument, 0, OPT_KEY},
        {"api-keys", required_argument, 0, OPT_KEYS},
        {"max-body", required_argument, 0, OPT_BODY},
        {"threads", required_argument, 0, OPT_THREADS},
        {"model-id", required_argument, 0, OPT_MODELID},
        {"state-dir", required_argument, 0, OPT_STATEDIR},
        {"state-save-idle", required_argument, 0, OPT_STATEIDLE},
        {"state-max-size", required_argument, 0, OPT_STATEMAX},
        {"max-state-body", required_argument, 0, OPT_STATEBODY},
        {"allowed-host", required_argument, 0, OPT_ALLOWHOST},
        {"http-timeout", required_argument, 0, OPT_HTTPTIMEOUT},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    o->stack.backend = "cpu";
    o->stack.mode = PV_MODE_PENSIEVE;
    o->stack.kv_dtype = PV_F32;
    o->host = "127.0.0.1";
    o->port = 8080;
    o->threads = 4;
    o->http_timeout_s = 30;
    o->max_body = 8u << 20;
    o->max_state_body = 1u << 30;
    o->state_save_idle_s = 30;
    int c;
    float idle;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (optarg && !*optarg) {
            const char *name = NULL;
            for (const struct option *lo = longopts; !name && lo->name; lo++)
                if (lo->val == c)
                    name = lo->name;
            fprintf(stderr, "%s: --%s needs a value, got an empty one\n", prog, name ? name : "option");
            return -1;
        }
        switch (c) {
        case OPT_MODEL: o->stack.model = optarg; break;
        case OPT_SYNTH: o->stack.synthetic = 1; break;
        case OPT_BACKEND: o->stack.backend = optarg; break;
        case OPT_HOST: o->host = optarg; break;
        case OPT_PORT:
            if (app_opt_long(prog, "--port", optarg, 0, 65535, &o->port)) return -1;
            break;
        case OPT_PORTFILE: o->port_file = optarg; break;
        case OPT_MODE:
            if (pv_engine_mode_parse(optarg, &o->stack.mode) != PV_OK) {
                fprintf(stderr, "%s: --mode '%s' is not pensieve, gpu-only or stateless\n", prog, optarg);
                return -1;
            }
            break;
        case OPT_POLICY:
            if (pv_policy_parse(optarg, &o->stack.policy) != PV_OK) {
                fprintf(stderr, "%s: --policy '%s' is not pensieve, weighted or lru\n", prog, optarg);
                return -1;
            }
            o->stack.have_policy = 1;
            break;
        case OPT_CONFIG: o->stack.config = optarg; break;
        case OPT_PROFILE: o->stack.profile = optarg; break;
        case OPT_DEVMEM:
            if (app_opt_size(prog, "--device-mem", optarg, &o->stack.device_bytes)) return -1;
            break;
        case OPT_HOSTMEM:
            if (app_opt_size(prog, "--host-mem", optarg, &o->stack.host_bytes)) return -1;
            break;
        case OPT_WEIGHTS:
            if (app_opt_weights(prog, optarg, &o->stack.weights)) return -1;
            break;
        case OPT_KV:
            if (strcmp(optarg, "f32") == 0) o->stack.kv_dtype = PV_F32;
            else if (strcmp(optarg, "f16") == 0) o->stack.kv_dtype = PV_F16;
            else {
                fprintf(stderr, "%s: --kv '%s' is neither f32 nor f16\n", prog, optarg);
                return -1;
            }
            break;
        case OPT_MAXSESS:
            if (app_opt_long(prog, "--max-sessions", optarg, 0, 1L << 30, &o->max_sessions)) return -1;
            break;
        case OPT_IDLE:
            if (app_opt_float(prog, "--session-idle-timeout", optarg, 0, 1e9, &idle)) return -1;
            o->stack.idle_timeout_s = idle;
            break;
        case OPT_NOSHARE:
            o->stack.no_prefix_sharing = 1;
            break;
        case OPT_STEPS:
            if (app_stack_option(prog, "decode-steps", optarg, &o->stack) < 0)
                return -1;
            break;
        case OPT_KEY:
            if (add_key(o, optarg, "--api-key")) return -1;
            break;
        case OPT_KEYS: o->keys_file = optarg; break;
        case OPT_BODY:
            if (app_opt_size(prog, "--max-body", optarg, &o->max_body)) return -1;
            break;
        case OPT_THREADS:
            if (app_opt_long(prog, "--threads", optarg, 1, 1024, &o->threads)) return -1;
            break;
        case OPT_MODELID: o->model_id = optarg; break;
        case OPT_ALLOWHOST:
            if (add_allowed_host(o, optarg)) return -1;
            break;
        case OPT_HTTPTIMEOUT:
            if (app_opt_long(prog, "--http-timeout", optarg, 1, 86400, &o->http_timeout_s)) return -1;
            break;
        case OPT_STATEDIR: o->state_dir = optarg; break;
        case OPT_STATEIDLE:
            if (app_opt_float(prog, "--state-save-idle", optarg, 0, 1e9, &idle)) return -1;
            o->state_save_idle_s = idle;
            break;
        case OPT_STATEBODY:
            if (app_opt_size(prog, "--max-state-body", optarg, &o->max_state_body)) return -1;
            break;
        case OPT_STATEMAX:
            if (app_opt_size(prog, "--state-max-size", optarg, &o->state_max_bytes)) return -1;
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        usage(stderr);
        return -1;
    }
    if (o->stack.synthetic && o->stack.model) {
        fprintf(stderr, "%s: --model and --synthetic exclude each other\n", prog);
        return -1;
    }
    if (o->keys_file && read_keys(o, o->keys_file))
        return -1;
    return 0;
}

static void free_options(serve_options *o)
{
    for (size_t i = 0; i < o->n_keys; i++)
        free(o->keys[i]);
    free(o->keys);
    free(o->allowed_hosts);
}

static int write_port(const char *path, unsigned port)
{
    /* Written whole under another name, then renamed: a reader polling
     * for the file never sees it half written. */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%u\n", port) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "%s: --port-file '%s': %s\n", prog, path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Opens --state-dir and restores its sessions into the engine before the
 * server listens, so no request can create a session being restored. */
static int open_state(const serve_options *o, app_stack *st, pv_state_dir **out)
{
    pv_state_dir_config dc = {
        .path = o->state_dir, .save_idle_s = o->state_save_idle_s, .max_bytes = o->state_max_bytes,
    };
    pv_state_restore_report rep;
    if (pv_state_dir_open(out, &dc, st->engine, NULL) != PV_OK || pv_state_dir_restore(*out, &rep) != PV_OK) {
        fprintf(stderr, "%s: --state-dir '%s': %s\n", prog, o->state_dir, pv_last_error());
        pv_state_dir_free(*out);
        *out = NULL;
        return -1;
    }
    fprintf(stderr,
            "%s: state: restored %u sessions from %s (%.1f MB in %.2f s; %" PRIu64 " chunk records on host, %" PRIu64
            " dropped; %u files skipped)\n",
            prog, rep.sessions, o->state_dir, rep.bytes_read / 1e6, rep.seconds, rep.records_kept,
            rep.records_dropped, rep.skipped);
    return 0;
}

static int stop_pipe[2];

static void on_stop_signal(int sig)
{
    unsigned char b = (unsigned char)sig;
    int saved = errno;
    /* A full pipe means a stop is already pending: nothing to add. */
    ssize_t written = write(stop_pipe[1], &b, 1);
    (void)written;
    errno = saved;
}

int main(int argc, char **argv)
{
    serve_options o;
    if (parse_args(argc, argv, &o)) {
        free_options(&o);
        return 2;
    }
    /* Threads exist before main (OpenBLAS starts its pool when loaded),
     * so a stop signal may land on any of them: the handler only writes to
     * a pipe that main waits on. */
    if (pipe(stop_pipe) != 0) {
        fprintf(stderr, "%s: pipe: %s\n", prog, strerror(errno));
        free_options(&o);
        return 1;
    }
    app_catch_stop_signals(on_stop_signal);
    signal(SIGPIPE, SIG_IGN);

    app_stack st;
    if (app_stack_init(&st, &o.stack, prog) != 0) {
        app_stack_free(&st);
        free_options(&o);
        return 1;
    }
    pv_state_dir *state = NULL;
    if (o.state_dir && open_state(&o, &st, &state)) {
        app_stack_free(&st);
        free_options(&o);
        return 1;
    }
    /* Namespaces of API keys outlive a restart with the state they name. */
    uint8_t secret[PV_STATE_SECRET_BYTES];
    if (state && o.n_keys && pv_state_dir_secret(state, secret) != PV_OK) {
        fprintf(stderr, "%s: --state-dir '%s': %s\n", prog, o.state_dir, pv_last_error());
        pv_state_dir_free(state);
        app_stack_free(&st);
        free_options(&o);
        return 1;
    }
    pv_server_config sc;
    pv_server_config_defaults(&sc);
    sc.state_dir = state;
    sc.namespace_secret = state && o.n_keys ? secret : NULL;
    sc.allowed_hosts = o.allowed_hosts;
    sc.n_allowed_hosts = o.n_allowed_hosts;
    sc.connection_timeout_s = (unsigned)o.http_timeout_s;
    sc.host = o.host;
    sc.port = (uint16_t)o.port;
    sc.threads = (unsigned)o.threads;
    sc.max_body = (size_t)o.max_body;
    sc.max_state_body = (size_t)o.max_state_body;
    sc.max_sessions = (size_t)o.max_sessions;
    sc.api_keys = (const char *const *)o.keys;
    sc.n_api_keys = o.n_keys;
    sc.model_id = o.model_id ? o.model_id : st.model_id;
    sc.n_ctx = pv_llama_hparams_of(st.model)->n_ctx_train;
    sc.n_vocab = pv_llama_hparams_of(st.model)->n_vocab;
    sc.n_layers = pv_llama_hparams_of(st.model)->n_layers;
    sc.log = stderr;
    pv_server *srv = NULL;
    pv_status s = pv_server_start(&srv, st.engine, &st.tok, &sc);
    memset(secret, 0, sizeof secret);
    if (s != PV_OK) {
        fprintf(stderr, "%s: %s: %s\n", prog, pv_status_str(s), pv_last_error());
        pv_state_dir_free(state);
        app_stack_free(&st);
        free_options(&o);
        return 1;
    }
    unsigned port = pv_server_port(srv);
    fprintf(stderr, "%s: serving %s (%s backend, %s mode) on http://%s:%u/v1%s\n", prog, sc.model_id,
            o.stack.backend, pv_engine_mode_name(o.stack.mode), o.host, port,
            o.n_keys ? ", API key required" : "");
    int rc = 0;
    if (o.port_file && write_port(o.port_file, port))
        rc = 1;
    unsigned char sig = 0;
    while (rc == 0 && read(stop_pipe[0], &sig, 1) < 0 && errno == EINTR)
        continue;
    if (sig)
        fprintf(stderr, "%s: %s: stopping\n", prog, sig == SIGINT ? "SIGINT" : "SIGTERM");
    pv_server_stop(srv, 5.0);
    pv_state_dir_free(state);
    app_stack_free(&st);
    free_options(&o);
    return rc;
}
