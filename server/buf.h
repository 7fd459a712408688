/* A growable, always NUL-terminated byte buffer: the server's response and
 * stream text, and its benchmark's client side. */
#ifndef PV_SERVER_BUF_H
#define PV_SERVER_BUF_H

#include <stddef.h>

typedef struct srv_buf {
    char *s;
    size_t n, cap;
} srv_buf;

int srv_buf_add(srv_buf *b, const char *s, size_t n); /* 0, or -1 out of memory */
void srv_buf_free(srv_buf *b);

#endif
