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

/* A weight matrix on the backend: where it lies in the model's weight
 * buffers (see upload_matrices) and the type its bytes are in. */
typedef struct llama_weight {
    pv_buffer *buf; /* an arena segment, owned by pv_llama */
    uint64_t off;   /* elements of `type` from the segment's start */
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
    pv_buffer **segments;            /* the weight matrices' arena */
    int n_segments;
    pv_llama_weight_bytes weight_bytes;
    int qmatmul_f32;                 /* f32 matrices go through qmatmul, not gemm */
    int fuse_add_norm, fuse_rope_kv; /* opt.fuse and the backend has the fused op */
    uint64_t identity;               /* pv_gguf_identity of the file */
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
    char graph_failure[256];         /* why the last recording did not run, or "" */
    /* a decode step padded to its bucket: host arrays grown as needed */
    int32_t *pad_rows;               /* tokens, seqs, positions, logit rows: 4 x [bucket] */
    int32_t *pad_tables;             /* [n_layers][bucket][max_chunks] */
    size_t pad_rows_cap, pad_tables_cap;
    uint64_t padded_rows;            /* rows added, in all */
};

void pv_llama_options_default(pv_llama_options *o)
{
    o->weights = PV_LLAMA_WEIGHTS_NATIVE;
    o->kv_dtype = PV_F32;
    o->chunk_tokens = 32;
    o->max_batch_tokens = 512;
    o->max_logit_rows = 64;
    o->max_weight_buffer_bytes = (uint64_t)256 << 20;
    o->fuse = 1;
    o->graphs = 1;
    o->graph_buckets = 1;
}

const char *pv_llama_graph_failure(const pv_llama *m)
{
    return m ? m->graph_failure : "";
}

uint64_t pv_llama_identity(const pv_llama *m)
{
    return m->identity;
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

/* The weight matrices share a few large buffers (arena segments) instead of
 * a buffer each: advised as streamed, a buffer of tens of MB is backed by
 * 2 MiB pages on the CPU backend, which the hardware prefetchers stream
 * through without stopping at every 4 KiB page (F32 decode 5% faster), and
 * a device keeps fewer allocations. A segment stops growing at
 * opt.max_weight_buffer_bytes; a larger tensor gets one of its own. */

typedef struct matrix_upload {
    char name[96];
    const pv_op *ops;
    int n_ops;
    int per_token; /* streamed once per decoded token */
    llama_weight *dst;
    const pv_gguf_tensor *t;
    int native;      /* kept in its GGUF type, else widened to f32 */
    uint64_t bytes;  /* on the device */
    int segment;
    uint64_t offset; /* bytes into the segment */
} matrix_upload;

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/* Decides how `u` is kept: its bytes as they are in the file when the
 * model keeps native weights and the backend reads the type for every op in
 * u->ops (matrices: qmatmul; the embedding: embed_gather, and qmatmul too
 * when it is also the output matrix), else widened to f32. */
static pv_status plan_matrix(pv_llama *m, const pv_gguf *g, matrix_upload *u)
{
    pv_status st = pv_gguf_get_tensor(g, u->name, &u->t);
    if (st != PV_OK)
        return st;
    u->native = m->opt.weights == PV_LLAMA_WEIGHTS_NATIVE;
    for (int i = 0; i < u->n_ops; i++)
        u->native = u->native && pv_backend_supports_weights(m->be, u->ops[i], (pv_wtype)u->t->type);
    if (!u->native && u->t->n_elements > UINT64_MAX / sizeof(float))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: tensor '%s': %" PRIu64 " elements do not fit in memory",
                        g->path, u->name, u->t->n_elements);
    u->dst->type = u->native ? (pv_wtype)u->t->type : PV_W_F32;
    u->bytes = u->native ? u->t->n_bytes : u->t->n_elements * sizeof(float);
    return PV_OK;
}

/* Places the matrices in segments: each starts on a multiple of 64 bytes
 * and of its type's block (so its offset is whole blocks), in file order. */
static pv_status place_matrices(pv_llama *m, matrix_upload *u, int n, uint64_t *segment_bytes)
{
    const uint64_t limit = m->opt.max_weight_buffer_bytes;
    int seg = 0;
    uint64_t used = 0;
    for (int i = 0; i < n; i++) {
        uint32_t elems = 1, bb = 4;
        pv_wtype_block(u[i].dst->type, &elems, &bb);
        const uint64_t step = 64 / gcd_u64(64, bb) * bb;
        uint64_t at = (used + step - 1) / step * step;
        if (used > 0 && (at > limit || u[i].bytes > limit - at)) {
            segment_bytes[seg++] = used;
            at = 0;
        }
        u[i].segment = seg;
        u[i].offset = at;
        used = at + u[i].bytes;
    }
    segment_bytes[seg] = used;
    m->n_segments = n > 0 ? seg + 1 : 0;
    return PV_OK;
}

static pv_status write_matrix(pv_llama *m, const pv_gguf *g, matrix_upload *u)
{
    pv_buffer *buf = m->segments[u->segment];
    uint32_t elems = 1, bb = 4;
    pv_wtype_block(u->dst->type, &elems, &bb);
    u->dst->buf = buf;
    u->dst->off = u->offset / bb * elems;
    const int64_t n_cols = (int64_t)u->t->ne[0], n_rows = (int64_t)(u->t->n_elements / u->t->ne[0]);
    if (u->native)
        return pv_weights_write(buf, u->offset, u->dst->type, n_rows, n_cols, u->t->data);
    float *host = malloc((size_t)u->bytes);
    if (!host)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: tensor '%s': cannot allocate %" PRIu64 " floats", g->path,
                        u->name, u->t->n_elements);
    pv_status st = pv_gguf_tensor_f32(u->t, host, u->t->n_elements);
    if (st == PV_OK)
        st = pv_weights_write(buf, u->offset, PV_W_F32, n_rows, n_cols, host);
    free(host);
    return st;
}

/* Uploads the n matrices of u into the arena and counts their bytes. */
static pv_status upload_matrices(pv_llama *m, const pv_gguf *g, matrix_upload *u, int n)
{
    pv_status st = PV_OK;
    for (int i = 0; i < n && st == PV_OK; i++)
        st = plan_matrix(m, g, &u[i]);
    uint64_t *segment_bytes = st == PV_OK ? calloc((size_t)n + 1, sizeof *segment_bytes) : NULL;
    if (st == PV_OK && !segment_bytes)
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "pv_llama_init: cannot allocate the arena plan");
    if (st == PV_OK)
        st = place_matrices(m, u, n, segment_bytes);
    if (st == PV_OK && m->n_segments > 0 && !(m->segments = calloc((size_t)m->n_segments, sizeof *m->segments)))
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "pv_llama_init: cannot allocate %d arena segments", m->n_segments);
    for (int s = 0; s < m->n_segments && st == PV_OK; s++) {
        st = pv_buffer_init(&m->segments[s], m->be, PV_MEM_DEVICE, segment_bytes[s]);
        if (st == PV_OK)
            st = pv_buffer_advise_streamed(m->segments[s]);
    }
    free(segment_bytes);
    for (int i = 0; i < n && st == PV_OK; i++) {
        st = write_matrix(m, g, &u[i]);
        if (st != PV_OK)
            break;
        pv_gguf_release(g);
        m->weight_bytes.file += u[i].t->n_bytes;
        m->weight_bytes.resident += u[i].bytes;
        if (u[i].native)
            m->weight_bytes.n_native++;
        else
            m->weight_bytes.n_widened++;
        if (u[i].per_token)
            m->weight_bytes.per_token += u[i].bytes;
    }
    return st;
}

/* Norm weights are vectors the element-wise ops read in f32, a small
 * buffer each. */
static pv_status upload_vector(pv_llama *m, const pv_gguf *g, const char *name, pv_buffer **out)
{
    const pv_gguf_tensor *t;
    pv_status st = pv_gguf_get_tensor(g, name, &t);
    if (st != PV_OK)
        return st;
    if (t->n_elements > SIZE_MAX / sizeof(float))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: tensor '%s': %" PRIu64 " elements do not fit in memory",
                        g->path, name, t->n_elements);
    float *host = malloc(t->n_elements * sizeof *host);
    if (!host)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: tensor '%s': cannot allocate %" PRIu64 " floats", g->path,
                        name, t->n_elements);
    st = pv_gguf_tensor_f32(t, host, t->n_elements);
    pv_gguf_release(g);
    if (st == PV_OK)
        st = pv_buffer_init(out, m->be, PV_MEM_DEVICE, t->n_elements * sizeof *host);
    if (st == PV_OK)
        st = pv_buffer_write(*out, 0, host, t->n_elements * sizeof *host);
    free(host);
    if (st == PV_OK) {
        m->weight_bytes.file += t->n_bytes;
        m->weight_bytes.resident += t->n_elements * sizeof *host;
        m->weight_bytes.per_token += t->n_elements * sizeof *host;
        m->weight_bytes.n_widened++;
    }
    return st;
}

static const pv_op matrix_ops[] = {PV_OP_QMATMUL};
static const pv_op embed_ops[] = {PV_OP_EMBED_GATHER, PV_OP_QMATMUL};

/* Every matrix of the model in file order: the embedding, the output
 * matrix when untied, then each layer's seven. */
static pv_status upload_weights(pv_llama *m, const pv_gguf *g)
{
    static const char *const layer_matrices[] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                 "ffn_gate", "ffn_up", "ffn_down"};
    const int per_layer = (int)(sizeof layer_matrices / sizeof layer_matrices[0]);
    const int n_max = 2 + per_layer * (int)m->hp.n_layers;
    matrix_upload *u = calloc((size_t)n_max, sizeof *u);
    if (!u)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_llama_init: cannot allocate %d weight uploads", n_max);
    int n = 0;
    /* An untied embedding table is read a row per token, not streamed. */
    u[n++] = (matrix_upload){.name = "token_embd.weight", .ops = embed_ops,
                             .n_ops = m->hp.tied_embeddings ? 2 : 1, .per_token = m->hp.tied_embeddings,
                             .dst = &m->tok_embd};
    if (!m->hp.tied_embeddings)
        u[n++] = (matrix_upload){.name = "output.weight", .ops = matrix_ops, .n_ops = 1, .per_token = 1,
                                 .dst = &m->output};
    for (uint32_t l = 0; l < m->hp.n_layers; l++) {
        llama_layer *L = &m->layers[l];
        llama_weight *dst[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < per_layer; i++) {
            matrix_upload *v = &u[n++];
            *v = (matrix_upload){.ops = matrix_ops, .n_ops = 1, .per_token = 1, .dst = dst[i]};
            snprintf(v->name, sizeof v->name, "blk.%u.%s.weight", l, layer_matrices[i]);
        }
    }
    pv_status st = upload_matrices(m, g, u, n);
    free(u);
    if (st == PV_OK && m->hp.tied_embeddings)
        m->output = m->tok_embd;
    for (uint32_t l = 0; l < m->hp.n_layers && st == PV_OK; l++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%u.attn_norm.weight", l);
        if ((st = upload_vector(m, g, name, &m->layers[l].attn_norm)) != PV_OK)
            break;
        snprintf(name, sizeof name, "blk.%u.ffn_norm.weight", l);
        st = upload_vector(m, g, name, &m->layers[l].ffn_norm);
    }
    return st == PV_OK ? upload_vector(m, g, "output_norm.weight", &m->output_norm) : st;
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
    if (st == PV_OK)
        st = pv_gguf_identity(g, &m->identity);
    if (st != PV_OK)
        goto fail;
    if (m->opt.weights != PV_LLAMA_WEIGHTS_NATIVE && m->opt.weights != PV_LLAMA_WEIGHTS_F32) {
        st = pv_error(PV_ERR_INVALID_ARG, "pv_llama_init: weights %d is neither native nor f32",
                      (int)m->opt.weights);
        goto fail;
    }
    m->qmatmul_f32 = m->opt.weights == PV_LLAMA_WEIGHTS_NATIVE &&
                     pv_backend_supports_weights(be, PV_OP_QMATMUL, PV_W_F32);
    m->fuse_add_norm = m->opt.fuse && pv_backend_supports(be, PV_OP_ADD_RMSNORM, PV_F32);
    m->fuse_rope_kv = m->opt.fuse && pv_backend_supports(be, PV_OP_ROPE_KV_WRITE, m->opt.kv_dtype);
    if (m->opt.kv_dtype != PV_F32 && m->opt.kv_dtype != PV_F16) {
        st = pv_error(PV_ERR_INVALID_ARG, "pv_llama_init: kv_dtype %d is neither f32 nor f16",
                      (int)m->opt.kv_dtype);
        goto fail;
    }
    if (m->opt.chunk_tokens <= 0 || m->opt.max_batch_tokens <= 0 || m->opt.max_logit_rows <= 0 ||
        m->opt.max_weight_buffer_bytes == 0) {
        st = pv_error(PV_ERR_INVALID_ARG,
                      "pv_llama_init: chunk_tokens %d, max_batch_tokens %d, max_logit_rows %d, "
                      "max_weight_buffer_bytes %" PRIu64 " must all be > 0",
                      m->opt.chunk_tokens, m->opt.max_batch_tokens, m->opt.max_logit_rows,
                      m->opt.max_weight_buffer_bytes);
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
    if ((st = upload_weights(m, g)) != PV_OK || (st = alloc_state(m)) != PV_OK)
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
            pv_buffer_free(L->attn_norm);
            pv_buffer_free(L->ffn_norm);
        }
        free(m->layers);
    }
    for (int s = 0; s < m->n_segments && m->segments; s++)
        pv_buffer_free(m->segments[s]);
    free(m->segments);
    pv_buffer *bufs[] = {m->output_norm, m->x, m->h, m->q, m->k, m->v,
                         m->att, m->proj, m->gate, m->up, m->sel, m->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        pv_buffer_free(bufs[i]);
    free(m->pad_rows);
    free(m->pad_tables);
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
            .a = x, .lda = n_in, .b = w->buf, .b_off = w->off, .ldb = n_in, .c = y, .ldc = n_out,
        };
        return pv_gemm(m->be, &g);
    }
    pv_qmatmul_args q = {.w_type = w->type, .n_tokens = T, .n_in = n_in, .n_out = n_out,
                         .w = w->buf, .w_off = w->off, .x = x, .y = y};
    return pv_qmatmul(m->be, &q);
}

/* Products of one input x: Q, K and V, or gate and up. Weights in their own
 * type go as one qmatmul group (on the CPU one parallel pass instead of one
 * per matrix, where a decode step's small matrices are each over in
 * microseconds): q gets their arguments, and the result is 1. Widened
 * weights take the GEMM path (0). */
static int group_args(const pv_llama *m, const pv_buffer *x, const llama_weight *const *ws, pv_buffer *const *ys,
                      const int64_t *n_outs, int n, int64_t T, int64_t n_in, pv_qmatmul_args *q)
{
    for (int i = 0; i < n; i++) {
        if (ws[i]->type == PV_W_F32 && !m->qmatmul_f32)
            return 0;
        q[i] = (pv_qmatmul_args){.w_type = ws[i]->type, .n_tokens = T, .n_in = n_in, .n_out = n_outs[i],
                                 .w = ws[i]->buf, .w_off = ws[i]->off, .x = x, .y = ys[i]};
    }
    return 1;
}

static pv_status linear_group(pv_llama *m, const pv_buffer *x, const llama_weight *const *ws,
                              pv_buffer *const *ys, const int64_t *n_outs, int n, int64_t T, int64_t n_in)
{
    pv_qmatmul_args q[PV_QMATMUL_GROUP_MAX];
    if (group_args(m, x, ws, ys, n_outs, n, T, n_in, q))
        return pv_qmatmul_group(m->be, q, n);
    for (int j = 0; j < n; j++) {
        pv_status st = linear(m, x, ws[j], ys[j], T, n_in, n_outs[j]);
        if (st != PV_OK)
            return st;
    }
    return PV_OK;
}

static pv_status rmsnorm(pv_llama *m, const pv_buffer *x, const pv_buffer *w, pv_buffer *out,
                         int64_t rows)
{
    pv_rmsnorm_args a = {.rows = rows, .dim = m->hp.n_embd, .eps = m->hp.norm_eps,
                         .x = x, .weight = w, .out = out};
    return pv_rmsnorm(m->be, &a);
}

/* x += proj (a block's output joins the residual stream), then h =
 * rmsnorm(x) * norm for the next block, as one op's arguments. */
static pv_add_rmsnorm_args residual_args(const pv_llama *m, int64_t T, const pv_buffer *norm)
{
    return (pv_add_rmsnorm_args){.rows = T, .dim = m->hp.n_embd, .eps = m->hp.norm_eps, .x = m->x, .y = m->proj,
                                 .weight = norm, .out = m->h};
}

/* x += proj, then, when `norm` is given, h = rmsnorm(x) * norm for the
 * next block: one fused op where the model fuses. */
static pv_status residual(pv_llama *m, int64_t T, const pv_buffer *norm)
{
    if (norm && m->fuse_add_norm) {
        const pv_add_rmsnorm_args a = residual_args(m, T, norm);
        return pv_add_rmsnorm(m->be, &a);
    }
    pv_add_args a = {.n = T * m->hp.n_embd, .a = m->x, .b = m->proj, .out = m->x};
    pv_status st = pv_add(m->be, &a);
    return st == PV_OK && norm ? rmsnorm(m, m->x, norm, m->h, T) : st;
}

/* The new tokens' q and k rotated, then their K/V written to the pool:
 * one fused op where the model fuses. */
static pv_status rope_and_write(pv_llama *m, const pv_llama_batch *b, const int32_t *table)
{
    const pv_llama_hparams *hp = &m->hp;
    const int32_t T = b->n_tokens;
    /* GGUF Llama weights are permuted for adjacent-pair rotation (neox 0). */
    if (m->fuse_rope_kv) {
        pv_rope_kv_write_args a = {
            .kv_dtype = m->opt.kv_dtype, .n_tokens = T, .n_heads = (int32_t)hp->n_heads,
            .n_kv_heads = (int32_t)hp->n_kv_heads, .head_dim = (int32_t)hp->head_dim,
            .chunk_tokens = m->opt.chunk_tokens, .base = hp->rope_base, .neox = 0, .q = m->q, .k = m->k,
            .v = m->v, .kv_pool = b->kv_pool, .n_slots = b->n_slots, .token_seq = b->token_seq,
            .token_pos = b->token_pos, .slot_table = table, .n_seqs = b->n_seqs, .max_chunks = b->max_chunks,
        };
        return pv_rope_kv_write(m->be, &a);
    }
    pv_rope_args rq = {.n_tokens = T, .n_heads = (int32_t)hp->n_heads, .head_dim = (int32_t)hp->head_dim,
                       .base = hp->rope_base, .neox = 0, .x = m->q, .pos = b->token_pos};
    pv_rope_args rk = rq;
    rk.n_heads = (int32_t)hp->n_kv_heads;
    rk.x = m->k;
    pv_kv_write_args w = {
        .kv_dtype = m->opt.kv_dtype, .n_tokens = T, .n_kv_heads = (int32_t)hp->n_kv_heads,
        .head_dim = (int32_t)hp->head_dim, .chunk_tokens = m->opt.chunk_tokens,
        .k = m->k, .v = m->v, .kv_pool = b->kv_pool, .n_slots = b->n_slots,
        .token_seq = b->token_seq, .token_pos = b->token_pos, .slot_table = table,
        .n_seqs = b->n_seqs, .max_chunks = b->max_chunks,
    };
    pv_status st;
    if ((st = pv_rope(m->be, &rq)) != PV_OK || (st = pv_rope(m->be, &rk)) != PV_OK)
        return st;
    return pv_kv_write(m->be, &w);
}

/* The products of h (Q, K and V) where `norm` is NULL and h holds their
 * input; else of h = rmsnorm(x += proj) * norm, the residual add and norm
 * before them, fused with them where the model fuses (the norm's kernel
 * then rounds h for the products where they take it rounded). */
static pv_status normed_group(pv_llama *m, int64_t T, const pv_buffer *norm, const llama_weight *const *ws,
                              pv_buffer *const *ys, const int64_t *n_outs, int n)
{
    pv_qmatmul_args q[PV_QMATMUL_GROUP_MAX];
    if (norm && m->fuse_add_norm && group_args(m, m->h, ws, ys, n_outs, n, T, m->hp.n_embd, q)) {
        const pv_add_rmsnorm_args a = residual_args(m, T, norm);
        return pv_add_rmsnorm_group(m->be, &a, q, n);
    }
    pv_status st = norm ? residual(m, T, norm) : PV_OK;
    return st == PV_OK ? linear_group(m, m->h, ws, ys, n_outs, n, T, m->hp.n_embd) : st;
}

/* Layer l's attention block: its input is h, or with `norm` the residual
 * add and norm that give h (normed_group); leaves the block's output in
 * proj, to be added to x. */
static pv_status attention_block(pv_llama *m, const pv_llama_batch *b, uint32_t l, const pv_buffer *norm)
{
    const pv_llama_hparams *hp = &m->hp;
    const llama_layer *L = &m->layers[l];
    const int32_t T = b->n_tokens;
    const int64_t q_dim = (int64_t)hp->n_heads * hp->head_dim;
    const int64_t kv_dim = (int64_t)hp->n_kv_heads * hp->head_dim;
    const int32_t *table = b->slot_tables + (int64_t)l * b->n_seqs * b->max_chunks;
    pv_status st;

    const llama_weight *qkv[3] = {&L->wq, &L->wk, &L->wv};
    pv_buffer *qkv_out[3] = {m->q, m->k, m->v};
    if ((st = normed_group(m, T, norm, qkv, qkv_out, (const int64_t[]){q_dim, kv_dim, kv_dim}, 3)) != PV_OK)
        return st;

    if (b->before_layer && (st = b->before_layer(b->before_layer_ctx, l)) != PV_OK)
        return st;
    /* This batch's K/V go into the pool first, so its tokens see each other. */
    if ((st = rope_and_write(m, b, table)) != PV_OK)
        return st;

    pv_attention_args a = {
        .kv_dtype = m->opt.kv_dtype, .n_tokens = T, .n_heads = (int32_t)hp->n_heads,
        .n_kv_heads = (int32_t)hp->n_kv_heads, .head_dim = (int32_t)hp->head_dim,
        .chunk_tokens = m->opt.chunk_tokens, .scale = 1.0f / sqrtf((float)hp->head_dim),
        .q = m->q, .kv_pool = b->kv_pool, .n_slots = b->n_slots,
        .token_seq = b->token_seq, .token_pos = b->token_pos, .slot_table = table,
        .n_seqs = b->n_seqs, .max_chunks = b->max_chunks, .out = m->att,
    };
    /* with the output projection where the model fuses (the attention's
     * combining kernel then rounds its output where the product takes it
     * rounded) */
    const llama_weight *wo = &L->wo;
    const int64_t n_embd = hp->n_embd;
    pv_qmatmul_args product;
    if (m->opt.fuse && group_args(m, m->att, &wo, &m->proj, &n_embd, 1, T, q_dim, &product))
        return pv_attention_qmatmul(m->be, &a, &product);
    if ((st = pv_attention(m->be, &a)) != PV_OK)
        return st;
    return linear(m, m->att, &L->wo, m->proj, T, q_dim, hp->n_embd);
}

/* gate = silu(h Wg^T) * (h Wu^T) of h = rmsnorm(x += proj) * ffn_norm:
 * where the model fuses and both matrices are of one type the backend's
 * qmatmul reads, the residual add, the norm and the SwiGLU product are one
 * op (the norm's kernel then rounds h where the product takes it
 * rounded); widened matrices take the GEMM path, unfused. */
static pv_status swiglu_product(pv_llama *m, const llama_layer *L, int32_t T)
{
    const pv_llama_hparams *hp = &m->hp;
    const pv_wtype t = L->w_gate.type;
    pv_status st;
    if (m->opt.fuse && L->w_up.type == t && (t != PV_W_F32 || m->qmatmul_f32) &&
        pv_backend_supports_weights(m->be, PV_OP_QMATMUL_SWIGLU, t)) {
        pv_qmatmul_swiglu_args a = {.w_type = t, .n_tokens = T, .n_in = hp->n_embd, .n_out = hp->n_ff,
                                    .w_gate = L->w_gate.buf, .w_gate_off = L->w_gate.off, .w_up = L->w_up.buf,
                                    .w_up_off = L->w_up.off, .x = m->h, .y = m->gate, .up = m->up};
        if (m->fuse_add_norm) {
            const pv_add_rmsnorm_args norm = residual_args(m, T, L->ffn_norm);
            return pv_add_rmsnorm_swiglu(m->be, &norm, &a);
        }
        return (st = residual(m, T, L->ffn_norm)) == PV_OK ? pv_qmatmul_swiglu(m->be, &a) : st;
    }
    pv_swiglu_args s = {.n = (int64_t)T * hp->n_ff, .gate = m->gate, .up = m->up, .out = m->gate};
    const llama_weight *gate_up[2] = {&L->w_gate, &L->w_up};
    pv_buffer *gate_up_out[2] = {m->gate, m->up};
    st = normed_group(m, T, L->ffn_norm, gate_up, gate_up_out, (const int64_t[]){hp->n_ff, hp->n_ff}, 2);
    return st == PV_OK ? pv_swiglu(m->be, &s) : st;
}

/* Layer l's feed-forward block, from the attention block's output in proj
 * (swiglu_product adds it and norms); leaves its own output in proj. */
static pv_status ffn_block(pv_llama *m, int32_t T, uint32_t l)
{
    const llama_layer *L = &m->layers[l];
    pv_status st = swiglu_product(m, L, T);
    return st == PV_OK ? linear(m, m->gate, &L->w_down, m->proj, T, m->hp.n_ff, m->hp.n_embd) : st;
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
    if (b->pad_decode && (b->pad_slot < 0 || b->pad_slot >= b->n_slots))
        return pv_error(PV_ERR_INVALID_ARG, "pv_llama_forward: pad_slot = %" PRId64 " out of range [0, %" PRId64 ")",
                        b->pad_slot, b->n_slots);
    return PV_OK;
}

int32_t pv_llama_decode_bucket(int32_t n)
{
    if (n > PV_LLAMA_GRAPH_MAX_TOKENS)
        return n;
    if (n <= 8) {
        int32_t b = 1;
        while (b < n)
            b *= 2;
        return b;
    }
    return (n + 7) / 8 * 8;
}

uint64_t pv_llama_padded_rows(const pv_llama *m)
{
    return m ? m->padded_rows : 0;
}

/* Grows *buf to hold n int32s. */
static pv_status reserve_ints(int32_t **buf, size_t *cap, size_t n)
{
    if (n <= *cap)
        return PV_OK;
    int32_t *grown = realloc(*buf, n * sizeof *grown);
    if (!grown)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_llama_forward: %zu padded batch entries", n);
    *buf = grown;
    *cap = n;
    return PV_OK;
}

/* *run = b, or where b is a decode step the options pad (graph_buckets:
 * 1 when it runs as a graph, 2 always), *padded: b's rows and tables with
 * rows of token 0 at position 0 after them up to its bucket, each its own
 * sequence whose one chunk is b->pad_slot, each wanting logits. The
 * caller's rows keep their places, so their values and logits rows are
 * theirs; the pad rows' are never read. */
static pv_status pad_decode(pv_llama *m, const pv_llama_batch *b, int graph, pv_llama_batch *padded,
                            const pv_llama_batch **run)
{
    *run = b;
    const int32_t n = b->n_tokens, bucket = pv_llama_decode_bucket(n);
    const int wanted = m->opt.graph_buckets == 2 || (m->opt.graph_buckets == 1 && graph);
    if (!wanted || !b->pad_decode || bucket == n || bucket > PV_LLAMA_GRAPH_MAX_TOKENS ||
        bucket > m->opt.max_batch_tokens || bucket > m->opt.max_logit_rows || b->n_seqs != n ||
        b->n_logits != n || b->max_chunks < 1)
        return PV_OK;
    for (int32_t i = 0; i < n; i++)
        if (b->token_seq[i] != i || b->logit_rows[i] != i)
            return PV_OK;
    const size_t width = (size_t)b->max_chunks, layers = m->hp.n_layers;
    PV_TRY(reserve_ints(&m->pad_rows, &m->pad_rows_cap, 4 * (size_t)bucket));
    PV_TRY(reserve_ints(&m->pad_tables, &m->pad_tables_cap, layers * (size_t)bucket * width));
    int32_t *tokens = m->pad_rows, *seqs = tokens + bucket, *pos = seqs + bucket, *rows = pos + bucket;
    for (int32_t i = 0; i < bucket; i++) {
        tokens[i] = i < n ? b->tokens[i] : 0;
        seqs[i] = i;
        pos[i] = i < n ? b->token_pos[i] : 0;
        rows[i] = i;
    }
    for (size_t l = 0; l < layers; l++) {
        int32_t *t = m->pad_tables + l * (size_t)bucket * width;
        memcpy(t, b->slot_tables + l * (size_t)n * width, (size_t)n * width * sizeof *t);
        for (size_t r = (size_t)n; r < (size_t)bucket; r++) {
            t[r * width] = (int32_t)b->pad_slot;
            for (size_t c = 1; c < width; c++)
                t[r * width + c] = -1;
        }
    }
    *padded = *b;
    padded->n_tokens = padded->n_seqs = padded->n_logits = bucket;
    padded->tokens = tokens;
    padded->token_seq = seqs;
    padded->token_pos = pos;
    padded->logit_rows = rows;
    padded->slot_tables = m->pad_tables;
    padded->logits = NULL;
    m->padded_rows += (uint64_t)(bucket - n);
    *run = padded;
    return PV_OK;
}

/* Everything a forward pass enqueues: the embedding, the layers, and the
 * logits of the rows that want them (left in m->logits). */
static pv_status forward_ops(pv_llama *m, const pv_llama_batch *b)
{
    pv_status st;
    const pv_llama_hparams *hp = &m->hp;
    const int32_t T = b->n_tokens;

    pv_embed_gather_args e = {.table_type = m->tok_embd.type, .n_rows = hp->n_vocab, .dim = hp->n_embd,
                              .table = m->tok_embd.buf, .table_off = m->tok_embd.off, .ids = b->tokens, .n_ids = T,
                              .ids_dev = b->prev_tokens, .n_ids_dev = b->n_prev_tokens, .out = m->x};
    /* Each block's residual add goes with the next block's norm and the
     * products of its output (fused where the backend can), so only the
     * first norm stands alone, and the last add. */
    if ((st = pv_embed_gather(m->be, &e)) != PV_OK || (st = rmsnorm(m, m->x, m->layers[0].attn_norm, m->h, T)) != PV_OK)
        return st;
    for (uint32_t l = 0; l < hp->n_layers; l++)
        if ((st = attention_block(m, b, l, l > 0 ? m->layers[l].attn_norm : NULL)) != PV_OK ||
            (st = ffn_block(m, T, l)) != PV_OK)
            return st;
    if ((st = residual(m, T, NULL)) != PV_OK)
        return st;
    if (b->n_logits == 0)
        return PV_OK;

    /* Only the rows that want logits go through the output projection: the
     * last residual stays a plain add over all rows, as its norm is the
     * output norm of the picked rows only. */
    pv_embed_gather_args pick = {.table_type = PV_W_F32, .n_rows = T, .dim = hp->n_embd,
                                 .table = m->x, .ids = b->logit_rows, .n_ids = b->n_logits,
                                 .out = m->sel};
    if ((st = pv_embed_gather(m->be, &pick)) != PV_OK ||
        (st = rmsnorm(m, m->sel, m->output_norm, m->sel, b->n_logits)) != PV_OK ||
        (st = linear(m, m->sel, &m->output, m->logits, b->n_logits, hp->n_embd, hp->n_vocab)) != PV_OK)
        return st;
    return PV_OK;
}

/* forward_ops recorded as one graph: PV_OK with *ran = 0 when the backend
 * could not record it (nothing ran; the caller enqueues it op by op). Steps
 * of one shape (tokens, sequences, chunks, logit rows) share the graph the
 * backend keeps under their key. */
static pv_status forward_graph(pv_llama *m, const pv_llama_batch *b, int *ran)
{
    *ran = 0;
    const uint64_t key = (uint64_t)b->n_tokens | (uint64_t)b->n_logits << 16 | (uint64_t)b->n_seqs << 32 |
                         (uint64_t)(b->max_chunks & 0xffff) << 48;
    if (pv_backend_graph_begin(m->be, key) != PV_OK)
        return PV_OK;
    const pv_status st = forward_ops(m, b);
    const pv_status end = pv_backend_graph_end(m->be, st == PV_OK, ran);
    if (end != PV_OK)
        return end;
    if (!*ran) { /* the ops run again; the reason is kept for pv_llama_graph_failure */
        snprintf(m->graph_failure, sizeof m->graph_failure, "%s",
                 pv_last_error()[0] ? pv_last_error() : "the backend recorded nothing");
        pv_clear_error();
    }
    return PV_OK;
}

pv_status pv_llama_forward(pv_llama *m, const pv_llama_batch *b)
{
    if (!m)
        return pv_error(PV_ERR_INVALID_ARG, "pv_llama_forward: model is NULL");
    pv_status st = check_batch(m, b);
    if (st != PV_OK)
        return st;
    int ran = 0;
    const int graph = m->opt.graphs && pv_backend_graphs(m->be);
    pv_llama_batch padded;
    const pv_llama_batch *run = b;
    if ((st = pad_decode(m, b, graph, &padded, &run)) != PV_OK)
        return st;
    if (graph && run->n_tokens <= PV_LLAMA_GRAPH_MAX_TOKENS && (st = forward_graph(m, run, &ran)) != PV_OK)
        return st;
    if (!ran && (st = forward_ops(m, run)) != PV_OK)
        return st;
    /* the caller's rows only: a padded step's first n_logits rows */
    if (b->n_logits > 0 && b->logits)
        return pv_buffer_read(m->logits, 0, b->logits,
                              (uint64_t)b->n_logits * m->hp.n_vocab * sizeof(float));
    return PV_OK;
}
