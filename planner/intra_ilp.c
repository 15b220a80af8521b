#include "planner/intra_ilp.h"

#include <float.h>
#include <glpk.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/array.h"
#include "core/bytes_text.h"
#include "core/clock.h"
#include "core/log.h"

/* ---- problem construction -------------------------------------------------- */

ps_status ps_ilp_problem_create(ps_ilp_problem **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? PS_OK : PS_ERR_NOMEM;
}

void ps_ilp_problem_free(ps_ilp_problem *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < p->n_nodes; i++) {
        free(p->nodes[i].cost);
        free(p->nodes[i].mem);
    }
    for (int i = 0; i < p->n_edges; i++)
        free(p->edges[i].cost);
    free(p->nodes);
    free(p->edges);
    free(p);
}

ps_status ps_ilp_add_node(ps_ilp_problem *p, int k, const double *cost, const double *mem,
                          int *id_out)
{
    if (k < 1)
        return PS_ERR_INVALID;
    if (ps_array_grow((void **)&p->nodes, &p->cap_nodes, p->n_nodes + 1, sizeof *p->nodes) != PS_OK)
        return PS_ERR_NOMEM;
    ps_ilp_node n = {.k = k, .cost = malloc((size_t)k * sizeof(double)),
                     .mem = calloc((size_t)k, sizeof(double))};
    if (n.cost == NULL || n.mem == NULL) {
        free(n.cost);
        free(n.mem);
        return PS_ERR_NOMEM;
    }
    memcpy(n.cost, cost, (size_t)k * sizeof(double));
    if (mem != NULL)
        memcpy(n.mem, mem, (size_t)k * sizeof(double));
    p->nodes[p->n_nodes] = n;
    if (id_out != NULL)
        *id_out = p->n_nodes;
    p->n_nodes++;
    return PS_OK;
}

ps_status ps_ilp_add_edge(ps_ilp_problem *p, int u, int v, const double *cost)
{
    if (u < 0 || v < 0 || u >= p->n_nodes || v >= p->n_nodes || u == v)
        return PS_ERR_INVALID;
    if (ps_array_grow((void **)&p->edges, &p->cap_edges, p->n_edges + 1, sizeof *p->edges) != PS_OK)
        return PS_ERR_NOMEM;
    size_t n = (size_t)p->nodes[u].k * (size_t)p->nodes[v].k;
    double *c = malloc(n * sizeof *c);
    if (c == NULL)
        return PS_ERR_NOMEM;
    memcpy(c, cost, n * sizeof *c);
    p->edges[p->n_edges++] = (ps_ilp_edge){.u = u, .v = v, .cost = c};
    return PS_OK;
}

static bool bad_cost(double c) { return isnan(c) || c < 0 || (isinf(c) && c < 0); }

ps_status ps_ilp_problem_validate(const ps_ilp_problem *p, ps_error *err)
{
    for (int i = 0; i < p->n_nodes; i++) {
        const ps_ilp_node *n = &p->nodes[i];
        if (n->k < 1)
            return ps_error_set(err, PS_ERR_INTERNAL, "ilp node %d has no strategy", i);
        for (int s = 0; s < n->k; s++)
            if (bad_cost(n->cost[s]) || !isfinite(n->mem[s]) || n->mem[s] < 0)
                return ps_error_set(err, PS_ERR_INTERNAL, "ilp node %d strategy %d: bad cost",
                                    i, s);
    }
    for (int e = 0; e < p->n_edges; e++) {
        const ps_ilp_edge *ed = &p->edges[e];
        if (ed->u < 0 || ed->v < 0 || ed->u >= p->n_nodes || ed->v >= p->n_nodes ||
            ed->u == ed->v)
            return ps_error_set(err, PS_ERR_INTERNAL, "ilp edge %d: bad endpoints", e);
        int n = p->nodes[ed->u].k * p->nodes[ed->v].k;
        for (int i = 0; i < n; i++)
            if (bad_cost(ed->cost[i]))
                return ps_error_set(err, PS_ERR_INTERNAL, "ilp edge %d: bad cost", e);
    }
    return PS_OK;
}

/* The default stall: simplex iterations of branch and cut without the gap
 * narrowing by a tenth (ps_ilp_options.stall_iterations). */
#define STALL_ITERATIONS 20000

ps_ilp_options ps_ilp_options_default(void)
{
    return (ps_ilp_options){
        .time_limit_s = 60, .iteration_limit = 0, .mip_gap = 1e-4,
        .stall_iterations = STALL_ITERATIONS, .reduce = true, .lagrangian = true};
}

void ps_ilp_result_clear(ps_ilp_result *r)
{
    free(r->choice);
    memset(r, 0, sizeof *r);
}

double ps_ilp_evaluate(const ps_ilp_problem *p, const int *choice, double *memory_out)
{
    double cost = 0, mem = 0;
    for (int i = 0; i < p->n_nodes; i++) {
        cost += p->nodes[i].cost[choice[i]];
        mem += p->nodes[i].mem[choice[i]];
    }
    for (int e = 0; e < p->n_edges; e++) {
        const ps_ilp_edge *ed = &p->edges[e];
        cost += ed->cost[choice[ed->u] * p->nodes[ed->v].k + choice[ed->v]];
    }
    if (memory_out != NULL)
        *memory_out = mem;
    return cost;
}


/* ---- brute force -------------------------------------------------------------- */

ps_status ps_ilp_brute_force(const ps_ilp_problem *p, double max_combinations,
                             ps_ilp_result *out, ps_error *err)
{
    ps_status st = PS_OK;
    double t0 = ps_monotonic_s(), combos = 1;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < p->n_nodes; i++)
        combos *= p->nodes[i].k;
    if (combos > max_combinations)
        return ps_error_set(err, PS_ERR_INVALID, "brute force: %g combinations", combos);
    int *cur = calloc((size_t)p->n_nodes + 1, sizeof *cur);
    int *best = malloc(((size_t)p->n_nodes + 1) * sizeof *best);
    PS_TRY_ALLOC(cur, err);
    PS_TRY_ALLOC(best, err);
    double best_cost = INFINITY, best_mem = 0;
    for (;;) {
        double mem;
        double c = ps_ilp_evaluate(p, cur, &mem);
        if (c < best_cost && (p->mem_budget <= 0 || mem <= p->mem_budget)) {
            best_cost = c;
            best_mem = mem;
            memcpy(best, cur, (size_t)p->n_nodes * sizeof *cur);
        }
        int i = 0;
        while (i < p->n_nodes && ++cur[i] == p->nodes[i].k)
            cur[i++] = 0;
        if (i == p->n_nodes)
            break;
    }
    if (!isfinite(best_cost)) {
        st = ps_error_set(err, PS_ERR_INFEASIBLE, "no choice is feasible");
        goto out;
    }
    out->choice = best;
    best = NULL;
    out->objective = best_cost;
    out->memory = best_mem;
    out->optimal = true;
    out->method = "brute-force";
    out->solve_s = ps_monotonic_s() - t0;
out:
    free(cur);
    free(best);
    return st;
}

/* ---- exact reductions ---------------------------------------------------------- *
 * The working copy keeps, per node, which original strategies are still alive
 * (`orig`), and drops edges whose cost has been folded into node costs. */

/* A node removed by elimination, and how to recover its choice from its
 * neighbours' (leaf: best per u's strategy; series: per (u, w) pair). */
typedef struct elim {
    int v, u, w; /* u, w = -1 when absent */
    int *best;   /* [k_u] or [k_u * k_w] or [1] */
} elim;

/* The edges at one node, in the order they were added (ascending ids);
 * dead ones are dropped when the list is next walked. */
typedef struct incidence {
    int *edge;
    int n, cap;
} incidence;

typedef struct work {
    ps_ilp_problem *p; /* reduced copy; nodes keep their ids */
    int **orig;        /* [node][reduced strategy] -> original strategy */
    bool *edge_dead;   /* room for one new edge per node (series elimination) */
    bool *node_dead;
    int *degree;       /* live edges per node */
    incidence *inc;    /* [node]: the reductions visit a node's edges, not all */
    elim *elims;
    int n_elims;
    /* the reductions keep every trade of cost for memory (dominance weighs
     * memory, only nodes of fixed memory are eliminated): a memory budget
     * or a price on memory may come */
    bool keep_memory;
    bool with_memory; /* the solve at hand has a budget, p->mem_budget */
} work;

static void work_free(work *w)
{
    if (w->p != NULL)
        for (int i = 0; i < w->p->n_nodes; i++) {
            free(w->orig[i]);
            if (w->inc != NULL)
                free(w->inc[i].edge);
        }
    free(w->inc);
    for (int i = 0; i < w->n_elims; i++)
        free(w->elims[i].best);
    free(w->elims);
    free(w->node_dead);
    free(w->degree);
    free(w->orig);
    free(w->edge_dead);
    ps_ilp_problem_free(w->p);
}

static ps_status incidence_add(incidence *in, int e)
{
    if (ps_array_grow((void **)&in->edge, &in->cap, in->n + 1, sizeof *in->edge) != PS_OK)
        return PS_ERR_NOMEM;
    in->edge[in->n++] = e;
    return PS_OK;
}

/* Adds an edge to the working copy and to its endpoints' lists. */
static ps_status work_add_edge(work *w, int u, int v, const double *cost)
{
    ps_status st = ps_ilp_add_edge(w->p, u, v, cost);
    if (st != PS_OK)
        return st;
    if (incidence_add(&w->inc[u], w->p->n_edges - 1) != PS_OK ||
        incidence_add(&w->inc[v], w->p->n_edges - 1) != PS_OK)
        return PS_ERR_NOMEM;
    return PS_OK;
}

/* A working copy of p. The reductions drop strategies over `budget` (0:
 * none) and keep memory's trades when keep_memory. */
static ps_status work_init(work *w, const ps_ilp_problem *p, double budget, bool keep_memory)
{
    memset(w, 0, sizeof *w);
    ps_status st = ps_ilp_problem_create(&w->p);
    if (st != PS_OK)
        return st;
    w->with_memory = budget > 0;
    w->keep_memory = keep_memory || budget > 0;
    w->p->mem_budget = budget;
    w->orig = calloc((size_t)p->n_nodes + 1, sizeof *w->orig);
    w->edge_dead = calloc((size_t)p->n_edges + (size_t)p->n_nodes + 1, sizeof *w->edge_dead);
    w->node_dead = calloc((size_t)p->n_nodes + 1, sizeof *w->node_dead);
    w->degree = calloc((size_t)p->n_nodes + 1, sizeof *w->degree);
    w->elims = calloc((size_t)p->n_nodes + 1, sizeof *w->elims);
    w->inc = calloc((size_t)p->n_nodes + 1, sizeof *w->inc);
    if (w->orig == NULL || w->edge_dead == NULL || w->node_dead == NULL || w->degree == NULL ||
        w->elims == NULL || w->inc == NULL)
        return PS_ERR_NOMEM;
    for (int i = 0; i < p->n_nodes; i++) {
        const ps_ilp_node *n = &p->nodes[i];
        if ((st = ps_ilp_add_node(w->p, n->k, n->cost, n->mem, NULL)) != PS_OK)
            return st;
        w->orig[i] = malloc((size_t)n->k * sizeof(int));
        if (w->orig[i] == NULL)
            return PS_ERR_NOMEM;
        for (int s = 0; s < n->k; s++)
            w->orig[i][s] = s;
    }
    for (int e = 0; e < p->n_edges; e++)
        if ((st = work_add_edge(w, p->edges[e].u, p->edges[e].v, p->edges[e].cost)) != PS_OK)
            return st;
    return PS_OK;
}

/* Drops the dead edges from node v's list (w->inc[v].edge, ascending ids)
 * and returns how many live ones it keeps. */
static int live_edges(work *w, int v)
{
    incidence *in = &w->inc[v];
    int n = 0;
    for (int i = 0; i < in->n; i++)
        if (!w->edge_dead[in->edge[i]])
            in->edge[n++] = in->edge[i];
    in->n = n;
    return n;
}

/* Keeps the strategies of node v with keep[s] set, in order. */
static void node_keep(work *w, int v, const bool *keep)
{
    ps_ilp_node *n = &w->p->nodes[v];
    int k_old = n->k, k = 0;
    int map[k_old];
    for (int s = 0; s < k_old; s++) {
        map[s] = keep[s] ? k : -1;
        if (keep[s]) {
            n->cost[k] = n->cost[s];
            n->mem[k] = n->mem[s];
            w->orig[v][k] = w->orig[v][s];
            k++;
        }
    }
    n->k = k;
    int n_at = live_edges(w, v);
    for (int a = 0; a < n_at; a++) {
        ps_ilp_edge *ed = &w->p->edges[w->inc[v].edge[a]];
        int ku = ed->u == v ? k_old : w->p->nodes[ed->u].k;
        int kv = ed->v == v ? k_old : w->p->nodes[ed->v].k;
        int idx = 0;
        for (int i = 0; i < ku; i++) {
            if (ed->u == v && map[i] < 0)
                continue;
            for (int j = 0; j < kv; j++) {
                if (ed->v == v && map[j] < 0)
                    continue;
                ed->cost[idx++] = ed->cost[i * kv + j];
            }
        }
    }
}

/* Node costs are finite for every surviving strategy; false if none survives. */
static bool drop_infinite(work *w, int v, bool *changed)
{
    ps_ilp_node *n = &w->p->nodes[v];
    bool keep[n->k];
    int alive = 0;
    for (int s = 0; s < n->k; s++) {
        keep[s] = isfinite(n->cost[s]) &&
                  !(w->with_memory && n->mem[s] > w->p->mem_budget);
        alive += keep[s];
    }
    if (alive == 0)
        return false;
    if (alive < n->k) {
        node_keep(w, v, keep);
        *changed = true;
    }
    return true;
}

/* Folds edge e into its endpoints when one side has a single strategy or its
 * matrix is separable (a_i + b_j). */
static void fold_edge(work *w, int e, bool *changed)
{
    ps_ilp_edge *ed = &w->p->edges[e];
    ps_ilp_node *u = &w->p->nodes[ed->u], *v = &w->p->nodes[ed->v];
    int ku = u->k, kv = v->k;
    double *c = ed->cost;
    if (ku == 1 || kv == 1) {
        for (int i = 0; i < ku; i++)
            for (int j = 0; j < kv; j++) {
                if (ku == 1)
                    v->cost[j] += c[i * kv + j];
                else
                    u->cost[i] += c[i * kv + j];
            }
        w->edge_dead[e] = true;
        *changed = true;
        return;
    }
    for (int i = 0; i < ku * kv; i++)
        if (!isfinite(c[i]))
            return;
    for (int i = 0; i < ku; i++)
        for (int j = 0; j < kv; j++)
            if (fabs(c[i * kv + j] - c[i * kv] - c[j] + c[0]) >
                1e-12 * (fabs(c[i * kv + j]) + fabs(c[0]) + 1e-30))
                return;
    for (int i = 0; i < ku; i++)
        u->cost[i] += c[i * kv];
    for (int j = 0; j < kv; j++)
        v->cost[j] += c[j] - c[0];
    w->edge_dead[e] = true;
    *changed = true;
}

/* Merges edge b into edge a (same endpoints, maybe reversed). */
static void merge_edges(work *w, int a, int b)
{
    ps_ilp_edge *ea = &w->p->edges[a], *eb = &w->p->edges[b];
    int kv = w->p->nodes[ea->v].k, ku = w->p->nodes[ea->u].k;
    for (int i = 0; i < ku; i++)
        for (int j = 0; j < kv; j++)
            ea->cost[i * kv + j] += eb->u == ea->u ? eb->cost[i * kv + j] : eb->cost[j * ku + i];
    w->edge_dead[b] = true;
}

/* Strategy a of v is dominated by b when b is no worse in node cost, memory
 * (if constrained) and every edge entry: removing a loses no optimum. */
static void drop_dominated(work *w, int v, bool *changed)
{
    ps_ilp_node *n = &w->p->nodes[v];
    int k = n->k;
    if (k < 2)
        return;
    bool keep[k];
    for (int s = 0; s < k; s++)
        keep[s] = true;
    int n_at = live_edges(w, v);
    const int *at = w->inc[v].edge;
    for (int a = 0; a < k; a++) {
        for (int b = 0; b < k && keep[a]; b++) {
            if (a == b || !keep[b] || n->cost[b] > n->cost[a] ||
                (w->keep_memory && n->mem[b] > n->mem[a]))
                continue;
            bool dominated = true;
            for (int x = 0; x < n_at && dominated; x++) {
                ps_ilp_edge *ed = &w->p->edges[at[x]];
                int ku = w->p->nodes[ed->u].k, kv = w->p->nodes[ed->v].k;
                int other = ed->u == v ? kv : ku;
                for (int j = 0; j < other && dominated; j++) {
                    double ca = ed->u == v ? ed->cost[a * kv + j] : ed->cost[j * kv + a];
                    double cb = ed->u == v ? ed->cost[b * kv + j] : ed->cost[j * kv + b];
                    if (cb > ca)
                        dominated = false;
                }
            }
            if (dominated)
                keep[a] = false;
        }
    }
    int alive = 0;
    for (int s = 0; s < k; s++)
        alive += keep[s];
    if (alive < k) {
        node_keep(w, v, keep);
        *changed = true;
    }
}

static int cmp_pair(const void *x, const void *y)
{
    const long long *a = x, *b = y;
    return (a[0] > b[0]) - (a[0] < b[0]);
}

/* Merges parallel edges (same unordered pair); keys has room for 2 per edge. */
static void merge_parallel(work *w, long long *keys, bool *changed)
{
    ps_ilp_problem *p = w->p;
    int m = 0;
    for (int e = 0; e < p->n_edges; e++) {
        if (w->edge_dead[e])
            continue;
        int a = p->edges[e].u < p->edges[e].v ? p->edges[e].u : p->edges[e].v;
        int b = p->edges[e].u ^ p->edges[e].v ^ a;
        keys[2 * m] = (long long)a * p->n_nodes + b;
        keys[2 * m + 1] = e;
        m++;
    }
    qsort(keys, (size_t)m, 2 * sizeof *keys, cmp_pair);
    for (int i = 1; i < m; i++) {
        int j = i - 1;
        while (j >= 0 && keys[2 * j] == keys[2 * i] && w->edge_dead[keys[2 * j + 1]])
            j--;
        if (j >= 0 && keys[2 * j] == keys[2 * i]) {
            merge_edges(w, (int)keys[2 * j + 1], (int)keys[2 * i + 1]);
            *changed = true;
        }
    }
}

static double edge_cost_at(const ps_ilp_problem *p, const ps_ilp_edge *ed, int x, int sx, int so)
{
    int kv = p->nodes[ed->v].k;
    return ed->u == x ? ed->cost[sx * kv + so] : ed->cost[so * kv + sx];
}

/* Without a memory constraint, a node with one neighbour (a leaf: a
 * follower in a chain's end) folds into it, and a node with two (a chain
 * link: elementwise followers) becomes an edge between them; both keep the
 * optimum and record how to recover the node's choice. */
static bool eliminate(work *w, int v, bool *fail)
{
    ps_ilp_problem *p = w->p;
    int n_at = live_edges(w, v);
    int e1 = n_at > 0 ? w->inc[v].edge[0] : -1, e2 = n_at > 1 ? w->inc[v].edge[1] : -1;
    const ps_ilp_node *nv = &p->nodes[v];
    elim *el = &w->elims[w->n_elims];
    el->v = v;
    el->u = el->w = -1;
    if (e1 < 0) { /* isolated: its own best */
        el->best = malloc(sizeof(int));
        if (el->best == NULL)
            return *fail = true, false;
        el->best[0] = 0;
        for (int j = 1; j < nv->k; j++)
            if (nv->cost[j] < nv->cost[el->best[0]])
                el->best[0] = j;
    } else if (e2 < 0) { /* leaf */
        const ps_ilp_edge *ed = &p->edges[e1];
        int u = ed->u == v ? ed->v : ed->u;
        ps_ilp_node *nu = &p->nodes[u];
        el->u = u;
        el->best = malloc((size_t)nu->k * sizeof(int));
        if (el->best == NULL)
            return *fail = true, false;
        for (int i = 0; i < nu->k; i++) {
            double best = INFINITY;
            el->best[i] = 0;
            for (int j = 0; j < nv->k; j++) {
                double x = nv->cost[j] + edge_cost_at(p, ed, v, j, i);
                if (x < best) {
                    best = x;
                    el->best[i] = j;
                }
            }
            nu->cost[i] += best;
        }
        w->edge_dead[e1] = true;
        w->degree[u]--;
    } else { /* series: u - v - w becomes u - w */
        const ps_ilp_edge *a = &p->edges[e1], *b = &p->edges[e2];
        int u = a->u == v ? a->v : a->u, x = b->u == v ? b->v : b->u;
        if (u == x)
            return false; /* parallel edges: merged on the next round */
        int ku = p->nodes[u].k, kx = p->nodes[x].k;
        double *m = malloc((size_t)ku * (size_t)kx * sizeof *m);
        el->best = malloc((size_t)ku * (size_t)kx * sizeof(int));
        if (m == NULL || el->best == NULL) {
            free(m);
            return *fail = true, false;
        }
        for (int i = 0; i < ku; i++)
            for (int k = 0; k < kx; k++) {
                double best = INFINITY;
                el->best[i * kx + k] = 0;
                for (int j = 0; j < nv->k; j++) {
                    double c = edge_cost_at(p, a, v, j, i) + nv->cost[j] +
                               edge_cost_at(p, b, v, j, k);
                    if (c < best) {
                        best = c;
                        el->best[i * kx + k] = j;
                    }
                }
                m[i * kx + k] = best;
            }
        el->u = u;
        el->w = x;
        w->edge_dead[e1] = w->edge_dead[e2] = true;
        ps_status st = work_add_edge(w, u, x, m); /* edge_dead has room for it */
        free(m);
        if (st != PS_OK)
            return *fail = true, false;
        w->edge_dead[p->n_edges - 1] = false;
    }
    w->node_dead[v] = true;
    w->n_elims++;
    return true;
}

/* True when a node's memory is the same in every strategy. */
static bool memory_fixed(const ps_ilp_node *n)
{
    for (int s = 1; s < n->k; s++)
        if (n->mem[s] != n->mem[0])
            return false;
    return true;
}

static ps_status reduce(work *w, ps_error *err)
{
    ps_ilp_problem *p = w->p;
    int max_edges = p->n_edges + p->n_nodes + 1;
    long long *keys = malloc((size_t)max_edges * 2 * sizeof *keys);
    if (keys == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    bool changed = true;
    for (int round = 0; changed && round < 1000; round++) {
        changed = false;
        for (int v = 0; v < p->n_nodes; v++) {
            if (!drop_infinite(w, v, &changed)) {
                free(keys);
                return ps_error_set(err, PS_ERR_INFEASIBLE,
                                    "every strategy of node %d is forbidden or over the memory "
                                    "budget",
                                    v);
            }
        }
        for (int e = 0; e < p->n_edges; e++)
            if (!w->edge_dead[e])
                fold_edge(w, e, &changed);
        merge_parallel(w, keys, &changed);
        for (int v = 0; v < p->n_nodes; v++)
            drop_dominated(w, v, &changed);
    }
    /* eliminations keep strategy indices, so they come last: only folds and
     * merges (which keep them too) run with them. Under a memory budget (or
     * in a session, whose budgets are still to come) only nodes whose
     * memory is the same in every strategy go: their choice then moves no
     * byte, and what they add to their neighbours does not depend on a
     * price on memory either (half the nodes of a GPT layer) */
    changed = true;
    bool full = true;    /* fold and merge over every edge after this round */
    bool recount = true; /* the degrees are stale */
    int from = 0;        /* no node before it can be eliminated */
    int dirty[2], n_dirty = 0; /* edges whose matrix changed since their last fold */
    while (changed) {
        changed = false;
        if (recount) {
            recount = false;
            for (int v = 0; v < p->n_nodes; v++)
                w->degree[v] = 0;
            for (int e = 0; e < p->n_edges; e++)
                if (!w->edge_dead[e]) {
                    w->degree[p->edges[e].u]++;
                    w->degree[p->edges[e].v]++;
                }
        }
        int eliminated = -1;
        bool refused = false; /* a node whose two edges are parallel: merged below */
        for (int v = from; v < p->n_nodes && eliminated < 0; v++) {
            if (w->node_dead[v] || w->degree[v] > 2 || (p->nodes[v].k == 1 && w->degree[v] == 0) ||
                (w->keep_memory && !memory_fixed(&p->nodes[v])))
                continue;
            bool fail = false;
            if (eliminate(w, v, &fail))
                eliminated = v;
            else
                refused = true;
            if (fail) {
                free(keys);
                return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
            }
        }
        changed = eliminated >= 0;
        if (full || refused || eliminated < 0) {
            /* every live edge folded where it can be and merged with its
             * parallels, in id order */
            for (int e = 0; e < p->n_edges; e++)
                if (!w->edge_dead[e] && !w->node_dead[p->edges[e].u] &&
                    !w->node_dead[p->edges[e].v])
                    fold_edge(w, e, &changed);
            bool merged = false;
            merge_parallel(w, keys, &merged);
            changed = changed || merged;
            full = merged; /* the merged matrices may fold now: over every edge again */
            recount = true;
            from = 0;
            n_dirty = 0;
            continue;
        }
        /* Only the edge the elimination added and the one the last merge
         * changed can fold or have a parallel now (the rest were tried
         * with the matrices they still have): the same folds and merges,
         * in the same order, as over every edge. A node whose degree drops
         * may become eliminable. */
        from = eliminated;
        const elim *el = &w->elims[w->n_elims - 1];
        int added = -1;
        if (el->u >= 0 && el->w < 0 && el->u < from)
            from = el->u; /* a leaf: its neighbour lost an edge */
        if (el->w >= 0) {
            added = p->n_edges - 1;
            dirty[n_dirty++] = added;
        }
        for (int i = 0; i < n_dirty; i++) {
            int e = dirty[i];
            const ps_ilp_edge *ed = &p->edges[e];
            if (w->edge_dead[e] || w->node_dead[ed->u] || w->node_dead[ed->v])
                continue;
            fold_edge(w, e, &changed);
            if (w->edge_dead[e]) {
                w->degree[ed->u]--;
                w->degree[ed->v]--;
                from = ed->u < from ? ed->u : from;
                from = ed->v < from ? ed->v : from;
            }
        }
        n_dirty = 0;
        if (added >= 0 && !w->edge_dead[added]) {
            int u = p->edges[added].u, x = p->edges[added].v;
            int n_at = live_edges(w, u);
            for (int i = 0; i < n_at; i++) {
                int e = w->inc[u].edge[i];
                if (e != added && (p->edges[e].u == x || p->edges[e].v == x)) {
                    merge_edges(w, e, added);
                    changed = true;
                    w->degree[u]--;
                    w->degree[x]--;
                    from = u < from ? u : from;
                    from = x < from ? x : from;
                    dirty[n_dirty++] = e;
                    break;
                }
            }
        }
    }
    free(keys);
    return PS_OK;
}

/* Recovers the eliminated nodes' choices, last eliminated first. */
static void restore_eliminated(const work *w, int *choice)
{
    for (int i = w->n_elims - 1; i >= 0; i--) {
        const elim *el = &w->elims[i];
        if (el->u < 0)
            choice[el->v] = el->best[0];
        else if (el->w < 0)
            choice[el->v] = el->best[choice[el->u]];
        else
            choice[el->v] = el->best[choice[el->u] * w->p->nodes[el->w].k + choice[el->w]];
    }
}

/* ---- incumbents ------------------------------------------------------------------ */

/* Adjacency of live edges, CSR. */
typedef struct adjacency {
    int *first, *edge;
} adjacency;

static ps_status adjacency_build(const work *w, adjacency *a)
{
    const ps_ilp_problem *p = w->p;
    a->first = calloc((size_t)p->n_nodes + 2, sizeof *a->first);
    a->edge = malloc(((size_t)p->n_edges * 2 + 1) * sizeof *a->edge);
    if (a->first == NULL || a->edge == NULL)
        return PS_ERR_NOMEM;
    for (int e = 0; e < p->n_edges; e++)
        if (!w->edge_dead[e]) {
            a->first[p->edges[e].u + 1]++;
            a->first[p->edges[e].v + 1]++;
        }
    for (int v = 0; v < p->n_nodes; v++)
        a->first[v + 1] += a->first[v];
    int *fill = malloc(((size_t)p->n_nodes + 1) * sizeof *fill);
    if (fill == NULL)
        return PS_ERR_NOMEM;
    memcpy(fill, a->first, (size_t)p->n_nodes * sizeof *fill);
    for (int e = 0; e < p->n_edges; e++)
        if (!w->edge_dead[e]) {
            a->edge[fill[p->edges[e].u]++] = e;
            a->edge[fill[p->edges[e].v]++] = e;
        }
    free(fill);
    return PS_OK;
}

static void adjacency_free(adjacency *a)
{
    free(a->first);
    free(a->edge);
}

static double edge_at(const ps_ilp_problem *p, const ps_ilp_edge *ed, int v, int sv, int so)
{
    int kv = p->nodes[ed->v].k;
    return ed->u == v ? ed->cost[sv * kv + so] : ed->cost[so * kv + sv];
}

/* Cost of node v taking strategy s with its neighbours fixed by choice. */
static double local_cost(const work *w, const adjacency *a, const int *choice, int v, int s)
{
    const ps_ilp_problem *p = w->p;
    double c = p->nodes[v].cost[s];
    for (int i = a->first[v]; i < a->first[v + 1]; i++) {
        const ps_ilp_edge *ed = &p->edges[a->edge[i]];
        int other = ed->u == v ? ed->v : ed->u;
        c += edge_at(p, ed, v, s, choice[other]);
    }
    return c;
}

/* Exact dynamic program when the live edges form a forest; false otherwise. */
static bool forest_dp(const work *w, const adjacency *a, int *choice)
{
    const ps_ilp_problem *p = w->p;
    int n = p->n_nodes;
    int *parent = malloc((size_t)n * sizeof *parent), *parent_edge = malloc((size_t)n * sizeof(int));
    int *order = malloc((size_t)n * sizeof *order);
    double **f = calloc((size_t)n, sizeof *f);
    int **pick = calloc((size_t)n, sizeof *pick); /* child's best strategy per parent strategy */
    bool ok = parent && parent_edge && order && f && pick;
    int head = 0, tail = 0;
    for (int v = 0; ok && v < n; v++)
        parent[v] = -2; /* unvisited */
    for (int r = 0; ok && r < n; r++) {
        if (parent[r] != -2)
            continue;
        parent[r] = -1;
        parent_edge[r] = -1;
        order[tail++] = r;
        while (ok && head < tail) {
            int v = order[head++];
            for (int i = a->first[v]; i < a->first[v + 1]; i++) {
                int e = a->edge[i];
                if (e == parent_edge[v])
                    continue;
                int o = p->edges[e].u == v ? p->edges[e].v : p->edges[e].u;
                if (parent[o] != -2) {
                    ok = false; /* a cycle */
                    break;
                }
                parent[o] = v;
                parent_edge[o] = e;
                order[tail++] = o;
            }
        }
    }
    for (int i = tail - 1; ok && i >= 0; i--) {
        int v = order[i], k = p->nodes[v].k;
        f[v] = malloc((size_t)k * sizeof(double));
        pick[v] = parent[v] >= 0 ? malloc((size_t)p->nodes[parent[v]].k * sizeof(int)) : NULL;
        if (f[v] == NULL || (parent[v] >= 0 && pick[v] == NULL)) {
            ok = false;
            break;
        }
        for (int s = 0; s < k; s++)
            f[v][s] = p->nodes[v].cost[s];
        /* children were finished earlier (reverse BFS order) */
        for (int j = a->first[v]; j < a->first[v + 1]; j++) {
            int e = a->edge[j];
            int c = p->edges[e].u == v ? p->edges[e].v : p->edges[e].u;
            if (parent[c] != v || parent_edge[c] != e)
                continue;
            for (int s = 0; s < k; s++) {
                double best = INFINITY;
                int arg = 0;
                for (int t = 0; t < p->nodes[c].k; t++) {
                    double x = f[c][t] + edge_at(p, &p->edges[e], v, s, t);
                    if (x < best) {
                        best = x;
                        arg = t;
                    }
                }
                f[v][s] += best;
                pick[c][s] = arg;
            }
        }
    }
    for (int i = 0; ok && i < tail; i++) {
        int v = order[i];
        if (parent[v] >= 0) {
            choice[v] = pick[v][choice[parent[v]]];
        } else {
            int arg = 0;
            for (int s = 1; s < p->nodes[v].k; s++)
                if (f[v][s] < f[v][arg])
                    arg = s;
            choice[v] = arg;
        }
    }
    for (int v = 0; f != NULL && v < n; v++) {
        free(f[v]);
        if (pick != NULL)
            free(pick[v]);
    }
    free(f);
    free(pick);
    free(parent);
    free(parent_edge);
    free(order);
    return ok;
}

/* Local search from the cheapest node strategies, then a memory repair that
 * moves to lower-memory strategies by least cost per byte saved. Returns false
 * when it cannot meet the budget. */
static bool local_search(const work *w, const adjacency *a, int *choice)
{
    const ps_ilp_problem *p = w->p;
    for (int v = 0; v < p->n_nodes; v++) {
        choice[v] = 0;
        for (int s = 1; s < p->nodes[v].k; s++)
            if (p->nodes[v].cost[s] < p->nodes[v].cost[choice[v]])
                choice[v] = s;
    }
    for (int pass = 0; pass < 100; pass++) {
        bool moved = false;
        for (int v = 0; v < p->n_nodes; v++) {
            double cur = local_cost(w, a, choice, v, choice[v]);
            for (int s = 0; s < p->nodes[v].k; s++) {
                double c = local_cost(w, a, choice, v, s);
                if (c < cur - 1e-15 * fabs(cur)) {
                    cur = c;
                    choice[v] = s;
                    moved = true;
                }
            }
        }
        if (!moved)
            break;
    }
    if (!w->with_memory)
        return true;
    double mem = 0;
    for (int v = 0; v < p->n_nodes; v++)
        mem += p->nodes[v].mem[choice[v]];
    while (mem > p->mem_budget) {
        int bv = -1, bs = -1;
        double best = INFINITY;
        for (int v = 0; v < p->n_nodes; v++) {
            double cur = local_cost(w, a, choice, v, choice[v]);
            for (int s = 0; s < p->nodes[v].k; s++) {
                double saved = p->nodes[v].mem[choice[v]] - p->nodes[v].mem[s];
                if (saved <= 0)
                    continue;
                double ratio = (local_cost(w, a, choice, v, s) - cur) / saved;
                if (ratio < best) {
                    best = ratio;
                    bv = v;
                    bs = s;
                }
            }
        }
        if (bv < 0)
            return false;
        mem -= p->nodes[bv].mem[choice[bv]] - p->nodes[bv].mem[bs];
        choice[bv] = bs;
    }
    return true;
}

/* ---- GLPK ------------------------------------------------------------------------ */

static int glpk_to_log(void *info, const char *s)
{
    (void)info;
    if (ps_log_enabled(PS_LOG_LEVEL_DEBUG))
        PS_LOG_DEBUG("glpk: %s", s);
    return 1; /* we printed it (or chose not to) */
}

typedef struct glpk_ctx {
    const double *start; /* incumbent column values [1..n], or NULL */
    double gap;          /* the least relative gap seen */
    /* The search's work: its simplex iterations, and node_work for each node
     * of its tree (so that a search whose nodes need no pivots still ends):
     * counts, the same on any machine at any load */
    int its0;            /* the program's iteration count at the start */
    int node_work;       /* iterations a node counts as (node_work_of) */
    int work_limit;      /* stop when the work reaches it (INT_MAX: never) */
    int stall_work;      /* stop after this much work without the gap narrowing by a
                          * tenth; 0: never */
    double gap_ref;      /* the gap when it last narrowed by a tenth */
    double narrowed_at;  /* the work then */
    bool out_of_work;    /* stopped at work_limit */
    int nodes;           /* of the search tree, so far */
} glpk_ctx;

/* What a node of the search tree counts as: its set-up (GLPK's bound
 * preprocessing, the basis factorized again) grows faster than the
 * program. Besides its own pivots a node took as long as about 20
 * iterations at 1,821 rows, 90 at 4,536, 100-700 at 6,444 and 700-750 at
 * 8,868 and 10,632 (the stage programs of GPT-15B's and GPT-6.7B's plans):
 * rows^2 / 150,000 follows them. */
static int node_work_of(int rows)
{
    double w = (double)rows * rows / 150000;
    return w > 10 ? (int)fmin(w, 1e6) : 10;
}

static void glpk_callback(glp_tree *tree, void *info)
{
    glpk_ctx *ctx = info;
    if (glp_ios_reason(tree) == GLP_IHEUR && ctx->start != NULL) {
        glp_ios_heur_sol(tree, ctx->start);
        ctx->start = NULL; /* once is enough */
    }
    double gap = glp_ios_mip_gap(tree);
    glp_ios_tree_size(tree, NULL, NULL, &ctx->nodes);
    double done = (double)glp_get_it_cnt(glp_ios_get_prob(tree)) - ctx->its0 +
                  (double)ctx->node_work * ctx->nodes;
    if (gap < ctx->gap)
        ctx->gap = gap;
    if (done >= ctx->work_limit) {
        ctx->out_of_work = true;
        glp_ios_terminate(tree);
    } else if (gap < 0.9 * ctx->gap_ref) {
        ctx->gap_ref = gap;
        ctx->narrowed_at = done;
    } else if (ctx->stall_work > 0 && isfinite(ctx->gap) &&
               done - ctx->narrowed_at > ctx->stall_work) {
        /* the gap has not narrowed by a tenth for a while: with a knapsack
         * (memory) row the bound can sit a fraction of a percent under a
         * good incumbent for the whole time limit, creeping up */
        glp_ios_terminate(tree);
    }
}

/* An edge's strategies in classes: u's strategies whose rows of the cost
 * matrix are equal form one class, and so do v's whose columns are equal.
 * The program then needs one edge variable per pair of classes, and one
 * marginal row per class (the class's node variables summed): the same 0-1
 * program and the same relaxation, with half the columns on 2-D meshes,
 * where many layouts cost the same against one neighbour. */
typedef struct edge_classes {
    int cu, cv;          /* number of classes on each side */
    int *of_u, *of_v;    /* [k_u], [k_v] class of each strategy */
    int *rep_u, *rep_v;  /* [cu], [cv] a member of each class */
} edge_classes;

static bool same_cost(double a, double b) { return a == b || (isinf(a) && isinf(b)); }

/* Classes of the k strategies whose `len` costs (at base + s * stride_s +
 * i * stride_i) are equal. */
static int classify(const double *base, int k, int len, int stride_s, int stride_i, int *of,
                    int *rep)
{
    int n = 0;
    for (int s = 0; s < k; s++) {
        of[s] = -1;
        for (int c = 0; c < n && of[s] < 0; c++) {
            int r = rep[c];
            bool eq = true;
            for (int i = 0; i < len && eq; i++)
                eq = same_cost(base[s * stride_s + i * stride_i], base[r * stride_s + i * stride_i]);
            if (eq)
                of[s] = c;
        }
        if (of[s] < 0) {
            rep[n] = s;
            of[s] = n++;
        }
    }
    return n;
}

static void edge_classes_free(edge_classes *c, int n)
{
    for (int e = 0; c != NULL && e < n; e++) {
        free(c[e].of_u);
        free(c[e].of_v);
        free(c[e].rep_u);
        free(c[e].rep_v);
    }
    free(c);
}

/* The 0-1 program of the live part of w, built once: the pricing of memory
 * re-solves its relaxation under changing node costs, each time from the
 * basis the last one left, and the solve with the memory row starts from
 * the basis of a price whose answer fits. */
typedef struct program {
    glp_prob *lp;      /* NULL when there is nothing to choose (cols == 0) */
    int *node_col;     /* [n_nodes] a node's first column, 0 when it has none */
    int *edge_col;     /* [n_edges] an edge's first column, 0 when dead */
    edge_classes *cls; /* [n_edges] */
    int cols, rows;
    int mem_row;       /* the memory row, 0 when memory is not kept */
    double scale;      /* objective units per second */
    double const_mem;  /* bytes of the nodes without columns */
    double mem_unit;   /* the memory row's units per byte */
    double mem_bound;  /* the memory row's bound for the budget at hand */
    bool warm;         /* lp holds the basis of an earlier relaxation */
} program;

static void program_free(program *g, int n_edges)
{
    if (g->lp != NULL)
        glp_delete_prob(g->lp);
    free(g->node_col);
    free(g->edge_col);
    edge_classes_free(g->cls, n_edges);
    memset(g, 0, sizeof *g);
}

/* Node columns' objective: cost plus lambda (seconds per byte) times memory;
 * the nodes without columns add a constant. */
static void program_price(const work *w, program *g, double lambda)
{
    const ps_ilp_problem *p = w->p;
    double const_cost = 0;
    for (int v = 0; v < p->n_nodes; v++) {
        if (g->node_col[v] == 0) {
            if (!w->node_dead[v]) /* an eliminated node's cost is in its neighbours' */
                const_cost += p->nodes[v].cost[0];
            continue;
        }
        for (int s = 0; s < p->nodes[v].k; s++)
            if (isfinite(p->nodes[v].cost[s]))
                glp_set_obj_coef(g->lp, g->node_col[v] + s,
                                 (p->nodes[v].cost[s] + lambda * p->nodes[v].mem[s]) * g->scale);
    }
    glp_set_obj_coef(g->lp, 0, (const_cost + lambda * g->const_mem) * g->scale);
}

/* The memory row's bound for a budget (bytes per device). */
static void program_budget(const work *w, program *g)
{
    g->mem_bound = (w->p->mem_budget - g->const_mem) * g->mem_unit;
}

/* Builds the program of w's live part; its memory row (when w has a budget)
 * starts free. g->lp stays NULL when every node is down to one strategy
 * (GLPK rejects empty programs). */
static ps_status program_build(const work *w, program *g, ps_error *err)
{
    const ps_ilp_problem *p = w->p;
    ps_status st = PS_OK;
    int n = p->n_nodes;
    int *ia = NULL, *ja = NULL;
    double *ar = NULL;
    memset(g, 0, sizeof *g);
    g->node_col = malloc(((size_t)n + 1) * sizeof *g->node_col);
    g->edge_col = malloc(((size_t)p->n_edges + 1) * sizeof *g->edge_col);
    g->cls = calloc((size_t)p->n_edges + 1, sizeof *g->cls);
    bool *touched = calloc((size_t)n + 1, sizeof *touched);
    if (g->node_col == NULL || g->edge_col == NULL || g->cls == NULL || touched == NULL) {
        free(touched);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    size_t nnz = 0;
    /* Nodes with one strategy get no column unless a live edge touches them
     * (possible when reductions are off). */
    for (int e = 0; e < p->n_edges; e++)
        if (!w->edge_dead[e])
            touched[p->edges[e].u] = touched[p->edges[e].v] = true;
    for (int v = 0; v < n; v++) {
        bool has_cols = !w->node_dead[v] && (p->nodes[v].k > 1 || touched[v]);
        g->node_col[v] = has_cols ? g->cols + 1 : 0;
        if (has_cols) {
            g->cols += p->nodes[v].k;
            g->rows++;
            nnz += (size_t)p->nodes[v].k;
        }
    }
    free(touched);
    for (int e = 0; e < p->n_edges; e++) {
        g->edge_col[e] = 0;
        if (w->edge_dead[e])
            continue;
        const ps_ilp_edge *ed = &p->edges[e];
        int ku = p->nodes[ed->u].k, kv = p->nodes[ed->v].k;
        edge_classes *c = &g->cls[e];
        c->of_u = malloc((size_t)ku * sizeof *c->of_u);
        c->rep_u = malloc((size_t)ku * sizeof *c->rep_u);
        c->of_v = malloc((size_t)kv * sizeof *c->of_v);
        c->rep_v = malloc((size_t)kv * sizeof *c->rep_v);
        if (c->of_u == NULL || c->rep_u == NULL || c->of_v == NULL || c->rep_v == NULL)
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        c->cu = classify(ed->cost, ku, kv, kv, 1, c->of_u, c->rep_u);
        c->cv = classify(ed->cost, kv, ku, 1, kv, c->of_v, c->rep_v);
        g->edge_col[e] = g->cols + 1;
        g->cols += c->cu * c->cv;
        g->rows += c->cu + c->cv;
        nnz += (size_t)c->cu * c->cv * 2 + (size_t)ku + (size_t)kv;
    }
    if (w->keep_memory) {
        g->mem_row = ++g->rows;
        nnz += (size_t)g->cols;
    }
    for (int v = 0; v < n; v++)
        if (g->node_col[v] == 0)
            g->const_mem += p->nodes[v].mem[0]; /* the same in every strategy */
    if (g->cols == 0)
        return PS_OK;
    ia = malloc((nnz + 1) * sizeof *ia);
    ja = malloc((nnz + 1) * sizeof *ja);
    ar = malloc((nnz + 1) * sizeof *ar);
    PS_TRY_ALLOC(ia, err);
    PS_TRY_ALLOC(ja, err);
    PS_TRY_ALLOC(ar, err);
    glp_prob *lp = g->lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    glp_add_cols(lp, g->cols);
    glp_add_rows(lp, g->rows);
    /* GLPK's tolerances are partly absolute: costs in seconds (1e-6 and
     * below) would be pruned as ties. Scale the largest finite cost to 1e6. */
    double biggest = 0;
    for (int v = 0; v < n; v++)
        for (int s = 0; s < p->nodes[v].k && !w->node_dead[v]; s++)
            if (isfinite(p->nodes[v].cost[s]))
                biggest = fmax(biggest, p->nodes[v].cost[s]);
    for (int e = 0; e < p->n_edges; e++)
        if (!w->edge_dead[e]) {
            int kk = p->nodes[p->edges[e].u].k * p->nodes[p->edges[e].v].k;
            for (int i = 0; i < kk; i++)
                if (isfinite(p->edges[e].cost[i]))
                    biggest = fmax(biggest, p->edges[e].cost[i]);
        }
    g->scale = biggest > 0 ? 1e6 / biggest : 1;
    size_t k_nz = 0;
    int row = 0;
    for (int v = 0; v < n; v++) {
        const ps_ilp_node *nd = &p->nodes[v];
        if (g->node_col[v] == 0)
            continue; /* dead (its cost moved into its neighbours) or constant */
        row++;
        glp_set_row_bnds(lp, row, GLP_FX, 1, 1);
        for (int s = 0; s < nd->k; s++) {
            int c = g->node_col[v] + s;
            glp_set_col_kind(lp, c, GLP_BV);
            if (!isfinite(nd->cost[s]))
                glp_set_col_bnds(lp, c, GLP_FX, 0, 0);
            k_nz++, ia[k_nz] = row, ja[k_nz] = c, ar[k_nz] = 1;
        }
    }
    for (int e = 0; e < p->n_edges; e++) {
        if (w->edge_dead[e])
            continue;
        const ps_ilp_edge *ed = &p->edges[e];
        const edge_classes *ec = &g->cls[e];
        int ku = p->nodes[ed->u].k, kv = p->nodes[ed->v].k;
        int row_u = row + 1, row_v = row + 1 + ec->cu;
        /* class marginals: the edge's variables of class a sum to the node
         * variables of a's members */
        for (int a = 0; a < ec->cu; a++)
            glp_set_row_bnds(lp, row_u + a, GLP_FX, 0, 0);
        for (int b = 0; b < ec->cv; b++)
            glp_set_row_bnds(lp, row_v + b, GLP_FX, 0, 0);
        for (int i = 0; i < ku; i++)
            k_nz++, ia[k_nz] = row_u + ec->of_u[i], ja[k_nz] = g->node_col[ed->u] + i,
                    ar[k_nz] = -1;
        for (int j = 0; j < kv; j++)
            k_nz++, ia[k_nz] = row_v + ec->of_v[j], ja[k_nz] = g->node_col[ed->v] + j,
                    ar[k_nz] = -1;
        for (int a = 0; a < ec->cu; a++)
            for (int b = 0; b < ec->cv; b++) {
                int c = g->edge_col[e] + a * ec->cv + b;
                double x = ed->cost[ec->rep_u[a] * kv + ec->rep_v[b]];
                glp_set_col_kind(lp, c, GLP_BV);
                if (isfinite(x))
                    glp_set_obj_coef(lp, c, x * g->scale);
                else
                    glp_set_col_bnds(lp, c, GLP_FX, 0, 0); /* forbidden pair */
                k_nz++, ia[k_nz] = row_u + a, ja[k_nz] = c, ar[k_nz] = 1;
                k_nz++, ia[k_nz] = row_v + b, ja[k_nz] = c, ar[k_nz] = 1;
            }
        row += ec->cu + ec->cv;
    }
    if (g->mem_row != 0) {
        /* in units of the budget (or of the least memory, when the budgets
         * are still to come), so that the row is as well scaled as the
         * one-hot rows (bytes would be ~1e10) */
        double unit = g->mem_unit =
            1.0 / (w->with_memory ? p->mem_budget : fmax(ps_ilp_min_memory(p), 1));
        glp_set_row_bnds(lp, g->mem_row, GLP_FR, 0, 0);
        for (int v = 0; v < n; v++)
            if (g->node_col[v] != 0)
                for (int s = 0; s < p->nodes[v].k; s++)
                    if (p->nodes[v].mem[s] != 0) {
                        k_nz++, ia[k_nz] = g->mem_row, ja[k_nz] = g->node_col[v] + s;
                        ar[k_nz] = p->nodes[v].mem[s] * unit;
                    }
    }
    glp_load_matrix(lp, (int)k_nz, ia, ja, ar);
    program_price(w, g, 0);
out:
    free(ia);
    free(ja);
    free(ar);
    return st;
}

/* Where a solve, or a part of it, stops: a wall-clock deadline
 * (ps_monotonic_s()) and a count of GLPK's simplex iterations on the
 * program (glp_get_it_cnt, which every simplex and branch and cut on it
 * advances; INT_MAX: no such limit). The count is the same on any machine
 * at any load: a solve that stops by it gives the same answer everywhere. */
typedef struct limits {
    double deadline;
    int it_end;
} limits;

static int iterations_done(const program *g) { return g->lp != NULL ? glp_get_it_cnt(g->lp) : 0; }

static int imax(int a, int b) { return a > b ? a : b; }
static int imin(int a, int b) { return a < b ? a : b; }

/* GLPK's tm_lim: the milliseconds to `deadline`, at least one */
static int ms_until(double deadline)
{
    return (int)fmin(fmax(deadline - ps_monotonic_s(), 0.001) * 1000, INT_MAX / 2);
}

static bool limits_spent(const program *g, const limits *l)
{
    return ps_monotonic_s() >= l->deadline || iterations_done(g) >= l->it_end;
}

/* Runs the simplex method on the relaxation within `l`; GLPK's code
 * (GLP_ETMLIM or GLP_EITLIM when a limit stops it). Cold: from Bixby's crash
 * basis with the dual simplex, 4x faster than the primal simplex from GLPK's
 * default basis on the root relaxation of an unforced 2-D GPT layer (1.3 s
 * vs 5.4 s; LP presolve made it slower, 6.7 s). Warm: from the basis the
 * last solve left, by `meth`. */
static int program_simplex(program *g, bool cold, int meth, const limits *l)
{
    glp_smcp smcp;
    glp_init_smcp(&smcp);
    smcp.msg_lev = GLP_MSG_OFF;
    smcp.meth = cold ? GLP_DUALP : meth;
    if (cold)
        glp_cpx_basis(g->lp);
    for (int attempt = 0;; attempt++) {
        smcp.tm_lim = ms_until(l->deadline);
        smcp.it_lim = l->it_end == INT_MAX ? INT_MAX : imax(1, l->it_end - iterations_done(g));
        int ret = glp_simplex(g->lp, &smcp);
        if (attempt > 0 || (ret != GLP_EFAIL && ret != GLP_ESING && ret != GLP_ECOND)) {
            g->warm = ret == 0 && glp_get_status(g->lp) == GLP_OPT;
            return ret;
        }
        /* numerical trouble (rare: MoE layers' costs span many orders of
         * magnitude): scale the rows and columns and start the primal
         * simplex again from the standard basis, within what is left */
        PS_LOG_DEBUG("ILP: the simplex method failed (code %d); primal simplex on the scaled "
                     "program",
                     ret);
        glp_scale_prob(g->lp, GLP_SF_AUTO);
        glp_std_basis(g->lp);
        smcp.meth = GLP_PRIMAL;
    }
}

/* A basis of g's relaxation, to start a later simplex from: the pricing's
 * last one that fits, or the root's kept across a branch and cut so that
 * the next solve of a session starts from the relaxation's optimum. */
typedef struct basis {
    int *row_stat, *col_stat; /* [rows + 1], [cols + 1] */
} basis;

static bool basis_alloc(const program *g, basis *b)
{
    b->row_stat = malloc(((size_t)g->rows + 1) * sizeof *b->row_stat);
    b->col_stat = malloc(((size_t)g->cols + 1) * sizeof *b->col_stat);
    return b->row_stat != NULL && b->col_stat != NULL;
}

/* The basis g's lp holds now. */
static void basis_read(const program *g, basis *b)
{
    for (int i = 1; i <= g->rows; i++)
        b->row_stat[i] = glp_get_row_stat(g->lp, i);
    for (int j = 1; j <= g->cols; j++)
        b->col_stat[j] = glp_get_col_stat(g->lp, j);
}

static void basis_load(program *g, const basis *b)
{
    for (int i = 1; i <= g->rows; i++)
        glp_set_row_stat(g->lp, i, b->row_stat[i]);
    for (int j = 1; j <= g->cols; j++)
        glp_set_col_stat(g->lp, j, b->col_stat[j]);
}

static void basis_free(basis *b)
{
    free(b->row_stat);
    free(b->col_stat);
}

/* The relaxation's answer as a choice (w's strategies): each node's largest
 * column (the whole of it where the answer is integral). */
static void program_point(const work *w, const program *g, int *choice)
{
    const ps_ilp_problem *p = w->p;
    for (int v = 0; v < p->n_nodes; v++) {
        choice[v] = 0;
        if (g->node_col[v] == 0)
            continue;
        double top = -1;
        for (int s = 0; s < p->nodes[v].k; s++) {
            double x = glp_get_col_prim(g->lp, g->node_col[v] + s);
            if (x > top) {
                top = x;
                choice[v] = s;
            }
        }
    }
}

/* Solves the 0-1 program g (w's live part) within the budget: the
 * relaxation with its memory row bounded, from the given basis of an answer
 * that fits (`fit`, or NULL), else from the optimum
 * without the row; then branch and cut from the incumbent. On success
 * choice holds GLPK's answer and optimal and gap say how good it is. */
static ps_status program_solve(const work *w, program *g, const ps_ilp_options *opt,
                               const limits *l, const basis *fit,
                               const int *incumbent, int *choice, bool *optimal, double *gap,
                               ps_error *err)
{
    const ps_ilp_problem *p = w->p;
    int n = p->n_nodes;
    if (g->lp == NULL) { /* every node is down to one strategy */
        double mem = g->const_mem;
        for (int v = 0; v < n; v++)
            choice[v] = 0;
        if (w->with_memory && mem > p->mem_budget)
            return ps_error_set(err, PS_ERR_INFEASIBLE, "no strategy choice fits the memory budget");
        *optimal = true;
        *gap = 0;
        return PS_OK;
    }
    double *start = calloc((size_t)g->cols + 1, sizeof *start);
    if (start == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    basis root = {0};
    bool keep_root = false;
    glpk_ctx ctx = {.start = NULL, .gap = INFINITY, .gap_ref = INFINITY, .work_limit = INT_MAX};
    if (incumbent != NULL) {
        for (int v = 0; v < n; v++)
            if (g->node_col[v] != 0)
                start[g->node_col[v] + incumbent[v]] = 1;
        for (int e = 0; e < p->n_edges; e++)
            if (!w->edge_dead[e]) {
                const edge_classes *ec = &g->cls[e];
                start[g->edge_col[e] + ec->of_u[incumbent[p->edges[e].u]] * ec->cv +
                      ec->of_v[incumbent[p->edges[e].v]]] = 1;
            }
        ctx.start = start;
    }
    double t_lp = ps_monotonic_s();
    int it_lp = iterations_done(g);
    program_price(w, g, 0);
    int ret;
    if (fit != NULL) {
        /* the basis of an answer that fits stays feasible with the row
         * bounded: the primal simplex goes on from it */
        basis_load(g, fit);
        if (g->mem_row != 0)
            glp_set_row_bnds(g->lp, g->mem_row, GLP_UP, 0, g->mem_bound);
        ret = program_simplex(g, false, GLP_PRIMAL, l);
    } else {
        /* the optimum without the memory row first, then the row bounded:
         * from a basis that is optimal without it, the dual simplex has one
         * violated row to mend. The relaxation of a 2-layer GPT-15B stage
         * on 8 devices took 2 s with the row from the start, 1.5 s so */
        if (g->mem_row != 0)
            glp_set_row_bnds(g->lp, g->mem_row, GLP_FR, 0, 0);
        ret = program_simplex(g, !g->warm, GLP_PRIMAL, l);
        if (ret == 0 && w->with_memory) {
            glp_set_row_bnds(g->lp, g->mem_row, GLP_UP, 0, g->mem_bound);
            ret = program_simplex(g, false, GLP_DUALP, l);
        }
    }
    t_lp = ps_monotonic_s() - t_lp;
    it_lp = iterations_done(g) - it_lp;
    ps_status st = PS_OK;
    if (ret != 0 || glp_get_status(g->lp) == GLP_NOFEAS) {
        if (ret == 0)
            st = ps_error_set(err, PS_ERR_INFEASIBLE, "no strategy choice fits the memory budget");
        else if (ret == GLP_ETMLIM)
            st = ps_error_set(err, PS_ERR_INTERNAL,
                              "GLPK's relaxation was not solved in the %.3g s left of the time limit",
                              t_lp);
        else if (ret == GLP_EITLIM)
            st = ps_error_set(err, PS_ERR_INTERNAL,
                              "GLPK's relaxation was not solved in the %d simplex iterations left "
                              "of the iteration limit",
                              it_lp);
        else
            st = ps_error_set(err, PS_ERR_INTERNAL,
                              "GLPK could not solve the relaxation (code %d) in %.3g s", ret, t_lp);
        goto out;
    }
    glp_iocp iocp;
    glp_init_iocp(&iocp);
    iocp.msg_lev = GLP_MSG_OFF;
    iocp.presolve = GLP_OFF; /* so that the callback may hand over the incumbent */
    iocp.cb_func = glpk_callback;
    iocp.cb_info = &ctx;
    /* what is left of the limits, and a tenth of each at least: the
     * incumbent and the relaxation are in hand, branching from them is what
     * is left */
    iocp.tm_lim = imax(ms_until(l->deadline), (int)fmin(100.0 * opt->time_limit_s, INT_MAX / 2));
    int its = iterations_done(g);
    ctx.its0 = its;
    ctx.node_work = node_work_of(g->rows);
    if (l->it_end != INT_MAX)
        ctx.work_limit = (int)fmin(fmax(l->it_end - its, 0.1 * opt->iteration_limit), INT_MAX / 2);
    iocp.mip_gap = opt->mip_gap;
    /* a stall is counted in relaxations: a small program that has not
     * narrowed its gap in twenty relaxations' worth of branching will not in
     * many more either */
    if (opt->stall_iterations > 0)
        ctx.stall_work = imax(opt->stall_iterations / 8, imin(opt->stall_iterations, 20 * it_lp));
    double t_mip = ps_monotonic_s();
    keep_root = basis_alloc(g, &root);
    if (keep_root)
        basis_read(g, &root);
    ret = glp_intopt(g->lp, &iocp);
    t_mip = ps_monotonic_s() - t_mip;
    int status = glp_mip_status(g->lp);
    PS_LOG_DEBUG("ILP: %d columns, %d rows%s; relaxation %.3f s, %d iterations%s, branch and "
                 "cut %.3f s, %d iterations, %d nodes (code %d%s, gap %.3g%%)",
                 g->cols, g->rows, g->mem_row ? " (one of memory)" : "", t_lp, it_lp,
                 fit != NULL ? " (from the priced basis)" : "", t_mip, iterations_done(g) - its,
                 ctx.nodes,
                 ret, ctx.out_of_work ? ": the iteration limit" : "", 100 * ctx.gap);
    if (status != GLP_OPT && status != GLP_FEAS) {
        st = ps_error_set(err, status == GLP_NOFEAS ? PS_ERR_INFEASIBLE : PS_ERR_INTERNAL,
                          status == GLP_NOFEAS ? "no strategy choice fits the memory budget"
                                               : "GLPK found no solution (code %d)",
                          ret);
        goto out;
    }
    for (int v = 0; v < n; v++) {
        choice[v] = 0;
        if (g->node_col[v] == 0)
            continue;
        for (int s = 0; s < p->nodes[v].k; s++)
            if (glp_mip_col_val(g->lp, g->node_col[v] + s) > 0.5)
                choice[v] = s;
    }

    *optimal = status == GLP_OPT || ret == GLP_EMIPGAP;
    /* stopped at the gap tolerance, the answer is within it (and within the
     * least gap a callback saw), not exact */
    *gap = status == GLP_OPT && ret == 0 ? 0 : fmin(isfinite(ctx.gap) ? ctx.gap : 1,
                                                    ret == GLP_EMIPGAP ? opt->mip_gap : 1);
out:
    /* the relaxation's optimum, for a session's next solve: the root's
     * basis is optimal there, in the bounds that solve sets */
    if (keep_root)
        basis_load(g, &root);
    g->warm = g->warm || keep_root;
    basis_free(&root);
    free(start);
    return st;
}

/* ---- the solver ---------------------------------------------------------------- */

/* Cost of a choice over the reduced problem (live edges only). */
static double work_evaluate(const work *w, const int *choice)
{
    const ps_ilp_problem *p = w->p;
    double c = 0;
    for (int v = 0; v < p->n_nodes; v++)
        if (!w->node_dead[v])
            c += p->nodes[v].cost[choice[v]];
    for (int e = 0; e < p->n_edges; e++)
        if (!w->edge_dead[e])
            c += p->edges[e].cost[choice[p->edges[e].u] * p->nodes[p->edges[e].v].k +
                                  choice[p->edges[e].v]];
    return c;
}

double ps_ilp_min_memory(const ps_ilp_problem *p)
{
    double m = 0;
    for (int v = 0; v < p->n_nodes; v++) {
        double best = INFINITY;
        for (int s = 0; s < p->nodes[v].k; s++)
            if (isfinite(p->nodes[v].cost[s]) && p->nodes[v].mem[s] < best)
                best = p->nodes[v].mem[s];
        m += best;
    }
    return m;
}

/* ---- a memory budget by Lagrangian relaxation -------------------------------------- *
 * min cost + lambda * memory has no memory row. For every lambda its
 * relaxation's optimum less lambda * budget bounds the constrained optimum
 * from below, and every answer that fits is a candidate. The relaxation is
 * re-solved for each lambda by the primal simplex from the basis the last
 * one left (only the node costs change): a few pivots, where a cold solve
 * of a GPT-15B stage took 0.3 to 0.7 s. It is integral almost everywhere on
 * the planner's programs, which have many layouts between fastest and
 * leanest, so that bisecting lambda (the dual is concave in it) closes the
 * gap to a percent or less; where it does not, the best candidate is
 * GLPK's incumbent and the last basis that fits its start. */

typedef struct pricing {
    int *best;        /* [n_nodes] the best choice that fits (w's strategies) */
    double best_cost; /* its cost, INFINITY while none */
    double bound;     /* the best lower bound on the constrained optimum */
    basis fit;        /* the basis of the last lambda whose relaxation fits */
    bool have_basis;
    int *scratch;     /* [n_nodes] */
    int solves;       /* relaxations solved */
} pricing;

static void pricing_free(pricing *pr)
{
    free(pr->best);
    basis_free(&pr->fit);
    free(pr->scratch);
}

/* Solves the relaxation at lambda; *fits tells whether its answer fits.
 * PS_ERR_INTERNAL when GLPK did not reach the optimum in time. */
static ps_status price_at(const work *w, program *g, pricing *pr, double lambda, const limits *l,
                          bool *fits)
{
    const ps_ilp_problem *p = w->p;
    program_price(w, g, lambda);
    int ret = program_simplex(g, !g->warm, GLP_PRIMAL, l);
    pr->solves++;
    if (ret != 0 || glp_get_status(g->lp) != GLP_OPT)
        return PS_ERR_INTERNAL;
    pr->bound = fmax(pr->bound, glp_get_obj_val(g->lp) / g->scale - lambda * p->mem_budget);
    *fits = glp_get_row_prim(g->lp, g->mem_row) <= g->mem_bound * (1 + 1e-9);
    program_point(w, g, pr->scratch);
    double mem = 0, cost = work_evaluate(w, pr->scratch);
    for (int v = 0; v < p->n_nodes; v++)
        mem += p->nodes[v].mem[pr->scratch[v]];
    if (mem <= p->mem_budget && cost < pr->best_cost) {
        pr->best_cost = cost;
        memcpy(pr->best, pr->scratch, (size_t)p->n_nodes * sizeof *pr->best);
    }
    if (*fits) {
        basis_read(g, &pr->fit);
        pr->have_basis = true;
    }
    return PS_OK;
}

static bool pricing_closed(const pricing *pr, double gap)
{
    return isfinite(pr->best_cost) && pr->best_cost - pr->bound <= gap * pr->best_cost;
}

/* Fills pr (best, bound, the basis) by bisecting lambda until the gap is
 * closed to opt->mip_gap, lambda is narrowed to 5% or `own` limits are
 * spent (the first relaxation may take up to `whole`). */
static ps_status price_memory(const work *w, program *g, const ps_ilp_options *opt,
                              const limits *own, const limits *whole, pricing *pr, ps_error *err)
{
    const ps_ilp_problem *p = w->p;
    pr->best = calloc((size_t)p->n_nodes + 1, sizeof *pr->best);
    pr->scratch = calloc((size_t)p->n_nodes + 1, sizeof *pr->scratch);
    if (!basis_alloc(g, &pr->fit) || pr->best == NULL || pr->scratch == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    pr->best_cost = INFINITY;
    pr->bound = -INFINITY;
    bool fits = false;
    /* priced, the row is free (a session's last solve may have bounded it) */
    glp_set_row_bnds(g->lp, g->mem_row, GLP_FR, 0, 0);
    /* the first relaxation may take up to the whole limit: the solve with
     * the memory row would start from it anyway */
    if (price_at(w, g, pr, 0, whole, &fits) != PS_OK)
        return PS_OK; /* out of time */
    if (fits || pricing_closed(pr, opt->mip_gap))
        return PS_OK;
    /* a first lambda on the program's own scale (its largest cost per its
     * largest memory, a thousandth of it), grown until an answer fits */
    double lo = 0, hi = 0, big_cost = 0, big_mem = 0;
    for (int v = 0; v < p->n_nodes; v++)
        for (int s = 0; s < p->nodes[v].k; s++)
            if (isfinite(p->nodes[v].cost[s])) {
                big_cost = fmax(big_cost, p->nodes[v].cost[s]);
                big_mem = fmax(big_mem, p->nodes[v].mem[s]);
            }
    double scale = big_mem > 0 ? fmax(big_cost, 1e-12) / big_mem : 1;
    for (int i = 0; i < 40 && !fits; i++) {
        lo = hi;
        hi = hi == 0 ? scale * 1e-3 : hi * 8;
        if (price_at(w, g, pr, hi, own, &fits) != PS_OK)
            return PS_OK;
    }
    if (!fits)
        return PS_OK;
    /* the dual's best lambda lies in [lo, hi]: bisected (geometrically)
     * while the gap stays open */
    for (int i = 0; i < 16 && hi > 1.05 * lo && !pricing_closed(pr, opt->mip_gap) &&
                    !limits_spent(g, own);
         i++) {
        double mid = lo > 0 ? sqrt(lo * hi) : hi / 8;
        if (price_at(w, g, pr, mid, own, &fits) != PS_OK)
            return PS_OK;
        if (fits)
            hi = mid;
        else
            lo = mid;
    }
    return PS_OK;
}

/* A problem made ready to solve: its reduced working copy, the copy's
 * adjacency and, once a solve needed GLPK, its 0-1 program (one solve's, or
 * a session's several). */
typedef struct solver {
    const ps_ilp_problem *p; /* the problem solved (borrowed) */
    work w;
    adjacency adj;
    program g;
    bool built; /* g is built */
    int reduced_nodes, reduced_edges;
} solver;

static void solver_free(solver *sv)
{
    program_free(&sv->g, sv->w.p != NULL ? sv->w.p->n_edges : 0);
    adjacency_free(&sv->adj);
    work_free(&sv->w);
    memset(sv, 0, sizeof *sv);
}

/* Reduces p. budget > 0: strategies over it go; session: the reductions keep
 * memory's trades for the budgets to come. */
static ps_status solver_init(solver *sv, const ps_ilp_problem *p, double budget, bool session,
                             const ps_ilp_options *opt, ps_error *err)
{
    memset(sv, 0, sizeof *sv);
    sv->p = p;
    if (work_init(&sv->w, p, budget, session) != PS_OK)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    if (opt->reduce)
        PS_TRY_RET(reduce(&sv->w, err));
    if (adjacency_build(&sv->w, &sv->adj) != PS_OK)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    const ps_ilp_problem *q = sv->w.p;
    for (int v = 0; v < q->n_nodes; v++)
        sv->reduced_nodes += q->nodes[v].k > 1 && !sv->w.node_dead[v];
    for (int e = 0; e < q->n_edges; e++)
        sv->reduced_edges += !sv->w.edge_dead[e];
    return PS_OK;
}

/* Solves the prepared problem with memory <= budget (0: none; a budget of
 * its own only in a session, whose reductions kept memory's trades). */
static ps_status solver_run(solver *sv, double budget, const ps_ilp_options *opt,
                            ps_ilp_result *out, ps_error *err)
{
    ps_status st = PS_OK;
    double t0 = ps_monotonic_s();
    const ps_ilp_problem *p = sv->p;
    work *w = &sv->w;
    program *g = &sv->g;
    pricing pr = {0};
    int n = w->p->n_nodes;
    int *choice = NULL, *incumbent = NULL;
    int it_start = iterations_done(g); /* 0 until the program is built */
    memset(out, 0, sizeof *out);
    w->with_memory = budget > 0;
    w->p->mem_budget = budget;
    glp_term_hook(glpk_to_log, NULL);
    choice = calloc((size_t)n + 1, sizeof *choice);
    incumbent = calloc((size_t)n + 1, sizeof *incumbent);
    PS_TRY_ALLOC(choice, err);
    PS_TRY_ALLOC(incumbent, err);
    out->reduced_nodes = sv->reduced_nodes;
    out->reduced_edges = sv->reduced_edges;

    bool solved = false;
    if (!w->with_memory && forest_dp(w, &sv->adj, choice)) {
        out->method = out->reduced_edges == 0 && out->reduced_nodes == 0 ? "reductions"
                                                                          : "forest-dp";
        out->optimal = true;
        solved = true;
    }
    if (!solved) {
        bool have_incumbent = local_search(w, &sv->adj, incumbent);
        if (have_incumbent && !isfinite(work_evaluate(w, incumbent)))
            have_incumbent = false;
        if (!sv->built) {
            PS_TRY(program_build(w, g, err));
            sv->built = true;
        }
        if (g->mem_row != 0 && w->with_memory)
            program_budget(w, g);
        out->glpk_cols = g->cols;
        out->glpk_rows = g->rows;
        /* the iteration count runs on across a session's solves (reset
         * long before it could overflow) */
        if (iterations_done(g) > INT_MAX / 4) {
            glp_set_it_cnt(g->lp, 0);
            it_start = 0;
        }
        int it0 = iterations_done(g);
        int it_limit = opt->iteration_limit > 0 ? (int)fmin(opt->iteration_limit, INT_MAX / 4) : 0;
        limits whole = {t0 + opt->time_limit_s, it_limit > 0 ? it0 + it_limit : INT_MAX};
        if (w->with_memory && opt->lagrangian && g->lp != NULL) {
            /* half the limits at most: GLPK may need the rest */
            bool warm = g->warm;
            limits half = {t0 + 0.5 * opt->time_limit_s,
                           it_limit > 0 ? it0 + it_limit / 2 : INT_MAX};
            PS_TRY(price_memory(w, g, opt, &half, &whole, &pr, err));
            PS_LOG_DEBUG("ILP: memory priced in %d solves%s, %.3f s, %d iterations, gap %.3g%%",
                         pr.solves, warm ? " (from the last solve's basis)" : "",
                         ps_monotonic_s() - t0, iterations_done(g) - it0,
                         isfinite(pr.best_cost) && pr.best_cost > 0
                             ? 100 * (pr.best_cost - pr.bound) / pr.best_cost
                             : INFINITY);
            if (isfinite(pr.best_cost) &&
                (!have_incumbent || pr.best_cost < work_evaluate(w, incumbent))) {
                /* the relaxation's best answer that fits is the better start */
                memcpy(incumbent, pr.best, (size_t)n * sizeof *incumbent);
                have_incumbent = true;
            }
            if (pricing_closed(&pr, opt->mip_gap)) {
                memcpy(choice, pr.best, (size_t)n * sizeof *choice);
                out->method = "lagrangian";
                out->optimal = true;
                out->gap = pr.best_cost > 0 ? fmax(0, (pr.best_cost - pr.bound) / pr.best_cost)
                                            : 0;
                solved = true;
            }
        }
        if (!solved) {
            bool optimal = false;
            double gap = 1;
            ps_error inner = {0};
            st = program_solve(w, g, opt, &whole, pr.have_basis ? &pr.fit : NULL,
                               have_incumbent ? incumbent : NULL, choice, &optimal, &gap,
                               &inner);
            if (st != PS_OK && have_incumbent && st != PS_ERR_INFEASIBLE) {
                /* the pricing's bound still says how good the incumbent is */
                double kept = work_evaluate(w, incumbent);
                double bound_gap = pr.solves > 0 && isfinite(pr.bound)
                                       ? (kept - pr.bound) / kept
                                       : 1;
                if (bound_gap <= 0.01)
                    PS_LOG_DEBUG("ILP: %s; keeping the best answer priced (within %.3g%%)",
                                 inner.msg, 100 * bound_gap);
                /* not a warning: the result's gap says it, and the caller
                 * knows whether it matters (a plan reports its stages'
                 * layout_gap; a brief try at a better layout does not) */
                else if (bound_gap < 1)
                    PS_LOG_INFO("ILP: %s; keeping the best answer found, within %.3g%% of the "
                                "optimum",
                                inner.msg, 100 * bound_gap);
                else
                    PS_LOG_INFO("ILP: %s; keeping the heuristic answer, not proven near the "
                                "optimum",
                                inner.msg);
                memcpy(choice, incumbent, (size_t)n * sizeof *choice);
                optimal = false;
                gap = fmin(1, fmax(0, bound_gap));
                st = PS_OK;
            } else if (st != PS_OK) {
                if (st == PS_ERR_INFEASIBLE)
                    st = ps_error_set(err, st,
                                      "no strategy choice fits in memory: the budget is %.4g GiB "
                                      "per device and the least memory of any single choice "
                                      "per op adds up to %.4g GiB",
                                      budget / PS_GIB, ps_ilp_min_memory(p) / PS_GIB);
                else
                    st = ps_error_set(err, st, "%s", inner.msg);
                goto out;
            }
            out->method = "glpk";
            out->optimal = optimal;
            out->gap = gap;
        }
    }
    restore_eliminated(w, choice);
    /* map back to the original strategies */
    out->choice = malloc(((size_t)n + 1) * sizeof *out->choice);
    PS_TRY_ALLOC(out->choice, err);
    for (int v = 0; v < n; v++)
        out->choice[v] = w->orig[v][choice[v]];
    out->objective = ps_ilp_evaluate(p, out->choice, &out->memory);
    if (!isfinite(out->objective)) {
        st = ps_error_set(err, PS_ERR_INFEASIBLE, "every strategy choice has a forbidden pair");
        ps_ilp_result_clear(out);
        goto out;
    }
    out->solve_s = ps_monotonic_s() - t0;
out:
    out->iterations = iterations_done(g) - it_start;
    pricing_free(&pr);
    free(choice);
    free(incumbent);
    glp_term_hook(NULL, NULL);
    return st;
}

/* PS_ERR_INFEASIBLE when the least memory of p exceeds a budget (> 0). */
static ps_status check_least_memory(const ps_ilp_problem *p, double budget, ps_error *err)
{
    if (budget > 0 && ps_ilp_min_memory(p) > budget)
        return ps_error_set(err, PS_ERR_INFEASIBLE,
                            "no strategy choice fits in memory: it needs at least %.4g GiB per "
                            "device, %.4g GiB are available",
                            ps_ilp_min_memory(p) / PS_GIB, budget / PS_GIB);
    return PS_OK;
}

ps_status ps_ilp_solve(const ps_ilp_problem *p, const ps_ilp_options *opt, ps_ilp_result *out,
                       ps_error *err)
{
    ps_status st = PS_OK;
    solver sv = {0};
    memset(out, 0, sizeof *out);
    PS_TRY(ps_ilp_problem_validate(p, err));
    PS_TRY(check_least_memory(p, p->mem_budget, err));
    double t0 = ps_monotonic_s();
    PS_TRY(solver_init(&sv, p, p->mem_budget, false, opt, err));
    PS_TRY(solver_run(&sv, p->mem_budget, opt, out, err));
    out->solve_s = ps_monotonic_s() - t0;
out:
    solver_free(&sv);
    return st;
}

/* ---- tied nodes ----------------------------------------------------------------- */

/* The problem with one node per representative of `tie` (members' costs and
 * memory summed; edges between members of one tie folded into it); cid[v]:
 * the node of v's representative. */
static ps_status tie_build(const ps_ilp_problem *p, const int *tie, ps_ilp_problem **q_out,
                           int **cid_out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_ilp_problem *q = NULL;
    int *cid = malloc(((size_t)p->n_nodes + 1) * sizeof *cid);
    double *cost = NULL, *mem = NULL;
    *q_out = NULL;
    *cid_out = NULL;
    PS_TRY_ALLOC(cid, err);
    if ((st = ps_ilp_problem_create(&q)) != PS_OK) {
        st = ps_error_set(err, st, "out of memory");
        goto out;
    }
    q->mem_budget = p->mem_budget;
    int max_k = 1;
    for (int v = 0; v < p->n_nodes; v++) {
        int t = tie[v];
        if (t < 0 || t >= p->n_nodes || tie[t] != t || p->nodes[t].k != p->nodes[v].k) {
            st = ps_error_set(err, PS_ERR_INTERNAL, "ilp: bad tie of node %d to %d", v, t);
            goto out;
        }
        if (p->nodes[v].k > max_k)
            max_k = p->nodes[v].k;
    }
    cost = calloc((size_t)max_k, sizeof *cost);
    mem = calloc((size_t)max_k, sizeof *mem);
    PS_TRY_ALLOC(cost, err);
    PS_TRY_ALLOC(mem, err);
    for (int v = 0; v < p->n_nodes; v++) {
        cid[v] = -1;
        if (tie[v] != v)
            continue;
        if ((st = ps_ilp_add_node(q, p->nodes[v].k, cost, mem, &cid[v])) != PS_OK) {
            st = ps_error_set(err, st, "out of memory");
            goto out;
        }
    }
    for (int v = 0; v < p->n_nodes; v++) { /* members add their costs */
        ps_ilp_node *n = &q->nodes[cid[tie[v]]];
        for (int s = 0; s < n->k; s++) {
            n->cost[s] += p->nodes[v].cost[s];
            n->mem[s] += p->nodes[v].mem[s];
        }
    }
    for (int e = 0; e < p->n_edges; e++) {
        const ps_ilp_edge *ed = &p->edges[e];
        int u = tie[ed->u], v = tie[ed->v];
        if (u == v) { /* both ends tied together: only the diagonal can happen */
            ps_ilp_node *n = &q->nodes[cid[u]];
            for (int s = 0; s < n->k; s++)
                n->cost[s] += ed->cost[s * n->k + s];
            continue;
        }
        if ((st = ps_ilp_add_edge(q, cid[u], cid[v], ed->cost)) != PS_OK) {
            st = ps_error_set(err, st, "out of memory");
            goto out;
        }
    }
    for (int v = 0; v < p->n_nodes; v++)
        cid[v] = cid[tie[v]];
    *q_out = q;
    *cid_out = cid;
    q = NULL;
    cid = NULL;
out:
    free(cid);
    free(cost);
    free(mem);
    ps_ilp_problem_free(q);
    return st;
}

/* A result of the tied problem as one of p: every member takes its
 * representative's strategy. Takes qr's choice over. */
static ps_status tie_expand(const ps_ilp_problem *p, const int *cid, ps_ilp_result *qr,
                            ps_ilp_result *out, ps_error *err)
{
    int *choice = malloc(((size_t)p->n_nodes + 1) * sizeof *choice);
    if (choice == NULL) {
        ps_ilp_result_clear(qr);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    for (int v = 0; v < p->n_nodes; v++)
        choice[v] = qr->choice[cid[v]];
    free(qr->choice);
    *out = *qr;
    memset(qr, 0, sizeof *qr);
    out->choice = choice;
    out->objective = ps_ilp_evaluate(p, out->choice, &out->memory);
    return PS_OK;
}

ps_status ps_ilp_solve_tied(const ps_ilp_problem *p, const int *tie, const ps_ilp_options *opt,
                            ps_ilp_result *out, ps_error *err)
{
    if (tie == NULL)
        return ps_ilp_solve(p, opt, out, err);
    ps_status st = PS_OK;
    ps_ilp_problem *q = NULL;
    int *cid = NULL;
    ps_ilp_result qr = {0};
    memset(out, 0, sizeof *out);
    PS_TRY(tie_build(p, tie, &q, &cid, err));
    PS_TRY(ps_ilp_solve(q, opt, &qr, err));
    PS_TRY(tie_expand(p, cid, &qr, out, err));
out:
    free(cid);
    ps_ilp_problem_free(q);
    return st;
}

/* ---- sessions ------------------------------------------------------------------- */

struct ps_ilp_session {
    const ps_ilp_problem *p; /* the caller's (borrowed) */
    ps_ilp_problem *q;       /* the tied problem, or NULL: p is solved itself */
    int *cid;                /* [p's nodes] q's node of each (tied) */
    solver sv;
};

ps_status ps_ilp_session_create(const ps_ilp_problem *p, const int *tie, const ps_ilp_options *opt,
                                ps_ilp_session **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_ilp_session *s = calloc(1, sizeof *s);
    *out = NULL;
    PS_TRY_ALLOC(s, err);
    PS_TRY(ps_ilp_problem_validate(p, err));
    s->p = p;
    if (tie != NULL)
        PS_TRY(tie_build(p, tie, &s->q, &s->cid, err));
    PS_TRY(solver_init(&s->sv, s->q != NULL ? s->q : p, 0, true, opt, err));
    *out = s;
    s = NULL;
out:
    ps_ilp_session_free(s);
    return st;
}

ps_status ps_ilp_session_solve(ps_ilp_session *s, double budget, const ps_ilp_options *opt,
                               ps_ilp_result *out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_ilp_result qr = {0};
    memset(out, 0, sizeof *out);
    if (isnan(budget))
        return ps_error_set(err, PS_ERR_INVALID, "ilp: the memory budget is not a number");
    PS_TRY(check_least_memory(s->p, budget, err));
    PS_TRY(solver_run(&s->sv, budget > 0 ? budget : 0, opt, s->q != NULL ? &qr : out, err));
    if (s->q != NULL)
        PS_TRY(tie_expand(s->p, s->cid, &qr, out, err));
out:
    ps_ilp_result_clear(&qr);
    return st;
}

void ps_ilp_session_free(ps_ilp_session *s)
{
    if (s == NULL)
        return;
    solver_free(&s->sv);
    ps_ilp_problem_free(s->q);
    free(s->cid);
    free(s);
}

void ps_ilp_thread_done(void) { glp_free_env(); }
