/* See pipeline_time.h. */
#include "planner/pipeline_time.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/array.h"
#include "planner/cost_model.h"
#include "planner/cross_mesh.h"

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

/* Seconds to move tensor x of `step` from stage a's layout to stage b's:
 * the sender's reduction of a partial sum, then the transfers and the
 * receivers' all-gathers. */
/* The bytes one link moves through each node's NIC, each direction. */
typedef struct nic_load {
    double *bytes; /* [node * 2 + side]: side 0 sends, 1 receives */
    int lo[2], hi[2]; /* the nodes it touched so far, each side; lo > hi: none */
} nic_load;

static void nic_load_reset(nic_load *v, int nodes)
{
    for (int side = 0; side < 2; side++) {
        for (int k = v->lo[side]; k <= v->hi[side]; k++)
            v->bytes[k * 2 + side] = 0;
        v->lo[side] = nodes;
        v->hi[side] = -1;
    }
}

static void nic_load_add(nic_load *v, int node, int side, double bytes)
{
    v->bytes[node * 2 + side] += bytes;
    v->lo[side] = node < v->lo[side] ? node : v->lo[side];
    v->hi[side] = node > v->hi[side] ? node : v->hi[side];
}

/* Link l's NICs from what its tensors moved through them (v). */
static void link_nics(ps_stage_link *l, const nic_load *v, const ps_cluster *c)
{
    double bw = c->inter.nics_per_node * c->inter.nic_bandwidth_bytes_per_s, most = 0;
    for (int side = 0; side < 2; side++) {
        l->nic_node[side] = v->hi[side] >= 0 ? v->lo[side] : 0;
        l->nic_nodes[side] = v->hi[side] >= 0 ? v->hi[side] - v->lo[side] + 1 : 0;
        for (int k = v->lo[side]; k <= v->hi[side]; k++)
            most = v->bytes[k * 2 + side] > most ? v->bytes[k * 2 + side] : most;
    }
    l->nic_s = most > 0 && bw > 0 ? c->inter.latency_s + most / bw : 0;
    if (l->nic_s > l->seconds)
        l->nic_s = l->seconds; /* the link's own time bounds its NIC time */
}

static ps_status price(const ps_plan *p, const ps_graph *step, ps_logical_mesh **mesh,
                       const crossing *x, bool local_allgather, nic_load *nics,
                       double *reduce_s, double *seconds, ps_error *err)
{
    ps_status st = PS_OK;
    const ps_tensor *t = &step->tensors[x->tensor];
    const ps_plan_stage *A = &p->stages[x->from], *B = &p->stages[x->to];
    const ps_plan_tensor *ta = plan_tensor_named(A, t->name), *tb = plan_tensor_named(B, t->name);
    ps_cross_plan cp = {0};
    *seconds = *reduce_s = 0;
    if (ta == NULL || tb == NULL)
        return ps_error_set(err, PS_ERR_INVALID, "stage %d has no layout for %s",
                            ta == NULL ? x->from : x->to, t->name);
    ps_sharding_spec sa = ta->spec, sb = tb->spec;
    if (sa.partial) {
        ps_sharding_spec full = sa;
        ps_reshard_step steps[PS_RESHARD_MAX_STEPS];
        full.partial = 0;
        int n = ps_reshard_plan(mesh[x->from], &t->desc, &sa, &full, steps);
        for (int i = 0; i < n; i++)
            *reduce_s += steps[i].seconds;
        sa = full;
    }
    if (sb.partial)
        return ps_error_set(err, PS_ERR_INVALID, "stage %d receives %s as a partial sum", x->to,
                            t->name);
    PS_TRY(ps_cross_mesh_plan(p->cluster, &t->desc, &sa, A->devices, A->logical_mesh, &sb,
                              mesh[x->to], local_allgather, &cp, err));
    *seconds += ps_cross_plan_seconds(&cp, p->cluster);
    for (int i = 0, dpn = p->cluster->devices_per_node; i < cp.n_xfers; i++) {
        const ps_cross_xfer *xf = &cp.xfers[i];
        if (xf->src / dpn != xf->dst / dpn) {
            nic_load_add(nics, xf->src / dpn, 0, xf->bytes);
            nic_load_add(nics, xf->dst / dpn, 1, xf->bytes);
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

ps_status ps_plan_stage_links(const ps_plan *p, const ps_graph *step, bool local_allgather,
                              ps_stage_link **out, int *n_out, ps_error *err)
{
    ps_status st = PS_OK;
    int n = p->n_stages, max_layer = 0;
    int *stage_of_layer = NULL;
    unsigned char *reads = NULL;
    crossing *cross = NULL;
    int n_cross = 0, cap_cross = 0, n_links = 0;
    ps_stage_link *links = NULL;
    ps_logical_mesh **mesh = calloc((size_t)(n > 0 ? n : 1), sizeof *mesh);
    nic_load nics = {.bytes = calloc(2 * (size_t)p->cluster->nodes, sizeof *nics.bytes)};
    *out = NULL;
    *n_out = 0;
    PS_TRY_ALLOC(mesh, err);
    PS_TRY_ALLOC(nics.bytes, err);
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
    for (int k = 0; k < n && n_cross > 0; k++) {
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
        double reduce_s, seconds;
        PS_TRY(price(p, step, mesh, x, local_allgather, &nics, &reduce_s, &seconds, err));
        l->reduce_s += reduce_s;
        l->tensors++;
        const ps_tensor *t = &step->tensors[x->tensor];
        l->bytes += (double)ps_tensor_numel(t) * ps_dtype_size(t->desc.dtype);
        l->seconds += seconds;
    }
    if (n_links > 0)
        link_nics(&links[n_links - 1], &nics, p->cluster);
    *out = links;
    *n_out = n_links;
    links = NULL;
out:
    for (int k = 0; k < n && mesh; k++)
        ps_mesh_free(mesh[k]);
    free(mesh);
    free(nics.bytes);
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

/* One step of a stage's part of the schedule: a kernel (or the update, or
 * reductions) computing for dur, or the receive of a link once the sender's
 * op `after` has ended. */
typedef struct sched_op {
    int link; /* -1: computes */
    int after;
    double dur;
} sched_op;

/* The ops of every stage in the lowering's order, stage k's from at[k]:
 * each micro-batch kernel's receives (its links in link order), then the
 * kernel and the reductions of the partial sums it sends; after the last,
 * the reductions of what it accumulated for others, the receives of the
 * contributions and updated values its update reads, the update with the
 * reductions of what it sends, and the receives of the parameter copies.
 * *ops and *at malloc'ed (at: n + 1 entries). */
static bool schedule_ops(int n, const double *forward_s, const double *backward_s,
                         const double *update_s, const ps_stage_link *links, int n_links,
                         int m, bool gpipe, sched_op **ops_out, int **at_out)
{
    /* per stage: its micro-batch links in per phase, its reductions after a
     * kernel per phase, after the kernels and after the update */
    int *in_count = calloc(2 * (size_t)n, sizeof *in_count), *at = calloc((size_t)n + 1, sizeof *at);
    double *reduce = calloc(4 * (size_t)n, sizeof *reduce); /* [k * 4 + 0|1|2 acc|3 update] */
    /* the op of each kernel ([(k * m + mb) * 2 + backward]), then of each
     * stage's accumulated reductions and of its update */
    int *kernel_op = malloc(((size_t)n * m * 2 + 2 * (size_t)n) * sizeof *kernel_op);
    sched_op *ops = NULL;
    bool ok = false;
    if (in_count == NULL || at == NULL || reduce == NULL || kernel_op == NULL)
        goto out;
    for (int l = 0; l < n_links; l++) {
        const ps_stage_link *x = &links[l];
        if (x->kind == PS_LINK_FORWARD || x->kind == PS_LINK_BACKWARD) {
            int bwd = x->kind == PS_LINK_BACKWARD;
            in_count[x->to * 2 + bwd]++;
            reduce[x->from * 4 + bwd] += x->reduce_s;
        } else {
            reduce[x->from * 4 + (x->kind == PS_LINK_ACCUMULATED ? 2 : 3)] += x->reduce_s;
        }
    }
    for (int k = 0; k < n; k++) {
        int count = 2 * m + m * (in_count[k * 2] + in_count[k * 2 + 1]) + 2;
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
    for (int k = 0; k < n; k++) {
        int o = at[k];
        for (int i = 0; i < 2 * m; i++) {
            bool bwd;
            int mb = order_at(k, n, m, gpipe, i, &bwd);
            ps_link_kind want = bwd ? PS_LINK_BACKWARD : PS_LINK_FORWARD;
            for (int l = 0; l < n_links; l++)
                if (links[l].to == k && links[l].kind == want)
                    ops[o++] = (sched_op){
                        .link = l, .after = (int)(((size_t)links[l].from * m + mb) * 2 + bwd)};
            kernel_op[((size_t)k * m + mb) * 2 + bwd] = o;
            ops[o++] = (sched_op){.link = -1, .dur = (bwd ? backward_s[k] : forward_s[k]) +
                                                     reduce[k * 4 + bwd]};
        }
        kernel_op[acc_key + k] = o;
        ops[o++] = (sched_op){.link = -1, .dur = reduce[k * 4 + 2]};
        for (int l = 0; l < n_links; l++)
            if (links[l].to == k &&
                (links[l].kind == PS_LINK_ACCUMULATED || links[l].kind == PS_LINK_UPDATE))
                ops[o++] = (sched_op){
                    .link = l,
                    .after = (int)((links[l].kind == PS_LINK_ACCUMULATED ? acc_key : upd_key) +
                                   (size_t)links[l].from)};
        kernel_op[upd_key + k] = o;
        ops[o++] = (sched_op){.link = -1, .dur = update_s[k] + reduce[k * 4 + 3]};
        for (int l = 0; l < n_links; l++)
            if (links[l].to == k && links[l].kind == PS_LINK_PARAM_COPY)
                ops[o++] = (sched_op){.link = l, .after = (int)(upd_key + (size_t)links[l].from)};
    }
    for (int i = 0; i < at[n]; i++)
        if (ops[i].link >= 0)
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

/* Link x's share of the NIC it crosses when it moves at full speed. */
static double nic_use(const ps_stage_link *x)
{
    return x->nic_s > 0 && x->seconds > 0 ? x->nic_s / x->seconds : 0;
}

/* The stages' ops run as events in time: a stage runs its ops in turn; a
 * receive starts once its sender's op has ended (the receiver asks first,
 * as receives block). A transfer through NICs moves at the speed its
 * busiest NIC leaves it: on a NIC whose transfers would use more than all
 * of it, each gets its use over their total. */
double ps_pipeline_iteration_s(int n, const double *forward_s, const double *backward_s,
                               const double *update_s, const ps_stage_link *links,
                               int n_links, int micro_batches, bool gpipe)
{
    int m = micro_batches;
    if (n <= 0 || m <= 0)
        return NAN;
    sched_op *ops = NULL;
    int *at = NULL;
    if (!schedule_ops(n, forward_s, backward_s, update_s, links, n_links, m, gpipe, &ops, &at))
        return NAN;
    int nodes = 0; /* the NICs the links cross: load[node * 2 + side] */
    for (int l = 0; l < n_links; l++)
        for (int side = 0; side < 2 && links[l].nic_s > 0; side++)
            if (links[l].nic_node[side] + links[l].nic_nodes[side] > nodes)
                nodes = links[l].nic_node[side] + links[l].nic_nodes[side];
    double *end = malloc((size_t)at[n] * sizeof *end); /* each op's end; NAN: not yet */
    int *cur = malloc((size_t)n * sizeof *cur);        /* each stage's op under way */
    /* an op under way: when a fixed one ends (finish), or what a transfer
     * through NICs has left at full speed (left, moving at rate) */
    double *finish = malloc(3 * (size_t)n * sizeof *finish), *left = finish + n, *rate = left + n;
    unsigned char *state = calloc((size_t)n, 1); /* 0 not started, 1 fixed, 2 through NICs */
    double *load = calloc(2 * (size_t)nodes + 1, sizeof *load);
    double result = NAN, now = 0;
    if (end == NULL || cur == NULL || finish == NULL || state == NULL || load == NULL)
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
                    if (op->link >= 0) {
                        if (isnan(end[op->after]))
                            break; /* its data is not ready */
                        d = links[op->link].seconds;
                        if (nic_use(&links[op->link]) > 0) {
                            state[k] = 2;
                            left[k] = d;
                            changed = true;
                            break;
                        }
                    }
                    if (d > 0) {
                        state[k] = 1;
                        finish[k] = now + d;
                        break;
                    }
                    end[cur[k]++] = now;
                    changed = true;
                }
        }
        /* the transfers' speeds: each NIC's load, then each transfer's
         * share of its busiest */
        bool busy = false;
        for (int k = 0; k < n; k++) {
            busy |= state[k] != 0;
            if (state[k] != 2)
                continue;
            const ps_stage_link *x = &links[ops[cur[k]].link];
            for (int side = 0; side < 2; side++)
                for (int j = x->nic_node[side]; j < x->nic_node[side] + x->nic_nodes[side]; j++)
                    load[j * 2 + side] += nic_use(x);
        }
        if (!busy)
            break; /* everything ended, or the links wait for each other */
        double next = INFINITY;
        for (int k = 0; k < n; k++) {
            if (state[k] == 1)
                next = fmin(next, finish[k]);
            if (state[k] != 2)
                continue;
            const ps_stage_link *x = &links[ops[cur[k]].link];
            double most = 1;
            for (int side = 0; side < 2; side++)
                for (int j = x->nic_node[side]; j < x->nic_node[side] + x->nic_nodes[side]; j++)
                    most = fmax(most, load[j * 2 + side]);
            rate[k] = 1 / most;
            next = fmin(next, now + left[k] / rate[k]);
        }
        for (int k = 0; k < n; k++) /* the loads back to 0: only where they were added */
            for (int side = 0; side < 2 && state[k] == 2; side++) {
                const ps_stage_link *x = &links[ops[cur[k]].link];
                for (int j = x->nic_node[side]; j < x->nic_node[side] + x->nic_nodes[side]; j++)
                    load[j * 2 + side] = 0;
            }
        /* on to the next end */
        for (int k = 0; k < n; k++) {
            if (state[k] == 1 && finish[k] <= next) {
                end[cur[k]++] = finish[k];
                state[k] = 0;
            } else if (state[k] == 2 && now + left[k] / rate[k] <= next) {
                end[cur[k]++] = next; /* (the same sum that made next) */
                state[k] = 0;
            } else if (state[k] == 2) {
                left[k] -= (next - now) * rate[k];
            }
        }
        now = next;
    }
    result = 0;
    for (int k = 0; k < n && !isnan(result); k++)
        result = cur[k] < at[k + 1] ? NAN : fmax(result, end[at[k + 1] - 1]);
out:
    free(ops);
    free(at);
    free(end);
    free(cur);
    free(finish);
    free(state);
    free(load);
    return result;
}
