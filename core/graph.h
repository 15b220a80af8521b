/* Graph IR: a training step (or its forward half) as a DAG of ops over
 * tensors.
 *
 * Tensors and ops are numbered by their position in the graph's arrays; ops
 * are always kept in a topological order (every input of op i is a source or
 * the output of an op before i), so one forward walk over `ops` is a valid
 * schedule. Every op carries a layer tag (0..n_layers-1) that layer
 * clustering, stage construction and remat read, and a pass (forward,
 * recompute, backward, update). The graph owns all of its memory. */
#ifndef PS_CORE_GRAPH_H
#define PS_CORE_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "core/op.h"

typedef enum ps_tensor_kind {
    PS_TENSOR_INPUT = 0,      /* data fed per micro-batch (tokens, images, labels) */
    PS_TENSOR_PARAM = 1,      /* trained weight */
    PS_TENSOR_ACTIVATION = 2, /* produced by a forward or recompute op */
    PS_TENSOR_GRADIENT = 3,   /* produced by a backward op */
    PS_TENSOR_OPT_STATE = 4,  /* optimizer state (Adam m, v, fp32 master weights) */
    PS_TENSOR_KIND_COUNT
} ps_tensor_kind;

typedef enum ps_pass {
    PS_PASS_FORWARD = 0,
    PS_PASS_RECOMPUTE = 1, /* forward op replayed before the backward (remat) */
    PS_PASS_BACKWARD = 2,
    PS_PASS_UPDATE = 3, /* optimizer, once per step after the last micro-batch */
    PS_PASS_COUNT
} ps_pass;

extern const char *const ps_tensor_kind_names[PS_TENSOR_KIND_COUNT];
extern const char *const ps_pass_names[PS_PASS_COUNT];

typedef struct ps_tensor {
    char *name;
    ps_tensor_kind kind;
    ps_tensor_desc desc; /* dtype, rank, shape */
    int layer;           /* layer tag (of the producer, or where a source is used first) */
    int producer;        /* op id, -1 for sources (inputs, params, optimizer state) */
    int grad_of;         /* GRADIENT: the tensor it is the gradient of; else -1 */
    int state_of;        /* OPT_STATE: the parameter it belongs to; else -1 */
} ps_tensor;

typedef struct ps_op {
    char *name;
    ps_op_kind kind;
    ps_pass pass;
    int layer;
    /* The layer tag the op was added with (a model's block), kept when the
     * graph is re-layered (clustered layers), sliced or differentiated: the
     * intra-op pass ties identical blocks inside one clustered layer. */
    int block;
    int forward_op; /* RECOMPUTE/BACKWARD: the forward op it derives from; else -1 */
    int n_in, n_out;
    int in[PS_MAX_OP_IO];
    int out[PS_MAX_OP_IO];
    ps_op_attrs attrs;
    ps_op_cost cost; /* derived from shapes when the op is added */
} ps_op;

typedef struct ps_graph {
    char *name;
    int n_tensors, n_ops;
    ps_tensor *tensors;
    ps_op *ops;
    int n_layers;      /* layer tags are 0..n_layers-1 */
    int n_boundaries;  /* manual pipeline boundaries (mark_pipeline_boundary) */
    int *boundaries;   /* sorted layer tags b: a boundary falls after layer b */
    int loss;          /* the scalar loss tensor, -1 if none */
    int cap_tensors, cap_ops, cap_boundaries;
} ps_graph;

ps_status ps_graph_create(const char *name, ps_graph **out);
void ps_graph_free(ps_graph *g);
ps_status ps_graph_clone(const ps_graph *g, ps_graph **out);

/* Adds a source tensor (input, parameter or optimizer state). */
ps_status ps_graph_add_source(ps_graph *g, const char *name, ps_tensor_kind kind,
                              const ps_tensor_desc *desc, int layer, int *id_out, ps_error *err);

/* What an op is, before it is added. */
typedef struct ps_op_def {
    ps_op_kind kind;
    const char *name;
    int layer;
    ps_pass pass;
    int forward_op; /* -1 unless RECOMPUTE/BACKWARD */
    int n_in;
    int in[PS_MAX_OP_IO];
    ps_op_attrs attrs;
} ps_op_def;

/* Adds an op after checking its inputs (which must already exist, so that
 * the order stays topological) and creates its output tensors with the
 * inferred shapes, kind ACTIVATION (GRADIENT for backward ops, with grad_of
 * set by the caller) and names "<op>" or "<op>:<i>". */
ps_status ps_graph_add_op(ps_graph *g, const ps_op_def *def, int *op_id_out, ps_error *err);

/* Adds a manual pipeline boundary after layer tag `layer`. */
ps_status ps_graph_add_boundary(ps_graph *g, int layer, ps_error *err);
/* Layer tags become 0..max tag; call after the last op is added. */
void ps_graph_update_layers(ps_graph *g);

/* Renames a tensor (the builder's outputs get generated names). */
ps_status ps_graph_rename_tensor(ps_graph *g, int tensor, const char *name);

/* The part of g whose ops carry layer tags lo..hi (every pass), as a graph
 * of its own: tensors produced outside it (activations sent by an earlier
 * stage, gradients sent back by a later one) become INPUT sources there; the
 * loss stays the loss if it is produced inside. Ops keep their order. */
ps_status ps_graph_slice(const ps_graph *g, int lo, int hi, ps_graph **out, ps_error *err);

/* The tensor numbering ps_graph_slice(g, lo, hi) gives: slice_of[t] is g's
 * tensor t's id in the slice, -1 where the slice has no such tensor
 * (slice_of holds g->n_tensors entries). Returns the slice's tensor count. */
int ps_graph_slice_numbering(const ps_graph *g, int lo, int hi, int *slice_of);

/* Looks a tensor up by name; -1 when absent. Linear: for loaders and tests. */
int ps_graph_find_tensor(const ps_graph *g, const char *name);

/* Whole-graph invariants: ids in range, producers consistent, topological
 * order, shapes re-inferred, loss scalar. PS_ERR_INTERNAL on a violation. */
ps_status ps_graph_check(const ps_graph *g, ps_error *err);

double ps_tensor_bytes(const ps_tensor *t);
int64_t ps_tensor_numel(const ps_tensor *t);
/* The micro-batch a graph was built for, as a graph file says it: the
 * leading dimension of its first input of rank > 0; 0 when it has none. */
int64_t ps_graph_batch(const ps_graph *g);
/* The model's compute dtype: its first parameter's; `fallback` when it has
 * none. */
ps_dtype ps_graph_param_dtype(const ps_graph *g, ps_dtype fallback);

/* Aggregates that `pipeshard graph` reports. */
typedef struct ps_graph_stats {
    int64_t params;                        /* elements of PARAM tensors */
    double weight_bytes;                   /* bytes of PARAM tensors */
    double gradient_bytes;                 /* bytes of the gradients the update reads */
    double optimizer_bytes;                /* bytes of OPT_STATE tensors */
    double activation_bytes;               /* tensors kept from forward for backward */
    double flops[PS_PASS_COUNT];           /* per pass */
    double flops_total;
    int ops[PS_PASS_COUNT];
} ps_graph_stats;
ps_status ps_graph_stats_compute(const ps_graph *g, ps_graph_stats *out);

/* Forward graph files (docs/graph-format.md). Loading checks everything a
 * user can get wrong and reports FILE:LINE:COL; saving writes the forward
 * part of g (ops of the forward pass and the tensors they touch). */
struct ps_jv;
ps_status ps_graph_load(const char *path, ps_graph **out, ps_error *err);
/* The same from text held in memory; name is used in messages. */
ps_status ps_graph_parse(const char *name, const char *text, ps_graph **out, ps_error *err);
ps_status ps_graph_from_json(const struct ps_jv *root, ps_graph **out, ps_error *err);
ps_status ps_graph_to_json(const ps_graph *g, json_t **out);
ps_status ps_graph_save(const ps_graph *g, const char *path, ps_error *err);

#endif
