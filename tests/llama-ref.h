/* Contiguous host reference of the Llama forward pass (test oracle). */
#ifndef PV_TESTS_LLAMA_REF_H
#define PV_TESTS_LLAMA_REF_H

#include <pensieve/gguf.h>

typedef struct llama_ref_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w_gate, *w_up, *w_down;
    float *k_cache, *v_cache; /* [max_pos][n_kv_heads][head_dim] */
} llama_ref_layer;

typedef struct llama_ref {
    pv_llama_hparams hp;
    int max_pos;
    float *embd, *out_norm, *out;
    llama_ref_layer *layers;
} llama_ref;

pv_status llama_ref_init(llama_ref *r, const pv_gguf *g, int max_pos);
void llama_ref_free(llama_ref *r);

/* Run token at position pos (all earlier positions must have been run);
 * logits [n_vocab] may be NULL. */
pv_status llama_ref_step(llama_ref *r, int token, int pos, float *logits);

#endif
