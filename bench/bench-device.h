/* The reference for a device's memory (issue 27): its own device-to-device
 * copy through the backend, measured in the same run as the kernels it is
 * compared with. On a GPU the host's STREAM says nothing about HBM; the
 * copy of a large buffer on the device is the honest ceiling for a kernel
 * that streams device memory (decode attention, quantized GEMV, gather).
 * Counted as STREAM counts copy: read + write, 2 x the bytes moved. */
#ifndef PV_BENCH_DEVICE_H
#define PV_BENCH_DEVICE_H

#include "bench-util.h"

#include <pensieve/backend.h>

#include <stdio.h>
#include <string.h>

typedef struct bench_device_copy {
    uint64_t bytes; /* each of the two buffers */
    int reps;
    bench_rate copy; /* GB/s, 2 x bytes per pass */
} bench_device_copy;

/* 1 GiB buffers (the "at least 1 GiB"), or an eighth of the
 * device's memory where it has less than 8 GiB, so both buffers fit beside
 * what the benchmark itself holds. */
static inline uint64_t bench_device_copy_bytes(const pv_backend *be)
{
    uint64_t bytes = (uint64_t)1 << 30, mem = be->info.global_mem_bytes;
    if (mem && mem / 8 < bytes)
        bytes = mem / 8;
    return bytes < ((uint64_t)64 << 20) ? (uint64_t)64 << 20 : bytes;
}

/* reps timed copies (at most 32) after one warm-up, each waited for with
 * pv_backend_finish. */
static inline pv_status bench_device_copy_measure(pv_backend *be, int reps, bench_device_copy *out)
{
    memset(out, 0, sizeof *out);
    out->bytes = bench_device_copy_bytes(be);
    out->reps = reps < 1 ? 1 : reps > 32 ? 32 : reps;
    pv_buffer *a = NULL, *b = NULL;
    pv_status st = pv_buffer_init(&a, be, PV_MEM_DEVICE, out->bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&b, be, PV_MEM_DEVICE, out->bytes);
    /* Written once, so the copies read real pages, not a lazily mapped zero page. */
    if (st == PV_OK) {
        size_t chunk = (size_t)16 << 20;
        void *fill = malloc(chunk);
        if (!fill)
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "bench: device copy fill of %zu bytes", chunk);
        else
            memset(fill, 0x5a, chunk);
        for (uint64_t off = 0; st == PV_OK && off < out->bytes; off += chunk) {
            uint64_t n = out->bytes - off < chunk ? out->bytes - off : chunk;
            if ((st = pv_buffer_write(a, off, fill, n)) == PV_OK)
                st = pv_buffer_write(b, off, fill, n);
        }
        free(fill);
    }
    double seconds[32];
    for (int i = -1; i < out->reps && st == PV_OK; i++) {
        double t0 = bench_now_s();
        st = pv_copy_async(PV_QUEUE_COMPUTE, i % 2 ? b : a, 0, i % 2 ? a : b, 0, out->bytes, NULL, NULL);
        if (st == PV_OK)
            st = pv_backend_finish(be);
        if (i >= 0)
            seconds[i] = bench_now_s() - t0;
    }
    if (st == PV_OK)
        bench_rate_of(&out->copy, seconds, out->reps, 2.0 * (double)out->bytes);
    pv_buffer_free(a);
    pv_buffer_free(b);
    return st;
}

/* Keeps the better of two measurements, as bench_stream_merge does. */
static inline void bench_device_copy_merge(bench_device_copy *into, const bench_device_copy *other)
{
    if (other->copy.best > into->copy.best)
        into->copy = other->copy;
}

static inline void bench_device_copy_print(const bench_device_copy *d)
{
    printf("device copy (the backend's own device-to-device copy of %.0f MiB, read + write counted, %d runs): "
           "best %.2f GB/s, median %.2f GB/s\n",
           (double)d->bytes / (1 << 20), d->reps, d->copy.best, d->copy.median);
}

static inline void bench_device_copy_json(const bench_device_copy *d)
{
    printf("{\"bytes\": %llu, \"reps\": %d, \"best_gbps\": %.3f, \"median_gbps\": %.3f}",
           (unsigned long long)d->bytes, d->reps, d->copy.best, d->copy.median);
}

#endif
