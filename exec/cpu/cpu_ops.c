#include "exec/cpu/cpu_ops.h"

#include "exec/cpu/vec_exp.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- one call's state and its error reports ------------------------------ */

typedef struct run {
    const ps_op *op;
    const ps_op_attrs *a;
    const ps_tile *in;
    ps_tile *out;
    const ps_op_context *ctx; /* never NULL inside (a default stands in) */
    ps_error *err;
} run;

static ps_status op_fail(const run *r, ps_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "op "NAME" (kind): what is wrong" */
static ps_status op_fail(const run *r, ps_status st, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const ps_op_kind_info *info = ps_op_kind_get(r->op->kind);
    return ps_error_set(r->err, st, "op \"%s\" (%s): %s", r->op->name ? r->op->name : "?",
                        info ? info->name : "unknown", msg);
}

#define FAIL(...) return op_fail(r, PS_ERR_INVALID, __VA_ARGS__)

static float *fdata(const ps_tile *t) { return (float *)t->data; }
static int32_t *idata(const ps_tile *t) { return (int32_t *)t->data; }

/* Row-major strides of a tile's local extents, in elements. */
static void strides_of(const ps_tile *t, int64_t *s)
{
    int64_t acc = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        s[d] = acc;
        acc *= t->shape[d];
    }
}

static bool same_shape(const ps_tile *x, const ps_tile *y)
{
    if (x->rank != y->rank)
        return false;
    for (int d = 0; d < x->rank; d++)
        if (x->shape[d] != y->shape[d])
            return false;
    return true;
}

static const char *shape_str(const ps_tile *t, char *buf, int cap)
{
    int used = snprintf(buf, (size_t)cap, "[");
    for (int d = 0; d < t->rank && used < cap; d++)
        used += snprintf(buf + used, (size_t)(cap - used), "%s%lld", d ? ", " : "",
                         (long long)t->shape[d]);
    if (used < cap)
        snprintf(buf + used, (size_t)(cap - used), "]");
    return buf;
}

static ps_status need_same(const run *r, const ps_tile *x, const ps_tile *y, const char *xn,
                           const char *yn)
{
    if (same_shape(x, y))
        return PS_OK;
    char sx[160], sy[160];
    FAIL("tile shape mismatch: %s is %s but %s is %s", xn, shape_str(x, sx, sizeof sx), yn,
         shape_str(y, sy, sizeof sy));
}

static ps_status need_rank(const run *r, const ps_tile *t, int lo, int hi, const char *what)
{
    if (t->rank < lo || t->rank > hi)
        FAIL("%s must have rank %d to %d, has rank %d", what, lo, hi, t->rank);
    return PS_OK;
}

/* An output whose whole shape the op's `shape` attribute also states. */
static ps_status need_global(const run *r, const ps_tile *t, const char *what)
{
    const ps_op_attrs *a = r->a;
    bool same = a->shape_rank == t->rank;
    for (int d = 0; same && d < t->rank; d++)
        same = a->shape[d] == t->global[d];
    if (!same)
        FAIL("%s tile belongs to a tensor of another shape than the shape attribute", what);
    return PS_OK;
}

/* The op's own all-reduce over its group (a no-op for a group of 1). */
static ps_status group_reduce(const run *r, float *data, int64_t n, ps_reduce_op rop)
{
    const ps_op_reduce *g = &r->ctx->reduce;
    if (g->group_size <= 1)
        return PS_OK;
    if (g->fn == NULL)
        FAIL("a reduce group of %d devices without a reduce function", g->group_size);
    ps_status st = g->fn(g->arg, data, n, rop, r->err);
    if (st != PS_OK)
        return op_fail(r, st, "reduce over %d devices failed", g->group_size);
    return PS_OK;
}

/* The same in double precision where the backend has it; else through
 * floats (scratch: n floats). */
static ps_status group_reduce64(const run *r, double *data, float *scratch, int64_t n,
                                ps_reduce_op rop)
{
    const ps_op_reduce *g = &r->ctx->reduce;
    if (g->group_size <= 1)
        return PS_OK;
    if (g->fn64 != NULL) {
        ps_status st = g->fn64(g->arg, data, n, rop, r->err);
        if (st != PS_OK)
            return op_fail(r, st, "reduce over %d devices failed", g->group_size);
        return PS_OK;
    }
    for (int64_t i = 0; i < n; i++)
        scratch[i] = (float)data[i];
    ps_status st = group_reduce(r, scratch, n, rop);
    for (int64_t i = 0; i < n && st == PS_OK; i++)
        data[i] = scratch[i];
    return st;
}

/* ---- strided copies -------------------------------------------------------- */

/* An odometer over n dims with two running offsets (a and b), for copies and
 * reductions between layouts. */
typedef struct walk {
    int n;
    const int64_t *size;
    int64_t idx[PS_MAX_RANK];
    const int64_t *sa, *sb;
    int64_t a, b;
} walk;

static void walk_init(walk *w, int n, const int64_t *size, const int64_t *sa, const int64_t *sb)
{
    memset(w, 0, sizeof *w);
    w->n = n;
    w->size = size;
    w->sa = sa;
    w->sb = sb;
}

/* Advances every dim but the innermost (the caller loops over that one). */
static void walk_outer_next(walk *w)
{
    for (int d = w->n - 2; d >= 0; d--) {
        w->idx[d]++;
        w->a += w->sa[d];
        w->b += w->sb[d];
        if (w->idx[d] < w->size[d])
            return;
        w->a -= w->sa[d] * w->size[d];
        w->b -= w->sb[d] * w->size[d];
        w->idx[d] = 0;
    }
}

static int64_t prod(int n, const int64_t *size)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        p *= size[i];
    return p;
}

/* dst[walk b] = src[walk a] for 4-byte elements (float or int32). */
static void copy_strided(void *dst, const int64_t *dst_stride, const void *src,
                         const int64_t *src_stride, int n, const int64_t *size)
{
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (n == 0) {
        memcpy(d, s, 4);
        return;
    }
    int64_t total = prod(n, size), inner = size[n - 1];
    if (total == 0)
        return;
    int64_t is = src_stride[n - 1], id = dst_stride[n - 1];
    walk w;
    walk_init(&w, n, size, src_stride, dst_stride);
    for (int64_t done = 0; done < total; done += inner) {
        for (int64_t j = 0; j < inner; j++)
            memcpy(d + 4 * (w.b + j * id), s + 4 * (w.a + j * is), 4);
        walk_outer_next(&w);
    }
}

/* ---- MATMUL: einsum through sgemm ------------------------------------------- */

/* The labels of one GEMM dimension group, fused into one matrix dimension
 * when their strides allow: len = product of sizes, stride of the innermost
 * label (-1 when every label has extent 1: any stride will do). */
static bool group_flat(int n, const int *lab, const int64_t *size, const int64_t *stride,
                       int64_t *len, int64_t *str)
{
    int64_t prev = -1;
    *len = 1;
    for (int i = 0; i < n; i++) {
        int l = lab[i];
        if (size[l] == 1)
            continue;
        if (prev >= 0 && prev != stride[l] * size[l])
            return false;
        prev = stride[l];
        *len *= size[l];
    }
    *str = prev;
    return true;
}

/* A rows x cols view of an operand for sgemm: row-major (trans false, element
 * (i, j) at i * ld + j) or its transpose (element at j * ld + i). */
static bool mat_view(int nr, const int *rl, int nc, const int *cl, const int64_t *size,
                     const int64_t *stride, bool *trans, int64_t *ld)
{
    int64_t R, sr, C, sc;
    if (!group_flat(nr, rl, size, stride, &R, &sr) || !group_flat(nc, cl, size, stride, &C, &sc))
        return false;
    if (C == 1 || sc == 1) {
        *trans = false;
        *ld = R == 1 ? C : sr;
        return *ld >= C;
    }
    if (R == 1 || sr == 1) {
        *trans = true;
        *ld = C == 1 ? R : sc;
        return *ld >= R;
    }
    return false;
}

/* One operand (or the output) of the batched GEMM: its base, whether it is
 * transposed, its leading dim, its stride per batch label, and a packed copy
 * when its layout cannot be viewed as a matrix. */
typedef struct mm_operand {
    float *base;
    bool trans;
    int64_t ld;
    int64_t bstride[PS_MAX_RANK];
    float *packed; /* owned, or NULL */
    int64_t pstride[3 * PS_MAX_RANK]; /* the original strides, for scatter back */
} mm_operand;

/* Views (or packs into [batch..., rows..., cols...]) one operand. */
static ps_status mm_prepare(const run *r, mm_operand *o, float *data, const int64_t *stride,
                            int nb, const int *bl, int nr, const int *rl, int nc, const int *cl,
                            const int64_t *size, bool copy_in)
{
    memset(o, 0, sizeof *o);
    o->base = data;
    if (mat_view(nr, rl, nc, cl, size, stride, &o->trans, &o->ld)) {
        for (int i = 0; i < nb; i++)
            o->bstride[i] = stride[bl[i]];
        return PS_OK;
    }
    int n = 0;
    int64_t dims[3 * PS_MAX_RANK], dst[3 * PS_MAX_RANK];
    const int *groups[3] = {bl, rl, cl};
    int counts[3] = {nb, nr, nc};
    for (int g = 0; g < 3; g++)
        for (int i = 0; i < counts[g]; i++) {
            dims[n] = size[groups[g][i]];
            o->pstride[n] = stride[groups[g][i]];
            n++;
        }
    int64_t acc = 1;
    for (int i = n - 1; i >= 0; i--) {
        dst[i] = acc;
        acc *= dims[i];
    }
    o->packed = malloc((size_t)acc * sizeof(float));
    if (o->packed == NULL)
        return op_fail(r, PS_ERR_NOMEM, "out of memory packing a matmul operand");
    if (copy_in)
        copy_strided(o->packed, dst, data, o->pstride, n, dims);
    o->base = o->packed;
    o->trans = false;
    o->ld = prod(nc, dims + nb + nr);
    for (int i = 0; i < nb; i++)
        o->bstride[i] = dst[i];
    return PS_OK;
}

/* C = A B, or C += A B with beta 1 */
static void gemm(const mm_operand *A, const mm_operand *B, mm_operand *C, int64_t oa, int64_t ob,
                 int64_t oc, int M, int N, int K, float beta)
{
    CBLAS_TRANSPOSE ta = A->trans ? CblasTrans : CblasNoTrans;
    CBLAS_TRANSPOSE tb = B->trans ? CblasTrans : CblasNoTrans;
    if (!C->trans) {
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A->base + oa, (int)A->ld, B->base + ob,
                    (int)B->ld, beta, C->base + oc, (int)C->ld);
    } else {
        /* C stored transposed: C^T = op(B)^T op(A)^T */
        CBLAS_TRANSPOSE nta = A->trans ? CblasNoTrans : CblasTrans;
        CBLAS_TRANSPOSE ntb = B->trans ? CblasNoTrans : CblasTrans;
        cblas_sgemm(CblasRowMajor, ntb, nta, N, M, K, 1.0f, B->base + ob, (int)B->ld,
                    A->base + oa, (int)A->ld, beta, C->base + oc, (int)C->ld);
    }
}

static ps_status op_matmul(const run *r)
{
    ps_status st = PS_OK;
    ps_einsum e;
    ps_error perr = {0};
    const ps_tile *t[3] = {&r->in[0], &r->in[1], &r->out[0]};
    mm_operand opd[3];
    memset(opd, 0, sizeof opd);
    if (ps_einsum_parse(r->a->einsum, &e, &perr) != PS_OK)
        FAIL("%s", perr.msg);
    int64_t size[26] = {0}, str[3][26];
    bool seen[26] = {false};
    for (int o = 0; o < 3; o++) {
        if (t[o]->rank != e.rank[o])
            FAIL("einsum \"%s\": %s has rank %d but %d labels", r->a->einsum,
                 o == 2 ? "the output" : o ? "operand 1" : "operand 0", t[o]->rank, e.rank[o]);
        int64_t s[PS_MAX_RANK];
        strides_of(t[o], s);
        for (int i = 0; i < e.rank[o]; i++) {
            int l = e.labels[o][i] - 'a';
            if (seen[l] && size[l] != t[o]->shape[i])
                FAIL("einsum \"%s\": tile extent mismatch for label '%c' (%lld vs %lld)",
                     r->a->einsum, e.labels[o][i], (long long)size[l],
                     (long long)t[o]->shape[i]);
            seen[l] = true;
            size[l] = t[o]->shape[i];
            str[o][l] = s[i];
        }
    }
    /* batch: in a, b and out; m: a and out; n: b and out; k: a and b only */
    int bl[PS_MAX_RANK], ml[PS_MAX_RANK], nl[PS_MAX_RANK], kl[PS_MAX_RANK];
    int nb = 0, nm = 0, nn = 0, nk = 0;
    for (int i = 0; i < e.rank[2]; i++) {
        char c = e.labels[2][i];
        bool ia = memchr(e.labels[0], c, (size_t)e.rank[0]) != NULL;
        bool ib = memchr(e.labels[1], c, (size_t)e.rank[1]) != NULL;
        int l = c - 'a';
        if (ia && ib)
            bl[nb++] = l;
        else if (ia)
            ml[nm++] = l;
        else
            nl[nn++] = l;
    }
    for (int i = 0; i < e.rank[0]; i++)
        if (memchr(e.labels[2], e.labels[0][i], (size_t)e.rank[2]) == NULL)
            kl[nk++] = e.labels[0][i] - 'a';
    int64_t bsz[PS_MAX_RANK];
    for (int i = 0; i < nb; i++)
        bsz[i] = size[bl[i]];
    int64_t Bn = prod(nb, bsz), M = 1, N = 1, K = 1;
    for (int i = 0; i < nm; i++)
        M *= size[ml[i]];
    for (int i = 0; i < nn; i++)
        N *= size[nl[i]];
    for (int i = 0; i < nk; i++)
        K *= size[kl[i]];
    bool add = (r->ctx->accumulate & 1u) != 0;
    if (Bn * M * N == 0)
        return PS_OK;
    if (K == 0) {
        if (!add)
            memset(fdata(t[2]), 0, (size_t)(Bn * M * N) * sizeof(float));
        return PS_OK;
    }
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return op_fail(r, PS_ERR_UNSUPPORTED, "a GEMM dimension exceeds the BLAS int range");
    PS_TRY(mm_prepare(r, &opd[0], fdata(t[0]), str[0], nb, bl, nm, ml, nk, kl, size, true));
    PS_TRY(mm_prepare(r, &opd[1], fdata(t[1]), str[1], nb, bl, nk, kl, nn, nl, size, true));
    PS_TRY(mm_prepare(r, &opd[2], fdata(t[2]), str[2], nb, bl, nm, ml, nn, nl, size, add));
    for (int o = 0; o < 3; o++)
        if (opd[o].ld > INT_MAX) {
            st = op_fail(r, PS_ERR_UNSUPPORTED, "a leading dimension exceeds the BLAS int range");
            goto out;
        }
    {
        int64_t idx[PS_MAX_RANK] = {0}, oa = 0, ob = 0, oc = 0;
        for (int64_t it = 0; it < Bn; it++) {
            gemm(&opd[0], &opd[1], &opd[2], oa, ob, oc, (int)M, (int)N, (int)K, add ? 1.0f : 0.0f);
            for (int d = nb - 1; d >= 0; d--) {
                idx[d]++;
                oa += opd[0].bstride[d];
                ob += opd[1].bstride[d];
                oc += opd[2].bstride[d];
                if (idx[d] < bsz[d])
                    break;
                oa -= opd[0].bstride[d] * bsz[d];
                ob -= opd[1].bstride[d] * bsz[d];
                oc -= opd[2].bstride[d] * bsz[d];
                idx[d] = 0;
            }
        }
    }
    if (opd[2].packed != NULL) {
        /* scatter [batch, m, n] back into the output's own label order */
        int n = 0;
        int64_t dims[3 * PS_MAX_RANK], src[3 * PS_MAX_RANK];
        const int *groups[3] = {bl, ml, nl};
        int counts[3] = {nb, nm, nn};
        for (int g = 0; g < 3; g++)
            for (int i = 0; i < counts[g]; i++)
                dims[n++] = size[groups[g][i]];
        int64_t acc = 1;
        for (int i = n - 1; i >= 0; i--) {
            src[i] = acc;
            acc *= dims[i];
        }
        copy_strided(fdata(t[2]), opd[2].pstride, opd[2].packed, src, n, dims);
    }
out:
    for (int o = 0; o < 3; o++)
        free(opd[o].packed);
    return st;
}

/* ---- elementwise ------------------------------------------------------------- */

static const double gelu_c = 0.7978845608028654; /* sqrt(2 / pi) */
static const double gelu_a = 0.044715;

/* Exponentials are taken EXP_CHUNK at a time through ps_exp_inplace (on
 * the stack: 2 KiB). */
enum { EXP_CHUNK = 256 };

static int64_t exp_chunk(int64_t from, int64_t n)
{
    return n - from < EXP_CHUNK ? n - from : EXP_CHUNK;
}

/* e[k] = exp(scale * p[k] - shift) for k < m */
static void exp_shifted(double *e, const float *p, int64_t m, double scale, double shift)
{
    for (int64_t k = 0; k < m; k++)
        e[k] = scale * p[k] - shift;
    ps_exp_inplace(e, m);
}

static ps_status op_elementwise(const run *r)
{
    ps_status st;
    const ps_tile *x = &r->in[0];
    ps_tile *y = &r->out[0];
    if (r->op->n_in == 2 && (st = need_same(r, x, &r->in[1], "input 0", "input 1")) != PS_OK)
        return st;
    if ((st = need_same(r, x, y, "input 0", "the output")) != PS_OK)
        return st;
    int64_t n = ps_tile_numel(x);
    const float *p = fdata(x), *q = r->op->n_in == 2 ? fdata(&r->in[1]) : NULL;
    float *o = fdata(y);
    switch (r->op->kind) {
    case PS_OP_ADD:
        if (r->ctx->accumulate & 1u) /* the sum rounded first, as added from a scratch tile */
            for (int64_t i = 0; i < n; i++)
                o[i] += p[i] + q[i];
        else
            for (int64_t i = 0; i < n; i++)
                o[i] = p[i] + q[i];
        break;
    /* Both operands loaded before the choice, so that it compiles to a
     * select rather than a branch: activations change sign at random, and
     * a mispredicted branch per element made these 6 times slower than on
     * data of one sign. NaN gives 0, as before. */
    case PS_OP_RELU:
        for (int64_t i = 0; i < n; i++) {
            float v = p[i];
            uint32_t bits;
            memcpy(&bits, &v, sizeof bits);
            bits &= -(uint32_t)(v > 0); /* v, or +0 (a NaN too) */
            memcpy(&o[i], &bits, sizeof bits);
        }
        break;
    case PS_OP_RELU_GRAD: /* (y, dy): the output is positive exactly where x was */
        for (int64_t i = 0; i < n; i++) {
            float v = p[i], g = q[i];
            o[i] = v > 0 ? g : 0.0f;
        }
        break;
    /* The tanh approximation, written with the logistic function:
     * 0.5 (1 + tanh(u)) = s = 1 / (1 + exp(-2u)) and 1 - tanh(u)^2 = 4 s (1 - s).
     * One exp instead of a tanh: 2.8 times faster, and as accurate as the
     * rounding to float (1 + tanh(u) cancelled for negative x, up to 32 ulp). */
    case PS_OP_GELU:
    case PS_OP_GELU_GRAD: /* (x, dy) */
        /* o may be p or q: each element is read before it is written */
        for (int64_t i0 = 0; i0 < n; i0 += EXP_CHUNK) {
            int64_t m = exp_chunk(i0, n);
            double e[EXP_CHUNK];
            for (int64_t k = 0; k < m; k++) {
                double v = p[i0 + k];
                double u = gelu_c * (v + gelu_a * v * v * v);
                e[k] = -2.0 * u;
            }
            ps_exp_inplace(e, m);
            if (r->op->kind == PS_OP_GELU)
                for (int64_t k = 0; k < m; k++)
                    o[i0 + k] = (float)(p[i0 + k] / (1.0 + e[k]));
            else
                for (int64_t k = 0; k < m; k++) {
                    double v = p[i0 + k];
                    double s = 1.0 / (1.0 + e[k]);
                    double d = s + 2.0 * v * s * (1.0 - s) * gelu_c * (1.0 + 3.0 * gelu_a * v * v);
                    o[i0 + k] = (float)(d * q[i0 + k]);
                }
        }
        break;
    default: break;
    }
    return PS_OK;
}

static ps_status op_bias_add(const run *r)
{
    ps_status st;
    const ps_tile *x = &r->in[0], *b = &r->in[1];
    if ((st = need_rank(r, x, 1, PS_MAX_RANK, "bias_add input")) != PS_OK ||
        (st = need_same(r, x, &r->out[0], "input", "the output")) != PS_OK)
        return st;
    int64_t n = x->shape[x->rank - 1];
    if (b->rank != 1 || b->shape[0] != n)
        FAIL("the bias tile must be [%lld] like the input's last dim", (long long)n);
    int64_t rows = n ? ps_tile_numel(x) / n : 0;
    const float *p = fdata(x), *bv = fdata(b);
    float *o = fdata(&r->out[0]);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < n; j++)
            o[i * n + j] = p[i * n + j] + bv[j];
    return PS_OK;
}

/* ---- LAYERNORM ------------------------------------------------------------------ */

static ps_status layernorm_check(const run *r, const ps_tile *x, const ps_tile *gamma,
                                 const ps_tile *other, int64_t *rows, int64_t *n)
{
    ps_status st;
    if ((st = need_rank(r, x, 1, PS_MAX_RANK, "layernorm input")) != PS_OK)
        return st;
    *n = x->shape[x->rank - 1];
    if (gamma->rank != 1 || gamma->shape[0] != *n)
        FAIL("gamma must be [%lld] like the input's last dim", (long long)*n);
    if (other != NULL && (other->rank != 1 || other->shape[0] != *n))
        FAIL("beta must be [%lld] like the input's last dim", (long long)*n);
    if (x->shape[x->rank - 1] != x->global[x->rank - 1])
        return op_fail(r, PS_ERR_UNSUPPORTED, "the normalized (last) dim must not be split");
    *rows = *n ? ps_tile_numel(x) / *n : 0;
    return PS_OK;
}

/* Mean and 1/sqrt(var + eps) of one row. */
static void row_stats(const float *x, int64_t n, double eps, double *mean, double *rstd)
{
    double s = 0, q = 0;
    for (int64_t j = 0; j < n; j++)
        s += x[j];
    double m = n ? s / (double)n : 0;
    for (int64_t j = 0; j < n; j++)
        q += (x[j] - m) * (x[j] - m);
    *mean = m;
    *rstd = 1.0 / sqrt((n ? q / (double)n : 0) + eps);
}

static ps_status op_layernorm(const run *r)
{
    ps_status st;
    int64_t rows, n;
    const ps_tile *x = &r->in[0];
    if ((st = layernorm_check(r, x, &r->in[1], &r->in[2], &rows, &n)) != PS_OK ||
        (st = need_same(r, x, &r->out[0], "input", "the output")) != PS_OK)
        return st;
    const float *g = fdata(&r->in[1]), *b = fdata(&r->in[2]);
    for (int64_t i = 0; i < rows; i++) {
        const float *p = fdata(x) + i * n;
        float *o = fdata(&r->out[0]) + i * n;
        double mean, rstd;
        row_stats(p, n, r->a->eps, &mean, &rstd);
        for (int64_t j = 0; j < n; j++)
            o[j] = (float)((p[j] - mean) * rstd * g[j] + b[j]);
    }
    return PS_OK;
}

/* (x, gamma, dy) -> dx, dgamma, dbeta (the last two: sums over local rows) */
static ps_status op_layernorm_grad(const run *r)
{
    ps_status st;
    int64_t rows, n;
    const ps_tile *x = &r->in[0], *dy = &r->in[2];
    if ((st = layernorm_check(r, x, &r->in[1], NULL, &rows, &n)) != PS_OK ||
        (st = need_same(r, x, dy, "input", "the output gradient")) != PS_OK ||
        (st = need_same(r, x, &r->out[0], "input", "dx")) != PS_OK ||
        (st = need_same(r, &r->in[1], &r->out[1], "gamma", "dgamma")) != PS_OK ||
        (st = need_same(r, &r->in[1], &r->out[2], "gamma", "dbeta")) != PS_OK)
        return st;
    double *acc = calloc((size_t)(2 * n + 1), sizeof *acc);
    if (acc == NULL)
        return op_fail(r, PS_ERR_NOMEM, "out of memory");
    double *dg = acc, *db = acc + n;
    const float *g = fdata(&r->in[1]);
    for (int64_t i = 0; i < rows; i++) {
        const float *p = fdata(x) + i * n, *d = fdata(dy) + i * n;
        float *o = fdata(&r->out[0]) + i * n;
        double mean, rstd, sg = 0, sgx = 0;
        row_stats(p, n, r->a->eps, &mean, &rstd);
        for (int64_t j = 0; j < n; j++) {
            double xh = (p[j] - mean) * rstd;
            sg += d[j] * g[j];
            sgx += d[j] * g[j] * xh;
            dg[j] += d[j] * xh;
            db[j] += d[j];
        }
        sg /= (double)n;
        sgx /= (double)n;
        for (int64_t j = 0; j < n; j++) {
            double xh = (p[j] - mean) * rstd;
            o[j] = (float)(rstd * (d[j] * g[j] - sg - xh * sgx));
        }
    }
    for (int64_t j = 0; j < n; j++) {
        fdata(&r->out[1])[j] = (float)dg[j];
        fdata(&r->out[2])[j] = (float)db[j];
    }
    free(acc);
    return PS_OK;
}

/* ---- SOFTMAX -------------------------------------------------------------------- */

static ps_status softmax_check(const run *r, const ps_tile *x)
{
    ps_status st;
    if ((st = need_rank(r, x, r->a->causal ? 2 : 1, PS_MAX_RANK, "softmax input")) != PS_OK)
        return st;
    if (!(r->a->scale > 0))
        FAIL("scale must be positive");
    if (x->shape[x->rank - 1] != x->global[x->rank - 1])
        return op_fail(r, PS_ERR_UNSUPPORTED, "the softmax (last) dim must not be split");
    return PS_OK;
}

static ps_status op_softmax(const run *r)
{
    ps_status st;
    const ps_tile *x = &r->in[0];
    if ((st = softmax_check(r, x)) != PS_OK ||
        (st = need_same(r, x, &r->out[0], "input", "the output")) != PS_OK)
        return st;
    int R = x->rank;
    int64_t n = x->shape[R - 1], rows = n ? ps_tile_numel(x) / n : 0;
    int64_t nq = R >= 2 ? x->shape[R - 2] : 1;
    double scale = r->a->scale;
    /* a row's exponentials, kept in double: one exp per element */
    double *e = malloc((size_t)(n > 0 ? n : 1) * sizeof *e);
    if (e == NULL)
        return op_fail(r, PS_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < rows; i++) {
        const float *p = fdata(x) + i * n;
        float *o = fdata(&r->out[0]) + i * n;
        /* keys 0 .. valid-1 (local) take part; the causal mask is global */
        int64_t valid = n;
        if (r->a->causal) {
            int64_t q = x->offset[R - 2] + i % nq;
            valid = q - x->offset[R - 1] + 1;
            valid = valid < 0 ? 0 : valid > n ? n : valid;
        }
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < valid; j++)
            mx = fmax(mx, scale * p[j]);
        exp_shifted(e, p, valid, scale, mx);
        for (int64_t j = 0; j < valid; j++)
            s += e[j];
        for (int64_t j = 0; j < n; j++)
            o[j] = j < valid ? (float)(e[j] / s) : 0.0f;
    }
    free(e);
    return PS_OK;
}

/* (y, dy) -> dx = scale * y * (dy - sum(y * dy)); masked entries have y = 0. */
static ps_status op_softmax_grad(const run *r)
{
    ps_status st;
    const ps_tile *y = &r->in[0], *dy = &r->in[1];
    if ((st = softmax_check(r, y)) != PS_OK ||
        (st = need_same(r, y, dy, "the softmax output", "its gradient")) != PS_OK ||
        (st = need_same(r, y, &r->out[0], "the softmax output", "dx")) != PS_OK)
        return st;
    int64_t n = y->shape[y->rank - 1], rows = n ? ps_tile_numel(y) / n : 0;
    for (int64_t i = 0; i < rows; i++) {
        const float *p = fdata(y) + i * n, *d = fdata(dy) + i * n;
        float *o = fdata(&r->out[0]) + i * n;
        double s = 0;
        for (int64_t j = 0; j < n; j++)
            s += (double)p[j] * d[j];
        for (int64_t j = 0; j < n; j++)
            o[j] = (float)(r->a->scale * p[j] * (d[j] - s));
    }
    return PS_OK;
}

/* ---- EMBEDDING ------------------------------------------------------------------ */

/* table [v, h] tile, ids [...] tile, y [..., h] tile */
static ps_status embedding_check(const run *r, const ps_tile *table, const ps_tile *ids,
                                 const ps_tile *y)
{
    if (table->rank != 2)
        FAIL("the table must have rank 2, has rank %d", table->rank);
    if (ids->rank > PS_MAX_RANK - 1 || y->rank != ids->rank + 1)
        FAIL("the embedded tile must have the ids' rank + 1");
    for (int d = 0; d < ids->rank; d++)
        if (ids->shape[d] != y->shape[d])
            FAIL("the ids tile and the embedded tile differ in dim %d", d);
    if (y->shape[y->rank - 1] != table->shape[1] || y->offset[y->rank - 1] != table->offset[1])
        FAIL("the embedded tile holds columns %lld..+%lld, the table tile %lld..+%lld",
             (long long)y->offset[y->rank - 1], (long long)y->shape[y->rank - 1],
             (long long)table->offset[1], (long long)table->shape[1]);
    return PS_OK;
}

static ps_status op_embedding(const run *r)
{
    ps_status st;
    const ps_tile *table = &r->in[0], *ids = &r->in[1];
    ps_tile *y = &r->out[0];
    if ((st = embedding_check(r, table, ids, y)) != PS_OK)
        return st;
    int64_t h = table->shape[1], rows = table->shape[0], lo = table->offset[0];
    int64_t n = ps_tile_numel(ids), bad = -1;
    for (int64_t t = 0; t < n; t++) {
        int64_t id = idata(ids)[t];
        float *o = fdata(y) + t * h;
        if (id < 0 || id >= table->global[0])
            bad = t;
        if (id >= lo && id < lo + rows)
            memcpy(o, fdata(table) + (id - lo) * h, (size_t)h * sizeof(float));
        else
            memset(o, 0, (size_t)h * sizeof(float));
    }
    if (bad >= 0)
        FAIL("id %lld is outside the vocabulary of %lld", (long long)idata(ids)[bad],
             (long long)table->global[0]);
    return PS_OK;
}

/* (ids, dy) -> dtable tile: dy rows added into the local rows. */
static ps_status op_embedding_grad(const run *r)
{
    ps_status st;
    const ps_tile *ids = &r->in[0], *dy = &r->in[1];
    ps_tile *dt = &r->out[0];
    if ((st = embedding_check(r, dt, ids, dy)) != PS_OK ||
        (st = need_global(r, dt, "the table gradient")) != PS_OK)
        return st;
    int64_t h = dt->shape[1], rows = dt->shape[0], lo = dt->offset[0];
    int64_t n = ps_tile_numel(ids);
    if (!(r->ctx->accumulate & 1u))
        memset(fdata(dt), 0, (size_t)(rows * h) * sizeof(float));
    for (int64_t t = 0; t < n; t++) {
        int64_t id = idata(ids)[t];
        if (id < 0 || id >= dt->global[0])
            FAIL("id %lld is outside the vocabulary of %lld", (long long)id,
                 (long long)dt->global[0]);
        if (id < lo || id >= lo + rows)
            continue;
        float *o = fdata(dt) + (id - lo) * h;
        const float *d = fdata(dy) + t * h;
        for (int64_t j = 0; j < h; j++)
            o[j] += d[j];
    }
    return PS_OK;
}

/* ---- layout ops ----------------------------------------------------------------- */

static ps_status op_reshape(const run *r)
{
    const ps_tile *x = &r->in[0];
    ps_tile *y = &r->out[0];
    if (ps_tile_numel(x) != ps_tile_numel(y))
        FAIL("the tiles hold %lld and %lld elements", (long long)ps_tile_numel(x),
             (long long)ps_tile_numel(y));
    if (y->data != x->data)
        memmove(y->data, x->data, (size_t)ps_tile_numel(x) * 4);
    return PS_OK;
}

static ps_status op_transpose(const run *r)
{
    const ps_tile *x = &r->in[0];
    ps_tile *y = &r->out[0];
    if (x->rank != y->rank)
        FAIL("input rank %d, output rank %d", x->rank, y->rank);
    bool seen[PS_MAX_RANK] = {false};
    int64_t xs[PS_MAX_RANK], ys[PS_MAX_RANK], src[PS_MAX_RANK];
    strides_of(x, xs);
    strides_of(y, ys);
    for (int i = 0; i < x->rank; i++) {
        int p = r->a->perm[i];
        if (p < 0 || p >= x->rank || seen[p])
            FAIL("perm is not a permutation of 0..%d", x->rank - 1);
        seen[p] = true;
        if (y->shape[i] != x->shape[p])
            FAIL("output dim %d has extent %lld, input dim %d %lld", i, (long long)y->shape[i],
                 p, (long long)x->shape[p]);
        src[i] = xs[p];
    }
    copy_strided(y->data, ys, x->data, src, y->rank, y->shape);
    return PS_OK;
}

/* The dims of `full` that `axes` removes must leave `part`'s shape; returns
 * the global element count of the removed dims. */
static ps_status reduce_check(const run *r, const ps_tile *full, const ps_tile *part,
                              double *count)
{
    uint32_t axes = r->a->axes;
    if (axes == 0 || (full->rank < 32 && (axes >> full->rank) != 0))
        FAIL("reduction axes 0x%x do not fit rank %d", axes, full->rank);
    int k = 0;
    *count = 1;
    for (int d = 0; d < full->rank; d++) {
        if (axes & (1u << d)) {
            *count *= (double)full->global[d];
            continue;
        }
        if (k >= part->rank || part->shape[k] != full->shape[d])
            FAIL("the reduced tile does not match the full tile without axes 0x%x", axes);
        k++;
    }
    if (k != part->rank)
        FAIL("the reduced tile has rank %d, expected %d", part->rank, k);
    return PS_OK;
}

/* Strides into the reduced tile for each dim of the full one (0 on axes). */
static void reduced_strides(const ps_tile *full, const ps_tile *part, uint32_t axes,
                            int64_t *s)
{
    int64_t ps[PS_MAX_RANK];
    strides_of(part, ps);
    int k = 0;
    for (int d = 0; d < full->rank; d++)
        s[d] = (axes & (1u << d)) ? 0 : ps[k++];
}

static ps_status op_reduce(const run *r)
{
    ps_status st;
    const ps_tile *x = &r->in[0];
    ps_tile *y = &r->out[0];
    double count;
    if ((st = reduce_check(r, x, y, &count)) != PS_OK)
        return st;
    int64_t ny = ps_tile_numel(y), nx = ps_tile_numel(x);
    double *acc = calloc((size_t)ny + 1, sizeof *acc);
    if (acc == NULL)
        return op_fail(r, PS_ERR_NOMEM, "out of memory");
    int64_t xs[PS_MAX_RANK], ys[PS_MAX_RANK];
    strides_of(x, xs);
    reduced_strides(x, y, r->a->axes, ys);
    if (nx > 0) {
        int R = x->rank;
        int64_t inner = x->shape[R - 1], is = ys[R - 1];
        walk w;
        walk_init(&w, R, x->shape, xs, ys);
        for (int64_t done = 0; done < nx; done += inner) {
            const float *p = fdata(x) + w.a;
            for (int64_t j = 0; j < inner; j++)
                acc[w.b + j * is] += p[j];
            walk_outer_next(&w);
        }
    }
    double f = r->a->reduce == PS_REDUCE_MEAN ? 1.0 / count : 1.0;
    if (r->ctx->accumulate & 1u) /* the result rounded first, as added from a scratch tile */
        for (int64_t i = 0; i < ny; i++)
            fdata(y)[i] += (float)(acc[i] * f);
    else
        for (int64_t i = 0; i < ny; i++)
            fdata(y)[i] = (float)(acc[i] * f);
    free(acc);
    return PS_OK;
}

static ps_status op_broadcast(const run *r)
{
    ps_status st;
    const ps_tile *x = &r->in[0];
    ps_tile *y = &r->out[0];
    double count;
    if ((st = reduce_check(r, y, x, &count)) != PS_OK ||
        (st = need_global(r, y, "the output")) != PS_OK)
        return st;
    int64_t ny = ps_tile_numel(y);
    if (ny == 0)
        return PS_OK;
    int64_t xs[PS_MAX_RANK], ys[PS_MAX_RANK];
    strides_of(y, ys);
    reduced_strides(y, x, r->a->axes, xs);
    float f = r->a->reduce == PS_REDUCE_MEAN ? (float)(1.0 / count) : 1.0f;
    int R = y->rank;
    int64_t inner = y->shape[R - 1], is = xs[R - 1];
    walk w;
    walk_init(&w, R, y->shape, ys, xs);
    for (int64_t done = 0; done < ny; done += inner) {
        float *o = fdata(y) + w.a;
        for (int64_t j = 0; j < inner; j++)
            o[j] = fdata(x)[w.b + j * is] * f;
        walk_outer_next(&w);
    }
    return PS_OK;
}

/* ---- losses --------------------------------------------------------------------- */

static ps_status op_mse(const run *r, bool grad)
{
    ps_status st;
    const ps_tile *p = &r->in[0], *t = &r->in[1];
    ps_tile *y = &r->out[0];
    if ((st = need_same(r, p, t, "prediction", "target")) != PS_OK)
        return st;
    if (grad && (st = need_same(r, p, y, "prediction", "dpred")) != PS_OK)
        return st;
    if (!grad && ps_tile_numel(y) != 1)
        FAIL("the loss tile must hold one element");
    int64_t n = ps_tile_numel(p);
    double total = (double)ps_tile_global_numel(p);
    if (grad) {
        double f = 2.0 * r->a->scale / total; /* d(loss) = the loss scale */
        for (int64_t i = 0; i < n; i++)
            fdata(y)[i] = (float)(f * ((double)fdata(p)[i] - fdata(t)[i]));
        return PS_OK;
    }
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)fdata(p)[i] - fdata(t)[i];
        s += d * d;
    }
    fdata(y)[0] = (float)(s / total);
    return PS_OK;
}

/* SOFTMAX_XENT(_GRAD): logits [..., V] (V maybe split across the reduce
 * group), labels [...] int32 global vocabulary indices. */
static ps_status op_xent(const run *r, bool grad)
{
    ps_status st = PS_OK;
    const ps_tile *x = &r->in[0], *lab = &r->in[1];
    ps_tile *y = &r->out[0];
    int R = x->rank;
    if ((st = need_rank(r, x, 1, PS_MAX_RANK, "logits")) != PS_OK)
        return st;
    if (lab->rank != R - 1)
        FAIL("labels must have the logits' rank - 1");
    for (int d = 0; d < R - 1; d++)
        if (lab->shape[d] != x->shape[d])
            FAIL("the labels tile and the logits tile differ in dim %d", d);
    if (grad && (st = need_same(r, x, y, "logits", "dlogits")) != PS_OK)
        return st;
    if (!grad && ps_tile_numel(y) != 1)
        FAIL("the loss tile must hold one element");
    int64_t V = x->shape[R - 1], V0 = x->offset[R - 1], Vg = x->global[R - 1];
    if (r->ctx->reduce.group_size <= 1 && V != Vg)
        FAIL("the vocabulary is split (%lld of %lld) but the op has no reduce group",
             (long long)V, (long long)Vg);
    if (r->ctx->reduce.group_size > 1 && V == Vg)
        FAIL("a reduce group of %d devices but the vocabulary is whole",
             r->ctx->reduce.group_size);
    int64_t T = V ? ps_tile_numel(x) / V : 0;
    double tokens = (double)ps_tile_global_numel(lab);
    /* buf: per token max, then sum of exponentials and the label's logit */
    float *buf = malloc((size_t)(3 * T + 1) * sizeof(float));
    if (buf == NULL)
        return op_fail(r, PS_ERR_NOMEM, "out of memory");
    float *mx = buf, *sum = buf + T, *ll = buf + 2 * T;
    int64_t bad = -1;
    for (int64_t t = 0; t < T; t++) {
        const float *p = fdata(x) + t * V;
        float m = -INFINITY;
        for (int64_t j = 0; j < V; j++)
            m = p[j] > m ? p[j] : m;
        mx[t] = m;
    }
    PS_TRY(group_reduce(r, mx, T, PS_REDUCE_OP_MAX));
    for (int64_t t = 0; t < T; t++) {
        const float *p = fdata(x) + t * V;
        double s = 0;
        for (int64_t j0 = 0; j0 < V; j0 += EXP_CHUNK) {
            int64_t m = exp_chunk(j0, V);
            double e[EXP_CHUNK];
            exp_shifted(e, p + j0, m, 1.0, mx[t]);
            for (int64_t k = 0; k < m; k++)
                s += e[k];
        }
        sum[t] = (float)s;
        int64_t l = idata(lab)[t];
        if (l < 0 || l >= Vg)
            bad = t;
        ll[t] = l >= V0 && l < V0 + V ? p[l - V0] : 0.0f;
    }
    PS_TRY(group_reduce(r, sum, grad ? T : 2 * T, PS_REDUCE_OP_SUM));
    if (bad >= 0) {
        st = op_fail(r, PS_ERR_INVALID, "label %lld is outside the vocabulary of %lld",
                     (long long)idata(lab)[bad], (long long)Vg);
        goto out;
    }
    if (grad) {
        double seed = r->a->scale / tokens; /* d(loss) = the loss scale */
        for (int64_t t = 0; t < T; t++) {
            const float *p = fdata(x) + t * V;
            float *o = fdata(y) + t * V;
            int64_t l = idata(lab)[t] - V0;
            for (int64_t j0 = 0; j0 < V; j0 += EXP_CHUNK) {
                int64_t m = exp_chunk(j0, V);
                double e[EXP_CHUNK];
                exp_shifted(e, p + j0, m, 1.0, mx[t]);
                for (int64_t k = 0; k < m; k++) {
                    double sm = e[k] / sum[t];
                    o[j0 + k] = (float)((sm - (j0 + k == l ? 1.0 : 0.0)) * seed);
                }
            }
        }
    } else {
        double s = 0;
        for (int64_t t = 0; t < T; t++)
            s += (double)mx[t] + log((double)sum[t]) - ll[t];
        fdata(y)[0] = (float)(s / tokens);
    }
out:
    free(buf);
    return st;
}

/* ---- ADAM ----------------------------------------------------------------------- */

/* A gradient with inf or NaN: with a loss scale, fp16 overflowed; without
 * one, the step diverged. Either way the update would spread it. */
static ps_status nonfinite_gradient(const run *r, float value, int64_t index)
{
    const char *what = isnan(value) ? "NaN" : value > 0 ? "inf" : "-inf";
    if (r->a->scale > 1)
        FAIL("the gradient holds %s at element %lld of this tile at step %d: the loss "
             "scale %g overflowed it (lower --loss-scale)",
             what, (long long)index, r->ctx->step, r->a->scale);
    FAIL("the gradient holds %s at element %lld of this tile at step %d (the step diverged)",
         what, (long long)index, r->ctx->step);
}

static ps_status op_adam(const run *r)
{
    ps_status st;
    const ps_op_attrs *a = r->a;
    int n_in = r->op->n_in;
    for (int i = 1; i < n_in; i++)
        if ((st = need_same(r, &r->in[0], &r->in[i], "param", i == 1   ? "grad"
                                                              : i == 2 ? "m"
                                                              : i == 3 ? "v"
                                                                       : "master")) != PS_OK)
            return st;
    if (r->ctx->step < 1)
        FAIL("the optimizer step must be >= 1, is %d", r->ctx->step);
    if (!(a->lr > 0) || !(a->beta1 >= 0 && a->beta1 < 1) || !(a->beta2 >= 0 && a->beta2 < 1) ||
        !(a->adam_eps > 0) || !(a->weight_decay >= 0))
        FAIL("adam hyper-parameters out of range");
    if (!ps_loss_scale_valid(a->scale))
        FAIL("the loss scale %g is outside [2^-24, 2^40]", a->scale);
    double bc1 = 1.0 - pow(a->beta1, r->ctx->step), bc2 = 1.0 - pow(a->beta2, r->ctx->step);
    float *param = fdata(&r->in[0]), *m = fdata(&r->in[2]), *v = fdata(&r->in[3]);
    const float *g = fdata(&r->in[1]);
    float *p = n_in == 5 ? fdata(&r->in[4]) : param;
    int64_t n = ps_tile_numel(&r->in[0]);
    /* one pass first: a non-finite gradient leaves the state untouched (a
     * finite vote has looked already) */
    for (int64_t i = 0; i < n && !r->ctx->grads_checked; i++)
        if (!isfinite(g[i]))
            return nonfinite_gradient(r, g[i], i);
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i] / a->scale; /* unscaled; exact for a power of two */
        double mi = a->beta1 * m[i] + (1.0 - a->beta1) * gi;
        double vi = a->beta2 * v[i] + (1.0 - a->beta2) * gi * gi;
        m[i] = (float)mi;
        v[i] = (float)vi;
        double upd = (mi / bc1) / (sqrt(vi / bc2) + a->adam_eps);
        p[i] = (float)(p[i] - a->lr * (upd + a->weight_decay * p[i]));
        if (p != param)
            param[i] = p[i];
    }
    return PS_OK;
}

/* ---- CONV2D --------------------------------------------------------------------- */

typedef struct conv_geom {
    int64_t N, C, H, W, O, KH, KW, OH, OW;
    int sh, sw, ph, pw;
} conv_geom;

/* x [N, C, H, W], w [O, C, KH, KW], y [N, O, OH, OW] (all local extents) */
static ps_status conv_geometry(const run *r, const ps_tile *x, const ps_tile *w,
                               const ps_tile *y, conv_geom *c)
{
    if (x->rank != 4 || w->rank != 4 || y->rank != 4)
        FAIL("conv2d tiles must have rank 4 (NCHW, OCHW)");
    c->N = x->shape[0];
    c->C = x->shape[1];
    c->H = x->shape[2];
    c->W = x->shape[3];
    c->O = w->shape[0];
    c->KH = w->shape[2];
    c->KW = w->shape[3];
    c->sh = r->a->stride[0];
    c->sw = r->a->stride[1];
    c->ph = r->a->pad[0];
    c->pw = r->a->pad[1];
    if (c->sh < 1 || c->sw < 1 || c->ph < 0 || c->pw < 0)
        FAIL("stride must be >= 1 and padding >= 0");
    if (w->shape[1] != c->C)
        FAIL("the input tile has %lld channels, the filter tile %lld", (long long)c->C,
             (long long)w->shape[1]);
    if (c->H + 2 * c->ph < c->KH || c->W + 2 * c->pw < c->KW)
        FAIL("the filter does not fit the input tile");
    c->OH = (c->H + 2 * c->ph - c->KH) / c->sh + 1;
    c->OW = (c->W + 2 * c->pw - c->KW) / c->sw + 1;
    if (y->shape[0] != c->N || y->shape[1] != c->O || y->shape[2] != c->OH ||
        y->shape[3] != c->OW)
        FAIL("the output tile must be [%lld, %lld, %lld, %lld]", (long long)c->N,
             (long long)c->O, (long long)c->OH, (long long)c->OW);
    int64_t ckk = c->C * c->KH * c->KW, ohw = c->OH * c->OW;
    if (ckk > INT_MAX || ohw > INT_MAX || c->O > INT_MAX)
        return op_fail(r, PS_ERR_UNSUPPORTED, "a GEMM dimension exceeds the BLAS int range");
    return PS_OK;
}

/* col[(c*KH + i)*KW + j][oh*OW + ow] = x[c][oh*sh - ph + i][ow*sw - pw + j] (0 outside) */
static void im2col(const conv_geom *c, const float *x, float *col)
{
    for (int64_t ch = 0; ch < c->C; ch++)
        for (int64_t i = 0; i < c->KH; i++)
            for (int64_t j = 0; j < c->KW; j++) {
                float *row = col + ((ch * c->KH + i) * c->KW + j) * c->OH * c->OW;
                for (int64_t oh = 0; oh < c->OH; oh++) {
                    int64_t h = oh * c->sh - c->ph + i;
                    for (int64_t ow = 0; ow < c->OW; ow++) {
                        int64_t w = ow * c->sw - c->pw + j;
                        bool in = h >= 0 && h < c->H && w >= 0 && w < c->W;
                        row[oh * c->OW + ow] = in ? x[(ch * c->H + h) * c->W + w] : 0.0f;
                    }
                }
            }
}

/* The adjoint of im2col: dx += col scattered back. */
static void col2im_add(const conv_geom *c, const float *col, float *dx)
{
    for (int64_t ch = 0; ch < c->C; ch++)
        for (int64_t i = 0; i < c->KH; i++)
            for (int64_t j = 0; j < c->KW; j++) {
                const float *row = col + ((ch * c->KH + i) * c->KW + j) * c->OH * c->OW;
                for (int64_t oh = 0; oh < c->OH; oh++) {
                    int64_t h = oh * c->sh - c->ph + i;
                    if (h < 0 || h >= c->H)
                        continue;
                    for (int64_t ow = 0; ow < c->OW; ow++) {
                        int64_t w = ow * c->sw - c->pw + j;
                        if (w >= 0 && w < c->W)
                            dx[(ch * c->H + h) * c->W + w] += row[oh * c->OW + ow];
                    }
                }
            }
}

static ps_status op_conv(const run *r)
{
    ps_status st;
    conv_geom c;
    ps_op_kind kind = r->op->kind;
    /* name the x, w and y tiles of the forward conv in each of the three ops */
    const ps_tile *x = kind == PS_OP_CONV2D_GRAD_INPUT ? &r->out[0] : &r->in[0];
    const ps_tile *w = kind == PS_OP_CONV2D           ? &r->in[1]
                       : kind == PS_OP_CONV2D_GRAD_INPUT ? &r->in[1]
                                                          : &r->out[0];
    const ps_tile *y = kind == PS_OP_CONV2D ? &r->out[0]
                       : kind == PS_OP_CONV2D_GRAD_INPUT ? &r->in[0]
                                                          : &r->in[1];
    if ((st = conv_geometry(r, x, w, y, &c)) != PS_OK ||
        (kind != PS_OP_CONV2D && (st = need_global(r, &r->out[0], "the output")) != PS_OK))
        return st;
    int ckk = (int)(c.C * c.KH * c.KW), ohw = (int)(c.OH * c.OW), O = (int)c.O;
    int64_t xn = c.C * c.H * c.W, yn = c.O * ohw;
    float *col = malloc(((size_t)ckk * (size_t)ohw + 1) * sizeof(float));
    if (col == NULL)
        return op_fail(r, PS_ERR_NOMEM, "out of memory for im2col");
    if (kind == PS_OP_CONV2D_GRAD_INPUT)
        memset(fdata(x), 0, (size_t)(c.N * xn) * sizeof(float));
    /* the filter gradient sums over the images: from zero, or from the
     * tile's content when accumulating */
    float beta0 = (r->ctx->accumulate & 1u) ? 1.0f : 0.0f;
    if (kind == PS_OP_CONV2D_GRAD_FILTER && c.N == 0 && beta0 == 0.0f)
        memset(fdata(w), 0, (size_t)(c.O * ckk) * sizeof(float));
    for (int64_t n = 0; n < c.N; n++) {
        float *xi = fdata(x) + n * xn, *yi = fdata(y) + n * yn;
        switch (kind) {
        case PS_OP_CONV2D: /* y = w [O, CKK] . col [CKK, OHW] */
            im2col(&c, xi, col);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, O, ohw, ckk, 1.0f, fdata(w), ckk,
                        col, ohw, 0.0f, yi, ohw);
            break;
        case PS_OP_CONV2D_GRAD_INPUT: /* dcol = w^T . dy; dx += col2im(dcol) */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, ohw, O, 1.0f, fdata(w), ckk,
                        yi, ohw, 0.0f, col, ohw);
            col2im_add(&c, col, xi);
            break;
        default: /* dw += dy [O, OHW] . col^T */
            im2col(&c, xi, col);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, O, ckk, ohw, 1.0f, yi, ohw, col,
                        ohw, n == 0 ? beta0 : 1.0f, fdata(w), ckk);
            break;
        }
    }
    free(col);
    return PS_OK;
}

/* ---- POOL ----------------------------------------------------------------------- */

static ps_status pool_check(const run *r, const ps_tile *x, const ps_tile *y, conv_geom *c)
{
    const ps_op_attrs *a = r->a;
    if (x->rank != 4 || y->rank != 4)
        FAIL("pool tiles must have rank 4 (NCHW)");
    if (a->pool != PS_POOL_MAX && a->pool != PS_POOL_AVG)
        FAIL("pool kind must be max or avg");
    memset(c, 0, sizeof *c);
    c->N = x->shape[0];
    c->C = x->shape[1];
    c->H = x->shape[2];
    c->W = x->shape[3];
    c->KH = a->window[0];
    c->KW = a->window[1];
    c->sh = a->stride[0];
    c->sw = a->stride[1];
    c->ph = a->pad[0];
    c->pw = a->pad[1];
    if (c->sh < 1 || c->sw < 1 || c->ph < 0 || c->pw < 0 || c->KH < 1 || c->KW < 1)
        FAIL("window and stride must be >= 1 and padding >= 0");
    if (c->H + 2 * c->ph < c->KH || c->W + 2 * c->pw < c->KW)
        FAIL("the window does not fit the input tile");
    c->OH = (c->H + 2 * c->ph - c->KH) / c->sh + 1;
    c->OW = (c->W + 2 * c->pw - c->KW) / c->sw + 1;
    if (y->shape[0] != c->N || y->shape[1] != c->C || y->shape[2] != c->OH ||
        y->shape[3] != c->OW)
        FAIL("the output tile must be [%lld, %lld, %lld, %lld]", (long long)c->N,
             (long long)c->C, (long long)c->OH, (long long)c->OW);
    return PS_OK;
}

/* The first maximum of the window at (oh, ow) of one plane; -1 when the
 * window lies entirely in the padding. The window is clipped to the plane
 * first and the maximum kept by selects, not branches, so that the time does
 * not depend on the data: the stem's pool of a Wide-ResNet, [8, 16, 16, 16],
 * took 71 us on the profile's synthetic inputs but 126 us on ReLU outputs,
 * whose comparisons fall at random, with a branch; 96-104 us on both with
 * selects, so a profile entry times what a training step sees. A NaN
 * never wins a comparison, so the first maximum of the other values is kept
 * unless the first element is NaN, as a strict `>` scan does. */
static int64_t pool_argmax(const conv_geom *c, const float *x, int64_t oh, int64_t ow)
{
    int64_t h0 = oh * c->sh - c->ph, w0 = ow * c->sw - c->pw;
    int64_t hs = h0 < 0 ? 0 : h0, he = h0 + c->KH < c->H ? h0 + c->KH : c->H;
    int64_t ws = w0 < 0 ? 0 : w0, we = w0 + c->KW < c->W ? w0 + c->KW : c->W;
    if (hs >= he || ws >= we)
        return -1;
    int64_t best = hs * c->W + ws;
    float bv = x[best];
    for (int64_t h = hs; h < he; h++)
        for (int64_t w = ws; w < we; w++) {
            int64_t at = h * c->W + w;
            float v = x[at];
            bool gt = v > bv;
            best = gt ? at : best;
            bv = gt ? v : bv;
        }
    return best;
}

static ps_status op_pool(const run *r)
{
    ps_status st;
    conv_geom c;
    const ps_tile *x = &r->in[0];
    bool grad = r->op->kind == PS_OP_POOL_GRAD;
    const ps_tile *y = grad ? &r->in[1] : &r->out[0];
    if ((st = pool_check(r, x, y, &c)) != PS_OK)
        return st;
    if (grad && ((st = need_same(r, y, &r->in[2], "the pool output", "its gradient")) != PS_OK ||
                 (st = need_same(r, x, &r->out[0], "the pool input", "dx")) != PS_OK))
        return st;
    double area = (double)(c.KH * c.KW);
    int64_t xn = c.H * c.W, yn = c.OH * c.OW;
    bool avg = r->a->pool == PS_POOL_AVG;
    if (grad)
        memset(fdata(&r->out[0]), 0, (size_t)(c.N * c.C * xn) * sizeof(float));
    for (int64_t p = 0; p < c.N * c.C; p++) {
        const float *xp = fdata(x) + p * xn;
        float *out = grad ? fdata(&r->out[0]) + p * xn : fdata(&r->out[0]) + p * yn;
        const float *dy = grad ? fdata(&r->in[2]) + p * yn : NULL;
        for (int64_t oh = 0; oh < c.OH; oh++)
            for (int64_t ow = 0; ow < c.OW; ow++) {
                if (!avg) {
                    int64_t at = pool_argmax(&c, xp, oh, ow);
                    if (grad) {
                        if (at >= 0)
                            out[at] += dy[oh * c.OW + ow];
                    } else {
                        out[oh * c.OW + ow] = at >= 0 ? xp[at] : 0.0f;
                    }
                    continue;
                }
                double s = 0, g = grad ? dy[oh * c.OW + ow] / area : 0;
                for (int64_t i = 0; i < c.KH; i++) {
                    int64_t h = oh * c.sh - c.ph + i;
                    if (h < 0 || h >= c.H)
                        continue;
                    for (int64_t j = 0; j < c.KW; j++) {
                        int64_t w = ow * c.sw - c.pw + j;
                        if (w < 0 || w >= c.W)
                            continue;
                        if (grad)
                            out[h * c.W + w] += (float)g;
                        else
                            s += xp[h * c.W + w];
                    }
                }
                if (!grad)
                    out[oh * c.OW + ow] = (float)(s / area);
            }
    }
    return PS_OK;
}

/* ---- BATCHNORM ------------------------------------------------------------------ */

/* Per-channel mean and 1/sqrt(var + eps) over every dim but 1, through the
 * reduce group when those dims are split. x [N, C, S...]. */
static ps_status bn_stats(const run *r, const ps_tile *x, double *mean, double *rstd,
                          float *buf, double *count)
{
    ps_status st;
    int64_t N = x->shape[0], C = x->shape[1], S = N > 0 && C > 0 ? ps_tile_numel(x) / (N * C) : 0;
    *count = (double)x->global[0];
    for (int d = 2; d < x->rank; d++)
        *count *= (double)x->global[d];
    if (r->ctx->reduce.group_size <= 1 && ps_tile_split_outside(x, 1))
        FAIL("batch statistics over a split batch need the op's reduce group");
    if (r->ctx->reduce.group_size > 1 && !ps_tile_split_outside(x, 1))
        FAIL("a reduce group of %d devices but the batch is whole", r->ctx->reduce.group_size);
    /* sums in double, reduced in double: the variance and the gradient's
     * terms cancel, so single-precision totals would show */
    for (int64_t c = 0; c < C; c++) {
        double s = 0;
        for (int64_t n = 0; n < N; n++) {
            const float *p = fdata(x) + (n * C + c) * S;
            for (int64_t i = 0; i < S; i++)
                s += p[i];
        }
        mean[c] = s;
    }
    if ((st = group_reduce64(r, mean, buf, C, PS_REDUCE_OP_SUM)) != PS_OK)
        return st;
    for (int64_t c = 0; c < C; c++)
        mean[c] /= *count;
    for (int64_t c = 0; c < C; c++) {
        double q = 0;
        for (int64_t n = 0; n < N; n++) {
            const float *p = fdata(x) + (n * C + c) * S;
            for (int64_t i = 0; i < S; i++)
                q += (p[i] - mean[c]) * (p[i] - mean[c]);
        }
        rstd[c] = q;
    }
    if ((st = group_reduce64(r, rstd, buf, C, PS_REDUCE_OP_SUM)) != PS_OK)
        return st;
    for (int64_t c = 0; c < C; c++)
        rstd[c] = 1.0 / sqrt(rstd[c] / *count + r->a->eps);
    return PS_OK;
}

static ps_status op_batchnorm(const run *r)
{
    ps_status st = PS_OK;
    bool grad = r->op->kind == PS_OP_BATCHNORM_GRAD;
    const ps_tile *x = &r->in[0], *gamma = &r->in[1];
    if ((st = need_rank(r, x, 2, PS_MAX_RANK, "batchnorm input")) != PS_OK)
        return st;
    int64_t N = x->shape[0], C = x->shape[1];
    int64_t S = N > 0 && C > 0 ? ps_tile_numel(x) / (N * C) : 0;
    if (gamma->rank != 1 || gamma->shape[0] != C)
        FAIL("gamma must be [%lld] like the input's dim 1", (long long)C);
    if (!(r->a->eps > 0))
        FAIL("eps must be positive");
    if (!grad && ((st = need_same(r, gamma, &r->in[2], "gamma", "beta")) != PS_OK ||
                  (st = need_same(r, x, &r->out[0], "input", "the output")) != PS_OK))
        return st;
    if (grad && ((st = need_same(r, x, &r->in[2], "input", "the output gradient")) != PS_OK ||
                 (st = need_same(r, x, &r->out[0], "input", "dx")) != PS_OK ||
                 (st = need_same(r, gamma, &r->out[1], "gamma", "dgamma")) != PS_OK ||
                 (st = need_same(r, gamma, &r->out[2], "gamma", "dbeta")) != PS_OK))
        return st;
    double *mean = malloc((size_t)(4 * C + 1) * sizeof(double)); /* mean, rstd, totals */
    float *buf = malloc((size_t)(2 * C + 1) * sizeof(float));
    double count;
    if (mean == NULL || buf == NULL) {
        st = op_fail(r, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    double *rstd = mean + C, *tot = mean + 2 * C;
    PS_TRY(bn_stats(r, x, mean, rstd, buf, &count));
    const float *g = fdata(gamma);
    if (!grad) {
        const float *b = fdata(&r->in[2]);
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                const float *p = fdata(x) + (n * C + c) * S;
                float *o = fdata(&r->out[0]) + (n * C + c) * S;
                for (int64_t i = 0; i < S; i++)
                    o[i] = (float)((p[i] - mean[c]) * rstd[c] * g[c] + b[c]);
            }
        goto out;
    }
    /* local sums of dy (dbeta) and dy * xhat (dgamma), then their totals */
    for (int64_t c = 0; c < C; c++) {
        double sd = 0, sdx = 0;
        for (int64_t n = 0; n < N; n++) {
            const float *p = fdata(x) + (n * C + c) * S, *d = fdata(&r->in[2]) + (n * C + c) * S;
            for (int64_t i = 0; i < S; i++) {
                sd += d[i];
                sdx += d[i] * (p[i] - mean[c]) * rstd[c];
            }
        }
        tot[c] = sdx;
        tot[C + c] = sd;
    }
    /* the totals are dgamma and dbeta themselves: with the batch split, the
     * planner counts them reduced by the op's own collective, not partial */
    PS_TRY(group_reduce64(r, tot, buf, 2 * C, PS_REDUCE_OP_SUM));
    for (int64_t c = 0; c < C; c++) {
        fdata(&r->out[1])[c] = (float)tot[c];
        fdata(&r->out[2])[c] = (float)tot[C + c];
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            const float *p = fdata(x) + (n * C + c) * S, *d = fdata(&r->in[2]) + (n * C + c) * S;
            float *o = fdata(&r->out[0]) + (n * C + c) * S;
            double mdx = tot[c] / count, md = tot[C + c] / count;
            for (int64_t i = 0; i < S; i++) {
                double xh = (p[i] - mean[c]) * rstd[c];
                o[i] = (float)(g[c] * rstd[c] * (d[i] - md - xh * mdx));
            }
        }
out:
    free(mean);
    free(buf);
    return st;
}

/* ---- MoE ------------------------------------------------------------------------ */

/* Softmax over e experts (double) and the top-k experts by probability, ties
 * to the lower index. */
static void gate_route(const float *logits, int64_t E, int k, double *prob, int *choice)
{
    double mx = -INFINITY, s = 0;
    for (int64_t e = 0; e < E; e++)
        mx = fmax(mx, logits[e]);
    for (int64_t e = 0; e < E; e++)
        s += prob[e] = exp(logits[e] - mx);
    for (int64_t e = 0; e < E; e++)
        prob[e] /= s;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++)
                taken = taken || choice[i] == e;
            if (!taken && (best < 0 || prob[e] > prob[best]))
                best = (int)e;
        }
        choice[j] = best;
    }
}

/* The gate needs whole groups (capacity is counted over a group) and all
 * experts (the softmax); its gradient only all experts. */
static ps_status gate_check(const run *r, const ps_tile *logits, const ps_tile *gsk,
                            bool whole_groups)
{
    ps_status st;
    if ((st = need_rank(r, logits, 3, 3, "gate logits [g, s, e]")) != PS_OK)
        return st;
    int k = r->a->top_k;
    if (k < 1 || k > logits->shape[2])
        FAIL("top_k %d must be between 1 and the number of experts %lld", k,
             (long long)logits->shape[2]);
    if (logits->shape[2] != logits->global[2])
        return op_fail(r, PS_ERR_UNSUPPORTED, "routing needs all experts (e) in the tile");
    if (whole_groups && logits->shape[1] != logits->global[1])
        return op_fail(r, PS_ERR_UNSUPPORTED, "routing needs whole groups (s) in the tile");
    if (gsk->rank != 3 || gsk->shape[0] != logits->shape[0] ||
        gsk->shape[1] != logits->shape[1] || gsk->shape[2] != k)
        FAIL("slot and weight tiles must be [g, s, top_k] like the logits");
    return PS_OK;
}

static ps_status op_moe_gate(const run *r)
{
    ps_status st;
    const ps_tile *x = &r->in[0];
    ps_tile *slot = &r->out[0], *wt = &r->out[1];
    if ((st = gate_check(r, x, slot, true)) != PS_OK ||
        (st = need_same(r, slot, wt, "the slot tile", "the weight tile")) != PS_OK)
        return st;
    int64_t G = x->shape[0], S = x->shape[1], E = x->shape[2], C = r->a->capacity;
    int k = r->a->top_k;
    if (r->a->experts != E)
        FAIL("the logits have %lld experts, the op says %lld", (long long)E,
             (long long)r->a->experts);
    if (C < 1 || E * C > INT32_MAX)
        FAIL("capacity %lld out of range", (long long)C);
    double *prob = malloc((size_t)E * sizeof *prob);
    int *choice = malloc((size_t)(S * k) * sizeof *choice);
    int64_t *fill = malloc((size_t)E * sizeof *fill);
    if (prob == NULL || choice == NULL || fill == NULL) {
        st = op_fail(r, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int64_t g = 0; g < G; g++) {
        for (int64_t s = 0; s < S; s++) {
            gate_route(fdata(x) + (g * S + s) * E, E, k, prob, choice + s * k);
            for (int j = 0; j < k; j++)
                fdata(wt)[(g * S + s) * k + j] = (float)prob[choice[s * k + j]];
        }
        /* capacity: all first choices in token order, then all second ones */
        memset(fill, 0, (size_t)E * sizeof *fill);
        for (int j = 0; j < k; j++)
            for (int64_t s = 0; s < S; s++) {
                int e = choice[s * k + j];
                int32_t *o = idata(slot) + (g * S + s) * k + j;
                *o = fill[e] < C ? (int32_t)(e * C + fill[e]++) : -1;
            }
    }
out:
    free(prob);
    free(choice);
    free(fill);
    return st;
}

/* (logits, slot, dweight) -> dlogits */
static ps_status op_moe_gate_grad(const run *r)
{
    ps_status st = PS_OK;
    const ps_tile *x = &r->in[0], *dw = &r->in[2];
    if ((st = gate_check(r, x, &r->in[1], false)) != PS_OK ||
        (st = need_same(r, &r->in[1], dw, "the slot tile", "dweight")) != PS_OK ||
        (st = need_same(r, x, &r->out[0], "logits", "dlogits")) != PS_OK)
        return st;
    int64_t T = x->shape[0] * x->shape[1], E = x->shape[2];
    int k = r->a->top_k;
    double *prob = malloc((size_t)(2 * E) * sizeof *prob);
    int *choice = malloc((size_t)k * sizeof *choice);
    if (prob == NULL || choice == NULL) {
        st = op_fail(r, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    double *dp = prob + E;
    for (int64_t t = 0; t < T; t++) {
        gate_route(fdata(x) + t * E, E, k, prob, choice);
        memset(dp, 0, (size_t)E * sizeof *dp);
        for (int j = 0; j < k; j++)
            dp[choice[j]] += fdata(dw)[t * k + j];
        double s = 0;
        for (int64_t e = 0; e < E; e++)
            s += prob[e] * dp[e];
        for (int64_t e = 0; e < E; e++)
            fdata(&r->out[0])[t * E + e] = (float)(prob[e] * (dp[e] - s));
    }
out:
    free(prob);
    free(choice);
    return st;
}

/* The [e, g, c, m] tile `ex` against the token tile `tok` [g, s, m] and the
 * slot tile [g, s, k]: same groups and columns. */
static ps_status moe_check(const run *r, const ps_tile *ex, const ps_tile *tok,
                           const ps_tile *slot)
{
    if (ex->rank != 4 || tok->rank != 3 || slot->rank != 3)
        FAIL("moe tiles must be [e, g, c, m], [g, s, m] and slots [g, s, k]");
    if (ex->shape[1] != tok->shape[0] || ex->offset[1] != tok->offset[0])
        FAIL("the expert tile and the token tile hold different groups");
    if (ex->shape[3] != tok->shape[2] || ex->offset[3] != tok->offset[2])
        FAIL("the expert tile and the token tile hold different columns");
    if (slot->shape[0] != tok->shape[0] || slot->shape[1] != tok->shape[1])
        FAIL("the slot tile must be [g, s, k] like the tokens");
    return PS_OK;
}

/* Local position of a slot in the expert tile (its e, c row), or -1 when it
 * is dropped or held by another tile; *bad when it is out of range. */
static int64_t moe_row(const ps_tile *ex, int64_t slot, int64_t g, bool *bad)
{
    int64_t E = ex->global[0], C = ex->global[2];
    if (slot < 0 || slot >= E * C) {
        *bad = *bad || slot < -1 || slot >= E * C;
        return -1;
    }
    int64_t e = slot / C - ex->offset[0], c = slot % C - ex->offset[2];
    if (e < 0 || e >= ex->shape[0] || c < 0 || c >= ex->shape[2])
        return -1;
    return (e * ex->shape[1] + g) * ex->shape[2] + c;
}

/* DISPATCH (x, slot) -> d; DISPATCH_GRAD (dd, slot) -> dx; COMBINE (y, slot,
 * weight) -> z; COMBINE_GRAD (dz, y, slot, weight) -> dy, dweight. */
static ps_status op_moe_move(const run *r)
{
    ps_status st;
    ps_op_kind kind = r->op->kind;
    const ps_tile *ex, *tok, *slot, *wt = NULL;
    switch (kind) {
    case PS_OP_MOE_DISPATCH:
        ex = &r->out[0], tok = &r->in[0], slot = &r->in[1];
        if (r->a->experts != ex->global[0] || r->a->capacity != ex->global[2])
            FAIL("the expert tensor is [%lld, _, %lld, _], the op says %lld experts of "
                 "capacity %lld",
                 (long long)ex->global[0], (long long)ex->global[2], (long long)r->a->experts,
                 (long long)r->a->capacity);
        break;
    case PS_OP_MOE_DISPATCH_GRAD: ex = &r->in[0], tok = &r->out[0], slot = &r->in[1]; break;
    case PS_OP_MOE_COMBINE:
        ex = &r->in[0], tok = &r->out[0], slot = &r->in[1], wt = &r->in[2];
        break;
    default: /* COMBINE_GRAD */
        ex = &r->out[0], tok = &r->in[0], slot = &r->in[2], wt = &r->in[3];
        if ((st = need_same(r, ex, &r->in[1], "dy", "y")) != PS_OK ||
            (st = need_same(r, wt, &r->out[1], "weight", "dweight")) != PS_OK)
            return st;
        break;
    }
    if ((st = moe_check(r, ex, tok, slot)) != PS_OK)
        return st;
    if (wt != NULL && (st = need_same(r, slot, wt, "the slot tile", "the weight tile")) != PS_OK)
        return st;
    int64_t G = tok->shape[0], S = tok->shape[1], M = tok->shape[2], k = slot->shape[2];
    bool writes_ex = kind == PS_OP_MOE_DISPATCH || kind == PS_OP_MOE_COMBINE_GRAD;
    if (writes_ex)
        memset(ex->data, 0, (size_t)ps_tile_numel(ex) * sizeof(float));
    else
        memset(tok->data, 0, (size_t)ps_tile_numel(tok) * sizeof(float));
    bool bad = false;
    for (int64_t g = 0; g < G; g++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t j = 0; j < k; j++) {
                int64_t at = (g * S + s) * k + j;
                int64_t row = moe_row(ex, idata(slot)[at], g, &bad);
                float *tp = fdata(tok) + (g * S + s) * M;
                if (kind == PS_OP_MOE_COMBINE_GRAD)
                    fdata(&r->out[1])[at] = 0.0f;
                if (row < 0)
                    continue;
                float *ep = fdata(ex) + row * M;
                switch (kind) {
                case PS_OP_MOE_DISPATCH: memcpy(ep, tp, (size_t)M * sizeof(float)); break;
                case PS_OP_MOE_DISPATCH_GRAD:
                    for (int64_t i = 0; i < M; i++)
                        tp[i] += ep[i];
                    break;
                case PS_OP_MOE_COMBINE: {
                    float w = fdata(wt)[at];
                    for (int64_t i = 0; i < M; i++)
                        tp[i] += w * ep[i];
                    break;
                }
                default: {
                    float w = fdata(wt)[at];
                    const float *yp = fdata(&r->in[1]) + row * M;
                    double dot = 0;
                    for (int64_t i = 0; i < M; i++) {
                        ep[i] += w * tp[i];
                        dot += (double)tp[i] * yp[i];
                    }
                    fdata(&r->out[1])[at] = (float)dot;
                    break;
                }
                }
            }
    if (bad)
        FAIL("a slot is outside the %lld x %lld expert slots", (long long)ex->global[0],
             (long long)ex->global[2]);
    return PS_OK;
}

/* ---- dispatch --------------------------------------------------------------------- */

/* Which inputs (bit i) and outputs are int32 tensors. */
static unsigned int_inputs(ps_op_kind k)
{
    switch (k) {
    case PS_OP_EMBEDDING:
    case PS_OP_SOFTMAX_XENT:
    case PS_OP_SOFTMAX_XENT_GRAD:
    case PS_OP_MOE_DISPATCH:
    case PS_OP_MOE_COMBINE:
    case PS_OP_MOE_GATE_GRAD:
    case PS_OP_MOE_DISPATCH_GRAD: return 1u << 1;
    case PS_OP_EMBEDDING_GRAD: return 1u << 0;
    case PS_OP_MOE_COMBINE_GRAD: return 1u << 2;
    default: return 0;
    }
}

static unsigned int_outputs(ps_op_kind k) { return k == PS_OP_MOE_GATE ? 1u : 0u; }

static ps_status check_tile(const run *r, const ps_tile *t, const char *what, int i)
{
    if (t->rank < 0 || t->rank > PS_MAX_RANK)
        FAIL("%s %d has an invalid rank %d", what, i, t->rank);
    for (int d = 0; d < t->rank; d++)
        if (t->shape[d] < 0 || t->offset[d] < 0 || t->offset[d] + t->shape[d] > t->global[d])
            FAIL("%s %d: its box (dim %d: %lld at %lld) is not inside the tensor (%lld)", what,
                 i, d, (long long)t->shape[d], (long long)t->offset[d],
                 (long long)t->global[d]);
    if (t->data == NULL && ps_tile_numel(t) > 0)
        FAIL("%s %d has no data", what, i);
    return PS_OK;
}

bool ps_cpu_op_accumulates(ps_op_kind kind, int out)
{
    switch (kind) {
    case PS_OP_MATMUL:
    case PS_OP_CONV2D_GRAD_FILTER:
    case PS_OP_EMBEDDING_GRAD:
    case PS_OP_ADD:
    case PS_OP_REDUCE: return out == 0;
    default: return false;
    }
}

ps_status ps_cpu_op_run(const ps_op *op, const ps_tile *in, ps_tile *out,
                        const ps_op_context *ctx, ps_error *err)
{
    ps_status st;
    if (op == NULL)
        return ps_error_set(err, PS_ERR_INVALID, "cpu op: no op");
    const ps_op_context none = {.step = 0, .reduce = {.group_size = 1}};
    run rr = {op, &op->attrs, in, out, ctx ? ctx : &none, err}, *r = &rr;
    const ps_op_kind_info *info = ps_op_kind_get(op->kind);
    if (info == NULL)
        return ps_error_set(err, PS_ERR_UNSUPPORTED, "op \"%s\": op kind %d is not supported "
                            "by the cpu backend", op->name ? op->name : "?", (int)op->kind);
    if (op->n_in < info->min_in || op->n_in > info->max_in || op->n_out != info->n_out) {
        if (info->min_in == info->max_in)
            FAIL("takes %d inputs and %d outputs, got %d and %d", info->min_in, info->n_out,
                 op->n_in, op->n_out);
        FAIL("takes %d to %d inputs and %d outputs, got %d and %d", info->min_in, info->max_in,
             info->n_out, op->n_in, op->n_out);
    }
    if ((op->n_in > 0 && in == NULL) || (op->n_out > 0 && out == NULL))
        FAIL("no tiles given");
    unsigned ii = int_inputs(op->kind), io = int_outputs(op->kind);
    bool layout = op->kind == PS_OP_RESHAPE || op->kind == PS_OP_TRANSPOSE;
    for (int i = 0; i < op->n_in; i++) {
        if ((st = check_tile(r, &in[i], "input", i)) != PS_OK)
            return st;
        if (!layout && in[i].is_int != ((ii >> i) & 1u))
            FAIL("input %d must be %s", i, in[i].is_int ? "a float tile" : "an int32 tile");
    }
    for (int i = 0; i < op->n_out; i++) {
        if ((st = check_tile(r, &out[i], "output", i)) != PS_OK)
            return st;
        if (!layout && out[i].is_int != ((io >> i) & 1u))
            FAIL("output %d must be %s", i, out[i].is_int ? "a float tile" : "an int32 tile");
    }
    if (layout && in[0].is_int != out[0].is_int)
        FAIL("input and output differ in element type");
    unsigned can_add = 0;
    for (int o = 0; o < op->n_out; o++)
        can_add |= ps_cpu_op_accumulates(op->kind, o) ? 1u << o : 0u;
    if (r->ctx->accumulate & ~can_add)
        FAIL("cannot add into its outputs 0x%x (only 0x%x)", r->ctx->accumulate, can_add);

    switch (op->kind) {
    case PS_OP_MATMUL: return op_matmul(r);
    case PS_OP_BIAS_ADD: return op_bias_add(r);
    case PS_OP_ADD:
    case PS_OP_RELU:
    case PS_OP_GELU:
    case PS_OP_RELU_GRAD:
    case PS_OP_GELU_GRAD: return op_elementwise(r);
    case PS_OP_LAYERNORM: return op_layernorm(r);
    case PS_OP_LAYERNORM_GRAD: return op_layernorm_grad(r);
    case PS_OP_SOFTMAX: return op_softmax(r);
    case PS_OP_SOFTMAX_GRAD: return op_softmax_grad(r);
    case PS_OP_EMBEDDING: return op_embedding(r);
    case PS_OP_EMBEDDING_GRAD: return op_embedding_grad(r);
    case PS_OP_CONV2D:
    case PS_OP_CONV2D_GRAD_INPUT:
    case PS_OP_CONV2D_GRAD_FILTER: return op_conv(r);
    case PS_OP_BATCHNORM:
    case PS_OP_BATCHNORM_GRAD: return op_batchnorm(r);
    case PS_OP_POOL:
    case PS_OP_POOL_GRAD: return op_pool(r);
    case PS_OP_RESHAPE: return op_reshape(r);
    case PS_OP_TRANSPOSE: return op_transpose(r);
    case PS_OP_REDUCE: return op_reduce(r);
    case PS_OP_BROADCAST: return op_broadcast(r);
    case PS_OP_MSE_LOSS: return op_mse(r, false);
    case PS_OP_MSE_LOSS_GRAD: return op_mse(r, true);
    case PS_OP_SOFTMAX_XENT: return op_xent(r, false);
    case PS_OP_SOFTMAX_XENT_GRAD: return op_xent(r, true);
    case PS_OP_MOE_GATE: return op_moe_gate(r);
    case PS_OP_MOE_GATE_GRAD: return op_moe_gate_grad(r);
    case PS_OP_MOE_DISPATCH:
    case PS_OP_MOE_DISPATCH_GRAD:
    case PS_OP_MOE_COMBINE:
    case PS_OP_MOE_COMBINE_GRAD: return op_moe_move(r);
    case PS_OP_ADAM: return op_adam(r);
    case PS_OP_KIND_COUNT: break;
    }
    return op_fail(r, PS_ERR_UNSUPPORTED, "not supported by the cpu backend");
}
