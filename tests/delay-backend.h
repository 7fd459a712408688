/* A test-only backend: the CPU backend with a real asynchronous copy queue
 * whose host->device copies take as long as the test says, and a timeline
 * that tells whether any compute op read bytes before the copy writing them
 * had landed. The engine's pipelining test uses it to show that layer L+1's
 * swap-in overlaps layer L's compute and that no attention runs ahead of
 * its chunks. Not part of the library.
 *
 * Queues. PV_QUEUE_COPY is one worker thread running copies and slot
 * transfers in submission order; a copy from a PV_MEM_HOST buffer to a
 * PV_MEM_DEVICE buffer sleeps h2d_delay_s before it moves its bytes, a
 * slot transfer between them h2d_delay_s a slot. Everything else (compute ops and
 * copies on PV_QUEUE_COMPUTE) runs on the calling thread before the call
 * returns, as on the CPU backend, so pv_queue_wait(be, PV_QUEUE_COMPUTE, ev)
 * blocks the caller until ev completes: that is what gates the next kernel.
 * pv_buffer_read/pv_buffer_write are ordered after compute only, never after
 * the copy queue (the backends' contract: reading a compute result does not
 * wait for swap traffic), so reading a copy's destination needs its event.
 *
 * Timeline. Every copy on the copy queue, and every slot of a transfer, is
 * recorded (destination buffer and byte range, enqueue and completion
 * times), and so is every attention call
 * (start time, kv_pool, the slots its queries read: for each sequence with a
 * query, chunks 0..max position / chunk_tokens) and every slot_scatter (start
 * time, the staging bytes it reads), so an engine that swaps in through a
 * staging buffer is checked as well as one copying straight into the pool.
 *
 * pv_backend_free() works on it too; buffers allocated from it dispatch
 * through it. */
#ifndef PV_TESTS_DELAY_BACKEND_H
#define PV_TESTS_DELAY_BACKEND_H

#include "backends/backend.h"

#include <stddef.h>
#include <stdint.h>

typedef struct pv_delay_options {
    double h2d_delay_s;       /* sleep before each host->device copy on PV_QUEUE_COPY */
    double attention_delay_s; /* extra sleep at the start of every attention call */
} pv_delay_options;

/* Opens the CPU backend underneath and wraps it; o may be NULL (no delays). */
pv_status pv_delay_backend_init(pv_backend **out, const pv_delay_options *o);
void pv_delay_backend_free(pv_backend *be);

/* PV_OK if no recorded read (attention slot, scatter staging range) overlaps
 * a copy that was enqueued before the read started and completed after it
 * (or has not completed yet). Otherwise PV_ERR_STATE, and msg (and
 * pv_last_error()) names the op and its call number, the slot or bytes, the
 * copy and the times in ms since init or the last reset. On success msg
 * gets a one-line summary. msg may be NULL when cap is 0. */
pv_status pv_delay_backend_check_order(pv_backend *be, char *msg, size_t cap);

/* Host->device copies, and slots of host->device transfers, issued on the
 * copy queue since init or reset. */
int64_t pv_delay_backend_delayed_copies(pv_backend *be);
/* Seconds the copy queue spent executing copies (delays included, time
 * waiting for events excluded). */
double pv_delay_backend_copy_busy_s(pv_backend *be);
int64_t pv_delay_backend_attention_calls(pv_backend *be);
/* Drains the copy queue, then takes o's delays (NULL: none) for what is
 * enqueued from here on. */
pv_status pv_delay_backend_set_delays(pv_backend *be, const pv_delay_options *o);
/* From now on, n more PV_MEM_HOST buffers are allocated and every later
 * one is refused with PV_ERR_OUT_OF_MEMORY (as a host out of pinned memory
 * refuses); n < 0 lifts the limit. */
void pv_delay_backend_limit_host_buffers(pv_backend *be, int64_t n);
/* PV_MEM_HOST buffers allocated since init. */
int64_t pv_delay_backend_host_buffers(pv_backend *be);
/* Drains the copy queue, then forgets the timeline and zeroes the counters;
 * times restart from here. */
void pv_delay_backend_reset(pv_backend *be);

#endif
