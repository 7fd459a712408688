/* What the engine benchmarks (bench-engine, bench-share) share: integer
 * options checked against a range, and the model, tokenizer and backend
 * loaded from a GGUF file (scripts/get-model's by default). */
#ifndef PV_BENCH_LOAD_H
#define PV_BENCH_LOAD_H

#include <pensieve/backend.h>
#include <pensieve/gguf.h>
#include <pensieve/llama.h>
#include <pensieve/tokenizer.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* Prints "PROG: WHAT 'S' is not an integer in [LO, HI]" and returns -1 on a bad value. */
static inline int bench_parse_int(const char *prog, const char *s, const char *what, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || errno || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s '%s' is not an integer in [%d, %d]\n", prog, what, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Loads model (NULL: the default path) on backend with default options;
 * *what names the step that failed. */
static inline pv_status bench_load_model(const char *model, const char *backend, pv_tokenizer *tok,
                                         pv_backend **be, pv_llama **m, const char **what)
{
    static char path[4096];
    pv_status st = PV_OK;
    *what = "default model path";
    if (!model && (st = pv_default_model_path(path, sizeof path)) == PV_OK)
        model = path;
    if (st != PV_OK)
        return st;
    pv_gguf g;
    *what = model;
    if ((st = pv_gguf_init(&g, model)) != PV_OK)
        return st;
    pv_llama_options lo;
    pv_llama_options_default(&lo);
    *what = "setup";
    if ((st = pv_tokenizer_init(tok, &g)) == PV_OK && (st = pv_backend_init(be, backend, 0)) == PV_OK)
        st = pv_llama_init(m, *be, &g, &lo);
    pv_gguf_free(&g);
    return st;
}

#endif
