/* exec/peer_waits: what a measured step's receives and collectives waited
 * for their peers, against closed forms on hand-made steps and against a
 * brute-force matching (linear scans, no index) on random ones. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "exec/peer_waits.h"

enum { MAX_DEV = 6, MAX_EV = 400 };

/* A fixed sequence on every C library (an LCG's high bits). */
static uint64_t lcg_state;
static int next_rand(void)
{
    lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int)(lcg_state >> 33);
}

typedef struct world {
    int n_devices;
    ps_program_set set; /* only its groups */
    ps_group groups[8];
    int members[8][MAX_DEV];
    ps_timed_event ev[MAX_DEV][MAX_EV];
    int n[MAX_DEV];
    ps_step_events steps[MAX_DEV];
    bool remote[MAX_DEV]; /* its events not at hand */
} world;

static void world_init(world *w, int n_devices)
{
    memset(w, 0, sizeof *w);
    w->n_devices = n_devices;
    w->set.groups = w->groups;
}

static int add_group(world *w, int n, const int *devices)
{
    int g = w->set.n_groups++;
    memcpy(w->members[g], devices, (size_t)n * sizeof *devices);
    w->groups[g] = (ps_group){n, w->members[g]};
    return g;
}

static void add(world *w, int device, int kind, int with, int what, double bytes, double t0,
                double dur)
{
    assert_true(w->n[device] < MAX_EV);
    w->ev[device][w->n[device]++] = (ps_timed_event){kind, with, what, bytes, t0, dur};
}

/* waits[d][i] for every device the analysis sees. */
static void analyse(world *w, double waits[MAX_DEV][MAX_EV])
{
    const ps_step_events *view[MAX_DEV];
    ps_error err = {0};
    for (int d = 0; d < w->n_devices; d++) {
        w->steps[d].ev = w->ev[d];
        w->steps[d].n = w->n[d];
        assert_int_equal(ps_step_events_index(&w->steps[d], &err), PS_OK);
        view[d] = w->remote[d] ? NULL : &w->steps[d];
    }
    for (int d = 0; d < w->n_devices; d++)
        if (!w->remote[d])
            ps_peer_waits(view, w->n_devices, d, &w->set, waits[d]);
}

static void world_free(world *w)
{
    for (int d = 0; d < w->n_devices; d++)
        ps_step_events_free(&w->steps[d]);
}

static void assert_near(double got, double want)
{
    if (!(fabs(got - want) <= 1e-12))
        fail_msg("wait %.15g, expected %.15g", got, want);
}

/* A receive posted before its send waits until the send begins, never
 * longer than it lasted; one posted after waits nothing; sends never wait;
 * a collective waits for its last member; what does not match waits
 * nothing. */
static void test_closed_forms(void **state)
{
    (void)state;
    world w;
    world_init(&w, 4);
    int all[] = {0, 1, 2, 3}, pair[] = {2, 3};
    int g_all = add_group(&w, 4, all), g_pair = add_group(&w, 2, pair);
    /* 0 -> 1: two messages; 1 posts both receives early */
    add(&w, 0, PS_WAIT_SEND, 1, 0, 64, 5.0, 0.5);
    add(&w, 0, PS_WAIT_SEND, 1, 0, 32, 9.0, 0.5);
    add(&w, 1, PS_WAIT_RECV, 0, 0, 64, 1.0, 4.5); /* waits 4 */
    add(&w, 1, PS_WAIT_NONE, -1, 0, 0, 5.5, 1.0); /* compute between */
    add(&w, 1, PS_WAIT_RECV, 0, 0, 32, 8.0, 0.5); /* would wait 1: clamped to 0.5 */
    /* 1 -> 0 after 0 posted late: no wait */
    add(&w, 1, PS_WAIT_SEND, 0, 0, 16, 10.0, 0.1);
    add(&w, 0, PS_WAIT_RECV, 1, 0, 16, 12.0, 0.2);
    /* all four enter an all-reduce at 20, 21, 23, 22 */
    double entry[] = {20, 21, 23, 22};
    for (int d = 0; d < 4; d++)
        add(&w, d, PS_WAIT_COLLECTIVE, g_all, PS_COLL_ALL_REDUCE, 8, entry[d], 25 - entry[d]);
    /* 2 and 3: an all-gather on one side, an all-reduce on the other */
    add(&w, 2, PS_WAIT_COLLECTIVE, g_pair, PS_COLL_ALL_GATHER, 8, 30, 2);
    add(&w, 3, PS_WAIT_COLLECTIVE, g_pair, PS_COLL_ALL_REDUCE, 8, 31, 1);
    /* a receive whose send has another size; one with no send at all */
    add(&w, 3, PS_WAIT_SEND, 2, 0, 100, 40, 1);
    add(&w, 2, PS_WAIT_RECV, 3, 0, 99, 35, 6);
    add(&w, 2, PS_WAIT_RECV, 1, 0, 8, 36, 6);
    static double waits[MAX_DEV][MAX_EV];
    analyse(&w, waits);
    assert_near(waits[1][0], 4.0);
    assert_near(waits[1][1], 0.0);
    assert_near(waits[1][2], 0.5);
    assert_near(waits[1][3], 0.0); /* a send */
    assert_near(waits[0][0], 0.0); /* sends */
    assert_near(waits[0][2], 0.0); /* posted after the send began */
    assert_near(waits[0][3], 3.0); /* entered at 20, the last at 23 */
    assert_near(waits[1][4], 2.0);
    assert_near(waits[2][0], 0.0); /* the last */
    assert_near(waits[3][0], 1.0);
    assert_near(waits[2][1], 0.0); /* another collective */
    assert_near(waits[3][1], 0.0);
    assert_near(waits[2][2], 0.0); /* another size */
    assert_near(waits[2][3], 0.0); /* no send */
    /* device 3's events elsewhere: what waits for it is unknown */
    w.remote[3] = true;
    memset(waits, 0, sizeof waits);
    analyse(&w, waits);
    assert_near(waits[0][3], 0.0);
    assert_near(waits[1][0], 4.0); /* 0 and 1 are still at hand */
    world_free(&w);
}

/* The k-th event of `kind` with `with` on device d, by a linear scan. */
static int scan_kth(const world *w, int d, int kind, int with, int k)
{
    for (int i = 0; i < w->n[d]; i++)
        if (w->ev[d][i].kind == kind && w->ev[d][i].with == with && k-- == 0)
            return i;
    return -1;
}

static int scan_occurrence(const world *w, int d, int i)
{
    int k = 0;
    for (int j = 0; j < i; j++)
        k += w->ev[d][j].kind == w->ev[d][i].kind && w->ev[d][j].with == w->ev[d][i].with;
    return k;
}

static double brute_wait(const world *w, int d, int i)
{
    const ps_timed_event *e = &w->ev[d][i];
    int k = scan_occurrence(w, d, i);
    double ready = -INFINITY;
    if (e->kind == PS_WAIT_RECV) {
        if (w->remote[e->with])
            return 0;
        int j = scan_kth(w, e->with, PS_WAIT_SEND, d, k);
        if (j < 0 || w->ev[e->with][j].bytes != e->bytes)
            return 0;
        ready = w->ev[e->with][j].t0;
    } else if (e->kind == PS_WAIT_COLLECTIVE) {
        const ps_group *g = &w->groups[e->with];
        for (int m = 0; m < g->n; m++) {
            int q = g->devices[m];
            if (q == d)
                continue;
            if (w->remote[q])
                return 0;
            int j = scan_kth(w, q, PS_WAIT_COLLECTIVE, e->with, k);
            if (j < 0 || w->ev[q][j].what != e->what)
                return 0;
            ready = fmax(ready, w->ev[q][j].t0);
        }
    } else {
        return 0;
    }
    return ready > e->t0 ? fmin(ready - e->t0, e->dur) : 0;
}

/* Random steps: each device's events are its part of one random sequence of
 * messages and collectives (sometimes with a size or a kind changed on one
 * side, an event dropped, a device's events out of reach), at random times;
 * the index's answer equals the scans'. */
static void test_random_against_brute_force(void **state)
{
    (void)state;
    lcg_state = 12345;
    static double waits[MAX_DEV][MAX_EV];
    long checked = 0, waited = 0;
    for (int trial = 0; trial < 300; trial++) {
        world w;
        int n = 2 + next_rand() % (MAX_DEV - 1);
        world_init(&w, n);
        int n_groups = 1 + next_rand() % 4;
        for (int g = 0; g < n_groups; g++) {
            int devs[MAX_DEV], m = 0;
            for (int d = 0; d < n; d++)
                if (next_rand() % 2)
                    devs[m++] = d;
            if (m < 2) {
                devs[0] = 0;
                devs[1] = n - 1;
                m = 2;
            }
            add_group(&w, m, devs);
        }
        int ops = 20 + next_rand() % 60;
        for (int o = 0; o < ops; o++) {
            double t = (double)(next_rand() % 1000);
            if (next_rand() % 3 == 0) { /* a compute somewhere */
                add(&w, next_rand() % n, PS_WAIT_NONE, -1, 0, 0, t, 1 + next_rand() % 5);
            } else if (next_rand() % 2) { /* a message */
                int src = next_rand() % n, dst = (src + 1 + next_rand() % (n - 1)) % n;
                double bytes = (double)(1 + next_rand() % 4);
                add(&w, src, PS_WAIT_SEND, dst, 0, bytes, t, 1 + next_rand() % 3);
                if (next_rand() % 20 != 0)
                    add(&w, dst, PS_WAIT_RECV, src, 0, next_rand() % 15 ? bytes : bytes + 1,
                        (double)(next_rand() % 1000), 1 + next_rand() % 200);
            } else { /* a collective */
                int g = next_rand() % n_groups, kind = next_rand() % 2;
                const ps_group *gr = &w.groups[g];
                for (int m = 0; m < gr->n; m++) {
                    if (next_rand() % 30 == 0)
                        continue;
                    int what = next_rand() % 25 ? kind : 1 - kind;
                    add(&w, gr->devices[m], PS_WAIT_COLLECTIVE, g, what, 8,
                        (double)(next_rand() % 1000), 1 + next_rand() % 200);
                }
            }
        }
        for (int d = 0; d < n; d++)
            w.remote[d] = next_rand() % 10 == 0;
        analyse(&w, waits);
        for (int d = 0; d < n; d++) {
            if (w.remote[d])
                continue;
            for (int i = 0; i < w.n[d]; i++) {
                double want = brute_wait(&w, d, i);
                if (!(fabs(waits[d][i] - want) <= 1e-12))
                    fail_msg("trial %d, device %d, event %d (kind %d with %d): wait %.9g, "
                             "brute force %.9g",
                             trial, d, i, w.ev[d][i].kind, w.ev[d][i].with, waits[d][i], want);
                assert_true(waits[d][i] >= 0 && waits[d][i] <= w.ev[d][i].dur);
                checked++;
                waited += want > 0;
            }
        }
        world_free(&w);
    }
    /* the cases are not all trivial */
    assert_true(checked > 5000 && waited > checked / 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_closed_forms),
        cmocka_unit_test(test_random_against_brute_force),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
