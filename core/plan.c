#include "core/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

#define PLAN_FORMAT "pipeshard-plan"

ps_status ps_plan_create(ps_plan **out)
{
    ps_plan *p = calloc(1, sizeof *p);
    if (p == NULL)
        return PS_ERR_NOMEM;
    p->version = PS_PLAN_VERSION;
    p->micro_batches = 1;
    snprintf(p->schedule, sizeof p->schedule, "1f1b");
    *out = p;
    return PS_OK;
}

static void stage_clear(ps_plan_stage *s)
{
    for (int i = 0; i < s->n_ops; i++) {
        free(s->ops[i].name);
        free(s->ops[i].strategy);
    }
    for (int i = 0; i < s->n_tensors; i++)
        free(s->tensors[i].name);
    free(s->ops);
    free(s->tensors);
    free(s->devices);
}

void ps_plan_free(ps_plan *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < p->n_stages; i++)
        stage_clear(&p->stages[i]);
    free(p->stages);
    free(p->model_name);
    json_decref(p->model);
    json_decref(p->training);
    ps_cluster_free(p->cluster);
    ps_json_doc_free(p->source);
    free(p);
}

ps_status ps_plan_add_stage(ps_plan *p, int n_devices, int n_ops, int n_tensors,
                            ps_plan_stage **out)
{
    ps_plan_stage *bigger = realloc(p->stages, (size_t)(p->n_stages + 1) * sizeof *bigger);
    if (bigger == NULL)
        return PS_ERR_NOMEM;
    p->stages = bigger;
    ps_plan_stage *s = &p->stages[p->n_stages];
    memset(s, 0, sizeof *s);
    s->devices = calloc((size_t)n_devices + 1, sizeof *s->devices);
    s->ops = calloc((size_t)n_ops + 1, sizeof *s->ops);
    s->tensors = calloc((size_t)n_tensors + 1, sizeof *s->tensors);
    if (s->devices == NULL || s->ops == NULL || s->tensors == NULL) {
        free(s->devices);
        free(s->ops);
        free(s->tensors);
        return PS_ERR_NOMEM;
    }
    s->n_devices = n_devices;
    s->n_ops = n_ops;
    s->n_tensors = n_tensors;
    p->n_stages++;
    *out = s;
    return PS_OK;
}

ps_status ps_plan_validate(const ps_plan *p, ps_error *err)
{
    if (p->cluster == NULL || p->n_stages < 1)
        return ps_error_set(err, PS_ERR_INVALID, "plan: no cluster or no stage");
    if (p->global_batch < 1 || p->micro_batches < 1 || p->global_batch % p->micro_batches != 0)
        return ps_error_set(err, PS_ERR_INVALID,
                            "plan: %d micro-batches do not divide the global batch %lld",
                            p->micro_batches, p->global_batch);
    int n_dev = ps_cluster_device_count(p->cluster);
    unsigned char *used = calloc((size_t)n_dev + 1, 1);
    if (used == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    ps_status st = PS_OK;
    for (int i = 0; i < p->n_stages && st == PS_OK; i++) {
        const ps_plan_stage *s = &p->stages[i];
        if (s->first_layer > s->last_layer || s->first_layer < 0 ||
            (i == 0 && s->first_layer != 0) ||
            (i > 0 && s->first_layer != p->stages[i - 1].last_layer + 1))
            st = ps_error_set(err, PS_ERR_INVALID,
                              "plan: stage %d covers layers %d-%d; stages must cover "
                              "consecutive layers from 0",
                              i, s->first_layer, s->last_layer);
        else if (s->submesh[0] * s->submesh[1] != s->n_devices ||
                 s->logical_mesh[0] * s->logical_mesh[1] != s->n_devices || s->n_devices < 1)
            st = ps_error_set(err, PS_ERR_INVALID,
                              "plan: stage %d has %d devices, submesh %dx%d, logical mesh %dx%d",
                              i, s->n_devices, s->submesh[0], s->submesh[1], s->logical_mesh[0],
                              s->logical_mesh[1]);
        for (int d = 0; d < s->n_devices && st == PS_OK; d++) {
            int id = s->devices[d];
            if (id < 0 || id >= n_dev)
                st = ps_error_set(err, PS_ERR_INVALID,
                                  "plan: stage %d uses device %d; the cluster has devices 0 to %d",
                                  i, id, n_dev - 1);
            else if (used[id]++)
                st = ps_error_set(err, PS_ERR_INVALID, "plan: device %d is in two stages", id);
        }
        for (int k = 0; k < s->n_ops && st == PS_OK; k++)
            for (int j = 0; j < s->ops[k].n_in + s->ops[k].n_out && st == PS_OK; j++) {
                const ps_sharding_spec *sp =
                    j < s->ops[k].n_in ? &s->ops[k].in[j] : &s->ops[k].out[j - s->ops[k].n_in];
                if (!ps_spec_well_formed(sp))
                    st = ps_error_set(err, PS_ERR_INVALID, "plan: op %s has a bad spec",
                                      s->ops[k].name);
            }
    }
    free(used);
    return st;
}

/* ---- JSON ---------------------------------------------------------------------- */

static json_t *spec_json(const ps_sharding_spec *s)
{
    char buf[PS_SPEC_STR_MAX];
    return json_string(ps_spec_format(s, buf, sizeof buf));
}

static json_t *ints_json(const int *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static ps_status stage_json(const ps_plan_stage *s, int index, json_t **out)
{
    ps_status st = PS_OK;
    json_t *o = json_object(), *ops = NULL, *tensors = NULL, *pred = NULL;
    *out = NULL;
    if (o == NULL)
        return PS_ERR_NOMEM;
    int layers[2] = {s->first_layer, s->last_layer};
    PS_TRY(ps_json_set(o, "index", json_integer(index)));
    PS_TRY(ps_json_set(o, "layers", ints_json(layers, 2)));
    PS_TRY(ps_json_set(o, "devices", ints_json(s->devices, s->n_devices)));
    PS_TRY(ps_json_set(o, "submesh", ints_json(s->submesh, 2)));
    PS_TRY(ps_json_set(o, "logical_mesh", ints_json(s->logical_mesh, 2)));
    if (s->force_batch_axis0)
        PS_TRY(ps_json_set(o, "force_batch_axis0", json_true()));
    PS_TRY(ps_json_set(o, "time_s", json_real(s->time_s)));
    PS_TRY(ps_json_set(o, "peak_memory_bytes", json_real(s->peak_memory_bytes)));
    pred = json_object();
    PS_TRY(ps_json_set(o, "predicted", pred));
    PS_TRY(ps_json_set(pred, "forward_s", json_real(s->forward_s)));
    PS_TRY(ps_json_set(pred, "backward_s", json_real(s->backward_s)));
    PS_TRY(ps_json_set(pred, "update_s", json_real(s->update_s)));
    PS_TRY(ps_json_set(pred, "send_forward_s", json_real(s->send_forward_s)));
    PS_TRY(ps_json_set(pred, "send_backward_s", json_real(s->send_backward_s)));
    PS_TRY(ps_json_set(pred, "weight_bytes", json_real(s->weight_bytes)));
    PS_TRY(ps_json_set(pred, "gradient_bytes", json_real(s->gradient_bytes)));
    PS_TRY(ps_json_set(pred, "optimizer_bytes", json_real(s->optimizer_bytes)));
    PS_TRY(ps_json_set(pred, "activation_bytes", json_real(s->activation_bytes)));
    PS_TRY(ps_json_set(pred, "layout_gap", json_real(s->layout_gap)));
    ops = json_array();
    PS_TRY(ps_json_set(o, "ops", ops));
    for (int i = 0; i < s->n_ops; i++) {
        const ps_plan_op *op = &s->ops[i];
        json_t *j = json_object(), *in = json_array(), *outs = json_array();
        PS_TRY(ps_json_append(ops, j));
        PS_TRY(ps_json_set(j, "name", json_string(op->name)));
        PS_TRY(ps_json_set(j, "strategy", json_string(op->strategy)));
        PS_TRY(ps_json_set(j, "in", in));
        PS_TRY(ps_json_set(j, "out", outs));
        for (int k = 0; k < op->n_in; k++)
            PS_TRY(ps_json_append(in, spec_json(&op->in[k])));
        for (int k = 0; k < op->n_out; k++)
            PS_TRY(ps_json_append(outs, spec_json(&op->out[k])));
        PS_TRY(ps_json_set(j, "compute_s", json_real(op->compute_s)));
        PS_TRY(ps_json_set(j, "comm_s", json_real(op->comm_s)));
    }
    tensors = json_object();
    PS_TRY(ps_json_set(o, "tensors", tensors));
    for (int i = 0; i < s->n_tensors; i++)
        PS_TRY(ps_json_set(tensors, s->tensors[i].name, spec_json(&s->tensors[i].spec)));
    *out = o;
    o = NULL;
out:
    json_decref(o);
    return st;
}

ps_status ps_plan_to_json(const ps_plan *p, json_t **out)
{
    ps_status st = PS_OK;
    json_t *o = json_object(), *cluster = NULL, *stages = NULL, *pred = NULL;
    *out = NULL;
    if (o == NULL)
        return PS_ERR_NOMEM;
    PS_TRY(ps_json_set(o, "format", json_string(PLAN_FORMAT)));
    PS_TRY(ps_json_set(o, "version", json_integer(p->version)));
    PS_TRY(ps_json_set(o, "model", json_deep_copy(p->model)));
    PS_TRY(ps_json_set(o, "training", p->training ? json_deep_copy(p->training) : json_object()));
    PS_TRY(ps_cluster_to_json(p->cluster, &cluster));
    PS_TRY(ps_json_set(o, "cluster", cluster));
    PS_TRY(ps_json_set(o, "method", json_string(p->method)));
    PS_TRY(ps_json_set(o, "schedule", json_string(p->schedule)));
    PS_TRY(ps_json_set(o, "global_batch", json_integer(p->global_batch)));
    PS_TRY(ps_json_set(o, "micro_batches", json_integer(p->micro_batches)));
    PS_TRY(ps_json_set(o, "micro_batch_size", json_integer(p->global_batch / p->micro_batches)));
    stages = json_array();
    PS_TRY(ps_json_set(o, "stages", stages));
    for (int i = 0; i < p->n_stages; i++) {
        json_t *s = NULL;
        PS_TRY(stage_json(&p->stages[i], i, &s));
        PS_TRY(ps_json_append(stages, s));
    }
    if (p->profile_digest[0] != '\0')
        PS_TRY(ps_json_set(o, "profile_db",
                           json_pack("{s:s, s:s, s:s}", "device", p->profile_device, "backend",
                                     p->profile_backend, "digest", p->profile_digest)));
    pred = json_object();
    PS_TRY(ps_json_set(o, "predicted", pred));
    PS_TRY(ps_json_set(pred, "iteration_s", json_real(p->iteration_s)));
    PS_TRY(ps_json_set(pred, "tflops_per_device", json_real(p->tflops_per_device)));
    PS_TRY(ps_json_set(pred, "mfu", json_real(p->mfu)));
    PS_TRY(ps_json_set(pred, "peak_memory_bytes", json_real(p->peak_memory_bytes)));
    PS_TRY(ps_json_set(pred, "flops_per_step", json_real(p->flops_per_step)));
    json_t *per_stage = json_array();
    PS_TRY(ps_json_set(pred, "stages", per_stage));
    for (int i = 0; i < p->n_stages; i++) {
        json_t *s = json_object();
        PS_TRY(ps_json_append(per_stage, s));
        PS_TRY(ps_json_set(s, "index", json_integer(i)));
        PS_TRY(ps_json_set(s, "time_s", json_real(p->stages[i].time_s)));
        PS_TRY(ps_json_set(s, "peak_memory_bytes", json_real(p->stages[i].peak_memory_bytes)));
    }
    *out = o;
    o = NULL;
out:
    json_decref(o);
    return st;
}

/* Whether seconds is a time a plan file holds (the reader takes 0 to 1e30). */
static bool time_fits(double seconds)
{
    return isfinite(seconds) && seconds >= 0 && seconds <= 1e30;
}

/* A plan the reader would refuse is not written: its predicted times and
 * throughput must be finite and at most 1e30 (a cluster of absurd rates
 * predicts more). */
static ps_status check_times(const ps_plan *p, const char *path, ps_error *err)
{
    const char *what = NULL;
    double bad = 0;
    int stage = -1;
    if (!time_fits(p->iteration_s)) {
        what = "iteration";
        bad = p->iteration_s;
    }
    for (int k = 0; k < p->n_stages && what == NULL; k++) {
        const ps_plan_stage *s = &p->stages[k];
        const double t[] = {s->forward_s, s->backward_s,     s->update_s,
                            s->time_s,    s->send_forward_s, s->send_backward_s};
        static const char *const names[] = {"forward", "backward",      "update",
                                            "time",    "forward sends", "backward sends"};
        for (int i = 0; i < 6 && what == NULL; i++)
            if (!time_fits(t[i])) {
                what = names[i];
                bad = t[i];
                stage = k;
            }
        for (int i = 0; i < s->n_ops && what == NULL; i++)
            if (!time_fits(s->ops[i].compute_s) || !time_fits(s->ops[i].comm_s)) {
                what = "op time";
                bad = time_fits(s->ops[i].compute_s) ? s->ops[i].comm_s : s->ops[i].compute_s;
                stage = k;
            }
    }
    const char *unit = "s";
    if (what == NULL && !(isfinite(p->tflops_per_device) && p->tflops_per_device >= 0 &&
                          p->tflops_per_device <= 1e30)) {
        what = "throughput";
        bad = p->tflops_per_device;
        unit = "TFLOP/s per device";
    }
    if (what == NULL)
        return PS_OK;
    char where[32] = "";
    if (stage >= 0)
        snprintf(where, sizeof where, " of stage %d", stage);
    return ps_error_set(err, PS_ERR_INVALID,
                        "%s: not written: the predicted %s%s is %g %s, beyond what a plan "
                        "file holds (0 to 1e30); the cluster's rates (peak FLOP/s, memory and "
                        "link bandwidths) are out of any real range",
                        path, what, where, bad, unit);
}

ps_status ps_plan_save(const ps_plan *p, const char *path, ps_error *err)
{
    PS_TRY_RET(check_times(p, path, err));
    json_t *j = NULL;
    ps_status st = ps_plan_to_json(p, &j);
    if (st != PS_OK)
        return ps_error_set(err, st, "out of memory while writing %s", path);
    st = ps_json_save(j, path, err);
    json_decref(j);
    return st;
}

static ps_status read_ints(const ps_jv *v, int *out, int n, int lo, int hi, ps_error *err)
{
    size_t count;
    ps_status st = ps_jv_array(v, &count, err);
    if (st != PS_OK)
        return st;
    if ((int)count != n)
        return ps_jv_fail(v, err, PS_ERR_INVALID, "expected %d numbers, found %zu", n, count);
    for (int i = 0; i < n; i++) {
        ps_jv e = ps_jv_element(v, (size_t)i);
        int64_t x;
        if ((st = ps_jv_int(&e, lo, hi, &x, err)) != PS_OK)
            return st;
        out[i] = (int)x;
    }
    return PS_OK;
}

static ps_status read_spec(const ps_jv *v, ps_sharding_spec *out, ps_error *err)
{
    const char *s;
    ps_status st = ps_jv_string(v, &s, err);
    if (st != PS_OK)
        return st;
    if (!ps_spec_parse(s, ps_spec_text_rank(s), out))
        return ps_jv_fail(v, err, PS_ERR_INVALID, "bad sharding spec \"%s\"", s);
    return PS_OK;
}

static ps_status read_stage(const ps_jv *sv, ps_plan *p, ps_error *err)
{
    static const char *const keys[] = {"index",   "layers",    "devices", "submesh",
                                       "logical_mesh", "force_batch_axis0", "time_s",
                                       "peak_memory_bytes", "predicted", "ops", "tensors", NULL};
    ps_status st = PS_OK;
    ps_jv v, ops_v, tensors_v, pred;
    size_t n_dev, n_ops;
    PS_TRY(ps_jv_check_keys(sv, keys, err));
    PS_TRY(ps_jv_member(sv, "devices", &v, err));
    PS_TRY(ps_jv_array(&v, &n_dev, err));
    PS_TRY(ps_jv_member(sv, "ops", &ops_v, err));
    PS_TRY(ps_jv_array(&ops_v, &n_ops, err));
    PS_TRY(ps_jv_member(sv, "tensors", &tensors_v, err));
    PS_TRY(ps_jv_object(&tensors_v, err));
    if (n_dev < 1 || n_dev > PS_CLUSTER_MAX_DEVICES) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "a stage needs 1 to %d devices",
                        PS_CLUSTER_MAX_DEVICES);
        goto out;
    }
    ps_plan_stage *s;
    if (ps_plan_add_stage(p, (int)n_dev, (int)n_ops, (int)json_object_size(tensors_v.v), &s) !=
        PS_OK) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    PS_TRY(read_ints(&v, s->devices, (int)n_dev, 0, INT32_MAX, err));
    int layers[2];
    PS_TRY(ps_jv_member(sv, "layers", &v, err));
    PS_TRY(read_ints(&v, layers, 2, 0, INT32_MAX, err));
    s->first_layer = layers[0];
    s->last_layer = layers[1];
    PS_TRY(ps_jv_member(sv, "submesh", &v, err));
    PS_TRY(read_ints(&v, s->submesh, 2, 1, PS_CLUSTER_MAX_DEVICES, err));
    PS_TRY(ps_jv_member(sv, "logical_mesh", &v, err));
    PS_TRY(read_ints(&v, s->logical_mesh, 2, 1, PS_CLUSTER_MAX_DEVICES, err));
    PS_TRY(ps_jv_opt_bool(sv, "force_batch_axis0", false, &s->force_batch_axis0, err));
    PS_TRY(ps_jv_opt_double(sv, "time_s", 0, 0, 1e30, &s->time_s, err));
    PS_TRY(ps_jv_opt_double(sv, "peak_memory_bytes", 0, 0, 1e30, &s->peak_memory_bytes, err));
    if (ps_jv_has(sv, "predicted")) {
        static const char *const pred_keys[] = {
            "forward_s",      "backward_s",     "update_s",         "send_forward_s",
            "send_backward_s", "weight_bytes",  "gradient_bytes",   "optimizer_bytes",
            "activation_bytes", "layout_gap",   NULL};
        PS_TRY(ps_jv_member(sv, "predicted", &pred, err));
        PS_TRY(ps_jv_object(&pred, err));
        PS_TRY(ps_jv_check_keys(&pred, pred_keys, err));
        PS_TRY(ps_jv_opt_double(&pred, "forward_s", 0, 0, 1e30, &s->forward_s, err));
        PS_TRY(ps_jv_opt_double(&pred, "backward_s", 0, 0, 1e30, &s->backward_s, err));
        PS_TRY(ps_jv_opt_double(&pred, "update_s", 0, 0, 1e30, &s->update_s, err));
        PS_TRY(ps_jv_opt_double(&pred, "send_forward_s", 0, 0, 1e30, &s->send_forward_s, err));
        PS_TRY(ps_jv_opt_double(&pred, "send_backward_s", 0, 0, 1e30, &s->send_backward_s, err));
        PS_TRY(ps_jv_opt_double(&pred, "weight_bytes", 0, 0, 1e30, &s->weight_bytes, err));
        PS_TRY(ps_jv_opt_double(&pred, "gradient_bytes", 0, 0, 1e30, &s->gradient_bytes, err));
        PS_TRY(ps_jv_opt_double(&pred, "optimizer_bytes", 0, 0, 1e30, &s->optimizer_bytes, err));
        PS_TRY(
            ps_jv_opt_double(&pred, "activation_bytes", 0, 0, 1e30, &s->activation_bytes, err));
        PS_TRY(ps_jv_opt_double(&pred, "layout_gap", 0, 0, 1, &s->layout_gap, err));
    }
    for (size_t i = 0; i < n_ops; i++) {
        static const char *const op_keys[] = {"name", "strategy", "in", "out", "compute_s",
                                              "comm_s", NULL};
        ps_jv ov = ps_jv_element(&ops_v, i), x;
        ps_plan_op *op = &s->ops[i];
        const char *str;
        size_t n;
        PS_TRY(ps_jv_check_keys(&ov, op_keys, err));
        PS_TRY(ps_jv_member(&ov, "name", &x, err));
        PS_TRY(ps_jv_string(&x, &str, err));
        op->name = strdup(str);
        PS_TRY(ps_jv_member(&ov, "strategy", &x, err));
        PS_TRY(ps_jv_string(&x, &str, err));
        op->strategy = strdup(str);
        PS_TRY_ALLOC(op->name, err);
        PS_TRY_ALLOC(op->strategy, err);
        for (int io = 0; io < 2; io++) {
            PS_TRY(ps_jv_member(&ov, io == 0 ? "in" : "out", &x, err));
            PS_TRY(ps_jv_array(&x, &n, err));
            if (n > PS_MAX_OP_IO) {
                st = ps_jv_fail(&x, err, PS_ERR_INVALID, "too many specs");
                goto out;
            }
            for (size_t k = 0; k < n; k++) {
                ps_jv e = ps_jv_element(&x, k);
                PS_TRY(read_spec(&e, io == 0 ? &op->in[k] : &op->out[k], err));
            }
            if (io == 0)
                op->n_in = (int)n;
            else
                op->n_out = (int)n;
        }
        PS_TRY(ps_jv_opt_double(&ov, "compute_s", 0, 0, 1e30, &op->compute_s, err));
        PS_TRY(ps_jv_opt_double(&ov, "comm_s", 0, 0, 1e30, &op->comm_s, err));
    }
    const char *key;
    json_t *value;
    int i = 0;
    json_object_foreach(tensors_v.v, key, value) {
        ps_jv e = {.doc = tensors_v.doc, .v = value, .parent = &tensors_v, .key = key};
        s->tensors[i].name = strdup(key);
        PS_TRY_ALLOC(s->tensors[i].name, err);
        PS_TRY(read_spec(&e, &s->tensors[i].spec, err));
        i++;
    }
out:
    return st;
}

/* "profile_db": {"device": 1 to 63 characters, "backend": "cpu" or "cuda",
 * "digest": 16 lowercase hex digits}. */
static ps_status read_profile_db(const ps_jv *root, ps_plan *p, ps_error *err)
{
    static const char *const keys[] = {"device", "backend", "digest", NULL};
    ps_status st = PS_OK;
    ps_jv o, v;
    const char *s;
    int k;
    PS_TRY(ps_jv_member(root, "profile_db", &o, err));
    PS_TRY(ps_jv_object(&o, err));
    PS_TRY(ps_jv_check_keys(&o, keys, err));
    PS_TRY(ps_jv_member(&o, "device", &v, err));
    PS_TRY(ps_jv_string(&v, &s, err));
    if (s[0] == '\0' || strlen(s) >= sizeof p->profile_device) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "a device kind of 1 to %d characters",
                        (int)sizeof p->profile_device - 1);
        goto out;
    }
    snprintf(p->profile_device, sizeof p->profile_device, "%s", s);
    PS_TRY(ps_jv_member(&o, "backend", &v, err));
    PS_TRY(ps_jv_enum(&v, ps_profile_backend_names, 2, &k, err));
    snprintf(p->profile_backend, sizeof p->profile_backend, "%s", ps_profile_backend_names[k]);
    PS_TRY(ps_jv_member(&o, "digest", &v, err));
    PS_TRY(ps_jv_string(&v, &s, err));
    if (strlen(s) != 16 || strspn(s, "0123456789abcdef") != 16) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "expected 16 lowercase hex digits");
        goto out;
    }
    snprintf(p->profile_digest, sizeof p->profile_digest, "%s", s);
out:
    return st;
}

/* predicted.stages[]: what the stages' own entries say, repeated for people
 * (one per stage, in order; checked, not read). */
static ps_status read_predicted_stages(const ps_jv *pred, const ps_plan *p, ps_error *err)
{
    static const char *const keys[] = {"index", "time_s", "peak_memory_bytes", NULL};
    ps_status st = PS_OK;
    ps_jv stages, v;
    size_t n;
    int64_t x;
    double d;
    PS_TRY(ps_jv_member(pred, "stages", &stages, err));
    PS_TRY(ps_jv_array(&stages, &n, err));
    if (n != (size_t)p->n_stages) {
        st = ps_jv_fail(&stages, err, PS_ERR_INVALID, "%zu entries for the plan's %d stages", n,
                        p->n_stages);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        ps_jv sv = ps_jv_element(&stages, i);
        PS_TRY(ps_jv_object(&sv, err));
        PS_TRY(ps_jv_check_keys(&sv, keys, err));
        if (ps_jv_has(&sv, "index")) {
            PS_TRY(ps_jv_member(&sv, "index", &v, err));
            PS_TRY(ps_jv_int(&v, INT64_MIN, INT64_MAX, &x, err));
            if (x != (int64_t)i) {
                st = ps_jv_fail(&v, err, PS_ERR_INVALID, "index %lld at position %zu",
                                (long long)x, i);
                goto out;
            }
        }
        PS_TRY(ps_jv_opt_double(&sv, "time_s", 0, 0, 1e30, &d, err));
        PS_TRY(ps_jv_opt_double(&sv, "peak_memory_bytes", 0, 0, 1e30, &d, err));
    }
out:
    return st;
}

static ps_status plan_from_doc(const ps_json_doc *doc, ps_plan **out, ps_error *err)
{
    static const char *const keys[] = {"format", "version", "model", "training", "cluster",
                                       "method", "schedule", "global_batch", "micro_batches",
                                       "micro_batch_size", "stages", "profile_db", "predicted",
                                       NULL};
    ps_status st = PS_OK;
    ps_plan *p = NULL;
    ps_jv v, stages, pred;
    const char *s;
    int64_t x;
    size_t n;
    *out = NULL;
    ps_jv root = ps_json_doc_root(doc);
    PS_TRY(ps_jv_expect_format(&root, PLAN_FORMAT, "a plan (" PLAN_FORMAT ")", err));
    PS_TRY(ps_jv_check_keys(&root, keys, err));
    PS_TRY(ps_jv_member(&root, "format", &v, err));
    PS_TRY(ps_jv_string(&v, &s, err));
    if (strcmp(s, PLAN_FORMAT) != 0) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "expected \"%s\"", PLAN_FORMAT);
        goto out;
    }
    PS_TRY(ps_jv_member(&root, "version", &v, err));
    PS_TRY(ps_jv_int(&v, INT64_MIN, INT64_MAX, &x, err));
    if (x != PS_PLAN_VERSION) {
        st = ps_jv_fail(&v, err, PS_ERR_UNSUPPORTED,
                        "unsupported version %lld (this build reads version %d)", (long long)x,
                        PS_PLAN_VERSION);
        goto out;
    }
    if (ps_plan_create(&p) != PS_OK) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    PS_TRY(ps_jv_member(&root, "model", &v, err));
    PS_TRY(ps_jv_object(&v, err));
    p->model = json_deep_copy(v.v);
    ps_jv name;
    PS_TRY(ps_jv_member(&v, "name", &name, err));
    PS_TRY(ps_jv_string(&name, &s, err));
    p->model_name = strdup(s);
    PS_TRY_ALLOC(p->model_name, err);
    if (ps_jv_has(&root, "training")) {
        PS_TRY(ps_jv_member(&root, "training", &v, err));
        PS_TRY(ps_jv_object(&v, err));
        p->training = json_deep_copy(v.v);
    }
    PS_TRY(ps_jv_member(&root, "cluster", &v, err));
    PS_TRY(ps_cluster_from_json(&v, &p->cluster, err));
    static const char *const methods[] = {"shard", "data", "zero2", "zero3",
                                          "pipeshard", "uniform", "manual"};
    static const char *const schedules[] = {"1f1b", "gpipe"};
    int k;
    PS_TRY(ps_jv_member(&root, "method", &v, err));
    PS_TRY(ps_jv_enum(&v, methods, 7, &k, err));
    snprintf(p->method, sizeof p->method, "%s", methods[k]);
    PS_TRY(ps_jv_member(&root, "schedule", &v, err));
    PS_TRY(ps_jv_enum(&v, schedules, 2, &k, err));
    snprintf(p->schedule, sizeof p->schedule, "%s", schedules[k]);
    PS_TRY(ps_jv_member(&root, "global_batch", &v, err));
    PS_TRY(ps_jv_int(&v, 1, INT64_C(1) << 40, &x, err));
    p->global_batch = x;
    PS_TRY(ps_jv_member(&root, "micro_batches", &v, err));
    PS_TRY(ps_jv_int(&v, 1, INT32_MAX, &x, err));
    p->micro_batches = (int)x;
    if (p->global_batch % p->micro_batches != 0) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "%d micro-batches do not divide the global "
                        "batch %lld", p->micro_batches, p->global_batch);
        goto out;
    }
    if (ps_jv_has(&root, "micro_batch_size")) { /* derived: must agree */
        PS_TRY(ps_jv_member(&root, "micro_batch_size", &v, err));
        PS_TRY(ps_jv_int(&v, 1, INT64_C(1) << 40, &x, err));
        if (x != p->global_batch / p->micro_batches) {
            st = ps_jv_fail(&v, err, PS_ERR_INVALID,
                            "%lld, but the global batch %lld in %d micro-batches makes %lld",
                            (long long)x, p->global_batch, p->micro_batches,
                            p->global_batch / p->micro_batches);
            goto out;
        }
    }
    PS_TRY(ps_jv_member(&root, "stages", &stages, err));
    PS_TRY(ps_jv_array(&stages, &n, err));
    if (n < 1) {
        st = ps_jv_fail(&stages, err, PS_ERR_INVALID, "a plan needs at least one stage");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        ps_jv sv = ps_jv_element(&stages, i);
        if (ps_jv_has(&sv, "index")) { /* the position, written for people: must agree */
            PS_TRY(ps_jv_member(&sv, "index", &v, err));
            PS_TRY(ps_jv_int(&v, INT64_MIN, INT64_MAX, &x, err));
            if (x != (int64_t)i) {
                st = ps_jv_fail(&v, err, PS_ERR_INVALID, "stage %zu has index %lld", i,
                                (long long)x);
                goto out;
            }
        }
        PS_TRY(read_stage(&sv, p, err));
    }
    if (ps_jv_has(&root, "profile_db"))
        PS_TRY(read_profile_db(&root, p, err));
    if (ps_jv_has(&root, "predicted")) {
        static const char *const pred_keys[] = {"iteration_s", "tflops_per_device", "mfu",
                                                "peak_memory_bytes", "flops_per_step", "stages",
                                                NULL};
        PS_TRY(ps_jv_member(&root, "predicted", &pred, err));
        PS_TRY(ps_jv_object(&pred, err));
        PS_TRY(ps_jv_check_keys(&pred, pred_keys, err));
        if (ps_jv_has(&pred, "stages"))
            PS_TRY(read_predicted_stages(&pred, p, err));
        PS_TRY(ps_jv_opt_double(&pred, "iteration_s", 0, 0, 1e30, &p->iteration_s, err));
        PS_TRY(ps_jv_opt_double(&pred, "tflops_per_device", 0, 0, 1e30, &p->tflops_per_device,
                                err));
        PS_TRY(ps_jv_opt_double(&pred, "mfu", 0, 0, 1e30, &p->mfu, err));
        PS_TRY(ps_jv_opt_double(&pred, "peak_memory_bytes", 0, 0, 1e30, &p->peak_memory_bytes,
                                err));
        PS_TRY(ps_jv_opt_double(&pred, "flops_per_step", 0, 0, 1e40, &p->flops_per_step, err));
    }
    ps_error inner = {0};
    if ((st = ps_plan_validate(p, &inner)) != PS_OK) {
        st = ps_error_set(err, st, "%s: %s", doc->name, inner.msg);
        goto out;
    }
    *out = p;
    p = NULL;
out:
    ps_plan_free(p);
    return st;
}

/* The plan of doc, which it keeps (ps_plan.source) when read; doc freed
 * otherwise. */
static ps_status plan_from_own_doc(ps_json_doc *doc, ps_plan **out, ps_error *err)
{
    ps_status st = plan_from_doc(doc, out, err);
    if (st == PS_OK)
        (*out)->source = doc;
    else
        ps_json_doc_free(doc);
    return st;
}

ps_status ps_plan_load(const char *path, ps_plan **out, ps_error *err)
{
    ps_json_doc *doc = NULL;
    *out = NULL;
    PS_TRY_RET(ps_json_doc_load(path, &doc, err));
    return plan_from_own_doc(doc, out, err);
}

ps_status ps_plan_parse(const char *name, const char *text, ps_plan **out, ps_error *err)
{
    ps_json_doc *doc = NULL;
    *out = NULL;
    PS_TRY_RET(ps_json_doc_parse(name, text, &doc, err));
    return plan_from_own_doc(doc, out, err);
}

ps_status ps_plan_record_profile(ps_plan *p, const ps_profile_db *db, ps_error *err)
{
    p->profile_device[0] = p->profile_backend[0] = p->profile_digest[0] = '\0';
    if (db == NULL)
        return PS_OK;
    if (ps_profile_db_digest(db, p->profile_digest, sizeof p->profile_digest) != PS_OK)
        return ps_error_set(err, PS_ERR_INVALID, "profile DB \"%s\" is not finished",
                            db->device);
    snprintf(p->profile_device, sizeof p->profile_device, "%s", db->device);
    snprintf(p->profile_backend, sizeof p->profile_backend, "%.7s", db->backend);
    return PS_OK;
}

void ps_plan_digest(const ps_plan *p, char *buf, int cap)
{
    json_t *j = NULL;
    if (ps_plan_to_json(p, &j) == PS_OK) {
        /* the predictions and where they came from do not identify a plan:
         * the plan's own, each stage's and each op's times and memory are
         * left out, so that a plan predicted again (with a profile DB, or
         * by a planner that predicts more) keeps its digest and its runs
         * still compare */
        json_object_del(j, "predicted");
        json_object_del(j, "profile_db");
        size_t k;
        json_t *stage;
        json_array_foreach(json_object_get(j, "stages"), k, stage) {
            json_object_del(stage, "time_s");
            json_object_del(stage, "peak_memory_bytes");
            json_object_del(stage, "predicted");
            size_t i;
            json_t *op;
            json_array_foreach(json_object_get(stage, "ops"), i, op) {
                json_object_del(op, "compute_s");
                json_object_del(op, "comm_s");
            }
        }
    }
    ps_json_digest(j, buf, cap);
    json_decref(j);
}
