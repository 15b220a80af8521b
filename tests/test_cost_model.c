/* core/sharding + planner/cost_model: specs, tiles, meshes, collectives and
 * resharding against closed forms and exhaustive coverage checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "planner/cost_model.h"
#include "test_util.h"

static bool close_to(double a, double b) { return fabs(a - b) <= 1e-12 + 1e-9 * fabs(b); }

/* Every well-formed spec of rank <= 3 formats and parses back to itself. */
static void spec_text_round_trip(void **state)
{
    (void)state;
    int count = 0;
    for (int rank = 0; rank <= 3; rank++) {
        int combos = 1;
        for (int d = 0; d < rank; d++)
            combos *= 4;
        for (int c = 0; c < combos; c++)
            for (int partial = 0; partial < 4; partial++) {
                ps_sharding_spec s = ps_spec_replicated(rank);
                for (int d = 0, x = c; d < rank; d++, x /= 4)
                    s.dim_axes[d] = (uint8_t)(x % 4);
                s.partial = (uint8_t)partial;
                if (!ps_spec_well_formed(&s))
                    continue;
                char buf[PS_SPEC_STR_MAX];
                ps_spec_format(&s, buf, sizeof buf);
                ps_sharding_spec back;
                if (!ps_spec_parse(buf, rank, &back) || !ps_spec_equal(&s, &back))
                    fail_msg("\"%s\" does not parse back", buf);
                count++;
            }
    }
    assert_true(count > 40);
    static const char *const bad[] = {"", "S2", "S0,S0", "S01,S1", "R,", ",R", "S0|P0", "R|Q",
                                      "S0,R,R,R,R,R,R"};
    ps_sharding_spec s;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (ps_spec_parse(bad[i], 2, &s))
            fail_msg("\"%s\" parsed", bad[i]);
    assert_false(ps_spec_parse("S0,R", 3, &s)); /* wrong rank */
    assert_true(ps_spec_parse("-", 0, &s) && s.rank == 0);
    assert_true(ps_spec_parse("-|P1", 0, &s) && s.partial == 2);
    assert_int_equal(ps_spec_text_rank("-|P01"), 0);
    assert_int_equal(ps_spec_text_rank("S0,R,S1|P0"), 3);
    assert_int_equal(ps_spec_text_rank("R"), 1);
}

/* The tiles of all devices cover every element exactly (number of replicas)
 * times, for every spec of a 4 x 6 tensor on a 2 x 3 mesh. */
static void tiles_cover_the_tensor(void **state)
{
    (void)state;
    int mesh[2] = {2, 3};
    ps_tensor_desc t = {.dtype = PS_DTYPE_F32, .rank = 2, .shape = {6, 12}};
    for (int c = 0; c < 16; c++) {
        ps_sharding_spec s = ps_spec_replicated(2);
        s.dim_axes[0] = (uint8_t)(c % 4);
        s.dim_axes[1] = (uint8_t)(c / 4);
        if (!ps_spec_well_formed(&s))
            continue;
        ps_tensor_desc tile;
        assert_true(ps_spec_tile(&s, &t, mesh, &tile));
        int replicas = 1;
        for (int a = 0; a < 2; a++)
            if (ps_spec_dim_of_axis(&s, a) < 0)
                replicas *= mesh[a];
        int cover[6][12] = {{0}};
        for (int i0 = 0; i0 < 2; i0++)
            for (int i1 = 0; i1 < 3; i1++) {
                int64_t off[2];
                ps_spec_tile_offset(&s, &t, mesh, i0, i1, off);
                for (int64_t x = 0; x < tile.shape[0]; x++)
                    for (int64_t y = 0; y < tile.shape[1]; y++)
                        cover[off[0] + x][off[1] + y]++;
            }
        for (int x = 0; x < 6; x++)
            for (int y = 0; y < 12; y++)
                assert_int_equal(cover[x][y], replicas);
        assert_true(ps_spec_tile_bytes(&s, &t, mesh) == 4.0 * 72 / (6 / replicas));
    }
    ps_sharding_spec s = ps_spec_replicated(2);
    s.dim_axes[0] = 3; /* 6 rows over 6 devices: fine; 7 would not divide */
    ps_tensor_desc tile;
    assert_true(ps_spec_tile(&s, &t, mesh, &tile));
    t.shape[0] = 7;
    assert_false(ps_spec_tile(&s, &t, mesh, &tile));
}

static ps_cluster *preset(const char *name)
{
    ps_cluster *c = NULL;
    assert_int_equal(ps_cluster_from_preset(name, &c, NULL), PS_OK);
    return c;
}

/* Axes inside a node use NVLink; an axis across nodes gets its ring's share
 * of each node's NICs: one flow per ring that crosses the node. An
 * all-to-all's NICs carry what each member sends to members elsewhere. */
static void mesh_link_parameters(void **state)
{
    (void)state;
    ps_cluster *c = preset("dgx-a100:2");
    ps_logical_mesh *m = NULL;
    assert_int_equal(ps_mesh_create(c, 0, 1, 8, 2, 4, &m, NULL), PS_OK);
    for (int a = 0; a < 2; a++) {
        assert_false(m->crosses_nodes[a]);
        assert_true(close_to(m->beta_s_per_byte[a], 1 / 300e9));
        assert_true(close_to(m->alpha_s[a], 2e-6));
    }
    assert_int_equal(m->devices[7], 7);
    ps_mesh_free(m);
    assert_int_equal(ps_mesh_create(c, 0, 2, 8, 2, 8, &m, NULL), PS_OK);
    assert_true(m->crosses_nodes[0]);
    assert_false(m->crosses_nodes[1]);
    assert_true(close_to(m->beta_s_per_byte[0], 1 / 25e9)); /* 8 NICs x 25e9 / 8 rings */
    /* 8 pairs a node, each member sending half its input across */
    assert_true(close_to(m->a2a_beta_s_per_byte[0], 1 / 25e9));
    assert_true(close_to(m->alpha_s[0], 5e-6));
    assert_true(close_to(m->peak_flops[PS_DTYPE_F16], 312e12));
    ps_mesh_free(m);
    /* one flat ring: it crosses each node once, at the NICs' whole 200e9 */
    assert_int_equal(ps_mesh_create(c, 0, 2, 8, 16, 1, &m, NULL), PS_OK);
    assert_true(m->crosses_nodes[0]);
    assert_true(close_to(m->beta_s_per_byte[0], 1 / 200e9));
    /* its all-to-all: 8 members a node, each sending 8/16 of its input
     * across, per byte of the 15/16 the ring formula moves */
    assert_true(close_to(m->a2a_beta_s_per_byte[0], 8 * 0.5 / 200e9 / (15.0 / 16)));
    ps_mesh_free(m);
    /* 4 x 4: four rings of four on axis 0, two members on each node */
    assert_int_equal(ps_mesh_create(c, 0, 2, 8, 4, 4, &m, NULL), PS_OK);
    assert_true(m->crosses_nodes[0] && !m->crosses_nodes[1]);
    assert_true(close_to(m->beta_s_per_byte[0], 1 / 50e9));
    ps_mesh_free(m);
    /* a sub-node slice of 4 devices at device 8 lies on node 1 */
    assert_int_equal(ps_mesh_create(c, 8, 1, 4, 1, 4, &m, NULL), PS_OK);
    assert_int_equal(m->devices[0], 8);
    ps_mesh_free(m);
    ps_error err = {0};
    assert_int_equal(ps_mesh_create(c, 6, 1, 4, 1, 4, &m, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "does not fit"));
    assert_int_equal(ps_mesh_create(c, 0, 2, 4, 2, 4, &m, NULL), PS_ERR_INVALID);
    assert_int_equal(ps_mesh_create(c, 0, 1, 8, 3, 3, &m, NULL), PS_ERR_INVALID);
    ps_cluster_free(c);
}

/* Meshes of equal costs: the same shape on the same kinds of devices and
 * links, wherever they lie; a different shape, a mesh across nodes or
 * smaller devices cost differently. */
static void mesh_costs_equal(void **state)
{
    (void)state;
    ps_cluster *c = preset("dgx-a100:2");
    ps_logical_mesh *a = NULL, *b = NULL, *x = NULL;
    assert_int_equal(ps_mesh_create(c, 0, 1, 4, 2, 2, &a, NULL), PS_OK);
    assert_int_equal(ps_mesh_create(c, 12, 1, 4, 2, 2, &b, NULL), PS_OK); /* node 1 */
    assert_true(ps_mesh_costs_equal(a, b));
    assert_int_not_equal(a->devices[0], b->devices[0]);
    assert_int_equal(ps_mesh_create(c, 0, 1, 4, 1, 4, &x, NULL), PS_OK); /* another shape */
    assert_false(ps_mesh_costs_equal(a, x));
    ps_mesh_free(x);
    ps_mesh_free(b);
    /* the same 2 x 2 on two nodes: axis 0 crosses the NICs */
    ps_mesh_free(a);
    assert_int_equal(ps_mesh_create(c, 0, 1, 8, 2, 4, &a, NULL), PS_OK);
    assert_int_equal(ps_mesh_create(c, 0, 2, 8, 2, 8, &x, NULL), PS_OK);
    assert_int_equal(ps_mesh_create(c, 0, 2, 8, 2, 8, &b, NULL), PS_OK);
    assert_true(ps_mesh_costs_equal(x, b));
    assert_false(ps_mesh_costs_equal(a, x));
    ps_mesh_free(x);
    ps_mesh_free(b);
    /* node 1 with smaller devices: the same shape no longer costs the same */
    ps_device_kind small = c->kinds[0];
    snprintf(small.name, sizeof small.name, "%s", "a100-40gb-test");
    small.memory_bytes /= 2;
    int k = -1;
    assert_int_equal(ps_cluster_add_kind(c, &small, &k, NULL), PS_OK);
    for (int d = 8; d < 16; d++)
        c->device_kind[d] = k;
    assert_int_equal(ps_mesh_create(c, 8, 1, 8, 2, 4, &b, NULL), PS_OK);
    assert_false(ps_mesh_costs_equal(a, b));
    ps_mesh_free(a);
    ps_mesh_free(b);
    ps_cluster_free(c);
}

/* Ring collectives equal their closed forms. */
static void collective_closed_forms(void **state)
{
    (void)state;
    ps_cluster *c = preset("p3.16xlarge:1");
    ps_logical_mesh *m = NULL;
    assert_int_equal(ps_mesh_create(c, 0, 1, 8, 1, 8, &m, NULL), PS_OK);
    double B = 1 << 30, a = 2e-6, b = 1 / 150e9, n = 8;
    assert_true(close_to(ps_collective_s(m, PS_COLL_ALL_REDUCE, 2, B),
                         2 * (n - 1) * a + 2 * (n - 1) / n * B * b));
    assert_true(close_to(ps_collective_s(m, PS_COLL_ALL_GATHER, 2, B),
                         (n - 1) * a + (n - 1) / n * B * b));
    assert_true(close_to(ps_collective_s(m, PS_COLL_REDUCE_SCATTER, 2, B),
                         (n - 1) * a + (n - 1) / n * B * b));
    assert_true(ps_collective_s(m, PS_COLL_ALL_REDUCE, 1, B) == 0); /* axis of size 1 */
    /* both axes of a 2 x 4 mesh: reduce-scatter(4) + all-reduce(2) + all-gather(4) */
    ps_mesh_free(m);
    assert_int_equal(ps_mesh_create(c, 0, 1, 8, 2, 4, &m, NULL), PS_OK);
    double want = (3 * a + 0.75 * B * b) + (2 * a + 2 * 0.5 * (B / 4) * b) + (3 * a + 0.75 * B * b);
    assert_true(close_to(ps_collective_s(m, PS_COLL_ALL_REDUCE, 3, B), want));
    /* the roofline: a GEMM is FLOP-bound, a copy bandwidth-bound */
    double gemm = ps_compute_s(m, PS_DTYPE_F16, 1e12, 1e6, true);
    assert_true(close_to(gemm, 1e12 / (125e12 * m->params.gemm_efficiency)));
    double copy = ps_compute_s(m, PS_DTYPE_F16, 1e6, 9e8, false);
    assert_true(close_to(copy, 9e8 / (900e9 * m->params.bandwidth_efficiency)));
    /* bf16 on a V100 falls back to fp32 peak */
    assert_true(ps_compute_s(m, PS_DTYPE_BF16, 1e12, 0, true) >
                ps_compute_s(m, PS_DTYPE_F16, 1e12, 0, true));
    ps_mesh_free(m);
    ps_cluster_free(c);
}

/* Resharding: partial -> replicated is an all-reduce, partial -> split a
 * reduce-scatter, split -> replicated an all-gather, a split moving to another
 * dimension an all-to-all, replicated -> split free. */
static void resharding_rules(void **state)
{
    (void)state;
    ps_cluster *c = preset("dgx-a100:1");
    ps_logical_mesh *m = NULL;
    assert_int_equal(ps_mesh_create(c, 0, 1, 8, 1, 8, &m, NULL), PS_OK);
    ps_tensor_desc t = {.dtype = PS_DTYPE_F16, .rank = 2, .shape = {1024, 4096}};
    double full = 1024.0 * 4096 * 2;
    ps_sharding_spec R, S1_0, S1_1, P1;
    assert_true(ps_spec_parse("R,R", 2, &R));
    assert_true(ps_spec_parse("S1,R", 2, &S1_0));
    assert_true(ps_spec_parse("R,S1", 2, &S1_1));
    assert_true(ps_spec_parse("R,R|P1", 2, &P1));
    assert_true(ps_reshard_s(m, &t, &R, &R) == 0);
    assert_true(ps_reshard_s(m, &t, &R, &S1_0) == 0);
    assert_true(close_to(ps_reshard_s(m, &t, &P1, &R),
                         ps_collective_s(m, PS_COLL_ALL_REDUCE, 2, full)));
    assert_true(close_to(ps_reshard_s(m, &t, &P1, &S1_1),
                         ps_collective_s(m, PS_COLL_REDUCE_SCATTER, 2, full)));
    assert_true(close_to(ps_reshard_s(m, &t, &S1_0, &R),
                         ps_collective_s(m, PS_COLL_ALL_GATHER, 2, full)));
    assert_true(close_to(ps_reshard_s(m, &t, &S1_0, &S1_1),
                         ps_collective_s(m, PS_COLL_ALL_TO_ALL, 2, full / 8)));
    /* a replica becomes a partial sum for free; a split one is gathered
     * first; a partial sum stays one for free */
    assert_true(ps_reshard_s(m, &t, &R, &P1) == 0);
    assert_true(ps_reshard_s(m, &t, &P1, &P1) == 0);
    assert_true(close_to(ps_reshard_s(m, &t, &S1_1, &P1),
                         ps_collective_s(m, PS_COLL_ALL_GATHER, 2, full)));
    /* a target that does not tile is impossible */
    ps_tensor_desc odd = {.dtype = PS_DTYPE_F16, .rank = 2, .shape = {1023, 4096}};
    assert_true(isinf(ps_reshard_s(m, &odd, &R, &S1_0)));
    ps_mesh_free(m);
    ps_cluster_free(c);
}

/* A sum partial over both axes of a mesh across nodes is all-reduced over
 * the whole mesh at once (the cost model's hierarchical all-reduce: the
 * slow axis moves 1/d1 of the tensor) where that is cheaper than one axis
 * after the other (where the slow axis moves all of it on each of its d1
 * rings): a tied embedding's 105 MB gradient on a 2 x 8 mesh of two
 * p3.16xlarge nodes took 269.7 ms axis by axis, 34.9 ms whole. */
static void partial_sums_reduced_over_the_whole_mesh(void **state)
{
    (void)state;
    const char *clusters[] = {"p3.16xlarge:2", "dgx-a100:2", "dgx-a100:1"};
    for (size_t ci = 0; ci < sizeof clusters / sizeof *clusters; ci++) {
        ps_cluster *c = preset(clusters[ci]);
        int n = ps_cluster_device_count(c);
        ps_logical_mesh *m = NULL;
        assert_int_equal(ps_mesh_create(c, 0, c->nodes, c->devices_per_node, 2, n / 2, &m, NULL),
                         PS_OK);
        ps_tensor_desc t = {.dtype = PS_DTYPE_F16, .rank = 2, .shape = {51200, 1024}};
        double full = 51200.0 * 1024 * 2;
        ps_sharding_spec P01, R, S0;
        assert_true(ps_spec_parse("R,R|P01", 2, &P01));
        assert_true(ps_spec_parse("R,R", 2, &R));
        assert_true(ps_spec_parse("S0,R", 2, &S0));
        double whole = ps_collective_s(m, PS_COLL_ALL_REDUCE, 3, full);
        double by_axis = fmin(ps_collective_s(m, PS_COLL_ALL_REDUCE, 1, full) +
                                  ps_collective_s(m, PS_COLL_ALL_REDUCE, 2, full),
                              ps_collective_s(m, PS_COLL_ALL_REDUCE, 2, full) +
                                  ps_collective_s(m, PS_COLL_ALL_REDUCE, 1, full));
        /* to a replica; to a split one, sliced after the sum for free */
        for (int to = 0; to < 2; to++) {
            ps_reshard_step steps[PS_RESHARD_MAX_STEPS];
            int k = ps_reshard_plan(m, &t, &P01, to ? &S0 : &R, steps);
            double got = 0;
            for (int i = 0; i < k; i++)
                got += steps[i].seconds;
            if (to == 0)
                assert_true(close_to(got, fmin(whole, by_axis)));
            else
                assert_true(got <= fmin(whole, by_axis) * (1 + 1e-12));
            if (to == 0 && whole < by_axis)
                assert_true(k >= 1 && steps[0].kind == PS_COLL_ALL_REDUCE && steps[0].axis == 2);
            assert_true(ps_spec_equal(&steps[k - 1].to, to ? &S0 : &R));
        }
        if (c->nodes > 1)
            assert_true(whole < 0.5 * by_axis); /* the case it is for */
        ps_mesh_free(m);
        ps_cluster_free(c);
    }
}

/* Every whole-node mesh of random clusters against the NIC loads counted
 * by their definition, node by node: a ring flow per group with members on
 * the node and elsewhere; an all-to-all's here * (n - here) / n per group. */
static void nic_loads_by_definition(void **state)
{
    (void)state;
    test_rng_seed(11);
    for (int trial = 0; trial < 60; trial++) {
        int nodes = 2 + below(5), dpn = 1 + below(8), n = nodes * dpn;
        ps_device_kind k = {.name = "gpu", .peak_flops = {1e14, 1e14, 1e14},
                            .memory_bytes = 1e10, .memory_bandwidth_bytes_per_s = 1e12};
        ps_intra_link in = {PS_INTRA_NVSWITCH, 1e11 * (0.5 + uniform()), 1e-6};
        ps_inter_link out = {PS_INTER_FAT_TREE, 1 + below(4), 1e10 * (0.5 + uniform()), 5e-6};
        ps_cluster *c = NULL;
        assert_int_equal(ps_cluster_create("t", nodes, dpn, &k, &in, &out, &c, NULL), PS_OK);
        double nic = out.nics_per_node * out.nic_bandwidth_bytes_per_s;
        for (int d0 = 1; d0 <= n; d0++) {
            if (n % d0 != 0)
                continue;
            int d1 = n / d0;
            ps_logical_mesh *m = NULL;
            assert_int_equal(ps_mesh_create(c, 0, nodes, dpn, d0, d1, &m, NULL), PS_OK);
            for (int a = 0; a < 2; a++) {
                int groups = a == 0 ? d1 : d0, size = a == 0 ? d0 : d1, flows = 0;
                double share = 0;
                for (int node = 0; node < nodes; node++) {
                    int f = 0;
                    double s = 0;
                    for (int g = 0; g < groups; g++) {
                        int here = 0;
                        for (int j = 0; j < size; j++)
                            here += (a == 0 ? j * d1 + g : g * d1 + j) / dpn == node;
                        if (here > 0 && here < size) {
                            f++;
                            s += (double)here * (size - here) / size;
                        }
                    }
                    flows = f > flows ? f : flows;
                    share = fmax(share, s);
                }
                assert_true(m->crosses_nodes[a] == (flows > 0 && size > 1));
                if (!m->crosses_nodes[a])
                    continue;
                assert_true(close_to(m->beta_s_per_byte[a], 1 / fmin(nic / flows, in.bandwidth_bytes_per_s)));
                double frac = (size - 1.0) / size;
                assert_true(close_to(m->a2a_beta_s_per_byte[a],
                                     fmax(share / nic, frac / in.bandwidth_bytes_per_s) / frac));
            }
            ps_mesh_free(m);
        }
        ps_cluster_free(c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spec_text_round_trip),  cmocka_unit_test(tiles_cover_the_tensor),
        cmocka_unit_test(mesh_link_parameters), cmocka_unit_test(nic_loads_by_definition),
        cmocka_unit_test(mesh_costs_equal),  cmocka_unit_test(collective_closed_forms),
        cmocka_unit_test(resharding_rules),
        cmocka_unit_test(partial_sums_reduced_over_the_whole_mesh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
