#include "planner/models/builder.h"

#include <stdio.h>
#include <string.h>

void ps_mb_init(ps_model_builder *b, ps_graph *g, ps_dtype dtype, ps_error *err)
{
    memset(b, 0, sizeof *b);
    b->g = g;
    b->err = err;
    b->dtype = dtype;
}

void ps_mb_scope(ps_model_builder *b, int layer, const char *prefix)
{
    b->layer = layer;
    snprintf(b->prefix, sizeof b->prefix, "%s", prefix);
}

static void full_name(const ps_model_builder *b, const char *name, char *buf, size_t cap)
{
    if (snprintf(buf, cap, "%s%s", b->prefix, name) >= (int)cap)
        buf[cap - 1] = '\0'; /* a long name is cut, as snprintf cuts it */
}

static int source(ps_model_builder *b, const char *name, ps_tensor_kind kind, ps_dtype dtype,
                  int rank, const int64_t *shape)
{
    if (b->st != PS_OK)
        return -1;
    ps_tensor_desc d = {.dtype = dtype, .rank = rank};
    memcpy(d.shape, shape, (size_t)rank * sizeof *shape);
    char full[256];
    full_name(b, name, full, sizeof full);
    int id;
    b->st = ps_graph_add_source(b->g, full, kind, &d, b->layer, &id, b->err);
    return b->st == PS_OK ? id : -1;
}

int ps_mb_input(ps_model_builder *b, const char *name, ps_dtype dtype, int rank,
                const int64_t *shape)
{
    return source(b, name, PS_TENSOR_INPUT, dtype, rank, shape);
}

int ps_mb_param(ps_model_builder *b, const char *name, int rank, const int64_t *shape)
{
    return source(b, name, PS_TENSOR_PARAM, b->dtype, rank, shape);
}

int ps_mb_op(ps_model_builder *b, ps_op_kind kind, const char *name, const ps_op_attrs *attrs,
             int n_in, const int *in, int which)
{
    if (b->st != PS_OK)
        return -1;
    char full[256];
    full_name(b, name, full, sizeof full);
    ps_op_def def = {.kind = kind, .name = full, .layer = b->layer, .pass = PS_PASS_FORWARD,
                     .forward_op = -1, .n_in = n_in,
                     .attrs = attrs ? *attrs : ps_op_attrs_default(kind)};
    for (int i = 0; i < n_in; i++) {
        if (in[i] < 0) { /* an earlier failure already recorded */
            b->st = PS_ERR_INTERNAL;
            return -1;
        }
        def.in[i] = in[i];
    }
    int op;
    b->st = ps_graph_add_op(b->g, &def, &op, b->err);
    return b->st == PS_OK ? b->g->ops[op].out[which] : -1;
}

int ps_mb_matmul(ps_model_builder *b, const char *name, const char *einsum, int x, int w)
{
    ps_op_attrs a = ps_op_attrs_default(PS_OP_MATMUL);
    snprintf(a.einsum, sizeof a.einsum, "%s", einsum);
    return ps_mb_op(b, PS_OP_MATMUL, name, &a, 2, (int[]){x, w}, 0);
}

int ps_mb_unary(ps_model_builder *b, ps_op_kind kind, const char *name, int x)
{
    return ps_mb_op(b, kind, name, NULL, 1, &x, 0);
}

int ps_mb_binary(ps_model_builder *b, ps_op_kind kind, const char *name, int x, int y)
{
    return ps_mb_op(b, kind, name, NULL, 2, (int[]){x, y}, 0);
}

int ps_mb_reshape(ps_model_builder *b, const char *name, int x, int rank, const int64_t *shape)
{
    ps_op_attrs a = ps_op_attrs_default(PS_OP_RESHAPE);
    a.shape_rank = rank;
    memcpy(a.shape, shape, (size_t)rank * sizeof *shape);
    return ps_mb_op(b, PS_OP_RESHAPE, name, &a, 1, &x, 0);
}

int ps_mb_dense(ps_model_builder *b, const char *name, int x, int64_t n, bool bias)
{
    if (b->st != PS_OK || x < 0)
        return -1;
    const ps_tensor_desc *d = &b->g->tensors[x].desc;
    int rank = d->rank;
    int64_t k = d->shape[rank - 1];
    /* leading dims get labels a, b, c...; k and n are the contracted/new dims */
    char spec[PS_EINSUM_MAX], lead[PS_MAX_RANK + 1];
    for (int i = 0; i < rank - 1; i++)
        lead[i] = (char)('a' + i);
    lead[rank - 1] = '\0';
    snprintf(spec, sizeof spec, "%sk,kn->%sn", lead, lead);
    char pname[200];
    snprintf(pname, sizeof pname, "%s.w", name);
    int w = ps_mb_param(b, pname, 2, (int64_t[]){k, n});
    int y = ps_mb_matmul(b, name, spec, x, w);
    if (!bias)
        return y;
    snprintf(pname, sizeof pname, "%s.b", name);
    int bv = ps_mb_param(b, pname, 1, (int64_t[]){n});
    char oname[200];
    snprintf(oname, sizeof oname, "%s.bias", name);
    return ps_mb_binary(b, PS_OP_BIAS_ADD, oname, y, bv);
}

int ps_mb_layernorm(ps_model_builder *b, const char *name, int x)
{
    if (b->st != PS_OK || x < 0)
        return -1;
    const ps_tensor_desc *d = &b->g->tensors[x].desc;
    int64_t h = d->shape[d->rank - 1];
    char pname[200];
    snprintf(pname, sizeof pname, "%s.gamma", name);
    int g = ps_mb_param(b, pname, 1, &h);
    snprintf(pname, sizeof pname, "%s.beta", name);
    int be = ps_mb_param(b, pname, 1, &h);
    return ps_mb_op(b, PS_OP_LAYERNORM, name, NULL, 3, (int[]){x, g, be}, 0);
}

void ps_mb_boundary(ps_model_builder *b)
{
    if (b->st != PS_OK)
        return;
    b->st = ps_graph_add_boundary(b->g, b->layer, b->err);
}
