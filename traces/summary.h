/* Run summaries: what one run of a plan took, per device and per stage,
 * written alike by the planner (its prediction), the simulator and the
 * executors, so that `compare` can join them. docs/trace-format.md
 * describes the file; the keys listed in DESIGN.md are stable. */
#ifndef PS_TRACES_SUMMARY_H
#define PS_TRACES_SUMMARY_H

#include <stdio.h>

#include <jansson.h>

#include "core/status.h"

#define PS_SUMMARY_VERSION 1

/* The values of `source`, in this order. */
#define PS_SUMMARY_SOURCE_COUNT 4
extern const char *const ps_summary_source_names[PS_SUMMARY_SOURCE_COUNT];
/* Index of a source name in ps_summary_source_names, or -1. */
int ps_summary_source_index(const char *source);

typedef struct ps_summary_device {
    int id;                   /* global device id */
    int stage;                /* -1: the device has no stage */
    double compute_s;         /* busy computing, per step */
    double comm_s;            /* in communication not hidden by compute */
    double idle_s;            /* the rest of the iteration */
    double peak_memory_bytes;
} ps_summary_device;

typedef struct ps_summary_stage {
    int index;
    int n_devices;
    int first_device;           /* smallest device id of the stage's mesh slice */
    int submesh[2];             /* hosts, devices per host */
    int logical_mesh[2];
    double time_s;              /* forward + backward of one micro-batch */
    double forward_s, backward_s, update_s;
    double peak_memory_bytes;   /* max over the stage's devices */
} ps_summary_stage;

typedef struct ps_summary {
    char source[16];            /* planner, sim, exec-cpu, exec-cuda */
    char plan[32];              /* digest of the plan (ps_plan_digest) */
    char model[64];
    char cluster[64];
    int micro_batches;
    double iteration_s;
    double tflops_per_device;
    double mfu;
    double peak_memory_bytes;   /* max over devices */
    double wall_s;              /* how long producing it took (simulation or run); 0 if unknown */
    /* A measurement over several steps (the executors): how many steps its
     * times are the medians of, and the fastest and slowest of their
     * iterations. 0, 0, 0 for a prediction (planner, sim). */
    int timed_steps;
    double iteration_min_s, iteration_max_s;
    int n_devices, n_stages;
    ps_summary_device *devices; /* [n_devices] */
    ps_summary_stage *stages;   /* [n_stages] */
} ps_summary;

/* A zeroed summary with room for n_devices devices and n_stages stages. */
ps_status ps_summary_create(int n_devices, int n_stages, ps_summary **out);
void ps_summary_free(ps_summary *s);

/* The checks load applies: source, text fields, finite non-negative values,
 * timed steps whose fastest and slowest iterations bracket iteration_s (one
 * step: all three equal; none: both 0), at least one device and one stage,
 * increasing device ids, stage indices
 * 0..n-1, mesh shapes that hold each stage's devices, devices[] agreeing
 * with each stage's count and first device. Reports "summary: PATH: what is
 * wrong". Save and to_json call it first, so nothing is written that load
 * would refuse. */
ps_status ps_summary_validate(const ps_summary *s, ps_error *err);
/* PS_ERR_INVALID when the summary does not validate, PS_ERR_NOMEM. */
ps_status ps_summary_to_json(const ps_summary *s, json_t **out);
ps_status ps_summary_save(const ps_summary *s, const char *path, ps_error *err);
/* Validates everything (types, ranges, unknown keys) and reports
 * FILE:LINE:COL: PATH: what is wrong. */
ps_status ps_summary_load(const char *path, ps_summary **out, ps_error *err);
/* The same from text held in memory; name is used in messages. */
ps_status ps_summary_parse(const char *name, const char *text, ps_summary **out, ps_error *err);

/* A readable table (stages, then a device digest) for the terminal. */
void ps_summary_print(const ps_summary *s, FILE *f);

#endif
