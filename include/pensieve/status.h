/* Status codes and the per-thread error message shared by every pv_ call. */
#ifndef PENSIEVE_STATUS_H
#define PENSIEVE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pv_status {
    PV_OK = 0,
    PV_ERR_INVALID_ARG,   /* an argument is out of range or inconsistent */
    PV_ERR_OUT_OF_MEMORY, /* host or device allocation failed, or a budget is exhausted */
    PV_ERR_NO_DEVICE,     /* the backend is built but no usable device is present */
    PV_ERR_UNSUPPORTED,   /* the op, dtype or shape is not supported by this backend */
    PV_ERR_BACKEND,       /* the device runtime or library reported an error */
    PV_ERR_IO,            /* a file could not be opened, read or written */
    PV_ERR_FORMAT,        /* a file or value is malformed */
    PV_ERR_NOT_FOUND,     /* an unknown name, session or key */
    PV_ERR_STATE,         /* the call is not valid in the object's current state */
    PV_ERR_BUSY,          /* the object is pinned or in use */
    PV_ERR_CAPACITY       /* a well-formed request exceeds a limit of the model or the device (the
                           * model's context, the device pool), not a bad argument: a smaller one
                           * would be accepted. Appended last: the earlier values keep their numbers. */
} pv_status;

/* A short constant name for a status ("invalid argument", ...). */
const char *pv_status_str(pv_status status);

/* The message of the last failing pv_ call on this thread: it names the
 * argument or file, the value and the limit at fault. Never NULL. */
const char *pv_last_error(void);

/* Record a failure message for this thread and return `status` unchanged,
 * so callers can write `return pv_error(PV_ERR_INVALID_ARG, "...", ...)`. */
pv_status pv_error(pv_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Forget the last error message of this thread. */
void pv_clear_error(void);

/* Returns a failed status at once; its message stays in pv_last_error(). */
#define PV_TRY(expr)                                                                               \
    do {                                                                                           \
        pv_status pv_try_status_ = (expr);                                                         \
        if (pv_try_status_ != PV_OK)                                                               \
            return pv_try_status_;                                                                 \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
