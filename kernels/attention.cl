/* Paged causal attention with online softmax, grouped-query heads sharing
 * their K/V reads, and split-K over the context (flash-decoding).
 *
 * A work-group serves one query token i, one KV head and a block of the
 * query heads that read it (n_g <= PV_ATT_MAX_GROUP of the n_heads /
 * n_kv_heads; kernels/attention-split.h picks the blocks), over one range
 * of whole chunks of token i's context 0..token_pos[i] (split s of
 * n_splits): groups {n_kv_heads * n_blocks * n_splits, T}, split fastest.
 * The group streams over its positions in tiles, following the slot table.
 * Two kernels compute it: pv_attention_teams (below), cut for GPUs, where
 * a work-group holds a team of PV_MAX_HEAD_DIM / 8 work-items, and this
 * one, pv_attention, for smaller work-groups (backends/attention-split.h
 * picks). In pv_attention, work-item w owns the head dims w, w + PV_WG,
 * ... throughout, so every K and V row is read contiguously across
 * work-items (coalesced; vectorisable on CPUs), and read once for all n_g
 * query heads:
 *   1. scores: work-item w forms, for each tile row j and query head g, the
 *      partial dot product of q_g and K[j] over its dims; work-item
 *      (g, j) then sums that row's partials: s = scale * q_g . K[j];
 *   2. online softmax per head: the running max m_g and sum l_g are
 *      rescaled by the tile's max, and the weights exp(s - m_g) are shared
 *      in local memory;
 *   3. work-item w accumulates its output dims of every head over the
 *      tile's V rows.
 * A tile has PV_WG / g_pad positions (g_pad: n_g rounded up to a power of
 * two), so the tile's score rows are at most PV_WG. No T x context matrix
 * exists; one tile of scores is all that is held.
 * With n_splits = 1 the group writes its normalised rows to out. Otherwise
 * it writes the unnormalised output and (m, l) of its range to `part`, and
 * pv_attention_combine merges the splits.
 *
 * q    [T][n_heads][head_dim] f32, from q_off
 * kv   [n_slots][2][chunk_tokens][n_kv_heads][head_dim] PV_STORE_T (K then V)
 * token_seq, token_pos [T]; slot_table [n_seqs][max_chunks]
 * out  [T][n_heads][head_dim] f32, from out_off
 * part [T][n_splits][n_heads][head_dim] f32 from part_off, and
 *      [T][n_splits][n_heads][2] (m, l) from ml_off (split-K only)
 * Query head h reads kv head h / (n_heads / n_kv_heads) (grouped-query).
 * head_dim is a run-time value, a multiple of 16 up to PV_MAX_HEAD_DIM;
 * building with PV_MAX_HEAD_DIM close to head_dim (64, 128, 256) saves the
 * work of the dims a work-item owns beyond head_dim, and PV_ATT_MAX_GROUP
 * close to n_g the registers of absent heads.
 * Local memory: PV_WG * (PV_WG + 1) + 2 * PV_WG floats + PV_WG longs
 * (17.4 KB at PV_WG = 64); the +1 row padding keeps the partials' column
 * reads free of bank conflicts on GPUs. */
#include "dialect.h"

#ifndef PV_ATT_MAX_GROUP
#define PV_ATT_MAX_GROUP 8
#endif

/* Head dims each work-item owns. */
#define PV_ATT_DIMS ((PV_MAX_HEAD_DIM + PV_WG - 1) / PV_WG)

/* The positions [*begin, *end) of split `split` of n_splits over the
 * context 0..pos: ranges of whole chunks. */
PV_FUNC void pv_att_range(int pos, int chunk_tokens, int split, int n_splits, int *begin, int *end)
{
    const int per_split = (pos / chunk_tokens + n_splits) / n_splits; /* chunks of each range */
#if defined(PV_TEST_BREAK_WG) && PV_TEST_BREAK_WG == PV_WG
    /* Tests only (tests/test-tune-kernels.sh): this build skips the first
     * half of every context, a faster and wrong candidate that
     * pensieve-tune's kernel search must reject. */
    *begin = split * per_split * chunk_tokens > (pos + 1) / 2 ? split * per_split * chunk_tokens : (pos + 1) / 2;
#else
    *begin = split * per_split * chunk_tokens;
#endif
    *end = (split + 1) * per_split * chunk_tokens < pos + 1 ? (split + 1) * per_split * chunk_tokens : pos + 1;
}

/* Both kernels' arguments (layouts above). */
#define PV_ATT_ARGS                                                                                           \
    const PV_GLOBAL float *q, pv_long q_off, const PV_GLOBAL PV_STORE_T *kv, const PV_GLOBAL int *token_seq, \
        const PV_GLOBAL int *token_pos, const PV_GLOBAL int *slot_table, int max_chunks, int n_heads,        \
        int n_kv_heads, int head_dim, int chunk_tokens, float scale, int heads_per_block, int n_splits,      \
        PV_GLOBAL float *out, pv_long out_off, PV_GLOBAL float *part, pv_long part_off, pv_long ml_off

/* Both kernels' query token i, its positions [begin, end) in this split,
 * its row of the slot table and the pool's strides in elements (a row of
 * K, K to V, a slot), declared in the kernel (after split is known). */
#define PV_ATT_PAGING()                                                                 \
    const pv_long i = PV_GROUP_ID(1);                                                   \
    int begin, end;                                                                     \
    pv_att_range(token_pos[i], chunk_tokens, split, n_splits, &begin, &end);            \
    const PV_GLOBAL int *slots = slot_table + (pv_long)token_seq[i] * max_chunks;       \
    const pv_long row_elems = (pv_long)n_kv_heads * head_dim;                           \
    const pv_long v_from_k = (pv_long)chunk_tokens * row_elems;                         \
    const pv_long slot_elems = 2 * v_from_k

/* The work-group's split, KV head and block of n_g query heads from h0:
 * groups {n_kv_heads * n_blocks * n_splits, T}, split fastest. */
PV_FUNC void pv_att_heads(int n_heads, int n_kv_heads, int heads_per_block, int n_splits, int *split, int *kv_head,
                          int *h0, int *n_g)
{
    const int group = n_heads / n_kv_heads;
    const int n_blocks = (group + heads_per_block - 1) / heads_per_block;
    const pv_long g0 = PV_GROUP_ID(0);
    const int block = (int)(g0 / n_splits % n_blocks);
    *split = (int)(g0 % n_splits);
    *kv_head = (int)(g0 / n_splits / n_blocks);
    *h0 = *kv_head * group + block * heads_per_block;
    *n_g = group - block * heads_per_block < heads_per_block ? group - block * heads_per_block : heads_per_block;
}

PV_KERNEL PV_STORE_NAME(pv_attention)(PV_ATT_ARGS)
{
    PV_LOCAL_ARRAY(float, partial, PV_WG * (PV_WG + 1)); /* [head][tile row][work-item] */
    PV_LOCAL_ARRAY(float, score, PV_WG);                 /* [head][tile row] */
    PV_LOCAL_ARRAY(float, weight, PV_WG);                /* exp(s - m_g) of the tile */
    PV_LOCAL_ARRAY(pv_long, k_row, PV_WG);               /* element offset of each tile row's K */

    const int lid = PV_LOCAL_ID();
    int split, kv_head, h0, n_g; /* h0: the block's first query head */
    pv_att_heads(n_heads, n_kv_heads, heads_per_block, n_splits, &split, &kv_head, &h0, &n_g);
    int g_pad = 1;
    while (g_pad < n_g)
        g_pad <<= 1;
    const int tile = PV_WG / g_pad;

    PV_ATT_PAGING();

    /* Owned dims past head_dim read dim 0 with a zero query and are never
     * stored; heads past n_g have a zero query and are never stored: the
     * inner loops stay branch-free or uniform, so they unroll. */
    int dim[PV_ATT_DIMS];
    float q_reg[PV_ATT_MAX_GROUP][PV_ATT_DIMS];
    float acc[PV_ATT_MAX_GROUP][PV_ATT_DIMS];
    float m[PV_ATT_MAX_GROUP]; /* running max of the scores seen */
    float l[PV_ATT_MAX_GROUP]; /* running sum of exp(score - m) */
    #pragma unroll
    for (int k = 0; k < PV_ATT_DIMS; k++) {
        const int d = lid + k * PV_WG;
        dim[k] = d < head_dim ? d : 0;
    }
    #pragma unroll
    for (int g = 0; g < PV_ATT_MAX_GROUP; g++) {
        const PV_GLOBAL float *q_head = q + q_off + (i * n_heads + h0 + (g < n_g ? g : 0)) * head_dim;
        #pragma unroll
        for (int k = 0; k < PV_ATT_DIMS; k++) {
            q_reg[g][k] = g < n_g && lid + k * PV_WG < head_dim ? q_head[dim[k]] * scale : 0.0f;
            acc[g][k] = 0.0f;
        }
        m[g] = -PV_INF;
        l[g] = 0.0f;
    }
    const int my_g = lid / tile, my_j = lid % tile; /* the score row this work-item sums */

    for (int t0 = begin; t0 < end; t0 += tile) {
        const int n_valid = end - t0 < tile ? end - t0 : tile;
        if (lid < n_valid) {
            const int p = t0 + lid;
            k_row[lid] = (pv_long)slots[p / chunk_tokens] * slot_elems +
                         (pv_long)(p % chunk_tokens) * row_elems + (pv_long)kv_head * head_dim;
        }
        PV_BARRIER();
        for (int j = 0; j < n_valid; j++) {
            const PV_GLOBAL PV_STORE_T *key = kv + k_row[j];
            float k_reg[PV_ATT_DIMS];
            #pragma unroll
            for (int k = 0; k < PV_ATT_DIMS; k++)
                k_reg[k] = PV_STORE_LOAD(key, dim[k]);
            #pragma unroll
            for (int g = 0; g < PV_ATT_MAX_GROUP; g++) {
                if (g < n_g) {
                    float dot = 0.0f;
                    #pragma unroll
                    for (int k = 0; k < PV_ATT_DIMS; k++)
                        dot += q_reg[g][k] * k_reg[k];
                    partial[(g * tile + j) * (PV_WG + 1) + lid] = dot;
                }
            }
        }
        PV_BARRIER();
        float s = -PV_INF;
        if (my_g < n_g && my_j < n_valid) {
            s = 0.0f;
            for (int item = 0; item < PV_WG; item++)
                s += partial[lid * (PV_WG + 1) + item];
        }
        score[lid] = s;
        PV_BARRIER();

        float my_m = 0.0f;
        #pragma unroll
        for (int g = 0; g < PV_ATT_MAX_GROUP; g++) {
            if (g < n_g) {
                float tile_max = -PV_INF;
                for (int j = 0; j < n_valid; j++)
                    tile_max = PV_FMAX(tile_max, score[g * tile + j]);
                const float m_new = PV_FMAX(m[g], tile_max); /* finite: row 0 is valid */
                const float rescale = PV_EXP(m[g] - m_new);
                l[g] *= rescale;
                #pragma unroll
                for (int k = 0; k < PV_ATT_DIMS; k++)
                    acc[g][k] *= rescale;
                m[g] = m_new;
                if (g == my_g)
                    my_m = m_new;
            }
        }
        weight[lid] = my_g < n_g ? PV_EXP(s - my_m) : 0.0f;
        PV_BARRIER();

        for (int j = 0; j < n_valid; j++) {
            const PV_GLOBAL PV_STORE_T *value = kv + k_row[j] + v_from_k;
            float v_reg[PV_ATT_DIMS];
            #pragma unroll
            for (int k = 0; k < PV_ATT_DIMS; k++)
                v_reg[k] = PV_STORE_LOAD(value, dim[k]);
            #pragma unroll
            for (int g = 0; g < PV_ATT_MAX_GROUP; g++) {
                if (g < n_g) {
                    const float w = weight[g * tile + j];
                    l[g] += w;
                    #pragma unroll
                    for (int k = 0; k < PV_ATT_DIMS; k++)
                        acc[g][k] += w * v_reg[k];
                }
            }
        }
        PV_BARRIER(); /* the next tile overwrites k_row, partial, score and weight */
    }

    #pragma unroll
    for (int g = 0; g < PV_ATT_MAX_GROUP; g++) {
        if (g < n_g) {
            const pv_long h = h0 + g;
            if (n_splits == 1) {
                PV_GLOBAL float *out_head = out + out_off + (i * n_heads + h) * head_dim;
                const float inv_l = 1.0f / l[g];
                #pragma unroll
                for (int k = 0; k < PV_ATT_DIMS; k++)
                    if (lid + k * PV_WG < head_dim)
                        out_head[lid + k * PV_WG] = acc[g][k] * inv_l;
            } else {
                const pv_long row = (i * n_splits + split) * n_heads + h;
                PV_GLOBAL float *part_head = part + part_off + row * head_dim;
                #pragma unroll
                for (int k = 0; k < PV_ATT_DIMS; k++)
                    if (lid + k * PV_WG < head_dim)
                        part_head[lid + k * PV_WG] = acc[g][k];
                if (lid == 0) {
                    part[ml_off + 2 * row] = m[g];     /* -inf for an empty range */
                    part[ml_off + 2 * row + 1] = l[g];
                }
            }
        }
    }
}

/* ---- Teams: the GPU kernel ------------------------------------------------------
 * The same arguments, groups and results as pv_attention, cut for GPUs;
 * the host takes it where a work-group holds a team (PV_WG >=
 * PV_MAX_HEAD_DIM / 8: backends/attention-split.h). A team of PV_ATT_TEAM =
 * PV_MAX_HEAD_DIM / 8 adjacent work-items holds one K or V row, member k
 * its dims 8k..8k+7, read by one 16-byte load (f16; two for f32); members
 * past head_dim idle. The group's PV_ATT_TEAMS teams take different
 * positions, PV_ATT_ROWS each per step, all loaded before any is used
 * (pv_att_fetch), so a work-item has 2 * PV_ATT_ROWS loads in flight and
 * one load instruction of the group covers PV_ATT_TEAMS rows. Each member
 * dots its 8 dims with every query head's, the team sums them
 * (pv_team_sums: warp shuffles on CUDA), and each team keeps its own
 * online softmax (running max and sum, and its members' 8 output dims of
 * every head) over the positions it took, in registers; no barrier on CUDA
 * until the end, where the teams' states merge through local memory as
 * pv_attention_combine merges splits. Local memory: PV_WG * 8 * PV_ATT_MAX_GROUP floats (16 KiB at
 * PV_WG = 64 and 8 heads), which OpenCL's team sums borrow as scratch. */
#define PV_ATT_TEAM (PV_MAX_HEAD_DIM / 8)
#if PV_WG >= PV_ATT_TEAM
#define PV_ATT_TEAMS (PV_WG / PV_ATT_TEAM)
/* Positions per team and step: as many as registers allow next to the
 * queries and outputs of PV_ATT_MAX_GROUP heads. */
#define PV_ATT_ROWS (PV_ATT_MAX_GROUP <= 4 ? 4 : 2)
#define PV_ATT_SUMS (PV_ATT_ROWS * PV_ATT_MAX_GROUP) /* a step's scores: [row][head] */

/* A step's rows fetched (PV_ATT_ROWS positions a team from p0, its K and
 * V slices at dims as raw words, widened where they are used). A row past
 * end loads position begin (begin < end), which the step then ignores: no
 * branch, so that the step's slot loads go out together, then its K and V
 * loads. A row loaded and widened behind a branch of its own waited for
 * its slot, then for its K and V, before the next row's loads went out
 * (ptxas, sm_90): 8 round trips a step of 4 rows, now 2 or 3. */
PV_FUNC void pv_att_fetch(int p0, int team, int begin, int end, const PV_GLOBAL int *slots, int chunk_tokens,
                          pv_long row_elems, pv_long v_from_k, pv_long slot_elems, pv_long dims,
                          const PV_GLOBAL PV_STORE_T *kv, pv_u32 k_raw[PV_ATT_ROWS][PV_STORE_WORDS8],
                          pv_u32 v_raw[PV_ATT_ROWS][PV_STORE_WORDS8])
{
    int pos[PV_ATT_ROWS], slot[PV_ATT_ROWS];
    #pragma unroll
    for (int r = 0; r < PV_ATT_ROWS; r++) {
        const int p = p0 + team + r * PV_ATT_TEAMS;
        pos[r] = p < end ? p : begin;
        slot[r] = slots[pos[r] / chunk_tokens];
    }
    #pragma unroll
    for (int r = 0; r < PV_ATT_ROWS; r++) {
        const pv_long at = (pv_long)slot[r] * slot_elems + (pv_long)(pos[r] % chunk_tokens) * row_elems + dims;
        PV_STORE_FETCH8(kv + at, k_raw[r]);
        PV_STORE_FETCH8(kv + at + v_from_k, v_raw[r]);
    }
}

/* One step over the fetched rows: scores, the team's sums, the online
 * softmax. Rows at or past end and idle members count as zeros. V is
 * widened after the sums, so that its loads wait there. */
PV_FUNC void pv_att_step(int p0, int team, int end, int active, int n_g,
                         pv_u32 k_raw[PV_ATT_ROWS][PV_STORE_WORDS8], pv_u32 v_raw[PV_ATT_ROWS][PV_STORE_WORDS8],
                         float q_reg[PV_ATT_MAX_GROUP][8], float acc[PV_ATT_MAX_GROUP][8], float *m, float *l,
                         PV_LOCAL float *merged)
{
    int valid[PV_ATT_ROWS]; /* row r's position is before end; rows grow with r */
    float score[PV_ATT_SUMS], value[PV_ATT_ROWS][8];
    #pragma unroll
    for (int r = 0; r < PV_ATT_ROWS; r++) {
        valid[r] = p0 + team + r * PV_ATT_TEAMS < end;
        const int used = valid[r] && active;
        float key[8];
        PV_STORE_WIDEN8(k_raw[r], key);
        #pragma unroll
        for (int k = 0; k < 8; k++)
            key[k] = used ? key[k] : 0.0f;
        #pragma unroll
        for (int g = 0; g < PV_ATT_MAX_GROUP; g++) {
            float dot = 0.0f;
            #pragma unroll
            for (int k = 0; k < 8; k++)
                dot += q_reg[g][k] * key[k];
            score[r * PV_ATT_MAX_GROUP + g] = dot;
        }
    }
    pv_team_sums(merged, score, PV_ATT_SUMS, PV_ATT_TEAM);
    #pragma unroll
    for (int r = 0; r < PV_ATT_ROWS; r++) {
        PV_STORE_WIDEN8(v_raw[r], value[r]);
        #pragma unroll
        for (int k = 0; k < 8; k++)
            value[r][k] = valid[r] && active ? value[r][k] : 0.0f;
    }
    #pragma unroll
    for (int g = 0; g < PV_ATT_MAX_GROUP; g++) {
        if (g < n_g && valid[0]) { /* else no row of this step is valid */
            float m_new = m[g];
            #pragma unroll
            for (int r = 0; r < PV_ATT_ROWS; r++)
                if (valid[r])
                    m_new = PV_FMAX(m_new, score[r * PV_ATT_MAX_GROUP + g]);
            const float rescale = PV_EXP(m[g] - m_new); /* m_new is finite: row 0 is valid */
            l[g] *= rescale;
            #pragma unroll
            for (int k = 0; k < 8; k++)
                acc[g][k] *= rescale;
            #pragma unroll
            for (int r = 0; r < PV_ATT_ROWS; r++) {
                if (valid[r]) {
                    const float w = PV_EXP(score[r * PV_ATT_MAX_GROUP + g] - m_new);
                    l[g] += w;
                    #pragma unroll
                    for (int k = 0; k < 8; k++)
                        acc[g][k] += w * value[r][k];
                }
            }
            m[g] = m_new;
        }
    }
}

PV_KERNEL PV_STORE_NAME(pv_attention_teams)(PV_ATT_ARGS)
{
    /* [team][head][dim]; the team sums' scratch until the merge */
    PV_LOCAL_ARRAY(float, merged, PV_ATT_TEAMS * PV_ATT_MAX_GROUP * PV_MAX_HEAD_DIM);
    PV_LOCAL_ARRAY(float, merged_ml, 2 * PV_ATT_TEAMS * PV_ATT_MAX_GROUP); /* [team][head] (m, l) */

    const int lid = PV_LOCAL_ID(), team = lid / PV_ATT_TEAM, member = lid % PV_ATT_TEAM;
    int split, kv_head, h0, n_g; /* h0: the block's first query head */
    pv_att_heads(n_heads, n_kv_heads, heads_per_block, n_splits, &split, &kv_head, &h0, &n_g);
    PV_ATT_PAGING();
    const int active = 8 * member < head_dim; /* head_dim is a multiple of 16: whole slices */
    const pv_long my_dims = (pv_long)kv_head * head_dim + 8 * member;

    /* Heads past n_g and idle members have a zero query, and are never
     * stored. */
    float q_reg[PV_ATT_MAX_GROUP][8], acc[PV_ATT_MAX_GROUP][8], m[PV_ATT_MAX_GROUP], l[PV_ATT_MAX_GROUP];
    #pragma unroll
    for (int g = 0; g < PV_ATT_MAX_GROUP; g++) {
        const int live = g < n_g && active;
        const PV_GLOBAL float *q_head =
            q + q_off + (i * n_heads + h0 + (live ? g : 0)) * head_dim + (live ? 8 * member : 0);
        #pragma unroll
        for (int k = 0; k < 8; k++) {
            q_reg[g][k] = live ? q_head[k] * scale : 0.0f;
            acc[g][k] = 0.0f;
        }
        m[g] = -PV_INF;
        l[g] = 0.0f;
    }

    /* Every team runs the same steps (OpenCL's team sums hold barriers). */
    const int stride = PV_ATT_ROWS * PV_ATT_TEAMS;
    const pv_long dims = active ? my_dims : (pv_long)kv_head * head_dim;
    pv_u32 k_raw[PV_ATT_ROWS][PV_STORE_WORDS8], v_raw[PV_ATT_ROWS][PV_STORE_WORDS8];
    for (int p0 = begin; p0 < end; p0 += stride) {
        pv_att_fetch(p0, team, begin, end, slots, chunk_tokens, row_elems, v_from_k, slot_elems, dims, kv, k_raw,
                     v_raw);
        pv_att_step(p0, team, end, active, n_g, k_raw, v_raw, q_reg, acc, m, l, merged);
    }

    /* The teams' states merged, as pv_attention_combine merges splits. */
    #pragma unroll
    for (int g = 0; g < PV_ATT_MAX_GROUP; g++) {
        #pragma unroll
        for (int k = 0; k < 8; k++)
            merged[(team * PV_ATT_MAX_GROUP + g) * PV_MAX_HEAD_DIM + 8 * member + k] = acc[g][k];
        if (member == 0) {
            merged_ml[2 * (team * PV_ATT_MAX_GROUP + g)] = m[g];
            merged_ml[2 * (team * PV_ATT_MAX_GROUP + g) + 1] = l[g];
        }
    }
    PV_BARRIER();
    for (int idx = lid; idx < n_g * head_dim; idx += PV_WG) {
        const int g = idx / head_dim, d = idx % head_dim;
        float big = -PV_INF;
        #pragma unroll
        for (int t = 0; t < PV_ATT_TEAMS; t++)
            big = PV_FMAX(big, merged_ml[2 * (t * PV_ATT_MAX_GROUP + g)]);
        float total = 0.0f, sum = 0.0f;
        if (big != -PV_INF) { /* else an empty range: nothing seen */
            #pragma unroll
            for (int t = 0; t < PV_ATT_TEAMS; t++) {
                const float w = PV_EXP(merged_ml[2 * (t * PV_ATT_MAX_GROUP + g)] - big);
                total += w * merged_ml[2 * (t * PV_ATT_MAX_GROUP + g) + 1];
                sum += w * merged[(t * PV_ATT_MAX_GROUP + g) * PV_MAX_HEAD_DIM + d];
            }
        }
        const pv_long h = h0 + g;
        if (n_splits == 1) {
            out[out_off + (i * n_heads + h) * head_dim + d] = sum / total;
        } else {
            const pv_long row = (i * n_splits + split) * n_heads + h;
            part[part_off + row * head_dim + d] = sum;
            if (d == 0) {
                part[ml_off + 2 * row] = big; /* -inf for an empty range */
                part[ml_off + 2 * row + 1] = total;
            }
        }
    }
}
#endif /* PV_WG >= PV_ATT_TEAM */

/* Split-K's second pass: out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s
 * with M = max_s m_s; empty ranges (m_s = -inf) weigh nothing, and range 0
 * is never empty. Layouts as above; head h of token i, for the calling
 * group. */
PV_FUNC void pv_attention_combine_head(const PV_GLOBAL float *part, pv_long part_off, pv_long ml_off, int n_splits,
                                       int n_heads, int head_dim, PV_GLOBAL float *out_head, pv_long h, pv_long i)
{
    const PV_GLOBAL float *ml = part + ml_off + 2 * (i * n_splits * n_heads + h);
    float big = -PV_INF;
    for (int s = 0; s < n_splits; s++)
        big = PV_FMAX(big, ml[2 * (pv_long)s * n_heads]);
    float total = 0.0f;
    for (int s = 0; s < n_splits; s++)
        total += PV_EXP(ml[2 * (pv_long)s * n_heads] - big) * ml[2 * (pv_long)s * n_heads + 1];
    const float inv_total = 1.0f / total;
    const PV_GLOBAL float *o = part + part_off + (i * n_splits * n_heads + h) * head_dim;
    for (int d = PV_LOCAL_ID(); d < head_dim; d += PV_WG) {
        float sum = 0.0f;
        for (int s = 0; s < n_splits; s++)
            sum += PV_EXP(ml[2 * (pv_long)s * n_heads] - big) * o[(pv_long)s * n_heads * head_dim + d];
        out_head[d] = sum * inv_total;
    }
}

/* groups {n_heads, T}. */
PV_KERNEL PV_STORE_NAME(pv_attention_combine)(const PV_GLOBAL float *part, pv_long part_off, pv_long ml_off,
                                              int n_splits, int n_heads, int head_dim,
                                              PV_GLOBAL float *out, pv_long out_off)
{
    const pv_long h = PV_GROUP_ID(0), i = PV_GROUP_ID(1);
    pv_attention_combine_head(part, part_off, ml_off, n_splits, n_heads, head_dim,
                              out + out_off + (i * n_heads + h) * head_dim, h, i);
}

/* pv_attention_combine, and the head's output rounded to 16 bits per
 * block of 32 as qmatmul's pv_qmatmul_round16 rounds it (dialect.h's
 * pv_round16_block: the same bits), for the PV_ACT16 product that reads
 * it next (the attention output's projection): the rounding launch saved.
 * xq and xs as kernels/qmatmul.cl lays them out for out [T][n_heads *
 * head_dim]; head_dim a multiple of 32, so no block spans two heads.
 * groups {n_heads, T}. */
PV_KERNEL PV_STORE_NAME(pv_attention_combine16)(const PV_GLOBAL float *part, pv_long part_off, pv_long ml_off,
                                                int n_splits, int n_heads, int head_dim, PV_GLOBAL float *out,
                                                pv_long out_off, PV_GLOBAL pv_u32 *xq, pv_long xq_off,
                                                PV_GLOBAL float *xs, pv_long xs_off)
{
    const pv_long h = PV_GROUP_ID(0), i = PV_GROUP_ID(1);
    PV_GLOBAL float *out_head = out + out_off + (i * n_heads + h) * head_dim;
    pv_attention_combine_head(part, part_off, ml_off, n_splits, n_heads, head_dim, out_head, h, i);
    PV_BARRIER_GLOBAL(); /* a block's 32 values come from several work-items */
    const int n_blocks = head_dim / 32;
    const pv_long first = (i * n_heads + h) * n_blocks;
    for (int b = PV_LOCAL_ID(); b < n_blocks; b += PV_WG)
        pv_round16_block(out_head + 32 * b, xq + xq_off + 16 * (first + b), xs + xs_off + 2 * (first + b));
}
