/* The real model's tokenizer (SmolLM2, scripts/get-model), for the tests
 * that check text against it: loaded into *tok with a passed check (1;
 * pv_tokenizer_free it), absent with a skip (0), or a failed check (-1). */
#ifndef PV_TESTS_REAL_TOKENIZER_H
#define PV_TESTS_REAL_TOKENIZER_H

#include <pensieve/gguf.h>
#include <pensieve/tokenizer.h>

#include "tap.h"

#include <unistd.h>

static inline int real_tokenizer_load(pv_tokenizer *tok)
{
    char path[4096];
    if (pv_default_model_path(path, sizeof path) != PV_OK || access(path, R_OK) != 0) {
        tap_skip("real model absent (%s): run scripts/get-model", path);
        return 0;
    }
    pv_gguf g;
    pv_status st = pv_gguf_init(&g, path);
    if (st == PV_OK) {
        st = pv_tokenizer_init(tok, &g);
        pv_gguf_free(&g); /* the tokenizer keeps its own copies */
    }
    return ok(st == PV_OK, "SmolLM2 tokenizer loads%s%s", st ? ": " : "", st ? pv_last_error() : "") ? 1 : -1;
}

#endif
