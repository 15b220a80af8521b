/* Shared by the executor tests (test_exec, test_loss_scale): small models,
 * the 8-device cluster, plans by method, and running a plan on the CPU
 * backend. Include after cmocka.h. */
#ifndef PS_TESTS_EXEC_FIXTURE_H
#define PS_TESTS_EXEC_FIXTURE_H

#include <stdlib.h>
#include <string.h>

#include "core/program.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/runtime.h"
#include "planner/inter_pass.h"
#include "planner/lower.h"
#include "planner/plan_intra.h"
#include "planner/plan_model.h"

typedef enum { M_DATA, M_ZERO3, M_SHARD, M_UNIFORM, M_AUTO, M_COUNT } method;
static const char *const method_names[M_COUNT] = {"data", "zero3", "shard", "uniform", "auto"};

static inline void small_config(const char *name, ps_model_config *cfg)
{
    assert_int_equal(ps_zoo_lookup(name, cfg, NULL), PS_OK);
    cfg->dtype = PS_DTYPE_F32;
    if (cfg->family == PS_MODEL_MLP) {
        cfg->hidden = 32;
        cfg->layers = 2;
    } else if (cfg->family == PS_MODEL_WRESNET) {
        cfg->image_size = 32;
        cfg->channels = 8;
        cfg->classes = 16;
    } else {
        cfg->layers = 2;
        cfg->hidden = 64;
        cfg->ffn = 256;
        cfg->heads = 4;
        cfg->seq = 16;
        cfg->vocab = 128;
        if (cfg->family == PS_MODEL_MOE) {
            cfg->seq = 32;
            cfg->experts = 4;
            cfg->expert_group = 32;
        }
    }
}

static inline ps_cluster *cluster_8(void)
{
    ps_cluster *c = NULL;
    ps_error err = {0};
    assert_int_equal(ps_cluster_from_preset("p3.16xlarge", &c, &err), PS_OK);
    return c;
}

/* train: the training-step options (NULL: the defaults). */
static inline ps_plan *plan_trained(ps_model_config *cfg, method mth, bool gpipe, const ps_cluster *c,
                             const ps_train_options *train)
{
    long long global = 16;
    int micro = mth >= M_UNIFORM ? 4 : 2;
    cfg->batch = global / micro;
    ps_graph *fwd = NULL;
    assert_int_equal(ps_model_build(cfg, &fwd, NULL), PS_OK);
    ps_plan_request req = {.forward = fwd, .config = cfg,
                           .train = train != NULL ? *train : ps_train_options_default(),
                           .cluster = c, .global_batch = global, .micro_batches = micro,
                           .ilp = ps_ilp_options_default()};
    req.ilp.time_limit_s = 20;
    ps_inter_options o = ps_inter_options_default();
    o.gpipe = gpipe;
    ps_plan *p = NULL;
    ps_error err = {0};
    ps_status st;
    req.method = mth == M_DATA ? PS_METHOD_DATA : mth == M_ZERO3 ? PS_METHOD_ZERO3 : PS_METHOD_SHARD;
    if (mth == M_UNIFORM)
        st = ps_plan_uniform(&req, &o, 2, 2, 2, &p, &err);
    else if (mth == M_AUTO)
        st = ps_plan_pipeshard(&req, &o, &p, &err);
    else
        st = ps_plan_one_stage(&req, &p, NULL, NULL, &err);
    ps_graph_free(fwd);
    if (st != PS_OK)
        fail_msg("%s %s: %s", cfg->name, method_names[mth], err.msg);
    return p;
}

static inline ps_plan *plan_of(ps_model_config *cfg, method mth, bool gpipe, const ps_cluster *c)
{
    return plan_trained(cfg, mth, gpipe, c, NULL);
}

typedef struct run {
    ps_plan_model *m;
    ps_program_set *set;
    ps_exec_result *r;
} run;

/* fp32_storage: fp16/bf16 tensors held in fp32 (pipeshard exec --fp32).
 * adjust (may be NULL) sees the new backend before the run: a test may swap
 * its ops table (the backend's own comes back before it is destroyed). */
static inline ps_status run_plan_adjusted(const ps_plan *p, const ps_exec_options *o,
                                          bool fp32_storage, void (*adjust)(ps_backend *),
                                          run *out, ps_error *err)
{
    memset(out, 0, sizeof *out);
    ps_status st = PS_OK;
    ps_backend *b = NULL;
    const ps_backend_ops *own = NULL;
    int *slots = NULL;
    ps_lower_options lo = ps_lower_options_default();
    PS_TRY(ps_plan_model_build(p, &out->m, err));
    PS_TRY(ps_plan_lower(p, out->m, &lo, &out->set, err));
    PS_TRY(ps_program_set_check(out->set, NULL, err));
    slots = malloc((size_t)out->set->n_devices * sizeof *slots);
    for (int d = 0; d < out->set->n_devices; d++)
        slots[d] = ps_exec_timing_slots(out->set, d);
    PS_TRY(ps_cpu_backend_create(out->set->n_devices, slots, NULL, &b, err));
    own = b->ops;
    if (fp32_storage)
        b->half_storage = false;
    if (adjust != NULL)
        adjust(b);
    PS_TRY(ps_exec_run(out->set, b, o, &out->r, err));
out:
    if (b != NULL) {
        b->ops = own;
        b->ops->destroy(b);
    }
    free(slots);
    return st;
}

static inline ps_status run_plan_held(const ps_plan *p, const ps_exec_options *o,
                                      bool fp32_storage, run *out, ps_error *err)
{
    return run_plan_adjusted(p, o, fp32_storage, NULL, out, err);
}

static inline ps_status run_plan(const ps_plan *p, const ps_exec_options *o, run *out, ps_error *err)
{
    return run_plan_held(p, o, false, out, err);
}

static inline void run_free(run *r)
{
    ps_exec_result_free(r->r);
    ps_program_set_free(r->set);
    ps_plan_model_free(r->m);
}

/* The losses of the first `steps` steps of runs a and b are equal bit for bit. */
static inline void expect_same_losses(const run *a, const run *b, int steps, const char *what)
{
    for (int s = 0; s < steps; s++)
        if (memcmp(&a->r->loss[s], &b->r->loss[s], sizeof(double)) != 0)
            fail_msg("%s step %d: loss %.17g, want %.17g", what, s + 1, a->r->loss[s],
                     b->r->loss[s]);
}

/* Every parameter element of run a equals b's bit for bit; with
 * grad_factor > 0, every gradient equals grad_factor times b's, exactly.
 * Returns the elements compared; *nonzero (may be NULL): of b's gradients,
 * those not zero. */
static inline int64_t expect_same_params(const run *a, const run *b, double grad_factor,
                                         int64_t *nonzero, const char *what)
{
    const ps_graph *g = a->set->step;
    int64_t compared = 0, nz = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        if (a->r->params[t] == NULL)
            continue;
        assert_non_null(b->r->params[t]);
        for (int64_t e = 0, n = ps_tensor_numel(&g->tensors[t]); e < n; e++) {
            float pa = a->r->params[t][e], pb = b->r->params[t][e];
            if (memcmp(&pa, &pb, sizeof pa) != 0)
                fail_msg("%s: %s[%lld] is %.9g, want %.9g", what, g->tensors[t].name,
                         (long long)e, pa, pb);
            if (grad_factor > 0) {
                assert_non_null(a->r->grads[t]);
                assert_non_null(b->r->grads[t]);
                float ga = a->r->grads[t][e], want = (float)(grad_factor * b->r->grads[t][e]);
                if (memcmp(&ga, &want, sizeof ga) != 0)
                    fail_msg("%s: gradient %s[%lld] is %.9g, want %.9g", what,
                             g->tensors[t].name, (long long)e, ga, want);
                nz += b->r->grads[t][e] != 0;
            }
            compared++;
        }
    }
    assert_true(compared > 0);
    if (nonzero != NULL)
        *nonzero = nz;
    return compared;
}

#endif
