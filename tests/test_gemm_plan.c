/* exec/gemm_plan: how an einsum runs as strided-batched GEMMs, emulated on
 * the host with cuBLAS's column-major semantics and the permute kernel's,
 * against the einsum by its definition: a fixed list of the zoo's and
 * awkward einsums at several extents (1s among them), random einsums of
 * random extents, and the layouts the plan must read where they lie
 * (attention's heads, a sharded batch). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/op.h"
#include "exec/gemm_plan.h"
#include "tests/test_layouts.h"
#include "tests/test_util.h"

/* y = x with out dim i = in dim perm[i], floats. */
static void host_permute(const float *x, const int64_t *in_shape, int rank, const int *perm,
                         float *y)
{
    test_permute_by_definition(x, in_shape, rank, perm, sizeof *x, y);
}

/* The plan's calls of cublasGemmStridedBatchedEx, column-major (alpha 1,
 * beta 0): a is R (operand 1 - left, a_n elements), b is L (b_n), c the
 * output or its temporary (c_n); each call from its offsets. Every read
 * and write lies inside its array; every element of c that a call writes
 * is counted in written. */
static void host_gemm(const ps_gemm_plan *p, const float *a, int64_t a_n, const float *b,
                      int64_t b_n, float *c, int *written, int64_t c_n)
{
    for (int64_t call = 0; call < p->calls; call++) {
        int64_t off[3];
        ps_gemm_plan_offsets(p, call, off);
        const float *A = a + off[1 - p->left], *B = b + off[p->left];
        float *C = c + off[2];
        for (int64_t bt = 0; bt < p->batch; bt++)
            for (int64_t i = 0; i < p->cm; i++)
                for (int64_t j = 0; j < p->cn; j++) {
                    double acc = 0;
                    const float *ab = A + bt * p->stride_a, *bb = B + bt * p->stride_b;
                    for (int64_t q = 0; q < p->ck; q++) {
                        int64_t ia = p->transa ? q + i * p->lda : i + q * p->lda;
                        int64_t ib = p->transb ? j + q * p->ldb : q + j * p->ldb;
                        assert_true((ab - a) + ia >= 0 && (ab - a) + ia < a_n);
                        assert_true((bb - b) + ib >= 0 && (bb - b) + ib < b_n);
                        acc += (double)ab[ia] * bb[ib];
                    }
                    int64_t at = (C - c) + bt * p->stride_c + i + j * p->ldc;
                    assert_true(at >= 0 && at < c_n);
                    c[at] = (float)acc;
                    written[at]++;
                }
    }
}

/* The einsum by its definition: sum over every assignment of the labels. */
static void host_einsum(const ps_einsum *e, const int64_t *size, const float *a, const float *b,
                        float *c, int64_t nc)
{
    char labels[26];
    int nl = 0;
    for (int o = 0; o < 3; o++)
        for (int i = 0; i < e->rank[o]; i++)
            if (memchr(labels, e->labels[o][i], (size_t)nl) == NULL)
                labels[nl++] = e->labels[o][i];
    int64_t total = 1;
    for (int i = 0; i < nl; i++)
        total *= size[labels[i] - 'a'];
    double *acc = calloc((size_t)nc + 1, sizeof *acc);
    assert_non_null(acc);
    for (int64_t it = 0; it < total; it++) {
        int64_t val[26], r = it;
        for (int i = nl - 1; i >= 0; i--) {
            val[labels[i] - 'a'] = r % size[labels[i] - 'a'];
            r /= size[labels[i] - 'a'];
        }
        int64_t off[3] = {0, 0, 0};
        for (int o = 0; o < 3; o++)
            for (int i = 0; i < e->rank[o]; i++)
                off[o] = off[o] * size[e->labels[o][i] - 'a'] + val[e->labels[o][i] - 'a'];
        acc[off[2]] += (double)a[off[0]] * b[off[1]];
    }
    for (int64_t i = 0; i < nc; i++)
        c[i] = (float)acc[i];
    free(acc);
}

/* The einsum spec's ranks and shapes at the label extents `size`. */
static void shapes_of(const char *spec, const int64_t *size, ps_einsum *e, int rank[3],
                      int64_t shape[3][PS_MAX_RANK])
{
    assert_int_equal(ps_einsum_parse(spec, e, NULL), PS_OK);
    for (int o = 0; o < 3; o++) {
        rank[o] = e->rank[o];
        for (int i = 0; i < e->rank[o]; i++)
            shape[o][i] = size[e->labels[o][i] - 'a'];
    }
}

/* The plan of spec at the label extents `size` (a call counted as
 * call_cost permuted elements), emulated, against the einsum: equal to rounding, every output element written once, the
 * problem's sizes those of the operands; the plan returned in *plan. */
static void check_spec(const char *spec, const int64_t *size, int64_t call_cost,
                       ps_gemm_plan *plan)
{
    ps_einsum e;
    ps_error err = {0};
    int rank[3];
    int64_t shape[3][PS_MAX_RANK], n[3];
    float *t[3], *perm_t[2];
    shapes_of(spec, size, &e, rank, shape);
    for (int o = 0; o < 3; o++) {
        n[o] = 1;
        for (int i = 0; i < e.rank[o]; i++)
            n[o] *= shape[o][i];
        t[o] = malloc((size_t)n[o] * 4 + 4);
        assert_non_null(t[o]);
        for (int64_t i = 0; i < n[o]; i++)
            t[o][i] = (float)(2 * uniform() - 1);
    }
    ps_gemm_plan p;
    if (ps_gemm_plan_make_costed(spec, rank, shape, call_cost, &p, &err) != PS_OK)
        fail_msg("%s: %s", spec, err.msg);
    assert_true(p.calls >= 1 && p.calls <= PS_GEMM_MAX_CALLS);
    assert_int_equal(p.calls * p.batch * p.m * p.k, n[p.left]);
    assert_int_equal(p.calls * p.batch * p.k * p.n, n[1 - p.left]);
    assert_int_equal(p.calls * p.batch * p.m * p.n, n[2]);
    assert_true(p.lda >= 1 && p.ldb >= 1 && p.ldc >= 1);
    assert_true(p.ldc >= p.n); /* column-major C^T is N x M */
    assert_true(p.lda >= (p.transa ? p.k : p.n));
    assert_true(p.ldb >= (p.transb ? p.m : p.k));
    for (int o = 0; o < 2; o++) {
        perm_t[o] = t[o];
        if (p.permute[o]) {
            perm_t[o] = malloc((size_t)n[o] * 4 + 4);
            assert_non_null(perm_t[o]);
            host_permute(t[o], shape[o], rank[o], p.perm[o], perm_t[o]);
        }
    }
    float *got = malloc((size_t)n[2] * 4 + 4), *tmp = malloc((size_t)n[2] * 4 + 4);
    int *written = calloc((size_t)n[2] + 1, sizeof *written);
    assert_non_null(got);
    assert_non_null(tmp);
    assert_non_null(written);
    if (p.k > 0)
        host_gemm(&p, perm_t[1 - p.left], n[1 - p.left], perm_t[p.left], n[p.left],
                  p.out_permute ? tmp : got, written, n[2]);
    else /* an empty contraction: zeros (the backends' memset) */
        for (int64_t i = 0; i < n[2]; i++) {
            (p.out_permute ? tmp : got)[i] = 0;
            written[i] = 1;
        }
    for (int64_t i = 0; i < n[2]; i++)
        if (written[i] != 1)
            fail_msg("%s: output element %lld written %d times", spec, (long long)i, written[i]);
    if (p.out_permute)
        host_permute(tmp, p.out_tmp_shape, p.out_rank, p.out_perm, got);
    host_einsum(&e, size, t[0], t[1], t[2], n[2]);
    for (int64_t i = 0; i < n[2]; i++)
        if (!(fabs((double)got[i] - t[2][i]) <= 1e-5 * (1 + fabs((double)t[2][i]))))
            fail_msg("%s: element %lld is %.9g, the einsum's %.9g", spec, (long long)i,
                     (double)got[i], (double)t[2][i]);
    for (int o = 0; o < 2; o++)
        if (perm_t[o] != t[o])
            free(perm_t[o]);
    for (int o = 0; o < 3; o++)
        free(t[o]);
    free(got);
    free(tmp);
    free(written);
    if (plan != NULL)
        *plan = p;
}

/* beyond the shared list: several labels per group, out of order */
static const char *const more_specs[] = {"mbk,kn->bmn", "bmk,bkn->mbn", "kab,kba->ab",
                                         "acbd,dcbe->eba"};

/* Every spec of the list at extents 2-5, with some labels of extent 1, and
 * with an empty one; calls at the default cost (permuting, at these
 * extents) and free (in place wherever the layouts allow). */
static void fixed_einsums(void **state)
{
    (void)state;
    test_rng_seed(3);
    for (int variant = 0; variant < 4; variant++) {
        int64_t size[26];
        for (int l = 0; l < 26; l++)
            size[l] = 2 + l % 4;
        size['b' - 'a'] = 3;
        size['k' - 'a'] = 5;
        size['n' - 'a'] = 4;
        if (variant == 1) /* extents of 1 inside the groups */
            size['a' - 'a'] = size['s' - 'a'] = size['c' - 'a'] = size['j' - 'a'] = 1;
        if (variant == 2) /* a batch of 1, a contraction of 1 */
            size['b' - 'a'] = size['d' - 'a'] = size['h' - 'a'] = size['m' - 'a'] = 1;
        if (variant == 3) /* an empty label */
            size['q' - 'a'] = 0;
        for (size_t i = 0; i < TEST_EINSUM_SPECS + sizeof more_specs / sizeof *more_specs; i++)
            for (int64_t cost = 0; cost <= 1 << 20; cost += 1 << 20)
                check_spec(i < TEST_EINSUM_SPECS ? test_einsum_specs[i]
                                                 : more_specs[i - TEST_EINSUM_SPECS],
                           size, cost, NULL);
    }
}

/* Random einsums: up to 6 labels, each a batch, contracted or free label
 * of either operand, in random orders, extents 1-4. */
static void random_einsums(void **state)
{
    (void)state;
    test_rng_seed(17);
    int looped = 0, in_place = 0;
    for (int trial = 0; trial < 1500; trial++) {
        int nl = 1 + below(6);
        char op[3][PS_MAX_RANK];
        int r[3] = {0, 0, 0};
        int64_t size[26];
        for (int l = 0; l < 26; l++)
            size[l] = 1;
        bool contracted = false;
        for (int i = 0; i < nl; i++) {
            char c = (char)('a' + i);
            size[i] = 1 + below(4);
            int cls = below(4); /* batch, contracted, free of 0, free of 1 */
            if (cls == 0 || cls == 1 || cls == 2)
                op[0][r[0]++] = c;
            if (cls == 0 || cls == 1 || cls == 3)
                op[1][r[1]++] = c;
            if (cls != 1)
                op[2][r[2]++] = c;
            contracted |= cls == 1;
        }
        (void)contracted;
        for (int o = 0; o < 3; o++) /* shuffle each operand's order */
            for (int i = r[o] - 1; i > 0; i--) {
                int j = below(i + 1);
                char x = op[o][i];
                op[o][i] = op[o][j];
                op[o][j] = x;
            }
        char spec[64];
        snprintf(spec, sizeof spec, "%.*s,%.*s->%.*s", r[0], op[0], r[1], op[1], r[2], op[2]);
        /* one extent large enough now and then that reading in place pays */
        if (below(3) == 0)
            size[below(nl)] = 64 + below(3) * 64;
        ps_gemm_plan p;
        int64_t total = 1;
        for (int i = 0; i < nl; i++)
            total *= size[i];
        if (total > 200000)
            continue;
        check_spec(spec, size, below(2) == 0 ? 0 : 1 << 20, &p);
        looped += p.calls > 1;
        in_place += !p.permute[0] && !p.permute[1] && !p.out_permute;
    }
    print_message("1500 random einsums: %d in several calls, %d with nothing permuted\n", looped,
                  in_place);
    assert_true(looped > 0);
    assert_true(in_place > 0);
}

/* The zoo's attention at a training step's extents (micro-batch 4,
 * sequence 512, 16 heads of 64): every product reads its operands where
 * they lie and writes its output in place, one call per sample of the
 * micro-batch; the MLP's and the head's GEMMs stay one call without
 * permutations; a MoE expert product too. Checked by emulation at smaller
 * extents with the calls free. */
static void attention_reads_in_place(void **state)
{
    (void)state;
    static const char *const attention[] = {
        "bqad,bkad->baqk", "baqk,bkad->bqad", /* scores, context */
        "baqk,bqad->bkad", "bqad,baqk->bkad", /* their gradients */
    };
    int64_t size[26];
    for (int l = 0; l < 26; l++)
        size[l] = 1;
    size['b' - 'a'] = 4;
    size['a' - 'a'] = 16;
    size['d' - 'a'] = 64;
    size['q' - 'a'] = size['k' - 'a'] = 512;
    for (size_t i = 0; i < sizeof attention / sizeof *attention; i++) {
        ps_einsum e;
        int rank[3];
        int64_t shape[3][PS_MAX_RANK];
        shapes_of(attention[i], size, &e, rank, shape);
        ps_gemm_plan p;
        assert_int_equal(ps_gemm_plan_make(attention[i], rank, shape, &p, NULL), PS_OK);
        if (p.permute[0] || p.permute[1] || p.out_permute || p.calls != 4 || p.batch != 16)
            fail_msg("%s: permutes %d %d, output %d, %lld calls of %lld", attention[i],
                     p.permute[0], p.permute[1], p.out_permute, (long long)p.calls,
                     (long long)p.batch);
    }
    /* emulated at smaller extents, the calls free, where the same holds */
    size['b' - 'a'] = 2;
    size['a' - 'a'] = 4;
    size['d' - 'a'] = 16;
    size['q' - 'a'] = size['k' - 'a'] = 32;
    test_rng_seed(5);
    for (size_t i = 0; i < sizeof attention / sizeof *attention; i++) {
        ps_gemm_plan p;
        check_spec(attention[i], size, 0, &p);
        assert_true(!p.permute[0] && !p.permute[1] && !p.out_permute && p.calls == 2);
    }
    /* the MLP, the head and an expert: one call, as stored */
    static const char *const dense_specs[] = {"bsh,hf->bsf", "bsf,bsh->hf", "bsh,vh->bsv",
                                              "egcm,emf->egcf"};
    for (int l = 0; l < 26; l++)
        size[l] = 8 + l;
    for (size_t i = 0; i < sizeof dense_specs / sizeof *dense_specs; i++) {
        ps_gemm_plan p;
        check_spec(dense_specs[i], size, 1 << 20, &p);
        assert_true(!p.permute[0] && !p.permute[1] && !p.out_permute && p.calls == 1);
    }
}

/* Empty labels: a batch of 0 beside batch labels that alone would take
 * more calls than allowed, an empty free label after a large batch, an
 * empty contraction: planned, nothing permuted. */
static void empty_extents(void **state)
{
    (void)state;
    int64_t size[26];
    for (int l = 0; l < 26; l++)
        size[l] = 1;
    size['f' - 'a'] = 65;
    size['b' - 'a'] = 0;
    size['c' - 'a'] = 3;
    size['i' - 'a'] = size['j' - 'a'] = size['k' - 'a'] = 2;
    ps_gemm_plan p;
    check_spec("fbcij,fbcjk->fbcik", size, 0, &p);
    assert_true(!p.permute[0] && !p.permute[1] && !p.out_permute);
    size['a' - 'a'] = 68;
    size['b' - 'a'] = 5;
    size['c' - 'a'] = 0;
    check_spec("abc,acb->acb", size, 1 << 20, &p);
    size['c' - 'a'] = 4;
    size['j' - 'a'] = 0;
    check_spec("cij,cjk->cik", size, 1 << 20, &p); /* zeros */
    assert_int_equal(p.k, 0);
}

/* Malformed: a rank that does not match the labels, one label of two
 * extents, a negative extent, a parse error. */
static void malformed(void **state)
{
    (void)state;
    int rank[3] = {2, 2, 2};
    int64_t shape[3][PS_MAX_RANK] = {{2, 3}, {3, 4}, {2, 4}};
    ps_gemm_plan p;
    ps_error err = {0};
    assert_int_equal(ps_gemm_plan_make("ij,jk->ik", rank, shape, &p, &err), PS_OK);
    rank[2] = 3;
    assert_int_equal(ps_gemm_plan_make("ij,jk->ik", rank, shape, &p, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "rank"));
    rank[2] = 2;
    shape[1][0] = 5;
    err = (ps_error){0};
    assert_int_equal(ps_gemm_plan_make("ij,jk->ik", rank, shape, &p, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "extent"));
    shape[1][0] = 3;
    shape[0][0] = shape[2][0] = -2;
    assert_int_equal(ps_gemm_plan_make("ij,jk->ik", rank, shape, &p, &err), PS_ERR_INVALID);
    assert_int_equal(ps_gemm_plan_make("ij,jk>ik", rank, shape, &p, &err), PS_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fixed_einsums),
        cmocka_unit_test(random_einsums),
        cmocka_unit_test(attention_reads_in_place),
        cmocka_unit_test(empty_extents),
        cmocka_unit_test(malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
