#include "planner/cost_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

ps_cost_params ps_cost_params_default(void)
{
    /* GEMMs on tensor cores reach well below peak in training (Megatron-LM
     * reports 45-55% end to end); elementwise ops are bandwidth-bound. */
    return (ps_cost_params){.gemm_efficiency = 0.6, .other_efficiency = 0.3,
                            .bandwidth_efficiency = 0.8};
}

/* A device's share of its node's NICs when `active` devices use them. */
static double nic_share_bytes_per_s(const ps_cluster *c, int active)
{
    return c->inter.nics_per_node * c->inter.nic_bandwidth_bytes_per_s / (double)active;
}

bool ps_profile_applies(const ps_cluster *c, int device)
{
    if (c->profile == NULL)
        return false;
    int k = ps_cluster_find_kind(c, c->profile->device);
    return k < 0 || c->device_kind[device] == k;
}

double ps_p2p_s(const ps_cluster *c, int from_device, int to_device, double bytes)
{
    int dpn = c->devices_per_node;
    if (from_device / dpn == to_device / dpn) {
        if (ps_profile_applies(c, from_device) && ps_profile_applies(c, to_device)) {
            double s = ps_profile_collective_s(c->profile, PS_PROFILE_SEND_RECV, 2, bytes);
            if (s >= 0)
                return s;
        }
        return c->intra.latency_s + bytes / c->intra.bandwidth_bytes_per_s;
    }
    double bw = fmin(nic_share_bytes_per_s(c, dpn), c->intra.bandwidth_bytes_per_s);
    return c->inter.latency_s + bytes / bw;
}

/* What a mesh axis's collectives put through each node's NICs (each way)
 * when every group of the axis runs one at once, the most on any node:
 * - *flows: rings. A group spanning nodes enters and leaves each of its
 *   nodes once (its members there are consecutive in ring order), so a node
 *   carries one flow per such group with members on it; 0 when no group of
 *   the axis leaves its node.
 * - *a2a_share: all-to-alls, bytes per byte of a member's input. A member
 *   sends 1/n of it to each of the n - 1 others, so (n - here)/n of it to
 *   the members on other nodes.
 * One pass over the mesh's devices (planning calls this for every stage
 * mesh of clusters of thousands of devices). */
static ps_status axis_nic_load(int first_device, int dpn, int d0, int d1, int axis, int *flows,
                               double *a2a_share)
{
    int n_groups = axis == 0 ? d1 : d0, members = axis == 0 ? d0 : d1;
    int first_node = first_device / dpn, last_node = (first_device + d0 * d1 - 1) / dpn;
    int n_nodes = last_node - first_node + 1;
    int *node_flows = calloc((size_t)n_nodes, sizeof *node_flows);
    double *node_share = calloc((size_t)n_nodes, sizeof *node_share);
    if (node_flows == NULL || node_share == NULL) {
        free(node_flows);
        free(node_share);
        return PS_ERR_NOMEM;
    }
    for (int g = 0; g < n_groups; g++) {
        /* a group's members run in device order, so its nodes too: one run
         * of members per node */
        int first = axis == 0 ? g : g * d1, stride = axis == 0 ? d1 : 1;
        bool spans = (first_device + first) / dpn !=
                     (first_device + first + (members - 1) * stride) / dpn;
        if (!spans)
            continue;
        for (int j = 0; j < members;) {
            int node = (first_device + first + j * stride) / dpn, here = 0;
            for (; j < members && (first_device + first + j * stride) / dpn == node; j++)
                here++;
            node_flows[node - first_node]++;
            node_share[node - first_node] += (double)here * (members - here) / members;
        }
    }
    *flows = 0;
    *a2a_share = 0;
    for (int k = 0; k < n_nodes; k++) {
        *flows = node_flows[k] > *flows ? node_flows[k] : *flows;
        *a2a_share = fmax(*a2a_share, node_share[k]);
    }
    free(node_flows);
    free(node_share);
    return PS_OK;
}

ps_status ps_mesh_create(const ps_cluster *c, int first_device, int hosts, int devices_per_host,
                         int d0, int d1, ps_logical_mesh **out, ps_error *err)
{
    *out = NULL;
    int dpn = c->devices_per_node;
    if (hosts < 1 || devices_per_host < 1 || d0 < 1 || d1 < 1 ||
        (int64_t)d0 * d1 != (int64_t)hosts * devices_per_host)
        return ps_error_set(err, PS_ERR_INVALID,
                            "logical mesh %d x %d does not reshape a %d x %d submesh", d0, d1,
                            hosts, devices_per_host);
    if (devices_per_host > dpn || (hosts > 1 && devices_per_host != dpn))
        return ps_error_set(err, PS_ERR_INVALID,
                            "submesh %d x %d: a submesh spans whole nodes or part of one node "
                            "(%d devices per node)",
                            hosts, devices_per_host, dpn);
    int n_dev = ps_cluster_device_count(c);
    if (first_device < 0 || first_device + hosts * devices_per_host > n_dev ||
        (hosts > 1 && first_device % dpn != 0) ||
        (hosts == 1 && first_device % dpn + devices_per_host > dpn))
        return ps_error_set(err, PS_ERR_INVALID,
                            "submesh %d x %d at device %d does not fit the cluster's nodes",
                            hosts, devices_per_host, first_device);
    ps_logical_mesh *m = calloc(1, sizeof *m);
    if (m == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    m->devices = malloc((size_t)(d0 * d1) * sizeof *m->devices);
    if (m->devices == NULL) {
        free(m);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    m->shape[0] = d0;
    m->shape[1] = d1;
    m->hosts = hosts;
    m->devices_per_host = devices_per_host;
    m->n_devices = d0 * d1;
    m->params = ps_cost_params_default();
    for (int t = 0; t < PS_FLOAT_DTYPE_COUNT; t++)
        m->peak_flops[t] = INFINITY;
    m->memory_bandwidth_bytes_per_s = INFINITY;
    m->memory_bytes = INFINITY;
    m->profile = c->profile;
    m->compute_share = ps_cluster_compute_share(c);
    for (int i = 0; i < m->n_devices; i++) {
        m->devices[i] = first_device + i;
        if (!ps_profile_applies(c, m->devices[i]))
            m->profile = NULL;
        const ps_device_kind *k = ps_cluster_device(c, m->devices[i]);
        for (int t = 0; t < PS_FLOAT_DTYPE_COUNT; t++)
            m->peak_flops[t] = fmin(m->peak_flops[t], k->peak_flops[t]);
        m->memory_bandwidth_bytes_per_s =
            fmin(m->memory_bandwidth_bytes_per_s, k->memory_bandwidth_bytes_per_s);
        m->memory_bytes = fmin(m->memory_bytes, k->memory_bytes);
    }
    /* Axis 1 groups are d1 consecutive devices; axis 0 groups are strided by
     * d1. An axis crosses nodes when one of its groups does; its rings then
     * share each NIC with the others' that cross it (a flat ring of a whole
     * node's devices crosses it once, not once per device). */
    for (int a = 0; a < PS_MESH_AXES; a++) {
        int flows = 0;
        double a2a_share = 0;
        if (hosts > 1 &&
            axis_nic_load(first_device, dpn, d0, d1, a, &flows, &a2a_share) != PS_OK) {
            ps_mesh_free(m);
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        }
        m->crosses_nodes[a] = flows > 0 && m->shape[a] > 1;
        m->nic_flows[a] = m->crosses_nodes[a] ? flows : 0;
        if (m->crosses_nodes[a]) {
            m->alpha_s[a] = c->inter.latency_s;
            m->beta_s_per_byte[a] =
                1.0 / fmin(nic_share_bytes_per_s(c, flows), c->intra.bandwidth_bytes_per_s);
            /* the slower of the node's NICs and the member's own port, per
             * byte of the (n - 1)/n the ring formula moves */
            double n = m->shape[a], frac = (n - 1) / n;
            m->a2a_beta_s_per_byte[a] = fmax(a2a_share / nic_share_bytes_per_s(c, 1),
                                             frac / c->intra.bandwidth_bytes_per_s) /
                                        frac;
        } else {
            m->alpha_s[a] = c->intra.latency_s;
            m->beta_s_per_byte[a] = 1.0 / c->intra.bandwidth_bytes_per_s;
            m->a2a_beta_s_per_byte[a] = m->beta_s_per_byte[a];
        }
    }
    *out = m;
    return PS_OK;
}

void ps_mesh_free(ps_logical_mesh *m)
{
    if (m == NULL)
        return;
    free(m->devices);
    free(m);
}

bool ps_mesh_costs_equal(const ps_logical_mesh *a, const ps_logical_mesh *b)
{
    if (a->hosts != b->hosts || a->devices_per_host != b->devices_per_host ||
        a->n_devices != b->n_devices || a->profile != b->profile ||
        a->memory_bandwidth_bytes_per_s != b->memory_bandwidth_bytes_per_s ||
        a->memory_bytes != b->memory_bytes || a->compute_share != b->compute_share ||
        a->params.gemm_efficiency != b->params.gemm_efficiency ||
        a->params.other_efficiency != b->params.other_efficiency ||
        a->params.bandwidth_efficiency != b->params.bandwidth_efficiency)
        return false;
    for (int x = 0; x < PS_MESH_AXES; x++)
        if (a->shape[x] != b->shape[x] || a->alpha_s[x] != b->alpha_s[x] ||
            a->beta_s_per_byte[x] != b->beta_s_per_byte[x] ||
            a->a2a_beta_s_per_byte[x] != b->a2a_beta_s_per_byte[x] ||
            a->crosses_nodes[x] != b->crosses_nodes[x] || a->nic_flows[x] != b->nic_flows[x])
            return false;
    for (int t = 0; t < PS_FLOAT_DTYPE_COUNT; t++)
        if (a->peak_flops[t] != b->peak_flops[t])
            return false;
    return true;
}

static double ring_s(const ps_logical_mesh *m, ps_collective kind, int axis, double bytes)
{
    int n = m->shape[axis];
    if (n <= 1 || bytes <= 0)
        return 0;
    if (m->profile != NULL && !m->crosses_nodes[axis]) {
        double s = ps_profile_collective_s(m->profile, (ps_profile_comm)kind, n, bytes);
        if (s >= 0)
            return s;
    }
    double a = m->alpha_s[axis];
    double b = kind == PS_COLL_ALL_TO_ALL ? m->a2a_beta_s_per_byte[axis] : m->beta_s_per_byte[axis];
    double steps = n - 1, frac = (double)(n - 1) / n;
    if (kind == PS_COLL_ALL_REDUCE)
        return 2 * steps * a + 2 * frac * bytes * b;
    return steps * a + frac * bytes * b;
}

/* ps_collective_s counting only the rings on the axes in `counted` (a bit
 * mask). */
static double collective_on(const ps_logical_mesh *m, ps_collective kind, unsigned axes,
                            double bytes, unsigned counted)
{
    if (axes == 1 || axes == 2) {
        int axis = axes == 1 ? 0 : 1;
        return counted & axes ? ring_s(m, kind, axis, bytes) : 0;
    }
    if (axes != 3)
        return 0;
    /* hierarchical over both axes: inner axis 1 on the full size, then axis 0
     * on what is left per device (summed in this order) */
    double d1 = m->shape[1];
    bool c0 = counted & 1u, c1 = counted & 2u;
    switch (kind) {
    case PS_COLL_ALL_REDUCE:
        return (c1 ? ring_s(m, PS_COLL_REDUCE_SCATTER, 1, bytes) : 0) +
               (c0 ? ring_s(m, PS_COLL_ALL_REDUCE, 0, bytes / d1) : 0) +
               (c1 ? ring_s(m, PS_COLL_ALL_GATHER, 1, bytes) : 0);
    case PS_COLL_ALL_GATHER: /* bytes: the gathered size */
        return (c0 ? ring_s(m, kind, 0, bytes / d1) : 0) + (c1 ? ring_s(m, kind, 1, bytes) : 0);
    case PS_COLL_REDUCE_SCATTER: /* bytes: the input size */
        return (c1 ? ring_s(m, kind, 1, bytes) : 0) + (c0 ? ring_s(m, kind, 0, bytes / d1) : 0);
    case PS_COLL_ALL_TO_ALL:
        return (c1 ? ring_s(m, kind, 1, bytes) : 0) + (c0 ? ring_s(m, kind, 0, bytes) : 0);
    case PS_COLL_COUNT: break;
    }
    return 0;
}

double ps_collective_s(const ps_logical_mesh *m, ps_collective kind, unsigned axes, double bytes)
{
    return collective_on(m, kind, axes, bytes, 3u);
}

double ps_collective_nic_s(const ps_logical_mesh *m, ps_collective kind, unsigned axes,
                           double bytes)
{
    unsigned crossing = (m->crosses_nodes[0] ? 1u : 0) | (m->crosses_nodes[1] ? 2u : 0);
    return crossing ? collective_on(m, kind, axes, bytes, crossing) : 0;
}

/* The roofline of ps_compute_s; a GEMM's time from the DB when it has one:
 * by shape when known (a convolution's among the DB's convolutions of its
 * kind, else among its GEMMs), else by FLOPs. */
static double compute_s(const ps_logical_mesh *m, ps_op_kind kind, ps_dtype dtype, double flops,
                        double bytes, bool gemm, const ps_gemm_shape *shape)
{
    int t = dtype < PS_FLOAT_DTYPE_COUNT ? (int)dtype : PS_DTYPE_F32;
    double peak = m->peak_flops[t];
    if (!(peak > 0)) /* the device lacks this dtype: it computes in fp32 */
        peak = m->peak_flops[PS_DTYPE_F32];
    double eff = gemm ? m->params.gemm_efficiency : m->params.other_efficiency;
    double t_flops = flops / (peak * eff);
    double t_bytes = bytes / (m->memory_bandwidth_bytes_per_s * m->params.bandwidth_efficiency);
    if (gemm && m->profile != NULL) {
        double s = -1;
        if (shape != NULL && kind != PS_OP_MATMUL && ps_profile_gemm_kind(kind))
            s = ps_profile_gemm_op_shape_s(m->profile, kind, (ps_dtype)t, shape);
        if (s < 0)
            s = shape != NULL ? ps_profile_gemm_shape_s(m->profile, (ps_dtype)t, shape)
                              : ps_profile_gemm_s(m->profile, (ps_dtype)t, flops);
        if (s >= 0)
            t_flops = s;
    }
    return fmax(t_flops, t_bytes) * m->compute_share;
}

double ps_compute_s(const ps_logical_mesh *m, ps_dtype dtype, double flops, double bytes,
                    bool gemm)
{
    return compute_s(m, PS_OP_MATMUL, dtype, flops, bytes, gemm, NULL);
}

double ps_op_compute_s(const ps_logical_mesh *m, ps_op_kind kind, ps_dtype dtype, double flops,
                       double bytes, bool gemm, const ps_gemm_shape *gemm_shape)
{
    if (!gemm && m->profile != NULL) {
        double s = ps_profile_op_s(m->profile, kind, bytes);
        if (s >= 0)
            return s * m->compute_share;
    }
    return compute_s(m, kind, dtype, flops, bytes, gemm, gemm ? gemm_shape : NULL);
}

/* A dimension split over both axes holds block i0 * d1 + i1 (axis 0 major).
 * Two changes of a dimension's split leave blocks that no spec describes:
 * taking axis 0 out of an S01 split (device (i0, i1) is left with the strided
 * blocks i1, d1 + i1, ...), and putting axis 0 under an existing axis-1
 * split (block i1 * d0 + i0). A resharding plan avoids both. */
static bool split_change_ok(uint8_t before, uint8_t after)
{
    if (before == 3 && !(after & 1u))
        return false;
    if (before == 2 && after == 3)
        return false;
    return true;
}

typedef struct reshard_walk {
    ps_reshard_step *steps;
    int n;
    bool ok;
    ps_sharding_spec cur;
    const ps_logical_mesh *m;
    const ps_tensor_desc *t;
} reshard_walk;

static void walk_step(reshard_walk *w, int kind, int axis, const ps_sharding_spec *next,
                      double bytes)
{
    for (int d = 0; d < w->t->rank; d++)
        if (!split_change_ok(w->cur.dim_axes[d], next->dim_axes[d]))
            w->ok = false;
    if (w->n >= PS_RESHARD_MAX_STEPS) {
        w->ok = false;
        return;
    }
    ps_reshard_step *s = &w->steps[w->n++];
    *s = (ps_reshard_step){.kind = kind, .axis = axis, .to = *next, .bytes = bytes};
    s->seconds = kind < 0 ? 0
                          : ps_collective_s(w->m, (ps_collective)kind,
                                            axis == 2 ? 3u : 1u << axis, bytes);
    w->cur = *next;
}

/* Gathers axis a out of dimension d (an all-gather over a). */
static void walk_gather(reshard_walk *w, int d, int a)
{
    double local = ps_spec_tile_bytes(&w->cur, w->t, w->m->shape);
    ps_sharding_spec next = w->cur;
    next.dim_axes[d] &= (uint8_t)~(1u << a);
    walk_step(w, PS_COLL_ALL_GATHER, a, &next, local * w->m->shape[a]);
}

/* The axis-by-axis walk from `from` to `to`, axes in the order given. */
static void walk_axes(reshard_walk *w, const ps_sharding_spec *to, const int order[2])
{
    const ps_logical_mesh *m = w->m;
    /* an S01 dimension that must lose axis 0, or an axis-1 split that must
     * get axis 0 under it: gather axis 1 out first */
    for (int d = 0; d < w->t->rank && m->shape[0] > 1 && m->shape[1] > 1; d++) {
        uint8_t c = w->cur.dim_axes[d], want = to->dim_axes[d];
        if ((c == 3 && !(want & 1u)) || (c == 2 && want == 3))
            walk_gather(w, d, 1);
    }
    for (int i = 0; i < PS_MESH_AXES; i++) {
        int a = order[i];
        unsigned bit = 1u << a;
        if (m->shape[a] == 1)
            continue;
        ps_sharding_spec next = w->cur;
        int src = ps_spec_dim_of_axis(&w->cur, a), dst = ps_spec_dim_of_axis(to, a);
        double local = ps_spec_tile_bytes(&w->cur, w->t, m->shape);
        if (to->partial & bit) {
            /* a partial sum is wanted: a replica becomes one free of charge
             * (one device keeps the value, the others zeros) */
            if (w->cur.partial & bit)
                continue;
            if (src >= 0)
                walk_gather(w, src, a);
            next = w->cur;
            next.partial |= (uint8_t)bit;
            walk_step(w, -1, a, &next, 0);
        } else if (w->cur.partial & bit) {
            next.partial &= (uint8_t)~bit;
            if (dst >= 0) {
                next.dim_axes[dst] |= (uint8_t)bit;
                walk_step(w, PS_COLL_REDUCE_SCATTER, a, &next, local);
            } else {
                walk_step(w, PS_COLL_ALL_REDUCE, a, &next, local);
            }
        } else if (src >= 0 && dst < 0) {
            walk_gather(w, src, a);
        } else if (src >= 0 && dst >= 0 && src != dst) {
            next.dim_axes[src] &= (uint8_t)~bit;
            next.dim_axes[dst] |= (uint8_t)bit;
            walk_step(w, PS_COLL_ALL_TO_ALL, a, &next, local);
        } else if (src < 0 && dst >= 0) {
            next.dim_axes[dst] |= (uint8_t)bit; /* slicing a replica is free */
            walk_step(w, -1, a, &next, 0);
        }
    }
    /* an axis-1 split that the walk left under axis 0 (slices in axis order) */
    if (!ps_spec_equal(&w->cur, to)) {
        for (int d = 0; d < w->t->rank; d++)
            if (w->cur.dim_axes[d] != to->dim_axes[d])
                w->ok = false;
        if (w->cur.partial != to->partial)
            w->ok = false;
    }
}

/* Always possible: everything gathered (axis 1 before axis 0 in S01
 * dimensions) and reduced, then sliced to `to`. */
static void walk_via_replica(reshard_walk *w, const ps_sharding_spec *to)
{
    for (int d = 0; d < w->t->rank; d++) {
        if (w->cur.dim_axes[d] & 2u)
            walk_gather(w, d, 1);
        if (w->cur.dim_axes[d] & 1u)
            walk_gather(w, d, 0);
    }
    for (int a = 0; a < PS_MESH_AXES; a++)
        if (w->cur.partial & (1u << a)) {
            double local = ps_spec_tile_bytes(&w->cur, w->t, w->m->shape);
            ps_sharding_spec next = w->cur;
            next.partial &= (uint8_t)~(1u << a);
            walk_step(w, PS_COLL_ALL_REDUCE, a, &next, local);
        }
    if (!ps_spec_equal(&w->cur, to))
        walk_step(w, -1, 0, to, 0); /* slicing a replica (and making partials) is local */
}

int ps_reshard_plan(const ps_logical_mesh *m, const ps_tensor_desc *t,
                    const ps_sharding_spec *from, const ps_sharding_spec *to,
                    ps_reshard_step steps[PS_RESHARD_MAX_STEPS])
{
    ps_tensor_desc tile;
    if (!ps_spec_tile(to, t, m->shape, &tile))
        return -1;
    if (ps_spec_equal(from, to))
        return 0;
    /* both axis orders, and for a sum partial over both axes of a 2-D mesh
     * that neither keeps, one all-reduce over the whole mesh first (the
     * cost model's hierarchical one: axis by axis, the second all-reduce
     * moves the whole tensor on every ring of the first's axis); the
     * cheapest realizable one */
    static const int orders[3][2] = {{0, 1}, {1, 0}, {0, 1}};
    ps_reshard_step trial[3][PS_RESHARD_MAX_STEPS];
    int best = -1;
    double best_s = INFINITY;
    reshard_walk w[3];
    bool whole = from->partial == 3 && !(to->partial & 3u) && m->shape[0] > 1 && m->shape[1] > 1;
    for (int o = 0; o < (whole ? 3 : 2); o++) {
        w[o] = (reshard_walk){.steps = trial[o], .ok = true, .cur = *from, .m = m, .t = t};
        if (o == 2) {
            ps_sharding_spec summed = *from;
            summed.partial = 0;
            walk_step(&w[o], PS_COLL_ALL_REDUCE, 2, &summed,
                      ps_spec_tile_bytes(from, t, m->shape));
        }
        walk_axes(&w[o], to, orders[o]);
        if (!w[o].ok)
            continue;
        double sec = 0;
        for (int i = 0; i < w[o].n; i++)
            sec += trial[o][i].seconds;
        if (sec < best_s) {
            best_s = sec;
            best = o;
        }
    }
    reshard_walk r;
    if (best >= 0) {
        r = w[best];
    } else {
        r = (reshard_walk){.steps = trial[0], .ok = true, .cur = *from, .m = m, .t = t};
        walk_via_replica(&r, to);
    }
    memcpy(steps, r.steps, (size_t)r.n * sizeof *steps);
    /* the last step lands on `to` exactly */
    if (r.n > 0)
        steps[r.n - 1].to = *to;
    return r.n;
}

double ps_reshard_s(const ps_logical_mesh *m, const ps_tensor_desc *t,
                    const ps_sharding_spec *from, const ps_sharding_spec *to)
{
    ps_reshard_step steps[PS_RESHARD_MAX_STEPS];
    int n = ps_reshard_plan(m, t, from, to, steps);
    if (n < 0)
        return INFINITY;
    double cost = 0;
    for (int i = 0; i < n; i++)
        cost += steps[i].seconds;
    return cost;
}
