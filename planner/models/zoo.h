/* The built-in model zoo: Alpa's benchmark suite sizes (GPT, GShard MoE,
 * Wide-ResNet), the GPT-3 family, and the MLP of Alpa's pipeshard tutorial.
 * A model is a family plus a config; every config field can be overridden
 * (command-line flags), so any GPT-like model can be described. */
#ifndef PS_PLANNER_MODELS_ZOO_H
#define PS_PLANNER_MODELS_ZOO_H

#include <jansson.h>

#include "core/graph.h"

typedef enum ps_model_family {
    PS_MODEL_MLP = 0,
    PS_MODEL_GPT = 1,
    PS_MODEL_MOE = 2,
    PS_MODEL_WRESNET = 3,
    PS_MODEL_FAMILY_COUNT
} ps_model_family;

extern const char *const ps_model_family_names[PS_MODEL_FAMILY_COUNT];

typedef struct ps_model_config {
    ps_model_family family;
    char name[64];
    int64_t batch;        /* samples per micro-batch the graph is built for */
    int64_t global_batch; /* the benchmark's global batch (a planning default) */
    int64_t hidden;       /* mlp, gpt, moe: model width */
    int64_t layers;       /* gpt, moe: transformer blocks; wresnet: 50 or 101 */
    int64_t heads;        /* gpt, moe */
    int64_t seq;          /* gpt, moe: sequence length */
    int64_t vocab;        /* gpt, moe */
    int64_t ffn;          /* gpt, moe: feed-forward width (4 * hidden) */
    int64_t experts;      /* moe: experts per MoE layer */
    int64_t expert_group; /* moe: tokens per routing group (GShard's S) */
    int64_t top_k;        /* moe: experts per token */
    double capacity_factor; /* moe: expert capacity = factor * top_k * group / experts */
    int64_t image_size;   /* wresnet: input height = width */
    int64_t channels;     /* wresnet: base filters of the first stage */
    int64_t width_factor; /* wresnet: widening of the 3x3 convs */
    int64_t classes;      /* wresnet: output classes */
    ps_dtype dtype;       /* parameters and activations */
} ps_model_config;

typedef struct ps_zoo_entry {
    const char *name;
    const char *description;
    ps_model_config config;
} ps_zoo_entry;

int ps_zoo_count(void);
const ps_zoo_entry *ps_zoo_get(int i);
/* Copies the config of a named model; unknown names list the known ones. */
ps_status ps_zoo_lookup(const char *name, ps_model_config *out, ps_error *err);
/* Checks a (possibly overridden) config: sizes positive, heads divide hidden,
 * groups divide the tokens, and so on. */
ps_status ps_model_config_validate(const ps_model_config *c, ps_error *err);
/* Builds the forward graph of one micro-batch of c->batch samples. */
ps_status ps_model_build(const ps_model_config *c, ps_graph **out, ps_error *err);

/* The config as a JSON object (what plans record to rebuild the model). */
ps_status ps_model_config_to_json(const ps_model_config *c, json_t **out);

/* Reads what ps_model_config_to_json wrote, over the zoo entry zoo_name. */
struct ps_jv;
ps_status ps_model_config_from_json(const struct ps_jv *v, const char *zoo_name,
                                    ps_model_config *out, ps_error *err);

/* Family builders (one file each). */
ps_status ps_model_build_mlp(const ps_model_config *c, ps_graph *g, ps_error *err);
ps_status ps_model_build_transformer(const ps_model_config *c, ps_graph *g, ps_error *err);
ps_status ps_model_build_wresnet(const ps_model_config *c, ps_graph *g, ps_error *err);

#endif
