/* What a pensieve-bench driver records of each request it sends and of the
 * serving side's counters over a run, shared by the in-process driver
 * (pensieve-bench.c, through the engine) and the HTTP one (bench-http.c,
 * any OpenAI-compatible server), so both reports are computed the same way.
 * Bench-internal, hence the br_ prefix. */
#ifndef PV_BENCH_RUN_H
#define PV_BENCH_RUN_H

#include <stdint.h>

/* One request (one turn of a conversation). */
typedef struct br_record {
    double submit_s, first_s, end_s; /* since the run's start; first_s < 0: no token came */
    int32_t input_tokens;            /* the new message, as drawn (or counted, replayed), and a first
                                        turn's preamble */
    int32_t target_tokens;           /* max_tokens: the answer's drawn length */
    int32_t generated;               /* tokens the answer had */
    int failed;                      /* an error instead of an answer */
    /* The prompt as the server counted it (history + new message), and the
     * history tokens it did not prefill again (OpenAI's cached_tokens). */
    uint64_t prompt_tokens, cached_tokens;
    /* In process only (0 over HTTP): the history before the turn and where
     * it came from; reused_device + reused_host = cached_tokens. */
    uint64_t history_tokens, reused_device, reused_host, recomputed;
} br_record;

/* The serving side's counters over one run (after minus before): the
 * engine's statistics in process, pensieve-serve's /metrics over HTTP. */
typedef struct br_counters {
    int known; /* 0: not available (a server without pensieve's /metrics) */
    uint64_t turns_done, turns_failed;
    uint64_t prefill_tokens, recomputed_tokens, decode_tokens;
    uint64_t swap_in_chunks, swap_out_chunks, dropped_chunks; /* (chunk, layer) records */
    uint64_t suspensions;
} br_counters;

/* A run's raw results, filled by a driver. */
typedef struct br_run {
    br_record *records; /* in order of submission, n_records of them (malloc'd) */
    int64_t n_records;
    char first_error[256]; /* the first failed request's message, "" if none */
    br_counters counters;
    int interrupted; /* ended early (br_stopping): its records are partial */
} br_run;

void br_run_free(br_run *r); /* frees the records and zeroes *r; NULL: no-op */

/* When to stop: at a signal given to br_on_stop_signal (pensieve-bench
 * hands it SIGTERM and SIGINT: timeout(1), Ctrl-C), which only sets a
 * flag, or at a wall-clock time (bench_now_s(); --time-limit). The drivers
 * check br_stopping() between requests and end the run under way
 * (br_run.interrupted), so pensieve-bench still reports the runs that
 * finished before it. */
void br_on_stop_signal(int sig);
void br_stop_at(double now_s);
int br_stopping(void);
int br_stop_signal(void); /* the signal received, 0 if none */

/* A progress line on stderr when it is a terminal (at most a few times a
 * second; done == total ends the line): "label  done/total requests  Ns". */
void br_progress(const char *label, int64_t done, int64_t total, double elapsed_s);

#endif
