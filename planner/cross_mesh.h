/* Cross-mesh resharding: the tile-level transfers that move one tensor from
 * the layout a producing stage keeps it in to the layout a consuming stage
 * reads, on other devices. The lowering emits them as sends and receives;
 * the inter-op pass prices them to predict the pipeline's iteration.
 *
 * Every receiving device gets the part of its tile that each distinct source
 * tile holds, from one of that tile's replicas (spread over the replicas by
 * receiver). With local all-gather (Alpa's variant), receivers that hold the
 * same tile (they differ only along the mesh axes the tile is replicated
 * over) split each part into chunks, take one chunk each and all-gather the
 * part among themselves: the slow link carries every byte once. Where the
 * group's tile is made of equal parts, as many as its members or a multiple
 * (a tile every stage replicates, made of the producer's many tiles), member
 * k takes parts k, k + n, ... whole instead and the group all-gathers all
 * of them at once: the same bytes on every link, n times fewer transfers
 * and one all-gather instead of one per part. */
#ifndef PS_PLANNER_CROSS_MESH_H
#define PS_PLANNER_CROSS_MESH_H

#include "core/program.h"
#include "planner/cost_model.h"

typedef struct ps_cross_xfer {
    int src, dst;          /* global device ids */
    ps_region region;      /* the part moved, in full-tensor coordinates */
    int chunk, chunks;     /* the chunk of the region moved (chunks 1: all of it) */
    int group;             /* the receivers that all-gather the region (index into
                            * ps_cross_plan groups), -1 without local all-gather */
    int part;              /* whole parts: the region is the group's part `part`
                            * (chunks 1); else -1 */
    double bytes, seconds; /* this transfer's bytes and predicted time */
    double gather_bytes;   /* chunks > 1: the region's bytes, all-gathered in group;
                            * whole parts: on the receiver's first part, the bytes of
                            * all the group's parts (its tile), gathered at once */
    double gather_seconds;
} ps_cross_xfer;

typedef struct ps_cross_plan {
    int n_xfers;
    ps_cross_xfer *xfers; /* receiver by receiver, sources in mesh order */
    int n_groups;
    int *group_start;     /* [n_groups + 1] into group_devices */
    int *group_devices;   /* global ids */
    int *part_start;      /* [n_groups + 1] into parts: a group whose members take
                           * whole parts lists them all, in order; member k (in
                           * group order) receives parts k, k + n, ...; a chunked
                           * group lists none */
    ps_region *parts;
} ps_cross_plan;

/* The transfers of a tensor described by d from `from` (not a partial sum)
 * on the devices from_devices of a from_mesh[0] x from_mesh[1] mesh to `to`
 * (not partial) on the logical mesh to_mesh (its devices, shape and
 * collective costs). out must be zeroed or cleared. */
ps_status ps_cross_mesh_plan(const ps_cluster *c, const ps_tensor_desc *d,
                             const ps_sharding_spec *from, const int *from_devices,
                             const int from_mesh[2], const ps_sharding_spec *to,
                             const ps_logical_mesh *to_mesh, bool local_allgather,
                             ps_cross_plan *out, ps_error *err);
void ps_cross_plan_clear(ps_cross_plan *p);

/* Predicted time of the whole move on cluster c when nothing else shares
 * the links. A device takes its transfers one after the other (a receiver
 * then its all-gathers), each alone on its route; the devices of a node
 * share its NICs. The slowest device or NIC decides. */
double ps_cross_plan_seconds(const ps_cross_plan *p, const ps_cluster *c);

#endif
