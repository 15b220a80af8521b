/* A tile: one device's part of a tensor, as the executors hold it.
 *
 * Executors store fp32 tensors in fp32, fp16 and bf16 tensors in 2 bytes
 * per element where the backend holds half precision (exec/half.h; else in
 * fp32), and integer tensors (token ids, labels, MoE slots) as int32, all in
 * row-major order. A tile knows where it sits in the whole tensor (offset
 * and global shape), because some ops need global positions (the rows of a
 * vocabulary-split embedding table, a causal mask's query index, the element
 * count that a mean divides by). The memory belongs to the backend: host
 * memory for the CPU backend, device memory for the CUDA backend. */
#ifndef PS_EXEC_TILE_H
#define PS_EXEC_TILE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/op.h"

typedef struct ps_tile {
    void *data;                   /* float, int32_t (is_int) or half bits, borrowed */
    bool is_int;                  /* int32 elements */
    /* The element type held: PS_DTYPE_F32 (also for int tiles, is_int),
     * PS_DTYPE_F16 or PS_DTYPE_BF16 (2 bytes each). Zero is fp32. */
    ps_dtype dtype;
    int rank;                     /* 0 for a scalar (one element) */
    int64_t shape[PS_MAX_RANK];   /* local extent per dimension */
    int64_t global[PS_MAX_RANK];  /* whole tensor's extent */
    int64_t offset[PS_MAX_RANK];  /* global index of the tile's first element */
} ps_tile;

/* Bytes per element: 2 for a half tile, else 4. */
int ps_tile_elem_bytes(const ps_tile *t);
/* Whether the tile holds fp16 or bf16. */
bool ps_tile_is_half(const ps_tile *t);
/* Elements of the local tile (1 for a scalar). */
int64_t ps_tile_numel(const ps_tile *t);
/* Elements of the whole tensor. */
int64_t ps_tile_global_numel(const ps_tile *t);
/* Whether a dim other than `keep` is split across tiles (an op reducing
 * over those dims, as batchnorm's statistics, then needs its group). */
bool ps_tile_split_outside(const ps_tile *t, int keep);
/* A whole (unsharded) tensor as a tile: offset 0, shape == global; held
 * in fp32 (or int32) whatever its dtype. */
ps_tile ps_tile_whole(void *data, const ps_tensor_desc *d);

#endif
