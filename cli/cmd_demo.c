/* pipeshard demo: the main job on an embedded default, and the whole loop
 * (plan, simulate, execute, compare, plot) on a GPT small enough for the CPU. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

#define DEMO_STEPS 9
/* Timed steps of the CPU run that the comparison measures against: on 2
 * cores single steps of the plan took 997 to 1459 ms, medians of five 1050
 * to 1153 ms (docs/executors.md, "Step-to-step variation"). */
#define DEMO_TIMED_STEPS "5"

static void step(int i, const char *what)
{
    printf("%spipeshard demo %d/%d: %s\n\n", i > 1 ? "\n" : "", i, DEMO_STEPS, what);
    fflush(stdout);
}

static int run(int (*cmd)(int, char **), char **argv)
{
    int argc = 0;
    while (argv[argc] != NULL)
        argc++;
    int rc = cmd(argc, argv);
    fflush(stdout);
    return rc;
}

/* The small GPT of steps 5-9: 4 layers, hidden 256, fp32 (the CPU backend's
 * precision), 32 samples in 8 micro-batches, on this machine's CPU as 8
 * devices. */
#define SMALL_GPT "--model", "gpt-350m", "--layers", "4", "--hidden", "256", "--heads", "4", \
                  "--seq", "128", "--vocab", "2048", "--dtype", "fp32"

int ps_cmd_demo(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: pipeshard demo\n\n"
               "Runs the main job on an embedded default, then the whole loop on a small GPT:\n"
               "  1. the training step of the built-in GPT-2.6B (Alpa's benchmark suite);\n"
               "  2. its pipeshard plan on one p3.16xlarge node (8 V100s): demo-plan.json;\n"
               "  3. one training step of that plan simulated on a SimGrid model of the node\n"
               "     (demo-trace.json opens in Perfetto; demo-summary.json is the summary);\n"
               "  4. the CPU backend profiled with 8 devices (threads sharing this machine's\n"
               "     cores): demo-cpu-profile.json, and the cluster it measured,\n"
               "     demo-cpu-host.json (profile --cluster-out);\n"
               "  5. a 4-layer GPT (hidden 256, fp32) planned for that cluster with that\n"
               "     profile as 4 pipeline stages of 2 sharded devices (uniform dp 1 x op 2\n"
               "     x pp 4): demo-small-plan.json;\n"
               "  6. its simulation: demo-small-sim.json, demo-small-sim-trace.json, and the\n"
               "     planner's prediction demo-small-planner.json;\n"
               "  7. one step of it on the CPU backend, checked against the single-device\n"
               "     step from the same parameters and batch;\n"
               "  8. " DEMO_TIMED_STEPS
               " timed steps of it on the CPU backend after a warm-up step (the\n"
               "     summary takes each time's median over them): demo-small-exec.json,\n"
               "     demo-small-exec-trace.json (the last step);\n"
               "  9. the three compared per stage, with charts in demo-plots/ (gnuplot):\n"
               "     scatter, breakdown and the measured step's timeline.\n"
               "The planner's stage DP counts every device of the machine busy at once, an\n"
               "upper bound; the chosen plan's schedule and the simulator share the cores\n"
               "among the devices computing at each moment (docs/cluster-format.md).\n");
#ifdef PS_NO_SIMGRID
        printf("\nIn this build the simulations are skipped: %s.\n", PS_CLI_NO_SIMGRID);
#endif
        return 0;
    }
    if (argc > 1)
        return ps_cli_usage_error("demo", "takes no arguments");
    step(1, "the training step of GPT-2.6B (Alpa suite), global batch 1024 in 64 "
            "micro-batches of 16");
    int rc = run(ps_cmd_graph, (char *[]){"graph", "--model", "gpt-2.6b", "--batch", "16", NULL});
    if (rc != 0)
        return rc;
    step(2, "its pipeshard plan on one p3.16xlarge node (8 x V100-16GB), written to "
            "demo-plan.json");
    rc = run(ps_cmd_plan, (char *[]){"plan", "--model", "gpt-2.6b", "--cluster", "p3.16xlarge:1",
                                     "--micro-batches", "64", "--layer-num", "8", "--remat", "-o",
                                     "demo-plan.json", NULL});
    if (rc != 0)
        return rc;
#ifdef PS_NO_SIMGRID
    step(3, "skipped, the simulation of that plan: " PS_CLI_NO_SIMGRID);
#else
    step(3, "one training step of that plan, simulated (timeline in demo-trace.json, summary "
            "in\ndemo-summary.json)");
    rc = run(ps_cmd_sim, (char *[]){"sim", "--plan", "demo-plan.json", "--trace",
                                    "demo-trace.json", "--summary", "demo-summary.json", NULL});
    if (rc != 0)
        return rc;
#endif
    step(4, "the whole loop on this machine: the CPU backend profiled with 8 devices (threads\n"
            "sharing its cores), written to demo-cpu-profile.json, and the cluster it\n"
            "measured, demo-cpu-host.json");
    rc = run(ps_cmd_profile,
             (char *[]){"profile", "--backend", "cpu", "--devices", "8", "--quick", "-o",
                        "demo-cpu-profile.json", "--cluster-out", "demo-cpu-host.json", NULL});
    if (rc != 0)
        return rc;
    step(5, "a 4-layer GPT (hidden 256, fp32) planned for that cluster with that profile, as 4\n"
            "pipeline stages of 2 sharded devices: demo-small-plan.json");
    rc = run(ps_cmd_plan, (char *[]){"plan", SMALL_GPT, "--cluster-file", "demo-cpu-host.json",
                                     "--profile-db", "demo-cpu-profile.json", "--method",
                                     "uniform", "--dp", "1", "--op", "2", "--pp", "4",
                                     "--global-batch", "32", "--micro-batches", "8", "-o",
                                     "demo-small-plan.json", NULL});
    if (rc != 0)
        return rc;
#ifdef PS_NO_SIMGRID
    step(6, "skipped, its simulation: " PS_CLI_NO_SIMGRID);
#else
    step(6, "its simulation (demo-small-sim.json; the planner's prediction as a summary in\n"
            "demo-small-planner.json)");
    rc = run(ps_cmd_sim, (char *[]){"sim", "--plan", "demo-small-plan.json", "--summary",
                                    "demo-small-sim.json",
                                    "--predicted", "demo-small-planner.json", "--trace",
                                    "demo-small-sim-trace.json", NULL});
    if (rc != 0)
        return rc;
#endif
    step(7, "one step of it on the CPU backend, checked against the single-device step");
    rc = run(ps_cmd_exec, (char *[]){"exec", "--plan", "demo-small-plan.json", "--backend", "cpu",
                                     "--check", NULL});
    if (rc != 0)
        return rc;
    /* the check runs one step: after 2 to 5 the sharded and the single-device
     * gradients were 5e-5 to 9e-5 apart (relative), near its 1e-4 tolerance,
     * against 5e-6 after one */
    step(8, DEMO_TIMED_STEPS " timed steps of it on the CPU backend, the measurement compared "
                             "next (each time\nthe median over the steps: demo-small-exec.json; "
                             "the last step's timeline:\ndemo-small-exec-trace.json)");
    rc = run(ps_cmd_exec,
             (char *[]){"exec", "--plan", "demo-small-plan.json", "--backend", "cpu", "--steps",
                        DEMO_TIMED_STEPS, "--summary", "demo-small-exec.json", "--trace",
                        "demo-small-exec-trace.json", NULL});
    if (rc != 0)
        return rc;
#ifdef PS_NO_SIMGRID
    step(9, "skipped, the comparison with the predictions: they come from `pipeshard sim`, "
            "and " PS_CLI_NO_SIMGRID);
    return 0;
#else
    step(9, "the planner, the simulator and the CPU measurement compared per stage; charts "
            "in demo-plots/\n(scatter, breakdown, and the timeline of the measured step)");
    rc = run(ps_cmd_compare, (char *[]){"compare", "demo-small-planner.json",
                                        "demo-small-sim.json", "demo-small-exec.json", "--plot",
                                        "demo-plots", NULL});
    if (rc != 0) { /* the charts need gnuplot: the table alone */
        printf("\n(no charts: see the message above)\n\n");
        return run(ps_cmd_compare, (char *[]){"compare", "demo-small-planner.json",
                                              "demo-small-sim.json", "demo-small-exec.json",
                                              NULL});
    }
    /* and the measured iteration, device by device */
    return run(ps_cmd_plot, (char *[]){"plot", "--timeline", "demo-small-exec-trace.json", "-o",
                                       "demo-plots", NULL});
#endif
}
