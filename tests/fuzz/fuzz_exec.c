/* Fuzz target: `exec --plan P --backend cpu --check` (differential): a plan
 * that loads, rebuilds its model, lowers and passes the program checks is
 * run for one step on the CPU backend, one thread per device, and so is the
 * unsharded single-device plan of the same model from the same seed.
 * Properties: the run does not fail once the programs passed their checks;
 * its loss, gradients and updated parameters match the reference within
 * exec's default tolerances. The fuzzer mutates what a hand-edited plan can
 * change: layouts, meshes, devices, stages, micro-batches, the model's
 * configuration and training options. */
#include <math.h>

#include "core/plan.h"
#include "core/program.h"
#include "exec/check.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/runtime.h"
#include "planner/lower.h"
#include "planner/plan_intra.h"
#include "planner/plan_model.h"
#include "tests/fuzz/fuzz_common.h"

/* The fuzzer's budget, not properties: plans past these run too long per
 * input (threads per device, micro-batches, real arithmetic). */
#define DEVICES_MAX 8
#define MICRO_BATCHES_MAX 4
#define STEP_BYTES_MAX (16.0 * 1024 * 1024) /* every tensor of the step, once */

typedef enum { RUN_REFUSED, RUN_FAILED, RUN_OK } run_outcome;

/* Lowers p on its model *m (rebuilt from the plan first when NULL) and
 * checks the programs (RUN_REFUSED when any of these says no, as exec
 * would), then runs one step on a new CPU backend (RUN_FAILED when that
 * fails). */
static run_outcome run(const ps_plan *p, ps_plan_model **m, ps_program_set **set_out,
                       ps_exec_result **out, ps_error *err)
{
    ps_status st = PS_OK;
    run_outcome how = RUN_REFUSED;
    ps_backend *b = NULL;
    int *slots = NULL;
    if (*m == NULL)
        PS_TRY(ps_plan_model_build(p, m, err));
    ps_lower_options lo = ps_lower_options_default();
    PS_TRY(ps_plan_lower(p, *m, &lo, set_out, err));
    PS_TRY(ps_program_set_check(*set_out, NULL, err));
    how = RUN_FAILED;
    const ps_program_set *set = *set_out;
    slots = malloc((size_t)set->n_devices * sizeof *slots);
    PS_TRY_ALLOC(slots, err);
    for (int d = 0; d < set->n_devices; d++)
        slots[d] = ps_exec_timing_slots(set, d);
    PS_TRY(ps_cpu_backend_create(set->n_devices, slots, NULL, &b, err));
    ps_exec_options o = ps_exec_options_default();
    o.steps = 1;
    o.keep_params = true;
    o.source = "exec-cpu";
    PS_TRY(ps_exec_run(set, b, &o, out, err));
    how = RUN_OK;
out:
    (void)st; /* the outcome says how far it went; err says why it stopped */
    if (b != NULL)
        b->ops->destroy(b);
    free(slots);
    return how;
}

static double step_bytes(const ps_graph *step)
{
    double sum = 0;
    for (int t = 0; t < step->n_tensors; t++)
        sum += ps_tensor_bytes(&step->tensors[t]);
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *text = fuzz_text(data, size);
    ps_error err = {0};
    ps_plan *p = NULL, *ref_plan = NULL;
    ps_plan_model *m = NULL, *ref_m = NULL;
    ps_program_set *set = NULL, *ref_set = NULL;
    ps_exec_result *r = NULL, *ref = NULL;
    ps_status st = ps_plan_parse("input.json", text, &p, &err);
    free(text);
    if (st != PS_OK || ps_cluster_device_count(p->cluster) > DEVICES_MAX ||
        p->micro_batches > MICRO_BATCHES_MAX)
        goto out;
    if (ps_plan_model_build(p, &m, &err) != PS_OK ||
        step_bytes(m->step) * p->micro_batches > STEP_BYTES_MAX)
        goto out;
    /* fp16 without loss scaling underflows in the backward pass: exec --check
     * reports that mismatch by design (docs/executors.md) */
    if (ps_exec_storage(m->step, true) == PS_DTYPE_F16 && m->train.loss_scale == 1)
        goto out;
    run_outcome how = run(p, &m, &set, &r, &err);
    if (how == RUN_REFUSED)
        goto out;
    FUZZ_ASSERT(how == RUN_OK, "a plan whose programs passed their checks failed: %s", err.msg);
    FUZZ_ASSERT(ps_plan_reference(p, m, &ref_plan, &err) == PS_OK,
                "no reference plan for a plan that ran: %s", err.msg);
    FUZZ_ASSERT(run(ref_plan, &ref_m, &ref_set, &ref, &err) == RUN_OK,
                "the reference of a plan that ran failed: %s", err.msg);
    /* a model that diverges in one step (a fuzzed learning rate, say) has no
     * numbers to compare */
    if (isfinite(ref->loss[0])) {
        /* the CPU backend holds fp16/bf16 in 2 bytes */
        ps_exec_tolerance tol = ps_exec_tolerance_default(ps_exec_storage(set->step, true), 1);
        ps_exec_comparison cmp;
        ps_exec_compare(set->step, r, ref_set->step, ref, &tol, &cmp);
        FUZZ_ASSERT(cmp.ok,
                    "sharded run differs from the single device: loss %.9g vs %.9g (rel %.3g), "
                    "gradients rel %.3g (worst %s), parameters abs %.3g (worst %s)",
                    r->loss[0], ref->loss[0], cmp.loss_rel, cmp.grad_rel, cmp.grad_worst,
                    cmp.param_abs, cmp.param_worst);
        fuzz_accepted();
    }
out:
    ps_exec_result_free(r);
    ps_exec_result_free(ref);
    ps_program_set_free(set);
    ps_program_set_free(ref_set);
    ps_plan_model_free(m);
    ps_plan_model_free(ref_m);
    ps_plan_free(ref_plan);
    ps_plan_free(p);
    return 0;
}
