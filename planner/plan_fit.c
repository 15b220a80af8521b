#include "planner/plan_fit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes_text.h"
#include "core/cluster.h"
#include "core/log.h"

ps_plan_fit_options ps_plan_fit_options_default(void)
{
    return (ps_plan_fit_options){.attempts = 4, .memory_scale = 1, .check = true};
}

/* The plan's cluster, planned with less memory, gets the real one back. */
static void restore_memory(ps_plan *p, const ps_cluster *real)
{
    for (int k = 0; k < p->cluster->n_kinds && k < real->n_kinds; k++)
        p->cluster->kinds[k].memory_bytes = real->kinds[k].memory_bytes;
}

ps_status ps_plan_fitting(const ps_plan_request *req, const ps_plan_fit_options *o,
                          ps_planner_fn plan, void *ctx, ps_plan **out, ps_plan_fit *fit,
                          ps_error *err)
{
    const ps_cluster *real = req->cluster;
    ps_cluster *planned = NULL; /* the cluster as planned with: less memory per device */
    ps_plan *p = NULL;
    ps_status st = PS_OK;
    double cut = 0; /* bytes taken off every device's memory */
    *out = NULL;
    *fit = (ps_plan_fit){0};
    if (o->attempts < 1 || !(o->memory_scale >= 1))
        return ps_error_set(err, PS_ERR_INVALID,
                            "planning to fit: %d attempts and memory scale %g (want >= 1 each)",
                            o->attempts, o->memory_scale);
    if (ps_cluster_clone(real, &planned) != PS_OK)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    for (int attempt = 1;; attempt++) {
        double least = INFINITY; /* over the kinds some device is */
        for (int k = 0; k < planned->n_kinds; k++)
            planned->kinds[k].memory_bytes = real->kinds[k].memory_bytes * o->memory_scale - cut;
        for (int d = 0; d < ps_cluster_device_count(planned); d++)
            least = fmin(least, ps_cluster_device(planned, d)->memory_bytes);
        ps_plan_request r = *req;
        r.cluster = planned;
        fit->attempts = attempt;
        fit->cut_bytes = cut;
        if (least <= 0)
            st = ps_error_set(err, PS_ERR_INFEASIBLE,
                              "no plan fits in memory: the programs need more than the devices "
                              "have, by more than they have");
        else
            st = plan(&r, ctx, &p, err);
        if (st != PS_OK) {
            if (attempt > 1 && err != NULL) { /* say why it planned again */
                char msg[PS_ERROR_MSG_MAX], by[32];
                snprintf(msg, sizeof msg, "%s", err->msg);
                ps_error_clear(err);
                ps_error_set(err, st,
                             "a plan's programs did not fit in memory, and planning again "
                             "with %s less per device failed: %s",
                             ps_bytes_text(cut, by, sizeof by), msg);
            }
            break;
        }
        restore_memory(p, real);
        if (!o->check)
            break;
        ps_program_memory *pm = &fit->programs;
        if ((st = ps_plan_program_memory(p, pm, err)) != PS_OK)
            break;
        double lack = pm->peak_bytes - pm->memory_bytes;
        if (lack <= 0)
            break;
        char need[32], have[32], est[32], to[32];
        ps_bytes_text(pm->peak_bytes, need, sizeof need);
        ps_bytes_text(pm->memory_bytes, have, sizeof have);
        ps_bytes_text(p->stages[pm->worst_stage].peak_memory_bytes, est, sizeof est);
        /* below what the planner thought the failing stage needs, by what it
         * lacked and half as much again (the plan does not change while the
         * memory planned with stays above its estimate); the failing
         * device's kind sets the cut */
        int kind = real->device_kind != NULL ? real->device_kind[pm->worst_device] : 0;
        double planned_with = real->kinds[kind].memory_bytes * o->memory_scale - cut;
        double next =
            fmin(planned_with, p->stages[pm->worst_stage].peak_memory_bytes) - 1.5 * lack;
        if (attempt == o->attempts || next <= 0) {
            /* out of attempts, or no memory left to plan again with (it
             * lacks two thirds of it or more) */
            bool gpipe = strcmp(p->schedule, "gpipe") == 0;
            /* what is left to try: not what the plan already does */
            bool recomputes = json_is_true(json_object_get(p->training, "remat")) ||
                              json_array_size(json_object_get(p->training, "remat_layers")) > 0;
            char whose[64] = "the plan's";
            if (attempt > 1)
                snprintf(whose, sizeof whose, "after %d attempts the best plan's", attempt);
            st = ps_error_set(err, PS_ERR_INFEASIBLE,
                              "no plan found that fits in memory: %s programs need %s on "
                              "device %d (stage %d), more than its %s (the planner estimated "
                              "%s); try %s%s or more devices (--no-memory-check writes the "
                              "plan anyway)",
                              whose, need, pm->worst_device, pm->worst_stage, have, est,
                              recomputes ? "" : "--remat, ",
                              gpipe ? "--schedule 1f1b (GPipe keeps every micro-batch's "
                                      "activations until its backward)"
                                    : "more micro-batches");
            break;
        }
        cut += planned_with - next;
        PS_LOG_WARN("the plan's programs need %s on device %d (stage %d), more than its %s (the "
                    "planner estimated %s): planning again with %s less per device",
                    need, pm->worst_device, pm->worst_stage, have, est,
                    ps_bytes_text(cut, to, sizeof to));
        ps_plan_free(p);
        p = NULL;
    }
    ps_cluster_free(planned);
    if (st != PS_OK) {
        ps_plan_free(p);
        return st;
    }
    *out = p;
    return PS_OK;
}
