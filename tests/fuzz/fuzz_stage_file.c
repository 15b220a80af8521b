/* Fuzz target: manual stage files (planner/stage_file.c), `plan --stages
 * FILE`. Properties: every stage read has a logical mesh with as many
 * devices as its submesh (layer ranges are checked against the model when
 * planning); a refusal returns no stages. */
#include "planner/stage_file.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *text = fuzz_text(data, size);
    ps_error err = {0};
    ps_inter_options o = ps_inter_options_default();
    ps_manual_stage *stages = NULL;
    int n = 0;
    ps_status st = ps_stage_file_parse("input.json", text, &o, &stages, &n, &err);
    free(text);
    if (st != PS_OK) {
        FUZZ_ASSERT(stages == NULL && n == 0, "refused, yet %d stages returned", n);
        return 0;
    }
    FUZZ_ASSERT(n >= 1 && stages != NULL, "accepted with %d stages", n);
    for (int i = 0; i < n; i++) {
        const ps_manual_stage *s = &stages[i];
        FUZZ_ASSERT(s->submesh[0] >= 1 && s->submesh[1] >= 1 && s->logical_mesh[0] >= 1 &&
                        s->logical_mesh[1] >= 1 &&
                        s->logical_mesh[0] * s->logical_mesh[1] == s->submesh[0] * s->submesh[1],
                    "stage %d: submesh %dx%d, logical mesh %dx%d", i, s->submesh[0], s->submesh[1],
                    s->logical_mesh[0], s->logical_mesh[1]);
    }
    fuzz_accepted();
    free(stages);
    return 0;
}
