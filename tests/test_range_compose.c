/* planner/range_compose: a range of layers composed from its single layers'
 * solves against the solve of the whole range. On one device every tensor
 * has one layout, and the composition must give the whole range's kept
 * activations and working set exactly. Under data parallelism the kept
 * activations must still match; the working set may only be above (a
 * layer alone may copy what it receives into the layout it reads, which
 * the whole range's producer writes directly). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/sharding.h"
#include "planner/intra_pass.h"
#include "planner/models/zoo.h"
#include "planner/range_compose.h"
#include "planner/train_step.h"

typedef struct scenario {
    const char *model;
    bool remat;
    int devices; /* 1: shard on one device; more: data parallelism on one node */
} scenario;

static void small_config(const char *name, ps_model_config *cfg)
{
    assert_int_equal(ps_zoo_lookup(name, cfg, NULL), PS_OK);
    if (cfg->family == PS_MODEL_GPT || cfg->family == PS_MODEL_MOE) {
        cfg->layers = 3;
        cfg->hidden = 64;
        cfg->ffn = 256;
        cfg->heads = 4;
        cfg->seq = 32;
        cfg->vocab = 256;
        cfg->experts = 4;
        cfg->expert_group = 32;
    } else if (cfg->family == PS_MODEL_WRESNET) {
        cfg->image_size = 32;
        cfg->channels = 8;
        cfg->classes = 16;
    } else {
        cfg->hidden = 64;
    }
    cfg->batch = 16;
}

/* The inter-op pass's table step: each layer's ops a stage of their own. */
static ps_graph *table_step(const scenario *sc)
{
    ps_model_config cfg;
    small_config(sc->model, &cfg);
    ps_graph *fwd = NULL, *step = NULL;
    ps_error err = {0};
    assert_int_equal(ps_model_build(&cfg, &fwd, &err), PS_OK);
    int L = fwd->n_layers, self[64];
    assert_in_range(L, 2, 64);
    for (int l = 0; l < L; l++)
        self[l] = l;
    ps_train_options t = ps_train_options_default();
    t.remat = sc->remat;
    t.layer_stage = self;
    if (ps_train_step_build(fwd, &t, &step, &err) != PS_OK)
        fail_msg("%s: %s", sc->model, err.msg);
    ps_graph_free(fwd);
    return step;
}

static ps_intra_result *solve(const ps_graph *step, int lo, int hi, const ps_logical_mesh *m,
                              int devices, ps_graph **slice_out)
{
    ps_error err = {0};
    ps_graph *slice = NULL;
    assert_int_equal(ps_graph_slice(step, lo, hi, &slice, &err), PS_OK);
    ps_intra_options io = ps_intra_options_default();
    io.method = devices > 1 ? PS_METHOD_DATA : PS_METHOD_SHARD;
    io.micro_batches = 2;
    ps_intra_result *r = NULL;
    if (ps_intra_solve(slice, m, &io, &r, &err) != PS_OK)
        fail_msg("layers %d-%d: %s", lo, hi, err.msg);
    *slice_out = slice;
    return r;
}

static ps_stage_entry entry_of(const ps_intra_result *r)
{
    ps_stage_entry e = {.ok = true, .need_bytes = r->peak_memory_bytes};
    e.static_bytes = r->weight_bytes + r->gradient_bytes + r->optimizer_bytes;
    e.act_bytes = r->activation_bytes;
    e.transient_bytes = r->peak_memory_bytes - e.static_bytes - e.act_bytes;
    e.time_s = r->compute_s[PS_PASS_FORWARD] + r->comm_s[PS_PASS_FORWARD] +
               r->compute_s[PS_PASS_BACKWARD] + r->comm_s[PS_PASS_BACKWARD] +
               r->compute_s[PS_PASS_RECOMPUTE] + r->comm_s[PS_PASS_RECOMPUTE];
    return e;
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)) + 1e-6; }

static void check_scenario(const scenario *sc)
{
    ps_graph *step = table_step(sc);
    int L = step->n_layers;
    ps_cluster *c = NULL;
    ps_logical_mesh *m = NULL;
    ps_error err = {0};
    assert_int_equal(ps_cluster_from_preset("p3.16xlarge:1", &c, &err), PS_OK);
    assert_int_equal(ps_mesh_create(c, 0, 1, sc->devices, 1, sc->devices, &m, &err), PS_OK);

    /* each layer alone, as the table solves it */
    ps_stage_entry single_e[64], out_e[64][64];
    ps_entry_tensors single_t[64];
    const ps_stage_entry *single[64];
    const ps_entry_tensors *tensors[64];
    for (int q = 0; q < L; q++) {
        ps_graph *slice = NULL;
        ps_intra_result *r = solve(step, q, q, m, sc->devices, &slice);
        single_e[q] = entry_of(r);
        int n = slice->n_tensors;
        single_t[q] = (ps_entry_tensors){n, calloc(2 * (size_t)n, sizeof(double))};
        for (int t = 0; t < n; t++) {
            single_t[q].bytes[t] =
                ps_spec_tile_bytes(&r->tensor_spec[t], &slice->tensors[t].desc, m->shape);
            single_t[q].bytes[n + t] = r->activation_tensor_bytes[t];
        }
        single[q] = &single_e[q];
        tensors[q] = &single_t[q];
        ps_intra_result_free(r);
        ps_graph_free(slice);
    }
    ps_layer_crossings *x = NULL;
    assert_int_equal(ps_layer_crossings_build(step, &x, &err), PS_OK);
    assert_true(ps_layer_crossings_count(x) >= L - 1);

    int checked = 0;
    double worst_over = 0;
    for (int l = 0; l < L; l++) {
        ps_stage_entry *out[64];
        for (int i = 0; i < L; i++)
            out[i] = &out_e[l][i];
        ps_range_compose(x, l, 1, single, tensors, out);
        for (int i = l + 1; i < L; i++) {
            ps_graph *slice = NULL;
            ps_intra_result *r = solve(step, l, i, m, sc->devices, &slice);
            ps_stage_entry whole = entry_of(r), *comp = out[i];
            assert_true(comp->ok);
            /* the same tensors kept in the same layouts */
            if (!near(comp->act_bytes, whole.act_bytes))
                fail_msg("%s%s on %d device(s), layers %d-%d: composed activations %.0f B, "
                         "the whole range's %.0f B",
                         sc->model, sc->remat ? " (remat)" : "", sc->devices, l, i,
                         comp->act_bytes, whole.act_bytes);
            double sum_time = 0;
            for (int q = l; q <= i; q++)
                sum_time += single_e[q].time_s;
            assert_true(near(comp->time_s, sum_time));
            /* a micro-batch's working set: never below the whole range's,
             * and above it only by what one layer's solve holds longer */
            double over = comp->transient_bytes - whole.transient_bytes;
            if (sc->devices == 1 && !near(comp->transient_bytes, whole.transient_bytes))
                fail_msg("%s%s on one device, layers %d-%d: composed temporaries %.0f B, the "
                         "whole range's %.0f B",
                         sc->model, sc->remat ? " (remat)" : "", l, i, comp->transient_bytes,
                         whole.transient_bytes);
            if (over < -1e-6 * whole.transient_bytes - 1)
                fail_msg("%s%s on %d device(s), layers %d-%d: composed temporaries %.0f B, "
                         "below the whole range's %.0f B",
                         sc->model, sc->remat ? " (remat)" : "", sc->devices, l, i,
                         comp->transient_bytes, whole.transient_bytes);
            double peak = whole.static_bytes + whole.act_bytes + whole.transient_bytes;
            worst_over = fmax(worst_over, over / peak);
            checked++;
            ps_intra_result_free(r);
            ps_graph_free(slice);
        }
    }
    print_message("# %s%s on %d device(s): %d layers, %d crossings, %d ranges; composed "
                  "temporaries at most %.2f%% of the peak above the whole range's\n",
                  sc->model, sc->remat ? " (remat)" : "", sc->devices, L,
                  ps_layer_crossings_count(x), checked, 100 * worst_over);
    for (int q = 0; q < L; q++)
        free(single_t[q].bytes);
    ps_layer_crossings_free(x);
    ps_mesh_free(m);
    ps_cluster_free(c);
    ps_graph_free(step);
}

static void composed_ranges_match_their_whole_solve(void **state)
{
    (void)state;
    static const scenario cases[] = {
        {"gpt-350m", false, 1},     {"gpt-350m", true, 1},     {"gpt-350m", false, 4},
        {"gpt-350m", true, 4},      {"moe-380m", false, 1},    {"moe-380m", true, 1},
        {"moe-380m", true, 4},      {"wresnet-250m", false, 1}, {"wresnet-250m", true, 1},
        {"wresnet-250m", false, 4}, {"wresnet-250m", true, 4}, {"mlp", false, 1},
        {"mlp", false, 4},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        check_scenario(&cases[k]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(composed_ranges_match_their_whole_solve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
