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
     * d1. A group stays in a node when all its members share one. */
    int span[PS_MESH_AXES] = {(d0 - 1) * d1 + 1, d1};
    int active_per_node = devices_per_host; /* devices of a node in this mesh */
    double nic_share = nic_share_bytes_per_s(c, active_per_node);
    for (int a = 0; a < PS_MESH_AXES; a++) {
        bool inside = hosts == 1 || (span[a] <= dpn && (a == 1 ? dpn % d1 == 0 : d0 * d1 <= dpn));
        m->crosses_nodes[a] = !inside && m->shape[a] > 1;
        if (m->crosses_nodes[a]) {
            m->alpha_s[a] = c->inter.latency_s;
            m->beta_s_per_byte[a] = 1.0 / fmin(nic_share, c->intra.bandwidth_bytes_per_s);
        } else {
            m->alpha_s[a] = c->intra.latency_s;
            m->beta_s_per_byte[a] = 1.0 / c->intra.bandwidth_bytes_per_s;
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
    double a = m->alpha_s[axis], b = m->beta_s_per_byte[axis];
    double steps = n - 1, frac = (double)(n - 1) / n;
    if (kind == PS_COLL_ALL_REDUCE)
        return 2 * steps * a + 2 * frac * bytes * b;
    return steps * a + frac * bytes * b;
}

double ps_collective_s(const ps_logical_mesh *m, ps_collective kind, unsigned axes, double bytes)
{
    if (axes == 1)
        return ring_s(m, kind, 0, bytes);
    if (axes == 2)
        return ring_s(m, kind, 1, bytes);
    if (axes != 3)
        return 0;
    /* hierarchical over both axes: inner axis 1 on the full size, then axis 0
     * on what is left per device */
    double d1 = m->shape[1];
    switch (kind) {
    case PS_COLL_ALL_REDUCE:
        return ring_s(m, PS_COLL_REDUCE_SCATTER, 1, bytes) +
               ring_s(m, PS_COLL_ALL_REDUCE, 0, bytes / d1) +
               ring_s(m, PS_COLL_ALL_GATHER, 1, bytes);
    case PS_COLL_ALL_GATHER: /* bytes: the gathered size */
        return ring_s(m, kind, 0, bytes / d1) + ring_s(m, kind, 1, bytes);
    case PS_COLL_REDUCE_SCATTER: /* bytes: the input size */
        return ring_s(m, kind, 1, bytes) + ring_s(m, kind, 0, bytes / d1);
    case PS_COLL_ALL_TO_ALL:
        return ring_s(m, kind, 1, bytes) + ring_s(m, kind, 0, bytes);
    case PS_COLL_COUNT: break;
    }
    return 0;
}

double ps_compute_s(const ps_logical_mesh *m, ps_dtype dtype, double flops, double bytes,
                    bool gemm)
{
    int t = dtype < PS_FLOAT_DTYPE_COUNT ? (int)dtype : PS_DTYPE_F32;
    double peak = m->peak_flops[t];
    if (!(peak > 0)) /* the device lacks this dtype: it computes in fp32 */
        peak = m->peak_flops[PS_DTYPE_F32];
    double eff = gemm ? m->params.gemm_efficiency : m->params.other_efficiency;
    double t_flops = flops / (peak * eff);
    double t_bytes = bytes / (m->memory_bandwidth_bytes_per_s * m->params.bandwidth_efficiency);
    if (gemm && m->profile != NULL) {
        double s = ps_profile_gemm_s(m->profile, (ps_dtype)t, flops);
        if (s >= 0)
            t_flops = s;
    }
    return fmax(t_flops, t_bytes);
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
    int n = 0;
    /* Walk the axes, tracking the local size as the layout changes. */
    ps_sharding_spec cur = *from;
#define PS_STEP(k, ax, b)                                                            \
    do {                                                                             \
        steps[n] = (ps_reshard_step){.kind = (k), .axis = (ax), .to = cur, .bytes = (b)}; \
        steps[n].seconds = (k) < 0 ? 0 : ps_collective_s(m, (ps_collective)(k),        \
                                                         (ax) == 2 ? 3u : 1u << (ax), (b)); \
        n++;                                                                         \
    } while (0)
    for (int a = 0; a < PS_MESH_AXES; a++) {
        unsigned bit = 1u << a;
        if (m->shape[a] == 1)
            continue;
        int src = ps_spec_dim_of_axis(&cur, a), dst = ps_spec_dim_of_axis(to, a);
        double local = ps_spec_tile_bytes(&cur, t, m->shape);
        if (to->partial & bit) {
            /* a partial sum is wanted: a replica becomes one free of charge
             * (one device keeps the value, the others zeros) */
            if (cur.partial & bit)
                continue;
            if (src >= 0) {
                cur.dim_axes[src] &= (uint8_t)~bit;
                PS_STEP(PS_COLL_ALL_GATHER, a, local * m->shape[a]);
            }
            cur.partial |= (uint8_t)bit;
            PS_STEP(-1, a, 0);
        } else if (cur.partial & bit) {
            cur.partial &= (uint8_t)~bit;
            if (dst >= 0) {
                cur.dim_axes[dst] |= (uint8_t)bit;
                PS_STEP(PS_COLL_REDUCE_SCATTER, a, local);
            } else {
                PS_STEP(PS_COLL_ALL_REDUCE, a, local);
            }
        } else if (src >= 0 && dst < 0) {
            cur.dim_axes[src] &= (uint8_t)~bit;
            PS_STEP(PS_COLL_ALL_GATHER, a, local * m->shape[a]);
        } else if (src >= 0 && dst >= 0 && src != dst) {
            cur.dim_axes[src] &= (uint8_t)~bit;
            cur.dim_axes[dst] |= (uint8_t)bit;
            PS_STEP(PS_COLL_ALL_TO_ALL, a, local);
        } else if (src < 0 && dst >= 0) {
            cur.dim_axes[dst] |= (uint8_t)bit; /* slicing a replica is free */
            PS_STEP(-1, a, 0);
        }
    }
    /* A dimension split over axis 1 and then sliced over axis 0 holds block
     * i1 * d0 + i0, not the i0 * d1 + i1 that S01 means: the blocks must be
     * permuted, an all-to-all over both axes. */
    for (int d = 0; d < t->rank; d++)
        if (to->dim_axes[d] == 3 && from->dim_axes[d] == 2 && m->shape[0] > 1) {
            cur = *to;
            PS_STEP(PS_COLL_ALL_TO_ALL, 2, ps_spec_tile_bytes(to, t, m->shape));
            break;
        }
#undef PS_STEP
    /* the walk may leave the tensor's own layout where only the order of
     * splits differs; the last step lands on `to` */
    if (n > 0)
        steps[n - 1].to = *to;
    return n;
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
