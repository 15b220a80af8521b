#include "exec/runtime.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/median.h"
#include "exec/box.h"
#include "exec/buffer_tile.h"
#include "exec/data.h"
#include "exec/half.h"
#include "exec/loss_scale.h"
#include "exec/memory_need.h"
#include "exec/peer_waits.h"
#include "traces/program_summary.h"
#include "traces/trace.h"

/* ---- the run's shared state ---- */

typedef struct exec_event {
    uint8_t category; /* ps_trace_category */
    int8_t phase;     /* of the enclosing RUN, -1 outside one */
    int mb, peer, group, coll;
    int op;           /* trace_ops: the op of a compute span, -2 a slice, -3 a load;
                       * -1: a merged span */
    int run;          /* the enclosing RUN (an index into the step's runs), -1 none */
    bool vote;        /* a collective that is the overflow vote */
    int begin, end;   /* timing slots */
    double flops, bytes;
} exec_event;

typedef struct exec_run {
    int8_t phase;
    int begin, end;
    double wait_s; /* what its events waited for peers (measure_step) */
} exec_run;

typedef struct exec_barrier {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, waiting;
    unsigned long generation;
    double released_s; /* host clock (ps_monotonic_s) at the last release */
} exec_barrier;

typedef struct runtime runtime;

/* What a device measured in one step (times from the step's origin). */
typedef struct step_times {
    double iteration_s, compute_s, comm_s;
    double phase_sum[PS_PHASE_COUNT];
    int32_t phase_runs[PS_PHASE_COUNT];
} step_times;

typedef struct device_state {
    runtime *rt;
    int device;
    const ps_program *prog;
    void **inst;      /* [n_buffers * (M + 1)]: instance memory */
    uint8_t *written; /* same index: written since its ALLOC */
    void **kept;      /* [n_buffers]: parameters and optimizer state between steps */
    int slot, n_slots;
    exec_event *events;
    int n_events, cap_events;
    exec_run *runs;
    int n_runs, cap_runs;
    int open_compute; /* index of the compute event being extended, -1 */
    long long reduce_slots;   /* this step's slots left for ops' own reductions (op_reduction) */
    long long reduce_reserve; /* what each step starts with: REDUCE_SLOTS per in-op reduction */
    int cur_phase, cur_mb, cur_run, step;
    /* The step's events on its common clock, what each waited for peers
     * (exec/peer_waits.h; [cap_events] each), and its iteration, seconds;
     * the other devices of the host read timed/step_events between the
     * step's end barrier and the next step's start. */
    ps_timed_event *timed;
    double *wait;
    ps_step_events step_events;
    double iteration_s;
    bool warming;     /* a warm-up step: nothing of it is kept or timed */
    double *loss_mb;  /* [M]: the loss each micro-batch wrote here */
    ps_loss_scaler scaler; /* dynamic loss scaling (the same on every device) */
    bool voted, overflow;  /* this step: the vote ran; its answer */
    uint8_t loss_partial;
    bool wrote_loss;
    /* The step's common time origin is the release of its start barrier:
     * start_s is when this device stamped its first slot after it (a thread
     * woken late on shared cores starts late), and every time of the step
     * (its events, its end) counts from that origin, so that the devices of
     * a host share one clock in the timeline. */
    double start_s;
    step_times *times; /* [steps] */
    ps_status status;
    ps_error err;
} device_state;

struct runtime {
    const ps_program_set *set;
    const ps_graph *g;
    ps_backend *b;
    const ps_exec_options *opt;
    int M; /* micro-batches */
    int *op_reduce_axis; /* [n_ops]: axis of an op's own collective, -1 none */
    device_state *dev;
    exec_barrier barrier;
    /* [n_devices]: every device's step events for the wait analysis: this
     * host's, and (several processes) the others' comm events as the last
     * step's end barrier received them (remote_events, remote_timed), NULL
     * before the first */
    const ps_step_events **step_events;
    ps_step_events *remote_events; /* [n_devices] */
    ps_timed_event *remote_timed;
    pthread_mutex_t mu; /* first error, parameter assembly */
    bool failed;       /* under barrier.mu: everybody leaves */
    bool have_first;   /* under mu: first_status/first_err hold the first error */
    ps_error first_err;
    ps_status first_status;
    ps_exec_result *result;
    ps_hosts *hosts;   /* NULL: every device is in this process */
    float **param_cover, **grad_cover; /* [n_tensors], several hosts and keep_params */
    /* [step * n_devices + device]: the loss a representative of the loss's
     * replicas summed over its micro-batches, added up in device order after
     * the run (in the order devices came, the sum would vary by rounding) */
    double *loss_part;
};

static void barrier_init(exec_barrier *b, int n)
{
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->n = n;
    b->waiting = 0;
    b->generation = 0;
}

static void barrier_destroy(exec_barrier *b)
{
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
}

/* One communication event of a device, as the processes exchange them. */
typedef struct comm_record {
    int32_t device, kind, with, what;
    double bytes, t0;
} comm_record;

/* Every process's comm events of the step to every process (the last of its
 * devices in the end barrier, after the processes' barrier): a device that
 * waited for a peer of another process finds what it waited for. Times count
 * from each process's own release of the step's start barrier, which the
 * processes pass together (an MPI barrier: their clocks agree to its skew). */
/* Out of memory in a process-wide exchange: the other processes would wait
 * for this one forever, so all of them stop (as ps_hosts_gather does); the
 * status is for form: ps_hosts_abort does not return. */
static ps_status exchange_out_of_memory(runtime *rt, ps_error *err)
{
    fprintf(stderr,
            "pipeshard: exec: rank %d of %d: out of host memory exchanging the step's "
            "times\n",
            ps_hosts_rank(rt->hosts), ps_hosts_count(rt->hosts));
    ps_hosts_abort(rt->hosts, 1);
    return ps_error_set(err, PS_ERR_NOMEM, "out of host memory");
}

static ps_status exchange_step_events(runtime *rt, ps_error *err)
{
    const ps_program_set *s = rt->set;
    size_t n = 0;
    for (int d = 0; d < s->n_devices; d++)
        if (ps_hosts_is_local(rt->hosts, d))
            for (int j = 0; j < rt->dev[d].n_events; j++)
                n += rt->dev[d].timed[j].kind != PS_WAIT_NONE;
    comm_record *mine = malloc((n > 0 ? n : 1) * sizeof *mine), *all = NULL;
    size_t *sizes = calloc((size_t)ps_hosts_count(rt->hosts), sizeof *sizes);
    if (mine == NULL || sizes == NULL) {
        free(mine);
        free(sizes);
        return exchange_out_of_memory(rt, err);
    }
    n = 0;
    for (int d = 0; d < s->n_devices; d++)
        for (int j = 0; ps_hosts_is_local(rt->hosts, d) && j < rt->dev[d].n_events; j++) {
            const ps_timed_event *t = &rt->dev[d].timed[j];
            if (t->kind != PS_WAIT_NONE)
                mine[n++] = (comm_record){d, t->kind, t->with, t->what, t->bytes, t->t0};
        }
    ps_status st = ps_hosts_allgather(rt->hosts, mine, n * sizeof *mine, (void **)&all, sizes, err);
    free(mine);
    if (st != PS_OK) {
        free(sizes);
        return st;
    }
    size_t total = 0;
    for (int h = 0; h < ps_hosts_count(rt->hosts); h++)
        total += sizes[h] / sizeof *all;
    free(sizes);
    ps_timed_event *ev = realloc(rt->remote_timed, (total > 0 ? total : 1) * sizeof *ev);
    if (ev == NULL) {
        free(all);
        return exchange_out_of_memory(rt, err);
    }
    rt->remote_timed = ev;
    /* the records come device by device (ranks own consecutive devices),
     * each device's in program order */
    for (int d = 0; d < s->n_devices; d++)
        rt->remote_events[d].n = 0;
    for (size_t i = 0; i < total; i++) {
        const comm_record *r = &all[i];
        ev[i] = (ps_timed_event){r->kind, r->with, r->what, r->bytes, r->t0, 0};
        if (r->device < 0 || r->device >= s->n_devices || ps_hosts_is_local(rt->hosts, r->device))
            continue;
        ps_step_events *x = &rt->remote_events[r->device];
        if (x->n == 0)
            x->ev = &ev[i];
        x->n++;
    }
    free(all);
    for (int d = 0; d < s->n_devices; d++) {
        if (ps_hosts_is_local(rt->hosts, d))
            continue;
        if (ps_step_events_index(&rt->remote_events[d], err) != PS_OK)
            return exchange_out_of_memory(rt, err);
        rt->step_events[d] = &rt->remote_events[d];
    }
    return PS_OK;
}

/* Returns false when the run failed (everybody leaves). *released_s (if
 * not NULL): the host clock at the release. exchange: the end barrier of a
 * timed step (exchange_step_events, across processes). */
static bool barrier_wait(runtime *rt, double *released_s, bool exchange)
{
    exec_barrier *b = &rt->barrier;
    pthread_mutex_lock(&b->mu);
    unsigned long gen = b->generation;
    if (++b->waiting == b->n) {
        if (rt->hosts != NULL && !rt->failed) {
            /* the other processes' devices too (this process's wait here) */
            ps_error e = {0};
            if (ps_hosts_barrier(rt->hosts, &e) != PS_OK ||
                (exchange && exchange_step_events(rt, &e) != PS_OK)) {
                rt->failed = true;
                pthread_mutex_lock(&rt->mu);
                if (!rt->have_first) {
                    rt->have_first = true;
                    rt->first_status = PS_ERR_DEVICE;
                    rt->first_err = e;
                }
                pthread_mutex_unlock(&rt->mu);
            }
        }
        b->waiting = 0;
        b->generation++;
        b->released_s = ps_monotonic_s();
        pthread_cond_broadcast(&b->cv);
    } else {
        while (gen == b->generation && !rt->failed)
            pthread_cond_wait(&b->cv, &b->mu);
    }
    bool ok = !rt->failed;
    if (released_s != NULL)
        *released_s = b->released_s;
    pthread_mutex_unlock(&b->mu);
    return ok;
}

static void fail(runtime *rt, device_state *d)
{
    bool first = false;
    /* Two devices can fail at once: the first error is decided under mu
     * (failed is set under the barrier's lock, later). */
    pthread_mutex_lock(&rt->mu);
    if (!rt->have_first) {
        rt->have_first = true;
        first = true;
        rt->first_status = d->status;
        rt->first_err = d->err;
    }
    pthread_mutex_unlock(&rt->mu);
    if (first && rt->opt->on_failure != NULL)
        rt->opt->on_failure(rt->opt->on_failure_arg, d->status, &d->err);
    pthread_mutex_lock(&rt->barrier.mu);
    rt->failed = true;
    pthread_cond_broadcast(&rt->barrier.cv);
    pthread_mutex_unlock(&rt->barrier.mu);
    if (first && rt->b->ops->abort)
        rt->b->ops->abort(rt->b);
}

/* ---- tiles and instances ---- */

static ps_tile tile_of(const runtime *rt, const device_state *d, int buffer, void *data)
{
    return ps_exec_buffer_tile(rt->set, rt->b->half_storage, d->prog, buffer, data);
}

static int64_t instance_index(const runtime *rt, int buffer, int mb)
{
    int m = rt->set->buffers[buffer].per_microbatch ? mb : -1;
    if (m < -1 || m >= rt->M)
        m = -1;
    return (int64_t)buffer * (rt->M + 1) + (m + 1);
}

static ps_status instance(device_state *d, int buffer, int mb, ps_tile *out)
{
    runtime *rt = d->rt;
    int64_t i = instance_index(rt, buffer, mb);
    if (d->inst[i] == NULL)
        return ps_error_set(&d->err, PS_ERR_INTERNAL,
                            "device %d: buffer %d (%s) micro-batch %d used before its alloc",
                            d->device, buffer,
                            rt->g->tensors[rt->set->buffers[buffer].tensor].name, mb);
    *out = tile_of(rt, d, buffer, d->inst[i]);
    return PS_OK;
}

static bool persistent(const runtime *rt, int buffer)
{
    return ps_exec_buffer_persistent(rt->set, buffer);
}

/* Host values (4 bytes each: float or int32) into a tile, rounded to half
 * precision first where the tile holds it. */
static ps_status upload_values(device_state *d, const ps_tile *t, void *host)
{
    runtime *rt = d->rt;
    int64_t n = ps_tile_numel(t);
    if (ps_tile_is_half(t))
        ps_half_narrow(t->dtype, host, host, n); /* in place */
    return rt->b->ops->upload(rt->b, d->device, t->data, host, n * ps_tile_elem_bytes(t),
                              &d->err);
}

/* A tile's values into host (n floats or int32), widened from half. */
static ps_status download_values(device_state *d, const ps_tile *t, void *host)
{
    runtime *rt = d->rt;
    int64_t n = ps_tile_numel(t);
    PS_TRY_RET(rt->b->ops->download(rt->b, d->device, host, t->data,
                                    n * ps_tile_elem_bytes(t), &d->err));
    if (ps_tile_is_half(t))
        ps_half_widen(t->dtype, host, host, n); /* in place */
    return PS_OK;
}

/* A parameter's values (or its master copy's) one unit in the last place
 * of the parameter's storage larger or smaller in magnitude
 * (ps_exec_options.nudge_params): fp32's, or the half type's where the
 * backend holds it so; a master copy moves with its parameter, by the same
 * amount. A zero moved down stays zero. */
static void nudge_param(const runtime *rt, int tensor, float *f, int64_t n)
{
    const ps_tensor *x = &rt->g->tensors[tensor];
    ps_dtype storage = x->kind == PS_TENSOR_PARAM ? x->desc.dtype
                                                  : rt->g->tensors[x->state_of].desc.dtype;
    bool up = rt->opt->nudge_params == PS_NUDGE_UP;
    if (!rt->b->half_storage || !ps_half_dtype(storage)) {
        for (int64_t i = 0; i < n; i++)
            f[i] = up ? nextafterf(f[i], f[i] < 0 ? -INFINITY : INFINITY) : nextafterf(f[i], 0);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = ps_half_from_float(storage, fabsf(f[i]));
        if (!up && h == 0)
            continue;
        float at = ps_half_to_float(storage, h);
        float next = ps_half_to_float(storage, up ? h + 1 : h - 1);
        if (isfinite(next) && isfinite(at))
            f[i] += copysignf(next - at, f[i]);
    }
}

static ps_status upload_fill(device_state *d, int buffer, int mb, const ps_tile *t)
{
    runtime *rt = d->rt;
    int64_t n = ps_tile_numel(t);
    void *host = malloc((size_t)(n > 0 ? n : 1) * 4);
    if (host == NULL)
        return ps_error_set(&d->err, PS_ERR_NOMEM, "device %d: out of host memory", d->device);
    int tensor = rt->set->buffers[buffer].tensor;
    ps_status st = ps_exec_fill(rt->g, tensor, mb, rt->opt->seed, t, host, &d->err);
    if (st == PS_OK && rt->opt->nudge_params != PS_NUDGE_NONE && !t->is_int &&
        ps_exec_holds_param(&rt->g->tensors[tensor]))
        nudge_param(rt, tensor, host, n);
    if (st == PS_OK)
        st = upload_values(d, t, host);
    free(host);
    return st;
}

static ps_status do_alloc(device_state *d, int buffer, int mb, bool program_level)
{
    runtime *rt = d->rt;
    int64_t i = instance_index(rt, buffer, mb);
    if (d->inst[i] != NULL)
        return ps_error_set(&d->err, PS_ERR_INTERNAL, "device %d: buffer %d allocated twice",
                            d->device, buffer);
    d->written[i] = 0;
    if (program_level && persistent(rt, buffer) && d->kept[buffer] != NULL) {
        d->inst[i] = d->kept[buffer];
        d->kept[buffer] = NULL;
        d->written[i] = 1;
        return PS_OK;
    }
    ps_tile t = tile_of(rt, d, buffer, NULL);
    int64_t bytes = ps_tile_numel(&t) * ps_tile_elem_bytes(&t);
    PS_TRY_RET(rt->b->ops->alloc(rt->b, d->device, bytes, &d->inst[i], &d->err));
    if (program_level && persistent(rt, buffer)) {
        t.data = d->inst[i];
        d->written[i] = 1;
        return upload_fill(d, buffer, mb, &t);
    }
    return PS_OK;
}

/* Copies a tile into the whole tensor `tensor` of a result array; with
 * `cover` (runs of several hosts), also marks the elements written (1.0)
 * so that the hosts' parts can be merged. */
static ps_status keep_tile(device_state *d, float **whole, float **cover, int tensor,
                           const ps_tile *t)
{
    runtime *rt = d->rt;
    int64_t n = ps_tile_numel(t);
    float *host = malloc((size_t)(n > 0 ? n : 1) * sizeof *host);
    if (host == NULL)
        return ps_error_set(&d->err, PS_ERR_NOMEM, "out of host memory");
    ps_status st = download_values(d, t, host);
    if (st == PS_OK) {
        pthread_mutex_lock(&rt->mu);
        for (int pass = 0; pass < (cover != NULL ? 2 : 1) && st == PS_OK; pass++) {
            float **slot = pass == 0 ? &whole[tensor] : &cover[tensor];
            if (*slot == NULL)
                *slot = calloc((size_t)ps_tile_global_numel(t), sizeof **slot);
            if (*slot == NULL) {
                st = ps_error_set(&d->err, PS_ERR_NOMEM, "out of host memory");
                break;
            }
            if (pass == 1)
                for (int64_t i = 0; i < n; i++)
                    host[i] = 1.0f;
            ps_tile local = *t, all = *t;
            local.dtype = all.dtype = PS_DTYPE_F32; /* widened */
            local.data = host;
            all.data = *slot;
            for (int k = 0; k < t->rank; k++) {
                all.shape[k] = t->global[k];
                all.offset[k] = 0;
            }
            ps_box_copy_host(&local, &all, t->offset, t->shape, false);
        }
        pthread_mutex_unlock(&rt->mu);
    }
    free(host);
    return st;
}

static ps_status do_free(device_state *d, int buffer, int mb, bool program_level)
{
    runtime *rt = d->rt;
    int64_t i = instance_index(rt, buffer, mb);
    if (d->inst[i] == NULL)
        return ps_error_set(&d->err, PS_ERR_INTERNAL,
                            "device %d: buffer %d freed while not allocated", d->device, buffer);
    if (program_level && persistent(rt, buffer)) {
        bool last = d->step == rt->opt->steps && !d->warming;
        const ps_tensor *t = &rt->g->tensors[rt->set->buffers[buffer].tensor];
        if (last && rt->opt->keep_params && t->kind == PS_TENSOR_PARAM) {
            ps_tile x = tile_of(rt, d, buffer, d->inst[i]);
            PS_TRY_RET(keep_tile(d, rt->result->params, rt->param_cover,
                                 rt->set->buffers[buffer].tensor, &x));
        }
        if (d->kept[buffer] != NULL)
            rt->b->ops->release(rt->b, d->device, d->kept[buffer]);
        d->kept[buffer] = d->inst[i];
    } else {
        rt->b->ops->release(rt->b, d->device, d->inst[i]);
    }
    d->inst[i] = NULL;
    d->written[i] = 0;
    return PS_OK;
}

/* ---- timing ---- */

static ps_status mark(device_state *d, int *slot)
{
    runtime *rt = d->rt;
    if (d->slot >= d->n_slots)
        return ps_error_set(&d->err, PS_ERR_INTERNAL, "device %d: out of timing slots",
                            d->device);
    *slot = d->slot++;
    return rt->b->ops->mark(rt->b, d->device, *slot, &d->err);
}

static ps_status close_compute(device_state *d)
{
    if (d->open_compute < 0)
        return PS_OK;
    exec_event *e = &d->events[d->open_compute];
    d->open_compute = -1;
    return mark(d, &e->end);
}

static ps_status open_event(device_state *d, ps_trace_category cat, const ps_instr *in,
                            int mb, exec_event **out)
{
    PS_TRY_RET(close_compute(d));
    if (d->n_events == d->cap_events) {
        int cap = d->cap_events ? 2 * d->cap_events : 256;
        exec_event *e = realloc(d->events, (size_t)cap * sizeof *e);
        if (e != NULL)
            d->events = e;
        ps_timed_event *t = e != NULL ? realloc(d->timed, (size_t)cap * sizeof *t) : NULL;
        if (t != NULL)
            d->timed = t;
        double *w = t != NULL ? realloc(d->wait, (size_t)cap * sizeof *w) : NULL;
        if (w == NULL)
            return ps_error_set(&d->err, PS_ERR_NOMEM, "out of host memory");
        d->wait = w;
        d->cap_events = cap;
    }
    exec_event *e = &d->events[d->n_events++];
    memset(e, 0, sizeof *e);
    e->category = (uint8_t)cat;
    e->phase = (int8_t)d->cur_phase;
    e->mb = mb;
    e->peer = in->peer;
    e->group =
        in->kind == PS_INSTR_COLLECTIVE ? ps_instr_group(d->rt->set, d->prog, in) : in->group;
    e->coll = in->coll;
    e->flops = in->flops;
    e->bytes = in->bytes;
    e->op = -1;
    e->run = d->cur_run;
    *out = e;
    return mark(d, &e->begin);
}

/* Compute instructions in a row share one event (as in the simulator). */
static ps_status compute_event(device_state *d, const ps_instr *in, int mb)
{
    if (d->rt->opt->trace_ops) {
        PS_TRY_RET(close_compute(d));
        exec_event *e;
        PS_TRY_RET(open_event(d, PS_TRACE_COMPUTE, in, mb, &e));
        e->op = in->kind == PS_INSTR_COMPUTE ? in->op : in->kind == PS_INSTR_SLICE ? -2 : -3;
        d->open_compute = (int)(e - d->events);
        return PS_OK;
    }
    if (d->open_compute >= 0) {
        d->events[d->open_compute].flops += in->flops;
        return PS_OK;
    }
    exec_event *e;
    PS_TRY_RET(open_event(d, PS_TRACE_COMPUTE, in, mb, &e));
    d->open_compute = (int)(e - d->events);
    return PS_OK;
}

static ps_status end_event(device_state *d, exec_event *e) { return mark(d, &e->end); }

/* ---- instructions ---- */

typedef struct reduce_arg {
    device_state *d;
    ps_exec_group g;
    const ps_instr *in; /* the op's COMPUTE, whose span resumes after the reduction */
    int mb;
} reduce_arg;

/* An op's own reduction (its loss statistics, batch norm's sums): timed as a
 * collective of its own between two parts of the op's compute span, as the
 * simulator replays it, while the step's reserve of slots lasts
 * (REDUCE_SLOTS per such instruction); beyond it, inside the compute. */
static ps_status op_reduction(reduce_arg *a, void *data, int64_t n, bool wide, ps_reduce_op op,
                              ps_error *err)
{
    device_state *d = a->d;
    runtime *rt = d->rt;
    bool timed = d->reduce_slots >= 4 && d->open_compute >= 0;
    exec_event *e = NULL;
    if (timed) {
        d->reduce_slots -= 4; /* the collective's two stamps, then the compute's two */
        ps_instr x = ps_instr_init(PS_INSTR_COLLECTIVE);
        x.coll = PS_COLL_ALL_REDUCE;
        x.bytes = (double)n * (wide ? 8 : 4);
        PS_TRY_RET(open_event(d, PS_TRACE_COLLECTIVE, &x, a->mb, &e));
        e->group = a->g.id;
    }
    ps_status st = wide ? rt->b->ops->reduce64(rt->b, d->device, &a->g, data, n, op, err)
                        : rt->b->ops->reduce(rt->b, d->device, &a->g, data, n, op, err);
    if (!timed || st != PS_OK)
        return st;
    PS_TRY_RET(end_event(d, e));
    PS_TRY_RET(compute_event(d, a->in, a->mb));
    d->events[d->open_compute].flops = 0; /* the op's FLOPs are on its first part */
    return PS_OK;
}

static ps_status reduce_trampoline(void *arg, float *data, int64_t n, ps_reduce_op op,
                                   ps_error *err)
{
    return op_reduction(arg, data, n, false, op, err);
}

static ps_status reduce64_trampoline(void *arg, double *data, int64_t n, ps_reduce_op op,
                                     ps_error *err)
{
    return op_reduction(arg, data, n, true, op, err);
}

static ps_exec_group group_view(const runtime *rt, const device_state *d, int group)
{
    ps_exec_group g = {.id = group, .n = 1, .devices = &d->device, .rank = 0};
    if (group < 0 || group >= rt->set->n_groups)
        return g;
    const ps_group *pg = &rt->set->groups[group];
    g.n = pg->n;
    g.devices = pg->devices;
    for (int i = 0; i < pg->n; i++)
        if (pg->devices[i] == d->device)
            g.rank = i;
    return g;
}

/* The destination of a write: the instance, or, for a sum already begun
 * (accumulated gradients), the instance added into by the op itself where
 * the backend can (`add`), else a scratch tile added to it afterwards. */
typedef struct write_target {
    ps_tile tile;
    void *instance;
    int64_t index;
    bool scratch;
    bool add;
} write_target;

/* `op` and `out`: the compute whose output this is (NULL for a collective). */
static ps_status target_open(device_state *d, int buffer, int mb, bool accumulate,
                             const ps_op *op, int out, write_target *w)
{
    runtime *rt = d->rt;
    PS_TRY_RET(instance(d, buffer, mb, &w->tile));
    w->index = instance_index(rt, buffer, mb);
    w->instance = w->tile.data;
    bool begun = accumulate && d->written[w->index];
    w->add = begun && op != NULL && rt->b->ops->op_accumulates != NULL &&
             rt->b->ops->op_accumulates(rt->b, op, out, &w->tile);
    w->scratch = begun && !w->add;
    if (w->scratch) {
        int64_t bytes = ps_tile_numel(&w->tile) * ps_tile_elem_bytes(&w->tile);
        PS_TRY_RET(rt->b->ops->alloc(rt->b, d->device, bytes, &w->tile.data, &d->err));
    }
    return PS_OK;
}

/* After a failure: the scratch goes back (an instance the op added into
 * may hold part of a sum: the run stops with the error). */
static void target_abandon(device_state *d, write_target *w, int n)
{
    runtime *rt = d->rt;
    for (int i = 0; i < n; i++)
        if (w[i].scratch) {
            rt->b->ops->release(rt->b, d->device, w[i].tile.data);
            w[i].scratch = false;
        }
}

static ps_status target_close(device_state *d, write_target *w, int mb)
{
    runtime *rt = d->rt;
    ps_status st = PS_OK;
    if (w->scratch) {
        ps_tile into = w->tile;
        into.data = w->instance;
        st = rt->b->ops->accumulate(rt->b, d->device, &into, &w->tile, &d->err);
        rt->b->ops->release(rt->b, d->device, w->tile.data);
        w->tile.data = w->instance;
    }
    d->written[w->index] = 1;
    int buffer = (int)(w->index / (rt->M + 1));
    if (st == PS_OK && rt->set->buffers[buffer].tensor == rt->g->loss && mb >= 0 && mb < rt->M) {
        ps_tile loss = w->tile;
        loss.data = w->instance;
        float v[1] = {0};
        if (ps_tile_numel(&loss) != 1)
            st = ps_error_set(&d->err, PS_ERR_INTERNAL, "device %d: the loss is not a scalar",
                              d->device);
        else
            st = download_values(d, &loss, v);
        d->loss_mb[mb] = v[0];
        d->loss_partial = rt->set->buffers[buffer].spec.partial;
        d->wrote_loss = true;
    }
    return st;
}

/* The kept RELU outputs of (step, micro-batch) of a result: a row of
 * n_tensors slots (ps_exec_result.relus). */
static float **relus_at(const ps_exec_result *r, int step, int mb)
{
    return r->relus +
           ((size_t)(step - 1) * (size_t)r->relu_micro_batches + (size_t)mb) * (size_t)r->n_tensors;
}

/* --check's ReLU alignment (ps_exec_options.align_relus): the outputs of
 * this RELU that lie on the other side of zero from the run's kept ones,
 * within align_tol of the output's largest magnitude, take the run's value. */
static ps_status relu_align(device_state *d, const ps_op *op, const ps_tile *y, int mb)
{
    runtime *rt = d->rt;
    const ps_exec_result *run = rt->opt->align_relus;
    const char *name = rt->g->tensors[op->out[0]].name;
    int u = ps_graph_find_tensor(rt->opt->align_graph, name);
    if (d->warming || u < 0 || d->step > run->steps || mb >= run->relu_micro_batches || y->is_int ||
        ps_tile_is_half(y))
        return PS_OK;
    const float *whole = relus_at(run, d->step, mb)[u];
    if (whole == NULL)
        return PS_OK;
    int64_t n = ps_tile_numel(y);
    float *mine = malloc((size_t)(n > 0 ? n : 1) * sizeof *mine);
    float *theirs = malloc((size_t)(n > 0 ? n : 1) * sizeof *theirs);
    if (mine == NULL || theirs == NULL) {
        free(mine);
        free(theirs);
        return ps_error_set(&d->err, PS_ERR_NOMEM, "out of host memory");
    }
    ps_status st = download_values(d, y, mine);
    if (st == PS_OK) {
        ps_tile all = *y, local = *y;
        all.data = (void *)whole;
        for (int k = 0; k < y->rank; k++) {
            all.shape[k] = y->global[k];
            all.offset[k] = 0;
        }
        local.data = theirs;
        ps_box_copy_host(&all, &local, y->offset, y->shape, false);
        float largest = 0;
        for (int64_t i = 0; i < n; i++)
            largest = fmaxf(largest, fabsf(mine[i]));
        double near = rt->opt->align_tol * largest;
        int64_t flips = 0, first = -1;
        for (int64_t i = 0; i < n; i++)
            if ((mine[i] > 0) != (theirs[i] > 0) && fabs((double)mine[i] - theirs[i]) <= near) {
                mine[i] = theirs[i];
                first = first < 0 ? i : first;
                flips++;
            }
        if (flips > 0) {
            st = rt->b->ops->upload(rt->b, d->device, y->data, mine, n * (int64_t)sizeof *mine,
                                    &d->err);
            pthread_mutex_lock(&rt->mu);
            if (rt->result->relu_flips == 0)
                snprintf(rt->result->relu_first, sizeof rt->result->relu_first,
                         "%s, step %d, micro-batch %d, element %lld", name, d->step, mb,
                         (long long)first);
            rt->result->relu_flips += flips;
            pthread_mutex_unlock(&rt->mu);
        }
    }
    free(mine);
    free(theirs);
    return st;
}

static ps_status relu_keep_align(device_state *d, const ps_op *op, const ps_tile *y, int mb)
{
    runtime *rt = d->rt;
    if (rt->opt->align_relus != NULL && rt->opt->align_relus->relus != NULL &&
        rt->opt->align_graph != NULL)
        PS_TRY_RET(relu_align(d, op, y, mb));
    if (rt->result->relus == NULL || d->warming || d->step < 1 || d->step > rt->opt->steps)
        return PS_OK;
    return keep_tile(d, relus_at(rt->result, d->step, mb), NULL, op->out[0], y);
}

static ps_status exec_compute(device_state *d, const ps_instr *in, int mb)
{
    runtime *rt = d->rt;
    const ps_op *op = &rt->g->ops[in->op];
    ps_tile tin[PS_MAX_OP_IO], tout[PS_MAX_OP_IO];
    write_target w[PS_MAX_OP_IO];
    const int *operand = &rt->set->operands[in->operands];
    for (int i = 0; i < op->n_in; i++)
        PS_TRY_RET(instance(d, operand[i], mb, &tin[i]));
    bool acc = (in->flags & PS_INSTR_ACCUMULATE) != 0;
    for (int o = 0; o < op->n_out; o++) {
        ps_status st = target_open(d, operand[op->n_in + o], mb, acc, op, o, &w[o]);
        if (st != PS_OK) {
            target_abandon(d, w, o);
            return st;
        }
        tout[o] = w[o].tile;
    }
    ps_op_context ctx = {.step = d->step, .reduce = {.group_size = 1}};
    for (int o = 0; o < op->n_out; o++)
        ctx.accumulate |= w[o].add ? 1u << o : 0u;
    ps_op scaled;
    if (rt->set->loss_scale_window > 0 && ps_op_scales_loss(op->kind)) {
        /* dynamic loss scaling: this step's scale, Adam's own step count */
        scaled = *op;
        scaled.attrs.scale = d->scaler.scale;
        op = &scaled;
        ctx.step = d->scaler.applied + 1;
        ctx.grads_checked = op->kind == PS_OP_ADAM && d->voted;
    }
    reduce_arg ra;
    int axis = rt->op_reduce_axis[in->op];
    if (axis >= 0) {
        ra.d = d;
        ra.in = in;
        ra.mb = mb;
        ra.g = group_view(rt, d, d->prog->axis_group[axis]);
        ctx.reduce.group_size = ra.g.n;
        ctx.reduce.arg = &ra;
        ctx.reduce.fn = reduce_trampoline;
        ctx.reduce.fn64 = rt->b->ops->reduce64 != NULL ? reduce64_trampoline : NULL;
    }
    ps_status st = PS_OK;
    if (op->kind == PS_OP_ADAM && op->n_in > 1 && rt->opt->keep_params &&
        d->step == rt->opt->steps && !d->warming)
        st = keep_tile(d, rt->result->grads, rt->grad_cover, op->in[0], &tin[1]);
    if (op->kind == PS_OP_ADAM && d->overflow) { /* the step is skipped */
        target_abandon(d, w, op->n_out);
        return st;
    }
    if (st == PS_OK)
        st = rt->b->ops->op(rt->b, d->device, op, tin, tout, &ctx, &d->err);
    if (st != PS_OK) {
        target_abandon(d, w, op->n_out);
        /* the backends' op messages name the op ("op "NAME" (kind): ..."), the
         * CUDA ones the device too: add only what is missing */
        char msg[PS_ERROR_MSG_MAX], device[32], named[PS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", d->err.msg);
        ps_error_clear(&d->err);
        size_t n = (size_t)snprintf(device, sizeof device, "device %d", d->device);
        snprintf(named, sizeof named, "op \"%s\"", op->name);
        bool has_device = strncmp(msg, device, n) == 0 && (msg[n] == ':' || msg[n] == ' ');
        bool has_op = strstr(msg, named) != NULL;
        return ps_error_set(&d->err, st, "%s%s%s%s%s%s", has_device ? "" : device,
                            has_device ? "" : ": ", has_op ? "" : "op ",
                            has_op ? "" : op->name, has_op ? "" : ": ", msg);
    }
    if (op->kind == PS_OP_RELU && mb >= 0 && mb < rt->M)
        st = relu_keep_align(d, op, &tout[0], mb);
    if (st != PS_OK) {
        target_abandon(d, w, op->n_out);
        return st;
    }
    for (int o = 0; o < op->n_out; o++)
        PS_TRY_RET(target_close(d, &w[o], mb));
    return PS_OK;
}

static ps_status exec_collective(device_state *d, const ps_instr *in, int mb, int group)
{
    runtime *rt = d->rt;
    ps_exec_group g = group_view(rt, d, group);
    write_target w;
    PS_TRY_RET(target_open(d, in->buffer, mb, (in->flags & PS_INSTR_ACCUMULATE) != 0, NULL, 0,
                              &w));
    ps_tile src = w.tile;
    ps_status st = PS_OK;
    if (in->src_buffer >= 0)
        st = instance(d, in->src_buffer, mb, &src);
    if (st == PS_OK)
        st = rt->b->ops->collective(rt->b, d->device, &g, (ps_collective)in->coll, &src, &w.tile,
                                    &d->err);
    if (st != PS_OK) {
        target_abandon(d, &w, 1);
        return st;
    }
    return target_close(d, &w, mb);
}

/* The overflow vote (dynamic loss scaling): this device's gradients are
 * checked, then the flag is all-reduced (max) over every device of the plan
 * in one float of backend memory, so every optimizer op of the step sees
 * the same answer. */
static ps_status exec_vote(device_state *d, const ps_instr *in, int mb, int group)
{
    runtime *rt = d->rt;
    const int *checked = &rt->set->operands[in->operands];
    int n = 0;
    while (checked[n] >= 0)
        n++;
    ps_tile *tiles = malloc(((size_t)n + 1) * sizeof *tiles);
    if (tiles == NULL)
        return ps_error_set(&d->err, PS_ERR_NOMEM, "out of host memory");
    ps_status st = PS_OK;
    for (int i = 0; i < n && st == PS_OK; i++)
        st = instance(d, checked[i], mb, &tiles[i]);
    bool found = false;
    if (st == PS_OK && n > 0) /* one call: one read-back on a GPU */
        st = rt->b->ops->find_nonfinite(rt->b, d->device, tiles, n, &found, &d->err);
    free(tiles);
    PS_TRY_RET(st);
    ps_exec_group g = group_view(rt, d, group);
    float flag = found ? 1.0f : 0.0f;
    if (g.n > 1) {
        void *mem = NULL;
        ps_tile t = {.data = NULL, .rank = 1, .shape = {1}, .global = {1}};
        PS_TRY_RET(rt->b->ops->alloc(rt->b, d->device, sizeof flag, &mem, &d->err));
        t.data = mem;
        st = upload_values(d, &t, &flag);
        if (st == PS_OK)
            st = rt->b->ops->reduce(rt->b, d->device, &g, mem, 1, PS_REDUCE_OP_MAX, &d->err);
        if (st == PS_OK)
            st = download_values(d, &t, &flag);
        rt->b->ops->release(rt->b, d->device, mem);
        PS_TRY_RET(st);
    }
    d->voted = true;
    d->overflow = flag != 0.0f;
    return PS_OK;
}

static ps_status exec_slice(device_state *d, const ps_instr *in, int mb)
{
    runtime *rt = d->rt;
    write_target w;
    ps_tile src;
    PS_TRY_RET(instance(d, in->src_buffer, mb, &src));
    PS_TRY_RET(target_open(d, in->buffer, mb, (in->flags & PS_INSTR_ACCUMULATE) != 0, NULL, 0,
                              &w));
    uint8_t fresh = rt->set->buffers[in->buffer].spec.partial &
                    (uint8_t)~rt->set->buffers[in->src_buffer].spec.partial;
    bool keeper = true; /* a replica made a partial sum: one member keeps it */
    for (int a = 0; a < PS_MESH_AXES; a++)
        if ((fresh & (1u << a)) && d->prog->coord[a] != 0)
            keeper = false;
    ps_status st = keeper ? rt->b->ops->copy_box(rt->b, d->device, &src, &w.tile, &d->err)
                          : rt->b->ops->zero(rt->b, d->device, &w.tile, &d->err);
    if (st != PS_OK) {
        target_abandon(d, &w, 1);
        return st;
    }
    return target_close(d, &w, mb);
}

static ps_status exec_load(device_state *d, const ps_instr *in, int mb)
{
    ps_tile t;
    PS_TRY_RET(instance(d, in->buffer, mb, &t));
    PS_TRY_RET(upload_fill(d, in->buffer, mb, &t));
    d->written[instance_index(d->rt, in->buffer, mb)] = 1;
    return PS_OK;
}

static void box_of(const runtime *rt, const ps_tile *t, int region, int64_t *off, int64_t *size)
{
    if (region >= 0) {
        const ps_region *r = &rt->set->regions[region];
        for (int k = 0; k < r->rank; k++) {
            off[k] = r->offset[k];
            size[k] = r->size[k];
        }
        return;
    }
    ps_tile_box(t, off, size);
}

static ps_status exec_p2p(device_state *d, const ps_instr *in)
{
    runtime *rt = d->rt;
    ps_tile t;
    PS_TRY_RET(instance(d, in->buffer, in->mb, &t));
    int64_t off[PS_MAX_RANK], size[PS_MAX_RANK];
    box_of(rt, &t, in->region, off, size);
    int chunks = in->chunks > 0 ? in->chunks : 1;
    if (in->kind == PS_INSTR_SEND)
        return rt->b->ops->send(rt->b, d->device, in->peer, &t, off, size, in->chunk, chunks,
                                &d->err);
    PS_TRY_RET(rt->b->ops->recv(rt->b, d->device, in->peer, &t, off, size, in->chunk, chunks,
                                &d->err));
    d->written[instance_index(rt, in->buffer, in->mb)] = 1;
    return PS_OK;
}

/* The all-gather after a local-all-gather transfer of whole parts: member
 * k % n of the group received region region + k whole; each sends its
 * regions to the others and receives theirs, in region order (the pairs'
 * messages match in order). */
static ps_status exec_parts_gather(device_state *d, const ps_instr *in, const ps_exec_group *g,
                                   ps_tile *t)
{
    runtime *rt = d->rt;
    int64_t off[PS_MAX_RANK], size[PS_MAX_RANK];
    for (int k = g->rank; k < in->chunks; k += g->n) {
        box_of(rt, t, in->region + k, off, size);
        for (int i = 0; i < g->n; i++)
            if (i != g->rank)
                PS_TRY_RET(rt->b->ops->send(rt->b, d->device, g->devices[i], t, off, size, 0, 1,
                                            &d->err));
    }
    for (int k = 0; k < in->chunks; k++) {
        if (k % g->n == g->rank)
            continue;
        box_of(rt, t, in->region + k, off, size);
        PS_TRY_RET(rt->b->ops->recv(rt->b, d->device, g->devices[k % g->n], t, off, size, 0, 1,
                                    &d->err));
    }
    return PS_OK;
}

/* The all-gather after a local-all-gather transfer: member r of the group
 * received flat chunk r of the region; every member sends its chunk to
 * the others and receives theirs. */
static ps_status exec_chunk_gather(device_state *d, const ps_instr *in)
{
    runtime *rt = d->rt;
    ps_exec_group g = group_view(rt, d, in->group);
    ps_tile t;
    PS_TRY_RET(instance(d, in->buffer, in->mb, &t));
    if (in->chunks > 1)
        return exec_parts_gather(d, in, &g, &t);
    int64_t off[PS_MAX_RANK], size[PS_MAX_RANK];
    box_of(rt, &t, in->region, off, size);
    for (int i = 0; i < g.n; i++)
        if (i != g.rank)
            PS_TRY_RET(rt->b->ops->send(rt->b, d->device, g.devices[i], &t, off, size, g.rank,
                                        g.n, &d->err));
    for (int i = 0; i < g.n; i++)
        if (i != g.rank)
            PS_TRY_RET(rt->b->ops->recv(rt->b, d->device, g.devices[i], &t, off, size, i, g.n,
                                        &d->err));
    return PS_OK;
}

static ps_status exec_kernel_instr(device_state *d, const ps_instr *in, int mb)
{
    exec_event *e;
    switch ((ps_instr_kind)in->kind) {
    case PS_INSTR_COMPUTE:
        PS_TRY_RET(compute_event(d, in, mb));
        return exec_compute(d, in, mb);
    case PS_INSTR_SLICE:
        PS_TRY_RET(compute_event(d, in, mb));
        return exec_slice(d, in, mb);
    case PS_INSTR_LOAD:
        PS_TRY_RET(compute_event(d, in, mb));
        return exec_load(d, in, mb);
    case PS_INSTR_COLLECTIVE:
        if (in->flags & PS_INSTR_FINITE_VOTE) {
            PS_TRY_RET(open_event(d, PS_TRACE_COLLECTIVE, in, mb, &e));
            e->vote = true;
            PS_TRY_RET(exec_vote(d, in, mb, in->group));
            return end_event(d, e);
        }
        if (in->buffer < 0)
            return PS_OK; /* run inside its op's COMPUTE */
        PS_TRY_RET(open_event(d, PS_TRACE_COLLECTIVE, in, mb, &e));
        e->group = d->prog->axis_group[in->axis >= 0 ? in->axis : 2];
        PS_TRY_RET(exec_collective(d, in, mb, e->group));
        return end_event(d, e);
    case PS_INSTR_ALLOC: return do_alloc(d, in->buffer, mb, false);
    case PS_INSTR_FREE: return do_free(d, in->buffer, mb, false);
    default:
        return ps_error_set(&d->err, PS_ERR_INTERNAL, "device %d: %s inside a kernel",
                            d->device, ps_instr_kind_names[in->kind]);
    }
}

static ps_status exec_run_kernel(device_state *d, const ps_instr *in)
{
    runtime *rt = d->rt;
    const ps_kernel *k = &rt->set->kernels[in->kernel];
    if (d->n_runs == d->cap_runs) {
        int cap = d->cap_runs ? 2 * d->cap_runs : 64;
        exec_run *r = realloc(d->runs, (size_t)cap * sizeof *r);
        if (r == NULL)
            return ps_error_set(&d->err, PS_ERR_NOMEM, "out of host memory");
        d->runs = r;
        d->cap_runs = cap;
    }
    exec_run *r = &d->runs[d->n_runs++];
    r->phase = (int8_t)k->phase;
    d->cur_phase = k->phase;
    d->cur_mb = in->mb;
    d->cur_run = d->n_runs - 1;
    PS_TRY_RET(mark(d, &r->begin));
    for (int i = 0; i < k->n_instrs; i++)
        PS_TRY_RET(exec_kernel_instr(d, &k->instrs[i], in->mb));
    PS_TRY_RET(close_compute(d));
    /* r may have moved if runs grew: it did not (no runs inside a run) */
    PS_TRY_RET(mark(d, &r->end));
    d->cur_phase = -1;
    d->cur_mb = -1;
    d->cur_run = -1;
    return PS_OK;
}

static ps_status exec_program_instr(device_state *d, const ps_instr *in)
{
    exec_event *e;
    switch ((ps_instr_kind)in->kind) {
    case PS_INSTR_RUN: return exec_run_kernel(d, in);
    case PS_INSTR_ALLOC: return do_alloc(d, in->buffer, in->mb, true);
    case PS_INSTR_FREE: return do_free(d, in->buffer, in->mb, true);
    case PS_INSTR_SEND:
    case PS_INSTR_RECV:
        PS_TRY_RET(open_event(d, in->kind == PS_INSTR_SEND ? PS_TRACE_SEND : PS_TRACE_RECV, in,
                              in->mb, &e));
        PS_TRY_RET(exec_p2p(d, in));
        return end_event(d, e);
    case PS_INSTR_COLLECTIVE:
        PS_TRY_RET(open_event(d, PS_TRACE_COLLECTIVE, in, in->mb, &e));
        if (in->coll == PS_COLL_ALL_GATHER && in->region >= 0 && in->src_buffer < 0)
            PS_TRY_RET(exec_chunk_gather(d, in));
        else
            PS_TRY_RET(exec_collective(d, in, in->mb, e->group)); /* open_event resolved it */
        return end_event(d, e);
    default:
        return ps_error_set(&d->err, PS_ERR_INTERNAL, "device %d: %s in a program", d->device,
                            ps_instr_kind_names[in->kind]);
    }
}

/* The slots an op's own reductions may take beyond its instructions', per
 * in-op COLLECTIVE instruction of a kernel run (op_reduction: 4 a call; the
 * loss's forward reduces twice). */
#define REDUCE_SLOTS 8

/* A program's in-op COLLECTIVE instructions, over its kernel runs. */
static long long in_op_reductions(const ps_program_set *s, const ps_program *p)
{
    long long n = 0;
    for (int i = 0; i < p->n_instrs; i++) {
        if (p->instrs[i].kind != PS_INSTR_RUN)
            continue;
        const ps_kernel *k = &s->kernels[p->instrs[i].kernel];
        for (int j = 0; j < k->n_instrs; j++)
            n += k->instrs[j].kind == PS_INSTR_COLLECTIVE && k->instrs[j].buffer < 0 &&
                 !(k->instrs[j].flags & PS_INSTR_FINITE_VOTE);
    }
    return n;
}

int ps_exec_timing_slots(const ps_program_set *s, int device)
{
    const ps_program *p = &s->programs[device];
    long long n = 4 + REDUCE_SLOTS * in_op_reductions(s, p);
    for (int i = 0; i < p->n_instrs; i++) {
        const ps_instr *in = &p->instrs[i];
        n += 2;
        if (in->kind == PS_INSTR_RUN)
            n += 2 + 2LL * s->kernels[in->kernel].n_instrs;
    }
    return n > 1000000000 ? 1000000000 : (int)n;
}

/* ---- one device ---- */

/* Steps whose times a device keeps: the last ones, at most
 * o->times_kept (a ring indexed by step). */
static int times_kept(const ps_exec_options *o)
{
    int most = o->times_kept > 0 ? o->times_kept : PS_EXEC_TIMES_KEPT;
    return o->steps < most ? o->steps : most;
}

static ps_status event_times(runtime *rt, device_state *d, const exec_event *e, double *t0,
                             double *dur, ps_error *err)
{
    PS_TRY_RET(rt->b->ops->elapsed(rt->b, d->device, 0, e->begin, t0, err));
    *t0 += d->start_s;
    return rt->b->ops->elapsed(rt->b, d->device, e->begin, e->end, dur, err);
}

/* The step's events on its common clock, indexed for the other devices'
 * wait analysis (on the device's own thread: a backend reads its own
 * device's stamps). */
static ps_status time_events(device_state *d)
{
    for (int j = 0; j < d->n_events; j++) {
        const exec_event *e = &d->events[j];
        ps_timed_event *t = &d->timed[j];
        t->kind = e->category == PS_TRACE_COLLECTIVE ? PS_WAIT_COLLECTIVE
                  : e->category == PS_TRACE_SEND     ? PS_WAIT_SEND
                  : e->category == PS_TRACE_RECV     ? PS_WAIT_RECV
                                                     : PS_WAIT_NONE;
        t->with = t->kind == PS_WAIT_COLLECTIVE ? e->group : e->peer;
        t->what = e->coll;
        t->bytes = e->bytes;
        PS_TRY_RET(event_times(d->rt, d, e, &t->t0, &t->dur, &d->err));
    }
    d->step_events.ev = d->timed;
    d->step_events.n = d->n_events;
    return ps_step_events_index(&d->step_events, &d->err);
}

/* The step's times: its iteration (from the step's origin), compute and
 * communication from every event, what waited for peers (d->wait) counted
 * as neither (the summary's idle), and its phases from the kernel runs, each
 * less what its collectives waited. */
static ps_status measure_step(device_state *d, double iteration_s, step_times *t)
{
    runtime *rt = d->rt;
    memset(t, 0, sizeof *t);
    t->iteration_s = iteration_s;
    for (int j = 0; j < d->n_runs; j++)
        d->runs[j].wait_s = 0;
    for (int j = 0; j < d->n_events; j++) {
        const exec_event *e = &d->events[j];
        if (e->category == PS_TRACE_COMPUTE)
            t->compute_s += d->timed[j].dur;
        else
            t->comm_s += d->timed[j].dur - d->wait[j];
        if (e->run >= 0 && e->run < d->n_runs)
            d->runs[e->run].wait_s += d->wait[j];
    }
    for (int j = 0; j < d->n_runs; j++) {
        double dur;
        PS_TRY_RET(rt->b->ops->elapsed(rt->b, d->device, d->runs[j].begin, d->runs[j].end, &dur,
                                       &d->err));
        t->phase_sum[d->runs[j].phase] += fmax(0.0, dur - d->runs[j].wait_s);
        t->phase_runs[d->runs[j].phase]++;
    }
    return PS_OK;
}

static ps_status run_step(device_state *d, double origin_s)
{
    runtime *rt = d->rt;
    d->slot = 0;
    d->n_events = d->n_runs = 0;
    d->open_compute = -1;
    d->reduce_slots = d->reduce_reserve;
    d->cur_phase = d->cur_mb = d->cur_run = -1;
    d->wrote_loss = false;
    d->voted = d->overflow = false;
    int first = 0, last = 0;
    if (!d->warming && d->device == rt->opt->straggler_device && rt->opt->straggler_s > 0) {
        double s = rt->opt->straggler_s;
        struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
        nanosleep(&t, NULL);
    }
    PS_TRY_RET(mark(d, &first));
    /* Where the stamps are host-clock readings, the mark's own; otherwise
     * the stream was idle (the last step finished) and a GPU stamps the mark
     * within microseconds of this reading. (A second reading on the host
     * would shift the device's whole timeline by a preemption between the
     * two.) */
    double first_host_s = 0;
    if (rt->b->ops->stamp_host_s != NULL)
        PS_TRY_RET(rt->b->ops->stamp_host_s(rt->b, d->device, first, &first_host_s, &d->err));
    else
        first_host_s = ps_monotonic_s();
    d->start_s = fmax(0.0, first_host_s - origin_s);
    for (int i = 0; i < d->prog->n_instrs; i++)
        PS_TRY_RET(exec_program_instr(d, &d->prog->instrs[i]));
    PS_TRY_RET(rt->b->ops->finish(rt->b, d->device, &d->err));
    PS_TRY_RET(mark(d, &last));
    PS_TRY_RET(rt->b->ops->finish(rt->b, d->device, &d->err));
    double iteration_s = 0;
    PS_TRY_RET(rt->b->ops->elapsed(rt->b, d->device, first, last, &iteration_s, &d->err));
    d->iteration_s = d->start_s + iteration_s;
    if (!d->warming)
        PS_TRY_RET(time_events(d)); /* measured after the step's end barrier */
    if (d->voted) {
        int s = d->step - 1;
        if (!d->warming) {
            pthread_mutex_lock(&rt->mu); /* every voter writes the same values */
            rt->result->loss_scale[s] = d->scaler.scale;
            rt->result->skipped[s] = d->overflow;
            pthread_mutex_unlock(&rt->mu);
        }
        PS_TRY_RET(ps_loss_scaler_update(&d->scaler, d->overflow, d->step, &d->err));
    }
    return PS_OK;
}

/* Parameters and optimizer state: allocated and filled from the seed
 * before the first step (set-up, not training: a device's first ALLOC of
 * each finds it kept, as in later steps), or (`refill`, after the warm-up
 * steps) filled again, so that the run's steps start where a run without
 * warm-up starts. */
static ps_status fill_persistent(device_state *d, bool refill)
{
    runtime *rt = d->rt;
    for (int k = 0; k < d->prog->n_instrs; k++) {
        const ps_instr *in = &d->prog->instrs[k];
        if (in->kind != PS_INSTR_ALLOC || !persistent(rt, in->buffer))
            continue;
        void *kept = d->kept[in->buffer];
        if (refill && kept != NULL) {
            ps_tile t = tile_of(rt, d, in->buffer, kept);
            PS_TRY_RET(upload_fill(d, in->buffer, in->mb, &t));
        } else if (!refill && kept == NULL) {
            PS_TRY_RET(do_alloc(d, in->buffer, in->mb, true));
            int64_t i = instance_index(rt, in->buffer, in->mb);
            d->kept[in->buffer] = d->inst[i];
            d->inst[i] = NULL;
        }
    }
    return PS_OK;
}

static void *device_main(void *arg)
{
    device_state *d = arg;
    runtime *rt = d->rt;
    d->status = fill_persistent(d, false);
    if (d->status != PS_OK) {
        fail(rt, d);
        return NULL;
    }
    int warmup = rt->opt->warmup_steps;
    for (int k = 1; k <= warmup + rt->opt->steps; k++) {
        int s = k - warmup;
        d->warming = s < 1;
        d->step = d->warming ? k : s;
        if (s == 1 && warmup > 0) {
            /* the run's steps start from the initial state */
            d->status = fill_persistent(d, true);
            ps_loss_scaler_init(&d->scaler, rt->set->loss_scale, rt->set->loss_scale_window);
            if (d->status != PS_OK) {
                fail(rt, d);
                return NULL;
            }
        }
        double origin_s = 0;
        if (!barrier_wait(rt, &origin_s, false))
            return NULL;
        d->status = run_step(d, origin_s);
        if (d->status != PS_OK) {
            fail(rt, d);
            return NULL;
        }
        if (!barrier_wait(rt, NULL, !d->warming))
            return NULL;
        /* every device of the host has timed its events: what waited for
         * peers, then the step's times (the next step's start barrier keeps
         * the others' events as they are meanwhile) */
        if (!d->warming) {
            ps_peer_waits(rt->step_events, rt->set->n_devices, d->device, rt->set, d->wait);
            d->status =
                measure_step(d, d->iteration_s, &d->times[(d->step - 1) % times_kept(rt->opt)]);
            if (d->status != PS_OK) {
                fail(rt, d);
                return NULL;
            }
        }
        /* the loss of this step: representatives of the loss's replicas */
        if (d->wrote_loss && !d->warming) {
            bool rep = true;
            const int *mesh = rt->set->stages[d->prog->stage].mesh;
            for (int a = 0; a < PS_MESH_AXES; a++)
                if (mesh[a] > 1 && !(d->loss_partial & (1u << a)) && d->prog->coord[a] != 0)
                    rep = false;
            if (rep) {
                double sum = 0;
                for (int m = 0; m < rt->M; m++)
                    sum += d->loss_mb[m];
                rt->loss_part[(size_t)(s - 1) * (size_t)rt->set->n_devices + (size_t)d->device] =
                    sum;
            }
        }
    }
    return NULL;
}

/* ---- summary and trace ---- */

/* What a device measured, as plain data: the process of rank 0 assembles
 * the summary and the trace from every host's reports. A head is followed
 * by the step_times of the run's last n_steps steps, in step order, then by
 * its n_events events (the last step's). */
typedef struct report_head {
    int32_t device, n_events, n_steps, pad;
    double peak_bytes;
} report_head;

typedef struct report_event {
    int32_t category, mb, peer, group;
    double t0, dur, bytes, flops;
    double wait; /* of dur, spent waiting for peers (exec/peer_waits.h) */
    char name[112];
} report_event;

static void event_name(const runtime *rt, const exec_event *e, char *name, size_t size)
{
    if (e->category == PS_TRACE_COMPUTE && e->op >= 0)
        snprintf(name, size, "%s", rt->g->ops[e->op].name);
    else if (e->category == PS_TRACE_COMPUTE && e->op < -1)
        snprintf(name, size, "%s", e->op == -2 ? "slice" : "load");
    else if (e->category == PS_TRACE_COMPUTE)
        ps_trace_compute_name(e->phase, e->mb, name, size);
    else if (e->category == PS_TRACE_COLLECTIVE && e->vote)
        snprintf(name, size, "finite vote group %d", e->group);
    else if (e->category == PS_TRACE_COLLECTIVE)
        snprintf(name, size, "%s group %d", ps_collective_names[e->coll], e->group);
    else
        snprintf(name, size, "%s %d", e->category == PS_TRACE_SEND ? "send to" : "recv from",
                 e->peer);
}

/* The reports of this process's devices, one after another (events only
 * when there is a trace to write). */
static ps_status build_reports(runtime *rt, void **out, size_t *bytes, ps_error *err)
{
    const ps_program_set *s = rt->set;
    bool events = rt->opt->trace_path != NULL;
    int kept = times_kept(rt->opt), first = rt->opt->steps - kept; /* 0-based */
    size_t total = 0;
    for (int i = 0; i < s->n_devices; i++)
        if (ps_hosts_is_local(rt->hosts, i))
            total += sizeof(report_head) + (size_t)kept * sizeof(step_times) +
                     (events ? (size_t)rt->dev[i].n_events * sizeof(report_event) : 0);
    char *buf = calloc(total > 0 ? total : 1, 1);
    if (buf == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    char *p = buf; /* calloc'd, and every record a multiple of 8 bytes: aligned */
    for (int i = 0; i < s->n_devices; i++) {
        if (!ps_hosts_is_local(rt->hosts, i))
            continue;
        device_state *d = &rt->dev[i];
        report_head *h = (report_head *)p;
        h->device = i;
        h->n_events = events ? d->n_events : 0;
        h->n_steps = kept;
        h->peak_bytes = (double)rt->b->ops->peak_bytes(rt->b, i);
        p += sizeof *h;
        for (int k = 0; k < kept; k++) /* the ring, in step order */
            memcpy(p + (size_t)k * sizeof(step_times), &d->times[(first + k) % kept],
                   sizeof(step_times));
        p += (size_t)kept * sizeof(step_times);
        report_event *ev = (report_event *)p;
        for (int j = 0; j < h->n_events; j++) {
            const exec_event *e = &d->events[j];
            report_event *r = &ev[j];
            r->category = e->category;
            r->mb = e->mb;
            r->peer = e->peer;
            r->group = e->group;
            r->t0 = d->timed[j].t0;
            r->dur = d->timed[j].dur;
            r->wait = d->wait[j];
            r->bytes = e->bytes;
            r->flops = e->flops;
            event_name(rt, e, r->name, sizeof r->name);
        }
        p += (size_t)h->n_events * sizeof(report_event);
    }
    *out = buf;
    *bytes = total;
    return PS_OK;
}
/* The summary (medians over the kept steps) and the timeline (the last
 * step), on rank 0, from every process's reports. */
static ps_status summarize(runtime *rt, ps_error *err)
{
    const ps_program_set *s = rt->set;
    void *mine = NULL, *all = NULL;
    size_t mine_bytes = 0;
    int hosts = ps_hosts_count(rt->hosts);
    size_t *sizes = calloc((size_t)hosts, sizeof *sizes);
    if (sizes == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    ps_status st = build_reports(rt, &mine, &mine_bytes, err);
    if (st != PS_OK) { /* the other hosts wait in the gather: stop them all */
        free(sizes);
        return st;
    }
    st = ps_hosts_gather(rt->hosts, mine, mine_bytes, &all, sizes, err);
    free(mine);
    if (st != PS_OK || ps_hosts_rank(rt->hosts) != 0) {
        free(sizes);
        free(all);
        return st;
    }
    size_t total = 0;
    for (int h = 0; h < hosts; h++)
        total += sizes[h];
    free(sizes);

    int steps = times_kept(rt->opt), first = rt->opt->steps - steps; /* 0-based */
    ps_summary *sum = NULL;
    ps_trace_writer *tw = NULL;
    double *vals = NULL;
    const report_head **head = NULL;
    char source[16];
    if (rt->opt->source != NULL)
        snprintf(source, sizeof source, "%s", rt->opt->source);
    else
        snprintf(source, sizeof source, "exec-%s", rt->b->ops->name);
    int dpn = rt->opt->devices_per_node > 0 ? rt->opt->devices_per_node : s->n_devices;
    PS_TRY(ps_summary_from_programs(s, source, NULL, dpn, &sum, err));
    /* every device's report, by device */
    head = calloc((size_t)s->n_devices, sizeof *head);
    vals = calloc((size_t)steps, sizeof *vals);
    if (head == NULL || vals == NULL) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t off = 0; off + sizeof(report_head) <= total;) {
        const report_head *h = (const report_head *)((const char *)all + off);
        if (h->device < 0 || h->device >= s->n_devices || head[h->device] != NULL ||
            h->n_events < 0 || h->n_steps != steps) {
            st = ps_error_set(err, PS_ERR_INTERNAL, "a malformed device report from a host");
            goto out;
        }
        head[h->device] = h;
        off += sizeof *h + (size_t)h->n_steps * sizeof(step_times) +
               (size_t)h->n_events * sizeof(report_event);
    }
    for (int i = 0; i < s->n_devices; i++)
        if (head[i] == NULL) {
            st = ps_error_set(err, PS_ERR_INTERNAL, "no host reported device %d", i);
            goto out;
        }
    if (rt->opt->trace_path != NULL) {
        PS_TRY(ps_trace_open(rt->opt->trace_path, dpn, &tw, err));
        ps_trace_set_info(tw, "source", sum->source);
        ps_trace_set_info(tw, "plan", s->plan_digest);
        ps_trace_set_info(tw, "model", s->model);
        ps_trace_set_info(tw, "cluster", s->cluster);
    }
#define TIMES(i) ((const step_times *)(head[i] + 1))
    /* a step ends with its last device, every device counting from the
     * step's origin */
    for (int k = 0; k < steps; k++) {
        double t = 0;
        for (int i = 0; i < s->n_devices; i++)
            t = fmax(t, TIMES(i)[k].iteration_s);
        rt->result->step_s[first + k] = vals[k] = t;
    }
    sum->iteration_s = ps_median(vals, steps);
    sum->timed_steps = steps;
    sum->iteration_min_s = sum->iteration_max_s = vals[0];
    for (int k = 1; k < steps; k++) {
        sum->iteration_min_s = fmin(sum->iteration_min_s, vals[k]);
        sum->iteration_max_s = fmax(sum->iteration_max_s, vals[k]);
    }
    /* the median step (the two middle ones when their number is even), by
     * time: each device's compute, communication and idle are that step's,
     * so that they add up to the iteration as in the other summaries (the
     * medians of each apart did not: up to 6% more) */
    const double *step_t = rt->result->step_s + first;
    int mid_lo = -1, mid_hi = -1;
    for (int k = 0; k < steps; k++) {
        int below = 0, equal_before = 0; /* rank of step k: by time, then index */
        for (int j = 0; j < steps; j++) {
            below += step_t[j] < step_t[k];
            equal_before += j < k && step_t[j] == step_t[k];
        }
        int rank = below + equal_before;
        if (rank == (steps - 1) / 2)
            mid_lo = k;
        if (rank == steps / 2)
            mid_hi = k;
    }
    for (int i = 0; i < s->n_devices; i++) {
        const report_head *h = head[i];
        ps_summary_device *sd = &sum->devices[i];
        int stage = sd->stage;
        sd->peak_memory_bytes = h->peak_bytes;
        const step_times *lo = &TIMES(i)[mid_lo], *hi = &TIMES(i)[mid_hi];
        sd->compute_s = 0.5 * (lo->compute_s + hi->compute_s);
        sd->comm_s = 0.5 * (lo->comm_s + hi->comm_s);
        /* the summary's identity, as its reader checks it */
        sd->idle_s = fmax(0.0, sum->iteration_s - sd->compute_s - sd->comm_s);
        sum->peak_memory_bytes = fmax(sum->peak_memory_bytes, sd->peak_memory_bytes);
        if (tw != NULL && stage >= 0) {
            char name[64];
            snprintf(name, sizeof name, "device %d (stage %d)", i, stage);
            ps_trace_name_device(tw, i, name);
        }
        const report_event *ev = (const report_event *)(TIMES(i) + h->n_steps);
        for (int j = 0; tw != NULL && j < h->n_events; j++) {
            const report_event *e = &ev[j];
            bool p2p = e->category == PS_TRACE_SEND || e->category == PS_TRACE_RECV;
            if (e->wait > 0) { /* as the simulator writes a receive that waited */
                char wname[64];
                bool recv = e->category == PS_TRACE_RECV;
                if (recv)
                    snprintf(wname, sizeof wname, "wait for %d", e->peer);
                else
                    snprintf(wname, sizeof wname, "wait for group %d", e->group);
                ps_trace_event we = {.device = i, .category = PS_TRACE_IDLE, .name = wname,
                                     .start_s = e->t0, .duration_s = e->wait,
                                     .micro_batch = e->mb, .stage = stage,
                                     .peer = recv ? e->peer : -1};
                PS_TRY(ps_trace_add(tw, &we));
            }
            ps_trace_event te = {.device = i, .category = (ps_trace_category)e->category,
                                 .name = e->name, .start_s = e->t0 + e->wait,
                                 .duration_s = e->dur - e->wait,
                                 .micro_batch = e->mb, .stage = stage,
                                 .peer = p2p ? e->peer : -1, .bytes = e->bytes,
                                 .flops = e->flops};
            PS_TRY(ps_trace_add(tw, &te));
        }
        if (stage >= 0) {
            ps_summary_stage *g = &sum->stages[stage];
            g->peak_memory_bytes = fmax(g->peak_memory_bytes, sd->peak_memory_bytes);
        }
    }
    /* A stage's phase in a step: its slowest device's mean run, each run
     * less what it waited for peers (a device that waits in a collective
     * for a straggler of its own phase adds nothing; one that entered the
     * phase early, while a peer finished the last one, adds nothing
     * either). Over the steps, the median (a step without such runs does
     * not count). */
    for (int k = 0; k < s->n_stages; k++) {
        double phase_s[PS_PHASE_COUNT];
        for (int ph = 0; ph < PS_PHASE_COUNT; ph++) {
            int n = 0;
            for (int t = 0; t < steps; t++) {
                double slowest = -1;
                for (int i = 0; i < s->n_devices; i++) {
                    const step_times *x = &TIMES(i)[t];
                    if (sum->devices[i].stage == k && x->phase_runs[ph] > 0)
                        slowest = fmax(slowest, x->phase_sum[ph] / x->phase_runs[ph]);
                }
                if (slowest >= 0)
                    vals[n++] = slowest;
            }
            phase_s[ph] = ps_median(vals, n);
        }
        ps_summary_stage *g = &sum->stages[k];
        g->forward_s = phase_s[PS_PHASE_FORWARD];
        g->backward_s = phase_s[PS_PHASE_BACKWARD];
        g->update_s = phase_s[PS_PHASE_UPDATE];
        g->time_s = g->forward_s + g->backward_s;
    }
#undef TIMES
    ps_summary_set_throughput(sum, s);
    rt->result->summary = sum;
    sum = NULL;
out:
    if (tw != NULL) {
        ps_status st2 = ps_trace_close(tw, st == PS_OK ? err : &(ps_error){0});
        if (st == PS_OK)
            st = st2;
    }
    free(head);
    free(all);
    free(vals);
    ps_summary_free(sum);
    return st;
}

/* Merges the hosts' parts of whole tensors into rank 0's result: element
 * by element, from whichever host wrote it (their `cover` is 1). */
static ps_status merge_tensors(runtime *rt, float **whole, float **cover, ps_error *err)
{
    int hosts = ps_hosts_count(rt->hosts);
    size_t *sizes = calloc((size_t)hosts, sizeof *sizes);
    if (sizes == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    ps_status st = PS_OK;
    for (int t = 0; t < rt->g->n_tensors && st == PS_OK; t++) {
        size_t n = whole[t] != NULL ? (size_t)ps_tensor_desc_numel(&rt->g->tensors[t].desc) : 0;
        float *mine = malloc(2 * n * sizeof *mine + 1);
        if (mine == NULL) {
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
            break;
        }
        if (n > 0) {
            memcpy(mine, whole[t], n * sizeof *mine);
            memcpy(mine + n, cover[t], n * sizeof *mine);
        }
        void *all = NULL;
        st = ps_hosts_gather(rt->hosts, mine, 2 * n * sizeof *mine, &all, sizes, err);
        free(mine);
        if (st == PS_OK && ps_hosts_rank(rt->hosts) == 0) {
            const char *p = all;
            for (int h = 0; h < hosts; h++) {
                size_t m = sizes[h] / (2 * sizeof(float));
                const float *v = (const float *)p, *c = v + m;
                p += sizes[h];
                if (h == 0 || m == 0)
                    continue;
                if (whole[t] == NULL && (whole[t] = calloc(m, sizeof(float))) == NULL) {
                    st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
                    break;
                }
                for (size_t i = 0; i < m; i++)
                    if (c[i] != 0)
                        whole[t][i] = v[i];
            }
        }
        free(all);
    }
    free(sizes);
    return st;
}

/* ---- the run ---- */

ps_exec_options ps_exec_options_default(void)
{
    ps_exec_options o = {.seed = 1, .steps = 1, .source = NULL, .straggler_device = -1};
    return o;
}

void ps_exec_result_free(ps_exec_result *r)
{
    if (r == NULL)
        return;
    for (int i = 0; i < r->n_tensors; i++) {
        if (r->params != NULL)
            free(r->params[i]);
        if (r->grads != NULL)
            free(r->grads[i]);
    }
    size_t n_relus = (size_t)r->steps * (size_t)r->relu_micro_batches * (size_t)r->n_tensors;
    for (size_t i = 0; r->relus != NULL && i < n_relus; i++)
        free(r->relus[i]);
    free(r->relus);
    free(r->params);
    free(r->grads);
    free(r->loss);
    free(r->loss_scale);
    free(r->skipped);
    free(r->step_s);
    ps_summary_free(r->summary);
    free(r);
}


ps_status ps_exec_run(const ps_program_set *s, ps_backend *b, const ps_exec_options *o,
                      ps_exec_result **out, ps_error *err)
{
    ps_status st = PS_OK;
    *out = NULL;
    if (o->steps < 1)
        return ps_error_set(err, PS_ERR_INVALID, "steps must be at least 1 (got %d)", o->steps);
    if (o->warmup_steps < 0)
        return ps_error_set(err, PS_ERR_INVALID, "warm-up steps must be at least 0 (got %d)",
                            o->warmup_steps);
    if (b->n_devices != s->n_devices)
        return ps_error_set(err, PS_ERR_INVALID,
                            "the backend serves %d devices but the plan has %d", b->n_devices,
                            s->n_devices);
    if (!o->skip_memory_check)
        PS_TRY_RET(ps_exec_check_memory(
            s, b, o->hosts != NULL && ps_hosts_count(o->hosts) > 1 ? o->hosts : NULL, err));
    runtime rt;
    memset(&rt, 0, sizeof rt);
    rt.set = s;
    rt.g = s->step;
    rt.b = b;
    rt.opt = o;
    rt.M = s->micro_batches > 0 ? s->micro_batches : 1;
    rt.hosts = o->hosts != NULL && ps_hosts_count(o->hosts) > 1 ? o->hosts : NULL;
    pthread_t *threads = NULL;
    int started = 0;
    size_t n_inst = (size_t)s->n_buffers * (size_t)(rt.M + 1);
    double t_start = ps_monotonic_s();
    ps_exec_result *r = calloc(1, sizeof *r);
    PS_TRY_ALLOC(r, err);
    rt.result = r;
    r->steps = o->steps;
    r->n_tensors = rt.g->n_tensors;
    r->loss = calloc((size_t)o->steps, sizeof *r->loss);
    r->loss_scale = calloc((size_t)o->steps, sizeof *r->loss_scale);
    r->skipped = calloc((size_t)o->steps, sizeof *r->skipped);
    r->step_s = calloc((size_t)o->steps, sizeof *r->step_s);
    r->params = calloc((size_t)rt.g->n_tensors, sizeof *r->params);
    r->grads = calloc((size_t)rt.g->n_tensors, sizeof *r->grads);
    rt.op_reduce_axis = malloc((size_t)(rt.g->n_ops > 0 ? rt.g->n_ops : 1) * sizeof(int));
    rt.dev = calloc((size_t)s->n_devices, sizeof *rt.dev);
    rt.step_events = calloc((size_t)s->n_devices, sizeof *rt.step_events);
    rt.remote_events = calloc((size_t)s->n_devices, sizeof *rt.remote_events);
    threads = calloc((size_t)s->n_devices, sizeof *threads);
    rt.loss_part = calloc((size_t)o->steps * (size_t)s->n_devices, sizeof *rt.loss_part);
    if (o->keep_relus && rt.hosts == NULL) {
        r->relu_micro_batches = rt.M;
        r->relus = calloc((size_t)o->steps * (size_t)rt.M * (size_t)rt.g->n_tensors,
                          sizeof *r->relus);
        if (r->relus == NULL) {
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    if (rt.hosts != NULL && o->keep_params) {
        rt.param_cover = calloc((size_t)rt.g->n_tensors, sizeof *rt.param_cover);
        rt.grad_cover = calloc((size_t)rt.g->n_tensors, sizeof *rt.grad_cover);
        if (rt.param_cover == NULL || rt.grad_cover == NULL) {
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    if (r->loss == NULL || r->loss_scale == NULL || r->skipped == NULL || r->step_s == NULL ||
        r->params == NULL || r->grads == NULL || rt.op_reduce_axis == NULL || rt.dev == NULL ||
        threads == NULL || rt.loss_part == NULL || rt.step_events == NULL ||
        rt.remote_events == NULL) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < rt.g->n_ops; i++)
        rt.op_reduce_axis[i] = -1;
    for (int k = 0; k < s->n_kernels; k++)
        for (int i = 0; i < s->kernels[k].n_instrs; i++) {
            const ps_instr *in = &s->kernels[k].instrs[i];
            if (in->kind == PS_INSTR_COLLECTIVE && in->buffer < 0 && in->op >= 0 &&
                in->op < rt.g->n_ops)
                rt.op_reduce_axis[in->op] = in->axis >= 0 ? in->axis : 2;
        }
    int n_local = 0;
    for (int i = 0; i < s->n_devices; i++) {
        device_state *d = &rt.dev[i];
        d->rt = &rt;
        d->device = i;
        d->prog = &s->programs[i];
        ps_loss_scaler_init(&d->scaler, s->loss_scale, s->loss_scale_window);
        if (!ps_hosts_is_local(rt.hosts, i))
            continue; /* another process runs it */
        n_local++;
        rt.step_events[i] = &d->step_events;
        d->n_slots = ps_exec_timing_slots(s, i);
        d->reduce_reserve = REDUCE_SLOTS * in_op_reductions(s, d->prog);
        d->inst = calloc(n_inst > 0 ? n_inst : 1, sizeof *d->inst);
        d->written = calloc(n_inst > 0 ? n_inst : 1, 1);
        d->kept = calloc((size_t)(s->n_buffers > 0 ? s->n_buffers : 1), sizeof *d->kept);
        d->loss_mb = calloc((size_t)rt.M, sizeof *d->loss_mb);
        d->times = calloc((size_t)times_kept(o), sizeof *d->times);
        if (d->inst == NULL || d->written == NULL || d->kept == NULL || d->loss_mb == NULL ||
            d->times == NULL) {
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    pthread_mutex_init(&rt.mu, NULL);
    barrier_init(&rt.barrier, n_local);
    for (int i = 0; i < s->n_devices; i++) {
        if (!ps_hosts_is_local(rt.hosts, i))
            continue;
        if (pthread_create(&threads[started], NULL, device_main, &rt.dev[i]) != 0) {
            rt.dev[i].status = ps_error_set(&rt.dev[i].err, PS_ERR_NOMEM,
                                            "cannot start the thread of device %d", i);
            fail(&rt, &rt.dev[i]);
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    if (rt.failed) {
        st = rt.first_status != PS_OK ? rt.first_status : PS_ERR_DEVICE;
        *err = rt.first_err;
    } else {
        for (int k = 0; k < o->steps; k++)
            for (int i = 0; i < s->n_devices; i++)
                r->loss[k] += rt.loss_part[(size_t)k * (size_t)s->n_devices + (size_t)i];
        /* the loss of every host's devices; whole parameters and gradients
         * and the summary on rank 0 */
        st = ps_hosts_sum(rt.hosts, r->loss, o->steps, err);
        if (st == PS_OK && rt.param_cover != NULL)
            st = merge_tensors(&rt, r->params, rt.param_cover, err);
        if (st == PS_OK && rt.grad_cover != NULL)
            st = merge_tensors(&rt, r->grads, rt.grad_cover, err);
        if (st == PS_OK)
            st = summarize(&rt, err);
        for (int t = 0; ps_hosts_rank(rt.hosts) != 0 && t < rt.g->n_tensors; t++) {
            free(r->params[t]); /* this host's part only: rank 0 has the whole */
            free(r->grads[t]);
            r->params[t] = r->grads[t] = NULL;
        }
    }
    r->wall_s = ps_monotonic_s() - t_start;
    if (r->summary != NULL)
        r->summary->wall_s = r->wall_s;
    barrier_destroy(&rt.barrier);
    pthread_mutex_destroy(&rt.mu);
out:
    if (rt.dev != NULL)
        for (int i = 0; i < s->n_devices; i++) {
            device_state *d = &rt.dev[i];
            if (d->inst != NULL)
                for (size_t j = 0; j < n_inst; j++)
                    if (d->inst[j] != NULL)
                        b->ops->release(b, i, d->inst[j]);
            if (d->kept != NULL)
                for (int j = 0; j < s->n_buffers; j++)
                    if (d->kept[j] != NULL)
                        b->ops->release(b, i, d->kept[j]);
            free(d->inst);
            free(d->written);
            free(d->kept);
            free(d->loss_mb);
            free(d->times);
            free(d->events);
            free(d->timed);
            free(d->wait);
            ps_step_events_free(&d->step_events);
            free(d->runs);
        }
    free(rt.dev);
    free(rt.step_events);
    for (int i = 0; rt.remote_events != NULL && i < s->n_devices; i++)
        ps_step_events_free(&rt.remote_events[i]);
    free(rt.remote_events);
    free(rt.remote_timed);
    free(rt.loss_part);
    free(rt.op_reduce_axis);
    for (int t = 0; t < rt.g->n_tensors; t++) {
        if (rt.param_cover != NULL)
            free(rt.param_cover[t]);
        if (rt.grad_cover != NULL)
            free(rt.grad_cover[t]);
    }
    free(rt.param_cover);
    free(rt.grad_cover);
    free(threads);
    if (st == PS_OK)
        *out = r;
    else
        ps_exec_result_free(r);
    return st;
}
