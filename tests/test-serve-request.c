/* The OpenAI request parser (server/request.h): valid bodies become the
 * expected fields; every invalid one is a 400 naming the field (param and
 * message) and leaves the request empty; error bodies are JSON that
 * jansson reads back. Hostile JSON (bad UTF-8, NUL escapes, duplicate keys,
 * deep nesting, large strings) is refused or taken without harm. */
#include "server/request.h"
#include "tap.h"

#include <jansson.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

static pv_api_limits lim;

static int is_empty(const pv_api_request *req)
{
    static const pv_api_request zero;
    return memcmp(req, &zero, sizeof zero) == 0;
}

static pv_status parse(pv_api_kind kind, const char *body, pv_api_request *req, pv_api_error *err)
{
    memset(err, 0, sizeof *err);
    return pv_api_parse(kind, body, strlen(body), &lim, req, err);
}

/* Parses a body that must be accepted; on failure says why. */
static int good(pv_api_kind kind, const char *body, pv_api_request *req)
{
    pv_api_error err;
    if (parse(kind, body, req, &err) == PV_OK)
        return 1;
    tap_diag("refused %s: %s (param %s)", body, err.message, err.param);
    return 0;
}

/* A body that must be a 400 with exactly this param (NULL: none) and a
 * message holding the field's name (when there is one) and `says`. */
static void refused_len(pv_api_kind kind, const char *body, size_t len, const char *param,
                        const char *says, const char *what)
{
    pv_api_request req;
    pv_api_error err;
    memset(&err, 0, sizeof err);
    memset(&req, 0x5a, sizeof req); /* the parser must clear it */
    pv_status st = pv_api_parse(kind, body, len, &lim, &req, &err);
    const char *want = param ? param : "";
    char quoted[128];
    snprintf(quoted, sizeof quoted, "'%s'", want);
    int good_param = strcmp(err.param, want) == 0;
    int names = !param || strstr(err.message, quoted) != NULL;
    int said = strstr(err.message, says) != NULL;
    ok(st == PV_ERR_INVALID_ARG && err.http_status == 400 && err.type &&
           strcmp(err.type, "invalid_request_error") == 0 && err.code == NULL && good_param &&
           names && said && is_empty(&req),
       "%s: 400, param '%s': %s", what, err.param, err.message);
    if (st == PV_OK)
        pv_api_request_free(&req);
    if (!good_param)
        tap_diag("param is '%s', expected '%s'", err.param, want);
    if (!said || !names)
        tap_diag("message lacks %s or \"%s\"", quoted, says);
}

static void refused(pv_api_kind kind, const char *body, const char *param, const char *says)
{
    refused_len(kind, body, strlen(body), param, says, body);
}

#define CHAT PV_API_CHAT
#define COMPL PV_API_COMPLETION
/* A chat body with one user message and the given extra fields. */
#define CHAT_WITH(extra) "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]," extra "}"
#define COMPL_WITH(extra) "{\"prompt\":\"once\"," extra "}"

static void valid_chat(void)
{
    pv_api_request req;
    ok(good(CHAT,
            "{\"model\":\"smol\",\"messages\":["
            "{\"role\":\"developer\",\"content\":\"be brief\"},"
            "{\"role\":\"user\",\"name\":\"ann\",\"content\":[{\"type\":\"text\",\"text\":\"one \"},"
            "{\"type\":\"text\",\"text\":\"two\"}]},"
            "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[]},"
            "{\"role\":\"system\",\"content\":\"x\",\"refusal\":null}],"
            "\"extra_field\":{\"a\":[1,2]},\"stream\":true,"
            "\"stream_options\":{\"include_usage\":true},\"user\":\"u1\","
            "\"session_id\":\"sess-1\",\"prompt_cache_key\":\"pk\"}",
            &req),
       "a chat body with four messages parses");
    ok(req.kind == CHAT && req.n_messages == 4 && req.model && strcmp(req.model, "smol") == 0,
       "kind, model and message count");
    ok(strcmp(req.messages[0].role, "system") == 0 && strcmp(req.messages[0].content, "be brief") == 0,
       "developer is read as system");
    ok(strcmp(req.messages[1].role, "user") == 0 && strcmp(req.messages[1].content, "one two") == 0,
       "text parts are concatenated in order: \"%s\"", req.messages[1].content);
    ok(strcmp(req.messages[2].role, "assistant") == 0 && strcmp(req.messages[2].content, "") == 0,
       "an empty assistant content");
    ok(strcmp(req.messages[3].role, "system") == 0, "a system message");
    ok(req.stream == 1 && req.include_usage == 1, "stream and include_usage");
    ok(req.user && strcmp(req.user, "u1") == 0 && req.session_id &&
           strcmp(req.session_id, "sess-1") == 0 && req.prompt_cache_key &&
           strcmp(req.prompt_cache_key, "pk") == 0,
       "user, session_id and prompt_cache_key");
    ok(req.sampling.temperature == 1.0f && req.sampling.top_p == 1.0f && req.sampling.max_tokens == 0 &&
           !req.max_tokens_set && !req.seed_set && !req.return_token_ids &&
           req.sampling.stop == NULL && req.sampling.n_stop == 0 && req.sampling.ignore_eos == 0 &&
           req.prompt == NULL,
       "OpenAI's defaults: temperature 1, top_p 1, no token limit, no stops");
    pv_api_request_free(&req);
    ok(is_empty(&req), "pv_api_request_free zeroes the request");
    pv_api_request_free(NULL);

    ok(good(CHAT,
            CHAT_WITH("\"max_tokens\":5,\"max_completion_tokens\":7,\"temperature\":0.5,"
                      "\"top_p\":0.9,\"seed\":-1,\"stop\":[\"\\n\\n\",\"END\"],\"n\":1,"
                      "\"ignore_eos\":true,\"return_token_ids\":true,\"logprobs\":false,\"top_logprobs\":null,\"tools\":[],"
                      "\"functions\":null,\"response_format\":{\"type\":\"text\"},"
                      "\"presence_penalty\":0,\"frequency_penalty\":0.0,\"logit_bias\":{},"
                      "\"stream\":false,\"stream_options\":null"),
            &req),
       "every sampling field in its accepted form");
    ok(req.sampling.max_tokens == 7 && req.max_tokens_set, "max_completion_tokens wins over max_tokens");
    ok(req.sampling.temperature == 0.5f && fabsf(req.sampling.top_p - 0.9f) < 1e-6f,
       "temperature and top_p");
    ok(req.seed_set && req.sampling.seed == UINT64_MAX, "seed -1 is stored as 2^64-1");
    ok(req.n_stops == 2 && req.sampling.n_stop == 2 &&
           req.sampling.stop == (const char *const *)req.stops &&
           strcmp(req.stops[0], "\n\n") == 0 && strcmp(req.stops[1], "END") == 0,
       "stop strings, owned and pointed to by sampling");
    ok(req.sampling.ignore_eos == 1 && req.return_token_ids == 1 && req.stream == 0,
       "ignore_eos and return_token_ids (vLLM's extensions)");
    pv_api_request_free(&req);

    ok(good(CHAT, CHAT_WITH("\"max_tokens\":2147483647,\"top_p\":0,\"temperature\":2,\"stop\":\"x\","
                            "\"seed\":9223372036854775807"),
            &req),
       "top_p 0, the largest max_tokens and seed, one stop string");
    ok(req.sampling.temperature == 0.0f && req.sampling.top_p == 1.0f, "top_p 0 means greedy");
    ok(req.sampling.max_tokens == INT32_MAX && req.sampling.seed == (uint64_t)INT64_MAX,
       "max_tokens 2^31-1, seed 2^63-1");
    ok(req.n_stops == 1 && strcmp(req.sampling.stop[0], "x") == 0, "a single stop string");
    pv_api_request_free(&req);

    ok(good(CHAT, CHAT_WITH("\"max_tokens\":3,\"max_completion_tokens\":null,\"temperature\":null,"
                            "\"seed\":null,\"model\":null,\"user\":null,\"session_id\":null,"
                            "\"stop\":[]"),
            &req),
       "nulls are the defaults");
    ok(req.sampling.max_tokens == 3 && req.max_tokens_set && req.sampling.temperature == 1.0f &&
           !req.seed_set && req.model == NULL && req.n_stops == 0 && req.stops == NULL,
       "max_tokens alone; null temperature is 1");
    pv_api_request_free(&req);

    /* A 1 MiB content string is copied whole. */
    size_t big = 1u << 20;
    const char *head = "{\"messages\":[{\"role\":\"user\",\"content\":\"";
    const char *tail = "\"}]}";
    char *body = malloc(strlen(head) + big + strlen(tail) + 1);
    strcpy(body, head);
    memset(body + strlen(head), 'a', big);
    strcpy(body + strlen(head) + big, tail);
    ok(good(CHAT, body, &req) && strlen(req.messages[0].content) == big, "a 1 MiB content string");
    pv_api_request_free(&req);
    free(body);
}

static void valid_completion(void)
{
    pv_api_request req;
    ok(good(COMPL, "{\"model\":\"m\",\"prompt\":\"The sky is\",\"max_tokens\":16,\"echo\":false,"
                   "\"suffix\":null,\"best_of\":1,\"logprobs\":null,\"n\":null}",
            &req),
       "a completion body parses");
    ok(req.kind == COMPL && req.prompt && strcmp(req.prompt, "The sky is") == 0 &&
           req.prompt_len == 10 && req.messages == NULL && req.n_messages == 0 &&
           req.sampling.max_tokens == 16 && req.max_tokens_set,
       "prompt, its length and max_tokens");
    pv_api_request_free(&req);
    ok(good(COMPL, "{\"prompt\":[\"caf\\u00e9\"]}", &req) && strcmp(req.prompt, "caf\xc3\xa9") == 0 &&
           req.prompt_len == 5,
       "an array of one prompt; escapes decoded to UTF-8");
    pv_api_request_free(&req);
    ok(good(COMPL, "{\"prompt\":\"\"}", &req) && req.prompt && req.prompt_len == 0,
       "an empty prompt is the server's to judge");
    pv_api_request_free(&req);
    ok(good(COMPL, "{\"prompt\":\"p\",\"messages\":7}", &req), "chat fields are unknown to completions");
    pv_api_request_free(&req);
}

static void invalid_messages(void)
{
    refused(CHAT, "{}", "messages", "required");
    refused(CHAT, "{\"messages\":[]}", "messages", "non-empty array");
    refused(CHAT, "{\"messages\":{\"role\":\"user\"}}", "messages", "non-empty array");
    refused(CHAT, "{\"messages\":\"hi\"}", "messages", "\"hi\"");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},\"b\"]}", "messages[1]",
            "an object");
    refused(CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"},"
            "{\"role\":\"tool\",\"content\":\"c\"}]}",
            "messages[2].role", "\"tool\"");
    refused(CHAT, "{\"messages\":[{\"role\":\"function\",\"content\":\"c\"}]}", "messages[0].role",
            "\"function\"");
    refused(CHAT, "{\"messages\":[{\"role\":\"User\",\"content\":\"c\"}]}", "messages[0].role",
            "'developer'");
    refused(CHAT, "{\"messages\":[{\"content\":\"c\"}]}", "messages[0].role", "required");
    refused(CHAT, "{\"messages\":[{\"role\":1,\"content\":\"c\"}]}", "messages[0].role", "a string");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content", "required");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":null}]}", "messages[0].content",
            "got null");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content",
            "got 5");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[]}]}", "messages[0].content",
            "non-empty array");
    refused(CHAT,
            "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
            "{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x\"}}]}]}",
            "messages[0].content[1].type", "not supported");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[\"a\"]}]}",
            "messages[0].content[0]", "an object");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}",
            "messages[0].content[0].type", "required");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
            "messages[0].content[0].text", "required");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]}",
            "messages[0].content[0].text", "a string");
    refused(CHAT,
            "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\","
            "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}",
            "messages[0].tool_calls", "not supported");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"c\",\"name\":5}]}",
            "messages[0].name", "a string");
    refused(CHAT, CHAT_WITH("\"logprobs\":true"), "logprobs", "not supported");
    refused(CHAT, CHAT_WITH("\"logprobs\":1"), "logprobs", "a boolean");

    /* More messages than the limit, refused before anything is copied. */
    size_t n = lim.max_messages + 1;
    const char *one = "{\"role\":\"user\",\"content\":\"x\"},";
    char *body = malloc(16 + n * strlen(one));
    strcpy(body, "{\"messages\":[");
    char *at = body + strlen(body);
    for (size_t i = 0; i < n; i++, at += strlen(one))
        memcpy(at, one, strlen(one));
    strcpy(at - 1, "]}");
    refused_len(CHAT, body, strlen(body), "messages", "at most 4096", "4097 messages");
    free(body);
}

static void invalid_completion(void)
{
    refused(COMPL, "{}", "prompt", "required");
    refused(COMPL, "{\"prompt\":null}", "prompt", "got null");
    refused(COMPL, "{\"prompt\":[\"a\",\"b\"]}", "prompt", "exactly one prompt");
    refused(COMPL, "{\"prompt\":[]}", "prompt", "exactly one prompt");
    refused(COMPL, "{\"prompt\":[1,2,3]}", "prompt", "token-id prompts are not supported");
    refused(COMPL, "{\"prompt\":[[1,2],[3]]}", "prompt", "token-id prompts are not supported");
    refused(COMPL, "{\"prompt\":[{}]}", "prompt[0]", "a string");
    refused(COMPL, COMPL_WITH("\"echo\":true"), "echo", "not supported");
    refused(COMPL, COMPL_WITH("\"echo\":\"yes\""), "echo", "a boolean");
    refused(COMPL, COMPL_WITH("\"suffix\":\"end\""), "suffix", "not supported");
    refused(COMPL, COMPL_WITH("\"best_of\":2"), "best_of", "not supported");
    refused(COMPL, COMPL_WITH("\"best_of\":1.5"), "best_of", "an integer");
    refused(COMPL, COMPL_WITH("\"logprobs\":5"), "logprobs", "not supported");
    refused(COMPL, COMPL_WITH("\"logprobs\":0"), "logprobs", "not supported");
}

static void invalid_common(void)
{
    static const struct {
        const char *extra, *param, *says;
    } cases[] = {
        {"\"model\":7", "model", "a string"},
        {"\"max_tokens\":0", "max_tokens", "[1, 2147483647]"},
        {"\"max_tokens\":-1", "max_tokens", "got -1"},
        {"\"max_tokens\":2147483648", "max_tokens", "got 2147483648"},
        {"\"max_tokens\":1.5", "max_tokens", "got 1.5"},
        {"\"max_tokens\":16.0", "max_tokens", "got 16.0"},
        {"\"max_tokens\":\"16\"", "max_tokens", "got \"16\""},
        {"\"max_completion_tokens\":0", "max_completion_tokens", "[1, 2147483647]"},
        {"\"max_tokens\":8,\"max_completion_tokens\":-3", "max_completion_tokens", "got -3"},
        {"\"temperature\":2.5", "temperature", "[0, 2]"},
        {"\"temperature\":-0.1", "temperature", "got -0.1"},
        {"\"temperature\":\"hot\"", "temperature", "a number"},
        {"\"top_p\":1.01", "top_p", "[0, 1]"},
        {"\"top_p\":-1", "top_p", "[0, 1]"},
        {"\"top_p\":true", "top_p", "got true"},
        {"\"seed\":1.5", "seed", "an integer"},
        {"\"seed\":\"1\"", "seed", "an integer"},
        {"\"stop\":5", "stop", "a string, an array of at most 4 strings"},
        {"\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]", "stop", "at most 4"},
        {"\"stop\":[\"a\",\"\"]", "stop[1]", "1 to 256 bytes"},
        {"\"stop\":[\"a\",7]", "stop[1]", "got 7"},
        {"\"stop\":\"\"", "stop", "1 to 256 bytes"},
        {"\"n\":2", "n", "only n = 1 is supported"},
        {"\"n\":0", "n", "only n = 1 is supported"},
        {"\"n\":\"1\"", "n", "only n = 1 is supported"},
        {"\"stream\":1", "stream", "a boolean"},
        {"\"stream_options\":{\"include_usage\":true}", "stream_options", "only allowed when"},
        {"\"stream\":false,\"stream_options\":{}", "stream_options", "only allowed when"},
        {"\"stream\":true,\"stream_options\":[]", "stream_options", "an object"},
        {"\"stream\":true,\"stream_options\":{\"include_usage\":1}", "stream_options.include_usage",
         "a boolean"},
        {"\"top_logprobs\":2", "top_logprobs", "not supported"},
        {"\"tools\":[{\"type\":\"function\"}]", "tools", "not supported"},
        {"\"tools\":{}", "tools", "an array"},
        {"\"functions\":[{\"name\":\"f\"}]", "functions", "not supported"},
        {"\"response_format\":{\"type\":\"json_object\"}", "response_format.type", "not supported"},
        {"\"response_format\":\"text\"", "response_format", "an object"},
        {"\"response_format\":{}", "response_format.type", "required"},
        {"\"presence_penalty\":0.5", "presence_penalty", "not supported"},
        {"\"frequency_penalty\":-1", "frequency_penalty", "not supported"},
        {"\"frequency_penalty\":\"0\"", "frequency_penalty", "a number"},
        {"\"logit_bias\":[]", "logit_bias", "an object mapping token ids"},
        {"\"ignore_eos\":\"true\"", "ignore_eos", "a boolean"},
        {"\"return_token_ids\":1", "return_token_ids", "a boolean"},
        {"\"session_id\":\"\"", "session_id", "1 to 128 bytes"},
        {"\"session_id\":\"a\\u0001b\"", "session_id", "without control characters"},
        {"\"session_id\":\"a\\u007fb\"", "session_id", "\"a\\x7fb\""},
        {"\"session_id\":3", "session_id", "got 3"},
        {"\"prompt_cache_key\":\"tab\\there\"", "prompt_cache_key", "\"tab\\x09here\""},
        {"\"prompt_cache_key\":\"\"", "prompt_cache_key", "1 to 128 bytes"},
        {"\"user\":[]", "user", "a string"},
    };
    char body[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body, CHAT_WITH("%s"), cases[i].extra);
        refused(CHAT, body, cases[i].param, cases[i].says);
        snprintf(body, sizeof body, COMPL_WITH("%s"), cases[i].extra);
        refused(COMPL, body, cases[i].param, cases[i].says);
    }

    /* Lengths just past the limits (and the limits themselves accepted). */
    char s[400];
    memset(s, 's', 257);
    s[257] = '\0';
    snprintf(body, sizeof body, CHAT_WITH("\"stop\":[\"%.256s\"]"), s);
    pv_api_request req;
    ok(good(CHAT, body, &req) && strlen(req.stops[0]) == 256, "a 256-byte stop string");
    pv_api_request_free(&req);
    snprintf(body, sizeof body, CHAT_WITH("\"stop\":[\"%s\"]"), s);
    refused(CHAT, body, "stop[0]", "(257 bytes)");
    snprintf(body, sizeof body, CHAT_WITH("\"session_id\":\"%.128s\""), s);
    ok(good(CHAT, body, &req) && strlen(req.session_id) == 128, "a 128-byte session id");
    pv_api_request_free(&req);
    snprintf(body, sizeof body, CHAT_WITH("\"session_id\":\"%.129s\""), s);
    refused(CHAT, body, "session_id", "(129 bytes)");
    snprintf(body, sizeof body, CHAT_WITH("\"user\":\"%.256s\""), s);
    ok(good(CHAT, body, &req) && strlen(req.user) == 256, "a 256-byte user");
    pv_api_request_free(&req);
    snprintf(body, sizeof body, CHAT_WITH("\"user\":\"%.257s\""), s);
    refused(CHAT, body, "user", "at most 256 bytes");
}

/* logit_bias: keys are token ids in plain decimal, byte by byte; values
 * numbers in [-100, 100]; at most max_logit_bias entries. */
static void logit_bias(void)
{
    pv_api_request req;
    ok(good(CHAT, CHAT_WITH("\"logit_bias\":{\"17\":-100,\"0\":2.5,\"2147483647\":100,\"9\":-0.25}"), &req),
       "a logit_bias of four entries parses");
    ok(req.sampling.n_bias == 4 && req.sampling.bias_tokens == req.bias_tokens &&
           req.sampling.bias_values == req.bias_values && req.bias_tokens[0] == 17 &&
           req.bias_values[0] == -100.0f && req.bias_tokens[1] == 0 && req.bias_values[1] == 2.5f &&
           req.bias_tokens[2] == INT32_MAX && req.bias_values[2] == 100.0f && req.bias_tokens[3] == 9 &&
           req.bias_values[3] == -0.25f,
       "its entries in the body's order, owned and pointed to by sampling (keys 0 and 2147483647, "
       "values -100 and 100 included)");
    pv_api_request_free(&req);
    ok(good(COMPL, COMPL_WITH("\"logit_bias\":null"), &req) && req.sampling.n_bias == 0 &&
           req.bias_tokens == NULL,
       "logit_bias null is no bias");
    pv_api_request_free(&req);
    ok(good(COMPL, COMPL_WITH("\"logit_bias\":{}"), &req) && req.sampling.n_bias == 0 &&
           req.sampling.bias_tokens == NULL,
       "logit_bias {} is no bias");
    pv_api_request_free(&req);

    static const struct {
        const char *extra, *says;
    } cases[] = {
        {"\"logit_bias\":\"x\"", "an object mapping token ids to numbers in [-100, 100], or null, got \"x\""},
        {"\"logit_bias\":[[1,-100]]", "an object mapping token ids"},
        {"\"logit_bias\":5", "an object mapping token ids"},
        {"\"logit_bias\":{\"-1\":1}", "key \"-1\" is not a token id"},
        {"\"logit_bias\":{\"+5\":1}", "key \"+5\" is not a token id"},
        {"\"logit_bias\":{\"01\":1}", "key \"01\" is not a token id"},
        {"\"logit_bias\":{\"00\":1}", "key \"00\" is not a token id"},
        {"\"logit_bias\":{\"1e3\":1}", "key \"1e3\" is not a token id"},
        {"\"logit_bias\":{\"5.0\":1}", "key \"5.0\" is not a token id"},
        {"\"logit_bias\":{\" 5\":1}", "key \" 5\" is not a token id"},
        {"\"logit_bias\":{\"5 \":1}", "key \"5 \" is not a token id"},
        {"\"logit_bias\":{\"\":1}", "key \"\" is not a token id"},
        {"\"logit_bias\":{\"0x10\":1}", "key \"0x10\" is not a token id"},
        {"\"logit_bias\":{\"\\u0661\":1}", "key \"\xd9\xa1\" is not a token id"},
        {"\"logit_bias\":{\"2147483648\":1}", "key \"2147483648\" is not a token id"},
        {"\"logit_bias\":{\"99999999999\":1}", "at most 2147483647"},
        {"\"logit_bias\":{\"18446744073709551621\":1}", "key \"18446744073709551621\" is not a token id"},
        {"\"logit_bias\":{\"5\":101}", "value for token 5 must be a number in [-100, 100], got 101"},
        {"\"logit_bias\":{\"5\":-100.5}", "value for token 5 must be a number in [-100, 100], got -100.5"},
        {"\"logit_bias\":{\"5\":100.000001}", "got 100.000001"},
        {"\"logit_bias\":{\"7\":\"x\"}", "value for token 7 must be a number in [-100, 100], got \"x\""},
        {"\"logit_bias\":{\"7\":null}", "got null"},
        {"\"logit_bias\":{\"7\":true}", "got true"},
        {"\"logit_bias\":{\"7\":[1]}", "got an array of 1 element"},
        {"\"logit_bias\":{\"1\":1,\"2\":1e308,\"3\":1}", "value for token 2"},
        {"\"logit_bias\":{\"1\":1,\"1\":2}", "duplicate"},
    };
    char body[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int dup = strcmp(cases[i].says, "duplicate") == 0; /* jansson's, for the whole body */
        snprintf(body, sizeof body, CHAT_WITH("%s"), cases[i].extra);
        refused(CHAT, body, dup ? NULL : "logit_bias", cases[i].says);
        snprintf(body, sizeof body, COMPL_WITH("%s"), cases[i].extra);
        refused(COMPL, body, dup ? NULL : "logit_bias", cases[i].says);
    }

    /* The entry limit: 1024 entries pass, 1025 do not, and a lower limit
     * holds. */
    const size_t max = PV_SAMPLING_MAX_BIAS + 1;
    char *big = malloc(max * 16 + 128), *at = big;
    at += sprintf(at, "{\"prompt\":\"p\",\"logit_bias\":{");
    for (size_t k = 0; k < max; k++)
        at += sprintf(at, "%s\"%zu\":-1", k ? "," : "", k);
    strcpy(at, "}}");
    refused_len(COMPL, big, strlen(big), "logit_bias", "holds 1025 entries: at most 1024 are accepted",
                "a logit_bias of 1025 entries");
    lim.max_logit_bias = PV_SAMPLING_MAX_BIAS + 10;
    refused_len(COMPL, big, strlen(big), "logit_bias", "at most 1024 are accepted",
                "a logit_bias of 1025 entries under a limit past the engine's: the engine's holds");
    lim.max_logit_bias = 3;
    refused(COMPL, COMPL_WITH("\"logit_bias\":{\"1\":1,\"2\":1,\"3\":1,\"4\":1}"), "logit_bias",
            "holds 4 entries: at most 3 are accepted");
    pv_api_limits_default(&lim);
    strcpy(strrchr(big, ','), "}}");
    ok(good(COMPL, big, &req) && req.sampling.n_bias == PV_SAMPLING_MAX_BIAS && req.bias_tokens[1023] == 1023,
       "a logit_bias of 1024 entries parses");
    pv_api_request_free(&req);
    free(big);
}

static void hostile_json(void)
{
    refused(CHAT, "", NULL, "not valid JSON");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}", NULL, "not valid JSON");
    refused(CHAT, "[1,2]", NULL, "must be a JSON object, got an array of 2 elements");
    refused(CHAT, "\"str\"", NULL, "not valid JSON");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", NULL,
            "not valid JSON");
    /* Named, not printed: the bytes would make the log binary. */
    const char *cut = "{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xc3\"}]}";
    refused_len(CHAT, cut, strlen(cut), NULL, "not valid JSON", "a UTF-8 sequence cut short");
    const char *surrogate = "{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}";
    refused_len(CHAT, surrogate, strlen(surrogate), NULL, "not valid JSON",
                "a surrogate encoded in UTF-8");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}", NULL,
            "not valid JSON");
    refused(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"content\":\"b\"}]}", NULL,
            "duplicate");
    refused(CHAT, CHAT_WITH("\"stop\":\"a\",\"stop\":\"b\""), NULL, "duplicate");
    refused(CHAT, CHAT_WITH("\"seed\":99999999999999999999"), NULL, "not valid JSON");
    refused(CHAT, CHAT_WITH("\"temperature\":1e999"), NULL, "not valid JSON");
    refused(CHAT, CHAT_WITH("} trailing"), NULL, "not valid JSON");
    static const char nul_body[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\0b\"}]}";
    refused_len(CHAT, nul_body, sizeof nul_body - 1, NULL, "not valid JSON", "a raw NUL byte");
    static const char nul_after[] = "{\"prompt\":\"a\"}\0{}";
    refused_len(COMPL, nul_after, sizeof nul_after - 1, NULL, "not valid JSON",
                "bytes after a NUL are not ignored");
    /* Not NUL-terminated: the parser reads len bytes only. */
    char exact[] = {'{', '"', 'p', 'r', 'o', 'm', 'p', 't', '"', ':', '"', 'x', '"', '}'};
    pv_api_request req;
    pv_api_error err;
    ok(pv_api_parse(COMPL, exact, sizeof exact, &lim, &req, &err) == PV_OK &&
           strcmp(req.prompt, "x") == 0,
       "a body without a terminating NUL");
    pv_api_request_free(&req);
    ok(pv_api_parse(COMPL, NULL, 0, NULL, &req, &err) == PV_ERR_INVALID_ARG && err.http_status == 400,
       "no body at all (and default limits)");

    /* 100k nested arrays: jansson's depth limit refuses them, no stack
     * overflow. */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 32);
    strcpy(deep, "{\"messages\":");
    size_t at = strlen(deep);
    memset(deep + at, '[', depth);
    memset(deep + at + depth, ']', depth);
    strcpy(deep + at + 2 * depth, "}");
    refused_len(CHAT, deep, strlen(deep), NULL, "not valid JSON", "100000 nested arrays");
    refused_len(CHAT, deep + at, depth, NULL, "not valid JSON", "100000 unclosed arrays");
    free(deep);

    /* A value quoted in a message is cut short and escaped; the message
     * stays valid UTF-8 (the JSON of it is checked below). */
    char body[256];
    snprintf(body, sizeof body, CHAT_WITH("\"session_id\":\"\\\"q\\\"\\n\\u00e9%s\""),
             "0123456789012345678901234567890123456789");
    refused(CHAT, body, "session_id", "\"\\\"q\\\"\\x0a\xc3\xa9");
    refused(CHAT, body, "session_id", "...\" (46 bytes)");
}

static void error_json(void)
{
    pv_api_error err;
    memset(&err, 0, sizeof err);
    ok(pv_api_fail(&err, 400, "invalid_request_error", "messages[2].role", NULL,
                   "'%s' is \"%s\" \x01 \n", "messages[2].role", "to\"ol") == PV_ERR_INVALID_ARG,
       "pv_api_fail: 400 is PV_ERR_INVALID_ARG");
    ok(strcmp(pv_last_error(), err.message) == 0, "and pv_last_error() holds the message");
    char *text = pv_api_error_json(&err);
    json_error_t je;
    json_t *j = text ? json_loads(text, 0, &je) : NULL;
    json_t *e = json_object_get(j, "error");
    ok(j && json_object_size(j) == 1 && json_object_size(e) == 4 &&
           strcmp(json_string_value(json_object_get(e, "message")), err.message) == 0 &&
           strcmp(json_string_value(json_object_get(e, "type")), "invalid_request_error") == 0 &&
           strcmp(json_string_value(json_object_get(e, "param")), "messages[2].role") == 0 &&
           json_is_null(json_object_get(e, "code")),
       "error JSON round-trips: %s", text ? text : "(null)");
    json_decref(j);
    free(text);

    ok(pv_api_fail(&err, 503, "server_error", NULL, "overloaded", "busy") == PV_ERR_STATE &&
           err.http_status == 503 && err.param[0] == '\0',
       "pv_api_fail: 5xx is PV_ERR_STATE");
    text = pv_api_error_json(&err);
    j = text ? json_loads(text, 0, &je) : NULL;
    e = json_object_get(j, "error");
    ok(j && json_is_null(json_object_get(e, "param")) &&
           strcmp(json_string_value(json_object_get(e, "code")), "overloaded") == 0 &&
           strcmp(json_string_value(json_object_get(e, "type")), "server_error") == 0,
       "null param, a code: %s", text ? text : "(null)");
    json_decref(j);
    free(text);

    /* A message cut mid-character and bytes that are not UTF-8 still give
     * JSON (the bad bytes become '?'). */
    char long_msg[600];
    memset(long_msg, 'a', sizeof long_msg);
    for (size_t i = 500; i + 1 < sizeof long_msg; i += 2)
        memcpy(long_msg + i, "\xc3\xa9", 2);
    long_msg[sizeof long_msg - 1] = '\0';
    pv_api_fail(&err, 400, NULL, NULL, NULL, "%s", long_msg);
    text = pv_api_error_json(&err);
    j = text ? json_loads(text, 0, &je) : NULL;
    e = json_object_get(j, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    ok(j && strlen(err.message) == sizeof err.message - 1 && m && strlen(m) == strlen(err.message) &&
           m[strlen(m) - 1] == '?' &&
           strcmp(json_string_value(json_object_get(e, "type")), "invalid_request_error") == 0,
       "a message cut mid-character still gives JSON, the cut byte as '?'");
    json_decref(j);
    free(text);
    pv_api_fail(&err, 400, NULL, NULL, NULL, "bad \xff byte");
    text = pv_api_error_json(&err);
    j = text ? json_loads(text, 0, &je) : NULL;
    e = json_object_get(j, "error");
    ok(j && strcmp(json_string_value(json_object_get(e, "message")), "bad ? byte") == 0,
       "a byte that is not UTF-8 becomes '?'");
    json_decref(j);
    free(text);

    /* Every refusal of the parser gives JSON that reads back. */
    pv_api_request req;
    parse(CHAT, CHAT_WITH("\"session_id\":\"\\\"\\u0001\xe6\x97\xa5\""), &req, &err);
    text = pv_api_error_json(&err);
    j = text ? json_loads(text, 0, &je) : NULL;
    e = json_object_get(j, "error");
    ok(j && strcmp(json_string_value(json_object_get(e, "message")), err.message) == 0 &&
           strcmp(json_string_value(json_object_get(e, "param")), "session_id") == 0,
       "a parser error as JSON: %s", text ? text : "(null)");
    json_decref(j);
    free(text);
}

int main(void)
{
    pv_api_limits_default(&lim);
    ok(lim.max_messages == 4096 && lim.max_stops == 4 && lim.max_stop_bytes == 256 &&
           lim.max_session_id_bytes == 128 && lim.max_logit_bias == PV_SAMPLING_MAX_BIAS,
       "default limits");
    valid_chat();
    valid_completion();
    invalid_messages();
    invalid_completion();
    invalid_common();
    logit_bias();
    hostile_json();
    error_json();
    return tap_done();
}
