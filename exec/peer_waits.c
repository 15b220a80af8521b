#include "exec/peer_waits.h"

#include <math.h>
#include <stdlib.h>

/* A communication event by what it matches on: (kind, group or peer), then
 * its place in the step. */
typedef struct ps_wait_ref {
    uint64_t key;
    int event;
} ps_wait_ref;

static uint64_t key_of(int kind, int with)
{
    return (uint64_t)(uint32_t)kind << 32 | (uint32_t)with;
}

static int ref_cmp(const void *a, const void *b)
{
    const ps_wait_ref *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->event > y->event) - (x->event < y->event);
}

ps_status ps_step_events_index(ps_step_events *s, ps_error *err)
{
    int n = 0;
    for (int i = 0; i < s->n; i++)
        n += s->ev[i].kind != PS_WAIT_NONE;
    if (n > s->cap_refs) {
        ps_wait_ref *r = realloc(s->refs, (size_t)n * sizeof *r);
        if (r == NULL)
            return ps_error_set(err, PS_ERR_NOMEM, "out of host memory");
        s->refs = r;
        s->cap_refs = n;
    }
    s->n_refs = 0;
    for (int i = 0; i < s->n; i++)
        if (s->ev[i].kind != PS_WAIT_NONE)
            s->refs[s->n_refs++] = (ps_wait_ref){key_of(s->ev[i].kind, s->ev[i].with), i};
    if (s->n_refs > 1) /* refs is NULL while nothing was ever indexed */
        qsort(s->refs, (size_t)s->n_refs, sizeof *s->refs, ref_cmp);
    return PS_OK;
}

void ps_step_events_free(ps_step_events *s)
{
    free(s->refs);
    s->refs = NULL;
    s->n_refs = s->cap_refs = 0;
}

/* The k-th event of s with `key`, or NULL. */
static const ps_timed_event *kth(const ps_step_events *s, uint64_t key, int k)
{
    int lo = 0, hi = s->n_refs;
    while (lo < hi) { /* the first ref with key >= key */
        int mid = lo + (hi - lo) / 2;
        if (s->refs[mid].key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo + k >= s->n_refs || s->refs[lo + k].key != key)
        return NULL;
    return &s->ev[s->refs[lo + k].event];
}

/* When the event's peers were all there: the matching send's start, the
 * last member's entry; NAN where it is not known. */
static double peers_ready_s(const ps_step_events *const *steps, int n_devices, int device,
                            const ps_program_set *set, const ps_timed_event *e, int k)
{
    if (e->kind == PS_WAIT_RECV) {
        if (e->with < 0 || e->with >= n_devices || steps[e->with] == NULL)
            return NAN;
        const ps_timed_event *s = kth(steps[e->with], key_of(PS_WAIT_SEND, device), k);
        return s != NULL && s->bytes == e->bytes ? s->t0 : NAN;
    }
    if (e->kind != PS_WAIT_COLLECTIVE || e->with < 0 || e->with >= set->n_groups)
        return NAN;
    const ps_group *g = &set->groups[e->with];
    double last = e->t0;
    for (int i = 0; i < g->n; i++) {
        int j = g->devices[i];
        if (j == device)
            continue;
        if (j < 0 || j >= n_devices || steps[j] == NULL)
            return NAN;
        const ps_timed_event *m = kth(steps[j], key_of(PS_WAIT_COLLECTIVE, e->with), k);
        if (m == NULL || m->what != e->what)
            return NAN;
        last = fmax(last, m->t0);
    }
    return last;
}

void ps_peer_waits(const ps_step_events *const *steps, int n_devices, int device,
                   const ps_program_set *set, double *wait)
{
    const ps_step_events *s = steps[device];
    for (int i = 0; i < s->n; i++)
        wait[i] = 0;
    /* refs are sorted by key, then by place: the k-th of a key is its k-th
     * occurrence in the step */
    for (int r = 0, k = 0; r < s->n_refs; r++) {
        k = r > 0 && s->refs[r].key == s->refs[r - 1].key ? k + 1 : 0;
        const ps_timed_event *e = &s->ev[s->refs[r].event];
        if (e->kind == PS_WAIT_SEND)
            continue;
        double ready = peers_ready_s(steps, n_devices, device, set, e, k);
        if (ready > e->t0) /* false for NAN */
            wait[s->refs[r].event] = fmin(ready - e->t0, e->dur);
    }
}
