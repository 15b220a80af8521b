#include "exec/check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void ps_exec_compare(const ps_graph *g, const ps_exec_result *r, const ps_graph *rg,
                     const ps_exec_result *ref, double rel_tol, double param_atol,
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
            out->param_abs = out->grad_rel = INFINITY;
            missing = true;
            break;
        }
        int64_t n = ps_tensor_numel(&g->tensors[t]);
        double pd = 0, gd = 0, gs = 0;
        for (int64_t i = 0; i < n; i++) {
            pd = fmax(pd, fabs((double)r->params[t][i] - ref->params[u][i]));
            gd = fmax(gd, fabs((double)r->grads[t][i] - ref->grads[u][i]));
            gs = fmax(gs, fabs((double)ref->grads[u][i]));
        }
        double scale = fmax(gs, 1e-3 * global);
        double gr = gd / (scale > 0 ? scale : 1);
        out->params++;
        if (!(pd <= out->param_abs)) {
            out->param_abs = pd;
            snprintf(out->param_worst, sizeof out->param_worst, "%s", name);
        }
        if (!(gr <= out->grad_rel)) {
            out->grad_rel = gr;
            snprintf(out->grad_worst, sizeof out->grad_worst, "%s", name);
        }
    }
    out->ok = !missing && out->loss_rel <= rel_tol && out->grad_rel <= rel_tol &&
              out->param_abs <= param_atol;
}
