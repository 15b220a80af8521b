/* The op numerics of exec/op_exec.h on the GPU: cuBLAS strided-batched
 * GEMMs for einsums (operands permuted first when their labels are not in a
 * GEMM-able order) and CUDA kernels for the rest. Reductions run in a fixed
 * order (block trees, no atomics), so results are deterministic. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cub/cub.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exec/cuda/cuda_internal.cuh"
#include "exec/permute_plan.h"

extern "C" {
#include "exec/gemm_plan.h"
}

#define THREADS 256
#define LAUNCH(n) ps_cuda_blocks((n), THREADS), THREADS, 0, s->stream

static int64_t numel(const ps_tile *t) { return ps_tile_numel(t); }

static int64_t last_dim(const ps_tile *t) { return t->rank > 0 ? t->shape[t->rank - 1] : 1; }

static void strides_of(const int64_t *shape, int rank, int64_t *stride)
{
    int64_t acc = 1;
    for (int d = rank - 1; d >= 0; d--) {
        stride[d] = acc;
        acc *= shape[d];
    }
}

/* ---- elementwise kernels ----------------------------------------------------------- */

/* A tile's elements as floats: fp32 as stored; bf16 and fp16 widened on
 * load (exact) and rounded to nearest even on store, with CUDA's
 * conversions as exec/cuda/cuda_half.cu's, so that a kernel on half tiles
 * computes what the fp32 kernel computes on widened copies, rounded once. */
template <typename T> struct elem;
template <> struct elem<float> {
    static __device__ float ld(const float *p, int64_t i) { return p[i]; }
    static __device__ void st(float *p, int64_t i, float v) { p[i] = v; }
};
template <> struct elem<__nv_bfloat16> {
    static __device__ float ld(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
    static __device__ void st(__nv_bfloat16 *p, int64_t i, float v)
    {
        p[i] = __float2bfloat16_rn(v);
    }
};
template <> struct elem<__half> {
    static __device__ float ld(const __half *p, int64_t i) { return __half2float(p[i]); }
    static __device__ void st(__half *p, int64_t i, float v) { p[i] = __float2half_rn(v); }
};

#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

template <typename T> static __global__ void k_add(const T *a, const T *b, T *y, int64_t n)
{
    FOR_EACH(i, n) elem<T>::st(y, i, elem<T>::ld(a, i) + elem<T>::ld(b, i));
}

template <typename T> static __global__ void k_relu(const T *x, T *y, int64_t n)
{
    FOR_EACH(i, n)
    {
        float v = elem<T>::ld(x, i);
        elem<T>::st(y, i, v > 0.0f ? v : 0.0f);
    }
}

template <typename T> static __global__ void k_relu_grad(const T *y, const T *dy, T *dx, int64_t n)
{
    FOR_EACH(i, n) elem<T>::st(dx, i, elem<T>::ld(y, i) > 0.0f ? elem<T>::ld(dy, i) : 0.0f);
}

/* The tanh approximation through the logistic function, as the CPU backend:
 * s = 0.5 (1 + tanh u) = 1 / (1 + e^(-2u)) does not cancel for negative x,
 * where 1 + tanhf(u) does (in float on the host: over 1000 ulp below x = -3.5,
 * and 0 below -5.5; this form: within 40 ulp down to -7, limited by u's
 * rounding); and 1 - s = e^(-2u) s. */
template <typename T> static __global__ void k_gelu(const T *x, T *y, int64_t n)
{
    FOR_EACH(i, n)
    {
        float v = elem<T>::ld(x, i);
        float u = GELU_C * (v + GELU_A * v * v * v);
        elem<T>::st(y, i, v / (1.0f + expf(-2.0f * u)));
    }
}

template <typename T> static __global__ void k_gelu_grad(const T *x, const T *dy, T *dx, int64_t n)
{
    FOR_EACH(i, n)
    {
        float v = elem<T>::ld(x, i);
        float u = GELU_C * (v + GELU_A * v * v * v);
        float e = expf(-2.0f * u);
        float s = 1.0f / (1.0f + e);
        float r = isinf(e) ? 1.0f : e * s; /* 1 - s */
        float d = s + 2.0f * v * s * r * GELU_C * (1.0f + 3.0f * GELU_A * v * v);
        elem<T>::st(dx, i, elem<T>::ld(dy, i) * d);
    }
}

template <typename T>
static __global__ void k_bias_add(const T *x, const T *b, T *y, int64_t n, int64_t cols)
{
    FOR_EACH(i, n) elem<T>::st(y, i, elem<T>::ld(x, i) + elem<T>::ld(b, i % cols));
}

static __global__ void k_mse_grad(const float *p, const float *t, float *d, int64_t n, float scale)
{
    FOR_EACH(i, n) d[i] = scale * (p[i] - t[i]);
}

/* AdamW (decoupled weight decay) on the master copy when there is one; the
 * reference's formula in fp32 (fp64 divisions would cost as much as the
 * memory traffic of this bandwidth-bound kernel). */
static __global__ void k_adam(float *p, const float *g, float *m, float *v, float *master,
                              int64_t n, float lr, float b1, float b2, float eps, float wd,
                              float bc1, float bc2, float inv_loss_scale, int *check)
{
    /* a gradient flagged by k_flag_nonfinite (a deferred check): nothing is
     * written but the bad value's class, for the message */
    if (check != NULL && check[0] != 0) {
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            int64_t at = (int64_t)~*(const unsigned long long *)(check + 2);
            float bad = g[at];
            check[1] = isnan(bad) ? 1 : bad > 0 ? 2 : 3;
        }
        return;
    }
    FOR_EACH(i, n)
    {
        float gi = g[i] * inv_loss_scale; /* exact for a power of two */
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float *w = master != NULL ? master : p;
        float upd = (mi / bc1) / (sqrtf(vi / bc2) + eps);
        float nw = w[i] - lr * (upd + wd * w[i]);
        w[i] = nw;
        if (master != NULL)
            p[i] = nw;
    }
}

/* Flags a non-finite element (bad[0] = 1, bad[1] = an index of one). */
static __global__ void k_find_nonfinite(const float *g, int64_t n, int *bad)
{
    FOR_EACH(i, n) if (!isfinite(g[i]))
    {
        bad[0] = 1;
        bad[1] = (int)(i < INT_MAX ? i : INT_MAX);
    }
}

/* A deferred gradient check (ps_cuda_check_defer): slot[0] = 1, and the
 * first non-finite element's index as its complement in slot[2..3] (the
 * largest complement is the smallest index: the same element every run,
 * as the CPU backend names, and 64-bit). */
static __global__ void k_flag_nonfinite(const float *g, int64_t n, int *slot)
{
    FOR_EACH(i, n) if (!isfinite(g[i]))
    {
        slot[0] = 1;
        atomicMax((unsigned long long *)(slot + 2), ~(unsigned long long)i);
    }
}

/* The same for half values: every exponent bit set (`exponent`: 0x7c00
 * for fp16, 0x7f80 for bf16) is inf or NaN. */
static __global__ void k_find_nonfinite_half(const uint16_t *g, int64_t n, uint16_t exponent,
                                             int *bad)
{
    FOR_EACH(i, n) if ((g[i] & exponent) == exponent)
    {
        bad[0] = 1;
        bad[1] = (int)(i < INT_MAX ? i : INT_MAX);
    }
}

ps_status ps_cuda_find_nonfinite(ps_cuda_stream *s, const ps_tile *tiles, int n, bool *found,
                                 ps_error *err)
{
    int *bad_dev;
    int bad[2] = {0, 0};
    PS_RET(ps_cuda_ws_reserve(s, 2 * sizeof(int), (void **)&bad_dev, err));
    PS_CUDA_RET(s->loc, cudaMemsetAsync(bad_dev, 0, 2 * sizeof(int), s->stream));
    for (int t = 0; t < n; t++) {
        int64_t count = numel(&tiles[t]);
        if (count == 0)
            continue;
        if (tiles[t].is_int)
            return ps_error_set(err, PS_ERR_INTERNAL,
                                "device %d: looking for inf and NaN in an integer tile",
                                s->loc.device);
        if (ps_tile_is_half(&tiles[t])) {
            uint16_t exponent = tiles[t].dtype == PS_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
            k_find_nonfinite_half<<<LAUNCH(count)>>>((const uint16_t *)tiles[t].data, count,
                                                     exponent, bad_dev);
            PS_CUDA_LAUNCHED(s->loc, "k_find_nonfinite_half");
        } else {
            k_find_nonfinite<<<LAUNCH(count)>>>((const float *)tiles[t].data, count, bad_dev);
            PS_CUDA_LAUNCHED(s->loc, "k_find_nonfinite");
        }
    }
    PS_RET(ps_cuda_read_flag(s, bad_dev, bad, err));
    *found = bad[0] != 0;
    return PS_OK;
}

/* ---- permutation (transpose) ------------------------------------------------------ */

/* A permute kernel's dims (exec/permute_plan.h), in the index type I. */
template <typename I> struct perm_args {
    int rank;
    I out_shape[PS_MAX_RANK];
    I in_stride[PS_MAX_RANK]; /* stride in the input of output dim i, in units */
};

/* Unit i of the output from the input offset its digits give; I is 32 bits
 * wherever the units fit (64-bit divisions cost several times more). */
template <typename U, typename I>
static __global__ void k_permute(perm_args<I> a, const U *x, U *y, I n)
{
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I r = i, off = 0;
        for (int d = a.rank - 1; d > 0; d--) {
            I c = r % a.out_shape[d];
            r /= a.out_shape[d];
            off += c * a.in_stride[d];
        }
        if (a.rank > 0)
            off += r * a.in_stride[0];
        y[i] = x[off];
    }
}

template <typename U, typename I>
static void launch_permute(ps_cuda_stream *s, const ps_permute_plan *p, const void *x, void *y)
{
    perm_args<I> a;
    memset(&a, 0, sizeof a);
    a.rank = p->rank;
    for (int i = 0; i < p->rank; i++) {
        a.out_shape[i] = (I)p->out_shape[i];
        a.in_stride[i] = (I)p->in_stride[i];
    }
    k_permute<U, I><<<LAUNCH(p->n)>>>(a, (const U *)x, (U *)y, (I)p->n);
}

template <typename U>
static void launch_permute_units(ps_cuda_stream *s, const ps_permute_plan *p, const void *x,
                                 void *y)
{
    /* (below 2^31, so that an index plus the grid's stride stays below 2^32) */
    if (p->n <= (int64_t)INT32_MAX)
        launch_permute<U, uint32_t>(s, p, x, y);
    else
        launch_permute<U, int64_t>(s, p, x, y);
}

ps_status ps_cuda_permute(ps_cuda_stream *s, const void *x, const int64_t *in_shape, int rank,
                          const int *perm, size_t elem_bytes, void *y, ps_error *err)
{
    if (elem_bytes != 2 && elem_bytes != 4)
        return ps_error_set(err, PS_ERR_INTERNAL, "device %d: permuting %zu-byte elements",
                            s->loc.device, elem_bytes);
    ps_permute_plan p;
    ps_permute_plan_make(in_shape, rank, perm, elem_bytes, (uintptr_t)x, (uintptr_t)y, &p);
    if (p.n == 0)
        return PS_OK;
    switch (p.unit_bytes) {
    case 16: launch_permute_units<uint4>(s, &p, x, y); break;
    case 8: launch_permute_units<uint2>(s, &p, x, y); break;
    case 4: launch_permute_units<uint32_t>(s, &p, x, y); break;
    default: launch_permute_units<uint16_t>(s, &p, x, y); break;
    }
    PS_CUDA_LAUNCHED(s->loc, "k_permute");
    return PS_OK;
}

/* y = x with out dim i = in dim perm[i], 4-byte elements. */
static ps_status permute(ps_cuda_stream *s, const void *x, const int64_t *in_shape, int rank,
                         const int *perm, void *y, ps_error *err)
{
    return ps_cuda_permute(s, x, in_shape, rank, perm, 4, y, err);
}

/* ---- reduce / broadcast ------------------------------------------------------------ */

typedef struct red_args {
    int kept_rank, red_rank;
    int64_t kept_size[PS_MAX_RANK], kept_stride[PS_MAX_RANK];
    int64_t red_size[PS_MAX_RANK], red_stride[PS_MAX_RANK];
    int64_t n_red;
    double factor;
} red_args;

static __device__ int64_t red_base(const red_args &a, int64_t o)
{
    int64_t off = 0;
    for (int d = a.kept_rank - 1; d >= 0; d--) {
        off += (o % a.kept_size[d]) * a.kept_stride[d];
        o /= a.kept_size[d];
    }
    return off;
}

static __device__ int64_t red_off(const red_args &a, int64_t r)
{
    int64_t off = 0;
    for (int d = a.red_rank - 1; d >= 0; d--) {
        off += (r % a.red_size[d]) * a.red_stride[d];
        r /= a.red_size[d];
    }
    return off;
}

/* One thread per output element (many outputs). */
template <typename T>
static __global__ void k_reduce_thread(red_args a, const T *x, T *y, int64_t n_out)
{
    FOR_EACH(o, n_out)
    {
        int64_t base = red_base(a, o);
        double acc = 0;
        for (int64_t r = 0; r < a.n_red; r++)
            acc += elem<T>::ld(x, base + red_off(a, r));
        elem<T>::st(y, o, (float)(acc * a.factor));
    }
}

/* One block per output element (few outputs, long reductions). */
template <typename T>
static __global__ void k_reduce_block(red_args a, const T *x, T *y, int64_t n_out)
{
    __shared__ double sh[32];
    ROWS_LOOP(o, n_out)
    {
        int64_t base = red_base(a, o);
        double acc = 0;
        for (int64_t r = threadIdx.x; r < a.n_red; r += blockDim.x)
            acc += elem<T>::ld(x, base + red_off(a, r));
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0)
            elem<T>::st(y, o, (float)(acc * a.factor));
    }
}

typedef struct bcast_args {
    int rank;
    int64_t out_shape[PS_MAX_RANK];
    int64_t in_stride[PS_MAX_RANK]; /* 0 for broadcast dims */
    float factor;
} bcast_args;

template <typename T>
static __global__ void k_broadcast(bcast_args a, const T *x, T *y, int64_t n)
{
    FOR_EACH(i, n)
    {
        int64_t r = i, off = 0;
        for (int d = a.rank - 1; d >= 0; d--) {
            off += (r % a.out_shape[d]) * a.in_stride[d];
            r /= a.out_shape[d];
        }
        elem<T>::st(y, i, elem<T>::ld(x, off) * a.factor);
    }
}

/* ---- row kernels: layernorm, softmax ------------------------------------------------ */

/* Mean and 1 / sqrt(var + eps) of a row, in double (to every thread). */
template <typename T>
static __device__ void row_stats(const T *xr, int64_t n, double eps, double *sh, double *mean,
                                 double *rstd)
{
    double acc = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        acc += elem<T>::ld(xr, j);
    double m = block_sum(acc, sh) / (double)n;
    acc = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        double d = elem<T>::ld(xr, j) - m;
        acc += d * d;
    }
    double var = block_sum(acc, sh) / (double)n;
    *mean = m;
    *rstd = 1.0 / sqrt(var + eps);
}

template <typename T>
static __global__ void k_layernorm(const T *x, const T *g, const T *b, T *y, int64_t rows,
                                   int64_t n, double eps)
{
    __shared__ double sh[32];
    ROWS_LOOP(row, rows)
    {
        const T *xr = x + row * n;
        double mean, rstd;
        row_stats(xr, n, eps, sh, &mean, &rstd);
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
            elem<T>::st(y, row * n + j,
                        (float)((elem<T>::ld(xr, j) - mean) * rstd * elem<T>::ld(g, j) +
                                elem<T>::ld(b, j)));
    }
}

/* dx per row; the row's mean and 1/std saved for the parameter gradients. */
template <typename T>
static __global__ void k_layernorm_grad_x(const T *x, const T *g, const T *dy, T *dx,
                                          double *mean_out, double *rstd_out, int64_t rows,
                                          int64_t n, double eps)
{
    __shared__ double sh[32];
    ROWS_LOOP(row, rows)
    {
        const T *xr = x + row * n, *dyr = dy + row * n;
        double mean, rstd;
        row_stats(xr, n, eps, sh, &mean, &rstd);
        double sa = 0, sb = 0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            double gd = (double)elem<T>::ld(g, j) * elem<T>::ld(dyr, j);
            sa += gd;
            sb += gd * (elem<T>::ld(xr, j) - mean) * rstd;
        }
        sa = block_sum(sa, sh) / (double)n;
        sb = block_sum(sb, sh) / (double)n;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            double xhat = (elem<T>::ld(xr, j) - mean) * rstd;
            elem<T>::st(dx, row * n + j,
                        (float)(rstd * ((double)elem<T>::ld(g, j) * elem<T>::ld(dyr, j) - sa -
                                        xhat * sb)));
        }
        if (threadIdx.x == 0) {
            mean_out[row] = mean;
            rstd_out[row] = rstd;
        }
    }
}

/* Column partial sums of dy * xhat and dy over a chunk of rows. */
template <typename T>
static __global__ void k_layernorm_grad_partial(const T *x, const T *dy, const double *mean,
                                                const double *rstd, double *pg, double *pb,
                                                int64_t rows, int64_t n, int64_t rows_per_chunk)
{
    int64_t c = blockIdx.y;
    int64_t r0 = c * rows_per_chunk, r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (int64_t)gridDim.x * blockDim.x) {
        double sg = 0, sb = 0;
        for (int64_t r = r0; r < r1; r++) {
            double d = elem<T>::ld(dy, r * n + j);
            sg += d * ((double)elem<T>::ld(x, r * n + j) - mean[r]) * rstd[r];
            sb += d;
        }
        pg[c * n + j] = sg;
        pb[c * n + j] = sb;
    }
}

template <typename T>
static __global__ void k_sum_chunks(const double *pg, const double *pb, T *dg, T *db, int64_t n,
                                    int64_t chunks)
{
    FOR_EACH(j, n)
    {
        double sg = 0, sb = 0;
        for (int64_t c = 0; c < chunks; c++) {
            sg += pg[c * n + j];
            sb += pb[c * n + j];
        }
        elem<T>::st(dg, j, (float)sg);
        elem<T>::st(db, j, (float)sb);
    }
}

/* softmax(scale * x) over rows of n; causal: key k = koff + j is masked for
 * query q = qoff + (row % qdim) when k > q. */
/* Exponentials in fp32 (expf: a few ulp), their sum in fp64. */
template <typename T>
static __global__ void k_softmax(const T *x, T *y, int64_t rows, int64_t n, float scale,
                                 bool causal, int64_t qdim, int64_t qoff, int64_t koff)
{
    __shared__ float sh[32];
    __shared__ double dsh[32];
    ROWS_LOOP(row, rows)
    {
        const T *xr = x + row * n;
        int64_t q = causal ? qoff + row % qdim : 0;
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
            if (!causal || koff + j <= q)
                m = fmaxf(m, scale * elem<T>::ld(xr, j));
        m = block_max(m, sh, -INFINITY);
        double acc = 0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
            if (!causal || koff + j <= q)
                acc += expf(scale * elem<T>::ld(xr, j) - m);
        double sum = block_sum(acc, dsh);
        float inv = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            bool keep = !causal || koff + j <= q;
            elem<T>::st(y, row * n + j, keep ? expf(scale * elem<T>::ld(xr, j) - m) * inv : 0.0f);
        }
    }
}

/* dx = scale * y * (dy - sum(y * dy)) per row (masked entries have y = 0). */
template <typename T>
static __global__ void k_softmax_grad(const T *y, const T *dy, T *dx, int64_t rows, int64_t n,
                                      double scale)
{
    __shared__ double sh[32];
    ROWS_LOOP(row, rows)
    {
        const T *yr = y + row * n, *dyr = dy + row * n;
        double acc = 0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
            acc += (double)elem<T>::ld(yr, j) * elem<T>::ld(dyr, j);
        double dot = block_sum(acc, sh);
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) /* in double, to float, rounded */
            elem<T>::st(dx, row * n + j,
                        (float)(scale * elem<T>::ld(yr, j) * (elem<T>::ld(dyr, j) - dot)));
    }
}

/* ---- losses -------------------------------------------------------------------------- */

#define PARTIAL_BLOCKS 512

/* partial[b] = sum of (p - t)^2 over the block's share (grid-stride). */
static __global__ void k_mse_partial(const float *p, const float *t, double *partial, int64_t n)
{
    __shared__ double sh[32];
    double acc = 0;
    FOR_EACH(i, n)
    {
        double d = (double)p[i] - (double)t[i];
        acc += d * d;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = acc;
}

static __global__ void k_sum_partials(const double *partial, int n, double scale, float *out)
{
    __shared__ double sh[32];
    double acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        acc += partial[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0)
        out[0] = (float)(acc * scale);
}

static __global__ void k_row_max(const float *x, float *mx, int64_t rows, int64_t n)
{
    __shared__ float sh[32];
    ROWS_LOOP(row, rows)
    {
        float m = -INFINITY;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
            m = fmaxf(m, x[row * n + j]);
        m = block_max(m, sh, -INFINITY);
        if (threadIdx.x == 0)
            mx[row] = m;
    }
}

/* se[row] = sum exp(x - mx[row]); lab[row] = the label's logit when the label
 * falls in this tile's vocabulary [voff, voff + n), else 0 (lab may be NULL). */
static __global__ void k_row_sumexp(const float *x, const int32_t *labels, const float *mx,
                                    float *se, float *lab, int64_t rows, int64_t n,
                                    int64_t voff, int64_t vocab, int *bad)
{
    __shared__ double sh[32];
    ROWS_LOOP(row, rows)
    {
        float m = mx[row];
        double acc = 0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
            acc += expf(x[row * n + j] - m);
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0) {
            se[row] = (float)acc;
            int64_t l = (int64_t)labels[row];
            if (l < 0 || l >= vocab) {
                bad[0] = 1; /* any bad label: every writer stores the same flag */
                bad[1] = (int)l;
            }
            if (lab != NULL)
                lab[row] = l - voff >= 0 && l - voff < n ? x[row * n + (l - voff)] : 0.0f;
        }
    }
}

static __global__ void k_xent_final(const float *se, const float *mx, const float *lab, int64_t rows,
                             double inv_tokens, float *out)
{
    __shared__ double sh[32];
    double acc = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
        acc += log((double)se[r]) + (double)mx[r] - (double)lab[r];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0)
        out[0] = (float)(acc * inv_tokens);
}

static __global__ void k_xent_grad(const float *x, const int32_t *labels, const float *mx,
                            const float *se, float *dx, int64_t rows, int64_t n, int64_t voff,
                            float seed)
{
    FOR_EACH(i, rows * n)
    {
        int64_t row = i / n, j = i % n;
        float p = expf(x[i] - mx[row]) / se[row];
        float onehot = (int64_t)labels[row] == voff + j ? 1.0f : 0.0f;
        dx[i] = (p - onehot) * seed; /* seed: the loss scale over the tokens */
    }
}

/* ---- embedding ------------------------------------------------------------------------ */

static __global__ void k_embedding(const float *table, const int32_t *ids, float *y,
                                   int64_t tokens, int64_t h, int64_t row0, int64_t nrows,
                                   int64_t vocab, int *bad)
{
    FOR_EACH(i, tokens * h)
    {
        int64_t t = i / h, j = i % h;
        int64_t id = ids[t], r = id - row0;
        y[i] = r >= 0 && r < nrows ? table[r * h + j] : 0.0f;
        if (j == 0 && (id < 0 || id >= vocab)) {
            bad[0] = 1;
            bad[1] = (int)id;
        }
    }
}

/* key = local row (nrows for ids outside the tile), value = token. */
static __global__ void k_embedding_keys(const int32_t *ids, unsigned *keys, int *vals,
                                        int64_t tokens, int64_t row0, int64_t nrows,
                                        int64_t vocab, int *bad)
{
    FOR_EACH(t, tokens)
    {
        int64_t id = ids[t], r = id - row0;
        keys[t] = (unsigned)(r >= 0 && r < nrows ? r : nrows);
        vals[t] = (int)t;
        if (id < 0 || id >= vocab) {
            bad[0] = 1;
            bad[1] = (int)id;
        }
    }
}

/* After a stable sort by row: the first token of each row's run sums the run
 * in token order. */
static __global__ void k_embedding_grad_rows(const unsigned *keys, const int *vals,
                                             const float *dy, float *dtable, int64_t tokens,
                                             int64_t h, int64_t nrows)
{
    ROWS_LOOP(i, tokens)
    {
        unsigned key = keys[i];
        if ((int64_t)key >= nrows || (i > 0 && keys[i - 1] == key))
            continue;
        for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
            float acc = 0;
            for (int64_t k = i; k < tokens && keys[k] == key; k++)
                acc += dy[(int64_t)vals[k] * h + j];
            dtable[(int64_t)key * h + j] = acc;
        }
    }
}

/* ---- workspace carving -------------------------------------------------------------- */

typedef struct carve {
    size_t used;
} carve;

/* Reserves `bytes` (256-aligned) and returns its offset. */
static size_t carve_take(carve *c, size_t bytes)
{
    size_t at = c->used;
    c->used += (bytes + 255) & ~(size_t)255;
    return at;
}

/* ---- ops ------------------------------------------------------------------------------ */

static ps_status need_io(ps_cuda_stream *s, const ps_op *op, int n_in, int n_out,
                         ps_error *err)
{
    if (op->n_in < n_in || op->n_out != n_out)
        BAD("expects %d inputs and %d outputs, has %d and %d", n_in, n_out, op->n_in,
            op->n_out);
    return PS_OK;
}

static ps_status need_numel(ps_cuda_stream *s, const ps_op *op, const ps_tile *a,
                            const ps_tile *b, const char *an, const char *bn, ps_error *err)
{
    if (numel(a) != numel(b))
        BAD("%s has %lld elements but %s has %lld", an, (long long)numel(a), bn,
            (long long)numel(b));
    return PS_OK;
}

static ps_status need_float(ps_cuda_stream *s, const ps_op *op, const ps_tile *t,
                            const char *what, ps_error *err)
{
    if (t->is_int)
        BAD("%s must be a float tile", what);
    if (t->data == NULL)
        BAD("%s has no data", what);
    return PS_OK;
}

/* add: out[0] += the product (an accumulated gradient, ps_op_context.accumulate):
 * cuBLAS's beta 1, or, when the output needs a permutation, the permuted
 * product added after it. */
static ps_status run_matmul(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                            bool add, ps_error *err)
{
    const ps_tile *t[3] = {&in[0], &in[1], &out[0]};
    int rank[3];
    int64_t shape[3][PS_MAX_RANK];
    for (int o = 0; o < 3; o++) {
        PS_RET(need_float(s, op, t[o], o == 2 ? "the output" : "an operand", err));
        rank[o] = t[o]->rank;
        memcpy(shape[o], t[o]->shape, sizeof shape[o]);
    }
    ps_gemm_plan p;
    ps_error perr = {PS_OK, ""};
    if (ps_gemm_plan_make(op->attrs.einsum, rank, shape, &p, &perr) != PS_OK)
        BAD("%s", perr.msg);
    if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX || p.batch > INT32_MAX)
        BAD("GEMM dimensions %lld x %lld x %lld (batch %lld) exceed cuBLAS's int range",
            (long long)p.m, (long long)p.n, (long long)p.k, (long long)p.batch);
    /* workspace: permuted operands, the output before its permutation */
    carve c = {0};
    size_t off_op[2] = {0, 0}, off_c = 0, off_sum = 0;
    for (int o = 0; o < 2; o++)
        if (p.permute[o])
            off_op[o] = carve_take(&c, (size_t)numel(t[o]) * sizeof(float));
    if (p.out_permute)
        off_c = carve_take(&c, (size_t)numel(t[2]) * sizeof(float));
    if (p.out_permute && add)
        off_sum = carve_take(&c, (size_t)numel(t[2]) * sizeof(float));
    char *ws = NULL;
    if (c.used > 0)
        PS_RET(ps_cuda_ws_reserve(s, c.used, (void **)&ws, err));
    const float *opnd[2] = {(const float *)in[0].data, (const float *)in[1].data};
    for (int o = 0; o < 2; o++)
        if (p.permute[o]) {
            PS_RET(permute(s, opnd[o], t[o]->shape, t[o]->rank, p.perm[o], ws + off_op[o], err));
            opnd[o] = (const float *)(ws + off_op[o]);
        }
    if (numel(t[2]) == 0)
        return PS_OK;
    if (p.k == 0) { /* an empty contraction: zeros (nothing to add) */
        if (!add)
            PS_CUDA_RET(s->loc,
                        cudaMemsetAsync(out[0].data, 0, (size_t)numel(t[2]) * 4, s->stream));
        return PS_OK;
    }
    float *cptr = p.out_permute ? (float *)(ws + off_c) : (float *)out[0].data;
    const float alpha = 1.0f, beta = add && !p.out_permute ? 1.0f : 0.0f;
    cublasComputeType_t ct = s->allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    for (int64_t call = 0; call < p.calls; call++) {
        int64_t at[3];
        ps_gemm_plan_offsets(&p, call, at);
        PS_CUBLAS_RET(s->loc, cublasGemmStridedBatchedEx(
                                  s->blas, p.transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  p.transb ? CUBLAS_OP_T : CUBLAS_OP_N, (int)p.cm, (int)p.cn,
                                  (int)p.ck, &alpha, opnd[1 - p.left] + at[1 - p.left], CUDA_R_32F,
                                  (int)p.lda, (long long)p.stride_a, opnd[p.left] + at[p.left],
                                  CUDA_R_32F, (int)p.ldb, (long long)p.stride_b, &beta,
                                  cptr + at[2], CUDA_R_32F, (int)p.ldc, (long long)p.stride_c,
                                  (int)p.batch, ct, CUBLAS_GEMM_DEFAULT));
    }
    if (p.out_permute && add) {
        float *sum = (float *)(ws + off_sum), *y = (float *)out[0].data;
        int64_t n = numel(t[2]);
        PS_RET(permute(s, cptr, p.out_tmp_shape, p.out_rank, p.out_perm, sum, err));
        k_add<<<LAUNCH(n)>>>(y, sum, y, n);
        PS_CUDA_LAUNCHED(s->loc, "k_add");
    } else if (p.out_permute) {
        PS_RET(permute(s, cptr, p.out_tmp_shape, p.out_rank, p.out_perm, out[0].data, err));
    }
    return PS_OK;
}

template <typename T>
static ps_status run_reduce(ps_cuda_stream *s, const ps_op *op, const ps_tile *x, ps_tile *y,
                            ps_error *err)
{
    red_args a;
    memset(&a, 0, sizeof a);
    uint32_t axes = op->attrs.axes;
    if (axes == 0 || (x->rank < 32 && (axes >> x->rank) != 0))
        BAD("axes 0x%x do not fit an input of rank %d", axes, x->rank);
    int64_t stride[PS_MAX_RANK];
    strides_of(x->shape, x->rank, stride);
    double count = 1;
    a.n_red = 1;
    int64_t n_out = 1;
    for (int d = 0; d < x->rank; d++) {
        if (axes & (1u << d)) {
            a.red_size[a.red_rank] = x->shape[d];
            a.red_stride[a.red_rank++] = stride[d];
            a.n_red *= x->shape[d];
            count *= (double)x->global[d];
        } else {
            a.kept_size[a.kept_rank] = x->shape[d];
            a.kept_stride[a.kept_rank++] = stride[d];
            n_out *= x->shape[d];
        }
    }
    if (numel(y) != n_out)
        BAD("output has %lld elements, the input without axes %lld", (long long)numel(y),
            (long long)n_out);
    a.factor = op->attrs.reduce == PS_REDUCE_MEAN ? 1.0 / count : 1.0;
    if (n_out >= 8192 || a.n_red < 64) {
        k_reduce_thread<T><<<LAUNCH(n_out)>>>(a, (const T *)x->data, (T *)y->data, n_out);
        PS_CUDA_LAUNCHED(s->loc, "k_reduce_thread");
    } else {
        k_reduce_block<T><<<ps_cuda_row_blocks(n_out), THREADS, 0, s->stream>>>(
            a, (const T *)x->data, (T *)y->data, n_out);
        PS_CUDA_LAUNCHED(s->loc, "k_reduce_block");
    }
    return PS_OK;
}

template <typename T>
static ps_status run_broadcast(ps_cuda_stream *s, const ps_op *op, const ps_tile *x, ps_tile *y,
                               ps_error *err)
{
    bcast_args a;
    memset(&a, 0, sizeof a);
    uint32_t axes = op->attrs.axes;
    if (axes == 0 || (y->rank < 32 && (axes >> y->rank) != 0))
        BAD("axes 0x%x do not fit an output of rank %d", axes, y->rank);
    a.rank = y->rank;
    /* the input's shape is the output's without axes */
    int64_t in_shape[PS_MAX_RANK], in_stride[PS_MAX_RANK];
    int kr = 0;
    double count = 1;
    for (int d = 0; d < y->rank; d++) {
        a.out_shape[d] = y->shape[d];
        if (axes & (1u << d))
            count *= (double)y->global[d];
        else
            in_shape[kr++] = y->shape[d];
    }
    int64_t n_in = 1;
    for (int i = 0; i < kr; i++)
        n_in *= in_shape[i];
    if (numel(x) != n_in)
        BAD("input has %lld elements, the output without axes %lld", (long long)numel(x),
            (long long)n_in);
    strides_of(in_shape, kr, in_stride);
    for (int d = 0, k = 0; d < y->rank; d++)
        a.in_stride[d] = (axes & (1u << d)) ? 0 : in_stride[k++];
    a.factor = op->attrs.reduce == PS_REDUCE_MEAN ? (float)(1.0 / count) : 1.0f;
    int64_t n = numel(y);
    k_broadcast<T><<<LAUNCH(n)>>>(a, (const T *)x->data, (T *)y->data, n);
    PS_CUDA_LAUNCHED(s->loc, "k_broadcast");
    return PS_OK;
}

template <typename T>
static ps_status run_layernorm(ps_cuda_stream *s, const ps_op *op, const ps_tile *in,
                               ps_tile *out, ps_error *err)
{
    const ps_tile *x = &in[0], *g = &in[1];
    int64_t n = last_dim(x), rows = n > 0 ? numel(x) / n : 0;
    if (numel(g) != n || (op->kind == PS_OP_LAYERNORM && numel(&in[2]) != n))
        BAD("gamma and beta must have the %lld elements of the input's last dim", (long long)n);
    if (numel(&out[0]) != numel(x))
        BAD("output has %lld elements, the input %lld", (long long)numel(&out[0]),
            (long long)numel(x));
    double eps = op->attrs.eps;
    if (x->rank < 1 || x->shape[x->rank - 1] != x->global[x->rank - 1])
        return ps_cuda_op_error(s, op, PS_ERR_UNSUPPORTED, err,
                                "the normalized (last) dim must not be split");
    if (op->kind == PS_OP_LAYERNORM) {
        k_layernorm<T><<<ps_cuda_row_blocks(rows), THREADS, 0, s->stream>>>(
            (const T *)x->data, (const T *)g->data, (const T *)in[2].data, (T *)out[0].data, rows,
            n, eps);
        PS_CUDA_LAUNCHED(s->loc, "k_layernorm");
        return PS_OK;
    }
    const ps_tile *dy = &in[2];
    if (numel(dy) != numel(x))
        BAD("output gradient has %lld elements, the input %lld", (long long)numel(dy),
            (long long)numel(x));
    if (numel(&out[1]) != n || numel(&out[2]) != n)
        BAD("dgamma and dbeta must have %lld elements", (long long)n);
    if (n == 0) /* nothing to write (and no grid of zero blocks) */
        return PS_OK;
    int64_t chunks = rows < 64 ? rows : 64;
    if (chunks < 1)
        chunks = 1;
    int64_t per = (rows + chunks - 1) / chunks;
    carve c = {0};
    size_t o_mean = carve_take(&c, (size_t)rows * 8), o_rstd = carve_take(&c, (size_t)rows * 8);
    size_t o_pg = carve_take(&c, (size_t)(chunks * n) * 8);
    size_t o_pb = carve_take(&c, (size_t)(chunks * n) * 8);
    char *ws;
    PS_RET(ps_cuda_ws_reserve(s, c.used, (void **)&ws, err));
    double *mean = (double *)(ws + o_mean), *rstd = (double *)(ws + o_rstd);
    double *pg = (double *)(ws + o_pg), *pb = (double *)(ws + o_pb);
    k_layernorm_grad_x<T><<<ps_cuda_row_blocks(rows), THREADS, 0, s->stream>>>(
        (const T *)x->data, (const T *)g->data, (const T *)dy->data, (T *)out[0].data, mean, rstd,
        rows, n, eps);
    PS_CUDA_LAUNCHED(s->loc, "k_layernorm_grad_x");
    dim3 grid((unsigned)((n + THREADS - 1) / THREADS < 65535 ? (n + THREADS - 1) / THREADS
                                                               : 65535),
              (unsigned)chunks);
    k_layernorm_grad_partial<T><<<grid, THREADS, 0, s->stream>>>(
        (const T *)x->data, (const T *)dy->data, mean, rstd, pg, pb, rows, n, per);
    PS_CUDA_LAUNCHED(s->loc, "k_layernorm_grad_partial");
    k_sum_chunks<T><<<LAUNCH(n)>>>(pg, pb, (T *)out[1].data, (T *)out[2].data, n, chunks);
    PS_CUDA_LAUNCHED(s->loc, "k_sum_chunks");
    return PS_OK;
}

template <typename T>
static ps_status run_softmax(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                             ps_error *err)
{
    const ps_tile *x = &in[0];
    int64_t n = last_dim(x), rows = n > 0 ? numel(x) / n : 0;
    if (numel(&out[0]) != numel(x))
        BAD("output has %lld elements, the input %lld", (long long)numel(&out[0]),
            (long long)numel(x));
    if (x->rank < 1 || x->shape[x->rank - 1] != x->global[x->rank - 1])
        return ps_cuda_op_error(s, op, PS_ERR_UNSUPPORTED, err,
                                "the softmax (last) dim must not be split");
    if (!(op->attrs.scale > 0))
        BAD("scale must be positive");
    if (op->kind == PS_OP_SOFTMAX_GRAD) {
        PS_RET(need_numel(s, op, &in[0], &in[1], "y", "dy", err));
        k_softmax_grad<T><<<ps_cuda_row_blocks(rows), THREADS, 0, s->stream>>>(
            (const T *)in[0].data, (const T *)in[1].data, (T *)out[0].data, rows, n,
            op->attrs.scale);
        PS_CUDA_LAUNCHED(s->loc, "k_softmax_grad");
        return PS_OK;
    }
    bool causal = op->attrs.causal;
    if (causal && x->rank < 2)
        BAD("a causal softmax needs rank >= 2");
    int64_t qdim = causal ? x->shape[x->rank - 2] : 1;
    int64_t qoff = causal ? x->offset[x->rank - 2] : 0;
    int64_t koff = causal ? x->offset[x->rank - 1] : 0;
    k_softmax<T><<<ps_cuda_row_blocks(rows), THREADS, 0, s->stream>>>(
        (const T *)x->data, (T *)out[0].data, rows, n, (float)op->attrs.scale, causal, qdim, qoff,
        koff);
    PS_CUDA_LAUNCHED(s->loc, "k_softmax");
    return PS_OK;
}

/* The flag pair a kernel sets for an id or label outside the vocabulary: a
 * deferred check, reported at the stream's next sync. */
static ps_status defer_ids(ps_cuda_stream *s, const ps_op *op, ps_cuda_check_kind kind,
                           int64_t vocab, int **bad, ps_error *err)
{
    ps_cuda_check c = {kind, op, vocab, 0, 0.0};
    return ps_cuda_check_defer(s, &c, bad, err);
}

static ps_status run_embedding(ps_cuda_stream *s, const ps_op *op, const ps_tile *in,
                               ps_tile *out, ps_error *err)
{
    bool grad = op->kind == PS_OP_EMBEDDING_GRAD;
    const ps_tile *table = grad ? &out[0] : &in[0];
    const ps_tile *ids = grad ? &in[0] : &in[1];
    const ps_tile *y = grad ? &in[1] : &out[0];
    if (table->rank != 2)
        BAD("the table tile must have rank 2, has %d", table->rank);
    if (!ids->is_int)
        BAD("ids must be an int32 tile");
    if (y->rank != ids->rank + 1)
        BAD("the embedded tile must have the ids' rank + 1");
    for (int k = 0; k < ids->rank; k++)
        if (ids->shape[k] != y->shape[k])
            BAD("the ids tile and the embedded tile differ in dim %d", k);
    if (y->shape[y->rank - 1] != table->shape[1] || y->offset[y->rank - 1] != table->offset[1])
        BAD("the embedded tile holds columns %lld..+%lld, the table tile %lld..+%lld",
            (long long)y->offset[y->rank - 1], (long long)y->shape[y->rank - 1],
            (long long)table->offset[1], (long long)table->shape[1]);
    if (grad) {
        bool same = op->attrs.shape_rank == 2 && op->attrs.shape[0] == table->global[0] &&
                    op->attrs.shape[1] == table->global[1];
        if (!same)
            BAD("the table gradient tile belongs to a tensor of another shape than the shape "
                "attribute");
    }
    int64_t h = table->shape[1], nrows = table->shape[0], row0 = table->offset[0];
    int64_t vocab = table->global[0];
    int64_t tokens = numel(ids);
    int *bad;
    PS_RET(defer_ids(s, op, PS_CUDA_CHECK_ID, vocab, &bad, err));
    if (!grad) {
        k_embedding<<<LAUNCH(tokens * h)>>>((const float *)table->data,
                                            (const int32_t *)ids->data, (float *)y->data, tokens,
                                            h, row0, nrows, vocab, bad);
        PS_CUDA_LAUNCHED(s->loc, "k_embedding");
        return PS_OK;
    }
    if (tokens > INT32_MAX || nrows >= INT32_MAX)
        BAD("%lld tokens or %lld rows exceed the sort's int range", (long long)tokens,
            (long long)nrows);
    PS_CUDA_RET(s->loc, cudaMemsetAsync(out[0].data, 0, (size_t)numel(table) * 4, s->stream));
    if (tokens == 0)
        return PS_OK;
    int end_bit = 1;
    while (end_bit < 31 && ((int64_t)1 << end_bit) <= nrows)
        end_bit++;
    size_t temp_bytes = 0;
    PS_CUDA_RET(s->loc, cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const unsigned *)NULL,
                                                        (unsigned *)NULL, (const int *)NULL,
                                                        (int *)NULL, (int)tokens, 0, end_bit,
                                                        s->stream));
    carve c = {0};
    size_t o_k0 = carve_take(&c, (size_t)tokens * 4), o_k1 = carve_take(&c, (size_t)tokens * 4);
    size_t o_v0 = carve_take(&c, (size_t)tokens * 4), o_v1 = carve_take(&c, (size_t)tokens * 4);
    size_t o_tmp = carve_take(&c, temp_bytes);
    char *ws;
    PS_RET(ps_cuda_ws_reserve(s, c.used, (void **)&ws, err));
    unsigned *k0 = (unsigned *)(ws + o_k0), *k1 = (unsigned *)(ws + o_k1);
    int *v0 = (int *)(ws + o_v0), *v1 = (int *)(ws + o_v1);
    k_embedding_keys<<<LAUNCH(tokens)>>>((const int32_t *)ids->data, k0, v0, tokens, row0, nrows,
                                         vocab, bad);
    PS_CUDA_LAUNCHED(s->loc, "k_embedding_keys");
    /* stable: a row's tokens stay in token order, so the sums below are
     * deterministic */
    PS_CUDA_RET(s->loc, cub::DeviceRadixSort::SortPairs(ws + o_tmp, temp_bytes, k0, k1, v0, v1,
                                                        (int)tokens, 0, end_bit, s->stream));
    k_embedding_grad_rows<<<ps_cuda_row_blocks(tokens), THREADS, 0, s->stream>>>(
        k1, v1, (const float *)y->data, (float *)out[0].data, tokens, h, nrows);
    PS_CUDA_LAUNCHED(s->loc, "k_embedding_grad_rows");
    return PS_OK;
}

ps_status ps_cuda_op_reduce(ps_cuda_stream *s, const ps_op *op, const ps_op_context *ctx,
                            float *data, int64_t n, ps_reduce_op rop, ps_error *err)
{
    if (ctx == NULL || ctx->reduce.group_size <= 1)
        return PS_OK;
    if (ctx->reduce.fn == NULL)
        BAD("a reduce group of %d devices without a reduce function", ctx->reduce.group_size);
    /* the reduction reads what this stream wrote */
    PS_CUDA_RET(s->loc, cudaStreamSynchronize(s->stream));
    return ctx->reduce.fn(ctx->reduce.arg, data, n, rop, err);
}

static ps_status run_xent(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                          const ps_op_context *ctx, ps_error *err)
{
    const ps_tile *x = &in[0], *labels = &in[1];
    bool grad = op->kind == PS_OP_SOFTMAX_XENT_GRAD;
    if (!labels->is_int)
        BAD("labels must be an int32 tile");
    if (x->rank < 1)
        BAD("logits must have rank >= 1");
    if (labels->rank != x->rank - 1)
        BAD("labels must have the logits' rank - 1");
    for (int k = 0; k < labels->rank; k++)
        if (labels->shape[k] != x->shape[k])
            BAD("the labels tile and the logits tile differ in dim %d", k);
    int64_t n = last_dim(x), rows = numel(labels);
    if (numel(&out[0]) != (grad ? numel(x) : 1))
        BAD("output has %lld elements", (long long)numel(&out[0]));
    int64_t voff = x->offset[x->rank - 1], vocab = x->global[x->rank - 1];
    int group = ctx != NULL ? ctx->reduce.group_size : 1;
    if (group <= 1 && n != vocab)
        BAD("the vocabulary is split (%lld of %lld) but the op has no reduce group",
            (long long)n, (long long)vocab);
    if (group > 1 && n == vocab)
        BAD("a reduce group of %d devices but the vocabulary is whole", group);
    double inv_tokens = 1.0 / (double)ps_tile_global_numel(labels);
    carve c = {0};
    size_t o_mx = carve_take(&c, (size_t)rows * 4), o_se = carve_take(&c, (size_t)rows * 8);
    char *ws;
    PS_RET(ps_cuda_ws_reserve(s, c.used, (void **)&ws, err));
    float *mx = (float *)(ws + o_mx), *se = (float *)(ws + o_se), *lab = se + rows;
    int *bad;
    PS_RET(defer_ids(s, op, PS_CUDA_CHECK_LABEL, vocab, &bad, err));
    unsigned blocks = ps_cuda_row_blocks(rows);
    k_row_max<<<blocks, THREADS, 0, s->stream>>>((const float *)x->data, mx, rows, n);
    PS_CUDA_LAUNCHED(s->loc, "k_row_max");
    PS_RET(ps_cuda_op_reduce(s, op, ctx, mx, rows, PS_REDUCE_OP_MAX, err));
    k_row_sumexp<<<blocks, THREADS, 0, s->stream>>>((const float *)x->data,
                                                    (const int32_t *)labels->data, mx, se,
                                                    grad ? NULL : lab, rows, n, voff, vocab,
                                                    bad);
    PS_CUDA_LAUNCHED(s->loc, "k_row_sumexp");
    /* sums of exponentials and the label logits: one reduction */
    PS_RET(ps_cuda_op_reduce(s, op, ctx, se, grad ? rows : 2 * rows, PS_REDUCE_OP_SUM, err));
    if (grad) {
        k_xent_grad<<<LAUNCH(rows * n)>>>((const float *)x->data, (const int32_t *)labels->data,
                                          mx, se, (float *)out[0].data, rows, n, voff,
                                          (float)(op->attrs.scale * inv_tokens));
        PS_CUDA_LAUNCHED(s->loc, "k_xent_grad");
    } else {
        k_xent_final<<<1, 1024, 0, s->stream>>>(se, mx, lab, rows, inv_tokens,
                                                (float *)out[0].data);
        PS_CUDA_LAUNCHED(s->loc, "k_xent_final");
    }
    return PS_OK;
}

static ps_status run_mse(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                         ps_error *err)
{
    PS_RET(need_numel(s, op, &in[0], &in[1], "the prediction", "the target", err));
    int64_t n = numel(&in[0]);
    double global = (double)ps_tile_global_numel(&in[0]);
    if (op->kind == PS_OP_MSE_LOSS_GRAD) {
        PS_RET(need_numel(s, op, &in[0], &out[0], "the prediction", "the output", err));
        k_mse_grad<<<LAUNCH(n)>>>((const float *)in[0].data, (const float *)in[1].data,
                                  (float *)out[0].data, n,
                                  (float)(2.0 * op->attrs.scale / global));
        PS_CUDA_LAUNCHED(s->loc, "k_mse_grad");
        return PS_OK;
    }
    if (numel(&out[0]) != 1)
        BAD("the loss must be a scalar");
    double *partial;
    PS_RET(ps_cuda_ws_reserve(s, PARTIAL_BLOCKS * sizeof(double), (void **)&partial, err));
    k_mse_partial<<<PARTIAL_BLOCKS, THREADS, 0, s->stream>>>(
        (const float *)in[0].data, (const float *)in[1].data, partial, n);
    PS_CUDA_LAUNCHED(s->loc, "k_mse_partial");
    k_sum_partials<<<1, THREADS, 0, s->stream>>>(partial, PARTIAL_BLOCKS, 1.0 / global,
                                                 (float *)out[0].data);
    PS_CUDA_LAUNCHED(s->loc, "k_sum_partials");
    return PS_OK;
}

static ps_status run_adam(ps_cuda_stream *s, const ps_op *op, const ps_tile *in,
                          const ps_op_context *ctx, ps_error *err)
{
    int64_t n = numel(&in[0]);
    for (int i = 1; i < op->n_in; i++)
        PS_RET(need_numel(s, op, &in[0], &in[i], "the parameter", "a gradient or state", err));
    const ps_op_attrs *a = &op->attrs;
    if (ctx == NULL || ctx->step < 1)
        BAD("the optimizer step must be >= 1, is %d", ctx != NULL ? ctx->step : 0);
    if (!(a->lr > 0) || !(a->beta1 >= 0 && a->beta1 < 1) || !(a->beta2 >= 0 && a->beta2 < 1) ||
        !(a->adam_eps > 0) || !(a->weight_decay >= 0))
        BAD("adam hyper-parameters out of range");
    if (!ps_loss_scale_valid(a->scale))
        BAD("the loss scale %g is outside [2^-24, 2^40]", a->scale);
    int step = ctx->step;
    /* a non-finite gradient leaves the state as it was and fails the run at
     * the stream's next sync (a deferred check: no read-back per update);
     * none after a finite vote, which has looked already */
    int *check = NULL;
    if (!ctx->grads_checked) {
        ps_cuda_check c = {PS_CUDA_CHECK_GRADIENT, op, 0, step, a->scale};
        PS_RET(ps_cuda_check_defer(s, &c, &check, err));
        k_flag_nonfinite<<<LAUNCH(n)>>>((const float *)in[1].data, n, check);
        PS_CUDA_LAUNCHED(s->loc, "k_flag_nonfinite");
    }
    double bc1 = 1.0 - pow(a->beta1, step), bc2 = 1.0 - pow(a->beta2, step);
    k_adam<<<LAUNCH(n)>>>((float *)in[0].data, (const float *)in[1].data, (float *)in[2].data,
                          (float *)in[3].data, op->n_in > 4 ? (float *)in[4].data : NULL, n,
                          (float)a->lr, (float)a->beta1, (float)a->beta2, (float)a->adam_eps,
                          (float)a->weight_decay, (float)bc1, (float)bc2,
                          (float)(1.0 / a->scale), check);
    PS_CUDA_LAUNCHED(s->loc, "k_adam");
    return PS_OK;
}

bool ps_cuda_op_accumulates(ps_op_kind kind, int out, const ps_tile *t)
{
    return kind == PS_OP_MATMUL && out == 0 && !t->is_int && !ps_tile_is_half(t);
}

/* The kinds whose kernels read and write their tiles through elem<T> (and
 * the moves), so that they run on half tiles as they are: elementwise ops,
 * softmax, layernorm and their gradients, reductions and broadcasts,
 * reshape and transpose. */
static bool pointwise_kind(ps_op_kind kind)
{
    switch (kind) {
    case PS_OP_ADD:
    case PS_OP_BIAS_ADD:
    case PS_OP_RELU:
    case PS_OP_GELU:
    case PS_OP_RELU_GRAD:
    case PS_OP_GELU_GRAD:
    case PS_OP_SOFTMAX:
    case PS_OP_SOFTMAX_GRAD:
    case PS_OP_LAYERNORM:
    case PS_OP_LAYERNORM_GRAD:
    case PS_OP_REDUCE:
    case PS_OP_BROADCAST:
    case PS_OP_RESHAPE:
    case PS_OP_TRANSPOSE: return true;
    default: return false;
    }
}

/* A pointwise_kind op on tiles all of element type T (float, __nv_bfloat16
 * or __half; on s's GPU, set by the caller). */
template <typename T>
static ps_status run_pointwise(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                               ps_error *err)
{
    const T *x = (const T *)in[0].data;
    T *y = (T *)out[0].data;
    int64_t n = numel(&in[0]);
    switch (op->kind) {
    case PS_OP_ADD:
        PS_RET(need_numel(s, op, &in[0], &in[1], "input 0", "input 1", err));
        PS_RET(need_numel(s, op, &in[0], &out[0], "input 0", "the output", err));
        k_add<T><<<LAUNCH(n)>>>(x, (const T *)in[1].data, y, n);
        PS_CUDA_LAUNCHED(s->loc, "k_add");
        return PS_OK;
    case PS_OP_BIAS_ADD:
        PS_RET(need_numel(s, op, &in[0], &out[0], "the input", "the output", err));
        if (numel(&in[1]) != last_dim(&in[0]))
            BAD("bias has %lld elements, the input's last dim %lld", (long long)numel(&in[1]),
                (long long)last_dim(&in[0]));
        k_bias_add<T><<<LAUNCH(n)>>>(x, (const T *)in[1].data, y, n, last_dim(&in[0]));
        PS_CUDA_LAUNCHED(s->loc, "k_bias_add");
        return PS_OK;
    case PS_OP_RELU:
    case PS_OP_GELU:
        PS_RET(need_numel(s, op, &in[0], &out[0], "the input", "the output", err));
        if (op->kind == PS_OP_RELU)
            k_relu<T><<<LAUNCH(n)>>>(x, y, n);
        else
            k_gelu<T><<<LAUNCH(n)>>>(x, y, n);
        PS_CUDA_LAUNCHED(s->loc, "k_relu/k_gelu");
        return PS_OK;
    case PS_OP_RELU_GRAD:
    case PS_OP_GELU_GRAD:
        PS_RET(need_numel(s, op, &in[0], &in[1], "input 0", "dy", err));
        PS_RET(need_numel(s, op, &in[0], &out[0], "input 0", "the output", err));
        if (op->kind == PS_OP_RELU_GRAD)
            k_relu_grad<T><<<LAUNCH(n)>>>(x, (const T *)in[1].data, y, n);
        else
            k_gelu_grad<T><<<LAUNCH(n)>>>(x, (const T *)in[1].data, y, n);
        PS_CUDA_LAUNCHED(s->loc, "k_relu_grad/k_gelu_grad");
        return PS_OK;
    case PS_OP_SOFTMAX:
    case PS_OP_SOFTMAX_GRAD: return run_softmax<T>(s, op, in, out, err);
    case PS_OP_LAYERNORM:
    case PS_OP_LAYERNORM_GRAD: return run_layernorm<T>(s, op, in, out, err);
    case PS_OP_REDUCE: return run_reduce<T>(s, op, &in[0], &out[0], err);
    case PS_OP_BROADCAST: return run_broadcast<T>(s, op, &in[0], &out[0], err);
    case PS_OP_RESHAPE:
        PS_RET(need_numel(s, op, &in[0], &out[0], "the input", "the output", err));
        if (out[0].data != in[0].data)
            PS_CUDA_RET(s->loc, cudaMemcpyAsync(out[0].data, in[0].data, (size_t)n * sizeof(T),
                                                cudaMemcpyDeviceToDevice, s->stream));
        return PS_OK;
    case PS_OP_TRANSPOSE: {
        PS_RET(need_numel(s, op, &in[0], &out[0], "the input", "the output", err));
        if (out[0].rank != in[0].rank) /* before the dims: a rank-0 input has none */
            BAD("the output's rank %d is not the input's %d", out[0].rank, in[0].rank);
        bool seen[PS_MAX_RANK] = {false};
        for (int i = 0; i < in[0].rank; i++) {
            int p = op->attrs.perm[i];
            if (p < 0 || p >= in[0].rank || seen[p])
                BAD("perm is not a permutation of 0..%d", in[0].rank - 1);
            seen[p] = true;
            if (out[0].shape[i] != in[0].shape[p])
                BAD("output dim %d is not input dim %d", i, p);
        }
        return ps_cuda_permute(s, in[0].data, in[0].shape, in[0].rank, op->attrs.perm, sizeof(T),
                               out[0].data, err);
    }
    default: return ps_cuda_op_error(s, op, PS_ERR_INTERNAL, err, "not an op run pointwise");
    }
}

/* Whether op runs on its half tiles as they are: a pointwise_kind whose
 * tiles are all floats of one half type. */
static bool runs_on_half(const ps_op *op, const ps_tile *in, const ps_tile *out)
{
    if (!pointwise_kind(op->kind) || !ps_tile_is_half(&in[0]))
        return false;
    for (int i = 0; i < op->n_in + op->n_out; i++) {
        const ps_tile *t = i < op->n_in ? &in[i] : &out[i - op->n_in];
        if (t->is_int || t->dtype != in[0].dtype)
            return false;
    }
    return true;
}

ps_status ps_cuda_op_run(ps_cuda_stream *s, const ps_op *op, const ps_tile *in, ps_tile *out,
                         const ps_op_context *ctx, ps_error *err)
{
    const ps_op_kind_info *info = ps_op_kind_get(op->kind);
    if (info == NULL)
        return ps_error_set(err, PS_ERR_INVALID, "device %d: op \"%s\": unknown kind %d",
                            s->loc.device, op->name ? op->name : "?", (int)op->kind);
    PS_RET(need_io(s, op, info->min_in, info->n_out, err));
    if (op->n_in > info->max_in)
        BAD("takes at most %d inputs, has %d", info->max_in, op->n_in);
    for (int i = 0; i < op->n_in; i++)
        if (in[i].data == NULL)
            BAD("input %d has no data", i);
    for (int i = 0; i < op->n_out; i++)
        if (out[i].data == NULL)
            BAD("output %d has no data", i);
    unsigned add = ctx != NULL ? ctx->accumulate : 0;
    if (add != 0 && (add != 1u || !ps_cuda_op_accumulates(op->kind, 0, &out[0])))
        BAD("cannot add into its outputs 0x%x (only a MATMUL's fp32 output 0x1)", add);
    if (runs_on_half(op, in, out)) { /* (half outputs are never added into) */
        PS_CUDA_RET(s->loc, cudaSetDevice(s->loc.gpu));
        return in[0].dtype == PS_DTYPE_BF16 ? run_pointwise<__nv_bfloat16>(s, op, in, out, err)
                                            : run_pointwise<__half>(s, op, in, out, err);
    }
    /* other half operands are widened into scratch; an fp32 output (the only
     * one added into) keeps its own data there, so the add reaches it */
    for (int i = 0; i < op->n_in + op->n_out; i++)
        if (ps_tile_is_half(i < op->n_in ? &in[i] : &out[i - op->n_in]))
            return ps_cuda_half_op(s, op, in, out, ctx, err);
    PS_CUDA_RET(s->loc, cudaSetDevice(s->loc.gpu));
    switch (op->kind) {
    case PS_OP_MATMUL: return run_matmul(s, op, in, out, add != 0, err);
    case PS_OP_ADD:
    case PS_OP_BIAS_ADD:
    case PS_OP_RELU:
    case PS_OP_GELU:
    case PS_OP_RELU_GRAD:
    case PS_OP_GELU_GRAD: return run_pointwise<float>(s, op, in, out, err);
    case PS_OP_LAYERNORM:
    case PS_OP_LAYERNORM_GRAD: return run_layernorm<float>(s, op, in, out, err);
    case PS_OP_SOFTMAX:
    case PS_OP_SOFTMAX_GRAD: return run_softmax<float>(s, op, in, out, err);
    case PS_OP_EMBEDDING:
    case PS_OP_EMBEDDING_GRAD: return run_embedding(s, op, in, out, err);
    case PS_OP_RESHAPE:
    case PS_OP_TRANSPOSE: return run_pointwise<float>(s, op, in, out, err);
    case PS_OP_REDUCE: return run_reduce<float>(s, op, &in[0], &out[0], err);
    case PS_OP_BROADCAST: return run_broadcast<float>(s, op, &in[0], &out[0], err);
    case PS_OP_MSE_LOSS:
    case PS_OP_MSE_LOSS_GRAD: return run_mse(s, op, in, out, err);
    case PS_OP_SOFTMAX_XENT:
    case PS_OP_SOFTMAX_XENT_GRAD: return run_xent(s, op, in, out, ctx, err);
    case PS_OP_ADAM: return run_adam(s, op, in, ctx, err);
    case PS_OP_CONV2D:
    case PS_OP_CONV2D_GRAD_INPUT:
    case PS_OP_CONV2D_GRAD_FILTER: return ps_cuda_conv_run(s, op, in, out, err);
    case PS_OP_POOL:
    case PS_OP_POOL_GRAD: return ps_cuda_pool_run(s, op, in, out, err);
    case PS_OP_BATCHNORM:
    case PS_OP_BATCHNORM_GRAD: return ps_cuda_batchnorm_run(s, op, in, out, ctx, err);
    case PS_OP_MOE_GATE:
    case PS_OP_MOE_GATE_GRAD:
    case PS_OP_MOE_DISPATCH:
    case PS_OP_MOE_DISPATCH_GRAD:
    case PS_OP_MOE_COMBINE:
    case PS_OP_MOE_COMBINE_GRAD: return ps_cuda_moe_run(s, op, in, out, err);
    default:
        return ps_error_set(err, PS_ERR_UNSUPPORTED,
                            "device %d: op \"%s\": the CUDA backend does not implement %s",
                            s->loc.device, op->name ? op->name : "?", info->name);
    }
}
