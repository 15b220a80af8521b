/* The CUDA backend (exec/backend.h's table on GPUs). Plain C: no CUDA
 * types; callers compile with PS_HAVE_CUDA=1.
 *
 * Device d of the plan runs on GPU d when the machine has at least
 * n_devices GPUs; then collectives and the ops' own reductions go through
 * NCCL (one communicator per collective group, created at the group's first
 * collective, when all its members have arrived). With fewer GPUs the
 * backend refuses, unless `share_gpu` is set: a test mode where every plan
 * device runs on GPU 0 with its own stream, and collectives and reductions
 * exchange data by device copies among the device threads (the same box
 * semantics, combined in rank order).
 *
 * Send/recv are buffered in both modes: the sender packs its chunk into a
 * staging buffer on its GPU and goes on; the receiver copies it over
 * (cudaMemcpyPeerAsync, NVLink where peer access is possible) and unpacks
 * it. A send never waits for its receiver, as on the CPU backend.
 *
 * Across hosts (options.hosts: one process per node under mpirun), each
 * process runs its node's devices on its GPUs (a second process on one
 * machine takes the GPUs after the first's). NCCL communicators span the
 * processes (member 0's unique id and the members' boxes travel through
 * exec/mailbox.h, MPI); sends to another process, and in share mode the
 * collectives over several processes, are staged through host memory and
 * combined there in member order (exec/host_collective.h), the arithmetic
 * of share mode in one process.
 *
 * Memory: a caching allocator per device (cudaMalloc once per block size,
 * freed blocks kept for reuse, and given back to the GPU when any device
 * allocation, in the pool or outside it, finds it full); peak_bytes counts
 * the bytes requested by
 * `alloc`, exactly, not the rounded blocks. Timing: one CUDA event per slot
 * and device, recorded on the device's stream. */
#ifndef PS_EXEC_CUDA_CUDA_BACKEND_H
#define PS_EXEC_CUDA_CUDA_BACKEND_H

#include <stdbool.h>

#include "core/status.h"
#include "exec/backend.h"
#include "exec/cuda/cuda_ops.h"
#include "exec/hosts.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ps_cuda_backend_options {
    bool share_gpu;  /* test mode: all plan devices on GPU 0 (see above) */
    bool allow_tf32; /* TF32 tensor-core GEMMs (off by default) */
    /* Test hook: collectives and reductions called by device
     * `inject_device` fail with PS_ERR_DEVICE before exchanging anything. */
    bool inject_collective_failure;
    int inject_device;
    /* The processes of a run across hosts (after ps_hosts_assign), borrowed;
     * NULL: every device of the plan runs in this process. */
    ps_hosts *hosts;
} ps_cuda_backend_options;

/* Everything off: real GPUs, full fp32, no injected failure. */
ps_cuda_backend_options ps_cuda_backend_options_default(void);

/* opt may be NULL (the defaults). Fails with PS_ERR_UNSUPPORTED when there
 * is no GPU, or too few GPUs without share_gpu. */
ps_status ps_cuda_backend_create(int n_devices, int timing_slots,
                                 const ps_cuda_backend_options *opt, ps_backend **out,
                                 ps_error *err);

/* The GPU plan device `device` runs on; the device's stream context
 * (borrowed), for callers that run ops directly with ps_cuda_op_run. The
 * backend must be a CUDA backend. */
int ps_cuda_backend_gpu(const ps_backend *b, int device);
ps_cuda_stream *ps_cuda_backend_stream(ps_backend *b, int device);

#ifdef __cplusplus
}
#endif

#endif
