/* The backend registry. The CPU backend is built into libpensieve; the
 * OpenCL and CUDA backends are modules (backends/backend-module.h) opened
 * with dlopen the first time one is asked for, so a run that never asks
 * for them maps neither cuBLAS nor the OpenCL loader, and one build serves
 * machines with and without a GPU. Where modules are searched is laid
 * down in include/pensieve/backend.h (pv_backend_names). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/registry.h"
#include "backends/backend-module.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

extern const pv_backend_ops pv_cpu_backend_ops;

typedef struct entry {
    const char *name;
    const pv_backend_ops *ops; /* the CPU's; a module's once loaded (never unloaded) */
} entry;

/* A module is opened at most once, and lookups may come from any thread:
 * the table is read and written under `lock`. A module that fails to load
 * is searched for again at the next request. */
static entry registry[] = {
    {"cpu", &pv_cpu_backend_ops},
    {"opencl", NULL},
    {"cuda", NULL},
};
#define N_BACKENDS (sizeof registry / sizeof registry[0])
_Static_assert(N_BACKENDS <= PV_BACKENDS_MAX, "PV_BACKENDS_MAX (backends/registry.h) is too small");
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Room for why a module did not load: a path, the directories searched or
 * dlerror()'s text. */
#define WHY_SIZE (2 * PATH_MAX)

/* Appends `text` to the list in buf, after ", " unless it is the first. */
static void list_add(char *buf, size_t size, const char *text)
{
    size_t used = strlen(buf);
    snprintf(buf + used, size - used, "%s%s", used ? ", " : "", text);
}

/* The build tree's module directory when the code of libpensieve running
 * here was loaded from the build tree (its .libs, or, in a --disable-shared
 * build, a program there), else NULL: tests and uninstalled programs find
 * the modules they were built with, and an installed library never looks
 * into the tree it was built in. */
static const char *build_tree_dir(void)
{
    Dl_info info, program;
    char self[PATH_MAX], top[PATH_MAX];
    if (!dladdr((void *)build_tree_dir, &info) || !info.dli_fname || !realpath(PV_BUILD_DIR, top))
        return NULL;
    /* In a --disable-shared build this code is the program's, which glibc
     * names by its argv[0] (perhaps relative, or found on PATH): ask the
     * kernel instead. The program's headers lie in its first mapping. */
    int in_program = dladdr((void *)getauxval(AT_PHDR), &program) && program.dli_fbase == info.dli_fbase;
    if (!realpath(in_program ? "/proc/self/exe" : info.dli_fname, self))
        return NULL;
    size_t n = strlen(top);
    return strncmp(self, top, n) == 0 && self[n] == '/' ? PV_BUILD_DIR "/backends/.libs" : NULL;
}

/* 1 with path = dir/pensieve-<name>.so if that file exists; else 0, with
 * dir (its first n bytes) and its role added to `tried`. */
static int module_in(const char *dir, size_t n, const char *role, const char *name, char *path, size_t size,
                     char *tried, size_t tried_size)
{
    int len = snprintf(path, size, "%.*s/" PV_BACKEND_MODULE_PREFIX "%s" PV_BACKEND_MODULE_SUFFIX, (int)n, dir,
                       name);
    if (len > 0 && (size_t)len < size && access(path, F_OK) == 0)
        return 1;
    char item[PATH_MAX + 32];
    snprintf(item, sizeof item, "%.*s (%s)", (int)n, dir, role);
    list_add(tried, tried_size, item);
    return 0;
}

/* Finds backend `name`'s module file: each directory of $PV_BACKEND_PATH,
 * then (unless $PV_BACKEND_PATH_ONLY is set and not "0") the build tree's
 * when running from it, then the install directory. 1 with its path, or
 * 0 with the directories searched in `tried`. */
static int find_module(const char *name, char *path, size_t size, char *tried, size_t tried_size)
{
    tried[0] = '\0';
    const char *dirs = getenv("PV_BACKEND_PATH");
    for (const char *p = dirs; p && *p;) {
        size_t n = strcspn(p, ":");
        if (n > 0 && module_in(p, n, "PV_BACKEND_PATH", name, path, size, tried, tried_size))
            return 1;
        p += n + (p[n] == ':');
    }
    const char *only = getenv("PV_BACKEND_PATH_ONLY");
    if (only && only[0] && strcmp(only, "0") != 0) {
        list_add(tried, tried_size, "nothing else: PV_BACKEND_PATH_ONLY is set");
        return 0;
    }
    const char *build = build_tree_dir();
    if (build && module_in(build, strlen(build), "build tree", name, path, size, tried, tried_size))
        return 1;
    return module_in(PV_MODULE_DIR, strlen(PV_MODULE_DIR), "install", name, path, size, tried, tried_size);
}

/* Opens the module of e (lock held). On failure, the reason in why. */
static pv_status load_module(entry *e, char *why, size_t size)
{
    char path[PATH_MAX], tried[1024];
    if (!find_module(e->name, path, sizeof path, tried, sizeof tried)) {
        snprintf(why, size, "no module " PV_BACKEND_MODULE_PREFIX "%s" PV_BACKEND_MODULE_SUFFIX " in %s", e->name,
                 tried);
        return PV_ERR_NOT_FOUND;
    }
    /* RTLD_NOW: a symbol the module needs and cannot find is this error,
     * not a crash at its first call. */
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        snprintf(why, size, "cannot load %s: %s", path, dlerror());
        return PV_ERR_BACKEND;
    }
    const pv_backend_ops *(*module_ops)(void);
    *(void **)&module_ops = dlsym(handle, PV_BACKEND_MODULE_ENTRY);
    const pv_backend_ops *ops = module_ops ? module_ops() : NULL;
    pv_status st = PV_ERR_BACKEND;
    if (!module_ops)
        snprintf(why, size, "%s exports no " PV_BACKEND_MODULE_ENTRY "()", path);
    else if (!ops)
        snprintf(why, size, "%s: " PV_BACKEND_MODULE_ENTRY "() gives no backend", path);
    else if (ops->api_version != PV_BACKEND_API_VERSION) {
        snprintf(why, size, "%s has backend API version %d, this library expects %d", path, ops->api_version,
                 PV_BACKEND_API_VERSION);
        st = PV_ERR_UNSUPPORTED;
    } else if (!ops->name || strcmp(ops->name, e->name) != 0)
        snprintf(why, size, "%s holds backend '%s', not '%s'", path, ops->name ? ops->name : "(null)", e->name);
    else {
        e->ops = ops;
        return PV_OK;
    }
    dlclose(handle);
    return st;
}

size_t pv_backend_loadable(const char **names, const pv_backend_ops **ops)
{
    char why[WHY_SIZE];
    size_t n = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (registry[i].ops || load_module(&registry[i], why, sizeof why) == PV_OK) {
            names[n] = registry[i].name;
            if (ops)
                ops[n] = registry[i].ops;
            n++;
        }
    pthread_mutex_unlock(&lock);
    names[n] = NULL;
    return n;
}

const char *const *pv_backend_names(void)
{
    /* One list per thread: another thread's call may list more (a module
     * it found since) without rewriting the array this one iterates. */
    static _Thread_local const char *names[PV_BACKENDS_MAX + 1];
    pv_backend_loadable(names, NULL);
    return names;
}

pv_status pv_backend_lookup(const char *name, const pv_backend_ops **out)
{
    *out = NULL;
    entry *e = NULL;
    for (size_t i = 0; i < N_BACKENDS && name; i++)
        if (strcmp(registry[i].name, name) == 0)
            e = &registry[i];
    char why[WHY_SIZE] = "";
    pv_status st = PV_ERR_NOT_FOUND;
    if (e) {
        pthread_mutex_lock(&lock);
        st = e->ops ? PV_OK : load_module(e, why, sizeof why);
        *out = e->ops;
        pthread_mutex_unlock(&lock);
        if (st == PV_OK)
            return PV_OK;
    }
    const char *names[PV_BACKENDS_MAX + 1];
    char available[128] = "";
    pv_backend_loadable(names, NULL);
    for (const char *const *n = names; *n; n++)
        list_add(available, sizeof available, *n);
    if (!e)
        return pv_error(st, "backend '%s' is unknown; available: %s", name ? name : "(null)", available);
    return pv_error(st, "backend '%s' is unavailable: %s; available: %s", name, why, available);
}
