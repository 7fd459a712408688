/* The swap path, measured per backend (bench-kernels' swap section; issue
 * 27, "Swap path"):
 *   1. one layer's swap-in of N chunks (HOST -> DEVICE) and swap-out of N
 *      chunks (DEVICE -> HOST) three ways, alternating in the same run:
 *      one pv_slot_transfer of the N shuffled slots (what the engine
 *      does); N pv_copy_async calls, one a slot (what it did before);
 *      and one pv_copy_async of the same bytes laid out contiguously, the
 *      reference: on a GPU, a plain pinned cudaMemcpyAsync. Each is timed
 *      to the completion of its event; the host time of its calls and
 *      their number (launches + copies) are given apart.
 *   2. a layer-pipelined swap-in: L layers of N chunks, each layer's
 *      transfer on the copy queue, each layer's attention (a sequence
 *      whose context is those chunks) waiting for its own transfer only:
 *      the transfers alone, the attention alone, and both pipelined.
 *      Pipelined should take max(copy, compute) plus a layer, not the
 *      sum. Times are wall times to pv_backend_finish (one backend,
 *      one host thread: what CUDA events around the run would show). */
#ifndef PV_BENCH_SWAP_H
#define PV_BENCH_SWAP_H

#include <pensieve/backend.h>

#include <stdint.h>

typedef struct bench_swap_options {
    pv_dtype kv_dtype;
    int32_t n_heads, n_kv_heads, head_dim, chunk_tokens;
    int reps;
    int quick; /* small sizes: a dry run's */
} bench_swap_options;

#define BENCH_SWAP_SIZES 4

enum { BENCH_SWAP_IN = 0, BENCH_SWAP_OUT = 1 };

/* One size, both directions ([BENCH_SWAP_IN], [BENCH_SWAP_OUT]). */
typedef struct bench_swap_row {
    int32_t chunks; /* one layer's */
    double bytes;
    double transfer_ms[2], per_chunk_ms[2], plain_ms[2];         /* to completion */
    double transfer_issue_ms[2], per_chunk_issue_ms[2];          /* the host's calls alone */
    uint64_t transfer_calls[2], per_chunk_calls[2], plain_calls[2]; /* launches + copies */
} bench_swap_row;

typedef struct bench_swap_pipeline {
    int32_t layers, chunks, queries;
    double bytes; /* all layers */
    double copy_ms, compute_ms, pipelined_ms;
} bench_swap_pipeline;

typedef struct bench_swap_report {
    uint64_t slot_bytes;
    int reps;
    bench_swap_row rows[BENCH_SWAP_SIZES];
    int n_rows;
    bench_swap_pipeline pipeline;
} bench_swap_report;

pv_status bench_swap_run(pv_backend *be, const bench_swap_options *o, bench_swap_report *rep);
void bench_swap_print(const bench_swap_report *rep);
/* One JSON object. */
void bench_swap_json(const bench_swap_report *rep);

#endif
