#include "exec/host_collective.h"

#include <stdlib.h>
#include <string.h>

#include "exec/box.h"

ps_status ps_gather_check_cover(int device, int group, ps_collective kind, int n,
                                const ps_tile *members, const ps_tile *dst, ps_error *err)
{
    int covered = ps_boxes_cover(dst, n, members);
    if (covered < 0)
        return ps_error_set(err, PS_ERR_NOMEM, "device %d: out of memory", device);
    if (covered == 0)
        return ps_error_set(err, PS_ERR_INTERNAL,
                            "device %d: %s on group %d leaves part of the tile unwritten", device,
                            ps_collective_names[kind], group);
    return PS_OK;
}

ps_status ps_combine_tiles(int device, int group, ps_collective kind, int n, const ps_tile *geo,
                           void *const *copy, ps_tile *dst, ps_error *err)
{
    bool reduce = kind == PS_COLL_ALL_REDUCE || kind == PS_COLL_REDUCE_SCATTER;
    int64_t dof[PS_MAX_RANK], ds[PS_MAX_RANK], so[PS_MAX_RANK], ss[PS_MAX_RANK],
        o[PS_MAX_RANK], s[PS_MAX_RANK];
    ps_tile_box(dst, dof, ds);
    if (reduce)
        memset(dst->data, 0, (size_t)ps_tile_numel(dst) * 4);
    for (int m = 0; m < n; m++) {
        if (geo[m].rank != dst->rank)
            return ps_error_set(err, PS_ERR_INTERNAL,
                                "device %d: members of group %d hold tiles of ranks %d and %d",
                                device, group, geo[m].rank, dst->rank);
        for (int k = 0; k < dst->rank; k++)
            if (geo[m].global[k] != dst->global[k])
                return ps_error_set(err, PS_ERR_INTERNAL,
                                    "device %d: members of group %d hold tiles of different "
                                    "tensors (dimension %d: %lld and %lld)",
                                    device, group, k, (long long)geo[m].global[k],
                                    (long long)dst->global[k]);
        ps_tile t = geo[m];
        t.data = copy[m];
        ps_tile_box(&t, so, ss);
        if (!ps_box_intersect(dst->rank, so, ss, dof, ds, o, s))
            continue;
        if (!reduce) {
            /* copy each element once: from the lowest member holding it */
            bool earlier = false;
            for (int q = 0; q < m && !earlier; q++) {
                int64_t qo[PS_MAX_RANK], qs[PS_MAX_RANK], xo[PS_MAX_RANK], xs[PS_MAX_RANK];
                ps_tile_box(&geo[q], qo, qs);
                earlier = ps_box_intersect(dst->rank, qo, qs, o, s, xo, xs) &&
                          ps_box_numel(dst->rank, xs) == ps_box_numel(dst->rank, s);
            }
            if (earlier)
                continue;
        }
        ps_box_copy_host(&t, dst, o, s, reduce);
    }
    return reduce ? PS_OK : ps_gather_check_cover(device, group, kind, n, geo, dst, err);
}

ps_status ps_combine_values(int device, int n_members, void *const *copy, const int64_t *count,
                            void *data, int64_t n, ps_reduce_op op, bool dbl, ps_error *err)
{
    for (int m = 0; m < n_members; m++)
        if (count[m] != n)
            return ps_error_set(err, PS_ERR_INTERNAL,
                                "device %d: reduction of %lld values meets one of %lld", device,
                                (long long)n, (long long)count[m]);
    for (int64_t i = 0; i < n; i++) {
        double v = dbl ? ((double *)copy[0])[i] : ((float *)copy[0])[i];
        float vf = (float)v; /* floats add in float, as one device would */
        for (int m = 1; m < n_members; m++) {
            double x = dbl ? ((double *)copy[m])[i] : ((float *)copy[m])[i];
            if (op == PS_REDUCE_OP_MAX)
                v = x > v ? x : v;
            else if (dbl)
                v += x;
            else
                v = vf = vf + (float)x;
        }
        if (dbl)
            ((double *)data)[i] = v;
        else
            ((float *)data)[i] = op == PS_REDUCE_OP_MAX ? (float)v : vf;
    }
    return PS_OK;
}

bool ps_group_is_local(const ps_mailbox *mb, const ps_exec_group *g)
{
    for (int m = 0; m < g->n; m++)
        if (ps_mailbox_is_remote(mb, g->devices[m]))
            return false;
    return true;
}

/* What every member sends every other member, before its data. */
typedef struct exchange_header {
    int32_t kind, member;
    int64_t count; /* elements */
    ps_tile geo;   /* data pointer unused */
} exchange_header;

void ps_exchange_free(ps_exchange *x)
{
    for (int m = 0; m < x->n && x->owner != NULL; m++)
        free(x->owner[m]);
    free(x->copy);
    free(x->geo);
    free(x->count);
    free(x->owner);
    memset(x, 0, sizeof *x);
}

static ps_status exchange_fill(ps_mailbox *mb, int device, const ps_exec_group *g, int kind,
                               const void *data, size_t elem, int64_t count, const ps_tile *geo,
                               ps_exchange *x, ps_error *err)
{
    if (count < 0)
        return ps_error_set(err, PS_ERR_INTERNAL, "device %d: an exchange of %lld elements",
                            device, (long long)count);
    x->n = g->n;
    x->copy = calloc((size_t)g->n, sizeof *x->copy);
    x->geo = calloc((size_t)g->n, sizeof *x->geo);
    x->count = calloc((size_t)g->n, sizeof *x->count);
    x->owner = calloc((size_t)g->n, sizeof *x->owner);
    if (x->copy == NULL || x->geo == NULL || x->count == NULL || x->owner == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", device);
    size_t payload = (size_t)count * elem;
    exchange_header h;
    memset(&h, 0, sizeof h);
    h.kind = kind;
    h.member = g->rank;
    h.count = count;
    if (geo != NULL) {
        h.geo = *geo;
        h.geo.data = NULL;
    }
    for (int m = 0; m < g->n; m++) {
        if (m == g->rank)
            continue;
        void *buf = ps_mailbox_payload(sizeof h + payload);
        if (buf == NULL)
            return ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", device);
        memcpy(buf, &h, sizeof h);
        if (payload > 0)
            memcpy((char *)buf + sizeof h, data, payload);
        PS_TRY_RET(ps_mailbox_post(mb, device, g->devices[m], PS_HOSTS_CHANNEL_COLLECTIVE, buf,
                                   err));
    }
    x->copy[g->rank] = (void *)data;
    x->geo[g->rank] = h.geo;
    x->count[g->rank] = count;
    for (int m = 0; m < g->n; m++) {
        if (m == g->rank)
            continue;
        void *buf;
        size_t bytes;
        PS_TRY_RET(ps_mailbox_take(mb, g->devices[m], device, PS_HOSTS_CHANNEL_COLLECTIVE, &buf,
                                   &bytes, &x->owner[m], err));
        exchange_header in;
        if (bytes < sizeof in)
            return ps_error_set(err, PS_ERR_INTERNAL,
                                "device %d: a short message from device %d in group %d", device,
                                g->devices[m], g->id);
        memcpy(&in, buf, sizeof in);
        if (in.kind != kind || in.member != m || in.count < 0 ||
            bytes != sizeof in + (size_t)in.count * elem)
            return ps_error_set(err, PS_ERR_INTERNAL,
                                "device %d: members of group %d entered different collectives "
                                "(device %d)",
                                device, g->id, g->devices[m]);
        x->copy[m] = (char *)buf + sizeof in;
        x->geo[m] = in.geo;
        x->count[m] = in.count;
    }
    return PS_OK;
}

ps_status ps_exchange_run(ps_mailbox *mb, int device, const ps_exec_group *g, int kind,
                          const void *data, size_t elem, int64_t count, const ps_tile *geo,
                          ps_exchange *x, ps_error *err)
{
    memset(x, 0, sizeof *x);
    ps_status st = exchange_fill(mb, device, g, kind, data, elem, count, geo, x, err);
    if (st != PS_OK)
        ps_exchange_free(x);
    return st;
}
