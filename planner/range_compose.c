#include "planner/range_compose.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A tensor produced in one layer and read in another, with its ids in
 * both layers' slices. */
typedef struct crossing {
    int tensor;             /* in the step */
    int group;              /* the tensor, numbered among the crossing tensors */
    int producer, reader;   /* layers */
    int in_producer, in_reader; /* the tensor's id in each layer's slice */
    bool forward;           /* made by the forward pass: kept when a backward reads it */
} crossing;

struct ps_layer_crossings {
    int n_layers, n, n_groups;
    int *slice_tensors; /* [n_layers] each layer's slice's tensor count */
    crossing *list; /* by the later of the two layers */
    int *start;     /* [n_layers + 1]: list[start[i] .. start[i + 1]) end at layer i */
    /* scratch of ps_range_compose */
    int *stamp;     /* [n_groups] the sweep that kept the tensor */
    int sweep;
    double *act, *transient; /* [n_layers] each layer's share inside the range */
};

void ps_layer_crossings_free(ps_layer_crossings *x)
{
    if (x == NULL)
        return;
    free(x->slice_tensors);
    free(x->list);
    free(x->start);
    free(x->stamp);
    free(x->act);
    free(x->transient);
    free(x);
}

int ps_layer_crossings_count(const ps_layer_crossings *x)
{
    return x != NULL ? x->n : 0;
}

int ps_layer_crossings_layers(const ps_layer_crossings *x)
{
    return x != NULL ? x->n_layers : 0;
}

ps_status ps_layer_crossings_build(const ps_graph *step, ps_layer_crossings **out,
                                   ps_error *err)
{
    int L = step->n_layers, T = step->n_tensors;
    ps_layer_crossings *x = calloc(1, sizeof *x);
    int *slice_of = malloc(((size_t)T + 1) * sizeof *slice_of);
    int *own = malloc(((size_t)T + 1) * sizeof *own);      /* id in its producer's slice */
    int *read_at = malloc(((size_t)T + 1) * sizeof *read_at); /* last reader layer listed */
    int *group = malloc(((size_t)T + 1) * sizeof *group);
    crossing *found = NULL;
    int cap = 0;
    *out = NULL;
    if (x == NULL || slice_of == NULL || own == NULL || read_at == NULL || group == NULL)
        goto nomem;
    x->n_layers = L;
    x->slice_tensors = calloc((size_t)L + 1, sizeof *x->slice_tensors);
    if (x->slice_tensors == NULL)
        goto nomem;
    for (int t = 0; t < T; t++)
        own[t] = read_at[t] = group[t] = -1;
    for (int q = 0; q < L; q++) {
        x->slice_tensors[q] = ps_graph_slice_numbering(step, q, q, slice_of);
        for (int i = 0; i < step->n_ops; i++) {
            const ps_op *op = &step->ops[i];
            if (op->layer != q)
                continue;
            for (int k = 0; k < op->n_out; k++)
                own[op->out[k]] = slice_of[op->out[k]];
            for (int k = 0; k < op->n_in; k++) {
                int t = op->in[k], p = step->tensors[t].producer;
                if (p < 0 || step->ops[p].layer == q || read_at[t] == q)
                    continue;
                read_at[t] = q;
                if (x->n == cap) {
                    int grown = cap > 0 ? 2 * cap : 64;
                    crossing *more = realloc(found, (size_t)grown * sizeof *more);
                    if (more == NULL)
                        goto nomem;
                    found = more;
                    cap = grown;
                }
                if (group[t] < 0)
                    group[t] = x->n_groups++;
                found[x->n++] = (crossing){.tensor = t, .group = group[t], .producer = step->ops[p].layer,
                                           .reader = q, .in_reader = slice_of[t],
                                           .forward = step->ops[p].pass == PS_PASS_FORWARD};
            }
        }
    }
    /* the producer's ids are known once every layer is numbered (a gradient
     * passed back is made by a later layer); then order by the later layer */
    x->start = calloc((size_t)L + 2, sizeof *x->start);
    x->list = malloc(((size_t)x->n + 1) * sizeof *x->list);
    x->stamp = calloc((size_t)x->n_groups + 1, sizeof *x->stamp);
    x->act = calloc((size_t)L + 1, sizeof *x->act);
    x->transient = calloc((size_t)L + 1, sizeof *x->transient);
    if (x->start == NULL || x->list == NULL || x->stamp == NULL || x->act == NULL ||
        x->transient == NULL)
        goto nomem;
    for (int c = 0; c < x->n; c++) {
        crossing *f = &found[c];
        f->in_producer = own[f->tensor];
        int later = f->producer > f->reader ? f->producer : f->reader;
        x->start[later + 1]++;
    }
    for (int i = 0; i < L; i++)
        x->start[i + 1] += x->start[i];
    int *next = malloc(((size_t)L + 1) * sizeof *next); /* the next free place per layer */
    if (next == NULL)
        goto nomem;
    memcpy(next, x->start, (size_t)L * sizeof *next);
    for (int c = 0; c < x->n; c++) {
        int later = found[c].producer > found[c].reader ? found[c].producer : found[c].reader;
        x->list[next[later]++] = found[c];
    }
    free(next);
    free(found);
    free(slice_of);
    free(own);
    free(read_at);
    free(group);
    *out = x;
    return PS_OK;
nomem:
    free(found);
    free(slice_of);
    free(own);
    free(read_at);
    free(group);
    ps_layer_crossings_free(x);
    return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
}

ps_status ps_range_compose(ps_layer_crossings *x, int first, int n_entries,
                           const ps_stage_entry *const *single,
                           const ps_entry_tensors *const *tensors, ps_stage_entry *const *out,
                           ps_error *err)
{
    double *act = x->act, *transient = x->transient;
    for (int q = first; q < x->n_layers; q++)
        for (int e = 0; e < n_entries; e++)
            if (tensors[q][e].n != x->slice_tensors[q])
                return ps_error_set(err, PS_ERR_INTERNAL,
                                    "composing layers: layer %d's entry %d describes %d tensors, "
                                    "its slice has %d",
                                    q, e, tensors[q][e].n, x->slice_tensors[q]);
    for (int e = 0; e < n_entries; e++) {
        ps_stage_entry sum = {.ok = true};
        int sweep = ++x->sweep;
        for (int i = first; i < x->n_layers; i++) {
            const ps_stage_entry *s = &single[i][e];
            sum.ok = sum.ok && s->ok;
            sum.need_bytes += s->need_bytes;
            sum.time_s += s->time_s;
            sum.forward_s += s->forward_s;
            sum.update_s += s->update_s;
            sum.static_bytes += s->static_bytes;
            sum.update_bytes = fmax(sum.update_bytes, s->update_bytes); /* layer by layer */
            act[i] = s->act_bytes;
            transient[i] = s->transient_bytes;
            for (int c = x->start[i]; c < x->start[i + 1] && sum.ok; c++) {
                const crossing *k = &x->list[c];
                if (k->reader < first)
                    continue; /* a gradient sent back before the stage */
                const ps_entry_tensors *tr = &tensors[k->reader][e];
                double kept = tr->bytes[tr->n + k->in_reader];
                if (k->producer < first) {
                    /* received from before the stage, once: kept by the
                     * first of its layers that keeps it */
                    if (kept > 0 && x->stamp[k->group] == sweep)
                        act[k->reader] -= kept;
                    else if (kept > 0)
                        x->stamp[k->group] = sweep;
                    continue;
                }
                /* not received inside the stage: a gradient passed back is a
                 * temporary from the backward pass that makes it to the one
                 * that reads it; an activation is kept once, as its producer
                 * holds it, until the first layer reading it in its backward
                 * pass is done (backward passes run last layer first) */
                act[k->reader] -= kept;
                if (!k->forward) {
                    for (int m = k->reader; m < k->producer; m++)
                        transient[m] += kept;
                    continue;
                }
                if (!(kept > 0) || x->stamp[k->group] == sweep)
                    continue;
                x->stamp[k->group] = sweep;
                const ps_entry_tensors *tp = &tensors[k->producer][e];
                if (!(tp->bytes[tp->n + k->in_producer] > 0))
                    act[k->reader] += tp->bytes[k->in_producer];
            }
            if (i == first)
                continue;
            out[i][e] = sum; /* absent: only need_bytes, for the message that none fits */
            if (!sum.ok)
                continue;
            /* a micro-batch's peak: during layer q's backward pass the layers
             * after q have freed their activations */
            double later = 0, peak = 0;
            for (int q = i; q >= first; q--) {
                peak = fmax(peak, transient[q] - later);
                later += act[q];
            }
            out[i][e].act_bytes = fmax(0, later); /* all of the range's */
            out[i][e].transient_bytes = peak;
        }
    }
    return PS_OK;
}
