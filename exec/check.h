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
 *   with a relative one.
 *
 * Runs that hold fp16/bf16 tensors in half precision round at different
 * points when sharded (a row-parallel matmul's partial sums are rounded
 * before the all-reduce adds them), so their tolerances are counted in the
 * storage's unit roundoff u (2^-8 bf16, 2^-11 fp16): see
 * ps_exec_tolerance_default. */
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
    double param_excess; /* largest |run - ref| / (param_abs + param_rel |ref|) */
    bool ok;     /* loss_rel, grad_rel <= rel and param_excess <= 1 */
} ps_exec_comparison;

typedef struct ps_exec_tolerance {
    double rel;        /* loss and gradients, relative */
    double grad_floor; /* a gradient's error is scaled by at least this
                          fraction of the model's largest gradient */
    double grad_min;   /* and by at least this absolute value: the smallest
                          normal of the storage (fp16: 2^-14), under which
                          values keep fewer bits (gradients as held: times
                          the loss scale, if the plan has one) */
    double param_abs;  /* updated parameters: |run - ref| <= param_abs + */
    double param_rel;  /*   param_rel * |ref| */
} ps_exec_tolerance;

/* The defaults for a run of `steps` steps whose floating-point tensors are
 * held in `storage`. fp32: rel 1e-4, floor 1e-3, parameters 5e-3 absolute.
 * fp16 and bf16: rel 32u, floor 1e-2 (and the smallest normal value),
 * parameters 5e-3 per step plus 2u relative (a unit in the last place of
 * the stored value). Per step, because Adam makes half precision's noise in
 * a gradient that is zero in exact arithmetic (an attention key bias's) a
 * full step of about lr in either direction, every step; fp32's noise stays
 * below Adam's epsilon.
 * Measured worst cases are in docs/executors.md. */
ps_exec_tolerance ps_exec_tolerance_default(ps_dtype storage, int steps);

/* The element type a run holds the step's floating-point tensors in: the
 * parameters' dtype where the backend holds half precision, else fp32. */
ps_dtype ps_exec_storage(const ps_graph *step, bool half_storage);

/* Whether any tensor of the step is fp16/bf16 (held in 2 bytes where the
 * backend holds half precision): the parameters, or only the optimizer's
 * state (fp32 parameters with --optimizer-dtype bf16). */
bool ps_exec_has_half(const ps_graph *step);

/* g/r: the run (keep_params); rg/ref: the reference. A parameter missing
 * from either side makes the comparison fail with its name. */
void ps_exec_compare(const ps_graph *g, const ps_exec_result *r, const ps_graph *rg,
                     const ps_exec_result *ref, const ps_exec_tolerance *tol,
                     ps_exec_comparison *out);

#endif
