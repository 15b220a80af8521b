/* planner/lower and the program checker: every zoo family under every
 * method and both schedules lowers to programs that pass the checker, and
 * the checker catches each kind of broken program. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/program.h"
#include "planner/inter_pass.h"
#include "planner/lower.h"
#include "planner/plan_model.h"

/* Small members of each family, so that every method plans in well under a
 * second. */
static void small_config(const char *name, ps_model_config *cfg)
{
    assert_int_equal(ps_zoo_lookup(name, cfg, NULL), PS_OK);
    switch (cfg->family) {
    case PS_MODEL_MLP: cfg->hidden = 64; break;
    case PS_MODEL_GPT:
    case PS_MODEL_MOE:
        cfg->layers = 4;
        cfg->hidden = 64;
        cfg->ffn = 256;
        cfg->heads = 4;
        cfg->seq = 32;
        cfg->vocab = 256;
        if (cfg->family == PS_MODEL_MOE) {
            cfg->experts = 4;
            cfg->expert_group = 32;
        }
        break;
    case PS_MODEL_WRESNET:
        cfg->image_size = 32;
        cfg->channels = 8;
        cfg->classes = 16;
        break;
    case PS_MODEL_FAMILY_COUNT: break;
    }
}

typedef enum { M_DATA, M_ZERO2, M_ZERO3, M_SHARD, M_UNIFORM, M_AUTO, M_COUNT } method;
static const char *const method_names[M_COUNT] = {"data",  "zero2",   "zero3",
                                                  "shard", "uniform", "auto"};

/* Plans cfg on one 8-device node; NULL (with a note) when the method has
 * no plan for this model (e.g. a batch too small to split 8 ways). */
static ps_plan *plan_of(ps_model_config *cfg, method mth, bool gpipe, const ps_cluster *c)
{
    long long global = 32;
    int micro = mth >= M_UNIFORM ? 4 : 2;
    cfg->batch = global / micro;
    ps_graph *fwd = NULL;
    assert_int_equal(ps_model_build(cfg, &fwd, NULL), PS_OK);
    ps_plan_request req = {.forward = fwd, .config = cfg, .train = ps_train_options_default(),
                           .cluster = c, .global_batch = global, .micro_batches = micro,
                           .ilp = ps_ilp_options_default()};
    req.ilp.time_limit_s = 20;
    ps_inter_options o = ps_inter_options_default();
    o.gpipe = gpipe;
    o.layer_num = 2;
    ps_plan *p = NULL;
    ps_error err = {0};
    ps_status st;
    switch (mth) {
    case M_DATA: req.method = PS_METHOD_DATA; break;
    case M_ZERO2: req.method = PS_METHOD_ZERO2; break;
    case M_ZERO3: req.method = PS_METHOD_ZERO3; break;
    default: req.method = PS_METHOD_SHARD; break;
    }
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

/* Lowers p and checks the programs; returns them (the model in *m). */
static ps_program_set *lower(const ps_plan *p, ps_plan_model **m, bool local_allgather)
{
    ps_error err = {0};
    if (ps_plan_model_build(p, m, &err) != PS_OK)
        fail_msg("model: %s", err.msg);
    ps_lower_options lo = ps_lower_options_default();
    lo.local_allgather = local_allgather;
    ps_program_set *set = NULL;
    if (ps_plan_lower(p, *m, &lo, &set, &err) != PS_OK)
        fail_msg("lower: %s", err.msg);
    double *peak = calloc((size_t)set->n_devices, sizeof *peak);
    if (ps_program_set_check(set, peak, &err) != PS_OK)
        fail_msg("check %s %s: %s", p->model_name, p->method, err.msg);
    /* every device of a stage ran something and holds memory */
    for (int k = 0; k < p->n_stages; k++)
        for (int i = 0; i < p->stages[k].n_devices; i++)
            assert_true(peak[p->stages[k].devices[i]] > 0);
    free(peak);
    return set;
}

/* Kernel work equals the plan's prediction: compute over the stages' ops,
 * once per micro-batch for forward and backward. */
static void check_kernels_match_plan(const ps_plan *p, const ps_program_set *set)
{
    for (int k = 0; k < p->n_stages; k++) {
        double compute = 0, plan_compute = 0;
        for (int ph = 0; ph < PS_PHASE_COUNT; ph++) {
            int ki = set->stages[k].kernel[ph];
            if (ki < 0)
                continue;
            for (int i = 0; i < set->kernels[ki].n_instrs; i++)
                if (set->kernels[ki].instrs[i].kind == PS_INSTR_COMPUTE)
                    compute += set->kernels[ki].instrs[i].seconds;
        }
        for (int j = 0; j < p->stages[k].n_ops; j++)
            plan_compute += p->stages[k].ops[j].compute_s;
        assert_true(fabs(compute - plan_compute) <= 1e-9 * plan_compute + 1e-15);
        /* and each kernel's predicted seconds (compute, resharding, in-op
         * collectives) are the stage's predicted phase times */
        const ps_plan_stage *ps = &p->stages[k];
        double want[PS_PHASE_COUNT] = {ps->forward_s, ps->backward_s, ps->update_s};
        for (int ph = 0; ph < PS_PHASE_COUNT; ph++) {
            int ki = set->stages[k].kernel[ph];
            double got = ki >= 0 ? set->kernels[ki].seconds : 0;
            if (fabs(got - want[ph]) > 1e-6 * want[ph] + 1e-12)
                fail_msg("%s %s stage %d %s: kernel %.9g s, plan %.9g s", p->model_name,
                         p->method, k, ps_phase_names[ph], got, want[ph]);
        }
        /* every device of the stage runs forward and backward once per micro-batch */
        int d = p->stages[k].devices[0];
        int runs[PS_PHASE_COUNT] = {0};
        const ps_program *prog = &set->programs[d];
        for (int i = 0; i < prog->n_instrs; i++)
            if (prog->instrs[i].kind == PS_INSTR_RUN)
                runs[set->kernels[prog->instrs[i].kernel].phase]++;
        assert_int_equal(runs[PS_PHASE_FORWARD], p->micro_batches);
        assert_int_equal(runs[PS_PHASE_BACKWARD], p->micro_batches);
        assert_int_equal(runs[PS_PHASE_UPDATE], 1);
    }
}

static void every_family_method_and_schedule(void **state)
{
    (void)state;
    const char *models[] = {"mlp", "gpt-350m", "moe-380m", "wresnet-250m"};
    ps_cluster *c = NULL;
    assert_int_equal(ps_cluster_from_preset("dgx-a100:1", &c, NULL), PS_OK);
    int lowered = 0;
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        ps_model_config cfg;
        small_config(models[i], &cfg);
        for (int mth = 0; mth < M_COUNT; mth++)
            for (int gpipe = 0; gpipe < (mth >= M_UNIFORM ? 2 : 1); gpipe++) {
                ps_plan *p = plan_of(&cfg, (method)mth, gpipe, c);
                ps_plan_model *m = NULL;
                ps_program_set *set = lower(p, &m, true);
                check_kernels_match_plan(p, set);
                ps_program_set_free(set);
                if (p->n_stages > 1) { /* the plain cross-mesh transfers too */
                    ps_plan_model_free(m);
                    set = lower(p, &m, false);
                    ps_program_set_free(set);
                }
                ps_plan_model_free(m);
                ps_plan_free(p);
                lowered++;
            }
    }
    assert_int_equal(lowered, 4 * 8);
    ps_cluster_free(c);
}

/* The tied embedding of GPT: the last stage reads wte, the first updates it;
 * the updated value travels back after the update. */
static void tied_embedding_travels(void **state)
{
    (void)state;
    ps_model_config cfg;
    small_config("gpt-350m", &cfg);
    ps_cluster *c = NULL;
    assert_int_equal(ps_cluster_from_preset("dgx-a100:1", &c, NULL), PS_OK);
    ps_plan *p = plan_of(&cfg, M_UNIFORM, false, c);
    ps_plan_model *m = NULL;
    ps_program_set *set = lower(p, &m, true);
    int wte = ps_graph_find_tensor(m->step, "wte");
    assert_true(wte >= 0);
    int last_stage_device = p->stages[p->n_stages - 1].devices[0];
    const ps_program *prog = &set->programs[last_stage_device];
    int recv_wte = 0;
    for (int i = 0; i < prog->n_instrs; i++) {
        const ps_instr *in = &prog->instrs[i];
        if (in->kind == PS_INSTR_RECV && set->buffers[in->buffer].tensor == wte) {
            recv_wte++;
            assert_int_equal(in->mb, -1);
        }
    }
    assert_true(recv_wte >= 1);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);
    ps_cluster_free(c);
}

/* ---- the checker against broken programs ---- */

static ps_program_set *good_programs(ps_plan **p_out, ps_plan_model **m_out)
{
    ps_model_config cfg;
    small_config("gpt-350m", &cfg);
    ps_cluster *c = NULL;
    assert_int_equal(ps_cluster_from_preset("dgx-a100:1", &c, NULL), PS_OK);
    *p_out = plan_of(&cfg, M_UNIFORM, false, c);
    ps_cluster_free(c);
    return lower(*p_out, m_out, true);
}

static int find_instr(const ps_program *p, ps_instr_kind kind, int from)
{
    for (int i = from; i < p->n_instrs; i++)
        if (p->instrs[i].kind == kind)
            return i;
    return -1;
}

static void remove_instr(ps_program *p, int i)
{
    memmove(&p->instrs[i], &p->instrs[i + 1], (size_t)(p->n_instrs - i - 1) * sizeof *p->instrs);
    p->n_instrs--;
}

static void expect_failure(ps_program_set *set, const char *want)
{
    ps_error err = {0};
    assert_int_equal(ps_program_set_check(set, NULL, &err), PS_ERR_INTERNAL);
    if (strstr(err.msg, want) == NULL)
        fail_msg("expected \"%s\" in: %s", want, err.msg);
}

static void checker_catches_broken_programs(void **state)
{
    (void)state;
    ps_plan *p = NULL;
    ps_plan_model *m = NULL;
    int d0 = 0;

    /* a missing free */
    ps_program_set *set = good_programs(&p, &m);
    d0 = p->stages[0].devices[0];
    ps_program *prog = &set->programs[d0];
    int last_free = -1;
    for (int i = 0; i < prog->n_instrs; i++)
        if (prog->instrs[i].kind == PS_INSTR_FREE)
            last_free = i;
    assert_true(last_free >= 0);
    remove_instr(prog, last_free);
    expect_failure(set, "never frees");
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);

    /* a double free: the first free repeated */
    set = good_programs(&p, &m);
    prog = &set->programs[p->stages[0].devices[0]];
    int f = find_instr(prog, PS_INSTR_FREE, 0);
    ps_instr dup = prog->instrs[f];
    assert_int_equal(ps_program_append(prog, &dup), PS_OK);
    expect_failure(set, "not allocated");
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);

    /* a send whose receive is gone */
    set = good_programs(&p, &m);
    int d1 = p->stages[1].devices[0];
    prog = &set->programs[d1];
    int r = find_instr(prog, PS_INSTR_RECV, 0);
    assert_true(r >= 0);
    remove_instr(prog, r);
    expect_failure(set, "");
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);

    /* receives in the wrong order */
    set = good_programs(&p, &m);
    prog = &set->programs[p->stages[1].devices[0]];
    int r1 = find_instr(prog, PS_INSTR_RECV, 0), r2 = r1;
    while (r2 >= 0 && (prog->instrs[r2].mb == prog->instrs[r1].mb))
        r2 = find_instr(prog, PS_INSTR_RECV, r2 + 1);
    assert_true(r2 > r1);
    ps_instr tmp = prog->instrs[r1];
    prog->instrs[r1] = prog->instrs[r2];
    prog->instrs[r2] = tmp;
    expect_failure(set, "");
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);

    /* one member of a group skips a collective: deadlock or mismatch */
    set = good_programs(&p, &m);
    int k0 = set->stages[0].kernel[PS_PHASE_UPDATE];
    assert_true(k0 >= 0);
    /* give device d0 a private copy of the update kernel without its first
     * collective */
    d0 = p->stages[0].devices[0];
    prog = &set->programs[d0];
    int nk;
    assert_int_equal(ps_program_add_kernel(set, 0, PS_PHASE_UPDATE, &nk), PS_OK);
    const ps_kernel *src = &set->kernels[k0];
    bool dropped = false;
    for (int i = 0; i < src->n_instrs; i++) {
        if (!dropped && src->instrs[i].kind == PS_INSTR_COLLECTIVE &&
            set->buffers[src->instrs[i].buffer].per_microbatch == false &&
            src->instrs[i].src_buffer >= 0) {
            /* keep memory balanced: turn it into a local slice */
            ps_instr s = src->instrs[i];
            s.kind = PS_INSTR_SLICE;
            assert_int_equal(ps_kernel_append(&set->kernels[nk], &s), PS_OK);
            dropped = true;
            continue;
        }
        assert_int_equal(ps_kernel_append(&set->kernels[nk], &src->instrs[i]), PS_OK);
        src = &set->kernels[k0];
    }
    assert_true(dropped);
    for (int i = 0; i < prog->n_instrs; i++)
        if (prog->instrs[i].kind == PS_INSTR_RUN && prog->instrs[i].kernel == k0)
            prog->instrs[i].kernel = nk;
    expect_failure(set, "");
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_family_method_and_schedule),
        cmocka_unit_test(tied_embedding_travels),
        cmocka_unit_test(checker_catches_broken_programs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
