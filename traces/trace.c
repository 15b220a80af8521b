/* The streaming Chrome trace-event writer (docs/trace-format.md). Each event
 * goes to stdio as it is added; the writer keeps only one bit-set per node
 * and one state byte per device (names already emitted), so a trace of
 * millions of events costs no memory per event. */
#include "traces/trace.h"

#include "core/program.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/cluster.h"

const char *const ps_trace_category_names[PS_TRACE_CATEGORY_COUNT] = {"compute", "collective",
                                                                      "send", "recv", "idle"};

/* Per-device naming state: the thread_name metadata already written. */
enum { DEVICE_UNSEEN = 0, DEVICE_DEFAULT_NAME = 1, DEVICE_CUSTOM_NAME = 2 };

struct ps_trace_writer {
    FILE *f;
    bool is_stdout;
    char *path;
    int devices_per_node;
    long long n_events;       /* events written, metadata included (for the commas) */
    long long n_spans;        /* ps_trace_add calls, numbering events in messages */
    unsigned char *device;    /* [cap_devices] naming state */
    unsigned char *node_seen; /* [cap_nodes] */
    int cap_devices, cap_nodes;
    json_t *info;     /* otherData entries */
    ps_status failed; /* first failure of add/name, reported again by close */
    char failure[256];
};

/* Remembers the first failure so that close can report it with the path. */
static ps_status writer_fail(ps_trace_writer *w, ps_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static ps_status writer_fail(ps_trace_writer *w, ps_status st, const char *fmt, ...)
{
    if (w->failed != PS_OK)
        return st;
    w->failed = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->failure, sizeof w->failure, fmt, ap);
    va_end(ap);
    return st;
}

/* Grows a zero-filled byte array so that index i exists. */
static bool grow(unsigned char **arr, int *cap, int i)
{
    if (i < *cap)
        return true;
    int n = *cap > 0 ? *cap : 64;
    while (n <= i)
        n = n > INT32_MAX / 2 ? INT32_MAX : n * 2;
    unsigned char *bigger = realloc(*arr, (size_t)n);
    if (bigger == NULL)
        return false;
    memset(bigger + *cap, 0, (size_t)(n - *cap));
    *arr = bigger;
    *cap = n;
    return true;
}

/* Decodes one UTF-8 sequence at s; returns its length, or 0 when it is not
 * valid (overlong, surrogate, beyond U+10FFFF, truncated). */
static size_t utf8_length(const unsigned char *s)
{
    uint32_t c;
    size_t n;
    if (s[0] < 0x80)
        return 1;
    if ((s[0] & 0xe0) == 0xc0) {
        n = 2;
        c = s[0] & 0x1f;
    } else if ((s[0] & 0xf0) == 0xe0) {
        n = 3;
        c = s[0] & 0x0f;
    } else if ((s[0] & 0xf8) == 0xf0) {
        n = 4;
        c = s[0] & 0x07;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3f);
    }
    static const uint32_t min_for_length[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min_for_length[n] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return 0;
    return n;
}

/* Writes s as a JSON string literal; bytes that are not UTF-8 become U+FFFD
 * so that the file stays valid JSON whatever the caller passed. */
static void put_string(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    while (*p != '\0') {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
            p++;
        } else if (c < 0x20) {
            static const char short_escape[] = {
                ['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
            if (c < sizeof short_escape && short_escape[c] != 0)
                fprintf(f, "\\%c", short_escape[c]);
            else
                fprintf(f, "\\u%04x", c);
            p++;
        } else {
            size_t n = utf8_length(p);
            if (n == 0) {
                fputs("\\ufffd", f);
                p++;
            } else {
                fwrite(p, 1, n, f);
                p += n;
            }
        }
    }
    fputc('"', f);
}

/* A number written exactly but briefly: 1048576, not 1048576.0000000000. */
static void put_number(FILE *f, double x)
{
    char buf[40];
    snprintf(buf, sizeof buf, "%.15g", x);
    if (strtod(buf, NULL) != x)
        snprintf(buf, sizeof buf, "%.17g", x);
    fputs(buf, f);
}

/* Starts one element of traceEvents. */
static void begin_event(ps_trace_writer *w)
{
    fputs(w->n_events == 0 ? "\n" : ",\n", w->f);
    w->n_events++;
}

static ps_status check_io(ps_trace_writer *w)
{
    if (ferror(w->f))
        return writer_fail(w, PS_ERR_IO, "write failed: %s", strerror(errno));
    return PS_OK;
}

static void put_meta(ps_trace_writer *w, const char *what, int pid, int tid, const char *key,
                     const char *text, int number)
{
    begin_event(w);
    fprintf(w->f, "{\"ph\":\"M\",\"name\":\"%s\",\"pid\":%d", what, pid);
    if (tid >= 0)
        fprintf(w->f, ",\"tid\":%d", tid);
    fprintf(w->f, ",\"args\":{\"%s\":", key);
    if (text != NULL)
        put_string(w->f, text);
    else
        fprintf(w->f, "%d", number);
    fputs("}}", w->f);
}

/* Names the node of a device and the device itself the first time they
 * appear (custom: a name given by ps_trace_name_device). */
static ps_status see_device(ps_trace_writer *w, int device, const char *custom)
{
    int node = device / w->devices_per_node;
    if (!grow(&w->device, &w->cap_devices, device) || !grow(&w->node_seen, &w->cap_nodes, node))
        return writer_fail(w, PS_ERR_NOMEM, "out of memory");
    if (!w->node_seen[node]) {
        char name[32];
        snprintf(name, sizeof name, "node %d", node);
        put_meta(w, "process_name", node, -1, "name", name, 0);
        put_meta(w, "process_sort_index", node, -1, "sort_index", NULL, node);
        w->node_seen[node] = 1;
    }
    bool unseen = w->device[device] == DEVICE_UNSEEN;
    if (custom != NULL) {
        /* a later thread_name replaces an earlier one in the viewers */
        put_meta(w, "thread_name", node, device, "name", custom, 0);
        w->device[device] = DEVICE_CUSTOM_NAME;
    } else if (unseen) {
        char name[32];
        snprintf(name, sizeof name, "device %d", device);
        put_meta(w, "thread_name", node, device, "name", name, 0);
        w->device[device] = DEVICE_DEFAULT_NAME;
    }
    /* threads in device order, whatever order they first appear in */
    if (unseen)
        put_meta(w, "thread_sort_index", node, device, "sort_index", NULL, device);
    return check_io(w);
}

ps_status ps_trace_open(const char *path, int devices_per_node, ps_trace_writer **out,
                        ps_error *err)
{
    ps_status st = PS_OK;
    ps_trace_writer *w = NULL;
    *out = NULL;
    if (devices_per_node < 1) {
        st = ps_error_set(err, PS_ERR_INVALID, "%s: %d devices per node (at least 1)", path,
                          devices_per_node);
        goto out;
    }
    w = calloc(1, sizeof *w);
    PS_TRY_ALLOC(w, err);
    w->path = strdup(path);
    PS_TRY_ALLOC(w->path, err);
    w->info = json_object();
    PS_TRY_ALLOC(w->info, err);
    w->devices_per_node = devices_per_node;
    w->is_stdout = strcmp(path, "-") == 0;
    w->f = w->is_stdout ? stdout : fopen(path, "wb");
    if (w->f == NULL) {
        st = ps_error_set(err, PS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
        goto out;
    }
    /* big writes: a trace is millions of short lines */
    if (!w->is_stdout)
        setvbuf(w->f, NULL, _IOFBF, 1 << 20);
    if (fputs("{\"traceEvents\":[", w->f) < 0) {
        st = ps_error_set(err, PS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        goto out;
    }
    *out = w;
    w = NULL;
out:
    if (w != NULL) {
        if (w->f != NULL && !w->is_stdout)
            fclose(w->f);
        json_decref(w->info);
        free(w->path);
        free(w);
    }
    return st;
}

ps_status ps_trace_set_info(ps_trace_writer *w, const char *key, const char *value)
{
    if (key == NULL || value == NULL)
        return writer_fail(w, PS_ERR_INVALID, "trace info: NULL key or value");
    json_t *v = json_string(value);
    if (v == NULL)
        return writer_fail(w, PS_ERR_INVALID, "trace info \"%s\": value is not UTF-8", key);
    if (json_object_set_new(w->info, key, v) != 0)
        return writer_fail(w, PS_ERR_INVALID, "trace info: key is not UTF-8");
    return PS_OK;
}

ps_status ps_trace_name_device(ps_trace_writer *w, int device, const char *name)
{
    if (device < 0 || device >= PS_CLUSTER_MAX_DEVICES)
        return writer_fail(w, PS_ERR_INVALID, "naming device %d: not a device id", device);
    if (name == NULL)
        return writer_fail(w, PS_ERR_INVALID, "naming device %d: no name", device);
    return see_device(w, device, name);
}

ps_status ps_trace_add(ps_trace_writer *w, const ps_trace_event *e)
{
    ps_status st = PS_OK;
    long long index = w->n_spans++;
    if (e->device < 0 || e->device >= PS_CLUSTER_MAX_DEVICES) {
        st = writer_fail(w, PS_ERR_INVALID, "event %lld: device %d is not a device id", index,
                         e->device);
        goto out;
    }
    if ((int)e->category < 0 || e->category >= PS_TRACE_CATEGORY_COUNT) {
        st = writer_fail(w, PS_ERR_INVALID, "event %lld: unknown category %d", index,
                         (int)e->category);
        goto out;
    }
    /* negative or non-finite spans would draw nonsense (or break the JSON) */
    if (!isfinite(e->start_s) || !isfinite(e->duration_s) || e->start_s < 0 || e->duration_s < 0) {
        st = writer_fail(w, PS_ERR_INVALID,
                         "event %lld on device %d: span start %g s, "
                         "duration %g s (both must be finite and non-negative)",
                         index, e->device, e->start_s, e->duration_s);
        goto out;
    }
    PS_TRY(see_device(w, e->device, NULL));
    const char *cat = ps_trace_category_names[e->category];
    FILE *f = w->f;
    begin_event(w);
    fprintf(f, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":",
            e->device / w->devices_per_node, e->device, e->start_s * 1e6, e->duration_s * 1e6);
    put_string(f, e->name != NULL ? e->name : cat);
    fprintf(f, ",\"cat\":\"%s\",\"args\":{", cat);
    const char *sep = "";
    if (e->stage >= 0) {
        fprintf(f, "\"stage\":%d", e->stage);
        sep = ",";
    }
    if (e->micro_batch >= 0) {
        fprintf(f, "%s\"micro_batch\":%d", sep, e->micro_batch);
        sep = ",";
    }
    if (e->peer >= 0) {
        fprintf(f, "%s\"peer\":%d", sep, e->peer);
        sep = ",";
    }
    if (e->bytes > 0 && isfinite(e->bytes)) {
        fprintf(f, "%s\"bytes\":", sep);
        put_number(f, e->bytes);
        sep = ",";
    }
    if (e->flops > 0 && isfinite(e->flops)) {
        fprintf(f, "%s\"flops\":", sep);
        put_number(f, e->flops);
    }
    fputs("}}", f);
    PS_TRY(check_io(w));
out:
    return st;
}

ps_status ps_trace_close(ps_trace_writer *w, ps_error *err)
{
    ps_status st = PS_OK;
    char *info = NULL;
    if (w == NULL)
        return PS_OK;
    json_object_set_new(w->info, "generator", json_string("pipeshard"));
    json_object_set_new(w->info, "devices_per_node", json_integer(w->devices_per_node));
    info = json_dumps(w->info, JSON_COMPACT | JSON_SORT_KEYS);
    fprintf(w->f, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":%s}\n",
            info != NULL ? info : "{}");
    if (w->failed != PS_OK) {
        st = ps_error_set(err, w->failed, "%s: %s", w->path, w->failure);
        goto out;
    }
    if (info == NULL) {
        st = ps_error_set(err, PS_ERR_NOMEM, "%s: out of memory", w->path);
        goto out;
    }
    if (fflush(w->f) != 0 || ferror(w->f)) {
        st = ps_error_set(err, PS_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
        goto out;
    }
out:
    /* close even after a failure, and report a failing close (a full disk
     * often shows only here) */
    if (!w->is_stdout && fclose(w->f) != 0 && st == PS_OK)
        st = ps_error_set(err, PS_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    free(info);
    json_decref(w->info);
    free(w->device);
    free(w->node_seen);
    free(w->path);
    free(w);
    return st;
}

void ps_trace_compute_name(int phase, int micro_batch, char *buf, int cap)
{
    if (phase < 0 || phase >= PS_PHASE_COUNT)
        snprintf(buf, (size_t)cap, "compute");
    else if (phase == PS_PHASE_UPDATE || micro_batch < 0)
        snprintf(buf, (size_t)cap, "%s", ps_phase_names[phase]);
    else
        snprintf(buf, (size_t)cap, "%s mb%d", ps_phase_names[phase], micro_batch);
}
