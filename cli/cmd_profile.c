/* pipeshard profile: measure a backend's GEMMs, its other ops and its
 * communication and write a profile DB (docs/profile-db.md) for plan
 * --profile-db. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <getopt.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/bytes_text.h"
#include "core/log.h"
#include "core/profile_cluster.h"
#include "core/profile_db.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/cpu/host_memory.h"
#include "exec/cpu/sched_slice.h"
#include "exec/profile.h"
#include "planner/models/zoo.h"
#include "planner/train_step.h"
#ifdef PS_HAVE_CUDA
#include "exec/cuda/cuda_backend.h"
#endif

/* The training steps whose ops are timed (fp32, Adam; their GEMMs by shape
 * with the GEMM list, their convolutions by their GEMM shape, the others as
 * op entries): a one-block GPT (4 heads) at hidden 128, 256 and 512
 * (sequence 64, 128, 256; vocabulary 1024, 2048, 4096; micro-batch 2, 4,
 * 8), the tutorial MLP at hidden 256 and 1024 (batch 64) and a Wide-ResNet-50
 * (10 classes, widening 2) of 16 channels on 32-pixel images (batch 8) and
 * of 32 channels on 64-pixel ones (batch 16); --quick: the first two GPTs,
 * the first MLP and the first Wide-ResNet. Their ops span the sizes of the
 * small plans the CPU backend runs; the DB extrapolates beyond them at the
 * largest one's bandwidth. */
enum { N_OP_GRAPHS = 7, N_QUICK_OP_GRAPHS = 4 };

static ps_status op_graphs_build(bool quick, ps_graph **out, int *n, ps_error *err)
{
    static const struct {
        const char *model;
        int64_t hidden, seq, vocab, batch; /* wresnet: hidden = channels, seq = image */
    } sizes[N_OP_GRAPHS] = {{"gpt-350m", 128, 64, 1024, 2},   {"gpt-350m", 256, 128, 2048, 4},
                            {"mlp", 256, 0, 0, 64},           {"wresnet-250m", 16, 32, 0, 8},
                            {"gpt-350m", 512, 256, 4096, 8},  {"mlp", 1024, 0, 0, 64},
                            {"wresnet-250m", 32, 64, 0, 16}};
    ps_status st = PS_OK;
    *n = 0;
    for (int i = 0; i < (quick ? N_QUICK_OP_GRAPHS : N_OP_GRAPHS); i++) {
        ps_model_config cfg;
        ps_graph *fwd = NULL;
        PS_TRY(ps_zoo_lookup(sizes[i].model, &cfg, err));
        cfg.batch = sizes[i].batch;
        cfg.dtype = PS_DTYPE_F32;
        if (cfg.family == PS_MODEL_WRESNET) {
            cfg.channels = sizes[i].hidden;
            cfg.image_size = sizes[i].seq;
            cfg.width_factor = 2;
            cfg.classes = 10;
        } else {
            cfg.hidden = sizes[i].hidden;
            cfg.ffn = 4 * sizes[i].hidden;
        }
        if (cfg.family == PS_MODEL_GPT) {
            cfg.layers = 1;
            cfg.heads = 4;
            cfg.seq = sizes[i].seq;
            cfg.vocab = sizes[i].vocab;
        }
        PS_TRY(ps_model_build(&cfg, &fwd, err));
        ps_train_options t = ps_train_options_default();
        st = ps_train_step_build(fwd, &t, &out[*n], err);
        ps_graph_free(fwd);
        if (st != PS_OK)
            goto out;
        (*n)++;
    }
out:
    return st;
}

static void help(void)
{
    printf("usage: pipeshard profile --backend cpu|cuda [--devices N] [--quick] [OPTIONS]\n"
           "                         -o DB.json\n\n"
           "Measures GEMM throughput, the other ops of small training steps, collective and "
           "send/recv times through a backend\n"
           "(nccl-tests conventions: time, algbw, busbw) and writes a profile DB that\n"
           "'pipeshard plan --profile-db DB.json' uses instead of the analytic cost model\n"
           "(docs/profile-db.md). Prints the measurements as tables.\n\n"
           "  --backend cpu|cuda   the backend to measure (required)\n"
           "  --devices N          devices (cpu: threads; default: the usable cores, 2 to 8;\n"
           "                       cuda: GPUs, default: all); groups of 2, 4, 8, ... and N\n"
           "  --quick              a few GEMM shapes, 1 KiB to 4 MiB by x4, groups up to 4,\n"
           "                       5 repetitions (seconds)\n"
           "  --device-name NAME   the DB's device kind: the cluster's kind of that name is the\n"
           "                       one the DB describes (default: the backend's name, which\n"
           "                       stands for every device of any cluster)\n"
           "  --dtypes LIST        GEMM dtypes recorded, e.g. fp32,bf16 (default all three:\n"
           "                       executors compute every float type in fp32)\n"
           "  --min-bytes S        smallest message (default 1K; suffixes K, M, G = KiB...)\n"
           "  --max-bytes S        largest message (default 64M, --quick 4M; 0: no\n"
           "                       communication)\n"
           "  --size-factor F      ratio of consecutive sizes (default 2, --quick 4)\n"
           "  --max-group N        largest group measured (default: every device)\n"
           "  --reps N             timed repetitions per entry, median (default 9, --quick 5)\n"
           "  --passes N           the whole measurement N times, one after the other; each\n"
           "                       entry the median over them (default 3: a slow spell\n"
           "                       of the machine that hits one pass is outvoted)\n"
           "  --no-gemm            skip the GEMMs\n"
           "  --no-ops             skip the other ops (those of the training steps of a\n"
           "                       one-block GPT at three sizes, the tutorial MLP at two\n"
           "                       and a Wide-ResNet-50 at two, --quick two, one and one,\n"
           "                       fp32), which the cost model then charges by its\n"
           "                       roofline, their convolutions (then looked up as GEMMs)\n"
           "                       and their GEMM shapes (measured with the GEMMs otherwise)\n"
           "  --gemm-all-devices   time GEMMs on every device at once, the slowest counting\n"
           "                       (cpu: the devices share the host's cores, as in 'exec';\n"
           "                       default: device 0 alone)\n"
           "  --native-gemm        cuda: time GEMMs with cuBLAS in each dtype of --dtypes\n"
           "                       (fp16/bf16 on tensor cores: what a training job in that\n"
           "                       dtype gets) instead of the executor's fp32 MATMUL op\n"
           "  --tf32               cuda: the backend's fp32 GEMMs on TF32 tensor cores (as\n"
           "                       'pipeshard exec --tf32'; with --native-gemm: fp32 entries)\n"
           "  --progress           one line per entry on stderr while measuring\n"
           "  --cluster-out C.json also write the cluster file of this machine as measured:\n"
           "                       one node of --devices devices of the DB's kind, its\n"
           "                       peak the fastest GEMM, its memory bandwidth the largest\n"
           "                       add, its links the send-recv entries; cpu: the devices\n"
           "                       share the usable cores (shared_cores_per_node) and the\n"
           "                       physical memory (not with --gemm-all-devices, whose\n"
           "                       times already include that sharing); with more devices\n"
           "                       than cores, also the scheduler's slice\n"
           "                       (scheduler_slice_s, 0.3 s of busy threads)\n"
           "  -o, --output DB.json where to write the DB (required)\n"
           "  -h, --help           this help\n");
}

enum {
    OPT_BACKEND = 256,
    OPT_DEVICES,
    OPT_QUICK,
    OPT_NAME,
    OPT_DTYPES,
    OPT_MIN,
    OPT_MAX,
    OPT_FACTOR,
    OPT_GROUP,
    OPT_REPS,
    OPT_PASSES,
    OPT_NO_GEMM,
    OPT_NO_OPS,
    OPT_PROGRESS,
    OPT_NATIVE,
    OPT_TF32,
    OPT_ALL_DEVICES,
    OPT_CLUSTER_OUT
};

static const struct option options[] = {
    {"backend", required_argument, NULL, OPT_BACKEND},
    {"devices", required_argument, NULL, OPT_DEVICES},
    {"quick", no_argument, NULL, OPT_QUICK},
    {"device-name", required_argument, NULL, OPT_NAME},
    {"dtypes", required_argument, NULL, OPT_DTYPES},
    {"min-bytes", required_argument, NULL, OPT_MIN},
    {"max-bytes", required_argument, NULL, OPT_MAX},
    {"size-factor", required_argument, NULL, OPT_FACTOR},
    {"max-group", required_argument, NULL, OPT_GROUP},
    {"reps", required_argument, NULL, OPT_REPS},
    {"passes", required_argument, NULL, OPT_PASSES},
    {"no-gemm", no_argument, NULL, OPT_NO_GEMM},
    {"no-ops", no_argument, NULL, OPT_NO_OPS},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"native-gemm", no_argument, NULL, OPT_NATIVE},
    {"tf32", no_argument, NULL, OPT_TF32},
    {"gemm-all-devices", no_argument, NULL, OPT_ALL_DEVICES},
    {"cluster-out", required_argument, NULL, OPT_CLUSTER_OUT},
    {"output", required_argument, NULL, 'o'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* "4096", "64K", "4M", "1G" (binary units). */
static bool parse_size(const char *text, int64_t *out)
{
    char buf[32];
    size_t len = strlen(text);
    if (len == 0 || len >= sizeof buf)
        return false;
    memcpy(buf, text, len + 1);
    int shift = 0;
    char last = buf[len - 1];
    static const char units[] = "KMGT"; /* binary: 2^10, 2^20, 2^30, 2^40 */
    const char *unit = last != '\0' ? strchr(units, last >= 'a' ? last - 'a' + 'A' : last) : NULL;
    if (unit != NULL) {
        shift = 10 * (int)(unit - units + 1);
        buf[len - 1] = '\0';
    }
    int64_t v;
    /* at most 1T = 2^40 bytes, checked before the shift can overflow */
    if (!ps_cli_parse_int(buf, 0, (INT64_C(1) << 40) >> shift, &v))
        return false;
    *out = v << shift;
    return true;
}

/* "fp32,bf16" into dtypes; false on an unknown or repeated name. */
static bool parse_dtypes(const char *text, ps_dtype dtypes[PS_FLOAT_DTYPE_COUNT], int *n)
{
    char buf[64];
    if (strlen(text) >= sizeof buf)
        return false;
    snprintf(buf, sizeof buf, "%s", text);
    *n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        ps_dtype t;
        if (ps_dtype_parse(tok, &t) != 0 || (int)t >= PS_FLOAT_DTYPE_COUNT ||
            *n >= PS_FLOAT_DTYPE_COUNT)
            return false;
        for (int i = 0; i < *n; i++)
            if (dtypes[i] == t)
                return false;
        dtypes[(*n)++] = t;
    }
    return *n > 0;
}

/* One GEMM measurement recorded under several dtypes. */
static bool same_measurement(const ps_profile_gemm *a, const ps_profile_gemm *b)
{
    return a->op == b->op && a->m == b->m && a->n == b->n && a->k == b->k &&
           a->batch == b->batch && a->seconds == b->seconds;
}

static void print_tables(const ps_profile_db *db)
{
    printf("profile       backend %s, device \"%s\", %d device(s)\n", db->backend, db->device,
           db->devices);
    for (int i = 0; i < db->n_gemm; i++) {
        const ps_profile_gemm *g = &db->gemm[i];
        if (i == 0 || g->op != db->gemm[i - 1].op) {
            if (g->op == PS_OP_MATMUL)
                printf("\n# GEMM (batch x (m x k by k x n))\n");
            else /* ps_conv_gemm_shape */
                printf("\n# %s, as the GEMM it amounts to (m x k by k x n)\n",
                       ps_op_kind_get(g->op)->name);
            printf("#%9s %9s %9s %7s  %-16s %12s %10s\n", "m", "n", "k", "batch", "dtypes",
                   "time (us)", "TFLOP/s");
        }
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = same_measurement(&db->gemm[j], g);
        if (seen)
            continue;
        /* the dtypes measured with the same time: one measurement */
        char dts[32] = "";
        size_t used = 0;
        for (int j = i; j < db->n_gemm; j++)
            if (same_measurement(&db->gemm[j], g) && used + 1 < sizeof dts)
                used += (size_t)snprintf(dts + used, sizeof dts - used, "%s%s", used ? "," : "",
                                         ps_dtype_name(db->gemm[j].dtype));
        double flops = ps_profile_gemm_flops(g);
        printf(" %9lld %9lld %9lld %7lld  %-16s %12.2f %10.4f\n", (long long)g->m,
               (long long)g->n, (long long)g->k, (long long)g->batch, dts, g->seconds * 1e6,
               flops / g->seconds / 1e12);
    }
    for (int i = 0; i < db->n_op; i++) {
        const ps_profile_op *e = &db->ops[i];
        if (i == 0)
            printf("\n# other ops (inputs and outputs, fp32)\n#%-17s %14s %12s %13s\n", "op",
                   "bytes", "time (us)", "GB/s");
        printf(" %-17s %14lld %12.2f %13.3f\n", ps_op_kind_get(e->op)->name, (long long)e->bytes,
               e->seconds * 1e6, (double)e->bytes / e->seconds / 1e9);
    }
    for (int i = 0; i < db->n_comm; i++) {
        const ps_profile_comm_entry *c = &db->comm[i];
        if (i == 0 || c->kind != db->comm[i - 1].kind || c->n != db->comm[i - 1].n)
            printf("\n# %s, %d devices\n#%14s %12s %13s %13s\n", ps_profile_comm_names[c->kind],
                   c->n, "size (B)", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
        double algbw = (double)c->bytes / c->seconds;
        printf(" %14lld %12.2f %13.3f %13.3f\n", (long long)c->bytes, c->seconds * 1e6, algbw / 1e9,
               algbw * ps_profile_busbw_factor(c->kind, c->n) / 1e9);
    }
}

#ifdef PS_HAVE_CUDA
/* --native-gemm: cuBLAS in the entry's dtype on GPU 0. */
static ps_status cuda_gemm_timer(void *arg, const ps_gemm_shape *sh, ps_dtype dtype, int reps,
                                 double *seconds, ps_error *err)
{
    bool tf32 = *(const bool *)arg;
    int64_t batch = sh->batch > 1 ? sh->batch : 1;
    if (sh->m > INT32_MAX || sh->n > INT32_MAX || sh->k > INT32_MAX || batch > INT32_MAX)
        return ps_error_set(err, PS_ERR_INVALID, "GEMM profile: sizes beyond 2^31");
    return ps_cuda_profile_gemm_batched(0, (int)batch, (int)sh->m, (int)sh->n, (int)sh->k, dtype,
                                        tf32 ? PS_CUDA_PROFILE_TF32 : 0u, reps, seconds, err);
}
#endif

/* A backend of `kind` with n devices and the profile's timing slots. */
static ps_status create_backend(const char *kind, int n, bool tf32, ps_backend **out, ps_error *err)
{
    if (strcmp(kind, "cpu") == 0) {
        int *slots = malloc((size_t)n * sizeof *slots);
        if (slots == NULL)
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        for (int d = 0; d < n; d++)
            slots[d] = PS_PROFILE_SLOTS;
        ps_status st = ps_cpu_backend_create(n, slots, NULL, out, err);
        free(slots);
        return st;
    }
#ifdef PS_HAVE_CUDA
    ps_cuda_backend_options co = ps_cuda_backend_options_default();
    co.allow_tf32 = tf32;
    return ps_cuda_backend_create(n, PS_PROFILE_SLOTS, &co, out, err);
#else
    (void)tf32;
    return ps_error_set(err, PS_ERR_UNSUPPORTED,
                        "backend \"%s\" is not available in this build (built without CUDA; "
                        "have: cpu)",
                        kind);
#endif
}

/* Cores this process may run on: its affinity mask (taskset, a container's
 * cpuset), else the online ones. A CPU quota (docker --cpus) is not seen. */
static int usable_cores(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The cluster file of the machine measured (--cluster-out). */
/* gpu_free_bytes: GPU 0's free memory once the backend's context and
 * handles existed, before the profile allocated anything (CUDA only). */
static ps_status host_cluster(const ps_profile_db *db, const ps_backend *b, bool cuda,
                              double gpu_free_bytes, const char *path, ps_error *err)
{
    ps_status st = PS_OK;
    ps_cluster *c = NULL;
    ps_profile_host h = {.devices = b->n_devices};
    char name[PS_NAME_MAX];
    snprintf(name, sizeof name, "%.58s-host", db->device);
    h.name = name;
    if (cuda) {
        /* what a run can allocate, not the whole GPU: the planner fills
         * memory_bytes, and exec's check compares with free memory */
        h.memory_bytes = gpu_free_bytes;
    } else {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        h.shared_cores = usable_cores();
        h.memory_bytes = pages > 0 && page > 0 ? (double)pages * (double)page / b->n_devices : 0;
        /* more device threads than cores: how long each keeps a core */
        if (b->n_devices > h.shared_cores)
            PS_TRY(ps_measure_scheduler_slice(b->n_devices, 0.3, &h.scheduler_slice_s, err));
    }
    if (!(h.memory_bytes > 0))
        return ps_error_set(err, PS_ERR_IO, "%s: cannot read the devices' memory size", path);
    PS_TRY(ps_profile_db_host_cluster(db, &h, &c, err));
    PS_TRY(ps_cluster_save(c, path, err));
out:
    ps_cluster_free(c);
    return st;
}

int ps_cmd_profile(int argc, char **argv)
{
    const char *backend = NULL, *output = NULL, *cluster_out = NULL;
    bool quick = false, no_gemm = false, no_ops = false, progress = false, native = false,
         tf32 = false;
    bool all_devices = false;
    int64_t devices = 0, min_bytes = -1, max_bytes = -1, factor = 0, group = 0, reps = 0,
            passes = 0;
    ps_dtype dtypes[PS_FLOAT_DTYPE_COUNT] = {PS_DTYPE_F32, PS_DTYPE_F16, PS_DTYPE_BF16};
    int n_dtypes = PS_FLOAT_DTYPE_COUNT;
    const char *device_name = NULL;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "ho:", options, NULL)) != -1) {
        switch (c) {
        case 'h': help(); return 0;
        case 'o': output = optarg; break;
        case OPT_BACKEND: backend = optarg; break;
        case OPT_DEVICES:
            if (!ps_cli_parse_int(optarg, 1, 1024, &devices))
                return ps_cli_usage_error("profile", "--devices wants 1 to 1024");
            break;
        case OPT_QUICK: quick = true; break;
        case OPT_NAME: device_name = optarg; break;
        case OPT_DTYPES:
            if (!parse_dtypes(optarg, dtypes, &n_dtypes))
                return ps_cli_usage_error("profile",
                                          "--dtypes wants a list of fp32, fp16 and "
                                          "bf16, e.g. fp32,bf16, not \"%s\"",
                                          optarg);
            break;
        case OPT_MIN:
        case OPT_MAX:
            if (!parse_size(optarg, c == OPT_MIN ? &min_bytes : &max_bytes))
                return ps_cli_usage_error("profile",
                                          "%s wants a size such as 4096, 64K or 4M "
                                          "(at most 1T), not \"%s\"",
                                          c == OPT_MIN ? "--min-bytes" : "--max-bytes", optarg);
            break;
        case OPT_FACTOR:
            if (!ps_cli_parse_int(optarg, 2, 1024, &factor))
                return ps_cli_usage_error("profile", "--size-factor wants 2 to 1024");
            break;
        case OPT_GROUP:
            if (!ps_cli_parse_int(optarg, 2, 1024, &group))
                return ps_cli_usage_error("profile", "--max-group wants 2 to 1024");
            break;
        case OPT_REPS:
            if (!ps_cli_parse_int(optarg, 1, 1000, &reps))
                return ps_cli_usage_error("profile", "--reps wants 1 to 1000");
            break;
        case OPT_PASSES:
            if (!ps_cli_parse_int(optarg, 1, PS_PROFILE_MAX_PASSES, &passes))
                return ps_cli_usage_error("profile", "--passes wants 1 to %d",
                                          PS_PROFILE_MAX_PASSES);
            break;
        case OPT_NO_GEMM: no_gemm = true; break;
        case OPT_NO_OPS: no_ops = true; break;
        case OPT_PROGRESS: progress = true; break;
        case OPT_NATIVE: native = true; break;
        case OPT_TF32: tf32 = true; break;
        case OPT_ALL_DEVICES: all_devices = true; break;
        case OPT_CLUSTER_OUT: cluster_out = optarg; break;
        default:
            return ps_cli_usage_error("profile", "unknown or incomplete option \"%s\"",
                                      argv[optind - 1]);
        }
    }
    if (optind < argc)
        return ps_cli_usage_error("profile", "unexpected argument \"%s\"", argv[optind]);
    if (backend == NULL)
        return ps_cli_usage_error("profile", "--backend cpu|cuda is required");
    if (strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0)
        return ps_cli_usage_error("profile", "--backend is cpu or cuda, not \"%s\"", backend);
    if (output == NULL)
        return ps_cli_usage_error("profile", "-o DB.json is required");
    const ps_cli_path outs[] = {{"-o", output}, {"--cluster-out", cluster_out}};
    int checked = ps_cli_check_outputs("profile", outs, 2, NULL, 0);
    if (checked != 0)
        return checked;
    bool cuda = strcmp(backend, "cuda") == 0;
    if (cluster_out != NULL && all_devices)
        return ps_cli_usage_error("profile",
                                  "--cluster-out describes devices sharing the host's cores, "
                                  "which --gemm-all-devices times already include: profile "
                                  "without it");
    if ((native || tf32) && !cuda)
        return ps_cli_usage_error("profile", "--native-gemm and --tf32 go with --backend cuda");
    if (devices == 0) {
        int cores = usable_cores();
        devices = cores < 2 ? 2 : cores > 8 ? 8 : cores;
#ifdef PS_HAVE_CUDA
        if (cuda) /* 0 GPUs: the backend says so */
            devices = ps_cuda_device_count() > 0 ? ps_cuda_device_count() : 1;
#endif
    }

    ps_profile_options o = quick ? ps_profile_options_quick() : ps_profile_options_default();
    o.device_name = device_name;
    o.dtypes = dtypes;
    o.n_dtypes = n_dtypes;
    o.progress = progress;
    o.gemm_all_devices = all_devices;
    if (min_bytes >= 0)
        o.min_bytes = min_bytes;
    if (max_bytes >= 0)
        o.max_bytes = max_bytes;
    if (factor > 0)
        o.size_factor = (int)factor;
    if (group > 0)
        o.max_group = (int)group;
    if (reps > 0)
        o.reps = (int)reps;
    if (passes > 0)
        o.passes = (int)passes;
    if (no_gemm)
        o.n_shapes = 0;
#ifdef PS_HAVE_CUDA
    if (native) {
        o.gemm_timer = cuda_gemm_timer;
        o.gemm_timer_arg = &tf32;
    }
#endif
    if (o.max_bytes > 0 && (o.min_bytes < 4 || o.min_bytes > o.max_bytes))
        return ps_cli_usage_error("profile",
                                  "the message sizes go from --min-bytes to --max-bytes: want "
                                  "4 <= min <= max, not %lld to %lld bytes",
                                  (long long)o.min_bytes, (long long)o.max_bytes);
    /* CPU devices are this host's memory: a collective of the largest size
     * holds each member's source and destination and the backend's copy of
     * both (4 x max per member; 2.55 GB measured for 2 members of 256 MiB,
     * 4.4 GB for 4), beside two host buffers of the largest size. Beyond
     * what is free, the system would kill the process (or another one). */
    if (!cuda && o.max_bytes > 0 && devices >= 2) {
        int64_t group_max = o.max_group > 0 && o.max_group < devices ? o.max_group : devices;
        double need = (4.0 * (double)group_max + 2.0) * (double)o.max_bytes;
        int64_t have = ps_host_memory_available();
        if (have >= 0 && need > (double)have) {
            char t[32], h[32], m[32];
            fprintf(stderr,
                    "pipeshard: profile: collectives of up to %s over %lld CPU devices need "
                    "about %s of host memory (each member's buffers and the backend's copies "
                    "of them), more than the %s available: lower --max-bytes or "
                    "--max-group\n",
                    ps_bytes_text((double)o.max_bytes, m, sizeof m), (long long)group_max,
                    ps_bytes_text(need, t, sizeof t), ps_bytes_text((double)have, h, sizeof h));
            return 1;
        }
    }
    if (cluster_out != NULL && (o.n_shapes == 0 || no_ops || o.max_bytes == 0 || devices < 2))
        return ps_cli_usage_error("profile", "--cluster-out takes the devices' peak from the "
                                             "GEMMs, their memory bandwidth from the ops and "
                                             "their links from send-recv: it needs all three "
                                             "(no --no-gemm, --no-ops or --max-bytes 0, and "
                                             "--devices >= 2)");
    if (o.n_shapes == 0 && no_ops && (o.max_bytes == 0 || devices < 2))
        return ps_cli_usage_error("profile", "nothing to measure: no GEMMs, no other ops and no "
                                             "communication (--devices >= 2 and --max-bytes > 0)");

    ps_error err = {0};
    ps_status st = PS_OK;
    ps_backend *b = NULL;
    ps_profile_db *db = NULL;
    ps_graph *graphs[N_OP_GRAPHS] = {NULL};
    int n_graphs = 0;
    if (!no_ops) {
        PS_TRY(op_graphs_build(quick, graphs, &n_graphs, &err));
        o.op_graphs = (const ps_graph *const *)graphs;
        o.n_op_graphs = n_graphs;
    }
    PS_TRY(create_backend(backend, (int)devices, tf32, &b, &err));
    double gpu_free_bytes = 0;
#ifdef PS_HAVE_CUDA
    if (cuda && cluster_out != NULL) {
        gpu_free_bytes = ps_cuda_device_free_bytes(0);
        double total = ps_cuda_device_memory_bytes(0);
        if (gpu_free_bytes < 0.9 * total) { /* a context and handles take far less */
            char f[32], t[32];
            ps_bytes_text(gpu_free_bytes, f, sizeof f);
            PS_LOG_WARN("GPU 0 has %s free of its %s: another process holds memory, and %s "
                        "records the %s free as the devices' memory",
                        f, ps_bytes_text(total, t, sizeof t), cluster_out, f);
        }
    }
#endif
    PS_TRY(ps_profile_measure(b, &o, &db, &err));
    PS_TRY(ps_profile_db_save(db, output, &err));
    if (cluster_out != NULL)
        PS_TRY(host_cluster(db, b, cuda, gpu_free_bytes, cluster_out, &err));
    print_tables(db);
out:
    if (b != NULL)
        b->ops->destroy(b);
    ps_profile_db_free(db);
    for (int i = 0; i < n_graphs; i++)
        ps_graph_free(graphs[i]);
    return st == PS_OK ? 0 : ps_cli_fail(&err, st);
}
