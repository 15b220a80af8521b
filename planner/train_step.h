/* Training-step builder: from a forward graph, the backward pass (one
 * reverse-mode gradient rule per op kind), optional activation recomputation
 * (remat) and the Adam update with its state tensors.
 *
 * The result holds, in this order: the forward ops (copied), then per layer
 * from last to first its recompute ops (when remat is on for that layer)
 * followed by its backward ops, then one ADAM op per parameter. It is built
 * for one micro-batch: gradient accumulation across micro-batches and the
 * gradient all-reduce belong to the plan and its lowering. */
#ifndef PS_PLANNER_TRAIN_STEP_H
#define PS_PLANNER_TRAIN_STEP_H

#include <jansson.h>
#include <stdbool.h>

#include "core/graph.h"

typedef struct ps_train_options {
    /* Recompute the forward ops of every layer except the one holding the
     * loss (whose backward follows its forward at once), keeping only the
     * tensors that cross layer boundaries: Megatron's full recomputation. */
    bool remat;
    /* Per layer override (n_layers entries), or NULL to follow `remat`. */
    const bool *remat_layers;
    /* Pipeline stages by layer (n_layers entries), or NULL. A parameter
     * used in layers of different stages (a tied embedding) sums its
     * gradient contributions in the update pass, once per step: each stage
     * accumulates its own contribution over the micro-batches and sends it
     * once, instead of once per micro-batch (the sum of sums is the same). */
    const int *layer_stage;
    ps_dtype optimizer_dtype; /* Adam m and v (fp32 by default) */
    /* When parameters are narrower than optimizer_dtype (fp16/bf16 training
     * with fp32 Adam state), keep an optimizer_dtype master copy too (mixed
     * precision). Default true. */
    bool master_weights;
    ps_op_attrs adam; /* lr, beta1, beta2, adam_eps, weight_decay */
    /* Static loss scaling (1 = none): the loss gradient ops seed the backward
     * pass with S and the ADAM ops divide by it (their attrs.scale). For fp16,
     * whose gradients under 2^-14 lose bits; see PS_LOSS_SCALE_MIN/MAX. */
    double loss_scale;
    /* Dynamic loss scaling: loss_scale is where it starts; a step whose
     * gradients hold inf or NaN anywhere is skipped and halves the scale, and
     * loss_scale_window steps in a row without one double it (the executors'
     * runtime keeps the scale; the lowering adds the step-wide vote). */
    bool dynamic_loss_scale;
    int loss_scale_window; /* steps; PS_LOSS_SCALE_WINDOW_DEFAULT */
} ps_train_options;

#define PS_LOSS_SCALE_WINDOW_DEFAULT 2000
#define PS_LOSS_SCALE_DYNAMIC_DEFAULT 65536.0 /* 2^16: the initial dynamic scale */

ps_train_options ps_train_options_default(void);

/* The options as a JSON object (what plans record). */
ps_status ps_train_options_to_json(const ps_train_options *o, int n_layers, json_t **out);

/* Reads what ps_train_options_to_json wrote; a remat layer list is
 * allocated into *remat_layers (caller frees) for a graph of n_layers. */
struct ps_jv;
ps_status ps_train_options_from_json(const struct ps_jv *v, ps_train_options *out,
                                     bool **remat_layers, int n_layers, ps_error *err);

ps_status ps_train_step_build(const ps_graph *forward, const ps_train_options *opt,
                              ps_graph **out, ps_error *err);

#endif
