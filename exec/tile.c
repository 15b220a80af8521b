#include "exec/tile.h"

#include <string.h>

#include "exec/half.h"

int ps_tile_elem_bytes(const ps_tile *t) { return ps_tile_is_half(t) ? 2 : 4; }

bool ps_tile_is_half(const ps_tile *t) { return !t->is_int && ps_half_dtype(t->dtype); }

int64_t ps_tile_numel(const ps_tile *t)
{
    int64_t n = 1;
    for (int k = 0; k < t->rank; k++)
        n *= t->shape[k];
    return n;
}

int64_t ps_tile_global_numel(const ps_tile *t)
{
    int64_t n = 1;
    for (int k = 0; k < t->rank; k++)
        n *= t->global[k];
    return n;
}

bool ps_tile_split_outside(const ps_tile *t, int keep)
{
    for (int d = 0; d < t->rank; d++)
        if (d != keep && t->shape[d] != t->global[d])
            return true;
    return false;
}

ps_tile ps_tile_whole(void *data, const ps_tensor_desc *d)
{
    ps_tile t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.is_int = d->dtype == PS_DTYPE_I32;
    t.rank = d->rank;
    for (int k = 0; k < d->rank; k++)
        t.shape[k] = t.global[k] = d->shape[k];
    return t;
}
