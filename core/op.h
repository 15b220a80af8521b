/* Operator kinds of the graph IR: their attributes, output-shape inference
 * and nominal cost (FLOPs, bytes). The training-step builder, the cost model
 * and the executors all read the semantics written down here (and in
 * docs/graph-format.md); nothing else decides what an op means. */
#ifndef PS_CORE_OP_H
#define PS_CORE_OP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

#define PS_MAX_RANK 6
#define PS_MAX_OP_IO 6
#define PS_EINSUM_MAX 48

typedef enum ps_op_kind {
    /* forward */
    PS_OP_MATMUL,       /* einsum of two operands: dense, batched matmul, attention */
    PS_OP_BIAS_ADD,     /* x[..., n] + b[n] */
    PS_OP_ADD,          /* x + y, same shape (residual; gradient accumulation) */
    PS_OP_RELU,
    PS_OP_GELU,         /* tanh approximation */
    PS_OP_LAYERNORM,    /* over the last dim: (x, gamma[n], beta[n]) */
    PS_OP_SOFTMAX,      /* over the last dim, after `scale`; optional causal mask */
    PS_OP_EMBEDDING,    /* (table[v, h], ids[...] i32) -> [..., h] */
    PS_OP_CONV2D,       /* NCHW: (x[n,c,h,w], w[o,c,kh,kw]) -> [n,o,h',w'] */
    PS_OP_BATCHNORM,    /* per channel over n,h,w (batch statistics): (x, gamma[c], beta[c]) */
    PS_OP_POOL,         /* max or average pooling over h,w of NCHW */
    PS_OP_RESHAPE,      /* same elements, new shape */
    PS_OP_TRANSPOSE,    /* permutation of dims */
    PS_OP_REDUCE,       /* sum or mean over `axes` (those dims are removed) */
    PS_OP_BROADCAST,    /* inverse of REDUCE: repeat over `axes` (times 1/count for mean) */
    PS_OP_MSE_LOSS,     /* mean((pred - target)^2) -> scalar */
    PS_OP_SOFTMAX_XENT, /* mean over tokens of -log softmax(logits)[label] -> scalar */
    PS_OP_MOE_GATE,     /* logits[g,s,e] -> slot[g,s,k] i32, weight[g,s,k] (top-k, capacity) */
    PS_OP_MOE_DISPATCH, /* (x[g,s,m], slot) -> [e,g,c,m] */
    PS_OP_MOE_COMBINE,  /* (y[e,g,c,m], slot, weight) -> [g,s,m] */
    /* backward */
    PS_OP_RELU_GRAD,          /* (y, dy) -> dx */
    PS_OP_GELU_GRAD,          /* (x, dy) -> dx */
    PS_OP_LAYERNORM_GRAD,     /* (x, gamma, dy) -> dx, dgamma, dbeta */
    PS_OP_SOFTMAX_GRAD,       /* (y, dy) -> dx */
    PS_OP_EMBEDDING_GRAD,     /* (ids, dy) -> dtable[vocab, h] */
    PS_OP_CONV2D_GRAD_INPUT,  /* (dy, w) -> dx  (input shape in `shape`) */
    PS_OP_CONV2D_GRAD_FILTER, /* (x, dy) -> dw  (filter shape in `shape`) */
    PS_OP_BATCHNORM_GRAD,     /* (x, gamma, dy) -> dx, dgamma, dbeta */
    PS_OP_POOL_GRAD,          /* (x, y, dy) -> dx */
    PS_OP_MSE_LOSS_GRAD,      /* (pred, target) -> dpred, for d(loss) = 1 */
    PS_OP_SOFTMAX_XENT_GRAD,  /* (logits, labels) -> dlogits, for d(loss) = 1 */
    PS_OP_MOE_GATE_GRAD,      /* (logits, slot, dweight) -> dlogits */
    PS_OP_MOE_DISPATCH_GRAD,  /* (dd, slot) -> dx[g,s,m] */
    PS_OP_MOE_COMBINE_GRAD,   /* (dz, y, slot, weight) -> dy, dweight */
    /* optimizer */
    PS_OP_ADAM, /* (param, grad, m, v[, master]) updated in place; no outputs */
    PS_OP_KIND_COUNT
} ps_op_kind;

typedef enum ps_reduce_kind { PS_REDUCE_SUM = 0, PS_REDUCE_MEAN = 1 } ps_reduce_kind;
typedef enum ps_pool_kind { PS_POOL_MAX = 0, PS_POOL_AVG = 1 } ps_pool_kind;

/* Attributes; each kind reads only its own (see ps_op_kind_info.attrs). */
typedef struct ps_op_attrs {
    char einsum[PS_EINSUM_MAX]; /* MATMUL: "bsk,kn->bsn" (lowercase labels) */
    double eps;                 /* LAYERNORM, BATCHNORM */
    double scale;               /* SOFTMAX: logits multiplied by scale first;
                                 * *_LOSS_GRAD: the loss scale, d(loss) = scale;
                                 * ADAM: gradients arrive multiplied by it */
    bool causal;                /* SOFTMAX: mask k > q over the last two dims */
    int perm[PS_MAX_RANK];      /* TRANSPOSE: out dim i = in dim perm[i] */
    uint32_t axes;              /* REDUCE/BROADCAST: bit i = dim i of the larger tensor */
    ps_reduce_kind reduce;      /* REDUCE/BROADCAST */
    ps_pool_kind pool;          /* POOL */
    int window[2];              /* POOL: window h, w */
    int stride[2];              /* CONV2D, POOL */
    int pad[2];                 /* CONV2D, POOL: zero padding on each side */
    int top_k;                  /* MOE_GATE */
    int64_t experts, capacity;  /* MOE_GATE, MOE_DISPATCH: e and c */
    int shape_rank;             /* RESHAPE, BROADCAST, *_GRAD with a shape: output shape */
    int64_t shape[PS_MAX_RANK];
    double lr, beta1, beta2, adam_eps, weight_decay; /* ADAM */
} ps_op_attrs;

/* Which attributes a kind reads (bit set), for JSON I/O and docs. */
enum {
    PS_ATTR_EINSUM = 1u << 0,
    PS_ATTR_EPS = 1u << 1,
    PS_ATTR_SCALE = 1u << 2,
    PS_ATTR_CAUSAL = 1u << 3,
    PS_ATTR_PERM = 1u << 4,
    PS_ATTR_AXES = 1u << 5,
    PS_ATTR_REDUCE = 1u << 6,
    PS_ATTR_POOL = 1u << 7,
    PS_ATTR_WINDOW = 1u << 8,
    PS_ATTR_STRIDE = 1u << 9,
    PS_ATTR_PAD = 1u << 10,
    PS_ATTR_TOP_K = 1u << 11,
    PS_ATTR_EXPERTS = 1u << 12,
    PS_ATTR_CAPACITY = 1u << 13,
    PS_ATTR_SHAPE = 1u << 14,
    PS_ATTR_ADAM = 1u << 15,
};

typedef struct ps_op_kind_info {
    const char *name; /* JSON and CLI spelling, e.g. "matmul" */
    int min_in, max_in;
    int n_out;        /* fixed number of outputs */
    unsigned attrs;   /* PS_ATTR_* bits it reads */
    bool forward;     /* may appear in a user's forward graph */
} ps_op_kind_info;

const ps_op_kind_info *ps_op_kind_get(ps_op_kind kind);
/* Returns 0 and sets *out for a known name, -1 otherwise. */
int ps_op_kind_parse(const char *name, ps_op_kind *out);

/* Static loss scaling (fp16 training): the loss gradients seed the backward
 * pass with d(loss) = S instead of 1, so that small gradients stay above
 * fp16's smallest normal, and Adam divides by S again. A power of two makes
 * both steps exact. */
#define PS_LOSS_SCALE_MIN 0x1p-24
#define PS_LOSS_SCALE_MAX 0x1p40
bool ps_loss_scale_valid(double s);
/* The kinds whose attrs.scale is the loss scale: the loss gradients and ADAM. */
bool ps_op_scales_loss(ps_op_kind kind);

/* Attributes with the defaults of a kind (eps 1e-5, scale 1, stride 1, Adam
 * lr 1e-3, betas 0.9/0.999, eps 1e-8, ...). */
ps_op_attrs ps_op_attrs_default(ps_op_kind kind);

/* The type and shape of a tensor, as inference sees it. */
typedef struct ps_tensor_desc {
    ps_dtype dtype;
    int rank;
    int64_t shape[PS_MAX_RANK];
} ps_tensor_desc;

int64_t ps_tensor_desc_numel(const ps_tensor_desc *t);
bool ps_tensor_desc_equal(const ps_tensor_desc *a, const ps_tensor_desc *b);
/* "[2048, 8192] fp32" into buf. */
const char *ps_tensor_desc_str(const ps_tensor_desc *t, char *buf, int cap);

/* Checks the inputs of an op against its kind and attributes and computes
 * its outputs. Messages say what is wrong, without a location (the caller
 * prefixes one). */
ps_status ps_op_infer(ps_op_kind kind, const ps_op_attrs *attrs, const ps_tensor_desc *in,
                      int n_in, ps_tensor_desc *out, int *n_out, ps_error *err);

/* Nominal cost of one op: FLOPs (multiply and add count 2 for a GEMM;
 * elementwise ops count a documented number per element) and bytes read and
 * written, from the shapes alone. */
typedef struct ps_op_cost {
    double flops;
    double bytes_read;
    double bytes_written;
} ps_op_cost;
ps_op_cost ps_op_cost_of(ps_op_kind kind, const ps_op_attrs *attrs, const ps_tensor_desc *in,
                         int n_in, const ps_tensor_desc *out, int n_out);

/* Einsum specs: parsed form shared by inference, cost and autodiff. */
typedef struct ps_einsum {
    int rank[3];              /* operands a, b and output */
    char labels[3][PS_MAX_RANK];
} ps_einsum;
ps_status ps_einsum_parse(const char *spec, ps_einsum *out, ps_error *err);
void ps_einsum_format(const ps_einsum *e, char *buf, int cap);

/* The GEMM an einsum computes, each size the product of its labels' sizes:
 * batch (labels of both inputs and the output), m (the first input's and
 * the output's), n (the second input's and the output's) and k (contracted:
 * both inputs, not the output). 2 batch m n k is its FLOP count. */
typedef struct ps_gemm_shape {
    int64_t m, n, k;
    int64_t batch; /* 0 or 1: a single GEMM */
} ps_gemm_shape;

/* 2 batch m n k (a batch of 0 counts as 1). */
double ps_gemm_shape_flops(const ps_gemm_shape *g);
/* size[c - 'a']: the size of label c (whole, or a tile's local size). */
ps_gemm_shape ps_einsum_gemm_shape(const ps_einsum *e, const int64_t size[26]);
/* The same for a MATMUL's einsum spec over its two operands' descriptions
 * (whole tensors or tiles). */
ps_status ps_matmul_gemm_shape(const char *einsum, const ps_tensor_desc in[2], ps_gemm_shape *out,
                               ps_error *err);
/* The GEMM a convolution of that kind amounts to, from its two inputs and
 * its output (whole tensors or tiles; a partial output's shape is whole),
 * with the image's batch folded into the rows and batch 1:
 *   conv2d              m = N OH OW, n = O,        k = C KH KW
 *   conv2d_grad_input   m = N OH OW, n = C KH KW,  k = O
 *   conv2d_grad_filter  m = O,       n = C KH KW,  k = N OH OW
 * (2 m n k is the op's FLOP count). The key a profile DB times convolutions
 * under: cuDNN's implicit GEMM of the forward, the CPU backend's column
 * GEMMs of each. PS_ERR_INVALID for another kind or operands that are not
 * NCHW. */
ps_status ps_conv_gemm_shape(ps_op_kind kind, const ps_tensor_desc in[2], const ps_tensor_desc *out,
                             ps_gemm_shape *shape, ps_error *err);

#endif
