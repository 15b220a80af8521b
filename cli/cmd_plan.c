/* pipeshard plan: a parallelization plan for a model on a cluster. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/model_opts.h"
#include "core/json.h"
#include "core/log.h"
#include "core/profile_db.h"
#include "planner/inter_pass.h"
#include "planner/plan_fit.h"
#include "planner/stage_file.h"

static void help(void)
{
    printf(
        "usage: pipeshard plan (--model M | --graph G.json) (--cluster C | --cluster-file F)\n"
        "                      [--method pipeshard|shard|data|zero2|zero3] [OPTIONS] -o PLAN.json\n\n"
        "Plans the training step of a model on a cluster and writes the plan (docs/plan-\n"
        "format.md).\n"
        "  pipeshard  (or auto, the default) Alpa's plan: layers are clustered, the stage\n"
        "         DP cuts them into pipeline stages on slices of the cluster, and each\n"
        "         stage is sharded by the intra-op ILP\n"
        "The other methods run the whole model as one stage on all devices, viewed as one\n"
        "logical mesh, and choose every op's sharding with the intra-op ILP:\n"
        "  data   batch split across devices, gradients all-reduced\n"
        "  zero2  data + optimizer state and update sharded (gradients reduce-scattered)\n"
        "  zero3  zero2 + parameters sharded and gathered where used\n"
        "  shard  any sharding of any op (the free ILP)\n\n"
        "  --cluster C          a preset, NAME or NAME:NODES (see 'pipeshard clusters')\n"
        "  --cluster-file F     a cluster file (docs/cluster-format.md)\n"
        "  --method M           pipeshard (default; also 'auto'), shard, data, zero2, zero3\n"
        "  --layer-num N|manual layers for the stage DP (default: the model's pipeline\n"
        "                       boundaries if it has any, else up to 16 clustered layers)\n"
        "  --submesh-choices C  power_of_two (default), small_power_of_two, all, or a\n"
        "                       list of HOSTSxDEVICES such as 1x2,1x4,2x8 (Alpa's manual\n"
        "                       submeshes: each within a node or of whole nodes)\n"
        "  --schedule S         1f1b (default) or gpipe\n"
        "  --rows               print the stage cost table (one row per layer range,\n"
        "                       submesh and logical mesh)\n"
        "  --no-transfer-costs  the stage DP's costs leave out what a stage receives from\n"
        "                       its neighbours per micro-batch (Alpa's stage costs)\n"
        "  --no-memory-check    write the plan without checking its lowered programs'\n"
        "                       exact peak memory against the devices' (by default a\n"
        "                       plan whose programs would not fit is planned again with\n"
        "                       less memory per device, up to 4 times)\n"
        "  --exact-ranges       solve every range of layers for the stage cost table\n"
        "                       (default: single layers, longer ranges composed from them)\n"
        "  --stage-imbalance-tolerance T\n"
        "                       candidate stages only where the submesh's share of the\n"
        "                       devices is within a factor 1+T of the layers' share of\n"
        "                       the FLOPs (default: no limit; Alpa's benchmarks use 1)\n"
        "  --stage-candidates N pipelines solved and timed per stage DP: its best, then\n"
        "                       the best of each other stage count within 10%% of it\n"
        "                       by the DP's objective; the fastest schedule is kept\n"
        "                       (default 2; 1: Alpa's DP answer alone; at most 16)\n"
        "  --show-candidates    print every candidate pipeline solved and timed: its\n"
        "                       stages, predicted iteration, the DP's objective, and\n"
        "                       the one kept (each planning its own: every count of\n"
        "                       --micro-batches auto, every retry of the memory check;\n"
        "                       with --json, as the JSON's \"candidates\")\n"
        "  --stages auto|uniform|FILE\n"
        "                       auto: the stage DP (default); uniform: Alpa's uniform\n"
        "                       plan (as --method uniform, with --dp --op --pp); FILE:\n"
        "                       the stages of a stage file (Alpa's manual stage option;\n"
        "                       docs/plan-format.md)\n"
        "  --method uniform --dp D --op O --pp P\n"
        "                       Alpa's uniform 3-D plan: P stages of equal FLOPs, each on a\n"
        "                       D x O mesh with the batch on D\n"
        "  --mesh D0xD1         the logical mesh of the one-stage methods (default:\n"
        "                       devices x 1 for data/zero, nodes x devices-per-node for\n"
        "                       shard)\n"
        "  --global-batch B     samples per step (default: the model's benchmark batch)\n"
        "  --micro-batches N    gradient accumulation steps (default 1); 'auto' (pipeshard\n"
        "                       with --model) chooses among the divisors of the global\n"
        "                       batch up to 128: those nearest each power of two, then\n"
        "                       every divisor around the best; keeps the fastest\n"
        "  --force-batch-axis0  keep the batch dimension on mesh axis 0 (Alpa's 2-D default)\n"
        "  --time-limit S       ILP time limit per solve in seconds (default 60; the\n"
        "                       stage cost table's solves at most 20)\n"
        "  --iteration-limit N  ILP limit per solve in GLPK simplex iterations (default\n"
        "                       none): unlike time, it stops a solve at the same point on\n"
        "                       any machine at any load, so the plan is reproducible\n"
        "  --profile-db DB.json measured GEMM and communication times (pipeshard profile,\n"
        "                       docs/profile-db.md) instead of the analytic cost model\n"
        "  --explain            print every op's strategy and its communication\n"
        "  --json               print the predictions as JSON\n"
        "  --dump-programs DIR  lower the plan to per-device programs, write them readably\n"
        "                       to DIR (kernels.txt, device-N.txt, ...) and check them\n"
        "                       (the files stay when the check fails, to read why)\n"
        "  -o, --output P.json  where to write the plan (required)\n"
        PS_MODEL_OPTIONS_HELP
        "  -h, --help           this help\n");
}

enum {
    OPT_CLUSTER = 256, OPT_CLUSTER_FILE, OPT_METHOD, OPT_MESH, OPT_GLOBAL_BATCH,
    OPT_MICRO_BATCHES, OPT_FORCE, OPT_TIME_LIMIT, OPT_ITERATION_LIMIT, OPT_EXPLAIN, OPT_JSON,
    OPT_LAYER_NUM, OPT_SUBMESH, OPT_SCHEDULE, OPT_ROWS, OPT_STAGES, OPT_DP, OPT_OP, OPT_PP, OPT_DUMP,
    OPT_PROFILE_DB, OPT_NO_TRANSFER_COSTS, OPT_IMBALANCE, OPT_EXACT_RANGES, OPT_CANDIDATES,
    OPT_NO_MEMORY_CHECK, OPT_SHOW_CANDIDATES
};

static const struct option own_options[] = {
    {"cluster", required_argument, NULL, OPT_CLUSTER},
    {"cluster-file", required_argument, NULL, OPT_CLUSTER_FILE},
    {"method", required_argument, NULL, OPT_METHOD},
    {"mesh", required_argument, NULL, OPT_MESH},
    {"global-batch", required_argument, NULL, OPT_GLOBAL_BATCH},
    {"micro-batches", required_argument, NULL, OPT_MICRO_BATCHES},
    {"force-batch-axis0", no_argument, NULL, OPT_FORCE},
    {"time-limit", required_argument, NULL, OPT_TIME_LIMIT},
    {"iteration-limit", required_argument, NULL, OPT_ITERATION_LIMIT},
    {"explain", no_argument, NULL, OPT_EXPLAIN},
    {"layer-num", required_argument, NULL, OPT_LAYER_NUM},
    {"submesh-choices", required_argument, NULL, OPT_SUBMESH},
    {"schedule", required_argument, NULL, OPT_SCHEDULE},
    {"rows", no_argument, NULL, OPT_ROWS},
    {"no-transfer-costs", no_argument, NULL, OPT_NO_TRANSFER_COSTS},
    {"no-memory-check", no_argument, NULL, OPT_NO_MEMORY_CHECK},
    {"stage-imbalance-tolerance", required_argument, NULL, OPT_IMBALANCE},
    {"stage-candidates", required_argument, NULL, OPT_CANDIDATES},
    {"show-candidates", no_argument, NULL, OPT_SHOW_CANDIDATES},
    {"exact-ranges", no_argument, NULL, OPT_EXACT_RANGES},
    {"stages", required_argument, NULL, OPT_STAGES},
    {"dp", required_argument, NULL, OPT_DP},
    {"op", required_argument, NULL, OPT_OP},
    {"pp", required_argument, NULL, OPT_PP},
    {"json", no_argument, NULL, OPT_JSON},
    {"dump-programs", required_argument, NULL, OPT_DUMP},
    {"profile-db", required_argument, NULL, OPT_PROFILE_DB},
    {"output", required_argument, NULL, 'o'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static void explain(const ps_graph *step, const ps_intra_result *r)
{
    printf("\n%-40s %-9s %-14s %-26s %s\n", "op", "pass", "strategy", "inputs -> outputs",
           "communication");
    for (int i = 0; i < step->n_ops; i++) {
        const ps_op *op = &step->ops[i];
        const ps_strategy *s = &r->op_strategy[i];
        char specs[160] = "", buf[PS_SPEC_STR_MAX];
        int used = 0;
        for (int k = 0; k < op->n_in; k++)
            used += snprintf(specs + used, sizeof specs - (size_t)used, "%s%s", k ? " " : "",
                             ps_spec_format(&s->in[k], buf, sizeof buf));
        used += snprintf(specs + used, sizeof specs - (size_t)used, " ->");
        for (int k = 0; k < op->n_out; k++)
            used += snprintf(specs + used, sizeof specs - (size_t)used, " %s",
                             ps_spec_format(&s->out[k], buf, sizeof buf));
        printf("%-40s %-9s %-14s %-26s", op->name, ps_pass_names[op->pass], s->name, specs);
        if (s->comm_s > 0)
            printf(" %s over axes %s %.3g MB: %.3g us", ps_collective_names[s->comm_kind],
                   s->comm_axes == 3 ? "0,1" : s->comm_axes == 1 ? "0" : "1",
                   s->comm_bytes / 1e6, s->comm_s * 1e6);
        if (r->reshard_in_s[i] > 0)
            printf("%s resharding inputs: %.3g us", s->comm_s > 0 ? ";" : "",
                   r->reshard_in_s[i] * 1e6);
        printf("\n");
    }
}

/* The stages in the words of Alpa's pipeshard output: layer ids per stage,
 * physical and logical mesh shapes, autosharding options. */
static void alpa_lines(const ps_plan *p)
{
    printf("forward_stage_layer_ids  [");
    for (int i = 0; i < p->n_stages; i++) {
        printf("%s[", i > 0 ? ", " : "");
        for (int l = p->stages[i].first_layer; l <= p->stages[i].last_layer; l++)
            printf("%s%d", l > p->stages[i].first_layer ? ", " : "", l);
        printf("]");
    }
    printf("]\nsubmesh_shapes           [");
    for (int i = 0; i < p->n_stages; i++)
        printf("%s(%d, %d)", i > 0 ? ", " : "", p->stages[i].submesh[0], p->stages[i].submesh[1]);
    printf("]\nlogical_mesh_shapes      [");
    for (int i = 0; i < p->n_stages; i++)
        printf("%s(%d, %d)", i > 0 ? ", " : "", p->stages[i].logical_mesh[0],
               p->stages[i].logical_mesh[1]);
    printf("]\nautosharding_options     [");
    for (int i = 0; i < p->n_stages; i++)
        printf("%s%s", i > 0 ? ", " : "",
               p->stages[i].force_batch_axis0 ? "{force_batch_dim_to_mesh_dim: 0}" : "{}");
    printf("]\n");
}

/* A stage's layout gap is printed above this: the stage DP's solves stop
 * within 1% (planner/inter_pass.c), so less is the gap asked for. */
#define LAYOUT_GAP_SHOWN 0.0101

/* The recomputed layers of a plan's training options, as "0-5, 7"; false
 * when it names none. */
static bool remat_layer_ranges(const json_t *training, char *out, size_t cap)
{
    const json_t *layers = json_object_get(training, "remat_layers");
    size_t n = json_array_size(layers), used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && used < cap; i++) {
        json_int_t first = json_integer_value(json_array_get(layers, i)), last = first;
        while (i + 1 < n && json_integer_value(json_array_get(layers, i + 1)) == last + 1)
            last = json_integer_value(json_array_get(layers, ++i));
        int w = last > first ? snprintf(out + used, cap - used, "%s%lld-%lld", used ? ", " : "",
                                        (long long)first, (long long)last)
                             : snprintf(out + used, cap - used, "%s%lld", used ? ", " : "",
                                        (long long)first);
        used += w > 0 ? (size_t)w : 0;
    }
    return n > 0;
}

/* --show-candidates: the candidate pipelines the planner solved and timed,
 * printed as they come, or (with --json) gathered into `list`. */
typedef struct candidates_out {
    json_t *list; /* NULL: print each line */
} candidates_out;

static void print_candidate(void *ctx, const ps_plan *p, double dp_iteration_s, bool kept)
{
    candidates_out *co = ctx;
    char layers[256];
    if (co->list != NULL) {
        json_t *stages = json_array();
        for (int k = 0; k < p->n_stages; k++) {
            const ps_plan_stage *s = &p->stages[k];
            json_array_append_new(
                stages, json_pack("{s:i, s:i, s:[i, i], s:[i, i]}", "first_layer",
                                  s->first_layer, "last_layer", s->last_layer, "submesh",
                                  s->submesh[0], s->submesh[1], "logical_mesh",
                                  s->logical_mesh[0], s->logical_mesh[1]));
        }
        json_t *c = json_pack("{s:i, s:o, s:f, s:f, s:b}", "micro_batches", p->micro_batches,
                              "stages", stages, "iteration_s", p->iteration_s, "dp_iteration_s",
                              dp_iteration_s, "kept", kept);
        const json_t *remat = json_object_get(p->training, "remat_layers");
        if (c != NULL && remat != NULL)
            json_object_set(c, "remat_layers", (json_t *)remat);
        json_array_append_new(co->list, c);
        return;
    }
    printf("candidate     %d micro-batch(es), %d stage(s):", p->micro_batches, p->n_stages);
    for (int k = 0; k < p->n_stages; k++) {
        const ps_plan_stage *s = &p->stages[k];
        printf("%s layers %d-%d on %dx%d as %dx%d", k > 0 ? ";" : "", s->first_layer,
               s->last_layer, s->submesh[0], s->submesh[1], s->logical_mesh[0],
               s->logical_mesh[1]);
    }
    if (remat_layer_ranges(p->training, layers, sizeof layers))
        printf("; recomputes layers %s", layers);
    printf("; iteration %.4g s (stage DP %.4g s)%s\n", p->iteration_s, dp_iteration_s,
           kept ? ", kept" : "");
}

static void summary(const ps_plan *p, const ps_intra_result *r)
{
    char a[64], b[64], c[64], d[64], e[64], layers[256];
    printf("plan          %s on %s (%d devices), method %s, schedule %s\n", p->model_name,
           p->cluster->name, ps_cluster_device_count(p->cluster), p->method, p->schedule);
    printf("batch         global %lld = %d micro-batch(es) of %lld\n", p->global_batch,
           p->micro_batches, p->global_batch / p->micro_batches);
    if (remat_layer_ranges(p->training, layers, sizeof layers))
        printf("recompute     layers %s\n", layers);
    else if (json_is_true(json_object_get(p->training, "remat")))
        printf("recompute     every layer but the loss's\n");
    for (int i = 0; i < p->n_stages; i++) {
        const ps_plan_stage *s = &p->stages[i];
        printf("stage %-7d layers %d-%d on devices %d-%d, submesh (%d, %d), logical mesh "
               "(%d, %d)\n",
               i, s->first_layer, s->last_layer, s->devices[0], s->devices[s->n_devices - 1],
               s->submesh[0], s->submesh[1], s->logical_mesh[0], s->logical_mesh[1]);
        printf("              forward %.4g ms, backward %.4g ms per micro-batch; update %.4g ms "
               "per step\n",
               s->forward_s * 1e3, s->backward_s * 1e3, s->update_s * 1e3);
        if (s->send_forward_s > 0 && s->send_backward_s > 0)
            printf("              sends %.4g ms of activations on, %.4g ms of gradients back per "
                   "micro-batch\n",
                   s->send_forward_s * 1e3, s->send_backward_s * 1e3);
        else if (s->send_forward_s > 0)
            printf("              sends %.4g ms of activations on to the next stage per "
                   "micro-batch\n",
                   s->send_forward_s * 1e3);
        else if (s->send_backward_s > 0)
            printf("              sends %.4g ms of gradients back per micro-batch\n",
                   s->send_backward_s * 1e3);
        printf("              memory %s per device: weights %s, gradients %s, optimizer %s, "
               "activations %s per micro-batch\n",
               ps_cli_bytes(s->peak_memory_bytes, a, sizeof a),
               ps_cli_bytes(s->weight_bytes, b, sizeof b),
               ps_cli_bytes(s->gradient_bytes, c, sizeof c),
               ps_cli_bytes(s->optimizer_bytes, d, sizeof d),
               ps_cli_bytes(s->activation_bytes, e, sizeof e));
        if (s->layout_gap >= 1)
            printf("              sharding not proven near the best on its mesh (the ILP's "
                   "limit ran out; see --time-limit and --iteration-limit)\n");
        else if (s->layout_gap > LAYOUT_GAP_SHOWN)
            printf("              sharding proven within %.3g%% of the best on its mesh (the "
                   "ILP's limit ran out; see --time-limit and --iteration-limit)\n",
                   100 * s->layout_gap);
    }
    if (strcmp(p->method, "pipeshard") == 0 || strcmp(p->method, "uniform") == 0 ||
        strcmp(p->method, "manual") == 0)
        alpa_lines(p);
    printf("predicted     iteration %.4g s, %.4g TFLOP/s per device (%.1f%% of peak), peak "
           "memory %s\n",
           p->iteration_s, p->tflops_per_device, p->mfu * 100,
           ps_cli_bytes(p->peak_memory_bytes, a, sizeof a));
    if (r != NULL)
        printf("ILP           %d nodes, %d edges, %d layer(s) reusing a solved one; %d columns, "
               "%d rows; %s%s in %.3g s, %lld simplex iterations\n",
               r->ilp_nodes, r->ilp_edges, r->tied_layers, r->ilp.glpk_cols, r->ilp.glpk_rows,
               r->ilp.optimal ? "optimal" : "not proven optimal",
               r->ilp.optimal ? "" : " (the best found; see --time-limit and --iteration-limit)",
               r->ilp.solve_s, r->ilp.iterations);
}

static bool parse_mesh(const char *text, int *d0, int *d1)
{
    char *end;
    long a = strtol(text, &end, 10);
    if (end == text || *end != 'x' || a < 1 || a > PS_CLUSTER_MAX_DEVICES)
        return false;
    const char *rest = end + 1;
    long b = strtol(rest, &end, 10);
    if (end == rest || *end != '\0' || b < 1 || b > PS_CLUSTER_MAX_DEVICES)
        return false;
    *d0 = (int)a;
    *d1 = (int)b;
    return true;
}

/* Which planner a `plan` command calls, and with what. */
typedef struct plan_how {
    bool pipeshard, uniform, auto_micro;
    int dp, op, pp;             /* uniform */
    ps_manual_stage *stages;    /* --stages FILE, owned; NULL: none */
    int n_stages;
    const char *stages_path;    /* that file, for messages */
    const ps_inter_options *inter;
    /* one-stage methods: the last plan's intra-op result and step, owned */
    ps_intra_result *r;
    ps_graph *step;
} plan_how;

/* One plan (a ps_planner_fn: ps_plan_fitting may call it again). */
static ps_status plan_once(const ps_plan_request *req, void *ctx, ps_plan **plan, ps_error *err)
{
    plan_how *how = ctx;
    ps_intra_result_free(how->r);
    ps_graph_free(how->step);
    how->r = NULL;
    how->step = NULL;
    if (!how->pipeshard)
        return ps_plan_one_stage(req, plan, &how->r, &how->step, err);
    if (how->uniform)
        return ps_plan_uniform(req, how->inter, how->dp, how->op, how->pp, plan, err);
    if (how->stages != NULL) {
        ps_error inner = {0};
        ps_status st = ps_plan_manual(req, how->inter, how->stages, how->n_stages, plan, &inner);
        if (st != PS_OK && inner.status == PS_ERR_INVALID) /* the file's stages: say which file */
            return ps_error_set(err, st, "%s: %s", how->stages_path, inner.msg);
        if (st != PS_OK)
            *err = inner;
        return st;
    }
    if (how->auto_micro)
        return ps_plan_pipeshard_search(req, how->inter, plan, err);
    return ps_plan_pipeshard(req, how->inter, plan, err);
}

int ps_cmd_plan(int argc, char **argv)
{
    const char *cluster_spec = NULL, *cluster_file = NULL, *output = NULL;
    bool do_explain = false, json = false, pipeshard = true, uniform = false, auto_micro = false;
    candidates_out candidates = {NULL};
    const char *stages_file = NULL, *dump_dir = NULL, *profile_path = NULL;
    bool stages_uniform = false, stages_given = false; /* --stages uniform, any --stages */
    bool mesh_given = false;
    bool no_memory_check = false;
    int dp = 0, op_degree = 0, pp = 0;
    ps_inter_options inter = ps_inter_options_default();
    ps_plan_request req;
    memset(&req, 0, sizeof req);
    req.method = PS_METHOD_SHARD;
    req.micro_batches = 1;
    req.ilp = ps_ilp_options_default();
    int64_t global_batch = 0, v;
    double x;
    ps_model_opts mo;
    ps_model_opts_init(&mo);
    struct option options[64];
    ps_model_opts_merge(own_options, options, 64);
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "ho:", options, NULL)) != -1) {
        switch (c) {
        case 'h': help(); return 0;
        case 'o': output = optarg; break;
        case OPT_CLUSTER: cluster_spec = optarg; break;
        case OPT_CLUSTER_FILE: cluster_file = optarg; break;
        case OPT_METHOD: {
            int found = -1;
            for (int m = 0; m < PS_METHOD_COUNT; m++)
                if (strcmp(optarg, ps_intra_method_names[m]) == 0)
                    found = m;
            uniform = strcmp(optarg, "uniform") == 0;
            if (uniform || strcmp(optarg, "auto") == 0 || strcmp(optarg, "pipeshard") == 0) {
                pipeshard = true;
                break;
            }
            pipeshard = false;
            if (found < 0)
                return ps_cli_usage_error("plan", "unknown method \"%s\" (pipeshard, uniform, "
                                                  "shard, data, zero2, zero3)",
                                          optarg);
            req.method = (ps_intra_method)found;
            break;
        }
        case OPT_MESH:
            if (!parse_mesh(optarg, &req.mesh[0], &req.mesh[1]))
                return ps_cli_usage_error("plan", "--mesh wants D0xD1, e.g. 2x4, not \"%s\"",
                                          optarg);
            mesh_given = true;
            break;
        case OPT_GLOBAL_BATCH:
            if (!ps_cli_parse_int(optarg, 1, INT64_C(1) << 31, &global_batch))
                return ps_cli_usage_error("plan", "--global-batch wants a positive integer");
            break;
        case OPT_MICRO_BATCHES:
            if (strcmp(optarg, "auto") == 0) {
                auto_micro = true;
                break;
            }
            if (!ps_cli_parse_int(optarg, 1, 1 << 20, &v))
                return ps_cli_usage_error("plan", "--micro-batches wants a positive integer or "
                                                  "'auto'");
            req.micro_batches = (int)v;
            auto_micro = false;
            break;
        case OPT_FORCE: req.force_batch_axis0 = true; break;
        case OPT_TIME_LIMIT:
            if (!ps_cli_parse_double(optarg, 0.01, 1e6, &x))
                return ps_cli_usage_error("plan", "--time-limit wants seconds from 0.01 to "
                                                  "1e6, not \"%s\"", optarg);
            req.ilp.time_limit_s = x;
            break;
        case OPT_ITERATION_LIMIT:
            if (!ps_cli_parse_double(optarg, 1, 1e9, &x) || x != floor(x))
                return ps_cli_usage_error("plan", "--iteration-limit wants a whole number of "
                                                  "iterations from 1 to 1e9, not \"%s\"",
                                          optarg);
            req.ilp.iteration_limit = x;
            break;
        case OPT_EXPLAIN: do_explain = true; break;
        case OPT_DUMP: dump_dir = optarg; break;
        case OPT_PROFILE_DB: profile_path = optarg; break;
        case OPT_LAYER_NUM:
            if (strcmp(optarg, "manual") == 0) {
                inter.manual_layers = true;
            } else if (!ps_cli_parse_int(optarg, 1, 4096, &v)) {
                return ps_cli_usage_error("plan", "--layer-num wants a positive number or "
                                                  "'manual'");
            } else {
                inter.layer_num = (int)v;
            }
            break;
        case OPT_SUBMESH: {
            int found = -1;
            for (int k = 0; k < PS_SUBMESH_CHOICES_COUNT; k++)
                if (k != PS_SUBMESH_MANUAL && strcmp(optarg, ps_submesh_choices_names[k]) == 0)
                    found = k;
            if (found >= 0) {
                inter.submeshes = (ps_submesh_choices)found;
                break;
            }
            if (strchr(optarg, 'x') == NULL && strchr(optarg, 'X') == NULL)
                return ps_cli_usage_error("plan", "--submesh-choices wants power_of_two, "
                                                  "small_power_of_two, all or a list such as "
                                                  "1x2,1x4,2x8");
            ps_error perr = {0};
            if (ps_inter_parse_submeshes(optarg, &inter, &perr) != PS_OK)
                return ps_cli_usage_error("plan", "%s", perr.msg);
            break;
        }
        case OPT_SCHEDULE:
            if (strcmp(optarg, "1f1b") != 0 && strcmp(optarg, "gpipe") != 0)
                return ps_cli_usage_error("plan", "--schedule wants 1f1b or gpipe");
            inter.gpipe = strcmp(optarg, "gpipe") == 0;
            break;
        case OPT_ROWS: inter.print_rows = true; break;
        case OPT_NO_TRANSFER_COSTS: inter.transfer_costs = false; break;
        case OPT_NO_MEMORY_CHECK: no_memory_check = true; break;
        case OPT_EXACT_RANGES: inter.exact_ranges = true; break;
        case OPT_SHOW_CANDIDATES:
            inter.on_candidate = print_candidate;
            inter.on_candidate_ctx = &candidates;
            break;
        case OPT_IMBALANCE:
            if (!ps_cli_parse_double(optarg, 0, 1e9, &x))
                return ps_cli_usage_error("plan", "--stage-imbalance-tolerance wants a number "
                                                  ">= 0");
            inter.stage_imbalance_tolerance = x;
            break;
        case OPT_CANDIDATES:
            if (!ps_cli_parse_int(optarg, 1, 16, &v))
                return ps_cli_usage_error("plan", "--stage-candidates wants an integer from 1 "
                                                  "to 16");
            inter.stage_candidates = (int)v;
            break;
        case OPT_STAGES: /* auto: the stage DP; uniform: Alpa's uniform plan; else a file */
            stages_file = strcmp(optarg, "auto") == 0 || strcmp(optarg, "uniform") == 0
                              ? NULL
                              : optarg;
            stages_uniform = strcmp(optarg, "uniform") == 0;
            stages_given = true;
            break;
        case OPT_DP:
        case OPT_OP:
        case OPT_PP:
            if (!ps_cli_parse_int(optarg, 1, 1 << 20, &v))
                return ps_cli_usage_error("plan", "--dp, --op and --pp want positive integers");
            *(c == OPT_DP ? &dp : c == OPT_OP ? &op_degree : &pp) = (int)v;
            break;
        case OPT_JSON: json = true; break;
        case '?':
            return ps_cli_usage_error("plan", "unknown or incomplete option \"%s\"",
                                      argv[optind - 1]);
        default: {
            int taken = ps_model_opts_take(&mo, c, optarg, "plan");
            if (taken == 2)
                return 2;
            if (taken == 1)
                return ps_cli_usage_error("plan", "unexpected option");
        }
        }
    }
    if (optind < argc && strcmp(argv[optind], "auto") == 0 && mo.train.remat)
        return ps_cli_usage_error("plan", "write --remat=auto (--remat alone takes no value)");
    if (optind < argc)
        return ps_cli_usage_error("plan", "unexpected argument \"%s\"", argv[optind]);
    int usage = ps_model_opts_check(&mo, false, "plan");
    if (usage != 0)
        return usage;
    if ((cluster_spec == NULL) == (cluster_file == NULL))
        return ps_cli_usage_error("plan", "give exactly one of --cluster and --cluster-file");
    if ((dp > 0 || op_degree > 0 || pp > 0) && !uniform && !stages_uniform)
        return ps_cli_usage_error("plan", "--dp, --op and --pp apply to --method uniform (or "
                                          "--stages uniform)");
    if (output == NULL)
        return ps_cli_usage_error("plan", "-o PLAN.json is required");
    if (mo.remat_auto && (!pipeshard || uniform || stages_file != NULL || stages_uniform))
        return ps_cli_usage_error("plan", "--remat=auto has the stage DP choose which stages "
                                          "recompute: it goes with --method pipeshard and "
                                          "--stages auto (give --remat otherwise)");
    inter.remat_by_stage = mo.remat_auto;
    if (auto_micro && (!pipeshard || uniform))
        return ps_cli_usage_error("plan", "--micro-batches auto goes with --method pipeshard "
                                          "(the stage DP)");
    if (auto_micro && (stages_file != NULL || stages_uniform))
        return ps_cli_usage_error("plan", "--micro-batches auto needs the stage DP (--stages "
                                          "auto): with --stages %s the stages are given; give "
                                          "a count",
                                  stages_file != NULL ? "FILE" : "uniform");
    if (mesh_given && (pipeshard || uniform))
        return ps_cli_usage_error("plan", "--mesh applies to --method shard, data, zero2 and "
                                          "zero3 (the one-stage methods): %s",
                                  uniform || stages_uniform ? "a uniform plan's mesh is --dp x --op"
                                          : "the stage DP chooses each stage's logical mesh "
                                            "(a stage file can set them)");
    if (auto_micro && mo.graph_path != NULL)
        return ps_cli_usage_error("plan", "--micro-batches auto chooses the micro-batch size: "
                                          "it needs a built-in model (--model), not a graph "
                                          "file, whose shapes fix it");
    if (mo.graph_path != NULL && global_batch > 0)
        return ps_cli_usage_error("plan", "--global-batch applies to --model only (a graph "
                                          "file fixes the micro-batch; use --micro-batches)");

    const ps_cli_path outs[] = {{"-o", output}};
    const ps_cli_path ins[] = {{"--cluster-file", cluster_file},
                               {"--stages", stages_file},
                               {"--profile-db", profile_path},
                               {"--graph", mo.graph_path}};
    if (json && strcmp(output, "-") == 0)
        return ps_cli_usage_error("plan", "--json and -o - both want stdout; give -o a file");
    int checked = ps_cli_check_outputs("plan", outs, 1, ins, 4);
    if (checked != 0)
        return checked;
    /* -o -: stdout carries the plan alone, the report goes to stderr */
    int plan_fd = -1;
    if (strcmp(output, "-") == 0) {
        fflush(stdout);
        plan_fd = dup(STDOUT_FILENO);
        if (plan_fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
            fprintf(stderr, "pipeshard: plan: cannot set stdout aside: %s\n", strerror(errno));
            if (plan_fd >= 0)
                close(plan_fd);
            return 1;
        }
    }
    ps_error err = {0};
    ps_status st = PS_OK;
    bool bad_usage = false; /* err.msg is about the command line: exit status 2 */
    ps_cluster *cluster = NULL;
    ps_profile_db *profile = NULL;
    ps_graph *fwd = NULL;
    ps_plan *plan = NULL;
    ps_model_config cfg;
    bool from_zoo = false;
    plan_how how = {.inter = &inter};
    ps_plan_fit fit = {0};
    ps_plan_fit_options fit_opt = ps_plan_fit_options_default();
    char pa[32], pb[32];
    if (cluster_spec != NULL) {
        if ((st = ps_cluster_from_preset(cluster_spec, &cluster, &err)) != PS_OK) {
            bad_usage = true; /* typed on the command line */
            char msg[PS_ERROR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", err.msg);
            ps_error_clear(&err);
            ps_error_set(&err, st, "--cluster: %s", msg);
            goto out;
        }
    } else {
        PS_TRY(ps_cluster_load(cluster_file, &cluster, &err));
    }
    if (profile_path != NULL)
        PS_TRY(ps_cli_attach_profile(profile_path, cluster, &profile, &err));
    if (auto_micro)
        req.micro_batches = 1; /* the search rebuilds the model per count */
    if (mo.model != NULL) {
        PS_TRY(ps_zoo_lookup(mo.model, &cfg, &err)); /* known: ps_model_opts_check */
        long long gb = global_batch > 0 ? global_batch : cfg.global_batch;
        if (gb % req.micro_batches != 0) {
            st = ps_error_set(&err, PS_ERR_INVALID,
                              "%d micro-batches do not divide the global batch %lld",
                              req.micro_batches, gb);
            goto out;
        }
        req.global_batch = gb;
        PS_TRY(ps_model_opts_build(&mo, gb / req.micro_batches, &cfg, &from_zoo, &fwd, &err));
    } else {
        PS_TRY(ps_model_opts_build(&mo, 0, &cfg, &from_zoo, &fwd, &err));
        int64_t mb = ps_graph_batch(fwd);
        req.global_batch = (mb > 0 ? mb : 1) * req.micro_batches;
    }
    req.forward = fwd;
    req.config = from_zoo ? &cfg : NULL;
    req.train = mo.train;
    req.cluster = cluster;
    {
        /* a device kind without a rate for the model's dtype (a V100 and
         * bf16): the cost model takes its fp32 rate, which the user should
         * know */
        ps_dtype dt = ps_graph_param_dtype(fwd, PS_DTYPE_F32);
        for (int i = 0; i < cluster->n_kinds && dt != PS_DTYPE_F32 &&
                        dt < PS_FLOAT_DTYPE_COUNT;
             i++)
            if (!(cluster->kinds[i].peak_flops[dt] > 0))
                PS_LOG_WARN("device kind \"%s\" of %s has no %s rate (not supported there): "
                            "the cost model times %s work at its fp32 rate, and MFU is "
                            "against that peak",
                            cluster->kinds[i].name, cluster->name, ps_dtype_name(dt),
                            ps_dtype_name(dt));
    }
    if (stages_given && !pipeshard) {
        st = ps_error_set(&err, PS_ERR_INVALID, "--stages applies to --method pipeshard");
        bad_usage = true;
        goto out;
    }
    if (stages_uniform)
        uniform = true;
    /* Planned, then checked against the lowered programs' exact peak and
     * planned again with less memory where a device would run out
     * (planner/plan_fit.h). Test mode: PIPESHARD_PLAN_MEMORY_SCALE=S (1 to
     * 10) plans with S times the memory, as a planner whose estimates were
     * that much too low. */
    const char *scale_env = getenv("PIPESHARD_PLAN_MEMORY_SCALE");
    if (scale_env != NULL && !ps_cli_parse_double(scale_env, 1, 10, &fit_opt.memory_scale)) {
        st = ps_error_set(&err, PS_ERR_INVALID,
                          "PIPESHARD_PLAN_MEMORY_SCALE needs a number in [1, 10], not \"%s\"",
                          scale_env);
        goto out;
    }
    fit_opt.check = !no_memory_check;
    /* what to plan, checked once: the attempts below only plan */
    if (json && inter.print_rows) {
        st = ps_error_set(&err, PS_ERR_INVALID,
                          "--rows prints the stage cost table as text on standard output, where "
                          "--json prints the predictions: use one of the two");
        bad_usage = true;
        goto out;
    }
    if (json && inter.on_candidate != NULL && (candidates.list = json_array()) == NULL) {
        st = ps_error_set(&err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (pipeshard) {
        if (do_explain) {
            st = ps_error_set(&err, PS_ERR_UNSUPPORTED,
                              "--explain prints one stage's strategies; use it with "
                              "--method shard|data|zero2|zero3 (pipeshard plans list every "
                              "op's strategy in the plan file)");
            bad_usage = true;
            goto out;
        }
        if (uniform) {
            if (dp == 0 || op_degree == 0 || pp == 0 || stages_file != NULL) {
                st = ps_error_set(&err, PS_ERR_INVALID,
                                  "uniform stages (--method uniform or --stages uniform) need "
                                  "--dp, --op and --pp, and no stage file");
                bad_usage = true;
                goto out;
            }
        } else if (stages_file != NULL) {
            int asked = inter.layer_num; /* --layer-num, which the file may set too */
            bool asked_manual = inter.manual_layers;
            PS_TRY(ps_stage_file_load(stages_file, &inter, &how.stages, &how.n_stages, &err));
            how.stages_path = stages_file;
            if ((asked > 0 || asked_manual) &&
                (inter.layer_num != asked || inter.manual_layers != asked_manual)) {
                char file[16], cli[16];
                snprintf(file, sizeof file, "%d", inter.layer_num);
                snprintf(cli, sizeof cli, "%d", asked);
                st = ps_error_set(&err, PS_ERR_INVALID,
                                  "--layer-num %s, but the stage file %s says layer_num %s: "
                                  "give one of them",
                                  asked_manual ? "manual" : cli, stages_file,
                                  inter.manual_layers ? "\"manual\"" : file);
                bad_usage = true;
                goto out;
            }
        }
    } else if (inter.manual_layers || inter.layer_num > 0 || inter.gpipe || inter.print_rows ||
               inter.exact_ranges || inter.stage_imbalance_tolerance < INFINITY ||
               inter.submeshes != PS_SUBMESH_POWER_OF_TWO ||
               inter.stage_candidates != ps_inter_options_default().stage_candidates ||
               inter.on_candidate != NULL) {
        st = ps_error_set(&err, PS_ERR_INVALID,
                          "--layer-num, --schedule, --rows, --exact-ranges, "
                          "--submesh-choices, --stage-imbalance-tolerance, "
                          "--stage-candidates and --show-candidates apply to --method "
                          "pipeshard");
        bad_usage = true;
        goto out;
    }
    how.pipeshard = pipeshard;
    how.uniform = uniform;
    how.auto_micro = auto_micro;
    how.dp = dp;
    how.op = op_degree;
    how.pp = pp;
    PS_TRY(ps_plan_fitting(&req, &fit_opt, plan_once, &how, &plan, &fit, &err));
    PS_TRY(ps_plan_record_profile(plan, profile, &err));
    if (plan->mfu > 1)
        /* faster than the devices can compute: the times are not the cluster's */
        PS_LOG_WARN("the plan predicts %.0f%% of the devices' peak FLOP/s: %s", plan->mfu * 100,
                    profile != NULL ? "the profile DB's times are faster than the cluster's "
                                      "peak allows (a DB of other devices, or edited?)"
                                    : "the cluster's rates disagree with each other");
    /* the programs first: a failed dump leaves no plan behind */
    if (dump_dir != NULL)
        PS_TRY(ps_cli_dump_programs(plan, dump_dir, &err));
    if (plan_fd >= 0) { /* the plan alone onto the real stdout */
        fflush(stdout);
        dup2(plan_fd, STDOUT_FILENO);
    }
    st = ps_plan_save(plan, output, &err);
    if (plan_fd >= 0) {
        fflush(stdout);
        dup2(STDERR_FILENO, STDOUT_FILENO);
    }
    if (st != PS_OK)
        goto out;
    if (json) {
        json_t *j = NULL;
        PS_TRY(ps_plan_to_json(plan, &j));
        json_t *pred = json_incref(json_object_get(j, "predicted"));
        json_decref(j);
        if (pred != NULL && candidates.list != NULL)
            json_object_set(pred, "candidates", candidates.list);
        st = ps_json_save(pred, "-", &err);
        json_decref(pred);
    } else {
        summary(plan, how.r);
        if (fit_opt.check)
            printf("programs      peak memory %s (device %d, stage %d) of its %s, exact from "
                   "the lowered programs (%.3g s)\n",
                   ps_cli_bytes(fit.programs.peak_bytes, pa, sizeof pa),
                   fit.programs.worst_device, fit.programs.worst_stage,
                   ps_cli_bytes(fit.programs.memory_bytes, pb, sizeof pb), fit.programs.lower_s);
        if (do_explain)
            explain(how.step, how.r);
    }
out:
    json_decref(candidates.list);
    free(how.stages);
    ps_intra_result_free(how.r);
    ps_graph_free(how.step);
    ps_plan_free(plan);
    ps_graph_free(fwd);
    ps_cluster_free(cluster);
    ps_profile_db_free(profile);
    if (plan_fd >= 0) { /* stdout back */
        fflush(stdout);
        dup2(plan_fd, STDOUT_FILENO);
        close(plan_fd);
    }
    if (bad_usage)
        return ps_cli_usage_error("plan", "%s", err.msg);
    return st == PS_OK ? 0 : ps_cli_fail(&err, st);
}
