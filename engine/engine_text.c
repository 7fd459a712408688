/* Text around the engine: a chat turn rendered as the continuation of a
 * session's conversation, and generated text streamed through the stop
 * strings' hold-back. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "engine/engine_internal.h"

#include <stdlib.h>
#include <string.h>

static pv_status text_append(pv_text *t, const char *s, size_t n)
{
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 64;
        while (cap < t->n + n + 1)
            cap *= 2;
        char *p = realloc(t->s, cap);
        if (!p)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "engine: text of %zu bytes", cap);
        t->s = p;
        t->cap = cap;
    }
    memcpy(t->s + t->n, s, n);
    t->n += n;
    t->s[t->n] = '\0';
    return PV_OK;
}

/* The first turn renders the template as it is (its default system turn
 * included); a later turn continues the conversation: it closes the
 * previous answer (the end token, when the model produced one, is already
 * the session's pending token) and renders the new messages without a
 * second default system turn. */
pv_status pv_engine_render_turn(pv_engine *e, pv_esession *s, const pv_turn *turn, pv_ivec *out)
{
    const pv_tokenizer *tok = e->tok;
    if (!tok->has_chat_template)
        return pv_error(PV_ERR_UNSUPPORTED,
                        "pv_engine_submit: the model has no chat template this engine understands; "
                        "submit token ids instead");
    int first = turn->whole_conversation || (s->history.n == 0 && s->pending.n == 0);
    pv_chat_template t = tok->chat;
    if (!first)
        t.default_system = NULL;
    const char *prefix = "";
    if (!first) {
        int closed = s->pending.n > 0 && s->pending.v[s->pending.n - 1] == tok->im_end_id;
        prefix = closed ? "\n" : "<|im_end|>\n";
    }
    size_t len = 0;
    pv_status st = pv_chat_template_apply(&t, turn->messages, turn->n_messages, 1, NULL, 0, &len);
    if (st != PV_OK)
        return st;
    size_t plen = strlen(prefix);
    char *text = malloc(plen + len + 1);
    if (!text)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "engine: chat text of %zu bytes", plen + len + 1);
    memcpy(text, prefix, plen);
    st = pv_chat_template_apply(&t, turn->messages, turn->n_messages, 1, text + plen, len + 1, &len);
    size_t n_ids = 0, total = plen + len;
    unsigned flags = PV_TOKENIZE_PARSE_SPECIAL | (first && tok->add_bos ? PV_TOKENIZE_ADD_BOS : 0);
    if (st == PV_OK)
        st = pv_ivec_reserve(out, out->n + total + 1);
    if (st == PV_OK)
        st = pv_tokenizer_encode(tok, text, total, flags, out->v + out->n, total + 1, &n_ids);
    if (st == PV_OK)
        out->n += n_ids;
    free(text);
    return st;
}

float pv_engine_uniform(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (float)((*state >> 40) * (1.0 / 16777216.0));
}

static void deliver(pv_request *r, int32_t token, const char *s, size_t n)
{
    if (r->cb.on_token)
        r->cb.on_token(r->cb.user, token, s, n);
}

/* Bytes at the end of held text that could still grow into a stop string. */
static size_t stop_prefix_tail(const pv_request *r)
{
    size_t best = 0;
    for (size_t k = 0; k < r->sampling.n_stop; k++) {
        const char *stop = r->stop[k];
        size_t sl = strlen(stop);
        size_t max = sl - 1 < r->held.n ? sl - 1 : r->held.n;
        for (size_t len = max; len > best; len--)
            if (memcmp(r->held.s + r->held.n - len, stop, len) == 0) {
                best = len;
                break;
            }
    }
    return best;
}

pv_status pv_engine_emit(pv_engine *e, pv_request *r, int32_t token, int *stopped)
{
    *stopped = 0;
    const char *piece;
    size_t len;
    pv_status st = pv_tokenizer_piece(e->tok, token, 0, &piece, &len);
    if (st != PV_OK)
        return st;
    if (r->sampling.n_stop == 0) {
        deliver(r, token, piece, len);
        return PV_OK;
    }
    size_t before = r->held.n;
    if ((st = text_append(&r->held, piece, len)) != PV_OK)
        return st;
    /* A stop string may straddle earlier held text: search from where a
     * match could start. */
    size_t cut = r->held.n;
    for (size_t k = 0; k < r->sampling.n_stop; k++) {
        size_t sl = strlen(r->stop[k]);
        size_t from = before >= sl ? before - sl + 1 : 0;
        for (size_t i = from; i + sl <= r->held.n; i++)
            if (memcmp(r->held.s + i, r->stop[k], sl) == 0) {
                if (i < cut)
                    cut = i;
                break;
            }
    }
    if (cut < r->held.n) {
        deliver(r, token, r->held.s, cut);
        r->held.n = 0;
        *stopped = 1;
        return PV_OK;
    }
    size_t keep = stop_prefix_tail(r);
    size_t give = r->held.n - keep;
    deliver(r, token, r->held.s, give);
    memmove(r->held.s, r->held.s + give, keep);
    r->held.n = keep;
    return PV_OK;
}

void pv_engine_flush(pv_request *r)
{
    if (r->held.n) {
        deliver(r, -1, r->held.s, r->held.n);
        r->held.n = 0;
    }
}
