/* Comparing a run with the single-device reference run (pipeshard exec
 * --check, and the executor tests).
 *
 * Three measures, matched by tensor name:
 * - loss: largest relative difference over the steps;
 * - gradients that the last update read: per parameter, the largest
 *   absolute difference over a scale, the larger of the tensor's own largest
 *   magnitude and 1e-3 of the largest over all gradients (so that a
 *   gradient that is zero in exact arithmetic, such as an attention key
 *   bias's, is judged against the model's gradient scale, not its noise);
 * - updated parameters: the largest absolute difference. Adam divides each
 *   gradient by its own running magnitude, so rounding noise in a zero
 *   gradient becomes a full-size step: parameters are compared with an
 *   absolute tolerance (Alpa's tutorial asserts 5e-3), gradients and loss
 *   with a relative one. */
#ifndef PS_EXEC_CHECK_H
#define PS_EXEC_CHECK_H

#include <stdbool.h>

#include "core/graph.h"
#include "exec/runtime.h"

typedef struct ps_exec_comparison {
    double loss_rel;
    double grad_rel;
    char grad_worst[128];
    double param_abs;
    char param_worst[128];
    int params;  /* compared */
    bool ok;     /* loss_rel, grad_rel <= rel_tol and param_abs <= param_atol */
} ps_exec_comparison;

/* g/r: the run (keep_params); rg/ref: the reference. A parameter missing
 * from either side makes the comparison fail with its name. */
void ps_exec_compare(const ps_graph *g, const ps_exec_result *r, const ps_graph *rg,
                     const ps_exec_result *ref, double rel_tol, double param_atol,
                     ps_exec_comparison *out);

#endif
