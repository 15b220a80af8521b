#include "core/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/array.h"

const char *const ps_tensor_kind_names[PS_TENSOR_KIND_COUNT] = {
    "input", "param", "activation", "gradient", "opt_state"};
const char *const ps_pass_names[PS_PASS_COUNT] = {"forward", "recompute", "backward", "update"};

ps_status ps_graph_create(const char *name, ps_graph **out)
{
    *out = NULL;
    ps_graph *g = calloc(1, sizeof *g);
    if (g == NULL)
        return PS_ERR_NOMEM;
    g->name = strdup(name);
    g->loss = -1;
    if (g->name == NULL) {
        free(g);
        return PS_ERR_NOMEM;
    }
    *out = g;
    return PS_OK;
}

void ps_graph_free(ps_graph *g)
{
    if (g == NULL)
        return;
    for (int i = 0; i < g->n_tensors; i++)
        free(g->tensors[i].name);
    for (int i = 0; i < g->n_ops; i++)
        free(g->ops[i].name);
    free(g->tensors);
    free(g->ops);
    free(g->boundaries);
    free(g->name);
    free(g);
}

ps_status ps_graph_clone(const ps_graph *g, ps_graph **out)
{
    ps_status st = PS_OK;
    ps_graph *c = NULL;
    *out = NULL;
    PS_TRY(ps_graph_create(g->name, &c));
    PS_TRY(ps_array_grow((void **)&c->tensors, &c->cap_tensors, g->n_tensors, sizeof *c->tensors));
    PS_TRY(ps_array_grow((void **)&c->ops, &c->cap_ops, g->n_ops, sizeof *c->ops));
    PS_TRY(ps_array_grow((void **)&c->boundaries, &c->cap_boundaries, g->n_boundaries, sizeof(int)));
    for (int i = 0; i < g->n_tensors; i++) {
        c->tensors[i] = g->tensors[i];
        c->tensors[i].name = strdup(g->tensors[i].name);
        c->n_tensors++;
        if (c->tensors[i].name == NULL)
            PS_TRY(PS_ERR_NOMEM);
    }
    for (int i = 0; i < g->n_ops; i++) {
        c->ops[i] = g->ops[i];
        c->ops[i].name = strdup(g->ops[i].name);
        c->n_ops++;
        if (c->ops[i].name == NULL)
            PS_TRY(PS_ERR_NOMEM);
    }
    if (g->n_boundaries > 0)
        memcpy(c->boundaries, g->boundaries, (size_t)g->n_boundaries * sizeof(int));
    c->n_boundaries = g->n_boundaries;
    c->n_layers = g->n_layers;
    c->loss = g->loss;
    *out = c;
    c = NULL;
out:
    ps_graph_free(c);
    return st;
}

static ps_status push_tensor(ps_graph *g, const char *name, ps_tensor_kind kind,
                             const ps_tensor_desc *desc, int layer, int producer, int *id_out)
{
    if (ps_array_grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors + 1, sizeof *g->tensors) != PS_OK)
        return PS_ERR_NOMEM;
    char *copy = strdup(name);
    if (copy == NULL)
        return PS_ERR_NOMEM;
    ps_tensor *t = &g->tensors[g->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = copy;
    t->kind = kind;
    t->desc = *desc;
    t->layer = layer;
    t->producer = producer;
    t->grad_of = -1;
    t->state_of = -1;
    *id_out = g->n_tensors++;
    return PS_OK;
}

static ps_status check_desc(const ps_tensor_desc *d, const char *what, ps_error *err)
{
    if ((unsigned)d->dtype >= PS_DTYPE_COUNT)
        return ps_error_set(err, PS_ERR_INVALID, "%s: invalid dtype", what);
    if (d->rank < 0 || d->rank > PS_MAX_RANK)
        return ps_error_set(err, PS_ERR_INVALID, "%s: rank %d is not 0 to %d", what,
                            d->rank, PS_MAX_RANK);
    /* Element counts stay below 2^53 so that byte counts are exact doubles. */
    double numel = 1;
    for (int i = 0; i < d->rank; i++) {
        if (d->shape[i] <= 0)
            return ps_error_set(err, PS_ERR_INVALID,
                                "%s: dimension %d is %lld; dimensions must be positive",
                                what, i, (long long)d->shape[i]);
        numel *= (double)d->shape[i];
    }
    if (numel > 9007199254740992.0 / 8)
        return ps_error_set(err, PS_ERR_INVALID, "%s: %g elements is too many", what,
                            numel);
    return PS_OK;
}

ps_status ps_graph_add_source(ps_graph *g, const char *name, ps_tensor_kind kind,
                              const ps_tensor_desc *desc, int layer, int *id_out, ps_error *err)
{
    char what[300];
    snprintf(what, sizeof what, "tensor \"%s\"", name);
    ps_status st = check_desc(desc, what, err);
    if (st != PS_OK)
        return st;
    if (kind == PS_TENSOR_ACTIVATION || kind == PS_TENSOR_GRADIENT)
        return ps_error_set(err, PS_ERR_INVALID,
                            "tensor \"%s\": a %s must be produced by an op", name,
                            ps_tensor_kind_names[kind]);
    if ((kind == PS_TENSOR_PARAM || kind == PS_TENSOR_OPT_STATE) && desc->dtype == PS_DTYPE_I32)
        return ps_error_set(err, PS_ERR_INVALID, "tensor \"%s\": a %s must be floating-point",
                            name, ps_tensor_kind_names[kind]);
    if (layer < 0)
        return ps_error_set(err, PS_ERR_INVALID, "tensor \"%s\": negative layer %d", name, layer);
    st = push_tensor(g, name, kind, desc, layer, -1, id_out);
    if (st == PS_OK && layer + 1 > g->n_layers)
        g->n_layers = layer + 1;
    return st != PS_OK ? ps_error_set(err, st, "out of memory") : PS_OK;
}

/* A dispatch or combine whose slots a gate makes reads them as that gate
 * fills them: its experts and capacity (slot = expert * capacity + place).
 * Shapes alone do not show a mismatch, which the run would find mid-step or,
 * a smaller capacity, reinterpret silently. */
static ps_status check_moe_routing(const ps_graph *g, const ps_op_def *def,
                                   const ps_tensor_desc *in, ps_error *err)
{
    if ((def->kind != PS_OP_MOE_DISPATCH && def->kind != PS_OP_MOE_COMBINE) || def->n_in < 2)
        return PS_OK;
    int p = g->tensors[def->in[1]].producer;
    if (p < 0 || g->ops[p].kind != PS_OP_MOE_GATE)
        return PS_OK;
    const ps_op *gate = &g->ops[p];
    bool dispatch = def->kind == PS_OP_MOE_DISPATCH;
    int64_t e = dispatch ? def->attrs.experts : in[0].shape[0];
    int64_t cap = dispatch ? def->attrs.capacity : in[0].shape[2];
    if (e == gate->attrs.experts && cap == gate->attrs.capacity)
        return PS_OK;
    return ps_error_set(err, PS_ERR_INVALID,
                        "op \"%s\" (%s): %s %lld experts of capacity %lld, but gate \"%s\", "
                        "which makes its slots, routes to %lld experts of capacity %lld",
                        def->name, ps_op_kind_get(def->kind)->name,
                        dispatch ? "dispatches to" : "combines from", (long long)e,
                        (long long)cap, gate->name, (long long)gate->attrs.experts,
                        (long long)gate->attrs.capacity);
}

ps_status ps_graph_add_op(ps_graph *g, const ps_op_def *def, int *op_id_out, ps_error *err)
{
    ps_status st = PS_OK;
    const ps_op_kind_info *info = ps_op_kind_get(def->kind);
    if (info == NULL)
        return ps_error_set(err, PS_ERR_INVALID, "op \"%s\": unknown kind", def->name);
    if (def->layer < 0)
        return ps_error_set(err, PS_ERR_INVALID, "op \"%s\": negative layer %d", def->name,
                            def->layer);
    if (def->n_in < 0 || def->n_in > PS_MAX_OP_IO)
        return ps_error_set(err, PS_ERR_INVALID, "op \"%s\": %d inputs", def->name, def->n_in);
    ps_tensor_desc in[PS_MAX_OP_IO], outs[PS_MAX_OP_IO];
    for (int i = 0; i < def->n_in; i++) {
        int t = def->in[i];
        if (t < 0 || t >= g->n_tensors)
            return ps_error_set(err, PS_ERR_INVALID, "op \"%s\": input %d refers to tensor %d, "
                                "which does not exist (yet)",
                                def->name, i, t);
        in[i] = g->tensors[t].desc;
    }
    int n_out = 0;
    ps_error inner = {0};
    st = ps_op_infer(def->kind, &def->attrs, in, def->n_in, outs, &n_out, &inner);
    if (st != PS_OK)
        return ps_error_set(err, st, "op \"%s\" (%s): %s", def->name, info->name, inner.msg);
    if ((st = check_moe_routing(g, def, in, err)) != PS_OK)
        return st;
    for (int i = 0; i < n_out; i++) {
        char what[300];
        snprintf(what, sizeof what, "output %d of op \"%s\"", i, def->name);
        if ((st = check_desc(&outs[i], what, err)) != PS_OK)
            return st;
    }
    if (ps_array_grow((void **)&g->ops, &g->cap_ops, g->n_ops + 1, sizeof *g->ops) != PS_OK)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    int id = g->n_ops;
    ps_op *op = &g->ops[id];
    memset(op, 0, sizeof *op);
    op->name = strdup(def->name);
    if (op->name == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    op->kind = def->kind;
    op->pass = def->pass;
    op->layer = def->layer;
    op->block = def->layer;
    op->forward_op = def->forward_op;
    op->attrs = def->attrs;
    op->n_in = def->n_in;
    memcpy(op->in, def->in, sizeof op->in);
    op->cost = ps_op_cost_of(def->kind, &def->attrs, in, def->n_in, outs, n_out);
    g->n_ops++;
    ps_tensor_kind kind =
        def->pass == PS_PASS_BACKWARD ? PS_TENSOR_GRADIENT : PS_TENSOR_ACTIVATION;
    for (int i = 0; i < n_out; i++) {
        char name[256];
        if (n_out == 1)
            snprintf(name, sizeof name, "%s", def->name);
        else
            snprintf(name, sizeof name, "%s:%d", def->name, i);
        int t;
        if (push_tensor(g, name, kind, &outs[i], def->layer, id, &t) != PS_OK)
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        /* g->ops may not move here (only tensors grow), but index anyway */
        g->ops[id].out[g->ops[id].n_out++] = t;
    }
    if (def->layer + 1 > g->n_layers)
        g->n_layers = def->layer + 1;
    if (op_id_out != NULL)
        *op_id_out = id;
    return PS_OK;
}

ps_status ps_graph_add_boundary(ps_graph *g, int layer, ps_error *err)
{
    if (layer < 0)
        return ps_error_set(err, PS_ERR_INVALID, "pipeline boundary after negative layer %d",
                            layer);
    for (int i = 0; i < g->n_boundaries; i++)
        if (g->boundaries[i] == layer)
            return ps_error_set(err, PS_ERR_INVALID, "pipeline boundary after layer %d twice",
                                layer);
    if (ps_array_grow((void **)&g->boundaries, &g->cap_boundaries, g->n_boundaries + 1, sizeof(int)) !=
        PS_OK)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    int i = g->n_boundaries++;
    while (i > 0 && g->boundaries[i - 1] > layer) {
        g->boundaries[i] = g->boundaries[i - 1];
        i--;
    }
    g->boundaries[i] = layer;
    return PS_OK;
}

void ps_graph_update_layers(ps_graph *g)
{
    int n = 0;
    for (int i = 0; i < g->n_ops; i++)
        if (g->ops[i].layer + 1 > n)
            n = g->ops[i].layer + 1;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].layer + 1 > n)
            n = g->tensors[i].layer + 1;
    g->n_layers = n;
}

ps_status ps_graph_rename_tensor(ps_graph *g, int tensor, const char *name)
{
    char *copy = strdup(name);
    if (copy == NULL)
        return PS_ERR_NOMEM;
    free(g->tensors[tensor].name);
    g->tensors[tensor].name = copy;
    return PS_OK;
}

int ps_graph_find_tensor(const ps_graph *g, const char *name)
{
    for (int i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return i;
    return -1;
}

int64_t ps_tensor_numel(const ps_tensor *t) { return ps_tensor_desc_numel(&t->desc); }

double ps_tensor_bytes(const ps_tensor *t)
{
    return (double)ps_tensor_numel(t) * (double)ps_dtype_size(t->desc.dtype);
}

int64_t ps_graph_batch(const ps_graph *g)
{
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].kind == PS_TENSOR_INPUT && g->tensors[t].desc.rank > 0)
            return g->tensors[t].desc.shape[0];
    return 0;
}

ps_dtype ps_graph_param_dtype(const ps_graph *g, ps_dtype fallback)
{
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].kind == PS_TENSOR_PARAM)
            return g->tensors[t].desc.dtype;
    return fallback;
}

#define BROKEN(...) return ps_error_set(err, PS_ERR_INTERNAL, __VA_ARGS__)

ps_status ps_graph_check(const ps_graph *g, ps_error *err)
{
    for (int t = 0; t < g->n_tensors; t++) {
        const ps_tensor *x = &g->tensors[t];
        if (x->producer < -1 || x->producer >= g->n_ops)
            BROKEN("tensor %d (%s): producer %d out of range", t, x->name, x->producer);
        if ((x->producer < 0) != (x->kind == PS_TENSOR_INPUT || x->kind == PS_TENSOR_PARAM ||
                                  x->kind == PS_TENSOR_OPT_STATE))
            BROKEN("tensor %d (%s): kind %s does not match its producer", t, x->name,
                   ps_tensor_kind_names[x->kind]);
        if (x->grad_of >= g->n_tensors || x->state_of >= g->n_tensors)
            BROKEN("tensor %d (%s): grad_of/state_of out of range", t, x->name);
        if (x->kind == PS_TENSOR_OPT_STATE &&
            (x->state_of < 0 || g->tensors[x->state_of].kind != PS_TENSOR_PARAM))
            BROKEN("tensor %d (%s): optimizer state of no parameter", t, x->name);
    }
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        ps_tensor_desc in[PS_MAX_OP_IO], outs[PS_MAX_OP_IO];
        for (int k = 0; k < op->n_in; k++) {
            int t = op->in[k];
            if (t < 0 || t >= g->n_tensors)
                BROKEN("op %d (%s): input %d out of range", i, op->name, t);
            int p = g->tensors[t].producer;
            if (p >= i)
                BROKEN("op %d (%s): input %s is produced later (op %d): not topological", i,
                       op->name, g->tensors[t].name, p);
            in[k] = g->tensors[t].desc;
        }
        int n_out;
        ps_error inner = {0};
        if (ps_op_infer(op->kind, &op->attrs, in, op->n_in, outs, &n_out, &inner) != PS_OK)
            BROKEN("op %d (%s): %s", i, op->name, inner.msg);
        if (n_out != op->n_out)
            BROKEN("op %d (%s): %d outputs, expected %d", i, op->name, op->n_out, n_out);
        for (int k = 0; k < op->n_out; k++) {
            int t = op->out[k];
            if (t < 0 || t >= g->n_tensors || g->tensors[t].producer != i)
                BROKEN("op %d (%s): output %d is not produced by it", i, op->name, k);
            if (!ps_tensor_desc_equal(&g->tensors[t].desc, &outs[k]))
                BROKEN("op %d (%s): output %d has the wrong shape", i, op->name, k);
        }
        if (op->layer < 0 || op->layer >= g->n_layers)
            BROKEN("op %d (%s): layer %d out of range", i, op->name, op->layer);
    }
    if (g->loss >= 0 && (g->loss >= g->n_tensors || g->tensors[g->loss].desc.rank != 0))
        BROKEN("the loss is not a scalar tensor");
    return PS_OK;
}

ps_status ps_graph_stats_compute(const ps_graph *g, ps_graph_stats *out)
{
    memset(out, 0, sizeof *out);
    /* A tensor is kept for the backward pass when a backward or recompute op
     * reads it and it came from the forward pass (or is a per-batch input). */
    unsigned char *kept = calloc((size_t)g->n_tensors + 1, 1);
    if (kept == NULL)
        return PS_ERR_NOMEM;
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        out->flops[op->pass] += op->cost.flops;
        out->flops_total += op->cost.flops;
        out->ops[op->pass]++;
        if (op->kind == PS_OP_ADAM)
            out->gradient_bytes += ps_tensor_bytes(&g->tensors[op->in[1]]);
        if (op->pass != PS_PASS_BACKWARD && op->pass != PS_PASS_RECOMPUTE)
            continue;
        for (int k = 0; k < op->n_in; k++) {
            const ps_tensor *t = &g->tensors[op->in[k]];
            bool from_forward = t->kind == PS_TENSOR_INPUT ||
                                (t->producer >= 0 && g->ops[t->producer].pass == PS_PASS_FORWARD);
            if (from_forward)
                kept[op->in[k]] = 1;
        }
    }
    for (int t = 0; t < g->n_tensors; t++) {
        const ps_tensor *x = &g->tensors[t];
        if (x->kind == PS_TENSOR_PARAM) {
            out->params += ps_tensor_numel(x);
            out->weight_bytes += ps_tensor_bytes(x);
        } else if (x->kind == PS_TENSOR_OPT_STATE) {
            out->optimizer_bytes += ps_tensor_bytes(x);
        }
        if (kept[t])
            out->activation_bytes += ps_tensor_bytes(x);
    }
    free(kept);
    return PS_OK;
}

ps_status ps_graph_slice(const ps_graph *g, int lo, int hi, ps_graph **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_graph *s = NULL;
    int *map = malloc(((size_t)g->n_tensors + 1) * sizeof *map);
    *out = NULL;
    if (map == NULL || ps_graph_create(g->name, &s) != PS_OK) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int t = 0; t < g->n_tensors; t++)
        map[t] = -1;
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        if (op->layer < lo || op->layer > hi)
            continue;
        ps_op_def def = {.kind = op->kind, .name = op->name, .layer = op->layer - lo,
                         .pass = op->pass, .forward_op = -1, .n_in = op->n_in,
                         .attrs = op->attrs};
        for (int k = 0; k < op->n_in; k++) {
            int t = op->in[k];
            if (map[t] < 0) { /* from outside the slice (or a source): a source here */
                const ps_tensor *x = &g->tensors[t];
                ps_tensor_kind kind = x->producer >= 0 ? PS_TENSOR_INPUT : x->kind;
                int layer = x->layer >= lo && x->layer <= hi ? x->layer - lo : 0;
                PS_TRY(ps_graph_add_source(s, x->name, kind, &x->desc, layer, &map[t], err));
                s->tensors[map[t]].grad_of = -1;
            }
            def.in[k] = map[t];
        }
        int id;
        PS_TRY(ps_graph_add_op(s, &def, &id, err));
        s->ops[id].block = op->block;
        for (int k = 0; k < op->n_out; k++) {
            int t = op->out[k];
            map[t] = s->ops[id].out[k];
            if (ps_graph_rename_tensor(s, map[t], g->tensors[t].name) != PS_OK) {
                st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
                goto out;
            }
            s->tensors[map[t]].kind = g->tensors[t].kind;
        }
    }
    /* state_of / grad_of links inside the slice */
    for (int t = 0; t < g->n_tensors; t++) {
        if (map[t] < 0)
            continue;
        int so = g->tensors[t].state_of, go = g->tensors[t].grad_of;
        s->tensors[map[t]].state_of = so >= 0 ? map[so] : -1;
        s->tensors[map[t]].grad_of = go >= 0 ? map[go] : -1;
    }
    for (int t = 0; t < s->n_tensors; t++)
        if (s->tensors[t].kind == PS_TENSOR_OPT_STATE && s->tensors[t].state_of < 0)
            s->tensors[t].kind = PS_TENSOR_INPUT; /* its parameter is elsewhere */
    if (g->loss >= 0 && map[g->loss] >= 0)
        s->loss = map[g->loss];
    ps_graph_update_layers(s);
    PS_TRY(ps_graph_check(s, err));
    *out = s;
    s = NULL;
out:
    free(map);
    ps_graph_free(s);
    return st;
}

int ps_graph_slice_numbering(const ps_graph *g, int lo, int hi, int *slice_of)
{
    /* as ps_graph_slice meets them: each op's outside inputs, then its outputs */
    int next = 0;
    for (int t = 0; t < g->n_tensors; t++)
        slice_of[t] = -1;
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        if (op->layer < lo || op->layer > hi)
            continue;
        for (int k = 0; k < op->n_in; k++)
            if (slice_of[op->in[k]] < 0)
                slice_of[op->in[k]] = next++;
        for (int k = 0; k < op->n_out; k++)
            slice_of[op->out[k]] = next++;
    }
    return next;
}
