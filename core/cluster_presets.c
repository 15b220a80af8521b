/* Built-in device kinds and cluster presets.
 *
 * Figures are vendor datasheet peaks (dense, no sparsity), so the cost model's
 * efficiency factors are what turns them into achievable rates. Memory sizes
 * are in GiB as marketed (16 GiB = 16 * 2^30 bytes); NIC rates are line rates
 * in bits/s divided by 8. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/cluster.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define GBIT_PER_S (1e9 / 8.0) /* bytes/s in one Gbit/s */

enum { KIND_V100, KIND_A100, KIND_H100, KIND_COUNT };

static const ps_device_kind builtin_kinds[KIND_COUNT] = {
    /* NVIDIA Tesla V100 datasheet (SXM2 16 GB): 15.7 TFLOPS fp32, 125 tensor
     * TFLOPS fp16, no bf16; 900 GB/s HBM2. */
    [KIND_V100] = {.name = "v100-sxm2-16gb",
                   .peak_flops = {15.7e12, 125e12, 0.0},
                   .memory_bytes = 16 * GIB,
                   .memory_bandwidth_bytes_per_s = 900e9},
    /* NVIDIA A100 datasheet (SXM4 80 GB): 19.5 TFLOPS fp32, 312 TFLOPS
     * fp16/bf16 tensor (dense); 2039 GB/s HBM2e. */
    [KIND_A100] = {.name = "a100-sxm4-80gb",
                   .peak_flops = {19.5e12, 312e12, 312e12},
                   .memory_bytes = 80 * GIB,
                   .memory_bandwidth_bytes_per_s = 2039e9},
    /* NVIDIA H100 datasheet (SXM5 80 GB): 67 TFLOPS fp32, 989.4 TFLOPS
     * fp16/bf16 tensor (dense); 3.35 TB/s HBM3. */
    [KIND_H100] = {.name = "h100-sxm5-80gb",
                   .peak_flops = {67e12, 989.4e12, 989.4e12},
                   .memory_bytes = 80 * GIB,
                   .memory_bandwidth_bytes_per_s = 3.35e12},
};

typedef struct preset {
    ps_cluster_preset_info info;
    int kind; /* index into builtin_kinds */
    int devices_per_node;
    ps_intra_link intra;
    ps_inter_link inter;
} preset;

static const preset presets[] = {
    /* AWS p3.16xlarge: 8 V100 in an NVLink hybrid cube-mesh (modelled as a
     * ring of 150 GB/s per direction: 6 NVLink2 links x 25 GB/s) and 25 Gbit/s
     * networking (AWS instance type page). */
    {.info = {"p3.16xlarge", "8 x V100-SXM2-16GB per node, NVLink ring, 1 x 25 Gbit/s NIC (AWS)"},
     .kind = KIND_V100,
     .devices_per_node = 8,
     .intra = {PS_INTRA_NVLINK_RING, 150e9, 2e-6},
     .inter = {PS_INTER_FAT_TREE, 1, 25 * GBIT_PER_S, 25e-6}},
    /* NVIDIA DGX A100 datasheet: NVSwitch 600 GB/s bidirectional per GPU
     * (300 GB/s per direction), 8 x 200 Gbit/s HDR InfiniBand. */
    {.info = {"dgx-a100", "8 x A100-SXM4-80GB per node, NVSwitch, 8 x 200 Gbit/s InfiniBand"},
     .kind = KIND_A100,
     .devices_per_node = 8,
     .intra = {PS_INTRA_NVSWITCH, 300e9, 2e-6},
     .inter = {PS_INTER_FAT_TREE, 8, 200 * GBIT_PER_S, 5e-6}},
    /* NVIDIA DGX H100 datasheet: NVSwitch 900 GB/s bidirectional per GPU
     * (450 GB/s per direction), 8 x 400 Gbit/s NDR InfiniBand. */
    {.info = {"dgx-h100", "8 x H100-SXM5-80GB per node, NVSwitch, 8 x 400 Gbit/s InfiniBand"},
     .kind = KIND_H100,
     .devices_per_node = 8,
     .intra = {PS_INTRA_NVSWITCH, 450e9, 2e-6},
     .inter = {PS_INTER_FAT_TREE, 8, 400 * GBIT_PER_S, 5e-6}},
};

#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

int ps_device_kind_builtin_count(void)
{
    return KIND_COUNT;
}

const ps_device_kind *ps_device_kind_builtin_get(int i)
{
    return i >= 0 && i < KIND_COUNT ? &builtin_kinds[i] : NULL;
}

const ps_device_kind *ps_device_kind_builtin_find(const char *name)
{
    for (int i = 0; name != NULL && i < KIND_COUNT; i++)
        if (strcmp(builtin_kinds[i].name, name) == 0)
            return &builtin_kinds[i];
    return NULL;
}

int ps_cluster_preset_count(void)
{
    return N_PRESETS;
}

const ps_cluster_preset_info *ps_cluster_preset_get(int i)
{
    return i >= 0 && i < N_PRESETS ? &presets[i].info : NULL;
}

static ps_status unknown_preset(const char *name, size_t len, ps_error *err)
{
    char known[256] = "";
    size_t used = 0;
    for (int i = 0; i < N_PRESETS && used + 1 < sizeof known; i++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "",
                                 presets[i].info.name);
    return ps_error_set(err, PS_ERR_NOT_FOUND,
                        "unknown cluster preset \"%.*s\" (known presets: %s)", (int)len, name,
                        known);
}

/* Parses the N of "NAME:N": decimal digits only, at least 1. Values too large
 * for the device cap are reported by the caller, so parsing saturates. */
static ps_status parse_node_count(const char *spec, const char *digits, long long *out,
                                  ps_error *err)
{
    if (*digits == '\0')
        return ps_error_set(
            err, PS_ERR_INVALID,
            "cluster \"%s\": missing node count after ':' (expected NAME:N, N >= 1)", spec);
    long long n = 0;
    bool huge = false;
    for (const char *p = digits; *p != '\0'; p++) {
        if (*p < '0' || *p > '9')
            return ps_error_set(
                err, PS_ERR_INVALID,
                "cluster \"%s\": invalid node count \"%s\" (expected NAME:N, N >= 1)", spec,
                digits);
        huge = huge || n > INT32_MAX / 10;
        n = huge ? n : n * 10 + (*p - '0');
    }
    if (huge)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cluster \"%s\": too many devices (%s nodes; at most %d devices "
                            "are supported)",
                            spec, digits, PS_CLUSTER_MAX_DEVICES);
    if (n < 1)
        return ps_error_set(err, PS_ERR_INVALID, "cluster \"%s\": node count must be >= 1", spec);
    *out = n;
    return PS_OK;
}

ps_status ps_cluster_from_preset(const char *spec, ps_cluster **out, ps_error *err)
{
    *out = NULL;
    if (spec == NULL)
        return ps_error_set(err, PS_ERR_INVALID, "no cluster preset given");
    const char *colon = strchr(spec, ':');
    size_t name_len = colon != NULL ? (size_t)(colon - spec) : strlen(spec);
    const preset *p = NULL;
    for (int i = 0; i < N_PRESETS && p == NULL; i++)
        if (strlen(presets[i].info.name) == name_len &&
            strncmp(presets[i].info.name, spec, name_len) == 0)
            p = &presets[i];
    if (p == NULL)
        return unknown_preset(spec, name_len, err);

    long long nodes = 1;
    if (colon != NULL) {
        ps_status st = parse_node_count(spec, colon + 1, &nodes, err);
        if (st != PS_OK)
            return st;
    }
    if (nodes * p->devices_per_node > PS_CLUSTER_MAX_DEVICES)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cluster \"%s\": too many devices (%lld nodes x %d; at most %d "
                            "devices are supported)",
                            spec, nodes, p->devices_per_node, PS_CLUSTER_MAX_DEVICES);

    char name[PS_NAME_MAX];
    snprintf(name, sizeof name, "%s:%lld", p->info.name, nodes);
    return ps_cluster_create(name, (int)nodes, p->devices_per_node, &builtin_kinds[p->kind],
                             &p->intra, &p->inter, out, err);
}
