/* The planner's prediction of a plan, as a run summary (source "planner"),
 * so that `compare` can put it beside simulated and measured runs. */
#ifndef PS_TRACES_PLAN_SUMMARY_H
#define PS_TRACES_PLAN_SUMMARY_H

#include "core/plan.h"
#include "core/program.h"
#include "traces/summary.h"

/* Per stage: the plan's forward/backward/update times and peak memory; per
 * device: its stage's compute and communication over one iteration as the
 * pipeline formula counts them (micro-batches x time, plus the update), idle
 * the rest. Each part is split into compute and communication by the
 * predicted seconds of its phase's kernel in `set` (the plan lowered):
 * micro-batches x forward by the forward kernel's, likewise the backward,
 * the update by the update kernel's (its gradient synchronization, once a
 * step; the plan's ops, summed, cannot tell the phases apart and counted
 * that synchronization once per micro-batch). receive_s (NULL: none
 * known): per stage, the seconds its devices spend receiving from other
 * stages over the step in the planner's schedule (ps_plan_pipeline_schedule),
 * counted as communication, as the simulator counts its receives.
 * compute_saved_s (NULL: none): per stage and phase ([stage *
 * PS_PHASE_COUNT + phase]), the seconds per kernel by which its computes
 * ran shorter in that schedule than its predicted times charge (on shared
 * cores where fewer devices computed at once than charged:
 * ps_pipeline_compute_saved_s): its forward, backward and update times
 * are those of the schedule. compute_wall_s (NULL: none): where not
 * negative, the seconds a kernel of that phase computed in the schedule
 * (ps_pipeline_compute_wall_s), its devices' compute; elsewhere (no
 * shared cores) their compute is the phase's kernel's share of its time.
 * PS_ERR_INVALID: set is not this plan's (another stage count). */
ps_status ps_summary_from_plan(const ps_plan *p, const ps_program_set *set, const double *receive_s,
                               const double *compute_saved_s, const double *compute_wall_s,
                               ps_summary **out);

#endif
