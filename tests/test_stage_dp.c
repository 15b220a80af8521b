/* planner/stage_dp: Alpa's stage DP against exhaustive search. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"

#include "planner/stage_dp.h"



static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

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

/* In-order placement on nodes of a random M <= D devices (returned), with
 * receives dearer across nodes; `coarse`: from few values, so that costs tie. */
static int place_randomly(ps_stage_table *t, int D, bool coarse)
{
    int M = 1 << below(4);
    while (M > D)
        M /= 2;
    assert_int_equal(ps_stage_table_place_in_order(t, M), PS_OK);
    for (int b = 1; b < t->n_layers; b++)
        for (int q = 0; q < t->n_submeshes; q++) {
            double on_node = coarse ? 0.125 * below(2) : 0.05 * uniform();
            double across = coarse ? 0.125 * (1 + below(3)) : on_node + uniform();
            t->recv_s[((size_t)b * t->n_submeshes + q) * 2] = on_node;
            t->recv_s[((size_t)b * t->n_submeshes + q) * 2 + 1] = across;
        }
    return M;
}

/* Stage c's cost at device `offset` under in-order placement on nodes of M
 * devices, computed here from its definition: INFINITY where it straddles
 * nodes (within a node) or starts off a node (whole nodes); plus the
 * receive at each inner boundary, across nodes where the boundary is a node's
 * edge. */
static double placed_by_hand(const ps_stage_table *t, const ps_stage_choice *c, int offset,
                             int M)
{
    double cost = t->cost[ps_stage_table_index(t, c->first, c->last, c->sub, c->cfg)];
    if (M <= 0)
        return cost;
    int n = t->sub_devices[c->sub], S = t->n_submeshes;
    if (n < M) {
        for (int d = offset; d < offset + n; d++)
            if (d / M != offset / M)
                return INFINITY;
    } else if (offset % M != 0) {
        return INFINITY;
    }
    if (c->first > 0)
        cost += t->recv_s[((size_t)c->first * S + c->sub) * 2 + (offset % M == 0 ? 1 : 0)];
    if (c->last + 1 < t->n_layers)
        cost += t->recv_s[((size_t)(c->last + 1) * S + c->sub) * 2 +
                          ((offset + n) % M == 0 ? 1 : 0)];
    return cost;
}

/* The DP's stages are a valid assignment with the iteration time it says:
 * consecutive layers, all D devices, memory for the later stages, each
 * stage priced where it sits (by hand). */
static void check_stages(const ps_stage_table *t, const ps_stage_plan *dp, int D, int B, int M,
                         int trial)
{
    int L = t->n_layers, devices = 0, next = 0;
    double sum = 0, mx = 0;
    for (int k = 0; k < dp->n_stages; k++) {
        const ps_stage_choice *c = &dp->stages[k];
        assert_int_equal(c->first, next);
        next = c->last + 1;
        devices += t->sub_devices[c->sub];
        size_t idx = ps_stage_table_index(t, c->first, c->last, c->sub, c->cfg);
        assert_true(t->max_succ[idx] >= dp->n_stages - 1 - k);
        double cost = placed_by_hand(t, c, devices - t->sub_devices[c->sub], M);
        if (!isfinite(cost))
            fail_msg("trial %d: stage %d cannot sit at device %d", trial, k,
                     devices - t->sub_devices[c->sub]);
        assert_true(fabs(cost - c->cost_s) <= 1e-12 * cost);
        if (k + 1 < dp->n_stages && t->no_cut_after != NULL && t->no_cut_after[c->last])
            fail_msg("trial %d: stage %d ends after layer %d, where no stage may end", trial, k,
                     c->last);
        sum += cost;
        mx = fmax(mx, cost);
    }
    assert_int_equal(next, L);
    assert_int_equal(devices, D);
    assert_true(fabs(sum + (B - 1) * mx - dp->iteration_s) < 1e-9 * dp->iteration_s);
}

static void dp_matches_brute_force(void **state)
{
    (void)state;
    int solved = 0, infeasible = 0, counts_checked = 0;
    for (int trial = 0; trial < 360; trial++) {
        int L = 1 + below(6), D = 1 << below(4), B = 1 + below(16);
        bool memory = trial % 2 == 1;
        ps_stage_table *t = random_table(L, D, memory);
        /* every third trial: in-order placement on nodes of M devices, with
         * receives dearer across nodes */
        int M = trial % 3 == 2 ? place_randomly(t, D, false) : 0;
        /* every fourth trial: layers after which no stage may end (a later
         * layer feeds an earlier one) */
        if (trial % 4 == 3 && L > 1) {
            t->no_cut_after = calloc((size_t)L, 1);
            assert_non_null(t->no_cut_after);
            for (int b = 0; b < L - 1; b++)
                t->no_cut_after[b] = uniform() < 0.4;
        }
        ps_stage_plan dp = {0}, bf = {0};
        ps_status s1 = ps_stage_dp(t, D, B, &dp, NULL);
        ps_status s2 = ps_stage_brute_force(t, D, B, 0, &bf, NULL);
        if ((s1 == PS_OK) != (s2 == PS_OK))
            fail_msg("trial %d: dp %d, brute force %d", trial, s1, s2);
        if (s1 == PS_OK) {
            if (fabs(dp.iteration_s - bf.iteration_s) > 1e-9 * bf.iteration_s)
                fail_msg("trial %d (L=%d D=%d B=%d): dp %.12g, brute force %.12g", trial, L, D,
                         B, dp.iteration_s, bf.iteration_s);
            check_stages(t, &dp, D, B, M, trial);
            /* per stage count, within a random factor of the best: each
             * count the brute force finds that near is kept, at its
             * optimum; no count beyond it is */
            double within = 1 + uniform();
            ps_stage_plan by_count[7] = {{0}};
            assert_int_equal(ps_stage_dp_by_count(t, D, B, within, by_count, NULL), PS_OK);
            for (int n = 1; n <= L; n++) {
                ps_stage_plan bn = {0};
                bool any = ps_stage_brute_force(t, D, B, n, &bn, NULL) == PS_OK;
                bool near = any && bn.iteration_s < within * bf.iteration_s * (1 - 1e-12);
                if (near && by_count[n].n_stages != n)
                    fail_msg("trial %d: %d stages (%.12g, best %.12g, within %g) missing",
                             trial, n, bn.iteration_s, bf.iteration_s, within);
                if (by_count[n].n_stages > 0) {
                    assert_int_equal(by_count[n].n_stages, n);
                    assert_true(any);
                    assert_true(by_count[n].iteration_s <= within * bf.iteration_s);
                    if (fabs(by_count[n].iteration_s - bn.iteration_s) > 1e-9 * bn.iteration_s)
                        fail_msg("trial %d: %d stages: dp %.12g, brute force %.12g", trial, n,
                                 by_count[n].iteration_s, bn.iteration_s);
                    check_stages(t, &by_count[n], D, B, M, trial);
                    counts_checked++;
                }
                ps_stage_plan_clear(&bn);
                ps_stage_plan_clear(&by_count[n]);
            }
            solved++;
        } else {
            infeasible++;
        }
        ps_stage_plan_clear(&dp);
        ps_stage_plan_clear(&bf);
        ps_stage_table_free(t);
    }
    printf("# %d solved, %d infeasible; %d best plans per stage count checked\n", solved,
           infeasible, counts_checked);
    assert_true(solved >= 100);
    assert_true(counts_checked > solved);
}

/* The DP by its definition, state by state: F(s, l, d), the best s stages
 * on layers l.. and d devices, tries the last layer i of its first stage,
 * its submesh and configuration in that order and keeps the first strictly
 * best (placed_by_hand prices it where it sits); the t_max search as
 * ps_stage_dp_by_count's. by_count[s] as that function's, and objective[s]
 * its DP objective, without the bound's pruning of counts (the caller
 * applies it). */
static void reference_by_count(const ps_stage_table *t, int D, int B, double within, int M,
                               ps_stage_plan *by_count, double *objective)
{
    int L = t->n_layers, S = t->n_submeshes, C = t->n_configs;
    double *costs = malloc((size_t)L * L * S * C * 4 * sizeof *costs);
    size_t n_f = (size_t)(L + 1) * (L + 1) * (D + 1);
    double *f = malloc(n_f * sizeof *f);
    ps_stage_choice *arg = malloc(n_f * sizeof *arg);
    assert_non_null(costs);
    assert_non_null(f);
    assert_non_null(arg);
    size_t n_costs = 0;
    for (int l = 0; l < L; l++)
        for (int i = l; i < L; i++)
            for (int sub = 0; sub < S; sub++)
                for (int c = 0; c < C; c++) {
                    size_t k = ps_stage_table_index(t, l, i, sub, c);
                    if (!isfinite(t->cost[k]) || t->max_succ[k] < 0)
                        continue;
                    for (int v = 0; v < (M > 0 ? 4 : 1); v++) {
                        double cost = t->cost[k];
                        if (M > 0 && l > 0)
                            cost += t->recv_s[((size_t)l * S + sub) * 2 + (v & 1 ? 1 : 0)];
                        if (M > 0 && i + 1 < L)
                            cost += t->recv_s[((size_t)(i + 1) * S + sub) * 2 + (v & 2 ? 1 : 0)];
                        costs[n_costs++] = cost;
                    }
                }
    qsort(costs, n_costs, sizeof *costs, cmp_double);
    double best = INFINITY;
    for (int s = 0; s <= L; s++)
        objective[s] = INFINITY;
#define RF(s, l, d) f[((size_t)(s) * (L + 1) + (l)) * (D + 1) + (d)]
#define RA(s, l, d) arg[((size_t)(s) * (L + 1) + (l)) * (D + 1) + (d)]
    for (size_t j = 0; j < n_costs; j++) {
        double t_max = costs[j];
        if (j > 0 && t_max == costs[j - 1])
            continue;
        if ((double)B * t_max >= within * best)
            break;
        for (size_t q = 0; q < n_f; q++)
            f[q] = INFINITY;
        RF(0, L, 0) = 0;
        for (int s = 1; s <= L && s <= D; s++)
            for (int l = L - s; l >= 0; l--)
                for (int d = s; d <= D; d++)
                    for (int i = l; i <= L - s; i++) {
                        if (i < L - 1 && t->no_cut_after != NULL && t->no_cut_after[i])
                            continue;
                        for (int sub = 0; sub < S; sub++) {
                            int nd = t->sub_devices[sub];
                            if (nd > d || !isfinite(RF(s - 1, i + 1, d - nd)))
                                continue;
                            for (int c = 0; c < C; c++) {
                                ps_stage_choice ch = {l, i, sub, c, 0};
                                size_t k = ps_stage_table_index(t, l, i, sub, c);
                                if (!isfinite(t->cost[k]) || t->max_succ[k] < s - 1)
                                    continue;
                                ch.cost_s = placed_by_hand(t, &ch, D - d, M);
                                if (!(ch.cost_s <= t_max))
                                    continue;
                                if (ch.cost_s + RF(s - 1, i + 1, d - nd) < RF(s, l, d)) {
                                    RF(s, l, d) = ch.cost_s + RF(s - 1, i + 1, d - nd);
                                    RA(s, l, d) = ch;
                                }
                            }
                        }
                    }
        for (int s = 1; s <= L; s++) {
            double total = RF(s, 0, D);
            if (!isfinite(total) || !(total + (B - 1) * t_max < objective[s]))
                continue;
            objective[s] = total + (B - 1) * t_max;
            best = fmin(best, objective[s]);
            ps_stage_plan_clear(&by_count[s]);
            by_count[s].stages = calloc((size_t)s, sizeof *by_count[s].stages);
            assert_non_null(by_count[s].stages);
            by_count[s].n_stages = s;
            double sum = 0;
            for (int q = s, l = 0, d = D, k = 0; q >= 1; q--, k++) {
                by_count[s].stages[k] = RA(q, l, d);
                sum += RA(q, l, d).cost_s;
                by_count[s].max_stage_s = fmax(by_count[s].max_stage_s, RA(q, l, d).cost_s);
                int next = RA(q, l, d).last + 1;
                d -= t->sub_devices[RA(q, l, d).sub];
                l = next;
            }
            by_count[s].iteration_s = sum + (double)(B - 1) * by_count[s].max_stage_s;
        }
    }
#undef RF
#undef RA
    free(costs);
    free(f);
    free(arg);
}

/* Where entries tie (identical layers, equal costs), the DP's choices are
 * those of its definition state by state, stage for stage: the same plans,
 * not only plans as fast. Costs drawn from few values so that ties abound. */
static void dp_breaks_ties_as_its_definition(void **state)
{
    (void)state;
    int compared = 0;
    for (int trial = 0; trial < 240; trial++) {
        int L = 1 + below(7), D = 1 << below(5), B = 1 + below(16);
        ps_stage_table *t = random_table(L, D, trial % 2 == 1);
        for (size_t k = 0; k < (size_t)L * L * t->n_submeshes * t->n_configs; k++)
            if (isfinite(t->cost[k]))
                t->cost[k] = 0.25 * (1 + below(4)) * (1 + (k % 3 == 0));
        int M = trial % 3 != 0 ? place_randomly(t, D, true) : 0;
        if (trial % 4 == 3 && L > 1) {
            t->no_cut_after = calloc((size_t)L, 1);
            assert_non_null(t->no_cut_after);
            for (int b = 0; b < L - 1; b++)
                t->no_cut_after[b] = uniform() < 0.3;
        }
        double within = 1 + uniform();
        ps_stage_plan got[8] = {{0}}, want[8] = {{0}};
        double objective[8], best = INFINITY;
        ps_status st = ps_stage_dp_by_count(t, D, B, within, got, NULL);
        reference_by_count(t, D, B, within, M, want, objective);
        for (int n = 1; n <= L; n++)
            best = fmin(best, objective[n]);
        assert_int_equal(st == PS_OK, isfinite(best));
        for (int n = 1; n <= L; n++) {
            if (want[n].n_stages > 0 && objective[n] >= within * best && objective[n] > best)
                ps_stage_plan_clear(&want[n]); /* past the bound, as the DP drops it */
            if (got[n].n_stages != want[n].n_stages)
                fail_msg("trial %d: %d stages: dp has %d, the definition %d", trial, n,
                         got[n].n_stages, want[n].n_stages);
            for (int k = 0; k < got[n].n_stages; k++) {
                const ps_stage_choice *a = &got[n].stages[k], *b = &want[n].stages[k];
                if (a->first != b->first || a->last != b->last || a->sub != b->sub ||
                    a->cfg != b->cfg || a->cost_s != b->cost_s)
                    fail_msg("trial %d: %d stages, stage %d: dp layers %d-%d on submesh %d "
                             "config %d (%.17g), the definition %d-%d on %d config %d (%.17g)",
                             trial, n, k, a->first, a->last, a->sub, a->cfg, a->cost_s,
                             b->first, b->last, b->sub, b->cfg, b->cost_s);
            }
            if (got[n].n_stages > 0) {
                assert_true(got[n].iteration_s == want[n].iteration_s);
                compared++;
            }
            ps_stage_plan_clear(&got[n]);
            ps_stage_plan_clear(&want[n]);
        }
        ps_stage_table_free(t);
    }
    printf("# %d plans compared stage for stage\n", compared);
    assert_true(compared >= 200);
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

/* In-order placement in closed form: two layers on 4 devices. Alone, each
 * layer takes 0.5 s on 2 devices; both take 0.6 s on 4. Split in two stages
 * of 2 devices, each receives 0.01 s from its neighbour on its node, or 0.4 s
 * from another node. */
static void placement_charges_the_node_edge(void **state)
{
    (void)state;
    ps_stage_table *t = NULL;
    assert_int_equal(ps_stage_table_create(2, 2, 1, &t), PS_OK);
    t->sub_devices[0] = 2;
    t->sub_devices[1] = 4;
    size_t first = ps_stage_table_index(t, 0, 0, 0, 0), second = ps_stage_table_index(t, 1, 1, 0, 0),
           both = ps_stage_table_index(t, 0, 1, 1, 0);
    t->cost[first] = t->cost[second] = 0.5;
    t->cost[both] = 0.6;
    t->max_succ[first] = t->max_succ[second] = t->max_succ[both] = 2;
    const int B = 16;
    ps_stage_plan p = {0};
    /* Alpa's DP: two stages, 2 * 0.5 + 15 * 0.5 */
    assert_int_equal(ps_stage_dp(t, 4, B, &p, NULL), PS_OK);
    assert_int_equal(p.n_stages, 2);
    assert_true(fabs(p.iteration_s - 8.5) < 1e-12);
    ps_stage_plan_clear(&p);
    for (int across = 0; across < 2; across++) {
        assert_int_equal(ps_stage_table_place_in_order(t, across ? 2 : 4), PS_OK);
        t->recv_s[(1 * 2 + 0) * 2 + 0] = 0.01; /* boundary 1, 2-device submesh, on node */
        t->recv_s[(1 * 2 + 0) * 2 + 1] = 0.4;  /* ... across nodes */
        assert_int_equal(ps_stage_dp(t, 4, B, &p, NULL), PS_OK);
        if (across) { /* 2 * 0.9 + 15 * 0.9 = 15.3 > 16 * 0.6: one stage */
            assert_int_equal(p.n_stages, 1);
            assert_true(fabs(p.iteration_s - 16 * 0.6) < 1e-12);
        } else { /* one node: 2 * 0.51 + 15 * 0.51 */
            assert_int_equal(p.n_stages, 2);
            assert_true(fabs(p.iteration_s - 17 * 0.51) < 1e-12);
            assert_true(fabs(p.stages[1].cost_s - 0.51) < 1e-12);
        }
        ps_stage_plan_clear(&p);
    }
    /* a 2-device stage cannot start at device 1 of a 2-device node, and a
     * whole-node stage must start on a node */
    assert_true(isinf(ps_stage_table_placed_cost(t, first, 0, 0, 0, 1)));
    assert_true(isinf(ps_stage_table_placed_cost(t, both, 0, 1, 1, 1)));
    assert_true(fabs(ps_stage_table_placed_cost(t, second, 1, 1, 0, 2) - 0.9) < 1e-12);
    ps_stage_table_free(t);
}

int main(void)
{
    test_rng_seed(0x2545f4914f6cdd1dull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dp_matches_brute_force),
        cmocka_unit_test(dp_breaks_ties_as_its_definition),
        cmocka_unit_test(pipelining_wins_when_sharding_scales_badly),
        cmocka_unit_test(placement_charges_the_node_edge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
