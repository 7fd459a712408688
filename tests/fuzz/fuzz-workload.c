/* libFuzzer target: pensieve-bench's JSONL conversation replay
 * (bench/workload.c, wl_load_jsonl) on arbitrary file contents, through a
 * memfd as fuzz-ini. A load either fails with a message naming the file,
 * or gives conversations the benchmark can run: at least one turn each,
 * lengths of at least one token, a system text exactly when it has
 * system tokens, no context (system text included) past the cap, think
 * times and arrivals finite, not negative and in order. */
#define _GNU_SOURCE /* memfd_create */
#include "fuzz-file.h"
#include "bench/workload.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

FUZZ_FILE_INITIALIZE("fuzz-workload")

/* Words, as a tokenizer would count them roughly: the callback's result
 * reaches the lengths. */
static int32_t count_words(void *ctx, const char *text)
{
    (void)ctx;
    int32_t n = 0;
    for (const char *p = text; *p; p++)
        n += (p == text || p[-1] == ' ') && *p != ' ';
    return n;
}

static void fail(const char *why, int32_t conv, int32_t turn)
{
    fprintf(stderr, "fuzz-workload: conversation %d turn %d: %s\n", conv, turn, why);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file_write(data, size);
    wl_options o;
    wl_options_default(&o);
    o.n_conversations = 0;
    o.context_cap = 64; /* small: the cap's cutting is reached often */
    wl_workload w;
    pv_status st = wl_load_jsonl(path, &o, count_words, NULL, &w);
    if (st != PV_OK) {
        if (!strstr(pv_last_error(), path)) {
            fprintf(stderr, "fuzz-workload: an error that does not name the file: %s\n", pv_last_error());
            abort();
        }
        if (w.n != 0 || w.conv)
            fail("a failed load left conversations", -1, -1);
        return 0;
    }
    double last_arrival = 0;
    for (int32_t i = 0; i < w.n; i++) {
        const wl_conversation *c = &w.conv[i];
        if (c->n_turns < 1 || !c->turns)
            fail("no turns", i, -1);
        if (!isfinite(c->arrival_s) || c->arrival_s < last_arrival)
            fail("arrival out of order", i, -1);
        last_arrival = c->arrival_s;
        if (!c->system_text != (c->system_tokens == 0) || c->system_tokens < 0)
            fail("system tokens without a system text, or the other way round", i, -1);
        int64_t context = c->system_tokens;
        for (int32_t t = 0; t < c->n_turns; t++) {
            const wl_turn *turn = &c->turns[t];
            if (turn->input_tokens < 1 || turn->output_tokens < 1)
                fail("a length under one token", i, t);
            if (!isfinite(turn->think_s) || turn->think_s < 0 || (t == 0 && turn->think_s != 0))
                fail("a think time out of range", i, t);
            if (!turn->text)
                fail("a replayed turn without its text", i, t);
            context += (int64_t)turn->input_tokens + turn->output_tokens;
        }
        if (context > o.context_cap)
            fail("context past the cap", i, -1);
    }
    wl_free(&w);
    return 0;
}
