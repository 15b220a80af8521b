/* A plan whose programs fit its devices. The planner's memory estimate is
 * its programs' peak or a few percent above, not always
 * (planner/program_memory.h): this lowers each plan, measures every
 * device's peak exactly, and where one would run out plans again with less
 * memory per device (below the failing stage's estimate by what it lacked
 * and half as much again), up to a number of attempts. The plan returned
 * keeps the cluster's own memory. */
#ifndef PS_PLANNER_PLAN_FIT_H
#define PS_PLANNER_PLAN_FIT_H

#include <stdbool.h>

#include "core/plan.h"
#include "core/status.h"
#include "planner/plan_intra.h"
#include "planner/program_memory.h"

/* Plans req (whose cluster may carry less memory than the real one). */
typedef ps_status (*ps_planner_fn)(const ps_plan_request *req, void *ctx, ps_plan **out,
                                   ps_error *err);

typedef struct ps_plan_fit_options {
    int attempts;        /* plans made at most (>= 1) */
    double memory_scale; /* plan with this many times the devices' memory (1; a test mode) */
    bool check;          /* false: one plan, not lowered (programs left zero) */
} ps_plan_fit_options;

ps_plan_fit_options ps_plan_fit_options_default(void);

typedef struct ps_plan_fit {
    int attempts;               /* plans made */
    double cut_bytes;           /* memory per device the kept plan was made without */
    ps_program_memory programs; /* the kept plan's programs (when checked) */
} ps_plan_fit;

/* Plans req with `plan` until the programs fit. PS_ERR_INFEASIBLE with the
 * numbers when none of the attempts fits; a planner's own error otherwise
 * (named as a second attempt's when it was one). */
ps_status ps_plan_fitting(const ps_plan_request *req, const ps_plan_fit_options *o,
                          ps_planner_fn plan, void *ctx, ps_plan **out, ps_plan_fit *fit,
                          ps_error *err);

#endif
