/* Shared by the tests of einsums and permutations (test_gemm_plan,
 * test_permute_plan, test_cuda_ops): the einsums every GEMM path is checked
 * on, and a permutation by its definition. */
#ifndef PS_TESTS_TEST_LAYOUTS_H
#define PS_TESTS_TEST_LAYOUTS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/op.h"

/* The zoo's einsums (dense, attention, MoE, the head) and awkward ones. */
static const char *const test_einsum_specs[] = {
    "bk,kn->bn",       "bn,kn->bk",       "bk,bn->kn",        "bsk,kn->bsn",
    "bsn,kn->bsk",     "bsk,bsn->kn",     "bsh,vh->bsv",      "bsv,vh->bsh",
    "bsv,bsh->vh",     "bqad,bkad->baqk", "baqk,bkad->bqad",  "bqad,baqk->bkad",
    "baqk,bqad->bkad", "egcm,emf->egcf",  "egcf,efm->egcm",   "egcm,egcf->emf",
    "gsm,me->gse",     "ij,jk->ki",       "abc,cd->dba",      "k,k->",
    "i,j->ij",         "abij,abjk->baik", "xy,zy->yxz",       "kn,bk->bn",
    "ab,ab->ab",       "ab,ba->",         "cab,bd->acd",      "pqrs,sqt->tpr",
};
#define TEST_EINSUM_SPECS (sizeof test_einsum_specs / sizeof *test_einsum_specs)

/* y = x with out dim i = in dim perm[i], elements of elem bytes (the
 * permute kernel's semantics), dense row-major. */
static inline void test_permute_by_definition(const void *x, const int64_t *in_shape, int rank,
                                              const int *perm, size_t elem, void *y)
{
    int64_t stride[PS_MAX_RANK], out_shape[PS_MAX_RANK], n = 1;
    for (int d = rank - 1; d >= 0; d--) {
        stride[d] = n;
        n *= in_shape[d];
    }
    for (int i = 0; i < rank; i++)
        out_shape[i] = in_shape[perm[i]];
    for (int64_t i = 0; i < n; i++) {
        int64_t r = i, off = 0;
        for (int d = rank - 1; d >= 0; d--) {
            off += (r % out_shape[d]) * stride[perm[d]];
            r /= out_shape[d];
        }
        memcpy((char *)y + i * (int64_t)elem, (const char *)x + off * (int64_t)elem, elem);
    }
}

#endif
