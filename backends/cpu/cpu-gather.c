/* Slot moves for swap-out/in (gather/scatter through staging, and
 * transfers from pool to pool). A slot is slot_elems contiguous elements,
 * so moving one is one memcpy; a gather's or scatter's slots are spread
 * over the threads, handed out dynamically so a thread the OS preempts
 * does not hold the whole copy up. */
#include "config.h"

#include "backends/cpu/cpu.h"

#include <string.h>

/* staging[i][:] = pool[slots[i]][:] */
pv_status pv_cpu_slot_gather(pv_backend *be, const pv_slot_copy_args *a)
{
    size_t elem = pv_dtype_size(a->dtype);
    size_t slot_bytes = (size_t)a->slot_elems * elem;
    const char *pool = a->pool->host_ptr;
    char *staging = pv_cpu_elem_ptr(a->staging, a->staging_off, elem);

    PV_CPU_OMP("omp parallel for schedule(dynamic, 8)")
    for (int32_t i = 0; i < a->n_slots_moved; i++)
        memcpy(staging + (size_t)i * slot_bytes, pool + (size_t)a->slots[i] * slot_bytes, slot_bytes);
    return PV_OK;
}

/* pool[slots[i]][:] = staging[i][:] */
pv_status pv_cpu_slot_scatter(pv_backend *be, const pv_slot_copy_args *a)
{
    size_t elem = pv_dtype_size(a->dtype);
    size_t slot_bytes = (size_t)a->slot_elems * elem;
    char *pool = a->pool->host_ptr;
    const char *staging = pv_cpu_elem_ptr(a->staging, a->staging_off, elem);

    PV_CPU_OMP("omp parallel for schedule(dynamic, 8)")
    for (int32_t i = 0; i < a->n_slots_moved; i++)
        memcpy(pool + (size_t)a->slots[i] * slot_bytes, staging + (size_t)i * slot_bytes, slot_bytes);
    return PV_OK;
}

/* dst[dst_slots[i]][:] = src[src_slots[i]][:]: both pools are host memory
 * here, so a transfer is a copy per slot, whatever the tiers. On the
 * calling thread, as copy_async copies: swap traffic on the CPU backend
 * shares the cores with compute anyway, and a team's worker the OS has not
 * scheduled (a loaded machine) would hold the copy up for a time slice. */
pv_status pv_cpu_slot_transfer(pv_backend *be, const pv_slot_transfer_args *a)
{
    size_t slot_bytes = (size_t)a->slot_elems * pv_dtype_size(a->dtype);
    char *dst = a->dst->host_ptr;
    const char *src = a->src->host_ptr;
    for (int32_t i = 0; i < a->n; i++)
        memcpy(dst + (size_t)a->dst_slots[i] * slot_bytes, src + (size_t)a->src_slots[i] * slot_bytes, slot_bytes);
    return PV_OK;
}
