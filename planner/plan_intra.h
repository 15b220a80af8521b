/* One-stage plans: the whole model on the whole cluster as one logical mesh,
 * sharded by the intra-op pass (Alpa's data, zero2, zero3 and shard
 * methods), written as a plan that backends can consume. */
#ifndef PS_PLANNER_PLAN_INTRA_H
#define PS_PLANNER_PLAN_INTRA_H

#include "core/plan.h"
#include "planner/intra_pass.h"
#include "planner/models/zoo.h"
#include "planner/train_step.h"

typedef struct ps_plan_request {
    const ps_graph *forward;       /* built for micro-batches of global_batch / micro_batches */
    const ps_model_config *config; /* the zoo config it came from, or NULL (graph file) */
    ps_train_options train;
    const ps_cluster *cluster;
    ps_intra_method method;
    int mesh[2];                   /* logical mesh; {0, 0}: (n, 1) for data/zero, else nodes x devices */
    long long global_batch;
    int micro_batches;
    bool force_batch_axis0;
    ps_ilp_options ilp;
} ps_plan_request;

/* Plans req. *intra_out and *step_out (either may be NULL) receive the
 * intra-op result and the training step it was solved on, for --explain. */
ps_status ps_plan_one_stage(const ps_plan_request *req, ps_plan **out,
                            ps_intra_result **intra_out, ps_graph **step_out, ps_error *err);

/* The unsharded single-device plan of a plan's model with the same global
 * batch, micro-batches and training options (no remat): the reference that
 * executors check sharded runs against. m: ps_plan_model_build(p). */
struct ps_plan_model;
ps_status ps_plan_reference(const ps_plan *p, const struct ps_plan_model *m, ps_plan **out,
                            ps_error *err);

/* Records in a new plan what req planned: model (zoo config or embedded
 * graph), training options, cluster, global batch and micro-batches. */
ps_status ps_plan_record_request(ps_plan *plan, const ps_plan_request *req, ps_error *err);

/* Model FLOP utilization: TFLOP/s per device over the slowest device's peak
 * for the model's dtype. */
double ps_plan_mfu(double tflops_per_device, const ps_graph *step, const ps_cluster *c);

/* The FLOPs of a step of `micro_batches` micro-batches: forward, backward
 * and recomputation per micro-batch, the update once. */
ps_status ps_plan_step_flops(const ps_graph *step, int micro_batches, double *out);

/* Writes a solved stage into s: ops, tensors, predictions. */
ps_status ps_plan_fill_stage(ps_plan_stage *s, const ps_graph *step, const ps_logical_mesh *m,
                             const ps_intra_result *r, ps_error *err);

#endif
