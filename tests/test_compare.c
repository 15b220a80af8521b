/* compare and the charts (traces/compare.c, traces/plot.c, traces/trace_read.c,
 * cli/cmd_compare.c). Hand-made summaries (tests/data/compare/, values that
 * are exact in binary) give known relative errors, MAPE and worst cases;
 * different plans and stage layouts are refused; the command's error paths
 * exit cleanly with their messages.
 *
 * `test_compare --plots` (CTest: test_compare_plots) runs every gnuplot script
 * through the pipeshard binary and checks the PNG (header, dimensions) and
 * SVG each one writes; it exits 77 (skipped) when gnuplot is missing. */
/* cmocka needs these before it, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "traces/compare.h"
#include "traces/plot.h"
#include "traces/summary.h"
#include "traces/trace_read.h"

extern char **environ;

#define DATA PS_TEST_DATA_DIR "/compare"
#define CHILD_TIMEOUT_S 120.0

/* ---- helpers ------------------------------------------------------------- */

static char tmp_dir[256];

/* (this cmocka has no assert_double_equal) */
#define assert_near(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (eps))

static char *slurp(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        if (len + 1 >= cap) {
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0)
            break;
    }
    fclose(f);
    if (buf != NULL) {
        buf[len] = '\0';
        if (len_out != NULL)
            *len_out = len;
    }
    return buf;
}

/* Loads the hand-made summaries named (in tests/data/compare). */
static void load_runs(const char *const *names, int n, ps_summary **runs, char (*paths)[512])
{
    for (int i = 0; i < n; i++) {
        ps_error err = {0};
        snprintf(paths[i], 512, "%s/%s", DATA, names[i]);
        if (ps_summary_load(paths[i], &runs[i], &err) != PS_OK)
            fail_msg("%s", err.msg);
    }
}

static void free_runs(ps_summary **runs, int n)
{
    for (int i = 0; i < n; i++)
        ps_summary_free(runs[i]);
}

/* Joins the named files (reference -1: the default); returns the status and
 * fills *out or err. */
static ps_status join(const char *const *names, int n, int reference, ps_summary **runs,
                      ps_compare **out, ps_error *err)
{
    char paths[8][512];
    const char *files[8];
    load_runs(names, n, runs, paths);
    for (int i = 0; i < n; i++)
        files[i] = paths[i];
    return ps_compare_create((const ps_summary *const *)runs, files, n, reference, out, err);
}

/* ---- the library ------------------------------------------------------------ */

static void test_rel_error(void **state)
{
    (void)state;
    assert_true(ps_compare_rel_error(0.625, 0.5) == 0.25);
    assert_true(ps_compare_rel_error(0.375, 0.5) == -0.25);
    assert_true(ps_compare_rel_error(0, 0) == 0);
    assert_true(isnan(ps_compare_rel_error(1, 0)));
    assert_true(isnan(ps_compare_rel_error(NAN, 1)));
    assert_true(isnan(ps_compare_rel_error(1, INFINITY)));
}

/* planner.json, sim.json, exec.json: the measured run (exec-cuda) is the
 * reference; every error below is exact in binary. */
/* Run labels stay unique past 26 runs: A..Z, AA..ZZ, AAA. */
static void test_run_ids(void **state)
{
    (void)state;
    static const struct {
        int r;
        const char *id;
    } want[] = {{0, "A"}, {25, "Z"}, {26, "AA"}, {27, "AB"}, {51, "AZ"}, {52, "BA"},
                {701, "ZZ"}, {702, "AAA"}};
    char id[8];
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        assert_string_equal(ps_compare_run_id(want[i].r, id), want[i].id);
    char seen[800][8];
    for (int r = 0; r < 800; r++) {
        ps_compare_run_id(r, seen[r]);
        for (int q = 0; q < r; q++)
            if (strcmp(seen[q], seen[r]) == 0)
                fail_msg("runs %d and %d are both %s", q, r, seen[r]);
    }
}

static void test_join(void **state)
{
    (void)state;
    static const char *const names[] = {"planner.json", "sim.json", "exec.json"};
    ps_summary *runs[3] = {0};
    ps_compare *c = NULL;
    ps_error err = {0};
    assert_int_equal(join(names, 3, -1, runs, &c, &err), PS_OK);
    assert_int_equal(c->n_runs, 3);
    assert_int_equal(c->n_stages, 2);
    assert_int_equal(c->reference, 2);
    assert_int_equal(ps_compare_default_reference((const ps_summary *const *)runs, 3), 2);
    assert_string_equal(c->runs[0].file, DATA "/planner.json");

    /* planner: time per micro-batch 0.625 vs 0.5 and 0.21875 vs 0.25 */
    const ps_compare_cell *p0 = ps_compare_cell_at(c, 0, 0), *p1 = ps_compare_cell_at(c, 1, 0);
    assert_true(p0->value[PS_CMP_TIME] == 0.625);
    assert_true(p0->error[PS_CMP_TIME] == 0.25);
    assert_true(p1->error[PS_CMP_TIME] == -0.125);
    assert_true(c->runs[0].mape[PS_CMP_TIME] == 0.1875);
    assert_true(c->runs[0].worst[PS_CMP_TIME] == 0.25);
    assert_int_equal(c->runs[0].worst_stage[PS_CMP_TIME], 0);
    /* backward 0.5 vs 0.375 (+1/3) and 0.15625 vs 0.1875 (-1/6) */
    assert_true(p0->error[PS_CMP_BACKWARD] == (0.5 - 0.375) / 0.375);
    assert_true(p1->error[PS_CMP_BACKWARD] == (0.15625 - 0.1875) / 0.1875);
    assert_near(c->runs[0].mape[PS_CMP_BACKWARD], 0.25, 1e-15);
    /* memory 6e9 vs 8e9, 4e9 vs 4e9 */
    assert_true(p0->error[PS_CMP_MEMORY] == -0.25);
    assert_true(p1->error[PS_CMP_MEMORY] == 0);
    assert_true(c->runs[0].mape[PS_CMP_MEMORY] == 0.125);
    assert_true(c->runs[0].worst[PS_CMP_MEMORY] == -0.25);
    assert_int_equal(c->runs[0].worst_stage[PS_CMP_MEMORY], 0);
    /* the reference's stage 1 has no update: 0.125 against 0 is undefined
     * and left out of the MAPE; the sim's 0 against 0 is exact */
    assert_true(isnan(p1->error[PS_CMP_UPDATE]));
    assert_true(c->runs[0].mape[PS_CMP_UPDATE] == 0);
    assert_int_equal(c->runs[0].worst_stage[PS_CMP_UPDATE], 0);
    assert_true(ps_compare_cell_at(c, 1, 1)->error[PS_CMP_UPDATE] == 0);
    /* iterations 2.5 and 1.5 against 2 */
    assert_true(c->runs[0].iteration_error == 0.25);
    assert_true(c->runs[1].iteration_error == -0.25);
    assert_true(c->runs[2].iteration_error == 0);

    /* sim: exact on stage 0, +25% on stage 1 */
    assert_true(ps_compare_cell_at(c, 0, 1)->error[PS_CMP_TIME] == 0);
    assert_true(ps_compare_cell_at(c, 1, 1)->error[PS_CMP_TIME] == 0.25);
    assert_true(c->runs[1].mape[PS_CMP_TIME] == 0.125);
    assert_true(c->runs[1].worst[PS_CMP_TIME] == 0.25);
    assert_int_equal(c->runs[1].worst_stage[PS_CMP_TIME], 1);
    assert_true(c->runs[1].mape[PS_CMP_FORWARD] == 0.5);

    /* the reference against itself */
    for (int m = 0; m < PS_CMP_METRIC_COUNT; m++)
        assert_true(c->runs[2].mape[m] == 0);

    /* breakdown: the mean of the stage's two devices */
    const ps_compare_cell *r0 = ps_compare_cell_at(c, 0, 2);
    assert_true(r0->compute_s == 0.75);
    assert_true(r0->comm_s == 0.5);
    assert_true(r0->idle_s == 0.75);
    /* compute and communication per step against those means: the
     * planner's compute 1.25 and 2 against 0.75 and 1.5, its communication
     * equal; the simulator's communication 0.25 against 0.5 and 0.25 */
    assert_true(r0->value[PS_CMP_COMPUTE] == 0.75 && r0->value[PS_CMP_COMM] == 0.5);
    assert_near(p0->error[PS_CMP_COMPUTE], 2.0 / 3, 1e-15);
    assert_near(p1->error[PS_CMP_COMPUTE], 1.0 / 3, 1e-15);
    assert_near(c->runs[0].mape[PS_CMP_COMPUTE], 0.5, 1e-15);
    assert_true(c->runs[0].mape[PS_CMP_COMM] == 0);
    assert_true(ps_compare_cell_at(c, 0, 1)->error[PS_CMP_COMM] == -0.5);
    assert_true(c->runs[1].mape[PS_CMP_COMM] == 0.25);
    assert_true(c->runs[1].worst[PS_CMP_COMM] == -0.5);
    assert_int_equal(c->runs[1].worst_stage[PS_CMP_COMM], 0);
    ps_compare_free(c);
    free_runs(runs, 3);
}

/* Another reference: everything is measured against the planner. */
static void test_reference(void **state)
{
    (void)state;
    static const char *const names[] = {"planner.json", "sim.json", "exec.json"};
    ps_summary *runs[3] = {0};
    ps_compare *c = NULL;
    ps_error err = {0};
    assert_int_equal(join(names, 3, 0, runs, &c, &err), PS_OK);
    assert_int_equal(c->reference, 0);
    assert_true(ps_compare_cell_at(c, 0, 2)->error[PS_CMP_TIME] == -0.2); /* 0.5 vs 0.625 */
    assert_true(ps_compare_cell_at(c, 0, 0)->error[PS_CMP_TIME] == 0);
    /* stage 1: the exec run's update 0 against the planner's 0.125 */
    assert_true(ps_compare_cell_at(c, 1, 2)->error[PS_CMP_UPDATE] == -1);
    ps_compare_free(c);
    free_runs(runs, 3);

    /* without a measured run, the last file is the reference */
    static const char *const two[] = {"sim.json", "planner.json"};
    ps_summary *r2[2] = {0};
    assert_int_equal(join(two, 2, -1, r2, &c, &err), PS_OK);
    assert_int_equal(c->reference, 1);
    ps_compare_free(c);
    free_runs(r2, 2);
}

static void test_refuse_plans(void **state)
{
    (void)state;
    static const char *const names[] = {"planner.json", "other-plan.json"};
    ps_summary *runs[2] = {0};
    ps_compare *c = NULL;
    ps_error err = {0};
    assert_int_equal(join(names, 2, -1, runs, &c, &err), PS_ERR_INVALID);
    assert_null(c);
    assert_non_null(strstr(err.msg, "cannot compare " DATA "/planner.json and " DATA
                                    "/other-plan.json: they are runs of different plans "
                                    "(plan 0123456789abcdef, tiny on p3.16xlarge:1; plan "
                                    "fedcba9876543210, other on p3.16xlarge:1)"));
    free_runs(runs, 2);

    /* one digest under two models' or clusters' names: one summary was edited */
    ps_summary *a = NULL, *b = NULL;
    assert_int_equal(ps_summary_create(1, 1, &a), PS_OK);
    assert_int_equal(ps_summary_create(1, 1, &b), PS_OK);
    snprintf(a->plan, sizeof a->plan, "0123456789abcdef");
    snprintf(b->plan, sizeof b->plan, "0123456789abcdef");
    snprintf(a->model, sizeof a->model, "gpt-350m");
    snprintf(b->model, sizeof b->model, "gpt-1.3b");
    snprintf(a->cluster, sizeof a->cluster, "h100x1");
    snprintf(b->cluster, sizeof b->cluster, "h100x1");
    const ps_summary *both[2] = {a, b};
    const char *files[2] = {"a.json", "b.json"};
    ps_error_clear(&err);
    assert_int_equal(ps_compare_create(both, files, 2, -1, &c, &err), PS_ERR_INVALID);
    assert_string_equal(err.msg, "cannot compare a.json and b.json: both name plan "
                                 "0123456789abcdef, but as gpt-350m on h100x1 in a.json and "
                                 "gpt-1.3b on h100x1 in b.json; a plan's digest covers its "
                                 "model and cluster, so one of the two summaries was edited");
    snprintf(b->model, sizeof b->model, "gpt-350m");
    snprintf(b->cluster, sizeof b->cluster, "h200x1");
    ps_error_clear(&err);
    assert_int_equal(ps_compare_create(both, files, 2, -1, &c, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "gpt-350m on h100x1 in a.json and gpt-350m on h200x1 in "
                                    "b.json"));
    ps_summary_free(a);
    ps_summary_free(b);
}

static void test_refuse_layouts(void **state)
{
    (void)state;
    static const char *const names[] = {"planner.json", "sim.json", "other-layout.json"};
    ps_summary *runs[3] = {0};
    ps_compare *c = NULL;
    ps_error err = {0};
    assert_int_equal(join(names, 3, -1, runs, &c, &err), PS_ERR_INVALID);
    assert_null(c);
    assert_string_equal(
        err.msg, "cannot compare " DATA "/planner.json and " DATA "/other-layout.json: "
                 "their stage layouts differ: stage 1 has 2 devices from device 2, "
                 "submesh 1x2, logical mesh 1x2 in " DATA "/planner.json but 2 devices "
                 "from device 2, submesh 1x2, logical mesh 2x1 in " DATA "/other-layout.json");
    free_runs(runs, 3);

    /* a different number of stages under the same digest */
    ps_summary *a = NULL, *b = NULL;
    assert_int_equal(ps_summary_create(2, 2, &a), PS_OK);
    assert_int_equal(ps_summary_create(2, 1, &b), PS_OK);
    snprintf(a->plan, sizeof a->plan, "0123456789abcdef");
    snprintf(b->plan, sizeof b->plan, "0123456789abcdef");
    const ps_summary *both[2] = {a, b};
    const char *files[2] = {"a.json", "b.json"};
    ps_error_clear(&err);
    assert_int_equal(ps_compare_create(both, files, 2, -1, &c, &err), PS_ERR_INVALID);
    assert_string_equal(err.msg, "cannot compare a.json and b.json: their stage layouts differ "
                                 "(2 stages in a.json, 1 in b.json)");
    /* and fewer than two runs */
    ps_error_clear(&err);
    assert_int_equal(ps_compare_create(both, files, 1, -1, &c, &err), PS_ERR_INVALID);
    assert_string_equal(err.msg, "compare needs at least 2 run summaries, 1 given");
    ps_summary_free(a);
    ps_summary_free(b);
}

static void test_json_and_csv(void **state)
{
    (void)state;
    static const char *const names[] = {"planner.json", "sim.json", "exec.json"};
    ps_summary *runs[3] = {0};
    ps_compare *c = NULL;
    ps_error err = {0};
    json_t *j = NULL;
    assert_int_equal(join(names, 3, -1, runs, &c, &err), PS_OK);
    assert_int_equal(ps_compare_to_json(c, &j), PS_OK);
    assert_string_equal(json_string_value(json_object_get(j, "format")), "pipeshard-compare");
    assert_int_equal(json_integer_value(json_object_get(j, "version")), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "reference")), 2);
    json_t *run0 = json_array_get(json_object_get(j, "runs"), 0);
    assert_true(json_real_value(json_object_get(json_object_get(run0, "mape"), "time_s")) ==
                0.1875);
    json_t *w = json_object_get(json_object_get(run0, "worst"), "peak_memory_bytes");
    assert_true(json_real_value(json_object_get(w, "error")) == -0.25);
    assert_int_equal(json_integer_value(json_object_get(w, "stage")), 0);
    /* a measurement's steps come along; a prediction has none */
    assert_null(json_object_get(run0, "timed_steps"));
    json_t *run2 = json_array_get(json_object_get(j, "runs"), 2);
    assert_int_equal(json_integer_value(json_object_get(run2, "timed_steps")), 5);
    assert_true(json_real_value(json_object_get(run2, "iteration_min_s")) == 1.875);
    assert_true(json_real_value(json_object_get(run2, "iteration_max_s")) == 2.25);
    json_t *s1 = json_array_get(json_object_get(j, "stages"), 1);
    json_t *s1r0 = json_array_get(json_object_get(s1, "runs"), 0);
    assert_true(json_is_null(json_object_get(s1r0, "update_error")));
    assert_true(json_real_value(json_object_get(s1r0, "time_error")) == -0.125);
    assert_true(json_real_value(json_object_get(s1r0, "time_s")) == 0.21875);
    /* the planner's stage 1: compute 2 against 1.5, communication 0.25 equal */
    assert_true(json_real_value(json_object_get(s1r0, "compute_s")) == 2);
    assert_near(json_real_value(json_object_get(s1r0, "compute_error")), 1.0 / 3, 1e-15);
    assert_true(json_real_value(json_object_get(s1r0, "comm_error")) == 0);
    assert_true(json_real_value(json_object_get(s1r0, "idle_s")) == 0.25);
    assert_true(json_real_value(json_object_get(json_object_get(run0, "mape"), "compute_s")) ==
                0.5);
    json_decref(j);

    char path[600];
    snprintf(path, sizeof path, "%s/compare.csv", tmp_dir);
    assert_int_equal(ps_compare_save_csv(c, path, &err), PS_OK);
    char *text = slurp(path, NULL);
    assert_non_null(text);
    int lines = 0;
    for (char *p = text; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 1 + 2 * 3); /* header, (stage, run) rows */
    assert_non_null(strstr(text, "stage,devices,first_device,submesh,logical_mesh,run,file,"
                                 "source,reference,time_s,time_error,forward_s,forward_error,"
                                 "backward_s,backward_error,update_s,update_error,"
                                 "peak_memory_bytes,peak_memory_error,compute_s,compute_error,"
                                 "comm_s,comm_error,idle_s\n"));
    /* the planner's stage 1: update error undefined (empty field) */
    assert_non_null(strstr(text, "1,2,2,1x2,1x2,A," DATA "/planner.json,planner,0,0.21875,"
                                 "-0.125,0.0625,0,0.15625,"));
    assert_non_null(strstr(text, ",0.125,,4000000000,0,"));
    free(text);
    unlink(path);
    ps_error_clear(&err);
    assert_int_equal(ps_compare_save_csv(c, "/nonexistent-dir/x.csv", &err), PS_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/x.csv: cannot write"));
    ps_compare_free(c);
    free_runs(runs, 3);
}

static void test_trace_read(void **state)
{
    (void)state;
    ps_trace_data *t = NULL;
    ps_error err = {0};
    assert_int_equal(ps_trace_load(DATA "/trace.json", &t, &err), PS_OK);
    assert_int_equal(t->n_spans, 8); /* the instant event is skipped */
    assert_int_equal(t->n_devices, 2);
    assert_string_equal(t->devices[1].name, "device 1 (stage 1)");
    assert_string_equal(t->source, "sim");
    assert_string_equal(t->model, "tiny");
    /* times from the first span (100 us) */
    assert_near(t->spans[0].start_s, 0, 1e-15);
    assert_near(t->spans[0].duration_s, 400e-6, 1e-15);
    assert_int_equal(t->spans[1].category, PS_TRACE_SEND);
    assert_near(t->end_s, 1.2e-3, 1e-15);
    ps_trace_data_free(t);

    /* a span without its duration: positioned */
    char path[600];
    snprintf(path, sizeof path, "%s/bad-trace.json", tmp_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"traceEvents\":[\n{\"ph\":\"X\",\"tid\":0,\"ts\":1,\"dur\":2,\"cat\":\"compute\"},\n"
          "{\"ph\":\"X\",\"tid\":1,\"ts\":1,\"cat\":\"compute\"}\n]}\n",
          f);
    fclose(f);
    ps_error_clear(&err);
    assert_int_equal(ps_trace_load(path, &t, &err), PS_ERR_INVALID);
    assert_null(t);
    assert_non_null(strstr(err.msg, "bad-trace.json:3:1: traceEvents[1]: missing key \"dur\""));
    unlink(path);
}

/* ---- the command ---------------------------------------------------------- */

typedef struct run_result {
    bool exited;
    int status;
    char *out, *err;
    size_t out_len, err_len;
} run_result;

static void run_result_free(run_result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* Runs the pipeshard binary with args (NULL-terminated) and, when env_extra
 * is not NULL, that "NAME=value" added to (or replacing in) the environment. */
static void run_bin(const char *const *args, const char *env_extra, run_result *r)
{
    char out_path[600], err_path[600];
    char *argv[32];
    char **envp = NULL;
    int argc = 0, n_env = 0;
    memset(r, 0, sizeof *r);
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", tmp_dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", tmp_dir);
    argv[argc++] = (char *)PS_PIPESHARD_BIN;
    for (int i = 0; args[i] != NULL && argc < 31; i++)
        argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    while (environ[n_env] != NULL)
        n_env++;
    envp = calloc((size_t)n_env + 2, sizeof *envp);
    assert_non_null(envp);
    int k = 0;
    size_t name_len = env_extra != NULL ? strcspn(env_extra, "=") + 1 : 0;
    for (int i = 0; i < n_env; i++)
        if (env_extra == NULL || strncmp(environ[i], env_extra, name_len) != 0)
            envp[k++] = environ[i];
    if (env_extra != NULL)
        envp[k++] = (char *)env_extra;
    envp[k] = NULL;

    posix_spawn_file_actions_t fa;
    assert_int_equal(posix_spawn_file_actions_init(&fa), 0);
    assert_int_equal(posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0), 0);
    assert_int_equal(
        posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600), 0);
    assert_int_equal(
        posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600), 0);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, PS_PIPESHARD_BIN, &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    if (rc != 0)
        fail_msg("cannot run %s: %s", PS_PIPESHARD_BIN, strerror(rc));
    int wstatus = 0;
    double waited_s = 0;
    for (;;) { /* a hang is a failure, not a stall */
        pid_t got = waitpid(pid, &wstatus, WNOHANG);
        if (got == pid)
            break;
        if (waited_s > CHILD_TIMEOUT_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &wstatus, 0);
            fail_msg("%s still running after %.0f s; killed", args[0], CHILD_TIMEOUT_S);
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        waited_s += 2e-3;
    }
    r->exited = WIFEXITED(wstatus);
    r->status = r->exited ? WEXITSTATUS(wstatus) : -1;
    r->out = slurp(out_path, &r->out_len);
    r->err = slurp(err_path, &r->err_len);
    unlink(out_path);
    unlink(err_path);
    assert_non_null(r->out);
    assert_non_null(r->err);
}

static void expect(const run_result *r, int status, const char *on_stdout, const char *on_stderr)
{
    bool ok = r->exited && r->status == status && strstr(r->err, "Sanitizer") == NULL &&
              strstr(r->err, "runtime error:") == NULL &&
              (on_stdout == NULL || strstr(r->out, on_stdout) != NULL) &&
              (on_stderr == NULL || strstr(r->err, on_stderr) != NULL);
    if (!ok) {
        print_error("expected exit %d%s%s%s%s\n", status, on_stdout ? ", stdout with " : "",
                    on_stdout ? on_stdout : "", on_stderr ? ", stderr with " : "",
                    on_stderr ? on_stderr : "");
        print_error("  exit %d (exited %d)\n  stdout: %.1500s\n  stderr: %.1500s\n", r->status,
                    r->exited, r->out, r->err);
        fail();
    }
}

static void test_cli_compare(void **state)
{
    (void)state;
    run_result r;
    const char *a[] = {"compare", DATA "/planner.json", DATA "/sim.json", DATA "/exec.json", NULL};
    run_bin(a, NULL, &r);
    expect(&r, 0, "time per micro-batch (forward + backward), ms", NULL);
    assert_int_equal(r.err_len, 0);
    assert_non_null(strstr(r.out, "C  exec-cuda  " DATA "/exec.json   (* reference)"));
    /* stage 0 of the planner: 625 ms, +25% */
    assert_non_null(strstr(r.out, "    0                        625    +25.0%"));
    assert_non_null(strstr(r.out, "time/mb MAPE                         18.8%"));
    assert_non_null(strstr(r.out, "+25.0% (stage 0)      +25.0% (stage 1)"));
    assert_non_null(strstr(r.out, "n/a"));
    /* the measurement's spread over its 5 steps; the predictions have none */
    assert_non_null(strstr(r.out, "iteration range ms                       -                     -"
                                  "         1875-2250 (5)\n"));
    run_result_free(&r);

    /* the reference named another way than among the files */
    const char *j[] = {"compare", DATA "/planner.json", DATA "/exec.json",
                       "--json",  "--reference",        DATA "/../compare/planner.json",
                       NULL};
    run_bin(j, NULL, &r);
    expect(&r, 0, NULL, NULL);
    json_error_t jerr;
    json_t *doc = json_loads(r.out, 0, &jerr);
    assert_non_null(doc);
    assert_int_equal(json_integer_value(json_object_get(doc, "reference")), 0);
    json_t *run1 = json_array_get(json_object_get(doc, "runs"), 1);
    assert_true(json_real_value(json_object_get(run1, "iteration_error")) == -0.2);
    json_decref(doc);
    run_result_free(&r);

    /* ... and by its bare file name, which only one of the files has */
    const char *bare[] = {"compare", DATA "/planner.json", DATA "/exec.json",
                          "--json",  "--reference",        "planner.json",
                          NULL};
    run_bin(bare, NULL, &r);
    expect(&r, 0, NULL, NULL);
    doc = json_loads(r.out, 0, &jerr);
    assert_non_null(doc);
    assert_int_equal(json_integer_value(json_object_get(doc, "reference")), 0);
    json_decref(doc);
    run_result_free(&r);

    const char *csv[] = {"compare", DATA "/sim.json", DATA "/exec.json", "--csv", "-", NULL};
    run_bin(csv, NULL, &r);
    expect(&r, 0, "stage,devices,first_device,", NULL);
    int lines = 0;
    for (const char *p = r.out; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 5);
    run_result_free(&r);

    const char *h[] = {"compare", "--help", NULL};
    run_bin(h, NULL, &r);
    expect(&r, 0, "usage: pipeshard compare", NULL);
    run_result_free(&r);
    const char *ph[] = {"plot", "-h", NULL};
    run_bin(ph, NULL, &r);
    expect(&r, 0, "usage: pipeshard plot", NULL);
    run_result_free(&r);
}

static void test_cli_errors(void **state)
{
    (void)state;
    run_result r;
    char bad[600];
    snprintf(bad, sizeof bad, "%s/bad-summary.json", tmp_dir);
    FILE *f = fopen(bad, "w");
    assert_non_null(f);
    fputs("{\n \"format\": \"pipeshard-summary\",\n \"version\": 2\n}\n", f);
    fclose(f);
    static const struct {
        const char *args[10];
        int status;
        const char *message;
    } cases[] = {
        {{"compare", NULL}, 2, "needs at least 2 run summaries to compare, none given"},
        {{"compare", DATA "/sim.json", NULL},
         2,
         "needs at least 2 run summaries to compare, 1 given"},
        {{"compare", DATA "/sim.json", DATA "/nope.json", NULL},
         1,
         "pipeshard: " DATA "/nope.json: cannot open"},
        {{"compare", DATA "/planner.json", DATA "/other-plan.json", NULL},
         1,
         "they are runs of different plans"},
        {{"compare", DATA "/planner.json", DATA "/other-layout.json", NULL},
         1,
         "their stage layouts differ: stage 1"},
        {{"compare", DATA "/planner.json", DATA "/sim.json", "--reference", "x.json", NULL},
         2,
         "--reference \"x.json\" is not one of the files compared"},
        {{"compare", DATA "/planner.json", DATA "/sim.json", "--json", "--csv", "-", NULL},
         2,
         "both want stdout"},
        {{"compare", DATA "/planner.json", DATA "/sim.json", "--bogus", NULL},
         2,
         "unknown or incomplete option \"--bogus\""},
        {{"compare", DATA "/sim.json", DATA "/../compare/sim.json", NULL},
         2,
         "\"" DATA "/sim.json\" and \"" DATA "/../compare/sim.json\" are the same file"},
        {{"compare", DATA "/planner.json", DATA "/sim.json", "--scripts", DATA, NULL},
         2,
         "--scripts applies to --plot DIR"},
        {{"plot", "-o", "x", NULL}, 2, "nothing to draw"},
        {{"plot", "--timeline", DATA "/trace.json", NULL}, 2, "-o DIR is required"},
        {{"plot", "--timeline", DATA "/trace.json", "--from", "5", "--to", "2", "-o", "x", NULL},
         2,
         "--to 2 must come after --from 5"},
        {{"plot", "--timeline", DATA "/nope.json", "-o", "x", NULL}, 1, "nope.json: cannot open"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_bin(cases[i].args, NULL, &r);
        expect(&r, cases[i].status, NULL, cases[i].message);
        assert_int_equal(r.out_len, 0);
        run_result_free(&r);
    }
    /* a malformed summary: the loader's positioned message */
    const char *m[] = {"compare", DATA "/sim.json", bad, NULL};
    run_bin(m, NULL, &r);
    char where[700];
    snprintf(where, sizeof where, "pipeshard: %s:3:13: version: unsupported version 2", bad);
    expect(&r, 1, NULL, where);
    run_result_free(&r);
    unlink(bad);

    /* no gnuplot: a clear message before any output, with or without a path */
    const char *p[] = {"compare", DATA "/sim.json", DATA "/exec.json", "--plot", tmp_dir, NULL};
    run_bin(p, "PIPESHARD_GNUPLOT=/nonexistent/gnuplot", &r);
    expect(&r, 1, NULL, "gnuplot: /nonexistent/gnuplot is not an executable program");
    assert_int_equal(r.out_len, 0);
    run_result_free(&r);
    run_bin(p, "PATH=/nonexistent", &r);
    expect(&r, 1, NULL, "charts need gnuplot, and \"gnuplot\" is not on PATH");
    assert_int_equal(r.out_len, 0);
    run_result_free(&r);
    const char *t[] = {"plot", "--timeline", DATA "/trace.json", "-o", tmp_dir, NULL};
    run_bin(t, "PATH=/nonexistent", &r);
    expect(&r, 1, NULL, "is not on PATH");
    run_result_free(&r);
}

/* ---- the charts (test_compare --plots) ---------------------------------------- */

/* Checks a PNG: the signature, an IHDR chunk with sane dimensions, a size
 * that means something was drawn. */
static void check_png(const char *path)
{
    size_t len = 0;
    unsigned char *b = (unsigned char *)slurp(path, &len);
    if (b == NULL)
        fail_msg("%s: not written", path);
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    bool ok = len > 24 && memcmp(b, sig, 8) == 0 && memcmp(b + 12, "IHDR", 4) == 0;
    unsigned w = 0, h = 0;
    if (ok) {
        w = (unsigned)b[16] << 24 | (unsigned)b[17] << 16 | (unsigned)b[18] << 8 | b[19];
        h = (unsigned)b[20] << 24 | (unsigned)b[21] << 16 | (unsigned)b[22] << 8 | b[23];
    }
    free(b);
    if (!ok)
        fail_msg("%s: not a PNG file", path);
    if (w < 600 || w > 3000 || h < 300 || h > 3000)
        fail_msg("%s: %u x %u pixels", path, w, h);
    if (len < 5000) /* axes, labels and data take far more than an empty canvas */
        fail_msg("%s: only %zu bytes", path, len);
}

static void check_svg(const char *path)
{
    size_t len = 0;
    char *s = slurp(path, &len);
    if (s == NULL)
        fail_msg("%s: not written", path);
    bool ok = strstr(s, "<svg") != NULL && strstr(s, "</svg>") != NULL && len > 2000;
    free(s);
    if (!ok)
        fail_msg("%s: not a complete SVG file", path);
}

static void check_chart(const char *dir, const char *name)
{
    char path[800];
    snprintf(path, sizeof path, "%s/%s.png", dir, name);
    check_png(path);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s.svg", dir, name);
    check_svg(path);
    unlink(path);
    snprintf(path, sizeof path, "%s/%s.dat", dir, name);
    assert_int_equal(access(path, R_OK), 0);
    unlink(path);
}

static void test_plot_compare(void **state)
{
    (void)state;
    run_result r;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/charts/compare", tmp_dir); /* parents are created */
    const char *a[] = {
        "compare", DATA "/planner.json", DATA "/sim.json", DATA "/exec.json", "--plot", dir, NULL};
    run_bin(a, "DISPLAY=", &r);
    expect(&r, 0, "charts", NULL);
    assert_int_equal(r.err_len, 0); /* gnuplot said nothing: no warnings */
    run_result_free(&r);
    /* each data file ends with the command that redraws its chart by hand:
     * run by the shell, it draws the same SVG */
    for (int chart = 0; chart < 2; chart++) {
        const char *name = chart == 0 ? "scatter" : "breakdown";
        char dat[800], svg[800], cmd[4096];
        size_t dlen = 0, slen = 0, again_len = 0;
        snprintf(dat, sizeof dat, "%s/%s.dat", dir, name);
        snprintf(svg, sizeof svg, "%s/%s.svg", dir, name);
        char *data = slurp(dat, &dlen), *drawn = slurp(svg, &slen);
        assert_non_null(data);
        assert_non_null(drawn);
        char *line = strstr(data, "\n# redraw: ");
        if (line == NULL)
            fail_msg("%s has no redraw line:\n%s", dat, data);
        line += strlen("\n# redraw: ");
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        assert_true(eol[1] == '\0'); /* the last line */
        *eol = '\0';
        unlink(svg);
        snprintf(cmd, sizeof cmd, "DISPLAY= %s", line);
        assert_int_equal(system(cmd), 0);
        char *again = slurp(svg, &again_len);
        assert_non_null(again);
        if (again_len != slen || memcmp(again, drawn, slen) != 0)
            fail_msg("%s redrawn by \"%s\" differs from pipeshard's", svg, line);
        free(data);
        free(drawn);
        free(again);
    }
    check_chart(dir, "scatter");
    check_chart(dir, "breakdown");
    /* runs 1000x apart: the breakdown's bars in shares of their totals (the
     * script's other branch), without a warning from gnuplot */
    const char *b[] = {"compare", DATA "/planner.json", DATA "/exec-slow.json", "--plot", dir,
                       NULL};
    run_bin(b, "DISPLAY=", &r);
    expect(&r, 0, "charts", NULL);
    assert_int_equal(r.err_len, 0);
    run_result_free(&r);
    check_chart(dir, "scatter");
    check_chart(dir, "breakdown");
    /* a file name with enhanced-text markup (_ ^) stays literal in the legend:
     * escaped, doubly in the data file (gnuplot unescapes it once there) */
    char odd[700];
    snprintf(odd, sizeof odd, "%s/sim_1^2.json", tmp_dir);
    size_t len = 0;
    char *text = slurp(DATA "/sim.json", &len);
    assert_non_null(text);
    FILE *f = fopen(odd, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
    free(text);
    const char *c[] = {"compare", DATA "/planner.json", odd, DATA "/exec.json", "--plot", dir,
                       NULL};
    run_bin(c, "DISPLAY=", &r);
    expect(&r, 0, "charts", NULL);
    assert_int_equal(r.err_len, 0);
    run_result_free(&r);
    char dat[800];
    snprintf(dat, sizeof dat, "%s/scatter.dat", dir);
    text = slurp(dat, &len);
    assert_non_null(text);
    if (strstr(text, "\"B sim (sim\\\\_1\\\\^2.json)\"") == NULL)
        fail_msg("the label is not escaped:\n%s", text);
    free(text);
    unlink(odd);
    check_chart(dir, "scatter");
    check_chart(dir, "breakdown");
    rmdir(dir);
    snprintf(dir, sizeof dir, "%s/charts", tmp_dir);
    rmdir(dir);
}

static void test_plot_timeline_scaling(void **state)
{
    (void)state;
    run_result r;
    const char *a[] = {
        "plot",  "--timeline", DATA "/trace.json", "--scaling", DATA "/scaling.csv", "-o",
        tmp_dir, NULL};
    run_bin(a, "DISPLAY=", &r);
    expect(&r, 0, "timeline", NULL);
    assert_non_null(strstr(r.out, "(2 devices, 8 spans)"));
    assert_int_equal(r.err_len, 0);
    run_result_free(&r);
    check_chart(tmp_dir, "timeline");
    check_chart(tmp_dir, "scaling");

    /* a window of the timeline, and one that holds nothing */
    const char *w[] = {
        "plot",  "--timeline", DATA "/trace.json", "--from", "0.2", "--to", "0.7", "-o",
        tmp_dir, NULL};
    run_bin(w, NULL, &r);
    expect(&r, 0, NULL, NULL);
    run_result_free(&r);
    check_chart(tmp_dir, "timeline");
    const char *e[] = {"plot",  "--timeline", DATA "/trace.json", "--from", "5", "-o",
                       tmp_dir, NULL};
    run_bin(e, NULL, &r);
    expect(&r, 1, NULL, "the window from 5 ms to the end holds nothing");
    run_result_free(&r);
    /* the window asked for, not the trace's end in its place */
    const char *e2[] = {"plot", "--timeline", DATA "/trace.json", "--from", "100", "--to",
                        "200", "-o", tmp_dir, NULL};
    run_bin(e2, NULL, &r);
    expect(&r, 1, NULL, "the window from 100 ms to 200 ms holds nothing: the trace's spans end "
                        "at 1.2 ms");
    run_result_free(&r);
}

/* Bad inputs and a broken script: clear messages, no crash. */
static void test_plot_errors(void **state)
{
    (void)state;
    run_result r;
    char csv[600], scripts[600], gp[700];
    snprintf(csv, sizeof csv, "%s/bad.csv", tmp_dir);
    FILE *f = fopen(csv, "w");
    assert_non_null(f);
    fputs("series,devices,throughput (PFLOP/s)\nauto,8,1.5\nauto,eight,3\n", f);
    fclose(f);
    const char *a[] = {"plot", "--scaling", csv, "-o", tmp_dir, NULL};
    run_bin(a, NULL, &r);
    expect(&r, 1, NULL, "bad.csv:3: devices: \"eight\" is not a count >= 1");
    run_result_free(&r);
    /* a header without the columns it needs, each named; two points of one
     * series at one device count; a row short of the header */
    static const char *const more[][2] = {
        {"name,gpus,tflops\nauto,8,1.5\n",
         "bad.csv:1: the header must name the columns series, devices and throughput (e.g. "
         "\"throughput (PFLOP/s)\"); it has no series, devices, throughput\n"},
        {"series,devices,tflops\nauto,8,1.5\n",
         "bad.csv:1: the header must name the columns series, devices and throughput (e.g. "
         "\"throughput (PFLOP/s)\"); it has no throughput\n"},
        {"series,devices,throughput\nA,1,1\nB,1,1\nA,1,2\n",
         "bad.csv:4: series \"A\" has 1 devices already (line 2)"},
        {"series,devices,throughput,model\nA,1,1,m\nA,2,1\n",
         "bad.csv:3: 3 fields, the header has 4"},
        /* a column named twice: neither is picked silently */
        {"series,devices,throughput (PFLOP/s),throughput (TFLOP/s)\nA,1,1,1000\n",
         "bad.csv:1: columns 3 (\"throughput (PFLOP/s)\") and 4 (\"throughput (TFLOP/s)\") "
         "are both a throughput column"},
        {"series,devices,series,throughput\nA,1,B,1\n",
         "bad.csv:1: columns 1 (\"series\") and 3 (\"series\") are both a series column"},
    };
    for (size_t i = 0; i < sizeof more / sizeof *more; i++) {
        f = fopen(csv, "w");
        assert_non_null(f);
        fputs(more[i][0], f);
        fclose(f);
        run_bin(a, NULL, &r);
        expect(&r, 1, NULL, more[i][1]);
        run_result_free(&r);
    }
    unlink(csv);

    /* a script that gnuplot rejects: its message comes through */
    snprintf(scripts, sizeof scripts, "%s/scripts", tmp_dir);
    assert_int_equal(mkdir(scripts, 0700), 0);
    snprintf(gp, sizeof gp, "%s/timeline.gp", scripts);
    f = fopen(gp, "w");
    assert_non_null(f);
    fputs("set terminal pngcairo\nset output out.'.png'\nplot data using 1:2 wiht lines\n", f);
    fclose(f);
    const char *b[] = {"plot",  "--timeline", DATA "/trace.json", "-o", tmp_dir, "--scripts",
                       scripts, NULL};
    run_bin(b, NULL, &r);
    expect(&r, 1, NULL, "gnuplot failed on");
    assert_non_null(strstr(r.err, "timeline.gp"));
    run_result_free(&r);
    unlink(gp);
    /* and a folder without the script */
    run_bin(b, NULL, &r);
    expect(&r, 1, NULL, "timeline.gp: cannot read the chart's script");
    run_result_free(&r);
    rmdir(scripts);
    char leftover[700];
    snprintf(leftover, sizeof leftover, "%s/timeline.dat", tmp_dir);
    unlink(leftover);
    snprintf(leftover, sizeof leftover, "%s/timeline.png", tmp_dir);
    unlink(leftover);
}

/* ---- fixture ------------------------------------------------------------------ */

static int group_setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/ps-test-compare-XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(tmp_dir) == NULL) {
        fprintf(stderr, "mkdtemp %s: %s\n", tmp_dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* Removes what a failed test left behind, then the folder. */
static int group_teardown(void **state)
{
    (void)state;
    DIR *d = opendir(tmp_dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char path[600];
            snprintf(path, sizeof path, "%s/%s", tmp_dir, e->d_name);
            if (unlink(path) != 0)
                rmdir(path);
        }
        closedir(d);
    }
    return rmdir(tmp_dir) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--plots") == 0) {
        char gnuplot[1024];
        ps_error err = {0};
        if (ps_plot_find_gnuplot(NULL, gnuplot, sizeof gnuplot, &err) != PS_OK) {
            printf("test_compare --plots: skipped: %s\n", err.msg);
            return 77;
        }
        const struct CMUnitTest plots[] = {
            cmocka_unit_test(test_plot_compare),
            cmocka_unit_test(test_plot_timeline_scaling),
            cmocka_unit_test(test_plot_errors),
        };
        return cmocka_run_group_tests(plots, group_setup, group_teardown);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rel_error),      cmocka_unit_test(test_run_ids),
        cmocka_unit_test(test_join),
        cmocka_unit_test(test_reference),      cmocka_unit_test(test_refuse_plans),
        cmocka_unit_test(test_refuse_layouts), cmocka_unit_test(test_json_and_csv),
        cmocka_unit_test(test_trace_read),     cmocka_unit_test(test_cli_compare),
        cmocka_unit_test(test_cli_errors),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
