#include "planner/layer_cluster.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ps_layering_clear(ps_layering *l)
{
    free(l->op_layer);
    free(l->flops);
    free(l->boundary_bytes);
    free(l->cut_bytes);
    memset(l, 0, sizeof *l);
}

static ps_status fill_stats(const ps_graph *g, ps_layering *l, ps_error *err)
{
    l->flops = calloc((size_t)l->n_layers, sizeof *l->flops);
    l->boundary_bytes = calloc((size_t)l->n_layers, sizeof *l->boundary_bytes);
    l->cut_bytes = calloc((size_t)l->n_layers, sizeof *l->cut_bytes);
    int *last_reader = malloc(((size_t)g->n_tensors + 1) * sizeof *last_reader);
    if (l->flops == NULL || l->boundary_bytes == NULL || l->cut_bytes == NULL ||
        last_reader == NULL) {
        free(last_reader);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    for (int t = 0; t < g->n_tensors; t++)
        last_reader[t] = -1;
    unsigned char *seen = calloc((size_t)g->n_tensors * (size_t)l->n_layers + 1, 1);
    if (seen == NULL) {
        free(last_reader);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        int q = l->op_layer[i];
        l->flops[q] += op->cost.flops;
        for (int k = 0; k < op->n_in; k++) {
            const ps_tensor *t = &g->tensors[op->in[k]];
            if (t->producer < 0 || l->op_layer[t->producer] >= q)
                continue;
            if (q > last_reader[op->in[k]])
                last_reader[op->in[k]] = q;
            unsigned char *s = &seen[(size_t)op->in[k] * l->n_layers + q];
            if (!*s) {
                *s = 1;
                l->boundary_bytes[q] += ps_tensor_bytes(t);
            }
        }
    }
    free(seen);
    /* a tensor crosses every cut between its producer's layer and its last
     * reader's */
    for (int t = 0; t < g->n_tensors; t++)
        if (last_reader[t] >= 0)
            for (int b = l->op_layer[g->tensors[t].producer] + 1; b <= last_reader[t]; b++)
                l->cut_bytes[b] += ps_tensor_bytes(&g->tensors[t]);
    free(last_reader);
    return PS_OK;
}

/* Lexicographic objective of a prefix: (largest input, total input, largest
 * layer FLOPs). */
typedef struct score {
    double max_in, sum_in, max_flops;
} score;

static bool better(score a, score b)
{
    if (a.max_in != b.max_in)
        return a.max_in < b.max_in;
    if (a.sum_in != b.sum_in)
        return a.sum_in < b.sum_in;
    return a.max_flops < b.max_flops;
}

static ps_status cluster_once(const ps_graph *g, int L, double eps, int *op_layer, bool *found,
                              ps_error *err)
{
    ps_status st = PS_OK;
    int K = g->n_ops;
    double *prefix = malloc(((size_t)K + 1) * sizeof *prefix);
    double *in = malloc(((size_t)K + 2) * sizeof *in);
    int *counted = malloc(((size_t)g->n_tensors + 1) * sizeof *counted);
    score *f = malloc((size_t)(L + 1) * ((size_t)K + 1) * sizeof *f);
    int *arg = malloc((size_t)(L + 1) * ((size_t)K + 1) * sizeof *arg);
    PS_TRY_ALLOC(prefix, err);
    PS_TRY_ALLOC(in, err);
    PS_TRY_ALLOC(counted, err);
    PS_TRY_ALLOC(f, err);
    PS_TRY_ALLOC(arg, err);
    prefix[0] = 0;
    for (int i = 0; i < K; i++)
        prefix[i + 1] = prefix[i] + g->ops[i].cost.flops;
    double bound = (1 + eps) * prefix[K] / L;
    score inf = {INFINITY, INFINITY, INFINITY};
#define FF(q, r) f[(size_t)(q) * ((size_t)K + 1) + (r)]
#define AA(q, r) arg[(size_t)(q) * ((size_t)K + 1) + (r)]
    for (int q = 0; q <= L; q++)
        for (int r = 0; r <= K; r++)
            FF(q, r) = inf;
    FF(0, 0) = (score){0, 0, 0};
    for (int t = 0; t < g->n_tensors; t++)
        counted[t] = -1;
    for (int k = 0; k < K; k++) {
        /* in[r]: activation bytes produced before op k and read in [k, r) */
        int r_max = k + 1;
        while (r_max < K && prefix[r_max + 1] - prefix[k] <= bound)
            r_max++;
        for (int r = k; r <= r_max + 1 && r <= K + 1; r++)
            in[r] = 0;
        for (int c = k; c < r_max; c++) {
            const ps_op *op = &g->ops[c];
            for (int j = 0; j < op->n_in; j++) {
                int t = op->in[j];
                int p = g->tensors[t].producer;
                if (p >= 0 && p < k && counted[t] != k) {
                    counted[t] = k;
                    in[c + 1] += ps_tensor_bytes(&g->tensors[t]);
                }
            }
        }
        for (int r = k + 1; r <= r_max; r++)
            in[r] += in[r - 1];
        for (int q = 1; q <= L; q++) {
            score base = FF(q - 1, k);
            if (!isfinite(base.max_in))
                continue;
            for (int r = k + 1; r <= r_max; r++) {
                double layer = prefix[r] - prefix[k];
                if (layer > bound)
                    break;
                score s = {fmax(base.max_in, in[r]), base.sum_in + in[r],
                           fmax(base.max_flops, layer)};
                if (better(s, FF(q, r))) {
                    FF(q, r) = s;
                    AA(q, r) = k;
                }
            }
        }
    }
    *found = isfinite(FF(L, K).max_in);
    if (*found) {
        int r = K;
        for (int q = L; q >= 1; q--) {
            int k = AA(q, r);
            for (int i = k; i < r; i++)
                op_layer[i] = q - 1;
            r = k;
        }
    }
#undef FF
#undef AA
out:
    free(prefix);
    free(in);
    free(counted);
    free(f);
    free(arg);
    return st;
}

ps_status ps_layer_cluster_auto(const ps_graph *fwd, int n_layers, double eps, ps_layering *out,
                                ps_error *err)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < fwd->n_ops; i++)
        if (fwd->ops[i].pass != PS_PASS_FORWARD)
            return ps_error_set(err, PS_ERR_INVALID, "layer clustering wants a forward graph");
    if (n_layers < 1 || n_layers > fwd->n_ops)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cannot cluster %d ops into %d layers (1 to %d)", fwd->n_ops,
                            n_layers, fwd->n_ops);
    out->op_layer = malloc(((size_t)fwd->n_ops + 1) * sizeof *out->op_layer);
    if (out->op_layer == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    out->n_layers = n_layers;
    bool found = false;
    double e = eps;
    for (int attempt = 0; attempt < 4 && !found; attempt++, e *= 2) {
        ps_status st = cluster_once(fwd, n_layers, e, out->op_layer, &found, err);
        if (st != PS_OK) {
            ps_layering_clear(out);
            return st;
        }
        out->eps_used = e;
    }
    if (!found) {
        ps_layering_clear(out);
        return ps_error_set(err, PS_ERR_INFEASIBLE,
                            "no split of %s into %d layers keeps each within %.0f%% of the "
                            "average FLOPs (one op is too large); use fewer layers",
                            fwd->name, n_layers, 100 * (1 + eps * 8));
    }
    ps_status st = fill_stats(fwd, out, err);
    if (st != PS_OK)
        ps_layering_clear(out);
    return st;
}

ps_status ps_layer_cluster_manual(const ps_graph *fwd, ps_layering *out, ps_error *err)
{
    memset(out, 0, sizeof *out);
    out->op_layer = malloc(((size_t)fwd->n_ops + 1) * sizeof *out->op_layer);
    if (out->op_layer == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < fwd->n_ops; i++) {
        int q = 0;
        while (q < fwd->n_boundaries && fwd->boundaries[q] < fwd->ops[i].layer)
            q++;
        out->op_layer[i] = q;
    }
    out->n_layers = fwd->n_boundaries + 1;
    ps_status st = fill_stats(fwd, out, err);
    if (st != PS_OK)
        ps_layering_clear(out);
    return st;
}

ps_status ps_graph_relayer(const ps_graph *fwd, const ps_layering *l, ps_graph **out,
                           ps_error *err)
{
    ps_graph *g = NULL;
    *out = NULL;
    if (ps_graph_clone(fwd, &g) != PS_OK)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].producer < 0)
            g->tensors[t].layer = l->n_layers; /* lowered to the first reader below */
    for (int i = 0; i < g->n_ops; i++) {
        ps_op *op = &g->ops[i];
        op->layer = l->op_layer[i];
        for (int k = 0; k < op->n_out; k++)
            g->tensors[op->out[k]].layer = op->layer;
        for (int k = 0; k < op->n_in; k++) {
            ps_tensor *t = &g->tensors[op->in[k]];
            if (t->producer < 0 && op->layer < t->layer)
                t->layer = op->layer;
        }
    }
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].layer >= l->n_layers)
            g->tensors[t].layer = 0; /* read by no op */
    g->n_boundaries = 0;
    ps_graph_update_layers(g);
    ps_status st = ps_graph_check(g, err);
    if (st != PS_OK) {
        ps_graph_free(g);
        return st;
    }
    *out = g;
    return PS_OK;
}
