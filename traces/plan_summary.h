/* The planner's prediction of a plan, as a run summary (source "planner"),
 * so that `compare` can put it beside simulated and measured runs. */
#ifndef PS_TRACES_PLAN_SUMMARY_H
#define PS_TRACES_PLAN_SUMMARY_H

#include "core/plan.h"
#include "traces/summary.h"

/* Per stage: the plan's forward/backward/update times and peak memory; per
 * device: its stage's compute and communication over one iteration as the
 * pipeline formula counts them (micro-batches x time, plus the update), idle
 * the rest. */
ps_status ps_summary_from_plan(const ps_plan *p, ps_summary **out);

#endif
