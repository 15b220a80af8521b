/* pipeshard demo: the main job on an embedded default. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int ps_cmd_demo(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: pipeshard demo\n\nRuns the main job on an embedded default: the training "
               "step of the built-in\nGPT-2.6B (Alpa's benchmark suite), then its pipeshard plan "
               "on one p3.16xlarge\nnode (8 V100s), written to demo-plan.json, then one training "
               "step of that plan\nsimulated on a SimGrid model of the node (demo-trace.json opens "
               "in Perfetto;\ndemo-summary.json is the run summary).\n");
#ifdef PS_NO_SIMGRID
        printf("\nIn this build the simulation is skipped: %s.\n", PS_CLI_NO_SIMGRID);
#endif
        return 0;
    }
    if (argc > 1)
        return ps_cli_usage_error("demo", "takes no arguments");
    printf("pipeshard demo 1/3: the training step of GPT-2.6B (Alpa suite), global batch 1024 "
           "in 64 micro-batches of 16\n\n");
    fflush(stdout);
    char *graph[] = {"graph", "--model", "gpt-2.6b", "--batch", "16", NULL};
    int rc = ps_cmd_graph(5, graph);
    if (rc != 0)
        return rc;
    printf("\npipeshard demo 2/3: its pipeshard plan on one p3.16xlarge node (8 x V100-16GB), "
           "written to demo-plan.json\n\n");
    fflush(stdout);
    char *plan[] = {"plan",     "--model",         "gpt-2.6b", "--cluster", "p3.16xlarge:1",
                    "--micro-batches", "64",       "--layer-num", "8",      "--remat",
                    "-o",       "demo-plan.json",  NULL};
    rc = ps_cmd_plan(12, plan);
    if (rc != 0)
        return rc;
#ifdef PS_NO_SIMGRID
    printf("\npipeshard demo 3/3: skipped, the simulation of that plan: %s\n", PS_CLI_NO_SIMGRID);
    return 0;
#else
    printf("\npipeshard demo 3/3: one training step of that plan, simulated (timeline in "
           "demo-trace.json,\nsummary in demo-summary.json)\n\n");
    fflush(stdout);
    char *sim[] = {"sim", "--plan", "demo-plan.json", "--trace", "demo-trace.json",
                   "--summary", "demo-summary.json", NULL};
    return ps_cmd_sim(7, sim);
#endif
}
