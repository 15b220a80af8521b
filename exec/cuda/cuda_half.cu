/* exec/cuda: fp16/bf16 tiles held in 2 bytes on the GPU. The conversions
 * (CUDA's __float2half_rn and __float2bfloat16_rn: round to nearest even,
 * bit-exact with exec/half.c except for NaN encodings, which CUDA makes
 * canonical), half adds, and ops on half tiles: a GEMM runs on the half
 * values themselves (cuBLAS, fp32 accumulation, a half output rounded once,
 * permutations as 2-byte moves; an fp32 output too); the pointwise kinds
 * (elementwise ops, bias adds, softmax and its gradient, layernorm and its
 * gradient, reductions, broadcasts, reshape, transpose) whose tiles are all
 * of one half type run their kernels on the half values (exec/cuda/cuda_ops.cu,
 * the same arithmetic as the fp32 kernel, one rounding per output); every
 * other op, and any op mixing half and fp32 tiles, runs its fp32 kernel on
 * widened copies and rounds its outputs once, as the CPU backend does. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <string.h>

#include "exec/cuda/cuda_internal.cuh"

extern "C" {
#include "exec/gemm_plan.h"
}

static __device__ inline float half_to_float(bool bf16, uint16_t h)
{
    if (bf16)
        return __uint_as_float((uint32_t)h << 16);
    return __half2float(__ushort_as_half(h));
}

static __device__ inline uint16_t half_from_float(bool bf16, float x)
{
    if (bf16)
        return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    return __half_as_ushort(__float2half_rn(x));
}

static __global__ void ps_k_half_widen(bool bf16, const uint16_t *src, float *dst, int64_t n)
{
    FOR_EACH(i, n)
    dst[i] = half_to_float(bf16, src[i]);
}

static __global__ void ps_k_half_narrow(bool bf16, const float *src, uint16_t *dst, int64_t n)
{
    FOR_EACH(i, n)
    dst[i] = half_from_float(bf16, src[i]);
}

static __global__ void ps_k_half_add(bool bf16, uint16_t *dst, const uint16_t *src, int64_t n)
{
    FOR_EACH(i, n)
    dst[i] = half_from_float(bf16, half_to_float(bf16, dst[i]) + half_to_float(bf16, src[i]));
}

ps_status ps_cuda_half_widen(ps_cuda_stream *s, ps_dtype t, const void *src, float *dst,
                             int64_t n, ps_error *err)
{
    if (n <= 0)
        return PS_OK;
    PS_CUDA_RET(s->loc, cudaSetDevice(s->loc.gpu));
    ps_k_half_widen<<<ps_cuda_blocks(n, 256), 256, 0, s->stream>>>(
        t == PS_DTYPE_BF16, (const uint16_t *)src, dst, n);
    PS_CUDA_LAUNCHED(s->loc, "ps_k_half_widen");
    return PS_OK;
}

ps_status ps_cuda_half_narrow(ps_cuda_stream *s, ps_dtype t, const float *src, void *dst,
                              int64_t n, ps_error *err)
{
    if (n <= 0)
        return PS_OK;
    PS_CUDA_RET(s->loc, cudaSetDevice(s->loc.gpu));
    ps_k_half_narrow<<<ps_cuda_blocks(n, 256), 256, 0, s->stream>>>(t == PS_DTYPE_BF16, src,
                                                                      (uint16_t *)dst, n);
    PS_CUDA_LAUNCHED(s->loc, "ps_k_half_narrow");
    return PS_OK;
}

ps_status ps_cuda_half_add(ps_cuda_stream *s, ps_dtype t, void *dst, const void *src, int64_t n,
                           ps_error *err)
{
    if (n <= 0)
        return PS_OK;
    PS_CUDA_RET(s->loc, cudaSetDevice(s->loc.gpu));
    ps_k_half_add<<<ps_cuda_blocks(n, 256), 256, 0, s->stream>>>(
        t == PS_DTYPE_BF16, (uint16_t *)dst, (const uint16_t *)src, n);
    PS_CUDA_LAUNCHED(s->loc, "ps_k_half_add");
    return PS_OK;
}

/* Bytes a tile's fp32 copy takes in the scratch (256-byte aligned). */
static size_t widened_bytes(const ps_tile *t)
{
    if (!ps_tile_is_half(t))
        return 0;
    return ((size_t)ps_tile_numel(t) * sizeof(float) + 255) & ~(size_t)255;
}

static cudaDataType_t cuda_half_type(ps_dtype t)
{
    return t == PS_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

/* A matmul of half operands into a half output, or into an fp32 one (a
 * gradient accumulated in fp32: `add` adds the product into it, cuBLAS's
 * beta 1): one cuBLAS GEMM on the 2-byte values, accumulated in fp32 and
 * rounded once where the output is half, with the operands and a half
 * output permuted as 2-byte values where the einsum needs it (moves, no
 * rounding), as the fp32 path permutes floats. false in *done when the op
 * needs the widened path (mixed operand types, an fp32 output that needs a
 * permutation, an empty contraction). */
static ps_status half_gemm(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                           bool add, bool *done, ps_error *err)
{
    *done = false;
    const ps_tile *t[3] = {&in[0], &in[1], &out[0]};
    int rank[3];
    int64_t shape[3][PS_MAX_RANK];
    bool out_f32 = !out[0].is_int && out[0].dtype == PS_DTYPE_F32;
    for (int o = 0; o < 3; o++) {
        bool same_half = ps_tile_is_half(t[o]) && t[o]->dtype == in[0].dtype;
        if (!same_half && !(o == 2 && out_f32))
            return PS_OK;
        rank[o] = t[o]->rank;
        memcpy(shape[o], t[o]->shape, sizeof shape[o]);
    }
    if (add && !out_f32)
        return PS_OK; /* never asked: the runtime adds into half outputs itself */
    ps_gemm_plan p;
    ps_error perr = {PS_OK, ""};
    if (ps_gemm_plan_make(op->attrs.einsum, rank, shape, &p, &perr) != PS_OK)
        return PS_OK; /* the fp32 path reports the shape error */
    if (p.k == 0 || ps_tile_numel(t[2]) == 0 || p.m > INT32_MAX || p.n > INT32_MAX ||
        p.k > INT32_MAX || p.batch > INT32_MAX || (out_f32 && p.out_permute))
        return PS_OK;
    /* workspace: the permuted operands, a half output before its permutation */
    size_t off[3] = {0, 0, 0}, used = 0;
    for (int o = 0; o < 3; o++)
        if (o < 2 ? p.permute[o] : p.out_permute) {
            off[o] = used;
            used += ((size_t)ps_tile_numel(t[o]) * 2 + 255) / 256 * 256;
        }
    char *ws = NULL;
    if (used > 0)
        PS_RET(ps_cuda_ws_reserve(s, used, (void **)&ws, err));
    PS_CUDA_RET(s->loc, cudaSetDevice(s->loc.gpu));
    const void *opnd[2] = {in[0].data, in[1].data};
    for (int o = 0; o < 2; o++)
        if (p.permute[o]) {
            PS_RET(ps_cuda_permute(s, opnd[o], t[o]->shape, t[o]->rank, p.perm[o], 2, ws + off[o],
                                   err));
            opnd[o] = ws + off[o];
        }
    void *c = p.out_permute ? (void *)(ws + off[2]) : out[0].data;
    cudaDataType_t ht = cuda_half_type(in[0].dtype), ct = out_f32 ? CUDA_R_32F : ht;
    const float alpha = 1.0f, beta = add ? 1.0f : 0.0f;
    size_t c_bytes = out_f32 ? 4 : 2; /* the output's elements; the operands' are 2 bytes */
    for (int64_t call = 0; call < p.calls; call++) {
        int64_t at[3];
        ps_gemm_plan_offsets(&p, call, at);
        PS_CUBLAS_RET(s->loc,
                      cublasGemmStridedBatchedEx(
                          s->blas, p.transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                          p.transb ? CUBLAS_OP_T : CUBLAS_OP_N, (int)p.cm, (int)p.cn, (int)p.ck,
                          &alpha, (const char *)opnd[1 - p.left] + 2 * at[1 - p.left], ht,
                          (int)p.lda, (long long)p.stride_a,
                          (const char *)opnd[p.left] + 2 * at[p.left], ht, (int)p.ldb,
                          (long long)p.stride_b, &beta, (char *)c + c_bytes * (size_t)at[2], ct,
                          (int)p.ldc, (long long)p.stride_c, (int)p.batch, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT));
    }
    if (p.out_permute)
        PS_RET(ps_cuda_permute(s, c, p.out_tmp_shape, p.out_rank, p.out_perm, 2, out[0].data, err));
    *done = true;
    return PS_OK;
}

ps_status ps_cuda_half_op(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                          const ps_op_context *ctx, ps_error *err)
{
    if (op->kind == PS_OP_MATMUL && op->n_in == 2 && op->n_out == 1 && in[0].data != NULL &&
        in[1].data != NULL && out[0].data != NULL) {
        bool done, add = ctx != NULL && (ctx->accumulate & 1u) != 0;
        PS_RET(half_gemm(s, op, in, out, add, &done, err));
        if (done)
            return PS_OK;
    }
    size_t need = 0;
    for (int i = 0; i < op->n_in; i++)
        need += widened_bytes(&in[i]);
    for (int o = 0; o < op->n_out; o++)
        need += widened_bytes(&out[o]);
    /* the half scratch, apart from the op workspace that the fp32 kernels
     * use while the copies are live */
    char *ws = NULL;
    PS_RET(ps_cuda_buffer_reserve(s, &s->half_ws, &s->half_ws_bytes, need, (void **)&ws, err));
    ps_tile fin[PS_MAX_OP_IO], fout[PS_MAX_OP_IO];
    size_t at = 0;
    for (int i = 0; i < op->n_in; i++) {
        fin[i] = in[i];
        if (!ps_tile_is_half(&in[i]) || in[i].data == NULL) /* no data: the fp32 path says so */
            continue;
        fin[i].data = ws + at;
        fin[i].dtype = PS_DTYPE_F32;
        at += widened_bytes(&in[i]);
        PS_RET(ps_cuda_half_widen(s, in[i].dtype, in[i].data, (float *)fin[i].data,
                                      ps_tile_numel(&in[i]), err));
    }
    for (int o = 0; o < op->n_out; o++) {
        fout[o] = out[o];
        if (!ps_tile_is_half(&out[o]) || out[o].data == NULL)
            continue;
        fout[o].data = ws + at;
        fout[o].dtype = PS_DTYPE_F32;
        at += widened_bytes(&out[o]);
    }
    PS_RET(ps_cuda_op_run(s, op, fin, fout, ctx, err));
    for (int o = 0; o < op->n_out; o++)
        if (fout[o].data != out[o].data)
            PS_RET(ps_cuda_half_narrow(s, out[o].dtype, (const float *)fout[o].data,
                                       out[o].data, ps_tile_numel(&out[o]), err));
    if (op->kind == PS_OP_ADAM) /* updated in place; an unchanged input rounds to itself */
        for (int i = 0; i < op->n_in; i++)
            if (fin[i].data != in[i].data)
                PS_RET(ps_cuda_half_narrow(s, in[i].dtype, (const float *)fin[i].data,
                                           in[i].data, ps_tile_numel(&in[i]), err));
    return PS_OK;
}
