/* Slot moves for swap-out/in and embedding-row gather. A slot is
 * slot_elems contiguous elements, so moving one is one memcpy; all the
 * slots of a call are spread over the threads, handed out dynamically so a
 * thread the OS preempts does not hold the whole copy up. */
#include "config.h"

#include "backends/cpu/cpu.h"

#include <pensieve/half.h>

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

/* out[i][0..dim) = table[ids[i]][0..dim) widened to f32 */
pv_status pv_cpu_embed_gather(pv_backend *be, const pv_embed_gather_args *a)
{
    float *out = pv_cpu_elem_ptr(a->out, a->out_off, sizeof(float));
    size_t dim = (size_t)a->dim;

    PV_CPU_OMP("omp parallel for schedule(static)")
    for (int32_t i = 0; i < a->n_ids; i++) {
        float *row_out = out + (size_t)i * dim;
        if (a->table_dtype == PV_F32) {
            const float *table = pv_cpu_elem_ptr(a->table, a->table_off, sizeof(float));
            memcpy(row_out, table + (size_t)a->ids[i] * dim, dim * sizeof(float));
        } else {
            const pv_half *table = pv_cpu_elem_ptr(a->table, a->table_off, sizeof(pv_half));
            const pv_half *row = table + (size_t)a->ids[i] * dim;
            for (size_t d = 0; d < dim; d++)
                row_out[d] = pv_half_to_float(row[d]);
        }
    }
    return PV_OK;
}
