/* planner/stage_dp: Alpa's stage DP against exhaustive search. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"

#include "planner/stage_dp.h"



/* Submeshes of 1, 2, 4 (and 8) devices; a stage's time shrinks with more
 * devices, with noise; memory limits the later stages a stage tolerates. */
static ps_stage_table *random_table(int L, int D, bool memory)
{
    int sizes[4] = {1, 2, 4, 8}, n_sub = 0;
    while (n_sub < 4 && sizes[n_sub] <= D)
        n_sub++;
    int n_cfg = 1 + below(2);
    ps_stage_table *t = NULL;
    assert_int_equal(ps_stage_table_create(L, n_sub, n_cfg, &t), PS_OK);
    for (int s = 0; s < n_sub; s++)
        t->sub_devices[s] = sizes[s];
    double layer[16];
    for (int l = 0; l < L; l++)
        layer[l] = 0.5 + uniform();
    for (int l = 0; l < L; l++)
        for (int i = l; i < L; i++) {
            double work = 0;
            for (int k = l; k <= i; k++)
                work += layer[k];
            for (int s = 0; s < n_sub; s++)
                for (int c = 0; c < n_cfg; c++) {
                    size_t k = ps_stage_table_index(t, l, i, s, c);
                    if (uniform() < 0.1)
                        continue; /* absent */
                    t->cost[k] = work / sizes[s] * (0.7 + 0.6 * uniform());
                    t->max_succ[k] = memory ? below(L + 1) - 1 : L;
                }
        }
    return t;
}

static void dp_matches_brute_force(void **state)
{
    (void)state;
    int solved = 0, infeasible = 0;
    for (int trial = 0; trial < 240; trial++) {
        int L = 1 + below(6), D = 1 << below(4), B = 1 + below(16);
        bool memory = trial % 2 == 1;
        ps_stage_table *t = random_table(L, D, memory);
        ps_stage_plan dp = {0}, bf = {0};
        ps_status s1 = ps_stage_dp(t, D, B, &dp, NULL);
        ps_status s2 = ps_stage_brute_force(t, D, B, &bf, NULL);
        if ((s1 == PS_OK) != (s2 == PS_OK))
            fail_msg("trial %d: dp %d, brute force %d", trial, s1, s2);
        if (s1 == PS_OK) {
            if (fabs(dp.iteration_s - bf.iteration_s) > 1e-9 * bf.iteration_s)
                fail_msg("trial %d (L=%d D=%d B=%d): dp %.12g, brute force %.12g", trial, L, D,
                         B, dp.iteration_s, bf.iteration_s);
            /* the DP's stages are a valid assignment with that iteration time */
            int devices = 0, next = 0;
            double sum = 0, mx = 0;
            for (int k = 0; k < dp.n_stages; k++) {
                const ps_stage_choice *c = &dp.stages[k];
                assert_int_equal(c->first, next);
                next = c->last + 1;
                devices += t->sub_devices[c->sub];
                size_t idx = ps_stage_table_index(t, c->first, c->last, c->sub, c->cfg);
                assert_true(t->max_succ[idx] >= dp.n_stages - 1 - k);
                sum += t->cost[idx];
                mx = fmax(mx, t->cost[idx]);
            }
            assert_int_equal(next, L);
            assert_int_equal(devices, D);
            assert_true(fabs(sum + (B - 1) * mx - dp.iteration_s) < 1e-9 * dp.iteration_s);
            solved++;
        } else {
            infeasible++;
        }
        ps_stage_plan_clear(&dp);
        ps_stage_plan_clear(&bf);
        ps_stage_table_free(t);
    }
    printf("# %d solved, %d infeasible\n", solved, infeasible);
    assert_true(solved >= 100);
}

/* Two equal layers on two devices with many micro-batches: one stage per
 * device (pipelining) beats one stage on two devices that scales badly. */
static void pipelining_wins_when_sharding_scales_badly(void **state)
{
    (void)state;
    ps_stage_table *t = NULL;
    assert_int_equal(ps_stage_table_create(2, 2, 1, &t), PS_OK);
    t->sub_devices[0] = 1;
    t->sub_devices[1] = 2;
    for (int l = 0; l < 2; l++)
        for (int i = l; i < 2; i++) {
            double work = i - l + 1;
            size_t one = ps_stage_table_index(t, l, i, 0, 0), two = ps_stage_table_index(t, l, i, 1, 0);
            t->cost[one] = work;
            t->cost[two] = work / 1.2; /* two devices only 1.2x faster */
            t->max_succ[one] = t->max_succ[two] = 4;
        }
    ps_stage_plan p = {0};
    assert_int_equal(ps_stage_dp(t, 2, 16, &p, NULL), PS_OK);
    assert_int_equal(p.n_stages, 2);
    assert_true(fabs(p.iteration_s - (2 + 15 * 1.0)) < 1e-12);
    ps_stage_plan_clear(&p);
    /* with one micro-batch there is no pipelining to gain */
    assert_int_equal(ps_stage_dp(t, 2, 1, &p, NULL), PS_OK);
    assert_int_equal(p.n_stages, 1);
    ps_stage_plan_clear(&p);
    /* memory: no stage tolerates a later one -> only the single stage fits */
    for (size_t k = 0; k < 2 * 2 * 2; k++)
        t->max_succ[k] = t->max_succ[k] >= 0 ? 0 : -1;
    assert_int_equal(ps_stage_dp(t, 2, 16, &p, NULL), PS_OK);
    assert_int_equal(p.n_stages, 1);
    ps_stage_plan_clear(&p);
    ps_error err = {0};
    for (size_t k = 0; k < 2 * 2 * 2; k++)
        t->max_succ[k] = -1;
    assert_int_equal(ps_stage_dp(t, 2, 16, &p, &err), PS_ERR_INFEASIBLE);
    assert_non_null(strstr(err.msg, "no pipeline fits"));
    ps_stage_table_free(t);
}

int main(void)
{
    test_rng_seed(0x2545f4914f6cdd1dull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dp_matches_brute_force),
        cmocka_unit_test(pipelining_wins_when_sharding_scales_badly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
