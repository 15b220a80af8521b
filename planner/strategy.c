#include "planner/strategy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- signatures -------------------------------------------------------------- */

static int new_label(ps_op_signature *s, int64_t size, bool splittable)
{
    if (s->n_labels >= PS_MAX_LABELS)
        return -1;
    int l = s->n_labels++;
    s->size[l] = size;
    s->splittable[l] = splittable && size > 1;
    s->batch[l] = false;
    s->internal_reduce[l] = false;
    return l;
}

static const ps_tensor_desc *in_desc(const ps_graph *g, const ps_op *op, int i)
{
    return &g->tensors[op->in[i]].desc;
}

/* Fresh labels for every dim of a tensor; `fixed` dims (bit mask) are never
 * split. */
static void fresh(ps_op_signature *s, const ps_tensor_desc *d, unsigned fixed, signed char *labels)
{
    for (int k = 0; k < d->rank && k < PS_MAX_RANK; k++)
        labels[k] = (signed char)new_label(s, d->shape[k], !(fixed & (1u << k)));
}

static void copy_labels(signed char *dst, const signed char *src, int rank)
{
    memcpy(dst, src, (size_t)rank);
}

/* Labels for a reshape: dimensions form groups of equal products; the
 * leading dimension of each group is split alike on both sides. */
static void reshape_labels(ps_op_signature *s, const ps_tensor_desc *a, const ps_tensor_desc *b)
{
    int i = 0, j = 0;
    while (i < a->rank || j < b->rank) {
        int gi = i, gj = j;
        int64_t pa = i < a->rank ? a->shape[i++] : 1;
        int64_t pb = j < b->rank ? b->shape[j++] : 1;
        while (pa != pb) {
            if (pa < pb && i < a->rank)
                pa *= a->shape[i++];
            else if (pb < pa && j < b->rank)
                pb *= b->shape[j++];
            else
                break;
        }
        int64_t x = gi < a->rank ? a->shape[gi] : 1, y = gj < b->rank ? b->shape[gj] : 1;
        while (y != 0) { /* gcd: a split must divide both leading dims */
            int64_t r = x % y;
            x = y;
            y = r;
        }
        int l = new_label(s, x, true);
        for (int k = gi; k < i && k < a->rank; k++)
            s->in[0][k] = (signed char)(k == gi ? l : -1);
        for (int k = gj; k < j && k < b->rank; k++)
            s->out[0][k] = (signed char)(k == gj ? l : -1);
    }
}

ps_status ps_op_signature_of(const ps_graph *g, int op_id, const unsigned char *batch_mask,
                             ps_op_signature *s, ps_error *err)
{
    const ps_op *op = &g->ops[op_id];
    memset(s, 0, sizeof *s);
    s->n_in = op->n_in;
    s->n_out = op->n_out;
    s->expert_label = s->group_label = -1;
    for (int i = 0; i < op->n_in; i++) {
        s->in_rank[i] = in_desc(g, op, i)->rank;
        memset(s->in[i], -1, sizeof s->in[i]);
    }
    for (int o = 0; o < op->n_out; o++) {
        s->out_rank[o] = g->tensors[op->out[o]].desc.rank;
        memset(s->out[o], -1, sizeof s->out[o]);
    }
    const ps_tensor_desc *x = op->n_in > 0 ? in_desc(g, op, 0) : NULL;
    int last = x ? x->rank - 1 : 0;
    signed char L[PS_MAX_RANK];
    switch (op->kind) {
    case PS_OP_MATMUL: {
        ps_einsum e;
        ps_status st = ps_einsum_parse(op->attrs.einsum, &e, err);
        if (st != PS_OK)
            return st;
        int of_letter[26];
        memset(of_letter, -1, sizeof of_letter);
        for (int o = 0; o < 2; o++)
            for (int k = 0; k < e.rank[o]; k++) {
                int c = e.labels[o][k] - 'a';
                if (of_letter[c] < 0)
                    of_letter[c] = new_label(s, in_desc(g, op, o)->shape[k], true);
                s->in[o][k] = (signed char)of_letter[c];
            }
        for (int k = 0; k < e.rank[2]; k++)
            s->out[0][k] = (signed char)of_letter[e.labels[2][k] - 'a'];
        break;
    }
    case PS_OP_BIAS_ADD:
        fresh(s, x, 0, L);
        copy_labels(s->in[0], L, x->rank);
        s->in[1][0] = L[last];
        copy_labels(s->out[0], L, x->rank);
        break;
    case PS_OP_ADD:
    case PS_OP_RELU:
    case PS_OP_GELU:
    case PS_OP_RELU_GRAD:
    case PS_OP_GELU_GRAD:
    case PS_OP_MSE_LOSS_GRAD:
    case PS_OP_ADAM:
        fresh(s, x, 0, L);
        for (int i = 0; i < op->n_in; i++)
            copy_labels(s->in[i], L, x->rank);
        for (int o = 0; o < op->n_out; o++)
            copy_labels(s->out[o], L, x->rank);
        break;
    case PS_OP_LAYERNORM:
    case PS_OP_LAYERNORM_GRAD:
        fresh(s, x, 1u << last, L); /* statistics over the last dim: keep it whole */
        copy_labels(s->in[0], L, x->rank);
        s->in[1][0] = L[last];
        if (op->kind == PS_OP_LAYERNORM) {
            s->in[2][0] = L[last];
            copy_labels(s->out[0], L, x->rank);
        } else {
            copy_labels(s->in[2], L, x->rank);
            copy_labels(s->out[0], L, x->rank);
            s->out[1][0] = s->out[2][0] = L[last];
        }
        break;
    case PS_OP_SOFTMAX:
    case PS_OP_SOFTMAX_GRAD:
        fresh(s, x, 1u << last, L);
        for (int i = 0; i < op->n_in; i++)
            copy_labels(s->in[i], L, x->rank);
        copy_labels(s->out[0], L, x->rank);
        break;
    case PS_OP_EMBEDDING: {
        const ps_tensor_desc *ids = in_desc(g, op, 1);
        int v = new_label(s, x->shape[0], true), h = new_label(s, x->shape[1], true);
        fresh(s, ids, 0, L);
        s->in[0][0] = (signed char)v;
        s->in[0][1] = (signed char)h;
        copy_labels(s->in[1], L, ids->rank);
        copy_labels(s->out[0], L, ids->rank);
        s->out[0][ids->rank] = (signed char)h;
        break;
    }
    case PS_OP_EMBEDDING_GRAD: {
        const ps_tensor_desc *ids = x, *table = &g->tensors[op->out[0]].desc;
        int v = new_label(s, table->shape[0], true), h = new_label(s, table->shape[1], true);
        fresh(s, ids, 0, L);
        copy_labels(s->in[0], L, ids->rank);
        copy_labels(s->in[1], L, ids->rank);
        s->in[1][ids->rank] = (signed char)h;
        s->out[0][0] = (signed char)v;
        s->out[0][1] = (signed char)h;
        break;
    }
    case PS_OP_CONV2D:
    case PS_OP_CONV2D_GRAD_INPUT:
    case PS_OP_CONV2D_GRAD_FILTER: {
        /* n batch, c input channels, o output channels; spatial dims whole */
        const ps_tensor_desc *w = op->kind == PS_OP_CONV2D_GRAD_FILTER
                                      ? &g->tensors[op->out[0]].desc
                                      : in_desc(g, op, 1);
        int64_t n_size = op->kind == PS_OP_CONV2D_GRAD_INPUT ? x->shape[0] : x->shape[0];
        int n = new_label(s, n_size, true), c = new_label(s, w->shape[1], true),
            o = new_label(s, w->shape[0], true);
        signed char xl[4] = {(signed char)n, (signed char)c, -1, -1};
        signed char yl[4] = {(signed char)n, (signed char)o, -1, -1};
        signed char wl[4] = {(signed char)o, (signed char)c, -1, -1};
        if (op->kind == PS_OP_CONV2D) {
            copy_labels(s->in[0], xl, 4);
            copy_labels(s->in[1], wl, 4);
            copy_labels(s->out[0], yl, 4);
        } else if (op->kind == PS_OP_CONV2D_GRAD_INPUT) {
            copy_labels(s->in[0], yl, 4);
            copy_labels(s->in[1], wl, 4);
            copy_labels(s->out[0], xl, 4);
        } else {
            copy_labels(s->in[0], xl, 4);
            copy_labels(s->in[1], yl, 4);
            copy_labels(s->out[0], wl, 4);
        }
        break;
    }
    case PS_OP_BATCHNORM:
    case PS_OP_BATCHNORM_GRAD: {
        unsigned fixed = 0;
        for (int k = 2; k < x->rank; k++)
            fixed |= 1u << k;
        fresh(s, x, fixed, L);
        s->internal_reduce[(int)L[0]] = true; /* synchronized statistics (and their gradients) */
        copy_labels(s->in[0], L, x->rank);
        s->in[1][0] = L[1];
        if (op->kind == PS_OP_BATCHNORM) {
            s->in[2][0] = L[1];
            copy_labels(s->out[0], L, x->rank);
        } else {
            copy_labels(s->in[2], L, x->rank);
            copy_labels(s->out[0], L, x->rank);
            s->out[1][0] = s->out[2][0] = L[1];
        }
        break;
    }
    case PS_OP_POOL:
    case PS_OP_POOL_GRAD: {
        int n = new_label(s, x->shape[0], true), c = new_label(s, x->shape[1], true);
        signed char l4[4] = {(signed char)n, (signed char)c, -1, -1};
        for (int i = 0; i < op->n_in; i++)
            copy_labels(s->in[i], l4, 4);
        copy_labels(s->out[0], l4, 4);
        break;
    }
    case PS_OP_RESHAPE:
        reshape_labels(s, x, &g->tensors[op->out[0]].desc);
        break;
    case PS_OP_TRANSPOSE:
        fresh(s, x, 0, L);
        copy_labels(s->in[0], L, x->rank);
        for (int k = 0; k < x->rank; k++)
            s->out[0][k] = L[op->attrs.perm[k]];
        break;
    case PS_OP_REDUCE: {
        fresh(s, x, 0, L);
        copy_labels(s->in[0], L, x->rank);
        int k2 = 0;
        for (int k = 0; k < x->rank; k++)
            if (!(op->attrs.axes & (1u << k)))
                s->out[0][k2++] = L[k];
        break;
    }
    case PS_OP_BROADCAST: {
        const ps_tensor_desc *y = &g->tensors[op->out[0]].desc;
        fresh(s, y, 0, L);
        copy_labels(s->out[0], L, y->rank);
        int k2 = 0;
        for (int k = 0; k < y->rank; k++)
            if (!(op->attrs.axes & (1u << k)))
                s->in[0][k2++] = L[k];
        break;
    }
    case PS_OP_MSE_LOSS:
        fresh(s, x, 0, L);
        copy_labels(s->in[0], L, x->rank);
        copy_labels(s->in[1], L, x->rank);
        break;
    case PS_OP_SOFTMAX_XENT:
    case PS_OP_SOFTMAX_XENT_GRAD:
        fresh(s, x, 0, L);
        s->internal_reduce[(int)L[last]] = true; /* vocab-parallel: all-reduce max and sum */
        copy_labels(s->in[0], L, x->rank);
        copy_labels(s->in[1], L, x->rank - 1);
        if (op->kind == PS_OP_SOFTMAX_XENT_GRAD)
            copy_labels(s->out[0], L, x->rank);
        break;
    case PS_OP_MOE_GATE:
    case PS_OP_MOE_GATE_GRAD: {
        /* top-k over all experts of a token, capacity over all tokens of a
         * group: only groups split */
        int gl = new_label(s, x->shape[0], true);
        signed char l3[3] = {(signed char)gl, -1, -1};
        for (int i = 0; i < op->n_in; i++)
            copy_labels(s->in[i], l3, 3);
        for (int o = 0; o < op->n_out; o++)
            copy_labels(s->out[o], l3, 3);
        break;
    }
    case PS_OP_MOE_DISPATCH:
    case PS_OP_MOE_COMBINE:
    case PS_OP_MOE_DISPATCH_GRAD:
    case PS_OP_MOE_COMBINE_GRAD: {
        /* operand roles: T tokens [g, s, m], K slots or weights [g, s, k],
         * E expert rows [e, g, c, m] */
        static const char *const roles[][2] = {
            [PS_OP_MOE_DISPATCH] = {"TK", "E"},
            [PS_OP_MOE_COMBINE] = {"EKK", "T"},
            [PS_OP_MOE_DISPATCH_GRAD] = {"EK", "T"},
            [PS_OP_MOE_COMBINE_GRAD] = {"TEKK", "EK"},
        };
        const char *in_roles = roles[op->kind][0], *out_roles = roles[op->kind][1];
        const ps_tensor_desc *e4 = NULL;
        for (int i = 0; i < op->n_in; i++)
            if (in_roles[i] == 'E')
                e4 = in_desc(g, op, i);
        for (int k = 0; k < op->n_out; k++)
            if (out_roles[k] == 'E')
                e4 = &g->tensors[op->out[k]].desc;
        int gl = new_label(s, e4->shape[1], true), el = new_label(s, e4->shape[0], true);
        int ml = new_label(s, e4->shape[3], true);
        s->group_label = gl;
        s->expert_label = el;
        for (int io = 0; io < 2; io++) {
            const char *r = io == 0 ? in_roles : out_roles;
            for (int i = 0; r[i] != '\0'; i++) {
                signed char *dst = io == 0 ? s->in[i] : s->out[i];
                if (r[i] == 'E') {
                    dst[0] = (signed char)el;
                    dst[1] = (signed char)gl;
                    dst[3] = (signed char)ml;
                } else {
                    dst[0] = (signed char)gl;
                    if (r[i] == 'T')
                        dst[2] = (signed char)ml;
                }
            }
        }
        break;
    }
    case PS_OP_KIND_COUNT: break;
    }
    /* batch labels: any input dimension flagged as batch */
    if (batch_mask != NULL)
        for (int i = 0; i < op->n_in; i++)
            for (int k = 0; k < s->in_rank[i]; k++)
                if ((batch_mask[op->in[i]] & (1u << k)) && s->in[i][k] >= 0)
                    s->batch[(int)s->in[i][k]] = true;
    return s->n_labels <= PS_MAX_LABELS ? PS_OK
                                        : ps_error_set(err, PS_ERR_INTERNAL, "too many labels");
}

ps_status ps_batch_dims(const ps_graph *g, unsigned char **mask_out, ps_error *err)
{
    unsigned char *mask = calloc((size_t)g->n_tensors + 1, 1);
    if (mask == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].kind == PS_TENSOR_INPUT && g->tensors[t].desc.rank > 0)
            mask[t] = 1;
    for (int i = 0; i < g->n_ops; i++) {
        ps_op_signature s;
        ps_status st = ps_op_signature_of(g, i, mask, &s, err);
        if (st != PS_OK) {
            free(mask);
            return st;
        }
        const ps_op *op = &g->ops[i];
        for (int o = 0; o < op->n_out; o++)
            for (int k = 0; k < s.out_rank[o]; k++)
                if (s.out[o][k] >= 0 && s.batch[(int)s.out[o][k]])
                    mask[op->out[o]] |= (unsigned char)(1u << k);
    }
    *mask_out = mask;
    return PS_OK;
}

/* ---- strategies ----------------------------------------------------------------- */

/* Spec of one operand under an axis assignment. `expert_side`: the operand
 * holds the expert label (for PS_LABEL_A2A). */
static ps_sharding_spec operand_spec(const ps_op_signature *s, const signed char *labels, int rank,
                                     const int assign[PS_MESH_AXES], bool is_output)
{
    ps_sharding_spec spec = ps_spec_replicated(rank);
    bool has_expert = false;
    for (int k = 0; k < rank; k++)
        has_expert = has_expert || (s->expert_label >= 0 && labels[k] == s->expert_label);
    for (int a = 0; a < PS_MESH_AXES; a++) {
        int l = assign[a];
        if (l == PS_LABEL_NONE)
            continue;
        if (l == PS_LABEL_A2A)
            l = has_expert ? s->expert_label : s->group_label;
        bool present = false;
        for (int k = 0; k < rank && k < PS_MAX_RANK; k++) {
            if (labels[k] == l && !(has_expert && assign[a] == PS_LABEL_A2A &&
                                    l == s->group_label)) {
                spec.dim_axes[k] |= (uint8_t)(1u << a);
                present = true;
            }
        }
        /* an output that lacks a split label is a partial sum over that
         * axis, unless the op reduces it itself */
        if (is_output && !present && !s->internal_reduce[l] && assign[a] != PS_LABEL_A2A)
            spec.partial |= (uint8_t)(1u << a);
    }
    return spec;
}

static bool label_in_inputs(const ps_op_signature *s, int l)
{
    for (int i = 0; i < s->n_in; i++)
        for (int k = 0; k < s->in_rank[i]; k++)
            if (s->in[i][k] == l)
                return true;
    return false;
}

static void name_of(const ps_op_signature *s, const int assign[PS_MESH_AXES], char *buf, int cap)
{
    int used = 0;
    (void)s;
    for (int a = 0; a < PS_MESH_AXES; a++) {
        if (assign[a] == PS_LABEL_NONE)
            continue;
        if (assign[a] == PS_LABEL_A2A)
            used += snprintf(buf + used, (size_t)(cap - used), "%sa2a@%d", used ? " " : "", a);
        else
            used += snprintf(buf + used, (size_t)(cap - used), "%sL%d@%d", used ? " " : "",
                             assign[a], a);
    }
    if (used == 0)
        snprintf(buf, (size_t)cap, "R");
}

/* Appends st unless a strategy with the same specs is there; returns n. */
static int push_unique(ps_strategy *list, int n, const ps_strategy *st, const ps_op *op)
{
    for (int j = 0; j < n; j++) {
        bool same = true;
        for (int i = 0; i < op->n_in && same; i++)
            same = ps_spec_equal(&list[j].in[i], &st->in[i]);
        for (int k = 0; k < op->n_out && same; k++)
            same = ps_spec_equal(&list[j].out[k], &st->out[k]);
        if (same) {
            if (st->compute_s + st->comm_s < list[j].compute_s + list[j].comm_s)
                list[j] = *st;
            return n;
        }
    }
    list[n] = *st;
    return n + 1;
}

static void add_comm(ps_strategy *st, const ps_logical_mesh *m, ps_collective kind, unsigned axes,
                     double bytes)
{
    st->comm_s += ps_collective_s(m, kind, axes, bytes);
    st->comm_kind = kind;
    st->comm_axes |= axes;
    st->comm_bytes += bytes;
}

/* Partial-sum outputs are reduced inside the op (an all-reduce, or a
 * reduce-scatter onto a dimension), once, whatever the consumers; only
 * outputs whose consumers take partial sums (the update, gradient sums)
 * stay partial. Adds the resulting strategies to list; returns n. */
static int add_variants(const ps_graph *g, const ps_op *op, const ps_logical_mesh *m,
                        const ps_strategy_options *o, const ps_strategy *base,
                        const ps_tensor_desc *outs, ps_strategy *list, int n)
{
    (void)g;
    int need[PS_MAX_OP_IO], n_need = 0;
    for (int k = 0; k < op->n_out; k++)
        if (base->out[k].partial && !(o->keep_partial && o->keep_partial[op->out[k]]))
            need[n_need++] = k;
    if (n_need == 0) {
        n = push_unique(list, n, base, op);
        /* gradient sums may add partial sums as they are */
        if (op->kind == PS_OP_ADD && o->keep_partial && o->keep_partial[op->out[0]]) {
            for (unsigned p = 1; p <= 3; p++) {
                ps_strategy v = *base;
                bool ok = true;
                for (int a = 0; a < PS_MESH_AXES; a++)
                    if ((p & (1u << a)) && (m->shape[a] == 1 || base->assign[a] != PS_LABEL_NONE))
                        ok = false;
                if (!ok)
                    continue;
                v.in[0].partial |= (uint8_t)p;
                v.in[1].partial |= (uint8_t)p;
                v.out[0].partial |= (uint8_t)p;
                snprintf(v.name, sizeof v.name, "%.24s+P%u", base->name, p);
                n = push_unique(list, n, &v, op);
            }
        }
        return n;
    }
    /* all-reduce every partial output */
    ps_strategy v = *base;
    for (int i = 0; i < n_need; i++) {
        int k = need[i];
        add_comm(&v, m, PS_COLL_ALL_REDUCE, v.out[k].partial,
                 ps_spec_tile_bytes(&v.out[k], &outs[k], m->shape));
        v.out[k].partial = 0;
    }
    size_t len = strlen(v.name);
    snprintf(v.name + len, sizeof v.name - len, "+ar");
    n = push_unique(list, n, &v, op);
    /* reduce-scatter the first onto one of its dimensions */
    int k0 = need[0];
    unsigned p = base->out[k0].partial;
    int64_t parts = 1;
    for (int a = 0; a < PS_MESH_AXES; a++)
        if (p & (1u << a))
            parts *= m->shape[a];
    for (int d = 0; d < outs[k0].rank; d++) {
        if (base->out[k0].dim_axes[d] != 0 || outs[k0].shape[d] % parts != 0)
            continue;
        v = *base;
        add_comm(&v, m, PS_COLL_REDUCE_SCATTER, p,
                 ps_spec_tile_bytes(&v.out[k0], &outs[k0], m->shape));
        v.out[k0].partial = 0;
        v.out[k0].dim_axes[d] = (uint8_t)p;
        for (int i = 1; i < n_need; i++) {
            int k = need[i];
            add_comm(&v, m, PS_COLL_ALL_REDUCE, v.out[k].partial,
                     ps_spec_tile_bytes(&v.out[k], &outs[k], m->shape));
            v.out[k].partial = 0;
        }
        len = strlen(base->name);
        snprintf(v.name, sizeof v.name, "%.24s+rs%d", base->name, d);
        n = push_unique(list, n, &v, op);
    }
    return n;
}

/* The local GEMM of a MATMUL (einsum e) under a strategy's assignment: each
 * label's size divided by the mesh axes that split it. false when that does
 * not account for the local FLOPs (an all-to-all assignment splits no label
 * of the einsum): the cost model then looks the GEMM up by FLOPs alone. */
static bool local_gemm_shape(const ps_einsum *e, const ps_op_signature *s, const int assign[2],
                             const ps_logical_mesh *m, double local_flops, ps_gemm_shape *out)
{
    int64_t size[26] = {0};
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < e->rank[o]; k++) {
            int l = s->in[o][k];
            int64_t n = s->size[l];
            for (int a = 0; a < PS_MESH_AXES; a++)
                if (assign[a] == l)
                    n /= m->shape[a];
            size[e->labels[o][k] - 'a'] = n;
        }
    *out = ps_einsum_gemm_shape(e, size);
    double f = ps_gemm_shape_flops(out);
    return fabs(f - local_flops) <= 1e-9 * local_flops;
}

/* The local GEMM of a convolution under a strategy: ps_conv_gemm_shape of
 * its input tiles (the output gives only its spatial dimensions, which no
 * strategy splits). false when that does not account for the local FLOPs. */
static bool local_conv_shape(ps_op_kind kind, const ps_strategy *st, const ps_tensor_desc *ins,
                             const ps_tensor_desc *outs, const ps_logical_mesh *m,
                             double local_flops, ps_gemm_shape *out)
{
    ps_tensor_desc tin[2];
    for (int i = 0; i < 2; i++)
        if (!ps_spec_tile(&st->in[i], &ins[i], m->shape, &tin[i]))
            return false;
    if (ps_conv_gemm_shape(kind, tin, &outs[0], out, NULL) != PS_OK)
        return false;
    double f = ps_gemm_shape_flops(out);
    return fabs(f - local_flops) <= 1e-9 * local_flops;
}

ps_status ps_op_strategies(const ps_graph *g, int op_id, const ps_op_signature *s,
                           const ps_logical_mesh *m, const ps_strategy_options *o,
                           ps_strategy **out, int *n_out, ps_error *err)
{
    const ps_op *op = &g->ops[op_id];
    int cand[PS_MESH_AXES][PS_MAX_LABELS + 2], n_cand[PS_MESH_AXES];
    int batch_label = -1;
    for (int l = 0; l < s->n_labels; l++)
        if (s->batch[l] && s->splittable[l] && batch_label < 0)
            batch_label = l;
    for (int a = 0; a < PS_MESH_AXES; a++) {
        n_cand[a] = 0;
        cand[a][n_cand[a]++] = PS_LABEL_NONE;
        if (m->shape[a] == 1)
            continue;
        for (int l = 0; l < s->n_labels; l++)
            if (s->splittable[l] && s->size[l] % m->shape[a] == 0)
                cand[a][n_cand[a]++] = l;
        if (s->expert_label >= 0 && s->size[s->expert_label] % m->shape[a] == 0 &&
            s->size[s->group_label] % m->shape[a] == 0)
            cand[a][n_cand[a]++] = PS_LABEL_A2A;
    }
    bool force = o->force_batch_axis0 && m->shape[0] > 1 && batch_label >= 0 &&
                 s->size[batch_label] % m->shape[0] == 0;
    /* each assignment may become one all-reduce and several reduce-scatter
     * variants; ADD also gets partial-sum pass-through variants */
    int cap = n_cand[0] * n_cand[1] * (2 + PS_MAX_RANK * 3) + 4;
    ps_strategy *list = calloc((size_t)cap, sizeof *list);
    if (list == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    int n = 0;
    ps_tensor_desc ins[PS_MAX_OP_IO], outs[PS_MAX_OP_IO];
    for (int i = 0; i < op->n_in; i++)
        ins[i] = g->tensors[op->in[i]].desc;
    for (int k = 0; k < op->n_out; k++)
        outs[k] = g->tensors[op->out[k]].desc;
    ps_dtype dt = op->n_out > 0 ? outs[0].dtype : ins[0].dtype;
    if (dt == PS_DTYPE_I32)
        dt = ins[0].dtype;
    bool gemm = op->kind == PS_OP_MATMUL || op->kind == PS_OP_CONV2D ||
                op->kind == PS_OP_CONV2D_GRAD_INPUT || op->kind == PS_OP_CONV2D_GRAD_FILTER;
    ps_einsum einsum; /* a MATMUL's, for its local GEMM shapes */
    bool have_einsum =
        op->kind == PS_OP_MATMUL && ps_einsum_parse(op->attrs.einsum, &einsum, NULL) == PS_OK;
    for (int i0 = 0; i0 < n_cand[0]; i0++) {
        for (int i1 = 0; i1 < n_cand[1]; i1++) {
            int assign[2] = {cand[0][i0], cand[1][i1]};
            if (force && assign[0] != batch_label)
                continue;
            if (assign[0] == PS_LABEL_A2A && assign[1] == PS_LABEL_A2A)
                continue;
            if (assign[0] >= 0 && assign[0] == assign[1] &&
                s->size[assign[0]] % ((int64_t)m->shape[0] * m->shape[1]) != 0)
                continue;
            /* A2A and a plain split of the expert or group label on the
             * other axis would use one dimension twice in a spec: skip */
            if ((assign[0] == PS_LABEL_A2A && (assign[1] == s->expert_label ||
                                               assign[1] == s->group_label)) ||
                (assign[1] == PS_LABEL_A2A && (assign[0] == s->expert_label ||
                                               assign[0] == s->group_label)))
                continue;
            ps_strategy *st = &list[n];
            memset(st, 0, sizeof *st);
            st->assign[0] = assign[0];
            st->assign[1] = assign[1];
            bool ok = true;
            for (int i = 0; i < op->n_in && ok; i++) {
                st->in[i] = operand_spec(s, s->in[i], s->in_rank[i], assign, false);
                ok = ps_spec_well_formed(&st->in[i]);
            }
            for (int k = 0; k < op->n_out && ok; k++) {
                st->out[k] = operand_spec(s, s->out[k], s->out_rank[k], assign, true);
                ok = ps_spec_well_formed(&st->out[k]);
                /* integer outputs (routing slots) cannot be partial sums */
                if (st->out[k].partial && outs[k].dtype == PS_DTYPE_I32)
                    ok = false;
            }
            if (!ok)
                continue;
            /* work divides by every axis that splits something */
            double parts = 1, local_bytes = 0;
            for (int a = 0; a < PS_MESH_AXES; a++)
                if (assign[a] != PS_LABEL_NONE)
                    parts *= m->shape[a];
            for (int i = 0; i < op->n_in; i++)
                local_bytes += ps_spec_tile_bytes(&st->in[i], &ins[i], m->shape);
            for (int k = 0; k < op->n_out; k++)
                local_bytes += ps_spec_tile_bytes(&st->out[k], &outs[k], m->shape);
            if (op->kind == PS_OP_RESHAPE)
                local_bytes = 0;
            ps_gemm_shape local;
            bool have_shape = have_einsum && local_gemm_shape(&einsum, s, assign, m,
                                                              op->cost.flops / parts, &local);
            if (gemm && op->kind != PS_OP_MATMUL)
                have_shape = local_conv_shape(op->kind, st, ins, outs, m, op->cost.flops / parts,
                                              &local);
            st->compute_s = ps_op_compute_s(m, op->kind, dt, op->cost.flops / parts, local_bytes,
                                            gemm, have_shape ? &local : NULL);
            /* collectives inside the op */
            for (int a = 0; a < PS_MESH_AXES; a++) {
                int l = assign[a];
                unsigned bit = 1u << a;
                if (l == PS_LABEL_A2A) {
                    /* tokens travel to their experts' devices (or back):
                     * every expert-split operand [e, g, c, m] moves to the
                     * group split the kernel computes with, one all-to-all
                     * each (planner/lower.c, kernel_layout): one for a
                     * dispatch or a combine, two for a combine's gradient,
                     * which reads the experts' outputs too */
                    for (int q = 0; q < op->n_in + op->n_out; q++) {
                        bool in = q < op->n_in;
                        const ps_tensor_desc *d = in ? &ins[q] : &outs[q - op->n_in];
                        const ps_sharding_spec *sp = in ? &st->in[q] : &st->out[q - op->n_in];
                        if (d->rank != 4 || !(sp->dim_axes[0] & bit))
                            continue;
                        double bytes = ps_spec_tile_bytes(sp, d, m->shape);
                        st->comm_s += ps_collective_s(m, PS_COLL_ALL_TO_ALL, bit, bytes);
                        st->comm_bytes += bytes;
                    }
                    st->comm_kind = PS_COLL_ALL_TO_ALL;
                    st->comm_axes |= bit;
                } else if (l >= 0 && s->internal_reduce[l] && label_in_inputs(s, l) &&
                           (a == 0 || assign[0] != l)) {
                    /* statistics, one all-reduce over every axis that splits
                     * the reduced label, of what the executors exchange: per
                     * row the softmax max and sum in fp32 (and the label's
                     * logit in the forward); per channel the batch-norm mean
                     * and variance in fp64, recomputed in the backward before
                     * its two totals (dgamma, dbeta). The other axes split
                     * the rows. */
                    unsigned axes = 0;
                    double split = 1;
                    for (int b = 0; b < PS_MESH_AXES; b++)
                        if (assign[b] == l) {
                            axes |= 1u << b;
                            split *= m->shape[b];
                        }
                    bool bn = op->kind == PS_OP_BATCHNORM || op->kind == PS_OP_BATCHNORM_GRAD;
                    double rows = bn ? (double)ins[0].shape[1]
                                     : (double)ps_tensor_desc_numel(&ins[0]) / (double)s->size[l];
                    double per_row = op->kind == PS_OP_SOFTMAX_XENT   ? 3 * 4
                                     : op->kind == PS_OP_BATCHNORM ? 2 * 8
                                     : bn                          ? 4 * 8
                                                                   : 2 * 4;
                    double bytes = per_row * rows / (parts / split);
                    st->comm_s += ps_collective_s(m, PS_COLL_ALL_REDUCE, axes, bytes);
                    st->comm_kind = PS_COLL_ALL_REDUCE;
                    st->comm_axes |= axes;
                    st->comm_bytes += bytes;
                }
            }
            name_of(s, assign, st->name, sizeof st->name);
            ps_strategy base = *st;
            n = add_variants(g, op, m, o, &base, outs, list, n);
        }
    }
    if (n == 0) { /* cannot happen: replicated is always a choice */
        free(list);
        return ps_error_set(err, PS_ERR_INTERNAL, "op %s has no strategy", op->name);
    }
    *out = list;
    *n_out = n;
    return PS_OK;
}

ps_status ps_source_specs(const ps_graph *g, int t, const ps_logical_mesh *m,
                          ps_sharding_spec **out, int *n_out, ps_error *err)
{
    const ps_tensor_desc *d = &g->tensors[t].desc;
    int cap = (d->rank + 1) * (d->rank + 1);
    ps_sharding_spec *list = calloc((size_t)cap, sizeof *list);
    if (list == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    int n = 0;
    for (int d0 = -1; d0 < d->rank; d0++) {
        for (int d1 = -1; d1 < d->rank; d1++) {
            if ((d0 >= 0 && m->shape[0] == 1) || (d1 >= 0 && m->shape[1] == 1))
                continue;
            ps_sharding_spec s = ps_spec_replicated(d->rank);
            if (d0 >= 0)
                s.dim_axes[d0] |= 1;
            if (d1 >= 0)
                s.dim_axes[d1] |= 2;
            ps_tensor_desc tile;
            if (!ps_spec_tile(&s, d, m->shape, &tile))
                continue;
            list[n++] = s;
        }
    }
    *out = list;
    *n_out = n;
    return PS_OK;
}
