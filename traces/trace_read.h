/* Reading a Chrome trace-event file (as traces/trace.h writes them) back
 * into spans per device, for the timeline chart. The whole file is parsed
 * with jansson, so memory grows with the trace (about 1 KB per event). */
#ifndef PS_TRACES_TRACE_READ_H
#define PS_TRACES_TRACE_READ_H

#include "core/status.h"
#include "traces/trace.h"

/* Spans whose category is none of ps_trace_category_names (traces from
 * other tools) get this one. */
#define PS_TRACE_OTHER PS_TRACE_CATEGORY_COUNT

typedef struct ps_trace_span {
    int device;     /* tid: the global device id */
    int category;   /* ps_trace_category, or PS_TRACE_OTHER */
    double start_s; /* since the trace's first span */
    double duration_s;
} ps_trace_span;

typedef struct ps_trace_device {
    int id;
    char name[96]; /* thread_name, or "device N" */
} ps_trace_device;

typedef struct ps_trace_data {
    int n_spans, n_devices;
    ps_trace_span *spans;     /* in file order */
    ps_trace_device *devices; /* every device with a span or a name, by increasing id */
    double end_s;             /* end of the last span, from the first span's start */
    /* otherData's source, model and cluster when present, else "" */
    char source[32], model[64], cluster[64];
} ps_trace_data;

/* Reads complete events ("ph":"X") and thread names; other events are
 * skipped. Accepts the object form ({"traceEvents": [...]}) and a bare
 * array. Reports FILE:LINE:COL: PATH: what is wrong. */
ps_status ps_trace_load(const char *path, ps_trace_data **out, ps_error *err);
/* The same from text held in memory; name is used in messages. */
ps_status ps_trace_parse(const char *name, const char *text, ps_trace_data **out,
                         ps_error *err);
void ps_trace_data_free(ps_trace_data *t);

#endif
