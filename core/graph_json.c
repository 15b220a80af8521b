/* Forward graph files: loading with positioned diagnostics, and saving. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/graph.h"
#include "core/json.h"

#define GRAPH_FORMAT "pipeshard-graph"
#define GRAPH_VERSION 1

static const char *const reduce_names[] = {"sum", "mean"};
static const char *const pool_names[] = {"max", "avg"};

/* ---- loading ----------------------------------------------------------------- */

/* What the file says about one tensor, before the graph is built. */
typedef struct file_tensor {
    const char *name;
    ps_tensor_kind kind;
    ps_tensor_desc desc;
    int layer;    /* -1 when not given */
    int producer; /* index into the file's ops, -1 if none */
    int graph_id; /* id in the built graph, -1 until added */
} file_tensor;

typedef struct file_op {
    ps_op_def def;
    int n_out;
    int out[PS_MAX_OP_IO]; /* file tensor indices */
    int in_file[PS_MAX_OP_IO];
} file_op;

static ps_status read_dims(const ps_jv *arr, int64_t *dims, int *n, int max, int64_t lo,
                           ps_error *err)
{
    size_t count;
    ps_status st = ps_jv_array(arr, &count, err);
    if (st != PS_OK)
        return st;
    if (count > (size_t)max)
        return ps_jv_fail(arr, err, PS_ERR_INVALID, "%zu entries; at most %d are allowed", count,
                          max);
    for (size_t i = 0; i < count; i++) {
        ps_jv e = ps_jv_element(arr, i);
        if ((st = ps_jv_int(&e, INT64_MIN, INT64_MAX, &dims[i], err)) != PS_OK)
            return st;
        if (dims[i] < lo)
            return ps_jv_fail(&e, err, PS_ERR_INVALID, "%s, found %lld",
                              lo == 1 ? "dimensions must be positive" : "must not be negative",
                              (long long)dims[i]);
        if (dims[i] > INT64_MAX / 2)
            return ps_jv_fail(&e, err, PS_ERR_INVALID, "%lld is too large", (long long)dims[i]);
    }
    *n = (int)count;
    return PS_OK;
}

static ps_status read_pair(const ps_jv *op, const char *key, int *pair, int lo, ps_error *err)
{
    if (!ps_jv_has(op, key))
        return PS_OK;
    ps_jv v;
    int64_t dims[2];
    int n;
    ps_status st = ps_jv_member(op, key, &v, err);
    if (st == PS_OK)
        st = read_dims(&v, dims, &n, 2, lo, err);
    if (st != PS_OK)
        return st;
    if (n != 2)
        return ps_jv_fail(&v, err, PS_ERR_INVALID, "expected two numbers [h, w]");
    if (dims[0] > 1 << 20 || dims[1] > 1 << 20)
        return ps_jv_fail(&v, err, PS_ERR_INVALID, "value too large");
    pair[0] = (int)dims[0];
    pair[1] = (int)dims[1];
    return PS_OK;
}

static ps_status read_attrs(const ps_jv *op, ps_op_kind kind, ps_op_attrs *a, ps_error *err)
{
    unsigned want = ps_op_kind_get(kind)->attrs;
    ps_status st = PS_OK;
    const char *s;
    int64_t i64;
    ps_jv v;
    *a = ps_op_attrs_default(kind);
    if (want & PS_ATTR_EINSUM) {
        PS_TRY(ps_jv_member(op, "einsum", &v, err));
        PS_TRY(ps_jv_string(&v, &s, err));
        if (strlen(s) >= sizeof a->einsum) {
            st = ps_jv_fail(&v, err, PS_ERR_INVALID, "einsum spec too long");
            goto out;
        }
        strcpy(a->einsum, s);
        ps_einsum e;
        ps_error inner = {0};
        if (ps_einsum_parse(s, &e, &inner) != PS_OK) {
            st = ps_jv_fail(&v, err, PS_ERR_INVALID, "%s", inner.msg);
            goto out;
        }
    }
    if (want & PS_ATTR_EPS)
        PS_TRY(ps_jv_opt_double(op, "eps", a->eps, 1e-30, 1.0, &a->eps, err));
    if (want & PS_ATTR_SCALE)
        PS_TRY(ps_jv_opt_double(op, "scale", a->scale, 1e-30, 1e30, &a->scale, err));
    if (want & PS_ATTR_CAUSAL)
        PS_TRY(ps_jv_opt_bool(op, "causal", false, &a->causal, err));
    if ((want & PS_ATTR_PERM) && ps_jv_has(op, "perm")) {
        int64_t dims[PS_MAX_RANK];
        int n;
        PS_TRY(ps_jv_member(op, "perm", &v, err));
        PS_TRY(read_dims(&v, dims, &n, PS_MAX_RANK, 0, err));
        for (int i = 0; i < n; i++)
            a->perm[i] = dims[i] < PS_MAX_RANK ? (int)dims[i] : -1;
    }
    if ((want & PS_ATTR_AXES)) {
        int64_t dims[PS_MAX_RANK];
        int n;
        PS_TRY(ps_jv_member(op, "axes", &v, err));
        PS_TRY(read_dims(&v, dims, &n, PS_MAX_RANK, 0, err));
        for (int i = 0; i < n; i++) {
            ps_jv e = ps_jv_element(&v, (size_t)i);
            if (dims[i] >= PS_MAX_RANK) {
                st = ps_jv_fail(&e, err, PS_ERR_INVALID, "axis %lld out of range",
                                (long long)dims[i]);
                goto out;
            }
            if (a->axes & (1u << dims[i])) {
                st = ps_jv_fail(&e, err, PS_ERR_INVALID, "axis %lld listed twice",
                                (long long)dims[i]);
                goto out;
            }
            a->axes |= 1u << dims[i];
        }
    }
    if ((want & PS_ATTR_REDUCE) && ps_jv_has(op, "reduce")) {
        int k;
        PS_TRY(ps_jv_member(op, "reduce", &v, err));
        PS_TRY(ps_jv_enum(&v, reduce_names, 2, &k, err));
        a->reduce = (ps_reduce_kind)k;
    }
    if (want & PS_ATTR_POOL) {
        int k;
        PS_TRY(ps_jv_member(op, "pool", &v, err));
        PS_TRY(ps_jv_enum(&v, pool_names, 2, &k, err));
        a->pool = (ps_pool_kind)k;
    }
    if (want & PS_ATTR_WINDOW)
        PS_TRY(read_pair(op, "window", a->window, 1, err));
    if (want & PS_ATTR_STRIDE)
        PS_TRY(read_pair(op, "stride", a->stride, 1, err));
    if (want & PS_ATTR_PAD)
        PS_TRY(read_pair(op, "pad", a->pad, 0, err));
    if (want & PS_ATTR_TOP_K) {
        PS_TRY(ps_jv_opt_int(op, "top_k", a->top_k, 1, 64, &i64, err));
        a->top_k = (int)i64;
    }
    if (want & PS_ATTR_EXPERTS) {
        PS_TRY(ps_jv_member(op, "experts", &v, err));
        PS_TRY(ps_jv_int(&v, 1, 1 << 20, &a->experts, err));
    }
    if (want & PS_ATTR_CAPACITY) {
        PS_TRY(ps_jv_member(op, "capacity", &v, err));
        PS_TRY(ps_jv_int(&v, 1, INT64_MAX / 2, &a->capacity, err));
    }
    if (want & PS_ATTR_SHAPE) {
        PS_TRY(ps_jv_member(op, "shape", &v, err));
        PS_TRY(read_dims(&v, a->shape, &a->shape_rank, PS_MAX_RANK, 1, err));
    }
out:
    return st;
}

/* A reference to a tensor: its name, or its index in the file's list.
 * by_name maps names to indices (a jansson object used as a hash table). */
static ps_status resolve_ref(const ps_jv *ref, const json_t *by_name, int n_ts, int *out,
                             ps_error *err)
{
    if (json_is_integer(ref->v)) {
        json_int_t id = json_integer_value(ref->v);
        if (id < 0 || id >= n_ts)
            return ps_jv_fail(ref, err, PS_ERR_INVALID,
                              "dangling tensor id %lld (the file has tensors 0 to %d)",
                              (long long)id, n_ts - 1);
        *out = (int)id;
        return PS_OK;
    }
    if (!json_is_string(ref->v))
        return ps_jv_fail(ref, err, PS_ERR_INVALID,
                          "expected a tensor name or id (string or integer)");
    const char *name = json_string_value(ref->v);
    json_t *idx = json_object_get(by_name, name);
    if (idx == NULL)
        return ps_jv_fail(ref, err, PS_ERR_INVALID, "unknown tensor \"%s\"", name);
    *out = (int)json_integer_value(idx);
    return PS_OK;
}

static ps_status read_tensor(const ps_jv *tv, file_tensor *t, ps_error *err)
{
    static const char *const keys[] = {"name", "kind", "dtype", "shape", "layer", NULL};
    static const char *const file_kinds[] = {"input", "param", "activation"};
    ps_status st = PS_OK;
    ps_jv v;
    int k;
    int64_t layer;
    PS_TRY(ps_jv_check_keys(tv, keys, err));
    PS_TRY(ps_jv_member(tv, "name", &v, err));
    PS_TRY(ps_jv_string(&v, &t->name, err));
    if (t->name[0] == '\0' || strlen(t->name) > 200) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "a tensor name must have 1 to 200 characters");
        goto out;
    }
    PS_TRY(ps_jv_member(tv, "kind", &v, err));
    if (json_is_string(v.v) && (strcmp(json_string_value(v.v), "gradient") == 0 ||
                                strcmp(json_string_value(v.v), "opt_state") == 0)) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID,
                        "graph files hold the forward pass only; gradients and optimizer state "
                        "are derived");
        goto out;
    }
    PS_TRY(ps_jv_enum(&v, file_kinds, 3, &k, err));
    t->kind = (ps_tensor_kind)k;
    PS_TRY(ps_jv_member(tv, "dtype", &v, err));
    PS_TRY(ps_jv_enum(&v, ps_dtype_names, PS_DTYPE_COUNT, &k, err));
    t->desc.dtype = (ps_dtype)k;
    PS_TRY(ps_jv_member(tv, "shape", &v, err));
    PS_TRY(read_dims(&v, t->desc.shape, &t->desc.rank, PS_MAX_RANK, 1, err));
    PS_TRY(ps_jv_opt_int(tv, "layer", -1, 0, 1 << 20, &layer, err));
    t->layer = (int)layer;
    if (t->kind != PS_TENSOR_ACTIVATION && t->layer < 0)
        t->layer = 0;
    t->producer = -1;
    t->graph_id = -1;
out:
    return st;
}

static ps_status read_op(const ps_jv *ov, int index, file_tensor *ts, int n_ts,
                         const json_t *by_name, file_op *op, ps_error *err)
{
    static const char *const common[] = {"name", "op", "layer", "in", "out"};
    static const char *const attr_keys[] = {
        "einsum", "eps", "scale", "causal", "perm", "axes", "reduce", "pool",
        "window", "stride", "pad", "top_k", "experts", "capacity", "shape", NULL};
    static const unsigned attr_bits[] = {
        PS_ATTR_EINSUM, PS_ATTR_EPS,    PS_ATTR_SCALE,  PS_ATTR_CAUSAL,   PS_ATTR_PERM,
        PS_ATTR_AXES,   PS_ATTR_REDUCE, PS_ATTR_POOL,   PS_ATTR_WINDOW,   PS_ATTR_STRIDE,
        PS_ATTR_PAD,    PS_ATTR_TOP_K,  PS_ATTR_EXPERTS, PS_ATTR_CAPACITY, PS_ATTR_SHAPE};
    ps_status st = PS_OK;
    ps_jv v;
    const char *s;
    int64_t layer;
    size_t n;
    PS_TRY(ps_jv_object(ov, err));
    PS_TRY(ps_jv_member(ov, "op", &v, err));
    PS_TRY(ps_jv_string(&v, &s, err));
    ps_op_kind kind;
    if (ps_op_kind_parse(s, &kind) != 0 || !ps_op_kind_get(kind)->forward) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "unknown op \"%s\"%s", s,
                        ps_op_kind_parse(s, &kind) == 0
                            ? " in a forward graph (backward and update ops are derived)"
                            : "");
        goto out;
    }
    /* allowed keys: the common ones plus the attributes of this kind */
    const char *allowed[24];
    int na = 0;
    for (size_t i = 0; i < sizeof common / sizeof *common; i++)
        allowed[na++] = common[i];
    for (int i = 0; attr_keys[i] != NULL; i++)
        if (ps_op_kind_get(kind)->attrs & attr_bits[i])
            allowed[na++] = attr_keys[i];
    allowed[na] = NULL;
    PS_TRY(ps_jv_check_keys(ov, allowed, err));
    memset(op, 0, sizeof *op);
    op->def.kind = kind;
    op->def.forward_op = -1;
    op->def.pass = PS_PASS_FORWARD;
    PS_TRY(ps_jv_member(ov, "name", &v, err));
    PS_TRY(ps_jv_string(&v, &op->def.name, err));
    PS_TRY(ps_jv_opt_int(ov, "layer", 0, 0, 1 << 20, &layer, err));
    op->def.layer = (int)layer;
    PS_TRY(read_attrs(ov, kind, &op->def.attrs, err));
    const ps_op_kind_info *info = ps_op_kind_get(kind);
    PS_TRY(ps_jv_member(ov, "in", &v, err));
    PS_TRY(ps_jv_array(&v, &n, err));
    if ((int)n < info->min_in || (int)n > info->max_in) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "%s takes %d input(s), the op lists %zu",
                        info->name, info->min_in, n);
        goto out;
    }
    op->def.n_in = (int)n;
    for (size_t i = 0; i < n; i++) {
        ps_jv e = ps_jv_element(&v, i);
        PS_TRY(resolve_ref(&e, by_name, n_ts, &op->in_file[i], err));
    }
    if (kind == PS_OP_TRANSPOSE) {
        size_t n_perm;
        PS_TRY(ps_jv_member(ov, "perm", &v, err));
        PS_TRY(ps_jv_array(&v, &n_perm, err));
        if ((int)n_perm != ts[op->in_file[0]].desc.rank) {
            st = ps_jv_fail(&v, err, PS_ERR_INVALID, "perm has %zu entries, the input rank is %d",
                            n_perm, ts[op->in_file[0]].desc.rank);
            goto out;
        }
    }
    PS_TRY(ps_jv_member(ov, "out", &v, err));
    PS_TRY(ps_jv_array(&v, &n, err));
    if ((int)n != info->n_out) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "%s has %d output(s), the op lists %zu",
                        info->name, info->n_out, n);
        goto out;
    }
    op->n_out = (int)n;
    for (size_t i = 0; i < n; i++) {
        ps_jv e = ps_jv_element(&v, i);
        int t;
        PS_TRY(resolve_ref(&e, by_name, n_ts, &t, err));
        if (ts[t].kind != PS_TENSOR_ACTIVATION) {
            st = ps_jv_fail(&e, err, PS_ERR_INVALID,
                            "tensor \"%s\" is a %s; only activations are produced by ops",
                            ts[t].name, ps_tensor_kind_names[ts[t].kind]);
            goto out;
        }
        if (ts[t].producer >= 0) {
            st = ps_jv_fail(&e, err, PS_ERR_INVALID, "tensor \"%s\" is produced twice",
                            ts[t].name);
            goto out;
        }
        ts[t].producer = index;
        op->out[i] = t;
    }
out:
    return st;
}

/* Orders ops so that producers come first (Kahn's algorithm over consumer
 * lists, linear in the number of edges); a cycle is reported at one op on it. */
static ps_status topo_order(const ps_jv *ops_v, const file_op *ops, int n_ops,
                            const file_tensor *ts, int *order, ps_error *err)
{
    ps_status st = PS_OK;
    int *pending = calloc((size_t)n_ops + 1, sizeof *pending);
    int *first = calloc((size_t)n_ops + 2, sizeof *first); /* CSR offsets per producer */
    int *edges = malloc(((size_t)n_ops * PS_MAX_OP_IO + 1) * sizeof *edges);
    PS_TRY_ALLOC(pending, err);
    PS_TRY_ALLOC(first, err);
    PS_TRY_ALLOC(edges, err);
    for (int j = 0; j < n_ops; j++)
        for (int k = 0; k < ops[j].def.n_in; k++) {
            int p = ts[ops[j].in_file[k]].producer;
            if (p >= 0) {
                first[p + 1]++;
                pending[j]++;
            }
        }
    for (int i = 0; i < n_ops; i++)
        first[i + 1] += first[i];
    int *fill = order; /* borrow `order` as fill cursors, then reset it below */
    for (int i = 0; i < n_ops; i++)
        fill[i] = first[i];
    for (int j = 0; j < n_ops; j++)
        for (int k = 0; k < ops[j].def.n_in; k++) {
            int p = ts[ops[j].in_file[k]].producer;
            if (p >= 0)
                edges[fill[p]++] = j;
        }
    /* A file already in topological order keeps its order (so that saving a
     * loaded graph reproduces the file); otherwise Kahn's order. */
    bool ordered = true;
    for (int j = 0; j < n_ops && ordered; j++)
        for (int k = 0; k < ops[j].def.n_in; k++)
            if (ts[ops[j].in_file[k]].producer >= j)
                ordered = false;
    if (ordered) {
        for (int i = 0; i < n_ops; i++)
            order[i] = i;
        goto out;
    }
    int head = 0, tail = 0;
    for (int i = 0; i < n_ops; i++)
        if (pending[i] == 0)
            order[tail++] = i;
    while (head < tail) {
        int i = order[head++];
        for (int e = first[i]; e < first[i + 1]; e++)
            if (--pending[edges[e]] == 0)
                order[tail++] = edges[e];
    }
    if (tail < n_ops) {
        for (int i = 0; i < n_ops; i++) {
            if (pending[i] > 0) {
                ps_jv at = ps_jv_element(ops_v, (size_t)i);
                st = ps_jv_fail(&at, err, PS_ERR_INVALID,
                                "cycle: op \"%s\" depends (directly or not) on its own output",
                                ops[i].def.name);
                break;
            }
        }
    }
out:
    free(pending);
    free(first);
    free(edges);
    return st;
}

ps_status ps_graph_from_json(const ps_jv *root, ps_graph **out, ps_error *err)
{
    static const char *const keys[] = {"format", "version", "name", "boundaries", "loss",
                                       "tensors", "ops", "comment", NULL};
    ps_status st = PS_OK;
    ps_graph *g = NULL;
    file_tensor *ts = NULL;
    file_op *ops = NULL;
    int *order = NULL;
    json_t *by_name = NULL, *op_names = NULL;
    ps_jv v, tensors_v, ops_v;
    const char *s;
    int64_t version;
    size_t n_ts = 0, n_ops = 0;
    *out = NULL;

    PS_TRY(ps_jv_expect_format(root, GRAPH_FORMAT, "a graph (" GRAPH_FORMAT ")", err));
    PS_TRY(ps_jv_check_keys(root, keys, err));
    PS_TRY(ps_jv_member(root, "format", &v, err));
    PS_TRY(ps_jv_string(&v, &s, err));
    if (strcmp(s, GRAPH_FORMAT) != 0) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "expected \"%s\"", GRAPH_FORMAT);
        goto out;
    }
    PS_TRY(ps_jv_member(root, "version", &v, err));
    PS_TRY(ps_jv_int(&v, INT64_MIN, INT64_MAX, &version, err));
    if (version != GRAPH_VERSION) {
        st = ps_jv_fail(&v, err, PS_ERR_UNSUPPORTED,
                        "unsupported version %lld (this build reads version %d)",
                        (long long)version, GRAPH_VERSION);
        goto out;
    }
    PS_TRY(ps_jv_member(root, "name", &v, err));
    PS_TRY(ps_jv_string(&v, &s, err));
    if (s[0] == '\0' || strlen(s) > 200) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "a graph name must have 1 to 200 characters");
        goto out;
    }
    if ((st = ps_graph_create(s, &g)) != PS_OK) {
        st = ps_error_set(err, st, "out of memory");
        goto out;
    }

    PS_TRY(ps_jv_member(root, "tensors", &tensors_v, err));
    PS_TRY(ps_jv_array(&tensors_v, &n_ts, err));
    if (n_ts == 0 || n_ts > (1u << 24)) {
        st = ps_jv_fail(&tensors_v, err, PS_ERR_INVALID, "expected 1 to %u tensors", 1u << 24);
        goto out;
    }
    ts = calloc(n_ts, sizeof *ts);
    by_name = json_object();
    op_names = json_object();
    PS_TRY_ALLOC(ts, err);
    PS_TRY_ALLOC(by_name, err);
    PS_TRY_ALLOC(op_names, err);
    for (size_t i = 0; i < n_ts; i++) {
        ps_jv tv = ps_jv_element(&tensors_v, i);
        PS_TRY(read_tensor(&tv, &ts[i], err));
        json_t *dup = json_object_get(by_name, ts[i].name);
        if (dup != NULL) {
            st = ps_jv_fail(&tv, err, PS_ERR_INVALID,
                            "duplicate tensor name \"%s\" (also tensor %lld)", ts[i].name,
                            (long long)json_integer_value(dup));
            goto out;
        }
        if (ps_json_set(by_name, ts[i].name, json_integer((json_int_t)i)) != PS_OK) {
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
            goto out;
        }
    }

    PS_TRY(ps_jv_member(root, "ops", &ops_v, err));
    PS_TRY(ps_jv_array(&ops_v, &n_ops, err));
    if (n_ops == 0 || n_ops > (1u << 24)) {
        st = ps_jv_fail(&ops_v, err, PS_ERR_INVALID, "expected 1 to %u ops", 1u << 24);
        goto out;
    }
    ops = calloc(n_ops, sizeof *ops);
    order = calloc(n_ops, sizeof *order);
    PS_TRY_ALLOC(ops, err);
    PS_TRY_ALLOC(order, err);
    for (size_t i = 0; i < n_ops; i++) {
        ps_jv ov = ps_jv_element(&ops_v, i);
        PS_TRY(read_op(&ov, (int)i, ts, (int)n_ts, by_name, &ops[i], err));
        if (json_object_get(op_names, ops[i].def.name) != NULL) {
            st = ps_jv_fail(&ov, err, PS_ERR_INVALID, "duplicate op name \"%s\"",
                            ops[i].def.name);
            goto out;
        }
        if (ps_json_set(op_names, ops[i].def.name, json_true()) != PS_OK) {
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    for (size_t i = 0; i < n_ts; i++) {
        if (ts[i].kind == PS_TENSOR_ACTIVATION && ts[i].producer < 0) {
            ps_jv tv = ps_jv_element(&tensors_v, i);
            st = ps_jv_fail(&tv, err, PS_ERR_INVALID,
                            "activation \"%s\" is produced by no op", ts[i].name);
            goto out;
        }
    }
    PS_TRY(topo_order(&ops_v, ops, (int)n_ops, ts, order, err));

    /* Build: sources in file order, then ops in topological order. A
     * source's layer is one some op has: a tag beyond them all would make
     * a layer of its own, holding it and no op */
    int last_layer = 0;
    for (size_t k = 0; k < n_ops; k++)
        last_layer = ops[k].def.layer > last_layer ? ops[k].def.layer : last_layer;
    for (size_t i = 0; i < n_ts; i++) {
        if (ts[i].kind == PS_TENSOR_ACTIVATION)
            continue;
        if (ts[i].layer > last_layer) {
            ps_jv tv = ps_jv_element(&tensors_v, i);
            st = ps_jv_fail(&tv, err, PS_ERR_INVALID,
                            "layer %d, but the ops' layers end at %d", ts[i].layer, last_layer);
            goto out;
        }
        ps_error inner = {0};
        if ((st = ps_graph_add_source(g, ts[i].name, ts[i].kind, &ts[i].desc, ts[i].layer,
                                      &ts[i].graph_id, &inner)) != PS_OK) {
            ps_jv tv = ps_jv_element(&tensors_v, i);
            st = ps_jv_fail(&tv, err, st, "%s", inner.msg);
            goto out;
        }
    }
    for (size_t k = 0; k < n_ops; k++) {
        file_op *op = &ops[order[k]];
        ps_jv ov = ps_jv_element(&ops_v, (size_t)order[k]);
        for (int i = 0; i < op->def.n_in; i++)
            op->def.in[i] = ts[op->in_file[i]].graph_id;
        int id;
        ps_error inner = {0};
        if ((st = ps_graph_add_op(g, &op->def, &id, &inner)) != PS_OK) {
            st = ps_jv_fail(&ov, err, st, "%s", inner.msg);
            goto out;
        }
        for (int i = 0; i < op->n_out; i++) {
            file_tensor *t = &ts[op->out[i]];
            int gid = g->ops[id].out[i];
            if (!ps_tensor_desc_equal(&t->desc, &g->tensors[gid].desc)) {
                char want[200], got[200];
                ps_jv tv = ps_jv_element(&tensors_v, (size_t)op->out[i]);
                st = ps_jv_fail(&tv, err, PS_ERR_INVALID,
                                "shape mismatch: declared %s but op \"%s\" produces %s",
                                ps_tensor_desc_str(&t->desc, want, sizeof want), op->def.name,
                                ps_tensor_desc_str(&g->tensors[gid].desc, got, sizeof got));
                goto out;
            }
            if (t->layer >= 0 && t->layer != op->def.layer) {
                ps_jv tv = ps_jv_element(&tensors_v, (size_t)op->out[i]);
                st = ps_jv_fail(&tv, err, PS_ERR_INVALID,
                                "layer %d differs from its producer's layer %d", t->layer,
                                op->def.layer);
                goto out;
            }
            if (ps_graph_rename_tensor(g, gid, t->name) != PS_OK) {
                st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
                goto out;
            }
            t->graph_id = gid;
        }
    }

    if (ps_jv_has(root, "boundaries")) {
        int64_t b[64];
        int nb;
        PS_TRY(ps_jv_member(root, "boundaries", &v, err));
        PS_TRY(read_dims(&v, b, &nb, 64, 0, err));
        for (int i = 0; i < nb; i++) {
            ps_jv e = ps_jv_element(&v, (size_t)i);
            ps_error inner = {0};
            if (b[i] >= g->n_layers - 1) {
                st = ps_jv_fail(&e, err, PS_ERR_INVALID,
                                "boundary after layer %lld, but the last layer is %d",
                                (long long)b[i], g->n_layers - 1);
                goto out;
            }
            if ((st = ps_graph_add_boundary(g, (int)b[i], &inner)) != PS_OK) {
                st = ps_jv_fail(&e, err, st, "%s", inner.msg);
                goto out;
            }
        }
    }
    PS_TRY(ps_jv_member(root, "loss", &v, err));
    int loss_file;
    PS_TRY(resolve_ref(&v, by_name, (int)n_ts, &loss_file, err));
    if (ts[loss_file].kind != PS_TENSOR_ACTIVATION || ts[loss_file].desc.rank != 0 ||
        ts[loss_file].desc.dtype == PS_DTYPE_I32) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID,
                        "the loss must be a scalar floating-point activation");
        goto out;
    }
    g->loss = ts[loss_file].graph_id;
    ps_graph_update_layers(g);
    PS_TRY(ps_graph_check(g, err));
    *out = g;
    g = NULL;
out:
    ps_graph_free(g);
    free(ts);
    free(ops);
    free(order);
    json_decref(by_name);
    json_decref(op_names);
    return st;
}

ps_status ps_graph_load(const char *path, ps_graph **out, ps_error *err)
{
    ps_json_doc *doc = NULL;
    *out = NULL;
    ps_status st = ps_json_doc_load(path, &doc, err);
    if (st == PS_OK) {
        ps_jv root = ps_json_doc_root(doc);
        st = ps_graph_from_json(&root, out, err);
    }
    ps_json_doc_free(doc);
    return st;
}

ps_status ps_graph_parse(const char *name, const char *text, ps_graph **out, ps_error *err)
{
    ps_json_doc *doc = NULL;
    *out = NULL;
    ps_status st = ps_json_doc_parse(name, text, &doc, err);
    if (st == PS_OK) {
        ps_jv root = ps_json_doc_root(doc);
        st = ps_graph_from_json(&root, out, err);
    }
    ps_json_doc_free(doc);
    return st;
}

/* ---- saving -------------------------------------------------------------------- */

static json_t *dims_json(const int64_t *dims, int n)
{
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < n; i++)
        if (json_array_append_new(a, json_integer(dims[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *pair_json(const int *p)
{
    int64_t d[2] = {p[0], p[1]};
    return dims_json(d, 2);
}

static ps_status attrs_json(const ps_graph *g, const ps_op *op, json_t *o)
{
    unsigned want = ps_op_kind_get(op->kind)->attrs;
    const ps_op_attrs *a = &op->attrs;
    ps_status st = PS_OK;
    ps_op_attrs def = ps_op_attrs_default(op->kind);
    if (want & PS_ATTR_EINSUM)
        PS_TRY(ps_json_set(o, "einsum", json_string(a->einsum)));
    if ((want & PS_ATTR_EPS) && a->eps != def.eps)
        PS_TRY(ps_json_set(o, "eps", json_real(a->eps)));
    if ((want & PS_ATTR_SCALE) && a->scale != def.scale)
        PS_TRY(ps_json_set(o, "scale", json_real(a->scale)));
    if ((want & PS_ATTR_CAUSAL) && a->causal)
        PS_TRY(ps_json_set(o, "causal", json_true()));
    if (want & PS_ATTR_PERM) {
        int64_t p[PS_MAX_RANK];
        int rank = g->tensors[op->in[0]].desc.rank;
        for (int i = 0; i < rank; i++)
            p[i] = a->perm[i];
        PS_TRY(ps_json_set(o, "perm", dims_json(p, rank)));
    }
    if (want & PS_ATTR_AXES) {
        int64_t ax[PS_MAX_RANK];
        int n = 0;
        for (int i = 0; i < PS_MAX_RANK; i++)
            if (a->axes & (1u << i))
                ax[n++] = i;
        PS_TRY(ps_json_set(o, "axes", dims_json(ax, n)));
    }
    if (want & PS_ATTR_REDUCE)
        PS_TRY(ps_json_set(o, "reduce", json_string(reduce_names[a->reduce])));
    if (want & PS_ATTR_POOL)
        PS_TRY(ps_json_set(o, "pool", json_string(pool_names[a->pool])));
    if (want & PS_ATTR_WINDOW)
        PS_TRY(ps_json_set(o, "window", pair_json(a->window)));
    if (want & PS_ATTR_STRIDE)
        PS_TRY(ps_json_set(o, "stride", pair_json(a->stride)));
    if (want & PS_ATTR_PAD)
        PS_TRY(ps_json_set(o, "pad", pair_json(a->pad)));
    if (want & PS_ATTR_TOP_K)
        PS_TRY(ps_json_set(o, "top_k", json_integer(a->top_k)));
    if (want & PS_ATTR_EXPERTS)
        PS_TRY(ps_json_set(o, "experts", json_integer(a->experts)));
    if (want & PS_ATTR_CAPACITY)
        PS_TRY(ps_json_set(o, "capacity", json_integer(a->capacity)));
    if (want & PS_ATTR_SHAPE)
        PS_TRY(ps_json_set(o, "shape", dims_json(a->shape, a->shape_rank)));
out:
    return st;
}

static bool in_forward_file(const ps_graph *g, const ps_tensor *t)
{
    if (t->kind == PS_TENSOR_INPUT || t->kind == PS_TENSOR_PARAM)
        return true;
    return t->kind == PS_TENSOR_ACTIVATION && g->ops[t->producer].pass == PS_PASS_FORWARD;
}

ps_status ps_graph_to_json(const ps_graph *g, json_t **out)
{
    ps_status st = PS_OK;
    json_t *root = json_object(), *tensors = json_array(), *ops = json_array();
    *out = NULL;
    if (root == NULL || tensors == NULL || ops == NULL) {
        st = PS_ERR_NOMEM;
        goto out;
    }
    PS_TRY(ps_json_set(root, "format", json_string(GRAPH_FORMAT)));
    PS_TRY(ps_json_set(root, "version", json_integer(GRAPH_VERSION)));
    PS_TRY(ps_json_set(root, "name", json_string(g->name)));
    if (g->n_boundaries > 0) {
        int64_t b[64];
        int n = g->n_boundaries < 64 ? g->n_boundaries : 64;
        for (int i = 0; i < n; i++)
            b[i] = g->boundaries[i];
        PS_TRY(ps_json_set(root, "boundaries", dims_json(b, n)));
    }
    if (g->loss >= 0)
        PS_TRY(ps_json_set(root, "loss", json_string(g->tensors[g->loss].name)));
    /* Canonical order (what the loader builds): sources, then activations in
     * the order of their producers; so export -> load -> export is the same. */
    for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < g->n_tensors; i++) {
        const ps_tensor *t = &g->tensors[i];
        if (!in_forward_file(g, t) || (t->kind == PS_TENSOR_ACTIVATION) != (pass == 1))
            continue;
        json_t *o = json_object();
        PS_TRY(ps_json_append(tensors, o));
        PS_TRY(ps_json_set(o, "name", json_string(t->name)));
        PS_TRY(ps_json_set(o, "kind", json_string(ps_tensor_kind_names[t->kind])));
        PS_TRY(ps_json_set(o, "dtype", json_string(ps_dtype_name(t->desc.dtype))));
        PS_TRY(ps_json_set(o, "shape", dims_json(t->desc.shape, t->desc.rank)));
        PS_TRY(ps_json_set(o, "layer", json_integer(t->layer)));
    }
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        if (op->pass != PS_PASS_FORWARD)
            continue;
        json_t *o = json_object(), *in = json_array(), *outs = json_array();
        if (o == NULL || in == NULL || outs == NULL) {
            json_decref(o);
            json_decref(in);
            json_decref(outs);
            st = PS_ERR_NOMEM;
            goto out;
        }
        PS_TRY(ps_json_append(ops, o));
        PS_TRY(ps_json_set(o, "name", json_string(op->name)));
        PS_TRY(ps_json_set(o, "op", json_string(ps_op_kind_get(op->kind)->name)));
        PS_TRY(ps_json_set(o, "layer", json_integer(op->layer)));
        PS_TRY(ps_json_set(o, "in", in));
        PS_TRY(ps_json_set(o, "out", outs));
        for (int k = 0; k < op->n_in; k++)
            PS_TRY(ps_json_append(in, json_string(g->tensors[op->in[k]].name)));
        for (int k = 0; k < op->n_out; k++)
            PS_TRY(ps_json_append(outs, json_string(g->tensors[op->out[k]].name)));
        PS_TRY(attrs_json(g, op, o));
    }
    PS_TRY(ps_json_set(root, "tensors", tensors));
    tensors = NULL;
    PS_TRY(ps_json_set(root, "ops", ops));
    ops = NULL;
    *out = root;
    root = NULL;
out:
    json_decref(tensors);
    json_decref(ops);
    json_decref(root);
    return st;
}

ps_status ps_graph_save(const ps_graph *g, const char *path, ps_error *err)
{
    json_t *root = NULL;
    ps_status st = ps_graph_to_json(g, &root);
    if (st != PS_OK)
        return ps_error_set(err, st, "out of memory while writing %s", path);
    st = ps_json_save(root, path, err);
    json_decref(root);
    return st;
}
