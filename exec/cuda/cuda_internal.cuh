/* Internal to exec/cuda: error macros that name the device and the failing
 * call, the per-device stream context, and the box-copy kernels shared by
 * the ops and the backend. CUDA C++ only (never included from C). */
#ifndef PS_EXEC_CUDA_INTERNAL_CUH
#define PS_EXEC_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#if PS_HAVE_CUDNN
#include <cudnn.h>
#endif

/* the project's headers are C: their functions have C linkage */
extern "C" {
#include "core/graph.h"
#include "core/status.h"
#include "exec/cuda/cuda_ops.h"
#include "exec/launch_gate.h"
#include "exec/tile.h"
}

/* Where a call runs, for messages: the plan's device and the GPU it uses. */
typedef struct ps_cuda_loc {
    int device;
    int gpu;
} ps_cuda_loc;

struct ps_cuda_stream {
    ps_cuda_loc loc;
    cudaStream_t stream;
    cublasHandle_t blas;
    bool allow_tf32;
    void *ws; /* op workspace (transposed operands, per-row statistics, ...) */
    size_t ws_bytes;
    void *half_ws; /* fp32 copies of an op's half tiles (cuda_half.cu) */
    size_t half_ws_bytes;
    void *blas_ws; /* cuBLAS's workspace where the stream gives it one; else NULL */
    /* deferred checks (ps_cuda_check_defer): PS_CUDA_CHECK_INTS ints per
     * slot on the device, their host copy, and what each will say */
    int *checks_dev;
    int *checks_host;
    struct ps_cuda_pending_check *checks;
    int n_checks;
    bool failed;       /* a flagged check answered early (slots full), */
    ps_error failure;  /* its message, reported at the next sync */
#if PS_HAVE_CUDNN
    cudnnHandle_t dnn; /* bound to `stream`; created by the first convolution */
    /* the algorithm each convolution kind and shape ran with (cuda_cnn_ops.cu), owned */
    struct ps_cuda_conv_algo *conv_algos;
    int n_conv_algos, cap_conv_algos;
#endif
    /* Frees device memory its owner keeps cached on this stream's GPU (the
     * backend's pool), so that an allocation that found none may try again;
     * true when something was freed. NULL: nothing cached (the profiler). */
    bool (*reclaim)(void *arg);
    void *reclaim_arg;
    bool reclaim_off; /* set around an allocation that may fail (a preference) */
    /* The backend's gate between collective launches and memory operations
     * (exec/launch_gate.h), borrowed; NULL without NCCL (no peer access). */
    ps_launch_gate *gate;
};

/* cudaMalloc on s's GPU, once more after s->reclaim where the first found
 * the GPU full: every device allocation outside the pool goes through it,
 * so that blocks the pool caches never make it fail. */
cudaError_t ps_cuda_malloc(ps_cuda_stream *s, void **p, size_t bytes);
/* cudaFree on s's GPU (current), through s->gate as every allocation. */
cudaError_t ps_cuda_free(ps_cuda_stream *s, void *p);
/* Gives s's cuBLAS handle a workspace of its own (32 MiB on Hopper and
 * later, 4 MiB before, as cuBLAS recommends), allocated now through s->gate:
 * otherwise cuBLAS allocates one inside the first GEMM, out of the gate's
 * sight. Freed with the stream. */
ps_status ps_cuda_stream_own_blas_workspace(ps_cuda_stream *s, ps_error *err);

/* Formats "device D (GPU G): CALL failed: WHAT (NAME)" into err. `call` is
 * the call's source text; only the function name is kept. */
ps_status ps_cuda_fail(ps_cuda_loc loc, cudaError_t e, const char *call, ps_error *err);
ps_status ps_cublas_fail(ps_cuda_loc loc, cublasStatus_t e, const char *call, ps_error *err);

/* An op's failure: "device D: op "NAME" (KIND): what" with status `code`
 * (PS_ERR_INVALID for a shape complaint, PS_ERR_UNSUPPORTED for what the
 * backend does not do). */
ps_status ps_cuda_op_error(const ps_cuda_stream *s, const ps_op *op, ps_status code,
                           ps_error *err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A shape complaint, in op code with `s`, `op` and `err` in scope. */
#define BAD(...) return ps_cuda_op_error(s, op, PS_ERR_INVALID, err, __VA_ARGS__)

/* The op's own all-reduce (ctx->reduce) of n floats in device memory,
 * after the stream's work; nothing for a group of one. */
ps_status ps_cuda_op_reduce(ps_cuda_stream *s, const ps_op *op, const ps_op_context *ctx,
                            float *data, int64_t n, ps_reduce_op rop, ps_error *err);

/* The convolutional network kinds (cuda_cnn_ops.cu): conv2d through cuDNN
 * (refused where the build has no cuDNN), pool and batchnorm with kernels
 * of their own; and their gradients. */
ps_status ps_cuda_conv_run(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                           ps_error *err);
ps_status ps_cuda_pool_run(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                           ps_error *err);
ps_status ps_cuda_batchnorm_run(ps_cuda_stream *s, const ps_op *op, const ps_tile *in,
                                ps_tile *out, const ps_op_context *ctx, ps_error *err);

/* The mixture-of-experts kinds (cuda_moe_ops.cu): moe_gate, moe_dispatch,
 * moe_combine and their gradients. */
ps_status ps_cuda_moe_run(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                          ps_error *err);

/* Half-precision storage (cuda_half.cu): n values of an fp16/bf16 buffer
 * widened to floats, floats rounded (to nearest even) into one, and
 * dst = dst + src with each sum rounded once; on s's stream. */
ps_status ps_cuda_half_widen(ps_cuda_stream *s, ps_dtype t, const void *src, float *dst,
                             int64_t n, ps_error *err);
ps_status ps_cuda_half_narrow(ps_cuda_stream *s, ps_dtype t, const float *src, void *dst,
                              int64_t n, ps_error *err);
ps_status ps_cuda_half_add(ps_cuda_stream *s, ps_dtype t, void *dst, const void *src, int64_t n,
                           ps_error *err);
/* y = x (a row-major tile of shape in_shape) with out dim i = in dim perm[i],
 * elements of elem_bytes (2 or 4) moved as they are; on s's stream. */
ps_status ps_cuda_permute(ps_cuda_stream *s, const void *x, const int64_t *in_shape, int rank,
                          const int *perm, size_t elem_bytes, void *y, ps_error *err);
/* Whether ps_cuda_op_run adds output `out` of an op of this kind into tile
 * t when ctx->accumulate asks: a MATMUL's fp32 output (cuBLAS's beta 1). */
bool ps_cuda_op_accumulates(ps_op_kind kind, int out, const ps_tile *t);
/* An op with half tiles among its inputs or outputs (ps_cuda_op_run sends
 * it here): a half GEMM on cuBLAS, or the fp32 kernel on widened copies. */
ps_status ps_cuda_half_op(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                          const ps_op_context *ctx, ps_error *err);

/* The flag pair a kernel sets for a bad index (flag[0] = 1, flag[1] = the
 * index), read back after the stream's work (a small copy and a wait). */
ps_status ps_cuda_read_flag(ps_cuda_stream *s, const int *flag_dev, int flag[2], ps_error *err);

/* Data checks answered at the stream's next ps_cuda_stream_sync rather than
 * by a read-back each: a read-back stops the host until the GPU catches up,
 * and the update alone would do it once per parameter and step. A check is a
 * slot of PS_CUDA_CHECK_INTS device ints (16-byte aligned), zero until a
 * kernel flags it: [0] = 1; ID, LABEL: [1] = the bad id or label; GRADIENT:
 * [2..3] = the complement of the first bad element's index (an unsigned
 * 64-bit atomicMax), [1] = its class (1 NaN, 2 inf, 3 -inf). The kernels
 * given one stay in bounds whatever the data (a bad id embeds zeros, a
 * flagged update writes nothing), so the work after them may run on; the
 * sync then fails with the first flagged check in issue order, named as the
 * op's own error would be. */
enum { PS_CUDA_CHECK_INTS = 4, PS_CUDA_CHECK_SLOTS = 1024 };

typedef enum ps_cuda_check_kind {
    PS_CUDA_CHECK_ID,       /* an embedding id outside the vocabulary */
    PS_CUDA_CHECK_LABEL,    /* a loss label outside the vocabulary */
    PS_CUDA_CHECK_GRADIENT, /* inf or NaN in the gradient an update reads */
} ps_cuda_check_kind;

typedef struct ps_cuda_check {
    ps_cuda_check_kind kind;
    const ps_op *op; /* its name and kind are copied */
    int64_t vocab;   /* ID, LABEL */
    int step;        /* GRADIENT: the optimizer step */
    double scale;    /* GRADIENT: the loss scale */
} ps_cuda_check;

/* The next zeroed slot for `c`. When every slot is taken, the stream is
 * synced and the slots are answered first; a flagged one is kept for the
 * next ps_cuda_stream_sync, so that the failure names its own op. */
ps_status ps_cuda_check_defer(ps_cuda_stream *s, const ps_cuda_check *c, int **slot_dev,
                              ps_error *err);

/* Whether any element of the n tiles (float or half) is inf or NaN: one
 * flag for all of them, read back once (the overflow vote). */
ps_status ps_cuda_find_nonfinite(ps_cuda_stream *s, const ps_tile *tiles, int n, bool *found,
                                 ps_error *err);

/* Whether two tiles have the same rank and local extents. */
static inline bool ps_cuda_same_shape(const ps_tile *a, const ps_tile *b)
{
    if (a->rank != b->rank)
        return false;
    for (int d = 0; d < a->rank; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    return true;
}

/* In functions with `ps_status st` and an `out:` label. */
#define PS_CUDA_TRY(loc, call)                                                                \
    do {                                                                                      \
        cudaError_t ps_cuda_e_ = (call);                                                      \
        if (ps_cuda_e_ != cudaSuccess) {                                                      \
            st = ps_cuda_fail((loc), ps_cuda_e_, #call, err);                                 \
            goto out;                                                                         \
        }                                                                                     \
    } while (0)

/* Returns the failure directly (functions without cleanup). */
#define PS_CUDA_RET(loc, call)                                                                \
    do {                                                                                      \
        cudaError_t ps_cuda_e_ = (call);                                                      \
        if (ps_cuda_e_ != cudaSuccess)                                                        \
            return ps_cuda_fail((loc), ps_cuda_e_, #call, err);                               \
    } while (0)

#define PS_CUBLAS_RET(loc, call)                                                              \
    do {                                                                                      \
        cublasStatus_t ps_cublas_e_ = (call);                                                 \
        if (ps_cublas_e_ != CUBLAS_STATUS_SUCCESS)                                            \
            return ps_cublas_fail((loc), ps_cublas_e_, #call, err);                           \
    } while (0)

#define PS_CUBLAS_TRY(loc, call)                                                              \
    do {                                                                                      \
        cublasStatus_t ps_cublas_e_ = (call);                                                 \
        if (ps_cublas_e_ != CUBLAS_STATUS_SUCCESS) {                                          \
            st = ps_cublas_fail((loc), ps_cublas_e_, #call, err);                             \
            goto out;                                                                         \
        }                                                                                     \
    } while (0)

/* After a kernel launch (returns): a launch failure names the kernel. */
#define PS_CUDA_LAUNCHED(loc, kernel_name)                                                    \
    do {                                                                                      \
        cudaError_t ps_cuda_e_ = cudaGetLastError();                                          \
        if (ps_cuda_e_ != cudaSuccess)                                                        \
            return ps_cuda_fail((loc), ps_cuda_e_, "launch of " kernel_name, err);            \
    } while (0)

/* Propagates a ps_status (functions without cleanup). */
#define PS_RET(expr)                                                                          \
    do {                                                                                      \
        ps_status ps_ret_st_ = (expr);                                                        \
        if (ps_ret_st_ != PS_OK)                                                              \
            return ps_ret_st_;                                                                \
    } while (0)

/* A stream's device buffer *buf of *cap bytes, grown (never shrunk) to at
 * least `bytes`, after the stream's work; the previous contents are lost
 * when it grows. PS_ERR_NOMEM when the GPU has not that much free: the
 * buffer is then freed, except under s->reclaim_off (a preference), where
 * the larger one is sought first and the buffer kept as it was; other CUDA
 * failures are PS_ERR_DEVICE. */
ps_status ps_cuda_buffer_reserve(ps_cuda_stream *s, void **buf, size_t *cap, size_t bytes,
                                 void **out, ps_error *err);

/* The op workspace (ps_cuda_buffer_reserve of s->ws). */
ps_status ps_cuda_ws_reserve(ps_cuda_stream *s, size_t bytes, void **out, ps_error *err);

/* A box in global coordinates over up to PS_MAX_RANK dims, for copies
 * between tiles of one tensor. */
typedef struct ps_cuda_box_args {
    int rank;
    int64_t lo[PS_MAX_RANK];     /* global index of the box's first element */
    int64_t size[PS_MAX_RANK];   /* extent of the box */
    int64_t src_off[PS_MAX_RANK], dst_off[PS_MAX_RANK];       /* tiles' offsets */
    int64_t src_stride[PS_MAX_RANK], dst_stride[PS_MAX_RANK]; /* in elements */
} ps_cuda_box_args;

/* The intersection of the boxes of a and b (tiles of one tensor); false
 * when it is empty. Rank 0 tiles intersect in their one element. */
bool ps_cuda_box_intersect(const ps_tile *a, const ps_tile *b, int64_t lo[PS_MAX_RANK],
                           int64_t size[PS_MAX_RANK]);

/* dst[box] = src[box] (add: +=, floats only) over the intersection of the
 * two tiles' boxes, on s's stream. 4-byte elements (float or int32) or
 * 2-byte ones (fp16/bf16); both tiles of one element type. */
ps_status ps_cuda_box_copy(ps_cuda_stream *s, const ps_tile *src, ps_tile *dst, bool add,
                           ps_error *err);

/* Flat elements [start, start+len) of `box` (row-major over the box) of a
 * tile, packed into (pack) or unpacked from (!pack) a contiguous buffer of
 * the tile's element size. */
ps_status ps_cuda_box_pack(ps_cuda_stream *s, const ps_tile *t, const int64_t *box_offset,
                           const int64_t *box_size, int64_t start, int64_t len, void *buf,
                           bool pack, ps_error *err);

/* dst[i] = dst[i] + src[i] (or max) over n floats, on s's stream. */
ps_status ps_cuda_combine(ps_cuda_stream *s, float *dst, const float *src, int64_t n, bool max,
                          ps_error *err);
/* The same over n doubles (reduce64). */
ps_status ps_cuda_combine64(ps_cuda_stream *s, double *dst, const double *src, int64_t n,
                            bool max, ps_error *err);

/* Launch geometry: blocks of 256 threads covering n elements with grid-stride
 * loops (at most 65535 * 16 blocks). */
static inline unsigned ps_cuda_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1)
        b = 1;
    if (b > 65535LL * 16)
        b = 65535LL * 16;
    return (unsigned)b;
}

/* Kernel loops: one element per thread over a grid-stride loop, or one row
 * per block (the block's threads share the row). */
#define FOR_EACH(i, n)                                                                        \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                 \
         i += (int64_t)gridDim.x * blockDim.x)
#define ROWS_LOOP(row, rows) for (int64_t row = blockIdx.x; row < (rows); row += gridDim.x)

/* Blocks for ROWS_LOOP: one per row, at most 65535 * 16. */
static inline unsigned ps_cuda_row_blocks(int64_t rows)
{
    return (unsigned)(rows < 65535LL * 16 ? (rows < 1 ? 1 : rows) : 65535LL * 16);
}

/* ---- block reductions (fixed order: deterministic) ----------------------------- */

template <typename T> __device__ inline T warp_sum(T v)
{
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

template <typename T> __device__ inline T warp_max(T v)
{
    for (int o = 16; o > 0; o /= 2) {
        T w = __shfl_down_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* The sum over the block's threads, returned to every thread. sh holds 32
 * values of T. blockDim.x must be a multiple of 32. */
template <typename T> __device__ inline T block_sum(T v, T *sh)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < warps ? sh[lane] : (T)0;
        w = warp_sum(w);
        if (lane == 0)
            sh[0] = w;
    }
    __syncthreads();
    return sh[0];
}

template <typename T> __device__ inline T block_max(T v, T *sh, T lowest)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < warps ? sh[lane] : lowest;
        w = warp_max(w);
        if (lane == 0)
            sh[0] = w;
    }
    __syncthreads();
    return sh[0];
}

#endif
