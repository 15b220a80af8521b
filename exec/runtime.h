/* The runtime: runs a program set for real, one thread per device, against
 * a backend (exec/backend.h). One interpreter loop serves every backend.
 *
 * A buffer instance (buffer, micro-batch) gets backend memory at ALLOC and
 * gives it back at FREE. Parameters and optimizer state outlive the step:
 * their per-step FREE keeps the memory (and the values) for the next step's
 * ALLOC, and the first ALLOC fills them from the seed (exec/data.h); LOAD
 * fills input tiles the same way. Gradients marked ACCUMULATE are written
 * by the first micro-batch and added to by the others.
 *
 * Time: the backend stamps every instruction boundary; the runtime turns
 * the stamps of the last step into the run summary and the timeline, in the
 * formats the simulator writes (traces/summary.h, traces/trace.h). */
#ifndef PS_EXEC_RUNTIME_H
#define PS_EXEC_RUNTIME_H

#include <stdbool.h>
#include <stdint.h>

#include "core/program.h"
#include "exec/backend.h"
#include "exec/hosts.h"
#include "traces/summary.h"

/* Steps whose times the runtime keeps per device by default (the last
 * ones): the summary's medians are over them; memory stays bounded in long
 * runs. */
#define PS_EXEC_TIMES_KEPT 1000

/* ps_exec_options.nudge_params: which way the parameters start one ulp off. */
typedef enum ps_exec_nudge {
    PS_NUDGE_NONE = 0,
    PS_NUDGE_UP,   /* larger in magnitude */
    PS_NUDGE_DOWN, /* smaller in magnitude (a zero stays zero) */
} ps_exec_nudge;

typedef struct ps_exec_options {
    uint64_t seed;           /* parameters and data */
    int steps;               /* training steps (>= 1); the summary: medians over them
                              * (the last times_kept); the trace: the last */
    int times_kept;          /* steps whose times are kept, the last ones (0:
                              * PS_EXEC_TIMES_KEPT) */
    /* Steps run first and not timed (>= 0): the first step faults in its
     * activations' memory and fills the backends' caches. Parameters,
     * optimizer state and the loss scale then start again from their initial
     * values: the `steps` that follow compute what a run without warm-up
     * computes. */
    int warmup_steps;
    const char *trace_path;  /* timeline of the last step, or NULL */
    int devices_per_node;    /* trace processes (hosts); 0: all devices in one */
    const char *source;      /* summary source; NULL: "exec-" and the backend's name */
    bool keep_params;        /* copy the parameters after the last step to the result */
    bool trace_ops;          /* one timeline span per op (default: per run of a kernel's
                              * consecutive computations, as the simulator writes) */
    ps_hosts *hosts;         /* the processes of an MPI launch (after ps_hosts_assign),
                              * borrowed; NULL: every device runs in this process */
    /* Called once, from the failing device's thread, at the run's first
     * failure, before the other devices are stopped; NULL: none. A launch
     * of several processes stops them all from here (ps_hosts_abort): a
     * peer of another process may wait where no abort of this one reaches
     * (an NCCL communicator's setup). */
    void (*on_failure)(void *arg, ps_status st, const ps_error *err);
    void *on_failure_arg;
    /* ReLU alignment for --check (docs/executors.md): a ReLU input within
     * rounding of zero may fall on either side in two correct runs, and the
     * gradient then differs by that element's whole upstream gradient.
     * keep_relus: the run keeps every RELU output of every step (whole,
     * fp32) in its result (one process only). align_relus, with the graph it
     * ran: this run's RELU outputs of the same tensor name, step and
     * micro-batch take the kept value wherever the two lie on different
     * sides of zero and differ by at most align_tol times the output's
     * largest magnitude (fp32 outputs; counted in relu_flips). */
    bool keep_relus;
    const struct ps_exec_result *align_relus;
    const ps_graph *align_graph;
    double align_tol;
    /* Every parameter element (and its master copy) starts one unit in the
     * last place of the parameter's storage (fp32, or fp16/bf16 where the
     * backend holds them so) larger (PS_NUDGE_UP) or smaller (PS_NUDGE_DOWN)
     * in magnitude: --check's two samples of how far rounding alone moves
     * the model's gradients. */
    ps_exec_nudge nudge_params;
    /* Run without first asking the backend whether the devices' tiles fit
     * (exec/memory_need.h): a plan that does not fit then fails at an
     * allocation, or, in host memory, may be killed by the system. */
    bool skip_memory_check;
    /* Test mode: device straggler_device (-1: none) starts every timed step
     * straggler_s seconds late, as a slow peer does (PIPESHARD_STRAGGLER). */
    int straggler_device;
    double straggler_s;
} ps_exec_options;

ps_exec_options ps_exec_options_default(void);

/* Across several processes every process gets the loss (summed over all
 * hosts); the summary, the trace, params and grads are rank 0's only (NULL
 * elsewhere). */
typedef struct ps_exec_result {
    int steps;
    double *loss;            /* [steps]: the loss summed over micro-batches */
    /* Dynamic loss scaling (0 and false without): the scale each step ran
     * at, and whether its gradients overflowed (the update skipped) */
    double *loss_scale;      /* [steps] */
    bool *skipped;           /* [steps] */
    ps_summary *summary;     /* measured: each time the median over the steps */
    double *step_s;          /* [steps]: each step's time, from its start to the end of
                              * its last device (rank 0; 0 elsewhere, and for steps
                              * before the kept ones) */
    int n_tensors;           /* of the step graph */
    float **params;          /* [n_tensors]: whole PARAM tensors after the run (keep_params), or NULL */
    float **grads;           /* [n_tensors]: by PARAM tensor, the gradient the last update read */
    /* keep_relus: [(step * relu_micro_batches + mb) * n_tensors + tensor],
     * the whole output of a RELU op (NULL elsewhere) */
    float **relus;
    int relu_micro_batches;
    /* align_relus: outputs that took the kept value, and the first of them */
    int64_t relu_flips;
    char relu_first[192];
    double wall_s;           /* the whole run */
} ps_exec_result;

void ps_exec_result_free(ps_exec_result *r);

/* Timing slots a device needs for one step of its program (for backends
 * that preallocate events). */
int ps_exec_timing_slots(const ps_program_set *s, int device);

ps_status ps_exec_run(const ps_program_set *s, ps_backend *b, const ps_exec_options *o,
                      ps_exec_result **out, ps_error *err);

#endif
