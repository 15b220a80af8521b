/* The cluster of the machine a profile DB measured (profile_cluster.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/profile_cluster.h"

ps_status ps_profile_db_host_cluster(const ps_profile_db *db, const ps_profile_host *host,
                                     ps_cluster **out, ps_error *err)
{
    *out = NULL;
    if (db == NULL || !db->finished)
        return ps_error_set(err, PS_ERR_INVALID, "the profile DB is not finished");
    if (host->devices < 1)
        return ps_error_set(err, PS_ERR_INVALID, "a host of %d devices", host->devices);
    ps_device_kind k = {.memory_bytes = host->memory_bytes};
    snprintf(k.name, sizeof k.name, "%s", db->device);
    double any = 0;
    for (int i = 0; i < db->n_gemm; i++) {
        const ps_profile_gemm *g = &db->gemm[i];
        if (g->op != PS_OP_MATMUL) /* the peak is the GEMMs' proper */
            continue;
        double rate = ps_profile_gemm_flops(g) / g->seconds;
        if (g->dtype < PS_FLOAT_DTYPE_COUNT)
            k.peak_flops[g->dtype] = fmax(k.peak_flops[g->dtype], rate);
        any = fmax(any, rate);
    }
    if (!(any > 0))
        return ps_error_set(err, PS_ERR_INVALID,
                            "the profile DB has no GEMMs to take the devices' peak FLOP/s from");
    if (!(k.peak_flops[PS_DTYPE_F32] > 0))
        k.peak_flops[PS_DTYPE_F32] = any;
    const ps_profile_op *stream = NULL;
    for (int i = 0; i < db->n_op; i++)
        if (db->ops[i].op == PS_OP_ADD && (stream == NULL || db->ops[i].bytes > stream->bytes))
            stream = &db->ops[i];
    if (stream == NULL)
        return ps_error_set(err, PS_ERR_INVALID,
                            "the profile DB has no add entries to take the memory bandwidth "
                            "from (profiled with --no-ops?)");
    k.memory_bandwidth_bytes_per_s = (double)stream->bytes / stream->seconds;
    double link_bw = 0, latency_s = INFINITY;
    for (int i = 0; i < db->n_comm; i++) {
        const ps_profile_comm_entry *e = &db->comm[i];
        if (e->kind != PS_PROFILE_SEND_RECV)
            continue;
        link_bw = fmax(link_bw, (double)e->bytes / e->seconds);
        latency_s = fmin(latency_s, e->seconds);
    }
    if (!(link_bw > 0))
        return ps_error_set(err, PS_ERR_INVALID,
                            "the profile DB has no send-recv entries to take the links from "
                            "(profile at least 2 devices, with --max-bytes above 0)");
    ps_intra_link intra = {PS_INTRA_NVSWITCH, link_bw, latency_s};
    ps_inter_link inter = {PS_INTER_FAT_TREE, 1, link_bw, latency_s};
    ps_cluster *c = NULL;
    ps_status st = ps_cluster_create(host->name, 1, host->devices, &k, &intra, &inter, &c, err);
    if (st != PS_OK)
        return st;
    c->shared_cores_per_node = host->shared_cores;
    c->scheduler_slice_s = host->shared_cores > 0 ? host->scheduler_slice_s : 0;
    st = ps_cluster_validate(c, err);
    if (st != PS_OK) {
        ps_cluster_free(c);
        return st;
    }
    *out = c;
    return PS_OK;
}
