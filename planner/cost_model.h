/* The cost model: logical meshes with per-axis link parameters, collective
 * times, compute times and resharding costs.
 *
 * A physical submesh (hosts x devices per host, starting at a host boundary
 * or inside one host) is flattened host-major and reshaped to a logical
 * d0 x d1 mesh, so axis 1 runs over consecutive devices. An axis whose groups
 * stay inside one node uses the intra-node link; one that crosses nodes uses
 * each device's share of its node's NICs. Collectives are rings: with n
 * devices on the axis, bytes B per device, latency a and seconds per byte b,
 *   all-reduce       2(n-1)a + 2(n-1)/n B b
 *   all-gather       (n-1)a + (n-1)/n B b      (B: the gathered size)
 *   reduce-scatter   (n-1)a + (n-1)/n B b      (B: the input size)
 *   all-to-all       (n-1)a + (n-1)/n B b
 * Compute is a roofline: max(FLOPs / (peak * efficiency), bytes / (memory
 * bandwidth * efficiency)), on the slowest device of the mesh.
 *
 * With a measured profile DB (ps_cluster.profile, core/profile_db.h) whose
 * device the mesh's devices are (see ps_mesh_create), a GEMM takes the DB's
 * time for its FLOPs and dtype (still at least the bytes term of the
 * roofline: a lookup by FLOPs does not see a skinny GEMM's memory traffic),
 * a collective on an axis inside a node and a transfer inside a node take
 * the DB's time for their kind, group size and bytes. Whatever the DB does
 * not cover (other ops, dtypes or kinds it lacks, axes across nodes) keeps
 * the analytic model.
 *
 * On a cluster whose devices share cores (shared_cores_per_node), every
 * compute time is that of a device alone times the node's compute share:
 * the steady state of a pipeline with every device busy, an upper bound
 * that the stage DP compares plans by. The chosen plan's schedule
 * (planner/pipeline_time.h) and the simulator share the cores by what
 * actually computes at once. */
#ifndef PS_PLANNER_COST_MODEL_H
#define PS_PLANNER_COST_MODEL_H

#include "core/cluster.h"
#include "core/collective.h"
#include "core/graph.h"
#include "core/profile_db.h"
#include "core/sharding.h"

/* Tunable efficiencies of the analytic model. */
typedef struct ps_cost_params {
    double gemm_efficiency;      /* fraction of peak FLOP/s a GEMM or conv reaches */
    double other_efficiency;     /* fraction of peak FLOP/s for other ops */
    double bandwidth_efficiency; /* fraction of memory bandwidth reached */
} ps_cost_params;

ps_cost_params ps_cost_params_default(void);

typedef struct ps_logical_mesh {
    int shape[PS_MESH_AXES]; /* d0 x d1 */
    int hosts, devices_per_host; /* the physical submesh */
    int n_devices;
    int *devices;            /* [d0 * d1] global device ids, row-major */
    double alpha_s[PS_MESH_AXES];
    double beta_s_per_byte[PS_MESH_AXES];     /* a ring's */
    double a2a_beta_s_per_byte[PS_MESH_AXES]; /* an all-to-all's: every member sends to
                                               * every other at once, so across nodes
                                               * a node's NICs carry each member's
                                               * bytes for the members elsewhere */
    bool crosses_nodes[PS_MESH_AXES];
    int nic_flows[PS_MESH_AXES]; /* an axis across nodes: its rings through the busiest
                                  * NIC, each way, when all its groups run at once */
    double peak_flops[PS_FLOAT_DTYPE_COUNT]; /* slowest device */
    double memory_bandwidth_bytes_per_s;     /* slowest device */
    double memory_bytes;                     /* smallest device */
    /* Compute times are multiplied by it: ps_cluster_compute_share, the
     * slowdown of a device whose node's devices all compute at once on
     * shared cores (1 on GPUs) */
    double compute_share;
    ps_cost_params params;
    const ps_profile_db *profile; /* borrowed from the cluster; NULL: analytic */
} ps_logical_mesh;

/* The submesh of `hosts` x `devices_per_host` devices whose first device is
 * first_device, viewed as d0 x d1 (d0 * d1 = hosts * devices_per_host).
 * The cluster's profile DB, if any, applies when every device of the mesh
 * is of the DB's device kind, or when the cluster has no kind of that name
 * (the DB then describes all of its devices). */
ps_status ps_mesh_create(const ps_cluster *c, int first_device, int hosts, int devices_per_host,
                         int d0, int d1, ps_logical_mesh **out, ps_error *err);
void ps_mesh_free(ps_logical_mesh *m);
/* Whether two meshes cost every op and collective the same: all but their
 * device ids equal (the same shape on the same kind of devices and links). */
bool ps_mesh_costs_equal(const ps_logical_mesh *a, const ps_logical_mesh *b);

/* Time of a collective over the mesh axes in `axes` (bit mask; both axes =
 * hierarchical: axis 1 first, then axis 0 on the reduced share). */
double ps_collective_s(const ps_logical_mesh *m, ps_collective kind, unsigned axes, double bytes);
/* Of that time, the rings on axes that cross nodes: the part that holds the
 * NICs of the mesh's nodes (0 when no axis in `axes` crosses nodes). */
double ps_collective_nic_s(const ps_logical_mesh *m, ps_collective kind, unsigned axes,
                           double bytes);

/* Time of one point-to-point transfer between two devices of cluster c:
 * the intra-node link inside a node (or the profile DB's send-recv time,
 * when it applies to both devices), else the device's share of its node's
 * NICs (the same share a mesh axis across nodes gets). */
double ps_p2p_s(const ps_cluster *c, int from_device, int to_device, double bytes);

/* Whether the cluster's profile DB describes device d (false without one). */
bool ps_profile_applies(const ps_cluster *c, int device);

/* Roofline time of local work of the given dtype. */
double ps_compute_s(const ps_logical_mesh *m, ps_dtype dtype, double flops, double bytes,
                    bool gemm);

/* The time of one op of that kind on its local tiles (flops, and bytes read
 * and written): a non-GEMM kind the mesh's profile DB measured (its "ops"
 * entries) takes the measured time at those bytes; a GEMM whose local shape
 * is known (gemm_shape, else NULL: a MATMUL's, or a convolution's
 * ps_conv_gemm_shape) the DB's time of that shape among the entries of its
 * kind (ps_profile_gemm_op_shape_s), else among the MATMULs
 * (ps_profile_gemm_shape_s), under the same roofline bytes term as
 * ps_compute_s; anything else ps_compute_s. */
double ps_op_compute_s(const ps_logical_mesh *m, ps_op_kind kind, ps_dtype dtype, double flops,
                       double bytes, bool gemm, const ps_gemm_shape *gemm_shape);

/* Cost of turning a tensor laid out as `from` into `to`: per mesh axis, a
 * partial sum is all-reduced or reduce-scattered (or kept, when `to` is
 * partial there too), a split that goes away is all-gathered, a split that
 * moves to another dimension is an all-to-all, a new split is a free slice,
 * and a replica becomes a partial sum for free. INFINITY if `to` does not
 * tile. */
/* The steps of that resharding, in order: kind is a ps_collective over mesh
 * axis 0 or 1 (2: over both, the block permutation) or -1 for a local slice;
 * `to` is the layout after the step, the last one is `to` itself. Returns
 * the number of steps, -1 when `to` does not tile. */
#define PS_RESHARD_MAX_STEPS 6
typedef struct ps_reshard_step {
    int kind;
    int axis;
    ps_sharding_spec to;
    double bytes, seconds;
} ps_reshard_step;
int ps_reshard_plan(const ps_logical_mesh *m, const ps_tensor_desc *t,
                    const ps_sharding_spec *from, const ps_sharding_spec *to,
                    ps_reshard_step steps[PS_RESHARD_MAX_STEPS]);

double ps_reshard_s(const ps_logical_mesh *m, const ps_tensor_desc *t,
                    const ps_sharding_spec *from, const ps_sharding_spec *to);

#endif
