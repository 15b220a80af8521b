/* pipeshard sim: replay a plan's per-device programs in the SimGrid model
 * of its cluster. */
#include <getopt.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/bytes_text.h"
#include "core/json.h"
#include "core/log.h"
#include "core/program.h"
#include "planner/lower.h"
#include "sim/sim.h"
#include "traces/plan_summary.h"

static void help(void)
{
    printf("usage: pipeshard sim --plan PLAN.json [--trace T.json] [--summary S.json]\n"
           "                     [--collective-steps]\n"
           "                     [--node-collectives flows|transfers|closed-form]\n"
           "                     [--no-local-allgather] [--no-check]\n"
           "                     [--predicted P.json]\n"
           "                     [--dump-programs DIR] [--json]\n\n"
           "Lowers the plan to per-device programs and replays one training step of them\n"
           "on a SimGrid model of the plan's cluster (docs/simulator.md). Prints the\n"
           "simulated iteration, per-stage times and memory beside the planner's. Kernels\n"
           "take the times the plan carries per op (its planner's, with the profile DB it\n"
           "was made with, if any); communication is simulated on the cluster's links.\n\n"
           "options:\n"
           "  --plan P.json          the plan (pipeshard plan -o)\n"
           "  --trace T.json         Chrome trace of the step (Perfetto, chrome://tracing)\n"
           "  --summary S.json       the run summary (docs/trace-format.md)\n"
           "  --predicted P.json     also write the planner's prediction as a summary\n"
           "  --collective-steps     send every ring step separately (slower, same time\n"
           "                         when uncontended)\n"
           "  --node-collectives M   flows (default): a collective inside one node moves its\n"
           "                         bytes as transfers that share links, timed without\n"
           "                         events where nothing else can use them; transfers:\n"
           "                         always as SimGrid transfers (slower, the same times);\n"
           "                         closed-form: the ring's time, no events, no sharing\n"
           "  --no-local-allgather   send every receiver its whole tile between stages\n"
           "  --no-check             skip the program checker (it runs on another core\n"
           "                         while the simulation runs; a failed check stops it)\n"
           "  --dump-programs DIR    also write the programs readably to DIR (as plan\n"
           "                         --dump-programs does), before they are checked\n"
           "  --json                 print the summary as JSON instead of a table\n"
           "  -h, --help             this help\n");
}

#ifndef PS_NO_SIMGRID
/* The simulator replays a plan whatever its memory: say when a device's
 * peak exceeds its memory (a plan edited by hand, or made for other
 * devices; plan never writes one that does not fit). */
static void warn_over_memory(const char *plan_path, const ps_cluster *c, const ps_summary *sum)
{
    int over = 0, worst = -1;
    double worst_ratio = 1;
    for (int i = 0; i < sum->n_devices; i++) {
        const ps_summary_device *d = &sum->devices[i];
        double cap = ps_cluster_device(c, d->id)->memory_bytes;
        if (!(d->peak_memory_bytes > cap))
            continue;
        over++;
        if (d->peak_memory_bytes / cap > worst_ratio) {
            worst_ratio = d->peak_memory_bytes / cap;
            worst = i;
        }
    }
    if (over == 0)
        return;
    const ps_summary_device *d = &sum->devices[worst];
    char peak[32], cap[32];
    PS_LOG_WARN("%s: %d device%s of the cluster would run out of memory: device %d (stage %d) "
                "peaks at %s of its %s",
                plan_path, over, over == 1 ? "" : "s", d->id, d->stage,
                ps_bytes_text(d->peak_memory_bytes, peak, sizeof peak),
                ps_bytes_text(ps_cluster_device(c, d->id)->memory_bytes, cap, sizeof cap));
}
#endif

#ifdef PS_NO_SIMGRID
/* A build without SimGrid (configured with -DPS_WITH_SIMGRID=OFF): the command is
 * there, says so, and fails; --help still works. */
int ps_cmd_sim(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        help();
        printf("\n%s\n", PS_CLI_NO_SIMGRID);
        return 0;
    }
    fprintf(stderr, "pipeshard: sim: %s\n", PS_CLI_NO_SIMGRID);
    return 1;
}
#else
enum { OPT_PLAN = 256, OPT_TRACE, OPT_SUMMARY, OPT_STEPS, OPT_NO_LAG, OPT_NO_CHECK, OPT_PRED,
       OPT_JSON, OPT_PROFILE_DB, OPT_DUMP, OPT_NODE_COLL };

static const struct option options[] = {
    {"plan", required_argument, NULL, OPT_PLAN},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"summary", required_argument, NULL, OPT_SUMMARY},
    {"predicted", required_argument, NULL, OPT_PRED},
    {"collective-steps", no_argument, NULL, OPT_STEPS},
    {"node-collectives", required_argument, NULL, OPT_NODE_COLL},
    {"no-local-allgather", no_argument, NULL, OPT_NO_LAG},
    {"no-check", no_argument, NULL, OPT_NO_CHECK},
    {"json", no_argument, NULL, OPT_JSON},
    {"dump-programs", required_argument, NULL, OPT_DUMP},
    {"profile-db", required_argument, NULL, OPT_PROFILE_DB},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

int ps_cmd_sim(int argc, char **argv)
{
    const char *plan_path = NULL, *summary_path = NULL, *pred_path = NULL, *dump_dir = NULL;
    bool check = true, json = false;
    ps_sim_options so = ps_sim_options_default();
    ps_lower_options lo = ps_lower_options_default();
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case 'h': help(); return 0;
        case OPT_PLAN: plan_path = optarg; break;
        case OPT_TRACE: so.trace_path = optarg; break;
        case OPT_SUMMARY: summary_path = optarg; break;
        case OPT_PRED: pred_path = optarg; break;
        case OPT_STEPS: so.collective_steps = true; break;
        case OPT_NODE_COLL:
            if (strcmp(optarg, "flows") == 0 || strcmp(optarg, "closed-form") == 0 ||
                strcmp(optarg, "transfers") == 0) {
                so.node_collectives_closed_form = strcmp(optarg, "closed-form") == 0;
                so.node_collectives_transfers = strcmp(optarg, "transfers") == 0;
                break;
            }
            return ps_cli_usage_error("sim", "--node-collectives takes flows, transfers or "
                                             "closed-form, not \"%s\"",
                                      optarg);
        case OPT_NO_LAG: lo.local_allgather = false; break;
        case OPT_NO_CHECK: check = false; break;
        case OPT_JSON: json = true; break;
        case OPT_DUMP: dump_dir = optarg; break;
        case OPT_PROFILE_DB:
            /* kept by name so that a script passing it learns why it goes */
            return ps_cli_usage_error("sim", "--profile-db is not needed: the plan file carries "
                                             "every op's time as its planner priced it (with "
                                             "the profile DB it was made with, if any), and "
                                             "sim replays those");
        default:
            return ps_cli_usage_error("sim", "unknown or incomplete option \"%s\"",
                                      argv[optind - 1]);
        }
    }
    if (optind < argc)
        return ps_cli_usage_error("sim", "unexpected argument \"%s\"", argv[optind]);
    if (plan_path == NULL)
        return ps_cli_usage_error("sim", "--plan PLAN.json is required");
    const ps_cli_path outs[] = {{"--trace", so.trace_path},
                                {"--summary", summary_path},
                                {"--predicted", pred_path}};
    FILE *report = stdout;
    int checked = ps_cli_check_run_outputs("sim", plan_path, json, outs,
                                           (int)(sizeof outs / sizeof *outs), &report);
    if (checked != 0)
        return checked;
    ps_status st = PS_OK;
    ps_error err = {0};
    ps_plan *plan = NULL;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_summary *sum = NULL, *pred = NULL;
    ps_sim_stats stats = {0};
    PS_TRY(ps_plan_load(plan_path, &plan, &err));
    PS_TRY(ps_cli_in_plan_file(plan, ps_plan_model_build(plan, &m, &err), &err));
    PS_TRY(ps_cli_in_plan_file(plan, ps_plan_lower(plan, m, &lo, &set, &err), &err));
    if (dump_dir != NULL)
        PS_TRY(ps_program_set_dump_dir(set, dump_dir, &err));
    so.check_programs = check; /* while the simulation runs */
    so.progress = ps_log_progress_enabled();
    PS_TRY(ps_sim_run(set, plan->cluster, &so, &sum, &stats, &err));
    warn_over_memory(plan_path, plan->cluster, sum);
    PS_TRY(ps_cli_planner_summary(plan, m, set, NULL, 0, &pred, &err));
    if (summary_path != NULL)
        PS_TRY(ps_summary_save(sum, summary_path, &err));
    if (pred_path != NULL)
        PS_TRY(ps_summary_save(pred, pred_path, &err));
    if (json) {
        json_t *j = NULL;
        PS_TRY(ps_summary_to_json(sum, &j));
        st = ps_json_save(j, "-", &err);
        json_decref(j);
        if (st != PS_OK)
            goto out;
    } else {
        ps_summary_print(sum, report);
        if (!(plan->iteration_s > 0))
            fprintf(report, "\nplanner       the plan carries no prediction\n");
        else
            fprintf(report, "\nplanner       iteration %.4g s, %.4g TFLOP/s per device; simulated / "
                   "predicted = %.3f\n",
                   plan->iteration_s, plan->tflops_per_device,
                   sum->iteration_s / plan->iteration_s);
        /* per stage, the planner's schedule (predict's summary): on shared
         * cores the plan's stage times are the stage DP's bound */
        for (int k = 0; k < pred->n_stages && k < sum->n_stages && plan->iteration_s > 0; k++)
            fprintf(report,
                    "  stage %d: simulated %.4g ms, predicted %.4g ms per micro-batch (%+.1f%%)\n",
                    k, sum->stages[k].time_s * 1e3, pred->stages[k].time_s * 1e3,
                    pred->stages[k].time_s > 0
                        ? 100 * (sum->stages[k].time_s / pred->stages[k].time_s - 1)
                        : 0);
        fprintf(report, "simulator     %.3g s wall (platform %.3g s, CPU %.3g s), %lld events, %.3g "
               "events/s, peak RSS %.3g MiB\n",
               stats.wall_s, stats.platform_s, stats.cpu_s, stats.events, stats.events_per_s,
               stats.peak_rss_bytes / (1 << 20));
    }
out:
    ps_summary_free(sum);
    ps_summary_free(pred);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(plan);
    return st == PS_OK ? 0 : ps_cli_fail(&err, st);
}
#endif /* PS_NO_SIMGRID */
