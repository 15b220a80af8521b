#include "exec/cpu/cpu_backend.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes_text.h"
#include "core/clock.h"
#include "exec/box.h"
#include "exec/cpu/cpu_ops.h"
#include "exec/cpu/host_memory.h"
#include "exec/half.h"
#include "exec/host_collective.h"
#include "exec/mailbox.h"

/* OpenBLAS's own API (cblas.h lacks it); weak, so that any other CBLAS links */
void openblas_set_num_threads(int n) __attribute__((weak));

/* A rendezvous of one group: members post copies of their data, the last
 * arrival opens the round, every member reads all copies, the last reader
 * closes the round. */
typedef struct rendezvous {
    int n, arrived, done;
    bool open;
    void **copy;    /* [n] packed src tiles (or reduce arrays) */
    ps_tile *geo;   /* [n] their geometry */
    int64_t *count; /* [n] elements */
    int kind;       /* what the round does, checked across members */
    /* the round opened or closed, or the abort (under the backend's mu):
     * one per group, so that a round wakes only its members */
    pthread_cond_t cv;
} rendezvous;

struct block_header;

typedef struct cpu_device {
    int64_t bytes, peak; /* handed out (what peak memory counts) */
    int n_slots;
    double *stamp;
    /* Released blocks kept for reuse, up to `peak` bytes: the same sizes
     * come back every micro-batch, and memory handed back to the system
     * returns as fresh pages, a page fault each on first write (a fifth of
     * a GPT step's time went to them). Touched by the device's thread. */
    struct block_header **pool;
    int n_pool, cap_pool;
    int64_t pool_bytes;
    /* fp32 copies of an op's half tiles, kept from op to op (grown, never
     * shrunk): a malloc per op gave fresh pages and a page fault each, a
     * tenth of a bf16 step. Not device memory: a GPU widens in registers. */
    float *scratch;
    int64_t scratch_floats;
} cpu_device;

typedef struct cpu_backend {
    ps_backend base;
    pthread_mutex_t mu; /* the rendezvous and `aborted` */
    bool aborted;
    cpu_device *dev;
    rendezvous **rdv; /* by group id */
    int n_rdv;
    ps_mailbox *mail;   /* sends, and collectives across hosts */
    int64_t host_memory; /* bytes check_memory allows; -1: what the system has available */
} cpu_backend;

typedef struct block_header {
    int64_t bytes;
    int64_t pad[7]; /* keeps data 64-byte aligned */
} block_header;

static cpu_backend *cb(ps_backend *b) { return (cpu_backend *)b; }

static ps_status cpu_alloc(ps_backend *b, int device, int64_t bytes, void **out, ps_error *err)
{
    cpu_backend *c = cb(b);
    cpu_device *d = &c->dev[device];
    void *p = NULL;
    if (bytes < 0)
        return ps_error_set(err, PS_ERR_NOMEM, "device %d: cannot allocate %lld bytes", device,
                            (long long)bytes);
    for (int i = d->n_pool - 1; i >= 0 && p == NULL; i--) /* the latest released first */
        if (d->pool[i]->bytes == bytes) {
            p = d->pool[i];
            d->pool[i] = d->pool[--d->n_pool];
            d->pool_bytes -= bytes;
        }
    if (p == NULL &&
        posix_memalign(&p, 64, sizeof(block_header) + (size_t)(bytes > 0 ? bytes : 1)) != 0)
        return ps_error_set(err, PS_ERR_NOMEM, "device %d: cannot allocate %lld bytes", device,
                            (long long)bytes);
    ((block_header *)p)->bytes = bytes;
    d->bytes += bytes;
    if (d->bytes > d->peak)
        d->peak = d->bytes;
    *out = (char *)p + sizeof(block_header);
    return PS_OK;
}

static void cpu_release(ps_backend *b, int device, void *ptr)
{
    if (ptr == NULL)
        return;
    block_header *h = (block_header *)((char *)ptr - sizeof(block_header));
    cpu_device *d = &cb(b)->dev[device];
    d->bytes -= h->bytes;
#if defined(__SANITIZE_ADDRESS__)
    /* under AddressSanitizer every block goes back, so that a use after
     * release is caught rather than read from a kept block */
    const bool keep = false;
#else
    const bool keep = d->pool_bytes + h->bytes <= d->peak;
#endif
    if (keep) {
        if (d->n_pool == d->cap_pool) {
            int cap = d->cap_pool ? 2 * d->cap_pool : 64;
            block_header **q = realloc(d->pool, (size_t)cap * sizeof *q);
            if (q == NULL) {
                free(h);
                return;
            }
            d->pool = q;
            d->cap_pool = cap;
        }
        d->pool[d->n_pool++] = h;
        d->pool_bytes += h->bytes;
        return;
    }
    free(h);
}

static ps_status cpu_upload(ps_backend *b, int device, void *dst, const void *host,
                            int64_t bytes, ps_error *err)
{
    (void)b, (void)device, (void)err;
    memcpy(dst, host, (size_t)bytes);
    return PS_OK;
}

/* ---- half precision: fp16/bf16 tiles computed in fp32 ---- */

/* Floats a half tile takes in the scratch, rounded up to 64 bytes. */
static int64_t scratch_floats(const ps_tile *t)
{
    return ps_tile_is_half(t) ? (ps_tile_numel(t) + 15) / 16 * 16 : 0;
}

/* f: t itself, or a float copy of the half tile t at *next in the scratch
 * (widened when `copy`; an output's values are all written by the op). */
static void widen_tile(const ps_tile *t, bool copy, ps_tile *f, float **next)
{
    *f = *t;
    if (!ps_tile_is_half(t))
        return;
    if (copy)
        ps_half_widen(t->dtype, t->data, *next, ps_tile_numel(t));
    f->data = *next;
    f->dtype = PS_DTYPE_F32;
    *next += scratch_floats(t);
}

/* The widened values of f back into the half tile t (rounded). */
static void narrow_tile(const ps_tile *f, ps_tile *t)
{
    if (f->data != t->data)
        ps_half_narrow(t->dtype, f->data, t->data, ps_tile_numel(t));
}

/* A float copy of the half tile t that the caller owns (a collective's
 * source, handed to the rendezvous), or NULL with *f = *t for a float one. */
static ps_status widen_owned(int device, const ps_tile *t, ps_tile *f, float **owned,
                             ps_error *err)
{
    *f = *t;
    *owned = NULL;
    if (!ps_tile_is_half(t))
        return PS_OK;
    int64_t n = ps_tile_numel(t);
    *owned = malloc((size_t)(n > 0 ? n : 1) * sizeof **owned);
    if (*owned == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", device);
    ps_half_widen(t->dtype, t->data, *owned, n);
    f->data = *owned;
    f->dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* At least `need` floats of scratch on device d. */
static ps_status scratch_reserve(cpu_device *d, int device, int64_t need, ps_error *err)
{
    if (need <= d->scratch_floats)
        return PS_OK;
    free(d->scratch);
    d->scratch_floats = 0;
    if (posix_memalign((void **)&d->scratch, 64, (size_t)need * sizeof(float)) != 0) {
        d->scratch = NULL;
        return ps_error_set(err, PS_ERR_NOMEM,
                            "device %d: out of host memory widening %lld half values", device,
                            (long long)need);
    }
    d->scratch_floats = need;
    return PS_OK;
}

/* An op whose tiles include half ones: the fp32 kernel on widened copies,
 * its outputs (and Adam's in-place inputs) rounded back. */
static ps_status half_op(cpu_device *d, int device, const ps_op *op, const ps_tile *in,
                         ps_tile *out, const ps_op_context *ctx, ps_error *err)
{
    int64_t need = 0;
    for (int i = 0; i < op->n_in; i++)
        need += scratch_floats(&in[i]);
    for (int o = 0; o < op->n_out; o++)
        need += scratch_floats(&out[o]);
    ps_status st = scratch_reserve(d, device, need, err);
    if (st != PS_OK)
        return st;
    ps_tile fin[PS_MAX_OP_IO], fout[PS_MAX_OP_IO];
    float *next = d->scratch;
    for (int i = 0; i < op->n_in; i++)
        widen_tile(&in[i], true, &fin[i], &next);
    for (int o = 0; o < op->n_out; o++)
        widen_tile(&out[o], false, &fout[o], &next);
    st = ps_cpu_op_run(op, fin, fout, ctx, err);
    if (st == PS_OK) {
        for (int o = 0; o < op->n_out; o++)
            narrow_tile(&fout[o], &out[o]);
        if (op->kind == PS_OP_ADAM) /* updated in place; an unchanged input rounds to itself */
            for (int i = 0; i < op->n_in; i++)
                narrow_tile(&fin[i], (ps_tile *)&in[i]);
    }
    return st;
}

static ps_status cpu_op(ps_backend *b, int device, const ps_op *op, const ps_tile *in,
                        ps_tile *out, const ps_op_context *ctx, ps_error *err)
{
    cpu_device *d = &cb(b)->dev[device];
    for (int i = 0; i < op->n_in; i++)
        if (ps_tile_is_half(&in[i]))
            return half_op(d, device, op, in, out, ctx, err);
    for (int o = 0; o < op->n_out; o++)
        if (ps_tile_is_half(&out[o]))
            return half_op(d, device, op, in, out, ctx, err);
    return ps_cpu_op_run(op, in, out, ctx, err);
}

static ps_status cpu_accumulate(ps_backend *b, int device, ps_tile *dst, const ps_tile *src,
                                ps_error *err)
{
    (void)b;
    int64_t off[PS_MAX_RANK], size[PS_MAX_RANK], so[PS_MAX_RANK], ss[PS_MAX_RANK];
    ps_tile_box(dst, off, size);
    ps_tile_box(src, so, ss);
    size_t dims = (size_t)dst->rank * sizeof *off;
    if (src->rank != dst->rank || memcmp(off, so, dims) != 0 || memcmp(size, ss, dims) != 0 ||
        dst->dtype != src->dtype || dst->is_int || src->is_int)
        return ps_error_set(err, PS_ERR_INTERNAL,
                            "device %d: accumulating tiles of different boxes or types", device);
    ps_box_copy_host(src, dst, off, size, true); /* a half tile rounds each sum */
    return PS_OK;
}

/* A half tile keeps the runtime's path, whose sum is rounded as a half add
 * of the rounded result; an fp32 one takes the op's own sum (inputs may
 * still be half: half_op widens them and leaves an fp32 output as it is). */
static bool cpu_op_accumulates(ps_backend *b, const ps_op *op, int out, const ps_tile *t)
{
    (void)b;
    return !ps_tile_is_half(t) && !t->is_int && ps_cpu_op_accumulates(op->kind, out);
}

static ps_status cpu_zero(ps_backend *b, int device, ps_tile *t, ps_error *err)
{
    (void)b, (void)device, (void)err;
    memset(t->data, 0, (size_t)ps_tile_numel(t) * (size_t)ps_tile_elem_bytes(t));
    return PS_OK;
}

static ps_status cpu_find_nonfinite(ps_backend *b, int device, const ps_tile *tiles, int n,
                                    bool *found, ps_error *err)
{
    (void)b;
    *found = false;
    for (int i = 0; i < n && !*found; i++) {
        const ps_tile *t = &tiles[i];
        int64_t count = ps_tile_numel(t);
        if (t->is_int)
            return ps_error_set(err, PS_ERR_INTERNAL,
                                "device %d: looking for inf and NaN in an integer tile", device);
        if (ps_tile_is_half(t)) {
            *found = ps_half_find_nonfinite(t->dtype, t->data, count) >= 0;
            continue;
        }
        const float *x = t->data;
        for (int64_t e = 0; e < count && !*found; e++)
            *found = !isfinite(x[e]);
    }
    return PS_OK;
}

static ps_status cpu_copy_box(ps_backend *b, int device, const ps_tile *src, ps_tile *dst,
                              ps_error *err)
{
    (void)b;
    int64_t so[PS_MAX_RANK], ss[PS_MAX_RANK], dof[PS_MAX_RANK], ds[PS_MAX_RANK],
        o[PS_MAX_RANK], s[PS_MAX_RANK];
    ps_tile_box(src, so, ss);
    ps_tile_box(dst, dof, ds);
    if (src->rank != dst->rank || ps_tile_elem_bytes(src) != ps_tile_elem_bytes(dst))
        return ps_error_set(err, PS_ERR_INTERNAL,
                            "device %d: copy between ranks %d and %d or element types", device,
                            src->rank, dst->rank);
    if (!ps_box_intersect(dst->rank, so, ss, dof, ds, o, s) ||
        ps_box_numel(dst->rank, s) != ps_tile_numel(dst))
        return ps_error_set(err, PS_ERR_INTERNAL,
                            "device %d: re-layout source does not cover the destination tile",
                            device);
    ps_box_copy_host(src, dst, o, s, false);
    return PS_OK;
}

/* ---- rendezvous ---- */

static ps_status aborted_error(int device, ps_error *err)
{
    return ps_error_set(err, PS_ERR_DEVICE, "device %d: stopped because another device failed",
                        device);
}

static ps_status rdv_get(cpu_backend *c, const ps_exec_group *g, rendezvous **out,
                         ps_error *err)
{
    /* under c->mu */
    if (g->id >= c->n_rdv) {
        int n = g->id + 16;
        rendezvous **r = realloc(c->rdv, (size_t)n * sizeof *r);
        if (r == NULL)
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        memset(r + c->n_rdv, 0, (size_t)(n - c->n_rdv) * sizeof *r);
        c->rdv = r;
        c->n_rdv = n;
    }
    rendezvous *r = c->rdv[g->id];
    if (r == NULL) {
        r = calloc(1, sizeof *r);
        if (r != NULL) {
            r->n = g->n;
            r->copy = calloc((size_t)g->n, sizeof *r->copy);
            r->geo = calloc((size_t)g->n, sizeof *r->geo);
            r->count = calloc((size_t)g->n, sizeof *r->count);
        }
        if (r == NULL || r->copy == NULL || r->geo == NULL || r->count == NULL) {
            if (r != NULL) {
                free(r->copy);
                free(r->geo);
                free(r->count);
            }
            free(r);
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        }
        pthread_cond_init(&r->cv, NULL);
        c->rdv[g->id] = r;
    }
    *out = r;
    return PS_OK;
}

/* Posts this member's copy and waits for the round to open. */
static ps_status rdv_enter(cpu_backend *c, int device, const ps_exec_group *g, int kind,
                           void *copy, const ps_tile *geo, int64_t count, rendezvous **out,
                           ps_error *err)
{
    ps_status st = PS_OK;
    bool posted = false;
    pthread_mutex_lock(&c->mu);
    rendezvous *r = NULL;
    if ((st = rdv_get(c, g, &r, err)) != PS_OK)
        goto out;
    while (r->open && !c->aborted) /* the previous round is still being read */
        pthread_cond_wait(&r->cv, &c->mu);
    if (c->aborted) {
        st = aborted_error(device, err);
        goto out;
    }
    if (r->arrived > 0 && r->kind != kind) {
        st = ps_error_set(err, PS_ERR_INTERNAL,
                          "device %d: members of group %d entered different collectives",
                          device, g->id);
        goto out;
    }
    r->kind = kind;
    r->copy[g->rank] = copy; /* owned by the round (or the backend, if it never opens) */
    posted = true;
    if (geo != NULL)
        r->geo[g->rank] = *geo;
    r->count[g->rank] = count;
    if (++r->arrived == r->n) {
        r->open = true;
        pthread_cond_broadcast(&r->cv);
    }
    while (!r->open && !c->aborted)
        pthread_cond_wait(&r->cv, &c->mu);
    if (c->aborted && !r->open)
        st = aborted_error(device, err);
    *out = r;
out:
    pthread_mutex_unlock(&c->mu);
    if (st != PS_OK && !posted)
        free(copy);
    return st;
}

static void rdv_leave(cpu_backend *c, rendezvous *r)
{
    pthread_mutex_lock(&c->mu);
    if (++r->done == r->n) {
        for (int i = 0; i < r->n; i++) {
            free(r->copy[i]);
            r->copy[i] = NULL;
        }
        r->arrived = r->done = 0;
        r->open = false;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- collectives ---- */

static ps_status cpu_collective(ps_backend *b, int device, const ps_exec_group *g,
                                ps_collective kind, const ps_tile *src, ps_tile *dst,
                                ps_error *err)
{
    cpu_backend *c = cb(b);
    if (src->rank != dst->rank || src->dtype != dst->dtype)
        return ps_error_set(err, PS_ERR_INTERNAL,
                            "device %d: collective between ranks %d and %d or element types",
                            device, src->rank, dst->rank);
    /* Half tiles travel and combine widened: sums in fp32 in member order,
     * rounded once into dst. */
    cpu_device *d = &c->dev[device];
    ps_tile fsrc, fdst;
    float *own_src = NULL;
    ps_status st = widen_owned(device, src, &fsrc, &own_src, err);
    if (st == PS_OK)
        st = scratch_reserve(d, device, scratch_floats(dst), err);
    if (st == PS_OK) {
        float *next = d->scratch;
        widen_tile(dst, false, &fdst, &next);
    }
    int64_t n = ps_tile_numel(src);
    if (st == PS_OK && !ps_group_is_local(c->mail, g)) {
        ps_exchange x;
        st = ps_exchange_run(c->mail, device, g, 100 + (int)kind, fsrc.data, 4, n, &fsrc, &x,
                             err);
        if (st == PS_OK)
            st = ps_combine_tiles(device, g->id, kind, g->n, x.geo, x.copy, &fdst, err);
        ps_exchange_free(&x);
    } else if (st == PS_OK) {
        /* the round owns the copy it reads; a widened source already is one */
        void *copy = own_src;
        own_src = NULL;
        if (copy == NULL) {
            copy = malloc((size_t)(n > 0 ? n : 1) * 4);
            if (copy == NULL)
                st = ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", device);
            else
                memcpy(copy, fsrc.data, (size_t)n * 4);
        }
        rendezvous *r;
        if (st == PS_OK)
            st = rdv_enter(c, device, g, 100 + (int)kind, copy, &fsrc, n, &r, err);
        if (st == PS_OK) {
            st = ps_combine_tiles(device, g->id, kind, r->n, r->geo, r->copy, &fdst, err);
            rdv_leave(c, r);
        }
    }
    if (st == PS_OK)
        narrow_tile(&fdst, dst);
    free(own_src);
    return st;
}

/* An in-place all-reduce of n values of float (dbl false) or double. */
static ps_status reduce_values(ps_backend *b, int device, const ps_exec_group *g, void *data,
                               int64_t n, ps_reduce_op op, bool dbl, ps_error *err)
{
    cpu_backend *c = cb(b);
    size_t size = dbl ? sizeof(double) : sizeof(float);
    int kind = (dbl ? 20 : 10) + (int)op;
    if (!ps_group_is_local(c->mail, g)) {
        ps_exchange x;
        ps_status st = ps_exchange_run(c->mail, device, g, kind, data, size, n, NULL, &x, err);
        void *out = st == PS_OK ? malloc((size_t)(n > 0 ? n : 1) * size) : NULL;
        if (st == PS_OK && out == NULL)
            st = ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", device);
        if (st == PS_OK)
            st = ps_combine_values(device, g->n, x.copy, x.count, out, n, op, dbl, err);
        if (st == PS_OK)
            memcpy(data, out, (size_t)n * size);
        free(out);
        ps_exchange_free(&x);
        return st;
    }
    void *copy = malloc((size_t)(n > 0 ? n : 1) * size);
    if (copy == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", device);
    memcpy(copy, data, (size_t)n * size);
    rendezvous *r;
    PS_TRY_RET(rdv_enter(c, device, g, kind, copy, NULL, n, &r, err));
    ps_status st = ps_combine_values(device, r->n, r->copy, r->count, data, n, op, dbl, err);
    rdv_leave(c, r);
    return st;
}

static ps_status cpu_reduce(ps_backend *b, int device, const ps_exec_group *g, float *data,
                            int64_t n, ps_reduce_op op, ps_error *err)
{
    return reduce_values(b, device, g, data, n, op, false, err);
}

static ps_status cpu_reduce64(ps_backend *b, int device, const ps_exec_group *g, double *data,
                              int64_t n, ps_reduce_op op, ps_error *err)
{
    return reduce_values(b, device, g, data, n, op, true, err);
}

/* ---- point to point ---- */

static ps_status cpu_send(ps_backend *b, int device, int peer, const ps_tile *src,
                          const int64_t *off, const int64_t *size, int chunk, int chunks,
                          ps_error *err)
{
    cpu_backend *c = cb(b);
    if (peer < 0 || peer >= b->n_devices)
        return ps_error_set(err, PS_ERR_INTERNAL, "device %d: send to device %d", device, peer);
    int64_t start, len;
    ps_coll_chunk(ps_box_numel(src->rank, size), chunks, chunk, &start, &len);
    void *buf = ps_mailbox_payload((size_t)len * (size_t)ps_tile_elem_bytes(src));
    if (buf == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", device);
    ps_box_pack_host(src, off, size, start, len, buf);
    return ps_mailbox_post(c->mail, device, peer, PS_HOSTS_CHANNEL_P2P, buf, err);
}

static ps_status cpu_recv(ps_backend *b, int device, int peer, ps_tile *dst, const int64_t *off,
                          const int64_t *size, int chunk, int chunks, ps_error *err)
{
    cpu_backend *c = cb(b);
    if (peer < 0 || peer >= b->n_devices)
        return ps_error_set(err, PS_ERR_INTERNAL, "device %d: receive from device %d", device,
                            peer);
    int64_t start, len;
    ps_coll_chunk(ps_box_numel(dst->rank, size), chunks, chunk, &start, &len);
    void *data, *owner;
    size_t bytes;
    PS_TRY_RET(ps_mailbox_take(c->mail, peer, device, PS_HOSTS_CHANNEL_P2P, &data, &bytes,
                               &owner, err));
    ps_status st = PS_OK;
    size_t eb = (size_t)ps_tile_elem_bytes(dst);
    if (bytes != (size_t)len * eb)
        st = ps_error_set(err, PS_ERR_INTERNAL,
                          "device %d: expected %lld values from device %d, got %lld", device,
                          (long long)len, peer, (long long)(bytes / eb));
    else
        ps_box_unpack_host(dst, off, size, start, len, data);
    free(owner);
    return st;
}

/* ---- time, memory, teardown ---- */

static ps_status cpu_mark(ps_backend *b, int device, int slot, ps_error *err)
{
    cpu_device *d = &cb(b)->dev[device];
    if (slot < 0 || slot >= d->n_slots)
        return ps_error_set(err, PS_ERR_INTERNAL, "device %d: timing slot %d of %d", device,
                            slot, d->n_slots);
    d->stamp[slot] = ps_monotonic_s();
    return PS_OK;
}

static ps_status cpu_finish(ps_backend *b, int device, ps_error *err)
{
    (void)b, (void)device, (void)err;
    return PS_OK;
}

static ps_status cpu_elapsed(ps_backend *b, int device, int a, int z, double *seconds,
                             ps_error *err)
{
    cpu_device *d = &cb(b)->dev[device];
    if (a < 0 || z < 0 || a >= d->n_slots || z >= d->n_slots)
        return ps_error_set(err, PS_ERR_INTERNAL, "device %d: timing slots %d..%d", device, a,
                            z);
    *seconds = d->stamp[z] - d->stamp[a];
    return PS_OK;
}

static ps_status cpu_stamp_host_s(ps_backend *b, int device, int slot, double *host_s,
                                  ps_error *err)
{
    cpu_device *d = &cb(b)->dev[device];
    if (slot < 0 || slot >= d->n_slots)
        return ps_error_set(err, PS_ERR_INTERNAL, "device %d: timing slot %d of %d", device,
                            slot, d->n_slots);
    *host_s = d->stamp[slot];
    return PS_OK;
}

static int64_t cpu_peak(ps_backend *b, int device) { return cb(b)->dev[device].peak; }

/* Every device of this process is host memory: their needs add up. */
static ps_status cpu_check_memory(ps_backend *b, const int64_t *need, ps_error *err)
{
    cpu_backend *c = cb(b);
    int64_t total = 0, most = -1;
    int n = 0, at = -1;
    for (int d = 0; d < b->n_devices; d++) {
        if (need[d] <= 0)
            continue;
        total += need[d];
        n++;
        if (need[d] > most) {
            most = need[d];
            at = d;
        }
    }
    int64_t have = c->host_memory >= 0 ? c->host_memory : ps_host_memory_available();
    if (have < 0 || total <= have)
        return PS_OK;
    char t[32], m[32], h[32];
    return ps_error_set(err, PS_ERR_NOMEM,
                        "the plan's %d CPU device%s %s %s of tiles at the peak of a step "
                        "(device %d the most: %s), more than the %s of host memory %s: all "
                        "of them are this host's memory (run a smaller model, batch or "
                        "micro-batch, or pass --no-memory-check to try anyway)",
                        n, n == 1 ? "" : "s", n == 1 ? "holds" : "hold",
                        ps_bytes_text((double)total, t, sizeof t), at,
                        ps_bytes_text((double)most, m, sizeof m),
                        ps_bytes_text((double)have, h, sizeof h),
                        c->host_memory >= 0 ? "allowed" : "available");
}

void ps_cpu_backend_set_host_memory(ps_backend *b, int64_t bytes)
{
    cb(b)->host_memory = bytes >= 0 ? bytes : -1;
}

static void cpu_abort(ps_backend *b)
{
    cpu_backend *c = cb(b);
    pthread_mutex_lock(&c->mu);
    c->aborted = true;
    for (int i = 0; i < c->n_rdv; i++)
        if (c->rdv[i] != NULL)
            pthread_cond_broadcast(&c->rdv[i]->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->mail != NULL)
        ps_mailbox_abort(c->mail);
}

static void cpu_destroy(ps_backend *b)
{
    cpu_backend *c = cb(b);
    if (c == NULL)
        return;
    int n = b->n_devices;
    ps_mailbox_destroy(c->mail);
    for (int i = 0; i < c->n_rdv; i++)
        if (c->rdv[i] != NULL) {
            for (int m = 0; m < c->rdv[i]->n; m++)
                free(c->rdv[i]->copy[m]);
            free(c->rdv[i]->copy);
            free(c->rdv[i]->geo);
            free(c->rdv[i]->count);
            pthread_cond_destroy(&c->rdv[i]->cv);
            free(c->rdv[i]);
        }
    free(c->rdv);
    if (c->dev != NULL)
        for (int i = 0; i < n; i++) {
            free(c->dev[i].stamp);
            for (int k = 0; k < c->dev[i].n_pool; k++)
                free(c->dev[i].pool[k]);
            free(c->dev[i].pool);
            free(c->dev[i].scratch);
        }
    free(c->dev);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static const ps_backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_upload,
    .download = cpu_upload, /* host both ways */
    .op = cpu_op,
    .accumulate = cpu_accumulate,
    .zero = cpu_zero,
    .copy_box = cpu_copy_box,
    .collective = cpu_collective,
    .reduce = cpu_reduce,
    .reduce64 = cpu_reduce64,
    .send = cpu_send,
    .recv = cpu_recv,
    .mark = cpu_mark,
    .finish = cpu_finish,
    .elapsed = cpu_elapsed,
    .peak_bytes = cpu_peak,
    .abort = cpu_abort,
    .destroy = cpu_destroy,
    .find_nonfinite = cpu_find_nonfinite,
    .op_accumulates = cpu_op_accumulates,
    .check_memory = cpu_check_memory,
    .stamp_host_s = cpu_stamp_host_s,
};

ps_status ps_cpu_backend_create(int n_devices, const int *slots, ps_hosts *hosts,
                                ps_backend **out, ps_error *err)
{
    *out = NULL;
    if (n_devices < 1)
        return ps_error_set(err, PS_ERR_INVALID, "a backend needs at least one device");
    cpu_backend *c = calloc(1, sizeof *c);
    if (c == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    c->base.ops = &cpu_ops;
    c->base.n_devices = n_devices;
    c->base.half_storage = true;
    c->host_memory = -1;
    pthread_mutex_init(&c->mu, NULL);
    c->dev = calloc((size_t)n_devices, sizeof *c->dev);
    bool ok = c->dev != NULL && ps_mailbox_create(n_devices, hosts, &c->mail, err) == PS_OK;
    for (int i = 0; ok && i < n_devices; i++) {
        c->dev[i].n_slots = slots != NULL ? slots[i] : 0;
        c->dev[i].stamp = calloc((size_t)(c->dev[i].n_slots > 0 ? c->dev[i].n_slots : 1),
                                 sizeof *c->dev[i].stamp);
        ok = c->dev[i].stamp != NULL;
    }
    if (!ok) {
        cpu_destroy(&c->base);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    if (openblas_set_num_threads != NULL)
        openblas_set_num_threads(1);
    *out = &c->base;
    return PS_OK;
}
