/* Plans the tests build from a model configuration: cmocka assertions on
 * every step, so a test reads as the plan it wants. Include after cmocka.h. */
#ifndef PS_TESTS_PLAN_FIXTURE_H
#define PS_TESTS_PLAN_FIXTURE_H

#include "planner/inter_pass.h"
#include "planner/plan_model.h"

/* Alpa's uniform dp x op x pp plan of cfg (its batch set from global and
 * micro) on cluster c; the caller frees it. */
static inline ps_plan *uniform_plan_of(ps_model_config *cfg, const ps_cluster *c, long long global,
                                       int micro, int dp, int op, int pp)
{
    cfg->batch = global / micro;
    ps_graph *fwd = NULL;
    assert_int_equal(ps_model_build(cfg, &fwd, NULL), PS_OK);
    ps_plan_request req = {.forward = fwd, .config = cfg, .train = ps_train_options_default(),
                           .cluster = c, .global_batch = global, .micro_batches = micro,
                           .ilp = ps_ilp_options_default(), .method = PS_METHOD_SHARD};
    ps_inter_options o = ps_inter_options_default();
    ps_plan *p = NULL;
    ps_error err = {0};
    if (ps_plan_uniform(&req, &o, dp, op, pp, &p, &err) != PS_OK)
        fail_msg("uniform %d x %d x %d: %s", dp, op, pp, err.msg);
    ps_graph_free(fwd);
    return p;
}

#endif
