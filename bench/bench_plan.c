/* Planning wall time and predicted throughput for Alpa's GPT, MoE and
 * Wide-ResNet suites on their GPU counts (p3.16xlarge V100 nodes; 1-4 GPUs are
 * one node's slice) and GPT-3 175B on 128 DGX-A100 nodes. GPT and MoE: global
 * batch 1024 in 64 micro-batches (GPT-39B: 128, since in 64 of 16 no plan's
 * programs fit 16 GB V100s; GPT-3 175B: 1536 in 128); Wide-ResNet: 1536 in
 * 32; remat on, 8 clustered layers (16 for 175B). Adam's state is fp32
 * beside an fp32 master copy of fp16 weights, except for MoE-70B, whose 69 B
 * parameters need 1033 GiB that way (64 V100s have 954 GiB): it keeps
 * Adam's state in fp16 with no master copy, as Alpa's benchmarks train
 * (column `optimizer`). Each plan is lowered and its programs' peak checked
 * against the devices' memory, planned again with less where it does not
 * fit, as `pipeshard plan` does (planner/plan_fit.h; the fullest device's
 * programs peak, `peak_GiB` in the table and `peak_bytes` in the CSV, and
 * the plans made, `try` and `attempts`). plan_s includes that check.
 * One row per case; the last line is the headline (total planning time).
 *
 *   bench_plan [--quick] [--suite gpt|moe|wresnet|all] [--time-limit S]
 *              [--csv FILE] [--scaling FILE]
 *
 * --quick: the cases up to 8 GPUs; --suite: one suite (default all);
 * --time-limit: the ILP's limit per solve (default 10 s); --csv FILE also
 * writes the rows as CSV; --scaling FILE writes the total predicted throughput
 * against devices per suite, the CSV that `pipeshard plot --scaling` reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench/bench_common.h"
#include "core/malloc_tune.h"
#include "planner/inter_pass.h"
#include "planner/plan_fit.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* The stage DP's plan (a ps_planner_fn; ctx: the inter-op options). */
static ps_status pipeshard(const ps_plan_request *req, void *ctx, ps_plan **out, ps_error *err)
{
    return ps_plan_pipeshard(req, ctx, out, err);
}

typedef struct bench_case {
    const char *suite, *model, *preset;
    int gpus, global_batch, micro_batches, layer_num;
    bool fp16_optimizer; /* Adam state in fp16, no master weights (Alpa's) */
} bench_case;

#define P3 "p3.16xlarge"
static const bench_case cases[] = {
    {"gpt", "gpt-350m", P3, 1, 1024, 64, 8, false},
    {"gpt", "gpt-760m", P3, 2, 1024, 64, 8, false},
    {"gpt", "gpt-1.3b", P3, 4, 1024, 64, 8, false},
    {"gpt", "gpt-2.6b", P3, 8, 1024, 64, 8, false},
    {"gpt", "gpt-6.7b", P3, 16, 1024, 64, 8, false},
    {"gpt", "gpt-15b", P3, 32, 1024, 64, 8, false},
    {"gpt", "gpt-39b", P3, 64, 1024, 128, 8, false},
    {"gpt", "gpt-175b", "dgx-a100", 1024, 1536, 128, 16, false},
    {"moe", "moe-380m", P3, 1, 1024, 64, 8, false},
    {"moe", "moe-690m", P3, 2, 1024, 64, 8, false},
    {"moe", "moe-1.3b", P3, 4, 1024, 64, 8, false},
    {"moe", "moe-2.4b", P3, 8, 1024, 64, 8, false},
    {"moe", "moe-10b", P3, 16, 1024, 64, 8, false},
    {"moe", "moe-27b", P3, 32, 1024, 64, 8, false},
    {"moe", "moe-70b", P3, 64, 1024, 64, 8, true},
    {"wresnet", "wresnet-250m", P3, 1, 1536, 32, 8, false},
    {"wresnet", "wresnet-500m", P3, 2, 1536, 32, 8, false},
    {"wresnet", "wresnet-1b", P3, 4, 1536, 32, 8, false},
    {"wresnet", "wresnet-2b", P3, 8, 1536, 32, 8, false},
    {"wresnet", "wresnet-4b", P3, 16, 1536, 32, 8, false},
    {"wresnet", "wresnet-6.8b", P3, 32, 1536, 32, 8, false},
    {"wresnet", "wresnet-13b", P3, 64, 1536, 32, 8, false},
};

static const char *suite_title(const char *suite)
{
    if (strcmp(suite, "gpt") == 0)
        return "GPT";
    if (strcmp(suite, "moe") == 0)
        return "GShard MoE";
    return "Wide-ResNet";
}

int main(int argc, char **argv)
{
    ps_malloc_tune(argv); /* the allocator the CLI runs with */
    bool quick = false;
    const char *suite = "all";
    double time_limit_s = 10;
    FILE *csv = NULL, *scaling = NULL;
    for (int i = 1; i < argc; i++) {
        const char *bad = NULL;
        if (strcmp(argv[i], "--quick") == 0) {
            quick = true;
        } else if (strcmp(argv[i], "--suite") == 0 && i + 1 < argc) {
            suite = argv[++i];
            if (strcmp(suite, "gpt") != 0 && strcmp(suite, "moe") != 0 &&
                strcmp(suite, "wresnet") != 0 && strcmp(suite, "all") != 0)
                bad = "--suite wants gpt, moe, wresnet or all";
        } else if (strcmp(argv[i], "--time-limit") == 0 && i + 1 < argc) {
            time_limit_s = atof(argv[++i]);
            if (time_limit_s <= 0)
                bad = "--time-limit wants a positive number of seconds";
        } else if ((strcmp(argv[i], "--csv") == 0 || strcmp(argv[i], "--scaling") == 0) &&
                   i + 1 < argc) {
            FILE **f = argv[i][2] == 'c' ? &csv : &scaling;
            *f = fopen(argv[++i], "w");
            if (*f == NULL) {
                fprintf(stderr, "bench_plan: cannot write %s\n", argv[i]);
                return 1;
            }
        } else {
            bad = "usage: bench_plan [--quick] [--suite gpt|moe|wresnet|all] [--time-limit S] "
                  "[--csv FILE] [--scaling FILE]";
        }
        if (bad != NULL) {
            fprintf(stderr, "bench_plan: %s\n", bad);
            return 2;
        }
    }
    if (csv != NULL) {
        char machine[600];
        machine_describe(machine, sizeof machine);
        fprintf(csv, "# bench_plan, ILP time limit %g s per solve; machine: %s\n", time_limit_s,
                machine);
        fprintf(csv, "suite,model,cluster,gpus,stages,iteration_s,tflops_per_device,mfu,plan_s,"
                     "peak_bytes,attempts,"
                     "optimizer\n");
    }
    if (scaling != NULL) {
        char machine[600];
        machine_describe(machine, sizeof machine);
        fprintf(scaling,
                "# Alpa's suites, weak scaling (a larger model per GPU count), the planner's "
                "prediction of pipeshard plans; machine: %s\n"
                "series,devices,throughput (TFLOP/s),model,iteration_s\n",
                machine);
    }
    printf("%-12s %-22s %5s %6s %10s %9s %6s %9s %8s %3s\n", "model", "cluster", "gpus", "stages",
           "iter_s", "TFLOP/s", "mfu", "plan_s", "peak_GiB", "try");
    double total = 0;
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        const bench_case *b = &cases[i];
        if ((quick && b->gpus > 8) || (strcmp(suite, "all") != 0 && strcmp(suite, b->suite) != 0))
            continue;
        ps_error err = {0};
        ps_cluster *c = NULL;
        ps_graph *fwd = NULL;
        ps_plan *p = NULL;
        ps_plan_fit fit = {0};
        ps_model_config cfg;
        double t0 = ps_monotonic_s();
        ps_status st = bench_cluster_slice(b->preset, b->gpus, &c, &err);
        if (st == PS_OK)
            st = ps_zoo_lookup(b->model, &cfg, &err);
        if (st == PS_OK) {
            cfg.batch = b->global_batch / b->micro_batches;
            st = ps_model_build(&cfg, &fwd, &err);
        }
        if (st == PS_OK) {
            ps_plan_request req = {.forward = fwd,
                                   .config = &cfg,
                                   .train = ps_train_options_default(),
                                   .cluster = c,
                                   .global_batch = b->global_batch,
                                   .micro_batches = b->micro_batches,
                                   .ilp = ps_ilp_options_default()};
            req.train.remat = true;
            if (b->fp16_optimizer) {
                req.train.optimizer_dtype = PS_DTYPE_F16;
                req.train.master_weights = false;
            }
            req.ilp.time_limit_s = time_limit_s;
            ps_inter_options o = ps_inter_options_default();
            o.layer_num = b->layer_num;
            ps_plan_fit_options fo = ps_plan_fit_options_default();
            st = ps_plan_fitting(&req, &fo, pipeshard, &o, &p, &fit, &err);
        }
        double dt = ps_monotonic_s() - t0;
        total += dt;
        if (st == PS_OK) {
            printf("%-12s %-22s %5d %6d %10.4g %9.4g %5.1f%% %9.2f %8.2f %3d%s\n", b->model,
                   c->name, b->gpus, p->n_stages, p->iteration_s, p->tflops_per_device,
                   p->mfu * 100, dt, fit.programs.max_peak_bytes / GIB, fit.attempts,
                   b->fp16_optimizer ? "  (fp16 Adam state)" : "");
            if (csv != NULL)
                fprintf(csv, "%s,%s,%s,%d,%d,%.6g,%.6g,%.6g,%.3f,%.0f,%d,%s\n", b->suite,
                        b->model, c->name, b->gpus, p->n_stages, p->iteration_s,
                        p->tflops_per_device, p->mfu, dt, fit.programs.max_peak_bytes,
                        fit.attempts,
                        b->fp16_optimizer ? "fp16 Adam state" : "fp32 Adam state + master");
            /* one series per suite on one kind of node (GPT-3 175B's DGX-A100 stays out) */
            if (scaling != NULL && strcmp(b->preset, P3) == 0)
                fprintf(scaling, "%s (%s),%d,%.6g,%s,%.6g\n", suite_title(b->suite), P3, b->gpus,
                        p->tflops_per_device * b->gpus, b->model, p->iteration_s);
        } else {
            printf("%-12s %-22s %5d  failed: %s (%.2f s)\n", b->model, c ? c->name : b->preset,
                   b->gpus, err.msg, dt);
        }
        fflush(stdout);
        ps_plan_free(p);
        ps_graph_free(fwd);
        ps_cluster_free(c);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("total planning time %.1f s, max RSS %ld MB\n", total, ru.ru_maxrss / 1024);
    if (csv != NULL)
        fclose(csv);
    if (scaling != NULL)
        fclose(scaling);
    return 0;
}
