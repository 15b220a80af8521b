/* Fuzz target: cluster files (core/cluster.c).
 * Properties: a loaded cluster validates, saves, and loads back equal;
 * its compute share is finite and at least 1. */
#include <math.h>

#include "core/cluster.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *text = fuzz_text(data, size);
    ps_error err = {0};
    ps_cluster *c = NULL;
    ps_cluster_parse("input.json", text, &c, &err);
    free(text);
    if (c == NULL)
        return 0;
    FUZZ_ASSERT(ps_cluster_validate(c, &err) == PS_OK, "loaded, then refused: %s", err.msg);
    json_t *j = NULL;
    FUZZ_ASSERT(ps_cluster_to_json(c, &j) == PS_OK, "a loaded cluster did not save");
    char *saved = fuzz_dump(j);
    json_decref(j);
    ps_cluster *back = NULL;
    ps_cluster_parse("saved.json", saved, &back, &err);
    FUZZ_ASSERT(back != NULL, "saved, then refused: %s\n%s", err.msg, saved);
    FUZZ_ASSERT(ps_cluster_equal(c, back), "loaded back different:\n%s", saved);
    double mem = ps_cluster_min_memory_bytes(c);
    FUZZ_ASSERT(mem > 0, "least device memory %g", mem);
    double share = ps_cluster_compute_share(c);
    FUZZ_ASSERT(isfinite(share) && share >= 1, "compute share %g", share);
    fuzz_accepted();
    free(saved);
    ps_cluster_free(back);
    ps_cluster_free(c);
    return 0;
}
