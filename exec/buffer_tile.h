/* Where a buffer of a program set lives on a device, as the runtime holds
 * it: the tile's shape, offset and element type, and whether the buffer
 * outlives the step. Shared by the runtime (exec/runtime.c) and the memory
 * estimate made before a run (exec/memory_need.c), so that the two count
 * the same bytes. */
#ifndef PS_EXEC_BUFFER_TILE_H
#define PS_EXEC_BUFFER_TILE_H

#include <stdbool.h>

#include "core/program.h"
#include "exec/tile.h"

/* The tile of `buffer` on the device running `prog` (data: borrowed, may
 * be NULL). half_storage: fp16/bf16 tensors held in 2 bytes (else fp32). */
ps_tile ps_exec_buffer_tile(const ps_program_set *s, bool half_storage, const ps_program *prog,
                            int buffer, void *data);

/* Bytes of that tile. */
int64_t ps_exec_buffer_bytes(const ps_program_set *s, bool half_storage, const ps_program *prog,
                             int buffer);

/* Whether the buffer outlives the step (a parameter or optimizer state,
 * one per step): its program-level FREE keeps the memory and the values
 * for the next step's ALLOC. */
bool ps_exec_buffer_persistent(const ps_program_set *s, int buffer);

#endif
