/* With no OpenCL platform (the ICD loader pointed at an empty vendor
 * directory), the OpenCL backend is a clear PV_ERR_NO_DEVICE that names the
 * backends still available, never a crash. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/backend.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>

int main(void)
{
#ifndef PV_HAVE_OPENCL
    return tap_skip_all("the OpenCL backend is not built");
#else
    /* ocl-icd reads this before it loads any vendor library. */
    if (setenv("OCL_ICD_VENDORS", "/nonexistent/pensieve-no-vendors", 1) != 0)
        return tap_skip_all("cannot set OCL_ICD_VENDORS");
    int count = -1;
    pv_status st = pv_backend_device_count("opencl", &count);
    ok(count == 0, "no platform: opencl counts %d devices (status %s)", count, pv_status_str(st));
    pv_backend *be = NULL;
    st = pv_backend_init(&be, "opencl", 0);
    ok(st == PV_ERR_NO_DEVICE && be == NULL, "pv_backend_init(\"opencl\") fails with no device: %s",
       pv_status_str(st));
    ok(strstr(pv_last_error(), "opencl") && strstr(pv_last_error(), "available: cpu"),
       "the message names the backend and the available ones: %s", pv_last_error());
    st = pv_backend_init(&be, "cpu", 0);
    ok(st == PV_OK, "the cpu backend still opens");
    pv_backend_free(be);
    return tap_done();
#endif
}
