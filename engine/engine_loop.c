/* The engine on a thread of its own, for servers: HTTP threads hand it
 * work through calls that run between iterations, so the engine itself
 * stays single-threaded and needs no locks. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "engine/engine_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct loop_call {
    pv_status (*fn)(pv_engine *e, void *arg);
    void *arg;
    pv_status status;
    char message[512];
    int done;
    int detached;          /* posted: nobody waits; freed after it runs */
    struct loop_call *next;
} loop_call;

struct pv_engine_loop {
    pv_engine *e;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake;   /* the loop: a call arrived, or stop */
    pthread_cond_t done;   /* callers: a call finished */
    loop_call *head, *tail;
    int stopping, stopped;
};

/* Runs the calls queued now; returns with mu held. */
static void run_calls(pv_engine_loop *l)
{
    while (l->head) {
        loop_call *c = l->head;
        l->head = c->next;
        if (!l->head)
            l->tail = NULL;
        pthread_mutex_unlock(&l->mu);
        pv_clear_error();
        c->status = c->fn(l->e, c->arg);
        if (c->detached) {
            free(c);
            pthread_mutex_lock(&l->mu);
            continue;
        }
        if (c->status != PV_OK)
            snprintf(c->message, sizeof c->message, "%s", pv_last_error());
        pthread_mutex_lock(&l->mu);
        c->done = 1;
        pthread_cond_broadcast(&l->done);
    }
}

static void *loop_main(void *arg)
{
    pv_engine_loop *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        run_calls(l);
        if (l->stopping)
            break;
        if (pv_engine_pending(l->e) == 0) {
            /* Idle: end sessions past the idle timeout (at most once a
             * second, however often calls wake the loop), then sleep until
             * a call comes or the next check is due. */
            pthread_mutex_unlock(&l->mu);
            if (pv_engine_expire_idle(l->e) != PV_OK)
                fprintf(stderr, "pensieve engine: idle sessions: %s\n", pv_last_error());
            pthread_mutex_lock(&l->mu);
            if (l->head || l->stopping)
                continue;
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 1;
            pthread_cond_timedwait(&l->wake, &l->mu, &until);
            continue;
        }
        pthread_mutex_unlock(&l->mu);
        pv_status st = pv_engine_step(l->e, NULL);
        if (st != PV_OK) {
            fprintf(stderr, "pensieve engine: iteration failed: %s\n", pv_last_error());
            pv_engine_end_all(l->e, st);
        }
        pthread_mutex_lock(&l->mu);
    }
    /* Stop: the turns still pending end cancelled; calls made meanwhile
     * have run above and later ones are refused. */
    l->stopped = 1;
    pthread_mutex_unlock(&l->mu);
    pv_engine_cancel_all(l->e);
    return NULL;
}

pv_status pv_engine_loop_start(pv_engine_loop **out, pv_engine *e)
{
    if (!out || !e)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_loop_start: NULL argument");
    *out = NULL;
    pv_engine_loop *l = calloc(1, sizeof *l);
    if (!l)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_loop_start: %zu bytes", sizeof *l);
    l->e = e;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->wake, NULL);
    pthread_cond_init(&l->done, NULL);
    int rc = pthread_create(&l->thread, NULL, loop_main, l);
    if (rc != 0) {
        pthread_cond_destroy(&l->done);
        pthread_cond_destroy(&l->wake);
        pthread_mutex_destroy(&l->mu);
        free(l);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_loop_start: pthread_create failed (error %d)", rc);
    }
    *out = l;
    return PV_OK;
}

pv_status pv_engine_loop_call(pv_engine_loop *l, pv_status (*fn)(pv_engine *e, void *arg), void *arg)
{
    if (!l || !fn)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_loop_call: loop and fn must not be NULL");
    loop_call c = {.fn = fn, .arg = arg};
    pthread_mutex_lock(&l->mu);
    if (l->stopping) {
        pthread_mutex_unlock(&l->mu);
        return pv_error(PV_ERR_STATE, "pv_engine_loop_call: the engine loop is stopping");
    }
    if (l->tail)
        l->tail->next = &c;
    else
        l->head = &c;
    l->tail = &c;
    pthread_cond_signal(&l->wake);
    while (!c.done)
        pthread_cond_wait(&l->done, &l->mu);
    pthread_mutex_unlock(&l->mu);
    if (c.status != PV_OK)
        return pv_error(c.status, "%s", c.message);
    return PV_OK;
}

pv_status pv_engine_loop_post(pv_engine_loop *l, pv_status (*fn)(pv_engine *e, void *arg), void *arg)
{
    if (!l || !fn)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_loop_post: loop and fn must not be NULL");
    loop_call *c = calloc(1, sizeof *c);
    if (!c)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_loop_post: %zu bytes", sizeof *c);
    c->fn = fn;
    c->arg = arg;
    c->detached = 1;
    pthread_mutex_lock(&l->mu);
    if (l->stopping) {
        pthread_mutex_unlock(&l->mu);
        free(c);
        return pv_error(PV_ERR_STATE, "pv_engine_loop_post: the engine loop is stopping");
    }
    if (l->tail)
        l->tail->next = c;
    else
        l->head = c;
    l->tail = c;
    pthread_cond_signal(&l->wake);
    pthread_mutex_unlock(&l->mu);
    return PV_OK;
}

void pv_engine_loop_stop(pv_engine_loop *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->stopping = 1;
    pthread_cond_signal(&l->wake);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    pthread_cond_destroy(&l->done);
    pthread_cond_destroy(&l->wake);
    pthread_mutex_destroy(&l->mu);
    free(l);
}
