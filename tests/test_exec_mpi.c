/* exec across hosts: `mpirun -np 2 pipeshard exec` runs a plan of two
 * 2-device nodes as two processes (exec/hosts.c, the CPU backend over MPI).
 * The losses equal the single-process run's bit for bit (the same rank-order
 * sums), --check passes, rank 0 writes a summary and a trace of all four
 * devices; a wrong process count is refused and a failing device stops both
 * processes with a message naming its rank and device. The CUDA backend
 * runs and fails the same way where there is a GPU (two processes sharing
 * it). Skipped (77) where
 * the build has no MPI or no Open MPI mpirun. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec/hosts.h"
#include "traces/summary.h"
#include "traces/trace_read.h"

#ifndef PS_MPIRUN_BIN
#define PS_MPIRUN_BIN ""
#endif

static char dir[256];

/* Runs a shell command (under `timeout`, so a hang fails instead of
 * stalling) and returns its exit status; *out gets stdout and stderr. */
static int sh(char **out, const char *fmt, ...)
{
    char cmd[2400], inner[1800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(inner, sizeof inner, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "cd %s && timeout -s KILL 240 sh -c '%s' 2>&1", dir, inner);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (len + 1 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    buf[len] = '\0';
    int status = pclose(p);
    if (out != NULL)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The "step N: loss X" lines of an exec run, concatenated, without the
 * step's time at their end (" (T ms)"). */
static void loss_lines(const char *out, char *dst, size_t size)
{
    dst[0] = '\0';
    size_t used = 0;
    for (const char *p = strstr(out, "step "); p != NULL; p = strstr(p + 1, "step ")) {
        if (p != out && p[-1] != '\n')
            continue;
        const char *e = strchr(p, '\n');
        size_t n = e != NULL ? (size_t)(e - p) : strlen(p);
        for (size_t k = n; k > 0; k--)
            if (p[k - 1] == '(') { /* the time */
                n = k > 1 ? k - 2 : 0;
                break;
            }
        if (used + n + 2 < size) {
            memcpy(dst + used, p, n);
            used += n;
            dst[used++] = '|';
            dst[used] = '\0';
        }
    }
}

static void no_sanitizer_report(const char *out)
{
    if (strstr(out, "Sanitizer") != NULL || strstr(out, "runtime error:") != NULL)
        fail_msg("sanitizer report:\n%s", out);
}

#define MPIRUN PS_MPIRUN_BIN " -np %d --oversubscribe"

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/ps-test-mpi-XXXXXX", tmp != NULL ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL)
        return -1;
    /* two nodes of two devices: every cross-node transfer crosses processes */
    char path[512];
    snprintf(path, sizeof path, "%s/cluster-2x2.json", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fputs("{\"name\": \"cpu-2x2\", \"nodes\": 2, \"devices_per_node\": 2,\n"
          " \"device\": \"v100-sxm2-16gb\",\n"
          " \"intra_node\": {\"topology\": \"nvlink-ring\", \"bandwidth_bytes_per_s\": 150e9,"
          " \"latency_s\": 2e-6},\n"
          " \"inter_node\": {\"topology\": \"fat-tree\", \"nics_per_node\": 1,"
          " \"nic_bandwidth_bytes_per_s\": 3.125e9, \"latency_s\": 25e-6}}\n",
          f);
    fclose(f);
    /* mpirun as root needs these (Open MPI); LeakSanitizer would report
     * Open MPI's own allocations */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char *out = NULL;
    sh(&out, "rm -rf %s", dir);
    free(out);
    return 0;
}

#define SMALL_GPT                                                                            \
    "--model gpt-350m --layers 2 --hidden 64 --heads 4 --seq 16 --vocab 128 --ffn 256 "   \
    "--dtype fp32 --cluster-file cluster-2x2.json --global-batch 8 --micro-batches 2"

/* One plan: single process, then two processes; the same losses, --check
 * ok, and rank 0's summary and trace cover all four devices. */
static void run_both(const char *name, const char *method_args)
{
    char *out = NULL;
    int rc = sh(&out, "%s plan " SMALL_GPT " %s -o %s.json", PS_PIPESHARD_BIN, method_args, name);
    if (rc != 0)
        fail_msg("plan %s: exit %d\n%s", name, rc, out);
    free(out);
    rc = sh(&out, "%s exec --plan %s.json --steps 2", PS_PIPESHARD_BIN, name);
    if (rc != 0)
        fail_msg("exec %s: exit %d\n%s", name, rc, out);
    char single[512], multi[512];
    loss_lines(out, single, sizeof single);
    free(out);
    rc = sh(&out,
            MPIRUN " %s exec --plan %s.json --steps 2 --check --summary %s-sum.json --trace "
                   "%s-trace.json",
            2, PS_PIPESHARD_BIN, name, name, name);
    if (rc != 0 || strstr(out, "2 hosts (MPI)") == NULL || strstr(out, "  ok") == NULL)
        fail_msg("mpirun exec %s: exit %d\n%s", name, rc, out);
    no_sanitizer_report(out);
    loss_lines(out, multi, sizeof multi);
    printf("  %-8s %s\n", name, multi);
    if (strstr(method_args, "--dynamic-loss-scale") != NULL &&
        (strstr(multi, "at loss scale 5.49756e+11: a gradient overflowed, update skipped") == NULL ||
         strstr(out, "loss scale  2 of 2 steps skipped, the reference 2") == NULL))
        fail_msg("%s: the steps were not skipped as expected:\n%s", name, out);
    if (strlen(single) < 20 || strcmp(single, multi) != 0)
        fail_msg("%s: losses differ: one process \"%s\", two \"%s\"", name, single, multi);
    free(out);

    char path[512];
    ps_error err = {0};
    ps_summary *s = NULL;
    snprintf(path, sizeof path, "%s/%s-sum.json", dir, name);
    if (ps_summary_load(path, &s, &err) != PS_OK)
        fail_msg("%s: %s", name, err.msg);
    assert_int_equal(ps_summary_validate(s, &err), PS_OK);
    assert_int_equal(s->n_devices, 4);
    for (int d = 0; d < 4; d++) { /* rank 1's devices reported too */
        assert_true(s->devices[d].peak_memory_bytes > 0);
        assert_true(s->devices[d].compute_s > 0);
    }
    assert_true(s->iteration_s > 0);
    ps_summary_free(s);
    ps_trace_data *t = NULL;
    snprintf(path, sizeof path, "%s/%s-trace.json", dir, name);
    if (ps_trace_load(path, &t, &err) != PS_OK)
        fail_msg("%s: %s", name, err.msg);
    bool seen[4] = {false};
    for (int i = 0; i < t->n_spans; i++)
        if (t->spans[i].device >= 0 && t->spans[i].device < 4)
            seen[t->spans[i].device] = true;
    for (int d = 0; d < 4; d++)
        if (!seen[d])
            fail_msg("%s: the trace has no span of device %d", name, d);
    ps_trace_data_free(t);
}

/* A device of rank 1 (its peers on rank 0 wait for its activations'
 * gradient), then one of rank 0, fails in its first backward op: both
 * processes stop, and the message names the rank, the device and why. */
static void expect_failure_stops_both(const char *plan, const char *backend_args)
{
    const int devices[] = {3, 0};
    for (int i = 0; i < 2; i++) {
        int d = devices[i];
        char *out = NULL;
        int rc = sh(&out,
                    "PIPESHARD_FAIL_DEVICE=%d " MPIRUN " -x PIPESHARD_FAIL_DEVICE %s exec --plan "
                    "%s %s --steps 2",
                    d, 2, PS_PIPESHARD_BIN, plan, backend_args);
        char rank[32], device[32];
        snprintf(rank, sizeof rank, "rank %d of 2", d / 2);
        snprintf(device, sizeof device, "device %d", d);
        if (rc == 0 || rc == 128 + 9 || strstr(out, rank) == NULL ||
            strstr(out, device) == NULL || strstr(out, "injected failure") == NULL)
            fail_msg("%s %s: failure on device %d: exit %d\n%s", plan, backend_args, d, rc, out);
        free(out);
    }
}

static void test_plans_across_hosts(void **state)
{
    (void)state;
    /* a pipeline whose stages are the two hosts (tensor parallel inside) */
    run_both("uniform", "--method uniform --dp 1 --op 2 --pp 2");
    /* all-reduces over both hosts, two members local and two remote */
    run_both("data", "--method data");
    /* all-gathers and reduce-scatters over both hosts */
    run_both("zero3", "--method zero3");
    /* dynamic loss scaling: the overflow vote spans both hosts; fp16 from 2^40
     * skips both steps in both runs (the loss lines carry scales and skips) */
    run_both("dynamic", "--method uniform --dp 1 --op 2 --pp 2 --dtype fp16 --loss-scale 0x1p40 "
                        "--dynamic-loss-scale");
}

/* Idle seconds of each of the trace's first 4 devices. */
static void idle_per_device(const char *name, double idle_s[4])
{
    char path[512];
    ps_error err = {0};
    ps_trace_data *t = NULL;
    snprintf(path, sizeof path, "%s/%s-trace.json", dir, name);
    if (ps_trace_load(path, &t, &err) != PS_OK)
        fail_msg("%s: %s", name, err.msg);
    for (int d = 0; d < 4; d++)
        idle_s[d] = 0;
    for (int i = 0; i < t->n_spans; i++)
        if (t->spans[i].category == PS_TRACE_IDLE && t->spans[i].device >= 0 &&
            t->spans[i].device < 4)
            idle_s[t->spans[i].device] += t->spans[i].duration_s;
    ps_trace_data_free(t);
}

/* A device of one process starts its step 1 s late (PIPESHARD_STRAGGLER):
 * its peers in the other process wait for it, in the data-parallel plan's
 * all-reduces over both hosts and in the pipeline's receives from the first
 * host, and that wait is idle time, not communication, as within one
 * process (the processes exchange their step's events). */
static void test_waits_across_hosts(void **state)
{
    (void)state;
    static const struct {
        const char *name, *method;
        int straggler, waiting[2];
    } cases[] = {{"wait-data", "--method data", 3, {0, 1}},
                 {"wait-pipe", "--method uniform --dp 1 --op 2 --pp 2", 0, {2, 3}}};
    /* long beside the transfers' own time: up to 0.15 s per device and step
     * under ThreadSanitizer on a loaded machine */
    const double straggle_s = 1.0;
    for (int k = 0; k < 2; k++) {
        char *out = NULL;
        int rc = sh(&out, "%s plan " SMALL_GPT " %s -o %s.json", PS_PIPESHARD_BIN, cases[k].method,
                    cases[k].name);
        if (rc != 0)
            fail_msg("plan %s: exit %d\n%s", cases[k].name, rc, out);
        free(out);
        rc =
            sh(&out,
               "PIPESHARD_STRAGGLER=%d:%g " MPIRUN " -x PIPESHARD_STRAGGLER %s exec --plan %s.json "
               "--summary %s-sum.json --trace %s-trace.json",
               cases[k].straggler, straggle_s, 2, PS_PIPESHARD_BIN, cases[k].name, cases[k].name,
               cases[k].name);
        if (rc != 0)
            fail_msg("mpirun exec %s: exit %d\n%s", cases[k].name, rc, out);
        no_sanitizer_report(out);
        free(out);
        char path[512];
        ps_error err = {0};
        ps_summary *s = NULL;
        snprintf(path, sizeof path, "%s/%s-sum.json", dir, cases[k].name);
        if (ps_summary_load(path, &s, &err) != PS_OK)
            fail_msg("%s: %s", cases[k].name, err.msg);
        double idle_s[4];
        idle_per_device(cases[k].name, idle_s);
        for (int i = 0; i < 2; i++) {
            int d = cases[k].waiting[i];
            printf("  %s: device %d waited %.1f ms, communicated %.1f ms\n", cases[k].name, d,
                   idle_s[d] * 1e3, s->devices[d].comm_s * 1e3);
            if (!(idle_s[d] >= 0.8 * straggle_s) || !(s->devices[d].comm_s < straggle_s / 2))
                fail_msg("%s: device %d (rank %d) idled %.1f ms and communicated %.1f ms beside "
                         "device %d's %.0f ms late start on rank %d",
                         cases[k].name, d, d / 2, idle_s[d] * 1e3, s->devices[d].comm_s * 1e3,
                         cases[k].straggler, straggle_s * 1e3, cases[k].straggler / 2);
        }
        ps_summary_free(s);
    }
    /* the test mode's own input */
    char *out = NULL;
    int rc = sh(&out, "PIPESHARD_STRAGGLER=3 %s exec --plan wait-data.json", PS_PIPESHARD_BIN);
    if (rc != 1 ||
        strstr(out, "PIPESHARD_STRAGGLER needs DEVICE:SECONDS (up to 60 s), not \"3\"") == NULL)
        fail_msg("PIPESHARD_STRAGGLER=3: exit %d\n%s", rc, out);
    free(out);
}

static void test_wrong_process_count(void **state)
{
    (void)state;
    char *out = NULL;
    int rc = sh(&out, "%s plan " SMALL_GPT " --method data -o count.json", PS_PIPESHARD_BIN);
    assert_int_equal(rc, 0);
    free(out);
    rc = sh(&out, MPIRUN " %s exec --plan count.json", 3, PS_PIPESHARD_BIN);
    if (rc == 0 || strstr(out, "span 2 hosts") == NULL ||
        strstr(out, "start one per host (mpirun -np 2)") == NULL)
        fail_msg("three processes for two hosts: exit %d\n%s", rc, out);
    free(out);
}

/* The CUDA backend across hosts, its devices sharing GPU 0 (two processes
 * on one machine): the losses of the single-process run, --check ok. Where
 * there is no GPU (or no CUDA in the build), both processes stop with the
 * reason instead, and the rest is skipped. */
static void test_cuda_across_hosts(void **state)
{
    (void)state;
    static const char *const plans[][2] = {
        {"cu-uniform", "--method uniform --dp 1 --op 2 --pp 2"},
        {"cu-zero3", "--method zero3"},
    };
    char *out = NULL;
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
        int rc = sh(&out, "%s plan " SMALL_GPT " %s -o %s.json", PS_PIPESHARD_BIN, plans[i][1],
                    plans[i][0]);
        if (rc != 0)
            fail_msg("plan %s: exit %d\n%s", plans[i][0], rc, out);
        free(out);
    }
    int rc = sh(&out, "%s exec --plan cu-uniform.json --backend cuda --share-gpu --steps 2",
                PS_PIPESHARD_BIN);
    const char *reasons[] = {"no usable GPU", "not available in this build"};
    const char *reason = NULL;
    for (int k = 0; k < 2; k++)
        if (rc != 0 && strstr(out, reasons[k]) != NULL)
            reason = reasons[k];
    if (rc != 0 && reason == NULL)
        fail_msg("exec --backend cuda: exit %d\n%s", rc, out);
    free(out);
    if (reason != NULL) {
        rc = sh(&out, MPIRUN " %s exec --plan cu-uniform.json --backend cuda --share-gpu", 2,
                PS_PIPESHARD_BIN);
        if (rc == 0 || rc == 128 + 9 || strstr(out, reason) == NULL ||
            strstr(out, " of 2: ") == NULL)
            fail_msg("cuda across hosts without a GPU: exit %d\n%s", rc, out);
        free(out);
        skip();
    }
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
        const char *name = plans[i][0];
        rc = sh(&out, "%s exec --plan %s.json --backend cuda --share-gpu --steps 2",
                PS_PIPESHARD_BIN, name);
        if (rc != 0)
            fail_msg("exec %s on cuda: exit %d\n%s", name, rc, out);
        char single[512], multi[512];
        loss_lines(out, single, sizeof single);
        free(out);
        rc = sh(&out, MPIRUN " %s exec --plan %s.json --backend cuda --share-gpu --steps 2 --check",
                2, PS_PIPESHARD_BIN, name);
        if (rc != 0 || strstr(out, "2 hosts (MPI)") == NULL || strstr(out, "  ok") == NULL)
            fail_msg("mpirun exec %s on cuda: exit %d\n%s", name, rc, out);
        loss_lines(out, multi, sizeof multi);
        printf("  %-10s %s\n", name, multi);
        /* the host-combined collectives add in member order, as share mode
         * does on the GPU */
        if (strlen(single) < 20 || strcmp(single, multi) != 0)
            fail_msg("%s on cuda: losses differ: one process \"%s\", two \"%s\"", name, single,
                     multi);
        free(out);
    }
    expect_failure_stops_both("cu-uniform.json", "--backend cuda --share-gpu");
    /* each process on GPUs of its own: refused where the machine has too few */
    rc = sh(&out, MPIRUN " %s exec --plan cu-uniform.json --backend cuda", 2, PS_PIPESHARD_BIN);
    if (rc != 0 && (rc == 128 + 9 || strstr(out, "start one process per host") == NULL))
        fail_msg("cuda across hosts on their own GPUs: exit %d\n%s", rc, out);
    free(out);
}

static void test_failure_stops_every_host(void **state)
{
    (void)state;
    char *out = NULL;
    int rc = sh(&out, "%s plan " SMALL_GPT " --method uniform --dp 1 --op 2 --pp 2 -o fail.json",
                PS_PIPESHARD_BIN);
    assert_int_equal(rc, 0);
    free(out);
    expect_failure_stops_both("fail.json", "");
}

/* Rank 1's host has too little memory for its devices (test mode
 * PIPESHARD_HOST_MEMORY, set on rank 1 only; OMPI_COMM_WORLD_RANK is Open
 * MPI's, which main() requires): both processes stop before the run and in
 * order, rank 1 saying by how much, rank 0 naming host 1; no hang. */
static void test_memory_refusal_stops_every_host(void **state)
{
    (void)state;
    char *out = NULL;
    int rc = sh(&out, "%s plan " SMALL_GPT " --method data -o memory.json", PS_PIPESHARD_BIN);
    assert_int_equal(rc, 0);
    free(out);
    rc = sh(&out,
            MPIRUN " sh -c \"if [ \\$OMPI_COMM_WORLD_RANK = 1 ]; then export "
                   "PIPESHARD_HOST_MEMORY=1000; fi; exec %s exec --plan memory.json\"",
            2, PS_PIPESHARD_BIN);
    /* both stop in order (no MPI_Abort), each saying why */
    if (rc != 1 || strstr(out, "rank 1 of 2: the plan's 2 CPU devices hold") == NULL ||
        strstr(out, "of host memory allowed") == NULL ||
        strstr(out, "rank 0 of 2: host 1 refused the run") == NULL ||
        strstr(out, "MPI_ABORT") != NULL)
        fail_msg("rank 1 short of memory: exit %d\n%s", rc, out);
    no_sanitizer_report(out);
    printf("  %s", out);
    free(out);
}

int main(void)
{
    if (!ps_hosts_have_mpi()) {
        printf("skipped: this build has no MPI\n");
        return 77;
    }
    if (PS_MPIRUN_BIN[0] == '\0' || access(PS_MPIRUN_BIN, X_OK) != 0) {
        printf("skipped: no mpirun found at build time\n");
        return 77;
    }
    char *out = NULL;
    snprintf(dir, sizeof dir, "/");
    sh(&out, PS_MPIRUN_BIN " --version");
    bool open_mpi = out != NULL && strstr(out, "Open MPI") != NULL;
    free(out);
    if (!open_mpi) {
        printf("skipped: the test passes Open MPI's mpirun options; %s is another MPI\n",
               PS_MPIRUN_BIN);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plans_across_hosts),
        cmocka_unit_test(test_waits_across_hosts),
        cmocka_unit_test(test_wrong_process_count),
        cmocka_unit_test(test_cuda_across_hosts),
        cmocka_unit_test(test_failure_stops_every_host),
        cmocka_unit_test(test_memory_refusal_stops_every_host),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
