/* Lowering: a plan becomes one program per device (core/program.h).
 *
 * Per stage, three SPMD kernels from the stage's part of the training step:
 * forward, backward (recomputation first) and update. Every op runs on its
 * local tiles in the layouts the plan chose; the resharding of each input
 * (collectives over a mesh axis, or a local slice) comes right before the op
 * that needs it, as the intra-op pass charged it; partial sums that a
 * strategy reduces inside its op become an all-reduce or reduce-scatter
 * after it. Gradients of parameters accumulate over micro-batches and are
 * synchronized (the update's resharding of its inputs) once per step.
 *
 * Per device, the schedule (1F1B or GPipe) runs the kernels per
 * micro-batch; tensors crossing stages travel as tile-level sends and
 * receives between the two meshes, received before the receiver's kernel
 * of the phase that produced them. With local all-gather (Alpa's
 * optimization) a tile that several receivers hold alike is sent once, in
 * chunks, and all-gathered among them. Parameters that two stages share
 * (tied embeddings) are sent from the stage that updates them to the others
 * after the update. Buffers are allocated where first written and freed
 * after their last use. */
#ifndef PS_PLANNER_LOWER_H
#define PS_PLANNER_LOWER_H

#include "core/plan.h"
#include "core/program.h"
#include "planner/plan_model.h"

typedef struct ps_lower_options {
    bool local_allgather; /* default true */
    /* Not NULL: a memory check only. Each device's peak (ps_program_peak_bytes)
     * goes to peak_bytes[device] ([the cluster's devices]) as soon as its
     * program is lowered, and its instructions are dropped: the set keeps
     * the kernels but no device program (GPT-3 175B's 1024 devices in 128
     * micro-batches: 3.5 GB of instructions otherwise). Default NULL. */
    double *peak_bytes;
} ps_lower_options;

ps_lower_options ps_lower_options_default(void);

/* Lowers plan p, whose model m was rebuilt with ps_plan_model_build (and
 * checked with ps_plan_check). The program set borrows m->step. */
ps_status ps_plan_lower(const ps_plan *p, const ps_plan_model *m, const ps_lower_options *o,
                        ps_program_set **out, ps_error *err);

#endif
