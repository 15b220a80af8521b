/* The interface between the runtime (exec/runtime.c: one interpreter loop
 * over a device's program) and a backend: a table of function pointers, as
 * in ggml's backend interface. The runtime decides WHAT happens (which
 * tiles, in which order, with which global boxes); a backend only moves and
 * computes numbers in its own memory and stamps times.
 *
 * Threads: the runtime runs one thread per device of the plan (on this
 * host) and calls every function with that thread's `device`; functions for
 * different devices run concurrently. Collectives, sends and receives block
 * until the data is there (sends may return once the data is copied out).
 * Every function returns PS_OK or an error whose message names the device
 * and the failing call; after an error on one device the runtime calls
 * `abort` once so that peers blocked in a collective or receive return
 * PS_ERR_DEVICE instead of hanging. */
#ifndef PS_EXEC_BACKEND_H
#define PS_EXEC_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "core/collective.h"
#include "core/status.h"
#include "exec/op_exec.h"
#include "exec/tile.h"

typedef struct ps_backend ps_backend;

/* Devices of a collective in ring order, and this device's place in it. */
typedef struct ps_exec_group {
    int id;             /* the program set's group index (stable across devices) */
    int n;
    const int *devices; /* borrowed */
    int rank;           /* of the calling device in `devices` */
} ps_exec_group;

typedef struct ps_backend_ops {
    const char *name; /* "cpu", "cuda" */

    /* Memory (bytes counted exactly; peak memory comes from here). */
    ps_status (*alloc)(ps_backend *b, int device, int64_t bytes, void **out, ps_error *err);
    void (*release)(ps_backend *b, int device, void *ptr);
    /* Host <-> backend copies (parameter initialisation, data, results). */
    ps_status (*upload)(ps_backend *b, int device, void *dst, const void *host, int64_t bytes,
                        ps_error *err);
    ps_status (*download)(ps_backend *b, int device, void *host, const void *src,
                          int64_t bytes, ps_error *err);

    /* Compute: an op on local tiles (exec/op_exec.h); dst += src, tiles of
     * one shape and element type (gradient accumulation; a half tile
     * rounds the sum); a tile filled with zeros. */
    ps_status (*op)(ps_backend *b, int device, const ps_op *op, const ps_tile *in, ps_tile *out,
                    const ps_op_context *ctx, ps_error *err);
    ps_status (*accumulate)(ps_backend *b, int device, ps_tile *dst, const ps_tile *src,
                            ps_error *err);
    ps_status (*zero)(ps_backend *b, int device, ps_tile *t, ps_error *err);
    /* Local re-layout: every element of dst's global box that src's box
     * holds is copied from src (dst and src are tiles of one tensor). */
    ps_status (*copy_box)(ps_backend *b, int device, const ps_tile *src, ps_tile *dst,
                          ps_error *err);

    /* Communication. A collective reads each member's src tile and writes
     * each member's dst tile (tiles of one tensor; boxes in global
     * coordinates): all-reduce and reduce-scatter sum the members' src over
     * dst's box; all-gather and all-to-all copy every element of dst's box
     * from a member whose src box holds it. An op's own reduction (a loss
     * over a split vocabulary) is `reduce`: in place, n floats. */
    ps_status (*collective)(ps_backend *b, int device, const ps_exec_group *g,
                            ps_collective kind, const ps_tile *src, ps_tile *dst, ps_error *err);
    ps_status (*reduce)(ps_backend *b, int device, const ps_exec_group *g, float *data,
                        int64_t n, ps_reduce_op op, ps_error *err);
    /* Point to point: flat chunk `chunk` of `chunks` of the elements of the
     * tile inside `box` (row-major over the box), sent to / received from
     * `peer`; messages between one pair arrive in order. */
    ps_status (*send)(ps_backend *b, int device, int peer, const ps_tile *src,
                      const int64_t *box_offset, const int64_t *box_size, int chunk, int chunks,
                      ps_error *err);
    ps_status (*recv)(ps_backend *b, int device, int peer, ps_tile *dst,
                      const int64_t *box_offset, const int64_t *box_size, int chunk, int chunks,
                      ps_error *err);

    /* Timing: stamp `slot` (0 .. slots-1, given at create) after the work
     * issued so far on the device; `elapsed` (after `finish`) is the time
     * from slot a to slot b in seconds. */
    ps_status (*mark)(ps_backend *b, int device, int slot, ps_error *err);
    /* Waits for the work issued on the device. A backend may answer here the
     * data checks its ops deferred (an id outside the vocabulary, inf or NaN
     * in an update's gradient), failing with the op's message; the runtime
     * calls it at the end of every step. */
    ps_status (*finish)(ps_backend *b, int device, ps_error *err);
    ps_status (*elapsed)(ps_backend *b, int device, int a, int z, double *seconds,
                         ps_error *err);
    /* Peak bytes allocated on the device since creation. */
    int64_t (*peak_bytes)(ps_backend *b, int device);

    /* Unblocks every device waiting in a collective or receive (they fail
     * with PS_ERR_DEVICE); called once after the first error. */
    void (*abort)(ps_backend *b);
    void (*destroy)(ps_backend *b);

    /* Optional, NULL where a backend has none (keep these last: positional
     * initializers end before them): `reduce` in double precision. */
    ps_status (*reduce64)(ps_backend *b, int device, const ps_exec_group *g, double *data,
                          int64_t n, ps_reduce_op op, ps_error *err);
    /* Whether any element of the n tiles (float or half) is inf or NaN (the
     * overflow vote of dynamic loss scaling: one answer for all of a device's
     * gradients). */
    ps_status (*find_nonfinite)(ps_backend *b, int device, const ps_tile *tiles, int n,
                                bool *found, ps_error *err);
    /* Whether `op` can add output `out` into tile t's content
     * (ps_op_context.accumulate): a gradient accumulated over micro-batches
     * then needs no scratch tile and no `accumulate` pass over it (NULL:
     * never). */
    bool (*op_accumulates)(ps_backend *b, const ps_op *op, int out, const ps_tile *t);
    /* Whether the run's memory fits, before it starts (NULL: not checked).
     * need[d]: the bytes device d holds at its peak (exec/memory_need.h; 0
     * for devices of other processes). Fails with PS_ERR_NOMEM and a message
     * that names the need, the memory and what is available there. */
    ps_status (*check_memory)(ps_backend *b, const int64_t *need, ps_error *err);
    /* The host clock (ps_monotonic_s, seconds) that stamped `slot`, where a
     * backend's stamps are readings of it (NULL: they are device events,
     * placed on the host's clock by a reading beside the mark). */
    ps_status (*stamp_host_s)(ps_backend *b, int device, int slot, double *host_s,
                              ps_error *err);
} ps_backend_ops;

struct ps_backend {
    const ps_backend_ops *ops;
    int n_devices; /* devices of the plan this backend serves */
    /* Whether fp16/bf16 tensors are held in 2 bytes (ps_tile.dtype) and
     * every function takes half tiles; false: the runtime holds them in
     * fp32, as fp32 tensors. */
    bool half_storage;
};

#endif
