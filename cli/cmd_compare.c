/* pipeshard compare: run summaries of one plan side by side, with the error
 * of each against the reference; pipeshard plot: the charts that need no
 * comparison (a trace's timeline, a scaling CSV). docs/compare.md. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "core/json.h"
#include "traces/compare.h"
#include "traces/plot.h"
#include "traces/summary.h"
#include "traces/trace_read.h"

static void compare_help(void)
{
    printf("usage: pipeshard compare A.json B.json [C.json ...] [--reference FILE]\n"
           "                         [--json] [--csv FILE] [--plot DIR] [--scripts DIR]\n\n"
           "Joins run summaries of one plan (pipeshard sim --summary / --predicted, pipeshard\n"
           "exec --summary: sources planner, sim, exec-cpu, exec-cuda, in any mix) stage by\n"
           "stage and prints, per stage, the time per micro-batch (forward + backward), the\n"
           "forward, backward and update times, the compute and communication per step\n"
           "(means over the stage's devices) and the peak memory of every run, each with\n"
           "its relative error (run - reference) / reference; then the iteration time of\n"
           "every run and, over the stages, the mean absolute error (MAPE) and the worst\n"
           "case. Summaries of different plans or stage layouts are refused.\n\n"
           "options:\n"
           "  --reference FILE   the run the others are measured against (one of the files);\n"
           "                     default: the measured run (exec-cuda, else exec-cpu), else\n"
           "                     the last file\n"
           "  --json             print the comparison as JSON instead of tables\n"
           "  --csv FILE         also write one row per (stage, run); \"-\": to stdout instead\n"
           "                     of the tables\n"
           "  --plot DIR         draw the charts with gnuplot into DIR (created if missing):\n"
           "                     scatter.png/.svg (each run against the reference, per stage,\n"
           "                     with +-10%% and +-25%% bands), breakdown.png/.svg (compute,\n"
           "                     communication and idle per stage), beside their .dat files\n"
           "  --scripts DIR      read the gnuplot scripts from DIR (default: the source\n"
           "                     tree's traces/plots, or $PIPESHARD_PLOTS)\n"
           "  -h, --help         this help\n\n"
           "docs/compare.md defines the errors, the JSON and CSV columns and the charts.\n");
}

enum {
    OPT_REFERENCE = 256,
    OPT_JSON,
    OPT_CSV,
    OPT_PLOT,
    OPT_SCRIPTS,
    OPT_TIMELINE,
    OPT_SCALING,
    OPT_FROM,
    OPT_TO
};

static const struct option compare_options[] = {
    {"reference", required_argument, NULL, OPT_REFERENCE},
    {"json", no_argument, NULL, OPT_JSON},
    {"csv", required_argument, NULL, OPT_CSV},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"scripts", required_argument, NULL, OPT_SCRIPTS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The files compared, each looked up once: one run given twice (by any
 * path) would weigh double in every error and MAPE; *ref: the position of
 * `reference` (NULL: none) among them, by name or as the same file written
 * another way (./x.json, an absolute path). 0, or a usage error's status. */
static int check_files(const char *const *files, int n, const char *reference, int *ref)
{
    struct stat *id = calloc((size_t)n, sizeof *id);
    bool *known = calloc((size_t)n, sizeof *known);
    int status = 0;
    if (id == NULL || known == NULL) {
        fprintf(stderr, "pipeshard: compare: out of memory\n");
        status = 1;
        goto out;
    }
    for (int i = 0; i < n && status == 0; i++) {
        known[i] = stat(files[i], &id[i]) == 0;
        for (int j = 0; j < i && status == 0 && known[i]; j++)
            if (known[j] && id[j].st_dev == id[i].st_dev && id[j].st_ino == id[i].st_ino)
                status = ps_cli_usage_error("compare", "\"%s\" and \"%s\" are the same file",
                                            files[j], files[i]);
    }
    *ref = -1;
    if (status != 0 || reference == NULL)
        goto out;
    for (int i = 0; i < n && *ref < 0; i++)
        if (strcmp(files[i], reference) == 0)
            *ref = i;
    struct stat want;
    if (*ref < 0 && stat(reference, &want) == 0)
        for (int i = 0; i < n && *ref < 0; i++)
            if (known[i] && id[i].st_dev == want.st_dev && id[i].st_ino == want.st_ino)
                *ref = i;
    /* a bare file name: the one file compared of that name */
    int named = 0;
    for (int i = 0; i < n && *ref < 0 && strchr(reference, '/') == NULL; i++) {
        const char *slash = strrchr(files[i], '/');
        if (strcmp(slash != NULL ? slash + 1 : files[i], reference) == 0) {
            if (named++ > 0) {
                status = ps_cli_usage_error("compare", "--reference \"%s\" names more than one "
                                                       "of the files compared; give its path",
                                            reference);
                goto out;
            }
        }
    }
    for (int i = 0; i < n && *ref < 0 && named == 1; i++) {
        const char *slash = strrchr(files[i], '/');
        if (strcmp(slash != NULL ? slash + 1 : files[i], reference) == 0)
            *ref = i;
    }
    if (*ref < 0)
        status = ps_cli_usage_error("compare", "--reference \"%s\" is not one of the files "
                                               "compared",
                                    reference);
out:
    free(id);
    free(known);
    return status;
}

int ps_cmd_compare(int argc, char **argv)
{
    const char *reference = NULL, *csv = NULL, *plot_dir = NULL;
    bool json = false;
    ps_plot_options po = {0};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", compare_options, NULL)) != -1) {
        switch (c) {
        case 'h': compare_help(); return 0;
        case OPT_REFERENCE: reference = optarg; break;
        case OPT_JSON: json = true; break;
        case OPT_CSV: csv = optarg; break;
        case OPT_PLOT: plot_dir = optarg; break;
        case OPT_SCRIPTS: po.scripts_dir = optarg; break;
        default:
            return ps_cli_usage_error("compare", "unknown or incomplete option \"%s\"",
                                      argv[optind - 1]);
        }
    }
    int n = argc - optind;
    if (n < 2)
        return ps_cli_usage_error("compare", "needs at least 2 run summaries to compare, %s given",
                                  n == 0 ? "none" : "1");
    if (json && csv != NULL && strcmp(csv, "-") == 0)
        return ps_cli_usage_error("compare", "--json and --csv - both want stdout; give "
                                             "--csv a file");
    if (po.scripts_dir != NULL && plot_dir == NULL)
        return ps_cli_usage_error("compare", "--scripts applies to --plot DIR (the charts' "
                                             "scripts); give both, or use pipeshard plot");
    const char *const *files = (const char *const *)&argv[optind];
    int ref = -1;
    int usage = check_files(files, n, reference, &ref);
    if (usage != 0)
        return usage;
    ps_cli_path *ins = calloc((size_t)n, sizeof *ins);
    if (ins == NULL)
        return ps_cli_fail(NULL, PS_ERR_NOMEM);
    for (int i = 0; i < n; i++)
        ins[i] = (ps_cli_path){"summary", files[i]};
    const ps_cli_path outs[] = {{"--csv", csv}};
    usage = ps_cli_check_outputs("compare", outs, 1, ins, n);
    free(ins);
    if (usage != 0)
        return usage;
    ps_status st = PS_OK;
    ps_error err = {0};
    ps_summary **runs = calloc((size_t)n, sizeof *runs);
    ps_compare *cmp = NULL;
    char gnuplot[1024];
    PS_TRY_ALLOC(runs, &err);
    for (int i = 0; i < n; i++)
        PS_TRY(ps_summary_load(files[i], &runs[i], &err));
    PS_TRY(ps_compare_create((const ps_summary *const *)runs, files, n, ref, &cmp, &err));
    /* a missing gnuplot, or a chart directory that is a file, is said
     * before any output */
    if (plot_dir != NULL) {
        PS_TRY(ps_plot_find_gnuplot(&po, gnuplot, sizeof gnuplot, &err));
        PS_TRY(ps_plot_check_scripts(&po, (const char *const[]){"scatter.gp", "breakdown.gp"}, 2,
                                     &err));
    }
    struct stat dir_stat;
    if (plot_dir != NULL && stat(plot_dir, &dir_stat) == 0 && !S_ISDIR(dir_stat.st_mode)) {
        st = ps_error_set(&err, PS_ERR_IO, "--plot %s: a file, not a directory", plot_dir);
        goto out;
    }
    if (csv != NULL)
        PS_TRY(ps_compare_save_csv(cmp, csv, &err));
    if (json) {
        json_t *j = NULL;
        if ((st = ps_compare_to_json(cmp, &j)) != PS_OK) {
            st = ps_error_set(&err, st, "out of memory");
            goto out;
        }
        st = ps_json_save(j, "-", &err);
        json_decref(j);
        if (st != PS_OK)
            goto out;
    } else if (csv == NULL || strcmp(csv, "-") != 0) {
        ps_compare_print(cmp, stdout);
    }
    if (plot_dir != NULL) {
        PS_TRY(ps_plot_compare(cmp, plot_dir, &po, &err));
        if (!json && (csv == NULL || strcmp(csv, "-") != 0))
            printf("\ncharts        %s/scatter.png, %s/breakdown.png (and .svg; data in .dat; "
                   "scripts in %s)\n",
                   plot_dir, plot_dir, ps_plot_scripts_dir(&po));
    }
out:
    ps_compare_free(cmp);
    if (runs != NULL)
        for (int i = 0; i < n; i++)
            ps_summary_free(runs[i]);
    free(runs);
    return st == PS_OK ? 0 : ps_cli_fail(&err, st);
}

/* ---- pipeshard plot --------------------------------------------------------- */

static void plot_help(void)
{
    printf("usage: pipeshard plot [--timeline T.json [--from MS] [--to MS]] [--scaling S.csv]\n"
           "                      -o DIR [--scripts DIR]\n\n"
           "Draws charts with gnuplot into DIR (created if missing), each as NAME.png and\n"
           "NAME.svg beside its data file NAME.dat; the scripts (traces/plots/NAME.gp) are\n"
           "meant to be edited. `pipeshard compare ... --plot DIR` draws the comparisons.\n\n"
           "options:\n"
           "  --timeline T.json  timeline: a Gantt chart of the trace (pipeshard sim or exec\n"
           "                     --trace), one row per device, colored by category\n"
           "  --from MS, --to MS the timeline's window, in ms from the first span (default:\n"
           "                     all of it)\n"
           "  --scaling S.csv    scaling: throughput against devices, one line per series;\n"
           "                     the CSV's header names the columns series, devices and\n"
           "                     throughput (e.g. \"throughput (PFLOP/s)\"), see docs/compare.md\n"
           "  -o, --output DIR   where the charts go\n"
           "  --scripts DIR      read the gnuplot scripts from DIR (default: the source\n"
           "                     tree's traces/plots, or $PIPESHARD_PLOTS)\n"
           "  -h, --help         this help\n");
}

static const struct option plot_options[] = {
    {"timeline", required_argument, NULL, OPT_TIMELINE},
    {"scaling", required_argument, NULL, OPT_SCALING},
    {"from", required_argument, NULL, OPT_FROM},
    {"to", required_argument, NULL, OPT_TO},
    {"output", required_argument, NULL, 'o'},
    {"scripts", required_argument, NULL, OPT_SCRIPTS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

int ps_cmd_plot(int argc, char **argv)
{
    const char *timeline = NULL, *scaling = NULL, *dir = NULL;
    double from_ms = 0, to_ms = -1; /* -1: to the end */
    ps_plot_options po = {0};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "ho:", plot_options, NULL)) != -1) {
        switch (c) {
        case 'h': plot_help(); return 0;
        case OPT_TIMELINE: timeline = optarg; break;
        case OPT_SCALING: scaling = optarg; break;
        case OPT_FROM:
            if (!ps_cli_parse_double(optarg, 0, 1e12, &from_ms))
                return ps_cli_usage_error("plot", "--from needs a time in ms >= 0, not \"%s\"",
                                          optarg);
            break;
        case OPT_TO:
            if (!ps_cli_parse_double(optarg, 0, 1e12, &to_ms))
                return ps_cli_usage_error("plot", "--to needs a time in ms >= 0, not \"%s\"",
                                          optarg);
            break;
        case 'o': dir = optarg; break;
        case OPT_SCRIPTS: po.scripts_dir = optarg; break;
        default:
            return ps_cli_usage_error("plot", "unknown or incomplete option \"%s\"",
                                      argv[optind - 1]);
        }
    }
    if (optind < argc)
        return ps_cli_usage_error("plot", "unexpected argument \"%s\"", argv[optind]);
    if (timeline == NULL && scaling == NULL)
        return ps_cli_usage_error("plot", "nothing to draw: give --timeline T.json and/or "
                                          "--scaling S.csv");
    if (dir == NULL)
        return ps_cli_usage_error("plot", "-o DIR is required");
    if (to_ms >= 0 && to_ms <= from_ms)
        return ps_cli_usage_error("plot", "--to %g must come after --from %g", to_ms, from_ms);
    if (timeline == NULL && (from_ms > 0 || to_ms >= 0))
        return ps_cli_usage_error("plot", "--from and --to window the timeline: they go with "
                                          "--timeline T.json");
    ps_status st = PS_OK;
    ps_error err = {0};
    ps_trace_data *t = NULL;
    char gnuplot[1024];
    PS_TRY(ps_plot_find_gnuplot(&po, gnuplot, sizeof gnuplot, &err));
    if (timeline != NULL)
        PS_TRY(ps_plot_check_scripts(&po, (const char *const[]){"timeline.gp"}, 1, &err));
    if (scaling != NULL)
        PS_TRY(ps_plot_check_scripts(&po, (const char *const[]){"scaling.gp"}, 1, &err));
    if (timeline != NULL) {
        PS_TRY(ps_trace_load(timeline, &t, &err));
        int drawn = 0;
        PS_TRY(ps_plot_timeline(t, from_ms * 1e-3, to_ms < 0 ? -1 : to_ms * 1e-3, dir, &po,
                                &drawn, &err));
        if (drawn == t->n_spans)
            printf("timeline      %s/timeline.png, %s/timeline.svg (%d devices, %d spans)\n",
                   dir, dir, t->n_devices, t->n_spans);
        else
            printf("timeline      %s/timeline.png, %s/timeline.svg (%d devices, %d of the "
                   "trace's %d spans in the window)\n",
                   dir, dir, t->n_devices, drawn, t->n_spans);
    }
    if (scaling != NULL) {
        PS_TRY(ps_plot_scaling(scaling, dir, &po, &err));
        printf("scaling       %s/scaling.png, %s/scaling.svg\n", dir, dir);
    }
out:
    ps_trace_data_free(t);
    return st == PS_OK ? 0 : ps_cli_fail(&err, st);
}
