/* Run summaries: building, checking, writing, reading and printing them
 * (docs/trace-format.md describes the file). */
#include "traces/summary.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes_text.h"
#include "core/json.h"

ps_status ps_summary_create(int n_devices, int n_stages, ps_summary **out)
{
    *out = NULL;
    if (n_devices < 0 || n_stages < 0)
        return PS_ERR_INVALID;
    ps_summary *s = calloc(1, sizeof *s);
    if (s == NULL)
        return PS_ERR_NOMEM;
    s->devices = calloc((size_t)(n_devices > 0 ? n_devices : 1), sizeof *s->devices);
    s->stages = calloc((size_t)(n_stages > 0 ? n_stages : 1), sizeof *s->stages);
    if (s->devices == NULL || s->stages == NULL) {
        ps_summary_free(s);
        return PS_ERR_NOMEM;
    }
    s->n_devices = n_devices;
    s->n_stages = n_stages;
    for (int d = 0; d < n_devices; d++) {
        s->devices[d].id = d;
        s->devices[d].stage = -1;
    }
    for (int i = 0; i < n_stages; i++)
        s->stages[i].index = i;
    *out = s;
    return PS_OK;
}

void ps_summary_free(ps_summary *s)
{
    if (s == NULL)
        return;
    free(s->devices);
    free(s->stages);
    free(s);
}

/* ---- validation ---------------------------------------------------------
 * One set of semantic checks serves both directions: save refuses to write
 * what load would reject, and load reports the same finding at the offending
 * value's position in the file. A finding names where it is (an array, an
 * element, a key) so that each caller can render it its own way. */

#define SUMMARY_FORMAT "pipeshard-summary"
/* far above any real run, low enough to catch a unit mistake */
#define SUMMARY_MAX_VALUE 1e30

const char *const ps_summary_source_names[PS_SUMMARY_SOURCE_COUNT] = {"planner", "sim", "exec-cpu",
                                                                      "exec-cuda"};

typedef struct finding {
    const char *array; /* NULL (top level), "devices" or "stages" */
    int index;
    const char *key; /* NULL: the element (or the array) itself */
    char what[384];
} finding;

static bool found(finding *f, const char *array, int index, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static bool found(finding *f, const char *array, int index, const char *key, const char *fmt, ...)
{
    f->array = array;
    f->index = index;
    f->key = key;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->what, sizeof f->what, fmt, ap);
    va_end(ap);
    return false;
}

static bool value_ok(double x)
{
    return isfinite(x) && x >= 0 && x <= SUMMARY_MAX_VALUE;
}

/* A fixed-size text field must be terminated inside its array and be valid
 * UTF-8 (jansson refuses to write anything else). */
static bool text_ok(const char *s, size_t cap)
{
    if (memchr(s, '\0', cap) == NULL)
        return false;
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

int ps_summary_source_index(const char *source)
{
    for (int i = 0; i < PS_SUMMARY_SOURCE_COUNT; i++)
        if (strcmp(source, ps_summary_source_names[i]) == 0)
            return i;
    return -1;
}

#define CHECK_VALUE(arr, i, obj, field)                                                            \
    do {                                                                                           \
        if (!value_ok((obj)->field))                                                               \
            return found(f, arr, i, #field, "%g is not a number from 0 to %g", (obj)->field,       \
                         SUMMARY_MAX_VALUE);                                                       \
    } while (0)

/* Equal but for the rounding of a sum written by another producer: the
 * writers compute these identities exactly, and 17 digits load back exactly. */
static bool same_value(double a, double b)
{
    return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)) + 1e-300;
}

/* What a summary's numbers say of each other (docs/trace-format.md, Checks):
 * a stage's time is its forward plus its backward; each peak is the max
 * over the devices it covers; a device's idle time is the rest of the step. */
static bool identities_check(const ps_summary *s, finding *f)
{
    double top_peak = 0;
    for (int i = 0; i < s->n_devices; i++) {
        const ps_summary_device *d = &s->devices[i];
        top_peak = fmax(top_peak, d->peak_memory_bytes);
        /* the rounding of a difference is of its operands' size */
        double rest = fmax(0.0, s->iteration_s - d->compute_s - d->comm_s);
        double scale = fmax(s->iteration_s, d->compute_s + d->comm_s);
        if (!(fabs(d->idle_s - rest) <= 1e-9 * scale + 1e-300))
            return found(f, "devices", i, "idle_s",
                         "%.17g is not the rest of the step, iteration_s - compute_s - comm_s "
                         "(%.17g - %.17g - %.17g, and 0 where that is negative)",
                         d->idle_s, s->iteration_s, d->compute_s, d->comm_s);
    }
    if (!same_value(s->peak_memory_bytes, top_peak))
        return found(f, NULL, 0, "peak_memory_bytes",
                     "%.17g is not the largest of the devices' peaks (%.17g)",
                     s->peak_memory_bytes, top_peak);
    for (int i = 0; i < s->n_stages; i++) {
        const ps_summary_stage *g = &s->stages[i];
        if (!same_value(g->time_s, g->forward_s + g->backward_s))
            return found(f, "stages", i, "time_s",
                         "%.17g is not forward_s + backward_s (%.17g + %.17g)", g->time_s,
                         g->forward_s, g->backward_s);
        double peak = 0;
        for (int d = 0; d < s->n_devices; d++)
            if (s->devices[d].stage == i)
                peak = fmax(peak, s->devices[d].peak_memory_bytes);
        if (!same_value(g->peak_memory_bytes, peak))
            return found(f, "stages", i, "peak_memory_bytes",
                         "%.17g is not the largest of stage %d's devices' peaks (%.17g)",
                         g->peak_memory_bytes, i, peak);
    }
    return true;
}

/* A measurement's steps: the median lies between the fastest and the slowest
 * (one step: all three are that step); a prediction has none. */
static bool steps_check(const ps_summary *s, finding *f)
{
    CHECK_VALUE(NULL, 0, s, iteration_min_s);
    CHECK_VALUE(NULL, 0, s, iteration_max_s);
    if (s->timed_steps < 0)
        return found(f, NULL, 0, "timed_steps", "%d steps (at least 1, or the key left out)",
                     s->timed_steps);
    if (s->timed_steps == 0) {
        if (s->iteration_min_s != 0 || s->iteration_max_s != 0)
            return found(f, NULL, 0, "iteration_min_s",
                         "the fastest and slowest steps need timed_steps");
        return true;
    }
    bool below =
        s->iteration_min_s <= s->iteration_s || same_value(s->iteration_min_s, s->iteration_s);
    bool above =
        s->iteration_max_s >= s->iteration_s || same_value(s->iteration_max_s, s->iteration_s);
    if (!below)
        return found(f, NULL, 0, "iteration_min_s",
                     "the fastest step (%.17g s) is slower than the median iteration (%.17g s)",
                     s->iteration_min_s, s->iteration_s);
    if (!above)
        return found(f, NULL, 0, "iteration_max_s",
                     "the slowest step (%.17g s) is faster than the median iteration (%.17g s)",
                     s->iteration_max_s, s->iteration_s);
    if (s->timed_steps == 1 && !(same_value(s->iteration_min_s, s->iteration_s) &&
                                 same_value(s->iteration_max_s, s->iteration_s)))
        return found(f, NULL, 0,
                     same_value(s->iteration_min_s, s->iteration_s) ? "iteration_max_s"
                                                                    : "iteration_min_s",
                     "one timed step: its fastest and slowest are the iteration (%.17g s), not "
                     "%.17g and %.17g s",
                     s->iteration_s, s->iteration_min_s, s->iteration_max_s);
    return true;
}

static bool summary_check(const ps_summary *s, finding *f)
{
    if (memchr(s->source, '\0', sizeof s->source) == NULL || ps_summary_source_index(s->source) < 0)
        return found(f, NULL, 0, "source",
                     "unknown source \"%.*s\" (expected one of: planner, "
                     "sim, exec-cpu, exec-cuda)",
                     (int)sizeof s->source, s->source);
    if (!text_ok(s->plan, sizeof s->plan))
        return found(f, NULL, 0, "plan", "not a string of at most %zu bytes of UTF-8",
                     sizeof s->plan - 1);
    if (!text_ok(s->model, sizeof s->model))
        return found(f, NULL, 0, "model", "not a string of at most %zu bytes of UTF-8",
                     sizeof s->model - 1);
    if (!text_ok(s->cluster, sizeof s->cluster))
        return found(f, NULL, 0, "cluster", "not a string of at most %zu bytes of UTF-8",
                     sizeof s->cluster - 1);
    if (s->micro_batches < 1)
        return found(f, NULL, 0, "micro_batches", "%d micro-batches (at least 1)",
                     s->micro_batches);
    CHECK_VALUE(NULL, 0, s, iteration_s);
    CHECK_VALUE(NULL, 0, s, tflops_per_device);
    CHECK_VALUE(NULL, 0, s, mfu);
    CHECK_VALUE(NULL, 0, s, peak_memory_bytes);
    CHECK_VALUE(NULL, 0, s, wall_s);
    if (!steps_check(s, f))
        return false;
    if (s->n_devices < 1 || s->devices == NULL)
        return found(f, NULL, 0, "devices", "a summary needs at least one device");
    if (s->n_stages < 1 || s->stages == NULL)
        return found(f, NULL, 0, "stages", "a summary needs at least one stage");
    for (int i = 0; i < s->n_devices; i++) {
        const ps_summary_device *d = &s->devices[i];
        if (d->id < 0)
            return found(f, "devices", i, "id", "device id %d is negative", d->id);
        if (i > 0 && d->id <= s->devices[i - 1].id)
            return found(f, "devices", i, "id",
                         "device id %d follows %d: ids must increase (no duplicates)", d->id,
                         s->devices[i - 1].id);
        if (d->stage < -1 || d->stage >= s->n_stages)
            return found(f, "devices", i, "stage",
                         "stage %d is not a stage of this summary (stages 0 to %d, or -1 for "
                         "none)",
                         d->stage, s->n_stages - 1);
        CHECK_VALUE("devices", i, d, compute_s);
        CHECK_VALUE("devices", i, d, comm_s);
        CHECK_VALUE("devices", i, d, idle_s);
        CHECK_VALUE("devices", i, d, peak_memory_bytes);
    }
    for (int i = 0; i < s->n_stages; i++) {
        const ps_summary_stage *g = &s->stages[i];
        if (g->index != i)
            return found(f, "stages", i, "index",
                         "stage at position %d has index %d (indices "
                         "must be 0 to %d in order)",
                         i, g->index, s->n_stages - 1);
        if (g->n_devices < 1)
            return found(f, "stages", i, "devices", "%d devices (at least 1)", g->n_devices);
        if (g->first_device < 0)
            return found(f, "stages", i, "first_device", "device id %d is negative",
                         g->first_device);
        for (int k = 0; k < 2; k++) {
            if (g->submesh[k] < 1)
                return found(f, "stages", i, "submesh",
                             "needs two positive integers, found "
                             "[%d, %d]",
                             g->submesh[0], g->submesh[1]);
            if (g->logical_mesh[k] < 1)
                return found(f, "stages", i, "logical_mesh",
                             "needs two positive integers, "
                             "found [%d, %d]",
                             g->logical_mesh[0], g->logical_mesh[1]);
        }
        /* both shapes are views of the same mesh slice */
        if ((long long)g->submesh[0] * g->submesh[1] != g->n_devices)
            return found(f, "stages", i, "submesh",
                         "submesh %dx%d does not hold the stage's %d "
                         "devices",
                         g->submesh[0], g->submesh[1], g->n_devices);
        if ((long long)g->logical_mesh[0] * g->logical_mesh[1] != g->n_devices)
            return found(f, "stages", i, "logical_mesh",
                         "logical mesh %dx%d does not hold the "
                         "stage's %d devices",
                         g->logical_mesh[0], g->logical_mesh[1], g->n_devices);
        CHECK_VALUE("stages", i, g, time_s);
        CHECK_VALUE("stages", i, g, forward_s);
        CHECK_VALUE("stages", i, g, backward_s);
        CHECK_VALUE("stages", i, g, update_s);
        CHECK_VALUE("stages", i, g, peak_memory_bytes);
        /* the device list must agree with the stage's mesh slice */
        int count = 0, first = -1;
        for (int d = 0; d < s->n_devices; d++)
            if (s->devices[d].stage == i) {
                if (count == 0)
                    first = s->devices[d].id;
                count++;
            }
        if (count != g->n_devices)
            return found(f, "stages", i, "devices",
                         "stage %d has %d devices but %d entries of "
                         "devices[] name stage %d",
                         i, g->n_devices, count, i);
        if (first != g->first_device)
            return found(f, "stages", i, "first_device",
                         "first device %d, but the smallest "
                         "device id of stage %d in devices[] is %d",
                         g->first_device, i, first);
    }
    return identities_check(s, f);
}

ps_status ps_summary_validate(const ps_summary *s, ps_error *err)
{
    finding f = {0};
    if (summary_check(s, &f))
        return PS_OK;
    char where[96];
    if (f.array != NULL)
        snprintf(where, sizeof where, "%s[%d]%s%s", f.array, f.index, f.key ? "." : "",
                 f.key ? f.key : "");
    else
        snprintf(where, sizeof where, "%s", f.key ? f.key : "(top level)");
    return ps_error_set(err, PS_ERR_INVALID, "summary: %s: %s", where, f.what);
}

/* ---- writing ------------------------------------------------------------ */

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

static ps_status device_json(const ps_summary_device *d, json_t **out)
{
    ps_status st = PS_OK;
    json_t *o = json_object();
    PS_TRY_ALLOC(o, NULL);
    PS_TRY(ps_json_set(o, "id", json_integer(d->id)));
    PS_TRY(ps_json_set(o, "stage", json_integer(d->stage)));
    PS_TRY(ps_json_set(o, "compute_s", json_real(d->compute_s)));
    PS_TRY(ps_json_set(o, "comm_s", json_real(d->comm_s)));
    PS_TRY(ps_json_set(o, "idle_s", json_real(d->idle_s)));
    PS_TRY(ps_json_set(o, "peak_memory_bytes", json_real(d->peak_memory_bytes)));
    *out = o;
    o = NULL;
out:
    json_decref(o);
    return st;
}

static ps_status stage_json(const ps_summary_stage *g, json_t **out)
{
    ps_status st = PS_OK;
    json_t *o = json_object();
    PS_TRY_ALLOC(o, NULL);
    PS_TRY(ps_json_set(o, "index", json_integer(g->index)));
    PS_TRY(ps_json_set(o, "devices", json_integer(g->n_devices)));
    PS_TRY(ps_json_set(o, "first_device", json_integer(g->first_device)));
    PS_TRY(ps_json_set(o, "submesh", pair_json(g->submesh)));
    PS_TRY(ps_json_set(o, "logical_mesh", pair_json(g->logical_mesh)));
    PS_TRY(ps_json_set(o, "time_s", json_real(g->time_s)));
    PS_TRY(ps_json_set(o, "forward_s", json_real(g->forward_s)));
    PS_TRY(ps_json_set(o, "backward_s", json_real(g->backward_s)));
    PS_TRY(ps_json_set(o, "update_s", json_real(g->update_s)));
    PS_TRY(ps_json_set(o, "peak_memory_bytes", json_real(g->peak_memory_bytes)));
    *out = o;
    o = NULL;
out:
    json_decref(o);
    return st;
}

ps_status ps_summary_to_json(const ps_summary *s, json_t **out)
{
    ps_status st = PS_OK;
    json_t *o = NULL, *arr, *item = NULL;
    *out = NULL;
    /* jansson cannot write NaN or overlong text: say "invalid", not "out of memory" */
    PS_TRY(ps_summary_validate(s, NULL));
    o = json_object();
    PS_TRY_ALLOC(o, NULL);
    PS_TRY(ps_json_set(o, "format", json_string(SUMMARY_FORMAT)));
    PS_TRY(ps_json_set(o, "version", json_integer(PS_SUMMARY_VERSION)));
    PS_TRY(ps_json_set(o, "source", json_string(s->source)));
    PS_TRY(ps_json_set(o, "plan", json_string(s->plan)));
    PS_TRY(ps_json_set(o, "model", json_string(s->model)));
    PS_TRY(ps_json_set(o, "cluster", json_string(s->cluster)));
    PS_TRY(ps_json_set(o, "micro_batches", json_integer(s->micro_batches)));
    PS_TRY(ps_json_set(o, "iteration_s", json_real(s->iteration_s)));
    PS_TRY(ps_json_set(o, "tflops_per_device", json_real(s->tflops_per_device)));
    PS_TRY(ps_json_set(o, "mfu", json_real(s->mfu)));
    PS_TRY(ps_json_set(o, "peak_memory_bytes", json_real(s->peak_memory_bytes)));
    PS_TRY(ps_json_set(o, "wall_s", json_real(s->wall_s)));
    if (s->timed_steps > 0) {
        PS_TRY(ps_json_set(o, "timed_steps", json_integer(s->timed_steps)));
        PS_TRY(ps_json_set(o, "iteration_min_s", json_real(s->iteration_min_s)));
        PS_TRY(ps_json_set(o, "iteration_max_s", json_real(s->iteration_max_s)));
    }
    arr = json_array();
    PS_TRY(ps_json_set(o, "devices", arr));
    for (int i = 0; i < s->n_devices; i++) {
        PS_TRY(device_json(&s->devices[i], &item));
        PS_TRY(ps_json_append(arr, item));
    }
    arr = json_array();
    PS_TRY(ps_json_set(o, "stages", arr));
    for (int i = 0; i < s->n_stages; i++) {
        PS_TRY(stage_json(&s->stages[i], &item));
        PS_TRY(ps_json_append(arr, item));
    }
    *out = o;
    o = NULL;
out:
    json_decref(o);
    return st;
}

ps_status ps_summary_save(const ps_summary *s, const char *path, ps_error *err)
{
    ps_status st = PS_OK;
    json_t *j = NULL;
    ps_error inner = {0};
    if ((st = ps_summary_validate(s, &inner)) != PS_OK) {
        st = ps_error_set(err, st, "%s: not written: %s", path, inner.msg);
        goto out;
    }
    if ((st = ps_summary_to_json(s, &j)) != PS_OK) {
        st = ps_error_set(err, st, "out of memory while writing %s", path);
        goto out;
    }
    PS_TRY(ps_json_save(j, path, err));
out:
    json_decref(j);
    return st;
}

/* ---- reading ------------------------------------------------------------ */

static ps_status read_text(const ps_jv *obj, const char *key, char *dst, size_t cap, ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv v;
    const char *s;
    PS_TRY(ps_jv_member(obj, key, &v, err));
    PS_TRY(ps_jv_string(&v, &s, err));
    if (strlen(s) >= cap) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "longer than %zu bytes", cap - 1);
        goto out;
    }
    memcpy(dst, s, strlen(s) + 1);
out:
    return st;
}

static ps_status read_int(const ps_jv *obj, const char *key, int lo, int *dst, ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv v;
    int64_t x;
    PS_TRY(ps_jv_member(obj, key, &v, err));
    PS_TRY(ps_jv_int(&v, lo, INT32_MAX, &x, err));
    *dst = (int)x;
out:
    return st;
}

static ps_status read_value(const ps_jv *obj, const char *key, double *dst, ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv v;
    PS_TRY(ps_jv_member(obj, key, &v, err));
    PS_TRY(ps_jv_double(&v, 0, SUMMARY_MAX_VALUE, dst, err));
out:
    return st;
}

static ps_status read_pair(const ps_jv *obj, const char *key, int dst[2], ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv v;
    size_t n;
    PS_TRY(ps_jv_member(obj, key, &v, err));
    PS_TRY(ps_jv_array(&v, &n, err));
    if (n != 2) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID,
                        "expected 2 positive integers, found %zu "
                        "values",
                        n);
        goto out;
    }
    for (size_t i = 0; i < 2; i++) {
        ps_jv e = ps_jv_element(&v, i);
        int64_t x;
        PS_TRY(ps_jv_int(&e, 1, INT32_MAX, &x, err));
        dst[i] = (int)x;
    }
out:
    return st;
}

static ps_status read_device(const ps_jv *v, ps_summary_device *d, ps_error *err)
{
    static const char *const keys[] = {
        "id", "stage", "compute_s", "comm_s", "idle_s", "peak_memory_bytes", NULL};
    ps_status st = PS_OK;
    PS_TRY(ps_jv_check_keys(v, keys, err));
    PS_TRY(read_int(v, "id", 0, &d->id, err));
    PS_TRY(read_int(v, "stage", -1, &d->stage, err));
    PS_TRY(read_value(v, "compute_s", &d->compute_s, err));
    PS_TRY(read_value(v, "comm_s", &d->comm_s, err));
    PS_TRY(read_value(v, "idle_s", &d->idle_s, err));
    PS_TRY(read_value(v, "peak_memory_bytes", &d->peak_memory_bytes, err));
out:
    return st;
}

static ps_status read_stage(const ps_jv *v, ps_summary_stage *g, ps_error *err)
{
    static const char *const keys[] = {
        "index",  "devices",   "first_device", "submesh",  "logical_mesh",
        "time_s", "forward_s", "backward_s",   "update_s", "peak_memory_bytes",
        NULL};
    ps_status st = PS_OK;
    PS_TRY(ps_jv_check_keys(v, keys, err));
    PS_TRY(read_int(v, "index", 0, &g->index, err));
    PS_TRY(read_int(v, "devices", 1, &g->n_devices, err));
    PS_TRY(read_int(v, "first_device", 0, &g->first_device, err));
    PS_TRY(read_pair(v, "submesh", g->submesh, err));
    PS_TRY(read_pair(v, "logical_mesh", g->logical_mesh, err));
    PS_TRY(read_value(v, "time_s", &g->time_s, err));
    PS_TRY(read_value(v, "forward_s", &g->forward_s, err));
    PS_TRY(read_value(v, "backward_s", &g->backward_s, err));
    PS_TRY(read_value(v, "update_s", &g->update_s, err));
    PS_TRY(read_value(v, "peak_memory_bytes", &g->peak_memory_bytes, err));
out:
    return st;
}

/* Reports a semantic finding at its value in the file. */
static ps_status fail_at(const ps_jv *root, const finding *f, ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv arr, elem, at = *root;
    const ps_jv *base = root;
    if (f->array != NULL) {
        PS_TRY(ps_jv_member(root, f->array, &arr, err));
        elem = ps_jv_element(&arr, (size_t)f->index);
        base = &elem;
        at = elem;
    }
    if (f->key != NULL)
        PS_TRY(ps_jv_member(base, f->key, &at, err));
    st = ps_jv_fail(&at, err, PS_ERR_INVALID, "%s", f->what);
out:
    return st;
}

static ps_status summary_from_doc(const ps_json_doc *doc, ps_summary **out, ps_error *err)
{
    static const char *const keys[] = {"format",
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
                                       "timed_steps",
                                       "iteration_min_s",
                                       "iteration_max_s",
                                       "devices",
                                       "stages",
                                       NULL};
    ps_status st = PS_OK;
    ps_summary *s = NULL;
    ps_jv v, devices, stages;
    const char *str;
    int64_t x;
    size_t n_dev, n_st;
    int source;
    *out = NULL;
    ps_jv root = ps_json_doc_root(doc);
    /* the format first: another kind of file (a plan, a trace) is named as
     * such rather than by its first key a summary does not have */
    PS_TRY(ps_jv_object(&root, err));
    PS_TRY(ps_jv_member(&root, "format", &v, err));
    PS_TRY(ps_jv_string(&v, &str, err));
    if (strcmp(str, SUMMARY_FORMAT) != 0) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "a \"%s\" file, not a run summary (\"%s\")",
                        str, SUMMARY_FORMAT);
        goto out;
    }
    PS_TRY(ps_jv_check_keys(&root, keys, err));
    PS_TRY(ps_jv_member(&root, "version", &v, err));
    PS_TRY(ps_jv_int(&v, INT64_MIN, INT64_MAX, &x, err));
    if (x != PS_SUMMARY_VERSION) {
        st = ps_jv_fail(&v, err, PS_ERR_UNSUPPORTED,
                        "unsupported version %lld (this build reads version %d)", (long long)x,
                        PS_SUMMARY_VERSION);
        goto out;
    }
    PS_TRY(ps_jv_member(&root, "source", &v, err));
    PS_TRY(ps_jv_enum(&v, ps_summary_source_names, PS_SUMMARY_SOURCE_COUNT, &source, err));
    PS_TRY(ps_jv_member(&root, "devices", &devices, err));
    PS_TRY(ps_jv_array(&devices, &n_dev, err));
    PS_TRY(ps_jv_member(&root, "stages", &stages, err));
    PS_TRY(ps_jv_array(&stages, &n_st, err));
    if (n_dev > INT32_MAX || n_st > INT32_MAX) {
        st = ps_jv_fail(n_dev > INT32_MAX ? &devices : &stages, err, PS_ERR_INVALID,
                        "too many entries");
        goto out;
    }
    if ((st = ps_summary_create((int)n_dev, (int)n_st, &s)) != PS_OK) {
        st = ps_error_set(err, st, "out of memory");
        goto out;
    }
    snprintf(s->source, sizeof s->source, "%s", ps_summary_source_names[source]);
    PS_TRY(read_text(&root, "plan", s->plan, sizeof s->plan, err));
    PS_TRY(read_text(&root, "model", s->model, sizeof s->model, err));
    PS_TRY(read_text(&root, "cluster", s->cluster, sizeof s->cluster, err));
    PS_TRY(read_int(&root, "micro_batches", 1, &s->micro_batches, err));
    PS_TRY(read_value(&root, "iteration_s", &s->iteration_s, err));
    PS_TRY(read_value(&root, "tflops_per_device", &s->tflops_per_device, err));
    PS_TRY(read_value(&root, "mfu", &s->mfu, err));
    PS_TRY(read_value(&root, "peak_memory_bytes", &s->peak_memory_bytes, err));
    PS_TRY(read_value(&root, "wall_s", &s->wall_s, err));
    /* the three together, or none */
    if (ps_jv_has(&root, "timed_steps") || ps_jv_has(&root, "iteration_min_s") ||
        ps_jv_has(&root, "iteration_max_s")) {
        PS_TRY(read_int(&root, "timed_steps", 1, &s->timed_steps, err));
        PS_TRY(read_value(&root, "iteration_min_s", &s->iteration_min_s, err));
        PS_TRY(read_value(&root, "iteration_max_s", &s->iteration_max_s, err));
    }
    for (size_t i = 0; i < n_dev; i++) {
        ps_jv e = ps_jv_element(&devices, i);
        PS_TRY(read_device(&e, &s->devices[i], err));
    }
    for (size_t i = 0; i < n_st; i++) {
        ps_jv e = ps_jv_element(&stages, i);
        PS_TRY(read_stage(&e, &s->stages[i], err));
    }
    finding f = {0};
    if (!summary_check(s, &f)) {
        st = fail_at(&root, &f, err);
        goto out;
    }
    *out = s;
    s = NULL;
out:
    ps_summary_free(s);
    return st;
}

ps_status ps_summary_load(const char *path, ps_summary **out, ps_error *err)
{
    ps_json_doc *doc = NULL;
    *out = NULL;
    ps_status st = ps_json_doc_load(path, &doc, err);
    if (st == PS_OK)
        st = summary_from_doc(doc, out, err);
    ps_json_doc_free(doc);
    return st;
}

ps_status ps_summary_parse(const char *name, const char *text, ps_summary **out, ps_error *err)
{
    ps_json_doc *doc = NULL;
    *out = NULL;
    ps_status st = ps_json_doc_parse(name, text, &doc, err);
    if (st == PS_OK)
        st = summary_from_doc(doc, out, err);
    ps_json_doc_free(doc);
    return st;
}

/* ---- printing ----------------------------------------------------------- */

#define MS(x) ((x)*1e3)

/* Two decimals, or three digits below 1, where two decimals would read as
 * zero (a CPU run's 0.0012 TFLOP/s, a stage's 0.5 MiB in a MiB column). */
static const char *short_num(double v, char *buf, size_t cap)
{
    snprintf(buf, cap, v == 0 || fabs(v) >= 1 ? "%.2f" : "%.3g", v);
    return buf;
}

static const char *peak_heading(ps_bytes_unit u, char *buf, size_t cap)
{
    snprintf(buf, cap, "peak %s", u.name);
    return buf;
}

static void print_device_digest(const ps_summary *s, FILE *f)
{
    const char *names[3] = {"compute", "comm", "idle"};
    double lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0}, sum[3] = {0, 0, 0};
    int peak = 0;
    for (int i = 0; i < s->n_devices; i++) {
        const ps_summary_device *d = &s->devices[i];
        double x[3] = {d->compute_s, d->comm_s, d->idle_s};
        for (int k = 0; k < 3; k++) {
            lo[k] = i == 0 || x[k] < lo[k] ? x[k] : lo[k];
            hi[k] = i == 0 || x[k] > hi[k] ? x[k] : hi[k];
            sum[k] += x[k];
        }
        if (d->peak_memory_bytes > s->devices[peak].peak_memory_bytes)
            peak = i;
    }
    fprintf(f, "%d devices          min ms    mean ms     max ms\n", s->n_devices);
    for (int k = 0; k < 3; k++)
        fprintf(f, "  %-12s %10.3f %10.3f %10.3f\n", names[k], MS(lo[k]), MS(sum[k] / s->n_devices),
                MS(hi[k]));
    const ps_summary_device *d = &s->devices[peak];
    char bytes[32];
    fprintf(f, "  peak memory  %s on device %d",
            ps_bytes_text(d->peak_memory_bytes, bytes, sizeof bytes), d->id);
    if (d->stage >= 0)
        fprintf(f, " (stage %d)", d->stage);
    fputc('\n', f);
}

void ps_summary_print(const ps_summary *s, FILE *f)
{
    fprintf(f, "%s run of %s on %s, plan %s\n", s->source, s->model[0] ? s->model : "?",
            s->cluster[0] ? s->cluster : "?", s->plan[0] ? s->plan : "?");
    char tf[32], bytes[32], mfu[32];
    snprintf(mfu, sizeof mfu, s->mfu * 100 >= 1 || s->mfu == 0 ? "%.1f" : "%.2g", s->mfu * 100);
    char steps[96] = "";
    if (s->timed_steps > 1)
        snprintf(steps, sizeof steps, " (median of %d steps, %.3f to %.3f ms)", s->timed_steps,
                 MS(s->iteration_min_s), MS(s->iteration_max_s));
    else if (s->timed_steps == 1)
        snprintf(steps, sizeof steps, " (one step)");
    fprintf(f,
            "%d micro-batches, iteration %.3f ms%s, %s TFLOP/s per device, MFU %s%%, "
            "peak memory %s",
            s->micro_batches, MS(s->iteration_s), steps,
            short_num(s->tflops_per_device, tf, sizeof tf), mfu,
            ps_bytes_text(s->peak_memory_bytes, bytes, sizeof bytes));
    if (s->wall_s > 0)
        fprintf(f, " (took %.3f s)", s->wall_s);
    fprintf(f, "\n\n");
    /* each table's memory column in the unit of its largest entry */
    double stage_max = 0;
    for (int i = 0; i < s->n_stages; i++)
        stage_max = fmax(stage_max, s->stages[i].peak_memory_bytes);
    ps_bytes_unit su = ps_bytes_unit_for(stage_max);
    fprintf(f,
            "stage devices  submesh  logical mesh  forward ms backward ms  update ms    time ms"
            " %8s\n",
            peak_heading(su, bytes, sizeof bytes));
    for (int i = 0; i < s->n_stages; i++) {
        const ps_summary_stage *g = &s->stages[i];
        char sub[32], logical[32];
        snprintf(sub, sizeof sub, "%dx%d", g->submesh[0], g->submesh[1]);
        snprintf(logical, sizeof logical, "%dx%d", g->logical_mesh[0], g->logical_mesh[1]);
        char row_gb[32];
        fprintf(f, "%5d %7d %8s %13s %10.3f %10.3f %10.3f %10.3f %8s\n", g->index, g->n_devices,
                sub, logical, MS(g->forward_s), MS(g->backward_s), MS(g->update_s), MS(g->time_s),
                short_num(g->peak_memory_bytes / su.bytes, row_gb, sizeof row_gb));
    }
    fputc('\n', f);
    if (s->n_devices == 0)
        return;
    /* beyond a screenful of devices, a digest says more than every line */
    if (s->n_devices > 16) {
        print_device_digest(s, f);
        return;
    }
    double device_max = 0;
    for (int i = 0; i < s->n_devices; i++)
        device_max = fmax(device_max, s->devices[i].peak_memory_bytes);
    ps_bytes_unit du = ps_bytes_unit_for(device_max);
    fprintf(f, "device stage compute ms    comm ms    idle ms %8s\n",
            peak_heading(du, bytes, sizeof bytes));
    for (int i = 0; i < s->n_devices; i++) {
        const ps_summary_device *d = &s->devices[i];
        char stage[16] = "-";
        if (d->stage >= 0)
            snprintf(stage, sizeof stage, "%d", d->stage);
        char row_gb[32];
        fprintf(f, "%6d %5s %10.3f %10.3f %10.3f %8s\n", d->id, stage, MS(d->compute_s),
                MS(d->comm_s), MS(d->idle_s),
                short_num(d->peak_memory_bytes / du.bytes, row_gb, sizeof row_gb));
    }
}
