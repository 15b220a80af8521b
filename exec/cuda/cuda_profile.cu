/* GEMM throughput measurement for `pipeshard profile`: cublasGemmEx timed
 * with CUDA events. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exec/cuda/cuda_internal.cuh"

/* Deterministic values in [-1, 1) (a hash of the index), so that the GEMM
 * does not run on zeros. */
__global__ static void k_fill(void *p, int64_t n, int kind)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)(i * 2654435761u) ^ 0x9e3779b9u;
        h ^= h >> 15;
        h *= 0x2c1b3c6du;
        h ^= h >> 12;
        float v = (float)(h & 0xffffu) / 32768.0f - 1.0f;
        if (kind == 0)
            ((float *)p)[i] = v;
        else if (kind == 1)
            ((__half *)p)[i] = __float2half(v);
        else
            ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
    }
}

ps_status ps_cuda_profile_gemm_batched(int gpu, int batch, int m, int n, int k, ps_dtype dtype,
                                       unsigned flags, int reps, double *seconds, ps_error *err)
{
    ps_status st = PS_OK;
    ps_cuda_loc loc = {-1, gpu};
    ps_cuda_stream *s = NULL;
    void *a = NULL, *b = NULL, *c = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaDataType_t t = CUDA_R_32F;
    cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
    size_t es = 4;
    int kind = 0;
    bool tf32 = (flags & PS_CUDA_PROFILE_TF32) != 0;
    ps_cuda_stream_options so = {tf32};
    const float alpha = 1.0f, beta = 0.0f;
    float ms = 0;
    *seconds = 0;
    if (m < 1 || n < 1 || k < 1 || reps < 1 || batch < 1) {
        st = ps_error_set(err, PS_ERR_INVALID,
                          "GEMM profile: batch, m, n, k and reps must be >= 1");
        goto out;
    }
    if (ps_cuda_device_count() <= gpu || gpu < 0) {
        st = ps_error_set(err, PS_ERR_UNSUPPORTED, "GEMM profile: no GPU %d on this machine",
                          gpu);
        goto out;
    }
    switch (dtype) {
    case PS_DTYPE_F32:
        ct = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        break;
    case PS_DTYPE_F16:
        t = CUDA_R_16F;
        es = 2;
        kind = 1;
        break;
    case PS_DTYPE_BF16:
        t = CUDA_R_16BF;
        es = 2;
        kind = 2;
        break;
    default:
        st = ps_error_set(err, PS_ERR_UNSUPPORTED, "GEMM profile: no GEMM for dtype %s",
                          ps_dtype_name(dtype));
        goto out;
    }
    if (tf32 && dtype != PS_DTYPE_F32) {
        st = ps_error_set(err, PS_ERR_INVALID, "GEMM profile: TF32 applies to fp32 only");
        goto out;
    }
    PS_TRY(ps_cuda_stream_create(-1, gpu, &so, &s, err));
    PS_CUDA_TRY(loc, cudaMalloc(&a, (size_t)batch * (size_t)m * (size_t)k * es));
    PS_CUDA_TRY(loc, cudaMalloc(&b, (size_t)batch * (size_t)k * (size_t)n * es));
    PS_CUDA_TRY(loc, cudaMalloc(&c, (size_t)batch * (size_t)m * (size_t)n * es));
    k_fill<<<ps_cuda_blocks((int64_t)batch * m * k, 256), 256, 0, s->stream>>>(
        a, (int64_t)batch * m * k, kind);
    PS_CUDA_TRY(loc, cudaGetLastError());
    k_fill<<<ps_cuda_blocks((int64_t)batch * k * n, 256), 256, 0, s->stream>>>(
        b, (int64_t)batch * k * n, kind);
    PS_CUDA_TRY(loc, cudaGetLastError());
    PS_CUDA_TRY(loc, cudaEventCreate(&e0));
    PS_CUDA_TRY(loc, cudaEventCreate(&e1));
    /* row-major C[m,n] = A[m,k] B[k,n] as column-major C^T = B^T A^T */
    for (int r = -1; r < reps; r++) {
        if (r == 0)
            PS_CUDA_TRY(loc, cudaEventRecord(e0, s->stream));
        if (batch == 1)
            PS_CUBLAS_TRY(loc, cublasGemmEx(s->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b,
                                            t, n, a, t, k, &beta, c, t, n, ct,
                                            CUBLAS_GEMM_DEFAULT));
        else
            PS_CUBLAS_TRY(loc, cublasGemmStridedBatchedEx(
                                   s->blas, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b, t, n,
                                   (long long)k * n, a, t, k, (long long)m * k, &beta, c, t, n,
                                   (long long)m * n, batch, ct, CUBLAS_GEMM_DEFAULT));
    }
    PS_CUDA_TRY(loc, cudaEventRecord(e1, s->stream));
    PS_CUDA_TRY(loc, cudaEventSynchronize(e1));
    PS_CUDA_TRY(loc, cudaEventElapsedTime(&ms, e0, e1));
    *seconds = (double)ms * 1e-3 / reps;
out:
    if (e0 != NULL)
        (void)cudaEventDestroy(e0);
    if (e1 != NULL)
        (void)cudaEventDestroy(e1);
    if (s != NULL)
        (void)cudaStreamSynchronize(s->stream);
    (void)cudaFree(a);
    (void)cudaFree(b);
    (void)cudaFree(c);
    ps_cuda_stream_free(s);
    return st;
}

ps_status ps_cuda_profile_gemm_flags(int gpu, int m, int n, int k, ps_dtype dtype,
                                     unsigned flags, int reps, double *seconds, ps_error *err)
{
    return ps_cuda_profile_gemm_batched(gpu, 1, m, n, k, dtype, flags, reps, seconds, err);
}

ps_status ps_cuda_profile_gemm(int gpu, int m, int n, int k, ps_dtype dtype, int reps,
                               double *seconds, ps_error *err)
{
    return ps_cuda_profile_gemm_flags(gpu, m, n, k, dtype, 0, reps, seconds, err);
}
