/* pensieve-bench's in-process driver: runs a workload through an engine in
 * real time on the calling thread. Between iterations (pv_engine_step) it
 * submits every turn that is due, and sleeps until the next one when
 * nothing is running; a conversation's session is ended after its last
 * turn. In virtual time (bi_clock) nothing sleeps: the clock jumps to the
 * next turn due, and each iteration moves it by a cost model of the tokens
 * it forwarded, so a run is a function of the workload and the engine's
 * decisions alone, the same on any machine and under any load. Generated
 * turns are token ids (random ids of the vocabulary's middle, never an end
 * token; a first turn's preamble, wl_system_prompt_ids, in front),
 * answered with ignore_eos so every answer has the length the workload
 * drew; replayed turns are chat messages, the first one after the
 * conversation's system text (bi_turn_messages). */
#ifndef PV_BENCH_INPROC_H
#define PV_BENCH_INPROC_H

#include "bench/bench-run.h"
#include "bench/workload.h"

#include <pensieve/engine.h>

/* Virtual time: an iteration takes step_s plus token_s per token forwarded
 * (prompt, recomputed history and decode alike). The engine built for the
 * run reads it through bi_clock_read (app_stack_options.clock). */
typedef struct bi_clock {
    double now;
    double step_s, token_s;
} bi_clock;

double bi_clock_read(void *clock);

/* The token ids of generated turn `turn` of conversation c: on the first
 * turn the conversation's preamble (wl_system_prompt_ids of seed), then
 * input_tokens ids drawn from *rng (wl_token_id), into *ids (realloc'd,
 * kept on failure); *n gets their count. */
pv_status bi_prompt_ids(const wl_conversation *c, int32_t turn, uint64_t seed, uint32_t n_vocab, uint64_t *rng,
                        int32_t **ids, size_t *n);

/* The chat messages of replayed turn `turn` of conversation c (its text
 * not NULL) into msgs: on the first turn the conversation's system_text,
 * when it has one, as a system message, then the turn's text as the
 * user's. The session keeps them as its history, so a later turn sends
 * only its own message. Returns how many (1 or 2); they point into c. */
size_t bi_turn_messages(const wl_conversation *c, int32_t turn, pv_chat_message msgs[2]);

/* Runs w through engine (fresh: its statistics become out->counters);
 * clock NULL: real time, else the engine's virtual clock;
 * n_vocab bounds the generated ids, seed draws them (the workload's seed:
 * it also names the preambles), label names the
 * progress line. *out is filled (br_run_free releases it) also when a turn
 * fails; the status is not PV_OK only when the run itself could not go on
 * (out of memory, the engine refusing a submit or failing a step). */
pv_status bi_run(pv_engine *engine, bi_clock *clock, uint32_t n_vocab, const wl_workload *w, uint64_t seed,
                 const char *label, br_run *out);

#endif
