/* Joining run summaries of one plan (the planner's prediction, simulations,
 * measurements) stage by stage, and the relative error of every source
 * against a reference run. docs/compare.md describes the joins, the error
 * definitions and the outputs (table, JSON, CSV). */
#ifndef PS_TRACES_COMPARE_H
#define PS_TRACES_COMPARE_H

#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>

#include "core/status.h"
#include "traces/summary.h"

#define PS_COMPARE_VERSION 2

/* The per-stage quantities compared, in this order. */
typedef enum ps_compare_metric {
    PS_CMP_TIME = 0,     /* time_s: forward + backward of one micro-batch */
    PS_CMP_FORWARD = 1,  /* forward_s */
    PS_CMP_BACKWARD = 2, /* backward_s */
    PS_CMP_UPDATE = 3,   /* update_s, per step */
    PS_CMP_MEMORY = 4,   /* peak_memory_bytes, max over the stage's devices */
    PS_CMP_COMPUTE = 5,  /* compute_s per step, the mean over the stage's devices */
    PS_CMP_COMM = 6,     /* comm_s per step, the same (waits for peers are idle) */
    PS_CMP_METRIC_COUNT
} ps_compare_metric;

/* The keys of the metrics ("time_s", ..., "peak_memory_bytes", "compute_s",
 * "comm_s"): a stage's in the summaries, the means of its devices' for the
 * last two. */
extern const char *const ps_compare_metric_keys[PS_CMP_METRIC_COUNT];

/* One stage as seen by one run. Errors are (value - reference) / reference:
 * +0.1 means 10% above the reference; NAN where undefined (a reference of 0
 * beside a non-zero value). */
typedef struct ps_compare_cell {
    double value[PS_CMP_METRIC_COUNT];
    double error[PS_CMP_METRIC_COUNT];
    /* per-step compute, communication and idle time, seconds, averaged over
     * the devices of the stage's mesh slice */
    double compute_s, comm_s, idle_s;
} ps_compare_cell;

typedef struct ps_compare_run {
    char *file;                /* as given (owned copy), for messages and labels */
    const ps_summary *summary; /* borrowed */
    double iteration_error, tflops_error, peak_memory_error;
    /* over the stages with a defined error: mean |error| (MAPE, a fraction)
     * and the signed error of largest magnitude with its stage; NAN and -1
     * when no stage has one */
    double mape[PS_CMP_METRIC_COUNT];
    double worst[PS_CMP_METRIC_COUNT];
    int worst_stage[PS_CMP_METRIC_COUNT];
} ps_compare_run;

typedef struct ps_compare {
    int n_runs, n_stages;
    int reference; /* index into runs */
    ps_compare_run *runs;
    ps_compare_cell *cells; /* [stage * n_runs + run] */
} ps_compare;

/* (value - reference) / reference; 0 when both are 0, NAN when only the
 * reference is 0 or either is not finite. */
double ps_compare_rel_error(double value, double reference);

/* The run a comparison measures against by default: the last exec-cuda run,
 * else the last exec-cpu run (measurements), else the last run. */
int ps_compare_default_reference(const ps_summary *const *runs, int n);

/* Joins n >= 2 summaries (files[i] names runs[i] in messages) against
 * runs[reference] (-1: ps_compare_default_reference). Refuses, naming both
 * files, summaries of different plans (digests) or different stage layouts
 * (number of stages; per stage: devices, first device, submesh, logical
 * mesh) or micro-batch counts. The summaries must outlive the result. */
ps_status ps_compare_create(const ps_summary *const *runs, const char *const *files, int n,
                            int reference, ps_compare **out, ps_error *err);
void ps_compare_free(ps_compare *c);

static inline const ps_compare_cell *ps_compare_cell_at(const ps_compare *c, int stage, int run)
{
    return &c->cells[stage * c->n_runs + run];
}

/* Tables for the terminal: per metric, stages by runs with their errors;
 * then the iteration and the MAPE and worst case of every run. */
/* The label of run r in tables, CSV and charts: A..Z, then AA, AB, ... */
const char *ps_compare_run_id(int r, char id[8]);
void ps_compare_print(const ps_compare *c, FILE *f);
/* The same as JSON ("pipeshard-compare", docs/compare.md); undefined errors
 * are null. */
ps_status ps_compare_to_json(const ps_compare *c, json_t **out);
/* One row per (stage, run) with a header; "-" is standard output. */
ps_status ps_compare_save_csv(const ps_compare *c, const char *path, ps_error *err);

#endif
