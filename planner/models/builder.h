/* A small fluent layer over ps_graph for writing models: the first failure
 * is kept in the builder and every later call becomes a no-op returning -1,
 * so a model reads as a straight sequence of ops with one check at the end. */
#ifndef PS_PLANNER_MODELS_BUILDER_H
#define PS_PLANNER_MODELS_BUILDER_H

#include "core/graph.h"

typedef struct ps_model_builder {
    ps_graph *g;     /* borrowed */
    ps_error *err;   /* borrowed, may be NULL */
    ps_status st;    /* first failure */
    int layer;       /* layer tag of what is added next */
    ps_dtype dtype;  /* dtype of parameters and activations */
    char prefix[96]; /* prepended to names: "block3." */
} ps_model_builder;

void ps_mb_init(ps_model_builder *b, ps_graph *g, ps_dtype dtype, ps_error *err);
/* Sets the layer tag and the name prefix ("" for none) for what follows. */
void ps_mb_scope(ps_model_builder *b, int layer, const char *prefix);

int ps_mb_input(ps_model_builder *b, const char *name, ps_dtype dtype, int rank,
                const int64_t *shape);
int ps_mb_param(ps_model_builder *b, const char *name, int rank, const int64_t *shape);
/* Adds an op and returns the id of its output `which`. */
int ps_mb_op(ps_model_builder *b, ps_op_kind kind, const char *name, const ps_op_attrs *attrs,
             int n_in, const int *in, int which);

/* Shorthands for the ops models use most. */
int ps_mb_matmul(ps_model_builder *b, const char *name, const char *einsum, int x, int w);
int ps_mb_unary(ps_model_builder *b, ps_op_kind kind, const char *name, int x);
int ps_mb_binary(ps_model_builder *b, ps_op_kind kind, const char *name, int x, int y);
int ps_mb_reshape(ps_model_builder *b, const char *name, int x, int rank, const int64_t *shape);
/* x @ W + bias over the last dim of x: [.., k] -> [.., n]; einsum labels are
 * generated, so x may have any rank. */
int ps_mb_dense(ps_model_builder *b, const char *name, int x, int64_t n, bool bias);
int ps_mb_layernorm(ps_model_builder *b, const char *name, int x);
void ps_mb_boundary(ps_model_builder *b);

#endif
