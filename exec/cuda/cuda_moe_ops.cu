/* The mixture-of-experts kinds on the GPU, with the CPU reference's
 * semantics (exec/cpu/cpu_ops.c):
 * - moe_gate: logits [g, s, e] -> slot [g, s, k] (int32: e * C + position,
 *   -1 when the expert is full) and weight [g, s, k]: a softmax over the
 *   experts in double, the top k (ties to the lower index), capacity C
 *   filled with all first choices in token order, then all second ones;
 * - moe_gate_grad: (logits, slot, dweight) -> dlogits;
 * - moe_dispatch (x, slot) -> the expert tensor [e, g, c, m]; its gradient
 *   (dd, slot) -> dx; moe_combine (y, slot, weight) -> z; its gradient
 *   (dz, y, slot, weight) -> dy, dweight.
 * The gate's routing is one thread per token; its capacity count is
 * sequential within a group (one thread per group), as the reference's
 * order requires. The moves write each expert row from the one token slot
 * that holds it, and gather each token's k rows in order, so nothing needs
 * atomics. They require what the gate gives: each slot of a group held by
 * one token (a slot held twice would race where the reference keeps the
 * last write or sums). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "exec/cuda/cuda_internal.cuh"

#define THREADS 256

/* ---- routing ------------------------------------------------------------------------ */

/* The softmax's maximum and sum of one token's logits (double, in expert
 * order, as the reference). */
static __device__ void softmax_stats(const float *lg, int64_t E, double *mx, double *sum)
{
    double m = -INFINITY, s = 0;
    for (int64_t e = 0; e < E; e++)
        m = fmax(m, (double)lg[e]);
    for (int64_t e = 0; e < E; e++)
        s += exp((double)lg[e] - m);
    *mx = m;
    *sum = s;
}

/* choice[0..k): the top k experts by probability, ties to the lower index. */
static __device__ void top_k(const float *lg, int64_t E, int k, double mx, double sum,
                             int *choice)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        double pb = 0;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++)
                taken = taken || choice[i] == e;
            double p = exp((double)lg[e] - mx) / sum;
            if (!taken && (best < 0 || p > pb)) {
                best = (int)e;
                pb = p;
            }
        }
        choice[j] = best;
    }
}

/* One token's softmax statistics and its top k experts. */
static __device__ void route(const float *lg, int64_t E, int k, int *choice, double *mx,
                             double *sum)
{
    softmax_stats(lg, E, mx, sum);
    top_k(lg, E, k, *mx, *sum, choice);
}

/* One thread per token: its choices (into `choice`, [t, k]) and weights. */
static __global__ void k_gate_route(const float *logits, int *choice, float *weight, int64_t T,
                                    int64_t E, int k)
{
    FOR_EACH(t, T)
    {
        const float *lg = logits + t * E;
        int *ch = choice + t * k;
        double mx, sum;
        route(lg, E, k, ch, &mx, &sum);
        for (int j = 0; j < k; j++)
            weight[t * k + j] = (float)(exp((double)lg[ch[j]] - mx) / sum);
    }
}

/* One thread per group: the capacity slots, first choices in token order,
 * then second ones (fill: [g, e] counters, zeroed). */
static __global__ void k_gate_slots(const int *choice, int32_t *slot, int64_t *fill, int64_t G,
                                    int64_t S, int64_t E, int k, int64_t C)
{
    FOR_EACH(g, G)
    {
        int64_t *f = fill + g * E;
        for (int j = 0; j < k; j++)
            for (int64_t s = 0; s < S; s++) {
                int64_t at = (g * S + s) * k + j;
                int e = choice[at];
                slot[at] = f[e] < C ? (int32_t)(e * C + f[e]++) : -1;
            }
    }
}

/* One thread per token: dlogits = p * (dp - sum(p * dp)), dp the weight
 * gradients on the chosen experts (choice: [t, k] scratch). */
static __global__ void k_gate_grad(const float *logits, const float *dweight, int *choice,
                                   float *dlogits, int64_t T, int64_t E, int k)
{
    FOR_EACH(t, T)
    {
        const float *lg = logits + t * E;
        int *ch = choice + t * k;
        double mx, sum;
        route(lg, E, k, ch, &mx, &sum);
        double dot = 0;
        for (int64_t e = 0; e < E; e++) {
            double dp = 0;
            for (int j = 0; j < k; j++)
                if (ch[j] == e)
                    dp += dweight[t * k + j];
            dot += exp((double)lg[e] - mx) / sum * dp;
        }
        for (int64_t e = 0; e < E; e++) {
            double dp = 0;
            for (int j = 0; j < k; j++)
                if (ch[j] == e)
                    dp += dweight[t * k + j];
            double p = exp((double)lg[e] - mx) / sum;
            dlogits[t * E + e] = (float)(p * (dp - dot));
        }
    }
}

/* ---- moves -------------------------------------------------------------------------- */

/* The expert tile's geometry: [e, g, c, m] local extents, the whole
 * tensor's experts and capacity, the tile's offsets in e and c. */
typedef struct ex_geom {
    int64_t E_all, C_all, e_off, c_off, e_n, g_n, c_n, M;
} ex_geom;

/* The local row of a slot in the expert tile, -1 when dropped or held by
 * another tile (as the reference's moe_row). */
static __device__ int64_t ex_row(const ex_geom x, int64_t slot, int64_t g)
{
    if (slot < 0 || slot >= x.E_all * x.C_all)
        return -1;
    int64_t e = slot / x.C_all - x.e_off, c = slot % x.C_all - x.c_off;
    if (e < 0 || e >= x.e_n || c < 0 || c >= x.c_n)
        return -1;
    return (e * x.g_n + g) * x.c_n + c;
}

/* Flags (bad[0] = 1, bad[1] = the slot) a slot outside [-1, E * C). */
static __global__ void k_check_slots(const int32_t *slot, int64_t n, int64_t limit, int *bad)
{
    FOR_EACH(i, n)
    if (slot[i] < -1 || slot[i] >= limit) {
        bad[0] = 1;
        bad[1] = slot[i];
    }
}

/* dispatch: ex[row] = tok[g, s]; combine_grad: ex[row] = w * dz[g, s].
 * One thread per (token slot, column); ex zeroed before. */
static __global__ void k_to_experts(const float *tok, const int32_t *slot, const float *wt,
                                    float *ex, const ex_geom x, int64_t S, int64_t k, int64_t n)
{
    FOR_EACH(i, n)
    {
        int64_t col = i % x.M, at = i / x.M, tokn = at / k, g = tokn / S;
        int64_t row = ex_row(x, slot[at], g);
        if (row < 0)
            continue;
        float v = tok[tokn * x.M + col];
        ex[row * x.M + col] = wt != NULL ? wt[at] * v : v;
    }
}

/* dispatch_grad: tok[g, s] = sum over its k rows; combine: weighted by w.
 * One thread per (token, column), the k rows added in order. */
static __global__ void k_from_experts(const float *ex, const int32_t *slot, const float *wt,
                                      float *tok, const ex_geom x, int64_t S, int64_t k,
                                      int64_t n)
{
    FOR_EACH(i, n)
    {
        int64_t col = i % x.M, tokn = i / x.M, g = tokn / S;
        float acc = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            int64_t at = tokn * k + j, row = ex_row(x, slot[at], g);
            if (row < 0)
                continue;
            float v = ex[row * x.M + col];
            acc += wt != NULL ? wt[at] * v : v;
        }
        tok[i] = acc;
    }
}

/* combine_grad's dweight: per token slot (a block each), dz[g, s] . y[row]
 * in double; 0 for a dropped slot. */
static __global__ void k_dweight(const float *dz, const float *y, const int32_t *slot,
                                 float *dweight, const ex_geom x, int64_t S, int64_t k,
                                 int64_t n_slots)
{
    __shared__ double sh[32];
    ROWS_LOOP(at, n_slots) {
        int64_t tokn = at / k, row = ex_row(x, slot[at], tokn / S);
        double acc = 0;
        if (row >= 0)
            for (int64_t c = threadIdx.x; c < x.M; c += blockDim.x)
                acc += (double)dz[tokn * x.M + c] * y[row * x.M + c];
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0)
            dweight[at] = (float)acc;
    }
}

/* ---- entry ------------------------------------------------------------------------- */

static ps_status read_bad(ps_cuda_stream *s, const ps_op *op, const int *bad_dev,
                          const ex_geom *x, ps_error *err)
{
    int bad[2] = {0, 0};
    PS_RET(ps_cuda_read_flag(s, bad_dev, bad, err));
    if (bad[0] != 0)
        BAD("slot %d is outside the %lld x %lld expert slots", bad[1], (long long)x->E_all,
            (long long)x->C_all);
    return PS_OK;
}

static ps_status run_gate(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                          ps_error *err)
{
    bool grad = op->kind == PS_OP_MOE_GATE_GRAD;
    const ps_tile *x = &in[0], *gsk = grad ? &in[1] : &out[0];
    if (x->is_int || x->rank != 3)
        BAD("gate logits must be a float tile [g, s, e]");
    int k = op->attrs.top_k;
    if (k < 1 || k > x->shape[2])
        BAD("top_k %d must be between 1 and the number of experts %lld", k,
            (long long)x->shape[2]);
    if (x->shape[2] != x->global[2])
        return ps_cuda_op_error(s, op, PS_ERR_UNSUPPORTED, err,
                                "routing needs all experts (e) in the tile");
    if (!grad && x->shape[1] != x->global[1])
        return ps_cuda_op_error(s, op, PS_ERR_UNSUPPORTED, err,
                                "routing needs whole groups (s) in the tile");
    if (gsk->rank != 3 || gsk->shape[0] != x->shape[0] || gsk->shape[1] != x->shape[1] ||
        gsk->shape[2] != k)
        BAD("slot and weight tiles must be [g, s, top_k] like the logits");
    int64_t G = x->shape[0], S = x->shape[1], E = x->shape[2], T = G * S;
    if (grad && (!ps_cuda_same_shape(&in[1], &in[2]) || !ps_cuda_same_shape(x, &out[0])))
        BAD("dweight must be shaped like the slots and dlogits like the logits");
    if (!grad && !ps_cuda_same_shape(&out[0], &out[1]))
        BAD("the slot and weight tiles differ in shape");
    if (!gsk->is_int || (grad ? in[2].is_int || out[0].is_int : out[1].is_int))
        BAD("the slot tile must be int32, the weights and gradients float");
    int64_t C = op->attrs.capacity;
    if (!grad && op->attrs.experts != E)
        BAD("the logits have %lld experts, the op says %lld", (long long)E,
            (long long)op->attrs.experts);
    if (!grad && (C < 1 || E * C > INT32_MAX))
        BAD("capacity %lld out of range", (long long)C);
    /* workspace: the choices [t, k] and the gate's [g, e] fill counters */
    size_t choice_bytes = ((size_t)(T * k) * sizeof(int) + 7) & ~(size_t)7;
    size_t bytes = choice_bytes + (grad ? 0 : (size_t)(G * E) * sizeof(int64_t)) + 8;
    char *ws;
    PS_RET(ps_cuda_ws_reserve(s, bytes, (void **)&ws, err));
    int *choice = (int *)ws;
    unsigned tb = ps_cuda_blocks(T, THREADS);
    if (grad) {
        k_gate_grad<<<tb, THREADS, 0, s->stream>>>((const float *)x->data,
                                                   (const float *)in[2].data, choice,
                                                   (float *)out[0].data, T, E, k);
        PS_CUDA_LAUNCHED(s->loc, "k_gate_grad");
        return PS_OK;
    }
    int64_t *fill = (int64_t *)(ws + choice_bytes);
    PS_CUDA_RET(s->loc, cudaMemsetAsync(fill, 0, (size_t)(G * E) * sizeof(int64_t), s->stream));
    k_gate_route<<<tb, THREADS, 0, s->stream>>>((const float *)x->data, choice,
                                                (float *)out[1].data, T, E, k);
    PS_CUDA_LAUNCHED(s->loc, "k_gate_route");
    k_gate_slots<<<ps_cuda_blocks(G, 64), 64, 0, s->stream>>>(choice, (int32_t *)out[0].data,
                                                              fill, G, S, E, k, C);
    PS_CUDA_LAUNCHED(s->loc, "k_gate_slots");
    return PS_OK;
}

static ps_status run_move(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                          ps_error *err)
{
    ps_op_kind kind = op->kind;
    const ps_tile *ex, *tok, *slot, *wt = NULL;
    switch (kind) {
    case PS_OP_MOE_DISPATCH: ex = &out[0], tok = &in[0], slot = &in[1]; break;
    case PS_OP_MOE_DISPATCH_GRAD: ex = &in[0], tok = &out[0], slot = &in[1]; break;
    case PS_OP_MOE_COMBINE: ex = &in[0], tok = &out[0], slot = &in[1], wt = &in[2]; break;
    default: /* COMBINE_GRAD */
        ex = &out[0], tok = &in[0], slot = &in[2], wt = &in[3];
        if (!ps_cuda_same_shape(ex, &in[1]) || !ps_cuda_same_shape(wt, &out[1]))
            BAD("dy must be shaped like y and dweight like the weights");
        break;
    }
    if (ex->rank != 4 || tok->rank != 3 || slot->rank != 3)
        BAD("moe tiles must be [e, g, c, m], [g, s, m] and slots [g, s, k]");
    if (!slot->is_int || ex->is_int || tok->is_int || (wt != NULL && wt->is_int) ||
        (kind == PS_OP_MOE_COMBINE_GRAD && (in[1].is_int || out[1].is_int)))
        BAD("the slot tile must be int32, the others float");
    if (kind == PS_OP_MOE_DISPATCH &&
        (op->attrs.experts != ex->global[0] || op->attrs.capacity != ex->global[2]))
        BAD("the expert tensor is [%lld, _, %lld, _], the op says %lld experts of capacity "
            "%lld",
            (long long)ex->global[0], (long long)ex->global[2], (long long)op->attrs.experts,
            (long long)op->attrs.capacity);
    if (ex->shape[1] != tok->shape[0] || ex->offset[1] != tok->offset[0])
        BAD("the expert tile and the token tile hold different groups");
    if (ex->shape[3] != tok->shape[2] || ex->offset[3] != tok->offset[2])
        BAD("the expert tile and the token tile hold different columns");
    if (slot->shape[0] != tok->shape[0] || slot->shape[1] != tok->shape[1])
        BAD("the slot tile must be [g, s, k] like the tokens");
    if (wt != NULL && !ps_cuda_same_shape(slot, wt))
        BAD("the slot and weight tiles differ in shape");
    ex_geom x = {ex->global[0], ex->global[2], ex->offset[0], ex->offset[2],
                 ex->shape[0], ex->shape[1], ex->shape[2], ex->shape[3]};
    int64_t S = tok->shape[1], k = slot->shape[2], n_slots = ps_tile_numel(slot);
    int *bad;
    PS_RET(ps_cuda_ws_reserve(s, 2 * sizeof(int), (void **)&bad, err));
    PS_CUDA_RET(s->loc, cudaMemsetAsync(bad, 0, 2 * sizeof(int), s->stream));
    k_check_slots<<<ps_cuda_blocks(n_slots, THREADS), THREADS, 0, s->stream>>>(
        (const int32_t *)slot->data, n_slots, x.E_all * x.C_all, bad);
    PS_CUDA_LAUNCHED(s->loc, "k_check_slots");
    /* a bad slot is reported before anything is written from it */
    PS_RET(read_bad(s, op, bad, &x, err));
    const int32_t *sl = (const int32_t *)slot->data;
    const float *w = wt != NULL ? (const float *)wt->data : NULL;
    if (kind == PS_OP_MOE_DISPATCH || kind == PS_OP_MOE_COMBINE_GRAD) {
        PS_CUDA_RET(s->loc, cudaMemsetAsync(ex->data, 0,
                                            (size_t)ps_tile_numel(ex) * sizeof(float),
                                            s->stream));
        int64_t n = n_slots * x.M;
        k_to_experts<<<ps_cuda_blocks(n, THREADS), THREADS, 0, s->stream>>>(
            (const float *)tok->data, sl, w, (float *)ex->data, x, S, k, n);
        PS_CUDA_LAUNCHED(s->loc, "k_to_experts");
        if (kind == PS_OP_MOE_COMBINE_GRAD) {
            k_dweight<<<ps_cuda_row_blocks(n_slots), THREADS, 0, s->stream>>>((const float *)tok->data,
                                                         (const float *)in[1].data, sl,
                                                         (float *)out[1].data, x, S, k,
                                                         n_slots);
            PS_CUDA_LAUNCHED(s->loc, "k_dweight");
        }
        return PS_OK;
    }
    int64_t n = ps_tile_numel(tok);
    k_from_experts<<<ps_cuda_blocks(n, THREADS), THREADS, 0, s->stream>>>(
        (const float *)ex->data, sl, w, (float *)tok->data, x, S, k, n);
    PS_CUDA_LAUNCHED(s->loc, "k_from_experts");
    return PS_OK;
}

ps_status ps_cuda_moe_run(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                          ps_error *err)
{
    if (op->kind == PS_OP_MOE_GATE || op->kind == PS_OP_MOE_GATE_GRAD)
        return run_gate(s, op, in, out, err);
    return run_move(s, op, in, out, err);
}
