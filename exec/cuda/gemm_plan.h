/* How an einsum of two operands (core/op.h's MATMUL) runs as one
 * column-major strided-batched GEMM (cuBLAS's cublasGemmStridedBatchedEx):
 * which operand gives the rows, which operands must be permuted first, the
 * GEMM's transposes, leading dimensions and batch strides, and the
 * permutation that takes the GEMM's output into the einsum's output order.
 * Plain C and host-only, so that it can be checked without a GPU.
 *
 * Labels fall into four classes: batch (in both operands and the output),
 * contracted (both operands, not the output) and the free labels of each
 * operand (that operand and the output). The GEMM computes, per batch
 * element, the row-major product C[M, N] = L[M, K] R[K, N], where L is the
 * operand whose free labels come first in the output (M = their product,
 * N = the other operand's), K the contracted labels. */
#ifndef PS_EXEC_CUDA_GEMM_PLAN_H
#define PS_EXEC_CUDA_GEMM_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "core/op.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ps_gemm_plan {
    int64_t batch, m, n, k; /* the row-major problem C[M, N] = L[M, K] R[K, N] */
    int left;               /* the operand (0 or 1) that is L; R is 1 - left */
    /* Operand o is first permuted (into a temporary) with out dim i = in dim
     * perm[o][i], giving the shape perm_shape[o]; else it is used as stored. */
    bool permute[2];
    int perm[2][PS_MAX_RANK];
    /* The GEMM writes [batch][rows][cols]; when out_permute, that temporary
     * (shape out_tmp_shape, rank out_rank) is permuted into the output with
     * out_perm. */
    bool out_permute;
    int out_rank;
    int64_t out_tmp_shape[PS_MAX_RANK];
    int out_perm[PS_MAX_RANK];
    /* cublasGemmStridedBatchedEx(transa, transb, m, n, k, A, lda, stride_a,
     * B, ldb, stride_b, C, ldc, stride_c, batch): column-major C^T = R^T L^T,
     * A = R (after its permutation), B = L. */
    bool transa, transb;
    int64_t cm, cn, ck, lda, ldb, ldc;
    int64_t stride_a, stride_b, stride_c;
} ps_gemm_plan;

/* From the einsum and the operands' and output's local shapes (rank and
 * extents per operand: shape[o] for o = 0, 1 and the output 2). Checks that
 * ranks match the labels and that a label has one extent everywhere. */
ps_status ps_gemm_plan_make(const char *einsum, const int rank[3],
                            const int64_t shape[3][PS_MAX_RANK], ps_gemm_plan *out,
                            ps_error *err);

#ifdef __cplusplus
}
#endif

#endif
