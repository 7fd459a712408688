/* Paged causal attention with online softmax (flash-decoding style).
 *
 * One work-group per (query head h, query token i): groups {n_heads, T}.
 * The group streams over positions 0..token_pos[i] of sequence token_seq[i]
 * in tiles of PV_WG positions, following the slot table. Work-item w owns
 * the head dims w, w + PV_WG, ... throughout, so every K and V row is read
 * contiguously across work-items (coalesced; vectorisable on CPUs):
 *   1. scores: work-item w forms, for each tile row j, the partial dot
 *      product of q and K[j] over its dims; work-item j then sums row j's
 *      partials: s_j = scale * q . K[j];
 *   2. online softmax: the running max m and sum l are rescaled by the
 *      tile's max, and the weights exp(s_j - m) are shared in local memory;
 *   3. work-item w accumulates its output dims over the tile's V rows.
 * No T x context matrix exists; one tile of scores is all that is held.
 *
 * q    [T][n_heads][head_dim] f32, from q_off
 * kv   [n_slots][2][chunk_tokens][n_kv_heads][head_dim] PV_STORE_T (K then V)
 * token_seq, token_pos [T]; slot_table [n_seqs][max_chunks]
 * out  [T][n_heads][head_dim] f32, from out_off
 * Query head h reads kv head h / (n_heads / n_kv_heads) (grouped-query).
 * head_dim is a run-time value, a multiple of 16 up to PV_MAX_HEAD_DIM;
 * building with PV_MAX_HEAD_DIM close to head_dim (64, 128, 256) saves the
 * work of the dims a work-item owns beyond head_dim.
 * Local memory: PV_WG * (PV_WG + 1) + 2 * PV_WG floats + PV_WG longs
 * (17.4 KB at PV_WG = 64); the +1 row padding keeps the partials' column
 * reads free of bank conflicts on GPUs. */
#include "dialect.h"

/* Head dims each work-item owns. */
#define PV_ATT_DIMS ((PV_MAX_HEAD_DIM + PV_WG - 1) / PV_WG)

PV_KERNEL PV_STORE_NAME(pv_attention)(const PV_GLOBAL float *q, pv_long q_off,
                                      const PV_GLOBAL PV_STORE_T *kv,
                                      const PV_GLOBAL int *token_seq,
                                      const PV_GLOBAL int *token_pos,
                                      const PV_GLOBAL int *slot_table, int max_chunks,
                                      int n_heads, int n_kv_heads, int head_dim,
                                      int chunk_tokens, float scale,
                                      PV_GLOBAL float *out, pv_long out_off)
{
    PV_LOCAL_ARRAY(float, partial, PV_WG * (PV_WG + 1)); /* [tile row][work-item] */
    PV_LOCAL_ARRAY(float, weight, PV_WG);                /* exp(s_j - m) of the tile */
    PV_LOCAL_ARRAY(float, scratch, PV_WG);               /* for the group max */
    PV_LOCAL_ARRAY(pv_long, k_row, PV_WG);               /* element offset of each tile row's K */

    const int lid = PV_LOCAL_ID();
    const int h = (int)PV_GROUP_ID(0);
    const pv_long i = PV_GROUP_ID(1);
    const int kv_head = h / (n_heads / n_kv_heads);
    const int pos = token_pos[i];
    const PV_GLOBAL int *slots = slot_table + (pv_long)token_seq[i] * max_chunks;
    const pv_long row_elems = (pv_long)n_kv_heads * head_dim;
    const pv_long v_from_k = (pv_long)chunk_tokens * row_elems;
    const pv_long slot_elems = 2 * v_from_k;

    /* Owned dims past head_dim read dim 0 with a zero query and are never
     * stored: the inner loops stay branch-free, so they unroll and vectorise. */
    const PV_GLOBAL float *q_head = q + q_off + (i * n_heads + h) * head_dim;
    int dim[PV_ATT_DIMS];
    float q_reg[PV_ATT_DIMS];
    float acc[PV_ATT_DIMS];
    #pragma unroll
    for (int k = 0; k < PV_ATT_DIMS; k++) {
        const int d = lid + k * PV_WG;
        dim[k] = d < head_dim ? d : 0;
        q_reg[k] = d < head_dim ? q_head[d] * scale : 0.0f;
        acc[k] = 0.0f;
    }
    float m = -PV_INF; /* running max of the scores seen */
    float l = 0.0f;    /* running sum of exp(score - m) */

    for (int t0 = 0; t0 <= pos; t0 += PV_WG) {
        const int n_valid = pos + 1 - t0 < PV_WG ? pos + 1 - t0 : PV_WG;
        const int p = t0 + lid;
        if (lid < n_valid)
            k_row[lid] = (pv_long)slots[p / chunk_tokens] * slot_elems +
                         (pv_long)(p % chunk_tokens) * row_elems + (pv_long)kv_head * head_dim;
        PV_BARRIER();
        for (int j = 0; j < n_valid; j++) {
            const PV_GLOBAL PV_STORE_T *key = kv + k_row[j];
            float part = 0.0f;
            #pragma unroll
            for (int k = 0; k < PV_ATT_DIMS; k++)
                part += q_reg[k] * PV_STORE_LOAD(key, dim[k]);
            partial[j * (PV_WG + 1) + lid] = part;
        }
        PV_BARRIER();
        float s = -PV_INF;
        if (lid < n_valid) {
            s = 0.0f;
            for (int item = 0; item < PV_WG; item++)
                s += partial[lid * (PV_WG + 1) + item];
        }
        const float m_new = PV_FMAX(m, pv_group_max(scratch, s)); /* finite: row 0 is valid */
        weight[lid] = PV_EXP(s - m_new);
        PV_BARRIER();

        const float rescale = PV_EXP(m - m_new);
        l *= rescale;
        #pragma unroll
        for (int k = 0; k < PV_ATT_DIMS; k++)
            acc[k] *= rescale;
        for (int j = 0; j < n_valid; j++) {
            const float w = weight[j];
            const PV_GLOBAL PV_STORE_T *value = kv + k_row[j] + v_from_k;
            l += w;
            #pragma unroll
            for (int k = 0; k < PV_ATT_DIMS; k++)
                acc[k] += w * PV_STORE_LOAD(value, dim[k]);
        }
        m = m_new;
        PV_BARRIER(); /* the next tile overwrites k_row, partial and weight */
    }

    PV_GLOBAL float *out_head = out + out_off + (i * n_heads + h) * head_dim;
    const float inv_l = 1.0f / l;
    #pragma unroll
    for (int k = 0; k < PV_ATT_DIMS; k++) {
        const int d = lid + k * PV_WG;
        if (d < head_dim)
            out_head[d] = acc[k] * inv_l;
    }
}
