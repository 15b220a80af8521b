/* Alpa's stage-construction dynamic program (inter-op pass), on a table of
 * stage costs: which consecutive layers form each pipeline stage, on which
 * submesh and logical-mesh configuration, so that
 *   iteration = sum of stage times + (B - 1) * the slowest stage time
 * is least, every stage fits its memory under the schedule, and the
 * submeshes use exactly all devices.
 *
 * t_max runs over the distinct stage costs in increasing order; for each,
 * F(s, l, d) = least total time of layers l..L-1 as s stages on d devices
 * with every stage <= t_max and each stage allowed at most max_succ later
 * stages (1F1B keeps one micro-batch in flight per later stage); the search
 * stops once B * t_max cannot beat the best found.
 *
 * In-order placement (optional, ps_stage_table_place_in_order): the stages
 * sit on consecutive devices in pipeline order from device 0, so that where
 * a stage starts (D - d) tells whether its neighbours share its node, and
 * each stage also pays what it receives from them per micro-batch, at the
 * node's link or across nodes. A stage within a node may not straddle two;
 * one of whole nodes starts on a node. */
#ifndef PS_PLANNER_STAGE_DP_H
#define PS_PLANNER_STAGE_DP_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"

typedef struct ps_stage_table {
    int n_layers;
    int n_submeshes;
    int n_configs;     /* logical-mesh configurations per submesh (max) */
    int *sub_devices;  /* [n_submeshes] devices of each submesh */
    /* [n_layers][n_layers][n_submeshes][n_configs], first layer major; only
     * entries with first <= last are read. cost: seconds per micro-batch
     * (forward + backward), INFINITY when absent. max_succ: how many later
     * stages the stage tolerates in memory (-1: it does not fit at all). */
    double *cost;
    int *max_succ;
    /* in-order placement: devices_per_node > 0 turns it on. recv_s[(b *
     * n_submeshes + sub) * 2 + across]: seconds a stage on submesh sub
     * spends per micro-batch receiving across boundary b (between layers
     * b - 1 and b; the activation into its first layer, or the gradient into
     * the one after its last), across: from another node. Owned. */
    int devices_per_node;
    double *recv_s;
    /* [n_layers] or NULL: no_cut_after[b] != 0 where no stage may end after
     * layer b, as a later layer feeds one up to b (a stage's forward pass
     * runs whole, so the stages would wait for each other). Owned. */
    unsigned char *no_cut_after;
} ps_stage_table;

ps_status ps_stage_table_create(int n_layers, int n_submeshes, int n_configs,
                                ps_stage_table **out);
void ps_stage_table_free(ps_stage_table *t);
size_t ps_stage_table_index(const ps_stage_table *t, int first, int last, int sub, int cfg);

/* Turns in-order placement on for nodes of `devices_per_node` devices; the
 * receive costs start at 0 (set recv_s after). */
ps_status ps_stage_table_place_in_order(ps_stage_table *t, int devices_per_node);

/* Whether a stage of `size` devices may start at device `offset` on nodes of
 * `devices_per_node`: within one node when smaller than a node, else on a
 * node's first device. */
bool ps_stage_fits_at(int size, int offset, int devices_per_node);

/* Entry k (layers first..last on submesh sub) as a stage starting at device
 * `offset`: its cost with what it receives under in-order placement, or
 * INFINITY where it cannot sit there; without placement, cost[k]. */
double ps_stage_table_placed_cost(const ps_stage_table *t, size_t k, int first, int last,
                                  int sub, int offset);

typedef struct ps_stage_choice {
    int first, last, sub, cfg;
    double cost_s;
} ps_stage_choice;

typedef struct ps_stage_plan {
    int n_stages;
    ps_stage_choice *stages; /* owned */
    double iteration_s;
    double max_stage_s;
    int t_max_tried; /* distinct t_max values the search evaluated */
} ps_stage_plan;

void ps_stage_plan_clear(ps_stage_plan *p);

/* The DP. PS_ERR_INFEASIBLE when no assignment fits (the message says so). */
ps_status ps_stage_dp(const ps_stage_table *t, int total_devices, int micro_batches,
                      ps_stage_plan *out, ps_error *err);

/* The DP's best plan for each number of stages s = 1..n_layers whose best
 * is within a factor `within` (>= 1) of the overall best: by_count[s]
 * (n_stages 0 where there is none; by_count[0] unused; n_layers + 1
 * entries, each cleared with ps_stage_plan_clear). The t_max search runs
 * until B * t_max reaches `within` times the best, so each plan kept is the
 * optimum for its count. Alpa's DP keeps only the overall best; the others
 * let the caller price what the objective leaves out (the schedule, shared
 * parameters' traffic) on a few near-best pipelines. */
ps_status ps_stage_dp_by_count(const ps_stage_table *t, int total_devices, int micro_batches,
                               double within, ps_stage_plan *by_count, ps_error *err);

/* Every partition of the layers into consecutive stages (exactly n_stages of
 * them, or any number for 0) and every choice of submesh and configuration
 * per stage, for tests (small tables only). */
ps_status ps_stage_brute_force(const ps_stage_table *t, int total_devices, int micro_batches,
                               int n_stages, ps_stage_plan *out, ps_error *err);

#endif
