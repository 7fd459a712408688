/* A plain contiguous Llama forward pass on the host, in the manner of
 * llama2.c: one token at a time, K/V in contiguous per-layer arrays, sums in
 * double. It shares no code with models/llama.c or any backend, so it is the
 * oracle the paged forward pass is checked against. */
#include "llama-ref.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *load(const pv_gguf *g, const char *name, pv_status *st)
{
    const pv_gguf_tensor *t;
    if (*st != PV_OK || (*st = pv_gguf_get_tensor(g, name, &t)) != PV_OK)
        return NULL;
    float *w = malloc(t->n_elements * sizeof *w);
    if (!w) {
        *st = pv_error(PV_ERR_OUT_OF_MEMORY, "llama-ref: %s", name);
        return NULL;
    }
    if ((*st = pv_gguf_tensor_f32(t, w, t->n_elements)) != PV_OK) {
        free(w);
        return NULL;
    }
    return w;
}

static float *load_layer(const pv_gguf *g, int l, const char *what, pv_status *st)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, what);
    return load(g, name, st);
}

/* Whether tensor `name` is stored in a type of 32-element blocks. */
static int block_type(const pv_gguf *g, const char *name)
{
    const pv_gguf_tensor *t;
    uint32_t elems = 1, bytes = 0;
    return pv_gguf_get_tensor(g, name, &t) == PV_OK && pv_ggml_type_block(t->type, &elems, &bytes) == PV_OK &&
           elems == 32;
}

pv_status llama_ref_init(llama_ref *r, const pv_gguf *g, int max_pos)
{
    memset(r, 0, sizeof *r);
    pv_status st = pv_llama_hparams_read(g, &r->hp);
    if (st != PV_OK)
        return st;
    const pv_llama_hparams *hp = &r->hp;
    r->max_pos = max_pos;
    r->embd = load(g, "token_embd.weight", &st);
    r->out_norm = load(g, "output_norm.weight", &st);
    r->out = hp->tied_embeddings ? r->embd : load(g, "output.weight", &st);
    r->out_blocks = block_type(g, hp->tied_embeddings ? "token_embd.weight" : "output.weight");
    r->layers = calloc(hp->n_layers, sizeof *r->layers);
    if (!r->layers)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "llama-ref: layers");
    size_t kv = (size_t)max_pos * hp->n_kv_heads * hp->head_dim;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        llama_ref_layer *L = &r->layers[l];
        static const char *const matrices[7] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                 "ffn_gate", "ffn_up", "ffn_down"};
        for (int i = 0; i < 7; i++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%u.%s.weight", l, matrices[i]);
            L->blocks[i] = block_type(g, name);
        }
        L->attn_norm = load_layer(g, (int)l, "attn_norm", &st);
        L->wq = load_layer(g, (int)l, "attn_q", &st);
        L->wk = load_layer(g, (int)l, "attn_k", &st);
        L->wv = load_layer(g, (int)l, "attn_v", &st);
        L->wo = load_layer(g, (int)l, "attn_output", &st);
        L->ffn_norm = load_layer(g, (int)l, "ffn_norm", &st);
        L->w_gate = load_layer(g, (int)l, "ffn_gate", &st);
        L->w_up = load_layer(g, (int)l, "ffn_up", &st);
        L->w_down = load_layer(g, (int)l, "ffn_down", &st);
        L->k_cache = calloc(kv, sizeof(float));
        L->v_cache = calloc(kv, sizeof(float));
        if (st == PV_OK && (!L->k_cache || !L->v_cache))
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "llama-ref: kv cache");
    }
    return st;
}

void llama_ref_free(llama_ref *r)
{
    if (r->layers) {
        for (uint32_t l = 0; l < r->hp.n_layers; l++) {
            llama_ref_layer *L = &r->layers[l];
            float *p[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->ffn_norm,
                          L->w_gate, L->w_up, L->w_down, L->k_cache, L->v_cache};
            for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
                free(p[i]);
        }
        free(r->layers);
    }
    if (r->out != r->embd)
        free(r->out);
    free(r->embd);
    free(r->out_norm);
    memset(r, 0, sizeof *r);
}

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        out[i] = x[i] * inv * w[i];
}

/* y[n_out] = W[n_out][n_in] x[n_in] */
static void matvec(float *y, const float *W, const float *x, int n_in, int n_out)
{
    for (int o = 0; o < n_out; o++) {
        double s = 0;
        const float *row = W + (size_t)o * n_in;
        for (int i = 0; i < n_in; i++)
            s += (double)row[i] * x[i];
        y[o] = (float)s;
    }
}

void llama_ref_round16(const float *x, float *out, size_t n)
{
    for (size_t b = 0; b + 32 <= n; b += 32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fabsf(x[b + j]) > amax ? fabsf(x[b + j]) : amax;
        const float d1 = amax / 127.0f >= 256.0f * FLT_MIN ? amax / 127.0f : 0.0f;
        const float inv = d1 > 0.0f ? 1.0f / d1 : 0.0f;
        for (int j = 0; j < 32; j++) {
            const float hi = nearbyintf(x[b + j] * inv);
            const float lo = fminf(fmaxf(nearbyintf(fmaf(-d1, hi, x[b + j]) * (inv * 256.0f)), -127.0f), 127.0f);
            out[b + j] = d1 / 256.0f * (256.0f * hi + lo);
        }
    }
}

/* matvec with x rounded to 16 bits per block of 32 when `round16` (n_in is
 * then a multiple of 32; llama_ref_round16). */
static void matvec_q(float *y, const float *W, const float *x, int n_in, int n_out, int round16)
{
    if (!round16) {
        matvec(y, W, x, n_in, n_out);
        return;
    }
    float *xr = malloc(sizeof(float) * (size_t)n_in);
    if (!xr) {
        for (int o = 0; o < n_out; o++)
            y[o] = NAN; /* fails the comparison loudly */
        return;
    }
    llama_ref_round16(x, xr, (size_t)n_in);
    matvec(y, W, xr, n_in, n_out);
    free(xr);
}

/* Adjacent-pair rotation, as GGUF Llama weights expect. */
static void rope(float *v, int n_heads, int head_dim, int pos, float base)
{
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < head_dim / 2; i++) {
            double theta = pos * pow(base, -2.0 * i / head_dim);
            double c = cos(theta), s = sin(theta);
            float *p = v + h * head_dim + 2 * i;
            float a = p[0], b = p[1];
            p[0] = (float)(a * c - b * s);
            p[1] = (float)(a * s + b * c);
        }
}

pv_status llama_ref_step(llama_ref *r, int token, int pos, float *logits)
{
    const pv_llama_hparams *hp = &r->hp;
    if (pos < 0 || pos >= r->max_pos || token < 0 || (uint32_t)token >= hp->n_vocab)
        return pv_error(PV_ERR_INVALID_ARG, "llama-ref: token %d or position %d out of range", token,
                        pos);
    const int dim = (int)hp->n_embd, hd = (int)hp->head_dim, nh = (int)hp->n_heads;
    const int nkv = (int)hp->n_kv_heads, ff = (int)hp->n_ff, group = nh / nkv;
    const int kv_dim = nkv * hd;
    float *x = malloc(sizeof(float) * dim), *h = malloc(sizeof(float) * dim);
    float *q = malloc(sizeof(float) * nh * hd), *att = malloc(sizeof(float) * nh * hd);
    float *proj = malloc(sizeof(float) * dim), *g = malloc(sizeof(float) * ff);
    float *u = malloc(sizeof(float) * ff);
    double *scores = malloc(sizeof(double) * (pos + 1));
    if (!x || !h || !q || !att || !proj || !g || !u || !scores) {
        free(x), free(h), free(q), free(att), free(proj), free(g), free(u), free(scores);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "llama-ref: step buffers");
    }
    memcpy(x, r->embd + (size_t)token * dim, sizeof(float) * dim);
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        llama_ref_layer *L = &r->layers[l];
        float *kc = L->k_cache + (size_t)pos * kv_dim, *vc = L->v_cache + (size_t)pos * kv_dim;
        rmsnorm(h, x, L->attn_norm, dim, hp->norm_eps);
        matvec_q(q, L->wq, h, dim, nh * hd, L->blocks[0] && r->activation_bits == 16);
        matvec_q(kc, L->wk, h, dim, kv_dim, L->blocks[1] && r->activation_bits == 16);
        matvec_q(vc, L->wv, h, dim, kv_dim, L->blocks[2] && r->activation_bits == 16);
        rope(q, nh, hd, pos, hp->rope_base);
        rope(kc, nkv, hd, pos, hp->rope_base);
        for (int head = 0; head < nh; head++) {
            const int kvh = head / group;
            const float *qh = q + head * hd;
            double mx = -INFINITY, sum = 0;
            for (int t = 0; t <= pos; t++) {
                const float *kt = L->k_cache + (size_t)t * kv_dim + kvh * hd;
                double s = 0;
                for (int d = 0; d < hd; d++)
                    s += (double)qh[d] * kt[d];
                scores[t] = s / sqrt((double)hd);
                if (scores[t] > mx)
                    mx = scores[t];
            }
            for (int t = 0; t <= pos; t++)
                sum += (scores[t] = exp(scores[t] - mx));
            for (int d = 0; d < hd; d++) {
                double o = 0;
                for (int t = 0; t <= pos; t++)
                    o += scores[t] * L->v_cache[(size_t)t * kv_dim + kvh * hd + d];
                att[head * hd + d] = (float)(o / sum);
            }
        }
        matvec_q(proj, L->wo, att, nh * hd, dim, L->blocks[3] && r->activation_bits == 16);
        for (int i = 0; i < dim; i++)
            x[i] += proj[i];
        rmsnorm(h, x, L->ffn_norm, dim, hp->norm_eps);
        matvec_q(g, L->w_gate, h, dim, ff, L->blocks[4] && r->activation_bits == 16);
        matvec_q(u, L->w_up, h, dim, ff, L->blocks[5] && r->activation_bits == 16);
        for (int i = 0; i < ff; i++)
            g[i] = (float)(g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
        matvec_q(proj, L->w_down, g, ff, dim, L->blocks[6] && r->activation_bits == 16);
        for (int i = 0; i < dim; i++)
            x[i] += proj[i];
    }
    if (logits) {
        rmsnorm(h, x, r->out_norm, dim, hp->norm_eps);
        matvec_q(logits, r->out, h, dim, (int)hp->n_vocab, r->out_blocks && r->activation_bits == 16);
    }
    free(x), free(h), free(q), free(att), free(proj), free(g), free(u), free(scores);
    return PV_OK;
}
