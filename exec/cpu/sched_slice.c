#include "exec/cpu/sched_slice.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/clock.h"
#include "core/median.h"

/* A clock gap longer than this is the thread off its core (timer interrupts
 * and clock reads take a few µs). */
#define PREEMPTION_GAP_S 20e-6
#define MAX_RUNS 100000
#define MIN_RUNS 20

typedef struct spinner {
    double seconds;
    double *runs; /* [MAX_RUNS]: uninterrupted runs, seconds */
    int n_runs;
} spinner;

static void *spin(void *arg)
{
    spinner *s = arg;
    double t0 = ps_monotonic_s(), last = t0, run_start = t0;
    bool first = true; /* the run before the first preemption started anywhere */
    for (;;) {
        double t = ps_monotonic_s();
        if (t - last > PREEMPTION_GAP_S) {
            if (!first && s->n_runs < MAX_RUNS)
                s->runs[s->n_runs++] = last - run_start;
            first = false;
            run_start = t;
        }
        last = t;
        if (t - t0 > s->seconds)
            break;
    }
    return NULL;
}

ps_status ps_measure_scheduler_slice(int threads, double seconds, double *slice_s, ps_error *err)
{
    *slice_s = 0;
    if (threads < 2 || threads > 4096 || !(seconds > 0 && seconds <= 60))
        return ps_error_set(err, PS_ERR_INVALID,
                            "scheduler slice: 2 to 4096 threads for up to 60 s (got %d, %g s)",
                            threads, seconds);
    ps_status st = PS_OK;
    spinner *sp = calloc((size_t)threads, sizeof *sp);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    double *all = NULL;
    int started = 0, total = 0;
    if (sp == NULL || th == NULL) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < threads; i++) {
        sp[i].seconds = seconds;
        sp[i].runs = malloc(MAX_RUNS * sizeof *sp[i].runs);
        if (sp[i].runs == NULL) {
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    for (; started < threads; started++)
        if (pthread_create(&th[started], NULL, spin, &sp[started]) != 0) {
            st = ps_error_set(err, PS_ERR_NOMEM, "scheduler slice: cannot start thread %d",
                              started);
            break;
        }
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (st != PS_OK)
        goto out;
    for (int i = 0; i < threads; i++)
        total += sp[i].n_runs;
    if (total < MIN_RUNS)
        goto out; /* no preemptions: no slice to see */
    all = malloc((size_t)total * sizeof *all);
    if (all == NULL) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    total = 0;
    for (int i = 0; i < threads; i++)
        for (int k = 0; k < sp[i].n_runs; k++)
            all[total++] = sp[i].runs[k];
    *slice_s = ps_median(all, total);
out:
    for (int i = 0; sp != NULL && i < threads; i++)
        free(sp[i].runs);
    free(sp);
    free(th);
    free(all);
    return st;
}
