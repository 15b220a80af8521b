/* Cluster specification: nodes x devices per node, what each device can do,
 * and the links between them. Read by the cost model (alpha/beta per mesh
 * axis), the SimGrid platform generator and the executors.
 *
 * Units are SI and carried in the names: bytes, bytes per second, seconds,
 * FLOP/s. Devices are numbered globally, node-major: device d sits on node
 * d / devices_per_node. Heterogeneous clusters give some devices another
 * device kind (per-device overrides); links stay per cluster. */
#ifndef PS_CORE_CLUSTER_H
#define PS_CORE_CLUSTER_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

#define PS_NAME_MAX 64

typedef struct ps_device_kind {
    char name[PS_NAME_MAX];                  /* e.g. "v100-sxm2-16gb" */
    double peak_flops[PS_FLOAT_DTYPE_COUNT]; /* dense FLOP/s per fp32/fp16/bf16; 0 = unsupported */
    double memory_bytes;                     /* device memory capacity */
    double memory_bandwidth_bytes_per_s;     /* HBM bandwidth */
} ps_device_kind;

typedef enum ps_intra_topology {
    PS_INTRA_NVSWITCH = 0, /* every device has one link of `bandwidth` to a switch */
    PS_INTRA_NVLINK_RING = 1, /* device i has a link of `bandwidth` to i+1 (mod n) */
    PS_INTRA_PCIE = 2,     /* devices share one PCIe switch: `bandwidth` per device */
    PS_INTRA_TOPOLOGY_COUNT
} ps_intra_topology;

typedef enum ps_inter_topology {
    PS_INTER_FAT_TREE = 0, /* non-blocking fat-tree of NICs */
    PS_INTER_SWITCH = 1,   /* one switch, all NICs attached */
    PS_INTER_TOPOLOGY_COUNT
} ps_inter_topology;

typedef struct ps_intra_link {
    ps_intra_topology topology;
    double bandwidth_bytes_per_s; /* per device, one direction */
    double latency_s;
} ps_intra_link;

typedef struct ps_inter_link {
    ps_inter_topology topology;
    int nics_per_node;
    double nic_bandwidth_bytes_per_s; /* per NIC, one direction */
    double latency_s;
} ps_inter_link;

typedef struct ps_cluster {
    char name[PS_NAME_MAX]; /* e.g. "dgx-a100:4" */
    int nodes;
    int devices_per_node;
    int n_kinds;
    ps_device_kind *kinds; /* [n_kinds]; kinds[0] is the default kind */
    int *device_kind;      /* [nodes * devices_per_node]: index into kinds */
    ps_intra_link intra;
    ps_inter_link inter;
    /* 0: every device computes on its own processor (GPUs). Else the devices
     * of a node are threads sharing this many cores (the CPU backend): while
     * n of them compute, each runs at min(1, cores / n) of its speed
     * (ps_cluster_compute_share; docs/cluster-format.md). */
    int shared_cores_per_node;
    /* With shared cores: how long a device thread computes before the
     * scheduler gives its core to another (seconds; 0: not modeled). Devices
     * that meet at a collective or a transfer while others compute lose
     * about a slice whenever one of them is preempted between the meetings
     * (the simulator's lockstep delay, docs/simulator.md); pipeshard
     * profile --cluster-out measures it. */
    double scheduler_slice_s;
    /* Measured times the cost model uses instead of its analytic defaults
     * (core/profile_db.h); borrowed, NULL = none. Set by the caller that
     * loaded the DB (pipeshard plan --profile-db); clones share it; files,
     * equality and validation ignore it. */
    const struct ps_profile_db *profile;
} ps_cluster;

extern const char *const ps_intra_topology_names[PS_INTRA_TOPOLOGY_COUNT];
extern const char *const ps_inter_topology_names[PS_INTER_TOPOLOGY_COUNT];

/* Largest cluster accepted (devices), so that sizes stay within int. */
#define PS_CLUSTER_MAX_DEVICES (1 << 20)
/* Longest scheduler slice accepted (seconds). */
#define PS_CLUSTER_MAX_SLICE_S 1.0

static inline int ps_cluster_device_count(const ps_cluster *c)
{
    return c->nodes * c->devices_per_node;
}
/* How much slower a device computes when every device of its node
 * computes at once: devices_per_node / shared_cores_per_node, at least 1
 * (1 without shared cores). The cost model's compute times assume it. */
double ps_cluster_compute_share(const ps_cluster *c);
/* The lockstep delay (seconds) of a device after it met `members` devices
 * at a collective or a transfer, on a node of `cores` shared cores with a
 * scheduler slice of slice_s, while `other` of the node's devices outside
 * the meeting computed, having itself computed since_s alone-seconds since
 * its previous meeting: slice x min(1, other / cores) x (1 - (1 - min(1,
 * since / slice))^members) (docs/simulator.md, "Lockstep on shared cores");
 * 0 without a slice, with no one else computing, or with cores for all. */
double ps_lockstep_delay_s(double slice_s, double cores, int other, int members, double since_s);
/* Borrowed pointer to the kind of device d (0 <= d < device_count). */
const ps_device_kind *ps_cluster_device(const ps_cluster *c, int device);
/* The least memory of any device (bytes): what a plan must fit everywhere. */
double ps_cluster_min_memory_bytes(const ps_cluster *c);
/* One speed per device kind, for simulators (a SimGrid host's speed, the
 * programs' reference speed): its fp16 peak FLOP/s, or fp32 without fp16. */
double ps_device_kind_speed_flops_per_s(const ps_device_kind *k);
/* Its peak FLOP/s at dtype t: fp32's where it lacks t (it computes in fp32),
 * as the cost model charges it. */
double ps_device_kind_peak_flops_per_s(const ps_device_kind *k, ps_dtype t);

/* "NAME" or "NAME:N" (N nodes, default 1) of a built-in preset. */
ps_status ps_cluster_from_preset(const char *spec, ps_cluster **out, ps_error *err);
/* A cluster JSON file (docs/cluster-format.md). */
ps_status ps_cluster_load(const char *path, ps_cluster **out, ps_error *err);
/* The same from text held in memory; name is used in messages. */
ps_status ps_cluster_parse(const char *name, const char *text, ps_cluster **out, ps_error *err);
/* The same from a parsed document's root value (used by plan files too). */
struct ps_jv;
ps_status ps_cluster_from_json(const struct ps_jv *v, ps_cluster **out, ps_error *err);
/* The cluster as JSON in the file format; loading it gives an equal cluster. */
ps_status ps_cluster_to_json(const ps_cluster *c, json_t **out);
ps_status ps_cluster_save(const ps_cluster *c, const char *path, ps_error *err);
/* Checks every invariant (positive sizes and rates, valid kind indices). */
ps_status ps_cluster_validate(const ps_cluster *c, ps_error *err);
bool ps_cluster_equal(const ps_cluster *a, const ps_cluster *b);
ps_status ps_cluster_clone(const ps_cluster *c, ps_cluster **out);
void ps_cluster_free(ps_cluster *c);

/* Built-in presets, for `pipeshard clusters`. */
typedef struct ps_cluster_preset_info {
    const char *name;
    const char *description;
} ps_cluster_preset_info;
int ps_cluster_preset_count(void);
const ps_cluster_preset_info *ps_cluster_preset_get(int i);

/* Built-in device kinds (vendor datasheet figures), usable by name in cluster
 * files ("a100-sxm4-80gb"). Borrowed, static. find returns NULL if unknown. */
int ps_device_kind_builtin_count(void);
const ps_device_kind *ps_device_kind_builtin_get(int i);
const ps_device_kind *ps_device_kind_builtin_find(const char *name);
bool ps_device_kind_equal(const ps_device_kind *a, const ps_device_kind *b);

/* Builds a homogeneous cluster: every device is `kind` (copied, kinds[0]).
 * Checks the result with ps_cluster_validate. */
ps_status ps_cluster_create(const char *name, int nodes, int devices_per_node,
                            const ps_device_kind *kind, const ps_intra_link *intra,
                            const ps_inter_link *inter, ps_cluster **out, ps_error *err);
/* Appends a copy of `kind` (its name must be new) and returns its index;
 * assign it to devices through c->device_kind[d]. */
ps_status ps_cluster_add_kind(ps_cluster *c, const ps_device_kind *kind, int *index_out,
                              ps_error *err);
/* Index of the kind named `name` in c->kinds, or -1. */
int ps_cluster_find_kind(const ps_cluster *c, const char *name);

#endif
