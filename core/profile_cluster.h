/* The one-node cluster a profile DB describes: the machine that measured
 * it, for planning and simulating on that machine (pipeshard profile
 * --cluster-out; docs/profile-db.md). The DB supplies the rates; the
 * caller what a DB does not hold (devices, cores, memory). */
#ifndef PS_CORE_PROFILE_CLUSTER_H
#define PS_CORE_PROFILE_CLUSTER_H

#include "core/cluster.h"
#include "core/profile_db.h"

typedef struct ps_profile_host {
    const char *name;    /* the cluster's name, 1 to 63 characters */
    int devices;         /* devices of the node */
    int shared_cores;    /* cores they share (shared_cores_per_node); 0: none */
    double scheduler_slice_s; /* with shared cores: the scheduler's slice (0: none) */
    double memory_bytes; /* per device */
} ps_profile_host;

/* One node of host->devices devices of the DB's kind (db->device):
 *   peak_flops per dtype    the fastest GEMM the DB measured in it (FLOPs /
 *                           seconds; 0 for a dtype without GEMMs, and fp32
 *                           the fastest of any dtype if it has none);
 *   memory bandwidth        the largest add entry's bytes / seconds: a
 *                           streaming kernel (others do arithmetic, and an
 *                           embedding counts a whole table it barely reads);
 *   intra-node link         nvswitch, the fastest send-recv (bytes /
 *                           seconds) and the quickest send-recv's time as
 *                           the latency;
 *   inter-node link         the same (one node: never used).
 * Fails with a message naming what the DB lacks: GEMMs, add entries
 * (profiled with --no-ops) or send-recv entries (one device, or no
 * communication). The DB must be finished. */
ps_status ps_profile_db_host_cluster(const ps_profile_db *db, const ps_profile_host *host,
                                     ps_cluster **out, ps_error *err);

#endif
