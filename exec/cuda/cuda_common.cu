/* exec/cuda: error messages, the GPU probe, stream contexts and the box
 * kernels (box copy, pack/unpack, combine) shared by the ops and the
 * backend. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/cuda/cuda_internal.cuh"

/* ---- errors --------------------------------------------------------------- */

/* The function name of a call's source text ("cudaMalloc(&p, n)" ->
 * "cudaMalloc"). */
static int call_name_len(const char *call)
{
    int n = 0;
    while (call[n] != '\0' && call[n] != '(' && call[n] != ' ')
        n++;
    return n;
}

static void loc_str(ps_cuda_loc loc, char *buf, size_t cap)
{
    if (loc.device >= 0)
        snprintf(buf, cap, "device %d (GPU %d)", loc.device, loc.gpu);
    else
        snprintf(buf, cap, "GPU %d", loc.gpu);
}

ps_status ps_cuda_fail(ps_cuda_loc loc, cudaError_t e, const char *call, ps_error *err)
{
    char where[64];
    loc_str(loc, where, sizeof where);
    /* clear a non-sticky error so that later calls report their own */
    (void)cudaGetLastError();
    return ps_error_set(err, PS_ERR_DEVICE, "%s: %.*s failed: %s (%s)", where,
                        call_name_len(call), call, cudaGetErrorString(e), cudaGetErrorName(e));
}

ps_status ps_cublas_fail(ps_cuda_loc loc, cublasStatus_t e, const char *call, ps_error *err)
{
    char where[64];
    loc_str(loc, where, sizeof where);
    return ps_error_set(err, PS_ERR_DEVICE, "%s: %.*s failed: %s (%s)", where,
                        call_name_len(call), call, cublasGetStatusString(e),
                        cublasGetStatusName(e));
}

ps_status ps_cuda_op_error(const ps_cuda_stream *s, const ps_op *op, ps_status code,
                           ps_error *err, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const ps_op_kind_info *info = ps_op_kind_get(op->kind);
    return ps_error_set(err, code, "device %d: op \"%s\" (%s): %s", s->loc.device,
                        op->name ? op->name : "?", info ? info->name : "?", what);
}

ps_status ps_cuda_read_flag(ps_cuda_stream *s, const int *flag_dev, int flag[2], ps_error *err)
{
    PS_CUDA_RET(s->loc, cudaMemcpyAsync(flag, flag_dev, 2 * sizeof(int),
                                        cudaMemcpyDeviceToHost, s->stream));
    PS_CUDA_RET(s->loc, cudaStreamSynchronize(s->stream));
    return PS_OK;
}

/* ---- probe ------------------------------------------------------------------ */

int ps_cuda_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* 35 (insufficient driver), 100 (no device) and anything else: no GPU */
        (void)cudaGetLastError();
        return 0;
    }
    return n > 0 ? n : 0;
}

double ps_cuda_device_memory_bytes(int gpu)
{
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, gpu) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return (double)prop.totalGlobalMem;
}

double ps_cuda_device_free_bytes(int gpu)
{
    size_t free_bytes = 0, total = 0;
    if (cudaSetDevice(gpu) != cudaSuccess || cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return (double)free_bytes;
}

/* ---- streams ---------------------------------------------------------------- */

/* Full fp32 or TF32 tensor cores; half GEMMs accumulate in fp32 and round
 * once: no split-K partial sums rounded to the output type (cuBLAS's
 * reduced-precision reduction). */
static cublasMath_t math_mode(bool tf32)
{
    unsigned m = tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
    return (cublasMath_t)(m | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
}

static void checks_forget(ps_cuda_stream *s);

ps_status ps_cuda_stream_create(int device, int gpu, const ps_cuda_stream_options *opt,
                                ps_cuda_stream **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_cuda_loc loc = {device, gpu};
    ps_cuda_stream *s = (ps_cuda_stream *)calloc(1, sizeof *s);
    *out = NULL;
    if (s == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    s->loc = loc;
    s->allow_tf32 = opt != NULL && opt->allow_tf32;
    PS_CUDA_TRY(loc, cudaSetDevice(gpu));
    PS_CUDA_TRY(loc, cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    PS_CUBLAS_TRY(loc, cublasCreate(&s->blas));
    PS_CUBLAS_TRY(loc, cublasSetStream(s->blas, s->stream));
    PS_CUBLAS_TRY(loc, cublasSetMathMode(s->blas, math_mode(s->allow_tf32)));
    *out = s;
    s = NULL;
out:
    ps_cuda_stream_free(s);
    return st;
}

void ps_cuda_stream_free(ps_cuda_stream *s)
{
    if (s == NULL)
        return;
    /* teardown: errors cannot be reported, the memory is released anyway */
    (void)cudaSetDevice(s->loc.gpu);
    if (s->stream != NULL)
        (void)cudaStreamSynchronize(s->stream);
    if (s->blas != NULL)
        (void)cublasDestroy(s->blas);
#if PS_HAVE_CUDNN
    if (s->dnn != NULL)
        (void)cudnnDestroy(s->dnn);
    free(s->conv_algos);
#endif
    if (s->ws != NULL)
        (void)ps_cuda_free(s, s->ws);
    if (s->half_ws != NULL)
        (void)ps_cuda_free(s, s->half_ws);
    if (s->blas_ws != NULL) /* after cublasDestroy, its only user */
        (void)ps_cuda_free(s, s->blas_ws);
    checks_forget(s);
    if (s->checks_dev != NULL)
        (void)ps_cuda_free(s, s->checks_dev);
    free(s->checks_host);
    free(s->checks);
    if (s->stream != NULL)
        (void)cudaStreamDestroy(s->stream);
    (void)cudaGetLastError();
    free(s);
}

/* ---- deferred checks ------------------------------------------------------------ */

/* What a deferred check says when flagged (the op's name copied: the op may
 * be a caller's temporary). */
typedef struct ps_cuda_pending_check {
    ps_cuda_check check; /* op NULL */
    char *op_name;
    ps_op_kind op_kind;
} ps_cuda_pending_check;

static void checks_forget(ps_cuda_stream *s)
{
    for (int i = 0; i < s->n_checks; i++)
        free(s->checks[i].op_name);
    s->n_checks = 0;
}

/* The message of a flagged check, as the op would have given it at once. */
static ps_status check_failed(const ps_cuda_stream *s, const ps_cuda_pending_check *p,
                              const int *slot, ps_error *err)
{
    ps_op op;
    memset(&op, 0, sizeof op);
    op.name = p->op_name;
    op.kind = p->op_kind;
    const ps_cuda_check *c = &p->check;
    switch (c->kind) {
    case PS_CUDA_CHECK_ID:
    case PS_CUDA_CHECK_LABEL:
        return ps_cuda_op_error(s, &op, PS_ERR_INVALID, err,
                                "%s %d is outside the vocabulary of %lld",
                                c->kind == PS_CUDA_CHECK_ID ? "id" : "label", slot[1],
                                (long long)c->vocab);
    case PS_CUDA_CHECK_GRADIENT: {
        unsigned long long key;
        memcpy(&key, slot + 2, sizeof key);
        long long at = (long long)~key;
        const char *what = slot[1] == 1 ? "NaN" : slot[1] == 2 ? "inf" : "-inf";
        if (c->scale > 1)
            return ps_cuda_op_error(s, &op, PS_ERR_INVALID, err,
                                    "the gradient holds %s at element %lld of this tile at step "
                                    "%d: the loss scale %g overflowed it (lower --loss-scale)",
                                    what, at, c->step, c->scale);
        return ps_cuda_op_error(s, &op, PS_ERR_INVALID, err,
                                "the gradient holds %s at element %lld of this tile at step %d "
                                "(the step diverged)",
                                what, at, c->step);
    }
    }
    return ps_cuda_op_error(s, &op, PS_ERR_INTERNAL, err, "a check of unknown kind %d",
                            (int)c->kind);
}

/* Reads every slot issued since the last answer (a copy on the stream, after
 * its work), zeroes them for reuse, and keeps the first flagged one's message
 * unless an earlier one is kept already. */
static ps_status checks_answer(ps_cuda_stream *s, ps_error *err)
{
    if (s->n_checks == 0)
        return PS_OK;
    size_t bytes = (size_t)s->n_checks * PS_CUDA_CHECK_INTS * sizeof(int);
    const char *call = "cudaMemcpyAsync";
    cudaError_t e = cudaMemcpyAsync(s->checks_host, s->checks_dev, bytes,
                                    cudaMemcpyDeviceToHost, s->stream);
    if (e == cudaSuccess) {
        call = "cudaMemsetAsync";
        e = cudaMemsetAsync(s->checks_dev, 0, bytes, s->stream);
    }
    if (e == cudaSuccess) {
        call = "cudaStreamSynchronize";
        e = cudaStreamSynchronize(s->stream);
    }
    if (e != cudaSuccess) {
        /* the slots' contents are unknown: the next check starts a fresh array */
        checks_forget(s);
        (void)ps_cuda_free(s, s->checks_dev);
        s->checks_dev = NULL;
        return ps_cuda_fail(s->loc, e, call, err);
    }
    for (int i = 0; i < s->n_checks && !s->failed; i++) {
        const int *slot = s->checks_host + (size_t)i * PS_CUDA_CHECK_INTS;
        if (slot[0] != 0) {
            ps_error_clear(&s->failure);
            (void)check_failed(s, &s->checks[i], slot, &s->failure);
            s->failed = true;
        }
    }
    checks_forget(s);
    return PS_OK;
}

ps_status ps_cuda_check_defer(ps_cuda_stream *s, const ps_cuda_check *c, int **slot_dev,
                              ps_error *err)
{
    const size_t slot_bytes = PS_CUDA_CHECK_INTS * sizeof(int);
    if (s->checks_dev == NULL) {
        if (s->checks_host == NULL)
            s->checks_host = (int *)malloc(PS_CUDA_CHECK_SLOTS * slot_bytes);
        if (s->checks == NULL)
            s->checks = (ps_cuda_pending_check *)calloc(PS_CUDA_CHECK_SLOTS, sizeof *s->checks);
        if (s->checks_host == NULL || s->checks == NULL)
            return ps_error_set(err, PS_ERR_NOMEM, "out of host memory");
        PS_CUDA_RET(s->loc,
                    ps_cuda_malloc(s, (void **)&s->checks_dev, PS_CUDA_CHECK_SLOTS * slot_bytes));
        cudaError_t e = cudaMemsetAsync(s->checks_dev, 0, PS_CUDA_CHECK_SLOTS * slot_bytes,
                                        s->stream);
        if (e != cudaSuccess) { /* never hand out slots that were not zeroed */
            (void)ps_cuda_free(s, s->checks_dev);
            s->checks_dev = NULL;
            return ps_cuda_fail(s->loc, e, "cudaMemsetAsync", err);
        }
    }
    if (s->n_checks == PS_CUDA_CHECK_SLOTS) /* its copy waits for the stream's work */
        PS_RET(checks_answer(s, err));
    ps_cuda_pending_check *p = &s->checks[s->n_checks];
    const char *name = c->op != NULL && c->op->name != NULL ? c->op->name : "?";
    p->op_name = strdup(name);
    if (p->op_name == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of host memory");
    p->op_kind = c->op != NULL ? c->op->kind : (ps_op_kind)0;
    p->check = *c;
    p->check.op = NULL;
    *slot_dev = s->checks_dev + (size_t)s->n_checks * PS_CUDA_CHECK_INTS;
    s->n_checks++;
    return PS_OK;
}

ps_status ps_cuda_stream_sync(ps_cuda_stream *s, ps_error *err)
{
    cudaError_t e = cudaSetDevice(s->loc.gpu);
    const char *call = "cudaSetDevice";
    if (e == cudaSuccess) {
        e = cudaStreamSynchronize(s->stream);
        call = "cudaStreamSynchronize";
    }
    ps_status st = e == cudaSuccess ? checks_answer(s, err) : ps_cuda_fail(s->loc, e, call, err);
    bool failed = s->failed;
    s->failed = false; /* reported once, and never after the device's own error */
    if (st != PS_OK || !failed)
        return st;
    return ps_error_set(err, s->failure.status, "%s", s->failure.msg);
}

/* cudaMalloc through the launch gate (cuda_internal.cuh). */
static cudaError_t gated_malloc(ps_cuda_stream *s, void **p, size_t bytes)
{
    ps_launch_gate_mem_enter(s->gate);
    cudaError_t e = cudaMalloc(p, bytes);
    ps_launch_gate_mem_exit(s->gate);
    return e;
}

cudaError_t ps_cuda_malloc(ps_cuda_stream *s, void **p, size_t bytes)
{
    cudaError_t e = gated_malloc(s, p, bytes);
    if (e != cudaErrorMemoryAllocation || s->reclaim == NULL || s->reclaim_off)
        return e;
    (void)cudaGetLastError();
    if (!s->reclaim(s->reclaim_arg))
        return e;
    (void)cudaSetDevice(s->loc.gpu);
    return gated_malloc(s, p, bytes);
}

cudaError_t ps_cuda_free(ps_cuda_stream *s, void *p)
{
    ps_launch_gate_mem_enter(s->gate);
    cudaError_t e = cudaFree(p);
    ps_launch_gate_mem_exit(s->gate);
    return e;
}

ps_status ps_cuda_stream_own_blas_workspace(ps_cuda_stream *s, ps_error *err)
{
    if (s->blas_ws != NULL)
        return PS_OK;
    PS_CUDA_RET(s->loc, cudaSetDevice(s->loc.gpu));
    int major = 0;
    PS_CUDA_RET(s->loc,
                cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, s->loc.gpu));
    size_t bytes = (size_t)(major >= 9 ? 32 : 4) << 20;
    PS_CUDA_RET(s->loc, ps_cuda_malloc(s, &s->blas_ws, bytes));
    cublasStatus_t e = cublasSetWorkspace(s->blas, s->blas_ws, bytes);
    if (e != CUBLAS_STATUS_SUCCESS) {
        (void)ps_cuda_free(s, s->blas_ws);
        s->blas_ws = NULL;
        return ps_cublas_fail(s->loc, e, "cublasSetWorkspace", err);
    }
    return PS_OK;
}

ps_status ps_cuda_buffer_reserve(ps_cuda_stream *s, void **buf, size_t *cap, size_t bytes,
                                 void **out, ps_error *err)
{
    if (bytes <= *cap && *buf != NULL) {
        *out = *buf;
        return PS_OK;
    }
    /* grown by half again at least: each growth waits for the stream */
    size_t want = *cap + *cap / 2;
    if (want < bytes)
        want = bytes;
    want = (want + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    if (want == 0)
        want = (size_t)1 << 20;
    if (*buf != NULL && s->reclaim_off) {
        /* a preference (a faster cuDNN algorithm's workspace): the larger
         * buffer beside the one held, which stays when the GPU has no room,
         * rather than a free and a new allocation at every call */
        void *grown = NULL;
        cudaError_t e = gated_malloc(s, &grown, bytes);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return ps_error_set(err, PS_ERR_NOMEM,
                                "device %d (GPU %d): no room for a %zu-byte buffer", s->loc.device,
                                s->loc.gpu, bytes);
        }
        if (e != cudaSuccess)
            return ps_cuda_fail(s->loc, e, "cudaMalloc", err);
        cudaError_t f = cudaStreamSynchronize(s->stream); /* earlier work may read the old */
        if (f != cudaSuccess) { /* the old one stays, as a failed growth leaves it */
            (void)ps_cuda_free(s, grown);
            return ps_cuda_fail(s->loc, f, "cudaStreamSynchronize", err);
        }
        f = ps_cuda_free(s, *buf);
        *buf = grown;
        *cap = bytes;
        if (f != cudaSuccess)
            return ps_cuda_fail(s->loc, f, "cudaFree", err);
        *out = grown;
        return PS_OK;
    }
    if (*buf != NULL) {
        /* work issued earlier may still read the old buffer */
        PS_CUDA_RET(s->loc, cudaStreamSynchronize(s->stream));
        PS_CUDA_RET(s->loc, ps_cuda_free(s, *buf));
        *buf = NULL;
        *cap = 0;
    }
    /* the growth by half, then what is asked for, before the pool's
     * cached blocks are given back for it (ps_cuda_malloc) */
    size_t exact = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    cudaError_t e = exact < want ? gated_malloc(s, buf, want) : cudaErrorMemoryAllocation;
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        want = exact;
        e = ps_cuda_malloc(s, buf, want);
    }
    if (e != cudaSuccess) {
        *buf = NULL;
        ps_status st = ps_cuda_fail(s->loc, e, "cudaMalloc", err);
        if (e == cudaErrorMemoryAllocation)
            st = err->status = PS_ERR_NOMEM; /* the caller may do with less */
        return st;
    }
    *cap = want;
    *out = *buf;
    return PS_OK;
}

ps_status ps_cuda_ws_reserve(ps_cuda_stream *s, size_t bytes, void **out, ps_error *err)
{
    return ps_cuda_buffer_reserve(s, &s->ws, &s->ws_bytes, bytes, out, err);
}

/* ---- boxes -------------------------------------------------------------------- */

static void row_major_strides(const ps_tile *t, int64_t *stride)
{
    int64_t acc = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        stride[d] = acc;
        acc *= t->shape[d];
    }
}

bool ps_cuda_box_intersect(const ps_tile *a, const ps_tile *b, int64_t lo[PS_MAX_RANK],
                           int64_t size[PS_MAX_RANK])
{
    for (int d = 0; d < a->rank; d++) {
        int64_t l = a->offset[d] > b->offset[d] ? a->offset[d] : b->offset[d];
        int64_t ha = a->offset[d] + a->shape[d], hb = b->offset[d] + b->shape[d];
        int64_t h = ha < hb ? ha : hb;
        if (h <= l)
            return false;
        lo[d] = l;
        size[d] = h - l;
    }
    return true;
}

template <typename T>
static __global__ void ps_k_box_copy(ps_cuda_box_args a, const T *src, T *dst, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i, so = 0, dof = 0;
        for (int d = a.rank - 1; d >= 0; d--) {
            int64_t c = r % a.size[d];
            r /= a.size[d];
            int64_t g = a.lo[d] + c;
            so += (g - a.src_off[d]) * a.src_stride[d];
            dof += (g - a.dst_off[d]) * a.dst_stride[d];
        }
        dst[dof] = src[so];
    }
}

static __global__ void ps_k_box_add(ps_cuda_box_args a, const float *src, float *dst, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i, so = 0, dof = 0;
        for (int d = a.rank - 1; d >= 0; d--) {
            int64_t c = r % a.size[d];
            r /= a.size[d];
            int64_t g = a.lo[d] + c;
            so += (g - a.src_off[d]) * a.src_stride[d];
            dof += (g - a.dst_off[d]) * a.dst_stride[d];
        }
        dst[dof] += src[so];
    }
}

ps_status ps_cuda_box_copy(ps_cuda_stream *s, const ps_tile *src, ps_tile *dst, bool add,
                           ps_error *err)
{
    if (src->rank != dst->rank || src->rank < 0 || src->rank > PS_MAX_RANK)
        return ps_error_set(err, PS_ERR_INVALID,
                            "device %d: box copy between tiles of rank %d and %d",
                            s->loc.device, src->rank, dst->rank);
    for (int d = 0; d < src->rank; d++)
        if (src->global[d] != dst->global[d])
            return ps_error_set(err, PS_ERR_INVALID,
                                "device %d: box copy between tiles of different tensors "
                                "(dim %d: %lld vs %lld)",
                                s->loc.device, d, (long long)src->global[d],
                                (long long)dst->global[d]);
    bool is_half = ps_tile_is_half(dst);
    if (ps_tile_elem_bytes(src) != ps_tile_elem_bytes(dst) ||
        (is_half && src->dtype != dst->dtype))
        return ps_error_set(err, PS_ERR_INVALID,
                            "device %d: box copy between tiles of different element types",
                            s->loc.device);
    if (add && (is_half || src->is_int || dst->is_int)) /* the backend adds half tiles widened */
        return ps_error_set(err, PS_ERR_INVALID, "device %d: box add of %s tiles",
                            s->loc.device, is_half ? "half-precision" : "integer");
    ps_cuda_box_args a;
    memset(&a, 0, sizeof a);
    a.rank = src->rank;
    if (!ps_cuda_box_intersect(src, dst, a.lo, a.size))
        return PS_OK;
    int64_t n = 1;
    for (int d = 0; d < a.rank; d++) {
        n *= a.size[d];
        a.src_off[d] = src->offset[d];
        a.dst_off[d] = dst->offset[d];
    }
    row_major_strides(src, a.src_stride);
    row_major_strides(dst, a.dst_stride);
    PS_CUDA_RET(s->loc, cudaSetDevice(s->loc.gpu));
    unsigned blocks = ps_cuda_blocks(n, 256);
    if (add) {
        ps_k_box_add<<<blocks, 256, 0, s->stream>>>(a, (const float *)src->data,
                                                    (float *)dst->data, n);
    } else if (is_half) {
        ps_k_box_copy<uint16_t><<<blocks, 256, 0, s->stream>>>(
            a, (const uint16_t *)src->data, (uint16_t *)dst->data, n);
    } else {
        ps_k_box_copy<uint32_t><<<blocks, 256, 0, s->stream>>>(
            a, (const uint32_t *)src->data, (uint32_t *)dst->data, n);
    }
    PS_CUDA_LAUNCHED(s->loc, "ps_k_box_add/ps_k_box_copy");
    return PS_OK;
}

template <typename T>
static __global__ void ps_k_box_pack(ps_cuda_box_args a, T *tile, T *buf, int64_t start,
                                     int64_t len, bool pack)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = start + i, off = 0;
        for (int d = a.rank - 1; d >= 0; d--) {
            int64_t c = r % a.size[d];
            r /= a.size[d];
            off += (a.lo[d] + c - a.src_off[d]) * a.src_stride[d];
        }
        if (pack)
            buf[i] = tile[off];
        else
            tile[off] = buf[i];
    }
}

ps_status ps_cuda_box_pack(ps_cuda_stream *s, const ps_tile *t, const int64_t *box_offset,
                           const int64_t *box_size, int64_t start, int64_t len, void *buf,
                           bool pack, ps_error *err)
{
    ps_cuda_box_args a;
    memset(&a, 0, sizeof a);
    a.rank = t->rank;
    int64_t count = 1;
    for (int d = 0; d < t->rank; d++) {
        if (box_size[d] < 1 || box_offset[d] < t->offset[d] ||
            box_offset[d] + box_size[d] > t->offset[d] + t->shape[d])
            return ps_error_set(err, PS_ERR_INVALID,
                                "device %d: box [%lld, +%lld) of dim %d is not inside the tile "
                                "[%lld, +%lld)",
                                s->loc.device, (long long)box_offset[d], (long long)box_size[d],
                                d, (long long)t->offset[d], (long long)t->shape[d]);
        a.lo[d] = box_offset[d];
        a.size[d] = box_size[d];
        a.src_off[d] = t->offset[d];
        count *= box_size[d];
    }
    if (start < 0 || len < 0 || start + len > count)
        return ps_error_set(err, PS_ERR_INVALID,
                            "device %d: elements [%lld, +%lld) outside a box of %lld",
                            s->loc.device, (long long)start, (long long)len, (long long)count);
    if (len == 0)
        return PS_OK;
    row_major_strides(t, a.src_stride);
    PS_CUDA_RET(s->loc, cudaSetDevice(s->loc.gpu));
    if (ps_tile_elem_bytes(t) == 2)
        ps_k_box_pack<uint16_t><<<ps_cuda_blocks(len, 256), 256, 0, s->stream>>>(
            a, (uint16_t *)t->data, (uint16_t *)buf, start, len, pack);
    else
        ps_k_box_pack<uint32_t><<<ps_cuda_blocks(len, 256), 256, 0, s->stream>>>(
            a, (uint32_t *)t->data, (uint32_t *)buf, start, len, pack);
    PS_CUDA_LAUNCHED(s->loc, "ps_k_box_pack");
    return PS_OK;
}

template <typename T>
static __global__ void ps_k_combine(T *dst, const T *src, int64_t n, bool max)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
    {
        /* max as the host combines (host_collective.c): a NaN held stays,
         * one arriving does not replace a number (fmaxf would drop both) */
        T v = dst[i], x = src[i];
        dst[i] = max ? (x > v ? x : v) : v + x;
    }
}

template <typename T>
static ps_status combine(ps_cuda_stream *s, T *dst, const T *src, int64_t n, bool max,
                         ps_error *err)
{
    if (n <= 0)
        return PS_OK;
    PS_CUDA_RET(s->loc, cudaSetDevice(s->loc.gpu));
    ps_k_combine<T><<<ps_cuda_blocks(n, 256), 256, 0, s->stream>>>(dst, src, n, max);
    PS_CUDA_LAUNCHED(s->loc, "ps_k_combine");
    return PS_OK;
}

ps_status ps_cuda_combine(ps_cuda_stream *s, float *dst, const float *src, int64_t n, bool max,
                          ps_error *err)
{
    return combine(s, dst, src, n, max, err);
}

ps_status ps_cuda_combine64(ps_cuda_stream *s, double *dst, const double *src, int64_t n,
                            bool max, ps_error *err)
{
    return combine(s, dst, src, n, max, err);
}
