/* Profile mode: measures a backend's GEMM throughput and communication
 * times through the backend interface (exec/backend.h) and fills a profile
 * DB (core/profile_db.h) that the cost model reads with --profile-db.
 *
 * GEMMs: a synthetic MATMUL op ("mk,kn->mn") on device 0, per shape, on
 * fp32 tiles. One measurement per shape is recorded under every dtype
 * requested: on the CPU backend a half-precision GEMM is this fp32 GEMM on
 * widened copies (the conversions cost a few percent of a step; see
 * docs/executors.md, "Half precision"). A gemm_timer (below) measures each
 * dtype natively instead, as the CUDA backend's does (its half plans' GEMMs
 * run on half inputs).
 *
 * Other ops: every op of the given graphs that is not a MATMUL, through
 * the backend's op on whole tiles (float inputs small values of both signs
 * in no learnable order, Adam's second moment their absolute values,
 * integer ones zero: valid ids and labels), on device 0 alone or, with
 * gemm_all_devices, on every device at once as the GEMMs are. A
 * convolution is timed once per kind and GEMM shape (ps_conv_gemm_shape)
 * and recorded as that kind's GEMM entry under every dtype requested; any
 * other op once per kind and size, recorded by kind and by the bytes of its
 * inputs and outputs. A kind the backend refuses as unsupported is left out
 * (with a warning). The graphs come from the caller (the training steps of
 * small models: pipeshard profile builds them), since exec/ does not build
 * models.
 *
 * Communication: one thread per device, as the runtime runs them. For every
 * group size n (2, 4, 8, ... and the device count, at most max_group) the
 * devices 0..n-1 run all-reduce, all-gather, reduce-scatter and all-to-all
 * over sizes min_bytes, min_bytes * size_factor, ... up to max_bytes
 * (nccl-tests sizes: all-gather counts its output, reduce-scatter its input,
 * all-reduce and all-to-all their local buffer). send-recv is half a round
 * trip between devices 0 and 1 (0 sends, 1 receives and sends back, as
 * OSU's latency test), so that latency is not hidden by queued sends.
 * A repetition starts all members together (a barrier), times
 * `iters` back-to-back calls between two timing marks per device, and
 * counts the slowest member; iters is chosen from the fastest warm-up call
 * so that a repetition lasts at least min_rep_s. Every entry is the median of `reps`
 * repetitions, per call, and, with passes > 1, the median over the passes
 * (the whole measurement run that many times, one after the other) of
 * those: repetitions back to back share a slow spell of the machine, a
 * pass later does not. */
#ifndef PS_EXEC_PROFILE_H
#define PS_EXEC_PROFILE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/graph.h"
#include "core/profile_db.h"
#include "exec/backend.h"

/* Timing slots per device the backend must be created with. */
#define PS_PROFILE_SLOTS 2

typedef struct ps_profile_options {
    const char *device_name;        /* the DB's device kind name (NULL: the backend's) */
    /* GEMM shapes (borrowed), and the shapes of the op graphs' MATMUL ops;
     * n_shapes 0: no GEMMs */
    const ps_gemm_shape *shapes;
    int n_shapes;
    const ps_dtype *dtypes; /* recorded per dtype; n_dtypes 0: fp32 only */
    int n_dtypes;
    int64_t min_bytes, max_bytes; /* communication sizes; max_bytes 0: none */
    int size_factor;              /* >= 2 */
    int max_group;                /* largest group (0: every device) */
    unsigned kinds;               /* bit (1 << ps_profile_comm) per kind; 0: all */
    int warmup;                   /* untimed calls before timing, >= 1 */
    int reps;                     /* timed repetitions, >= 1 (median) */
    int passes;                   /* whole measurements, 1 to PS_PROFILE_MAX_PASSES (median);
                                   * 0: 1 */
    double min_rep_s;             /* a repetition lasts at least this long */
    bool progress;                /* one line per entry and pass on stderr */
    /* GEMMs on every device at once, the slowest counting: what they cost
     * when a plan's devices compute together on shared hardware (the CPU
     * backend's threads on the host's cores). A repetition then lasts at
     * least 50 ms, so that it spans the scheduler's time slices in which
     * the threads take turns. false: device 0 alone. */
    bool gemm_all_devices;
    /* GEMMs timed by this, once per shape and dtype, instead of the
     * backend's fp32 MATMUL op (e.g. cuBLAS in fp16/bf16: what a training
     * job in that dtype gets, where the executors compute in fp32). It
     * returns seconds per GEMM. NULL: the backend's op. */
    ps_status (*gemm_timer)(void *arg, const ps_gemm_shape *shape, ps_dtype dtype, int reps,
                            double *seconds, ps_error *err);
    void *gemm_timer_arg;
    /* graphs whose ops are timed (borrowed): the convolutions as their
     * kinds' GEMM entries, the others as op entries, the MATMULs' shapes
     * with the GEMMs (when n_shapes > 0); none: no op entries */
    const ps_graph *const *op_graphs;
    int n_op_graphs;
} ps_profile_options;

/* The full profile: GEMM cubes 64..2048, transformer-like rectangles and
 * thin and batched attention-like shapes, sizes 1 KiB .. 64 MiB by x2,
 * every kind, every group size. */
ps_profile_options ps_profile_options_default(void);
/* A quick one (seconds on a laptop): cubes 64..256 and two batched
 * per-head shapes, 1 KiB .. 4 MiB by x4, groups up to 4, few repetitions. */
ps_profile_options ps_profile_options_quick(void);

/* Measures b (created with PS_PROFILE_SLOTS timing slots per device) and
 * returns a finished DB of backend b->ops->name. */
ps_status ps_profile_measure(ps_backend *b, const ps_profile_options *o, ps_profile_db **out,
                             ps_error *err);

#endif
