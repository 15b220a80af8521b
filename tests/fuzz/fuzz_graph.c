/* Fuzz target: graph files (core/graph_json.c), then the training-step
 * builder on every graph that loads (planner/train_step.c).
 * Properties: a loaded graph saves, and what it saves loads back and saves
 * to the same text; a loaded graph passes ps_graph_check; the training step
 * built from it does too. */
#include "core/graph.h"
#include "planner/train_step.h"
#include "tests/fuzz/fuzz_common.h"

static char *graph_text(const ps_graph *g)
{
    json_t *j = NULL;
    FUZZ_ASSERT(ps_graph_to_json(g, &j) == PS_OK, "a loaded graph did not save");
    char *text = fuzz_dump(j);
    json_decref(j);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *text = fuzz_text(data, size);
    ps_error err = {0};
    ps_graph *g = NULL, *back = NULL, *step = NULL;
    ps_graph_parse("input.json", text, &g, &err);
    free(text);
    if (g == NULL)
        return 0;
    FUZZ_ASSERT(ps_graph_check(g, &err) == PS_OK, "loaded, then refused: %s", err.msg);
    char *saved = graph_text(g);
    ps_graph_parse("saved.json", saved, &back, &err);
    FUZZ_ASSERT(back != NULL, "saved, then refused: %s\n%s", err.msg, saved);
    char *again = graph_text(back);
    FUZZ_ASSERT(strcmp(saved, again) == 0, "saved twice differently:\n%s\n---\n%s", saved, again);
    ps_train_options opt = ps_train_options_default();
    if (ps_train_step_build(g, &opt, &step, &err) == PS_OK) {
        FUZZ_ASSERT(ps_graph_check(step, &err) == PS_OK, "a built step is invalid: %s", err.msg);
        fuzz_accepted();
    }
    free(saved);
    free(again);
    ps_graph_free(step);
    ps_graph_free(back);
    ps_graph_free(g);
    return 0;
}
