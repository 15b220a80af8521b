#include "exec/profile.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/median.h"

/* Upper bound of back-to-back calls in one repetition (tiny messages). */
#define MAX_ITERS 1000
#define MAX_REPS 1000
/* Shortest repetition of GEMMs timed on every device at once. */
#define SHARED_REP_S 0.05

/* Cubes, transformer-like rectangles, and thin and batched shapes of the
 * kinds attention computes (per-head products 64 and 128 wide: Q K^T is
 * S x S x d, its product with V S x d x S), so that a GEMM of any kind
 * finds measured ones of similar arithmetic intensity (docs/profile-db.md). */
static const ps_gemm_shape default_shapes[] = {
    {64, 64, 64, 1},       {128, 128, 128, 1},     {256, 256, 256, 1},    {512, 512, 512, 1},
    {1024, 1024, 1024, 1}, {2048, 2048, 2048, 1},  {2048, 512, 512, 1},   {512, 2048, 512, 1},
    {2048, 2048, 512, 1},  {4096, 1024, 1024, 1},  {4096, 4096, 64, 1},   {4096, 4096, 128, 1},
    {64, 4096, 4096, 1},   {256, 256, 64, 32},     {256, 64, 256, 32},    {512, 512, 64, 32},
    {512, 64, 512, 32},    {1024, 1024, 64, 32},   {1024, 64, 1024, 32},  {2048, 2048, 64, 32},
    {2048, 64, 2048, 32},  {1024, 1024, 128, 32},  {1024, 128, 1024, 32},
};
/* Passes of the default and quick profiles: the median of three outvotes
 * one pass that a slow spell of the machine hit (docs/profile-db.md). */
#define DEFAULT_PASSES 3

static const ps_gemm_shape quick_shapes[] = {
    {64, 64, 64, 1}, {128, 128, 128, 1}, {256, 256, 256, 1}, {128, 128, 64, 8}, {128, 64, 128, 8}};

ps_profile_options ps_profile_options_default(void)
{
    return (ps_profile_options){
        .shapes = default_shapes,
        .n_shapes = (int)(sizeof default_shapes / sizeof *default_shapes),
        .min_bytes = 1 << 10,
        .max_bytes = 64 << 20,
        .size_factor = 2,
        .warmup = 2,
        .reps = 9,
        .passes = DEFAULT_PASSES,
        .min_rep_s = 5e-3,
    };
}

ps_profile_options ps_profile_options_quick(void)
{
    return (ps_profile_options){
        .shapes = quick_shapes,
        .n_shapes = (int)(sizeof quick_shapes / sizeof *quick_shapes),
        .min_bytes = 1 << 10,
        .max_bytes = 4 << 20,
        .size_factor = 4,
        .max_group = 4,
        .warmup = 2,
        .reps = 5,
        .passes = DEFAULT_PASSES,
        .min_rep_s = 5e-4,
    };
}

/* ---- threads and an abortable barrier ---------------------------------- */

typedef struct shared {
    ps_backend *b;
    const ps_profile_options *o;
    ps_profile_db *db;
    int n; /* threads (group size) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned generation;
    bool failed;
    ps_error err; /* the first failure */
    ps_status st;
    const float *host;         /* read-only source data, max elements */
    const float *host_nonneg;  /* its absolute values (Adam's second moment) */
    double *times;     /* [n * reps]: seconds per call, per rank and repetition */
    double *warm;      /* [n]: seconds of one warm-up call per rank */
    int iters;
    int pass;           /* 0-based: warnings are for the first */
    bool compute_phase; /* GEMMs or ops: gemm_all_devices applies */
    /* the GEMMs to time: the options' shapes, then the graphs' (owned) */
    ps_gemm_shape *shapes;
    int n_shapes;
    /* the ops to time, one per (kind, bytes), convolutions one per (kind,
     * shape): op_graph[i], op_index[i] */
    int n_ops;
    int *op_graph, *op_index;
    bool *op_unsupported; /* [n_ops]: the backend has no such op (set by any rank) */
} shared;

/* Records a failure and unblocks every peer: those waiting in the barrier
 * here, and (through abort) those inside a collective or a receive. */
static void fail(shared *s, ps_status st, const ps_error *err)
{
    pthread_mutex_lock(&s->mu);
    bool first = !s->failed;
    if (first) {
        s->failed = true;
        s->st = st;
        s->err = *err;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (first)
        s->b->ops->abort(s->b);
}

/* Returns false when a peer failed. */
static bool barrier(shared *s)
{
    pthread_mutex_lock(&s->mu);
    unsigned gen = s->generation;
    if (++s->arrived == s->n) {
        s->arrived = 0;
        s->generation++;
        pthread_cond_broadcast(&s->cv);
    } else {
        while (gen == s->generation && !s->failed)
            pthread_cond_wait(&s->cv, &s->mu);
    }
    bool ok = !s->failed;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

typedef struct worker {
    shared *s;
    int rank;
    ps_status (*fn)(shared *s, int rank, ps_error *err);
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    ps_error err = {0};
    ps_log_set_thread_rank(w->rank);
    ps_status st = w->fn(w->s, w->rank, &err);
    if (st != PS_OK)
        fail(w->s, st, &err);
    return NULL;
}

/* Runs fn on n threads (ranks 0..n-1, which are devices 0..n-1). */
static ps_status run_threads(shared *s, int n, ps_status (*fn)(shared *, int, ps_error *),
                             ps_error *err)
{
    pthread_t *th = malloc((size_t)n * sizeof *th);
    worker *w = malloc((size_t)n * sizeof *w);
    int started = 0;
    if (th == NULL || w == NULL) {
        free(th);
        free(w);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    s->n = n;
    s->arrived = 0;
    for (int r = 0; r < n; r++) {
        w[r] = (worker){s, r, fn};
        if (pthread_create(&th[r], NULL, worker_main, &w[r]) != 0) {
            ps_error e = {0};
            ps_error_set(&e, PS_ERR_INTERNAL, "cannot start the thread of device %d", r);
            fail(s, PS_ERR_INTERNAL, &e);
            break;
        }
        started++;
    }
    for (int r = 0; r < started; r++)
        pthread_join(th[r], NULL);
    free(th);
    free(w);
    if (s->failed) {
        ps_error_clear(err);
        return ps_error_set(err, s->st, "%s", s->err.msg);
    }
    return PS_OK;
}

/* Median over repetitions of the slowest rank's time per call. */
static double slowest_median(const shared *s, int n)
{
    int reps = s->o->reps;
    double v[MAX_REPS];
    for (int k = 0; k < reps; k++) {
        v[k] = 0;
        for (int r = 0; r < n; r++)
            v[k] = fmax(v[k], s->times[r * reps + k]);
    }
    return ps_median(v, reps);
}

/* After each rank's warm-up: rank 0 picks the calls per repetition from the
 * slowest rank's fastest warm-up call. */
static bool agree_iters(shared *s, int rank, double warm_s)
{
    s->warm[rank] = warm_s;
    if (!barrier(s))
        return false;
    if (rank == 0) {
        double slowest = 0;
        for (int r = 0; r < s->n; r++)
            slowest = fmax(slowest, s->warm[r]);
        /* devices sharing hardware take turns in scheduler time slices
         * (milliseconds): a repetition must span several to see it */
        double min_rep_s = s->o->min_rep_s;
        if (s->o->gemm_all_devices && s->n > 1 && s->compute_phase)
            min_rep_s = fmax(min_rep_s, SHARED_REP_S);
        double want = slowest > 0 ? ceil(min_rep_s / slowest) : MAX_ITERS;
        s->iters = want < 1 ? 1 : want > MAX_ITERS ? MAX_ITERS : (int)want;
    }
    return barrier(s);
}

/* ---- one measurement: warm-up, then timed repetitions --------------------- */

typedef ps_status (*call_fn)(shared *s, int rank, void *arg, ps_error *err);

/* Times call(arg) on every rank; s->times receives seconds per call divided
 * by `per_call` (the transfers one call makes). */
static ps_status timed(shared *s, int rank, call_fn call, void *arg, int per_call, bool *ok,
                       ps_error *err)
{
    ps_status st = PS_OK;
    ps_backend *b = s->b;
    const ps_profile_options *o = s->o;
    double t = 0, fastest = INFINITY;
    *ok = false;
    for (int i = 0; i < o->warmup; i++) {
        PS_TRY(b->ops->mark(b, rank, 0, err));
        PS_TRY(call(s, rank, arg, err));
        PS_TRY(b->ops->mark(b, rank, 1, err));
        PS_TRY(b->ops->finish(b, rank, err));
        PS_TRY(b->ops->elapsed(b, rank, 0, 1, &t, err));
        fastest = fmin(fastest, t);
    }
    /* the fastest warm-up call: one delayed wake-up must not shrink the
     * repetitions to single calls */
    if (!agree_iters(s, rank, fastest))
        goto out;
    for (int k = 0; k < o->reps; k++) {
        if (!barrier(s))
            goto out;
        PS_TRY(b->ops->mark(b, rank, 0, err));
        for (int i = 0; i < s->iters; i++)
            PS_TRY(call(s, rank, arg, err));
        PS_TRY(b->ops->mark(b, rank, 1, err));
        PS_TRY(b->ops->finish(b, rank, err));
        PS_TRY(b->ops->elapsed(b, rank, 0, 1, &t, err));
        s->times[rank * o->reps + k] = t / s->iters / per_call;
    }
    *ok = barrier(s); /* every rank's times are in */
out:
    return st;
}

/* ---- GEMMs ------------------------------------------------------------- */

typedef struct gemm_call {
    ps_op op;
    ps_tile in[2], out;
} gemm_call;

static ps_status gemm_once(shared *s, int rank, void *arg, ps_error *err)
{
    gemm_call *g = arg;
    return s->b->ops->op(s->b, rank, &g->op, g->in, &g->out, NULL, err);
}

/* A rows x cols matrix, or a batch of them (batch > 1). */
static ps_tile matrix(void *data, int64_t batch, int64_t rows, int64_t cols)
{
    ps_tensor_desc d = {.dtype = PS_DTYPE_F32, .rank = 2, .shape = {rows, cols}};
    if (batch > 1)
        d = (ps_tensor_desc){.dtype = PS_DTYPE_F32, .rank = 3, .shape = {batch, rows, cols}};
    return ps_tile_whole(data, &d);
}

static ps_status add_gemm(shared *s, ps_op_kind kind, const ps_gemm_shape *sh, ps_dtype dtype,
                          double sec, ps_error *err)
{
    ps_profile_gemm e = {.op = kind, .m = sh->m, .n = sh->n, .k = sh->k, .batch = sh->batch,
                         .dtype = dtype, .seconds = sec};
    if (s->o->progress)
        fprintf(stderr,
                "profile: pass %d: %s %lld x %lld x %lld (batch %lld) %s: %.4g s, %.4g TFLOP/s\n",
                s->pass + 1, kind == PS_OP_MATMUL ? "GEMM" : ps_op_kind_get(kind)->name,
                (long long)sh->m, (long long)sh->n, (long long)sh->k, (long long)e.batch,
                ps_dtype_name(dtype), sec, ps_gemm_shape_flops(sh) / sec / 1e12);
    return ps_profile_db_add_gemm(s->db, &e, err);
}

/* GEMMs through an external timer, one measurement per dtype. */
static ps_status gemm_timed_natively(shared *s, ps_error *err)
{
    ps_status st = PS_OK;
    const ps_profile_options *o = s->o;
    int n_dt = o->n_dtypes > 0 ? o->n_dtypes : 1;
    for (int i = 0; i < s->n_shapes; i++)
        for (int d = 0; d < n_dt; d++) {
            ps_dtype t = o->n_dtypes > 0 ? o->dtypes[d] : PS_DTYPE_F32;
            double sec = 0;
            PS_TRY(o->gemm_timer(o->gemm_timer_arg, &s->shapes[i], t, o->reps, &sec, err));
            if (!(sec > 0)) {
                st = ps_error_set(err, PS_ERR_DEVICE, "profile: the GEMM timer returned %g s", sec);
                goto out;
            }
            PS_TRY(add_gemm(s, PS_OP_MATMUL, &s->shapes[i], t, sec, err));
        }
out:
    return st;
}

static ps_status gemm_thread(shared *s, int rank, ps_error *err)
{
    ps_status st = PS_OK;
    ps_backend *b = s->b;
    const ps_profile_options *o = s->o;
    void *buf[3] = {NULL, NULL, NULL};
    gemm_call g;
    if (o->gemm_timer != NULL) /* one thread (see ps_profile_measure) */
        return gemm_timed_natively(s, err);
    memset(&g, 0, sizeof g);
    g.op.name = "profile-gemm";
    g.op.kind = PS_OP_MATMUL;
    g.op.forward_op = -1;
    g.op.n_in = 2;
    g.op.n_out = 1;
    g.op.in[1] = 1;
    g.op.out[0] = 2;
    g.op.attrs = ps_op_attrs_default(PS_OP_MATMUL);
    for (int i = 0; i < s->n_shapes; i++) {
        const ps_gemm_shape *sh = &s->shapes[i];
        int64_t nb = sh->batch;
        snprintf(g.op.attrs.einsum, sizeof g.op.attrs.einsum, "%s",
                 nb > 1 ? "bmk,bkn->bmn" : "mk,kn->mn");
        int64_t elems[3] = {nb * sh->m * sh->k, nb * sh->k * sh->n, nb * sh->m * sh->n};
        for (int t = 0; t < 3; t++) {
            PS_TRY(b->ops->alloc(b, rank, elems[t] * 4, &buf[t], err));
            if (t < 2)
                PS_TRY(b->ops->upload(b, rank, buf[t], s->host, elems[t] * 4, err));
        }
        g.in[0] = matrix(buf[0], nb, sh->m, sh->k);
        g.in[1] = matrix(buf[1], nb, sh->k, sh->n);
        g.out = matrix(buf[2], nb, sh->m, sh->n);
        bool ok;
        PS_TRY(timed(s, rank, gemm_once, &g, 1, &ok, err));
        if (!ok)
            goto out;
        /* one measurement, recorded for every dtype (see the header) */
        double sec = slowest_median(s, s->n);
        int n_dt = o->n_dtypes > 0 ? o->n_dtypes : 1;
        for (int d = 0; d < n_dt && rank == 0; d++)
            PS_TRY(add_gemm(s, PS_OP_MATMUL, sh, o->n_dtypes > 0 ? o->dtypes[d] : PS_DTYPE_F32, sec,
                            err));
        for (int t = 0; t < 3; t++) {
            b->ops->release(b, rank, buf[t]);
            buf[t] = NULL;
        }
    }
out:
    for (int t = 0; t < 3; t++)
        if (buf[t] != NULL)
            b->ops->release(b, rank, buf[t]);
    return st;
}

/* ---- other ops ------------------------------------------------------------ */

/* The kinds timed here: all but MATMUL (timed with the GEMMs). */
static bool timed_kind(ps_op_kind k)
{
    return k != PS_OP_MATMUL && k != PS_OP_RESHAPE;
}

/* A convolution's GEMM on whole tensors; false for another kind. */
static bool conv_shape(const ps_graph *g, const ps_op *op, ps_gemm_shape *out)
{
    if (!ps_profile_gemm_kind(op->kind) || op->kind == PS_OP_MATMUL || op->n_in < 2 ||
        op->n_out < 1)
        return false;
    ps_tensor_desc in[2] = {g->tensors[op->in[0]].desc, g->tensors[op->in[1]].desc};
    return ps_conv_gemm_shape(op->kind, in, &g->tensors[op->out[0]].desc, out, NULL) == PS_OK;
}

/* What the cost model counts for the op on whole tensors: the bytes of its
 * inputs and outputs. */
static int64_t op_bytes(const ps_graph *g, const ps_op *op)
{
    double bytes = 0;
    for (int i = 0; i < op->n_in; i++)
        bytes += ps_tensor_bytes(&g->tensors[op->in[i]]);
    for (int k = 0; k < op->n_out; k++)
        bytes += ps_tensor_bytes(&g->tensors[op->out[k]]);
    return (int64_t)bytes;
}

/* The ops to time: the first of each (kind, bytes) over the graphs, of a
 * convolution the first of each (kind, GEMM shape). */
static ps_status choose_ops(shared *s, ps_error *err)
{
    const ps_profile_options *o = s->o;
    int total = 0;
    for (int i = 0; i < o->n_op_graphs; i++)
        total += o->op_graphs[i]->n_ops;
    s->op_graph = malloc((size_t)(total > 0 ? total : 1) * sizeof *s->op_graph);
    s->op_index = malloc((size_t)(total > 0 ? total : 1) * sizeof *s->op_index);
    s->op_unsupported = calloc((size_t)(total > 0 ? total : 1), sizeof *s->op_unsupported);
    if (s->op_graph == NULL || s->op_index == NULL || s->op_unsupported == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < o->n_op_graphs; i++) {
        const ps_graph *g = o->op_graphs[i];
        for (int j = 0; j < g->n_ops; j++) {
            const ps_op *op = &g->ops[j];
            int64_t bytes = op_bytes(g, op);
            ps_gemm_shape conv, other;
            bool is_conv = conv_shape(g, op, &conv);
            if (!timed_kind(op->kind) || bytes < 1 || (ps_profile_gemm_kind(op->kind) && !is_conv))
                continue;
            bool seen = false;
            for (int q = 0; q < s->n_ops && !seen; q++) {
                const ps_graph *h = o->op_graphs[s->op_graph[q]];
                const ps_op *p = &h->ops[s->op_index[q]];
                seen = p->kind == op->kind &&
                       (is_conv ? conv_shape(h, p, &other) && other.m == conv.m &&
                                      other.n == conv.n && other.k == conv.k
                                : op_bytes(h, p) == bytes);
            }
            if (seen)
                continue;
            s->op_graph[s->n_ops] = i;
            s->op_index[s->n_ops++] = j;
        }
    }
    return PS_OK;
}

typedef struct op_call {
    const ps_op *op;
    ps_tile in[PS_MAX_OP_IO], out[PS_MAX_OP_IO];
} op_call;

static ps_status op_once(shared *s, int rank, void *arg, ps_error *err)
{
    op_call *c = arg;
    ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
    return s->b->ops->op(s->b, rank, c->op, c->in, c->out, &ctx, err);
}

static ps_status ops_thread(shared *s, int rank, ps_error *err)
{
    ps_status st = PS_OK;
    ps_backend *b = s->b;
    void *buf[2 * PS_MAX_OP_IO];
    int n_buf = 0;
    for (int q = 0; q < s->n_ops; q++) {
        if (s->pass > 0 && s->op_unsupported[q]) /* left out in the first pass: in every one */
            continue;
        const ps_graph *g = s->o->op_graphs[s->op_graph[q]];
        op_call c = {.op = &g->ops[s->op_index[q]]};
        const ps_op *op = c.op;
        for (int t = 0; t < op->n_in + op->n_out; t++) {
            bool input = t < op->n_in;
            const ps_tensor *x = &g->tensors[input ? op->in[t] : op->out[t - op->n_in]];
            int64_t numel = ps_tensor_numel(x);
            PS_TRY(b->ops->alloc(b, rank, numel * 4, &buf[n_buf], err));
            ps_tile tile = ps_tile_whole(buf[n_buf++], &x->desc);
            if (input && x->desc.dtype == PS_DTYPE_I32)
                PS_TRY(b->ops->zero(b, rank, &tile, err)); /* valid ids and labels */
            else if (input) /* a negative second moment would time sqrt's error path */
                PS_TRY(b->ops->upload(b, rank, tile.data,
                                      op->kind == PS_OP_ADAM && t == 3 ? s->host_nonneg : s->host,
                                      numel * 4, err));
            if (input)
                c.in[t] = tile;
            else
                c.out[t - op->n_in] = tile;
        }
        /* a kind the backend lacks (the CUDA backend built without cuDNN
         * has no conv2d) is left out on every rank: the cost model then
         * keeps its own estimate */
        ps_error probe_err = {0};
        ps_status probe = op_once(s, rank, &c, &probe_err);
        if (probe == PS_ERR_UNSUPPORTED) {
            pthread_mutex_lock(&s->mu);
            s->op_unsupported[q] = true;
            pthread_mutex_unlock(&s->mu);
        } else if (probe != PS_OK) {
            *err = probe_err;
            st = probe;
            goto out;
        }
        if (!barrier(s))
            goto out;
        if (s->op_unsupported[q]) {
            if (rank == 0 && s->pass == 0)
                PS_LOG_WARN("profile: %s left out: %s", ps_op_kind_get(op->kind)->name,
                            probe == PS_ERR_UNSUPPORTED ? probe_err.msg : "not on every device");
            for (; n_buf > 0; n_buf--)
                b->ops->release(b, rank, buf[n_buf - 1]);
            continue;
        }
        bool ok;
        PS_TRY(timed(s, rank, op_once, &c, 1, &ok, err));
        if (!ok)
            goto out;
        double sec = slowest_median(s, s->n);
        ps_gemm_shape conv;
        if (rank == 0 && conv_shape(g, op, &conv)) {
            /* one fp32 measurement, recorded for every dtype as the GEMMs */
            int n_dt = s->o->n_dtypes > 0 ? s->o->n_dtypes : 1;
            for (int d = 0; d < n_dt; d++)
                PS_TRY(add_gemm(s, op->kind, &conv,
                                s->o->n_dtypes > 0 ? s->o->dtypes[d] : PS_DTYPE_F32, sec, err));
        } else if (rank == 0) {
            ps_profile_op e = {.op = op->kind, .bytes = op_bytes(g, op), .seconds = sec};
            if (s->o->progress)
                fprintf(stderr, "profile: pass %d: %s of %lld bytes: %.4g s, %.4g GB/s\n",
                        s->pass + 1, ps_op_kind_get(op->kind)->name, (long long)e.bytes, sec,
                        (double)e.bytes / sec / 1e9);
            PS_TRY(ps_profile_db_add_op(s->db, &e, err));
        }
        for (; n_buf > 0; n_buf--)
            b->ops->release(b, rank, buf[n_buf - 1]);
    }
out:
    for (; n_buf > 0; n_buf--)
        b->ops->release(b, rank, buf[n_buf - 1]);
    return st;
}

/* ---- communication ------------------------------------------------------- */

typedef struct comm_call {
    ps_profile_comm kind;
    ps_exec_group g;
    ps_tile src, dst;
    int64_t count; /* send-recv: elements */
} comm_call;

static ps_status comm_once(shared *s, int rank, void *arg, ps_error *err)
{
    comm_call *c = arg;
    ps_backend *b = s->b;
    if (c->kind != PS_PROFILE_SEND_RECV)
        return b->ops->collective(b, rank, &c->g, (ps_collective)c->kind, &c->src, &c->dst, err);
    /* a round trip 0 -> 1 -> 0: two transfers (timed() halves it) */
    int64_t off[1] = {0}, size[1] = {c->count};
    ps_status st;
    if (rank == 0) {
        st = b->ops->send(b, rank, 1, &c->src, off, size, 0, 1, err);
        return st != PS_OK ? st : b->ops->recv(b, rank, 1, &c->dst, off, size, 0, 1, err);
    }
    st = b->ops->recv(b, rank, 0, &c->dst, off, size, 0, 1, err);
    return st != PS_OK ? st : b->ops->send(b, rank, 0, &c->src, off, size, 0, 1, err);
}

static ps_tile vector(void *data, int64_t global, int64_t offset, int64_t len)
{
    ps_tile t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.rank = 1;
    t.shape[0] = len;
    t.global[0] = global;
    t.offset[0] = offset;
    return t;
}

/* The tiles of one measurement of `count` elements (the nccl-tests size /
 * 4) on rank r of n; returns the elements each buffer needs, or 0 to skip
 * (a kind it does not lay out). */
static int64_t layout(comm_call *c, int n, int r, int64_t count, int64_t *src_elems,
                      int64_t *dst_elems, int64_t *bytes)
{
    int64_t start, len;
    ps_coll_chunk(count, n, r, &start, &len);
    *bytes = count * 4;
    switch (c->kind) {
    case PS_PROFILE_ALL_REDUCE:
        c->src = vector(NULL, count, 0, count);
        c->dst = c->src;
        break;
    case PS_PROFILE_ALL_GATHER: /* count: the gathered size */
        c->src = vector(NULL, count, start, len);
        c->dst = vector(NULL, count, 0, count);
        break;
    case PS_PROFILE_REDUCE_SCATTER: /* count: the input size */
        c->src = vector(NULL, count, 0, count);
        c->dst = vector(NULL, count, start, len);
        break;
    case PS_PROFILE_ALL_TO_ALL: {
        /* [n, n * per]: a row per member before, a column block after */
        int64_t per = (count + n - 1) / n; /* at least an element per pair */
        memset(&c->src, 0, sizeof c->src);
        c->src.rank = c->dst.rank = 2;
        c->src.global[0] = c->dst.global[0] = n;
        c->src.global[1] = c->dst.global[1] = n * per;
        c->src.shape[0] = 1;
        c->src.shape[1] = n * per;
        c->src.offset[0] = r;
        c->dst = c->src;
        c->dst.shape[0] = n;
        c->dst.shape[1] = per;
        c->dst.offset[0] = 0;
        c->dst.offset[1] = r * per;
        *bytes = n * per * 4;
        break;
    }
    case PS_PROFILE_SEND_RECV:
        c->count = count;
        c->src = c->dst = vector(NULL, count, 0, count);
        break;
    case PS_PROFILE_COMM_COUNT: return 0;
    }
    *src_elems = ps_tile_numel(&c->src);
    *dst_elems = ps_tile_numel(&c->dst);
    return *src_elems > *dst_elems ? *src_elems : *dst_elems;
}

static const char *size_text(int64_t bytes, char *buf, size_t cap)
{
    if (bytes >= (1 << 20) && bytes % (1 << 20) == 0)
        snprintf(buf, cap, "%lld MiB", (long long)(bytes >> 20));
    else if (bytes >= 1024 && bytes % 1024 == 0)
        snprintf(buf, cap, "%lld KiB", (long long)(bytes >> 10));
    else
        snprintf(buf, cap, "%lld B", (long long)bytes);
    return buf;
}

static ps_status comm_thread(shared *s, int rank, ps_error *err)
{
    ps_status st = PS_OK;
    ps_backend *b = s->b;
    const ps_profile_options *o = s->o;
    int n = s->n;
    int *devices = malloc((size_t)n * sizeof *devices);
    void *src = NULL, *dst = NULL;
    PS_TRY_ALLOC(devices, err);
    for (int r = 0; r < n; r++)
        devices[r] = r;
    unsigned kinds = o->kinds ? o->kinds : (1u << PS_PROFILE_COMM_COUNT) - 1;
    for (int k = 0; k < PS_PROFILE_COMM_COUNT; k++) {
        ps_profile_comm kind = (ps_profile_comm)k;
        /* send-recv once, between devices 0 and 1 */
        if (!(kinds & (1u << k)) || (kind == PS_PROFILE_SEND_RECV && n != 2))
            continue;
        int64_t last_bytes = -1; /* sizes that round to the same are measured once */
        for (int64_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= o->size_factor) {
            comm_call c;
            memset(&c, 0, sizeof c);
            c.kind = kind;
            /* one group id per group size: the CPU backend keys its
             * rendezvous by id */
            c.g = (ps_exec_group){.id = n, .n = n, .devices = devices, .rank = rank};
            int64_t src_elems, dst_elems, real_bytes;
            /* whole fp32 elements, at least the size asked (the entry records
             * the bytes moved) */
            if (layout(&c, n, rank, (bytes + 3) / 4, &src_elems, &dst_elems, &real_bytes) == 0 ||
                real_bytes == last_bytes)
                continue; /* every rank alike: the barriers stay matched */
            last_bytes = real_bytes;
            PS_TRY(b->ops->alloc(b, rank, src_elems * 4, &src, err));
            PS_TRY(b->ops->alloc(b, rank, dst_elems * 4, &dst, err));
            PS_TRY(b->ops->upload(b, rank, src, s->host, src_elems * 4, err));
            PS_TRY(b->ops->upload(b, rank, dst, s->host, dst_elems * 4, err));
            c.src.data = src;
            c.dst.data = dst;
            bool ok;
            PS_TRY(timed(s, rank, comm_once, &c, kind == PS_PROFILE_SEND_RECV ? 2 : 1, &ok, err));
            if (!ok)
                goto out;
            if (rank == 0) {
                ps_profile_comm_entry e = {
                    .kind = kind, .n = n, .bytes = real_bytes, .seconds = slowest_median(s, n)};
                PS_TRY(ps_profile_db_add_comm(s->db, &e, err));
                if (o->progress) {
                    char t[32];
                    fprintf(stderr, "profile: pass %d: %s over %d devices, %s: %.4g us\n",
                            s->pass + 1, ps_profile_comm_names[kind], n,
                            size_text(real_bytes, t, sizeof t), e.seconds * 1e6);
                }
            }
            b->ops->release(b, rank, src);
            b->ops->release(b, rank, dst);
            src = dst = NULL;
            /* rank 0 has recorded before anyone reuses the shared times */
            if (!barrier(s))
                goto out;
        }
    }
out:
    free(devices);
    if (src != NULL)
        b->ops->release(b, rank, src);
    if (dst != NULL)
        b->ops->release(b, rank, dst);
    return st;
}

/* ---- the whole profile ----------------------------------------------------- */

static bool same_shape(const ps_gemm_shape *a, const ps_gemm_shape *b)
{
    return a->m == b->m && a->n == b->n && a->k == b->k && a->batch == b->batch;
}

/* The GEMMs to time, each batch 1 and up: the options' shapes, then each
 * new shape of the graphs' MATMUL ops on whole tensors (what those training
 * steps compute: attention's batched per-head products, the weights'
 * gradients). */
static ps_status gemm_shapes(const ps_profile_options *o, ps_gemm_shape **out, int *n_out,
                             ps_error *err)
{
    int cap = o->n_shapes, n = 0;
    for (int i = 0; i < o->n_op_graphs; i++)
        cap += o->op_graphs[i]->n_ops;
    ps_gemm_shape *list = malloc((size_t)cap * sizeof *list);
    if (list == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < o->n_shapes; i++) {
        list[n] = o->shapes[i];
        if (list[n].batch < 1) /* 0: one GEMM */
            list[n].batch = 1;
        n++;
    }
    for (int i = 0; i < o->n_op_graphs; i++) {
        const ps_graph *g = o->op_graphs[i];
        for (int j = 0; j < g->n_ops; j++) {
            const ps_op *op = &g->ops[j];
            ps_tensor_desc in[2];
            ps_gemm_shape sh;
            if (op->kind != PS_OP_MATMUL)
                continue;
            for (int t = 0; t < 2; t++)
                in[t] = g->tensors[op->in[t]].desc;
            if (ps_matmul_gemm_shape(op->attrs.einsum, in, &sh, NULL) != PS_OK)
                continue;
            bool seen = false;
            for (int q = 0; q < n && !seen; q++)
                seen = same_shape(&list[q], &sh);
            if (!seen)
                list[n++] = sh;
        }
    }
    *out = list;
    *n_out = n;
    return PS_OK;
}

static ps_status check_options(const ps_backend *b, const ps_profile_options *o, ps_error *err)
{
    if (o->warmup < 1 || o->reps < 1 || o->reps > MAX_REPS || !(o->min_rep_s >= 0))
        return ps_error_set(err, PS_ERR_INVALID,
                            "profile: warm-up and repetitions must be at least 1 (at most %d "
                            "repetitions)",
                            MAX_REPS);
    if (o->passes < 0 || o->passes > PS_PROFILE_MAX_PASSES)
        return ps_error_set(err, PS_ERR_INVALID, "profile: %d passes (1 to %d)", o->passes,
                            PS_PROFILE_MAX_PASSES);
    for (int i = 0; i < o->n_shapes; i++)
        if (o->shapes[i].m < 1 || o->shapes[i].n < 1 || o->shapes[i].k < 1 ||
            o->shapes[i].batch < 0)
            return ps_error_set(err, PS_ERR_INVALID, "profile: GEMM shape %d is not positive", i);
    for (int i = 0; i < o->n_dtypes; i++)
        if ((int)o->dtypes[i] < 0 || (int)o->dtypes[i] >= PS_FLOAT_DTYPE_COUNT)
            return ps_error_set(err, PS_ERR_INVALID, "profile: dtype %d is not a float type",
                                (int)o->dtypes[i]);
    if (o->max_bytes > 0 &&
        (o->min_bytes < 4 || o->min_bytes > o->max_bytes || o->size_factor < 2 ||
         o->size_factor > 1024 || o->max_bytes > ((int64_t)1 << 40)))
        return ps_error_set(err, PS_ERR_INVALID,
                            "profile: sizes %lld to %lld bytes by x%d: want 4 <= min <= max "
                            "<= 1 TiB and a factor of 2 to 1024",
                            (long long)o->min_bytes, (long long)o->max_bytes, o->size_factor);
    if (b->n_devices < 1)
        return ps_error_set(err, PS_ERR_INVALID, "profile: the backend has no device");
    return PS_OK;
}

/* One pass: the GEMMs, the other ops, then the transfers, into s->db. */
static ps_status measure_pass(shared *s, int max_group, ps_error *err)
{
    ps_status st = PS_OK;
    ps_backend *b = s->b;
    const ps_profile_options *o = s->o;
    /* GEMMs on device 0 alone, or on every device at once */
    s->compute_phase = true;
    if (s->n_shapes > 0)
        st = run_threads(s, o->gemm_all_devices && o->gemm_timer == NULL ? b->n_devices : 1,
                         gemm_thread, err);
    /* the other ops, the same way */
    if (st == PS_OK && s->n_ops > 0)
        st = run_threads(s, o->gemm_all_devices ? b->n_devices : 1, ops_thread, err);
    s->compute_phase = false;
    /* group sizes 2, 4, 8, ... and max_group itself */
    for (int n = 2; st == PS_OK && o->max_bytes > 0 && n <= max_group;
         n = n * 2 > max_group && n < max_group ? max_group : n * 2)
        st = run_threads(s, n, comm_thread, err);
    return st;
}

ps_status ps_profile_measure(ps_backend *b, const ps_profile_options *o, ps_profile_db **out,
                             ps_error *err)
{
    ps_status st = PS_OK;
    ps_profile_db *pass_db[PS_PROFILE_MAX_PASSES] = {NULL};
    float *host = NULL, *host_nonneg = NULL;
    shared s;
    memset(&s, 0, sizeof s);
    *out = NULL;
    PS_TRY(check_options(b, o, err));
    int passes = o->passes > 0 ? o->passes : 1;
    const char *name = o->device_name != NULL ? o->device_name : b->ops->name;
    for (int p = 0; p < passes; p++) {
        PS_TRY(ps_profile_db_create(name, b->ops->name, b->n_devices, &pass_db[p], err));
        if (o->gemm_all_devices) /* the ops always, the GEMMs unless a native timer times them */
            pass_db[p]->devices_at_once = b->n_devices;
    }
    /* the largest buffer any measurement uploads: a collective's size in
     * whole elements, rounded up (an all-to-all's to whole elements per
     * pair of its members, at most b->n_devices of them) */
    int64_t most = o->max_bytes > 0 ? (o->max_bytes + 3) / 4 + b->n_devices : 1;
    for (int i = 0; i < o->n_op_graphs; i++)
        for (int t = 0; t < o->op_graphs[i]->n_tensors; t++) {
            int64_t e = ps_tensor_numel(&o->op_graphs[i]->tensors[t]);
            most = e > most ? e : most;
        }
    if (o->n_shapes > 0)
        PS_TRY(gemm_shapes(o, &s.shapes, &s.n_shapes, err));
    for (int i = 0; i < s.n_shapes; i++) {
        const ps_gemm_shape *sh = &s.shapes[i];
        int64_t e = sh->batch * (sh->m * sh->k > sh->k * sh->n ? sh->m * sh->k : sh->k * sh->n);
        most = e > most ? e : most;
    }
    host = malloc((size_t)most * sizeof *host);
    host_nonneg = malloc((size_t)most * sizeof *host_nonneg);
    PS_TRY_ALLOC(host, err);
    PS_TRY_ALLOC(host_nonneg, err);
    /* small values (sums stay finite) of both signs in no order a branch
     * predictor learns, as activations are: data of one sign made a ReLU
     * look 6 times faster than in a training step */
    for (int64_t i = 0; i < most; i++) {
        uint32_t h = (uint32_t)i * 2654435761u;
        h ^= h >> 15;
        host[i] = (float)((int)(h % 15) - 7) * 0.125f;
        host_nonneg[i] = fabsf(host[i]);
    }
    int max_group = o->max_group > 0 && o->max_group < b->n_devices ? o->max_group : b->n_devices;
    s.b = b;
    s.o = o;
    s.host = host;
    s.host_nonneg = host_nonneg;
    s.times = calloc((size_t)(b->n_devices * o->reps), sizeof *s.times);
    s.warm = calloc((size_t)b->n_devices, sizeof *s.warm);
    PS_TRY_ALLOC(s.times, err);
    PS_TRY_ALLOC(s.warm, err);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    if (o->n_op_graphs > 0)
        st = choose_ops(&s, err);
    for (int p = 0; st == PS_OK && p < passes; p++) {
        s.pass = p;
        s.db = pass_db[p];
        st = measure_pass(&s, max_group, err);
    }
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
    if (st != PS_OK)
        goto out;
    PS_TRY(ps_profile_db_median_passes(pass_db, passes, err));
    PS_TRY(ps_profile_db_finish(pass_db[0], err));
    *out = pass_db[0];
    pass_db[0] = NULL;
out:
    for (int p = 0; p < PS_PROFILE_MAX_PASSES; p++)
        ps_profile_db_free(pass_db[p]);
    free(s.times);
    free(s.warm);
    free(s.op_graph);
    free(s.op_index);
    free(s.op_unsupported);
    free(s.shapes);
    free(host);
    free(host_nonneg);
    return st;
}
