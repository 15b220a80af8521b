/* Fuzz target: plan files (core/plan.c), then what `sim` and `exec` do with
 * a plan before running it: rebuild its model (planner/plan_model.c), check
 * the stages against it and lower it (planner/lower.c).
 * Properties: a loaded plan saves and loads back with the same digest; a
 * plan that lowers gives programs that pass ps_program_set_check. */
#include "core/plan.h"
#include "core/program.h"
#include "planner/lower.h"
#include "planner/plan_model.h"
#include "tests/fuzz/fuzz_common.h"

/* The fuzzer's budget, not a property: the lowering's work grows with ops x
 * devices x micro-batches, and a fuzzer needs thousands of inputs a second. */
#define LOWER_WORK_MAX 2000000LL

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *text = fuzz_text(data, size);
    ps_error err = {0};
    ps_plan *p = NULL, *back = NULL;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_status st = ps_plan_parse("input.json", text, &p, &err);
    free(text);
    if (st != PS_OK)
        return 0;
    json_t *j = NULL;
    FUZZ_ASSERT(ps_plan_to_json(p, &j) == PS_OK, "a loaded plan did not save");
    char *saved = fuzz_dump(j);
    json_decref(j);
    FUZZ_ASSERT(ps_plan_parse("saved.json", saved, &back, &err) == PS_OK,
                "saved, then refused: %s\n%s", err.msg, saved);
    char d1[32], d2[32];
    ps_plan_digest(p, d1, sizeof d1);
    ps_plan_digest(back, d2, sizeof d2);
    FUZZ_ASSERT(strcmp(d1, d2) == 0, "loaded back different:\n%s", saved);
    free(saved);
    if (ps_plan_model_build(p, &m, &err) != PS_OK)
        goto out;
    long long work =
        (long long)m->step->n_ops * ps_cluster_device_count(p->cluster) * p->micro_batches;
    if (work > LOWER_WORK_MAX)
        goto out;
    ps_lower_options lo = ps_lower_options_default();
    if (ps_plan_lower(p, m, &lo, &set, &err) != PS_OK)
        goto out;
    FUZZ_ASSERT(ps_program_set_check(set, NULL, &err) == PS_OK, "lowered programs invalid: %s",
                err.msg);
    fuzz_accepted();
out:
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(back);
    ps_plan_free(p);
    return 0;
}
