/* exec/mailbox and exec/host_collective in one process: FIFO order per
 * (pair, channel), malformed pairs, an abort waking a blocked receiver, and
 * the host-combined collectives against closed forms, member order included
 * (the arithmetic that the CPU backend, and the CUDA backend across hosts,
 * rely on for results identical on every member). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "exec/host_collective.h"
#include "exec/mailbox.h"

static ps_mailbox *new_mailbox(int n)
{
    ps_mailbox *mb = NULL;
    ps_error err = {0};
    if (ps_mailbox_create(n, NULL, &mb, &err) != PS_OK)
        fail_msg("%s", err.msg);
    return mb;
}

static void post_int(ps_mailbox *mb, int src, int dst, int channel, int value)
{
    int *p = ps_mailbox_payload(sizeof *p);
    assert_non_null(p);
    *p = value;
    ps_error err = {0};
    assert_int_equal(ps_mailbox_post(mb, src, dst, channel, p, &err), PS_OK);
}

static int take_int(ps_mailbox *mb, int src, int dst, int channel)
{
    void *data, *owner;
    size_t bytes;
    ps_error err = {0};
    if (ps_mailbox_take(mb, src, dst, channel, &data, &bytes, &owner, &err) != PS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(bytes, sizeof(int));
    int v = *(int *)data;
    free(owner);
    return v;
}

static void test_fifo_per_pair_and_channel(void **state)
{
    (void)state;
    ps_mailbox *mb = new_mailbox(3);
    assert_false(ps_mailbox_is_remote(mb, 2));
    for (int i = 0; i < 5; i++)
        post_int(mb, 0, 1, PS_HOSTS_CHANNEL_P2P, i);
    post_int(mb, 0, 1, PS_HOSTS_CHANNEL_COLLECTIVE, 100);
    post_int(mb, 2, 1, PS_HOSTS_CHANNEL_P2P, 200);
    /* channels and pairs are separate FIFOs */
    assert_int_equal(take_int(mb, 0, 1, PS_HOSTS_CHANNEL_COLLECTIVE), 100);
    assert_int_equal(take_int(mb, 2, 1, PS_HOSTS_CHANNEL_P2P), 200);
    for (int i = 0; i < 3; i++)
        assert_int_equal(take_int(mb, 0, 1, PS_HOSTS_CHANNEL_P2P), i);
    /* two messages never taken: destroy frees them (the sanitizers check) */
    ps_mailbox_destroy(mb);
}

static void test_malformed_pairs(void **state)
{
    (void)state;
    ps_mailbox *mb = new_mailbox(3);
    ps_error err = {0};
    void *p = ps_mailbox_payload(8);
    assert_int_equal(ps_mailbox_post(mb, 0, 5, PS_HOSTS_CHANNEL_P2P, p, &err), PS_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "from device 0 to device 5"));
    p = ps_mailbox_payload(8);
    ps_error err2 = {0}, err3 = {0};
    assert_int_equal(ps_mailbox_post(mb, 0, 1, PS_HOSTS_CHANNELS, p, &err2), PS_ERR_INTERNAL);
    assert_non_null(strstr(err2.msg, "on channel 2"));
    void *data, *owner;
    size_t bytes;
    assert_int_equal(ps_mailbox_take(mb, -1, 1, 0, &data, &bytes, &owner, &err3),
                     PS_ERR_INTERNAL);
    assert_non_null(strstr(err3.msg, "from device -1 to device 1"));
    assert_null(owner);
    ps_mailbox *none = NULL;
    ps_error err4 = {0};
    assert_int_equal(ps_mailbox_create(0, NULL, &none, &err4), PS_ERR_INVALID);
    assert_null(none);
    ps_mailbox_discard(ps_mailbox_payload(16));
    ps_mailbox_destroy(NULL);
    ps_mailbox_destroy(mb);
}

typedef struct waiter {
    ps_mailbox *mb;
    ps_status st;
    ps_error err;
} waiter;

static void *wait_for_message(void *arg)
{
    waiter *w = arg;
    void *data, *owner;
    size_t bytes;
    w->st = ps_mailbox_take(w->mb, 0, 1, PS_HOSTS_CHANNEL_P2P, &data, &bytes, &owner, &w->err);
    if (w->st == PS_OK)
        free(owner);
    return NULL;
}

static void test_abort_wakes_a_receiver(void **state)
{
    (void)state;
    waiter w = {new_mailbox(2), PS_OK, {0}};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_for_message, &w), 0);
    ps_mailbox_abort(w.mb);
    pthread_join(t, NULL);
    assert_int_equal(w.st, PS_ERR_DEVICE);
    assert_string_equal(w.err.msg, "device 1: stopped because another device failed");
    assert_true(ps_mailbox_aborted(w.mb));
    /* after the abort even a queued message is not handed out */
    post_int(w.mb, 0, 1, PS_HOSTS_CHANNEL_P2P, 7);
    wait_for_message(&w);
    assert_int_equal(w.st, PS_ERR_DEVICE);
    ps_mailbox_destroy(w.mb);
}

/* ---- collectives: one thread per member ---- */

enum { N = 4, ROWS = 8, COLS = 3 };

typedef struct member {
    ps_mailbox *mb;
    int rank, kind;
    ps_collective coll;
    int devices[N];
    ps_tile src, dst;
    float src_data[ROWS * COLS], dst_data[ROWS * COLS];
    ps_status st;
    ps_error err;
} member;

static ps_tile tile(float *data, int64_t row0, int64_t rows)
{
    ps_tile t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.rank = 2;
    t.global[0] = ROWS;
    t.global[1] = COLS;
    t.shape[0] = rows;
    t.shape[1] = COLS;
    t.offset[0] = row0;
    return t;
}

static void *run_member(void *arg)
{
    member *m = arg;
    ps_exec_group g = {.id = 3, .n = N, .devices = m->devices, .rank = m->rank};
    ps_exchange x;
    m->st = ps_exchange_run(m->mb, m->rank, &g, m->kind, m->src.data, 4,
                            ps_tile_numel(&m->src), &m->src, &x, &m->err);
    if (m->st == PS_OK)
        m->st = ps_combine_tiles(m->rank, g.id, m->coll, N, x.geo, x.copy, &m->dst, &m->err);
    ps_exchange_free(&x);
    return NULL;
}

/* Runs the collective on N threads; member r's src holds src_rows rows from
 * row r * src_rows (all rows when src_rows is ROWS), its dst likewise, with
 * values f(r, global row, col). */
static void run_members(member *ms, ps_collective coll, int src_rows, int dst_rows,
                        float (*f)(int, int64_t, int64_t))
{
    ps_mailbox *mb = new_mailbox(N);
    pthread_t t[N];
    for (int r = 0; r < N; r++) {
        member *m = &ms[r];
        memset(m, 0, sizeof *m);
        m->mb = mb;
        m->rank = r;
        m->kind = 100 + (int)coll;
        m->coll = coll;
        for (int i = 0; i < N; i++)
            m->devices[i] = i;
        int64_t s0 = src_rows == ROWS ? 0 : (int64_t)r * src_rows;
        int64_t d0 = dst_rows == ROWS ? 0 : (int64_t)r * dst_rows;
        m->src = tile(m->src_data, s0, src_rows);
        m->dst = tile(m->dst_data, d0, dst_rows);
        for (int64_t i = 0; i < src_rows; i++)
            for (int64_t j = 0; j < COLS; j++)
                m->src_data[i * COLS + j] = f(r, s0 + i, j);
        for (int64_t i = 0; i < dst_rows * COLS; i++)
            m->dst_data[i] = -99.0f; /* what a write left out would show */
    }
    for (int r = 0; r < N; r++)
        assert_int_equal(pthread_create(&t[r], NULL, run_member, &ms[r]), 0);
    for (int r = 0; r < N; r++)
        pthread_join(t[r], NULL);
    ps_mailbox_destroy(mb);
}

/* Member order matters in float: 1e8 + 1 - 1e8 + 1 is 1 in order, 2 or 0
 * in others. */
static float cancelling(int r, int64_t row, int64_t col)
{
    static const float v[N] = {1e8f, 1.0f, -1e8f, 1.0f};
    return v[r] * (float)(1 + row + col);
}

static float by_position(int r, int64_t row, int64_t col)
{
    (void)r;
    return (float)(row * 10 + col);
}

static void test_all_reduce_in_member_order(void **state)
{
    (void)state;
    member ms[N];
    run_members(ms, PS_COLL_ALL_REDUCE, ROWS, ROWS, cancelling);
    for (int r = 0; r < N; r++) {
        if (ms[r].st != PS_OK)
            fail_msg("member %d: %s", r, ms[r].err.msg);
        for (int64_t i = 0; i < ROWS; i++)
            for (int64_t j = 0; j < COLS; j++) {
                float k = (float)(1 + i + j);
                float want = (((0.0f + 1e8f * k) + k) + -1e8f * k) + k;
                assert_true(ms[r].dst_data[i * COLS + j] == want);
            }
    }
}

static void test_reduce_scatter_and_all_gather(void **state)
{
    (void)state;
    member ms[N];
    /* reduce-scatter: every member holds all rows, keeps the sum of its own */
    run_members(ms, PS_COLL_REDUCE_SCATTER, ROWS, ROWS / N, by_position);
    for (int r = 0; r < N; r++) {
        assert_int_equal(ms[r].st, PS_OK);
        for (int64_t i = 0; i < ROWS / N; i++)
            for (int64_t j = 0; j < COLS; j++)
                assert_true(ms[r].dst_data[i * COLS + j] ==
                            (float)N * by_position(0, r * (ROWS / N) + i, j));
    }
    /* all-gather: member r's rows to everyone */
    run_members(ms, PS_COLL_ALL_GATHER, ROWS / N, ROWS, by_position);
    for (int r = 0; r < N; r++) {
        assert_int_equal(ms[r].st, PS_OK);
        for (int64_t i = 0; i < ROWS; i++)
            for (int64_t j = 0; j < COLS; j++)
                assert_true(ms[r].dst_data[i * COLS + j] == by_position(0, i, j));
    }
}

static void test_gather_that_leaves_a_hole(void **state)
{
    (void)state;
    member ms[N];
    /* each member gives one row (rows 0 to 3): rows 4 to 7 are held by none */
    run_members(ms, PS_COLL_ALL_GATHER, 1, ROWS, by_position);
    for (int r = 0; r < N; r++) {
        assert_int_equal(ms[r].st, PS_ERR_INTERNAL);
        assert_non_null(strstr(ms[r].err.msg, "all-gather on group 3 leaves part of the tile "
                                              "unwritten"));
    }
}

static void test_members_of_different_tensors(void **state)
{
    (void)state;
    float a[ROWS * COLS] = {0}, b[ROWS * COLS] = {0}, out[ROWS * COLS];
    ps_tile geo[2] = {tile(a, 0, ROWS), tile(b, 0, ROWS)};
    geo[1].global[1] = COLS + 1;
    void *copy[2] = {a, b};
    ps_tile dst = tile(out, 0, ROWS);
    ps_error err = {0};
    assert_int_equal(ps_combine_tiles(1, 7, PS_COLL_ALL_REDUCE, 2, geo, copy, &dst, &err),
                     PS_ERR_INTERNAL);
    assert_string_equal(err.msg, "device 1: members of group 7 hold tiles of different tensors "
                                 "(dimension 1: 4 and 3)");
}

static void *run_mismatched(void *arg)
{
    member *m = arg;
    ps_exec_group g = {.id = 5, .n = 2, .devices = m->devices, .rank = m->rank};
    float v = 1.0f;
    ps_exchange x;
    m->st = ps_exchange_run(m->mb, m->rank, &g, m->kind, &v, 4, 1, NULL, &x, &m->err);
    ps_exchange_free(&x);
    return NULL;
}

static void test_members_in_different_collectives(void **state)
{
    (void)state;
    ps_mailbox *mb = new_mailbox(2);
    member ms[2];
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        memset(&ms[r], 0, sizeof ms[r]);
        ms[r].mb = mb;
        ms[r].rank = r;
        ms[r].kind = 10 + r; /* a sum meets a max */
        ms[r].devices[0] = 0;
        ms[r].devices[1] = 1;
        assert_int_equal(pthread_create(&t[r], NULL, run_mismatched, &ms[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(ms[r].st, PS_ERR_INTERNAL);
        char want[96];
        snprintf(want, sizeof want, "device %d: members of group 5 entered different collectives",
                 r);
        assert_non_null(strstr(ms[r].err.msg, want));
    }
    ps_mailbox_destroy(mb);
}

static void test_combine_values(void **state)
{
    (void)state;
    float a[2] = {1e8f, -3.0f}, b[2] = {1.0f, 5.0f}, c[2] = {-1e8f, 4.0f};
    void *copy[3] = {a, b, c};
    int64_t count[3] = {2, 2, 2};
    float out[2];
    ps_error err = {0};
    assert_int_equal(ps_combine_values(0, 3, copy, count, out, 2, PS_REDUCE_OP_SUM, false, &err),
                     PS_OK);
    assert_true(out[0] == 0.0f); /* (1e8 + 1) rounds to 1e8 in float */
    assert_true(out[1] == 6.0f);
    assert_int_equal(ps_combine_values(0, 3, copy, count, out, 2, PS_REDUCE_OP_MAX, false, &err),
                     PS_OK);
    assert_true(out[0] == 1e8f && out[1] == 5.0f);
    double da[1] = {1e8}, db[1] = {1.0}, dc[1] = {-1e8};
    void *dcopy[3] = {da, db, dc};
    double dout[1];
    int64_t ones[3] = {1, 1, 1};
    assert_int_equal(ps_combine_values(0, 3, dcopy, ones, dout, 1, PS_REDUCE_OP_SUM, true, &err),
                     PS_OK);
    assert_true(dout[0] == 1.0); /* exact in double */
    count[1] = 3;
    assert_int_equal(ps_combine_values(2, 3, copy, count, out, 2, PS_REDUCE_OP_SUM, false, &err),
                     PS_ERR_INTERNAL);
    assert_string_equal(err.msg, "device 2: reduction of 2 values meets one of 3");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_per_pair_and_channel),
        cmocka_unit_test(test_malformed_pairs),
        cmocka_unit_test(test_abort_wakes_a_receiver),
        cmocka_unit_test(test_all_reduce_in_member_order),
        cmocka_unit_test(test_reduce_scatter_and_all_gather),
        cmocka_unit_test(test_gather_that_leaves_a_hole),
        cmocka_unit_test(test_members_in_different_collectives),
        cmocka_unit_test(test_members_of_different_tensors),
        cmocka_unit_test(test_combine_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
