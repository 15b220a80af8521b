/* Fuzz target: the short texts users type on the command line: einsum specs
 * (core/op.c), sharding specs (core/sharding.c), submesh lists
 * (planner/inter_pass.c), cluster presets (core/cluster_presets.c) and
 * model names (planner/models/zoo.c). The first byte picks the parser; the
 * rest is the text.
 * Properties: what parses formats back to text that parses to the same
 * value; a preset cluster and a zoo model validate. */
#include "core/cluster.h"
#include "core/op.h"
#include "core/sharding.h"
#include "planner/inter_pass.h"
#include "planner/models/zoo.h"
#include "tests/fuzz/fuzz_common.h"

static void einsum_case(const char *text)
{
    ps_error err = {0};
    ps_einsum e, back;
    /* compared whole below: labels past each rank included */
    memset(&e, 0, sizeof e);
    memset(&back, 0, sizeof back);
    if (ps_einsum_parse(text, &e, &err) != PS_OK)
        return;
    char buf[64];
    ps_einsum_format(&e, buf, sizeof buf);
    FUZZ_ASSERT(ps_einsum_parse(buf, &back, &err) == PS_OK, "\"%s\" formatted as \"%s\": %s", text,
                buf, err.msg);
    FUZZ_ASSERT(memcmp(&e, &back, sizeof e) == 0, "\"%s\" formatted as \"%s\" reads differently",
                text, buf);
    fuzz_accepted();
}

static void spec_case(const char *text)
{
    int rank = ps_spec_text_rank(text);
    ps_sharding_spec s, back;
    if (!ps_spec_parse(text, rank, &s))
        return;
    FUZZ_ASSERT(ps_spec_well_formed(&s), "\"%s\" parsed into a malformed spec", text);
    char buf[PS_SPEC_STR_MAX];
    ps_spec_format(&s, buf, sizeof buf);
    FUZZ_ASSERT(ps_spec_text_rank(buf) == s.rank && ps_spec_parse(buf, s.rank, &back) &&
                    ps_spec_equal(&s, &back),
                "\"%s\" formatted as \"%s\" reads differently", text, buf);
    fuzz_accepted();
}

static void submeshes_case(const char *text)
{
    ps_error err = {0};
    ps_inter_options o = ps_inter_options_default();
    if (ps_inter_parse_submeshes(text, &o, &err) == PS_OK)
        fuzz_accepted();
}

static void preset_case(const char *text)
{
    ps_error err = {0};
    ps_cluster *c = NULL;
    if (ps_cluster_from_preset(text, &c, &err) != PS_OK)
        return;
    FUZZ_ASSERT(ps_cluster_validate(c, &err) == PS_OK, "preset \"%s\": %s", text, err.msg);
    fuzz_accepted();
    ps_cluster_free(c);
}

static void model_case(const char *text)
{
    ps_error err = {0};
    ps_model_config c;
    if (ps_zoo_lookup(text, &c, &err) == PS_OK) {
        FUZZ_ASSERT(ps_model_config_validate(&c, &err) == PS_OK, "model \"%s\": %s", text, err.msg);
        fuzz_accepted();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static void (*const cases[])(const char *) = {einsum_case, spec_case, submeshes_case,
                                                  preset_case, model_case};
    fuzz_quiet();
    if (size < 1)
        return 0;
    char *text = fuzz_text(data + 1, size - 1);
    cases[data[0] % (sizeof cases / sizeof *cases)](text);
    free(text);
    return 0;
}
