/* exec/memory_need.c: the memory a run will take, known before it starts.
 * For every model family and method, held in half precision and in fp32,
 * with and without in-place accumulation and the overflow vote, the need of
 * every device equals the peak the backend counted in a real run (bytes,
 * exactly); a host with less memory than the devices need is refused before
 * anything is allocated, with the numbers; --no-memory-check runs anyway.
 * The host's available memory takes its control group's limit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/bytes_text.h"
#include "exec/cpu/host_memory.h"
#include "exec/memory_need.h"
#include "tests/exec_fixture.h"

/* ---- backend adjustments (the fixture's `adjust` hook) ---- */

static ps_backend_ops scratch_ops;  /* op_accumulates withheld: every later add takes scratch */
static int64_t host_memory = -1;    /* ps_cpu_backend_set_host_memory, -1: leave */
static int allocs_seen;
static const ps_backend_ops *counted;
static ps_backend_ops counting_ops;

static ps_status counting_alloc(ps_backend *b, int device, int64_t bytes, void **out,
                                ps_error *err)
{
    __atomic_fetch_add(&allocs_seen, 1, __ATOMIC_RELAXED);
    return counted->alloc(b, device, bytes, out, err);
}

static void limit_host(ps_backend *b)
{
    if (host_memory >= 0)
        ps_cpu_backend_set_host_memory(b, host_memory);
    counted = b->ops;
    counting_ops = *b->ops;
    counting_ops.alloc = counting_alloc;
    b->ops = &counting_ops;
}

static void withhold_in_place(ps_backend *b)
{
    scratch_ops = *b->ops;
    scratch_ops.op_accumulates = NULL;
    b->ops = &scratch_ops;
}

/* The needs of a plan's devices on a CPU backend held as `fp32_storage`
 * says, with or without in-place accumulation. */
static void needs_of(const ps_program_set *set, bool fp32_storage, bool in_place, int64_t *need)
{
    ps_backend *b = NULL;
    ps_error err = {0};
    assert_int_equal(ps_cpu_backend_create(set->n_devices, NULL, NULL, &b, &err), PS_OK);
    const ps_backend_ops *own = b->ops;
    if (fp32_storage)
        b->half_storage = false;
    if (!in_place)
        withhold_in_place(b);
    for (int d = 0; d < set->n_devices; d++)
        if (ps_exec_memory_need(set, b, d, &need[d], &err) != PS_OK)
            fail_msg("device %d: %s", d, err.msg);
    b->ops = own;
    b->ops->destroy(b);
}

typedef struct need_case {
    const char *model;
    method mth;
    ps_dtype dtype;
    bool dynamic;     /* dynamic loss scaling: the overflow vote */
    bool fp32_storage;
    bool in_place;    /* the backend adds accumulated gradients in place */
} need_case;

static void expect_need_is_peak(const ps_cluster *c, const need_case *k)
{
    ps_model_config cfg;
    small_config(k->model, &cfg);
    cfg.dtype = k->dtype;
    ps_train_options t = ps_train_options_default();
    if (k->dynamic) {
        t.dynamic_loss_scale = true;
        t.loss_scale = 1024;
        t.loss_scale_window = 100;
    }
    ps_plan *p = plan_trained(&cfg, k->mth, false, c, &t);
    ps_exec_options o = ps_exec_options_default();
    o.steps = 2;
    o.warmup_steps = 1;
    run r;
    ps_error err = {0};
    char what[96];
    snprintf(what, sizeof what, "%s %s %s%s%s%s", k->model, method_names[k->mth],
             ps_dtype_name(k->dtype), k->dynamic ? " dynamic" : "",
             k->fp32_storage ? " held in fp32" : "", k->in_place ? "" : " scratch");
    if (run_plan_adjusted(p, &o, k->fp32_storage, k->in_place ? NULL : withhold_in_place, &r,
                          &err) != PS_OK)
        fail_msg("%s: %s", what, err.msg);
    int64_t *need = calloc((size_t)r.set->n_devices, sizeof *need);
    assert_non_null(need);
    needs_of(r.set, k->fp32_storage, k->in_place, need);
    int64_t most = 0;
    for (int d = 0; d < r.set->n_devices; d++) {
        int64_t peak = (int64_t)r.r->summary->devices[d].peak_memory_bytes;
        if (need[d] != peak)
            fail_msg("%s device %d: need %lld bytes, the run's peak %lld", what, d,
                     (long long)need[d], (long long)peak);
        most = need[d] > most ? need[d] : most;
    }
    assert_true(most > 0);
    printf("  %-44s %d devices, the most %lld bytes: need = peak\n", what, r.set->n_devices,
           (long long)most);
    free(need);
    run_free(&r);
    ps_plan_free(p);
}

static void test_need_is_the_peak(void **state)
{
    (void)state;
    ps_cluster *c = cluster_8();
    const need_case cases[] = {
        {"mlp", M_DATA, PS_DTYPE_F32, false, false, true},
        {"mlp", M_ZERO3, PS_DTYPE_F32, false, false, true},
        {"mlp", M_SHARD, PS_DTYPE_F32, false, false, true},
        {"mlp", M_UNIFORM, PS_DTYPE_F32, false, false, true},
        {"mlp", M_AUTO, PS_DTYPE_F32, false, false, true},
        {"gpt-350m", M_UNIFORM, PS_DTYPE_F32, false, false, true},
        {"gpt-350m", M_UNIFORM, PS_DTYPE_F32, false, false, false},
        {"gpt-350m", M_DATA, PS_DTYPE_F32, false, false, false},
        {"gpt-350m", M_UNIFORM, PS_DTYPE_F16, true, false, true},
        {"gpt-350m", M_UNIFORM, PS_DTYPE_BF16, false, false, true},
        {"gpt-350m", M_UNIFORM, PS_DTYPE_BF16, false, true, true},
        {"moe-380m", M_UNIFORM, PS_DTYPE_F32, false, false, true},
        {"wresnet-250m", M_UNIFORM, PS_DTYPE_F32, false, false, true},
        {"wresnet-250m", M_DATA, PS_DTYPE_F32, false, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_need_is_peak(c, &cases[i]);
    ps_cluster_free(c);
}

/* A host with one byte less than the devices need is refused before any
 * allocation, and the message gives the need, the largest device and the
 * memory; with exactly the need, or without the check, the run goes on. */
static void test_refused_when_short(void **state)
{
    (void)state;
    ps_cluster *c = cluster_8();
    ps_model_config cfg;
    small_config("gpt-350m", &cfg);
    ps_plan *p = plan_of(&cfg, M_UNIFORM, false, c);
    ps_exec_options o = ps_exec_options_default();
    run r;
    ps_error err = {0};
    host_memory = -1;
    if (run_plan_adjusted(p, &o, false, limit_host, &r, &err) != PS_OK)
        fail_msg("%s", err.msg);
    int64_t total = 0, most = 0;
    int at = -1;
    for (int d = 0; d < r.set->n_devices; d++) {
        int64_t peak = (int64_t)r.r->summary->devices[d].peak_memory_bytes;
        total += peak;
        if (peak > most) {
            most = peak;
            at = d;
        }
    }
    run_free(&r);
    assert_true(total > 0);

    host_memory = total - 1;
    allocs_seen = 0;
    ps_status st = run_plan_adjusted(p, &o, false, limit_host, &r, &err);
    assert_int_equal(st, PS_ERR_NOMEM);
    assert_int_equal(allocs_seen, 0);
    char want[160], t[32];
    snprintf(want, sizeof want, "the plan's 8 CPU devices hold %s of tiles at the peak",
             ps_bytes_text((double)total, t, sizeof t));
    if (strstr(err.msg, want) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", err.msg, want);
    snprintf(want, sizeof want, "(device %d the most: %s)", at,
             ps_bytes_text((double)most, t, sizeof t));
    if (strstr(err.msg, want) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", err.msg, want);
    snprintf(want, sizeof want, "more than the %s of host memory allowed",
             ps_bytes_text((double)(total - 1), t, sizeof t));
    if (strstr(err.msg, want) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", err.msg, want);
    assert_non_null(strstr(err.msg, "--no-memory-check"));
    run_free(&r);

    o.skip_memory_check = true;
    if (run_plan_adjusted(p, &o, false, limit_host, &r, &err) != PS_OK)
        fail_msg("without the check: %s", err.msg);
    assert_true(allocs_seen > 0);
    run_free(&r);

    o.skip_memory_check = false;
    host_memory = total;
    if (run_plan_adjusted(p, &o, false, limit_host, &r, &err) != PS_OK)
        fail_msg("with exactly the need: %s", err.msg);
    run_free(&r);
    host_memory = -1;
    ps_plan_free(p);
    ps_cluster_free(c);
}

/* A device outside the plan is an error, not a read past the programs. */
static void test_bad_device(void **state)
{
    (void)state;
    ps_cluster *c = cluster_8();
    ps_model_config cfg;
    small_config("mlp", &cfg);
    ps_plan *p = plan_of(&cfg, M_DATA, false, c);
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_error err = {0};
    ps_lower_options lo = ps_lower_options_default();
    assert_int_equal(ps_plan_model_build(p, &m, &err), PS_OK);
    assert_int_equal(ps_plan_lower(p, m, &lo, &set, &err), PS_OK);
    ps_backend *b = NULL;
    assert_int_equal(ps_cpu_backend_create(set->n_devices, NULL, NULL, &b, &err), PS_OK);
    int64_t need = 7;
    assert_int_equal(ps_exec_memory_need(set, b, set->n_devices, &need, &err), PS_ERR_INVALID);
    assert_int_equal(need, 0);
    assert_non_null(strstr(err.msg, "no device 8"));
    assert_int_equal(ps_exec_memory_need(set, b, -1, &need, &err), PS_ERR_INVALID);
    b->ops->destroy(b);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);
    ps_cluster_free(c);
}

/* ---- the host's memory: control group limits ---- */

static char cg_root[256];

static void put(const char *rel, const char *text)
{
    char path[512], cmd[600];
    snprintf(path, sizeof path, "%s/%s", cg_root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The least room (limit - usage) over a group and its ancestors, version 1
 * and 2 (also under unified/); no limit, "max" and malformed lines: none. */
static void test_cgroup_room(void **state)
{
    (void)state;
    snprintf(cg_root, sizeof cg_root, "/tmp/ps-cgroup-XXXXXX");
    assert_non_null(mkdtemp(cg_root));
    /* version 1: the parent leaves less than the group itself */
    put("memory/a/b/memory.limit_in_bytes", "1000000\n");
    put("memory/a/b/memory.usage_in_bytes", "400000\n");
    put("memory/a/memory.limit_in_bytes", "800000\n");
    put("memory/a/memory.usage_in_bytes", "500000\n");
    put("memory/memory.limit_in_bytes", "9223372036854771712\n"); /* no limit */
    assert_int_equal(ps_cgroup_memory_room("4:memory:/a/b\n0::/\n", cg_root), 300000);
    assert_int_equal(ps_cgroup_memory_room("4:cpu,memory:/a/b/\n", cg_root), 300000);
    /* a controller list without memory, and the root group: no limit */
    assert_int_equal(ps_cgroup_memory_room("4:cpu:/a/b\n", cg_root), -1);
    assert_int_equal(ps_cgroup_memory_room("4:memory:/\n", cg_root), -1);
    /* version 2: "max" above, a limit below; usage over the limit: no room */
    put("x/memory.max", "max\n");
    put("x/y/memory.max", "2000000\n");
    put("x/y/memory.current", "500000\n");
    assert_int_equal(ps_cgroup_memory_room("0::/x/y\n", cg_root), 1500000);
    put("x/y/memory.current", "2500000\n");
    assert_int_equal(ps_cgroup_memory_room("0::/x/y\n", cg_root), 0);
    /* version 2 mounted under unified/ (a hybrid system) */
    put("unified/u/memory.max", "4096\n");
    put("unified/u/memory.current", "1024\n");
    assert_int_equal(ps_cgroup_memory_room("0::/u", cg_root), 3072);
    /* both: the least */
    assert_int_equal(ps_cgroup_memory_room("4:memory:/a/b\n0::/u\n", cg_root), 3072);
    /* nothing to read */
    assert_int_equal(ps_cgroup_memory_room("", cg_root), -1);
    assert_int_equal(ps_cgroup_memory_room("garbage\n::\n1:memory\n", cg_root), -1);
    assert_int_equal(ps_cgroup_memory_room("0::/nowhere\n", cg_root), -1);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cg_root);
    assert_int_equal(system(cmd), 0);
    /* this host: something, no more than its physical memory */
    int64_t have = ps_host_memory_available();
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    assert_true(have > 0);
    assert_true(have <= (int64_t)pages * page);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_need_is_the_peak),
        cmocka_unit_test(test_refused_when_short),
        cmocka_unit_test(test_bad_device),
        cmocka_unit_test(test_cgroup_room),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
