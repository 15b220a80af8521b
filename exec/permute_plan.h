/* How a permutation of a dense row-major array (output dim i = input dim
 * perm[i]) runs as the CUDA backend's permute kernel: dims of extent 1
 * dropped, output dims that are neighbours in the input too merged into
 * one, and, where the innermost output dim is the input's innermost, its
 * elements moved in units of up to 16 bytes when the extents and both
 * addresses allow; so the kernel's per-element index arithmetic runs over
 * fewer dims and fewer, wider elements. Plain C and host-only, so that it
 * is checked without a GPU (tests/test_permute_plan.c). */
#ifndef PS_EXEC_PERMUTE_PLAN_H
#define PS_EXEC_PERMUTE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "core/op.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ps_permute_plan {
    int rank;                       /* after dropping and merging (0: one unit) */
    int64_t out_shape[PS_MAX_RANK]; /* in units */
    int64_t in_stride[PS_MAX_RANK]; /* the input's stride of each output dim, in units */
    size_t unit_bytes;              /* what one index moves: the element or up to 16 bytes */
    int64_t n;                      /* units in all (0: nothing to move) */
} ps_permute_plan;

/* The plan for elements of elem_bytes (1, 2, 4, 8 or 16) from src to dst
 * (their addresses decide the widest unit). */
void ps_permute_plan_make(const int64_t *in_shape, int rank, const int *perm, size_t elem_bytes,
                          uintptr_t src, uintptr_t dst, ps_permute_plan *out);

#ifdef __cplusplus
}
#endif

#endif
