/* The SimGrid cluster simulator: replays a plan's per-device programs on a
 * model of its cluster and reports what the run would take.
 *
 * The cluster becomes a SimGrid platform (ps_sim_platform_write): one host
 * per device, at its peak FLOP/s; NVSwitch, NVLink-ring or PCIe links inside
 * a node; each node's NICs into a fat-tree or one switch. The network model
 * is CM02 without cross-traffic and TCP-gamma, under which a transfer of B
 * bytes over a route of latency a and bottleneck bandwidth w takes a + B/w
 * when alone, and flows that share a link share its bandwidth.
 *
 * One actor per device interprets its program: compute becomes an execution
 * sized to take the predicted seconds on the stage's slowest device; SEND
 * and RECV become mailbox communications (sends asynchronous); collectives
 * become the ring steps of core/collective.h among the group's members, so
 * that concurrent traffic contends for links (a ring inside a node whose
 * members' ports carry nothing else is timed instead of moved: the same
 * times, far fewer events). Memory is tracked from ALLOC/FREE.
 *
 * SimGrid keeps one engine per process that cannot be restarted, so each
 * simulation runs in a child process; the caller gets the summary back.
 * Only this directory includes SimGrid.
 *
 * Sends never block: a FREE of a sent buffer counts as freed at once, as in
 * the program checker (waiting for the receiver could deadlock lowered 1F1B
 * programs). Waiting for a peer to arrive is idle time, not communication.
 * Environment: PIPESHARD_LOG=debug keeps SimGrid's logging (and forwards the
 * child's stderr); PIPESHARD_SIMGRID_OPTIONS adds SimGrid options, for
 * experiments. docs/simulator.md has the details and measured speed. */
#ifndef PS_SIM_SIM_H
#define PS_SIM_SIM_H

#include <stdbool.h>
#include <stdio.h>

#include "core/cluster.h"
#include "core/program.h"
#include "traces/summary.h"

typedef struct ps_sim_options {
    const char *trace_path; /* Chrome trace of the run; NULL: none */
    /* Send every ring step as its own communication. Default (false):
     * consecutive steps between the same two members are coalesced into one
     * transfer of their bytes plus the latencies of the others (the same
     * time when uncontended, far fewer events). */
    bool collective_steps;
    /* Time a collective whose members share one node by the ring's closed
     * form (the intra-node link's latency and bandwidth) instead of
     * transfers: it joins the member's next execution, no events of its own.
     * Its bytes no longer share device ports with other traffic and its
     * members no longer wait for each other (they run the same kernel in
     * step); several times fewer events on large clusters
     * (docs/simulator.md). Default false: transfers. */
    bool node_collectives_closed_form;
    /* Move the bytes of every collective inside a node as SimGrid
     * transfers. Default (false): a member whose sends have all been
     * received times its ring transfer instead (nothing else can use its
     * route then): the same times to rounding, without the events
     * (docs/simulator.md). The reference the tests compare with. */
    bool node_collectives_transfers;
    bool progress; /* progress on stderr (simulated seconds, events) */
    /* Run the program checker (ps_program_set_check) in the calling process
     * while the child simulates, on another core: a failed check stops the
     * child and is the error. Default false. */
    bool check_programs;
} ps_sim_options;

typedef struct ps_sim_stats {
    double wall_s;            /* the child's simulation time, platform load included */
    double platform_s;        /* generating and loading the platform */
    long long events;         /* executions + communications + sleeps started */
    double events_per_s;
    double peak_rss_bytes;    /* of the child process */
    double cpu_s;             /* the child's CPU time (user + system), platform load included */
} ps_sim_stats;

ps_sim_options ps_sim_options_default(void);

/* Simulates one training step of `programs` on cluster c. On success
 * *summary_out (source "sim") is the caller's; stats_out may be NULL. */
ps_status ps_sim_run(const ps_program_set *programs, const ps_cluster *c,
                     const ps_sim_options *o, ps_summary **summary_out,
                     ps_sim_stats *stats_out, ps_error *err);

/* The platform XML of cluster c (hosts "dev<id>"; docs/simulator.md). */
ps_status ps_sim_platform_write(const ps_cluster *c, FILE *f, ps_error *err);

#endif
