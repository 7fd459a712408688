/* The byte-level BPE tokenizer of GPT-2-style GGUF models (SmolLM2) and
 * their ChatML chat template, both read from GGUF metadata:
 *   tokenizer.ggml.model        "gpt2" (byte-level BPE; others unsupported)
 *   tokenizer.ggml.pre          pre-tokenizer: "smollm" (each digit alone,
 *                               then the GPT-2 split) or "gpt2" (also when
 *                               the key is absent); others unsupported
 *   tokenizer.ggml.tokens       token strings in the byte-level alphabet
 *   tokenizer.ggml.token_type   1 normal, 2 unknown, 3 control, 4 user
 *                               defined, 5 unused, 6 byte
 *   tokenizer.ggml.merges       "left right" pairs, lowest rank first
 *   tokenizer.ggml.{bos,eos,unknown,padding}_token_id, add_bos_token
 *   tokenizer.chat_template     Jinja text; the ChatML form is understood
 *
 * Text is bytes: invalid UTF-8 never fails or crashes encode; each invalid
 * byte becomes its own byte token, and decode gives those bytes back. A byte
 * the vocabulary has no token for is dropped, as the reference tokenizers
 * (Hugging Face tokenizers, llama.cpp) drop it. */
#ifndef PENSIEVE_TOKENIZER_H
#define PENSIEVE_TOKENIZER_H

#include <pensieve/gguf.h>
#include <pensieve/status.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- chat template ---------------------------------------------------------- */

typedef struct pv_chat_message {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content;
} pv_chat_message;

/* A ChatML template, reduced to what it renders:
 *   [<|im_start|>system\n DEFAULT <|im_end|>\n  when the first turn is not a system one]
 *   for each message: <|im_start|> ROLE \n CONTENT <|im_end|>\n
 *   [<|im_start|>assistant\n  with add_generation_prompt] */
typedef struct pv_chat_template {
    char *default_system; /* NULL when the template adds no default system turn */
} pv_chat_template;

/* Recognise a Jinja chat template. A template that is not ChatML-shaped (or
 * uses Jinja this reader does not understand) gives PV_ERR_UNSUPPORTED
 * naming the construct. */
pv_status pv_chat_template_init(pv_chat_template *t, const char *src, size_t len);
void pv_chat_template_free(pv_chat_template *t);

/* Render messages into out (cap bytes, NUL-terminated when it fits) and set
 * *len to the rendered length without the NUL. out may be NULL with cap 0 to
 * ask the length; a cap too small for len + 1 is PV_ERR_INVALID_ARG. */
pv_status pv_chat_template_apply(const pv_chat_template *t, const pv_chat_message *msgs,
                                 size_t n_msgs, int add_generation_prompt,
                                 char *out, size_t cap, size_t *len);

/* ---- tokenizer ------------------------------------------------------------- */

enum {
    PV_TOKEN_NORMAL = 1,
    PV_TOKEN_UNKNOWN = 2,
    PV_TOKEN_CONTROL = 3,
    PV_TOKEN_USER_DEFINED = 4,
    PV_TOKEN_UNUSED = 5,
    PV_TOKEN_BYTE = 6
};

/* Encode flags. */
#define PV_TOKENIZE_ADD_BOS 1u       /* prepend bos_id (whatever add_bos says) */
#define PV_TOKENIZE_PARSE_SPECIAL 2u /* text of control/user tokens ("<|im_end|>") becomes that token */

/* Decode flags. */
#define PV_DECODE_SPECIAL 1u /* render control tokens as their text; otherwise they decode to nothing */

typedef struct pv_tokenizer {
    uint32_t n_vocab;
    int32_t bos_id, eos_id, unk_id, pad_id; /* -1 when the file names none */
    int32_t im_start_id, im_end_id;         /* "<|im_start|>", "<|im_end|>" or -1 */
    int add_bos;                            /* tokenizer.ggml.add_bos_token */
    int has_chat_template;                  /* the template was recognised */
    pv_chat_template chat;
    struct pv_tokenizer_impl *impl;         /* vocabulary tables, merges, regexes */
} pv_tokenizer;

/* Build the tokenizer from a parsed GGUF file (g may be freed afterwards).
 * After init the tokenizer is only read, so threads may share it.
 * An unrecognised chat template does not fail init: has_chat_template is 0
 * and pv_tokenizer_apply_chat() reports why. */
pv_status pv_tokenizer_init(pv_tokenizer *tok, const pv_gguf *g);
void pv_tokenizer_free(pv_tokenizer *tok);

/* The longest text one encode call takes. Encoding is O(n log n) in the
 * length of each pre-token (a whitespace-free word may be the whole text), so
 * this bounds one request's work: about a second per 4 MiB here. */
#define PV_TOKENIZE_MAX_BYTES (64u << 20)

/* Encode len bytes of text into ids (cap entries). At most len + 1 ids are
 * ever produced, so cap = len + 1 always suffices. A text over
 * PV_TOKENIZE_MAX_BYTES is PV_ERR_INVALID_ARG. */
pv_status pv_tokenizer_encode(const pv_tokenizer *tok, const char *text, size_t len,
                              unsigned flags, int32_t *ids, size_t cap, size_t *n_ids);

/* Decode ids to bytes in out (cap bytes, NUL-terminated when it fits); *len
 * is the decoded length. out may be NULL with cap 0 to ask the length. The
 * bytes of a prefix of a token sequence may end inside a UTF-8 character. */
pv_status pv_tokenizer_decode(const pv_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              unsigned flags, char *out, size_t cap, size_t *len);

/* The bytes token id decodes to (with PV_DECODE_SPECIAL semantics for
 * control tokens given by flags). */
pv_status pv_tokenizer_piece(const pv_tokenizer *tok, int32_t id, unsigned flags,
                             const char **bytes, size_t *len);

/* Id of the token whose vocabulary string is `text` exactly, or -1. */
int32_t pv_tokenizer_find(const pv_tokenizer *tok, const char *text);

/* Token type (PV_TOKEN_*) of id, or 0 for an id out of range. */
int pv_tokenizer_type(const pv_tokenizer *tok, int32_t id);

/* Whether generation should stop at id: eos or <|im_end|>. */
int pv_tokenizer_is_end(const pv_tokenizer *tok, int32_t id);

/* Render a conversation with the model's chat template (see
 * pv_chat_template_apply for out/cap/len). */
pv_status pv_tokenizer_apply_chat(const pv_tokenizer *tok, const pv_chat_message *msgs,
                                  size_t n_msgs, int add_generation_prompt,
                                  char *out, size_t cap, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
