/* Fuzz target: run summaries (traces/summary.c), what `compare` reads.
 * Properties: a loaded summary validates, saves, and loads back to the same
 * text; printing it does not fail. */
#include "tests/fuzz/fuzz_common.h"
#include "traces/summary.h"

static char *summary_text(const ps_summary *s)
{
    json_t *j = NULL;
    FUZZ_ASSERT(ps_summary_to_json(s, &j) == PS_OK, "a loaded summary did not save");
    char *text = fuzz_dump(j);
    json_decref(j);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *text = fuzz_text(data, size);
    ps_error err = {0};
    ps_summary *s = NULL, *back = NULL;
    ps_status st = ps_summary_parse("input.json", text, &s, &err);
    free(text);
    if (st != PS_OK)
        return 0;
    FUZZ_ASSERT(ps_summary_validate(s, &err) == PS_OK, "loaded, then refused: %s", err.msg);
    char *saved = summary_text(s);
    FUZZ_ASSERT(ps_summary_parse("saved.json", saved, &back, &err) == PS_OK,
                "saved, then refused: %s\n%s", err.msg, saved);
    char *again = summary_text(back);
    FUZZ_ASSERT(strcmp(saved, again) == 0, "saved twice differently:\n%s\n---\n%s", saved, again);
    fuzz_accepted();
    FILE *sink = fopen("/dev/null", "w");
    if (sink != NULL) {
        ps_summary_print(s, sink);
        fclose(sink);
    }
    free(saved);
    free(again);
    ps_summary_free(back);
    ps_summary_free(s);
    return 0;
}
