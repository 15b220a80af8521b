/* The CUDA backend's transfers to and from devices of other processes,
 * staged through host memory (see cuda_remote.cuh). */
#include <stdlib.h>
#include <string.h>

#include "exec/cuda/cuda_remote.cuh"

extern "C" {
#include "exec/half.h"
#include "exec/host_collective.h"
}

/* Exchange kinds, checked across members: a collective combined on the
 * host (as the CPU backend numbers them), a reduction, NCCL metadata. */
enum {
    KIND_COLLECTIVE = 100,
    KIND_REDUCE = 10,
    KIND_REDUCE64 = 20, /* doubles (reduce64) */
    KIND_BOXES = 200,
    KIND_COUNTS = 210,
    KIND_ID = 300,
};

/* What precedes a sent chunk. */
typedef struct chunk_header {
    int64_t len;   /* elements */
    int32_t dtype; /* of the sent tile (ps_dtype) */
    int32_t pad;
} chunk_header;

static ps_status host_nomem(int device, ps_error *err)
{
    return ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", device);
}

ps_status ps_cuda_remote_send(ps_mailbox *mb, ps_cuda_stream *s, int peer, const ps_tile *src,
                              const int64_t *box_offset, const int64_t *box_size, int64_t start,
                              int64_t len, void *staging, ps_error *err)
{
    size_t bytes = (size_t)len * (size_t)ps_tile_elem_bytes(src);
    char *buf = (char *)ps_mailbox_payload(sizeof(chunk_header) + bytes);
    if (buf == NULL)
        return host_nomem(s->loc.device, err);
    chunk_header h;
    memset(&h, 0, sizeof h);
    h.len = len;
    h.dtype = (int32_t)src->dtype;
    memcpy(buf, &h, sizeof h);
    ps_status st = PS_OK;
    if (len > 0) {
        st = ps_cuda_box_pack(s, src, box_offset, box_size, start, len, staging, true, err);
        cudaError_t e = cudaSuccess;
        if (st == PS_OK &&
            (e = cudaMemcpyAsync(buf + sizeof h, staging, bytes, cudaMemcpyDeviceToHost,
                                 s->stream)) != cudaSuccess)
            st = ps_cuda_fail(s->loc, e, "cudaMemcpyAsync", err);
        if (st == PS_OK && (e = cudaStreamSynchronize(s->stream)) != cudaSuccess)
            st = ps_cuda_fail(s->loc, e, "cudaStreamSynchronize", err);
    }
    if (st != PS_OK) {
        ps_mailbox_discard(buf);
        return st;
    }
    return ps_mailbox_post(mb, s->loc.device, peer, PS_HOSTS_CHANNEL_P2P, buf, err);
}

ps_status ps_cuda_remote_recv(ps_mailbox *mb, ps_cuda_stream *s, int peer, ps_tile *dst,
                              const int64_t *box_offset, const int64_t *box_size, int64_t start,
                              int64_t len, void *staging, ps_error *err)
{
    int device = s->loc.device;
    void *data, *owner;
    size_t bytes;
    PS_TRY_RET(ps_mailbox_take(mb, peer, device, PS_HOSTS_CHANNEL_P2P, &data, &bytes, &owner,
                               err));
    ps_status st = PS_OK;
    chunk_header h;
    size_t eb = (size_t)ps_tile_elem_bytes(dst);
    if (bytes < sizeof h) {
        st = ps_error_set(err, PS_ERR_INVALID, "device %d: a short message from device %d",
                          device, peer);
    } else {
        memcpy(&h, data, sizeof h);
        bool half_pair = ps_half_dtype((ps_dtype)h.dtype) || ps_tile_is_half(dst);
        if (half_pair && (ps_dtype)h.dtype != dst->dtype)
            st = ps_error_set(err, PS_ERR_INVALID,
                              "device %d: message from device %d holds %s, the receive expects "
                              "%s",
                              device, peer, ps_dtype_name((ps_dtype)h.dtype),
                              ps_dtype_name(dst->dtype));
        else if (h.len != len || bytes != sizeof h + (size_t)h.len * eb)
            st = ps_error_set(err, PS_ERR_INVALID,
                              "device %d: message from device %d has %lld elements, the "
                              "receive expects %lld",
                              device, peer, (long long)h.len, (long long)len);
    }
    if (st == PS_OK && len > 0) {
        cudaError_t e = cudaMemcpyAsync(staging, (char *)data + sizeof h, (size_t)len * eb,
                                        cudaMemcpyHostToDevice, s->stream);
        if (e != cudaSuccess)
            st = ps_cuda_fail(s->loc, e, "cudaMemcpyAsync", err);
        if (st == PS_OK)
            st = ps_cuda_box_pack(s, dst, box_offset, box_size, start, len, staging, false, err);
        /* the host copy must outlive the transfer */
        if (st == PS_OK && (e = cudaStreamSynchronize(s->stream)) != cudaSuccess)
            st = ps_cuda_fail(s->loc, e, "cudaStreamSynchronize", err);
    }
    free(owner);
    return st;
}

/* n elements of `size` bytes (4: float, 8: double) between device and a
 * malloc'd host copy. */
static ps_status to_host_sized(ps_cuda_stream *s, const void *src, int64_t n, size_t size,
                               void **out, ps_error *err)
{
    *out = malloc((size_t)(n > 0 ? n : 1) * size);
    if (*out == NULL)
        return host_nomem(s->loc.device, err);
    if (n > 0) {
        PS_CUDA_RET(s->loc, cudaMemcpyAsync(*out, src, (size_t)n * size, cudaMemcpyDeviceToHost,
                                            s->stream));
        PS_CUDA_RET(s->loc, cudaStreamSynchronize(s->stream));
    }
    return PS_OK;
}

static ps_status to_device_sized(ps_cuda_stream *s, void *dst, const void *host, int64_t n,
                                 size_t size, ps_error *err)
{
    if (n > 0) {
        PS_CUDA_RET(s->loc, cudaMemcpyAsync(dst, host, (size_t)n * size, cudaMemcpyHostToDevice,
                                            s->stream));
        PS_CUDA_RET(s->loc, cudaStreamSynchronize(s->stream));
    }
    return PS_OK;
}

static ps_status to_host(ps_cuda_stream *s, const void *src, int64_t n, float **out,
                         ps_error *err)
{
    void *p = NULL;
    ps_status st = to_host_sized(s, src, n, 4, &p, err);
    *out = (float *)p;
    return st;
}

static ps_status to_device(ps_cuda_stream *s, void *dst, const float *host, int64_t n,
                           ps_error *err)
{
    return to_device_sized(s, dst, host, n, 4, err);
}

ps_status ps_cuda_remote_collective(ps_mailbox *mb, ps_cuda_stream *s, const ps_exec_group *g,
                                    ps_collective kind, const ps_tile *src, ps_tile *dst,
                                    ps_error *err)
{
    int device = s->loc.device;
    float *mine = NULL, *out = NULL;
    ps_exchange x;
    memset(&x, 0, sizeof x);
    int64_t ns = ps_tile_numel(src), nd = ps_tile_numel(dst);
    ps_status st = to_host(s, src->data, ns, &mine, err);
    if (st == PS_OK)
        st = ps_exchange_run(mb, device, g, KIND_COLLECTIVE + (int)kind, mine, 4, ns, src, &x,
                             err);
    /* gathers start from what dst holds, as on the GPU (sums overwrite it) */
    bool sum = kind == PS_COLL_ALL_REDUCE || kind == PS_COLL_REDUCE_SCATTER;
    if (st == PS_OK && sum && (out = (float *)calloc((size_t)(nd > 0 ? nd : 1), 4)) == NULL)
        st = host_nomem(device, err);
    if (st == PS_OK && !sum)
        st = to_host(s, dst->data, nd, &out, err);
    if (st == PS_OK) {
        ps_tile h = *dst;
        h.data = out;
        st = ps_combine_tiles(device, g->id, kind, g->n, x.geo, x.copy, &h, err);
    }
    if (st == PS_OK)
        st = to_device(s, dst->data, out, nd, err);
    ps_exchange_free(&x);
    free(mine);
    free(out);
    return st;
}

ps_status ps_cuda_remote_reduce(ps_mailbox *mb, ps_cuda_stream *s, const ps_exec_group *g,
                                void *data, int64_t n, ps_reduce_op op, bool dbl, ps_error *err)
{
    int device = s->loc.device;
    size_t size = dbl ? sizeof(double) : sizeof(float);
    void *mine = NULL, *out = NULL;
    ps_exchange x;
    memset(&x, 0, sizeof x);
    ps_status st = to_host_sized(s, data, n, size, &mine, err);
    if (st == PS_OK)
        st = ps_exchange_run(mb, device, g, (dbl ? KIND_REDUCE64 : KIND_REDUCE) + (int)op, mine,
                             size, n, NULL, &x, err);
    if (st == PS_OK && (out = malloc((size_t)(n > 0 ? n : 1) * size)) == NULL)
        st = host_nomem(device, err);
    if (st == PS_OK)
        st = ps_combine_values(device, g->n, x.copy, x.count, out, n, op, dbl, err);
    if (st == PS_OK)
        st = to_device_sized(s, data, out, n, size, err);
    ps_exchange_free(&x);
    free(mine);
    free(out);
    return st;
}

ps_status ps_cuda_remote_boxes(ps_mailbox *mb, int device, const ps_exec_group *g, int kind,
                               const ps_tile *src, const ps_tile *dst, ps_tile *srcs,
                               ps_tile *dsts, ps_error *err)
{
    /* src's geometry rides in the exchange's header, dst's as its data */
    ps_tile d = *dst;
    d.data = NULL;
    ps_exchange x;
    PS_TRY_RET(ps_exchange_run(mb, device, g, KIND_BOXES + kind, &d, sizeof d, 1, src, &x, err));
    for (int m = 0; m < g->n; m++) {
        srcs[m] = x.geo[m];
        memcpy(&dsts[m], x.copy[m], sizeof dsts[m]);
        dsts[m].data = NULL;
    }
    ps_exchange_free(&x);
    return PS_OK;
}

ps_status ps_cuda_remote_counts(ps_mailbox *mb, int device, const ps_exec_group *g, int kind,
                                int64_t n, int64_t *counts, ps_error *err)
{
    ps_exchange x;
    PS_TRY_RET(ps_exchange_run(mb, device, g, KIND_COUNTS + kind, NULL, 0, n, NULL, &x, err));
    memcpy(counts, x.count, (size_t)g->n * sizeof *counts);
    ps_exchange_free(&x);
    return PS_OK;
}

/* What member 0 sends each other member: the group and the id's size, then the id. */
typedef struct id_header {
    int32_t kind, group;
    int64_t bytes;
} id_header;

ps_status ps_cuda_remote_share_id(ps_mailbox *mb, int device, const ps_exec_group *g, void *id,
                                  size_t bytes, ps_error *err)
{
    id_header h;
    memset(&h, 0, sizeof h);
    h.kind = KIND_ID;
    h.group = g->id;
    h.bytes = (int64_t)bytes;
    if (g->rank == 0) {
        for (int m = 1; m < g->n; m++) {
            char *buf = (char *)ps_mailbox_payload(sizeof h + bytes);
            if (buf == NULL)
                return host_nomem(device, err);
            memcpy(buf, &h, sizeof h);
            memcpy(buf + sizeof h, id, bytes);
            PS_TRY_RET(ps_mailbox_post(mb, device, g->devices[m], PS_HOSTS_CHANNEL_COLLECTIVE,
                                       buf, err));
        }
        return PS_OK;
    }
    void *data, *owner;
    size_t got;
    PS_TRY_RET(ps_mailbox_take(mb, g->devices[0], device, PS_HOSTS_CHANNEL_COLLECTIVE, &data,
                               &got, &owner, err));
    id_header in;
    ps_status st = PS_OK;
    if (got != sizeof in + bytes)
        st = ps_error_set(err, PS_ERR_INTERNAL,
                          "device %d: members of group %d entered different collectives "
                          "(device %d sent %zu bytes where a communicator id was due)",
                          device, g->id, g->devices[0], got);
    if (st == PS_OK) {
        memcpy(&in, data, sizeof in);
        if (in.kind != KIND_ID || in.group != g->id || in.bytes != (int64_t)bytes)
            st = ps_error_set(err, PS_ERR_INTERNAL,
                              "device %d: members of group %d entered different collectives "
                              "(device %d sent no communicator id)",
                              device, g->id, g->devices[0]);
        else
            memcpy(id, (char *)data + sizeof in, bytes);
    }
    free(owner);
    return st;
}
