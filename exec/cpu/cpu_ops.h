/* The CPU backend's ops: every op kind of core/op.h on host tiles, in fp32
 * (integer tensors as int32), with the tile semantics of exec/op_exec.h.
 * GEMMs and convolutions go through OpenBLAS; everything else is plain
 * loops. Single-threaded: the runtime runs one thread per device (and sets
 * OpenBLAS's own thread count).
 *
 * Choices the contract leaves open, fixed here for every backend:
 * - Reductions inside an op (softmax, layernorm, losses, batch statistics)
 *   accumulate in double and store fp32.
 * - Token ids, labels and MoE slots outside the whole tensor's range are
 *   errors (PS_ERR_INVALID), reported after the op's own reductions so that
 *   the peers of a group are not left waiting.
 * - An op's reduce group must match its split: a group of more than one
 *   device over a whole vocabulary (losses) or a whole batch (batchnorm) is
 *   an error, and so is a split without a group. LAYERNORM and SOFTMAX need
 *   their last dim whole in the tile (PS_ERR_UNSUPPORTED otherwise). Ops
 *   with a `shape` attribute check it against their output's global shape.
 * - SOFTMAX: a row whose keys are all masked gives zeros. SOFTMAX_GRAD is
 *   dx = scale * y * (dy - sum(y * dy)) over the row.
 * - POOL avg divides by the whole window (padding counts as zeros); POOL max
 *   ignores padding and POOL_GRAD routes dy to the first maximum of the window.
 * - BATCHNORM(_GRAD): batch statistics (biased variance) over every dim but
 *   dim 1, counted over the whole tensor (tile.global); when those dims are
 *   split the op sums its per-channel partial sums through ctx->reduce (the
 *   devices splitting the batch), as the losses do for a split vocabulary.
 *   dgamma and dbeta are those totals (the planner counts the batch label of
 *   both ops as reduced inside the op, planner/strategy.c).
 * - MOE_GATE: softmax over the experts, top-k by probability (ties go to the
 *   lower expert), capacity filled GShard-style: every token's first choice
 *   in token order, then every token's second choice, and so on; slot =
 *   expert * capacity + position or -1 when the expert is full. weight holds
 *   the probability of each chosen expert even when its slot is -1 (combine
 *   skips those). The routing group (s) and the experts (e) must be whole
 *   in the tile (MOE_GATE_GRAD: the experts).
 * - MOE_GATE_GRAD recomputes the top-k choice from the logits (it has no
 *   capacity to decode slots); its gradient is the softmax Jacobian applied to
 *   dweight scattered onto the chosen experts.
 * - MOE_DISPATCH / COMBINE and their gradients decode slots with the expert
 *   tensor's global capacity; a tile of the [e, g, c, m] tensor holds some
 *   experts and capacity positions, and the other slots contribute nothing
 *   (combine and dispatch-grad outputs are then partial sums).
 * - ADAM: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 *   p -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd * p), with
 *   p the master copy when there is one (then copied into param). */
#ifndef PS_EXEC_CPU_CPU_OPS_H
#define PS_EXEC_CPU_CPU_OPS_H

#include "exec/op_exec.h"

/* Runs op on host tiles: in[op->n_in], out[op->n_out]. ctx may be NULL for
 * ops that need neither a step nor a reduction (a group of 1 is assumed). */
ps_status ps_cpu_op_run(const ps_op *op, const ps_tile *in, ps_tile *out,
                        const ps_op_context *ctx, ps_error *err);

/* Whether ps_cpu_op_run adds output `out` of an op of this kind into its
 * tile when ctx->accumulate asks (the GEMMs with beta 1, a convolution's
 * filter gradient, the embedding gradient's scatter, ADD and REDUCE: the
 * ops that produce accumulated gradients); a bit for another output is an
 * error. */
bool ps_cpu_op_accumulates(ps_op_kind kind, int out);

#endif
