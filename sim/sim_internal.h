/* What the files of sim/ share: the platform's latencies (platform.c), the
 * replay that runs in the simulation's child process (replay.c), and the
 * results it hands back to ps_sim_run (sim.c) through a pipe. Only sim/
 * includes this header; only replay.c includes SimGrid. */
#ifndef PS_SIM_SIM_INTERNAL_H
#define PS_SIM_SIM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "sim/sim.h"

/* Route latency between two devices in the platform that
 * ps_sim_platform_write generates: intra.latency_s on one node,
 * max(inter.latency_s, intra.latency_s) across nodes. */
double ps_sim_route_latency_s(const ps_cluster *c, int a, int b);

/* Per-device results of one replay. */
typedef struct ps_sim_device_result {
    double compute_s;                   /* in executions */
    double comm_s;                      /* blocked while data moved, latency sleeps included */
    double end_s;                       /* when the program finished */
    double peak_memory_bytes;           /* from ALLOC/FREE */
    double phase_sum_s[PS_PHASE_COUNT]; /* RUN durations per phase, summed */
    int32_t phase_runs[PS_PHASE_COUNT];
    int32_t has_program;
} ps_sim_device_result;

typedef struct ps_sim_result {
    double iteration_s; /* the last program's end */
    double load_s;      /* loading the platform into SimGrid */
    double wall_s;      /* the child's whole simulation, load included */
    double peak_rss_bytes;
    long long events;
    int n_devices;
    ps_sim_device_result *devices; /* [n_devices], owned by the caller */
} ps_sim_result;

/* Runs in a child process that may call simgrid_init (once per process):
 * loads platform_path, replays the programs, fills res (devices allocated
 * by the caller, n_devices entries). Writes the trace when o->trace_path. */
ps_status ps_sim_replay(const ps_program_set *s, const ps_cluster *c, const ps_sim_options *o,
                        const char *platform_path, ps_sim_result *res, ps_error *err);

#endif
