/* A parallel for loop over the machine's cores: the planner's independent
 * intra-op solves (stage cost table entries, the chosen stages) run on it. */
#ifndef PS_CORE_PARALLEL_H
#define PS_CORE_PARALLEL_H

#include <stdbool.h>

/* One item; returns false to stop handing out further items (an error). */
typedef bool (*ps_parallel_fn)(void *ctx, int item);

/* Runs fn(ctx, i) for i in [0, n), items handed out in order, on one thread
 * per core this process may run on (at most 64 and at most n; the calling thread is one of
 * them). thread_done (may be NULL) runs at the end of every thread started
 * here, for per-thread library state. With `progress` non-NULL and progress
 * enabled (core/log.h), "\r<progress>: <done>/<n>" goes to stderr. Returns
 * false when some fn returned false (items not yet started are skipped). */
/* The threads ps_parallel_for runs on at most: the cores this process may
 * run on, at most 64. */
int ps_parallel_threads(void);

bool ps_parallel_for(int n, ps_parallel_fn fn, void *ctx, void (*thread_done)(void),
                     const char *progress);

#endif
