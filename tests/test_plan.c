/* core/plan + planner/plan_intra: one-stage plans, their files, their checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/json.h"
#include "planner/inter_pass.h"
#include "planner/plan_intra.h"
#include "planner/lower.h"
#include "planner/plan_model.h"

static ps_plan *mlp_plan(ps_intra_method method, const char *cluster, int micro_batches)
{
    ps_model_config cfg;
    assert_int_equal(ps_zoo_lookup("mlp", &cfg, NULL), PS_OK);
    cfg.hidden = 256;
    cfg.batch = 64 / micro_batches;
    ps_graph *fwd = NULL;
    ps_error err = {0};
    assert_int_equal(ps_model_build(&cfg, &fwd, &err), PS_OK);
    ps_cluster *c = NULL;
    assert_int_equal(ps_cluster_from_preset(cluster, &c, &err), PS_OK);
    ps_plan_request req = {.forward = fwd, .config = &cfg, .train = ps_train_options_default(),
                           .cluster = c, .method = method, .global_batch = 64,
                           .micro_batches = micro_batches, .ilp = ps_ilp_options_default()};
    ps_plan *p = NULL;
    if (ps_plan_one_stage(&req, &p, NULL, NULL, &err) != PS_OK)
        fail_msg("%s", err.msg);
    ps_cluster_free(c);
    ps_graph_free(fwd);
    return p;
}

static char *dump(const ps_plan *p)
{
    json_t *j = NULL;
    assert_int_equal(ps_plan_to_json(p, &j), PS_OK);
    char *text = ps_json_dumps(j);
    json_decref(j);
    return text;
}

static void one_stage_plan_predictions(void **state)
{
    (void)state;
    ps_plan *p = mlp_plan(PS_METHOD_DATA, "dgx-a100:1", 4);
    assert_int_equal(p->n_stages, 1);
    const ps_plan_stage *s = &p->stages[0];
    assert_int_equal(s->n_devices, 8);
    assert_int_equal(s->logical_mesh[0], 8);
    assert_int_equal(s->logical_mesh[1], 1);
    assert_int_equal(s->first_layer, 0);
    assert_int_equal(s->last_layer, 1);
    /* iteration = micro-batches x (forward + backward) + update */
    assert_true(fabs(p->iteration_s - (4 * s->time_s + s->update_s)) < 1e-12);
    assert_true(p->tflops_per_device > 0 && p->mfu > 0 && p->mfu < 1);
    assert_true(fabs(p->tflops_per_device * 1e12 * p->iteration_s * 8 - p->flops_per_step) <
                1e-6 * p->flops_per_step);
    /* every op and tensor of the step is recorded */
    assert_true(s->n_ops > 20 && s->n_tensors > s->n_ops);
    assert_string_equal(p->method, "data");
    ps_plan_free(p);
}

static void plan_file_round_trip(void **state)
{
    (void)state;
    char dir[] = "/tmp/ps-test-plan-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    static const ps_intra_method methods[] = {PS_METHOD_SHARD, PS_METHOD_DATA, PS_METHOD_ZERO2,
                                              PS_METHOD_ZERO3};
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++) {
        ps_plan *p = mlp_plan(methods[i], "p3.16xlarge:2", 2);
        p->stages[0].force_batch_axis0 = i % 2 == 0; /* an autosharding option */
        p->stages[0].layout_gap = 0.0125 * (double)i; /* as a time-limited solve leaves it */
        ps_error err = {0};
        assert_int_equal(ps_plan_save(p, path, &err), PS_OK);
        ps_plan *back = NULL;
        if (ps_plan_load(path, &back, &err) != PS_OK)
            fail_msg("%s", err.msg);
        assert_int_equal(back->stages[0].force_batch_axis0, i % 2 == 0);
        assert_true(back->stages[0].layout_gap == 0.0125 * (double)i);
        char *a = dump(p), *b = dump(back);
        assert_string_equal(a, b);
        char da[32], db[32];
        ps_plan_digest(p, da, sizeof da);
        ps_plan_digest(back, db, sizeof db);
        assert_string_equal(da, db);
        free(a);
        free(b);
        ps_plan_free(back);
        ps_plan_free(p);
    }
    unlink(path);
    rmdir(dir);
}

/* The digest names the plan's decisions, not its predictions: every time
 * and byte predicted may change (a plan predicted again with a profile DB,
 * or by a planner that predicts more), a strategy, a mesh or a batch may
 * not. */
static void digest_ignores_predictions(void **state)
{
    (void)state;
    ps_plan *p = mlp_plan(PS_METHOD_SHARD, "p3.16xlarge:1", 2);
    char before[32], after[32];
    ps_plan_digest(p, before, sizeof before);
    p->iteration_s *= 2;
    p->peak_memory_bytes += 1;
    ps_plan_stage *s = &p->stages[0];
    s->time_s *= 3;
    s->forward_s += 1;
    s->backward_s += 1;
    s->update_s += 1;
    s->send_forward_s += 1;
    s->peak_memory_bytes *= 2;
    s->activation_bytes += 5;
    s->layout_gap = 0.5;
    for (int i = 0; i < s->n_ops; i++) {
        s->ops[i].compute_s += 1e-3;
        s->ops[i].comm_s += 1e-3;
    }
    ps_plan_digest(p, after, sizeof after);
    assert_string_equal(before, after);
    /* decisions do change it */
    static const int what[] = {0, 1, 2};
    for (size_t w = 0; w < sizeof what / sizeof *what; w++) {
        ps_plan *q = mlp_plan(PS_METHOD_SHARD, "p3.16xlarge:1", 2);
        if (what[w] == 0)
            q->micro_batches = 4;
        else if (what[w] == 1)
            q->stages[0].force_batch_axis0 = !q->stages[0].force_batch_axis0;
        else {
            char *strategy = strdup("something-else");
            assert_non_null(strategy);
            free(q->stages[0].ops[0].strategy);
            q->stages[0].ops[0].strategy = strategy;
        }
        ps_plan_digest(q, after, sizeof after);
        if (strcmp(before, after) == 0)
            fail_msg("change %d left the digest %s", what[w], after);
        ps_plan_free(q);
    }
    ps_plan_free(p);
}

/* The measured runs committed under traces/data name the plan files beside
 * them by digest: a change to the plan format or to the digest that would
 * part them (compare refuses runs of different plans) fails here, and the
 * summaries must be re-stamped or the digest kept. */
static void committed_runs_name_their_plans(void **state)
{
    (void)state;
    static const char *const plans[] = {"h100/gpt-350m.plan.json",
                                        "h100/gpt-1.3b.plan.json",
                                        "h100/profiled/gpt-350m.profiled.plan.json",
                                        "h100/profiled/gpt-1.3b.profiled.plan.json",
                                        "h200/gpt-350m-bf16.plan.json",
                                        "h200/profiled/gpt-1.3b.profiled.plan.json",
                                        "h200/profiled/wresnet-250m.plan.json",
                                        "h200/profiled/wresnet-250m.profiled.plan.json"};
    static const char *const dirs[] = {"h100", "h200", "h100/profiled", "h200/profiled"};
    const char *root = PS_TEST_DATA_DIR "/../../traces/data";
    int checked = 0;
    for (size_t i = 0; i < sizeof plans / sizeof *plans; i++) {
        char path[1100], model[64];
        snprintf(path, sizeof path, "%s/%s", root, plans[i]);
        ps_plan *p = NULL;
        ps_error err = {0};
        if (ps_plan_load(path, &p, &err) != PS_OK)
            fail_msg("%s", err.msg);
        char digest[32];
        ps_plan_digest(p, digest, sizeof digest);
        ps_plan_free(p);
        const char *base = strrchr(plans[i], '/') + 1;
        snprintf(model, sizeof model, "%.*s.", (int)strcspn(base, "."), base);
        for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++) {
            char dir[512];
            snprintf(dir, sizeof dir, "%s/%s", root, dirs[d]);
            DIR *dh = opendir(dir);
            assert_non_null(dh);
            struct dirent *de;
            while ((de = readdir(dh)) != NULL) {
                size_t n = strlen(de->d_name);
                if (strncmp(de->d_name, model, strlen(model)) != 0 || n < 13 ||
                    strcmp(de->d_name + n - 13, ".summary.json") != 0)
                    continue;
                snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
                json_error_t je;
                json_t *j = json_load_file(path, 0, &je);
                assert_non_null(j);
                const char *named = json_string_value(json_object_get(j, "plan"));
                if (named == NULL || strcmp(named, digest) != 0)
                    fail_msg("%s names plan %s, %s is %s", path, named ? named : "(none)",
                             plans[i], digest);
                json_decref(j);
                checked++;
            }
            closedir(dh);
        }
    }
    printf("  %d summaries name their plans\n", checked);
    assert_true(checked >= 40); /* or the files moved and this checks nothing */
}

/* A small DB named "test-dev" (the caller frees it). */
static ps_profile_db *tiny_db(double gemm_s)
{
    ps_profile_db *db = NULL;
    assert_int_equal(ps_profile_db_create("test-dev", "cpu", 1, &db, NULL), PS_OK);
    ps_profile_gemm g = {.m = 64, .n = 64, .k = 64, .dtype = PS_DTYPE_F32, .seconds = gemm_s};
    assert_int_equal(ps_profile_db_add_gemm(db, &g, NULL), PS_OK);
    assert_int_equal(ps_profile_db_finish(db, NULL), PS_OK);
    return db;
}

/* The profile DB a plan was made with survives its file and is not part of
 * the plan's digest (compare joins runs of one plan however predicted); the
 * DB's digest names its content. */
static void plan_records_its_profile_db(void **state)
{
    (void)state;
    ps_profile_db *db = tiny_db(1e-5), *other = tiny_db(2e-5);
    char d1[17], d2[17], again[17];
    assert_int_equal(ps_profile_db_digest(db, d1, sizeof d1), PS_OK);
    assert_int_equal(ps_profile_db_digest(other, d2, sizeof d2), PS_OK);
    assert_int_equal(strlen(d1), 16);
    assert_string_not_equal(d1, d2);
    /* a DB loaded back from its file names the same content */
    char dir[] = "/tmp/ps-test-plan-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/db.json", dir);
    ps_profile_db *back_db = NULL;
    assert_int_equal(ps_profile_db_save(db, path, NULL), PS_OK);
    assert_int_equal(ps_profile_db_load(path, &back_db, NULL), PS_OK);
    assert_int_equal(ps_profile_db_digest(back_db, again, sizeof again), PS_OK);
    assert_string_equal(again, d1);
    ps_plan *p = mlp_plan(PS_METHOD_DATA, "dgx-a100:1", 1);
    char without[32], with[32];
    ps_plan_digest(p, without, sizeof without);
    assert_int_equal(ps_plan_record_profile(p, db, NULL), PS_OK);
    assert_string_equal(p->profile_digest, d1);
    assert_string_equal(p->profile_device, "test-dev");
    assert_string_equal(p->profile_backend, "cpu");
    ps_plan_digest(p, with, sizeof with); /* the plan, not where its predictions came from */
    assert_string_equal(with, without);
    snprintf(path, sizeof path, "%s/plan.json", dir);
    assert_int_equal(ps_plan_save(p, path, NULL), PS_OK);
    ps_plan *back = NULL;
    assert_int_equal(ps_plan_load(path, &back, NULL), PS_OK);
    assert_string_equal(back->profile_digest, d1);
    assert_string_equal(back->profile_device, "test-dev");
    assert_string_equal(back->profile_backend, "cpu");
    char *a = dump(p), *b = dump(back);
    assert_string_equal(a, b);
    assert_non_null(strstr(a, "\"profile_db\""));
    free(a);
    free(b);
    /* recording none takes it out */
    assert_int_equal(ps_plan_record_profile(back, NULL, NULL), PS_OK);
    a = dump(back);
    assert_null(strstr(a, "\"profile_db\""));
    free(a);
    /* an unfinished DB names nothing, and is not recorded */
    ps_profile_gemm more = {.m = 8, .n = 8, .k = 8, .dtype = PS_DTYPE_F32, .seconds = 1e-6};
    assert_int_equal(ps_profile_db_add_gemm(other, &more, NULL), PS_OK);
    assert_int_equal(ps_profile_db_digest(other, again, sizeof again), PS_ERR_INVALID);
    assert_string_equal(again, "");
    ps_error err = {0};
    assert_int_equal(ps_plan_record_profile(back, other, &err), PS_ERR_INVALID);
    assert_string_equal(err.msg, "profile DB \"test-dev\" is not finished");
    assert_string_equal(back->profile_digest, "");
    ps_plan_free(back);
    ps_plan_free(p);
    ps_profile_db_free(back_db);
    ps_profile_db_free(db);
    ps_profile_db_free(other);
    unlink(path);
    snprintf(path, sizeof path, "%s/db.json", dir);
    unlink(path);
    rmdir(dir);
}

/* A plan that uses devices the cluster lacks, or leaves layers out, or whose
 * micro-batches do not divide the batch, or whose model is not the one
 * planned, is rejected with a clear error. */
static void invalid_plans_are_rejected(void **state)
{
    (void)state;
    ps_plan *p = mlp_plan(PS_METHOD_SHARD, "dgx-a100:1", 1);
    ps_error err = {0};
    p->stages[0].devices[3] = 8;
    assert_int_equal(ps_plan_validate(p, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "uses device 8; the cluster has devices 0 to 7"));
    p->stages[0].devices[3] = 2; /* duplicate of device 2 */
    ps_error_clear(&err);
    assert_int_equal(ps_plan_validate(p, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "device 2 is in two stages"));
    p->stages[0].devices[3] = 3;
    p->stages[0].first_layer = 1;
    ps_error_clear(&err);
    assert_int_equal(ps_plan_validate(p, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "consecutive layers from 0"));
    p->stages[0].first_layer = 0;
    p->micro_batches = 5;
    ps_error_clear(&err);
    assert_int_equal(ps_plan_validate(p, &err), PS_ERR_INVALID);
    p->micro_batches = 1;
    p->stages[0].logical_mesh[0] = 3;
    ps_error_clear(&err);
    assert_int_equal(ps_plan_validate(p, &err), PS_ERR_INVALID);
    p->stages[0].logical_mesh[0] = 1;
    assert_int_equal(ps_plan_validate(p, NULL), PS_OK);
    /* valid on its own, but the model is built for micro-batches of 64: 2 of
     * 32 would run another step than the plan predicts */
    p->micro_batches = 2;
    ps_plan_model *m = NULL;
    ps_error_clear(&err);
    assert_int_equal(ps_plan_model_build(p, &m, &err), PS_OK);
    assert_int_equal(ps_plan_check(p, m, &err), PS_ERR_INVALID);
    assert_string_equal(err.msg, "the model is built for micro-batches of 64 (model.config.batch), "
                                 "the plan splits its global batch 64 into 2 micro-batches of 32");
    p->micro_batches = 1;
    assert_int_equal(ps_plan_check(p, m, NULL), PS_OK);
    ps_plan_model_free(m);
    /* the same ops of other sizes (the plan's model.config edited to twice
     * the width): the step it would run is not the one planned */
    json_t *cfg = json_object_get(p->model, "config");
    json_int_t hidden = json_integer_value(json_object_get(cfg, "hidden"));
    assert_int_equal(json_object_set_new(cfg, "hidden", json_integer(2 * hidden)), 0);
    ps_error_clear(&err);
    assert_int_equal(ps_plan_model_build(p, &m, &err), PS_OK);
    assert_int_equal(ps_plan_check(p, m, &err), PS_ERR_INVALID);
    if (strstr(err.msg, "FLOPs a step, the plan was made for") == NULL ||
        strstr(err.msg, "its model (model.config) is not the one planned") == NULL)
        fail_msg("%s", err.msg);
    /* a plan without its FLOPs (0) is not checked for them */
    double flops = p->flops_per_step;
    p->flops_per_step = 0;
    assert_int_equal(ps_plan_check(p, m, NULL), PS_OK);
    p->flops_per_step = flops;
    ps_plan_model_free(m);
    assert_int_equal(json_object_set_new(cfg, "hidden", json_integer(hidden)), 0);
    assert_int_equal(ps_plan_model_build(p, &m, &err), PS_OK);
    assert_int_equal(ps_plan_check(p, m, NULL), PS_OK);
    ps_plan_model_free(m);
    ps_plan_free(p);
}

/* A plan's remat_layers name its own layers: clustering made the 2-tag mlp
 * into 4, and a recomputed layer 2 (which the model's tags do not have) is
 * the step's only recomputed one; layer 4 is refused with the range. */
static void remat_layers_name_the_plans_layers(void **state)
{
    (void)state;
    ps_model_config cfg;
    assert_int_equal(ps_zoo_lookup("mlp", &cfg, NULL), PS_OK);
    cfg.hidden = 256;
    cfg.batch = 32;
    ps_graph *fwd = NULL;
    ps_cluster *c = NULL;
    ps_error err = {0};
    assert_int_equal(ps_model_build(&cfg, &fwd, &err), PS_OK);
    assert_int_equal(ps_cluster_from_preset("dgx-a100:1", &c, &err), PS_OK);
    ps_plan_request req = {.forward = fwd, .config = &cfg, .train = ps_train_options_default(),
                           .cluster = c, .global_batch = 64, .micro_batches = 2,
                           .ilp = ps_ilp_options_default()};
    ps_inter_options o = ps_inter_options_default();
    o.layer_num = 4;
    ps_plan *p = NULL;
    if (ps_plan_pipeshard(&req, &o, &p, &err) != PS_OK)
        fail_msg("%s", err.msg);
    assert_true(fwd->n_layers < 4);
    json_t *layers = json_array();
    json_array_append_new(layers, json_integer(2));
    json_object_set_new(p->training, "remat_layers", layers);
    ps_plan_model *m = NULL;
    if (ps_plan_model_build(p, &m, &err) != PS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(m->layered->n_layers, 4);
    int recomputed = 0;
    for (int i = 0; i < m->step->n_ops; i++)
        if (m->step->ops[i].pass == PS_PASS_RECOMPUTE) {
            assert_int_equal(m->step->ops[i].layer, 2);
            recomputed++;
        }
    assert_true(recomputed > 0);
    ps_plan_model_free(m);
    m = NULL;
    json_array_set_new(layers, 0, json_integer(4));
    ps_error_clear(&err);
    assert_int_equal(ps_plan_model_build(p, &m, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "4 is out of range (allowed 0 to 3)"));
    assert_null(m);
    ps_plan_free(p);
    ps_cluster_free(c);
    ps_graph_free(fwd);
}

/* A plan without its predictions (edited by hand) is lowered with the
 * step's FLOPs and the devices' peak counted as the planner counts them, so
 * that runs still report throughput and MFU: both equal the planner's. */
static void lowering_recounts_missing_predictions(void **state)
{
    (void)state;
    ps_plan *p = mlp_plan(PS_METHOD_SHARD, "dgx-a100:1", 2);
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_error err = {0};
    assert_int_equal(ps_plan_model_build(p, &m, &err), PS_OK);
    double flops = p->flops_per_step, peak = p->tflops_per_device * 1e12 / p->mfu;
    assert_true(flops > 0 && peak > 0);
    p->flops_per_step = p->mfu = p->tflops_per_device = 0;
    if (ps_plan_lower(p, m, NULL, &set, &err) != PS_OK)
        fail_msg("%s", err.msg);
    if (!(fabs(set->flops_per_step / flops - 1) < 1e-12 &&
          fabs(set->mfu_peak_flops_per_s / peak - 1) < 1e-12))
        fail_msg("recounted %g FLOPs at a peak of %g FLOP/s; the planner's %g and %g",
                 set->flops_per_step, set->mfu_peak_flops_per_s, flops, peak);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);
}

/* text with [from, to) replaced by `insert`, written to path. */
static void write_edited(const char *path, const char *text, const char *from, const char *to,
                         const char *insert)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%.*s%s%s", (int)(from - text), text, insert, to);
    fclose(f);
}

/* Malformed plan files give positioned errors. */
static void malformed_plan_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/ps-test-plan-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    ps_plan *p = mlp_plan(PS_METHOD_SHARD, "dgx-a100:1", 1);
    ps_profile_db *db = tiny_db(1e-5);
    assert_int_equal(ps_plan_record_profile(p, db, NULL), PS_OK);
    ps_profile_db_free(db);
    char *good = dump(p);
    ps_plan_free(p);
    static const struct {
        const char *from, *to, *want;
    } edits[] = {
        {"\"format\": \"pipeshard-plan\"", "\"format\": \"plan\"", "expected \"pipeshard-plan\""},
        {"\"version\": 1", "\"version\": 7", "unsupported version 7"},
        {"\"method\": \"shard\"", "\"method\": \"magic\"", "unknown value \"magic\""},
        {"\"micro_batches\": 1", "\"micro_batches\": 0", "micro_batches: 0 is out of range"},
        {"\"schedule\": \"1f1b\"", "\"schedule\": 3", "expected a string"},
        {"\"logical_mesh\": [\n    1,", "\"logical_mesh\": [\n    2,", "logical mesh 2x8"},
        {"\"layers\": [\n    0,", "\"layers\": [\n    1,", "consecutive layers"},
        {"\"logical_mesh\": [", "\"force_batch_axis0\": 1, \"logical_mesh\": [",
         "expected true or false"},
        {"\"digest\": \"", "\"digest\": \"A", "expected 16 lowercase hex digits"},
        {"\"digest\": \"", "\"digest\": \"0", "expected 16 lowercase hex digits"},
        {"\"backend\": \"cpu\"", "\"backend\": \"gpu\"", "unknown value \"gpu\""},
        {"\"device\": \"test-dev\"", "\"device\": \"\"", "a device kind of 1 to 63 characters"},
        {"\"device\": \"test-dev\"", "\"device\": \"test-dev\", \"path\": \"x\"",
         "unknown key \"path\""},
        {"\"digest\": \"", "\"digest\": 5, \"d\": \"", "unknown key \"d\""},
        {"\"device\": \"test-dev\"", "\"device\": 7", "expected a string"},
        {"\"layout_gap\": 0.0", "\"layout_gap\": 1.5", "layout_gap: 1.5 is out of range"},
        {"\"layout_gap\": 0.0", "\"layout_gap\": -0.01", "layout_gap: -0.01 is out of range"},
        /* derived fields that disagree with what they derive from */
        {"\"micro_batch_size\": ", "\"micro_batch_size\": 9",
         ", but the global batch 64 in 1 micro-batches makes 64"},
        {"\"index\": 0", "\"index\": 3", "stages[0].index: stage 0 has index 3"},
        /* the predictions are checked as strictly as the rest */
        {"\"flops_per_step\"", "\"bogus\": 1, \"flops_per_step\"",
         "predicted.bogus: unknown key \"bogus\""},
        {"\"layout_gap\": 0.0", "\"layout_gap\": 0.0, \"extra\": 2",
         "stages[0].predicted.extra: unknown key \"extra\""},
        {"\"mfu\": ", "\"mfu\": \"high\", \"was\": ", "unknown key \"was\""},
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        char *at = strstr(good, edits[i].from);
        if (at == NULL)
            fail_msg("edit %zu: \"%s\" not in the plan text", i, edits[i].from);
        write_edited(path, good, at, at + strlen(edits[i].from), edits[i].to);
        ps_plan *back = NULL;
        ps_error err = {0};
        assert_int_not_equal(ps_plan_load(path, &back, &err), PS_OK);
        assert_null(back);
        if (strstr(err.msg, edits[i].want) == NULL || strstr(err.msg, path) != err.msg)
            fail_msg("edit %zu: \"%s\" lacks \"%s\"", i, err.msg, edits[i].want);
    }
    /* predicted.stages[]: an entry per stage, in order, of numbers (the last
     * "index", "time_s" and "stages" of the text are its), and the last
     * "predicted" the plan's own */
    static const struct {
        const char *key, *value, *want;
    } last_edits[] = {
        {"\"index\": ", "1", "predicted.stages[0].index: index 1 at position 0"},
        {"\"time_s\": ", "\"x\"", "predicted.stages[0].time_s: expected a number"},
        {"\"stages\": ", "[]", "predicted.stages: 0 entries for the plan's 1 stages"},
        {"\"predicted\": ", "3", "predicted: expected an object"},
    };
    for (size_t i = 0; i < sizeof last_edits / sizeof *last_edits; i++) {
        const char *at = NULL;
        for (const char *q = strstr(good, last_edits[i].key); q != NULL;
             q = strstr(q + 1, last_edits[i].key))
            at = q;
        assert_non_null(at);
        const char *value = at + strlen(last_edits[i].key);
        /* the value ends at the next comma, newline or closing bracket at its depth */
        const char *end = value;
        for (int depth = 0; *end != '\0'; end++) {
            if (*end == '[' || *end == '{')
                depth++;
            else if ((*end == ']' || *end == '}') && depth-- == 0)
                break;
            else if (depth == 0 && (*end == ',' || *end == '\n'))
                break;
            if (depth == 0 && (*end == ']' || *end == '}')) {
                end++;
                break;
            }
        }
        write_edited(path, good, value, end, last_edits[i].value);
        ps_plan *back = NULL;
        ps_error err = {0};
        assert_int_not_equal(ps_plan_load(path, &back, &err), PS_OK);
        if (strstr(err.msg, last_edits[i].want) == NULL || strstr(err.msg, path) != err.msg)
            fail_msg("edit of the last %s: \"%s\" lacks \"%s\"", last_edits[i].key, err.msg,
                     last_edits[i].want);
    }
    /* truncated */
    FILE *f = fopen(path, "w");
    fprintf(f, "%.*s", (int)(strlen(good) / 2), good);
    fclose(f);
    ps_plan *back = NULL;
    assert_int_equal(ps_plan_load(path, &back, NULL), PS_ERR_PARSE);
    free(good);
    unlink(path);
    rmdir(dir);
}

/* What is wrong in a loaded plan's model or training is reported where the
 * file has it: FILE:LINE:COL of the value and its full path, as for the
 * rest of the file (they are read when the plan's model is built, after
 * loading). */
static void model_and_training_errors_point_into_the_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/ps-test-plan-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    ps_plan *p = mlp_plan(PS_METHOD_SHARD, "dgx-a100:1", 1);
    char *good = dump(p);
    ps_plan_free(p);
    static const struct {
        const char *from, *to, *want;
    } edits[] = {
        {"\"lr\": ", "\"lr\": -1, \"was\": ", "training.was: unknown key \"was\""},
        {"\"lr\": 0.001", "\"lr\": -1", "training.lr: -1 is out of range"},
        {"\"hidden\": 256", "\"hidden\": -5", "model.config.hidden"},
        {"\"name\": \"mlp\"", "\"name\": \"mlp\", \"colour\": 1", "model.colour: unknown key"},
        {"\"name\": \"mlp\"", "\"name\": \"mlp\", \"layers\": \"sideways\"",
         "model.layers: unknown value \"sideways\""},
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        const char *at = strstr(good, edits[i].from);
        if (at == NULL)
            fail_msg("edit %zu: \"%s\" not in the plan text", i, edits[i].from);
        int line = 1;
        for (const char *q = good; q < at; q++)
            line += *q == '\n';
        write_edited(path, good, at, at + strlen(edits[i].from), edits[i].to);
        ps_plan *back = NULL;
        ps_plan_model *m = NULL;
        ps_error err = {0};
        if (ps_plan_load(path, &back, &err) != PS_OK)
            fail_msg("edit %zu: %s", i, err.msg);
        assert_int_not_equal(ps_plan_model_build(back, &m, &err), PS_OK);
        assert_null(m);
        char where[300];
        snprintf(where, sizeof where, "%s:%d:", path, line);
        if (strstr(err.msg, edits[i].want) == NULL || strstr(err.msg, where) != err.msg)
            fail_msg("edit %zu (line %d): \"%s\" lacks \"%s\" or does not start with \"%s\"", i,
                     line, err.msg, edits[i].want, where);
        ps_plan_free(back);
    }
    /* a plan made in memory still names what it reads */
    p = mlp_plan(PS_METHOD_SHARD, "dgx-a100:1", 1);
    json_object_set_new(p->model, "colour", json_integer(1));
    ps_plan_model *m = NULL;
    ps_error err = {0};
    assert_int_not_equal(ps_plan_model_build(p, &m, &err), PS_OK);
    assert_non_null(strstr(err.msg, "plan model:"));
    assert_non_null(strstr(err.msg, "colour: unknown key"));
    ps_plan_free(p);
    free(good);
    unlink(path);
    rmdir(dir);
}

/* Data parallelism of a model too big for the device is refused with the
 * memory it needs. */
static void out_of_memory_is_explained(void **state)
{
    (void)state;
    ps_model_config cfg;
    assert_int_equal(ps_zoo_lookup("gpt-2.6b", &cfg, NULL), PS_OK);
    cfg.layers = 16; /* 1.4 B parameters: 22 GB of weights, gradients and Adam state */
    cfg.batch = 8;
    ps_graph *fwd = NULL;
    assert_int_equal(ps_model_build(&cfg, &fwd, NULL), PS_OK);
    ps_cluster *c = NULL;
    assert_int_equal(ps_cluster_from_preset("p3.16xlarge:1", &c, NULL), PS_OK);
    ps_plan_request req = {.forward = fwd, .config = &cfg, .train = ps_train_options_default(),
                           .cluster = c, .method = PS_METHOD_DATA, .global_batch = 64,
                           .micro_batches = 8, .ilp = ps_ilp_options_default()};
    ps_plan *p = NULL;
    ps_error err = {0};
    assert_int_equal(ps_plan_one_stage(&req, &p, NULL, NULL, &err), PS_ERR_INFEASIBLE);
    assert_null(p);
    assert_non_null(strstr(err.msg, "does not fit in memory with method data"));
    assert_non_null(strstr(err.msg, "(16 GiB per device;")); /* a V100's, as its preset says */
    assert_non_null(strstr(err.msg, "it needs at least"));
    /* ZeRO-3 shards it enough */
    req.method = PS_METHOD_ZERO3;
    ps_error_clear(&err);
    if (ps_plan_one_stage(&req, &p, NULL, NULL, &err) != PS_OK)
        fail_msg("%s", err.msg);
    assert_true(p->peak_memory_bytes <= 17179869184.0);
    ps_plan_free(p);
    /* a micro-batch that does not split over the data-parallel devices */
    ps_graph_free(fwd);
    cfg.batch = 4;
    assert_int_equal(ps_model_build(&cfg, &fwd, NULL), PS_OK);
    req.forward = fwd;
    req.global_batch = 32;
    ps_error_clear(&err);
    assert_int_equal(ps_plan_one_stage(&req, &p, NULL, NULL, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "micro-batch of 4 samples does not split over 8"));
    /* from a graph file (no zoo config) the message names the input, whose
     * leading dimension is the file's to change */
    req.config = NULL;
    ps_error_clear(&err);
    assert_int_equal(ps_plan_one_stage(&req, &p, NULL, NULL, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "splits every input's leading dimension over the 8 devices"));
    assert_non_null(strstr(err.msg, "has 4; give the graph's inputs leading dimensions"));
    ps_cluster_free(c);
    ps_graph_free(fwd);
}

/* A plan whose predicted times the reader would refuse (infinite, or
 * beyond 1e30 s) is not written, the time named. */
static void unreadable_times_are_not_written(void **state)
{
    (void)state;
    const char *path = PS_TEST_DATA_DIR "/../../traces/data/h200/gpt-350m-bf16.plan.json";
    char out[] = "/tmp/ps-test-plan-times-XXXXXX";
    int fd = mkstemp(out);
    assert_true(fd >= 0);
    close(fd);
    ps_plan *p = NULL;
    ps_error err = {0};
    assert_int_equal(ps_plan_load(path, &p, &err), PS_OK);
    assert_int_equal(ps_plan_save(p, out, &err), PS_OK);
    double kept = p->stages[0].forward_s;
    p->stages[0].forward_s = INFINITY;
    err = (ps_error){0};
    assert_int_equal(ps_plan_save(p, out, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "the predicted forward of stage 0 is inf s"));
    p->stages[0].forward_s = kept;
    p->iteration_s = 1e31;
    err = (ps_error){0};
    assert_int_equal(ps_plan_save(p, out, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "the predicted iteration is 1e+31 s"));
    p->iteration_s = 1;
    p->stages[0].ops[0].comm_s = NAN;
    err = (ps_error){0};
    assert_int_equal(ps_plan_save(p, out, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "op time of stage 0"));
    ps_plan_free(p);
    unlink(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_stage_plan_predictions),
        cmocka_unit_test(plan_file_round_trip),
        cmocka_unit_test(invalid_plans_are_rejected),
        cmocka_unit_test(unreadable_times_are_not_written),
        cmocka_unit_test(remat_layers_name_the_plans_layers),
        cmocka_unit_test(malformed_plan_files),
        cmocka_unit_test(model_and_training_errors_point_into_the_file),
        cmocka_unit_test(lowering_recounts_missing_predictions),
        cmocka_unit_test(digest_ignores_predictions),
        cmocka_unit_test(committed_runs_name_their_plans),
        cmocka_unit_test(plan_records_its_profile_db),
        cmocka_unit_test(out_of_memory_is_explained),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
