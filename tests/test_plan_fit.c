/* planner/plan_fit: plans whose lowered programs fit their devices. A
 * planner whose estimates are too low (planning with twice the memory) is
 * made to plan again with less until its programs fit; the plan keeps the
 * cluster's memory; where none fits, or a later attempt fails, the error
 * says what was tried. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/bytes_text.h"
#include "core/cluster.h"
#include "planner/models/zoo.h"
#include "planner/plan_fit.h"

#define MiB (1024.0 * 1024.0)

typedef struct fixture {
    ps_model_config cfg;
    ps_graph *fwd;
    ps_cluster *cluster;
    ps_plan_request req;
} fixture;

/* A small GPT (8 blocks, hidden 512) in 4 micro-batches of 16, one stage
 * sharded over 4 devices of `memory_mib` each. */
static void fixture_make(fixture *f, double memory_mib)
{
    memset(f, 0, sizeof *f);
    ps_error err = {0};
    assert_int_equal(ps_zoo_lookup("gpt-350m", &f->cfg, NULL), PS_OK);
    f->cfg.layers = 8;
    f->cfg.hidden = 512;
    f->cfg.ffn = 2048;
    f->cfg.heads = 8;
    f->cfg.seq = 256;
    f->cfg.vocab = 4096;
    f->cfg.batch = 16;
    assert_int_equal(ps_model_build(&f->cfg, &f->fwd, &err), PS_OK);
    ps_cluster *node = NULL;
    assert_int_equal(ps_cluster_from_preset("p3.16xlarge:1", &node, &err), PS_OK);
    ps_device_kind kind = node->kinds[0];
    kind.memory_bytes = memory_mib * MiB;
    assert_int_equal(ps_cluster_create("small4", 1, 4, &kind, &node->intra, &node->inter,
                                       &f->cluster, &err),
                     PS_OK);
    ps_cluster_free(node);
    f->req = (ps_plan_request){.forward = f->fwd, .config = &f->cfg,
                               .train = ps_train_options_default(), .cluster = f->cluster,
                               .method = PS_METHOD_SHARD, .global_batch = 64,
                               .micro_batches = 4, .ilp = ps_ilp_options_default()};
}

static void fixture_clear(fixture *f)
{
    ps_graph_free(f->fwd);
    ps_cluster_free(f->cluster);
}

/* The planner under test: one sharded stage, recording the memory per
 * device each attempt planned with; fails from attempt `fail_at` on. */
typedef struct recorder {
    int calls, fail_at;
    double memory[8];
    const ps_cluster *plan_on; /* plans on this cluster instead, if set: a planner that
                                * writes plans that do not fit (as uniform plans are) */
} recorder;

static ps_status one_stage(const ps_plan_request *req, void *ctx, ps_plan **out, ps_error *err)
{
    recorder *rec = ctx;
    if (rec->calls < 8)
        rec->memory[rec->calls] = req->cluster->kinds[0].memory_bytes;
    rec->calls++;
    if (rec->fail_at > 0 && rec->calls >= rec->fail_at)
        return ps_error_set(err, PS_ERR_INFEASIBLE, "the test's planner gives up");
    ps_plan_request r = *req;
    if (rec->plan_on != NULL)
        r.cluster = rec->plan_on;
    return ps_plan_one_stage(&r, out, NULL, NULL, err);
}

/* The programs' peak of the plan made with unlimited memory: the memory
 * the tests below set their devices just under. */
static double unconstrained_peak(void)
{
    fixture f;
    fixture_make(&f, 1e6);
    recorder rec = {0};
    ps_plan *p = NULL;
    ps_plan_fit fit;
    ps_error err = {0};
    ps_plan_fit_options o = ps_plan_fit_options_default();
    if (ps_plan_fitting(&f.req, &o, one_stage, &rec, &p, &fit, &err) != PS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(fit.attempts, 1);
    assert_int_equal(rec.calls, 1);
    assert_true(fit.programs.peak_bytes > 0 && fit.programs.peak_bytes <= 1e6 * MiB);
    double peak = fit.programs.max_peak_bytes;
    ps_plan_free(p);
    fixture_clear(&f);
    return peak;
}

static void planned_again_until_the_programs_fit(void **state)
{
    (void)state;
    double peak = unconstrained_peak();
    /* devices just under what the fastest layout's programs need: planned
     * with twice their memory, the first plan is that layout and does not
     * fit; the next attempts plan with less and fit */
    double memory_mib = floor(0.9 * peak / MiB);
    fixture f;
    fixture_make(&f, memory_mib);
    recorder rec = {0};
    ps_plan *p = NULL;
    ps_plan_fit fit;
    ps_error err = {0};
    ps_plan_fit_options o = ps_plan_fit_options_default();
    o.memory_scale = 2;
    if (ps_plan_fitting(&f.req, &o, one_stage, &rec, &p, &fit, &err) != PS_OK)
        fail_msg("%.0f MiB devices: %s", memory_mib, err.msg);
    print_message("# fastest layout's programs %.2f MiB; on %.0f MiB devices planned %d times, "
                  "%.2f MiB less the last; programs %.2f MiB\n",
                  peak / MiB, memory_mib, fit.attempts, fit.cut_bytes / MiB,
                  fit.programs.peak_bytes / MiB);
    assert_in_range(fit.attempts, 2, o.attempts);
    assert_int_equal(rec.calls, fit.attempts);
    assert_true(rec.memory[0] == 2 * memory_mib * MiB);
    for (int k = 1; k < fit.attempts; k++)
        assert_true(rec.memory[k] < rec.memory[k - 1]);
    assert_true(rec.memory[fit.attempts - 1] == 2 * memory_mib * MiB - fit.cut_bytes);
    assert_true(fit.programs.peak_bytes <= memory_mib * MiB);
    assert_true(fit.programs.memory_bytes == memory_mib * MiB);
    /* the plan keeps the cluster's memory, and the cluster is untouched */
    assert_true(p->cluster->kinds[0].memory_bytes == memory_mib * MiB);
    assert_true(f.cluster->kinds[0].memory_bytes == memory_mib * MiB);
    ps_plan_free(p);

    /* unchecked: the first plan, whatever it needs */
    rec = (recorder){0};
    o.check = false;
    assert_int_equal(ps_plan_fitting(&f.req, &o, one_stage, &rec, &p, &fit, &err), PS_OK);
    assert_int_equal(fit.attempts, 1);
    assert_true(fit.programs.peak_bytes == 0);
    ps_plan_free(p);

    /* one attempt allowed: no plan, and the numbers */
    rec = (recorder){0};
    o.check = true;
    o.attempts = 1;
    assert_int_equal(ps_plan_fitting(&f.req, &o, one_stage, &rec, &p, &fit, &err),
                     PS_ERR_INFEASIBLE);
    assert_null(p);
    assert_non_null(strstr(err.msg, "no plan found that fits in memory: the plan's programs "
                                    "need "));
    char want[64], have[32];
    snprintf(want, sizeof want, "more than its %s",
             ps_bytes_text(memory_mib * MiB, have, sizeof have));
    assert_non_null(strstr(err.msg, want));

    /* a later attempt's failure says why it planned again */
    rec = (recorder){.fail_at = 2};
    o.attempts = 4;
    ps_error_clear(&err);
    assert_int_equal(ps_plan_fitting(&f.req, &o, one_stage, &rec, &p, &fit, &err),
                     PS_ERR_INFEASIBLE);
    assert_null(p);
    assert_non_null(strstr(err.msg, "a plan's programs did not fit in memory, and planning "
                                    "again with "));
    assert_non_null(strstr(err.msg, "the test's planner gives up"));

    /* a first attempt's failure is the planner's own */
    rec = (recorder){.fail_at = 1};
    ps_error_clear(&err);
    assert_int_equal(ps_plan_fitting(&f.req, &o, one_stage, &rec, &p, &fit, &err),
                     PS_ERR_INFEASIBLE);
    assert_string_equal(err.msg, "the test's planner gives up");
    fixture_clear(&f);
}

/* A plan whose programs need 4 times their devices' memory (a planner that
 * writes plans that do not fit, as uniform plans are): no memory is left to
 * plan again with, so the first attempt is the last, with the numbers. */
static void hopeless_plan_fails_at_once(void **state)
{
    (void)state;
    double peak = unconstrained_peak();
    fixture big, f;
    fixture_make(&big, 1e6);
    fixture_make(&f, peak / MiB / 4);
    recorder rec = {.plan_on = big.cluster};
    ps_plan *p = NULL;
    ps_plan_fit fit;
    ps_error err = {0};
    ps_plan_fit_options o = ps_plan_fit_options_default();
    assert_int_equal(ps_plan_fitting(&f.req, &o, one_stage, &rec, &p, &fit, &err),
                     PS_ERR_INFEASIBLE);
    assert_null(p);
    assert_int_equal(rec.calls, 1);
    assert_int_equal(fit.attempts, 1);
    assert_non_null(strstr(err.msg, "no plan found that fits in memory: the plan's programs "
                                    "need "));
    assert_non_null(strstr(err.msg, "try --remat, more micro-batches or more devices"));
    /* a plan that recomputes already is not told to */
    f.req.train.remat = true;
    rec.calls = 0;
    ps_error_clear(&err);
    assert_int_equal(ps_plan_fitting(&f.req, &o, one_stage, &rec, &p, &fit, &err),
                     PS_ERR_INFEASIBLE);
    assert_non_null(strstr(err.msg, "; try more micro-batches or more devices"));
    fixture_clear(&f);
    fixture_clear(&big);
}

static void bad_options(void **state)
{
    (void)state;
    fixture f;
    fixture_make(&f, 1024);
    recorder rec = {0};
    ps_plan *p = NULL;
    ps_plan_fit fit;
    ps_error err = {0};
    ps_plan_fit_options o = ps_plan_fit_options_default();
    o.attempts = 0;
    assert_int_equal(ps_plan_fitting(&f.req, &o, one_stage, &rec, &p, &fit, &err),
                     PS_ERR_INVALID);
    o = ps_plan_fit_options_default();
    o.memory_scale = 0.5;
    assert_int_equal(ps_plan_fitting(&f.req, &o, one_stage, &rec, &p, &fit, &err),
                     PS_ERR_INVALID);
    o.memory_scale = NAN;
    assert_int_equal(ps_plan_fitting(&f.req, &o, one_stage, &rec, &p, &fit, &err),
                     PS_ERR_INVALID);
    assert_int_equal(rec.calls, 0);
    assert_null(p);
    fixture_clear(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hopeless_plan_fails_at_once),
        cmocka_unit_test(planned_again_until_the_programs_fit),
        cmocka_unit_test(bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
