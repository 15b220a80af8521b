/* See cross_mesh.h. */
#include "planner/cross_mesh.h"

#include <stdlib.h>
#include <string.h>

#include "core/array.h"
#include "core/collective.h"

static void tile_region(const ps_sharding_spec *spec, const ps_tensor_desc *d, const int mesh[2],
                        int i0, int i1, ps_region *r)
{
    ps_tensor_desc tile;
    ps_spec_tile(spec, d, mesh, &tile);
    r->rank = d->rank;
    ps_spec_tile_offset(spec, d, mesh, i0, i1, r->offset);
    for (int x = 0; x < d->rank; x++)
        r->size[x] = tile.shape[x];
}

static bool region_intersect(const ps_region *a, const ps_region *b, ps_region *out)
{
    out->rank = a->rank;
    for (int x = 0; x < a->rank; x++) {
        int64_t lo = a->offset[x] > b->offset[x] ? a->offset[x] : b->offset[x];
        int64_t ha = a->offset[x] + a->size[x], hb = b->offset[x] + b->size[x];
        int64_t hi = ha < hb ? ha : hb;
        if (hi <= lo)
            return false;
        out->offset[x] = lo;
        out->size[x] = hi - lo;
    }
    return true;
}

static int64_t region_numel(const ps_region *r)
{
    int64_t n = 1;
    for (int x = 0; x < r->rank; x++)
        n *= r->size[x];
    return n;
}

void ps_cross_plan_clear(ps_cross_plan *p)
{
    free(p->xfers);
    free(p->group_start);
    free(p->group_devices);
    free(p->part_start);
    free(p->parts);
    memset(p, 0, sizeof *p);
}

ps_status ps_cross_mesh_plan(const ps_cluster *c, const ps_tensor_desc *d,
                             const ps_sharding_spec *from, const int *from_devices,
                             const int from_mesh[2], const ps_sharding_spec *to,
                             const ps_logical_mesh *to_mesh, bool local_allgather,
                             ps_cross_plan *out, ps_error *err)
{
    ps_status st = PS_OK;
    int na = from_mesh[0] * from_mesh[1], nb = to_mesh->n_devices;
    const int *mb = to_mesh->shape;
    int cap_x = 0, cap_gd = 0, cap_p = 0;
    ps_region *src_box = malloc((size_t)(na > 0 ? na : 1) * sizeof *src_box);
    int *first_of = malloc((size_t)(na > 0 ? na : 1) * sizeof *first_of);
    int *replicas = malloc((size_t)(na > 0 ? na : 1) * sizeof *replicas);
    /* bytes each source device was given to send so far: a tile's next
     * piece goes to its replica with the fewest, so that each sends its
     * share */
    double *sent = calloc((size_t)(na > 0 ? na : 1), sizeof *sent);
    /* a receiver's parts: a source tile's index and its intersection */
    struct {
        int src;
        ps_region box;
    } *parts = malloc((size_t)(na > 0 ? na : 1) * sizeof *parts);
    out->group_start = malloc(((size_t)nb + 1) * sizeof *out->group_start);
    out->part_start = malloc(((size_t)nb + 1) * sizeof *out->part_start);
    PS_TRY_ALLOC(src_box, err);
    PS_TRY_ALLOC(first_of, err);
    PS_TRY_ALLOC(replicas, err);
    PS_TRY_ALLOC(sent, err);
    PS_TRY_ALLOC(parts, err);
    PS_TRY_ALLOC(out->group_start, err);
    PS_TRY_ALLOC(out->part_start, err);
    out->group_start[0] = 0;
    out->part_start[0] = 0;
    for (int i = 0; i < na; i++)
        tile_region(from, d, from_mesh, i / from_mesh[1], i % from_mesh[1], &src_box[i]);
    /* the first device holding each source tile stands for its replicas */
    for (int i = 0; i < na; i++) {
        first_of[i] = i;
        for (int j = 0; j < i && first_of[i] == i; j++)
            if (ps_region_equal(&src_box[j], &src_box[i]))
                first_of[i] = j;
    }
    /* axes of the consuming mesh along which receivers hold the same tile */
    unsigned used = 0;
    for (int q = 0; q < to->rank; q++)
        used |= to->dim_axes[q];
    unsigned gather_axes = (used & 1 ? 0u : 1u) | (used & 2 ? 0u : 2u);
    double elem = ps_dtype_size(d->dtype);
    for (int r = 0; r < nb; r++) {
        int r0 = r / mb[1], r1 = r % mb[1];
        ps_region box;
        tile_region(to, d, mb, r0, r1, &box);
        /* r's replica group: coordinates free along the unused axes */
        int g_n = 0, my_rank = 0, group = -1;
        for (int q = 0; q < nb && local_allgather; q++) {
            int q0 = q / mb[1], q1 = q % mb[1];
            if (((used & 1) && q0 != r0) || ((used & 2) && q1 != r1))
                continue;
            if (q == r)
                my_rank = g_n;
            if (ps_array_grow((void **)&out->group_devices, &cap_gd,
                              out->group_start[out->n_groups] + g_n + 1,
                              sizeof *out->group_devices) != PS_OK) {
                st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
                goto out;
            }
            out->group_devices[out->group_start[out->n_groups] + g_n++] = to_mesh->devices[q];
        }
        int chunks = g_n > 1 ? g_n : 1;
        if (chunks > 1) {
            group = out->n_groups++;
            out->group_start[out->n_groups] = out->group_start[group] + g_n;
        }
        /* the parts of r's tile: what each distinct source tile holds of it */
        int n_parts = 0;
        for (int i = 0; i < na; i++)
            if (first_of[i] == i && region_intersect(&box, &src_box[i], &parts[n_parts].box))
                parts[n_parts++].src = i;
        /* whole parts where they split evenly among the group's members */
        bool whole = chunks > 1 && n_parts >= chunks && n_parts % chunks == 0;
        for (int k = 1; k < n_parts && whole; k++)
            whole = region_numel(&parts[k].box) == region_numel(&parts[0].box);
        if (group >= 0) {
            int at = out->part_start[group], n_listed = whole ? n_parts : 0;
            if (ps_array_grow((void **)&out->parts, &cap_p, at + n_listed + 1,
                              sizeof *out->parts) != PS_OK) {
                st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
                goto out;
            }
            for (int k = 0; k < n_listed; k++)
                out->parts[at + k] = parts[k].box;
            out->part_start[group + 1] = at + n_listed;
        }
        for (int k = 0; k < n_parts; k++) {
            if (whole && k % chunks != my_rank)
                continue;
            int i = parts[k].src;
            const ps_region *part = &parts[k].box;
            int n_rep = 0; /* the tile's holders, by index in the source mesh */
            for (int j = i; j < na; j++)
                if (first_of[j] == i)
                    replicas[n_rep++] = j;
            int64_t numel = region_numel(part);
            int use_chunks = !whole && chunks > 1 && numel >= chunks ? chunks : 1;
            int64_t start, len = numel;
            if (use_chunks > 1)
                ps_coll_chunk(numel, use_chunks, my_rank, &start, &len);
            ps_cross_xfer t = {.dst = to_mesh->devices[r], .region = *part,
                               .chunk = use_chunks > 1 ? my_rank : 0, .chunks = use_chunks,
                               .group = use_chunks > 1 || whole ? group : -1,
                               .part = whole ? k : -1};
            /* the least loaded replica, not one by receiver and chunk: with
             * local all-gather the chunk moves with the receiver, and
             * (r + chunk) % n_rep left every other replica idle */
            int pick = replicas[0];
            for (int q = 1; q < n_rep; q++)
                if (sent[replicas[q]] < sent[pick])
                    pick = replicas[q];
            t.src = from_devices[pick];
            t.bytes = (double)len * elem;
            sent[pick] += t.bytes;
            t.seconds = ps_p2p_s(c, t.src, t.dst, t.bytes);
            if (use_chunks > 1 || (whole && k == my_rank)) {
                t.gather_bytes = (double)(whole ? n_parts : 1) * (double)numel * elem;
                t.gather_seconds =
                    ps_collective_s(to_mesh, PS_COLL_ALL_GATHER, gather_axes, t.gather_bytes);
            }
            if (ps_array_grow((void **)&out->xfers, &cap_x, out->n_xfers + 1,
                              sizeof *out->xfers) != PS_OK) {
                st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
                goto out;
            }
            out->xfers[out->n_xfers++] = t;
        }
    }
out:
    free(src_box);
    free(parts);
    free(first_of);
    free(replicas);
    free(sent);
    return st;
}

/* One device's share of a move: its transfers (alone on the links) and
 * all-gathers, and what of it crosses its node's NIC. */
typedef struct device_load {
    int device;
    double serial_s;    /* its transfers one after the other, then its all-gathers */
    double nic_bytes;   /* bytes through its node's NIC */
    double nic_latency; /* the latencies of those transfers, one after the other */
} device_load;

static int by_device(const void *a, const void *b)
{
    int x = ((const device_load *)a)->device, y = ((const device_load *)b)->device;
    return (x > y) - (x < y);
}

/* Sorts v by device and sums each device's entries into one (in place);
 * returns the number of devices. */
static int per_device(device_load *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, by_device);
    int out = 0;
    for (int i = 0; i < n; i++) {
        if (out > 0 && v[out - 1].device == v[i].device) {
            v[out - 1].serial_s += v[i].serial_s;
            v[out - 1].nic_bytes += v[i].nic_bytes;
            v[out - 1].nic_latency += v[i].nic_latency;
        } else {
            v[out++] = v[i];
        }
    }
    return out;
}

/* The slowest device or NIC of one side (senders or receivers): a device
 * takes its transfers in turn; the devices of a node share its NICs, so a
 * node takes at least its bytes over the NICs' bandwidth, plus the longest
 * chain of latencies among its devices. */
static double slowest(const ps_cluster *c, device_load *v, int n)
{
    n = per_device(v, n);
    double nic_bw = c->inter.nics_per_node * c->inter.nic_bandwidth_bytes_per_s, worst = 0;
    int dpn = c->devices_per_node;
    for (int i = 0; i < n;) {
        int node = v[i].device / dpn, j = i;
        double bytes = 0, latency = 0;
        for (; j < n && v[j].device / dpn == node; j++) {
            worst = v[j].serial_s > worst ? v[j].serial_s : worst;
            bytes += v[j].nic_bytes;
            latency = v[j].nic_latency > latency ? v[j].nic_latency : latency;
        }
        if (bytes > 0 && nic_bw > 0 && bytes / nic_bw + latency > worst)
            worst = bytes / nic_bw + latency;
        i = j;
    }
    return worst;
}

double ps_cross_plan_seconds(const ps_cross_plan *p, const ps_cluster *c)
{
    if (p->n_xfers == 0)
        return 0;
    device_load *v = malloc((size_t)p->n_xfers * sizeof *v);
    if (v == NULL)
        return 0;
    int dpn = c->devices_per_node;
    double nic_bw = c->inter.nics_per_node * c->inter.nic_bandwidth_bytes_per_s;
    double alone_bw = nic_bw < c->intra.bandwidth_bytes_per_s ? nic_bw : c->intra.bandwidth_bytes_per_s;
    double worst = 0;
    for (int side = 0; side < 2; side++) {
        for (int i = 0; i < p->n_xfers; i++) {
            const ps_cross_xfer *x = &p->xfers[i];
            bool inter = x->src / dpn != x->dst / dpn;
            /* alone: inside a node the pair's own link (its seconds); across
             * nodes the whole NIC (the shared share is the NIC bound's) */
            double alone = inter ? c->inter.latency_s + x->bytes / alone_bw : x->seconds;
            v[i] = (device_load){.device = side == 0 ? x->src : x->dst,
                                 .serial_s = alone + (side == 1 ? x->gather_seconds : 0),
                                 .nic_bytes = inter ? x->bytes : 0,
                                 .nic_latency = inter ? c->inter.latency_s +
                                                            (side == 1 ? x->gather_seconds : 0)
                                                      : 0};
        }
        double t = slowest(c, v, p->n_xfers);
        worst = t > worst ? t : worst;
    }
    free(v);
    return worst;
}
