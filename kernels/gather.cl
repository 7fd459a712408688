/* Gather family: K/V row writes into slots (plain, or with RoPE on the
 * way in), whole-slot gather/scatter through staging, and whole-slot
 * transfers from one pool to another for swap-out/in. All built per
 * storage dtype (PV_STORE_F16); offsets are in elements. Embedding rows
 * are gathered by the qmatmul family, which reads every weight type. */
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

/* pv_rope on q and k, then the K/V write of the rotated k and of v (the
 * ops pv_rope_kv_write stands for); k itself is not changed. A group takes
 * one head of one token: groups {n_heads + n_kv_heads, T}, the first
 * n_heads rotating q's heads in place, the others one K head each into its
 * slot row, with the V head beside it.
 * q [T][n_heads][head_dim], k, v [T][n_kv_heads][head_dim] f32;
 * kv [n_slots][2][chunk_tokens][n_kv_heads][head_dim] */
PV_KERNEL PV_STORE_NAME(pv_rope_kv_write)(PV_GLOBAL float *q, pv_long q_off,
                                          const PV_GLOBAL float *k, pv_long k_off,
                                          const PV_GLOBAL float *v, pv_long v_off,
                                          PV_GLOBAL PV_STORE_T *kv,
                                          const PV_GLOBAL int *token_seq,
                                          const PV_GLOBAL int *token_pos,
                                          const PV_GLOBAL int *slot_table, int max_chunks,
                                          int chunk_tokens, int n_heads, int n_kv_heads,
                                          int head_dim, float base, int neox)
{
    const int h = (int)PV_GROUP_ID(0);
    const pv_long t = PV_GROUP_ID(1);
    const int pos = token_pos[t];
    const int half_dim = head_dim / 2;
    if (h < n_heads) {
        PV_GLOBAL float *head = q + q_off + (t * n_heads + h) * head_dim;
        for (int i = PV_LOCAL_ID(); i < half_dim; i += PV_WG) {
            int first, second;
            pv_precise c, s;
            pv_rope_pair(pos, i, head_dim, base, neox, &first, &second, &c, &s);
            const pv_precise x0 = head[first], x1 = head[second];
            head[first] = (float)(x0 * c - x1 * s);
            head[second] = (float)(x0 * s + x1 * c);
        }
        return;
    }
    const pv_long kv_head = h - n_heads;
    const pv_long row_elems = (pv_long)n_kv_heads * head_dim;
    const pv_long slot = slot_table[(pv_long)token_seq[t] * max_chunks + pos / chunk_tokens];
    const pv_long k_dst = slot * 2 * chunk_tokens * row_elems + (pv_long)(pos % chunk_tokens) * row_elems +
                          kv_head * head_dim;
    const pv_long v_dst = k_dst + (pv_long)chunk_tokens * row_elems;
    const PV_GLOBAL float *k_head = k + k_off + t * row_elems + kv_head * head_dim;
    const PV_GLOBAL float *v_head = v + v_off + t * row_elems + kv_head * head_dim;
    for (int i = PV_LOCAL_ID(); i < half_dim; i += PV_WG) {
        int first, second;
        pv_precise c, s;
        pv_rope_pair(pos, i, head_dim, base, neox, &first, &second, &c, &s);
        const pv_precise x0 = k_head[first], x1 = k_head[second];
        PV_STORE_SAVE((float)(x0 * c - x1 * s), kv, k_dst + first);
        PV_STORE_SAVE((float)(x0 * s + x1 * c), kv, k_dst + second);
    }
    for (int d = PV_LOCAL_ID(); d < head_dim; d += PV_WG)
        PV_STORE_SAVE(v_head[d], kv, v_dst + d);
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

/* dst[dst_slots[i]] = src[src_slots[i]], whole slots of slot_words 4-byte
 * words, whatever the storage dtype. One pool is usually host memory the
 * device reaches over the bus (CUDA's mapped pinned memory: swap-in reads
 * it, swap-out writes it). The pools never overlap (distinct buffers), so
 * the pointers are restrict and a work-item's PV_ITEM_ELEMS loads may all
 * be in flight before its stores; a group's words at one k are
 * consecutive, so a warp's accesses are one run.
 * groups {ceil(slot_words / (PV_WG * PV_ITEM_ELEMS)), n}. */
PV_KERNEL pv_slot_transfer(PV_GLOBAL pv_u32 *PV_RESTRICT dst, const PV_GLOBAL pv_u32 *PV_RESTRICT src,
                           const PV_GLOBAL int *dst_slots, const PV_GLOBAL int *src_slots,
                           pv_long slot_words)
{
    const pv_long i = PV_GROUP_ID(1);
    const pv_long first = PV_GROUP_ID(0) * PV_WG * PV_ITEM_ELEMS + PV_LOCAL_ID();
    const PV_GLOBAL pv_u32 *PV_RESTRICT from = src + (pv_long)src_slots[i] * slot_words;
    PV_GLOBAL pv_u32 *PV_RESTRICT to = dst + (pv_long)dst_slots[i] * slot_words;
#pragma unroll
    for (int k = 0; k < PV_ITEM_ELEMS; k++) {
        const pv_long e = first + (pv_long)k * PV_WG;
        if (e < slot_words)
            to[e] = from[e];
    }
}
