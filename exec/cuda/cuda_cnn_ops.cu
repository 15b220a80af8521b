/* The convolutional network kinds on the GPU, with the CPU reference's
 * semantics (exec/cpu/cpu_ops.c): NCHW tiles, filters OCHW, zero padding,
 * cross-correlation. conv2d and its two gradients run through cuDNN (the
 * legacy convolution calls, deterministic algorithms only, full fp32 unless
 * the stream allows TF32); a build without cuDNN refuses them by name.
 * Pooling has kernels of its own: cuDNN's would differ from the reference
 * where a window lies in the padding and where a max window ties, and the
 * gradient is written as a gather (one thread per input element) so that
 * it needs no atomics and adds in the reference's order. Batchnorm too:
 * its statistics span the devices splitting the batch (the op's reduce
 * group), which cuDNN's batchnorm cannot see; per-channel sums are taken in
 * double in a fixed order. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "core/log.h"
}
#include "exec/cuda/cuda_internal.cuh"

#define THREADS 256

/* Local extents of one convolution or pooling window pass (NCHW). */
typedef struct conv_geom {
    int64_t N, C, H, W, O, KH, KW, OH, OW;
    int sh, sw, ph, pw;
} conv_geom;

/* The output extents of a window pass; false when the window does not fit. */
static bool window_out(conv_geom *g)
{
    if (g->H + 2 * g->ph < g->KH || g->W + 2 * g->pw < g->KW)
        return false;
    g->OH = (g->H + 2 * g->ph - g->KH) / g->sh + 1;
    g->OW = (g->W + 2 * g->pw - g->KW) / g->sw + 1;
    return true;
}

/* Whether a *_GRAD op's output tile belongs to a tensor of the op's shape
 * attribute, as the reference requires. */
static bool output_is_global(const ps_op *op, const ps_tile *t)
{
    bool same = op->attrs.shape_rank == t->rank;
    for (int d = 0; same && d < t->rank; d++)
        same = op->attrs.shape[d] == t->global[d];
    return same;
}

/* ---- conv2d (cuDNN) ------------------------------------------------------------ */

/* x [N, C, H, W], w [O, C, KH, KW], y [N, O, OH, OW] (local extents) */
static ps_status conv_geometry(ps_cuda_stream *s, const ps_op *op, const ps_tile *x,
                               const ps_tile *w, const ps_tile *y, conv_geom *g, ps_error *err)
{
    if (x->rank != 4 || w->rank != 4 || y->rank != 4)
        BAD("conv2d tiles must have rank 4 (NCHW, OCHW)");
    *g = (conv_geom){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                     .O = w->shape[0], .KH = w->shape[2], .KW = w->shape[3],
                     .OH = 0, .OW = 0, .sh = op->attrs.stride[0],
                     .sw = op->attrs.stride[1], .ph = op->attrs.pad[0], .pw = op->attrs.pad[1]};
    if (g->sh < 1 || g->sw < 1 || g->ph < 0 || g->pw < 0)
        BAD("stride must be >= 1 and padding >= 0");
    if (w->shape[1] != g->C)
        BAD("the input tile has %lld channels, the filter tile %lld", (long long)g->C,
            (long long)w->shape[1]);
    if (!window_out(g))
        BAD("the filter does not fit the input tile");
    if (y->shape[0] != g->N || y->shape[1] != g->O || y->shape[2] != g->OH ||
        y->shape[3] != g->OW)
        BAD("the output tile must be [%lld, %lld, %lld, %lld]", (long long)g->N,
            (long long)g->O, (long long)g->OH, (long long)g->OW);
    /* the descriptors' dimensions and strides are ints: a tile's elements
     * too (each dimension is below them) */
    const int64_t dims[] = {g->N, g->C, g->H, g->W, g->O, g->KH, g->KW, g->OH, g->OW};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] > INT_MAX)
            return ps_cuda_op_error(s, op, PS_ERR_UNSUPPORTED, err,
                                    "a dimension exceeds cuDNN's int range");
    const double elems[] = {(double)g->N * g->C * g->H * g->W,
                            (double)g->O * g->C * g->KH * g->KW,
                            (double)g->N * g->O * g->OH * g->OW};
    for (size_t i = 0; i < sizeof elems / sizeof elems[0]; i++)
        if (elems[i] > INT_MAX)
            return ps_cuda_op_error(s, op, PS_ERR_UNSUPPORTED, err,
                                    "a tile of %.0f elements exceeds cuDNN's int strides",
                                    elems[i]);
    return PS_OK;
}

#if PS_HAVE_CUDNN

static ps_status dnn_fail(const ps_cuda_stream *s, cudnnStatus_t e, const char *call,
                          ps_error *err)
{
    int n = 0;
    while (call[n] != '\0' && call[n] != '(')
        n++;
    return ps_error_set(err, PS_ERR_DEVICE, "device %d (GPU %d): %.*s failed: %s",
                        s->loc.device, s->loc.gpu, n, call, cudnnGetErrorString(e));
}

#define DNN_TRY(call)                                                                         \
    do {                                                                                      \
        cudnnStatus_t ps_dnn_e_ = (call);                                                     \
        if (ps_dnn_e_ != CUDNN_STATUS_SUCCESS) {                                              \
            st = dnn_fail(s, ps_dnn_e_, #call, err);                                          \
            goto out;                                                                         \
        }                                                                                     \
    } while (0)

/* The descriptors of one convolution. */
typedef struct conv_desc {
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
} conv_desc;

static void conv_desc_free(conv_desc *d)
{
    if (d->x != NULL)
        (void)cudnnDestroyTensorDescriptor(d->x);
    if (d->y != NULL)
        (void)cudnnDestroyTensorDescriptor(d->y);
    if (d->w != NULL)
        (void)cudnnDestroyFilterDescriptor(d->w);
    if (d->conv != NULL)
        (void)cudnnDestroyConvolutionDescriptor(d->conv);
}

static ps_status conv_desc_make(ps_cuda_stream *s, const conv_geom *g, conv_desc *d,
                                ps_error *err)
{
    ps_status st = PS_OK;
    if (s->dnn == NULL) {
        cudnnHandle_t h = NULL;
        /* it allocates on the GPU: a memory operation (launch_gate.h) */
        ps_launch_gate_mem_enter(s->gate);
        cudnnStatus_t made = cudnnCreate(&h);
        ps_launch_gate_mem_exit(s->gate);
        if (made != CUDNN_STATUS_SUCCESS) {
            st = dnn_fail(s, made, "cudnnCreate", err);
            goto out;
        }
        cudnnStatus_t e = cudnnSetStream(h, s->stream);
        if (e != CUDNN_STATUS_SUCCESS) {
            (void)cudnnDestroy(h); /* a handle on the default stream would race */
            st = dnn_fail(s, e, "cudnnSetStream", err);
            goto out;
        }
        s->dnn = h;
    }
    DNN_TRY(cudnnCreateTensorDescriptor(&d->x));
    DNN_TRY(cudnnCreateTensorDescriptor(&d->y));
    DNN_TRY(cudnnCreateFilterDescriptor(&d->w));
    DNN_TRY(cudnnCreateConvolutionDescriptor(&d->conv));
    DNN_TRY(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)g->N,
                                       (int)g->C, (int)g->H, (int)g->W));
    DNN_TRY(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)g->N,
                                       (int)g->O, (int)g->OH, (int)g->OW));
    DNN_TRY(cudnnSetFilter4dDescriptor(d->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, (int)g->O,
                                       (int)g->C, (int)g->KH, (int)g->KW));
    DNN_TRY(cudnnSetConvolution2dDescriptor(d->conv, g->ph, g->pw, g->sh, g->sw, 1, 1,
                                            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    /* full fp32 unless TF32 is allowed: the heuristics then offer FMA kernels */
    DNN_TRY(cudnnSetConvolutionMathType(d->conv, s->allow_tf32 ? CUDNN_DEFAULT_MATH
                                                              : CUDNN_FMA_MATH));
out:
    return st;
}

/* The first of cuDNN's ranked candidates from `from` on that works, is
 * deterministic and keeps full fp32 when TF32 is not allowed; -1 when there
 * is none. The three perf structs share these fields. */
template <typename Perf>
static int pick_algo(const ps_cuda_stream *s, const Perf *perf, int from, int n,
                     cudnnMathType_t *math)
{
    for (int i = from; i < n; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].determinism != CUDNN_DETERMINISTIC)
            continue;
        /* without TF32: an algorithm offered for FMA or default math, run
         * with FMA math (default math lets cuDNN take TF32 on Ampere and
         * later); never one that needs tensor-op math */
        cudnnMathType_t m = perf[i].mathType;
        bool fma_ok = m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
        if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION || (!s->allow_tf32 && !fma_ok))
            continue; /* conversion may go below TF32 (fp16) */
        *math = s->allow_tf32 ? perf[i].mathType : CUDNN_FMA_MATH;
        return i;
    }
    return -1;
}

/* The workspace an algorithm needs with the descriptor's math type (the
 * heuristics' figure is for the math type they listed). */
static cudnnStatus_t ws_size(cudnnHandle_t h, const conv_desc *d, cudnnConvolutionFwdAlgo_t a,
                             size_t *bytes)
{
    return cudnnGetConvolutionForwardWorkspaceSize(h, d->x, d->w, d->conv, d->y, a, bytes);
}

static cudnnStatus_t ws_size(cudnnHandle_t h, const conv_desc *d,
                             cudnnConvolutionBwdDataAlgo_t a, size_t *bytes)
{
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d->w, d->y, d->conv, d->x, a, bytes);
}

static cudnnStatus_t ws_size(cudnnHandle_t h, const conv_desc *d,
                             cudnnConvolutionBwdFilterAlgo_t a, size_t *bytes)
{
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d->x, d->y, d->conv, d->w, a,
                                                          bytes);
}

/* Runs the first qualifying candidate of cuDNN's ranking that works: sets
 * its math type on the descriptor, reserves its workspace and calls
 * run(algo, workspace, bytes), which returns cuDNN's status (`call` names
 * it). *at: the candidate run, -1 when none qualifies. The heuristics rank
 * by speed, not memory: a candidate whose workspace the GPU cannot give (an
 * FFT one can ask for gigabytes) gives way to the next; so does one that
 * cuDNN then says it does not support for this shape (the heuristics list
 * some as working that are not); only the last qualifying one's failure is
 * an error. */
template <typename Perf, typename Run>
static ps_status run_algo(ps_cuda_stream *s, const Perf *perf, int found, const conv_desc *d,
                          const char *call, Run run, bool fallback, int *at,
                          cudnnMathType_t *ran_math, ps_error *err)
{
    *at = -1;
    cudnnMathType_t math = CUDNN_FMA_MATH;
    for (int i = pick_algo(s, perf, 0, found, &math); i >= 0;) {
        cudnnMathType_t next_math = CUDNN_FMA_MATH;
        int next = pick_algo(s, perf, i + 1, found, &next_math);
        /* a candidate with another after it, or a way back (fallback), is a
         * preference: its workspace may be refused and it may not run */
        bool more = next >= 0 || fallback;
        const char *why = NULL;
        cudnnStatus_t e = cudnnSetConvolutionMathType(d->conv, math);
        if (e != CUDNN_STATUS_SUCCESS)
            return dnn_fail(s, e, "cudnnSetConvolutionMathType", err);
        size_t bytes = 0;
        void *ws = NULL;
        e = ws_size(s->dnn, d, perf[i].algo, &bytes);
        if (e == CUDNN_STATUS_NOT_SUPPORTED) {
            why = "has no workspace size for this shape";
        } else if (e != CUDNN_STATUS_SUCCESS) {
            return dnn_fail(s, e, "cudnnGetConvolutionWorkspaceSize", err);
        } else {
            /* a faster algorithm's workspace is a preference: the pool's
             * cached blocks are given back (a stream sync and their
             * cudaFree, at every convolution of every step) only for the
             * last candidate */
            s->reclaim_off = more;
            ps_status st = bytes > 0 ? ps_cuda_ws_reserve(s, bytes, &ws, err) : PS_OK;
            s->reclaim_off = false;
            if (st == PS_ERR_NOMEM && more) {
                why = "needs a workspace the GPU has not";
                ps_error_clear(err);
            } else if (st != PS_OK) {
                return st;
            } else {
                e = run(perf[i].algo, ws, bytes);
                if (e == CUDNN_STATUS_SUCCESS) {
                    *at = i;
                    *ran_math = math;
                    return PS_OK;
                }
                if (e != CUDNN_STATUS_NOT_SUPPORTED)
                    return dnn_fail(s, e, call, err);
                why = "is not supported for this shape after all";
            }
        }
        /* none left: *at stays -1, the op's "no algorithm" refusal */
        PS_LOG_DEBUG("pipeshard: device %d: cuDNN algorithm %d (%zu-byte workspace) %s%s",
                     s->loc.device, (int)perf[i].algo, bytes, why,
                     next >= 0  ? "; trying the next"
                     : fallback ? "; asking the heuristics"
                                : "");
        i = next;
        math = next_math;
    }
    return PS_OK;
}

/* The algorithm and math type a convolution of one kind and shape ran with
 * on a stream (ps_cuda_stream.conv_algos): cuDNN's heuristic queries cost
 * host time at every call and rank the same descriptors the same way, so a
 * shape asks them once and later calls run what worked. */
struct ps_cuda_conv_algo {
    ps_op_kind kind;
    conv_geom g;
    bool tf32;
    int algo;
    cudnnMathType_t math;
};

static bool geom_equal(const conv_geom *a, const conv_geom *b)
{
    return a->N == b->N && a->C == b->C && a->H == b->H && a->W == b->W && a->O == b->O &&
           a->KH == b->KH && a->KW == b->KW && a->OH == b->OH && a->OW == b->OW && a->sh == b->sh &&
           a->sw == b->sw && a->ph == b->ph && a->pw == b->pw;
}

static const ps_cuda_conv_algo *conv_algo_find(const ps_cuda_stream *s, ps_op_kind kind,
                                               const conv_geom *g)
{
    for (int i = 0; i < s->n_conv_algos; i++) {
        const ps_cuda_conv_algo *a = &s->conv_algos[i];
        if (a->kind == kind && a->tf32 == s->allow_tf32 && geom_equal(&a->g, g))
            return a;
    }
    return NULL;
}

/* Remembers what ran, in place of what the shape ran with before where
 * that no longer ran (`known`); out of host memory it is only not
 * remembered (the next call asks the heuristics again). */
static void conv_algo_keep(ps_cuda_stream *s, const ps_cuda_conv_algo *known, ps_op_kind kind,
                           const conv_geom *g, int algo, cudnnMathType_t math)
{
    if (known != NULL) {
        ps_cuda_conv_algo *k = &s->conv_algos[known - s->conv_algos];
        k->algo = algo;
        k->math = math;
        return;
    }
    if (s->n_conv_algos == s->cap_conv_algos) {
        int cap = s->cap_conv_algos > 0 ? 2 * s->cap_conv_algos : 32;
        void *grown = realloc(s->conv_algos, (size_t)cap * sizeof *s->conv_algos);
        if (grown == NULL)
            return;
        s->conv_algos = (ps_cuda_conv_algo *)grown;
        s->cap_conv_algos = cap;
    }
    s->conv_algos[s->n_conv_algos++] = (ps_cuda_conv_algo){kind, *g, s->allow_tf32, algo, math};
}

/* One convolution pass: the algorithm this shape ran with before, if any and
 * if it runs again (its workspace may not be there now), else cuDNN's ranked
 * candidates (query(perf, COUNT, &found), `query_call` naming it), the one
 * that ran then remembered. *at: -1 when none ran; *found: the candidates. */
template <typename Perf, int COUNT, typename Query, typename Run>
static ps_status conv_pass(ps_cuda_stream *s, const ps_op *op, const conv_geom *g,
                           const conv_desc *d, const char *query_call, Query query,
                           const char *call, Run run, int *found, int *at, ps_error *err)
{
    cudnnMathType_t math = CUDNN_FMA_MATH;
    *found = 0;
    *at = -1;
    const ps_cuda_conv_algo *known = conv_algo_find(s, op->kind, g);
    if (known != NULL) {
        Perf one;
        memset(&one, 0, sizeof one);
        one.algo = (decltype(one.algo))known->algo;
        one.status = CUDNN_STATUS_SUCCESS;
        one.determinism = CUDNN_DETERMINISTIC;
        one.mathType = known->math;
        PS_RET(run_algo(s, &one, 1, d, call, run, true, at, &math, err));
        if (*at >= 0) {
            *found = 1;
            return PS_OK;
        }
    }
    Perf perf[COUNT];
    cudnnStatus_t e = query(perf, COUNT, found);
    if (e != CUDNN_STATUS_SUCCESS)
        return dnn_fail(s, e, query_call, err);
    PS_RET(run_algo(s, perf, *found, d, call, run, false, at, &math, err));
    if (*at >= 0)
        conv_algo_keep(s, known, op->kind, g, (int)perf[*at].algo, math);
    return PS_OK;
}

static ps_status conv_dnn(ps_cuda_stream *s, const ps_op *op, const conv_geom *g,
                          const ps_tile *x, const ps_tile *w, const ps_tile *y, ps_error *err)
{
    ps_status st = PS_OK;
    conv_desc d = {};
    const float one = 1.0f, zero = 0.0f;
    int found = 0, at = -1;
    PS_TRY(conv_desc_make(s, g, &d, err));
    switch (op->kind) {
    case PS_OP_CONV2D: {
        auto query = [&](cudnnConvolutionFwdAlgoPerf_t *perf, int n, int *got) {
            return cudnnGetConvolutionForwardAlgorithm_v7(s->dnn, d.x, d.w, d.conv, d.y, n, got,
                                                          perf);
        };
        auto fwd = [&](cudnnConvolutionFwdAlgo_t a, void *ws, size_t bytes) {
            return cudnnConvolutionForward(s->dnn, &one, d.x, x->data, d.w, w->data, d.conv, a,
                                           ws, bytes, &zero, d.y, y->data);
        };
        st = conv_pass<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
            s, op, g, &d, "cudnnGetConvolutionForwardAlgorithm_v7", query,
            "cudnnConvolutionForward", fwd, &found, &at, err);
        break;
    }
    case PS_OP_CONV2D_GRAD_INPUT: {
        auto query = [&](cudnnConvolutionBwdDataAlgoPerf_t *perf, int n, int *got) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(s->dnn, d.w, d.y, d.conv, d.x, n,
                                                               got, perf);
        };
        auto bwd_data = [&](cudnnConvolutionBwdDataAlgo_t a, void *ws, size_t bytes) {
            return cudnnConvolutionBackwardData(s->dnn, &one, d.w, w->data, d.y, y->data,
                                                d.conv, a, ws, bytes, &zero, d.x, x->data);
        };
        st = conv_pass<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
            s, op, g, &d, "cudnnGetConvolutionBackwardDataAlgorithm_v7", query,
            "cudnnConvolutionBackwardData", bwd_data, &found, &at, err);
        break;
    }
    default: {
        auto query = [&](cudnnConvolutionBwdFilterAlgoPerf_t *perf, int n, int *got) {
            return cudnnGetConvolutionBackwardFilterAlgorithm_v7(s->dnn, d.x, d.y, d.conv, d.w, n,
                                                                 got, perf);
        };
        auto bwd_filter = [&](cudnnConvolutionBwdFilterAlgo_t a, void *ws, size_t bytes) {
            return cudnnConvolutionBackwardFilter(s->dnn, &one, d.x, x->data, d.y, y->data,
                                                  d.conv, a, ws, bytes, &zero, d.w, w->data);
        };
        st =
            conv_pass<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
                s, op, g, &d, "cudnnGetConvolutionBackwardFilterAlgorithm_v7", query,
                "cudnnConvolutionBackwardFilter", bwd_filter, &found, &at, err);
        break;
    }
    }
    if (st == PS_OK && at < 0)
        st = ps_cuda_op_error(s, op, PS_ERR_UNSUPPORTED, err,
                              "cuDNN offers no deterministic %s algorithm that runs this "
                              "shape (%d candidates)",
                              s->allow_tf32 ? "" : "full-fp32 ", found);
out:
    conv_desc_free(&d);
    return st;
}

#endif /* PS_HAVE_CUDNN */

ps_status ps_cuda_conv_run(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                           ps_error *err)
{
    /* name the x, w and y tiles of the forward conv in each of the three ops */
    ps_op_kind kind = op->kind;
    const ps_tile *x = kind == PS_OP_CONV2D_GRAD_INPUT ? &out[0] : &in[0];
    const ps_tile *w = kind == PS_OP_CONV2D_GRAD_FILTER ? &out[0] : &in[1];
    const ps_tile *y = kind == PS_OP_CONV2D ? &out[0]
                       : kind == PS_OP_CONV2D_GRAD_INPUT ? &in[0]
                                                          : &in[1];
    if (x->is_int || w->is_int || y->is_int)
        BAD("conv2d tiles must be float");
    conv_geom g;
    PS_RET(conv_geometry(s, op, x, w, y, &g, err));
    if (kind != PS_OP_CONV2D && !output_is_global(op, &out[0]))
        BAD("the output tile belongs to a tensor of another shape than the shape attribute");
#if PS_HAVE_CUDNN
    if (g.N == 0 || g.C == 0 || g.O == 0 || g.H == 0 || g.W == 0 || g.KH == 0 || g.KW == 0) {
        /* nothing to convolve (cuDNN refuses such descriptors): the outputs
         * are zero or empty, as the reference's */
        PS_CUDA_RET(s->loc, cudaMemsetAsync(out[0].data, 0,
                                            (size_t)ps_tile_numel(&out[0]) * sizeof(float),
                                            s->stream));
        return PS_OK;
    }
    return conv_dnn(s, op, &g, x, w, y, err);
#else
    return ps_cuda_op_error(s, op, PS_ERR_UNSUPPORTED, err,
                            "this build has no cuDNN (the CUDA backend convolves through it)");
#endif
}

/* ---- pooling --------------------------------------------------------------------- */

/* The first maximum of the window at (oh, ow) of one plane, as h * W + w;
 * -1 when the window lies entirely in the padding (the reference's order:
 * rows, then columns, strictly greater). */
static __device__ int64_t window_argmax(const conv_geom g, const float *x, int64_t oh,
                                        int64_t ow)
{
    int64_t best = -1;
    for (int64_t i = 0; i < g.KH; i++) {
        int64_t h = oh * g.sh - g.ph + i;
        if (h < 0 || h >= g.H)
            continue;
        for (int64_t j = 0; j < g.KW; j++) {
            int64_t w = ow * g.sw - g.pw + j;
            if (w < 0 || w >= g.W)
                continue;
            if (best < 0 || x[h * g.W + w] > x[best])
                best = h * g.W + w;
        }
    }
    return best;
}

/* One thread per output element; avg divides by the whole window (padding
 * counts), summing in double as the reference does. */
static __global__ void k_pool(const conv_geom g, bool avg, const float *x, float *y, int64_t n)
{
    FOR_EACH(t, n) {
        int64_t ow = t % g.OW, oh = t / g.OW % g.OH, plane = t / (g.OW * g.OH);
        const float *xp = x + plane * g.H * g.W;
        if (!avg) {
            int64_t at = window_argmax(g, xp, oh, ow);
            y[t] = at >= 0 ? xp[at] : 0.0f;
            continue;
        }
        double sum = 0;
        for (int64_t i = 0; i < g.KH; i++) {
            int64_t h = oh * g.sh - g.ph + i;
            if (h < 0 || h >= g.H)
                continue;
            for (int64_t j = 0; j < g.KW; j++) {
                int64_t w = ow * g.sw - g.pw + j;
                if (w >= 0 && w < g.W)
                    sum += xp[h * g.W + w];
            }
        }
        y[t] = (float)(sum / (double)(g.KH * g.KW));
    }
}

/* The windows that contain input row (or column) h: outputs [*lo, *hi). */
static __device__ void covering(int64_t h, int64_t pad, int64_t k, int64_t stride, int64_t n_out,
                                int64_t *lo, int64_t *hi)
{
    /* o * stride - pad <= h < o * stride - pad + k */
    int64_t first = h + pad - k + 1;
    *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
    int64_t last = (h + pad) / stride + 1;
    *hi = last < n_out ? last : n_out;
}

/* One thread per input element: the sum of what the windows containing it
 * route to it, added in the reference's order (windows by row, then
 * column) in fp32. */
static __global__ void k_pool_grad(const conv_geom g, bool avg, const float *x, const float *dy,
                                   float *dx, int64_t n)
{
    FOR_EACH(t, n) {
        int64_t w = t % g.W, h = t / g.W % g.H, plane = t / (g.W * g.H);
        const float *xp = x + plane * g.H * g.W, *dyp = dy + plane * g.OH * g.OW;
        int64_t oh0, oh1, ow0, ow1;
        covering(h, g.ph, g.KH, g.sh, g.OH, &oh0, &oh1);
        covering(w, g.pw, g.KW, g.sw, g.OW, &ow0, &ow1);
        float acc = 0.0f;
        for (int64_t oh = oh0; oh < oh1; oh++)
            for (int64_t ow = ow0; ow < ow1; ow++) {
                if (avg)
                    acc += (float)((double)dyp[oh * g.OW + ow] / (double)(g.KH * g.KW));
                else if (window_argmax(g, xp, oh, ow) == h * g.W + w)
                    acc += dyp[oh * g.OW + ow];
            }
        dx[t] = acc;
    }
}

ps_status ps_cuda_pool_run(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                           ps_error *err)
{
    const ps_op_attrs *a = &op->attrs;
    bool grad = op->kind == PS_OP_POOL_GRAD;
    const ps_tile *x = &in[0], *y = grad ? &in[1] : &out[0];
    if (x->rank != 4 || y->rank != 4)
        BAD("pool tiles must have rank 4 (NCHW)");
    if (x->is_int || out[0].is_int || (grad && in[2].is_int))
        BAD("pool tiles must be float");
    if (a->pool != PS_POOL_MAX && a->pool != PS_POOL_AVG)
        BAD("pool kind must be max or avg");
    conv_geom g = {.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                   .O = x->shape[1], .KH = a->window[0], .KW = a->window[1], .OH = 0, .OW = 0,
                   .sh = a->stride[0], .sw = a->stride[1], .ph = a->pad[0], .pw = a->pad[1]};
    if (g.sh < 1 || g.sw < 1 || g.ph < 0 || g.pw < 0 || g.KH < 1 || g.KW < 1)
        BAD("window and stride must be >= 1 and padding >= 0");
    if (!window_out(&g))
        BAD("the window does not fit the input tile");
    if (y->shape[0] != g.N || y->shape[1] != g.C || y->shape[2] != g.OH || y->shape[3] != g.OW)
        BAD("the output tile must be [%lld, %lld, %lld, %lld]", (long long)g.N, (long long)g.C,
            (long long)g.OH, (long long)g.OW);
    if (grad && !ps_cuda_same_shape(y, &in[2]))
        BAD("the pool output and its gradient differ in shape");
    if (grad && !ps_cuda_same_shape(x, &out[0]))
        BAD("the pool input and dx differ in shape");
    bool avg = a->pool == PS_POOL_AVG;
    if (!grad) {
        int64_t n = g.N * g.C * g.OH * g.OW;
        k_pool<<<ps_cuda_blocks(n, THREADS), THREADS, 0, s->stream>>>(
            g, avg, (const float *)x->data, (float *)out[0].data, n);
        PS_CUDA_LAUNCHED(s->loc, "k_pool");
        return PS_OK;
    }
    int64_t n = g.N * g.C * g.H * g.W;
    k_pool_grad<<<ps_cuda_blocks(n, THREADS), THREADS, 0, s->stream>>>(
        g, avg, (const float *)x->data, (const float *)in[2].data, (float *)out[0].data, n);
    PS_CUDA_LAUNCHED(s->loc, "k_pool_grad");
    return PS_OK;
}

/* ---- batchnorm ------------------------------------------------------------------- */

/* Per channel c (a block each): the sum over the batch and spatial dims of
 * x, or of (x - mean)^2 when mean is given. x [N, C, S]. */
static __global__ void k_bn_sum(const float *x, const double *mean, double *sum, int64_t N,
                                int64_t C, int64_t S)
{
    __shared__ double sh[32];
    ROWS_LOOP(c, C) {
        double acc = 0;
        for (int64_t j = threadIdx.x; j < N * S; j += blockDim.x) {
            double v = x[(j / S * C + c) * S + j % S];
            acc += mean != NULL ? (v - mean[c]) * (v - mean[c]) : v;
        }
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0)
            sum[c] = acc;
    }
}

/* Per channel: tot[c] = sum dy * xhat (dgamma), tot[C + c] = sum dy (dbeta). */
static __global__ void k_bn_grad_sum(const float *x, const float *dy, const double *mean,
                                     const double *rstd, double *tot, int64_t N, int64_t C,
                                     int64_t S)
{
    __shared__ double sh[32];
    ROWS_LOOP(c, C) {
        double sdx = 0, sd = 0;
        for (int64_t j = threadIdx.x; j < N * S; j += blockDim.x) {
            int64_t at = (j / S * C + c) * S + j % S;
            double d = dy[at];
            sd += d;
            sdx += d * ((x[at] - mean[c]) * rstd[c]);
        }
        sdx = block_sum(sdx, sh);
        sd = block_sum(sd, sh);
        if (threadIdx.x == 0) {
            tot[c] = sdx;
            tot[C + c] = sd;
        }
    }
}

/* mean = sum / count; with `var`, sum holds squared deviations: rstd. */
static __global__ void k_bn_finish(double *v, int64_t C, double count, double eps, bool var)
{
    FOR_EACH(c, C)
        v[c] = var ? 1.0 / sqrt(v[c] / count + eps) : v[c] / count;
}

static __global__ void k_bn_apply(const float *x, const double *mean, const double *rstd,
                                  const float *gamma, const float *beta, float *y, int64_t n,
                                  int64_t C, int64_t S)
{
    FOR_EACH(i, n) {
        int64_t c = i / S % C;
        y[i] = (float)((x[i] - mean[c]) * rstd[c] * gamma[c] + beta[c]);
    }
}

static __global__ void k_bn_grad_apply(const float *x, const float *dy, const double *mean,
                                       const double *rstd, const double *tot,
                                       const float *gamma, float *dx, int64_t n, int64_t C,
                                       int64_t S, double count)
{
    FOR_EACH(i, n) {
        int64_t c = i / S % C;
        double xh = (x[i] - mean[c]) * rstd[c];
        double mdx = tot[c] / count, md = tot[C + c] / count;
        dx[i] = (float)(gamma[c] * rstd[c] * (dy[i] - md - xh * mdx));
    }
}

static __global__ void k_bn_params_out(const double *tot, float *dgamma, float *dbeta, int64_t C)
{
    FOR_EACH(c, C) {
        dgamma[c] = (float)tot[c];
        dbeta[c] = (float)tot[C + c];
    }
}

static __global__ void k_f64_to_f32(const double *a, float *b, int64_t n)
{
    FOR_EACH(i, n)
        b[i] = (float)a[i];
}

static __global__ void k_f32_to_f64(const float *a, double *b, int64_t n)
{
    FOR_EACH(i, n)
        b[i] = a[i];
}

/* The op's reduce over its group of n per-channel doubles: in double where
 * the backend has a double reduce, else the totals cross devices in float
 * (each device's part was summed in double). Nothing for a group of one. */
static ps_status bn_group_sum(ps_cuda_stream *s, const ps_op *op, const ps_op_context *ctx,
                              double *v, float *scratch, int64_t n, ps_error *err)
{
    if (ctx == NULL || ctx->reduce.group_size <= 1)
        return PS_OK;
    if (ctx->reduce.fn64 != NULL) {
        /* the reduction reads what this stream wrote */
        PS_CUDA_RET(s->loc, cudaStreamSynchronize(s->stream));
        return ctx->reduce.fn64(ctx->reduce.arg, v, n, PS_REDUCE_OP_SUM, err);
    }
    k_f64_to_f32<<<ps_cuda_blocks(n, THREADS), THREADS, 0, s->stream>>>(v, scratch, n);
    PS_CUDA_LAUNCHED(s->loc, "k_f64_to_f32");
    PS_RET(ps_cuda_op_reduce(s, op, ctx, scratch, n, PS_REDUCE_OP_SUM, err));
    k_f32_to_f64<<<ps_cuda_blocks(n, THREADS), THREADS, 0, s->stream>>>(scratch, v, n);
    PS_CUDA_LAUNCHED(s->loc, "k_f32_to_f64");
    return PS_OK;
}

ps_status ps_cuda_batchnorm_run(ps_cuda_stream *s, const ps_op *op, const ps_tile *in,
                                ps_tile *out, const ps_op_context *ctx, ps_error *err)
{
    bool grad = op->kind == PS_OP_BATCHNORM_GRAD;
    const ps_tile *x = &in[0], *gamma = &in[1];
    if (x->rank < 2)
        BAD("the batchnorm input must have rank >= 2, has %d", x->rank);
    for (int i = 0; i < 3; i++)
        if (in[i].is_int || (i < op->n_out && out[i].is_int))
            BAD("batchnorm tiles must be float");
    int64_t N = x->shape[0], C = x->shape[1];
    int64_t S = N > 0 && C > 0 ? ps_tile_numel(x) / (N * C) : 0;
    if (gamma->rank != 1 || gamma->shape[0] != C)
        BAD("gamma must be [%lld] like the input's dim 1", (long long)C);
    if (!(op->attrs.eps > 0))
        BAD("eps must be positive");
    if (!grad && (!ps_cuda_same_shape(gamma, &in[2]) || !ps_cuda_same_shape(x, &out[0])))
        BAD("beta must be shaped like gamma and the output like the input");
    if (grad && (!ps_cuda_same_shape(x, &in[2]) || !ps_cuda_same_shape(x, &out[0]) ||
                 !ps_cuda_same_shape(gamma, &out[1]) || !ps_cuda_same_shape(gamma, &out[2])))
        BAD("dy and dx must be shaped like the input, dgamma and dbeta like gamma");
    int group = ctx != NULL ? ctx->reduce.group_size : 1;
    if (group <= 1 && ps_tile_split_outside(x, 1))
        BAD("batch statistics over a split batch need the op's reduce group");
    if (group > 1 && !ps_tile_split_outside(x, 1))
        BAD("a reduce group of %d devices but the batch is whole", group);
    double count = (double)x->global[0];
    for (int d = 2; d < x->rank; d++)
        count *= (double)x->global[d];
    /* workspace: mean, rstd, the gradient's two totals (double), and the
     * float scratch of the group's reduce */
    size_t bytes = (size_t)(4 * C + 1) * sizeof(double) + (size_t)(2 * C + 1) * sizeof(float);
    char *ws;
    PS_RET(ps_cuda_ws_reserve(s, bytes, (void **)&ws, err));
    double *mean = (double *)ws, *rstd = mean + C, *tot = mean + 2 * C;
    float *scratch = (float *)(mean + 4 * C + 1);
    const float *xd = (const float *)x->data;
    unsigned cb = ps_cuda_row_blocks(C), eb = ps_cuda_blocks(C, THREADS);
    int64_t n = N * C * S;
    k_bn_sum<<<cb, THREADS, 0, s->stream>>>(xd, NULL, mean, N, C, S);
    PS_CUDA_LAUNCHED(s->loc, "k_bn_sum");
    PS_RET(bn_group_sum(s, op, ctx, mean, scratch, C, err));
    k_bn_finish<<<eb, THREADS, 0, s->stream>>>(mean, C, count, op->attrs.eps, false);
    PS_CUDA_LAUNCHED(s->loc, "k_bn_finish");
    k_bn_sum<<<cb, THREADS, 0, s->stream>>>(xd, mean, rstd, N, C, S);
    PS_CUDA_LAUNCHED(s->loc, "k_bn_sum");
    PS_RET(bn_group_sum(s, op, ctx, rstd, scratch, C, err));
    k_bn_finish<<<eb, THREADS, 0, s->stream>>>(rstd, C, count, op->attrs.eps, true);
    PS_CUDA_LAUNCHED(s->loc, "k_bn_finish");
    const float *g = (const float *)gamma->data;
    if (!grad) {
        k_bn_apply<<<ps_cuda_blocks(n, THREADS), THREADS, 0, s->stream>>>(
            xd, mean, rstd, g, (const float *)in[2].data, (float *)out[0].data, n, C, S);
        PS_CUDA_LAUNCHED(s->loc, "k_bn_apply");
        return PS_OK;
    }
    const float *dy = (const float *)in[2].data;
    k_bn_grad_sum<<<cb, THREADS, 0, s->stream>>>(xd, dy, mean, rstd, tot, N, C, S);
    PS_CUDA_LAUNCHED(s->loc, "k_bn_grad_sum");
    /* the totals are dgamma and dbeta themselves (reduced by the op, as the
     * planner counts them) */
    PS_RET(bn_group_sum(s, op, ctx, tot, scratch, 2 * C, err));
    k_bn_params_out<<<eb, THREADS, 0, s->stream>>>(tot, (float *)out[1].data,
                                                   (float *)out[2].data, C);
    PS_CUDA_LAUNCHED(s->loc, "k_bn_params_out");
    k_bn_grad_apply<<<ps_cuda_blocks(n, THREADS), THREADS, 0, s->stream>>>(
        xd, dy, mean, rstd, tot, g, (float *)out[0].data, n, C, S, count);
    PS_CUDA_LAUNCHED(s->loc, "k_bn_grad_apply");
    return PS_OK;
}
