/* The benchmark regression check (bench/bench_check.c) in its compare mode,
 * on CSV files: no workload runs and no absolute timing matters, so the test
 * takes well under a second.
 *
 * - the stored baseline (bench/baselines/bench_check.csv) against itself passes;
 * - the stored baseline with every timing ratio doubled (an injected 2x
 *   slowdown) fails, naming each metric, its baseline, fresh value and tolerance;
 * - hand-made files: a plan 2% worse fails at the 1% quality tolerance, a
 *   1.4x slower timing passes at 1.5x, an improvement passes with a note, a
 *   metric missing from the fresh run fails, a malformed file is an input error.
 *
 * Skipped (77) where bench_check is not built (without SimGrid). */
/* cmocka needs these before it, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef PS_BENCH_CHECK_BIN

static char tmp_dir[256];

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strdup(buf);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

typedef struct check_run {
    int rc;
    char *out, *err;
} check_run;

/* bench_check --compare BASE FRESH [extra]; captures both streams. */
static check_run run_compare(const char *base, const char *fresh, const char *extra)
{
    char cmd[2048], out_path[300], err_path[300];
    snprintf(out_path, sizeof out_path, "%s/out.txt", tmp_dir);
    snprintf(err_path, sizeof err_path, "%s/err.txt", tmp_dir);
    snprintf(cmd, sizeof cmd, "'%s' --compare '%s' '%s' %s >'%s' 2>'%s'", PS_BENCH_CHECK_BIN, base,
             fresh, extra ? extra : "", out_path, err_path);
    int status = system(cmd);
    assert_true(WIFEXITED(status));
    check_run r = {.rc = WEXITSTATUS(status), .out = slurp(out_path), .err = slurp(err_path)};
    return r;
}

static void check_run_free(check_run *r)
{
    free(r->out);
    free(r->err);
}

static void expect_in(const char *text, const char *needle)
{
    if (strstr(text, needle) == NULL) {
        print_error("expected \"%s\" in:\n%s\n", needle, text);
        fail();
    }
}

/* Copies the baseline CSV to `out`, multiplying the value of every ratio row by
 * `factor`. Returns the number of rows changed. */
static int doctor(const char *in, const char *out, double factor)
{
    FILE *f = fopen(in, "r"), *g = fopen(out, "w");
    assert_non_null(f);
    assert_non_null(g);
    char line[1024];
    int changed = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        char metric[256], unit[64];
        double v;
        if (strstr(line, ",ratio,") != NULL &&
            sscanf(line, "%255[^,],ratio,%lf,%63[^\n]", metric, &v, unit) == 3) {
            fprintf(g, "%s,ratio,%.9g,%s\n", metric, v * factor, unit);
            changed++;
        } else {
            fputs(line, g);
        }
    }
    fclose(f);
    assert_int_equal(fclose(g), 0);
    return changed;
}

static void test_stored_baseline_passes_against_itself(void **state)
{
    (void)state;
    check_run r = run_compare(PS_BENCH_BASELINE, PS_BENCH_BASELINE, NULL);
    assert_int_equal(r.rc, 0);
    expect_in(r.out, "bench-check: passed");
    expect_in(r.out, "plan.gpt-1.3b@4.plan_time");
    check_run_free(&r);
}

static void test_injected_2x_slowdown_fails(void **state)
{
    (void)state;
    char fresh[300];
    snprintf(fresh, sizeof fresh, "%s/slow.csv", tmp_dir);
    int n = doctor(PS_BENCH_BASELINE, fresh, 2.0);
    assert_true(n >= 4);
    check_run r = run_compare(PS_BENCH_BASELINE, fresh, NULL);
    assert_int_equal(r.rc, 1);
    char want[64];
    snprintf(want, sizeof want, "FAILED, %d regressions", n);
    expect_in(r.out, want);
    expect_in(r.err, "regression in sim.gpt-175b@128.sim_time: baseline ");
    expect_in(r.err, "2.00x; tolerance 1.50x");
    check_run_free(&r);
    /* the same file passes when the stated tolerance allows 2x */
    r = run_compare(PS_BENCH_BASELINE, fresh, "--time-tol 2.5");
    assert_int_equal(r.rc, 0);
    check_run_free(&r);
}

static const char *const base_csv = "# machine: nproc 2; cpu test; uname test\n"
                                    "metric,kind,value,unit\n"
                                    "plan.a.iteration_s,quality,10,s\n"
                                    "plan.a.plan_time,ratio,4,calib\n"
                                    "plan.a.plan_s,info,1,s\n";

static check_run compare_with(const char *fresh_text, const char *extra)
{
    char base[300], fresh[300];
    snprintf(base, sizeof base, "%s/base.csv", tmp_dir);
    snprintf(fresh, sizeof fresh, "%s/fresh.csv", tmp_dir);
    write_file(base, base_csv);
    write_file(fresh, fresh_text);
    return run_compare(base, fresh, extra);
}

static void test_hand_made_cases(void **state)
{
    (void)state;
    /* unchanged; the info row may move freely */
    check_run r = compare_with("metric,kind,value,unit\n"
                               "plan.a.iteration_s,quality,10,s\n"
                               "plan.a.plan_time,ratio,4,calib\n"
                               "plan.a.plan_s,info,9,s\n",
                               NULL);
    assert_int_equal(r.rc, 0);
    expect_in(r.out, "passed, 2 metrics");
    check_run_free(&r);
    /* plan 2% worse: over the 1% quality tolerance */
    r = compare_with("metric,kind,value,unit\n"
                     "plan.a.iteration_s,quality,10.2,s\n"
                     "plan.a.plan_time,ratio,4,calib\n",
                     NULL);
    assert_int_equal(r.rc, 1);
    expect_in(r.err, "regression in plan.a.iteration_s: baseline 10 s, fresh 10.2 s (+2.00%; "
                     "tolerance +1.00%)");
    check_run_free(&r);
    /* ... within a 5% tolerance */
    r = compare_with("metric,kind,value,unit\n"
                     "plan.a.iteration_s,quality,10.2,s\n"
                     "plan.a.plan_time,ratio,4,calib\n",
                     "--quality-tol 0.05");
    assert_int_equal(r.rc, 0);
    check_run_free(&r);
    /* timing 1.4x slower: within 1.5x; better plan: passes with a note */
    r = compare_with("metric,kind,value,unit\n"
                     "plan.a.iteration_s,quality,9,s\n"
                     "plan.a.plan_time,ratio,5.6,calib\n",
                     NULL);
    assert_int_equal(r.rc, 0);
    expect_in(r.out, "refresh the baseline");
    check_run_free(&r);
    /* a metric missing from the fresh run */
    r = compare_with("metric,kind,value,unit\n"
                     "plan.a.iteration_s,quality,10,s\n",
                     NULL);
    assert_int_equal(r.rc, 1);
    expect_in(r.out, "plan.a.plan_time");
    expect_in(r.out, "missing from the fresh run");
    check_run_free(&r);
    /* malformed */
    r = compare_with("metric,kind,value,unit\nplan.a.iteration_s,quality,ten,s\n", NULL);
    assert_int_equal(r.rc, 2);
    expect_in(r.err, "fresh.csv:2: expected metric,quality|ratio|info,NUMBER,unit");
    check_run_free(&r);
    r = compare_with("name,value\n", NULL);
    assert_int_equal(r.rc, 2);
    expect_in(r.err, "expected the header");
    check_run_free(&r);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ps_test_bench_check.XXXXXX");
    if (mkdtemp(tmp_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stored_baseline_passes_against_itself),
        cmocka_unit_test(test_injected_2x_slowdown_fails),
        cmocka_unit_test(test_hand_made_cases),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_bench_check: could not remove %s\n", tmp_dir);
    return rc;
}

#else

int main(void)
{
    printf("test_bench_check: skipped, bench_check is not built (it needs SimGrid)\n");
    return 77;
}

#endif
