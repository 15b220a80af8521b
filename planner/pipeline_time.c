/* See pipeline_time.h. */
#include "planner/pipeline_time.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/array.h"
#include "core/log.h"
#include "core/program.h"
#include "planner/cost_model.h"
#include "planner/cross_mesh.h"
#include "planner/lower.h"
#include "planner/plan_model.h"

/* ---- the links ---- */

/* One tensor crossing from stage `from` to stage `to`. */
typedef struct crossing {
    int tensor, from, to;
    ps_link_kind kind;
} crossing;

static int by_link(const void *a, const void *b)
{
    const crossing *x = a, *y = b;
    if (x->from != y->from)
        return x->from < y->from ? -1 : 1;
    if (x->to != y->to)
        return x->to < y->to ? -1 : 1;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

static ps_link_kind kind_of(ps_pass producer, ps_pass first_consumer)
{
    switch (producer) {
    case PS_PASS_FORWARD:
        return first_consumer == PS_PASS_UPDATE ? PS_LINK_ACCUMULATED : PS_LINK_FORWARD;
    case PS_PASS_BACKWARD:
    case PS_PASS_RECOMPUTE:
        return first_consumer == PS_PASS_UPDATE ? PS_LINK_ACCUMULATED : PS_LINK_BACKWARD;
    default: return PS_LINK_UPDATE;
    }
}

static const ps_plan_tensor *plan_tensor_named(const ps_plan_stage *s, const char *name)
{
    for (int i = 0; i < s->n_tensors; i++)
        if (strcmp(s->tensors[i].name, name) == 0)
            return &s->tensors[i];
    return NULL;
}

/* Of a resharding step's time, its rings on mesh axes across nodes. */
static double step_nic_s(const ps_logical_mesh *m, const ps_reshard_step *s)
{
    if (s->kind < 0)
        return 0; /* a local slice */
    return ps_collective_nic_s(m, (ps_collective)s->kind, s->axis == 2 ? 3u : 1u << s->axis,
                               s->bytes);
}

/* Of resharding a tensor from one layout to another on mesh m, the rings on
 * axes across nodes. */
static double reshard_nic_s(const ps_logical_mesh *m, const ps_tensor_desc *t,
                            const ps_sharding_spec *from, const ps_sharding_spec *to)
{
    ps_reshard_step steps[PS_RESHARD_MAX_STEPS];
    int n = ps_reshard_plan(m, t, from, to, steps);
    double s = 0;
    for (int i = 0; i < n; i++)
        s += step_nic_s(m, &steps[i]);
    return s;
}

/* Seconds to move tensor x of `step` from stage a's layout to stage b's:
 * the sender's reduction of a partial sum, then the transfers and the
 * receivers' all-gathers. */
/* The bytes one link moves through each node's NIC, each direction. */
typedef struct nic_load {
    double *bytes; /* [node * 2 + side]: side 0 sends, 1 receives */
    int *devices;  /* [node * 2 + side]: the receivers of its transfers through it */
    long long *through; /* (NIC, receiver) of each transfer: (node * 2 + side) * devices +
                         * receiver, counted distinct into devices by link_nics */
    int n_through, cap_through;
    int lo[2], hi[2]; /* the nodes it touched so far, each side; lo > hi: none */
} nic_load;

/* On to the next link. */
static void nic_load_reset(nic_load *v, int nodes)
{
    for (int side = 0; side < 2; side++) {
        for (int k = v->lo[side]; k <= v->hi[side]; k++)
            v->bytes[k * 2 + side] = 0, v->devices[k * 2 + side] = 0;
        v->lo[side] = nodes;
        v->hi[side] = -1;
    }
    v->n_through = 0;
}

/* A transfer's bytes through a node's NIC on one side, to `device`, its
 * receiver: a receiver takes its transfers in turn (its receives block)
 * while a sender posts all of its sends at once, so the flows a link runs
 * through a NIC at once are the receivers of its transfers through it. */
static bool nic_load_add(nic_load *v, int node, int side, int device, int n_devices,
                         double bytes)
{
    if (ps_array_grow((void **)&v->through, &v->cap_through, v->n_through + 1,
                      sizeof *v->through) != PS_OK)
        return false;
    v->through[v->n_through++] = ((long long)node * 2 + side) * n_devices + device;
    v->bytes[node * 2 + side] += bytes;
    v->lo[side] = node < v->lo[side] ? node : v->lo[side];
    v->hi[side] = node > v->hi[side] ? node : v->hi[side];
    return true;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Each NIC's distinct receivers (v->through). */
static void count_receivers(nic_load *v, int n_devices)
{
    if (v->n_through > 1)
        qsort(v->through, (size_t)v->n_through, sizeof *v->through, cmp_ll);
    for (int i = 0; i < v->n_through; i++)
        if (i == 0 || v->through[i] != v->through[i - 1])
            v->devices[v->through[i] / n_devices]++;
}

/* Link l's NICs from what its tensors moved through them (v). */
static void link_nics(ps_stage_link *l, nic_load *v, const ps_cluster *c)
{
    count_receivers(v, ps_cluster_device_count(c));
    double bw = c->inter.nics_per_node * c->inter.nic_bandwidth_bytes_per_s, most = 0;
    l->nic_flows = 0;
    for (int side = 0; side < 2; side++) {
        l->nic_node[side] = v->hi[side] >= 0 ? v->lo[side] : 0;
        l->nic_nodes[side] = v->hi[side] >= 0 ? v->hi[side] - v->lo[side] + 1 : 0;
        for (int k = v->lo[side]; k <= v->hi[side]; k++) {
            double b = v->bytes[k * 2 + side];
            int d = v->devices[k * 2 + side];
            if (b > most || (b == most && d > l->nic_flows))
                l->nic_flows = d;
            most = b > most ? b : most;
        }
    }
    l->nic_s = most > 0 && bw > 0 ? c->inter.latency_s + most / bw : 0;
    if (l->nic_s > l->seconds)
        l->nic_s = l->seconds; /* the link's own time bounds its NIC time */
}

static ps_status price(const ps_plan *p, const ps_graph *step, ps_logical_mesh **mesh,
                       const crossing *x, bool local_allgather, nic_load *nics,
                       double *reduce_s, double *reduce_nic_s, double *seconds, ps_error *err)
{
    ps_status st = PS_OK;
    const ps_tensor *t = &step->tensors[x->tensor];
    const ps_plan_stage *A = &p->stages[x->from], *B = &p->stages[x->to];
    const ps_plan_tensor *ta = plan_tensor_named(A, t->name), *tb = plan_tensor_named(B, t->name);
    ps_cross_plan cp = {0};
    *seconds = *reduce_s = *reduce_nic_s = 0;
    if (ta == NULL || tb == NULL)
        return ps_error_set(err, PS_ERR_INVALID, "stage %d has no layout for %s",
                            ta == NULL ? x->from : x->to, t->name);
    ps_sharding_spec sa = ta->spec, sb = tb->spec;
    if (sa.partial) {
        ps_sharding_spec full = sa;
        ps_reshard_step steps[PS_RESHARD_MAX_STEPS];
        full.partial = 0;
        int n = ps_reshard_plan(mesh[x->from], &t->desc, &sa, &full, steps);
        for (int i = 0; i < n; i++) {
            *reduce_s += steps[i].seconds;
            *reduce_nic_s += step_nic_s(mesh[x->from], &steps[i]);
        }
        sa = full;
    }
    if (sb.partial)
        return ps_error_set(err, PS_ERR_INVALID, "stage %d receives %s as a partial sum", x->to,
                            t->name);
    PS_TRY(ps_cross_mesh_plan(p->cluster, &t->desc, &sa, A->devices, A->logical_mesh, &sb,
                              mesh[x->to], local_allgather, &cp, err));
    *seconds += ps_cross_plan_seconds(&cp, p->cluster);
    int n_devices = ps_cluster_device_count(p->cluster);
    for (int i = 0, dpn = p->cluster->devices_per_node; i < cp.n_xfers; i++) {
        const ps_cross_xfer *xf = &cp.xfers[i];
        if (xf->src / dpn != xf->dst / dpn &&
            (!nic_load_add(nics, xf->src / dpn, 0, xf->dst, n_devices, xf->bytes) ||
             !nic_load_add(nics, xf->dst / dpn, 1, xf->dst, n_devices, xf->bytes))) {
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
out:
    ps_cross_plan_clear(&cp);
    return st;
}

/* Appends the crossing (tensor, a -> b). */
static ps_status add_crossing(crossing **v, int *n, int *cap, int tensor, int a, int b,
                              ps_link_kind kind, ps_error *err)
{
    if (ps_array_grow((void **)v, cap, *n + 1, sizeof **v) != PS_OK)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    (*v)[(*n)++] = (crossing){.tensor = tensor, .from = a, .to = b, .kind = kind};
    return PS_OK;
}

static int by_op_name(const void *a, const void *b)
{
    return strcmp((*(const ps_plan_op *const *)a)->name, (*(const ps_plan_op *const *)b)->name);
}

static int by_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const ps_plan_tensor *const *)a)->name,
                  (*(const ps_plan_tensor *const *)b)->name);
}

/* Each stage's nodes, and of its update the reshardings' rings across them:
 * the update-pass ops' input reshardings as the ILP priced them
 * (planner/intra_pass.c), ADAM's state written back to its layout too. */
static ps_status stage_update_nics(const ps_plan *p, const ps_graph *step,
                                   const int *stage_of_layer, ps_logical_mesh **mesh,
                                   ps_stage_nics *nics, ps_error *err)
{
    ps_status st = PS_OK;
    int n = p->n_stages, dpn = p->cluster->devices_per_node, most_ops = 1, most_tensors = 1;
    for (int k = 0; k < n; k++) {
        const ps_plan_stage *s = &p->stages[k];
        int lo = s->devices[0] / dpn, hi = lo;
        for (int i = 1; i < s->n_devices; i++) {
            lo = s->devices[i] / dpn < lo ? s->devices[i] / dpn : lo;
            hi = s->devices[i] / dpn > hi ? s->devices[i] / dpn : hi;
        }
        nics[k] = (ps_stage_nics){.node = lo, .nodes = hi - lo + 1};
        for (int a = 0; a < PS_MESH_AXES; a++)
            if (mesh[k]->nic_flows[a] > nics[k].nic_flows)
                nics[k].nic_flows = mesh[k]->nic_flows[a];
        most_ops = s->n_ops > most_ops ? s->n_ops : most_ops;
        most_tensors = s->n_tensors > most_tensors ? s->n_tensors : most_tensors;
    }
    /* one stage at a time: its ops and tensors by name */
    const ps_plan_op **ops = malloc((size_t)most_ops * sizeof *ops);
    const ps_plan_tensor **tensors = malloc((size_t)most_tensors * sizeof *tensors);
    PS_TRY_ALLOC(ops, err);
    PS_TRY_ALLOC(tensors, err);
    for (int k = 0; k < n; k++) {
        const ps_plan_stage *s = &p->stages[k];
        if (nics[k].nodes < 2)
            continue;
        for (int i = 0; i < s->n_ops; i++)
            ops[i] = &s->ops[i];
        for (int i = 0; i < s->n_tensors; i++)
            tensors[i] = &s->tensors[i];
        qsort(ops, (size_t)s->n_ops, sizeof *ops, by_op_name);
        qsort(tensors, (size_t)s->n_tensors, sizeof *tensors, by_tensor_name);
        for (int i = 0; i < step->n_ops; i++) {
            const ps_op *op = &step->ops[i];
            if (op->pass != PS_PASS_UPDATE || stage_of_layer[op->layer] != k)
                continue;
            ps_plan_op key_op = {.name = op->name};
            const ps_plan_op *kp = &key_op, **po = bsearch(&kp, ops, (size_t)s->n_ops,
                                                           sizeof *ops, by_op_name);
            if (po == NULL) {
                st = ps_error_set(err, PS_ERR_INVALID, "stage %d has no strategy for %s", k,
                                  op->name);
                goto out;
            }
            for (int q = 0; q < op->n_in && q < (*po)->n_in; q++) {
                const ps_tensor *t = &step->tensors[op->in[q]];
                ps_plan_tensor key_t = {.name = t->name};
                const ps_plan_tensor *kt = &key_t, **pt = bsearch(
                    &kt, tensors, (size_t)s->n_tensors, sizeof *tensors, by_tensor_name);
                if (pt == NULL) {
                    st = ps_error_set(err, PS_ERR_INVALID, "stage %d has no layout for %s", k,
                                      t->name);
                    goto out;
                }
                nics[k].update_nic_s += reshard_nic_s(mesh[k], &t->desc, &(*pt)->spec,
                                                      &(*po)->in[q]);
                if (op->kind == PS_OP_ADAM && q != 1)
                    nics[k].update_nic_s += reshard_nic_s(mesh[k], &t->desc, &(*po)->in[q],
                                                          &(*pt)->spec);
            }
        }
    }
out:
    free(ops);
    free(tensors);
    return st;
}

ps_status ps_plan_stage_links(const ps_plan *p, const ps_graph *step, bool local_allgather,
                              ps_stage_link **out, int *n_out, ps_stage_nics *stage_nics,
                              ps_error *err)
{
    ps_status st = PS_OK;
    int n = p->n_stages, max_layer = 0;
    int *stage_of_layer = NULL;
    unsigned char *reads = NULL;
    crossing *cross = NULL;
    int n_cross = 0, cap_cross = 0, n_links = 0;
    ps_stage_link *links = NULL;
    ps_logical_mesh **mesh = calloc((size_t)(n > 0 ? n : 1), sizeof *mesh);
    nic_load nics = {.bytes = calloc(2 * (size_t)p->cluster->nodes, sizeof *nics.bytes),
                     .devices = calloc(2 * (size_t)p->cluster->nodes, sizeof *nics.devices)};
    *out = NULL;
    *n_out = 0;
    PS_TRY_ALLOC(mesh, err);
    PS_TRY_ALLOC(nics.bytes, err);
    PS_TRY_ALLOC(nics.devices, err);
    nic_load_reset(&nics, p->cluster->nodes);
    for (int k = 0; k < n; k++)
        if (p->stages[k].last_layer > max_layer)
            max_layer = p->stages[k].last_layer;
    for (int i = 0; i < step->n_ops; i++)
        if (step->ops[i].layer > max_layer)
            max_layer = step->ops[i].layer;
    stage_of_layer = malloc(((size_t)max_layer + 1) * sizeof *stage_of_layer);
    /* reads[t * n + b]: stage b reads tensor t (n is small: <= 64 in practice) */
    reads = calloc((size_t)step->n_tensors * (size_t)n + 1, 1);
    PS_TRY_ALLOC(stage_of_layer, err);
    PS_TRY_ALLOC(reads, err);
    for (int l = 0; l <= max_layer; l++)
        stage_of_layer[l] = -1;
    for (int k = 0; k < n; k++)
        for (int l = p->stages[k].first_layer; l <= p->stages[k].last_layer; l++)
            stage_of_layer[l] = k;
    /* what each stage reads from another: the first reader's pass decides
     * when it is received (planner/lower.c classifies the same way) */
    for (int i = 0; i < step->n_ops; i++) {
        const ps_op *op = &step->ops[i];
        int b = stage_of_layer[op->layer];
        if (b < 0)
            continue;
        for (int q = 0; q < op->n_in; q++) {
            int t = op->in[q];
            const ps_tensor *x = &step->tensors[t];
            if (reads[(size_t)t * n + b])
                continue;
            reads[(size_t)t * n + b] = 1;
            if (x->producer < 0)
                continue;
            int a = stage_of_layer[step->ops[x->producer].layer];
            if (a < 0 || a == b)
                continue;
            PS_TRY(add_crossing(&cross, &n_cross, &cap_cross, t, a, b,
                                kind_of(step->ops[x->producer].pass, op->pass), err));
        }
    }
    /* parameters (and their state) read by a stage whose update is another's:
     * the owner sends the updated value after its update */
    for (int i = 0; i < step->n_ops; i++) {
        const ps_op *op = &step->ops[i];
        int a = stage_of_layer[op->layer];
        if (op->kind != PS_OP_ADAM || a < 0)
            continue;
        for (int q = 0; q < op->n_in; q++) {
            int t = op->in[q];
            if (q == 1 || step->tensors[t].producer >= 0)
                continue; /* input 1 is the gradient */
            for (int b = 0; b < n; b++)
                if (b != a && reads[(size_t)t * n + b])
                    PS_TRY(add_crossing(&cross, &n_cross, &cap_cross, t, a, b, PS_LINK_PARAM_COPY,
                                        err));
        }
    }
    for (int k = 0; k < n && (n_cross > 0 || stage_nics != NULL); k++) {
        const ps_plan_stage *s = &p->stages[k];
        PS_TRY(ps_mesh_create(p->cluster, s->devices[0], s->submesh[0], s->submesh[1],
                              s->logical_mesh[0], s->logical_mesh[1], &mesh[k], err));
        for (int i = 0; i < s->n_devices; i++) /* the plan's device order */
            mesh[k]->devices[i] = s->devices[i];
    }
    if (n_cross > 1) /* one stage: nothing crosses, and cross is NULL */
        qsort(cross, (size_t)n_cross, sizeof *cross, by_link);
    links = calloc((size_t)(n_cross > 0 ? n_cross : 1), sizeof *links);
    PS_TRY_ALLOC(links, err);
    for (int i = 0; i < n_cross; i++) {
        const crossing *x = &cross[i];
        ps_stage_link *l = n_links > 0 ? &links[n_links - 1] : NULL;
        if (l == NULL || l->from != x->from || l->to != x->to || l->kind != x->kind) {
            if (l != NULL)
                link_nics(l, &nics, p->cluster);
            nic_load_reset(&nics, p->cluster->nodes);
            l = &links[n_links++];
            *l = (ps_stage_link){.from = x->from, .to = x->to, .kind = x->kind};
        }
        double reduce_s, reduce_nic_s, seconds;
        PS_TRY(price(p, step, mesh, x, local_allgather, &nics, &reduce_s, &reduce_nic_s, &seconds,
                     err));
        l->reduce_s += reduce_s;
        l->reduce_nic_s += reduce_nic_s;
        l->tensors++;
        const ps_tensor *t = &step->tensors[x->tensor];
        l->bytes += (double)ps_tensor_numel(t) * ps_dtype_size(t->desc.dtype);
        l->seconds += seconds;
    }
    if (n_links > 0)
        link_nics(&links[n_links - 1], &nics, p->cluster);
    if (stage_nics != NULL)
        PS_TRY(stage_update_nics(p, step, stage_of_layer, mesh, stage_nics, err));
    *out = links;
    *n_out = n_links;
    links = NULL;
out:
    for (int k = 0; k < n && mesh; k++)
        ps_mesh_free(mesh[k]);
    free(mesh);
    free(nics.bytes);
    free(nics.devices);
    free(nics.through);
    free(links);
    free(cross);
    free(reads);
    free(stage_of_layer);
    return st;
}

/* ---- the schedule ---- */

/* The i-th kernel of stage k's micro-batch order: its micro-batch, and
 * whether it is a backward. */
static int order_at(int k, int n, int m, bool gpipe, int i, bool *backward)
{
    int warm = gpipe ? m : (n - k - 1 < m ? n - k - 1 : m);
    if (i < warm) {
        *backward = false;
        return i;
    }
    int j = i - warm;
    if (j < 2 * (m - warm)) {
        *backward = j % 2 == 1;
        return *backward ? j / 2 : warm + j / 2;
    }
    *backward = true;
    return m - warm + (j - 2 * (m - warm));
}

/* What holds NICs while it runs: a link's transfer (moving at full speed,
 * it uses `use` of each NIC it crosses, one direction) or a stage's own
 * collective (all the NICs of its nodes, both ways). */
typedef struct flow {
    double seconds, use;
    double weight;         /* its flows at once through a NIC (at least 1) */
    int node[2], nodes[2]; /* side 0 sends, 1 receives */
} flow;

/* One step of a stage's part of the schedule: computing for dur (flow -1),
 * of which `compute` first on shared cores (0: none), or flow `flow` once
 * op `after` has ended (-1: nothing to wait for); what it is, for the
 * spans. */
typedef struct sched_op {
    int flow;
    int after;
    double dur, compute;
    ps_pipeline_span_kind kind;
    int micro_batch; /* -1: once per step */
} sched_op;

/* Link x's share of the NIC it crosses when it moves at full speed. */
static double nic_use(const ps_stage_link *x)
{
    return x->nic_s > 0 && x->seconds > 0 ? x->nic_s / x->seconds : 0;
}

/* The phases in which a stage reduces what it sends (schedule_ops), and
 * its update's own collectives: a stage's flows after the links'. */
enum { PH_FORWARD, PH_BACKWARD, PH_ACCUMULATED, PH_UPDATE_SENDS, PH_UPDATE, PH_COUNT };

/* When the sender of a link of that kind reduces what it sends. */
static int reduce_phase(ps_link_kind kind)
{
    switch (kind) {
    case PS_LINK_FORWARD: return PH_FORWARD;
    case PS_LINK_BACKWARD: return PH_BACKWARD;
    case PS_LINK_ACCUMULATED: return PH_ACCUMULATED;
    default: return PH_UPDATE_SENDS; /* after its update */
    }
}

/* The flows: the links', then per stage per phase its collective across
 * its nodes (seconds 0: none). *out malloc'ed. */
static flow *make_flows(int n, const ps_stage_link *links, int n_links,
                        const ps_stage_nics *nics)
{
    flow *f = calloc((size_t)n_links + (size_t)n * PH_COUNT + 1, sizeof *f);
    if (f == NULL)
        return NULL;
    for (int l = 0; l < n_links; l++) {
        const ps_stage_link *x = &links[l];
        f[l] = (flow){.seconds = x->seconds, .use = nic_use(x),
                      .weight = x->nic_flows > 1 ? x->nic_flows : 1};
        for (int side = 0; side < 2; side++) {
            f[l].node[side] = x->nic_node[side];
            f[l].nodes[side] = x->nic_nodes[side];
        }
    }
    for (int l = 0; l < n_links && nics != NULL; l++) {
        const ps_stage_link *x = &links[l];
        int ph = reduce_phase(x->kind);
        f[n_links + x->from * PH_COUNT + ph].seconds += x->reduce_nic_s;
    }
    for (int k = 0; k < n && nics != NULL; k++)
        f[n_links + k * PH_COUNT + PH_UPDATE].seconds = nics[k].update_nic_s;
    for (int k = 0; k < n && nics != NULL; k++)
        for (int ph = 0; ph < PH_COUNT; ph++) {
            flow *x = &f[n_links + k * PH_COUNT + ph];
            if (nics[k].nodes < 2 || x->seconds <= 0) {
                x->seconds = 0; /* within a node: computes */
                continue;
            }
            x->use = 1;
            x->weight = nics[k].nic_flows > 1 ? nics[k].nic_flows : 1;
            x->node[0] = x->node[1] = nics[k].node;
            x->nodes[0] = x->nodes[1] = nics[k].nodes;
        }
    return f;
}

/* The compute of stage k's kernel of phase ph on shared cores (cores NULL:
 * none): its compute fraction of the stage's time for the phase, at most
 * what of that time the kernel runs (`runs`: its collectives across nodes
 * are ops of their own). */
static double compute_part(const ps_shared_cores *cores, int k, int ph, double phase_s, double runs)
{
    if (cores == NULL || !(phase_s > 0))
        return 0;
    double f = cores->stages[k].compute[ph];
    return fmin(runs, phase_s * (f > 0 ? (f < 1 ? f : 1) : 0));
}

/* The ops of every stage in the lowering's order, stage k's from at[k]:
 * each micro-batch kernel's receives (its links in link order), then the
 * kernel and the reductions of the partial sums it sends; after the last,
 * the reductions of what it accumulated for others, the receives of the
 * contributions and updated values its update reads, the update with the
 * reductions of what it sends, and the receives of the parameter copies.
 * A reduction's or the update's collectives across the stage's nodes are
 * ops of their own (flows n_links + k * PH_COUNT + phase): a reduction's
 * after its other steps, the update's before its compute.
 * *ops and *at malloc'ed (at: n + 1 entries). */
static bool schedule_ops(int n, const double *forward_s, const double *backward_s,
                         const double *update_s, const ps_stage_link *links, int n_links,
                         const flow *flows, const ps_shared_cores *cores, int m, bool gpipe,
                         sched_op **ops_out, int **at_out)
{
    /* per stage: its micro-batch links in per phase, its reductions after a
     * kernel per phase, after the kernels and after the update */
    int *in_count = calloc(2 * (size_t)n, sizeof *in_count), *at = calloc((size_t)n + 1, sizeof *at);
    double *reduce = calloc(PH_COUNT * (size_t)n, sizeof *reduce); /* [k * PH_COUNT + phase] */
    /* the last op of each kernel ([(k * m + mb) * 2 + backward]), then of
     * each stage's accumulated reductions and of its update */
    int *kernel_op = malloc(((size_t)n * m * 2 + 2 * (size_t)n) * sizeof *kernel_op);
    sched_op *ops = NULL;
    bool ok = false;
    if (in_count == NULL || at == NULL || reduce == NULL || kernel_op == NULL)
        goto out;
    for (int l = 0; l < n_links; l++) {
        const ps_stage_link *x = &links[l];
        int ph = reduce_phase(x->kind);
        if (ph <= PH_BACKWARD)
            in_count[x->to * 2 + ph]++;
        reduce[x->from * PH_COUNT + ph] += x->reduce_s;
    }
    /* what runs across nodes is an op of its own; the rest computes */
    for (int k = 0; k < n; k++)
        for (int ph = 0; ph < PH_UPDATE; ph++)
            reduce[k * PH_COUNT + ph] -= flows[n_links + k * PH_COUNT + ph].seconds;
    for (int k = 0; k < n; k++) {
        int count = 2 * m + m * (in_count[k * 2] + in_count[k * 2 + 1]) + 2;
        for (int ph = 0; ph < PH_COUNT; ph++) {
            int times = ph <= PH_BACKWARD ? m : 1;
            count += times * (flows[n_links + k * PH_COUNT + ph].seconds > 0);
        }
        for (int l = 0; l < n_links; l++)
            count += links[l].to == k && links[l].kind >= PS_LINK_ACCUMULATED;
        at[k + 1] = at[k] + count;
    }
    ops = malloc((size_t)(at[n] > 0 ? at[n] : 1) * sizeof *ops);
    if (ops == NULL)
        goto out;
    /* a receive's `after` is first the key of what it waits for (the
     * sender's kernel of its micro-batch, its accumulated reductions or its
     * update: index into kernel_op), made an op once every op has its place */
    size_t acc_key = (size_t)n * m * 2, upd_key = acc_key + (size_t)n;
#define STAGE_FLOW(k, ph, mb)                                                                   \
    do {                                                                                        \
        int f_ = n_links + (k) * PH_COUNT + (ph);                                               \
        if (flows[f_].seconds > 0)                                                              \
            ops[o++] = (sched_op){.flow = f_, .after = -1, .kind = PS_SPAN_STAGE_NICS,          \
                                  .micro_batch = (mb)};                                         \
    } while (0)
    for (int k = 0; k < n; k++) {
        int o = at[k];
        for (int i = 0; i < 2 * m; i++) {
            bool bwd;
            int mb = order_at(k, n, m, gpipe, i, &bwd);
            ps_link_kind want = bwd ? PS_LINK_BACKWARD : PS_LINK_FORWARD;
            for (int l = 0; l < n_links; l++)
                if (links[l].to == k && links[l].kind == want)
                    ops[o++] = (sched_op){
                        .flow = l, .after = (int)(((size_t)links[l].from * m + mb) * 2 + bwd),
                        .kind = PS_SPAN_RECEIVE, .micro_batch = mb};
            int ph = bwd ? PH_BACKWARD : PH_FORWARD;
            double kernel = bwd ? backward_s[k] : forward_s[k];
            ops[o++] = (sched_op){
                .flow = -1,
                .dur = kernel + fmax(0, reduce[k * PH_COUNT + ph]),
                .compute = compute_part(cores, k, bwd ? PS_PHASE_BACKWARD : PS_PHASE_FORWARD,
                                        kernel, kernel),
                .kind = bwd ? PS_SPAN_BACKWARD : PS_SPAN_FORWARD,
                .micro_batch = mb};
            STAGE_FLOW(k, ph, mb);
            kernel_op[((size_t)k * m + mb) * 2 + bwd] = o - 1;
        }
        ops[o++] = (sched_op){.flow = -1, .dur = fmax(0, reduce[k * PH_COUNT + PH_ACCUMULATED]),
                              .kind = PS_SPAN_ACCUMULATED, .micro_batch = -1};
        STAGE_FLOW(k, PH_ACCUMULATED, -1);
        kernel_op[acc_key + k] = o - 1;
        for (int l = 0; l < n_links; l++)
            if (links[l].to == k &&
                (links[l].kind == PS_LINK_ACCUMULATED || links[l].kind == PS_LINK_UPDATE))
                ops[o++] = (sched_op){
                    .flow = l,
                    .after = (int)((links[l].kind == PS_LINK_ACCUMULATED ? acc_key : upd_key) +
                                   (size_t)links[l].from),
                    .kind = PS_SPAN_RECEIVE, .micro_batch = -1};
        STAGE_FLOW(k, PH_UPDATE, -1);
        double upd = fmax(0, update_s[k] - flows[n_links + k * PH_COUNT + PH_UPDATE].seconds);
        ops[o++] = (sched_op){.flow = -1,
                              .dur = upd + fmax(0, reduce[k * PH_COUNT + PH_UPDATE_SENDS]),
                              .compute = compute_part(cores, k, PS_PHASE_UPDATE, update_s[k], upd),
                              .kind = PS_SPAN_UPDATE,
                              .micro_batch = -1};
        STAGE_FLOW(k, PH_UPDATE_SENDS, -1);
        kernel_op[upd_key + k] = o - 1;
        for (int l = 0; l < n_links; l++)
            if (links[l].to == k && links[l].kind == PS_LINK_PARAM_COPY)
                ops[o++] = (sched_op){.flow = l,
                                      .after = (int)(upd_key + (size_t)links[l].from),
                                      .kind = PS_SPAN_RECEIVE, .micro_batch = -1};
    }
#undef STAGE_FLOW
    for (int i = 0; i < at[n]; i++)
        if (ops[i].flow >= 0 && ops[i].flow < n_links)
            ops[i].after = kernel_op[ops[i].after];
    *ops_out = ops;
    *at_out = at;
    ops = NULL;
    at = NULL;
    ok = true;
out:
    free(in_count);
    free(at);
    free(reduce);
    free(kernel_op);
    free(ops);
    return ok;
}

/* The speeds of the flows under way (act: n of them), each a fraction of
 * its speed alone (rate): water-filling over the NICs, every flow's share
 * of a NIC min(level * weight, use), the level raised for all until a NIC
 * fills (the flows through it stop there) or a flow reaches full speed.
 * used and weights: [node * 2 + side] scratch, zero on entry and on
 * return; share and frozen: n entries. */
static void share_nics(const flow *const *act, int n, double *used, double *weights,
                       double *share, unsigned char *frozen, double *rate)
{
    for (int i = 0; i < n; i++)
        frozen[i] = 0;
    for (int left = n; left > 0;) {
        for (int i = 0; i < n; i++)
            for (int side = 0; side < 2 && !frozen[i]; side++)
                for (int j = act[i]->node[side]; j < act[i]->node[side] + act[i]->nodes[side]; j++)
                    weights[j * 2 + side] += act[i]->weight;
        /* each flow's bound: its full speed, or the level at which the
         * first of its NICs fills; the lowest bounds stop at it */
        double level = INFINITY;
        for (int i = 0; i < n; i++) {
            if (frozen[i])
                continue;
            double b = act[i]->use / act[i]->weight;
            for (int side = 0; side < 2; side++)
                for (int j = act[i]->node[side]; j < act[i]->node[side] + act[i]->nodes[side]; j++)
                    b = fmin(b, fmax(0, 1 - used[j * 2 + side]) / weights[j * 2 + side]);
            share[i] = b; /* (its bound, for now) */
            level = fmin(level, b);
        }
        for (int i = 0; i < n; i++)
            for (int side = 0; side < 2 && !frozen[i]; side++)
                for (int j = act[i]->node[side]; j < act[i]->node[side] + act[i]->nodes[side]; j++)
                    weights[j * 2 + side] = 0;
        for (int i = 0; i < n; i++) {
            if (frozen[i] || share[i] > level)
                continue;
            frozen[i] = 1;
            left--;
            share[i] = fmin(level * act[i]->weight, act[i]->use);
            for (int side = 0; side < 2; side++)
                for (int j = act[i]->node[side]; j < act[i]->node[side] + act[i]->nodes[side]; j++)
                    used[j * 2 + side] += share[i];
        }
    }
    for (int i = 0; i < n; i++) {
        rate[i] = share[i] / act[i]->use; /* (a flow under way uses its NICs) */
        for (int side = 0; side < 2; side++)
            for (int j = act[i]->node[side]; j < act[i]->node[side] + act[i]->nodes[side]; j++)
                used[j * 2 + side] = 0;
    }
}

/* The spans of the ops that ran (start, end; a kernel's compute on shared
 * cores until computed): the kernels always, transfers, reductions and
 * collectives where they took time. */
static bool spans_of(int n, const sched_op *ops, const int *at, const double *start,
                     const double *end, const double *computed, const double *lock,
                     const double *paused, ps_pipeline_span **out, int *n_out)
{
    ps_pipeline_span *v = malloc((size_t)(at[n] > 0 ? at[n] : 1) * sizeof *v);
    int count = 0;
    if (v == NULL)
        return false;
    for (int k = 0; k < n; k++)
        for (int i = at[k]; i < at[k + 1]; i++) {
            const sched_op *op = &ops[i];
            if (!(end[i] > start[i] || op->kind == PS_SPAN_FORWARD ||
                  op->kind == PS_SPAN_BACKWARD || op->kind == PS_SPAN_UPDATE))
                continue;
            v[count++] = (ps_pipeline_span){
                .stage = k,
                .kind = op->kind,
                .micro_batch = op->micro_batch,
                .link = op->kind == PS_SPAN_RECEIVE ? op->flow : -1,
                .start_s = start[i],
                .end_s = end[i],
                .charged_compute_s = op->compute,
                .compute_s = op->compute > 0 ? computed[i] - start[i] - paused[i] : 0,
                .lockstep_s = lock[i]};
        }
    *out = v;
    if (n_out != NULL)
        *n_out = count;
    return true;
}

/* Per stage computing on shared cores (state[k] 3), its speed: the
 * compute share it was charged, times the fraction of its speed alone the
 * busiest of its nodes leaves it. load: the nodes' scratch, zero on entry
 * and on return. */
static void share_cores(int n, const ps_shared_cores *cores, const unsigned char *state,
                        double *load, double *rate)
{
    for (int k = 0; k < n; k++)
        for (int j = 0; j < cores->stages[k].nodes && state[k] == 3; j++)
            load[cores->stages[k].node + j] += cores->stages[k].devices_per_node;
    for (int k = 0; k < n; k++) {
        if (state[k] != 3)
            continue;
        double most = 0;
        for (int j = 0; j < cores->stages[k].nodes; j++)
            most = fmax(most, load[cores->stages[k].node + j]);
        /* never below 1, the charged speed: a stage's devices_per_node is
         * its most on any of its nodes, so an irregular placement can
         * count more devices on a node than compute there */
        rate[k] = fmax(1, cores->share * (most > cores->cores ? cores->cores / most : 1));
    }
    for (int k = 0; k < n; k++)
        for (int j = 0; j < cores->stages[k].nodes && state[k] == 3; j++)
            load[cores->stages[k].node + j] = 0;
}

/* Whether stage j is runnable on node `node`: computing on its shared
 * cores or waiting for one in a lockstep delay (states 3 and 4). */
static bool runnable_on(const ps_shared_cores *cores, const unsigned char *state, int j, int node)
{
    const ps_stage_cores *x = &cores->stages[j];
    return (state[j] == 3 || state[j] == 4) && node >= x->node && node - x->node < x->nodes;
}

/* The runnable devices of the stages other than k on stage k's first node
 * (the simulator counts those of the meeting's node outside it). */
static int computing_beside(int n, const ps_shared_cores *cores, const unsigned char *state, int k)
{
    int count = 0;
    for (int j = 0; j < n; j++)
        if (j != k && runnable_on(cores, state, j, cores->stages[k].node))
            count += cores->stages[j].devices_per_node;
    return count;
}

/* The lockstep delay of stage k once its op on flow f has moved, where
 * that is a receive (a link's flow, with *w >= 0), as the node's devices run
 * now (the sender aside): *w, the alone-seconds it computed before since its
 * previous meeting; then -1. */
static double receive_lockstep(int n, const ps_shared_cores *cores, const unsigned char *state,
                               int k, const ps_stage_link *links, int n_links, int f, double *w)
{
    double since = *w;
    *w = -1;
    if (since < 0 || f < 0 || f >= n_links)
        return 0;
    int from = links[f].from;
    int other = computing_beside(n, cores, state, k) -
                (runnable_on(cores, state, from, cores->stages[k].node) ? 1 : 0);
    return ps_lockstep_delay_s(cores->slice_s, cores->cores, other, 2, since);
}

/* A kernel computing on shared cores meets as its compute goes: meeting i
 * of its phase's `total` alone-seconds once the share of its compute that
 * lies before it is done. The progress of stage k's kernel through them. */
typedef struct kernel_meets {
    int ph, next;   /* its phase; its next meeting */
    double total;   /* its alone-seconds of compute */
    double through; /* alone-seconds up to its next meeting */
    double carry;   /* alone-seconds computed before it since the last meeting */
} kernel_meets;

/* What of a kernel's `compute` (charged seconds) is left when it reaches its
 * next meeting. */
static double meeting_left(const kernel_meets *q, double compute)
{
    return q->total > 0 ? compute * fmax(0, 1 - q->through / q->total) : 0;
}

/* Stage k's kernel of phase ph starting, having computed *since
 * alone-seconds since its last meeting: its progress through its meetings
 * (none passed yet); *since becomes what it computes after its last. */
static kernel_meets meets_start(const ps_shared_cores *cores, int k, int ph, double *since)
{
    const ps_stage_cores *c = &cores->stages[k];
    kernel_meets q = {.ph = ph, .carry = *since, .total = c->tail_s[ph]};
    for (int i = 0; i < c->n_meetings[ph]; i++)
        q.total += c->meetings[ph][i].before_s;
    q.through = c->n_meetings[ph] > 0 ? c->meetings[ph][0].before_s : 0;
    *since = c->n_meetings[ph] > 0 ? c->tail_s[ph] : *since + c->tail_s[ph];
    return q;
}

/* The lockstep delays of stage k's meetings due with `left` of its
 * kernel's `compute` to go (all that remain where `all`), while `other`
 * devices compute beside it; on to the next. */
static double meetings_due(const ps_shared_cores *cores, int k, kernel_meets *q, double compute,
                           double left, int other, bool all)
{
    const ps_stage_cores *c = &cores->stages[k];
    double delay = 0;
    while (q->next < c->n_meetings[q->ph] &&
           (all || left <= meeting_left(q, compute) + 1e-12 * compute)) {
        const ps_meeting *x = &c->meetings[q->ph][q->next];
        delay += ps_lockstep_delay_s(cores->slice_s, cores->cores, other, x->members,
                                     q->carry + x->before_s);
        q->carry = 0;
        if (++q->next < c->n_meetings[q->ph])
            q->through += c->meetings[q->ph][q->next].before_s;
    }
    return delay;
}

static int phase_of_span(ps_pipeline_span_kind kind)
{
    return kind == PS_SPAN_FORWARD    ? PS_PHASE_FORWARD
           : kind == PS_SPAN_BACKWARD ? PS_PHASE_BACKWARD
           : kind == PS_SPAN_UPDATE   ? PS_PHASE_UPDATE
                                      : -1;
}

/* Whether the shared cores describe n stages on nodes 0 to nodes - 1. */
static bool cores_valid(const ps_shared_cores *c, int n, int *nodes)
{
    *nodes = 0;
    if (c == NULL)
        return true;
    if (c->stages == NULL || !(c->cores > 0) || !(c->share > 0) || !(c->slice_s >= 0))
        return false;
    for (int k = 0; k < n; k++) {
        const ps_stage_cores *x = &c->stages[k];
        if (x->node < 0 || x->nodes < 1 || x->devices_per_node < 1 || x->node > INT_MAX - x->nodes)
            return false;
        for (int ph = 0; ph < PS_PHASE_COUNT && c->slice_s > 0; ph++) {
            if (x->n_meetings[ph] < 0 || (x->n_meetings[ph] > 0 && x->meetings[ph] == NULL) ||
                !(x->tail_s[ph] >= 0 && x->tail_s[ph] < INFINITY))
                return false;
            for (int i = 0; i < x->n_meetings[ph]; i++)
                if (!(x->meetings[ph][i].before_s >= 0 && x->meetings[ph][i].before_s < INFINITY))
                    return false;
        }
        *nodes = x->node + x->nodes > *nodes ? x->node + x->nodes : *nodes;
    }
    return true;
}

double ps_pipeline_schedule(int n, const double *forward_s, const double *backward_s,
                            const double *update_s, const ps_stage_link *links, int n_links,
                            const ps_stage_nics *nics, int micro_batches, bool gpipe,
                            ps_pipeline_span **spans_out, int *n_spans_out)
{
    return ps_pipeline_schedule_shared(n, forward_s, backward_s, update_s, links, n_links, nics,
                                       NULL, micro_batches, gpipe, spans_out, n_spans_out);
}

/* The stages' ops run as events in time: a stage runs its ops in turn; a
 * receive starts once its sender's op has ended (the receiver asks first,
 * as receives block). A flow through NICs moves at the speed the NICs'
 * max-min fair sharing leaves it (share_nics); a kernel on shared cores
 * computes at the speed the cores leave it (share_cores), then runs the
 * rest of its time. */
double ps_pipeline_schedule_shared(int n, const double *forward_s, const double *backward_s,
                                   const double *update_s, const ps_stage_link *links, int n_links,
                                   const ps_stage_nics *nics, const ps_shared_cores *cores,
                                   int micro_batches, bool gpipe, ps_pipeline_span **spans_out,
                                   int *n_spans_out)
{
    int m = micro_batches;
    if (spans_out != NULL)
        *spans_out = NULL;
    if (n_spans_out != NULL)
        *n_spans_out = 0;
    int core_nodes = 0;
    if (n <= 0 || m <= 0 || !cores_valid(cores, n, &core_nodes))
        return NAN;
    sched_op *ops = NULL;
    int *at = NULL;
    flow *flows = make_flows(n, links, n_links, nics);
    if (flows == NULL || !schedule_ops(n, forward_s, backward_s, update_s, links, n_links, flows,
                                       cores, m, gpipe, &ops, &at)) {
        free(flows);
        return NAN;
    }
    int n_flows = n_links + n * PH_COUNT;
    int nodes = 0; /* the NICs the flows cross: load[node * 2 + side] */
    for (int i = 0; i < n_flows; i++)
        for (int side = 0; side < 2 && flows[i].use > 0; side++)
            if (flows[i].node[side] + flows[i].nodes[side] > nodes)
                nodes = flows[i].node[side] + flows[i].nodes[side];
    double *end = malloc((size_t)at[n] * sizeof *end);     /* each op's end; NAN: not yet */
    double *start = malloc((size_t)at[n] * sizeof *start); /* and its start */
    double *computed = malloc((size_t)at[n] * sizeof *computed); /* its compute's end */
    double *lock = calloc(2 * ((size_t)at[n] + 1), sizeof *lock); /* its lockstep delays */
    double *paused = lock + at[n] + 1; /* of them, those that paused its compute */
    kernel_meets *meets = calloc((size_t)n, sizeof *meets);
    /* per stage: alone-seconds computed since its last meeting; those before
     * the receive under way, whose lockstep delay follows its transfer (-1:
     * none); and when its kernel's compute reaches its next meeting */
    double *since = calloc(3 * (size_t)n, sizeof *since), *recv_w = since + n;
    double *meet_at = recv_w + n;
    long stalled = 0; /* events in a row that did not move the clock */
    bool lockstep = cores != NULL && cores->slice_s > 0;
    /* after a lockstep pause (state 4): 3 compute, 1 the kernel's rest, 0 the op ends */
    unsigned char *resume = calloc((size_t)n, 1);
    int *cur = malloc((size_t)n * sizeof *cur);        /* each stage's op under way */
    /* an op under way: when a fixed one ends (finish), or what a flow
     * through NICs has left at full speed or a compute on shared cores at
     * its charged speed (left, moving at rate; then the kernel's rest) */
    double *finish = malloc(6 * (size_t)n * sizeof *finish), *left = finish + n, *rate = left + n;
    double *share = rate + n, *act_rate = share + n; /* share_nics' */
    double *rest = act_rate + n;
    double *core_load = calloc((size_t)core_nodes + 1, sizeof *core_load);
    const flow **act = malloc((size_t)n * sizeof *act);
    int *act_stage = malloc((size_t)n * sizeof *act_stage);
    /* 0 not started, 1 fixed, 2 through NICs, 3 computing on shared cores,
     * 4 a lockstep delay (runnable, waiting for a core, until finish) */
    unsigned char *state = calloc((size_t)n, 1);
    unsigned char *frozen = calloc((size_t)n, 1);
    double *load = calloc(4 * (size_t)nodes + 1, sizeof *load); /* used, then weights */
    double result = NAN, now = 0;
    if (end == NULL || start == NULL || computed == NULL || cur == NULL || finish == NULL ||
        state == NULL || load == NULL || act == NULL || act_stage == NULL || frozen == NULL ||
        core_load == NULL || lock == NULL || since == NULL || meets == NULL || resume == NULL)
        goto out;
    for (int i = 0; i < at[n]; i++)
        end[i] = NAN;
    for (int k = 0; k < n; k++)
        cur[k] = at[k];
    for (;;) {
        /* start what may start now; what takes no time ends now */
        for (bool changed = true; changed;) {
            changed = false;
            for (int k = 0; k < n; k++)
                while (cur[k] < at[k + 1] && state[k] == 0) {
                    const sched_op *op = &ops[cur[k]];
                    double d = op->dur;
                    if (op->flow >= 0) {
                        if (op->after >= 0 && isnan(end[op->after]))
                            break; /* its data is not ready */
                        d = flows[op->flow].seconds;
                        recv_w[k] = -1;
                        if (lockstep && op->flow < n_links) {
                            /* a receive: the sender and it meet once it has moved */
                            recv_w[k] = since[k];
                            resume[k] = 0;
                            since[k] = 0;
                        }
                        if (flows[op->flow].use > 0) {
                            state[k] = 2;
                            left[k] = d;
                            start[cur[k]] = now;
                            changed = true;
                            break;
                        }
                    } else if (lockstep && phase_of_span(op->kind) >= 0 && !(op->compute > 0)) {
                        /* nothing computing on the cores: its meetings at once */
                        meets[k] = meets_start(cores, k, phase_of_span(op->kind), &since[k]);
                        lock[cur[k]] = meetings_due(cores, k, &meets[k], 0, 0,
                                                    computing_beside(n, cores, state, k), true);
                        d += lock[cur[k]];
                    }
                    start[cur[k]] = computed[cur[k]] = now;
                    if (op->flow < 0 && op->compute > 0) {
                        state[k] = 3;
                        left[k] = op->compute;
                        rest[k] = fmax(0, d - op->compute);
                        int ph = phase_of_span(op->kind);
                        if (lockstep && ph >= 0) {
                            /* its meetings as its compute reaches them */
                            meets[k] = meets_start(cores, k, ph, &since[k]);
                            double delay =
                                meetings_due(cores, k, &meets[k], op->compute, left[k],
                                             computing_beside(n, cores, state, k), false);
                            if (delay > 0) {
                                state[k] = 4;
                                finish[k] = now + delay;
                                lock[cur[k]] += delay;
                                paused[cur[k]] += delay;
                                resume[k] = 3;
                            }
                        }
                        break;
                    }
                    if (d > 0) {
                        state[k] = 1;
                        finish[k] = now + d;
                        break;
                    }
                    if (op->flow >= 0) { /* a receive that moved nothing */
                        double delay = receive_lockstep(n, cores, state, k, links, n_links,
                                                        op->flow, &recv_w[k]);
                        if (delay > 0) {
                            lock[cur[k]] = delay;
                            state[k] = 4;
                            finish[k] = now + delay;
                            break;
                        }
                    }
                    end[cur[k]++] = now;
                    changed = true;
                }
        }
        /* the flows' speeds: the NICs shared among them */
        bool busy = false;
        int n_act = 0;
        for (int k = 0; k < n; k++) {
            busy |= state[k] != 0;
            if (state[k] == 2) {
                act_stage[n_act] = k;
                act[n_act++] = &flows[ops[cur[k]].flow];
            }
        }
        if (!busy)
            break; /* everything ended, or the links wait for each other */
        share_nics(act, n_act, load, load + 2 * (size_t)nodes, share, frozen, act_rate);
        if (cores != NULL)
            share_cores(n, cores, state, core_load, rate);
        double next = INFINITY;
        for (int i = 0; i < n_act; i++)
            rate[act_stage[i]] = act_rate[i];
        for (int k = 0; k < n; k++) {
            meet_at[k] = INFINITY;
            if (state[k] == 1 || state[k] == 4)
                next = fmin(next, finish[k]);
            if (state[k] == 2 || state[k] == 3)
                next = fmin(next, now + left[k] / rate[k]);
            if (state[k] == 3 && lockstep &&
                meets[k].next < cores->stages[k].n_meetings[meets[k].ph]) {
                /* decided by time, as the compute's end: (left - mark) / rate
                 * can round below the clock's resolution */
                double mark = meeting_left(&meets[k], ops[cur[k]].compute);
                meet_at[k] = now + fmax(0, left[k] - mark) / rate[k];
                next = fmin(next, meet_at[k]);
            }
        }
        /* every event is at or after now; where none moves the clock, some
         * op must end or start, else the schedule is stuck (a bug: refuse) */
        if (!(next >= now) || (next == now && ++stalled > 4 * (long)at[n] + 16))
            goto out;
        if (next > now)
            stalled = 0;
        /* on to the next end */
        for (int k = 0; k < n; k++) {
            if (state[k] == 1 && finish[k] <= next) {
                double delay = receive_lockstep(n, cores, state, k, links, n_links,
                                                ops[cur[k]].flow, &recv_w[k]);
                if (delay > 0) { /* received: then its lockstep delay */
                    lock[cur[k]] = delay;
                    state[k] = 4;
                    finish[k] += delay;
                } else {
                    end[cur[k]++] = finish[k];
                    state[k] = 0;
                }
            } else if (state[k] == 2 && now + left[k] / rate[k] <= next) {
                double delay = receive_lockstep(n, cores, state, k, links, n_links,
                                                ops[cur[k]].flow, &recv_w[k]);
                if (delay > 0) {
                    lock[cur[k]] = delay;
                    state[k] = 4;
                    finish[k] = next + delay;
                } else {
                    end[cur[k]++] = next; /* (the same sum that made next) */
                    state[k] = 0;
                }
            } else if (state[k] == 3 && now + left[k] / rate[k] <= next) {
                computed[cur[k]] = next; /* then the kernel's rest, at its time */
                double delay = 0;
                if (lockstep && phase_of_span(ops[cur[k]].kind) >= 0)
                    /* the meetings after its last compute, then its rest */
                    delay = meetings_due(cores, k, &meets[k], ops[cur[k]].compute, 0,
                                         computing_beside(n, cores, state, k), true);
                if (delay > 0) {
                    lock[cur[k]] += delay;
                    state[k] = 4;
                    finish[k] = next + delay;
                    resume[k] = 1;
                } else {
                    state[k] = rest[k] > 0 ? 1 : 0;
                    finish[k] = next + rest[k];
                    if (state[k] == 0)
                        end[cur[k]++] = next;
                }
            } else if (state[k] == 4 && finish[k] <= next) {
                /* the meeting's members go on: computing, the kernel's rest, or
                 * the receive has ended */
                if (resume[k] == 3) {
                    state[k] = 3;
                } else if (resume[k] == 1 && rest[k] > 0) {
                    state[k] = 1;
                    finish[k] += rest[k];
                } else {
                    end[cur[k]++] = finish[k];
                    state[k] = 0;
                }
            } else if (state[k] == 2 || state[k] == 3) {
                left[k] -= (next - now) * rate[k];
                double compute = ops[cur[k]].compute;
                if (state[k] == 3 && meet_at[k] <= next) {
                    /* at a meeting: its members wait for the one preempted */
                    left[k] = fmin(left[k], meeting_left(&meets[k], compute));
                    double delay = meetings_due(cores, k, &meets[k], compute, left[k],
                                                computing_beside(n, cores, state, k), false);
                    if (delay > 0) {
                        state[k] = 4;
                        finish[k] = next + delay;
                        lock[cur[k]] += delay;
                        paused[cur[k]] += delay;
                        resume[k] = 3;
                    }
                }
            }
        }
        now = next;
    }
    result = 0;
    for (int k = 0; k < n && !isnan(result); k++)
        result = cur[k] < at[k + 1] ? NAN : fmax(result, end[at[k + 1] - 1]);
    if (spans_out != NULL && !isnan(result) &&
        !spans_of(n, ops, at, start, end, computed, lock, paused, spans_out, n_spans_out))
        result = NAN;
out:
    free(start);
    free(computed);
    free(lock);
    free(since);
    free(meets);
    free(resume);
    free(core_load);
    free(flows);
    free(ops);
    free(at);
    free(end);
    free(cur);
    free(finish);
    free(state);
    free(frozen);
    free(act);
    free(act_stage);
    free(load);
    return result;
}

double ps_pipeline_iteration_s(int n, const double *forward_s, const double *backward_s,
                               const double *update_s, const ps_stage_link *links,
                               int n_links, const ps_stage_nics *nics, int micro_batches,
                               bool gpipe)
{
    return ps_pipeline_schedule(n, forward_s, backward_s, update_s, links, n_links, nics,
                                micro_batches, gpipe, NULL, NULL);
}

/* Each stage's place on the shared cores of cluster c: its nodes, its most
 * devices on one, and per phase the fraction of its time that computes, by
 * its ops' predicted compute and communication (the plan lists the step
 * graph's ops, each with its own time; an op's pass, found by name in the
 * step graph, gives its phase: the recomputation is the backward's). */
static ps_status stage_cores(const ps_plan *p, const ps_graph *step, ps_stage_cores *out,
                             ps_error *err)
{
    ps_status st = PS_OK;
    int dpn = p->cluster->devices_per_node, most = 1;
    for (int k = 0; k < p->n_stages; k++)
        most = p->stages[k].n_ops > most ? p->stages[k].n_ops : most;
    const ps_plan_op **ops = malloc((size_t)most * sizeof *ops);
    unsigned char *phase = malloc((size_t)most);
    int *per_node = calloc((size_t)p->cluster->nodes, sizeof *per_node);
    PS_TRY_ALLOC(ops, err);
    PS_TRY_ALLOC(phase, err);
    PS_TRY_ALLOC(per_node, err);
    for (int k = 0; k < p->n_stages; k++) {
        const ps_plan_stage *s = &p->stages[k];
        ps_stage_cores *c = &out[k];
        int lo = INT_MAX, hi = -1;
        c->devices_per_node = 1;
        for (int i = 0; i < s->n_devices; i++) {
            int node = s->devices[i] / dpn;
            lo = node < lo ? node : lo;
            hi = node > hi ? node : hi;
            if (++per_node[node] > c->devices_per_node)
                c->devices_per_node = per_node[node];
        }
        for (int i = 0; i < s->n_devices; i++)
            per_node[s->devices[i] / dpn] = 0;
        c->node = lo;
        c->nodes = hi - lo + 1;
        /* each op's phase: by name in the step graph (one it lacks: the forward's) */
        for (int i = 0; i < s->n_ops; i++) {
            ops[i] = &s->ops[i];
            phase[i] = PS_PHASE_FORWARD;
        }
        qsort(ops, (size_t)s->n_ops, sizeof *ops, by_op_name);
        for (int i = 0; i < step->n_ops; i++) {
            const ps_op *op = &step->ops[i];
            if (op->pass == PS_PASS_FORWARD || op->layer < s->first_layer ||
                op->layer > s->last_layer)
                continue;
            ps_plan_op key = {.name = op->name};
            const ps_plan_op *kp = &key,
                             **po = bsearch(&kp, ops, (size_t)s->n_ops, sizeof *ops, by_op_name);
            if (po != NULL)
                phase[po - ops] = op->pass == PS_PASS_UPDATE ? PS_PHASE_UPDATE : PS_PHASE_BACKWARD;
        }
        double compute[PS_PHASE_COUNT] = {0}, total[PS_PHASE_COUNT] = {0};
        for (int i = 0; i < s->n_ops; i++) {
            compute[phase[i]] += fmax(0, ops[i]->compute_s);
            total[phase[i]] += fmax(0, ops[i]->compute_s) + fmax(0, ops[i]->comm_s);
        }
        for (int ph = 0; ph < PS_PHASE_COUNT; ph++)
            c->compute[ph] = total[ph] > 0 ? compute[ph] / total[ph] : 1;
    }
out:
    free(ops);
    free(phase);
    free(per_node);
    return st;
}

/* Each stage's kernels' meetings (their collectives, in order) and what
 * they compute after the last, in alone-seconds, as plan p's lowered
 * programs run them (the simulator's lockstep delays follow the same
 * instructions). *store: malloc'ed, the meetings out[] borrows. */
static ps_status stage_meetings(const ps_plan *p, ps_stage_cores *out, ps_meeting **store,
                                ps_error *err)
{
    ps_status st = PS_OK;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_lower_options lo = ps_lower_options_default();
    *store = NULL;
    PS_TRY(ps_plan_model_build(p, &m, err));
    PS_TRY(ps_plan_lower(p, m, &lo, &set, err));
    if (set->n_stages != p->n_stages) {
        st = ps_error_set(err, PS_ERR_INVALID, "the lowered programs have %d stages, the plan %d",
                          set->n_stages, p->n_stages);
        goto out;
    }
    size_t count = 0;
    for (int i = 0; i < set->n_kernels; i++)
        for (int j = 0; j < set->kernels[i].n_instrs; j++)
            count += set->kernels[i].instrs[j].kind == PS_INSTR_COLLECTIVE;
    *store = malloc((count > 0 ? count : 1) * sizeof **store);
    PS_TRY_ALLOC(*store, err);
    ps_meeting *next = *store;
    for (int k = 0; k < p->n_stages; k++) {
        const ps_program_stage *ps = &set->stages[k];
        double share = ps->compute_share > 1 ? ps->compute_share : 1;
        for (int ph = 0; ph < PS_PHASE_COUNT; ph++) {
            int ki = ps->kernel[ph];
            out[k].meetings[ph] = next;
            out[k].n_meetings[ph] = 0;
            out[k].tail_s[ph] = 0;
            if (ki < 0 || ki >= set->n_kernels)
                continue;
            const ps_kernel *kn = &set->kernels[ki];
            double alone = 0;
            for (int i = 0; i < kn->n_instrs; i++) {
                const ps_instr *in = &kn->instrs[i];
                if (in->kind == PS_INSTR_COMPUTE || in->kind == PS_INSTR_SLICE) {
                    alone += fmax(0, in->seconds) / share;
                } else if (in->kind == PS_INSTR_COLLECTIVE) {
                    int g = in->axis >= 0 && in->axis < PS_MESH_AXES ? ps->mesh[in->axis]
                                                                     : ps->mesh[0] * ps->mesh[1];
                    *next++ = (ps_meeting){.before_s = alone, .members = g};
                    out[k].n_meetings[ph]++;
                    alone = 0;
                }
            }
            out[k].tail_s[ph] = alone;
        }
    }
out:
    ps_program_set_free(set);
    ps_plan_model_free(m);
    return st;
}

ps_status ps_plan_pipeline_schedule(const ps_plan *p, const ps_graph *step,
                                    ps_pipeline_span **spans, int *n_spans,
                                    ps_stage_link **links_out, int *n_links_out,
                                    double *iteration_s, ps_error *err)
{
    ps_status st = PS_OK;
    int n = p->n_stages, n_links = 0;
    ps_stage_link *links = NULL;
    double *t = malloc(3 * (size_t)(n > 0 ? n : 1) * sizeof *t);
    ps_stage_nics *nics = calloc((size_t)(n > 0 ? n : 1), sizeof *nics);
    ps_stage_cores *on_cores = NULL;
    ps_meeting *meetings = NULL;
    ps_shared_cores shared = {.cores = p->cluster->shared_cores_per_node,
                              .share = ps_cluster_compute_share(p->cluster)};
    if (spans != NULL) {
        *spans = NULL;
        *n_spans = 0;
    }
    *iteration_s = NAN;
    if (links_out != NULL) {
        *links_out = NULL;
        *n_links_out = 0;
    }
    PS_TRY_ALLOC(t, err);
    PS_TRY_ALLOC(nics, err);
    /* as the planner priced them (planner/inter_pass.c): the lowering's default */
    PS_TRY(ps_plan_stage_links(p, step, ps_lower_options_default().local_allgather, &links,
                               &n_links, nics, err));
    for (int l = 0; l < n_links; l++)
        PS_LOG_DEBUG("pipeshard: link %d -> %d (kind %d): %d tensors, %.4g MB, reduce %.4g ms, "
                     "transfer %.4g ms, of which %.4g ms on the NICs of nodes %d-%d out, %d-%d in",
                     links[l].from, links[l].to, (int)links[l].kind, links[l].tensors,
                     links[l].bytes / 1e6, links[l].reduce_s * 1e3, links[l].seconds * 1e3,
                     links[l].nic_s * 1e3, links[l].nic_node[0],
                     links[l].nic_node[0] + links[l].nic_nodes[0] - 1, links[l].nic_node[1],
                     links[l].nic_node[1] + links[l].nic_nodes[1] - 1);
    for (int k = 0; k < n; k++) {
        t[k] = p->stages[k].forward_s;
        t[n + k] = p->stages[k].backward_s;
        t[2 * n + k] = p->stages[k].update_s;
        if (nics[k].update_nic_s > 0)
            PS_LOG_DEBUG("pipeshard: stage %d's update: %.4g ms of %.4g ms on the NICs of nodes "
                         "%d-%d",
                         k, nics[k].update_nic_s * 1e3, p->stages[k].update_s * 1e3,
                         nics[k].node, nics[k].node + nics[k].nodes - 1);
    }
    if (shared.share > 1) {
        on_cores = calloc((size_t)(n > 0 ? n : 1), sizeof *on_cores);
        PS_TRY_ALLOC(on_cores, err);
        PS_TRY(stage_cores(p, step, on_cores, err));
        shared.stages = on_cores;
        shared.slice_s = p->cluster->scheduler_slice_s;
        if (shared.slice_s > 0)
            PS_TRY(stage_meetings(p, on_cores, &meetings, err));
    }
    *iteration_s = ps_pipeline_schedule_shared(
        n, t, t + n, t + 2 * n, links, n_links, nics, shared.stages != NULL ? &shared : NULL,
        p->micro_batches, strcmp(p->schedule, "gpipe") == 0, spans, n_spans);
    if (links_out != NULL) {
        *links_out = links;
        *n_links_out = n_links;
        links = NULL;
    }
out:
    free(links);
    free(t);
    free(nics);
    free(on_cores);
    free(meetings);
    return st;
}

double *ps_pipeline_receive_seconds(int n_stages, const ps_pipeline_span *spans, int n_spans)
{
    double *r = calloc((size_t)(n_stages > 0 ? n_stages : 1), sizeof *r);
    for (int i = 0; r != NULL && i < n_spans; i++)
        if (spans[i].kind == PS_SPAN_RECEIVE && spans[i].stage >= 0 && spans[i].stage < n_stages)
            r[spans[i].stage] += spans[i].end_s - spans[i].start_s;
    return r;
}

/* Per stage and phase, the mean of `of` over its kernels of that phase
 * (`shared`: those that computed on shared cores; a phase's kernels all do
 * or none does: then `none`). */
static double *per_kernel_mean(int n_stages, const ps_pipeline_span *spans, int n_spans,
                               double (*of)(const ps_pipeline_span *), bool shared, double none)
{
    size_t n = PS_PHASE_COUNT * (size_t)(n_stages > 0 ? n_stages : 1);
    double *r = calloc(2 * n, sizeof *r), *kernels = r + n; /* r: first the sums */
    if (r == NULL)
        return NULL;
    for (int i = 0; i < n_spans; i++) {
        const ps_pipeline_span *x = &spans[i];
        int ph = phase_of_span(x->kind);
        if (ph < 0 || x->stage < 0 || x->stage >= n_stages ||
            (shared && !(x->charged_compute_s > 0)))
            continue;
        size_t at = (size_t)x->stage * PS_PHASE_COUNT + (size_t)ph;
        r[at] += of(x);
        kernels[at] += 1;
    }
    for (size_t i = 0; i < n; i++)
        r[i] = kernels[i] > 0 ? r[i] / kernels[i] : none;
    return r;
}

static double saved_of(const ps_pipeline_span *x)
{
    return x->charged_compute_s - x->compute_s - x->lockstep_s;
}

static double wall_of(const ps_pipeline_span *x)
{
    return x->compute_s;
}

double *ps_pipeline_compute_saved_s(int n_stages, const ps_pipeline_span *spans, int n_spans)
{
    /* every kernel: one that computed nothing on the cores may still have
     * met (its saving then the lockstep delays, negated) */
    return per_kernel_mean(n_stages, spans, n_spans, saved_of, false, 0);
}

double *ps_pipeline_compute_wall_s(int n_stages, const ps_pipeline_span *spans, int n_spans)
{
    return per_kernel_mean(n_stages, spans, n_spans, wall_of, true, -1);
}
