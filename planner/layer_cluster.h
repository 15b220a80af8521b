/* Layer construction: group a forward graph's ops into the layers that stage
 * construction cuts between.
 *
 * Auto (Alpa's clustering DP): ops in graph order are cut into `layers`
 * consecutive groups whose FLOPs each stay within (1 + eps) * total / layers,
 * minimizing the largest amount of data any group receives from earlier
 * groups, then the total received, then the largest group's FLOPs. Manual:
 * the model's pipeline boundaries (mark_pipeline_boundary) separate layers. */
#ifndef PS_PLANNER_LAYER_CLUSTER_H
#define PS_PLANNER_LAYER_CLUSTER_H

#include "core/graph.h"

typedef struct ps_layering {
    int n_layers;
    int *op_layer;          /* [forward graph's n_ops] new layer of each op */
    double *flops;          /* [n_layers] forward FLOPs per layer */
    double *boundary_bytes; /* [n_layers] activation bytes the layer receives from earlier ones */
    double *cut_bytes;      /* [n_layers] b >= 1: activation bytes made before layer b and read
                             * at or after it, each tensor once (what a stage starting at b
                             * receives, a shortcut past its first layer included) */
    double eps_used;        /* the balance tolerance that was needed */
} ps_layering;

void ps_layering_clear(ps_layering *l);

/* Alpa's clustering DP into n_layers layers (eps: 0.5 in Alpa; doubled up to
 * three times when no split satisfies it). */
ps_status ps_layer_cluster_auto(const ps_graph *fwd, int n_layers, double eps, ps_layering *out,
                                ps_error *err);
/* Layers from the graph's manual pipeline boundaries. */
ps_status ps_layer_cluster_manual(const ps_graph *fwd, ps_layering *out, ps_error *err);

/* A copy of fwd whose ops carry the new layer tags (sources take the layer
 * of their first reader; manual boundaries are dropped: the layers are the
 * units from now on). */
ps_status ps_graph_relayer(const ps_graph *fwd, const ps_layering *l, ps_graph **out,
                           ps_error *err);

#endif
