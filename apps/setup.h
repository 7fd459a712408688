/* What the applications share: option values parsed with messages naming
 * the option, and the serving stack (backend, model, tokenizer, engine)
 * built from the common options. */
#ifndef PENSIEVE_APPS_SETUP_H
#define PENSIEVE_APPS_SETUP_H

#include <pensieve/backend.h>
#include <pensieve/cache.h>
#include <pensieve/engine.h>
#include <pensieve/llama.h>
#include <pensieve/tokenizer.h>

#include <stdint.h>

/* Each prints "PROG: OPT 'S' is not ..." and returns -1 on a bad value. */
int app_opt_long(const char *prog, const char *opt, const char *s, long lo, long hi, long *out);
int app_opt_float(const char *prog, const char *opt, const char *s, double lo, double hi, float *out);
/* Bytes with an optional K, M, G or T suffix (powers of 1024), as in the
 * cache's INI file; positive. */
int app_opt_size(const char *prog, const char *opt, const char *s, uint64_t *out);
/* --weights native|f32 */
int app_opt_weights(const char *prog, const char *s, pv_llama_weights *out);

typedef struct app_stack_options {
    const char *model, *backend, *config;
    const char *profile;               /* --profile: NULL looks in the default place */
    int synthetic;                     /* the tiny synthetic test model */
    uint32_t synthetic_n_ctx;          /* its context (0: 2048) */
    pv_engine_mode mode;
    pv_policy policy;
    int have_policy;                   /* --policy given: it overrides --config */
    uint64_t device_bytes, host_bytes; /* 0: from --config or the defaults */
    pv_dtype kv_dtype;
    pv_llama_weights weights;
    double idle_timeout_s;
    int no_prefix_sharing;             /* pv_engine_config.prefix_sharing = 0 (a comparison's baseline) */
    int decode_steps;                  /* pv_engine_config.decode_steps (0: the engine's choice) */
    pv_clock_fn clock;                 /* the engine's clock (NULL: monotonic), e.g. a virtual one */
    void *clock_ctx;
    const char *tune_hint;             /* how to get a profile, for the line saying there is none
                                        * (NULL: "pensieve-tune fits one") */
} app_stack_options;

/* The stack's own options, shared by the programs that build one: --model,
 * --synthetic, --backend, --mode, --policy, --device-mem, --host-mem,
 * --config, --profile, --decode-steps (name without the dashes; value NULL for
 * --synthetic). Returns 1 when name is one of them and its value is good,
 * -1 after printing why a value is bad, 0 when name is none of them. */
int app_stack_option(const char *prog, const char *name, const char *value, app_stack_options *o);
/* What holds across the stack's options once all are read (--model and
 * --synthetic exclude each other); prints why not and returns -1. */
int app_stack_options_check(const char *prog, const app_stack_options *o);

typedef struct app_stack {
    pv_backend *be;
    pv_llama *model;
    pv_tokenizer tok;
    int have_tok;
    pv_engine *engine;
    pv_policy policy;        /* in effect */
    char model_name[256];    /* the file's base name, or "the synthetic test model" */
    char model_id[256];      /* an id for APIs: the file name without .gguf, or "synthetic" */
} app_stack;

/* Cache settings (defaults, then the device's profile from pensieve-tune,
 * then --config, then the options; which profile and constants are used is
 * printed to stderr, or one line when the device has none), the model
 * (--model, --synthetic, or the file scripts/get-model installs), backend,
 * tokenizer and engine. Prints why not and returns -1; app_stack_free then
 * releases what was set up. */
int app_stack_init(app_stack *st, const app_stack_options *o, const char *prog);
/* A fresh engine over the same backend, model and tokenizer, its cache
 * settings read again (a profile written since takes effect). Every
 * session of the old engine is gone; no turn may be pending. Prints why
 * not and returns -1 (the stack then has no engine). */
int app_stack_restart_engine(app_stack *st, const app_stack_options *o, const char *prog);
void app_stack_free(app_stack *st);

/* SIGINT and SIGTERM to handler, which any thread may run (OpenBLAS's
 * start before main): it should only set a flag or write to a pipe. */
void app_catch_stop_signals(void (*handler)(int));

#endif
