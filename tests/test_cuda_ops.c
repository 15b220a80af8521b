/* exec/cuda: every implemented op on random tiles (split tiles with offsets
 * included) against the CPU reference ps_cpu_op_run (normalized mean
 * squared error <= 1e-6 in fp32, no TF32); the backend's copy_box,
 * collectives, reductions and send/recv with four virtual devices sharing
 * GPU 0 (one thread each) against the box semantics computed on the host;
 * exact memory accounting; errors that name the device (an absurd
 * allocation, an injected collective failure that every device thread
 * reports without hanging); timing and the GEMM profiler; fp16/bf16 tiles
 * held in 2 bytes against the CPU backend's half path.
 *
 * Needs a GPU: exits 77 (skipped) when ps_cuda_device_count() is 0. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "exec/cuda/cuda_backend.h"
#include "exec/cuda/cuda_ops.h"
#include "exec/half.h"
#include "tests/test_layouts.h"
#include "tests/test_util.h"
#ifdef PS_HAVE_CPU_OPS
#include "exec/cpu/cpu_backend.h"
#include "exec/cpu/cpu_ops.h"
#endif

#define NMSE_TOL 1e-6

/* ---- host tiles ------------------------------------------------------------ */

/* A host tile of `rank` dims: local shape, whole tensor (NULL: the same) and
 * offset (NULL: 0); zero-filled. */
static ps_tile htile(bool is_int, int rank, const int64_t *shape, const int64_t *global,
                     const int64_t *offset)
{
    ps_tile t;
    memset(&t, 0, sizeof t);
    t.is_int = is_int;
    t.rank = rank;
    for (int d = 0; d < rank; d++) {
        t.shape[d] = shape[d];
        t.global[d] = global ? global[d] : shape[d];
        t.offset[d] = offset ? offset[d] : 0;
    }
    t.data = calloc((size_t)ps_tile_numel(&t) + 1, 4);
    assert_non_null(t.data);
    return t;
}

static ps_tile hrand(int rank, const int64_t *shape, const int64_t *global,
                     const int64_t *offset)
{
    ps_tile t = htile(false, rank, shape, global, offset);
    float *p = t.data;
    for (int64_t i = 0; i < ps_tile_numel(&t); i++)
        p[i] = (float)(2.0 * uniform() - 1.0);
    return t;
}

static ps_tile hints(int rank, const int64_t *shape, int below_n)
{
    ps_tile t = htile(true, rank, shape, NULL, NULL);
    int32_t *p = t.data;
    for (int64_t i = 0; i < ps_tile_numel(&t); i++)
        p[i] = below(below_n);
    return t;
}

static ps_tile hcopy(const ps_tile *t)
{
    ps_tile c = *t;
    size_t bytes = (size_t)ps_tile_numel(t) * 4;
    c.data = malloc(bytes + 4);
    assert_non_null(c.data);
    memcpy(c.data, t->data, bytes);
    return c;
}

/* sum (a - b)^2 / sum b^2 (b the reference); 0 when both are zero. */
static double nmse(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (num == 0)
        return 0;
    return den > 0 ? num / den : INFINITY;
}

/* A host tile's bytes (4 per element, 2 for fp16/bf16). */
static size_t tile_bytes(const ps_tile *t)
{
    return (size_t)ps_tile_numel(t) * (size_t)ps_tile_elem_bytes(t);
}

/* A copy of the float host tile f, in type t (rounded) when `half`. */
static ps_tile host_as(const ps_tile *f, bool half, ps_dtype t)
{
    ps_tile h = hcopy(f);
    if (half && !f->is_int) {
        h.dtype = t;
        ps_half_narrow(t, f->data, h.data, ps_tile_numel(f));
    }
    return h;
}

/* The float values of a host tile (widened when half), as a new array. */
static float *host_floats(const ps_tile *h)
{
    int64_t n = ps_tile_numel(h);
    float *f = malloc((size_t)(n + 1) * sizeof *f);
    assert_non_null(f);
    if (ps_tile_is_half(h))
        ps_half_widen(h->dtype, h->data, f, n);
    else
        memcpy(f, h->data, (size_t)n * sizeof *f);
    return f;
}

static ps_tile dupload_any(ps_backend *b, const ps_tile *h)
{
    ps_error err = {0};
    ps_tile d = *h;
    assert_int_equal(b->ops->alloc(b, 0, (int64_t)tile_bytes(h), &d.data, &err), PS_OK);
    assert_int_equal(b->ops->upload(b, 0, d.data, h->data, (int64_t)tile_bytes(h), &err), PS_OK);
    return d;
}

/* ---- device tiles ----------------------------------------------------------- */

static ps_tile dupload(ps_backend *b, int dev, const ps_tile *h)
{
    ps_error err = {0};
    ps_tile d = *h;
    int64_t bytes = ps_tile_numel(h) * 4;
    assert_int_equal(b->ops->alloc(b, dev, bytes, &d.data, &err), PS_OK);
    assert_int_equal(b->ops->upload(b, dev, d.data, h->data, bytes, &err), PS_OK);
    return d;
}

static void ddownload(ps_backend *b, int dev, const ps_tile *d, ps_tile *h)
{
    ps_error err = {0};
    assert_int_equal(b->ops->download(b, dev, h->data, d->data, ps_tile_numel(d) * 4, &err),
                     PS_OK);
}

static ps_backend *backend(int n, bool share)
{
    ps_error err = {0};
    ps_backend *b = NULL;
    ps_cuda_backend_options o = ps_cuda_backend_options_default();
    o.share_gpu = share;
    ps_status st = ps_cuda_backend_create(n, 8, &o, &b, &err);
    if (st != PS_OK)
        fail_msg("ps_cuda_backend_create: %s", err.msg);
    return b;
}

static ps_op mkop(ps_op_kind kind, int n_in)
{
    ps_op op;
    memset(&op, 0, sizeof op);
    op.name = (char *)ps_op_kind_get(kind)->name;
    op.kind = kind;
    op.n_in = n_in;
    op.n_out = ps_op_kind_get(kind)->n_out;
    op.forward_op = -1;
    op.attrs = ps_op_attrs_default(kind);
    return op;
}

static void einsum_sizes_for_test(int64_t *size)
{
    for (int l = 0; l < 26; l++)
        size[l] = 2 + l % 4;
    size['b' - 'a'] = 3;
    size['k' - 'a'] = 5;
    size['n' - 'a'] = 4;
}

/* ---- ops against the CPU reference --------------------------------------------- */

#ifdef PS_HAVE_CPU_OPS
/* The kinds whose outputs the CPU reference writes whole (zeroing first
 * where it accumulates): the GPU must too, so their device outputs start
 * out poisoned. */
static bool writes_whole_output(ps_op_kind k)
{
    switch (k) {
    case PS_OP_CONV2D:
    case PS_OP_CONV2D_GRAD_INPUT:
    case PS_OP_CONV2D_GRAD_FILTER:
    case PS_OP_POOL:
    case PS_OP_POOL_GRAD:
    case PS_OP_BATCHNORM:
    case PS_OP_BATCHNORM_GRAD:
    case PS_OP_MOE_GATE:
    case PS_OP_MOE_GATE_GRAD:
    case PS_OP_MOE_DISPATCH:
    case PS_OP_MOE_DISPATCH_GRAD:
    case PS_OP_MOE_COMBINE:
    case PS_OP_MOE_COMBINE_GRAD: return true;
    default: return false;
    }
}

/* Runs op on the CPU and on the GPU (device 0 of b) and compares every
 * output and, for adam, the updated inputs. out[] gives the output tiles'
 * geometry (their data is ignored). Frees in[] and out[]. */
/* accumulate: ps_op_context.accumulate, the outputs' content added into
 * (then neither side's output is poisoned: both start from `out`). */
static void check_op_adding(ps_backend *b, const ps_op *op, ps_tile *in, ps_tile *out,
                            unsigned accumulate)
{
    ps_error err = {0};
    ps_op_context ctx = {.step = 3, .reduce = {.group_size = 1}, .accumulate = accumulate};
    ps_tile cin[PS_MAX_OP_IO], cout[PS_MAX_OP_IO], din[PS_MAX_OP_IO], dout[PS_MAX_OP_IO];
    ps_tile gin[PS_MAX_OP_IO], gout[PS_MAX_OP_IO];
    for (int i = 0; i < op->n_in; i++) {
        cin[i] = hcopy(&in[i]);
        gin[i] = hcopy(&in[i]);
        din[i] = dupload(b, 0, &in[i]);
    }
    for (int i = 0; i < op->n_out; i++) {
        cout[i] = hcopy(&out[i]);
        gout[i] = hcopy(&out[i]);
        if (writes_whole_output(op->kind) && accumulate == 0) {
            /* an element the GPU leaves unwritten shows as NaN (or a huge id) */
            ps_tile poisoned = hcopy(&out[i]);
            memset(poisoned.data, out[i].is_int ? 0x7E : 0xFF, (size_t)ps_tile_numel(&out[i]) * 4);
            dout[i] = dupload(b, 0, &poisoned);
            free(poisoned.data);
        } else {
            dout[i] = dupload(b, 0, &out[i]);
        }
    }
    ps_status st = ps_cpu_op_run(op, cin, cout, &ctx, &err);
    if (st != PS_OK)
        fail_msg("%s (%s): CPU reference failed: %s", op->name, op->attrs.einsum, err.msg);
    st = b->ops->op(b, 0, op, din, dout, &ctx, &err);
    if (st != PS_OK)
        fail_msg("%s (%s): %s", op->name, op->attrs.einsum, err.msg);
    if (b->ops->finish(b, 0, &err) != PS_OK) /* its deferred data checks pass */
        fail_msg("%s (%s): %s", op->name, op->attrs.einsum, err.msg);
    for (int i = 0; i < op->n_out; i++) {
        ddownload(b, 0, &dout[i], &gout[i]);
        int64_t n = ps_tile_numel(&out[i]);
        if (out[i].is_int) {
            assert_memory_equal(gout[i].data, cout[i].data, (size_t)n * 4);
        } else {
            double e = nmse(gout[i].data, cout[i].data, n);
            if (!(e <= NMSE_TOL))
                fail_msg("%s (%s): output %d differs from the CPU, nmse %g", op->name,
                         op->attrs.einsum, i, e);
        }
    }
    if (op->kind == PS_OP_ADAM)
        for (int i = 0; i < op->n_in; i++) {
            ddownload(b, 0, &din[i], &gin[i]);
            double e = nmse(gin[i].data, cin[i].data, ps_tile_numel(&in[i]));
            if (!(e <= NMSE_TOL))
                fail_msg("adam: input %d differs from the CPU after the update, nmse %g", i, e);
        }
    for (int i = 0; i < op->n_in; i++) {
        b->ops->release(b, 0, din[i].data);
        free(cin[i].data);
        free(gin[i].data);
        free(in[i].data);
    }
    for (int i = 0; i < op->n_out; i++) {
        b->ops->release(b, 0, dout[i].data);
        free(cout[i].data);
        free(gout[i].data);
        free(out[i].data);
    }
}

static void check_op(ps_backend *b, const ps_op *op, ps_tile *in, ps_tile *out)
{
    check_op_adding(b, op, in, out, 0);
}

#define SH(...) ((const int64_t[]){__VA_ARGS__})

/* An einsum on random operands; sizes per label a..z; add: into a random
 * output (an accumulated gradient: cuBLAS's beta 1, or the permuted product
 * added). */
static void check_einsum_adding(ps_backend *b, const char *spec, const int64_t *size, bool add)
{
    ps_einsum e;
    assert_int_equal(ps_einsum_parse(spec, &e, NULL), PS_OK);
    ps_tile t[3];
    for (int o = 0; o < 3; o++) {
        int64_t shape[PS_MAX_RANK], global[PS_MAX_RANK], offset[PS_MAX_RANK];
        for (int i = 0; i < e.rank[o]; i++) {
            shape[i] = size[e.labels[o][i] - 'a'];
            /* a tile of a larger tensor: matmul works on local extents */
            global[i] = shape[i] * 2;
            offset[i] = shape[i];
        }
        t[o] = o < 2 || add ? hrand(e.rank[o], shape, global, offset)
                            : htile(false, e.rank[o], shape, global, offset);
    }
    ps_op op = mkop(PS_OP_MATMUL, 2);
    snprintf(op.attrs.einsum, sizeof op.attrs.einsum, "%s", spec);
    check_op_adding(b, &op, t, &t[2], add ? 1u : 0u);
}

static void check_einsum(ps_backend *b, const char *spec, const int64_t *size)
{
    check_einsum_adding(b, spec, size, false);
}

static void ops_matmul(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    int64_t size[26];
    einsum_sizes_for_test(size);
    size['k' - 'a'] = 33; /* several warps; odd sizes */
    size['n' - 'a'] = 17;
    size['h' - 'a'] = 24;
    size['v' - 'a'] = 50;
    for (size_t i = 0; i < TEST_EINSUM_SPECS; i++) {
        check_einsum(b, test_einsum_specs[i], size);
        check_einsum_adding(b, test_einsum_specs[i], size, true);
    }
    /* attention at extents where the GEMMs read the heads where they lie
     * and loop over the batch (tests/test_gemm_plan.c), also adding */
    static const char *const attention[] = {"bqad,bkad->baqk", "baqk,bkad->bqad", "baqk,bqad->bkad",
                                            "bqad,baqk->bkad"};
    einsum_sizes_for_test(size);
    size['b' - 'a'] = 2;
    size['a' - 'a'] = 16;
    size['d' - 'a'] = 64;
    size['q' - 'a'] = size['k' - 'a'] = 512;
    for (size_t i = 0; i < sizeof attention / sizeof *attention; i++) {
        check_einsum(b, attention[i], size);
        check_einsum_adding(b, attention[i], size, true);
    }
    /* the backend adds into a MATMUL's fp32 output only, and says so */
    ps_op mm = mkop(PS_OP_MATMUL, 2), add = mkop(PS_OP_ADD, 2);
    ps_tile f = htile(false, 1, SH(4), SH(4), SH(0)), i32 = htile(true, 1, SH(4), SH(4), SH(0));
    assert_true(b->ops->op_accumulates != NULL);
    assert_true(b->ops->op_accumulates(b, &mm, 0, &f));
    assert_false(b->ops->op_accumulates(b, &mm, 0, &i32));
    assert_false(b->ops->op_accumulates(b, &mm, 1, &f));
    assert_false(b->ops->op_accumulates(b, &add, 0, &f));
    free(f.data);
    free(i32.data);
    b->ops->destroy(b);
}

static void ops_elementwise(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    const int64_t *shape = SH(5, 7, 33), *global = SH(10, 7, 66), *offset = SH(5, 0, 33);
    ps_op_kind unary[] = {PS_OP_RELU, PS_OP_GELU};
    for (int k = 0; k < 2; k++) {
        ps_op op = mkop(unary[k], 1);
        ps_tile in[1] = {hrand(3, shape, global, offset)};
        ps_tile out[1] = {htile(false, 3, shape, global, offset)};
        check_op(b, &op, in, out);
    }
    ps_op_kind binary[] = {PS_OP_ADD, PS_OP_RELU_GRAD, PS_OP_GELU_GRAD, PS_OP_MSE_LOSS_GRAD};
    for (int k = 0; k < 4; k++) {
        ps_op op = mkop(binary[k], 2);
        op.attrs.scale = 3; /* the loss scale of mse_loss_grad; the others ignore it */
        ps_tile in[2] = {hrand(3, shape, global, offset), hrand(3, shape, global, offset)};
        ps_tile out[1] = {htile(false, 3, shape, global, offset)};
        check_op(b, &op, in, out);
    }
    {
        ps_op op = mkop(PS_OP_MSE_LOSS, 2);
        ps_tile in[2] = {hrand(3, shape, global, offset), hrand(3, shape, global, offset)};
        ps_tile out[1] = {htile(false, 0, NULL, NULL, NULL)};
        check_op(b, &op, in, out);
    }
    {
        ps_op op = mkop(PS_OP_BIAS_ADD, 2);
        ps_tile in[2] = {hrand(3, shape, global, offset), hrand(1, SH(33), SH(66), SH(33))};
        ps_tile out[1] = {htile(false, 3, shape, global, offset)};
        check_op(b, &op, in, out);
    }
    b->ops->destroy(b);
}

static void ops_norm_softmax(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    /* rows split: a tile of rows 6..11 of 24; the normalized dim is whole */
    const int64_t *shape = SH(6, 300), *global = SH(24, 300), *offset = SH(6, 0);
    {
        ps_op op = mkop(PS_OP_LAYERNORM, 3);
        ps_tile in[3] = {hrand(2, shape, global, offset), hrand(1, SH(300), NULL, NULL),
                         hrand(1, SH(300), NULL, NULL)};
        ps_tile out[1] = {htile(false, 2, shape, global, offset)};
        check_op(b, &op, in, out);
    }
    {
        ps_op op = mkop(PS_OP_LAYERNORM_GRAD, 3);
        ps_tile in[3] = {hrand(2, shape, global, offset), hrand(1, SH(300), NULL, NULL),
                         hrand(2, shape, global, offset)};
        ps_tile out[3] = {htile(false, 2, shape, global, offset),
                          htile(false, 1, SH(300), NULL, NULL),
                          htile(false, 1, SH(300), NULL, NULL)};
        check_op(b, &op, in, out);
    }
    /* the gradient over 130 whole rows: row chunks holding several rows, a
     * short last one */
    {
        ps_op op = mkop(PS_OP_LAYERNORM_GRAD, 3);
        ps_tile in[3] = {hrand(2, SH(130, 300), NULL, NULL), hrand(1, SH(300), NULL, NULL),
                         hrand(2, SH(130, 300), NULL, NULL)};
        ps_tile out[3] = {htile(false, 2, SH(130, 300), NULL, NULL),
                          htile(false, 1, SH(300), NULL, NULL),
                          htile(false, 1, SH(300), NULL, NULL)};
        check_op(b, &op, in, out);
    }
    /* attention scores [b, a, q, k]: whole, and queries 8..15 of 16 */
    for (int causal = 0; causal < 2; causal++)
        for (int split = 0; split < 2; split++) {
            const int64_t *s4 = split ? SH(2, 3, 8, 16) : SH(2, 3, 16, 16);
            const int64_t *g4 = SH(2, 3, 16, 16), *o4 = split ? SH(0, 0, 8, 0) : SH(0, 0, 0, 0);
            ps_op op = mkop(PS_OP_SOFTMAX, 1);
            op.attrs.scale = 0.37;
            op.attrs.causal = causal;
            ps_tile in[1] = {hrand(4, s4, g4, o4)};
            ps_tile out[1] = {htile(false, 4, s4, g4, o4)};
            check_op(b, &op, in, out);
            ps_op gop = mkop(PS_OP_SOFTMAX_GRAD, 2);
            gop.attrs.scale = 0.37;
            gop.attrs.causal = causal;
            ps_tile gin[2] = {hrand(4, s4, g4, o4), hrand(4, s4, g4, o4)};
            ps_tile gout[1] = {htile(false, 4, s4, g4, o4)};
            check_op(b, &gop, gin, gout);
        }
    /* a long row (several passes of the block) */
    {
        ps_op op = mkop(PS_OP_SOFTMAX, 1);
        ps_tile in[1] = {hrand(2, SH(3, 5000), NULL, NULL)};
        ps_tile out[1] = {htile(false, 2, SH(3, 5000), NULL, NULL)};
        check_op(b, &op, in, out);
    }
    b->ops->destroy(b);
}

static void ops_embedding(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    /* table rows 10..24 of 40, columns 8..23 of 32; ids over the whole
     * vocabulary (the others give zeros) */
    const int64_t *ts = SH(15, 16), *tg = SH(40, 32), *to = SH(10, 8);
    for (int whole = 0; whole < 2; whole++) {
        const int64_t *s = whole ? tg : ts, *o = whole ? SH(0, 0) : to;
        {
            ps_op op = mkop(PS_OP_EMBEDDING, 2);
            ps_tile in[2] = {hrand(2, s, tg, o), hints(2, SH(4, 9), 40)};
            ps_tile out[1] = {htile(false, 3, SH(4, 9, s[1]), SH(4, 9, 32), SH(0, 0, o[1]))};
            check_op(b, &op, in, out);
        }
        {
            ps_op op = mkop(PS_OP_EMBEDDING_GRAD, 2);
            op.attrs.shape_rank = 2;
            op.attrs.shape[0] = 40;
            op.attrs.shape[1] = 32;
            ps_tile in[2] = {hints(2, SH(4, 9), 40),
                             hrand(3, SH(4, 9, s[1]), SH(4, 9, 32), SH(0, 0, o[1]))};
            ps_tile out[1] = {htile(false, 2, s, tg, o)};
            check_op(b, &op, in, out);
        }
    }
    b->ops->destroy(b);
}

static void ops_layout(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    {
        ps_op op = mkop(PS_OP_RESHAPE, 1);
        op.attrs.shape_rank = 2;
        op.attrs.shape[0] = 12;
        op.attrs.shape[1] = 35;
        ps_tile in[1] = {hrand(3, SH(4, 3, 35), NULL, NULL)};
        ps_tile out[1] = {htile(false, 2, SH(12, 35), NULL, NULL)};
        check_op(b, &op, in, out);
    }
    {
        ps_op op = mkop(PS_OP_TRANSPOSE, 1);
        op.attrs.perm[0] = 2;
        op.attrs.perm[1] = 0;
        op.attrs.perm[2] = 3;
        op.attrs.perm[3] = 1;
        ps_tile in[1] = {hrand(4, SH(4, 3, 5, 6), NULL, NULL)};
        ps_tile out[1] = {htile(false, 4, SH(5, 4, 6, 3), NULL, NULL)};
        check_op(b, &op, in, out);
    }
    /* the permute plan's forms (exec/permute_plan.h): the innermost dim kept
     * (16-byte units; 4-byte ones for an odd row), neighbours merged */
    {
        static const struct {
            int rank, perm[4];
            int64_t in[4], out[4];
        } tc[] = {
            {4, {0, 2, 1, 3}, {2, 6, 4, 16}, {2, 4, 6, 16}},
            {4, {0, 2, 1, 3}, {2, 3, 5, 3}, {2, 5, 3, 3}},
            {3, {1, 2, 0}, {3, 5, 7}, {5, 7, 3}},
            {4, {1, 0, 2, 3}, {1, 7, 2, 8}, {7, 1, 2, 8}},
        };
        for (size_t i = 0; i < sizeof tc / sizeof tc[0]; i++) {
            ps_op op = mkop(PS_OP_TRANSPOSE, 1);
            for (int d = 0; d < tc[i].rank; d++)
                op.attrs.perm[d] = tc[i].perm[d];
            ps_tile in[1] = {hrand(tc[i].rank, tc[i].in, NULL, NULL)};
            ps_tile out[1] = {htile(false, tc[i].rank, tc[i].out, NULL, NULL)};
            check_op(b, &op, in, out);
        }
    }
    /* reductions: split inputs (mean divides by the global count), few and
     * many outputs, leading, trailing and middle axes */
    struct {
        int rank;
        int64_t shape[4], global[4], offset[4];
        uint32_t axes;
    } rc[] = {
        {3, {4, 5, 6}, {8, 5, 6}, {4, 0, 0}, 0x3},
        {3, {4, 5, 6}, {4, 10, 6}, {0, 5, 0}, 0x2},
        {3, {40, 30, 9}, {80, 30, 9}, {0, 0, 0}, 0x4},
        {2, {3000, 5}, {3000, 5}, {0, 0}, 0x1},
        {2, {5, 9000}, {5, 9000}, {0, 0}, 0x1},
        {4, {3, 4, 5, 6}, {3, 8, 5, 6}, {0, 4, 0, 0}, 0xa},
    };
    for (size_t i = 0; i < sizeof rc / sizeof rc[0]; i++)
        for (int mean = 0; mean < 2; mean++) {
            int64_t rs[4], rg[4], ro[4];
            int rr = 0;
            for (int d = 0; d < rc[i].rank; d++)
                if (!(rc[i].axes & (1u << d))) {
                    rs[rr] = rc[i].shape[d];
                    rg[rr] = rc[i].global[d];
                    ro[rr++] = rc[i].offset[d];
                }
            ps_op op = mkop(PS_OP_REDUCE, 1);
            op.attrs.axes = rc[i].axes;
            op.attrs.reduce = mean ? PS_REDUCE_MEAN : PS_REDUCE_SUM;
            ps_tile in[1] = {hrand(rc[i].rank, rc[i].shape, rc[i].global, rc[i].offset)};
            ps_tile out[1] = {htile(false, rr, rs, rg, ro)};
            check_op(b, &op, in, out);
            ps_op bop = mkop(PS_OP_BROADCAST, 1);
            bop.attrs.axes = rc[i].axes;
            bop.attrs.reduce = op.attrs.reduce;
            bop.attrs.shape_rank = rc[i].rank;
            for (int d = 0; d < rc[i].rank; d++)
                bop.attrs.shape[d] = rc[i].global[d];
            ps_tile bin[1] = {hrand(rr, rs, rg, ro)};
            ps_tile bout[1] = {htile(false, rc[i].rank, rc[i].shape, rc[i].global,
                                     rc[i].offset)};
            check_op(b, &bop, bin, bout);
        }
    b->ops->destroy(b);
}

static void ops_losses_adam(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    /* tokens 4..7 of 8 (an addend of the loss), vocabulary whole */
    for (int grad = 0; grad < 2; grad++) {
        ps_op op = mkop(grad ? PS_OP_SOFTMAX_XENT_GRAD : PS_OP_SOFTMAX_XENT, 2);
        op.attrs.scale = grad ? 512 : 1; /* a loss scale seeds the gradient */
        ps_tile in[2] = {hrand(3, SH(4, 6, 300), SH(8, 6, 300), SH(4, 0, 0)),
                         hints(2, SH(4, 6), 300)};
        in[1].global[0] = 8;
        in[1].offset[0] = 4;
        ps_tile out[1] = {grad ? htile(false, 3, SH(4, 6, 300), SH(8, 6, 300), SH(4, 0, 0))
                               : htile(false, 0, NULL, NULL, NULL)};
        check_op(b, &op, in, out);
    }
    for (int master = 0; master < 2; master++) {
        ps_op op = mkop(PS_OP_ADAM, master ? 5 : 4);
        op.attrs.weight_decay = 0.01;
        op.attrs.scale = master ? 1 : 0x1p10; /* the gradient divided by the loss scale */
        ps_tile in[5];
        for (int i = 0; i < op.n_in; i++)
            in[i] = hrand(2, SH(33, 17), NULL, NULL);
        float *v = in[3].data;
        for (int64_t i = 0; i < 33 * 17; i++)
            v[i] = fabsf(v[i]); /* a second moment */
        check_op(b, &op, in, NULL);
    }
    /* a non-finite gradient leaves its update's state as it was, and the
     * device's next finish fails naming the op, the value and the step */
    {
        ps_op op = mkop(PS_OP_ADAM, 4);
        op.attrs.scale = 1024;
        ps_tile in[4], din[4], back[4];
        for (int i = 0; i < 4; i++) {
            in[i] = hrand(2, SH(5, 7), NULL, NULL);
            if (i == 3)
                for (int64_t e = 0; e < 35; e++)
                    ((float *)in[i].data)[e] = fabsf(((float *)in[i].data)[e]);
        }
        ((float *)in[1].data)[9] = INFINITY;
        for (int i = 0; i < 4; i++)
            din[i] = dupload(b, 0, &in[i]);
        ps_op_context ctx = {.step = 2, .reduce = {.group_size = 1}};
        ps_error err = {0};
        assert_int_equal(b->ops->op(b, 0, &op, din, NULL, &ctx, &err), PS_OK);
        assert_int_equal(b->ops->finish(b, 0, &err), PS_ERR_INVALID);
        if (strstr(err.msg, "device 0: op \"adam\" (adam): the gradient holds inf at element 9 "
                            "of this tile at step 2: the loss scale 1024 overflowed it") == NULL)
            fail_msg("%s", err.msg);
        for (int i = 0; i < 4; i++) {
            back[i] = hcopy(&in[i]);
            ddownload(b, 0, &din[i], &back[i]);
            assert_memory_equal(back[i].data, in[i].data, 35 * sizeof(float));
            b->ops->release(b, 0, din[i].data);
            free(back[i].data);
            free(in[i].data);
        }
        /* answered once: the next finish is clean */
        assert_int_equal(b->ops->finish(b, 0, &err), PS_OK);
    }
    b->ops->destroy(b);
}

/* Issues one update of a 3 x 4 parameter named `name`: parameter, gradient
 * and moments random (element `bad_at` of the gradient set to g_value and
 * element `inf_at` to inf, each when >= 0), uploaded into din; host keeps
 * the values. */
static void adam_issue2(ps_backend *b, const char *name, float g_value, int bad_at, int inf_at,
                        ps_tile *din, ps_tile *host)
{
    ps_op op = mkop(PS_OP_ADAM, 4);
    op.name = (char *)name;
    for (int i = 0; i < 4; i++)
        host[i] = hrand(2, SH(3, 4), NULL, NULL);
    for (int64_t e = 0; e < 12; e++) /* a second moment */
        ((float *)host[3].data)[e] = fabsf(((float *)host[3].data)[e]);
    if (bad_at >= 0)
        ((float *)host[1].data)[bad_at] = g_value;
    if (inf_at >= 0)
        ((float *)host[1].data)[inf_at] = INFINITY;
    for (int i = 0; i < 4; i++)
        din[i] = dupload(b, 0, &host[i]);
    ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
    ps_error err = {0};
    if (b->ops->op(b, 0, &op, din, NULL, &ctx, &err) != PS_OK)
        fail_msg("%s: %s", name, err.msg);
}

static void adam_issue(ps_backend *b, const char *name, float g_value, int bad_at, ps_tile *din,
                       ps_tile *host)
{
    adam_issue2(b, name, g_value, bad_at, -1, din, host);
}

/* Whether the device's parameter, gradient and moments all still equal the
 * uploaded ones. */
static bool adam_unchanged(ps_backend *b, const ps_tile *din, const ps_tile *host)
{
    bool same = true;
    for (int i = 0; i < 4; i++) {
        ps_tile back = hcopy(&host[i]);
        ddownload(b, 0, &din[i], &back);
        same = same && memcmp(back.data, host[i].data, 12 * sizeof(float)) == 0;
        free(back.data);
    }
    return same;
}

/* Whether the device's tile holds n zeros from element `from`. */
static bool dzeros(ps_backend *b, const ps_tile *d, const ps_tile *host, int64_t from, int64_t n)
{
    ps_tile back = hcopy(host);
    ddownload(b, 0, d, &back);
    bool zero = true;
    for (int64_t i = from; i < from + n; i++)
        zero = zero && ((float *)back.data)[i] == 0.0f;
    free(back.data);
    return zero;
}

static void adam_release(ps_backend *b, ps_tile *din, ps_tile *host)
{
    for (int i = 0; i < 4; i++) {
        b->ops->release(b, 0, din[i].data);
        free(host[i].data);
    }
}

/* Deferred checks: of three updates issued before one finish, the two with
 * a non-finite gradient keep their whole state and the finish names the
 * first of them in issue order, with its first bad element and its value's
 * class; an id outside the vocabulary (forward: its row embeds zeros; and
 * the table's gradient) and a label outside it are named at the finish too,
 * after the work issued behind them ran; with more checks than a stream's
 * slots (PS_CUDA_CHECK_SLOTS, 1024), a full round is answered when the next
 * check needs a slot, and a flag in its last slot is still reported at the
 * finish, naming its own op. */
static void ops_deferred_checks(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    ps_error err = {0};
    ps_tile d1[4], h1[4], d2[4], h2[4], d3[4], h3[4];
    adam_issue(b, "first.adam", 0, -1, d1, h1);
    adam_issue2(b, "second.adam", NAN, 11, 4, d2, h2); /* element 4 is named: the first */
    adam_issue(b, "third.adam", -INFINITY, 0, d3, h3);
    ps_error_clear(&err);
    assert_int_equal(b->ops->finish(b, 0, &err), PS_ERR_INVALID);
    if (strstr(err.msg, "op \"second.adam\" (adam): the gradient holds inf at element 4 of "
                        "this tile at step 1 (the step diverged)") == NULL)
        fail_msg("%s", err.msg);
    assert_false(adam_unchanged(b, d1, h1));
    assert_true(adam_unchanged(b, d2, h2));
    assert_true(adam_unchanged(b, d3, h3)); /* flagged too, though named second */
    adam_release(b, d1, h1);
    adam_release(b, d2, h2);
    adam_release(b, d3, h3);

    /* -inf is told apart from inf */
    adam_issue(b, "minus.adam", -INFINITY, 5, d1, h1);
    ps_error_clear(&err);
    assert_int_equal(b->ops->finish(b, 0, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "holds -inf at element 5"));
    adam_release(b, d1, h1);

    /* an id outside the vocabulary: the work issued behind it runs */
    ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
    ps_tile table = hrand(2, SH(10, 4), NULL, NULL);
    ps_tile ids = hints(1, SH(6), 10);
    ((int32_t *)ids.data)[3] = -2;
    ps_tile emb = hrand(2, SH(6, 4), NULL, NULL); /* not zero: the bad row must be written */
    ps_tile ein[2] = {dupload(b, 0, &table), dupload(b, 0, &ids)};
    ps_tile eout[1] = {dupload(b, 0, &emb)};
    ps_op eop = mkop(PS_OP_EMBEDDING, 2);
    eop.name = (char *)"wte";
    assert_int_equal(b->ops->op(b, 0, &eop, ein, eout, &ctx, &err), PS_OK);
    adam_issue(b, "after.adam", 0, -1, d1, h1);
    ps_error_clear(&err);
    assert_int_equal(b->ops->finish(b, 0, &err), PS_ERR_INVALID);
    assert_non_null(
        strstr(err.msg, "op \"wte\" (embedding): id -2 is outside the vocabulary of 10"));
    assert_false(adam_unchanged(b, d1, h1));
    assert_true(dzeros(b, &eout[0], &emb, 3 * 4, 4)); /* the bad id's row */
    adam_release(b, d1, h1);
    /* the table's gradient from the same ids */
    ps_op gop = mkop(PS_OP_EMBEDDING_GRAD, 2);
    gop.name = (char *)"wte.grad";
    gop.attrs.shape_rank = 2;
    gop.attrs.shape[0] = 10;
    gop.attrs.shape[1] = 4;
    ps_tile gin[2] = {ein[1], eout[0]}, gout[1] = {dupload(b, 0, &table)};
    assert_int_equal(b->ops->op(b, 0, &gop, gin, gout, &ctx, &err), PS_OK);
    ps_error_clear(&err);
    assert_int_equal(b->ops->finish(b, 0, &err), PS_ERR_INVALID);
    assert_non_null(
        strstr(err.msg, "op \"wte.grad\" (embedding_grad): id -2 is outside the vocabulary"));
    b->ops->release(b, 0, gout[0].data);
    for (int i = 0; i < 2; i++)
        b->ops->release(b, 0, ein[i].data);
    b->ops->release(b, 0, eout[0].data);
    free(table.data), free(ids.data), free(emb.data);

    /* a label outside the vocabulary of the loss */
    {
        ps_tile logits = hrand(2, SH(3, 5), NULL, NULL), labels = hints(1, SH(3), 5);
        ((int32_t *)labels.data)[1] = 7;
        ps_tile loss = htile(false, 0, NULL, NULL, NULL);
        ps_tile xin[2] = {dupload(b, 0, &logits), dupload(b, 0, &labels)};
        ps_tile xout[1] = {dupload(b, 0, &loss)};
        ps_op xop = mkop(PS_OP_SOFTMAX_XENT, 2);
        xop.name = (char *)"head.loss";
        assert_int_equal(b->ops->op(b, 0, &xop, xin, xout, &ctx, &err), PS_OK);
        ps_error_clear(&err);
        assert_int_equal(b->ops->finish(b, 0, &err), PS_ERR_INVALID);
        assert_non_null(strstr(err.msg, "op \"head.loss\" (softmax_xent): label 7 is outside "
                                        "the vocabulary of 5"));
        for (int i = 0; i < 2; i++)
            b->ops->release(b, 0, xin[i].data);
        b->ops->release(b, 0, xout[0].data);
        free(logits.data), free(labels.data), free(loss.data);
    }

    /* round 0: 1024 clean checks fill the slots; the next one answers them
     * (clean) and is flagged, found at the finish. round 1: 1023 clean ones
     * and a flagged one in the last slot, answered by the call after them
     * (which succeeds) and reported at the finish */
    enum { SLOTS = 1024 };
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < SLOTS; i++) {
            bool flag = round == 1 && i == SLOTS - 1;
            adam_issue(b, flag ? "last.adam" : "clean.adam", INFINITY, flag ? 2 : -1, d1, h1);
            adam_release(b, d1, h1);
        }
        if (round == 0) {
            adam_issue(b, "bad.adam", INFINITY, 7, d1, h1);
            ps_error_clear(&err);
            assert_int_equal(b->ops->finish(b, 0, &err), PS_ERR_INVALID);
            assert_non_null(strstr(err.msg, "op \"bad.adam\" (adam): the gradient holds inf at "
                                            "element 7"));
            adam_release(b, d1, h1);
        }
    }
    /* the 1025th check of this round needs a slot: the full round is
     * answered, and the flag waits for the finish */
    adam_issue(b, "next.adam", 0, -1, d1, h1);
    ps_error_clear(&err);
    assert_int_equal(b->ops->finish(b, 0, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "op \"last.adam\" (adam): the gradient holds inf at "
                                    "element 2"));
    assert_false(adam_unchanged(b, d1, h1)); /* issued behind it: it ran */
    adam_release(b, d1, h1);
    assert_int_equal(b->ops->finish(b, 0, &err), PS_OK);
    b->ops->destroy(b);
}

/* The loss over a vocabulary split across two devices (their reduce group)
 * equals the CPU's loss over the whole logits; each device's dlogits is its
 * slice of the whole gradient. */
typedef struct xent_dev {
    ps_backend *b;
    int device;
    ps_tile logits, labels; /* host */
    ps_tile out;            /* host result */
    bool grad;
    ps_status st;
    char msg[PS_ERROR_MSG_MAX];
} xent_dev;

typedef struct reduce_arg {
    ps_backend *b;
    int device;
    ps_exec_group g;
} reduce_arg;

static ps_status reduce_through_backend(void *arg, float *data, int64_t n, ps_reduce_op op,
                                        ps_error *err)
{
    reduce_arg *r = arg;
    return r->b->ops->reduce(r->b, r->device, &r->g, data, n, op, err);
}

static ps_status reduce64_through_backend(void *arg, double *data, int64_t n, ps_reduce_op op,
                                          ps_error *err)
{
    reduce_arg *r = arg;
    return r->b->ops->reduce64(r->b, r->device, &r->g, data, n, op, err);
}

static void *xent_thread(void *p)
{
    xent_dev *x = p;
    ps_error err = {0};
    static const int members[2] = {0, 1};
    reduce_arg ra = {x->b, x->device, {7, 2, members, x->device}};
    ps_op_context ctx = {.step = 1, .reduce = {2, &ra, reduce_through_backend}};
    ps_op op = mkop(x->grad ? PS_OP_SOFTMAX_XENT_GRAD : PS_OP_SOFTMAX_XENT, 2);
    ps_tile in[2], out[1];
    in[0] = x->logits;
    in[1] = x->labels;
    out[0] = x->out;
    ps_backend *b = x->b;
    x->st = b->ops->alloc(b, x->device, ps_tile_numel(&in[0]) * 4, &in[0].data, &err);
    if (x->st == PS_OK)
        x->st = b->ops->alloc(b, x->device, ps_tile_numel(&in[1]) * 4, &in[1].data, &err);
    if (x->st == PS_OK)
        x->st = b->ops->alloc(b, x->device, ps_tile_numel(&out[0]) * 4, &out[0].data, &err);
    if (x->st == PS_OK)
        x->st = b->ops->upload(b, x->device, in[0].data, x->logits.data,
                               ps_tile_numel(&in[0]) * 4, &err);
    if (x->st == PS_OK)
        x->st = b->ops->upload(b, x->device, in[1].data, x->labels.data,
                               ps_tile_numel(&in[1]) * 4, &err);
    if (x->st == PS_OK)
        x->st = b->ops->op(b, x->device, &op, in, out, &ctx, &err);
    if (x->st == PS_OK)
        x->st = b->ops->download(b, x->device, x->out.data, out[0].data,
                                 ps_tile_numel(&out[0]) * 4, &err);
    if (x->st != PS_OK)
        b->ops->abort(b);
    snprintf(x->msg, sizeof x->msg, "%s", err.msg);
    for (int i = 0; i < 2; i++)
        b->ops->release(b, x->device, in[i].data);
    b->ops->release(b, x->device, out[0].data);
    return NULL;
}

static void ops_xent_split_vocabulary(void **state)
{
    (void)state;
    const int64_t T = 5, S = 7, V = 96;
    ps_tile logits = hrand(3, SH(T, S, V), NULL, NULL), labels = hints(2, SH(T, S), (int)V);
    for (int grad = 0; grad < 2; grad++) {
        ps_backend *b = backend(2, true);
        ps_op op = mkop(grad ? PS_OP_SOFTMAX_XENT_GRAD : PS_OP_SOFTMAX_XENT, 2);
        ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
        ps_tile in[2] = {logits, labels};
        ps_tile want = grad ? htile(false, 3, SH(T, S, V), NULL, NULL)
                            : htile(false, 0, NULL, NULL, NULL);
        ps_error err = {0};
        assert_int_equal(ps_cpu_op_run(&op, in, &want, &ctx, &err), PS_OK);
        xent_dev xd[2];
        pthread_t th[2];
        for (int d = 0; d < 2; d++) {
            memset(&xd[d], 0, sizeof xd[d]);
            xd[d].b = b;
            xd[d].device = d;
            xd[d].grad = grad;
            xd[d].labels = labels;
            xd[d].logits = htile(false, 3, SH(T, S, V / 2), SH(T, S, V), SH(0, 0, d * V / 2));
            for (int64_t i = 0; i < T * S; i++)
                memcpy((float *)xd[d].logits.data + i * (V / 2),
                       (float *)logits.data + i * V + d * (V / 2), (size_t)(V / 2) * 4);
            xd[d].out = grad ? htile(false, 3, SH(T, S, V / 2), SH(T, S, V), SH(0, 0, d * V / 2))
                             : htile(false, 0, NULL, NULL, NULL);
            assert_int_equal(pthread_create(&th[d], NULL, xent_thread, &xd[d]), 0);
        }
        for (int d = 0; d < 2; d++)
            assert_int_equal(pthread_join(th[d], NULL), 0);
        for (int d = 0; d < 2; d++) {
            if (xd[d].st != PS_OK)
                fail_msg("device %d: %s", d, xd[d].msg);
            if (!grad) {
                double e = nmse(xd[d].out.data, want.data, 1);
                if (!(e <= NMSE_TOL))
                    fail_msg("split-vocabulary loss on device %d: nmse %g", d, e);
            } else {
                float *slice = malloc((size_t)(T * S * V / 2) * 4);
                assert_non_null(slice);
                for (int64_t i = 0; i < T * S; i++)
                    memcpy(slice + i * (V / 2), (float *)want.data + i * V + d * (V / 2),
                           (size_t)(V / 2) * 4);
                double e = nmse(xd[d].out.data, slice, T * S * V / 2);
                free(slice);
                if (!(e <= NMSE_TOL))
                    fail_msg("split-vocabulary dlogits on device %d: nmse %g", d, e);
            }
            free(xd[d].logits.data);
            free(xd[d].out.data);
        }
        free(want.data);
        b->ops->destroy(b);
    }
    free(logits.data);
    free(labels.data);
}

/* Batchnorm with the batch split across two devices (their reduce group)
 * equals the CPU's over the whole batch: each device's y or dx is its rows
 * of the whole result, and dgamma and dbeta are the whole totals. */
typedef struct bn_dev {
    ps_backend *b;
    int device;
    bool grad;
    bool in_double; /* the totals cross devices through reduce64 (else in float) */
    ps_tile in[3], out[3]; /* host: the device's inputs and results */
    ps_status st;
    char msg[PS_ERROR_MSG_MAX];
} bn_dev;

static void *bn_thread(void *p)
{
    bn_dev *x = p;
    ps_backend *b = x->b;
    ps_error err = {0};
    static const int members[2] = {0, 1};
    reduce_arg ra = {b, x->device, {8, 2, members, x->device}};
    ps_op_context ctx = {.step = 1,
                         .reduce = {2, &ra, reduce_through_backend,
                                    x->in_double ? reduce64_through_backend : NULL}};
    ps_op op = mkop(x->grad ? PS_OP_BATCHNORM_GRAD : PS_OP_BATCHNORM, 3);
    op.attrs.eps = 1e-5;
    ps_tile din[3], dout[3];
    x->st = PS_OK;
    for (int i = 0; i < 3; i++) {
        din[i] = x->in[i];
        din[i].data = NULL;
        if (x->st == PS_OK)
            x->st = b->ops->alloc(b, x->device, ps_tile_numel(&din[i]) * 4, &din[i].data, &err);
        if (x->st == PS_OK)
            x->st = b->ops->upload(b, x->device, din[i].data, x->in[i].data,
                                   ps_tile_numel(&din[i]) * 4, &err);
    }
    for (int i = 0; i < op.n_out; i++) {
        dout[i] = x->out[i];
        dout[i].data = NULL;
        if (x->st == PS_OK)
            x->st = b->ops->alloc(b, x->device, ps_tile_numel(&dout[i]) * 4, &dout[i].data, &err);
    }
    if (x->st == PS_OK)
        x->st = b->ops->op(b, x->device, &op, din, dout, &ctx, &err);
    for (int i = 0; i < op.n_out && x->st == PS_OK; i++)
        x->st = b->ops->download(b, x->device, x->out[i].data, dout[i].data,
                                 ps_tile_numel(&dout[i]) * 4, &err);
    if (x->st != PS_OK)
        b->ops->abort(b);
    snprintf(x->msg, sizeof x->msg, "%s", err.msg);
    for (int i = 0; i < 3; i++)
        b->ops->release(b, x->device, din[i].data);
    for (int i = 0; i < op.n_out; i++)
        b->ops->release(b, x->device, dout[i].data);
    return NULL;
}

static void ops_batchnorm_split_batch(void **state)
{
    (void)state;
    const int64_t N = 6, C = 4, H = 5, W = 3, plane = C * H * W;
    const int64_t *xs = SH(N, C, H, W), *hs = SH(N / 2, C, H, W);
    ps_tile x = hrand(4, xs, NULL, NULL), gamma = hrand(1, SH(C), NULL, NULL),
            third = hrand(4, xs, NULL, NULL), beta = hrand(1, SH(C), NULL, NULL);
    for (int run = 0; run < 4; run++) {
        int grad = run & 1;
        bool in_double = run >= 2; /* totals in float, then through reduce64 */
        ps_backend *b = backend(2, true);
        assert_non_null(b->ops->reduce64);
        ps_op op = mkop(grad ? PS_OP_BATCHNORM_GRAD : PS_OP_BATCHNORM, 3);
        op.attrs.eps = 1e-5;
        ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
        ps_tile in[3] = {x, gamma, grad ? third : beta};
        ps_tile want[3] = {htile(false, 4, xs, NULL, NULL), htile(false, 1, SH(C), NULL, NULL),
                           htile(false, 1, SH(C), NULL, NULL)};
        ps_error err = {0};
        assert_int_equal(ps_cpu_op_run(&op, in, want, &ctx, &err), PS_OK);
        bn_dev bd[2];
        pthread_t th[2];
        for (int d = 0; d < 2; d++) {
            memset(&bd[d], 0, sizeof bd[d]);
            bd[d].b = b;
            bd[d].device = d;
            bd[d].grad = grad;
            bd[d].in_double = in_double;
            const int64_t *off = SH(d * N / 2, 0, 0, 0);
            bd[d].in[0] = htile(false, 4, hs, xs, off);
            memcpy(bd[d].in[0].data, (float *)x.data + d * (N / 2) * plane,
                   (size_t)(N / 2 * plane) * 4);
            bd[d].in[1] = hcopy(&gamma);
            if (grad) {
                bd[d].in[2] = htile(false, 4, hs, xs, off);
                memcpy(bd[d].in[2].data, (float *)third.data + d * (N / 2) * plane,
                       (size_t)(N / 2 * plane) * 4);
            } else {
                bd[d].in[2] = hcopy(&beta);
            }
            bd[d].out[0] = htile(false, 4, hs, xs, off);
            bd[d].out[1] = htile(false, 1, SH(C), NULL, NULL);
            bd[d].out[2] = htile(false, 1, SH(C), NULL, NULL);
            assert_int_equal(pthread_create(&th[d], NULL, bn_thread, &bd[d]), 0);
        }
        for (int d = 0; d < 2; d++)
            assert_int_equal(pthread_join(th[d], NULL), 0);
        for (int d = 0; d < 2; d++) {
            if (bd[d].st != PS_OK)
                fail_msg("device %d: %s", d, bd[d].msg);
            double e = nmse(bd[d].out[0].data, (float *)want[0].data + d * (N / 2) * plane,
                            N / 2 * plane);
            if (!(e <= NMSE_TOL))
                fail_msg("split-batch %s on device %d (totals in %s): nmse %g", grad ? "dx" : "y",
                         d, in_double ? "double" : "float", e);
            for (int k = 1; grad && k < 3; k++) {
                e = nmse(bd[d].out[k].data, want[k].data, C);
                if (!(e <= NMSE_TOL))
                    fail_msg("split-batch %s on device %d (totals in %s): nmse %g",
                             k == 1 ? "dgamma" : "dbeta", d, in_double ? "double" : "float", e);
            }
            for (int i = 0; i < 3; i++) {
                free(bd[d].in[i].data);
                free(bd[d].out[i].data);
            }
        }
        for (int i = 0; i < 3; i++)
            free(want[i].data);
        b->ops->destroy(b);
    }
    free(x.data);
    free(gamma.data);
    free(third.data);
    free(beta.data);
}

/* conv2d and its gradients (cuDNN), pooling, batchnorm and their
 * gradients, on whole tiles of several geometries: strided, padded, 1x1, a
 * 7x7 stem. */
typedef struct conv_case {
    int64_t N, C, H, W, O, KH, KW;
    int sh, sw, ph, pw;
} conv_case;

static void set_shape_attr(ps_op *op, const ps_tile *t)
{
    op->attrs.shape_rank = t->rank;
    for (int d = 0; d < t->rank; d++)
        op->attrs.shape[d] = t->global[d];
}

static void check_conv_case(ps_backend *b, const conv_case *k)
{
    int64_t OH = (k->H + 2 * k->ph - k->KH) / k->sh + 1;
    int64_t OW = (k->W + 2 * k->pw - k->KW) / k->sw + 1;
    const int64_t *xs = SH(k->N, k->C, k->H, k->W), *ws = SH(k->O, k->C, k->KH, k->KW),
                  *ys = SH(k->N, k->O, OH, OW);
    ps_op_kind kinds[] = {PS_OP_CONV2D, PS_OP_CONV2D_GRAD_INPUT, PS_OP_CONV2D_GRAD_FILTER};
    for (int i = 0; i < 3; i++) {
        ps_op op = mkop(kinds[i], 2);
        op.attrs.stride[0] = k->sh;
        op.attrs.stride[1] = k->sw;
        op.attrs.pad[0] = k->ph;
        op.attrs.pad[1] = k->pw;
        ps_tile in[2], out[1];
        switch (kinds[i]) {
        case PS_OP_CONV2D:
            in[0] = hrand(4, xs, NULL, NULL);
            in[1] = hrand(4, ws, NULL, NULL);
            out[0] = htile(false, 4, ys, NULL, NULL);
            break;
        case PS_OP_CONV2D_GRAD_INPUT:
            in[0] = hrand(4, ys, NULL, NULL);
            in[1] = hrand(4, ws, NULL, NULL);
            out[0] = htile(false, 4, xs, NULL, NULL);
            break;
        default:
            in[0] = hrand(4, xs, NULL, NULL);
            in[1] = hrand(4, ys, NULL, NULL);
            out[0] = htile(false, 4, ws, NULL, NULL);
            break;
        }
        if (kinds[i] != PS_OP_CONV2D)
            set_shape_attr(&op, &out[0]);
        check_op(b, &op, in, out);
    }
}

static void check_pool_case(ps_backend *b, const conv_case *k, ps_pool_kind pool, bool ties)
{
    int64_t OH = (k->H + 2 * k->ph - k->KH) / k->sh + 1;
    int64_t OW = (k->W + 2 * k->pw - k->KW) / k->sw + 1;
    const int64_t *xs = SH(k->N, k->C, k->H, k->W), *ys = SH(k->N, k->C, OH, OW);
    ps_op fop = mkop(PS_OP_POOL, 1), gop = mkop(PS_OP_POOL_GRAD, 3);
    for (int i = 0; i < 2; i++) {
        ps_op *op = i == 0 ? &fop : &gop;
        op->attrs.pool = pool;
        op->attrs.window[0] = (int)k->KH;
        op->attrs.window[1] = (int)k->KW;
        op->attrs.stride[0] = k->sh;
        op->attrs.stride[1] = k->sw;
        op->attrs.pad[0] = k->ph;
        op->attrs.pad[1] = k->pw;
    }
    ps_tile x = hrand(4, xs, NULL, NULL);
    if (ties) /* a few distinct values: max windows tie, the first maximum wins */
        for (int64_t i = 0; i < ps_tile_numel(&x); i++)
            ((float *)x.data)[i] = floorf(((float *)x.data)[i] * 1.5f);
    ps_tile fin[1] = {hcopy(&x)}, fout[1] = {htile(false, 4, ys, NULL, NULL)};
    check_op(b, &fop, fin, fout);
    ps_tile gin[3] = {x, htile(false, 4, ys, NULL, NULL), hrand(4, ys, NULL, NULL)};
    ps_tile gout[1] = {htile(false, 4, xs, NULL, NULL)};
    check_op(b, &gop, gin, gout);
}

#ifdef PS_TEST_HAVE_CUDNN
static const bool have_cudnn = true;
#else
static const bool have_cudnn = false;
#endif

static void ops_cnn(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    const conv_case convs[] = {
        {2, 3, 9, 11, 5, 3, 3, 1, 1, 1, 1}, /* same padding */
        {2, 4, 10, 10, 6, 3, 3, 2, 2, 0, 0}, /* strided */
        {1, 3, 15, 15, 4, 7, 7, 2, 2, 3, 3}, /* the stem */
        {3, 8, 5, 5, 16, 1, 1, 1, 1, 0, 0},  /* 1x1 */
        {2, 2, 8, 6, 3, 3, 2, 1, 2, 2, 0},   /* unequal window, stride, padding */
        {1, 2, 3, 3, 2, 2, 2, 1, 1, 2, 2},   /* padding as wide as the filter */
    };
    if (have_cudnn) {
        for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++)
            check_conv_case(b, &convs[i]);
    } else {
        /* without cuDNN the conv kinds are refused by name */
        ps_error err = {0};
        ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
        ps_tile x = htile(false, 4, SH(1, 2, 5, 5), NULL, NULL);
        ps_tile w = htile(false, 4, SH(3, 2, 3, 3), NULL, NULL);
        ps_tile y = htile(false, 4, SH(1, 3, 3, 3), NULL, NULL);
        ps_tile in[2] = {dupload(b, 0, &x), dupload(b, 0, &w)}, out[1] = {dupload(b, 0, &y)};
        ps_op op = mkop(PS_OP_CONV2D, 2);
        op.attrs.stride[0] = op.attrs.stride[1] = 1;
        assert_int_equal(b->ops->op(b, 0, &op, in, out, &ctx, &err), PS_ERR_UNSUPPORTED);
        assert_non_null(strstr(err.msg, "cuDNN"));
        print_message("conv2d without cuDNN: %s\n", err.msg);
        for (int i = 0; i < 2; i++)
            b->ops->release(b, 0, in[i].data);
        b->ops->release(b, 0, out[0].data);
        free(x.data);
        free(w.data);
        free(y.data);
    }
    const conv_case pools[] = {
        {2, 3, 9, 11, 0, 3, 3, 2, 2, 1, 1}, /* overlapping, padded */
        {2, 4, 10, 10, 0, 2, 2, 2, 2, 0, 0}, /* tiling */
        {1, 2, 3, 3, 0, 2, 2, 1, 1, 2, 2},   /* windows wholly in the padding: 0 */
        {2, 3, 7, 5, 0, 3, 2, 1, 2, 0, 1},   /* unequal */
    };
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++)
        for (int ties = 0; ties < 2; ties++) {
            check_pool_case(b, &pools[i], PS_POOL_MAX, ties);
            check_pool_case(b, &pools[i], PS_POOL_AVG, ties);
        }
    /* batchnorm over NCHW and over [N, C]; the channel block loops over
     * more than one pass of its threads (N * S > 256) */
    const int64_t *bn_shapes[] = {SH(4, 3, 5, 7), SH(300, 10), SH(2, 5, 1, 1)};
    const int bn_ranks[] = {4, 2, 4};
    for (int k = 0; k < 3; k++) {
        const int64_t *xs = bn_shapes[k];
        int64_t C = xs[1];
        ps_op fop = mkop(PS_OP_BATCHNORM, 3), gop = mkop(PS_OP_BATCHNORM_GRAD, 3);
        fop.attrs.eps = gop.attrs.eps = 1e-5;
        ps_tile fin[3] = {hrand(bn_ranks[k], xs, NULL, NULL), hrand(1, SH(C), NULL, NULL),
                          hrand(1, SH(C), NULL, NULL)};
        ps_tile fout[1] = {htile(false, bn_ranks[k], xs, NULL, NULL)};
        check_op(b, &fop, fin, fout);
        ps_tile gin[3] = {hrand(bn_ranks[k], xs, NULL, NULL), hrand(1, SH(C), NULL, NULL),
                          hrand(bn_ranks[k], xs, NULL, NULL)};
        ps_tile gout[3] = {htile(false, bn_ranks[k], xs, NULL, NULL),
                           htile(false, 1, SH(C), NULL, NULL), htile(false, 1, SH(C), NULL, NULL)};
        check_op(b, &gop, gin, gout);
    }
    b->ops->destroy(b);
}

/* The mixture-of-experts kinds against the CPU: the gate (capacity small
 * enough to drop tokens), its gradient, and the moves with slots from the
 * CPU's gate, on the whole expert tensor and on a tile of two experts. */
enum { MOE_G = 2, MOE_S = 24, MOE_E = 6, MOE_K = 2, MOE_C = 5, MOE_M = 7 };

static ps_op moe_op(ps_op_kind kind, int n_in)
{
    ps_op op = mkop(kind, n_in);
    op.attrs.top_k = MOE_K;
    op.attrs.experts = MOE_E;
    op.attrs.capacity = MOE_C;
    return op;
}

static void ops_moe(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    const int64_t *gs = SH(MOE_G, MOE_S, MOE_E), *gk = SH(MOE_G, MOE_S, MOE_K),
                  *tk = SH(MOE_G, MOE_S, MOE_M), *ex = SH(MOE_E, MOE_G, MOE_C, MOE_M);
    ps_tile logits = hrand(3, gs, NULL, NULL);
    /* the CPU's slots and weights feed the moves */
    ps_tile slot = htile(true, 3, gk, NULL, NULL), weight = htile(false, 3, gk, NULL, NULL);
    {
        ps_op op = moe_op(PS_OP_MOE_GATE, 1);
        ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
        ps_error err = {0};
        ps_tile out[2] = {slot, weight};
        assert_int_equal(ps_cpu_op_run(&op, &logits, out, &ctx, &err), PS_OK);
        int dropped = 0;
        for (int64_t i = 0; i < MOE_G * MOE_S * MOE_K; i++)
            dropped += ((int32_t *)slot.data)[i] < 0;
        assert_true(dropped > 0); /* the capacity matters */
    }
    {
        ps_op op = moe_op(PS_OP_MOE_GATE, 1);
        ps_tile in[1] = {hcopy(&logits)};
        ps_tile out[2] = {htile(true, 3, gk, NULL, NULL), htile(false, 3, gk, NULL, NULL)};
        check_op(b, &op, in, out);
    }
    {
        ps_op op = moe_op(PS_OP_MOE_GATE_GRAD, 3);
        ps_tile in[3] = {hcopy(&logits), hcopy(&slot), hrand(3, gk, NULL, NULL)};
        ps_tile out[1] = {htile(false, 3, gs, NULL, NULL)};
        check_op(b, &op, in, out);
    }
    for (int part = 0; part < 2; part++) {
        /* the whole expert tensor, or experts 2..3 of it */
        const int64_t *es = part ? SH(2, MOE_G, MOE_C, MOE_M) : ex;
        const int64_t *eo = part ? SH(2, 0, 0, 0) : SH(0, 0, 0, 0);
        {
            ps_op op = moe_op(PS_OP_MOE_DISPATCH, 2);
            ps_tile in[2] = {hrand(3, tk, NULL, NULL), hcopy(&slot)};
            ps_tile out[1] = {htile(false, 4, es, ex, eo)};
            check_op(b, &op, in, out);
        }
        {
            ps_op op = moe_op(PS_OP_MOE_DISPATCH_GRAD, 2);
            ps_tile in[2] = {hrand(4, es, ex, eo), hcopy(&slot)};
            ps_tile out[1] = {htile(false, 3, tk, NULL, NULL)};
            check_op(b, &op, in, out);
        }
        {
            ps_op op = moe_op(PS_OP_MOE_COMBINE, 3);
            ps_tile in[3] = {hrand(4, es, ex, eo), hcopy(&slot), hcopy(&weight)};
            ps_tile out[1] = {htile(false, 3, tk, NULL, NULL)};
            check_op(b, &op, in, out);
        }
        {
            ps_op op = moe_op(PS_OP_MOE_COMBINE_GRAD, 4);
            ps_tile in[4] = {hrand(3, tk, NULL, NULL), hrand(4, es, ex, eo), hcopy(&slot),
                             hcopy(&weight)};
            ps_tile out[2] = {htile(false, 4, es, ex, eo), htile(false, 3, gk, NULL, NULL)};
            check_op(b, &op, in, out);
        }
    }
    /* a slot outside the expert slots is named */
    {
        ps_error err = {0};
        ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
        ps_tile bad = hcopy(&slot);
        ((int32_t *)bad.data)[5] = MOE_E * MOE_C + 3;
        ps_tile x = hrand(3, tk, NULL, NULL), e = htile(false, 4, ex, NULL, NULL);
        ps_tile in[2] = {dupload(b, 0, &x), dupload(b, 0, &bad)}, out[1] = {dupload(b, 0, &e)};
        ps_op op = moe_op(PS_OP_MOE_DISPATCH, 2);
        assert_int_equal(b->ops->op(b, 0, &op, in, out, &ctx, &err), PS_ERR_INVALID);
        assert_non_null(strstr(err.msg, "33"));
        for (int i = 0; i < 2; i++)
            b->ops->release(b, 0, in[i].data);
        b->ops->release(b, 0, out[0].data);
        free(bad.data);
        free(x.data);
        free(e.data);
    }
    free(logits.data);
    free(slot.data);
    free(weight.data);
    b->ops->destroy(b);
}
/* ---- half storage: fp16/bf16 tiles in 2 bytes ------------------------------------ */

/* Runs op with the tiles picked by the masks (bit i: input i, output i) held
 * in type t, on the CPU backend and on the GPU, from the same 2-byte inputs,
 * and compares outputs (and Adam's updated inputs): both compute in fp32 and
 * round once, so they differ only where fp32 summation order moves a value
 * across a rounding boundary; nmse <= u^2 (u: the type's unit roundoff).
 * Frees in[] and out[]. */
static void check_op_half_adding(ps_backend *b, ps_backend *cpu, const ps_op *op, ps_tile *in,
                                 ps_tile *out, unsigned half_in, unsigned half_out, ps_dtype t,
                                 unsigned accumulate)
{
    ps_error err = {0};
    ps_op_context ctx = {.step = 3, .reduce = {.group_size = 1}, .accumulate = accumulate};
    ps_tile cin[PS_MAX_OP_IO], cout[PS_MAX_OP_IO], din[PS_MAX_OP_IO], dout[PS_MAX_OP_IO];
    for (int i = 0; i < op->n_in; i++) {
        cin[i] = host_as(&in[i], (half_in >> i) & 1u, t);
        din[i] = dupload_any(b, &cin[i]);
    }
    for (int o = 0; o < op->n_out; o++) {
        cout[o] = host_as(&out[o], (half_out >> o) & 1u, t);
        if (((accumulate >> o) & 1u) == 0) {
            /* the runtime hands ops uninitialized outputs: an element the GPU
             * leaves unwritten shows as NaN (0xFFFF is NaN in fp16 and bf16) */
            ps_tile poisoned = hcopy(&cout[o]);
            memset(poisoned.data, cout[o].is_int ? 0x7E : 0xFF, tile_bytes(&cout[o]));
            dout[o] = dupload_any(b, &poisoned);
            free(poisoned.data);
        } else {
            dout[o] = dupload_any(b, &cout[o]);
        }
    }
    if (cpu->ops->op(cpu, 0, op, cin, cout, &ctx, &err) != PS_OK)
        fail_msg("%s (%s) in %s: CPU backend failed: %s", op->name, op->attrs.einsum,
                 ps_dtype_name(t), err.msg);
    if (b->ops->op(b, 0, op, din, dout, &ctx, &err) != PS_OK ||
        b->ops->finish(b, 0, &err) != PS_OK)
        fail_msg("%s (%s) in %s: %s", op->name, op->attrs.einsum, ps_dtype_name(t), err.msg);
    double u = t == PS_DTYPE_BF16 ? 0x1p-8 : 0x1p-11;
    for (int k = 0; k < op->n_in + op->n_out; k++) {
        bool is_out = k >= op->n_in;
        if (!is_out && op->kind != PS_OP_ADAM)
            continue;
        ps_tile *h = is_out ? &cout[k - op->n_in] : &cin[k];
        ps_tile *d = is_out ? &dout[k - op->n_in] : &din[k];
        ps_tile g = hcopy(h);
        assert_int_equal(b->ops->download(b, 0, g.data, d->data, (int64_t)tile_bytes(h), &err),
                         PS_OK);
        float *want = host_floats(h), *got = host_floats(&g);
        double e = nmse(got, want, ps_tile_numel(h));
        if (!(e <= u * u))
            fail_msg("%s (%s) in %s: %s %d differs from the CPU backend, nmse %g (limit %g)",
                     op->name, op->attrs.einsum, ps_dtype_name(t), is_out ? "output" : "input",
                     is_out ? k - op->n_in : k, e, u * u);
        free(want), free(got), free(g.data);
    }
    for (int i = 0; i < op->n_in; i++) {
        b->ops->release(b, 0, din[i].data);
        free(cin[i].data);
        free(in[i].data);
    }
    for (int o = 0; o < op->n_out; o++) {
        b->ops->release(b, 0, dout[o].data);
        free(cout[o].data);
        free(out[o].data);
    }
}

static void check_op_half(ps_backend *b, ps_backend *cpu, const ps_op *op, ps_tile *in,
                          ps_tile *out, unsigned half_in, unsigned half_out, ps_dtype t)
{
    check_op_half_adding(b, cpu, op, in, out, half_in, half_out, t, 0);
}

/* The einsum `spec` at extents size[label] on half operands in type t: into
 * a half output, and added into an fp32 one (an accumulated gradient kept
 * in fp32: cuBLAS's beta 1 on the half operands, or the widened product
 * where the output needs a permutation). */
static void check_half_einsum(ps_backend *b, ps_backend *cpu, const char *spec, const int64_t *size,
                              ps_dtype t)
{
    ps_einsum e;
    assert_int_equal(ps_einsum_parse(spec, &e, NULL), PS_OK);
    for (int adding = 0; adding < 2; adding++) {
        ps_tile x[3];
        for (int o = 0; o < 3; o++) {
            int64_t shape[PS_MAX_RANK];
            for (int k = 0; k < e.rank[o]; k++)
                shape[k] = size[e.labels[o][k] - 'a'];
            x[o] = o < 2 || adding ? hrand(e.rank[o], shape, NULL, NULL)
                                   : htile(false, e.rank[o], shape, NULL, NULL);
        }
        ps_op op = mkop(PS_OP_MATMUL, 2);
        snprintf(op.attrs.einsum, sizeof op.attrs.einsum, "%s", spec);
        if (adding) {
            assert_true(b->ops->op_accumulates(b, &op, 0, &x[2]));
            check_op_half_adding(b, cpu, &op, x, &x[2], 3u, 0u, t, 1u);
        } else {
            check_op_half(b, cpu, &op, x, &x[2], 3u, 1u, t);
        }
    }
}

/* A rank-4 transpose of a half tile of shape `shape` by `perm`. */
static void check_half_transpose(ps_backend *b, ps_backend *cpu, ps_dtype t, const int64_t *shape,
                                 const int *perm)
{
    ps_op op = mkop(PS_OP_TRANSPOSE, 1);
    int64_t out_shape[4];
    for (int i = 0; i < 4; i++) {
        op.attrs.perm[i] = perm[i];
        out_shape[i] = shape[perm[i]];
    }
    ps_tile in[1] = {hrand(4, shape, NULL, NULL)};
    ps_tile out[1] = {htile(false, 4, out_shape, NULL, NULL)};
    check_op_half(b, cpu, &op, in, out, 1u, 1u, t);
}

/* Every GEMM form (half inputs into cuBLAS, permuted first as 2-byte
 * values where the einsum needs it, read in place and looped over the batch
 * (attention), into a half output or added into an fp32 one), the kinds that run on half tiles as
 * they are (elementwise ops, softmax and its gradient, causal too, reshape, transpose),
 * normalization, the loss gradient and Adam (on widened copies) on half tiles, in bf16 and fp16. */
static void ops_half_storage(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false), *cpu = NULL;
    ps_error err = {0};
    int slots = 2;
    assert_int_equal(ps_cpu_backend_create(1, &slots, NULL, &cpu, &err), PS_OK);
    int64_t size[26];
    einsum_sizes_for_test(size);
    size['k' - 'a'] = 33;
    size['n' - 'a'] = 17;
    const ps_dtype types[2] = {PS_DTYPE_BF16, PS_DTYPE_F16};
    for (int ti = 0; ti < 2; ti++) {
        ps_dtype t = types[ti];
        for (size_t i = 0; i < TEST_EINSUM_SPECS; i++)
            check_half_einsum(b, cpu, test_einsum_specs[i], size, t);
        {
            /* attention at extents where the GEMMs read the heads where they
             * lie and loop over the batch (as in ops_matmul): the calls'
             * offsets in 2-byte elements */
            static const char *const attention[] = {"bqad,bkad->baqk", "baqk,bkad->bqad",
                                                    "baqk,bqad->bkad", "bqad,baqk->bkad"};
            int64_t asize[26];
            einsum_sizes_for_test(asize);
            asize['b' - 'a'] = 2;
            asize['a' - 'a'] = 16;
            asize['d' - 'a'] = 64;
            asize['q' - 'a'] = asize['k' - 'a'] = 512;
            for (size_t i = 0; i < sizeof attention / sizeof *attention; i++)
                check_half_einsum(b, cpu, attention[i], asize, t);
        }
        {
            /* a long contraction (a weight gradient over many tokens): cuBLAS
             * must not round split-K partial sums to the half type */
            ps_tile x[3] = {hrand(2, SH(24, 8192), NULL, NULL),
                            hrand(2, SH(8192, 40), NULL, NULL),
                            htile(false, 2, SH(24, 40), NULL, NULL)};
            ps_op op = mkop(PS_OP_MATMUL, 2);
            snprintf(op.attrs.einsum, sizeof op.attrs.einsum, "mk,kn->mn");
            check_op_half(b, cpu, &op, x, &x[2], 3u, 1u, t);
        }
        const int64_t *shape = SH(6, 300);
        {
            ps_op op = mkop(PS_OP_GELU, 1);
            ps_tile in[1] = {hrand(2, shape, NULL, NULL)};
            ps_tile out[1] = {htile(false, 2, shape, NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, 1u, 1u, t);
        }
        {
            ps_op op = mkop(PS_OP_ADD, 2);
            ps_tile in[2] = {hrand(2, shape, NULL, NULL), hrand(2, shape, NULL, NULL)};
            ps_tile out[1] = {htile(false, 2, shape, NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, 3u, 1u, t);
        }
        /* the kinds that run on half tiles as they are (no widened copies);
         * a bias add also with its bias in fp32 (tiles of both types: the
         * widened path) */
        for (int fp32_bias = 0; fp32_bias < 2; fp32_bias++) {
            ps_op op = mkop(PS_OP_BIAS_ADD, 2);
            ps_tile in[2] = {hrand(2, shape, NULL, NULL), hrand(1, SH(300), NULL, NULL)};
            ps_tile out[1] = {htile(false, 2, shape, NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, fp32_bias ? 1u : 3u, 1u, t);
        }
        for (int k = 0; k < 3; k++) {
            const ps_op_kind kinds[3] = {PS_OP_RELU_GRAD, PS_OP_GELU_GRAD, PS_OP_ADD};
            ps_op op = mkop(kinds[k], 2);
            ps_tile in[2] = {hrand(2, shape, NULL, NULL), hrand(2, shape, NULL, NULL)};
            ps_tile out[1] = {htile(false, 2, shape, NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, 3u, 1u, t);
        }
        {
            ps_op op = mkop(PS_OP_RELU, 1);
            ps_tile in[1] = {hrand(2, shape, NULL, NULL)};
            ps_tile out[1] = {htile(false, 2, shape, NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, 1u, 1u, t);
        }
        for (int causal = 0; causal < 2; causal++) {
            const int64_t *s4 = SH(2, 3, 8, 16), *g4 = SH(2, 3, 16, 16), *o4 = SH(0, 0, 8, 0);
            ps_op op = mkop(PS_OP_SOFTMAX, 1);
            op.attrs.scale = 0.37;
            op.attrs.causal = causal;
            ps_tile in[1] = {hrand(4, s4, g4, o4)};
            ps_tile out[1] = {htile(false, 4, s4, g4, o4)};
            check_op_half(b, cpu, &op, in, out, 1u, 1u, t);
            ps_op gop = mkop(PS_OP_SOFTMAX_GRAD, 2);
            gop.attrs.scale = 0.37;
            gop.attrs.causal = causal;
            ps_tile gin[2] = {hrand(4, s4, g4, o4), hrand(4, s4, g4, o4)};
            ps_tile gout[1] = {htile(false, 4, s4, g4, o4)};
            check_op_half(b, cpu, &gop, gin, gout, 3u, 1u, t);
        }
        {
            ps_op op = mkop(PS_OP_SOFTMAX, 1);
            ps_tile in[1] = {hrand(2, SH(3, 5000), NULL, NULL)};
            ps_tile out[1] = {htile(false, 2, SH(3, 5000), NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, 1u, 1u, t);
        }
        /* transposes: 2-byte values moved singly, in 8-byte units (an inner
         * extent of 4), and in 16-byte units (attention's heads) */
        check_half_transpose(b, cpu, t, SH(4, 3, 5, 6), (const int[]){2, 0, 3, 1});
        check_half_transpose(b, cpu, t, SH(2, 3, 5, 4), (const int[]){0, 2, 1, 3});
        check_half_transpose(b, cpu, t, SH(2, 6, 4, 16), (const int[]){0, 2, 1, 3});
        {
            ps_op op = mkop(PS_OP_RESHAPE, 1);
            op.attrs.shape_rank = 2;
            op.attrs.shape[0] = 12;
            op.attrs.shape[1] = 35;
            ps_tile in[1] = {hrand(3, SH(4, 3, 35), NULL, NULL)};
            ps_tile out[1] = {htile(false, 2, SH(12, 35), NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, 1u, 1u, t);
        }
        {
            ps_op op = mkop(PS_OP_LAYERNORM, 3);
            ps_tile in[3] = {hrand(2, shape, NULL, NULL), hrand(1, SH(300), NULL, NULL),
                             hrand(1, SH(300), NULL, NULL)};
            ps_tile out[1] = {htile(false, 2, shape, NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, 7u, 1u, t);
        }
        /* its gradient, every tile half (dgamma, dbeta too); 130 rows: row
         * chunks holding several rows, a short last one */
        for (int rows = 6; rows <= 130; rows += 124) {
            const int64_t *ls = SH(rows, 300);
            ps_op op = mkop(PS_OP_LAYERNORM_GRAD, 3);
            ps_tile in[3] = {hrand(2, ls, NULL, NULL), hrand(1, SH(300), NULL, NULL),
                             hrand(2, ls, NULL, NULL)};
            ps_tile out[3] = {htile(false, 2, ls, NULL, NULL), htile(false, 1, SH(300), NULL, NULL),
                              htile(false, 1, SH(300), NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, 7u, 7u, t);
        }
        /* tiles of both types in one op (half activations, fp32 parameters):
         * the widened path, as the bias add's above */
        {
            ps_op op = mkop(PS_OP_LAYERNORM, 3);
            ps_tile in[3] = {hrand(2, shape, NULL, NULL), hrand(1, SH(300), NULL, NULL),
                             hrand(1, SH(300), NULL, NULL)};
            ps_tile out[1] = {htile(false, 2, shape, NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, 1u, 1u, t);
        }
        /* a bias gradient (many rows, few outputs: one block each), a mean
         * over a split middle axis (one thread each), and their broadcasts */
        for (int k = 0; k < 2; k++) {
            const int rank = k == 0 ? 2 : 3;
            const int64_t *xs = k == 0 ? SH(300, 40) : SH(4, 5, 6);
            const int64_t *xg = k == 0 ? SH(300, 40) : SH(4, 10, 6);
            const int64_t *xo = k == 0 ? SH(0, 0) : SH(0, 5, 0);
            const int64_t *ys = k == 0 ? SH(40) : SH(4, 6);
            ps_op op = mkop(PS_OP_REDUCE, 1);
            op.attrs.axes = k == 0 ? 0x1 : 0x2;
            op.attrs.reduce = k == 0 ? PS_REDUCE_SUM : PS_REDUCE_MEAN;
            ps_tile in[1] = {hrand(rank, xs, xg, xo)};
            ps_tile out[1] = {htile(false, rank - 1, ys, NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, 1u, 1u, t);
            ps_op bop = mkop(PS_OP_BROADCAST, 1);
            bop.attrs.axes = op.attrs.axes;
            bop.attrs.reduce = op.attrs.reduce;
            bop.attrs.shape_rank = rank;
            for (int d = 0; d < rank; d++)
                bop.attrs.shape[d] = xg[d];
            ps_tile bin[1] = {hrand(rank - 1, ys, NULL, NULL)};
            ps_tile bout[1] = {htile(false, rank, xs, xg, xo)};
            check_op_half(b, cpu, &bop, bin, bout, 1u, 1u, t);
        }
        {
            ps_op op = mkop(PS_OP_SOFTMAX_XENT_GRAD, 2);
            op.attrs.scale = 1024;
            ps_tile in[2] = {hrand(3, SH(4, 6, 300), NULL, NULL), hints(2, SH(4, 6), 300)};
            ps_tile out[1] = {htile(false, 3, SH(4, 6, 300), NULL, NULL)};
            check_op_half(b, cpu, &op, in, out, 1u, 1u, t);
        }
        {
            /* the parameter and its gradient in half, m, v and the master in fp32 */
            ps_op op = mkop(PS_OP_ADAM, 5);
            op.attrs.weight_decay = 0.01;
            op.attrs.scale = 1024;
            ps_tile in[5];
            for (int i = 0; i < 5; i++)
                in[i] = hrand(2, SH(33, 17), NULL, NULL);
            for (int64_t i = 0; i < 33 * 17; i++) {
                ((float *)in[1].data)[i] *= 1024; /* a scaled gradient */
                ((float *)in[3].data)[i] = fabsf(((float *)in[3].data)[i]);
            }
            memcpy(in[4].data, in[0].data, 33 * 17 * sizeof(float));
            check_op_half(b, cpu, &op, in, NULL, 3u, 0u, t);
        }
    }
    cpu->ops->destroy(cpu);
    b->ops->destroy(b);
}

/* The backend on half tiles: zero, accumulate (each sum rounded once, as
 * exec/half.c's ps_half_add) and copy_box (2-byte elements), bit for bit. */
static void backend_half_tiles(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    ps_error err = {0};
    const ps_dtype types[2] = {PS_DTYPE_BF16, PS_DTYPE_F16};
    for (int ti = 0; ti < 2; ti++) {
        ps_dtype t = types[ti];
        ps_tile fa = hrand(2, SH(9, 13), NULL, NULL), fb = hrand(2, SH(9, 13), NULL, NULL);
        ps_tile ha = host_as(&fa, true, t), hb = host_as(&fb, true, t);
        ps_tile da = dupload_any(b, &ha), db = dupload_any(b, &hb);
        assert_int_equal(b->ops->accumulate(b, 0, &da, &db, &err), PS_OK);
        ps_tile want = hcopy(&ha), got = hcopy(&ha);
        ps_half_add(t, want.data, hb.data, 9 * 13);
        assert_int_equal(b->ops->download(b, 0, got.data, da.data, 9 * 13 * 2, &err), PS_OK);
        assert_memory_equal(got.data, want.data, 9 * 13 * 2);
        /* rows 3..6 of the same tensor (a 4-row tile), copied in */
        ps_tile part = htile(false, 2, SH(4, 13), SH(9, 13), SH(3, 0));
        ps_tile hpart = host_as(&part, true, t);
        ps_tile dpart = dupload_any(b, &hpart);
        assert_int_equal(b->ops->copy_box(b, 0, &db, &dpart, &err), PS_OK);
        ps_tile back = hcopy(&hpart);
        assert_int_equal(b->ops->download(b, 0, back.data, dpart.data, 4 * 13 * 2, &err), PS_OK);
        assert_memory_equal(back.data, (uint16_t *)hb.data + 3 * 13, 4 * 13 * 2);
        assert_int_equal(b->ops->zero(b, 0, &dpart, &err), PS_OK);
        assert_int_equal(b->ops->download(b, 0, back.data, dpart.data, 4 * 13 * 2, &err), PS_OK);
        for (int i = 0; i < 4 * 13; i++)
            assert_int_equal(((uint16_t *)back.data)[i], 0);
        b->ops->release(b, 0, da.data);
        b->ops->release(b, 0, db.data);
        b->ops->release(b, 0, dpart.data);
        free(fa.data), free(fb.data), free(ha.data), free(hb.data), free(want.data);
        free(got.data), free(part.data), free(hpart.data), free(back.data);
    }
    b->ops->destroy(b);
}
#else
static void ops_skipped(void **state)
{
    (void)state;
    print_message("exec/cpu/cpu_ops.h is not in this tree: op comparisons skipped\n");
    skip();
}
#endif

/* ---- op errors --------------------------------------------------------------------- */

static void ops_errors(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    ps_error err = {0};
    ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
    /* a pool window that does not fit is a shape error */
    {
        ps_tile px = htile(false, 4, (const int64_t[]){1, 1, 2, 2}, NULL, NULL);
        ps_tile py = htile(false, 4, (const int64_t[]){1, 1, 1, 1}, NULL, NULL);
        ps_tile pin[1] = {dupload(b, 0, &px)}, pout[1] = {dupload(b, 0, &py)};
        ps_op pop = mkop(PS_OP_POOL, 1);
        pop.attrs.window[0] = pop.attrs.window[1] = 3;
        pop.attrs.stride[0] = pop.attrs.stride[1] = 1;
        ps_error_clear(&err);
        assert_int_equal(b->ops->op(b, 0, &pop, pin, pout, &ctx, &err), PS_ERR_INVALID);
        assert_non_null(strstr(err.msg, "does not fit"));
        b->ops->release(b, 0, pin[0].data);
        b->ops->release(b, 0, pout[0].data);
        free(px.data);
        free(py.data);
    }
    /* an id outside the vocabulary */
    ps_tile table = hrand(2, (const int64_t[]){10, 4}, NULL, NULL);
    ps_tile ids = hints(1, (const int64_t[]){6}, 10);
    ((int32_t *)ids.data)[3] = 12;
    ps_tile emb = htile(false, 2, (const int64_t[]){6, 4}, NULL, NULL);
    ps_tile ein[2] = {dupload(b, 0, &table), dupload(b, 0, &ids)}, eout[1] = {
                                                                        dupload(b, 0, &emb)};
    ps_op eop = mkop(PS_OP_EMBEDDING, 2);
    ps_error_clear(&err);
    /* a deferred check: the op is issued, the device's finish names the id */
    assert_int_equal(b->ops->op(b, 0, &eop, ein, eout, &ctx, &err), PS_OK);
    assert_int_equal(b->ops->finish(b, 0, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "id 12 is outside the vocabulary of 10"));
    for (int i = 0; i < 2; i++)
        b->ops->release(b, 0, ein[i].data);
    b->ops->release(b, 0, eout[0].data);
    free(table.data);
    free(ids.data);
    free(emb.data);
    b->ops->destroy(b);
}

/* ---- backend: memory, timing ----------------------------------------------------- */

static void backend_memory(void **state)
{
    (void)state;
    ps_backend *b = backend(2, true);
    ps_error err = {0};
    void *p1, *p2, *p3, *p4;
    assert_int_equal(b->ops->alloc(b, 0, 1000, &p1, &err), PS_OK);
    assert_int_equal(b->ops->alloc(b, 0, 3000, &p2, &err), PS_OK);
    assert_int_equal(b->ops->peak_bytes(b, 0), 4000);
    b->ops->release(b, 0, p1);
    /* 500 bytes round to 512: a new block (the cache gives a block to a
     * request of its own rounded size only); the peak counts bytes asked */
    assert_int_equal(b->ops->alloc(b, 0, 500, &p3, &err), PS_OK);
    assert_int_equal(b->ops->peak_bytes(b, 0), 4000);
    assert_int_equal(b->ops->alloc(b, 0, 2000, &p4, &err), PS_OK);
    assert_int_equal(b->ops->peak_bytes(b, 0), 5500);
    assert_int_equal(b->ops->peak_bytes(b, 1), 0); /* its own accounting */
    b->ops->release(b, 0, p2);
    b->ops->release(b, 0, p3);
    b->ops->release(b, 0, p4);
    assert_int_equal(b->ops->peak_bytes(b, 0), 5500);
    /* an absurd allocation fails with a message naming the device and call */
    void *huge = NULL;
    assert_int_equal(b->ops->alloc(b, 1, (int64_t)1 << 52, &huge, &err), PS_ERR_DEVICE);
    assert_null(huge);
    assert_non_null(strstr(err.msg, "device 1"));
    assert_non_null(strstr(err.msg, "cudaMalloc"));
    assert_int_equal(b->ops->peak_bytes(b, 1), 0);
    /* and the device still works */
    assert_int_equal(b->ops->alloc(b, 1, 4096, &p1, &err), PS_OK);
    b->ops->release(b, 1, p1);
    b->ops->destroy(b);
}

/* A device tile of that shape, its memory from the backend's pool (the
 * contents are whatever the GPU held). */
static ps_tile dalloc(ps_backend *b, int rank, const int64_t *shape)
{
    ps_tile t;
    memset(&t, 0, sizeof t);
    t.rank = rank;
    for (int d = 0; d < rank; d++)
        t.shape[d] = t.global[d] = shape[d];
    ps_error err = {0};
    if (b->ops->alloc(b, 0, ps_tile_numel(&t) * 4, &t.data, &err) != PS_OK)
        fail_msg("%s", err.msg);
    return t;
}

/* Blocks the pool caches are given back to the GPU when an allocation
 * outside the pool needs them: with the GPU filled by blocks that were then
 * released (cached), a MATMUL whose operand must be permuted gets its 1 GiB
 * workspace. Without the reclaim it failed with cudaMalloc's out of memory. */
static void backend_reclaim(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    ps_error err = {0};
    /* "cab,bd->acd": the contracted b is not outermost in A's layout, so A
     * (1 GiB) is permuted in the op's workspace */
    ps_tile t[3] = {dalloc(b, 3, SH(64, 4096, 1024)), dalloc(b, 2, SH(1024, 8)),
                    dalloc(b, 3, SH(4096, 64, 8))};
    enum { FILL_MAX = 4096 };
    static void *fill[FILL_MAX];
    int n_fill = 0;
    const int64_t block = (int64_t)256 << 20;
    while (n_fill < FILL_MAX && b->ops->alloc(b, 0, block, &fill[n_fill], &err) == PS_OK)
        n_fill++;
    assert_true(n_fill > 0 && n_fill < FILL_MAX); /* the GPU is full */
    ps_error_clear(&err);
    for (int i = 0; i < n_fill; i++)
        b->ops->release(b, 0, fill[i]); /* cached, not freed */
    ps_op op = mkop(PS_OP_MATMUL, 2);
    snprintf(op.attrs.einsum, sizeof op.attrs.einsum, "%s", "cab,bd->acd");
    ps_op_context ctx = {.step = 1, .reduce = {.group_size = 1}};
    if (b->ops->op(b, 0, &op, t, &t[2], &ctx, &err) != PS_OK ||
        b->ops->finish(b, 0, &err) != PS_OK)
        fail_msg("after %d cached blocks of 256 MiB: %s", n_fill, err.msg);
    /* and the pool still serves a block of the size it gave back */
    void *again = NULL;
    assert_int_equal(b->ops->alloc(b, 0, block, &again, &err), PS_OK);
    b->ops->release(b, 0, again);
    for (int i = 0; i < 3; i++)
        b->ops->release(b, 0, t[i].data);
    b->ops->destroy(b);
}

/* check_memory: devices sharing GPU 0 add up against its free memory; a
 * need within it passes, one beyond the GPU's whole memory is refused with
 * a message naming the GPU, the devices, the largest and the memory. */
static void backend_check_memory(void **state)
{
    (void)state;
    ps_backend *b = backend(2, true);
    ps_error err = {0};
    assert_non_null(b->ops->check_memory);
    int64_t need[2] = {1 << 20, 2 << 20};
    assert_int_equal(b->ops->check_memory(b, need, &err), PS_OK);
    double total = ps_cuda_device_memory_bytes(0);
    assert_true(total > 0);
    need[0] = (int64_t)(total / 2);
    need[1] = (int64_t)(total / 2) + ((int64_t)1 << 30); /* together above the whole GPU */
    assert_int_equal(b->ops->check_memory(b, need, &err), PS_ERR_NOMEM);
    printf("  %s\n", err.msg);
    assert_non_null(strstr(err.msg, "GPU 0: 2 devices of the plan hold "));
    assert_non_null(strstr(err.msg, "(device 1 the most: "));
    assert_non_null(strstr(err.msg, "free of its "));
    assert_non_null(strstr(err.msg, "--no-memory-check"));
    /* a device of no need is not counted */
    ps_error e2 = {0};
    need[0] = 0;
    need[1] = 1 << 20;
    assert_int_equal(b->ops->check_memory(b, need, &e2), PS_OK);
    b->ops->destroy(b);
}

static void backend_timing_and_profile(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    ps_error err = {0};
    float *x;
    const int64_t n = 1 << 22;
    assert_int_equal(b->ops->alloc(b, 0, n * 4, (void **)&x, &err), PS_OK);
    ps_tile t = htile(false, 1, (const int64_t[]){n}, NULL, NULL);
    free(t.data);
    t.data = x;
    assert_int_equal(b->ops->mark(b, 0, 0, &err), PS_OK);
    for (int i = 0; i < 10; i++)
        assert_int_equal(b->ops->zero(b, 0, &t, &err), PS_OK);
    assert_int_equal(b->ops->mark(b, 0, 1, &err), PS_OK);
    assert_int_equal(b->ops->finish(b, 0, &err), PS_OK);
    double s = -1;
    assert_int_equal(b->ops->elapsed(b, 0, 0, 1, &s, &err), PS_OK);
    assert_true(s > 0 && s < 1);
    assert_int_equal(b->ops->elapsed(b, 0, 0, 5, &s, &err), PS_ERR_INVALID); /* never marked */
    b->ops->release(b, 0, x);
    b->ops->destroy(b);

    double fp32 = 0, tf32 = 0, bf16 = 0;
    assert_int_equal(ps_cuda_profile_gemm(0, 1024, 1024, 1024, PS_DTYPE_F32, 5, &fp32, &err),
                     PS_OK);
    assert_int_equal(ps_cuda_profile_gemm_flags(0, 1024, 1024, 1024, PS_DTYPE_F32,
                                                PS_CUDA_PROFILE_TF32, 5, &tf32, &err),
                     PS_OK);
    assert_int_equal(ps_cuda_profile_gemm(0, 1024, 1024, 1024, PS_DTYPE_BF16, 5, &bf16, &err),
                     PS_OK);
    assert_true(fp32 > 0 && tf32 > 0 && bf16 > 0);
    print_message("GEMM 1024^3: fp32 %.1f, tf32 %.1f, bf16 %.1f TFLOP/s\n",
                  2e-12 * 1024 * 1024 * 1024 / fp32, 2e-12 * 1024 * 1024 * 1024 / tf32,
                  2e-12 * 1024 * 1024 * 1024 / bf16);
    assert_int_equal(ps_cuda_profile_gemm(0, 0, 8, 8, PS_DTYPE_F32, 1, &fp32, &err),
                     PS_ERR_INVALID);

    /* more plan devices than GPUs, without sharing: refused with a reason */
    ps_backend *nb = NULL;
    ps_error_clear(&err);
    assert_int_equal(ps_cuda_backend_create(ps_cuda_device_count() + 1, 2, NULL, &nb, &err),
                     PS_ERR_UNSUPPORTED);
    assert_null(nb);
    assert_non_null(strstr(err.msg, "GPU"));
}

/* ---- backend: boxes and collectives (4 devices on GPU 0) --------------------------- */

#define NDEV 4

/* The collective tests run with four devices sharing GPU 0 and, on a
 * machine with four GPUs or more, again on four GPUs (collectives through
 * NCCL, send/recv by peer copies). */
static bool on_gpus = false;

/* Box semantics on the host: the value of global element idx (row-major
 * over `global`) in a tile, or NAN when the tile does not hold it. */
static float host_at(const ps_tile *t, const int64_t *coord)
{
    int64_t off = 0;
    for (int d = 0; d < t->rank; d++) {
        int64_t c = coord[d] - t->offset[d];
        if (c < 0 || c >= t->shape[d])
            return NAN;
        off = off * t->shape[d] + c;
    }
    return ((float *)t->data)[off];
}

/* Coordinates of local element i of t. */
static void coord_of(const ps_tile *t, int64_t i, int64_t *coord)
{
    for (int d = t->rank - 1; d >= 0; d--) {
        coord[d] = t->offset[d] + i % t->shape[d];
        i /= t->shape[d];
    }
}

/* The overflow vote's check: one answer for several tiles, fp32 and half;
 * inf and NaN anywhere (first, middle, last element of any tile) are found,
 * the largest finite values are not, and an fp32 value beyond fp16's range
 * is found once held in fp16 (it rounds to inf). */
static void backend_find_nonfinite(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    ps_error err = {0};
    const ps_dtype types[3] = {PS_DTYPE_F32, PS_DTYPE_BF16, PS_DTYPE_F16};
    const int64_t sizes[3] = {1, 1000, 70001};
    for (int ti = 0; ti < 3; ti++) {
        for (int where = -1; where < 9; where++) {
            ps_tile f[3], h[3], d[3];
            for (int i = 0; i < 3; i++) {
                f[i] = hrand(1, (const int64_t[]){sizes[i]}, NULL, NULL);
                float *x = f[i].data;
                x[0] = types[ti] == PS_DTYPE_F16 ? 65504.0f : 3.0e38f; /* largest finite */
                if (where >= 0 && where / 3 == i) {
                    int64_t at = where % 3 == 0 ? 0 : where % 3 == 1 ? sizes[i] / 2 : sizes[i] - 1;
                    x[at] = where % 2 ? INFINITY : i == 1 ? -INFINITY : NAN;
                }
                h[i] = host_as(&f[i], types[ti] != PS_DTYPE_F32, types[ti]);
                d[i] = dupload_any(b, &h[i]);
            }
            bool found = true;
            assert_int_equal(b->ops->find_nonfinite(b, 0, d, 3, &found, &err), PS_OK);
            if (found != (where >= 0))
                fail_msg("%s, non-finite value at %d: found %d", ps_dtype_name(types[ti]), where,
                         found);
            for (int i = 0; i < 3; i++) {
                b->ops->release(b, 0, d[i].data);
                free(f[i].data), free(h[i].data);
            }
        }
    }
    /* 65520 is finite in fp32 and bf16 but rounds to inf in fp16 */
    for (int ti = 0; ti < 3; ti++) {
        ps_tile f = hrand(1, (const int64_t[]){37}, NULL, NULL);
        ((float *)f.data)[20] = 65520.0f;
        ps_tile h = host_as(&f, types[ti] != PS_DTYPE_F32, types[ti]);
        ps_tile d = dupload_any(b, &h);
        bool found = false;
        assert_int_equal(b->ops->find_nonfinite(b, 0, &d, 1, &found, &err), PS_OK);
        assert_int_equal(found, types[ti] == PS_DTYPE_F16);
        b->ops->release(b, 0, d.data);
        free(f.data), free(h.data);
    }
    b->ops->destroy(b);
}

/* A re-layout writes the whole destination box from a source box that
 * covers it (30 random pairs of boxes of a 7 x 9 x 5 x 3 tensor, the source
 * grown around the destination by random margins), as the CPU backend; a
 * source that misses part of the destination is refused, not half copied. */
static void backend_copy_box(void **state)
{
    (void)state;
    ps_backend *b = backend(1, false);
    const int64_t *g = (const int64_t[]){7, 9, 5, 3};
    for (int trial = 0; trial < 30; trial++) {
        int64_t shape[2][4], offset[2][4];
        for (int d = 0; d < 4; d++) {
            offset[1][d] = below((int)g[d]);
            shape[1][d] = 1 + below((int)(g[d] - offset[1][d]));
            offset[0][d] = below((int)offset[1][d] + 1);
            int64_t end = offset[1][d] + shape[1][d];
            shape[0][d] = end - offset[0][d] + below((int)(g[d] - end) + 1);
        }
        ps_tile h[2];
        for (int k = 0; k < 2; k++)
            h[k] = hrand(4, shape[k], g, offset[k]);
        ps_tile want = hcopy(&h[1]);
        int64_t coord[4];
        for (int64_t i = 0; i < ps_tile_numel(&want); i++) {
            coord_of(&want, i, coord);
            float v = host_at(&h[0], coord);
            assert_false(isnan(v)); /* the source covers every element */
            ((float *)want.data)[i] = v;
        }
        ps_tile src = dupload(b, 0, &h[0]), dst = dupload(b, 0, &h[1]);
        ps_error err = {0};
        assert_int_equal(b->ops->copy_box(b, 0, &src, &dst, &err), PS_OK);
        ddownload(b, 0, &dst, &h[1]);
        assert_memory_equal(h[1].data, want.data, (size_t)ps_tile_numel(&want) * 4);
        /* the destination as the source of a box one larger somewhere: refused */
        int d = trial % 4;
        if (shape[0][d] < g[d]) {
            ps_tile wider = hrand(4, shape[0], g, offset[0]);
            wider.shape[d]++;
            if (offset[0][d] > 0)
                wider.offset[d]--;
            free(wider.data);
            wider = hrand(4, wider.shape, g, wider.offset);
            ps_tile big = dupload(b, 0, &wider);
            assert_int_equal(b->ops->copy_box(b, 0, &src, &big, &err), PS_ERR_INTERNAL);
            assert_non_null(strstr(err.msg, "does not cover"));
            b->ops->release(b, 0, big.data);
            free(wider.data);
        }
        b->ops->release(b, 0, src.data);
        b->ops->release(b, 0, dst.data);
        free(h[0].data);
        free(h[1].data);
        free(want.data);
    }
    b->ops->destroy(b);
}

typedef struct coll_dev {
    ps_backend *b;
    int device;
    ps_collective kind;
    ps_tile src, dst; /* host: inputs, then dst gets the result */
    bool in_place;    /* src and dst are one buffer (same box) */
    ps_dtype half;    /* PS_DTYPE_F32, or held in 2 bytes as this type */
    bool lone;        /* each device a group of one (id -1, as the runtime's) */
    ps_status st;
    char msg[PS_ERROR_MSG_MAX];
} coll_dev;

static const int all_devices[NDEV] = {0, 1, 2, 3};

static void *coll_thread(void *p)
{
    coll_dev *c = p;
    ps_backend *b = c->b;
    ps_error err = {0};
    ps_exec_group g = {3, NDEV, all_devices, c->device};
    if (c->lone)
        g = (ps_exec_group){-1, 1, &all_devices[c->device], 0};
    /* the host values as the device holds them (2 bytes for a half type) */
    bool half = c->half != PS_DTYPE_F32;
    ps_tile hsrc = host_as(&c->src, half, c->half), hdst = host_as(&c->dst, half, c->half);
    ps_tile src = hsrc, dst = hdst;
    src.data = dst.data = NULL;
    c->st = b->ops->alloc(b, c->device, (int64_t)tile_bytes(&src), &src.data, &err);
    if (c->st == PS_OK && !c->in_place)
        c->st = b->ops->alloc(b, c->device, (int64_t)tile_bytes(&dst), &dst.data, &err);
    if (c->in_place)
        dst.data = src.data;
    if (c->st == PS_OK)
        c->st = b->ops->upload(b, c->device, src.data, hsrc.data, (int64_t)tile_bytes(&src),
                               &err);
    if (c->st == PS_OK && !c->in_place)
        c->st = b->ops->upload(b, c->device, dst.data, hdst.data, (int64_t)tile_bytes(&dst),
                               &err);
    if (c->st == PS_OK)
        c->st = b->ops->collective(b, c->device, &g, c->kind, &src, &dst, &err);
    if (c->st == PS_OK)
        c->st = b->ops->download(b, c->device, hdst.data, dst.data, (int64_t)tile_bytes(&dst),
                                 &err);
    if (c->st == PS_OK) { /* the result, widened, into the float host tile */
        float *f = host_floats(&hdst);
        memcpy(c->dst.data, f, (size_t)ps_tile_numel(&dst) * sizeof *f);
        free(f);
    }
    if (c->st != PS_OK)
        b->ops->abort(b); /* as the runtime does after the first error */
    snprintf(c->msg, sizeof c->msg, "%s", err.msg);
    b->ops->release(b, c->device, src.data);
    if (!c->in_place)
        b->ops->release(b, c->device, dst.data);
    free(hsrc.data);
    free(hdst.data);
    return NULL;
}

static void run_threads(void *(*fn)(void *), void *items, size_t item_size)
{
    pthread_t th[NDEV];
    for (int d = 0; d < NDEV; d++)
        assert_int_equal(pthread_create(&th[d], NULL, fn, (char *)items + d * item_size), 0);
    for (int d = 0; d < NDEV; d++)
        assert_int_equal(pthread_join(th[d], NULL), 0);
}

/* Host semantics: every element of dst's box gets the sum (reductions) or a
 * copy (gathers) of the members' src over it. */
static ps_tile expected(const coll_dev *c, int me)
{
    ps_tile want = hcopy(&c[me].dst);
    bool sum = c[me].kind == PS_COLL_ALL_REDUCE || c[me].kind == PS_COLL_REDUCE_SCATTER;
    int64_t coord[PS_MAX_RANK];
    for (int64_t i = 0; i < ps_tile_numel(&want); i++) {
        coord_of(&want, i, coord);
        float acc = 0;
        bool any = false;
        for (int m = 0; m < NDEV; m++) {
            if (c[me].lone && m != me)
                continue;
            float v = host_at(&c[m].src, coord);
            if (isnan(v))
                continue;
            if (sum)
                acc += v;
            else
                acc = v;
            any = true;
        }
        if (sum || any)
            ((float *)want.data)[i] = acc;
    }
    return want;
}

/* Rounds a float host tile's values to type t (exactly representable
 * there); nothing for fp32. */
static void round_to(ps_tile *f, ps_dtype t)
{
    if (t == PS_DTYPE_F32)
        return;
    ps_tile h = host_as(f, true, t);
    float *back = host_floats(&h);
    memcpy(f->data, back, (size_t)ps_tile_numel(f) * sizeof *back);
    free(back);
    free(h.data);
}

/* A collective on four devices with tiles held in type t: the result is the
 * box semantics over the members' values, sums in fp32 in member order and,
 * for a half type, rounded once (the CPU backend's semantics); nmse <= 1e-12
 * in fp32, <= u^2 in a half type (NCCL's ring adds in its own order). */
/* lone: every device runs it as a group of one, all at once. */
static void check_collective_in(ps_dtype t, ps_collective kind,
                                int64_t (*src_box)(int, int, int64_t *),
                                int64_t (*dst_box)(int, int, int64_t *), bool in_place,
                                bool lone)
{
    ps_backend *b = backend(NDEV, !on_gpus);
    const int64_t g[2] = {8, 12};
    coll_dev c[NDEV];
    for (int d = 0; d < NDEV; d++) {
        int64_t lo[2], size[2];
        for (int k = 0; k < 2; k++)
            size[k] = src_box(d, k, &lo[k]);
        memset(&c[d], 0, sizeof c[d]);
        c[d].b = b;
        c[d].device = d;
        c[d].kind = kind;
        c[d].in_place = in_place;
        c[d].half = t;
        c[d].lone = lone;
        c[d].src = hrand(2, size, g, lo);
        round_to(&c[d].src, t);
        for (int k = 0; k < 2; k++)
            size[k] = dst_box(d, k, &lo[k]);
        c[d].dst = in_place ? hcopy(&c[d].src) : hrand(2, size, g, lo);
        round_to(&c[d].dst, t);
    }
    ps_tile want[NDEV];
    for (int d = 0; d < NDEV; d++) {
        want[d] = expected(c, d);
        round_to(&want[d], t);
    }
    double u = t == PS_DTYPE_BF16 ? 0x1p-8 : 0x1p-11, limit = t == PS_DTYPE_F32 ? 1e-12 : u * u;
    run_threads(coll_thread, c, sizeof c[0]);
    for (int d = 0; d < NDEV; d++) {
        if (c[d].st != PS_OK)
            fail_msg("%s, device %d: %s", ps_collective_names[kind], d, c[d].msg);
        int64_t n = ps_tile_numel(&want[d]);
        double e = nmse(c[d].dst.data, want[d].data, n);
        if (!(e <= limit))
            fail_msg("%s in %s, device %d: result differs from the box semantics (nmse %g)",
                     ps_collective_names[kind], ps_dtype_name(t), d, e);
        free(c[d].src.data);
        free(c[d].dst.data);
        free(want[d].data);
    }
    b->ops->destroy(b);
}

/* check_collective_in in fp32. */
static void check_collective(ps_collective kind, int64_t (*src_box)(int, int, int64_t *),
                             int64_t (*dst_box)(int, int, int64_t *), bool in_place)
{
    check_collective_in(PS_DTYPE_F32, kind, src_box, dst_box, in_place, false);
}

/* Boxes of the [8, 12] tensor: whole, row blocks, column blocks. */
static int64_t box_whole(int dev, int dim, int64_t *lo)
{
    (void)dev;
    *lo = 0;
    return dim == 0 ? 8 : 12;
}

static int64_t box_rows(int dev, int dim, int64_t *lo)
{
    *lo = dim == 0 ? 2 * dev : 0;
    return dim == 0 ? 2 : 12;
}

static int64_t box_cols(int dev, int dim, int64_t *lo)
{
    *lo = dim == 1 ? 3 * dev : 0;
    return dim == 1 ? 3 : 8;
}

static void backend_collectives(void **state)
{
    (void)state;
    check_collective(PS_COLL_ALL_REDUCE, box_whole, box_whole, false);
    check_collective(PS_COLL_ALL_REDUCE, box_whole, box_whole, true);
    check_collective(PS_COLL_ALL_REDUCE, box_whole, box_rows, false);
    check_collective(PS_COLL_REDUCE_SCATTER, box_whole, box_rows, false);
    check_collective(PS_COLL_REDUCE_SCATTER, box_whole, box_cols, false);
    check_collective(PS_COLL_ALL_GATHER, box_rows, box_whole, false);
    check_collective(PS_COLL_ALL_GATHER, box_cols, box_whole, false);
    check_collective(PS_COLL_ALL_TO_ALL, box_rows, box_cols, false);
    check_collective(PS_COLL_ALL_TO_ALL, box_cols, box_rows, false);
    /* groups of one on every device at once (an axis of size one): each
     * its own src, no rendezvous shared through the group id -1 */
    check_collective_in(PS_DTYPE_F32, PS_COLL_ALL_REDUCE, box_whole, box_whole, false, true);
    check_collective_in(PS_DTYPE_F32, PS_COLL_ALL_GATHER, box_rows, box_rows, false, true);
    check_collective_in(PS_DTYPE_BF16, PS_COLL_ALL_REDUCE, box_whole, box_whole, true, true);
    /* held in 2 bytes: widened, combined in fp32, rounded once */
    const ps_dtype half[2] = {PS_DTYPE_BF16, PS_DTYPE_F16};
    for (int k = 0; k < 2; k++) {
        check_collective_in(half[k], PS_COLL_ALL_REDUCE, box_whole, box_whole, true, false);
        check_collective_in(half[k], PS_COLL_ALL_REDUCE, box_whole, box_rows, false, false);
        check_collective_in(half[k], PS_COLL_REDUCE_SCATTER, box_whole, box_cols, false, false);
        check_collective_in(half[k], PS_COLL_ALL_GATHER, box_rows, box_whole, false, false);
        check_collective_in(half[k], PS_COLL_ALL_TO_ALL, box_rows, box_cols, false, false);
    }
}

typedef struct red_dev {
    ps_backend *b;
    int device;
    float host[100];
    double host64[100]; /* dbl: reduce64's values */
    bool dbl;
    ps_reduce_op op;
    ps_status st;
    char msg[PS_ERROR_MSG_MAX];
} red_dev;

static void *reduce_thread(void *p)
{
    red_dev *r = p;
    ps_backend *b = r->b;
    ps_error err = {0};
    ps_exec_group g = {5, NDEV, all_devices, r->device};
    void *dp = NULL, *host = r->dbl ? (void *)r->host64 : (void *)r->host;
    size_t bytes = r->dbl ? sizeof r->host64 : sizeof r->host;
    r->st = b->ops->alloc(b, r->device, bytes, &dp, &err);
    if (r->st == PS_OK)
        r->st = b->ops->upload(b, r->device, dp, host, bytes, &err);
    if (r->st == PS_OK)
        r->st = r->dbl ? b->ops->reduce64(b, r->device, &g, dp, 100, r->op, &err)
                       : b->ops->reduce(b, r->device, &g, dp, 100, r->op, &err);
    if (r->st == PS_OK)
        r->st = b->ops->download(b, r->device, host, dp, bytes, &err);
    if (r->st != PS_OK)
        b->ops->abort(b);
    snprintf(r->msg, sizeof r->msg, "%s", err.msg);
    b->ops->release(b, r->device, dp);
    return NULL;
}

/* The in-place all-reduce in float (reduce) and in double (reduce64, whose
 * values keep what a float would round away: 1 + k 2^-40). */
static void backend_reduce(void **state)
{
    (void)state;
    for (int run = 0; run < 4; run++) {
        bool mx = run & 1, dbl = run >= 2;
        ps_backend *b = backend(NDEV, !on_gpus);
        assert_non_null(b->ops->reduce64);
        red_dev r[NDEV];
        float want[100];
        double want64[100];
        for (int i = 0; i < 100; i++) {
            want[i] = mx ? -INFINITY : 0;
            want64[i] = mx ? -INFINITY : 0;
        }
        for (int d = 0; d < NDEV; d++) {
            memset(&r[d], 0, sizeof r[d]);
            r[d].b = b;
            r[d].device = d;
            r[d].dbl = dbl;
            r[d].op = mx ? PS_REDUCE_OP_MAX : PS_REDUCE_OP_SUM;
            for (int i = 0; i < 100; i++) {
                r[d].host[i] = (float)(2 * uniform() - 1);
                r[d].host64[i] = 1 + (double)(i + d) * 0x1p-40;
                want[i] = mx ? fmaxf(want[i], r[d].host[i]) : want[i] + r[d].host[i];
                want64[i] = mx ? fmax(want64[i], r[d].host64[i]) : want64[i] + r[d].host64[i];
            }
        }
        run_threads(reduce_thread, r, sizeof r[0]);
        for (int d = 0; d < NDEV; d++) {
            if (r[d].st != PS_OK)
                fail_msg("reduce%s, device %d: %s", dbl ? "64" : "", d, r[d].msg);
            if (dbl) {
                /* the sums are exact in double (small integers times 2^-40
                 * and NDEV), whatever the order */
                for (int i = 0; i < 100; i++)
                    if (r[d].host64[i] != want64[i])
                        fail_msg("reduce64 (%s), device %d, element %d: %.17g, want %.17g",
                                 mx ? "max" : "sum", d, i, r[d].host64[i], want64[i]);
            } else {
                assert_true(nmse(r[d].host, want, 100) <= 1e-12);
                /* members combine in one order: identical everywhere */
                assert_memory_equal(r[d].host, r[0].host, sizeof want);
            }
        }
        b->ops->destroy(b);
    }
}

/* Device d sends the box rows 1..6, columns 2..10 of its tile (rows 0..7 of
 * a [16, 12] tensor) in three chunks to device d + 1, which receives them
 * into the same box of its own tile (rows 1..7). */
typedef struct p2p_dev {
    ps_backend *b;
    int device;
    ps_tile src, dst; /* host, floats */
    ps_dtype half;    /* PS_DTYPE_F32, or held in 2 bytes as this type */
    ps_status st;
    char msg[PS_ERROR_MSG_MAX];
} p2p_dev;

static const int64_t p2p_box_off[2] = {1, 2}, p2p_box_size[2] = {6, 9};

static void *p2p_thread(void *p)
{
    p2p_dev *c = p;
    ps_backend *b = c->b;
    ps_error err = {0};
    bool half = c->half != PS_DTYPE_F32;
    ps_tile hsrc = host_as(&c->src, half, c->half), hdst = host_as(&c->dst, half, c->half);
    ps_tile src = hsrc, dst = hdst;
    int to = (c->device + 1) % NDEV, from = (c->device + NDEV - 1) % NDEV;
    c->st = b->ops->alloc(b, c->device, (int64_t)tile_bytes(&src), &src.data, &err);
    if (c->st == PS_OK)
        c->st = b->ops->alloc(b, c->device, (int64_t)tile_bytes(&dst), &dst.data, &err);
    if (c->st == PS_OK)
        c->st = b->ops->upload(b, c->device, src.data, hsrc.data, (int64_t)tile_bytes(&src),
                               &err);
    if (c->st == PS_OK)
        c->st = b->ops->upload(b, c->device, dst.data, hdst.data, (int64_t)tile_bytes(&dst),
                               &err);
    for (int k = 0; k < 3 && c->st == PS_OK; k++)
        c->st = b->ops->send(b, c->device, to, &src, p2p_box_off, p2p_box_size, k, 3, &err);
    for (int k = 0; k < 3 && c->st == PS_OK; k++)
        c->st = b->ops->recv(b, c->device, from, &dst, p2p_box_off, p2p_box_size, k, 3, &err);
    if (c->st == PS_OK)
        c->st = b->ops->download(b, c->device, hdst.data, dst.data, (int64_t)tile_bytes(&dst),
                                 &err);
    if (c->st == PS_OK) {
        float *f = host_floats(&hdst);
        memcpy(c->dst.data, f, (size_t)ps_tile_numel(&dst) * sizeof *f);
        free(f);
    }
    if (c->st != PS_OK)
        b->ops->abort(b);
    snprintf(c->msg, sizeof c->msg, "%s", err.msg);
    b->ops->release(b, c->device, src.data);
    b->ops->release(b, c->device, dst.data);
    free(hsrc.data);
    free(hdst.data);
    return NULL;
}

/* Chunks of a box sent around a ring of four devices, in fp32 and held in
 * bf16 and fp16 (values representable there: the copy is exact). */
static void backend_send_recv(void **state)
{
    (void)state;
    const ps_dtype types[3] = {PS_DTYPE_F32, PS_DTYPE_BF16, PS_DTYPE_F16};
    for (int ti = 0; ti < 3; ti++) {
        ps_dtype t = types[ti];
        ps_backend *b = backend(NDEV, !on_gpus);
        p2p_dev c[NDEV];
        /* src: rows 0..7 of a [16, 12] tensor; dst: rows 1..7 (offset 1) */
        const int64_t g[2] = {16, 12};
        for (int d = 0; d < NDEV; d++) {
            memset(&c[d], 0, sizeof c[d]);
            c[d].b = b;
            c[d].device = d;
            c[d].half = t;
            c[d].src = hrand(2, (const int64_t[]){8, 12}, g, (const int64_t[]){0, 0});
            c[d].dst = hrand(2, (const int64_t[]){7, 12}, g, (const int64_t[]){1, 0});
            round_to(&c[d].src, t);
            round_to(&c[d].dst, t);
        }
        ps_tile want[NDEV];
        for (int d = 0; d < NDEV; d++) {
            const ps_tile *from = &c[(d + NDEV - 1) % NDEV].src;
            want[d] = hcopy(&c[d].dst);
            int64_t coord[2];
            for (int64_t i = 0; i < ps_tile_numel(&want[d]); i++) {
                coord_of(&want[d], i, coord);
                bool in_box = true;
                for (int k = 0; k < 2; k++)
                    in_box = in_box && coord[k] >= p2p_box_off[k] &&
                             coord[k] < p2p_box_off[k] + p2p_box_size[k];
                if (in_box)
                    ((float *)want[d].data)[i] = host_at(from, coord);
            }
        }
        run_threads(p2p_thread, c, sizeof c[0]);
        for (int d = 0; d < NDEV; d++) {
            if (c[d].st != PS_OK)
                fail_msg("send/recv in %s, device %d: %s", ps_dtype_name(t), d, c[d].msg);
            assert_memory_equal(c[d].dst.data, want[d].data,
                                (size_t)ps_tile_numel(&want[d]) * 4);
            free(c[d].src.data);
            free(c[d].dst.data);
            free(want[d].data);
        }
        b->ops->destroy(b);
    }
}

/* The same on four GPUs, where the machine has them. */
static void backend_nccl(void **state)
{
    (void)state;
    if (ps_cuda_device_count() < NDEV) {
        print_message("fewer than %d GPUs: the NCCL path is not tested here\n", NDEV);
        skip();
    }
    on_gpus = true;
    backend_collectives(state);
    backend_reduce(state);
    backend_send_recv(state);
    on_gpus = false;
}

/* A collective that fails on device 2: every device thread returns an error
 * naming its device (the others see the abort), none hangs. */
static void backend_injected_failure(void **state)
{
    (void)state;
    ps_cuda_backend_options o = ps_cuda_backend_options_default();
    o.share_gpu = true;
    o.inject_collective_failure = true;
    o.inject_device = 2;
    ps_backend *b = NULL;
    ps_error err = {0};
    assert_int_equal(ps_cuda_backend_create(NDEV, 2, &o, &b, &err), PS_OK);
    coll_dev c[NDEV];
    const int64_t g[2] = {8, 12};
    for (int d = 0; d < NDEV; d++) {
        memset(&c[d], 0, sizeof c[d]);
        c[d].b = b;
        c[d].device = d;
        c[d].kind = PS_COLL_ALL_REDUCE;
        c[d].src = hrand(2, g, NULL, NULL);
        c[d].dst = hrand(2, g, NULL, NULL);
    }
    alarm(120); /* a hang fails the test instead of blocking it */
    run_threads(coll_thread, c, sizeof c[0]);
    alarm(0);
    for (int d = 0; d < NDEV; d++) {
        char want[32];
        snprintf(want, sizeof want, "device %d", d);
        assert_int_equal(c[d].st, PS_ERR_DEVICE);
        if (strstr(c[d].msg, want) == NULL)
            fail_msg("device %d's error does not name it: %s", d, c[d].msg);
        if (d == 2)
            assert_non_null(strstr(c[d].msg, "injected"));
        else
            assert_non_null(strstr(c[d].msg, "aborted"));
        free(c[d].src.data);
        free(c[d].dst.data);
    }
    b->ops->destroy(b);
}

int main(void)
{
    /* (the host-only checks of the GEMM and permute plans are CPU tests:
     * tests/test_gemm_plan.c, tests/test_permute_plan.c) */
    if (ps_cuda_device_count() == 0) {
        printf("no usable GPU: the CUDA tests are skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
#ifdef PS_HAVE_CPU_OPS
        cmocka_unit_test(ops_matmul),
        cmocka_unit_test(ops_elementwise),
        cmocka_unit_test(ops_norm_softmax),
        cmocka_unit_test(ops_embedding),
        cmocka_unit_test(ops_layout),
        cmocka_unit_test(ops_losses_adam),
        cmocka_unit_test(ops_deferred_checks),
        cmocka_unit_test(ops_xent_split_vocabulary),
        cmocka_unit_test(ops_cnn),
        cmocka_unit_test(ops_batchnorm_split_batch),
        cmocka_unit_test(ops_moe),
        cmocka_unit_test(ops_half_storage),
        cmocka_unit_test(backend_half_tiles),
#else
        cmocka_unit_test(ops_skipped),
#endif
        cmocka_unit_test(ops_errors),
        cmocka_unit_test(backend_memory),
        cmocka_unit_test(backend_check_memory),
        cmocka_unit_test(backend_reclaim),
        cmocka_unit_test(backend_timing_and_profile),
        cmocka_unit_test(backend_copy_box),
        cmocka_unit_test(backend_find_nonfinite),
        cmocka_unit_test(backend_collectives),
        cmocka_unit_test(backend_reduce),
        cmocka_unit_test(backend_send_recv),
        cmocka_unit_test(backend_injected_failure),
        cmocka_unit_test(backend_nccl),
    };
    return cmocka_run_group_tests_name("gpu", tests, NULL, NULL);
}
