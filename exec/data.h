/* Deterministic parameters and synthetic batches.
 *
 * Every value is a function of (seed, tensor name, micro-batch, global
 * element index) alone, so any tile of any layout on any device gets the
 * same numbers as the whole tensor on one device: a sharded, pipelined run
 * and the single-device reference start from identical parameters and see
 * identical batches.
 * - Weights (rank >= 2): uniform in +-1/sqrt(fan_in), fan_in = global
 *   shape[0] for 2-D weights (einsum "...k,kn->...n"), the product of all
 *   dims but the last otherwise. LayerNorm/BatchNorm gamma: 1; other 1-D
 *   parameters (biases, beta): uniform in +-0.1. Optimizer state: Adam m
 *   and v zero, a master copy equal to its parameter.
 * - Inputs: integer ids uniform in [0, V) where V is the row count of the
 *   embedding table they index or the class count of the loss they label;
 *   "positions" count 0, 1, ... along the last dimension. Floats: the
 *   regression target of an MSE loss is y = T x + c of the other input x
 *   of the same shape (the seed tutorial's data: T, c fixed by the seed);
 *   other floats uniform in [-1, 1). */
#ifndef PS_EXEC_DATA_H
#define PS_EXEC_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "core/graph.h"
#include "exec/tile.h"

/* Whether x holds a parameter's values: the parameter, or an optimizer
 * state that is its master copy (filled alike). */
bool ps_exec_holds_param(const ps_tensor *x);

/* Fills host memory for tile `t` (its geometry; t->data is ignored) of
 * source tensor `tensor` of step graph g: float for floating tensors, int32
 * for integer ones. mb: micro-batch for inputs (ignored otherwise). */
ps_status ps_exec_fill(const ps_graph *g, int tensor, int mb, uint64_t seed, const ps_tile *t,
                       void *host, ps_error *err);

#endif
