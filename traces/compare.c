/* Joining run summaries stage by stage and measuring every run against a
 * reference (docs/compare.md). */
#include "traces/compare.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes_text.h"
#include "core/json.h"

const char *const ps_compare_metric_keys[PS_CMP_METRIC_COUNT] = {
    "time_s", "forward_s", "backward_s", "update_s", "peak_memory_bytes", "compute_s", "comm_s"};

/* Headings of the printed tables, with the unit the values are shown in
 * (memory's, the binary unit of its largest value, is added when printed). */
static const char *const metric_titles[PS_CMP_METRIC_COUNT] = {
    "time per micro-batch (forward + backward), ms",
    "forward per micro-batch, ms",
    "backward per micro-batch, ms",
    "update per step, ms",
    "peak memory",
    "compute per step, mean over the stage's devices, ms",
    "communication per step, mean over the stage's devices, ms"};
static const char *const metric_short[PS_CMP_METRIC_COUNT] = {
    "time/mb", "forward", "backward", "update", "memory", "compute", "comm"};
/* seconds are shown in ms; bytes in the unit of memory_unit() (1: its scale
 * is applied where the tables are printed) */
static const double metric_scale[PS_CMP_METRIC_COUNT] = {1e3, 1e3, 1e3, 1e3, 1, 1e3, 1e3};
/* The tables' order: the times, then memory. */
static const int metric_shown[PS_CMP_METRIC_COUNT] = {
    PS_CMP_TIME,    PS_CMP_FORWARD, PS_CMP_BACKWARD, PS_CMP_UPDATE,
    PS_CMP_COMPUTE, PS_CMP_COMM,    PS_CMP_MEMORY};

double ps_compare_rel_error(double value, double reference)
{
    if (!isfinite(value) || !isfinite(reference))
        return NAN;
    if (reference == 0)
        return value == 0 ? 0 : NAN;
    return (value - reference) / reference;
}

int ps_compare_default_reference(const ps_summary *const *runs, int n)
{
    static const char *const measured[] = {"exec-cuda", "exec-cpu"};
    for (int m = 0; m < 2; m++)
        for (int i = n - 1; i >= 0; i--)
            if (strcmp(runs[i]->source, measured[m]) == 0)
                return i;
    return n - 1;
}

/* Mean compute, communication and idle time of a stage's devices. */
static void stage_breakdown(const ps_summary *s, int stage, ps_compare_cell *cell)
{
    int n = 0;
    for (int d = 0; d < s->n_devices; d++) {
        const ps_summary_device *dev = &s->devices[d];
        if (dev->stage != stage)
            continue;
        cell->compute_s += dev->compute_s;
        cell->comm_s += dev->comm_s;
        cell->idle_s += dev->idle_s;
        n++;
    }
    if (n > 0) { /* validated summaries name every stage's devices */
        cell->compute_s /= n;
        cell->comm_s /= n;
        cell->idle_s /= n;
    }
}

/* A stage's metric m; compute and communication from its cell's breakdown. */
static double metric_value(const ps_summary_stage *g, const ps_compare_cell *cell, int m)
{
    switch (m) {
    case PS_CMP_TIME: return g->time_s;
    case PS_CMP_FORWARD: return g->forward_s;
    case PS_CMP_BACKWARD: return g->backward_s;
    case PS_CMP_UPDATE: return g->update_s;
    case PS_CMP_MEMORY: return g->peak_memory_bytes;
    case PS_CMP_COMPUTE: return cell->compute_s;
    default: return cell->comm_s;
    }
}

static void describe_stage(const ps_summary_stage *g, char *buf, size_t cap)
{
    snprintf(buf, cap, "%d devices from device %d, submesh %dx%d, logical mesh %dx%d", g->n_devices,
             g->first_device, g->submesh[0], g->submesh[1], g->logical_mesh[0], g->logical_mesh[1]);
}

/* Whether b can be joined with a, stage by stage. */
static ps_status check_joinable(const ps_summary *a, const char *fa, const ps_summary *b,
                                const char *fb, ps_error *err)
{
    if (strcmp(a->plan, b->plan) != 0)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cannot compare %s and %s: they are runs of different plans "
                            "(plan %s, %s on %s; plan %s, %s on %s)",
                            fa, fb, a->plan, a->model, a->cluster, b->plan, b->model, b->cluster);
    /* the digest covers the model's and the cluster's names: equal digests
     * with other names mean a summary was edited, or is of another plan */
    if (strcmp(a->model, b->model) != 0 || strcmp(a->cluster, b->cluster) != 0)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cannot compare %s and %s: both name plan %s, but as %s on %s in %s "
                            "and %s on %s in %s; a plan's digest covers its model and cluster, "
                            "so one of the two summaries was edited",
                            fa, fb, a->plan, a->model, a->cluster, fa, b->model, b->cluster, fb);
    if (a->n_stages != b->n_stages)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cannot compare %s and %s: their stage layouts differ (%d stage%s "
                            "in %s, %d in %s)",
                            fa, fb, a->n_stages, a->n_stages == 1 ? "" : "s", fa, b->n_stages, fb);
    for (int k = 0; k < a->n_stages; k++) {
        const ps_summary_stage *x = &a->stages[k], *y = &b->stages[k];
        if (x->n_devices != y->n_devices || x->first_device != y->first_device ||
            x->submesh[0] != y->submesh[0] || x->submesh[1] != y->submesh[1] ||
            x->logical_mesh[0] != y->logical_mesh[0] || x->logical_mesh[1] != y->logical_mesh[1]) {
            char dx[160], dy[160];
            describe_stage(x, dx, sizeof dx);
            describe_stage(y, dy, sizeof dy);
            return ps_error_set(err, PS_ERR_INVALID,
                                "cannot compare %s and %s: their stage layouts differ: stage %d "
                                "has %s in %s but %s in %s",
                                fa, fb, k, dx, fa, dy, fb);
        }
    }
    if (a->micro_batches != b->micro_batches)
        return ps_error_set(err, PS_ERR_INVALID,
                            "cannot compare %s and %s: %d micro-batches in %s but %d in %s", fa, fb,
                            a->micro_batches, fa, b->micro_batches, fb);
    return PS_OK;
}

ps_status ps_compare_create(const ps_summary *const *runs, const char *const *files, int n,
                            int reference, ps_compare **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_compare *c = NULL;
    *out = NULL;
    if (n < 2) {
        st = ps_error_set(err, PS_ERR_INVALID, "compare needs at least 2 run summaries, %d given",
                          n);
        goto out;
    }
    if (reference < -1 || reference >= n) {
        st = ps_error_set(err, PS_ERR_INVALID, "reference run %d is not one of the %d runs",
                          reference, n);
        goto out;
    }
    for (int i = 1; i < n; i++)
        PS_TRY(check_joinable(runs[0], files[0], runs[i], files[i], err));
    c = calloc(1, sizeof *c);
    PS_TRY_ALLOC(c, err);
    c->n_runs = n;
    c->n_stages = runs[0]->n_stages;
    c->reference = reference >= 0 ? reference : ps_compare_default_reference(runs, n);
    c->runs = calloc((size_t)n, sizeof *c->runs);
    PS_TRY_ALLOC(c->runs, err);
    c->cells = calloc((size_t)n * (size_t)c->n_stages, sizeof *c->cells);
    PS_TRY_ALLOC(c->cells, err);
    for (int r = 0; r < n; r++)
        for (int k = 0; k < c->n_stages; k++)
            stage_breakdown(runs[r], k, &c->cells[k * n + r]);
    const ps_summary *ref = runs[c->reference];
    for (int r = 0; r < n; r++) {
        ps_compare_run *run = &c->runs[r];
        const ps_summary *s = runs[r];
        run->file = strdup(files[r]);
        PS_TRY_ALLOC(run->file, err);
        run->summary = s;
        run->iteration_error = ps_compare_rel_error(s->iteration_s, ref->iteration_s);
        run->tflops_error = ps_compare_rel_error(s->tflops_per_device, ref->tflops_per_device);
        run->peak_memory_error = ps_compare_rel_error(s->peak_memory_bytes, ref->peak_memory_bytes);
        for (int m = 0; m < PS_CMP_METRIC_COUNT; m++) {
            double sum = 0;
            int defined = 0;
            run->worst[m] = NAN;
            run->worst_stage[m] = -1;
            for (int k = 0; k < c->n_stages; k++) {
                ps_compare_cell *cell = &c->cells[k * n + r];
                cell->value[m] = metric_value(&s->stages[k], cell, m);
                cell->error[m] = ps_compare_rel_error(
                    cell->value[m],
                    metric_value(&ref->stages[k], &c->cells[k * n + c->reference], m));
                if (isnan(cell->error[m]))
                    continue;
                sum += fabs(cell->error[m]);
                defined++;
                if (run->worst_stage[m] < 0 || fabs(cell->error[m]) > fabs(run->worst[m])) {
                    run->worst[m] = cell->error[m];
                    run->worst_stage[m] = k;
                }
            }
            run->mape[m] = defined > 0 ? sum / defined : NAN;
        }
    }
    *out = c;
    c = NULL;
out:
    ps_compare_free(c);
    return st;
}

void ps_compare_free(ps_compare *c)
{
    if (c == NULL)
        return;
    if (c->runs != NULL)
        for (int r = 0; r < c->n_runs; r++)
            free(c->runs[r].file);
    free(c->runs);
    free(c->cells);
    free(c);
}

/* ---- printing ----------------------------------------------------------- */

#define COL_W 22 /* one run's column: value and error */

/* An error as a signed percentage, short enough for a column. */
static const char *fmt_error(double e, char *buf, size_t cap)
{
    if (isnan(e))
        snprintf(buf, cap, "n/a");
    else if (e > -1 && e <= -0.99) {
        /* far below: enough decimals that it does not read as -100% (zero) */
        int d = (int)ceil(-log10(1 + e)) - 1;
        snprintf(buf, cap, "%+.*f%%", d < 1 ? 1 : d > 4 ? 4 : d, e * 100);
    } else if (fabs(e) < 0.0005)
        snprintf(buf, cap, "+0.0%%"); /* rounds to zero: not -0.0% */
    else if (fabs(e) < 10)
        snprintf(buf, cap, "%+.1f%%", e * 100);
    else if (fabs(e) < 1e4)
        snprintf(buf, cap, "%+.0f%%", e * 100);
    else
        snprintf(buf, cap, "%+.2g%%", e * 100);
    return buf;
}

static void print_cell(FILE *f, double value, double error, bool is_ref)
{
    char e[32];
    if (is_ref)
        fprintf(f, "%12.5g %9s", value, "ref");
    else
        fprintf(f, "%12.5g %9s", value, fmt_error(error, e, sizeof e));
}

const char *ps_compare_run_id(int r, char id[8])
{
    /* A..Z, then AA..ZZ: spreadsheet columns, unique for any count that fits */
    char tmp[8];
    int n = 0;
    for (int x = r + 1; x > 0 && n < 7; x = (x - 1) / 26)
        tmp[n++] = (char)('A' + (x - 1) % 26);
    for (int i = 0; i < n; i++)
        id[i] = tmp[n - 1 - i];
    id[n] = '\0';
    return id;
}

static void print_run_headers(const ps_compare *c, FILE *f, const char *first)
{
    fprintf(f, "%-20s", first);
    for (int r = 0; r < c->n_runs; r++) {
        char h[64], id[8];
        snprintf(h, sizeof h, "%s %s%s", ps_compare_run_id(r, id), c->runs[r].summary->source,
                 r == c->reference ? "*" : "");
        fprintf(f, "%*s", COL_W, h);
    }
    fputc('\n', f);
}

/* The memory tables' unit: that of the largest peak of any run or stage. */
static ps_bytes_unit memory_unit(const ps_compare *c)
{
    double max_bytes = 0;
    for (int r = 0; r < c->n_runs; r++) {
        max_bytes = fmax(max_bytes, c->runs[r].summary->peak_memory_bytes);
        for (int k = 0; k < c->n_stages; k++)
            max_bytes = fmax(max_bytes, ps_compare_cell_at(c, k, r)->value[PS_CMP_MEMORY]);
    }
    return ps_bytes_unit_for(max_bytes);
}

void ps_compare_print(const ps_compare *c, FILE *f)
{
    const ps_summary *s0 = c->runs[0].summary;
    char e[32];
    fprintf(f, "compare %d runs of plan %s: %s on %s, %d micro-batches, %d stage%s\n", c->n_runs,
            s0->plan, s0->model[0] ? s0->model : "?", s0->cluster[0] ? s0->cluster : "?",
            s0->micro_batches, c->n_stages, c->n_stages == 1 ? "" : "s");
    for (int r = 0; r < c->n_runs; r++) {
        char id[8];
        fprintf(f, "  %-2s %-10s %s%s\n", ps_compare_run_id(r, id), c->runs[r].summary->source,
                c->runs[r].file, r == c->reference ? "   (* reference)" : "");
    }
    fprintf(f, "errors are (run - reference) / reference; MAPE is the mean |error| over the "
               "stages\n\n");

    fprintf(f, "stage  devices  first device  submesh  logical mesh\n");
    for (int k = 0; k < c->n_stages; k++) {
        const ps_summary_stage *g = &s0->stages[k];
        char sub[32], logical[32];
        snprintf(sub, sizeof sub, "%dx%d", g->submesh[0], g->submesh[1]);
        snprintf(logical, sizeof logical, "%dx%d", g->logical_mesh[0], g->logical_mesh[1]);
        fprintf(f, "%5d %8d %13d %8s %13s\n", k, g->n_devices, g->first_device, sub, logical);
    }

    ps_bytes_unit mu = memory_unit(c);
    for (int i = 0; i < PS_CMP_METRIC_COUNT; i++) {
        int m = metric_shown[i];
        double scale = m == PS_CMP_MEMORY ? 1 / mu.bytes : metric_scale[m];
        if (m == PS_CMP_MEMORY)
            fprintf(f, "\n%s, %s\n", metric_titles[m], mu.name);
        else
            fprintf(f, "\n%s\n", metric_titles[m]);
        print_run_headers(c, f, "stage");
        for (int k = 0; k < c->n_stages; k++) {
            fprintf(f, "%5d%15s", k, "");
            for (int r = 0; r < c->n_runs; r++) {
                const ps_compare_cell *cell = ps_compare_cell_at(c, k, r);
                print_cell(f, cell->value[m] * scale, cell->error[m], r == c->reference);
            }
            fputc('\n', f);
        }
    }

    fputc('\n', f);
    print_run_headers(c, f, "overall");
    fprintf(f, "%-20s", "iteration ms");
    for (int r = 0; r < c->n_runs; r++)
        print_cell(f, c->runs[r].summary->iteration_s * 1e3, c->runs[r].iteration_error,
                   r == c->reference);
    bool ranges = false;
    for (int r = 0; r < c->n_runs; r++)
        ranges = ranges || c->runs[r].summary->timed_steps > 1;
    if (ranges) { /* a measurement's spread over its steps, beside its median */
        fprintf(f, "\n%-20s", "iteration range ms");
        for (int r = 0; r < c->n_runs; r++) {
            const ps_summary *s = c->runs[r].summary;
            char cell[64] = "-";
            if (s->timed_steps > 1) {
                snprintf(cell, sizeof cell, "%.5g-%.5g (%d)", s->iteration_min_s * 1e3,
                         s->iteration_max_s * 1e3, s->timed_steps);
                if (strlen(cell) >= COL_W) /* long steps: fewer digits, then no count */
                    snprintf(cell, sizeof cell, "%.3g-%.3g (%d)", s->iteration_min_s * 1e3,
                             s->iteration_max_s * 1e3, s->timed_steps);
                if (strlen(cell) >= COL_W)
                    snprintf(cell, sizeof cell, "%.3g-%.3g", s->iteration_min_s * 1e3,
                             s->iteration_max_s * 1e3);
            }
            fprintf(f, "%*s", COL_W, cell);
        }
    }
    fprintf(f, "\n%-20s", "TFLOP/s per device");
    for (int r = 0; r < c->n_runs; r++)
        print_cell(f, c->runs[r].summary->tflops_per_device, c->runs[r].tflops_error,
                   r == c->reference);
    char memory_label[32];
    snprintf(memory_label, sizeof memory_label, "peak memory %s", mu.name);
    fprintf(f, "\n%-20s", memory_label);
    for (int r = 0; r < c->n_runs; r++)
        print_cell(f, c->runs[r].summary->peak_memory_bytes / mu.bytes,
                   c->runs[r].peak_memory_error, r == c->reference);
    fputc('\n', f);
    for (int i = 0; i < PS_CMP_METRIC_COUNT; i++) {
        int m = metric_shown[i];
        char label[32];
        snprintf(label, sizeof label, "%s MAPE", metric_short[m]);
        fprintf(f, "%-20s", label);
        for (int r = 0; r < c->n_runs; r++) {
            const ps_compare_run *run = &c->runs[r];
            if (r == c->reference)
                fprintf(f, "%*s", COL_W, "ref");
            else if (isnan(run->mape[m]))
                fprintf(f, "%*s", COL_W, "n/a");
            else
                fprintf(f, "%*.1f%%", COL_W - 1, run->mape[m] * 100);
        }
        snprintf(label, sizeof label, "%s worst", metric_short[m]);
        fprintf(f, "\n%-20s", label);
        for (int r = 0; r < c->n_runs; r++) {
            const ps_compare_run *run = &c->runs[r];
            char w[64];
            if (r == c->reference)
                snprintf(w, sizeof w, "ref");
            else if (run->worst_stage[m] < 0)
                snprintf(w, sizeof w, "n/a");
            else
                snprintf(w, sizeof w, "%s (stage %d)", fmt_error(run->worst[m], e, sizeof e),
                         run->worst_stage[m]);
            fprintf(f, "%*s", COL_W, w);
        }
        fputc('\n', f);
    }
}

/* ---- JSON --------------------------------------------------------------- */

/* A number, or null where it is undefined. */
static json_t *num_or_null(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

static json_t *pair_json(const int v[2])
{
    json_t *a = json_array();
    for (int i = 0; a != NULL && i < 2; i++)
        if (json_array_append_new(a, json_integer(v[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* "time_s" -> "time_error", "peak_memory_bytes" -> "peak_memory_error" */
static void error_key(int m, char *buf, size_t cap)
{
    const char *k = ps_compare_metric_keys[m];
    const char *cut = strrchr(k, '_');
    snprintf(buf, cap, "%.*s_error", (int)(cut - k), k);
}

static ps_status run_json(const ps_compare *c, int r, json_t **out)
{
    ps_status st = PS_OK;
    const ps_compare_run *run = &c->runs[r];
    const ps_summary *s = run->summary;
    json_t *o = json_object(), *mape = NULL, *worst = NULL;
    PS_TRY_ALLOC(o, NULL);
    PS_TRY(ps_json_set(o, "file", json_string(run->file)));
    PS_TRY(ps_json_set(o, "source", json_string(s->source)));
    PS_TRY(ps_json_set(o, "reference", json_boolean(r == c->reference)));
    PS_TRY(ps_json_set(o, "iteration_s", json_real(s->iteration_s)));
    PS_TRY(ps_json_set(o, "iteration_error", num_or_null(run->iteration_error)));
    if (s->timed_steps > 0) {
        PS_TRY(ps_json_set(o, "timed_steps", json_integer(s->timed_steps)));
        PS_TRY(ps_json_set(o, "iteration_min_s", json_real(s->iteration_min_s)));
        PS_TRY(ps_json_set(o, "iteration_max_s", json_real(s->iteration_max_s)));
    }
    PS_TRY(ps_json_set(o, "tflops_per_device", json_real(s->tflops_per_device)));
    PS_TRY(ps_json_set(o, "tflops_error", num_or_null(run->tflops_error)));
    PS_TRY(ps_json_set(o, "peak_memory_bytes", json_real(s->peak_memory_bytes)));
    PS_TRY(ps_json_set(o, "peak_memory_error", num_or_null(run->peak_memory_error)));
    mape = json_object();
    PS_TRY(ps_json_set(o, "mape", mape));
    worst = json_object();
    PS_TRY(ps_json_set(o, "worst", worst));
    for (int m = 0; m < PS_CMP_METRIC_COUNT; m++) {
        PS_TRY(ps_json_set(mape, ps_compare_metric_keys[m], num_or_null(run->mape[m])));
        json_t *w = json_object();
        PS_TRY(ps_json_set(worst, ps_compare_metric_keys[m], w));
        PS_TRY(ps_json_set(w, "error", num_or_null(run->worst[m])));
        PS_TRY(ps_json_set(w, "stage",
                           run->worst_stage[m] >= 0 ? json_integer(run->worst_stage[m])
                                                    : json_null()));
    }
    *out = o;
    o = NULL;
out:
    json_decref(o);
    return st;
}

static ps_status stage_json(const ps_compare *c, int k, json_t **out)
{
    ps_status st = PS_OK;
    const ps_summary_stage *g = &c->runs[0].summary->stages[k];
    json_t *o = json_object(), *arr = NULL, *item = NULL;
    PS_TRY_ALLOC(o, NULL);
    PS_TRY(ps_json_set(o, "index", json_integer(k)));
    PS_TRY(ps_json_set(o, "devices", json_integer(g->n_devices)));
    PS_TRY(ps_json_set(o, "first_device", json_integer(g->first_device)));
    PS_TRY(ps_json_set(o, "submesh", pair_json(g->submesh)));
    PS_TRY(ps_json_set(o, "logical_mesh", pair_json(g->logical_mesh)));
    arr = json_array();
    PS_TRY(ps_json_set(o, "runs", arr));
    for (int r = 0; r < c->n_runs; r++) {
        const ps_compare_cell *cell = ps_compare_cell_at(c, k, r);
        item = json_object();
        PS_TRY(ps_json_append(arr, item));
        PS_TRY(ps_json_set(item, "source", json_string(c->runs[r].summary->source)));
        for (int m = 0; m < PS_CMP_METRIC_COUNT; m++) {
            char key[48];
            error_key(m, key, sizeof key);
            PS_TRY(ps_json_set(item, ps_compare_metric_keys[m], json_real(cell->value[m])));
            PS_TRY(ps_json_set(item, key, num_or_null(cell->error[m])));
        }
        PS_TRY(ps_json_set(item, "idle_s", json_real(cell->idle_s)));
    }
    *out = o;
    o = NULL;
out:
    json_decref(o);
    return st;
}

ps_status ps_compare_to_json(const ps_compare *c, json_t **out)
{
    ps_status st = PS_OK;
    const ps_summary *s0 = c->runs[0].summary;
    json_t *o = json_object(), *arr = NULL, *item = NULL;
    *out = NULL;
    PS_TRY_ALLOC(o, NULL);
    PS_TRY(ps_json_set(o, "format", json_string("pipeshard-compare")));
    PS_TRY(ps_json_set(o, "version", json_integer(PS_COMPARE_VERSION)));
    PS_TRY(ps_json_set(o, "plan", json_string(s0->plan)));
    PS_TRY(ps_json_set(o, "model", json_string(s0->model)));
    PS_TRY(ps_json_set(o, "cluster", json_string(s0->cluster)));
    PS_TRY(ps_json_set(o, "micro_batches", json_integer(s0->micro_batches)));
    PS_TRY(ps_json_set(o, "reference", json_integer(c->reference)));
    arr = json_array();
    PS_TRY(ps_json_set(o, "runs", arr));
    for (int r = 0; r < c->n_runs; r++) {
        PS_TRY(run_json(c, r, &item));
        PS_TRY(ps_json_append(arr, item));
    }
    arr = json_array();
    PS_TRY(ps_json_set(o, "stages", arr));
    for (int k = 0; k < c->n_stages; k++) {
        PS_TRY(stage_json(c, k, &item));
        PS_TRY(ps_json_append(arr, item));
    }
    *out = o;
    o = NULL;
out:
    json_decref(o);
    return st;
}

/* ---- CSV ---------------------------------------------------------------- */

/* A field quoted as RFC 4180 asks when it holds a comma, quote or newline. */
static void csv_text(FILE *f, const char *s)
{
    if (strpbrk(s, ",\"\r\n") == NULL) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* 17 significant digits (lossless); an undefined error is an empty field. */
static void csv_num(FILE *f, double x)
{
    if (isfinite(x))
        fprintf(f, ",%.17g", x);
    else
        fputc(',', f);
}

ps_status ps_compare_save_csv(const ps_compare *c, const char *path, ps_error *err)
{
    bool is_stdout = strcmp(path, "-") == 0;
    FILE *f = is_stdout ? stdout : fopen(path, "w");
    if (f == NULL)
        return ps_error_set(err, PS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    fputs("stage,devices,first_device,submesh,logical_mesh,run,file,source,reference", f);
    for (int m = 0; m < PS_CMP_METRIC_COUNT; m++) {
        char key[48];
        error_key(m, key, sizeof key);
        fprintf(f, ",%s,%s", ps_compare_metric_keys[m], key);
    }
    fputs(",idle_s\n", f);
    for (int k = 0; k < c->n_stages; k++) {
        const ps_summary_stage *g = &c->runs[0].summary->stages[k];
        for (int r = 0; r < c->n_runs; r++) {
            const ps_compare_cell *cell = ps_compare_cell_at(c, k, r);
            char id[8];
            fprintf(f, "%d,%d,%d,%dx%d,%dx%d,%s,", k, g->n_devices, g->first_device, g->submesh[0],
                    g->submesh[1], g->logical_mesh[0], g->logical_mesh[1], ps_compare_run_id(r, id));
            csv_text(f, c->runs[r].file);
            fprintf(f, ",%s,%d", c->runs[r].summary->source, r == c->reference);
            for (int m = 0; m < PS_CMP_METRIC_COUNT; m++) {
                csv_num(f, cell->value[m]);
                csv_num(f, cell->error[m]);
            }
            csv_num(f, cell->idle_s);
            fputc('\n', f);
        }
    }
    bool failed = ferror(f) != 0;
    if (is_stdout)
        failed = fflush(f) != 0 || failed;
    else
        failed = fclose(f) != 0 || failed;
    if (failed)
        return ps_error_set(err, PS_ERR_IO, "%s: write failed", path);
    return PS_OK;
}
