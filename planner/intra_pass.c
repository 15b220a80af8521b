#include "planner/intra_pass.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const ps_intra_method_names[PS_METHOD_COUNT] = {"shard", "data", "zero2", "zero3"};

ps_intra_options ps_intra_options_default(void)
{
    return (ps_intra_options){.method = PS_METHOD_SHARD, .force_batch_axis0 = false,
                              .tie_layers = true,
                              .micro_batches = 1, .memory_budget_bytes = 0,
                              .ilp = ps_ilp_options_default()};
}

void ps_intra_result_free(ps_intra_result *r)
{
    if (r == NULL)
        return;
    free(r->op_strategy);
    free(r->tensor_spec);
    free(r->reshard_in_s);
    free(r->activation_tensor_bytes);
    ps_ilp_result_clear(&r->ilp);
    free(r);
}

/* A copy of n elements of `size` bytes from src (NULL for none); false when
 * out of memory. */
static bool copy_array(void **dst, const void *src, size_t n, size_t size)
{
    *dst = NULL;
    if (src == NULL || n == 0)
        return true;
    *dst = malloc(n * size);
    if (*dst == NULL)
        return false;
    memcpy(*dst, src, n * size);
    return true;
}

ps_status ps_intra_result_copy(const ps_intra_result *r, ps_intra_result **out, ps_error *err)
{
    *out = NULL;
    ps_intra_result *c = malloc(sizeof *c);
    if (c == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    *c = *r;
    bool ok = copy_array((void **)&c->op_strategy, r->op_strategy, (size_t)r->n_ops,
                         sizeof *r->op_strategy);
    ok = copy_array((void **)&c->tensor_spec, r->tensor_spec, (size_t)r->n_tensors,
                    sizeof *r->tensor_spec) && ok;
    ok = copy_array((void **)&c->reshard_in_s, r->reshard_in_s, (size_t)r->n_ops,
                    sizeof *r->reshard_in_s) && ok;
    ok = copy_array((void **)&c->activation_tensor_bytes, r->activation_tensor_bytes,
                    (size_t)r->n_tensors, sizeof *r->activation_tensor_bytes) && ok;
    ok = copy_array((void **)&c->ilp.choice, r->ilp.choice, (size_t)r->ilp_nodes,
                    sizeof *r->ilp.choice) && ok;
    if (!ok) {
        ps_intra_result_free(c);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    *out = c;
    return PS_OK;
}

/* Per-op and per-source candidate lists, indexed by ILP node. */
typedef struct candidates {
    int n_ops, n_sources;
    ps_strategy **op;      /* [n_ops] */
    int *n_op;
    ps_sharding_spec **src; /* [n_tensors], NULL for produced tensors */
    int *n_src;
    int *node_of_tensor;   /* source tensor -> ILP node */
} candidates;

static void candidates_free(candidates *c, int n_tensors)
{
    for (int i = 0; c->op != NULL && i < c->n_ops; i++)
        free(c->op[i]);
    for (int t = 0; c->src != NULL && t < n_tensors; t++)
        free(c->src[t]);
    free(c->op);
    free(c->n_op);
    free(c->src);
    free(c->n_src);
    free(c->node_of_tensor);
}

static bool is_batch_method(ps_intra_method m) { return m != PS_METHOD_SHARD; }

/* Keeps the strategies a method allows (always at least one). */
static void filter_op(const ps_op *op, const ps_op_signature *sig, ps_intra_method method,
                      ps_strategy *list, int *n)
{
    if (!is_batch_method(method))
        return;
    int batch = -1;
    for (int l = 0; l < sig->n_labels; l++)
        if (sig->batch[l] && batch < 0)
            batch = l;
    int keep = 0;
    for (int pass = 0; pass < 2 && keep == 0; pass++) {
        for (int i = 0; i < *n; i++) {
            const ps_strategy *s = &list[i];
            bool ok;
            if (op->kind == PS_OP_ADAM && method != PS_METHOD_DATA)
                ok = pass == 0 ? (s->assign[0] >= 0 && s->assign[1] == PS_LABEL_NONE)
                               : (s->assign[0] == PS_LABEL_NONE && s->assign[1] == PS_LABEL_NONE);
            else if (pass == 0 && batch >= 0)
                ok = s->assign[0] == batch && s->assign[1] == PS_LABEL_NONE;
            else
                ok = s->assign[0] == PS_LABEL_NONE && s->assign[1] == PS_LABEL_NONE;
            if (ok)
                list[keep++] = *s;
        }
    }
    *n = keep;
}

static void filter_source(const ps_tensor *t, ps_intra_method method, ps_sharding_spec *list,
                          int *n)
{
    if (!is_batch_method(method) || t->kind == PS_TENSOR_INPUT)
        return;
    bool want_sharded = (t->kind == PS_TENSOR_OPT_STATE && method != PS_METHOD_DATA) ||
                        (t->kind == PS_TENSOR_PARAM && method == PS_METHOD_ZERO3);
    int keep = 0;
    for (int i = 0; i < *n; i++) {
        bool replicated = ps_spec_dim_of_axis(&list[i], 0) < 0 &&
                          ps_spec_dim_of_axis(&list[i], 1) < 0;
        bool ok = want_sharded ? (!replicated && ps_spec_dim_of_axis(&list[i], 1) < 0)
                               : replicated;
        if (ok)
            list[keep++] = list[i];
    }
    if (keep == 0) { /* nothing divides: stay replicated (list[0]) */
        keep = 1;
    }
    *n = keep;
}

/* Names a matmul strategy by its einsum letters ("b@0 n@1"), other ops by
 * their output layout. */
static void readable_name(const ps_graph *g, const ps_op *op, const ps_op_signature *sig,
                          ps_strategy *s)
{
    char buf[40] = "", suffix[16] = "";
    int used = 0;
    const char *plus = strchr(s->name, '+');
    if (plus != NULL)
        snprintf(suffix, sizeof suffix, "%s", plus);
    if (op->kind == PS_OP_MATMUL) {
        ps_einsum e;
        if (ps_einsum_parse(op->attrs.einsum, &e, NULL) != PS_OK)
            return;
        for (int a = 0; a < PS_MESH_AXES; a++) {
            int l = s->assign[a];
            if (l < 0)
                continue;
            char letter = '?';
            for (int o = 0; o < 2; o++)
                for (int k = 0; k < e.rank[o]; k++)
                    if (sig->in[o][k] == l)
                        letter = e.labels[o][k];
            used += snprintf(buf + used, sizeof buf - (size_t)used, "%s%c@%d", used ? " " : "",
                             letter, a);
        }
        snprintf(s->name, sizeof s->name, "%.22s%s", used ? buf : "R", suffix);
        return;
    }
    (void)g;
    if (op->n_out > 0)
        ps_spec_format(&s->out[0], s->name, sizeof s->name);
    else
        ps_spec_format(&s->in[0], s->name, sizeof s->name);
}

/* Roles of tensors in memory (bits of kept[t]). */
enum {
    KEPT_ACT = 1,   /* forward tensor the backward pass reads: lives through a micro-batch */
    KEPT_ACCUM = 2, /* gradient the update reads: accumulated over micro-batches in the
                     * layout its producer writes (the lowering's accumulator), alive the
                     * whole step */
};

/* The most a micro-batch's activations hold at once, in the chosen
 * layouts: every tensor of the micro-batch (not the gradients accumulated
 * over micro-batches, nor weights and state) from its op, or from the start
 * for a stage's input, to the last op that reads it, in the graph's order,
 * which is the order the lowering runs a micro-batch's ops in (a layer's
 * recomputation right before its backward). With remat a recomputed
 * layer's activations are alive together through its backward; without,
 * the backward's temporaries overlap; a kept activation is gone once the
 * backward has read it. Counting instead all kept activations and the one
 * largest temporary left a plan's programs up to twice the planned
 * per-micro-batch memory. */
/* Bytes of tensor t's tile in the layout it is held in (a produced
 * tensor's: its producer's output layout). */
static double held_bytes(const ps_graph *g, const ps_intra_result *r, const ps_logical_mesh *m,
                         int t)
{
    return ps_spec_tile_bytes(&r->tensor_spec[t], &g->tensors[t].desc, m->shape);
}

/* What op i's inputs read in another layout than they are held in take:
 * each is re-laid out into a tile of its own for the op (a ZeRO-3
 * parameter gathered whole, a re-sharded activation). */
static double relaid_bytes(const ps_graph *g, const ps_intra_result *r, const ps_logical_mesh *m,
                           int i)
{
    const ps_op *op = &g->ops[i];
    const ps_strategy *s = &r->op_strategy[i];
    double relaid = 0;
    for (int k = 0; k < op->n_in; k++) {
        int t = op->in[k];
        if (!ps_spec_equal(&r->tensor_spec[t], &s->in[k]))
            relaid += ps_spec_tile_bytes(&s->in[k], &g->tensors[t].desc, m->shape);
    }
    return relaid;
}

/* Whether op's input k is a tensor an earlier input already names (an op
 * reading a tensor twice frees it once). */
static bool read_before(const ps_op *op, int k)
{
    for (int q = 0; q < k; q++)
        if (op->in[q] == op->in[k])
            return true;
    return false;
}

/* The most the update holds at once above the step's lasting memory (the
 * weights, state and accumulated gradients): the contributions other
 * stages send to a shared parameter's gradient, received before the update
 * in the layout they are held in, what its ops make (a contribution summed
 * into the stage's own gradient) and the tiles of inputs they read in
 * another layout, each from its op to its last reader; the optimizer
 * updates weights and state in place. (Counted as the largest contribution
 * alone until 2026-12-03: the first stage of a GPT pipeline holds the tied
 * embedding's gradient from the last stage whole, its re-laid tile and the
 * sum at once, and its programs peaked there above the plan.) */
static double update_working_set(const ps_graph *g, const unsigned char *kept,
                                 const ps_intra_result *r, const ps_logical_mesh *m,
                                 const int *last)
{
    double live = 0, peak = 0;
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].producer < 0 && g->tensors[t].kind == PS_TENSOR_INPUT &&
            (kept[t] & KEPT_ACCUM))
            live += held_bytes(g, r, m, t);
    peak = live;
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        if (op->pass != PS_PASS_UPDATE)
            continue;
        double born = 0, unread = 0;
        for (int k = 0; k < op->n_out; k++) {
            double b = held_bytes(g, r, m, op->out[k]);
            born += b;
            if (last[op->out[k]] <= i)
                unread += b;
        }
        live += born;
        peak = fmax(peak, live + relaid_bytes(g, r, m, i));
        live -= unread;
        for (int k = 0; k < op->n_in; k++) {
            int t = op->in[k];
            const ps_tensor *x = &g->tensors[t];
            bool transient = (x->producer >= 0 && g->ops[x->producer].pass == PS_PASS_UPDATE) ||
                             (x->producer < 0 && x->kind == PS_TENSOR_INPUT);
            if (!read_before(op, k) && transient && last[t] == i)
                live -= held_bytes(g, r, m, t);
        }
    }
    return peak;
}

static ps_status working_set(const ps_graph *g, const unsigned char *kept,
                             const ps_intra_result *r, const ps_logical_mesh *m,
                             double *peak_out, double *update_peak_out, ps_error *err)
{
    int *last = malloc(((size_t)g->n_tensors + 1) * sizeof *last);
    if (last == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    for (int t = 0; t < g->n_tensors; t++)
        last[t] = -1;
    for (int i = 0; i < g->n_ops; i++)
        for (int k = 0; k < g->ops[i].n_in; k++)
            last[g->ops[i].in[k]] = i;
    /* a stage's inputs, received or loaded: from the start, but those only
     * the backward reads (the next stage's gradient), which arrive for the
     * backward kernel, from its first op (a recomputation's, with remat) */
    int backward_from = g->n_ops;
    for (int i = 0; i < g->n_ops && backward_from == g->n_ops; i++)
        if (g->ops[i].pass == PS_PASS_BACKWARD || g->ops[i].pass == PS_PASS_RECOMPUTE)
            backward_from = i;
    /* what a kernel sends on (a forward or backward output nothing here
     * reads; a recomputation's is dropped) lives to the kernel's end, when
     * the sends go: the last forward op, the last of the backward's */
    int forward_to = -1, backward_to = -1;
    for (int i = 0; i < g->n_ops; i++) {
        if (g->ops[i].pass == PS_PASS_FORWARD)
            forward_to = i;
        else if (g->ops[i].pass == PS_PASS_BACKWARD || g->ops[i].pass == PS_PASS_RECOMPUTE)
            backward_to = i;
    }
    double live = 0, peak = 0, arriving = 0, sent[2] = {0, 0}; /* forward's, backward's */
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].producer < 0 && g->tensors[t].kind == PS_TENSOR_INPUT &&
            !(kept[t] & KEPT_ACCUM) && last[t] >= 0) {
            if (kept[t] & KEPT_ACT || last[t] < backward_from)
                live += held_bytes(g, r, m, t);
            else
                arriving += held_bytes(g, r, m, t);
        }
    peak = live;
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        double born = 0, unread = 0;
        if (op->pass == PS_PASS_UPDATE)
            continue; /* after the micro-batches: update_working_set */
        if (i == backward_from)
            live += arriving;
        for (int k = 0; k < op->n_out; k++) {
            int t = op->out[k];
            if (kept[t] & KEPT_ACCUM)
                continue;
            double b = held_bytes(g, r, m, t);
            born += b;
            if (last[t] < 0 && (op->pass == PS_PASS_FORWARD || op->pass == PS_PASS_BACKWARD))
                sent[op->pass == PS_PASS_FORWARD ? 0 : 1] += b;
            else if (last[t] <= i)
                unread += b; /* nothing reads it later: gone after its op */
        }
        live += born;
        peak = fmax(peak, live + relaid_bytes(g, r, m, i));
        live -= unread;
        if (i == forward_to || i == backward_to) {
            live -= sent[i == forward_to ? 0 : 1];
            sent[i == forward_to ? 0 : 1] = 0;
        }
        for (int k = 0; k < op->n_in; k++) {
            int t = op->in[k];
            const ps_tensor *x = &g->tensors[t];
            if (read_before(op, k) || (kept[t] & KEPT_ACCUM) || last[t] != i)
                continue;
            if (x->producer >= 0 || x->kind == PS_TENSOR_INPUT) /* not weights, state */
                live -= held_bytes(g, r, m, t);
        }
    }
    *update_peak_out = update_working_set(g, kept, r, m, last);
    free(last);
    *peak_out = peak;
    return PS_OK;
}

/* Tensors that must live through a micro-batch (forward tensors the
 * backward pass reads) or the step (the gradients the update reads;
 * weights and state are sources). */
static ps_status memory_roles(const ps_graph *g, unsigned char **kept_out, ps_error *err)
{
    unsigned char *kept = calloc((size_t)g->n_tensors + 1, 1);
    /* read[t]: 1 when a forward op reads t, 2 when any op does */
    unsigned char *read = calloc((size_t)g->n_tensors + 1, 1);
    if (kept == NULL || read == NULL) {
        free(kept);
        free(read);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < g->n_ops; i++)
        for (int k = 0; k < g->ops[i].n_in; k++)
            read[g->ops[i].in[k]] |= g->ops[i].pass == PS_PASS_FORWARD ? 3 : 2;
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        for (int k = 0; k < op->n_in; k++) {
            const ps_tensor *t = &g->tensors[op->in[k]];
            if (op->pass == PS_PASS_UPDATE) {
                /* accumulated here, or (an INPUT of a stage's slice) another
                 * stage's accumulated contribution to a shared parameter's
                 * gradient, received for the update (memory only then) */
                if ((t->producer >= 0 && g->ops[t->producer].pass != PS_PASS_UPDATE) ||
                    (t->producer < 0 && t->kind == PS_TENSOR_INPUT))
                    kept[op->in[k]] |= KEPT_ACCUM;
                continue;
            }
            if (op->pass != PS_PASS_BACKWARD && op->pass != PS_PASS_RECOMPUTE)
                continue;
            /* a stage's input the forward pass reads (tokens, the previous
             * stage's activation) is there from its forward on; one only
             * the backward reads (the next stage's gradient) arrives for
             * the backward and is gone after it (the working set counts it) */
            if ((t->kind == PS_TENSOR_INPUT && (read[op->in[k]] & 1)) ||
                (t->producer >= 0 && g->ops[t->producer].pass == PS_PASS_FORWARD))
                kept[op->in[k]] |= KEPT_ACT;
        }
    }
    /* a parameter's gradient contribution that nothing here reads goes to
     * the stage that updates the parameter, which sums the stages'
     * contributions at the update (ps_train_options.layer_stage): it is
     * accumulated here over the micro-batches */
    for (int t = 0; t < g->n_tensors; t++) {
        const ps_tensor *x = &g->tensors[t];
        if (!read[t] && x->producer >= 0 && g->ops[x->producer].pass == PS_PASS_BACKWARD &&
            x->grad_of >= 0 && g->tensors[x->grad_of].kind == PS_TENSOR_PARAM)
            kept[t] |= KEPT_ACCUM;
    }
    free(read);
    *kept_out = kept;
    return PS_OK;
}

double ps_intra_peak_bytes(const ps_intra_result *r, int in_flight)
{
    return r->weight_bytes + r->gradient_bytes + r->optimizer_bytes +
           fmax(in_flight * r->activation_bytes + r->transient_bytes, r->update_transient_bytes);
}

ps_status ps_intra_step_bytes(const ps_graph *step, double *lasting, double *activations,
                              ps_error *err)
{
    unsigned char *kept = NULL;
    *lasting = *activations = 0;
    PS_TRY_RET(memory_roles(step, &kept, err));
    for (int t = 0; t < step->n_tensors; t++) {
        const ps_tensor *x = &step->tensors[t];
        double b = ps_tensor_bytes(x);
        /* as ps_intra_solve counts them; a stage's input that is another
         * stage's gradient contribution is not the whole step's */
        if (x->kind == PS_TENSOR_PARAM || x->kind == PS_TENSOR_OPT_STATE)
            *lasting += b;
        else if (x->producer >= 0 && (kept[t] & KEPT_ACCUM))
            *lasting += b;
        else if ((x->producer >= 0 || x->kind == PS_TENSOR_INPUT) && (kept[t] & KEPT_ACT))
            *activations += b;
    }
    free(kept);
    return PS_OK;
}

static int output_index(const ps_op *op, int t)
{
    for (int k = 0; k < op->n_out; k++)
        if (op->out[k] == t)
            return k;
    return -1;
}

/* ---- identical layers ------------------------------------------------------ *
 * Layers whose ops, shapes and wiring are the same (the blocks of a
 * transformer) take the same strategies: the ILP then solves one layer of each
 * kind. A layer's signature lists its ops in order with kind, pass, attributes
 * and shapes, and for each input where it comes from: an op of the layer (by
 * position), a source of the layer (by order of first use), or outside (by
 * shape only, so that the first and last block match the others). */

typedef struct text {
    char *s;
    size_t len, cap;
} text;

static bool text_add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool text_add(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return false;
        if (t->s != NULL && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return true;
        }
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->len + (size_t)n + 1)
            cap *= 2;
        char *bigger = realloc(t->s, cap);
        if (bigger == NULL)
            return false;
        t->s = bigger;
        t->cap = cap;
    }
}

static uint64_t fnv(const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static bool desc_text(text *t, const ps_tensor_desc *d)
{
    bool ok = text_add(t, "%d[", (int)d->dtype);
    for (int k = 0; k < d->rank && ok; k++)
        ok = text_add(t, "%lld,", (long long)d->shape[k]);
    return ok && text_add(t, "]");
}

/* tie[node] for the ILP nodes (ops, then sources at node_of_tensor). */
static ps_status layer_ties(const ps_graph *g, const candidates *c, int n_nodes, int **tie_out,
                            int *tied_out, ps_error *err)
{
    ps_status st = PS_OK;
    /* the units tied: the model's blocks (ps_op.block), densely numbered,
     * so that identical blocks inside one clustered layer are tied too */
    int max_block = 0;
    for (int i = 0; i < g->n_ops; i++)
        max_block = g->ops[i].block > max_block ? g->ops[i].block : max_block;
    int *unit = malloc(((size_t)g->n_ops + 1) * sizeof *unit);
    int *dense = malloc(((size_t)max_block + 2) * sizeof *dense);
    int *src_unit = malloc(((size_t)g->n_tensors + 1) * sizeof *src_unit);
    if (unit == NULL || dense == NULL || src_unit == NULL) {
        free(unit);
        free(dense);
        free(src_unit);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    for (int b = 0; b <= max_block; b++)
        dense[b] = -1;
    int L = 0;
    for (int i = 0; i < g->n_ops; i++) {
        int b = g->ops[i].block >= 0 ? g->ops[i].block : 0;
        if (dense[b] < 0)
            dense[b] = L++;
        unit[i] = dense[b];
    }
    free(dense);
    int *tie = malloc(((size_t)n_nodes + 1) * sizeof *tie);
    int *pos = malloc(((size_t)g->n_ops + 1) * sizeof *pos);
    int *first = calloc((size_t)L + 2, sizeof *first), *order = NULL;
    int *src_local = malloc(((size_t)g->n_tensors + 1) * sizeof *src_local);
    int **srcs = calloc((size_t)L + 1, sizeof *srcs);
    int *n_srcs = calloc((size_t)L + 1, sizeof *n_srcs);
    bool *local_src = calloc((size_t)g->n_tensors + 1, sizeof *local_src);
    text *sig = calloc((size_t)L + 1, sizeof *sig);
    int *rep_layer = malloc(((size_t)L + 1) * sizeof *rep_layer);
    PS_TRY_ALLOC(tie, err);
    PS_TRY_ALLOC(pos, err);
    PS_TRY_ALLOC(first, err);
    PS_TRY_ALLOC(src_local, err);
    PS_TRY_ALLOC(srcs, err);
    PS_TRY_ALLOC(n_srcs, err);
    PS_TRY_ALLOC(local_src, err);
    PS_TRY_ALLOC(sig, err);
    PS_TRY_ALLOC(rep_layer, err);
    *tied_out = 0;
    for (int v = 0; v < n_nodes; v++)
        tie[v] = v;
    /* ops per layer, in graph order (CSR) */
    for (int i = 0; i < g->n_ops; i++)
        first[unit[i] + 1]++;
    for (int l = 0; l < L; l++)
        first[l + 1] += first[l];
    order = malloc(((size_t)g->n_ops + 1) * sizeof *order);
    PS_TRY_ALLOC(order, err);
    {
        int *fill = malloc(((size_t)L + 1) * sizeof *fill);
        PS_TRY_ALLOC(fill, err);
        memcpy(fill, first, (size_t)L * sizeof *fill);
        for (int i = 0; i < g->n_ops; i++) {
            pos[i] = fill[unit[i]] - first[unit[i]];
            order[fill[unit[i]]++] = i;
        }
        free(fill);
    }
    /* a source is local to a unit when every op reading it is in that unit */
    for (int t = 0; t < g->n_tensors; t++) {
        local_src[t] = g->tensors[t].producer < 0;
        src_unit[t] = -1;
    }
    for (int i = 0; i < g->n_ops; i++)
        for (int k = 0; k < g->ops[i].n_in; k++) {
            int t = g->ops[i].in[k];
            if (g->tensors[t].producer >= 0)
                continue;
            if (src_unit[t] < 0)
                src_unit[t] = unit[i];
            else if (src_unit[t] != unit[i])
                local_src[t] = false;
        }
    for (int t = 0; t < g->n_tensors; t++)
        src_local[t] = -1;
    for (int l = 0; l < L; l++) {
        srcs[l] = malloc(((size_t)(first[l + 1] - first[l]) * PS_MAX_OP_IO + 1) * sizeof(int));
        PS_TRY_ALLOC(srcs[l], err);
        bool ok = true;
        for (int j = first[l]; j < first[l + 1] && ok; j++) {
            const ps_op *op = &g->ops[order[j]];
            ok = text_add(&sig[l], "K%dP%dA%llx:", (int)op->kind, (int)op->pass,
                          (unsigned long long)fnv(&op->attrs, sizeof op->attrs));
            for (int k = 0; k < op->n_in && ok; k++) {
                int t = op->in[k];
                const ps_tensor *x = &g->tensors[t];
                if (x->producer >= 0 && unit[x->producer] == l) {
                    int oi = 0;
                    while (g->ops[x->producer].out[oi] != t)
                        oi++;
                    ok = text_add(&sig[l], "L%d.%d;", pos[x->producer], oi);
                } else if (x->producer < 0 && local_src[t]) {
                    if (src_local[t] < 0) {
                        src_local[t] = n_srcs[l];
                        srcs[l][n_srcs[l]++] = t;
                    }
                    ok = text_add(&sig[l], "S%d.%d", src_local[t], (int)x->kind) &&
                         desc_text(&sig[l], &x->desc) && text_add(&sig[l], ";");
                } else if (x->producer < 0) {
                    ok = text_add(&sig[l], "X%d;", t); /* shared source: never matches */
                } else {
                    ok = text_add(&sig[l], "E") && desc_text(&sig[l], &x->desc) &&
                         text_add(&sig[l], ";");
                }
            }
            for (int k = 0; k < op->n_out && ok; k++)
                ok = desc_text(&sig[l], &g->tensors[op->out[k]].desc);
            ok = ok && text_add(&sig[l], "|");
        }
        if (!ok) {
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    /* a unit ties to the first earlier one of the same signature whose
     * candidates agree position by position (local sources in order of
     * use too); else it stands for itself. Units that read alike may be
     * offered different strategies (with recomputation, a block whose
     * output leaves its clustered layer is kept, the next one's is not):
     * each such kind gets a representative of its own */
    for (int l = 0; l < L; l++) {
        rep_layer[l] = l;
        for (int r = 0; r < l && rep_layer[l] == l; r++) {
            if (rep_layer[r] != r || sig[r].s == NULL || sig[l].s == NULL ||
                sig[r].len != sig[l].len || memcmp(sig[r].s, sig[l].s, sig[l].len) != 0)
                continue;
            bool same = n_srcs[l] == n_srcs[r];
            for (int j = 0; j < first[l + 1] - first[l] && same; j++) {
                int a = order[first[l] + j], b = order[first[r] + j];
                same = c->n_op[a] == c->n_op[b];
                for (int s = 0; s < c->n_op[a] && same; s++)
                    same = c->op[a][s].compute_s == c->op[b][s].compute_s &&
                           c->op[a][s].comm_s == c->op[b][s].comm_s &&
                           memcmp(c->op[a][s].in, c->op[b][s].in, sizeof c->op[a][s].in) == 0 &&
                           memcmp(c->op[a][s].out, c->op[b][s].out, sizeof c->op[a][s].out) == 0;
            }
            for (int k = 0; k < n_srcs[l] && same; k++)
                same = c->n_src[srcs[l][k]] == c->n_src[srcs[r][k]];
            if (same)
                rep_layer[l] = r;
        }
        int r = rep_layer[l];
        if (r == l)
            continue;
        for (int j = 0; j < first[l + 1] - first[l]; j++)
            tie[order[first[l] + j]] = order[first[r] + j];
        for (int k = 0; k < n_srcs[l]; k++)
            tie[c->node_of_tensor[srcs[l][k]]] = c->node_of_tensor[srcs[r][k]];
        (*tied_out)++;
    }
    *tie_out = tie;
    tie = NULL;
out:
    for (int l = 0; sig != NULL && l < L; l++)
        free(sig[l].s);
    for (int l = 0; srcs != NULL && l < L; l++)
        free(srcs[l]);
    free(sig);
    free(srcs);
    free(n_srcs);
    free(local_src);
    free(src_local);
    free(rep_layer);
    free(order);
    free(first);
    free(pos);
    free(tie);
    free(unit);
    free(src_unit);
    return st;
}

ps_status ps_intra_keep_partial(const ps_graph *g, unsigned char **out, ps_error *err)
{
    int n_ops = g->n_ops, n_t = g->n_tensors;
    unsigned char *keep_partial = malloc((size_t)n_t + 1);
    *out = NULL;
    if (keep_partial == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    /* outputs whose consumers all take partial sums: the update, or gradient
     * sums that feed it */
    memset(keep_partial, 1, (size_t)n_t + 1);
    for (int i = 0; i < n_ops; i++) {
        const ps_op *op = &g->ops[i];
        bool takes = op->pass == PS_PASS_UPDATE ||
                     (op->kind == PS_OP_ADD && op->pass == PS_PASS_BACKWARD);
        for (int k = 0; k < op->n_in && !takes; k++)
            keep_partial[op->in[k]] = 0;
    }
    for (int i = n_ops - 1; i >= 0; i--) {
        const ps_op *op = &g->ops[i];
        if (op->kind == PS_OP_ADD && op->pass == PS_PASS_BACKWARD && !keep_partial[op->out[0]])
            for (int k = 0; k < op->n_in; k++)
                keep_partial[op->in[k]] = 0;
    }
    *out = keep_partial;
    return PS_OK;
}

/* The ILP of a step on a mesh and what its answers are read against: the
 * candidates per node and the tensors' memory roles. A session's also keeps
 * its ILP session; a single solve's problem carries its price on memory in
 * the node costs and its budget. */
struct ps_intra_session {
    const ps_graph *g;         /* borrowed */
    const ps_logical_mesh *m;  /* borrowed */
    ps_intra_options opt;
    candidates c;
    unsigned char *kept;       /* [n_tensors] KEPT_* bits */
    ps_ilp_problem *p;
    int *tie;                  /* [n_nodes] or NULL */
    int tied_layers;
    double strategies_total, min_memory;
    ps_ilp_session *ilp;       /* NULL: a single solve */
};

void ps_intra_session_free(ps_intra_session *s)
{
    if (s == NULL)
        return;
    ps_ilp_session_free(s->ilp);
    candidates_free(&s->c, s->g->n_tensors);
    free(s->kept);
    free(s->tie);
    ps_ilp_problem_free(s->p);
    free(s);
}

/* Candidates, memory roles and the ILP of g on m; node costs include
 * `weight` (seconds per byte) times the node's memory. */
static ps_status intra_build(const ps_graph *g, const ps_logical_mesh *m,
                             const ps_intra_options *opt, double weight,
                             ps_intra_session **out, ps_error *err)
{
    ps_status st = PS_OK;
    unsigned char *batch = NULL, *keep_partial = NULL;
    ps_op_signature *sigs = NULL;
    double *cost = NULL, *mem = NULL, *ecost = NULL;
    int n_ops = g->n_ops, n_t = g->n_tensors;
    double inv_b = 1.0 / (opt->micro_batches > 0 ? opt->micro_batches : 1);
    ps_strategy_options so = {.force_batch_axis0 = opt->force_batch_axis0 ||
                                                   is_batch_method(opt->method)};
    ps_intra_session *ss = calloc(1, sizeof *ss);
    *out = NULL;
    PS_TRY_ALLOC(ss, err);
    ss->g = g;
    ss->m = m;
    ss->opt = *opt;
    candidates *cands = &ss->c;
    PS_TRY(ps_batch_dims(g, &batch, err));
    PS_TRY(memory_roles(g, &ss->kept, err));
    const unsigned char *kept = ss->kept;
    PS_TRY(ps_intra_keep_partial(g, &keep_partial, err));
    so.keep_partial = keep_partial;
    sigs = calloc((size_t)n_ops + 1, sizeof *sigs);
    cands->n_ops = n_ops;
    cands->op = calloc((size_t)n_ops + 1, sizeof *cands->op);
    cands->n_op = calloc((size_t)n_ops + 1, sizeof *cands->n_op);
    cands->src = calloc((size_t)n_t + 1, sizeof *cands->src);
    cands->n_src = calloc((size_t)n_t + 1, sizeof *cands->n_src);
    cands->node_of_tensor = malloc(((size_t)n_t + 1) * sizeof *cands->node_of_tensor);
    PS_TRY_ALLOC(sigs, err);
    PS_TRY_ALLOC(cands->op, err);
    PS_TRY_ALLOC(cands->n_op, err);
    PS_TRY_ALLOC(cands->src, err);
    PS_TRY_ALLOC(cands->n_src, err);
    PS_TRY_ALLOC(cands->node_of_tensor, err);
    if ((st = ps_ilp_problem_create(&ss->p)) != PS_OK) {
        st = ps_error_set(err, st, "out of memory");
        goto out;
    }
    ps_ilp_problem *p = ss->p;
    p->mem_budget = opt->memory_budget_bytes;

    /* candidates and nodes: ops first (node i = op i), then sources */
    int max_k = 1;
    for (int i = 0; i < n_ops; i++) {
        PS_TRY(ps_op_signature_of(g, i, batch, &sigs[i], err));
        PS_TRY(ps_op_strategies(g, i, &sigs[i], m, &so, &cands->op[i], &cands->n_op[i], err));
        filter_op(&g->ops[i], &sigs[i], opt->method, cands->op[i], &cands->n_op[i]);
        for (int s = 0; s < cands->n_op[i]; s++)
            readable_name(g, &g->ops[i], &sigs[i], &cands->op[i][s]);
        if (cands->n_op[i] > max_k)
            max_k = cands->n_op[i];
        ss->strategies_total += cands->n_op[i];
    }
    for (int t = 0; t < n_t; t++) {
        cands->node_of_tensor[t] = -1;
        if (g->tensors[t].producer >= 0)
            continue;
        PS_TRY(ps_source_specs(g, t, m, &cands->src[t], &cands->n_src[t], err));
        filter_source(&g->tensors[t], opt->method, cands->src[t], &cands->n_src[t]);
        if (cands->n_src[t] > max_k)
            max_k = cands->n_src[t];
        ss->strategies_total += cands->n_src[t];
    }
    cost = malloc((size_t)max_k * sizeof *cost);
    mem = malloc((size_t)max_k * sizeof *mem);
    ecost = malloc((size_t)max_k * (size_t)max_k * sizeof *ecost);
    PS_TRY_ALLOC(cost, err);
    PS_TRY_ALLOC(mem, err);
    PS_TRY_ALLOC(ecost, err);
    for (int i = 0; i < n_ops; i++) {
        const ps_op *op = &g->ops[i];
        double scale = op->pass == PS_PASS_UPDATE ? inv_b : 1;
        for (int s = 0; s < cands->n_op[i]; s++) {
            const ps_strategy *sg = &cands->op[i][s];
            mem[s] = 0;
            /* activations kept for the backward pass, and gradient accumulators
             * in the layout written here (partial sums reduced only by the
             * update are full-size tiles) */
            for (int k = 0; k < op->n_out; k++)
                if (kept[op->out[k]])
                    mem[s] += ps_spec_tile_bytes(&sg->out[k], &g->tensors[op->out[k]].desc,
                                                 m->shape);
            cost[s] = (sg->compute_s + sg->comm_s) * scale + weight * mem[s];
        }
        if ((st = ps_ilp_add_node(p, cands->n_op[i], cost, mem, NULL)) != PS_OK) {
            st = ps_error_set(err, st, "out of memory");
            goto out;
        }
    }
    for (int t = 0; t < n_t; t++) {
        if (cands->src[t] == NULL)
            continue;
        const ps_tensor *x = &g->tensors[t];
        bool counts = x->kind != PS_TENSOR_INPUT || kept[t];
        for (int s = 0; s < cands->n_src[t]; s++) {
            mem[s] = counts ? ps_spec_tile_bytes(&cands->src[t][s], &x->desc, m->shape) : 0;
            cost[s] = weight * mem[s];
        }
        if ((st = ps_ilp_add_node(p, cands->n_src[t], cost, mem, &cands->node_of_tensor[t])) !=
            PS_OK) {
            st = ps_error_set(err, st, "out of memory");
            goto out;
        }
    }
    /* edges: producer (or source) layout -> the layout each consumer needs */
    for (int i = 0; i < n_ops; i++) {
        const ps_op *op = &g->ops[i];
        double scale = op->pass == PS_PASS_UPDATE ? inv_b : 1;
        for (int k = 0; k < op->n_in; k++) {
            int t = op->in[k];
            const ps_tensor *x = &g->tensors[t];
            int from = x->producer >= 0 ? x->producer : cands->node_of_tensor[t];
            int kf = x->producer >= 0 ? cands->n_op[from] : cands->n_src[t];
            int oi = x->producer >= 0 ? output_index(&g->ops[from], t) : -1;
            bool in_place = op->kind == PS_OP_ADAM && k != 1;
            for (int a = 0; a < kf; a++) {
                const ps_sharding_spec *fs =
                    x->producer >= 0 ? &cands->op[from][a].out[oi] : &cands->src[t][a];
                for (int b = 0; b < cands->n_op[i]; b++) {
                    const ps_sharding_spec *ts = &cands->op[i][b].in[k];
                    double e = ps_reshard_s(m, &x->desc, fs, ts);
                    if (in_place && isfinite(e))
                        e += ps_reshard_s(m, &x->desc, ts, fs);
                    ecost[a * cands->n_op[i] + b] = e * scale;
                }
            }
            if (from == i)
                continue; /* cannot happen in a DAG; keep GLPK safe anyway */
            if ((st = ps_ilp_add_edge(p, from, i, ecost)) != PS_OK) {
                st = ps_error_set(err, st, "out of memory");
                goto out;
            }
        }
    }
    ss->min_memory = ps_ilp_min_memory(p);
    if (opt->tie_layers)
        PS_TRY(layer_ties(g, cands, p->n_nodes, &ss->tie, &ss->tied_layers, err));
    *out = ss;
    ss = NULL;
out:
    ps_intra_session_free(ss);
    free(batch);
    free(keep_partial);
    free(sigs);
    free(cost);
    free(mem);
    free(ecost);
    return st;
}

/* The layouts, times and memory of an ILP answer (taken over); the
 * objective is the answer's cost less `weight` times its memory. */
static ps_status intra_answer(const ps_intra_session *ss, ps_ilp_result *ilp, double weight,
                              ps_intra_result **out, ps_error *err)
{
    ps_status st = PS_OK;
    const ps_graph *g = ss->g;
    const ps_logical_mesh *m = ss->m;
    const candidates *cands = &ss->c;
    const unsigned char *kept = ss->kept;
    int n_ops = g->n_ops, n_t = g->n_tensors;
    ps_intra_result *r = calloc(1, sizeof *r);
    *out = NULL;
    if (r == NULL) {
        ps_ilp_result_clear(ilp);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    r->ilp = *ilp;
    memset(ilp, 0, sizeof *ilp);
    r->strategies_total = ss->strategies_total;
    r->ilp_nodes = ss->p->n_nodes;
    r->ilp_edges = ss->p->n_edges;
    r->min_memory_bytes = ss->min_memory;
    r->tied_layers = ss->tied_layers;
    r->n_ops = n_ops;
    r->n_tensors = n_t;
    r->op_strategy = calloc((size_t)n_ops + 1, sizeof *r->op_strategy);
    r->tensor_spec = calloc((size_t)n_t + 1, sizeof *r->tensor_spec);
    r->reshard_in_s = calloc((size_t)n_ops + 1, sizeof *r->reshard_in_s);
    r->activation_tensor_bytes = calloc((size_t)n_t + 1, sizeof *r->activation_tensor_bytes);
    PS_TRY_ALLOC(r->activation_tensor_bytes, err);
    PS_TRY_ALLOC(r->op_strategy, err);
    PS_TRY_ALLOC(r->tensor_spec, err);
    PS_TRY_ALLOC(r->reshard_in_s, err);
    r->objective_s = r->ilp.objective - weight * r->ilp.memory;
    for (int i = 0; i < n_ops; i++)
        r->op_strategy[i] = cands->op[i][r->ilp.choice[i]];
    for (int t = 0; t < n_t; t++) {
        const ps_tensor *x = &g->tensors[t];
        if (x->producer >= 0)
            r->tensor_spec[t] = r->op_strategy[x->producer].out[output_index(&g->ops[x->producer], t)];
        else
            r->tensor_spec[t] = cands->src[t][r->ilp.choice[cands->node_of_tensor[t]]];
    }
    double working = 0, update_peak = 0;
    PS_TRY(working_set(g, kept, r, m, &working, &update_peak, err));
    for (int i = 0; i < n_ops; i++) {
        const ps_op *op = &g->ops[i];
        const ps_strategy *s = &r->op_strategy[i];
        for (int k = 0; k < op->n_in; k++) {
            int t = op->in[k];
            const ps_tensor *x = &g->tensors[t];
            double e = ps_reshard_s(m, &x->desc, &r->tensor_spec[t], &s->in[k]);
            if (op->kind == PS_OP_ADAM && k != 1)
                e += ps_reshard_s(m, &x->desc, &s->in[k], &r->tensor_spec[t]);
            r->reshard_in_s[i] += e;
        }
        r->compute_s[op->pass] += s->compute_s;
        r->comm_s[op->pass] += s->comm_s + r->reshard_in_s[i];
        for (int k = 0; k < op->n_out; k++) {
            double b = ps_spec_tile_bytes(&s->out[k], &g->tensors[op->out[k]].desc, m->shape);
            if (kept[op->out[k]] & KEPT_ACCUM)
                r->gradient_bytes += b;
            else if (kept[op->out[k]] & KEPT_ACT)
                r->activation_tensor_bytes[op->out[k]] = b;
        }
    }
    for (int t = 0; t < n_t; t++) {
        const ps_tensor *x = &g->tensors[t];
        double b = ps_spec_tile_bytes(&r->tensor_spec[t], &x->desc, m->shape);
        if (x->kind == PS_TENSOR_PARAM)
            r->weight_bytes += b;
        else if (x->kind == PS_TENSOR_OPT_STATE)
            r->optimizer_bytes += b;
        else if (x->kind == PS_TENSOR_INPUT && (kept[t] & KEPT_ACT))
            r->activation_tensor_bytes[t] = b;
        r->activation_bytes += r->activation_tensor_bytes[t];
    }
    /* what a micro-batch's peak adds above its kept activations (those of
     * the other micro-batches in flight stay whole); the update's comes
     * after the last micro-batch has freed its activations */
    r->transient_bytes = fmax(0, working - r->activation_bytes);
    r->update_transient_bytes = update_peak;
    r->peak_memory_bytes = ps_intra_peak_bytes(r, 1);
    *out = r;
    r = NULL;
out:
    ps_intra_result_free(r);
    return st;
}

ps_status ps_intra_solve(const ps_graph *g, const ps_logical_mesh *m,
                         const ps_intra_options *opt, ps_intra_result **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_intra_session *ss = NULL;
    ps_ilp_result ilp = {0};
    *out = NULL;
    PS_TRY(intra_build(g, m, opt, opt->memory_weight_s_per_byte, &ss, err));
    PS_TRY(ps_ilp_solve_tied(ss->p, ss->tied_layers > 0 ? ss->tie : NULL, &opt->ilp, &ilp, err));
    PS_TRY(intra_answer(ss, &ilp, opt->memory_weight_s_per_byte, out, err));
out:
    ps_ilp_result_clear(&ilp);
    ps_intra_session_free(ss);
    return st;
}

ps_status ps_intra_session_create(const ps_graph *step, const ps_logical_mesh *m,
                                  const ps_intra_options *opt, ps_intra_session **out,
                                  ps_error *err)
{
    ps_status st = PS_OK;
    ps_intra_session *ss = NULL;
    *out = NULL;
    PS_TRY(intra_build(step, m, opt, 0, &ss, err)); /* the ILP session ignores the budget */
    PS_TRY(ps_ilp_session_create(ss->p, ss->tied_layers > 0 ? ss->tie : NULL, &opt->ilp,
                                 &ss->ilp, err));
    *out = ss;
    ss = NULL;
out:
    ps_intra_session_free(ss);
    return st;
}

ps_status ps_intra_session_solve(ps_intra_session *s, const ps_intra_options *opt,
                                 ps_intra_result **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_ilp_result ilp = {0};
    *out = NULL;
    if (opt->memory_weight_s_per_byte != 0)
        return ps_error_set(err, PS_ERR_INVALID,
                            "intra-op session: a memory weight is the problem's own (use "
                            "ps_intra_solve)");
    PS_TRY(ps_ilp_session_solve(s->ilp, opt->memory_budget_bytes, &opt->ilp, &ilp, err));
    PS_TRY(intra_answer(s, &ilp, 0, out, err));
out:
    ps_ilp_result_clear(&ilp);
    return st;
}
