/* Timelines in the Chrome trace-event JSON format (opens in Perfetto and
 * chrome://tracing): one process per host (node), one thread per device,
 * complete events ("ph":"X") for compute, communication and memory
 * operations. The writer streams events to the file as they come, so that
 * simulations of thousands of devices need no memory per event.
 * docs/trace-format.md describes the file. */
#ifndef PS_TRACES_TRACE_H
#define PS_TRACES_TRACE_H

#include <stdio.h>

#include "core/status.h"

typedef enum ps_trace_category {
    PS_TRACE_COMPUTE = 0,    /* a kernel's ops */
    PS_TRACE_COLLECTIVE = 1, /* all-reduce, all-gather, ... */
    PS_TRACE_SEND = 2,
    PS_TRACE_RECV = 3,
    PS_TRACE_IDLE = 4,       /* waiting (a blocked receive, a bubble) */
    PS_TRACE_CATEGORY_COUNT
} ps_trace_category;

extern const char *const ps_trace_category_names[PS_TRACE_CATEGORY_COUNT];

typedef struct ps_trace_writer ps_trace_writer;

/* Opens path for writing; devices_per_node maps devices to hosts
 * (pid = node, tid = device); "-" is standard output. */
ps_status ps_trace_open(const char *path, int devices_per_node, ps_trace_writer **out,
                        ps_error *err);
/* Adds "key": "value" to the file's otherData (e.g. source, plan digest,
 * model); written by ps_trace_close, the last value of a key wins. */
ps_status ps_trace_set_info(ps_trace_writer *w, const char *key, const char *value);
/* Names the thread of a device (e.g. "device 3 (stage 1)"); optional. */
ps_status ps_trace_name_device(ps_trace_writer *w, int device, const char *name);
/* One span; start and duration in seconds (written in microseconds).
 * micro_batch < 0 and peer < 0 are omitted from the event's args;
 * bytes and flops <= 0 likewise (and stage < 0: no stage). A NULL name is
 * written as the category's name. Failures (a negative device, a bad span,
 * an I/O error) return non-OK here and are reported again, with the path,
 * by ps_trace_close. */
typedef struct ps_trace_event {
    int device;
    ps_trace_category category;
    const char *name;  /* e.g. "forward mb3", "all-reduce", "send to 12" */
    double start_s, duration_s;
    int micro_batch;
    int stage;
    int peer;
    double bytes, flops;
} ps_trace_event;
ps_status ps_trace_add(ps_trace_writer *w, const ps_trace_event *e);
/* Finishes the JSON and closes the file; the writer is freed even on error. */
ps_status ps_trace_close(ps_trace_writer *w, ps_error *err);

/* The name of a span of a kernel's computations, as every writer spells it:
 * "forward mb3", "backward mb0", "update", or "compute" outside a kernel
 * (phase < 0). */
void ps_trace_compute_name(int phase, int micro_batch, char *buf, int cap);

#endif
