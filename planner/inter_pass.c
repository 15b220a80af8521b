#include "planner/inter_pass.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes_text.h"
#include "core/clock.h"
#include "core/json.h"
#include "core/log.h"
#include "core/parallel.h"
#include "planner/layer_cluster.h"
#include "planner/lower.h"
#include "planner/pipeline_time.h"
#include "planner/range_compose.h"
#include "planner/stage_dp.h"

const char *const ps_submesh_choices_names[PS_SUBMESH_CHOICES_COUNT] = {
    "power_of_two", "small_power_of_two", "all", "manual"};

ps_status ps_inter_parse_submeshes(const char *list, ps_inter_options *o, ps_error *err)
{
    int n = 0, got[PS_MAX_MANUAL_SUBMESHES][2];
    const char *p = list;
    if (list == NULL || *list == '\0')
        return ps_error_set(err, PS_ERR_INVALID, "an empty submesh list");
    while (*p != '\0') {
        char *end = NULL;
        long h = strtol(p, &end, 10);
        if (end == p || (*end != 'x' && *end != 'X'))
            return ps_error_set(err, PS_ERR_INVALID,
                                "submesh list \"%s\": \"%s\" is not HOSTSxDEVICES (e.g. 1x4)",
                                list, p);
        const char *q = end + 1;
        long d = strtol(q, &end, 10);
        if (end == q || (*end != ',' && *end != '\0'))
            return ps_error_set(err, PS_ERR_INVALID,
                                "submesh list \"%s\": \"%s\" is not HOSTSxDEVICES (e.g. 1x4)",
                                list, p);
        if (h < 1 || d < 1 || h > 1 << 20 || d > 1 << 20)
            return ps_error_set(err, PS_ERR_INVALID,
                                "submesh list \"%s\": %ldx%ld: hosts and devices must be "
                                "positive",
                                list, h, d);
        if (n == PS_MAX_MANUAL_SUBMESHES)
            return ps_error_set(err, PS_ERR_INVALID, "submesh list \"%s\": more than %d submeshes",
                                list, PS_MAX_MANUAL_SUBMESHES);
        for (int k = 0; k < n; k++)
            if (got[k][0] == h && got[k][1] == d)
                return ps_error_set(err, PS_ERR_INVALID,
                                    "submesh list \"%s\": %ldx%ld appears twice", list, h, d);
        got[n][0] = (int)h;
        got[n][1] = (int)d;
        n++;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == '\0')
            return ps_error_set(err, PS_ERR_INVALID, "submesh list \"%s\" ends with a comma",
                                list);
    }
    memcpy(o->manual_submeshes, got, (size_t)n * sizeof got[0]);
    o->n_manual_submeshes = n;
    o->submeshes = PS_SUBMESH_MANUAL;
    return PS_OK;
}

/* ps_inter_options.lean_twin_iterations by default: GPT-15B's plain twins
 * (17,759 columns) take 0.35-0.45 ms an iteration on the development
 * machine, so about 4 s each at most there */
#define LEAN_TWIN_ITERATIONS 10000

ps_inter_options ps_inter_options_default(void)
{
    return (ps_inter_options){.layer_num = 0, .manual_layers = false,
                              .submeshes = PS_SUBMESH_POWER_OF_TWO, .gpipe = false,
                              .print_rows = false, .exact_ranges = false,
                              .stage_time_limit_s = 20, .transfer_costs = true,
                              .stage_imbalance_tolerance = INFINITY, .stage_candidates = 2,
                              .lean_twin_iterations = LEAN_TWIN_ITERATIONS, .remat_by_stage = false,
                              .share_layouts = true,
                              .memory_floor_check = true};
}

typedef struct submesh {
    int hosts, devices; /* devices per host */
} submesh;

/* Seconds a stage on a submesh of hosts x devices spends per micro-batch
 * receiving what crosses layer boundary b (between layers b - 1 and b):
 * through its nodes' NICs when the neighbour is on another node (`across`),
 * else through its devices' intra-node links. */
static double boundary_receive_s(const ps_cluster *c, const ps_layering *lay, int b, int hosts,
                                 int devices, bool across)
{
    if (b <= 0 || b >= lay->n_layers || !(lay->cut_bytes[b] > 0))
        return 0;
    /* everything made before b and read from b on: a shortcut past the
     * stage's first layer crosses too (counting what layer b alone reads
     * charged a ResNet cut 1.31 MB that moved 6.55 MB) */
    double bytes = lay->cut_bytes[b];
    double intra = (double)hosts * devices * c->intra.bandwidth_bytes_per_s;
    if (!across)
        return c->intra.latency_s + bytes / intra;
    double nics = hosts * c->inter.nics_per_node * c->inter.nic_bandwidth_bytes_per_s;
    return fmax(c->inter.latency_s, c->intra.latency_s) + bytes / fmin(nics, intra);
}

/* What a stage of layers [first, last] on submesh s receives per micro-batch
 * (the activations into `first`, the gradients of those into last + 1),
 * in seconds, as Alpa's packing places it: through its nodes' NICs when it
 * spans whole nodes of a cluster of several (its neighbours are then on
 * other nodes) or when `across` says that its neighbours are on other
 * nodes, else through its devices' intra-node links (a neighbour on the
 * same node). */
static double stage_receive_s(const ps_cluster *c, const ps_layering *lay, int first, int last,
                              int hosts, int devices, bool across)
{
    bool nics = c->nodes > 1 && (devices == c->devices_per_node || across);
    return boundary_receive_s(c, lay, first, hosts, devices, nics) +
           boundary_receive_s(c, lay, last + 1, hosts, devices, nics);
}

/* Whether layers [first, last] on a submesh of `devices` of the cluster's
 * D are a candidate stage under tolerance t (ps_inter_options); flops:
 * [L + 1] prefix sums of the layers' forward FLOPs. */
static bool stage_balanced(const double *flops, int L, int first, int last, int devices, int D,
                           double t)
{
    if (devices == D)
        return first == 0 && last == L - 1;
    if (!(t < INFINITY) || !(flops[L] > 0))
        return true;
    double f = (flops[last + 1] - flops[first]) / flops[L], d = (double)devices / D;
    return d <= f * (1 + t) && d >= f / (1 + t);
}

typedef struct config {
    int d0, d1;
    bool force;
    bool lean; /* the layout of least time among those near the least memory */
    bool remat; /* its layers recomputed (ps_inter_options.remat_by_stage) */
} config;

#define MAX_SUBMESHES 64
#define MAX_CONFIGS 16 /* per submesh, from list_configs */
/* per submesh in the stage table: each configuration also recomputing */
#define MAX_TABLE_CONFIGS (2 * MAX_CONFIGS)

/* The candidate submeshes, smaller first; a manual list is checked against
 * the cluster (-1 and a message when one does not fit it). */
static int list_submeshes(const ps_cluster *c, const ps_inter_options *o, submesh *out,
                          ps_error *err)
{
    int n = 0, M = c->devices_per_node, N = c->nodes;
    ps_submesh_choices ch = o->submeshes;
    if (ch == PS_SUBMESH_MANUAL) {
        if (o->n_manual_submeshes < 1 || o->n_manual_submeshes > PS_MAX_MANUAL_SUBMESHES) {
            ps_error_set(err, PS_ERR_INVALID, "manual submesh choices: the list is empty");
            return -1;
        }
        for (int k = 0; k < o->n_manual_submeshes; k++) {
            int h = o->manual_submeshes[k][0], d = o->manual_submeshes[k][1];
            if (h < 1 || d < 1 || h > N || d > M || (h > 1 && d != M)) {
                ps_error_set(err, PS_ERR_INVALID,
                             "submesh %dx%d does not fit %s (%d nodes of %d devices): a "
                             "submesh is part of one node (1xD, D <= %d) or whole nodes (Hx%d)",
                             h, d, c->name, N, M, M, M);
                return -1;
            }
            out[n++] = (submesh){h, d};
        }
        for (int a = 1; a < n; a++) /* by size: the DP and the table read them so */
            for (int b = a; b > 0 && out[b].hosts * out[b].devices <
                                         out[b - 1].hosts * out[b - 1].devices;
                 b--) {
                submesh t = out[b];
                out[b] = out[b - 1];
                out[b - 1] = t;
            }
        return n;
    }
    for (int m = 1; m <= M && n < MAX_SUBMESHES; m++) {
        bool pow2 = (m & (m - 1)) == 0;
        if (ch != PS_SUBMESH_ALL && !pow2 && m != M)
            continue;
        out[n++] = (submesh){1, m};
    }
    for (int h = 2; h <= N && n < MAX_SUBMESHES; h++) {
        bool pow2 = (h & (h - 1)) == 0;
        /* the whole cluster is always a candidate, as a whole node is: on
         * 3 nodes the one-stage plan over all 24 devices was none */
        if (ch == PS_SUBMESH_POWER_OF_TWO && !pow2 && h != N)
            continue;
        if (ch == PS_SUBMESH_SMALL_POWER_OF_TWO && (!pow2 || h > 4))
            continue;
        out[n++] = (submesh){h, M};
    }
    return n;
}

/* Whether some multiset of the submeshes has exactly D devices (the stage
 * DP's stages cover the cluster). */
static bool submeshes_cover(const submesh *subs, int n, int D)
{
    unsigned char *reach = calloc((size_t)D + 1, 1);
    if (reach == NULL)
        return true; /* the DP will say */
    reach[0] = 1;
    for (int d = 1; d <= D; d++)
        for (int s = 0; s < n && !reach[d]; s++) {
            int size = subs[s].hosts * subs[s].devices;
            reach[d] = size <= d && reach[d - size];
        }
    bool ok = reach[D];
    free(reach);
    return ok;
}

/* Logical meshes of a submesh, as in Alpa: every (dp, mp) with the model-
 * parallel axis inside one node (mp <= devices per node) and the micro-batch
 * divisible by dp, with the batch forced onto the dp axis; plus (1, n) with
 * any sharding when n fits in a node. A dp that does not divide the batch
 * cannot carry it: Alpa leaves it out, and forced it would be a free ILP on
 * a wide mesh anyway, the slowest of the table's solves (half of GPT-39B's).
 * A submesh where no dp divides the batch (micro-batches of 12 on 64
 * devices) gets every shape unforced instead: Alpa's one default view would
 * lose the layouts that split the batch on a narrower axis (GPT-3 175B on
 * 1024 GPUs: 18% slower). */
static int list_configs(const submesh *s, int devices_per_node, long long batch, config *out)
{
    int n = s->hosts * s->devices, k = 0;
    if (n <= devices_per_node)
        out[k++] = (config){1, n, false, false, false};
    for (int dp = 2; dp <= n && k < MAX_CONFIGS / 2; dp++)
        if (n % dp == 0 && n / dp <= devices_per_node && batch % dp == 0)
            out[k++] = (config){dp, n / dp, true, false, false};
    if (k == 0)
        for (int dp = 2; dp <= n && k < MAX_CONFIGS / 2; dp++)
            if (n % dp == 0 && n / dp <= devices_per_node)
                out[k++] = (config){dp, n / dp, false, false, false};
    /* each also as a lean variant: a stage with many later stages in flight
     * (or several layers) may need memory more than speed */
    for (int i = 0, m = k; i < m; i++) {
        out[k] = out[i];
        out[k++].lean = true;
    }
    return k;
}

/* A structural hash of a graph: equal for identical layer ranges. */
static uint64_t graph_hash(const ps_graph *g)
{
    uint64_t h = 1469598103934665603ull;
#define MIX(x)                                                                                 \
    do {                                                                                       \
        uint64_t v_ = (uint64_t)(x);                                                           \
        for (int b_ = 0; b_ < 8; b_++) {                                                       \
            h = (h ^ (v_ & 0xff)) * 1099511628211ull;                                          \
            v_ >>= 8;                                                                          \
        }                                                                                      \
    } while (0)
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        MIX(op->kind);
        MIX(op->pass);
        const unsigned char *a = (const unsigned char *)&op->attrs;
        for (size_t k = 0; k < sizeof op->attrs; k++)
            h = (h ^ a[k]) * 1099511628211ull;
        for (int k = 0; k < op->n_in; k++) {
            const ps_tensor *t = &g->tensors[op->in[k]];
            MIX(op->in[k]); /* which tensor: slices that read one input twice or two
                             * alike differ, and so do their numberings */
            MIX(t->producer);
            MIX(t->kind);
            MIX(t->desc.dtype);
            for (int d = 0; d < t->desc.rank; d++)
                MIX(t->desc.shape[d]);
        }
    }
    MIX(g->loss >= 0);
    MIX(g->n_tensors);
#undef MIX
    return h;
}

typedef ps_stage_entry entry;

typedef struct cache_item {
    uint64_t hash;
    double budget;  /* bytes per device the slice's entries may use */
    unsigned variants; /* bit v: a slice of variant v's step (both, where they are equal) */
    entry *entries; /* [n_sub * n_cfg] */
    /* [n_sub * n_cfg] what each entry's layouts make of the slice's tensors,
     * for the ranges composed from single layers (else NULL); one pool */
    ps_entry_tensors *tensors;
    double *tensor_bytes;
} cache_item;

/* The relative gap of the table's solves and of every solve within a memory
 * budget: the stage DP compares entries known to this precision, and a
 * budgeted program proven to 1e-4 takes GLPK seconds (its knapsack row
 * stalls the bound) where the priced relaxation closes a percent in a
 * fraction of one (planner/intra_ilp.c). The fastest layouts of the chosen
 * stages keep the request's gap. */
#define STAGE_GAP 0.01

/* The one-stage plan is solved too when the stage DP's cost of it is within
 * this factor of the DP's best pipeline, or below the best pipeline's
 * schedule: one stage's cost is its schedule, a pipeline's objective leaves
 * out its transfers and shared parameters (step 6 of ps_plan_pipeshard). */
#define ONE_STAGE_WITHIN 2.0

/* Besides the stage DP's best pipeline, the best of each other stage count
 * whose DP objective is within this factor of it is solved and timed too
 * (ps_inter_options.stage_candidates pipelines each way at most, nearest
 * first, and never more than MAX_CANDIDATES). */
#define CANDIDATES_WITHIN 1.10
#define MAX_CANDIDATES 16

/* What a stage's solve may take: wall-clock seconds (0: the request's
 * limit) and GLPK simplex iterations (0: no such limit;
 * ps_ilp_options.iteration_limit). */
typedef struct solve_limit {
    double time_s;
    double iterations;
} solve_limit;

static ps_intra_options stage_intra_options(const config *cf, const ps_plan_request *req,
                                            solve_limit lim)
{
    ps_intra_options io = ps_intra_options_default();
    io.method = PS_METHOD_SHARD;
    io.force_batch_axis0 = cf->force;
    io.micro_batches = req->micro_batches;
    io.ilp = req->ilp;
    if (lim.time_s > 0) {
        io.ilp.time_limit_s = lim.time_s;
        io.ilp.mip_gap = fmax(io.ilp.mip_gap, STAGE_GAP);
    }
    if (lim.iterations > 0)
        io.ilp.iteration_limit = io.ilp.iteration_limit > 0
                                     ? fmin(io.ilp.iteration_limit, lim.iterations)
                                     : lim.iterations;
    return io;
}

/* A slice's fastest layout on a mesh with one logical configuration. */
static ps_status solve_fastest(const ps_graph *slice, const ps_logical_mesh *m, const config *cf,
                               const ps_plan_request *req, solve_limit lim, ps_intra_result **out,
                               ps_error *err)
{
    ps_intra_options io = stage_intra_options(cf, req, lim);
    *out = NULL;
    return ps_intra_solve(slice, m, &io, out, err);
}

/* A slice on a logical mesh, and the intra-op session its solves within a
 * budget share (made at the first; the batch forcing is that solve's
 * configuration's, which its lean variant and plain twin share). A solve
 * without a budget reduces the program more on its own: where nothing had
 * to fit, a session's first solve was up to twice as slow (GPT-3 175B's
 * plan 53 -> 87 s), and a lean solve warm from the fastest layout's basis
 * slower than cold (docs/intra-op.md). */
typedef struct slice_solver {
    const ps_graph *slice;
    const ps_logical_mesh *m;
    ps_intra_session *session; /* NULL until the first budgeted solve */
} slice_solver;

static ps_status slice_solve(slice_solver *ls, const ps_intra_options *io, ps_intra_result **out,
                             ps_error *err)
{
    *out = NULL;
    if (io->memory_budget_bytes <= 0)
        return ps_intra_solve(ls->slice, ls->m, io, out, err);
    if (ls->session == NULL)
        PS_TRY_RET(ps_intra_session_create(ls->slice, ls->m, io, &ls->session, err));
    return ps_intra_session_solve(ls->session, io, out, err);
}

/* The solve within a budget that a configuration and its lean variant may
 * share: the lean layout still over the budget leaves the same program as
 * the plain one's when its temporaries are the same. */
typedef struct budget_memo {
    double cap;   /* the budget of the plain configuration's solve; NAN: none */
    bool reused;  /* set by solve_within: the answer is that solve's */
} budget_memo;

static ps_intra_options within_options(const config *cf, const ps_plan_request *req,
                                       solve_limit lim)
{
    ps_intra_options io = stage_intra_options(cf, req, lim);
    io.ilp.mip_gap = fmax(io.ilp.mip_gap, STAGE_GAP);
    return io;
}

/* A lean configuration's layout: memory weighed like time, each byte above
 * the least costing what the fastest layout's time per byte is, twice (a
 * soft constraint that keeps the exact reductions; a hard one is far slower
 * to solve). *out NULL where the fastest layout is within 5% of the least
 * memory (it is lean already). It depends on the slice, the mesh's costs,
 * the configuration and the fastest layout alone, not on any budget. */
static ps_status solve_lean(slice_solver *ls, const config *cf, const ps_plan_request *req,
                            solve_limit lim, const ps_intra_result *fastest, ps_intra_result **out,
                            ps_error *err)
{
    *out = NULL;
    double lasting = fastest->weight_bytes + fastest->gradient_bytes + fastest->optimizer_bytes +
                     fastest->activation_bytes;
    if (!(lasting > 1.05 * fastest->min_memory_bytes))
        return PS_OK;
    ps_intra_options io = within_options(cf, req, lim);
    io.memory_weight_s_per_byte = 2 * fastest->objective_s / lasting;
    return slice_solve(ls, &io, out, err);
}

/* From the fastest layout: for a lean configuration one that weighs memory
 * like time; then, if that needs more than `budget` bytes per device, the
 * fastest within the budget (as Alpa's stage profiling does). The budget
 * bounds the lasting bytes (weights, gradients, optimizer state,
 * activations) to `budget` less the layout's temporaries; a finite `cap`
 * bounds them to cap instead. *out is NULL when the fastest layout is the
 * answer, else a new result. The fastest layout is shared by a
 * configuration and its lean variant, and by the retries with smaller
 * budgets. With a memo, a budgeted solve whose budget is the memo's is
 * skipped (memo->reused). `lean`, where not NULL, is solve_lean's answer
 * already known (copied where it is the answer). */
static ps_status solve_within(slice_solver *ls, const config *cf,
                              const ps_plan_request *req, solve_limit lim, double budget,
                              double cap, const ps_intra_result *fastest,
                              const ps_intra_result *const *lean, budget_memo *memo,
                              ps_intra_result **out, ps_error *err)
{
    ps_intra_options io = within_options(cf, req, lim);
    const ps_intra_result *r = fastest;
    ps_intra_result *own = NULL;
    *out = NULL;
    if (cf->lean && lean != NULL) {
        if (*lean != NULL)
            r = *lean;
    } else if (cf->lean) {
        PS_TRY_RET(solve_lean(ls, cf, req, lim, fastest, &own, err));
        if (own != NULL)
            r = own;
    }
    double lasting = r->weight_bytes + r->gradient_bytes + r->optimizer_bytes + r->activation_bytes;
    double transient = r->peak_memory_bytes - lasting;
    if (isnan(cap) ? r->peak_memory_bytes > budget : lasting > cap) {
        if (isnan(cap))
            cap = budget - transient;
        ps_intra_result_free(own);
        if (cap <= 0)
            return ps_error_set(err, PS_ERR_INFEASIBLE, "temporaries alone exceed the budget");
        if (memo != NULL && memo->cap == cap) {
            memo->reused = true;
            return PS_OK;
        }
        if (memo != NULL)
            memo->cap = cap;
        io.memory_budget_bytes = cap;
        return slice_solve(ls, &io, out, err);
    }
    if (r != fastest && own == NULL)
        return ps_intra_result_copy(r, out, err); /* the known lean layout */
    *out = own;
    return PS_OK;
}

static void entry_fill(entry *e, const ps_intra_result *r)
{
    e->ok = true;
    e->time_s = r->compute_s[PS_PASS_FORWARD] + r->comm_s[PS_PASS_FORWARD] +
                r->compute_s[PS_PASS_BACKWARD] + r->comm_s[PS_PASS_BACKWARD] +
                r->compute_s[PS_PASS_RECOMPUTE] + r->comm_s[PS_PASS_RECOMPUTE];
    e->forward_s = r->compute_s[PS_PASS_FORWARD] + r->comm_s[PS_PASS_FORWARD];
    e->update_s = r->compute_s[PS_PASS_UPDATE] + r->comm_s[PS_PASS_UPDATE];
    e->static_bytes = r->weight_bytes + r->gradient_bytes + r->optimizer_bytes;
    e->act_bytes = r->activation_bytes;
    e->transient_bytes = r->transient_bytes;
    e->update_bytes = r->update_transient_bytes;
}

static ps_status entry_tensors_alloc(cache_item *ci, int n_entries, int n_tensors,
                                     ps_error *err)
{
    ci->tensors = calloc((size_t)n_entries, sizeof *ci->tensors);
    ci->tensor_bytes = calloc(2 * (size_t)n_entries * n_tensors + 1, sizeof *ci->tensor_bytes);
    if (ci->tensors == NULL || ci->tensor_bytes == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    for (int e = 0; e < n_entries; e++)
        ci->tensors[e] = (ps_entry_tensors){n_tensors, ci->tensor_bytes + 2 * (size_t)e * n_tensors};
    return PS_OK;
}

static void entry_tensors_fill(ps_entry_tensors *et, const ps_graph *slice,
                               const ps_intra_result *r, const ps_logical_mesh *m)
{
    for (int t = 0; t < et->n; t++) {
        et->bytes[t] = ps_spec_tile_bytes(&r->tensor_spec[t], &slice->tensors[t].desc, m->shape);
        et->bytes[et->n + t] = r->activation_tensor_bytes[t];
    }
}

/* The table entries of a slice on one submesh and logical mesh: `n` variants
 * of the configuration (itself and its lean variant) sharing one solve of
 * the fastest layout. An entry that fits nowhere is left absent. ts[v],
 * where not NULL, gets what entry v's layouts make of each tensor. */
static ps_status cost_entries(const ps_graph *slice, const ps_cluster *c, const submesh *s,
                              const config *const *cfs, int n, const ps_plan_request *req,
                              double limit_s, double budget, entry *const *es,
                              ps_entry_tensors *const *ts)
{
    ps_logical_mesh *m = NULL;
    ps_intra_result *fastest = NULL;
    ps_error inner = {0};
    for (int v = 0; v < n; v++)
        memset(es[v], 0, sizeof *es[v]);
    ps_status st = ps_mesh_create(c, 0, s->hosts, s->devices, cfs[0]->d0, cfs[0]->d1, &m, &inner);
    if (st != PS_OK)
        return PS_OK; /* not a valid view: absent */
    solve_limit lim = {limit_s, 0};
    st = solve_fastest(slice, m, cfs[0], req, lim, &fastest, &inner);
    slice_solver ls = {slice, m, NULL}; /* the plain and lean entries' budgeted solves */
    budget_memo memo = {.cap = NAN};
    for (int v = 0; v < n && st == PS_OK; v++) {
        ps_intra_result *r = NULL;
        es[v]->need_bytes = fastest->peak_memory_bytes;
        memo.reused = false;
        st = solve_within(&ls, cfs[v], req, lim, budget, NAN, fastest, NULL, &memo, &r, &inner);
        if (st == PS_OK && memo.reused) {
            *es[v] = *es[0];
            if (ts[v] != NULL)
                memcpy(ts[v]->bytes, ts[0]->bytes, 2 * (size_t)ts[v]->n * sizeof *ts[v]->bytes);
        } else if (st == PS_OK) {
            entry_fill(es[v], r != NULL ? r : fastest);
            if (ts[v] != NULL)
                entry_tensors_fill(ts[v], slice, r != NULL ? r : fastest, m);
        } else if (st == PS_ERR_INFEASIBLE)
            st = PS_OK; /* absent */
        ps_intra_result_free(r);
    }
    if (st == PS_ERR_INFEASIBLE)
        st = PS_OK; /* absent */
    ps_intra_result_free(fastest);
    ps_intra_session_free(ls.session);
    ps_mesh_free(m);
    return st;
}

/* How many later stages a stage tolerates: 1F1B keeps one micro-batch of
 * activations per later stage plus its own; GPipe keeps all of them. */
static int max_succ(const entry *e, double memory, int n_layers, int B, bool gpipe)
{
    if (!e->ok || e->static_bytes + e->update_bytes > memory)
        return -1;
    double room = memory - e->static_bytes - e->transient_bytes;
    if (gpipe)
        return room >= B * e->act_bytes ? n_layers : -1;
    if (room < e->act_bytes)
        return -1;
    if (e->act_bytes <= 0)
        return n_layers;
    double k = floor(room / e->act_bytes) - 1;
    return k > n_layers ? n_layers : (int)k;
}

/* Physical places for the stages' submeshes: in pipeline order on
 * consecutive devices from device 0 when no stage within a node would
 * straddle two and every stage of whole nodes starts on a node (neighbours
 * then share a node wherever they can: the stage DP's in-order placement);
 * else whole-host ones on consecutive nodes first, then sub-host ones packed
 * into the remaining nodes, larger first (power-of-two sizes always pack). */
static bool place(const ps_cluster *c, const submesh *stage_sub, int n, int *first)
{
    int N = c->nodes, M = c->devices_per_node;
    int used[N > 0 ? N : 1];
    memset(used, 0, sizeof used);
    int order[64];
    if (n > 64)
        return false;
    bool in_order = true;
    for (int k = 0, offset = 0; k < n && in_order; k++) {
        const submesh *s = &stage_sub[k];
        int size = s->hosts * s->devices;
        in_order = offset + size <= N * M && ps_stage_fits_at(size, offset, M);
        first[k] = offset;
        offset += size;
    }
    if (in_order)
        return true;
    for (int k = 0; k < n; k++)
        order[k] = k;
    for (int a = 0; a < n; a++) /* hosts desc, then devices desc */
        for (int b = a + 1; b < n; b++) {
            const submesh *x = &stage_sub[order[a]], *y = &stage_sub[order[b]];
            if (y->hosts > x->hosts || (y->hosts == x->hosts && y->devices > x->devices)) {
                int t = order[a];
                order[a] = order[b];
                order[b] = t;
            }
        }
    int next_node = 0;
    for (int a = 0; a < n; a++) {
        int k = order[a];
        const submesh *s = &stage_sub[k];
        if (s->hosts > 1 || s->devices == M) {
            if (next_node + s->hosts > N)
                return false;
            first[k] = next_node * M;
            for (int h = 0; h < s->hosts; h++)
                used[next_node + h] = M;
            next_node += s->hosts;
            continue;
        }
        int node = -1;
        for (int q = next_node; q < N && node < 0; q++)
            if (M - used[q] >= s->devices)
                node = q;
        if (node < 0)
            return false;
        first[k] = node * M + used[node];
        used[node] += s->devices;
    }
    return true;
}

/* ---- solving the table's entries on all cores ----------------------------------- */

/* One work item: a slice on a submesh with one configuration and its lean
 * variant (entries `out[0]` and `out[1]`). */
typedef struct work_item {
    const ps_graph *slice;
    int slice_id;           /* its index among the distinct slices */
    int sub, cfg, lean_cfg; /* lean_cfg < 0: none */
    double budget;          /* bytes per device an entry may use */
    entry *out[2];
    ps_entry_tensors *tensors[2]; /* NULL: not needed */
} work_item;

typedef struct table_work {
    const work_item *items;
    const ps_cluster *cluster;
    const submesh *subs;
    config (*cfgs)[MAX_TABLE_CONFIGS];
    const ps_plan_request *req;
    double limit_s;
    ps_status *status; /* [item] */
} table_work;

static bool table_item(void *ctx, int k)
{
    const table_work *w = ctx;
    const work_item *it = &w->items[k];
    const config *cfs[2] = {&w->cfgs[it->sub][it->cfg],
                            it->lean_cfg >= 0 ? &w->cfgs[it->sub][it->lean_cfg] : NULL};
    double t0 = ps_monotonic_s();
    w->status[k] = cost_entries(it->slice, w->cluster, &w->subs[it->sub], cfs,
                                it->lean_cfg >= 0 ? 2 : 1, w->req, w->limit_s, it->budget,
                                it->out, it->tensors);
    const submesh *s = &w->subs[it->sub];
    PS_LOG_DEBUG("pipeshard: table entry: slice %d on (%d, %d) as (%d, %d)%s: %.3f s, %s",
                 it->slice_id, s->hosts, s->devices, cfs[0]->d0, cfs[0]->d1,
                 cfs[0]->force ? " forced" : "", ps_monotonic_s() - t0,
                 it->out[0]->ok ? "fits" : "absent");
    return w->status[k] == PS_OK;
}

/* The layers the stage DP cuts (--rows): each one's forward ops and FLOPs,
 * and the activation bytes it receives from earlier layers per micro-batch
 * (what crosses into it when a stage starts there). */
static void print_layers(const ps_graph *f0, const ps_layering *lay, bool manual)
{
    double total = 0;
    for (int l = 0; l < lay->n_layers; l++)
        total += lay->flops[l];
    if (manual)
        printf("layers: %d from the model's pipeline boundaries\n", lay->n_layers);
    else
        printf("layers: %d clustered (FLOPs within (1 + %g) x the average)\n", lay->n_layers,
               lay->eps_used);
    for (int l = 0; l < lay->n_layers; l++) {
        int ops = 0;
        for (int i = 0; i < f0->n_ops; i++)
            ops += lay->op_layer[i] == l;
        printf("layer[%d] = (forward ops %d, forward %.4g GFLOP (%.1f%%), receives %.4g MB "
               "from earlier layers)\n",
               l, ops, lay->flops[l] / 1e9, total > 0 ? 100 * lay->flops[l] / total : 0,
               lay->boundary_bytes[l] / 1e6);
    }
}

/* Layers (manual boundaries or clustering), the relayered forward graph and
 * its training step. */
static ps_status prepare(const ps_plan_request *req, int layer_num, bool manual_layers,
                         ps_layering *lay, ps_graph **fwd, ps_graph **step, bool *manual_out,
                         ps_error *err)
{
    const ps_graph *f0 = req->forward;
    bool manual = manual_layers || (layer_num == 0 && f0->n_boundaries > 0);
    ps_status st;
    if (manual) {
        st = ps_layer_cluster_manual(f0, lay, err);
    } else {
        int L = layer_num > 0 ? layer_num : (f0->n_layers < 16 ? f0->n_layers : 16);
        st = ps_layer_cluster_auto(f0, L, 0.5, lay, err);
    }
    if (st == PS_OK)
        st = ps_graph_relayer(f0, lay, fwd, err);
    if (st == PS_OK)
        st = ps_train_step_build(*fwd, &req->train, step, err);
    *manual_out = manual;
    if (st == PS_OK)
        PS_LOG_INFO("pipeshard: %d layers (%s)", lay->n_layers,
                    manual ? "manual boundaries" : "clustered");
    return st;
}

/* Reads of a later layer's output by an earlier layer's op: no stage may
 * end between the two layers, since a stage runs its forward pass whole
 * (one kernel per micro-batch, its inputs received first) and the stages
 * would wait for each other. Manual layer tags allow them; clustered
 * layers, which follow the graph's order, have none. Iterates over them:
 * start with *op = 0, *input = -1; each call moves to the next such read
 * (the op and its input slot) and returns false when there is none. */
static bool next_later_read(const ps_graph *fwd, int *op, int *input)
{
    for (; *op < fwd->n_ops; (*op)++, *input = -1) {
        const ps_op *o = &fwd->ops[*op];
        for ((*input)++; *input < o->n_in; (*input)++) {
            int p = fwd->tensors[o->in[*input]].producer;
            if (p >= 0 && fwd->ops[p].layer > o->layer)
                return true;
        }
    }
    return false;
}

/* The layers after which no stage may end (ps_stage_table.no_cut_after);
 * NULL when every cut is allowed. */
static ps_status no_cuts(const ps_graph *fwd, int L, unsigned char **out, ps_error *err)
{
    *out = NULL;
    for (int op = 0, in = -1; next_later_read(fwd, &op, &in);) {
        if (*out == NULL && (*out = calloc((size_t)L, 1)) == NULL)
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        const ps_op *o = &fwd->ops[op];
        for (int b = o->layer; b < fwd->ops[fwd->tensors[o->in[in]].producer].layer && b < L; b++)
            (*out)[b] = 1;
    }
    return PS_OK;
}

typedef struct stage_spec {
    int first, last;
    submesh sub;
    config cfg;
    double twin_iterations; /* > 0, a lean cfg: also try its plain twin within the memory,
                             * each solve stopped after this many GLPK simplex
                             * iterations (stage_item) */
} stage_spec;

/* The plan's iteration time: its stages in the lowering's schedule, with
 * the transfers between them (planner/pipeline_time.h), and each stage's
 * send times. alpa_s: Alpa's sum + (B - 1) max, the fallback. */
static ps_status pipeline_iteration(ps_plan *plan, const ps_graph *step, double alpa_s,
                                    ps_error *err)
{
    ps_stage_link *links = NULL;
    int n_links = 0;
    double it = NAN;
    PS_TRY_RET(ps_plan_pipeline_schedule(plan, step, NULL, NULL, &links, &n_links, &it, err));
    for (int k = 0; k < plan->n_stages; k++)
        plan->stages[k].send_forward_s = plan->stages[k].send_backward_s = 0;
    for (int l = 0; l < n_links; l++) {
        ps_plan_stage *s = &plan->stages[links[l].from];
        if (links[l].kind == PS_LINK_FORWARD)
            s->send_forward_s += links[l].reduce_s + links[l].seconds;
        else if (links[l].kind == PS_LINK_BACKWARD)
            s->send_backward_s += links[l].reduce_s + links[l].seconds;
    }
    free(links);
    if (isnan(it)) {
        PS_LOG_WARN("the stages' transfers wait for each other: Alpa's pipeline formula "
                    "predicts the iteration");
        it = alpa_s;
    }
    plan->iteration_s = it;
    return PS_OK;
}

/* The micro-batches of activations stage k of n keeps in flight. */
static int stage_in_flight(bool gpipe, int B, int n, int k)
{
    return gpipe ? B : (n - k < B ? n - k : B);
}

/* The chosen stages' layouts, solved on all cores: first the fastest layout
 * of each distinct stage (identical layers on meshes of equal costs, the
 * middle stages of a transformer, share one), then each stage's within its
 * memory. */
/* See stage_item: a lean stage's plain twin is solved when the lean layout
 * is this much slower than the fastest. */
#define TWIN_GAIN_MIN 1.05

/* A stage's layout in configuration cf that keeps `in_flight` micro-batches
 * of activations: while it does not fit them, solved again with less room,
 * `attempts` times at most. *out and `lean` as solve_within's. */
static ps_status fit_stage(slice_solver *ls, const config *cf,
                           const ps_plan_request *req, solve_limit lim, int attempts,
                           int in_flight, const ps_intra_result *fastest,
                           const ps_intra_result *const *lean, ps_intra_result **out,
                           ps_error *err)
{
    const ps_logical_mesh *m = ls->m;
    ps_intra_result *r = NULL;
    double cap = NAN; /* the first solve leaves room for the fastest layout's temporaries */
    ps_status st = PS_OK;
    for (int attempt = 0; st == PS_OK && attempt < attempts; attempt++) {
        ps_intra_result *next = NULL;
        st = solve_within(ls, cf, req, lim, m->memory_bytes, cap, fastest, lean, NULL, &next,
                          err);
        if (st == PS_ERR_INFEASIBLE && attempt > 0) {
            /* nothing is that lean: the last answer stands (a stage that
             * does not fit is written with a warning, and the plan's
             * memory check plans again with less room) */
            ps_error_clear(err);
            st = PS_OK;
            break;
        }
        if (st != PS_OK)
            break;
        ps_intra_result_free(r);
        r = next;
        const ps_intra_result *got = r != NULL ? r : fastest;
        double need = ps_intra_peak_bytes(got, in_flight);
        if (need <= m->memory_bytes)
            break;
        /* the next answer's lasting bytes are this one's less the excess:
         * it fits if its temporaries and activations are this one's. A
         * smaller budget alone may not bind: a layout with more
         * temporaries than the fastest's (GPT-39B's layers on 2 x 4) kept
         * its lasting bytes well under the cap and was chosen again */
        double lasting = got->weight_bytes + got->gradient_bytes + got->optimizer_bytes +
                         got->activation_bytes;
        cap = lasting - (need - m->memory_bytes);
        if (cap <= 0)
            break;
    }
    if (st != PS_OK) {
        ps_intra_result_free(r);
        r = NULL;
    }
    *out = r;
    return st;
}

/* One candidate pipeline being realized: the step built knowing its stages,
 * each stage's slice and mesh, and their layouts once solved. Several are
 * solved together (realizations_solve), so that all cores work on the
 * stages of every candidate at once. */
typedef struct realization {
    const ps_plan_request *req;
    int L;
    bool manual, gpipe, remat_by_stage;
    const char *method;
    const ps_graph *step;      /* the step the stages slice: `staged` or the caller's */
    ps_graph *staged;          /* owned; NULL: the caller's step */
    int *layer_stage;          /* owned; [layer] its stage, or NULL */
    bool *remat_layers;        /* owned; [layer] recomputed, or NULL */
    ps_train_options train;    /* as the plan records it */
    int n;                     /* stages */
    stage_spec *stages;        /* [stage] owned */
    int *first;                /* [stage] its first device */
    ps_graph **slices;         /* [stage] */
    ps_logical_mesh **meshes;  /* [stage] */
    int *leader;               /* [stage] the stage whose fastest layout it shares */
    ps_intra_result **fastest; /* [stage] owned by leaders, NULL elsewhere */
    bool *fastest_borrowed;    /* [stage] fastest[stage] is another realization's */
    ps_intra_result **results; /* [stage] NULL: the leader's fastest layout */
    bool *borrowed;            /* [stage] results[stage] is another realization's */
    uint64_t *hashes;          /* [stage] graph_hash of its slice */
    ps_status *status;         /* [stage] */
    ps_error *errors;          /* [stage] */
    bool fastest_failed;       /* some leader's fastest layout failed: no layouts within */
} realization;

static void realization_free(realization *r)
{
    for (int k = 0; k < r->n; k++) {
        if (r->results != NULL && !r->borrowed[k])
            ps_intra_result_free(r->results[k]);
        if (r->fastest != NULL && !r->fastest_borrowed[k])
            ps_intra_result_free(r->fastest[k]);
        if (r->meshes != NULL)
            ps_mesh_free(r->meshes[k]);
        if (r->slices != NULL)
            ps_graph_free(r->slices[k]);
    }
    free(r->results);
    free(r->borrowed);
    free(r->hashes);
    free(r->fastest);
    free(r->fastest_borrowed);
    free(r->leader);
    free(r->meshes);
    free(r->slices);
    free(r->status);
    free(r->errors);
    free(r->first);
    free(r->stages);
    ps_graph_free(r->staged);
    free(r->layer_stage);
    free(r->remat_layers);
    memset(r, 0, sizeof *r);
}

/* Whether stage ka of a and stage kb of b have the same fastest layout
 * (solve_fastest's inputs): the same slice on meshes of equal costs, with
 * the same batch forcing. */
static bool same_fastest(const realization *a, int ka, const realization *b, int kb)
{
    return a->hashes[ka] == b->hashes[kb] && a->req == b->req &&
           a->stages[ka].cfg.force == b->stages[kb].cfg.force &&
           ps_mesh_costs_equal(a->meshes[ka], b->meshes[kb]);
}

/* Stage k's fastest layout (k a leader: the stages that share it read it). */
static void stage_fastest(realization *r, int k)
{
    r->status[k] = solve_fastest(r->slices[k], r->meshes[k], &r->stages[k].cfg, r->req,
                                 (solve_limit){0, 0}, &r->fastest[k], &r->errors[k]);
}

/* The layout stage k uses: its own result or its leader's fastest. */
static const ps_intra_result *stage_result(const realization *r, int k)
{
    return r->results[k] != NULL ? r->results[k] : r->fastest[r->leader[k]];
}

/* Stage k's layout: the stage keeps `in_flight` micro-batches of
 * activations, so while the layout does not fit them, solve again with
 * less room. lean_known: a lean configuration's solve_lean answer, where
 * already known (solve_within's `lean`); else with lean_once it is solved
 * here once for all the refits, without at each. */
static void stage_within(realization *rz, int k, const ps_intra_result *const *lean_known,
                         bool lean_once)
{
    const stage_spec *ch = &rz->stages[k];
    const ps_logical_mesh *m = rz->meshes[k];
    const ps_intra_result *fastest = rz->fastest[rz->leader[k]];
    ps_intra_result *r = NULL;
    int in_flight = stage_in_flight(rz->gpipe, rz->req->micro_batches, rz->n, k);
    /* the stage's solves within a budget share a session (its plain twin's too) */
    slice_solver ls = {rz->slices[k], m, NULL};
    ps_intra_result *own_lean = NULL;
    ps_status st = PS_OK;
    if (lean_known == NULL && lean_once && ch->cfg.lean) {
        /* every refit starts from it: solved once */
        st = solve_lean(&ls, &ch->cfg, rz->req, (solve_limit){0, 0}, fastest, &own_lean,
                        &rz->errors[k]);
        lean_known = (const ps_intra_result *const *)&own_lean;
    }
    if (st == PS_OK)
        st = fit_stage(&ls, &ch->cfg, rz->req, (solve_limit){0, 0}, 6, in_flight, fastest,
                       lean_known, &r, &rz->errors[k]);
    ps_intra_result_free(own_lean);
    if (st == PS_OK && ch->cfg.lean && ch->twin_iterations > 0) {
        /* The lean layout stands for "some layout fits": the fastest layout
         * within the memory, where each layer is lean or fast as the room
         * allows, takes its time or less. Its budgeted solves can be slow:
         * tried only where the lean layout is TWIN_GAIN_MIN times slower
         * than the fastest or more (it gains at most that), briefly (two
         * solves, the second with less room for the micro-batches in
         * flight), and kept only when it fits and is faster. */
        config plain = ch->cfg;
        plain.lean = false;
        ps_intra_result *within = NULL;
        ps_error ignored = {0};
        const ps_intra_result *lean = r != NULL ? r : fastest;
        if (lean->objective_s > TWIN_GAIN_MIN * fastest->objective_s &&
            fit_stage(&ls, &plain, rz->req, (solve_limit){0, ch->twin_iterations}, 2, in_flight,
                      fastest, NULL, &within, &ignored) == PS_OK) {
            const ps_intra_result *w = within != NULL ? within : fastest;
            if (w->objective_s < lean->objective_s &&
                ps_intra_peak_bytes(w, in_flight) <= m->memory_bytes) {
                ps_intra_result_free(r);
                r = within; /* NULL: the fastest layout itself */
                within = NULL;
            }
        }
        ps_intra_result_free(within);
    }
    ps_intra_session_free(ls.session);
    rz->results[k] = r;
    rz->status[k] = st;
}

/* Prepares the realization of `stages` (copied): places them, builds the
 * step knowing them and slices it. fwd: the layered forward graph. With
 * several stages the step is built again knowing them (ps_train_options.
 * layer_stage: a parameter shared by stages sums its gradient at the update),
 * the step the plan's model and its lowering will have, so that the plan's
 * ops and phase times are its; and so it is when remat_by_stage, with the
 * layers of the stages whose configuration recomputes recomputed (the plan's
 * training.remat_layers). PS_ERR_INFEASIBLE: the submeshes do not pack. */
static ps_status realization_prepare(const ps_plan_request *req, const ps_graph *fwd,
                                     const ps_graph *step, int L, bool manual, bool gpipe,
                                     bool remat_by_stage, const char *method,
                                     const stage_spec *stages, int n, realization *r,
                                     ps_error *err)
{
    ps_status st = PS_OK;
    *r = (realization){.req = req, .L = L, .manual = manual, .gpipe = gpipe,
                       .remat_by_stage = remat_by_stage, .method = method, .step = step,
                       .train = req->train};
    if (n > 64)
        return ps_error_set(err, PS_ERR_INFEASIBLE, "more than 64 stages");
    r->stages = malloc((size_t)(n > 0 ? n : 1) * sizeof *r->stages);
    r->first = calloc((size_t)(n > 0 ? n : 1), sizeof *r->first);
    PS_TRY_ALLOC(r->stages, err);
    PS_TRY_ALLOC(r->first, err);
    memcpy(r->stages, stages, (size_t)n * sizeof *stages);
    if (remat_by_stage) {
        r->train.remat = false; /* the stages' own choice (else the plain step) */
        int loss_layer = fwd->ops[fwd->tensors[fwd->loss].producer].layer, recomputed = 0;
        r->remat_layers = calloc((size_t)L + 1, sizeof *r->remat_layers);
        PS_TRY_ALLOC(r->remat_layers, err);
        for (int k = 0; k < n; k++)
            for (int l = stages[k].first; l <= stages[k].last && l < L; l++)
                if (stages[k].cfg.remat && l != loss_layer) {
                    r->remat_layers[l] = true;
                    recomputed++;
                }
        if (recomputed > 0)
            r->train.remat_layers = r->remat_layers; /* else the plain step */
    }
    const ps_cluster *c = req->cluster;
    submesh stage_sub[64] = {{0}};
    for (int k = 0; k < n; k++)
        stage_sub[k] = stages[k].sub;
    if (!place(c, stage_sub, n, r->first)) {
        st = ps_error_set(err, PS_ERR_INFEASIBLE, "the stages' submeshes do not pack into %s",
                          c->name);
        goto out;
    }
    if (n > 1 || remat_by_stage) {
        if (n > 1) {
            r->layer_stage = malloc((size_t)(L > 0 ? L : 1) * sizeof *r->layer_stage);
            PS_TRY_ALLOC(r->layer_stage, err);
            for (int l = 0; l < L; l++)
                r->layer_stage[l] = -1;
            for (int k = 0; k < n; k++)
                for (int l = stages[k].first; l <= stages[k].last && l < L; l++)
                    r->layer_stage[l] = k;
        }
        ps_train_options t = r->train;
        t.layer_stage = r->layer_stage;
        PS_TRY(ps_train_step_build(fwd, &t, &r->staged, err));
        r->step = r->staged;
    }
    r->slices = calloc((size_t)(n > 0 ? n : 1), sizeof *r->slices);
    r->meshes = calloc((size_t)(n > 0 ? n : 1), sizeof *r->meshes);
    r->results = calloc((size_t)(n > 0 ? n : 1), sizeof *r->results);
    r->fastest = calloc((size_t)(n > 0 ? n : 1), sizeof *r->fastest);
    r->fastest_borrowed = calloc((size_t)(n > 0 ? n : 1), sizeof *r->fastest_borrowed);
    r->leader = calloc((size_t)(n > 0 ? n : 1), sizeof *r->leader);
    r->borrowed = calloc((size_t)(n > 0 ? n : 1), sizeof *r->borrowed);
    r->hashes = calloc((size_t)(n > 0 ? n : 1), sizeof *r->hashes);
    r->status = calloc((size_t)(n > 0 ? n : 1), sizeof *r->status);
    r->errors = calloc((size_t)(n > 0 ? n : 1), sizeof *r->errors);
    if (r->slices == NULL || r->meshes == NULL || r->results == NULL || r->fastest == NULL ||
        r->fastest_borrowed == NULL || r->leader == NULL || r->borrowed == NULL || r->hashes == NULL || r->status == NULL ||
        r->errors == NULL) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    r->n = n; /* from here realization_free frees the stages' parts */
    for (int k = 0; k < n && st == PS_OK; k++) {
        const stage_spec *ch = &stages[k];
        st = ps_graph_slice(r->step, ch->first, ch->last, &r->slices[k], err);
        if (st == PS_OK)
            st = ps_mesh_create(c, r->first[k], ch->sub.hosts, ch->sub.devices, ch->cfg.d0,
                                ch->cfg.d1, &r->meshes[k], err);
    }
    if (st != PS_OK)
        goto out;
    for (int k = 0; k < n; k++) {
        r->hashes[k] = graph_hash(r->slices[k]);
        r->leader[k] = k;
        for (int j = 0; j < k && r->leader[k] == k; j++)
            if (r->leader[j] == j && same_fastest(r, j, r, k))
                r->leader[k] = j;
    }
out:
    if (st != PS_OK)
        realization_free(r);
    return st;
}

/* The stages of several realizations as one list of work items: item i is
 * stage stage[i] of realization job[i], realization by realization; each
 * parallel loop takes its items from `order` (the largest slices first, so
 * that a long solve does not start last). */
typedef struct realization_items {
    realization *rs;
    int *job, *stage;       /* [item] */
    int *order;             /* [position] item */
    int *lean_of;           /* [item] the item whose lean layout it takes, or -1 */
    ps_intra_result **lean; /* [item] solve_lean's answer (owned), where lean_of is itself */
    ps_status *lean_status; /* [item] */
    ps_error *lean_errors;  /* [item] */
    bool share;             /* realizations_solve's: a stage's own lean layout solved once */
} realization_items;

static int item_ops(const realization_items *it, int i)
{
    return it->rs[it->job[i]].slices[it->stage[i]]->n_ops;
}

static bool fastest_item(void *ctx, int at)
{
    realization_items *it = ctx;
    int i = it->order[at], k = it->stage[i];
    realization *r = &it->rs[it->job[i]];
    double t0 = ps_monotonic_s();
    stage_fastest(r, k);
    PS_LOG_DEBUG("pipeshard: candidate %d, stage %d: fastest layout in %.3g s", it->job[i], k,
                 ps_monotonic_s() - t0);
    return true; /* the others go on: the first failure in order is reported */
}

static bool lean_item(void *ctx, int at)
{
    realization_items *it = ctx;
    int i = it->order[at], k = it->stage[i];
    realization *r = &it->rs[it->job[i]];
    slice_solver ls = {r->slices[k], r->meshes[k], NULL};
    double t0 = ps_monotonic_s();
    it->lean_status[i] = solve_lean(&ls, &r->stages[k].cfg, r->req, (solve_limit){0, 0},
                                    r->fastest[r->leader[k]], &it->lean[i], &it->lean_errors[i]);
    PS_LOG_DEBUG("pipeshard: candidate %d, stage %d: lean layout in %.3g s", it->job[i], k,
                 ps_monotonic_s() - t0);
    return true;
}

static bool within_item(void *ctx, int at)
{
    realization_items *it = ctx;
    int i = it->order[at], k = it->stage[i];
    realization *r = &it->rs[it->job[i]];
    if (r->fastest_failed)
        return true; /* its realization is refused (realization_plan) */
    int from = it->lean_of[i];
    if (from >= 0 && it->lean_status[from] != PS_OK) {
        r->status[k] = it->lean_status[from]; /* as its own solve would have failed */
        r->errors[k] = it->lean_errors[from];
        return true;
    }
    double t0 = ps_monotonic_s();
    stage_within(r, k, from >= 0 ? (const ps_intra_result *const *)&it->lean[from] : NULL,
                 it->share);
    PS_LOG_DEBUG("pipeshard: candidate %d, stage %d: layout within the memory in %.3g s",
                 it->job[i], k, ps_monotonic_s() - t0);
    return true;
}

static int realization_stages(const realization *rs, int n)
{
    int stages = 0;
    for (int j = 0; j < n; j++)
        stages += rs[j].n;
    return stages;
}

/* The first failure of the realization's stages, as err. */
static ps_status realization_failure(const realization *r, ps_error *err)
{
    for (int k = 0; k < r->n; k++)
        if (r->status[k] != PS_OK) {
            const stage_spec *f = &r->stages[k];
            return ps_error_set(err, r->status[k],
                                "%s plan of %s, stage %d (layers %d-%d on %dx%d devices, "
                                "logical mesh %dx%d): %s",
                                r->method, r->req->forward->name, k, f->first, f->last,
                                f->sub.hosts, f->sub.devices, f->cfg.d0, f->cfg.d1,
                                r->errors[k].msg);
        }
    return PS_OK;
}

/* Whether stage ka of a and stage kb of b are solved within the memory
 * alike: the same slice on meshes of equal costs, in the same configuration,
 * keeping as many micro-batches in flight (stage_within's inputs). */
static bool same_within(const realization *a, int ka, const realization *b, int kb)
{
    const config *x = &a->stages[ka].cfg, *y = &b->stages[kb].cfg;
    return same_fastest(a, ka, b, kb) && x->d0 == y->d0 && x->d1 == y->d1 &&
           x->lean == y->lean && x->remat == y->remat &&
           a->stages[ka].twin_iterations == b->stages[kb].twin_iterations &&
           stage_in_flight(a->gpipe, a->req->micro_batches, a->n, ka) ==
               stage_in_flight(b->gpipe, b->req->micro_batches, b->n, kb);
}

/* Into `into`, the items of order[0..n) that keep[] marks, in order; their
 * count. */
static int items_kept(const int *order, int n, const int *keep, int *into)
{
    int kept = 0;
    for (int at = 0; at < n; at++)
        if (keep[order[at]])
            into[kept++] = order[at];
    return kept;
}

/* Every stage of the n_rs realizations solved on all cores: first the
 * fastest layout of each distinct stage (identical layers on meshes of
 * equal costs, the middle stages of a transformer, share one; with
 * `share`, across the realizations too: the candidates' first and last
 * stages are often the same slices), then the lean layout of each lean
 * configuration of a distinct fastest layout (it depends on nothing else,
 * and each refit with less room starts from it), then each stage's layout
 * within its memory, with `share` once for the stages of all realizations
 * that solve alike (same_within: the middle stages of candidates of
 * different stage counts often do), the first of them solving it. Each
 * solve stops at counts of GLPK work, not seconds (unless the user's
 * --time-limit), so solving them side by side gives the layouts solving
 * them one by one would. A stage's failure is its realization's
 * (realization_plan reports it). Without `share`, each realization solves
 * its own and each refit its lean layout, as before these were shared (the
 * tests compare the two). The solves are counted into `counts`. */
static ps_status realizations_solve(realization *rs, int n_rs, bool share,
                                    ps_inter_solve_counts *counts, ps_error *err)
{
    ps_status st = PS_OK;
    ps_inter_solve_counts ignored = {0};
    if (counts == NULL)
        counts = &ignored;
    int n = realization_stages(rs, n_rs);
    size_t cells = (size_t)(n > 0 ? n : 1);
    /* src[i]: the item whose fastest layout item i reads; like[i]: the first
     * item solving alike within the memory (itself when none before) */
    int *src = malloc(cells * sizeof *src), *like = malloc(cells * sizeof *like);
    int *pending = malloc(cells * sizeof *pending), *keep = calloc(cells, sizeof *keep);
    int *first_item = malloc(((size_t)n_rs + 1) * sizeof *first_item);
    realization_items it = {rs,
                            malloc(cells * sizeof(int)),
                            malloc(cells * sizeof(int)),
                            malloc(cells * sizeof(int)),
                            malloc(cells * sizeof(int)),
                            calloc(cells, sizeof(ps_intra_result *)),
                            calloc(cells, sizeof(ps_status)),
                            calloc(cells, sizeof(ps_error)),
                            share};
    int *order = it.order;
    PS_TRY_ALLOC(src, err);
    PS_TRY_ALLOC(like, err);
    PS_TRY_ALLOC(pending, err);
    PS_TRY_ALLOC(keep, err);
    PS_TRY_ALLOC(first_item, err);
    PS_TRY_ALLOC(it.job, err);
    PS_TRY_ALLOC(it.stage, err);
    PS_TRY_ALLOC(it.order, err);
    PS_TRY_ALLOC(it.lean_of, err);
    PS_TRY_ALLOC(it.lean, err);
    PS_TRY_ALLOC(it.lean_status, err);
    PS_TRY_ALLOC(it.lean_errors, err);
    for (int j = 0, i = 0; j < n_rs; j++) {
        first_item[j] = i;
        for (int k = 0; k < rs[j].n; k++, i++) {
            it.job[i] = j;
            it.stage[i] = k;
        }
    }
    /* the largest slices first, in order among equals */
    for (int i = 0; i < n; i++) {
        int at = i;
        for (; at > 0 && item_ops(&it, order[at - 1]) < item_ops(&it, i); at--)
            order[at] = order[at - 1];
        order[at] = i;
    }
    /* the fastest layouts: of each realization's leaders, those of an
     * earlier realization's alike borrowed */
    for (int i = 0; i < n; i++) {
        const realization *r = &rs[it.job[i]];
        int k = it.stage[i];
        src[i] = first_item[it.job[i]] + r->leader[k];
        for (int q = 0; share && src[i] == i && q < first_item[it.job[i]]; q++)
            if (src[q] == q && same_fastest(&rs[it.job[q]], it.stage[q], r, k))
                src[i] = q;
        keep[i] = src[i] == i;
    }
    it.order = pending; /* each loop's items, from order */
    int solving = items_kept(order, n, keep, pending);
    ps_parallel_for(solving, fastest_item, &it, ps_ilp_thread_done, NULL);
    counts->stages += n;
    counts->fastest_solved += solving;
    for (int i = 0; i < n; i++) {
        realization *r = &rs[it.job[i]];
        int k = it.stage[i], f = src[i];
        if (f == i || r->leader[k] != k)
            continue;
        const realization *from = &rs[it.job[f]];
        r->fastest[k] = from->fastest[it.stage[f]];
        r->fastest_borrowed[k] = true;
        r->status[k] = from->status[it.stage[f]];
        r->errors[k] = from->errors[it.stage[f]];
        counts->fastest_borrowed++;
        PS_LOG_DEBUG("pipeshard: candidate %d, stage %d: fastest layout as candidate %d, stage "
                     "%d's",
                     it.job[i], k, it.job[f], it.stage[f]);
    }
    for (int j = 0; j < n_rs; j++)
        for (int k = 0; k < rs[j].n; k++)
            rs[j].fastest_failed = rs[j].fastest_failed || rs[j].status[k] != PS_OK;
    /* the stages to solve within the memory: the first of each kind */
    for (int i = 0; i < n; i++) {
        const realization *r = &rs[it.job[i]];
        like[i] = i;
        for (int q = 0; share && q < i && like[i] == i && !r->fastest_failed; q++)
            if (like[q] == q && !rs[it.job[q]].fastest_failed &&
                same_within(&rs[it.job[q]], it.stage[q], r, it.stage[i]))
                like[i] = q;
    }
    /* their lean layouts: one for the lean stages reading one fastest
     * layout, solved before where several read it (lean_of); a stage alone
     * with its fastest layout solves its own once, in its turn below */
    int *readers = keep; /* [item] the stages reading the lean layout it leads */
    for (int i = 0; i < n; i++) {
        const realization *r = &rs[it.job[i]];
        int k = it.stage[i];
        it.lean_of[i] = -1;
        readers[i] = 0;
        if (!share || like[i] != i || r->fastest_failed || !r->stages[k].cfg.lean)
            continue;
        int f = src[first_item[it.job[i]] + r->leader[k]];
        it.lean_of[i] = i;
        for (int q = 0; q < i && it.lean_of[i] == i; q++)
            if (it.lean_of[q] == q &&
                src[first_item[it.job[q]] + rs[it.job[q]].leader[it.stage[q]]] == f)
                it.lean_of[i] = q;
        readers[it.lean_of[i]]++;
    }
    for (int i = 0; i < n; i++) {
        if (it.lean_of[i] < 0)
            continue;
        counts->lean_solved += it.lean_of[i] == i;
        counts->lean_reused += it.lean_of[i] != i;
        if (readers[it.lean_of[i]] == 1)
            it.lean_of[i] = -1; /* its own, in its turn */
    }
    for (int i = 0; i < n; i++)
        keep[i] = it.lean_of[i] == i;
    ps_parallel_for(items_kept(order, n, keep, pending), lean_item, &it, ps_ilp_thread_done,
                    NULL);
    /* the layouts within the memory */
    for (int i = 0; i < n; i++)
        keep[i] = like[i] == i;
    solving = items_kept(order, n, keep, pending);
    ps_parallel_for(solving, within_item, &it, ps_ilp_thread_done, NULL);
    counts->within_solved += solving;
    for (int i = 0; i < n; i++) {
        if (like[i] == i)
            continue;
        const realization *from = &rs[it.job[like[i]]];
        realization *to = &rs[it.job[i]];
        int kf = it.stage[like[i]], kt = it.stage[i];
        /* NULL: the fastest layout, which the two share in content */
        to->results[kt] = from->results[kf];
        to->borrowed[kt] = true;
        to->status[kt] = from->status[kf];
        to->errors[kt] = from->errors[kf];
        counts->within_borrowed++;
        PS_LOG_DEBUG("pipeshard: candidate %d, stage %d: layout within the memory as candidate "
                     "%d, stage %d's",
                     it.job[i], kt, it.job[like[i]], kf);
    }
out:
    for (int i = 0; it.lean != NULL && i < n; i++)
        ps_intra_result_free(it.lean[i]);
    free(src);
    free(like);
    free(pending);
    free(keep);
    free(first_item);
    free(it.job);
    free(it.stage);
    free(order);
    free(it.lean_of);
    free(it.lean);
    free(it.lean_status);
    free(it.lean_errors);
    return st;
}

/* The plan of a solved realization: its stages' layouts and predictions,
 * and the iteration time of their schedule. */
static ps_status realization_plan(const realization *rz, ps_plan **out, ps_error *err)
{
    ps_status st = PS_OK;
    const ps_plan_request *req = rz->req;
    const ps_graph *step = rz->step;
    int n = rz->n, L = rz->L;
    bool gpipe = rz->gpipe;
    ps_plan *plan = NULL;
    *out = NULL;
    const ps_cluster *c = req->cluster;
    int B = req->micro_batches;
    PS_TRY_RET(realization_failure(rz, err));
    if ((st = ps_plan_create(&plan)) != PS_OK)
        return ps_error_set(err, st, "out of memory");
    /* recomputed layers are the layered graph's, which the request's
     * record (the model's layers) does not know */
    ps_plan_request as_asked = *req;
    as_asked.train.remat_layers = NULL;
    PS_TRY(ps_plan_record_request(plan, &as_asked, err));
    if (rz->train.remat_layers != NULL || rz->remat_by_stage) {
        json_decref(plan->training);
        plan->training = NULL;
        if ((st = ps_train_options_to_json(&rz->train, L, &plan->training)) != PS_OK) {
            st = ps_error_set(err, st, "out of memory");
            goto out;
        }
    }
    if (ps_json_set(plan->model, "layer_num", json_integer(L)) != PS_OK ||
        ps_json_set(plan->model, "layers", json_string(rz->manual ? "manual" : "auto")) !=
            PS_OK) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    snprintf(plan->method, sizeof plan->method, "%s", rz->method);
    snprintf(plan->schedule, sizeof plan->schedule, "%s", gpipe ? "gpipe" : "1f1b");
    double sum = 0, slowest = 0, update = 0, flops = 0, peak_dev = 0;
    for (int k = 0; k < n && st == PS_OK; k++) {
        const ps_graph *slice = rz->slices[k];
        const ps_logical_mesh *m = rz->meshes[k];
        const ps_intra_result *r = stage_result(rz, k);
        const stage_spec *ch = &rz->stages[k];
        ps_plan_stage *ps = NULL;
        int in_flight = stage_in_flight(gpipe, B, n, k);
        if ((st = ps_plan_add_stage(plan, m->n_devices, slice->n_ops, slice->n_tensors, &ps)) !=
            PS_OK) {
            st = ps_error_set(err, st, "out of memory");
            break;
        }
        if ((st = ps_plan_fill_stage(ps, slice, m, r, err)) != PS_OK)
            break;
        ps->force_batch_axis0 = ch->cfg.force && m->shape[0] > 1; /* as applied */
        ps->first_layer = ch->first;
        ps->last_layer = ch->last;
        ps->peak_memory_bytes = ps_intra_peak_bytes(r, in_flight);
        sum += ps->time_s;
        slowest = fmax(slowest, ps->time_s);
        update = fmax(update, ps->update_s);
        peak_dev = fmax(peak_dev, ps->peak_memory_bytes);
        double slice_flops = 0;
        if ((st = ps_plan_step_flops(slice, B, &slice_flops)) != PS_OK) {
            /* (a plan without its FLOPs' sum would be refused when run) */
            st = ps_error_set(err, st, "out of memory");
            break;
        }
        flops += slice_flops;
        if (ps->peak_memory_bytes > m->memory_bytes)
            PS_LOG_WARN("stage %d needs %.4g GiB per device; its devices have %.4g GiB", k,
                        ps->peak_memory_bytes / PS_GIB, m->memory_bytes / PS_GIB);
    }
    if (st != PS_OK)
        goto out;
    PS_TRY(pipeline_iteration(plan, step, sum + (B - 1) * slowest + update, err));
    for (int k = 0; k < n; k++) {
        const ps_plan_stage *s = &plan->stages[k];
        PS_LOG_DEBUG("pipeshard: stage %d: layers %d-%d on (%d, %d) as (%d, %d): forward %.4g "
                     "ms, backward %.4g ms, update %.4g ms, sends %.4g ms forward, %.4g ms "
                     "backward",
                     k, s->first_layer, s->last_layer, s->submesh[0], s->submesh[1],
                     s->logical_mesh[0], s->logical_mesh[1], s->forward_s * 1e3,
                     s->backward_s * 1e3, s->update_s * 1e3, s->send_forward_s * 1e3,
                     s->send_backward_s * 1e3);
    }
    plan->flops_per_step = flops;
    /* per device running a stage, as the simulator's and executors'
     * summaries count it (a stage file may leave devices unused) */
    int used = 0;
    for (int k = 0; k < n; k++)
        used += plan->stages[k].n_devices;
    plan->tflops_per_device = flops / plan->iteration_s / used / 1e12;
    plan->mfu = ps_plan_mfu(plan->tflops_per_device, step, c);
    plan->peak_memory_bytes = peak_dev;
    PS_TRY(ps_plan_validate(plan, err));
    *out = plan;
    plan = NULL;
out:
    ps_plan_free(plan);
    return st;
}

static void solve_counts_add(ps_inter_solve_counts *to, const ps_inter_solve_counts *c)
{
    to->stages += c->stages;
    to->fastest_solved += c->fastest_solved;
    to->fastest_borrowed += c->fastest_borrowed;
    to->lean_solved += c->lean_solved;
    to->lean_reused += c->lean_reused;
    to->within_solved += c->within_solved;
    to->within_borrowed += c->within_borrowed;
}

/* Places the stages, solves each on its own devices and writes the plan
 * (realization_prepare says which step it slices; realizations_solve what
 * o's share_layouts and solve_counts do). */
static ps_status realize(const ps_plan_request *req, const ps_inter_options *o,
                         const ps_graph *fwd, const ps_graph *step, int L, bool manual,
                         bool gpipe, bool remat_by_stage, const char *method,
                         const stage_spec *stages, int n, ps_plan **out, ps_error *err)
{
    realization r;
    *out = NULL;
    ps_status st = realization_prepare(req, fwd, step, L, manual, gpipe, remat_by_stage, method,
                                       stages, n, &r, err);
    if (st != PS_OK)
        return st;
    st = realizations_solve(&r, 1, o->share_layouts, o->solve_counts, err);
    if (st == PS_OK)
        st = realization_plan(&r, out, err);
    realization_free(&r);
    return st;
}


/* PS_ERR_INFEASIBLE: no plan fits devices of `memory` bytes, why (`why`
 * and `more`), and what is left to try: not what the request already does. */
static ps_status refuse_unfit(const ps_plan_request *req, const ps_inter_options *o,
                              double memory, const char *why, const char *more, ps_error *err)
{
    const ps_cluster *c = req->cluster;
    int B = req->micro_batches;
    bool recomputes = req->train.remat || o->remat_by_stage;
    return ps_error_set(err, PS_ERR_INFEASIBLE,
                        "no plan fits in memory: %s on %s with %d micro-batches of %lld: %s%s "
                        "(devices have %.4g GiB); try %s%s or more devices",
                        req->forward->name, c->name, B, req->global_batch / B, why, more,
                        memory / PS_GIB, recomputes ? "" : "--remat, ",
                        o->gpipe ? "--schedule 1f1b (GPipe keeps every micro-batch's "
                                   "activations until its backward)"
                                 : "more micro-batches");
}

/* "No plan fits in memory", with the closest candidate: the least memory any
 * stage needs for the whole model (`whole`: its entries of each variant)
 * with one micro-batch in flight. */
static ps_status no_plan_fits(const ps_plan_request *req, const ps_inter_options *o,
                              const entry *const whole[2], const submesh *subs, int n_sub,
                              config (*cfgs)[MAX_TABLE_CONFIGS], const int *n_cfgs, int max_cfg,
                              double memory,
                              const unsigned char *no_cut, int L, const ps_error *inner,
                              ps_error *err)
{
    const ps_cluster *c = req->cluster;
    int D = ps_cluster_device_count(c);
    double need = INFINITY;
    int at = -1;
    for (int s = 0; whole[0] != NULL && s < n_sub; s++)
        for (int k = 0; k < n_cfgs[s]; k++) {
            const entry *e = &whole[cfgs[s][k].remat][s * max_cfg + k];
            double n = e->ok ? e->static_bytes + fmax(e->transient_bytes + e->act_bytes,
                                                      e->update_bytes)
                             : e->need_bytes;
            if (e->need_bytes > 0 && n < need) {
                need = n;
                at = s;
            }
        }
    char extra[320] = "";
    int used = 0;
    if (isfinite(need) && subs[at].hosts * subs[at].devices == D)
        used = snprintf(extra, sizeof extra,
                        "; on all %d devices the whole model needs %.4g GiB per device", D,
                        need / PS_GIB);
    else if (isfinite(need))
        used = snprintf(extra, sizeof extra,
                        "; the whole model needs at least %.4g GiB per device (on a %dx%d "
                        "submesh, the candidate where it needs least)",
                        need / PS_GIB, subs[at].hosts, subs[at].devices);
    if (o->stage_imbalance_tolerance < INFINITY && used < (int)sizeof extra)
        used += snprintf(extra + used, sizeof extra - (size_t)used,
                         "; only stages within the imbalance tolerance %g were candidates",
                         o->stage_imbalance_tolerance);
    /* the first run of layers that must share a stage, which may be why */
    for (int b = 0; no_cut != NULL && b < L - 1 && used < (int)sizeof extra; b++) {
        if (!no_cut[b])
            continue;
        int e = b;
        while (e < L - 1 && no_cut[e])
            e++;
        snprintf(extra + used, sizeof extra - (size_t)used,
                 "; layers %d-%d must share a stage (a layer among them reads what a later one "
                 "makes)",
                 b, e);
        break;
    }
    return refuse_unfit(req, o, memory, inner->msg, extra, err);
}

/* PS_ERR_INFEASIBLE when no pipeline can fit (ps_inter_options.
 * memory_floor_check): in 1F1B every stage keeps at least one micro-batch's
 * activations, in GPipe all of them; `recomputed` (or NULL) is the step
 * with every layer recomputed, which --remat=auto may take instead. */
static ps_status memory_floor(const ps_plan_request *req, const ps_inter_options *o,
                              const ps_graph *step, const ps_graph *recomputed, ps_error *err)
{
    const ps_cluster *c = req->cluster;
    int D = ps_cluster_device_count(c), B = req->micro_batches;
    double lasting = 0, act = 0, memory = ps_cluster_min_memory_bytes(c);
    PS_TRY_RET(ps_intra_step_bytes(step, &lasting, &act, err));
    if (recomputed != NULL) {
        /* its gradients are the plain step's; what it keeps, fewer */
        double unused = 0, act_recomputed = 0;
        PS_TRY_RET(ps_intra_step_bytes(recomputed, &unused, &act_recomputed, err));
        act = fmin(act, act_recomputed);
    }
    double floor_bytes = lasting + (o->gpipe ? B : 1) * act;
    if (floor_bytes <= D * memory)
        return PS_OK;
    char why[320];
    snprintf(why, sizeof why,
             "the whole model needs at least %.4g GiB per device on all %d devices (%.4g GiB of "
             "weights, optimizer state and gradients and %.4g GiB of activations kept for %s, "
             "were every tensor split over every device)",
             floor_bytes / D / PS_GIB, D, lasting / PS_GIB, (o->gpipe ? B : 1) * act / PS_GIB,
             o->gpipe ? "every micro-batch" : "one micro-batch");
    return refuse_unfit(req, o, memory, why, "", err);
}

static ps_status stage_plan_copy(const ps_stage_plan *a, ps_stage_plan *out)
{
    *out = *a;
    out->stages = malloc((size_t)a->n_stages * sizeof *a->stages);
    if (out->stages == NULL) {
        memset(out, 0, sizeof *out);
        return PS_ERR_NOMEM;
    }
    memcpy(out->stages, a->stages, (size_t)a->n_stages * sizeof *a->stages);
    return PS_OK;
}

static bool same_stages(const ps_stage_plan *a, const ps_stage_plan *b)
{
    if (a->n_stages != b->n_stages)
        return false;
    for (int k = 0; k < a->n_stages; k++)
        if (a->stages[k].first != b->stages[k].first || a->stages[k].last != b->stages[k].last ||
            a->stages[k].sub != b->stages[k].sub || a->stages[k].cfg != b->stages[k].cfg)
            return false;
    return true;
}

/* Whether p's stages are among the n pipelines already solved. */
static bool solved_before(const ps_stage_plan *p, const ps_stage_plan *solved, int n)
{
    for (int r = 0; r < n; r++)
        if (same_stages(p, &solved[r]))
            return true;
    return false;
}

/* What the log says of a candidate realized. */
typedef struct candidate_label {
    int n_stages;
    bool in_order;     /* the DP run with the stages placed in pipeline order */
    bool of_its_count; /* the DP's best of its stage count, not its answer */
    double dp_iteration_s;
} candidate_label;

ps_status ps_plan_pipeshard(const ps_plan_request *req, const ps_inter_options *o,
                            ps_plan **out, ps_error *err)
{
    ps_status st = PS_OK;
    const ps_cluster *c = req->cluster;
    ps_layering lay = {0};
    ps_graph *fwd = NULL, *step = NULL;
    ps_stage_table *table = NULL;
    ps_stage_plan sp[2] = {{0}, {0}}; /* the DP's answer each way (step 4) */
    ps_stage_plan sp_only = {0};      /* its answer on part of the table (remat_by_stage) */
    ps_stage_plan *by_count = NULL;   /* [L + 1]: the DP's best per stage count */
    int *order = NULL;                /* [L]: stage counts by the DP's objective */
    /* the candidates solved: each way, on the whole table and on its two parts */
    ps_stage_plan realized[2 * 3 * MAX_CANDIDATES] = {{0}};
    int n_realized = 0;
    /* their realizations, solved together after the DP (and the whole
     * model's, step 6) */
    realization jobs[2 * 3 * MAX_CANDIDATES + 1];
    candidate_label job_label[2 * 3 * MAX_CANDIDATES];
    int n_jobs = 0;
    ps_plan *cand[2 * 3 * MAX_CANDIDATES + 1]; /* [n_plans] their plans */
    double cand_dp[2 * 3 * MAX_CANDIDATES + 1]; /* [n_plans] the DP's objective of each */
    int n_plans = 0;
    /* The table is costed once per variant: its layers as they are, and
     * (remat_by_stage) recomputed; a configuration's variant is its remat. */
    int n_var = 1;
    ps_graph *table_step[2] = {NULL, NULL}; /* [variant] the step with each layer a stage */
    int *layer_self = NULL;           /* [layer] = layer */
    double *flops_prefix = NULL;      /* [L + 1] forward FLOPs of layers before each */
    cache_item *cache = NULL;
    entry **composed[2] = {NULL, NULL}; /* [variant][first * L + last] composed entries */
    entry **single = NULL;     /* [layer] its entries, for the composition */
    ps_entry_tensors **single_tensors = NULL; /* [layer] what those make of its tensors */
    ps_layer_crossings *crossings[2] = {NULL, NULL}; /* [variant] tensors passed between layers */
    /* [variant][first * L + last] solved entries (owned by cache) */
    entry **entries_of[2] = {NULL, NULL};
    /* [variant][first * L + last] their cache index, -1: composed */
    int *cache_of[2] = {NULL, NULL};
    bool *needed = NULL;       /* [cache index * n_sub + submesh] entries to solve */
    ps_graph **slices = NULL;  /* [cache index] the slice each cache item solves */
    work_item *items = NULL;
    ps_status *item_status = NULL; /* [item] */
    int n_cache = 0;
    submesh subs[MAX_SUBMESHES];
    config cfgs[MAX_SUBMESHES][MAX_TABLE_CONFIGS];
    int n_cfgs[MAX_SUBMESHES];
    *out = NULL;
    int D = ps_cluster_device_count(c), B = req->micro_batches;
    if (B < 1 || req->global_batch % B != 0)
        return ps_error_set(err, PS_ERR_INVALID,
                            "%d micro-batches do not divide the global batch %lld", B,
                            req->global_batch);

    /* 1. layers */
    const ps_graph *f0 = req->forward;
    bool manual = false;
    PS_TRY(prepare(req, o->layer_num, o->manual_layers, &lay, &fwd, &step, &manual, err));
    if (o->print_rows)
        print_layers(req->forward, &lay, manual);
    int L = lay.n_layers;
    flops_prefix = malloc(((size_t)L + 1) * sizeof *flops_prefix);
    PS_TRY_ALLOC(flops_prefix, err);
    by_count = calloc((size_t)L + 1, sizeof *by_count);
    order = malloc((size_t)L * sizeof *order);
    PS_TRY_ALLOC(by_count, err);
    PS_TRY_ALLOC(order, err);
    flops_prefix[0] = 0;
    for (int q = 0; q < L; q++)
        flops_prefix[q + 1] = flops_prefix[q] + lay.flops[q];
    /* The table's layers are costed as stages of their own: a parameter used
     * by several layers (a tied embedding) sums its contributions at the
     * update, once per step, as the plan's step will between stages
     * (realize), not once per micro-batch. */
    if (o->remat_by_stage && (req->train.remat || req->train.remat_layers != NULL)) {
        st = ps_error_set(err, PS_ERR_INVALID,
                          "recomputation chosen by stage (--remat=auto) and recomputation "
                          "asked for (--remat) exclude each other");
        goto out;
    }
    /* one layer holds the loss, which is never recomputed: nothing to choose */
    if (o->remat_by_stage && L > 1)
        n_var = 2;
    if (L > 1) {
        layer_self = malloc((size_t)L * sizeof *layer_self);
        PS_TRY_ALLOC(layer_self, err);
        for (int l = 0; l < L; l++)
            layer_self[l] = l;
        for (int v = 0; v < n_var; v++) {
            ps_train_options t = req->train;
            t.layer_stage = layer_self;
            if (v == 1)
                t.remat = true;
            PS_TRY(ps_train_step_build(fwd, &t, &table_step[v], err));
        }
    }

    if (o->memory_floor_check)
        PS_TRY(memory_floor(req, o, step, n_var == 2 ? table_step[1] : NULL, err));

    /* 2. candidate submeshes and logical meshes */
    int n_sub = list_submeshes(c, o, subs, err), max_cfg = 1;
    if (n_sub < 0) {
        st = PS_ERR_INVALID;
        goto out;
    }
    if (!submeshes_cover(subs, n_sub, D)) {
        st = ps_error_set(err, PS_ERR_INVALID,
                          "no combination of the candidate submeshes covers the %d devices of "
                          "%s exactly",
                          D, c->name);
        goto out;
    }
    for (int s = 0; s < n_sub; s++) {
        int n = list_configs(&subs[s], c->devices_per_node, req->global_batch / B, cfgs[s]);
        for (int k = 0; k < n && n_var == 2; k++) {
            cfgs[s][n + k] = cfgs[s][k];
            cfgs[s][n + k].remat = true;
        }
        n_cfgs[s] = n * n_var;
        if (n_cfgs[s] > max_cfg)
            max_cfg = n_cfgs[s];
    }
    if (ps_stage_table_create(L, n_sub, max_cfg, &table) != PS_OK) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int s = 0; s < n_sub; s++)
        table->sub_devices[s] = subs[s].hosts * subs[s].devices;
    PS_TRY(no_cuts(fwd, L, &table->no_cut_after, err));

    /* 3. the stage cost table; identical layer ranges share entries */
    double memory = ps_cluster_min_memory_bytes(c);
    cache = calloc((size_t)n_var * L * L + 1, sizeof *cache);
    PS_TRY_ALLOC(cache, err);
    for (int v = 0; v < n_var; v++) {
        composed[v] = calloc((size_t)L * L, sizeof *composed[v]);
        PS_TRY_ALLOC(composed[v], err);
        for (int l = 0; l < L && !o->exact_ranges; l++)
            for (int i = l + 1; i < L; i++) {
                composed[v][l * L + i] = calloc((size_t)n_sub * max_cfg, sizeof **composed[v]);
                PS_TRY_ALLOC(composed[v][l * L + i], err);
            }
    }
    /* Single layers (every range with exact_ranges) are solved: identical
     * slices once, all entries on all cores. Longer ranges are composed
     * (Alpa's "profile layers and compose"; planner/range_compose.h): times,
     * weights and state add up, memory as the range's own solve counts it. */
    slices = calloc((size_t)n_var * L * L + 1, sizeof *slices);
    PS_TRY_ALLOC(slices, err);
    for (int v = 0; v < n_var; v++) {
        entries_of[v] = calloc((size_t)L * L + 1, sizeof *entries_of[v]);
        cache_of[v] = malloc(((size_t)L * L + 1) * sizeof *cache_of[v]);
        PS_TRY_ALLOC(entries_of[v], err);
        PS_TRY_ALLOC(cache_of[v], err);
        for (int k = 0; k < L * L; k++)
            cache_of[v][k] = -1;
    }
    for (int v = 0; v < n_var; v++)
        for (int l = 0; l < L; l++)
            for (int i = l; i < L; i++) {
                if (!o->exact_ranges && i > l)
                    continue;
                ps_graph *slice = NULL;
                PS_TRY(ps_graph_slice(table_step[v] != NULL ? table_step[v] : step, l, i,
                                      &slice, err));
                uint64_t h = graph_hash(slice);
                int found = -1;
                for (int k = 0; k < n_cache && found < 0; k++)
                    if (cache[k].hash == h)
                        found = k;
                if (found >= 0) {
                    ps_graph_free(slice);
                } else {
                    found = n_cache;
                    cache[n_cache].hash = h;
                    /* each entry must fit the device by itself; composed ranges
                     * that do not are ruled out by their summed memory */
                    cache[n_cache].budget = memory;
                    slices[n_cache] = slice; /* owned by the cache from here */
                    n_cache++;
                    cache[found].entries = calloc((size_t)n_sub * max_cfg, sizeof(entry));
                    PS_TRY_ALLOC(cache[found].entries, err);
                    if (!o->exact_ranges && L > 1)
                        PS_TRY(entry_tensors_alloc(&cache[found], n_sub * max_cfg, slice->n_tensors,
                                                   err));
                }
                cache[found].variants |= 1u << v;
                entries_of[v][l * L + i] = cache[found].entries;
                cache_of[v][l * L + i] = found;
            }
    /* the (slice, submesh) pairs some candidate stage needs: its own range
     * solved, or every single layer it is composed of */
    needed = calloc((size_t)n_cache * n_sub + 1, sizeof *needed);
    PS_TRY_ALLOC(needed, err);
    for (int v = 0; v < n_var; v++)
        for (int l = 0; l < L; l++)
            for (int i = l; i < L; i++)
                for (int s = 0; s < n_sub; s++) {
                    if (!stage_balanced(flops_prefix, L, l, i, table->sub_devices[s], D,
                                        o->stage_imbalance_tolerance))
                        continue;
                    if (cache_of[v][l * L + i] >= 0)
                        needed[cache_of[v][l * L + i] * n_sub + s] = true;
                    else
                        for (int q = l; q <= i; q++)
                            needed[cache_of[v][q * L + q] * n_sub + s] = true;
                }
    items = calloc((size_t)n_cache * n_sub * max_cfg + 1, sizeof *items);
    PS_TRY_ALLOC(items, err);
    int n_items = 0, n_entries = 0;
    for (int k = 0; k < n_cache; k++)
        for (int s = 0; s < n_sub; s++)
            for (int c2 = 0; c2 < n_cfgs[s] && needed[k * n_sub + s]; c2++) {
                if (cfgs[s][c2].lean)
                    continue; /* solved with its plain configuration */
                if (!(cache[k].variants & (1u << cfgs[s][c2].remat)))
                    continue; /* the other variant's slice */
                int lean = -1;
                for (int c3 = 0; c3 < n_cfgs[s] && lean < 0; c3++)
                    if (cfgs[s][c3].lean && cfgs[s][c3].d0 == cfgs[s][c2].d0 &&
                        cfgs[s][c3].d1 == cfgs[s][c2].d1 &&
                        cfgs[s][c3].force == cfgs[s][c2].force &&
                        cfgs[s][c3].remat == cfgs[s][c2].remat)
                        lean = c3;
                entry *e = cache[k].entries + s * max_cfg;
                ps_entry_tensors *et =
                    cache[k].tensors != NULL ? cache[k].tensors + s * max_cfg : NULL;
                items[n_items++] = (work_item){
                    slices[k], k, s, c2, lean, cache[k].budget,
                    {&e[c2], lean >= 0 ? &e[lean] : NULL},
                    {et != NULL ? &et[c2] : NULL, et != NULL && lean >= 0 ? &et[lean] : NULL}};
                n_entries += 1 + (lean >= 0);
            }
    item_status = calloc((size_t)n_items + 1, sizeof *item_status);
    PS_TRY_ALLOC(item_status, err);
    double t_table = ps_monotonic_s();
    table_work w = {.items = items, .cluster = c, .subs = subs, .cfgs = cfgs, .req = req,
                    /* the request's limit caps every solve, table entries too */
                    .limit_s = o->stage_time_limit_s > 0 && req->ilp.time_limit_s > 0
                                   ? fmin(o->stage_time_limit_s, req->ilp.time_limit_s)
                                   : o->stage_time_limit_s,
                    .status = item_status};
    if (!ps_parallel_for(n_items, table_item, &w, ps_ilp_thread_done,
                         "pipeshard: stage costs (configurations)")) {
        for (int k = 0; k < n_items && st == PS_OK; k++)
            st = item_status[k];
        st = ps_error_set(err, st, "costing the stages failed (%s)", ps_status_str(st));
        goto out;
    }
    PS_LOG_INFO("pipeshard: %d distinct layer slices, %d table entries solved in %.3g s",
                n_cache, n_entries, ps_monotonic_s() - t_table);
    if (!o->exact_ranges && L > 1) {
        /* longer ranges from their layers, each layer's entries and tensors
         * (a variant's entries hold the other variant's configurations
         * absent, unless the slices are the same) */
        single = malloc((size_t)L * sizeof *single);
        single_tensors = malloc((size_t)L * sizeof *single_tensors);
        PS_TRY_ALLOC(single, err);
        PS_TRY_ALLOC(single_tensors, err);
        for (int v = 0; v < n_var; v++) {
            PS_TRY(ps_layer_crossings_build(table_step[v], &crossings[v], err));
            if (ps_layer_crossings_layers(crossings[v]) != L)
                PS_TRY(ps_error_set(err, PS_ERR_INTERNAL,
                                    "composing layers: the table's step has %d layers, the "
                                    "stage table %d",
                                    ps_layer_crossings_layers(crossings[v]), L));
            for (int q = 0; q < L; q++) {
                single[q] = entries_of[v][q * L + q];
                single_tensors[q] = cache[cache_of[v][q * L + q]].tensors;
            }
            for (int l = 0; l < L; l++) {
                for (int i = l + 1; i < L; i++)
                    entries_of[v][l * L + i] = composed[v][l * L + i];
                PS_TRY(ps_range_compose(
                    crossings[v], l, n_sub * max_cfg, (const entry *const *)single,
                    (const ps_entry_tensors *const *)single_tensors, entries_of[v] + l * L, err));
            }
        }
    }

    /* 4. the DP. What a stage receives is charged at the link its neighbours
     * use, which placement decides. Alpa's DP leaves placement to after it
     * (any packing of the submeshes): a stage of whole nodes then receives
     * through NICs, one within a node is charged as if its neighbours shared
     * its node. On several nodes the DP runs again with the stages placed in
     * pipeline order, where it knows which neighbours are on other nodes,
     * and the plan whose schedule is faster is kept. */
    int n_ways = c->nodes > 1 && o->transfer_costs ? 2 : 1;
    for (int way = 0; way < n_ways; way++) {
        bool in_order = way == 1;
        if (in_order) {
            if (ps_stage_table_place_in_order(table, c->devices_per_node) != PS_OK) {
                st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
                goto out;
            }
            for (int b = 1; b < L; b++)
                for (int s = 0; s < n_sub; s++)
                    for (int across = 0; across < 2; across++)
                        table->recv_s[((size_t)b * n_sub + s) * 2 + across] =
                            boundary_receive_s(c, &lay, b, subs[s].hosts, subs[s].devices,
                                               across);
        }
        /* With recomputation chosen by stage, the DP runs on the plain and
         * on the recomputing configurations alone (only 1, 2), then on the
         * whole table (only 0, last: step 6 reads the table it leaves): the
         * DP's objective is not the schedule, so its best over more choices
         * may be slower than either alone, and realizing all three keeps
         * the plan at least as fast as both --remat and none would be. */
        int n_passes = n_var == 2 ? 3 : 1;
        for (int pass = 0; pass < n_passes; pass++) {
            int only = (pass + 1) % n_passes;
            for (int l = 0; l < L; l++)
                for (int i = l; i < L; i++)
                    for (int s = 0; s < n_sub; s++) {
                        bool balanced = stage_balanced(flops_prefix, L, l, i, table->sub_devices[s],
                                                       D, o->stage_imbalance_tolerance);
                        double receive_s = in_order ? 0
                                                    : stage_receive_s(c, &lay, l, i, subs[s].hosts,
                                                                      subs[s].devices, false);
                        for (int k = 0; k < n_cfgs[s]; k++) {
                            entry e_pruned = {0};
                            bool left_out =
                                (only == 1 && cfgs[s][k].remat) || (only == 2 && !cfgs[s][k].remat);
                            const entry *e =
                                balanced && !left_out
                                    ? &entries_of[cfgs[s][k].remat][l * L + i][s * max_cfg + k]
                                    : &e_pruned;
                            size_t idx = ps_stage_table_index(table, l, i, s, k);
                            /* the update and its gradient reductions, once per step, are
                             * amortized over the micro-batches as in Alpa's stage costs */
                            table->cost[idx] = e->ok ? e->time_s + e->update_s / B +
                                                           (o->transfer_costs ? receive_s : 0)
                                                     : INFINITY;
                            table->max_succ[idx] = max_succ(e, memory, L, B, o->gpipe);
                            if (o->print_rows && e->ok && way == 0 && only == 0) {
                                /* what the same receive costs from another node's
                                 * neighbour: only where there are other nodes */
                                char across[64] = "";
                                if (c->nodes > 1)
                                    snprintf(across, sizeof across, " (%.4g ms from other nodes)",
                                             stage_receive_s(c, &lay, l, i, subs[s].hosts,
                                                             subs[s].devices, true) *
                                                 1e3);
                                printf("result[(%d, %d, (%d, %d), (%d, %d)%s%s%s)] = stage(time "
                                       "%.4g ms (forward %.4g, backward %.4g), update %.4g ms per "
                                       "step, receives %.4g ms%s, "
                                       "weights+state %.4g GiB, activations %.4g GiB per "
                                       "micro-batch, temporaries %.4g GiB, update %.4g GiB, "
                                       "later stages allowed %d)\n",
                                       l, i, subs[s].hosts, subs[s].devices, cfgs[s][k].d0,
                                       cfgs[s][k].d1, cfgs[s][k].force ? " forced" : "",
                                       cfgs[s][k].lean ? " lean" : "",
                                       cfgs[s][k].remat ? " remat" : "", e->time_s * 1e3,
                                       e->forward_s * 1e3, (e->time_s - e->forward_s) * 1e3,
                                       e->update_s * 1e3, receive_s * 1e3, across,
                                       e->static_bytes / PS_GIB, e->act_bytes / PS_GIB,
                                       e->transient_bytes / PS_GIB, e->update_bytes / PS_GIB,
                                       table->max_succ[idx]);
                            }
                        }
                    }
            ps_error inner = {0};
            int max_cand = o->stage_candidates < 1                ? 1
                           : o->stage_candidates > MAX_CANDIDATES ? MAX_CANDIDATES
                                                                  : o->stage_candidates;
            double t_dp = ps_monotonic_s();
            st = ps_stage_dp_by_count(table, D, B, max_cand > 1 ? CANDIDATES_WITHIN : 1.0, by_count,
                                      &inner);
            PS_LOG_DEBUG("pipeshard: stage DP (placement way %d, pass %d): %d slowest-stage "
                         "bounds tried in %.3g s",
                         way, pass, by_count[L].t_max_tried, ps_monotonic_s() - t_dp);
            if (st == PS_ERR_INFEASIBLE && only > 0) {
                /* nothing fits without recomputing (or, on in-order
                 * placement, recomputing everywhere packs none): the whole
                 * table's answer stands */
                st = PS_OK;
                for (int n = 0; n <= L; n++)
                    ps_stage_plan_clear(&by_count[n]);
                continue;
            }
            if (st != PS_OK) {
                /* memory alone decides feasibility both ways, unless the first
                 * way's stages did not pack and in-order placement fits none */
                if (st == PS_ERR_INFEASIBLE && in_order && n_jobs == 0)
                    st = ps_error_set(err, PS_ERR_INFEASIBLE,
                                      "%s on %s: the stages on the candidate submeshes do not "
                                      "pack into the nodes (a submesh within a node may not "
                                      "straddle two); choose submeshes whose sizes divide %d",
                                      f0->name, c->name, c->devices_per_node);
                else if (st == PS_ERR_INFEASIBLE)
                    st = no_plan_fits(
                        req, o,
                        (const entry *const[2]){entries_of[0][L - 1], entries_of[n_var - 1][L - 1]},
                        subs, n_sub, cfgs, n_cfgs, max_cfg, memory, table->no_cut_after, L, &inner,
                        err);
                else
                    st = ps_error_set(err, st, "%s on %s: %s", f0->name, c->name, inner.msg);
                goto out;
            }
            /* the candidates, best DP objective first: Alpa's answer (sp[way]
             * on the whole table, sp_only on part of it), then the best
             * pipeline of each other stage count near it */
            int n_cand = 0;
            for (int n = 1; n <= L; n++) {
                if (by_count[n].n_stages == 0)
                    continue;
                int at = n_cand++;
                for (; at > 0 && by_count[order[at - 1]].iteration_s > by_count[n].iteration_s;
                     at--)
                    order[at] = order[at - 1];
                order[at] = n;
            }
            if (n_cand > max_cand)
                n_cand = max_cand;
            ps_stage_plan *top = only == 0 ? &sp[way] : &sp_only;
            ps_stage_plan_clear(top);
            *top = by_count[order[0]];
            memset(&by_count[order[0]], 0, sizeof by_count[order[0]]);
            for (int q = 0; q < n_cand; q++) {
                const ps_stage_plan *cur = q == 0 ? top : &by_count[order[q]];
                if (solved_before(cur, realized, n_realized))
                    continue;

                /* 5. placement and each stage's sharding */
                stage_spec chosen[64];
                if (cur->n_stages > 64) {
                    st = ps_error_set(err, PS_ERR_INFEASIBLE, "more than 64 stages");
                    goto out;
                }
                for (int k = 0; k < cur->n_stages; k++) {
                    const ps_stage_choice *ch = &cur->stages[k];
                    chosen[k] = (stage_spec){ch->first, ch->last, subs[ch->sub],
                                             cfgs[ch->sub][ch->cfg], o->lean_twin_iterations};
                }
                submesh chosen_subs[64];
                int chosen_first[64];
                for (int k = 0; k < cur->n_stages; k++)
                    chosen_subs[k] = chosen[k].sub;
                if (!in_order && n_ways > 1 &&
                    !place(c, chosen_subs, cur->n_stages, chosen_first)) {
                    /* submeshes that are not powers of two may not pack; the
                     * in-order DP's always do */
                    PS_LOG_INFO("pipeshard: the stage DP's %d stages (neighbours charged on their "
                                "node) do not pack into %s; placing in pipeline order instead",
                                cur->n_stages, c->name);
                    continue;
                }
                PS_TRY(realization_prepare(req, fwd, step, L, manual, o->gpipe, n_var == 2,
                                           "pipeshard", chosen, cur->n_stages, &jobs[n_jobs],
                                           err));
                job_label[n_jobs] = (candidate_label){cur->n_stages, in_order, q > 0,
                                                      cur->iteration_s};
                n_jobs++;
                /* kept to recognize it the other way */
                if (stage_plan_copy(cur, &realized[n_realized]) != PS_OK) {
                    st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
                    goto out;
                }
                n_realized++;
            }
            for (int n = 0; n <= L; n++)
                ps_stage_plan_clear(&by_count[n]);
        }
    }

    /* 6. The whole model on the whole cluster, when the DP pipelined it and
     * its cost is near, or below the chosen pipeline's schedule: the DP's
     * objective (sum + (B - 1) max of the stage costs) leaves out how
     * transfers between stages stretch the 1F1B cycle and what shared
     * parameters move once per step (planner/pipeline_time.h), which one
     * stage does not have. */
    int full = -1;
    for (int s = 0; s < n_sub; s++)
        if (table->sub_devices[s] == D)
            full = s;
    int best_k = -1;
    double best_cost = INFINITY;
    for (int k = 0; full >= 0 && k < n_cfgs[full]; k++) {
        size_t idx = ps_stage_table_index(table, 0, L - 1, full, k);
        if (table->max_succ[idx] >= 0 && table->cost[idx] < best_cost) {
            best_cost = table->cost[idx];
            best_k = k;
        }
    }
    /* not again when it was one of the DP's candidates */
    ps_stage_choice whole = {0, L - 1, full, best_k, best_cost};
    ps_stage_plan whole_plan = {.n_stages = 1, .stages = &whole};
    bool whole_wanted = best_k >= 0 && !solved_before(&whole_plan, realized, n_realized);
    stage_spec one = {0, L - 1, full >= 0 ? subs[full] : (submesh){0},
                      best_k >= 0 ? cfgs[full][best_k] : (config){0}, o->lean_twin_iterations};
    int whole_job = -1;
    if (whole_wanted && B * best_cost <= ONE_STAGE_WITHIN * sp[0].iteration_s) {
        /* solved beside the candidates: whether it is wanted also depends on
         * their plans (below), but past this bound it nearly always is */
        PS_TRY(realization_prepare(req, fwd, step, L, manual, o->gpipe, n_var == 2, "pipeshard",
                                   &one, 1, &jobs[n_jobs], err));
        whole_job = n_jobs++;
    }
    double t_realize = ps_monotonic_s();
    ps_inter_solve_counts counted = {0};
    PS_TRY(realizations_solve(jobs, n_jobs, o->share_layouts, &counted, err));
    PS_LOG_INFO("pipeshard: %d candidate pipeline(s) solved in %.3g s (%d stages on %d threads: "
                "%d fastest layouts solved, %d taken from another candidate; %d lean layouts "
                "solved, %d taken by another stage; %d layouts within the memory solved, %d "
                "taken from another candidate)",
                n_jobs, ps_monotonic_s() - t_realize, counted.stages, ps_parallel_threads(),
                counted.fastest_solved, counted.fastest_borrowed, counted.lean_solved,
                counted.lean_reused, counted.within_solved, counted.within_borrowed);
    if (o->solve_counts != NULL)
        solve_counts_add(o->solve_counts, &counted);
    /* their plans, in the DP's order; the first fastest is kept */
    int best = -1;
    for (int j = 0; j < n_jobs; j++) {
        if (j == whole_job)
            continue;
        ps_plan *plan = NULL;
        PS_TRY(realization_plan(&jobs[j], &plan, err));
        const candidate_label *lb = &job_label[j];
        PS_LOG_INFO("pipeshard: %d stage(s) (neighbours of stages within a node charged %s%s): "
                    "iteration %.4g s (stage DP: %.4g s)",
                    lb->n_stages,
                    lb->in_order ? "where in-order placement puts them" : "on their node",
                    lb->of_its_count ? "; the best of this stage count" : "", plan->iteration_s,
                    lb->dp_iteration_s);
        cand_dp[n_plans] = lb->dp_iteration_s;
        cand[n_plans] = plan;
        if (best < 0 || plan->iteration_s < cand[best]->iteration_s)
            best = n_plans;
        n_plans++;
    }
    if (best < 0) {
        st = ps_error_set(err, PS_ERR_INTERNAL, "%s on %s: no candidate pipeline was placed",
                          f0->name, c->name);
        goto out;
    }
    if (whole_wanted && cand[best]->n_stages > 1 &&
        B * best_cost <= fmax(ONE_STAGE_WITHIN * sp[0].iteration_s, cand[best]->iteration_s)) {
        ps_plan *plan = NULL;
        if (whole_job < 0) {
            PS_TRY(realize(req, o, fwd, step, L, manual, o->gpipe, n_var == 2, "pipeshard", &one, 1,
                           &plan, err));
        } else {
            PS_TRY(realization_plan(&jobs[whole_job], &plan, err));
        }
        PS_LOG_INFO("pipeshard: the whole model on all devices: iteration %.4g s (stage DP: "
                    "%.4g s, pipelined %.4g s)",
                    plan->iteration_s, B * best_cost, sp[0].iteration_s);
        cand_dp[n_plans] = B * best_cost;
        cand[n_plans] = plan;
        if (plan->iteration_s < cand[best]->iteration_s)
            best = n_plans;
        n_plans++;
    }
    for (int q = 0; q < n_plans && o->on_candidate != NULL; q++)
        o->on_candidate(o->on_candidate_ctx, cand[q], cand_dp[q], q == best);
    *out = cand[best];
    cand[best] = NULL;
out:
    for (int k = 0; k < n_cache; k++) {
        free(cache[k].entries);
        free(cache[k].tensors);
        free(cache[k].tensor_bytes);
        if (slices != NULL)
            ps_graph_free(slices[k]);
    }
    free(cache);
    free(slices);
    free(needed);
    free(items);
    free(item_status);
    for (int v = 0; v < 2; v++) {
        free(entries_of[v]);
        free(cache_of[v]);
        for (int k = 0; composed[v] != NULL && k < lay.n_layers * lay.n_layers; k++)
            free(composed[v][k]);
        free(composed[v]);
        ps_layer_crossings_free(crossings[v]);
        ps_graph_free(table_step[v]);
    }
    free(single);
    free(single_tensors);
    ps_stage_plan_clear(&sp[0]);
    ps_stage_plan_clear(&sp[1]);
    ps_stage_plan_clear(&sp_only);
    for (int k = 0; by_count != NULL && k <= lay.n_layers; k++)
        ps_stage_plan_clear(&by_count[k]);
    free(by_count);
    free(order);
    for (int k = 0; k < n_realized; k++)
        ps_stage_plan_clear(&realized[k]);
    for (int j = 0; j < n_jobs; j++)
        realization_free(&jobs[j]);
    for (int q = 0; q < n_plans; q++)
        ps_plan_free(cand[q]);
    if (st != PS_OK) {
        ps_plan_free(*out);
        *out = NULL;
    }
    ps_stage_table_free(table);
    free(layer_self);
    free(flops_prefix);
    ps_graph_free(step);
    ps_graph_free(fwd);
    ps_layering_clear(&lay);
    return st;
}

static ps_status plan_stages(const ps_plan_request *req, const ps_inter_options *o,
                             const ps_manual_stage *stages, int n, const char *method,
                             int layer_num, bool manual_layers, ps_plan **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_layering lay = {0};
    ps_graph *fwd = NULL, *step = NULL;
    stage_spec specs[64];
    bool manual = false;
    bool by_stage = false; /* some stage says whether it recomputes */
    const ps_cluster *c = req->cluster;
    int M = c->devices_per_node, used = 0;
    *out = NULL;
    if (n < 1 || n > 64)
        return ps_error_set(err, PS_ERR_INVALID, "a plan needs 1 to 64 stages, not %d", n);
    if (req->micro_batches < 1 || req->global_batch % req->micro_batches != 0)
        return ps_error_set(err, PS_ERR_INVALID,
                            "%d micro-batches do not divide the global batch %lld",
                            req->micro_batches, req->global_batch);
    PS_TRY(prepare(req, layer_num, manual_layers, &lay, &fwd, &step, &manual, err));
    for (int k = 0; k < n; k++) {
        const ps_manual_stage *m = &stages[k];
        int h = m->submesh[0], d = m->submesh[1];
        int want_first = k == 0 ? 0 : stages[k - 1].last_layer + 1;
        if (m->first_layer != want_first || m->last_layer < m->first_layer ||
            m->last_layer >= lay.n_layers) {
            char why[96] = "";
            if (k > 0 && m->first_layer < want_first)
                snprintf(why, sizeof why, " (it overlaps stage %d, which ends at layer %d)",
                         k - 1, stages[k - 1].last_layer);
            else if (m->first_layer != want_first)
                snprintf(why, sizeof why, " (layer %d is in no stage)", want_first);
            else if (m->last_layer >= lay.n_layers)
                snprintf(why, sizeof why, " (the model's layers end at %d)", lay.n_layers - 1);
            st = ps_error_set(err, PS_ERR_INVALID,
                              "stage %d covers layers %d-%d%s; stages must cover layers 0-%d in "
                              "order",
                              k, m->first_layer, m->last_layer, why, lay.n_layers - 1);
            goto out;
        }
        if (h < 1 || d < 1 || d > M || (h > 1 && d != M) ||
            m->logical_mesh[0] * m->logical_mesh[1] != h * d || m->logical_mesh[0] < 1 ||
            m->logical_mesh[1] < 1) {
            st = ps_error_set(err, PS_ERR_INVALID,
                              "stage %d: submesh (%d, %d) with logical mesh (%d, %d) does not fit "
                              "%s (%d devices per node; a submesh is part of one node or whole "
                              "nodes)",
                              k, h, d, m->logical_mesh[0], m->logical_mesh[1], c->name, M);
            goto out;
        }
        used += h * d;
        specs[k] = (stage_spec){m->first_layer, m->last_layer, {h, d},
                                {m->logical_mesh[0], m->logical_mesh[1], m->force_batch_axis0,
                                 false, m->remat_given ? m->remat : req->train.remat},
                                0};
        by_stage = by_stage || m->remat_given;
    }
    if (stages[n - 1].last_layer != lay.n_layers - 1) {
        st = ps_error_set(err, PS_ERR_INVALID, "the stages cover layers 0-%d of 0-%d",
                          stages[n - 1].last_layer, lay.n_layers - 1);
        goto out;
    }
    for (int op = 0, in = -1; next_later_read(fwd, &op, &in);) {
        const ps_op *reader = &fwd->ops[op];
        const ps_tensor *t = &fwd->tensors[reader->in[in]];
        const ps_op *p = &fwd->ops[t->producer];
        int ko = 0, kp = 0;
        while (ko < n - 1 && stages[ko].last_layer < reader->layer)
            ko++;
        while (kp < n - 1 && stages[kp].last_layer < p->layer)
            kp++;
        if (kp != ko) {
            st = ps_error_set(err, PS_ERR_INVALID,
                              "op \"%s\" of layer %d (stage %d) reads \"%s\", which op \"%s\" "
                              "of layer %d makes in the later stage %d: a stage runs its forward "
                              "pass whole, so the two would wait for each other; put layers %d-%d "
                              "in one stage",
                              reader->name, reader->layer, ko, t->name, p->name, p->layer, kp,
                              reader->layer, p->layer);
            goto out;
        }
    }
    if (used > ps_cluster_device_count(c)) {
        st = ps_error_set(err, PS_ERR_INVALID, "the stages use %d devices; %s has %d", used,
                          c->name, ps_cluster_device_count(c));
        goto out;
    }
    PS_TRY(realize(req, o, fwd, step, lay.n_layers, manual, o->gpipe, by_stage, method, specs, n,
                   out, err));
out:
    ps_graph_free(step);
    ps_graph_free(fwd);
    ps_layering_clear(&lay);
    return st;
}

ps_status ps_plan_manual(const ps_plan_request *req, const ps_inter_options *o,
                         const ps_manual_stage *stages, int n, ps_plan **out, ps_error *err)
{
    return plan_stages(req, o, stages, n, "manual", o->layer_num, o->manual_layers, out, err);
}

ps_status ps_plan_uniform(const ps_plan_request *req, const ps_inter_options *o, int dp, int op,
                          int pp, ps_plan **out, ps_error *err)
{
    const ps_cluster *c = req->cluster;
    int D = ps_cluster_device_count(c), M = c->devices_per_node, n = dp * op;
    *out = NULL;
    if (dp < 1 || op < 1 || pp < 1 || (int64_t)dp * op * pp != D)
        return ps_error_set(err, PS_ERR_INVALID,
                            "uniform plan: dp %d x op %d x pp %d must be the %d devices of %s",
                            dp, op, pp, D, c->name);
    int hosts, per_host;
    if (n <= M && M % n == 0) {
        hosts = 1;
        per_host = n;
    } else if (n % M == 0) {
        hosts = n / M;
        per_host = M;
    } else {
        return ps_error_set(err, PS_ERR_INVALID,
                            "uniform plan: a stage of dp %d x op %d = %d devices is neither part "
                            "of a %d-device node nor whole nodes",
                            dp, op, n, M);
    }
    if (pp > 64)
        return ps_error_set(err, PS_ERR_INVALID, "uniform plan: at most 64 stages");
    ps_manual_stage stages[64];
    for (int k = 0; k < pp; k++)
        stages[k] = (ps_manual_stage){k, k, {hosts, per_host}, {dp, op}, dp > 1, false, false};
    return plan_stages(req, o, stages, pp, "uniform", pp, false, out, err);
}

/* The most micro-batches --micro-batches auto considers. */
#define SEARCH_MAX_MICRO_BATCHES 128

/* One candidate of the micro-batch search: the model rebuilt for micro-
 * batches of global / B samples and planned; *best, *n_fit and *last
 * updated. A plan that does not fit is no error; anything else is. */
static ps_status search_try(const ps_plan_request *req, const ps_inter_options *o, long long B,
                            ps_plan **best, int *n_fit, ps_error *last, ps_error *err)
{
    ps_model_config cfg = *req->config;
    cfg.batch = req->global_batch / B;
    ps_graph *fwd = NULL;
    ps_plan *p = NULL;
    ps_error e = {0};
    ps_status st = ps_model_build(&cfg, &fwd, &e);
    if (st == PS_OK) {
        ps_plan_request r = *req;
        r.forward = fwd;
        r.config = &cfg;
        r.micro_batches = (int)B;
        st = ps_plan_pipeshard(&r, o, &p, &e);
    }
    ps_graph_free(fwd);
    if (st == PS_OK) {
        PS_LOG_INFO("pipeshard: %lld micro-batches of %lld: iteration %.4g s", B,
                    req->global_batch / B, p->iteration_s);
        (*n_fit)++;
        if (*best == NULL || p->iteration_s < (*best)->iteration_s) {
            ps_plan_free(*best);
            *best = p;
        } else {
            ps_plan_free(p);
        }
        return PS_OK;
    }
    if (st == PS_ERR_INFEASIBLE) {
        PS_LOG_INFO("pipeshard: %lld micro-batches: %s", B, e.msg);
        *last = e;
        return PS_OK;
    }
    return ps_error_set(err, st, "%s", e.msg);
}

ps_status ps_plan_pipeshard_search(const ps_plan_request *req, const ps_inter_options *o,
                                   ps_plan **out, ps_error *err)
{
    *out = NULL;
    if (req->config == NULL)
        return ps_error_set(err, PS_ERR_INVALID,
                            "choosing the number of micro-batches rebuilds the model for each "
                            "micro-batch size: it needs a built-in model (--model), not a graph "
                            "file; give --micro-batches N");
    /* the candidates: every divisor of the global batch up to the cap. A
     * coarse sweep first (for each power of two, the largest divisor not
     * above it), then every divisor between the best's coarse neighbours */
    long long div[SEARCH_MAX_MICRO_BATCHES];
    bool tried[SEARCH_MAX_MICRO_BATCHES] = {false}, coarse[SEARCH_MAX_MICRO_BATCHES] = {false};
    int n_div = 0, n_tried = 0, n_fit = 0;
    for (long long B = 1; B <= SEARCH_MAX_MICRO_BATCHES && B <= req->global_batch; B++)
        if (req->global_batch % B == 0)
            div[n_div++] = B;
    for (long long p = 1; p <= SEARCH_MAX_MICRO_BATCHES; p *= 2) {
        int k = n_div - 1;
        while (k > 0 && div[k] > p)
            k--;
        coarse[k] = true;
    }
    ps_plan *best = NULL;
    ps_error last = {0};
    ps_status st = PS_OK;
    for (int k = 0; k < n_div && st == PS_OK; k++)
        if (coarse[k]) {
            st = search_try(req, o, div[k], &best, &n_fit, &last, err);
            tried[k] = true;
            n_tried++;
        }
    /* refine between the coarse neighbours of the best (everywhere if
     * nothing fitted) */
    long long lo = 0, hi = SEARCH_MAX_MICRO_BATCHES + 1;
    for (int k = 0; k < n_div && best != NULL; k++)
        if (coarse[k] && div[k] < best->micro_batches)
            lo = div[k];
        else if (coarse[k] && div[k] > best->micro_batches && hi > SEARCH_MAX_MICRO_BATCHES)
            hi = div[k];
    for (int k = 0; k < n_div && st == PS_OK; k++)
        if (!tried[k] && div[k] > lo && div[k] < hi) {
            st = search_try(req, o, div[k], &best, &n_fit, &last, err);
            tried[k] = true;
            n_tried++;
        }
    if (st != PS_OK) {
        ps_plan_free(best);
        return st;
    }
    if (best == NULL)
        return ps_error_set(err, PS_ERR_INFEASIBLE, "%s (tried %d micro-batch counts)",
                            last.msg[0] ? last.msg : "no micro-batch count works", n_tried);
    PS_LOG_INFO("pipeshard: tried %d of the %d micro-batch counts up to %d that divide %lld: "
                "%d fit, %d kept",
                n_tried, n_div, SEARCH_MAX_MICRO_BATCHES, req->global_batch, n_fit,
                best->micro_batches);
    *out = best;
    return PS_OK;
}
