#include "traces/plan_summary.h"

#include <stdio.h>
#include <string.h>

ps_status ps_summary_from_plan(const ps_plan *p, ps_summary **out)
{
    int n_dev = ps_cluster_device_count(p->cluster);
    ps_summary *s = NULL;
    *out = NULL;
    ps_status st = ps_summary_create(n_dev, p->n_stages, &s);
    if (st != PS_OK)
        return st;
    snprintf(s->source, sizeof s->source, "planner");
    ps_plan_digest(p, s->plan, sizeof s->plan);
    snprintf(s->model, sizeof s->model, "%s", p->model_name ? p->model_name : "");
    snprintf(s->cluster, sizeof s->cluster, "%s", p->cluster->name);
    s->micro_batches = p->micro_batches;
    s->iteration_s = p->iteration_s;
    s->tflops_per_device = p->tflops_per_device;
    s->mfu = p->mfu;
    s->peak_memory_bytes = p->peak_memory_bytes;
    for (int k = 0; k < p->n_stages; k++) {
        const ps_plan_stage *ps = &p->stages[k];
        ps_summary_stage *ss = &s->stages[k];
        ss->index = k;
        ss->n_devices = ps->n_devices;
        ss->first_device = ps->devices[0];
        for (int i = 1; i < ps->n_devices; i++)
            if (ps->devices[i] < ss->first_device)
                ss->first_device = ps->devices[i];
        memcpy(ss->submesh, ps->submesh, sizeof ss->submesh);
        memcpy(ss->logical_mesh, ps->logical_mesh, sizeof ss->logical_mesh);
        ss->forward_s = ps->forward_s;
        ss->backward_s = ps->backward_s;
        ss->update_s = ps->update_s;
        ss->time_s = ps->time_s;
        ss->peak_memory_bytes = ps->peak_memory_bytes;
        /* the plan splits time into compute and communication per op */
        double compute = 0, comm = 0;
        for (int j = 0; j < ps->n_ops; j++) {
            compute += ps->ops[j].compute_s;
            comm += ps->ops[j].comm_s;
        }
        double per_step = ps->time_s * p->micro_batches + ps->update_s;
        double busy = compute + comm > 0 ? compute / (compute + comm) : 1;
        for (int i = 0; i < ps->n_devices; i++) {
            ps_summary_device *d = &s->devices[ps->devices[i]];
            d->stage = k;
            d->compute_s = per_step * busy;
            d->comm_s = per_step * (1 - busy);
            d->idle_s = p->iteration_s > per_step ? p->iteration_s - per_step : 0;
            d->peak_memory_bytes = ps->peak_memory_bytes;
        }
    }
    *out = s;
    return PS_OK;
}
