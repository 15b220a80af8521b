/* The model behind a plan: rebuilt from the plan's own record (zoo config or
 * embedded graph, training options, how its layers were built), so that
 * backends run exactly the step the planner planned, and the check that a
 * plan's stages still match it. */
#ifndef PS_PLANNER_PLAN_MODEL_H
#define PS_PLANNER_PLAN_MODEL_H

#include "core/plan.h"
#include "planner/layer_cluster.h"
#include "planner/models/zoo.h"
#include "planner/train_step.h"

typedef struct ps_plan_model {
    ps_graph *forward; /* as built or loaded */
    ps_graph *layered; /* with the plan's layers (a copy of forward for one-stage plans) */
    ps_graph *step;    /* the training step of layered */
    bool from_zoo;
    ps_model_config config;
    ps_train_options train;
    bool *remat_layers;
    int *layer_stage; /* [layered->n_layers]: the plan's stage of each layer (several stages) */
} ps_plan_model;

ps_status ps_plan_model_build(const ps_plan *p, ps_plan_model **out, ps_error *err);
void ps_plan_model_free(ps_plan_model *m);

/* Each stage's ops and tensors are those of the step's layers it covers, in
 * order, with specs of the right ranks: a plan edited by hand, or written
 * for another model, is refused with the first difference. */
ps_status ps_plan_check(const ps_plan *p, const ps_plan_model *m, ps_error *err);

#endif
