/* Fuzz target: `plan --graph G.json` on two devices, then `sim`'s first
 * steps: a graph file is planned as one stage (planner/plan_intra.c: the
 * training step, the intra-op ILP through GLPK), the plan is saved and
 * loaded back, its model rebuilt from the plan and lowered.
 * Properties: a graph that plans gives a plan that loads back with the same
 * digest, lowers, and whose programs pass ps_program_set_check. The method
 * (shard, data, zero2, zero3) is picked by the input's length. */
#include "core/cluster.h"
#include "core/graph.h"
#include "core/plan.h"
#include "core/program.h"
#include "planner/lower.h"
#include "planner/plan_intra.h"
#include "planner/plan_model.h"
#include "tests/fuzz/fuzz_common.h"

/* The fuzzer's budget, not a property: larger graphs make ILPs that take
 * seconds per input. */
#define FORWARD_OPS_MAX 200

/* One node of two H100s (docs/cluster-format.md). */
static const char cluster_json[] =
    "{\"name\": \"h100x2\", \"nodes\": 1, \"devices_per_node\": 2,"
    " \"device\": {\"name\": \"h100-sxm5-80gb\","
    "  \"peak_flops\": {\"fp32\": 6.7e13, \"fp16\": 9.894e14, \"bf16\": 9.894e14},"
    "  \"memory_bytes\": 85899345920, \"memory_bandwidth_bytes_per_s\": 3.35e12},"
    " \"intra_node\": {\"topology\": \"nvswitch\", \"bandwidth_bytes_per_s\": 4.5e11,"
    "  \"latency_s\": 2e-6},"
    " \"inter_node\": {\"topology\": \"fat-tree\", \"nics_per_node\": 8,"
    "  \"nic_bandwidth_bytes_per_s\": 5e10, \"latency_s\": 5e-6}}";

static ps_cluster *two_gpus(void)
{
    ps_error err = {0};
    ps_cluster *c = NULL;
    FUZZ_ASSERT(ps_cluster_parse("h100x2", cluster_json, &c, &err) == PS_OK, "%s", err.msg);
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ps_cluster *cluster; /* built once, for the whole run */
    fuzz_quiet();
    if (cluster == NULL)
        cluster = two_gpus();
    char *text = fuzz_text(data, size);
    ps_error err = {0};
    ps_graph *fwd = NULL;
    ps_plan *plan = NULL, *back = NULL;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    char *saved = NULL;
    ps_graph_parse("input.json", text, &fwd, &err);
    free(text);
    if (fwd == NULL || fwd->n_ops > FORWARD_OPS_MAX)
        goto out;
    ps_plan_request req;
    memset(&req, 0, sizeof req);
    req.forward = fwd;
    req.train = ps_train_options_default();
    req.cluster = cluster;
    req.method = (ps_intra_method)(size % PS_METHOD_COUNT);
    req.micro_batches = 1;
    /* as `plan --graph` does: one micro-batch of the graph's batch */
    req.global_batch = ps_graph_batch(fwd) > 0 ? ps_graph_batch(fwd) : 1;
    req.ilp = ps_ilp_options_default();
    req.ilp.time_limit_s = 2;
    if (ps_plan_one_stage(&req, &plan, NULL, NULL, &err) != PS_OK)
        goto out;
    json_t *j = NULL;
    FUZZ_ASSERT(ps_plan_to_json(plan, &j) == PS_OK, "a plan did not save");
    saved = fuzz_dump(j);
    json_decref(j);
    FUZZ_ASSERT(ps_plan_parse("saved.json", saved, &back, &err) == PS_OK,
                "a plan saved, then refused: %s", err.msg);
    char d1[32], d2[32];
    ps_plan_digest(plan, d1, sizeof d1);
    ps_plan_digest(back, d2, sizeof d2);
    FUZZ_ASSERT(strcmp(d1, d2) == 0, "a plan loaded back different");
    FUZZ_ASSERT(ps_plan_model_build(back, &m, &err) == PS_OK,
                "the model of a plan just made was refused: %s", err.msg);
    ps_lower_options lo = ps_lower_options_default();
    FUZZ_ASSERT(ps_plan_lower(back, m, &lo, &set, &err) == PS_OK,
                "a plan just made did not lower: %s", err.msg);
    FUZZ_ASSERT(ps_program_set_check(set, NULL, &err) == PS_OK, "lowered programs invalid: %s",
                err.msg);
    fuzz_accepted();
out:
    free(saved);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    ps_plan_free(back);
    ps_plan_free(plan);
    ps_graph_free(fwd);
    return 0;
}
