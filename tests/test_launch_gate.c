/* exec/launch_gate: collective launch windows against device memory
 * operations, on threads. A window opens only once all its members have
 * arrived; no memory operation runs inside an open window and no window
 * opens while one runs (a random mix of groups and operations on six
 * threads, checked from inside each); a waiting memory operation goes
 * before a window asked for after it; an abort releases the members that
 * wait. Checks that something has not happened yet sleep first, so a slow
 * machine can only make them pass too early, never fail. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <pthread.h>
#include <sched.h>

#include "exec/launch_gate.h"
#include "test_util.h"

static ps_launch_gate *new_gate(void)
{
    ps_launch_gate *g = NULL;
    ps_error err = {0};
    if (ps_launch_gate_create(&g, &err) != PS_OK)
        fail_msg("%s", err.msg);
    return g;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A record of who got through, in order (shared by the threads). */
static pthread_mutex_t order_mu = PTHREAD_MUTEX_INITIALIZER;
static int order_next;

static int take_order(void)
{
    pthread_mutex_lock(&order_mu);
    int k = order_next++;
    pthread_mutex_unlock(&order_mu);
    return k;
}

typedef struct member {
    ps_launch_gate *g;
    ps_launch_window *w;
    bool leave_at_once;
    bool opened;
    int order; /* take_order() once through, else -1 */
    /* leave_at_once false: held inside until `release` */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool inside, release;
} member;

static void member_init(member *m, ps_launch_gate *g, ps_launch_window *w, bool leave_at_once)
{
    memset(m, 0, sizeof *m);
    m->g = g;
    m->w = w;
    m->leave_at_once = leave_at_once;
    m->order = -1;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
}

static void *member_thread(void *p)
{
    member *m = p;
    bool open = ps_launch_gate_window_enter(m->g, m->w);
    pthread_mutex_lock(&m->mu);
    m->opened = open;
    m->order = take_order();
    m->inside = true;
    pthread_cond_broadcast(&m->cv);
    while (open && !m->leave_at_once && !m->release)
        pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
    if (open)
        ps_launch_gate_window_leave(m->g, m->w);
    return NULL;
}

static bool member_inside(member *m)
{
    pthread_mutex_lock(&m->mu);
    bool in = m->inside;
    pthread_mutex_unlock(&m->mu);
    return in;
}

static void member_wait_inside(member *m)
{
    pthread_mutex_lock(&m->mu);
    while (!m->inside)
        pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
}

static void member_release(member *m)
{
    pthread_mutex_lock(&m->mu);
    m->release = true;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

static void member_free(member *m)
{
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
}

typedef struct memop {
    ps_launch_gate *g;
    int order;
    int windows_seen; /* open windows while it ran */
} memop;

static void *memop_thread(void *p)
{
    memop *m = p;
    ps_launch_gate_mem_enter(m->g);
    m->order = take_order();
    m->windows_seen = ps_launch_gate_open_windows(m->g);
    ps_launch_gate_mem_exit(m->g);
    return NULL;
}

static void test_null_gate(void **state)
{
    (void)state;
    ps_launch_window w = {.members = 3};
    ps_launch_gate_mem_enter(NULL);
    ps_launch_gate_mem_exit(NULL);
    assert_true(ps_launch_gate_window_enter(NULL, &w));
    ps_launch_gate_window_leave(NULL, &w);
    ps_launch_gate_abort(NULL);
    ps_launch_gate_destroy(NULL);
    assert_int_equal(w.arrived, 0);
}

/* A window of three opens when the third arrives, for all three. */
static void test_window_waits_for_every_member(void **state)
{
    (void)state;
    ps_launch_gate *g = new_gate();
    ps_launch_window w = {.members = 3};
    member m[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        member_init(&m[i], g, &w, true);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, member_thread, &m[i]), 0);
    sleep_ms(50);
    assert_false(member_inside(&m[0]));
    assert_false(member_inside(&m[1]));
    assert_int_equal(ps_launch_gate_open_windows(g), 0);
    assert_int_equal(pthread_create(&th[2], NULL, member_thread, &m[2]), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_true(m[i].opened);
        member_free(&m[i]);
    }
    assert_int_equal(ps_launch_gate_open_windows(g), 0);
    assert_int_equal(w.gen, 1u);
    assert_int_equal(w.arrived, 0);
    ps_launch_gate_destroy(g);
}

/* Windows do not exclude each other; a memory operation waits for the
 * open ones, and a window asked for while it waits opens after it. */
static void test_memory_operation_between_windows(void **state)
{
    (void)state;
    ps_launch_gate *g = new_gate();
    order_next = 0;
    ps_launch_window wa = {.members = 1}, wb = {.members = 1}, wc = {.members = 1};
    member a, b, c;
    member_init(&a, g, &wa, false);
    member_init(&b, g, &wb, false);
    member_init(&c, g, &wc, true);
    pthread_t ta, tb, tc, tm;
    assert_int_equal(pthread_create(&ta, NULL, member_thread, &a), 0);
    member_wait_inside(&a);
    assert_int_equal(pthread_create(&tb, NULL, member_thread, &b), 0);
    member_wait_inside(&b);
    assert_int_equal(ps_launch_gate_open_windows(g), 2);
    memop mo = {.g = g, .order = -1};
    assert_int_equal(pthread_create(&tm, NULL, memop_thread, &mo), 0);
    for (int polls = 0; ps_launch_gate_mem_waiting(g) == 0; polls++) {
        if (polls == 10000) /* 10 s: it did not wait for the open windows */
            fail_msg("the memory operation did not wait for the open windows");
        sleep_ms(1);
    }
    assert_int_equal(pthread_create(&tc, NULL, member_thread, &c), 0);
    sleep_ms(50);
    assert_false(member_inside(&c)); /* behind the waiting memory operation */
    assert_int_equal(ps_launch_gate_mem_running(g), 0);
    member_release(&a);
    assert_int_equal(pthread_join(ta, NULL), 0);
    sleep_ms(20);
    assert_int_equal(ps_launch_gate_mem_running(g), 0); /* b is still open */
    member_release(&b);
    assert_int_equal(pthread_join(tb, NULL), 0);
    assert_int_equal(pthread_join(tm, NULL), 0);
    assert_int_equal(pthread_join(tc, NULL), 0);
    assert_int_equal(mo.windows_seen, 0);
    assert_true(c.opened);
    /* a, b, then the memory operation, then c */
    assert_true(a.order < mo.order && b.order < mo.order);
    assert_true(mo.order < c.order);
    member_free(&a);
    member_free(&b);
    member_free(&c);
    ps_launch_gate_destroy(g);
}

/* Members waiting for a window give up at an abort, and later ones at once;
 * memory operations go on. */
static void test_abort_releases_members(void **state)
{
    (void)state;
    ps_launch_gate *g = new_gate();
    ps_launch_window w = {.members = 2};
    member m;
    member_init(&m, g, &w, true);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, member_thread, &m), 0);
    sleep_ms(20);
    ps_launch_gate_abort(g);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_false(m.opened);
    ps_launch_window one = {.members = 1};
    assert_false(ps_launch_gate_window_enter(g, &one));
    ps_launch_gate_mem_enter(g);
    assert_int_equal(ps_launch_gate_mem_running(g), 1);
    ps_launch_gate_mem_exit(g);
    assert_int_equal(ps_launch_gate_open_windows(g), 0);
    member_free(&m);
    ps_launch_gate_destroy(g);
}

/* Six threads walk one list of steps; a step is a window of a group (the
 * members among the threads) and, on each thread, a memory operation at
 * random. Inside a window no memory operation runs; inside a memory
 * operation no window is open. */
#define STRESS_THREADS 6
#define STRESS_STEPS 3000
#define STRESS_GROUPS 5

static const unsigned stress_groups[STRESS_GROUPS] = {
    0x03u, /* {0, 1} */
    0x1cu, /* {2, 3, 4} */
    0x15u, /* {0, 2, 4} */
    0x20u, /* {5} */
    0x3fu, /* all */
};

typedef struct stress {
    ps_launch_gate *g;
    ps_launch_window *w; /* per group */
    const int *step_group;
    int thread;
    int violations;
    int windows, memops;
} stress;

static void *stress_thread(void *p)
{
    stress *s = p;
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(s->thread + 1);
    for (int k = 0; k < STRESS_STEPS; k++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (x & 1u) {
            ps_launch_gate_mem_enter(s->g);
            s->violations += ps_launch_gate_open_windows(s->g) != 0;
            if (x & 2u)
                sched_yield();
            s->violations += ps_launch_gate_open_windows(s->g) != 0;
            ps_launch_gate_mem_exit(s->g);
            s->memops++;
        }
        int gi = s->step_group[k];
        if (!(stress_groups[gi] >> s->thread & 1u))
            continue;
        if (!ps_launch_gate_window_enter(s->g, &s->w[gi])) {
            s->violations++;
            continue;
        }
        s->violations += ps_launch_gate_mem_running(s->g) != 0;
        if (x & 4u)
            sched_yield();
        s->violations += ps_launch_gate_mem_running(s->g) != 0;
        ps_launch_gate_window_leave(s->g, &s->w[gi]);
        s->windows++;
    }
    return NULL;
}

static void test_windows_and_memory_operations_exclude(void **state)
{
    (void)state;
    ps_launch_gate *g = new_gate();
    ps_launch_window w[STRESS_GROUPS];
    for (int i = 0; i < STRESS_GROUPS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].members = __builtin_popcount(stress_groups[i]);
    }
    int *step_group = malloc(STRESS_STEPS * sizeof *step_group);
    assert_non_null(step_group);
    test_rng_seed(7);
    for (int k = 0; k < STRESS_STEPS; k++)
        step_group[k] = below(STRESS_GROUPS);
    stress s[STRESS_THREADS];
    pthread_t th[STRESS_THREADS];
    for (int t = 0; t < STRESS_THREADS; t++) {
        s[t] = (stress){.g = g, .w = w, .step_group = step_group, .thread = t};
        assert_int_equal(pthread_create(&th[t], NULL, stress_thread, &s[t]), 0);
    }
    int expected_windows[STRESS_THREADS] = {0};
    for (int k = 0; k < STRESS_STEPS; k++)
        for (int t = 0; t < STRESS_THREADS; t++)
            expected_windows[t] += stress_groups[step_group[k]] >> t & 1u;
    for (int t = 0; t < STRESS_THREADS; t++) {
        assert_int_equal(pthread_join(th[t], NULL), 0);
        if (s[t].violations != 0)
            fail_msg("thread %d: %d violations", t, s[t].violations);
        assert_int_equal(s[t].windows, expected_windows[t]);
        assert_true(s[t].memops > STRESS_STEPS / 4);
    }
    assert_int_equal(ps_launch_gate_open_windows(g), 0);
    assert_int_equal(ps_launch_gate_mem_running(g), 0);
    free(step_group);
    ps_launch_gate_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_gate),
        cmocka_unit_test(test_window_waits_for_every_member),
        cmocka_unit_test(test_memory_operation_between_windows),
        cmocka_unit_test(test_abort_releases_members),
        cmocka_unit_test(test_windows_and_memory_operations_exclude),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
