/* Subcommands of the pipeshard command and the helpers they share. Each
 * subcommand returns the process exit status: 0 success, 1 failure (message
 * already printed as "pipeshard: ..."), 2 bad usage. */
#ifndef PS_CLI_CLI_H
#define PS_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

int ps_cmd_models(int argc, char **argv);
int ps_cmd_clusters(int argc, char **argv);
int ps_cmd_graph(int argc, char **argv);
int ps_cmd_plan(int argc, char **argv);
int ps_cmd_demo(int argc, char **argv);

int ps_cmd_sim(int argc, char **argv);
int ps_cmd_predict(int argc, char **argv);
int ps_cmd_exec(int argc, char **argv);
int ps_cmd_profile(int argc, char **argv);
/* What `pipeshard sim` and the demo say in a build configured without SimGrid
 * (PS_WITH_SIMGRID=OFF, which compiles the simulator's users with PS_NO_SIMGRID). */
#define PS_CLI_NO_SIMGRID "this build has no SimGrid (configure with -DPS_WITH_SIMGRID=ON)"
int ps_cmd_compare(int argc, char **argv);
int ps_cmd_plot(int argc, char **argv);

/* Lowers a plan to per-device programs (rebuilding its model), checks them
 * and writes them readably to dir; prints a one-line digest on stderr. */
struct ps_plan;
ps_status ps_cli_dump_programs(const struct ps_plan *plan, const char *dir, ps_error *err);

/* Loads a profile DB (--profile-db) and lends it to cluster c's cost model
 * (c->profile); warns when c has no device kind of the DB's name (the DB
 * then stands for every device). The caller frees *out after c's last use. */
struct ps_cluster;
struct ps_profile_db;
ps_status ps_cli_attach_profile(const char *path, struct ps_cluster *c,
                                struct ps_profile_db **out, ps_error *err);

/* A file a command reads or writes, and the option that names it. */
typedef struct ps_cli_path {
    const char *option; /* e.g. "--summary" */
    const char *path;   /* NULL: not given; "-": standard input or output */
} ps_cli_path;

/* Checks a command's outputs before it does any work, so that a long run
 * is not lost to a typo in an output path: each file of outs (NULL and "-"
 * skipped) must be writable where it stands (its directory exists, it is
 * not a directory), name no file of ins (by device and inode) and no other
 * output. Prints why and returns the exit status (1 for a path that cannot
 * be written, 2 for a clash), or 0. */
int ps_cli_check_outputs(const char *command, const ps_cli_path *outs, int n_outs,
                         const ps_cli_path *ins, int n_ins);
/* The outputs of a command that runs a plan (sim, exec, predict): checked
 * as ps_cli_check_outputs does against the --plan input, and refused when
 * --json also wants stdout. *report: where the report for people goes,
 * stderr when an output is "-". Returns the exit status, or 0. */
int ps_cli_check_run_outputs(const char *command, const char *plan_path, bool json,
                             const ps_cli_path *outs, int n_outs, FILE **report);
/* Whether some output of outs goes to standard output ("-"): a command's
 * report for people then goes to standard error, so that stdout carries the
 * file alone. */
bool ps_cli_stdout_taken(const ps_cli_path *outs, int n_outs);

/* A plan read from a file that fails to build its model or lower with a
 * message not naming the file (checks against the model have no place in
 * the file) gets the file's name in front of it. Returns st. */
ps_status ps_cli_in_plan_file(const struct ps_plan *plan, ps_status st, ps_error *err);

/* The planner's prediction of a plan as a run summary (source "planner"):
 * traces/plan_summary.h's, with the receives of its schedule (spans, or
 * NULL: computed here) counted as communication. m and set: the plan's
 * model and its lowered programs. */
struct ps_plan_model;
struct ps_program_set;
struct ps_pipeline_span;
struct ps_summary;
ps_status ps_cli_planner_summary(const struct ps_plan *plan, const struct ps_plan_model *m,
                                 const struct ps_program_set *set,
                                 const struct ps_pipeline_span *spans, int n_spans,
                                 struct ps_summary **out, ps_error *err);

/* Prints "pipeshard: <msg>" for a failed status and returns 1. */
int ps_cli_fail(const ps_error *err, ps_status st);
/* Prints "pipeshard: <command>: <msg>" plus a --help hint; returns 2. */
int ps_cli_usage_error(const char *command, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Strict number parsing for option values: the whole text must be a number
 * within [min, max]. */
bool ps_cli_parse_int(const char *text, int64_t min, int64_t max, int64_t *out);
bool ps_cli_parse_double(const char *text, double min, double max, double *out);

/* "1.23 GiB", "456 MiB" into buf. */
const char *ps_cli_bytes(double bytes, char *buf, int cap);
/* Counts the way model sizes are spoken of: "350 M", "2.65 B", "1.01 T". */
const char *ps_cli_count(double v, char *buf, int cap);
/* "1.23e+15" style with SI prefixes: "12.3 PFLOP". */
const char *ps_cli_si(double v, const char *unit, char *buf, int cap);

#endif
