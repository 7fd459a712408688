/* Minimal TAP producer for tests under make check (tap-driver.sh reads it).
 * Usage: tap_plan(n) or tap_done() at the end; ok(cond, fmt, ...);
 * tap_skip_all("why") for a test whose requirement is absent. */
#ifndef PV_TESTS_TAP_H
#define PV_TESTS_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int tap_count;
static int tap_failed;

static inline void tap_plan(int n)
{
    printf("1..%d\n", n);
    fflush(stdout);
}

static inline void tap_diag(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

static inline int ok(int cond, const char *fmt, ...)
{
    va_list ap;
    tap_count++;
    if (!cond)
        tap_failed++;
    printf("%s %d - ", cond ? "ok" : "not ok", tap_count);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    return cond;
}

static inline void tap_skip(const char *fmt, ...)
{
    va_list ap;
    tap_count++;
    printf("ok %d # SKIP ", tap_count);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* Skip the whole test program: prints a plan of zero with the reason. */
static inline int tap_skip_all(const char *why)
{
    printf("1..0 # SKIP %s\n", why);
    fflush(stdout);
    return 0;
}

/* Print the trailing plan; the exit status is non-zero on any failure. */
static inline int tap_done(void)
{
    printf("1..%d\n", tap_count);
    fflush(stdout);
    return tap_failed ? 1 : 0;
}

#endif
