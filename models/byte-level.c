/* Byte-level BPE alphabet and the UTF-8 helpers the tokenizer shares with
 * the synthetic-model writer. */
#include "models/byte-level.h"

#include <stdio.h>
#include <string.h>

static int printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
}

uint32_t pv_byte_level_codepoint(uint8_t b)
{
    if (printable(b))
        return b;
    /* Count the non-printable bytes below b: they take U+0100 upwards. */
    uint32_t n = 0;
    for (unsigned i = 0; i < b; i++)
        n += !printable(i);
    return 0x100 + n;
}

int pv_byte_level_byte(uint32_t cp)
{
    if (cp < 0x100)
        return printable(cp) ? (int)cp : -1;
    uint32_t n = cp - 0x100;
    for (unsigned i = 0; i < 256; i++) {
        if (!printable(i)) {
            if (n == 0)
                return (int)i;
            n--;
        }
    }
    return -1;
}

size_t pv_utf8_put(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t pv_utf8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return 0;
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if ((c & 0xe0) == 0xc0) {
        len = 2, v = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
        len = 3, v = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    *cp = v;
    return len;
}

const char *pv_printable(const char *s, size_t n)
{
    enum { SHOWN = 96, ROOM = SHOWN * 4 + 4 }; /* \xHH per byte, then "..." */
    static _Thread_local char ring[4][ROOM];
    static _Thread_local unsigned next;
    char *out = ring[next++ % 4];
    size_t len = 0, i = 0, stop = n < SHOWN ? n : SHOWN;
    const uint8_t *b = (const uint8_t *)s;
    while (i < stop) {
        uint32_t cp;
        size_t k = b[i] >= 0x80 ? pv_utf8_next(b + i, n - i, &cp) : 0;
        if (k > 0 && cp >= 0xa0 && i + k <= stop) {
            for (size_t j = 0; j < k; j++)
                out[len++] = (char)b[i + j];
            i += k;
            continue;
        }
        static const char named[] = {'\0', '0', '\t', 't', '\n', 'n', '\r', 'r', '\\', '\\'};
        const char *hit = NULL;
        for (size_t j = 0; j < sizeof named; j += 2)
            if (b[i] == (uint8_t)named[j])
                hit = &named[j + 1];
        if (hit) {
            out[len++] = '\\';
            out[len++] = *hit;
        } else if (b[i] >= 0x20 && b[i] < 0x7f) {
            out[len++] = (char)b[i];
        } else {
            snprintf(out + len, 5, "\\x%02x", b[i]);
            len += 4;
        }
        i++;
    }
    if (i < n) {
        memcpy(out + len, "...", 3);
        len += 3;
    }
    out[len] = '\0';
    return out;
}
