/* planner/cross_mesh: the transfers of a tensor between two stage meshes.
 * Random layouts on random meshes, checked for what any correct move must
 * do: each receiver gets every element of its tile exactly once (whole, as
 * its chunk of a part its group all-gathers, or from the member of its group
 * that takes that part whole), from a device that holds
 * it, and the replicas of a source tile share its bytes evenly (within
 * one piece of each other). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/sharding.h"
#include "planner/cost_model.h"
#include "planner/cross_mesh.h"
#include "tests/test_util.h"

static ps_cluster *node8(void)
{
    ps_cluster *c = NULL;
    ps_error err = {0};
    assert_int_equal(ps_cluster_from_preset("p3.16xlarge:2", &c, &err), PS_OK);
    return c;
}

static bool region_inside(const ps_region *in, const ps_region *box)
{
    for (int x = 0; x < in->rank; x++)
        if (in->offset[x] < box->offset[x] ||
            in->offset[x] + in->size[x] > box->offset[x] + box->size[x])
            return false;
    return true;
}

static bool region_same(const ps_region *a, const ps_region *b)
{
    if (a->rank != b->rank)
        return false;
    for (int x = 0; x < a->rank; x++)
        if (a->offset[x] != b->offset[x] || a->size[x] != b->size[x])
            return false;
    return true;
}

static int64_t numel(const ps_region *r)
{
    int64_t n = 1;
    for (int x = 0; x < r->rank; x++)
        n *= r->size[x];
    return n;
}

static void tile_of(const ps_sharding_spec *s, const ps_tensor_desc *d, const int mesh[2], int i,
                    ps_region *r)
{
    ps_tensor_desc t;
    assert_true(ps_spec_tile(s, d, mesh, &t));
    r->rank = d->rank;
    ps_spec_tile_offset(s, d, mesh, i / mesh[1], i % mesh[1], r->offset);
    for (int x = 0; x < d->rank; x++)
        r->size[x] = t.shape[x];
}

/* A random well-formed, non-partial spec of rank 2 whose tiles divide d. */
static ps_sharding_spec random_spec(const ps_tensor_desc *d, const int mesh[2])
{
    for (;;) {
        ps_sharding_spec s = ps_spec_replicated(2);
        s.dim_axes[0] = (uint8_t)below(4);
        s.dim_axes[1] = (uint8_t)below(4);
        ps_tensor_desc t;
        if (ps_spec_well_formed(&s) && ps_spec_tile(&s, d, mesh, &t))
            return s;
    }
}

/* Checks plan p of d from `from` on fdev (fmesh) to `to` on tm. */
static void check_plan(const ps_cross_plan *p, const ps_tensor_desc *d,
                       const ps_sharding_spec *from, const int *fdev, const int fmesh[2],
                       const ps_sharding_spec *to, const ps_logical_mesh *tm)
{
    int na = fmesh[0] * fmesh[1], nb = tm->n_devices;
    ps_region src[16], dst[16];
    for (int i = 0; i < na; i++)
        tile_of(from, d, fmesh, i, &src[i]);
    for (int r = 0; r < nb; r++)
        tile_of(to, d, tm->shape, r, &dst[r]);
    double sent[16] = {0}, largest[16] = {0};
    for (int r = 0; r < nb; r++) {
        int64_t got = 0;
        int whole_group = -1; /* r's group, where its members take whole parts */
        for (int x = 0; x < p->n_xfers; x++) {
            const ps_cross_xfer *t = &p->xfers[x];
            if (t->dst != tm->devices[r])
                continue;
            assert_true(region_inside(&t->region, &dst[r]));
            if (t->part >= 0) {
                /* member k of the group takes parts k, k + n, ... whole */
                assert_true(t->group >= 0 && t->group < p->n_groups);
                assert_int_equal(t->chunks, 1);
                int g_n = p->group_start[t->group + 1] - p->group_start[t->group];
                const int *gd = &p->group_devices[p->group_start[t->group]];
                int n_parts = p->part_start[t->group + 1] - p->part_start[t->group];
                assert_true(t->part < n_parts && n_parts % g_n == 0);
                assert_int_equal(gd[t->part % g_n], t->dst);
                assert_true(region_same(&t->region, &p->parts[p->part_start[t->group] + t->part]));
                assert_true(whole_group < 0 || whole_group == t->group);
                whole_group = t->group;
                /* its first part carries the gather of all of them */
                assert_true((t->gather_bytes > 0) == (t->part == t->part % g_n));
            } else {
                got += numel(&t->region);
            }
            int i = 0;
            while (i < na && fdev[i] != t->src)
                i++;
            assert_true(i < na); /* a sender of the source mesh */
            assert_true(region_inside(&t->region, &src[i]));
            sent[i] += t->bytes;
            largest[i] = t->bytes > largest[i] ? t->bytes : largest[i];
            /* a chunked part: every member of its group gets one chunk of it */
            if (t->chunks > 1) {
                assert_true(t->group >= 0 && t->group < p->n_groups);
                int g_n = p->group_start[t->group + 1] - p->group_start[t->group];
                assert_int_equal(g_n, t->chunks);
                const int *gd = &p->group_devices[p->group_start[t->group]];
                for (int k = 0; k < g_n; k++) {
                    int found = 0;
                    for (int y = 0; y < p->n_xfers; y++) {
                        const ps_cross_xfer *u = &p->xfers[y];
                        found += u->dst == gd[k] && u->chunk == k && u->chunks == t->chunks &&
                                 region_same(&u->region, &t->region);
                    }
                    assert_int_equal(found, 1);
                }
            }
        }
        if (whole_group >= 0) {
            /* every part of the group reaches exactly one member, its owner */
            int g_n = p->group_start[whole_group + 1] - p->group_start[whole_group];
            const int *gd = &p->group_devices[p->group_start[whole_group]];
            for (int k = p->part_start[whole_group]; k < p->part_start[whole_group + 1]; k++) {
                const ps_region *part = &p->parts[k];
                assert_true(region_inside(part, &dst[r]));
                assert_int_equal(numel(part), numel(&p->parts[p->part_start[whole_group]]));
                got += numel(part);
                int found = 0, part_k = k - p->part_start[whole_group];
                for (int y = 0; y < p->n_xfers; y++) {
                    const ps_cross_xfer *u = &p->xfers[y];
                    for (int m = 0; m < g_n; m++)
                        found += u->dst == gd[m] && u->part == part_k &&
                                 region_same(&u->region, part);
                }
                assert_int_equal(found, 1);
            }
        }
        assert_int_equal(got, numel(&dst[r])); /* each element exactly once */
    }
    /* replicas of one source tile send within its largest piece's bytes of
     * each other */
    for (int i = 0; i < na; i++) {
        double lo = sent[i], hi = sent[i], piece = 0;
        for (int j = 0; j < na; j++)
            if (region_same(&src[j], &src[i])) {
                lo = sent[j] < lo ? sent[j] : lo;
                hi = sent[j] > hi ? sent[j] : hi;
                piece = largest[j] > piece ? largest[j] : piece;
            }
        assert_true(hi - lo <= piece);
    }
}

static void plan_and_check(const ps_cluster *c, const ps_tensor_desc *d,
                           const ps_sharding_spec *from, const int fmesh[2], int ffirst,
                           const ps_sharding_spec *to, const int tmesh[2], int tfirst, bool lag,
                           ps_cross_plan *p)
{
    int fdev[16];
    for (int i = 0; i < fmesh[0] * fmesh[1]; i++)
        fdev[i] = ffirst + i;
    ps_logical_mesh *tm = NULL;
    ps_error err = {0};
    int n = tmesh[0] * tmesh[1];
    assert_int_equal(ps_mesh_create(c, tfirst, 1, n, tmesh[0], tmesh[1], &tm, &err), PS_OK);
    assert_int_equal(ps_cross_mesh_plan(c, d, from, fdev, fmesh, to, tm, lag, p, &err), PS_OK);
    check_plan(p, d, from, fdev, fmesh, to, tm);
    ps_mesh_free(tm);
}

/* A replicated activation from a stage of op 2 to another: with local
 * all-gather each of the two receivers takes one chunk, and each of the two
 * replicas sends one (once both came from the first replica). */
static void test_replicas_share_chunks(void **state)
{
    (void)state;
    ps_cluster *c = node8();
    ps_tensor_desc d = {.dtype = PS_DTYPE_F32, .rank = 2, .shape = {256, 1024}};
    ps_sharding_spec rep = ps_spec_replicated(2);
    for (int n = 2; n <= 4; n += 2) {
        int mesh[2] = {1, n};
        ps_cross_plan p = {0};
        plan_and_check(c, &d, &rep, mesh, 0, &rep, mesh, 8, true, &p);
        assert_int_equal(p.n_xfers, n);
        for (int x = 0; x < n; x++)
            for (int y = x + 1; y < n; y++)
                assert_int_not_equal(p.xfers[x].src, p.xfers[y].src);
        ps_cross_plan_clear(&p);
    }
    ps_cluster_free(c);
}

/* A tile every receiver replicates, made of the senders' 4 equal tiles: on
 * a mesh of 4 (and of 2) each receiver takes whole tiles (1, and 2) and one
 * all-gather of the tile: 4 transfers instead of 16 chunks; on a mesh of 8
 * (fewer parts than members) chunks as before. 3 parts on 2 members do not
 * split evenly: chunks. */
static void test_whole_parts(void **state)
{
    (void)state;
    ps_cluster *c = node8();
    ps_tensor_desc d = {.dtype = PS_DTYPE_F32, .rank = 2, .shape = {48, 48}};
    ps_sharding_spec rep = ps_spec_replicated(2), split = ps_spec_replicated(2);
    split.dim_axes[0] = 1;
    split.dim_axes[1] = 2;
    int from[2] = {2, 2};
    static const int to[][2] = {{2, 2}, {1, 2}, {2, 4}};
    static const int expect_xfers[] = {4, 4, 32};
    for (int s = 0; s < 3; s++) {
        ps_cross_plan p = {0};
        plan_and_check(c, &d, &split, from, 0, &rep, to[s], 8, true, &p);
        assert_int_equal(p.n_xfers, expect_xfers[s]);
        int gathers = 0;
        for (int x = 0; x < p.n_xfers; x++) {
            assert_int_equal(p.xfers[x].part >= 0, s < 2);
            if (p.xfers[x].gather_bytes > 0 && s < 2) {
                gathers++;
                assert_true(p.xfers[x].gather_bytes == 48 * 48 * 4);
            }
        }
        if (s < 2)
            assert_int_equal(gathers, to[s][0] * to[s][1]);
        ps_cross_plan_clear(&p);
    }
    int from3[2] = {3, 1}, to2[2] = {1, 2};
    ps_cross_plan p = {0};
    plan_and_check(c, &d, &split, from3, 0, &rep, to2, 8, true, &p);
    for (int x = 0; x < p.n_xfers; x++)
        assert_true(p.xfers[x].part < 0 && p.xfers[x].chunks == 2);
    ps_cross_plan_clear(&p);
    ps_cluster_free(c);
}

/* Random layouts on random meshes of up to 8 devices each (the receivers on
 * the second node), with and without local all-gather. */
static void test_random_moves(void **state)
{
    (void)state;
    ps_cluster *c = node8();
    test_rng_seed(7);
    /* 3- and 6-way splits against 2-, 4- and 8-way ones cut pieces of
     * unequal sizes */
    static const int shapes[][2] = {{1, 1}, {1, 2}, {2, 1}, {1, 4}, {2, 2}, {4, 1}, {1, 8},
                                    {2, 4}, {4, 2}, {8, 1}, {1, 3}, {3, 1}, {2, 3}, {3, 2},
                                    {1, 6}, {6, 1}};
    int n_shapes = (int)(sizeof shapes / sizeof shapes[0]), with_whole_parts = 0;
    for (int it = 0; it < 800; it++) {
        const int *fm = shapes[below(n_shapes)], *tm = shapes[below(n_shapes)];
        ps_tensor_desc d = {.dtype = PS_DTYPE_F32, .rank = 2, .shape = {24 * (1 + below(3)),
                                                                        24 * (1 + below(3))}};
        ps_sharding_spec from = random_spec(&d, fm), to = random_spec(&d, tm);
        ps_cross_plan p = {0};
        plan_and_check(c, &d, &from, fm, 0, &to, tm, 8, it % 2 == 0, &p);
        bool whole = false;
        for (int x = 0; x < p.n_xfers; x++)
            whole |= p.xfers[x].part >= 0;
        with_whole_parts += whole;
        ps_cross_plan_clear(&p);
    }
    assert_true(with_whole_parts > 20); /* both ways of gathering were drawn */
    ps_cluster_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replicas_share_chunks),
        cmocka_unit_test(test_whole_parts),
        cmocka_unit_test(test_random_moves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
