/* The OpenCL backend: devices through the ICD loader (every platform, one
 * flat device index), a context with two in-order queues (compute, copy)
 * ordered only by events (the contract of backend.h) and a third that
 * releases freed host buffers, buffers, copies and events, GEMM through
 * CLBlast. The kernels are the
 * portable ones of kernels/, built at run time (opencl-kernels.c).
 *
 * Host buffers (PV_MEM_HOST) are CL_MEM_ALLOC_HOST_PTR buffers mapped once
 * for their lifetime, so host_ptr is valid and the memory is pinned where
 * the driver can. Copies between such a buffer and a device buffer go
 * through clEnqueueRead/WriteBuffer on host_ptr, the pinned-transfer path
 * that also keeps the mapped object itself out of the transfer. */
#include "config.h"

#include "backends/opencl/opencl.h"
#include "backends/backend-module.h"
#include "backends/kernel-params.h"
#include "backends/attention-split.h"

#include <pensieve/half.h>

#include <clblast_c.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *pv_opencl_error_name(cl_int err)
{
    switch (err) {
    case CL_SUCCESS: return "CL_SUCCESS";
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
    case CL_COMPILER_NOT_AVAILABLE: return "CL_COMPILER_NOT_AVAILABLE";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_MEM_COPY_OVERLAP: return "CL_MEM_COPY_OVERLAP";
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_MAP_FAILURE: return "CL_MAP_FAILURE";
    case CL_MISALIGNED_SUB_BUFFER_OFFSET: return "CL_MISALIGNED_SUB_BUFFER_OFFSET";
    case CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST: return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_DEVICE_TYPE: return "CL_INVALID_DEVICE_TYPE";
    case CL_INVALID_PLATFORM: return "CL_INVALID_PLATFORM";
    case CL_INVALID_DEVICE: return "CL_INVALID_DEVICE";
    case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
    case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_BUILD_OPTIONS: return "CL_INVALID_BUILD_OPTIONS";
    case CL_INVALID_PROGRAM: return "CL_INVALID_PROGRAM";
    case CL_INVALID_PROGRAM_EXECUTABLE: return "CL_INVALID_PROGRAM_EXECUTABLE";
    case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
    case CL_INVALID_KERNEL: return "CL_INVALID_KERNEL";
    case CL_INVALID_ARG_INDEX: return "CL_INVALID_ARG_INDEX";
    case CL_INVALID_ARG_VALUE: return "CL_INVALID_ARG_VALUE";
    case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
    case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
    case CL_INVALID_WORK_DIMENSION: return "CL_INVALID_WORK_DIMENSION";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_WORK_ITEM_SIZE: return "CL_INVALID_WORK_ITEM_SIZE";
    case CL_INVALID_GLOBAL_OFFSET: return "CL_INVALID_GLOBAL_OFFSET";
    case CL_INVALID_EVENT_WAIT_LIST: return "CL_INVALID_EVENT_WAIT_LIST";
    case CL_INVALID_EVENT: return "CL_INVALID_EVENT";
    case CL_INVALID_OPERATION: return "CL_INVALID_OPERATION";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_INVALID_GLOBAL_WORK_SIZE: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    }
    return "unknown OpenCL error";
}

pv_status pv_opencl_fail(const char *what, const char *call, cl_int err)
{
    pv_status status = PV_ERR_BACKEND;
    if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_HOST_MEMORY ||
        err == CL_INVALID_BUFFER_SIZE)
        status = PV_ERR_OUT_OF_MEMORY;
    return pv_error(status, "opencl %s: %s failed: %s (%d)", what, call, pv_opencl_error_name(err), (int)err);
}

/* ---- devices ---------------------------------------------------------------- */

/* The ICD loader's answer when no platform (no ICD) is installed. */
#define PV_CL_PLATFORM_NOT_FOUND_KHR (-1001)

/* Calls visit(platform, device, flat index, ctx) for every device of every
 * platform until it returns nonzero; *count gets the number visited. */
static pv_status enumerate_devices(int *count,
                                   int (*visit)(cl_platform_id, cl_device_id, int, void *),
                                   void *ctx)
{
    *count = 0;
    cl_uint n_platforms = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &n_platforms);
    if (err == PV_CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && n_platforms == 0))
        return PV_OK;
    if (err != CL_SUCCESS)
        return pv_opencl_fail("device enumeration", "clGetPlatformIDs", err);
    cl_platform_id *platforms = malloc(n_platforms * sizeof *platforms);
    if (!platforms)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "opencl: cannot list %u platforms", n_platforms);
    err = clGetPlatformIDs(n_platforms, platforms, NULL);
    if (err != CL_SUCCESS) {
        free(platforms);
        return pv_opencl_fail("device enumeration", "clGetPlatformIDs", err);
    }
    pv_status st = PV_OK;
    int stop = 0;
    for (cl_uint p = 0; p < n_platforms && !stop; p++) {
        cl_uint n_devices = 0;
        err = clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 0, NULL, &n_devices);
        if (err == CL_DEVICE_NOT_FOUND || n_devices == 0)
            continue; /* a platform without devices is not an error */
        if (err != CL_SUCCESS) {
            st = pv_opencl_fail("device enumeration", "clGetDeviceIDs", err);
            break;
        }
        cl_device_id *devices = malloc(n_devices * sizeof *devices);
        if (!devices) {
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "opencl: cannot list %u devices", n_devices);
            break;
        }
        err = clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, n_devices, devices, NULL);
        if (err != CL_SUCCESS) {
            free(devices);
            st = pv_opencl_fail("device enumeration", "clGetDeviceIDs", err);
            break;
        }
        for (cl_uint d = 0; d < n_devices && !stop; d++) {
            if (visit)
                stop = visit(platforms[p], devices[d], *count, ctx);
            if (!stop)
                (*count)++;
        }
        free(devices);
    }
    free(platforms);
    return st;
}

typedef struct device_query {
    int index;
    cl_platform_id platform;
    cl_device_id device;
} device_query;

static int visit_find(cl_platform_id platform, cl_device_id device, int index, void *ctx)
{
    device_query *query = ctx;
    if (index != query->index)
        return 0;
    query->platform = platform;
    query->device = device;
    return 1;
}

pv_status pv_opencl_find_device(int index, cl_platform_id *platform, cl_device_id *device)
{
    device_query query = {index, NULL, NULL};
    int count = 0;
    pv_status st = enumerate_devices(&count, visit_find, &query);
    if (st != PV_OK)
        return st;
    if (!query.device) {
        if (count == 0)
            return pv_error(PV_ERR_NO_DEVICE, "opencl: no OpenCL platform or device found");
        return pv_error(PV_ERR_INVALID_ARG, "opencl: device %d out of range [0, %d)", index, count);
    }
    *platform = query.platform;
    *device = query.device;
    return PV_OK;
}

static pv_status opencl_device_count(int *count)
{
    return enumerate_devices(count, NULL, NULL);
}

/* The device's extension list contains `name` as a whole word. */
static int device_has_extension(cl_device_id device, const char *name)
{
    size_t size = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, 0, NULL, &size) != CL_SUCCESS || size == 0)
        return 0;
    char *list = malloc(size + 1);
    if (!list)
        return 0;
    int found = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, size, list, NULL) == CL_SUCCESS) {
        list[size] = '\0';
        size_t len = strlen(name);
        for (const char *at = strstr(list, name); at && !found; at = strstr(at + 1, name))
            found = (at == list || at[-1] == ' ') && (at[len] == ' ' || at[len] == '\0');
    }
    free(list);
    return found;
}

static pv_status opencl_device_info(int index, pv_device_info *info)
{
    cl_platform_id platform;
    cl_device_id device;
    pv_status st = pv_opencl_find_device(index, &platform, &device);
    if (st != PV_OK)
        return st;
    memset(info, 0, sizeof *info);
    cl_ulong mem = 0, max_alloc = 0;
    cl_uint units = 0;
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof info->name - 1, info->name, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(device, CL_DEVICE_VENDOR, sizeof info->vendor - 1, info->vendor, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    if (err != CL_SUCCESS)
        return pv_opencl_fail("device info", "clGetDeviceInfo", err);
    info->global_mem_bytes = mem;
    info->max_alloc_bytes = max_alloc;
    info->compute_units = units;
    info->has_f16 = device_has_extension(device, "cl_khr_fp16");
    return PV_OK;
}

/* ---- life cycle -------------------------------------------------------------- */

/* Releases the deferred buffers whose events have completed; with `wait`,
 * all of them, waiting. An event that cannot be asked counts as complete
 * (the queues are then broken, and nothing will run). */
static void release_deferred(pv_opencl *cl, int wait)
{
    int kept = 0;
    for (int i = 0; i < cl->n_deferred; i++) {
        pv_opencl_deferred *d = &cl->deferred[i];
        int done = 1;
        if (wait)
            clWaitForEvents(d->n_events, d->events);
        for (int e = 0; e < d->n_events && done && !wait; e++) {
            cl_int status = CL_COMPLETE;
            clGetEventInfo(d->events[e], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
            done = status <= CL_COMPLETE; /* complete, or failed */
        }
        if (!done) {
            cl->deferred[kept++] = *d;
            continue;
        }
        for (int e = 0; e < d->n_events; e++)
            clReleaseEvent(d->events[e]);
        clReleaseMemObject(d->mem);
    }
    cl->n_deferred = kept;
}

static void opencl_free(pv_backend *be)
{
    pv_opencl *cl = pv_opencl_of(be);
    if (!cl)
        return;
    cl_command_queue *all[3] = {&cl->queues[0], &cl->queues[1], &cl->release_queue};
    for (int q = 0; q < 3; q++)
        if (*all[q])
            clFinish(*all[q]);
    release_deferred(cl, 1);
    free(cl->deferred);
    pv_opencl_programs_free(cl);
    pv_opencl_index_buffers_free(cl);
    for (int q = 0; q < 3; q++)
        if (*all[q])
            clReleaseCommandQueue(*all[q]);
    if (cl->context)
        clReleaseContext(cl->context);
    free(cl);
    be->impl = NULL;
}

/* The defaults of the tuned parameters on this device: the table's, PV_WG
 * capped at the device's work-group limit, and attention's smaller group
 * on CPU devices. */
static pv_status tuning_defaults(pv_backend *be, size_t max_wg, cl_device_type type)
{
    pv_kernel_tuning *t = be->tuning;
    if (!t)
        return PV_OK;
    t->max_work_group = max_wg > 4096 ? 4096 : (int)max_wg;
    pv_status st = PV_OK;
    for (int f = 0; f < PV_KERNEL_FAMILY_COUNT && st == PV_OK; f++) {
        int wg = t->defaults[f].value[PV_KPARAM_WG];
        if (f == PV_KERNEL_ATTENTION && (type & CL_DEVICE_TYPE_CPU))
            wg = PV_OPENCL_ATTENTION_WORK_GROUP_CPU;
        st = pv_kernel_tuning_default(t, (pv_kernel_family)f, PV_KPARAM_WG, wg);
    }
    return st;
}

/* PV_TEST_KERNEL_DEFINES: -D defines only, so a typo cannot pass other
 * compiler options. */
static pv_status test_defines(pv_opencl *cl)
{
    const char *text = getenv("PV_TEST_KERNEL_DEFINES");
    if (!text || !*text)
        return PV_OK;
    if (strlen(text) >= sizeof cl->test_defines || strspn(text, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_=- D") !=
                                                       strlen(text))
        return pv_error(PV_ERR_INVALID_ARG,
                        "opencl: PV_TEST_KERNEL_DEFINES = \"%.64s\" is not a list of -DNAME=VALUE under %zu bytes",
                        text, sizeof cl->test_defines);
    snprintf(cl->test_defines, sizeof cl->test_defines, "%s", text);
    return PV_OK;
}

static pv_status opencl_init(pv_backend *be)
{
    pv_opencl *cl = calloc(1, sizeof *cl);
    if (!cl)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "opencl: cannot allocate the backend state");
    be->impl = cl;
    pv_status st = pv_opencl_find_device(be->device, &cl->platform, &cl->device);
    if (st != PV_OK) {
        opencl_free(be);
        return st;
    }
    size_t max_wg = 0;
    cl_int err = clGetDeviceInfo(cl->device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg, NULL);
    if (err != CL_SUCCESS) {
        opencl_free(be);
        return pv_opencl_fail("init", "clGetDeviceInfo(CL_DEVICE_MAX_WORK_GROUP_SIZE)", err);
    }
    cl_device_type type = 0;
    err = clGetDeviceInfo(cl->device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    if (err != CL_SUCCESS) {
        opencl_free(be);
        return pv_opencl_fail("init", "clGetDeviceInfo(CL_DEVICE_TYPE)", err);
    }
    st = tuning_defaults(be, max_wg, type);
    if (st == PV_OK)
        st = test_defines(cl);
    if (st == PV_OK)
        st = pv_attention_env("opencl", "PV_ATTENTION_SPLITS", PV_ATTENTION_MAX_SPLITS, &cl->attention_splits);
    if (st == PV_OK)
        st = pv_attention_env("opencl", "PV_ATTENTION_GROUP", PV_ATTENTION_GROUP_MAX, &cl->attention_group);
    if (!cl->attention_group)
        cl->attention_group = type & CL_DEVICE_TYPE_CPU ? 1 : PV_ATTENTION_GROUP_MAX;
    cl_bool unified = CL_FALSE;
    if (st == PV_OK &&
        (err = clGetDeviceInfo(cl->device, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, NULL)) !=
            CL_SUCCESS)
        st = pv_opencl_fail("init", "clGetDeviceInfo(CL_DEVICE_HOST_UNIFIED_MEMORY)", err);
    cl->host_unified = unified == CL_TRUE;
    if (st != PV_OK) {
        opencl_free(be);
        return st;
    }
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)cl->platform, 0};
    cl->context = clCreateContext(props, 1, &cl->device, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        cl->context = NULL;
        opencl_free(be);
        return pv_opencl_fail("init", "clCreateContext", err);
    }
    /* The compute queue keeps its commands' times, which timing markers
     * read (pv_marker_elapsed): on PoCL about 0.1 us of a 2.5 us launch. */
    cl_command_queue *all[3] = {&cl->queues[0], &cl->queues[1], &cl->release_queue};
    for (int q = 0; q < 3; q++) {
        *all[q] = clCreateCommandQueue(cl->context, cl->device, q == PV_QUEUE_COMPUTE ? CL_QUEUE_PROFILING_ENABLE : 0,
                                       &err);
        if (err != CL_SUCCESS) {
            *all[q] = NULL;
            opencl_free(be);
            return pv_opencl_fail("init", "clCreateCommandQueue", err);
        }
    }
    return PV_OK;
}

/* Weight-reading ops: every type kernels/qmatmul.cl decodes, on both. */
static int opencl_supports_weights(const pv_backend *be, pv_op op, pv_wtype t)
{
    (void)be;
    /* every type kernels/qmatmul.cl is built for */
    return (op == PV_OP_QMATMUL || op == PV_OP_QMATMUL_SWIGLU || op == PV_OP_EMBED_GATHER) &&
           pv_kernel_builds_value(PV_KERNEL_QMATMUL, PV_KPARAM_WTYPE, (int)t);
}

static int opencl_supports(const pv_backend *be, pv_op op, pv_dtype dtype)
{
    switch (op) {
    case PV_OP_GEMM:
        return dtype == PV_F32 || (dtype == PV_F16 && be->info.has_f16);
    case PV_OP_ATTENTION:
    case PV_OP_KV_WRITE:
    case PV_OP_SLOT_GATHER:
    case PV_OP_SLOT_SCATTER:
    case PV_OP_EMBED_GATHER:
        return dtype == PV_F32 || dtype == PV_F16; /* f16 is storage only: vload/vstore_half */
    case PV_OP_RMSNORM:
    case PV_OP_ROPE:
    case PV_OP_SWIGLU:
    case PV_OP_ADD:
    case PV_OP_SOFTMAX:
    case PV_OP_ARGMAX:
    case PV_OP_SAMPLE_TOP_P:
    case PV_OP_SAMPLE_BATCH:
        return dtype == PV_F32;
    case PV_OP_SLOT_TRANSFER:
        return dtype == PV_F32 || dtype == PV_F16;
    case PV_OP_ADD_RMSNORM:
        return dtype == PV_F32;
    case PV_OP_ROPE_KV_WRITE:
        return dtype == PV_F32 || dtype == PV_F16;
    case PV_OP_QMATMUL:        /* asked through supports_weights */
    case PV_OP_QMATMUL_SWIGLU: /* the same */
    case PV_OP_COUNT:
        break;
    }
    return 0;
}

/* ---- buffers ----------------------------------------------------------------- */

static pv_status opencl_buffer_alloc(pv_backend *be, pv_mem_kind kind, uint64_t bytes, pv_buffer *buf)
{
    pv_opencl *cl = pv_opencl_of(be);
    cl_ulong max_alloc = 0;
    cl_int err =
        clGetDeviceInfo(cl->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    if (err != CL_SUCCESS)
        return pv_opencl_fail("buffer_alloc", "clGetDeviceInfo(CL_DEVICE_MAX_MEM_ALLOC_SIZE)", err);
    if (bytes > max_alloc)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "opencl buffer_alloc: bytes = %" PRIu64
                        " exceeds the device's largest allocation %" PRIu64,
                        bytes, (uint64_t)max_alloc);
    release_deferred(cl, 0);
    cl_mem_flags flags = CL_MEM_READ_WRITE | (kind == PV_MEM_HOST ? CL_MEM_ALLOC_HOST_PTR : 0);
    cl_mem mem = clCreateBuffer(cl->context, flags, (size_t)bytes, NULL, &err);
    if ((err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES) && cl->n_deferred) {
        release_deferred(cl, 1); /* the memory of buffers freed while in use */
        mem = clCreateBuffer(cl->context, flags, (size_t)bytes, NULL, &err);
    }
    if (err != CL_SUCCESS)
        return pv_opencl_fail("buffer_alloc", "clCreateBuffer", err);
    void *host_ptr = NULL;
    if (kind == PV_MEM_HOST) {
        host_ptr = clEnqueueMapBuffer(cl->queues[PV_QUEUE_COMPUTE], mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE,
                                      0, (size_t)bytes, 0, NULL, NULL, &err);
        if (err != CL_SUCCESS) {
            clReleaseMemObject(mem);
            return pv_opencl_fail("buffer_alloc", "clEnqueueMapBuffer", err);
        }
    }
    buf->kind = kind;
    buf->bytes = bytes;
    buf->host_ptr = host_ptr;
    buf->handle = mem;
    return PV_OK;
}

/* Every queue idle: finish and backend teardown. */
static pv_status wait_all(pv_opencl *cl, const char *what)
{
    cl_command_queue all[3] = {cl->queues[0], cl->queues[1], cl->release_queue};
    for (int q = 0; q < 3; q++) {
        cl_int err = clFinish(all[q]);
        if (err != CL_SUCCESS)
            return pv_opencl_fail(what, "clFinish", err);
    }
    return PV_OK;
}

/* Defers the release of mem behind markers of both queues and, for a host
 * buffer, its unmap (copies to and from a host buffer name only its
 * host_ptr, which the runtime cannot tie to the object, so the unmap goes
 * on the release queue behind the markers: it waits for them without
 * either queue waiting for the other). */
static cl_int defer_release(pv_opencl *cl, cl_mem mem, void *host_ptr)
{
    if (cl->n_deferred == cl->cap_deferred) {
        int cap = cl->cap_deferred ? 2 * cl->cap_deferred : 16;
        pv_opencl_deferred *grown = realloc(cl->deferred, (size_t)cap * sizeof *grown);
        if (!grown)
            return CL_OUT_OF_HOST_MEMORY;
        cl->deferred = grown;
        cl->cap_deferred = cap;
    }
    pv_opencl_deferred d = {mem, {NULL, NULL, NULL}, 0};
    cl_int err = CL_SUCCESS;
    for (int q = 0; q < 2 && err == CL_SUCCESS; q++)
        if ((err = clEnqueueMarkerWithWaitList(cl->queues[q], 0, NULL, &d.events[q])) == CL_SUCCESS) {
            d.n_events++;
            err = clFlush(cl->queues[q]);
        }
    if (err == CL_SUCCESS && host_ptr &&
        (err = clEnqueueUnmapMemObject(cl->release_queue, mem, host_ptr, 2, d.events, &d.events[2])) == CL_SUCCESS) {
        d.n_events++;
        err = clFlush(cl->release_queue);
    }
    if (err != CL_SUCCESS) { /* the caller waits for every queue and releases */
        for (int e = 0; e < d.n_events; e++)
            clReleaseEvent(d.events[e]);
        return err;
    }
    cl->deferred[cl->n_deferred++] = d;
    return CL_SUCCESS;
}

static void opencl_buffer_free(pv_backend *be, pv_buffer *buf)
{
    pv_opencl *cl = pv_opencl_of(be);
    cl_mem mem = pv_opencl_mem(buf);
    if (!mem)
        return;
    release_deferred(cl, 0);
    if (defer_release(cl, mem, buf->host_ptr) != CL_SUCCESS) {
        wait_all(cl, "buffer_free"); /* leave nothing in flight on the memory */
        clReleaseMemObject(mem);
    }
    buf->handle = NULL;
    buf->host_ptr = NULL;
}

/* Host buffers: wait for the compute queue, then memcpy. Device buffers: a
 * blocking read or write on the in-order compute queue. Neither waits for
 * the copy queue (backend.h). */
static pv_status finish_compute(pv_opencl *cl, const char *what)
{
    cl_int err = clFinish(cl->queues[PV_QUEUE_COMPUTE]);
    return err == CL_SUCCESS ? PV_OK : pv_opencl_fail(what, "clFinish (compute queue)", err);
}

static pv_status opencl_buffer_write(pv_backend *be, pv_buffer *dst, uint64_t dst_off, const void *src,
                                     uint64_t bytes)
{
    pv_opencl *cl = pv_opencl_of(be);
    if (bytes == 0)
        return PV_OK;
    if (dst->host_ptr) {
        pv_status st = finish_compute(cl, "buffer_write");
        if (st == PV_OK)
            memcpy((char *)dst->host_ptr + dst_off, src, (size_t)bytes);
        return st;
    }
    cl_int err = clEnqueueWriteBuffer(cl->queues[PV_QUEUE_COMPUTE], pv_opencl_mem(dst), CL_TRUE,
                                      (size_t)dst_off, (size_t)bytes, src, 0, NULL, NULL);
    return err == CL_SUCCESS ? PV_OK : pv_opencl_fail("buffer_write", "clEnqueueWriteBuffer", err);
}

static pv_status opencl_buffer_read(pv_backend *be, const pv_buffer *src, uint64_t src_off, void *dst,
                                    uint64_t bytes)
{
    pv_opencl *cl = pv_opencl_of(be);
    if (bytes == 0)
        return PV_OK;
    if (src->host_ptr) {
        pv_status st = finish_compute(cl, "buffer_read");
        if (st == PV_OK)
            memcpy(dst, (const char *)src->host_ptr + src_off, (size_t)bytes);
        return st;
    }
    cl_int err = clEnqueueReadBuffer(cl->queues[PV_QUEUE_COMPUTE], pv_opencl_mem(src), CL_TRUE,
                                     (size_t)src_off, (size_t)bytes, dst, 0, NULL, NULL);
    return err == CL_SUCCESS ? PV_OK : pv_opencl_fail("buffer_read", "clEnqueueReadBuffer", err);
}

/* ---- events and copies -------------------------------------------------------- */

pv_status pv_opencl_wrap_event(pv_backend *be, cl_event handle, pv_event **out)
{
    pv_event *ev = malloc(sizeof *ev);
    if (!ev) {
        clReleaseEvent(handle);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "opencl: cannot allocate an event (%zu bytes)", sizeof *ev);
    }
    ev->backend = be;
    ev->handle = handle;
    *out = ev;
    return PV_OK;
}

pv_status pv_opencl_event_record(pv_backend *be, pv_queue q, pv_event **out)
{
    cl_event handle;
    cl_int err = clEnqueueMarkerWithWaitList(pv_opencl_of(be)->queues[q], 0, NULL, &handle);
    if (err != CL_SUCCESS)
        return pv_opencl_fail("event_record", "clEnqueueMarkerWithWaitList", err);
    return pv_opencl_wrap_event(be, handle, out);
}

pv_status pv_opencl_copy_async(pv_backend *be, pv_queue q, pv_buffer *dst, uint64_t dst_off, const pv_buffer *src,
                               uint64_t src_off, uint64_t bytes, pv_event *wait, pv_event **done)
{
    be->copies++;
    cl_command_queue queue = pv_opencl_of(be)->queues[q];
    cl_event wait_handle = wait ? (cl_event)wait->handle : NULL;
    cl_uint n_wait = wait ? 1 : 0;
    if (bytes == 0) {
        /* Nothing to move; still honour the ordering the caller asked for. */
        if (wait) {
            cl_int err = clEnqueueBarrierWithWaitList(queue, 1, &wait_handle, NULL);
            if (err != CL_SUCCESS)
                return pv_opencl_fail("copy_async", "clEnqueueBarrierWithWaitList", err);
        }
        return done ? pv_opencl_event_record(be, q, done) : PV_OK;
    }
    cl_event handle = NULL;
    cl_event *event = done ? &handle : NULL;
    cl_int err;
    const char *call;
    if (src->host_ptr && !dst->host_ptr) {
        call = "clEnqueueWriteBuffer";
        err = clEnqueueWriteBuffer(queue, pv_opencl_mem(dst), CL_FALSE, (size_t)dst_off, (size_t)bytes,
                                   (const char *)src->host_ptr + src_off, n_wait, wait ? &wait_handle : NULL,
                                   event);
    } else if (!src->host_ptr && dst->host_ptr) {
        call = "clEnqueueReadBuffer";
        err = clEnqueueReadBuffer(queue, pv_opencl_mem(src), CL_FALSE, (size_t)src_off, (size_t)bytes,
                                  (char *)dst->host_ptr + dst_off, n_wait, wait ? &wait_handle : NULL, event);
    } else {
        call = "clEnqueueCopyBuffer";
        err = clEnqueueCopyBuffer(queue, pv_opencl_mem(src), pv_opencl_mem(dst), (size_t)src_off,
                                  (size_t)dst_off, (size_t)bytes, n_wait, wait ? &wait_handle : NULL, event);
    }
    if (err != CL_SUCCESS)
        return pv_opencl_fail("copy_async", call, err);
    return done ? pv_opencl_wrap_event(be, handle, done) : PV_OK;
}

static pv_status opencl_queue_wait(pv_backend *be, pv_queue q, pv_event *ev)
{
    cl_event handle = (cl_event)ev->handle;
    cl_int err = clEnqueueBarrierWithWaitList(pv_opencl_of(be)->queues[q], 1, &handle, NULL);
    return err == CL_SUCCESS ? PV_OK : pv_opencl_fail("queue_wait", "clEnqueueBarrierWithWaitList", err);
}

static pv_status opencl_event_wait(pv_backend *be, pv_event *ev)
{
    cl_event handle = (cl_event)ev->handle;
    cl_int err = clWaitForEvents(1, &handle);
    return err == CL_SUCCESS ? PV_OK : pv_opencl_fail("event_wait", "clWaitForEvents", err);
}

static pv_status opencl_event_query(pv_backend *be, pv_event *ev, int *done)
{
    cl_int status = CL_QUEUED;
    cl_int err = clGetEventInfo((cl_event)ev->handle, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status,
                                NULL);
    if (err != CL_SUCCESS)
        return pv_opencl_fail("event_query", "clGetEventInfo", err);
    if (status < 0) /* the command failed: its error code */
        return pv_opencl_fail("event_query", "the event's command", status);
    *done = status == CL_COMPLETE;
    return PV_OK;
}

static void opencl_event_free(pv_backend *be, pv_event *ev)
{
    if (ev->handle)
        clReleaseEvent((cl_event)ev->handle);
    free(ev);
}

static pv_status opencl_finish(pv_backend *be)
{
    pv_opencl *cl = pv_opencl_of(be);
    pv_status st = wait_all(cl, "finish");
    release_deferred(cl, 0); /* complete now, unless a queue failed */
    return st;
}

/* ---- timing markers --------------------------------------------------------------
 * A marker is the event of its latest marker command on the compute queue
 * (NULL before the first); its time is the command's end. */

static pv_status opencl_marker_init(pv_backend *be, pv_marker *m)
{
    m->handle = NULL;
    return PV_OK;
}

static void opencl_marker_free(pv_backend *be, pv_marker *m)
{
    if (m->handle)
        clReleaseEvent((cl_event)m->handle);
}

static pv_status opencl_marker_record(pv_backend *be, pv_marker *m)
{
    cl_event handle;
    cl_int err = clEnqueueMarkerWithWaitList(pv_opencl_of(be)->queues[PV_QUEUE_COMPUTE], 0, NULL, &handle);
    if (err != CL_SUCCESS)
        return pv_opencl_fail("marker_record", "clEnqueueMarkerWithWaitList", err);
    opencl_marker_free(be, m);
    m->handle = handle;
    return PV_OK;
}

static pv_status opencl_marker_elapsed(pv_backend *be, const pv_marker *start, const pv_marker *end, double *seconds)
{
    cl_event handles[2] = {(cl_event)start->handle, (cl_event)end->handle};
    cl_ulong at[2];
    cl_int err = clWaitForEvents(2, handles);
    if (err != CL_SUCCESS)
        return pv_opencl_fail("marker_elapsed", "clWaitForEvents", err);
    for (int i = 0; i < 2; i++)
        if ((err = clGetEventProfilingInfo(handles[i], CL_PROFILING_COMMAND_END, sizeof at[i], &at[i], NULL)) !=
            CL_SUCCESS)
            return pv_opencl_fail("marker_elapsed", "clGetEventProfilingInfo(CL_PROFILING_COMMAND_END)", err);
    /* In nanoseconds of the device's clock; the difference signed. */
    *seconds = (double)(int64_t)(at[1] - at[0]) * 1e-9;
    return PV_OK;
}

/* ---- GEMM through CLBlast ------------------------------------------------------ */

/* k == 0: C = beta * C (CLBlast rejects an empty inner dimension), in one
 * run when C's rows are packed, else row by row; beta = 0 overwrites. */
static pv_status gemm_scale_only(pv_backend *be, const pv_gemm_args *a)
{
    size_t es = pv_dtype_size(a->dtype);
    cl_mem c = pv_opencl_mem(a->c);
    cl_command_queue queue = pv_opencl_of(be)->queues[PV_QUEUE_COMPUTE];
    int packed = a->ldc == a->n;
    int64_t runs = packed ? 1 : a->m;
    size_t run_elems = (size_t)(packed ? a->m * a->n : a->n);
    for (int64_t r = 0; r < runs; r++) {
        size_t off = (size_t)(a->c_off + (uint64_t)r * (uint64_t)a->ldc);
        if (a->beta == 0.0f) {
            const uint32_t zero = 0;
            cl_int err = clEnqueueFillBuffer(queue, c, &zero, es, off * es, run_elems * es, 0, NULL, NULL);
            if (err != CL_SUCCESS)
                return pv_opencl_fail("gemm", "clEnqueueFillBuffer", err);
            continue;
        }
        CLBlastStatusCode status =
            a->dtype == PV_F16 ? CLBlastHscal(run_elems, pv_float_to_half(a->beta), c, off, 1, &queue, NULL)
                               : CLBlastSscal(run_elems, a->beta, c, off, 1, &queue, NULL);
        if (status != CLBlastSuccess)
            return pv_error(PV_ERR_BACKEND, "opencl gemm: CLBlast scal of run %" PRId64
                            " failed with status %d", r, (int)status);
        be->launches++;
    }
    return PV_OK;
}

static pv_status opencl_gemm(pv_backend *be, const pv_gemm_args *a)
{
    pv_opencl *cl = pv_opencl_of(be);
    if (a->k == 0)
        return gemm_scale_only(be, a);
    cl_command_queue queue = cl->queues[PV_QUEUE_COMPUTE];
    CLBlastTranspose ta = a->trans_a ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastTranspose tb = a->trans_b ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastStatusCode status;
    cl_mem c = pv_opencl_mem(a->c);
    size_t m = (size_t)a->m, n = (size_t)a->n, k = (size_t)a->k;
    if (a->dtype == PV_F16)
        status = CLBlastHgemm(CLBlastLayoutRowMajor, ta, tb, m, n, k, pv_float_to_half(a->alpha),
                              pv_opencl_mem(a->a), (size_t)a->a_off, (size_t)a->lda, pv_opencl_mem(a->b),
                              (size_t)a->b_off, (size_t)a->ldb, pv_float_to_half(a->beta), c, (size_t)a->c_off,
                              (size_t)a->ldc, &queue, NULL);
    else
        status = CLBlastSgemm(CLBlastLayoutRowMajor, ta, tb, m, n, k, a->alpha, pv_opencl_mem(a->a),
                              (size_t)a->a_off, (size_t)a->lda, pv_opencl_mem(a->b), (size_t)a->b_off,
                              (size_t)a->ldb, a->beta, c, (size_t)a->c_off, (size_t)a->ldc, &queue, NULL);
    if (status != CLBlastSuccess)
        return pv_error(PV_ERR_BACKEND, "opencl gemm: CLBlast%cgemm (m %" PRId64 ", n %" PRId64 ", k %" PRId64
                        ") failed with status %d", a->dtype == PV_F16 ? 'H' : 'S', a->m, a->n, a->k,
                        (int)status);
    be->launches++;
    return PV_OK;
}

static const pv_backend_ops opencl_backend_ops = {
    .api_version = PV_BACKEND_API_VERSION,
    .name = "opencl",
    .device_count = opencl_device_count,
    .device_info = opencl_device_info,
    .init = opencl_init,
    .free = opencl_free,
    .supports = opencl_supports,
    .supports_weights = opencl_supports_weights,
    .buffer_alloc = opencl_buffer_alloc,
    .buffer_free = opencl_buffer_free,
    .buffer_write = opencl_buffer_write,
    .buffer_read = opencl_buffer_read,
    .copy_async = pv_opencl_copy_async,
    .event_record = pv_opencl_event_record,
    .queue_wait = opencl_queue_wait,
    .event_wait = opencl_event_wait,
    .event_query = opencl_event_query,
    .event_free = opencl_event_free,
    .finish = opencl_finish,
    .gemm = opencl_gemm,
    .attention = pv_opencl_attention,
    .kv_write = pv_opencl_kv_write,
    .slot_gather = pv_opencl_slot_gather,
    .slot_scatter = pv_opencl_slot_scatter,
    .embed_gather = pv_opencl_embed_gather,
    .rmsnorm = pv_opencl_rmsnorm,
    .rope = pv_opencl_rope,
    .swiglu = pv_opencl_swiglu,
    .add = pv_opencl_add,
    .softmax = pv_opencl_softmax,
    .argmax = pv_opencl_argmax,
    .sample_top_p = pv_opencl_sample_top_p,
    .qmatmul = pv_opencl_qmatmul,
    .qmatmul_group = pv_opencl_qmatmul_group,
    .add_rmsnorm = pv_opencl_add_rmsnorm,
    .rope_kv_write = pv_opencl_rope_kv_write,
    .qmatmul_swiglu = pv_opencl_qmatmul_swiglu,
    .add_rmsnorm_group = pv_opencl_add_rmsnorm_group,
    .add_rmsnorm_swiglu = pv_opencl_add_rmsnorm_swiglu,
    .attention_qmatmul = pv_opencl_attention_qmatmul,
    .slot_transfer = pv_opencl_slot_transfer,
    .sample_batch = pv_opencl_sample_batch,
    .marker_init = opencl_marker_init,
    .marker_free = opencl_marker_free,
    .marker_record = opencl_marker_record,
    .marker_elapsed = opencl_marker_elapsed,
    .tunable_kernels = 1,
};

/* The module's one exported symbol (backends/backend-module.h). */
const pv_backend_ops *pv_backend_module_ops(void)
{
    return &opencl_backend_ops;
}
