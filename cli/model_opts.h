/* Command-line options that choose a model and its training step, shared by
 * the commands that take --model or --graph (graph, plan). */
#ifndef PS_CLI_MODEL_OPTS_H
#define PS_CLI_MODEL_OPTS_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

#include "planner/models/zoo.h"
#include "planner/train_step.h"

/* getopt_long values of the model options start here */
#define PS_MODEL_OPT_BASE 1000

#define PS_MODEL_OPTIONS_HELP                                                                  \
    "  --model M            a built-in model (see 'pipeshard models')\n"                         \
    "  --graph G.json       a forward graph file (docs/graph-format.md)\n"                       \
    "  --hidden H --layers L --heads A --seq S --vocab V --ffn F\n"                              \
    "  --experts E --expert-group S --top-k K --capacity-factor X\n"                             \
    "  --image-size P --channels C --width-factor W --classes N\n"                               \
    "                       override the model's configuration (with --model only)\n"            \
    "  --dtype T            parameters and activations: fp32, fp16 or bf16\n"                    \
    "  --optimizer-dtype T  Adam state (default fp32)\n"                                         \
    "  --no-master-weights  no fp32 master copy for fp16/bf16 parameters\n"                      \
    "  --remat[=all]        recompute every layer's forward (but the loss layer's)\n"          \
    "  --remat=auto         (pipeshard plans) recompute the layers of the stages the stage\n"   \
    "                       DP finds faster that way within the memory, no others\n"          \
    "  --loss-scale S       static loss scaling for fp16: the backward pass starts from S,\n"  \
    "                       Adam divides by it (default 1; a power of two is exact)\n"     \
    "  --dynamic-loss-scale a step whose gradients overflow is skipped and halves the\n"     \
    "                       scale; it starts at --loss-scale (default 65536 here)\n"          \
    "  --loss-scale-window N  doubles the dynamic scale after N steps without an\n"        \
    "                       overflow (default 2000)\n"

typedef struct ps_model_opts {
    const char *model, *graph_path;
    int64_t size[13];
    bool size_set[13];
    double capacity_factor;
    bool capacity_set;
    ps_dtype dtype;
    bool dtype_set;
    ps_train_options train;
    bool loss_scale_set, loss_scale_window_set;
    bool remat_auto; /* --remat=auto: the planner chooses by stage (train.remat stays false) */
} ps_model_opts;

void ps_model_opts_init(ps_model_opts *o);
/* Appends the model options to `own` (NULL-terminated) into out[cap]. */
void ps_model_opts_merge(const struct option *own, struct option *out, int cap);
/* Handles one getopt_long result. Returns 1 when c is not a model option, 0
 * when it was taken, or 2 after printing a usage error. */
int ps_model_opts_take(ps_model_opts *o, int c, const char *arg, const char *command);
/* Usage error (2) unless exactly one of --model/--graph is given,
 * overrides go with --model and a loss-scale window goes with a dynamic
 * scale; 0 otherwise. `batch_given` counts as an override. Sets the default
 * initial dynamic scale. */
int ps_model_opts_check(ps_model_opts *o, bool batch_given, const char *command);
/* The forward graph for micro-batches of `batch` samples (0: the model's
 * default), and the config it came from (zoo models only: *from_zoo). */
ps_status ps_model_opts_build(const ps_model_opts *o, int64_t batch, ps_model_config *cfg,
                              bool *from_zoo, ps_graph **out, ps_error *err);

#endif
