#include "traces/plan_summary.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Predicted compute and communication seconds of stage k's kernels of
 * phases [from, to]: COMPUTE and SLICE are compute, COLLECTIVE
 * communication (as the simulator counts them). */
static void kernel_split(const ps_program_set *set, int k, int from, int to, double *compute,
                         double *comm)
{
    *compute = *comm = 0;
    for (int ph = from; ph <= to; ph++) {
        int ki = set->stages[k].kernel[ph];
        if (ki < 0 || ki >= set->n_kernels) /* an empty phase */
            continue;
        const ps_kernel *kn = &set->kernels[ki];
        for (int i = 0; i < kn->n_instrs; i++) {
            const ps_instr *in = &kn->instrs[i];
            if (in->kind == PS_INSTR_COMPUTE || in->kind == PS_INSTR_SLICE)
                *compute += in->seconds;
            else if (in->kind == PS_INSTR_COLLECTIVE)
                *comm += in->seconds;
        }
    }
}

/* The compute share of a phase's time: 1 where it has no communication. */
static double compute_share(double compute, double comm)
{
    return compute + comm > 0 ? compute / (compute + comm) : 1;
}

ps_status ps_summary_from_plan(const ps_plan *p, const ps_program_set *set, const double *receive_s,
                               const double *compute_saved_s, const double *compute_wall_s,
                               ps_summary **out)
{
    int n_dev = ps_cluster_device_count(p->cluster);
    ps_summary *s = NULL;
    *out = NULL;
    if (set->n_stages != p->n_stages)
        return PS_ERR_INVALID;
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
        /* per phase: its time, of which computing as the schedule ran it */
        const double charged[PS_PHASE_COUNT] = {ps->forward_s, ps->backward_s, ps->update_s};
        double phase_s[PS_PHASE_COUNT], compute_s = 0;
        for (int ph = 0; ph < PS_PHASE_COUNT; ph++) {
            double c, m,
                saved = compute_saved_s != NULL ? compute_saved_s[k * PS_PHASE_COUNT + ph] : 0;
            kernel_split(set, k, ph, ph, &c, &m);
            phase_s[ph] = fmax(0, charged[ph] - saved);
            double wall = compute_wall_s != NULL ? compute_wall_s[k * PS_PHASE_COUNT + ph] : -1;
            double computes = wall >= 0 ? wall : charged[ph] * compute_share(c, m);
            compute_s += computes * (ph == PS_PHASE_UPDATE ? 1 : p->micro_batches);
        }
        ss->forward_s = phase_s[PS_PHASE_FORWARD];
        ss->backward_s = phase_s[PS_PHASE_BACKWARD];
        ss->update_s = phase_s[PS_PHASE_UPDATE];
        /* as a summary states them (a plan file read back may disagree) */
        ss->time_s = ss->forward_s + ss->backward_s;
        ss->peak_memory_bytes = ps->peak_memory_bytes;
        s->peak_memory_bytes = fmax(s->peak_memory_bytes, ps->peak_memory_bytes);
        double per_step = ss->time_s * p->micro_batches + ss->update_s;
        for (int i = 0; i < ps->n_devices; i++) {
            ps_summary_device *d = &s->devices[ps->devices[i]];
            d->stage = k;
            d->compute_s = compute_s;
            d->comm_s = per_step - compute_s + (receive_s != NULL ? receive_s[k] : 0);
            d->peak_memory_bytes = ps->peak_memory_bytes;
        }
    }
    /* the summary's identity, as its reader checks it: a device of no
     * stage (a stage file may use fewer devices) idles the whole step */
    for (int i = 0; i < n_dev; i++) {
        ps_summary_device *d = &s->devices[i];
        d->idle_s = fmax(0.0, s->iteration_s - d->compute_s - d->comm_s);
    }
    *out = s;
    return PS_OK;
}
