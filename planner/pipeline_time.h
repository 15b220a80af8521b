/* The pipeline's iteration time with the transfers between its stages.
 *
 * Alpa's stage DP prices a pipeline as sum(t_i) + (B - 1) max(t_i), stage
 * times alone. With 1F1B a stage keeps at most (stages after it + 1)
 * micro-batches in flight, so a transfer between stages that is short beside
 * a stage still stretches every cycle of the schedule: on two stages with
 * stage time t and transfer c each way, one micro-batch per t + c instead of
 * per t. This module prices the transfers (with the lowering's own
 * cross-mesh plan, planner/cross_mesh.h) and times the exact schedule the
 * lowering emits, instruction order and dependencies, with the transfers and
 * the stages' own collectives across nodes sharing the NICs they cross, flow
 * by flow. */
#ifndef PS_PLANNER_PIPELINE_TIME_H
#define PS_PLANNER_PIPELINE_TIME_H

#include "core/graph.h"
#include "core/plan.h"
#include "core/program.h"

typedef enum ps_link_kind {
    PS_LINK_FORWARD = 0,     /* per micro-batch: from's forward, then to's forward */
    PS_LINK_BACKWARD = 1,    /* per micro-batch: from's backward, then to's backward */
    PS_LINK_ACCUMULATED = 2, /* per step: from's last backward, then to's update (a shared
                              * parameter's gradient contribution) */
    PS_LINK_PARAM_COPY = 3,  /* per step: from's update, then the end of to's step (the
                              * updated value of a parameter both stages read) */
    PS_LINK_UPDATE = 4,      /* per step: from's update, then to's update (what one
                              * stage's update makes and another's reads) */
    PS_LINK_KIND_COUNT
} ps_link_kind;

/* The tensors one stage sends another in one phase, together. */
typedef struct ps_stage_link {
    int from, to;
    ps_link_kind kind;
    int tensors;
    double bytes;    /* whole tensors */
    double reduce_s; /* the sender's reductions of partial sums first (its time) */
    double reduce_nic_s; /* of which on mesh axes across the sender's nodes: it holds
                          * their NICs both ways (ps_stage_nics) */
    double seconds;  /* then the transfers and local all-gathers: the receiver's time, as
                      * a transfer starts when its receiver asks for it */
    /* The node NICs it crosses: nodes [nic_node[0], + nic_nodes[0]) send
     * through theirs, [nic_node[1], + nic_nodes[1]) receive; nic_s: how long
     * the busiest of them carries its bytes (0: it stays within nodes). */
    int nic_node[2], nic_nodes[2];
    double nic_s;
    int nic_flows; /* the transfers at once through the busiest of them: its receivers
                    * whose transfers cross it (a receiver takes its transfers in turn,
                    * a sender posts all of its sends at once) */
} ps_stage_link;

/* A stage's own collectives across nodes. Its update reshards the
 * gradients (and the optimizer's layouts) as its ILP priced them; the rings
 * of those reshardings on mesh axes that cross nodes hold every NIC of the
 * stage's nodes, both ways, while they run, as do its reductions over such
 * axes before it sends (ps_stage_link.reduce_nic_s). The kernels' own
 * collectives are not counted: they run between the kernel's compute. */
typedef struct ps_stage_nics {
    int node, nodes;     /* the stage's nodes */
    double update_nic_s; /* of its update_s: the reshardings' rings across nodes */
    int nic_flows;       /* its mesh's rings through each NIC (the most of its axes
                          * across nodes) */
} ps_stage_nics;

/* The links between the stages of plan p, whose training step is `step` (built
 * knowing the stages; planner/plan_model.h), priced with or without local
 * all-gather. *out: malloc'ed, one entry per (from, to, kind). nics: NULL,
 * or p->n_stages entries to fill. */
ps_status ps_plan_stage_links(const ps_plan *p, const ps_graph *step, bool local_allgather,
                              ps_stage_link **out, int *n_out, ps_stage_nics *nics,
                              ps_error *err);

/* Devices that share their node's cores (a cluster's shared_cores_per_node,
 * the CPU backend's threads): the stage times charge every compute at the
 * node's compute share, as if all of its devices computed at once. Given
 * this, the schedule instead runs each kernel's compute at the speed the
 * cores leave it at each moment: while the stages computing on a node hold
 * n of its devices, each computes at min(1, cores / n) of its speed alone
 * (processor sharing, as the simulator shares them), the kernel's other
 * part (its collectives, the reductions it sends) at its charged time. */
/* A kernel's meeting: a collective of `members` devices after before_s
 * alone-seconds (what it takes a device computing by itself) of the
 * kernel's compute since its previous meeting, or since its start. */
typedef struct ps_meeting {
    double before_s;
    int members;
} ps_meeting;

typedef struct ps_stage_cores {
    int node, nodes;      /* the stage's nodes */
    int devices_per_node; /* its devices on each of them */
    /* per phase, the fraction of its time that computes (0 to 1) */
    double compute[PS_PHASE_COUNT];
    /* With a scheduler slice (ps_shared_cores.slice_s), per phase: its
     * kernel's meetings in order (borrowed; NULL when none), and the
     * alone-seconds it computes after the last (all of its compute when it
     * has none). */
    const ps_meeting *meetings[PS_PHASE_COUNT];
    int n_meetings[PS_PHASE_COUNT];
    double tail_s[PS_PHASE_COUNT];
} ps_stage_cores;

/* With a scheduler slice, devices that meet lose the lockstep delay
 * (ps_lockstep_delay_s; docs/simulator.md) as the simulator charges it:
 * after each receive's transfer (2 members; the stage computed since its
 * previous meeting) and at each meeting of a kernel, once its compute
 * reaches the meeting's share of the kernel's alone-seconds, against the
 * devices of the node's other stages then computing or waiting in a delay
 * of their own (the receive's sender aside). The stage waits the delay out,
 * runnable but not computing; it adds to the receive's (the kernel's) time. */
typedef struct ps_shared_cores {
    double cores;                 /* each node's */
    double share;                 /* the compute share the stage times include (> 1) */
    double slice_s;               /* the scheduler slice (0: no lockstep delays) */
    const ps_stage_cores *stages; /* one per stage */
} ps_shared_cores;

/* Iteration time of n stages running `micro_batches` micro-batches in the
 * lowering's order (1F1B: stage k runs min(n - k - 1, B) forwards, then a
 * forward and a backward in turn, then the remaining backwards; GPipe: all
 * forwards, then all backwards), then its update. A forward (backward) waits
 * for its own stage, then receives each forward (backward) link into the
 * stage of the same micro-batch in turn (a link's transfer starts when its
 * data is ready and the receiver asks); after a kernel the stage reduces
 * the partial sums it sends. An update waits for the stage's last backward
 * and its accumulated and update links; the step ends when every update has
 * and every parameter copy is received.
 * The transfers of neighbouring stages through one node's NIC share it: a
 * link through NICs (nic_s > 0) uses nic_s / seconds of each NIC it crosses
 * (one direction) while it moves at full speed, in nic_flows flows; where
 * the flows under way would use more than a whole NIC, the NICs are shared
 * max-min fairly among the flows (water-filling: every flow the same
 * bandwidth, none faster than its link alone, the NIC that fills first
 * deciding for those through it), as the simulator shares its links. With
 * nics (n entries, else NULL), a stage's collectives across its nodes take
 * part: its update first runs update_nic_s on all its NICs both ways, and a
 * reduction's reduce_nic_s runs after the rest of it the same way, each
 * using whole NICs in the stage's nic_flows rings.
 * Times are per micro-batch (forward, backward) and per step (update).
 * NAN if the links make the schedule wait for itself. */
double ps_pipeline_iteration_s(int n, const double *forward_s, const double *backward_s,
                               const double *update_s, const ps_stage_link *links,
                               int n_links, const ps_stage_nics *nics, int micro_batches,
                               bool gpipe);

/* What a stage does over a span of the schedule. */
typedef enum ps_pipeline_span_kind {
    PS_SPAN_FORWARD = 0, /* a micro-batch's forward kernel (and the reductions it sends) */
    PS_SPAN_BACKWARD,    /* a micro-batch's backward kernel (likewise) */
    PS_SPAN_ACCUMULATED, /* after the last backward: reducing what it accumulated for others */
    PS_SPAN_UPDATE,      /* the update (and the reductions of what it sends) */
    PS_SPAN_RECEIVE,     /* a link's transfer into the stage, from when it moves */
    PS_SPAN_STAGE_NICS,  /* the stage's own collectives across its nodes */
    PS_SPAN_KIND_COUNT
} ps_pipeline_span_kind;

/* One span of a stage's part of the schedule; seconds from the step's start. */
typedef struct ps_pipeline_span {
    int stage;
    ps_pipeline_span_kind kind;
    int micro_batch; /* -1: once per step */
    int link;        /* PS_SPAN_RECEIVE: the link (index into links), else -1 */
    double start_s, end_s;
    /* On shared cores (ps_shared_cores), a kernel's compute: the seconds
     * the stage times charge for it, and those it took in the schedule
     * (both 0 elsewhere). */
    double charged_compute_s, compute_s;
    /* Of its time, the lockstep delays (ps_shared_cores; 0 elsewhere). */
    double lockstep_s;
} ps_pipeline_span;

/* ps_pipeline_iteration_s, and the schedule it timed: every stage's spans
 * in its own order, stage after stage (*spans malloc'ed: the kernels
 * always, the rest where it takes time; NULL and 0 when the result is NAN).
 * A stage waits (idles) between its spans. */
double ps_pipeline_schedule(int n, const double *forward_s, const double *backward_s,
                            const double *update_s, const ps_stage_link *links, int n_links,
                            const ps_stage_nics *nics, int micro_batches, bool gpipe,
                            ps_pipeline_span **spans, int *n_spans);

/* ps_pipeline_schedule with the kernels' computes on shared cores (cores:
 * NULL, or its `stages` n entries: as ps_pipeline_schedule). */
double ps_pipeline_schedule_shared(int n, const double *forward_s, const double *backward_s,
                                   const double *update_s, const ps_stage_link *links, int n_links,
                                   const ps_stage_nics *nics, const ps_shared_cores *cores,
                                   int micro_batches, bool gpipe, ps_pipeline_span **spans,
                                   int *n_spans);

/* Per stage, the seconds it spends receiving in `spans` (n_stages
 * entries, malloc'ed; NULL when out of memory). */
double *ps_pipeline_receive_seconds(int n_stages, const ps_pipeline_span *spans, int n_spans);

/* Per stage and phase ([stage * PS_PHASE_COUNT + phase]), the seconds by
 * which its kernels in `spans` ran shorter than the stage times charge for
 * them, on average over its kernels of that phase (per micro-batch for the
 * forward and the backward, per step for the update): 0 without shared
 * cores, more where fewer devices computed at once than the charge assumes,
 * less by the lockstep delays (below 0 where they outweigh it;
 * n_stages * PS_PHASE_COUNT entries, malloc'ed; NULL when out of memory).
 * The stage's phase took its charged time less that. */
double *ps_pipeline_compute_saved_s(int n_stages, const ps_pipeline_span *spans, int n_spans);

/* Per stage and phase, the seconds its kernels of that phase computed in
 * `spans` where the schedule shared cores (their mean, the compute part
 * only), -1 where it did not (n_stages * PS_PHASE_COUNT entries, malloc'ed;
 * NULL when out of memory). */
double *ps_pipeline_compute_wall_s(int n_stages, const ps_pipeline_span *spans, int n_spans);

/* The schedule of plan p as the planner times it (its stages' predicted
 * times, the links of its lowering with local all-gather, its schedule; on
 * a cluster whose devices share cores, the kernels' computes shared as
 * ps_pipeline_schedule_shared shares them, each stage's compute fractions
 * from its ops' predicted compute and communication, and with a scheduler
 * slice the lockstep delays of its kernels' meetings, read off the plan's
 * lowered programs):
 * *iteration_s (NAN when the links wait for each other, as
 * ps_pipeline_schedule), where spans is not NULL the spans, and where
 * links is not NULL the links the spans' receives index (all malloc'ed).
 * `step` as for ps_plan_stage_links. */
ps_status ps_plan_pipeline_schedule(const ps_plan *p, const ps_graph *step,
                                    ps_pipeline_span **spans, int *n_spans,
                                    ps_stage_link **links, int *n_links, double *iteration_s,
                                    ps_error *err);

#endif
