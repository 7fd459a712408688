/* Chat templates: a recogniser for the ChatML form, not a Jinja engine.
 * The template is cut into text, {{ expression }} and {% statement %}
 * nodes (honouring '-' whitespace control and the trim_blocks /
 * lstrip_blocks settings chat templates are rendered with); statements must
 * be the loop over messages, the optional default-system block and the
 * generation-prompt block; expressions must be concatenations of string
 * literals, message['role'] and message['content']. What the nodes render
 * is then checked against ChatML. Anything else is PV_ERR_UNSUPPORTED. */
#include <pensieve/tokenizer.h>

#include "models/byte-level.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IM_START "<|im_start|>"
#define IM_END "<|im_end|>"

typedef enum item_kind { ITEM_TEXT, ITEM_ROLE, ITEM_CONTENT } item_kind;

/* A growable list of rendered items: literal text, or a message field. */
typedef struct item {
    item_kind kind;
    char *text;
    size_t len;
} item;

typedef struct item_list {
    item *v;
    size_t n, cap;
} item_list;

typedef enum stmt_kind {
    STMT_FOR,        /* for message in messages */
    STMT_ENDFOR,
    STMT_IF_DEFAULT, /* if loop.first and messages[0]['role'] != 'system' */
    STMT_IF_GEN,     /* if add_generation_prompt */
    STMT_ENDIF
} stmt_kind;

static void items_free(item_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].text);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* Append an item; adjacent text items merge. */
static pv_status items_add(item_list *l, item_kind kind, const char *text, size_t len)
{
    if (kind == ITEM_TEXT && len == 0)
        return PV_OK;
    if (kind == ITEM_TEXT && l->n > 0 && l->v[l->n - 1].kind == ITEM_TEXT) {
        item *last = &l->v[l->n - 1];
        char *p = realloc(last->text, last->len + len + 1);
        if (!p)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "chat template text of %zu bytes", last->len + len);
        memcpy(p + last->len, text, len);
        last->len += len;
        p[last->len] = '\0';
        last->text = p;
        return PV_OK;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        item *p = realloc(l->v, cap * sizeof *p);
        if (!p)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "chat template items");
        l->v = p;
        l->cap = cap;
    }
    item *it = &l->v[l->n];
    it->kind = kind;
    it->len = len;
    it->text = malloc(len + 1);
    if (!it->text)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "chat template text of %zu bytes", len);
    if (len)
        memcpy(it->text, text, len);
    it->text[len] = '\0';
    l->n++;
    return PV_OK;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* ---- expressions ------------------------------------------------------------- */

typedef struct scanner {
    const char *s;
    size_t n, pos;
} scanner;

static void skip_spaces(scanner *sc)
{
    while (sc->pos < sc->n && is_space(sc->s[sc->pos]))
        sc->pos++;
}

/* Consume `word` (after spaces) if it is next. */
static int accept(scanner *sc, const char *word)
{
    skip_spaces(sc);
    size_t k = strlen(word);
    if (sc->n - sc->pos >= k && memcmp(sc->s + sc->pos, word, k) == 0) {
        sc->pos += k;
        return 1;
    }
    return 0;
}

/* A quoted string literal with Jinja's (Python's) common escapes, into out. */
static pv_status string_literal(scanner *sc, item_list *out)
{
    skip_spaces(sc);
    char quote = sc->s[sc->pos];
    size_t start = sc->pos++;
    char *buf = malloc(sc->n - start + 1);
    size_t len = 0;
    if (!buf)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "chat template literal");
    while (sc->pos < sc->n && sc->s[sc->pos] != quote) {
        char c = sc->s[sc->pos++];
        if (c == '\\' && sc->pos < sc->n) {
            char e = sc->s[sc->pos++];
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        }
        buf[len++] = c;
    }
    if (sc->pos >= sc->n) {
        free(buf);
        return pv_error(PV_ERR_UNSUPPORTED, "chat template: unterminated string literal at byte %zu",
                        start);
    }
    sc->pos++;
    pv_status st = items_add(out, ITEM_TEXT, buf, len);
    free(buf);
    return st;
}

/* message['role'], message["role"] or message.role (and content). */
static int message_field(scanner *sc, const char *field)
{
    size_t save = sc->pos;
    if (accept(sc, "message")) {
        char sq[32], dq[32], dot[32];
        snprintf(sq, sizeof sq, "['%s']", field);
        snprintf(dq, sizeof dq, "[\"%s\"]", field);
        snprintf(dot, sizeof dot, ".%s", field);
        if (accept(sc, sq) || accept(sc, dq) || accept(sc, dot))
            return 1;
    }
    sc->pos = save;
    return 0;
}

/* term ('+' term)*, term = literal | message.role | message.content */
static pv_status expression(const char *s, size_t n, size_t at, item_list *out)
{
    while (n > 0 && is_space(*s))
        s++, n--;
    while (n > 0 && is_space(s[n - 1]))
        n--;
    scanner sc = {s, n, 0};
    for (;;) {
        skip_spaces(&sc);
        if (sc.pos >= n)
            break;
        pv_status st;
        char c = s[sc.pos];
        if (c == '\'' || c == '"') {
            if ((st = string_literal(&sc, out)) != PV_OK)
                return st;
        } else if (message_field(&sc, "role")) {
            if ((st = items_add(out, ITEM_ROLE, "", 0)) != PV_OK)
                return st;
        } else if (message_field(&sc, "content")) {
            if ((st = items_add(out, ITEM_CONTENT, "", 0)) != PV_OK)
                return st;
        } else {
            return pv_error(PV_ERR_UNSUPPORTED, "chat template: expression '{{ %s }}' at byte %zu "
                            "is not supported (only string literals, message['role'] and "
                            "message['content'] joined by '+')", pv_printable(s, n), at);
        }
        skip_spaces(&sc);
        if (sc.pos >= n)
            break;
        if (!accept(&sc, "+"))
            return pv_error(PV_ERR_UNSUPPORTED, "chat template: expression '{{ %s }}' at byte %zu:"
                            " expected '+' at offset %zu", pv_printable(s, n), at, sc.pos);
    }
    return PV_OK;
}

/* Statement text with whitespace runs collapsed and quotes made single. */
static pv_status statement(const char *s, size_t n, size_t at, stmt_kind *kind)
{
    while (n > 0 && is_space(*s))
        s++, n--;
    while (n > 0 && is_space(s[n - 1]))
        n--;
    char norm[160];
    size_t k = 0;
    int pending_space = 0;
    for (size_t i = 0; i < n; i++) {
        if (is_space(s[i])) {
            pending_space = k > 0;
            continue;
        }
        if (k + 3 >= sizeof norm)
            break;
        if (pending_space)
            norm[k++] = ' ';
        pending_space = 0;
        norm[k++] = s[i] == '"' ? '\'' : s[i];
    }
    norm[k] = '\0';
    static const struct { const char *text; stmt_kind kind; } known[] = {
        {"for message in messages", STMT_FOR},
        {"endfor", STMT_ENDFOR},
        {"if loop.first and messages[0]['role'] != 'system'", STMT_IF_DEFAULT},
        {"if add_generation_prompt", STMT_IF_GEN},
        {"endif", STMT_ENDIF},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(norm, known[i].text) == 0) {
            *kind = known[i].kind;
            return PV_OK;
        }
    }
    return pv_error(PV_ERR_UNSUPPORTED, "chat template: statement '{%% %s %%}' at byte %zu is not "
                    "part of the ChatML form this reader understands", pv_printable(s, n), at);
}

/* ---- the recogniser -------------------------------------------------------------- */

/* Where rendered items go while walking the template. */
typedef enum section { SEC_BEFORE, SEC_LOOP, SEC_DEFAULT, SEC_AFTER, SEC_GEN, SEC_END } section;

typedef struct parts {
    item_list loop, dflt, gen, outside;
    int has_default;
} parts;

static item_list *section_list(parts *p, section sec)
{
    switch (sec) {
    case SEC_LOOP: return &p->loop;
    case SEC_DEFAULT: return &p->dflt;
    case SEC_GEN: return &p->gen;
    default: return &p->outside;
    }
}

static pv_status transition(section *sec, stmt_kind kind, size_t at, parts *p)
{
    if (*sec == SEC_BEFORE && kind == STMT_FOR) {
        *sec = SEC_LOOP;
    } else if (*sec == SEC_LOOP && kind == STMT_IF_DEFAULT && !p->has_default && p->loop.n == 0) {
        *sec = SEC_DEFAULT;
        p->has_default = 1;
    } else if (*sec == SEC_DEFAULT && kind == STMT_ENDIF) {
        *sec = SEC_LOOP;
    } else if (*sec == SEC_LOOP && kind == STMT_ENDFOR) {
        *sec = SEC_AFTER;
    } else if (*sec == SEC_AFTER && kind == STMT_IF_GEN && p->gen.n == 0) {
        *sec = SEC_GEN;
    } else if (*sec == SEC_GEN && kind == STMT_ENDIF) {
        *sec = SEC_END;
    } else {
        return pv_error(PV_ERR_UNSUPPORTED, "chat template: statement at byte %zu is out of the "
                        "ChatML order (loop over messages, optional default system turn first in "
                        "it, then the generation prompt)", at);
    }
    return PV_OK;
}

static int text_is(const item_list *l, size_t i, const char *want)
{
    return i < l->n && l->v[i].kind == ITEM_TEXT && strcmp(l->v[i].text, want) == 0;
}

/* The rendered pieces must be exactly ChatML. */
static pv_status check_chatml(parts *p, pv_chat_template *t)
{
    const item_list *m = &p->loop;
    if (m->n != 5 || !text_is(m, 0, IM_START) || m->v[1].kind != ITEM_ROLE || !text_is(m, 2, "\n") ||
        m->v[3].kind != ITEM_CONTENT || !text_is(m, 4, IM_END "\n"))
        return pv_error(PV_ERR_UNSUPPORTED, "chat template: a message does not render as "
                        "'<|im_start|>' role '\\n' content '<|im_end|>\\n' (not ChatML)");
    if (p->gen.n != 1 || !text_is(&p->gen, 0, IM_START "assistant\n"))
        return pv_error(PV_ERR_UNSUPPORTED, "chat template: the generation prompt is not "
                        "'<|im_start|>assistant\\n' (not ChatML)");
    for (size_t i = 0; i < p->outside.n; i++)
        if (p->outside.v[i].kind != ITEM_TEXT || strspn(p->outside.v[i].text, " \t\r\n") !=
                                                     p->outside.v[i].len)
            return pv_error(PV_ERR_UNSUPPORTED, "chat template renders text outside the message "
                            "loop and generation prompt");
    if (p->has_default) {
        const char *pre = IM_START "system\n", *post = IM_END "\n";
        size_t lp = strlen(pre), lq = strlen(post);
        const item_list *d = &p->dflt;
        if (d->n != 1 || d->v[0].kind != ITEM_TEXT || d->v[0].len < lp + lq ||
            memcmp(d->v[0].text, pre, lp) != 0 ||
            memcmp(d->v[0].text + d->v[0].len - lq, post, lq) != 0)
            return pv_error(PV_ERR_UNSUPPORTED, "chat template: the default system turn is not "
                            "'<|im_start|>system\\n' text '<|im_end|>\\n'");
        size_t n = d->v[0].len - lp - lq;
        t->default_system = malloc(n + 1);
        if (!t->default_system)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "chat template default system text");
        memcpy(t->default_system, d->v[0].text + lp, n);
        t->default_system[n] = '\0';
    }
    return PV_OK;
}

/* The end of the tag opened at src[at] ("{{", "{%" or "{#"), skipping
 * string literals in expressions and statements; 0 if unterminated. */
static size_t find_close(const char *src, size_t len, size_t at)
{
    char end = src[at + 1] == '{' ? '}' : src[at + 1];
    char quote = 0;
    for (size_t i = at + 2; i + 1 < len; i++) {
        char c = src[i];
        if (quote) {
            if (c == '\\')
                i++;
            else if (c == quote)
                quote = 0;
        } else if ((c == '\'' || c == '"') && end != '#') {
            quote = c;
        } else if (c == end && src[i + 1] == '}') {
            return i;
        }
    }
    return 0;
}

static pv_status parse_template(const char *src, size_t len, parts *p)
{
    section sec = SEC_BEFORE;
    pv_status st = PV_OK;
    size_t pos = 0;
    int trim_next = 0;  /* the last tag ended with '-': drop the next text's leading space */
    int after_block = 0; /* the last tag was {% %} or {# #}: trim_blocks drops one newline */
    while (pos < len) {
        size_t open = len;
        for (size_t i = pos; i + 1 < len; i++) {
            if (src[i] == '{' && (src[i + 1] == '{' || src[i + 1] == '%' || src[i + 1] == '#')) {
                open = i;
                break;
            }
        }
        size_t a = pos, b = open;
        if (trim_next)
            while (a < b && is_space(src[a]))
                a++;
        else if (after_block && a < b && src[a] == '\n')
            a++;
        char kind = open < len ? src[open + 1] : 0;
        if (kind && open + 2 < len && src[open + 2] == '-') {
            while (b > a && is_space(src[b - 1]))
                b--;
        } else if (kind == '%' || kind == '#') { /* lstrip_blocks */
            size_t k = b;
            while (k > a && (src[k - 1] == ' ' || src[k - 1] == '\t'))
                k--;
            if (k == 0 || src[k - 1] == '\n')
                b = k;
        }
        if (b > a && (st = items_add(section_list(p, sec), ITEM_TEXT, src + a, b - a)) != PV_OK)
            return st;
        if (!kind)
            break;
        size_t close = find_close(src, len, open);
        if (close == 0)
            return pv_error(PV_ERR_UNSUPPORTED, "chat template: tag at byte %zu is not closed", open);
        size_t in_a = open + 2, in_b = close;
        if (in_a < in_b && src[in_a] == '-')
            in_a++;
        trim_next = in_b > in_a && src[in_b - 1] == '-';
        if (trim_next)
            in_b--;
        if (kind == '{') {
            st = expression(src + in_a, in_b - in_a, open, section_list(p, sec));
        } else if (kind == '%') {
            stmt_kind sk = STMT_ENDIF;
            st = statement(src + in_a, in_b - in_a, open, &sk);
            if (st == PV_OK)
                st = transition(&sec, sk, open, p);
        }
        if (st != PV_OK)
            return st;
        after_block = kind != '{';
        pos = close + 2;
    }
    if (sec != SEC_END)
        return pv_error(PV_ERR_UNSUPPORTED, "chat template: no %s (not the ChatML form)",
                        sec == SEC_BEFORE ? "'for message in messages' loop"
                        : sec == SEC_AFTER ? "'if add_generation_prompt' block"
                                           : "end of an open block");
    return PV_OK;
}

pv_status pv_chat_template_init(pv_chat_template *t, const char *src, size_t len)
{
    if (!t || (!src && len))
        return pv_error(PV_ERR_INVALID_ARG, "pv_chat_template_init: NULL argument");
    memset(t, 0, sizeof *t);
    parts p;
    memset(&p, 0, sizeof p);
    pv_status st = parse_template(src, len, &p);
    if (st == PV_OK)
        st = check_chatml(&p, t);
    items_free(&p.loop);
    items_free(&p.dflt);
    items_free(&p.gen);
    items_free(&p.outside);
    if (st != PV_OK)
        pv_chat_template_free(t);
    return st;
}

void pv_chat_template_free(pv_chat_template *t)
{
    if (!t)
        return;
    free(t->default_system);
    t->default_system = NULL;
}

/* Append n bytes to out if they fit, counting them either way. */
static void put(char *out, size_t cap, size_t *at, const char *s, size_t n)
{
    if (*at + n < cap)
        memcpy(out + *at, s, n);
    *at += n;
}

static void put_turn(char *out, size_t cap, size_t *at, const char *role, const char *content)
{
    put(out, cap, at, IM_START, strlen(IM_START));
    put(out, cap, at, role, strlen(role));
    put(out, cap, at, "\n", 1);
    put(out, cap, at, content, strlen(content));
    put(out, cap, at, IM_END "\n", strlen(IM_END "\n"));
}

pv_status pv_chat_template_apply(const pv_chat_template *t, const pv_chat_message *msgs,
                                 size_t n_msgs, int add_generation_prompt,
                                 char *out, size_t cap, size_t *len)
{
    if (!t || !len || (!msgs && n_msgs) || (!out && cap))
        return pv_error(PV_ERR_INVALID_ARG, "pv_chat_template_apply: NULL argument");
    for (size_t i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content)
            return pv_error(PV_ERR_INVALID_ARG, "chat message %zu has a NULL %s", i,
                            msgs[i].role ? "content" : "role");
    size_t at = 0;
    for (size_t i = 0; i < n_msgs; i++) {
        if (i == 0 && t->default_system && strcmp(msgs[0].role, "system") != 0)
            put_turn(out, cap, &at, "system", t->default_system);
        put_turn(out, cap, &at, msgs[i].role, msgs[i].content);
    }
    if (add_generation_prompt)
        put(out, cap, &at, IM_START "assistant\n", strlen(IM_START "assistant\n"));
    *len = at;
    if (!out && cap == 0)
        return PV_OK;
    if (at + 1 > cap)
        return pv_error(PV_ERR_INVALID_ARG, "chat template: output holds %zu bytes, %zu are needed "
                        "(with the NUL)", cap, at + 1);
    out[at] = '\0';
    return PV_OK;
}
