#include "planner/plan_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "planner/plan_intra.h"

void ps_plan_model_free(ps_plan_model *m)
{
    if (m == NULL)
        return;
    ps_graph_free(m->forward);
    ps_graph_free(m->layered);
    ps_graph_free(m->step);
    free(m->remat_layers);
    free(m->layer_stage);
    free(m);
}

ps_status ps_plan_model_build(const ps_plan *p, ps_plan_model **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_json_doc *doc = NULL;
    ps_layering lay = {0};
    ps_plan_model *m = calloc(1, sizeof *m);
    *out = NULL;
    PS_TRY_ALLOC(m, err);
    /* a loaded plan's model and training are read where the file has them,
     * so that messages point into it; a plan made in memory is written out */
    ps_jv top, root, v;
    if (p->source != NULL) {
        top = ps_json_doc_root(p->source);
        PS_TRY(ps_jv_member(&top, "model", &root, err));
    } else {
        PS_TRY(ps_json_doc_from_value("plan model", p->model, &doc, err));
        root = ps_json_doc_root(doc);
    }
    static const char *const model_keys[] = {"name", "zoo", "config", "graph", "layers",
                                             "layer_num", NULL};
    static const char *const layerings[] = {"auto", "manual"};
    PS_TRY(ps_jv_check_keys(&root, model_keys, err));
    const char *layers_how = "tags";
    int64_t layer_num = 0;
    if (ps_jv_has(&root, "config")) {
        const char *zoo;
        PS_TRY(ps_jv_member(&root, "zoo", &v, err));
        PS_TRY(ps_jv_string(&v, &zoo, err));
        PS_TRY(ps_jv_member(&root, "config", &v, err));
        PS_TRY(ps_model_config_from_json(&v, zoo, &m->config, err));
        PS_TRY(ps_model_build(&m->config, &m->forward, err));
        m->from_zoo = true;
    } else {
        PS_TRY(ps_jv_member(&root, "graph", &v, err));
        PS_TRY(ps_graph_from_json(&v, &m->forward, err));
    }
    if (ps_jv_has(&root, "layers")) {
        int k;
        PS_TRY(ps_jv_member(&root, "layers", &v, err));
        PS_TRY(ps_jv_enum(&v, layerings, 2, &k, err));
        layers_how = layerings[k];
    }
    PS_TRY(ps_jv_opt_int(&root, "layer_num", 0, 0, 4096, &layer_num, err));
    if (strcmp(layers_how, "manual") == 0) {
        PS_TRY(ps_layer_cluster_manual(m->forward, &lay, err));
    } else if (strcmp(layers_how, "auto") == 0) {
        PS_TRY(ps_layer_cluster_auto(m->forward, (int)layer_num, 0.5, &lay, err));
    }
    if (lay.op_layer != NULL) {
        PS_TRY(ps_graph_relayer(m->forward, &lay, &m->layered, err));
    } else if (ps_graph_clone(m->forward, &m->layered) != PS_OK) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (p->training != NULL) {
        ps_json_doc *tdoc = NULL;
        ps_jv troot;
        if (p->source != NULL && ps_jv_has(&top, "training")) {
            PS_TRY(ps_jv_member(&top, "training", &troot, err));
        } else {
            PS_TRY(ps_json_doc_from_value("plan training", p->training, &tdoc, err));
            troot = ps_json_doc_root(tdoc);
        }
        /* remat_layers name the plan's layers (those its stages cover), which
         * clustering may make more of than the model has tags */
        st = ps_train_options_from_json(&troot, &m->train, &m->remat_layers,
                                        m->layered->n_layers, err);
        ps_json_doc_free(tdoc);
        if (st != PS_OK)
            goto out;
    } else {
        m->train = ps_train_options_default();
    }
    if (p->n_stages > 1) {
        /* a parameter shared by stages (a tied embedding) sums its gradient
         * once per step (ps_train_options.layer_stage) */
        int n = m->layered->n_layers;
        m->layer_stage = malloc((size_t)(n > 0 ? n : 1) * sizeof *m->layer_stage);
        PS_TRY_ALLOC(m->layer_stage, err);
        for (int l = 0; l < n; l++)
            m->layer_stage[l] = -1;
        for (int k = 0; k < p->n_stages; k++)
            for (int l = p->stages[k].first_layer; l <= p->stages[k].last_layer && l < n; l++)
                if (l >= 0)
                    m->layer_stage[l] = k;
    }
    /* the stages are this plan's: m->train (which others reuse for other
     * graphs, e.g. the single-device reference) does not keep them */
    ps_train_options staged = m->train;
    staged.layer_stage = m->layer_stage;
    PS_TRY(ps_train_step_build(m->layered, &staged, &m->step, err));
    *out = m;
    m = NULL;
out:
    ps_layering_clear(&lay);
    ps_json_doc_free(doc);
    ps_plan_model_free(m);
    return st;
}

ps_status ps_plan_check(const ps_plan *p, const ps_plan_model *m, ps_error *err)
{
    const ps_graph *g = m->step;
    const ps_plan_stage *last = &p->stages[p->n_stages - 1];
    /* the model's graph is built for one micro-batch: a plan that splits
     * its batch otherwise would run other micro-batches than it predicts */
    int64_t built = ps_graph_batch(m->forward);
    if (built > 0 && built != p->global_batch / p->micro_batches)
        return ps_error_set(err, PS_ERR_INVALID,
                            "the model is built for micro-batches of %lld (%s), the plan splits "
                            "its global batch %lld into %d micro-batches of %lld",
                            (long long)built,
                            m->from_zoo ? "model.config.batch" : "its graph's first input",
                            p->global_batch, p->micro_batches,
                            p->global_batch / p->micro_batches);
    if (last->last_layer != g->n_layers - 1)
        return ps_error_set(err, PS_ERR_INVALID,
                            "the plan's stages cover layers 0-%d, the model has 0-%d",
                            last->last_layer, g->n_layers - 1);
    for (int k = 0; k < p->n_stages; k++) {
        const ps_plan_stage *s = &p->stages[k];
        int j = 0;
        for (int i = 0; i < g->n_ops; i++) {
            const ps_op *op = &g->ops[i];
            if (op->layer < s->first_layer || op->layer > s->last_layer)
                continue;
            if (j >= s->n_ops)
                return ps_error_set(err, PS_ERR_INVALID,
                                    "stage %d lists %d ops; the model's layers %d-%d have more "
                                    "(next: %s)",
                                    k, s->n_ops, s->first_layer, s->last_layer, op->name);
            const ps_plan_op *po = &s->ops[j++];
            if (strcmp(po->name, op->name) != 0)
                return ps_error_set(err, PS_ERR_INVALID,
                                    "stage %d op %d is \"%s\" in the plan but \"%s\" in the model",
                                    k, j - 1, po->name, op->name);
            if (po->n_in != op->n_in || po->n_out != op->n_out)
                return ps_error_set(err, PS_ERR_INVALID, "stage %d op %s: wrong number of specs",
                                    k, op->name);
            for (int q = 0; q < op->n_in; q++)
                if (po->in[q].rank != g->tensors[op->in[q]].desc.rank)
                    return ps_error_set(err, PS_ERR_INVALID,
                                        "stage %d op %s: input %d spec has rank %d, the tensor %d",
                                        k, op->name, q, po->in[q].rank,
                                        g->tensors[op->in[q]].desc.rank);
            for (int q = 0; q < op->n_out; q++)
                if (po->out[q].rank != g->tensors[op->out[q]].desc.rank)
                    return ps_error_set(err, PS_ERR_INVALID,
                                        "stage %d op %s: output %d spec has rank %d, the tensor "
                                        "%d",
                                        k, op->name, q, po->out[q].rank,
                                        g->tensors[op->out[q]].desc.rank);
        }
        if (j != s->n_ops)
            return ps_error_set(err, PS_ERR_INVALID,
                                "stage %d lists %d ops; the model's layers %d-%d have %d", k,
                                s->n_ops, s->first_layer, s->last_layer, j);
    }
    /* the same ops, and their sizes those planned: a model edited where no
     * op or layer changes (an FFN's width, say) would run another step than
     * the plan's predictions are for; its FLOPs tell (a plan without them,
     * 0, is not checked) */
    if (p->flops_per_step > 0) {
        double flops = 0;
        ps_status st = ps_plan_step_flops(g, p->micro_batches, &flops);
        if (st != PS_OK)
            return ps_error_set(err, st, "out of memory");
        if (!(fabs(flops - p->flops_per_step) <= 1e-9 * p->flops_per_step))
            return ps_error_set(err, PS_ERR_INVALID,
                                "the model computes %.6g FLOPs a step, the plan was made for "
                                "%.6g: its model (%s) is not the one planned",
                                flops, p->flops_per_step,
                                m->from_zoo ? "model.config" : "model.graph");
    }
    return PS_OK;
}
