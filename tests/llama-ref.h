/* Contiguous host reference of the Llama forward pass (test oracle). */
#ifndef PV_TESTS_LLAMA_REF_H
#define PV_TESTS_LLAMA_REF_H

#include <pensieve/gguf.h>

typedef struct llama_ref_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w_gate, *w_up, *w_down;
    /* whether each of wq, wk, wv, wo, w_gate, w_up, w_down is a block type */
    int blocks[7];
    float *k_cache, *v_cache; /* [max_pos][n_kv_heads][head_dim] */
} llama_ref_layer;

typedef struct llama_ref {
    pv_llama_hparams hp;
    int max_pos;
    float *embd, *out_norm, *out;
    int out_blocks;
    llama_ref_layer *layers;
    /* Round the input of every block-type matrix as backends that report
     * activation_bits 16 do (llama_ref_round16); 0 (no rounding) by default. */
    int activation_bits;
} llama_ref;

/* x[n] (whole blocks of 32) as 16-bit activations hold it (backend.h): per
 * block, d1 = max |x| / 127 (0 below 256 FLT_MIN), hi = round-to-even(x / d1),
 * lo = round-to-even(fma(-d1, hi, x) * 256 / d1) within [-127, 127], and
 * out = d1 / 256 * (256 hi + lo). */
void llama_ref_round16(const float *x, float *out, size_t n);

pv_status llama_ref_init(llama_ref *r, const pv_gguf *g, int max_pos);
void llama_ref_free(llama_ref *r);

/* Run token at position pos (all earlier positions must have been run);
 * logits [n_vocab] may be NULL. */
pv_status llama_ref_step(llama_ref *r, int token, int pos, float *logits);

#endif
