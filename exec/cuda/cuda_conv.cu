/* The convolution and pooling kinds on the GPU, with the CPU reference's
 * semantics (exec/cpu/cpu_ops.c): NCHW tiles, filters OCHW, zero padding,
 * cross-correlation. conv2d and its two gradients run through cuDNN (the
 * legacy convolution calls, deterministic algorithms only, full fp32 unless
 * the stream allows TF32); a build without cuDNN refuses them by name.
 * Pooling has kernels of its own: cuDNN's would differ from the reference
 * where a window lies in the padding and where a max window ties, and the
 * gradient is written as a gather (one thread per input element) so that
 * it needs no atomics and adds in the reference's order. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "exec/cuda/cuda_internal.cuh"

#define THREADS 256

#define BAD(...) return ps_cuda_op_error(s, op, PS_ERR_INVALID, err, __VA_ARGS__)

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
    const int64_t dims[] = {g->N, g->C, g->H, g->W, g->O, g->KH, g->KW};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] > INT_MAX)
            return ps_cuda_op_error(s, op, PS_ERR_UNSUPPORTED, err,
                                    "a dimension exceeds cuDNN's int range");
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
        DNN_TRY(cudnnCreate(&s->dnn));
        DNN_TRY(cudnnSetStream(s->dnn, s->stream));
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

/* The first of cuDNN's ranked candidates that works, is deterministic and
 * keeps full fp32 when TF32 is not allowed; -1 when there is none. The
 * three perf structs share these fields. */
template <typename Perf>
static int pick_algo(const ps_cuda_stream *s, const Perf *perf, int n, size_t *ws_bytes,
                     cudnnMathType_t *math)
{
    for (int i = 0; i < n; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].determinism != CUDNN_DETERMINISTIC)
            continue;
        if (!s->allow_tf32 && perf[i].mathType != CUDNN_FMA_MATH)
            continue;
        *ws_bytes = perf[i].memory;
        *math = perf[i].mathType;
        return i;
    }
    return -1;
}

static ps_status conv_dnn(ps_cuda_stream *s, const ps_op *op, const conv_geom *g,
                          const ps_tile *x, const ps_tile *w, const ps_tile *y, ps_error *err)
{
    ps_status st = PS_OK;
    conv_desc d = {};
    const float one = 1.0f, zero = 0.0f;
    size_t ws_bytes = 0;
    cudnnMathType_t math = CUDNN_FMA_MATH;
    void *ws = NULL;
    int found = 0, at = -1;
    PS_TRY(conv_desc_make(s, g, &d, err));
    switch (op->kind) {
    case PS_OP_CONV2D: {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        DNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(s->dnn, d.x, d.w, d.conv, d.y,
                                                       CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                       &found, perf));
        if ((at = pick_algo(s, perf, found, &ws_bytes, &math)) < 0)
            break;
        if (ws_bytes > 0)
            PS_TRY(ps_cuda_ws_reserve(s, ws_bytes, &ws, err));
        DNN_TRY(cudnnSetConvolutionMathType(d.conv, math));
        DNN_TRY(cudnnConvolutionForward(s->dnn, &one, d.x, x->data, d.w, w->data, d.conv,
                                        perf[at].algo, ws, ws_bytes, &zero, d.y, y->data));
        break;
    }
    case PS_OP_CONV2D_GRAD_INPUT: {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        DNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            s->dnn, d.w, d.y, d.conv, d.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf));
        if ((at = pick_algo(s, perf, found, &ws_bytes, &math)) < 0)
            break;
        if (ws_bytes > 0)
            PS_TRY(ps_cuda_ws_reserve(s, ws_bytes, &ws, err));
        DNN_TRY(cudnnSetConvolutionMathType(d.conv, math));
        DNN_TRY(cudnnConvolutionBackwardData(s->dnn, &one, d.w, w->data, d.y, y->data, d.conv,
                                             perf[at].algo, ws, ws_bytes, &zero, d.x, x->data));
        break;
    }
    default: {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        DNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            s->dnn, d.x, d.y, d.conv, d.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found,
            perf));
        if ((at = pick_algo(s, perf, found, &ws_bytes, &math)) < 0)
            break;
        if (ws_bytes > 0)
            PS_TRY(ps_cuda_ws_reserve(s, ws_bytes, &ws, err));
        DNN_TRY(cudnnSetConvolutionMathType(d.conv, math));
        DNN_TRY(cudnnConvolutionBackwardFilter(s->dnn, &one, d.x, x->data, d.y, y->data,
                                               d.conv, perf[at].algo, ws, ws_bytes, &zero, d.w,
                                               w->data));
        break;
    }
    }
    if (at < 0)
        st = ps_cuda_op_error(s, op, PS_ERR_UNSUPPORTED, err,
                              "cuDNN offers no deterministic %s algorithm for this shape "
                              "(%d candidates)",
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
    conv_geom g;
    PS_RET(conv_geometry(s, op, x, w, y, &g, err));
    if (kind != PS_OP_CONV2D && !output_is_global(op, &out[0]))
        BAD("the output tile belongs to a tensor of another shape than the shape attribute");
#if PS_HAVE_CUDNN
    if (g.N == 0 || g.C == 0 || g.O == 0) {
        /* nothing to convolve: the gradient outputs are zero, y is empty or zero */
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
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n;
         t += (int64_t)gridDim.x * blockDim.x) {
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
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n;
         t += (int64_t)gridDim.x * blockDim.x) {
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

static bool same_shape(const ps_tile *a, const ps_tile *b)
{
    if (a->rank != b->rank)
        return false;
    for (int d = 0; d < a->rank; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    return true;
}

ps_status ps_cuda_pool_run(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                           ps_error *err)
{
    const ps_op_attrs *a = &op->attrs;
    bool grad = op->kind == PS_OP_POOL_GRAD;
    const ps_tile *x = &in[0], *y = grad ? &in[1] : &out[0];
    if (x->rank != 4 || y->rank != 4)
        BAD("pool tiles must have rank 4 (NCHW)");
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
    if (grad && !same_shape(y, &in[2]))
        BAD("the pool output and its gradient differ in shape");
    if (grad && !same_shape(x, &out[0]))
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
