#include "exec/permute_plan.h"

#include <stdbool.h>
#include <string.h>

void ps_permute_plan_make(const int64_t *in_shape, int rank, const int *perm, size_t elem_bytes,
                          uintptr_t src, uintptr_t dst, ps_permute_plan *out)
{
    memset(out, 0, sizeof *out);
    out->unit_bytes = elem_bytes;
    int64_t in_stride[PS_MAX_RANK], n = 1;
    for (int d = rank - 1; d >= 0; d--) {
        in_stride[d] = n;
        n *= in_shape[d];
    }
    out->n = n;
    if (n == 0)
        return;
    /* the output dims of extent other than 1, a dim merged into the one
     * after it where it lies that one's extent of strides further */
    int r = 0;
    for (int i = 0; i < rank; i++) {
        int64_t size = in_shape[perm[i]], stride = in_stride[perm[i]];
        if (size == 1)
            continue;
        out->out_shape[r] = size;
        out->in_stride[r] = stride;
        r++;
    }
    int m = 0;
    for (int i = 0; i < r; i++) {
        if (m > 0 && out->in_stride[m - 1] == out->in_stride[i] * out->out_shape[i]) {
            out->out_shape[m - 1] *= out->out_shape[i];
            out->in_stride[m - 1] = out->in_stride[i];
            continue;
        }
        out->out_shape[m] = out->out_shape[i];
        out->in_stride[m] = out->in_stride[i];
        m++;
    }
    out->rank = m;
    if (m == 0 || out->in_stride[m - 1] != 1)
        return;
    /* the innermost dim runs along the input: the widest unit that divides
     * its bytes, every other stride's and both addresses */
    for (size_t w = 16; w > elem_bytes; w /= 2) {
        size_t inner = (size_t)out->out_shape[m - 1] * elem_bytes;
        bool fits = inner % w == 0 && src % w == 0 && dst % w == 0;
        for (int i = 0; i + 1 < m && fits; i++)
            fits = ((size_t)out->in_stride[i] * elem_bytes) % w == 0;
        if (!fits)
            continue;
        int64_t per = (int64_t)(w / elem_bytes);
        out->out_shape[m - 1] /= per;
        for (int i = 0; i + 1 < m; i++)
            out->in_stride[i] /= per;
        out->unit_bytes = w;
        out->n = n / per;
        return;
    }
}
