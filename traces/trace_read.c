/* Reading Chrome trace-event files back into spans (docs/trace-format.md). */
#include "traces/trace_read.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

/* far beyond any run (about 30 years, in microseconds) */
#define TRACE_MAX_US 1e15
#define TRACE_MAX_DEVICE ((1 << 20) - 1) /* as ps_trace_add allows */

void ps_trace_data_free(ps_trace_data *t)
{
    if (t == NULL)
        return;
    free(t->spans);
    free(t->devices);
    free(t);
}

/* The device's entry, added when new; devices stay sorted by id. NULL when
 * out of memory. Traces name a few devices, so a linear insert is enough. */
static ps_trace_device *device_entry(ps_trace_data *t, int *cap, int id)
{
    int lo = 0, hi = t->n_devices;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (t->devices[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < t->n_devices && t->devices[lo].id == id)
        return &t->devices[lo];
    if (t->n_devices == *cap) {
        int n = *cap > 0 ? *cap * 2 : 16;
        ps_trace_device *bigger = realloc(t->devices, (size_t)n * sizeof *bigger);
        if (bigger == NULL)
            return NULL;
        t->devices = bigger;
        *cap = n;
    }
    memmove(&t->devices[lo + 1], &t->devices[lo], (size_t)(t->n_devices - lo) * sizeof *t->devices);
    t->n_devices++;
    ps_trace_device *d = &t->devices[lo];
    d->id = id;
    snprintf(d->name, sizeof d->name, "device %d", id);
    return d;
}

static int category_index(const char *cat)
{
    for (int i = 0; i < PS_TRACE_CATEGORY_COUNT; i++)
        if (strcmp(cat, ps_trace_category_names[i]) == 0)
            return i;
    return PS_TRACE_OTHER;
}

/* Copies otherData's string `key` into dst when present. */
static void info_text(const ps_jv *root, const char *key, char *dst, size_t cap)
{
    json_t *other = json_is_object(root->v) ? json_object_get(root->v, "otherData") : NULL;
    json_t *v = json_is_object(other) ? json_object_get(other, key) : NULL;
    if (json_is_string(v))
        snprintf(dst, cap, "%s", json_string_value(v));
}

static ps_status read_event(const ps_jv *e, ps_trace_data *t, int *cap_spans, int *cap_devices,
                            ps_error *err)
{
    ps_status st = PS_OK;
    ps_jv v;
    const char *ph, *name = NULL, *cat = "";
    int64_t tid;
    double ts, dur;
    PS_TRY(ps_jv_object(e, err));
    PS_TRY(ps_jv_member(e, "ph", &v, err));
    PS_TRY(ps_jv_string(&v, &ph, err));
    bool span = strcmp(ph, "X") == 0;
    if (!span && strcmp(ph, "M") == 0)
        PS_TRY(ps_jv_opt_string(e, "name", "", &name, err));
    bool thread_name = name != NULL && strcmp(name, "thread_name") == 0;
    if (!span && !thread_name)
        goto out; /* counters, instants, other metadata: not drawn */
    PS_TRY(ps_jv_member(e, "tid", &v, err));
    PS_TRY(ps_jv_int(&v, 0, TRACE_MAX_DEVICE, &tid, err));
    ps_trace_device *d = device_entry(t, cap_devices, (int)tid);
    PS_TRY_ALLOC(d, err);
    if (thread_name) {
        ps_jv args, label;
        const char *text;
        PS_TRY(ps_jv_member(e, "args", &args, err));
        PS_TRY(ps_jv_member(&args, "name", &label, err));
        PS_TRY(ps_jv_string(&label, &text, err));
        snprintf(d->name, sizeof d->name, "%s", text);
        goto out;
    }
    PS_TRY(ps_jv_member(e, "ts", &v, err));
    PS_TRY(ps_jv_double(&v, 0, TRACE_MAX_US, &ts, err));
    PS_TRY(ps_jv_member(e, "dur", &v, err));
    PS_TRY(ps_jv_double(&v, 0, TRACE_MAX_US, &dur, err));
    PS_TRY(ps_jv_opt_string(e, "cat", "", &cat, err));
    if (t->n_spans == *cap_spans) {
        int n = *cap_spans > 0 ? *cap_spans * 2 : 1024;
        ps_trace_span *bigger = realloc(t->spans, (size_t)n * sizeof *bigger);
        PS_TRY_ALLOC(bigger, err);
        t->spans = bigger;
        *cap_spans = n;
    }
    t->spans[t->n_spans++] = (ps_trace_span){.device = (int)tid,
                                             .category = category_index(cat),
                                             .start_s = ts * 1e-6, /* the format's unit is us */
                                             .duration_s = dur * 1e-6};
out:
    return st;
}

static ps_status trace_from_doc(const ps_json_doc *doc, ps_trace_data **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_trace_data *t = NULL;
    ps_jv events;
    size_t n;
    int cap_spans = 0, cap_devices = 0;
    *out = NULL;
    ps_jv root = ps_json_doc_root(doc);
    if (json_is_array(root.v))
        events = root;
    else if (json_is_object(root.v))
        PS_TRY(ps_jv_member(&root, "traceEvents", &events, err));
    else {
        st = ps_jv_fail(&root, err, PS_ERR_INVALID,
                        "expected a trace: an object with \"traceEvents\" or an array of events");
        goto out;
    }
    PS_TRY(ps_jv_array(&events, &n, err));
    if (n > INT32_MAX / 2) {
        st = ps_jv_fail(&events, err, PS_ERR_INVALID, "too many events (%zu)", n);
        goto out;
    }
    t = calloc(1, sizeof *t);
    PS_TRY_ALLOC(t, err);
    for (size_t i = 0; i < n; i++) {
        ps_jv e = ps_jv_element(&events, i);
        PS_TRY(read_event(&e, t, &cap_spans, &cap_devices, err));
    }
    if (t->n_spans == 0) {
        st = ps_error_set(err, PS_ERR_INVALID, "%s: no spans (\"ph\": \"X\" events) to draw",
                          doc->name);
        goto out;
    }
    /* time from the first span: producers may start their clock earlier */
    double first = INFINITY;
    for (int i = 0; i < t->n_spans; i++)
        first = fmin(first, t->spans[i].start_s);
    for (int i = 0; i < t->n_spans; i++) {
        t->spans[i].start_s -= first;
        t->end_s = fmax(t->end_s, t->spans[i].start_s + t->spans[i].duration_s);
    }
    info_text(&root, "source", t->source, sizeof t->source);
    info_text(&root, "model", t->model, sizeof t->model);
    info_text(&root, "cluster", t->cluster, sizeof t->cluster);
    *out = t;
    t = NULL;
out:
    ps_trace_data_free(t);
    return st;
}

ps_status ps_trace_load(const char *path, ps_trace_data **out, ps_error *err)
{
    ps_json_doc *doc = NULL;
    *out = NULL;
    ps_status st = ps_json_doc_load(path, &doc, err);
    if (st == PS_OK)
        st = trace_from_doc(doc, out, err);
    ps_json_doc_free(doc);
    return st;
}

ps_status ps_trace_parse(const char *name, const char *text, ps_trace_data **out,
                         ps_error *err)
{
    ps_json_doc *doc = NULL;
    *out = NULL;
    ps_status st = ps_json_doc_parse(name, text, &doc, err);
    if (st == PS_OK)
        st = trace_from_doc(doc, out, err);
    ps_json_doc_free(doc);
    return st;
}
