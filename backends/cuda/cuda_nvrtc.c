/* NVRTC compilation of the portable kernels and the on-disk cache of its
 * output (backends/cuda/cuda_nvrtc.h). Uses NVRTC only: no driver, no GPU.
 *
 * A cache entry is one file, <key>.cubin or <key>.ptx, holding a header
 * (magic, key, payload size, FNV-1a of the payload) and the image. The
 * header makes a truncated or damaged file (a full disk, a crash between
 * write and rename on a filesystem that reorders them) a miss rather than
 * a bad image handed to the driver. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/cuda/cuda_nvrtc.h"
#include "kernels/kernel-sources.h"

#include <nvrtc.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bumped whenever the entry layout or what goes into the key changes. */
#define CACHE_FORMAT "pensieve cuda kernel cache 1"
static const char cache_magic[8] = {'P', 'V', 'K', 'I', 'M', 'G', '0', '1'};
#define CACHE_HEADER_BYTES 32
/* No program comes near this; a header claiming more is damaged. */
#define CACHE_MAX_IMAGE ((uint64_t)64 << 20)
/* Lines and characters of NVRTC's log kept in an error message. */
#define LOG_LINES 8
#define LOG_CHARS 560
/* The most options a build passes (defines, target, -lineinfo). */
#define MAX_OPTIONS 16

void pv_cuda_image_free(pv_cuda_image *image)
{
    free(image->data);
    image->data = NULL;
    image->size = 0;
}

/* ---- targets ---------------------------------------------------------------------- */

pv_status pv_cuda_target_for(int major, int minor, pv_cuda_target *out)
{
    const int arch = 10 * major + minor;
    int n = 0;
    nvrtcResult r = nvrtcGetNumSupportedArchs(&n);
    int *archs = r == NVRTC_SUCCESS && n > 0 ? malloc((size_t)n * sizeof *archs) : NULL;
    if (!archs)
        return pv_error(r == NVRTC_SUCCESS ? PV_ERR_OUT_OF_MEMORY : PV_ERR_BACKEND,
                        "cuda: cannot list NVRTC's architectures (%d of them): %s", n, nvrtcGetErrorString(r));
    r = nvrtcGetSupportedArchs(archs);
    if (r != NVRTC_SUCCESS) {
        free(archs);
        return pv_error(PV_ERR_BACKEND, "cuda: nvrtcGetSupportedArchs failed: %s", nvrtcGetErrorString(r));
    }
    int below = 0, exact = 0, oldest = archs[0], newest = archs[0];
    for (int i = 0; i < n; i++) {
        exact |= archs[i] == arch;
        if (archs[i] < arch && archs[i] > below)
            below = archs[i];
        oldest = archs[i] < oldest ? archs[i] : oldest;
        newest = archs[i] > newest ? archs[i] : newest;
    }
    free(archs);
    if (exact) {
        out->arch = arch;
        out->ptx = 0;
        return PV_OK;
    }
    if (below) { /* a GPU this NVRTC does not know: PTX, compiled by the driver */
        out->arch = below;
        out->ptx = 1;
        return PV_OK;
    }
    int v_major = 0, v_minor = 0;
    nvrtcVersion(&v_major, &v_minor);
    return pv_error(PV_ERR_UNSUPPORTED,
                    "cuda: NVRTC %d.%d cannot compile for the device's sm_%d: it supports sm_%d to sm_%d",
                    v_major, v_minor, arch, oldest, newest);
}

/* ---- sources and options ------------------------------------------------------------ */

pv_status pv_cuda_family_source(pv_kernel_family family, char **out)
{
    *out = NULL;
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(family);
    const char *text = pv_kernel_family_source(family);
    if (!spec || !text)
        return pv_error(PV_ERR_INVALID_ARG, "cuda: no kernel family %d", (int)family);
    /* The embedded family text keeps an empty line where it included the
     * dialect (kernels/local.mk), so its line numbers are the file's. */
    static const char dialect_line[] = "#line 1 \"kernels/dialect.h\"\n";
    char family_line[64];
    snprintf(family_line, sizeof family_line, "#line 1 \"kernels/%s.cl\"\n", spec->name);
    size_t size = strlen(dialect_line) + strlen(pv_kernel_source_dialect) + strlen(family_line) + strlen(text) + 1;
    char *source = malloc(size);
    if (!source)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cuda: cannot allocate %zu bytes of kernels/%s.cl source", size,
                        spec->name);
    snprintf(source, size, "%s%s%s%s", dialect_line, pv_kernel_source_dialect, family_line, text);
    *out = source;
    return PV_OK;
}

pv_status pv_cuda_build_options(const pv_kernel_params *params, pv_cuda_target target, char *buf, size_t size)
{
    int n = pv_kernel_params_defines(params, buf, size);
    if (n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, " --gpu-architecture=%s_%d -lineinfo",
                      target.ptx ? "compute" : "sm", target.arch);
    if (n < 0 || (size_t)n >= size)
        return pv_error(PV_ERR_INVALID_ARG, "cuda: the build options of kernels/%s.cl need %d bytes, more than %zu",
                        pv_kernel_family_spec_of(params->family)->name, n, size);
    return PV_OK;
}

/* ---- compiling ------------------------------------------------------------------------ */

/* The first LOG_LINES non-blank lines of `log`, joined by " | ", in `buf`. */
static void log_excerpt(const char *log, char *buf, size_t size)
{
    size_t at = 0;
    int lines = 0;
    buf[0] = '\0';
    for (const char *p = log; *p && lines < LOG_LINES && at + 1 < size;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        size_t blank = strspn(p, " \t\r");
        if (blank < len) {
            int n = snprintf(buf + at, size - at, "%s%.*s", lines ? " | " : "", (int)len, p);
            at = n < 0 ? size : at + (size_t)n;
            lines++;
        }
        p += len + (end ? 1 : 0);
    }
}

/* NVRTC's log of prog, or NULL if empty or out of memory. */
static char *program_log(nvrtcProgram prog)
{
    size_t size = 0;
    if (nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size <= 1)
        return NULL;
    char *log = malloc(size);
    if (log && nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS) {
        log[size - 1] = '\0';
        return log;
    }
    free(log);
    return NULL;
}

static pv_status compile_failure(const char *what, const char *options, nvrtcResult r, nvrtcProgram prog)
{
    char excerpt[LOG_CHARS] = "";
    char *log = program_log(prog);
    if (log)
        log_excerpt(log, excerpt, sizeof excerpt);
    free(log);
    return pv_error(r == NVRTC_ERROR_OUT_OF_MEMORY ? PV_ERR_OUT_OF_MEMORY : PV_ERR_BACKEND,
                    "cuda: NVRTC cannot compile %s with \"%s\": %s; log: %s", what, options,
                    nvrtcGetErrorString(r), excerpt[0] ? excerpt : "(empty)");
}

/* The compiled program's cubin or PTX into *out. */
static pv_status fetch_image(const char *what, const char *options, pv_cuda_target target, nvrtcProgram prog,
                             pv_cuda_image *out)
{
    const char *kind = target.ptx ? "PTX" : "cubin";
    size_t size = 0;
    nvrtcResult r = target.ptx ? nvrtcGetPTXSize(prog, &size) : nvrtcGetCUBINSize(prog, &size);
    if (r != NVRTC_SUCCESS || size == 0)
        return pv_error(PV_ERR_BACKEND, "cuda: NVRTC built %s with \"%s\" but gives %zu bytes of %s: %s", what,
                        options, size, kind, nvrtcGetErrorString(r));
    out->data = malloc(size);
    if (!out->data)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cuda: cannot allocate %zu bytes for the %s of %s", size, kind,
                        what);
    r = target.ptx ? nvrtcGetPTX(prog, out->data) : nvrtcGetCUBIN(prog, out->data);
    if (r != NVRTC_SUCCESS) {
        pv_cuda_image_free(out);
        return pv_error(PV_ERR_BACKEND, "cuda: cannot fetch the %s of %s built with \"%s\": %s", kind, what,
                        options, nvrtcGetErrorString(r));
    }
    out->size = size;
    return PV_OK;
}

pv_status pv_cuda_compile(const char *what, const char *source, const char *options, pv_cuda_target target,
                          pv_cuda_image *out)
{
    return pv_cuda_compile_logged(what, source, options, target, out, NULL);
}

pv_status pv_cuda_compile_logged(const char *what, const char *source, const char *options, pv_cuda_target target,
                                 pv_cuda_image *out, char **log)
{
    out->data = NULL;
    out->size = 0;
    if (log)
        *log = NULL;
    /* NVRTC takes the options as an argv: split a copy at the spaces. */
    char *copy = strdup(options);
    if (!copy)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cuda: cannot copy the options of %s", what);
    const char *argv[MAX_OPTIONS];
    int argc = 0;
    char *save = NULL;
    for (char *p = strtok_r(copy, " ", &save); p; p = strtok_r(NULL, " ", &save)) {
        if (argc == MAX_OPTIONS) {
            free(copy);
            return pv_error(PV_ERR_INVALID_ARG, "cuda: %s: more than %d NVRTC options in \"%s\"", what,
                            MAX_OPTIONS, options);
        }
        argv[argc++] = p;
    }

    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, source, what, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) {
        free(copy);
        return pv_error(r == NVRTC_ERROR_OUT_OF_MEMORY ? PV_ERR_OUT_OF_MEMORY : PV_ERR_BACKEND,
                        "cuda: nvrtcCreateProgram (%s) failed: %s", what, nvrtcGetErrorString(r));
    }
    r = nvrtcCompileProgram(prog, argc, argv);
    pv_status st = r == NVRTC_SUCCESS ? fetch_image(what, options, target, prog, out)
                                      : compile_failure(what, options, r, prog);
    if (st == PV_OK && log)
        *log = program_log(prog);
    nvrtcDestroyProgram(&prog);
    free(copy);
    return st;
}

/* ---- the cache ------------------------------------------------------------------------ */

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t fnv1a(uint64_t h, const void *data, size_t size)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < size; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

/* A string with its NUL, so "ab" + "c" and "a" + "bc" hash apart. */
static uint64_t fnv1a_str(uint64_t h, const char *s)
{
    return fnv1a(h, s, strlen(s) + 1);
}

int pv_cuda_cache_dir(char *buf, size_t size)
{
    const char *dir = getenv("PV_CUDA_CACHE_DIR");
    int n = -1;
    if (dir && *dir) {
        n = snprintf(buf, size, "%s", dir);
    } else {
        const char *xdg = getenv("XDG_CACHE_HOME");
        const char *home = getenv("HOME");
        if (xdg && xdg[0] == '/')
            n = snprintf(buf, size, "%s/pensieve/cuda", xdg);
        else if (home && *home)
            n = snprintf(buf, size, "%s/.cache/pensieve/cuda", home);
    }
    return n > 0 && (size_t)n < size;
}

uint64_t pv_cuda_cache_key(const char *source, const char *options, pv_cuda_target target)
{
    int major = -1, minor = -1;
    nvrtcVersion(&major, &minor);
    char detail[96];
    snprintf(detail, sizeof detail, "nvrtc %d.%d, %s_%d", major, minor, target.ptx ? "compute" : "sm",
             target.arch);
    uint64_t h = fnv1a_str(FNV_OFFSET, CACHE_FORMAT);
    h = fnv1a_str(h, source);
    h = fnv1a_str(h, options);
    return fnv1a_str(h, detail);
}

int pv_cuda_cache_path(const char *dir, uint64_t key, pv_cuda_target target, char *buf, size_t size)
{
    int n = snprintf(buf, size, "%s/%016" PRIx64 ".%s", dir, key, target.ptx ? "ptx" : "cubin");
    return n > 0 && (size_t)n < size;
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int pv_cuda_cache_load(const char *dir, uint64_t key, pv_cuda_target target, pv_cuda_image *out)
{
    out->data = NULL;
    out->size = 0;
    char path[4096];
    if (!pv_cuda_cache_path(dir, key, target, path, sizeof path))
        return 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    unsigned char header[CACHE_HEADER_BYTES];
    struct stat st;
    int ok = fstat(fileno(f), &st) == 0 && fread(header, 1, sizeof header, f) == sizeof header &&
             memcmp(header, cache_magic, sizeof cache_magic) == 0 && get_u64(header + 8) == key;
    const uint64_t size = ok ? get_u64(header + 16) : 0;
    ok = ok && size > 0 && size <= CACHE_MAX_IMAGE && (uint64_t)st.st_size == CACHE_HEADER_BYTES + size;
    unsigned char *data = ok ? malloc((size_t)size) : NULL;
    ok = data && fread(data, 1, (size_t)size, f) == size &&
         fnv1a(FNV_OFFSET, data, (size_t)size) == get_u64(header + 24);
    /* PTX is loaded as a C string. */
    ok = ok && (!target.ptx || data[size - 1] == '\0');
    fclose(f);
    if (!ok) {
        free(data);
        return 0;
    }
    out->data = data;
    out->size = (size_t)size;
    return 1;
}

/* mkdir -p, private to the user as the XDG spec asks of a directory it
 * creates. */
static int make_dirs(const char *dir)
{
    char path[4096];
    int n = snprintf(path, sizeof path, "%s", dir);
    if (n <= 0 || (size_t)n >= sizeof path)
        return 0;
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST)
            return 0;
        *p = '/';
    }
    return mkdir(path, 0700) == 0 || errno == EEXIST;
}

static int write_all(int fd, const void *data, size_t size)
{
    const char *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        p += n;
        size -= (size_t)n;
    }
    return 1;
}

int pv_cuda_cache_store(const char *dir, uint64_t key, pv_cuda_target target, const pv_cuda_image *image)
{
    char path[4096], tmp[4096 + 8];
    if (!image->data || !image->size || !pv_cuda_cache_path(dir, key, target, path, sizeof path) || !make_dirs(dir))
        return 0;
    snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    /* A temporary of our own, renamed over the entry: readers see the old
     * file or the whole new one, and concurrent writers never mix. */
    int fd = mkstemp(tmp);
    if (fd < 0)
        return 0;
    unsigned char header[CACHE_HEADER_BYTES];
    memcpy(header, cache_magic, sizeof cache_magic);
    put_u64(header + 8, key);
    put_u64(header + 16, image->size);
    put_u64(header + 24, fnv1a(FNV_OFFSET, image->data, image->size));
    int ok = write_all(fd, header, sizeof header) && write_all(fd, image->data, image->size);
    ok = close(fd) == 0 && ok;
    ok = ok && rename(tmp, path) == 0;
    if (!ok)
        unlink(tmp);
    return ok;
}

pv_status pv_cuda_program_image(const char *dir, const pv_kernel_params *params, pv_cuda_target target,
                                pv_cuda_image *out)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(params->family);
    char *source = NULL;
    pv_status st = pv_cuda_family_source(params->family, &source);
    if (st != PV_OK)
        return st;
    char options[256];
    st = pv_cuda_build_options(params, target, options, sizeof options);
    const uint64_t key = st == PV_OK ? pv_cuda_cache_key(source, options, target) : 0;
    if (st == PV_OK && !(dir && pv_cuda_cache_load(dir, key, target, out))) {
        char what[64];
        snprintf(what, sizeof what, "kernels/%s.cl", spec->name);
        st = pv_cuda_compile(what, source, options, target, out);
        if (st == PV_OK && dir)
            pv_cuda_cache_store(dir, key, target, out);
    }
    free(source);
    return st;
}
