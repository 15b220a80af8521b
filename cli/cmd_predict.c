/* pipeshard predict: the planner's prediction of a plan, as a run summary
 * and as the timeline of the schedule the planner timed (its stages'
 * kernels, the transfers into them and the waits between), without the
 * simulator. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/json.h"
#include "core/profile_db.h"
#include "core/program.h"
#include "planner/lower.h"
#include "planner/pipeline_time.h"
#include "planner/plan_model.h"
#include "traces/plan_summary.h"
#include "traces/trace.h"

static void help(void)
{
    printf("usage: pipeshard predict --plan PLAN.json [--summary S.json] [--trace T.json]\n"
           "                         [--profile-db DB.json] [--json]\n\n"
           "The planner's prediction of a plan, recomputed from the plan file: the\n"
           "lowering's schedule (1F1B or GPipe) of the stages' predicted kernels with the\n"
           "transfers between stages sharing the NICs they cross, as the planner timed it\n"
           "(docs/simulator.md, \"Simulated and planned iteration time\"). Prints each\n"
           "stage's time computing, receiving and waiting; needs no simulator.\n\n"
           "options:\n"
           "  --plan P.json      the plan (pipeshard plan -o)\n"
           "  --summary S.json   the prediction as a run summary (source \"planner\", as\n"
           "                     pipeshard sim --predicted writes it), for compare\n"
           "  --trace T.json     the predicted timeline in the trace format of sim and\n"
           "                     exec (every device of a stage shows the stage's spans)\n"
           "  --profile-db DB    the profile DB the plan was made with (its digest is\n"
           "                     checked): the transfers between stages are timed with it,\n"
           "                     as the planner timed them (the ops' times are the plan's)\n"
           "  --json             print the summary as JSON instead of a table\n"
           "  -h, --help         this help\n");
}

enum { OPT_PLAN = 256, OPT_SUMMARY, OPT_TRACE, OPT_JSON, OPT_PROFILE_DB };

static const struct option options[] = {
    {"plan", required_argument, NULL, OPT_PLAN},
    {"summary", required_argument, NULL, OPT_SUMMARY},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"json", no_argument, NULL, OPT_JSON},
    {"profile-db", required_argument, NULL, OPT_PROFILE_DB},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* What a span is called in the timeline, and its category. */
static ps_trace_category span_name(const ps_pipeline_span *s, const ps_stage_link *links, char *buf,
                                   int cap)
{
    switch (s->kind) {
    case PS_SPAN_FORWARD:
        ps_trace_compute_name(PS_PHASE_FORWARD, s->micro_batch, buf, cap);
        return PS_TRACE_COMPUTE;
    case PS_SPAN_BACKWARD:
        ps_trace_compute_name(PS_PHASE_BACKWARD, s->micro_batch, buf, cap);
        return PS_TRACE_COMPUTE;
    case PS_SPAN_UPDATE:
        ps_trace_compute_name(PS_PHASE_UPDATE, -1, buf, cap);
        return PS_TRACE_COMPUTE;
    case PS_SPAN_ACCUMULATED:
        snprintf(buf, (size_t)cap, "reduce accumulated gradients");
        return PS_TRACE_COLLECTIVE;
    case PS_SPAN_STAGE_NICS:
        snprintf(buf, (size_t)cap, "collectives across nodes");
        return PS_TRACE_COLLECTIVE;
    case PS_SPAN_RECEIVE:
    default: {
        static const char *const what[PS_LINK_KIND_COUNT] = {"activations", "gradients",
                                                             "accumulated gradients",
                                                             "parameter copies", "updated state"};
        const ps_stage_link *l = &links[s->link];
        snprintf(buf, (size_t)cap, "recv %s from stage %d", what[l->kind], l->from);
        return PS_TRACE_RECV;
    }
    }
}

/* The timeline: each stage's spans on every device of the stage, with the
 * gaps between them as waits. */
static ps_status write_trace(const ps_plan *p, const ps_pipeline_span *spans, int n_spans,
                             const ps_stage_link *links, double iteration_s, const char *path,
                             ps_error *err)
{
    ps_trace_writer *w = NULL;
    char digest[32], name[96];
    PS_TRY_RET(ps_trace_open(path, p->cluster->devices_per_node, &w, err));
    ps_plan_digest(p, digest, sizeof digest);
    ps_trace_set_info(w, "source", "planner");
    ps_trace_set_info(w, "plan", digest);
    ps_trace_set_info(w, "model", p->model_name != NULL ? p->model_name : "");
    ps_trace_set_info(w, "cluster", p->cluster->name);
    for (int i = 0; i < n_spans;) {
        int k = spans[i].stage, end = i;
        while (end < n_spans && spans[end].stage == k)
            end++;
        const ps_plan_stage *s = &p->stages[k];
        for (int d = 0; d < s->n_devices; d++) {
            int dev = s->devices[d];
            snprintf(name, sizeof name, "device %d (stage %d)", dev, k);
            ps_trace_name_device(w, dev, name);
            double at = 0;
            for (int j = i; j <= end; j++) {
                double next = j < end ? spans[j].start_s : iteration_s;
                if (next > at)
                    ps_trace_add(w, &(ps_trace_event){.device = dev,
                                                      .category = PS_TRACE_IDLE,
                                                      .name = "wait",
                                                      .start_s = at,
                                                      .duration_s = next - at,
                                                      .micro_batch = -1,
                                                      .stage = k,
                                                      .peer = -1});
                if (j == end)
                    break;
                const ps_pipeline_span *x = &spans[j];
                ps_trace_category cat = span_name(x, links, name, sizeof name);
                ps_trace_add(w, &(ps_trace_event){.device = dev,
                                                  .category = cat,
                                                  .name = name,
                                                  .start_s = x->start_s,
                                                  .duration_s = x->end_s - x->start_s,
                                                  .micro_batch = x->micro_batch,
                                                  .stage = k,
                                                  .peer = -1});
                at = fmax(at, x->end_s);
            }
        }
        i = end;
    }
    return ps_trace_close(w, err);
}

/* Per stage over the step: its kernels (with the reductions they send),
 * receiving, its own collectives across nodes, and waiting; and when its
 * last span ends. */
static void print_schedule(const ps_plan *p, const ps_pipeline_span *spans, int n_spans,
                           double iteration_s, FILE *f)
{
    char digest[32];
    ps_plan_digest(p, digest, sizeof digest);
    fprintf(f, "planner's schedule of %s on %s, plan %s\n", p->model_name, p->cluster->name,
            digest);
    fprintf(f, "%d micro-batches (%s), iteration %.3f ms", p->micro_batches, p->schedule,
            iteration_s * 1e3);
    if (p->iteration_s > 0 && fabs(iteration_s - p->iteration_s) > 1e-9 * p->iteration_s) {
        if (p->profile_digest[0] != '\0' && p->cluster->profile == NULL)
            fprintf(f,
                    " (the plan says %.3f ms: the planner timed the transfers between stages "
                    "with its profile DB, %s %s; pass it with --profile-db)",
                    p->iteration_s * 1e3, p->profile_device, p->profile_digest);
        else
            fprintf(f, " (the plan says %.3f ms: it was predicted by another version, or edited)",
                    p->iteration_s * 1e3);
    }
    fprintf(f, "\n\n%5s %7s %12s %12s %15s %12s %12s\n", "stage", "devices", "kernels ms",
            "receiving ms", "across nodes ms", "waiting ms", "ends at ms");
    for (int k = 0; k < p->n_stages; k++) {
        double busy[PS_SPAN_KIND_COUNT] = {0}, ends = 0;
        for (int i = 0; i < n_spans; i++)
            if (spans[i].stage == k) {
                busy[spans[i].kind] += spans[i].end_s - spans[i].start_s;
                ends = fmax(ends, spans[i].end_s);
            }
        double compute = busy[PS_SPAN_FORWARD] + busy[PS_SPAN_BACKWARD] + busy[PS_SPAN_UPDATE] +
                         busy[PS_SPAN_ACCUMULATED];
        double recv = busy[PS_SPAN_RECEIVE], nics = busy[PS_SPAN_STAGE_NICS];
        fprintf(f, "%5d %7d %12.3f %12.3f %15.3f %12.3f %12.3f\n", k, p->stages[k].n_devices,
                compute * 1e3, recv * 1e3, nics * 1e3,
                fmax(0, iteration_s - compute - recv - nics) * 1e3, ends * 1e3);
    }
}

ps_status ps_cli_planner_summary(const ps_plan *plan, const ps_plan_model *m,
                                 const ps_program_set *set, const ps_pipeline_span *spans,
                                 int n_spans, ps_summary **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_pipeline_span *own = NULL;
    double *receive_s = NULL, *saved_s = NULL, *wall_s = NULL, iteration_s = NAN;
    *out = NULL;
    if (spans == NULL) {
        PS_TRY(ps_cli_in_plan_file(plan,
                                   ps_plan_pipeline_schedule(plan, m->step, &own, &n_spans, NULL,
                                                             NULL, &iteration_s, err),
                                   err));
        spans = own;
    }
    receive_s = ps_pipeline_receive_seconds(plan->n_stages, spans, n_spans);
    saved_s = ps_pipeline_compute_saved_s(plan->n_stages, spans, n_spans);
    wall_s = ps_pipeline_compute_wall_s(plan->n_stages, spans, n_spans);
    PS_TRY_ALLOC(receive_s, err);
    PS_TRY_ALLOC(saved_s, err);
    PS_TRY_ALLOC(wall_s, err);
    st = ps_summary_from_plan(plan, set, receive_s, saved_s, wall_s, out);
    if (st != PS_OK)
        st = ps_error_set(err, st, "the planner's summary: %s", ps_status_str(st));
out:
    free(own);
    free(receive_s);
    free(saved_s);
    free(wall_s);
    return st;
}

int ps_cmd_predict(int argc, char **argv)
{
    const char *plan_path = NULL, *summary_path = NULL, *trace_path = NULL, *db_path = NULL;
    bool json = false;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case 'h': help(); return 0;
        case OPT_PLAN: plan_path = optarg; break;
        case OPT_SUMMARY: summary_path = optarg; break;
        case OPT_TRACE: trace_path = optarg; break;
        case OPT_JSON: json = true; break;
        case OPT_PROFILE_DB: db_path = optarg; break;
        default:
            return ps_cli_usage_error("predict", "unknown or incomplete option \"%s\"",
                                      argv[optind - 1]);
        }
    }
    if (optind < argc)
        return ps_cli_usage_error("predict", "unexpected argument \"%s\"", argv[optind]);
    if (plan_path == NULL)
        return ps_cli_usage_error("predict", "--plan PLAN.json is required");
    const ps_cli_path outs[] = {{"--summary", summary_path}, {"--trace", trace_path}};
    FILE *report = stdout;
    int checked = ps_cli_check_run_outputs("predict", plan_path, json, outs,
                                           (int)(sizeof outs / sizeof *outs), &report);
    if (checked != 0)
        return checked;
    ps_status st = PS_OK;
    ps_error err = {0};
    ps_plan *plan = NULL;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_summary *pred = NULL;
    ps_profile_db *db = NULL; /* attached to the plan's cluster */
    ps_pipeline_span *spans = NULL;
    ps_stage_link *links = NULL;
    int n_spans = 0, n_links = 0;
    double iteration_s = NAN;
    PS_TRY(ps_plan_load(plan_path, &plan, &err));
    if (!(plan->iteration_s > 0)) {
        st = ps_error_set(&err, PS_ERR_INVALID, "%s: the plan carries no prediction", plan_path);
        goto out;
    }
    if (db_path != NULL) {
        char digest[sizeof plan->profile_digest];
        PS_TRY(ps_cli_attach_profile(db_path, plan->cluster, &db, &err));
        if (ps_profile_db_digest(db, digest, sizeof digest) != PS_OK ||
            strcmp(digest, plan->profile_digest) != 0) {
            st = ps_error_set(&err, PS_ERR_INVALID,
                              plan->profile_digest[0] == '\0'
                                  ? "%s: the plan was made without a profile DB, not with %s"
                                  : "%s: the plan was made with another profile DB than %s "
                                    "(digest %s, not %s)",
                              plan_path, db_path, plan->profile_digest, digest);
            goto out;
        }
    }
    PS_TRY(ps_cli_in_plan_file(plan, ps_plan_model_build(plan, &m, &err), &err));
    ps_lower_options lo = ps_lower_options_default();
    PS_TRY(ps_cli_in_plan_file(plan, ps_plan_lower(plan, m, &lo, &set, &err), &err));
    PS_TRY(ps_cli_in_plan_file(plan,
                               ps_plan_pipeline_schedule(plan, m->step, &spans, &n_spans, &links,
                                                         &n_links, &iteration_s, &err),
                               &err));
    if (isnan(iteration_s)) {
        st = ps_error_set(&err, PS_ERR_INVALID,
                          "%s: the stages' transfers wait for each other: the planner predicted "
                          "this plan by Alpa's pipeline formula, which has no timeline",
                          plan_path);
        goto out;
    }
    PS_TRY(ps_cli_planner_summary(plan, m, set, spans, n_spans, &pred, &err));
    if (summary_path != NULL)
        PS_TRY(ps_summary_save(pred, summary_path, &err));
    if (trace_path != NULL)
        PS_TRY(write_trace(plan, spans, n_spans, links, iteration_s, trace_path, &err));
    if (json) {
        json_t *j = NULL;
        PS_TRY(ps_summary_to_json(pred, &j));
        st = ps_json_save(j, "-", &err);
        json_decref(j);
    } else {
        print_schedule(plan, spans, n_spans, iteration_s, report);
    }
out:
    free(spans);
    free(links);
    ps_summary_free(pred);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(plan);
    ps_profile_db_free(db);
    return st == PS_OK ? 0 : ps_cli_fail(&err, st);
}
