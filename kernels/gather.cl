/* Gather family: K/V row writes into slots, whole-slot gather/scatter for
 * swap-out/in. All built per storage dtype (PV_STORE_F16); offsets are in
 * elements. Embedding rows are gathered by the qmatmul family, which reads
 * every weight type. */
#include "dialect.h"

/* Write the K and V rows of T new tokens into their slots, f32 -> storage.
 * groups {ceil(row_elems / PV_WG), T}; row_elems = n_kv_heads * head_dim.
 * k, v  [T][row_elems] f32 from k_off, v_off
 * kv    [n_slots][2][chunk_tokens][row_elems] */
PV_KERNEL PV_STORE_NAME(pv_kv_write)(const PV_GLOBAL float *k, pv_long k_off,
                                     const PV_GLOBAL float *v, pv_long v_off,
                                     PV_GLOBAL PV_STORE_T *kv,
                                     const PV_GLOBAL int *token_seq,
                                     const PV_GLOBAL int *token_pos,
                                     const PV_GLOBAL int *slot_table, int max_chunks,
                                     int chunk_tokens, pv_long row_elems)
{
    const pv_long e = PV_GROUP_ID(0) * PV_WG + PV_LOCAL_ID();
    const pv_long i = PV_GROUP_ID(1);
    if (e >= row_elems)
        return;
    const int pos = token_pos[i];
    const pv_long slot = slot_table[(pv_long)token_seq[i] * max_chunks + pos / chunk_tokens];
    const pv_long dst = slot * 2 * chunk_tokens * row_elems + (pv_long)(pos % chunk_tokens) * row_elems + e;
    PV_STORE_SAVE(k[k_off + i * row_elems + e], kv, dst);
    PV_STORE_SAVE(v[v_off + i * row_elems + e], kv, dst + (pv_long)chunk_tokens * row_elems);
}

/* Copies are bit-exact words of the storage dtype. Each group moves
 * PV_WG * PV_ITEM_ELEMS elements of one slot, work-item j the elements
 * j, j + PV_WG, ... (coalesced).
 * groups {ceil(slot_elems / (PV_WG * PV_ITEM_ELEMS)), n_moved}. */

/* staging[staging_off + i * slot_elems + e] = pool[slots[i] * slot_elems + e] */
PV_KERNEL PV_STORE_NAME(pv_slot_gather)(const PV_GLOBAL PV_STORE_WORD *pool,
                                        PV_GLOBAL PV_STORE_WORD *staging, pv_long staging_off,
                                        const PV_GLOBAL int *slots, pv_long slot_elems)
{
    const pv_long i = PV_GROUP_ID(1);
    const pv_long first = PV_GROUP_ID(0) * PV_WG * PV_ITEM_ELEMS + PV_LOCAL_ID();
    const PV_GLOBAL PV_STORE_WORD *src = pool + (pv_long)slots[i] * slot_elems;
    PV_GLOBAL PV_STORE_WORD *dst = staging + staging_off + i * slot_elems;
#pragma unroll
    for (int k = 0; k < PV_ITEM_ELEMS; k++) {
        const pv_long e = first + (pv_long)k * PV_WG;
        if (e < slot_elems)
            dst[e] = src[e];
    }
}

/* pool[slots[i] * slot_elems + e] = staging[staging_off + i * slot_elems + e] */
PV_KERNEL PV_STORE_NAME(pv_slot_scatter)(PV_GLOBAL PV_STORE_WORD *pool,
                                         const PV_GLOBAL PV_STORE_WORD *staging, pv_long staging_off,
                                         const PV_GLOBAL int *slots, pv_long slot_elems)
{
    const pv_long i = PV_GROUP_ID(1);
    const pv_long first = PV_GROUP_ID(0) * PV_WG * PV_ITEM_ELEMS + PV_LOCAL_ID();
    const PV_GLOBAL PV_STORE_WORD *src = staging + staging_off + i * slot_elems;
    PV_GLOBAL PV_STORE_WORD *dst = pool + (pv_long)slots[i] * slot_elems;
#pragma unroll
    for (int k = 0; k < PV_ITEM_ELEMS; k++) {
        const pv_long e = first + (pv_long)k * PV_WG;
        if (e < slot_elems)
            dst[e] = src[e];
    }
}
