/* The byte-level alphabet of GPT-2-style BPE vocabularies: every byte is
 * shown as one printable code point, so token strings never contain raw
 * spaces or control bytes. Printable Latin-1 bytes (0x21-0x7e, 0xa1-0xac,
 * 0xae-0xff) stand for themselves; the other 68 bytes, in increasing order,
 * become U+0100, U+0101, ... (so a space, byte 0x20, is U+0120 'Ġ'). */
#ifndef PV_MODELS_BYTE_LEVEL_H
#define PV_MODELS_BYTE_LEVEL_H

#include <stddef.h>
#include <stdint.h>

/* The code point that stands for byte b. */
uint32_t pv_byte_level_codepoint(uint8_t b);

/* Byte whose code point is cp, or -1 if cp stands for no byte. */
int pv_byte_level_byte(uint32_t cp);

/* Append the UTF-8 encoding of cp to out (room for 4 bytes); returns the
 * number of bytes written. */
size_t pv_utf8_put(uint32_t cp, char *out);

/* Length of the valid UTF-8 sequence at s (1-4), or 0 if the bytes at s
 * (n available) do not start one: overlong forms, surrogates and code points
 * above U+10FFFF are invalid. Stores the code point in *cp when valid. */
size_t pv_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);

/* Text from a file (n bytes, NUL and control bytes included) made safe for
 * a message: printable ASCII and valid UTF-8 from U+00A0 up stay, a
 * backslash is doubled, \0 \t \n \r are spelled so, every other byte is
 * \xHH, and text longer than 96 bytes is cut with "...". The result lives in
 * one of 4 thread-local buffers used in turn, so one message may show up to
 * 4 such texts. */
const char *pv_printable(const char *s, size_t n);

#endif
