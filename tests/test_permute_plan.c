/* exec/permute_plan: the permute kernel's plan, emulated on the host (each
 * unit moved from the offset its index gives) against the permutation by
 * its definition, for random shapes, permutations, element sizes and
 * address alignments; and the plans that matter: attention's heads in
 * 16-byte units over 3 dims, a permutation that keeps dims together merged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "exec/permute_plan.h"
#include "tests/test_layouts.h"
#include "tests/test_util.h"

/* The kernel's loop: unit i from the offset its digits give. */
static void by_plan(const ps_permute_plan *p, const unsigned char *x, unsigned char *y)
{
    for (int64_t i = 0; i < p->n; i++) {
        int64_t r = i, off = 0;
        for (int d = p->rank - 1; d >= 0; d--) {
            off += (r % p->out_shape[d]) * p->in_stride[d];
            r /= p->out_shape[d];
        }
        memcpy(y + i * p->unit_bytes, x + off * p->unit_bytes, p->unit_bytes);
    }
}

static void random_permutations(void **state)
{
    (void)state;
    test_rng_seed(23);
    int widened = 0, merged = 0;
    for (int trial = 0; trial < 3000; trial++) {
        int rank = 1 + below(6);
        int64_t shape[PS_MAX_RANK], n = 1;
        int perm[PS_MAX_RANK];
        for (int d = 0; d < rank; d++) {
            shape[d] = below(8) == 0 ? 1 : 1 + below(6);
            if (below(10) == 0)
                shape[d] *= 8;
            perm[d] = d;
        }
        if (below(50) == 0)
            shape[below(rank)] = 0;
        for (int d = 0; d < rank; d++)
            n *= shape[d];
        if (n > 100000)
            continue;
        for (int d = rank - 1; d > 0; d--) { /* keep runs together now and then */
            if (below(3) == 0)
                continue;
            int j = below(d + 1), t = perm[d];
            perm[d] = perm[j];
            perm[j] = t;
        }
        size_t elem = (size_t)1 << below(3); /* 1, 2, 4 */
        size_t misalign[2] = {(size_t)below(4) * elem, (size_t)below(4) * elem};
        unsigned char *x = malloc((size_t)n * elem + 32), *want = malloc((size_t)n * elem + 32),
                      *got = malloc((size_t)n * elem + 32);
        assert_non_null(x);
        assert_non_null(want);
        assert_non_null(got);
        /* 16-aligned buffers, then moved off by the misalignment */
        unsigned char *xs = x + ((16 - (uintptr_t)x % 16) % 16);
        unsigned char *gs = got + ((16 - (uintptr_t)got % 16) % 16);
        if ((size_t)(xs - x) + misalign[0] + (size_t)n * elem > (size_t)n * elem + 32 ||
            (size_t)(gs - got) + misalign[1] + (size_t)n * elem > (size_t)n * elem + 32) {
            free(x);
            free(want);
            free(got);
            continue;
        }
        xs += misalign[0];
        gs += misalign[1];
        for (int64_t i = 0; i < n * (int64_t)elem; i++)
            xs[i] = (unsigned char)(uniform() * 256);
        memset(gs, 0xa5, (size_t)n * elem);
        ps_permute_plan p;
        ps_permute_plan_make(shape, rank, perm, elem, (uintptr_t)xs, (uintptr_t)gs, &p);
        assert_true(p.n * (int64_t)p.unit_bytes == n * (int64_t)elem);
        assert_true(p.rank <= rank);
        assert_true(p.unit_bytes >= elem && p.unit_bytes <= 16);
        assert_true((uintptr_t)xs % p.unit_bytes == 0 || p.unit_bytes == elem);
        test_permute_by_definition(xs, shape, rank, perm, elem, want);
        by_plan(&p, xs, gs);
        if (memcmp(want, gs, (size_t)n * elem) != 0)
            fail_msg("trial %d: rank %d, %zu-byte elements: the plan (rank %d, %zu-byte "
                     "units) moves other bytes",
                     trial, rank, elem, p.rank, p.unit_bytes);
        widened += p.unit_bytes > elem;
        merged += p.rank < rank;
        free(x);
        free(want);
        free(got);
    }
    print_message("3000 random permutations: %d in wider units, %d of fewer dims\n", widened,
                  merged);
    assert_true(widened > 100);
    assert_true(merged > 100);
}

/* Attention's heads, [b, s, a, d] -> [b, a, s, d] of bf16 with d = 64:
 * 16-byte units, 8 to a row of d, over 3 dims (b, a, s); an identity is
 * one run; [x, y, z] -> [y, z, x] is a 2-dim transpose. */
static void the_plans_that_matter(void **state)
{
    (void)state;
    ps_permute_plan p;
    ps_permute_plan_make((const int64_t[]){4, 1024, 16, 64}, 4, (const int[]){0, 2, 1, 3}, 2, 256,
                         512, &p);
    assert_int_equal(p.unit_bytes, 16);
    assert_int_equal(p.rank, 4);
    assert_int_equal(p.out_shape[3], 8);
    assert_int_equal(p.in_stride[1], 8);        /* a: 64 elements */
    assert_int_equal(p.in_stride[2], 16 * 8);   /* s: 16 x 64 */
    ps_permute_plan_make((const int64_t[]){1, 1024, 16, 64}, 4, (const int[]){0, 2, 1, 3}, 2, 0,
                         0, &p);
    assert_int_equal(p.rank, 3); /* the batch of 1 dropped */
    ps_permute_plan_make((const int64_t[]){3, 5, 7}, 3, (const int[]){0, 1, 2}, 4, 0, 0, &p);
    assert_int_equal(p.rank, 1);
    assert_int_equal(p.n * (int64_t)p.unit_bytes, 3 * 5 * 7 * 4);
    ps_permute_plan_make((const int64_t[]){3, 5, 7}, 3, (const int[]){1, 2, 0}, 4, 0, 0, &p);
    assert_int_equal(p.rank, 2); /* y and z stay together */
    assert_int_equal(p.unit_bytes, 4);
    ps_permute_plan_make((const int64_t[]){4, 1024, 16, 64}, 4, (const int[]){0, 2, 1, 3}, 2, 258,
                         512, &p);
    assert_int_equal(p.unit_bytes, 2); /* a source off 4-byte alignment */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_permutations),
        cmocka_unit_test(the_plans_that_matter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
