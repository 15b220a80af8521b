/* Internal to exec/cuda: what a device of the CUDA backend exchanges with
 * devices of other processes (a run across hosts, exec/hosts.h). Every
 * transfer is staged through host memory and travels through the mailbox
 * (MPI between processes), so that a send never waits for its receiver, as
 * within one process, and collectives combined on the host give the CPU
 * backend's arithmetic (exec/host_collective.h). NCCL collectives across
 * processes use the two exchanges of metadata below (the members' boxes,
 * the communicator's unique id). CUDA C++ only. */
#ifndef PS_EXEC_CUDA_REMOTE_CUH
#define PS_EXEC_CUDA_REMOTE_CUH

#include <stddef.h>
#include <stdint.h>

#include "exec/cuda/cuda_internal.cuh"

extern "C" {
#include "exec/backend.h"
#include "exec/mailbox.h"
}

/* Flat elements [start, start + len) of the box of `src` to `peer` (of
 * another process): packed on the GPU into `staging` (room for len
 * elements), copied to host memory and posted; returns once posted. */
ps_status ps_cuda_remote_send(ps_mailbox *mb, ps_cuda_stream *s, int peer, const ps_tile *src,
                              const int64_t *box_offset, const int64_t *box_size, int64_t start,
                              int64_t len, void *staging, ps_error *err);
/* The next message from `peer` into those elements of dst's box, through
 * `staging` (room for len elements); fails with a named error when its
 * length or element type differs from the receive's. */
ps_status ps_cuda_remote_recv(ps_mailbox *mb, ps_cuda_stream *s, int peer, ps_tile *dst,
                              const int64_t *box_offset, const int64_t *box_size, int64_t start,
                              int64_t len, void *staging, ps_error *err);

/* A collective of fp32 tiles over a group with members in other
 * processes, combined on the host in member order. */
ps_status ps_cuda_remote_collective(ps_mailbox *mb, ps_cuda_stream *s, const ps_exec_group *g,
                                    ps_collective kind, const ps_tile *src, ps_tile *dst,
                                    ps_error *err);
/* The in-place all-reduce (sum or max) of n floats (dbl: doubles) in device
 * memory over such a group, combined on the host in member order. */
ps_status ps_cuda_remote_reduce(ps_mailbox *mb, ps_cuda_stream *s, const ps_exec_group *g,
                                void *data, int64_t n, ps_reduce_op op, bool dbl, ps_error *err);

/* NCCL across processes. Every member's src and dst geometry (srcs[m],
 * dsts[m], data pointers NULL), for the boxes a collective moves; `kind`
 * names the collective (members of different ones fail with a named
 * error). */
ps_status ps_cuda_remote_boxes(ps_mailbox *mb, int device, const ps_exec_group *g, int kind,
                               const ps_tile *src, const ps_tile *dst, ps_tile *srcs,
                               ps_tile *dsts, ps_error *err);
/* Every member's element count for a reduction (counts[m]). */
ps_status ps_cuda_remote_counts(ps_mailbox *mb, int device, const ps_exec_group *g, int kind,
                                int64_t n, int64_t *counts, ps_error *err);
/* The group's communicator id: member 0 gives `bytes` bytes at id, every
 * other member receives them into id. */
ps_status ps_cuda_remote_share_id(ps_mailbox *mb, int device, const ps_exec_group *g, void *id,
                                  size_t bytes, ps_error *err);

#endif
