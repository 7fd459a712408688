/* libFuzzer target: tokenizer encode/decode round trip. The tokenizer is
 * built once from the synthetic model (models/synth.c: byte-level BPE with
 * all 256 byte tokens, a few merges, ChatML specials), or from the GGUF file
 * named by $PV_FUZZ_MODEL (e.g. the real SmolLM2 vocabulary).
 *
 * Input: byte 0 selects the mode, the rest is the text.
 *   bit 0  PV_TOKENIZE_ADD_BOS
 *   bit 1  PV_TOKENIZE_PARSE_SPECIAL (then decode with PV_DECODE_SPECIAL)
 *   bit 2  also read the text as little-endian int32 ids and decode them
 *          (ids out of range must be refused, not read)
 *   bit 3  also render the text as a chat turn and encode that
 * The property: at most len + 1 ids, and decode gives the text back byte
 * for byte (a vocabulary that lacks some byte token may drop those bytes,
 * so with $PV_FUZZ_MODEL only "no longer than the text" is required). */
#include <pensieve/gguf.h>
#include <pensieve/tokenizer.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static pv_tokenizer tok;
static int exact; /* the vocabulary has a token for every byte */

static void die(const char *what)
{
    fprintf(stderr, "fuzz-tokenizer: %s: %s\n", what, pv_last_error());
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *model = getenv("PV_FUZZ_MODEL");
    uint8_t *img = NULL;
    uint64_t size = 0;
    pv_gguf g;
    if (model && *model) {
        if (pv_gguf_init(&g, model) != PV_OK)
            die(model);
    } else {
        pv_synth_config c;
        pv_synth_config_default(&c);
        if (pv_synth_to_memory(&c, &img, &size) != PV_OK || pv_gguf_init_memory(&g, img, size) != PV_OK)
            die("synthetic model");
        exact = 1;
    }
    if (pv_tokenizer_init(&tok, &g) != PV_OK)
        die("tokenizer");
    pv_gguf_free(&g);
    free(img);
    return 0;
}

/* Encode then decode text; check the round trip. */
static void round_trip(const char *text, size_t len, unsigned flags)
{
    int32_t *ids = malloc((len + 1) * sizeof *ids);
    size_t cap = 2 * len + 64, n = 0, back_len = 0;
    char *back = malloc(cap);
    if (!ids || !back)
        die("out of memory");
    if (pv_tokenizer_encode(&tok, text, len, flags, ids, len + 1, &n) != PV_OK)
        die("encode");
    if (n > len + 1)
        die("encode produced more than len + 1 ids");
    int special = (flags & PV_TOKENIZE_PARSE_SPECIAL) != 0;
    size_t skip = 0;
    if (flags & PV_TOKENIZE_ADD_BOS) {
        if (tok.bos_id >= 0 && (n == 0 || ids[0] != tok.bos_id))
            die("ADD_BOS did not put bos first");
        skip = tok.bos_id >= 0;
    }
    if (pv_tokenizer_decode(&tok, ids + skip, n - skip, special ? PV_DECODE_SPECIAL : 0, back, cap,
                            &back_len) != PV_OK)
        die("decode");
    if (exact ? back_len != len || memcmp(back, text, len) != 0 : back_len > len) {
        fprintf(stderr, "fuzz-tokenizer: %zu bytes (flags %u) decode to %zu bytes, not the text\n", len,
                flags, back_len);
        abort();
    }
    /* Asking the length only must agree with the decode. */
    size_t asked = 0;
    if (pv_tokenizer_decode(&tok, ids + skip, n - skip, special ? PV_DECODE_SPECIAL : 0, NULL, 0, &asked) !=
            PV_OK ||
        asked != back_len)
        die("decode with cap 0 disagrees with the decode");
    free(ids);
    free(back);
}

/* Arbitrary ids: any status, but in-range ids decode to their pieces. */
static void decode_ids(const uint8_t *p, size_t len)
{
    size_t n = len / 4;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    char out[256];
    size_t got;
    if (!ids)
        die("out of memory");
    for (size_t i = 0; i < n; i++) {
        ids[i] = (int32_t)((uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                           (uint32_t)p[4 * i + 3] << 24);
        const char *piece;
        size_t piece_len;
        (void)pv_tokenizer_piece(&tok, ids[i], PV_DECODE_SPECIAL, &piece, &piece_len);
        (void)pv_tokenizer_type(&tok, ids[i]);
        (void)pv_tokenizer_is_end(&tok, ids[i]);
    }
    (void)pv_tokenizer_decode(&tok, ids, n, 0, out, sizeof out, &got);
    (void)pv_tokenizer_decode(&tok, ids, n, PV_DECODE_SPECIAL, out, sizeof out, &got);
    free(ids);
}

static void chat(const char *text, size_t len)
{
    /* Message content is a C string: the text up to its first NUL. */
    char *content = malloc(len + 1);
    if (!content)
        die("out of memory");
    memcpy(content, text, len);
    content[len] = '\0';
    pv_chat_message msgs[2] = {{"user", content}, {"assistant", content}};
    size_t need = 0;
    if (pv_tokenizer_apply_chat(&tok, msgs, 2, 1, NULL, 0, &need) == PV_OK) {
        char *out = malloc(need + 1);
        size_t got = 0;
        if (!out)
            die("out of memory");
        if (pv_tokenizer_apply_chat(&tok, msgs, 2, 1, out, need + 1, &got) != PV_OK || got != need)
            die("chat template: rendering disagrees with the length asked");
        round_trip(out, got, PV_TOKENIZE_PARSE_SPECIAL);
        free(out);
    }
    free(content);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    unsigned mode = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    round_trip(text, len, mode & 3u);
    if (mode & 4u)
        decode_ids(data + 1, len);
    if (mode & 8u)
        chat(text, len);
    return 0;
}
