#include "exec/buffer_tile.h"

#include <string.h>

#include "exec/half.h"

ps_tile ps_exec_buffer_tile(const ps_program_set *s, bool half_storage, const ps_program *prog,
                            int buffer, void *data)
{
    const ps_buffer *buf = &s->buffers[buffer];
    const ps_tensor *t = &s->step->tensors[buf->tensor];
    const int *mesh = s->stages[buf->stage].mesh;
    ps_tensor_desc tile;
    ps_tile x;
    memset(&x, 0, sizeof x);
    x.data = data;
    x.is_int = t->desc.dtype == PS_DTYPE_I32;
    if (half_storage && ps_half_dtype(t->desc.dtype))
        x.dtype = t->desc.dtype;
    x.rank = t->desc.rank;
    if (!ps_spec_tile(&buf->spec, &t->desc, mesh, &tile))
        tile = t->desc; /* the lowering only makes divisible layouts */
    int64_t offset[PS_MAX_RANK] = {0};
    ps_spec_tile_offset(&buf->spec, &t->desc, mesh, prog->coord[0], prog->coord[1], offset);
    for (int k = 0; k < x.rank; k++) {
        x.shape[k] = tile.shape[k];
        x.global[k] = t->desc.shape[k];
        x.offset[k] = offset[k];
    }
    return x;
}

int64_t ps_exec_buffer_bytes(const ps_program_set *s, bool half_storage, const ps_program *prog,
                             int buffer)
{
    ps_tile t = ps_exec_buffer_tile(s, half_storage, prog, buffer, NULL);
    return ps_tile_numel(&t) * ps_tile_elem_bytes(&t);
}

bool ps_exec_buffer_persistent(const ps_program_set *s, int buffer)
{
    const ps_tensor *t = &s->step->tensors[s->buffers[buffer].tensor];
    return !s->buffers[buffer].per_microbatch &&
           (t->kind == PS_TENSOR_PARAM || t->kind == PS_TENSOR_OPT_STATE);
}
