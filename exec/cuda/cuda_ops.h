/* The op numerics of exec/op_exec.h on device memory (CUDA kernels and
 * cuBLAS GEMMs), the GPU probe and the GEMM profiler. Plain C: no CUDA
 * types; callers compile with PS_HAVE_CUDA=1 (set by CMake where the
 * toolkit is found).
 *
 * Implemented kinds: matmul, bias_add, add, relu, gelu, layernorm, softmax,
 * embedding, reshape, transpose, reduce, broadcast, mse_loss, softmax_xent,
 * their gradients (relu_grad, gelu_grad, layernorm_grad, softmax_grad,
 * embedding_grad, mse_loss_grad, softmax_xent_grad), adam, conv2d (and
 * its gradients, through cuDNN; without cuDNN PS_ERR_UNSUPPORTED naming it),
 * pool, batchnorm and the moe_* kinds (and their gradients): every kind.
 *
 * Reductions are deterministic: fixed-order block reductions, no atomics
 * (embedding_grad sorts the token ids first). */
#ifndef PS_EXEC_CUDA_CUDA_OPS_H
#define PS_EXEC_CUDA_CUDA_OPS_H

#include <stdbool.h>

#include "core/dtype.h"
#include "core/graph.h"
#include "core/status.h"
#include "exec/op_exec.h"
#include "exec/tile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GPUs usable by this process; 0 when there is none or the CUDA driver is
 * missing or too old (cudaGetDeviceCount failing with any error, e.g. 35
 * "insufficient driver" or 100 "no device"). */
int ps_cuda_device_count(void);
/* Memory of CUDA device `gpu` in bytes (cudaGetDeviceProperties'
 * totalGlobalMem); 0 when it cannot be read. */
double ps_cuda_device_memory_bytes(int gpu);
/* Free memory of CUDA device `gpu` now, in bytes (cudaMemGetInfo: what this
 * process's context, its handles and every other process leave); 0 when it
 * cannot be read. */
double ps_cuda_device_free_bytes(int gpu);

/* A per-device execution context: a CUDA stream, a cuBLAS handle bound to
 * it and a growable workspace. `device` is the plan's device (for messages),
 * `gpu` the CUDA device it runs on. Every function taking a stream makes its
 * GPU current in the calling thread. */
typedef struct ps_cuda_stream ps_cuda_stream;

typedef struct ps_cuda_stream_options {
    bool allow_tf32; /* TF32 tensor-core GEMMs (off: full fp32, as the tests want) */
} ps_cuda_stream_options;

ps_status ps_cuda_stream_create(int device, int gpu, const ps_cuda_stream_options *opt,
                                ps_cuda_stream **out, ps_error *err);
void ps_cuda_stream_free(ps_cuda_stream *s);
/* Waits for the work issued on the stream, then fails if a data check of an
 * op issued since the last sync found something (an id or label outside the
 * vocabulary, inf or NaN in an update's gradient), with that op's message. */
ps_status ps_cuda_stream_sync(ps_cuda_stream *s, ps_error *err);

/* One op on local tiles in device memory, issued on s (asynchronous, except
 * that softmax_xent(_grad) with a vocabulary group waits for the stream
 * before calling ctx->reduce.fn, which receives device pointers). in/out
 * follow op->in and op->out; n_in = op->n_in, n_out = op->n_out. */
ps_status ps_cuda_op_run(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                         const ps_op_context *ctx, ps_error *err);

/* Seconds per GEMM C[m,n] = A[m,k] B[k,n] on `gpu`, averaged over `reps`
 * timed runs (after one warm-up) with CUDA events: fp32 (full precision),
 * fp16 or bf16 inputs with fp32 accumulation. */
ps_status ps_cuda_profile_gemm(int gpu, int m, int n, int k, ps_dtype dtype, int reps,
                               double *seconds, ps_error *err);

enum {
    PS_CUDA_PROFILE_TF32 = 1u << 0, /* fp32 inputs on TF32 tensor cores */
};
/* As ps_cuda_profile_gemm, with PS_CUDA_PROFILE_* flags. */
ps_status ps_cuda_profile_gemm_flags(int gpu, int m, int n, int k, ps_dtype dtype,
                                     unsigned flags, int reps, double *seconds, ps_error *err);
/* The same for `batch` independent GEMMs of that shape in one strided
 * batched call (batch 1: ps_cuda_profile_gemm_flags); seconds per call. */
ps_status ps_cuda_profile_gemm_batched(int gpu, int batch, int m, int n, int k, ps_dtype dtype,
                                       unsigned flags, int reps, double *seconds, ps_error *err);

#ifdef __cplusplus
}
#endif

#endif
