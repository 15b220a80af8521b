/* planner/pipeline_time: the schedule's timing against an explicit longest
 * path and closed forms, and the priced links against the lowered programs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "planner/cost_model.h"
#include "planner/inter_pass.h"
#include "planner/lower.h"
#include "planner/pipeline_time.h"
#include "planner/plan_model.h"
#include "plan_fixture.h"
#include "test_util.h"

/* ---- reference: the schedule as an explicit graph, longest path ---- */

/* a and b within rtol of b, relative */
#define assert_close(a, b, rtol)                                                                   \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= 1e-300 + (rtol)*fabs(b_)))                                          \
            fail_msg("%s = %.17g, expected %.17g", #a, a_, b_);                                    \
    } while (0)

#define MAX_NODES 20000
#define MAX_EDGES 60000

typedef struct dag {
    int n, n_edges;
    double dur[MAX_NODES];
    int edge_from[MAX_EDGES], edge_to[MAX_EDGES];
} dag;

static int node(dag *g, double dur)
{
    assert_true(g->n < MAX_NODES);
    g->dur[g->n] = dur;
    return g->n++;
}

static void edge(dag *g, int a, int b)
{
    if (a < 0 || b < 0)
        return;
    assert_true(g->n_edges < MAX_EDGES);
    g->edge_from[g->n_edges] = a;
    g->edge_to[g->n_edges++] = b;
}

/* Longest path ending at each node (Kahn's order); NAN on a cycle. */
static double longest(const dag *g, int sink)
{
    static int indeg[MAX_NODES], queue[MAX_NODES];
    static double finish[MAX_NODES];
    memset(indeg, 0, sizeof indeg);
    for (int e = 0; e < g->n_edges; e++)
        indeg[g->edge_to[e]]++;
    int head = 0, tail = 0;
    for (int v = 0; v < g->n; v++) {
        finish[v] = g->dur[v];
        if (indeg[v] == 0)
            queue[tail++] = v;
    }
    while (head < tail) {
        int v = queue[head++];
        for (int e = 0; e < g->n_edges; e++) {
            if (g->edge_from[e] != v)
                continue;
            int w = g->edge_to[e];
            finish[w] = fmax(finish[w], finish[v] + g->dur[w]);
            if (--indeg[w] == 0)
                queue[tail++] = w;
        }
    }
    return tail == g->n ? finish[sink] : NAN;
}

/* The lowering's order, written out plainly. */
static void order_of(int k, int n, int m, bool gpipe, int *phase, int *mb)
{
    int warm = gpipe ? m : (n - k - 1 < m ? n - k - 1 : m), i = 0;
    for (int j = 0; j < warm; j++, i++)
        phase[i] = 0, mb[i] = j;
    for (int j = 0; j < m - warm; j++) {
        phase[i] = 0, mb[i++] = warm + j;
        phase[i] = 1, mb[i++] = j;
    }
    for (int j = m - warm; j < m; j++, i++)
        phase[i] = 1, mb[i] = j;
}

static double reference(int n, const double *f, const double *b, const double *u,
                        const ps_stage_link *links, int n_links, int m, bool gpipe)
{
    static dag g;
    g.n = g.n_edges = 0;
    int sink = node(&g, 0);
    int last[16], ready[16][2][32], upd_ready[16], upd_end[16];
    int phase[64], mb[64];
    for (int k = 0; k < n; k++)
        last[k] = -1;
    /* kernels, stage by stage: receives in link order, the kernel, the
     * sender's reductions; the edges from each receive's source come after
     * every node exists */
    int recv_node[16][2][32][8];
    for (int k = 0; k < n; k++) {
        order_of(k, n, m, gpipe, phase, mb);
        for (int pos = 0; pos < 2 * m; pos++) {
            int ph = phase[pos], i = mb[pos], r = 0;
            for (int l = 0; l < n_links; l++)
                if (links[l].to == k && (int)links[l].kind == ph) {
                    int v = node(&g, links[l].seconds);
                    edge(&g, last[k], v);
                    last[k] = v;
                    recv_node[k][ph][i][r++] = v;
                }
            int v = node(&g, ph ? b[k] : f[k]);
            edge(&g, last[k], v);
            last[k] = v;
            for (int l = 0; l < n_links; l++)
                if (links[l].from == k && (int)links[l].kind == ph) {
                    int w = node(&g, links[l].reduce_s);
                    edge(&g, last[k], w);
                    last[k] = w;
                }
            ready[k][ph][i] = last[k];
        }
    }
    for (int k = 0; k < n; k++)
        for (int ph = 0; ph < 2; ph++)
            for (int i = 0; i < m; i++) {
                int r = 0;
                for (int l = 0; l < n_links; l++)
                    if (links[l].to == k && (int)links[l].kind == ph)
                        edge(&g, ready[links[l].from][ph][i], recv_node[k][ph][i][r++]);
            }
    /* updates */
    for (int k = 0; k < n; k++)
        for (int l = 0; l < n_links; l++)
            if (links[l].from == k && links[l].kind == PS_LINK_ACCUMULATED) {
                int w = node(&g, links[l].reduce_s);
                edge(&g, last[k], w);
                last[k] = w;
            }
    for (int k = 0; k < n; k++)
        upd_ready[k] = last[k];
    int upd_recv[16][8], n_upd_recv[16] = {0};
    for (int k = 0; k < n; k++) {
        for (int l = 0; l < n_links; l++)
            if (links[l].to == k &&
                (links[l].kind == PS_LINK_ACCUMULATED || links[l].kind == PS_LINK_UPDATE)) {
                int v = node(&g, links[l].seconds);
                edge(&g, last[k], v);
                last[k] = v;
                upd_recv[k][n_upd_recv[k]++] = v;
                if (links[l].kind == PS_LINK_ACCUMULATED)
                    edge(&g, upd_ready[links[l].from], v);
            }
        int v = node(&g, u[k]);
        edge(&g, last[k], v);
        last[k] = v;
        for (int l = 0; l < n_links; l++)
            if (links[l].from == k &&
                (links[l].kind == PS_LINK_UPDATE || links[l].kind == PS_LINK_PARAM_COPY)) {
                int w = node(&g, links[l].reduce_s);
                edge(&g, last[k], w);
                last[k] = w;
            }
        upd_end[k] = last[k];
    }
    for (int k = 0; k < n; k++) {
        int r = 0;
        for (int l = 0; l < n_links; l++)
            if (links[l].to == k &&
                (links[l].kind == PS_LINK_ACCUMULATED || links[l].kind == PS_LINK_UPDATE)) {
                if (links[l].kind == PS_LINK_UPDATE)
                    edge(&g, upd_end[links[l].from], upd_recv[k][r]);
                r++;
            }
        for (int l = 0; l < n_links; l++)
            if (links[l].to == k && links[l].kind == PS_LINK_PARAM_COPY) {
                int v = node(&g, links[l].seconds);
                edge(&g, last[k], v);
                edge(&g, upd_end[links[l].from], v);
                last[k] = v;
            }
        edge(&g, last[k], sink);
    }
    return longest(&g, sink);
}

/* Stage times of n random stages: forward, backward (per micro-batch) and
 * update (per step), in seconds. */
static void random_stage_times(int n, double *f, double *b, double *u)
{
    for (int k = 0; k < n; k++) {
        f[k] = 0.1 + uniform();
        b[k] = 0.1 + 2 * uniform();
        u[k] = uniform();
    }
}

/* The spans ps_pipeline_schedule reports for the schedule it timed at
 * `iteration`: each stage's in order without overlap, m forwards and m
 * backwards in micro-batch order and one update, each kernel at least as
 * long as its stage's time (the reductions it sends follow it), each
 * receive as long as its link where nothing shares its NICs and after the
 * kernel that made its data; the last ends the step. */
static void check_spans(int n, const double *f, const double *b, const double *u,
                        const ps_stage_link *links, int n_links, const ps_stage_nics *nics,
                        int m, bool gpipe, double iteration)
{
    ps_pipeline_span *sp = NULL;
    int n_sp = 0;
    double got = ps_pipeline_schedule(n, f, b, u, links, n_links, nics, m, gpipe, &sp, &n_sp);
    assert_true(got == iteration);
    assert_non_null(sp);
    double last = 0, eps = 1e-12 * iteration;
    for (int k = 0, i = 0; k < n; k++) {
        int fw = 0, bw = 0, up = 0;
        double at = 0;
        for (; i < n_sp && sp[i].stage == k; i++) {
            const ps_pipeline_span *x = &sp[i];
            assert_true(x->start_s >= at - eps && x->end_s >= x->start_s);
            at = x->end_s;
            last = fmax(last, x->end_s);
            double dur = x->end_s - x->start_s;
            if (x->kind == PS_SPAN_FORWARD) {
                assert_int_equal(x->micro_batch, fw++);
                assert_true(dur >= f[k] - eps);
            } else if (x->kind == PS_SPAN_BACKWARD) {
                assert_int_equal(x->micro_batch, bw++);
                assert_true(dur >= b[k] - eps);
            } else if (x->kind == PS_SPAN_UPDATE) {
                assert_int_equal(bw, m);
                up++;
            } else if (x->kind == PS_SPAN_RECEIVE) {
                const ps_stage_link *l = &links[x->link];
                assert_int_equal(l->to, k);
                if (fabs(dur - l->seconds) > eps) /* (links here share no NIC) */
                    fail_msg("stage %d: receives from %d for %.17g s, its link %.17g s", k,
                             l->from, dur, l->seconds);
                if (l->kind > PS_LINK_BACKWARD)
                    continue;
                ps_pipeline_span_kind made =
                    l->kind == PS_LINK_FORWARD ? PS_SPAN_FORWARD : PS_SPAN_BACKWARD;
                int found = 0;
                for (int j = 0; j < n_sp; j++)
                    if (sp[j].stage == l->from && sp[j].kind == made &&
                        sp[j].micro_batch == x->micro_batch) {
                        assert_true(x->start_s >= sp[j].end_s - eps);
                        found++;
                    }
                assert_int_equal(found, 1);
            }
        }
        assert_int_equal(fw, m);
        assert_int_equal(bw, m);
        assert_int_equal(up, 1);
    }
    assert_true(fabs(last - iteration) <= eps);
    free(sp);
}

/* Random pipelines (1-5 stages, 1-9 micro-batches, both schedules) with
 * neighbour links, skips, and per-step links, half of them through NICs of
 * their own: the schedule's time equals the longest path through the
 * explicit graph of its kernels and receives. */
static void schedule_is_the_longest_path(void **state)
{
    (void)state;
    test_rng_seed(7);
    double worst = 0;
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(uniform() * 5), m = 1 + (int)(uniform() * 9);
        bool gpipe = uniform() < 0.3;
        double f[8], b[8], u[8];
        ps_stage_link links[32];
        int n_links = 0;
        random_stage_times(n, f, b, u);
        for (int k = 0; k + 1 < n; k++) {
            links[n_links++] = (ps_stage_link){.from = k, .to = k + 1, .kind = PS_LINK_FORWARD,
                                               .reduce_s = 0.1 * uniform(),
                                               .seconds = 0.5 * uniform()};
            links[n_links++] = (ps_stage_link){.from = k + 1, .to = k, .kind = PS_LINK_BACKWARD,
                                               .reduce_s = 0.1 * uniform(),
                                               .seconds = 0.5 * uniform()};
            if (k + 2 < n && uniform() < 0.3)
                links[n_links++] = (ps_stage_link){.from = k, .to = k + 2,
                                                   .kind = PS_LINK_FORWARD,
                                                   .seconds = uniform()};
        }
        if (n > 1 && uniform() < 0.5) {
            links[n_links++] = (ps_stage_link){.from = n - 1, .to = 0,
                                               .kind = PS_LINK_ACCUMULATED,
                                               .reduce_s = 0.1 * uniform(),
                                               .seconds = uniform()};
            links[n_links++] = (ps_stage_link){.from = 0, .to = n - 1,
                                               .kind = PS_LINK_PARAM_COPY,
                                               .seconds = uniform()};
        }
        if (n > 2 && uniform() < 0.3)
            links[n_links++] = (ps_stage_link){.from = 0, .to = 1, .kind = PS_LINK_UPDATE,
                                               .seconds = uniform()};
        /* links through NICs no other link crosses wait for nothing, nor
         * do stages' collectives across nodes of their own: part of each
         * reduction and update, split off, takes the same time */
        ps_stage_nics nics[8];
        bool own = uniform() < 0.5;
        if (own) {
            for (int l = 0; l < n_links; l++) {
                links[l].nic_node[0] = 2 * l;
                links[l].nic_node[1] = 2 * l + 1;
                links[l].nic_nodes[0] = links[l].nic_nodes[1] = 1;
                links[l].nic_s = links[l].seconds * uniform();
                links[l].reduce_nic_s = links[l].reduce_s * uniform();
            }
            for (int k = 0; k < n; k++)
                nics[k] = (ps_stage_nics){.node = 100 + 2 * k, .nodes = 2,
                                          .update_nic_s = u[k] * uniform()};
        }
        double got = ps_pipeline_iteration_s(n, f, b, u, links, n_links, own ? nics : NULL, m,
                                             gpipe);
        double want = reference(n, f, b, u, links, n_links, m, gpipe);
        assert_false(isnan(got));
        check_spans(n, f, b, u, links, n_links, own ? nics : NULL, m, gpipe, got);
        double rel = fabs(got - want) / want;
        if (rel > 1e-12)
            fail_msg("trial %d: %d stages, %d micro-batches, %s: %.17g, longest path %.17g",
                     trial, n, m, gpipe ? "gpipe" : "1f1b", got, want);
        worst = fmax(worst, rel);
    }
    print_message("300 random pipelines: largest relative difference %.2g\n", worst);
}

/* p equal stages, transfers that take no time: (B + p - 1)(f + b) + update,
 * for both schedules (Alpa's formula on equal stages). */
static void equal_stages_closed_form(void **state)
{
    (void)state;
    for (int p = 1; p <= 6; p++)
        for (int m = 1; m <= 12; m++)
            for (int gpipe = 0; gpipe < 2; gpipe++) {
                double f[6], b[6], u[6];
                ps_stage_link links[10];
                int n_links = 0;
                for (int k = 0; k < p; k++)
                    f[k] = 1, b[k] = 2, u[k] = 0.5;
                for (int k = 0; k + 1 < p; k++) {
                    links[n_links++] =
                        (ps_stage_link){.from = k, .to = k + 1, .kind = PS_LINK_FORWARD};
                    links[n_links++] =
                        (ps_stage_link){.from = k + 1, .to = k, .kind = PS_LINK_BACKWARD};
                }
                double got = ps_pipeline_iteration_s(p, f, b, u, links, n_links, NULL, m, gpipe);
                assert_true(fabs(got - ((m + p - 1) * 3.0 + 0.5)) < 1e-12);
            }
    /* two stages, transfers of c each way, 1F1B: each stage receives c
     * before each kernel it gets data for, so it settles to one micro-batch
     * per f + b + c; closed form for B micro-batches: derived by hand */
    double f[2] = {1, 1}, b[2] = {2, 2}, u[2] = {0, 0}, c = 0.25;
    ps_stage_link links[2] = {
        {.from = 0, .to = 1, .kind = PS_LINK_FORWARD, .seconds = c},
        {.from = 1, .to = 0, .kind = PS_LINK_BACKWARD, .seconds = c},
    };
    for (int m = 1; m <= 10; m++) {
        double got = ps_pipeline_iteration_s(2, f, b, u, links, 2, NULL, m, false);
        /* stage 0's first backward starts at 2f + b + 2c (after F0 crossed,
         * ran forward and backward on stage 1 and came back); from there
         * every micro-batch takes c + b + f on stage 0 (it receives, runs
         * backward, runs the next forward) and the last one c + b */
        double want = 2 * f[0] + b[0] + 2 * c + (m - 1) * (c + b[0] + f[0]) + b[0];
        if (m == 1)
            want = f[0] + c + f[1] + b[1] + c + b[0];
        assert_true(fabs(got - want) < 1e-12);
    }
}

/* Two stages on one node receive from a stage on another at the same time:
 * its NIC serves one transfer, then the other (derived by hand: stage 0's
 * forward ends at f, stage 1 receives for c, stage 2 then for c, and runs
 * its forward and backward), whichever link comes first. */
static void shared_nic_takes_turns(void **state)
{
    (void)state;
    for (int trial = 0; trial < 20; trial++) {
        double f = 1 + trial % 3, b = 1 + trial % 2, c = 5 + 3 * trial;
        double fs[3] = {f, f, f}, bs[3] = {b, b, b}, us[3] = {0, 0, 0};
        ps_stage_link links[4] = {
            {.from = 0, .to = 1, .kind = PS_LINK_FORWARD, .seconds = c, .nic_s = c,
             .nic_node = {0, 1}, .nic_nodes = {1, 1}},
            {.from = 0, .to = 2, .kind = PS_LINK_FORWARD, .seconds = c, .nic_s = c,
             .nic_node = {0, 1}, .nic_nodes = {1, 1}},
            {.from = 1, .to = 0, .kind = PS_LINK_BACKWARD},
            {.from = 2, .to = 0, .kind = PS_LINK_BACKWARD},
        };
        if (trial % 2) /* the other stage asks first in link order */
            links[0].to = 2, links[1].to = 1, links[2].from = 2, links[3].from = 1;
        double got = ps_pipeline_iteration_s(3, fs, bs, us, links, 4, NULL, 1, false);
        assert_true(fabs(got - (f + 2 * c + f + b + b)) < 1e-12);
        /* on NICs of their own, both receive at once */
        links[1].nic_node[0] = 2, links[1].nic_node[1] = 3;
        got = ps_pipeline_iteration_s(3, fs, bs, us, links, 4, NULL, 1, false);
        assert_true(fabs(got - (f + c + f + b + b)) < 1e-12);
    }
}

/* A last stage across nodes 1-2 updates through their NICs while the first
 * stage, on node 0, receives its accumulated link through them (derived by
 * hand: with f = b = 1 and one micro-batch, stage 1's backward ends at 3 and
 * its update starts; stage 0's backward ends at 4 and the link starts; both
 * move at half speed until the link's c has moved, at 4 + 2c, then the
 * update's rest at full speed: it ends at 3 + U + c). Apart, 3 + U. */
static void stage_collectives_share_nics(void **state)
{
    (void)state;
    for (int trial = 0; trial < 10; trial++) {
        double c = 1 + trial, U = 2 * c + 3 + trial % 3;
        double f[2] = {1, 1}, b[2] = {1, 1}, u[2] = {0, U};
        ps_stage_link links[3] = {
            {.from = 0, .to = 1, .kind = PS_LINK_FORWARD},
            {.from = 1, .to = 0, .kind = PS_LINK_BACKWARD},
            {.from = 1, .to = 0, .kind = PS_LINK_ACCUMULATED, .seconds = c, .nic_s = c,
             .nic_node = {1, 0}, .nic_nodes = {2, 1}},
        };
        ps_stage_nics nics[2] = {{.node = 0, .nodes = 1},
                                 {.node = 1, .nodes = 2, .update_nic_s = U}};
        double got = ps_pipeline_iteration_s(2, f, b, u, links, 3, nics, 1, false);
        if (fabs(got - (3 + U + c)) > 1e-12)
            fail_msg("c %g, U %g: %.17g, want %.17g", c, U, got, 3 + U + c);
        assert_true(fabs(ps_pipeline_iteration_s(2, f, b, u, links, 3, NULL, 1, false) -
                         (3 + U)) < 1e-12);
        /* the update on a node of its own: the link waits for nothing */
        nics[1].node = 3;
        nics[1].nodes = 2;
        assert_true(fabs(ps_pipeline_iteration_s(2, f, b, u, links, 3, nics, 1, false) -
                         (3 + U)) < 1e-12);
        /* a stage within one node has no collectives across nodes */
        nics[1].node = 1;
        nics[1].nodes = 1;
        assert_true(fabs(ps_pipeline_iteration_s(2, f, b, u, links, 3, nics, 1, false) -
                         (3 + U)) < 1e-12);
    }
}

/* The NICs shared among flows, not links (the simulator's max-min
 * fairness), by hand: the update of stage 1 (rings: w_u) and the link to
 * stage 0 (transfers at once: w_l) share the NICs of nodes 1-2, the link
 * moving at w_l / (w_u + w_l) of its speed: it ends at 4 + c (w_u + w_l) /
 * w_l, and stage 0's update of V after it. */
static void nics_shared_by_flows(void **state)
{
    (void)state;
    for (int w_u = 1; w_u <= 8; w_u *= 2)
        for (int w_l = 1; w_l <= 8; w_l *= 2) {
            double c = 2, U = 30, V = 100;
            double f[2] = {1, 1}, b[2] = {1, 1}, u[2] = {V, U};
            ps_stage_link links[3] = {
                {.from = 0, .to = 1, .kind = PS_LINK_FORWARD},
                {.from = 1, .to = 0, .kind = PS_LINK_BACKWARD},
                {.from = 1, .to = 0, .kind = PS_LINK_ACCUMULATED, .seconds = c, .nic_s = c,
                 .nic_node = {1, 0}, .nic_nodes = {2, 1}, .nic_flows = w_l},
            };
            ps_stage_nics nics[2] = {{.node = 0, .nodes = 1},
                                     {.node = 1, .nodes = 2, .update_nic_s = U, .nic_flows = w_u}};
            double got = ps_pipeline_iteration_s(2, f, b, u, links, 3, nics, 1, false);
            double want = 4 + c * (w_u + w_l) / w_l + V;
            if (fabs(got - want) > 1e-12 * want)
                fail_msg("w_u %d, w_l %d: %.17g, want %.17g", w_u, w_l, got, want);
        }
    /* a flow slower than its share alone leaves the rest to the others:
     * stage 0 sends to stages 1 and 2 through its NIC at once, link A
     * using a quarter of it, link B all; A moves at full speed, B at 3/4
     * until A has moved (cA), then at full: stage 2 receives until f + cB
     * + cA / 4, and the step ends 2f + 2b after that */
    for (int trial = 0; trial < 10; trial++) {
        double fk = 1 + trial % 3, bk = 1 + trial % 2, cA = 2 + trial, cB = 3 * cA;
        double f[3] = {fk, fk, fk}, b[3] = {bk, bk, bk}, u[3] = {0, 0, 0};
        ps_stage_link links[4] = {
            {.from = 0, .to = 1, .kind = PS_LINK_FORWARD, .seconds = cA, .nic_s = cA / 4,
             .nic_node = {0, 1}, .nic_nodes = {1, 1}},
            {.from = 0, .to = 2, .kind = PS_LINK_FORWARD, .seconds = cB, .nic_s = cB,
             .nic_node = {0, 2}, .nic_nodes = {1, 1}},
            {.from = 1, .to = 0, .kind = PS_LINK_BACKWARD},
            {.from = 2, .to = 0, .kind = PS_LINK_BACKWARD},
        };
        double got = ps_pipeline_iteration_s(3, f, b, u, links, 4, NULL, 1, false);
        double want = 2 * fk + 2 * bk + cB + cA / 4;
        if (fabs(got - want) > 1e-12 * want)
            fail_msg("trial %d: %.17g, want %.17g", trial, got, want);
    }
}

/* Random pipelines whose links cross random NICs of three nodes: never
 * faster than with the NICs unshared (each time is a max and sum of earlier
 * ones, and waiting for a NIC only delays), and never faster than the
 * busiest NIC's transfers one after the other. */
static void shared_nics_bound_the_step(void **state)
{
    (void)state;
    test_rng_seed(11);
    for (int trial = 0; trial < 300; trial++) {
        int n = 2 + (int)(uniform() * 6), m = 1 + (int)(uniform() * 24);
        bool gpipe = uniform() < 0.3;
        double f[8], b[8], u[8], load[3][2] = {{0}};
        ps_stage_link links[32], alone[32];
        int n_links = 0;
        random_stage_times(n, f, b, u);
        for (int k = 0; k + 1 < n; k++) {
            links[n_links++] = (ps_stage_link){.from = k, .to = k + 1, .kind = PS_LINK_FORWARD,
                                               .seconds = 2 * uniform()};
            links[n_links++] = (ps_stage_link){.from = k + 1, .to = k, .kind = PS_LINK_BACKWARD,
                                               .seconds = 2 * uniform()};
        }
        if (uniform() < 0.5)
            links[n_links++] = (ps_stage_link){.from = n - 1, .to = 0,
                                               .kind = PS_LINK_ACCUMULATED,
                                               .seconds = uniform()};
        for (int l = 0; l < n_links; l++) {
            alone[l] = links[l];
            if (uniform() < 0.3)
                continue;
            ps_stage_link *x = &links[l];
            for (int side = 0; side < 2; side++) {
                x->nic_node[side] = (int)(uniform() * 3);
                x->nic_nodes[side] = 1 + (int)(uniform() * (3 - x->nic_node[side]));
            }
            x->nic_s = x->seconds * (0.5 + 0.5 * uniform());
            int times = x->kind == PS_LINK_ACCUMULATED ? 1 : m;
            for (int side = 0; side < 2; side++)
                for (int k = x->nic_node[side]; k < x->nic_node[side] + x->nic_nodes[side]; k++)
                    load[k][side] += times * x->nic_s;
        }
        /* half the time, stages across nodes whose reductions and updates
         * hold their NICs, both ways */
        ps_stage_nics nics[8];
        bool collectives = uniform() < 0.5;
        for (int k = 0; k < n && collectives; k++) {
            nics[k].node = (int)(uniform() * 3);
            nics[k].nodes = 1 + (int)(uniform() * (3 - nics[k].node));
            nics[k].update_nic_s = u[k] * uniform();
            double held = nics[k].nodes > 1 ? nics[k].update_nic_s : 0;
            for (int l = 0; l < n_links; l++)
                if (links[l].from == k && uniform() < 0.5) {
                    links[l].reduce_s = alone[l].reduce_s = uniform();
                    links[l].reduce_nic_s = links[l].reduce_s * uniform();
                    int times = links[l].kind <= PS_LINK_BACKWARD ? m : 1;
                    held += nics[k].nodes > 1 ? times * links[l].reduce_nic_s : 0;
                }
            for (int side = 0; side < 2; side++)
                for (int j = nics[k].node; j < nics[k].node + nics[k].nodes; j++)
                    load[j][side] += held;
        }
        double got = ps_pipeline_iteration_s(n, f, b, u, links, n_links,
                                             collectives ? nics : NULL, m, gpipe);
        double unshared = ps_pipeline_iteration_s(n, f, b, u, alone, n_links, NULL, m, gpipe);
        assert_false(isnan(got));
        if (got < unshared * (1 - 1e-12))
            fail_msg("trial %d: %.17g with shared NICs, %.17g without", trial, got, unshared);
        for (int k = 0; k < 3; k++)
            for (int side = 0; side < 2; side++)
                if (got < load[k][side] * (1 - 1e-12))
                    fail_msg("trial %d: %.17g, but NIC %d/%d carries %.17g", trial, got, k, side,
                             load[k][side]);
    }
}

/* Links whose forwards wait for each other have no schedule. */
static void cyclic_links_are_nan(void **state)
{
    (void)state;
    double f[2] = {1, 1}, b[2] = {1, 1}, u[2] = {0, 0};
    ps_stage_link links[2] = {
        {.from = 0, .to = 1, .kind = PS_LINK_FORWARD},
        {.from = 1, .to = 0, .kind = PS_LINK_FORWARD},
    };
    assert_true(isnan(ps_pipeline_iteration_s(2, f, b, u, links, 2, NULL, 4, false)));
    ps_stage_link upd[2] = {
        {.from = 0, .to = 1, .kind = PS_LINK_UPDATE},
        {.from = 1, .to = 0, .kind = PS_LINK_UPDATE},
    };
    assert_true(isnan(ps_pipeline_iteration_s(2, f, b, u, upd, 2, NULL, 4, false)));
    assert_true(isnan(ps_pipeline_iteration_s(0, f, b, u, NULL, 0, NULL, 4, false)));
    /* no timeline either */
    ps_pipeline_span *sp = (ps_pipeline_span *)links;
    int n_sp = -1;
    assert_true(isnan(ps_pipeline_schedule(2, f, b, u, links, 2, NULL, 4, false, &sp, &n_sp)));
    assert_null(sp);
    assert_int_equal(n_sp, 0);
}

/* ---- links against the lowered programs ---- */

/* Shared cores, closed forms. Two stages of 4 devices on one node of 2
 * cores (share 4), no links, computing all their time: both at the charged
 * speed while both compute, the one left alone at twice it. Half a kernel
 * computing: that half shared, the rest at its time. Stages on nodes of
 * their own do not slow each other. Malformed cores: NAN. */
static void shared_cores_closed_forms(void **state)
{
    (void)state;
    const ps_stage_cores whole = {
        .node = 0, .nodes = 1, .devices_per_node = 4, .compute = {1, 1, 1}};
    ps_stage_cores two[2] = {whole, whole};
    ps_shared_cores cores = {.cores = 2, .share = 4, .stages = two};
    double f[2] = {1, 3}, b[2] = {0, 0}, u[2] = {0, 0};
    assert_close(ps_pipeline_iteration_s(2, f, b, u, NULL, 0, NULL, 1, false), 3, 1e-15);
    ps_pipeline_span *sp = NULL;
    int n_sp = 0;
    /* stage 1: 1 s with stage 0, then its last 2 charged seconds in 1 */
    assert_close(
        ps_pipeline_schedule_shared(2, f, b, u, NULL, 0, NULL, &cores, 1, false, &sp, &n_sp), 2,
        1e-12);
    double *saved = ps_pipeline_compute_saved_s(2, sp, n_sp);
    assert_non_null(saved);
    assert_close(saved[0 * PS_PHASE_COUNT + PS_PHASE_FORWARD], 0, 1e-12);
    assert_close(saved[1 * PS_PHASE_COUNT + PS_PHASE_FORWARD], 1, 1e-12);
    assert_true(saved[PS_PHASE_BACKWARD] == 0); /* nothing charged: 0 */
    free(saved);
    double *wall = ps_pipeline_compute_wall_s(2, sp, n_sp);
    assert_non_null(wall);
    assert_close(wall[0 * PS_PHASE_COUNT + PS_PHASE_FORWARD], 1, 1e-12);
    assert_close(wall[1 * PS_PHASE_COUNT + PS_PHASE_FORWARD], 2, 1e-12);
    assert_true(wall[PS_PHASE_BACKWARD] == -1); /* nothing charged: none */
    free(wall);
    free(sp);
    /* on two nodes: each alone on its cores, at 4 x 2/4 = 2 */
    two[1].node = 1;
    assert_close(
        ps_pipeline_schedule_shared(2, f, b, u, NULL, 0, NULL, &cores, 1, false, NULL, NULL), 1.5,
        1e-12);
    /* half of a 2 s forward computes: 1 charged second at 2x, then 1 s */
    ps_stage_cores half = {.node = 0, .nodes = 1, .devices_per_node = 2, .compute = {0.5, 1, 1}};
    ps_shared_cores one = {.cores = 4, .share = 2, .stages = &half};
    double f1 = 2, b1 = 1, u1 = 0.5;
    assert_close(
        ps_pipeline_schedule_shared(1, &f1, &b1, &u1, NULL, 0, NULL, &one, 1, false, &sp, &n_sp),
        1.5 + 0.5 + 0.25, 1e-12);
    saved = ps_pipeline_compute_saved_s(1, sp, n_sp);
    assert_non_null(saved);
    assert_close(saved[PS_PHASE_FORWARD], 0.5, 1e-12);  /* of 1 charged second */
    assert_close(saved[PS_PHASE_BACKWARD], 0.5, 1e-12); /* of 1 */
    assert_close(saved[PS_PHASE_UPDATE], 0.25, 1e-12);  /* of 0.5 */
    free(saved);
    wall = ps_pipeline_compute_wall_s(1, sp, n_sp);
    assert_non_null(wall);
    assert_close(wall[PS_PHASE_FORWARD], 0.5, 1e-12);
    assert_close(wall[PS_PHASE_BACKWARD], 0.5, 1e-12);
    assert_close(wall[PS_PHASE_UPDATE], 0.25, 1e-12);
    free(wall);
    for (int i = 0; i < n_sp; i++)
        if (sp[i].kind == PS_SPAN_FORWARD) {
            assert_close(sp[i].charged_compute_s, 1, 1e-12);
            assert_close(sp[i].compute_s, 0.5, 1e-12);
            assert_close(sp[i].end_s - sp[i].start_s, 1.5, 1e-12);
        }
    free(sp);
    /* malformed: no cores, no share, no stages, no devices, a node below 0 */
    ps_shared_cores bad = one;
    bad.cores = 0;
    assert_true(isnan(
        ps_pipeline_schedule_shared(1, &f1, &b1, &u1, NULL, 0, NULL, &bad, 1, false, NULL, NULL)));
    bad = one;
    bad.share = 0;
    assert_true(isnan(
        ps_pipeline_schedule_shared(1, &f1, &b1, &u1, NULL, 0, NULL, &bad, 1, false, NULL, NULL)));
    bad = one;
    bad.stages = NULL;
    assert_true(isnan(
        ps_pipeline_schedule_shared(1, &f1, &b1, &u1, NULL, 0, NULL, &bad, 1, false, NULL, NULL)));
    ps_stage_cores none = half;
    none.devices_per_node = 0;
    bad = one;
    bad.stages = &none;
    assert_true(isnan(
        ps_pipeline_schedule_shared(1, &f1, &b1, &u1, NULL, 0, NULL, &bad, 1, false, NULL, NULL)));
    none = half;
    none.node = -1;
    assert_true(isnan(
        ps_pipeline_schedule_shared(1, &f1, &b1, &u1, NULL, 0, NULL, &bad, 1, false, NULL, NULL)));
}

/* Lockstep delays, closed forms. Two stages of 2 devices on one node of 2
 * cores (share 2), one micro-batch, no links: stage 0's 2 s forward meets
 * once, halfway through its compute (0.5 of its 1 alone-second), while
 * stage 1 computes its 10 s forward beside it. Both run at the charged
 * speed until the meeting at 1 s; stage 0 then waits slice x min(1, 2 / 2)
 * x (1 - (1 - min(1, 0.5 / slice))^2) = 0.1 s (slice 0.1), in which stage 1
 * computes alone at twice the speed (0.2 charged seconds), and ends at 2.1
 * s, its compute 2 s of it; stage 1 has 10 - 1 - 0.2 - 1 = 7.8 charged
 * seconds left at 2.1 s, done at twice the speed by 6 s. Stage 0's phase
 * ran 0.1 s longer than charged (the saving -0.1). A meeting at 0.02
 * alone-seconds: 0.1 x (1 - 0.8^2) = 0.036 s. Stage 1 done first (a
 * forward of 0.5 s): no one beside the meeting, no delay. No slice: none.
 * Malformed meetings: NAN. */
static void lockstep_closed_forms(void **state)
{
    (void)state;
    ps_meeting half = {.before_s = 0.5, .members = 2};
    ps_stage_cores st[2] = {{.node = 0, .nodes = 1, .devices_per_node = 2, .compute = {1, 1, 1}},
                            {.node = 0, .nodes = 1, .devices_per_node = 2, .compute = {1, 1, 1}}};
    st[0].meetings[PS_PHASE_FORWARD] = &half;
    st[0].n_meetings[PS_PHASE_FORWARD] = 1;
    st[0].tail_s[PS_PHASE_FORWARD] = 0.5;
    st[1].tail_s[PS_PHASE_FORWARD] = 5;
    ps_shared_cores cores = {.cores = 2, .share = 2, .slice_s = 0.1, .stages = st};
    double f[2] = {2, 10}, b[2] = {0, 0}, u[2] = {0, 0};
    ps_pipeline_span *sp = NULL;
    int n_sp = 0;
    assert_close(
        ps_pipeline_schedule_shared(2, f, b, u, NULL, 0, NULL, &cores, 1, false, &sp, &n_sp), 6,
        1e-12);
    int forwards = 0;
    for (int i = 0; i < n_sp; i++)
        if (sp[i].kind == PS_SPAN_FORWARD && sp[i].stage == 0) {
            forwards++;
            assert_close(sp[i].end_s - sp[i].start_s, 2.1, 1e-12);
            assert_close(sp[i].compute_s, 2, 1e-12);
            assert_close(sp[i].lockstep_s, 0.1, 1e-12);
        } else {
            assert_true(sp[i].lockstep_s == 0);
        }
    assert_int_equal(forwards, 1);
    double *saved = ps_pipeline_compute_saved_s(2, sp, n_sp);
    assert_non_null(saved);
    assert_close(saved[PS_PHASE_FORWARD], -0.1, 1e-12);
    assert_close(saved[PS_PHASE_COUNT + PS_PHASE_FORWARD], 4, 1e-12);
    free(saved);
    free(sp);
    /* a short span since the last meeting: part of the slice's chance */
    half.before_s = 0.02;
    st[0].tail_s[PS_PHASE_FORWARD] = 0.98;
    /* (the node's cores stay busy throughout: the step's end stays at 6 s) */
    assert_close(
        ps_pipeline_schedule_shared(2, f, b, u, NULL, 0, NULL, &cores, 1, false, &sp, &n_sp), 6,
        1e-12);
    forwards = 0;
    for (int i = 0; i < n_sp; i++)
        if (sp[i].kind == PS_SPAN_FORWARD && sp[i].stage == 0) {
            forwards++;
            assert_close(sp[i].lockstep_s, 0.036, 1e-12);
            assert_close(sp[i].end_s - sp[i].start_s, 2.036, 1e-12);
        }
    assert_int_equal(forwards, 1);
    free(sp);
    double f_short[2] = {2, 0.5};
    half.before_s = 0.5;
    st[0].tail_s[PS_PHASE_FORWARD] = 0.5;
    /* stage 1 ends at 0.5 s; stage 0 has computed 0.5 charged seconds and
     * computes the rest alone at twice the speed: its meeting at 1 charged
     * second, at 0.75 s, finds no one else: 0.5 + 1.5 / 2 = 1.25 s */
    assert_close(
        ps_pipeline_schedule_shared(2, f_short, b, u, NULL, 0, NULL, &cores, 1, false, NULL, NULL),
        1.25, 1e-12);
    /* no slice: no delay (stage 0 done at 2 s, stage 1 alone from then: 2 + 8 / 2) */
    cores.slice_s = 0;
    assert_close(
        ps_pipeline_schedule_shared(2, f, b, u, NULL, 0, NULL, &cores, 1, false, &sp, &n_sp), 6,
        1e-12);
    for (int i = 0; i < n_sp; i++) {
        assert_true(sp[i].lockstep_s == 0);
        if (sp[i].kind == PS_SPAN_FORWARD && sp[i].stage == 0)
            assert_close(sp[i].end_s - sp[i].start_s, 2, 1e-12);
    }
    free(sp);
    /* malformed meetings: NAN */
    cores.slice_s = 0.1;
    st[0].meetings[PS_PHASE_FORWARD] = NULL;
    assert_true(isnan(
        ps_pipeline_schedule_shared(2, f, b, u, NULL, 0, NULL, &cores, 1, false, NULL, NULL)));
    st[0].meetings[PS_PHASE_FORWARD] = &half;
    half.before_s = -1;
    assert_true(isnan(
        ps_pipeline_schedule_shared(2, f, b, u, NULL, 0, NULL, &cores, 1, false, NULL, NULL)));
    half.before_s = 0.5;
    cores.slice_s = NAN;
    assert_true(isnan(
        ps_pipeline_schedule_shared(2, f, b, u, NULL, 0, NULL, &cores, 1, false, NULL, NULL)));
}

/* Random pipelines with meetings on shared cores and a scheduler slice
 * (as shared_cores_bound_the_schedule's, steps of up to hours and up to
 * 32 micro-batches, so that the clock's rounding is coarse): the schedule
 * ends (until 2026-12-07 a meeting decided by the compute left, not by
 * time, could stall the clock); a kernel's lockstep is at most a slice per
 * meeting, a receive's at most one, nothing else has any; a kernel computes
 * between 1/share and all of its charge, its pauses aside, and its span
 * holds its compute and its delays. With cores for every device and the
 * most members of a meeting, there is no delay: the schedule without a
 * slice. */
static void lockstep_random_schedules(void **state)
{
    (void)state;
    test_rng_seed(23);
    int delayed = 0;
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(uniform() * 5), m = 1 + (int)(uniform() * 32);
        bool gpipe = uniform() < 0.3;
        double f[8], b[8], u[8], scale = pow(10, 4 * uniform());
        random_stage_times(n, f, b, u);
        for (int k = 0; k < n; k++)
            f[k] *= scale, b[k] *= scale, u[k] *= scale;
        ps_stage_link links[16];
        int n_links = 0;
        for (int k = 0; k + 1 < n; k++) {
            links[n_links++] = (ps_stage_link){.from = k,
                                               .to = k + 1,
                                               .kind = PS_LINK_FORWARD,
                                               .seconds = 0.01 * scale * uniform()};
            links[n_links++] = (ps_stage_link){.from = k + 1,
                                               .to = k,
                                               .kind = PS_LINK_BACKWARD,
                                               .seconds = uniform() < 0.2 ? 0 : 0.01 * scale};
        }
        ps_stage_cores st[8];
        ps_meeting meet[8][PS_PHASE_COUNT][4];
        int nodes = 1 + (int)(uniform() * 2), on_node[4] = {0};
        double slice = 1e-3 * scale * (0.1 + uniform());
        for (int k = 0; k < n; k++) {
            memset(&st[k], 0, sizeof st[k]);
            st[k].node = (int)(uniform() * nodes);
            st[k].nodes = 1 + (int)(uniform() * (nodes - st[k].node));
            st[k].devices_per_node = 1 + (int)(uniform() * 4);
            for (int ph = 0; ph < PS_PHASE_COUNT; ph++) {
                st[k].compute[ph] = uniform() < 0.3 ? 1 : uniform();
                st[k].n_meetings[ph] = (int)(uniform() * 5);
                for (int i = 0; i < st[k].n_meetings[ph]; i++)
                    meet[k][ph][i] =
                        (ps_meeting){.before_s = uniform() < 0.2 ? 0 : 3 * slice * uniform(),
                                     .members = 1 + (int)(uniform() * 4)};
                st[k].meetings[ph] = meet[k][ph];
                st[k].tail_s[ph] = uniform() < 0.2 ? 0 : 3 * slice * uniform();
            }
            for (int j = 0; j < st[k].nodes; j++)
                on_node[st[k].node + j] += st[k].devices_per_node;
        }
        int busiest = 0;
        for (int j = 0; j < nodes; j++)
            busiest = on_node[j] > busiest ? on_node[j] : busiest;
        double c = 1 + (int)(uniform() * busiest);
        ps_shared_cores cores = {
            .cores = c, .share = fmax(1, busiest / c), .slice_s = slice, .stages = st};
        ps_pipeline_span *sp = NULL;
        int n_sp = 0;
        double got = ps_pipeline_schedule_shared(n, f, b, u, links, n_links, NULL, &cores, m, gpipe,
                                                 &sp, &n_sp);
        if (!isfinite(got))
            fail_msg("trial %d: %d stages, %d micro-batches, scale %g: %g", trial, n, m, scale,
                     got);
        double eps = 1e-9 * got;
        for (int i = 0; i < n_sp; i++) {
            const ps_pipeline_span *x = &sp[i];
            int ph = x->kind == PS_SPAN_FORWARD    ? PS_PHASE_FORWARD
                     : x->kind == PS_SPAN_BACKWARD ? PS_PHASE_BACKWARD
                     : x->kind == PS_SPAN_UPDATE   ? PS_PHASE_UPDATE
                                                   : -1;
            double most = ph >= 0                      ? slice * st[x->stage].n_meetings[ph]
                          : x->kind == PS_SPAN_RECEIVE ? slice
                                                       : 0;
            delayed += x->lockstep_s > 0;
            if (!(x->lockstep_s >= 0 && x->lockstep_s <= most + eps))
                fail_msg("trial %d: stage %d span kind %d: lockstep %.17g s, at most %.17g", trial,
                         x->stage, (int)x->kind, x->lockstep_s, most);
            if (x->charged_compute_s > 0 &&
                !(x->compute_s <= x->charged_compute_s + eps &&
                  x->compute_s >= x->charged_compute_s / cores.share - eps &&
                  x->end_s - x->start_s >= x->compute_s + x->lockstep_s - eps))
                fail_msg("trial %d: stage %d span kind %d: computed %.17g of %.17g charged, "
                         "lockstep %.17g, span %.17g",
                         trial, x->stage, (int)x->kind, x->compute_s, x->charged_compute_s,
                         x->lockstep_s, x->end_s - x->start_s);
        }
        free(sp);
        /* cores for every device of the busiest node and a meeting's most */
        cores.cores = busiest + 4;
        double free_cores = ps_pipeline_schedule_shared(n, f, b, u, links, n_links, NULL, &cores, m,
                                                        gpipe, NULL, NULL);
        cores.slice_s = 0;
        double no_slice = ps_pipeline_schedule_shared(n, f, b, u, links, n_links, NULL, &cores, m,
                                                      gpipe, NULL, NULL);
        assert_close(free_cores, no_slice, 1e-12);
    }
    assert_true(delayed >= 300); /* the delays happen */
    print_message("300 random pipelines with meetings: %d spans delayed\n", delayed);
}

/* Random pipelines (as schedule_is_the_longest_path's, links of fixed time)
 * with their stages placed at random on nodes of C cores and a share that
 * covers the busiest node (share x C >= its devices): every compute then
 * runs between its charged speed and share times it, so the step lies
 * between the all-busy schedule's time divided by the share and that time,
 * and each kernel's compute between 1/share and 1 of its charge (each
 * phase's saving per kernel at most 1 - 1/share of its computing part). Share 1 with cores for
 * every device: the all-busy schedule. */
static void shared_cores_bound_the_schedule(void **state)
{
    (void)state;
    test_rng_seed(11);
    int faster = 0;
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(uniform() * 5), m = 1 + (int)(uniform() * 6);
        bool gpipe = uniform() < 0.3;
        double f[8], b[8], u[8];
        ps_stage_link links[16];
        int n_links = 0;
        random_stage_times(n, f, b, u);
        for (int k = 0; k + 1 < n; k++) {
            links[n_links++] = (ps_stage_link){.from = k,
                                               .to = k + 1,
                                               .kind = PS_LINK_FORWARD,
                                               .reduce_s = 0.1 * uniform(),
                                               .seconds = 0.3 * uniform()};
            links[n_links++] = (ps_stage_link){
                .from = k + 1, .to = k, .kind = PS_LINK_BACKWARD, .seconds = 0.3 * uniform()};
        }
        if (n > 1 && uniform() < 0.5)
            links[n_links++] = (ps_stage_link){
                .from = n - 1, .to = 0, .kind = PS_LINK_ACCUMULATED, .seconds = uniform()};
        ps_stage_cores st[8];
        int nodes = 1 + (int)(uniform() * 3), on_node[4] = {0};
        for (int k = 0; k < n; k++) {
            st[k].node = (int)(uniform() * nodes);
            st[k].nodes = 1 + (int)(uniform() * (nodes - st[k].node));
            st[k].devices_per_node = 1 + (int)(uniform() * 4);
            for (int ph = 0; ph < PS_PHASE_COUNT; ph++)
                st[k].compute[ph] = uniform() < 0.2 ? 1 : uniform();
            for (int j = 0; j < st[k].nodes; j++)
                on_node[st[k].node + j] += st[k].devices_per_node;
        }
        int busiest = 0;
        for (int j = 0; j < nodes; j++)
            busiest = on_node[j] > busiest ? on_node[j] : busiest;
        double c = 1 + (int)(uniform() * busiest);
        ps_shared_cores cores = {.cores = c, .share = fmax(1, busiest / c), .stages = st};
        double all_busy = ps_pipeline_iteration_s(n, f, b, u, links, n_links, NULL, m, gpipe);
        ps_pipeline_span *sp = NULL;
        int n_sp = 0;
        double got = ps_pipeline_schedule_shared(n, f, b, u, links, n_links, NULL, &cores, m, gpipe,
                                                 &sp, &n_sp);
        double eps = 1e-12 * all_busy;
        if (!(got <= all_busy + eps && got >= all_busy / cores.share - eps))
            fail_msg("trial %d: %d stages on %d nodes of %g cores (share %g): %.17g s, all "
                     "busy %.17g s",
                     trial, n, nodes, c, cores.share, got, all_busy);
        faster += got < all_busy - eps;
        for (int i = 0; i < n_sp; i++) {
            const ps_pipeline_span *x = &sp[i];
            if (x->charged_compute_s > 0 &&
                !(x->compute_s <= x->charged_compute_s + eps &&
                  x->compute_s >= x->charged_compute_s / cores.share - eps))
                fail_msg("trial %d: stage %d, span kind %d mb %d: computed %.17g s of %.17g "
                         "charged (share %g), span %.17g-%.17g",
                         trial, x->stage, (int)x->kind, x->micro_batch, x->compute_s,
                         x->charged_compute_s, cores.share, x->start_s, x->end_s);
        }
        double *saved = ps_pipeline_compute_saved_s(n, sp, n_sp);
        assert_non_null(saved);
        for (int k = 0; k < n; k++) {
            const double charged[PS_PHASE_COUNT] = {f[k], b[k], u[k]};
            for (int ph = 0; ph < PS_PHASE_COUNT; ph++) {
                double x = saved[k * PS_PHASE_COUNT + ph],
                       most = charged[ph] * st[k].compute[ph] * (1 - 1 / cores.share);
                if (!(x >= -eps && x <= most + eps))
                    fail_msg("trial %d: stage %d phase %d saved %.17g s of %.17g charged "
                             "(at most %.17g)",
                             trial, k, ph, x, charged[ph], most);
            }
        }
        free(saved);
        free(sp);
        /* as many cores as devices, charged alone: the all-busy schedule */
        ps_shared_cores plenty = {.cores = busiest, .share = 1, .stages = st};
        double same = ps_pipeline_schedule_shared(n, f, b, u, links, n_links, NULL, &plenty, m,
                                                  gpipe, NULL, NULL);
        assert_close(same, all_busy, 1e-12 * all_busy);
    }
    assert_true(faster >= 100); /* sharing mostly shortens the step */
    print_message("300 random pipelines on shared cores: %d shorter than all busy\n", faster);
}

static ps_plan *uniform_plan(const char *model, const char *cluster, int dp, int op, int pp)
{
    ps_model_config cfg;
    assert_int_equal(ps_zoo_lookup(model, &cfg, NULL), PS_OK);
    if (cfg.family == PS_MODEL_GPT) {
        cfg.layers = 4;
        cfg.hidden = 512;
        cfg.ffn = 2048;
        cfg.heads = 8;
        cfg.seq = 256;
        cfg.vocab = 2048;
    } else {
        cfg.hidden = 1024;
    }
    long long global = 64;
    int micro = 4;
    ps_cluster *c = NULL;
    assert_int_equal(ps_cluster_from_preset(cluster, &c, NULL), PS_OK);
    ps_plan *p = uniform_plan_of(&cfg, c, global, micro, dp, op, pp);
    ps_cluster_free(c);
    return p;
}

/* Stages of 8, 2, 4 and 8 devices on three nodes of 8 V100s, placed whole
 * nodes first: nodes 0 and 1 hold the 8-device stages, node 2 the 2- and
 * 4-device ones, whose activations (gradients) arrive from 8 senders on 2
 * (4) receivers. */
static ps_plan *unequal_plan(void)
{
    ps_model_config cfg;
    assert_int_equal(ps_zoo_lookup("gpt-350m", &cfg, NULL), PS_OK);
    cfg.layers = 4;
    cfg.hidden = 512;
    cfg.ffn = 2048;
    cfg.heads = 8;
    cfg.seq = 256;
    cfg.vocab = 2048;
    cfg.batch = 16;
    ps_cluster *c = NULL;
    assert_int_equal(ps_cluster_from_preset("p3.16xlarge:3", &c, NULL), PS_OK);
    ps_graph *fwd = NULL;
    assert_int_equal(ps_model_build(&cfg, &fwd, NULL), PS_OK);
    ps_plan_request req = {.forward = fwd, .config = &cfg, .train = ps_train_options_default(),
                           .cluster = c, .global_batch = 64, .micro_batches = 4,
                           .ilp = ps_ilp_options_default(), .method = PS_METHOD_SHARD};
    ps_inter_options o = ps_inter_options_default();
    o.layer_num = 4;
    const ps_manual_stage stages[] = {{0, 0, {1, 8}, {1, 8}, false, false, false},
                                      {1, 1, {1, 2}, {1, 2}, false, false, false},
                                      {2, 2, {1, 4}, {1, 4}, false, false, false},
                                      {3, 3, {1, 8}, {1, 8}, false, false, false}};
    ps_plan *p = NULL;
    ps_error err = {0};
    if (ps_plan_manual(&req, &o, stages, 4, &p, &err) != PS_OK)
        fail_msg("unequal stages: %s", err.msg);
    assert_int_equal(p->stages[1].devices[0] / 8, 2);
    assert_int_equal(p->stages[3].devices[0] / 8, 1);
    ps_graph_free(fwd);
    ps_cluster_free(c);
    return p;
}

/* A plan on devices that share cores (8 devices of one node on 2 cores,
 * dp 2 x pp 4, 1F1B): its schedule shares them, within the all-busy
 * schedule of the same stage times (the cluster told of no sharing) and
 * that divided by the share (4); the pipeline's fill and drain leave
 * stages alone, so it is shorter. Each phase saves at most 3/4 of its
 * charged time, and the first stage's forward, which runs alone at first,
 * saves some. */
static void plan_schedule_shares_cores(void **state)
{
    (void)state;
    ps_model_config cfg;
    assert_int_equal(ps_zoo_lookup("gpt-350m", &cfg, NULL), PS_OK);
    cfg.layers = 4;
    cfg.hidden = 256;
    cfg.ffn = 1024;
    cfg.heads = 4;
    cfg.seq = 128;
    cfg.vocab = 1024;
    ps_cluster *c = NULL;
    assert_int_equal(ps_cluster_from_preset("p3.16xlarge:1", &c, NULL), PS_OK);
    c->shared_cores_per_node = 2;
    ps_plan *p = uniform_plan_of(&cfg, c, 32, 4, 2, 1, 4);
    ps_cluster_free(c);
    assert_int_equal(p->n_stages, 4);
    ps_plan_model *m = NULL;
    ps_error err = {0};
    assert_int_equal(ps_plan_model_build(p, &m, &err), PS_OK);
    ps_pipeline_span *sp = NULL;
    int n_sp = 0;
    double shared = NAN, all_busy = NAN;
    assert_int_equal(ps_plan_pipeline_schedule(p, m->step, &sp, &n_sp, NULL, NULL, &shared, &err),
                     PS_OK);
    p->cluster->shared_cores_per_node = 0;
    assert_int_equal(ps_plan_pipeline_schedule(p, m->step, NULL, NULL, NULL, NULL, &all_busy, &err),
                     PS_OK);
    p->cluster->shared_cores_per_node = 2;
    print_message("dp 2 x pp 4 on 8 devices sharing 2 cores: %.4g ms, all busy %.4g ms\n",
                  shared * 1e3, all_busy * 1e3);
    assert_true(shared < all_busy * (1 - 1e-6) && shared >= all_busy / 4 * (1 - 1e-12));
    double *saved = ps_pipeline_compute_saved_s(p->n_stages, sp, n_sp);
    assert_non_null(saved);
    for (int k = 0; k < p->n_stages; k++) {
        const ps_plan_stage *s = &p->stages[k];
        const double charged[PS_PHASE_COUNT] = {s->forward_s, s->backward_s, s->update_s};
        for (int ph = 0; ph < PS_PHASE_COUNT; ph++) {
            double x = saved[k * PS_PHASE_COUNT + ph];
            assert_true(x >= -1e-12 && x <= 0.75 * charged[ph] * (1 + 1e-9));
        }
    }
    assert_true(saved[PS_PHASE_FORWARD] > 1e-6 * p->stages[0].forward_s);
    free(saved);
    free(sp);
    ps_plan_model_free(m);
    ps_plan_free(p);
}

/* Every micro-batch link carries whole tensors once (local all-gather
 * splits each part among the receivers that share it): the bytes the
 * programs send from one stage to another for micro-batch 0 are the links'
 * bytes, and their predicted seconds never exceed the link's time. A link
 * holds the NICs its sends cross for what the busiest of them carries; a
 * stage's update holds its nodes' NICs for its update kernel's rings across
 * them. */
static void links_match_the_programs(void **state)
{
    (void)state;
    const struct {
        const char *model, *cluster;
        int dp, op, pp;
    } cases[] = {
        {"gpt-350m", "dgx-a100:1", 2, 2, 2}, {"gpt-350m", "dgx-a100:1", 1, 2, 4},
        {"gpt-350m", "p3.16xlarge:2", 1, 8, 2}, {"mlp", "p3.16xlarge:2", 2, 4, 2},
        {"mlp", "dgx-a100:1", 2, 1, 4}, {"gpt-350m", "p3.16xlarge:4", 2, 4, 4},
        {"gpt-350m", "p3.16xlarge:4", 1, 16, 2}, {"gpt-350m", "p3.16xlarge:4", 2, 8, 2},
    };
    int crossed = 0;         /* links through NICs */
    int updates_across = 0;  /* stages whose updates cross nodes */
    int several_flows = 0;   /* links of more than one transfer through a NIC at once */
    int fewer_receivers = 0; /* links across nodes from more devices than they reach */
    size_t n_cases = sizeof cases / sizeof *cases;
    for (size_t i = 0; i <= n_cases; i++) {
        char what[96];
        ps_plan *p = NULL;
        if (i < n_cases) {
            p = uniform_plan(cases[i].model, cases[i].cluster, cases[i].dp, cases[i].op,
                             cases[i].pp);
            snprintf(what, sizeof what, "%s %s %dx%dx%d", cases[i].model, cases[i].cluster,
                     cases[i].dp, cases[i].op, cases[i].pp);
        } else {
            p = unequal_plan();
            snprintf(what, sizeof what, "gpt p3.16xlarge:3, stages of 8, 2, 4 and 8 devices");
        }
        ps_plan_model *m = NULL;
        ps_error err = {0};
        assert_int_equal(ps_plan_model_build(p, &m, &err), PS_OK);
        ps_lower_options lo = ps_lower_options_default();
        ps_program_set *set = NULL;
        if (ps_plan_lower(p, m, &lo, &set, &err) != PS_OK)
            fail_msg("lower: %s", err.msg);
        ps_stage_link *links = NULL;
        int n_links = 0;
        ps_stage_nics nics[16];
        assert_true(p->n_stages <= 16);
        assert_int_equal(ps_plan_stage_links(p, m->step, true, &links, &n_links, nics, &err),
                         PS_OK);
        int n = p->n_stages;
        /* a stage's update kernel runs the collectives its update_nic_s
         * counts: their rings across nodes add up to it */
        for (int k = 0; k < n; k++) {
            const ps_plan_stage *s = &p->stages[k];
            const ps_program_stage *ps = &set->stages[k];
            ps_logical_mesh *mesh = NULL;
            assert_int_equal(ps_mesh_create(p->cluster, s->devices[0], s->submesh[0],
                                            s->submesh[1], s->logical_mesh[0],
                                            s->logical_mesh[1], &mesh, &err),
                             PS_OK);
            double across = 0, all = 0;
            if (ps->kernel[PS_PHASE_UPDATE] >= 0) {
                const ps_kernel *kn = &set->kernels[ps->kernel[PS_PHASE_UPDATE]];
                for (int j = 0; j < kn->n_instrs; j++) {
                    const ps_instr *in = &kn->instrs[j];
                    if (in->kind != PS_INSTR_COLLECTIVE || (in->flags & PS_INSTR_FINITE_VOTE))
                        continue;
                    unsigned axes = in->axis == 2 ? 3u : 1u << in->axis;
                    across += ps_collective_nic_s(mesh, (ps_collective)in->coll, axes, in->bytes);
                    all += in->seconds;
                }
            }
            if (fabs(across - nics[k].update_nic_s) > 1e-9 * across ||
                all > s->update_s * (1 + 1e-12))
                fail_msg("%s stage %d: update %.9g s, its kernel's collectives "
                         "%.9g s, %.9g s of them across nodes; update_nic_s %.9g s",
                         what, k, s->update_s, all, across, nics[k].update_nic_s);
            updates_across += across > 0;
            ps_mesh_free(mesh);
        }
        double *sent = calloc((size_t)n * n, sizeof *sent), *linked = calloc((size_t)n * n,
                                                                             sizeof *linked);
        int *stage = malloc((size_t)set->n_devices * sizeof *stage);
        for (int d = 0; d < set->n_devices; d++)
            stage[d] = set->programs[d].stage;
        /* nic[((a * n + b) * nodes + node) * 2 + side]: what stage a sends b
         * through a node's NIC, side 0 out, 1 in */
        int nodes = p->cluster->nodes, dpn = p->cluster->devices_per_node;
        double *nic = calloc((size_t)n * n * nodes * 2, sizeof *nic);
        /* and the receivers of the transfers through it (a receiver takes
         * its transfers in turn, a sender posts all of its sends at once):
         * [((ab * nodes + node) * 2 + side) * devices + receiver] */
        unsigned char *through = calloc((size_t)n * n * nodes * 2 * set->n_devices, 1);
        for (int d = 0; d < set->n_devices; d++)
            for (int j = 0; j < set->programs[d].n_instrs; j++) {
                const ps_instr *in = &set->programs[d].instrs[j];
                if (in->kind != PS_INSTR_SEND || in->mb != 0)
                    continue;
                int ab = stage[d] * n + stage[in->peer];
                sent[ab] += in->bytes;
                if (d / dpn != in->peer / dpn) {
                    nic[(ab * nodes + d / dpn) * 2] += in->bytes;
                    nic[(ab * nodes + in->peer / dpn) * 2 + 1] += in->bytes;
                    size_t out_at = (size_t)(ab * nodes + d / dpn) * 2;
                    size_t in_at = (size_t)(ab * nodes + in->peer / dpn) * 2 + 1;
                    through[out_at * set->n_devices + in->peer] = 1;
                    through[in_at * set->n_devices + in->peer] = 1;
                }
            }
        /* a collective over the whole mesh (a sender's reduction of partial
         * sums, the receivers' local all-gather) says so: the simulator
         * runs it hierarchically, as it is priced, where a flat ring over
         * the whole mesh's group crossed the NICs with the whole tensor */
        for (int d = 0; d < set->n_devices; d++)
            for (int j = 0; j < set->programs[d].n_instrs; j++) {
                const ps_program *pr = &set->programs[d];
                const ps_instr *in = &pr->instrs[j];
                if (in->kind == PS_INSTR_COLLECTIVE && in->axis < 0 &&
                    in->group == pr->axis_group[PS_MESH_AXES])
                    fail_msg("%s: device %d's %s over the whole mesh names its "
                             "group, not the mesh",
                             what, d, ps_collective_names[in->coll]);
            }
        /* a link's NIC time: its busiest NIC's bytes, after a latency */
        double bw = p->cluster->inter.nics_per_node * p->cluster->inter.nic_bandwidth_bytes_per_s;
        for (int l = 0; l < n_links; l++) {
            const ps_stage_link *x = &links[l];
            if (x->kind != PS_LINK_FORWARD && x->kind != PS_LINK_BACKWARD)
                continue;
            double most = 0;
            int flows = 0; /* the receivers through the busiest NIC */
            for (int k = 0; k < nodes; k++)
                for (int side = 0; side < 2; side++) {
                    int ab = x->from * n + x->to, here = 0;
                    double v = nic[(ab * nodes + k) * 2 + side];
                    size_t at = (size_t)(ab * nodes + k) * 2 + (size_t)side;
                    for (int d = 0; d < set->n_devices; d++)
                        here += through[at * set->n_devices + d];
                    if (v > most || (v == most && here > flows))
                        flows = here;
                    most = fmax(most, v);
                    if (v > 0)
                        assert_true(k >= x->nic_node[side] &&
                                    k < x->nic_node[side] + x->nic_nodes[side]);
                }
            if (x->nic_flows != flows)
                fail_msg("%s: link %d -> %d: %d flows through its busiest NIC, the "
                         "programs %d",
                         what, x->from, x->to, x->nic_flows, flows);
            if (flows > 1)
                several_flows++;
            double want = most > 0 ? fmin(p->cluster->inter.latency_s + most / bw, x->seconds) : 0;
            if (fabs(x->nic_s - want) > 1e-9 * want)
                fail_msg("%s: link %d -> %d holds its NICs %.9g s, its busiest NIC "
                         "carries %.0f bytes (%.9g s)",
                         what, x->from, x->to, x->nic_s, most, want);
            if (nodes > 1 && most > 0)
                crossed++;
            if (most > 0 && p->stages[x->to].n_devices < p->stages[x->from].n_devices)
                fewer_receivers++;
        }
        free(nic);
        free(through);
        for (int l = 0; l < n_links; l++)
            if (links[l].kind == PS_LINK_FORWARD || links[l].kind == PS_LINK_BACKWARD) {
                assert_true(links[l].kind == PS_LINK_FORWARD ? links[l].to > links[l].from
                                                             : links[l].to < links[l].from);
                linked[links[l].from * n + links[l].to] += links[l].bytes;
                assert_true(links[l].seconds > 0);
            }
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++)
                if (fabs(sent[a * n + b] - linked[a * n + b]) > 1e-9 * linked[a * n + b])
                    fail_msg("%s: stage %d to %d: programs send %.0f bytes per "
                             "micro-batch, links carry %.0f",
                             what, a, b, sent[a * n + b], linked[a * n + b]);
        for (int a = 0; a + 1 < n; a++)
            assert_true(linked[a * n + a + 1] > 0 && linked[(a + 1) * n + a] > 0);
        free(sent);
        free(linked);
        free(stage);
        free(links);
        ps_program_set_free(set);
        ps_plan_model_free(m);
        ps_plan_free(p);
    }
    assert_true(crossed >= 8);
    assert_true(updates_across >= 2);
    assert_true(several_flows >= 4);
    assert_true(fewer_receivers >= 2); /* the unequal plan's 8 -> 2 and 8 -> 4 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(schedule_is_the_longest_path),
        cmocka_unit_test(equal_stages_closed_form),
        cmocka_unit_test(shared_nic_takes_turns),
        cmocka_unit_test(shared_nics_bound_the_step),
        cmocka_unit_test(stage_collectives_share_nics),
        cmocka_unit_test(nics_shared_by_flows),
        cmocka_unit_test(cyclic_links_are_nan),
        cmocka_unit_test(shared_cores_closed_forms),
        cmocka_unit_test(lockstep_closed_forms),
        cmocka_unit_test(lockstep_random_schedules),
        cmocka_unit_test(shared_cores_bound_the_schedule),
        cmocka_unit_test(plan_schedule_shares_cores),
        cmocka_unit_test(links_match_the_programs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
