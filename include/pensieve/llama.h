/* The Llama-family transformer over paged KV, driven only through the
 * backend vtable. It does not own the KV cache: each forward call is handed
 * the KV pool and, per layer, the slot table of every sequence in the batch
 * (the tiered cache decides which slots those are). */
#ifndef PENSIEVE_LLAMA_H
#define PENSIEVE_LLAMA_H

#include <pensieve/gguf.h>
#include <pensieve/status.h>

#include <pensieve/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How weights are held on the backend. NATIVE keeps each tensor in its GGUF
 * type where the backend reads that type (pv_backend_supports_weights) and
 * widens the rest to f32; F32 widens everything at load, the path to compare
 * with (it reads 4 bytes per weight per token instead of ~0.6 for Q4_1). */
typedef enum pv_llama_weights {
    PV_LLAMA_WEIGHTS_NATIVE = 0,
    PV_LLAMA_WEIGHTS_F32 = 1
} pv_llama_weights;

typedef struct pv_llama_options {
    pv_llama_weights weights; /* default NATIVE */
    pv_dtype kv_dtype;        /* of the KV pool: PV_F32 or PV_F16 */
    int32_t chunk_tokens;     /* tokens per KV slot (default 32) */
    int32_t max_batch_tokens; /* tokens one forward call may carry (default 512) */
    int32_t max_logit_rows;   /* rows one call may ask logits for (default 64) */
    /* Weight matrices share buffers of at most this many bytes (default 256
     * MiB, under OpenCL devices' allocation limits); a larger matrix gets a
     * buffer of its own. */
    uint64_t max_weight_buffer_bytes;
    /* 1 (default): the fused ops where the backend has them (residual add
     * with the next RMSNorm, RoPE with the K/V write, the SwiGLU product),
     * fewer launches for the same values; 0: the unfused ops, to compare. */
    int fuse;
    /* 1 (default): a forward pass of at most PV_LLAMA_GRAPH_MAX_TOKENS
     * tokens is recorded and run as one graph where the backend has graphs
     * (pv_backend_graph_begin): one launch for the host, the same values;
     * 0: launched op by op, to compare. */
    int graphs;
    /* Batch-size buckets for graphs, where a batch offers a spare slot
     * (pv_llama_batch.pad_slot): 1 (default) pads a decode step that runs
     * as a graph to its bucket (pv_llama_decode_bucket), so that steps of
     * nearby batch sizes replay one recording; 2 pads every decode step,
     * graph or not (tests, on backends without graphs); 0 never pads. */
    int graph_buckets;
} pv_llama_options;

/* The largest forward pass recorded as a graph: decode steps; a prefill's
 * few large launches gain nothing from it. */
#define PV_LLAMA_GRAPH_MAX_TOKENS 64

/* The batch size a decode step of n sequences is padded to: 1, 2, 4, 8,
 * then the next multiple of 8 (n itself past PV_LLAMA_GRAPH_MAX_TOKENS). */
int32_t pv_llama_decode_bucket(int32_t n);

void pv_llama_options_default(pv_llama_options *o);

typedef struct pv_llama pv_llama;

/* Read hyperparameters from g, upload every weight to the backend once (in
 * its own type or widened to f32, per opt->weights), and size the run state
 * for opt->max_batch_tokens. g may be freed after this returns. */
pv_status pv_llama_init(pv_llama **out, pv_backend *be, const pv_gguf *g,
                        const pv_llama_options *opt);
void pv_llama_free(pv_llama *m);

const pv_llama_hparams *pv_llama_hparams_of(const pv_llama *m);
/* Why the last forward pass that was to run as a graph ran op by op
 * instead (the backend's message), or "" when none has. */
const char *pv_llama_graph_failure(const pv_llama *m);
/* pv_gguf_identity of the file the model was loaded from. */
uint64_t pv_llama_identity(const pv_llama *m);

/* Bytes of weights the model holds on its backend, and what the same
 * tensors take in the GGUF file (a tied output matrix counts once). */
typedef struct pv_llama_weight_bytes {
    uint64_t resident;
    uint64_t file;
    uint64_t per_token;           /* what one decode step reads: all but an untied embedding table */
    uint32_t n_native, n_widened; /* tensors kept in their type / widened to f32 */
} pv_llama_weight_bytes;

void pv_llama_weight_bytes_of(const pv_llama *m, pv_llama_weight_bytes *out);
const char *pv_llama_weights_name(pv_llama_weights w);
const pv_llama_options *pv_llama_options_of(const pv_llama *m);

/* Elements and bytes of one KV slot: one chunk of one layer, K then V. */
int64_t pv_llama_slot_elems(const pv_llama *m);
uint64_t pv_llama_slot_bytes(const pv_llama *m);

/* One forward pass over a batch of tokens from several sequences. Token i is
 * tokens[i] of sequence token_seq[i] at absolute position token_pos[i]; its
 * K/V are written to its slot and it attends to positions 0..token_pos[i] of
 * its sequence, whose K/V must be in the pool already or in this batch (a
 * recovered range and a new prompt are both just tokens here). */
typedef struct pv_llama_batch {
    int32_t n_tokens;
    const int32_t *tokens;     /* [n_tokens] */
    const int32_t *token_seq;  /* [n_tokens] */
    const int32_t *token_pos;  /* [n_tokens] */
    int32_t n_seqs, max_chunks;
    const int32_t *slot_tables; /* [n_layers][n_seqs][max_chunks], -1 = none */
    pv_buffer *kv_pool;
    int64_t n_slots;
    int32_t n_logits;          /* rows of the batch that want logits */
    const int32_t *logit_rows; /* [n_logits] indices into the batch */
    float *logits;             /* host [n_logits][n_vocab], or NULL */
    /* Called before layer l writes or reads the pool (NULL: none): the
     * engine makes layer l's work wait there for that layer's swapped-in
     * chunks, so later layers' copies overlap earlier layers' compute. */
    pv_status (*before_layer)(void *ctx, uint32_t layer);
    void *before_layer_ctx;
    /* Tokens the device sampled in an earlier step, not read by the host
     * (int32, NULL: none): tokens[i] = -(j + 1) is element j of it, for
     * 0 <= j < n_prev_tokens (pv_embed_gather_args.ids_dev). */
    const pv_buffer *prev_tokens;
    int32_t n_prev_tokens;
    /* A pool slot (< n_slots) that no sequence's table holds, where the
     * rows that pad a decode step to its bucket (pv_llama_options.
     * graph_buckets) write and read their K/V; used only with pad_decode
     * set, so a zeroed batch pads nothing. A decode step is one token per
     * sequence, token i of sequence i, each wanting its logits in order;
     * pad rows are token 0 at position 0 of sequences past n_seqs, and
     * their logits rows follow the real ones'. */
    int32_t pad_decode;
    int64_t pad_slot;
} pv_llama_batch;

pv_status pv_llama_forward(pv_llama *m, const pv_llama_batch *b);

/* Rows the model added to decode steps to reach their buckets, in all. */
uint64_t pv_llama_padded_rows(const pv_llama *m);

/* The device buffer holding the logits of the last forward call,
 * [n_logits][n_vocab] f32, for sampling on the device (argmax, top-p). */
pv_buffer *pv_llama_logits_buffer(pv_llama *m);

#ifdef __cplusplus
}
#endif
#endif
