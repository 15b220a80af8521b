#include "cli/model_opts.h"

#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

enum {
    OPT_MODEL = PS_MODEL_OPT_BASE, OPT_GRAPH, OPT_CAPACITY, OPT_DTYPE, OPT_OPT_DTYPE,
    OPT_NO_MASTER, OPT_REMAT, OPT_LOSS_SCALE, OPT_DYNAMIC_LOSS_SCALE, OPT_LOSS_SCALE_WINDOW,
    OPT_SIZE /* + index into size_names */
};

static const char *const size_names[13] = {
    "hidden", "layers", "heads", "seq", "vocab", "ffn", "experts", "expert-group", "top-k",
    "image-size", "channels", "width-factor", "classes"};

static const struct option model_options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"graph", required_argument, NULL, OPT_GRAPH},
    {"capacity-factor", required_argument, NULL, OPT_CAPACITY},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"optimizer-dtype", required_argument, NULL, OPT_OPT_DTYPE},
    {"no-master-weights", no_argument, NULL, OPT_NO_MASTER},
    {"remat", optional_argument, NULL, OPT_REMAT},
    {"loss-scale", required_argument, NULL, OPT_LOSS_SCALE},
    {"dynamic-loss-scale", no_argument, NULL, OPT_DYNAMIC_LOSS_SCALE},
    {"loss-scale-window", required_argument, NULL, OPT_LOSS_SCALE_WINDOW},
};

void ps_model_opts_init(ps_model_opts *o)
{
    memset(o, 0, sizeof *o);
    o->train = ps_train_options_default();
}

void ps_model_opts_merge(const struct option *own, struct option *out, int cap)
{
    int n = 0;
    for (; own[n].name != NULL && n < cap - 1; n++)
        out[n] = own[n];
    for (size_t i = 0; i < sizeof model_options / sizeof *model_options && n < cap - 1; i++)
        out[n++] = model_options[i];
    for (int i = 0; i < 13 && n < cap - 1; i++)
        out[n++] = (struct option){size_names[i], required_argument, NULL, OPT_SIZE + i};
    out[n] = (struct option){NULL, 0, NULL, 0};
}

int ps_model_opts_take(ps_model_opts *o, int c, const char *arg, const char *command)
{
    double x;
    ps_dtype d;
    switch (c) {
    case OPT_MODEL: o->model = arg; return 0;
    case OPT_GRAPH: o->graph_path = arg; return 0;
    case OPT_CAPACITY:
        if (!ps_cli_parse_double(arg, 1e-6, 64, &x)) {
            ps_cli_usage_error(command, "--capacity-factor wants a number in (0, 64]");
            return 2;
        }
        o->capacity_factor = x;
        o->capacity_set = true;
        return 0;
    case OPT_DTYPE:
    case OPT_OPT_DTYPE:
        if (ps_dtype_parse(arg, &d) != 0 || d == PS_DTYPE_I32) {
            ps_cli_usage_error(command, "unknown dtype \"%s\" (fp32, fp16, bf16)", arg);
            return 2;
        }
        if (c == OPT_DTYPE) {
            o->dtype = d;
            o->dtype_set = true;
        } else {
            o->train.optimizer_dtype = d;
        }
        return 0;
    case OPT_NO_MASTER: o->train.master_weights = false; return 0;
    case OPT_REMAT:
        if (arg == NULL || strcmp(arg, "all") == 0) {
            o->train.remat = true;
        } else if (strcmp(arg, "auto") == 0) {
            o->remat_auto = true;
        } else {
            ps_cli_usage_error(command, "--remat takes =all (the default) or =auto, not \"%s\"",
                               arg);
            return 2;
        }
        return 0;
    case OPT_LOSS_SCALE:
        if (!ps_cli_parse_double(arg, PS_LOSS_SCALE_MIN, PS_LOSS_SCALE_MAX, &x)) {
            ps_cli_usage_error(command, "--loss-scale wants a number in [2^-24, 2^40], not \"%s\"",
                               arg);
            return 2;
        }
        o->train.loss_scale = x;
        o->loss_scale_set = true;
        return 0;
    case OPT_DYNAMIC_LOSS_SCALE: o->train.dynamic_loss_scale = true; return 0;
    case OPT_LOSS_SCALE_WINDOW: {
        int64_t w;
        if (!ps_cli_parse_int(arg, 1, INT32_MAX, &w)) {
            ps_cli_usage_error(command, "--loss-scale-window wants a positive number of steps, "
                                        "not \"%s\"", arg);
            return 2;
        }
        o->train.loss_scale_window = (int)w;
        o->loss_scale_window_set = true;
        return 0;
    }
    default: break;
    }
    if (c >= OPT_SIZE && c < OPT_SIZE + 13) {
        int i = c - OPT_SIZE;
        if (!ps_cli_parse_int(arg, 1, INT64_C(1) << 31, &o->size[i])) {
            ps_cli_usage_error(command, "--%s wants an integer from 1 to 2^31, not \"%s\"",
                               size_names[i], arg);
            return 2;
        }
        o->size_set[i] = true;
        return 0;
    }
    return 1;
}

int ps_model_opts_check(ps_model_opts *o, bool batch_given, const char *command)
{
    if (o->loss_scale_window_set && !o->train.dynamic_loss_scale)
        return ps_cli_usage_error(command, "--loss-scale-window applies to --dynamic-loss-scale "
                                           "only (a static scale never changes)");
    if (o->train.dynamic_loss_scale && !o->loss_scale_set)
        o->train.loss_scale = PS_LOSS_SCALE_DYNAMIC_DEFAULT;
    if (o->remat_auto && o->train.remat)
        return ps_cli_usage_error(command, "--remat (every layer) and --remat=auto (the "
                                           "planner chooses by stage) exclude each other");
    bool overrides = batch_given || o->capacity_set || o->dtype_set;
    for (int i = 0; i < 13; i++)
        overrides = overrides || o->size_set[i];
    if ((o->model == NULL) == (o->graph_path == NULL))
        return ps_cli_usage_error(command, "give exactly one of --model and --graph");
    if (o->graph_path != NULL && overrides)
        return ps_cli_usage_error(command,
                                  "--batch, --dtype and size overrides apply to --model only "
                                  "(a graph file fixes its shapes)");
    /* an unknown name is a usage error; a size the model's family does not
     * have would be ignored: refused */
    ps_model_config cfg;
    ps_error lookup_err = {0};
    if (o->model != NULL && ps_zoo_lookup(o->model, &cfg, &lookup_err) != PS_OK)
        return ps_cli_usage_error(command, "%s", lookup_err.msg);
    if (o->model != NULL) {
        static const unsigned applies[PS_MODEL_FAMILY_COUNT] = {
            [PS_MODEL_MLP] = 0x3,      /* hidden, layers */
            [PS_MODEL_GPT] = 0x3f,     /* hidden .. ffn */
            [PS_MODEL_MOE] = 0x1ff,    /* and experts, expert-group, top-k */
            [PS_MODEL_WRESNET] = 0x1e02, /* layers, image-size .. classes */
        };
        unsigned mask = (unsigned)cfg.family < PS_MODEL_FAMILY_COUNT ? applies[cfg.family] : 0;
        char have[160] = "";
        for (int i = 0, n = 0; i < 13; i++)
            if (mask & (1u << i))
                n += snprintf(have + n, sizeof have - (size_t)n, "%s--%s", n ? ", " : "",
                              size_names[i]);
        for (int i = 0; i < 13; i++)
            if (o->size_set[i] && !(mask & (1u << i)))
                return ps_cli_usage_error(command, "--%s does not apply to %s (family %s: %s)",
                                          size_names[i], o->model,
                                          ps_model_family_names[cfg.family], have);
        if (o->capacity_set && cfg.family != PS_MODEL_MOE)
            return ps_cli_usage_error(command, "--capacity-factor applies to MoE models, not "
                                               "%s (family %s)",
                                      o->model, ps_model_family_names[cfg.family]);
    }
    return 0;
}

ps_status ps_model_opts_build(const ps_model_opts *o, int64_t batch, ps_model_config *cfg,
                              bool *from_zoo, ps_graph **out, ps_error *err)
{
    *out = NULL;
    *from_zoo = o->model != NULL;
    if (o->model == NULL)
        return ps_graph_load(o->graph_path, out, err);
    ps_status st = ps_zoo_lookup(o->model, cfg, err);
    if (st != PS_OK)
        return st;
    int64_t *fields[13] = {&cfg->hidden,  &cfg->layers,       &cfg->heads,   &cfg->seq,
                           &cfg->vocab,   &cfg->ffn,          &cfg->experts, &cfg->expert_group,
                           &cfg->top_k,   &cfg->image_size,   &cfg->channels,
                           &cfg->width_factor, &cfg->classes};
    for (int i = 0; i < 13; i++)
        if (o->size_set[i])
            *fields[i] = o->size[i];
    if (o->size_set[0] && !o->size_set[5])
        cfg->ffn = 4 * cfg->hidden; /* a new width implies the usual 4h FFN */
    if (o->capacity_set)
        cfg->capacity_factor = o->capacity_factor;
    if (o->dtype_set)
        cfg->dtype = o->dtype;
    if (batch > 0)
        cfg->batch = batch;
    return ps_model_build(cfg, out, err);
}
