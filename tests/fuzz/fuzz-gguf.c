/* libFuzzer target: the GGUF reader on arbitrary bytes, then everything a
 * model load asks of a parsed file (typed getters, array elements, tensor
 * decoding, the Llama hyperparameters, the tokenizer), since those walk
 * offsets and counts that came from the file. Any status is fine; a crash,
 * a sanitizer report or a leak is not. */
#include <pensieve/gguf.h>
#include <pensieve/tokenizer.h>

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Decoding is bounded so that a file declaring a huge tensor costs its
 * bytes (which the reader has checked exist), not gigabytes of output. */
#define MAX_DECODE_ELEMS (1u << 16)
#define MAX_ARRAY_ELEMS 64

static void array_element(const pv_gguf_kv *kv, uint64_t i)
{
    int64_t i64;
    double f64;
    const char *str;
    uint64_t len;
    (void)pv_gguf_array_int(kv, i, &i64);
    (void)pv_gguf_array_float(kv, i, &f64);
    (void)pv_gguf_array_string(kv, i, &str, &len);
}

static void exercise_kv(const pv_gguf *g, const pv_gguf_kv *kv)
{
    uint32_t u32;
    int64_t i64;
    float f32;
    int b;
    const char *str;
    uint64_t len, count;
    pv_gguf_type elem;
    (void)pv_gguf_get_u32(g, kv->key, &u32);
    (void)pv_gguf_get_i64(g, kv->key, &i64);
    (void)pv_gguf_get_f32(g, kv->key, &f32);
    (void)pv_gguf_get_bool(g, kv->key, &b);
    (void)pv_gguf_get_string(g, kv->key, &str, &len);
    if (pv_gguf_get_array(g, kv->key, &elem, &count) != PV_OK)
        return;
    uint64_t n = count < MAX_ARRAY_ELEMS ? count : MAX_ARRAY_ELEMS;
    for (uint64_t i = 0; i < n; i++)
        array_element(kv, i);
    /* The last element and one past it: off-by-ones live there. */
    if (count > 0)
        array_element(kv, count - 1);
    array_element(kv, count);
}

static void exercise_tensor(const pv_gguf *g, const pv_gguf_tensor *t)
{
    if (pv_gguf_find_tensor(g, t->name) == NULL)
        abort(); /* a tensor the reader listed must be found by its name */
    if (t->n_elements == 0 || t->n_elements > MAX_DECODE_ELEMS)
        return;
    float *f = malloc(t->n_elements * sizeof *f);
    pv_half *h = malloc(t->n_elements * sizeof *h);
    if (f && h) {
        (void)pv_gguf_tensor_f32(t, f, t->n_elements);
        (void)pv_gguf_tensor_f16(t, h, t->n_elements);
        uint64_t rows = t->n_elements / (t->ne[0] ? t->ne[0] : 1);
        (void)pv_gguf_tensor_rows_f32(t, rows ? rows - 1 : 0, 1, f);
    }
    free(f);
    free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pv_gguf g;
    if (pv_gguf_init_memory(&g, data, size) != PV_OK)
        return 0;
    for (uint64_t i = 0; i < g.n_kv; i++)
        exercise_kv(&g, &g.kv[i]);
    for (uint64_t i = 0; i < g.n_tensors; i++)
        exercise_tensor(&g, &g.tensors[i]);
    pv_llama_hparams hp;
    (void)pv_llama_hparams_read(&g, &hp);
    pv_tokenizer tok;
    if (pv_tokenizer_init(&tok, &g) == PV_OK) {
        /* A few bytes through the file's vocabulary and merges. */
        static const char text[] = "Hello world 123 <|im_end|> \xc3\xa9\xff";
        int32_t ids[sizeof text];
        size_t n = 0, len;
        char back[4 * sizeof text];
        if (pv_tokenizer_encode(&tok, text, sizeof text - 1, PV_TOKENIZE_PARSE_SPECIAL | PV_TOKENIZE_ADD_BOS,
                                ids, sizeof text, &n) == PV_OK)
            (void)pv_tokenizer_decode(&tok, ids, n, PV_DECODE_SPECIAL, back, sizeof back, &len);
        pv_tokenizer_free(&tok);
    }
    pv_gguf_free(&g);
    return 0;
}
