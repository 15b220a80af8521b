/* planner/train_step: the backward pass, remat and the Adam update. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "core/json.h"

#include "planner/models/builder.h"
#include "planner/models/zoo.h"
#include "planner/train_step.h"

static ps_graph *zoo_graph(const char *name, int64_t batch)
{
    ps_model_config c;
    assert_int_equal(ps_zoo_lookup(name, &c, NULL), PS_OK);
    c.batch = batch;
    ps_graph *g = NULL;
    ps_error err = {0};
    if (ps_model_build(&c, &g, &err) != PS_OK)
        fail_msg("%s", err.msg);
    return g;
}

static ps_graph *step_of(const ps_graph *fwd, const ps_train_options *o)
{
    ps_graph *step = NULL;
    ps_error err = {0};
    if (ps_train_step_build(fwd, o, &step, &err) != PS_OK)
        fail_msg("%s: %s", fwd->name, err.msg);
    return step;
}

/* Every parameter: one ADAM op reading a gradient of its shape and dtype, and
 * its optimizer state tensors of the optimizer dtype. */
static void check_update(const ps_graph *step, int states_per_param, ps_dtype opt_dtype)
{
    int n_params = 0, n_adam = 0, n_states = 0;
    for (int t = 0; t < step->n_tensors; t++) {
        const ps_tensor *x = &step->tensors[t];
        if (x->kind == PS_TENSOR_PARAM)
            n_params++;
        if (x->kind == PS_TENSOR_OPT_STATE) {
            n_states++;
            assert_int_equal(x->desc.dtype, opt_dtype);
            const ps_tensor *p = &step->tensors[x->state_of];
            assert_int_equal(p->kind, PS_TENSOR_PARAM);
            assert_int_equal(x->desc.rank, p->desc.rank);
            assert_memory_equal(x->desc.shape, p->desc.shape, sizeof(int64_t) * (size_t)p->desc.rank);
        }
    }
    for (int i = 0; i < step->n_ops; i++) {
        const ps_op *op = &step->ops[i];
        if (op->kind != PS_OP_ADAM)
            continue;
        n_adam++;
        assert_int_equal(op->pass, PS_PASS_UPDATE);
        assert_int_equal(op->n_in, 2 + states_per_param);
        const ps_tensor *p = &step->tensors[op->in[0]], *g = &step->tensors[op->in[1]];
        assert_int_equal(p->kind, PS_TENSOR_PARAM);
        assert_int_equal(g->kind, PS_TENSOR_GRADIENT);
        assert_true(ps_tensor_desc_equal(&p->desc, &g->desc));
        for (int k = 2; k < op->n_in; k++)
            assert_int_equal(step->tensors[op->in[k]].state_of, op->in[0]);
        /* the update comes after every op that reads the parameter */
        for (int j = i + 1; j < step->n_ops; j++)
            for (int k = 0; k < step->ops[j].n_in; k++)
                assert_true(step->ops[j].kind == PS_OP_ADAM || step->ops[j].in[k] != op->in[0]);
    }
    assert_int_equal(n_adam, n_params);
    assert_int_equal(n_states, states_per_param * n_params);
}

static void every_parameter_gets_a_gradient_and_two_fp32_states(void **state)
{
    (void)state;
    static const char *const models[] = {"mlp", "gpt-350m", "moe-380m", "wresnet-250m"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        ps_graph *fwd = zoo_graph(models[i], 2);
        ps_train_options o = ps_train_options_default();
        o.master_weights = false; /* exactly m and v */
        ps_graph *step = step_of(fwd, &o);
        check_update(step, 2, PS_DTYPE_F32);
        ps_graph_free(step);
        ps_graph_free(fwd);
    }
}

/* fp16 parameters with fp32 Adam also keep an fp32 master copy; a master
 * copy is only ever wider than its parameter. */
static void mixed_precision_master_weights(void **state)
{
    (void)state;
    ps_graph *fwd = zoo_graph("gpt-350m", 1);
    assert_int_equal(fwd->tensors[ps_graph_find_tensor(fwd, "wte")].desc.dtype, PS_DTYPE_F16);
    ps_train_options o = ps_train_options_default();
    ps_graph *step = step_of(fwd, &o);
    check_update(step, 3, PS_DTYPE_F32);
    ps_graph_stats s;
    assert_int_equal(ps_graph_stats_compute(step, &s), PS_OK);
    assert_true(s.optimizer_bytes == 6.0 * s.weight_bytes); /* 3 fp32 per fp16 */
    ps_graph_free(step);
    /* an fp32 model needs no master copy even when asked for one */
    ps_graph *mlp = zoo_graph("mlp", 4);
    step = step_of(mlp, &o);
    check_update(step, 2, PS_DTYPE_F32);
    ps_graph_free(step);
    /* nor with Adam's state narrower than its parameters: a "master" in bf16
     * would hold less than the fp32 parameter it is copied into */
    o.optimizer_dtype = PS_DTYPE_BF16;
    step = step_of(mlp, &o);
    check_update(step, 2, PS_DTYPE_BF16);
    ps_graph_free(step);
    /* fp16 parameters with bf16 state: as wide, no master either */
    step = step_of(fwd, &o);
    check_update(step, 2, PS_DTYPE_BF16);
    ps_graph_free(step);
    ps_graph_free(mlp);
    ps_graph_free(fwd);
}

/* Dense layer gradients are the two transposed GEMMs. */
static void matmul_gradient_specs(void **state)
{
    (void)state;
    ps_graph *fwd = zoo_graph("gpt-350m", 1);
    ps_graph *step = step_of(fwd, &(ps_train_options){.optimizer_dtype = PS_DTYPE_F32,
                                                      .adam = ps_op_attrs_default(PS_OP_ADAM),
                                                      .loss_scale = 1});
    int seen = 0;
    for (int i = 0; i < step->n_ops; i++) {
        const ps_op *op = &step->ops[i];
        if (op->pass != PS_PASS_BACKWARD || op->kind != PS_OP_MATMUL)
            continue;
        const ps_op *f = &step->ops[op->forward_op];
        if (strcmp(f->attrs.einsum, "abk,kn->abn") == 0) {
            const char *want = strstr(op->name, ".grad_a") ? "abn,kn->abk" : "abk,abn->kn";
            assert_string_equal(op->attrs.einsum, want);
            seen++;
        }
        if (strcmp(f->attrs.einsum, "bqad,bkad->baqk") == 0) {
            const char *want =
                strstr(op->name, ".grad_a") ? "baqk,bkad->bqad" : "bqad,baqk->bkad";
            assert_string_equal(op->attrs.einsum, want);
            seen++;
        }
        /* the backward GEMM costs what the forward one does */
        assert_true(op->cost.flops == f->cost.flops);
    }
    assert_true(seen > 24 * 6);
    ps_graph_free(step);
    ps_graph_free(fwd);
}

/* The tied embedding table is read twice; its gradients are summed. */
static void tied_embedding_gradients_are_summed(void **state)
{
    (void)state;
    ps_graph *fwd = zoo_graph("gpt-350m", 1);
    ps_train_options o = ps_train_options_default();
    ps_graph *step = step_of(fwd, &o);
    int wte = ps_graph_find_tensor(step, "wte");
    int sums = 0;
    for (int i = 0; i < step->n_ops; i++) {
        const ps_op *op = &step->ops[i];
        if (op->kind == PS_OP_ADD && op->pass == PS_PASS_BACKWARD &&
            step->tensors[op->out[0]].grad_of == wte)
            sums++;
        if (op->kind == PS_OP_ADAM && op->in[0] == wte)
            assert_int_equal(step->tensors[op->in[1]].grad_of, wte);
    }
    assert_int_equal(sums, 1);
    ps_graph_free(step);
    ps_graph_free(fwd);
}

/* Remat: recompute ops replay the forward of every layer but the loss's, and
 * backward ops never read a forward activation of their own layer. */
static void remat_recomputes_inside_layers(void **state)
{
    (void)state;
    ps_graph *fwd = zoo_graph("gpt-350m", 1);
    ps_train_options o = ps_train_options_default();
    o.remat = true;
    ps_graph *step = step_of(fwd, &o);
    int loss_layer = step->ops[step->tensors[step->loss].producer].layer;
    double fwd_flops = 0, rec_flops = 0;
    for (int i = 0; i < step->n_ops; i++) {
        const ps_op *op = &step->ops[i];
        if (op->pass == PS_PASS_FORWARD && op->layer != loss_layer)
            fwd_flops += op->cost.flops;
        if (op->pass == PS_PASS_RECOMPUTE) {
            assert_int_not_equal(op->layer, loss_layer);
            assert_int_equal(step->ops[op->forward_op].kind, op->kind);
            rec_flops += op->cost.flops;
        }
        if (op->pass != PS_PASS_BACKWARD)
            continue;
        for (int k = 0; k < op->n_in; k++) {
            const ps_tensor *t = &step->tensors[op->in[k]];
            if (t->producer >= 0 && step->ops[t->producer].pass == PS_PASS_FORWARD &&
                op->layer != loss_layer)
                assert_int_not_equal(t->layer, op->layer);
        }
    }
    assert_true(rec_flops == fwd_flops);
    /* per-layer override: nothing recomputed */
    bool none[64] = {false};
    o.remat_layers = none;
    ps_graph *step2 = step_of(fwd, &o);
    for (int i = 0; i < step2->n_ops; i++)
        assert_int_not_equal(step2->ops[i].pass, PS_PASS_RECOMPUTE);
    ps_graph_free(step2);
    ps_graph_free(step);
    ps_graph_free(fwd);
}

/* A graph using every forward op kind differentiates into a valid step. */
static void every_op_kind_has_a_gradient_rule(void **state)
{
    (void)state;
    ps_graph *g = NULL;
    ps_error err = {0};
    assert_int_equal(ps_graph_create("all-ops", &g), PS_OK);
    ps_model_builder mb, *b = &mb;
    ps_mb_init(b, g, PS_DTYPE_F32, &err);
    int img = ps_mb_input(b, "img", PS_DTYPE_F32, 4, (int64_t[]){2, 3, 8, 8});
    int w = ps_mb_param(b, "conv.w", 4, (int64_t[]){4, 3, 3, 3});
    ps_op_attrs ca = ps_op_attrs_default(PS_OP_CONV2D);
    ca.pad[0] = ca.pad[1] = 1;
    int x = ps_mb_op(b, PS_OP_CONV2D, "conv", &ca, 2, (int[]){img, w}, 0);
    int gamma = ps_mb_param(b, "bn.g", 1, (int64_t[]){4});
    int beta = ps_mb_param(b, "bn.b", 1, (int64_t[]){4});
    x = ps_mb_op(b, PS_OP_BATCHNORM, "bn", NULL, 3, (int[]){x, gamma, beta}, 0);
    ps_op_attrs pa = ps_op_attrs_default(PS_OP_POOL);
    pa.pool = PS_POOL_AVG;
    pa.window[0] = pa.window[1] = 2;
    pa.stride[0] = pa.stride[1] = 2;
    x = ps_mb_op(b, PS_OP_POOL, "pool", &pa, 1, &x, 0); /* [2,4,4,4] */
    ps_op_attrs ta = ps_op_attrs_default(PS_OP_TRANSPOSE);
    ta.perm[0] = 0, ta.perm[1] = 2, ta.perm[2] = 3, ta.perm[3] = 1;
    x = ps_mb_op(b, PS_OP_TRANSPOSE, "nhwc", &ta, 1, &x, 0);       /* [2,4,4,4] */
    x = ps_mb_reshape(b, "tokens", x, 3, (int64_t[]){2, 16, 4});    /* [g=2,s=16,m=4] */
    x = ps_mb_unary(b, PS_OP_GELU, "gelu", x);
    int ln = ps_mb_layernorm(b, "ln", x);
    int wg = ps_mb_param(b, "gate.w", 2, (int64_t[]){4, 3});
    int logits = ps_mb_matmul(b, "gate", "gsm,me->gse", ln, wg);
    ps_op_attrs ga = ps_op_attrs_default(PS_OP_MOE_GATE);
    ga.experts = 3;
    ga.capacity = 8;
    int slot = ps_mb_op(b, PS_OP_MOE_GATE, "route", &ga, 1, &logits, 0);
    int weight = ps_mb_op(b, PS_OP_MOE_GATE, "route2", &ga, 1, &logits, 1);
    ps_op_attrs da = ps_op_attrs_default(PS_OP_MOE_DISPATCH);
    da.experts = 3;
    da.capacity = 8;
    int d = ps_mb_op(b, PS_OP_MOE_DISPATCH, "dispatch", &da, 2, (int[]){ln, slot}, 0);
    int we = ps_mb_param(b, "expert.w", 3, (int64_t[]){3, 4, 4});
    d = ps_mb_matmul(b, "expert", "egcm,emf->egcf", d, we);
    d = ps_mb_unary(b, PS_OP_RELU, "expert.relu", d);
    int z = ps_mb_op(b, PS_OP_MOE_COMBINE, "combine", NULL, 3, (int[]){d, slot, weight}, 0);
    z = ps_mb_binary(b, PS_OP_ADD, "res", z, x);
    ps_op_attrs sm = ps_op_attrs_default(PS_OP_SOFTMAX);
    int att = ps_mb_matmul(b, "att", "gqm,gkm->gqk", z, z);
    sm.causal = true;
    att = ps_mb_op(b, PS_OP_SOFTMAX, "softmax", &sm, 1, &att, 0);
    z = ps_mb_matmul(b, "mix", "gqk,gkm->gqm", att, z);
    ps_op_attrs ra = ps_op_attrs_default(PS_OP_REDUCE);
    ra.axes = 1u << 1;
    ra.reduce = PS_REDUCE_MEAN;
    int pooled = ps_mb_op(b, PS_OP_REDUCE, "mean", &ra, 1, &z, 0); /* [2,4] */
    ps_op_attrs ba = ps_op_attrs_default(PS_OP_BROADCAST);
    ba.axes = 1u << 1;
    ba.shape_rank = 3;
    ba.shape[0] = 2, ba.shape[1] = 5, ba.shape[2] = 4;
    int wide = ps_mb_op(b, PS_OP_BROADCAST, "broadcast", &ba, 1, &pooled, 0);
    int table = ps_mb_param(b, "table", 2, (int64_t[]){7, 4});
    int ids = ps_mb_input(b, "ids", PS_DTYPE_I32, 2, (int64_t[]){2, 5});
    int emb = ps_mb_binary(b, PS_OP_EMBEDDING, "embed", table, ids);
    wide = ps_mb_binary(b, PS_OP_ADD, "wide.add", wide, emb);
    int logits2 = ps_mb_dense(b, "head", wide, 6, true);
    int labels = ps_mb_input(b, "labels", PS_DTYPE_I32, 2, (int64_t[]){2, 5});
    int loss = ps_mb_binary(b, PS_OP_SOFTMAX_XENT, "loss", logits2, labels);
    if (b->st != PS_OK)
        fail_msg("%s", err.msg);
    g->loss = loss;
    ps_graph_update_layers(g);
    ps_train_options o = ps_train_options_default();
    ps_graph *step = step_of(g, &o);
    check_update(step, 2, PS_DTYPE_F32);
    bool kinds[PS_OP_KIND_COUNT] = {false};
    for (int i = 0; i < step->n_ops; i++)
        kinds[step->ops[i].kind] = true;
    for (int k = 0; k < PS_OP_KIND_COUNT; k++)
        if (!kinds[k] && k != PS_OP_MSE_LOSS && k != PS_OP_MSE_LOSS_GRAD &&
            k != PS_OP_CONV2D_GRAD_INPUT)
            fail_msg("op kind %s not exercised", ps_op_kind_get((ps_op_kind)k)->name);
    ps_graph_free(step);
    ps_graph_free(g);
}

static void parameter_without_effect_is_an_error(void **state)
{
    (void)state;
    ps_graph *g = NULL;
    ps_error err = {0};
    assert_int_equal(ps_graph_create("dead", &g), PS_OK);
    ps_model_builder mb, *b = &mb;
    ps_mb_init(b, g, PS_DTYPE_F32, &err);
    int x = ps_mb_input(b, "x", PS_DTYPE_F32, 2, (int64_t[]){2, 3});
    int y = ps_mb_input(b, "y", PS_DTYPE_F32, 2, (int64_t[]){2, 3});
    ps_mb_param(b, "unused", 1, (int64_t[]){3});
    int h = ps_mb_dense(b, "dense", x, 3, false);
    int loss = ps_mb_binary(b, PS_OP_MSE_LOSS, "loss", h, y);
    assert_int_equal(b->st, PS_OK);
    g->loss = loss;
    ps_graph *step = NULL;
    ps_train_options o = ps_train_options_default();
    assert_int_equal(ps_train_step_build(g, &o, &step, &err), PS_ERR_INVALID);
    assert_null(step);
    assert_non_null(strstr(err.msg, "parameter \"unused\" does not affect the loss"));
    /* a graph without a loss cannot be trained */
    g->loss = -1;
    ps_error_clear(&err);
    assert_int_equal(ps_train_step_build(g, &o, &step, &err), PS_ERR_INVALID);
    ps_graph_free(g);
}

static ps_status read_options(const char *text, ps_train_options *out, ps_error *err)
{
    ps_json_doc *doc = NULL;
    bool *remat = NULL;
    ps_status st = ps_json_doc_parse("training", text, &doc, err);
    if (st == PS_OK) {
        ps_jv v = ps_json_doc_root(doc);
        st = ps_train_options_from_json(&v, out, &remat, 1, err);
    }
    free(remat);
    ps_json_doc_free(doc);
    return st;
}

/* Loss scaling: the loss gradient ops seed d(loss) = S and every ADAM op
 * divides by S; the options record it (only when it is not 1) and read it
 * back; a scale outside [2^-24, 2^40] is refused. */
static void loss_scale_reaches_loss_gradient_and_adam(void **state)
{
    (void)state;
    static const char *const models[] = {"mlp", "gpt-350m"};
    for (int i = 0; i < 2; i++) {
        ps_graph *fwd = zoo_graph(models[i], 2);
        ps_train_options o = ps_train_options_default();
        assert_true(o.loss_scale == 1);
        o.loss_scale = 1024;
        ps_graph *step = step_of(fwd, &o);
        int seeds = 0, adams = 0;
        for (int k = 0; k < step->n_ops; k++) {
            const ps_op *op = &step->ops[k];
            if (op->kind == PS_OP_MSE_LOSS_GRAD || op->kind == PS_OP_SOFTMAX_XENT_GRAD) {
                assert_true(op->attrs.scale == 1024);
                seeds++;
            } else if (op->kind == PS_OP_ADAM) {
                assert_true(op->attrs.scale == 1024);
                adams++;
            }
        }
        assert_int_equal(seeds, 1);
        assert_true(adams > 0);
        ps_graph_free(step);
        ps_graph_free(fwd);
    }
    /* the JSON round trip, and plans without scaling write nothing new */
    ps_train_options o = ps_train_options_default(), back;
    json_t *j = NULL;
    ps_error err = {0};
    assert_int_equal(ps_train_options_to_json(&o, 1, &j), PS_OK);
    assert_null(json_object_get(j, "loss_scale"));
    json_decref(j);
    o.loss_scale = 0x1p15;
    assert_int_equal(ps_train_options_to_json(&o, 1, &j), PS_OK);
    char *text = json_dumps(j, 0);
    json_decref(j);
    assert_int_equal(read_options(text, &back, &err), PS_OK);
    assert_true(back.loss_scale == 0x1p15);
    free(text);
    static const char *const bad[] = {"{\"loss_scale\": 0}", "{\"loss_scale\": -4}",
                                      "{\"loss_scale\": 1e300}", "{\"loss_scale\": \"big\"}",
                                      "{\"loss_scale\": 1e-9}"};
    for (int i = 0; i < 5; i++) {
        ps_error_clear(&err);
        assert_int_not_equal(read_options(bad[i], &back, &err), PS_OK);
        if (strstr(err.msg, "loss_scale") == NULL)
            fail_msg("%s: %s", bad[i], err.msg);
    }
    /* dynamic scaling: written with its window, read back; a window without
     * dynamic scaling, a bad window or a non-boolean switch is named */
    o = ps_train_options_default();
    o.dynamic_loss_scale = true;
    o.loss_scale = 0x1p16;
    o.loss_scale_window = 500;
    assert_int_equal(ps_train_options_to_json(&o, 1, &j), PS_OK);
    text = json_dumps(j, 0);
    json_decref(j);
    assert_int_equal(read_options(text, &back, &err), PS_OK);
    assert_true(back.dynamic_loss_scale && back.loss_scale == 0x1p16);
    assert_int_equal(back.loss_scale_window, 500);
    free(text);
    assert_int_equal(read_options("{\"dynamic_loss_scale\": true}", &back, &err), PS_OK);
    assert_int_equal(back.loss_scale_window, PS_LOSS_SCALE_WINDOW_DEFAULT);
    static const char *const bad_dynamic[][2] = {
        {"{\"loss_scale_window\": 100}", "only a dynamic loss scale has a window"},
        {"{\"dynamic_loss_scale\": false, \"loss_scale_window\": 100}", "only a dynamic"},
        {"{\"dynamic_loss_scale\": true, \"loss_scale_window\": 0}", "loss_scale_window"},
        {"{\"dynamic_loss_scale\": true, \"loss_scale_window\": 2.5}", "loss_scale_window"},
        {"{\"dynamic_loss_scale\": true, \"loss_scale_window\": 3000000000}",
         "loss_scale_window"},
        {"{\"dynamic_loss_scale\": \"yes\"}", "dynamic_loss_scale"},
    };
    for (int i = 0; i < 6; i++) {
        ps_error_clear(&err);
        assert_int_not_equal(read_options(bad_dynamic[i][0], &back, &err), PS_OK);
        if (strstr(err.msg, bad_dynamic[i][1]) == NULL)
            fail_msg("%s: %s", bad_dynamic[i][0], err.msg);
    }
    o = ps_train_options_default();
    /* a step built with an invalid scale is refused by the op checks */
    ps_graph *fwd = zoo_graph("mlp", 2), *step = NULL;
    o.loss_scale = 0;
    ps_error_clear(&err);
    assert_int_not_equal(ps_train_step_build(fwd, &o, &step, &err), PS_OK);
    assert_non_null(strstr(err.msg, "loss scale"));
    ps_graph_free(fwd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_parameter_gets_a_gradient_and_two_fp32_states),
        cmocka_unit_test(mixed_precision_master_weights),
        cmocka_unit_test(matmul_gradient_specs),
        cmocka_unit_test(tied_embedding_gradients_are_summed),
        cmocka_unit_test(remat_recomputes_inside_layers),
        cmocka_unit_test(every_op_kind_has_a_gradient_rule),
        cmocka_unit_test(parameter_without_effect_is_an_error),
        cmocka_unit_test(loss_scale_reaches_loss_gradient_and_adam),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
