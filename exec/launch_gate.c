/* Collective launch windows against device memory operations
 * (launch_gate.h): one mutex and one condition variable; every change
 * that may release a waiter broadcasts (a handful of threads, one per GPU). */
#include "exec/launch_gate.h"

#include <pthread.h>
#include <stdlib.h>

struct ps_launch_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int windows;     /* open */
    int mem_running;
    int mem_waiting;
    bool aborted;
};

ps_status ps_launch_gate_create(ps_launch_gate **out, ps_error *err)
{
    *out = NULL;
    ps_launch_gate *g = calloc(1, sizeof *g);
    if (g == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of host memory");
    if (pthread_mutex_init(&g->mu, NULL) != 0) {
        free(g);
        return ps_error_set(err, PS_ERR_INTERNAL, "launch gate: pthread_mutex_init failed");
    }
    if (pthread_cond_init(&g->cv, NULL) != 0) {
        pthread_mutex_destroy(&g->mu);
        free(g);
        return ps_error_set(err, PS_ERR_INTERNAL, "launch gate: pthread_cond_init failed");
    }
    *out = g;
    return PS_OK;
}

void ps_launch_gate_destroy(ps_launch_gate *g)
{
    if (g == NULL)
        return;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

void ps_launch_gate_mem_enter(ps_launch_gate *g)
{
    if (g == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    g->mem_waiting++;
    /* open windows close without waiting for anything (their members only
     * launch), also after an abort */
    while (g->windows > 0)
        pthread_cond_wait(&g->cv, &g->mu);
    g->mem_waiting--;
    g->mem_running++;
    pthread_mutex_unlock(&g->mu);
}

void ps_launch_gate_mem_exit(ps_launch_gate *g)
{
    if (g == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    if (--g->mem_running == 0)
        pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

bool ps_launch_gate_window_enter(ps_launch_gate *g, ps_launch_window *w)
{
    if (g == NULL)
        return true;
    pthread_mutex_lock(&g->mu);
    bool open = false;
    if (!g->aborted) {
        unsigned gen = w->gen;
        if (++w->arrived < w->members) {
            while (gen == w->gen && !g->aborted)
                pthread_cond_wait(&g->cv, &g->mu);
            open = gen != w->gen;
        } else {
            /* the last to arrive opens it, once memory operations are done:
             * waiting ones first, so that windows cannot starve them */
            while ((g->mem_running > 0 || g->mem_waiting > 0) && !g->aborted)
                pthread_cond_wait(&g->cv, &g->mu);
            if (!g->aborted) {
                w->arrived = 0;
                w->launching = w->members;
                w->gen++;
                g->windows++;
                pthread_cond_broadcast(&g->cv);
                open = true;
            }
        }
    }
    pthread_mutex_unlock(&g->mu);
    return open;
}

void ps_launch_gate_window_leave(ps_launch_gate *g, ps_launch_window *w)
{
    if (g == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    if (w->launching > 0 && --w->launching == 0) {
        g->windows--;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

void ps_launch_gate_abort(ps_launch_gate *g)
{
    if (g == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    g->aborted = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

int ps_launch_gate_open_windows(ps_launch_gate *g)
{
    pthread_mutex_lock(&g->mu);
    int n = g->windows;
    pthread_mutex_unlock(&g->mu);
    return n;
}

int ps_launch_gate_mem_running(ps_launch_gate *g)
{
    pthread_mutex_lock(&g->mu);
    int n = g->mem_running;
    pthread_mutex_unlock(&g->mu);
    return n;
}

int ps_launch_gate_mem_waiting(ps_launch_gate *g)
{
    pthread_mutex_lock(&g->mu);
    int n = g->mem_waiting;
    pthread_mutex_unlock(&g->mu);
    return n;
}
