/* Run-time compilation of the portable kernels for the CUDA backend: NVRTC
 * turns a family's text (kernels/dialect.h, then kernels/<family>.cl, as
 * embedded in kernels/kernel-sources.c) and a parameter set
 * (backends/kernel-params.h) into a cubin for one GPU architecture, and an
 * on-disk cache keeps the result per source, options, NVRTC version and
 * target. Nothing here needs a GPU or the driver, so make check compiles
 * every kernel with it (tests/test-cuda-nvrtc.c). Not installed. */
#ifndef PV_BACKENDS_CUDA_NVRTC_H
#define PV_BACKENDS_CUDA_NVRTC_H

#include "backends/kernel-params.h"
#include "pensieve/status.h"

#include <stddef.h>
#include <stdint.h>

/* What NVRTC compiles for: machine code for SM `arch` (a cubin), or, for
 * a GPU newer than this NVRTC knows, PTX for the newest older architecture
 * it does know, which the driver compiles on load. */
typedef struct pv_cuda_target {
    int arch; /* 10 * major + minor: 80 is sm_80 */
    int ptx;
} pv_cuda_target;

/* A compiled program: a cubin, or PTX with its terminating NUL counted. */
typedef struct pv_cuda_image {
    void *data;
    size_t size;
} pv_cuda_image;

void pv_cuda_image_free(pv_cuda_image *image);

/* The target for a device of compute capability major.minor: its own arch
 * when NVRTC supports it, else PTX for the newest supported arch below it;
 * PV_ERR_UNSUPPORTED (naming NVRTC's list) for a GPU older than them all. */
pv_status pv_cuda_target_for(int major, int minor, pv_cuda_target *out);

/* The whole text NVRTC compiles for a family: the dialect, then the family,
 * each behind a #line naming its file so the log points into kernels/.
 * Free with free(). */
pv_status pv_cuda_family_source(pv_kernel_family family, char **out);

/* The NVRTC options of a build as one space-separated string: the
 * parameter set's -D defines, the target, -lineinfo. */
pv_status pv_cuda_build_options(const pv_kernel_params *params, pv_cuda_target target, char *buf, size_t size);

/* Compiles `source` (called `what` in messages) with `options` (split at
 * spaces) into *out. A failure is PV_ERR_BACKEND naming `what`, the
 * options and the first lines of NVRTC's log. */
pv_status pv_cuda_compile(const char *what, const char *source, const char *options, pv_cuda_target target,
                          pv_cuda_image *out);

/* pv_cuda_compile, and *log = NVRTC's log of a successful build (free()
 * it; NULL if empty): with --ptxas-options=-v, each kernel's registers,
 * stack frame and spills, which tests/test-cuda-nvrtc.c checks. */
pv_status pv_cuda_compile_logged(const char *what, const char *source, const char *options, pv_cuda_target target,
                                 pv_cuda_image *out, char **log);

/* ---- the on-disk cache ---------------------------------------------------------- */

/* The cache directory: $PV_CUDA_CACHE_DIR, else
 * ${XDG_CACHE_HOME:-$HOME/.cache}/pensieve/cuda (XDG_CACHE_HOME only if
 * absolute, as the XDG spec asks). Not created here. 0 if neither HOME nor
 * the others are set, or the path does not fit. */
int pv_cuda_cache_dir(char *buf, size_t size);

/* The cache key of a build: 64-bit FNV-1a over the source, the options,
 * NVRTC's version, the target and the file format's version. */
uint64_t pv_cuda_cache_key(const char *source, const char *options, pv_cuda_target target);

/* The entry's path in `dir`: <16 hex digits of key>.cubin or .ptx. */
int pv_cuda_cache_path(const char *dir, uint64_t key, pv_cuda_target target, char *buf, size_t size);

/* 1 and *out filled if `dir` holds a whole, intact entry for key; 0 for a
 * missing, unreadable, truncated or corrupt one (the caller recompiles and
 * overwrites it). Never an error. */
int pv_cuda_cache_load(const char *dir, uint64_t key, pv_cuda_target target, pv_cuda_image *out);

/* Writes the entry atomically (a temporary file renamed into place),
 * creating `dir` and its parents as needed. 1 on success, 0 if the cache
 * cannot be written: a cache that cannot be written only costs a later
 * recompile, so this is never an error either. */
int pv_cuda_cache_store(const char *dir, uint64_t key, pv_cuda_target target, const pv_cuda_image *image);

/* The image of a family under a parameter set for a target: from the cache
 * in `dir` (NULL: no cache) when present and intact, else compiled and
 * stored there. */
pv_status pv_cuda_program_image(const char *dir, const pv_kernel_params *params, pv_cuda_target target,
                                pv_cuda_image *out);

#endif
