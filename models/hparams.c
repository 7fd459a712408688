/* Llama hyperparameters from GGUF metadata, checked against the tensors the
 * forward pass will look up, so a bad file fails here with a clear message
 * rather than deep inside a GEMM. */
#include <pensieve/gguf.h>

#include "models/byte-level.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static pv_status get_u32_default(const pv_gguf *g, const char *key, uint32_t dflt, uint32_t *out)
{
    if (!pv_gguf_find(g, key)) {
        *out = dflt;
        return PV_OK;
    }
    return pv_gguf_get_u32(g, key, out);
}

/* The tensor exists, is 1-D/2-D as asked and has the expected shape. */
static pv_status expect_tensor(const pv_gguf *g, const char *name, uint64_t ne0, uint64_t ne1)
{
    const pv_gguf_tensor *t;
    pv_status st = pv_gguf_get_tensor(g, name, &t);
    if (st != PV_OK)
        return st;
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return pv_error(PV_ERR_FORMAT, "%s: tensor '%s' has shape [%" PRIu64 ", %" PRIu64 ", %"
                        PRIu64 ", %" PRIu64 "], expected [%" PRIu64 ", %" PRIu64 "]",
                        g->path, name, t->ne[0], t->ne[1], t->ne[2], t->ne[3], ne0, ne1);
    return PV_OK;
}

pv_status pv_llama_hparams_read(const pv_gguf *g, pv_llama_hparams *hp)
{
    if (!g || !hp)
        return pv_error(PV_ERR_INVALID_ARG, "pv_llama_hparams_read: NULL argument");
    memset(hp, 0, sizeof *hp);
    const char *arch;
    uint64_t arch_len;
    pv_status st = pv_gguf_get_string(g, "general.architecture", &arch, &arch_len);
    if (st != PV_OK)
        return st;
    if (arch_len != 5 || memcmp(arch, "llama", 5) != 0)
        return pv_error(PV_ERR_UNSUPPORTED, "%s: general.architecture is '%s'; only 'llama' is "
                        "supported", g->path, pv_printable(arch, arch_len));
    if ((st = pv_gguf_get_u32(g, "llama.embedding_length", &hp->n_embd)) != PV_OK ||
        (st = pv_gguf_get_u32(g, "llama.block_count", &hp->n_layers)) != PV_OK ||
        (st = pv_gguf_get_u32(g, "llama.attention.head_count", &hp->n_heads)) != PV_OK ||
        (st = pv_gguf_get_u32(g, "llama.feed_forward_length", &hp->n_ff)) != PV_OK ||
        (st = pv_gguf_get_u32(g, "llama.context_length", &hp->n_ctx_train)) != PV_OK ||
        (st = get_u32_default(g, "llama.attention.head_count_kv", hp->n_heads,
                              &hp->n_kv_heads)) != PV_OK ||
        (st = pv_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &hp->norm_eps)) != PV_OK)
        return st;
    hp->rope_base = 10000.0f;
    if (pv_gguf_find(g, "llama.rope.freq_base") &&
        (st = pv_gguf_get_f32(g, "llama.rope.freq_base", &hp->rope_base)) != PV_OK)
        return st;
    if (hp->n_embd == 0 || hp->n_layers == 0 || hp->n_heads == 0 || hp->n_kv_heads == 0 ||
        hp->n_ff == 0)
        return pv_error(PV_ERR_FORMAT, "%s: zero size: embedding %u, layers %u, heads %u, "
                        "kv heads %u, ffn %u", g->path, hp->n_embd, hp->n_layers, hp->n_heads,
                        hp->n_kv_heads, hp->n_ff);
    if (hp->n_embd % hp->n_heads != 0 || hp->n_heads % hp->n_kv_heads != 0)
        return pv_error(PV_ERR_FORMAT, "%s: %u heads must divide the width %u and %u kv heads "
                        "must divide the heads", g->path, hp->n_heads, hp->n_embd, hp->n_kv_heads);
    hp->head_dim = hp->n_embd / hp->n_heads;
    if ((st = get_u32_default(g, "llama.rope.dimension_count", hp->head_dim, &hp->rope_dim)) != PV_OK)
        return st;
    if (hp->rope_dim == 0 || hp->rope_dim > hp->head_dim || hp->rope_dim % 2 != 0)
        return pv_error(PV_ERR_FORMAT, "%s: llama.rope.dimension_count %u must be even and "
                        "within the head size %u", g->path, hp->rope_dim, hp->head_dim);
    if (!(hp->norm_eps > 0.0f) || !(hp->rope_base > 0.0f))
        return pv_error(PV_ERR_FORMAT, "%s: norm epsilon %g and rope base %g must be positive",
                        g->path, (double)hp->norm_eps, (double)hp->rope_base);

    const pv_gguf_tensor *embd;
    if ((st = pv_gguf_get_tensor(g, "token_embd.weight", &embd)) != PV_OK)
        return st;
    if (embd->ne[1] > UINT32_MAX)
        return pv_error(PV_ERR_FORMAT, "%s: token_embd.weight has %" PRIu64 " rows", g->path,
                        embd->ne[1]);
    hp->n_vocab = (uint32_t)embd->ne[1];
    if (pv_gguf_find(g, "llama.vocab_size")) {
        uint32_t v;
        if ((st = pv_gguf_get_u32(g, "llama.vocab_size", &v)) != PV_OK)
            return st;
        if (v != hp->n_vocab)
            return pv_error(PV_ERR_FORMAT, "%s: llama.vocab_size %u but token_embd.weight has %u "
                            "rows", g->path, v, hp->n_vocab);
    }
    /* Ids from the tokenizer index the embedding and ids the model emits
     * index the vocabulary: a difference fails only mid-run, so refuse it
     * here. */
    const pv_gguf_kv *tokens = pv_gguf_find(g, "tokenizer.ggml.tokens");
    if (tokens && (tokens->type != PV_GGUF_ARRAY || tokens->array_len != hp->n_vocab))
        return pv_error(PV_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %" PRIu64 " tokens but "
                        "tensor 'token_embd.weight' has %u rows (one per token)", g->path,
                        tokens->type == PV_GGUF_ARRAY ? tokens->array_len : 0, hp->n_vocab);
    uint32_t kv_dim = hp->n_kv_heads * hp->head_dim;
    if ((st = expect_tensor(g, "token_embd.weight", hp->n_embd, hp->n_vocab)) != PV_OK ||
        (st = expect_tensor(g, "output_norm.weight", hp->n_embd, 1)) != PV_OK)
        return st;
    hp->tied_embeddings = pv_gguf_find_tensor(g, "output.weight") == NULL;
    if (!hp->tied_embeddings &&
        (st = expect_tensor(g, "output.weight", hp->n_embd, hp->n_vocab)) != PV_OK)
        return st;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        static const struct { const char *suffix; int in, out; } shapes[] = {
            /* 0 = n_embd, 1 = kv_dim, 2 = n_ff, 3 = 1 */
            {"attn_norm.weight", 0, 3}, {"attn_q.weight", 0, 0}, {"attn_k.weight", 0, 1},
            {"attn_v.weight", 0, 1},    {"attn_output.weight", 0, 0}, {"ffn_norm.weight", 0, 3},
            {"ffn_gate.weight", 0, 2},  {"ffn_up.weight", 0, 2},  {"ffn_down.weight", 2, 0},
        };
        uint64_t dims[4] = {hp->n_embd, kv_dim, hp->n_ff, 1};
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%u.%s", l, shapes[i].suffix);
            if ((st = expect_tensor(g, name, dims[shapes[i].in], dims[shapes[i].out])) != PV_OK)
                return st;
        }
    }
    return PV_OK;
}
