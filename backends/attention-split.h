/* Host-side launch choices for kernels/attention.cl, shared by the OpenCL
 * and CUDA backends so both cut the work the same way.
 *
 * A work-group serves one KV head and up to max_group (at most
 * PV_ATTENTION_GROUP_MAX) of the query heads that read it (grouped-query
 * attention), so each K and V row is read once per block of query heads:
 * once per KV head when the block holds them all. The backends' default
 * max_group is PV_ATTENTION_GROUP_MAX on GPUs; on CPU devices (PoCL) it is
 * 1, as there the other heads' reads of a row hit the cache, while the
 * grouped kernel keeps max_group times more values live across its
 * barriers, which PoCL spills (decode and prefill 1.6-1.7x slower at 9/3
 * heads on 2 cores). The environment variable PV_ATTENTION_GROUP, read when
 * the backend opens, overrides it: N in [1, 8]; 0 or unset keeps the
 * default.
 *
 * Split-K (flash-decoding): each (query token, KV head, head block) may be
 * cut into S ranges of whole chunks of its context, run by S work-groups
 * that write partial (max, sum, unnormalised output) rows, which a second
 * kernel combines. It pays when the call has too few groups to fill the
 * device (decode: one or two tokens over long contexts). The default S:
 *   S = min(ceil(4 * compute_units / groups), chunks / 2, 64), at least 1,
 * with groups = T * n_kv_heads * head blocks and chunks the slot table's
 * width (max_chunks: at least the longest context's chunk count; the
 * engine rounds it up, so that S, and with it every launch of a recorded
 * decode graph, stays the same over the steps of one key while the
 * contexts grow): four groups per compute unit, as the GPU kernel
 * (pv_attention_teams) keeps only a few rows in flight per work-item and
 * a compute unit needs several groups' loads to cover the memory latency;
 * and no range shorter than 2 chunks (64 positions at 32-token chunks, 4
 * steps of that kernel at 64 work-items), below which the combine (a
 * head_dim row per split and head) costs more than the parallelism gains. The environment variable
 * PV_ATTENTION_SPLITS, read when the backend opens, overrides it: a value
 * N in [1, 64] makes every call use S = N (tuning and tests); 0 or unset
 * keeps the default. */
#ifndef PV_KERNELS_ATTENTION_SPLIT_H
#define PV_KERNELS_ATTENTION_SPLIT_H

#include "backends/backend.h"

#include <stdint.h>
#include <stdlib.h>

/* Query heads per work-group at most: the kernel keeps their queries and
 * outputs in registers (PV_ATT_MAX_GROUP). */
#define PV_ATTENTION_GROUP_MAX 8
#define PV_ATTENTION_MAX_SPLITS 64
#define PV_ATTENTION_SPLIT_MIN_CHUNKS 2
/* Work-groups per compute unit the default S aims at. */
#define PV_ATTENTION_GROUPS_PER_UNIT 4

/* Blocks of query heads per KV head, and the query heads in each, for
 * blocks of at most max_group. */
static inline int pv_attention_head_blocks(int32_t n_heads, int32_t n_kv_heads, int max_group)
{
    const int32_t group = n_heads / n_kv_heads;
    return (group + max_group - 1) / max_group;
}

static inline int pv_attention_heads_per_block(int32_t n_heads, int32_t n_kv_heads, int max_group)
{
    const int32_t group = n_heads / n_kv_heads;
    const int blocks = pv_attention_head_blocks(n_heads, n_kv_heads, max_group);
    return (group + blocks - 1) / blocks;
}

/* The attention kernel of a build (kernels/attention.cl, without the
 * _f16/_f32 suffix): pv_attention_teams, the GPU kernel, where a
 * work-group of wg work-items holds a team of max_head_dim / 8 (the
 * build's PV_MAX_HEAD_DIM); else pv_attention, which serves any wg. */
static inline const char *pv_attention_kernel_base(int wg, int max_head_dim)
{
    return wg >= max_head_dim / 8 ? "pv_attention_teams" : "pv_attention";
}

/* S for one call: `forced`, the PV_ATTENTION_SPLITS value, if set; else
 * `tuned`, the call's bucket's PV_SPLITS (backends/kernel-tuning.h), if
 * set; else the rule above. */
static inline int pv_attention_splits(int forced, int tuned, uint32_t compute_units, int max_group,
                                      const pv_attention_args *a)
{
    if (forced > 0)
        return forced;
    if (tuned > 0)
        return tuned;
    const int64_t chunks = a->max_chunks;
    const int64_t groups =
        (int64_t)a->n_tokens * a->n_kv_heads * pv_attention_head_blocks(a->n_heads, a->n_kv_heads, max_group);
    int64_t s = (PV_ATTENTION_GROUPS_PER_UNIT * (int64_t)(compute_units ? compute_units : 1) + groups - 1) / groups;
    if (s > chunks / PV_ATTENTION_SPLIT_MIN_CHUNKS)
        s = chunks / PV_ATTENTION_SPLIT_MIN_CHUNKS;
    if (s > PV_ATTENTION_MAX_SPLITS)
        s = PV_ATTENTION_MAX_SPLITS;
    return s < 1 ? 1 : (int)s;
}

/* *value = the integer in environment variable `name` (0 when unset); one
 * that is not an integer in [0, max] is an error naming it. */
static inline pv_status pv_attention_env(const char *backend, const char *name, int max, int *value)
{
    *value = 0;
    const char *text = getenv(name);
    if (!text || !*text)
        return PV_OK;
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (*end != '\0' || v < 0 || v > max)
        return pv_error(PV_ERR_INVALID_ARG, "%s: %s = \"%s\" is not an integer in [0, %d]", backend, name, text,
                        max);
    *value = (int)v;
    return PV_OK;
}

/* Floats of split-K scratch for S splits: [S][T][n_heads][head_dim]
 * unnormalised outputs, then [S][T][n_heads][2] (max, sum). */
static inline uint64_t pv_attention_split_floats(int splits, const pv_attention_args *a)
{
    return (uint64_t)splits * (uint64_t)a->n_tokens * (uint64_t)a->n_heads * (uint64_t)(a->head_dim + 2);
}

#endif
