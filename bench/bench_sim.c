/* Simulator speed: GPT-3 175B under Alpa's uniform plan (dp x 8 x 16: a
 * data-parallel degree that grows with the cluster, 8-way operator
 * parallelism inside a DGX-A100 node, 16 pipeline stages) on dgx-a100
 * clusters of 1024, 4096 (and, asked for, 16384) devices, 64 micro-batches
 * of 3 sequences per data-parallel replica (global batch 1536 at 1024
 * devices, GPT-3's). Per size: planning, lowering, then one simulated step:
 * its wall and CPU time, events and events per second, and the simulator's
 * peak RSS (ps_sim_stats). The last line is the headline.
 *
 *   bench_sim [--devices 1024,4096,16384] [--micro-batches N] [--check]
 *             [--node-collectives MODES] [--time-limit S] [--csv FILE]
 *
 * --check also runs the program checker (its time is reported).
 * --node-collectives: how the simulator moves the collectives inside a node,
 * a comma-separated list of flows (the default), transfers and closed-form
 * (ps_sim_options; `pipeshard sim --node-collectives`); `both` is
 * flows,closed-form. Each mode simulates the same programs, one after the
 * other. Goals: 30 s of simulation at 1024 devices, 10 minutes at 4096 and
 * 16384. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench/bench_common.h"
#include "core/malloc_tune.h"
#include "core/program.h"
#include "planner/inter_pass.h"
#include "planner/lower.h"
#include "planner/plan_model.h"
#include "sim/sim.h"

#define MAX_SIZES 16
#define OP 8  /* operator parallelism: one DGX-A100 node */
#define PP 16 /* pipeline stages */

typedef struct row {
    int devices, dp;
    double plan_s, lower_s, check_s;
    long long program_instrs;
    ps_sim_stats stats;
    double sim_iteration_s, plan_iteration_s;
    int mode; /* node collectives: a node_mode */
} row;

typedef enum node_mode { MODE_FLOWS, MODE_TRANSFERS, MODE_CLOSED_FORM, MODE_COUNT } node_mode;
static const char *const mode_names[MODE_COUNT] = {"flows", "transfers", "closed-form"};

#define MAX_MODES 8

/* Plans, lowers and simulates gpt-175b on `devices` devices. */
/* r[0..n_modes): one row per simulator mode (modes[i]: a node_mode). */
static ps_status run_size(int devices, int micro_batches, double time_limit_s, bool check,
                          const int *modes, int n_modes, row *rows, ps_error *err)
{
    ps_status st = PS_OK;
    ps_cluster *c = NULL;
    ps_graph *fwd = NULL;
    ps_plan *p = NULL;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_summary *sum = NULL;
    char preset[32];
    row *r = &rows[0];
    memset(r, 0, sizeof *r);
    r->devices = devices;
    r->dp = devices / (OP * PP);
    snprintf(preset, sizeof preset, "dgx-a100:%d", devices / 8);
    double t0 = ps_monotonic_s();
    PS_TRY(ps_cluster_from_preset(preset, &c, err));
    ps_model_config cfg;
    PS_TRY(ps_zoo_lookup("gpt-175b", &cfg, err));
    long long global = 3LL * r->dp * micro_batches;
    cfg.batch = global / micro_batches;
    PS_TRY(ps_model_build(&cfg, &fwd, err));
    ps_plan_request req = {.forward = fwd, .config = &cfg, .train = ps_train_options_default(),
                           .cluster = c, .method = PS_METHOD_SHARD, .global_batch = global,
                           .micro_batches = micro_batches, .ilp = ps_ilp_options_default()};
    req.train.remat = true;
    req.ilp.time_limit_s = time_limit_s;
    ps_inter_options io = ps_inter_options_default();
    PS_TRY(ps_plan_uniform(&req, &io, r->dp, OP, PP, &p, err));
    r->plan_s = ps_monotonic_s() - t0;
    r->plan_iteration_s = p->iteration_s;
    t0 = ps_monotonic_s();
    ps_lower_options lo = ps_lower_options_default();
    PS_TRY(ps_plan_model_build(p, &m, err));
    PS_TRY(ps_plan_lower(p, m, &lo, &set, err));
    r->lower_s = ps_monotonic_s() - t0;
    ps_program_stats ps;
    ps_program_set_stats(set, &ps);
    r->program_instrs = ps.program_instrs;
    if (check) {
        t0 = ps_monotonic_s();
        PS_TRY(ps_program_set_check(set, NULL, err));
        r->check_s = ps_monotonic_s() - t0;
    }
    for (int i = 0; i < n_modes; i++) {
        if (i > 0)
            rows[i] = rows[0];
        ps_sim_options so = ps_sim_options_default();
        rows[i].mode = modes[i];
        so.node_collectives_closed_form = modes[i] == MODE_CLOSED_FORM;
        so.node_collectives_transfers = modes[i] == MODE_TRANSFERS;
        ps_summary_free(sum);
        sum = NULL;
        PS_TRY(ps_sim_run(set, c, &so, &sum, &rows[i].stats, err));
        rows[i].sim_iteration_s = sum->iteration_s;
    }
out:
    ps_summary_free(sum);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(p);
    ps_graph_free(fwd);
    ps_cluster_free(c);
    return st;
}

static int parse_sizes(const char *s, int *sizes)
{
    int n = 0;
    while (*s && n < MAX_SIZES) {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v % (OP * PP) != 0)
            return -1;
        sizes[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            return -1;
    }
    return n;
}

/* "flows,closed-form" into modes; the count, -1 if malformed. */
static int parse_modes(const char *s, int *modes)
{
    if (strcmp(s, "both") == 0)
        s = "flows,closed-form";
    int n = 0;
    while (*s) {
        size_t len = strcspn(s, ",");
        int m = -1;
        for (int k = 0; k < MODE_COUNT; k++)
            if (strlen(mode_names[k]) == len && strncmp(s, mode_names[k], len) == 0)
                m = k;
        if (m < 0 || n == MAX_MODES)
            return -1;
        modes[n++] = m;
        s += len;
        if (*s == ',' && *++s == '\0')
            return -1;
    }
    return n;
}

int main(int argc, char **argv)
{
    ps_malloc_tune(argv); /* the allocator the CLI runs with */
    int sizes[MAX_SIZES] = {1024, 4096}, n_sizes = 2, micro_batches = 64;
    double time_limit_s = 10;
    bool check = false;
    int modes[MAX_MODES] = {MODE_FLOWS}, n_modes = 1;
    FILE *csv = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--devices") == 0 && i + 1 < argc) {
            n_sizes = parse_sizes(argv[++i], sizes);
            if (n_sizes <= 0) {
                fprintf(stderr, "bench_sim: --devices wants multiples of %d, e.g. 1024,4096\n",
                        OP * PP);
                return 2;
            }
        } else if (strcmp(argv[i], "--micro-batches") == 0 && i + 1 < argc) {
            micro_batches = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--time-limit") == 0 && i + 1 < argc) {
            time_limit_s = atof(argv[++i]);
        } else if (strcmp(argv[i], "--check") == 0) {
            check = true;
        } else if (strcmp(argv[i], "--node-collectives") == 0 && i + 1 < argc) {
            n_modes = parse_modes(argv[++i], modes);
            if (n_modes <= 0) {
                fprintf(stderr, "bench_sim: --node-collectives takes a list of flows, "
                                "transfers and closed-form (or both: flows,closed-form)\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
            csv = fopen(argv[++i], "w");
            if (csv == NULL) {
                fprintf(stderr, "bench_sim: cannot write %s\n", argv[i]);
                return 1;
            }
        } else {
            fprintf(stderr, "usage: bench_sim [--devices 1024,4096,16384] [--micro-batches N] "
                            "[--check] [--node-collectives flows,transfers,closed-form|both] "
                            "[--time-limit S] [--csv FILE]\n");
            return 2;
        }
    }
    if (micro_batches <= 0) {
        fprintf(stderr, "bench_sim: --micro-batches wants a positive count\n");
        return 2;
    }
    if (csv != NULL) {
        char machine[600];
        machine_describe(machine, sizeof machine);
        fprintf(csv, "# bench_sim, one simulated step; machine: %s\n", machine);
    }
    if (csv != NULL)
        fprintf(csv, "model,devices,dp,op,pp,micro_batches,plan_s,lower_s,check_s,"
                     "program_instrs,sim_wall_s,sim_cpu_s,platform_s,events,events_per_s,"
                     "peak_rss_bytes,sim_iteration_s,plan_iteration_s,node_collectives\n");
    printf("gpt-175b, uniform dp x %d x %d, %d micro-batches, remat; one simulated step\n", OP,
           PP, micro_batches);
    printf("%7s %4s %8s %8s %10s %9s %9s %11s %10s %9s %8s %8s %s\n", "devices", "dp",
           "plan_s", "lower_s", "instrs", "wall_s", "cpu_s", "events", "events/s", "RSS_MB",
           "sim_s", "plan_it", "node collectives");
    char headline[512] = "";
    size_t hl = 0;
    int failed = 0;
    for (int i = 0; i < n_sizes; i++) {
        row rows[MAX_MODES];
        ps_error err = {0};
        if (run_size(sizes[i], micro_batches, time_limit_s, check, modes, n_modes, rows, &err) !=
            PS_OK) {
            printf("%7d failed: %s\n", sizes[i], err.msg);
            failed++;
            continue;
        }
        for (int j = 0; j < n_modes; j++) {
            const row *r = &rows[j];
            const char *mode = mode_names[r->mode];
            printf("%7d %4d %8.1f %8.1f %10lld %9.1f %9.1f %11lld %10.3g %9.0f %8.4g %8.4g %s\n",
                   r->devices, r->dp, r->plan_s, r->lower_s, r->program_instrs, r->stats.wall_s,
                   r->stats.cpu_s, r->stats.events, r->stats.events_per_s,
                   r->stats.peak_rss_bytes / 1e6, r->sim_iteration_s, r->plan_iteration_s, mode);
            if (check && j == 0)
                printf("        program check %.1f s\n", r->check_s);
            fflush(stdout);
            if (csv != NULL) {
                fprintf(csv,
                        "gpt-175b,%d,%d,%d,%d,%d,%.3f,%.3f,%.3f,%lld,%.3f,%.3f,%.3f,%lld,%.6g,"
                        "%.0f,%.6g,%.6g,%s\n",
                        r->devices, r->dp, OP, PP, micro_batches, r->plan_s, r->lower_s,
                        r->check_s, r->program_instrs, r->stats.wall_s, r->stats.cpu_s,
                        r->stats.platform_s, r->stats.events, r->stats.events_per_s,
                        r->stats.peak_rss_bytes, r->sim_iteration_s, r->plan_iteration_s, mode);
                fflush(csv);
            }
            double goal_s = r->devices <= 1024 ? 30 : 600;
            int w = snprintf(headline + hl, sizeof headline - hl,
                             "%s%d devices %s %.1f s (goal %.0f s)", hl ? ", " : "", r->devices,
                             mode, r->stats.wall_s, goal_s);
            if (w > 0 && (size_t)w < sizeof headline - hl)
                hl += (size_t)w;
        }
    }
    if (csv != NULL)
        fclose(csv);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("bench process max RSS %ld MB (programs; the simulator's own is RSS_MB)\n",
           ru.ru_maxrss / 1024);
    printf("simulator wall time: %s\n", hl ? headline : "no size ran");
    return failed ? 1 : 0;
}
