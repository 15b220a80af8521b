/* The intra-op pass: a sharding strategy for every op of a training step on
 * one logical mesh, chosen by the ILP of planner/intra_ilp.c.
 *
 * Nodes are the ops and the source tensors (inputs, parameters, optimizer
 * state); a node's cost is its compute plus in-op collectives, an edge's cost
 * the resharding between a producer's layout and a consumer's. Costs are per
 * micro-batch; what runs once per step (the update, and the gradient
 * reductions that feed it) is divided by the number of micro-batches. The
 * in-place operands of the update (parameter, Adam state) also pay for
 * returning to their own layout (ZeRO's all-gather of updated shards). */
#ifndef PS_PLANNER_INTRA_PASS_H
#define PS_PLANNER_INTRA_PASS_H

#include "planner/intra_ilp.h"
#include "planner/strategy.h"

typedef enum ps_intra_method {
    PS_METHOD_SHARD = 0, /* free ILP */
    PS_METHOD_DATA = 1,  /* batch split over axis 0, everything else replicated */
    PS_METHOD_ZERO2 = 2, /* data + optimizer state (and the update) sharded */
    PS_METHOD_ZERO3 = 3, /* zero2 + parameters sharded, gathered on use */
    PS_METHOD_COUNT
} ps_intra_method;

extern const char *const ps_intra_method_names[PS_METHOD_COUNT];

typedef struct ps_intra_options {
    ps_intra_method method;
    bool force_batch_axis0;
    /* identical layers take identical strategies, so that the ILP solves
     * one layer of each kind (default true) */
    bool tie_layers;
    int micro_batches;         /* per-step costs are divided by this (>= 1) */
    double memory_budget_bytes; /* per device; 0 = no memory constraint */
    /* Seconds charged per byte of memory per device in the objective: a soft
     * alternative to the budget that keeps the exact reductions (0 = none). */
    double memory_weight_s_per_byte;
    ps_ilp_options ilp;
} ps_intra_options;

ps_intra_options ps_intra_options_default(void);

typedef struct ps_intra_result {
    int n_ops, n_tensors;
    ps_strategy *op_strategy;      /* [n_ops] the chosen strategy of each op */
    ps_sharding_spec *tensor_spec; /* [n_tensors] each tensor's layout as produced/stored */
    double *reshard_in_s;          /* [n_ops] resharding paid on the op's inputs */
    double compute_s[PS_PASS_COUNT]; /* per micro-batch; update: per step */
    double comm_s[PS_PASS_COUNT];    /* in-op collectives + resharding, same units */
    double objective_s;            /* ILP objective: per micro-batch, update amortized */
    double weight_bytes, gradient_bytes, optimizer_bytes, activation_bytes; /* per device */
    double *activation_tensor_bytes; /* [n_tensors] what each adds to activation_bytes */
    /* above the lasting bytes (weights, gradients, optimizer state): what a
     * micro-batch's peak adds to its kept activations, and what the update
     * holds at once (when no micro-batch keeps activations) */
    double transient_bytes, update_transient_bytes;
    double peak_memory_bytes;      /* ps_intra_peak_bytes(r, 1) */
    double min_memory_bytes;       /* the least any layout needs (without temporaries) */
    ps_ilp_result ilp;
    int ilp_nodes, ilp_edges;
    int tied_layers;               /* layers that reused another layer's strategies */
    double strategies_total;       /* before reductions */
} ps_intra_result;

/* A device's peak with `in_flight` micro-batches' activations kept: the
 * lasting bytes and the larger of in_flight x the activations plus a
 * micro-batch's transient, and the update's. */
double ps_intra_peak_bytes(const ps_intra_result *r, int in_flight);

/* Per tensor (1 byte each, caller frees): whether its consumers all take
 * partial sums (the update, or gradient sums feeding it), so that its
 * producer need not reduce: the strategy option of that name. */
ps_status ps_intra_keep_partial(const ps_graph *g, unsigned char **out, ps_error *err);

/* What a step keeps whole, summed over its tensors at their full size
 * (bytes): `lasting`, its weights, optimizer state and the gradients
 * accumulated for the update; `activations`, one micro-batch's kept
 * activations (the forward tensors its backward or recomputation reads).
 * The same roles ps_intra_solve's memory counts, per device, in the tiles
 * of a layout: a tile is at least its tensor over the devices, so on any
 * layout over any split into stages the devices together hold at least
 * lasting + activations (a floor the stage DP's search refuses early by). */
ps_status ps_intra_step_bytes(const ps_graph *step, double *lasting, double *activations,
                              ps_error *err);

ps_status ps_intra_solve(const ps_graph *step, const ps_logical_mesh *m,
                         const ps_intra_options *opt, ps_intra_result **out, ps_error *err);
void ps_intra_result_free(ps_intra_result *r);
/* A deep copy of r (the caller frees it). */
ps_status ps_intra_result_copy(const ps_intra_result *r, ps_intra_result **out, ps_error *err);

/* Several solves of one step on one mesh that differ only in their memory
 * budget and ILP options (a stage solved again with less room, its plain
 * twin's tries): the candidates, costs and reductions are made once, and
 * each GLPK relaxation goes on from the last one's basis (planner/
 * intra_ilp.h, sessions). step and m are borrowed and must outlive the
 * session; opt's method, batch forcing, ties and micro-batches hold for it
 * (its memory budget and weight are each solve's). */
typedef struct ps_intra_session ps_intra_session;

ps_status ps_intra_session_create(const ps_graph *step, const ps_logical_mesh *m,
                                  const ps_intra_options *opt, ps_intra_session **out,
                                  ps_error *err);
/* As ps_intra_solve with opt's memory_budget_bytes and ilp; the rest of opt
 * is the session's, and a memory weight is refused (PS_ERR_INVALID: it
 * changes the problem). */
ps_status ps_intra_session_solve(ps_intra_session *s, const ps_intra_options *opt,
                                 ps_intra_result **out, ps_error *err);
void ps_intra_session_free(ps_intra_session *s);

#endif
