#include "exec/data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Uniform in [0, 1) for one element of one stream. */
static double uniform(uint64_t stream, uint64_t index)
{
    return (double)(mix64(stream ^ mix64(index)) >> 11) * (1.0 / 9007199254740992.0);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The class count an integer input ranges over: rows of the table it
 * indexes, or the last dim of the logits it labels. */
static int64_t id_range(const ps_graph *g, int tensor)
{
    for (int i = 0; i < g->n_ops; i++) {
        const ps_op *op = &g->ops[i];
        if (op->n_in < 2 || op->in[1] != tensor)
            continue;
        const ps_tensor_desc *d0 = &g->tensors[op->in[0]].desc;
        if (op->kind == PS_OP_EMBEDDING)
            return d0->shape[0];
        if (op->kind == PS_OP_SOFTMAX_XENT)
            return d0->shape[d0->rank - 1];
    }
    return 2;
}

/* The regression input x whose teacher output a target tensor is, or -1. */
static int teacher_input(const ps_graph *g, int tensor)
{
    bool target = false;
    for (int i = 0; i < g->n_ops && !target; i++)
        target = g->ops[i].kind == PS_OP_MSE_LOSS && g->ops[i].in[1] == tensor;
    if (!target)
        return -1;
    const ps_tensor *y = &g->tensors[tensor];
    for (int t = 0; t < g->n_tensors; t++) {
        const ps_tensor *x = &g->tensors[t];
        if (t != tensor && x->kind == PS_TENSOR_INPUT && x->desc.dtype != PS_DTYPE_I32 &&
            ps_tensor_desc_equal(&x->desc, &y->desc) && x->desc.rank >= 1)
            return t;
    }
    return -1;
}

/* Walks the elements of a tile in its local row-major order, keeping each
 * one's global coordinates and global linear index: an odometer, since a
 * division per dimension and element made the data loader cost 5% of a
 * Wide-ResNet stage (411 us per micro-batch for its images). */
typedef struct tile_walk {
    const ps_tile *t;
    int64_t coord[PS_MAX_RANK];   /* global coordinates of the current element */
    int64_t gstride[PS_MAX_RANK]; /* global linear stride of each dimension */
    int64_t g;                    /* global linear index of the current element */
} tile_walk;

static void walk_start(tile_walk *w, const ps_tile *t)
{
    int64_t stride = 1;
    w->t = t;
    w->g = 0;
    for (int k = t->rank - 1; k >= 0; k--) {
        w->coord[k] = t->offset[k];
        w->gstride[k] = stride;
        w->g += t->offset[k] * stride;
        stride *= t->global[k];
    }
}

static void walk_next(tile_walk *w)
{
    const ps_tile *t = w->t;
    for (int k = t->rank - 1; k >= 0; k--) {
        w->coord[k]++;
        w->g += w->gstride[k];
        if (w->coord[k] < t->offset[k] + t->shape[k])
            return;
        w->coord[k] = t->offset[k];
        w->g -= t->shape[k] * w->gstride[k];
    }
}

bool ps_exec_holds_param(const ps_tensor *x)
{
    return x->kind == PS_TENSOR_PARAM || (x->kind == PS_TENSOR_OPT_STATE && x->state_of >= 0 &&
                                          ends_with(x->name, ".master"));
}

ps_status ps_exec_fill(const ps_graph *g, int tensor, int mb, uint64_t seed, const ps_tile *t,
                       void *host, ps_error *err)
{
    if (tensor < 0 || tensor >= g->n_tensors)
        return ps_error_set(err, PS_ERR_INVALID, "no tensor %d to fill", tensor);
    const ps_tensor *x = &g->tensors[tensor];
    int64_t n = ps_tile_numel(t);
    tile_walk w;
    if (x->kind == PS_TENSOR_OPT_STATE) {
        if (!ps_exec_holds_param(x)) {
            memset(host, 0, (size_t)n * sizeof(float));
            return PS_OK;
        }
        return ps_exec_fill(g, x->state_of, mb, seed, t, host, err);
    }
    uint64_t stream = seed * 0x2545f4914f6cdd1dull ^ name_hash(x->name);
    if (x->kind == PS_TENSOR_PARAM) {
        float *f = host;
        if (x->desc.rank == 1) {
            bool gamma = ends_with(x->name, ".gamma");
            walk_start(&w, t);
            for (int64_t i = 0; i < n; i++, walk_next(&w))
                f[i] = gamma ? 1.0f : (float)(0.2 * uniform(stream, (uint64_t)w.g) - 0.1);
            return PS_OK;
        }
        int64_t fan = 1;
        if (x->desc.rank == 2)
            fan = x->desc.shape[0];
        else
            for (int k = 0; k + 1 < x->desc.rank; k++)
                fan *= x->desc.shape[k];
        double a = 1.0 / sqrt((double)(fan > 0 ? fan : 1));
        walk_start(&w, t);
        for (int64_t i = 0; i < n; i++, walk_next(&w))
            f[i] = (float)(a * (2 * uniform(stream, (uint64_t)w.g) - 1));
        return PS_OK;
    }
    if (x->kind != PS_TENSOR_INPUT)
        return ps_error_set(err, PS_ERR_INVALID,
                            "tensor %s is computed, not loaded or initialized", x->name);
    uint64_t mstream = mix64(stream ^ (uint64_t)(mb + 1) * 0x9e3779b97f4a7c15ull);
    if (x->desc.dtype == PS_DTYPE_I32) {
        int32_t *v = host;
        int64_t range = id_range(g, tensor);
        bool positions = ends_with(x->name, "positions");
        walk_start(&w, t);
        for (int64_t i = 0; i < n; i++, walk_next(&w))
            v[i] = positions ? (int32_t)(w.coord[t->rank - 1] % range)
                             : (int32_t)(mix64(mstream ^ mix64((uint64_t)w.g)) % (uint64_t)range);
        return PS_OK;
    }
    float *f = host;
    int src = teacher_input(g, tensor);
    if (src < 0) {
        walk_start(&w, t);
        for (int64_t i = 0; i < n; i++, walk_next(&w))
            f[i] = (float)(2 * uniform(mstream, (uint64_t)w.g) - 1);
        return PS_OK;
    }
    /* y[..., j] = sum_k T[j, k] x[..., k] / sqrt(h) + c[j], x as its own fill */
    const ps_tensor *xs = &g->tensors[src];
    uint64_t xstream =
        mix64((seed * 0x2545f4914f6cdd1dull ^ name_hash(xs->name)) ^
              (uint64_t)(mb + 1) * 0x9e3779b97f4a7c15ull);
    uint64_t tstream = mix64(seed ^ 0x7465616368657221ull); /* the teacher's weights */
    int64_t h = x->desc.shape[x->desc.rank - 1];
    double scale = 1.0 / sqrt((double)h);
    walk_start(&w, t);
    for (int64_t i = 0; i < n; i++, walk_next(&w)) {
        int64_t j = w.coord[t->rank - 1], row = w.g - j;
        double acc = 2 * uniform(tstream, (uint64_t)(h * h + j)) - 1;
        for (int64_t k = 0; k < h; k++) {
            double xv = (float)(2 * uniform(xstream, (uint64_t)(row + k)) - 1);
            acc += scale * (2 * uniform(tstream, (uint64_t)(j * h + k)) - 1) * xv;
        }
        f[i] = (float)acc;
    }
    return PS_OK;
}
