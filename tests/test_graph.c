/* core/op + core/graph: shape inference, costs, invariants and graph files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/graph.h"
#include "core/json.h"
#include "planner/models/zoo.h"
#include "planner/train_step.h"

static ps_tensor_desc desc(ps_dtype dt, int rank, const int64_t *shape)
{
    ps_tensor_desc d = {.dtype = dt, .rank = rank};
    memcpy(d.shape, shape, (size_t)rank * sizeof *shape);
    return d;
}
#define D(dt, ...)                                                                             \
    desc(dt, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

static void einsum_matmul_shapes_and_flops(void **state)
{
    (void)state;
    ps_op_attrs a = ps_op_attrs_default(PS_OP_MATMUL);
    strcpy(a.einsum, "bsk,kn->bsn");
    ps_tensor_desc in[2] = {D(PS_DTYPE_F16, 4, 8, 16), D(PS_DTYPE_F16, 16, 32)}, out[2];
    int n;
    ps_error err = {0};
    assert_int_equal(ps_op_infer(PS_OP_MATMUL, &a, in, 2, out, &n, &err), PS_OK);
    assert_int_equal(n, 1);
    ps_tensor_desc want = D(PS_DTYPE_F16, 4, 8, 32);
    assert_true(ps_tensor_desc_equal(&out[0], &want));
    ps_op_cost c = ps_op_cost_of(PS_OP_MATMUL, &a, in, 2, out, 1);
    assert_true(c.flops == 2.0 * 4 * 8 * 16 * 32);
    assert_true(c.bytes_read == 2.0 * (4 * 8 * 16 + 16 * 32));
    assert_true(c.bytes_written == 2.0 * 4 * 8 * 32);

    /* mismatched contraction */
    in[1] = D(PS_DTYPE_F16, 15, 32);
    assert_int_equal(ps_op_infer(PS_OP_MATMUL, &a, in, 2, out, &n, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "shape mismatch for label 'k'"));
    /* malformed specs */
    static const char *const bad[] = {"bsk,kn",   "bsk,kn->bsz", "bbk,kn->bn", "bsK,Kn->bsn",
                                      "bsk,kn->", "bsk,kn->bs"};
    static const char *const why[] = {"expected the form", "is in no input", "repeated",
                                      "expected the form", "summed within one operand",
                                      "summed within one operand"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ps_einsum e;
        ps_error_clear(&err);
        assert_int_equal(ps_einsum_parse(bad[i], &e, &err), PS_ERR_INVALID);
        if (strstr(err.msg, why[i]) == NULL)
            fail_msg("%s: %s", bad[i], err.msg);
    }
}

static void inference_rejects_bad_operands(void **state)
{
    (void)state;
    static const struct {
        ps_op_kind kind;
        int n_in;
        const char *want;
    } cases[] = {
        {PS_OP_ADD, 2, "shape mismatch"},
        {PS_OP_BIAS_ADD, 2, "bias must be"},
        {PS_OP_LAYERNORM, 3, "gamma must be"},
        {PS_OP_SOFTMAX, 1, "causal softmax needs square"},
        {PS_OP_EMBEDDING, 2, "ids must be i32"},
        {PS_OP_CONV2D, 2, "channels"},
        {PS_OP_RESHAPE, 1, "changes the element count"},
        {PS_OP_SOFTMAX_XENT, 2, "labels must be i32"},
        {PS_OP_RELU, 2, "takes 1 inputs"},
    };
    ps_tensor_desc in[6];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ps_op_attrs a = ps_op_attrs_default(cases[i].kind);
        switch (cases[i].kind) {
        case PS_OP_ADD: in[0] = D(PS_DTYPE_F32, 2, 3); in[1] = D(PS_DTYPE_F32, 3, 2); break;
        case PS_OP_BIAS_ADD: in[0] = D(PS_DTYPE_F32, 2, 3); in[1] = D(PS_DTYPE_F32, 2); break;
        case PS_OP_LAYERNORM:
            in[0] = D(PS_DTYPE_F32, 2, 3);
            in[1] = D(PS_DTYPE_F32, 2);
            in[2] = D(PS_DTYPE_F32, 3);
            break;
        case PS_OP_SOFTMAX:
            a.causal = true;
            in[0] = D(PS_DTYPE_F32, 2, 3, 4);
            break;
        case PS_OP_EMBEDDING: in[0] = D(PS_DTYPE_F32, 10, 4); in[1] = D(PS_DTYPE_F32, 2, 3); break;
        case PS_OP_CONV2D:
            in[0] = D(PS_DTYPE_F32, 1, 3, 8, 8);
            in[1] = D(PS_DTYPE_F32, 4, 2, 3, 3);
            break;
        case PS_OP_RESHAPE:
            in[0] = D(PS_DTYPE_F32, 2, 3);
            a.shape_rank = 1;
            a.shape[0] = 7;
            break;
        case PS_OP_SOFTMAX_XENT:
            in[0] = D(PS_DTYPE_F32, 2, 5);
            in[1] = D(PS_DTYPE_F32, 2);
            break;
        default: in[0] = D(PS_DTYPE_F32, 2); in[1] = D(PS_DTYPE_F32, 2); break;
        }
        ps_tensor_desc out[6];
        int n;
        ps_error err = {0};
        assert_int_equal(ps_op_infer(cases[i].kind, &a, in, cases[i].n_in, out, &n, &err),
                         PS_ERR_INVALID);
        if (strstr(err.msg, cases[i].want) == NULL)
            fail_msg("%s: \"%s\" lacks \"%s\"", ps_op_kind_get(cases[i].kind)->name, err.msg,
                     cases[i].want);
    }
}

/* Conv and pool output sizes: (n + 2p - k) / s + 1. */
static void window_shapes(void **state)
{
    (void)state;
    ps_op_attrs a = ps_op_attrs_default(PS_OP_CONV2D);
    a.stride[0] = a.stride[1] = 2;
    a.pad[0] = a.pad[1] = 3;
    ps_tensor_desc in[2] = {D(PS_DTYPE_F32, 2, 3, 224, 224), D(PS_DTYPE_F32, 64, 3, 7, 7)}, out;
    int n;
    assert_int_equal(ps_op_infer(PS_OP_CONV2D, &a, in, 2, &out, &n, NULL), PS_OK);
    ps_tensor_desc want = D(PS_DTYPE_F32, 2, 64, 112, 112);
    assert_true(ps_tensor_desc_equal(&out, &want));
    ps_op_cost c = ps_op_cost_of(PS_OP_CONV2D, &a, in, 2, &out, 1);
    assert_true(c.flops == 2.0 * 2 * 64 * 112 * 112 * 3 * 7 * 7);
    ps_op_attrs p = ps_op_attrs_default(PS_OP_POOL);
    p.window[0] = p.window[1] = 3;
    p.stride[0] = p.stride[1] = 2;
    p.pad[0] = p.pad[1] = 1;
    assert_int_equal(ps_op_infer(PS_OP_POOL, &p, &out, 1, in, &n, NULL), PS_OK);
    want = D(PS_DTYPE_F32, 2, 64, 56, 56);
    assert_true(ps_tensor_desc_equal(&in[0], &want));
}

static void graph_rejects_bad_construction(void **state)
{
    (void)state;
    ps_graph *g = NULL;
    ps_error err = {0};
    assert_int_equal(ps_graph_create("g", &g), PS_OK);
    ps_tensor_desc d = D(PS_DTYPE_F32, 2, 0);
    int id;
    assert_int_equal(ps_graph_add_source(g, "x", PS_TENSOR_INPUT, &d, 0, &id, &err),
                     PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "dimensions must be positive"));
    d = D(PS_DTYPE_I32, 4);
    ps_error_clear(&err);
    assert_int_equal(ps_graph_add_source(g, "w", PS_TENSOR_PARAM, &d, 0, &id, &err),
                     PS_ERR_INVALID);
    d = D(PS_DTYPE_F32, INT64_C(1) << 31, INT64_C(1) << 31);
    ps_error_clear(&err);
    assert_int_equal(ps_graph_add_source(g, "huge", PS_TENSOR_INPUT, &d, 0, &id, &err),
                     PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "too many"));
    ps_op_def def = {.kind = PS_OP_RELU, .name = "r", .n_in = 1, .in = {5}, .forward_op = -1};
    ps_error_clear(&err);
    assert_int_equal(ps_graph_add_op(g, &def, NULL, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "does not exist"));
    assert_int_equal(g->n_ops, 0);
    assert_int_equal(ps_graph_check(g, NULL), PS_OK);
    ps_graph_free(g);
    ps_graph_free(NULL);
}

static char *dump_forward(const ps_graph *g)
{
    json_t *j = NULL;
    assert_int_equal(ps_graph_to_json(g, &j), PS_OK);
    char *text = ps_json_dumps(j);
    json_decref(j);
    assert_non_null(text);
    return text;
}

static ps_graph *load_text(const char *name, const char *text, ps_error *err)
{
    ps_json_doc *doc = NULL;
    ps_graph *g = NULL;
    if (ps_json_doc_parse(name, text, &doc, err) == PS_OK) {
        ps_jv root = ps_json_doc_root(doc);
        ps_graph_from_json(&root, &g, err);
    }
    ps_json_doc_free(doc);
    return g;
}

static ps_graph_stats step_stats(const ps_graph *fwd)
{
    ps_train_options o = ps_train_options_default();
    ps_graph *step = NULL;
    ps_error err = {0};
    if (ps_train_step_build(fwd, &o, &step, &err) != PS_OK)
        fail_msg("%s", err.msg);
    ps_graph_stats s;
    assert_int_equal(ps_graph_stats_compute(step, &s), PS_OK);
    ps_graph_free(step);
    return s;
}

/* ps_graph_slice_numbering gives every slice tensor its id in
 * ps_graph_slice's graph (names match one to one), on every zoo model's
 * training step and every range of up to three layers. */
static void slice_numbering_matches_the_slice(void **state)
{
    (void)state;
    for (int i = 0; i < ps_zoo_count(); i++) {
        ps_model_config c = ps_zoo_get(i)->config;
        c.batch = c.family == PS_MODEL_MOE ? 2 : 1;
        if (c.family != PS_MODEL_WRESNET && c.layers > 3)
            c.layers = 3;
        ps_graph *g = NULL, *step = NULL;
        ps_error err = {0};
        ps_train_options o = ps_train_options_default();
        assert_int_equal(ps_model_build(&c, &g, &err), PS_OK);
        assert_int_equal(ps_train_step_build(g, &o, &step, &err), PS_OK);
        int *slice_of = malloc((size_t)step->n_tensors * sizeof *slice_of);
        assert_non_null(slice_of);
        for (int lo = 0; lo < step->n_layers; lo++)
            for (int hi = lo; hi < step->n_layers && hi < lo + 3; hi++) {
                ps_graph *s = NULL;
                assert_int_equal(ps_graph_slice(step, lo, hi, &s, &err), PS_OK);
                int n = ps_graph_slice_numbering(step, lo, hi, slice_of), seen = 0;
                assert_int_equal(n, s->n_tensors);
                for (int t = 0; t < step->n_tensors; t++) {
                    if (slice_of[t] < 0)
                        continue;
                    seen++;
                    assert_in_range(slice_of[t], 0, n - 1);
                    assert_string_equal(s->tensors[slice_of[t]].name, step->tensors[t].name);
                }
                assert_int_equal(seen, n);
                ps_graph_free(s);
            }
        free(slice_of);
        ps_graph_free(step);
        ps_graph_free(g);
    }
}

/* Every zoo model: save -> load -> save gives the same text, and the loaded
 * graph trains to the same parameters, FLOPs and memory. */
static void zoo_round_trip_is_lossless(void **state)
{
    (void)state;
    for (int i = 0; i < ps_zoo_count(); i++) {
        ps_model_config c = ps_zoo_get(i)->config;
        c.batch = c.family == PS_MODEL_MOE ? 2 : 1;
        ps_graph *g = NULL;
        ps_error err = {0};
        assert_int_equal(ps_model_build(&c, &g, &err), PS_OK);
        char *text = dump_forward(g);
        ps_graph *back = load_text(c.name, text, &err);
        if (back == NULL)
            fail_msg("%s: %s", c.name, err.msg);
        char *again = dump_forward(back);
        assert_string_equal(text, again);
        assert_int_equal(back->n_ops, g->n_ops);
        assert_int_equal(back->n_tensors, g->n_tensors);
        assert_int_equal(back->n_layers, g->n_layers);
        assert_int_equal(back->n_boundaries, g->n_boundaries);
        assert_string_equal(back->tensors[back->loss].name, g->tensors[g->loss].name);
        ps_graph_stats a = step_stats(g), b = step_stats(back);
        assert_int_equal(a.params, b.params);
        assert_true(a.flops_total == b.flops_total);
        assert_true(a.activation_bytes == b.activation_bytes);
        assert_true(a.optimizer_bytes == b.optimizer_bytes);
        free(text);
        free(again);
        ps_graph_free(back);
        ps_graph_free(g);
    }
}

/* A hand-written file: references by id or name, ops out of order. */
static void loader_accepts_ids_and_any_op_order(void **state)
{
    (void)state;
    const char *text =
        "{\"format\": \"pipeshard-graph\", \"version\": 1, \"name\": \"tiny\",\n"
        " \"boundaries\": [0], \"loss\": \"loss\",\n"
        " \"tensors\": [\n"
        "  {\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"fp32\", \"shape\": [2, 4]},\n"
        "  {\"name\": \"y\", \"kind\": \"input\", \"dtype\": \"fp32\", \"shape\": [2, 3]},\n"
        "  {\"name\": \"w\", \"kind\": \"param\", \"dtype\": \"fp32\", \"shape\": [4, 3]},\n"
        "  {\"name\": \"h\", \"kind\": \"activation\", \"dtype\": \"fp32\", \"shape\": [2, 3]},\n"
        "  {\"name\": \"r\", \"kind\": \"activation\", \"dtype\": \"fp32\", \"shape\": [2, 3]},\n"
        "  {\"name\": \"loss\", \"kind\": \"activation\", \"dtype\": \"fp32\", \"shape\": []}],\n"
        " \"ops\": [\n"
        "  {\"name\": \"mse\", \"op\": \"mse_loss\", \"layer\": 1, \"in\": [4, \"y\"], \"out\": [5]},\n"
        "  {\"name\": \"act\", \"op\": \"relu\", \"layer\": 1, \"in\": [\"h\"], \"out\": [\"r\"]},\n"
        "  {\"name\": \"mm\", \"op\": \"matmul\", \"einsum\": \"bk,kn->bn\", \"in\": [0, 2],\n"
        "   \"out\": [\"h\"]}]}\n";
    ps_error err = {0};
    ps_graph *g = load_text("tiny.json", text, &err);
    if (g == NULL)
        fail_msg("%s", err.msg);
    assert_int_equal(g->n_ops, 3);
    assert_string_equal(g->ops[0].name, "mm");
    assert_string_equal(g->ops[2].name, "mse");
    assert_int_equal(g->n_layers, 2);
    assert_int_equal(g->n_boundaries, 1);
    assert_string_equal(g->tensors[g->loss].name, "loss");
    assert_int_equal(ps_graph_check(g, NULL), PS_OK);
    ps_graph_free(g);
}

/* Each malformed graph file fails to load (or to train) with its message. */
static void malformed_files(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/bad/graph.manifest", PS_TEST_DATA_DIR);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        skip();
    char line[1024];
    int checked = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char *tab = strchr(line, '\t');
        assert_non_null(tab);
        *tab = '\0';
        char file[1100];
        snprintf(file, sizeof file, "%s/bad/%s", PS_TEST_DATA_DIR, line);
        ps_graph *g = NULL, *step = NULL;
        ps_error err = {0};
        ps_status st = ps_graph_load(file, &g, &err);
        if (st == PS_OK) {
            ps_train_options o = ps_train_options_default();
            st = ps_train_step_build(g, &o, &step, &err);
        }
        if (st == PS_OK || strstr(err.msg, tab + 1) == NULL)
            fail_msg("%s: status %d, \"%s\" lacks \"%s\"", line, st, err.msg, tab + 1);
        ps_graph_free(step);
        ps_graph_free(g);
        checked++;
    }
    fclose(f);
    assert_true(checked >= 12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(einsum_matmul_shapes_and_flops),
        cmocka_unit_test(inference_rejects_bad_operands),
        cmocka_unit_test(window_shapes),
        cmocka_unit_test(graph_rejects_bad_construction),
        cmocka_unit_test(zoo_round_trip_is_lossless),
        cmocka_unit_test(slice_numbering_matches_the_slice),
        cmocka_unit_test(loader_accepts_ids_and_any_op_order),
        cmocka_unit_test(malformed_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
