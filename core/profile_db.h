/* Profile DB: measured GEMM and communication times of one device kind on
 * one backend (docs/profile-db.md), and the lookups the cost model makes in
 * it instead of its analytic defaults.
 *
 * It lives in core/ because three layers share it: exec/ measures and
 * writes it (exec/profile.c), the cluster carries a borrowed pointer to it,
 * and the planner's cost model reads it. Nothing here knows about meshes.
 *
 * Sizes follow nccl-tests: `bytes` of all-reduce and all-to-all is the local
 * buffer, of all-gather the gathered (output) size, of reduce-scatter the
 * input size, of send-recv the message (the cost model's conventions too).
 * algbw = bytes / seconds; busbw = algbw x 2(n-1)/n for all-reduce,
 * x (n-1)/n for all-gather, reduce-scatter and all-to-all, x 1 for
 * send-recv. A GEMM of m x k by k x n counts 2 m n k FLOPs, a batch of b
 * of them 2 b m n k.
 *
 * Lookups interpolate, per table (one per GEMM dtype, one per
 * communication kind and group size), over times made monotone in size
 * (each time is at least every time of a smaller size: noise never makes a
 * larger message cheaper):
 *   size <= smallest        the smallest's time (latency-bound)
 *   between two sizes       linear in size between the neighbours
 *   size > largest          size / (the largest's rate): its bandwidth
 * A group size between two measured ones is interpolated linearly in n;
 * outside the measured range the nearest one is used with its busbw (time
 * scaled by the ratio of the busbw factors). */
#ifndef PS_CORE_PROFILE_DB_H
#define PS_CORE_PROFILE_DB_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/collective.h"
#include "core/dtype.h"
#include "core/op.h"
#include "core/status.h"

#define PS_PROFILE_DB_VERSION 1
/* Most passes of one measurement (ps_profile_db_median_passes). */
#define PS_PROFILE_MAX_PASSES 64
#define PS_PROFILE_NAME_MAX 64

/* What a communication entry measured: the four collectives (same values
 * as ps_collective) and a point-to-point send/receive. */
typedef enum ps_profile_comm {
    PS_PROFILE_ALL_REDUCE = PS_COLL_ALL_REDUCE,
    PS_PROFILE_ALL_GATHER = PS_COLL_ALL_GATHER,
    PS_PROFILE_REDUCE_SCATTER = PS_COLL_REDUCE_SCATTER,
    PS_PROFILE_ALL_TO_ALL = PS_COLL_ALL_TO_ALL,
    PS_PROFILE_SEND_RECV = PS_COLL_COUNT,
    PS_PROFILE_COMM_COUNT
} ps_profile_comm;

/* "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv". */
extern const char *const ps_profile_comm_names[PS_PROFILE_COMM_COUNT];

/* busbw / algbw: 2(n-1)/n, (n-1)/n or 1 (0 for n < 2). */
double ps_profile_busbw_factor(ps_profile_comm kind, int n);

/* A GEMM-shaped op timed at one shape: a MATMUL (the GEMMs proper), or a
 * convolution (conv2d and its two gradients) under the GEMM it amounts to
 * (ps_conv_gemm_shape). Lookups keep the kinds apart. */
typedef struct ps_profile_gemm {
    ps_op_kind op; /* PS_OP_MATMUL (0, the default) or a conv2d kind */
    int64_t m, n, k;
    int64_t batch;  /* independent GEMMs of that shape in one call; 0 or 1: one */
    ps_dtype dtype; /* fp32, fp16 or bf16 */
    double seconds; /* median of the repetitions */
} ps_profile_gemm;

/* True for the kinds a GEMM entry times: MATMUL and the convolutions. */
bool ps_profile_gemm_kind(ps_op_kind kind);
/* 2 batch m n k of an entry (a batch of 0 counts as 1). */
double ps_profile_gemm_flops(const ps_profile_gemm *g);

typedef struct ps_profile_comm_entry {
    ps_profile_comm kind;
    int n;          /* group size (2 for send-recv) */
    int64_t bytes;  /* nccl-tests size, see above */
    double seconds; /* median of the repetitions */
} ps_profile_comm_entry;

/* One table of the lookups: sizes ascending, monotone times. */
/* A non-GEMM op of kind `op` timed through the backend's own kernel on one
 * device: `bytes` is what it reads and writes (its inputs' and outputs'
 * sizes, as the cost model counts a tile's), `seconds` one call. The cost
 * model charges an op of that kind by its bytes from these. */
typedef struct ps_profile_op {
    ps_op_kind op;
    int64_t bytes;
    double seconds;
} ps_profile_op;

typedef struct ps_profile_table {
    /* ps_profile_comm; -1: a GEMM table (n: its op kind x
     * PS_FLOAT_DTYPE_COUNT + its dtype, the dtype for MATMULs); -2: an op
     * table (n: its ps_op_kind) */
    int kind;
    int n; /* group size; see kind */
    int count;
    double *size; /* bytes or FLOPs */
    double *seconds;
} ps_profile_table;

typedef struct ps_profile_db {
    char device[PS_PROFILE_NAME_MAX];  /* device kind, e.g. "a100-sxm4-80gb" or "cpu" */
    char backend[PS_PROFILE_NAME_MAX]; /* "cpu" or "cuda" */
    int devices;                       /* devices the measurement used */
    /* devices that ran each GEMM and op together while they were timed: 1
     * (alone, the default) or all of them (profile --gemm-all-devices: on
     * the CPU backend the times then include the sharing of the cores) */
    int devices_at_once;
    int n_gemm, cap_gemm;
    ps_profile_gemm *gemm; /* sorted by op, dtype, FLOPs, batch, m, n, k after finish */
    int n_comm, cap_comm;
    ps_profile_comm_entry *comm; /* sorted by kind, n, bytes after finish */
    int n_op, cap_op;
    ps_profile_op *ops; /* sorted by op kind, bytes after finish */
    /* built by ps_profile_db_finish; lookups read only these */
    int n_tables;
    ps_profile_table *tables;
    bool finished;
} ps_profile_db;

extern const char *const ps_profile_backend_names[2]; /* "cpu", "cuda" */

/* An empty DB (no entries); backend must be "cpu" or "cuda". */
ps_status ps_profile_db_create(const char *device, const char *backend, int devices,
                               ps_profile_db **out, ps_error *err);
void ps_profile_db_free(ps_profile_db *db);
/* Append entries (checked: positive sizes and times, a float dtype, a known
 * kind, n >= 2, send-recv with n = 2). The DB needs ps_profile_db_finish
 * again before lookups. */
ps_status ps_profile_db_add_gemm(ps_profile_db *db, const ps_profile_gemm *e, ps_error *err);
ps_status ps_profile_db_add_comm(ps_profile_db *db, const ps_profile_comm_entry *e, ps_error *err);
/* (checked: a kind other than the GEMM-shaped ones, positive bytes and time) */
ps_status ps_profile_db_add_op(ps_profile_db *db, const ps_profile_op *e, ps_error *err);
/* Passes of one measurement into one DB: dbs[0..n) hold the same entries
 * in the same order (as measured, none finished); each of dbs[0]'s times
 * becomes the median of that entry's n times (n even: the mean of the two
 * middle ones), so that a spell of the machine that slowed one pass does
 * not decide an entry. PS_ERR_INTERNAL when the passes' entries differ. */
ps_status ps_profile_db_median_passes(ps_profile_db *const *dbs, int n, ps_error *err);
/* Sorts the entries, rejects duplicates (same shape and dtype, or same
 * kind, n and bytes) and an empty DB, and builds the lookup tables. */
ps_status ps_profile_db_finish(ps_profile_db *db, ps_error *err);

/* A DB file; errors point into it ("FILE:LINE:COL: PATH: what"). */
ps_status ps_profile_db_load(const char *path, ps_profile_db **out, ps_error *err);
/* The same from text in memory (name is used in messages). */
ps_status ps_profile_db_parse(const char *name, const char *text, ps_profile_db **out,
                              ps_error *err);
/* The file format, with the derived flops_per_s, algbw and busbw; loading
 * it gives an equal DB. The DB must be finished. */
ps_status ps_profile_db_to_json(const ps_profile_db *db, json_t **out);
ps_status ps_profile_db_save(const ps_profile_db *db, const char *path, ps_error *err);
bool ps_profile_db_equal(const ps_profile_db *a, const ps_profile_db *b);
/* 16 hex digits naming the DB's content (ps_json_digest of its file form;
 * cap >= 17): a plan records the DB it was made with by it. The DB must be
 * finished (else PS_ERR_INVALID and buf ""). */
ps_status ps_profile_db_digest(const ps_profile_db *db, char *buf, int cap);

/* Lookups (finished DB). Seconds of a GEMM (a MATMUL entry) of `flops`
 * FLOPs of dtype: 0 for flops <= 0, -1 when the DB has no GEMM of that
 * dtype. */
double ps_profile_gemm_s(const ps_profile_db *db, ps_dtype dtype, double flops);
/* flops / ps_profile_gemm_s; 0 when there is no entry or flops <= 0. */
double ps_profile_gemm_flops_per_s(const ps_profile_db *db, ps_dtype dtype, double flops);
/* Seconds of a GEMM of that shape and dtype, by the first that applies:
 *  1. the DB measured that very shape (batch, m, n, k): its time;
 *  2. the GEMMs of similar shape, those whose arithmetic intensity
 *     2mnk / (mk + kn + mn) is within x2 of the shape's
 *     (PS_PROFILE_GEMM_INTENSITY_BAND), bracket its FLOPs or include one
 *     within x4 of them (PS_PROFILE_GEMM_FLOPS_NEAR): the interpolation
 *     above by FLOPs among them alone;
 *  3. ps_profile_gemm_s of its FLOPs (every GEMM of the dtype), kept
 *     between what those similar GEMMs bound: at most the time of the
 *     smallest when all are more than x4 larger, at least the largest's
 *     time extrapolated to x4 its FLOPs when all are more than x4 smaller,
 *     so that the time never drops as a shape grows past their range.
 * A thin or batched GEMM (attention's per-head products) runs far below a
 * square one of equal FLOPs; 2 gives it the rate of its own kind where the
 * DB measured that kind. 0 for an empty shape, -1 when the DB has no GEMM of
 * that dtype. */
#define PS_PROFILE_GEMM_INTENSITY_BAND 2.0
#define PS_PROFILE_GEMM_FLOPS_NEAR 4.0
double ps_profile_gemm_shape_s(const ps_profile_db *db, ps_dtype dtype, const ps_gemm_shape *shape);
/* The same rules among the entries of one GEMM-shaped kind (MATMUL: as
 * ps_profile_gemm_shape_s; a convolution: its ps_conv_gemm_shape among the
 * convolutions of that kind, rule 3 by their FLOPs alone). -1 when the DB
 * has no entry of that kind and dtype, or (a convolution) when the shape's
 * FLOPs exceed x4 (PS_PROFILE_GEMM_FLOPS_NEAR) its kind's largest entry's:
 * the caller may then look the shape up as a MATMUL. */
double ps_profile_gemm_op_shape_s(const ps_profile_db *db, ps_op_kind op, ps_dtype dtype,
                                  const ps_gemm_shape *shape);
/* Seconds of a non-GEMM op of that kind reading and writing `bytes`: 0 for
 * bytes <= 0, -1 when the DB has no entry of that kind. */
double ps_profile_op_s(const ps_profile_db *db, ps_op_kind kind, double bytes);
/* Seconds of a communication among n devices (ignored for send-recv):
 * 0 for n < 2 or bytes <= 0, -1 when the DB has no entry of that kind. */
double ps_profile_collective_s(const ps_profile_db *db, ps_profile_comm kind, int n, double bytes);

#endif
