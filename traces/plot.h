/* Charts drawn by gnuplot. Every chart is one script in traces/plots/ that
 * users may edit; this module writes the chart's data file into an output
 * folder and runs the script on it (gnuplot -e 'var=...' SCRIPT), which
 * writes NAME.png (pngcairo) and NAME.svg beside the data. docs/compare.md
 * lists the charts, their data files and their variables. */
#ifndef PS_TRACES_PLOT_H
#define PS_TRACES_PLOT_H

#include "core/status.h"
#include "traces/compare.h"
#include "traces/trace_read.h"

typedef struct ps_plot_options {
    /* folder of the *.gp scripts; NULL: $PIPESHARD_PLOTS, else the source
     * tree's traces/plots (fixed at build time) */
    const char *scripts_dir;
    /* the gnuplot program; NULL: $PIPESHARD_GNUPLOT, else "gnuplot" on PATH */
    const char *gnuplot;
} ps_plot_options;

/* The gnuplot program that would run, as a path; PS_ERR_NOT_FOUND with a
 * message saying how to get one when there is none. */
ps_status ps_plot_find_gnuplot(const ps_plot_options *o, char *path, size_t cap, ps_error *err);
/* The folder the scripts are read from. */
const char *ps_plot_scripts_dir(const ps_plot_options *o);
/* Whether the scripts of the charts named (e.g. "scatter.gp") can be read
 * from the scripts directory: asked before any work or output, as gnuplot
 * is, so that a wrong --scripts DIR is said first. */
ps_status ps_plot_check_scripts(const ps_plot_options *o, const char *const *scripts, int n,
                                ps_error *err);

/* scatter.{dat,png,svg}: every run's per-micro-batch time and peak memory
 * per stage against the reference's, with y = x and +-10% / +-25% bands;
 * breakdown.{dat,png,svg}: per stage, every run's compute, communication
 * and idle time per step (mean over the stage's devices), side by side.
 * Creates dir (and its parents) when missing. */
ps_status ps_plot_compare(const ps_compare *c, const char *dir, const ps_plot_options *o,
                          ps_error *err);

/* timeline.{dat,png,svg}: a Gantt chart of the trace, one row per device,
 * one color per category, over the window [from_s, to_s] (seconds from the
 * first span; to_s < 0: to the end), spans clipped to it; *drawn (when not
 * NULL) the spans in the window. */
ps_status ps_plot_timeline(const ps_trace_data *t, double from_s, double to_s, const char *dir,
                           const ps_plot_options *o, int *drawn, ps_error *err);

/* scaling.{dat,png,svg}: throughput against devices, one line per series,
 * with each series' ideal linear scaling, from a CSV file whose header names
 * the columns `series`, `devices` and one starting with `throughput` (its
 * full name labels the y axis); other columns are ignored. */
ps_status ps_plot_scaling(const char *csv_path, const char *dir, const ps_plot_options *o,
                          ps_error *err);

#endif
