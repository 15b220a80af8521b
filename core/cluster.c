/* Cluster specification: construction, validation, comparison and the JSON
 * file format (docs/cluster-format.md). Presets live in cluster_presets.c. */
#include "core/cluster.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

const char *const ps_intra_topology_names[PS_INTRA_TOPOLOGY_COUNT] = {"nvswitch", "nvlink-ring",
                                                                      "pcie"};
const char *const ps_inter_topology_names[PS_INTER_TOPOLOGY_COUNT] = {"fat-tree", "switch"};

/* Upper bound on NICs per node: far above any real machine, low enough that a
 * typo (or a byte count in the wrong field) is caught. */
#define MAX_NICS_PER_NODE 1024

const ps_device_kind *ps_cluster_device(const ps_cluster *c, int device)
{
    if (c == NULL || device < 0 || device >= ps_cluster_device_count(c))
        return NULL;
    return &c->kinds[c->device_kind[device]];
}

double ps_cluster_min_memory_bytes(const ps_cluster *c)
{
    double memory = INFINITY;
    for (int d = 0; d < ps_cluster_device_count(c); d++)
        memory = fmin(memory, ps_cluster_device(c, d)->memory_bytes);
    return memory;
}

double ps_device_kind_speed_flops_per_s(const ps_device_kind *k)
{
    double fp16 = k->peak_flops[PS_DTYPE_F16];
    return fp16 > 0 ? fp16 : k->peak_flops[PS_DTYPE_F32];
}

double ps_device_kind_peak_flops_per_s(const ps_device_kind *k, ps_dtype t)
{
    int i = t < PS_FLOAT_DTYPE_COUNT ? (int)t : PS_DTYPE_F32;
    return k->peak_flops[i] > 0 ? k->peak_flops[i] : k->peak_flops[PS_DTYPE_F32];
}

/* ---- construction ------------------------------------------------------ */

static bool name_ok(const char *name, size_t cap)
{
    return name[0] != '\0' && memchr(name, '\0', cap) != NULL;
}

/* An empty cluster of the given shape: no kinds yet, every device on kind 0. */
static ps_status cluster_alloc(const char *name, int nodes, int devices_per_node, ps_cluster **out,
                               ps_error *err)
{
    ps_status st = PS_OK;
    *out = NULL;
    ps_cluster *c = calloc(1, sizeof *c);
    PS_TRY_ALLOC(c, err);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->nodes = nodes;
    c->devices_per_node = devices_per_node;
    c->device_kind = calloc((size_t)nodes * (size_t)devices_per_node, sizeof *c->device_kind);
    PS_TRY_ALLOC(c->device_kind, err);
    *out = c;
    c = NULL;
out:
    ps_cluster_free(c);
    return st;
}

/* Appends without checks (callers check names first). */
static ps_status append_kind(ps_cluster *c, const ps_device_kind *kind, int *index_out,
                             ps_error *err)
{
    ps_device_kind *bigger = realloc(c->kinds, (size_t)(c->n_kinds + 1) * sizeof *bigger);
    if (bigger == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    c->kinds = bigger;
    c->kinds[c->n_kinds] = *kind;
    if (index_out != NULL)
        *index_out = c->n_kinds;
    c->n_kinds++;
    return PS_OK;
}

int ps_cluster_find_kind(const ps_cluster *c, const char *name)
{
    for (int i = 0; i < c->n_kinds; i++)
        if (strncmp(c->kinds[i].name, name, PS_NAME_MAX) == 0)
            return i;
    return -1;
}

ps_status ps_cluster_add_kind(ps_cluster *c, const ps_device_kind *kind, int *index_out,
                              ps_error *err)
{
    if (!name_ok(kind->name, sizeof kind->name))
        return ps_error_set(err, PS_ERR_INVALID, "cluster \"%s\": device kind without a name",
                            c->name);
    if (ps_cluster_find_kind(c, kind->name) >= 0)
        return ps_error_set(err, PS_ERR_INVALID, "cluster \"%s\": duplicate device kind \"%s\"",
                            c->name, kind->name);
    return append_kind(c, kind, index_out, err);
}

ps_status ps_cluster_create(const char *name, int nodes, int devices_per_node,
                            const ps_device_kind *kind, const ps_intra_link *intra,
                            const ps_inter_link *inter, ps_cluster **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_cluster *c = NULL;
    *out = NULL;
    if (name == NULL || name[0] == '\0' || strlen(name) >= PS_NAME_MAX)
        return ps_error_set(err, PS_ERR_INVALID, "cluster name must have 1 to %d characters",
                            PS_NAME_MAX - 1);
    if (nodes < 1 || devices_per_node < 1 ||
        (int64_t)nodes * devices_per_node > PS_CLUSTER_MAX_DEVICES)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cluster \"%s\": %d nodes x %d devices per node is not a valid size "
                            "(at least 1 x 1, at most %d devices)",
                            name, nodes, devices_per_node, PS_CLUSTER_MAX_DEVICES);
    PS_TRY(cluster_alloc(name, nodes, devices_per_node, &c, err));
    PS_TRY(ps_cluster_add_kind(c, kind, NULL, err));
    c->intra = *intra;
    c->inter = *inter;
    PS_TRY(ps_cluster_validate(c, err));
    *out = c;
    c = NULL;
out:
    ps_cluster_free(c);
    return st;
}

void ps_cluster_free(ps_cluster *c)
{
    if (c == NULL)
        return;
    free(c->kinds);
    free(c->device_kind);
    free(c);
}

ps_status ps_cluster_clone(const ps_cluster *c, ps_cluster **out)
{
    ps_status st = PS_OK;
    ps_cluster *copy = NULL;
    *out = NULL;
    if (c == NULL)
        return PS_ERR_INVALID;
    PS_TRY(cluster_alloc(c->name, c->nodes, c->devices_per_node, &copy, NULL));
    copy->kinds = malloc((size_t)c->n_kinds * sizeof *copy->kinds);
    PS_TRY_ALLOC(copy->kinds, NULL);
    memcpy(copy->kinds, c->kinds, (size_t)c->n_kinds * sizeof *copy->kinds);
    copy->n_kinds = c->n_kinds;
    memcpy(copy->device_kind, c->device_kind,
           (size_t)ps_cluster_device_count(c) * sizeof *copy->device_kind);
    copy->intra = c->intra;
    copy->inter = c->inter;
    copy->shared_cores_per_node = c->shared_cores_per_node;
    copy->scheduler_slice_s = c->scheduler_slice_s;
    copy->profile = c->profile;
    *out = copy;
    copy = NULL;
out:
    ps_cluster_free(copy);
    return st;
}

/* ---- validation and comparison ----------------------------------------- */

/* Rates of 1 to 1e20 per second and latencies of at most an hour: beyond
 * them the predicted times and throughputs leave what a plan file holds
 * (0 to 1e30). */
static bool rate_ok(double x)
{
    return isfinite(x) && x >= 1 && x <= 1e20;
}
static bool latency_ok(double x)
{
    return isfinite(x) && x >= 0 && x <= 3600;
}

static ps_status check_kind(const ps_cluster *c, int i, ps_error *err)
{
    const ps_device_kind *k = &c->kinds[i];
    if (!name_ok(k->name, sizeof k->name))
        return ps_error_set(err, PS_ERR_INVALID, "cluster \"%s\": device kind %d has no name",
                            c->name, i);
    for (int t = 0; t < PS_FLOAT_DTYPE_COUNT; t++) {
        double f = k->peak_flops[t];
        /* fp32 is the one rate every device has; the others may be 0 (unsupported). */
        if (!isfinite(f) || (f != 0 && !rate_ok(f)) || f < 0 || (t == PS_DTYPE_F32 && f <= 0))
            return ps_error_set(err, PS_ERR_INVALID,
                                "cluster \"%s\": device kind \"%s\": peak_flops.%s must be %s "
                                "(found %g)",
                                c->name, k->name, ps_dtype_names[t],
                                t == PS_DTYPE_F32 ? "1 to 1e20 FLOP/s" : "0, or 1 to 1e20 FLOP/s",
                                f);
    }
    if (!isfinite(k->memory_bytes) || k->memory_bytes <= 0)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cluster \"%s\": device kind \"%s\": memory_bytes must be positive "
                            "(found %g)",
                            c->name, k->name, k->memory_bytes);
    if (!rate_ok(k->memory_bandwidth_bytes_per_s))
        return ps_error_set(err, PS_ERR_INVALID,
                            "cluster \"%s\": device kind \"%s\": memory_bandwidth_bytes_per_s "
                            "must be 1 to 1e20 B/s (found %g)",
                            c->name, k->name, k->memory_bandwidth_bytes_per_s);
    for (int j = 0; j < i; j++)
        if (strncmp(c->kinds[j].name, k->name, PS_NAME_MAX) == 0)
            return ps_error_set(err, PS_ERR_INVALID, "cluster \"%s\": duplicate device kind \"%s\"",
                                c->name, k->name);
    return PS_OK;
}

ps_status ps_cluster_validate(const ps_cluster *c, ps_error *err)
{
    if (c == NULL)
        return ps_error_set(err, PS_ERR_INVALID, "no cluster");
    if (!name_ok(c->name, sizeof c->name))
        return ps_error_set(err, PS_ERR_INVALID, "cluster without a name");
    if (c->nodes < 1 || c->devices_per_node < 1 ||
        (int64_t)c->nodes * c->devices_per_node > PS_CLUSTER_MAX_DEVICES)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cluster \"%s\": %d nodes x %d devices per node is not a valid size "
                            "(at least 1 x 1, at most %d devices)",
                            c->name, c->nodes, c->devices_per_node, PS_CLUSTER_MAX_DEVICES);
    if (c->n_kinds < 1 || c->kinds == NULL || c->device_kind == NULL)
        return ps_error_set(err, PS_ERR_INVALID, "cluster \"%s\": no device kinds", c->name);
    for (int i = 0; i < c->n_kinds; i++) {
        ps_status st = check_kind(c, i, err);
        if (st != PS_OK)
            return st;
    }
    int n = ps_cluster_device_count(c);
    for (int d = 0; d < n; d++)
        if (c->device_kind[d] < 0 || c->device_kind[d] >= c->n_kinds)
            return ps_error_set(err, PS_ERR_INVALID,
                                "cluster \"%s\": device %d has kind index %d (have %d kinds)",
                                c->name, d, c->device_kind[d], c->n_kinds);
    if ((unsigned)c->intra.topology >= PS_INTRA_TOPOLOGY_COUNT ||
        (unsigned)c->inter.topology >= PS_INTER_TOPOLOGY_COUNT)
        return ps_error_set(err, PS_ERR_INVALID, "cluster \"%s\": unknown link topology", c->name);
    if (!rate_ok(c->intra.bandwidth_bytes_per_s) || !latency_ok(c->intra.latency_s))
        return ps_error_set(err, PS_ERR_INVALID,
                            "cluster \"%s\": intra-node link needs a bandwidth of 1 to 1e20 B/s "
                            "and a latency of 0 to 3600 s (found %g B/s, %g s)",
                            c->name, c->intra.bandwidth_bytes_per_s, c->intra.latency_s);
    if (c->inter.nics_per_node < 1 || c->inter.nics_per_node > MAX_NICS_PER_NODE ||
        !rate_ok(c->inter.nic_bandwidth_bytes_per_s) || !latency_ok(c->inter.latency_s))
        return ps_error_set(err, PS_ERR_INVALID,
                            "cluster \"%s\": inter-node link needs 1 to %d NICs, a bandwidth of "
                            "1 to 1e20 B/s and a latency of 0 to 3600 s (found %d, %g B/s, %g s)",
                            c->name, MAX_NICS_PER_NODE, c->inter.nics_per_node,
                            c->inter.nic_bandwidth_bytes_per_s, c->inter.latency_s);
    if (c->shared_cores_per_node < 0 || c->shared_cores_per_node > PS_CLUSTER_MAX_DEVICES)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cluster \"%s\": shared_cores_per_node must be 1 to %d, or 0 for "
                            "none (found %d)",
                            c->name, PS_CLUSTER_MAX_DEVICES, c->shared_cores_per_node);
    if (!(c->scheduler_slice_s >= 0 && c->scheduler_slice_s <= PS_CLUSTER_MAX_SLICE_S))
        return ps_error_set(err, PS_ERR_INVALID,
                            "cluster \"%s\": scheduler_slice_s must be 0 to %g s (found %g)",
                            c->name, PS_CLUSTER_MAX_SLICE_S, c->scheduler_slice_s);
    if (c->scheduler_slice_s > 0 && c->shared_cores_per_node == 0)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cluster \"%s\": scheduler_slice_s is for devices that share "
                            "cores: it needs shared_cores_per_node",
                            c->name);
    return PS_OK;
}

double ps_cluster_compute_share(const ps_cluster *c)
{
    if (c->shared_cores_per_node <= 0 || c->shared_cores_per_node >= c->devices_per_node)
        return 1;
    return (double)c->devices_per_node / c->shared_cores_per_node;
}

double ps_lockstep_delay_s(double slice_s, double cores, int other, int members, double since_s)
{
    if (!(slice_s > 0) || !(cores > 0) || members < 2 || other <= 0 || other + members <= cores)
        return 0;
    double p = since_s < slice_s ? fmax(0, since_s) / slice_s : 1;
    return slice_s * fmin(1, other / cores) * (1 - pow(1 - p, members));
}

bool ps_device_kind_equal(const ps_device_kind *a, const ps_device_kind *b)
{
    if (strncmp(a->name, b->name, PS_NAME_MAX) != 0)
        return false;
    for (int t = 0; t < PS_FLOAT_DTYPE_COUNT; t++)
        if (a->peak_flops[t] != b->peak_flops[t])
            return false;
    return a->memory_bytes == b->memory_bytes &&
           a->memory_bandwidth_bytes_per_s == b->memory_bandwidth_bytes_per_s;
}

/* Exact comparison (doubles with ==): same name, shape, links, kinds in the
 * same order and the same kind index for every device. */
bool ps_cluster_equal(const ps_cluster *a, const ps_cluster *b)
{
    if (a == NULL || b == NULL)
        return a == b;
    if (strncmp(a->name, b->name, PS_NAME_MAX) != 0 || a->nodes != b->nodes ||
        a->devices_per_node != b->devices_per_node || a->n_kinds != b->n_kinds)
        return false;
    for (int i = 0; i < a->n_kinds; i++)
        if (!ps_device_kind_equal(&a->kinds[i], &b->kinds[i]))
            return false;
    if (memcmp(a->device_kind, b->device_kind,
               (size_t)ps_cluster_device_count(a) * sizeof *a->device_kind) != 0)
        return false;
    return a->intra.topology == b->intra.topology &&
           a->intra.bandwidth_bytes_per_s == b->intra.bandwidth_bytes_per_s &&
           a->intra.latency_s == b->intra.latency_s && a->inter.topology == b->inter.topology &&
           a->inter.nics_per_node == b->inter.nics_per_node &&
           a->inter.nic_bandwidth_bytes_per_s == b->inter.nic_bandwidth_bytes_per_s &&
           a->inter.latency_s == b->inter.latency_s &&
           a->shared_cores_per_node == b->shared_cores_per_node &&
           a->scheduler_slice_s == b->scheduler_slice_s;
}

/* ---- reading JSON ------------------------------------------------------ */

static ps_status read_name(const ps_jv *v, char out[PS_NAME_MAX], ps_error *err)
{
    const char *s;
    ps_status st = ps_jv_string(v, &s, err);
    if (st != PS_OK)
        return st;
    size_t len = strlen(s);
    if (len == 0 || len >= PS_NAME_MAX)
        return ps_jv_fail(v, err, PS_ERR_INVALID, "a name must have 1 to %d characters (found %zu)",
                          PS_NAME_MAX - 1, len);
    memcpy(out, s, len + 1);
    return PS_OK;
}

/* A number that must be positive (allow_zero: non-negative). */
static ps_status read_number(const ps_jv *obj, const char *key, bool allow_zero, double *out,
                             ps_error *err)
{
    ps_jv v;
    ps_status st = ps_jv_member(obj, key, &v, err);
    if (st == PS_OK)
        st = ps_jv_double(&v, -DBL_MAX, DBL_MAX, out, err);
    if (st != PS_OK)
        return st;
    if (allow_zero ? *out < 0 : *out <= 0)
        return ps_jv_fail(&v, err, PS_ERR_INVALID, "must be %s (found %g)",
                          allow_zero ? "zero or positive" : "positive", *out);
    return PS_OK;
}

/* A count in [1, max] (nodes, devices per node, NICs). */
static ps_status read_count(const ps_jv *obj, const char *key, int max, int *out, ps_error *err)
{
    ps_jv v;
    int64_t x;
    ps_status st = ps_jv_member(obj, key, &v, err);
    if (st == PS_OK)
        st = ps_jv_int(&v, INT64_MIN, INT64_MAX, &x, err);
    if (st != PS_OK)
        return st;
    if (x < 1)
        return ps_jv_fail(&v, err, PS_ERR_INVALID, "must be at least 1 (found %lld)", (long long)x);
    if (x > max)
        return ps_jv_fail(&v, err, PS_ERR_INVALID, "%lld is too large (at most %d)", (long long)x,
                          max);
    *out = (int)x;
    return PS_OK;
}

/* An index into [0, count), e.g. a device id of an override. */
static ps_status read_index(const ps_jv *v, int count, const char *what, int *out, ps_error *err)
{
    int64_t x;
    ps_status st = ps_jv_int(v, INT64_MIN, INT64_MAX, &x, err);
    if (st != PS_OK)
        return st;
    if (x < 0 || x >= count)
        return ps_jv_fail(v, err, PS_ERR_INVALID,
                          "%s %lld is out of range: the cluster has %d %ss (0 to %d)", what,
                          (long long)x, count, what, count - 1);
    *out = (int)x;
    return PS_OK;
}

static const char *const kind_keys[] = {"name", "peak_flops", "memory_bytes",
                                        "memory_bandwidth_bytes_per_s", NULL};
static const char *const flops_keys[] = {"fp32", "fp16", "bf16", NULL};

/* An inline device kind; its name must not be one of c's kinds yet, but
 * for kind `may_shadow` (>= 0: a preset's built-in default kind). */
static ps_status parse_kind(const ps_cluster *c, const ps_jv *obj, int may_shadow,
                            ps_device_kind *k, ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv name, flops;
    memset(k, 0, sizeof *k);
    PS_TRY(ps_jv_check_keys(obj, kind_keys, err));
    PS_TRY(ps_jv_member(obj, "name", &name, err));
    PS_TRY(read_name(&name, k->name, err));
    int found = ps_cluster_find_kind(c, k->name);
    if (found >= 0 && found != may_shadow) {
        st = ps_jv_fail(&name, err, PS_ERR_INVALID, "duplicate device kind name \"%s\"", k->name);
        goto out;
    }
    PS_TRY(ps_jv_member(obj, "peak_flops", &flops, err));
    PS_TRY(ps_jv_check_keys(&flops, flops_keys, err));
    /* fp32 is required; fp16/bf16 default to 0 (unsupported). */
    PS_TRY(read_number(&flops, "fp32", false, &k->peak_flops[PS_DTYPE_F32], err));
    for (int t = PS_DTYPE_F16; t <= PS_DTYPE_BF16; t++)
        if (ps_jv_has(&flops, flops_keys[t]))
            PS_TRY(read_number(&flops, flops_keys[t], true, &k->peak_flops[t], err));
    PS_TRY(read_number(obj, "memory_bytes", false, &k->memory_bytes, err));
    PS_TRY(read_number(obj, "memory_bandwidth_bytes_per_s", false, &k->memory_bandwidth_bytes_per_s,
                       err));
out:
    return st;
}

static ps_status unknown_kind(const ps_jv *v, const char *name, ps_error *err)
{
    char known[256] = "";
    size_t used = 0;
    for (int i = 0; i < ps_device_kind_builtin_count() && used + 1 < sizeof known; i++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "",
                                 ps_device_kind_builtin_get(i)->name);
    return ps_jv_fail(v, err, PS_ERR_NOT_FOUND,
                      "unknown device kind \"%s\" (built-in kinds: %s; others must be defined "
                      "in device_kinds)",
                      name, known);
}

/* A "device" value: the name of one of c's kinds or of a built-in kind (added
 * to c on first use), or an inline kind (added). */
static ps_status resolve_kind(ps_cluster *c, const ps_jv *v, int *index_out, ps_error *err)
{
    if (json_is_object(v->v)) {
        ps_device_kind k;
        ps_status st = parse_kind(c, v, -1, &k, err);
        return st != PS_OK ? st : append_kind(c, &k, index_out, err);
    }
    if (!json_is_string(v->v))
        return ps_jv_fail(v, err, PS_ERR_INVALID,
                          "expected a device kind name (a string) or a device kind object");
    const char *name = json_string_value(v->v);
    int i = ps_cluster_find_kind(c, name);
    if (i >= 0) {
        *index_out = i;
        return PS_OK;
    }
    const ps_device_kind *builtin = ps_device_kind_builtin_find(name);
    if (builtin == NULL)
        return unknown_kind(v, name, err);
    return append_kind(c, builtin, index_out, err);
}

/* `preset`: the cluster is a preset's, whose default kind (kinds[0]) is a
 * built-in; a kind of the file with its name shadows it, as a kind of the
 * file shadows any built-in, and becomes every device's kind. */
static ps_status read_device_kinds(ps_cluster *c, const ps_jv *root, bool preset, ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv arr;
    size_t n;
    bool shadowed = false;
    if (!ps_jv_has(root, "device_kinds"))
        return PS_OK;
    PS_TRY(ps_jv_member(root, "device_kinds", &arr, err));
    PS_TRY(ps_jv_array(&arr, &n, err));
    for (size_t i = 0; i < n; i++) {
        ps_jv e = ps_jv_element(&arr, i);
        ps_device_kind k;
        PS_TRY(ps_jv_object(&e, err));
        PS_TRY(parse_kind(c, &e, preset && !shadowed ? 0 : -1, &k, err));
        if (preset && !shadowed && strcmp(k.name, c->kinds[0].name) == 0) {
            c->kinds[0] = k;
            shadowed = true;
            continue;
        }
        PS_TRY(append_kind(c, &k, NULL, err));
    }
out:
    return st;
}

static const char *const override_keys[] = {"devices", "nodes", "device", NULL};

/* One override: {"devices": [ids], "nodes": [ids], "device": KIND}. */
static ps_status read_override(ps_cluster *c, const ps_jv *ov, ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv dev, list;
    size_t n;
    int kind = 0, id = 0; /* set before use; -O3 cannot see it */
    PS_TRY(ps_jv_check_keys(ov, override_keys, err));
    if (!ps_jv_has(ov, "devices") && !ps_jv_has(ov, "nodes")) {
        st = ps_jv_fail(ov, err, PS_ERR_INVALID,
                        "an override needs \"devices\" or \"nodes\" (lists of ids)");
        goto out;
    }
    PS_TRY(ps_jv_member(ov, "device", &dev, err));
    PS_TRY(resolve_kind(c, &dev, &kind, err));
    if (ps_jv_has(ov, "nodes")) {
        PS_TRY(ps_jv_member(ov, "nodes", &list, err));
        PS_TRY(ps_jv_array(&list, &n, err));
        for (size_t i = 0; i < n; i++) {
            ps_jv e = ps_jv_element(&list, i);
            PS_TRY(read_index(&e, c->nodes, "node", &id, err));
            for (int j = 0; j < c->devices_per_node; j++)
                c->device_kind[id * c->devices_per_node + j] = kind;
        }
    }
    if (ps_jv_has(ov, "devices")) {
        PS_TRY(ps_jv_member(ov, "devices", &list, err));
        PS_TRY(ps_jv_array(&list, &n, err));
        for (size_t i = 0; i < n; i++) {
            ps_jv e = ps_jv_element(&list, i);
            PS_TRY(read_index(&e, ps_cluster_device_count(c), "device", &id, err));
            c->device_kind[id] = kind;
        }
    }
out:
    return st;
}

static ps_status read_overrides(ps_cluster *c, const ps_jv *root, ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv arr;
    size_t n;
    if (!ps_jv_has(root, "overrides"))
        return PS_OK;
    PS_TRY(ps_jv_member(root, "overrides", &arr, err));
    PS_TRY(ps_jv_array(&arr, &n, err));
    for (size_t i = 0; i < n; i++) {
        ps_jv e = ps_jv_element(&arr, i);
        PS_TRY(ps_jv_object(&e, err));
        PS_TRY(read_override(c, &e, err));
    }
out:
    return st;
}

static const char *const intra_keys[] = {"topology", "bandwidth_bytes_per_s", "latency_s", NULL};
static const char *const inter_keys[] = {"topology", "nics_per_node", "nic_bandwidth_bytes_per_s",
                                         "latency_s", NULL};

static ps_status read_links(ps_cluster *c, const ps_jv *root, ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv intra, inter, topo;
    int t;
    PS_TRY(ps_jv_member(root, "intra_node", &intra, err));
    PS_TRY(ps_jv_check_keys(&intra, intra_keys, err));
    PS_TRY(ps_jv_member(&intra, "topology", &topo, err));
    PS_TRY(ps_jv_enum(&topo, ps_intra_topology_names, PS_INTRA_TOPOLOGY_COUNT, &t, err));
    c->intra.topology = (ps_intra_topology)t;
    PS_TRY(
        read_number(&intra, "bandwidth_bytes_per_s", false, &c->intra.bandwidth_bytes_per_s, err));
    PS_TRY(read_number(&intra, "latency_s", true, &c->intra.latency_s, err));

    PS_TRY(ps_jv_member(root, "inter_node", &inter, err));
    PS_TRY(ps_jv_check_keys(&inter, inter_keys, err));
    PS_TRY(ps_jv_member(&inter, "topology", &topo, err));
    PS_TRY(ps_jv_enum(&topo, ps_inter_topology_names, PS_INTER_TOPOLOGY_COUNT, &t, err));
    c->inter.topology = (ps_inter_topology)t;
    PS_TRY(read_count(&inter, "nics_per_node", MAX_NICS_PER_NODE, &c->inter.nics_per_node, err));
    PS_TRY(read_number(&inter, "nic_bandwidth_bytes_per_s", false,
                       &c->inter.nic_bandwidth_bytes_per_s, err));
    PS_TRY(read_number(&inter, "latency_s", true, &c->inter.latency_s, err));
out:
    return st;
}

/* The default "device" of a full cluster file becomes kinds[0]. device_kinds
 * were read first (into kinds[1..]); a name that refers to one of them moves
 * it to the front, so that kinds stay unique. */
static ps_status read_default_device(ps_cluster *c, const ps_jv *root, ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv dev;
    PS_TRY(ps_jv_member(root, "device", &dev, err));
    if (json_is_object(dev.v)) {
        ps_device_kind k; /* parsed aside: kinds[0] must not match itself */
        PS_TRY(parse_kind(c, &dev, -1, &k, err));
        c->kinds[0] = k;
    } else if (json_is_string(dev.v)) {
        const char *name = json_string_value(dev.v);
        int i = ps_cluster_find_kind(c, name);
        const ps_device_kind *builtin = ps_device_kind_builtin_find(name);
        if (i > 0) {
            c->kinds[0] = c->kinds[i];
            memmove(&c->kinds[i], &c->kinds[i + 1],
                    (size_t)(c->n_kinds - i - 1) * sizeof c->kinds[0]);
            c->n_kinds--;
        } else if (builtin != NULL) {
            c->kinds[0] = *builtin;
        } else {
            st = unknown_kind(&dev, name, err);
            goto out;
        }
    } else {
        st = ps_jv_fail(&dev, err, PS_ERR_INVALID,
                        "expected a device kind name (a string) or a device kind object");
        goto out;
    }
out:
    return st;
}

static const char *const full_keys[] = {"name",       "nodes",        "devices_per_node",
                                        "device",     "device_kinds", "overrides",
                                        "intra_node", "inter_node",   "shared_cores_per_node",
                                        "scheduler_slice_s", NULL};
static const char *const preset_keys[] = {"preset", "name", "device_kinds", "overrides", NULL};

static ps_status from_preset_json(const ps_jv *root, ps_cluster **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_cluster *c = NULL;
    ps_jv spec, name;
    const char *s;
    ps_error why = {0};
    PS_TRY(ps_jv_check_keys(root, preset_keys, err));
    PS_TRY(ps_jv_member(root, "preset", &spec, err));
    PS_TRY(ps_jv_string(&spec, &s, err));
    st = ps_cluster_from_preset(s, &c, &why);
    if (st != PS_OK) {
        ps_jv_fail(&spec, err, st, "%s", why.msg);
        goto out;
    }
    if (ps_jv_has(root, "name")) {
        PS_TRY(ps_jv_member(root, "name", &name, err));
        PS_TRY(read_name(&name, c->name, err));
    }
    PS_TRY(read_device_kinds(c, root, true, err));
    PS_TRY(read_overrides(c, root, err));
    *out = c;
    c = NULL;
out:
    ps_cluster_free(c);
    return st;
}

static ps_status from_full_json(const ps_jv *root, ps_cluster **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_cluster *c = NULL;
    ps_jv name, dpn_v;
    char name_buf[PS_NAME_MAX];
    int nodes, dpn;
    const ps_device_kind placeholder = {.name = ""};
    PS_TRY(ps_jv_check_keys(root, full_keys, err));
    PS_TRY(ps_jv_member(root, "name", &name, err));
    PS_TRY(read_name(&name, name_buf, err));
    PS_TRY(read_count(root, "nodes", PS_CLUSTER_MAX_DEVICES, &nodes, err));
    PS_TRY(read_count(root, "devices_per_node", PS_CLUSTER_MAX_DEVICES, &dpn, err));
    if ((int64_t)nodes * dpn > PS_CLUSTER_MAX_DEVICES) {
        PS_TRY(ps_jv_member(root, "devices_per_node", &dpn_v, err));
        st = ps_jv_fail(&dpn_v, err, PS_ERR_INVALID,
                        "too many devices: %d nodes x %d devices per node = %lld, at most %d "
                        "are supported",
                        nodes, dpn, (long long)nodes * dpn, PS_CLUSTER_MAX_DEVICES);
        goto out;
    }
    PS_TRY(cluster_alloc(name_buf, nodes, dpn, &c, err));
    /* kinds[0] is filled by read_default_device; "" never matches a name. */
    PS_TRY(append_kind(c, &placeholder, NULL, err));
    PS_TRY(read_device_kinds(c, root, false, err));
    PS_TRY(read_default_device(c, root, err));
    PS_TRY(read_overrides(c, root, err));
    PS_TRY(read_links(c, root, err));
    if (ps_jv_has(root, "shared_cores_per_node"))
        PS_TRY(read_count(root, "shared_cores_per_node", PS_CLUSTER_MAX_DEVICES,
                          &c->shared_cores_per_node, err));
    if (ps_jv_has(root, "scheduler_slice_s")) {
        ps_jv v;
        PS_TRY(ps_jv_member(root, "scheduler_slice_s", &v, err));
        PS_TRY(ps_jv_double(&v, 0, PS_CLUSTER_MAX_SLICE_S, &c->scheduler_slice_s, err));
        if (c->scheduler_slice_s > 0 && c->shared_cores_per_node == 0) {
            st = ps_jv_fail(&v, err, PS_ERR_INVALID,
                            "is for devices that share cores: it needs shared_cores_per_node");
            goto out;
        }
    }
    *out = c;
    c = NULL;
out:
    ps_cluster_free(c);
    return st;
}

ps_status ps_cluster_from_json(const ps_jv *v, ps_cluster **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_cluster *c = NULL;
    *out = NULL;
    PS_TRY(ps_jv_object(v, err));
    if (ps_jv_has(v, "preset"))
        PS_TRY(from_preset_json(v, &c, err));
    else
        PS_TRY(from_full_json(v, &c, err));
    /* Everything was checked with positions above; this guards the invariants. */
    PS_TRY(ps_cluster_validate(c, err));
    *out = c;
    c = NULL;
out:
    ps_cluster_free(c);
    return st;
}

ps_status ps_cluster_load(const char *path, ps_cluster **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_json_doc *doc = NULL;
    *out = NULL;
    PS_TRY(ps_json_doc_load(path, &doc, err));
    ps_jv root = ps_json_doc_root(doc);
    PS_TRY(ps_jv_expect_format(&root, NULL, "a cluster file", err));
    PS_TRY(ps_cluster_from_json(&root, out, err));
out:
    ps_json_doc_free(doc);
    return st;
}

ps_status ps_cluster_parse(const char *name, const char *text, ps_cluster **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_json_doc *doc = NULL;
    *out = NULL;
    PS_TRY(ps_json_doc_parse(name, text, &doc, err));
    ps_jv root = ps_json_doc_root(doc);
    PS_TRY(ps_jv_expect_format(&root, NULL, "a cluster file", err));
    PS_TRY(ps_cluster_from_json(&root, out, err));
out:
    ps_json_doc_free(doc);
    return st;
}

/* ---- writing JSON ------------------------------------------------------ */

/* Integral values below 2^53 are written as integers (exact and readable:
 * 17179869184 rather than 17179869184.0); others as 17-digit reals. */
static json_t *number_json(double x)
{
    if (x == floor(x) && fabs(x) <= 9007199254740992.0)
        return json_integer((json_int_t)x);
    return json_real(x);
}

/* json_pack steals the "o" values, also when it fails (jansson >= 2.11). */
static json_t *kind_json(const ps_device_kind *k)
{
    return json_pack("{s:s, s:{s:o, s:o, s:o}, s:o, s:o}", "name", k->name, "peak_flops",
                     ps_dtype_names[PS_DTYPE_F32], number_json(k->peak_flops[PS_DTYPE_F32]),
                     ps_dtype_names[PS_DTYPE_F16], number_json(k->peak_flops[PS_DTYPE_F16]),
                     ps_dtype_names[PS_DTYPE_BF16], number_json(k->peak_flops[PS_DTYPE_BF16]),
                     "memory_bytes", number_json(k->memory_bytes), "memory_bandwidth_bytes_per_s",
                     number_json(k->memory_bandwidth_bytes_per_s));
}

/* The devices of kind k as an override: whole nodes in "nodes", the rest in
 * "devices". *out stays NULL when no device has kind k. */
static ps_status override_json(const ps_cluster *c, int k, json_t **out)
{
    ps_status st = PS_OK;
    json_t *o = NULL, *nodes = json_array(), *devices = json_array();
    *out = NULL;
    PS_TRY_ALLOC(nodes, NULL);
    PS_TRY_ALLOC(devices, NULL);
    for (int n = 0; n < c->nodes; n++) {
        const int *kinds = &c->device_kind[n * c->devices_per_node];
        int count = 0;
        for (int j = 0; j < c->devices_per_node; j++)
            count += kinds[j] == k;
        if (count == c->devices_per_node) {
            PS_TRY(ps_json_append(nodes, json_integer(n)));
            continue;
        }
        for (int j = 0; j < c->devices_per_node && count > 0; j++)
            if (kinds[j] == k)
                PS_TRY(ps_json_append(devices, json_integer(n * c->devices_per_node + j)));
    }
    if (json_array_size(nodes) == 0 && json_array_size(devices) == 0)
        goto out;
    o = json_object();
    PS_TRY_ALLOC(o, NULL);
    if (json_array_size(nodes) > 0)
        PS_TRY(ps_json_set(o, "nodes", json_incref(nodes)));
    if (json_array_size(devices) > 0)
        PS_TRY(ps_json_set(o, "devices", json_incref(devices)));
    PS_TRY(ps_json_set(o, "device", json_string(c->kinds[k].name)));
    *out = o;
    o = NULL;
out:
    json_decref(o);
    json_decref(nodes);
    json_decref(devices);
    return st;
}

static json_t *intra_json(const ps_intra_link *l)
{
    return json_pack("{s:s, s:o, s:o}", "topology", ps_intra_topology_names[l->topology],
                     "bandwidth_bytes_per_s", number_json(l->bandwidth_bytes_per_s), "latency_s",
                     number_json(l->latency_s));
}

static json_t *inter_json(const ps_inter_link *l)
{
    return json_pack("{s:s, s:i, s:o, s:o}", "topology", ps_inter_topology_names[l->topology],
                     "nics_per_node", l->nics_per_node, "nic_bandwidth_bytes_per_s",
                     number_json(l->nic_bandwidth_bytes_per_s), "latency_s",
                     number_json(l->latency_s));
}

/* Always the full form with every kind inline, so that the file does not
 * depend on the built-in tables of the version that reads it. */
ps_status ps_cluster_to_json(const ps_cluster *c, json_t **out)
{
    ps_status st = PS_OK;
    json_t *root = NULL, *kinds = NULL, *overrides = NULL, *ov = NULL;
    *out = NULL;
    PS_TRY(ps_cluster_validate(c, NULL));
    root = json_object();
    PS_TRY_ALLOC(root, NULL);
    PS_TRY(ps_json_set(root, "name", json_string(c->name)));
    PS_TRY(ps_json_set(root, "nodes", json_integer(c->nodes)));
    PS_TRY(ps_json_set(root, "devices_per_node", json_integer(c->devices_per_node)));
    PS_TRY(ps_json_set(root, "device", kind_json(&c->kinds[0])));
    if (c->n_kinds > 1) {
        kinds = json_array();
        overrides = json_array();
        PS_TRY_ALLOC(kinds, NULL);
        PS_TRY_ALLOC(overrides, NULL);
        for (int k = 1; k < c->n_kinds; k++) {
            PS_TRY(ps_json_append(kinds, kind_json(&c->kinds[k])));
            PS_TRY(override_json(c, k, &ov));
            if (ov != NULL) {
                PS_TRY(ps_json_append(overrides, ov));
                ov = NULL;
            }
        }
        PS_TRY(ps_json_set(root, "device_kinds", kinds));
        kinds = NULL;
        if (json_array_size(overrides) > 0) {
            PS_TRY(ps_json_set(root, "overrides", overrides));
            overrides = NULL;
        }
    }
    PS_TRY(ps_json_set(root, "intra_node", intra_json(&c->intra)));
    PS_TRY(ps_json_set(root, "inter_node", inter_json(&c->inter)));
    if (c->shared_cores_per_node > 0) /* absent: none, so older files read the same */
        PS_TRY(ps_json_set(root, "shared_cores_per_node", json_integer(c->shared_cores_per_node)));
    if (c->scheduler_slice_s > 0)
        PS_TRY(ps_json_set(root, "scheduler_slice_s", json_real(c->scheduler_slice_s)));
    *out = root;
    root = NULL;
out:
    json_decref(root);
    json_decref(kinds);
    json_decref(overrides);
    json_decref(ov);
    return st;
}

ps_status ps_cluster_save(const ps_cluster *c, const char *path, ps_error *err)
{
    json_t *root = NULL;
    ps_status st = ps_cluster_to_json(c, &root);
    if (st != PS_OK)
        return ps_error_set(err, st, "%s: cannot write cluster \"%s\": %s", path,
                            c != NULL ? c->name : "", ps_status_str(st));
    st = ps_json_save(root, path, err);
    json_decref(root);
    return st;
}
