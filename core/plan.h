/* Plans: the contract between the planner and every backend.
 *
 * A plan names its model (a zoo config or an embedded forward graph, kept as
 * JSON that the planner interprets) and embeds its cluster, then lists the
 * pipeline stages: layer range, physical devices, submesh and logical mesh,
 * the sharding strategy of every op of the stage and the layout of every
 * tensor, and the planner's predictions. docs/plan-format.md describes the
 * file. The plan owns all of its memory. */
#ifndef PS_CORE_PLAN_H
#define PS_CORE_PLAN_H

#include <jansson.h>

#include "core/cluster.h"
#include "core/profile_db.h"
#include "core/sharding.h"

#define PS_PLAN_VERSION 1

typedef struct ps_plan_op {
    char *name;
    char *strategy;
    int n_in, n_out;
    ps_sharding_spec in[PS_MAX_OP_IO];  /* layouts the op reads */
    ps_sharding_spec out[PS_MAX_OP_IO]; /* layouts it produces */
    double compute_s, comm_s;           /* predicted, per execution */
} ps_plan_op;

typedef struct ps_plan_tensor {
    char *name;
    ps_sharding_spec spec; /* as produced (or stored, for sources) */
} ps_plan_tensor;

typedef struct ps_plan_stage {
    int first_layer, last_layer; /* layer tags, inclusive */
    int n_devices;
    int *devices;                /* global ids, row-major over the logical mesh */
    int submesh[2];              /* hosts, devices per host */
    int logical_mesh[2];         /* d0, d1 */
    bool force_batch_axis0;      /* the ILP kept the batch dimension on mesh axis 0 */
    /* predictions (seconds per micro-batch; update per step) */
    double forward_s, backward_s, update_s;
    double time_s;               /* forward + backward of one micro-batch */
    /* per micro-batch: this stage's forward outputs to later stages, its
     * backward outputs to earlier ones (busiest device, nothing contending) */
    double send_forward_s, send_backward_s;
    double peak_memory_bytes, weight_bytes, gradient_bytes, optimizer_bytes,
        activation_bytes;
    /* the stage's sharding is proven within this fraction of the best its
     * intra-op ILP could do on its mesh (by the ILP's own objective; 0:
     * optimal), as far as the solve's time limit and gap let it prove */
    double layout_gap;
    int n_ops, n_tensors;
    ps_plan_op *ops;
    ps_plan_tensor *tensors;
} ps_plan_stage;

typedef struct ps_plan {
    int version;
    char *model_name;
    json_t *model;       /* owned: {"name", "zoo" + "config"} or {"name", "graph"} */
    json_t *training;    /* owned: training-step options (remat, optimizer dtype, ...) */
    ps_cluster *cluster; /* owned */
    char method[16];     /* shard, data, zero2, zero3, pipeshard, uniform, manual */
    char schedule[16];   /* 1f1b, gpipe */
    long long global_batch;
    int micro_batches;   /* the global batch is split into this many */
    int n_stages;
    ps_plan_stage *stages;
    /* predictions */
    double iteration_s, tflops_per_device, mfu, peak_memory_bytes;
    double flops_per_step;
    /* the profile DB the predictions were made with (ps_plan_record_profile):
     * its device kind, backend and digest; digest "" when none */
    char profile_device[PS_PROFILE_NAME_MAX];
    char profile_backend[8];
    char profile_digest[17];
    /* owned: the document a loaded plan was read from (ps_plan_load,
     * ps_plan_parse), so that what reads its model and training later
     * points into the file; NULL for a plan made in memory */
    struct ps_json_doc *source;
} ps_plan;

ps_status ps_plan_create(ps_plan **out);
void ps_plan_free(ps_plan *p);
/* Adds a stage with room for n_ops ops and n_tensors tensors (zeroed). */
ps_status ps_plan_add_stage(ps_plan *p, int n_devices, int n_ops, int n_tensors,
                            ps_plan_stage **out);

/* Structural checks: stages cover consecutive layer ranges, devices exist in
 * the cluster and are used once, meshes multiply out, specs well formed.
 * (Checks against the model's graph are the planner's: ps_plan_check_graph.) */
ps_status ps_plan_validate(const ps_plan *p, ps_error *err);

ps_status ps_plan_to_json(const ps_plan *p, json_t **out);
ps_status ps_plan_save(const ps_plan *p, const char *path, ps_error *err);
ps_status ps_plan_load(const char *path, ps_plan **out, ps_error *err);
/* The same from text held in memory; name is used in messages. */
ps_status ps_plan_parse(const char *name, const char *text, ps_plan **out, ps_error *err);
/* A short digest of the plan (hex of a hash of its content without the
 * predictions and the profile DB record), for run summaries to name the
 * plan they ran. */
void ps_plan_digest(const ps_plan *p, char *buf, int cap);
/* Records the profile DB the plan's predictions were made with (NULL:
 * none), so that `sim` can tell when it lowers the plan with another. The
 * DB must be finished. */
ps_status ps_plan_record_profile(ps_plan *p, const ps_profile_db *db, ps_error *err);

#endif
