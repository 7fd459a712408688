/* Status strings and the thread-local last-error message. */
#include <pensieve/status.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];

const char *pv_status_str(pv_status status)
{
    switch (status) {
    case PV_OK: return "ok";
    case PV_ERR_INVALID_ARG: return "invalid argument";
    case PV_ERR_OUT_OF_MEMORY: return "out of memory";
    case PV_ERR_NO_DEVICE: return "no device";
    case PV_ERR_UNSUPPORTED: return "unsupported";
    case PV_ERR_BACKEND: return "backend error";
    case PV_ERR_IO: return "i/o error";
    case PV_ERR_FORMAT: return "format error";
    case PV_ERR_NOT_FOUND: return "not found";
    case PV_ERR_STATE: return "invalid state";
    case PV_ERR_BUSY: return "busy";
    case PV_ERR_CAPACITY: return "over capacity";
    }
    return "unknown status";
}

const char *pv_last_error(void)
{
    return last_error;
}

pv_status pv_error(pv_status status, const char *fmt, ...)
{
    /* Formatted apart first: callers wrap the message before theirs with
     * pv_error(st, "...: %s", pv_last_error()), which reads last_error. */
    char message[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    memcpy(last_error, message, sizeof last_error);
    return status;
}

void pv_clear_error(void)
{
    last_error[0] = '\0';
}
