/* pensieve-chat's /tune: the device profile pensieve-tune --quick would
 * write (include/pensieve/profile.h), fitted in process on the chat's own
 * backend and model through the tuning library, saved where the engine
 * looks for it, and used at once when no conversation holds KV yet. */
#include "apps/chat.h"

#include "tuning/tune.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* pensieve-tune --quick's measurements: contexts up to 1024 tokens, five
 * timed runs each. */
enum { TUNE_MAX_CONTEXT = 1024, TUNE_REPEATS = 5 };

/* A bar on a terminal, as pensieve-tune draws it; nothing otherwise. */
static void step(void *ctx, int done, int total, const char *what)
{
    (void)ctx;
    if (!isatty(STDOUT_FILENO))
        return;
    const int width = 30, filled = total ? done * width / total : width;
    printf("\r[%.*s%*s] %d/%d %-28s", filled, "##############################", width - filled, "", done, total,
           what);
    if (done == total)
        putchar('\n');
    fflush(stdout);
}

int chat_tune(chat *ch)
{
    char path[4096];
    pv_status st = PV_OK;
    if (ch->o->profile)
        snprintf(path, sizeof path, "%s", ch->o->profile);
    else if ((st = pv_profile_default_path(path, sizeof path)) != PV_OK)
        return chat_error("/tune", st);
    pv_backend *be = ch->stack.be;
    tune_setup s;
    tune_setup_init(&s, be, ch->stack.model, TUNE_REPEATS);
    printf("tuning the cost model of this %s device (%s): one chunk's forward pass and its attention at contexts of "
           "%d to %d tokens, %d runs each\n",
           be->ops->name, be->info.name, s.chunk_tokens, TUNE_MAX_CONTEXT, TUNE_REPEATS);
    fflush(stdout);
    pv_profile p;
    memset(&p, 0, sizeof p);
    tune_cost_report rep;
    const double t0 = tune_now_s();
    /* A full pensieve-tune run's kernel sets stay in the device's section. */
    if ((st = tune_keep_kernel_sets(path, be, 0, &p)) != PV_OK ||
        (st = tune_cost_model(&s, TUNE_MAX_CONTEXT, &p, &rep, step, NULL)) != PV_OK)
        return chat_error("/tune", st);
    if ((st = pv_profile_save(path, &p)) != PV_OK)
        return chat_error("/tune", st);
    printf("alpha %.3g s/token, beta %.3g s, c %.3g s (R^2 %.3f, held-out error %.0f%%) in %.1f s; "
           "profile [%s: %s] saved to %s\n",
           p.alpha, p.beta, p.c, p.r2, 100 * p.heldout_error, tune_now_s() - t0, p.backend, p.device, path);
    /* Another process on the device disturbs the timings (pensieve-tune's
     * test takes a spread above 25% for that); a fit that explains little
     * of them is worth taking again. */
    double spread = 0;
    for (uint32_t i = 0; i < p.n_points; i++)
        spread = p.points[i].spread > spread ? p.points[i].spread : spread;
    if (spread > 0.25 || p.r2 < 0.9)
        printf("note: noisy timings (spread up to %.0f%%, R^2 %.3f): something else was using the device; "
               "/tune again when it is quiet\n",
               100 * spread, p.r2);
    /* The cache ranks the KV it holds by the constants it started with: a
     * new engine takes the profile, which only an empty one can be. */
    pv_engine_stats es;
    if ((st = pv_engine_stats_get(ch->stack.engine, &es)) != PV_OK)
        return chat_error("/tune", st);
    if (es.sessions > 0) {
        printf("the conversations here keep the cost model they started with: restart pensieve-chat to use the "
               "profile (pensieve-serve and pensieve-bench take it at their next start)\n");
        return 0;
    }
    if (app_stack_restart_engine(&ch->stack, &ch->stack_options, "pensieve-chat") != 0)
        return -2; /* no engine left: the chat cannot go on */
    printf("in use now (no conversation had started); pensieve-serve and pensieve-bench take it at their next "
           "start\n");
    return 0;
}
