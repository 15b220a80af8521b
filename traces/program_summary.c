#include "traces/program_summary.h"

#include <stdio.h>

ps_status ps_summary_from_programs(const ps_program_set *set, const char *source,
                                   const char *cluster_name, int devices_per_node,
                                   ps_summary **out, ps_error *err)
{
    ps_summary *sum = NULL;
    ps_status st = ps_summary_create(set->n_devices, set->n_stages, &sum);
    if (st != PS_OK)
        return ps_error_set(err, st, "out of memory");
    snprintf(sum->source, sizeof sum->source, "%s", source);
    snprintf(sum->plan, sizeof sum->plan, "%s", set->plan_digest);
    snprintf(sum->model, sizeof sum->model, "%s", set->model);
    snprintf(sum->cluster, sizeof sum->cluster, "%s",
             set->cluster[0] || cluster_name == NULL ? set->cluster : cluster_name);
    sum->micro_batches = set->micro_batches > 0 ? set->micro_batches : 1;
    int dpn = devices_per_node > 0 ? devices_per_node : set->n_devices;
    for (int d = 0; d < set->n_devices; d++) {
        int stage = set->programs[d].stage;
        sum->devices[d].stage = stage >= 0 && stage < set->n_stages ? stage : -1;
    }
    for (int k = 0; k < set->n_stages; k++) {
        ps_summary_stage *g = &sum->stages[k];
        int nodes = 0, last_node = -1;
        for (int d = 0; d < set->n_devices; d++) {
            if (sum->devices[d].stage != k)
                continue;
            if (g->n_devices++ == 0)
                g->first_device = d;
            int node = d / dpn;
            nodes += node != last_node;
            last_node = node;
        }
        int n = g->n_devices;
        if (nodes > 0 && n % nodes == 0) {
            g->submesh[0] = nodes;
            g->submesh[1] = n / nodes;
        } else {
            g->submesh[0] = 1;
            g->submesh[1] = n;
        }
        const int *mesh = set->stages[k].mesh;
        if ((long long)mesh[0] * mesh[1] == n && mesh[0] > 0) {
            g->logical_mesh[0] = mesh[0];
            g->logical_mesh[1] = mesh[1];
        } else {
            g->logical_mesh[0] = n;
            g->logical_mesh[1] = 1;
        }
    }
    *out = sum;
    return PS_OK;
}

void ps_summary_set_throughput(ps_summary *s, const ps_program_set *set)
{
    int staged = 0;
    for (int d = 0; d < s->n_devices; d++)
        staged += s->devices[d].stage >= 0;
    s->tflops_per_device = s->mfu = 0;
    if (!(s->iteration_s > 0) || staged == 0)
        return;
    s->tflops_per_device = set->flops_per_step / s->iteration_s / staged / 1e12;
    if (set->mfu_peak_flops_per_s > 0)
        s->mfu = s->tflops_per_device * 1e12 / set->mfu_peak_flops_per_s;
}
