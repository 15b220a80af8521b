/* Per-device programs: what the lowering makes of a plan, and what every
 * backend (the SimGrid replay, the CPU and CUDA executors) runs.
 *
 * Two levels, as in Alpa's runtime. A *kernel* is the SPMD code of one
 * stage's phase (forward, backward with recomputation, update) for one
 * micro-batch: local ops on sharded tiles, the collectives inside the
 * stage's mesh (over mesh axis 0 or 1: each device resolves the group from
 * its own mesh coordinate), data loads, allocations and frees. Every device
 * of a stage runs the same kernels. A device's *program* is the schedule:
 * RUN kernel k for micro-batch mb, SEND/RECV of tiles between stages
 * (cross-mesh resharding), collectives on explicit groups (the all-gather
 * after a "local all-gather" transfer), and the allocation of what lives for
 * the whole step (parameters, optimizer state, gradient accumulators,
 * received buffers).
 *
 * A *buffer* is a tensor of the training step in one layout on one stage's
 * devices; a resharding collective reads one buffer and writes another. A
 * buffer instance is (buffer, micro-batch); per-step buffers use mb = -1.
 *
 * Every instruction carries its predicted cost: FLOPs, bytes and seconds
 * from the planner's cost model (seconds for the stage's slowest device).
 * Sends are buffered: the sender goes on at once and may FREE the sent
 * buffer right after the SEND, so a backend takes the data at the send (the
 * executors copy it out; the simulator only times the transfer) and a FREE
 * never waits for one. Waiting there would deadlock 1F1B: stage 0 frees
 * activation mb 1 after sending it while stage 1 first returns gradient
 * mb 0. Receives and collectives block. Messages between two devices
 * arrive in the order sent. The set owns all of its memory; the step graph
 * it refers to is borrowed. */
#ifndef PS_CORE_PROGRAM_H
#define PS_CORE_PROGRAM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/collective.h"
#include "core/graph.h"
#include "core/sharding.h"

typedef enum ps_instr_kind {
    PS_INSTR_RUN = 0,        /* program: run `kernel` for micro-batch `mb` */
    PS_INSTR_COMPUTE = 1,    /* kernel: op `op` of the step on local tiles */
    PS_INSTR_COLLECTIVE = 2, /* kernel: over mesh `axis`; program: over `group` */
    PS_INSTR_SEND = 3,       /* program: (part of) a tile to `peer` */
    PS_INSTR_RECV = 4,       /* program: (part of) a tile from `peer` */
    PS_INSTR_ALLOC = 5,
    PS_INSTR_FREE = 6,
    PS_INSTR_LOAD = 7,       /* kernel: the data loader fills an input tile */
    PS_INSTR_SLICE = 8,      /* kernel: a local re-layout, no communication: src_buffer's
                              * tile cut to buffer's finer split, or a replica made a
                              * partial sum (one member keeps it, the others zero) */
    PS_INSTR_KIND_COUNT
} ps_instr_kind;

extern const char *const ps_instr_kind_names[PS_INSTR_KIND_COUNT];

typedef enum ps_phase {
    PS_PHASE_FORWARD = 0,
    PS_PHASE_BACKWARD = 1, /* recomputation, then the backward ops */
    PS_PHASE_UPDATE = 2,   /* gradient synchronization and the optimizer, once per step */
    PS_PHASE_COUNT
} ps_phase;

extern const char *const ps_phase_names[PS_PHASE_COUNT];

enum {
    /* COMPUTE: the op's output is a gradient accumulated over micro-batches:
     * the first micro-batch writes it, later ones add to it */
    PS_INSTR_ACCUMULATE = 1u << 0,
    /* COLLECTIVE in an update kernel (dynamic loss scaling): the overflow
     * vote. Each device looks for inf or NaN in the gradients its optimizer
     * ops are about to read (operands: their buffers, ending at -1), then
     * every device of the plan (group) all-reduces that flag (bytes: one
     * fp32); on "found", every optimizer op of the step is skipped */
    PS_INSTR_FINITE_VOTE = 1u << 1,
};

typedef struct ps_instr {
    uint8_t kind;  /* ps_instr_kind */
    uint8_t coll;  /* COLLECTIVE: ps_collective (bytes as core/collective.h counts them) */
    uint8_t flags; /* PS_INSTR_* */
    int8_t axis;   /* COLLECTIVE in a kernel: mesh axis 0 or 1, or 2 = the whole mesh
                    * (row-major; an all-reduce over it is hierarchical as in the
                    * cost model: reduce-scatter on axis 1, all-reduce on axis 0,
                    * all-gather on axis 1); else -1 */
    int group;     /* COLLECTIVE in a program: index into groups; else -1 */
    int kernel;    /* RUN */
    int mb;        /* program instructions: micro-batch, -1 = per step */
    int op;        /* COMPUTE: op id in the step graph */
    int buffer;    /* what is allocated, freed, loaded, written, sent or received;
                    * -1 for a COLLECTIVE inside op `op` (the statistics of a
                    * vocabulary-parallel loss, an MoE all-to-all): a backend runs
                    * it as part of that op's COMPUTE, the simulator times it */
    int src_buffer; /* COLLECTIVE in a kernel: the layout it reads (buffer: what it writes) */
    int peer;      /* SEND, RECV: the other device */
    int region;    /* SEND, RECV, program COLLECTIVE: index into regions; -1 = whole tile */
    int chunk, chunks; /* SEND, RECV: flat chunk `chunk` of `chunks` of the region.
                        * Program COLLECTIVE all-gather of a received region
                        * (src_buffer -1): chunks <= 1, member r of the group
                        * holds flat chunk r of it; chunks = m > 1, the regions
                        * region .. region + m - 1, member k % n holding region k
                        * whole (m a multiple of the n members) */
    int operands;  /* COMPUTE: index into operands: the op's n_in input buffers, then
                    * its n_out output buffers; a FINITE_VOTE's checked buffers */
    double flops, bytes, seconds; /* predicted; bytes moved per device for communication */
} ps_instr;

/* A box of a tensor in global coordinates: the part a transfer moves. */
typedef struct ps_region {
    int rank;
    int64_t offset[PS_MAX_RANK];
    int64_t size[PS_MAX_RANK];
} ps_region;

typedef struct ps_buffer {
    int tensor;           /* in the step graph */
    int stage;
    ps_sharding_spec spec;
    double bytes;         /* of one device's tile */
    bool per_microbatch;  /* one instance per micro-batch; else one per step */
} ps_buffer;

/* Devices of a collective, in ring order. */
typedef struct ps_group {
    int n;
    int *devices;
} ps_group;

typedef struct ps_kernel {
    int stage;
    ps_phase phase;
    int n_instrs, cap_instrs;
    ps_instr *instrs;
    double seconds; /* predicted, instructions summed */
} ps_kernel;

typedef struct ps_program_stage {
    int n_devices;
    int *devices;                  /* row-major over the logical mesh */
    int mesh[PS_MESH_AXES];
    int kernel[PS_PHASE_COUNT];    /* kernel index per phase, -1 if empty */
    double reference_flops_per_s;  /* peak FLOP/s at compute_dtype of the device the
                                    * kernels' seconds are for (the stage's slowest): a
                                    * device of peak v at that dtype runs them in
                                    * seconds * ref / v (0: as they are) */
    ps_dtype compute_dtype;        /* the model's dtype, at which speeds compare */
    double compute_share;          /* the slowdown the seconds include for devices sharing
                                    * cores (ps_cluster_compute_share): alone, a device
                                    * runs them in seconds / compute_share; 0 or 1: none */
} ps_program_stage;

typedef struct ps_program {
    int device;
    int stage;
    int coord[PS_MESH_AXES];      /* position in the stage's logical mesh */
    int axis_group[PS_MESH_AXES + 1]; /* the device's group along axis 0, axis 1, and
                                       * the whole mesh */
    int n_instrs, cap_instrs;
    ps_instr *instrs;
} ps_program;

typedef struct ps_program_set {
    const ps_graph *step; /* borrowed: the training step the buffers and ops refer to */
    int n_devices;        /* of the cluster; devices outside every stage have empty programs */
    ps_program *programs; /* [n_devices] */
    int n_stages;
    ps_program_stage *stages;
    int n_kernels, cap_kernels;
    ps_kernel *kernels;
    int n_buffers, cap_buffers;
    ps_buffer *buffers;
    int n_groups, cap_groups;
    ps_group *groups;
    int *group_slots;     /* hash index of groups by devices (-1 = empty), [cap_group_slots] */
    int cap_group_slots;
    int n_regions, cap_regions;
    ps_region *regions;
    int n_operands, cap_operands;
    int *operands;
    int micro_batches;
    /* Dynamic loss scaling (the plan's training options), window 0: none or
     * static. The scale of the first step, and how many steps in a row
     * without an overflow double it; the update kernels hold the vote. */
    double loss_scale;
    int loss_scale_window;
    char schedule[16];
    double flops_per_step;       /* the model's FLOPs per step, for TFLOP/s */
    double mfu_peak_flops_per_s; /* per device peak that MFU divides by */
    char plan_digest[32];
    char model[64], cluster[64];
} ps_program_set;

ps_status ps_program_set_create(const ps_graph *step, int n_devices, int n_stages,
                                ps_program_set **out);
void ps_program_set_free(ps_program_set *s);

/* Builders; each returns the new index through *index_out (may be NULL). */
ps_status ps_program_add_kernel(ps_program_set *s, int stage, ps_phase phase, int *index_out);
ps_status ps_program_add_buffer(ps_program_set *s, const ps_buffer *b, int *index_out);
/* Returns an existing group with the same devices in the same order, or a new one:
 * one index per device list, so that all members of a collective name the same
 * group (an executor makes one communicator per group). */
ps_status ps_program_add_group(ps_program_set *s, const int *devices, int n, int *index_out);
ps_status ps_program_add_region(ps_program_set *s, const ps_region *r, int *index_out);
/* Same rank, offsets and sizes. */
bool ps_region_equal(const ps_region *a, const ps_region *b);
/* Appends n buffer ids to the operand table; *index_out is the first. */
ps_status ps_program_add_operands(ps_program_set *s, const int *buffers, int n, int *index_out);
ps_status ps_kernel_append(ps_kernel *k, const ps_instr *in);
ps_status ps_program_append(ps_program *p, const ps_instr *in);

/* An instruction with every index field at -1 and chunks = 1. */
ps_instr ps_instr_init(ps_instr_kind kind);

/* Peak memory of one device (bytes): its ALLOC and FREE in program order,
 * kernels expanded, as ps_program_set_check counts it but without its
 * checks (a well-formed set: what the lowering makes); 0 for a device
 * outside the set. Linear in the device's executed instructions. */
double ps_program_peak_bytes(const ps_program_set *s, int device);

/* Each kernel's effect on memory when it runs (bytes): net[k], what it
 * leaves allocated; rise[k] >= 0, its highest point above where it started.
 * net and rise: s->n_kernels each. */
void ps_kernel_memory(const ps_program_set *s, double *net, double *rise);

/* ps_program_peak_bytes from the kernels' effects (ps_kernel_memory):
 * linear in the device's program instead of its executed instructions (a
 * kernel is walked once per set, not once per run and device). The same
 * peak: buffer sizes are whole bytes, so their sums are exact in any order. */
double ps_program_peak_bytes_of(const ps_program_set *s, int device, const double *net,
                                const double *rise);

/* Group of device `device` for a kernel instruction (axis) or a program one. */
int ps_instr_group(const ps_program_set *s, const ps_program *p, const ps_instr *in);

/* Checks what every backend relies on, for every device: each buffer
 * instance is allocated once before use and freed once after; memory never
 * goes negative; the sends from one device to another match the receives
 * there in order (tensor, micro-batch, bytes, region, chunk); every
 * collective is entered by all members of its group in the same order, with
 * the same kind and size; and the programs run to the end without deadlock
 * (sends asynchronous, receives and collectives blocking). Reports the first
 * violation with the device and instruction. peak_bytes_out (may be NULL):
 * [n_devices] peak memory per device from ALLOC/FREE. */
ps_status ps_program_set_check(const ps_program_set *s, double *peak_bytes_out, ps_error *err);

/* Counts, for reports and benchmarks: instructions in all programs, and the
 * kernel instructions they execute once expanded. */
typedef struct ps_program_stats {
    long long program_instrs;
    long long kernel_instrs;
    long long executed_instrs;
    long long sends, collectives_executed;
} ps_program_stats;
void ps_program_set_stats(const ps_program_set *s, ps_program_stats *out);

/* Readable listing: kernels once, then every device's program. */
ps_status ps_program_set_dump(const ps_program_set *s, FILE *f);
/* The same as files in dir: buffers.txt, kernels.txt, device-<id>.txt. */
ps_status ps_program_set_dump_dir(const ps_program_set *s, const char *dir, ps_error *err);

#endif
