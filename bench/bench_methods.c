/* Plan quality on the simulator: Alpa's automatic plan against the best
 * uniform 3-D plan found by grid search over (dp, op, pp, micro-batches)
 * (the Megatron-LM-style baseline of Alpa's evaluation) and against the
 * one-stage data, ZeRO-2 and ZeRO-3 plans (each at its best micro-batch
 * count), every plan simulated on the same SimGrid model of the cluster
 * (p3.16xlarge V100 nodes; the global batch of the case). The automatic
 * plan chooses its micro-batch count as `--micro-batches auto`.
 *
 *   bench_methods [--quick] [--case MODEL@GPUS] [--remat[=auto]] [--time-limit S]
 *                 [--csv FILE]
 *
 * Remat is off by default: it recomputes every clustered layer but the last,
 * so a uniform plan of pp stages (clustered into pp layers) recomputes a
 * different share of the model than the automatic plan's 8 layers, and a
 * one-stage uniform plan none at all; --remat compares them anyway.
 * --remat=auto gives each method its best: the automatic plan chooses by
 * stage (pipeshard plan --remat=auto), every other plan is tried both with
 * and without remat.
 * --quick: the cases up to 4 GPUs; --case: one case; --time-limit: the
 * ILP's limit per solve (default 10 s); --csv FILE: one row per plan.
 * Prints one table per case; the last line is the headline: the geometric
 * mean over the cases of the best uniform plan's simulated iteration time
 * over the automatic plan's (above 1: the automatic plan is faster). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench/bench_common.h"
#include "core/bytes_text.h"
#include "core/malloc_tune.h"
#include "core/program.h"
#include "planner/inter_pass.h"
#include "planner/lower.h"
#include "planner/plan_model.h"
#include "sim/sim.h"

typedef struct bench_case {
    const char *model;
    int gpus, global_batch;
    int layer_num;
    bool quick;
} bench_case;

/* Alpa's weak-scaling sizes at 4, 8 and 16 V100s (one node's slice, one
 * node, two nodes over 25 Gbit/s). */
static const bench_case cases[] = {
    {"gpt-1.3b", 4, 1024, 8, true},    {"moe-1.3b", 4, 1024, 8, true},
    {"gpt-2.6b", 8, 1024, 8, false},   {"moe-2.4b", 8, 1024, 8, false},
    {"wresnet-2b", 8, 1536, 8, false}, {"gpt-6.7b", 16, 1024, 8, false},
};

/* The micro-batch counts of the grids (uniform and one-stage plans); the
 * automatic plan searches the divisors of the global batch up to 128 itself. */
static const int grid_micro_batches[] = {16, 32, 64, 128};
#define N_GRID_MB ((int)(sizeof grid_micro_batches / sizeof grid_micro_batches[0]))

typedef enum { KIND_AUTO, KIND_UNIFORM, KIND_DATA, KIND_ZERO2, KIND_ZERO3 } plan_kind;
static const char *const kind_names[] = {"auto", "uniform", "data", "zero2", "zero3"};

/* One planned and simulated plan. */
typedef struct outcome {
    plan_kind kind;
    int dp, op, pp, micro_batches;
    bool remat; /* every layer but the loss's recomputed (the automatic plan: see remat_mode) */
    ps_status status;
    char why[PS_ERROR_MSG_MAX];
    double plan_s, planned_s, simulated_s, sim_tflops;
    int stages;
} outcome;

typedef enum { REMAT_OFF, REMAT_ON, REMAT_AUTO } remat_choice;
static const char *const remat_names[] = {"off", "on", "auto"};
static remat_choice remat_mode = REMAT_OFF;

/* Plans one configuration and simulates it. */
static void plan_and_simulate(const bench_case *b, const ps_cluster *c, double time_limit_s,
                              outcome *r)
{
    ps_error err = {0};
    ps_graph *fwd = NULL;
    ps_plan *p = NULL;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_summary *sum = NULL;
    ps_model_config cfg;
    ps_status st = PS_OK;
    double t0 = ps_monotonic_s();
    PS_TRY(ps_zoo_lookup(b->model, &cfg, &err));
    cfg.batch = b->global_batch / r->micro_batches;
    PS_TRY(ps_model_build(&cfg, &fwd, &err));
    ps_plan_request req = {.forward = fwd,
                           .config = &cfg,
                           .train = ps_train_options_default(),
                           .cluster = c,
                           .global_batch = b->global_batch,
                           .micro_batches = r->micro_batches,
                           .ilp = ps_ilp_options_default()};
    req.train.remat = r->remat;
    req.ilp.time_limit_s = time_limit_s;
    ps_inter_options io = ps_inter_options_default();
    io.layer_num = b->layer_num;
    io.remat_by_stage = r->kind == KIND_AUTO && remat_mode == REMAT_AUTO;
    switch (r->kind) {
    case KIND_AUTO: /* Alpa's plan, choosing the micro-batches too */
        st = ps_plan_pipeshard_search(&req, &io, &p, &err);
        if (st == PS_OK)
            r->micro_batches = p->micro_batches;
        break;
    case KIND_UNIFORM:
        req.method = PS_METHOD_SHARD;
        io.layer_num = 0; /* the uniform plan clusters into pp layers itself */
        st = ps_plan_uniform(&req, &io, r->dp, r->op, r->pp, &p, &err);
        break;
    default:
        req.method = r->kind == KIND_DATA    ? PS_METHOD_DATA
                     : r->kind == KIND_ZERO2 ? PS_METHOD_ZERO2
                                             : PS_METHOD_ZERO3;
        st = ps_plan_one_stage(&req, &p, NULL, NULL, &err);
        break;
    }
    r->plan_s = ps_monotonic_s() - t0;
    if (st != PS_OK)
        goto out;
    /* a uniform or manual stage that the intra-op pass could not fit is
     * written with a warning (the user asked for it); here it does not fit */
    double memory = ps_cluster_min_memory_bytes(c);
    if (p->peak_memory_bytes > memory) {
        st = ps_error_set(&err, PS_ERR_INFEASIBLE, "needs %.4g GiB per device of %.4g GiB",
                          p->peak_memory_bytes / PS_GIB, memory / PS_GIB);
        goto out;
    }
    r->planned_s = p->iteration_s;
    r->stages = p->n_stages;
    ps_lower_options lo = ps_lower_options_default();
    PS_TRY(ps_plan_model_build(p, &m, &err));
    PS_TRY(ps_plan_lower(p, m, &lo, &set, &err));
    ps_sim_options so = ps_sim_options_default();
    ps_sim_stats stats;
    PS_TRY(ps_sim_run(set, c, &so, &sum, &stats, &err));
    /* the programs' own peak, which the planner's estimate is at or a few
     * percent above, decides too (pipeshard plan checks it the same way) */
    if (sum->peak_memory_bytes > memory) {
        st = ps_error_set(&err, PS_ERR_INFEASIBLE,
                          "its programs need %.4g GiB per device of %.4g GiB (planned %.4g GiB)",
                          sum->peak_memory_bytes / PS_GIB, memory / PS_GIB,
                          p->peak_memory_bytes / PS_GIB);
        goto out;
    }
    r->simulated_s = sum->iteration_s;
    r->sim_tflops = sum->tflops_per_device;
out:
    r->status = st;
    if (st != PS_OK)
        snprintf(r->why, sizeof r->why, "%s", err.msg);
    ps_summary_free(sum);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);
    ps_graph_free(fwd);
}

static void describe(const outcome *r, char *buf, size_t size)
{
    const char *remat = r->remat ? " remat" : "";
    if (r->kind == KIND_AUTO && remat_mode == REMAT_AUTO)
        remat = " remat=auto";
    if (r->kind == KIND_UNIFORM)
        snprintf(buf, size, "uniform dp%d op%d pp%d%s", r->dp, r->op, r->pp, remat);
    else
        snprintf(buf, size, "%s%s", kind_names[r->kind], remat);
}

/* The CSV's remat column: none, all, or by-stage (the automatic plan's choice). */
static const char *remat_of(const outcome *r)
{
    if (r->kind == KIND_AUTO && remat_mode == REMAT_AUTO)
        return "by-stage";
    return r->remat ? "all" : "none";
}

static void print_row(const outcome *r, FILE *csv, const bench_case *b)
{
    char name[48];
    describe(r, name, sizeof name);
    if (r->status == PS_OK)
        printf("  %-22s %5d %6d %10.4g %10.4g %9.4g %8.1f\n", name, r->micro_batches, r->stages,
               r->planned_s, r->simulated_s, r->sim_tflops, r->plan_s);
    else
        printf("  %-22s %5d  %s\n", name, r->micro_batches,
               r->status == PS_ERR_INFEASIBLE ? "does not fit in memory" : r->why);
    if (csv != NULL)
        fprintf(csv, "%s,%d,%s,%d,%d,%d,%d,%s,%s,%.6g,%.6g,%.6g,%.3f\n", b->model, b->gpus,
                kind_names[r->kind], r->dp, r->op, r->pp, r->micro_batches, remat_of(r),
                r->status == PS_OK ? "ok" : r->status == PS_ERR_INFEASIBLE ? "oom" : "failed",
                r->planned_s, r->simulated_s, r->sim_tflops, r->plan_s);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    ps_malloc_tune(argv); /* the allocator the CLI runs with */
    bool quick = false;
    const char *only = NULL;
    double time_limit_s = 10;
    FILE *csv = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = true;
        } else if (strcmp(argv[i], "--remat") == 0) {
            remat_mode = REMAT_ON;
        } else if (strcmp(argv[i], "--remat=auto") == 0) {
            remat_mode = REMAT_AUTO;
        } else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else if (strcmp(argv[i], "--time-limit") == 0 && i + 1 < argc) {
            time_limit_s = atof(argv[++i]);
            if (!(time_limit_s > 0)) {
                fprintf(stderr, "bench_methods: --time-limit needs seconds > 0\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
            csv = fopen(argv[++i], "w");
            if (csv == NULL) {
                perror(argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: bench_methods [--quick] [--case MODEL@GPUS] "
                            "[--remat[=auto]] [--time-limit S] [--csv FILE]\n");
            return 2;
        }
    }
    if (csv != NULL) {
        char machine[600];
        machine_describe(machine, sizeof machine);
        fprintf(csv, "# bench_methods, simulated on SimGrid, p3.16xlarge, remat %s; machine: %s\n",
                remat_names[remat_mode], machine);
        fprintf(csv, "model,gpus,method,dp,op,pp,micro_batches,remat,status,planned_iteration_s,"
                     "simulated_iteration_s,simulated_tflops_per_device,plan_s\n");
    }
    int n_cases = (int)(sizeof cases / sizeof cases[0]), done = 0;
    double log_ratio = 0;
    for (int i = 0; i < n_cases; i++) {
        const bench_case *b = &cases[i];
        char label[64];
        snprintf(label, sizeof label, "%s@%d", b->model, b->gpus);
        if ((quick && !b->quick) || (only != NULL && strcmp(only, label) != 0))
            continue;
        ps_error err = {0};
        ps_cluster *c = NULL;
        if (bench_cluster_slice("p3.16xlarge", b->gpus, &c, &err) != PS_OK) {
            fprintf(stderr, "bench_methods: %s\n", err.msg);
            return 1;
        }
        printf("%s on %s, global batch %d, remat %s\n", b->model, c->name, b->global_batch,
               remat_names[remat_mode]);
        printf("  %-22s %5s %6s %10s %10s %9s %8s\n", "plan", "mb", "stages", "planned_s",
               "simulated", "TFLOP/s", "plan_s");
        outcome best_uniform = {.kind = KIND_UNIFORM, .status = PS_ERR_INFEASIBLE},
                automatic = {.kind = KIND_AUTO, .status = PS_ERR_INFEASIBLE};
        outcome best_one[KIND_ZERO3 + 1];
        /* the automatic plan, then the one-stage plans at every micro-batch count */
        automatic.kind = KIND_AUTO;
        automatic.micro_batches = grid_micro_batches[0];
        automatic.remat = remat_mode == REMAT_ON;
        /* the other plans: remat as asked, or (auto) both ways */
        int remat_first = remat_mode == REMAT_ON, remat_last = remat_mode != REMAT_OFF;
        plan_and_simulate(b, c, time_limit_s, &automatic);
        print_row(&automatic, csv, b);
        for (int k = KIND_DATA; k <= KIND_ZERO3; k++) {
            best_one[k] = (outcome){.kind = (plan_kind)k, .status = PS_ERR_INFEASIBLE};
            for (int q = 0; q < N_GRID_MB; q++)
                for (int rm = remat_first; rm <= remat_last; rm++) {
                    outcome r = {
                        .kind = (plan_kind)k, .micro_batches = grid_micro_batches[q], .remat = rm};
                    if (b->global_batch % r.micro_batches != 0 ||
                        (b->global_batch / r.micro_batches) % b->gpus != 0)
                        continue;
                    plan_and_simulate(b, c, time_limit_s, &r);
                    print_row(&r, csv, b);
                    if (r.status == PS_OK &&
                        (best_one[k].status != PS_OK || r.simulated_s < best_one[k].simulated_s))
                        best_one[k] = r;
                }
        }
        /* the uniform grid: every dp x op x pp = gpus, every micro-batch count
         * whose micro-batch splits over dp */
        int tried = 0, fit = 0;
        for (int pp = 1; pp <= b->gpus; pp++)
            for (int op = 1; op * pp <= b->gpus; op++) {
                if (b->gpus % (op * pp) != 0)
                    continue;
                int dp = b->gpus / (op * pp);
                for (int q = 0; q < N_GRID_MB; q++)
                    for (int rm = remat_first; rm <= remat_last; rm++) {
                        int mb = grid_micro_batches[q];
                        if (b->global_batch % mb != 0 || (b->global_batch / mb) % dp != 0 ||
                            mb < pp)
                            continue;
                        outcome r = {.kind = KIND_UNIFORM,
                                     .dp = dp,
                                     .op = op,
                                     .pp = pp,
                                     .micro_batches = mb,
                                     .remat = rm};
                        plan_and_simulate(b, c, time_limit_s, &r);
                        print_row(&r, csv, b);
                        tried++;
                        if (r.status != PS_OK)
                            continue;
                        fit++;
                        if (best_uniform.status != PS_OK ||
                            r.simulated_s < best_uniform.simulated_s)
                            best_uniform = r;
                    }
            }
        printf("  best of each, simulated iteration (s):");
        const outcome *bests[] = {&automatic, &best_uniform, &best_one[KIND_DATA],
                                  &best_one[KIND_ZERO2], &best_one[KIND_ZERO3]};
        for (int k = 0; k < 5; k++) {
            char name[48];
            describe(bests[k], name, sizeof name);
            if (bests[k]->status == PS_OK)
                printf(" %s %.4g (%d mb)%s", name, bests[k]->simulated_s, bests[k]->micro_batches,
                       k < 4 ? ";" : "");
            else
                printf(" %s does not fit%s", kind_names[k], k < 4 ? ";" : "");
        }
        printf("\n");
        if (csv != NULL)
            for (int k = 0; k < 5; k++)
                if (bests[k]->status == PS_OK)
                    fprintf(csv, "%s,%d,best-%s,%d,%d,%d,%d,%s,ok,%.6g,%.6g,%.6g,%.3f\n",
                            b->model, b->gpus, kind_names[k], bests[k]->dp, bests[k]->op,
                            bests[k]->pp, bests[k]->micro_batches, remat_of(bests[k]),
                            bests[k]->planned_s,
                            bests[k]->simulated_s, bests[k]->sim_tflops, bests[k]->plan_s);
        if (automatic.status == PS_OK && best_uniform.status == PS_OK) {
            double ratio = best_uniform.simulated_s / automatic.simulated_s;
            printf("  => auto is %.2fx the best uniform plan's speed (%d of %d uniform plans "
                   "fit)\n\n",
                   ratio, fit, tried);
            log_ratio += log(ratio);
            done++;
        } else {
            printf("  => no comparison (auto %s, %d of %d uniform plans fit)\n\n",
                   automatic.status == PS_OK ? "ok" : "failed", fit, tried);
        }
        ps_cluster_free(c);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (csv != NULL)
        fclose(csv);
    if (done == 0) {
        printf("no case compared\n");
        return 1;
    }
    printf("auto vs best uniform plan, simulated: %.3fx faster (geometric mean over %d cases), "
           "max RSS %ld MB\n",
           exp(log_ratio / done), done, ru.ru_maxrss / 1024);
    return 0;
}
