#include "planner/train_step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

ps_train_options ps_train_options_default(void)
{
    ps_train_options o;
    memset(&o, 0, sizeof o);
    o.remat = false;
    o.remat_layers = NULL;
    o.layer_stage = NULL;
    o.optimizer_dtype = PS_DTYPE_F32;
    o.master_weights = true;
    o.adam = ps_op_attrs_default(PS_OP_ADAM);
    o.loss_scale = 1.0;
    o.dynamic_loss_scale = false;
    o.loss_scale_window = PS_LOSS_SCALE_WINDOW_DEFAULT;
    return o;
}

/* State of one build. Arrays are indexed by tensor id and grown with the
 * graph (backward tensors are added as we go). */
typedef struct builder {
    ps_graph *g;
    ps_error *err;
    int n_forward_ops;
    int cap;
    int *grad;       /* tensor -> its accumulated gradient tensor, -1 */
    int *recomputed; /* forward tensor -> its recomputed copy, -1 */
    const int *layer_stage; /* ps_train_options.layer_stage */
    double loss_scale;      /* ps_train_options.loss_scale */
    bool *needs_grad;
    bool *layer_remat;
    bool *layer_recomputed;
} builder;

static ps_status ensure(builder *b)
{
    int need = b->g->n_tensors + 8;
    if (need <= b->cap)
        return PS_OK;
    int cap = b->cap * 2 > need ? b->cap * 2 : need;
    int *grad = realloc(b->grad, (size_t)cap * sizeof *grad);
    if (grad == NULL)
        return PS_ERR_NOMEM;
    b->grad = grad;
    int *rec = realloc(b->recomputed, (size_t)cap * sizeof *rec);
    if (rec == NULL)
        return PS_ERR_NOMEM;
    b->recomputed = rec;
    bool *ng = realloc(b->needs_grad, (size_t)cap * sizeof *ng);
    if (ng == NULL)
        return PS_ERR_NOMEM;
    b->needs_grad = ng;
    for (int i = b->cap; i < cap; i++) {
        b->grad[i] = -1;
        b->recomputed[i] = -1;
        b->needs_grad[i] = false;
    }
    b->cap = cap;
    return PS_OK;
}

/* Adds one op of the given pass and returns its id (or -1 on failure). */
static int emit(builder *b, ps_pass pass, const ps_op *fwd, int fwd_id, ps_op_kind kind,
                const char *suffix, const int *in, int n_in, const ps_op_attrs *attrs)
{
    char name[300];
    snprintf(name, sizeof name, "%s%s", fwd->name, suffix);
    ps_op_def def = {.kind = kind, .name = name, .layer = fwd->layer, .pass = pass,
                     .forward_op = fwd_id, .n_in = n_in,
                     .attrs = attrs ? *attrs : ps_op_attrs_default(kind)};
    memcpy(def.in, in, (size_t)n_in * sizeof *in);
    int id, block = fwd->block; /* fwd may point into the ops that grow */
    if (ps_graph_add_op(b->g, &def, &id, b->err) != PS_OK || ensure(b) != PS_OK)
        return -1;
    b->g->ops[id].block = block;
    return id;
}

static int out_of(const builder *b, int op, int i) { return b->g->ops[op].out[i]; }

/* Adds a gradient contribution g to tensor x (summing with earlier ones). */
static ps_status contribute(builder *b, int x, int g_t, const ps_op *fwd, int fwd_id)
{
    if (!b->needs_grad[x])
        return PS_OK;
    if (b->grad[x] < 0) {
        b->grad[x] = g_t;
        if (b->g->tensors[g_t].grad_of < 0)
            b->g->tensors[g_t].grad_of = x;
        return PS_OK;
    }
    char suffix[280];
    snprintf(suffix, sizeof suffix, ".grad_sum:%s", b->g->tensors[x].name);
    int in[2] = {b->grad[x], g_t};
    /* a parameter's contributions from different stages meet at the update */
    ps_pass pass = PS_PASS_BACKWARD;
    int prev = b->g->tensors[b->grad[x]].producer;
    if (b->layer_stage != NULL && b->g->tensors[x].kind == PS_TENSOR_PARAM && prev >= 0 &&
        (b->g->ops[prev].pass == PS_PASS_UPDATE ||
         b->layer_stage[b->g->ops[prev].layer] != b->layer_stage[fwd->layer]))
        pass = PS_PASS_UPDATE;
    int op = emit(b, pass, fwd, fwd_id, PS_OP_ADD, suffix, in, 2, NULL);
    if (op < 0)
        return b->err->status ? b->err->status : PS_ERR_NOMEM;
    int sum = out_of(b, op, 0);
    b->g->tensors[sum].grad_of = x;
    b->grad[x] = sum;
    return PS_OK;
}

/* The tensor a backward op of layer `layer` should read for forward tensor t. */
static int use(const builder *b, int t) { return b->recomputed[t] >= 0 ? b->recomputed[t] : t; }

/* Replays the forward ops of a layer before its backward ops (remat). */
static ps_status recompute_layer(builder *b, int layer)
{
    if (!b->layer_remat[layer] || b->layer_recomputed[layer])
        return PS_OK;
    b->layer_recomputed[layer] = true;
    for (int f = 0; f < b->n_forward_ops; f++) {
        const ps_op fwd = b->g->ops[f]; /* copy: g->ops may move while emitting */
        if (fwd.layer != layer)
            continue;
        int in[PS_MAX_OP_IO];
        for (int k = 0; k < fwd.n_in; k++)
            in[k] = use(b, fwd.in[k]);
        int op = emit(b, PS_PASS_RECOMPUTE, &fwd, f, fwd.kind, "@remat", in, fwd.n_in,
                      &fwd.attrs);
        if (op < 0)
            return b->err->status ? b->err->status : PS_ERR_NOMEM;
        for (int k = 0; k < fwd.n_out; k++) {
            int t = out_of(b, op, k);
            char name[300];
            snprintf(name, sizeof name, "%s@remat", b->g->tensors[fwd.out[k]].name);
            if (ps_graph_rename_tensor(b->g, t, name) != PS_OK)
                return PS_ERR_NOMEM;
            b->recomputed[fwd.out[k]] = t;
        }
    }
    return PS_OK;
}

#define EMIT(kind, suffix, attrs, ...)                                                        \
    emit(b, PS_PASS_BACKWARD, &fwd, f, kind, suffix, (int[]){__VA_ARGS__},                    \
         (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), attrs)
#define CHECK(op)                                                                             \
    do {                                                                                      \
        if ((op) < 0) {                                                                       \
            st = b->err->status ? b->err->status : PS_ERR_NOMEM;                              \
            goto out;                                                                         \
        }                                                                                     \
    } while (0)
#define GIVE(x, tensor) PS_TRY(contribute(b, (x), (tensor), &fwd, f))

/* Emits the gradient ops of forward op f, whose outputs' gradients are known. */
static ps_status backward_op(builder *b, int f)
{
    ps_status st = PS_OK;
    const ps_op fwd = b->g->ops[f];
    const int *x = fwd.in;
    int y = fwd.n_out > 0 ? fwd.out[0] : -1;
    int dy = y >= 0 ? b->grad[y] : -1;
    ps_op_attrs a = ps_op_attrs_default(fwd.kind);
    int op;
    /* copies: the tensor array may move while ops are emitted */
    const ps_tensor_desc x0 = b->g->tensors[x[0]].desc;
    const ps_tensor_desc x1 = fwd.n_in > 1 ? b->g->tensors[x[1]].desc : x0;

    switch (fwd.kind) {
    case PS_OP_MATMUL: {
        ps_einsum e;
        PS_TRY(ps_einsum_parse(fwd.attrs.einsum, &e, b->err));
        ps_einsum ga = {{e.rank[2], e.rank[1], e.rank[0]}, {{0}, {0}, {0}}};
        ps_einsum gb = {{e.rank[0], e.rank[2], e.rank[1]}, {{0}, {0}, {0}}};
        memcpy(ga.labels[0], e.labels[2], PS_MAX_RANK);
        memcpy(ga.labels[1], e.labels[1], PS_MAX_RANK);
        memcpy(ga.labels[2], e.labels[0], PS_MAX_RANK);
        memcpy(gb.labels[0], e.labels[0], PS_MAX_RANK);
        memcpy(gb.labels[1], e.labels[2], PS_MAX_RANK);
        memcpy(gb.labels[2], e.labels[1], PS_MAX_RANK);
        if (b->needs_grad[x[0]]) {
            a = ps_op_attrs_default(PS_OP_MATMUL);
            ps_einsum_format(&ga, a.einsum, sizeof a.einsum);
            CHECK(op = EMIT(PS_OP_MATMUL, ".grad_a", &a, dy, use(b, x[1])));
            GIVE(x[0], out_of(b, op, 0));
        }
        if (b->needs_grad[x[1]]) {
            a = ps_op_attrs_default(PS_OP_MATMUL);
            ps_einsum_format(&gb, a.einsum, sizeof a.einsum);
            CHECK(op = EMIT(PS_OP_MATMUL, ".grad_b", &a, use(b, x[0]), dy));
            GIVE(x[1], out_of(b, op, 0));
        }
        break;
    }
    case PS_OP_BIAS_ADD:
        GIVE(x[0], dy);
        if (b->needs_grad[x[1]]) {
            a.axes = (1u << (x0.rank - 1)) - 1;
            a.reduce = PS_REDUCE_SUM;
            CHECK(op = EMIT(PS_OP_REDUCE, ".grad_bias", &a, dy));
            GIVE(x[1], out_of(b, op, 0));
        }
        break;
    case PS_OP_ADD:
        GIVE(x[0], dy);
        GIVE(x[1], dy);
        break;
    case PS_OP_RELU:
        CHECK(op = EMIT(PS_OP_RELU_GRAD, ".grad", NULL, use(b, y), dy));
        GIVE(x[0], out_of(b, op, 0));
        break;
    case PS_OP_GELU:
        CHECK(op = EMIT(PS_OP_GELU_GRAD, ".grad", NULL, use(b, x[0]), dy));
        GIVE(x[0], out_of(b, op, 0));
        break;
    case PS_OP_LAYERNORM:
    case PS_OP_BATCHNORM:
        a.eps = fwd.attrs.eps;
        CHECK(op = EMIT(fwd.kind == PS_OP_LAYERNORM ? PS_OP_LAYERNORM_GRAD : PS_OP_BATCHNORM_GRAD,
                        ".grad", &a, use(b, x[0]), use(b, x[1]), dy));
        GIVE(x[0], out_of(b, op, 0));
        GIVE(x[1], out_of(b, op, 1));
        GIVE(x[2], out_of(b, op, 2));
        break;
    case PS_OP_SOFTMAX:
        a.scale = fwd.attrs.scale;
        a.causal = fwd.attrs.causal;
        CHECK(op = EMIT(PS_OP_SOFTMAX_GRAD, ".grad", &a, use(b, y), dy));
        GIVE(x[0], out_of(b, op, 0));
        break;
    case PS_OP_EMBEDDING: {
        a.shape_rank = 2;
        a.shape[0] = x0.shape[0];
        a.shape[1] = x0.shape[1];
        CHECK(op = EMIT(PS_OP_EMBEDDING_GRAD, ".grad", &a, use(b, x[1]), dy));
        GIVE(x[0], out_of(b, op, 0));
        break;
    }
    case PS_OP_CONV2D: {
        memcpy(a.stride, fwd.attrs.stride, sizeof a.stride);
        memcpy(a.pad, fwd.attrs.pad, sizeof a.pad);
        if (b->needs_grad[x[0]]) {
            a.shape_rank = 4;
            memcpy(a.shape, x0.shape, sizeof a.shape);
            CHECK(op = EMIT(PS_OP_CONV2D_GRAD_INPUT, ".grad_input", &a, dy, use(b, x[1])));
            GIVE(x[0], out_of(b, op, 0));
        }
        if (b->needs_grad[x[1]]) {
            a.shape_rank = 4;
            memcpy(a.shape, x1.shape, sizeof a.shape);
            CHECK(op = EMIT(PS_OP_CONV2D_GRAD_FILTER, ".grad_filter", &a, use(b, x[0]), dy));
            GIVE(x[1], out_of(b, op, 0));
        }
        break;
    }
    case PS_OP_POOL:
        a = fwd.attrs;
        CHECK(op = EMIT(PS_OP_POOL_GRAD, ".grad", &a, use(b, x[0]), use(b, y), dy));
        GIVE(x[0], out_of(b, op, 0));
        break;
    case PS_OP_RESHAPE:
        a.shape_rank = x0.rank;
        memcpy(a.shape, x0.shape, sizeof a.shape);
        CHECK(op = EMIT(PS_OP_RESHAPE, ".grad", &a, dy));
        GIVE(x[0], out_of(b, op, 0));
        break;
    case PS_OP_TRANSPOSE:
        for (int i = 0; i < x0.rank; i++)
            a.perm[fwd.attrs.perm[i]] = i;
        CHECK(op = EMIT(PS_OP_TRANSPOSE, ".grad", &a, dy));
        GIVE(x[0], out_of(b, op, 0));
        break;
    case PS_OP_REDUCE:
        a.axes = fwd.attrs.axes;
        a.reduce = fwd.attrs.reduce;
        a.shape_rank = x0.rank;
        memcpy(a.shape, x0.shape, sizeof a.shape);
        CHECK(op = EMIT(PS_OP_BROADCAST, ".grad", &a, dy));
        GIVE(x[0], out_of(b, op, 0));
        break;
    case PS_OP_BROADCAST:
        a.axes = fwd.attrs.axes;
        a.reduce = fwd.attrs.reduce;
        CHECK(op = EMIT(PS_OP_REDUCE, ".grad", &a, dy));
        GIVE(x[0], out_of(b, op, 0));
        break;
    case PS_OP_MSE_LOSS:
    case PS_OP_SOFTMAX_XENT:
        if (y != b->g->loss) {
            st = ps_error_set(b->err, PS_ERR_UNSUPPORTED,
                              "op \"%s\": a loss op must produce the graph's loss", fwd.name);
            goto out;
        }
        a.scale = b->loss_scale;
        CHECK(op = EMIT(fwd.kind == PS_OP_MSE_LOSS ? PS_OP_MSE_LOSS_GRAD
                                                   : PS_OP_SOFTMAX_XENT_GRAD,
                        ".grad", &a, use(b, x[0]), use(b, x[1])));
        GIVE(x[0], out_of(b, op, 0));
        break;
    case PS_OP_MOE_GATE: {
        int dweight = b->grad[fwd.out[1]];
        if (dweight < 0)
            break;
        a.top_k = fwd.attrs.top_k;
        CHECK(op = EMIT(PS_OP_MOE_GATE_GRAD, ".grad", &a, use(b, x[0]), use(b, fwd.out[0]),
                        dweight));
        GIVE(x[0], out_of(b, op, 0));
        break;
    }
    case PS_OP_MOE_DISPATCH:
        CHECK(op = EMIT(PS_OP_MOE_DISPATCH_GRAD, ".grad", NULL, dy, use(b, x[1])));
        GIVE(x[0], out_of(b, op, 0));
        break;
    case PS_OP_MOE_COMBINE:
        CHECK(op = EMIT(PS_OP_MOE_COMBINE_GRAD, ".grad", NULL, dy, use(b, x[0]), use(b, x[1]),
                        use(b, x[2])));
        GIVE(x[0], out_of(b, op, 0));
        GIVE(x[2], out_of(b, op, 1));
        break;
    default:
        st = ps_error_set(b->err, PS_ERR_UNSUPPORTED, "op \"%s\": no gradient rule for %s",
                          fwd.name, ps_op_kind_get(fwd.kind)->name);
        goto out;
    }
out:
    return st;
}

static bool is_float_tensor(const ps_tensor *t) { return t->desc.dtype != PS_DTYPE_I32; }

/* block: the block of the parameter's first reader (the update's), or -1. */
static ps_status add_adam(builder *b, const ps_train_options *opt, int p, int block)
{
    ps_status st = PS_OK;
    ps_graph *g = b->g;
    char name[300];
    int in[5] = {p, b->grad[p], -1, -1, -1};
    int n_in = 4;
    ps_tensor_desc d = g->tensors[p].desc;
    d.dtype = opt->optimizer_dtype;
    int layer = g->tensors[p].layer;
    const char *suffix[3] = {".adam_m", ".adam_v", ".master"};
    /* a master copy only keeps what the parameter's own dtype rounds away:
     * never a copy as narrow as the parameter (an fp32 parameter with bf16
     * Adam state updates itself in fp32) */
    bool master = opt->master_weights &&
                  ps_dtype_size(g->tensors[p].desc.dtype) < ps_dtype_size(opt->optimizer_dtype);
    for (int i = 0; i < (master ? 3 : 2); i++) {
        snprintf(name, sizeof name, "%s%s", g->tensors[p].name, suffix[i]);
        int id;
        PS_TRY(ps_graph_add_source(g, name, PS_TENSOR_OPT_STATE, &d, layer, &id, b->err));
        g->tensors[id].state_of = p;
        in[2 + i] = id;
        n_in = 3 + i;
    }
    n_in = master ? 5 : 4;
    snprintf(name, sizeof name, "%s.adam", g->tensors[p].name);
    ps_op_def def = {.kind = PS_OP_ADAM, .name = name, .layer = layer, .pass = PS_PASS_UPDATE,
                     .forward_op = -1, .n_in = n_in, .attrs = opt->adam};
    def.attrs.scale = opt->loss_scale;
    memcpy(def.in, in, sizeof in);
    int id;
    PS_TRY(ps_graph_add_op(g, &def, &id, b->err));
    g->ops[id].block = block >= 0 ? block : layer;
    PS_TRY(ensure(b));
out:
    return st;
}

ps_status ps_train_step_build(const ps_graph *forward, const ps_train_options *opt,
                              ps_graph **out, ps_error *err)
{
    ps_status st = PS_OK;
    builder bb = {0};
    builder *b = &bb;
    int *reader_block = NULL; /* [tensor]: block of its first forward reader, -1 */
    b->err = err;
    *out = NULL;
    PS_TRY(ps_graph_check(forward, err));
    for (int i = 0; i < forward->n_ops; i++)
        if (forward->ops[i].pass != PS_PASS_FORWARD) {
            st = ps_error_set(err, PS_ERR_INVALID,
                              "graph \"%s\" already holds a backward pass", forward->name);
            goto out;
        }
    if (forward->loss < 0) {
        st = ps_error_set(err, PS_ERR_INVALID, "graph \"%s\" has no loss", forward->name);
        goto out;
    }
    if ((unsigned)opt->optimizer_dtype >= PS_DTYPE_COUNT ||
        opt->optimizer_dtype == PS_DTYPE_I32) {
        st = ps_error_set(err, PS_ERR_INVALID, "the optimizer dtype must be floating-point");
        goto out;
    }
    if ((st = ps_graph_clone(forward, &b->g)) != PS_OK) {
        st = ps_error_set(err, st, "out of memory");
        goto out;
    }
    ps_graph *g = b->g;
    b->n_forward_ops = g->n_ops;
    PS_TRY(ensure(b));
    b->layer_remat = calloc((size_t)g->n_layers + 1, sizeof(bool));
    b->layer_recomputed = calloc((size_t)g->n_layers + 1, sizeof(bool));
    PS_TRY_ALLOC(b->layer_remat, err);
    PS_TRY_ALLOC(b->layer_recomputed, err);
    int loss_layer = g->ops[g->tensors[g->loss].producer].layer;
    b->layer_stage = opt->layer_stage;
    b->loss_scale = opt->loss_scale;
    for (int l = 0; l < g->n_layers; l++)
        b->layer_remat[l] = opt->remat_layers ? opt->remat_layers[l] : opt->remat;
    b->layer_remat[loss_layer] = false;

    /* Which tensors need a gradient: float parameters and what they reach. */
    for (int t = 0; t < g->n_tensors; t++)
        b->needs_grad[t] = g->tensors[t].kind == PS_TENSOR_PARAM;
    for (int f = 0; f < b->n_forward_ops; f++) {
        const ps_op *op = &g->ops[f];
        bool any = false;
        for (int k = 0; k < op->n_in; k++)
            any = any || b->needs_grad[op->in[k]];
        for (int k = 0; k < op->n_out; k++)
            b->needs_grad[op->out[k]] = any && is_float_tensor(&g->tensors[op->out[k]]);
    }

    /* Reverse pass. The loss gradient is implicit (d loss = 1). */
    b->grad[g->loss] = g->loss;
    for (int f = b->n_forward_ops - 1; f >= 0; f--) {
        const ps_op *op = &g->ops[f];
        bool has_grad = false;
        for (int k = 0; k < op->n_out; k++)
            has_grad = has_grad || b->grad[op->out[k]] >= 0;
        bool any_input = false;
        for (int k = 0; k < op->n_in; k++)
            any_input = any_input || b->needs_grad[op->in[k]];
        if (!has_grad || !any_input)
            continue;
        PS_TRY(recompute_layer(b, op->layer));
        PS_TRY(backward_op(b, f));
    }
    b->grad[g->loss] = -1;

    /* Adam for every parameter, in tensor order, in the block of the
     * parameter's first reader. */
    int n_sources = g->n_tensors;
    reader_block = malloc(((size_t)n_sources + 1) * sizeof *reader_block);
    PS_TRY_ALLOC(reader_block, err);
    for (int t = 0; t < n_sources; t++)
        reader_block[t] = -1;
    for (int f = 0; f < b->n_forward_ops; f++)
        for (int k = 0; k < g->ops[f].n_in; k++)
            if (reader_block[g->ops[f].in[k]] < 0)
                reader_block[g->ops[f].in[k]] = g->ops[f].block;
    for (int p = 0; p < n_sources; p++) {
        if (g->tensors[p].kind != PS_TENSOR_PARAM)
            continue;
        if (b->grad[p] < 0) {
            st = ps_error_set(err, PS_ERR_INVALID, "parameter \"%s\" does not affect the loss",
                              g->tensors[p].name);
            goto out;
        }
        PS_TRY(add_adam(b, opt, p, reader_block[p]));
    }
    PS_TRY(ps_graph_check(g, err));
    *out = g;
    b->g = NULL;
out:
    ps_graph_free(b->g);
    free(b->grad);
    free(b->recomputed);
    free(b->needs_grad);
    free(b->layer_remat);
    free(b->layer_recomputed);
    free(reader_block);
    return st;
}

ps_status ps_train_options_to_json(const ps_train_options *o, int n_layers, json_t **out)
{
    ps_status st = PS_OK;
    json_t *j = json_object(), *layers = NULL;
    *out = NULL;
    if (j == NULL)
        return PS_ERR_NOMEM;
    PS_TRY(ps_json_set(j, "remat", json_boolean(o->remat)));
    if (o->remat_layers != NULL) {
        layers = json_array();
        PS_TRY(ps_json_set(j, "remat_layers", layers));
        for (int l = 0; l < n_layers; l++)
            if (o->remat_layers[l])
                PS_TRY(ps_json_append(layers, json_integer(l)));
    }
    PS_TRY(ps_json_set(j, "optimizer_dtype", json_string(ps_dtype_name(o->optimizer_dtype))));
    PS_TRY(ps_json_set(j, "master_weights", json_boolean(o->master_weights)));
    PS_TRY(ps_json_set(j, "lr", json_real(o->adam.lr)));
    PS_TRY(ps_json_set(j, "beta1", json_real(o->adam.beta1)));
    PS_TRY(ps_json_set(j, "beta2", json_real(o->adam.beta2)));
    PS_TRY(ps_json_set(j, "eps", json_real(o->adam.adam_eps)));
    PS_TRY(ps_json_set(j, "weight_decay", json_real(o->adam.weight_decay)));
    if (o->loss_scale != 1.0 || o->dynamic_loss_scale) /* plans without scaling read as before */
        PS_TRY(ps_json_set(j, "loss_scale", json_real(o->loss_scale)));
    if (o->dynamic_loss_scale) {
        PS_TRY(ps_json_set(j, "dynamic_loss_scale", json_true()));
        PS_TRY(ps_json_set(j, "loss_scale_window", json_integer(o->loss_scale_window)));
    }
    *out = j;
    j = NULL;
out:
    json_decref(j);
    return st;
}

ps_status ps_train_options_from_json(const ps_jv *v, ps_train_options *out, bool **remat_layers,
                                     int n_layers, ps_error *err)
{
    static const char *const keys[] = {"remat", "remat_layers", "optimizer_dtype",
                                       "master_weights", "lr", "beta1", "beta2", "eps",
                                       "weight_decay", "loss_scale", "dynamic_loss_scale",
                                       "loss_scale_window", NULL};
    ps_status st = PS_OK;
    ps_jv x;
    int k;
    *out = ps_train_options_default();
    *remat_layers = NULL;
    PS_TRY(ps_jv_check_keys(v, keys, err));
    PS_TRY(ps_jv_opt_bool(v, "remat", false, &out->remat, err));
    PS_TRY(ps_jv_opt_bool(v, "master_weights", true, &out->master_weights, err));
    if (ps_jv_has(v, "optimizer_dtype")) {
        PS_TRY(ps_jv_member(v, "optimizer_dtype", &x, err));
        PS_TRY(ps_jv_enum(&x, ps_dtype_names, PS_FLOAT_DTYPE_COUNT, &k, err));
        out->optimizer_dtype = (ps_dtype)k;
    }
    PS_TRY(ps_jv_opt_double(v, "lr", out->adam.lr, 1e-30, 1e6, &out->adam.lr, err));
    PS_TRY(ps_jv_opt_double(v, "beta1", out->adam.beta1, 0, 0.999999, &out->adam.beta1, err));
    PS_TRY(ps_jv_opt_double(v, "beta2", out->adam.beta2, 0, 0.999999999, &out->adam.beta2, err));
    PS_TRY(ps_jv_opt_double(v, "eps", out->adam.adam_eps, 1e-30, 1, &out->adam.adam_eps, err));
    PS_TRY(ps_jv_opt_double(v, "weight_decay", 0, 0, 1e6, &out->adam.weight_decay, err));
    PS_TRY(ps_jv_opt_double(v, "loss_scale", 1.0, PS_LOSS_SCALE_MIN, PS_LOSS_SCALE_MAX,
                            &out->loss_scale, err));
    PS_TRY(ps_jv_opt_bool(v, "dynamic_loss_scale", false, &out->dynamic_loss_scale, err));
    if (ps_jv_has(v, "loss_scale_window")) {
        int64_t w;
        PS_TRY(ps_jv_member(v, "loss_scale_window", &x, err));
        if (!out->dynamic_loss_scale) {
            st = ps_jv_fail(&x, err, PS_ERR_INVALID,
                            "only a dynamic loss scale has a window (dynamic_loss_scale is "
                            "not true)");
            goto out;
        }
        PS_TRY(ps_jv_int(&x, 1, INT32_MAX, &w, err));
        out->loss_scale_window = (int)w;
    }
    if (ps_jv_has(v, "remat_layers")) {
        size_t n;
        PS_TRY(ps_jv_member(v, "remat_layers", &x, err));
        PS_TRY(ps_jv_array(&x, &n, err));
        *remat_layers = calloc((size_t)n_layers + 1, sizeof **remat_layers);
        PS_TRY_ALLOC(*remat_layers, err);
        for (size_t i = 0; i < n; i++) {
            ps_jv e = ps_jv_element(&x, i);
            int64_t l;
            PS_TRY(ps_jv_int(&e, 0, n_layers - 1, &l, err));
            (*remat_layers)[l] = true;
        }
        out->remat_layers = *remat_layers;
    }
out:
    if (st != PS_OK) {
        free(*remat_layers);
        *remat_layers = NULL;
    }
    return st;
}
