#ifndef PS_PLANNER_PROGRAM_MEMORY_H
#define PS_PLANNER_PROGRAM_MEMORY_H

/* The memory a plan's programs take, exactly: the plan lowered to its
 * per-device programs (planner/lower.h) and their ALLOC/FREE walked in
 * order, as the simulator and the executors count it. The planner's own
 * estimate (the intra-op pass's walk of a micro-batch's tensors) is that or
 * a few percent above, not always: a composed stage, a reshard's
 * intermediate or a pre-reduction buffer it does not follow; this is what
 * `pipeshard plan` checks a plan against. */

#include "core/plan.h"
#include "core/status.h"

typedef struct ps_program_memory {
    int worst_device;       /* the device whose peak exceeds its memory most (or, when
                             * all fit, is closest to it) */
    int worst_stage;        /* its stage */
    double peak_bytes;      /* that device's peak */
    double memory_bytes;    /* that device's memory (its kind's) */
    double max_peak_bytes;  /* the largest peak of any device */
    double lower_s;         /* seconds spent lowering and walking */
} ps_program_memory;

/* Lowers p and measures every device's peak against its kind's memory. */
ps_status ps_plan_program_memory(const ps_plan *p, ps_program_memory *out, ps_error *err);

#endif
