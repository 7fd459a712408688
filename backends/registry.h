/* The backend registry (backends/registry.c): the backends' names and
 * where their ops come from, for the front end (backends/backend.c). Not
 * installed. */
#ifndef PV_BACKENDS_REGISTRY_H
#define PV_BACKENDS_REGISTRY_H

#include "backends/backend.h"

#include <stddef.h>

/* *out = the ops of backend `name`: the CPU backend's, or its module's,
 * opened the first time it is asked for and kept open. On failure *out is
 * NULL and the message names the backend, why, and the backends that can
 * load here ("available: ..."): PV_ERR_NOT_FOUND for an unknown name or a module found in none
 * of the directories searched (it lists them), PV_ERR_BACKEND for a module
 * file that does not load (its path and dlerror()'s text),
 * PV_ERR_UNSUPPORTED for a module built for another API version. */
pv_status pv_backend_lookup(const char *name, const pv_backend_ops **out);

/* The most backends the registry knows. */
#define PV_BACKENDS_MAX 3

/* What pv_backend_names() lists, into the caller's arrays: names[0..n-1]
 * then NULL (names holds PV_BACKENDS_MAX + 1), and, if ops is non-NULL,
 * their ops. Returns n. */
size_t pv_backend_loadable(const char **names, const pv_backend_ops **ops);

#endif
