/* pipeshard graph: what one training step of a model costs: parameters,
 * FLOPs (with and without remat), memory for weights, optimizer state and the
 * activations one micro-batch keeps for its backward pass. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/model_opts.h"
#include "core/json.h"
#include "planner/models/zoo.h"
#include "planner/train_step.h"

static void help(void)
{
    printf(
        "usage: pipeshard graph (--model M | --graph G.json) [OPTIONS]\n\n"
        "Builds the training step of a model (forward, backward, Adam update) for one\n"
        "micro-batch and reports parameters, FLOPs per step with and without activation\n"
        "recomputation (remat), and memory for weights, optimizer state and activations.\n\n"
        PS_MODEL_OPTIONS_HELP
        "  --batch B            samples per micro-batch (default: the model's global batch)\n"
        "  --remat-layers LIST  detail the step with only these layer tags recomputed,\n"
        "                       e.g. 1-16,20 (see --per-layer for the tags)\n"
        "  --per-layer          add a table per layer tag\n"
        "  --json               machine-readable output\n"
        "  --export G.json      write the forward graph (use '-' for stdout)\n"
        "  -h, --help           this help\n");
}

enum { OPT_BATCH = 256, OPT_REMAT_LAYERS, OPT_PER_LAYER, OPT_JSON, OPT_EXPORT };

static const struct option own_options[] = {
    {"batch", required_argument, NULL, OPT_BATCH},
    {"remat-layers", required_argument, NULL, OPT_REMAT_LAYERS},
    {"per-layer", no_argument, NULL, OPT_PER_LAYER},
    {"json", no_argument, NULL, OPT_JSON},
    {"export", required_argument, NULL, OPT_EXPORT},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

typedef struct layer_row {
    int forward_ops;
    int64_t params;
    double forward_flops;
    double boundary_bytes; /* activations crossing from this layer to later ones */
} layer_row;

static layer_row *layer_table(const ps_graph *g)
{
    layer_row *rows = calloc((size_t)g->n_layers + 1, sizeof *rows);
    int *last_use = malloc(((size_t)g->n_tensors + 1) * sizeof *last_use);
    if (rows == NULL || last_use == NULL) {
        free(rows);
        free(last_use);
        return NULL;
    }
    for (int t = 0; t < g->n_tensors; t++)
        last_use[t] = -1;
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        if (op->pass != PS_PASS_FORWARD)
            continue;
        rows[op->layer].forward_ops++;
        rows[op->layer].forward_flops += op->cost.flops;
        for (int k = 0; k < op->n_in; k++)
            if (op->layer > last_use[op->in[k]])
                last_use[op->in[k]] = op->layer;
    }
    for (int t = 0; t < g->n_tensors; t++) {
        const ps_tensor *x = &g->tensors[t];
        if (x->kind == PS_TENSOR_PARAM)
            rows[x->layer].params += ps_tensor_numel(x);
        if (x->kind != PS_TENSOR_ACTIVATION || g->ops[x->producer].pass != PS_PASS_FORWARD)
            continue;
        for (int l = x->layer; l < last_use[t]; l++)
            rows[l].boundary_bytes += ps_tensor_bytes(x);
    }
    free(last_use);
    return rows;
}

typedef struct report {
    ps_graph_stats plain, remat, shown;
    const ps_graph *step;     /* the step shown in detail */
    const char *remat_layers; /* the user's list, or NULL */
} report;

/* Parses "1-16,20" into flags over n layer tags. */
static ps_status parse_layer_list(const char *text, int n, bool *flags, ps_error *err)
{
    const char *p = text;
    if (*p == '\0')
        return ps_error_set(err, PS_ERR_INVALID,
                            "--remat-layers: expected a list like 1-16,20, not an empty one");
    while (*p != '\0') {
        char *end;
        long lo = strtol(p, &end, 10), hi;
        if (end == p || lo < 0)
            return ps_error_set(err, PS_ERR_INVALID,
                                "--remat-layers: expected a list like 1-16,20, not \"%s\"", text);
        hi = lo;
        p = end;
        if (*p == '-') {
            hi = strtol(p + 1, &end, 10);
            if (end == p + 1 || hi < lo)
                return ps_error_set(err, PS_ERR_INVALID,
                                    "--remat-layers: bad range in \"%s\"", text);
            p = end;
        }
        if (hi >= n)
            return ps_error_set(err, PS_ERR_INVALID,
                                "--remat-layers: layer %ld does not exist (layer tags are 0 to %d)",
                                hi, n - 1);
        for (long l = lo; l <= hi; l++)
            flags[l] = true;
        if (*p == ',' && p[1] != '\0')
            p++;
        else if (*p != '\0')
            return ps_error_set(err, PS_ERR_INVALID,
                                "--remat-layers: expected a list like 1-16,20, not \"%s\"", text);
    }
    return PS_OK;
}

static const char *family_line(const ps_model_config *c, char *buf, int cap)
{
    switch (c->family) {
    case PS_MODEL_MLP:
        snprintf(buf, (size_t)cap, "mlp: hidden %lld, layers %lld", (long long)c->hidden,
                 (long long)c->layers);
        break;
    case PS_MODEL_GPT:
        snprintf(buf, (size_t)cap, "gpt: hidden %lld, layers %lld, heads %lld, seq %lld, vocab %lld",
                 (long long)c->hidden, (long long)c->layers, (long long)c->heads,
                 (long long)c->seq, (long long)c->vocab);
        break;
    case PS_MODEL_MOE:
        snprintf(buf, (size_t)cap,
                 "moe: hidden %lld, layers %lld, heads %lld, seq %lld, vocab %lld, experts %lld, "
                 "top-%lld",
                 (long long)c->hidden, (long long)c->layers, (long long)c->heads,
                 (long long)c->seq, (long long)c->vocab, (long long)c->experts,
                 (long long)c->top_k);
        break;
    case PS_MODEL_WRESNET:
        snprintf(buf, (size_t)cap, "wresnet: depth %lld, channels %lld, width x%lld, %lld px",
                 (long long)c->layers, (long long)c->channels, (long long)c->width_factor,
                 (long long)c->image_size);
        break;
    default: snprintf(buf, (size_t)cap, "?"); break;
    }
    return buf;
}

static void print_text(const ps_graph *fwd, const ps_model_config *cfg, int64_t batch,
                       const ps_train_options *opt, const report *r, const layer_row *rows)
{
    char a[64], b[64], c[64], line[400];
    const ps_graph_stats *p = &r->plain, *m = &r->remat;
    printf("model         %s", fwd->name);
    if (cfg != NULL)
        printf(" (%s)", family_line(cfg, line, sizeof line));
    printf("\n");
    printf("micro-batch   %lld samples; Adam state %s\n", (long long)batch,
           ps_dtype_name(opt->optimizer_dtype));
    printf("parameters    %s (%lld)\n", ps_cli_count((double)p->params, a, sizeof a),
           (long long)p->params);
    printf("weights       %s   gradients %s   optimizer state %s\n",
           ps_cli_bytes(p->weight_bytes, a, sizeof a), ps_cli_bytes(p->gradient_bytes, b, sizeof b),
           ps_cli_bytes(p->optimizer_bytes, c, sizeof c));
    printf("activations   %s per micro-batch kept for backward (with remat: %s)\n",
           ps_cli_bytes(p->activation_bytes, a, sizeof a),
           ps_cli_bytes(m->activation_bytes, b, sizeof b));
    printf("FLOPs/step    %s (with remat: %s)\n", ps_cli_si(p->flops_total, "FLOP", a, sizeof a),
           ps_cli_si(m->flops_total, "FLOP", b, sizeof b));
    if (r->remat_layers != NULL)
        printf("remat layers  %s: %s, activations %s\n", r->remat_layers,
               ps_cli_si(r->shown.flops_total, "FLOP", a, sizeof a),
               ps_cli_bytes(r->shown.activation_bytes, b, sizeof b));
    const ps_graph_stats *s = &r->shown;
    printf("  by pass     forward %s, recompute %s, backward %s, update %s\n",
           ps_cli_si(s->flops[PS_PASS_FORWARD], "FLOP", a, sizeof a),
           ps_cli_si(s->flops[PS_PASS_RECOMPUTE], "FLOP", b, sizeof b),
           ps_cli_si(s->flops[PS_PASS_BACKWARD], "FLOP", c, sizeof c),
           ps_cli_si(s->flops[PS_PASS_UPDATE], "FLOP", line, sizeof line));
    printf("graph         %d ops (%d forward, %d recompute, %d backward, %d update), %d tensors\n",
           r->step->n_ops, s->ops[PS_PASS_FORWARD], s->ops[PS_PASS_RECOMPUTE],
           s->ops[PS_PASS_BACKWARD], s->ops[PS_PASS_UPDATE], r->step->n_tensors);
    printf("layers        %d layer tags; manual pipeline boundaries:", fwd->n_layers);
    if (fwd->n_boundaries == 0)
        printf(" none");
    for (int i = 0; i < fwd->n_boundaries; i++)
        printf("%s after %d", i ? "," : "", fwd->boundaries[i]);
    printf("\n");
    if (rows != NULL) {
        printf("\n%6s %8s %14s %14s %14s\n", "layer", "fwd ops", "params", "fwd FLOPs",
               "boundary out");
        for (int l = 0; l < fwd->n_layers; l++)
            printf("%6d %8d %14lld %14s %14s\n", l, rows[l].forward_ops,
                   (long long)rows[l].params, ps_cli_si(rows[l].forward_flops, "FLOP", a, sizeof a),
                   ps_cli_bytes(rows[l].boundary_bytes, b, sizeof b));
    }
}

static ps_status to_json(const ps_graph *fwd, const ps_model_config *cfg, int64_t batch,
                         const ps_train_options *opt, const report *r, const layer_row *rows,
                         json_t **out)
{
    ps_status st = PS_OK;
    const ps_graph_stats *p = &r->plain, *m = &r->remat;
    json_t *o = json_object(), *flops = NULL, *layers = NULL;
    *out = NULL;
    if (o == NULL)
        return PS_ERR_NOMEM;
    PS_TRY(ps_json_set(o, "model", json_string(fwd->name)));
    if (cfg != NULL)
        PS_TRY(ps_json_set(o, "family", json_string(ps_model_family_names[cfg->family])));
    PS_TRY(ps_json_set(o, "batch", json_integer(batch)));
    PS_TRY(ps_json_set(o, "params", json_integer(p->params)));
    PS_TRY(ps_json_set(o, "flops_per_step", json_real(p->flops_total)));
    PS_TRY(ps_json_set(o, "flops_per_step_remat", json_real(m->flops_total)));
    PS_TRY(ps_json_set(o, "weight_bytes", json_real(p->weight_bytes)));
    PS_TRY(ps_json_set(o, "gradient_bytes", json_real(p->gradient_bytes)));
    PS_TRY(ps_json_set(o, "optimizer_bytes", json_real(p->optimizer_bytes)));
    PS_TRY(ps_json_set(o, "optimizer_dtype", json_string(ps_dtype_name(opt->optimizer_dtype))));
    PS_TRY(ps_json_set(o, "activation_bytes_per_microbatch", json_real(p->activation_bytes)));
    PS_TRY(ps_json_set(o, "activation_bytes_per_microbatch_remat",
                       json_real(m->activation_bytes)));
    flops = json_object();
    PS_TRY(ps_json_set(o, "flops_by_pass", flops));
    const ps_graph_stats *s = &r->shown;
    if (r->remat_layers != NULL) {
        PS_TRY(ps_json_set(o, "remat_layers", json_string(r->remat_layers)));
        PS_TRY(ps_json_set(o, "flops_per_step_remat_layers", json_real(s->flops_total)));
        PS_TRY(ps_json_set(o, "activation_bytes_per_microbatch_remat_layers",
                           json_real(s->activation_bytes)));
    }
    for (int i = 0; i < PS_PASS_COUNT; i++)
        PS_TRY(ps_json_set(flops, ps_pass_names[i], json_real(s->flops[i])));
    PS_TRY(ps_json_set(o, "ops", json_integer(r->step->n_ops)));
    PS_TRY(ps_json_set(o, "tensors", json_integer(r->step->n_tensors)));
    PS_TRY(ps_json_set(o, "layers", json_integer(fwd->n_layers)));
    json_t *bounds = json_array();
    PS_TRY(ps_json_set(o, "boundaries", bounds));
    for (int i = 0; i < fwd->n_boundaries; i++)
        PS_TRY(ps_json_append(bounds, json_integer(fwd->boundaries[i])));
    if (rows != NULL) {
        layers = json_array();
        PS_TRY(ps_json_set(o, "per_layer", layers));
        for (int l = 0; l < fwd->n_layers; l++) {
            json_t *row = json_object();
            PS_TRY(ps_json_append(layers, row));
            PS_TRY(ps_json_set(row, "layer", json_integer(l)));
            PS_TRY(ps_json_set(row, "forward_ops", json_integer(rows[l].forward_ops)));
            PS_TRY(ps_json_set(row, "params", json_integer(rows[l].params)));
            PS_TRY(ps_json_set(row, "forward_flops", json_real(rows[l].forward_flops)));
            PS_TRY(ps_json_set(row, "boundary_bytes", json_real(rows[l].boundary_bytes)));
        }
    }
    *out = o;
    o = NULL;
out:
    json_decref(o);
    return st;
}

int ps_cmd_graph(int argc, char **argv)
{
    const char *export_path = NULL, *remat_list = NULL;
    bool json = false, per_layer = false;
    int64_t batch = 0;
    ps_model_opts mo;
    ps_model_opts_init(&mo);
    struct option options[64];
    ps_model_opts_merge(own_options, options, 64);

    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case 'h': help(); return 0;
        case OPT_BATCH:
            if (!ps_cli_parse_int(optarg, 1, INT64_C(1) << 31, &batch))
                return ps_cli_usage_error("graph", "--batch wants a positive integer, not \"%s\"",
                                          optarg);
            break;
        case OPT_REMAT_LAYERS: remat_list = optarg; break;
        case OPT_PER_LAYER: per_layer = true; break;
        case OPT_JSON: json = true; break;
        case OPT_EXPORT: export_path = optarg; break;
        case '?':
            return ps_cli_usage_error("graph", "unknown or incomplete option \"%s\"",
                                      argv[optind - 1]);
        default: {
            int taken = ps_model_opts_take(&mo, c, optarg, "graph");
            if (taken == 2)
                return 2;
            if (taken == 1)
                return ps_cli_usage_error("graph", "unexpected option");
        }
        }
    }
    if (optind < argc)
        return ps_cli_usage_error("graph", "unexpected argument \"%s\"", argv[optind]);
    if (mo.remat_auto)
        return ps_cli_usage_error("graph", "--remat=auto lets 'pipeshard plan' choose the "
                                           "recomputed stages; here give --remat or "
                                           "--remat-layers LIST");
    if (mo.train.remat && remat_list != NULL)
        return ps_cli_usage_error("graph", "--remat recomputes every layer, --remat-layers LIST "
                                           "those listed: give one of them");
    if (json && export_path != NULL && strcmp(export_path, "-") == 0)
        return ps_cli_usage_error("graph", "--json and --export - both want stdout; give "
                                           "--export a file");
    int usage = ps_model_opts_check(&mo, batch > 0, "graph");
    if (usage != 0)
        return usage;
    const char *graph_path = mo.graph_path;
    const ps_cli_path outs[] = {{"--export", export_path}}, ins[] = {{"--graph", graph_path}};
    usage = ps_cli_check_outputs("graph", outs, 1, ins, 1);
    if (usage != 0)
        return usage;
    ps_train_options opt = mo.train;
    ps_model_config cfg;
    bool from_zoo = false;

    ps_error err = {0};
    ps_status st = PS_OK;
    ps_graph *fwd = NULL, *step = NULL, *step_remat = NULL, *step_selected = NULL;
    bool *remat_flags = NULL;
    bool bad_usage = false;
    layer_row *rows = NULL;
    json_t *out_json = NULL;
    const ps_model_config *cfgp = NULL;
    PS_TRY(ps_model_opts_build(&mo, batch, &cfg, &from_zoo, &fwd, &err));
    if (from_zoo)
        cfgp = &cfg;
    if (export_path != NULL)
        PS_TRY(ps_graph_save(fwd, export_path, &err));

    ps_train_options plain = opt, remat = opt;
    plain.remat = false;
    remat.remat = true;
    report r = {.remat_layers = remat_list};
    ps_error step_err = {0};
    if ((st = ps_train_step_build(fwd, &plain, &step, &step_err)) != PS_OK ||
        (st = ps_train_step_build(fwd, &remat, &step_remat, &step_err)) != PS_OK) {
        /* name the file whose graph cannot be trained */
        ps_error_set(&err, st, "%s%s%s", graph_path ? graph_path : "", graph_path ? ": " : "",
                     step_err.msg);
        goto out;
    }
    PS_TRY(ps_graph_stats_compute(step, &r.plain));
    PS_TRY(ps_graph_stats_compute(step_remat, &r.remat));
    r.step = opt.remat ? step_remat : step;
    r.shown = opt.remat ? r.remat : r.plain;
    if (remat_list != NULL) {
        remat_flags = calloc((size_t)fwd->n_layers, sizeof *remat_flags);
        PS_TRY_ALLOC(remat_flags, &err);
        if ((st = parse_layer_list(remat_list, fwd->n_layers, remat_flags, &err)) != PS_OK) {
            bad_usage = true; /* a value typed on the command line */
            goto out;
        }
        ps_train_options selected = opt;
        selected.remat_layers = remat_flags;
        PS_TRY(ps_train_step_build(fwd, &selected, &step_selected, &err));
        PS_TRY(ps_graph_stats_compute(step_selected, &r.shown));
        r.step = step_selected;
    }
    if (per_layer) {
        rows = layer_table(r.step);
        PS_TRY_ALLOC(rows, &err);
    }
    int64_t shown_batch = cfgp ? cfgp->batch : ps_graph_batch(fwd);
    if (export_path != NULL && strcmp(export_path, "-") == 0)
        goto out; /* stdout carries the graph */
    if (json) {
        PS_TRY(to_json(fwd, cfgp, shown_batch, &opt, &r, rows, &out_json));
        PS_TRY(ps_json_save(out_json, "-", &err));
    } else {
        print_text(fwd, cfgp, shown_batch, &opt, &r, rows);
    }
out:
    json_decref(out_json);
    free(rows);
    ps_graph_free(step_selected);
    free(remat_flags);
    ps_graph_free(step_remat);
    ps_graph_free(step);
    ps_graph_free(fwd);
    if (bad_usage)
        return ps_cli_usage_error("graph", "%s", err.msg);
    return st == PS_OK ? 0 : ps_cli_fail(&err, st);
}
