/* The contract between libpensieve and a backend module: the OpenCL and
 * CUDA backends are shared objects, pensieve-<name>.so, that the registry
 * (backends/registry.c) opens with dlopen the first time the backend is
 * asked for. A module exports one symbol, the function below; everything
 * else in it is local to it. It calls back into libpensieve (pv_error, the
 * kernel tuning of backends/kernel-tuning.c, pv_dtype_size, ...), whose
 * symbols come from the library already loaded in the process, never from
 * a copy of its own: in a --disable-shared build the programs export them
 * (-export-dynamic, Makefile.am). Not installed. */
#ifndef PV_BACKENDS_BACKEND_MODULE_H
#define PV_BACKENDS_BACKEND_MODULE_H

#include "backends/backend.h"

/* The module's ops. The registry reads api_version first and uses nothing
 * else of a module built for another PV_BACKEND_API_VERSION. */
const pv_backend_ops *pv_backend_module_ops(void);

#define PV_BACKEND_MODULE_ENTRY "pv_backend_module_ops"
/* A module's file name: PV_BACKEND_MODULE_PREFIX <name> PV_BACKEND_MODULE_SUFFIX. */
#define PV_BACKEND_MODULE_PREFIX "pensieve-"
#define PV_BACKEND_MODULE_SUFFIX ".so"

#endif
