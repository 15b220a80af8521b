/* planner/layer_cluster: Alpa's clustering DP against exhaustive search, and
 * the cuts it makes in a GPT. */
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

#include "planner/layer_cluster.h"
#include "planner/models/builder.h"
#include "planner/models/zoo.h"



/* A chain of dense layers of random widths with skip additions. */
static ps_graph *random_graph(void)
{
    ps_graph *g = NULL;
    ps_error err = {0};
    assert_int_equal(ps_graph_create("random", &g), PS_OK);
    ps_model_builder mb, *b = &mb;
    ps_mb_init(b, g, PS_DTYPE_F32, &err);
    static const int64_t widths[3] = {4, 8, 16};
    int x = ps_mb_input(b, "x", PS_DTYPE_F32, 2, (int64_t[]){2, 8});
    int outs[32], n = 0;
    int n_ops = 4 + below(7);
    for (int i = 0; i < n_ops; i++) {
        char name[16];
        snprintf(name, sizeof name, "d%d", i);
        int64_t w = widths[below(3)];
        x = ps_mb_dense(b, name, x, w, false);
        for (int j = n - 2; j >= 0; j--) { /* a skip from an earlier tensor of the same width */
            if (g->tensors[outs[j]].desc.shape[1] == w && uniform() < 0.5) {
                snprintf(name, sizeof name, "s%d", i);
                x = ps_mb_binary(b, PS_OP_ADD, name, x, outs[j]);
                break;
            }
        }
        outs[n++] = x;
    }
    assert_int_equal(b->st, PS_OK);
    return g;
}

typedef struct score {
    double max_in, sum_in, max_flops;
    bool ok;
} score;

/* The objective straight from its definition, for a given op -> layer map. */
static score evaluate(const ps_graph *g, const int *op_layer, int L, double bound)
{
    score s = {0, 0, 0, true};
    double flops[64] = {0};
    for (int q = 0; q < L; q++) {
        double in = 0;
        for (int t = 0; t < g->n_tensors; t++) {
            int p = g->tensors[t].producer;
            if (p < 0 || op_layer[p] >= q)
                continue;
            bool read = false;
            for (int i = 0; i < g->n_ops && !read; i++)
                for (int k = 0; k < g->ops[i].n_in; k++)
                    if (op_layer[i] == q && g->ops[i].in[k] == t)
                        read = true;
            if (read)
                in += ps_tensor_bytes(&g->tensors[t]);
        }
        s.max_in = fmax(s.max_in, in);
        s.sum_in += in;
    }
    for (int i = 0; i < g->n_ops; i++)
        flops[op_layer[i]] += g->ops[i].cost.flops;
    for (int q = 0; q < L; q++) {
        if (flops[q] > bound || flops[q] == 0)
            s.ok = false;
        s.max_flops = fmax(s.max_flops, flops[q]);
    }
    return s;
}

static bool better(score a, score b)
{
    if (a.max_in != b.max_in)
        return a.max_in < b.max_in;
    if (a.sum_in != b.sum_in)
        return a.sum_in < b.sum_in;
    return a.max_flops < b.max_flops;
}

static void dp_matches_brute_force(void **state)
{
    (void)state;
    int checked = 0;
    for (int trial = 0; trial < 150; trial++) {
        ps_graph *g = random_graph();
        int K = g->n_ops, L = 1 + below(K < 4 ? K : 4);
        double total = 0;
        for (int i = 0; i < K; i++)
            total += g->ops[i].cost.flops;
        ps_layering l = {0};
        ps_error err = {0};
        ps_status st = ps_layer_cluster_auto(g, L, 0.5, &l, &err);
        if (st != PS_OK) {
            ps_graph_free(g);
            continue;
        }
        double bound = (1 + l.eps_used) * total / L;
        /* all ways to cut K ops into L non-empty consecutive groups */
        score best = {INFINITY, INFINITY, INFINITY, false};
        int cuts[64], layer[64];
        for (int q = 0; q < L - 1; q++)
            cuts[q] = q + 1;
        for (;;) {
            for (int i = 0, q = 0; i < K; i++) {
                while (q < L - 1 && i >= cuts[q])
                    q++;
                layer[i] = q;
            }
            score s = evaluate(g, layer, L, bound);
            if (s.ok && better(s, best))
                best = s;
            int q = L - 2;
            while (q >= 0 && cuts[q] == K - (L - 1 - q))
                q--;
            if (q < 0)
                break;
            cuts[q]++;
            for (int r = q + 1; r < L - 1; r++)
                cuts[r] = cuts[r - 1] + 1;
        }
        score got = evaluate(g, l.op_layer, L, bound);
        assert_true(got.ok);
        if (got.max_in != best.max_in || got.sum_in != best.sum_in ||
            got.max_flops != best.max_flops)
            fail_msg("trial %d (K=%d L=%d): dp (%g, %g, %g), brute force (%g, %g, %g)", trial,
                     K, L, got.max_in, got.sum_in, got.max_flops, best.max_in, best.sum_in,
                     best.max_flops);
        /* the reported statistics agree with the definition */
        double max_in = 0;
        for (int q = 0; q < L; q++)
            max_in = fmax(max_in, l.boundary_bytes[q]);
        assert_true(max_in == got.max_in);
        /* what crosses each cut: every tensor made before it and read at or
         * after it, once (a skip past the next layer included) */
        for (int b = 1; b < L; b++) {
            double want = 0;
            for (int t = 0; t < g->n_tensors; t++) {
                int p = g->tensors[t].producer;
                if (p < 0 || l.op_layer[p] >= b)
                    continue;
                bool after = false;
                for (int i = 0; i < K && !after; i++)
                    for (int k = 0; k < g->ops[i].n_in; k++)
                        after |= g->ops[i].in[k] == t && l.op_layer[i] >= b;
                if (after)
                    want += ps_tensor_bytes(&g->tensors[t]);
            }
            assert_true(l.cut_bytes[b] == want);
            assert_true(l.cut_bytes[b] >= l.boundary_bytes[b]);
        }
        ps_layering_clear(&l);
        ps_graph_free(g);
        checked++;
    }
    assert_true(checked >= 100);
}

/* GPT-2.6B into 8 layers: every cut falls on the residual stream between
 * blocks, so each layer after the first receives exactly one [B, s, h]
 * activation, and FLOPs stay within (1 + eps) of the average. */
static void gpt_cuts_between_blocks(void **state)
{
    (void)state;
    ps_model_config c;
    assert_int_equal(ps_zoo_lookup("gpt-2.6b", &c, NULL), PS_OK);
    c.batch = 2;
    ps_graph *g = NULL;
    assert_int_equal(ps_model_build(&c, &g, NULL), PS_OK);
    ps_layering l = {0};
    ps_error err = {0};
    assert_int_equal(ps_layer_cluster_auto(g, 8, 0.5, &l, &err), PS_OK);
    double residual = 2.0 * 1024 * 2560 * 2, total = 0;
    for (int q = 0; q < 8; q++)
        total += l.flops[q];
    for (int q = 0; q < 8; q++) {
        if (q > 0 && l.boundary_bytes[q] != residual)
            fail_msg("layer %d receives %.0f bytes, one residual is %.0f", q,
                     l.boundary_bytes[q], residual);
        assert_true(l.flops[q] <= 1.5 * total / 8);
    }
    ps_graph *r = NULL;
    assert_int_equal(ps_graph_relayer(g, &l, &r, &err), PS_OK);
    assert_int_equal(r->n_layers, 8);
    assert_int_equal(r->n_boundaries, 0);
    ps_graph_free(r);
    ps_layering_clear(&l);
    /* more layers than ops is refused */
    assert_int_equal(ps_layer_cluster_auto(g, g->n_ops + 1, 0.5, &l, &err), PS_ERR_INVALID);
    ps_graph_free(g);
}

/* Manual layers follow mark_pipeline_boundary: the tutorial MLP has two. */
static void manual_boundaries(void **state)
{
    (void)state;
    ps_model_config c;
    assert_int_equal(ps_zoo_lookup("mlp", &c, NULL), PS_OK);
    c.hidden = 64;
    c.batch = 8;
    ps_graph *g = NULL;
    assert_int_equal(ps_model_build(&c, &g, NULL), PS_OK);
    ps_layering l = {0};
    assert_int_equal(ps_layer_cluster_manual(g, &l, NULL), PS_OK);
    assert_int_equal(l.n_layers, 2);
    assert_true(l.boundary_bytes[1] == 8.0 * 64 * 4);
    assert_true(l.flops[0] > 0 && l.flops[1] >= l.flops[0]);
    /* auto with two layers finds the same cut */
    ps_layering a = {0};
    assert_int_equal(ps_layer_cluster_auto(g, 2, 0.5, &a, NULL), PS_OK);
    assert_memory_equal(a.op_layer, l.op_layer, sizeof(int) * (size_t)g->n_ops);
    ps_layering_clear(&a);
    ps_layering_clear(&l);
    ps_graph_free(g);
}

int main(void)
{
    test_rng_seed(0x853c49e6748fea9bull);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dp_matches_brute_force),
        cmocka_unit_test(gpt_cuts_between_blocks),
        cmocka_unit_test(manual_boundaries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
