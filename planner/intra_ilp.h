/* The intra-op integer program, independent of what its nodes mean.
 *
 * Nodes pick one of k strategies (node cost in seconds, memory in bytes per
 * device); an edge (u, v) adds cost[i * k_v + j] when u picks i and v picks j
 * (resharding); INFINITY forbids a pair. Minimize total cost, optionally with
 * total memory <= budget. This module makes the instance small by exact
 * reductions, computes an incumbent (exact on forests, local search plus a
 * memory repair otherwise), and hands the rest to GLPK as a 0-1 program with
 * one-hot node variables and linearized edge variables (one per pair of
 * classes of equal rows and columns of the edge's costs). Nodes with one or
 * two neighbours (followers: elementwise chains, reshapes) are eliminated
 * exactly first (under a memory constraint, those whose memory is the same
 * in every strategy). With a memory constraint, memory is first priced
 * (Lagrangian relaxation, re-solving one relaxation warm per price) and GLPK
 * only branches when that leaves a gap, from the last basis that fit. It is
 * the only module that includes glpk.h. */
#ifndef PS_PLANNER_INTRA_ILP_H
#define PS_PLANNER_INTRA_ILP_H

#include <stdbool.h>

#include "core/status.h"

typedef struct ps_ilp_node {
    int k;
    double *cost; /* [k] seconds */
    double *mem;  /* [k] bytes per device */
} ps_ilp_node;

typedef struct ps_ilp_edge {
    int u, v;
    double *cost; /* [k_u * k_v], row-major in u's strategy */
} ps_ilp_edge;

typedef struct ps_ilp_problem {
    int n_nodes, n_edges, cap_nodes, cap_edges;
    ps_ilp_node *nodes;
    ps_ilp_edge *edges;
    double mem_budget; /* bytes per device; <= 0: no memory constraint */
} ps_ilp_problem;

ps_status ps_ilp_problem_create(ps_ilp_problem **out);
void ps_ilp_problem_free(ps_ilp_problem *p);
/* Copies cost/mem (mem may be NULL: zeros). */
ps_status ps_ilp_add_node(ps_ilp_problem *p, int k, const double *cost, const double *mem,
                          int *id_out);
/* Copies cost (k_u * k_v entries). u != v, both existing. */
ps_status ps_ilp_add_edge(ps_ilp_problem *p, int u, int v, const double *cost);
/* Checks sizes, indices and values (no NaN, costs >= 0 or INFINITY). */
ps_status ps_ilp_problem_validate(const ps_ilp_problem *p, ps_error *err);

typedef struct ps_ilp_options {
    double time_limit_s; /* GLPK's limit in wall-clock seconds (default 60) */
    double iteration_limit; /* GLPK's limit in simplex iterations, relaxations and
                             * branch and cut together (default 0: none). Unlike the
                             * time limit it stops a solve at the same point on any
                             * machine under any load, so its answer is reproducible */
    double mip_gap;      /* relative gap at which GLPK may stop (default 1e-4) */
    int stall_iterations; /* GLPK stops with its best answer when the gap between it
                           * and the bound has not narrowed by a tenth in this much
                           * branch and cut (its simplex iterations, and a node of its
                           * tree as rows^2 / 150,000 of them, at least 10), or in 20
                           * root relaxations' iterations if that is fewer (but at
                           * least stall_iterations / 8) (default in intra_ilp.c;
                           * 0: never) */
    bool reduce;         /* apply the exact reductions first (default true) */
    bool lagrangian;     /* with a memory budget, bisect a price on memory first and
                          * stop there when its bound proves the answer within
                          * mip_gap (default true) */
} ps_ilp_options;

ps_ilp_options ps_ilp_options_default(void);

typedef struct ps_ilp_result {
    int *choice;       /* [n_nodes] strategy per node (owned; free with ps_ilp_result_clear) */
    double objective;  /* total cost of `choice` */
    double memory;     /* total memory of `choice` */
    bool optimal;      /* proven optimal (within mip_gap) */
    double gap;        /* relative gap of the answer when not proven (0 when optimal) */
    double solve_s;    /* wall time of the whole solve */
    long long iterations; /* GLPK's simplex iterations in it (ps_ilp_options.iteration_limit
                           * counts them; the same on any machine) */
    int reduced_nodes, reduced_edges; /* size after reductions */
    int glpk_cols, glpk_rows;         /* the 0-1 program's size; 0 when none was built
                                       * (the reductions or the forest DP sufficed) */
    const char *method; /* "reductions" (nothing left to search), "forest-dp",
                         * "lagrangian" (a memory budget met by pricing memory), "glpk" */
} ps_ilp_result;

void ps_ilp_result_clear(ps_ilp_result *r);

/* The least memory any choice needs (memory does not depend on edges, so it
 * is the sum of each node's least). */
double ps_ilp_min_memory(const ps_ilp_problem *p);

/* Total cost and memory of a given choice (INFINITY if a pair is forbidden). */
double ps_ilp_evaluate(const ps_ilp_problem *p, const int *choice, double *memory_out);

/* Solves p. PS_ERR_INFEASIBLE (with the least memory any choice needs and the
 * budget in the message) when no choice fits the budget or every choice has
 * a forbidden pair. */
ps_status ps_ilp_solve(const ps_ilp_problem *p, const ps_ilp_options *opt, ps_ilp_result *out,
                       ps_error *err);

/* Solves p with tied nodes: node v must take the same strategy as tie[v]
 * (a representative with tie[tie[v]] == tie[v] and the same k). The program
 * GLPK sees has one node per representative, carrying the summed costs and
 * memory of its members, so identical layers cost one layer's solve. The
 * result covers every node of p. tie == NULL solves p as is. */
ps_status ps_ilp_solve_tied(const ps_ilp_problem *p, const int *tie, const ps_ilp_options *opt,
                            ps_ilp_result *out, ps_error *err);

/* A session solves one problem several times, each time within a memory
 * budget of its own (a stage refit with less room, a plain twin): the
 * reductions are made once, keeping every trade of cost for memory (a node
 * is eliminated only where its memory is the same in every strategy, as
 * any budgeted solve does), and each 0-1 program relaxation after the
 * first goes on from the basis the last one left. p (and tie, as
 * ps_ilp_solve_tied's; NULL: none) are read at creation; p must outlive
 * the session, and its mem_budget is ignored. */
typedef struct ps_ilp_session ps_ilp_session;

ps_status ps_ilp_session_create(const ps_ilp_problem *p, const int *tie, const ps_ilp_options *opt,
                                ps_ilp_session **out, ps_error *err);
/* As ps_ilp_solve_tied with p->mem_budget = budget (<= 0: none; a solve
 * without a budget is faster by ps_ilp_solve, which reduces more). opt's
 * reduce is the session's. */
ps_status ps_ilp_session_solve(ps_ilp_session *s, double budget, const ps_ilp_options *opt,
                               ps_ilp_result *out, ps_error *err);
void ps_ilp_session_free(ps_ilp_session *s);

/* Releases the solver's per-thread state (GLPK keeps an environment per
 * thread); call at the end of a thread that solved programs. */
void ps_ilp_thread_done(void);

/* Exhaustive search, for tests: at most max_combinations choices. */
ps_status ps_ilp_brute_force(const ps_ilp_problem *p, double max_combinations,
                             ps_ilp_result *out, ps_error *err);

#endif
