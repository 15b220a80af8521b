/* The inter-op pass: pipeline stages on slices of the cluster (Alpa's
 * pipeshard plans). Layers are built (auto clustering or manual
 * boundaries), every range of consecutive layers is costed on every
 * candidate submesh and logical mesh by the intra-op pass (identical ranges
 * share their entries), the stage DP picks stages, submeshes are placed on
 * physical devices, and each stage's sharding is written into the plan. */
#ifndef PS_PLANNER_INTER_PASS_H
#define PS_PLANNER_INTER_PASS_H

#include "planner/plan_intra.h"

typedef enum ps_submesh_choices {
    PS_SUBMESH_POWER_OF_TWO = 0,       /* (1,1), (1,2), (1,4) ... (1,M), (2,M), (4,M) ... */
    PS_SUBMESH_SMALL_POWER_OF_TWO = 1, /* the same up to 4 hosts */
    PS_SUBMESH_ALL = 2,                /* (1,1) ... (1,M), (2,M), (3,M) ... (N,M) */
    PS_SUBMESH_MANUAL = 3,             /* ps_inter_options.manual_submeshes */
    PS_SUBMESH_CHOICES_COUNT
} ps_submesh_choices;

#define PS_MAX_MANUAL_SUBMESHES 64

extern const char *const ps_submesh_choices_names[PS_SUBMESH_CHOICES_COUNT];

typedef struct ps_inter_options {
    int layer_num;      /* layers to cluster into; 0: the manual boundaries if the model
                           has any, else min(layer tags, 16) */
    bool manual_layers; /* use the model's pipeline boundaries */
    ps_submesh_choices submeshes;
    /* PS_SUBMESH_MANUAL: the candidate submeshes (hosts, devices per host),
     * as Alpa's manually specified submeshes: each within one node
     * (hosts 1, devices up to a node's) or of whole nodes (devices a node's) */
    int manual_submeshes[PS_MAX_MANUAL_SUBMESHES][2];
    int n_manual_submeshes;
    bool gpipe;         /* schedule: GPipe (all forwards, then all backwards) instead of 1F1B */
    bool print_rows;    /* print the stage cost table rows on stdout */
    /* Solve every range of layers; by default only single layers are solved
     * and longer ranges composed from them (Alpa's profile-and-compose),
     * which is L instead of L(L+1)/2 solves per configuration. */
    bool exact_ranges;
    double stage_time_limit_s; /* ILP limit per table entry (default 20 s; the
                                * request's ILP limit caps it) */
    /* Add to each stage's cost what it receives per micro-batch (its input
     * activations, its outputs' gradients) over the links into its devices:
     * in 1F1B a stage's cycle grows by it (planner/pipeline_time.h). false:
     * Alpa's stage costs, compute and the stage's own communication only. */
    bool transfer_costs;
    /* Alpa's stage imbalance tolerance t: a stage of layers [l, i] on a submesh
     * is a candidate only when the submesh's share of the cluster's devices
     * lies within [f / (1 + t), f * (1 + t)], f the layers' share of the
     * model's forward FLOPs (INFINITY, the default: every stage; Alpa's
     * benchmarks use 1). Single layers are solved only on the submeshes some
     * candidate range needs them on. A stage on the whole cluster holds all
     * layers whatever t is (the submeshes cover the cluster). */
    double stage_imbalance_tolerance;
    /* Pipelines solved and timed per run of the stage DP (default 2): its
     * best, then the best of each other stage count whose DP objective is
     * within 10% of it, nearest first; the plan keeps the fastest schedule.
     * The objective leaves out how transfers stretch the schedule and the
     * traffic of shared parameters (a tied embedding) between the first and
     * last stages once per step. 1: Alpa's DP answer alone. */
    int stage_candidates;
    /* A stage the DP took by its lean entry is also solved as the fastest
     * layout within the memory (where the lean layout is 5% or more slower
     * than the fastest), each of its two solves stopped after this many
     * GLPK simplex iterations (ps_ilp_options.iteration_limit: the same
     * stop on any machine at any load, so the plan does not depend on
     * them; default in inter_pass.c; 0: never), and kept when it fits and
     * is faster. */
    double lean_twin_iterations;
    /* Choose recomputation stage by stage (--remat=auto): every table entry
     * is also costed with its layers recomputed, and the stage DP takes
     * whichever is faster within the memory, so a stage keeping many
     * micro-batches in flight may recompute while the others do not. The
     * plan records the recomputed layers (training.remat_layers). Needs a
     * request without remat of its own. */
    bool remat_by_stage;
    /* Refuse at once, before any stage is costed, a request whose step
     * cannot fit the devices together (ps_intra_step_bytes: weights,
     * optimizer state, gradients and the micro-batches' kept activations
     * at their full size above the devices' memory summed), as solving it
     * would only end in "no plan fits" (default true; false solves anyway:
     * the tests check the two agree). */
    bool memory_floor_check;
    /* Stages of different candidate pipelines that solve alike (the same
     * slice on meshes of equal costs, configuration and micro-batches in
     * flight: the middle stages of candidates of different stage counts)
     * take one solve's layout, stages of the same slice and mesh one
     * fastest layout, and lean stages reading one fastest layout one lean
     * layout (default true; false solves each candidate on its own and a
     * lean layout at each refit of each stage, as before: the same plans,
     * in more time, which the tests check). */
    bool share_layouts;
    /* Where non-NULL, the candidates' stage solves are counted into it
     * (added to what it holds). */
    struct ps_inter_solve_counts *solve_counts;
    /* Called (when non-NULL) with every candidate pipeline realized, in the
     * order the DP found them, with its DP objective (s per iteration) and
     * whether the plan keeps it; the plan is the callee's to read only,
     * during the call. */
    void (*on_candidate)(void *ctx, const ps_plan *candidate, double dp_iteration_s, bool kept);
    void *on_candidate_ctx;
} ps_inter_options;

/* The solves of the candidate pipelines' stages: their fastest layouts
 * (solved, and taken from another candidate's stage), lean layouts
 * (solved, and taken by another stage) and layouts within the memory
 * (solved, and taken from another candidate's stage). */
typedef struct ps_inter_solve_counts {
    int stages;
    int fastest_solved, fastest_borrowed;
    int lean_solved, lean_reused;
    int within_solved, within_borrowed;
} ps_inter_solve_counts;

ps_inter_options ps_inter_options_default(void);

/* Parses a manual submesh list "HxD,HxD,..." (e.g. "1x2,1x4,2x8") into o
 * (o->submeshes becomes PS_SUBMESH_MANUAL); PS_ERR_INVALID with a message
 * on a malformed list. Whether each fits a cluster is checked when planning. */
ps_status ps_inter_parse_submeshes(const char *list, ps_inter_options *o, ps_error *err);

/* Plans req (its method and mesh fields are ignored). */
ps_status ps_plan_pipeshard(const ps_plan_request *req, const ps_inter_options *o,
                            ps_plan **out, ps_error *err);

/* Also chooses the number of micro-batches (and so the micro-batch size)
 * among the divisors B of the global batch up to 128: a coarse sweep (for
 * each power of two, the largest divisor not above it), then every divisor
 * between the best one's coarse neighbours, each planned with the model
 * rebuilt for micro-batches of global / B samples; the fastest plan that
 * fits is kept. Needs a zoo model (req->config); the
 * req's forward graph and micro_batches are ignored. */
ps_status ps_plan_pipeshard_search(const ps_plan_request *req, const ps_inter_options *o,
                                   ps_plan **out, ps_error *err);

/* A stage given by the user (Alpa's ManualStageOption) or by the uniform
 * 3-D plan. */
typedef struct ps_manual_stage {
    int first_layer, last_layer; /* built layers, inclusive */
    int submesh[2];              /* hosts, devices per host */
    int logical_mesh[2];         /* d0, d1 with d0 * d1 = hosts * devices */
    bool force_batch_axis0;
    /* remat_given: this stage's layers are recomputed (remat) or not,
     * whatever the request's remat says (a stage file's "remat") */
    bool remat_given, remat;
} ps_manual_stage;

/* Plans the given stages: layers built as o says (layer_num / manual),
 * stages checked to cover them in order on submeshes that fit the cluster,
 * each sharded by the intra-op pass. */
ps_status ps_plan_manual(const ps_plan_request *req, const ps_inter_options *o,
                         const ps_manual_stage *stages, int n, ps_plan **out, ps_error *err);

/* Alpa's uniform 3-D plan: pp stages of equal FLOPs (layers clustered into
 * pp), each on a dp x op mesh with the batch on the dp axis; dp * op * pp
 * must be the cluster's device count. */
ps_status ps_plan_uniform(const ps_plan_request *req, const ps_inter_options *o, int dp, int op,
                          int pp, ps_plan **out, ps_error *err);

#endif
