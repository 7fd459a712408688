/* Sessions that outlive a process: a session's history and the KV bytes of
 * its chunks, written to a file of its own and read back into a new engine.
 *
 * A session image is taken on the engine's thread (pv_engine_session_export
 * copies the bytes out, so the engine goes on at once) and written on any
 * thread (pv_session_image_write: a temporary file, fsync, rename, fsync of
 * the directory, so a file is always either its old or its new version).
 * Reading checks everything before anything is used: format, model
 * identity, KV layout, sizes, a checksum of the header and tokens and one
 * per chunk; a file that fails any check is refused with the reason.
 *
 * A state directory (pv_state_dir) holds one file per session: restored
 * into the HOST tier on start (chunks past its budget are marked DROPPED and
 * recomputed on the session's next turn), saved in the background for
 * sessions idle long enough, saved whole on shutdown, kept under a size
 * limit by the cache policy's retention value.
 *
 * File layout (version 1, little-endian), docs/persistence.md:
 *   header (96 bytes): "PVSTATE1", version, header size, model identity,
 *     weights, KV dtype, chunk tokens, layers, slot bytes, last active (Unix
 *     seconds), turns, id length, history, pending and record counts, CRC-32
 *     of header + id + tokens + record table
 *   id bytes; history and pending tokens (int32)
 *   record table: per chunk record {chunk, layer, CRC-32 of its bytes, 0}
 *   the records' slot bytes, slot_bytes each, in table order
 * The file's size must be exactly what the header says. */
#ifndef PENSIEVE_STATE_H
#define PENSIEVE_STATE_H

#include <pensieve/engine.h>
#include <pensieve/status.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PV_STATE_VERSION 1

/* What the saved KV bytes are only valid for. */
typedef struct pv_state_identity {
    uint64_t model;        /* pv_llama_identity */
    uint32_t weights;      /* pv_llama_weights: native and f32 weights give different KV */
    uint32_t kv_dtype;     /* pv_dtype */
    uint32_t chunk_tokens;
    uint32_t n_layers;
    uint64_t slot_bytes;
} pv_state_identity;

void pv_engine_state_identity(const pv_engine *e, pv_state_identity *out);

/* One record of an image: (chunk, layer) and where its bytes are. */
typedef struct pv_state_record {
    uint32_t chunk, layer;
} pv_state_record;

/* A session's state in memory. */
typedef struct pv_session_image {
    char *id;
    pv_state_identity ident;
    double last_active_unix;   /* wall clock of its last activity */
    uint32_t turns;
    int32_t *history;          /* tokens whose KV was computed */
    size_t n_history;
    int32_t *pending;          /* decided but not yet run (the last answer's last token) */
    size_t n_pending;
    pv_state_record *records;  /* ascending (chunk, layer), chunk within the history */
    size_t n_records;
    uint8_t *kv;               /* n_records x slot_bytes, in records' order */
    void *storage;             /* a read file's bytes, kv pointing into them; NULL when kv is its own */
} pv_session_image;

void pv_session_image_free(pv_session_image *img); /* NULL: no-op */

/* What changed in a session since it was last saved, cheaply: compared by
 * pv_state_dir to skip sessions whose file is current. */
typedef struct pv_session_signature {
    uint32_t turns;
    uint64_t tokens;       /* history + pending */
    uint64_t records;      /* chunk records an export would write */
} pv_session_signature;

/* On the engine's thread, between steps. Copies the session's history and
 * the bytes of its chunks in HOST, and with with_device set in DEVICE too
 * (a DEVICE read waits for the device), into a new image. With out NULL,
 * only *sig is set (cheap: no bytes copied), for deciding whether a file is
 * current. PV_ERR_NOT_FOUND for an unknown session, PV_ERR_BUSY while a
 * turn of it is queued or running. sig may be NULL. */
pv_status pv_engine_session_export(pv_engine *e, const char *session, int with_device,
                                   pv_session_image **out, pv_session_signature *sig);

/* What an import kept. */
typedef struct pv_import_result {
    uint64_t records_kept;     /* chunk records now in a tier with their bytes */
    uint64_t records_dropped;  /* marked DROPPED: no room (or stateless mode) */
} pv_import_result;

/* On the engine's thread: creates the session from the image (its identity
 * must be the engine's: PV_ERR_FORMAT otherwise) with its history, pending
 * tokens, turns and idle time, and its chunks in HOST (DEVICE in gpu-only
 * mode), evicting by retention value when the tier is full; what does not
 * fit is marked DROPPED and recomputed on the next turn. Tokens outside the
 * vocabulary or a history past the context are PV_ERR_FORMAT. PV_ERR_BUSY
 * if the session exists already. res may be NULL. */
pv_status pv_engine_session_import(pv_engine *e, const pv_session_image *img, pv_import_result *res);

/* The file name (no directory) of a session's state: the id in hex for ids
 * up to 100 bytes, else a hex prefix and a hash; ends in ".pvs". */
pv_status pv_state_file_name(const char *session, char *buf, size_t cap);

/* Encodes img as a file image; *out is malloc'd, *size its length. */
pv_status pv_session_image_encode(const pv_session_image *img, uint8_t **out, size_t *size);

/* Decodes a file image. expect NULL accepts any identity; otherwise a file
 * of another model or layout is PV_ERR_FORMAT saying which field differs.
 * name is used in messages. Every count and size is checked before use. */
pv_status pv_session_image_decode(const void *data, size_t size, const pv_state_identity *expect,
                                  const char *name, pv_session_image **out);

/* Writes the image to dir/<file name> crash-safely; *bytes (may be NULL)
 * gets the file's size. */
pv_status pv_session_image_write(const pv_session_image *img, const char *dir, uint64_t *bytes);

/* Reads and decodes one file. */
pv_status pv_session_image_read(const char *path, const pv_state_identity *expect,
                                pv_session_image **out);

/* ---- a state directory ------------------------------------------------------------ */

typedef struct pv_state_dir pv_state_dir;

typedef struct pv_state_dir_config {
    const char *path;          /* created if absent */
    double save_idle_s;        /* background saves of sessions idle this long; 0 = none */
    uint64_t max_bytes;        /* size limit of the session files; 0 = none */
    /* Warnings (files skipped, saves failed), one line each; NULL = stderr. */
    void (*warn)(void *user, const char *line);
    void *warn_user;
} pv_state_dir_config;

/* Opens the directory (creating it) for engine e. With loop not NULL, every
 * engine call goes through pv_engine_loop_call (e runs on the loop's
 * thread); else e is called directly from the caller's thread. */
pv_status pv_state_dir_open(pv_state_dir **out, const pv_state_dir_config *cfg, pv_engine *e,
                            pv_engine_loop *loop);
void pv_state_dir_free(pv_state_dir *d);

typedef struct pv_state_restore_report {
    uint32_t sessions;         /* restored */
    uint32_t skipped;          /* files refused (each warned with its reason) */
    uint64_t records_kept, records_dropped;
    uint64_t bytes_read;
    double seconds;
} pv_state_restore_report;

/* Restores every session file into the engine (call before serving).
 * Temporary files of interrupted writes are removed. Sessions are imported
 * least recently active first, so the most recent keep their chunks when
 * the host tier is too small for all. rep may be NULL. */
pv_status pv_state_dir_restore(pv_state_dir *d, pv_state_restore_report *rep);

typedef struct pv_state_save_report {
    uint32_t sessions;         /* files written */
    uint32_t current;          /* sessions whose file was current */
    uint32_t failed;           /* warned */
    uint64_t bytes_written;
    double seconds;
} pv_state_save_report;

/* Saves every session without a turn in flight (HOST and DEVICE chunks):
 * at shutdown, after the engine's turns ended. rep may be NULL. */
pv_status pv_state_dir_save_all(pv_state_dir *d, pv_state_save_report *rep);

/* One background pass: saves sessions idle at least save_idle_s whose file
 * is not current (HOST and DEVICE chunks), removes the files of sessions
 * the engine no longer has, then enforces the size limit. */
pv_status pv_state_dir_save_idle(pv_state_dir *d, pv_state_save_report *rep);

/* Engine calls go through loop from now on (NULL: directly again). For a
 * server that restores before its loop starts and saves through it. */
void pv_state_dir_use_loop(pv_state_dir *d, pv_engine_loop *loop);

/* 1 when the directory was opened with background saves (save_idle_s > 0). */
int pv_state_dir_saves_idle(const pv_state_dir *d);

/* A thread that runs pv_state_dir_save_idle about once a second (needs a
 * loop and save_idle_s > 0); stopped by pv_state_dir_stop or _free. */
pv_status pv_state_dir_start(pv_state_dir *d);
void pv_state_dir_stop(pv_state_dir *d);

/* The session ended (DELETE): its file goes too. PV_OK if there was none. */
pv_status pv_state_dir_forget(pv_state_dir *d, const char *session);

/* The directory's own secret: PV_STATE_SECRET_BYTES random bytes in the
 * file "secret" (mode 0600), created on first use. pensieve-serve keys its
 * API-key namespaces with it (HMAC), so that file names in the directory
 * say nothing about the keys to anyone without it. Refused when the file is
 * not a regular file of this user readable by it alone, or of another size. */
#define PV_STATE_SECRET_BYTES 32
pv_status pv_state_dir_secret(pv_state_dir *d, uint8_t out[PV_STATE_SECRET_BYTES]);

/* Bytes of session files in the directory, as the index knows them. */
uint64_t pv_state_dir_bytes(const pv_state_dir *d);

#ifdef __cplusplus
}
#endif
#endif
