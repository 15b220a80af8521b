/* pipeshard: the command line. Dispatches to one subcommand per file. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/malloc_tune.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"models", ps_cmd_models, "list the built-in models"},
    {"clusters", ps_cmd_clusters, "list cluster presets, or show one cluster"},
    {"graph", ps_cmd_graph, "parameters, FLOPs and memory of a model's training step"},
    {"plan", ps_cmd_plan, "plan a model's parallelization on a cluster"},
#ifdef PS_NO_SIMGRID
    {"sim", ps_cmd_sim, "simulate a plan (not in this build: no SimGrid)"},
#else
    {"sim", ps_cmd_sim, "simulate a plan on a SimGrid model of its cluster"},
#endif
    {"predict", ps_cmd_predict, "the planner's prediction of a plan: summary and timeline"},
    {"exec", ps_cmd_exec, "run a plan's programs on the CPU or GPUs (measured)"},
    {"profile", ps_cmd_profile, "measure GEMMs and collectives into a profile DB"},
    {"compare", ps_cmd_compare, "run summaries of one plan side by side, with errors per stage"},
    {"plot", ps_cmd_plot, "charts of a timeline or a scaling CSV (gnuplot)"},
    {"demo", ps_cmd_demo, "the main job on an embedded default"},
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: pipeshard COMMAND [OPTIONS]\n\n"
               "pipeshard plans, simulates and runs Alpa-style pipeshard parallel training.\n\n"
               "commands:\n");
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nRun 'pipeshard COMMAND --help' for the options of a command.\n");
}

int main(int argc, char **argv)
{
    ps_malloc_tune(argv);
    (void)ps_log_enabled(PS_LOG_LEVEL_ERROR); /* reads PIPESHARD_LOG: a bad value is said now */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("pipeshard 0.1.0\n");
        return 0;
    }
    for (int i = 0; i < N_COMMANDS; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "pipeshard: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 2;
}
