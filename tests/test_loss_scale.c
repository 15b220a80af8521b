/* Dynamic loss scaling: the scaler's state machine in closed form; the
 * overflow vote in the lowered programs (once per device, after every
 * gradient's synchronisation, before every optimizer op, over the whole
 * plan); and runs on the CPU backend cross-checked against static scaling:
 * in fp32 a power-of-two scale changes nothing, bit for bit; an fp16 run
 * that starts too high skips exactly the steps whose static counterpart
 * overflows and then trains as the static run at the scale it settled on;
 * an overflow seen on one device skips the step on every device of every
 * stage; an overflow at the lowest scale stops the run with its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "exec/loss_scale.h"
#include "sim/sim.h"
#include "tests/exec_fixture.h"

/* ---- the state machine ---- */

static void test_scaler_state_machine(void **state)
{
    (void)state;
    ps_loss_scaler s;
    ps_error err = {0};
    /* window 3: three applied steps in a row double, an overflow halves and
     * restarts the count */
    ps_loss_scaler_init(&s, 1024, 3);
    const bool overflow[] = {false, false, true, false, false, false, false, true, true, false};
    const double want_after[] = {1024, 1024, 512, 512, 512, 1024, 1024, 512, 256, 256};
    for (int i = 0; i < 10; i++) {
        assert_int_equal(ps_loss_scaler_update(&s, overflow[i], i + 1, &err), PS_OK);
        if (s.scale != want_after[i])
            fail_msg("after step %d: scale %g, want %g", i + 1, s.scale, want_after[i]);
    }
    assert_int_equal(s.applied, 7);
    assert_int_equal(s.skipped, 3);
    /* the floor is 1: an overflow there is an error that names step and scale */
    ps_loss_scaler_init(&s, 4, 1000);
    assert_int_equal(ps_loss_scaler_update(&s, true, 1, &err), PS_OK);
    assert_int_equal(ps_loss_scaler_update(&s, true, 2, &err), PS_OK);
    assert_true(s.scale == 1);
    assert_int_equal(ps_loss_scaler_update(&s, true, 3, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "step 3"));
    assert_non_null(strstr(err.msg, "loss scale 1,"));
    /* a scale that starts under 1 is its own floor; growth stops at 2^40 */
    ps_loss_scaler_init(&s, 0.25, 1);
    assert_int_equal(ps_loss_scaler_update(&s, true, 1, &err), PS_ERR_INVALID);
    ps_loss_scaler_init(&s, 0x1p39, 1);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ps_loss_scaler_update(&s, false, i + 1, &err), PS_OK);
    assert_true(s.scale == 0x1p40);
    assert_int_equal(s.applied, 3);
}

/* ---- the vote in the programs ---- */

static ps_train_options dynamic_options(double initial, int window)
{
    ps_train_options t = ps_train_options_default();
    t.dynamic_loss_scale = true;
    t.loss_scale = initial;
    t.loss_scale_window = window;
    return t;
}

static bool is_vote(const ps_instr *in)
{
    return in->kind == PS_INSTR_COLLECTIVE && (in->flags & PS_INSTR_FINITE_VOTE);
}

static void check_votes(const ps_program_set *set)
{
    /* the group: every device of every stage, once */
    int n_devices = 0, group = -1;
    for (int k = 0; k < set->n_stages; k++)
        n_devices += set->stages[k].n_devices;
    for (int d = 0; d < set->n_devices; d++) {
        const ps_program *p = &set->programs[d];
        if (p->stage < 0)
            continue;
        int votes = 0, runs_before = 0, update_runs = 0;
        for (int i = 0; i < p->n_instrs; i++) {
            const ps_instr *pi = &p->instrs[i];
            assert_false(is_vote(pi)); /* kernels only */
            if (pi->kind != PS_INSTR_RUN)
                continue;
            const ps_kernel *k = &set->kernels[pi->kernel];
            if (k->phase != PS_PHASE_UPDATE) {
                runs_before++;
                continue;
            }
            update_runs++;
            /* the buffers the ADAMs read as gradients, and where the vote is */
            int vote_at = -1;
            for (int j = 0; j < k->n_instrs; j++)
                if (is_vote(&k->instrs[j])) {
                    assert_int_equal(vote_at, -1);
                    vote_at = j;
                }
            assert_true(vote_at >= 0);
            const ps_instr *v = &k->instrs[vote_at];
            if (group < 0)
                group = v->group;
            assert_int_equal(v->group, group);
            assert_int_equal(v->axis, -1);
            assert_int_equal(set->groups[group].n, n_devices);
            int listed = 0;
            for (const int *b = &set->operands[v->operands]; *b >= 0; b++)
                listed++;
            int adams = 0;
            for (int j = 0; j < k->n_instrs; j++) {
                const ps_instr *in = &k->instrs[j];
                if (in->kind != PS_INSTR_COMPUTE || set->step->ops[in->op].kind != PS_OP_ADAM)
                    continue;
                if (j < vote_at)
                    fail_msg("device %d: %s runs before the vote", d,
                             set->step->ops[in->op].name);
                int grad = set->operands[in->operands + 1];
                bool checked = false;
                for (const int *b = &set->operands[v->operands]; *b >= 0; b++)
                    checked |= *b == grad;
                if (!checked)
                    fail_msg("device %d: the vote does not check %s's gradient", d,
                             set->step->ops[in->op].name);
                /* whatever writes that gradient buffer comes before the vote */
                for (int w = vote_at + 1; w < k->n_instrs; w++) {
                    const ps_instr *x = &k->instrs[w];
                    bool writes = (x->kind == PS_INSTR_COLLECTIVE || x->kind == PS_INSTR_SLICE) &&
                                  x->buffer == grad;
                    if (writes)
                        fail_msg("device %d: %s's gradient is written after the vote", d,
                                 set->step->ops[in->op].name);
                }
                adams++;
            }
            assert_int_equal(listed, adams);
            votes++;
        }
        assert_int_equal(update_runs, 1);
        assert_int_equal(votes, 1);
        assert_true(runs_before > 0);
    }
    assert_true(group >= 0);
}

/* A dynamic plan's programs pass the checker (every member enters the vote,
 * no deadlock across the stages), hold one vote per device, and the
 * simulator replays them with the vote in the timeline. The static plan
 * has none. */
static void test_vote_in_programs(void **state)
{
    (void)state;
    ps_cluster *c = cluster_8();
    const char *const models[] = {"gpt-350m", "mlp", "gpt-350m"};
    const method methods[] = {M_UNIFORM, M_SHARD, M_ZERO3};
    for (int i = 0; i < 3; i++) {
        for (int dynamic = 0; dynamic < 2; dynamic++) {
            ps_model_config cfg;
            small_config(models[i], &cfg);
            ps_train_options t = dynamic ? dynamic_options(1024, 100) : ps_train_options_default();
            ps_plan *p = plan_trained(&cfg, methods[i], false, c, &t);
            ps_plan_model *m = NULL;
            ps_program_set *set = NULL;
            ps_error err = {0};
            ps_lower_options lo = ps_lower_options_default();
            assert_int_equal(ps_plan_model_build(p, &m, &err), PS_OK);
            assert_int_equal(ps_plan_lower(p, m, &lo, &set, &err), PS_OK);
            if (ps_program_set_check(set, NULL, &err) != PS_OK)
                fail_msg("%s %s: %s", models[i], method_names[methods[i]], err.msg);
            int votes = 0;
            for (int k = 0; k < set->n_kernels; k++)
                for (int j = 0; j < set->kernels[k].n_instrs; j++)
                    votes += is_vote(&set->kernels[k].instrs[j]);
            if (dynamic) {
                check_votes(set);
                assert_true(set->loss_scale == 1024);
                assert_int_equal(set->loss_scale_window, 100);
            } else {
                assert_int_equal(votes, 0);
                assert_int_equal(set->loss_scale_window, 0);
            }
            if (dynamic && methods[i] == M_UNIFORM) {
                char trace[] = "/tmp/ps_test_vote_XXXXXX";
                int fd = mkstemp(trace);
                assert_true(fd >= 0);
                close(fd);
                ps_sim_options so = ps_sim_options_default();
                so.trace_path = trace;
                ps_summary *sum = NULL;
                if (ps_sim_run(set, c, &so, &sum, NULL, &err) != PS_OK)
                    fail_msg("sim: %s", err.msg);
                assert_true(sum->iteration_s > 0);
                FILE *f = fopen(trace, "r");
                assert_non_null(f);
                char line[4096];
                int spans = 0;
                while (fgets(line, sizeof line, f) != NULL)
                    spans += strstr(line, "finite vote group") != NULL;
                fclose(f);
                unlink(trace);
                int voters = 0;
                for (int k = 0; k < set->n_stages; k++)
                    voters += set->stages[k].n_devices;
                assert_int_equal(spans, voters); /* one span per device */
                ps_summary_free(sum);
            }
            printf("  %-9s %-7s %s: %d votes in %d kernels\n", models[i],
                   method_names[methods[i]], dynamic ? "dynamic" : "static ", votes,
                   set->n_kernels);
            ps_program_set_free(set);
            ps_plan_model_free(m);
            ps_plan_free(p);
        }
    }
    ps_cluster_free(c);
}

/* ---- runs ---- */

/* `steps` steps of p (seed 5, parameters and gradients kept); adjust as in
 * run_plan_adjusted (NULL: the plain CPU backend). */
static ps_status run_steps(const ps_plan *p, int steps, void (*adjust)(ps_backend *), run *out,
                           ps_error *err)
{
    ps_exec_options o = ps_exec_options_default();
    o.steps = steps;
    o.keep_params = true;
    o.seed = 5;
    return run_plan_adjusted(p, &o, false, adjust, out, err);
}

static void run_or_fail(const ps_plan *p, int steps, run *r, const char *what)
{
    ps_error err = {0};
    if (run_steps(p, steps, NULL, r, &err) != PS_OK)
        fail_msg("%s: %s", what, err.msg);
}

/* In fp32 a power-of-two scale is exact: a dynamic run whose scale doubles
 * every step (window 1) loses, learns and updates exactly as the static run
 * at its first scale, and its last gradients are the static ones times the
 * last step's scale over the static one. */
static void test_dynamic_exact_in_fp32(void **state)
{
    (void)state;
    ps_cluster *c = cluster_8();
    const char *const models[] = {"mlp", "gpt-350m", "moe-380m"};
    const method methods[] = {M_UNIFORM, M_UNIFORM, M_DATA};
    const int steps = 3;
    for (int i = 0; i < 3; i++) {
        run r[2];
        for (int k = 0; k < 2; k++) {
            ps_model_config cfg;
            small_config(models[i], &cfg);
            ps_train_options t = dynamic_options(1024, 1);
            t.dynamic_loss_scale = k == 1;
            ps_plan *p = plan_trained(&cfg, methods[i], false, c, &t);
            run_or_fail(p, steps, &r[k], models[i]);
            ps_plan_free(p);
        }
        expect_same_losses(&r[1], &r[0], steps, models[i]);
        for (int s = 0; s < steps; s++) {
            assert_true(r[1].r->loss_scale[s] == 1024 * pow(2, s));
            assert_false(r[1].r->skipped[s]);
            assert_true(r[0].r->loss_scale[s] == 0); /* static: no vote */
        }
        int64_t n = expect_same_params(&r[1], &r[0], pow(2, steps - 1), NULL, models[i]);
        printf("  %-9s %lld parameters equal over %d steps at scales 1024 to %g\n", models[i],
               (long long)n, steps, r[1].r->loss_scale[steps - 1]);
        run_free(&r[0]);
        run_free(&r[1]);
    }
    ps_cluster_free(c);
}

/* fp16 from 2^40: the first k steps overflow and are skipped, halving the
 * scale each time; k is what the run finds, and the brute force agrees:
 * the static run at the scale before the last skip overflows, and the
 * static run at the scale it settled on gives the same losses, parameters
 * and gradients as the dynamic run's applied steps, bit for bit (skipped
 * steps leave the parameters, the moments and Adam's step count alone;
 * every step reads the same batch). */
static void test_fp16_overflow_skips(void **state)
{
    (void)state;
    ps_cluster *c = cluster_8();
    const int steps = 26, window = 1000;
    ps_model_config cfg;
    small_config("gpt-350m", &cfg);
    cfg.dtype = PS_DTYPE_F16;
    ps_train_options t = dynamic_options(0x1p40, window);
    ps_plan *p = plan_trained(&cfg, M_UNIFORM, false, c, &t);
    run dyn;
    run_or_fail(p, steps, &dyn, "dynamic fp16");
    ps_plan_free(p);
    int k = 0;
    while (k < steps && dyn.r->skipped[k])
        k++;
    for (int s = 0; s < steps; s++) {
        double want = s <= k ? 0x1p40 / pow(2, s) : 0x1p40 / pow(2, k);
        if (dyn.r->loss_scale[s] != want)
            fail_msg("step %d ran at %g, want %g", s + 1, dyn.r->loss_scale[s], want);
        if (s > k)
            assert_false(dyn.r->skipped[s]);
        if (s > 0 && s <= k) /* nothing changed: the same loss */
            assert_true(dyn.r->loss[s] == dyn.r->loss[0]);
    }
    if (k == 0 || k >= steps - 1)
        fail_msg("%d of %d steps skipped: the test wants some of both", k, steps);
    double settled = 0x1p40 / pow(2, k);
    /* one scale up overflows when run statically */
    t = ps_train_options_default();
    t.loss_scale = settled * 2;
    small_config("gpt-350m", &cfg);
    cfg.dtype = PS_DTYPE_F16;
    p = plan_trained(&cfg, M_UNIFORM, false, c, &t);
    run bad;
    ps_error err = {0};
    assert_int_equal(run_steps(p, 1, NULL, &bad, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "overflowed it"));
    run_free(&bad);
    ps_plan_free(p);
    /* the settled scale, statically, for the applied steps */
    t.loss_scale = settled;
    small_config("gpt-350m", &cfg);
    cfg.dtype = PS_DTYPE_F16;
    p = plan_trained(&cfg, M_UNIFORM, false, c, &t);
    run ref;
    run_or_fail(p, steps - k, &ref, "static fp16 at the settled scale");
    ps_plan_free(p);
    for (int s = 0; s < steps - k; s++)
        if (dyn.r->loss[k + s] != ref.r->loss[s])
            fail_msg("applied step %d: loss %.17g, static %.17g", s + 1, dyn.r->loss[k + s],
                     ref.r->loss[s]);
    int64_t n = expect_same_params(&dyn, &ref, 1, NULL, "fp16 after the skips");
    printf("  fp16 gpt from 2^40: %d steps skipped, settled at %g; %lld parameters equal the "
           "static run's\n",
           k, settled, (long long)n);
    run_free(&dyn);
    run_free(&ref);
    ps_cluster_free(c);
}

/* Warm-up steps leave the loss scale where it starts: fp16 from 2^40 skips
 * its first steps whatever steps ran before, and after 3 warm-up steps (which
 * overflow too) 6 steps give the scales, skips, losses and parameters of 6
 * steps without warm-up, bit for bit. */
static void test_warmup_restarts_the_scale(void **state)
{
    (void)state;
    ps_cluster *c = cluster_8();
    ps_model_config cfg;
    small_config("gpt-350m", &cfg);
    cfg.dtype = PS_DTYPE_F16;
    ps_train_options t = dynamic_options(0x1p40, 1000);
    ps_plan *p = plan_trained(&cfg, M_UNIFORM, false, c, &t);
    run r[2];
    for (int k = 0; k < 2; k++) {
        ps_exec_options o = ps_exec_options_default();
        o.steps = 6;
        o.warmup_steps = k == 0 ? 0 : 3;
        o.keep_params = true;
        o.seed = 5;
        ps_error err = {0};
        if (run_plan_adjusted(p, &o, false, NULL, &r[k], &err) != PS_OK)
            fail_msg("warm-up %d: %s", o.warmup_steps, err.msg);
    }
    assert_true(r[0].r->skipped[0]); /* 2^40 overflows: the warm-up steps did too */
    for (int s = 0; s < 6; s++)
        if (r[1].r->loss_scale[s] != r[0].r->loss_scale[s] ||
            r[1].r->skipped[s] != r[0].r->skipped[s])
            fail_msg("step %d after warm-up: scale %g%s, without %g%s", s + 1,
                     r[1].r->loss_scale[s], r[1].r->skipped[s] ? " (skipped)" : "",
                     r[0].r->loss_scale[s], r[0].r->skipped[s] ? " (skipped)" : "");
    expect_same_losses(&r[1], &r[0], 6, "after warm-up");
    expect_same_params(&r[1], &r[0], 1, NULL, "after warm-up");
    run_free(&r[0]);
    run_free(&r[1]);
    ps_plan_free(p);
    ps_cluster_free(c);
}

/* ---- overflows injected into the vote ---- */

static ps_backend_ops inject_ops;
static const ps_backend_ops *inject_real;
static int inject_device = -1; /* -1: every device */
static int inject_call = 0;    /* its nth call (1-based) reports inf; 0: every call */
static int inject_calls[64];

static ps_status inject_find(ps_backend *b, int device, const ps_tile *tiles, int n, bool *found,
                             ps_error *err)
{
    PS_TRY_RET(inject_real->find_nonfinite(b, device, tiles, n, found, err));
    int call = ++inject_calls[device]; /* each device's own counter: no race */
    if ((inject_device < 0 || device == inject_device) && (inject_call == 0 || call == inject_call))
        *found = true;
    return PS_OK;
}

static void inject_into(ps_backend *b)
{
    memset(inject_calls, 0, sizeof inject_calls);
    inject_real = b->ops;
    inject_ops = *b->ops;
    inject_ops.find_nonfinite = inject_find;
    b->ops = &inject_ops;
}

/* One device of one stage reports an overflow at step 2: every device of
 * both stages skips the update, so after 3 steps the parameters are those
 * of 2 clean steps, bit for bit (fp32: the halved scale changes nothing),
 * and the loss of step 3 is that of step 2. */
static void test_one_device_skips_all(void **state)
{
    (void)state;
    ps_cluster *c = cluster_8();
    ps_model_config cfg;
    small_config("gpt-350m", &cfg);
    ps_train_options t = dynamic_options(1024, 1000);
    ps_plan *p = plan_trained(&cfg, M_UNIFORM, false, c, &t);
    run clean;
    run_or_fail(p, 2, &clean, "clean");
    const int devices[] = {1, 6}; /* stage 0, stage 1 */
    for (int i = 0; i < 2; i++) {
        inject_device = devices[i];
        inject_call = 2;
        run r;
        ps_error err = {0};
        if (run_steps(p, 3, inject_into, &r, &err) != PS_OK)
            fail_msg("injected on device %d: %s", devices[i], err.msg);
        assert_false(r.r->skipped[0]);
        assert_true(r.r->skipped[1]);
        assert_false(r.r->skipped[2]);
        assert_true(r.r->loss_scale[0] == 1024 && r.r->loss_scale[1] == 1024 &&
                    r.r->loss_scale[2] == 512);
        assert_true(r.r->loss[0] == clean.r->loss[0]);
        assert_true(r.r->loss[1] == clean.r->loss[1]);
        assert_true(r.r->loss[2] == r.r->loss[1]);
        char what[64];
        snprintf(what, sizeof what, "overflow on device %d", devices[i]);
        int64_t n = expect_same_params(&r, &clean, 0, NULL, what);
        printf("  an overflow on device %d at step 2: every device skipped it (%lld parameters "
               "equal 2 clean steps)\n",
               devices[i], (long long)n);
        run_free(&r);
    }
    run_free(&clean);
    ps_plan_free(p);
    ps_cluster_free(c);
}

/* Overflows at every step from 4: 4, 2, then 1 is the floor and the run
 * stops on every device with the message, no hang. */
static void test_overflow_at_floor_stops(void **state)
{
    (void)state;
    ps_cluster *c = cluster_8();
    ps_model_config cfg;
    small_config("gpt-350m", &cfg);
    ps_train_options t = dynamic_options(4, 1000);
    ps_plan *p = plan_trained(&cfg, M_UNIFORM, false, c, &t);
    inject_device = -1;
    inject_call = 0;
    run r;
    ps_error err = {0};
    assert_int_equal(run_steps(p, 5, inject_into, &r, &err), PS_ERR_INVALID);
    printf("  %s\n", err.msg);
    assert_non_null(strstr(err.msg, "step 3:"));
    assert_non_null(strstr(err.msg, "loss scale 1,"));
    assert_non_null(strstr(err.msg, "diverged"));
    assert_null(r.r);
    run_free(&r);
    ps_plan_free(p);
    ps_cluster_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scaler_state_machine),
        cmocka_unit_test(test_vote_in_programs),
        cmocka_unit_test(test_dynamic_exact_in_fp32),
        cmocka_unit_test(test_fp16_overflow_skips),
        cmocka_unit_test(test_warmup_restarts_the_scale),
        cmocka_unit_test(test_one_device_skips_all),
        cmocka_unit_test(test_overflow_at_floor_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
