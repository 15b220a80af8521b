/* planner/intra_pass: the strategies the ILP picks, against closed forms in
 * the style of Alpa's own solver tests. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "planner/intra_pass.h"
#include "planner/models/builder.h"
#include "planner/models/zoo.h"
#include "planner/train_step.h"

static bool close_to(double a, double b) { return fabs(a - b) <= 1e-12 + 1e-6 * fabs(b); }

/* Dense(4h) - relu - Dense(h), MSE: one Megatron MLP block, no biases. */
static ps_graph *mlp_block(int64_t batch, int64_t h)
{
    ps_graph *g = NULL;
    ps_error err = {0};
    assert_int_equal(ps_graph_create("mlp-block", &g), PS_OK);
    ps_model_builder mb, *b = &mb;
    ps_mb_init(b, g, PS_DTYPE_F32, &err);
    int x = ps_mb_input(b, "x", PS_DTYPE_F32, 2, (int64_t[]){batch, h});
    int y = ps_mb_input(b, "y", PS_DTYPE_F32, 2, (int64_t[]){batch, h});
    x = ps_mb_dense(b, "fc1", x, 4 * h, false);
    x = ps_mb_unary(b, PS_OP_RELU, "relu", x);
    x = ps_mb_dense(b, "fc2", x, h, false);
    int loss = ps_mb_binary(b, PS_OP_MSE_LOSS, "loss", x, y);
    if (b->st != PS_OK)
        fail_msg("%s", err.msg);
    g->loss = loss;
    ps_graph *step = NULL;
    ps_train_options o = ps_train_options_default();
    assert_int_equal(ps_train_step_build(g, &o, &step, &err), PS_OK);
    ps_graph_free(g);
    return step;
}

static ps_logical_mesh *mesh(const char *cluster, int d0, int d1, ps_cluster **keep)
{
    ps_cluster *c = NULL;
    assert_int_equal(ps_cluster_from_preset(cluster, &c, NULL), PS_OK);
    ps_logical_mesh *m = NULL;
    int n = d0 * d1;
    int hosts = n > c->devices_per_node ? n / c->devices_per_node : 1;
    ps_error err = {0};
    if (ps_mesh_create(c, 0, hosts, n / hosts, d0, d1, &m, &err) != PS_OK)
        fail_msg("%s", err.msg);
    *keep = c;
    return m;
}

static ps_intra_result *solve(const ps_graph *g, const ps_logical_mesh *m, ps_intra_method method)
{
    ps_intra_options o = ps_intra_options_default();
    o.method = method;
    o.ilp.mip_gap = 0;
    ps_intra_result *r = NULL;
    ps_error err = {0};
    if (ps_intra_solve(g, m, &o, &r, &err) != PS_OK)
        fail_msg("%s", err.msg);
    return r;
}

static const ps_sharding_spec *spec_of(const ps_graph *g, const ps_intra_result *r,
                                       const char *name)
{
    int t = ps_graph_find_tensor(g, name);
    assert_true(t >= 0);
    return &r->tensor_spec[t];
}

static void print_plan(const ps_graph *g, const ps_intra_result *r)
{
    for (int i = 0; i < g->n_ops; i++) {
        char spec[PS_SPEC_STR_MAX];
        const ps_op *op = &g->ops[i];
        printf("#  %-28s %-10s %-12s comm %.3g us reshard %.3g us\n", op->name,
               ps_pass_names[op->pass], r->op_strategy[i].name,
               r->op_strategy[i].comm_s * 1e6, r->reshard_in_s[i] * 1e6);
        (void)spec;
    }
}

/* Megatron's column-then-row split: the forward pass costs exactly one
 * all-reduce of the [batch, h] activation. */
static void mlp_shard_is_megatron(void **state)
{
    (void)state;
    int64_t B = 64, h = 4096; /* large enough that bandwidth, not latency, decides */
    ps_graph *g = mlp_block(B, h);
    ps_cluster *c;
    ps_logical_mesh *m = mesh("dgx-a100:1", 1, 8, &c);
    ps_intra_result *r = solve(g, m, PS_METHOD_SHARD);
    if (getenv("PS_TEST_VERBOSE"))
        print_plan(g, r);
    char s1[PS_SPEC_STR_MAX], s2[PS_SPEC_STR_MAX];
    ps_spec_format(spec_of(g, r, "fc1.w"), s1, sizeof s1);
    ps_spec_format(spec_of(g, r, "fc2.w"), s2, sizeof s2);
    assert_string_equal(s1, "R,S1"); /* column split */
    assert_string_equal(s2, "S1,R"); /* row split */
    double ar = ps_collective_s(m, PS_COLL_ALL_REDUCE, 2, (double)(B * h * 4));
    if (!close_to(r->comm_s[PS_PASS_FORWARD], ar))
        fail_msg("forward communication %.6g s, one all-reduce is %.6g s",
                 r->comm_s[PS_PASS_FORWARD], ar);
    ps_intra_result_free(r);
    ps_mesh_free(m);
    ps_cluster_free(c);
    ps_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mlp_shard_is_megatron),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
