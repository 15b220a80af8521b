#define _GNU_SOURCE /* sched_getaffinity */
#include "core/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include "core/log.h"

typedef struct loop {
    int n;
    ps_parallel_fn fn;
    void *ctx;
    void (*thread_done)(void);
    const char *progress;
    pthread_mutex_t lock;
    int next, finished; /* guarded by lock */
    bool ok;            /* guarded by lock */
} loop;

static void work(loop *l)
{
    for (;;) {
        pthread_mutex_lock(&l->lock);
        int i = l->ok && l->next < l->n ? l->next++ : -1;
        pthread_mutex_unlock(&l->lock);
        if (i < 0)
            return;
        bool ok = l->fn(l->ctx, i);
        pthread_mutex_lock(&l->lock);
        l->ok = l->ok && ok;
        l->finished++;
        if (l->progress != NULL && ps_log_progress_enabled())
            fprintf(stderr, "\r%s: %d/%d", l->progress, l->finished, l->n);
        pthread_mutex_unlock(&l->lock);
    }
}

static void *thread_main(void *arg)
{
    loop *l = arg;
    work(l);
    if (l->thread_done != NULL)
        l->thread_done();
    return NULL;
}

int ps_parallel_threads(void)
{
    /* the cores this process may run on (taskset, cgroups' cpusets), not
     * all the machine's */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0)
        cores = CPU_COUNT(&allowed);
    return cores < 1 ? 1 : cores > 64 ? 64 : (int)cores;
}

bool ps_parallel_for(int n, ps_parallel_fn fn, void *ctx, void (*thread_done)(void),
                     const char *progress)
{
    if (n <= 0)
        return true;
    int threads_n = ps_parallel_threads();
    if (threads_n > n)
        threads_n = n;
    loop l = {.n = n, .fn = fn, .ctx = ctx, .thread_done = thread_done, .progress = progress,
              .ok = true};
    pthread_mutex_init(&l.lock, NULL);
    pthread_t threads[64];
    int started = 0;
    for (int i = 1; i < threads_n; i++)
        if (pthread_create(&threads[started], NULL, thread_main, &l) == 0)
            started++;
    work(&l); /* this thread works too (and keeps its library state) */
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    pthread_mutex_destroy(&l.lock);
    if (progress != NULL && ps_log_progress_enabled())
        fprintf(stderr, "\n");
    return l.ok;
}
