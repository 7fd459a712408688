/* pensieve-chat's parts: the options, the chat state shared by the
 * conversation loop (pensieve-chat.c) and the views of the engine it prints
 * (chat-view.c). */
#ifndef PENSIEVE_APPS_CHAT_H
#define PENSIEVE_APPS_CHAT_H

#include "apps/setup.h"

#include <stdint.h>

typedef struct chat_options {
    const char *model, *backend, *config, *profile, *script;
    int synthetic;
    pv_engine_mode mode;
    pv_policy policy;
    int have_policy;                  /* --policy given: it overrides --config */
    uint64_t device_bytes, host_bytes; /* 0: from --config or the defaults */
    pv_dtype kv_dtype;
    pv_llama_weights weights;
    int no_prefix_sharing;            /* sessions keep their own copy of a common prefix */
    int decode_steps;                 /* pv_engine_config.decode_steps (0: the engine's choice) */
    float temperature, top_p;
    uint64_t seed;
    int32_t max_tokens;
} chat_options;

typedef struct chat {
    const chat_options *o;
    app_stack_options stack_options;     /* from o */
    app_stack stack;                     /* backend, model, tokenizer, engine */
    char session[PV_SESSION_ID_MAX + 1]; /* the current conversation */
    unsigned next_name;                  /* for /new's chat-N names */
    uint64_t turns;                      /* submitted, for per-turn seeds */
    int color;                           /* stdout is a terminal */
    /* The turn in flight, filled by on_done. */
    int done;
    pv_status turn_status;
    char turn_error[512];
    pv_turn_result result;
} chat;

/* Backend, model, tokenizer and engine from the options; prints why not and
 * returns -1 (chat_free() then releases what was set up). */
int chat_init(chat *ch, const chat_options *o);
void chat_free(chat *ch);

/* Prints "pensieve-chat: WHAT: STATUS: MESSAGE" to stderr; returns -1. */
int chat_error(const char *what, pv_status st);

/* The line after an answer: where the turn's context came from, and speed. */
void chat_print_status(const chat *ch, const pv_turn_result *r);
/* /cache: a line per session (tokens, chunks, records per tier, a bar);
 * /cache NAME: the tier of every (chunk, layer) of one, a line per layer. */
int chat_print_cache(chat *ch, const char *only);
/* /stats: the engine's and the cache's counters. */
int chat_print_stats(chat *ch);
/* /tune (chat-tune.c): fits this device's profile, saves it where the
 * engine looks and uses it when no conversation has started. 0, -1 when it
 * failed, -2 when the chat has no engine left. */
int chat_tune(chat *ch);

#endif
