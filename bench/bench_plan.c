/* Planning wall time and predicted throughput for Alpa's GPT suite on its GPU
 * counts (p3.16xlarge V100 nodes; 1-4 GPUs are one node's slice) and GPT-3
 * 175B on 128 DGX-A100 nodes. Global batch 1024 (1536 for 175B) in 64
 * micro-batches (128 for 175B), remat on, 8 clustered layers (16 for 175B).
 * One row per case; the last line is the headline (total planning time).
 * --quick: the cases up to 8 GPUs; --csv FILE also writes the rows as CSV. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "planner/inter_pass.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct bench_case {
    const char *model, *preset;
    int gpus, global_batch, micro_batches, layer_num;
} bench_case;

static const bench_case cases[] = {
    {"gpt-350m", "p3.16xlarge", 1, 1024, 64, 8},  {"gpt-760m", "p3.16xlarge", 2, 1024, 64, 8},
    {"gpt-1.3b", "p3.16xlarge", 4, 1024, 64, 8},  {"gpt-2.6b", "p3.16xlarge", 8, 1024, 64, 8},
    {"gpt-6.7b", "p3.16xlarge", 16, 1024, 64, 8}, {"gpt-15b", "p3.16xlarge", 32, 1024, 64, 8},
    {"gpt-39b", "p3.16xlarge", 64, 1024, 64, 8},  {"gpt-175b", "dgx-a100", 1024, 1536, 128, 16},
};

/* The preset's node, sliced to fewer devices when the case needs under one node. */
static ps_status cluster_for(const bench_case *b, ps_cluster **out, ps_error *err)
{
    ps_cluster *node = NULL;
    ps_status st = ps_cluster_from_preset(b->preset, &node, err);
    if (st != PS_OK)
        return st;
    int per_node = b->gpus < node->devices_per_node ? b->gpus : node->devices_per_node;
    int nodes = b->gpus / per_node;
    char name[64];
    snprintf(name, sizeof name, "%s:%dx%d", b->preset, nodes, per_node);
    st = ps_cluster_create(name, nodes, per_node, &node->kinds[0], &node->intra, &node->inter,
                           out, err);
    ps_cluster_free(node);
    return st;
}

int main(int argc, char **argv)
{
    bool quick = false;
    FILE *csv = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc)
            csv = fopen(argv[++i], "w");
    }
    if (csv != NULL)
        fprintf(csv, "model,cluster,gpus,stages,iteration_s,tflops_per_device,mfu,plan_s\n");
    printf("%-9s %-22s %5s %6s %10s %9s %6s %9s\n", "model", "cluster", "gpus", "stages",
           "iter_s", "TFLOP/s", "mfu", "plan_s");
    double total = 0;
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        const bench_case *b = &cases[i];
        if (quick && b->gpus > 8)
            continue;
        ps_error err = {0};
        ps_cluster *c = NULL;
        ps_graph *fwd = NULL;
        ps_plan *p = NULL;
        ps_model_config cfg;
        double t0 = now_s();
        ps_status st = cluster_for(b, &c, &err);
        if (st == PS_OK)
            st = ps_zoo_lookup(b->model, &cfg, &err);
        if (st == PS_OK) {
            cfg.batch = b->global_batch / b->micro_batches;
            st = ps_model_build(&cfg, &fwd, &err);
        }
        if (st == PS_OK) {
            ps_plan_request req = {.forward = fwd, .config = &cfg,
                                   .train = ps_train_options_default(), .cluster = c,
                                   .global_batch = b->global_batch,
                                   .micro_batches = b->micro_batches,
                                   .ilp = ps_ilp_options_default()};
            req.train.remat = true;
            ps_inter_options o = ps_inter_options_default();
            o.layer_num = b->layer_num;
            st = ps_plan_pipeshard(&req, &o, &p, &err);
        }
        double dt = now_s() - t0;
        total += dt;
        if (st == PS_OK) {
            printf("%-9s %-22s %5d %6d %10.4g %9.4g %5.1f%% %9.2f\n", b->model, c->name, b->gpus,
                   p->n_stages, p->iteration_s, p->tflops_per_device, p->mfu * 100, dt);
            if (csv != NULL)
                fprintf(csv, "%s,%s,%d,%d,%.6g,%.6g,%.6g,%.3f\n", b->model, c->name, b->gpus,
                        p->n_stages, p->iteration_s, p->tflops_per_device, p->mfu, dt);
        } else {
            printf("%-9s %-22s %5d  failed: %s (%.2f s)\n", b->model, c ? c->name : b->preset,
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
    return 0;
}
