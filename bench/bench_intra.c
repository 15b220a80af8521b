/* Intra-op ILP size and solve time for GPT stages on 8-device logical
 * meshes. Prints one row per (model, layers, mesh, budget); "f" marks a 2-D
 * mesh with the batch forced onto axis 0. Each is solved without a memory
 * budget, then with one halfway between the least memory any layout needs
 * and the unconstrained answer's (the memory is priced first, then GLPK
 * solves with its knapsack row where a gap remains). The last lines are
 * the headline: the slowest one-layer and whole-stage solves, each way.
 *
 *   bench_intra [--quick] [--csv FILE]
 *
 * --quick: one layer only; --csv: the rows as CSV, after a comment line with
 * the machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_common.h"
#include "core/malloc_tune.h"
#include "planner/intra_pass.h"
#include "planner/models/zoo.h"
#include "planner/train_step.h"

static FILE *csv; /* --csv, or NULL */

/* Solves one (model, layers, mesh): without a budget, then with the one
 * halfway to the least memory; the solve times in solve_s[2]. */
static int run(const char *model, int layers, int batch, int d0, int d1, bool force,
               double *solve_s)
{
    ps_model_config cfg;
    ps_error err = {0};
    ps_graph *fwd = NULL, *step = NULL;
    ps_cluster *c = NULL;
    ps_logical_mesh *m = NULL;
    ps_intra_result *r = NULL;
    int rc = 1;
    if (ps_zoo_lookup(model, &cfg, &err) != PS_OK)
        goto out;
    if (layers > 0)
        cfg.layers = layers;
    cfg.batch = batch;
    if (ps_model_build(&cfg, &fwd, &err) != PS_OK)
        goto out;
    ps_train_options o = ps_train_options_default();
    if (ps_train_step_build(fwd, &o, &step, &err) != PS_OK)
        goto out;
    if (ps_cluster_from_preset("p3.16xlarge:1", &c, &err) != PS_OK)
        goto out;
    if (ps_mesh_create(c, 0, 1, 8, d0, d1, &m, &err) != PS_OK)
        goto out;
    ps_intra_options io = ps_intra_options_default();
    io.force_batch_axis0 = force;
    io.ilp.time_limit_s = 60;
    io.ilp.mip_gap = 0.01;
    for (int with_budget = 0; with_budget < 2; with_budget++) {
        if (with_budget) {
            io.memory_budget_bytes = 0.5 * (r->min_memory_bytes + r->peak_memory_bytes);
            ps_intra_result_free(r);
            r = NULL;
        }
        double t0 = ps_monotonic_s();
        if (ps_intra_solve(step, m, &io, &r, &err) != PS_OK)
            goto out;
        solve_s[with_budget] = ps_monotonic_s() - t0;
        char budget[32] = "-";
        if (with_budget)
            snprintf(budget, sizeof budget, "%.3f", io.memory_budget_bytes / 1e9);
        printf("%-9s %6d %6d  (%d,%d)%s %7s %7d %7d %9.0f %7d %7d %8d %8d  %-10s %-3s %8.4f  "
               "%9.3f\n",
               model, (int)cfg.layers, step->n_ops, d0, d1, force ? "f" : " ", budget,
               r->ilp_nodes, r->ilp_edges, r->strategies_total, r->ilp.reduced_nodes,
               r->ilp.reduced_edges, r->ilp.glpk_cols, r->ilp.glpk_rows, r->ilp.method,
               r->ilp.optimal ? "yes" : "no", r->ilp.gap, solve_s[with_budget]);
        fflush(stdout);
        if (csv != NULL)
            fprintf(csv, "%s,%d,%d,%dx%d,%d,%.0f,%d,%d,%.0f,%d,%d,%d,%d,%s,%d,%.6g,%.6g,%.6g\n",
                    model, (int)cfg.layers, step->n_ops, d0, d1, force, io.memory_budget_bytes,
                    r->ilp_nodes, r->ilp_edges, r->strategies_total, r->ilp.reduced_nodes,
                    r->ilp.reduced_edges, r->ilp.glpk_cols, r->ilp.glpk_rows, r->ilp.method,
                    r->ilp.optimal, r->ilp.gap, r->objective_s, solve_s[with_budget]);
    }
    rc = 0;
out:
    if (rc != 0)
        fprintf(stderr, "bench_intra: %s\n", err.msg);
    ps_intra_result_free(r);
    ps_mesh_free(m);
    ps_cluster_free(c);
    ps_graph_free(step);
    ps_graph_free(fwd);
    return rc;
}

int main(int argc, char **argv)
{
    ps_malloc_tune(argv); /* the allocator the CLI runs with */
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = true; /* one layer only (for CI smoke runs) */
        } else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc && csv == NULL) {
            csv = fopen(argv[++i], "w");
            if (csv == NULL) {
                fprintf(stderr, "bench_intra: cannot write %s\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: bench_intra [--quick] [--csv FILE]\n");
            return 2;
        }
    }
    if (csv != NULL) {
        char machine[600];
        machine_describe(machine, sizeof machine);
        fprintf(csv,
                "# bench_intra: the intra-op ILP of GPT-2.6B stages on 8-device meshes, "
                "GLPK time limit 60 s, MIP gap 1%%; machine: %s\n"
                "model,layers,ops,mesh,batch_axis0_forced,memory_budget_bytes,nodes,edges,"
                "strategies,reduced_nodes,"
                "reduced_edges,glpk_cols,glpk_rows,method,optimal,gap,objective_s,solve_s\n",
                machine);
    }
    static const int meshes[3][2] = {{1, 8}, {2, 4}, {8, 1}};
    printf("%-9s %6s %6s  %-6s %7s %7s %7s %9s %7s %7s %8s %8s  %-10s %-3s %8s  %9s\n", "model",
           "layers", "ops", "mesh", "GB", "nodes", "edges", "strategies", "r.nodes", "r.edges",
           "cols", "rows", "method", "opt", "gap", "solve_s");
    double worst_layer[2] = {0, 0}, worst_stage[2] = {0, 0}, s[2];
    /* 2-D meshes run twice: batch forced onto axis 0 (f, Alpa's default) and free */
    for (int layers = 1; layers >= 0; layers--) {
        if (quick && layers == 0)
            break;
        for (int i = 0; i < 3; i++) {
            for (int force = 1; force >= 0; force--) {
                bool two_d = meshes[i][0] > 1 && meshes[i][1] > 1;
                if (force && !two_d)
                    continue;
                if (run("gpt-2.6b", layers, 8, meshes[i][0], meshes[i][1], force, s) != 0)
                    return 1;
                double *worst = layers == 1 ? worst_layer : worst_stage;
                for (int b = 0; b < 2; b++)
                    worst[b] = s[b] > worst[b] ? s[b] : worst[b];
            }
        }
    }
    printf("slowest solve: one GPT-2.6B layer %.3f s, whole 32-layer stage %.3f s\n",
           worst_layer[0], worst_stage[0]);
    printf("slowest solve within a memory budget: one layer %.3f s, whole stage %.3f s\n",
           worst_layer[1], worst_stage[1]);
    if (csv != NULL && fclose(csv) != 0) {
        fprintf(stderr, "bench_intra: could not write the CSV\n");
        return 2;
    }
    return 0;
}
