#include "planner/plan_intra.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes_text.h"
#include "core/json.h"
#include "planner/plan_model.h"

ps_status ps_plan_fill_stage(ps_plan_stage *s, const ps_graph *step, const ps_logical_mesh *m,
                             const ps_intra_result *r, ps_error *err)
{
    ps_status st = PS_OK;
    memcpy(s->devices, m->devices, (size_t)m->n_devices * sizeof *s->devices);
    s->submesh[0] = m->hosts;
    s->submesh[1] = m->devices_per_host;
    s->logical_mesh[0] = m->shape[0];
    s->logical_mesh[1] = m->shape[1];
    for (int i = 0; i < step->n_ops && i < s->n_ops; i++) {
        const ps_op *op = &step->ops[i];
        const ps_strategy *sg = &r->op_strategy[i];
        ps_plan_op *po = &s->ops[i];
        po->name = strdup(op->name);
        po->strategy = strdup(sg->name);
        PS_TRY_ALLOC(po->name, err);
        PS_TRY_ALLOC(po->strategy, err);
        po->n_in = op->n_in;
        po->n_out = op->n_out;
        memcpy(po->in, sg->in, sizeof po->in);
        memcpy(po->out, sg->out, sizeof po->out);
        po->compute_s = sg->compute_s;
        po->comm_s = sg->comm_s + r->reshard_in_s[i];
    }
    for (int t = 0; t < step->n_tensors && t < s->n_tensors; t++) {
        s->tensors[t].name = strdup(step->tensors[t].name);
        PS_TRY_ALLOC(s->tensors[t].name, err);
        s->tensors[t].spec = r->tensor_spec[t];
    }
    s->forward_s = r->compute_s[PS_PASS_FORWARD] + r->comm_s[PS_PASS_FORWARD];
    s->backward_s = r->compute_s[PS_PASS_BACKWARD] + r->comm_s[PS_PASS_BACKWARD] +
                    r->compute_s[PS_PASS_RECOMPUTE] + r->comm_s[PS_PASS_RECOMPUTE];
    s->update_s = r->compute_s[PS_PASS_UPDATE] + r->comm_s[PS_PASS_UPDATE];
    s->time_s = s->forward_s + s->backward_s;
    s->peak_memory_bytes = r->peak_memory_bytes;
    s->weight_bytes = r->weight_bytes;
    s->gradient_bytes = r->gradient_bytes;
    s->optimizer_bytes = r->optimizer_bytes;
    s->activation_bytes = r->activation_bytes;
    s->layout_gap = fmin(1, fmax(0, r->ilp.gap));
out:
    return st;
}

ps_status ps_plan_record_request(ps_plan *plan, const ps_plan_request *req, ps_error *err)
{
    ps_status st = PS_OK;
    json_t *j = NULL;
    plan->model_name = strdup(req->forward->name);
    plan->model = json_object();
    PS_TRY_ALLOC(plan->model_name, err);
    PS_TRY_ALLOC(plan->model, err);
    st = ps_json_set(plan->model, "name", json_string(req->forward->name));
    if (st == PS_OK)
        st = req->config != NULL ? ps_model_config_to_json(req->config, &j)
                                 : ps_graph_to_json(req->forward, &j);
    if (st == PS_OK)
        st = ps_json_set(plan->model, req->config != NULL ? "config" : "graph", j);
    if (st == PS_OK && req->config != NULL)
        st = ps_json_set(plan->model, "zoo", json_string(req->config->name));
    if (st == PS_OK)
        st = ps_train_options_to_json(&req->train, req->forward->n_layers, &plan->training);
    if (st == PS_OK)
        st = ps_cluster_clone(req->cluster, &plan->cluster);
    if (st != PS_OK)
        st = ps_error_set(err, st, "out of memory");
    plan->global_batch = req->global_batch;
    plan->micro_batches = req->micro_batches;
out:
    return st;
}

double ps_plan_mfu(double tflops_per_device, const ps_graph *step, const ps_cluster *c)
{
    ps_dtype dt = ps_graph_param_dtype(step, PS_DTYPE_F32);
    double peak = INFINITY;
    for (int d = 0; d < ps_cluster_device_count(c); d++) {
        const ps_device_kind *k = ps_cluster_device(c, d);
        peak = fmin(peak, k->peak_flops[dt] > 0 ? k->peak_flops[dt] : k->peak_flops[PS_DTYPE_F32]);
    }
    return tflops_per_device * 1e12 / peak;
}

ps_status ps_plan_step_flops(const ps_graph *step, int micro_batches, double *out)
{
    ps_graph_stats gs;
    *out = 0;
    PS_TRY_RET(ps_graph_stats_compute(step, &gs));
    *out = (gs.flops[PS_PASS_FORWARD] + gs.flops[PS_PASS_BACKWARD] +
            gs.flops[PS_PASS_RECOMPUTE]) * micro_batches +
           gs.flops[PS_PASS_UPDATE];
    return PS_OK;
}

ps_status ps_plan_one_stage(const ps_plan_request *req, ps_plan **out,
                            ps_intra_result **intra_out, ps_graph **step_out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_graph *step = NULL;
    ps_logical_mesh *m = NULL;
    ps_intra_result *r = NULL;
    ps_intra_session *session = NULL; /* the budgeted attempts'; borrows step and m */
    ps_plan *plan = NULL;
    *out = NULL;
    const ps_cluster *c = req->cluster;
    int n = ps_cluster_device_count(c), dpn = c->devices_per_node;
    int d0 = req->mesh[0], d1 = req->mesh[1];
    if (d0 == 0 && d1 == 0) {
        bool batch_method = req->method != PS_METHOD_SHARD;
        d0 = batch_method ? n : c->nodes;
        d1 = batch_method ? 1 : dpn;
    }
    if (req->micro_batches < 1 || req->global_batch % req->micro_batches != 0)
        return ps_error_set(err, PS_ERR_INVALID,
                            "%d micro-batches do not divide the global batch %lld",
                            req->micro_batches, req->global_batch);
    int hosts = n > dpn ? c->nodes : 1;
    if ((int64_t)d0 * d1 != n) {
        st = ps_error_set(err, PS_ERR_INVALID,
                          "logical mesh %dx%d does not have the cluster's %d devices", d0, d1, n);
        goto out;
    }
    PS_TRY(ps_mesh_create(c, 0, hosts, n / hosts, d0, d1, &m, err));
    if (req->method != PS_METHOD_SHARD) {
        /* the batch methods split every input's leading dimension over axis 0 */
        for (int t = 0; t < req->forward->n_tensors; t++) {
            const ps_tensor *x = &req->forward->tensors[t];
            if (x->kind == PS_TENSOR_INPUT && x->desc.rank > 0 && x->desc.shape[0] % d0 != 0) {
                /* a graph file's micro-batch is what its inputs say, and its
                 * inputs need not agree on one batch size: name the input */
                if (req->config != NULL)
                    st = ps_error_set(err, PS_ERR_INVALID,
                                      "method %s: a micro-batch of %lld samples does not split "
                                      "over %d devices; use fewer micro-batches or a larger batch",
                                      ps_intra_method_names[req->method],
                                      (long long)x->desc.shape[0], d0);
                else
                    st = ps_error_set(err, PS_ERR_INVALID,
                                      "method %s splits every input's leading dimension over the "
                                      "%d devices, and input \"%s\" has %lld; give the graph's "
                                      "inputs leading dimensions divisible by %d, or plan with "
                                      "--method shard or pipeshard",
                                      ps_intra_method_names[req->method], d0, x->name,
                                      (long long)x->desc.shape[0], d0);
                goto out;
            }
        }
    }
    PS_TRY(ps_train_step_build(req->forward, &req->train, &step, err));
    ps_intra_options io = ps_intra_options_default();
    io.method = req->method;
    io.micro_batches = req->micro_batches;
    io.force_batch_axis0 = req->force_batch_axis0;
    io.ilp = req->ilp;
    PS_TRY(ps_intra_solve(step, m, &io, &r, err));
    /* Too big: solve again with the memory constraint. The ILP counts what
     * lives through a micro-batch; leave room for the micro-batch's working
     * set above it (the transient of the fastest layout). */
    for (int attempt = 0; attempt < 3 && r->peak_memory_bytes > m->memory_bytes; attempt++) {
        double lasting = r->weight_bytes + r->gradient_bytes + r->optimizer_bytes +
                         r->activation_bytes;
        double transient = r->peak_memory_bytes - lasting;
        io.memory_budget_bytes = (io.memory_budget_bytes > 0 ? io.memory_budget_bytes
                                                               : m->memory_bytes - transient) -
                                 (attempt > 0 ? r->peak_memory_bytes - m->memory_bytes : 0);
        ps_intra_result *fit = NULL;
        ps_error inner = {0};
        if (io.memory_budget_bytes > 0) {
            /* the attempts share a session: each goes on from the last */
            if (session == NULL)
                st = ps_intra_session_create(step, m, &io, &session, &inner);
            if (session != NULL)
                st = ps_intra_session_solve(session, &io, &fit, &inner);
        } else {
            /* attempt 0: the working set alone fills the devices; later,
             * the refits' overshoots have used up what was left */
            st = ps_error_set(err, PS_ERR_INFEASIBLE,
                              "%s does not fit in memory with method %s on %dx%d (%.4g GiB per "
                              "device):%s no room is left beside a micro-batch's working set "
                              "(%.4g GiB in the best layout found)",
                              req->forward->name, ps_intra_method_names[req->method], d0, d1,
                              m->memory_bytes / PS_GIB,
                              attempt == 0 ? "" : " refitted to a smaller budget,",
                              transient / PS_GIB);
            goto out;
        }
        if (st != PS_OK) {
            st = ps_error_set(err, st,
                              "%s does not fit in memory with method %s on %dx%d (%.4g GiB per "
                              "device; %.4g GiB left beside a micro-batch's working set): %s",
                              req->forward->name, ps_intra_method_names[req->method], d0, d1,
                              m->memory_bytes / PS_GIB, io.memory_budget_bytes / PS_GIB, inner.msg);
            goto out;
        }
        ps_intra_result_free(r);
        r = fit;
    }
    if (r->peak_memory_bytes > m->memory_bytes) {
        st = ps_error_set(err, PS_ERR_INFEASIBLE,
                          "%s does not fit in memory with method %s on %dx%d: the best layout "
                          "needs %.4g GiB per device, %.4g GiB are available",
                          req->forward->name, ps_intra_method_names[req->method], d0, d1,
                          r->peak_memory_bytes / PS_GIB, m->memory_bytes / PS_GIB);
        goto out;
    }

    if ((st = ps_plan_create(&plan)) != PS_OK) {
        st = ps_error_set(err, st, "out of memory");
        goto out;
    }
    PS_TRY(ps_plan_record_request(plan, req, err));
    snprintf(plan->method, sizeof plan->method, "%s", ps_intra_method_names[req->method]);
    ps_plan_stage *s;
    if ((st = ps_plan_add_stage(plan, m->n_devices, step->n_ops, step->n_tensors, &s)) != PS_OK) {
        st = ps_error_set(err, st, "out of memory");
        goto out;
    }
    s->first_layer = 0;
    s->last_layer = step->n_layers - 1;
    PS_TRY(ps_plan_fill_stage(s, step, m, r, err));
    /* recorded as applied: a mesh of one row has no axis 0 to keep it on */
    s->force_batch_axis0 = req->force_batch_axis0 && m->shape[0] > 1;

    /* predictions: micro-batches run back to back, the update once */
    PS_TRY(ps_plan_step_flops(step, req->micro_batches, &plan->flops_per_step));
    plan->iteration_s = s->time_s * req->micro_batches + s->update_s;
    plan->tflops_per_device = plan->flops_per_step / plan->iteration_s / m->n_devices / 1e12;
    plan->mfu = ps_plan_mfu(plan->tflops_per_device, step, c);
    plan->peak_memory_bytes = s->peak_memory_bytes;
    PS_TRY(ps_plan_validate(plan, err));
    *out = plan;
    plan = NULL;
    if (intra_out != NULL) {
        *intra_out = r;
        r = NULL;
    }
    if (step_out != NULL) {
        *step_out = step;
        step = NULL;
    }
out:
    ps_intra_session_free(session);
    ps_plan_free(plan);
    ps_intra_result_free(r);
    ps_graph_free(step);
    ps_mesh_free(m);
    return st;
}

ps_status ps_plan_reference(const ps_plan *p, const ps_plan_model *m, ps_plan **out,
                            ps_error *err)
{
    ps_status st = PS_OK;
    ps_cluster *one = NULL;
    const ps_cluster *c = p->cluster;
    *out = NULL;
    /* a numerical oracle, not a real device: memory is no constraint */
    ps_device_kind kind = c->kinds[0];
    kind.memory_bytes = 1e18;
    PS_TRY(ps_cluster_create("reference", 1, 1, &kind, &c->intra, &c->inter, &one, err));
    ps_plan_request req;
    memset(&req, 0, sizeof req);
    req.forward = m->forward;
    req.config = m->from_zoo ? &m->config : NULL;
    req.train = m->train;
    req.train.remat = false;
    req.train.remat_layers = NULL;
    req.cluster = one;
    req.method = PS_METHOD_DATA;
    req.mesh[0] = req.mesh[1] = 1;
    req.global_batch = p->global_batch;
    req.micro_batches = p->micro_batches > 0 ? p->micro_batches : 1;
    req.ilp = ps_ilp_options_default();
    PS_TRY(ps_plan_one_stage(&req, out, NULL, NULL, err));
out:
    ps_cluster_free(one);
    return st;
}
