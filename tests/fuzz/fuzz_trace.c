/* Fuzz target: timelines (traces/trace_read.c), what the timeline chart
 * reads: any Chrome/Perfetto trace, not only ours.
 * Properties: the spans of a loaded trace start at or after 0, end by its
 * end, and name devices that it lists. */
#include <math.h>

#include "tests/fuzz/fuzz_common.h"
#include "traces/trace_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *text = fuzz_text(data, size);
    ps_error err = {0};
    ps_trace_data *t = NULL;
    ps_status st = ps_trace_parse("input.json", text, &t, &err);
    free(text);
    if (st != PS_OK)
        return 0;
    FUZZ_ASSERT(t->n_spans > 0, "a loaded trace without spans");
    for (int i = 0; i < t->n_spans; i++) {
        const ps_trace_span *s = &t->spans[i];
        FUZZ_ASSERT(isfinite(s->start_s) && s->start_s >= 0 && isfinite(s->duration_s) &&
                        s->duration_s >= 0 && s->start_s + s->duration_s <= t->end_s,
                    "span %d: start %g s, duration %g s, trace end %g s", i, s->start_s,
                    s->duration_s, t->end_s);
        int listed = 0;
        for (int d = 0; d < t->n_devices && !listed; d++)
            listed = t->devices[d].id == s->device;
        FUZZ_ASSERT(listed, "span %d on device %d, which is not listed", i, s->device);
    }
    for (int d = 1; d < t->n_devices; d++)
        FUZZ_ASSERT(t->devices[d - 1].id < t->devices[d].id, "devices out of order at %d", d);
    fuzz_accepted();
    ps_trace_data_free(t);
    return 0;
}
