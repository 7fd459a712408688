/* pv_gguf_release (models/gguf.c): a mapped file's tensor data leaves this
 * process's resident memory (the Rss of the mapping in /proc/self/smaps)
 * and reads back intact; an image in memory is left alone. A model load
 * (pv_llama_init) releases the file after each tensor it uploads, so the
 * file and its copy are not both resident: little of the file is left
 * resident once the model is loaded. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "tap.h"

#include <pensieve/gguf.h>
#include <pensieve/llama.h>

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { ROWS = 256, COLS = 1024 }; /* 1 MiB of f32 */

/* Resident kB of the mapping that holds addr; -1 if it cannot be read. */
static long mapping_rss_kb(const void *addr)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int inside = 0;
    long kb = -1;
    while (f && kb < 0 && fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2)
            inside = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
        else if (inside && sscanf(line, "Rss: %ld kB", &kb) == 1)
            break;
    }
    if (f)
        fclose(f);
    return kb;
}

static uint64_t checksum(const pv_gguf_tensor *t)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const uint8_t *p = t->data;
    for (uint64_t i = 0; i < t->n_bytes; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* pv_llama_init from a file: what stays resident of the mapping is far
 * less than its tensors. */
static void model_load_case(void)
{
    pv_synth_config c;
    pv_synth_config_default(&c);
    c.n_embd = 512;
    c.n_heads = 8;
    c.n_kv_heads = 4;
    c.n_ff = 1536;
    char path[] = "/tmp/pv-test-gguf-release-model-XXXXXX";
    int fd = mkstemp(path);
    pv_status st = fd < 0 ? pv_error(PV_ERR_IO, "mkstemp") : pv_synth_write(&c, path);
    if (fd >= 0)
        close(fd);
    pv_gguf g;
    int have_gguf = st == PV_OK && (st = pv_gguf_init(&g, path)) == PV_OK;
    pv_backend *be = NULL;
    pv_llama *m = NULL;
    pv_llama_options o;
    pv_llama_options_default(&o);
    if (st == PV_OK && (st = pv_backend_init(&be, "cpu", 0)) == PV_OK)
        st = pv_llama_init(&m, be, &g, &o);
    if (ok(st == PV_OK, "a %u-wide synthetic model loads from a file (%s)", c.n_embd,
           st == PV_OK ? "ok" : pv_last_error())) {
        uint64_t tensor_bytes = 0;
        for (uint64_t i = 0; i < g.n_tensors; i++)
            tensor_bytes += g.tensors[i].n_bytes;
        const long kb = mapping_rss_kb(g.tensors[0].data);
        ok(kb >= 0 && (uint64_t)kb * 1024 < tensor_bytes / 4,
           "after the load, %ld kB of the file's %" PRIu64 " kB of tensors stay resident", kb,
           tensor_bytes / 1024);
    }
    pv_llama_free(m);
    pv_backend_free(be);
    if (have_gguf)
        pv_gguf_free(&g);
    unlink(path);
}

int main(void)
{
    float *values = malloc(sizeof *values * ROWS * COLS);
    if (!values)
        return tap_skip_all("cannot allocate the tensor's values");
    for (int i = 0; i < ROWS * COLS; i++)
        values[i] = (float)(i % 977) * 0.25f;
    pv_gguf_writer w;
    const uint64_t ne[2] = {COLS, ROWS}, ne_small[1] = {8};
    char path[] = "/tmp/pv-test-gguf-release-XXXXXX";
    int fd = mkstemp(path);
    pv_status st = fd < 0 ? pv_error(PV_ERR_IO, "mkstemp") : pv_gguf_writer_init(&w, 3, 0);
    if (fd >= 0)
        close(fd);
    if (st == PV_OK) {
        st = pv_gguf_writer_add_tensor(&w, "small", PV_GGML_F32, 1, ne_small, values);
        if (st == PV_OK)
            st = pv_gguf_writer_add_tensor(&w, "big", PV_GGML_F32, 2, ne, values);
        if (st == PV_OK)
            st = pv_gguf_writer_write(&w, path);
        pv_gguf_writer_free(&w);
    }
    pv_gguf g;
    if (st == PV_OK)
        st = pv_gguf_init(&g, path);
    if (!ok(st == PV_OK, "a file with a 1 MiB tensor maps (%s)", st == PV_OK ? "ok" : pv_last_error())) {
        unlink(path);
        free(values);
        return tap_done();
    }
    const pv_gguf_tensor *big = pv_gguf_find_tensor(&g, "big");
    const uint64_t sum = checksum(big);
    const long before = mapping_rss_kb(big->data);
    if (before < 0) {
        tap_skip("no /proc/self/smaps to read the mapping's resident size from");
    } else {
        pv_gguf_release(&g);
        const long after = mapping_rss_kb(big->data);
        ok(before >= 1024 && after >= 0 && before - after >= 1020,
           "release: the mapping's resident size falls from %ld kB to %ld kB", before, after);
    }
    ok(checksum(big) == sum, "the released tensor reads back intact from the file");
    pv_gguf_free(&g);
    unlink(path);

    /* An image in memory: releasing must not touch it (MADV_DONTNEED on
     * anonymous memory would zero it). */
    uint8_t *image = NULL;
    uint64_t size = 0;
    st = pv_gguf_writer_init(&w, 3, 0);
    if (st == PV_OK) {
        st = pv_gguf_writer_add_tensor(&w, "big", PV_GGML_F32, 2, ne, values);
        if (st == PV_OK)
            st = pv_gguf_writer_to_memory(&w, &image, &size);
        pv_gguf_writer_free(&w);
    }
    if (ok(st == PV_OK && pv_gguf_init_memory(&g, image, size) == PV_OK, "an image in memory parses")) {
        big = pv_gguf_find_tensor(&g, "big");
        const uint64_t mem_sum = checksum(big);
        pv_gguf_release(&g);
        ok(checksum(big) == mem_sum && ((const float *)big->data)[COLS + 1] == values[COLS + 1],
           "release leaves a tensor of an image in memory as it was");
        pv_gguf_free(&g);
    }
    free(image);
    free(values);
    model_load_case();
    return tap_done();
}
