/* The Llama transformer (Touvron et al.) over a paged KV pool: pre-norm
 * blocks of RMSNorm -> grouped-query attention with RoPE -> residual, and
 * RMSNorm -> SwiGLU FFN -> residual; final RMSNorm and the output projection.
 * Every step is a backend op, so one forward pass serves prefill, decode and
 * recovery batches from many sequences at once: the GEMMs run over all the
 * batch's tokens together and only attention looks at sequences. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <pensieve/llama.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A weight on the backend: its buffer and the type the bytes are in. */
typedef struct llama_weight {
    pv_buffer *buf;
    pv_wtype type;
} llama_weight;

typedef struct llama_layer {
    pv_buffer *attn_norm;              /* [dim] f32 */
    llama_weight wq, wk, wv, wo;       /* [out][in] row-major: y = x W^T */
    pv_buffer *ffn_norm;               /* [dim] f32 */
    llama_weight w_gate, w_up, w_down;
} llama_layer;

struct pv_llama {
    pv_backend *be;
    pv_llama_hparams hp;
    pv_llama_options opt;
    llama_weight tok_embd;           /* [vocab][dim] */
    pv_buffer *output_norm;          /* [dim] f32 */
    llama_weight output;             /* [vocab][dim]; the embedding when tied */
    llama_layer *layers;
    pv_llama_weight_bytes weight_bytes;
    int qmatmul_f32;                 /* f32 matrices go through qmatmul, not gemm */
    /* run state, sized for max_batch_tokens rows */
    pv_buffer *x;                    /* residual stream [T][dim] */
    pv_buffer *h;                    /* normed input [T][dim] */
    pv_buffer *q;                    /* [T][n_heads * head_dim] */
    pv_buffer *k, *v;                /* [T][n_kv_heads * head_dim] */
    pv_buffer *att;                  /* attention output [T][n_heads * head_dim] */
    pv_buffer *proj;                 /* attention/FFN output projection [T][dim] */
    pv_buffer *gate, *up;            /* [T][n_ff] */
    pv_buffer *sel;                  /* rows that want logits [max_logit_rows][dim] */
    pv_buffer *logits;               /* [max_logit_rows][vocab] */
};

void pv_llama_options_default(pv_llama_options *o)
{
    o->weights = PV_LLAMA_WEIGHTS_NATIVE;
    o->kv_dtype = PV_F32;
    o->chunk_tokens = 32;
    o->max_batch_tokens = 512;
    o->max_logit_rows = 64;
}

const pv_llama_hparams *pv_llama_hparams_of(const pv_llama *m)
{
    return &m->hp;
}

const pv_llama_options *pv_llama_options_of(const pv_llama *m)
{
    return &m->opt;
}

int64_t pv_llama_slot_elems(const pv_llama *m)
{
    return 2 * (int64_t)m->opt.chunk_tokens * m->hp.n_kv_heads * m->hp.head_dim;
}

uint64_t pv_llama_slot_bytes(const pv_llama *m)
{
    return (uint64_t)pv_llama_slot_elems(m) * pv_dtype_size(m->opt.kv_dtype);
}

pv_buffer *pv_llama_logits_buffer(pv_llama *m)
{
    return m->logits;
}

void pv_llama_weight_bytes_of(const pv_llama *m, pv_llama_weight_bytes *out)
{
    *out = m->weight_bytes;
}

const char *pv_llama_weights_name(pv_llama_weights w)
{
    return w == PV_LLAMA_WEIGHTS_F32 ? "f32" : "native";
}

/* Upload tensor `name`: its bytes as they are in the file when the model
 * keeps native weights and the backend reads its type for every op in
 * `ops` (matrices: qmatmul; the embedding: embed_gather, and qmatmul too
 * when it is also the output matrix), else widened to f32. */
static pv_status upload_as_needed(pv_llama *m, const pv_gguf *g, const char *name, const pv_op *ops,
                                  int n_ops, llama_weight *out)
{
    const pv_gguf_tensor *t;
    pv_status st = pv_gguf_get_tensor(g, name, &t);
    if (st != PV_OK)
        return st;
    int native = m->opt.weights == PV_LLAMA_WEIGHTS_NATIVE && n_ops > 0;
    for (int i = 0; i < n_ops; i++)
        native = native && pv_backend_supports_weights(m->be, ops[i], (pv_wtype)t->type);
    m->weight_bytes.file += t->n_bytes;
    if (native) {
        out->type = (pv_wtype)t->type;
        st = pv_buffer_init(&out->buf, m->be, PV_MEM_DEVICE, t->n_bytes);
        if (st == PV_OK)
            st = pv_buffer_write(out->buf, 0, t->data, t->n_bytes);
        if (st == PV_OK) {
            m->weight_bytes.resident += t->n_bytes;
            m->weight_bytes.n_native++;
        }
        return st;
    }
    out->type = PV_W_F32;
    if (t->n_elements > SIZE_MAX / sizeof(float))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: tensor '%s': %" PRIu64 " elements do not fit in memory",
                        g->path, name, t->n_elements);
    float *host = malloc(t->n_elements * sizeof *host);
    if (!host)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: tensor '%s': cannot allocate %" PRIu64 " floats",
                        g->path, name, t->n_elements);
    st = pv_gguf_tensor_f32(t, host, t->n_elements);
    if (st == PV_OK)
        st = pv_buffer_init(&out->buf, m->be, PV_MEM_DEVICE, t->n_elements * sizeof *host);
    if (st == PV_OK)
        st = pv_buffer_write(out->buf, 0, host, t->n_elements * sizeof *host);
    free(host);
    if (st == PV_OK) {
        m->weight_bytes.resident += t->n_elements * sizeof *host;
        m->weight_bytes.n_widened++;
    }
    return st;
}

static pv_status upload_weight(pv_llama *m, const pv_gguf *g, const char *name, const pv_op *ops, int n_ops,
                               llama_weight *out)
{
    const uint64_t resident_before = m->weight_bytes.resident;
    pv_status st = upload_as_needed(m, g, name, ops, n_ops, out);
    /* An untied embedding table is read a row per token, not streamed. */
    if (st == PV_OK && !(strcmp(name, "token_embd.weight") == 0 && !m->hp.tied_embeddings))
        m->weight_bytes.per_token += m->weight_bytes.resident - resident_before;
    return st;
}

/* Norm weights are vectors the element-wise ops read in f32. */
static pv_status upload_vector(pv_llama *m, const pv_gguf *g, const char *name, pv_buffer **out)
{
    llama_weight w = {0};
    pv_status st = upload_weight(m, g, name, NULL, 0, &w);
    *out = w.buf;
    return st;
}

static const pv_op matrix_ops[] = {PV_OP_QMATMUL};

static pv_status upload_layer(pv_llama *m, const pv_gguf *g, uint32_t l)
{
    static const char *const matrices[] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                           "ffn_gate", "ffn_up", "ffn_down"};
    llama_layer *L = &m->layers[l];
    llama_weight *dst[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    char name[96];
    pv_status st;
    for (size_t i = 0; i < sizeof matrices / sizeof matrices[0]; i++) {
        snprintf(name, sizeof name, "blk.%u.%s.weight", l, matrices[i]);
        if ((st = upload_weight(m, g, name, matrix_ops, 1, dst[i])) != PV_OK)
            return st;
    }
    snprintf(name, sizeof name, "blk.%u.attn_norm.weight", l);
    if ((st = upload_vector(m, g, name, &L->attn_norm)) != PV_OK)
        return st;
    snprintf(name, sizeof name, "blk.%u.ffn_norm.weight", l);
    return upload_vector(m, g, name, &L->ffn_norm);
}

static pv_status alloc_state(pv_llama *m)
{
    const uint64_t T = (uint64_t)m->opt.max_batch_tokens, f = sizeof(float);
    const pv_llama_hparams *hp = &m->hp;
    const uint64_t q_dim = (uint64_t)hp->n_heads * hp->head_dim;
    const uint64_t kv_dim = (uint64_t)hp->n_kv_heads * hp->head_dim;
    struct { pv_buffer **buf; uint64_t bytes; } want[] = {
        {&m->x, T * hp->n_embd * f},    {&m->h, T * hp->n_embd * f},
        {&m->q, T * q_dim * f},         {&m->k, T * kv_dim * f},
        {&m->v, T * kv_dim * f},        {&m->att, T * q_dim * f},
        {&m->proj, T * hp->n_embd * f}, {&m->gate, T * hp->n_ff * f},
        {&m->up, T * hp->n_ff * f},
        {&m->sel, (uint64_t)m->opt.max_logit_rows * hp->n_embd * f},
        {&m->logits, (uint64_t)m->opt.max_logit_rows * hp->n_vocab * f},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        pv_status st = pv_buffer_init(want[i].buf, m->be, PV_MEM_DEVICE, want[i].bytes);
        if (st != PV_OK)
            return st;
    }
    return PV_OK;
}

pv_status pv_llama_init(pv_llama **out, pv_backend *be, const pv_gguf *g, const pv_llama_options *opt)
{
    if (!out || !be || !g)
        return pv_error(PV_ERR_INVALID_ARG, "pv_llama_init: out, backend and file must not be NULL");
    *out = NULL;
    pv_llama *m = calloc(1, sizeof *m);
    if (!m)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_llama_init: cannot allocate the model");
    m->be = be;
    if (opt)
        m->opt = *opt;
    else
        pv_llama_options_default(&m->opt);
    pv_status st = pv_llama_hparams_read(g, &m->hp);
    if (st != PV_OK)
        goto fail;
    if (m->opt.weights != PV_LLAMA_WEIGHTS_NATIVE && m->opt.weights != PV_LLAMA_WEIGHTS_F32) {
        st = pv_error(PV_ERR_INVALID_ARG, "pv_llama_init: weights %d is neither native nor f32",
                      (int)m->opt.weights);
        goto fail;
    }
    m->qmatmul_f32 = m->opt.weights == PV_LLAMA_WEIGHTS_NATIVE &&
                     pv_backend_supports_weights(be, PV_OP_QMATMUL, PV_W_F32);
    if (m->opt.kv_dtype != PV_F32 && m->opt.kv_dtype != PV_F16) {
        st = pv_error(PV_ERR_INVALID_ARG, "pv_llama_init: kv_dtype %d is neither f32 nor f16",
                      (int)m->opt.kv_dtype);
        goto fail;
    }
    if (m->opt.chunk_tokens <= 0 || m->opt.max_batch_tokens <= 0 || m->opt.max_logit_rows <= 0) {
        st = pv_error(PV_ERR_INVALID_ARG,
                      "pv_llama_init: chunk_tokens %d, max_batch_tokens %d, max_logit_rows %d must "
                      "all be > 0",
                      m->opt.chunk_tokens, m->opt.max_batch_tokens, m->opt.max_logit_rows);
        goto fail;
    }
    if (m->hp.rope_dim != m->hp.head_dim) {
        st = pv_error(PV_ERR_UNSUPPORTED,
                      "%s: partial rotary embedding (rope dimension %u of head size %u) is not "
                      "supported",
                      g->path, m->hp.rope_dim, m->hp.head_dim);
        goto fail;
    }
    if (!pv_attention_head_dim_supported((int32_t)m->hp.head_dim)) {
        st = pv_error(PV_ERR_UNSUPPORTED,
                      "%s: head size %u is not supported by the attention kernels (multiples of "
                      "16 up to 256)",
                      g->path, m->hp.head_dim);
        goto fail;
    }
    m->layers = calloc(m->hp.n_layers, sizeof *m->layers);
    if (!m->layers) {
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "pv_llama_init: cannot allocate %u layers", m->hp.n_layers);
        goto fail;
    }
    static const pv_op embed_ops[] = {PV_OP_EMBED_GATHER, PV_OP_QMATMUL};
    if ((st = upload_weight(m, g, "token_embd.weight", embed_ops, m->hp.tied_embeddings ? 2 : 1,
                            &m->tok_embd)) != PV_OK ||
        (st = upload_vector(m, g, "output_norm.weight", &m->output_norm)) != PV_OK)
        goto fail;
    if (m->hp.tied_embeddings)
        m->output = m->tok_embd;
    else if ((st = upload_weight(m, g, "output.weight", matrix_ops, 1, &m->output)) != PV_OK)
        goto fail;
    for (uint32_t l = 0; l < m->hp.n_layers; l++)
        if ((st = upload_layer(m, g, l)) != PV_OK)
            goto fail;
    if ((st = alloc_state(m)) != PV_OK)
        goto fail;
    *out = m;
    return PV_OK;
fail:
    pv_llama_free(m);
    return st;
}

void pv_llama_free(pv_llama *m)
{
    if (!m)
        return;
    if (m->layers) {
        for (uint32_t l = 0; l < m->hp.n_layers; l++) {
            llama_layer *L = &m->layers[l];
            pv_buffer *bufs[] = {L->attn_norm, L->wq.buf, L->wk.buf, L->wv.buf, L->wo.buf,
                                 L->ffn_norm, L->w_gate.buf, L->w_up.buf, L->w_down.buf};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
                pv_buffer_free(bufs[i]);
        }
        free(m->layers);
    }
    if (m->output.buf != m->tok_embd.buf)
        pv_buffer_free(m->output.buf);
    pv_buffer *bufs[] = {m->tok_embd.buf, m->output_norm, m->x, m->h, m->q, m->k, m->v,
                         m->att, m->proj, m->gate, m->up, m->sel, m->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        pv_buffer_free(bufs[i]);
    free(m);
}

/* y[T][n_out] = x[T][n_in] W^T, W stored [n_out][n_in]. Widened weights
 * (--weights f32) keep the GEMM path they always had; weights in their own
 * type, f32 included, go through qmatmul, whose decode-sized kernels read
 * each weight once per call. */
static pv_status linear(pv_llama *m, const pv_buffer *x, const llama_weight *w, pv_buffer *y,
                        int64_t T, int64_t n_in, int64_t n_out)
{
    if (w->type == PV_W_F32 && !m->qmatmul_f32) {
        pv_gemm_args g = {
            .dtype = PV_F32, .trans_a = 0, .trans_b = 1, .m = T, .n = n_out, .k = n_in,
            .alpha = 1.0f, .beta = 0.0f,
            .a = x, .lda = n_in, .b = w->buf, .ldb = n_in, .c = y, .ldc = n_out,
        };
        return pv_gemm(m->be, &g);
    }
    pv_qmatmul_args q = {.w_type = w->type, .n_tokens = T, .n_in = n_in, .n_out = n_out,
                         .w = w->buf, .x = x, .y = y};
    return pv_qmatmul(m->be, &q);
}

static pv_status rmsnorm(pv_llama *m, const pv_buffer *x, const pv_buffer *w, pv_buffer *out,
                         int64_t rows)
{
    pv_rmsnorm_args a = {.rows = rows, .dim = m->hp.n_embd, .eps = m->hp.norm_eps,
                         .x = x, .weight = w, .out = out};
    return pv_rmsnorm(m->be, &a);
}

static pv_status residual_add(pv_llama *m, int64_t T)
{
    pv_add_args a = {.n = T * m->hp.n_embd, .a = m->x, .b = m->proj, .out = m->x};
    return pv_add(m->be, &a);
}

static pv_status attention_block(pv_llama *m, const pv_llama_batch *b, uint32_t l)
{
    const pv_llama_hparams *hp = &m->hp;
    const llama_layer *L = &m->layers[l];
    const int32_t T = b->n_tokens;
    const int64_t q_dim = (int64_t)hp->n_heads * hp->head_dim;
    const int64_t kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim;
    const int32_t *table = b->slot_tables + (int64_t)l * b->n_seqs * b->max_chunks;
    pv_status st;

    if ((st = rmsnorm(m, m->x, L->attn_norm, m->h, T)) != PV_OK ||
        (st = linear(m, m->h, &L->wq, m->q, T, hp->n_embd, q_dim)) != PV_OK ||
        (st = linear(m, m->h, &L->wk, m->k, T, hp->n_embd, kv_dim)) != PV_OK ||
        (st = linear(m, m->h, &L->wv, m->v, T, hp->n_embd, kv_dim)) != PV_OK)
        return st;

    /* GGUF Llama weights are permuted for adjacent-pair rotation. */
    pv_rope_args rq = {.n_tokens = T, .n_heads = (int32_t)hp->n_heads, .head_dim = (int32_t)hp->head_dim,
                       .base = hp->rope_base, .neox = 0, .x = m->q, .pos = b->token_pos};
    pv_rope_args rk = rq;
    rk.n_heads = (int32_t)hp->n_kv_heads;
    rk.x = m->k;
    if ((st = pv_rope(m->be, &rq)) != PV_OK || (st = pv_rope(m->be, &rk)) != PV_OK)
        return st;

    if (b->before_layer && (st = b->before_layer(b->before_layer_ctx, l)) != PV_OK)
        return st;
    /* This batch's K/V go into the pool first, so its tokens see each other. */
    pv_kv_write_args w = {
        .kv_dtype = m->opt.kv_dtype, .n_tokens = T, .n_kv_heads = (int32_t)hp->n_kv_heads,
        .head_dim = (int32_t)hp->head_dim, .chunk_tokens = m->opt.chunk_tokens,
        .k = m->k, .v = m->v, .kv_pool = b->kv_pool, .n_slots = b->n_slots,
        .token_seq = b->token_seq, .token_pos = b->token_pos, .slot_table = table,
        .n_seqs = b->n_seqs, .max_chunks = b->max_chunks,
    };
    if ((st = pv_kv_write(m->be, &w)) != PV_OK)
        return st;

    pv_attention_args a = {
        .kv_dtype = m->opt.kv_dtype, .n_tokens = T, .n_heads = (int32_t)hp->n_heads,
        .n_kv_heads = (int32_t)hp->n_kv_heads, .head_dim = (int32_t)hp->head_dim,
        .chunk_tokens = m->opt.chunk_tokens, .scale = 1.0f / sqrtf((float)hp->head_dim),
        .q = m->q, .kv_pool = b->kv_pool, .n_slots = b->n_slots,
        .token_seq = b->token_seq, .token_pos = b->token_pos, .slot_table = table,
        .n_seqs = b->n_seqs, .max_chunks = b->max_chunks, .out = m->att,
    };
    if ((st = pv_attention(m->be, &a)) != PV_OK ||
        (st = linear(m, m->att, &L->wo, m->proj, T, q_dim, hp->n_embd)) != PV_OK)
        return st;
    return residual_add(m, T);
}

static pv_status ffn_block(pv_llama *m, int32_t T, uint32_t l)
{
    const pv_llama_hparams *hp = &m->hp;
    const llama_layer *L = &m->layers[l];
    pv_status st;
    pv_swiglu_args s = {.n = (int64_t)T * hp->n_ff, .gate = m->gate, .up = m->up, .out = m->gate};
    if ((st = rmsnorm(m, m->x, L->ffn_norm, m->h, T)) != PV_OK ||
        (st = linear(m, m->h, &L->w_gate, m->gate, T, hp->n_embd, hp->n_ff)) != PV_OK ||
        (st = linear(m, m->h, &L->w_up, m->up, T, hp->n_embd, hp->n_ff)) != PV_OK ||
        (st = pv_swiglu(m->be, &s)) != PV_OK ||
        (st = linear(m, m->gate, &L->w_down, m->proj, T, hp->n_ff, hp->n_embd)) != PV_OK)
        return st;
    return residual_add(m, T);
}

static pv_status check_batch(const pv_llama *m, const pv_llama_batch *b)
{
    if (!b)
        return pv_error(PV_ERR_INVALID_ARG, "pv_llama_forward: batch is NULL");
    if (b->n_tokens <= 0 || b->n_tokens > m->opt.max_batch_tokens)
        return pv_error(PV_ERR_INVALID_ARG, "pv_llama_forward: n_tokens = %d out of range [1, %d]",
                        b->n_tokens, m->opt.max_batch_tokens);
    if (!b->tokens || !b->token_seq || !b->token_pos || !b->slot_tables || !b->kv_pool)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_llama_forward: tokens, token_seq, token_pos, slot_tables and kv_pool "
                        "must not be NULL");
    if (b->n_logits < 0 || b->n_logits > m->opt.max_logit_rows)
        return pv_error(PV_ERR_INVALID_ARG, "pv_llama_forward: n_logits = %d out of range [0, %d]",
                        b->n_logits, m->opt.max_logit_rows);
    if (b->n_logits > 0 && !b->logit_rows)
        return pv_error(PV_ERR_INVALID_ARG, "pv_llama_forward: logit_rows is NULL");
    for (int32_t i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return pv_error(PV_ERR_INVALID_ARG, "pv_llama_forward: logit_rows[%d] = %d out of range [0, %d)",
                            i, b->logit_rows[i], b->n_tokens);
    if (b->kv_pool->bytes < (uint64_t)b->n_slots * pv_llama_slot_bytes(m))
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_llama_forward: kv_pool has %" PRIu64 " bytes, fewer than %" PRId64
                        " slots x %" PRIu64 " bytes",
                        b->kv_pool->bytes, b->n_slots, pv_llama_slot_bytes(m));
    return PV_OK;
}

pv_status pv_llama_forward(pv_llama *m, const pv_llama_batch *b)
{
    if (!m)
        return pv_error(PV_ERR_INVALID_ARG, "pv_llama_forward: model is NULL");
    pv_status st = check_batch(m, b);
    if (st != PV_OK)
        return st;
    const pv_llama_hparams *hp = &m->hp;
    const int32_t T = b->n_tokens;

    pv_embed_gather_args e = {.table_type = m->tok_embd.type, .n_rows = hp->n_vocab, .dim = hp->n_embd,
                              .table = m->tok_embd.buf, .ids = b->tokens, .n_ids = T, .out = m->x};
    if ((st = pv_embed_gather(m->be, &e)) != PV_OK)
        return st;
    for (uint32_t l = 0; l < hp->n_layers; l++)
        if ((st = attention_block(m, b, l)) != PV_OK || (st = ffn_block(m, T, l)) != PV_OK)
            return st;
    if (b->n_logits == 0)
        return PV_OK;

    /* Only the rows that want logits go through the output projection. */
    pv_embed_gather_args pick = {.table_type = PV_W_F32, .n_rows = T, .dim = hp->n_embd,
                                 .table = m->x, .ids = b->logit_rows, .n_ids = b->n_logits,
                                 .out = m->sel};
    if ((st = pv_embed_gather(m->be, &pick)) != PV_OK ||
        (st = rmsnorm(m, m->sel, m->output_norm, m->sel, b->n_logits)) != PV_OK ||
        (st = linear(m, m->sel, &m->output, m->logits, b->n_logits, hp->n_embd, hp->n_vocab)) != PV_OK)
        return st;
    if (b->logits)
        return pv_buffer_read(m->logits, 0, b->logits,
                              (uint64_t)b->n_logits * hp->n_vocab * sizeof(float));
    return PV_OK;
}
