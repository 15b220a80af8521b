/* Cluster spec: presets and their datasheet numbers, NAME:N parsing, the JSON
 * format (round trips, heterogeneous overrides) and every malformed file in
 * tests/data/bad/cluster.manifest. */
/* cmocka needs these before it, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cluster.h"
#include "core/json.h"

#define GIB 1073741824.0

/* The example of docs/cluster-format.md: 3 nodes of 8; node 2 is V100, the
 * upper half of node 0 is a 40 GB A100 defined in device_kinds. */
static const char hetero_json[] =
    "{\n"
    "  \"name\": \"mixed-a100-v100\",\n"
    "  \"nodes\": 3,\n"
    "  \"devices_per_node\": 8,\n"
    "  \"device\": \"a100-sxm4-80gb\",\n"
    "  \"device_kinds\": [\n"
    "    {\n"
    "      \"name\": \"a100-sxm4-40gb\",\n"
    "      \"peak_flops\": {\"fp32\": 19.5e12, \"fp16\": 312e12, \"bf16\": 312e12},\n"
    "      \"memory_bytes\": 42949672960,\n"
    "      \"memory_bandwidth_bytes_per_s\": 1555e9\n"
    "    }\n"
    "  ],\n"
    "  \"overrides\": [\n"
    "    {\"nodes\": [2], \"device\": \"v100-sxm2-16gb\"},\n"
    "    {\"devices\": [4, 5, 6, 7], \"device\": \"a100-sxm4-40gb\"}\n"
    "  ],\n"
    "  \"intra_node\": {\"topology\": \"nvswitch\", \"bandwidth_bytes_per_s\": 300e9,\n"
    "                 \"latency_s\": 2e-6},\n"
    "  \"inter_node\": {\"topology\": \"fat-tree\", \"nics_per_node\": 8,\n"
    "                 \"nic_bandwidth_bytes_per_s\": 25e9, \"latency_s\": 5e-6}\n"
    "}\n";

/* ---- helpers ----------------------------------------------------------- */

static ps_cluster *preset_ok(const char *spec)
{
    ps_error err = {0};
    ps_cluster *c = NULL;
    ps_status st = ps_cluster_from_preset(spec, &c, &err);
    if (st != PS_OK)
        fail_msg("preset \"%s\": %s", spec, err.msg);
    assert_non_null(c);
    assert_int_equal(ps_cluster_validate(c, &err), PS_OK);
    return c;
}

/* Parses JSON text held in memory; returns the status, the message in err. */
static ps_status from_text(const char *text, ps_cluster **out, ps_error *err)
{
    ps_json_doc *doc = NULL;
    *out = NULL;
    ps_status st = ps_json_doc_parse("<test>", text, &doc, err);
    if (st == PS_OK) {
        ps_jv root = ps_json_doc_root(doc);
        st = ps_cluster_from_json(&root, out, err);
    }
    ps_json_doc_free(doc);
    return st;
}

static ps_cluster *from_text_ok(const char *text)
{
    ps_error err = {0};
    ps_cluster *c = NULL;
    if (from_text(text, &c, &err) != PS_OK)
        fail_msg("%s", err.msg);
    return c;
}

static void expect_text_error(const char *text, const char *substring)
{
    ps_error err = {0};
    ps_cluster *c = NULL;
    ps_status st = from_text(text, &c, &err);
    assert_int_not_equal(st, PS_OK);
    assert_null(c);
    if (strstr(err.msg, substring) == NULL)
        fail_msg("expected \"%s\" in \"%s\"", substring, err.msg);
}

/* save -> load through a temporary file must give an equal cluster. */
static void check_file_round_trip(const ps_cluster *c)
{
    const char *dir = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/ps_test_cluster_XXXXXX", dir != NULL && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);

    ps_error err = {0};
    ps_cluster *back = NULL;
    ps_status st = ps_cluster_save(c, path, &err);
    if (st == PS_OK)
        st = ps_cluster_load(path, &back, &err);
    unlink(path);
    if (st != PS_OK)
        fail_msg("round trip of %s: %s", c->name, err.msg);
    assert_true(ps_cluster_equal(c, back));
    ps_cluster_free(back);
}

/* to_json -> text -> from_json, in memory. */
static void check_text_round_trip(const ps_cluster *c)
{
    json_t *j = NULL;
    assert_int_equal(ps_cluster_to_json(c, &j), PS_OK);
    char *text = ps_json_dumps(j);
    assert_non_null(text);
    ps_cluster *back = from_text_ok(text);
    assert_true(ps_cluster_equal(c, back));
    ps_cluster_free(back);
    free(text);
    json_decref(j);
}

/* ---- presets ----------------------------------------------------------- */

static void check_kind(const ps_device_kind *k, const char *name, double fp32, double fp16,
                       double bf16, double mem, double bw)
{
    assert_string_equal(k->name, name);
    assert_true(k->peak_flops[PS_DTYPE_F32] == fp32);
    assert_true(k->peak_flops[PS_DTYPE_F16] == fp16);
    assert_true(k->peak_flops[PS_DTYPE_BF16] == bf16);
    assert_true(k->memory_bytes == mem);
    assert_true(k->memory_bandwidth_bytes_per_s == bw);
}

static void test_preset_p3(void **state)
{
    (void)state;
    ps_cluster *c = preset_ok("p3.16xlarge");
    assert_string_equal(c->name, "p3.16xlarge:1");
    assert_int_equal(c->nodes, 1);
    assert_int_equal(c->devices_per_node, 8);
    assert_int_equal(c->n_kinds, 1);
    check_kind(ps_cluster_device(c, 7), "v100-sxm2-16gb", 15.7e12, 125e12, 0.0, 17179869184.0,
               900e9);
    assert_int_equal(c->intra.topology, PS_INTRA_NVLINK_RING);
    assert_true(c->intra.bandwidth_bytes_per_s == 150e9);
    assert_true(c->intra.latency_s == 2e-6);
    assert_int_equal(c->inter.topology, PS_INTER_FAT_TREE);
    assert_int_equal(c->inter.nics_per_node, 1);
    assert_true(c->inter.nic_bandwidth_bytes_per_s == 3.125e9);
    assert_true(c->inter.latency_s == 25e-6);
    ps_cluster_free(c);
}

static void test_preset_dgx_a100(void **state)
{
    (void)state;
    ps_cluster *c = preset_ok("dgx-a100:4");
    assert_string_equal(c->name, "dgx-a100:4");
    assert_int_equal(c->nodes, 4);
    assert_int_equal(ps_cluster_device_count(c), 32);
    for (int d = 0; d < 32; d++)
        check_kind(ps_cluster_device(c, d), "a100-sxm4-80gb", 19.5e12, 312e12, 312e12, 80 * GIB,
                   2039e9);
    assert_null(ps_cluster_device(c, 32));
    assert_null(ps_cluster_device(c, -1));
    assert_int_equal(c->intra.topology, PS_INTRA_NVSWITCH);
    assert_true(c->intra.bandwidth_bytes_per_s == 300e9);
    assert_true(c->intra.latency_s == 2e-6);
    assert_int_equal(c->inter.topology, PS_INTER_FAT_TREE);
    assert_int_equal(c->inter.nics_per_node, 8);
    assert_true(c->inter.nic_bandwidth_bytes_per_s == 25e9);
    assert_true(c->inter.latency_s == 5e-6);
    ps_cluster_free(c);
}

static void test_preset_dgx_h100(void **state)
{
    (void)state;
    ps_cluster *c = preset_ok("dgx-h100:16");
    assert_string_equal(c->name, "dgx-h100:16");
    assert_int_equal(ps_cluster_device_count(c), 128);
    check_kind(ps_cluster_device(c, 127), "h100-sxm5-80gb", 67e12, 989.4e12, 989.4e12,
               85899345920.0, 3.35e12);
    assert_int_equal(c->intra.topology, PS_INTRA_NVSWITCH);
    assert_true(c->intra.bandwidth_bytes_per_s == 450e9);
    assert_true(c->intra.latency_s == 2e-6);
    assert_int_equal(c->inter.nics_per_node, 8);
    assert_true(c->inter.nic_bandwidth_bytes_per_s == 50e9);
    assert_true(c->inter.latency_s == 5e-6);
    ps_cluster_free(c);
}

static void test_preset_list(void **state)
{
    (void)state;
    assert_int_equal(ps_cluster_preset_count(), 3);
    const char *names[] = {"p3.16xlarge", "dgx-a100", "dgx-h100"};
    for (int i = 0; i < 3; i++) {
        const ps_cluster_preset_info *p = ps_cluster_preset_get(i);
        assert_non_null(p);
        assert_string_equal(p->name, names[i]);
        assert_true(strlen(p->description) > 0);
        ps_cluster *c = preset_ok(p->name);
        ps_cluster_free(c);
    }
    assert_null(ps_cluster_preset_get(-1));
    assert_null(ps_cluster_preset_get(3));

    assert_int_equal(ps_device_kind_builtin_count(), 3);
    for (int i = 0; i < ps_device_kind_builtin_count(); i++) {
        const ps_device_kind *k = ps_device_kind_builtin_get(i);
        assert_ptr_equal(ps_device_kind_builtin_find(k->name), k);
    }
    assert_null(ps_device_kind_builtin_get(3));
    assert_null(ps_device_kind_builtin_find("tpu-v4"));
}

static void expect_preset_error(const char *spec, ps_status want, const char *substring)
{
    ps_error err = {0};
    ps_cluster *c = NULL;
    ps_status st = ps_cluster_from_preset(spec, &c, &err);
    assert_int_equal(st, want);
    assert_int_equal(err.status, want);
    assert_null(c);
    if (strstr(err.msg, substring) == NULL)
        fail_msg("preset \"%s\": expected \"%s\" in \"%s\"", spec, substring, err.msg);
}

static void test_preset_spec_parsing(void **state)
{
    (void)state;
    ps_cluster *c = preset_ok("dgx-a100");
    assert_string_equal(c->name, "dgx-a100:1");
    assert_int_equal(c->nodes, 1);
    ps_cluster_free(c);
    c = preset_ok("p3.16xlarge:8");
    assert_string_equal(c->name, "p3.16xlarge:8");
    assert_int_equal(ps_cluster_device_count(c), 64);
    ps_cluster_free(c);
    c = preset_ok("dgx-h100:007"); /* the name is normalized */
    assert_string_equal(c->name, "dgx-h100:7");
    ps_cluster_free(c);
    /* Exactly at the cap: 131072 nodes x 8 = 2^20 devices. */
    c = preset_ok("dgx-a100:131072");
    assert_int_equal(ps_cluster_device_count(c), PS_CLUSTER_MAX_DEVICES);
    ps_cluster_free(c);

    expect_preset_error("dgx-a100:0", PS_ERR_INVALID, "node count must be >= 1");
    expect_preset_error("dgx-a100:x", PS_ERR_INVALID, "invalid node count \"x\"");
    expect_preset_error("dgx-a100:", PS_ERR_INVALID, "missing node count");
    expect_preset_error("dgx-a100:-2", PS_ERR_INVALID, "invalid node count \"-2\"");
    expect_preset_error("dgx-a100:+2", PS_ERR_INVALID, "invalid node count");
    expect_preset_error("dgx-a100:2x", PS_ERR_INVALID, "invalid node count \"2x\"");
    expect_preset_error("dgx-a100: 2", PS_ERR_INVALID, "invalid node count");
    expect_preset_error("dgx-a100:131073", PS_ERR_INVALID, "too many devices");
    expect_preset_error("dgx-a100:99999999999999999999999", PS_ERR_INVALID, "too many devices");
    expect_preset_error("dgx-a1000:2", PS_ERR_NOT_FOUND,
                        "unknown cluster preset \"dgx-a1000\" (known presets: p3.16xlarge, "
                        "dgx-a100, dgx-h100)");
    expect_preset_error("DGX-A100", PS_ERR_NOT_FOUND, "unknown cluster preset");
    expect_preset_error("", PS_ERR_NOT_FOUND, "unknown cluster preset \"\"");
    expect_preset_error(":4", PS_ERR_NOT_FOUND, "unknown cluster preset");
}

/* ---- JSON round trips ---------------------------------------------------- */

static void test_round_trip_presets(void **state)
{
    (void)state;
    for (int i = 0; i < ps_cluster_preset_count(); i++) {
        for (int nodes = 1; nodes <= 3; nodes += 2) {
            char spec[64];
            snprintf(spec, sizeof spec, "%s:%d", ps_cluster_preset_get(i)->name, nodes);
            ps_cluster *c = preset_ok(spec);
            check_file_round_trip(c);
            check_text_round_trip(c);
            ps_cluster_free(c);
        }
    }
}

static void test_heterogeneous(void **state)
{
    (void)state;
    ps_cluster *c = from_text_ok(hetero_json);
    assert_string_equal(c->name, "mixed-a100-v100");
    assert_int_equal(ps_cluster_device_count(c), 24);
    /* kinds: the default, then device_kinds, then built-ins in order of use. */
    assert_int_equal(c->n_kinds, 3);
    assert_string_equal(c->kinds[0].name, "a100-sxm4-80gb");
    assert_string_equal(c->kinds[1].name, "a100-sxm4-40gb");
    assert_string_equal(c->kinds[2].name, "v100-sxm2-16gb");
    for (int d = 0; d < 24; d++) {
        const char *want = d < 4    ? "a100-sxm4-80gb"
                           : d < 8  ? "a100-sxm4-40gb"
                           : d < 16 ? "a100-sxm4-80gb"
                                    : "v100-sxm2-16gb";
        assert_string_equal(ps_cluster_device(c, d)->name, want);
    }
    check_kind(ps_cluster_device(c, 5), "a100-sxm4-40gb", 19.5e12, 312e12, 312e12, 40 * GIB,
               1555e9);
    check_kind(ps_cluster_device(c, 16), "v100-sxm2-16gb", 15.7e12, 125e12, 0, 16 * GIB, 900e9);
    check_file_round_trip(c);
    check_text_round_trip(c);

    /* The written form puts whole nodes in "nodes" and the rest in "devices". */
    json_t *j = NULL;
    assert_int_equal(ps_cluster_to_json(c, &j), PS_OK);
    json_t *ov = json_object_get(j, "overrides");
    assert_int_equal(json_array_size(ov), 2);
    assert_int_equal(json_array_size(json_object_get(json_array_get(ov, 0), "devices")), 4);
    assert_null(json_object_get(json_array_get(ov, 0), "nodes"));
    assert_int_equal(json_array_size(json_object_get(json_array_get(ov, 1), "nodes")), 1);
    assert_null(json_object_get(json_array_get(ov, 1), "devices"));
    json_decref(j);
    ps_cluster_free(c);
}

static void test_preset_with_overrides(void **state)
{
    (void)state;
    /* Later overrides win; an inline kind may be used directly. */
    ps_cluster *c = from_text_ok(
        "{\"preset\": \"dgx-a100:2\", \"name\": \"a100-h100\",\n"
        " \"overrides\": [\n"
        "  {\"nodes\": [1], \"device\": \"h100-sxm5-80gb\"},\n"
        "  {\"devices\": [15], \"device\": \"a100-sxm4-80gb\"},\n"
        "  {\"devices\": [0], \"device\": {\"name\": \"slow\", \"peak_flops\": {\"fp32\": 1e12},\n"
        "   \"memory_bytes\": 1e9, \"memory_bandwidth_bytes_per_s\": 1e11}}]}");
    assert_string_equal(c->name, "a100-h100");
    assert_int_equal(c->nodes, 2);
    assert_int_equal(c->n_kinds, 3);
    assert_string_equal(ps_cluster_device(c, 0)->name, "slow");
    assert_true(ps_cluster_device(c, 0)->peak_flops[PS_DTYPE_F16] == 0);
    assert_string_equal(ps_cluster_device(c, 1)->name, "a100-sxm4-80gb");
    assert_string_equal(ps_cluster_device(c, 8)->name, "h100-sxm5-80gb");
    assert_string_equal(ps_cluster_device(c, 14)->name, "h100-sxm5-80gb");
    assert_string_equal(ps_cluster_device(c, 15)->name, "a100-sxm4-80gb");
    assert_true(c->intra.bandwidth_bytes_per_s == 300e9); /* links from the preset */
    check_file_round_trip(c);
    ps_cluster_free(c);

    /* A kind of the file named as the preset's own shadows it on every
     * device, as it shadows any other built-in; a second one is a duplicate */
    c = from_text_ok("{\"preset\": \"dgx-a100:1\", \"device_kinds\": [{\"name\": "
                     "\"a100-sxm4-80gb\", \"peak_flops\": {\"fp32\": 1e9}, \"memory_bytes\": "
                     "1e6, \"memory_bandwidth_bytes_per_s\": 1e9}]}");
    assert_int_equal(c->n_kinds, 1);
    assert_true(ps_cluster_device(c, 7)->peak_flops[PS_DTYPE_F32] == 1e9);
    assert_true(ps_cluster_min_memory_bytes(c) == 1e6);
    check_file_round_trip(c);
    ps_cluster_free(c);

    /* Without overrides the preset form equals the preset. */
    c = from_text_ok("{\"preset\": \"dgx-h100:3\"}");
    ps_cluster *p = preset_ok("dgx-h100:3");
    assert_true(ps_cluster_equal(c, p));
    ps_cluster_free(c);
    ps_cluster_free(p);
}

static void test_default_kind_forms(void **state)
{
    (void)state;
    /* "device" naming one of device_kinds: it becomes kinds[0], not a copy. */
    ps_cluster *c = from_text_ok(
        "{\"name\": \"own\", \"nodes\": 1, \"devices_per_node\": 4, \"device\": \"b\",\n"
        " \"device_kinds\": [\n"
        "  {\"name\": \"a\", \"peak_flops\": {\"fp32\": 1e12}, \"memory_bytes\": 1e9,\n"
        "   \"memory_bandwidth_bytes_per_s\": 1e11},\n"
        "  {\"name\": \"b\", \"peak_flops\": {\"fp32\": 2e12, \"bf16\": 8e12}, \"memory_bytes\": "
        "2e9,\n"
        "   \"memory_bandwidth_bytes_per_s\": 2e11}],\n"
        " \"overrides\": [{\"devices\": [3], \"device\": \"a\"}],\n"
        " \"intra_node\": {\"topology\": \"pcie\", \"bandwidth_bytes_per_s\": 16e9, \"latency_s\": "
        "0},\n"
        " \"inter_node\": {\"topology\": \"switch\", \"nics_per_node\": 1,\n"
        "                \"nic_bandwidth_bytes_per_s\": 1.25e9, \"latency_s\": 1e-5}}");
    assert_int_equal(c->n_kinds, 2);
    assert_string_equal(c->kinds[0].name, "b");
    assert_string_equal(c->kinds[1].name, "a");
    assert_string_equal(ps_cluster_device(c, 0)->name, "b");
    assert_string_equal(ps_cluster_device(c, 3)->name, "a");
    assert_true(ps_cluster_device(c, 0)->peak_flops[PS_DTYPE_BF16] == 8e12);
    assert_int_equal(c->intra.topology, PS_INTRA_PCIE);
    assert_int_equal(c->inter.topology, PS_INTER_SWITCH);
    assert_true(c->intra.latency_s == 0);
    check_file_round_trip(c);
    check_text_round_trip(c);
    ps_cluster_free(c);

    /* An inline default with odd (non-integral) numbers survives a round trip
     * (rates of 1 to 1e20 per second: ps_cluster_validate). */
    c = from_text_ok(
        "{\"name\": \"odd\", \"nodes\": 2, \"devices_per_node\": 3,\n"
        " \"device\": {\"name\": \"x\", \"peak_flops\": {\"fp32\": 1.1, \"fp16\": "
        "1.0000000000000002,\n"
        "   \"bf16\": 9.9999999999999998e19}, \"memory_bytes\": 1.2345678901234567e19,\n"
        "   \"memory_bandwidth_bytes_per_s\": 3.3333333333333335},\n"
        " \"intra_node\": {\"topology\": \"nvlink-ring\", \"bandwidth_bytes_per_s\": 1.001,\n"
        "                \"latency_s\": 1.0000000000000002e-6},\n"
        " \"inter_node\": {\"topology\": \"fat-tree\", \"nics_per_node\": 1024,\n"
        "                \"nic_bandwidth_bytes_per_s\": 7, \"latency_s\": 0.3}}");
    check_file_round_trip(c);
    check_text_round_trip(c);
    ps_cluster_free(c);
}

/* A few checks that need text, not a file (the files cover the rest). */
static void test_json_errors_in_memory(void **state)
{
    (void)state;
    expect_text_error("{\"preset\": 3}", "preset: expected a string");
    /* the first shadows the preset's kind (test_preset_with_overrides), the
     * second is a duplicate */
    expect_text_error(
        "{\"preset\": \"dgx-a100\", \"device_kinds\": [{\"name\": \"a100-sxm4-80gb\", "
        "\"peak_flops\": {\"fp32\": 1}, \"memory_bytes\": 1, "
        "\"memory_bandwidth_bytes_per_s\": 1}, {\"name\": \"a100-sxm4-80gb\", "
        "\"peak_flops\": {\"fp32\": 2}, \"memory_bytes\": 1, "
        "\"memory_bandwidth_bytes_per_s\": 1}]}",
        "device_kinds[1].name: duplicate device kind name \"a100-sxm4-80gb\"");
    expect_text_error("{\"preset\": \"dgx-a100\", \"overrides\": [3]}",
                      "overrides[0]: expected an object, found an integer");
    expect_text_error("{\"preset\": \"dgx-a100\", \"overrides\": [{\"nodes\": 0, \"device\": "
                      "\"a100-sxm4-80gb\"}]}",
                      "overrides[0].nodes: expected an array");
    expect_text_error("{\"preset\": \"dgx-a100\", \"overrides\": [{\"devices\": [1.5], "
                      "\"device\": \"a100-sxm4-80gb\"}]}",
                      "overrides[0].devices[0]: expected an integer");
    expect_text_error("{\"preset\": \"dgx-a100\", \"name\": \"\"}", "name: a name must have");
    expect_text_error("{\"preset\": \"dgx-h100:1\", \"overrides\": [{\"devices\": [0], "
                      "\"device\": {\"name\": \"z\", \"peak_flops\": {\"fp32\": 1, \"fp16\": -1}, "
                      "\"memory_bytes\": 1, \"memory_bandwidth_bytes_per_s\": 1}}]}",
                      "overrides[0].device.peak_flops.fp16: must be zero or positive");
    expect_text_error("{}", "(top level): missing key \"name\"");
    expect_text_error("\"dgx-a100\"", "'[' or '{' expected");
}

/* Devices sharing cores: the key's checks, its share, and round trips
 * (absent when 0, so that files without it read and write the same). */
static void test_shared_cores(void **state)
{
    (void)state;
    const char *head = "{\"name\": \"host\", \"nodes\": 2, \"devices_per_node\": 8, "
                       "\"device\": \"a100-sxm4-80gb\", \"intra_node\": {\"topology\": "
                       "\"nvswitch\", \"bandwidth_bytes_per_s\": 1e9, \"latency_s\": 0}, "
                       "\"inter_node\": {\"topology\": \"fat-tree\", \"nics_per_node\": 1, "
                       "\"nic_bandwidth_bytes_per_s\": 1e9, \"latency_s\": 0}";
    const struct {
        const char *value;
        int cores;
        double share;
    } ok[] = {{"1", 1, 8}, {"2", 2, 4}, {"3", 3, 8.0 / 3}, {"8", 8, 1}, {"64", 64, 1}};
    char text[1024];
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        snprintf(text, sizeof text, "%s, \"shared_cores_per_node\": %s}", head, ok[i].value);
        ps_cluster *c = from_text_ok(text);
        assert_int_equal(c->shared_cores_per_node, ok[i].cores);
        assert_true(ps_cluster_compute_share(c) == ok[i].share);
        check_file_round_trip(c);
        check_text_round_trip(c);
        ps_cluster *copy = NULL;
        assert_int_equal(ps_cluster_clone(c, &copy), PS_OK);
        assert_true(ps_cluster_equal(c, copy));
        copy->shared_cores_per_node++;
        assert_false(ps_cluster_equal(c, copy));
        ps_cluster_free(copy);
        ps_cluster_free(c);
    }
    snprintf(text, sizeof text, "%s}", head);
    ps_cluster *c = from_text_ok(text);
    assert_int_equal(c->shared_cores_per_node, 0);
    assert_true(ps_cluster_compute_share(c) == 1);
    json_t *j = NULL;
    assert_int_equal(ps_cluster_to_json(c, &j), PS_OK);
    assert_null(json_object_get(j, "shared_cores_per_node"));
    json_decref(j);
    c->shared_cores_per_node = -1;
    ps_error err = {0};
    assert_int_equal(ps_cluster_validate(c, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "shared_cores_per_node must be 1 to"));
    ps_cluster_free(c);
    const struct {
        const char *value, *want;
    } bad[] = {
        {"0", "shared_cores_per_node: must be at least 1 (found 0)"},
        {"-2", "shared_cores_per_node: must be at least 1 (found -2)"},
        {"2.0", "shared_cores_per_node: expected an integer"},
        {"\"2\"", "shared_cores_per_node: expected an integer"},
        {"null", "shared_cores_per_node: expected an integer"},
        {"2000000", "shared_cores_per_node: 2000000 is too large"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(text, sizeof text, "%s, \"shared_cores_per_node\": %s}", head, bad[i].value);
        expect_text_error(text, bad[i].want);
    }
    /* a preset's shape is the preset's */
    expect_text_error("{\"preset\": \"dgx-a100\", \"shared_cores_per_node\": 2}",
                      "shared_cores_per_node");
    /* the scheduler's slice: with shared cores only, 0 to 1 s, absent when 0 */
    snprintf(text, sizeof text, "%s, \"shared_cores_per_node\": 2, \"scheduler_slice_s\": 0.003}",
             head);
    c = from_text_ok(text);
    assert_true(c->scheduler_slice_s == 0.003);
    check_file_round_trip(c);
    check_text_round_trip(c);
    ps_cluster *copy = NULL;
    assert_int_equal(ps_cluster_clone(c, &copy), PS_OK);
    assert_true(ps_cluster_equal(c, copy));
    copy->scheduler_slice_s = 0.002;
    assert_false(ps_cluster_equal(c, copy));
    copy->scheduler_slice_s = 2;
    ps_error e1 = {0}, e2 = {0};
    assert_int_equal(ps_cluster_validate(copy, &e1), PS_ERR_INVALID);
    assert_non_null(strstr(e1.msg, "scheduler_slice_s must be 0 to 1 s (found 2)"));
    copy->scheduler_slice_s = 0.003;
    copy->shared_cores_per_node = 0;
    assert_int_equal(ps_cluster_validate(copy, &e2), PS_ERR_INVALID);
    assert_non_null(strstr(e2.msg, "it needs shared_cores_per_node"));
    ps_cluster_free(copy);
    c->scheduler_slice_s = 0;
    assert_int_equal(ps_cluster_to_json(c, &j), PS_OK);
    assert_null(json_object_get(j, "scheduler_slice_s"));
    json_decref(j);
    ps_cluster_free(c);
    const struct {
        const char *rest, *want;
    } bad_slice[] = {
        {"\"shared_cores_per_node\": 2, \"scheduler_slice_s\": -0.001", "scheduler_slice_s"},
        {"\"shared_cores_per_node\": 2, \"scheduler_slice_s\": 1.5", "scheduler_slice_s"},
        {"\"shared_cores_per_node\": 2, \"scheduler_slice_s\": \"3ms\"", "scheduler_slice_s"},
        {"\"scheduler_slice_s\": 0.003",
         "scheduler_slice_s: is for devices that share cores: it needs shared_cores_per_node"},
    };
    for (size_t i = 0; i < sizeof bad_slice / sizeof *bad_slice; i++) {
        snprintf(text, sizeof text, "%s, %s}", head, bad_slice[i].rest);
        expect_text_error(text, bad_slice[i].want);
    }
    expect_text_error("{\"preset\": \"dgx-a100\", \"scheduler_slice_s\": 0.003}",
                      "scheduler_slice_s");
}

static void test_bad_files(void **state)
{
    (void)state;
    const char *manifest = PS_TEST_DATA_DIR "/bad/cluster.manifest";
    FILE *f = fopen(manifest, "r");
    if (f == NULL)
        fail_msg("cannot open %s", manifest);
    char line[1024];
    int checked = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#')
            continue;
        char *tab = strchr(line, '\t');
        if (tab == NULL)
            fail_msg("%s: line without a TAB: %s", manifest, line);
        *tab = '\0';
        const char *want = tab + 1;
        char path[1200];
        snprintf(path, sizeof path, "%s/bad/%s", PS_TEST_DATA_DIR, line);

        ps_error err = {0};
        ps_cluster *c = NULL;
        ps_status st = ps_cluster_load(path, &c, &err);
        if (st == PS_OK)
            fail_msg("%s loaded, expected an error containing \"%s\"", line, want);
        assert_null(c);
        assert_int_equal(err.status, st);
        if (strncmp(err.msg, path, strlen(path)) != 0 || err.msg[strlen(path)] != ':')
            fail_msg("%s: message does not start with the path: %s", line, err.msg);
        if (strstr(err.msg, want) == NULL)
            fail_msg("%s: expected \"%s\" in \"%s\"", line, want, err.msg);
        checked++;
    }
    fclose(f);
    assert_true(checked >= 12);
}

static void test_missing_file(void **state)
{
    (void)state;
    ps_error err = {0};
    ps_cluster *c = NULL;
    const char *path = PS_TEST_DATA_DIR "/bad/no-such-cluster.json";
    assert_int_equal(ps_cluster_load(path, &c, &err), PS_ERR_IO);
    assert_null(c);
    assert_true(strncmp(err.msg, path, strlen(path)) == 0);
}

/* ---- construction, validation, equality ---------------------------------- */

static void test_create_validate_equal(void **state)
{
    (void)state;
    ps_error err = {0};
    ps_cluster *c = preset_ok("dgx-a100:2"), *d = NULL;
    assert_int_equal(ps_cluster_clone(c, &d), PS_OK);
    assert_true(ps_cluster_equal(c, d));
    assert_true(ps_cluster_equal(NULL, NULL));
    assert_false(ps_cluster_equal(c, NULL));

    /* Heterogeneous by hand: add a kind and assign it. */
    int k = -1;
    assert_int_equal(
        ps_cluster_add_kind(d, ps_device_kind_builtin_find("h100-sxm5-80gb"), &k, &err), PS_OK);
    assert_int_equal(k, 1);
    assert_false(ps_cluster_equal(c, d)); /* kind lists differ */
    d->device_kind[9] = k;
    assert_int_equal(ps_cluster_validate(d, &err), PS_OK);
    assert_int_equal(ps_cluster_find_kind(d, "h100-sxm5-80gb"), 1);
    assert_int_equal(ps_cluster_find_kind(d, "nope"), -1);
    assert_int_equal(
        ps_cluster_add_kind(d, ps_device_kind_builtin_find("h100-sxm5-80gb"), NULL, &err),
        PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "duplicate device kind"));
    check_file_round_trip(d);

    /* Each broken invariant is caught. */
    ps_cluster *e = NULL;
#define BROKEN(stmt, substring)                                                                    \
    do {                                                                                           \
        ps_error e_err = {0};                                                                      \
        assert_int_equal(ps_cluster_clone(d, &e), PS_OK);                                          \
        stmt;                                                                                      \
        assert_int_equal(ps_cluster_validate(e, &e_err), PS_ERR_INVALID);                          \
        if (strstr(e_err.msg, substring) == NULL)                                                  \
            fail_msg("expected \"%s\" in \"%s\"", substring, e_err.msg);                           \
        json_t *j_ = NULL;                                                                         \
        assert_int_not_equal(ps_cluster_to_json(e, &j_), PS_OK);                                   \
        assert_null(j_);                                                                           \
        ps_cluster_free(e);                                                                        \
    } while (0)
    BROKEN(e->device_kind[3] = 2, "device 3 has kind index 2");
    BROKEN(e->device_kind[0] = -1, "kind index -1");
    BROKEN(e->kinds[1].memory_bytes = 0, "memory_bytes must be positive");
    BROKEN(e->kinds[0].peak_flops[PS_DTYPE_F32] = 0, "peak_flops.fp32 must be 1 to 1e20 FLOP/s");
    BROKEN(e->kinds[0].peak_flops[PS_DTYPE_BF16] = 0.5, "peak_flops.bf16 must be 0, or 1 to 1e20");
    BROKEN(e->kinds[0].peak_flops[PS_DTYPE_F32] = 2e20, "peak_flops.fp32 must be 1 to 1e20");
    BROKEN(e->kinds[0].memory_bandwidth_bytes_per_s = 0.5,
           "memory_bandwidth_bytes_per_s must be 1 to 1e20 B/s");
    BROKEN(e->kinds[0].peak_flops[PS_DTYPE_BF16] = -1, "peak_flops.bf16 must be 0, or 1 to 1e20");
    BROKEN(e->kinds[1].memory_bandwidth_bytes_per_s = INFINITY, "memory_bandwidth");
    BROKEN(strcpy(e->kinds[1].name, e->kinds[0].name), "duplicate device kind");
    BROKEN(e->kinds[1].name[0] = '\0', "has no name");
    BROKEN(e->intra.bandwidth_bytes_per_s = -1, "intra-node link");
    BROKEN(e->intra.latency_s = -1e-6, "intra-node link");
    BROKEN(e->intra.latency_s = 3601, "a latency of 0 to 3600 s");
    BROKEN(e->inter.nic_bandwidth_bytes_per_s = 0.5, "1 to 1e20 B/s");
    BROKEN(e->intra.topology = PS_INTRA_TOPOLOGY_COUNT, "topology");
    BROKEN(e->inter.nics_per_node = 0, "inter-node link");
    BROKEN(e->inter.latency_s = NAN, "inter-node link");
    BROKEN(e->nodes = 0, "not a valid size");
    BROKEN(e->name[0] = '\0', "without a name");
#undef BROKEN

    /* Equality sees every field. */
    assert_int_equal(ps_cluster_clone(c, &e), PS_OK);
    e->inter.latency_s *= 2;
    assert_false(ps_cluster_equal(c, e));
    ps_cluster_free(e);
    assert_int_equal(ps_cluster_clone(c, &e), PS_OK);
    e->kinds[0].peak_flops[PS_DTYPE_BF16] = 0;
    assert_false(ps_cluster_equal(c, e));
    ps_cluster_free(e);

    /* ps_cluster_create checks its arguments. */
    const ps_cluster *src = c;
    ps_error cerr = {0};
    assert_int_equal(
        ps_cluster_create("x", 0, 8, &src->kinds[0], &src->intra, &src->inter, &e, &cerr),
        PS_ERR_INVALID);
    assert_null(e);
    ps_error_clear(&cerr);
    assert_int_equal(
        ps_cluster_create("x", 2048, 1024, &src->kinds[0], &src->intra, &src->inter, &e, &cerr),
        PS_ERR_INVALID);
    ps_error_clear(&cerr);
    assert_int_equal(
        ps_cluster_create("", 1, 1, &src->kinds[0], &src->intra, &src->inter, &e, &cerr),
        PS_ERR_INVALID);
    assert_int_equal(
        ps_cluster_create("ok", 3, 2, &src->kinds[0], &src->intra, &src->inter, &e, NULL), PS_OK);
    assert_int_equal(ps_cluster_device_count(e), 6);
    ps_cluster_free(e);

    assert_int_equal(ps_cluster_clone(NULL, &e), PS_ERR_INVALID);
    assert_null(e);
    ps_cluster_free(NULL); /* a no-op */
    ps_cluster_free(c);
    ps_cluster_free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preset_p3),
        cmocka_unit_test(test_preset_dgx_a100),
        cmocka_unit_test(test_preset_dgx_h100),
        cmocka_unit_test(test_preset_list),
        cmocka_unit_test(test_preset_spec_parsing),
        cmocka_unit_test(test_round_trip_presets),
        cmocka_unit_test(test_heterogeneous),
        cmocka_unit_test(test_preset_with_overrides),
        cmocka_unit_test(test_default_kind_forms),
        cmocka_unit_test(test_json_errors_in_memory),
        cmocka_unit_test(test_shared_cores),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_create_validate_equal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
