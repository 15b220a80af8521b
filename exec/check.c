#include "exec/check.h"
#include "exec/half.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

ps_dtype ps_exec_storage(const ps_graph *step, bool half_storage)
{
    for (int t = 0; t < step->n_tensors && half_storage; t++)
        if (step->tensors[t].kind == PS_TENSOR_PARAM)
            return step->tensors[t].desc.dtype;
    return PS_DTYPE_F32;
}

bool ps_exec_has_half(const ps_graph *step)
{
    for (int t = 0; t < step->n_tensors; t++)
        if (ps_half_dtype(step->tensors[t].desc.dtype))
            return true;
    return false;
}

ps_exec_tolerance ps_exec_tolerance_default(ps_dtype storage, int steps)
{
    ps_exec_tolerance t = {.rel = 1e-4, .grad_floor = 1e-3, .param_abs = 5e-3, .param_rel = 0};
    double u = storage == PS_DTYPE_BF16 ? 0x1p-8 : storage == PS_DTYPE_F16 ? 0x1p-11 : 0;
    if (u > 0) {
        t.rel = 32 * u;
        t.grad_floor = 1e-2;
        t.grad_min = storage == PS_DTYPE_BF16 ? 0x1p-126 : 0x1p-14;
        t.param_abs = 5e-3 * (steps > 1 ? steps : 1);
        t.param_rel = 2 * u;
    }
    return t;
}

void ps_exec_compare(const ps_graph *g, const ps_exec_result *r, const ps_graph *rg,
                     const ps_exec_result *ref, const ps_exec_tolerance *tol,
                     ps_exec_comparison *out)
{
    memset(out, 0, sizeof *out);
    int steps = r->steps < ref->steps ? r->steps : ref->steps;
    for (int s = 0; s < steps; s++) {
        double d = fabs(r->loss[s] - ref->loss[s]);
        out->loss_rel = fmax(out->loss_rel, d / fmax(fabs(ref->loss[s]), 1e-30));
    }
    if (r->steps != ref->steps)
        out->loss_rel = INFINITY;
    /* the model's gradient scale */
    double global = 0;
    for (int t = 0; t < rg->n_tensors; t++)
        if (ref->grads[t] != NULL)
            for (int64_t i = 0, n = ps_tensor_numel(&rg->tensors[t]); i < n; i++)
                global = fmax(global, fabs((double)ref->grads[t][i]));
    bool missing = false;
    for (int t = 0; t < g->n_tensors && !missing; t++) {
        if (g->tensors[t].kind != PS_TENSOR_PARAM)
            continue;
        const char *name = g->tensors[t].name;
        int u = ps_graph_find_tensor(rg, name);
        if (u < 0 || r->params[t] == NULL || ref->params[u] == NULL || r->grads[t] == NULL ||
            ref->grads[u] == NULL) {
            snprintf(out->param_worst, sizeof out->param_worst, "%s (missing)", name);
            snprintf(out->grad_worst, sizeof out->grad_worst, "%s (missing)", name);
            out->param_abs = out->param_excess = out->grad_rel = INFINITY;
            missing = true;
            break;
        }
        int64_t n = ps_tensor_numel(&g->tensors[t]);
        double pd = 0, gd = 0, gs = 0, px = 0;
        for (int64_t i = 0; i < n; i++) {
            double d = fabs((double)r->params[t][i] - ref->params[u][i]);
            pd = fmax(pd, d);
            px = fmax(px, d / (tol->param_abs + tol->param_rel * fabs((double)ref->params[u][i])));
            gd = fmax(gd, fabs((double)r->grads[t][i] - ref->grads[u][i]));
            gs = fmax(gs, fabs((double)ref->grads[u][i]));
        }
        double scale = fmax(fmax(gs, tol->grad_floor * global), tol->grad_min);
        double gr = gd / (scale > 0 ? scale : 1);
        out->params++;
        if (!(px <= out->param_excess)) {
            out->param_excess = px;
            snprintf(out->param_worst, sizeof out->param_worst, "%s", name);
        }
        out->param_abs = fmax(out->param_abs, pd);
        if (!(gr <= out->grad_rel)) {
            out->grad_rel = gr;
            snprintf(out->grad_worst, sizeof out->grad_worst, "%s", name);
        }
    }
    out->ok = !missing && out->loss_rel <= tol->rel && out->grad_rel <= tol->rel &&
              out->param_excess <= 1;
}
