/* The benchmark regression check: runs a quick subset of the benchmarks
 * (about a minute on two cores) and compares it with a stored baseline.
 *
 * Two kinds of checked metrics:
 *   quality  deterministic predictions (planned and simulated iteration
 *            times, the ILP objective); lower is better; a regression is a
 *            fresh value above baseline * (1 + quality tolerance), default 1%.
 *   ratio    timings, each divided by the mean time of a fixed calibration
 *            loop (plain C, none of the project's code) run just before and
 *            just after it, so that a slower or busier machine moves both; the
 *            loop runs once per core at once for workloads that use every
 *            core (planning, the executor), timed on the wall clock, and once
 *            for the single-threaded ones (the ILP, the simulator), timed like
 *            them in CPU seconds; the best of the repeats; lower is better;
 *            a regression is a fresh ratio above baseline * time tolerance,
 *            default 1.5x.
 * Rows of kind info (absolute seconds) are recorded but never compared.
 *
 *   bench_check [--baseline FILE] [--csv FILE] [--slowdown N]
 *               [--quality-tol F] [--time-tol F]
 *   bench_check --compare BASELINE.csv FRESH.csv [--quality-tol F] [--time-tol F]
 *
 * The first form runs the workloads, writes the fresh rows to --csv (if
 * given) and compares them with --baseline (if given). --slowdown N runs
 * every timed workload N times inside its timing (an injected regression, to
 * see the check fail). The second form only compares two CSV files. Exit
 * status: 0 pass, 1 regression, 2 usage or input error. The last line is the
 * verdict. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/parallel.h"
#include "core/program.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/runtime.h"
#include "planner/inter_pass.h"
#include "planner/intra_pass.h"
#include "planner/lower.h"
#include "planner/plan_model.h"
#include "planner/train_step.h"
#include "sim/sim.h"
#include "bench/bench_common.h"
#include "core/malloc_tune.h"

#define MAX_ROWS 128
#define NAME_LEN 96
#define CALIB_RUNS 64

typedef struct ps_bench_row {
    char metric[NAME_LEN];
    char kind[16]; /* quality, ratio, info */
    double value;
    char unit[16];
} ps_bench_row;

typedef struct ps_bench_rows {
    int n;
    ps_bench_row r[MAX_ROWS];
    char machine[512];
} ps_bench_rows;

static void rows_add(ps_bench_rows *rs, const char *metric, const char *kind, double value,
                     const char *unit)
{
    if (rs->n >= MAX_ROWS)
        return;
    ps_bench_row *r = &rs->r[rs->n++];
    /* fields are cut at their size (the metric names here are short) */
    bool cut = snprintf(r->metric, sizeof r->metric, "%s", metric) >= (int)sizeof r->metric;
    cut |= snprintf(r->kind, sizeof r->kind, "%s", kind) >= (int)sizeof r->kind;
    cut |= snprintf(r->unit, sizeof r->unit, "%s", unit) >= (int)sizeof r->unit;
    if (cut)
        fprintf(stderr, "bench_check: a field of metric %s was cut\n", r->metric);
    r->value = value;
}

/* ---- calibration: fixed work independent of the project's code ---- */

#define CALIB_WORDS (256u << 10) /* 1 MiB of uint32: in L2, like most planner data */

static double calib_once(uint32_t *buf)
{
    double t0 = ps_monotonic_s();
    uint64_t x = 88172645463325252ull;
    double acc = 0;
    for (uint32_t i = 0; i < CALIB_WORDS; i++)
        buf[i] = i * 2654435761u;
    for (int k = 0; k < 120000000; k++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint32_t j = (uint32_t)(x % CALIB_WORDS);
        buf[j] += (uint32_t)k;
        acc = acc * 0.999999 + (double)(buf[(j * 7u) % CALIB_WORDS] & 1023u) * 1e-3;
    }
    volatile double sink = acc;
    (void)sink;
    return ps_monotonic_s() - t0;
}

/* The calibration matches a workload's parallelism: single-threaded work
 * (one ILP solve, the simulator) against one loop; work on every core (the
 * planner's parallel solves, the executor's device threads) against one loop
 * per core at once, so that other load on the machine slows both alike (a
 * single loop then got a whole core while the workload shared two, and
 * unchanged executor steps read as 1.7x regressions). */
typedef struct ps_calib {
    uint32_t *buf;
    int n, n_parallel;
    double s[CALIB_RUNS];          /* one loop: its CPU time */
    double s_parallel[CALIB_RUNS]; /* one loop per core: the wall time */
} ps_calib;

static bool calib_item(void *ctx, int item)
{
    (void)ctx, (void)item;
    uint32_t *buf = malloc(CALIB_WORDS * sizeof *buf);
    if (buf == NULL)
        return false;
    calib_once(buf);
    free(buf);
    return true;
}

/* CPU seconds of this process (all its threads). */
static double cpu_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Runs the calibration once: one loop, timed in CPU seconds (for the
 * single-threaded workloads, timed in CPU seconds too: waiting for a core
 * then counts in neither), or one loop per core at once when `parallel`,
 * timed on the wall clock (as the work that uses every core is). */
static double calib_run(ps_calib *c, bool parallel)
{
    if (!parallel) {
        double c0 = cpu_now_s();
        calib_once(c->buf);
        double t = cpu_now_s() - c0;
        if (c->n < CALIB_RUNS)
            c->s[c->n++] = t;
        return t;
    }
    double t0 = ps_monotonic_s();
    if (!ps_parallel_for(ps_parallel_threads(), calib_item, NULL, NULL, NULL)) {
        fprintf(stderr, "bench_check: out of memory in the calibration\n");
        exit(2);
    }
    double t = ps_monotonic_s() - t0;
    if (c->n_parallel < CALIB_RUNS)
        c->s_parallel[c->n_parallel++] = t;
    return t;
}

/* A timing `dt_s` in units of the calibration runs just before and after it. */
static double calib_ratio(double dt_s, double before_s, double after_s)
{
    return dt_s / (0.5 * (before_s + after_s));
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double calib_median(const double *times, int n)
{
    double s[CALIB_RUNS];
    if (n == 0)
        return 0;
    memcpy(s, times, (size_t)n * sizeof s[0]);
    qsort(s, (size_t)n, sizeof s[0], cmp_double);
    return s[n / 2];
}

/* ---- workloads ---- */

/* Plans `cfg` (pipeshard, remat) on `gpus` devices of p3.16xlarge; *dt_s is the
 * best of `repeats` timings, each covering `slowdown` plans, and *ratio (with
 * `cal`) the best of their ratios to the calibration runs around them. */
static ps_status plan_model(const ps_model_config *cfg0, int gpus, int global_batch,
                            int micro_batches, int layer_num, bool remat, int repeats, int slowdown,
                            ps_calib *cal, ps_plan **out, double *dt_s, double *ratio,
                            ps_error *err)
{
    ps_status st = PS_OK;
    ps_cluster *c = NULL;
    ps_graph *fwd = NULL;
    ps_model_config cfg = *cfg0;
    *out = NULL;
    *dt_s = 0;
    PS_TRY(bench_cluster_slice("p3.16xlarge", gpus, &c, err));
    cfg.batch = global_batch / micro_batches;
    PS_TRY(ps_model_build(&cfg, &fwd, err));
    ps_plan_request req = {.forward = fwd,
                           .config = &cfg,
                           .train = ps_train_options_default(),
                           .cluster = c,
                           .global_batch = global_batch,
                           .micro_batches = micro_batches,
                           .ilp = ps_ilp_options_default()};
    req.train.remat = remat;
    ps_inter_options o = ps_inter_options_default();
    o.layer_num = layer_num;
    for (int r = 0; r < repeats; r++) {
        double c0 = cal != NULL ? calib_run(cal, true) : 0;
        double t0 = ps_monotonic_s();
        for (int k = 0; k < slowdown; k++) {
            ps_plan_free(*out);
            *out = NULL;
            PS_TRY(ps_plan_pipeshard(&req, &o, out, err));
        }
        double dt = ps_monotonic_s() - t0;
        *dt_s = r == 0 || dt < *dt_s ? dt : *dt_s;
        if (cal != NULL) {
            double q = calib_ratio(dt, c0, calib_run(cal, true));
            *ratio = r == 0 || q < *ratio ? q : *ratio;
        }
    }
out:
    ps_graph_free(fwd);
    ps_cluster_free(c);
    return st;
}

typedef struct ps_gpt_case {
    const char *model;
    int gpus;
    bool timed;
} ps_gpt_case;

static const ps_gpt_case gpt_cases[] = {
    {"gpt-350m", 1, false}, {"gpt-760m", 2, true}, {"gpt-1.3b", 4, true}};

static ps_status run_plans(ps_bench_rows *rs, ps_calib *cal, int slowdown, ps_error *err)
{
    ps_status st = PS_OK;
    for (size_t i = 0; i < sizeof gpt_cases / sizeof gpt_cases[0]; i++) {
        const ps_gpt_case *g = &gpt_cases[i];
        ps_model_config cfg;
        ps_plan *p = NULL;
        double dt = 0, ratio = 0;
        PS_TRY(ps_zoo_lookup(g->model, &cfg, err));
        PS_TRY(plan_model(&cfg, g->gpus, 1024, 64, 8, true, 1, g->timed ? slowdown : 1,
                          g->timed ? cal : NULL, &p, &dt, &ratio, err));
        char m[NAME_LEN];
        snprintf(m, sizeof m, "plan.%s@%d.iteration_s", g->model, g->gpus);
        rows_add(rs, m, "quality", p->iteration_s, "s");
        if (g->timed) {
            snprintf(m, sizeof m, "plan.%s@%d.plan_time", g->model, g->gpus);
            rows_add(rs, m, "ratio", ratio, "calib");
        }
        snprintf(m, sizeof m, "plan.%s@%d.plan_s", g->model, g->gpus);
        rows_add(rs, m, "info", dt, "s");
        printf("  plan %-9s on %d GPUs: iteration %.6g s, planned in %.2f s\n", g->model, g->gpus,
               p->iteration_s, dt);
        fflush(stdout);
        ps_plan_free(p);
    }
out:
    return st;
}

/* One GPT-2.6B layer's intra-op ILP on a free 2 x 4 mesh (bench_intra's
 * slowest one-layer case), without a memory budget and within one halfway
 * between the least memory and the unconstrained answer's (the pricing of
 * memory and GLPK's budgeted solve). */
static ps_status run_intra(ps_bench_rows *rs, ps_calib *cal, int slowdown, ps_error *err)
{
    ps_status st = PS_OK;
    ps_model_config cfg;
    ps_graph *fwd = NULL, *step = NULL;
    ps_cluster *c = NULL;
    ps_logical_mesh *m = NULL;
    ps_intra_result *r = NULL;
    PS_TRY(ps_zoo_lookup("gpt-2.6b", &cfg, err));
    cfg.layers = 1;
    cfg.batch = 8;
    PS_TRY(ps_model_build(&cfg, &fwd, err));
    ps_train_options o = ps_train_options_default();
    PS_TRY(ps_train_step_build(fwd, &o, &step, err));
    PS_TRY(ps_cluster_from_preset("p3.16xlarge:1", &c, err));
    PS_TRY(ps_mesh_create(c, 0, 1, 8, 2, 4, &m, err));
    ps_intra_options io = ps_intra_options_default();
    io.force_batch_axis0 = false;
    io.ilp.time_limit_s = 60;
    io.ilp.mip_gap = 0.01;
    for (int budgeted = 0; budgeted < 2; budgeted++) {
        if (budgeted)
            io.memory_budget_bytes = 0.5 * (r->min_memory_bytes + r->peak_memory_bytes);
        double best = 0, ratio = 0;
        for (int rep = 0; rep < 3; rep++) {
            double c0 = calib_run(cal, false);
            double t0 = cpu_now_s();
            for (int k = 0; k < slowdown; k++) {
                ps_intra_result_free(r);
                r = NULL;
                PS_TRY(ps_intra_solve(step, m, &io, &r, err));
            }
            double dt = cpu_now_s() - t0; /* CPU seconds, as the calibration's */
            double q = calib_ratio(dt, c0, calib_run(cal, false));
            best = rep == 0 || dt < best ? dt : best;
            ratio = rep == 0 || q < ratio ? q : ratio;
        }
        const char *name = budgeted ? "intra.gpt-2.6b-layer@2x4-budget" : "intra.gpt-2.6b-layer@2x4";
        char key[96];
        snprintf(key, sizeof key, "%s.objective_s", name);
        rows_add(rs, key, "quality", r->objective_s, "s");
        snprintf(key, sizeof key, "%s.solve_time", name);
        rows_add(rs, key, "ratio", ratio, "calib");
        snprintf(key, sizeof key, "%s.solve_cpu_s", name);
        rows_add(rs, key, "info", best, "s");
        printf("  intra-op ILP, one GPT-2.6B layer on a 2x4 mesh%s: objective %.6g s, solved in "
               "%.2f s\n",
               budgeted ? " within a memory budget" : "", r->objective_s, best);
        fflush(stdout);
    }
out:
    ps_intra_result_free(r);
    ps_mesh_free(m);
    ps_cluster_free(c);
    ps_graph_free(step);
    ps_graph_free(fwd);
    return st;
}

/* GPT-3 175B under the uniform plan 1 x 8 x 16 on 128 DGX-A100 devices
 * (bench_sim's smallest size): one simulated step. */
static ps_status run_sim(ps_bench_rows *rs, ps_calib *cal, int slowdown, ps_error *err)
{
    ps_status st = PS_OK;
    ps_cluster *c = NULL;
    ps_graph *fwd = NULL;
    ps_plan *p = NULL;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_summary *sum = NULL;
    const int micro_batches = 32;
    PS_TRY(ps_cluster_from_preset("dgx-a100:16", &c, err));
    ps_model_config cfg;
    PS_TRY(ps_zoo_lookup("gpt-175b", &cfg, err));
    cfg.batch = 3;
    PS_TRY(ps_model_build(&cfg, &fwd, err));
    ps_plan_request req = {.forward = fwd,
                           .config = &cfg,
                           .train = ps_train_options_default(),
                           .cluster = c,
                           .method = PS_METHOD_SHARD,
                           .global_batch = 3 * micro_batches,
                           .micro_batches = micro_batches,
                           .ilp = ps_ilp_options_default()};
    req.train.remat = true;
    req.ilp.time_limit_s = 10;
    ps_inter_options io = ps_inter_options_default();
    PS_TRY(ps_plan_uniform(&req, &io, 1, 8, 16, &p, err));
    ps_lower_options lo = ps_lower_options_default();
    PS_TRY(ps_plan_model_build(p, &m, err));
    PS_TRY(ps_plan_lower(p, m, &lo, &set, err));
    double best = 0, best_cpu = 0, ratio = 0, sim_iteration_s = 0;
    for (int rep = 0; rep < 3; rep++) {
        double c0 = calib_run(cal, false);
        double wall = 0, cpu = 0;
        for (int k = 0; k < slowdown; k++) {
            ps_sim_stats stats;
            ps_sim_options so = ps_sim_options_default();
            ps_summary_free(sum);
            sum = NULL;
            PS_TRY(ps_sim_run(set, c, &so, &sum, &stats, err));
            wall += stats.wall_s;
            cpu += stats.cpu_s; /* the simulator process's CPU seconds */
            sim_iteration_s = sum->iteration_s;
        }
        double q = calib_ratio(cpu, c0, calib_run(cal, false));
        best = rep == 0 || wall < best ? wall : best;
        best_cpu = rep == 0 || cpu < best_cpu ? cpu : best_cpu;
        ratio = rep == 0 || q < ratio ? q : ratio;
    }
    rows_add(rs, "sim.gpt-175b@128.plan_iteration_s", "quality", p->iteration_s, "s");
    rows_add(rs, "sim.gpt-175b@128.sim_iteration_s", "quality", sim_iteration_s, "s");
    rows_add(rs, "sim.gpt-175b@128.sim_time", "ratio", ratio, "calib");
    rows_add(rs, "sim.gpt-175b@128.sim_wall_s", "info", best, "s");
    rows_add(rs, "sim.gpt-175b@128.sim_cpu_s", "info", best_cpu, "s");
    printf("  simulator, GPT-3 175B on 128 devices, %d micro-batches: simulated iteration "
           "%.6g s, simulated in %.2f s\n",
           micro_batches, sim_iteration_s, best);
    fflush(stdout);
out:
    ps_summary_free(sum);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);
    ps_graph_free(fwd);
    ps_cluster_free(c);
    return st;
}

/* Plans a small model and runs it on the CPU backend: the measured step time
 * (one step after a warm-up step; best of three runs) against the calibration. */
static ps_status run_exec_one(ps_bench_rows *rs, ps_calib *cal, const char *label,
                              const ps_model_config *cfg, int gpus, int global_batch,
                              int micro_batches, int slowdown, double *step_out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_plan *p = NULL;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_backend *b = NULL;
    ps_exec_result *res = NULL;
    int *slots = NULL;
    double dt = 0, ratio = 0;
    PS_TRY(plan_model(cfg, gpus, global_batch, micro_batches, 0, false, 1, 1, NULL, &p, &dt, &ratio,
                      err));
    ps_lower_options lo = ps_lower_options_default();
    PS_TRY(ps_plan_model_build(p, &m, err));
    PS_TRY(ps_plan_lower(p, m, &lo, &set, err));
    slots = malloc((size_t)set->n_devices * sizeof *slots);
    PS_TRY_ALLOC(slots, err);
    for (int d = 0; d < set->n_devices; d++)
        slots[d] = ps_exec_timing_slots(set, d);
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double c0 = calib_run(cal, true);
        double step_s = 0;
        for (int k = 0; k < slowdown; k++) {
            PS_TRY(ps_cpu_backend_create(set->n_devices, slots, NULL, &b, err));
            ps_exec_options eo = ps_exec_options_default();
            eo.warmup_steps = 1; /* the measured step is warm */
            eo.steps = 1;
            ps_exec_result_free(res);
            res = NULL;
            st = ps_exec_run(set, b, &eo, &res, err);
            b->ops->destroy(b);
            b = NULL;
            if (st != PS_OK)
                goto out;
            step_s += res->summary->iteration_s;
        }
        double q = calib_ratio(step_s, c0, calib_run(cal, true));
        best = rep == 0 || step_s < best ? step_s : best;
        ratio = rep == 0 || q < ratio ? q : ratio;
    }
    char name[NAME_LEN];
    snprintf(name, sizeof name, "exec.%s@%d.plan_iteration_s", label, gpus);
    rows_add(rs, name, "quality", p->iteration_s, "s");
    snprintf(name, sizeof name, "exec.%s@%d.step_time", label, gpus);
    rows_add(rs, name, "ratio", ratio, "calib");
    snprintf(name, sizeof name, "exec.%s@%d.step_s", label, gpus);
    rows_add(rs, name, "info", best, "s");
    printf("  CPU executor, %s on %d devices (%d stage%s): step %.3f s\n", label, gpus, p->n_stages,
           p->n_stages == 1 ? "" : "s", best);
    *step_out = best;
    fflush(stdout);
out:
    if (b != NULL)
        b->ops->destroy(b);
    ps_exec_result_free(res);
    free(slots);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);
    return st;
}

static ps_status run_exec(ps_bench_rows *rs, ps_calib *cal, int slowdown, ps_error *err)
{
    ps_status st = PS_OK;
    ps_model_config mlp, gpt;
    double mlp_s = 0, fp32_s = 0, bf16_s = 0;
    PS_TRY(ps_zoo_lookup("mlp", &mlp, err));
    mlp.hidden = 512;
    PS_TRY(run_exec_one(rs, cal, "mlp-h512", &mlp, 2, 256, 2, slowdown, &mlp_s, err));
    /* the demo's small GPT: 4 layers, hidden 256, seq 128, vocab 2048, fp32 */
    PS_TRY(ps_zoo_lookup("gpt-350m", &gpt, err));
    gpt.layers = 4;
    gpt.hidden = 256;
    gpt.ffn = 4 * 256;
    gpt.heads = 4;
    gpt.seq = 128;
    gpt.vocab = 2048;
    gpt.dtype = PS_DTYPE_F32;
    PS_TRY(run_exec_one(rs, cal, "gpt-small", &gpt, 4, 16, 4, slowdown, &fp32_s, err));
    /* and held in bf16: the half-precision path's conversions and scratch */
    gpt.dtype = PS_DTYPE_BF16;
    PS_TRY(run_exec_one(rs, cal, "gpt-small-bf16", &gpt, 4, 16, 4, slowdown, &bf16_s, err));
    rows_add(rs, "exec.gpt-small-bf16@4.over_fp32", "info", bf16_s / fp32_s, "x");
    printf("  CPU executor, bf16 step over fp32 step: %.2fx\n", bf16_s / fp32_s);
    /* a Wide-ResNet-50 of 16 channels on 32-pixel images (the profile's): the
     * convolutions, batchnorm, pooling and accumulated filter gradients */
    ps_model_config wrn;
    double wrn_s = 0;
    PS_TRY(ps_zoo_lookup("wresnet-250m", &wrn, err));
    wrn.image_size = 32;
    wrn.channels = 16;
    wrn.width_factor = 1;
    wrn.classes = 10;
    wrn.dtype = PS_DTYPE_F32;
    PS_TRY(run_exec_one(rs, cal, "wresnet-small", &wrn, 2, 128, 4, slowdown, &wrn_s, err));
out:
    return st;
}

/* ---- CSV ---- */

static int csv_write(const char *path, const ps_bench_rows *rs)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "bench_check: cannot write %s\n", path);
        return -1;
    }
    fprintf(f, "# pipeshard bench_check: quality rows lower is better (tolerance relative), "
               "ratio rows are seconds per calibration-loop second (lower is better)\n");
    fprintf(f, "# machine: %s\n", rs->machine);
    fprintf(f, "metric,kind,value,unit\n");
    for (int i = 0; i < rs->n; i++)
        fprintf(f, "%s,%s,%.9g,%s\n", rs->r[i].metric, rs->r[i].kind, rs->r[i].value,
                rs->r[i].unit);
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_check: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

static int csv_read(const char *path, ps_bench_rows *rs)
{
    memset(rs, 0, sizeof *rs);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "bench_check: cannot read %s\n", path);
        return -1;
    }
    char line[1024];
    int lineno = 0;
    bool header = false;
    while (fgets(line, sizeof line, f) != NULL) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0')
            continue;
        if (line[0] == '#') {
            if (strncmp(line, "# machine: ", 11) == 0)
                snprintf(rs->machine, sizeof rs->machine, "%.500s", line + 11);
            continue;
        }
        if (!header) {
            if (strcmp(line, "metric,kind,value,unit") != 0) {
                fprintf(stderr,
                        "bench_check: %s:%d: expected the header "
                        "\"metric,kind,value,unit\"\n",
                        path, lineno);
                fclose(f);
                return -1;
            }
            header = true;
            continue;
        }
        char *fields[4];
        int n = 0;
        char *s = line;
        while (n < 4) {
            fields[n++] = s;
            char *comma = strchr(s, ',');
            if (comma == NULL)
                break;
            *comma = '\0';
            s = comma + 1;
        }
        char *end = NULL;
        double v = n == 4 ? strtod(fields[2], &end) : 0;
        if (n != 4 || end == fields[2] || *end != '\0' ||
            (strcmp(fields[1], "quality") != 0 && strcmp(fields[1], "ratio") != 0 &&
             strcmp(fields[1], "info") != 0)) {
            fprintf(stderr, "bench_check: %s:%d: expected metric,quality|ratio|info,NUMBER,unit\n",
                    path, lineno);
            fclose(f);
            return -1;
        }
        if (rs->n >= MAX_ROWS) {
            fprintf(stderr, "bench_check: %s:%d: more than %d rows\n", path, lineno, MAX_ROWS);
            fclose(f);
            return -1;
        }
        rows_add(rs, fields[0], fields[1], v, fields[3]);
    }
    fclose(f);
    if (!header) {
        fprintf(stderr, "bench_check: %s: no \"metric,kind,value,unit\" header\n", path);
        return -1;
    }
    return 0;
}

/* ---- comparison ---- */

static const ps_bench_row *rows_find(const ps_bench_rows *rs, const char *metric)
{
    for (int i = 0; i < rs->n; i++)
        if (strcmp(rs->r[i].metric, metric) == 0)
            return &rs->r[i];
    return NULL;
}

/* Returns the number of regressions (metrics missing from the fresh run count). */
static int compare(const ps_bench_rows *base, const ps_bench_rows *fresh, double quality_tol,
                   double time_tol)
{
    int bad = 0, checked = 0;
    printf("baseline machine: %s\n", base->machine[0] ? base->machine : "(not recorded)");
    printf("fresh machine:    %s\n", fresh->machine[0] ? fresh->machine : "(not recorded)");
    printf("%-44s %-7s %12s %12s %8s  %s\n", "metric", "kind", "baseline", "fresh", "change",
           "verdict");
    for (int i = 0; i < base->n; i++) {
        const ps_bench_row *b = &base->r[i];
        if (strcmp(b->kind, "info") == 0)
            continue;
        const ps_bench_row *f = rows_find(fresh, b->metric);
        if (f == NULL) {
            printf("%-44s %-7s %12.6g %12s %8s  REGRESSION: missing from the fresh run\n",
                   b->metric, b->kind, b->value, "-", "-");
            bad++;
            continue;
        }
        checked++;
        bool quality = strcmp(b->kind, "quality") == 0;
        double limit = quality ? b->value * (1 + quality_tol) : b->value * time_tol;
        double low = quality ? b->value * (1 - quality_tol) : b->value / time_tol;
        double change = b->value != 0 ? f->value / b->value : (f->value == 0 ? 1 : 1e300);
        const char *verdict = "ok";
        if (f->value > limit) {
            verdict = "REGRESSION";
            bad++;
        } else if (f->value < low) {
            verdict = "improved beyond tolerance (refresh the baseline)";
        }
        printf("%-44s %-7s %12.6g %12.6g %7.3fx  %s\n", b->metric, b->kind, b->value, f->value,
               change, verdict);
        if (f->value > limit) {
            if (quality)
                fprintf(stderr,
                        "bench_check: regression in %s: baseline %.6g %s, fresh %.6g %s "
                        "(%+.2f%%; tolerance +%.2f%%)\n",
                        b->metric, b->value, b->unit, f->value, f->unit, (change - 1) * 100,
                        quality_tol * 100);
            else
                fprintf(stderr,
                        "bench_check: regression in %s: baseline %.6g, fresh %.6g (seconds per "
                        "calibration second; %.2fx; tolerance %.2fx)\n",
                        b->metric, b->value, f->value, change, time_tol);
        }
    }
    for (int i = 0; i < fresh->n; i++)
        if (strcmp(fresh->r[i].kind, "info") != 0 && rows_find(base, fresh->r[i].metric) == NULL)
            printf("%-44s %-7s %12s %12.6g %8s  new (not in the baseline)\n", fresh->r[i].metric,
                   fresh->r[i].kind, "-", fresh->r[i].value, "-");
    if (bad)
        printf("bench-check: FAILED, %d regression%s in %d metrics (quality tolerance %.2f%%, "
               "time tolerance %.2fx)\n",
               bad, bad == 1 ? "" : "s", checked, quality_tol * 100, time_tol);
    else
        printf("bench-check: passed, %d metrics within tolerance (quality %.2f%%, time %.2fx)\n",
               checked, quality_tol * 100, time_tol);
    return bad;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_check [--baseline FILE] [--csv FILE] [--slowdown N]\n"
            "                   [--quality-tol F] [--time-tol F]\n"
            "       bench_check --compare BASELINE.csv FRESH.csv [--quality-tol F] "
            "[--time-tol F]\n"
            "  --quality-tol F  relative tolerance of deterministic predictions (default 0.01)\n"
            "  --time-tol F     factor allowed on timing ratios (default 1.5)\n"
            "  --slowdown N     run every timed workload N times (an injected regression)\n");
}

int main(int argc, char **argv)
{
    ps_malloc_tune(argv); /* the allocator the CLI runs with */
    const char *baseline = NULL, *csv = NULL, *cmp_base = NULL, *cmp_fresh = NULL;
    double quality_tol = 0.01, time_tol = 1.5;
    int slowdown = 1;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (strcmp(argv[i], "--baseline") == 0 && i + 1 < argc) {
            baseline = argv[++i];
        } else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
            csv = argv[++i];
        } else if (strcmp(argv[i], "--compare") == 0 && i + 2 < argc) {
            cmp_base = argv[++i];
            cmp_fresh = argv[++i];
        } else if (strcmp(argv[i], "--quality-tol") == 0 && i + 1 < argc) {
            quality_tol = strtod(argv[++i], &end);
            if (*end != '\0' || quality_tol < 0) {
                fprintf(stderr, "bench_check: --quality-tol wants a non-negative number, e.g. "
                                "0.01 (1%%)\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--time-tol") == 0 && i + 1 < argc) {
            time_tol = strtod(argv[++i], &end);
            if (*end != '\0' || time_tol < 1) {
                fprintf(stderr, "bench_check: --time-tol wants a factor >= 1, e.g. 1.5\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--slowdown") == 0 && i + 1 < argc) {
            long v = strtol(argv[++i], &end, 10);
            if (*end != '\0' || v < 1 || v > 16) {
                fprintf(stderr, "bench_check: --slowdown wants a whole factor from 1 to 16\n");
                return 2;
            }
            slowdown = (int)v;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage();
            return 0;
        } else {
            usage();
            return 2;
        }
    }
    static ps_bench_rows base, fresh;
    if (cmp_base != NULL) {
        if (csv_read(cmp_base, &base) != 0 || csv_read(cmp_fresh, &fresh) != 0)
            return 2;
        return compare(&base, &fresh, quality_tol, time_tol) ? 1 : 0;
    }
    if (baseline != NULL && csv_read(baseline, &base) != 0)
        return 2;

    machine_describe(fresh.machine, sizeof fresh.machine);
    printf("bench_check on %s%s\n", fresh.machine,
           slowdown > 1 ? " (injected slowdown: timed workloads run several times)" : "");
    ps_calib cal = {.buf = malloc(CALIB_WORDS * sizeof(uint32_t))};
    if (cal.buf == NULL) {
        fprintf(stderr, "bench_check: out of memory\n");
        return 2;
    }
    double t0 = ps_monotonic_s();
    ps_error err = {0};
    ps_status st = run_plans(&fresh, &cal, slowdown, &err);
    if (st == PS_OK)
        st = run_intra(&fresh, &cal, slowdown, &err);
    if (st == PS_OK)
        st = run_sim(&fresh, &cal, slowdown, &err);
    if (st == PS_OK)
        st = run_exec(&fresh, &cal, slowdown, &err);
    if (st != PS_OK) {
        fprintf(stderr, "bench_check: a workload failed: %s\n", err.msg);
        free(cal.buf);
        return 2;
    }
    double calib = calib_median(cal.s, cal.n);
    double calib_parallel = calib_median(cal.s_parallel, cal.n_parallel);
    rows_add(&fresh, "calibration_cpu_s", "info", calib, "s");
    rows_add(&fresh, "calibration_parallel_s", "info", calib_parallel, "s");
    rows_add(&fresh, "total_s", "info", ps_monotonic_s() - t0, "s");
    free(cal.buf);
    printf("calibration loop %.3f CPU s (median of %d), one per core (%d) at once %.3f s "
           "(median of %d); workloads and calibration %.1f s\n",
           calib, cal.n, ps_parallel_threads(), calib_parallel, cal.n_parallel,
           ps_monotonic_s() - t0);
    if (csv != NULL && csv_write(csv, &fresh) != 0)
        return 2;
    if (baseline == NULL) {
        printf("bench-check: no baseline given, nothing compared\n");
        return 0;
    }
    return compare(&base, &fresh, quality_tol, time_tol) ? 1 : 0;
}
