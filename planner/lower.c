#include "planner/lower.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/array.h"
#include "planner/cost_model.h"
#include "planner/cross_mesh.h"
#include "planner/intra_pass.h"
#include "planner/plan_intra.h"
#include "planner/strategy.h"

ps_lower_options ps_lower_options_default(void)
{
    return (ps_lower_options){.local_allgather = true};
}

/* How a tensor of a stage lives. */
enum {
    CLS_LOCAL = 0,   /* produced here, one instance per micro-batch */
    CLS_PERSIST = 1, /* parameter or optimizer state: the whole run */
    CLS_ACCUM = 2,   /* gradient accumulated over micro-batches, read by the update */
    CLS_DATA = 3,    /* a batch input, loaded per micro-batch */
    CLS_RECV = 4,    /* produced by another stage, received per micro-batch */
    CLS_RECV_STEP = 5, /* produced by another stage, received once, for the update (a
                        * shared parameter's gradient contribution, accumulated there) */
};

/* One transfer of a cross-stage tensor: (part of) a tile from a device of
 * the producing mesh to one of the consuming mesh. */
typedef struct xfer {
    int src, dst;
    int region, chunk, chunks;
    double bytes, seconds;
} xfer;

/* The all-gather among receivers that got chunks of one region (or whole
 * parts of their tile), as run by one of them (member). */
typedef struct xgather {
    int group, member;
    int region, regions; /* regions > 1: the whole parts region .. region + regions - 1 */
    double bytes, seconds;
} xgather;

/* A tensor that crosses from stage `from` to stage `to`. */
typedef struct crossing {
    int tensor; /* step tensor */
    int from, to;
    ps_phase phase;     /* of its producer: the receiver takes it before that phase */
    bool param_copy;    /* a shared parameter, sent after the owner's update */
    bool accumulated;   /* a gradient contribution accumulated over the micro-batches,
                         * sent once before the sender's update (phase UPDATE) */
    int src_buffer;     /* sender's home buffer */
    int reduce_steps;   /* partial sums reduced on the sender first */
    ps_reshard_step reduce[PS_RESHARD_MAX_STEPS];
    int reduced_buffer[PS_RESHARD_MAX_STEPS];
    int dst_buffer;     /* receiver's home buffer */
    int n_xfers, n_gathers;
    xfer *xfers;
    xgather *gathers;
} crossing;

typedef struct stage_ctx {
    const ps_plan_stage *ps;
    int n_ops;
    int *ops;             /* [n_ops] step op ids */
    ps_graph *slice;
    int *slice_of;        /* [step tensors] slice tensor id, -1 */
    int *step_of;         /* [slice tensors] step tensor id */
    ps_logical_mesh *mesh;
    ps_strategy *strat;   /* [n_ops] */
    /* [n_ops * PS_MAX_OP_IO] per output, the mesh axes whose in-op reduction
     * makes it (an output that the strategy's split label itself divides
     * over an axis is not reduced there: a MoE combine's expert gradient
     * beside its slot weights' reduce-scattered one) */
    uint8_t *out_reduced;
    int *home;            /* [slice tensors] buffer of the layout as produced/stored */
    int *last_use;        /* [slice tensors] stage op index of the last consumer, -1 */
    int *first_use;       /* [slice tensors] of the first consumer, -1 */
    unsigned char *cls;
    unsigned char *program_free; /* freed by the program after its sends */
    int *plan_tensor;     /* [slice tensors] index into the plan stage's tensors */
    int kernel[PS_PHASE_COUNT];
} stage_ctx;

typedef struct lower_ctx {
    const ps_plan *plan;
    const ps_plan_model *model;
    const ps_graph *step;
    ps_lower_options opt;
    ps_program_set *set;
    int n_stages;
    stage_ctx *st;
    int *stage_of_layer;
    bool *update_reads; /* [step tensors]: read by an update-pass op */
    int n_cross, cap_cross;
    crossing *cross;
    int vote_group;  /* dynamic loss scaling: every device of the plan; -1 without */
    double vote_s;   /* predicted time of its one-float all-reduce */
    /* The device whose program is being written: its part of each crossing,
     * crossing i's in [start[i], start[i + 1]) of each list (indices into
     * its xfers or gathers), so that a program's sends and receives do not
     * scan every device's transfers once per micro-batch. */
    int *recv, *recv_start, *send, *send_start, *gather, *gather_start;
    ps_error *err;
} lower_ctx;

static ps_phase phase_of(ps_pass pass)
{
    switch (pass) {
    case PS_PASS_FORWARD: return PS_PHASE_FORWARD;
    case PS_PASS_RECOMPUTE:
    case PS_PASS_BACKWARD: return PS_PHASE_BACKWARD;
    default: return PS_PHASE_UPDATE;
    }
}

/* ---- buffers and kernel emission ---- */

static ps_status new_buffer(lower_ctx *L, int stage, int tensor, const ps_sharding_spec *spec,
                            bool per_mb, int *id)
{
    const stage_ctx *s = &L->st[stage];
    ps_buffer b = {.tensor = tensor, .stage = stage, .spec = *spec, .per_microbatch = per_mb};
    b.bytes = ps_spec_tile_bytes(spec, &L->step->tensors[tensor].desc, s->mesh->shape);
    if (ps_program_add_buffer(L->set, &b, id) != PS_OK)
        return ps_error_set(L->err, PS_ERR_NOMEM, "out of memory");
    return PS_OK;
}

static ps_status kernel_of(lower_ctx *L, int stage, ps_phase ph, ps_kernel **out)
{
    stage_ctx *s = &L->st[stage];
    if (s->kernel[ph] < 0) {
        if (ps_program_add_kernel(L->set, stage, ph, &s->kernel[ph]) != PS_OK)
            return ps_error_set(L->err, PS_ERR_NOMEM, "out of memory");
        L->set->stages[stage].kernel[ph] = s->kernel[ph];
    }
    *out = &L->set->kernels[s->kernel[ph]];
    return PS_OK;
}

static ps_status emit(lower_ctx *L, ps_kernel *k, const ps_instr *in)
{
    if (ps_kernel_append(k, in) != PS_OK)
        return ps_error_set(L->err, PS_ERR_NOMEM, "out of memory");
    return PS_OK;
}

static ps_status emit_simple(lower_ctx *L, ps_kernel *k, ps_instr_kind kind, int buffer)
{
    ps_instr in = ps_instr_init(kind);
    in.buffer = buffer;
    if (kind == PS_INSTR_ALLOC || kind == PS_INSTR_LOAD)
        in.bytes = L->set->buffers[buffer].bytes;
    return emit(L, k, &in);
}

/* Emits the steps turning buffer `from` into layout `to` (ps_reshard_plan).
 * The last step writes dst when dst >= 0 (an existing buffer), else a new
 * one; intermediate buffers are freed as soon as read. *result: the buffer
 * holding `to` (from itself when nothing is needed). */
static ps_status emit_reshard(lower_ctx *L, int stage, ps_kernel *k, int from,
                              const ps_sharding_spec *to, bool per_mb, int dst, uint8_t flags,
                              int *result)
{
    stage_ctx *s = &L->st[stage];
    const ps_buffer *fb = &L->set->buffers[from];
    int tensor = fb->tensor;
    ps_sharding_spec from_spec = fb->spec;
    const ps_tensor_desc *desc = &L->step->tensors[tensor].desc;
    ps_reshard_step steps[PS_RESHARD_MAX_STEPS];
    int n = ps_reshard_plan(s->mesh, desc, &from_spec, to, steps);
    char a[PS_SPEC_STR_MAX];
    if (n < 0)
        return ps_error_set(L->err, PS_ERR_INVALID,
                            "stage %d: tensor %s cannot be laid out as %s on a %d x %d mesh",
                            stage, L->step->tensors[tensor].name, ps_spec_format(to, a, sizeof a),
                            s->mesh->shape[0], s->mesh->shape[1]);
    int cur = from;
    for (int i = 0; i < n; i++) {
        int target = -1;
        if (i == n - 1 && dst >= 0) {
            target = dst;
        } else {
            ps_status st = new_buffer(L, stage, tensor, &steps[i].to, per_mb, &target);
            if (st == PS_OK)
                st = emit_simple(L, k, PS_INSTR_ALLOC, target);
            if (st != PS_OK)
                return st;
        }
        ps_instr in = ps_instr_init(steps[i].kind < 0 ? PS_INSTR_SLICE : PS_INSTR_COLLECTIVE);
        if (steps[i].kind >= 0) {
            in.coll = (uint8_t)steps[i].kind;
            in.axis = (int8_t)steps[i].axis;
            in.bytes = steps[i].bytes;
            in.seconds = steps[i].seconds;
        }
        in.src_buffer = cur;
        in.buffer = target;
        if (i == n - 1)
            in.flags = flags;
        ps_status st = emit(L, k, &in);
        if (st == PS_OK && cur != from)
            st = emit_simple(L, k, PS_INSTR_FREE, cur);
        if (st != PS_OK)
            return st;
        cur = target;
    }
    *result = cur;
    return PS_OK;
}

/* The layout an op's strategy computes before its in-op reduction: the
 * output with the reduced axes still pending as partial sums. */
static bool strategy_reduces(const ps_strategy *s, char *how)
{
    const char *plus = strchr(s->name, '+');
    if (plus == NULL)
        return false;
    *how = plus[1];
    return plus[1] == 'a' || plus[1] == 'r';
}

static ps_sharding_spec raw_output(const ps_strategy *s, const ps_sharding_spec *out,
                                   unsigned reduced)
{
    ps_sharding_spec raw = *out;
    char how = 0;
    if (!strategy_reduces(s, &how) || out->partial & s->comm_axes)
        return raw;
    for (int a = 0; a < PS_MESH_AXES; a++) {
        unsigned bit = 1u << a;
        if (!(s->comm_axes & reduced & bit))
            continue;
        if (how == 'r') /* reduce-scatter: the split came from the reduction */
            for (int d = 0; d < raw.rank; d++)
                raw.dim_axes[d] &= (uint8_t)~bit;
        raw.partial |= (uint8_t)bit;
    }
    return raw;
}

/* Local FLOPs of an op under a strategy: its work divided over the mesh
 * axes the strategy splits. */
static double local_share(const ps_strategy *s, const ps_logical_mesh *m)
{
    double parts = 1;
    for (int a = 0; a < PS_MESH_AXES; a++)
        if (s->assign[a] != PS_LABEL_NONE)
            parts *= m->shape[a];
    return 1.0 / parts;
}

/* The layout an op's kernel reads or writes an operand in. An expert-
 * parallel strategy (a2a@a) holds the expert rows [e, g, c, m] split by
 * expert over axis a and the tokens split by group; a kernel computes with
 * both split by group, so the expert operand's split moves to its groups
 * there, and the all-to-all around the op is an ordinary resharding
 * (ps_reshard_plan: a split that moves to another dimension). */
static ps_sharding_spec kernel_layout(const ps_strategy *sg, const ps_op *op,
                                      const ps_sharding_spec *spec)
{
    ps_sharding_spec k = *spec;
    bool moves = op->kind == PS_OP_MOE_DISPATCH || op->kind == PS_OP_MOE_COMBINE ||
                 op->kind == PS_OP_MOE_DISPATCH_GRAD || op->kind == PS_OP_MOE_COMBINE_GRAD;
    if (!moves || spec->rank != 4)
        return k;
    for (int a = 0; a < PS_MESH_AXES; a++) {
        uint8_t bit = (uint8_t)(1u << a);
        if (sg->assign[a] == PS_LABEL_A2A && (k.dim_axes[0] & bit)) {
            k.dim_axes[0] &= (uint8_t)~bit;
            k.dim_axes[1] |= bit;
        }
    }
    return k;
}

static bool expert_parallel(const ps_strategy *sg)
{
    for (int a = 0; a < PS_MESH_AXES; a++)
        if (sg->assign[a] == PS_LABEL_A2A)
            return true;
    return false;
}

/* ---- per stage: slice, strategies, classes ---- */

static int stage_of_op(const lower_ctx *L, int op)
{
    return L->stage_of_layer[L->step->ops[op].layer];
}

static uint64_t name_hash(const char *n)
{
    uint64_t h = 1469598103934665603ull;
    for (; *n; n++)
        h = (h ^ (unsigned char)*n) * 1099511628211ull;
    return h;
}

/* For every slice tensor, the index of the plan stage's tensor of that name. */
static ps_status plan_tensor_index(const ps_plan_stage *ps, const ps_graph *slice,
                                   const ps_graph *g, const int *step_of, int **out,
                                   ps_error *err)
{
    int cap = 16;
    while (cap < 2 * ps->n_tensors)
        cap *= 2;
    int *table = malloc((size_t)cap * sizeof *table);
    int *idx = malloc(((size_t)slice->n_tensors + 1) * sizeof *idx);
    if (table == NULL || idx == NULL) {
        free(table);
        free(idx);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < cap; i++)
        table[i] = -1;
    for (int i = 0; i < ps->n_tensors; i++) {
        uint64_t h = name_hash(ps->tensors[i].name) & (uint64_t)(cap - 1);
        while (table[h] >= 0)
            h = (h + 1) & (uint64_t)(cap - 1);
        table[h] = i;
    }
    for (int t = 0; t < slice->n_tensors; t++) {
        const char *name = g->tensors[step_of[t]].name;
        uint64_t h = name_hash(name) & (uint64_t)(cap - 1);
        idx[t] = -1;
        for (; table[h] >= 0; h = (h + 1) & (uint64_t)(cap - 1))
            if (strcmp(ps->tensors[table[h]].name, name) == 0) {
                idx[t] = table[h];
                break;
            }
    }
    free(table);
    *out = idx;
    return PS_OK;
}

static ps_status stage_setup(lower_ctx *L, int k)
{
    ps_status st = PS_OK;
    stage_ctx *s = &L->st[k];
    const ps_plan_stage *ps = &L->plan->stages[k];
    const ps_graph *g = L->step;
    ps_error *err = L->err;
    unsigned char *batch = NULL, *keep = NULL;
    s->ps = ps;
    for (int ph = 0; ph < PS_PHASE_COUNT; ph++)
        s->kernel[ph] = -1;
    PS_TRY(ps_mesh_create(L->plan->cluster, ps->devices[0], ps->submesh[0], ps->submesh[1],
                          ps->logical_mesh[0], ps->logical_mesh[1], &s->mesh, err));
    /* a plan may list its devices in any order: the mesh is the plan's */
    for (int i = 0; i < ps->n_devices; i++)
        s->mesh->devices[i] = ps->devices[i];
    PS_TRY(ps_graph_slice(g, ps->first_layer, ps->last_layer, &s->slice, err));
    s->ops = malloc(((size_t)ps->n_ops + 1) * sizeof *s->ops);
    s->slice_of = malloc(((size_t)g->n_tensors + 1) * sizeof *s->slice_of);
    PS_TRY_ALLOC(s->ops, err);
    PS_TRY_ALLOC(s->slice_of, err);
    int next = ps_graph_slice_numbering(g, ps->first_layer, ps->last_layer, s->slice_of);
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        if (op->layer < ps->first_layer || op->layer > ps->last_layer)
            continue;
        if (s->n_ops >= ps->n_ops || s->n_ops >= s->slice->n_ops)
            PS_TRY(ps_error_set(err, PS_ERR_INVALID, "stage %d: more ops than the plan lists", k));
        s->ops[s->n_ops++] = i;
    }
    int n_t = s->slice->n_tensors;
    if (next != n_t || s->n_ops != ps->n_ops)
        PS_TRY(ps_error_set(err, PS_ERR_INTERNAL, "stage %d: %d ops, the plan lists %d", k,
                            s->n_ops, ps->n_ops));
    s->step_of = malloc(((size_t)n_t + 1) * sizeof *s->step_of);
    s->home = malloc(((size_t)n_t + 1) * sizeof *s->home);
    s->last_use = malloc(((size_t)n_t + 1) * sizeof *s->last_use);
    s->first_use = malloc(((size_t)n_t + 1) * sizeof *s->first_use);
    s->cls = calloc((size_t)n_t + 1, 1);
    s->program_free = calloc((size_t)n_t + 1, 1);
    s->strat = calloc((size_t)ps->n_ops + 1, sizeof *s->strat);
    s->out_reduced = calloc((size_t)ps->n_ops * PS_MAX_OP_IO + 1, 1);
    PS_TRY_ALLOC(s->out_reduced, err);
    PS_TRY_ALLOC(s->step_of, err);
    PS_TRY_ALLOC(s->home, err);
    PS_TRY_ALLOC(s->last_use, err);
    PS_TRY_ALLOC(s->first_use, err);
    PS_TRY_ALLOC(s->cls, err);
    PS_TRY_ALLOC(s->program_free, err);
    PS_TRY_ALLOC(s->strat, err);
    for (int t = 0; t < g->n_tensors; t++)
        if (s->slice_of[t] >= 0)
            s->step_of[s->slice_of[t]] = t;
    /* the plan lists the tensors in the order of the graph it was solved
     * on (the stage's slice, or the whole step): find them by name */
    PS_TRY(plan_tensor_index(ps, s->slice, g, s->step_of, &s->plan_tensor, err));
    for (int t = 0; t < n_t; t++) {
        s->home[t] = s->last_use[t] = s->first_use[t] = -1;
        if (s->plan_tensor[t] < 0)
            PS_TRY(ps_error_set(err, PS_ERR_INVALID, "stage %d: the plan has no layout for %s", k,
                                g->tensors[s->step_of[t]].name));
    }
    /* The tensor table must agree with the ops: a tensor's layout is the one
     * its producer writes, and a source of the step (a parameter, an input,
     * optimizer state) is stored with no pending sums. A hand-edited plan
     * that disagrees would otherwise run, and compute wrong numbers. */
    for (int j = 0; j < s->n_ops; j++) {
        const ps_op *op = &s->slice->ops[j];
        for (int q = 0; q < op->n_out; q++) {
            const ps_plan_tensor *pt = &ps->tensors[s->plan_tensor[op->out[q]]];
            if (!ps_spec_equal(&pt->spec, &ps->ops[j].out[q])) {
                char listed[PS_SPEC_STR_MAX], written[PS_SPEC_STR_MAX];
                PS_TRY(ps_error_set(err, PS_ERR_INVALID,
                                    "stage %d: tensor %s: the plan lists layout %s, but op %s "
                                    "writes it as %s",
                                    k, pt->name, ps_spec_format(&pt->spec, listed, sizeof listed),
                                    op->name,
                                    ps_spec_format(&ps->ops[j].out[q], written, sizeof written)));
            }
        }
    }
    for (int t = 0; t < n_t; t++) {
        const ps_tensor *whole = &g->tensors[s->step_of[t]];
        const ps_plan_tensor *pt = &ps->tensors[s->plan_tensor[t]];
        if (whole->producer < 0 && pt->spec.partial != 0) {
            char listed[PS_SPEC_STR_MAX];
            PS_TRY(ps_error_set(err, PS_ERR_INVALID,
                                "stage %d: tensor %s: a source of the step (%s) holds whole "
                                "values, but the plan gives it pending sums (%s)",
                                k, pt->name, ps_tensor_kind_names[whole->kind],
                                ps_spec_format(&pt->spec, listed, sizeof listed)));
        }
    }
    /* the strategy of every op, found again by its layouts */
    PS_TRY(ps_batch_dims(s->slice, &batch, err));
    PS_TRY(ps_intra_keep_partial(s->slice, &keep, err));
    ps_strategy_options so = {.force_batch_axis0 = false, .keep_partial = keep};
    for (int j = 0; j < s->n_ops; j++) {
        ps_op_signature sig;
        ps_strategy *list = NULL;
        int n_list = 0;
        PS_TRY(ps_op_signature_of(s->slice, j, batch, &sig, err));
        PS_TRY(ps_op_strategies(s->slice, j, &sig, s->mesh, &so, &list, &n_list, err));
        const ps_plan_op *po = &ps->ops[j];
        int found = -1;
        for (int c = 0; c < n_list && found < 0; c++) {
            bool same = true;
            for (int q = 0; q < po->n_in && same; q++)
                same = ps_spec_equal(&list[c].in[q], &po->in[q]);
            for (int q = 0; q < po->n_out && same; q++)
                same = ps_spec_equal(&list[c].out[q], &po->out[q]);
            if (same)
                found = c;
        }
        if (found >= 0) {
            s->strat[j] = list[found];
            for (int q = 0; q < sig.n_out && q < PS_MAX_OP_IO; q++)
                for (int a = 0; a < PS_MESH_AXES; a++) {
                    int label = list[found].assign[a];
                    bool own = false;
                    for (int d = 0; d < sig.out_rank[q] && label >= 0; d++)
                        own = own || sig.out[q][d] == label;
                    if (!own && (list[found].comm_axes & (1u << a)))
                        s->out_reduced[(size_t)j * PS_MAX_OP_IO + q] |= (uint8_t)(1u << a);
                }
        }
        free(list);
        if (found < 0)
            PS_TRY(ps_error_set(err, PS_ERR_INVALID,
                                "stage %d: op %s: no strategy reads and writes the plan's layouts "
                                "(strategy %s)",
                                k, po->name, po->strategy));
    }
    /* uses and classes */
    for (int j = 0; j < s->n_ops; j++) {
        const ps_op *op = &s->slice->ops[j];
        for (int q = 0; q < op->n_in; q++) {
            int t = op->in[q];
            if (s->first_use[t] < 0)
                s->first_use[t] = j;
            s->last_use[t] = j;
        }
    }
    for (int t = 0; t < n_t; t++) {
        const ps_tensor *x = &g->tensors[s->step_of[t]];
        int fu = s->first_use[t];
        if (x->producer < 0)
            s->cls[t] = x->kind == PS_TENSOR_INPUT ? CLS_DATA : CLS_PERSIST;
        else if (s->slice->tensors[t].producer < 0)
            s->cls[t] = fu >= 0 && s->slice->ops[fu].pass == PS_PASS_UPDATE ? CLS_RECV_STEP
                                                                           : CLS_RECV;
        else
            s->cls[t] = CLS_LOCAL;
    }
    /* what an update reads, here or in another stage, from the micro-batches'
     * passes: accumulated over them */
    for (int t = 0; t < n_t; t++) {
        int p = s->slice->tensors[t].producer;
        if (s->cls[t] == CLS_LOCAL && p >= 0 && s->slice->ops[p].pass != PS_PASS_UPDATE &&
            L->update_reads[s->step_of[t]])
            s->cls[t] = CLS_ACCUM;
    }
out:
    free(batch);
    free(keep);
    return st;
}

/* ---- kernels ---- */

/* Dynamic loss scaling, before the stage's first optimizer op (op j0; every
 * update op after it is an ADAM): each ADAM's gradient is synchronised
 * first (grad_operand[j]: the buffer it will read), and then the overflow
 * vote over the whole plan checks them all. A gradient home nothing else
 * reads goes as soon as its synchronised copy exists, so the update holds
 * the gradients about once, as without the vote. */
static ps_status emit_vote(lower_ctx *L, int k, ps_kernel *kern, int j0, int *grad_operand,
                           unsigned char *home_freed)
{
    stage_ctx *s = &L->st[k];
    int n_checked = 0, *checked = malloc(((size_t)s->n_ops + 1) * sizeof *checked);
    if (checked == NULL)
        return ps_error_set(L->err, PS_ERR_NOMEM, "out of memory");
    ps_status st = PS_OK;
    for (int j = j0; j >= 0 && j < s->n_ops; j++) {
        const ps_op *op = &s->slice->ops[j];
        if (op->kind != PS_OP_ADAM || op->n_in < 2)
            continue;
        int t = op->in[1];
        if (s->home[t] < 0) {
            st = ps_error_set(L->err, PS_ERR_INTERNAL, "stage %d: %s read before written", k,
                              L->step->tensors[s->step_of[t]].name);
            goto out;
        }
        PS_TRY(emit_reshard(L, k, kern, s->home[t], &s->ps->ops[j].in[1], false, -1, 0,
                            &grad_operand[j]));
        checked[n_checked++] = grad_operand[j];
        bool read_again = false;
        for (int q = 0; q < op->n_in; q++)
            read_again |= q != 1 && op->in[q] == t;
        if (grad_operand[j] != s->home[t] && s->last_use[t] == j && !read_again &&
            s->cls[t] != CLS_PERSIST && !s->program_free[t]) {
            PS_TRY(emit_simple(L, kern, PS_INSTR_FREE, s->home[t]));
            home_freed[t] = 1;
        }
    }
    checked[n_checked] = -1;
    ps_instr v = ps_instr_init(PS_INSTR_COLLECTIVE);
    v.coll = PS_COLL_ALL_REDUCE;
    v.flags = PS_INSTR_FINITE_VOTE;
    v.group = L->vote_group;
    v.bytes = sizeof(float);
    v.seconds = L->vote_s;
    if (ps_program_add_operands(L->set, checked, n_checked + 1, &v.operands) != PS_OK) {
        st = ps_error_set(L->err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    st = emit(L, kern, &v);
out:
    free(checked);
    return st;
}

/* The vote's group (every device of every stage, stage by stage) and its
 * predicted time: a ring all-reduce of one float, each of its 2(n-1) steps
 * as slow as the slowest link of the ring. */
static ps_status vote_setup(lower_ctx *L)
{
    const ps_plan *p = L->plan;
    int n = 0;
    for (int k = 0; k < p->n_stages; k++)
        n += p->stages[k].n_devices;
    int *devices = malloc(((size_t)n + 1) * sizeof *devices);
    if (devices == NULL)
        return ps_error_set(L->err, PS_ERR_NOMEM, "out of memory");
    n = 0;
    for (int k = 0; k < p->n_stages; k++)
        for (int i = 0; i < p->stages[k].n_devices; i++)
            devices[n++] = p->stages[k].devices[i];
    double chunk = (double)sizeof(float) / n, step_s = 0;
    for (int i = 0; i < n && n > 1; i++)
        step_s = fmax(step_s, ps_p2p_s(p->cluster, devices[i], devices[(i + 1) % n], chunk));
    L->vote_s = 2.0 * (n - 1) * step_s;
    ps_status st = ps_program_add_group(L->set, devices, n, &L->vote_group);
    free(devices);
    return st == PS_OK ? PS_OK : ps_error_set(L->err, PS_ERR_NOMEM, "out of memory");
}

static ps_status stage_kernels(lower_ctx *L, int k)
{
    ps_status st = PS_OK;
    stage_ctx *s = &L->st[k];
    const ps_graph *g = L->step;
    ps_error *err = L->err;
    int n_t = s->slice->n_tensors;
    int *grad_operand = malloc(((size_t)s->n_ops + 1) * sizeof *grad_operand);
    unsigned char *home_freed = calloc((size_t)n_t + 1, 1);
    bool voted = L->vote_group < 0;
    PS_TRY_ALLOC(grad_operand, err);
    PS_TRY_ALLOC(home_freed, err);
    for (int j = 0; j < s->n_ops; j++)
        grad_operand[j] = -1;
    /* homes of what exists before any op: sources, received tensors */
    for (int t = 0; t < n_t; t++) {
        bool per_mb = s->cls[t] == CLS_DATA || s->cls[t] == CLS_RECV;
        if (s->cls[t] == CLS_LOCAL)
            continue;
        PS_TRY(new_buffer(L, k, s->step_of[t], &s->ps->tensors[s->plan_tensor[t]].spec, per_mb, &s->home[t]));
    }
    for (int j = 0; j < s->n_ops; j++) {
        const ps_op *op = &s->slice->ops[j];
        const ps_op *sop = &g->ops[s->ops[j]];
        const ps_plan_op *po = &s->ps->ops[j];
        const ps_strategy *sg = &s->strat[j];
        ps_phase ph = phase_of(op->pass);
        bool per_mb = ph != PS_PHASE_UPDATE;
        ps_kernel *kern = NULL;
        PS_TRY(kernel_of(L, k, ph, &kern));
        if (!voted && op->kind == PS_OP_ADAM) {
            PS_TRY(emit_vote(L, k, kern, j, grad_operand, home_freed));
            voted = true;
        }
        int operand[2 * PS_MAX_OP_IO], raw[PS_MAX_OP_IO];
        for (int q = 0; q < op->n_in; q++) {
            int t = op->in[q];
            if (q == 1 && grad_operand[j] >= 0) { /* synchronised before the vote */
                operand[q] = grad_operand[j];
                continue;
            }
            if (s->cls[t] == CLS_DATA && s->first_use[t] == j) {
                /* data arrives where it is first read; later reads of the same
                 * micro-batch (the loss's backward) find it there */
                PS_TRY(emit_simple(L, kern, PS_INSTR_ALLOC, s->home[t]));
                PS_TRY(emit_simple(L, kern, PS_INSTR_LOAD, s->home[t]));
            }
            if (s->home[t] < 0)
                return ps_error_set(err, PS_ERR_INTERNAL, "stage %d: %s read before written", k,
                                    g->tensors[s->step_of[t]].name);
            ps_sharding_spec in_layout = kernel_layout(sg, sop, &po->in[q]);
            PS_TRY(emit_reshard(L, k, kern, s->home[t], &in_layout, per_mb, -1, 0, &operand[q]));
        }
        for (int q = 0; q < op->n_out; q++) {
            int t = op->out[q];
            if (s->cls[t] != CLS_ACCUM) {
                PS_TRY(new_buffer(L, k, s->step_of[t], &po->out[q], per_mb, &s->home[t]));
                PS_TRY(emit_simple(L, kern, PS_INSTR_ALLOC, s->home[t]));
            }
            ps_sharding_spec r = raw_output(sg, &po->out[q],
                                            s->out_reduced[(size_t)j * PS_MAX_OP_IO + q]);
            r = kernel_layout(sg, sop, &r);
            raw[q] = -1;
            if (!ps_spec_equal(&r, &po->out[q])) {
                PS_TRY(new_buffer(L, k, s->step_of[t], &r, per_mb, &raw[q]));
                PS_TRY(emit_simple(L, kern, PS_INSTR_ALLOC, raw[q]));
            }
            operand[op->n_in + q] = raw[q] >= 0 ? raw[q] : s->home[t];
        }
        ps_instr c = ps_instr_init(PS_INSTR_COMPUTE);
        c.op = s->ops[j];
        double share = local_share(sg, s->mesh);
        c.flops = sop->cost.flops * share;
        c.bytes = (sop->cost.bytes_read + sop->cost.bytes_written) * share;
        c.seconds = po->compute_s;
        for (int q = 0; q < op->n_out; q++)
            if (s->cls[op->out[q]] == CLS_ACCUM && raw[q] < 0)
                c.flags |= PS_INSTR_ACCUMULATE;
        if (ps_program_add_operands(L->set, operand, op->n_in + op->n_out, &c.operands) != PS_OK)
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        PS_TRY(emit(L, kern, &c));
        char how = 0;
        bool reduces = strategy_reduces(sg, &how);
        for (int q = 0; q < op->n_out; q++) {
            if (raw[q] < 0)
                continue;
            int t = op->out[q], got;
            uint8_t flags = s->cls[t] == CLS_ACCUM ? PS_INSTR_ACCUMULATE : 0;
            PS_TRY(emit_reshard(L, k, kern, raw[q], &po->out[q], per_mb, s->home[t], flags, &got));
            PS_TRY(emit_simple(L, kern, PS_INSTR_FREE, raw[q]));
        }
        if (!reduces && sg->comm_s > 0 && !expert_parallel(sg)) {
            /* the op's own exchange (loss statistics); an expert-parallel
             * op's all-to-all is the resharding around it (kernel_layout) */
            ps_instr x = ps_instr_init(PS_INSTR_COLLECTIVE);
            x.op = s->ops[j];
            x.coll = (uint8_t)sg->comm_kind;
            x.axis = (int8_t)(sg->comm_axes == 3 ? 2 : sg->comm_axes == 2 ? 1 : 0);
            x.bytes = sg->comm_bytes;
            x.seconds = sg->comm_s;
            PS_TRY(emit(L, kern, &x));
        }
        if (op->kind == PS_OP_ADAM) {
            /* in-place operands return to their own layout (ZeRO's gather) */
            for (int q = 0; q < op->n_in; q++) {
                int t = op->in[q], got;
                if (q == 1 || operand[q] == s->home[t])
                    continue;
                PS_TRY(emit_reshard(L, k, kern, operand[q], &s->ps->tensors[s->plan_tensor[t]].spec, per_mb,
                                    s->home[t], 0, &got));
            }
        }
        for (int q = 0; q < op->n_in; q++) {
            int t = op->in[q];
            if (operand[q] != s->home[t])
                PS_TRY(emit_simple(L, kern, PS_INSTR_FREE, operand[q]));
        }
        /* homes read for the last time (each tensor once) */
        for (int q = 0; q < op->n_in; q++) {
            int t = op->in[q];
            bool seen = false;
            for (int r = 0; r < q; r++)
                seen |= op->in[r] == t;
            if (seen || s->last_use[t] != j || s->cls[t] == CLS_PERSIST || s->program_free[t] ||
                home_freed[t])
                continue;
            PS_TRY(emit_simple(L, kern, PS_INSTR_FREE, s->home[t]));
        }
        /* outputs nobody reads here: freed now, or after their sends */
        for (int q = 0; q < op->n_out; q++) {
            int t = op->out[q];
            if (s->last_use[t] < 0 && !s->program_free[t] && s->cls[t] != CLS_ACCUM)
                PS_TRY(emit_simple(L, kern, PS_INSTR_FREE, s->home[t]));
        }
    }
    if (!voted) { /* no optimizer op here: the stage still takes part */
        ps_kernel *kern = NULL;
        PS_TRY(kernel_of(L, k, PS_PHASE_UPDATE, &kern));
        PS_TRY(emit_vote(L, k, kern, -1, grad_operand, home_freed));
    }
out:
    free(grad_operand);
    free(home_freed);
    return st;
}

/* ---- crossings between stages ---- */

static ps_status cross_add(lower_ctx *L, crossing **out)
{
    if (ps_array_grow((void **)&L->cross, &L->cap_cross, L->n_cross + 1, sizeof *L->cross) != PS_OK)
        return ps_error_set(L->err, PS_ERR_NOMEM, "out of memory");
    *out = &L->cross[L->n_cross++];
    memset(*out, 0, sizeof **out);
    return PS_OK;
}

/* The transfers that move tensor x from stage a's layout to stage b's. */
#define NOMEM_OUT                                                              \
    do {                                                                       \
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");                 \
        goto out;                                                              \
    } while (0)

static ps_status cross_plan(lower_ctx *L, crossing *x)
{
    ps_status st = PS_OK;
    ps_error *err = L->err;
    const stage_ctx *A = &L->st[x->from], *B = &L->st[x->to];
    const ps_tensor_desc *d = &L->step->tensors[x->tensor].desc;
    int ta = A->slice_of[x->tensor], tb = B->slice_of[x->tensor];
    ps_sharding_spec sa = A->ps->tensors[A->plan_tensor[ta]].spec,
                     sb = B->ps->tensors[B->plan_tensor[tb]].spec;
    int cap_x = 0, cap_g = 0;
    ps_cross_plan plan = {0};
    x->src_buffer = A->home[ta];
    x->dst_buffer = B->home[tb];
    if (sa.partial) {
        ps_sharding_spec full = sa;
        full.partial = 0;
        x->reduce_steps = ps_reshard_plan(A->mesh, d, &sa, &full, x->reduce);
        for (int i = 0; i < x->reduce_steps; i++)
            PS_TRY(new_buffer(L, x->from, x->tensor, &x->reduce[i].to, x->phase != PS_PHASE_UPDATE,
                              &x->reduced_buffer[i]));
        sa = full;
    }
    if (sb.partial)
        return ps_error_set(err, PS_ERR_INVALID, "stage %d receives %s as a partial sum", x->to,
                            L->step->tensors[x->tensor].name);
    PS_TRY(ps_cross_mesh_plan(L->plan->cluster, d, &sa, A->ps->devices, A->ps->logical_mesh, &sb,
                              B->mesh, L->opt.local_allgather, &plan, err));
    int group_id = -1, group_of = -1; /* the set's id of the plan's group group_of */
    int first_part = -1; /* group_of's parts: the set's regions from first_part on */
    for (int i = 0; i < plan.n_xfers; i++) {
        const ps_cross_xfer *px = &plan.xfers[i];
        if (px->group >= 0 && px->group != group_of) {
            group_of = px->group;
            int start = plan.group_start[px->group];
            if (ps_program_add_group(L->set, plan.group_devices + start,
                                     plan.group_start[px->group + 1] - start, &group_id) != PS_OK)
                NOMEM_OUT;
            /* whole parts: all of them, in order, so that the gather names them */
            first_part = L->set->n_regions;
            for (int k = plan.part_start[group_of]; k < plan.part_start[group_of + 1]; k++)
                if (ps_program_add_region(L->set, &plan.parts[k], NULL) != PS_OK)
                    NOMEM_OUT;
        }
        int region_id = px->part >= 0 ? first_part + px->part : -1;
        if (px->part < 0 && ps_program_add_region(L->set, &px->region, &region_id) != PS_OK)
            NOMEM_OUT;
        xfer t = {.src = px->src, .dst = px->dst, .region = region_id, .chunk = px->chunk,
                  .chunks = px->chunks, .bytes = px->bytes, .seconds = px->seconds};
        if (ps_array_grow((void **)&x->xfers, &cap_x, x->n_xfers + 1, sizeof *x->xfers) != PS_OK)
            NOMEM_OUT;
        x->xfers[x->n_xfers++] = t;
        if (px->gather_bytes > 0) {
            bool whole = px->part >= 0;
            int n_parts = plan.part_start[group_of + 1] - plan.part_start[group_of];
            xgather gth = {.group = group_id, .region = whole ? first_part : region_id,
                           .regions = whole ? n_parts : 1, .member = px->dst,
                           .bytes = px->gather_bytes, .seconds = px->gather_seconds};
            if (ps_array_grow((void **)&x->gathers, &cap_g, x->n_gathers + 1,
                              sizeof *x->gathers) != PS_OK)
                NOMEM_OUT;
            x->gathers[x->n_gathers++] = gth;
        }
    }
out:
    ps_cross_plan_clear(&plan);
    return st;
}
#undef NOMEM_OUT

static ps_status find_crossings(lower_ctx *L)
{
    ps_status st = PS_OK;
    const ps_graph *g = L->step;
    for (int b = 0; b < L->n_stages; b++) {
        stage_ctx *B = &L->st[b];
        for (int t = 0; t < B->slice->n_tensors; t++) {
            int T = B->step_of[t];
            const ps_tensor *x = &g->tensors[T];
            crossing *c = NULL;
            if (B->cls[t] == CLS_RECV || B->cls[t] == CLS_RECV_STEP) {
                int a = stage_of_op(L, x->producer);
                PS_TRY(cross_add(L, &c));
                c->tensor = T;
                c->from = a;
                c->to = b;
                c->phase = phase_of(g->ops[x->producer].pass);
                if (B->cls[t] == CLS_RECV_STEP) {
                    c->accumulated = c->phase != PS_PHASE_UPDATE;
                    c->phase = PS_PHASE_UPDATE;
                }
                continue;
            }
            if (B->cls[t] != CLS_PERSIST)
                continue;
            /* a parameter (or its state) updated in another stage: that
             * stage sends the updated value after its update */
            for (int a = 0; a < L->n_stages; a++) {
                if (a == b)
                    continue;
                stage_ctx *A = &L->st[a];
                int ta = A->slice_of[T];
                if (ta < 0)
                    continue;
                bool owner = false;
                for (int j = 0; j < A->n_ops && !owner; j++) {
                    const ps_op *op = &A->slice->ops[j];
                    if (op->kind == PS_OP_ADAM)
                        for (int q = 0; q < op->n_in; q++)
                            owner |= op->in[q] == ta && q != 1;
                }
                if (!owner)
                    continue;
                PS_TRY(cross_add(L, &c));
                c->tensor = T;
                c->from = a;
                c->to = b;
                c->phase = PS_PHASE_UPDATE;
                c->param_copy = true;
                break;
            }
        }
    }
    /* what is sent and freed by the program: produced here, read by
     * nobody here after the producing phase */
    for (int i = 0; i < L->n_cross; i++) {
        crossing *c = &L->cross[i];
        if (c->param_copy)
            continue;
        stage_ctx *A = &L->st[c->from];
        int ta = A->slice_of[c->tensor];
        int lu = A->last_use[ta];
        if (lu < 0 || phase_of(A->slice->ops[lu].pass) == c->phase)
            A->program_free[ta] = 1;
    }
out:
    return st;
}

/* ---- programs ---- */

static ps_status append(lower_ctx *L, ps_program *p, const ps_instr *in)
{
    if (ps_program_append(p, in) != PS_OK)
        return ps_error_set(L->err, PS_ERR_NOMEM, "out of memory");
    return PS_OK;
}

static ps_status append_simple(lower_ctx *L, ps_program *p, ps_instr_kind kind, int buffer, int mb)
{
    ps_instr in = ps_instr_init(kind);
    in.buffer = buffer;
    in.mb = mb;
    if (kind == PS_INSTR_ALLOC)
        in.bytes = L->set->buffers[buffer].bytes;
    return append(L, p, &in);
}

/* Receives of stage b's device for the crossings taken before phase ph. */
/* Around the update kernel: what is received before it (what the update
 * reads) and after it (copies of shared parameters), what is sent before it
 * (accumulated gradient contributions) and after it (what it produced). */
enum { AROUND_ANY = 0, AROUND_BEFORE = 1, AROUND_AFTER = 2 };

static bool receive_when(const crossing *c, int when)
{
    return when == AROUND_ANY || (when == AROUND_BEFORE) == !c->param_copy;
}

static bool send_when(const crossing *c, int when)
{
    return when == AROUND_ANY || (when == AROUND_BEFORE) == c->accumulated;
}

static ps_status program_receive(lower_ctx *L, ps_program *p, int b, ps_phase ph, int mb,
                                 int when)
{
    ps_status st = PS_OK;
    for (int i = 0; i < L->n_cross; i++) {
        const crossing *c = &L->cross[i];
        if (c->to != b || c->phase != ph || !receive_when(c, when))
            continue;
        if (!c->param_copy)
            PS_TRY(append_simple(L, p, PS_INSTR_ALLOC, c->dst_buffer, mb));
        for (int j = L->recv_start[i]; j < L->recv_start[i + 1]; j++) {
            const xfer *t = &c->xfers[L->recv[j]];
            ps_instr in = ps_instr_init(PS_INSTR_RECV);
            in.buffer = c->dst_buffer;
            in.mb = mb;
            in.peer = t->src;
            in.region = t->region;
            in.chunk = t->chunk;
            in.chunks = t->chunks;
            in.bytes = t->bytes;
            in.seconds = t->seconds;
            PS_TRY(append(L, p, &in));
        }
        for (int j = L->gather_start[i]; j < L->gather_start[i + 1]; j++) {
            const xgather *gt = &c->gathers[L->gather[j]];
            ps_instr in = ps_instr_init(PS_INSTR_COLLECTIVE);
            in.coll = PS_COLL_ALL_GATHER;
            in.group = gt->group;
            /* receivers sharing their tile over the whole mesh gather as
             * it is priced, hierarchically (a flat ring over both axes
             * crossed the NICs with twice the bytes) */
            if (gt->group == p->axis_group[PS_MESH_AXES])
                in.axis = PS_MESH_AXES;
            in.buffer = c->dst_buffer;
            in.mb = mb;
            in.region = gt->region;
            in.chunks = gt->regions;
            in.bytes = gt->bytes;
            in.seconds = gt->seconds;
            PS_TRY(append(L, p, &in));
        }
    }
out:
    return st;
}

/* Sends of stage a's device for the crossings produced in phase ph. */
static ps_status program_send(lower_ctx *L, ps_program *p, int a, ps_phase ph, int mb,
                              int when)
{
    ps_status st = PS_OK;
    stage_ctx *A = &L->st[a];
    for (int i = 0; i < L->n_cross; i++) {
        const crossing *c = &L->cross[i];
        if (c->from != a || c->phase != ph || !send_when(c, when))
            continue;
        int src = c->src_buffer;
        for (int r = 0; r < c->reduce_steps; r++) {
            int dst = c->reduced_buffer[r];
            PS_TRY(append_simple(L, p, PS_INSTR_ALLOC, dst, mb));
            ps_instr in = ps_instr_init(PS_INSTR_COLLECTIVE);
            in.coll = (uint8_t)c->reduce[r].kind;
            in.axis = (int8_t)c->reduce[r].axis; /* 2: the whole mesh, hierarchically */
            in.src_buffer = src;
            in.buffer = dst;
            in.mb = mb;
            in.bytes = c->reduce[r].bytes;
            in.seconds = c->reduce[r].seconds;
            PS_TRY(append(L, p, &in));
            if (src != c->src_buffer)
                PS_TRY(append_simple(L, p, PS_INSTR_FREE, src, mb));
            src = dst;
        }
        for (int j = L->send_start[i]; j < L->send_start[i + 1]; j++) {
            const xfer *t = &c->xfers[L->send[j]];
            ps_instr in = ps_instr_init(PS_INSTR_SEND);
            in.buffer = src;
            in.mb = mb;
            in.peer = t->dst;
            in.region = t->region;
            in.chunk = t->chunk;
            in.chunks = t->chunks;
            in.bytes = t->bytes;
            in.seconds = t->seconds;
            PS_TRY(append(L, p, &in));
        }
        if (src != c->src_buffer)
            PS_TRY(append_simple(L, p, PS_INSTR_FREE, src, mb));
        /* the last crossing of a tensor frees it when nothing here reads it */
        bool last = true;
        for (int j = i + 1; j < L->n_cross && last; j++)
            last = !(L->cross[j].from == a && L->cross[j].tensor == c->tensor &&
                     L->cross[j].phase == ph);
        int ta = A->slice_of[c->tensor];
        if (last && A->program_free[ta] && !c->param_copy)
            PS_TRY(append_simple(L, p, PS_INSTR_FREE, c->src_buffer, mb));
    }
out:
    return st;
}

static ps_status program_run(lower_ctx *L, ps_program *p, int k, ps_phase ph, int mb)
{
    ps_status st = PS_OK;
    stage_ctx *s = &L->st[k];
    bool update = ph == PS_PHASE_UPDATE;
    if (update)
        PS_TRY(program_send(L, p, k, ph, mb, AROUND_BEFORE));
    PS_TRY(program_receive(L, p, k, ph, mb, update ? AROUND_BEFORE : AROUND_ANY));
    if (s->kernel[ph] >= 0) {
        const ps_kernel *kern = &L->set->kernels[s->kernel[ph]];
        ps_instr in = ps_instr_init(PS_INSTR_RUN);
        in.kernel = s->kernel[ph];
        in.mb = mb;
        in.seconds = kern->seconds;
        for (int i = 0; i < kern->n_instrs; i++)
            in.flops += kern->instrs[i].flops;
        PS_TRY(append(L, p, &in));
    }
    PS_TRY(program_send(L, p, k, ph, mb, update ? AROUND_AFTER : AROUND_ANY));
    if (update)
        PS_TRY(program_receive(L, p, k, ph, mb, AROUND_AFTER));
out:
    return st;
}

static ps_status device_program(lower_ctx *L, int k, int r)
{
    ps_status st = PS_OK;
    stage_ctx *s = &L->st[k];
    ps_program_stage *ps = &L->set->stages[k];
    int d = ps->devices[r];
    ps_program *p = &L->set->programs[d];
    int d1 = ps->mesh[1], d0 = ps->mesh[0];
    int group[4096];
    p->stage = k;
    p->coord[0] = r / d1;
    p->coord[1] = r % d1;
    for (int i = 0; i < d0; i++)
        group[i] = ps->devices[i * d1 + p->coord[1]];
    if (ps_program_add_group(L->set, group, d0, &p->axis_group[0]) != PS_OK ||
        ps_program_add_group(L->set, ps->devices + p->coord[0] * d1, d1, &p->axis_group[1]) != PS_OK ||
        ps_program_add_group(L->set, ps->devices, ps->n_devices, &p->axis_group[2]) != PS_OK)
        return ps_error_set(L->err, PS_ERR_NOMEM, "out of memory");
    int n_t = s->slice->n_tensors;
    for (int t = 0; t < n_t; t++)
        if (s->cls[t] == CLS_PERSIST || s->cls[t] == CLS_ACCUM)
            PS_TRY(append_simple(L, p, PS_INSTR_ALLOC, s->home[t], -1));
    int m = L->plan->micro_batches, n_st = L->n_stages;
    bool gpipe = strcmp(L->plan->schedule, "gpipe") == 0;
    int warm = gpipe ? m : (n_st - k - 1 < m ? n_st - k - 1 : m);
    for (int i = 0; i < warm; i++)
        PS_TRY(program_run(L, p, k, PS_PHASE_FORWARD, i));
    for (int i = 0; i < m - warm; i++) {
        PS_TRY(program_run(L, p, k, PS_PHASE_FORWARD, warm + i));
        PS_TRY(program_run(L, p, k, PS_PHASE_BACKWARD, i));
    }
    for (int i = m - warm; i < m; i++)
        PS_TRY(program_run(L, p, k, PS_PHASE_BACKWARD, i));
    PS_TRY(program_run(L, p, k, PS_PHASE_UPDATE, -1));
    for (int t = 0; t < n_t; t++)
        if (s->cls[t] == CLS_PERSIST)
            PS_TRY(append_simple(L, p, PS_INSTR_FREE, s->home[t], -1));
out:
    return st;
}

static void lower_ctx_clear(lower_ctx *L)
{
    for (int k = 0; k < L->n_stages && L->st; k++) {
        stage_ctx *s = &L->st[k];
        free(s->ops);
        ps_graph_free(s->slice);
        free(s->slice_of);
        free(s->step_of);
        ps_mesh_free(s->mesh);
        free(s->strat);
        free(s->out_reduced);
        free(s->home);
        free(s->last_use);
        free(s->first_use);
        free(s->cls);
        free(s->program_free);
        free(s->plan_tensor);
    }
    free(L->st);
    for (int i = 0; i < L->n_cross; i++) {
        free(L->cross[i].xfers);
        free(L->cross[i].gathers);
    }
    free(L->cross);
    free(L->stage_of_layer);
    free(L->update_reads);
    free(L->recv);
    free(L->recv_start);
    free(L->send);
    free(L->send_start);
    free(L->gather);
    free(L->gather_start);
}

/* The index lists of lower_ctx, room for every crossing's transfers. */
static ps_status device_index_alloc(lower_ctx *L)
{
    size_t xfers = 0, gathers = 0, n = (size_t)L->n_cross + 1;
    for (int i = 0; i < L->n_cross; i++) {
        xfers += (size_t)L->cross[i].n_xfers;
        gathers += (size_t)L->cross[i].n_gathers;
    }
    L->recv = malloc((xfers + 1) * sizeof *L->recv);
    L->send = malloc((xfers + 1) * sizeof *L->send);
    L->gather = malloc((gathers + 1) * sizeof *L->gather);
    L->recv_start = malloc(n * sizeof *L->recv_start);
    L->send_start = malloc(n * sizeof *L->send_start);
    L->gather_start = malloc(n * sizeof *L->gather_start);
    if (L->recv == NULL || L->send == NULL || L->gather == NULL || L->recv_start == NULL ||
        L->send_start == NULL || L->gather_start == NULL)
        return ps_error_set(L->err, PS_ERR_NOMEM, "out of memory");
    return PS_OK;
}

/* Device d's part of each crossing, in the crossings' own order. */
static void device_index(lower_ctx *L, int d)
{
    int nr = 0, ns = 0, ng = 0;
    for (int i = 0; i < L->n_cross; i++) {
        const crossing *c = &L->cross[i];
        L->recv_start[i] = nr;
        L->send_start[i] = ns;
        L->gather_start[i] = ng;
        for (int j = 0; j < c->n_xfers; j++) {
            if (c->xfers[j].dst == d)
                L->recv[nr++] = j;
            if (c->xfers[j].src == d)
                L->send[ns++] = j;
        }
        for (int j = 0; j < c->n_gathers; j++)
            if (c->gathers[j].member == d)
                L->gather[ng++] = j;
    }
    L->recv_start[L->n_cross] = nr;
    L->send_start[L->n_cross] = ns;
    L->gather_start[L->n_cross] = ng;
}

ps_status ps_plan_lower(const ps_plan *p, const ps_plan_model *m, const ps_lower_options *o,
                        ps_program_set **out, ps_error *err)
{
    ps_status st = PS_OK;
    lower_ctx L = {.plan = p, .model = m, .step = m->step, .err = err, .n_stages = p->n_stages};
    double *kernel_net = NULL, *kernel_rise = NULL; /* memory check: ps_kernel_memory */
    L.opt = o ? *o : ps_lower_options_default();
    *out = NULL;
    const ps_graph *g = m->step;
    PS_TRY(ps_plan_check(p, m, err));
    if (ps_program_set_create(g, ps_cluster_device_count(p->cluster), p->n_stages, &L.set) != PS_OK) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    L.st = calloc((size_t)p->n_stages + 1, sizeof *L.st);
    L.stage_of_layer = malloc(((size_t)g->n_layers + 1) * sizeof *L.stage_of_layer);
    L.update_reads = calloc((size_t)g->n_tensors + 1, sizeof *L.update_reads);
    PS_TRY_ALLOC(L.st, err);
    PS_TRY_ALLOC(L.stage_of_layer, err);
    PS_TRY_ALLOC(L.update_reads, err);
    for (int i = 0; i < g->n_ops; i++)
        if (g->ops[i].pass == PS_PASS_UPDATE)
            for (int q = 0; q < g->ops[i].n_in; q++)
                L.update_reads[g->ops[i].in[q]] = true;
    for (int k = 0; k < p->n_stages; k++)
        for (int l = p->stages[k].first_layer; l <= p->stages[k].last_layer; l++)
            L.stage_of_layer[l] = k;
    L.set->micro_batches = p->micro_batches;
    snprintf(L.set->schedule, sizeof L.set->schedule, "%s", p->schedule);
    L.set->flops_per_step = p->flops_per_step;
    L.set->mfu_peak_flops_per_s = p->mfu > 0 ? p->tflops_per_device * 1e12 / p->mfu : 0;
    if (!(p->flops_per_step > 0) || !(p->mfu > 0)) {
        /* a plan without its predictions (edited by hand): the step's own
         * FLOPs and the devices' peak, as the planner counts them, so that
         * the runs' throughput and MFU are not 0 */
        PS_TRY(ps_plan_step_flops(g, p->micro_batches, &L.set->flops_per_step));
        L.set->mfu_peak_flops_per_s = 1e12 / ps_plan_mfu(1, g, p->cluster);
    }
    ps_plan_digest(p, L.set->plan_digest, sizeof L.set->plan_digest);
    snprintf(L.set->model, sizeof L.set->model, "%s", p->model_name ? p->model_name : "");
    snprintf(L.set->cluster, sizeof L.set->cluster, "%s", p->cluster->name);
    for (int k = 0; k < p->n_stages; k++) {
        const ps_plan_stage *s = &p->stages[k];
        ps_program_stage *ps = &L.set->stages[k];
        ps->n_devices = s->n_devices;
        ps->mesh[0] = s->logical_mesh[0];
        ps->mesh[1] = s->logical_mesh[1];
        ps->devices = malloc((size_t)s->n_devices * sizeof *ps->devices);
        PS_TRY_ALLOC(ps->devices, err);
        memcpy(ps->devices, s->devices, (size_t)s->n_devices * sizeof *ps->devices);
        PS_TRY(stage_setup(&L, k));
        /* the predicted seconds are for the mesh's slowest device at the
         * model's dtype; a backend compares every device with it at that
         * dtype (by the fp16 peak, a device faster in fp32 but slower in
         * fp16 ran an fp32 model slower than the slowest) */
        ps_dtype dt = ps_graph_param_dtype(g, g->n_tensors > 0 ? g->tensors[0].desc.dtype
                                                               : PS_DTYPE_F32);
        ps->compute_dtype = dt < PS_FLOAT_DTYPE_COUNT ? dt : PS_DTYPE_F32;
        ps->reference_flops_per_s = INFINITY;
        for (int i = 0; i < s->n_devices; i++)
            ps->reference_flops_per_s = fmin(
                ps->reference_flops_per_s,
                ps_device_kind_peak_flops_per_s(ps_cluster_device(p->cluster, s->devices[i]),
                                                ps->compute_dtype));
        if (!(ps->reference_flops_per_s > 0) || isinf(ps->reference_flops_per_s))
            ps->reference_flops_per_s = 0;
        /* the cost model multiplied every compute time by it (cost_model.h) */
        ps->compute_share = ps_cluster_compute_share(p->cluster);
        for (int ph = 0; ph < PS_PHASE_COUNT; ph++)
            ps->kernel[ph] = -1;
    }
    PS_TRY(find_crossings(&L));
    L.vote_group = -1;
    if (m->train.dynamic_loss_scale) {
        L.set->loss_scale = m->train.loss_scale;
        L.set->loss_scale_window = m->train.loss_scale_window;
        PS_TRY(vote_setup(&L));
    }
    for (int k = 0; k < p->n_stages; k++)
        PS_TRY(stage_kernels(&L, k));
    for (int i = 0; i < L.n_cross; i++)
        PS_TRY(cross_plan(&L, &L.cross[i]));
    PS_TRY(device_index_alloc(&L));
    if (L.opt.peak_bytes != NULL) {
        kernel_net = malloc(((size_t)L.set->n_kernels + 1) * sizeof *kernel_net);
        kernel_rise = malloc(((size_t)L.set->n_kernels + 1) * sizeof *kernel_rise);
        PS_TRY_ALLOC(kernel_net, err);
        PS_TRY_ALLOC(kernel_rise, err);
        ps_kernel_memory(L.set, kernel_net, kernel_rise);
    }
    for (int k = 0; k < p->n_stages; k++)
        for (int r = 0; r < p->stages[k].n_devices; r++) {
            device_index(&L, L.set->stages[k].devices[r]);
            PS_TRY(device_program(&L, k, r));
            if (L.opt.peak_bytes != NULL) {
                int d = L.set->stages[k].devices[r];
                ps_program *dp = &L.set->programs[d];
                L.opt.peak_bytes[d] = ps_program_peak_bytes_of(L.set, d, kernel_net, kernel_rise);
                free(dp->instrs);
                dp->instrs = NULL;
                dp->n_instrs = dp->cap_instrs = 0;
            }
        }
    *out = L.set;
    L.set = NULL;
out:
    free(kernel_net);
    free(kernel_rise);
    lower_ctx_clear(&L);
    ps_program_set_free(L.set);
    return st;
}
