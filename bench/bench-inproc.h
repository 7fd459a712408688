/* pensieve-bench's in-process driver: runs a workload through an engine in
 * real time on the calling thread. Between iterations (pv_engine_step) it
 * submits every turn that is due, and sleeps until the next one when
 * nothing is running; a conversation's session is ended after its last
 * turn. Generated turns are token ids (random ids of the vocabulary's
 * middle, never an end token), answered with ignore_eos so every answer has
 * the length the workload drew; replayed turns are chat messages. */
#ifndef PV_BENCH_INPROC_H
#define PV_BENCH_INPROC_H

#include "bench/bench-run.h"
#include "bench/workload.h"

#include <pensieve/engine.h>

/* Runs w through engine (fresh: its statistics become out->counters);
 * n_vocab bounds the generated ids, seed draws them, label names the
 * progress line. *out is filled (br_run_free releases it) also when a turn
 * fails; the status is not PV_OK only when the run itself could not go on
 * (out of memory, the engine refusing a submit or failing a step). */
pv_status bi_run(pv_engine *engine, uint32_t n_vocab, const wl_workload *w, uint64_t seed, const char *label,
                 br_run *out);

#endif
