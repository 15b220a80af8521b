/* How an einsum of two operands (core/op.h's MATMUL) runs as column-major
 * strided-batched GEMMs (cuBLAS's cublasGemmStridedBatchedEx): which operand
 * gives the rows, which operands must be permuted first, the GEMMs'
 * transposes, leading dimensions and batch strides, how many calls the
 * batch takes and where each starts, and the permutation that takes the
 * output into the einsum's order where the GEMM cannot write it in place.
 * Plain C and host-only (the CUDA backend's), so that it is checked without
 * a GPU (tests/test_gemm_plan.c).
 *
 * Labels fall into four classes: batch (in both operands and the output),
 * contracted (both operands, not the output) and the free labels of each
 * operand (that operand and the output). Per batch element the GEMM computes
 * the row-major product C[M, N] = L[M, K] R[K, N], where L is one operand
 * (M = the product of its free labels, N = the other operand's, K the
 * contracted labels'). A matrix is read where it lies whenever its labels'
 * strides allow: each of its two label groups spans one stride, one of
 * them 1 (the other is the leading dimension); so attention's
 * "bqad,bkad->baqk" reads q and k as stored, [q][d] rows a*d apart. Only an
 * operand whose groups do not span a stride is permuted (into [batch][M][K]
 * or [batch][K][N]), and only an output that cannot be written in place
 * goes through a temporary. cuBLAS takes one batch stride: the batch labels
 * that span one in all three take it, the others are looped over, one call
 * each (at most PS_GEMM_MAX_CALLS calls, and only where the permutations they
 * spare outweigh the calls' launches; else the batch is made whole by
 * permuting). */
#ifndef PS_EXEC_GEMM_PLAN_H
#define PS_EXEC_GEMM_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "core/op.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PS_GEMM_MAX_CALLS 64

typedef struct ps_gemm_plan {
    /* the row-major problem C[M, N] = L[M, K] R[K, N] of each call, batch
     * the batch count of one call (the whole batch is calls x batch) */
    int64_t batch, m, n, k;
    int left; /* the operand (0 or 1) that is L; R is 1 - left */
    /* Operand o is first permuted (into a temporary) with out dim i = in dim
     * perm[o][i], giving [batch][M][K] for L, [batch][K][N] for R (batch
     * labels in the output's order); else it is used as stored. */
    bool permute[2];
    int perm[2][PS_MAX_RANK];
    /* The GEMM writes [batch][M][N] into a temporary (shape out_tmp_shape,
     * rank out_rank), which is permuted into the output with out_perm;
     * else it writes the output where it lies. */
    bool out_permute;
    int out_rank;
    int64_t out_tmp_shape[PS_MAX_RANK];
    int out_perm[PS_MAX_RANK];
    /* cublasGemmStridedBatchedEx(transa, transb, m, n, k, A, lda, stride_a,
     * B, ldb, stride_b, C, ldc, stride_c, batch): column-major C^T = R^T L^T,
     * A = R (after its permutation), B = L; strides in elements. */
    bool transa, transb;
    int64_t cm, cn, ck, lda, ldb, ldc;
    int64_t stride_a, stride_b, stride_c;
    /* The calls: calls = the product of loop_size; call c starts operand o
     * (0, 1; 2: the output or its temporary) loop offsets in (elements, in
     * the permuted layout where o is permuted): ps_gemm_plan_offsets. */
    int64_t calls;
    int n_loop;
    int64_t loop_size[PS_MAX_RANK];
    int64_t loop_stride[3][PS_MAX_RANK];
} ps_gemm_plan;

/* From the einsum and the operands' and output's local shapes (rank and
 * extents per operand: shape[o] for o = 0, 1 and the output 2, dense
 * row-major). Checks that ranks match the labels and that a label has one
 * extent everywhere. */
ps_status ps_gemm_plan_make(const char *einsum, const int rank[3],
                            const int64_t shape[3][PS_MAX_RANK], ps_gemm_plan *out,
                            ps_error *err);

/* ps_gemm_plan_make, a call counted as call_cost permuted elements (the
 * former's: about 2^20; 0 reads in place wherever that permutes less). */
ps_status ps_gemm_plan_make_costed(const char *einsum, const int rank[3],
                                   const int64_t shape[3][PS_MAX_RANK], int64_t call_cost,
                                   ps_gemm_plan *out, ps_error *err);

/* Where call `call` (0 to calls - 1) starts in operand 0, operand 1 and the
 * output: elements from each one's start. */
void ps_gemm_plan_offsets(const ps_gemm_plan *p, int64_t call, int64_t off[3]);

#ifdef __cplusplus
}
#endif

#endif
