/* exec/cpu/cpu_ops: the CPU kernels checked three ways that cannot be tuned
 * to agree with them: (a) gradients of small training-step graphs (kernels and
 * autodiff rules together) against central finite differences of the loss,
 * (b) ops run tile by tile (split contracted labels, split vocabularies,
 * split query rows, split tokens, split batches with the op's own reduce
 * over threads) against the whole-tensor op, (c) closed forms; and (d)
 * malformed calls fail with an error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/cpu/cpu_ops.h"
#include "exec/cpu/vec_exp.h"
#include "planner/models/builder.h"
#include "planner/models/zoo.h"
#include "planner/train_step.h"
#include "test_util.h"

/* ---- a whole-tensor evaluator of a graph ------------------------------------ */

typedef struct evalr {
    const ps_graph *g;
    void **data; /* per tensor: float or int32, row-major */
} evalr;

static evalr *ev_create(const ps_graph *g)
{
    evalr *ev = calloc(1, sizeof *ev);
    assert_non_null(ev);
    ev->g = g;
    ev->data = calloc((size_t)g->n_tensors, sizeof *ev->data);
    assert_non_null(ev->data);
    for (int t = 0; t < g->n_tensors; t++) {
        int64_t n = ps_tensor_numel(&g->tensors[t]);
        ev->data[t] = calloc((size_t)(n > 0 ? n : 1), 4);
        assert_non_null(ev->data[t]);
    }
    return ev;
}

static void ev_free(evalr *ev)
{
    if (ev == NULL)
        return;
    for (int t = 0; t < ev->g->n_tensors; t++)
        free(ev->data[t]);
    free(ev->data);
    free(ev);
}

static float *ev_f(evalr *ev, int t) { return ev->data[t]; }
static int32_t *ev_i(evalr *ev, int t) { return ev->data[t]; }

/* Ids and labels must index what reads them: the table's rows or the
 * logits' last dim. */
static int int_bound(const ps_graph *g, int t)
{
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        if (op->kind == PS_OP_EMBEDDING && op->in[1] == t)
            return (int)g->tensors[op->in[0]].desc.shape[0];
        if (op->kind == PS_OP_SOFTMAX_XENT && op->in[1] == t) {
            const ps_tensor_desc *d = &g->tensors[op->in[0]].desc;
            return (int)d->shape[d->rank - 1];
        }
    }
    return 1;
}

/* Sources from a fixed seed: parameters and float inputs uniform in
 * [-1, 1), integer inputs in range, optimizer state zero. */
static void ev_fill(evalr *ev, uint64_t seed)
{
    test_rng_seed(seed);
    for (int t = 0; t < ev->g->n_tensors; t++) {
        const ps_tensor *x = &ev->g->tensors[t];
        if (x->producer >= 0 || x->kind == PS_TENSOR_OPT_STATE)
            continue;
        int64_t n = ps_tensor_numel(x);
        if (x->desc.dtype == PS_DTYPE_I32) {
            int bound = int_bound(ev->g, t);
            for (int64_t i = 0; i < n; i++)
                ev_i(ev, t)[i] = below(bound);
        } else {
            for (int64_t i = 0; i < n; i++)
                ev_f(ev, t)[i] = (float)(2 * uniform() - 1);
        }
    }
}

/* Master weights start as copies of their parameters. */
static void ev_init_masters(evalr *ev)
{
    for (int i = 0; i < ev->g->n_ops; i++) {
        const ps_op *op = &ev->g->ops[i];
        if (op->kind == PS_OP_ADAM && op->n_in == 5)
            memcpy(ev->data[op->in[4]], ev->data[op->in[0]],
                   (size_t)ps_tensor_numel(&ev->g->tensors[op->in[0]]) * 4);
    }
}

static void ev_op(evalr *ev, int i, int step)
{
    const ps_op *op = &ev->g->ops[i];
    ps_tile in[PS_MAX_OP_IO], out[PS_MAX_OP_IO];
    for (int k = 0; k < op->n_in; k++)
        in[k] = ps_tile_whole(ev->data[op->in[k]], &ev->g->tensors[op->in[k]].desc);
    for (int k = 0; k < op->n_out; k++)
        out[k] = ps_tile_whole(ev->data[op->out[k]], &ev->g->tensors[op->out[k]].desc);
    ps_op_context ctx = {.step = step, .reduce = {.group_size = 1}};
    ps_error err = {0};
    if (ps_cpu_op_run(op, in, out, &ctx, &err) != PS_OK)
        fail_msg("%s", err.msg);
}

/* Runs the forward pass only, or every op but the optimizer. */
static double ev_run(evalr *ev, bool forward_only)
{
    for (int i = 0; i < ev->g->n_ops; i++) {
        const ps_op *op = &ev->g->ops[i];
        if (op->kind == PS_OP_ADAM || (forward_only && op->pass != PS_PASS_FORWARD))
            continue;
        ev_op(ev, i, 1);
    }
    return ev_f(ev, ev->g->loss)[0];
}

/* ---- (a) gradients against finite differences --------------------------------- */

/* Checks up to `per_param` elements of every parameter's gradient (the one
 * its ADAM op reads) against central differences of the loss with steps h
 * and h/2. Elements where the two differences disagree sit on a kink (relu,
 * max pooling, a top-k switch) and are skipped; at most a tenth may be. */
static void adam_check(evalr *ev);

static void grad_check_opt(const ps_graph *fwd, uint64_t seed, int per_param, double h,
                           bool remat)
{
    ps_train_options o = ps_train_options_default();
    o.remat = remat;
    ps_graph *step = NULL;
    ps_error err = {0};
    if (ps_train_step_build(fwd, &o, &step, &err) != PS_OK)
        fail_msg("%s: %s", fwd->name, err.msg);
    bool recomputes = false, masters = false;
    for (int i = 0; i < step->n_ops; i++) {
        recomputes = recomputes || step->ops[i].pass == PS_PASS_RECOMPUTE;
        masters = masters || (step->ops[i].kind == PS_OP_ADAM && step->ops[i].n_in == 5);
    }
    assert_true(recomputes == remat);
    bool half = false;
    for (int t = 0; t < fwd->n_tensors; t++)
        half = half || (fwd->tensors[t].kind == PS_TENSOR_PARAM &&
                        fwd->tensors[t].desc.dtype != PS_DTYPE_F32);
    assert_true(masters == half);
    evalr *ev = ev_create(step);
    ev_fill(ev, seed);
    ev_init_masters(ev);
    double loss = ev_run(ev, false);
    assert_true(isfinite(loss));
    int checked = 0, skipped = 0;
    for (int i = 0; i < step->n_ops; i++) {
        const ps_op *op = &step->ops[i];
        if (op->kind != PS_OP_ADAM)
            continue;
        int p = op->in[0], gt = op->in[1];
        float *pv = ev_f(ev, p), *gv = ev_f(ev, gt);
        int64_t n = ps_tensor_numel(&step->tensors[p]);
        double gmax = 0;
        for (int64_t j = 0; j < n; j++)
            gmax = fmax(gmax, fabs(gv[j]));
        if (!(gmax > 0))
            fail_msg("%s: parameter %s has an all-zero gradient", fwd->name,
                     step->tensors[p].name);
        int64_t stride = n > per_param ? n / per_param : 1;
        for (int64_t j = 0; j < n; j += stride) {
            float save = pv[j];
            double fd[2];
            for (int k = 0; k < 2; k++) {
                double hk = h / (1 << k);
                float hi = (float)(save + hk), lo = (float)(save - hk);
                pv[j] = hi;
                double lp = ev_run(ev, true);
                pv[j] = lo;
                double lm = ev_run(ev, true);
                fd[k] = (lp - lm) / ((double)hi - (double)lo);
            }
            pv[j] = save;
            double atol = 2e-3 * gmax + 1e-4;
            if (fabs(fd[0] - fd[1]) > 0.05 * fmax(fabs(fd[0]), fabs(fd[1])) + atol) {
                skipped++;
                continue;
            }
            /* Richardson: the h^2 error terms cancel */
            double num = (4 * fd[1] - fd[0]) / 3, an = gv[j];
            checked++;
            if (fabs(an - num) > 1e-2 * fmax(fabs(an), fabs(num)) + atol)
                fail_msg("%s: d loss / d %s[%lld]: backward %.7g, finite difference %.7g "
                         "(max |grad| %.3g)",
                         fwd->name, step->tensors[p].name, (long long)j, an, num, gmax);
        }
    }
    if (getenv("PS_FD_STATS"))
        fprintf(stderr, "%s: %d checked, %d skipped\n", fwd->name, checked, skipped);
    if (skipped * 10 > checked + skipped)
        fail_msg("%s: %d of %d elements sit on kinks", fwd->name, skipped, checked + skipped);
    assert_true(checked > 0);
    adam_check(ev);
    ev_free(ev);
    ps_graph_free(step);
}

static void grad_check(const ps_graph *fwd, uint64_t seed, int per_param, double h)
{
    grad_check_opt(fwd, seed, per_param, h, false);
}

/* Runs the step's ADAM ops (step 1, fresh state): each weight moves by
 * lr * g / (|g| + eps) (+ decay); with a master copy, the master moves and
 * the parameter follows it. */
static void adam_check(evalr *ev)
{
    const ps_graph *g = ev->g;
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        if (op->kind != PS_OP_ADAM)
            continue;
        int w = op->in[op->n_in == 5 ? 4 : 0];
        int64_t n = ps_tensor_numel(&g->tensors[op->in[0]]);
        float *before = malloc((size_t)n * sizeof *before);
        assert_non_null(before);
        memcpy(before, ev->data[w], (size_t)n * sizeof *before);
        ev_op(ev, i, 1);
        const float *gv = ev_f(ev, op->in[1]), *pv = ev_f(ev, op->in[0]);
        const ps_op_attrs *a = &op->attrs;
        for (int64_t j = 0; j < n; j++) {
            double want = before[j] - a->lr * (gv[j] / (fabs(gv[j]) + a->adam_eps) +
                                               a->weight_decay * before[j]);
            if (fabs(ev_f(ev, w)[j] - want) > 1e-6 || pv[j] != ev_f(ev, w)[j])
                fail_msg("%s: %s[%lld] after adam is %.8g, expected %.8g", g->name,
                         g->tensors[op->in[0]].name, (long long)j, pv[j], want);
        }
        free(before);
    }
}

/* A small forward graph under construction. */
typedef struct tg {
    ps_graph *g;
    ps_model_builder b;
    ps_error err;
} tg;

static ps_model_builder *tg_begin(tg *t, const char *name)
{
    memset(t, 0, sizeof *t);
    assert_int_equal(ps_graph_create(name, &t->g), PS_OK);
    ps_mb_init(&t->b, t->g, PS_DTYPE_F32, &t->err);
    return &t->b;
}

/* Ends the graph with MSE of `pred` against a random target input. */
static ps_graph *tg_mse(tg *t, int pred)
{
    ps_model_builder *b = &t->b;
    if (b->st != PS_OK || pred < 0)
        fail_msg("%s: %s", t->g->name, t->err.msg);
    const ps_tensor_desc d = t->g->tensors[pred].desc;
    int y = ps_mb_input(b, "target", PS_DTYPE_F32, d.rank, d.shape);
    int loss = ps_mb_binary(b, PS_OP_MSE_LOSS, "loss", pred, y);
    if (b->st != PS_OK)
        fail_msg("%s: %s", t->g->name, t->err.msg);
    t->g->loss = loss;
    return t->g;
}

static void tg_check(tg *t, int per_param, double h)
{
    grad_check(t->g, 0x5eed0001, per_param, h);
    ps_graph_free(t->g);
    t->g = NULL;
}

static int param(ps_model_builder *b, const char *name, int rank, const int64_t *shape)
{
    return ps_mb_param(b, name, rank, shape);
}

/* Label sizes 2, 3, 4, 2, ... in order of first appearance. */
static void einsum_shapes(const char *spec, int64_t sa[PS_MAX_RANK], int *ra,
                          int64_t sb[PS_MAX_RANK], int *rb)
{
    int64_t size[26] = {0};
    int next = 0, op = 0;
    *ra = *rb = 0;
    for (const char *p = spec; *p && *p != '-'; p++) {
        if (*p == ',') {
            op = 1;
            continue;
        }
        int l = *p - 'a';
        if (size[l] == 0)
            size[l] = 2 + next++ % 3;
        if (op == 0)
            sa[(*ra)++] = size[l];
        else
            sb[(*rb)++] = size[l];
    }
}

static void grad_matmul(void **state)
{
    (void)state;
    static const char *const specs[] = {
        "bk,kn->bn",       "bsk,kn->bsn",     "bsn,kn->bsk",    "bqad,bkad->baqk",
        "baqk,bkad->bqad", "bsh,vh->bsv",     "egcm,emf->egcf", "gsm,me->gse",
        "ab,cb->ca",       "abc,cad->bd",     "ibj,bjk->kbi",   "ab,ab->ba",      "abc,cd->adb",
    };
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        tg t;
        ps_model_builder *b = tg_begin(&t, specs[i]);
        int64_t sa[PS_MAX_RANK], sb[PS_MAX_RANK];
        int ra, rb;
        einsum_shapes(specs[i], sa, &ra, sb, &rb);
        int x = param(b, "a", ra, sa), w = param(b, "b", rb, sb);
        tg_mse(&t, ps_mb_matmul(b, "mm", specs[i], x, w));
        tg_check(&t, 12, 1e-2);
    }
}

static void grad_dense_and_activations(void **state)
{
    (void)state;
    static const ps_op_kind acts[] = {PS_OP_RELU, PS_OP_GELU};
    for (int i = 0; i < 2; i++) {
        tg t;
        ps_model_builder *b = tg_begin(&t, acts[i] == PS_OP_RELU ? "dense-relu" : "dense-gelu");
        int x = param(b, "x", 3, (int64_t[]){2, 3, 4});
        int y = ps_mb_dense(b, "fc", x, 5, true);
        y = ps_mb_unary(b, acts[i], "act", y);
        tg_mse(&t, y);
        tg_check(&t, 40, 1e-2);
    }
}

/* A tensor read by two ops: its gradient is the sum (ADD ops). */
static void grad_add_and_fanout(void **state)
{
    (void)state;
    tg t;
    ps_model_builder *b = tg_begin(&t, "fanout");
    int x = param(b, "x", 2, (int64_t[]){3, 4});
    int y = param(b, "y", 2, (int64_t[]){3, 4});
    int s = ps_mb_binary(b, PS_OP_ADD, "s", x, y);
    int g = ps_mb_unary(b, PS_OP_GELU, "g", s);
    int z = ps_mb_binary(b, PS_OP_ADD, "z", g, x);
    z = ps_mb_binary(b, PS_OP_ADD, "zz", z, s);
    tg_mse(&t, z);
    tg_check(&t, 12, 1e-2);
}

static void grad_layernorm(void **state)
{
    (void)state;
    tg t;
    ps_model_builder *b = tg_begin(&t, "layernorm");
    int x = param(b, "x", 3, (int64_t[]){2, 3, 5});
    tg_mse(&t, ps_mb_layernorm(b, "ln", x));
    tg_check(&t, 30, 1e-2);
}

static void grad_softmax(void **state)
{
    (void)state;
    for (int causal = 0; causal < 2; causal++) {
        tg t;
        ps_model_builder *b = tg_begin(&t, causal ? "softmax-causal" : "softmax");
        int x = param(b, "x", 4, (int64_t[]){2, 2, 4, 4});
        ps_op_attrs a = ps_op_attrs_default(PS_OP_SOFTMAX);
        a.scale = 0.7;
        a.causal = causal;
        tg_mse(&t, ps_mb_op(b, PS_OP_SOFTMAX, "sm", &a, 1, &x, 0));
        tg_check(&t, 64, 1e-2);
    }
}

/* GPT's head in small: an embedding whose table also makes the logits (a
 * tied embedding: two gradient contributions), softmax cross-entropy. */
static void grad_embedding_and_xent(void **state)
{
    (void)state;
    tg t;
    ps_model_builder *b = tg_begin(&t, "tied-embedding");
    int ids = ps_mb_input(b, "ids", PS_DTYPE_I32, 2, (int64_t[]){2, 3});
    int table = param(b, "table", 2, (int64_t[]){7, 4});
    int x = ps_mb_binary(b, PS_OP_EMBEDDING, "embed", table, ids);
    x = ps_mb_unary(b, PS_OP_GELU, "act", x);
    int logits = ps_mb_matmul(b, "logits", "bsh,vh->bsv", x, table);
    int labels = ps_mb_input(b, "labels", PS_DTYPE_I32, 2, (int64_t[]){2, 3});
    int loss = ps_mb_binary(b, PS_OP_SOFTMAX_XENT, "loss", logits, labels);
    assert_int_equal(b->st, PS_OK);
    t.g->loss = loss;
    tg_check(&t, 28, 1e-2);
}

static void grad_layout_ops(void **state)
{
    (void)state;
    tg t;
    ps_model_builder *b = tg_begin(&t, "layout");
    int x = param(b, "x", 3, (int64_t[]){2, 3, 4});
    int y = ps_mb_reshape(b, "r", x, 2, (int64_t[]){6, 4});
    ps_op_attrs tr = ps_op_attrs_default(PS_OP_TRANSPOSE);
    tr.perm[0] = 1;
    tr.perm[1] = 0;
    y = ps_mb_op(b, PS_OP_TRANSPOSE, "t", &tr, 1, &y, 0); /* [4, 6] */
    y = ps_mb_reshape(b, "r2", y, 3, (int64_t[]){2, 2, 6});
    ps_op_attrs t3 = ps_op_attrs_default(PS_OP_TRANSPOSE);
    t3.perm[0] = 2;
    t3.perm[1] = 0;
    t3.perm[2] = 1;
    y = ps_mb_op(b, PS_OP_TRANSPOSE, "t3", &t3, 1, &y, 0); /* [6, 2, 2] */
    y = ps_mb_unary(b, PS_OP_GELU, "g", y);
    tg_mse(&t, y);
    tg_check(&t, 24, 1e-2);
}

static void grad_reduce_broadcast(void **state)
{
    (void)state;
    for (int mean = 0; mean < 2; mean++) {
        tg t;
        ps_model_builder *b = tg_begin(&t, mean ? "reduce-mean" : "reduce-sum");
        int x = param(b, "x", 3, (int64_t[]){2, 3, 4});
        ps_op_attrs r = ps_op_attrs_default(PS_OP_REDUCE);
        r.reduce = mean ? PS_REDUCE_MEAN : PS_REDUCE_SUM;
        r.axes = (1u << 0) | (1u << 2);
        int y = ps_mb_op(b, PS_OP_REDUCE, "red", &r, 1, &x, 0); /* [3] */
        y = ps_mb_unary(b, PS_OP_GELU, "g", y);
        ps_op_attrs bc = ps_op_attrs_default(PS_OP_BROADCAST);
        bc.reduce = mean ? PS_REDUCE_MEAN : PS_REDUCE_SUM;
        bc.axes = 1u << 1;
        bc.shape_rank = 2;
        bc.shape[0] = 3;
        bc.shape[1] = 5;
        y = ps_mb_op(b, PS_OP_BROADCAST, "bc", &bc, 1, &y, 0); /* [3, 5] */
        int w = param(b, "w", 2, (int64_t[]){3, 5});
        y = ps_mb_binary(b, PS_OP_ADD, "add", y, w);
        y = ps_mb_unary(b, PS_OP_GELU, "g2", y);
        tg_mse(&t, y);
        tg_check(&t, 24, 1e-2);
    }
}

/* Wide-ResNet's ops in small: conv (strided, padded, non-square filter),
 * batchnorm, an activation, max and average pooling, global mean, dense, xent. */
static void grad_conv_net(void **state)
{
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        tg t;
        ps_model_builder *b = tg_begin(&t, variant ? "conv-avgpool" : "conv-maxpool");
        int x = param(b, "x", 4, (int64_t[]){2, 2, 6, 5});
        int w = param(b, "w", 4, (int64_t[]){3, 2, 3, variant ? 2 : 3});
        ps_op_attrs ca = ps_op_attrs_default(PS_OP_CONV2D);
        ca.stride[0] = variant ? 1 : 2;
        ca.stride[1] = 1;
        ca.pad[0] = 1;
        ca.pad[1] = variant ? 0 : 1;
        int y = ps_mb_op(b, PS_OP_CONV2D, "conv", &ca, 2, (int[]){x, w}, 0);
        int gamma = param(b, "gamma", 1, (int64_t[]){3});
        int beta = param(b, "beta", 1, (int64_t[]){3});
        y = ps_mb_op(b, PS_OP_BATCHNORM, "bn", NULL, 3, (int[]){y, gamma, beta}, 0);
        /* gelu, not relu: batchnorm puts many values next to relu's kink */
        y = ps_mb_unary(b, PS_OP_GELU, "act", y);
        ps_op_attrs pa = ps_op_attrs_default(PS_OP_POOL);
        pa.pool = variant ? PS_POOL_AVG : PS_POOL_MAX;
        pa.window[0] = pa.window[1] = 3;
        pa.stride[0] = pa.stride[1] = 2;
        pa.pad[0] = pa.pad[1] = 1;
        y = ps_mb_op(b, PS_OP_POOL, "pool", &pa, 1, &y, 0);
        ps_op_attrs mean = ps_op_attrs_default(PS_OP_REDUCE);
        mean.reduce = PS_REDUCE_MEAN;
        mean.axes = (1u << 2) | (1u << 3);
        y = ps_mb_op(b, PS_OP_REDUCE, "gap", &mean, 1, &y, 0);
        y = ps_mb_dense(b, "fc", y, 4, true);
        int labels = ps_mb_input(b, "labels", PS_DTYPE_I32, 1, (int64_t[]){2});
        int loss = ps_mb_binary(b, PS_OP_SOFTMAX_XENT, "loss", y, labels);
        assert_int_equal(b->st, PS_OK);
        t.g->loss = loss;
        tg_check(&t, 24, 1e-2);
    }
}

/* A batchnorm over a rank-2 input as well (per feature over the batch). */
static void grad_batchnorm_rank2(void **state)
{
    (void)state;
    tg t;
    ps_model_builder *b = tg_begin(&t, "batchnorm-rank2");
    int x = param(b, "x", 2, (int64_t[]){5, 3});
    int gamma = param(b, "gamma", 1, (int64_t[]){3});
    int beta = param(b, "beta", 1, (int64_t[]){3});
    int y = ps_mb_op(b, PS_OP_BATCHNORM, "bn", NULL, 3, (int[]){x, gamma, beta}, 0);
    tg_mse(&t, y);
    tg_check(&t, 15, 1e-2);
}

/* GShard routing in small: gate (top-2, a capacity that drops tokens),
 * dispatch, an expert matmul, combine. */
static void grad_moe(void **state)
{
    (void)state;
    tg t;
    ps_model_builder *b = tg_begin(&t, "moe");
    int64_t G = 2, S = 4, M = 3, E = 3, C = 2, Fw = 2;
    int x = param(b, "x", 3, (int64_t[]){G, S, M});
    int wg = param(b, "wg", 2, (int64_t[]){M, E});
    int logits = ps_mb_matmul(b, "gate", "gsm,me->gse", x, wg);
    ps_op_attrs ga = ps_op_attrs_default(PS_OP_MOE_GATE);
    ga.top_k = 2;
    ga.experts = E;
    ga.capacity = C;
    int slot = ps_mb_op(b, PS_OP_MOE_GATE, "route", &ga, 1, &logits, 0);
    assert_int_equal(b->st, PS_OK);
    int weight = t.g->ops[t.g->tensors[slot].producer].out[1];
    ps_op_attrs da = ps_op_attrs_default(PS_OP_MOE_DISPATCH);
    da.experts = E;
    da.capacity = C;
    int d = ps_mb_op(b, PS_OP_MOE_DISPATCH, "dispatch", &da, 2, (int[]){x, slot}, 0);
    int w1 = param(b, "w1", 3, (int64_t[]){E, M, Fw});
    int f = ps_mb_matmul(b, "expert", "egcm,emf->egcf", d, w1);
    f = ps_mb_unary(b, PS_OP_GELU, "gelu", f);
    int z = ps_mb_op(b, PS_OP_MOE_COMBINE, "combine", NULL, 3, (int[]){f, slot, weight}, 0);
    tg_mse(&t, z);
    tg_check(&t, 24, 1e-2);
}

static void grad_zoo(const char *name, void (*shrink)(ps_model_config *), int per_param,
                     bool remat)
{
    ps_model_config c;
    assert_int_equal(ps_zoo_lookup(name, &c, NULL), PS_OK);
    shrink(&c);
    ps_graph *g = NULL;
    ps_error err = {0};
    if (ps_model_build(&c, &g, &err) != PS_OK)
        fail_msg("%s", err.msg);
    grad_check_opt(g, 0x5eed0002, per_param, 1e-2, remat);
    ps_graph_free(g);
}

static void tiny_mlp(ps_model_config *c)
{
    c->batch = 3;
    c->hidden = 3;
}

static void tiny_gpt(ps_model_config *c)
{
    c->batch = 2;
    c->seq = 4;
    c->hidden = 8;
    c->heads = 2;
    c->ffn = 12;
    c->vocab = 11;
    c->layers = 1;
}

static void tiny_moe(ps_model_config *c)
{
    tiny_gpt(c);
    c->experts = 3;
    c->expert_group = 4;
    c->top_k = 2;
    c->capacity_factor = 1.0;
}

/* fp16 parameters: the step gets fp32 master weights (ADAM with 5 inputs);
 * the executor computes in fp32 all the same. */
static void tiny_mlp_fp16(ps_model_config *c)
{
    tiny_mlp(c);
    c->dtype = PS_DTYPE_F16;
}

static void tiny_gpt_2(ps_model_config *c)
{
    tiny_gpt(c);
    c->layers = 2;
}

static void grad_zoo_mlp(void **state)
{
    (void)state;
    grad_zoo("mlp", tiny_mlp, 8, false);
    grad_zoo("mlp", tiny_mlp_fp16, 4, false);
}

static void grad_zoo_gpt(void **state)
{
    (void)state;
    grad_zoo("gpt-350m", tiny_gpt, 6, false);
    grad_zoo("gpt-350m", tiny_gpt_2, 3, true); /* with recomputation */
}

static void grad_zoo_moe(void **state)
{
    (void)state;
    grad_zoo("moe-380m", tiny_moe, 6, false);
}

/* ---- test tensors and direct op calls ------------------------------------------- */

typedef struct tt {
    ps_tensor_desc d;
    void *p;
} tt;

static tt tt_alloc(ps_dtype dt, int rank, const int64_t *shape)
{
    tt t;
    memset(&t, 0, sizeof t);
    t.d.dtype = dt;
    t.d.rank = rank;
    memcpy(t.d.shape, shape, (size_t)rank * sizeof *shape);
    int64_t n = ps_tensor_desc_numel(&t.d);
    t.p = calloc((size_t)(n > 0 ? n : 1), 4);
    assert_non_null(t.p);
    return t;
}

/* Floats uniform in [lo, hi), or ints in [0, hi). */
static tt tt_rand(ps_dtype dt, int rank, const int64_t *shape, double lo, double hi)
{
    tt t = tt_alloc(dt, rank, shape);
    int64_t n = ps_tensor_desc_numel(&t.d);
    for (int64_t i = 0; i < n; i++) {
        if (dt == PS_DTYPE_I32)
            ((int32_t *)t.p)[i] = below((int)hi);
        else
            ((float *)t.p)[i] = (float)(lo + (hi - lo) * uniform());
    }
    return t;
}

static float *tf(const tt *t) { return t->p; }
static int64_t tt_numel(const tt *t) { return ps_tensor_desc_numel(&t->d); }

static ps_op mkop(ps_op_kind kind, const ps_op_attrs *a, int n_in)
{
    ps_op op;
    memset(&op, 0, sizeof op);
    op.name = (char *)"test";
    op.kind = kind;
    op.n_in = n_in;
    op.n_out = ps_op_kind_get(kind)->n_out;
    op.attrs = a ? *a : ps_op_attrs_default(kind);
    return op;
}

/* Infers the outputs with core's rules, allocates them and runs the op on
 * whole tiles. */
static void run_whole(ps_op_kind kind, const ps_op_attrs *a, int n_in, tt *in, tt *out,
                      int step)
{
    ps_op op = mkop(kind, a, n_in);
    ps_tensor_desc din[PS_MAX_OP_IO], dout[PS_MAX_OP_IO];
    int n_out;
    ps_error err = {0};
    for (int i = 0; i < n_in; i++)
        din[i] = in[i].d;
    if (ps_op_infer(kind, &op.attrs, din, n_in, dout, &n_out, &err) != PS_OK)
        fail_msg("infer: %s", err.msg);
    ps_tile ti[PS_MAX_OP_IO], to[PS_MAX_OP_IO];
    for (int i = 0; i < n_in; i++)
        ti[i] = ps_tile_whole(in[i].p, &in[i].d);
    for (int i = 0; i < n_out; i++) {
        out[i] = tt_alloc(dout[i].dtype, dout[i].rank, dout[i].shape);
        to[i] = ps_tile_whole(out[i].p, &out[i].d);
    }
    ps_op_context ctx = {.step = step, .reduce = {.group_size = 1}};
    if (ps_cpu_op_run(&op, ti, to, &ctx, &err) != PS_OK)
        fail_msg("%s", err.msg);
}

static void tt_free(tt *t, int n)
{
    for (int i = 0; i < n; i++) {
        free(t[i].p);
        t[i].p = NULL;
    }
}

/* |a - b| <= rtol * max(|b|, max |b| / 10) element by element. */
static void assert_close(const float *a, const float *b, int64_t n, double rtol, const char *what)
{
    double mx = 0;
    for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(b[i]));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)a[i] - b[i]) <= rtol * fmax(fabs(b[i]), 0.1 * mx) + 1e-30))
            fail_msg("%s: element %lld is %.8g, expected %.8g", what, (long long)i, a[i], b[i]);
}

/* ---- (b) tiles against the whole tensor ------------------------------------------- */

/* The members of a simulated reduce group (threads) and their all-reduce. */
#define MAX_MEMBERS 4

typedef struct rgroup {
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned long gen;
    float *slot[MAX_MEMBERS];
    int calls[MAX_MEMBERS];
} rgroup;

typedef struct rmember {
    rgroup *g;
    int rank;
} rmember;

static void rg_barrier(rgroup *g)
{
    pthread_mutex_lock(&g->mu);
    unsigned long gen = g->gen;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->gen)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

static ps_status rg_reduce(void *arg, float *data, int64_t n, ps_reduce_op op, ps_error *err)
{
    rmember *m = arg;
    rgroup *g = m->g;
    float *tmp = malloc((size_t)(n + 1) * sizeof *tmp);
    if (tmp == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    g->slot[m->rank] = data;
    g->calls[m->rank]++;
    rg_barrier(g);
    for (int64_t i = 0; i < n; i++) {
        float v = g->slot[0][i];
        for (int r = 1; r < g->n; r++)
            v = op == PS_REDUCE_OP_SUM ? v + g->slot[r][i] : fmaxf(v, g->slot[r][i]);
        tmp[i] = v;
    }
    rg_barrier(g); /* everyone has read every member's data */
    memcpy(data, tmp, (size_t)n * sizeof *tmp);
    free(tmp);
    return PS_OK;
}

/* How a member's output relates to the whole output. */
typedef enum out_mode {
    OUT_CONCAT = 0, /* a box of the whole output along `dim` */
    OUT_SUM = 1,    /* a whole-shaped addend */
    OUT_SAME = 2,   /* the whole output itself (replicated) */
} out_mode;

typedef struct split_case {
    const char *what;
    ps_op_kind kind;
    ps_op_attrs a;
    int n_in;
    tt *in;
    int parts;
    int in_dim[PS_MAX_OP_IO]; /* -1: whole */
    out_mode mode[PS_MAX_OP_IO];
    int out_dim[PS_MAX_OP_IO];
    bool reduce; /* members form the op's reduce group */
} split_case;

/* [lo, hi) of part m of P over n elements */
static void part_range(int64_t n, int m, int P, int64_t *lo, int64_t *len)
{
    *lo = n * m / P;
    *len = n * (m + 1) / P - *lo;
}

/* Copies between a whole row-major tensor and a tile's box. */
static void box_copy(void *whole, const ps_tensor_desc *d, ps_tile *t, bool to_tile)
{
    int64_t ws[PS_MAX_RANK], ts[PS_MAX_RANK];
    int64_t acc = 1, acc2 = 1;
    for (int k = d->rank - 1; k >= 0; k--) {
        ws[k] = acc;
        acc *= d->shape[k];
        ts[k] = acc2;
        acc2 *= t->shape[k];
    }
    int64_t n = ps_tile_numel(t);
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, off = 0;
        for (int k = 0; k < d->rank; k++) {
            int64_t idx = rem / ts[k];
            rem %= ts[k];
            off += (idx + t->offset[k]) * ws[k];
        }
        if (to_tile)
            memcpy((char *)t->data + 4 * i, (char *)whole + 4 * off, 4);
        else
            memcpy((char *)whole + 4 * off, (char *)t->data + 4 * i, 4);
    }
}

/* A tile of the whole tensor: part m of P along dim (whole when dim < 0). */
static ps_tile tile_cut(const tt *w, int dim, int m, int P, bool copy_in)
{
    ps_tile t = ps_tile_whole(NULL, &w->d);
    if (dim >= 0)
        part_range(w->d.shape[dim], m, P, &t.offset[dim], &t.shape[dim]);
    t.data = calloc((size_t)(ps_tile_numel(&t) + 1), 4);
    assert_non_null(t.data);
    if (copy_in)
        box_copy(w->p, &w->d, &t, true);
    return t;
}

typedef struct member_job {
    const ps_op *op;
    ps_tile in[PS_MAX_OP_IO], out[PS_MAX_OP_IO];
    ps_op_context ctx;
    rmember rm;
    ps_error err;
    ps_status st;
} member_job;

static void *member_main(void *arg)
{
    member_job *j = arg;
    j->st = ps_cpu_op_run(j->op, j->in, j->out, &j->ctx, &j->err);
    return NULL;
}

static void split_check(split_case *c)
{
    tt whole[PS_MAX_OP_IO], got[PS_MAX_OP_IO];
    run_whole(c->kind, &c->a, c->n_in, c->in, whole, 1);
    ps_op op = mkop(c->kind, &c->a, c->n_in);
    int n_out = op.n_out;
    for (int k = 0; k < n_out; k++)
        got[k] = tt_alloc(whole[k].d.dtype, whole[k].d.rank, whole[k].d.shape);
    member_job jobs[MAX_MEMBERS];
    rgroup g;
    memset(&g, 0, sizeof g);
    g.n = c->parts;
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    assert_true(c->parts <= MAX_MEMBERS);
    for (int m = 0; m < c->parts; m++) {
        member_job *j = &jobs[m];
        memset(j, 0, sizeof *j);
        j->op = &op;
        for (int k = 0; k < c->n_in; k++)
            j->in[k] = tile_cut(&c->in[k], c->in_dim[k], m, c->parts, true);
        for (int k = 0; k < n_out; k++)
            j->out[k] = tile_cut(&whole[k], c->mode[k] == OUT_CONCAT ? c->out_dim[k] : -1, m,
                                 c->parts, false);
        j->ctx.step = 1;
        j->ctx.reduce.group_size = c->reduce ? c->parts : 1;
        j->rm.g = &g;
        j->rm.rank = m;
        j->ctx.reduce.arg = &j->rm;
        j->ctx.reduce.fn = c->reduce ? rg_reduce : NULL;
    }
    if (c->reduce) {
        pthread_t th[MAX_MEMBERS];
        for (int m = 0; m < c->parts; m++)
            assert_int_equal(pthread_create(&th[m], NULL, member_main, &jobs[m]), 0);
        for (int m = 0; m < c->parts; m++)
            pthread_join(th[m], NULL);
    } else {
        for (int m = 0; m < c->parts; m++)
            member_main(&jobs[m]);
    }
    for (int m = 0; m < c->parts; m++) {
        member_job *j = &jobs[m];
        if (j->st != PS_OK)
            fail_msg("%s: member %d: %s", c->what, m, j->err.msg);
        for (int k = 0; k < n_out; k++) {
            int64_t n = tt_numel(&whole[k]);
            char what[200];
            snprintf(what, sizeof what, "%s: member %d output %d", c->what, m, k);
            switch (c->mode[k]) {
            case OUT_CONCAT: box_copy(got[k].p, &got[k].d, &j->out[k], false); break;
            case OUT_SUM:
                for (int64_t i = 0; i < n; i++)
                    tf(&got[k])[i] += ((float *)j->out[k].data)[i];
                break;
            case OUT_SAME:
                assert_close(j->out[k].data, whole[k].p, n, 1e-5, what);
                memcpy(got[k].p, whole[k].p, (size_t)n * 4);
                break;
            }
        }
        for (int k = 0; k < c->n_in; k++)
            free(j->in[k].data);
        for (int k = 0; k < n_out; k++)
            free(j->out[k].data);
    }
    for (int k = 0; k < n_out; k++) {
        char what[200];
        snprintf(what, sizeof what, "%s: output %d", c->what, k);
        if (whole[k].d.dtype == PS_DTYPE_I32)
            assert_memory_equal(got[k].p, whole[k].p, (size_t)tt_numel(&whole[k]) * 4);
        else
            assert_close(got[k].p, whole[k].p, tt_numel(&whole[k]), 1e-5, what);
    }
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
    tt_free(whole, n_out);
    tt_free(got, n_out);
}

static split_case scase(const char *what, ps_op_kind kind, int n_in, tt *in, int parts)
{
    split_case c;
    memset(&c, 0, sizeof c);
    c.what = what;
    c.kind = kind;
    c.a = ps_op_attrs_default(kind);
    c.n_in = n_in;
    c.in = in;
    c.parts = parts;
    for (int k = 0; k < PS_MAX_OP_IO; k++) {
        c.in_dim[k] = -1;
        c.out_dim[k] = -1;
        c.mode[k] = OUT_SAME;
    }
    return c;
}

static void tiles_matmul(void **state)
{
    (void)state;
    test_rng_seed(11);
    tt in[2] = {tt_rand(PS_DTYPE_F32, 3, (int64_t[]){2, 3, 7}, -1, 1),
                tt_rand(PS_DTYPE_F32, 2, (int64_t[]){7, 5}, -1, 1)};
    split_case c = scase("matmul, split k", PS_OP_MATMUL, 2, in, 3);
    snprintf(c.a.einsum, sizeof c.a.einsum, "bsk,kn->bsn");
    c.in_dim[0] = 2;
    c.in_dim[1] = 0;
    c.mode[0] = OUT_SUM;
    split_check(&c);
    c.what = "matmul, split s";
    c.in_dim[0] = 1;
    c.in_dim[1] = -1;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 1;
    split_check(&c);
    c.what = "matmul, split n";
    c.in_dim[0] = -1;
    c.in_dim[1] = 1;
    c.out_dim[0] = 2;
    split_check(&c);
    tt_free(in, 2);

    /* attention scores with split heads and a split head dim */
    tt qk[2] = {tt_rand(PS_DTYPE_F32, 4, (int64_t[]){2, 3, 4, 5}, -1, 1),
                tt_rand(PS_DTYPE_F32, 4, (int64_t[]){2, 3, 4, 5}, -1, 1)};
    c = scase("attention, split heads", PS_OP_MATMUL, 2, qk, 2);
    snprintf(c.a.einsum, sizeof c.a.einsum, "bqad,bkad->baqk");
    c.in_dim[0] = c.in_dim[1] = 2;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 1;
    split_check(&c);
    c.what = "attention, split d";
    c.in_dim[0] = c.in_dim[1] = 3;
    c.mode[0] = OUT_SUM;
    split_check(&c);
    tt_free(qk, 2);
}

static void tiles_embedding(void **state)
{
    (void)state;
    test_rng_seed(12);
    tt in[2] = {tt_rand(PS_DTYPE_F32, 2, (int64_t[]){9, 4}, -1, 1),
                tt_rand(PS_DTYPE_I32, 2, (int64_t[]){3, 5}, 0, 9)};
    split_case c = scase("embedding, split vocabulary", PS_OP_EMBEDDING, 2, in, 3);
    c.in_dim[0] = 0;
    c.mode[0] = OUT_SUM;
    split_check(&c);
    c.what = "embedding, split hidden";
    c.in_dim[0] = 1;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 2;
    split_check(&c);
    c.what = "embedding, split tokens";
    c.in_dim[0] = -1;
    c.in_dim[1] = 1;
    c.out_dim[0] = 1;
    split_check(&c);

    tt gin[2] = {in[1], tt_rand(PS_DTYPE_F32, 3, (int64_t[]){3, 5, 4}, -1, 1)};
    c = scase("embedding_grad, split vocabulary", PS_OP_EMBEDDING_GRAD, 2, gin, 3);
    c.a.shape_rank = 2;
    c.a.shape[0] = 9;
    c.a.shape[1] = 4;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 0;
    split_check(&c);
    c.what = "embedding_grad, split tokens";
    c.in_dim[0] = 0;
    c.in_dim[1] = 0;
    c.mode[0] = OUT_SUM;
    split_check(&c);
    tt_free(in, 2);
    tt_free(&gin[1], 1);
}

static void tiles_softmax(void **state)
{
    (void)state;
    test_rng_seed(13);
    tt x = tt_rand(PS_DTYPE_F32, 4, (int64_t[]){2, 2, 6, 6}, -2, 2);
    split_case c = scase("causal softmax, split queries", PS_OP_SOFTMAX, 1, &x, 3);
    c.a.causal = true;
    c.a.scale = 0.5;
    c.in_dim[0] = 2;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 2;
    split_check(&c);
    tt g[2] = {x, tt_rand(PS_DTYPE_F32, 4, (int64_t[]){2, 2, 6, 6}, -1, 1)};
    c = scase("softmax_grad, split queries", PS_OP_SOFTMAX_GRAD, 2, g, 2);
    c.a.causal = true;
    c.a.scale = 0.5;
    c.in_dim[0] = c.in_dim[1] = 2;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 2;
    split_check(&c);
    tt_free(&x, 1);
    tt_free(&g[1], 1);
}

static void tiles_reduce_broadcast(void **state)
{
    (void)state;
    test_rng_seed(14);
    tt x = tt_rand(PS_DTYPE_F32, 3, (int64_t[]){4, 6, 3}, -1, 1);
    split_case c = scase("reduce mean, split reduced dim", PS_OP_REDUCE, 1, &x, 3);
    c.a.reduce = PS_REDUCE_MEAN;
    c.a.axes = 1u << 1;
    c.in_dim[0] = 1;
    c.mode[0] = OUT_SUM;
    split_check(&c);
    c.what = "reduce mean, split kept dim";
    c.in_dim[0] = 0;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 0;
    split_check(&c);
    tt y = tt_rand(PS_DTYPE_F32, 2, (int64_t[]){4, 3}, -1, 1);
    c = scase("broadcast mean, split broadcast dim", PS_OP_BROADCAST, 1, &y, 3);
    c.a.reduce = PS_REDUCE_MEAN;
    c.a.axes = 1u << 1;
    c.a.shape_rank = 3;
    c.a.shape[0] = 4;
    c.a.shape[1] = 6;
    c.a.shape[2] = 3;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 1;
    split_check(&c);
    tt_free(&x, 1);
    tt_free(&y, 1);
}

static void tiles_losses(void **state)
{
    (void)state;
    test_rng_seed(15);
    tt m[2] = {tt_rand(PS_DTYPE_F32, 2, (int64_t[]){5, 3}, -1, 1),
               tt_rand(PS_DTYPE_F32, 2, (int64_t[]){5, 3}, -1, 1)};
    split_case c = scase("mse, split tokens", PS_OP_MSE_LOSS, 2, m, 2);
    c.in_dim[0] = c.in_dim[1] = 0;
    c.mode[0] = OUT_SUM;
    split_check(&c);
    c = scase("mse_grad, split tokens", PS_OP_MSE_LOSS_GRAD, 2, m, 2);
    c.in_dim[0] = c.in_dim[1] = 0;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 0;
    split_check(&c);
    tt_free(m, 2);

    tt x[2] = {tt_rand(PS_DTYPE_F32, 3, (int64_t[]){2, 3, 7}, -3, 3),
               tt_rand(PS_DTYPE_I32, 2, (int64_t[]){2, 3}, 0, 7)};
    c = scase("xent, split tokens", PS_OP_SOFTMAX_XENT, 2, x, 3);
    c.in_dim[0] = c.in_dim[1] = 1;
    c.mode[0] = OUT_SUM;
    split_check(&c);
    c = scase("xent_grad, split tokens", PS_OP_SOFTMAX_XENT_GRAD, 2, x, 2);
    c.in_dim[0] = c.in_dim[1] = 0;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 0;
    split_check(&c);
    /* split vocabulary: max, sum of exponentials and label logit reduced */
    c = scase("xent, split vocabulary", PS_OP_SOFTMAX_XENT, 2, x, 3);
    c.in_dim[0] = 2;
    c.reduce = true;
    c.mode[0] = OUT_SAME;
    split_check(&c);
    c = scase("xent_grad, split vocabulary", PS_OP_SOFTMAX_XENT_GRAD, 2, x, 3);
    c.in_dim[0] = 2;
    c.reduce = true;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 2;
    split_check(&c);
    tt_free(x, 2);
}

static void tiles_norms(void **state)
{
    (void)state;
    test_rng_seed(16);
    tt ln[3] = {tt_rand(PS_DTYPE_F32, 2, (int64_t[]){5, 4}, -1, 1),
                tt_rand(PS_DTYPE_F32, 1, (int64_t[]){4}, 0.5, 1.5),
                tt_rand(PS_DTYPE_F32, 2, (int64_t[]){5, 4}, -1, 1)};
    split_case c = scase("layernorm_grad, split rows", PS_OP_LAYERNORM_GRAD, 3, ln, 2);
    c.in_dim[0] = c.in_dim[2] = 0;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 0;
    c.mode[1] = c.mode[2] = OUT_SUM;
    split_check(&c);
    tt_free(ln, 3);

    tt bn[3] = {tt_rand(PS_DTYPE_F32, 4, (int64_t[]){4, 3, 2, 3}, -1, 2),
                tt_rand(PS_DTYPE_F32, 1, (int64_t[]){3}, 0.5, 1.5),
                tt_rand(PS_DTYPE_F32, 1, (int64_t[]){3}, -1, 1)};
    c = scase("batchnorm, split batch", PS_OP_BATCHNORM, 3, bn, 3);
    c.in_dim[0] = 0;
    c.reduce = true;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 0;
    split_check(&c);
    c.what = "batchnorm, split width";
    c.in_dim[0] = 3;
    c.out_dim[0] = 3;
    split_check(&c);
    c = scase("batchnorm, split channels", PS_OP_BATCHNORM, 3, bn, 3);
    c.in_dim[0] = 1;
    c.in_dim[1] = c.in_dim[2] = 0;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 1;
    split_check(&c);
    tt bg[3] = {bn[0], bn[1], tt_rand(PS_DTYPE_F32, 4, (int64_t[]){4, 3, 2, 3}, -1, 1)};
    c = scase("batchnorm_grad, split batch", PS_OP_BATCHNORM_GRAD, 3, bg, 2);
    c.in_dim[0] = c.in_dim[2] = 0;
    c.reduce = true;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 0;
    c.mode[1] = c.mode[2] = OUT_SAME; /* dgamma, dbeta: reduced by the op's own group */
    split_check(&c);
    tt_free(bn, 3);
    tt_free(&bg[2], 1);
}

static void tiles_conv_pool(void **state)
{
    (void)state;
    test_rng_seed(17);
    tt in[2] = {tt_rand(PS_DTYPE_F32, 4, (int64_t[]){3, 4, 5, 5}, -1, 1),
                tt_rand(PS_DTYPE_F32, 4, (int64_t[]){2, 4, 3, 3}, -1, 1)};
    split_case c = scase("conv2d, split batch", PS_OP_CONV2D, 2, in, 3);
    c.a.stride[0] = c.a.stride[1] = 2;
    c.a.pad[0] = c.a.pad[1] = 1;
    c.in_dim[0] = 0;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 0;
    split_check(&c);
    c.what = "conv2d, split input channels";
    c.in_dim[0] = c.in_dim[1] = 1;
    c.mode[0] = OUT_SUM;
    split_check(&c);
    c.what = "conv2d, split output channels";
    c.in_dim[0] = -1;
    c.in_dim[1] = 0;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 1;
    split_check(&c);

    tt dy = tt_rand(PS_DTYPE_F32, 4, (int64_t[]){3, 2, 3, 3}, -1, 1);
    tt gi[2] = {dy, in[1]};
    c = scase("conv2d_grad_input, split output channels", PS_OP_CONV2D_GRAD_INPUT, 2, gi, 2);
    c.a.stride[0] = c.a.stride[1] = 2;
    c.a.pad[0] = c.a.pad[1] = 1;
    c.a.shape_rank = 4;
    memcpy(c.a.shape, in[0].d.shape, sizeof c.a.shape);
    c.in_dim[0] = 1;
    c.in_dim[1] = 0;
    c.mode[0] = OUT_SUM;
    split_check(&c);
    tt gf[2] = {in[0], dy};
    c = scase("conv2d_grad_filter, split batch", PS_OP_CONV2D_GRAD_FILTER, 2, gf, 3);
    c.a.stride[0] = c.a.stride[1] = 2;
    c.a.pad[0] = c.a.pad[1] = 1;
    c.a.shape_rank = 4;
    memcpy(c.a.shape, in[1].d.shape, sizeof c.a.shape);
    c.in_dim[0] = c.in_dim[1] = 0;
    c.mode[0] = OUT_SUM;
    split_check(&c);

    c = scase("pool, split channels", PS_OP_POOL, 1, in, 2);
    c.a.pool = PS_POOL_MAX;
    c.a.window[0] = c.a.window[1] = 3;
    c.a.stride[0] = c.a.stride[1] = 2;
    c.a.pad[0] = c.a.pad[1] = 1;
    c.in_dim[0] = 1;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 1;
    split_check(&c);
    tt_free(in, 2);
    tt_free(&dy, 1);
}

/* Routes a [G, S, E] logits tensor with the gate, for the MoE tile tests. */
static tt moe_route(tt *slot_weight, int64_t G, int64_t S, int64_t E, int64_t C)
{
    tt logits = tt_rand(PS_DTYPE_F32, 3, (int64_t[]){G, S, E}, -2, 2);
    ps_op_attrs ga = ps_op_attrs_default(PS_OP_MOE_GATE);
    ga.top_k = 2;
    ga.experts = E;
    ga.capacity = C;
    run_whole(PS_OP_MOE_GATE, &ga, 1, &logits, slot_weight, 1);
    return logits;
}

static void tiles_moe(void **state)
{
    (void)state;
    test_rng_seed(18);
    int64_t G = 2, S = 5, E = 4, C = 2, M = 3;
    tt sw[2];
    tt logits = moe_route(sw, G, S, E, C);
    tt x = tt_rand(PS_DTYPE_F32, 3, (int64_t[]){G, S, M}, -1, 1);
    tt din[2] = {x, sw[0]};
    split_case c = scase("moe_dispatch, split experts", PS_OP_MOE_DISPATCH, 2, din, 2);
    c.a.experts = E;
    c.a.capacity = C;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 0;
    split_check(&c);
    c.what = "moe_dispatch, split capacity";
    c.out_dim[0] = 2;
    split_check(&c);
    c.what = "moe_dispatch, split groups";
    c.in_dim[0] = c.in_dim[1] = 0;
    c.out_dim[0] = 1;
    split_check(&c);

    tt y = tt_rand(PS_DTYPE_F32, 4, (int64_t[]){E, G, C, M}, -1, 1);
    tt cin[3] = {y, sw[0], sw[1]};
    c = scase("moe_combine, split experts", PS_OP_MOE_COMBINE, 3, cin, 3);
    c.in_dim[0] = 0;
    c.mode[0] = OUT_SUM;
    split_check(&c);
    c = scase("moe_dispatch_grad, split experts", PS_OP_MOE_DISPATCH_GRAD, 2, cin, 2);
    c.in_dim[0] = 0;
    c.mode[0] = OUT_SUM;
    split_check(&c);
    tt dz = tt_rand(PS_DTYPE_F32, 3, (int64_t[]){G, S, M}, -1, 1);
    tt gin[4] = {dz, y, sw[0], sw[1]};
    c = scase("moe_combine_grad, split experts", PS_OP_MOE_COMBINE_GRAD, 4, gin, 2);
    c.in_dim[1] = 0;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 0;
    c.mode[1] = OUT_SUM;
    split_check(&c);
    c.what = "moe_combine_grad, split columns";
    c.in_dim[0] = 2;
    c.in_dim[1] = 3;
    c.out_dim[0] = 3;
    split_check(&c);
    tt gg[3] = {logits, sw[0], tt_rand(PS_DTYPE_F32, 3, (int64_t[]){G, S, 2}, -1, 1)};
    c = scase("moe_gate_grad, split tokens", PS_OP_MOE_GATE_GRAD, 3, gg, 2);
    c.a.top_k = 2;
    c.in_dim[0] = c.in_dim[1] = c.in_dim[2] = 1;
    c.mode[0] = OUT_CONCAT;
    c.out_dim[0] = 1;
    split_check(&c);
    tt_free(sw, 2);
    tt_free(&x, 1);
    tt_free(&y, 1);
    tt_free(&dz, 1);
    tt_free(&logits, 1);
    tt_free(&gg[2], 1);
}

/* ---- (c) closed forms ---------------------------------------------------------------- */

static void closed_adam(void **state)
{
    (void)state;
    float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.5f, 0.1f, -1.0f};
    float m[3] = {0}, v[3] = {0}, master[3] = {3.0f, 3.0f, 3.0f};
    ps_tensor_desc d = {PS_DTYPE_F32, 1, {3}};
    ps_op_attrs a = ps_op_attrs_default(PS_OP_ADAM);
    a.lr = 0.1;
    a.weight_decay = 0.01;
    ps_op op = mkop(PS_OP_ADAM, &a, 4);
    ps_tile in[5] = {ps_tile_whole(p, &d), ps_tile_whole(g, &d), ps_tile_whole(m, &d),
                     ps_tile_whole(v, &d), ps_tile_whole(master, &d)};
    ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
    ps_error err = {0};
    assert_int_equal(ps_cpu_op_run(&op, in, NULL, &ctx, &err), PS_OK);
    /* step 1: m / (1 - b1) = g, v / (1 - b2) = g^2, so the step is sign(g) */
    double want[3];
    for (int i = 0; i < 3; i++) {
        double p0 = i == 0 ? 1.0 : i == 1 ? -2.0 : 0.5;
        want[i] = p0 - 0.1 * (g[i] / (fabs(g[i]) + 1e-8) + 0.01 * p0);
        assert_true(fabs(p[i] - want[i]) < 1e-6);
        assert_true(fabs(m[i] - 0.1 * g[i]) < 1e-7);
        assert_true(fabs(v[i] - 0.001 * g[i] * g[i]) < 1e-9);
    }
    assert_true(fabs(p[0] - 0.899) < 1e-6);
    /* step 2 with the same gradient, by the formula in double */
    ctx.step = 2;
    assert_int_equal(ps_cpu_op_run(&op, in, NULL, &ctx, &err), PS_OK);
    for (int i = 0; i < 3; i++) {
        double mi = 0.9 * 0.1 * g[i] + 0.1 * g[i];
        double vi = 0.999 * 0.001 * g[i] * g[i] + 0.001 * g[i] * g[i];
        double upd = (mi / (1 - 0.81)) / (sqrt(vi / (1 - 0.998001)) + 1e-8);
        double w = want[i] - 0.1 * (upd + 0.01 * want[i]);
        assert_true(fabs(p[i] - w) < 1e-6);
    }
    /* with a master copy: the master is updated and copied into param */
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    op = mkop(PS_OP_ADAM, &a, 5);
    ctx.step = 1;
    assert_int_equal(ps_cpu_op_run(&op, in, NULL, &ctx, &err), PS_OK);
    for (int i = 0; i < 3; i++) {
        double w = 3.0 - 0.1 * (g[i] / (fabs(g[i]) + 1e-8) + 0.03);
        assert_true(fabs(master[i] - w) < 1e-6);
        assert_true(p[i] == master[i]);
    }
}

/* Adam under a loss scale S reads S times the gradient and divides by S: a
 * power of two gives the unscaled update bit for bit. A non-finite gradient
 * fails the op and leaves parameter and state as they were. */
static void closed_adam_loss_scale(void **state)
{
    (void)state;
    ps_tensor_desc d = {PS_DTYPE_F32, 1, {3}};
    ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
    ps_error err = {0};
    float p[2][3], m[2][3] = {{0}}, v[2][3] = {{0}}, g[2][3];
    for (int k = 0; k < 2; k++) {
        ps_op_attrs a = ps_op_attrs_default(PS_OP_ADAM);
        a.scale = k == 0 ? 1 : 0x1p12;
        ps_op op = mkop(PS_OP_ADAM, &a, 4);
        for (int i = 0; i < 3; i++) {
            p[k][i] = 0.3f * (float)(i + 1);
            g[k][i] = (float)(a.scale * (0.01 * i - 0.013));
        }
        ps_tile in[4] = {ps_tile_whole(p[k], &d), ps_tile_whole(g[k], &d),
                         ps_tile_whole(m[k], &d), ps_tile_whole(v[k], &d)};
        for (ctx.step = 1; ctx.step <= 3; ctx.step++)
            assert_int_equal(ps_cpu_op_run(&op, in, NULL, &ctx, &err), PS_OK);
    }
    assert_memory_equal(p[0], p[1], sizeof p[0]);
    assert_memory_equal(m[0], m[1], sizeof m[0]);
    assert_memory_equal(v[0], v[1], sizeof v[0]);
    assert_true(p[0][0] != 0.3f);
    /* inf and NaN: named, and nothing changes */
    const float bad[2] = {INFINITY, NAN};
    for (int k = 0; k < 2; k++) {
        ps_op_attrs a = ps_op_attrs_default(PS_OP_ADAM);
        a.scale = k == 0 ? 1024 : 1;
        ps_op op = mkop(PS_OP_ADAM, &a, 4);
        float before[3][3];
        g[0][1] = bad[k];
        memcpy(before[0], p[0], sizeof p[0]);
        memcpy(before[1], m[0], sizeof m[0]);
        memcpy(before[2], v[0], sizeof v[0]);
        ps_tile in[4] = {ps_tile_whole(p[0], &d), ps_tile_whole(g[0], &d),
                         ps_tile_whole(m[0], &d), ps_tile_whole(v[0], &d)};
        ps_error_clear(&err);
        assert_int_equal(ps_cpu_op_run(&op, in, NULL, &ctx, &err), PS_ERR_INVALID);
        const char *want = k == 0 ? "the gradient holds inf at element 1 of this tile at step 4: "
                                    "the loss scale 1024 overflowed it (lower --loss-scale)"
                                  : "the gradient holds NaN at element 1 of this tile at step 4 "
                                    "(the step diverged)";
        if (strstr(err.msg, want) == NULL)
            fail_msg("%s", err.msg);
        assert_memory_equal(before[0], p[0], sizeof p[0]);
        assert_memory_equal(before[1], m[0], sizeof m[0]);
        assert_memory_equal(before[2], v[0], sizeof v[0]);
    }
    /* a scale outside the range is refused */
    ps_op_attrs a = ps_op_attrs_default(PS_OP_ADAM);
    a.scale = 0;
    ps_op op = mkop(PS_OP_ADAM, &a, 4);
    g[0][1] = 0;
    ps_tile in[4] = {ps_tile_whole(p[0], &d), ps_tile_whole(g[0], &d), ps_tile_whole(m[0], &d),
                     ps_tile_whole(v[0], &d)};
    ps_error_clear(&err);
    assert_int_equal(ps_cpu_op_run(&op, in, NULL, &ctx, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "loss scale"));
}

static void closed_softmax_layernorm(void **state)
{
    (void)state;
    test_rng_seed(21);
    /* rows sum to 1; the causal mask uses the tile's global query offset */
    tt x = tt_rand(PS_DTYPE_F32, 2, (int64_t[]){6, 6}, -3, 3);
    ps_op_attrs a = ps_op_attrs_default(PS_OP_SOFTMAX);
    a.causal = true;
    ps_op op = mkop(PS_OP_SOFTMAX, &a, 1);
    ps_tile tx = tile_cut(&x, 0, 1, 2, true); /* query rows 3..5 */
    ps_tile ty = tile_cut(&x, 0, 1, 2, false);
    ps_error err = {0};
    assert_int_equal(ps_cpu_op_run(&op, &tx, &ty, NULL, &err), PS_OK);
    for (int i = 0; i < 3; i++) {
        double s = 0;
        for (int j = 0; j < 6; j++) {
            float yv = ((float *)ty.data)[i * 6 + j];
            if (j > 3 + i)
                assert_true(yv == 0.0f);
            else
                assert_true(yv > 0);
            s += yv;
        }
        assert_true(fabs(s - 1) < 1e-6);
    }
    free(tx.data);
    free(ty.data);

    /* layernorm with gamma 1, beta 0: rows of mean 0 and variance ~1 */
    tt ln[3] = {x, tt_alloc(PS_DTYPE_F32, 1, (int64_t[]){6}), tt_alloc(PS_DTYPE_F32, 1,
                                                                         (int64_t[]){6})};
    for (int j = 0; j < 6; j++)
        tf(&ln[1])[j] = 1.0f;
    tt y;
    run_whole(PS_OP_LAYERNORM, NULL, 3, ln, &y, 1);
    for (int i = 0; i < 6; i++) {
        double s = 0, q = 0;
        for (int j = 0; j < 6; j++)
            s += tf(&y)[i * 6 + j];
        for (int j = 0; j < 6; j++)
            q += tf(&y)[i * 6 + j] * tf(&y)[i * 6 + j];
        assert_true(fabs(s / 6) < 1e-6);
        assert_true(fabs(q / 6 - 1) < 1e-4);
    }
    tt_free(&y, 1);
    tt_free(ln, 3);
}

static void closed_losses_and_reductions(void **state)
{
    (void)state;
    /* xent of uniform logits is log V; its gradient (1/V - onehot) / tokens */
    tt x[2] = {tt_alloc(PS_DTYPE_F32, 2, (int64_t[]){4, 5}),
               tt_alloc(PS_DTYPE_I32, 1, (int64_t[]){4})};
    for (int i = 0; i < 20; i++)
        tf(&x[0])[i] = 0.25f;
    for (int i = 0; i < 4; i++)
        ((int32_t *)x[1].p)[i] = i;
    tt y;
    run_whole(PS_OP_SOFTMAX_XENT, NULL, 2, x, &y, 1);
    assert_true(fabs(tf(&y)[0] - log(5.0)) < 1e-6);
    tt_free(&y, 1);
    run_whole(PS_OP_SOFTMAX_XENT_GRAD, NULL, 2, x, &y, 1);
    for (int t = 0; t < 4; t++)
        for (int j = 0; j < 5; j++)
            assert_true(fabs(tf(&y)[t * 5 + j] - (0.2 - (j == t)) / 4) < 1e-7);
    /* a loss scale multiplies the seed: exactly, for a power of two */
    ps_op_attrs scaled = ps_op_attrs_default(PS_OP_SOFTMAX_XENT_GRAD);
    scaled.scale = 8;
    tt ys;
    run_whole(PS_OP_SOFTMAX_XENT_GRAD, &scaled, 2, x, &ys, 1);
    for (int i = 0; i < 20; i++)
        assert_true(tf(&ys)[i] == 8 * tf(&y)[i]);
    tt_free(&ys, 1);
    tt_free(&y, 1);
    tt_free(x, 2);

    /* MSE of 1 against 0 is 1; its gradient 2 / n */
    tt m[2] = {tt_alloc(PS_DTYPE_F32, 2, (int64_t[]){2, 3}),
               tt_alloc(PS_DTYPE_F32, 2, (int64_t[]){2, 3})};
    for (int i = 0; i < 6; i++)
        tf(&m[0])[i] = 1.0f;
    run_whole(PS_OP_MSE_LOSS, NULL, 2, m, &y, 1);
    assert_true(tf(&y)[0] == 1.0f);
    tt_free(&y, 1);
    run_whole(PS_OP_MSE_LOSS_GRAD, NULL, 2, m, &y, 1);
    for (int i = 0; i < 6; i++)
        assert_true(fabs(tf(&y)[i] - 1.0 / 3) < 1e-7);
    tt_free(&y, 1);
    scaled = ps_op_attrs_default(PS_OP_MSE_LOSS_GRAD);
    scaled.scale = 1.5;
    run_whole(PS_OP_MSE_LOSS_GRAD, &scaled, 2, m, &y, 1);
    for (int i = 0; i < 6; i++)
        assert_true(fabs(tf(&y)[i] - 0.5) < 1e-7);
    tt_free(&y, 1);

    /* reduce and broadcast of 0..5 as [2, 3] */
    for (int i = 0; i < 6; i++)
        tf(&m[0])[i] = (float)i;
    ps_op_attrs r = ps_op_attrs_default(PS_OP_REDUCE);
    r.axes = 1u << 0;
    r.reduce = PS_REDUCE_MEAN;
    run_whole(PS_OP_REDUCE, &r, 1, m, &y, 1);
    assert_true(tf(&y)[0] == 1.5f && tf(&y)[1] == 2.5f && tf(&y)[2] == 3.5f);
    ps_op_attrs bc = r;
    bc.shape_rank = 2;
    bc.shape[0] = 2;
    bc.shape[1] = 3;
    tt z;
    run_whole(PS_OP_BROADCAST, &bc, 1, &y, &z, 1);
    for (int i = 0; i < 6; i++)
        assert_true(tf(&z)[i] == tf(&y)[i % 3] / 2);
    tt_free(&z, 1);
    tt_free(&y, 1);
    tt_free(m, 2);

    /* relu keeps positives and gives +0 for the rest, a NaN and -0 too;
     * relu_grad passes dy where the output is positive */
    tt rx = tt_alloc(PS_DTYPE_F32, 1, (int64_t[]){6});
    const float rin[6] = {2.5f, -1.0f, 0.0f, -0.0f, NAN, 1e-40f};
    memcpy(rx.p, rin, sizeof rin);
    run_whole(PS_OP_RELU, NULL, 1, &rx, &y, 1);
    for (int i = 0; i < 6; i++) {
        float want = i == 0 ? 2.5f : i == 5 ? 1e-40f : 0.0f;
        assert_true(tf(&y)[i] == want && !signbit(tf(&y)[i]));
    }
    tt rg[2] = {y, tt_alloc(PS_DTYPE_F32, 1, (int64_t[]){6})};
    for (int i = 0; i < 6; i++)
        tf(&rg[1])[i] = -3.0f - (float)i;
    tt dx;
    run_whole(PS_OP_RELU_GRAD, NULL, 2, rg, &dx, 1);
    for (int i = 0; i < 6; i++)
        assert_true(tf(&dx)[i] == (i == 0 || i == 5 ? -3.0f - (float)i : 0.0f));
    tt_free(&dx, 1);
    tt_free(rg, 2);
    tt_free(&rx, 1);

    /* gelu(0) = 0, gelu(x) ~ x for large x, relu_grad follows the output */
    tt gx = tt_alloc(PS_DTYPE_F32, 1, (int64_t[]){3});
    tf(&gx)[0] = 0.0f;
    tf(&gx)[1] = 6.0f;
    tf(&gx)[2] = -6.0f;
    run_whole(PS_OP_GELU, NULL, 1, &gx, &y, 1);
    assert_true(tf(&y)[0] == 0.0f && fabs(tf(&y)[1] - 6) < 1e-6 && fabs(tf(&y)[2]) < 1e-6);
    tt_free(&y, 1);
    tt_free(&gx, 1);
}

/* Max pooling against a plain scan of every window (the first strict
 * maximum of its in-bounds elements in row-major order, 0 and no gradient for
 * a window wholly in the padding): values from {-1, 0, 1, 2} so that most
 * windows tie, some planes with NaN, geometries with overlapping windows,
 * strides past the window and windows in the padding. The output and dx
 * bit for bit. */
static void maxpool_brute_force(void **state)
{
    (void)state;
    const int geo[][3] = {{3, 2, 1}, {2, 2, 0}, {3, 1, 1}, {1, 1, 1}, {2, 3, 1}, {3, 3, 2}};
    const int64_t N = 2, C = 3, H = 5, W = 7;
    uint64_t h = 12345;
    for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++)
        for (int with_nan = 0; with_nan < 2; with_nan++) {
            int K = geo[g][0], S = geo[g][1], P = geo[g][2];
            ps_op_attrs a = ps_op_attrs_default(PS_OP_POOL);
            a.pool = PS_POOL_MAX;
            a.window[0] = a.window[1] = K;
            a.stride[0] = a.stride[1] = S;
            a.pad[0] = a.pad[1] = P;
            tt x = tt_alloc(PS_DTYPE_F32, 4, (int64_t[]){N, C, H, W});
            for (int64_t i = 0; i < N * C * H * W; i++) {
                h = h * 6364136223846793005ULL + 1442695040888963407ULL;
                tf(&x)[i] = (float)((int)(h >> 33) % 4 - 1);
                if (with_nan && (h >> 20) % 9 == 0)
                    tf(&x)[i] = NAN;
            }
            tt y;
            run_whole(PS_OP_POOL, &a, 1, &x, &y, 1);
            int64_t OH = y.d.shape[2], OW = y.d.shape[3];
            assert_int_equal(OH, (H + 2 * P - K) / S + 1);
            assert_int_equal(OW, (W + 2 * P - K) / S + 1);
            tt in3[3] = {x, y, tt_alloc(PS_DTYPE_F32, 4, (int64_t[]){N, C, OH, OW})};
            for (int64_t i = 0; i < N * C * OH * OW; i++)
                tf(&in3[2])[i] = (float)(i % 13 + 1) * 0.25f;
            tt dx;
            run_whole(PS_OP_POOL_GRAD, &a, 3, in3, &dx, 1);
            float *want_dx = calloc((size_t)(N * C * H * W), sizeof *want_dx);
            assert_non_null(want_dx);
            for (int64_t p = 0; p < N * C; p++)
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        int64_t best = -1;
                        for (int64_t i = oh * S - P; i < oh * S - P + K; i++)
                            for (int64_t j = ow * S - P; j < ow * S - P + K; j++) {
                                if (i < 0 || i >= H || j < 0 || j >= W)
                                    continue;
                                int64_t at = (p * H + i) * W + j;
                                if (best < 0 || tf(&x)[at] > tf(&x)[best])
                                    best = at;
                            }
                        float want = best < 0 ? 0.0f : tf(&x)[best];
                        float got = tf(&y)[(p * OH + oh) * OW + ow];
                        assert_memory_equal(&got, &want, sizeof got);
                        if (best >= 0)
                            want_dx[best] += tf(&in3[2])[(p * OH + oh) * OW + ow];
                    }
            assert_memory_equal(tf(&dx), want_dx, (size_t)(N * C * H * W) * sizeof *want_dx);
            free(want_dx);
            tt_free(&dx, 1);
            tt_free(in3, 3);
        }
}

/* GELU (the tanh form) and its gradient against long-double closed forms,
 * over x in [-12, 12] every 2^-9 and around the gradient's zero: the output
 * within 2 ulp of the exact value (an error of the old 0.5 x (1 + tanh(u))
 * was 32 ulp where 1 + tanh cancels), the gradient within 4 ulp of its
 * largest terms. */
static void closed_gelu(void **state)
{
    (void)state;
    const long double c = 0.79788456080286535587989211986876L, a = 0.044715L;
    enum { N = 12 * 2 * 512 + 1 };
    tt x = tt_alloc(PS_DTYPE_F32, 1, (int64_t[]){N});
    tt dy = tt_alloc(PS_DTYPE_F32, 1, (int64_t[]){N});
    for (int i = 0; i < N; i++) {
        tf(&x)[i] = (float)(-12.0 + i / 512.0);
        tf(&dy)[i] = i % 3 == 0 ? 1.0f : -0.75f;
    }
    tt y, dx, in2[2] = {x, dy};
    run_whole(PS_OP_GELU, NULL, 1, &x, &y, 1);
    run_whole(PS_OP_GELU_GRAD, NULL, 2, in2, &dx, 1);
    const long double ulp = 0x1p-24L; /* half an ulp of float, relative */
    for (int i = 0; i < N; i++) {
        long double v = tf(&x)[i], u = c * (v + a * v * v * v);
        /* 1 + tanh(u) and 1 - tanh(u)^2 without cancellation: through
         * E = e^(2u) for u < 0, where tanh(u) rounds to -1 first */
        long double one_plus, one_minus_sq;
        if (u < 0) {
            long double e = expl(2 * u);
            one_plus = 2 * e / (1 + e);
            one_minus_sq = 4 * e / ((1 + e) * (1 + e));
        } else {
            long double th = tanhl(u);
            one_plus = 1 + th;
            one_minus_sq = 1 - th * th;
        }
        long double want = 0.5L * v * one_plus;
        long double got = tf(&y)[i];
        if (fabsl(got - want) > 4 * ulp * fabsl(want) + 0x1p-148L)
            fail_msg("gelu(%.9g) = %.9g, exact %.12Lg", (double)v, (double)got, want);
        /* the gradient: two terms, the second cancelling the first for x < 0 */
        long double t1 = 0.5L * one_plus;
        long double t2 = 0.5L * v * one_minus_sq * c * (1.0L + 3.0L * a * v * v);
        long double gwant = (t1 + t2) * tf(&dy)[i], ggot = tf(&dx)[i];
        long double scale = (fabsl(t1) + fabsl(t2)) * fabsl(tf(&dy)[i]);
        if (fabsl(ggot - gwant) > 8 * ulp * scale + 0x1p-148L)
            fail_msg("gelu'(%.9g) * dy = %.9g, exact %.12Lg", (double)v, (double)ggot, gwant);
    }
    tt_free(&y, 1);
    tt_free(&dx, 1);
    tt_free(&x, 1);
    tt_free(&dy, 1);
}

/* ps_exp_inplace (libmvec's vector exp where the CPU has AVX2) against
 * expl: within glibc's bound of 4 ulp of the double result, special values
 * as exp(), every length's tail, nothing written past n. */
static void closed_exp_inplace(void **state)
{
    (void)state;
    print_message("exp: %s\n", ps_exp_is_vectorized() ? "libmvec, 4 lanes" : "exp() per element");
    enum { N = 20000 };
    double *x = malloc((N + 1) * sizeof *x), *orig = malloc(N * sizeof *orig);
    assert_non_null(x);
    assert_non_null(orig);
    test_rng_seed(7);
    for (int i = 0; i < N; i++) { /* the range where exp is finite and normal, and past it */
        double u = uniform();
        orig[i] = i % 4 == 0 ? (u - 0.5) * 30 : -750 + u * 1462;
    }
    for (int len = 0; len <= N; len = len < 13 ? len + 1 : len == N ? N + 1 : N) {
        memcpy(x, orig, (size_t)len * sizeof *x);
        x[len] = 12345.0; /* a sentinel */
        ps_exp_inplace(x, len);
        assert_true(x[len] == 12345.0);
        for (int i = 0; i < len; i++) {
            long double want = expl((long double)orig[i]);
            if (want > 0x1.fffffffffffffp1023L) {
                if (!(isinf(x[i]) && x[i] > 0))
                    fail_msg("exp(%.17g) = %.17g, want inf", orig[i], x[i]);
                continue;
            }
            /* 4 ulp of the double result; below the normal range, 4 ulp of the
             * smallest normal's spacing (subnormals have fewer digits) */
            long double ulp = fmaxl(ldexpl(1.0L, ilogbl(want) - 52), 0x1p-1074L);
            if (fabsl((long double)x[i] - want) > 4 * ulp)
                fail_msg("exp(%.17g) = %.17g, exact %.21Lg (length %d)", orig[i], x[i], want, len);
        }
    }
    double sp[7] = {-INFINITY, INFINITY, NAN, 0.0, -0.0, 710.0, -1000.0};
    ps_exp_inplace(sp, 7);
    assert_true(sp[0] == 0.0);
    assert_true(isinf(sp[1]) && sp[1] > 0);
    assert_true(isnan(sp[2]));
    assert_true(sp[3] == 1.0 && sp[4] == 1.0);
    assert_true(isinf(sp[5]) && sp[5] > 0);
    assert_true(sp[6] == 0.0);
    free(x);
    free(orig);
}

/* GShard's capacity order: every first choice, then every second choice. */
static void closed_moe_gate(void **state)
{
    (void)state;
    tt logits = tt_alloc(PS_DTYPE_F32, 3, (int64_t[]){1, 3, 3});
    static const float l[9] = {3, 2, 0, 3, 2, 0, 0, 2, 3};
    memcpy(logits.p, l, sizeof l);
    ps_op_attrs ga = ps_op_attrs_default(PS_OP_MOE_GATE);
    ga.top_k = 2;
    ga.experts = 3;
    ga.capacity = 2;
    tt sw[2];
    run_whole(PS_OP_MOE_GATE, &ga, 1, &logits, sw, 1);
    /* first choices: t0 e0 (pos 0), t1 e0 (pos 1), t2 e2 (pos 0); second
     * choices: t0 e1 (pos 0), t1 e1 (pos 1), t2 e1 (full: -1) */
    static const int32_t want[6] = {0, 2, 1, 3, 4, -1};
    assert_memory_equal(sw[0].p, want, sizeof want);
    double e = exp(3.0) + exp(2.0) + 1;
    assert_true(fabs(tf(&sw[1])[0] - exp(3.0) / e) < 1e-6);
    assert_true(fabs(tf(&sw[1])[5] - exp(2.0) / e) < 1e-6);
    tt_free(sw, 2);
    tt_free(&logits, 1);
}

/* ---- (d) malformed calls --------------------------------------------------------------- */

/* ---- (d) outputs added into (accumulated gradients) ------------------------------- */

/* The op run with ctx->accumulate into a tile holding y0 leaves y0 + its
 * result: bit for bit where the op rounds its result before adding (ADD,
 * REDUCE), to rounding where the sum is the GEMM's own (beta 1) or the
 * scatter's. */
static void add_into_case(const char *what, ps_op_kind kind, const ps_op_attrs *a, int n_in,
                          tt *in, bool exact)
{
    tt plain[PS_MAX_OP_IO];
    run_whole(kind, a, n_in, in, plain, 1);
    ps_op op = mkop(kind, a, n_in);
    int64_t n = tt_numel(&plain[0]);
    tt y0 = tt_rand(PS_DTYPE_F32, plain[0].d.rank, plain[0].d.shape, -2, 2);
    float *y = malloc((size_t)n * sizeof *y), *want = malloc((size_t)n * sizeof *want);
    assert_non_null(y);
    assert_non_null(want);
    memcpy(y, y0.p, (size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; i++)
        want[i] = tf(&y0)[i] + tf(&plain[0])[i];
    ps_tile ti[PS_MAX_OP_IO], to = ps_tile_whole(y, &plain[0].d);
    for (int i = 0; i < n_in; i++)
        ti[i] = ps_tile_whole(in[i].p, &in[i].d);
    ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}, .accumulate = 1u};
    ps_error err = {0};
    assert_true(ps_cpu_op_accumulates(kind, 0));
    if (ps_cpu_op_run(&op, ti, &to, &ctx, &err) != PS_OK)
        fail_msg("%s: %s", what, err.msg);
    if (exact) {
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&y[i], &want[i], sizeof *y) != 0)
                fail_msg("%s: element %lld is %.9g, want %.9g", what, (long long)i, y[i],
                         want[i]);
    } else {
        assert_close(y, want, n, 1e-5, what);
    }
    /* and the plain run overwrote: y0 left no trace */
    assert_false(memcmp(y, tf(&plain[0]), (size_t)n * sizeof *y) == 0);
    free(y);
    free(want);
    tt_free(&y0, 1);
    tt_free(plain, ps_op_kind_get(kind)->n_out);
}

static void added_into_outputs(void **state)
{
    (void)state;
    test_rng_seed(23);
    const char *einsums[] = {"bsk,kn->bsn", /* the output viewed as it is */
                             "bsk,kn->bns", /* m split by n: packed, then scattered back */
                             "sk,kn->ns",   /* stored transposed (C^T = B^T A^T) */
                             "bqad,bkad->baqk"};
    tt mm[4][2] = {
        {tt_rand(PS_DTYPE_F32, 3, (int64_t[]){2, 3, 7}, -1, 1),
         tt_rand(PS_DTYPE_F32, 2, (int64_t[]){7, 5}, -1, 1)},
        {tt_rand(PS_DTYPE_F32, 3, (int64_t[]){2, 3, 7}, -1, 1),
         tt_rand(PS_DTYPE_F32, 2, (int64_t[]){7, 5}, -1, 1)},
        {tt_rand(PS_DTYPE_F32, 2, (int64_t[]){6, 300}, -1, 1),
         tt_rand(PS_DTYPE_F32, 2, (int64_t[]){300, 5}, -1, 1)},
        {tt_rand(PS_DTYPE_F32, 4, (int64_t[]){2, 3, 4, 5}, -1, 1),
         tt_rand(PS_DTYPE_F32, 4, (int64_t[]){2, 3, 4, 5}, -1, 1)},
    };
    for (int i = 0; i < 4; i++) {
        ps_op_attrs a = ps_op_attrs_default(PS_OP_MATMUL);
        snprintf(a.einsum, sizeof a.einsum, "%s", einsums[i]);
        add_into_case(einsums[i], PS_OP_MATMUL, &a, 2, mm[i], false);
        tt_free(mm[i], 2);
    }

    tt gf[2] = {tt_rand(PS_DTYPE_F32, 4, (int64_t[]){3, 4, 5, 5}, -1, 1),
                tt_rand(PS_DTYPE_F32, 4, (int64_t[]){3, 2, 3, 3}, -1, 1)};
    ps_op_attrs a = ps_op_attrs_default(PS_OP_CONV2D_GRAD_FILTER);
    a.stride[0] = a.stride[1] = 2;
    a.pad[0] = a.pad[1] = 1;
    a.shape_rank = 4;
    memcpy(a.shape, (int64_t[]){2, 4, 3, 3}, 4 * sizeof(int64_t));
    add_into_case("conv2d_grad_filter", PS_OP_CONV2D_GRAD_FILTER, &a, 2, gf, false);
    tt_free(gf, 2);

    tt eg[2] = {tt_rand(PS_DTYPE_I32, 2, (int64_t[]){3, 5}, 0, 9),
                tt_rand(PS_DTYPE_F32, 3, (int64_t[]){3, 5, 4}, -1, 1)};
    a = ps_op_attrs_default(PS_OP_EMBEDDING_GRAD);
    a.shape_rank = 2;
    a.shape[0] = 9;
    a.shape[1] = 4;
    add_into_case("embedding_grad", PS_OP_EMBEDDING_GRAD, &a, 2, eg, false);
    tt_free(eg, 2);

    tt ad[2] = {tt_rand(PS_DTYPE_F32, 2, (int64_t[]){5, 7}, -1, 1),
                tt_rand(PS_DTYPE_F32, 2, (int64_t[]){5, 7}, -1, 1)};
    add_into_case("add", PS_OP_ADD, NULL, 2, ad, true);
    tt_free(ad, 2);

    tt x = tt_rand(PS_DTYPE_F32, 3, (int64_t[]){4, 6, 3}, -1, 1);
    for (int mean = 0; mean < 2; mean++) {
        a = ps_op_attrs_default(PS_OP_REDUCE);
        a.reduce = mean ? PS_REDUCE_MEAN : PS_REDUCE_SUM;
        a.axes = 1u << 0 | 1u << 1;
        add_into_case(mean ? "reduce mean" : "reduce sum", PS_OP_REDUCE, &a, 1, &x, true);
    }
    tt_free(&x, 1);

    /* an output the op cannot add into is refused, naming the op */
    float buf[3][12] = {{0}};
    ps_tensor_desc d34 = {PS_DTYPE_F32, 2, {3, 4}}, d4 = {PS_DTYPE_F32, 1, {4}};
    ps_tile lin[3] = {ps_tile_whole(buf[0], &d34), ps_tile_whole(buf[1], &d4),
                      ps_tile_whole(buf[2], &d34)};
    float o0[12], o1[4], o2[4];
    ps_tile lout[3] = {ps_tile_whole(o0, &d34), ps_tile_whole(o1, &d4), ps_tile_whole(o2, &d4)};
    ps_op ln = mkop(PS_OP_LAYERNORM_GRAD, NULL, 3);
    ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}, .accumulate = 1u << 1};
    ps_error err = {0};
    assert_false(ps_cpu_op_accumulates(PS_OP_LAYERNORM_GRAD, 1));
    assert_int_equal(ps_cpu_op_run(&ln, lin, lout, &ctx, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "cannot add into"));
    assert_non_null(strstr(err.msg, "layernorm_grad"));
    ps_error_clear(&err);
    ps_op add = mkop(PS_OP_ADD, NULL, 2);
    ctx.accumulate = 1u << 1; /* ADD has one output */
    assert_int_equal(ps_cpu_op_run(&add, lin, lout, &ctx, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "cannot add into"));
}

static void malformed_calls(void **state)
{
    (void)state;
    float a[6] = {0}, b[6] = {0}, c[6] = {0};
    int32_t ids[2] = {0, 9};
    ps_tensor_desc d23 = {PS_DTYPE_F32, 2, {2, 3}}, d32 = {PS_DTYPE_F32, 2, {3, 2}};
    ps_tensor_desc di = {PS_DTYPE_I32, 1, {2}}, d3 = {PS_DTYPE_F32, 1, {3}};
    ps_tile t23 = ps_tile_whole(a, &d23), u23 = ps_tile_whole(b, &d23);
    ps_tile o23 = ps_tile_whole(c, &d23), t32 = ps_tile_whole(b, &d32);
    ps_error err = {0};

    /* wrong operand counts */
    ps_op op = mkop(PS_OP_MATMUL, NULL, 1);
    snprintf(op.attrs.einsum, sizeof op.attrs.einsum, "ab,bc->ac");
    assert_int_equal(ps_cpu_op_run(&op, &t23, &o23, NULL, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "matmul"));
    ps_error_clear(&err);
    op = mkop(PS_OP_ADD, NULL, 2);
    op.n_out = 2;
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){t23, u23}, &o23, NULL, &err),
                     PS_ERR_INVALID);
    ps_error_clear(&err);
    op = mkop(PS_OP_ADAM, NULL, 3);
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){t23, u23, o23}, NULL, NULL, &err),
                     PS_ERR_INVALID);
    ps_error_clear(&err);

    /* unknown kinds */
    op = mkop(PS_OP_ADD, NULL, 2);
    op.kind = PS_OP_KIND_COUNT;
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){t23, u23}, &o23, NULL, &err),
                     PS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "op kind"));
    ps_error_clear(&err);
    op.kind = (ps_op_kind)-3;
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){t23, u23}, &o23, NULL, &err),
                     PS_ERR_UNSUPPORTED);
    ps_error_clear(&err);
    assert_int_equal(ps_cpu_op_run(NULL, NULL, NULL, NULL, &err), PS_ERR_INVALID);
    ps_error_clear(&err);

    /* shapes, element types, missing data, boxes, einsums */
    op = mkop(PS_OP_ADD, NULL, 2);
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){t23, t32}, &o23, NULL, &err),
                     PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "shape mismatch"));
    ps_error_clear(&err);
    ps_tile ti = ps_tile_whole(ids, &di);
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){t23, ti}, &o23, NULL, &err),
                     PS_ERR_INVALID);
    ps_error_clear(&err);
    ps_tile nodata = t23;
    nodata.data = NULL;
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){t23, nodata}, &o23, NULL, &err),
                     PS_ERR_INVALID);
    ps_error_clear(&err);
    ps_tile outside = t23;
    outside.offset[0] = 1;
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){t23, outside}, &o23, NULL, &err),
                     PS_ERR_INVALID);
    ps_error_clear(&err);
    op = mkop(PS_OP_MATMUL, NULL, 2);
    snprintf(op.attrs.einsum, sizeof op.attrs.einsum, "ab,bc->ac");
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){t23, t23}, &o23, NULL, &err),
                     PS_ERR_INVALID);
    ps_error_clear(&err);
    snprintf(op.attrs.einsum, sizeof op.attrs.einsum, "ab,b->");
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){t23, t32}, &o23, NULL, &err),
                     PS_ERR_INVALID);
    ps_error_clear(&err);

    /* data errors: an id outside the vocabulary */
    float table[6] = {0}, emb[6];
    ps_tensor_desc dt = {PS_DTYPE_F32, 2, {2, 3}}, de = {PS_DTYPE_F32, 2, {2, 3}};
    op = mkop(PS_OP_EMBEDDING, NULL, 2);
    ps_tile te = ps_tile_whole(emb, &de);
    assert_int_equal(
        ps_cpu_op_run(&op, (ps_tile[]){ps_tile_whole(table, &dt), ti}, &te, NULL, &err),
        PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "outside the vocabulary"));
    ps_error_clear(&err);

    /* a split vocabulary without a reduce group, a group without a function */
    ids[1] = 1;
    ps_tile logits = ps_tile_whole(a, &d23), lab = ps_tile_whole(ids, &di), loss;
    ps_tensor_desc d0 = {PS_DTYPE_F32, 0, {0}};
    loss = ps_tile_whole(c, &d0);
    logits.global[1] = 6;
    op = mkop(PS_OP_SOFTMAX_XENT, NULL, 2);
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){logits, lab}, &loss, NULL, &err),
                     PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "vocabulary is split"));
    ps_error_clear(&err);
    ps_op_context ctx = {.step = 1, .reduce = {.group_size = 2, .fn = NULL}};
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){logits, lab}, &loss, &ctx, &err),
                     PS_ERR_INVALID);
    ps_error_clear(&err);
    logits.global[1] = 3; /* a group over a whole vocabulary */
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){logits, lab}, &loss, &ctx, &err),
                     PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "vocabulary is whole"));
    ps_error_clear(&err);
    /* batch statistics over a split batch without a group, and the reverse */
    ps_tile xb = t23, gb = ps_tile_whole(b, &d3), bb = ps_tile_whole(c, &d3), yb = o23;
    xb.global[0] = 4;
    op = mkop(PS_OP_BATCHNORM, NULL, 3);
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){xb, gb, bb}, &yb, NULL, &err),
                     PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "reduce group"));
    ps_error_clear(&err);
    assert_int_equal(ps_cpu_op_run(&op, (ps_tile[]){t23, gb, bb}, &yb, &ctx, &err),
                     PS_ERR_INVALID);
    ps_error_clear(&err);

    /* Adam before step 1 */
    ps_tile p3 = ps_tile_whole(a, &d3), g3 = ps_tile_whole(b, &d3), m3 = ps_tile_whole(c, &d3);
    float v[3] = {0};
    op = mkop(PS_OP_ADAM, NULL, 4);
    ctx.step = 0;
    ctx.reduce.group_size = 1;
    assert_int_equal(
        ps_cpu_op_run(&op, (ps_tile[]){p3, g3, m3, ps_tile_whole(v, &d3)}, NULL, &ctx, &err),
        PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "step"));
    ps_error_clear(&err);
    assert_int_equal(
        ps_cpu_op_run(&op, (ps_tile[]){p3, g3, m3, ps_tile_whole(v, &d3)}, NULL, NULL, &err),
        PS_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(added_into_outputs),
        cmocka_unit_test(grad_matmul),
        cmocka_unit_test(grad_dense_and_activations),
        cmocka_unit_test(grad_add_and_fanout),
        cmocka_unit_test(grad_layernorm),
        cmocka_unit_test(grad_softmax),
        cmocka_unit_test(grad_embedding_and_xent),
        cmocka_unit_test(grad_layout_ops),
        cmocka_unit_test(grad_reduce_broadcast),
        cmocka_unit_test(grad_conv_net),
        cmocka_unit_test(grad_batchnorm_rank2),
        cmocka_unit_test(grad_moe),
        cmocka_unit_test(grad_zoo_mlp),
        cmocka_unit_test(grad_zoo_gpt),
        cmocka_unit_test(grad_zoo_moe),
        cmocka_unit_test(tiles_matmul),
        cmocka_unit_test(tiles_embedding),
        cmocka_unit_test(tiles_softmax),
        cmocka_unit_test(tiles_reduce_broadcast),
        cmocka_unit_test(tiles_losses),
        cmocka_unit_test(tiles_norms),
        cmocka_unit_test(tiles_conv_pool),
        cmocka_unit_test(tiles_moe),
        cmocka_unit_test(closed_adam),
        cmocka_unit_test(closed_adam_loss_scale),
        cmocka_unit_test(closed_softmax_layernorm),
        cmocka_unit_test(closed_losses_and_reductions),
        cmocka_unit_test(maxpool_brute_force),
        cmocka_unit_test(closed_gelu),
        cmocka_unit_test(closed_exp_inplace),
        cmocka_unit_test(closed_moe_gate),
        cmocka_unit_test(malformed_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
