/* pensieve-chat: the reference chat demo. Several conversations side by side,
 * each a session of the stateful engine, so a returning conversation reuses
 * its KV from the device or host tier instead of prefilling its history
 * again. After each answer a status line says where the context came from;
 * /cache sums up the tiers per conversation, /cache NAME draws one. All serving goes through the engine API.
 *
 * Interactive input goes through readline; --script FILE feeds the same
 * lines from a file (for tests and demos). */
#include "apps/chat.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <readline/history.h>
#include <readline/readline.h>

static const char *prog = "pensieve-chat";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pensieve-chat [options]\n"
            "  --model PATH         GGUF file (default: the one scripts/get-model installs)\n"
            "  --synthetic          use the tiny synthetic test model (no download)\n"
            "  --backend NAME       cpu, opencl or cuda (default cpu)\n"
            "  --mode MODE          pensieve, gpu-only or stateless (default pensieve)\n"
            "  --policy NAME        eviction policy: pensieve, weighted or lru\n"
            "  --device-mem SIZE    device tier budget, e.g. 512K, 64M, 1G\n"
            "  --host-mem SIZE      host tier budget (small budgets show swapping and recovery)\n"
            "  --config FILE        cache settings from the [cache] section of an INI file\n"
            "                       (the options above override it)\n"
            "  --profile FILE       device profile of pensieve-tune (default\n"
            "                       $XDG_CONFIG_HOME/pensieve/profiles.ini)\n"
            "  --kv f32|f16         KV cache type (default f32)\n"
            "  --weights native|f32 weights as in the file (default) or widened to f32\n"
            "  --no-prefix-sharing  sessions keep their own copy of a common prefix\n"
            "  --decode-steps N     decode steps chained on the device per engine step (default 0:\n"
            "                       1 on the CPU backend, 4 elsewhere)\n"
            "  --temperature T      0 = greedy (default 0)\n"
            "  --top-p P            nucleus mass when sampling (default 0.95)\n"
            "  --seed S             sampling seed of the first turn; later turns take the next ones\n"
            "  -n, --max-tokens N   tokens per answer at most (default 256; 0 = up to the context)\n"
            "  --script FILE        read turns from FILE, one per line ('/' lines are commands)\n"
            "  -h, --help           this text\n"
            "Type /help in the chat for its commands.\n");
}

static void print_commands(void)
{
    printf("commands:\n"
           "  /new           start a fresh conversation\n"
           "  /switch NAME   go to conversation NAME (created on first use)\n"
           "  /end           end the current conversation (frees its cache) and start a fresh one\n"
           "  /cache         a line per conversation: tokens, chunks, where its KV lives\n"
           "  /cache NAME    where every (chunk, layer) of conversation NAME lives\n"
           "  /stats         engine and cache statistics\n"
           "  /tune          fit this device's cost model (what pensieve-tune --quick measures:\n"
           "                 about 15 s for SmolLM2 on 2 CPU cores, under a second for --synthetic),\n"
           "                 save it as the device's profile and use it (at once if no\n"
           "                 conversation has started, else from the next start)\n"
           "  /help          this list\n"
           "  /quit          leave\n"
           "Anything else is a message to the current conversation.\n");
}

/* ---- option values: an empty or malformed value is an error naming the option */

static int parse_args(int argc, char **argv, chat_options *o)
{
    enum { OPT_MODEL = 256, OPT_SYNTH, OPT_BACKEND, OPT_MODE, OPT_POLICY, OPT_DEVMEM, OPT_HOSTMEM,
           OPT_CONFIG, OPT_PROFILE, OPT_KV, OPT_WEIGHTS, OPT_TEMP, OPT_TOPP, OPT_SEED, OPT_SCRIPT,
           OPT_NOSHARE, OPT_STEPS };
    static const struct option longopts[] = {
        {"model", required_argument, 0, OPT_MODEL},      {"synthetic", no_argument, 0, OPT_SYNTH},
        {"backend", required_argument, 0, OPT_BACKEND},  {"mode", required_argument, 0, OPT_MODE},
        {"policy", required_argument, 0, OPT_POLICY},    {"device-mem", required_argument, 0, OPT_DEVMEM},
        {"host-mem", required_argument, 0, OPT_HOSTMEM}, {"config", required_argument, 0, OPT_CONFIG},
        {"profile", required_argument, 0, OPT_PROFILE},
        {"kv", required_argument, 0, OPT_KV},            {"weights", required_argument, 0, OPT_WEIGHTS},
        {"temperature", required_argument, 0, OPT_TEMP},
        {"top-p", required_argument, 0, OPT_TOPP},       {"seed", required_argument, 0, OPT_SEED},
        {"max-tokens", required_argument, 0, 'n'},       {"script", required_argument, 0, OPT_SCRIPT},
        {"no-prefix-sharing", no_argument, 0, OPT_NOSHARE},
        {"decode-steps", required_argument, 0, OPT_STEPS},
        {"help", no_argument, 0, 'h'},                   {0, 0, 0, 0},
    };
    *o = (chat_options){.backend = "cpu", .mode = PV_MODE_PENSIEVE, .kv_dtype = PV_F32,
                        .temperature = 0.0f, .top_p = 0.95f, .seed = 1, .max_tokens = 256};
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "n:h", longopts, NULL)) != -1) {
        /* Options with a text value: an empty one is never meant. */
        if (optarg && !*optarg) {
            const char *name = c == 'n' ? "-n/--max-tokens" : NULL;
            for (const struct option *lo = longopts; !name && lo->name; lo++)
                if (lo->val == c)
                    name = lo->name;
            fprintf(stderr, "%s: %s%s needs a value, got an empty one\n", prog,
                    c == 'n' ? "" : "--", name ? name : "option");
            return -1;
        }
        switch (c) {
        case OPT_MODEL: o->model = optarg; break;
        case OPT_SYNTH: o->synthetic = 1; break;
        case OPT_BACKEND: o->backend = optarg; break;
        case OPT_MODE:
            if (pv_engine_mode_parse(optarg, &o->mode) != PV_OK) {
                fprintf(stderr, "%s: --mode '%s' is not pensieve, gpu-only or stateless\n", prog, optarg);
                return -1;
            }
            break;
        case OPT_POLICY:
            if (pv_policy_parse(optarg, &o->policy) != PV_OK) {
                fprintf(stderr, "%s: --policy '%s' is not pensieve, weighted or lru\n", prog, optarg);
                return -1;
            }
            o->have_policy = 1;
            break;
        case OPT_DEVMEM:
            if (app_opt_size(prog, "--device-mem", optarg, &o->device_bytes)) return -1;
            break;
        case OPT_HOSTMEM:
            if (app_opt_size(prog, "--host-mem", optarg, &o->host_bytes)) return -1;
            break;
        case OPT_CONFIG: o->config = optarg; break;
        case OPT_PROFILE: o->profile = optarg; break;
        case OPT_WEIGHTS:
            if (app_opt_weights(prog, optarg, &o->weights)) return -1;
            break;
        case OPT_KV:
            if (strcmp(optarg, "f32") == 0) o->kv_dtype = PV_F32;
            else if (strcmp(optarg, "f16") == 0) o->kv_dtype = PV_F16;
            else {
                fprintf(stderr, "%s: --kv '%s' is neither f32 nor f16\n", prog, optarg);
                return -1;
            }
            break;
        case OPT_TEMP:
            if (app_opt_float(prog, "--temperature", optarg, 0.0, 100.0, &o->temperature)) return -1;
            break;
        case OPT_TOPP:
            if (app_opt_float(prog, "--top-p", optarg, 1e-6, 1.0, &o->top_p)) return -1;
            break;
        case OPT_SEED:
            if (app_opt_long(prog, "--seed", optarg, 0, INT32_MAX, &v)) return -1;
            o->seed = (uint64_t)v;
            break;
        case 'n':
            if (app_opt_long(prog, "-n/--max-tokens", optarg, 0, 1 << 20, &v)) return -1;
            o->max_tokens = (int32_t)v;
            break;
        case OPT_SCRIPT: o->script = optarg; break;
        case OPT_NOSHARE: o->no_prefix_sharing = 1; break;
        case OPT_STEPS: {
            long steps = 0;
            if (app_opt_long(prog, "--decode-steps", optarg, 0, PV_ENGINE_MAX_DECODE_STEPS, &steps))
                return -1;
            o->decode_steps = (int)steps;
            break;
        }
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        usage(stderr);
        return -1;
    }
    if (o->synthetic && o->model) {
        fprintf(stderr, "%s: --model and --synthetic exclude each other\n", prog);
        return -1;
    }
    return 0;
}

/* ---- setup ---------------------------------------------------------------- */

int chat_error(const char *what, pv_status st)
{
    fprintf(stderr, "%s: %s: %s: %s\n", prog, what, pv_status_str(st), pv_last_error());
    return -1;
}

int chat_init(chat *ch, const chat_options *o)
{
    memset(ch, 0, sizeof *ch);
    ch->o = o;
    ch->color = isatty(STDOUT_FILENO) && !getenv("NO_COLOR");
    ch->stack_options = (app_stack_options){
        .model = o->model, .backend = o->backend, .config = o->config, .profile = o->profile,
        .synthetic = o->synthetic, .mode = o->mode, .policy = o->policy, .have_policy = o->have_policy,
        .device_bytes = o->device_bytes, .host_bytes = o->host_bytes, .kv_dtype = o->kv_dtype,
        .weights = o->weights, .no_prefix_sharing = o->no_prefix_sharing,
        .decode_steps = o->decode_steps, .tune_hint = "/tune fits one"};
    if (app_stack_init(&ch->stack, &ch->stack_options, prog) != 0)
        return -1;
    if (!ch->stack.tok.has_chat_template) {
        fprintf(stderr, "%s: %s has no chat template this tokenizer understands\n", prog,
                ch->stack.model_name);
        return -1;
    }
    return 0;
}

void chat_free(chat *ch)
{
    app_stack_free(&ch->stack);
}

/* ---- the conversation loop ---------------------------------------------- */

/* What a line of input leads to. */
enum {
    LINE_OK = 0,
    LINE_QUIT = 1,
    LINE_ERROR = -1, /* that line failed; the chat goes on */
    LINE_FATAL = -2  /* the engine failed: its queued turn would block every later one */
};

static void on_token(void *user, int32_t token, const char *text, size_t len)
{
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

static void on_done(void *user, pv_status status, const pv_turn_result *result)
{
    chat *ch = user;
    ch->done = 1;
    ch->turn_status = status;
    if (result)
        ch->result = *result;
    /* Copied: the next pv_ call on this thread replaces the message. */
    snprintf(ch->turn_error, sizeof ch->turn_error, "%s", status != PV_OK ? pv_last_error() : "");
}

/* One user message to the current conversation: submit it as a chat
 * message (the engine renders the template), stream the answer, then the
 * status line. */
static int chat_turn(chat *ch, const char *line)
{
    pv_chat_message msg = {.role = "user", .content = line};
    pv_turn turn = {.messages = &msg, .n_messages = 1};
    pv_sampling_defaults(&turn.sampling);
    turn.sampling.temperature = ch->o->temperature;
    turn.sampling.top_p = ch->o->top_p;
    /* Each turn its own draws, yet a rerun of the same chat repeats them. */
    turn.sampling.seed = ch->o->seed + ch->turns;
    turn.sampling.max_tokens = ch->o->max_tokens;
    pv_turn_callbacks cb = {.on_token = on_token, .on_done = on_done, .user = ch};

    ch->done = 0;
    pv_status st = pv_engine_submit(ch->stack.engine, ch->session, &turn, &cb, NULL);
    if (st != PV_OK)
        return chat_error("turn", st);
    ch->turns++;
    /* Only this turn is in flight, so running the engine dry finishes it. */
    if ((st = pv_engine_run(ch->stack.engine)) != PV_OK) {
        printf("\n");
        chat_error("engine", st);
        return LINE_FATAL;
    }
    printf("\n");
    if (!ch->done) {
        fprintf(stderr, "%s: the engine went idle before the turn ended\n", prog);
        return LINE_FATAL;
    }
    if (ch->turn_status != PV_OK) {
        fprintf(stderr, "%s: turn: %s: %s\n", prog, pv_status_str(ch->turn_status),
                ch->turn_error);
        return LINE_ERROR;
    }
    chat_print_status(ch, &ch->result);
    return LINE_OK;
}

/* A name for a fresh conversation that the engine does not know yet. */
static void chat_new_session(chat *ch)
{
    size_t n;
    do
        snprintf(ch->session, sizeof ch->session, "chat-%u", ++ch->next_name);
    while (pv_engine_session_tokens(ch->stack.engine, ch->session, &n) == PV_OK);
}

/* A '/' line. */
static int chat_command(chat *ch, const char *line)
{
    const char *arg = line + strcspn(line, " \t");
    size_t cmd_len = (size_t)(arg - line);
    arg += strspn(arg, " \t");
#define IS(name) (cmd_len == sizeof(name) - 1 && strncmp(line, name, cmd_len) == 0)
    if (IS("/quit") || IS("/exit"))
        return LINE_QUIT;
    if (IS("/help")) {
        print_commands();
        return LINE_OK;
    }
    if (IS("/new")) {
        chat_new_session(ch);
        printf("new conversation %s\n", ch->session);
        return LINE_OK;
    }
    if (IS("/switch")) {
        if (!*arg || strlen(arg) > PV_SESSION_ID_MAX || arg[strcspn(arg, " \t")]) {
            fprintf(stderr, "%s: /switch needs one NAME of 1 to %d characters without spaces\n", prog,
                    PV_SESSION_ID_MAX);
            return LINE_ERROR;
        }
        snprintf(ch->session, sizeof ch->session, "%s", arg);
        size_t n = 0;
        if (pv_engine_session_tokens(ch->stack.engine, ch->session, &n) == PV_OK)
            printf("switched to %s (%zu tokens of history)\n", ch->session, n);
        else
            printf("switched to %s (new)\n", ch->session);
        return LINE_OK;
    }
    if (IS("/end")) {
        pv_status st = pv_engine_end_session(ch->stack.engine, ch->session);
        if (st != PV_OK)
            return chat_error("/end", st);
        printf("ended %s; ", ch->session);
        chat_new_session(ch);
        printf("new conversation %s\n", ch->session);
        return LINE_OK;
    }
    if (IS("/cache"))
        return chat_print_cache(ch, *arg ? arg : NULL);
    if (IS("/stats"))
        return chat_print_stats(ch);
    if (IS("/tune")) {
        int r = chat_tune(ch);
        return r == -2 ? LINE_FATAL : r;
    }
#undef IS
    fprintf(stderr, "%s: unknown command '%.*s' (/help lists them)\n", prog, (int)cmd_len, line);
    return LINE_ERROR;
}

/* A line of input: a command or a message; a LINE_* value. */
static int chat_line(chat *ch, char *line)
{
    size_t len = strlen(line);
    /* Trailing blanks too: "/switch bob " names bob. */
    while (len && strchr(" \t\r\n", line[len - 1]))
        line[--len] = 0;
    if (!line[strspn(line, " \t")])
        return LINE_OK;
    return line[0] == '/' ? chat_command(ch, line) : chat_turn(ch, line);
}

/* --script: every line echoed after the prompt, as a user would have typed
 * it; a failing line makes the exit status 1 but the script goes on, unless
 * the engine itself failed. */
static int run_script(chat *ch, const char *path)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: --script '%s': %s\n", prog, path, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    int failed = 0, r = 0;
    while (r != LINE_QUIT && r != LINE_FATAL && getline(&line, &cap, f) != -1) {
        printf("%s> %s%s", ch->session, line, line[0] && line[strlen(line) - 1] == '\n' ? "" : "\n");
        fflush(stdout);
        if ((r = chat_line(ch, line)) < 0)
            failed = 1;
    }
    free(line);
    if (f != stdin)
        fclose(f);
    return failed;
}

static int run_interactive(chat *ch)
{
    printf("pensieve-chat: %s on %s, %s mode. /help lists the commands, /quit leaves.\n",
           ch->stack.model_name, ch->o->backend, pv_engine_mode_name(ch->o->mode));
    for (;;) {
        /* \001 and \002 tell readline the colour codes take no room. */
        char prompt[PV_SESSION_ID_MAX + 32];
        snprintf(prompt, sizeof prompt, "%s%s%s> ", ch->color ? "\001\033[1;36m\002" : "",
                 ch->session, ch->color ? "\001\033[0m\002" : "");
        char *line = readline(prompt);
        if (!line) {
            printf("\n");
            return 0;
        }
        if (line[strspn(line, " \t")])
            add_history(line);
        int r = chat_line(ch, line);
        free(line);
        if (r == LINE_QUIT || r == LINE_FATAL)
            return r == LINE_FATAL;
    }
}

int main(int argc, char **argv)
{
    chat_options o;
    if (parse_args(argc, argv, &o))
        return 2;
    chat ch;
    if (chat_init(&ch, &o) != 0) {
        chat_free(&ch);
        return 1;
    }
    chat_new_session(&ch);
    int rc = o.script ? run_script(&ch, o.script) : run_interactive(&ch);
    chat_free(&ch);
    return rc;
}
