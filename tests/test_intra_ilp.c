/* planner/intra_ilp: GLPK's optimum against exhaustive search, exactness of
 * the reductions, forest DP, infeasibility reports. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"

#include "planner/intra_ilp.h"



/* The least and the most memory of p's choices' per-node extremes. */
static void memory_range(const ps_ilp_problem *p, double *lo, double *hi)
{
    *lo = *hi = 0;
    for (int v = 0; v < p->n_nodes; v++) {
        double mn = INFINITY, mx = 0;
        for (int s = 0; s < p->nodes[v].k; s++) {
            mn = fmin(mn, p->nodes[v].mem[s]);
            mx = fmax(mx, p->nodes[v].mem[s]);
        }
        *lo += mn;
        *hi += mx;
    }
}

/* A random DAG: nodes 2..8, 1..4 strategies, edges between random pairs
 * (about a third of them), costs in [0, 10), a few forbidden pairs. Coarse
 * edge costs take three values, so that rows and columns of an edge's matrix
 * often repeat (as resharding costs on 2-D meshes do) and the program's edge
 * variables are per class of equal rows and columns. */
static ps_ilp_problem *random_problem_of(bool with_memory, bool allow_forbidden, bool coarse)
{
    ps_ilp_problem *p = NULL;
    assert_int_equal(ps_ilp_problem_create(&p), PS_OK);
    int n = 2 + below(7);
    for (int v = 0; v < n; v++) {
        int k = 1 + below(4);
        double cost[4], mem[4];
        /* some nodes hold the same memory in every strategy (elementwise
         * ops' followers): under a budget only they may be eliminated */
        bool fixed = uniform() < 0.3;
        for (int s = 0; s < k; s++) {
            cost[s] = 10 * uniform();
            mem[s] = fixed && s > 0 ? mem[0] : 10 * uniform();
        }
        assert_int_equal(ps_ilp_add_node(p, k, cost, mem, NULL), PS_OK);
    }
    for (int u = 0; u < n; u++)
        for (int v = u + 1; v < n; v++) {
            if (uniform() > 0.35)
                continue;
            double c[16];
            int kk = p->nodes[u].k * p->nodes[v].k;
            for (int i = 0; i < kk; i++)
                c[i] = allow_forbidden && uniform() < 0.05 ? INFINITY
                       : coarse                            ? (double)below(3)
                                                           : 10 * uniform();
            assert_int_equal(ps_ilp_add_edge(p, u, v, c), PS_OK);
            if (uniform() < 0.1) /* a parallel edge, sometimes reversed */
                assert_int_equal(ps_ilp_add_edge(p, v, u, (double[16]){1, 2, 3, 4, 5, 6, 7, 8,
                                                                     9, 1, 2, 3, 4, 5, 6, 7}),
                                 PS_OK);
        }
    if (with_memory) {
        double lo, hi;
        memory_range(p, &lo, &hi);
        p->mem_budget = lo + (hi - lo) * uniform() * 0.7 + 1e-9;
    }
    return p;
}

/* Columns of the program without classes: one per strategy and per pair. */
static int full_columns(const ps_ilp_problem *p)
{
    int cols = 0;
    for (int v = 0; v < p->n_nodes; v++)
        cols += p->nodes[v].k;
    for (int e = 0; e < p->n_edges; e++)
        cols += p->nodes[p->edges[e].u].k * p->nodes[p->edges[e].v].k;
    return cols;
}

static void check_against_brute_force_of(bool with_memory, bool reduce, bool coarse)
{
    int solved = 0, infeasible = 0, compressed = 0;
    for (int t = 0; t < 200; t++) {
        ps_ilp_problem *p = random_problem_of(with_memory, true, coarse);
        ps_ilp_result bf = {0}, ilp = {0};
        ps_error e1 = {0}, e2 = {0};
        ps_status s1 = ps_ilp_brute_force(p, 1e6, &bf, &e1);
        ps_ilp_options o = ps_ilp_options_default();
        o.reduce = reduce;
        o.mip_gap = 0;
        ps_status s2 = ps_ilp_solve(p, &o, &ilp, &e2);
        if ((s1 == PS_OK) != (s2 == PS_OK))
            fail_msg("instance %d: brute force %d (%s), ilp %d (%s)", t, s1, e1.msg, s2, e2.msg);
        if (s1 == PS_OK) {
            if (fabs(bf.objective - ilp.objective) > 1e-9 * (1 + bf.objective))
                fail_msg("instance %d: brute force %.12g, ilp %.12g (%s)", t, bf.objective,
                         ilp.objective, ilp.method);
            assert_true(ilp.optimal);
            if (with_memory)
                assert_true(ilp.memory <= p->mem_budget);
            if (!reduce && ilp.glpk_cols > 0 && ilp.glpk_cols < full_columns(p))
                compressed++;
            solved++;
        } else {
            assert_int_equal(s2, PS_ERR_INFEASIBLE);
            infeasible++;
        }
        ps_ilp_result_clear(&bf);
        ps_ilp_result_clear(&ilp);
        ps_ilp_problem_free(p);
    }
    assert_true(solved >= 150);
    /* unreduced coarse programs reach GLPK with repeated rows: the classes
     * must have been used, or this test checks nothing about them */
    if (coarse && !reduce)
        assert_true(compressed >= 20);
    (void)infeasible;
}

static void check_against_brute_force(bool with_memory, bool reduce)
{
    check_against_brute_force_of(with_memory, reduce, false);
}

static void matches_brute_force(void **state)
{
    (void)state;
    check_against_brute_force(false, true);
}
static void matches_brute_force_with_memory(void **state)
{
    (void)state;
    check_against_brute_force(true, true);
}
/* The reductions are exact: the unreduced program has the same optimum. */
static void matches_brute_force_unreduced(void **state)
{
    (void)state;
    check_against_brute_force(false, false);
    check_against_brute_force(true, false);
}

/* Edge variables per class of equal rows and columns keep the optimum. */
static void matches_brute_force_coarse_costs(void **state)
{
    (void)state;
    for (int with_memory = 0; with_memory < 2; with_memory++)
        for (int reduce = 0; reduce < 2; reduce++)
            check_against_brute_force_of(with_memory, reduce, true);
}

/* A sparse problem: a cycle through 8..12 nodes in random order, a few
 * chords and parallel edges. The eliminations then run long chains of
 * series steps whose new edges meet old ones (merged, then folded). */
static ps_ilp_problem *sparse_problem(bool with_memory)
{
    ps_ilp_problem *p = NULL;
    assert_int_equal(ps_ilp_problem_create(&p), PS_OK);
    int n = 8 + below(5), order[12];
    for (int v = 0; v < n; v++) {
        int k = 1 + below(3);
        double cost[3], mem[3];
        bool fixed = !with_memory || uniform() < 0.7; /* eliminable under a budget */
        for (int s = 0; s < k; s++) {
            cost[s] = 10 * uniform();
            mem[s] = fixed && s > 0 ? mem[0] : 10 * uniform();
        }
        assert_int_equal(ps_ilp_add_node(p, k, cost, mem, NULL), PS_OK);
        order[v] = v;
    }
    for (int v = n - 1; v > 0; v--) {
        int j = below(v + 1), x = order[v];
        order[v] = order[j];
        order[j] = x;
    }
    int chords = below(3);
    for (int i = 0; i < n + chords; i++) {
        int u = i < n ? order[i] : below(n), v = i < n ? order[(i + 1) % n] : below(n);
        if (u == v)
            continue;
        double c[9];
        int kk = p->nodes[u].k * p->nodes[v].k;
        for (int j = 0; j < kk; j++)
            c[j] = uniform() < 0.03 ? INFINITY : 10 * uniform();
        assert_int_equal(ps_ilp_add_edge(p, u, v, c), PS_OK);
        if (uniform() < 0.1)
            assert_int_equal(ps_ilp_add_edge(p, v, u, c), PS_OK);
    }
    if (with_memory) {
        double lo, hi;
        memory_range(p, &lo, &hi);
        p->mem_budget = lo + (hi - lo) * uniform() * 0.7 + 1e-9;
    }
    return p;
}

/* The reductions on sparse problems (most of the work is elimination)
 * keep the optimum; most of them leave GLPK nothing to do. */
static void sparse_matches_brute_force(void **state)
{
    (void)state;
    for (int with_memory = 0; with_memory < 2; with_memory++) {
        int solved = 0, by_reductions = 0;
        for (int t = 0; t < 300; t++) {
            ps_ilp_problem *p = sparse_problem(with_memory);
            ps_ilp_result bf = {0}, ilp = {0};
            ps_error e1 = {0}, e2 = {0};
            ps_status s1 = ps_ilp_brute_force(p, 1e6, &bf, &e1);
            ps_ilp_options o = ps_ilp_options_default();
            o.mip_gap = 0;
            ps_status s2 = ps_ilp_solve(p, &o, &ilp, &e2);
            if ((s1 == PS_OK) != (s2 == PS_OK))
                fail_msg("instance %d: brute force %d (%s), ilp %d (%s)", t, s1, e1.msg, s2,
                         e2.msg);
            if (s1 == PS_OK) {
                if (fabs(bf.objective - ilp.objective) > 1e-9 * (1 + bf.objective))
                    fail_msg("instance %d%s: brute force %.12g, ilp %.12g (%s)", t,
                             with_memory ? " (memory)" : "", bf.objective, ilp.objective,
                             ilp.method);
                if (with_memory)
                    assert_true(ilp.memory <= p->mem_budget);
                by_reductions += ilp.reduced_nodes == 0 && ilp.reduced_edges == 0;
                solved++;
            }
            ps_ilp_result_clear(&bf);
            ps_ilp_result_clear(&ilp);
            ps_ilp_problem_free(p);
        }
        assert_true(solved >= 200);
        if (!with_memory)
            assert_true(by_reductions >= solved / 2);
    }
}

/* A memory budget met by pricing memory: with no gap allowed the pricing may
 * stop only where its bound proves its answer optimal; with 5% allowed, its
 * answer is within 5% of the optimum. Answers always fit; without pricing
 * the same programs give the same optima. */
static void lagrangian_matches_brute_force(void **state)
{
    (void)state;
    for (int g = 0; g < 2; g++) {
        double gap = g == 0 ? 0 : 0.05;
        int priced = 0, solved = 0;
        for (int t = 0; t < 300; t++) {
            ps_ilp_problem *p = random_problem_of(true, true, t % 2 == 1);
            ps_ilp_result bf = {0}, r = {0}, plain = {0};
            ps_status s1 = ps_ilp_brute_force(p, 1e6, &bf, NULL);
            ps_ilp_options o = ps_ilp_options_default();
            o.mip_gap = gap;
            ps_status s2 = ps_ilp_solve(p, &o, &r, NULL);
            o.lagrangian = false;
            o.mip_gap = 0;
            ps_status s3 = ps_ilp_solve(p, &o, &plain, NULL);
            assert_int_equal(s1 == PS_OK, s2 == PS_OK);
            assert_int_equal(s1 == PS_OK, s3 == PS_OK);
            if (s1 == PS_OK) {
                double tol = 1e-9 * (1 + bf.objective);
                if (r.objective < bf.objective - tol ||
                    r.objective > bf.objective * (1 + gap) + tol)
                    fail_msg("instance %d (gap %g): brute force %.12g, %s %.12g", t, gap,
                             bf.objective, r.method, r.objective);
                assert_true(r.memory <= p->mem_budget);
                assert_true(fabs(plain.objective - bf.objective) <= tol);
                priced += strcmp(r.method, "lagrangian") == 0;
                solved++;
            }
            ps_ilp_result_clear(&bf);
            ps_ilp_result_clear(&r);
            ps_ilp_result_clear(&plain);
            ps_ilp_problem_free(p);
        }
        print_message("gap %g: %d of %d answered by pricing memory\n", gap, priced, solved);
        assert_true(solved >= 200);
        assert_true(priced >= 20); /* or this test checks nothing of the pricing */
    }
}

/* Under a memory budget, the nodes whose memory is the same in every
 * strategy are still eliminated (what they add to their neighbours does not
 * depend on a price on memory), and the answer is the optimum. */
static void fixed_memory_nodes_eliminated_under_budget(void **state)
{
    (void)state;
    for (int t = 0; t < 40; t++) {
        ps_ilp_problem *p = NULL;
        assert_int_equal(ps_ilp_problem_create(&p), PS_OK);
        int n = 11;
        double lo = 0, hi = 0;
        for (int v = 0; v < n; v++) {
            double c[3], m[3];
            for (int s = 0; s < 3; s++) {
                c[s] = 3 * uniform();
                m[s] = v % 2 == 1 ? 2.5 : 1 + 4 * uniform(); /* odd nodes: fixed */
            }
            lo += fmin(m[0], fmin(m[1], m[2]));
            hi += fmax(m[0], fmax(m[1], m[2]));
            assert_int_equal(ps_ilp_add_node(p, 3, c, m, NULL), PS_OK);
            if (v > 0) {
                double e[9];
                for (int i = 0; i < 9; i++)
                    e[i] = (i % 4 == 0) ? 0 : 1 + uniform();
                assert_int_equal(ps_ilp_add_edge(p, v - 1, v, e), PS_OK);
            }
        }
        /* a cycle through the even nodes, so that it is no forest */
        double e[9];
        for (int i = 0; i < 9; i++)
            e[i] = 2 * uniform();
        assert_int_equal(ps_ilp_add_edge(p, 0, n - 1, e), PS_OK);
        assert_int_equal(ps_ilp_add_edge(p, 2, 8, e), PS_OK);
        p->mem_budget = lo + (hi - lo) * (0.2 + 0.5 * uniform());
        ps_ilp_result bf = {0}, r = {0};
        ps_status s1 = ps_ilp_brute_force(p, 1e6, &bf, NULL);
        ps_ilp_options o = ps_ilp_options_default();
        o.mip_gap = 0;
        ps_status s2 = ps_ilp_solve(p, &o, &r, NULL);
        assert_int_equal(s1, s2);
        if (s1 == PS_OK) {
            if (fabs(bf.objective - r.objective) > 1e-9 * (1 + bf.objective))
                fail_msg("instance %d: brute force %.12g, %s %.12g", t, bf.objective, r.method,
                         r.objective);
            assert_true(r.memory <= p->mem_budget);
            /* the odd nodes that were not on the extra edges are gone */
            assert_true(r.reduced_nodes <= n - 3);
        }
        ps_ilp_result_clear(&bf);
        ps_ilp_result_clear(&r);
        ps_ilp_problem_free(p);
    }
}

/* A chain needs no search: eliminating its links one by one is exact. */
static void chain_uses_forest_dp(void **state)
{
    (void)state;
    ps_ilp_problem *p = NULL;
    assert_int_equal(ps_ilp_problem_create(&p), PS_OK);
    for (int v = 0; v < 50; v++) {
        double c[3] = {3 * uniform(), 3 * uniform(), 3 * uniform()};
        assert_int_equal(ps_ilp_add_node(p, 3, c, NULL, NULL), PS_OK);
        if (v > 0) {
            double e[9];
            for (int i = 0; i < 9; i++)
                e[i] = (i % 4 == 0) ? 0 : 1 + uniform(); /* diagonal free, like resharding */
            assert_int_equal(ps_ilp_add_edge(p, v - 1, v, e), PS_OK);
        }
    }
    ps_ilp_options o = ps_ilp_options_default();
    ps_ilp_result r = {0};
    assert_int_equal(ps_ilp_solve(p, &o, &r, NULL), PS_OK);
    assert_string_equal(r.method, "reductions");
    assert_int_equal(r.reduced_nodes, 0);
    assert_true(r.optimal);
    assert_int_equal(r.glpk_cols, 0);
    /* and GLPK agrees when forced (a budget above everything, no pricing) */
    o.lagrangian = false;
    p->mem_budget = 1e30;
    ps_ilp_result g = {0};
    p->nodes[0].mem[0] = 1; /* keep the memory row non-trivial */
    assert_int_equal(ps_ilp_solve(p, &o, &g, NULL), PS_OK);
    assert_true(fabs(g.objective - r.objective) < 1e-9 * (1 + r.objective));
    ps_ilp_result_clear(&r);
    ps_ilp_result_clear(&g);
    ps_ilp_problem_free(p);
}

static void infeasible_memory_names_the_numbers(void **state)
{
    (void)state;
    ps_ilp_problem *p = NULL;
    assert_int_equal(ps_ilp_problem_create(&p), PS_OK);
    const double gib = 1073741824.0;
    double c[2] = {1, 2}, m[2] = {4 * gib, 3 * gib};
    assert_int_equal(ps_ilp_add_node(p, 2, c, m, NULL), PS_OK);
    assert_int_equal(ps_ilp_add_node(p, 2, c, m, NULL), PS_OK);
    p->mem_budget = 5 * gib;
    ps_ilp_options o = ps_ilp_options_default();
    ps_ilp_result r = {0};
    ps_error err = {0};
    assert_int_equal(ps_ilp_solve(p, &o, &r, &err), PS_ERR_INFEASIBLE);
    assert_non_null(strstr(err.msg, "at least 6 GiB"));
    assert_non_null(strstr(err.msg, "5 GiB are available"));
    assert_null(r.choice);
    ps_ilp_problem_free(p);
}

/* Alpa-shaped: a chain with skip edges and one binding memory constraint
 * (drawn from the test's random numbers). */
static ps_ilp_problem *medium_problem(void)
{
    ps_ilp_problem *p = NULL;
    assert_int_equal(ps_ilp_problem_create(&p), PS_OK);
    int n = 200, k = 6;
    double max_mem = 0, min_mem = 0;
    for (int v = 0; v < n; v++) {
        double c[6], m[6];
        for (int s = 0; s < k; s++) {
            m[s] = 1 + s + uniform();           /* more sharding: less memory ... */
            c[s] = (k - s) * 0.1 + uniform();    /* ... and more time */
        }
        min_mem += m[0];
        max_mem += m[k - 1];
        assert_int_equal(ps_ilp_add_node(p, k, c, m, NULL), PS_OK);
        for (int back = 1; back <= 3 && back <= v; back++) {
            if (back > 1 && uniform() > 0.3)
                continue;
            double e[36];
            for (int i = 0; i < 36; i++)
                e[i] = i / k == i % k ? 0 : 0.5 * uniform();
            assert_int_equal(ps_ilp_add_edge(p, v - back, v, e), PS_OK);
        }
    }
    p->mem_budget = min_mem + 0.4 * (max_mem - min_mem);
    return p;
}

static void medium_instance_with_memory(void **state)
{
    (void)state;
    ps_ilp_problem *p = medium_problem();
    ps_ilp_options o = ps_ilp_options_default();
    o.time_limit_s = 20;
    o.mip_gap = 0.01;
    ps_ilp_result r = {0};
    ps_error err = {0};
    if (ps_ilp_solve(p, &o, &r, &err) != PS_OK)
        fail_msg("%s", err.msg);
    assert_true(r.memory <= p->mem_budget);
    assert_true(r.optimal || r.gap <= 0.05);
    printf("# 200 x 6 with memory: %s, %d cols, %d rows, %.3f s, optimal %d, gap %.4f\n",
           r.method, r.glpk_cols, r.glpk_rows, r.solve_s, r.optimal, r.gap);
    ps_ilp_result_clear(&r);
    ps_ilp_problem_free(p);
}

static volatile int spin_stop;

static void *spin(void *arg)
{
    (void)arg;
    volatile double x = 0;
    while (!spin_stop)
        x += 1;
    return NULL;
}

/* A solve stopped by its iteration limit stops at the same point whatever
 * the machine's load and wall-clock limit: the same answer, the same
 * iterations, even with two more threads taking the cores. */
static void iteration_limit_reproducible(void **state)
{
    (void)state;
    test_rng_seed(20261203);
    ps_ilp_problem *p = medium_problem();
    ps_ilp_options o = ps_ilp_options_default();
    o.time_limit_s = 60;
    o.mip_gap = 0;
    o.lagrangian = false; /* the relaxation and branch and cut do the work */
    ps_ilp_result whole = {0}, a = {0}, b = {0};
    ps_error err = {0};
    if (ps_ilp_solve(p, &o, &whole, &err) != PS_OK)
        fail_msg("%s", err.msg);
    assert_true(whole.iterations > 100);
    /* a third stops in the relaxation, nine tenths in branch and cut */
    const double share[2] = {1.0 / 3, 0.9};
    for (int t = 0; t < 2; t++) {
        ps_ilp_result_clear(&a);
        ps_ilp_result_clear(&b);
        o.iteration_limit = floor(share[t] * (double)whole.iterations);
        o.time_limit_s = 60;
        if (ps_ilp_solve(p, &o, &a, &err) != PS_OK)
            fail_msg("%s", err.msg);
        pthread_t spinners[2];
        spin_stop = 0;
        for (int i = 0; i < 2; i++)
            assert_int_equal(pthread_create(&spinners[i], NULL, spin, NULL), 0);
        o.time_limit_s = 600;
        ps_status st = ps_ilp_solve(p, &o, &b, &err);
        spin_stop = 1;
        for (int i = 0; i < 2; i++)
            pthread_join(spinners[i], NULL);
        if (st != PS_OK)
            fail_msg("%s", err.msg);
        printf("# 200 x 6 with memory: %lld iterations (%.3f s, optimal %d); limited to %.0f: "
               "%lld iterations, %.3f s alone and %.3f s beside 2 busy threads, gap %.4f, "
               "objective %.6g vs %.6g\n",
               whole.iterations, whole.solve_s, whole.optimal, o.iteration_limit, a.iterations,
               a.solve_s, b.solve_s, a.gap, a.objective, whole.objective);
        assert_true(a.iterations < whole.iterations);
        assert_true(a.memory <= p->mem_budget);
        assert_true(a.objective >= whole.objective * (1 - 1e-9));
        assert_int_equal(a.iterations, b.iterations);
        assert_memory_equal(a.choice, b.choice, (size_t)p->n_nodes * sizeof *a.choice);
        assert_true(a.objective == b.objective);
        assert_true(a.gap == b.gap);
    }
    ps_ilp_result_clear(&whole);
    ps_ilp_result_clear(&a);
    ps_ilp_result_clear(&b);
    ps_ilp_problem_free(p);
}

/* A session solves one problem within budget after budget (tighter, none,
 * looser, tighter again, some that nothing fits): each answer is brute
 * force's optimum within that budget, and a budget that nothing fits leaves
 * the session usable. */
static void session_matches_brute_force_per_budget(void **state)
{
    (void)state;
    int solved = 0, infeasible = 0, programs = 0;
    for (int t = 0; t < 120; t++) {
        ps_ilp_problem *p = random_problem_of(false, true, t % 2 == 1);
        double lo, hi;
        memory_range(p, &lo, &hi);
        double budgets[6] = {lo + 0.6 * (hi - lo), lo + 0.2 * (hi - lo), 0,
                             lo + 0.9 * (hi - lo), 0.5 * lo, lo + 0.4 * (hi - lo)};
        ps_ilp_options o = ps_ilp_options_default();
        o.mip_gap = 0;
        o.lagrangian = t % 3 != 0;
        ps_ilp_session *s = NULL;
        ps_error err = {0};
        ps_status sc = ps_ilp_session_create(p, NULL, &o, &s, &err);
        if (sc == PS_ERR_INFEASIBLE) { /* every choice has a forbidden pair */
            ps_ilp_result bf = {0};
            p->mem_budget = 0;
            assert_int_equal(ps_ilp_brute_force(p, 1e6, &bf, NULL), PS_ERR_INFEASIBLE);
            ps_ilp_problem_free(p);
            continue;
        }
        if (sc != PS_OK)
            fail_msg("instance %d: %s", t, err.msg);
        for (int b = 0; b < 6; b++) {
            p->mem_budget = budgets[b]; /* for brute force; the session ignores it */
            ps_ilp_result bf = {0}, r = {0};
            ps_error e1 = {0}, e2 = {0};
            ps_status s1 = ps_ilp_brute_force(p, 1e6, &bf, &e1);
            ps_status s2 = ps_ilp_session_solve(s, budgets[b], &o, &r, &e2);
            if ((s1 == PS_OK) != (s2 == PS_OK))
                fail_msg("instance %d, budget %d: brute force %d (%s), session %d (%s)", t, b,
                         s1, e1.msg, s2, e2.msg);
            if (s1 == PS_OK) {
                if (fabs(bf.objective - r.objective) > 1e-9 * (1 + bf.objective))
                    fail_msg("instance %d, budget %d: brute force %.12g, session %.12g (%s)", t,
                             b, bf.objective, r.objective, r.method);
                assert_true(r.optimal);
                if (budgets[b] > 0)
                    assert_true(r.memory <= budgets[b] * (1 + 1e-12));
                assert_true(fabs(ps_ilp_evaluate(p, r.choice, NULL) - r.objective) <= 1e-12);
                programs += r.glpk_cols > 0;
                solved++;
            } else {
                assert_int_equal(s2, PS_ERR_INFEASIBLE);
                infeasible++;
            }
            ps_ilp_result_clear(&bf);
            ps_ilp_result_clear(&r);
        }
        ps_ilp_session_free(s);
        ps_ilp_problem_free(p);
    }
    assert_true(solved >= 400);
    assert_true(infeasible >= 100); /* half the least memory fits nothing */
    assert_true(programs >= 100);   /* GLPK's program solved again, not only the DP */
    ps_ilp_result r = {0};
    ps_ilp_problem *p = random_problem_of(false, false, false);
    ps_ilp_session *s = NULL;
    ps_ilp_options o = ps_ilp_options_default();
    assert_int_equal(ps_ilp_session_create(p, NULL, &o, &s, NULL), PS_OK);
    assert_int_equal(ps_ilp_session_solve(s, NAN, &o, &r, NULL), PS_ERR_INVALID);
    ps_ilp_session_free(s);
    ps_ilp_session_free(NULL);
    ps_ilp_problem_free(p);
}

/* Tied nodes in a session: each budget's answer is the one-shot tied
 * solve's, on a chain of identical blocks with a binding memory row (the
 * warm starts of a program of a few hundred columns), budgets falling. */
static void session_tied_matches_one_shot(void **state)
{
    (void)state;
    ps_ilp_problem *p = NULL;
    assert_int_equal(ps_ilp_problem_create(&p), PS_OK);
    int blocks = 6, per = 5, k = 4, n = blocks * per;
    int tie[30];
    double base_c[5][4], base_m[5][4];
    for (int j = 0; j < per; j++)
        for (int s = 0; s < k; s++) {
            base_m[j][s] = 1 + s + uniform();
            base_c[j][s] = (k - s) * 0.2 + uniform();
        }
    for (int v = 0; v < n; v++) {
        int j = v % per;
        assert_int_equal(ps_ilp_add_node(p, k, base_c[j], base_m[j], NULL), PS_OK);
        /* the first and last block are free, the middle ones tied */
        int blk = v / per;
        tie[v] = blk >= 1 && blk < blocks - 1 ? per + j : v;
    }
    for (int v = 1; v < n; v++) {
        double e[16];
        for (int i = 0; i < 16; i++)
            e[i] = i / k == i % k ? 0 : 0.3 + 0.1 * (i % 3);
        assert_int_equal(ps_ilp_add_edge(p, v - 1, v, e), PS_OK);
        if (v >= 3) { /* a skip edge: cycles, so GLPK solves it */
            assert_int_equal(ps_ilp_add_edge(p, v - 3, v, e), PS_OK);
        }
    }
    double lo, hi;
    memory_range(p, &lo, &hi);
    ps_ilp_options o = ps_ilp_options_default();
    o.mip_gap = 0;
    o.time_limit_s = 30;
    ps_ilp_session *s = NULL;
    ps_error err = {0};
    if (ps_ilp_session_create(p, tie, &o, &s, &err) != PS_OK)
        fail_msg("%s", err.msg);
    int glpk = 0;
    for (double f = 0.9; f > 0.05; f -= 0.2) {
        p->mem_budget = lo + f * (hi - lo);
        ps_ilp_result one = {0}, r = {0};
        if (ps_ilp_solve_tied(p, tie, &o, &one, &err) != PS_OK)
            fail_msg("one-shot at %.2f: %s", f, err.msg);
        if (ps_ilp_session_solve(s, p->mem_budget, &o, &r, &err) != PS_OK)
            fail_msg("session at %.2f: %s", f, err.msg);
        assert_true(one.optimal && r.optimal);
        if (fabs(one.objective - r.objective) > 1e-9 * (1 + one.objective))
            fail_msg("budget %.2f: one-shot %.12g (%s), session %.12g (%s)", f, one.objective,
                     one.method, r.objective, r.method);
        assert_true(r.memory <= p->mem_budget * (1 + 1e-12));
        for (int v = 0; v < n; v++)
            assert_int_equal(r.choice[v], r.choice[tie[v]]);
        glpk += r.glpk_cols > 0;
        ps_ilp_result_clear(&one);
        ps_ilp_result_clear(&r);
    }
    assert_true(glpk >= 3);
    ps_ilp_session_free(s);
    ps_ilp_problem_free(p);
}

static void rejects_bad_input(void **state)
{
    (void)state;
    ps_ilp_problem *p = NULL;
    assert_int_equal(ps_ilp_problem_create(&p), PS_OK);
    double c[2] = {1, NAN};
    assert_int_equal(ps_ilp_add_node(p, 0, c, NULL, NULL), PS_ERR_INVALID);
    assert_int_equal(ps_ilp_add_node(p, 2, c, NULL, NULL), PS_OK);
    assert_int_equal(ps_ilp_add_edge(p, 0, 0, c), PS_ERR_INVALID);
    assert_int_equal(ps_ilp_add_edge(p, 0, 3, c), PS_ERR_INVALID);
    ps_ilp_result r = {0};
    ps_ilp_options o = ps_ilp_options_default();
    assert_int_equal(ps_ilp_solve(p, &o, &r, NULL), PS_ERR_INTERNAL);
    ps_ilp_problem_free(p);
    ps_ilp_problem_free(NULL);
}

int main(void)
{
    test_rng_seed(0x9e3779b97f4a7c15ull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matches_brute_force),
        cmocka_unit_test(matches_brute_force_with_memory),
        cmocka_unit_test(matches_brute_force_unreduced),
        cmocka_unit_test(matches_brute_force_coarse_costs),
        cmocka_unit_test(sparse_matches_brute_force),
        cmocka_unit_test(lagrangian_matches_brute_force),
        cmocka_unit_test(fixed_memory_nodes_eliminated_under_budget),
        cmocka_unit_test(chain_uses_forest_dp),
        cmocka_unit_test(infeasible_memory_names_the_numbers),
        cmocka_unit_test(medium_instance_with_memory),
        cmocka_unit_test(iteration_limit_reproducible),
        cmocka_unit_test(session_matches_brute_force_per_budget),
        cmocka_unit_test(session_tied_matches_one_shot),
        cmocka_unit_test(rejects_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
