/* GGUF model files: an mmap-based reader (versions 2 and 3), dequantisation
 * of the tensor types our models use, the Llama hyperparameters, and a small
 * writer used for the synthetic test model.
 *
 * File layout (little-endian), as the public GGUF description gives it:
 *   "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x  { string key | u32 value_type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to `general.alignment` (default 32)
 *   tensor data; each tensor at data_start + offset, offset aligned
 * A string is u64 length + bytes (no NUL). An array is u32 element type +
 * u64 count + elements.
 *
 * Tensor shapes use ggml's order: ne[0] is the innermost (contiguous)
 * dimension, so a weight matrix W with ne = {n_in, n_out} is stored as
 * n_out rows of n_in values: row-major [n_out][n_in].
 *
 * Every fallible call returns a pv_status; pv_last_error() then names the
 * file, key or tensor, the offset and the limit at fault. */
#ifndef PENSIEVE_GGUF_H
#define PENSIEVE_GGUF_H

#include <pensieve/half.h>
#include <pensieve/status.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- metadata value types ------------------------------------------------ */

typedef enum pv_gguf_type {
    PV_GGUF_UINT8 = 0,
    PV_GGUF_INT8 = 1,
    PV_GGUF_UINT16 = 2,
    PV_GGUF_INT16 = 3,
    PV_GGUF_UINT32 = 4,
    PV_GGUF_INT32 = 5,
    PV_GGUF_FLOAT32 = 6,
    PV_GGUF_BOOL = 7,
    PV_GGUF_STRING = 8,
    PV_GGUF_ARRAY = 9,
    PV_GGUF_UINT64 = 10,
    PV_GGUF_INT64 = 11,
    PV_GGUF_FLOAT64 = 12
} pv_gguf_type;

const char *pv_gguf_type_name(pv_gguf_type type);

/* ---- tensor (ggml) types ------------------------------------------------- */

/* The ggml type ids a GGUF file may name. The reader knows the block size of
 * all of them (so it can bound-check any file); pv_ggml_dequantize_f32()
 * decodes those listed in pv_ggml_type_dequantizable(). */
typedef enum pv_ggml_type {
    PV_GGML_F32 = 0,
    PV_GGML_F16 = 1,
    PV_GGML_Q4_0 = 2,
    PV_GGML_Q4_1 = 3,
    PV_GGML_Q5_0 = 6,
    PV_GGML_Q5_1 = 7,
    PV_GGML_Q8_0 = 8,
    PV_GGML_Q8_1 = 9,
    PV_GGML_Q2_K = 10,
    PV_GGML_Q3_K = 11,
    PV_GGML_Q4_K = 12,
    PV_GGML_Q5_K = 13,
    PV_GGML_Q6_K = 14,
    PV_GGML_Q8_K = 15,
    PV_GGML_BF16 = 30
} pv_ggml_type;

/* Name of a ggml type id ("Q4_1"), or "unknown" for an id the reader does
 * not know. */
const char *pv_ggml_type_name(uint32_t type);

/* Elements per block and bytes per block of a type. PV_ERR_UNSUPPORTED for
 * an unknown id. */
pv_status pv_ggml_type_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);

/* Whether pv_ggml_dequantize_f32() decodes this type: F32, F16, BF16, Q8_0,
 * Q4_0, Q4_1 (SmolLM2-135M-Instruct.Q4_1.gguf uses F32, Q8_0 and Q4_1). */
int pv_ggml_type_dequantizable(uint32_t type);

/* Bytes that n elements of `type` occupy; n must be a multiple of the block
 * size. */
pv_status pv_ggml_row_bytes(uint32_t type, uint64_t n, uint64_t *bytes);

/* Decode n elements (a multiple of the block size) from src (src_bytes long)
 * to f32 / f16. */
pv_status pv_ggml_dequantize_f32(uint32_t type, const void *src, uint64_t src_bytes,
                                 float *dst, uint64_t n);
pv_status pv_ggml_dequantize_f16(uint32_t type, const void *src, uint64_t src_bytes,
                                 pv_half *dst, uint64_t n);

/* Encode n f32 values into dst (dst_bytes long) as F32, F16, BF16, Q8_0,
 * Q4_0 or Q4_1 (round to nearest; scales as the reference quantisers choose
 * them). Used by the synthetic-model writer and the tests. */
pv_status pv_ggml_quantize(uint32_t type, const float *src, uint64_t n,
                           void *dst, uint64_t dst_bytes);

/* ---- the reader -------------------------------------------------------- */

#define PV_GGUF_MAX_DIMS 4
#define PV_GGUF_DEFAULT_ALIGNMENT 32

/* One metadata entry. Scalars are decoded; strings and arrays point into the
 * mapped file. */
typedef struct pv_gguf_kv {
    char *key;               /* NUL-terminated copy */
    pv_gguf_type type;
    union {
        uint64_t u64;        /* UINT8, UINT16, UINT32, UINT64, BOOL */
        int64_t i64;         /* INT8, INT16, INT32, INT64 */
        double f64;          /* FLOAT32, FLOAT64 */
    } v;
    const char *str;         /* STRING: bytes in the map (not NUL-terminated) */
    uint64_t str_len;
    pv_gguf_type array_type; /* ARRAY: element type */
    uint64_t array_len;      /* ARRAY: element count */
    const uint8_t *array_data; /* ARRAY: first element in the map */
    uint64_t *string_offsets;  /* ARRAY of STRING: file offset of element i's length field */
    uint64_t file_offset;    /* where the entry's key starts, for messages */
} pv_gguf_kv;

typedef struct pv_gguf_tensor {
    char *name;              /* NUL-terminated copy */
    uint32_t n_dims;
    uint64_t ne[PV_GGUF_MAX_DIMS]; /* ne[0] innermost; unused dims are 1 */
    uint32_t type;           /* a pv_ggml_type id */
    uint64_t offset;         /* relative to the data section */
    uint64_t n_elements;
    uint64_t n_bytes;
    const void *data;        /* in the map */
    uint64_t info_offset;    /* where the tensor's info starts, for messages */
} pv_gguf_tensor;

typedef struct pv_gguf {
    char *path;              /* file name for messages ("<memory>" for buffers) */
    const uint8_t *base;     /* the whole file */
    uint64_t size;
    int mapped;              /* base is an mmap this reader owns */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;    /* start of the tensor data section */
    uint64_t n_kv;
    pv_gguf_kv *kv;
    uint64_t n_tensors;
    pv_gguf_tensor *tensors;
    struct pv_gguf_index *index; /* hash tables of keys and tensor names */
} pv_gguf;

/* Map and parse a file. Every structure is bound-checked here: a truncated
 * or corrupt file fails with PV_ERR_FORMAT naming the offset. */
pv_status pv_gguf_init(pv_gguf *g, const char *path);

/* Parse a file image held in memory; the buffer must outlive g. */
pv_status pv_gguf_init_memory(pv_gguf *g, const void *data, uint64_t size);

void pv_gguf_free(pv_gguf *g);

/* A 64-bit identity of the model the file holds: a hash of every tensor's
 * name, type, shape and offset and of its first 4 KiB of data. KV computed
 * with one model is valid only for a file of the same identity. */
pv_status pv_gguf_identity(const pv_gguf *g, uint64_t *out);

/* Lookup by key: NULL when absent (no error recorded). */
const pv_gguf_kv *pv_gguf_find(const pv_gguf *g, const char *key);

/* Typed getters. Integers convert between widths when the value fits;
 * floats accept FLOAT32 and FLOAT64. PV_ERR_NOT_FOUND if the key is absent,
 * PV_ERR_FORMAT if it has another type or does not fit. */
pv_status pv_gguf_get_u32(const pv_gguf *g, const char *key, uint32_t *out);
pv_status pv_gguf_get_i64(const pv_gguf *g, const char *key, int64_t *out);
pv_status pv_gguf_get_f32(const pv_gguf *g, const char *key, float *out);
pv_status pv_gguf_get_bool(const pv_gguf *g, const char *key, int *out);
/* The string's bytes in the map (not NUL-terminated) and its length. */
pv_status pv_gguf_get_string(const pv_gguf *g, const char *key, const char **str, uint64_t *len);
/* Array element type and count. */
pv_status pv_gguf_get_array(const pv_gguf *g, const char *key, pv_gguf_type *elem_type,
                            uint64_t *count);

/* Element i of an array entry: an integer (any integer or BOOL element type),
 * a float, or a string (pointer into the map). */
pv_status pv_gguf_array_int(const pv_gguf_kv *kv, uint64_t i, int64_t *out);
pv_status pv_gguf_array_float(const pv_gguf_kv *kv, uint64_t i, double *out);
pv_status pv_gguf_array_string(const pv_gguf_kv *kv, uint64_t i, const char **str, uint64_t *len);

/* Lookup by tensor name: NULL when absent (no error recorded). */
const pv_gguf_tensor *pv_gguf_find_tensor(const pv_gguf *g, const char *name);
/* The same, but PV_ERR_NOT_FOUND naming the file and tensor when absent. */
pv_status pv_gguf_get_tensor(const pv_gguf *g, const char *name, const pv_gguf_tensor **out);

/* The caller is done, for now, with the tensor bytes it has read (their
 * copies are on a backend): the mapped file's tensor data leaves this
 * process's resident memory, and pages touched again are read back from
 * the file. Metadata stays. Nothing for an image in memory. A model load
 * calls it after each tensor, so the file and its copy are never both
 * resident (whole data section: a fault may map a large page-cache folio
 * that spans tensors already released). */
void pv_gguf_release(const pv_gguf *g);

/* Decode a whole tensor; n must equal t->n_elements. */
pv_status pv_gguf_tensor_f32(const pv_gguf_tensor *t, float *dst, uint64_t n);
pv_status pv_gguf_tensor_f16(const pv_gguf_tensor *t, pv_half *dst, uint64_t n);
/* Decode rows [first_row, first_row + n_rows) of a tensor (a row is ne[0]
 * elements), e.g. embedding rows by token id; dst holds n_rows * ne[0]. */
pv_status pv_gguf_tensor_rows_f32(const pv_gguf_tensor *t, uint64_t first_row,
                                  uint64_t n_rows, float *dst);

/* ---- Llama hyperparameters ----------------------------------------------- */

/* What the forward pass needs from `llama.*` metadata. RoPE in GGUF Llama
 * files rotates adjacent pairs (x[2i], x[2i+1]) of each head: the converters
 * permute the Q and K weights for that. */
typedef struct pv_llama_hparams {
    uint32_t n_vocab;
    uint32_t n_ctx_train;   /* llama.context_length */
    uint32_t n_embd;        /* llama.embedding_length */
    uint32_t n_layers;      /* llama.block_count */
    uint32_t n_heads;       /* llama.attention.head_count */
    uint32_t n_kv_heads;    /* llama.attention.head_count_kv (= n_heads if absent) */
    uint32_t n_ff;          /* llama.feed_forward_length */
    uint32_t head_dim;      /* n_embd / n_heads */
    uint32_t rope_dim;      /* llama.rope.dimension_count (= head_dim if absent) */
    float rope_base;        /* llama.rope.freq_base (10000 if absent) */
    float norm_eps;         /* llama.attention.layer_norm_rms_epsilon */
    int tied_embeddings;    /* no output.weight: logits use token_embd.weight */
} pv_llama_hparams;

/* Read and check the hyperparameters of a `general.architecture = llama`
 * file (heads divide the width, KV heads divide heads, the tensors the
 * forward pass needs exist with matching shapes). */
pv_status pv_llama_hparams_read(const pv_gguf *g, pv_llama_hparams *hp);

/* ---- the reference model's location --------------------------------------- */

#define PV_DEFAULT_MODEL_NAME "SmolLM2-135M-Instruct.Q4_1.gguf"

/* Where scripts/get-model installs the reference model: $PV_MODEL (a file)
 * if set, else $PV_MODEL_DIR/NAME, else
 * ${XDG_CACHE_HOME:-$HOME/.cache}/pensieve/models/NAME. Whether the file
 * exists is not checked. */
pv_status pv_default_model_path(char *out, size_t cap);

/* ---- the writer ---------------------------------------------------------- */

/* Collects metadata and tensors in memory, then writes a GGUF image. */
typedef struct pv_gguf_writer {
    uint32_t version;
    uint32_t alignment;
    uint8_t *kv_bytes;       /* serialised metadata entries */
    uint64_t kv_len, kv_cap;
    uint64_t n_kv;
    struct pv_gguf_writer_tensor *tensors;
    uint64_t n_tensors, tensors_cap;
} pv_gguf_writer;

/* version 2 or 3; alignment a power of two (0 = the default 32; any other
 * value is also written as general.alignment). */
pv_status pv_gguf_writer_init(pv_gguf_writer *w, uint32_t version, uint32_t alignment);
void pv_gguf_writer_free(pv_gguf_writer *w);

pv_status pv_gguf_writer_add_u32(pv_gguf_writer *w, const char *key, uint32_t value);
pv_status pv_gguf_writer_add_i32(pv_gguf_writer *w, const char *key, int32_t value);
pv_status pv_gguf_writer_add_f32(pv_gguf_writer *w, const char *key, float value);
pv_status pv_gguf_writer_add_bool(pv_gguf_writer *w, const char *key, int value);
pv_status pv_gguf_writer_add_string(pv_gguf_writer *w, const char *key, const char *value);
pv_status pv_gguf_writer_add_strings(pv_gguf_writer *w, const char *key,
                                     const char *const *values, uint64_t count);
pv_status pv_gguf_writer_add_i32s(pv_gguf_writer *w, const char *key,
                                  const int32_t *values, uint64_t count);

/* A tensor from f32 values, encoded as `type` (see pv_ggml_quantize). */
pv_status pv_gguf_writer_add_tensor(pv_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const uint64_t *ne, const float *values);

/* A tensor whose bytes the caller writes itself, after the head (see
 * pv_gguf_writer_head): only its name, type and shape are held, so a file
 * larger than memory can be streamed. pv_gguf_writer_to_memory and _write
 * leave its bytes zero. */
pv_status pv_gguf_writer_add_tensor_info(pv_gguf_writer *w, const char *name, uint32_t type,
                                         uint32_t n_dims, const uint64_t *ne);

/* The bytes before the data section (header, metadata, tensor infos,
 * padding): *head is malloc'd, *head_size long, and the data section starts
 * right after it. offsets[i] (n_tensors entries) is tensor i's data offset
 * from the data section's start, so its file position is *head_size +
 * offsets[i]; *file_size is where the last tensor ends. Bytes between
 * tensors are zero. */
pv_status pv_gguf_writer_head(const pv_gguf_writer *w, uint8_t **head, uint64_t *head_size,
                              uint64_t *offsets, uint64_t *file_size);

/* The file image: *out is malloc'd (free() it). */
pv_status pv_gguf_writer_to_memory(const pv_gguf_writer *w, uint8_t **out, uint64_t *size);
pv_status pv_gguf_writer_write(const pv_gguf_writer *w, const char *path);

/* ---- the synthetic model --------------------------------------------------- */

/* Random Llama models with the metadata keys of the real SmolLM2 file (and
 * what llama.cpp needs to load them): a byte-level BPE vocabulary with
 * ChatML specials at ids 0-2 (<|endoftext|>, <|im_start|> = bos,
 * <|im_end|> = eos), a ChatML chat template, and random weights. The same
 * config always gives the same bytes, whatever n_threads is.
 *
 * Two ways of drawing the weights:
 *  - the tiny test model (n_vocab 0 and PV_SYNTH_MIXED_TYPES, as
 *    pv_synth_config_default sets them): floats uniform in
 *    +-1/sqrt(fan_in) (norms 1 +- 0.1) from one stream of the seed, encoded
 *    by pv_ggml_quantize; tests pin these bytes;
 *  - any other config: random blocks of each tensor's type written
 *    directly (random 4- or 8-bit codes under a random f16 scale that
 *    spreads the decoded weights over about +-1/sqrt(fan_in)), by
 *    n_threads threads, streamed to the file by pv_synth_write, so an 8B
 *    model is never held in memory. */
#define PV_SYNTH_MIXED_TYPES (-1)

typedef struct pv_synth_config {
    uint32_t n_layers, n_embd, n_heads, n_kv_heads, n_ff, n_ctx;
    float rope_base, norm_eps;
    uint64_t seed;
    int tied_embeddings;
    uint32_t version, alignment;  /* of the file written */
    /* 0: the tiny 293-token vocabulary (256 byte tokens, 34 merges); else
     * exactly n_vocab tokens (259 .. 2^20): the byte tokens, merges trained
     * on common English words, then random merges of those tokens. */
    uint32_t n_vocab;
    /* PV_SYNTH_MIXED_TYPES: the mix listed below; else the pv_ggml_type
     * (F32, F16, BF16, Q8_0, Q4_0 or Q4_1) of every matrix, the embedding
     * and output included. Norms are always F32. */
    int32_t weight_type;
    uint32_t n_threads;           /* 0: one per online CPU */
    const char *name;             /* general.name; NULL: "pensieve synthetic llama" */
} pv_synth_config;

/* The tiny model: 2 layers, width 64, 4 heads, 2 KV heads, FFN 128,
 * context 256, tied embeddings, mixed types, seed 42. */
void pv_synth_config_default(pv_synth_config *c);

/* The dimensions of a real model, as its published config.json gives them
 * (docs/models.md), with random weights in Q4_0: "llama3-8b" (untied
 * output), "qwen2.5-1.5b" (written as a Llama: no attention biases),
 * "smollm2-135m"; "tiny" is pv_synth_config_default. An unknown name is
 * PV_ERR_NOT_FOUND listing the known ones. */
pv_status pv_synth_config_shape(pv_synth_config *c, const char *shape);

/* Name of shape i (0, 1, ...), NULL past the last. */
const char *pv_synth_shape_name(size_t i);

/* Mixed types (PV_SYNTH_MIXED_TYPES), so tests can expect them: token
 * embedding Q8_0, norms F32, attn_q Q4_1, attn_k Q4_0, attn_v F16,
 * attn_output Q8_0, ffn_gate Q4_1, ffn_up Q4_0, ffn_down BF16 (layer 0) or
 * F16, output (when untied) F16. */
pv_status pv_synth_to_memory(const pv_synth_config *c, uint8_t **out, uint64_t *size);
pv_status pv_synth_write(const pv_synth_config *c, const char *path);

#ifdef __cplusplus
}
#endif
#endif
