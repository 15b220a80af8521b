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
static ps_status price(const ps_plan *p, const ps_graph *step, ps_logical_mesh **mesh,
                       const crossing *x, bool local_allgather, double *reduce_s,
                       double *seconds, ps_error *err)
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
    *out = NULL;
    *n_out = 0;
    PS_TRY_ALLOC(mesh, err);
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
            l = &links[n_links++];
            *l = (ps_stage_link){.from = x->from, .to = x->to, .kind = x->kind};
        }
        double reduce_s, seconds;
        PS_TRY(price(p, step, mesh, x, local_allgather, &reduce_s, &seconds, err));
        l->reduce_s += reduce_s;
        l->tensors++;
        const ps_tensor *t = &step->tensors[x->tensor];
        l->bytes += (double)ps_tensor_numel(t) * ps_dtype_size(t->desc.dtype);
        l->seconds += seconds;
    }
    *out = links;
    *n_out = n_links;
    links = NULL;
out:
    for (int k = 0; k < n && mesh; k++)
        ps_mesh_free(mesh[k]);
    free(mesh);
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

/* Stage k's kernel of micro-batch mb (phase bwd) starts when its stage is
 * free and, one link after the other (receives block, and a transfer starts
 * when its receiver asks for it), each link's data is ready and has come;
 * after the kernel the stage reduces the partial sums it sends. */
double ps_pipeline_iteration_s(int n, const double *forward_s, const double *backward_s,
                               const double *update_s, const ps_stage_link *links,
                               int n_links, int micro_batches, bool gpipe)
{
    int m = micro_batches;
    if (n <= 0 || m <= 0)
        return NAN;
    /* ready[(k * m + i) * 2 + backward]: when what stage k's kernel for
     * micro-batch i sends is ready to go */
    double *ready = malloc((size_t)n * (size_t)m * 2 * sizeof *ready);
    double *clock = calloc((size_t)n, sizeof *clock);
    double *ustart = malloc(2 * (size_t)n * sizeof *ustart), *uend = ustart ? ustart + n : NULL;
    int *pos = calloc((size_t)n, sizeof *pos);
    double result = NAN;
    if (ready == NULL || clock == NULL || ustart == NULL || pos == NULL)
        goto out;
    for (size_t i = 0; i < (size_t)n * (size_t)m * 2; i++)
        ready[i] = NAN;
    for (int left = n; left > 0;) {
        bool progress = false;
        for (int k = 0; k < n; k++) {
            while (pos[k] < 2 * m) {
                bool bwd;
                int mb = order_at(k, n, m, gpipe, pos[k], &bwd);
                ps_link_kind want = bwd ? PS_LINK_BACKWARD : PS_LINK_FORWARD;
                bool ok = true;
                for (int l = 0; l < n_links && ok; l++)
                    if (links[l].to == k && links[l].kind == want)
                        ok = !isnan(ready[((size_t)links[l].from * m + mb) * 2 + bwd]);
                if (!ok)
                    break;
                double t = clock[k];
                for (int l = 0; l < n_links; l++)
                    if (links[l].to == k && links[l].kind == want)
                        t = fmax(t, ready[((size_t)links[l].from * m + mb) * 2 + bwd]) +
                            links[l].seconds;
                t += bwd ? backward_s[k] : forward_s[k];
                for (int l = 0; l < n_links; l++)
                    if (links[l].from == k && links[l].kind == want)
                        t += links[l].reduce_s;
                clock[k] = t;
                ready[((size_t)k * m + mb) * 2 + bwd] = t;
                progress = true;
                if (++pos[k] == 2 * m)
                    left--;
            }
        }
        if (!progress)
            goto out; /* the links wait for each other */
    }
    /* the update: a stage first reduces what it accumulated for others,
     * then receives the contributions and updated values its update reads */
    for (int k = 0; k < n; k++) {
        for (int l = 0; l < n_links; l++)
            if (links[l].from == k && links[l].kind == PS_LINK_ACCUMULATED)
                clock[k] += links[l].reduce_s;
        uend[k] = NAN;
    }
    for (int round = 0, done = 0; done < n; round++) {
        if (round > n)
            goto out; /* update links in a cycle */
        done = 0;
        for (int k = 0; k < n; k++) {
            double t = clock[k];
            bool ok = true;
            for (int l = 0; l < n_links && ok; l++) {
                if (links[l].to != k)
                    continue;
                if (links[l].kind == PS_LINK_ACCUMULATED)
                    t = fmax(t, clock[links[l].from]) + links[l].seconds;
                else if (links[l].kind == PS_LINK_UPDATE && isnan(uend[links[l].from]))
                    ok = false;
                else if (links[l].kind == PS_LINK_UPDATE)
                    t = fmax(t, uend[links[l].from]) + links[l].seconds;
            }
            if (!ok)
                continue;
            ustart[k] = t;
            t += update_s[k];
            for (int l = 0; l < n_links; l++)
                if (links[l].from == k &&
                    (links[l].kind == PS_LINK_UPDATE || links[l].kind == PS_LINK_PARAM_COPY))
                    t += links[l].reduce_s;
            uend[k] = t;
            done++;
        }
    }
    /* the step ends with the updated values received after the update */
    result = 0;
    for (int k = 0; k < n; k++) {
        double t = uend[k];
        for (int l = 0; l < n_links; l++)
            if (links[l].to == k && links[l].kind == PS_LINK_PARAM_COPY)
                t = fmax(t, uend[links[l].from]) + links[l].seconds;
        result = fmax(result, t);
    }
out:
    free(ready);
    free(clock);
    free(ustart);
    free(pos);
    return result;
}
