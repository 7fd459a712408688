/* The backend modules (backends/registry.c). A CPU run, up to a forward
 * pass, maps neither a GPU runtime nor a module. A search that reaches no
 * module, a file that does not load and a module that is not the backend
 * asked for (tests/fake-module.c) each leave that backend unlisted by
 * pv_backend_names() and fail its init with a message that says why. The
 * modules built here are found in the build tree, listed and opened, and
 * then mapped, which shows that the mapping check sees them. One process,
 * in this order: the CPU part must come before anything loads a module. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "tap.h"

#include <pensieve/backend.h>
#include <pensieve/gguf.h>
#include <pensieve/llama.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What a run that never asks for OpenCL or CUDA must not map. */
static const char *const gpu_files[] = {
    "libcudart", "libcublas", "libnvrtc", "/libcuda.so", "libOpenCL", "libclblast",
    "/pensieve-opencl.so", "/pensieve-cuda.so",
};

/* 1 with the first mapped file of this process that names one of
 * gpu_files in buf; 0 if there is none. */
static int gpu_mapping(char *buf, size_t size)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        for (size_t i = 0; i < sizeof gpu_files / sizeof gpu_files[0] && !found; i++) {
            const char *path = strchr(line, '/');
            if (path && strstr(path, gpu_files[i])) {
                snprintf(buf, size, "%.*s", (int)strcspn(path, "\n"), path);
                found = 1;
            }
        }
    if (f)
        fclose(f);
    return found;
}

/* pv_backend_names() joined with spaces. */
static const char *names_text(void)
{
    static char text[256];
    text[0] = '\0';
    for (const char *const *n = pv_backend_names(); *n; n++)
        snprintf(text + strlen(text), sizeof text - strlen(text), "%s%s", text[0] ? " " : "", *n);
    return text;
}

static int listed(const char *name)
{
    for (const char *const *n = pv_backend_names(); *n; n++)
        if (strcmp(*n, name) == 0)
            return 1;
    return 0;
}

/* pv_backend_init("cpu") and one forward pass of the synthetic model: 4
 * tokens of one sequence, logits of the last. */
static pv_status cpu_forward(void)
{
    enum { N = 4 };
    pv_synth_config c;
    pv_synth_config_default(&c);
    uint8_t *image = NULL;
    uint64_t size = 0;
    pv_gguf g;
    int have_gguf = 0;
    pv_backend *be = NULL;
    pv_llama *m = NULL;
    pv_buffer *pool = NULL;
    int32_t *tables = NULL;
    float *logits = NULL;
    pv_llama_options o;
    pv_llama_options_default(&o);
    pv_status st = pv_synth_to_memory(&c, &image, &size);
    if (st == PV_OK && (st = pv_gguf_init_memory(&g, image, size)) == PV_OK)
        have_gguf = 1;
    if (st == PV_OK && (st = pv_backend_init(&be, "cpu", 0)) == PV_OK)
        st = pv_llama_init(&m, be, &g, &o);
    if (st == PV_OK) {
        const pv_llama_hparams *hp = pv_llama_hparams_of(m);
        st = pv_buffer_init(&pool, be, PV_MEM_DEVICE, hp->n_layers * pv_llama_slot_bytes(m));
        tables = malloc(sizeof *tables * hp->n_layers);
        logits = malloc(sizeof *logits * hp->n_vocab);
        if (st == PV_OK && (!tables || !logits))
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "test: slot tables and logits");
        for (uint32_t l = 0; st == PV_OK && l < hp->n_layers; l++)
            tables[l] = (int32_t)l; /* one sequence, one chunk a layer */
        const int32_t tokens[N] = {1, 2, 3, 4}, seq[N] = {0, 0, 0, 0}, pos[N] = {0, 1, 2, 3}, last = N - 1;
        pv_llama_batch b = {
            .n_tokens = N, .tokens = tokens, .token_seq = seq, .token_pos = pos, .n_seqs = 1,
            .max_chunks = 1, .slot_tables = tables, .kv_pool = pool, .n_slots = hp->n_layers,
            .n_logits = 1, .logit_rows = &last, .logits = logits,
        };
        if (st == PV_OK)
            st = pv_llama_forward(m, &b);
    }
    free(logits);
    free(tables);
    pv_buffer_free(pool);
    pv_llama_free(m);
    pv_backend_free(be);
    if (have_gguf)
        pv_gguf_free(&g);
    free(image);
    return st;
}

static int says(const char *text)
{
    return strstr(pv_last_error(), text) != NULL;
}

/* The fake module's cases: what it gives, the status and words expected. */
static void fake_module_cases(const char *dir)
{
    static const struct {
        const char *mode, *what;
        pv_status status;
        const char *words;
    } cases[] = {
        {"api", "is built for another API version", PV_ERR_UNSUPPORTED, "has backend API version"},
        {"name", "holds another backend", PV_ERR_BACKEND, "holds backend 'opencl', not 'cuda'"},
        {"none", "gives no backend", PV_ERR_BACKEND, "gives no backend"},
    };
    char path[4096];
    snprintf(path, sizeof path, "%s/pensieve-cuda.so", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("PV_TEST_FAKE_MODULE", cases[i].mode, 1);
        pv_backend *be = NULL;
        pv_status st = pv_backend_init(&be, "cuda", 0);
        ok(st == cases[i].status && !be && says(path) && says(cases[i].words) && !listed("cuda"),
           "a module that %s: '%s', unlisted: %s", cases[i].what, pv_status_str(st), pv_last_error());
    }
    unsetenv("PV_TEST_FAKE_MODULE");
}

int main(void)
{
    char mapped[4096];
    if (access("/proc/self/maps", R_OK) != 0)
        return tap_skip_all("no /proc/self/maps to read the mappings from");

    pv_status st = cpu_forward();
    ok(st == PV_OK, "cpu: init and a forward pass of the synthetic model (%s)",
       st == PV_OK ? "ok" : pv_last_error());
    int gpu = gpu_mapping(mapped, sizeof mapped);
    ok(!gpu, "the CPU run maps no GPU runtime and no module%s%s", gpu ? ": " : "", gpu ? mapped : "");

    /* Only an empty directory in reach. */
    char empty[] = "/tmp/pv-test-modules-XXXXXX";
    if (!mkdtemp(empty))
        return tap_skip_all("cannot create a directory under /tmp");
    setenv("PV_BACKEND_PATH", empty, 1);
    setenv("PV_BACKEND_PATH_ONLY", "1", 1);
    ok(strcmp(names_text(), "cpu") == 0, "no module in reach: pv_backend_names() lists '%s'", names_text());
    pv_backend *be = NULL;
    st = pv_backend_init(&be, "opencl", 0);
    ok(st == PV_ERR_NOT_FOUND && !be && says("backend 'opencl' is unavailable") && says("pensieve-opencl.so") &&
           says(empty) && says("PV_BACKEND_PATH_ONLY") && says("available: cpu"),
       "opencl without its module: '%s': %s", pv_status_str(st), pv_last_error());
    int count = -1;
    st = pv_backend_device_count("cuda", &count);
    ok(st == PV_ERR_NOT_FOUND && count == 0 && says("pensieve-cuda.so"),
       "cuda without its module counts no device: '%s': %s", pv_status_str(st), pv_last_error());

    /* A file in the module's place that is no shared object. */
    char bogus[4096];
    snprintf(bogus, sizeof bogus, "%s/pensieve-opencl.so", empty);
    FILE *f = fopen(bogus, "w");
    for (int i = 0; f && i < 16; i++)
        fputs("not a shared object\n", f);
    if (f)
        fclose(f);
    st = pv_backend_init(&be, "opencl", 0);
    ok(st == PV_ERR_BACKEND && !be && says("cannot load") && says(bogus) && says("ELF") && !listed("opencl"),
       "a module that does not load: '%s', unlisted, with the path and dlerror(): %s", pv_status_str(st),
       pv_last_error());
    unlink(bogus);
    rmdir(empty);

    /* PV_BACKEND_PATH first: its fake pensieve-cuda.so is found before the
     * build tree's real one (in a build with CUDA). */
    unsetenv("PV_BACKEND_PATH_ONLY");
    setenv("PV_BACKEND_PATH", PV_TEST_FAKE_MODULE_DIR, 1);
    fake_module_cases(PV_TEST_FAKE_MODULE_DIR);

    /* The modules of this build, from the build tree. */
    unsetenv("PV_BACKEND_PATH");
    const char *const built[] = {
#ifdef PV_HAVE_OPENCL
        "opencl",
#endif
#ifdef PV_HAVE_CUDA
        "cuda",
#endif
        NULL,
    };
    size_t n_built = 0;
    for (size_t i = 0; built[i]; i++, n_built++) {
        ok(listed(built[i]), "pv_backend_names() lists the %s module built here: '%s'", built[i], names_text());
        st = pv_backend_init(&be, built[i], 0);
        ok(st == PV_OK || st == PV_ERR_NO_DEVICE, "%s opens, or has no device: %s", built[i],
           st == PV_OK ? "ok" : pv_last_error());
        /* The module's pv_error is the process's one: its messages reach
         * this thread's pv_last_error(), where a copy of libpensieve's
         * state in the module would keep them. */
        if (st == PV_OK) {
            pv_buffer *huge = NULL;
            pv_clear_error();
            st = pv_buffer_init(&huge, be, PV_MEM_DEVICE, UINT64_C(1) << 62);
            ok(st != PV_OK && !huge && says(built[i]), "%s: a failed allocation in the module says so: %s",
               built[i], pv_last_error());
        } else if (strcmp(built[i], "cuda") == 0) {
            ok(says("cudaGetDeviceCount"), "cuda: the module's reason reaches pv_last_error(): %s",
               pv_last_error());
        }
        pv_backend_free(be);
        be = NULL;
    }
    if (n_built) {
        gpu = gpu_mapping(mapped, sizeof mapped);
        ok(gpu, "with a module loaded, the mapping check sees it: %s", gpu ? mapped : "nothing");
    }
    else
        tap_skip("no OpenCL or CUDA module in this build");
    return tap_done();
}
