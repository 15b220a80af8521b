/* planner/models: parameter counts against closed forms, FLOPs against
 * Megatron-LM's formula, and reference networks with published counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "planner/models/zoo.h"
#include "planner/train_step.h"

static ps_graph *build(const ps_model_config *c)
{
    ps_graph *g = NULL;
    ps_error err = {0};
    ps_status st = ps_model_build(c, &g, &err);
    if (st != PS_OK)
        fail_msg("%s: %s", c->name, err.msg);
    return g;
}

static ps_graph_stats step_stats(const ps_graph *fwd, bool remat)
{
    ps_train_options o = ps_train_options_default();
    o.remat = remat;
    ps_graph *step = NULL;
    ps_error err = {0};
    if (ps_train_step_build(fwd, &o, &step, &err) != PS_OK)
        fail_msg("%s: %s", fwd->name, err.msg);
    ps_graph_stats s;
    assert_int_equal(ps_graph_stats_compute(step, &s), PS_OK);
    ps_graph_free(step);
    return s;
}

static int64_t count_params(const ps_graph *g)
{
    int64_t n = 0;
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].kind == PS_TENSOR_PARAM)
            n += ps_tensor_numel(&g->tensors[t]);
    return n;
}

/* 12 L h^2 + 13 L h + V h + s h + 2 h (final layernorm), exactly. */
static void gpt_params_closed_form(void **state)
{
    (void)state;
    int checked = 0;
    for (int i = 0; i < ps_zoo_count(); i++) {
        ps_model_config c = ps_zoo_get(i)->config;
        if (c.family != PS_MODEL_GPT)
            continue;
        c.batch = 1;
        ps_graph *g = build(&c);
        int64_t L = c.layers, h = c.hidden, V = c.vocab, s = c.seq;
        int64_t want = 12 * L * h * h + 13 * L * h + V * h + s * h + 2 * h;
        if (count_params(g) != want)
            fail_msg("%s: %lld params, closed form %lld", c.name, (long long)count_params(g),
                     (long long)want);
        ps_graph_free(g);
        checked++;
    }
    assert_int_equal(checked, 11);
}

/* Megatron-LM: 72 B s L h^2 (1 + s/(6h) + V/(12 L h)) without remat and
 * 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) with full recomputation. */
static void gpt_flops_match_megatron(void **state)
{
    (void)state;
    for (int i = 0; i < ps_zoo_count(); i++) {
        ps_model_config c = ps_zoo_get(i)->config;
        if (c.family != PS_MODEL_GPT)
            continue;
        ps_graph *g = build(&c);
        double B = (double)c.batch, s = (double)c.seq, L = (double)c.layers,
               h = (double)c.hidden, V = (double)c.vocab;
        double plain = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h));
        double remat = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h));
        ps_graph_stats p = step_stats(g, false), r = step_stats(g, true);
        if (fabs(p.flops_total / plain - 1) > 0.01 || fabs(r.flops_total / remat - 1) > 0.01)
            fail_msg("%s: %.4g vs %.4g, remat %.4g vs %.4g", c.name, p.flops_total, plain,
                     r.flops_total, remat);
        /* remat keeps less: only the inputs of each block */
        assert_true(r.activation_bytes < p.activation_bytes / 4);
        ps_graph_free(g);
    }
}

/* Overrides describe any GPT-like model; the closed forms still hold. */
static void gpt_overrides(void **state)
{
    (void)state;
    ps_model_config c;
    assert_int_equal(ps_zoo_lookup("gpt-350m", &c, NULL), PS_OK);
    c.hidden = 96;
    c.ffn = 384;
    c.heads = 4;
    c.layers = 3;
    c.seq = 16;
    c.vocab = 101;
    c.batch = 3;
    ps_graph *g = build(&c);
    assert_int_equal(count_params(g), 12 * 3 * 96 * 96 + 13 * 3 * 96 + 101 * 96 + 16 * 96 + 2 * 96);
    assert_int_equal(g->n_layers, 5); /* embeddings, 3 blocks, head */
    ps_graph_free(g);
}

/* Per MoE block: attention 4h^2 + 4h, two layernorms 4h, gate h E, experts
 * 2 E h f (no expert biases); plus embeddings and the final layernorm. */
static void moe_params_closed_form(void **state)
{
    (void)state;
    for (int i = 0; i < ps_zoo_count(); i++) {
        ps_model_config c = ps_zoo_get(i)->config;
        if (c.family != PS_MODEL_MOE)
            continue;
        c.batch = 2;
        ps_graph *g = build(&c);
        int64_t L = c.layers, h = c.hidden, V = c.vocab, s = c.seq, E = c.experts, f = c.ffn;
        int64_t want = L * (4 * h * h + 8 * h + h * E + 2 * E * h * f) + V * h + s * h + 2 * h;
        assert_int_equal(count_params(g), want);
        /* the backward of every GEMM costs twice its forward */
        ps_graph_stats st = step_stats(g, false);
        double ratio = st.flops[PS_PASS_BACKWARD] / st.flops[PS_PASS_FORWARD];
        if (ratio < 1.95 || ratio > 2.05)
            fail_msg("%s: backward/forward FLOPs %.3f", c.name, ratio);
        ps_graph_free(g);
    }
}

/* Expert capacity and groups follow GShard: C = factor * k * S / E. */
static void moe_routing_shapes(void **state)
{
    (void)state;
    ps_model_config c;
    assert_int_equal(ps_zoo_lookup("moe-1.3b", &c, NULL), PS_OK);
    c.batch = 4; /* 4096 tokens = 2 groups of 2048 */
    ps_graph *g = build(&c);
    int found = 0;
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        if (op->kind != PS_OP_MOE_DISPATCH)
            continue;
        const ps_tensor_desc *d = &g->tensors[op->out[0]].desc;
        assert_int_equal(d->shape[0], 16);  /* experts */
        assert_int_equal(d->shape[1], 2);   /* groups */
        assert_int_equal(d->shape[2], 256); /* capacity 2 * 2048 / 16 */
        assert_int_equal(d->shape[3], 768);
        found++;
    }
    assert_int_equal(found, 16);
    ps_graph_free(g);
}

/* The tutorial MLP: two layers of Dense(4h)-relu-Dense(h)-relu, one boundary. */
static void mlp_structure(void **state)
{
    (void)state;
    ps_model_config c;
    assert_int_equal(ps_zoo_lookup("mlp", &c, NULL), PS_OK);
    assert_int_equal(c.hidden, 2048);
    assert_int_equal(c.batch, 2048);
    ps_graph *g = build(&c);
    int64_t h = 2048;
    assert_int_equal(count_params(g), 2 * (8 * h * h + 5 * h));
    assert_int_equal(g->n_layers, 2);
    assert_int_equal(g->n_boundaries, 1);
    assert_int_equal(g->boundaries[0], 0);
    assert_int_equal(g->ops[g->tensors[g->loss].producer].kind, PS_OP_MSE_LOSS);
    ps_graph_free(g);
}

/* With 64 base channels, width 1 and 1000 classes the Wide-ResNet builder is
 * ResNet-50: 25,557,032 parameters (torchvision's count) and about 4.1 G
 * multiply-adds per 224 px image. */
static void resnet50_reference(void **state)
{
    (void)state;
    ps_model_config c;
    assert_int_equal(ps_zoo_lookup("wresnet-250m", &c, NULL), PS_OK);
    c.channels = 64;
    c.width_factor = 1;
    c.classes = 1000;
    c.batch = 1;
    ps_graph *g = build(&c);
    assert_int_equal(count_params(g), 25557032);
    ps_graph_stats s = step_stats(g, false);
    assert_true(s.flops[PS_PASS_FORWARD] > 8.0e9 && s.flops[PS_PASS_FORWARD] < 8.6e9);
    ps_graph_free(g);
}

/* The Alpa suite's Wide-ResNet names are their parameter counts (within 5%). */
static void wresnet_sizes(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        double params;
    } want[] = {{"wresnet-250m", 250e6}, {"wresnet-500m", 500e6}, {"wresnet-1b", 1e9},
                {"wresnet-2b", 2e9},     {"wresnet-4b", 4e9},     {"wresnet-6.8b", 6.8e9},
                {"wresnet-13b", 13e9}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ps_model_config c;
        assert_int_equal(ps_zoo_lookup(want[i].name, &c, NULL), PS_OK);
        c.batch = 1;
        ps_graph *g = build(&c);
        double ratio = (double)count_params(g) / want[i].params;
        if (ratio < 0.95 || ratio > 1.05)
            fail_msg("%s: %lld parameters", want[i].name, (long long)count_params(g));
        ps_graph_free(g);
    }
}

static void invalid_configs(void **state)
{
    (void)state;
    ps_model_config c;
    ps_error err = {0};
    ps_graph *g = NULL;
    assert_int_equal(ps_zoo_lookup("gpt-7b", &c, &err), PS_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "gpt-6.7b"));

    assert_int_equal(ps_zoo_lookup("gpt-350m", &c, NULL), PS_OK);
    c.heads = 7;
    ps_error_clear(&err);
    assert_int_equal(ps_model_build(&c, &g, &err), PS_ERR_INVALID);
    assert_null(g);
    assert_non_null(strstr(err.msg, "heads (7) must divide hidden (1024)"));

    assert_int_equal(ps_zoo_lookup("wresnet-1b", &c, NULL), PS_OK);
    c.layers = 34;
    ps_error_clear(&err);
    assert_int_equal(ps_model_build(&c, &g, &err), PS_ERR_INVALID);

    assert_int_equal(ps_zoo_lookup("moe-380m", &c, NULL), PS_OK);
    c.top_k = 9;
    ps_error_clear(&err);
    assert_int_equal(ps_model_build(&c, &g, &err), PS_ERR_INVALID);

    assert_int_equal(ps_zoo_lookup("mlp", &c, NULL), PS_OK);
    c.batch = 0;
    ps_error_clear(&err);
    assert_int_equal(ps_model_build(&c, &g, &err), PS_ERR_INVALID);
    c.batch = 2;
    c.dtype = PS_DTYPE_I32;
    ps_error_clear(&err);
    assert_int_equal(ps_model_build(&c, &g, &err), PS_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gpt_params_closed_form), cmocka_unit_test(gpt_flops_match_megatron),
        cmocka_unit_test(gpt_overrides),          cmocka_unit_test(moe_params_closed_form),
        cmocka_unit_test(moe_routing_shapes),     cmocka_unit_test(mlp_structure),
        cmocka_unit_test(resnet50_reference),     cmocka_unit_test(wresnet_sizes),
        cmocka_unit_test(invalid_configs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
