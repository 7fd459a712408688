/* The strict INI reader (ini.h). */
#include "pvcore/ini.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

char *pv_ini_read_file(const char *path, const char *what, size_t *size, pv_status *st)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        *st = pv_error(PV_ERR_IO, "%s: cannot open %s: %s", path, what, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(sb.st_mode)) {
        *st = pv_error(PV_ERR_IO, "%s: %s is %s, not a regular file", path, what,
                       S_ISDIR(sb.st_mode) ? "a directory" : "a special file");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        *st = pv_error(PV_ERR_IO, "%s: cannot open %s: %s", path, what, strerror(errno));
        return NULL;
    }
    char *text = malloc(PV_INI_MAX_BYTES + 1);
    size_t n = text ? fread(text, 1, PV_INI_MAX_BYTES + 1, f) : 0;
    int failed = text && ferror(f);
    fclose(f);
    if (!text) {
        *st = pv_error(PV_ERR_OUT_OF_MEMORY, "%s: no memory to read the %s", path, what);
    } else if (failed) {
        *st = pv_error(PV_ERR_IO, "%s: read error", path);
    } else if (n > PV_INI_MAX_BYTES) {
        *st = pv_error(PV_ERR_FORMAT, "%s: %s is larger than %u bytes", path, what, PV_INI_MAX_BYTES);
    } else {
        text[n] = '\0';
        *size = n;
        return text;
    }
    free(text);
    return NULL;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    return s;
}

/* One "key = value" line (trimmed, NUL-ended) of `section`. */
static pv_status parse_assignment(const char *path, unsigned line_no, char *line, const char *section,
                                  const pv_ini_handler *h, void *ctx)
{
    char *eq = strchr(line, '=');
    if (!eq)
        return pv_error(PV_ERR_FORMAT, "%s:%u: \"%.64s\" is neither [section] nor key = value", path,
                        line_no, line);
    *eq = '\0';
    char *key = trim(line), *val = trim(eq + 1);
    if (*val == '"' || *val == '\'') {
        /* Quoted: the value is what lies between the quotes, as written. */
        char *close = strchr(val + 1, *val);
        char *rest = close ? trim(close + 1) : NULL;
        if (!close || (*rest && *rest != ';' && *rest != '#'))
            return pv_error(PV_ERR_FORMAT, "%s:%u: key %s:%.64s = %.64s has an unterminated quote or text after it",
                            path, line_no, section, key, val);
        *close = '\0';
        val++;
    } else {
        val[strcspn(val, ";#")] = '\0'; /* an inline comment */
        val = trim(val);
    }
    if (*val == '\0')
        return pv_error(PV_ERR_FORMAT, "%s:%u: key %s:%.64s has no value", path, line_no, section, key);
    return h->key(ctx, line_no, section, key, val);
}

pv_status pv_ini_parse(const char *path, char *text, size_t size, const pv_ini_handler *h, void *ctx)
{
    const char *section = NULL;
    unsigned line_no = 1;
    for (char *line = text; line < text + size; line_no++) {
        char *end = line;
        while (end < text + size && *end != '\n' && *end != '\r' && *end != '\0')
            end++;
        if (end < text + size && *end == '\0')
            return pv_error(PV_ERR_FORMAT, "%s:%u: a NUL byte at offset %zu: not a text file", path, line_no,
                            (size_t)(end - text));
        if (*end == '\r' && end[1] != '\n')
            return pv_error(PV_ERR_FORMAT,
                            "%s:%u: a carriage return not followed by a newline (CR-only line ends are not "
                            "supported)",
                            path, line_no);
        const size_t offset = (size_t)(line - text);
        char *next_line = end + (*end == '\r' ? 2 : *end == '\n' ? 1 : 0);
        *end = '\0';
        char *l = trim(line);
        line = next_line;
        if (*l == '\0' || *l == ';' || *l == '#')
            continue;
        pv_status st;
        if (*l == '[') {
            char *close = strchr(l, ']');
            char *rest = close ? trim(close + 1) : NULL;
            if (!close || (*rest && *rest != ';' && *rest != '#'))
                return pv_error(PV_ERR_FORMAT, "%s:%u: malformed section header \"%.64s\"", path, line_no, l);
            *close = '\0';
            section = trim(l + 1);
            st = h->section(ctx, line_no, offset, section);
        } else if (!section) {
            st = pv_error(PV_ERR_FORMAT, "%s:%u: \"%.64s\" comes before any section", path, line_no, l);
        } else {
            st = parse_assignment(path, line_no, l, section, h, ctx);
        }
        if (st != PV_OK)
            return st;
    }
    return PV_OK;
}
