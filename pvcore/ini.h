/* The strict INI reader shared by the cache config and the device profiles
 * (pvcore-internal). It knows line numbers, so every message names file,
 * line and key; it refuses what iniparser silently skips (keys outside a
 * section, NUL bytes, CR-only line ends, unterminated quotes); and it keeps
 * no process-wide state, so threads may read files at once (iniparser's
 * error callback is global). What a section or key means is the caller's. */
#ifndef PENSIEVE_PVCORE_INI_H
#define PENSIEVE_PVCORE_INI_H

#include <pensieve/status.h>

#include <stddef.h>

/* Largest file read: configs and profiles are a few KiB. */
#define PV_INI_MAX_BYTES (1u << 20)

/* The file's bytes, NUL-terminated (free()), or NULL with the status set;
 * `what` names the file's role in messages ("cache config"). */
char *pv_ini_read_file(const char *path, const char *what, size_t *size, pv_status *st);

typedef struct pv_ini_handler {
    /* [name] on line `line`, which starts at byte `offset` of the text. */
    pv_status (*section)(void *ctx, unsigned line, size_t offset, const char *name);
    /* key = value inside a section (value unquoted, comments dropped, not
     * empty); section is the current one. */
    pv_status (*key)(void *ctx, unsigned line, const char *section, const char *key, const char *value);
} pv_ini_handler;

/* Walks text (size bytes, modified in place) line by line; stops at the
 * first error: the handler's status, or PV_ERR_FORMAT naming path and line
 * for a line that is not valid INI. */
pv_status pv_ini_parse(const char *path, char *text, size_t size, const pv_ini_handler *h, void *ctx);

#endif
