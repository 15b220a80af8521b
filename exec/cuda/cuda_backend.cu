/* The CUDA backend: exec/backend.h's function table on GPUs (see
 * exec/cuda/cuda_backend.h for the device mapping and the two modes). */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

#include "exec/cuda/cuda_internal.cuh"
#include "exec/cuda/cuda_remote.cuh"

extern "C" {
#include "core/bytes_text.h"
#include "core/collective.h"
#include "core/log.h"
#include "exec/box.h"
#include "exec/cuda/cuda_backend.h"
#include "exec/half.h"
#include "exec/host_collective.h"
#include "exec/mailbox.h"
}

/* ---- state ------------------------------------------------------------------------ */

/* A block handed out by alloc: its requested bytes and its real size. */
typedef struct blk {
    void *ptr;
    int64_t bytes;
    size_t cap;
} blk;

struct cuda_backend;

typedef struct dev_state {
    struct cuda_backend *cb; /* the backend it belongs to (for the stream's reclaim) */
    bool here; /* runs in this process (else the rest is unset) */
    int device, gpu;
    ps_cuda_loc loc;
    ps_cuda_stream *s;
    pthread_mutex_t mu; /* memory accounting (peak_bytes may come from any thread) */
    bool mu_init;
    int64_t cur_bytes, peak_bytes;
    blk *live; /* open addressing on ptr; ptr NULL = empty, (void *)1 = deleted */
    int live_cap, live_used;
    blk *cache; /* freed blocks, reused for requests of the same size */
    int n_cache, cache_cap;
    cudaEvent_t *ev;
    bool *ev_set;
    /* collective staging (0, 1) and, for half tiles, their fp32 copies
     * (2: the source, 3: the destination) */
    void *scratch[4];
    size_t scratch_bytes[4];
} dev_state;

/* What a member publishes at a collective's rendezvous. */
typedef struct rv_slot {
    ps_tile src, dst;
    void *data; /* reduce: n floats, or doubles (dbl: reduce64) */
    int64_t n;
    bool dbl;
} rv_slot;

typedef struct group_state {
    int id, n;
    int arrived;
    unsigned gen;
    /* two sets of n slots, used by alternate collectives: a member may
     * publish its next collective while a slower one still reads this one's
     * (NCCL mode has no second barrier) */
    rv_slot *slot;
    unsigned *seq; /* per rank: collectives published on the group */
    ncclComm_t *comm; /* NCCL mode: per rank, created at the first collective */
    ps_launch_window win; /* NCCL mode: its launches (members: those here) */
    ncclUniqueId uid;
    struct group_state *next;
} group_state;

/* Send/recv (both modes): a FIFO of staged messages per ordered pair, and
 * the staging buffers (on the sender's GPU) the receiver handed back. */
typedef struct msg {
    void *buf;
    int gpu; /* where buf lives */
    size_t cap;
    int64_t len;    /* elements */
    ps_dtype dtype; /* of the sent tile: its elements' size and type */
    struct msg *next;
} msg;

typedef struct chan {
    msg *head, *tail;
    msg *spare;
} chan;

typedef struct cuda_backend {
    ps_backend base;
    ps_cuda_backend_options opt;
    int slots;
    bool nccl;
    dev_state *dev;
    pthread_mutex_t mu; /* groups, channels, abort */
    pthread_cond_t cv;
    bool aborted;
    group_state *groups;
    chan *chans; /* [from * n + to] */
    ps_mailbox *mail; /* to and from devices of other processes */
    /* NCCL mode: collective launches against memory operations
     * (exec/launch_gate.h); NULL otherwise */
    ps_launch_gate *gate;
} cuda_backend;

static cuda_backend *cb_of(ps_backend *b) { return (cuda_backend *)b; }

static ps_status bad_device(const ps_backend *b, int device, ps_error *err)
{
    if (device >= 0 && device < b->n_devices)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cuda backend: device %d runs in another process", device);
    return ps_error_set(err, PS_ERR_INVALID, "cuda backend: device %d out of range (0..%d)",
                        device, b->n_devices - 1);
}

#define DEV(b, device)                                                                        \
    if ((device) < 0 || (device) >= (b)->n_devices || !cb_of(b)->dev[(device)].here)         \
        return bad_device((b), (device), err);                                                \
    dev_state *d = &cb_of(b)->dev[(device)];                                                  \
    PS_CUDA_RET(d->loc, cudaSetDevice(d->gpu))

/* "device D (GPU G): CALL failed (WHAT, as its member RANK): NCCL's
 * message": `call` is the call's source text, of which the function name is
 * kept; `what` (NULL: none) says which collective on which group, and
 * `rank` is this device's rank in it. */
static ps_status nccl_fail(ps_cuda_loc loc, ncclResult_t r, ncclComm_t comm, const char *call,
                           const char *what, int rank, ps_error *err)
{
    int n = 0;
    while (call[n] != '\0' && call[n] != '(' && call[n] != ' ')
        n++;
    char context[288] = "";
    if (what != NULL)
        snprintf(context, sizeof context, " (%s, as its member %d)", what, rank);
    /* (the argument is unused: NCCL keeps the last message per thread, so it
     * also names a communicator setup that failed, whose comm is NULL) */
    const char *last = ncclGetLastError(comm);
    return ps_error_set(err, PS_ERR_DEVICE, "device %d (GPU %d): %.*s failed%s: %s%s%s",
                        loc.device, loc.gpu, n, call, context, ncclGetErrorString(r),
                        last != NULL && last[0] != '\0' ? ": " : "", last != NULL ? last : "");
}

#define PS_NCCL_RET(loc, comm, call)                                                          \
    do {                                                                                      \
        ncclResult_t ps_nccl_r_ = (call);                                                     \
        if (ps_nccl_r_ != ncclSuccess)                                                        \
            return nccl_fail((loc), ps_nccl_r_, (comm), #call, NULL, 0, err);                 \
    } while (0)

/* The same, naming the collective (`what`) and this member's rank in it. */
#define PS_NCCL_RET_WHAT(loc, comm, call, what, rank)                                         \
    do {                                                                                      \
        ncclResult_t ps_nccl_r_ = (call);                                                     \
        if (ps_nccl_r_ != ncclSuccess)                                                        \
            return nccl_fail((loc), ps_nccl_r_, (comm), #call, (what), (rank), err);          \
    } while (0)

/* ---- memory ------------------------------------------------------------------------ */

#define DELETED ((void *)1)

static size_t ptr_hash(const void *p, int cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)(x & (uint64_t)(cap - 1));
}

static bool live_insert(dev_state *d, blk b)
{
    if ((d->live_used + 1) * 2 > d->live_cap) {
        /* used counts the deleted slots too: rehashed at the same size
         * while live blocks fill under a quarter, so that a long run of
         * allocations and releases does not grow the table */
        int n_live = 0;
        for (int i = 0; i < d->live_cap; i++)
            n_live += d->live[i].ptr != NULL && d->live[i].ptr != DELETED;
        size_t old_cap = d->live_cap > 0 ? (size_t)d->live_cap : 0;
        size_t cap = old_cap == 0                            ? 256
                     : ((size_t)n_live + 1) * 4 <= old_cap ? old_cap
                                                             : old_cap * 2;
        if (cap > INT_MAX)
            return false;
        blk *t = (blk *)calloc(cap, sizeof *t);
        if (t == NULL)
            return false;
        for (int i = 0; i < d->live_cap; i++) {
            void *p = d->live[i].ptr;
            if (p == NULL || p == DELETED)
                continue;
            size_t h = ptr_hash(p, (int)cap);
            while (t[h].ptr != NULL)
                h = (h + 1) & (cap - 1);
            t[h] = d->live[i];
        }
        free(d->live);
        d->live = t;
        d->live_cap = (int)cap;
        d->live_used = n_live;
    }
    size_t h = ptr_hash(b.ptr, d->live_cap);
    while (d->live[h].ptr != NULL && d->live[h].ptr != DELETED)
        h = (h + 1) & (size_t)(d->live_cap - 1);
    if (d->live[h].ptr == NULL)
        d->live_used++;
    d->live[h] = b;
    return true;
}

static blk *live_find(dev_state *d, const void *p)
{
    if (d->live_cap == 0)
        return NULL;
    size_t h = ptr_hash(p, d->live_cap);
    while (d->live[h].ptr != NULL) {
        if (d->live[h].ptr == p)
            return &d->live[h];
        h = (h + 1) & (size_t)(d->live_cap - 1);
    }
    return NULL;
}

/* Frees a device's cached blocks (its mutex held). Work queued on its
 * stream may still read them: the stream is synchronized first, as
 * cudaFree need not do. */
static void cache_flush(dev_state *d)
{
    if (d->n_cache == 0)
        return;
    (void)cudaSetDevice(d->gpu);
    if (d->s != NULL)
        (void)cudaStreamSynchronize(d->s->stream);
    ps_launch_gate_mem_enter(d->cb->gate);
    for (int i = 0; i < d->n_cache; i++)
        (void)cudaFree(d->cache[i].ptr);
    ps_launch_gate_mem_exit(d->cb->gate);
    d->n_cache = 0;
}

/* Frees the cached blocks on d's GPU: d's own, then those of the devices
 * sharing its GPU (--share-gpu); true when there were any. Called without
 * any device's mutex held; leaves d's GPU current. */
static bool reclaim_cached(cuda_backend *cb, dev_state *d)
{
    /* after an abort a stream may hold an NCCL kernel waiting for a stopped
     * peer: syncing it (cache_flush) would hang; the blocks wait for
     * destroy */
    pthread_mutex_lock(&cb->mu);
    bool aborted = cb->aborted;
    pthread_mutex_unlock(&cb->mu);
    if (aborted)
        return false;
    int had = 0;
    for (int j = -1; j < cb->base.n_devices; j++) {
        dev_state *o = j < 0 ? d : &cb->dev[j];
        if (j >= 0 && (o == d || !o->here || o->gpu != d->gpu))
            continue;
        pthread_mutex_lock(&o->mu);
        had += o->n_cache;
        cache_flush(o);
        pthread_mutex_unlock(&o->mu);
    }
    (void)cudaSetDevice(d->gpu);
    return had > 0;
}

/* ps_cuda_stream.reclaim: what the pool caches is given back to the GPU
 * before a workspace, staging or check buffer is refused. */
static bool stream_reclaim(void *arg)
{
    dev_state *d = (dev_state *)arg;
    return reclaim_cached(d->cb, d);
}

static ps_status be_alloc(ps_backend *b, int device, int64_t bytes, void **out, ps_error *err)
{
    *out = NULL;
    DEV(b, device);
    if (bytes < 0)
        return ps_error_set(err, PS_ERR_INVALID, "device %d: allocation of %lld bytes",
                            device, (long long)bytes);
    size_t cap = (size_t)(bytes < 1 ? 1 : bytes);
    cap = (cap + 511) & ~(size_t)511;
    void *p = NULL;
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < d->n_cache; i++)
        if (d->cache[i].cap == cap) {
            p = d->cache[i].ptr;
            d->cache[i] = d->cache[--d->n_cache];
            break;
        }
    pthread_mutex_unlock(&d->mu);
    if (p == NULL) {
        /* the cached blocks may be what is missing (reclaim_cached) */
        cudaError_t e = ps_cuda_malloc(d->s, &p, cap);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return ps_error_set(err, PS_ERR_DEVICE,
                                "device %d (GPU %d): cudaMalloc of %lld bytes failed: %s (%s); "
                                "%lld bytes allocated on the device",
                                device, d->gpu, (long long)bytes, cudaGetErrorString(e),
                                cudaGetErrorName(e), (long long)d->cur_bytes);
        }
    }
    pthread_mutex_lock(&d->mu);
    bool ok = live_insert(d, blk{p, bytes, cap});
    if (ok) {
        d->cur_bytes += bytes;
        if (d->cur_bytes > d->peak_bytes)
            d->peak_bytes = d->cur_bytes;
    }
    pthread_mutex_unlock(&d->mu);
    if (!ok) {
        (void)ps_cuda_free(d->s, p);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    *out = p;
    return PS_OK;
}

static void be_release(ps_backend *b, int device, void *ptr)
{
    if (ptr == NULL || device < 0 || device >= b->n_devices || !cb_of(b)->dev[device].here)
        return;
    cuda_backend *cb = cb_of(b);
    dev_state *d = &cb->dev[device];
    pthread_mutex_lock(&cb->mu);
    bool aborted = cb->aborted;
    pthread_mutex_unlock(&cb->mu);
    pthread_mutex_lock(&d->mu);
    blk *e = live_find(d, ptr);
    if (e == NULL) {
        pthread_mutex_unlock(&d->mu);
        PS_LOG_ERROR("device %d: release of %p, which the cuda backend did not allocate",
                     device, ptr);
        return;
    }
    blk freed = *e;
    e->ptr = DELETED;
    d->cur_bytes -= freed.bytes;
    bool cached = false;
    /* after an abort a stream may hold an NCCL kernel waiting for peers
     * until destroy aborts the communicators, and cudaFree could wait on
     * it: every block is then cached, for dev_free */
    if (d->n_cache == d->cache_cap && (d->cache_cap < 4096 || aborted)) {
        int cap = d->cache_cap ? d->cache_cap * 2 : 64;
        blk *c = (blk *)realloc(d->cache, (size_t)cap * sizeof *c);
        if (c != NULL) {
            d->cache = c;
            d->cache_cap = cap;
        }
    }
    if (d->n_cache < d->cache_cap) {
        /* later work on this device's stream is ordered after earlier
         * readers of the block: reuse is safe without a sync */
        d->cache[d->n_cache++] = freed;
        cached = true;
    } else if (aborted) {
        /* no room to cache it and no free after an abort: the slot keeps
         * it, so that dev_free frees it with the live blocks */
        e->ptr = freed.ptr;
    }
    pthread_mutex_unlock(&d->mu);
    if (!cached && !aborted) {
        /* the cache is full: freed once earlier readers are done */
        (void)cudaSetDevice(d->gpu);
        (void)cudaStreamSynchronize(d->s->stream);
        (void)ps_cuda_free(d->s, freed.ptr);
    }
}

static int64_t be_peak_bytes(ps_backend *b, int device)
{
    if (device < 0 || device >= b->n_devices || !cb_of(b)->dev[device].here)
        return 0;
    dev_state *d = &cb_of(b)->dev[device];
    pthread_mutex_lock(&d->mu);
    int64_t p = d->peak_bytes;
    pthread_mutex_unlock(&d->mu);
    return p;
}

static ps_status scratch(dev_state *d, int which, size_t bytes, void **out, ps_error *err)
{
    if (bytes < 4)
        bytes = 4;
    if (d->scratch_bytes[which] < bytes) {
        if (d->scratch[which] != NULL) {
            PS_CUDA_RET(d->loc, cudaStreamSynchronize(d->s->stream));
            PS_CUDA_RET(d->loc, ps_cuda_free(d->s, d->scratch[which]));
            d->scratch[which] = NULL;
            d->scratch_bytes[which] = 0;
        }
        size_t cap = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
        PS_CUDA_RET(d->loc, ps_cuda_malloc(d->s, &d->scratch[which], cap));
        d->scratch_bytes[which] = cap;
    }
    *out = d->scratch[which];
    return PS_OK;
}

/* ---- copies and compute ---------------------------------------------------------- */

static ps_status be_upload(ps_backend *b, int device, void *dst, const void *host, int64_t bytes,
                           ps_error *err)
{
    DEV(b, device);
    if (bytes <= 0)
        return PS_OK;
    PS_CUDA_RET(d->loc, cudaMemcpyAsync(dst, host, (size_t)bytes, cudaMemcpyHostToDevice,
                                        d->s->stream));
    PS_CUDA_RET(d->loc, cudaStreamSynchronize(d->s->stream));
    return PS_OK;
}

static ps_status be_download(ps_backend *b, int device, void *host, const void *src,
                             int64_t bytes, ps_error *err)
{
    DEV(b, device);
    if (bytes <= 0)
        return PS_OK;
    PS_CUDA_RET(d->loc, cudaMemcpyAsync(host, src, (size_t)bytes, cudaMemcpyDeviceToHost,
                                        d->s->stream));
    PS_CUDA_RET(d->loc, cudaStreamSynchronize(d->s->stream));
    return PS_OK;
}

static ps_status be_op(ps_backend *b, int device, const ps_op *op, const ps_tile *in,
                       ps_tile *out, const ps_op_context *ctx, ps_error *err)
{
    DEV(b, device);
    return ps_cuda_op_run(d->s, op, in, out, ctx, err);
}

static bool be_op_accumulates(ps_backend *b, const ps_op *op, int out, const ps_tile *t)
{
    (void)b;
    return ps_cuda_op_accumulates(op->kind, out, t);
}

/* Devices sharing a GPU (the test mode) add up against the GPU's free
 * memory, read once this process's streams and cuBLAS handles exist. What
 * the tiles need is a lower bound: NCCL's buffers (at a group's first
 * collective), the collectives' and sends' staging buffers, the ops'
 * workspaces and the pool's 512-byte rounding come on top, and processes
 * sharing a GPU each see all of its free memory. */
static ps_status be_check_memory(ps_backend *b, const int64_t *need, ps_error *err)
{
    cuda_backend *cb = cb_of(b);
    for (int i = 0; i < b->n_devices; i++) {
        const dev_state *d = &cb->dev[i];
        if (!d->here || need[i] <= 0)
            continue;
        bool first = true; /* each GPU once: at its first device */
        for (int j = 0; j < i && first; j++)
            first = !(cb->dev[j].here && cb->dev[j].gpu == d->gpu && need[j] > 0);
        if (!first)
            continue;
        int64_t total = 0, most = 0;
        int n = 0, at = i;
        for (int j = i; j < b->n_devices; j++)
            if (cb->dev[j].here && cb->dev[j].gpu == d->gpu && need[j] > 0) {
                total += need[j];
                n++;
                if (need[j] > most) {
                    most = need[j];
                    at = j;
                }
            }
        size_t free_bytes = 0, total_bytes = 0;
        PS_CUDA_RET(d->loc, cudaSetDevice(d->gpu));
        PS_CUDA_RET(d->loc, cudaMemGetInfo(&free_bytes, &total_bytes));
        if ((uint64_t)total <= (uint64_t)free_bytes)
            continue;
        char t[32], m[32], f[32], all[32];
        return ps_error_set(err, PS_ERR_NOMEM,
                            "GPU %d: %d device%s of the plan %s %s of tiles at the peak of a "
                            "step (device %d the most: %s), more than the %s free of its %s "
                            "(pass --no-memory-check to try anyway)",
                            d->gpu, n, n == 1 ? "" : "s", n == 1 ? "holds" : "hold",
                            ps_bytes_text((double)total, t, sizeof t), at,
                            ps_bytes_text((double)most, m, sizeof m),
                            ps_bytes_text((double)free_bytes, f, sizeof f),
                            ps_bytes_text((double)total_bytes, all, sizeof all));
    }
    return PS_OK;
}

static ps_status be_find_nonfinite(ps_backend *b, int device, const ps_tile *tiles, int n,
                                   bool *found, ps_error *err)
{
    DEV(b, device);
    return ps_cuda_find_nonfinite(d->s, tiles, n, found, err);
}

static ps_status be_accumulate(ps_backend *b, int device, ps_tile *dst, const ps_tile *src,
                               ps_error *err)
{
    DEV(b, device);
    int64_t n = ps_tile_numel(dst);
    if (n != ps_tile_numel(src) || dst->dtype != src->dtype || dst->is_int || src->is_int)
        return ps_error_set(err, PS_ERR_INTERNAL,
                            "device %d: accumulating tiles of different sizes or types", device);
    if (ps_tile_is_half(dst)) /* each sum rounded, as a half-precision add */
        return ps_cuda_half_add(d->s, dst->dtype, dst->data, src->data, n, err);
    return ps_cuda_combine(d->s, (float *)dst->data, (const float *)src->data, n, false, err);
}

static ps_status be_zero(ps_backend *b, int device, ps_tile *t, ps_error *err)
{
    DEV(b, device);
    int64_t n = ps_tile_numel(t);
    PS_CUDA_RET(d->loc, cudaMemsetAsync(t->data, 0, (size_t)n * (size_t)ps_tile_elem_bytes(t),
                                        d->s->stream));
    return PS_OK;
}

static ps_status be_copy_box(ps_backend *b, int device, const ps_tile *src, ps_tile *dst,
                             ps_error *err)
{
    DEV(b, device);
    /* as the CPU backend: a re-layout writes the whole destination */
    if (src->rank == dst->rank && ps_boxes_cover(dst, 1, src) == 0)
        return ps_error_set(err, PS_ERR_INTERNAL,
                            "device %d: re-layout source does not cover the destination tile",
                            device);
    return ps_cuda_box_copy(d->s, src, dst, false, err);
}

/* ---- timing ------------------------------------------------------------------------- */

static ps_status be_mark(ps_backend *b, int device, int slot, ps_error *err)
{
    DEV(b, device);
    cuda_backend *cb = cb_of(b);
    if (slot < 0 || slot >= cb->slots)
        return ps_error_set(err, PS_ERR_INVALID, "device %d: timing slot %d out of range (0..%d)",
                            device, slot, cb->slots - 1);
    PS_CUDA_RET(d->loc, cudaEventRecord(d->ev[slot], d->s->stream));
    d->ev_set[slot] = true;
    return PS_OK;
}

static ps_status be_elapsed(ps_backend *b, int device, int a, int z, double *seconds,
                            ps_error *err)
{
    DEV(b, device);
    cuda_backend *cb = cb_of(b);
    *seconds = 0;
    if (a < 0 || a >= cb->slots || z < 0 || z >= cb->slots)
        return ps_error_set(err, PS_ERR_INVALID,
                            "device %d: timing slots %d, %d out of range (0..%d)", device, a, z,
                            cb->slots - 1);
    if (!d->ev_set[a] || !d->ev_set[z])
        return ps_error_set(err, PS_ERR_INVALID, "device %d: timing slot %d was never marked",
                            device, d->ev_set[a] ? z : a);
    float ms = 0;
    PS_CUDA_RET(d->loc, cudaEventElapsedTime(&ms, d->ev[a], d->ev[z]));
    *seconds = ms * 1e-3;
    return PS_OK;
}

/* ---- rendezvous ------------------------------------------------------------------- */

static ps_status aborted_error(int device, const char *what, ps_error *err)
{
    return ps_error_set(err, PS_ERR_DEVICE,
                        "device %d: %s aborted: another device failed", device, what);
}

static ps_status group_get(cuda_backend *cb, const ps_exec_group *g, int device,
                           group_state **out, ps_error *err)
{
    *out = NULL;
    if (g == NULL || g->n < 1 || g->rank < 0 || g->rank >= g->n || g->devices == NULL ||
        g->devices[g->rank] != device)
        return ps_error_set(err, PS_ERR_INVALID,
                            "device %d: malformed collective group (rank %d of %d)", device,
                            g ? g->rank : -1, g ? g->n : 0);
    for (int i = 0; i < g->n; i++)
        if (g->devices[i] < 0 || g->devices[i] >= cb->base.n_devices)
            return ps_error_set(err, PS_ERR_INVALID,
                                "device %d: group %d names device %d, out of range", device,
                                g->id, g->devices[i]);
    pthread_mutex_lock(&cb->mu);
    group_state *gs = cb->groups;
    while (gs != NULL && gs->id != g->id)
        gs = gs->next;
    if (gs == NULL) {
        gs = (group_state *)calloc(1, sizeof *gs);
        rv_slot *slot = (rv_slot *)calloc((size_t)(2 * g->n), sizeof *slot);
        unsigned *seq = (unsigned *)calloc((size_t)g->n, sizeof *seq);
        ncclComm_t *comm = (ncclComm_t *)calloc((size_t)g->n, sizeof *comm);
        if (gs == NULL || slot == NULL || seq == NULL || comm == NULL) {
            pthread_mutex_unlock(&cb->mu);
            free(gs);
            free(slot);
            free(seq);
            free(comm);
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        }
        gs->id = g->id;
        gs->n = g->n;
        gs->slot = slot;
        gs->seq = seq;
        gs->comm = comm;
        for (int i = 0; i < g->n; i++)
            gs->win.members += !ps_mailbox_is_remote(cb->mail, g->devices[i]);
        gs->next = cb->groups;
        cb->groups = gs;
    }
    pthread_mutex_unlock(&cb->mu);
    if (gs->n != g->n)
        return ps_error_set(err, PS_ERR_INVALID,
                            "device %d: group %d has %d members here, %d elsewhere", device,
                            g->id, g->n, gs->n);
    *out = gs;
    return PS_OK;
}

/* Waits until every member of the group arrived (or the backend aborted). */
static ps_status group_wait(cuda_backend *cb, group_state *gs, int device, const char *what,
                            ps_error *err)
{
    pthread_mutex_lock(&cb->mu);
    if (cb->aborted) {
        pthread_mutex_unlock(&cb->mu);
        return aborted_error(device, what, err);
    }
    unsigned gen = gs->gen;
    if (++gs->arrived == gs->n) {
        gs->arrived = 0;
        gs->gen++;
        pthread_cond_broadcast(&cb->cv);
    } else {
        while (gen == gs->gen && !cb->aborted)
            pthread_cond_wait(&cb->cv, &cb->mu);
    }
    bool passed = gen != gs->gen;
    pthread_mutex_unlock(&cb->mu);
    return passed ? PS_OK : aborted_error(device, what, err);
}

/* Publishes this member's part of its next collective on the group and
 * returns that collective's set of slots (read after group_wait). */
static rv_slot *publish(cuda_backend *cb, group_state *gs, int rank, const ps_tile *src,
                        const ps_tile *dst, void *data, int64_t n, bool dbl)
{
    pthread_mutex_lock(&cb->mu);
    rv_slot *set = gs->slot + (size_t)(gs->seq[rank] & 1u) * (size_t)gs->n;
    gs->seq[rank]++;
    rv_slot *s = &set[rank];
    memset(s, 0, sizeof *s);
    if (src != NULL)
        s->src = *src;
    if (dst != NULL)
        s->dst = *dst;
    s->data = data;
    s->n = n;
    s->dbl = dbl;
    pthread_mutex_unlock(&cb->mu);
    return set;
}

static ps_status check_injected(cuda_backend *cb, int device, const char *what, ps_error *err)
{
    if (cb->opt.inject_collective_failure && cb->opt.inject_device == device)
        return ps_error_set(err, PS_ERR_DEVICE, "device %d: %s failed: injected failure (test)",
                            device, what);
    return PS_OK;
}

static ps_status check_tiles(int device, const ps_tile *src, const ps_tile *dst, ps_error *err)
{
    if (src->rank != dst->rank || src->rank < 0 || src->rank > PS_MAX_RANK)
        return ps_error_set(err, PS_ERR_INVALID,
                            "device %d: collective between tiles of rank %d and %d", device,
                            src->rank, dst->rank);
    for (int k = 0; k < src->rank; k++)
        if (src->global[k] != dst->global[k])
            return ps_error_set(err, PS_ERR_INVALID,
                                "device %d: collective between tiles of different tensors",
                                device);
    return PS_OK;
}

/* A tile of `like`'s tensor over the box lo/size, stored contiguously at data. */
static ps_tile box_view(const ps_tile *like, const int64_t *lo, const int64_t *size, void *data)
{
    ps_tile t = *like;
    t.data = data;
    for (int k = 0; k < like->rank; k++) {
        t.offset[k] = lo[k];
        t.shape[k] = size[k];
    }
    return t;
}

/* A gather (all-gather, all-to-all) whose members' src boxes leave part of
 * dst uncovered fails as on the CPU instead of leaving it unwritten. */
static ps_status check_cover(int device, const group_state *gs, ps_collective kind,
                             const rv_slot *m, const ps_tile *dst, ps_error *err)
{
    if (kind != PS_COLL_ALL_GATHER && kind != PS_COLL_ALL_TO_ALL)
        return PS_OK;
    ps_tile *src = (ps_tile *)malloc((size_t)gs->n * sizeof *src);
    if (src == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", device);
    for (int i = 0; i < gs->n; i++)
        src[i] = m[i].src;
    ps_status st = ps_gather_check_cover(device, gs->id, kind, gs->n, src, dst, err);
    free(src);
    return st;
}

/* ---- share mode: collectives by device copies --------------------------------------- */

/* The members' srcs (slot[0..gs->n)) combined as kind does, into scratch 0
 * (*out): sums from zero, gathers over what dst holds. Returns once the
 * stream has read them all. */
static ps_status combine_members(dev_state *d, const group_state *gs, const rv_slot *slot,
                                 ps_collective kind, const ps_tile *dst, void **out,
                                 ps_error *err)
{
    ps_cuda_stream *s = d->s;
    int64_t n = ps_tile_numel(dst);
    void *tmp;
    PS_RET(scratch(d, 0, (size_t)n * 4, &tmp, err));
    ps_tile t = *dst;
    t.data = tmp;
    bool sum = kind == PS_COLL_ALL_REDUCE || kind == PS_COLL_REDUCE_SCATTER;
    if (sum)
        PS_CUDA_RET(d->loc, cudaMemsetAsync(tmp, 0, (size_t)n * 4, s->stream));
    else
        PS_CUDA_RET(d->loc, cudaMemcpyAsync(tmp, dst->data, (size_t)n * 4,
                                            cudaMemcpyDeviceToDevice, s->stream));
    for (int m = 0; m < gs->n; m++)
        PS_RET(check_tiles(d->device, &slot[m].src, dst, err));
    PS_RET(check_cover(d->device, gs, kind, slot, dst, err));
    for (int m = 0; m < gs->n; m++)
        PS_RET(ps_cuda_box_copy(s, &slot[m].src, &t, sum, err));
    PS_CUDA_RET(d->loc, cudaStreamSynchronize(s->stream));
    *out = tmp;
    return PS_OK;
}

static ps_status share_collective(cuda_backend *cb, dev_state *d, group_state *gs, int rank,
                                  ps_collective kind, const ps_tile *src, ps_tile *dst,
                                  const char *what, ps_error *err)
{
    ps_cuda_stream *s = d->s;
    /* what this device issued (its src) is complete before others read it */
    PS_CUDA_RET(d->loc, cudaStreamSynchronize(s->stream));
    const rv_slot *slot = publish(cb, gs, rank, src, dst, NULL, 0, false);
    PS_RET(group_wait(cb, gs, d->device, what, err));
    void *tmp;
    PS_RET(combine_members(d, gs, slot, kind, dst, &tmp, err));
    /* every member has read every src before anyone overwrites its dst */
    PS_RET(group_wait(cb, gs, d->device, what, err));
    PS_CUDA_RET(d->loc, cudaMemcpyAsync(dst->data, tmp, (size_t)ps_tile_numel(dst) * 4,
                                        cudaMemcpyDeviceToDevice, s->stream));
    PS_CUDA_RET(d->loc, cudaStreamSynchronize(s->stream));
    return PS_OK;
}

/* A collective of a group of one device: no rendezvous (the groups of one
 * share the id -1 across devices, so no group state either). */
static ps_status lone_collective(dev_state *d, int group_id, ps_collective kind,
                                 const ps_tile *src, ps_tile *dst, ps_error *err)
{
    group_state lone = {};
    lone.id = group_id;
    lone.n = 1;
    rv_slot slot = {};
    slot.src = *src;
    slot.dst = *dst;
    void *tmp;
    PS_RET(combine_members(d, &lone, &slot, kind, dst, &tmp, err));
    PS_CUDA_RET(d->loc, cudaMemcpyAsync(dst->data, tmp, (size_t)ps_tile_numel(dst) * 4,
                                        cudaMemcpyDeviceToDevice, d->s->stream));
    PS_CUDA_RET(d->loc, cudaStreamSynchronize(d->s->stream));
    return PS_OK;
}

static ps_status share_reduce(cuda_backend *cb, dev_state *d, group_state *gs, int rank,
                              void *data, int64_t n, ps_reduce_op op, bool dbl, const char *what,
                              ps_error *err)
{
    ps_cuda_stream *s = d->s;
    size_t size = dbl ? sizeof(double) : sizeof(float);
    PS_CUDA_RET(d->loc, cudaStreamSynchronize(s->stream));
    const rv_slot *slot = publish(cb, gs, rank, NULL, NULL, data, n, dbl);
    PS_RET(group_wait(cb, gs, d->device, what, err));
    for (int m = 0; m < gs->n; m++)
        if (slot[m].n != n || slot[m].dbl != dbl)
            return ps_error_set(err, PS_ERR_INVALID,
                                "device %d: %s of %lld %s, member %d reduces %lld %s",
                                d->device, what, (long long)n, dbl ? "doubles" : "floats", m,
                                (long long)slot[m].n, slot[m].dbl ? "doubles" : "floats");
    void *tmp;
    PS_RET(scratch(d, 0, (size_t)n * size, &tmp, err));
    if (n > 0) {
        /* members combine in rank order: identical results everywhere */
        PS_CUDA_RET(d->loc, cudaMemcpyAsync(tmp, slot[0].data, (size_t)n * size,
                                            cudaMemcpyDeviceToDevice, s->stream));
        for (int m = 1; m < gs->n; m++)
            PS_RET(dbl ? ps_cuda_combine64(s, (double *)tmp, (const double *)slot[m].data, n,
                                           op == PS_REDUCE_OP_MAX, err)
                       : ps_cuda_combine(s, (float *)tmp, (const float *)slot[m].data, n,
                                         op == PS_REDUCE_OP_MAX, err));
    }
    PS_CUDA_RET(d->loc, cudaStreamSynchronize(s->stream));
    PS_RET(group_wait(cb, gs, d->device, what, err));
    if (n > 0) {
        PS_CUDA_RET(d->loc, cudaMemcpyAsync(data, tmp, (size_t)n * size, cudaMemcpyDeviceToDevice,
                                            s->stream));
        PS_CUDA_RET(d->loc, cudaStreamSynchronize(s->stream));
    }
    return PS_OK;
}

/* ---- NCCL mode -------------------------------------------------------------------- */

/* Waits for the stream while watching for an abort and for NCCL errors. */
static ps_status nccl_wait(cuda_backend *cb, dev_state *d, cudaStream_t stream, ncclComm_t comm,
                           const char *what, int rank, ps_error *err)
{
    for (;;) {
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess)
            return PS_OK;
        if (e != cudaErrorNotReady)
            return ps_cuda_fail(d->loc, e, "cudaStreamQuery", err);
        ncclResult_t ar = ncclSuccess;
        if (comm != NULL) {
            ncclResult_t r = ncclCommGetAsyncError(comm, &ar);
            if (r != ncclSuccess)
                return nccl_fail(d->loc, r, comm, "ncclCommGetAsyncError", what, rank, err);
            if (ar != ncclSuccess && ar != ncclInProgress)
                return nccl_fail(d->loc, ar, comm, "NCCL", what, rank, err);
        }
        pthread_mutex_lock(&cb->mu);
        bool ab = cb->aborted;
        pthread_mutex_unlock(&cb->mu);
        if (ab) /* destroy aborts the communicators, which ends stuck kernels */
            return aborted_error(d->device, what, err);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

/* The group's communicator for this rank, created at its first use. Member
 * 0 makes its id; within one process the members read it at a rendezvous,
 * across processes it travels through the mailbox (MPI). */
static ps_status group_comm(cuda_backend *cb, dev_state *d, group_state *gs,
                            const ps_exec_group *g, ncclComm_t *out, ps_error *err)
{
    int rank = g->rank;
    if (gs->comm[rank] != NULL) {
        *out = gs->comm[rank];
        return PS_OK;
    }
    ncclUniqueId uid;
    memset(&uid, 0, sizeof uid);
    if (!ps_group_is_local(cb->mail, g)) {
        if (rank == 0)
            PS_NCCL_RET(d->loc, (ncclComm_t)NULL, ncclGetUniqueId(&uid));
        PS_RET(ps_cuda_remote_share_id(cb->mail, d->device, g, &uid, sizeof uid, err));
    } else {
        if (rank == 0)
            PS_NCCL_RET(d->loc, (ncclComm_t)NULL, ncclGetUniqueId(&gs->uid));
        PS_RET(group_wait(cb, gs, d->device, "communicator setup", err));
        pthread_mutex_lock(&cb->mu);
        uid = gs->uid;
        pthread_mutex_unlock(&cb->mu);
    }
    /* NCCL allocates buffers here, once per group (and may allocate more
     * at the first collective), and a failure cannot be retried (the peers
     * are inside the same call): what the pool caches goes back to the GPU
     * first. Communicators are made in the first step (the warm-up). */
    (void)reclaim_cached(cb, d);
    ncclComm_t c = NULL;
    char setup[64];
    snprintf(setup, sizeof setup, "communicator of group %d", gs->id);
    /* it allocates on the GPU: a memory operation where the group's members
     * are all here (they met just above and make theirs at once; memory
     * operations do not exclude each other). With members elsewhere it waits
     * for them inside, unbounded: as a memory operation it would keep every
     * window of this process shut meanwhile, windows a member here may have
     * to pass before it reaches this group */
    bool gated = ps_group_is_local(cb->mail, g);
    if (gated)
        ps_launch_gate_mem_enter(cb->gate);
    ncclResult_t made = ncclCommInitRank(&c, gs->n, uid, rank);
    if (gated)
        ps_launch_gate_mem_exit(cb->gate);
    if (made != ncclSuccess)
        return nccl_fail(d->loc, made, NULL, "ncclCommInitRank", setup, rank, err);
    gs->comm[rank] = c;
    *out = c;
    return PS_OK;
}

static int64_t box_numel(const int64_t *size, int rank)
{
    int64_t n = 1;
    for (int k = 0; k < rank; k++)
        n *= size[k];
    return n;
}

/* The members' src and dst boxes of a collective (metadata only; each
 * member's data stays its own), in a new array of gs->n slots. */
static ps_status member_boxes(cuda_backend *cb, dev_state *d, group_state *gs,
                              const ps_exec_group *g, ps_collective kind, const ps_tile *src,
                              const ps_tile *dst, const char *what, rv_slot **out,
                              ps_error *err)
{
    int n = gs->n;
    rv_slot *m = (rv_slot *)calloc((size_t)n, sizeof *m);
    ps_tile *srcs = (ps_tile *)calloc((size_t)n, sizeof *srcs);
    ps_tile *dsts = (ps_tile *)calloc((size_t)n, sizeof *dsts);
    ps_status st = PS_OK;
    if (m == NULL || srcs == NULL || dsts == NULL) {
        st = ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", d->device);
    } else if (!ps_group_is_local(cb->mail, g)) {
        st = ps_cuda_remote_boxes(cb->mail, d->device, g, (int)kind, src, dst, srcs, dsts, err);
        for (int i = 0; i < n && st == PS_OK; i++) {
            m[i].src = srcs[i];
            m[i].dst = dsts[i];
        }
    } else {
        const rv_slot *slot = publish(cb, gs, g->rank, src, dst, NULL, 0, false);
        st = group_wait(cb, gs, d->device, what, err);
        if (st == PS_OK) {
            pthread_mutex_lock(&cb->mu);
            memcpy(m, slot, (size_t)n * sizeof *m);
            pthread_mutex_unlock(&cb->mu);
        }
    }
    free(srcs);
    free(dsts);
    if (st != PS_OK) {
        free(m);
        m = NULL;
    }
    *out = m;
    return st;
}

/* Opens the group's launch window (exec/launch_gate.h): the NCCL calls of
 * this collective follow at once, then launch_leave; nothing in between
 * allocates or frees. */
static ps_status launch_enter(cuda_backend *cb, dev_state *d, group_state *gs, const char *what,
                              ps_error *err)
{
    if (!ps_launch_gate_window_enter(cb->gate, &gs->win))
        return aborted_error(d->device, what, err);
    return PS_OK;
}

static void launch_leave(cuda_backend *cb, group_state *gs)
{
    ps_launch_gate_window_leave(cb->gate, &gs->win);
}

static ps_status nccl_collective(cuda_backend *cb, dev_state *d, group_state *gs,
                                 const ps_exec_group *g, ps_collective kind, const ps_tile *src,
                                 ps_tile *dst, const char *what, ps_error *err)
{
    ps_cuda_stream *s = d->s;
    ncclComm_t comm;
    PS_RET(group_comm(cb, d, gs, g, &comm, err));
    int n = gs->n, r = src->rank;
    rv_slot *m;
    PS_RET(member_boxes(cb, d, gs, g, kind, src, dst, what, &m, err));
    ps_status st = PS_OK;
    for (int i = 0; i < n && st == PS_OK; i++) {
        st = check_tiles(d->device, &m[i].src, dst, err);
        if (st == PS_OK)
            st = check_tiles(d->device, &m[i].dst, dst, err);
    }
    if (st == PS_OK)
        st = check_cover(d->device, gs, kind, m, dst, err);
    if (st != PS_OK) {
        free(m);
        return st;
    }
    void *a = NULL, *b = NULL;
    ncclResult_t nr = ncclSuccess;
    const char *call = "";
    if (kind == PS_COLL_ALL_REDUCE) {
        /* over the bounding box of the members' dst boxes */
        int64_t lo[PS_MAX_RANK], size[PS_MAX_RANK];
        bool same = true;
        for (int k = 0; k < r; k++) {
            int64_t l = m[0].dst.offset[k], h = l + m[0].dst.shape[k];
            for (int i = 1; i < n; i++) {
                int64_t li = m[i].dst.offset[k], hi = li + m[i].dst.shape[k];
                l = li < l ? li : l;
                h = hi > h ? hi : h;
            }
            lo[k] = l;
            size[k] = h - l;
            same = same && src->offset[k] == l && src->shape[k] == size[k] &&
                   dst->offset[k] == l && dst->shape[k] == size[k];
        }
        int64_t count = box_numel(size, r);
        if (same) {
            call = "ncclAllReduce";
            st = launch_enter(cb, d, gs, what, err);
            if (st == PS_OK) {
                nr = ncclAllReduce(src->data, dst->data, (size_t)count, ncclFloat, ncclSum,
                                   comm, s->stream);
                launch_leave(cb, gs);
            }
        } else {
            st = scratch(d, 0, (size_t)count * 4, &a, err);
            ps_tile u = box_view(dst, lo, size, a);
            if (st == PS_OK && cudaMemsetAsync(a, 0, (size_t)count * 4, s->stream) != cudaSuccess)
                st = ps_cuda_fail(d->loc, cudaGetLastError(), "cudaMemsetAsync", err);
            if (st == PS_OK)
                st = ps_cuda_box_copy(s, src, &u, false, err);
            if (st == PS_OK)
                st = launch_enter(cb, d, gs, what, err);
            if (st == PS_OK) {
                call = "ncclAllReduce";
                nr = ncclAllReduce(a, a, (size_t)count, ncclFloat, ncclSum, comm, s->stream);
                launch_leave(cb, gs);
                if (nr == ncclSuccess)
                    st = ps_cuda_box_copy(s, &u, dst, false, err);
            }
        }
    } else if (kind == PS_COLL_REDUCE_SCATTER) {
        int64_t count = 0;
        for (int i = 0; i < n; i++) {
            int64_t c = ps_tile_numel(&m[i].dst);
            count = c > count ? c : count;
        }
        st = scratch(d, 0, (size_t)(count * n) * 4, &a, err);
        if (st == PS_OK)
            st = scratch(d, 1, (size_t)count * 4, &b, err);
        if (st == PS_OK &&
            cudaMemsetAsync(a, 0, (size_t)(count * n) * 4, s->stream) != cudaSuccess)
            st = ps_cuda_fail(d->loc, cudaGetLastError(), "cudaMemsetAsync", err);
        for (int i = 0; i < n && st == PS_OK; i++) {
            ps_tile v = box_view(dst, m[i].dst.offset, m[i].dst.shape, (float *)a + i * count);
            st = ps_cuda_box_copy(s, src, &v, false, err);
        }
        if (st == PS_OK)
            st = launch_enter(cb, d, gs, what, err);
        if (st == PS_OK) {
            call = "ncclReduceScatter";
            nr = ncclReduceScatter(a, b, (size_t)count, ncclFloat, ncclSum, comm, s->stream);
            launch_leave(cb, gs);
            if (nr == ncclSuccess &&
                cudaMemcpyAsync(dst->data, b, (size_t)ps_tile_numel(dst) * 4,
                                cudaMemcpyDeviceToDevice, s->stream) != cudaSuccess)
                st = ps_cuda_fail(d->loc, cudaGetLastError(), "cudaMemcpyAsync", err);
        }
    } else if (kind == PS_COLL_ALL_GATHER) {
        int64_t count = 0;
        for (int i = 0; i < n; i++) {
            int64_t c = ps_tile_numel(&m[i].src);
            count = c > count ? c : count;
        }
        st = scratch(d, 0, (size_t)count * 4, &a, err);
        if (st == PS_OK)
            st = scratch(d, 1, (size_t)(count * n) * 4, &b, err);
        if (st == PS_OK &&
            cudaMemcpyAsync(a, src->data, (size_t)ps_tile_numel(src) * 4,
                            cudaMemcpyDeviceToDevice, s->stream) != cudaSuccess)
            st = ps_cuda_fail(d->loc, cudaGetLastError(), "cudaMemcpyAsync", err);
        if (st == PS_OK)
            st = launch_enter(cb, d, gs, what, err);
        if (st == PS_OK) {
            call = "ncclAllGather";
            nr = ncclAllGather(a, b, (size_t)count, ncclFloat, comm, s->stream);
            launch_leave(cb, gs);
        }
        for (int i = 0; i < n && st == PS_OK && nr == ncclSuccess; i++) {
            ps_tile v = box_view(dst, m[i].src.offset, m[i].src.shape, (float *)b + i * count);
            st = ps_cuda_box_copy(s, &v, dst, false, err);
        }
    } else if (kind == PS_COLL_ALL_TO_ALL) {
        /* to member i: my src within its dst box; from member i: its src
         * within my dst box */
        int64_t *so = (int64_t *)calloc((size_t)(4 * n + 2), sizeof *so);
        if (so == NULL) {
            free(m);
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        }
        int64_t *sc = so + n + 1, *ro = sc + n, *rc = ro + n + 1;
        int64_t lo[PS_MAX_RANK], size[PS_MAX_RANK];
        for (int i = 0; i < n; i++) {
            sc[i] = ps_cuda_box_intersect(src, &m[i].dst, lo, size) ? box_numel(size, r) : 0;
            rc[i] = ps_cuda_box_intersect(&m[i].src, dst, lo, size) ? box_numel(size, r) : 0;
            so[i + 1] = so[i] + sc[i];
            ro[i + 1] = ro[i] + rc[i];
        }
        st = scratch(d, 0, (size_t)so[n] * 4, &a, err);
        if (st == PS_OK)
            st = scratch(d, 1, (size_t)ro[n] * 4, &b, err);
        for (int i = 0; i < n && st == PS_OK; i++)
            if (sc[i] > 0 && ps_cuda_box_intersect(src, &m[i].dst, lo, size)) {
                ps_tile v = box_view(dst, lo, size, (float *)a + so[i]);
                st = ps_cuda_box_copy(s, src, &v, false, err);
            }
        if (st == PS_OK)
            st = launch_enter(cb, d, gs, what, err);
        if (st == PS_OK) {
            call = "ncclSend/ncclRecv";
            nr = ncclGroupStart();
            for (int i = 0; i < n && nr == ncclSuccess; i++) {
                if (sc[i] > 0)
                    nr = ncclSend((float *)a + so[i], (size_t)sc[i], ncclFloat, i, comm,
                                  s->stream);
                if (nr == ncclSuccess && rc[i] > 0)
                    nr = ncclRecv((float *)b + ro[i], (size_t)rc[i], ncclFloat, i, comm,
                                  s->stream);
            }
            ncclResult_t ge = ncclGroupEnd();
            launch_leave(cb, gs);
            if (nr == ncclSuccess)
                nr = ge;
        }
        for (int i = 0; i < n && st == PS_OK && nr == ncclSuccess; i++)
            if (rc[i] > 0 && ps_cuda_box_intersect(&m[i].src, dst, lo, size)) {
                ps_tile v = box_view(dst, lo, size, (float *)b + ro[i]);
                st = ps_cuda_box_copy(s, &v, dst, false, err);
            }
        free(so);
    } else {
        st = ps_error_set(err, PS_ERR_INVALID, "device %d: unknown collective kind %d",
                          d->device, (int)kind);
    }
    free(m);
    if (st != PS_OK)
        return st;
    if (nr != ncclSuccess)
        return nccl_fail(d->loc, nr, comm, call, what, g->rank, err);
    return nccl_wait(cb, d, s->stream, comm, what, g->rank, err);
}

static ps_status nccl_reduce(cuda_backend *cb, dev_state *d, group_state *gs,
                             const ps_exec_group *g, void *data, int64_t n, ps_reduce_op op,
                             bool dbl, const char *what, ps_error *err)
{
    ncclComm_t comm;
    PS_RET(group_comm(cb, d, gs, g, &comm, err));
    int64_t *counts = (int64_t *)calloc((size_t)gs->n, sizeof *counts);
    if (counts == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", d->device);
    ps_status st = PS_OK;
    if (!ps_group_is_local(cb->mail, g)) {
        /* the kind tells floats from doubles: a member reducing the other
         * type fails the exchange (different kinds) */
        st = ps_cuda_remote_counts(cb->mail, d->device, g, (int)op + (dbl ? 2 : 0), n, counts,
                                   err);
    } else {
        const rv_slot *slot = publish(cb, gs, g->rank, NULL, NULL, data, n, dbl);
        st = group_wait(cb, gs, d->device, what, err);
        pthread_mutex_lock(&cb->mu);
        for (int m = 0; m < gs->n && st == PS_OK; m++) {
            counts[m] = slot[m].n;
            if (slot[m].dbl != dbl)
                st = ps_error_set(err, PS_ERR_INVALID,
                                  "device %d: %s of %s, member %d reduces %s", d->device, what,
                                  dbl ? "doubles" : "floats", m, dbl ? "floats" : "doubles");
        }
        pthread_mutex_unlock(&cb->mu);
    }
    for (int m = 0; m < gs->n && st == PS_OK; m++)
        if (counts[m] != n)
            st = ps_error_set(err, PS_ERR_INVALID,
                              "device %d: %s of %lld values, member %d reduces %lld", d->device,
                              what, (long long)n, m, (long long)counts[m]);
    free(counts);
    PS_RET(st);
    if (n == 0)
        return PS_OK;
    PS_RET(launch_enter(cb, d, gs, what, err));
    ncclResult_t nr = ncclAllReduce(data, data, (size_t)n, dbl ? ncclDouble : ncclFloat,
                                    op == PS_REDUCE_OP_MAX ? ncclMax : ncclSum, comm,
                                    d->s->stream);
    launch_leave(cb, gs);
    if (nr != ncclSuccess)
        return nccl_fail(d->loc, nr, comm, "ncclAllReduce", what, g->rank, err);
    return nccl_wait(cb, d, d->s->stream, comm, what, g->rank, err);
}

/* ---- collectives ---------------------------------------------------------------------- */

static ps_status run_collective(cuda_backend *cb, dev_state *d, group_state *gs,
                                const ps_exec_group *g, ps_collective kind, const ps_tile *src,
                                ps_tile *dst, const char *what, ps_error *err)
{
    if (g->n == 1)
        return lone_collective(d, g->id, kind, src, dst, err);
    if (cb->nccl)
        return nccl_collective(cb, d, gs, g, kind, src, dst, what, err);
    if (!ps_group_is_local(cb->mail, g))
        return ps_cuda_remote_collective(cb->mail, d->s, g, kind, src, dst, err);
    return share_collective(cb, d, gs, g->rank, kind, src, dst, what, err);
}

static ps_status be_collective(ps_backend *b, int device, const ps_exec_group *g,
                               ps_collective kind, const ps_tile *src, ps_tile *dst,
                               ps_error *err)
{
    DEV(b, device);
    cuda_backend *cb = cb_of(b);
    char what[96];
    snprintf(what, sizeof what, "%s on group %d",
             (unsigned)kind < PS_COLL_COUNT ? ps_collective_names[kind] : "collective",
             g != NULL ? g->id : -1);
    PS_RET(check_injected(cb, device, what, err));
    if ((unsigned)kind >= PS_COLL_COUNT)
        return ps_error_set(err, PS_ERR_INVALID, "device %d: unknown collective kind %d", device,
                            (int)kind);
    PS_RET(check_tiles(device, src, dst, err));
    if (src->dtype != dst->dtype)
        return ps_error_set(err, PS_ERR_INVALID, "device %d: %s between %s and %s tiles", device,
                            what, ps_dtype_name(src->dtype), ps_dtype_name(dst->dtype));
    group_state *gs;
    PS_RET(group_get(cb, g, device, &gs, err));
    if (!ps_tile_is_half(src))
        return run_collective(cb, d, gs, g, kind, src, dst, what, err);
    /* Half tiles travel and combine widened: sums in fp32, rounded once into
     * dst, as on the CPU backend (NCCL's own half types would round at every
     * step of its ring). */
    ps_tile fsrc = *src, fdst = *dst;
    fsrc.dtype = fdst.dtype = PS_DTYPE_F32;
    PS_RET(scratch(d, 2, (size_t)ps_tile_numel(src) * 4, &fsrc.data, err));
    PS_RET(scratch(d, 3, (size_t)ps_tile_numel(dst) * 4, &fdst.data, err));
    PS_RET(ps_cuda_half_widen(d->s, src->dtype, src->data, (float *)fsrc.data,
                              ps_tile_numel(src), err));
    /* gathers keep what dst holds outside the boxes they write; sums
     * overwrite all of it */
    if (kind == PS_COLL_ALL_GATHER || kind == PS_COLL_ALL_TO_ALL)
        PS_RET(ps_cuda_half_widen(d->s, dst->dtype, dst->data, (float *)fdst.data,
                                  ps_tile_numel(dst), err));
    PS_RET(run_collective(cb, d, gs, g, kind, &fsrc, &fdst, what, err));
    PS_RET(ps_cuda_half_narrow(d->s, dst->dtype, (const float *)fdst.data, dst->data,
                               ps_tile_numel(dst), err));
    PS_CUDA_RET(d->loc, cudaStreamSynchronize(d->s->stream));
    return PS_OK;
}

/* The in-place all-reduce of n floats, or doubles (dbl), in device memory. */
static ps_status reduce_values(ps_backend *b, int device, const ps_exec_group *g, void *data,
                               int64_t n, ps_reduce_op op, bool dbl, ps_error *err)
{
    DEV(b, device);
    cuda_backend *cb = cb_of(b);
    char what[96];
    snprintf(what, sizeof what, "reduce%s (%s) on group %d", dbl ? "64" : "",
             op == PS_REDUCE_OP_MAX ? "max" : "sum", g != NULL ? g->id : -1);
    PS_RET(check_injected(cb, device, what, err));
    group_state *gs;
    PS_RET(group_get(cb, g, device, &gs, err));
    if (g->n == 1)
        return PS_OK;
    if (cb->nccl)
        return nccl_reduce(cb, d, gs, g, data, n, op, dbl, what, err);
    if (!ps_group_is_local(cb->mail, g))
        return ps_cuda_remote_reduce(cb->mail, d->s, g, data, n, op, dbl, err);
    return share_reduce(cb, d, gs, g->rank, data, n, op, dbl, what, err);
}

static ps_status be_reduce(ps_backend *b, int device, const ps_exec_group *g, float *data,
                           int64_t n, ps_reduce_op op, ps_error *err)
{
    return reduce_values(b, device, g, data, n, op, false, err);
}

/* batchnorm's totals across devices, in double as on the CPU */
static ps_status be_reduce64(ps_backend *b, int device, const ps_exec_group *g, double *data,
                             int64_t n, ps_reduce_op op, ps_error *err)
{
    return reduce_values(b, device, g, data, n, op, true, err);
}

/* ---- point to point ------------------------------------------------------------------- */

static ps_status chunk_of(int device, const ps_tile *t, const int64_t *box_size, int chunk,
                          int chunks, int64_t *start, int64_t *len, ps_error *err)
{
    if (chunks < 1 || chunk < 0 || chunk >= chunks)
        return ps_error_set(err, PS_ERR_INVALID, "device %d: chunk %d of %d", device, chunk,
                            chunks);
    ps_coll_chunk(box_numel(box_size, t->rank), chunks, chunk, start, len);
    return PS_OK;
}

/* Sends are buffered: the sender packs its chunk into a staging buffer on
 * its own GPU, waits for the pack and queues the message; the receiver
 * copies it (cudaMemcpyPeerAsync when the GPUs differ) and unpacks it, then
 * hands the buffer back to the pair's spares. A send never waits for its
 * receiver, as on the CPU backend, so programs that are deadlock-free there
 * are here; messages between one pair arrive in order. */
static ps_status be_send(ps_backend *b, int device, int peer, const ps_tile *src,
                         const int64_t *box_offset, const int64_t *box_size, int chunk,
                         int chunks, ps_error *err)
{
    DEV(b, device);
    cuda_backend *cb = cb_of(b);
    if (peer < 0 || peer >= b->n_devices || peer == device)
        return ps_error_set(err, PS_ERR_INVALID, "device %d: send to device %d", device, peer);
    int64_t start, len;
    PS_RET(chunk_of(device, src, box_size, chunk, chunks, &start, &len, err));
    int eb = ps_tile_elem_bytes(src);
    size_t bytes = (size_t)(len > 0 ? len : 1) * (size_t)eb;
    if (ps_mailbox_is_remote(cb->mail, peer)) { /* through host memory */
        void *staging;
        PS_RET(scratch(d, 0, bytes, &staging, err));
        return ps_cuda_remote_send(cb->mail, d->s, peer, src, box_offset, box_size, start, len,
                                   staging, err);
    }
    chan *c = &cb->chans[device * b->n_devices + peer];
    msg *mm = NULL;
    pthread_mutex_lock(&cb->mu);
    /* the smallest spare that holds the message, so that a small message
     * does not take the buffer a large one will need */
    msg **best = NULL;
    for (msg **pp = &c->spare; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->cap >= bytes && (best == NULL || (*pp)->cap < (*best)->cap))
            best = pp;
    if (best != NULL) {
        mm = *best;
        *best = mm->next;
    }
    pthread_mutex_unlock(&cb->mu);
    if (mm == NULL) {
        mm = (msg *)calloc(1, sizeof *mm);
        if (mm == NULL)
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        cudaError_t e = ps_cuda_malloc(d->s, &mm->buf, bytes);
        if (e != cudaSuccess) {
            free(mm);
            return ps_cuda_fail(d->loc, e, "cudaMalloc", err);
        }
        mm->gpu = d->gpu;
        mm->cap = bytes;
    }
    mm->len = len;
    mm->dtype = src->dtype;
    mm->next = NULL;
    ps_status st = ps_cuda_box_pack(d->s, src, box_offset, box_size, start, len, mm->buf, true,
                                    err);
    if (st == PS_OK) {
        cudaError_t e = cudaStreamSynchronize(d->s->stream);
        if (e != cudaSuccess)
            st = ps_cuda_fail(d->loc, e, "cudaStreamSynchronize", err);
    }
    pthread_mutex_lock(&cb->mu);
    if (st != PS_OK) {
        mm->next = c->spare;
        c->spare = mm;
    } else {
        if (c->tail != NULL)
            c->tail->next = mm;
        else
            c->head = mm;
        c->tail = mm;
        pthread_cond_broadcast(&cb->cv);
    }
    pthread_mutex_unlock(&cb->mu);
    return st;
}

static ps_status be_recv(ps_backend *b, int device, int peer, ps_tile *dst,
                         const int64_t *box_offset, const int64_t *box_size, int chunk,
                         int chunks, ps_error *err)
{
    DEV(b, device);
    cuda_backend *cb = cb_of(b);
    if (peer < 0 || peer >= b->n_devices || peer == device)
        return ps_error_set(err, PS_ERR_INVALID, "device %d: receive from device %d", device,
                            peer);
    int64_t start, len;
    PS_RET(chunk_of(device, dst, box_size, chunk, chunks, &start, &len, err));
    if (ps_mailbox_is_remote(cb->mail, peer)) {
        void *staging;
        PS_RET(scratch(d, 1, (size_t)(len > 0 ? len : 1) * (size_t)ps_tile_elem_bytes(dst),
                       &staging, err));
        return ps_cuda_remote_recv(cb->mail, d->s, peer, dst, box_offset, box_size, start, len,
                                   staging, err);
    }
    char what[64];
    snprintf(what, sizeof what, "receive from device %d", peer);
    chan *c = &cb->chans[peer * b->n_devices + device];
    pthread_mutex_lock(&cb->mu);
    while (c->head == NULL && !cb->aborted)
        pthread_cond_wait(&cb->cv, &cb->mu);
    msg *mm = c->head;
    if (cb->aborted || mm == NULL) {
        pthread_mutex_unlock(&cb->mu);
        return aborted_error(device, what, err);
    }
    c->head = mm->next;
    if (c->head == NULL)
        c->tail = NULL;
    pthread_mutex_unlock(&cb->mu);
    ps_status st = PS_OK;
    void *from = mm->buf;
    if (mm->len != len)
        st = ps_error_set(err, PS_ERR_INVALID,
                          "device %d: message from device %d has %lld elements, the receive "
                          "expects %lld (chunk %d of %d)",
                          device, peer, (long long)mm->len, (long long)len, chunk, chunks);
    int eb = ps_tile_elem_bytes(dst);
    /* a half type on either side must be the same on both (2-byte elements
     * of one kind); 4-byte ones move as they are */
    bool half_pair = ps_half_dtype(mm->dtype) || ps_tile_is_half(dst);
    if (st == PS_OK && half_pair && mm->dtype != dst->dtype)
        st = ps_error_set(err, PS_ERR_INVALID,
                          "device %d: message from device %d holds %s, the receive expects %s",
                          device, peer, ps_dtype_name(mm->dtype), ps_dtype_name(dst->dtype));
    if (st == PS_OK && len > 0 && mm->gpu != d->gpu) {
        /* over NVLink/PCIe into this GPU's staging */
        st = scratch(d, 1, (size_t)len * (size_t)eb, &from, err);
        if (st == PS_OK) {
            cudaError_t e = cudaMemcpyPeerAsync(from, d->gpu, mm->buf, mm->gpu,
                                                (size_t)len * (size_t)eb, d->s->stream);
            if (e != cudaSuccess)
                st = ps_cuda_fail(d->loc, e, "cudaMemcpyPeerAsync", err);
        }
    }
    if (st == PS_OK)
        st = ps_cuda_box_pack(d->s, dst, box_offset, box_size, start, len, from, false, err);
    if (st == PS_OK) {
        cudaError_t e = cudaStreamSynchronize(d->s->stream);
        if (e != cudaSuccess)
            st = ps_cuda_fail(d->loc, e, "cudaStreamSynchronize", err);
    }
    pthread_mutex_lock(&cb->mu);
    mm->next = c->spare;
    c->spare = mm;
    pthread_mutex_unlock(&cb->mu);
    return st;
}

static ps_status be_finish(ps_backend *b, int device, ps_error *err)
{
    DEV(b, device);
    /* also answers the ops' deferred data checks (ps_cuda_check_defer) */
    return ps_cuda_stream_sync(d->s, err);
}

/* ---- abort, destroy ------------------------------------------------------------------ */

static void be_abort(ps_backend *b)
{
    cuda_backend *cb = cb_of(b);
    pthread_mutex_lock(&cb->mu);
    cb->aborted = true;
    pthread_cond_broadcast(&cb->cv);
    pthread_mutex_unlock(&cb->mu);
    if (cb->mail != NULL)
        ps_mailbox_abort(cb->mail);
    ps_launch_gate_abort(cb->gate);
    /* NCCL: a device thread waiting on a collective sees the flag and
     * returns (nccl_wait); kernels left waiting for peers stay on the
     * streams until destroy aborts every communicator, before anything
     * waits for a stream. A thread inside ncclCommInitRank is not reached:
     * the bootstrap waits for every rank of the group (across processes
     * the run ends by MPI_Abort) */
}

/* Ends a communicator locally. ncclCommDestroy finalizes first, which waits
 * for every rank to be quiescent: from one thread over several ranks that
 * could wait forever. ncclCommAbort frees the rank's resources without its
 * peers (after an abort it also ends kernels waiting for peers that
 * stopped); destroy calls it once the devices' work is complete or
 * abandoned. */
static void comm_end(cuda_backend *cb, ncclComm_t *c)
{
    (void)cb;
    if (*c == NULL)
        return;
    (void)ncclCommAbort(*c);
    *c = NULL;
}

static void dev_free(cuda_backend *cb, dev_state *d)
{
    (void)cudaSetDevice(d->gpu);
    cache_flush(d);
    for (int i = 0; i < d->live_cap; i++)
        if (d->live[i].ptr != NULL && d->live[i].ptr != DELETED)
            (void)cudaFree(d->live[i].ptr);
    free(d->live);
    free(d->cache);
    for (int k = 0; k < 4; k++)
        if (d->scratch[k] != NULL)
            (void)cudaFree(d->scratch[k]);
    if (d->ev != NULL)
        for (int i = 0; i < cb->slots; i++)
            if (d->ev[i] != NULL)
                (void)cudaEventDestroy(d->ev[i]);
    free(d->ev);
    free(d->ev_set);
    ps_cuda_stream_free(d->s);
    if (d->mu_init)
        pthread_mutex_destroy(&d->mu);
}

static void be_destroy(ps_backend *b)
{
    if (b == NULL)
        return;
    cuda_backend *cb = cb_of(b);
    if (cb->aborted)
        for (group_state *gs = cb->groups; gs != NULL; gs = gs->next)
            for (int i = 0; i < gs->n; i++)
                comm_end(cb, &gs->comm[i]);
    /* the devices' work (collectives included) is complete */
    for (int i = 0; cb->dev != NULL && i < b->n_devices; i++) {
        dev_state *d = &cb->dev[i];
        if (!d->here)
            continue;
        (void)cudaSetDevice(d->gpu);
        if (d->s != NULL)
            (void)cudaStreamSynchronize(d->s->stream);
    }
    while (cb->groups != NULL) {
        group_state *gs = cb->groups;
        cb->groups = gs->next;
        for (int i = 0; i < gs->n; i++)
            comm_end(cb, &gs->comm[i]);
        free(gs->comm);
        free(gs->slot);
        free(gs->seq);
        free(gs);
    }
    if (cb->chans != NULL) {
        for (int i = 0; i < b->n_devices * b->n_devices; i++) {
            msg *lists[2] = {cb->chans[i].head, cb->chans[i].spare};
            for (int k = 0; k < 2; k++)
                while (lists[k] != NULL) {
                    msg *mm = lists[k];
                    lists[k] = mm->next;
                    (void)cudaSetDevice(mm->gpu);
                    (void)cudaFree(mm->buf);
                    free(mm);
                }
        }
        free(cb->chans);
    }
    if (cb->dev != NULL)
        for (int i = 0; i < b->n_devices; i++)
            if (cb->dev[i].here)
                dev_free(cb, &cb->dev[i]);
    (void)cudaGetLastError();
    free(cb->dev);
    ps_mailbox_destroy(cb->mail);
    ps_launch_gate_destroy(cb->gate);
    pthread_cond_destroy(&cb->cv);
    pthread_mutex_destroy(&cb->mu);
    free(cb);
}

static const ps_backend_ops cuda_ops = {
    "cuda",      be_alloc,     be_release,    be_upload, be_download, be_op,
    be_accumulate, be_zero,    be_copy_box,   be_collective, be_reduce, be_send,
    be_recv,     be_mark,      be_finish,     be_elapsed, be_peak_bytes, be_abort,
    be_destroy,
    be_reduce64,
    be_find_nonfinite,
    be_op_accumulates,
    be_check_memory,
    NULL, /* stamp_host_s: stamps are CUDA events */
};

/* ---- create ---------------------------------------------------------------------------- */

ps_cuda_backend_options ps_cuda_backend_options_default(void)
{
    ps_cuda_backend_options o;
    memset(&o, 0, sizeof o);
    o.inject_device = -1;
    return o;
}

static ps_status dev_init(cuda_backend *cb, dev_state *d, int device, int gpu, ps_error *err)
{
    d->here = true;
    d->device = device;
    d->gpu = gpu;
    d->loc.device = device;
    d->loc.gpu = gpu;
    if (pthread_mutex_init(&d->mu, NULL) != 0)
        return ps_error_set(err, PS_ERR_NOMEM, "device %d: cannot create a mutex", device);
    d->mu_init = true;
    ps_cuda_stream_options so = {cb->opt.allow_tf32};
    PS_RET(ps_cuda_stream_create(device, gpu, &so, &d->s, err));
    d->cb = cb;
    d->s->reclaim = stream_reclaim;
    d->s->reclaim_arg = d;
    d->s->gate = cb->gate;
    if (cb->gate != NULL) /* no allocation of cuBLAS's own inside a launch window */
        PS_RET(ps_cuda_stream_own_blas_workspace(d->s, err));
    d->ev = (cudaEvent_t *)calloc((size_t)(cb->slots > 0 ? cb->slots : 1), sizeof *d->ev);
    d->ev_set = (bool *)calloc((size_t)(cb->slots > 0 ? cb->slots : 1), sizeof *d->ev_set);
    if (d->ev == NULL || d->ev_set == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < cb->slots; i++)
        PS_CUDA_RET(d->loc, cudaEventCreate(&d->ev[i]));
    return PS_OK;
}

ps_status ps_cuda_backend_create(int n_devices, int timing_slots,
                                 const ps_cuda_backend_options *opt, ps_backend **out,
                                 ps_error *err)
{
    ps_status st = PS_OK;
    cuda_backend *cb = NULL;
    int gpus = 0, here = 0, first_gpu = 0;
    *out = NULL;
    if (n_devices < 1 || timing_slots < 0)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cuda backend: %d devices and %d timing slots", n_devices,
                            timing_slots);
    gpus = ps_cuda_device_count();
    if (gpus == 0)
        return ps_error_set(err, PS_ERR_UNSUPPORTED,
                            "cuda backend: no usable GPU (cudaGetDeviceCount found none or the "
                            "driver is missing)");
    cb = (cuda_backend *)calloc(1, sizeof *cb);
    if (cb == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    cb->opt = opt != NULL ? *opt : ps_cuda_backend_options_default();
    cb->base.ops = &cuda_ops;
    cb->base.n_devices = n_devices;
    cb->base.half_storage = true; /* fp16/bf16 tensors in 2 bytes (cuda_half.cu) */
    cb->slots = timing_slots;
    pthread_mutex_init(&cb->mu, NULL);
    pthread_cond_init(&cb->cv, NULL);
    st = ps_mailbox_create(n_devices, cb->opt.hosts, &cb->mail, err);
    if (st != PS_OK)
        goto out;
    /* this process's devices (all of them without hosts) take its GPUs in
     * order; a second process on the same machine takes the next ones,
     * unless the launcher gave each process GPUs of its own */
    for (int i = 0; i < n_devices; i++)
        if (!ps_mailbox_is_remote(cb->mail, i))
            here++;
    first_gpu = ps_hosts_node_rank(cb->opt.hosts) * ps_hosts_per_host(cb->opt.hosts);
    if (gpus < first_gpu + here && gpus >= here && getenv("CUDA_VISIBLE_DEVICES") != NULL)
        first_gpu = 0;
    if (!cb->opt.share_gpu && gpus < first_gpu + here) {
        if (here == n_devices)
            st = ps_error_set(err, PS_ERR_UNSUPPORTED,
                              "cuda backend: the plan has %d devices but this machine has %d "
                              "GPU%s; run it on a machine with %d GPUs (or share GPU 0 among "
                              "all devices, a test mode)",
                              n_devices, gpus, gpus == 1 ? "" : "s", n_devices);
        else
            st = ps_error_set(err, PS_ERR_UNSUPPORTED,
                              "cuda backend: rank %d runs %d devices of the plan on GPUs "
                              "%d..%d, but this machine has %d GPU%s (process %d of this "
                              "machine); start one process per host with %d GPUs each (or "
                              "share GPU 0, a test mode)",
                              ps_hosts_rank(cb->opt.hosts), here, first_gpu,
                              first_gpu + here - 1, gpus, gpus == 1 ? "" : "s",
                              ps_hosts_node_rank(cb->opt.hosts) + 1, here);
        goto out;
    }
    cb->nccl = !cb->opt.share_gpu && n_devices > 1;
    if (cb->nccl && (st = ps_launch_gate_create(&cb->gate, err)) != PS_OK)
        goto out;
    /* NCCL connects a communicator's peers (allocating their buffers) at its
     * first collective unless told to at its setup: there, inside a launch
     * window, the gate could not keep that apart from the launches. A value
     * the user set stays, with a warning. NVLS buffers, which each group's
     * communicator would allocate at its setup outside the plan's memory
     * accounting, stay off unless asked for. A fixed NCCL_COMM_ID would give
     * every group's communicator the same bootstrap address. */
    if (cb->nccl) {
        const char *rc = getenv("NCCL_RUNTIME_CONNECT");
        if (rc != NULL && strcmp(rc, "0") != 0)
            PS_LOG_WARN("cuda backend: NCCL_RUNTIME_CONNECT=%s: communicators connect at their "
                        "first collective, inside its launch window (docs/executors.md, "
                        "Known gaps)",
                        rc);
        (void)setenv("NCCL_RUNTIME_CONNECT", "0", 0);
        (void)setenv("NCCL_NVLS_ENABLE", "0", 0);
        if (getenv("NCCL_COMM_ID") != NULL) {
            st = ps_error_set(err, PS_ERR_UNSUPPORTED,
                              "cuda backend: NCCL_COMM_ID is set: every group of the plan has a "
                              "communicator of its own, which one fixed bootstrap address "
                              "cannot serve; unset it");
            goto out;
        }
    }
    cb->dev = (dev_state *)calloc((size_t)n_devices, sizeof *cb->dev);
    if (cb->dev == NULL) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int i = 0, local = 0; i < n_devices; i++) {
        if (ps_mailbox_is_remote(cb->mail, i))
            continue;
        st = dev_init(cb, &cb->dev[i], i, cb->opt.share_gpu ? 0 : first_gpu + local, err);
        local++;
        if (st != PS_OK)
            goto out;
    }
    cb->chans = (chan *)calloc((size_t)(n_devices * n_devices), sizeof *cb->chans);
    if (cb->chans == NULL) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (cb->nccl) {
        /* direct GPU-to-GPU copies for send/recv where the hardware allows
         * them (cudaMemcpyPeerAsync goes through the host otherwise) */
        for (int i = 0; i < n_devices; i++)
            for (int j = 0; j < n_devices; j++) {
                int can = 0;
                if (i == j || !cb->dev[i].here || !cb->dev[j].here ||
                    cudaDeviceCanAccessPeer(&can, cb->dev[i].gpu, cb->dev[j].gpu) !=
                                  cudaSuccess || !can)
                    continue;
                cudaError_t e = cudaSetDevice(cb->dev[i].gpu);
                if (e == cudaSuccess)
                    e = cudaDeviceEnablePeerAccess(cb->dev[j].gpu, 0);
                /* a GPU has at most 8 peers (cudaErrorTooManyPeers beyond):
                 * copies to the others go through the host */
                if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled &&
                    e != cudaErrorTooManyPeers && e != cudaErrorPeerAccessUnsupported) {
                    st = ps_cuda_fail(cb->dev[i].loc, e, "cudaDeviceEnablePeerAccess", err);
                    goto out;
                }
                (void)cudaGetLastError();
            }
    }
    *out = &cb->base;
    cb = NULL;
out:
    if (cb != NULL)
        be_destroy(&cb->base);
    return st;
}

int ps_cuda_backend_gpu(const ps_backend *b, int device)
{
    const cuda_backend *cb = (const cuda_backend *)b;
    return device >= 0 && device < b->n_devices && cb->dev[device].here ? cb->dev[device].gpu
                                                                         : -1;
}

ps_cuda_stream *ps_cuda_backend_stream(ps_backend *b, int device)
{
    return device >= 0 && device < b->n_devices && cb_of(b)->dev[device].here
               ? cb_of(b)->dev[device].s
               : NULL;
}
