/* The numerical contract of every op on local tiles, shared by the CPU and
 * CUDA backends (exec/cpu/cpu_ops.c, exec/cuda/cuda_ops.cu implement it; the
 * CPU one is the reference the CUDA one is tested against).
 *
 * An op runs on the tiles a sharding strategy gives one device: inputs and
 * outputs are ps_tile (exec/tile.h) in the op's own order (ps_op.in, then
 * ps_op.out). The semantics are core/op.h's; on tiles they read:
 * - MATMUL: the einsum on local extents. A contracted label that is split
 *   makes the output a partial sum (the lowering reduces it later).
 * - Elementwise ops, BIAS_ADD, LAYERNORM(_GRAD), SOFTMAX(_GRAD), RESHAPE,
 *   TRANSPOSE: local. SOFTMAX's causal mask compares global positions:
 *   query q = offset[rank-2] + i, key k = offset[rank-1] + j, masked if k > q.
 * - LAYERNORM_GRAD's dgamma, dbeta and every reduction over a split
 *   dimension are partial sums of the local contributions. BATCHNORM_GRAD
 *   reduces its dgamma and dbeta through ctx->reduce (they are the sums its
 *   dx needs anyway): whole values on every member.
 * - REDUCE mean and BROADCAST mean divide by the GLOBAL count of the reduced
 *   dimensions (tile.global), so local results are addends of the true value.
 * - MSE_LOSS = sum over local elements of (p - t)^2 / global numel (an addend
 *   when split); MSE_LOSS_GRAD = 2 (p - t) / global numel.
 * - EMBEDDING: table tile holds rows offset[0] .. offset[0]+shape[0]-1 (and
 *   columns offset[1] ..); an id outside the local rows gives 0 (the output is
 *   then a partial sum over the vocabulary split). EMBEDDING_GRAD adds dy into
 *   the local rows only (other ids skipped); it overwrites its output.
 * - SOFTMAX_XENT (logits [..., V], labels [...] int32): mean over ALL tokens
 *   (global count of the label tensor) of logsumexp - logit[label]; local
 *   tokens only (an addend when tokens are split). When the vocabulary (last
 *   dim) is split, the op needs the max, the sum of exponentials and the
 *   label's logit over the vocabulary group: ctx->reduce does that (a
 *   group of 1 when the last dimension is whole). SOFTMAX_XENT_GRAD likewise
 *   (dlogits = (softmax - onehot) / global tokens).
 * - BATCHNORM(_GRAD) use batch statistics over every dim but 1, counted
 *   over the whole tensor; when the batch (or a spatial dim) is split they
 *   sum their per-channel partial sums (and, for the gradient, those of dy
 *   and dy * xhat) through ctx->reduce over the devices splitting it.
 * - ADAM (param, grad, m, v[, master]): updated in place, bias correction
 *   with ctx->step (1-based); weight decay AdamW-style (decoupled). With a
 *   master copy, the master is updated and copied into param.
 * Outputs are overwritten, except those ctx->accumulate names: the op adds
 * its result to what the tile holds (a gradient summed over micro-batches).
 * A backend accepts that only for the outputs its op_accumulates says
 * (exec/backend.h); the runtime accumulates every other one through a
 * scratch tile and the backend's `accumulate`. */
#ifndef PS_EXEC_OP_EXEC_H
#define PS_EXEC_OP_EXEC_H

#include "core/graph.h"
#include "core/status.h"
#include "exec/tile.h"

typedef enum ps_reduce_op { PS_REDUCE_OP_SUM = 0, PS_REDUCE_OP_MAX = 1 } ps_reduce_op;

/* An op's own collective (over the devices splitting the vocabulary of a
 * loss, or the batch of a batchnorm): an in-place all-reduce of n floats in
 * the backend's memory. */
typedef struct ps_op_reduce {
    int group_size; /* 1: nothing to reduce, fn may be NULL */
    void *arg;
    ps_status (*fn)(void *arg, float *data, int64_t n, ps_reduce_op op, ps_error *err);
    /* the same in double precision, or NULL where the backend has none: sums
     * whose small differences matter (batchnorm's statistics and gradients,
     * which cancel) keep their precision across devices */
    ps_status (*fn64)(void *arg, double *data, int64_t n, ps_reduce_op op, ps_error *err);
} ps_op_reduce;

typedef struct ps_op_context {
    int step;            /* optimizer step, 1-based (Adam's bias correction) */
    ps_op_reduce reduce; /* the op's own collective */
    /* ADAM: the runtime already found the gradient finite (the overflow vote
     * of dynamic loss scaling): the op's own check for inf and NaN is skipped */
    bool grads_checked;
    /* bit o: add output o's result to the tile's content instead of
     * overwriting it (only outputs the backend's op_accumulates accepted) */
    unsigned accumulate;
} ps_op_context;

/* Returns PS_ERR_UNSUPPORTED (with a message naming the op kind) for kinds a
 * backend does not implement. */
/* Every backend exposes one entry point of this shape (the CPU one is
 * ps_cpu_op_run in exec/cpu/cpu_ops.h): n_in and n_out are op->n_in and
 * op->n_out. */

#endif
