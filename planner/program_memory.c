#include "planner/program_memory.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/program.h"
#include "planner/lower.h"
#include "planner/plan_model.h"

ps_status ps_plan_program_memory(const ps_plan *p, ps_program_memory *out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    double *peak = NULL;
    double t0 = ps_monotonic_s();
    memset(out, 0, sizeof *out);
    out->worst_device = out->worst_stage = -1;
    ps_lower_options lo = ps_lower_options_default();
    int n = ps_cluster_device_count(p->cluster);
    peak = calloc((size_t)(n > 0 ? n : 1), sizeof *peak);
    PS_TRY_ALLOC(peak, err);
    PS_TRY(ps_plan_model_build(p, &m, err));
    /* the lowering's programs are well formed (the simulator and the
     * executors check them before they run): only the peaks are needed, at
     * a tenth of the check's time on 1024 devices, each measured as its
     * program is lowered and then dropped */
    lo.peak_bytes = peak;
    PS_TRY(ps_plan_lower(p, m, &lo, &set, err));
    double worst = -INFINITY;
    for (int d = 0; d < set->n_devices && d < ps_cluster_device_count(p->cluster); d++) {
        double memory = ps_cluster_device(p->cluster, d)->memory_bytes;
        out->max_peak_bytes = fmax(out->max_peak_bytes, peak[d]);
        if (set->programs[d].stage < 0 || peak[d] - memory <= worst)
            continue;
        worst = peak[d] - memory;
        out->worst_device = d;
        out->worst_stage = set->programs[d].stage;
        out->peak_bytes = peak[d];
        out->memory_bytes = memory;
    }
out:
    out->lower_s = ps_monotonic_s() - t0;
    free(peak);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    return st;
}
