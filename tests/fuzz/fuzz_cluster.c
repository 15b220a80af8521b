/* Fuzz target: cluster files (core/cluster.c).
 * Properties: a loaded cluster validates, saves, and loads back equal. */
#include "core/cluster.h"
#include "core/json.h"
#include "tests/fuzz/fuzz_common.h"

static ps_cluster *cluster_parse(const char *text, ps_error *err)
{
    ps_json_doc *doc = NULL;
    ps_cluster *c = NULL;
    if (ps_json_doc_parse("input.json", text, &doc, err) == PS_OK) {
        ps_jv root = ps_json_doc_root(doc);
        ps_cluster_from_json(&root, &c, err);
    }
    ps_json_doc_free(doc);
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *text = fuzz_text(data, size);
    ps_error err = {0};
    ps_cluster *c = cluster_parse(text, &err);
    free(text);
    if (c == NULL)
        return 0;
    FUZZ_ASSERT(ps_cluster_validate(c, &err) == PS_OK, "loaded, then refused: %s", err.msg);
    json_t *j = NULL;
    FUZZ_ASSERT(ps_cluster_to_json(c, &j) == PS_OK, "a loaded cluster did not save");
    char *saved = fuzz_dump(j);
    json_decref(j);
    ps_cluster *back = cluster_parse(saved, &err);
    FUZZ_ASSERT(back != NULL, "saved, then refused: %s\n%s", err.msg, saved);
    FUZZ_ASSERT(ps_cluster_equal(c, back), "loaded back different:\n%s", saved);
    double mem = ps_cluster_min_memory_bytes(c);
    FUZZ_ASSERT(mem > 0, "least device memory %g", mem);
    fuzz_accepted();
    free(saved);
    ps_cluster_free(back);
    ps_cluster_free(c);
    return 0;
}
