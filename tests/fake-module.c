/* A backend module that must not load (tests/test-backend-modules.c):
 * built as pensieve-cuda.so, its entry gives what $PV_TEST_FAKE_MODULE
 * asks for: "api" a backend of another API version, "name" one named
 * otherwise than its file, "none" no backend. */
#include "backends/backend-module.h"

#include <stdlib.h>
#include <string.h>

/* Reached only if the registry takes the module for a backend: a clean
 * "no device" then, not a call through a NULL pointer. */
static pv_status fake_device_count(int *count)
{
    *count = 0;
    return PV_OK;
}

static pv_backend_ops fake_ops = {.device_count = fake_device_count};

const pv_backend_ops *pv_backend_module_ops(void)
{
    const char *mode = getenv("PV_TEST_FAKE_MODULE");
    fake_ops.api_version = PV_BACKEND_API_VERSION;
    fake_ops.name = "cuda";
    if (!mode || strcmp(mode, "none") == 0)
        return NULL;
    if (strcmp(mode, "api") == 0)
        fake_ops.api_version = PV_BACKEND_API_VERSION - 1;
    else if (strcmp(mode, "name") == 0)
        fake_ops.name = "opencl";
    return &fake_ops;
}
