#include "core/op.h"

#include <stdio.h>
#include <string.h>

/* ---- the table of kinds ------------------------------------------------ */

#define CONV_ATTRS (PS_ATTR_STRIDE | PS_ATTR_PAD)
#define POOL_ATTRS (PS_ATTR_POOL | PS_ATTR_WINDOW | PS_ATTR_STRIDE | PS_ATTR_PAD)

static const ps_op_kind_info kind_info[PS_OP_KIND_COUNT] = {
    [PS_OP_MATMUL] = {"matmul", 2, 2, 1, PS_ATTR_EINSUM, true},
    [PS_OP_BIAS_ADD] = {"bias_add", 2, 2, 1, 0, true},
    [PS_OP_ADD] = {"add", 2, 2, 1, 0, true},
    [PS_OP_RELU] = {"relu", 1, 1, 1, 0, true},
    [PS_OP_GELU] = {"gelu", 1, 1, 1, 0, true},
    [PS_OP_LAYERNORM] = {"layernorm", 3, 3, 1, PS_ATTR_EPS, true},
    [PS_OP_SOFTMAX] = {"softmax", 1, 1, 1, PS_ATTR_SCALE | PS_ATTR_CAUSAL, true},
    [PS_OP_EMBEDDING] = {"embedding", 2, 2, 1, 0, true},
    [PS_OP_CONV2D] = {"conv2d", 2, 2, 1, CONV_ATTRS, true},
    [PS_OP_BATCHNORM] = {"batchnorm", 3, 3, 1, PS_ATTR_EPS, true},
    [PS_OP_POOL] = {"pool", 1, 1, 1, POOL_ATTRS, true},
    [PS_OP_RESHAPE] = {"reshape", 1, 1, 1, PS_ATTR_SHAPE, true},
    [PS_OP_TRANSPOSE] = {"transpose", 1, 1, 1, PS_ATTR_PERM, true},
    [PS_OP_REDUCE] = {"reduce", 1, 1, 1, PS_ATTR_AXES | PS_ATTR_REDUCE, true},
    [PS_OP_BROADCAST] = {"broadcast", 1, 1, 1, PS_ATTR_AXES | PS_ATTR_REDUCE | PS_ATTR_SHAPE, true},
    [PS_OP_MSE_LOSS] = {"mse_loss", 2, 2, 1, 0, true},
    [PS_OP_SOFTMAX_XENT] = {"softmax_xent", 2, 2, 1, 0, true},
    [PS_OP_MOE_GATE] = {"moe_gate", 1, 1, 2, PS_ATTR_TOP_K | PS_ATTR_EXPERTS | PS_ATTR_CAPACITY,
                        true},
    [PS_OP_MOE_DISPATCH] = {"moe_dispatch", 2, 2, 1, PS_ATTR_EXPERTS | PS_ATTR_CAPACITY, true},
    [PS_OP_MOE_COMBINE] = {"moe_combine", 3, 3, 1, 0, true},
    [PS_OP_RELU_GRAD] = {"relu_grad", 2, 2, 1, 0, false},
    [PS_OP_GELU_GRAD] = {"gelu_grad", 2, 2, 1, 0, false},
    [PS_OP_LAYERNORM_GRAD] = {"layernorm_grad", 3, 3, 3, PS_ATTR_EPS, false},
    [PS_OP_SOFTMAX_GRAD] = {"softmax_grad", 2, 2, 1, PS_ATTR_SCALE | PS_ATTR_CAUSAL, false},
    [PS_OP_EMBEDDING_GRAD] = {"embedding_grad", 2, 2, 1, PS_ATTR_SHAPE, false},
    [PS_OP_CONV2D_GRAD_INPUT] = {"conv2d_grad_input", 2, 2, 1, CONV_ATTRS | PS_ATTR_SHAPE, false},
    [PS_OP_CONV2D_GRAD_FILTER] = {"conv2d_grad_filter", 2, 2, 1, CONV_ATTRS | PS_ATTR_SHAPE,
                                  false},
    [PS_OP_BATCHNORM_GRAD] = {"batchnorm_grad", 3, 3, 3, PS_ATTR_EPS, false},
    [PS_OP_POOL_GRAD] = {"pool_grad", 3, 3, 1, POOL_ATTRS, false},
    [PS_OP_MSE_LOSS_GRAD] = {"mse_loss_grad", 2, 2, 1, PS_ATTR_SCALE, false},
    [PS_OP_SOFTMAX_XENT_GRAD] = {"softmax_xent_grad", 2, 2, 1, PS_ATTR_SCALE, false},
    [PS_OP_MOE_GATE_GRAD] = {"moe_gate_grad", 3, 3, 1, PS_ATTR_TOP_K, false},
    [PS_OP_MOE_DISPATCH_GRAD] = {"moe_dispatch_grad", 2, 2, 1, 0, false},
    [PS_OP_MOE_COMBINE_GRAD] = {"moe_combine_grad", 4, 4, 2, 0, false},
    [PS_OP_ADAM] = {"adam", 4, 5, 0, PS_ATTR_ADAM | PS_ATTR_SCALE, false},
};

const ps_op_kind_info *ps_op_kind_get(ps_op_kind kind)
{
    return (unsigned)kind < PS_OP_KIND_COUNT ? &kind_info[kind] : NULL;
}

int ps_op_kind_parse(const char *name, ps_op_kind *out)
{
    for (int k = 0; k < PS_OP_KIND_COUNT; k++) {
        if (strcmp(kind_info[k].name, name) == 0) {
            *out = (ps_op_kind)k;
            return 0;
        }
    }
    return -1;
}

bool ps_loss_scale_valid(double s) { return s >= PS_LOSS_SCALE_MIN && s <= PS_LOSS_SCALE_MAX; }

bool ps_op_scales_loss(ps_op_kind kind)
{
    return kind == PS_OP_MSE_LOSS_GRAD || kind == PS_OP_SOFTMAX_XENT_GRAD || kind == PS_OP_ADAM;
}

ps_op_attrs ps_op_attrs_default(ps_op_kind kind)
{
    ps_op_attrs a;
    memset(&a, 0, sizeof a);
    a.eps = 1e-5;
    a.scale = 1.0;
    a.stride[0] = a.stride[1] = 1;
    a.window[0] = a.window[1] = 1;
    a.top_k = 2;
    a.lr = 1e-3;
    a.beta1 = 0.9;
    a.beta2 = 0.999;
    a.adam_eps = 1e-8;
    for (int i = 0; i < PS_MAX_RANK; i++)
        a.perm[i] = i;
    (void)kind;
    return a;
}

/* ---- descriptors --------------------------------------------------------- */

int64_t ps_tensor_desc_numel(const ps_tensor_desc *t)
{
    /* saturates, so that absurd shapes from a file compare unequal instead
     * of overflowing */
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        if (__builtin_mul_overflow(n, t->shape[i], &n))
            return INT64_MAX;
    return n;
}

bool ps_tensor_desc_equal(const ps_tensor_desc *a, const ps_tensor_desc *b)
{
    if (a->dtype != b->dtype || a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

static const char *shape_str(const ps_tensor_desc *t, char *buf, int cap)
{
    int used = snprintf(buf, (size_t)cap, "[");
    for (int i = 0; i < t->rank && used < cap; i++)
        used += snprintf(buf + used, (size_t)(cap - used), "%s%lld", i ? ", " : "",
                         (long long)t->shape[i]);
    if (used < cap)
        snprintf(buf + used, (size_t)(cap - used), "]");
    return buf;
}

const char *ps_tensor_desc_str(const ps_tensor_desc *t, char *buf, int cap)
{
    char s[160];
    snprintf(buf, (size_t)cap, "%s %s", shape_str(t, s, sizeof s), ps_dtype_name(t->dtype));
    return buf;
}

static double desc_bytes(const ps_tensor_desc *t)
{
    return (double)ps_tensor_desc_numel(t) * (double)ps_dtype_size(t->dtype);
}

static bool is_float(const ps_tensor_desc *t) { return t->dtype != PS_DTYPE_I32; }

/* ---- einsum -------------------------------------------------------------- */

double ps_gemm_shape_flops(const ps_gemm_shape *g)
{
    double batch = g->batch > 1 ? (double)g->batch : 1;
    return 2.0 * batch * (double)g->m * (double)g->n * (double)g->k;
}

ps_gemm_shape ps_einsum_gemm_shape(const ps_einsum *e, const int64_t size[26])
{
    ps_gemm_shape g = {.m = 1, .n = 1, .k = 1, .batch = 1};
    bool seen[26] = {false};
    for (int o = 0; o < 2; o++)
        for (int i = 0; i < e->rank[o]; i++) {
            int c = e->labels[o][i] - 'a';
            if (seen[c])
                continue;
            seen[c] = true;
            bool in_a = memchr(e->labels[0], 'a' + c, (size_t)e->rank[0]) != NULL;
            bool in_b = memchr(e->labels[1], 'a' + c, (size_t)e->rank[1]) != NULL;
            bool in_out = memchr(e->labels[2], 'a' + c, (size_t)e->rank[2]) != NULL;
            int64_t *dim = in_a && in_b ? (in_out ? &g.batch : &g.k) : in_a ? &g.m : &g.n;
            *dim *= size[c];
        }
    return g;
}

ps_status ps_einsum_parse(const char *spec, ps_einsum *out, ps_error *err)
{
    memset(out, 0, sizeof *out);
    int operand = 0;
    const char *p = spec;
    for (; *p != '\0'; p++) {
        char c = *p;
        if (c >= 'a' && c <= 'z') {
            if (out->rank[operand] >= PS_MAX_RANK)
                return ps_error_set(err, PS_ERR_INVALID,
                                    "einsum \"%s\": an operand has more than %d labels", spec,
                                    PS_MAX_RANK);
            for (int i = 0; i < out->rank[operand]; i++)
                if (out->labels[operand][i] == c)
                    return ps_error_set(err, PS_ERR_INVALID,
                                        "einsum \"%s\": label '%c' repeated in one operand", spec,
                                        c);
            out->labels[operand][out->rank[operand]++] = c;
        } else if (c == ',' && operand == 0) {
            operand = 1;
        } else if (c == '-' && p[1] == '>' && operand == 1) {
            operand = 2;
            p++;
        } else {
            return ps_error_set(err, PS_ERR_INVALID,
                                "einsum \"%s\": expected the form \"ab,bc->ac\" with lowercase "
                                "labels",
                                spec);
        }
    }
    if (operand != 2)
        return ps_error_set(err, PS_ERR_INVALID,
                            "einsum \"%s\": expected the form \"ab,bc->ac\"", spec);
    /* Output labels come from the inputs; a label dropped from the output must
     * be contracted between both inputs (a one-sided sum is a REDUCE). */
    for (int i = 0; i < out->rank[2]; i++) {
        char c = out->labels[2][i];
        if (memchr(out->labels[0], c, (size_t)out->rank[0]) == NULL &&
            memchr(out->labels[1], c, (size_t)out->rank[1]) == NULL)
            return ps_error_set(err, PS_ERR_INVALID,
                                "einsum \"%s\": output label '%c' is in no input", spec, c);
    }
    for (int o = 0; o < 2; o++) {
        for (int i = 0; i < out->rank[o]; i++) {
            char c = out->labels[o][i];
            bool in_out = memchr(out->labels[2], c, (size_t)out->rank[2]) != NULL;
            bool in_other = memchr(out->labels[1 - o], c, (size_t)out->rank[1 - o]) != NULL;
            if (!in_out && !in_other)
                return ps_error_set(err, PS_ERR_INVALID,
                                    "einsum \"%s\": label '%c' is summed within one operand; "
                                    "use a reduce op",
                                    spec, c);
        }
    }
    return PS_OK;
}

void ps_einsum_format(const ps_einsum *e, char *buf, int cap)
{
    snprintf(buf, (size_t)cap, "%.*s,%.*s->%.*s", e->rank[0], e->labels[0], e->rank[1],
             e->labels[1], e->rank[2], e->labels[2]);
}

/* Size of each label (indexed by letter) from the two inputs; 0 = absent. */
static ps_status einsum_sizes(const char *spec, const ps_einsum *e, const ps_tensor_desc *in,
                              int64_t sizes[26], ps_error *err)
{
    memset(sizes, 0, 26 * sizeof sizes[0]);
    for (int o = 0; o < 2; o++) {
        if (in[o].rank != e->rank[o])
            return ps_error_set(err, PS_ERR_INVALID,
                                "einsum \"%s\": operand %d has rank %d but %d labels", spec, o,
                                in[o].rank, e->rank[o]);
        for (int i = 0; i < e->rank[o]; i++) {
            int l = e->labels[o][i] - 'a';
            if (sizes[l] != 0 && sizes[l] != in[o].shape[i])
                return ps_error_set(err, PS_ERR_INVALID,
                                    "einsum \"%s\": shape mismatch for label '%c' (%lld vs %lld)",
                                    spec, 'a' + l, (long long)sizes[l],
                                    (long long)in[o].shape[i]);
            sizes[l] = in[o].shape[i];
        }
    }
    return PS_OK;
}

ps_status ps_matmul_gemm_shape(const char *einsum, const ps_tensor_desc in[2], ps_gemm_shape *out,
                               ps_error *err)
{
    ps_einsum e;
    int64_t sizes[26];
    ps_status st = ps_einsum_parse(einsum, &e, err);
    if (st == PS_OK)
        st = einsum_sizes(einsum, &e, in, sizes, err);
    if (st == PS_OK)
        *out = ps_einsum_gemm_shape(&e, sizes);
    return st;
}

ps_status ps_conv_gemm_shape(ps_op_kind kind, const ps_tensor_desc in[2], const ps_tensor_desc *out,
                             ps_gemm_shape *shape, ps_error *err)
{
    if (kind != PS_OP_CONV2D && kind != PS_OP_CONV2D_GRAD_INPUT &&
        kind != PS_OP_CONV2D_GRAD_FILTER)
        return ps_error_set(err, PS_ERR_INVALID, "%s is not a convolution",
                            ps_op_kind_get(kind)->name);
    if (in[0].rank != 4 || in[1].rank != 4 || out->rank != 4)
        return ps_error_set(err, PS_ERR_INVALID, "%s: operands of rank %d, %d and %d, not NCHW",
                            ps_op_kind_get(kind)->name, in[0].rank, in[1].rank, out->rank);
    /* the inputs give every split dimension (an input is never a partial
     * sum); the output only the spatial ones, which are never split */
    const int64_t *a = in[0].shape, *b = in[1].shape, *y = out->shape;
    *shape = (ps_gemm_shape){.batch = 1};
    switch (kind) {
    case PS_OP_CONV2D: /* x[N,C,H,W], w[O,C,KH,KW] -> y[N,O,OH,OW] */
        shape->m = a[0] * y[2] * y[3];
        shape->n = b[0];
        shape->k = b[1] * b[2] * b[3];
        break;
    case PS_OP_CONV2D_GRAD_INPUT: /* dy[N,O,OH,OW], w[O,C,KH,KW] -> dx */
        shape->m = a[0] * a[2] * a[3];
        shape->n = b[1] * b[2] * b[3];
        shape->k = b[0];
        break;
    default: /* grad_filter: x[N,C,H,W], dy[N,O,OH,OW] -> dw[O,C,KH,KW] */
        shape->m = b[1];
        shape->n = a[1] * y[2] * y[3];
        shape->k = b[0] * b[2] * b[3];
        break;
    }
    return PS_OK;
}

/* ---- inference ------------------------------------------------------------ */

#define FAIL(...) return ps_error_set(err, PS_ERR_INVALID, __VA_ARGS__)

static ps_status need_float(const ps_tensor_desc *t, const char *what, ps_error *err)
{
    if (!is_float(t))
        FAIL("%s must be a floating-point tensor, not %s", what, ps_dtype_name(t->dtype));
    return PS_OK;
}

static ps_status need_same(const ps_tensor_desc *a, const ps_tensor_desc *b, const char *an,
                           const char *bn, ps_error *err)
{
    if (!ps_tensor_desc_equal(a, b)) {
        char sa[200], sb[200];
        FAIL("shape mismatch: %s is %s but %s is %s", an, ps_tensor_desc_str(a, sa, sizeof sa), bn,
             ps_tensor_desc_str(b, sb, sizeof sb));
    }
    return PS_OK;
}

static ps_status need_rank(const ps_tensor_desc *t, int lo, int hi, const char *what,
                           ps_error *err)
{
    if (t->rank < lo || t->rank > hi) {
        if (lo == hi)
            FAIL("%s must have rank %d, has rank %d", what, lo, t->rank);
        FAIL("%s must have rank %d to %d, has rank %d", what, lo, hi, t->rank);
    }
    return PS_OK;
}

/* A vector parameter (gamma, beta, bias) of length n and the data dtype. */
static ps_status need_vector(const ps_tensor_desc *v, int64_t n, ps_dtype dt, const char *what,
                             ps_error *err)
{
    if (v->rank != 1 || v->shape[0] != n)
        FAIL("shape mismatch: %s must be [%lld]", what, (long long)n);
    if (v->dtype != dt)
        FAIL("%s has dtype %s, the data %s", what, ps_dtype_name(v->dtype), ps_dtype_name(dt));
    return PS_OK;
}

static ps_status window_out(int64_t size, int64_t window, int stride, int pad, int64_t *out,
                            ps_error *err)
{
    if (stride < 1 || pad < 0)
        FAIL("stride must be >= 1 and padding >= 0 (stride %d, padding %d)", stride, pad);
    if (window < 1 || size + 2 * pad < window)
        FAIL("window %lld does not fit an input of %lld with padding %d", (long long)window,
             (long long)size, pad);
    *out = (size + 2 * pad - window) / stride + 1;
    return PS_OK;
}

static ps_status conv_out(const ps_tensor_desc *x, const ps_tensor_desc *w, const ps_op_attrs *a,
                          ps_tensor_desc *y, ps_error *err)
{
    ps_status st;
    if ((st = need_rank(x, 4, 4, "conv2d input (NCHW)", err)) != PS_OK ||
        (st = need_rank(w, 4, 4, "conv2d filter (OCHW)", err)) != PS_OK)
        return st;
    if (x->shape[1] != w->shape[1])
        FAIL("shape mismatch: input has %lld channels, filter expects %lld",
             (long long)x->shape[1], (long long)w->shape[1]);
    *y = *x;
    y->shape[1] = w->shape[0];
    for (int d = 0; d < 2; d++)
        if ((st = window_out(x->shape[2 + d], w->shape[2 + d], a->stride[d], a->pad[d],
                             &y->shape[2 + d], err)) != PS_OK)
            return st;
    return PS_OK;
}

static ps_status pool_out(const ps_tensor_desc *x, const ps_op_attrs *a, ps_tensor_desc *y,
                          ps_error *err)
{
    ps_status st = need_rank(x, 4, 4, "pool input (NCHW)", err);
    if (st != PS_OK)
        return st;
    *y = *x;
    for (int d = 0; d < 2; d++)
        if ((st = window_out(x->shape[2 + d], a->window[d], a->stride[d], a->pad[d],
                             &y->shape[2 + d], err)) != PS_OK)
            return st;
    return PS_OK;
}

static ps_status attr_shape(const ps_op_attrs *a, ps_dtype dt, ps_tensor_desc *out, ps_error *err)
{
    if (a->shape_rank < 0 || a->shape_rank > PS_MAX_RANK)
        FAIL("shape attribute must have 0 to %d dims", PS_MAX_RANK);
    out->dtype = dt;
    out->rank = a->shape_rank;
    for (int i = 0; i < a->shape_rank; i++) {
        if (a->shape[i] <= 0)
            FAIL("shape attribute has a non-positive dimension %lld", (long long)a->shape[i]);
        out->shape[i] = a->shape[i];
    }
    return PS_OK;
}

/* The shape without the dims in `axes`. */
static ps_status reduced(const ps_tensor_desc *x, uint32_t axes, ps_tensor_desc *out,
                         ps_error *err)
{
    if (axes == 0 || (x->rank < 32 && (axes >> x->rank) != 0))
        FAIL("reduction axes 0x%x do not fit rank %d", axes, x->rank);
    out->dtype = x->dtype;
    out->rank = 0;
    for (int i = 0; i < x->rank; i++)
        if (!(axes & (1u << i)))
            out->shape[out->rank++] = x->shape[i];
    return PS_OK;
}

static ps_status moe_slot(const ps_tensor_desc *slot, int64_t g, int64_t s, ps_error *err)
{
    if (slot->dtype != PS_DTYPE_I32 || slot->rank != 3 || slot->shape[0] != g ||
        slot->shape[1] != s)
        FAIL("moe slots must be i32 [%lld, %lld, k]", (long long)g, (long long)s);
    return PS_OK;
}

ps_status ps_op_infer(ps_op_kind kind, const ps_op_attrs *a, const ps_tensor_desc *in, int n_in,
                      ps_tensor_desc *out, int *n_out, ps_error *err)
{
    const ps_op_kind_info *info = ps_op_kind_get(kind);
    ps_status st = PS_OK;
    if (info == NULL)
        FAIL("unknown op kind %d", (int)kind);
    if (n_in < info->min_in || n_in > info->max_in) {
        if (info->min_in == info->max_in)
            FAIL("%s takes %d inputs, got %d", info->name, info->min_in, n_in);
        FAIL("%s takes %d to %d inputs, got %d", info->name, info->min_in, info->max_in, n_in);
    }
    for (int i = 0; i < n_in; i++) {
        if (in[i].rank < 0 || in[i].rank > PS_MAX_RANK)
            FAIL("input %d has an invalid rank %d", i, in[i].rank);
        for (int d = 0; d < in[i].rank; d++)
            if (in[i].shape[d] <= 0)
                FAIL("input %d has a non-positive dimension", i);
    }
    *n_out = info->n_out;
    memset(out, 0, (size_t)info->n_out * sizeof *out);
    const ps_tensor_desc *x = &in[0];
    switch (kind) {
    case PS_OP_MATMUL: {
        ps_einsum e;
        int64_t sizes[26];
        if ((st = ps_einsum_parse(a->einsum, &e, err)) != PS_OK ||
            (st = need_float(&in[0], "matmul operand 0", err)) != PS_OK ||
            (st = need_float(&in[1], "matmul operand 1", err)) != PS_OK ||
            (st = einsum_sizes(a->einsum, &e, in, sizes, err)) != PS_OK)
            return st;
        if (in[0].dtype != in[1].dtype)
            FAIL("matmul operands differ in dtype (%s vs %s)", ps_dtype_name(in[0].dtype),
                 ps_dtype_name(in[1].dtype));
        out[0].dtype = in[0].dtype;
        out[0].rank = e.rank[2];
        for (int i = 0; i < e.rank[2]; i++)
            out[0].shape[i] = sizes[e.labels[2][i] - 'a'];
        return PS_OK;
    }
    case PS_OP_BIAS_ADD:
        if ((st = need_float(x, "bias_add input", err)) != PS_OK ||
            (st = need_rank(x, 1, PS_MAX_RANK, "bias_add input", err)) != PS_OK ||
            (st = need_vector(&in[1], x->shape[x->rank - 1], x->dtype, "bias", err)) != PS_OK)
            return st;
        out[0] = *x;
        return PS_OK;
    case PS_OP_ADD:
        if ((st = need_float(x, "add input", err)) != PS_OK ||
            (st = need_same(&in[0], &in[1], "input 0", "input 1", err)) != PS_OK)
            return st;
        out[0] = *x;
        return PS_OK;
    case PS_OP_RELU:
    case PS_OP_GELU:
        if ((st = need_float(x, info->name, err)) != PS_OK)
            return st;
        out[0] = *x;
        return PS_OK;
    case PS_OP_LAYERNORM:
        if ((st = need_float(x, "layernorm input", err)) != PS_OK ||
            (st = need_rank(x, 1, PS_MAX_RANK, "layernorm input", err)) != PS_OK ||
            (st = need_vector(&in[1], x->shape[x->rank - 1], x->dtype, "gamma", err)) != PS_OK ||
            (st = need_vector(&in[2], x->shape[x->rank - 1], x->dtype, "beta", err)) != PS_OK)
            return st;
        if (!(a->eps > 0))
            FAIL("eps must be positive");
        out[0] = *x;
        return PS_OK;
    case PS_OP_SOFTMAX:
        if ((st = need_float(x, "softmax input", err)) != PS_OK ||
            (st = need_rank(x, a->causal ? 2 : 1, PS_MAX_RANK, "softmax input", err)) != PS_OK)
            return st;
        if (a->causal && x->shape[x->rank - 1] != x->shape[x->rank - 2])
            FAIL("causal softmax needs square [q, k] last dims, got [%lld, %lld]",
                 (long long)x->shape[x->rank - 2], (long long)x->shape[x->rank - 1]);
        if (!(a->scale > 0))
            FAIL("scale must be positive");
        out[0] = *x;
        return PS_OK;
    case PS_OP_EMBEDDING:
        if ((st = need_float(&in[0], "embedding table", err)) != PS_OK ||
            (st = need_rank(&in[0], 2, 2, "embedding table", err)) != PS_OK ||
            (st = need_rank(&in[1], 1, PS_MAX_RANK - 1, "embedding ids", err)) != PS_OK)
            return st;
        if (in[1].dtype != PS_DTYPE_I32)
            FAIL("embedding ids must be i32");
        out[0] = in[1];
        out[0].dtype = in[0].dtype;
        out[0].shape[out[0].rank++] = in[0].shape[1];
        return PS_OK;
    case PS_OP_CONV2D:
        if ((st = need_float(x, "conv2d input", err)) != PS_OK)
            return st;
        if (in[0].dtype != in[1].dtype)
            FAIL("conv2d input and filter differ in dtype");
        return conv_out(&in[0], &in[1], a, &out[0], err);
    case PS_OP_BATCHNORM:
        if ((st = need_float(x, "batchnorm input", err)) != PS_OK ||
            (st = need_rank(x, 2, PS_MAX_RANK, "batchnorm input", err)) != PS_OK ||
            (st = need_vector(&in[1], x->shape[1], x->dtype, "gamma", err)) != PS_OK ||
            (st = need_vector(&in[2], x->shape[1], x->dtype, "beta", err)) != PS_OK)
            return st;
        if (!(a->eps > 0))
            FAIL("eps must be positive");
        out[0] = *x;
        return PS_OK;
    case PS_OP_POOL:
        if ((st = need_float(x, "pool input", err)) != PS_OK)
            return st;
        if (a->pool != PS_POOL_MAX && a->pool != PS_POOL_AVG)
            FAIL("pool kind must be max or avg");
        return pool_out(x, a, &out[0], err);
    case PS_OP_RESHAPE: {
        if ((st = attr_shape(a, x->dtype, &out[0], err)) != PS_OK)
            return st;
        if (ps_tensor_desc_numel(&out[0]) != ps_tensor_desc_numel(x)) {
            char s1[200], s2[200];
            FAIL("shape mismatch: reshape of %s to %s changes the element count",
                 shape_str(x, s1, sizeof s1), shape_str(&out[0], s2, sizeof s2));
        }
        return PS_OK;
    }
    case PS_OP_TRANSPOSE: {
        bool seen[PS_MAX_RANK] = {false};
        out[0] = *x;
        for (int i = 0; i < x->rank; i++) {
            int p = a->perm[i];
            if (p < 0 || p >= x->rank || seen[p])
                FAIL("perm is not a permutation of 0..%d", x->rank - 1);
            seen[p] = true;
            out[0].shape[i] = x->shape[p];
        }
        return PS_OK;
    }
    case PS_OP_REDUCE:
        if ((st = need_float(x, "reduce input", err)) != PS_OK)
            return st;
        return reduced(x, a->axes, &out[0], err);
    case PS_OP_BROADCAST: {
        ps_tensor_desc full, back;
        if ((st = need_float(x, "broadcast input", err)) != PS_OK ||
            (st = attr_shape(a, x->dtype, &full, err)) != PS_OK ||
            (st = reduced(&full, a->axes, &back, err)) != PS_OK)
            return st;
        if (!ps_tensor_desc_equal(&back, x))
            FAIL("shape mismatch: broadcast input must be the shape attribute without axes");
        out[0] = full;
        return PS_OK;
    }
    case PS_OP_MSE_LOSS:
    case PS_OP_MSE_LOSS_GRAD:
        if ((st = need_float(x, "prediction", err)) != PS_OK ||
            (st = need_same(&in[0], &in[1], "prediction", "target", err)) != PS_OK)
            return st;
        if (kind == PS_OP_MSE_LOSS_GRAD && !ps_loss_scale_valid(a->scale))
            FAIL("the loss scale must be in [2^-24, 2^40], is %g", a->scale);
        out[0] = *x;
        if (kind == PS_OP_MSE_LOSS)
            out[0].rank = 0;
        return PS_OK;
    case PS_OP_SOFTMAX_XENT:
    case PS_OP_SOFTMAX_XENT_GRAD: {
        if ((st = need_float(x, "logits", err)) != PS_OK ||
            (st = need_rank(x, 1, PS_MAX_RANK, "logits", err)) != PS_OK)
            return st;
        ps_tensor_desc want = *x;
        want.rank--;
        want.dtype = PS_DTYPE_I32;
        if (!ps_tensor_desc_equal(&want, &in[1]))
            FAIL("shape mismatch: labels must be i32 with the logits' shape minus the last dim");
        if (kind == PS_OP_SOFTMAX_XENT_GRAD && !ps_loss_scale_valid(a->scale))
            FAIL("the loss scale must be in [2^-24, 2^40], is %g", a->scale);
        out[0] = *x;
        if (kind == PS_OP_SOFTMAX_XENT)
            out[0].rank = 0;
        return PS_OK;
    }
    case PS_OP_MOE_GATE:
    case PS_OP_MOE_GATE_GRAD:
        if ((st = need_float(x, "gate logits", err)) != PS_OK ||
            (st = need_rank(x, 3, 3, "gate logits [g, s, e]", err)) != PS_OK)
            return st;
        if (a->top_k < 1 || a->top_k > x->shape[2])
            FAIL("top_k %d must be between 1 and the number of experts %lld", a->top_k,
                 (long long)x->shape[2]);
        if (kind == PS_OP_MOE_GATE_GRAD) {
            ps_tensor_desc w = in[2];
            if ((st = moe_slot(&in[1], x->shape[0], x->shape[1], err)) != PS_OK)
                return st;
            if (w.rank != 3 || w.dtype != x->dtype || w.shape[0] != x->shape[0] ||
                w.shape[1] != x->shape[1] || w.shape[2] != in[1].shape[2] ||
                w.shape[2] != a->top_k)
                FAIL("shape mismatch: gate weight gradient must be [g, s, top_k]");
            out[0] = *x;
            return PS_OK;
        }
        if (x->shape[2] != a->experts)
            FAIL("gate logits have %lld experts, the op says %lld", (long long)x->shape[2],
                 (long long)a->experts);
        if (a->capacity < 1)
            FAIL("capacity must be >= 1");
        out[0] = *x;
        out[0].dtype = PS_DTYPE_I32;
        out[0].shape[2] = a->top_k;
        out[1] = *x;
        out[1].shape[2] = a->top_k;
        return PS_OK;
    case PS_OP_MOE_DISPATCH:
        if ((st = need_float(x, "dispatch input", err)) != PS_OK ||
            (st = need_rank(x, 3, 3, "dispatch input [g, s, m]", err)) != PS_OK ||
            (st = moe_slot(&in[1], x->shape[0], x->shape[1], err)) != PS_OK)
            return st;
        if (a->experts < 1 || a->capacity < 1)
            FAIL("experts and capacity must be >= 1");
        out[0].dtype = x->dtype;
        out[0].rank = 4;
        out[0].shape[0] = a->experts;
        out[0].shape[1] = x->shape[0];
        out[0].shape[2] = a->capacity;
        out[0].shape[3] = x->shape[2];
        return PS_OK;
    case PS_OP_MOE_COMBINE:
    case PS_OP_MOE_DISPATCH_GRAD: {
        const ps_tensor_desc *y = &in[0];
        if ((st = need_float(y, "expert output", err)) != PS_OK ||
            (st = need_rank(y, 4, 4, "expert output [e, g, c, m]", err)) != PS_OK ||
            (st = need_rank(&in[1], 3, 3, "moe slots", err)) != PS_OK ||
            (st = moe_slot(&in[1], y->shape[1], in[1].shape[1], err)) != PS_OK)
            return st;
        if (kind == PS_OP_MOE_COMBINE &&
            (in[2].rank != 3 || !ps_tensor_desc_equal(&(ps_tensor_desc){y->dtype, 3,
                                                                        {in[1].shape[0],
                                                                         in[1].shape[1],
                                                                         in[1].shape[2]}},
                                                      &in[2])))
            FAIL("shape mismatch: combine weights must be [g, s, k] like the slots");
        out[0].dtype = y->dtype;
        out[0].rank = 3;
        out[0].shape[0] = y->shape[1];
        out[0].shape[1] = in[1].shape[1];
        out[0].shape[2] = y->shape[3];
        return PS_OK;
    }
    case PS_OP_MOE_COMBINE_GRAD: {
        const ps_tensor_desc *y = &in[1];
        ps_tensor_desc z;
        int n;
        if ((st = ps_op_infer(PS_OP_MOE_COMBINE, a, &in[1], 3, &z, &n, err)) != PS_OK ||
            (st = need_same(&in[0], &z, "output gradient", "combine output", err)) != PS_OK)
            return st;
        out[0] = *y;
        out[1] = in[3];
        return PS_OK;
    }
    case PS_OP_RELU_GRAD:
    case PS_OP_GELU_GRAD:
    case PS_OP_SOFTMAX_GRAD:
        if ((st = need_float(x, info->name, err)) != PS_OK ||
            (st = need_same(&in[0], &in[1], "input 0", "output gradient", err)) != PS_OK)
            return st;
        out[0] = *x;
        return PS_OK;
    case PS_OP_LAYERNORM_GRAD:
    case PS_OP_BATCHNORM_GRAD: {
        ps_tensor_desc y;
        int n;
        ps_tensor_desc fwd_in[3] = {in[0], in[1], in[1]};
        if ((st = ps_op_infer(kind == PS_OP_LAYERNORM_GRAD ? PS_OP_LAYERNORM : PS_OP_BATCHNORM,
                              a, fwd_in, 3, &y, &n, err)) != PS_OK ||
            (st = need_same(&in[2], &y, "output gradient", "output", err)) != PS_OK)
            return st;
        out[0] = in[0];
        out[1] = in[1];
        out[2] = in[1];
        return PS_OK;
    }
    case PS_OP_EMBEDDING_GRAD: {
        ps_tensor_desc table, y;
        int n;
        if ((st = attr_shape(a, in[1].dtype, &table, err)) != PS_OK ||
            (st = ps_op_infer(PS_OP_EMBEDDING, a, (ps_tensor_desc[]){table, in[0]}, 2, &y, &n,
                              err)) != PS_OK ||
            (st = need_same(&in[1], &y, "output gradient", "embedding output", err)) != PS_OK)
            return st;
        out[0] = table;
        return PS_OK;
    }
    case PS_OP_CONV2D_GRAD_INPUT:
    case PS_OP_CONV2D_GRAD_FILTER: {
        bool for_input = kind == PS_OP_CONV2D_GRAD_INPUT;
        const ps_tensor_desc *dy = for_input ? &in[0] : &in[1];
        ps_tensor_desc other, y;
        if ((st = attr_shape(a, dy->dtype, &other, err)) != PS_OK ||
            (st = conv_out(for_input ? &other : &in[0], for_input ? &in[1] : &other, a, &y,
                           err)) != PS_OK ||
            (st = need_same(dy, &y, "output gradient", "conv2d output", err)) != PS_OK)
            return st;
        out[0] = other;
        return PS_OK;
    }
    case PS_OP_POOL_GRAD: {
        ps_tensor_desc y;
        if ((st = pool_out(x, a, &y, err)) != PS_OK ||
            (st = need_same(&in[1], &y, "pool output", "its shape from the input", err)) !=
                PS_OK ||
            (st = need_same(&in[2], &y, "output gradient", "pool output", err)) != PS_OK)
            return st;
        out[0] = *x;
        return PS_OK;
    }
    case PS_OP_ADAM:
        if ((st = need_float(x, "adam parameter", err)) != PS_OK ||
            (st = need_same(&in[0], &in[1], "parameter", "gradient", err)) != PS_OK)
            return st;
        for (int i = 2; i < n_in; i++) {
            if (!is_float(&in[i]) || in[i].dtype != in[2].dtype)
                FAIL("adam state %d must be a float tensor of the first state's dtype", i);
            ps_tensor_desc shape_only = *x;
            shape_only.dtype = in[i].dtype;
            if ((st = need_same(&in[i], &shape_only, "optimizer state", "parameter", err)) !=
                PS_OK)
                return st;
        }
        if (!(a->lr > 0) || !(a->beta1 >= 0 && a->beta1 < 1) || !(a->beta2 >= 0 && a->beta2 < 1) ||
            !(a->adam_eps > 0) || !(a->weight_decay >= 0))
            FAIL("adam hyper-parameters out of range");
        if (!ps_loss_scale_valid(a->scale))
            FAIL("the loss scale must be in [2^-24, 2^40], is %g", a->scale);
        return PS_OK;
    case PS_OP_KIND_COUNT:
        break;
    }
    FAIL("unknown op kind %d", (int)kind);
}

/* ---- cost ------------------------------------------------------------------ */

/* Nominal FLOPs per element for the non-GEMM ops (documented in
 * docs/graph-format.md); they matter little next to the GEMMs but keep the
 * roofline honest about elementwise-heavy layers. */
ps_op_cost ps_op_cost_of(ps_op_kind kind, const ps_op_attrs *a, const ps_tensor_desc *in,
                         int n_in, const ps_tensor_desc *out, int n_out)
{
    ps_op_cost c = {0, 0, 0};
    for (int i = 0; i < n_in; i++)
        c.bytes_read += desc_bytes(&in[i]);
    for (int i = 0; i < n_out; i++)
        c.bytes_written += desc_bytes(&out[i]);
    double n_x = n_in > 0 ? (double)ps_tensor_desc_numel(&in[0]) : 0;
    double n_y = n_out > 0 ? (double)ps_tensor_desc_numel(&out[0]) : 0;
    switch (kind) {
    case PS_OP_MATMUL: {
        ps_einsum e;
        int64_t sizes[26];
        if (ps_einsum_parse(a->einsum, &e, NULL) != PS_OK ||
            einsum_sizes(a->einsum, &e, in, sizes, NULL) != PS_OK)
            break;
        double prod = 2.0;
        for (int l = 0; l < 26; l++)
            if (sizes[l] > 0)
                prod *= (double)sizes[l];
        c.flops = prod;
        break;
    }
    case PS_OP_BIAS_ADD:
    case PS_OP_ADD:
    case PS_OP_RELU:
    case PS_OP_RELU_GRAD: c.flops = n_y; break;
    case PS_OP_GELU: c.flops = 8 * n_y; break;
    case PS_OP_GELU_GRAD: c.flops = 12 * n_y; break;
    case PS_OP_LAYERNORM:
    case PS_OP_BATCHNORM: c.flops = 8 * n_y; break;
    case PS_OP_LAYERNORM_GRAD:
    case PS_OP_BATCHNORM_GRAD: c.flops = 14 * n_x; break;
    case PS_OP_SOFTMAX: c.flops = 5 * n_y; break;
    case PS_OP_SOFTMAX_GRAD: c.flops = 4 * n_y; break;
    case PS_OP_EMBEDDING: c.flops = 0; break;
    case PS_OP_EMBEDDING_GRAD: c.flops = (double)ps_tensor_desc_numel(&in[1]); break;
    case PS_OP_CONV2D: {
        /* 2 * N * O * H' * W' * C * kh * kw */
        const ps_tensor_desc *w = &in[1];
        c.flops = 2.0 * n_y * (double)(w->shape[1] * w->shape[2] * w->shape[3]);
        break;
    }
    case PS_OP_CONV2D_GRAD_INPUT: {
        const ps_tensor_desc *dy = &in[0], *w = &in[1];
        c.flops = 2.0 * (double)ps_tensor_desc_numel(dy) * (double)(w->shape[1] * w->shape[2] *
                                                                      w->shape[3]);
        break;
    }
    case PS_OP_CONV2D_GRAD_FILTER: {
        const ps_tensor_desc *dy = &in[1];
        c.flops = 2.0 * (double)ps_tensor_desc_numel(dy) *
                  (double)(out[0].shape[1] * out[0].shape[2] * out[0].shape[3]);
        break;
    }
    case PS_OP_POOL: c.flops = n_y * a->window[0] * a->window[1]; break;
    case PS_OP_POOL_GRAD:
        c.flops = (double)ps_tensor_desc_numel(&in[1]) * a->window[0] * a->window[1];
        break;
    case PS_OP_RESHAPE:
        /* a view: no data moves */
        c.bytes_read = c.bytes_written = 0;
        break;
    case PS_OP_TRANSPOSE: c.flops = 0; break;
    case PS_OP_REDUCE: c.flops = n_x; break;
    case PS_OP_BROADCAST: c.flops = n_y; break;
    case PS_OP_MSE_LOSS: c.flops = 3 * n_x; break;
    case PS_OP_MSE_LOSS_GRAD: c.flops = 2 * n_x; break;
    case PS_OP_SOFTMAX_XENT: c.flops = 5 * n_x; break;
    case PS_OP_SOFTMAX_XENT_GRAD: c.flops = 4 * n_x; break;
    case PS_OP_MOE_GATE: c.flops = (5.0 + 2.0 * a->top_k) * n_x; break;
    case PS_OP_MOE_GATE_GRAD: c.flops = 6 * n_x; break;
    case PS_OP_MOE_DISPATCH:
    case PS_OP_MOE_DISPATCH_GRAD: c.flops = 0; break;
    case PS_OP_MOE_COMBINE:
    case PS_OP_MOE_COMBINE_GRAD: {
        /* each token sums k weighted expert rows of m */
        const ps_tensor_desc *slot = kind == PS_OP_MOE_COMBINE ? &in[1] : &in[2];
        const ps_tensor_desc *y = kind == PS_OP_MOE_COMBINE ? &in[0] : &in[1];
        c.flops = 2.0 * (double)ps_tensor_desc_numel(slot) * (double)y->shape[3];
        break;
    }
    case PS_OP_ADAM:
        /* m, v, bias corrections, sqrt, divide, update: ~12 per element */
        c.flops = 12 * n_x;
        c.bytes_written = 0;
        for (int i = 0; i < n_in; i++)
            if (i != 1)
                c.bytes_written += desc_bytes(&in[i]);
        break;
    case PS_OP_KIND_COUNT: break;
    }
    return c;
}
