/* The pipeshard command as users and scripts see it: the built binary is run
 * as a child process (posix_spawn, stdout and stderr captured in files) and
 * its exit status, stdout and stderr are checked. Covers every malformed file
 * of tests/data/bad/graph.manifest (and cluster.manifest), usage errors,
 * --help of every subcommand, the stable keys of `graph --json`, the graph
 * export round trip, the model and cluster lists, and the demo. Under
 * PS_SANITIZE the binary is the sanitized one, so leaks and undefined
 * behaviour on error paths fail here. */
/* cmocka needs these before it, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/json.h"
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

extern char **environ;

#define BAD_DIR PS_TEST_DATA_DIR "/bad"
#define MAX_ARGS 48
/* A child that runs longer is killed (a hang is a failure, not a stall). */
#define CHILD_TIMEOUT_S 120.0

/* Group state: one temporary directory for captured output and exports. */
typedef struct fixture {
    char dir[256];
} fixture;

/* What one run of the binary did. */
typedef struct run_result {
    bool exited;     /* terminated normally (not by a signal) */
    int status;      /* exit status when exited */
    int signal;      /* the signal when !exited */
    char *out, *err; /* captured stdout and stderr, NUL-terminated */
    size_t out_len, err_len;
    char cmdline[1024]; /* for messages */
} run_result;

/* ---- helpers --------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, len = 0;
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
    if (buf != NULL && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf != NULL) {
        buf[len] = '\0';
        if (len_out != NULL)
            *len_out = len;
    }
    return buf;
}

/* Whether buf[0..len) contains needle (buf may hold NUL bytes). */
static bool contains(const char *buf, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    if (n == 0)
        return true;
    for (size_t i = 0; i + n <= len; i++)
        if (buf[i] == needle[0] && memcmp(buf + i, needle, n) == 0)
            return true;
    return false;
}

static void run_result_free(run_result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* Runs PS_PIPESHARD_BIN with args (NULL-terminated, without argv[0]); stdin is
 * /dev/null, stdout and stderr go to files in dir. Returns false (with a
 * message printed) when the child could not be run or waited for. */
static bool run_bin(const char *dir, const char *const *args, run_result *r)
{
    char out_path[512], err_path[512];
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    bool ok = false;
    posix_spawn_file_actions_t fa;
    memset(r, 0, sizeof *r);
    snprintf(out_path, sizeof out_path, "%s/stdout.txt", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);

    argv[argc++] = (char *)PS_PIPESHARD_BIN;
    size_t used = (size_t)snprintf(r->cmdline, sizeof r->cmdline, "pipeshard");
    for (int i = 0; args[i] != NULL; i++) {
        if (argc > MAX_ARGS) {
            print_error("too many arguments\n");
            return false;
        }
        argv[argc++] = (char *)args[i];
        if (used < sizeof r->cmdline)
            used += (size_t)snprintf(r->cmdline + used, sizeof r->cmdline - used, " %s", args[i]);
    }
    argv[argc] = NULL;

    if (posix_spawn_file_actions_init(&fa) != 0) {
        print_error("posix_spawn_file_actions_init failed\n");
        return false;
    }
    int rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (rc == 0)
        rc = posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (rc == 0)
        rc = posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid = -1;
    if (rc == 0)
        rc = posix_spawn(&pid, PS_PIPESHARD_BIN, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        print_error("%s: cannot run %s: %s\n", r->cmdline, PS_PIPESHARD_BIN, strerror(rc));
        return false;
    }

    /* Wait, polling so that a hanging child is killed rather than waited on. */
    int wstatus = 0;
    double waited_s = 0;
    for (;;) {
        pid_t got = waitpid(pid, &wstatus, WNOHANG);
        if (got == pid)
            break;
        if (got < 0 && errno != EINTR) {
            print_error("%s: waitpid: %s\n", r->cmdline, strerror(errno));
            goto out;
        }
        if (waited_s > CHILD_TIMEOUT_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &wstatus, 0);
            print_error("%s: still running after %.0f s; killed\n", r->cmdline, CHILD_TIMEOUT_S);
            goto out;
        }
        struct timespec ts = {0, 1000000}; /* 1 ms */
        nanosleep(&ts, NULL);
        waited_s += 1e-3;
    }
    r->exited = WIFEXITED(wstatus);
    r->status = r->exited ? WEXITSTATUS(wstatus) : -1;
    r->signal = WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
    r->out = read_file(out_path, &r->out_len);
    r->err = read_file(err_path, &r->err_len);
    if (r->out == NULL || r->err == NULL) {
        print_error("%s: cannot read the captured output\n", r->cmdline);
        goto out;
    }
    ok = true;
out:
    unlink(out_path);
    unlink(err_path);
    if (!ok)
        run_result_free(r);
    return ok;
}

/* Runs and fails the test at once if the child could not be run. */
static void run_ok(const fixture *fx, const char *const *args, run_result *r)
{
    if (!run_bin(fx->dir, args, r))
        fail_msg("could not run the pipeshard binary");
}

/* Prints the child's output when a check fails. */
static void dump(const run_result *r)
{
    print_error("  command: %s\n", r->cmdline);
    if (r->exited)
        print_error("  exit status: %d\n", r->status);
    else
        print_error("  killed by signal %d\n", r->signal);
    print_error("  stdout (%zu bytes): %.600s\n", r->out_len, r->out ? r->out : "");
    print_error("  stderr (%zu bytes): %.2000s\n", r->err_len, r->err ? r->err : "");
}

/* Sanitizer reports on stderr (the binary under test may be instrumented). */
static bool sanitizer_report(const run_result *r)
{
    return contains(r->err, r->err_len, "Sanitizer") ||
           contains(r->err, r->err_len, "runtime error:");
}

/* Checks the exit status and the absence of sanitizer reports; prints and
 * returns false on a mismatch. */
static bool check_exit(const run_result *r, int want)
{
    if (r->exited && r->status == want && !sanitizer_report(r))
        return true;
    if (sanitizer_report(r))
        print_error("sanitizer report (expected exit status %d)\n", want);
    else
        print_error("expected exit status %d\n", want);
    dump(r);
    return false;
}

static void expect_exit(const run_result *r, int want)
{
    if (!check_exit(r, want))
        fail();
}

static void expect_in(const run_result *r, bool on_stdout, const char *needle)
{
    const char *buf = on_stdout ? r->out : r->err;
    size_t len = on_stdout ? r->out_len : r->err_len;
    if (!contains(buf, len, needle)) {
        print_error("expected \"%s\" on %s\n", needle, on_stdout ? "stdout" : "stderr");
        dump(r);
        fail();
    }
}

static void expect_empty(const run_result *r, bool on_stdout)
{
    if ((on_stdout ? r->out_len : r->err_len) != 0) {
        print_error("expected nothing on %s\n", on_stdout ? "stdout" : "stderr");
        dump(r);
        fail();
    }
}

static json_t *parse_stdout(const run_result *r)
{
    json_error_t jerr;
    json_t *j = json_loadb(r->out, r->out_len, 0, &jerr);
    if (j == NULL) {
        print_error("stdout is not JSON: %d:%d: %s\n", jerr.line, jerr.column, jerr.text);
        dump(r);
        fail();
    }
    return j;
}

/* ---- malformed files ----------------------------------------------------- */

/* Files whose error is found after loading (building the training step), so
 * that the message names the file but no position. */
static const char *const no_position[] = {"graph-unused-param.json", NULL};

static bool wants_position(const char *name)
{
    for (int i = 0; no_position[i] != NULL; i++)
        if (strcmp(no_position[i], name) == 0)
            return false;
    return true;
}

/* Checks one malformed file; prints every problem, returns false if any. */
static bool check_bad_file(const fixture *fx, const char *command, const char *option,
                           const char *name, const char *expected)
{
    char path[1024], prefix[1100];
    run_result r;
    snprintf(path, sizeof path, "%s/%s", BAD_DIR, name);
    if (access(path, R_OK) != 0) {
        print_error("%s: listed in the manifest but cannot be read\n", path);
        return false;
    }
    const char *args[] = {command, option, path, NULL};
    if (!run_bin(fx->dir, args, &r))
        return false;
    bool ok = check_exit(&r, 1);
    if (ok && r.out_len != 0) {
        print_error("%s: expected nothing on stdout\n", name);
        dump(&r);
        ok = false;
    }
    snprintf(prefix, sizeof prefix, "pipeshard: %s", path);
    size_t n = strlen(prefix);
    if (ok && (r.err_len < n || memcmp(r.err, prefix, n) != 0)) {
        print_error("%s: stderr does not start with \"%s\"\n", name, prefix);
        dump(&r);
        ok = false;
    }
    if (ok) {
        const char *p = r.err + n;
        bool positioned = false;
        if (p[0] == ':') { /* ":LINE:COL: " */
            char *end;
            long line = strtol(p + 1, &end, 10);
            if (end != p + 1 && line >= 1 && *end == ':') {
                const char *col_start = end + 1;
                long col = strtol(col_start, &end, 10);
                positioned = end != col_start && col >= 1 && end[0] == ':' && end[1] == ' ';
            }
        }
        if (wants_position(name) && !positioned) {
            print_error("%s: expected \"%s:LINE:COL: \" at the start of stderr\n", name, path);
            dump(&r);
            ok = false;
        } else if (!wants_position(name) && !positioned && strncmp(p, ": ", 2) != 0) {
            print_error("%s: expected \"%s: \" at the start of stderr\n", name, path);
            dump(&r);
            ok = false;
        }
    }
    if (ok && !contains(r.err, r.err_len, expected)) {
        print_error("%s: expected \"%s\" in the message\n", name, expected);
        dump(&r);
        ok = false;
    }
    run_result_free(&r);
    return ok;
}

/* Runs every line of a manifest; returns the number of entries, or -1 when
 * the manifest does not exist. Fails the test after reporting all problems. */
static int check_manifest(const fixture *fx, const char *manifest, const char *command,
                          const char *option)
{
    char path[512], line[2048];
    snprintf(path, sizeof path, "%s/%s", BAD_DIR, manifest);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    int entries = 0, failures = 0, line_no = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        line_no++;
        size_t len = strlen(line);
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0 || line[0] == '#')
            continue;
        char *tab = strchr(line, '\t');
        if (tab == NULL || tab == line || tab[1] == '\0') {
            print_error("%s:%d: expected FILENAME<TAB>EXPECTED_SUBSTRING\n", path, line_no);
            failures++;
            continue;
        }
        *tab = '\0';
        entries++;
        if (!check_bad_file(fx, command, option, line, tab + 1))
            failures++;
    }
    fclose(f);
    if (failures > 0)
        fail_msg("%s: %d of %d entries failed (see above)", manifest, failures, entries);
    return entries;
}

/* Counts (and prints) the PREFIX*.json files of the bad directory that the
 * manifest does not list (a file nobody checks is worse than none). */
static int count_unlisted(const char *manifest, const char *prefix)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", BAD_DIR, manifest);
    size_t len = 0;
    char *text = read_file(path, &len);
    if (text == NULL)
        return 0;
    DIR *d = opendir(BAD_DIR);
    assert_non_null(d);
    int missing = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || n < 5 ||
            strcmp(e->d_name + n - 5, ".json") != 0)
            continue;
        char entry[512];
        snprintf(entry, sizeof entry, "\n%s\t", e->d_name);
        bool listed =
            contains(text, len, entry) || (strncmp(text, entry + 1, strlen(entry + 1)) == 0);
        if (!listed) {
            print_error("%s/%s is not listed in %s\n", BAD_DIR, e->d_name, manifest);
            missing++;
        }
    }
    closedir(d);
    free(text);
    return missing;
}

static void test_graph_manifest(void **state)
{
    const fixture *fx = *state;
    int unlisted = count_unlisted("graph.manifest", "graph-");
    int n = check_manifest(fx, "graph.manifest", "graph", "--graph");
    if (n < 0)
        fail_msg("%s/graph.manifest is missing", BAD_DIR);
    assert_true(n >= 16);
    if (unlisted > 0)
        fail_msg("%d graph-*.json file(s) missing from graph.manifest", unlisted);
}

static void test_cluster_manifest(void **state)
{
    const fixture *fx = *state;
    int unlisted = count_unlisted("cluster.manifest", "cluster-");
    int n = check_manifest(fx, "cluster.manifest", "clusters", "--cluster-file");
    if (n < 0)
        skip(); /* no cluster files yet */
    assert_true(n >= 1);
    if (unlisted > 0)
        fail_msg("%d cluster-*.json file(s) missing from cluster.manifest", unlisted);
}

/* A stage file of one stage: layers 0-1 (of 2) on a submesh (1, 8), logical mesh (2, 4). */
static void write_one_stage_file(const char *path)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"format\": \"pipeshard-stages\", \"version\": 1, \"layer_num\": 2, \"stages\": "
          "[{\"layers\": [0, 1], \"submesh\": [1, 8], \"logical_mesh\": [2, 4]}]}\n",
          f);
    fclose(f);
}

/* ---- usage errors and help ------------------------------------------------- */

/* A run that exits 0 and prints needle on stdout. */
static void expect_success(const fixture *fx, const char *const *args, const char *needle)
{
    run_result r;
    run_ok(fx, args, &r);
    expect_exit(&r, 0);
    expect_in(&r, true, needle);
    run_result_free(&r);
}

/* A run that fails (exit 1) saying needle on stderr. */
static void expect_failure(const fixture *fx, const char *const *args, const char *needle)
{
    run_result r;
    run_ok(fx, args, &r);
    expect_exit(&r, 1);
    expect_in(&r, false, needle);
    run_result_free(&r);
}

static void expect_usage_error(const fixture *fx, const char *const *args, const char *needle)
{
    run_result r;
    run_ok(fx, args, &r);
    expect_exit(&r, 2);
    expect_empty(&r, true);
    if (strncmp(r.err, "pipeshard: ", 11) != 0) {
        print_error("expected stderr to start with \"pipeshard: \"\n");
        dump(&r);
        fail();
    }
    expect_in(&r, false, needle);
    run_result_free(&r);
}

static void test_usage_errors(void **state)
{
    const fixture *fx = *state;
    {
        const char *a[] = {"frobnicate", NULL};
        expect_usage_error(fx, a, "unknown command \"frobnicate\"");
    }
    {
        const char *a[] = {NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 2);
        expect_in(&r, false, "usage:");
        run_result_free(&r);
    }
    {
        const char *a[] = {"graph", NULL};
        expect_usage_error(fx, a, "--model");
    }
    {
        const char *a[] = {"graph", "--model", "mlp", "--batch", "abc", NULL};
        expect_usage_error(fx, a, "--batch");
        expect_usage_error(fx, a, "abc");
    }
    {
        const char *a[] = {"graph", "--model", "mlp", "--batch", "0", NULL};
        expect_usage_error(fx, a, "--batch");
    }
    {
        const char *a[] = {"graph", "--model", "mlp", "--batch", "-3", NULL};
        expect_usage_error(fx, a, "--batch");
    }
    {
        const char *a[] = {"graph", "--graph", "X", "--hidden", "8", NULL};
        expect_usage_error(fx, a, "--model only");
    }
    {
        const char *a[] = {"graph", "--model", "mlp", "--no-such-option", NULL};
        expect_usage_error(fx, a, "--no-such-option");
    }
    {
        const char *a[] = {"graph", "--model", "mlp", "--graph", "X", NULL};
        expect_usage_error(fx, a, "exactly one of --model and --graph");
    }
    {
        const char *a[] = {"graph", "--model", "mlp", "stray", NULL};
        expect_usage_error(fx, a, "stray");
    }
    {
        const char *a[] = {"models", "--no-such-option", NULL};
        expect_usage_error(fx, a, "--no-such-option");
    }
    /* options that would change nothing are refused, not ignored */
    {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--method",
                           "data", "--dp", "2", "-o", "x.json", NULL};
        expect_usage_error(fx, a, "--dp, --op and --pp apply to --method uniform");
    }
    {
        const char *a[] = {"exec", "--plan", "x.json", "--share-gpu", NULL};
        expect_usage_error(fx, a, "--share-gpu applies to --backend cuda");
    }
    {
        const char *a[] = {"exec", "--plan", "x.json", "--trace-ops", NULL};
        expect_usage_error(fx, a, "--trace-ops needs --trace T.json");
    }
    {
        const char *a[] = {"exec", "--plan", "x.json", "--tolerance", "0.1", NULL};
        expect_usage_error(fx, a, "--tolerance applies to --check");
    }
    {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--method",
                           "data", "--micro-batches", "auto", "-o", "x.json", NULL};
        expect_usage_error(fx, a, "--micro-batches auto goes with --method pipeshard");
    }
    {
        /* the method is pipeshard: the stage file is what fixes the stages */
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--stages",
                           "s.json", "--micro-batches", "auto", "-o", "x.json", NULL};
        expect_usage_error(fx, a, "--micro-batches auto needs the stage DP (--stages auto): "
                                  "with --stages FILE");
    }
    {
        /* --mesh once changed nothing outside the one-stage methods, even 3x5
         * on 8 devices */
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--mesh", "3x5",
                           "-o", "x.json", NULL};
        expect_usage_error(fx, a, "--mesh applies to --method shard, data, zero2 and zero3");
        const char *u[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--method",
                           "uniform", "--dp", "2", "--op", "2", "--pp", "2", "--mesh", "1x4",
                           "-o", "x.json", NULL};
        expect_usage_error(fx, u, "a uniform plan's mesh is --dp x --op");
    }
    {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:0", "-o", "x.json",
                           NULL};
        expect_usage_error(fx, a, "--cluster: cluster \"dgx-a100:0\": node count must be >= 1");
    }
    /* --remat=auto: the stage DP's choice, nowhere else */
    {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--method",
                           "data", "--remat=auto", "-o", "x.json", NULL};
        expect_usage_error(fx, a, "--remat=auto has the stage DP choose");
        const char *u[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--method",
                           "uniform", "--dp", "2", "--op", "2", "--pp", "2", "--remat=auto",
                           "-o", "x.json", NULL};
        expect_usage_error(fx, u, "--remat=auto has the stage DP choose");
        const char *g[] = {"graph", "--model", "mlp", "--remat=auto", NULL};
        expect_usage_error(fx, g, "--remat=auto lets 'pipeshard plan' choose");
        const char *b[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--remat=some",
                           "-o", "x.json", NULL};
        expect_usage_error(fx, b, "--remat takes =all (the default) or =auto, not \"some\"");
        const char *both[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--remat",
                              "--remat=auto", "-o", "x.json", NULL};
        expect_usage_error(fx, both, "exclude each other");
        const char *spaced[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--remat",
                                "auto", "-o", "x.json", NULL};
        expect_usage_error(fx, spaced, "write --remat=auto");
    }
}

/* The plan's summary says what it recomputes; --remat=auto with room to
 * spare recomputes nothing and says nothing of it. */
static void test_plan_names_recomputed_layers(void **state)
{
    const fixture *fx = *state;
    char plan[512];
    snprintf(plan, sizeof plan, "%s/remat-plan.json", fx->dir);
    const char *a[] = {"plan", "--model", "gpt-350m", "--hidden", "256", "--layers", "4",
                       "--heads", "4", "--seq", "128", "--vocab", "2048", "--cluster",
                       "dgx-a100:1", "--global-batch", "32", "--micro-batches", "4",
                       "--layer-num", "4", "--remat", "-o", plan, NULL};
    expect_success(fx, a, "recompute     every layer but the loss's");
    a[21] = "--remat=auto";
    run_result r;
    run_ok(fx, a, &r);
    expect_exit(&r, 0);
    expect_in(&r, true, "predicted     iteration");
    assert_false(contains(r.out, r.out_len, "recompute"));
    run_result_free(&r);
}

/* A missing graph file is a failure (1) that names the file, not a usage error. */
static void test_missing_graph_file(void **state)
{
    const fixture *fx = *state;
    char path[512];
    snprintf(path, sizeof path, "%s/no-such-graph.json", fx->dir);
    const char *a[] = {"graph", "--graph", path, NULL};
    run_result r;
    run_ok(fx, a, &r);
    expect_exit(&r, 1);
    expect_empty(&r, true);
    expect_in(&r, false, path);
    expect_in(&r, false, "cannot open");
    run_result_free(&r);
    /* a directory opens but does not read: the reason is said */
    const char *readers[][5] = {{"graph", "--graph", fx->dir, NULL},
                                {"exec", "--plan", fx->dir, NULL},
                                {"plot", "--scaling", fx->dir, "-o", fx->dir}};
    for (int k = 0; k < 3; k++) {
        const char *args[6] = {readers[k][0], readers[k][1], readers[k][2], readers[k][3],
                               readers[k][4], NULL};
        run_ok(fx, args, &r);
        expect_exit(&r, 1);
        expect_in(&r, false, ": cannot read: Is a directory");
        run_result_free(&r);
    }
}

static void test_help(void **state)
{
    const fixture *fx = *state;
    static const char *const cmds[][3] = {{"--help", NULL, NULL},     {"-h", NULL, NULL},
                                          {"graph", "--help", NULL},  {"graph", "-h", NULL},
                                          {"models", "--help", NULL}, {"clusters", "--help", NULL},
                                          {"demo", "--help", NULL}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        run_result r;
        run_ok(fx, cmds[i], &r);
        expect_exit(&r, 0);
        expect_in(&r, true, "usage:");
        expect_empty(&r, false);
        run_result_free(&r);
    }
}

/* ---- models, graph --json, export ---------------------------------------- */

/* The names listed by `models --json` (an array of objects with "name"). */
static json_t *model_list(const fixture *fx)
{
    const char *a[] = {"models", "--json", NULL};
    run_result r;
    run_ok(fx, a, &r);
    expect_exit(&r, 0);
    json_t *j = parse_stdout(&r);
    run_result_free(&r);
    assert_true(json_is_array(j));
    return j;
}

static void test_models(void **state)
{
    const fixture *fx = *state;
    json_t *list = model_list(fx);
    assert_int_equal(json_array_size(list), 26);

    const char *a[] = {"models", NULL};
    run_result r;
    run_ok(fx, a, &r);
    expect_exit(&r, 0);
    size_t i;
    json_t *m;
    json_array_foreach(list, i, m)
    {
        const char *name = json_string_value(json_object_get(m, "name"));
        assert_non_null(name);
        char at_line_start[128];
        snprintf(at_line_start, sizeof at_line_start, "\n%s ", name);
        expect_in(&r, true, at_line_start);
    }
    /* the names the design promises are among them */
    static const char *const promised[] = {"mlp",      "gpt-2.6b",   "gpt-175b",
                                           "moe-1.3b", "wresnet-1b", NULL};
    for (int k = 0; promised[k] != NULL; k++) {
        bool found = false;
        json_array_foreach(list, i, m)
        {
            const char *name = json_string_value(json_object_get(m, "name"));
            found = found || (name != NULL && strcmp(name, promised[k]) == 0);
        }
        if (!found)
            fail_msg("models --json does not list \"%s\"", promised[k]);
    }
    run_result_free(&r);
    json_decref(list);
}

static void test_unknown_model(void **state)
{
    const fixture *fx = *state;
    const char *a[] = {"graph", "--model", "gpt-9000t", NULL};
    run_result r;
    run_ok(fx, a, &r);
    expect_exit(&r, 2); /* a name typed on the command line: a usage error */
    expect_empty(&r, true);
    expect_in(&r, false, "pipeshard: ");
    expect_in(&r, false, "gpt-9000t");
    json_t *list = model_list(fx);
    size_t i;
    json_t *m;
    json_array_foreach(list, i, m) /* every known model is listed */
        expect_in(&r, false, json_string_value(json_object_get(m, "name")));
    json_decref(list);
    run_result_free(&r);
    const char *p[] = {"plan", "--model", "gpt-9000t", "--cluster", "p3.16xlarge:1", "-o",
                       "x.json", NULL};
    expect_usage_error(fx, p, "unknown model \"gpt-9000t\"");
}

/* Command lines that say two contradicting or empty things: usage errors
 * (exit status 2), each naming what is wrong. */
static void test_contradicting_options(void **state)
{
    const fixture *fx = *state;
    const char *e[] = {"exec", "--plan", "p.json", "--check", "--check-fp32", NULL};
    expect_usage_error(fx, e, "give one of --check and --check-fp32");
    const char *g[] = {"graph", "--model", "gpt-350m", "--remat-layers", "", NULL};
    expect_usage_error(fx, g, "--remat-layers: expected a list like 1-16,20, not an empty one");
    const char *g2[] = {"graph", "--model", "gpt-350m", "--remat-layers", "1,", NULL};
    expect_usage_error(fx, g2, "not \"1,\"");
    const char *t[] = {"plan", "--model", "mlp", "--cluster", "p3.16xlarge:1", "--time-limit",
                       "1e9", "-o", "x.json", NULL};
    expect_usage_error(fx, t, "--time-limit wants seconds from 0.01 to 1e6, not \"1e9\"");
    const char *both_remat[] = {"graph", "--model", "mlp", "--remat", "--remat-layers", "1",
                                NULL};
    expect_usage_error(fx, both_remat, "--remat recomputes every layer");
    const char *export_json[] = {"graph", "--model", "mlp", "--export", "-", "--json", NULL};
    expect_usage_error(fx, export_json, "--json and --export - both want stdout");
    const char *window[] = {"plot", "--scaling", "s.csv", "--from", "5", "-o", "d", NULL};
    expect_usage_error(fx, window, "they go with --timeline");
    /* a stage file's layer count against --layer-num */
    char stages[512];
    snprintf(stages, sizeof stages, "%s/two-layers.json", fx->dir);
    write_one_stage_file(stages);
    const char *layers[] = {"plan", "--model", "mlp", "--cluster", "p3.16xlarge", "--global-batch",
                            "64", "--micro-batches", "2", "--stages", stages, "--layer-num", "3",
                            "-o", "x.json", NULL};
    expect_usage_error(fx, layers, "--layer-num 3, but the stage file");
    unlink(stages);
    /* a size past the limit is named as such, not as "not positive" */
    const char *huge[] = {"graph", "--model", "gpt-350m", "--hidden", "1073741824", "--heads",
                          "1", "--batch", "1", NULL};
    expect_failure(fx, huge, "ffn must be 1 to 2147483648, not 4294967296");
}

static double number_at(const json_t *j, const char *key)
{
    json_t *v = json_object_get(j, key);
    if (!json_is_number(v))
        fail_msg("graph --json: \"%s\" is missing or not a number", key);
    return json_number_value(v);
}

static void test_graph_json_gpt175b(void **state)
{
    const fixture *fx = *state;
    const char *a[] = {"graph", "--model", "gpt-175b", "--json", NULL};
    run_result r;
    run_ok(fx, a, &r);
    expect_exit(&r, 0);
    json_t *j = parse_stdout(&r);
    run_result_free(&r);
    assert_true(json_is_object(j));
    static const char *const keys[] = {"params",
                                       "flops_per_step",
                                       "flops_per_step_remat",
                                       "weight_bytes",
                                       "optimizer_bytes",
                                       "activation_bytes_per_microbatch",
                                       NULL};
    for (int i = 0; keys[i] != NULL; i++)
        assert_true(number_at(j, keys[i]) > 0);
    assert_true(json_is_integer(json_object_get(j, "params")));
    double params = number_at(j, "params");
    if (!(params > 174.5e9 && params < 174.7e9))
        fail_msg("gpt-175b: %.0f parameters, expected 174.5e9 to 174.7e9", params);
    /* remat replays forward ops: more FLOPs, never fewer */
    assert_true(number_at(j, "flops_per_step_remat") >= number_at(j, "flops_per_step"));
    json_decref(j);
}

static bool same_bytes(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *x = read_file(a, &na), *y = read_file(b, &nb);
    bool same = x != NULL && y != NULL && na == nb && memcmp(x, y, na) == 0;
    if (x == NULL || y == NULL)
        print_error("cannot read %s or %s\n", a, b);
    free(x);
    free(y);
    return same;
}

/* --iteration-limit takes whole numbers in range; a plan under it is the
 * same file twice (the limit stops each solve at the same point). */
static void test_iteration_limit(void **state)
{
    const fixture *fx = *state;
    const char *bad[] = {"0", "1.5", "2e9", "many", NULL};
    for (int i = 0; bad[i] != NULL; i++) {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "p3.16xlarge:1",
                           "--iteration-limit", bad[i], "-o", "x.json", NULL};
        char want[128];
        snprintf(want, sizeof want,
                 "--iteration-limit wants a whole number of iterations from 1 to 1e9, not "
                 "\"%s\"",
                 bad[i]);
        expect_usage_error(fx, a, want);
    }
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/limited-1.json", fx->dir);
    snprintf(p2, sizeof p2, "%s/limited-2.json", fx->dir);
    const char *a[] = {"plan", "--model", "gpt-350m", "--hidden", "256", "--layers", "4",
                       "--heads", "4", "--seq", "128", "--vocab", "2048", "--cluster",
                       "p3.16xlarge:1", "--global-batch", "32", "--micro-batches", "4",
                       "--layer-num", "4", "--iteration-limit", "40", "-o", p1, NULL};
    expect_success(fx, a, "predicted     iteration");
    a[24] = p2;
    expect_success(fx, a, "predicted     iteration");
    assert_true(same_bytes(p1, p2));
}

/* --show-candidates: one line per candidate pipeline solved, exactly one
 * kept, and the kept one's iteration is the plan's; with --json the same
 * inside the JSON; refused for methods without candidates. --rows with
 * --json is refused (both would print on standard output). */
static void test_show_candidates(void **state)
{
    const fixture *fx = *state;
    char p[512];
    snprintf(p, sizeof p, "%s/candidates.json", fx->dir);
    const char *a[] = {"plan", "--model", "gpt-350m", "--layers", "8", "--cluster",
                       "p3.16xlarge:2", "--global-batch", "256", "--micro-batches", "16",
                       "--layer-num", "4", "--show-candidates", "-o", p, NULL};
    run_result r;
    run_ok(fx, a, &r);
    expect_exit(&r, 0);
    int lines = 0, kept = 0;
    double kept_s = -1;
    for (const char *line = r.out; *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        if (strncmp(line, "candidate     ", 14) == 0) {
            lines++;
            if (len > 6 && strncmp(line + len - 6, ", kept", 6) == 0) {
                kept++;
                const char *it = strstr(line, "; iteration ");
                assert_non_null(it);
                kept_s = strtod(it + strlen("; iteration "), NULL);
            }
        }
        line += len + (end != NULL);
    }
    if (lines < 2 || kept != 1)
        dump(&r);
    assert_true(lines >= 2);
    assert_int_equal(kept, 1);
    const char *pred = strstr(r.out, "predicted     iteration ");
    assert_non_null(pred);
    double plan_s = strtod(pred + strlen("predicted     iteration "), NULL);
    assert_true(fabs(kept_s - plan_s) <= 1e-3 * plan_s);
    run_result_free(&r);
    /* with --json, inside the JSON: the same candidates, one kept */
    const char *j[] = {"plan", "--model", "gpt-350m", "--layers", "8", "--cluster",
                       "p3.16xlarge:2", "--global-batch", "256", "--micro-batches", "16",
                       "--layer-num", "4", "--show-candidates", "--json", "-o", p, NULL};
    run_ok(fx, j, &r);
    expect_exit(&r, 0);
    json_t *predicted = parse_stdout(&r);
    run_result_free(&r);
    json_t *list = json_object_get(predicted, "candidates");
    assert_int_equal(json_array_size(list), lines);
    int kept_json = 0;
    for (size_t q = 0; q < json_array_size(list); q++) {
        const json_t *c = json_array_get(list, q);
        assert_true(json_array_size(json_object_get(c, "stages")) > 0);
        if (json_is_true(json_object_get(c, "kept"))) {
            kept_json++;
            assert_true(json_real_value(json_object_get(c, "iteration_s")) ==
                        json_real_value(json_object_get(predicted, "iteration_s")));
        }
    }
    assert_int_equal(kept_json, 1);
    json_decref(predicted);
    const char *data[] = {"plan", "--model", "mlp", "--cluster", "p3.16xlarge:1", "--method",
                          "data", "--show-candidates", "-o", p, NULL};
    expect_usage_error(fx, data, "--show-candidates apply to --method pipeshard");
    /* --rows is text on standard output, as --json's predictions are */
    const char *rows[] = {"plan", "--model", "mlp", "--cluster", "p3.16xlarge:1", "--rows",
                          "--json", "-o", p, NULL};
    expect_usage_error(fx, rows, "--rows prints the stage cost table as text");
}

/* --model M --export T1, then --graph T1 --export T2: the files are equal and
 * both runs report the same parameters and FLOPs. */
static void test_export_round_trip(void **state)
{
    const fixture *fx = *state;
    char t1[512], t2[512];
    snprintf(t1, sizeof t1, "%s/T1.json", fx->dir);
    snprintf(t2, sizeof t2, "%s/T2.json", fx->dir);
    run_result r1, r2;
    const char *a1[] = {"graph",    "--model", "gpt-350m", "--batch", "2",
                        "--export", t1,        "--json",   NULL};
    run_ok(fx, a1, &r1);
    expect_exit(&r1, 0);
    json_t *j1 = parse_stdout(&r1);
    run_result_free(&r1);
    const char *a2[] = {"graph", "--graph", t1, "--export", t2, "--json", NULL};
    run_ok(fx, a2, &r2);
    expect_exit(&r2, 0);
    json_t *j2 = parse_stdout(&r2);
    run_result_free(&r2);
    if (!same_bytes(t1, t2))
        fail_msg("%s and %s differ", t1, t2);
    assert_true(json_is_integer(json_object_get(j1, "params")));
    assert_int_equal(json_integer_value(json_object_get(j1, "params")),
                     json_integer_value(json_object_get(j2, "params")));
    double f1 = number_at(j1, "flops_per_step"), f2 = number_at(j2, "flops_per_step");
    if (!(f1 > 0 && fabs(f1 - f2) <= 1e-12 * f1))
        fail_msg("flops_per_step: %.17g from the model, %.17g from its export", f1, f2);
    double m1 = number_at(j1, "flops_per_step_remat"), m2 = number_at(j2, "flops_per_step_remat");
    if (!(fabs(m1 - m2) <= 1e-12 * m1))
        fail_msg("flops_per_step_remat: %.17g from the model, %.17g from its export", m1, m2);
    json_decref(j1);
    json_decref(j2);
    unlink(t1);
    unlink(t2);
}

/* --export - writes the graph to stdout and nothing else. */
static void test_export_stdout(void **state)
{
    const fixture *fx = *state;
    const char *a[] = {"graph", "--model", "mlp", "--batch", "2", "--export", "-", NULL};
    run_result r;
    run_ok(fx, a, &r);
    expect_exit(&r, 0);
    json_t *j = parse_stdout(&r);
    run_result_free(&r);
    assert_string_equal(json_string_value(json_object_get(j, "format")), "pipeshard-graph");
    json_decref(j);
}

/* Outputs are checked before any work: an output in a missing directory
 * fails at once (no plan is made, nothing measured), an output naming an
 * input or another output is a usage error, and "-" gives stdout to that
 * file alone (the report goes to stderr). A file of another of pipeshard's
 * formats given where one is read says what it is. */
static void test_outputs_checked_first(void **state)
{
    const fixture *fx = *state;
    char plan[512], summary[512], missing[512], csv[512];
    snprintf(plan, sizeof plan, "%s/out-plan.json", fx->dir);
    snprintf(summary, sizeof summary, "%s/out-summary.json", fx->dir);
    snprintf(missing, sizeof missing, "%s/no-such-dir/x.json", fx->dir);
    snprintf(csv, sizeof csv, "%s/out.csv", fx->dir);
    const char *mk[] = {"plan", "--model", "mlp", "--hidden", "64", "--cluster", "p3.16xlarge",
                        "--method", "shard", "--global-batch", "32", "--micro-batches", "2",
                        "-o", plan, NULL};
    expect_success(fx, mk, "plan");
    const char *sim[] = {"sim", "--plan", plan, "--summary", summary, NULL};
    expect_success(fx, sim, "simulated");
    /* a missing directory: refused before planning, measuring or running */
    const char *bad_plan[] = {"plan", "--model", "gpt-350m", "--cluster", "p3.16xlarge:4",
                              "--global-batch", "1024", "--micro-batches", "64", "-o", missing,
                              NULL};
    run_result r;
    run_ok(fx, bad_plan, &r);
    expect_exit(&r, 1);
    expect_empty(&r, true);
    expect_in(&r, false, "cannot write -o");
    expect_in(&r, false, "no-such-dir");
    run_result_free(&r);
    const char *bad_exec[] = {"exec", "--plan", plan, "--summary", missing, NULL};
    expect_failure(fx, bad_exec, "cannot write --summary");
    const char *bad_profile[] = {"profile", "--backend", "cpu", "--devices", "2", "--quick",
                                 "-o", summary, "--cluster-out", missing, NULL};
    expect_failure(fx, bad_profile, "cannot write --cluster-out");
    /* an output over an input, or over another output */
    const char *over_plan[] = {"sim", "--plan", plan, "--trace", plan, NULL};
    expect_usage_error(fx, over_plan, "would overwrite the input --plan");
    const char *over_summary[] = {"compare", summary, summary, "--csv", csv, NULL};
    expect_usage_error(fx, over_summary, "the same file");
    char copy[512];
    snprintf(copy, sizeof copy, "%s/out-summary2.json", fx->dir);
    const char *sim2[] = {"sim", "--plan", plan, "--summary", copy, NULL};
    expect_success(fx, sim2, "simulated");
    const char *over_csv[] = {"compare", summary, copy, "--csv", copy, NULL};
    expect_usage_error(fx, over_csv, "would overwrite the input summary");
    const char *twice[] = {"sim", "--plan", plan, "--summary", csv, "--predicted", csv, NULL};
    expect_usage_error(fx, twice, "both name");
    const char *both_stdout[] = {"sim", "--plan", plan, "--summary", "-", "--trace", "-", NULL};
    expect_usage_error(fx, both_stdout, "both want stdout");
    /* "-": stdout holds the file alone */
    const char *to_stdout[] = {"sim", "--plan", plan, "--summary", "-", NULL};
    run_ok(fx, to_stdout, &r);
    expect_exit(&r, 0);
    json_t *j = parse_stdout(&r);
    assert_string_equal(json_string_value(json_object_get(j, "format")), "pipeshard-summary");
    json_decref(j);
    expect_in(&r, false, "simulated");
    run_result_free(&r);
    const char *plan_stdout[] = {"plan", "--model", "mlp", "--hidden", "64", "--cluster",
                                 "p3.16xlarge", "--method", "shard", "--global-batch", "32",
                                 "--micro-batches", "2", "-o", "-", NULL};
    run_ok(fx, plan_stdout, &r);
    expect_exit(&r, 0);
    j = parse_stdout(&r);
    assert_string_equal(json_string_value(json_object_get(j, "format")), "pipeshard-plan");
    json_decref(j);
    expect_in(&r, false, "predicted");
    run_result_free(&r);
    /* a plan whose model disagrees with it: the message names the plan file */
    char edited[512];
    snprintf(edited, sizeof edited, "%s/out-edited.json", fx->dir);
    size_t len = 0;
    char *text = read_file(plan, &len);
    assert_non_null(text);
    char *at = strstr(text, "\"batch\": 16");
    assert_non_null(at);
    FILE *ef = fopen(edited, "w");
    assert_non_null(ef);
    fprintf(ef, "%.*s\"batch\": 8%s", (int)(at - text), text, at + strlen("\"batch\": 16"));
    fclose(ef);
    free(text);
    const char *sim_edited[] = {"sim", "--plan", edited, NULL};
    run_ok(fx, sim_edited, &r);
    expect_exit(&r, 1);
    char named[600];
    snprintf(named, sizeof named, "pipeshard: %s: ", edited);
    if (strncmp(r.err, named, strlen(named)) != 0) {
        print_error("expected stderr to start with \"%s\"\n", named);
        dump(&r);
        fail();
    }
    expect_in(&r, false, "the model is built for micro-batches of 8");
    run_result_free(&r);
    unlink(edited);
    /* the wrong kind of file */
    const char *summary_as_plan[] = {"sim", "--plan", summary, NULL};
    expect_failure(fx, summary_as_plan, "a \"pipeshard-summary\" file, not a plan");
    const char *plan_as_cluster[] = {"plan", "--model", "mlp", "--cluster-file", plan,
                                     "--method", "shard", "--global-batch", "32", "-o", csv,
                                     NULL};
    expect_failure(fx, plan_as_cluster, "a \"pipeshard-plan\" file, not a cluster file");
    const char *plan_as_db[] = {"plan", "--model", "mlp", "--cluster", "p3.16xlarge",
                                "--profile-db", plan, "--method", "shard", "--global-batch",
                                "32", "-o", csv, NULL};
    expect_failure(fx, plan_as_db, "a \"pipeshard-plan\" file, not a profile DB");
    /* a dump into a directory of an earlier one leaves none of its devices
     * behind (a plan on more devices), and no other file is touched */
    char dump_dir[512], stale[600], notes[600];
    snprintf(dump_dir, sizeof dump_dir, "%s/dump", fx->dir);
    snprintf(stale, sizeof stale, "%s/device-99.txt", dump_dir);
    snprintf(notes, sizeof notes, "%s/notes.txt", dump_dir);
    assert_int_equal(mkdir(dump_dir, 0777), 0);
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(k == 0 ? stale : notes, "w");
        assert_non_null(f);
        fputs("old\n", f);
        fclose(f);
    }
    const char *dump[] = {"sim", "--plan", plan, "--dump-programs", dump_dir, NULL};
    expect_success(fx, dump, "simulated");
    assert_int_not_equal(access(stale, F_OK), 0);
    assert_int_equal(access(notes, F_OK), 0);
    DIR *d = opendir(dump_dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.') {
            char path[900];
            snprintf(path, sizeof path, "%s/%s", dump_dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dump_dir);
    unlink(plan);
    unlink(summary);
    unlink(copy);
}

/* ---- clusters and demo ------------------------------------------------------ */

static void test_clusters(void **state)
{
    const fixture *fx = *state;
    {
        const char *a[] = {"clusters", NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 0);
        expect_in(&r, true, "p3.16xlarge");
        expect_in(&r, true, "dgx-a100");
        expect_in(&r, true, "dgx-h100");
        run_result_free(&r);
    }
    {
        const char *a[] = {"clusters", "--show", "dgx-a100:2", "--json", NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 0);
        json_t *j = parse_stdout(&r);
        run_result_free(&r);
        assert_true(json_is_object(j));
        assert_int_equal(json_integer_value(json_object_get(j, "nodes")), 2);
        assert_int_equal(json_integer_value(json_object_get(j, "devices_per_node")), 8);
        json_decref(j);
    }
    {
        const char *a[] = {"clusters", "--show", "dgx-z100:2", NULL};
        run_result r;
        run_ok(fx, a, &r);
        assert_true(r.exited && r.status != 0 && !sanitizer_report(&r));
        expect_empty(&r, true);
        expect_in(&r, false, "pipeshard: ");
        expect_in(&r, false, "dgx-z100");
        run_result_free(&r);
    }
}

static void test_demo(void **state)
{
    const fixture *fx = *state;
    const char *a[] = {"demo", NULL};
    run_result r;
    run_ok(fx, a, &r);
    expect_exit(&r, 0);
    expect_in(&r, true, "parameters");
#ifndef PS_NO_SIMGRID
    /* the charts, the measured step's timeline among them, unless gnuplot is missing */
    if (strstr(r.out, "(no charts") == NULL)
        expect_in(&r, true, "timeline      demo-plots/timeline.png, demo-plots/timeline.svg");
#endif
#ifdef PS_NO_SIMGRID
    expect_in(&r, true, "demo 3/9: skipped");
    expect_in(&r, true, "this build has no SimGrid");
#endif
    run_result_free(&r);
}

#ifdef PS_NO_SIMGRID
/* Built with -DPS_WITH_SIMGRID=OFF: `sim` says so and fails; its --help works. */
static void test_sim_without_simgrid(void **state)
{
    const fixture *fx = *state;
    {
        const char *a[] = {"sim", "--plan", "plan.json", NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 1);
        expect_empty(&r, true);
        expect_in(&r, false,
                  "pipeshard: sim: this build has no SimGrid (configure with -DPS_WITH_SIMGRID=ON)");
        run_result_free(&r);
    }
    {
        const char *a[] = {"sim", "--help", NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 0);
        expect_in(&r, true, "usage:");
        expect_in(&r, true, "this build has no SimGrid");
        run_result_free(&r);
    }
}
#endif

/* pipeshard predict: the planner's schedule of a plan of 4 stages over two
 * nodes, recomputed from the file: the same iteration as the plan's; a
 * timeline in which every device runs its micro-batches' kernels and its
 * spans and waits cover the step exactly; the summary sim --predicted
 * writes; and its errors. */
static void test_predict(void **state)
{
    const fixture *fx = *state;
    char plan[512], sum[512], trace[512], edited[512];
    snprintf(plan, sizeof plan, "%s/predict-plan.json", fx->dir);
    snprintf(sum, sizeof sum, "%s/predict-summary.json", fx->dir);
    snprintf(trace, sizeof trace, "%s/predict-trace.json", fx->dir);
    snprintf(edited, sizeof edited, "%s/predict-edited.json", fx->dir);
    const char *a[] = {"plan", "--model", "gpt-350m", "--hidden", "256", "--layers", "4",
                       "--heads", "4", "--seq", "128", "--vocab", "2048", "--cluster",
                       "p3.16xlarge:2", "--method", "uniform", "--dp", "1", "--op", "4", "--pp",
                       "4", "--global-batch", "48", "--micro-batches", "6", "-o", plan, NULL};
    expect_success(fx, a, "predicted     iteration");
    const char *b[] = {"predict", "--plan", plan, "--summary", sum, "--trace", trace, NULL};
    run_result r;
    run_ok(fx, b, &r);
    expect_exit(&r, 0);
    expect_in(&r, true, "planner's schedule of gpt-350m on p3.16xlarge:2");
    expect_in(&r, true, "receiving ms");
    assert_false(contains(r.out, r.out_len, "the plan says"));
    run_result_free(&r);
    json_t *jp = json_load_file(plan, 0, NULL), *jt = json_load_file(trace, 0, NULL);
    assert_non_null(jp);
    assert_non_null(jt);
    double it = json_number_value(json_object_get(json_object_get(jp, "predicted"), "iteration_s"));
    assert_true(it > 0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(jt, "otherData"), "source")),
        "planner");
    /* per device: covered end to end, 6 forwards and backwards, one update */
    double covered[16] = {0}, ends[16] = {0};
    int spans[16] = {0}, forwards[16] = {0}, backwards[16] = {0}, updates[16] = {0}, receives = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(jt, "traceEvents"), i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X") != 0)
            continue;
        int d = (int)json_integer_value(json_object_get(e, "tid"));
        assert_true(d >= 0 && d < 16);
        double ts = json_number_value(json_object_get(e, "ts")) * 1e-6;
        double dur = json_number_value(json_object_get(e, "dur")) * 1e-6;
        const char *name = json_string_value(json_object_get(e, "name"));
        covered[d] += dur;
        spans[d]++;
        ends[d] = fmax(ends[d], ts + dur);
        forwards[d] += strncmp(name, "forward mb", 10) == 0;
        backwards[d] += strncmp(name, "backward mb", 11) == 0;
        updates[d] += strcmp(name, "update") == 0;
        receives += strncmp(name, "recv activations from stage", 27) == 0;
    }
    for (int d = 0; d < 16; d++) {
        /* (times in the file are rounded to the nanosecond) */
        if (fabs(ends[d] - it) > 1e-9 || fabs(covered[d] - it) > 1e-9 * spans[d])
            fail_msg("device %d: its spans cover %.9g s and end at %.9g s of a %.9g s step", d,
                     covered[d], ends[d], it);
        assert_int_equal(forwards[d], 6);
        assert_int_equal(backwards[d], 6);
        assert_int_equal(updates[d], 1);
    }
    assert_int_equal(receives, 3 * 4 * 6); /* 3 later stages of 4 devices, 6 micro-batches */
    json_decref(jt);
    json_t *js = json_load_file(sum, 0, NULL);
    assert_non_null(js);
    assert_string_equal(json_string_value(json_object_get(js, "source")), "planner");
    assert_true(json_number_value(json_object_get(js, "iteration_s")) == it);
#ifndef PS_NO_SIMGRID
    {
        char pred[512];
        snprintf(pred, sizeof pred, "%s/predict-by-sim.json", fx->dir);
        const char *c[] = {"sim", "--plan", plan, "--predicted", pred, NULL};
        expect_success(fx, c, "simulated / predicted");
        json_t *jq = json_load_file(pred, 0, NULL);
        assert_non_null(jq);
        assert_true(json_equal(js, jq));
        json_decref(jq);
    }
#endif
    json_decref(js);
    {
        const char *c[] = {"predict", "--plan", plan, "--json", NULL};
        run_result q;
        run_ok(fx, c, &q);
        expect_exit(&q, 0);
        json_t *j = parse_stdout(&q);
        assert_string_equal(json_string_value(json_object_get(j, "source")), "planner");
        json_decref(j);
        run_result_free(&q);
    }
    /* a prediction the schedule does not give is named; none at all fails */
    json_t *pred = json_object_get(jp, "predicted");
    json_object_set_new(pred, "iteration_s", json_real(2 * it));
    assert_int_equal(json_dump_file(jp, edited, 0), 0);
    expect_success(fx, (const char *[]){"predict", "--plan", edited, NULL}, "the plan says");
    json_object_del(jp, "predicted");
    assert_int_equal(json_dump_file(jp, edited, 0), 0);
    expect_failure(fx, (const char *[]){"predict", "--plan", edited, NULL},
                   "the plan carries no prediction");
    json_decref(jp);
    expect_usage_error(fx, (const char *[]){"predict", NULL}, "--plan PLAN.json is required");
    expect_usage_error(fx, (const char *[]){"predict", "--plan", plan, "--trace", plan, NULL},
                       "would overwrite the input");
    expect_usage_error(fx, (const char *[]){"predict", "--plan", plan, "--steps", "2", NULL},
                       "unknown or incomplete option");
    expect_usage_error(fx,
                       (const char *[]){"predict", "--plan", plan, "--json", "--trace", "-", NULL},
                       "both want stdout");
    expect_failure(fx, (const char *[]){"predict", "--plan", "no-such-plan.json", NULL},
                   "no-such-plan.json");
}

#ifndef PS_NO_SIMGRID
/* sim --node-collectives: closed-form and transfers run; anything else is a usage
 * error. */
static void test_sim_node_collectives(void **state)
{
    const fixture *fx = *state;
    char out[512];
    snprintf(out, sizeof out, "%s/sim-plan.json", fx->dir);
    {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100", "--method",
                           "uniform", "--dp", "2", "--op", "2", "--pp", "2", "--global-batch",
                           "64", "--micro-batches", "4", "-o", out, NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 0);
        run_result_free(&r);
    }
    {
        const char *a[] = {"sim", "--plan", out, "--node-collectives", "closed-form", NULL};
        expect_success(fx, a, "simulated / predicted");
    }
    {
        const char *a[] = {"sim", "--plan", out, "--node-collectives", "transfers", NULL};
        expect_success(fx, a, "simulated / predicted");
    }
    {
        const char *a[] = {"sim", "--plan", out, "--node-collectives", "fast", NULL};
        expect_usage_error(fx, a, "--node-collectives takes flows, transfers or closed-form, "
                                  "not \"fast\"");
    }
}

/* sim --predicted: the planner's summary splits each device's time into
 * compute and communication by its phases' kernels. Compute is what the
 * simulator replays without contention, so the two agree to rounding; the
 * split by the plan's ops once counted the update's gradient all-reduce once
 * per micro-batch, and with data parallelism gave half to a sixth of the
 * compute. Each device's times add up to the iteration. */
static void test_sim_predicted_split(void **state)
{
    const fixture *fx = *state;
    char plan[512], sim[512], pred[512];
    snprintf(plan, sizeof plan, "%s/split-plan.json", fx->dir);
    snprintf(sim, sizeof sim, "%s/split-sim.json", fx->dir);
    snprintf(pred, sizeof pred, "%s/split-pred.json", fx->dir);
    static const char *const dp[] = {"1", "2", "4"}, *const op[] = {"8", "4", "2"};
    for (int k = 0; k < 3; k++) {
        const char *a[] = {"plan", "--model", "gpt-350m", "--hidden", "256", "--layers", "4",
                           "--heads", "4", "--seq", "128", "--vocab", "2048", "--cluster",
                           "dgx-a100:2", "--method", "uniform", "--dp", dp[k], "--op", op[k],
                           "--pp", "2", "--global-batch", "32", "--micro-batches", "4", "-o",
                           plan, NULL};
        expect_success(fx, a, "predicted     iteration");
        const char *b[] = {"sim", "--plan", plan, "--summary", sim, "--predicted", pred, NULL};
        expect_success(fx, b, "simulated / predicted");
        json_t *js = json_load_file(sim, 0, NULL), *jp = json_load_file(pred, 0, NULL);
        assert_non_null(js);
        assert_non_null(jp);
        double it = json_number_value(json_object_get(jp, "iteration_s"));
        json_t *ds = json_object_get(js, "devices"), *dq = json_object_get(jp, "devices");
        assert_int_equal(json_array_size(ds), 16);
        assert_int_equal(json_array_size(dq), 16);
        for (size_t d = 0; d < 16; d++) {
            json_t *x = json_array_get(dq, d), *y = json_array_get(ds, d);
            double pc = json_number_value(json_object_get(x, "compute_s"));
            double sc = json_number_value(json_object_get(y, "compute_s"));
            double sum = pc + json_number_value(json_object_get(x, "comm_s")) +
                         json_number_value(json_object_get(x, "idle_s"));
            if (!(fabs(pc - sc) <= 1e-9 * sc) || !(fabs(sum - it) <= 1e-12 + 1e-9 * it))
                fail_msg("dp %s, device %zu: predicted compute %.9g s, simulated %.9g s; "
                         "compute + comm + idle %.9g s, iteration %.9g s",
                         dp[k], d, pc, sc, sum, it);
            /* communication with the receives between the stages, as the
             * simulator counts them (without them: 20-100% below) */
            double pm = json_number_value(json_object_get(x, "comm_s"));
            double sm = json_number_value(json_object_get(y, "comm_s"));
            if (!(fabs(pm - sm) <= 0.05 * sm))
                fail_msg("dp %s, device %zu: predicted communication %.9g s, simulated %.9g s",
                         dp[k], d, pm, sm);
        }
        json_decref(js);
        json_decref(jp);
    }
    /* a stage file on 8 of the 16 devices: the planner's summary has the
     * other 8 idle the whole step (they once kept idle 0, which the
     * summary's reader refuses, so sim --predicted failed after the run) */
    char stages[512];
    snprintf(stages, sizeof stages, "%s/split-one.json", fx->dir);
    write_one_stage_file(stages);
    const char *a[] = {"plan", "--model", "gpt-350m", "--hidden", "256", "--layers", "4",
                       "--heads", "4", "--seq", "128", "--vocab", "2048", "--cluster",
                       "dgx-a100:2", "--stages", stages, "--global-batch", "32",
                       "--micro-batches", "4", "-o", plan, NULL};
    expect_success(fx, a, "predicted     iteration");
    const char *b[] = {"sim", "--plan", plan, "--summary", sim, "--predicted", pred, NULL};
    expect_success(fx, b, "simulated / predicted");
    json_t *jp = json_load_file(pred, 0, NULL);
    assert_non_null(jp);
    double it = json_number_value(json_object_get(jp, "iteration_s"));
    json_t *last = json_array_get(json_object_get(jp, "devices"), 15);
    assert_int_equal(json_integer_value(json_object_get(last, "stage")), -1);
    assert_true(json_number_value(json_object_get(last, "idle_s")) == it);
    json_decref(jp);
}
#endif

/* ---- fixture ------------------------------------------------------------------ */

static int group_setup(void **state)
{
    fixture *fx = calloc(1, sizeof *fx);
    if (fx == NULL)
        return -1;
    const char *tmp = getenv("TMPDIR");
    snprintf(fx->dir, sizeof fx->dir, "%s/ps-test-cli-XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(fx->dir) == NULL) {
        fprintf(stderr, "mkdtemp %s: %s\n", fx->dir, strerror(errno));
        free(fx);
        return -1;
    }
    if (access(PS_PIPESHARD_BIN, X_OK) != 0) {
        fprintf(stderr, "%s: not executable: %s\n", PS_PIPESHARD_BIN, strerror(errno));
        rmdir(fx->dir);
        free(fx);
        return -1;
    }
    *state = fx;
    return 0;
}

/* Removes whatever the tests left in the directory (a failed test stops
 * before its own cleanup), then the directory. */
static int group_teardown(void **state)
{
    fixture *fx = *state;
    if (fx == NULL)
        return 0;
    DIR *d = opendir(fx->dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char path[512];
            snprintf(path, sizeof path, "%s/%s", fx->dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    int rc = rmdir(fx->dir);
    free(fx);
    return rc == 0 ? 0 : -1;
}

/* --remat-layers: recomputing half the blocks lands between none and all. */
static void test_remat_layers(void **state)
{
    const fixture *fx = *state;
    const char *a[] = {"graph", "--model", "gpt-350m", "--batch", "2", "--remat-layers",
                       "1-12", "--json", NULL};
    run_result r;
    run_ok(fx, a, &r);
    expect_exit(&r, 0);
    json_t *j = parse_stdout(&r);
    run_result_free(&r);
    double plain = number_at(j, "flops_per_step"), full = number_at(j, "flops_per_step_remat");
    double half = number_at(j, "flops_per_step_remat_layers");
    assert_true(plain < half && half < full);
    double act = number_at(j, "activation_bytes_per_microbatch_remat_layers");
    assert_true(act < number_at(j, "activation_bytes_per_microbatch"));
    assert_true(act > number_at(j, "activation_bytes_per_microbatch_remat"));
    json_decref(j);
    const char *bad[] = {"graph", "--model", "gpt-350m", "--remat-layers", "3-99", NULL};
    expect_usage_error(fx, bad, "layer 99 does not exist");
}

/* exec --check where a correct plan's gradients differ from one device's by
 * more than the tolerance, on this project's machines: a Wide-ResNet of
 * batch 64 whose shard plan splits channels over 2 CPU devices (forward
 * partial sums round otherwise, and two ReLU inputs within 1e-6 of zero fall
 * on the other side of it: weight gradients moved by up to 44%), and the
 * auto plan of 8 devices at batch 16 (no flip; batchnorm amplifies rounding
 * to 1.4e-4 in the stem's gradients), and a dp2 op2 pp2 plan at batch 64
 * over 2 steps (Adam turns rounding noise into steps of +-lr: 16% in the
 * gradients, rounding alone 29%). The check must pass, saying why where it
 * took a second look. */
static void test_check_rounding(void **state)
{
    const fixture *fx = *state;
    static const struct {
        const char *devices, *method, *batch, *micro, *steps;
    } cases[] = {{"2", "shard", "64", "1", "1"},
                 {"8", "auto", "16", "2", "1"},
                 {"8", "uniform", "64", "2", "2"}};
    for (int k = 0; k < 3; k++) {
        char cluster[512], plan[512];
        snprintf(cluster, sizeof cluster, "%s/cpu%s.json", fx->dir, cases[k].devices);
        snprintf(plan, sizeof plan, "%s/wrn-%s.json", fx->dir, cases[k].method);
        FILE *f = fopen(cluster, "w");
        assert_non_null(f);
        fprintf(f,
                "{\"name\": \"cpu-host\", \"nodes\": 1, \"devices_per_node\": %s, "
                "\"device\": {\"name\": \"cpu\", \"peak_flops\": {\"fp32\": 1.029e11, "
                "\"fp16\": 1.029e11, \"bf16\": 1.029e11}, \"memory_bytes\": 3159562752, "
                "\"memory_bandwidth_bytes_per_s\": 2.799e10}, \"intra_node\": {\"topology\": "
                "\"nvswitch\", \"bandwidth_bytes_per_s\": 1.195e10, \"latency_s\": "
                "2.906e-05}, \"inter_node\": {\"topology\": \"fat-tree\", \"nics_per_node\": "
                "1, \"nic_bandwidth_bytes_per_s\": 1.195e10, \"latency_s\": 2.906e-05}, "
                "\"shared_cores_per_node\": 2}\n",
                cases[k].devices);
        fclose(f);
        const char *a[] = {"plan", "--model", "wresnet-250m", "--image-size", "32", "--channels",
                           "8", "--width-factor", "1", "--classes", "10", "--dtype", "fp32",
                           "--cluster-file", cluster, "--method", cases[k].method,
                           "--global-batch", cases[k].batch, "--micro-batches", cases[k].micro,
                           "-o", plan, "--dp", "2", "--op", "2", "--pp", "2", NULL};
        assert_string_equal(a[23], "--dp");
        if (strcmp(cases[k].method, "uniform") != 0)
            a[23] = NULL; /* the mesh for the uniform plan only */
        expect_success(fx, a, "predicted     iteration");
        const char *e[] = {"exec", "--plan", plan, "--steps", cases[k].steps, "--check", NULL};
        run_result r;
        run_ok(fx, e, &r);
        const char *relu = strstr(r.out, "  relu        ");
        const char *rounding = strstr(r.out, "  rounding    ");
        printf("  %s on %s devices, %s step(s):\n%s", cases[k].method, cases[k].devices,
               cases[k].steps,
               relu != NULL ? relu : rounding != NULL ? rounding : "  first comparison ok\n");
        expect_exit(&r, 0);
        expect_in(&r, true, "\n  ok\n");
        if (relu != NULL)
            expect_in(&r, true, "took the run's value; first stage");
        if (rounding != NULL)
            expect_in(&r, true, "is within twice what rounding alone does");
        run_result_free(&r);
    }
    /* In fp16 the measure moves the parameters by one fp16 ulp: the mlp's
     * ReLUs and Adam make three steps of two correct fp16 runs differ by
     * 4.8% in the gradients, and the reference from parameters one ulp apart
     * by more; once it missed by that, MISMATCH. */
    char plan[512];
    snprintf(plan, sizeof plan, "%s/mlp-fp16.json", fx->dir);
    const char *a[] = {"plan", "--model", "mlp", "--hidden", "64", "--cluster", "p3.16xlarge:1",
                       "--method", "uniform", "--dp", "2", "--op", "2", "--pp", "2",
                       "--global-batch", "32", "--micro-batches", "4", "--dtype", "fp16",
                       "--loss-scale", "1024", "-o", plan, NULL};
    expect_success(fx, a, "predicted     iteration");
    const char *e[] = {"exec", "--plan", plan, "--steps", "3", "--check", NULL};
    run_result r;
    run_ok(fx, e, &r);
    expect_exit(&r, 0);
    expect_in(&r, true, "  rounding    from parameters one ulp larger or smaller");
    expect_in(&r, true, "is within twice what rounding alone does");
    expect_in(&r, true, "\n  ok\n");
    run_result_free(&r);
    /* --json: the summary's keys, each step's loss and the check */
    const char *ej[] = {"exec", "--plan", plan, "--steps", "2", "--check", "--json", NULL};
    run_ok(fx, ej, &r);
    expect_exit(&r, 0);
    json_t *j = json_loads(r.out, 0, NULL);
    assert_non_null(j);
    assert_true(json_number_value(json_object_get(j, "iteration_s")) > 0);
    json_t *steps = json_object_get(j, "steps");
    assert_int_equal(json_array_size(steps), 2);
    assert_true(json_number_value(json_object_get(json_array_get(steps, 1), "loss")) > 0);
    json_t *chk = json_object_get(j, "check");
    assert_true(json_is_true(json_object_get(chk, "ok")));
    /* ok: within the tolerance, or (where the CPU's GEMM kernels round
     * otherwise) within the margin of the rounding measured */
    double grad_rel = json_number_value(json_object_get(chk, "grad_rel"));
    json_t *noise = json_object_get(chk, "rounding");
    if (grad_rel >= json_number_value(json_object_get(chk, "tolerance_rel"))) {
        assert_non_null(noise);
        assert_true(grad_rel <= json_number_value(json_object_get(noise, "margin")) *
                                    json_number_value(json_object_get(noise, "grad_rel")));
    }
    json_decref(j);
    run_result_free(&r);
}

/* A CPU cluster file of `devices` devices of `memory` bytes in the
 * fixture's directory. */
static void write_cpu_cluster(const fixture *fx, const char *devices, const char *memory,
                              char *path, size_t size)
{
    snprintf(path, size, "%s/cpu-%s-%s.json", fx->dir, devices, memory);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"name\": \"cpu-host\", \"nodes\": 1, \"devices_per_node\": %s, "
            "\"device\": {\"name\": \"cpu\", \"peak_flops\": {\"fp32\": 1.1e11, "
            "\"fp16\": 1.1e11, \"bf16\": 1.1e11}, \"memory_bytes\": %s, "
            "\"memory_bandwidth_bytes_per_s\": 4e10}, \"intra_node\": {\"topology\": "
            "\"nvswitch\", \"bandwidth_bytes_per_s\": 1.2e10, \"latency_s\": 2e-05}, "
            "\"inter_node\": {\"topology\": \"fat-tree\", \"nics_per_node\": 1, "
            "\"nic_bandwidth_bytes_per_s\": 1.2e10, \"latency_s\": 2e-05}, "
            "\"shared_cores_per_node\": 2}\n",
            devices, memory);
    fclose(f);
}

/* pipeshard predict on devices sharing cores (8 on 2 cores, 4 stages of 2):
 * the summary's phases are the schedule's, whose computes share the cores,
 * so each lies between the plan's all-busy time and a quarter of it (the
 * compute share), the first stage's forward below it (it runs alone while
 * the pipeline fills), and the step is the plan's predicted iteration. */
static void test_predict_shared_cores(void **state)
{
    const fixture *fx = *state;
    char cluster[512], plan[512], sum[512];
    write_cpu_cluster(fx, "8", "3000000000", cluster, sizeof cluster);
    snprintf(plan, sizeof plan, "%s/shared-plan.json", fx->dir);
    snprintf(sum, sizeof sum, "%s/shared-summary.json", fx->dir);
    const char *a[] = {"plan",     "--model",
                       "gpt-350m", "--hidden",
                       "128",      "--layers",
                       "4",        "--heads",
                       "4",        "--seq",
                       "64",       "--vocab",
                       "512",      "--ffn",
                       "512",      "--dtype",
                       "fp32",     "--cluster-file",
                       cluster,    "--method",
                       "uniform",  "--dp",
                       "1",        "--op",
                       "2",        "--pp",
                       "4",        "--global-batch",
                       "16",       "--micro-batches",
                       "8",        "-o",
                       plan,       NULL};
    expect_success(fx, a, "predicted     iteration");
    expect_success(fx, (const char *[]){"predict", "--plan", plan, "--summary", sum, NULL},
                   "planner's schedule of gpt-350m on cpu-host");
    json_t *jp = json_load_file(plan, 0, NULL), *js = json_load_file(sum, 0, NULL);
    assert_non_null(jp);
    assert_non_null(js);
    assert_true(
        json_number_value(json_object_get(js, "iteration_s")) ==
        json_number_value(json_object_get(json_object_get(jp, "predicted"), "iteration_s")));
    json_t *ps = json_object_get(jp, "stages"), *ss = json_object_get(js, "stages");
    assert_int_equal(json_array_size(ps), 4);
    assert_int_equal(json_array_size(ss), 4);
    static const char *const phases[] = {"forward_s", "backward_s", "update_s"};
    int shorter = 0;
    for (size_t k = 0; k < 4; k++) {
        json_t *charged = json_object_get(json_array_get(ps, k), "predicted");
        json_t *got = json_array_get(ss, k);
        for (int ph = 0; ph < 3; ph++) {
            double c = json_number_value(json_object_get(charged, phases[ph]));
            double g = json_number_value(json_object_get(got, phases[ph]));
            if (!(g <= c * (1 + 1e-9) && g >= c / 4 * (1 - 1e-9)))
                fail_msg("stage %zu: %s %.9g s in the schedule, %.9g s charged", k, phases[ph], g,
                         c);
            shorter += g < c * (1 - 1e-6);
            if (k == 0 && ph == 0)
                assert_true(g < c * (1 - 1e-6));
        }
        double t = json_number_value(json_object_get(got, "time_s"));
        assert_true(fabs(t - json_number_value(json_object_get(got, "forward_s")) -
                         json_number_value(json_object_get(got, "backward_s"))) <= 1e-12 * t);
    }
    printf("  %d of 12 phases shorter than charged\n", shorter);
#ifndef PS_NO_SIMGRID
    /* sim reports each stage against that schedule, not the charged bound */
    run_result r;
    run_ok(fx, (const char *[]){"sim", "--plan", plan, NULL}, &r);
    expect_exit(&r, 0);
    for (size_t k = 0; k < 4; k++) {
        char needle[48];
        snprintf(needle, sizeof needle, "  stage %zu: simulated ", k);
        const char *at = strstr(r.out, needle);
        assert_non_null(at);
        double simulated = 0, predicted = 0;
        assert_int_equal(
            sscanf(at + strlen(needle), "%lf ms, predicted %lf ms", &simulated, &predicted), 2);
        double want = json_number_value(json_object_get(json_array_get(ss, k), "time_s")) * 1e3;
        if (!(fabs(predicted - want) <= 5e-4 * want))
            fail_msg("stage %zu: sim says predicted %.6g ms, the schedule %.6g ms", k, predicted,
                     want);
    }
    run_result_free(&r);
#endif
    json_decref(jp);
    json_decref(js);
}

/* A cluster of absurd rates (memory bandwidth 1e-300 B/s), whose predicted
 * steps would overflow what a plan file holds, is refused by name. */
static void test_plan_absurd_cluster(void **state)
{
    const fixture *fx = *state;
    char cluster[512], plan[512];
    snprintf(cluster, sizeof cluster, "%s/absurd.json", fx->dir);
    snprintf(plan, sizeof plan, "%s/absurd-plan.json", fx->dir);
    FILE *f = fopen(cluster, "w");
    assert_non_null(f);
    fprintf(f, "{\"name\": \"absurd\", \"nodes\": 1, \"devices_per_node\": 2, "
               "\"device\": {\"name\": \"x\", \"peak_flops\": {\"fp32\": 1e12}, "
               "\"memory_bytes\": 1e10, \"memory_bandwidth_bytes_per_s\": 1e-300}, "
               "\"intra_node\": {\"topology\": \"nvswitch\", \"bandwidth_bytes_per_s\": 1e10, "
               "\"latency_s\": 1e-05}, \"inter_node\": {\"topology\": \"fat-tree\", "
               "\"nics_per_node\": 1, \"nic_bandwidth_bytes_per_s\": 1e10, \"latency_s\": "
               "1e-05}}\n");
    fclose(f);
    expect_failure(fx,
                   (const char *[]){"plan", "--model", "mlp", "--cluster-file", cluster, "--method",
                                    "data", "-o", plan, NULL},
                   "memory_bandwidth_bytes_per_s must be 1 to 1e20 B/s (found 1e-300)");
    assert_int_equal(access(plan, F_OK), -1);
    expect_failure(fx, (const char *[]){"clusters", "--cluster-file", cluster, NULL},
                   "must be 1 to 1e20 B/s");
}

/* The whole cluster is a stage candidate whatever its node count: on 3
 * nodes, power_of_two's (1,m), (2,M) once left out (3,M). */
static void test_whole_cluster_submesh(void **state)
{
    const fixture *fx = *state;
    char out[512];
    snprintf(out, sizeof out, "%s/three-nodes.json", fx->dir);
    const char *a[] = {"plan", "--model", "gpt-350m", "--layers", "2", "--hidden", "256",
                       "--heads", "4", "--seq", "128", "--cluster", "dgx-a100:3",
                       "--global-batch", "48", "--micro-batches", "2", "--rows", "-o", out,
                       NULL};
    expect_success(fx, a, "result[(0, 3, (3, 8), (3, 8) forced)]");
}

/* A graph whose layer 0 reads a tensor that layer 1 makes (manual tags allow
 * it): a pipeline that puts layer 1 in a later stage would wait for itself.
 * A stage file that does is refused, naming the tensor;
 * the stage DP keeps both layers in one stage (it once wrote such a plan,
 * which exec and sim then refused as a deadlock). */
static void test_later_layer_read(void **state)
{
    const fixture *fx = *state;
    char two[512], graph[512], stages[512], plan[512];
    write_cpu_cluster(fx, "2", "3000000000", two, sizeof two);
    snprintf(graph, sizeof graph, "%s/later-read.json", fx->dir);
    snprintf(stages, sizeof stages, "%s/later-read-stages.json", fx->dir);
    snprintf(plan, sizeof plan, "%s/later-read-plan.json", fx->dir);
    FILE *f = fopen(graph, "w");
    assert_non_null(f);
    fputs("{\"format\": \"pipeshard-graph\", \"version\": 1, \"name\": \"inv\", \"loss\": "
          "\"loss\", \"boundaries\": [0],\n \"tensors\": [\n"
          "  {\"name\": \"x\", \"kind\": \"input\", \"dtype\": \"fp32\", \"shape\": [4, 6]},\n"
          "  {\"name\": \"y\", \"kind\": \"input\", \"dtype\": \"fp32\", \"shape\": [4, 6]},\n"
          "  {\"name\": \"w\", \"kind\": \"param\", \"dtype\": \"fp32\", \"shape\": [6, 6], "
          "\"layer\": 0},\n"
          "  {\"name\": \"w2\", \"kind\": \"param\", \"dtype\": \"fp32\", \"shape\": [6, 6], "
          "\"layer\": 1},\n"
          "  {\"name\": \"h\", \"kind\": \"activation\", \"dtype\": \"fp32\", \"shape\": [4, 6]},\n"
          "  {\"name\": \"r\", \"kind\": \"activation\", \"dtype\": \"fp32\", \"shape\": [4, 6]},\n"
          "  {\"name\": \"o\", \"kind\": \"activation\", \"dtype\": \"fp32\", \"shape\": [4, 6]},\n"
          "  {\"name\": \"loss\", \"kind\": \"activation\", \"dtype\": \"fp32\", \"shape\": []}],\n"
          " \"ops\": [\n"
          "  {\"name\": \"mm\", \"op\": \"matmul\", \"layer\": 1, \"in\": [\"x\", \"w2\"], "
          "\"out\": [\"h\"], \"einsum\": \"bk,kn->bn\"},\n"
          "  {\"name\": \"gelu\", \"op\": \"gelu\", \"layer\": 0, \"in\": [\"h\"], \"out\": [\"r\"]},\n"
          "  {\"name\": \"mm2\", \"op\": \"matmul\", \"layer\": 1, \"in\": [\"r\", \"w\"], "
          "\"out\": [\"o\"], \"einsum\": \"bk,kn->bn\"},\n"
          "  {\"name\": \"loss\", \"op\": \"mse_loss\", \"layer\": 1, \"in\": [\"o\", \"y\"], "
          "\"out\": [\"loss\"]}]}\n",
          f);
    fclose(f);
    f = fopen(stages, "w");
    assert_non_null(f);
    fputs("{\"format\": \"pipeshard-stages\", \"version\": 1, \"layer_num\": \"manual\",\n"
          " \"stages\": [{\"layers\": [0, 0], \"submesh\": [1, 1], \"logical_mesh\": [1, 1]},\n"
          "  {\"layers\": [1, 1], \"submesh\": [1, 1], \"logical_mesh\": [1, 1]}]}\n",
          f);
    fclose(f);
    const char *a[] = {"plan", "--graph", graph, "--cluster-file", two, "--stages", stages,
                       "--micro-batches", "2", "-o", plan, NULL};
    expect_failure(fx, a,
                   "later-read-stages.json: op \"gelu\" of layer 0 (stage 0) reads \"h\", which "
                   "op \"mm\" of layer 1 makes in the later stage 1: a stage runs its forward "
                   "pass whole, so the two would wait for each other; put layers 0-1 in one "
                   "stage");
    const char *u[] = {"plan", "--graph", graph, "--cluster-file", two, "--method", "uniform",
                       "--dp", "1", "--op", "1", "--pp", "2", "--micro-batches", "2", "-o", plan,
                       NULL};
    /* a uniform plan clusters the ops into its stages' layers in the graph's
     * order, which flow forward: it runs */
    expect_success(fx, u, "stage 1       layers 1-1 on devices 1-1");
    const char *ue[] = {"exec", "--plan", plan, "--steps", "1", "--check", NULL};
    expect_success(fx, ue, "\n  ok\n");
    const char *p[] = {"plan", "--graph", graph, "--cluster-file", two, "--micro-batches", "2",
                       "-o", plan, NULL};
    run_result r;
    run_ok(fx, p, &r);
    expect_exit(&r, 0);
    expect_in(&r, true, "stage 0       layers 0-1 on devices 0-1");
    assert_false(contains(r.err, r.err_len, "wait for each other"));
    run_result_free(&r);
    const char *e[] = {"exec", "--plan", plan, "--steps", "1", "--check", NULL};
    expect_success(fx, e, "\n  ok\n");
}

/* --check holds the reference as the run held it, and judges it by what the
 * run held:
 * - fp32 parameters with Adam's state in bf16 or fp16: a one-device plan is
 *   the reference itself (the reference once held that state in fp32, and
 *   the parameters had a bf16 "master" copy: MISMATCH);
 * - dynamic loss scaling keeps the rounding measure, with the verdict of
 *   the same numbers under a static scale (it once skipped the measure and
 *   said MISMATCH where a static scale passed);
 * - --check-fp32 of a bf16 run aligns no ReLU (it once aligned them at
 *   bf16's tolerance, turning a MISMATCH into ok). */
static void test_check_held_dtypes(void **state)
{
    const fixture *fx = *state;
    char one[512], two[512], plan[512];
    write_cpu_cluster(fx, "1", "3000000000", one, sizeof one);
    write_cpu_cluster(fx, "2", "3000000000", two, sizeof two);
    snprintf(plan, sizeof plan, "%s/held.json", fx->dir);
    /* --fp32 on a plan with nothing in 2 bytes would change nothing */
    {
        const char *a[] = {"plan", "--model", "mlp", "--hidden", "16", "--layers", "1",
                           "--dtype", "fp32", "--cluster-file", one, "--method", "data",
                           "--global-batch", "2", "-o", plan, NULL};
        expect_success(fx, a, "predicted     iteration");
        const char *e[] = {"exec", "--plan", plan, "--fp32", NULL};
        expect_failure(fx, e, "--fp32 changes nothing: the plan holds no fp16 or bf16 tensors");
        const char *cf[] = {"exec", "--plan", plan, "--check-fp32", NULL};
        expect_failure(fx, cf, "--check-fp32 is --check here: the plan holds no fp16 or bf16 "
                               "tensors");
    }
    static const char *const state_dtypes[] = {"bf16", "fp16"};
    for (int k = 0; k < 2; k++) {
        const char *a[] = {"plan", "--model", "mlp", "--hidden", "16", "--layers", "1",
                           "--dtype", "fp32", "--optimizer-dtype", state_dtypes[k],
                           "--cluster-file", one, "--method", "data", "--global-batch", "2",
                           "-o", plan, NULL};
        expect_success(fx, a, "predicted     iteration");
        const char *e[] = {"exec", "--plan", plan, "--steps", "3", "--check", NULL};
        run_result r;
        run_ok(fx, e, &r);
        expect_exit(&r, 0);
        char held[96];
        snprintf(held, sizeof held, "held in fp32, Adam's state in %s:", state_dtypes[k]);
        expect_in(&r, true, held);
        expect_in(&r, true, "  parameters  abs. diff 0, worst -");
        expect_in(&r, true, "\n  ok\n");
        run_result_free(&r);
    }
    /* the same numbers under a static and a dynamic scale (fp32: scaling by
     * powers of two is exact, and no step overflows): the same rounding
     * measure and verdict. A tolerance of 1e-9 makes the first comparison
     * fail, so that the measure runs whatever the kernels' rounding. */
    char dyn[512], rounding[2][512];
    int verdict[2];
    snprintf(dyn, sizeof dyn, "%s/held-dyn.json", fx->dir);
    for (int k = 0; k < 2; k++) {
        const char *d[] = {"plan", "--model", "wresnet-250m", "--image-size", "32", "--channels",
                           "4", "--width-factor", "1", "--classes", "10", "--dtype", "fp32",
                           "--cluster-file", two, "--global-batch", "16", "--micro-batches", "2",
                           "--method", "data", "-o", k ? dyn : plan, "--dynamic-loss-scale",
                           NULL};
        assert_string_equal(d[23], "--dynamic-loss-scale");
        if (k == 0)
            d[23] = NULL;
        expect_success(fx, d, "predicted     iteration");
        const char *de[] = {"exec", "--plan", k ? dyn : plan, "--steps", "3", "--seed", "6",
                            "--check", "--tolerance", "1e-9", NULL};
        run_result r;
        run_ok(fx, de, &r);
        const char *line = strstr(r.out, "  rounding    ");
        if (line == NULL) {
            print_error("no rounding measure (%s scale)\n", k ? "dynamic" : "static");
            dump(&r);
            fail();
        }
        const char *end = strstr(line, "\n  ");
        snprintf(rounding[k], sizeof rounding[k], "%.*s",
                 (int)(end != NULL ? end - line : (ptrdiff_t)strlen(line)), line);
        assert_true(r.exited);
        verdict[k] = r.status;
        if (k == 1)
            expect_in(&r, true, "  loss scale  0 of 3 steps skipped, the reference 0\n");
        run_result_free(&r);
    }
    assert_string_equal(rounding[0], rounding[1]);
    assert_int_equal(verdict[0], verdict[1]);
    run_result r;
    const char *h[] = {"plan", "--model", "mlp", "--hidden", "16", "--layers", "2", "--dtype",
                       "bf16", "--cluster-file", one, "--method", "data", "--global-batch", "8",
                       "-o", plan, NULL};
    expect_success(fx, h, "predicted     iteration");
    const char *he[] = {"exec", "--plan", plan, "--steps", "2", "--seed", "2", "--check-fp32",
                        NULL};
    run_ok(fx, he, &r);
    expect_in(&r, true, "held in bf16 (the reference in fp32)");
    if (contains(r.out, r.out_len, "  relu        ")) {
        print_error("--check-fp32 of a bf16 run aligned ReLUs\n");
        dump(&r);
        fail();
    }
    run_result_free(&r);
}

/* Memory refusals say where: a uniform plan's stage that fits no layout
 * names the plan, the stage, its layers and meshes (it once said only "no
 * strategy choice fits in memory"); a one-stage plan whose working set
 * alone fills the devices says so (it once reported a negative room). */
static void test_memory_refusals_say_where(void **state)
{
    const fixture *fx = *state;
    char eight[512], four[512], plan[512];
    write_cpu_cluster(fx, "8", "700000", eight, sizeof eight);
    write_cpu_cluster(fx, "4", "700000", four, sizeof four);
    snprintf(plan, sizeof plan, "%s/refused.json", fx->dir);
    const char *u[] = {"plan", "--model", "wresnet-250m", "--image-size", "32", "--channels",
                       "4", "--width-factor", "1", "--classes", "10", "--cluster-file", eight,
                       "--method", "uniform", "--dp", "2", "--op", "1", "--pp", "4",
                       "--global-batch", "16", "-o", plan, NULL};
    run_result r;
    run_ok(fx, u, &r);
    expect_exit(&r, 1);
    expect_in(&r, false, "uniform plan of wresnet-250m, stage ");
    expect_in(&r, false, "on 1x2 devices, logical mesh 2x1): no strategy choice fits in memory");
    run_result_free(&r);
    const char *d[] = {"plan", "--model", "moe-380m", "--hidden", "16", "--layers", "1",
                       "--heads", "4", "--seq", "16", "--vocab", "100", "--ffn", "64",
                       "--experts", "1", "--expert-group", "32", "--top-k", "1",
                       "--capacity-factor", "1.25", "--dtype", "fp32", "--cluster-file", four,
                       "--global-batch", "32", "--method",
                       "data", "--mesh", "1x4", "--remat", "-o", plan, NULL};
    run_ok(fx, d, &r);
    expect_exit(&r, 1);
    expect_in(&r, false,
              "moe-380m does not fit in memory with method data on 1x4 (0.0006519 GiB "
              "per device): no room is left beside a micro-batch's working set");
    if (contains(r.err, r.err_len, "GiB left beside"))
        fail_msg("a room reported: %s", r.err);
    run_result_free(&r);
}

/* --loss-scale: refused outside [2^-24, 2^40]; recorded in the plan; exec's
 * check names it; a scale that overflows fp16 stops exec (exit 1) with a
 * message that says so. */
static void test_loss_scale(void **state)
{
    const fixture *fx = *state;
    char plan[512];
    snprintf(plan, sizeof plan, "%s/ls.json", fx->dir);
    static const char *const bad[] = {"0", "-8", "abc", "1e13", "0x1p41", "nan"};
    for (int i = 0; i < 6; i++) {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100", "--loss-scale",
                           bad[i], "-o", plan, NULL};
        expect_usage_error(fx, a, "--loss-scale wants a number in [2^-24, 2^40]");
    }
#define SMALL_FP16_GPT                                                                        \
    "plan", "--model", "gpt-350m", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq",  \
        "16", "--vocab", "128", "--ffn", "256", "--dtype", "fp16", "--cluster", "p3.16xlarge", \
        "--global-batch", "16", "--micro-batches", "2", "--method", "data"
    {
        const char *a[] = {SMALL_FP16_GPT, "--loss-scale", "1024", "-o", plan, NULL};
        expect_success(fx, a, "predicted     iteration");
        ps_json_doc *doc = NULL;
        assert_int_equal(ps_json_doc_load(plan, &doc, NULL), PS_OK);
        json_t *train = json_object_get(doc->root, "training");
        assert_true(json_number_value(json_object_get(train, "loss_scale")) == 1024);
        ps_json_doc_free(doc);
        const char *e[] = {"exec", "--plan", plan, "--check", NULL};
        run_result r;
        run_ok(fx, e, &r);
        expect_exit(&r, 0);
        expect_in(&r, true, "floating-point tensors held in fp16, loss scale 1024:");
        expect_in(&r, true, "(the reference rounds to fp16 as this run does, so what both "
                            "lose cancels; --check-fp32 shows what fp16 loses)");
        run_result_free(&r);
        const char *e32[] = {"exec", "--plan", plan, "--check-fp32", NULL};
        expect_success(fx, e32,
                       "floating-point tensors held in fp16 (the reference in fp32), loss "
                       "scale 1024:");
        /* warm-up steps: a count >= 0; each step's time is printed */
        const char *w[] = {"exec", "--plan", plan, "--warmup", "-1", NULL};
        expect_usage_error(fx, w, "--warmup needs a count from 0 to 1000000, not \"-1\"");
        const char *w2[] = {"exec", "--plan", plan, "--warmup", "2", "--steps", "2", NULL};
        expect_success(fx, w2, "step 2: loss ");
    }
    /* a plan whose tiles need more host memory than the host has (113 GiB
     * over 8 devices; the host's 20 GiB in the test mode, so that a larger
     * machine refuses it too) is refused before it allocates, not killed by
     * the system; --no-memory-check runs a plan past the limit */
    {
        const char *a[] = {"plan", "--model", "gpt-2.6b", "--method", "zero3", "--cluster",
                           "p3.16xlarge", "--global-batch", "8", "--micro-batches", "1", "-o",
                           plan, NULL};
        expect_success(fx, a, "predicted     iteration");
        setenv("PIPESHARD_HOST_MEMORY", "21474836480", 1);
        const char *e[] = {"exec", "--plan", plan, "--backend", "cpu", NULL};
        run_result r;
        run_ok(fx, e, &r);
        expect_exit(&r, 1);
        expect_in(&r, false, "the plan's 8 CPU devices hold 112.9");
        expect_in(&r, false, "GiB of tiles at the peak of a step (device 0 the most: 14.1");
        expect_in(&r, false, "more than the 20.00 GiB of host memory allowed");
        expect_in(&r, false, "--no-memory-check");
        run_result_free(&r);
        const char *u[] = {"exec", "--plan", plan, "--no-memory-check=1", NULL};
        expect_usage_error(fx, u, "unknown or incomplete option");
        const char *small[] = {SMALL_FP16_GPT, "-o", plan, NULL};
        expect_success(fx, small, "predicted     iteration");
        setenv("PIPESHARD_HOST_MEMORY", "1", 1);
        expect_failure(fx, e, "more than the 1 B of host memory allowed");
        const char *anyway[] = {"exec", "--plan", plan, "--no-memory-check", NULL};
        expect_success(fx, anyway, "step 1: loss ");
        setenv("PIPESHARD_HOST_MEMORY", "0", 1);
        expect_failure(fx, e, "PIPESHARD_HOST_MEMORY needs a count of bytes, not \"0\"");
        unsetenv("PIPESHARD_HOST_MEMORY");
    }
    {
        const char *a[] = {SMALL_FP16_GPT, "--loss-scale", "0x1p40", "-o", plan, NULL};
        expect_success(fx, a, "predicted     iteration");
        const char *e[] = {"exec", "--plan", plan, NULL};
        run_result r;
        run_ok(fx, e, &r);
        expect_exit(&r, 1);
        expect_in(&r, false, "(adam): the gradient holds ");
        expect_in(&r, false, "overflowed it (lower --loss-scale)");
        run_result_free(&r);
    }
    /* dynamic: the same scale skips steps instead, and the check agrees */
    {
        const char *a[] = {SMALL_FP16_GPT, "--loss-scale", "0x1p40", "--dynamic-loss-scale",
                           "--loss-scale-window", "50", "-o", plan, NULL};
        expect_success(fx, a, "predicted     iteration");
        ps_json_doc *doc = NULL;
        assert_int_equal(ps_json_doc_load(plan, &doc, NULL), PS_OK);
        json_t *train = json_object_get(doc->root, "training");
        assert_true(json_is_true(json_object_get(train, "dynamic_loss_scale")));
        assert_int_equal(json_integer_value(json_object_get(train, "loss_scale_window")), 50);
        ps_json_doc_free(doc);
        const char *e[] = {"exec", "--plan", plan, "--steps", "3", "--check", NULL};
        run_result r;
        run_ok(fx, e, &r);
        expect_exit(&r, 0);
        expect_in(&r, true, "step 1: loss ");
        expect_in(&r, true, "at loss scale 1.09951e+12: a gradient overflowed, update skipped");
        expect_in(&r, true, "step 3: loss ");
        expect_in(&r, true, "at loss scale 2.74878e+11");
        expect_in(&r, true, "dynamic loss scale from 1.09951e+12:");
        expect_in(&r, true, "loss scale  3 of 3 steps skipped, the reference 3");
        expect_in(&r, true, "(3 of 3 steps skipped by the loss scaling: no optimizer ran in them)");
        run_result_free(&r);
        /* held in fp32, the reference would skip other steps */
        const char *e32[] = {"exec", "--plan", plan, "--steps", "3", "--check-fp32", NULL};
        run_ok(fx, e32, &r);
        expect_exit(&r, 1);
        expect_in(&r, false, "--check-fp32: ");
        expect_in(&r, false, "scales its loss dynamically, and a step held in fp32 skips other "
                             "steps; use --check");
        run_result_free(&r);
    }
    {
        const char *a[] = {SMALL_FP16_GPT, "--dynamic-loss-scale", "-o", plan, NULL};
        expect_success(fx, a, "predicted     iteration");
        ps_json_doc *doc = NULL;
        assert_int_equal(ps_json_doc_load(plan, &doc, NULL), PS_OK);
        json_t *train = json_object_get(doc->root, "training");
        assert_true(json_number_value(json_object_get(train, "loss_scale")) == 65536);
        assert_int_equal(json_integer_value(json_object_get(train, "loss_scale_window")), 2000);
        ps_json_doc_free(doc);
    }
    {
        const char *a[] = {SMALL_FP16_GPT, "--loss-scale-window", "10", "-o", plan, NULL};
        expect_usage_error(fx, a, "--loss-scale-window applies to --dynamic-loss-scale only");
        const char *b[] = {SMALL_FP16_GPT, "--dynamic-loss-scale", "--loss-scale-window", "0",
                           "-o", plan, NULL};
        expect_usage_error(fx, b, "--loss-scale-window wants a positive number of steps");
    }
#undef SMALL_FP16_GPT
}

/* plan: usage errors, a plan written and explained, a model that does not fit. */
static void test_plan(void **state)
{
    const fixture *fx = *state;
    char out[512];
    snprintf(out, sizeof out, "%s/p.json", fx->dir); /* the child runs in our directory */
    {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100", NULL};
        expect_usage_error(fx, a, "-o PLAN.json is required");
    }
    {
        const char *a[] = {"plan", "--model", "mlp", "-o", out, NULL};
        expect_usage_error(fx, a, "--cluster");
    }
    {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100", "--method",
                           "magic", "-o", out, NULL};
        expect_usage_error(fx, a, "unknown method \"magic\"");
    }
    {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100", "--mesh", "3x",
                           "-o", out, NULL};
        expect_usage_error(fx, a, "--mesh wants D0xD1");
    }
    {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100", "--method", "shard",
                           "--global-batch", "64", "--explain", "-o", out, NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 0);
        expect_in(&r, true, "predicted     iteration");
        expect_in(&r, true, "reduce-scatter over axes 1");
        run_result_free(&r);
        ps_json_doc *doc = NULL;
        assert_int_equal(ps_json_doc_load(out, &doc, NULL), PS_OK);
        json_t *pred = json_object_get(doc->root, "predicted");
        assert_true(json_number_value(json_object_get(pred, "iteration_s")) > 0);
        assert_true(json_is_array(json_object_get(doc->root, "stages")));
        ps_json_doc_free(doc);
    }
    {
        const char *a[] = {"plan", "--model", "gpt-2.6b", "--cluster", "p3.16xlarge",
                           "--method", "data", "--micro-batches", "64", "-o", out, NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 1);
        expect_in(&r, false, "does not fit in memory with method data");
        expect_empty(&r, true);
        run_result_free(&r);
    }
    {
        /* the default method: pipeline stages from the stage DP */
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100", "--layer-num",
                           "manual", "--micro-batches", "16", "-o", out, NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 0);
        expect_in(&r, true, "method pipeshard, schedule 1f1b");
        expect_in(&r, true, "stage 0");
        run_result_free(&r);
    }
    {
        /* the stage cost rows show what each stage receives; Alpa's costs on request */
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2", "--layer-num",
                           "2", "--micro-batches", "16", "--rows", "-o", out, NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 0);
        expect_in(&r, true, "receives ");
        expect_in(&r, true, "layers: 2 clustered");
        expect_in(&r, true, "] = stage(time ");
        expect_in(&r, true, " ms (forward ");
        expect_in(&r, true, "update ");
        expect_in(&r, true, "layer[1] = (forward ops ");
        run_result_free(&r);
        const char *b[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2", "--layer-num",
                           "2", "--micro-batches", "16", "--no-transfer-costs", "-o", out, NULL};
        expect_success(fx, b, "predicted     iteration");
        /* every range solved, and Alpa's imbalance tolerance */
        const char *c[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2", "--layer-num",
                           "2", "--micro-batches", "16", "--exact-ranges",
                           "--stage-imbalance-tolerance", "1", "-o", out, NULL};
        expect_success(fx, c, "predicted     iteration");
        const char *d[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2",
                           "--stage-imbalance-tolerance", "-1", "-o", out, NULL};
        expect_usage_error(fx, d, "--stage-imbalance-tolerance wants a number >= 0");
        const char *e[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2", "--method",
                           "data", "--exact-ranges", "-o", out, NULL};
        expect_usage_error(fx, e, "apply to --method pipeshard");
        /* stage-count candidates: Alpa's single answer, more, and bad counts */
        const char *f1[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2", "--layer-num",
                            "2", "--micro-batches", "16", "--stage-candidates", "1", "-o", out,
                            NULL};
        expect_success(fx, f1, "predicted     iteration");
        const char *f2[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2", "--layer-num",
                            "2", "--micro-batches", "16", "--stage-candidates", "16", "-o", out,
                            NULL};
        expect_success(fx, f2, "predicted     iteration");
        static const char *const bad_counts[] = {"0", "17", "two", "", "2.5"};
        for (size_t q = 0; q < sizeof bad_counts / sizeof *bad_counts; q++) {
            const char *f3[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2",
                                "--stage-candidates", bad_counts[q], "-o", out, NULL};
            expect_usage_error(fx, f3, "--stage-candidates wants an integer from 1 to 16");
        }
        const char *f4[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2", "--method",
                            "data", "--stage-candidates", "3", "-o", out, NULL};
        expect_usage_error(fx, f4, "apply to --method pipeshard");
        /* --stages auto|uniform|FILE */
        const char *k[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--stages",
                           "uniform", "--dp", "2", "--op", "2", "--pp", "2", "-o", out, NULL};
        run_ok(fx, k, &r);
        expect_exit(&r, 0);
        expect_in(&r, true, "stage 1 ");
        expect_in(&r, true, "logical mesh (2, 2)");
        /* Alpa's words for the same stages */
        expect_in(&r, true, "forward_stage_layer_ids  [[0], [1]]");
        expect_in(&r, true, "submesh_shapes           [(1, 4), (1, 4)]");
        expect_in(&r, true, "logical_mesh_shapes      [(2, 2), (2, 2)]");
        expect_in(&r, true,
                  "autosharding_options     [{force_batch_dim_to_mesh_dim: 0}, "
                  "{force_batch_dim_to_mesh_dim: 0}]");
        run_result_free(&r);
        const char *l[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--stages",
                           "auto", "-o", out, NULL};
        expect_success(fx, l, "predicted     iteration");
        const char *m[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--stages",
                           "uniform", "-o", out, NULL};
        expect_usage_error(fx, m, "need --dp, --op and --pp");
        const char *n[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:1", "--method",
                           "zero2", "--stages", "auto", "-o", out, NULL};
        expect_usage_error(fx, n, "--stages applies to --method pipeshard");
        /* Alpa's manual submesh choices: a list, checked against the cluster */
        const char *f[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2", "--layer-num",
                           "2", "--micro-batches", "16", "--submesh-choices", "1x4,2x8", "-o",
                           out, NULL};
        expect_success(fx, f, "predicted     iteration");
        const char *g[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2",
                           "--submesh-choices", "1x4,", "-o", out, NULL};
        expect_usage_error(fx, g, "ends with a comma");
        const char *h[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2",
                           "--submesh-choices", "some", "-o", out, NULL};
        expect_usage_error(fx, h, "--submesh-choices wants power_of_two");
        /* the user's text is quoted in the message, never read as a format */
        const char *h2[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2",
                            "--submesh-choices", "1x%s%s%s%n", "-o", out, NULL};
        expect_usage_error(fx, h2, "1x%s%s%s%n");
        const char *i[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2",
                           "--submesh-choices", "2x4", "-o", out, NULL};
        expect_failure(fx, i, "submesh 2x4 does not fit dgx-a100:2");
        const char *j[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100:2", "--method",
                           "data", "--submesh-choices", "all", "-o", out, NULL};
        expect_usage_error(fx, j, "apply to --method pipeshard");
    }
    {
        /* a stage file with a malformed stage: positioned error */
        char stages[512];
        snprintf(stages, sizeof stages, "%s/stages.json", fx->dir);
        FILE *f = fopen(stages, "w");
        assert_non_null(f);
        fputs("{\"format\": \"pipeshard-stages\", \"version\": 1,\n"
              " \"stages\": [{\"layers\": [0, 1], \"submesh\": [1],\n"
              "   \"logical_mesh\": [1, 8]}]}\n",
              f);
        fclose(f);
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100", "--stages", stages,
                           "-o", out, NULL};
        run_result r;
        expect_failure(fx, a, "stages.json:2:43: stages[0].submesh: expected two numbers");
        /* stages that overlap: the file and the overlap are named */
        f = fopen(stages, "w");
        fputs("{\"format\": \"pipeshard-stages\", \"version\": 1, \"layer_num\": \"manual\",\n"
              " \"stages\": [{\"layers\": [0, 1], \"submesh\": [1, 4], \"logical_mesh\": [4, 1]},\n"
              "  {\"layers\": [1, 1], \"submesh\": [1, 4], \"logical_mesh\": [1, 4]}]}\n",
              f);
        fclose(f);
        expect_failure(fx, a, "stages.json: stage 1 covers layers 1-1 (it overlaps stage 0, "
                              "which ends at layer 1)");
        /* and a good one */
        f = fopen(stages, "w");
        fputs("{\"format\": \"pipeshard-stages\", \"version\": 1, \"layer_num\": \"manual\",\n"
              " \"stages\": [{\"layers\": [0, 0], \"submesh\": [1, 4], \"logical_mesh\": [4, 1]},\n"
              "  {\"layers\": [1, 1], \"submesh\": [1, 4], \"logical_mesh\": [1, 4]}]}\n",
              f);
        fclose(f);
        run_ok(fx, a, &r);
        expect_exit(&r, 0);
        expect_in(&r, true, "method manual");
        expect_in(&r, true, "stage 1       layers 1-1 on devices 4-7");
        /* two stages: each prints what it sends the other per micro-batch */
        expect_in(&r, true, "sends ");
        expect_in(&r, true, "of activations on to the next stage per micro-batch");
        expect_in(&r, true, "of gradients back per micro-batch");
        run_result_free(&r);
        /* a stage says whether it recomputes; the loss's layer never does */
        f = fopen(stages, "w");
        fputs("{\"format\": \"pipeshard-stages\", \"version\": 1, \"layer_num\": \"manual\",\n"
              " \"stages\": [{\"layers\": [0, 0], \"submesh\": [1, 4], \"logical_mesh\": [4, 1],\n"
              "   \"remat\": true},\n"
              "  {\"layers\": [1, 1], \"submesh\": [1, 4], \"logical_mesh\": [1, 4]}]}\n",
              f);
        fclose(f);
        expect_success(fx, a, "recompute     layers 0\n");
        const char *all[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100", "--stages",
                             stages, "--remat", "-o", out, NULL};
        expect_success(fx, all, "recompute     layers 0\n");
        f = fopen(stages, "w");
        fputs("{\"format\": \"pipeshard-stages\", \"version\": 1, \"layer_num\": \"manual\",\n"
              " \"stages\": [{\"layers\": [0, 0], \"submesh\": [1, 4], \"logical_mesh\": [4, 1],\n"
              "   \"remat\": false},\n"
              "  {\"layers\": [1, 1], \"submesh\": [1, 4], \"logical_mesh\": [1, 4]}]}\n",
              f);
        fclose(f);
        /* --remat for the other stages: the loss's, which it leaves alone */
        run_ok(fx, all, &r);
        expect_exit(&r, 0);
        assert_false(contains(r.out, r.out_len, "recompute"));
        run_result_free(&r);
        f = fopen(stages, "w");
        fputs("{\"format\": \"pipeshard-stages\", \"version\": 1, \"layer_num\": \"manual\",\n"
              " \"stages\": [{\"layers\": [0, 1], \"submesh\": [1, 8], \"logical_mesh\": [8, 1],\n"
              "   \"remat\": 1}]}\n",
              f);
        fclose(f);
        expect_failure(fx, a, "stages.json:3:13: stages[0].remat: expected true or false");
    }
    {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100", "--explain",
                           "-o", out, NULL};
        expect_usage_error(fx, a, "--explain prints one stage's strategies");
    }
    {
        const char *a[] = {"plan", "--model", "mlp", "--cluster", "dgx-a100", "--method",
                           "data", "--layer-num", "2", "-o", out, NULL};
        expect_usage_error(fx, a, "apply to --method pipeshard");
    }
}

/* 4 devices of `memory` bytes on one node (a test device); `extra`: more
 * keys ("" for none) */
static void small_cluster(const char *path, const char *memory, const char *extra)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"name\": \"small4\", \"nodes\": 1, \"devices_per_node\": 4, \"device\": "
            "{\"name\": \"small\", \"peak_flops\": {\"fp32\": 1e13, \"fp16\": 4e13}, "
            "\"memory_bytes\": %s, \"memory_bandwidth_bytes_per_s\": 9e11}, "
            "\"intra_node\": {\"topology\": \"nvswitch\", \"bandwidth_bytes_per_s\": 1e11, "
            "\"latency_s\": 5e-6}, \"inter_node\": {\"topology\": \"fat-tree\", "
            "\"nics_per_node\": 1, \"nic_bandwidth_bytes_per_s\": 1e10, \"latency_s\": "
            "1e-5}%s}\n",
            memory, extra);
    fclose(f);
}

/* A plan made with twice the memory (PIPESHARD_PLAN_MEMORY_SCALE=2) on
 * 340 MiB devices: planned again, and the programs' peak printed is within
 * the memory; `estimate`: the warning gives the planner's estimate. */
static void expect_planned_again_to_fit(const fixture *fx, const char *const *args,
                                        bool estimate)
{
    setenv("PIPESHARD_PLAN_MEMORY_SCALE", "2", 1);
    run_result r;
    run_ok(fx, args, &r);
    unsetenv("PIPESHARD_PLAN_MEMORY_SCALE");
    expect_exit(&r, 0);
    if (estimate)
        expect_in(&r, false, "more than its 340.00 MiB (the planner estimated ");
    expect_in(&r, false, "planning again with ");
    expect_in(&r, true, " of its 340.00 MiB, exact from the lowered programs");
    const char *at = strstr(r.out, "programs      peak memory ");
    assert_non_null(at);
    double mib = atof(at + strlen("programs      peak memory "));
    assert_true(strstr(at, " MiB (device") != NULL && mib > 0 && mib <= 340.0);
    run_result_free(&r);
}

/* plan checks its lowered programs' exact peak against the devices' memory:
 * it prints it; a plan whose programs would not fit (here the test mode
 * that plans with twice the memory, a planner whose estimates were half
 * the truth) is planned again with less and fits; the plan keeps the
 * cluster's memory; where no plan fits the message says what was tried. */
/* Expert parallelism (a2a@axis: expert rows split by expert, tokens by
 * group): the lowering moves the expert operand's split to its groups
 * around the kernels, so the all-to-all is a resharding in the programs,
 * and the plan runs and agrees with the single-device step. Before, the
 * CPU kernels refused such a plan ("the expert tile and the token tile
 * hold different groups"), which plan and sim had accepted. */
static void test_moe_expert_parallel(void **state)
{
    const fixture *fx = *state;
    char cluster[512], plan[512], dump[512], kernels[600];
    snprintf(cluster, sizeof cluster, "%s/moe-host.json", fx->dir);
    snprintf(plan, sizeof plan, "%s/moe-a2a.json", fx->dir);
    snprintf(dump, sizeof dump, "%s/moe-a2a-programs", fx->dir);
    FILE *f = fopen(cluster, "w");
    assert_non_null(f);
    fputs("{\"name\": \"cpu-host\", \"nodes\": 1, \"devices_per_node\": 2, \"device\": "
          "{\"name\": \"cpu\", \"peak_flops\": {\"fp32\": 1.13e11, \"fp16\": 1.13e11, "
          "\"bf16\": 1.13e11}, \"memory_bytes\": 12638251008, "
          "\"memory_bandwidth_bytes_per_s\": 4.12e10}, \"intra_node\": {\"topology\": "
          "\"nvswitch\", \"bandwidth_bytes_per_s\": 2.0e10, \"latency_s\": 4.7e-06}, "
          "\"inter_node\": {\"topology\": \"fat-tree\", \"nics_per_node\": 1, "
          "\"nic_bandwidth_bytes_per_s\": 2.0e10, \"latency_s\": 4.7e-06}, "
          "\"shared_cores_per_node\": 2}\n",
          f);
    fclose(f);
    /* hidden 128: at 64, since a combine's gradient is charged its second
     * all-to-all, the ILP keeps the experts replicated */
    const char *a[] = {"plan", "--model", "moe-380m", "--hidden", "128", "--layers", "2",
                       "--heads", "4", "--seq", "32", "--vocab", "256", "--experts", "4",
                       "--expert-group", "32", "--dtype", "fp32", "--method", "shard", "--mesh",
                       "1x2", "--global-batch", "16", "--cluster-file", cluster,
                       "--dump-programs", dump, "-o", plan, NULL};
    expect_success(fx, a, "predicted     iteration");
    snprintf(kernels, sizeof kernels, "%s/kernels.txt", dump);
    size_t len = 0;
    char *text = read_file(kernels, &len);
    assert_non_null(text);
    if (strstr(text, "collective all-to-all axis 1 block1.dispatch") == NULL)
        fail_msg("the plan's dispatch is not expert-parallel (no all-to-all around it): the "
                 "test no longer covers it");
    free(text);
    char rm[700]; /* the fixture's teardown removes files, not directories */
    snprintf(rm, sizeof rm, "rm -rf '%s'", dump);
    assert_int_equal(system(rm), 0);
    const char *e[] = {"exec", "--plan", plan, "--check", NULL};
    run_result r;
    run_ok(fx, e, &r);
    expect_exit(&r, 0);
    expect_in(&r, true, "\n  ok\n");
    run_result_free(&r);
}

static void test_plan_memory_check(void **state)
{
    const fixture *fx = *state;
    char cluster[512], plan[512];
    snprintf(cluster, sizeof cluster, "%s/small4.json", fx->dir);
    snprintf(plan, sizeof plan, "%s/memory-plan.json", fx->dir);
    small_cluster(cluster, "356515840", ""); /* 340 MiB */
#define SMALL_SHARD                                                                           \
    "plan", "--model", "gpt-350m", "--layers", "8", "--hidden", "512", "--heads", "8", "--seq", \
        "256", "--vocab", "4096", "--global-batch", "64", "--micro-batches", "4", "--method",  \
        "shard", "--cluster-file", cluster, "-o", plan
    {
        const char *a[] = {SMALL_SHARD, NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 0);
        expect_in(&r, true, "programs      peak memory ");
        expect_in(&r, true, " of its 340.00 MiB, exact from the lowered programs");
        if (contains(r.err, r.err_len, "planning again"))
            fail_msg("planned again with the true memory:\n%s", r.err);
        run_result_free(&r);
    }
    {
        const char *a[] = {SMALL_SHARD, NULL};
        expect_planned_again_to_fit(fx, a, true);
        ps_json_doc *doc = NULL;
        assert_int_equal(ps_json_doc_load(plan, &doc, NULL), PS_OK);
        json_t *dev = json_object_get(json_object_get(doc->root, "cluster"), "device");
        assert_true(json_number_value(json_object_get(dev, "memory_bytes")) == 356515840.0);
        ps_json_doc_free(doc);
    }
    /* a kind no device is (100 MiB) changes nothing: the cut follows the
     * failing device's kind */
    small_cluster(cluster, "356515840",
                  ", \"device_kinds\": [{\"name\": \"tiny\", \"peak_flops\": {\"fp32\": "
                  "1e12}, \"memory_bytes\": 104857600, \"memory_bandwidth_bytes_per_s\": "
                  "1e11}]");
    {
        const char *a[] = {SMALL_SHARD, NULL};
        expect_planned_again_to_fit(fx, a, false);
    }
    small_cluster(cluster, "356515840", "");
    /* --no-memory-check: the first plan, unchecked */
    setenv("PIPESHARD_PLAN_MEMORY_SCALE", "2", 1);
    {
        const char *a[] = {SMALL_SHARD, "--no-memory-check", NULL};
        run_result r;
        run_ok(fx, a, &r);
        expect_exit(&r, 0);
        if (contains(r.out, r.out_len, "programs      peak memory") ||
            contains(r.err, r.err_len, "planning again"))
            fail_msg("checked with --no-memory-check:\n%s%s", r.out, r.err);
        run_result_free(&r);
    }
    setenv("PIPESHARD_PLAN_MEMORY_SCALE", "0.5", 1);
    {
        const char *a[] = {SMALL_SHARD, NULL};
        expect_failure(fx, a, "PIPESHARD_PLAN_MEMORY_SCALE needs a number in [1, 10], not "
                              "\"0.5\"");
    }
    unsetenv("PIPESHARD_PLAN_MEMORY_SCALE");
    /* no plan fits 220 MiB: planned again, then the reason, with what was tried */
    small_cluster(cluster, "230686720", "");
    setenv("PIPESHARD_PLAN_MEMORY_SCALE", "2", 1);
    {
        const char *a[] = {SMALL_SHARD, NULL};
        run_result r;
        run_ok(fx, a, &r);
        unsetenv("PIPESHARD_PLAN_MEMORY_SCALE");
        expect_exit(&r, 1);
        expect_in(&r, false, "more than its 220.00 MiB");
        expect_in(&r, false, "a plan's programs did not fit in memory, and planning again "
                             "with ");
        run_result_free(&r);
    }
#undef SMALL_SHARD
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph_manifest),
        cmocka_unit_test(test_cluster_manifest),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_plan_names_recomputed_layers),
        cmocka_unit_test(test_missing_graph_file),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_unknown_model),
        cmocka_unit_test(test_graph_json_gpt175b),
        cmocka_unit_test(test_remat_layers),
        cmocka_unit_test(test_contradicting_options),
        cmocka_unit_test(test_iteration_limit),
        cmocka_unit_test(test_show_candidates),
        cmocka_unit_test(test_check_rounding),
        cmocka_unit_test(test_check_held_dtypes),
        cmocka_unit_test(test_later_layer_read),
        cmocka_unit_test(test_whole_cluster_submesh),
        cmocka_unit_test(test_memory_refusals_say_where),
        cmocka_unit_test(test_loss_scale),
        cmocka_unit_test(test_export_round_trip),
        cmocka_unit_test(test_export_stdout),
        cmocka_unit_test(test_outputs_checked_first),
        cmocka_unit_test(test_clusters),
        cmocka_unit_test(test_demo),
#ifdef PS_NO_SIMGRID
        cmocka_unit_test(test_sim_without_simgrid),
#else
        cmocka_unit_test(test_sim_node_collectives),
        cmocka_unit_test(test_sim_predicted_split),
#endif
        cmocka_unit_test(test_predict),
        cmocka_unit_test(test_predict_shared_cores),
        cmocka_unit_test(test_plan_absurd_cluster),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_plan_memory_check),
        cmocka_unit_test(test_moe_expert_parallel),
    };
    /* PS_TEST_FILTER=test_name (a cmocka pattern) runs some of them */
    const char *only = getenv("PS_TEST_FILTER");
    if (only != NULL && only[0] != '\0')
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
