/* Intra-op ILP size and solve time for GPT stages on 8-device logical
 * meshes. Prints one row per (model, layers, mesh); "f" marks a 2-D mesh with
 * the batch forced onto axis 0. The last line is the headline: the slowest
 * one-layer and whole-stage solves.
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
    double t0 = ps_monotonic_s();
    if (ps_intra_solve(step, m, &io, &r, &err) != PS_OK)
        goto out;
    *solve_s = ps_monotonic_s() - t0;
    printf("%-9s %6d %6d  (%d,%d)%s %7d %7d %9.0f %7d %7d %8d %8d  %-9s %-3s %8.4f  %9.3f\n",
           model, (int)cfg.layers, step->n_ops, d0, d1, force ? "f" : " ", r->ilp_nodes, r->ilp_edges,
           r->strategies_total, r->ilp.reduced_nodes, r->ilp.reduced_edges, r->ilp.glpk_cols,
           r->ilp.glpk_rows, r->ilp.method, r->ilp.optimal ? "yes" : "no", r->ilp.gap,
           *solve_s);
    fflush(stdout);
    if (csv != NULL)
        fprintf(csv, "%s,%d,%d,%dx%d,%d,%d,%d,%.0f,%d,%d,%d,%d,%s,%d,%.6g,%.6g,%.6g\n", model,
                (int)cfg.layers, step->n_ops, d0, d1, force, r->ilp_nodes, r->ilp_edges,
                r->strategies_total, r->ilp.reduced_nodes, r->ilp.reduced_edges, r->ilp.glpk_cols,
                r->ilp.glpk_rows, r->ilp.method, r->ilp.optimal, r->ilp.gap, r->objective_s,
                *solve_s);
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
                "model,layers,ops,mesh,batch_axis0_forced,nodes,edges,strategies,reduced_nodes,"
                "reduced_edges,glpk_cols,glpk_rows,method,optimal,gap,objective_s,solve_s\n",
                machine);
    }
    static const int meshes[3][2] = {{1, 8}, {2, 4}, {8, 1}};
    printf("%-9s %6s %6s  %-6s %7s %7s %9s %7s %7s %8s %8s  %-9s %-3s %8s  %9s\n", "model",
           "layers", "ops", "mesh", "nodes", "edges", "strategies", "r.nodes", "r.edges",
           "cols", "rows", "method", "opt", "gap", "solve_s");
    double worst_layer = 0, worst_stage = 0, s;
    /* 2-D meshes run twice: batch forced onto axis 0 (f, Alpa's default) and free */
    for (int layers = 1; layers >= 0; layers--) {
        if (quick && layers == 0)
            break;
        for (int i = 0; i < 3; i++) {
            for (int force = 1; force >= 0; force--) {
                bool two_d = meshes[i][0] > 1 && meshes[i][1] > 1;
                if (force && !two_d)
                    continue;
                if (run("gpt-2.6b", layers, 8, meshes[i][0], meshes[i][1], force, &s) != 0)
                    return 1;
                double *worst = layers == 1 ? &worst_layer : &worst_stage;
                *worst = s > *worst ? s : *worst;
            }
        }
    }
    printf("slowest solve: one GPT-2.6B layer %.3f s, whole 32-layer stage %.3f s\n", worst_layer,
           worst_stage);
    if (csv != NULL && fclose(csv) != 0) {
        fprintf(stderr, "bench_intra: could not write the CSV\n");
        return 2;
    }
    return 0;
}
