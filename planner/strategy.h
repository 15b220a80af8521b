/* Sharding strategies of ops and source tensors on a logical mesh.
 *
 * Every op is described by a label signature, the einsum view of its
 * operands: each operand dimension carries a label (or -1: never split), and
 * labels shared between operands must be split alike. A strategy assigns each
 * mesh axis to one label (or to none; both axes to one label splits it d0*d1
 * ways). Its input specs follow from the assignment; an output misses the
 * labels summed away (a matmul's contraction, a loss's tokens), and an axis
 * assigned to such a label leaves the output a partial sum over that axis.
 * MoE dispatch/combine also get expert-parallel strategies, where one axis
 * splits tokens on one side and experts on the other (an all-to-all). Source
 * tensors (inputs, parameters, optimizer state) choose among all specs that
 * tile them. */
#ifndef PS_PLANNER_STRATEGY_H
#define PS_PLANNER_STRATEGY_H

#include "core/graph.h"
#include "core/sharding.h"
#include "planner/cost_model.h"

#define PS_MAX_LABELS 16
#define PS_LABEL_NONE (-1)
/* Assignment meaning "expert-parallel": split experts on the expert side and
 * groups on the token side of an MoE op. */
#define PS_LABEL_A2A (-2)

typedef struct ps_op_signature {
    int n_labels;
    int64_t size[PS_MAX_LABELS];
    bool splittable[PS_MAX_LABELS];
    bool batch[PS_MAX_LABELS];
    /* split without leaving a partial sum: the op reduces it internally with
     * a small all-reduce (vocab-parallel cross-entropy, synchronized
     * batch-norm statistics) */
    bool internal_reduce[PS_MAX_LABELS];
    int n_in, n_out;
    int in_rank[PS_MAX_OP_IO], out_rank[PS_MAX_OP_IO];
    signed char in[PS_MAX_OP_IO][PS_MAX_RANK];
    signed char out[PS_MAX_OP_IO][PS_MAX_RANK];
    int expert_label, group_label; /* MoE ops: labels of e and g, else -1 */
} ps_op_signature;

/* Which dimension of every tensor is the batch dimension (bit d of
 * mask[t]), propagated from dimension 0 of the inputs through the ops. */
ps_status ps_batch_dims(const ps_graph *g, unsigned char **mask_out, ps_error *err);

ps_status ps_op_signature_of(const ps_graph *g, int op, const unsigned char *batch_mask,
                             ps_op_signature *out, ps_error *err);

typedef struct ps_strategy {
    char name[40];      /* the assignment, e.g. "b@0 n@1", "R", "a2a@0" */
    int assign[PS_MESH_AXES]; /* label per axis, PS_LABEL_NONE or PS_LABEL_A2A */
    ps_sharding_spec in[PS_MAX_OP_IO], out[PS_MAX_OP_IO];
    double compute_s;   /* local work */
    double comm_s;      /* collectives inside the op */
    ps_collective comm_kind;
    unsigned comm_axes;
    double comm_bytes;
} ps_strategy;

typedef struct ps_strategy_options {
    /* On a mesh with d0 > 1, ops with a batch dimension put it on axis 0
     * (Alpa's default for 2-D meshes: axis 0 is data parallel). */
    bool force_batch_axis0;
    /* Per tensor: its consumers take partial sums (all in the update, or
     * gradient sums feeding it), so the producer need not reduce. NULL:
     * every partial output is reduced inside its op. */
    const unsigned char *keep_partial;
} ps_strategy_options;

/* All strategies of an op on mesh m (at least one: replicated). Caller frees
 * *out. */
ps_status ps_op_strategies(const ps_graph *g, int op, const ps_op_signature *sig,
                           const ps_logical_mesh *m, const ps_strategy_options *o,
                           ps_strategy **out, int *n_out, ps_error *err);

/* All specs that tile source tensor t on mesh m (replicated first). */
ps_status ps_source_specs(const ps_graph *g, int t, const ps_logical_mesh *m,
                          ps_sharding_spec **out, int *n_out, ps_error *err);

#endif
