/* pensieve-tune's measurements: the times the eviction cost model is fitted
 * to, taken through the real kernels on one backend device. */
#ifndef PENSIEVE_TUNING_TUNE_H
#define PENSIEVE_TUNING_TUNE_H

#include <pensieve/backend.h>
#include <pensieve/llama.h>
#include <pensieve/profile.h>

/* Repeats of one timing: median and spread ((q3 - q1) / median). */
typedef struct tune_timing {
    double median, spread;
} tune_timing;

typedef struct tune_setup {
    pv_backend *be;
    pv_llama *model;
    int32_t n_heads, n_kv_heads, head_dim, n_layers;
    int32_t chunk_tokens;
    pv_dtype kv_dtype;
    int warmup, repeats;
} tune_setup;

/* One chunk's attention at one layer: chunk_tokens query tokens at
 * positions context .. context + chunk_tokens - 1 of one sequence, over the
 * paged pool (every earlier position and the chunk itself), through
 * pv_attention; each repeat ends with pv_backend_finish. */
pv_status tune_attention(const tune_setup *s, int64_t context, tune_timing *out);

/* One chunk through the whole model (pv_llama_forward, chunk_tokens tokens
 * at positions 0 .., no logits) per layer: the chunk's other work (c) is
 * this minus the attention at context 0. */
pv_status tune_forward_per_layer(const tune_setup *s, tune_timing *out);

#endif
