/* traces/: run summaries (file round trip, malformed files, printing) and the
 * Chrome trace writer (read back with jansson). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/bytes_text.h"
#include "core/json.h"
#include "tests/test_util.h"
#include "traces/summary.h"
#include "traces/trace.h"

#define GIB 1073741824.0
#define MIB 1048576.0

/* ---- helpers ------------------------------------------------------------ */

typedef struct tmpdir {
    char dir[64];
    char path[128];
} tmpdir;

static void tmpdir_make(tmpdir *t, const char *file)
{
    snprintf(t->dir, sizeof t->dir, "/tmp/ps-test-traces-XXXXXX");
    assert_non_null(mkdtemp(t->dir));
    snprintf(t->path, sizeof t->path, "%s/%s", t->dir, file);
}

static void tmpdir_remove(tmpdir *t)
{
    unlink(t->path);
    rmdir(t->dir);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* A value with many significant digits, spread over magnitudes, so that a
 * lossy round trip shows. */
static double varied(double scale)
{
    return scale * (uniform() + 1e-9 * uniform());
}

/* Three stages on 16 devices: stage 0 on devices 0-1 (1x2 as 2x1), stage 1
 * on 2-5 (1x4 as 1x4), two idle devices 6-7 without a stage, stage 2 on
 * 8-15 (two nodes, 2x4 as 4x2). Device ids skip none but the stage-less
 * ones exercise stage -1. */
static ps_summary *sample_summary(int extra_idle_devices)
{
    ps_summary *s = NULL;
    assert_int_equal(ps_summary_create(16 + extra_idle_devices, 3, &s), PS_OK);
    snprintf(s->source, sizeof s->source, "sim");
    snprintf(s->plan, sizeof s->plan, "0123456789abcdef");
    snprintf(s->model, sizeof s->model, "gpt-2.6b \"quoted\" \\ model");
    snprintf(s->cluster, sizeof s->cluster, "p3.16xlarge:2");
    s->micro_batches = 24;
    s->iteration_s = varied(2.0);
    s->tflops_per_device = varied(120.0);
    s->mfu = varied(0.6);
    s->wall_s = varied(30.0);
    static const int stage_of[16] = {0, 0, 1, 1, 1, 1, -1, -1, 2, 2, 2, 2, 2, 2, 2, 2};
    s->peak_memory_bytes = 0;
    for (int d = 0; d < s->n_devices; d++) {
        ps_summary_device *dev = &s->devices[d];
        dev->id = d < 16 ? d : 16 + 3 * (d - 16); /* ids may have gaps */
        dev->stage = d < 16 ? stage_of[d] : -1;
        /* device 4 computes for longer than the step (overlapped
         * communication): its idle time is 0, written as a subnormal */
        dev->compute_s = d == 4 ? 3.0 : varied(1.0);
        dev->comm_s = d == 3 ? 0.0 : varied(0.1);
        dev->idle_s = d == 4 ? 1e-300 : fmax(0.0, s->iteration_s - dev->compute_s - dev->comm_s);
        dev->peak_memory_bytes = dev->stage < 0 ? 0 : varied(16e9);
        if (dev->peak_memory_bytes > s->peak_memory_bytes)
            s->peak_memory_bytes = dev->peak_memory_bytes;
    }
    static const int shape[3][5] = {
        /* devices, first, submesh, logical d0 */
        {2, 0, 1, 2, 2},
        {4, 2, 1, 4, 1},
        {8, 8, 2, 4, 4},
    };
    for (int i = 0; i < 3; i++) {
        ps_summary_stage *g = &s->stages[i];
        g->n_devices = shape[i][0];
        g->first_device = shape[i][1];
        g->submesh[0] = shape[i][2];
        g->submesh[1] = shape[i][3];
        g->logical_mesh[0] = shape[i][4];
        g->logical_mesh[1] = shape[i][0] / shape[i][4];
        g->forward_s = varied(0.01);
        g->backward_s = varied(0.02);
        g->time_s = g->forward_s + g->backward_s;
        g->update_s = varied(0.005);
        g->peak_memory_bytes = 0; /* the largest of its devices' */
        for (int d = 0; d < s->n_devices; d++)
            if (s->devices[d].stage == i)
                g->peak_memory_bytes = fmax(g->peak_memory_bytes, s->devices[d].peak_memory_bytes);
    }
    return s;
}

static void assert_summaries_equal(const ps_summary *a, const ps_summary *b)
{
    assert_string_equal(a->source, b->source);
    assert_string_equal(a->plan, b->plan);
    assert_string_equal(a->model, b->model);
    assert_string_equal(a->cluster, b->cluster);
    assert_int_equal(a->micro_batches, b->micro_batches);
    /* exact: a summary must survive a file without losing a bit */
    assert_true(a->iteration_s == b->iteration_s);
    assert_true(a->tflops_per_device == b->tflops_per_device);
    assert_true(a->mfu == b->mfu);
    assert_true(a->peak_memory_bytes == b->peak_memory_bytes);
    assert_true(a->wall_s == b->wall_s);
    assert_int_equal(a->timed_steps, b->timed_steps);
    assert_true(a->iteration_min_s == b->iteration_min_s);
    assert_true(a->iteration_max_s == b->iteration_max_s);
    assert_int_equal(a->n_devices, b->n_devices);
    assert_int_equal(a->n_stages, b->n_stages);
    for (int d = 0; d < a->n_devices; d++) {
        const ps_summary_device *x = &a->devices[d], *y = &b->devices[d];
        assert_int_equal(x->id, y->id);
        assert_int_equal(x->stage, y->stage);
        if (x->compute_s != y->compute_s || x->comm_s != y->comm_s || x->idle_s != y->idle_s ||
            x->peak_memory_bytes != y->peak_memory_bytes)
            fail_msg("device %d: times or memory differ after the round trip", d);
    }
    for (int i = 0; i < a->n_stages; i++) {
        const ps_summary_stage *x = &a->stages[i], *y = &b->stages[i];
        assert_int_equal(x->index, y->index);
        assert_int_equal(x->n_devices, y->n_devices);
        assert_int_equal(x->first_device, y->first_device);
        assert_int_equal(x->submesh[0], y->submesh[0]);
        assert_int_equal(x->submesh[1], y->submesh[1]);
        assert_int_equal(x->logical_mesh[0], y->logical_mesh[0]);
        assert_int_equal(x->logical_mesh[1], y->logical_mesh[1]);
        if (x->time_s != y->time_s || x->forward_s != y->forward_s ||
            x->backward_s != y->backward_s || x->update_s != y->update_s ||
            x->peak_memory_bytes != y->peak_memory_bytes)
            fail_msg("stage %d: times or memory differ after the round trip", i);
    }
}

/* ---- summaries ---------------------------------------------------------- */

static void summary_round_trip(void **state)
{
    (void)state;
    tmpdir t;
    tmpdir_make(&t, "summary.json");
    for (int trial = 0; trial < 20; trial++) {
        test_rng_seed(1000 + (uint64_t)trial);
        ps_summary *s = sample_summary(trial % 3);
        static const char *const sources[] = {"planner", "sim", "exec-cpu", "exec-cuda"};
        snprintf(s->source, sizeof s->source, "%s", sources[trial % 4]);
        if (trial % 4 >= 2) { /* a measurement: its steps, one of them or several */
            s->timed_steps = trial % 4 == 2 ? 1 : 1 + trial;
            s->iteration_min_s = s->timed_steps == 1 ? s->iteration_s : 0.75 * s->iteration_s;
            s->iteration_max_s = s->timed_steps == 1 ? s->iteration_s : 1.5 * s->iteration_s;
        }
        ps_error err = {0};
        if (ps_summary_save(s, t.path, &err) != PS_OK)
            fail_msg("%s", err.msg);
        ps_summary *back = NULL;
        if (ps_summary_load(t.path, &back, &err) != PS_OK)
            fail_msg("%s", err.msg);
        assert_summaries_equal(s, back);
        ps_summary_free(back);
        ps_summary_free(s);
    }
    { /* a steps' range without steps is refused before anything is written */
        ps_summary *s = sample_summary(0);
        s->iteration_min_s = 1;
        ps_error err = {0};
        assert_int_equal(ps_summary_validate(s, &err), PS_ERR_INVALID);
        assert_non_null(strstr(err.msg, "need timed_steps"));
        ps_summary_free(s);
    }
    /* the stable keys are where DESIGN.md says */
    json_error_t jerr;
    json_t *j = json_load_file(t.path, 0, &jerr);
    assert_non_null(j);
    static const char *const top[] = {"format",
                                      "version",
                                      "source",
                                      "plan",
                                      "model",
                                      "cluster",
                                      "micro_batches",
                                      "iteration_s",
                                      "tflops_per_device",
                                      "mfu",
                                      "peak_memory_bytes",
                                      "wall_s",
                                      "devices",
                                      "stages"};
    for (size_t i = 0; i < sizeof top / sizeof *top; i++)
        if (json_object_get(j, top[i]) == NULL)
            fail_msg("no key \"%s\"", top[i]);
    assert_string_equal(json_string_value(json_object_get(j, "format")), "pipeshard-summary");
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 1);
    json_t *dev = json_array_get(json_object_get(j, "devices"), 0);
    static const char *const dev_keys[] = {"id",     "stage",  "compute_s",
                                           "comm_s", "idle_s", "peak_memory_bytes"};
    for (size_t i = 0; i < sizeof dev_keys / sizeof *dev_keys; i++)
        if (json_object_get(dev, dev_keys[i]) == NULL)
            fail_msg("no key devices[0].%s", dev_keys[i]);
    json_t *stage = json_array_get(json_object_get(j, "stages"), 2);
    static const char *const stage_keys[] = {
        "index",  "devices",   "first_device", "submesh",  "logical_mesh",
        "time_s", "forward_s", "backward_s",   "update_s", "peak_memory_bytes"};
    for (size_t i = 0; i < sizeof stage_keys / sizeof *stage_keys; i++)
        if (json_object_get(stage, stage_keys[i]) == NULL)
            fail_msg("no key stages[2].%s", stage_keys[i]);
    assert_int_equal(json_integer_value(json_object_get(stage, "devices")), 8);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(stage, "submesh"), 0)), 2);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(stage, "logical_mesh"), 1)),
                     2);
    json_decref(j);
    tmpdir_remove(&t);
}

/* What load refuses, save refuses too (instead of writing a file nobody can
 * read), and says why. */
static void invalid_summaries_are_not_written(void **state)
{
    (void)state;
    tmpdir t;
    tmpdir_make(&t, "summary.json");
    ps_summary *s = sample_summary(0);
    ps_error err = {0};
    json_t *j = NULL;

    double iteration_s = s->iteration_s;
    s->iteration_s = NAN;
    assert_int_equal(ps_summary_save(s, t.path, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, t.path));
    assert_non_null(strstr(err.msg, "iteration_s"));
    assert_int_equal(access(t.path, F_OK), -1);
    assert_int_equal(ps_summary_to_json(s, &j), PS_ERR_INVALID);
    assert_null(j);
    s->iteration_s = iteration_s;

    snprintf(s->source, sizeof s->source, "guess");
    ps_error_clear(&err);
    assert_int_equal(ps_summary_validate(s, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "source: unknown source \"guess\""));
    snprintf(s->source, sizeof s->source, "exec-cuda");

    s->devices[5].stage = 1;
    s->devices[6].stage = 1; /* stage 1 now has 5 devices listed, 4 declared */
    ps_error_clear(&err);
    assert_int_equal(ps_summary_validate(s, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "stages[1].devices"));
    s->devices[6].stage = -1;

    s->devices[9].id = 8;
    ps_error_clear(&err);
    assert_int_equal(ps_summary_validate(s, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "devices[9].id: device id 8 follows 8"));
    s->devices[9].id = 9;

    assert_int_equal(ps_summary_validate(s, NULL), PS_OK);
    ps_error_clear(&err);
    if (ps_summary_save(s, t.path, &err) != PS_OK)
        fail_msg("%s", err.msg);
    ps_summary_free(s);

    /* a directory that does not exist is named in the message */
    char bad[256];
    snprintf(bad, sizeof bad, "%s/no-such-dir/summary.json", t.dir);
    s = sample_summary(0);
    ps_error_clear(&err);
    assert_int_equal(ps_summary_save(s, bad, &err), PS_ERR_IO);
    assert_non_null(strstr(err.msg, bad));
    ps_summary *back = NULL;
    ps_error_clear(&err);
    assert_int_equal(ps_summary_load(bad, &back, &err), PS_ERR_IO);
    assert_null(back);
    assert_non_null(strstr(err.msg, bad));
    ps_summary_free(s);
    tmpdir_remove(&t);
}

/* One edit of a good summary document: set (or with value NULL, delete)
 * root[key], or root[array][index][key]. */
typedef struct summary_edit {
    const char *array;
    int index;
    const char *key;
    const char *value; /* JSON text; NULL deletes the key */
    const char *want;  /* substring of the message */
    ps_status status;
} summary_edit;

static void malformed_summary_files(void **state)
{
    (void)state;
    tmpdir t;
    tmpdir_make(&t, "summary.json");
    ps_summary *s = sample_summary(0);
    s->timed_steps = 5; /* a measurement's steps, around its median */
    s->iteration_min_s = 0.5 * s->iteration_s;
    s->iteration_max_s = 2 * s->iteration_s;
    json_t *good = NULL;
    assert_int_equal(ps_summary_to_json(s, &good), PS_OK);
    ps_summary_free(s);

    static const summary_edit edits[] = {
        {NULL, 0, "format", "\"pipeshard-plan\"",
         "format: a \"pipeshard-plan\" file, not a run summary (\"pipeshard-summary\")",
         PS_ERR_INVALID},
        {NULL, 0, "version", "2", "version: unsupported version 2", PS_ERR_UNSUPPORTED},
        {NULL, 0, "version", "\"1\"", "version: expected an integer, found a string",
         PS_ERR_INVALID},
        {NULL, 0, "source", "\"guess\"", "source: unknown value \"guess\"", PS_ERR_INVALID},
        {NULL, 0, "iteration_ms", "1", "iteration_ms: unknown key \"iteration_ms\"",
         PS_ERR_INVALID},
        {NULL, 0, "mfu", NULL, "(top level): missing key \"mfu\"", PS_ERR_INVALID},
        {NULL, 0, "iteration_s", "\"fast\"", "iteration_s: expected a number, found a string",
         PS_ERR_INVALID},
        {NULL, 0, "peak_memory_bytes", "true",
         "peak_memory_bytes: expected a number, found a "
         "boolean",
         PS_ERR_INVALID},
        {NULL, 0, "model", "5", "model: expected a string, found an integer", PS_ERR_INVALID},
        {NULL, 0, "plan", "\"0123456789abcdef0123456789abcdef\"", "plan: longer than 31 bytes",
         PS_ERR_INVALID},
        {NULL, 0, "micro_batches", "0", "micro_batches: 0 is out of range", PS_ERR_INVALID},
        {NULL, 0, "wall_s", "-1.5", "wall_s: -1.5 is out of range", PS_ERR_INVALID},
        {NULL, 0, "timed_steps", "0", "timed_steps: 0 is out of range", PS_ERR_INVALID},
        {NULL, 0, "timed_steps", "2.5", "timed_steps: expected an integer", PS_ERR_INVALID},
        {NULL, 0, "timed_steps", NULL, "(top level): missing key \"timed_steps\"", PS_ERR_INVALID},
        {NULL, 0, "iteration_max_s", NULL, "(top level): missing key \"iteration_max_s\"",
         PS_ERR_INVALID},
        {NULL, 0, "iteration_min_s", "-1", "iteration_min_s: -1 is out of range", PS_ERR_INVALID},
        {NULL, 0, "iteration_min_s", "1e6",
         "iteration_min_s: the fastest step (1000000 s) is slower than the median iteration",
         PS_ERR_INVALID},
        {NULL, 0, "iteration_max_s", "1e-12", "is faster than the median iteration",
         PS_ERR_INVALID},
        {NULL, 0, "timed_steps", "1",
         "iteration_min_s: one timed step: its fastest and slowest are the iteration",
         PS_ERR_INVALID},
        {NULL, 0, "stages", "[]", "stages: a summary needs at least one stage", PS_ERR_INVALID},
        {NULL, 0, "devices", "{}", "devices: expected an array, found an object", PS_ERR_INVALID},
        {"devices", 1, "compute_s", "-0.5", "devices[1].compute_s: -0.5 is out of range",
         PS_ERR_INVALID},
        {"devices", 2, "id", "1", "devices[2].id: device id 1 follows 1", PS_ERR_INVALID},
        {"devices", 3, "id", "0", "devices[3].id: device id 0 follows 2", PS_ERR_INVALID},
        {"devices", 0, "id", "-1", "devices[0].id: -1 is out of range", PS_ERR_INVALID},
        {"devices", 0, "stage", "3", "devices[0].stage: stage 3 is not a stage", PS_ERR_INVALID},
        {"devices", 0, "stage", "1", "stages[0].devices: stage 0 has 2 devices but 1 entries",
         PS_ERR_INVALID},
        {"devices", 4, "flops", "1", "devices[4].flops: unknown key \"flops\"", PS_ERR_INVALID},
        {"devices", 4, "idle_s", NULL, "devices[4]: missing key \"idle_s\"", PS_ERR_INVALID},
        {"stages", 1, "index", "2", "stages[1].index: stage at position 1 has index 2",
         PS_ERR_INVALID},
        {"stages", 0, "submesh", "[1]",
         "stages[0].submesh: expected 2 positive integers, "
         "found 1 values",
         PS_ERR_INVALID},
        {"stages", 0, "submesh", "[1, 2, 3]", "stages[0].submesh: expected 2 positive",
         PS_ERR_INVALID},
        {"stages", 0, "logical_mesh", "[0, 2]", "stages[0].logical_mesh[0]: 0 is out of range",
         PS_ERR_INVALID},
        {"stages", 0, "logical_mesh", "[2, 1.5]",
         "stages[0].logical_mesh[1]: expected an "
         "integer, found a number",
         PS_ERR_INVALID},
        {"stages", 0, "submesh", "[1, 3]",
         "stages[0].submesh: submesh 1x3 does not hold the "
         "stage's 2 devices",
         PS_ERR_INVALID},
        {"stages", 2, "logical_mesh", "[3, 3]", "stages[2].logical_mesh: logical mesh 3x3",
         PS_ERR_INVALID},
        {"stages", 2, "first_device", "9",
         "stages[2].first_device: first device 9, but the "
         "smallest device id of stage 2 in devices[] is 8",
         PS_ERR_INVALID},
        {"stages", 1, "time_s", "null", "stages[1].time_s: expected a number, found null",
         PS_ERR_INVALID},
        /* numbers that contradict each other */
        {"stages", 1, "time_s", "1", "stages[1].time_s: 1 is not forward_s + backward_s",
         PS_ERR_INVALID},
        {"stages", 0, "peak_memory_bytes", "1",
         "stages[0].peak_memory_bytes: 1 is not the largest of stage 0's devices' peaks",
         PS_ERR_INVALID},
        {NULL, 0, "peak_memory_bytes", "1",
         "peak_memory_bytes: 1 is not the largest of the devices' peaks", PS_ERR_INVALID},
        {"devices", 0, "idle_s", "0",
         "devices[0].idle_s: 0 is not the rest of the step, iteration_s - compute_s - comm_s",
         PS_ERR_INVALID},
        {"devices", 4, "idle_s", "0.5", "devices[4].idle_s: 0.5 is not the rest of the step",
         PS_ERR_INVALID},
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        const summary_edit *e = &edits[i];
        json_t *doc = json_deep_copy(good);
        json_t *obj =
            e->array ? json_array_get(json_object_get(doc, e->array), (size_t)e->index) : doc;
        assert_non_null(obj);
        if (e->value == NULL) {
            assert_int_equal(json_object_del(obj, e->key), 0);
        } else {
            json_error_t jerr;
            json_t *v = json_loads(e->value, JSON_DECODE_ANY, &jerr);
            assert_non_null(v);
            assert_int_equal(json_object_set_new(obj, e->key, v), 0);
        }
        ps_error err = {0};
        assert_int_equal(ps_json_save(doc, t.path, &err), PS_OK);
        json_decref(doc);
        ps_summary *back = NULL;
        ps_status st = ps_summary_load(t.path, &back, &err);
        assert_null(back);
        if (st != e->status || strstr(err.msg, e->want) == NULL ||
            strstr(err.msg, t.path) != err.msg)
            fail_msg("edit %zu: status %d, \"%s\" lacks \"%s\"", i, st, err.msg, e->want);
    }

    /* texts that are no summary at all */
    static const struct {
        const char *text, *want;
        ps_status status;
    } texts[] = {
        {"[1, 2]", "(top level): expected an object, found an array", PS_ERR_INVALID},
        {"\"summary\"", "'[' or '{' expected", PS_ERR_PARSE},
        {"{\"format\": \"pipeshard-summary\", \"iteration_s\": 1e999}", "overflow", PS_ERR_PARSE},
        {"{\"format\": \"pipeshard-summary\", \"iteration_s\": NaN}", ":1:", PS_ERR_PARSE},
        {"{\"format\": \"pipeshard-summary\", \"version\": 1", ":1:", PS_ERR_PARSE},
        {"", ":1:", PS_ERR_PARSE},
        {"{\"format\": \"pipeshard-summary\", \"version\": 1, \"version\": 1}", "duplicate",
         PS_ERR_PARSE},
        {"{\"format\": \"pipeshard-summary\"}", "missing key \"version\"", PS_ERR_INVALID},
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        write_text(t.path, texts[i].text);
        ps_summary *back = NULL;
        ps_error err = {0};
        ps_status st = ps_summary_load(t.path, &back, &err);
        assert_null(back);
        if (st != texts[i].status || strstr(err.msg, texts[i].want) == NULL ||
            strstr(err.msg, t.path) != err.msg)
            fail_msg("text %zu: status %d, \"%s\" lacks \"%s\"", i, st, err.msg, texts[i].want);
    }

    /* the position points at the offending value: line of "id" in devices[2] */
    json_t *doc = json_deep_copy(good);
    json_object_set_new(json_array_get(json_object_get(doc, "devices"), 2), "id", json_integer(1));
    ps_error err = {0};
    assert_int_equal(ps_json_save(doc, t.path, &err), PS_OK);
    json_decref(doc);
    FILE *f = fopen(t.path, "r");
    assert_non_null(f);
    char line[256];
    int line_no = 0, id_line = 0, ids_seen = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        line_no++;
        if (strstr(line, "\"id\":") != NULL && ++ids_seen == 3)
            id_line = line_no;
    }
    fclose(f);
    ps_summary *back = NULL;
    assert_int_equal(ps_summary_load(t.path, &back, &err), PS_ERR_INVALID);
    char where[200];
    snprintf(where, sizeof where, "%s:%d:", t.path, id_line);
    if (strstr(err.msg, where) != err.msg)
        fail_msg("\"%s\" does not start with \"%s\"", err.msg, where);

    json_decref(good);
    tmpdir_remove(&t);
}

/* Splits text into lines (in place); returns the count. */
static int split_lines(char *text, char **lines, int cap)
{
    int n = 0;
    for (char *p = strtok(text, "\n"); p != NULL && n < cap; p = strtok(NULL, "\n"))
        lines[n++] = p;
    return n;
}

static char *print_to_string(const ps_summary *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    ps_summary_print(s, f);
    assert_int_equal(fclose(f), 0);
    return buf;
}

static void summary_print_table(void **state)
{
    (void)state;
    ps_summary *s = sample_summary(0);
    s->iteration_s = 1.2345;
    s->tflops_per_device = 98.76;
    s->mfu = 0.3125;
    s->peak_memory_bytes = 12.5 * GIB;
    s->stages[1].forward_s = 0.0125;
    s->stages[1].backward_s = 0.025;
    s->stages[1].update_s = 0.004;
    s->stages[1].time_s = 0.0375;
    s->stages[1].peak_memory_bytes = 7.25 * GIB;
    char *text = print_to_string(s);
    assert_non_null(strstr(text, "sim"));
    assert_non_null(strstr(text, s->model));
    assert_non_null(strstr(text, "p3.16xlarge:2"));
    assert_non_null(strstr(text, "0123456789abcdef"));
    assert_non_null(strstr(text, "24 micro-batches"));
    assert_non_null(strstr(text, "1234.500 ms"));
    assert_non_null(strstr(text, "98.76 TFLOP/s"));
    assert_non_null(strstr(text, "MFU 31.2%"));
    assert_non_null(strstr(text, "peak memory 12.50 GiB"));
    /* memory in the binary unit of each table's largest entry, as plans show it */
    assert_non_null(strstr(text, "time ms peak GiB\n"));
    assert_non_null(strstr(text, "idle ms peak GiB\n"));

    char *lines[128];
    int n = split_lines(text, lines, 128);
    int stage_rows = 0, device_rows = 0;
    for (int i = 0; i < n; i++) {
        int index, devices, dev_id;
        char sub[32], logical[32], stage[16];
        double fwd, bwd, upd, time_ms, peak_gb, compute, comm, idle;
        if (sscanf(lines[i], "%d %d %31s %31s %lf %lf %lf %lf %lf", &index, &devices, sub, logical,
                   &fwd, &bwd, &upd, &time_ms, &peak_gb) == 9) {
            assert_int_equal(index, stage_rows);
            const ps_summary_stage *g = &s->stages[index];
            assert_int_equal(devices, g->n_devices);
            char want[32];
            snprintf(want, sizeof want, "%dx%d", g->submesh[0], g->submesh[1]);
            assert_string_equal(sub, want);
            snprintf(want, sizeof want, "%dx%d", g->logical_mesh[0], g->logical_mesh[1]);
            assert_string_equal(logical, want);
            assert_true(fabs(fwd - g->forward_s * 1e3) < 1e-3);
            assert_true(fabs(bwd - g->backward_s * 1e3) < 1e-3);
            assert_true(fabs(upd - g->update_s * 1e3) < 1e-3);
            assert_true(fabs(time_ms - g->time_s * 1e3) < 1e-3);
            assert_true(fabs(peak_gb - g->peak_memory_bytes / GIB) < 1e-2);
            stage_rows++;
        } else if (sscanf(lines[i], "%d %15s %lf %lf %lf %lf", &dev_id, stage, &compute, &comm,
                          &idle, &peak_gb) == 6) {
            const ps_summary_device *d = &s->devices[device_rows];
            assert_int_equal(dev_id, d->id);
            if (d->stage < 0)
                assert_string_equal(stage, "-");
            else
                assert_int_equal(atoi(stage), d->stage);
            assert_true(fabs(compute - d->compute_s * 1e3) < 1e-3);
            assert_true(fabs(idle - d->idle_s * 1e3) < 1e-3);
            device_rows++;
        }
    }
    assert_int_equal(stage_rows, 3);
    assert_int_equal(device_rows, 16); /* 16 devices: every one gets a line */
    /* the stage-1 row as a reader sees it */
    free(text);
    text = print_to_string(s);
    assert_non_null(strstr(text, "12.500     25.000      4.000     37.500     7.25"));
    free(text);
    /* a small run's tables switch to MiB: a CPU plan's 34.19 MiB, not 0.0359 */
    s->peak_memory_bytes = 34.19 * MIB;
    for (int i = 0; i < s->n_stages; i++)
        s->stages[i].peak_memory_bytes = (i == 1 ? 34.19 : 0.5) * MIB;
    for (int d = 0; d < s->n_devices; d++)
        s->devices[d].peak_memory_bytes = (d == 0 ? 3.5 : 0.25) * MIB;
    text = print_to_string(s);
    assert_non_null(strstr(text, "peak memory 34.19 MiB"));
    assert_non_null(strstr(text, "time ms peak MiB\n"));
    assert_non_null(strstr(text, "37.500    34.19\n"));
    assert_non_null(strstr(text, "idle ms peak MiB\n"));
    assert_non_null(strstr(text, "    0.25\n"));
    free(text);
    ps_summary_free(s);
}

/* The whole text of a file (NUL-terminated; the caller frees it). */
static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s", path);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *text = malloc((size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    text[n] = '\0';
    fclose(f);
    return text;
}

/* The body of the first fenced block after `after` in doc (a new string). */
static char *fenced_block_after(const char *doc, const char *after, const char *fence)
{
    const char *at = strstr(doc, after);
    if (at == NULL)
        fail_msg("docs/trace-format.md no longer says \"%s\"", after);
    const char *open = strstr(at, fence);
    assert_non_null(open);
    open += strlen(fence);
    const char *close = strstr(open, "```");
    assert_non_null(close);
    char *body = strndup(open, (size_t)(close - open));
    assert_non_null(body);
    return body;
}

/* docs/trace-format.md's summary example is a file pipeshard loads, and its
 * terminal example is what ps_summary_print makes of it. */
static void doc_summary_example(void **state)
{
    (void)state;
    char *doc = read_text(PS_TEST_DATA_DIR "/../../docs/trace-format.md");
    char *json = fenced_block_after(doc, "## Summary files", "```json\n");
    char *shown = fenced_block_after(doc, "`ps_summary_print` writes", "```\n");
    ps_summary *s = NULL;
    ps_error err = {0};
    if (ps_summary_parse("docs/trace-format.md's example", json, &s, &err) != PS_OK)
        fail_msg("the example summary is refused: %s", err.msg);
    char *text = print_to_string(s);
    if (strcmp(text, shown) != 0)
        fail_msg("ps_summary_print of the example:\n%s\nthe document shows:\n%s", text, shown);
    free(text);
    ps_summary_free(s);
    free(json);
    free(shown);
    free(doc);
}

/* The binary units of every memory figure a person reads. */
static void bytes_units(void **state)
{
    (void)state;
    const struct {
        double bytes;
        const char *unit;
        double per_unit;
    } cases[] = {{0, "B", 1},
                 {1023, "B", 1},
                 {1024, "KiB", 1024},
                 {1.5 * MIB, "MiB", MIB},
                 {GIB - 1, "MiB", MIB},
                 {GIB, "GiB", GIB},
                 {3 * 1125899906842624.0 * 1024, "PiB", 1125899906842624.0}, /* 3 EiB: PiB */
                 {-GIB, "B", 1},
                 {NAN, "B", 1},
                 {INFINITY, "B", 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ps_bytes_unit u = ps_bytes_unit_for(cases[i].bytes);
        assert_string_equal(u.name, cases[i].unit);
        assert_true(u.bytes == cases[i].per_unit);
    }
    char buf[32];
    assert_string_equal(ps_bytes_text(512, buf, sizeof buf), "512 B");
    assert_string_equal(ps_bytes_text(1536, buf, sizeof buf), "1.50 KiB");
    assert_string_equal(ps_bytes_text(15.06 * GIB, buf, sizeof buf), "15.06 GiB");
    assert_string_equal(ps_bytes_text(3072 * 1125899906842624.0, buf, sizeof buf), "3072.00 PiB");
}

/* Beyond 16 devices, a digest: min/mean/max and the device with the peak. */
static void summary_print_digest(void **state)
{
    (void)state;
    ps_summary *s = sample_summary(24); /* 40 devices */
    for (int d = 0; d < s->n_devices; d++) {
        s->devices[d].compute_s = 0.001 * (d + 1);
        s->devices[d].comm_s = 0.002;
        s->devices[d].idle_s = d == 7 ? 0.5 : 0.1;
        s->devices[d].peak_memory_bytes = d == 11 ? 15.5 * GIB : GIB;
    }
    char *text = print_to_string(s);
    assert_non_null(strstr(text, "40 devices"));
    assert_non_null(strstr(text, "compute           1.000     20.500     40.000"));
    assert_non_null(strstr(text, "comm              2.000      2.000      2.000"));
    assert_non_null(strstr(text, "idle            100.000    110.000    500.000"));
    assert_non_null(strstr(text, "15.50 GiB on device 11 (stage 2)"));
    assert_null(strstr(text, "device stage")); /* no per-device table */
    free(text);
    ps_summary_free(s);
}

/* ---- traces ------------------------------------------------------------- */

static json_t *load_json(const char *path)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (j == NULL)
        fail_msg("%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
    assert_true(json_is_object(j));
    assert_true(json_is_array(json_object_get(j, "traceEvents")));
    assert_string_equal(json_string_value(json_object_get(j, "displayTimeUnit")), "ms");
    assert_true(json_is_object(json_object_get(j, "otherData")));
    return j;
}

/* The metadata event named `what` for pid (and tid when >= 0), or NULL;
 * the last one wins, as in the viewers. */
static json_t *find_meta(json_t *events, const char *what, int pid, int tid)
{
    json_t *hit = NULL, *e;
    size_t i;
    json_array_foreach(events, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "M") != 0 ||
            strcmp(json_string_value(json_object_get(e, "name")), what) != 0 ||
            json_integer_value(json_object_get(e, "pid")) != pid)
            continue;
        if (tid >= 0 && json_integer_value(json_object_get(e, "tid")) != tid)
            continue;
        hit = e;
    }
    return hit;
}

static const char *meta_name(json_t *events, const char *what, int pid, int tid)
{
    json_t *e = find_meta(events, what, pid, tid);
    return e ? json_string_value(json_object_get(json_object_get(e, "args"), "name")) : NULL;
}

static void trace_events_read_back(void **state)
{
    (void)state;
    tmpdir t;
    tmpdir_make(&t, "trace.json");
    ps_trace_writer *w = NULL;
    ps_error err = {0};
    if (ps_trace_open(t.path, 4, &w, &err) != PS_OK)
        fail_msg("%s", err.msg);
    static const char odd_name[] = "all-reduce \"grads\" \\ C:\\tmp\n\ttab \xc3\xa9 \x01";
    const ps_trace_event events[] = {
        {.device = 0,
         .category = PS_TRACE_COMPUTE,
         .name = "forward mb0",
         .start_s = 0,
         .duration_s = 0.001234567,
         .micro_batch = 0,
         .stage = 0,
         .peer = -1,
         .flops = 2.5e12},
        {.device = 1,
         .category = PS_TRACE_COLLECTIVE,
         .name = odd_name,
         .start_s = 0.0012346,
         .duration_s = 3.5e-6,
         .micro_batch = -1,
         .stage = 0,
         .peer = -1,
         .bytes = 1048576},
        {.device = 1,
         .category = PS_TRACE_SEND,
         .name = "send to 5",
         .start_s = 0.002,
         .duration_s = 0.000125,
         .micro_batch = 3,
         .stage = 0,
         .peer = 5,
         .bytes = 4096.5},
        {.device = 5,
         .category = PS_TRACE_RECV,
         .name = "recv from 1",
         .start_s = 0.002,
         .duration_s = 0.0001251,
         .micro_batch = 3,
         .stage = 1,
         .peer = 1,
         .bytes = 4096.5},
        {.device = 5,
         .category = PS_TRACE_IDLE,
         .name = NULL,
         .start_s = 1.5,
         .duration_s = 0,
         .micro_batch = -1,
         .stage = -1,
         .peer = -1},
        {.device = 6,
         .category = PS_TRACE_COMPUTE,
         .name = "backward mb7",
         .start_s = 123.456789,
         .duration_s = 0.98765,
         .micro_batch = 7,
         .stage = 1,
         .peer = -1,
         .flops = 1},
        {.device = 0,
         .category = PS_TRACE_COMPUTE,
         .name = "update",
         .start_s = 2.0,
         .duration_s = 0.5,
         .micro_batch = -1,
         .stage = 0,
         .peer = -1,
         .bytes = -3,
         .flops = -1},
    };
    const int n_events = (int)(sizeof events / sizeof *events);
    assert_int_equal(ps_trace_add(w, &events[0]), PS_OK);
    assert_int_equal(ps_trace_name_device(w, 5, "device 5 \"stage 1\" \\ recv"), PS_OK);
    for (int i = 1; i < n_events; i++)
        assert_int_equal(ps_trace_add(w, &events[i]), PS_OK);
    /* renaming after the default name: the later name wins */
    assert_int_equal(ps_trace_name_device(w, 6, "device 6 (renamed)"), PS_OK);
    assert_int_equal(ps_trace_set_info(w, "source", "sim"), PS_OK);
    assert_int_equal(ps_trace_set_info(w, "plan", "0123456789abcdef"), PS_OK);
    if (ps_trace_close(w, &err) != PS_OK)
        fail_msg("%s", err.msg);

    json_t *j = load_json(t.path);
    json_t *list = json_object_get(j, "traceEvents"), *e;
    json_t *other = json_object_get(j, "otherData");
    assert_string_equal(json_string_value(json_object_get(other, "source")), "sim");
    assert_string_equal(json_string_value(json_object_get(other, "plan")), "0123456789abcdef");
    assert_int_equal(json_integer_value(json_object_get(other, "devices_per_node")), 4);
    size_t i;
    int k = 0;
    json_array_foreach(list, i, e)
    {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        assert_non_null(ph);
        if (strcmp(ph, "X") != 0) {
            assert_string_equal(ph, "M");
            continue;
        }
        assert_true(k < n_events);
        const ps_trace_event *in = &events[k++];
        assert_int_equal(json_integer_value(json_object_get(e, "pid")), in->device / 4);
        assert_int_equal(json_integer_value(json_object_get(e, "tid")), in->device);
        double ts = json_number_value(json_object_get(e, "ts"));
        double dur = json_number_value(json_object_get(e, "dur"));
        if (fabs(ts - in->start_s * 1e6) > 1e-3 || fabs(dur - in->duration_s * 1e6) > 1e-3)
            fail_msg("event %d: ts %.6f dur %.6f us for %.9g + %.9g s", k - 1, ts, dur, in->start_s,
                     in->duration_s);
        const char *cat = ps_trace_category_names[in->category];
        assert_string_equal(json_string_value(json_object_get(e, "cat")), cat);
        assert_string_equal(json_string_value(json_object_get(e, "name")),
                            in->name ? in->name : cat);
        json_t *args = json_object_get(e, "args");
        assert_true(json_is_object(args));
        struct {
            const char *key;
            double value;
            bool present;
        } want[] = {
            {"stage", in->stage, in->stage >= 0},
            {"micro_batch", in->micro_batch, in->micro_batch >= 0},
            {"peer", in->peer, in->peer >= 0},
            {"bytes", in->bytes, in->bytes > 0},
            {"flops", in->flops, in->flops > 0},
        };
        size_t n_present = 0;
        for (size_t a = 0; a < sizeof want / sizeof *want; a++) {
            json_t *v = json_object_get(args, want[a].key);
            if (!want[a].present) {
                if (v != NULL)
                    fail_msg("event %d: args.%s should be omitted", k - 1, want[a].key);
                continue;
            }
            n_present++;
            if (v == NULL || json_number_value(v) != want[a].value)
                fail_msg("event %d: args.%s is not %g", k - 1, want[a].key, want[a].value);
        }
        assert_int_equal(json_object_size(args), n_present);
    }
    assert_int_equal(k, n_events);
    /* one process per node, one thread per device, names as given */
    assert_string_equal(meta_name(list, "process_name", 0, -1), "node 0");
    assert_string_equal(meta_name(list, "process_name", 1, -1), "node 1");
    assert_null(meta_name(list, "process_name", 2, -1));
    assert_string_equal(meta_name(list, "thread_name", 0, 0), "device 0");
    assert_string_equal(meta_name(list, "thread_name", 0, 1), "device 1");
    assert_string_equal(meta_name(list, "thread_name", 1, 5), "device 5 \"stage 1\" \\ recv");
    assert_string_equal(meta_name(list, "thread_name", 1, 6), "device 6 (renamed)");
    /* threads sort by device id, named ones included */
    for (int d = 0; d < 8; d++) {
        json_t *sort = find_meta(list, "thread_sort_index", d / 4, d);
        bool used = d == 0 || d == 1 || d == 5 || d == 6;
        if ((sort != NULL) != used)
            fail_msg("device %d: thread_sort_index %s", d, used ? "missing" : "unexpected");
        if (sort != NULL)
            assert_int_equal(
                json_integer_value(json_object_get(json_object_get(sort, "args"), "sort_index")),
                d);
    }
    assert_null(meta_name(list, "thread_name", 0, 2));
    /* each node is named once */
    int node_names = 0;
    json_array_foreach(list, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "name")), "process_name") == 0 &&
            strcmp(json_string_value(json_object_get(e, "ph")), "M") == 0)
            node_names++;
    }
    assert_int_equal(node_names, 2);
    json_decref(j);
    tmpdir_remove(&t);
}

/* Names that are not UTF-8 still give valid JSON. */
static void trace_names_are_escaped(void **state)
{
    (void)state;
    tmpdir t;
    tmpdir_make(&t, "trace.json");
    ps_trace_writer *w = NULL;
    ps_error err = {0};
    assert_int_equal(ps_trace_open(t.path, 8, &w, &err), PS_OK);
    static const char *const names[] = {"bad \xff byte",
                                        "cut \xc3",
                                        "overlong \xc0\xaf",
                                        "surrogate \xed\xa0\x80",
                                        "\x7f del",
                                        "\"",
                                        "\\"};
    static const char *const want[] = {"bad \xef\xbf\xbd byte",
                                       "cut \xef\xbf\xbd",
                                       "overlong \xef\xbf\xbd\xef\xbf\xbd",
                                       "surrogate \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd",
                                       "\x7f del",
                                       "\"",
                                       "\\"};
    const int n = (int)(sizeof names / sizeof *names);
    for (int i = 0; i < n; i++) {
        ps_trace_event e = {.device = i,
                            .category = PS_TRACE_COMPUTE,
                            .name = names[i],
                            .start_s = i,
                            .duration_s = 1,
                            .micro_batch = -1,
                            .stage = -1,
                            .peer = -1};
        assert_int_equal(ps_trace_add(w, &e), PS_OK);
    }
    assert_int_equal(ps_trace_close(w, &err), PS_OK);
    json_t *j = load_json(t.path);
    json_t *e;
    size_t i;
    int k = 0;
    json_array_foreach(json_object_get(j, "traceEvents"), i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X") == 0) {
            assert_string_equal(json_string_value(json_object_get(e, "name")), want[k]);
            k++;
        }
    }
    assert_int_equal(k, n);
    json_decref(j);
    tmpdir_remove(&t);
}

static void trace_without_events(void **state)
{
    (void)state;
    tmpdir t;
    tmpdir_make(&t, "trace.json");
    ps_trace_writer *w = NULL;
    ps_error err = {0};
    assert_int_equal(ps_trace_open(t.path, 8, &w, &err), PS_OK);
    assert_int_equal(ps_trace_close(w, &err), PS_OK);
    json_t *j = load_json(t.path);
    assert_int_equal(json_array_size(json_object_get(j, "traceEvents")), 0);
    json_decref(j);
    assert_int_equal(ps_trace_close(NULL, &err), PS_OK);
    tmpdir_remove(&t);
}

static void trace_errors(void **state)
{
    (void)state;
    tmpdir t;
    tmpdir_make(&t, "trace.json");
    ps_trace_writer *w = NULL;
    ps_error err = {0};
    char bad[256];
    snprintf(bad, sizeof bad, "%s/no-such-dir/trace.json", t.dir);
    assert_int_equal(ps_trace_open(bad, 8, &w, &err), PS_ERR_IO);
    assert_null(w);
    if (strstr(err.msg, bad) != err.msg || strstr(err.msg, "cannot write") == NULL)
        fail_msg("\"%s\" does not name %s", err.msg, bad);
    ps_error_clear(&err);
    assert_int_equal(ps_trace_open(t.path, 0, &w, &err), PS_ERR_INVALID);
    assert_null(w);
    assert_non_null(strstr(err.msg, "0 devices per node"));

    /* a bad event is refused, the rest of the file stays valid, and close
     * reports the first refusal with the path */
    ps_error_clear(&err);
    assert_int_equal(ps_trace_open(t.path, 2, &w, &err), PS_OK);
    ps_trace_event good = {.device = 3,
                           .category = PS_TRACE_SEND,
                           .name = "send",
                           .start_s = 1,
                           .duration_s = 2,
                           .micro_batch = -1,
                           .stage = -1,
                           .peer = 0};
    assert_int_equal(ps_trace_add(w, &good), PS_OK);
    ps_trace_event bad_event = good;
    bad_event.device = -2;
    assert_int_equal(ps_trace_add(w, &bad_event), PS_ERR_INVALID);
    bad_event = good;
    bad_event.duration_s = -1;
    assert_int_equal(ps_trace_add(w, &bad_event), PS_ERR_INVALID);
    bad_event = good;
    bad_event.start_s = INFINITY;
    assert_int_equal(ps_trace_add(w, &bad_event), PS_ERR_INVALID);
    bad_event = good;
    bad_event.category = PS_TRACE_CATEGORY_COUNT;
    assert_int_equal(ps_trace_add(w, &bad_event), PS_ERR_INVALID);
    assert_int_equal(ps_trace_add(w, &good), PS_OK);
    assert_int_equal(ps_trace_close(w, &err), PS_ERR_INVALID);
    if (strstr(err.msg, t.path) != err.msg || strstr(err.msg, "event 1: device -2") == NULL)
        fail_msg("\"%s\" does not explain the bad event", err.msg);
    json_t *j = load_json(t.path);
    json_t *e;
    size_t i;
    int spans = 0;
    json_array_foreach(json_object_get(j, "traceEvents"), i, e) spans +=
        strcmp(json_string_value(json_object_get(e, "ph")), "X") == 0;
    assert_int_equal(spans, 2);
    /* device 3 with 2 devices per node lives on node 1 */
    assert_string_equal(meta_name(json_object_get(j, "traceEvents"), "process_name", 1, -1),
                        "node 1");
    json_decref(j);

    /* a full device: the write error surfaces, naming the path */
    if (access("/dev/full", W_OK) == 0) {
        ps_error_clear(&err);
        assert_int_equal(ps_trace_open("/dev/full", 8, &w, &err), PS_OK);
        for (int k = 0; k < 20000; k++) {
            ps_trace_event x = good;
            x.device = k % 16;
            ps_trace_add(w, &x);
        }
        assert_int_equal(ps_trace_close(w, &err), PS_ERR_IO);
        assert_non_null(strstr(err.msg, "/dev/full"));
        assert_non_null(strstr(err.msg, "write failed"));
    }
    tmpdir_remove(&t);
}

/* Many events stream through: the file holds them all and parses. */
static void trace_many_events(void **state)
{
    (void)state;
    tmpdir t;
    tmpdir_make(&t, "trace.json");
    ps_trace_writer *w = NULL;
    ps_error err = {0};
    assert_int_equal(ps_trace_open(t.path, 8, &w, &err), PS_OK);
    const int devices = 1024, per_device = 100;
    for (int k = 0; k < per_device; k++)
        for (int d = 0; d < devices; d++) {
            ps_trace_event e = {.device = d,
                                .category = (ps_trace_category)(k % 5),
                                .name = "op",
                                .start_s = k * 1e-3,
                                .duration_s = 1e-3,
                                .micro_batch = k,
                                .stage = d / 256,
                                .peer = -1,
                                .flops = 1e9};
            assert_int_equal(ps_trace_add(w, &e), PS_OK);
        }
    assert_int_equal(ps_trace_close(w, &err), PS_OK);
    json_t *j = load_json(t.path);
    json_t *list = json_object_get(j, "traceEvents");
    /* spans + per node (name, sort) + per device (name, sort) */
    assert_int_equal(json_array_size(list),
                     (size_t)(devices * per_device + 2 * (devices / 8) + 2 * devices));
    assert_string_equal(meta_name(list, "process_name", 127, -1), "node 127");
    json_decref(j);
    tmpdir_remove(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(summary_round_trip),
        cmocka_unit_test(invalid_summaries_are_not_written),
        cmocka_unit_test(malformed_summary_files),
        cmocka_unit_test(summary_print_table),
        cmocka_unit_test(bytes_units),
        cmocka_unit_test(doc_summary_example),
        cmocka_unit_test(summary_print_digest),
        cmocka_unit_test(trace_events_read_back),
        cmocka_unit_test(trace_names_are_escaped),
        cmocka_unit_test(trace_without_events),
        cmocka_unit_test(trace_errors),
        cmocka_unit_test(trace_many_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
