/* The replay: one SimGrid actor per device interprets its program
 * (docs/simulator.md). Runs in the child process of ps_sim_run.
 *
 * Accounting. compute_s: the computes' time. comm_s: time blocked while
 * data moves (receives, collective steps, the latencies of coalesced ring
 * steps). A blocked receive first waits for its sender to post the
 * message; that wait is idle time (a pipeline bubble, a straggler), not
 * communication: every message carries its post time in the payload
 * pointer's bits (SimGrid only copies payload pointers, never dereferences
 * them, and refuses NULL; a time t >= 0 with its sign bit flipped is never
 * NULL). idle_s is the rest of the iteration.
 *
 * No globals: every actor finds its state and the
 * shared context through its actor data; actors run one at a time. The hot path (kernel
 * instructions) does no allocation and no formatting unless a trace is written; mailboxes and group
 * ranks are looked up once per peer and group and cached per actor. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <simgrid/actor.h>
#include <simgrid/barrier.h>
#include <simgrid/comm.h>
#include <simgrid/engine.h>
#include <simgrid/exec.h>
#include <simgrid/host.h>
#include <simgrid/mailbox.h>
#include <simgrid/semaphore.h>
#include <xbt/sysdep.h>

#include "core/clock.h"
#include "sim/sim_internal.h"
#include "traces/trace.h"

_Static_assert(sizeof(void *) == sizeof(double), "post times travel in payload pointers");

/* Mailboxes of a peer, per direction and traffic: point-to-point SEND/RECV
 * and collective steps each keep their own FIFO per ordered device pair. */
enum { BOX_P2P_OUT, BOX_P2P_IN, BOX_COLL_OUT, BOX_COLL_IN, BOX_COUNT };

/* What a device waits for, for deadlock reports. */
typedef enum sim_wait {
    WAIT_NONE = 0,
    WAIT_RECV,
    WAIT_COLLECTIVE,
    WAIT_SENDS, /* at its end, for its last sends to be received */
    WAIT_RING_END, /* after its transfer of a ring across nodes, for the others' (ring_end) */
} sim_wait;

/* Sends by traffic: point-to-point and the transfers of node rings
 * (node_ring). */
enum { SENT_P2P, SENT_COLL, SENT_COUNT };

typedef struct sim_peer {
    int device; /* -1: free slot */
    double latency_s;
    sg_mailbox_t box[BOX_COUNT]; /* NULL until first used */
    /* in the sender's cache: sends into the outgoing box of each traffic,
     * and how many of them the peer received (post_send) */
    long long sent[SENT_COUNT], received[SENT_COUNT];
} sim_peer;

typedef struct sim_ctx sim_ctx;

/* A member of a group's node ring: its arrivals, by instance parity
 * (members are at most one instance apart while a neighbour still needs
 * the older one; node_ring). A group across nodes uses `entered` and
 * `arr_s` alike for its coalesced rings (ring_end). */
typedef struct sim_ring_member {
    int entered;         /* instances it arrived at */
    double arr_s[2];     /* virtual arrival time */
    double out_end_s[2]; /* end of its transfer to its successor, once received; -1 */
    bool out_transfer[2]; /* moved as a SimGrid transfer (else timed) */
} sim_ring_member;

/* A group's coalesced rings across nodes, by instance parity: the members
 * wait for each other at the barrier, so that they are at most one
 * instance apart (ring_end). */
typedef struct sim_ring_end {
    sg_bar_t bar;         /* NULL until the group's first such ring */
    int arrived[2];       /* members at the barrier */
    double last_arr_s[2]; /* the last member's arrival */
    double longest_s[2];  /* the longest member transfer, from when its ends were there */
    int a2a_shift;        /* all-to-all across nodes (spread_all_to_all): 0 not known
                           * yet, -1 step by step, else the partners' distance */
    int a2a_per_node;     /* then: members on each of its nodes */
} sim_ring_end;

/* A send the device started and has not yet released (post_send). */
typedef struct sim_send {
    sg_comm_t comm;
    int peer, traffic; /* receiving device; SENT_* */
    long long seq;     /* 1-based rank among the sends to that peer and traffic */
} sim_send;

typedef struct sim_actor {
    sim_ctx *ctx;
    const ps_program *prog;
    int device;
    double speed_flops_per_s;
    sg_host_t cpu; /* where its computes run: its node's shared cores; NULL: its own host */
    /* shared cores with a scheduler slice (lockstep_delay): alone-seconds
     * computed since its last synchronization, and whether it is blocked
     * (in a receive or a collective, or done) */
    double since_sync_s;
    bool blocked;
    /* of pend_delay_s, the lockstep delays (the last of them after a
     * receive from lockstep_peer, or after a collective: -1), traced as
     * such */
    double pend_lockstep_s;
    int lockstep_peer;
    /* with a trace: comm_s when the running collective's first transfer
     * began (what it added since is communication, the rest of its span
     * waiting for its peers) */
    double span_comm0_s;
    /* Virtual time: where the program is, at or after the SimGrid clock.
     * What lies between them is run as one execution before the device
     * next meets another (flush_compute): the computes since the last
     * flush (pend_compute_s, on this host), the latencies deferred by
     * coalesced collective steps and closed-form collectives
     * (pend_delay_s), and the ends of node rings timed without transfers
     * (node_ring). */
    double v_s;
    double pend_compute_s, pend_pred_flops, pend_delay_s;
    bool pend_closed_form; /* pend_delay_s holds closed-form collectives (traced as such) */
    int cur_phase, cur_mb; /* of the running kernel; -1 outside one */
    /* accounting */
    double compute_s, comm_s, end_s;
    double mem_bytes, peak_mem_bytes;
    double phase_sum_s[PS_PHASE_COUNT];
    int phase_runs[PS_PHASE_COUNT];
    long long events;
    /* where it is */
    int pc, kpc; /* program instruction; kernel instruction or -1 */
    sim_wait waiting;
    int wait_peer;
    bool done;
    /* sends posted and not yet received: while there are none, nothing but
     * its node rings uses the device's port up (node_ring) */
    int unreceived;
    int releasable; /* sends received and not yet released (release_sends) */
    /* the node ring it is in (node_ring), for the members that wake it */
    struct ring_wait {
        bool blocked;
        int group, k, rank, to, from; /* group, instance, member ranks */
        double in_end_s; /* -1 until known */
        bool out_transfer;
    } ring;
    sg_sem_t wake; /* released by the neighbour a node ring waits for */
    /* sends not yet released (release_sends) */
    sim_send *sends;
    int n_sends, cap_sends;
    /* caches: open addressing, capacities are powers of two */
    sim_peer *peers;
    int n_peers, cap_peers;
    int *grp_key, *grp_rank; /* rank * 2 + (all members on one node); -1 not a member */
    int n_grp, cap_grp;
} sim_actor;

struct sim_ctx {
    const ps_program_set *set;
    const ps_cluster *c;
    const ps_sim_options *o;
    sim_actor *actors; /* [set->n_devices] */
    sg_host_t *hosts;  /* [set->n_devices] */
    sg_host_t *node_cpus; /* [c->nodes] the cores each node's devices share; NULL: none */
    ps_trace_writer *trace;
    bool trace_failed;
    ps_error err; /* the first failure inside an actor */
    double wall_start_s;
    /* node rings: per group, its members' arrivals (node_ring) */
    int *ring_first;          /* [set->n_groups]: the group's first entry in ring_members */
    sim_ring_member *ring_members;
    sim_ring_end *ring_ends; /* [set->n_groups] (ring_end) */
};


static void *stamp(double t_s)
{
    uint64_t u;
    memcpy(&u, &t_s, sizeof u);
    u ^= UINT64_C(1) << 63;
    return (void *)(uintptr_t)u;
}

static double unstamp(const void *payload)
{
    uint64_t u = (uint64_t)(uintptr_t)payload ^ (UINT64_C(1) << 63);
    double t_s;
    memcpy(&t_s, &u, sizeof t_s);
    return t_s;
}

static long bytes_long(double bytes)
{
    return bytes > 0 ? (long)llround(bytes) : 0;
}

/* Records the first failure of any actor; the actor then stops. */
static bool actor_fail(sim_actor *a, ps_status st, const char *what)
{
    if (a->ctx->err.status == PS_OK && a->kpc >= 0)
        ps_error_set(&a->ctx->err, st,
                     "device %d, program instruction %d, kernel instruction %d: %s", a->device,
                     a->pc, a->kpc, what);
    else if (a->ctx->err.status == PS_OK)
        ps_error_set(&a->ctx->err, st, "device %d, program instruction %d: %s", a->device, a->pc,
                     what);
    a->done = true;
    return false;
}

static void trace_span(sim_actor *a, int device, ps_trace_category cat, const char *name,
                       double t0_s, double t1_s, int mb, int peer, double bytes, double flops)
{
    sim_ctx *ctx = a->ctx;
    if (ctx->trace == NULL || ctx->trace_failed)
        return;
    ps_trace_event e = {.device = device,
                        .category = cat,
                        .name = name,
                        .start_s = t0_s,
                        .duration_s = t1_s - t0_s,
                        .micro_batch = mb,
                        .stage = ctx->set->programs[device].stage,
                        .peer = peer,
                        .bytes = bytes,
                        .flops = flops};
    if (ps_trace_add(ctx->trace, &e) != PS_OK)
        ctx->trace_failed = true; /* ps_trace_close reports it */
}

/* ---- caches ---- */

static unsigned hash_int(int x)
{
    return (unsigned)x * 2654435761u;
}

static bool peers_grow(sim_actor *a)
{
    int cap = a->cap_peers ? a->cap_peers * 2 : 16;
    sim_peer *p = malloc((size_t)cap * sizeof *p);
    if (p == NULL)
        return false;
    for (int i = 0; i < cap; i++)
        p[i].device = -1;
    for (int i = 0; i < a->cap_peers; i++) {
        if (a->peers[i].device < 0)
            continue;
        unsigned h = hash_int(a->peers[i].device) & (unsigned)(cap - 1);
        while (p[h].device >= 0)
            h = (h + 1) & (unsigned)(cap - 1);
        p[h] = a->peers[i];
    }
    free(a->peers);
    a->peers = p;
    a->cap_peers = cap;
    return true;
}

/* The cache slot of peer `device`: its entry or the free slot for it. */
static sim_peer *peer_slot(const sim_actor *a, int device)
{
    unsigned mask = (unsigned)(a->cap_peers - 1), h = hash_int(device) & mask;
    while (a->peers[h].device >= 0 && a->peers[h].device != device)
        h = (h + 1) & mask;
    return &a->peers[h];
}

/* The cache entry of peer `device`, NULL if there is none. */
static sim_peer *peer_find(const sim_actor *a, int device)
{
    if (a->cap_peers == 0)
        return NULL;
    sim_peer *p = peer_slot(a, device);
    return p->device == device ? p : NULL;
}

/* The cache entry of peer `device`; NULL when out of memory. */
static sim_peer *peer_get(sim_actor *a, int device)
{
    if (2 * (a->n_peers + 1) > a->cap_peers && !peers_grow(a))
        return NULL;
    sim_peer *p = peer_slot(a, device);
    if (p->device < 0) {
        memset(p, 0, sizeof *p);
        p->device = device;
        p->latency_s = ps_sim_route_latency_s(a->ctx->c, a->device, device);
        a->n_peers++;
    }
    return p;
}

/* The mailbox `which` between this device and `device`; NULL when out of
 * memory. *latency_s: the route latency to it. */
static sg_mailbox_t peer_box(sim_actor *a, int device, int which, double *latency_s)
{
    sim_peer *p = peer_get(a, device);
    if (p == NULL)
        return NULL;
    if (p->box[which] == NULL) {
        bool out = which == BOX_P2P_OUT || which == BOX_COLL_OUT;
        char name[48];
        snprintf(name, sizeof name, "%c%d>%d", which < BOX_COLL_OUT ? 'p' : 'c',
                 out ? a->device : device, out ? device : a->device);
        p->box[which] = sg_mailbox_by_name(name);
    }
    if (latency_s)
        *latency_s = p->latency_s;
    return p->box[which];
}

/* This device's rank in group g, -1 if it is not a member, -2 out of memory;
 * *one_node (may be NULL): all members are on one node. */
static int group_rank(sim_actor *a, int g, bool *one_node)
{
    if (2 * (a->n_grp + 1) > a->cap_grp) {
        int cap = a->cap_grp ? a->cap_grp * 2 : 8;
        int *key = malloc((size_t)cap * sizeof *key), *rank = malloc((size_t)cap * sizeof *rank);
        if (key == NULL || rank == NULL) {
            free(key);
            free(rank);
            return -2;
        }
        for (int i = 0; i < cap; i++)
            key[i] = -1;
        for (int i = 0; i < a->cap_grp; i++) {
            if (a->grp_key[i] < 0)
                continue;
            unsigned h = hash_int(a->grp_key[i]) & (unsigned)(cap - 1);
            while (key[h] >= 0)
                h = (h + 1) & (unsigned)(cap - 1);
            key[h] = a->grp_key[i];
            rank[h] = a->grp_rank[i];
        }
        free(a->grp_key);
        free(a->grp_rank);
        a->grp_key = key;
        a->grp_rank = rank;
        a->cap_grp = cap;
    }
    unsigned mask = (unsigned)(a->cap_grp - 1), h = hash_int(g) & mask;
    while (a->grp_key[h] >= 0 && a->grp_key[h] != g)
        h = (h + 1) & mask;
    if (a->grp_key[h] < 0) {
        const ps_group *gr = &a->ctx->set->groups[g];
        int r = -1, dpn = a->ctx->c->devices_per_node;
        bool local = true;
        for (int i = 0; i < gr->n; i++) {
            if (gr->devices[i] == a->device)
                r = i;
            local = local && gr->devices[i] / dpn == gr->devices[0] / dpn;
        }
        a->grp_key[h] = g;
        a->grp_rank[h] = r < 0 ? -1 : 2 * r + local;
        a->n_grp++;
    }
    int v = a->grp_rank[h];
    if (one_node)
        *one_node = v >= 0 && (v & 1);
    return v < 0 ? v : v >> 1;
}

/* ---- time ---- */

static void flush_compute(sim_actor *a)
{
    double t0 = simgrid_get_clock(), todo_s = a->v_s - t0;
    double delay_s = a->pend_delay_s, compute_s = a->pend_compute_s;
    bool closed_form = a->pend_closed_form;
    double lockstep_s = fmin(a->pend_lockstep_s, delay_s);
    a->pend_delay_s = a->pend_compute_s = a->pend_lockstep_s = 0;
    a->pend_closed_form = false;
    double pred_flops = a->pend_pred_flops;
    a->pend_pred_flops = 0;
    a->comm_s += delay_s;
    if (a->cpu != NULL) {
        /* shared cores (no timed node rings, so only the deferred
         * latencies lie before the computes): the latencies pass first,
         * then the computes share the node's cores with its other devices'
         * (alone they take compute_s); their time is as long as that takes */
        if (delay_s > 0) {
            sg_actor_sleep_for(delay_s);
            a->events++;
        }
        a->since_sync_s += compute_s;
        if (compute_s > 0) {
            double c0 = simgrid_get_clock();
            sg_exec_t e = sg_actor_exec_init(compute_s * sg_host_get_speed(a->cpu));
            sg_exec_set_host(e, a->cpu);
            sg_exec_start(e);
            sg_exec_wait(e);
            a->events++;
            a->compute_s += simgrid_get_clock() - c0;
        }
    } else {
        /* what is pending counts as predicted: the host runs nothing else */
        a->compute_s += compute_s;
        if (todo_s > 0) {
            /* the host's speed turns seconds into FLOPs */
            sg_actor_execute(todo_s * a->speed_flops_per_s);
            a->events++;
        }
    }
    double t1 = simgrid_get_clock();
    a->v_s = t1;
    if (a->ctx->trace == NULL)
        return;
    /* with a trace, only deferred latencies and computes are pending, in
     * that order (node rings move their bytes as transfers) */
    if (closed_form && delay_s - lockstep_s > 0)
        trace_span(a, a->device, PS_TRACE_COLLECTIVE, "node collectives (closed form)", t0,
                   t0 + delay_s - lockstep_s, a->cur_mb, -1, 0, 0);
    if (lockstep_s > 0) {
        /* communication time, as the summary counts it: the meeting's
         * members waited for the one the scheduler had preempted */
        char name[64];
        if (a->lockstep_peer >= 0)
            snprintf(name, sizeof name, "lockstep after recv from %d", a->lockstep_peer);
        else
            snprintf(name, sizeof name, "lockstep after a collective");
        trace_span(a, a->device, a->lockstep_peer >= 0 ? PS_TRACE_RECV : PS_TRACE_COLLECTIVE,
                   name, t0 + delay_s - lockstep_s, t0 + delay_s, a->cur_mb,
                   a->lockstep_peer, 0, 0);
    }
    if (compute_s > 0) {
        char name[64];
        ps_trace_compute_name(a->cur_phase, a->cur_mb, name, sizeof name);
        double start_s = fmin(t0 + delay_s, t1);
        trace_span(a, a->device, PS_TRACE_COMPUTE, name, start_s, t1, a->cur_mb, -1, 0, pred_flops);
    }
}

/* Communication of `seconds` deferred to the device's next execution. */
static void defer_comm(sim_actor *a, double seconds)
{
    a->pend_delay_s += seconds;
    a->v_s += seconds;
}

/* After a blocking call: the clock moved on; what is still pending (the
 * latencies a transfer deferred) lies beyond it. */
static void sync_clock(sim_actor *a)
{
    a->v_s = simgrid_get_clock() + a->pend_delay_s + a->pend_compute_s;
}

/* Blocked from t0 to t1 on a message its sender posted at posted_s: the
 * part before the post is idle, the rest communication. */
static void account_wait(sim_actor *a, double t0_s, double t1_s, double posted_s)
{
    double ready = fmin(fmax(t0_s, posted_s), t1_s);
    a->comm_s += t1_s - ready;
}

/* ---- communication ---- */

/* Sends are asynchronous and nothing waits for one. SimGrid completes a
 * transfer only once the receiver posted its receive, and the programs free
 * sent buffers right after sending (the checker's buffered sends), so a
 * FREE that waited could deadlock (1F1B: stage 0 frees activation mb 1
 * while stage 1 first returns gradient mb 0). The receivers end after their
 * transfers, so the iteration time covers every send.
 *
 * A device releases its sends with a wait once their receivers got them
 * (a receiver counts each message in the sender's peer cache; a mailbox
 * between two devices matches in FIFO order), so the wait returns at once.
 * Why not sg_comm_test: in SimGrid 3.32 a comm found finished by a test
 * stays in its actor's activity list until the actor ends (477 bytes each),
 * a list SimGrid scans each time one of the actor's activities ends: the
 * list grew all replay long (9 GB at 16k devices) and every step paid for
 * it. (Detached sends sit in one list for all actors: quadratic at 16k
 * devices.) Before the device ends it waits for its last sends, since
 * SimGrid cancels the comms of an actor that ends. */

/* The receiver of a message `traffic` from device `from` got it. */
static void note_received(sim_actor *a, int from, int traffic)
{
    sim_peer *p = peer_find(&a->ctx->actors[from], a->device);
    if (p != NULL) /* the sender sent it through this entry */
        p->received[traffic]++;
    a->ctx->actors[from].releasable++;
}

/* Releases the sends their receivers got (all of them, receiving or not,
 * when `all`: at the device's end). Called as soon as there are any: while
 * an ended send is not released it lengthens the list SimGrid scans at
 * each end of the device's activities. */
static void release_sends(sim_actor *a, bool all)
{
    if (!all && a->releasable == 0)
        return;
    a->releasable = 0;
    int kept = 0;
    for (int i = 0; i < a->n_sends; i++) {
        const sim_send *sd = &a->sends[i];
        const sim_peer *p = peer_find(a, sd->peer);
        if (all || (p != NULL && p->received[sd->traffic] >= sd->seq)) {
            a->wait_peer = sd->peer;
            sg_comm_wait(sd->comm); /* received: ended; releases it */
        } else {
            a->sends[kept++] = *sd;
        }
    }
    a->n_sends = kept;
}

/* Sends `bytes` to device `peer` (traffic SENT_*), posted now. */
static bool post_send(sim_actor *a, int peer, int traffic, double bytes)
{
    sg_mailbox_t box = peer_box(a, peer, traffic == SENT_P2P ? BOX_P2P_OUT : BOX_COLL_OUT, NULL);
    if (box == NULL)
        return actor_fail(a, PS_ERR_NOMEM, "out of memory");
    if (a->n_sends == a->cap_sends) {
        int cap = a->cap_sends ? 2 * a->cap_sends : 32;
        sim_send *q = realloc(a->sends, (size_t)cap * sizeof *q);
        if (q == NULL)
            return actor_fail(a, PS_ERR_NOMEM, "out of memory");
        a->sends = q;
        a->cap_sends = cap;
    }
    sg_comm_t comm = sg_mailbox_put_async(box, stamp(simgrid_get_clock()), bytes_long(bytes));
    a->sends[a->n_sends++] = (sim_send){
        .comm = comm, .peer = peer, .traffic = traffic, .seq = ++peer_find(a, peer)->sent[traffic]};
    a->events++;
    release_sends(a, false);
    return true;
}

static bool do_send(sim_actor *a, const ps_instr *in)
{
    flush_compute(a);
    if (in->peer < 0 || in->peer >= a->ctx->set->n_devices || in->peer == a->device)
        return actor_fail(a, PS_ERR_INVALID, "send to an invalid peer");
    if (!post_send(a, in->peer, SENT_P2P, in->bytes))
        return false;
    a->unreceived++;
    return true;
}

/* ---- lockstep on shared cores ---- */

/* Devices that meet (a collective's members, a transfer's two ends) on a
 * node whose runnable threads outnumber its cores do not run side by side at
 * their fair share, as processor sharing has it: each runs for a slice of
 * the scheduler, then waits while other threads run, and the meeting waits
 * for whichever member was preempted. After a span of w alone-seconds a
 * member was preempted with probability p = min(1, w / slice), and getting
 * its core back takes about a slice (less when fewer other threads than
 * cores compete). So after a meeting of g devices each member waits
 * slice * min(1, other / cores) * (1 - (1 - p)^g), `other` counting the
 * node's runnable devices outside the meeting and outside its stage: the
 * stage's other devices run the same kernel and reach their own meetings
 * within moments, so they are not the threads that hold the cores (as the
 * planner's schedule has it). Measured against the CPU backend in
 * docs/simulator.md. */
static bool is_member(const ps_group *gr, int device)
{
    for (int i = 0; i < gr->n; i++)
        if (gr->devices[i] == device)
            return true;
    return false;
}

/* Whether device d of the node meets with a: a member of group gr, the
 * transfer's peer, or (stage >= 0: a collective over the whole mesh) a
 * device of that stage. */
static bool meets(const sim_actor *a, int d, const ps_group *gr, int peer, int stage)
{
    return d == a->device || d == peer || (gr != NULL && is_member(gr, d)) ||
           (stage >= 0 && a->ctx->set->programs[d].stage == stage);
}

/* After a meeting of g devices (see meets). */
static void lockstep_delay(sim_actor *a, const ps_group *gr, int peer, int stage, int g)
{
    const ps_cluster *c = a->ctx->c;
    double slice = c->scheduler_slice_s, w = a->since_sync_s;
    a->since_sync_s = 0;
    if (a->cpu == NULL || !(slice > 0) || g < 2)
        return;
    int node = a->device / c->devices_per_node, first = node * c->devices_per_node;
    int other = 0, own = a->ctx->set->programs[a->device].stage;
    for (int d = first; d < first + c->devices_per_node && d < a->ctx->set->n_devices; d++) {
        bool sibling = own >= 0 && a->ctx->set->programs[d].stage == own;
        if (!a->ctx->actors[d].blocked && !sibling && !meets(a, d, gr, peer, stage))
            other++;
    }
    double delay_s = ps_lockstep_delay_s(slice, c->shared_cores_per_node, other, g, w);
    if (delay_s > 0) {
        defer_comm(a, delay_s);
        a->pend_lockstep_s += delay_s;
        a->lockstep_peer = peer;
    }
}

static bool do_recv(sim_actor *a, const ps_instr *in, int mb)
{
    flush_compute(a);
    if (in->peer < 0 || in->peer >= a->ctx->set->n_devices || in->peer == a->device)
        return actor_fail(a, PS_ERR_INVALID, "receive from an invalid peer");
    sg_mailbox_t box = peer_box(a, in->peer, BOX_P2P_IN, NULL);
    if (box == NULL)
        return actor_fail(a, PS_ERR_NOMEM, "out of memory");
    release_sends(a, false); /* the same time: they ended */
    double t0 = simgrid_get_clock();
    a->waiting = WAIT_RECV;
    a->wait_peer = in->peer;
    a->blocked = true;
    void *payload = sg_mailbox_get(box);
    a->blocked = false;
    a->waiting = WAIT_NONE;
    a->ctx->actors[in->peer].unreceived--;
    note_received(a, in->peer, SENT_P2P);
    sync_clock(a);
    double t1 = simgrid_get_clock(), posted = unstamp(payload);
    account_wait(a, t0, t1, posted);
    lockstep_delay(a, NULL, in->peer, -1, 2);
    if (a->ctx->trace) {
        /* waiting for the sender to post (a bubble) shows as idle, as
         * account_wait counts it; the transfer after it as the receive */
        char name[48];
        double ready = fmin(fmax(t0, posted), t1);
        if (ready > t0) {
            snprintf(name, sizeof name, "wait for %d", in->peer);
            trace_span(a, a->device, PS_TRACE_IDLE, name, t0, ready, mb, in->peer, 0, 0);
        }
        snprintf(name, sizeof name, "recv from %d", in->peer);
        trace_span(a, a->device, PS_TRACE_RECV, name, ready, t1, mb, in->peer, in->bytes, 0);
        /* the sender learns of the completion late or never: its span is
         * written here, where the completion time is known */
        snprintf(name, sizeof name, "send to %d", a->device);
        trace_span(a, in->peer, PS_TRACE_SEND, name, posted, t1, mb, a->device, in->bytes, 0);
    }
    return true;
}

/* k (1 or 2) transfers at once: bytes[i] to device to[i] while receiving
 * from from[i], after extra_s of latencies (the steps merged into them);
 * the device goes on once all have ended, and waiting for the last of the
 * `from` devices to post is idle time. Without a trace the latencies are
 * deferred to the device's next execution (one event instead of a sleep):
 * when nothing contends, a member ends at the same time either way (the
 * ring's last transfer ends that much earlier, and every member then waits
 * as long), and under contention only when the bytes move shifts, by
 * microseconds. With a trace they are slept first, so that spans show where
 * the time goes. */
static bool exchange(sim_actor *a, int k, const int *to, const int *from, const double *bytes,
                     double extra_s)
{
    sg_mailbox_t out[2], in[2];
    for (int i = 0; i < k; i++) {
        out[i] = peer_box(a, to[i], BOX_COLL_OUT, NULL);
        in[i] = out[i] ? peer_box(a, from[i], BOX_COLL_IN, NULL) : NULL;
        if (in[i] == NULL)
            return actor_fail(a, PS_ERR_NOMEM, "out of memory");
    }
    double t0 = simgrid_get_clock();
    a->waiting = WAIT_COLLECTIVE;
    a->wait_peer = from[0];
    if (extra_s > 0 && a->ctx->trace == NULL) {
        defer_comm(a, extra_s);
    } else if (extra_s > 0) {
        sg_actor_sleep_for(extra_s);
        a->events++;
    }
    double ready = simgrid_get_clock(), posted = ready;
    sg_comm_t put[2];
    for (int i = 0; i < k; i++) {
        put[i] = sg_mailbox_put_async(out[i], stamp(ready), bytes_long(bytes[i]));
        a->events++;
    }
    if (k == 1) {
        posted = fmax(posted, unstamp(sg_mailbox_get(in[0])));
    } else {
        /* both receives posted before either is waited for: a transfer moves
         * only once its receive is posted */
        void *payload[2];
        sg_comm_t get[2];
        for (int i = 0; i < k; i++)
            get[i] = sg_mailbox_get_async(in[i], &payload[i]);
        for (int i = 0; i < k; i++) {
            a->wait_peer = from[i];
            sg_comm_wait(get[i]);
            posted = fmax(posted, unstamp(payload[i]));
        }
    }
    for (int i = 0; i < k; i++)
        sg_comm_wait(put[i]);
    a->waiting = WAIT_NONE;
    sync_clock(a);
    double t1 = simgrid_get_clock();
    double peer_ready = fmin(posted, t1);
    a->comm_s += (t1 - t0) - (peer_ready - ready);
    return true;
}

/* One coalesced run of ring steps: `bytes` to `to` and from `from`, plus
 * `extra_latencies` route latencies to `to` (the steps merged into it). */
static bool transfer(sim_actor *a, int to, int from, double bytes, int extra_latencies)
{
    double extra_s =
        extra_latencies > 0 ? extra_latencies * ps_sim_route_latency_s(a->ctx->c, a->device, to) : 0;
    return exchange(a, 1, &to, &from, &bytes, extra_s);
}

/* The end of a coalesced ring whose group spans nodes: member `rank` of
 * group g (`peers`: the ranks it sent to and received from) arrived at
 * arr_s and its transfer has
 * ended; comm0_s and delay0_s were its communication and deferred time
 * before it. Step by step every step needs the previous one's data from
 * the predecessor, so all members go at the pace of the slowest hop and
 * end together; coalesced, a member whose own hops are fast would leave
 * long before the slow hop's bytes could have reached it. So each member
 * waits at the group's barrier for the others' transfers and then ends
 * where the ring does: the last arrival plus the longest transfer, each
 * from when its member and both neighbours were there (uncontended, the
 * slowest hop's closed form; a late member holds every later step). Waiting
 * for the last arrival is idle, the rest communication, for every member.
 * The barrier costs no event; what lies beyond SimGrid's clock is deferred
 * like the coalesced latencies (slept with a trace). */
static void ring_end(sim_actor *a, int g, int rank, const int *peers, int n_peers,
                     double arr_s, double comm0_s, double delay0_s)
{
    sim_ctx *ctx = a->ctx;
    sim_ring_end *e = &ctx->ring_ends[g];
    const sim_ring_member *m = &ctx->ring_members[ctx->ring_first[g]];
    int n = ctx->set->groups[g].n, s = (m[rank].entered - 1) & 1;
    if (e->bar == NULL)
        e->bar = sg_barrier_init((unsigned)n);
    /* the peers (ranks it sent to and received from) have arrived at this
     * instance: its transfers ended, at v_s with the latencies it deferred */
    double start_s = arr_s;
    for (int i = 0; i < n_peers; i++)
        start_s = fmax(start_s, m[peers[i]].arr_s[s]);
    double took_s = a->v_s - delay0_s - start_s;
    if (e->arrived[s]++ == 0) {
        e->last_arr_s[s] = arr_s;
        e->longest_s[s] = took_s;
    } else {
        e->last_arr_s[s] = fmax(e->last_arr_s[s], arr_s);
        e->longest_s[s] = fmax(e->longest_s[s], took_s);
    }
    if (e->arrived[s] == n)
        e->arrived[s] = 0; /* the next instance of this parity starts afresh */
    a->waiting = WAIT_RING_END;
    a->wait_peer = g;
    sg_barrier_wait(e->bar);
    a->waiting = WAIT_NONE;
    double now = simgrid_get_clock(), last = e->last_arr_s[s];
    double end_s = fmax(now, last + e->longest_s[s]);
    a->comm_s = comm0_s + (now - last); /* the rest with the delay, at its flush */
    a->pend_delay_s = delay0_s;
    if (end_s > now && ctx->trace != NULL) {
        sg_actor_sleep_for(end_s - now);
        a->events++;
        a->comm_s += simgrid_get_clock() - now;
    } else {
        a->pend_delay_s += end_s - now;
    }
    sync_clock(a);
}

/* ---- node rings without transfers ----
 *
 * A coalesced ring step inside a node moves each member's bytes from its
 * port up to its successor's port down. While the ring runs nothing else
 * can use those two directions, unless the sender has a send not yet
 * received (its flow may share the port up): a member in a collective
 * posts no sends and no receives, and only a posted receive lets a flow
 * into a port. So a member whose sends have all been received times its
 * transfer instead of moving it: alone on its route it takes exactly
 * latency + bytes / bandwidth from when both of its ends are there. The
 * members keep the semantics of the transfers: member i ends at the later
 * of the ends of its transfer to i+1 and of the one from i-1, each starting
 * when both of its ends have arrived. A member with sends not yet received
 * moves its bytes as a transfer (a send posted at its
 * arrival), which its successor receives and reports back.
 *
 * Arrival times are virtual (v_s): the computes before a collective are not
 * executed first, so that a timed ring costs no SimGrid event unless a
 * member waits for a neighbour to arrive: it blocks on its own semaphore
 * until the neighbour releases it. (Not sg_actor_suspend: that suspends
 * the actor's sends in flight too, and a neighbour may wait for one.) */

static bool node_rings_timed(const sim_ctx *ctx)
{
    const ps_sim_options *o = ctx->o;
    /* with shared cores a compute's end is known only once it ran */
    return !o->collective_steps && !o->node_collectives_transfers && ctx->trace == NULL &&
           ctx->node_cpus == NULL;
}

/* Whether device b, suspended in a node ring, can go on: the transfer it
 * receives is there to fetch, or both ends it waits for are known. */
static bool ring_can_go_on(const sim_actor *b)
{
    const sim_ring_member *m = &b->ctx->ring_members[b->ctx->ring_first[b->ring.group]];
    int k = b->ring.k, s = k & 1;
    bool from_there = m[b->ring.from].entered > k;
    if (b->ring.in_end_s < 0 && from_there && m[b->ring.from].out_transfer[s])
        return true;
    bool in_known = b->ring.in_end_s >= 0 || from_there;
    bool out_known = b->ring.out_transfer ? m[b->ring.rank].out_end_s[s] >= 0
                                          : m[b->ring.to].entered > k;
    return in_known && out_known;
}

static void ring_wake(sim_actor *a, int device)
{
    sim_actor *b = &a->ctx->actors[device];
    if (b->ring.blocked && ring_can_go_on(b)) {
        b->ring.blocked = false;
        sg_sem_release(b->wake);
    }
}

/* The one transfer of a coalesced ring inside a node: `bytes` to member
 * `to` and from member `from` (ranks in group g), plus `extra_latencies`
 * deferred route latencies (the steps merged into it). */
static bool node_ring(sim_actor *a, int g, int rank, int to, int from, double bytes,
                      int extra_latencies)
{
    sim_ctx *ctx = a->ctx;
    const ps_group *gr = &ctx->set->groups[g];
    sim_ring_member *m = &ctx->ring_members[ctx->ring_first[g]];
    int k = m[rank].entered, s = k & 1;
    double latency_s = ctx->c->intra.latency_s;
    double move_s = latency_s + (double)bytes_long(bytes) / ctx->c->intra.bandwidth_bytes_per_s;
    bool out_transfer = a->unreceived > 0;
    if (out_transfer) {
        flush_compute(a);
        if (!post_send(a, gr->devices[to], SENT_COLL, bytes))
            return false;
    }
    double arr_s = a->v_s;
    m[rank].arr_s[s] = arr_s;
    m[rank].out_end_s[s] = -1;
    m[rank].out_transfer[s] = out_transfer;
    m[rank].entered = k + 1;
    a->ring = (struct ring_wait){.group = g, .k = k, .rank = rank, .to = to, .from = from,
                                 .in_end_s = -1, .out_transfer = out_transfer};
    ring_wake(a, gr->devices[to]);
    if (from != to)
        ring_wake(a, gr->devices[from]);
    a->waiting = WAIT_COLLECTIVE;
    double out_end_s = -1;
    for (;;) {
        if (a->ring.in_end_s < 0 && m[from].entered > k) {
            if (!m[from].out_transfer[s]) {
                a->ring.in_end_s = fmax(m[from].arr_s[s], arr_s) + move_s;
            } else {
                flush_compute(a); /* posted at its arrival, or now if woken later */
                sg_mailbox_t in = peer_box(a, gr->devices[from], BOX_COLL_IN, NULL);
                if (in == NULL)
                    return actor_fail(a, PS_ERR_NOMEM, "out of memory");
                a->wait_peer = gr->devices[from];
                sg_mailbox_get(in);
                note_received(a, gr->devices[from], SENT_COLL);
                sync_clock(a);
                a->ring.in_end_s = m[from].out_end_s[s] = simgrid_get_clock();
                ring_wake(a, gr->devices[from]);
            }
        }
        if (out_end_s < 0) {
            if (!out_transfer && m[to].entered > k)
                out_end_s = fmax(arr_s, m[to].arr_s[s]) + move_s;
            else if (out_transfer && m[rank].out_end_s[s] >= 0)
                out_end_s = m[rank].out_end_s[s];
        }
        if (a->ring.in_end_s >= 0 && out_end_s >= 0)
            break;
        a->wait_peer = gr->devices[a->ring.in_end_s < 0 ? from : to];
        a->ring.blocked = true;
        sg_sem_acquire(a->wake);
        a->ring.blocked = false;
    }
    a->waiting = WAIT_NONE;
    double end_s = fmax(a->ring.in_end_s, out_end_s);
    /* waiting for the predecessor to arrive is idle time, as for a transfer */
    a->comm_s += end_s - fmax(arr_s, m[from].arr_s[s]);
    a->v_s = fmax(a->v_s, end_s);
    defer_comm(a, extra_latencies * latency_s);
    return true;
}

static int node_of(const sim_ctx *ctx, int device)
{
    return device / ctx->c->devices_per_node;
}

/* For an all-to-all on group g across nodes: the distance j such that
 * every member's j-th successor in the group sits on another node, where
 * every node of the group holds as many of its members; else -1. Found
 * once per group (O(n^2)), kept in its ring_end entry. */
static int a2a_shift(sim_ctx *ctx, int g)
{
    sim_ring_end *e = &ctx->ring_ends[g];
    if (e->a2a_shift != 0)
        return e->a2a_shift;
    const ps_group *gr = &ctx->set->groups[g];
    int n = gr->n, per = -1;
    e->a2a_shift = -1;
    for (int r = 0; r < n; r++) {
        int here = 0, node = node_of(ctx, gr->devices[r]);
        for (int q = 0; q < n; q++)
            here += node_of(ctx, gr->devices[q]) == node;
        if (per >= 0 && here != per)
            return -1;
        per = here;
    }
    e->a2a_per_node = per;
    for (int j = 1; j < n; j++) {
        bool apart = true;
        for (int r = 0; r < n && apart; r++)
            apart = node_of(ctx, gr->devices[r]) != node_of(ctx, gr->devices[(r + j) % n]);
        if (apart) {
            e->a2a_shift = j;
            break;
        }
    }
    return e->a2a_shift;
}

/* An all-to-all across nodes, every node holding p of its n members
 * (a2a_shift > 0): step by step a member sends a chunk to each of the
 * n - p members elsewhere and to each of its p - 1 node mates, n - 1
 * transfers. Here it sends the n - p chunks for other nodes as one
 * transfer to its partner at distance a2a_shift (on another node) and the
 * p - 1 for its node to its next node mate, both at once, with the n - 1
 * route latencies the steps have (deferred): every port and every NIC
 * carries the same bytes as the steps' (each node sends and receives
 * p (n - p) chunks through its NIC), in 2 transfers instead of n - 1.
 * Each member needs every other's chunks, so all end together, where the
 * last arrival plus the longest exchange puts them (ring_end). */
static bool spread_all_to_all(sim_actor *a, int g, int rank, double chunk)
{
    sim_ctx *ctx = a->ctx;
    const ps_group *gr = &ctx->set->groups[g];
    int n = gr->n, shift = ctx->ring_ends[g].a2a_shift, node = node_of(ctx, a->device);
    int next = rank, prev = rank, mates = ctx->ring_ends[g].a2a_per_node - 1;
    for (int q = 1; q < n && mates > 0 && next == rank; q++)
        if (node_of(ctx, gr->devices[(rank + q) % n]) == node)
            next = (rank + q) % n;
    for (int q = 1; q < n && mates > 0 && prev == rank; q++)
        if (node_of(ctx, gr->devices[(rank - q + n) % n]) == node)
            prev = (rank - q + n) % n;
    int elsewhere = n - 1 - mates;
    int peers[4] = {(rank + shift) % n, (rank - shift + n) % n, next, prev};
    int to[2] = {gr->devices[peers[0]], gr->devices[next]};
    int from[2] = {gr->devices[peers[1]], gr->devices[prev]};
    double bytes[2] = {elsewhere * chunk, mates * chunk};
    double extra_s = (elsewhere - 1) * ps_sim_route_latency_s(ctx->c, a->device, to[0]) +
                     (mates > 0 ? mates * ps_sim_route_latency_s(ctx->c, a->device, to[1]) : 0);
    double arr_s = simgrid_get_clock(), comm0_s = a->comm_s, delay0_s = a->pend_delay_s;
    sim_ring_member *me = &ctx->ring_members[ctx->ring_first[g] + rank];
    me->arr_s[me->entered++ & 1] = arr_s;
    if (!exchange(a, mates > 0 ? 2 : 1, to, from, bytes, extra_s))
        return false;
    ring_end(a, g, rank, peers, mates > 0 ? 4 : 2, arr_s, comm0_s, delay0_s);
    return true;
}

/* A collective on group g expanded into ring (or pairwise) steps (or, inside
 * a node with closed-form node collectives and `closed_ok`, added to the
 * pending delay). *t0: when the first transfer of the instruction began, -1
 * before. */
static bool ring_of(sim_actor *a, ps_collective kind, int g, double bytes, double *t0,
                    bool closed_ok)
{
    const ps_program_set *set = a->ctx->set;
    if (g < 0 || g >= set->n_groups)
        return actor_fail(a, PS_ERR_INVALID, "collective on an invalid group");
    const ps_group *gr = &set->groups[g];
    if (gr->n <= 1 || !(bytes > 0))
        return true; /* nothing moves; the cost model charges nothing either */
    bool one_node = false;
    int rank = group_rank(a, g, &one_node);
    if (rank == -2)
        return actor_fail(a, PS_ERR_NOMEM, "out of memory");
    if (rank < 0)
        return actor_fail(a, PS_ERR_INVALID, "collective on a group the device is not in");
    int n = gr->n, steps = ps_coll_step_count(kind, n);
    double chunk = bytes / n;
    if (one_node && closed_ok && a->ctx->o->node_collectives_closed_form) {
        const ps_cluster *c = a->ctx->c;
        double beta_s_per_byte = 1.0 / c->intra.bandwidth_bytes_per_s;
        defer_comm(a, ps_coll_ring_s(kind, n, bytes, c->intra.latency_s, beta_s_per_byte));
        a->pend_closed_form = true;
        return true;
    }
    if (one_node && node_rings_timed(a->ctx)) {
        /* ring kinds: all steps to the successor; an all-to-all as in the
         * coalesced transfers below */
        ps_coll_step s = ps_coll_step_of(PS_COLL_ALL_GATHER, n, rank, 0);
        bool a2a = kind == PS_COLL_ALL_TO_ALL;
        return node_ring(a, g, rank, s.send_to, s.recv_from, a2a ? (n - 1) * chunk : steps * chunk,
                         a2a ? n - 2 : steps - 1);
    }
    flush_compute(a);
    if (*t0 < 0) {
        *t0 = simgrid_get_clock();
        a->span_comm0_s = a->comm_s;
    }
    if (kind == PS_COLL_ALL_TO_ALL && one_node && !a->ctx->o->collective_steps && n > 2) {
        /* the n-1 pairwise steps as one transfer of their bytes to the ring
         * neighbour, plus n-2 latencies: the same time when uncontended, and
         * inside a node (a non-blocking switch) the same bytes through each
         * device's ports, so the same contention; n-1 times fewer transfers.
         * Across nodes the peers matter (which flows cross a NIC): step by step */
        ps_coll_step s = ps_coll_step_of(PS_COLL_ALL_GATHER, n, rank, 0);
        return transfer(a, gr->devices[s.send_to], gr->devices[s.recv_from], (n - 1) * chunk,
                        n - 2);
    }
    if (kind == PS_COLL_ALL_TO_ALL && !a->ctx->o->collective_steps && n > 2 &&
        a2a_shift(a->ctx, g) > 0)
        return spread_all_to_all(a, g, rank, chunk);
    for (int j = 0; j < steps;) {
        ps_coll_step s = ps_coll_step_of(kind, n, rank, j);
        int k = 1;
        while (!a->ctx->o->collective_steps && j + k < steps) {
            ps_coll_step s2 = ps_coll_step_of(kind, n, rank, j + k);
            if (s2.send_to != s.send_to || s2.recv_from != s.recv_from)
                break;
            k++;
        }
        /* merged steps across nodes end with the whole ring (ring_end);
         * inside a node the hops are alike, and the timed rings (node_ring)
         * must keep the transfers' times */
        bool together = k > 1 && !one_node;
        double arr_s = simgrid_get_clock(), comm0_s = a->comm_s, delay0_s = a->pend_delay_s;
        if (together) {
            sim_ring_member *me = &a->ctx->ring_members[a->ctx->ring_first[g] + rank];
            me->arr_s[me->entered++ & 1] = arr_s;
        }
        if (!transfer(a, gr->devices[s.send_to], gr->devices[s.recv_from], k * chunk, k - 1))
            return false;
        if (together) {
            int peers[2] = {s.send_to, s.recv_from};
            ring_end(a, g, rank, peers, 2, arr_s, comm0_s, delay0_s);
        }
        j += k;
    }
    return true;
}

static bool ring(sim_actor *a, ps_collective kind, int g, double bytes, double *t0)
{
    return ring_of(a, kind, g, bytes, t0, true);
}

static bool do_collective(sim_actor *a, const ps_instr *in, int mb)
{
    const ps_program_set *set = a->ctx->set;
    const ps_program *p = a->prog;
    if (in->coll >= PS_COLL_COUNT)
        return actor_fail(a, PS_ERR_INVALID, "unknown collective");
    ps_collective kind = (ps_collective)in->coll;
    double S = in->bytes;
    bool ok = true;
    double t0 = -1; /* set by the first ring that moves bytes */
    bool lockstep = a->cpu != NULL && a->ctx->c->scheduler_slice_s > 0;
    if (lockstep) {
        flush_compute(a); /* what it computed before the meeting, then it waits */
        a->blocked = true;
    }
    if (in->axis == PS_MESH_AXES) {
        /* the whole mesh, hierarchically as the cost model charges it:
         * axis 1 on the full size, axis 0 on what is left per device */
        int g0 = p->axis_group[0], g1 = p->axis_group[1];
        double d1 = p->stage >= 0 && p->stage < set->n_stages && set->stages[p->stage].mesh[1] > 0
                        ? set->stages[p->stage].mesh[1]
                        : 1;
        switch (kind) {
        case PS_COLL_ALL_REDUCE:
            ok = (g1 < 0 || ring(a, PS_COLL_REDUCE_SCATTER, g1, S, &t0)) &&
                 (g0 < 0 || ring(a, PS_COLL_ALL_REDUCE, g0, S / d1, &t0)) &&
                 (g1 < 0 || ring(a, PS_COLL_ALL_GATHER, g1, S, &t0));
            break;
        case PS_COLL_ALL_GATHER:
            ok = (g0 < 0 || ring(a, kind, g0, S / d1, &t0)) &&
                 (g1 < 0 || ring(a, kind, g1, S, &t0));
            break;
        case PS_COLL_REDUCE_SCATTER:
            ok = (g1 < 0 || ring(a, kind, g1, S, &t0)) &&
                 (g0 < 0 || ring(a, kind, g0, S / d1, &t0));
            break;
        case PS_COLL_ALL_TO_ALL:
            ok = (g1 < 0 || ring(a, kind, g1, S, &t0)) &&
                 (g0 < 0 || ring(a, kind, g0, S, &t0));
            break;
        case PS_COLL_COUNT: break;
        }
    } else {
        /* the overflow vote joins stages that do not run in step: its members
         * wait for each other even where node collectives are closed forms */
        ok = ring_of(a, kind, ps_instr_group(set, p, in), S, &t0,
                     !(in->flags & PS_INSTR_FINITE_VOTE));
    }
    a->blocked = false;
    if (ok && lockstep && in->axis == PS_MESH_AXES && p->stage >= 0 &&
        p->stage < set->n_stages) {
        const int *mesh = set->stages[p->stage].mesh; /* the whole mesh: the stage */
        lockstep_delay(a, NULL, -1, p->stage, mesh[0] * mesh[1]);
    } else if (ok && lockstep) {
        int g = ps_instr_group(set, p, in);
        if (g >= 0 && g < set->n_groups)
            lockstep_delay(a, &set->groups[g], -1, -1, set->groups[g].n);
    }
    if (ok && a->ctx->trace && t0 >= 0) {
        char name[64];
        if (in->flags & PS_INSTR_FINITE_VOTE)
            snprintf(name, sizeof name, "finite vote group %d", in->group);
        else if (in->axis >= 0)
            snprintf(name, sizeof name, "%s axis %d", ps_collective_names[kind], in->axis);
        else
            snprintf(name, sizeof name, "%s group %d", ps_collective_names[kind], in->group);
        /* waiting for its peers shows as idle, as the accounting counts it */
        double t1 = simgrid_get_clock();
        double wait_s = fmin(t1 - t0, fmax(0, (t1 - t0) - (a->comm_s - a->span_comm0_s)));
        if (wait_s > 0) {
            char what[64];
            if (in->axis >= 0)
                snprintf(what, sizeof what, "wait for axis %d", in->axis);
            else
                snprintf(what, sizeof what, "wait for group %d", in->group);
            trace_span(a, a->device, PS_TRACE_IDLE, what, t0, t0 + wait_s, mb, -1, 0, 0);
        }
        trace_span(a, a->device, PS_TRACE_COLLECTIVE, name, t0 + wait_s, t1, mb, -1, in->bytes,
                   0);
    }
    return ok;
}

/* ---- interpretation ---- */

static bool buffer_ok(const sim_actor *a, int b)
{
    return b >= 0 && b < a->ctx->set->n_buffers;
}

/* One instruction; mb is the micro-batch of its instances (the RUN's inside
 * a kernel); `scale` turns its compute seconds into this device's alone
 * (compute_scale). */
static bool step(sim_actor *a, const ps_instr *in, int mb, double scale)
{
    const ps_program_set *set = a->ctx->set;
    switch ((ps_instr_kind)in->kind) {
    case PS_INSTR_COMPUTE:
    case PS_INSTR_SLICE:
    {
        double d_s = in->seconds * scale;
        a->pend_compute_s += d_s;
        a->v_s += d_s;
        a->pend_pred_flops += in->flops;
        return true;
    }
    case PS_INSTR_LOAD: return true;
    case PS_INSTR_ALLOC:
        if (!buffer_ok(a, in->buffer))
            return actor_fail(a, PS_ERR_INVALID, "alloc of an invalid buffer");
        a->mem_bytes += set->buffers[in->buffer].bytes;
        if (a->mem_bytes > a->peak_mem_bytes)
            a->peak_mem_bytes = a->mem_bytes;
        return true;
    case PS_INSTR_FREE:
        if (!buffer_ok(a, in->buffer))
            return actor_fail(a, PS_ERR_INVALID, "free of an invalid buffer");
        /* sends of it may be in flight: it counts as freed now, as in the
         * program checker (see do_send) */
        a->mem_bytes -= set->buffers[in->buffer].bytes;
        return true;
    case PS_INSTR_COLLECTIVE: return do_collective(a, in, mb);
    case PS_INSTR_SEND:
        if (in->buffer >= 0 && !buffer_ok(a, in->buffer))
            return actor_fail(a, PS_ERR_INVALID, "send of an invalid buffer");
        return do_send(a, in);
    case PS_INSTR_RECV: return do_recv(a, in, mb);
    case PS_INSTR_RUN:
    case PS_INSTR_KIND_COUNT: break;
    }
    return actor_fail(a, PS_ERR_INVALID, "instruction not allowed here");
}

/* Predicted seconds of stage `stage` to this device's seconds alone. They
 * are for a device of peak ref at the stage's dtype (else this one), which
 * runs them in seconds * ref / its own peak at that dtype; with shared cores
 * they include the node's compute share, which the shared host models
 * instead. (The host's speed only converts seconds into its work.) */
static double compute_scale(const sim_actor *a, int stage)
{
    const ps_program_set *set = a->ctx->set;
    const ps_program_stage *st = stage >= 0 && stage < set->n_stages ? &set->stages[stage] : NULL;
    double ref = st != NULL ? st->reference_flops_per_s : 0, scale = 1;
    if (ref > 0) {
        double own = ps_device_kind_peak_flops_per_s(ps_cluster_device(a->ctx->c, a->device),
                                                     st->compute_dtype);
        if (own > 0)
            scale = ref / own;
    }
    if (a->cpu != NULL && st != NULL && st->compute_share > 1)
        scale /= st->compute_share;
    return scale;
}

static bool run_kernel(sim_actor *a, const ps_instr *in)
{
    const ps_program_set *set = a->ctx->set;
    if (in->kernel < 0 || in->kernel >= set->n_kernels)
        return actor_fail(a, PS_ERR_INVALID, "run of an invalid kernel");
    /* latencies deferred before the kernel (a program collective's) go into
     * its first execution, ahead of the kernel's own time */
    if (a->pend_compute_s > 0)
        flush_compute(a);
    const ps_kernel *k = &set->kernels[in->kernel];
    double scale = compute_scale(a, k->stage);
    a->cur_phase = (int)k->phase;
    a->cur_mb = in->mb;
    double t0 = a->v_s;
    /* what it was busy with before t0 (latencies deferred to here lie
     * before it and are credited at the next flush) */
    double busy0_s = a->compute_s + a->comm_s + a->pend_delay_s;
    for (int i = 0; i < k->n_instrs; i++) {
        a->kpc = i;
        if (k->instrs[i].kind == PS_INSTR_RUN)
            return actor_fail(a, PS_ERR_INVALID, "run inside a kernel");
        if (!step(a, &k->instrs[i], in->mb, scale))
            return false;
    }
    flush_compute(a);
    a->kpc = -1;
    if (k->phase < PS_PHASE_COUNT) {
        /* the run less what it waited for peers (idle: neither compute nor
         * communication), as the executors measure a phase */
        double busy_s = a->compute_s + a->comm_s - busy0_s;
        a->phase_sum_s[k->phase] += fmax(0.0, fmin(simgrid_get_clock() - t0, busy_s));
        a->phase_runs[k->phase]++;
    }
    a->cur_phase = a->cur_mb = -1;
    return true;
}

static void actor_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    sim_actor *a = sg_actor_self_get_data();
    const ps_program *p = a->prog;
    /* program-level computes (none in lowered programs) use the stage's */
    double scale = compute_scale(a, p->stage);
    for (a->pc = 0; a->pc < p->n_instrs; a->pc++) {
        const ps_instr *in = &p->instrs[a->pc];
        bool ok = in->kind == PS_INSTR_RUN ? run_kernel(a, in) : step(a, in, in->mb, scale);
        if (!ok)
            return;
    }
    flush_compute(a);
    a->blocked = true; /* done: it computes no more */
    a->end_s = simgrid_get_clock();
    a->waiting = WAIT_SENDS;
    release_sends(a, true);
    a->waiting = WAIT_NONE;
    a->done = true;
}

/* Prints simulated time and events about once a wall second (a daemon:
 * SimGrid ends it when the last device finishes). */
static void progress_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    sim_ctx *ctx = sg_actor_self_get_data();
    double dt_s = 1e-4, last = ps_monotonic_s();
    for (;;) {
        sg_actor_sleep_for(dt_s);
        double now = ps_monotonic_s();
        if (now - last < 0.25)
            dt_s *= 2;
        if (now - last >= 1.0) {
            long long events = 0;
            for (int d = 0; d < ctx->set->n_devices; d++)
                events += ctx->actors[d].events;
            fprintf(stderr, "sim: %.6g s simulated, %lld events, %.0f s\n", simgrid_get_clock(),
                    events, now - ctx->wall_start_s);
            last = now;
        }
    }
}

/* ---- setup and collection ---- */

static const char *wait_name(sim_wait w)
{
    switch (w) {
    case WAIT_RECV: return "a receive from device";
    case WAIT_COLLECTIVE: return "a collective step with device";
    case WAIT_SENDS: return "its send to be received by device";
    case WAIT_RING_END: return "the other members of its ring across nodes, group";
    case WAIT_NONE: break;
    }
    return "nothing";
}

static ps_status check_finished(sim_ctx *ctx, ps_error *err)
{
    int blocked = 0, first = -1;
    for (int d = 0; d < ctx->set->n_devices; d++)
        if (ctx->actors[d].prog != NULL && !ctx->actors[d].done) {
            blocked++;
            if (first < 0)
                first = d;
        }
    if (blocked == 0)
        return PS_OK;
    const sim_actor *a = &ctx->actors[first];
    char where[96] = "";
    if (a->kpc >= 0)
        snprintf(where, sizeof where, " (kernel %d, its instruction %d)",
                 a->prog->instrs[a->pc].kernel, a->kpc);
    char peer[24] = "";
    if (a->waiting != WAIT_NONE)
        snprintf(peer, sizeof peer, " %d", a->wait_peer);
    return ps_error_set(err, PS_ERR_INTERNAL,
                        "simulation deadlocked: %d device%s blocked; device %d waits at program "
                        "instruction %d%s for %s%s",
                        blocked, blocked == 1 ? "" : "s", first, a->pc, where,
                        wait_name(a->waiting), peer);
}

/* Actors the replay runs: the devices with a program. */
static long long count_actors(const ps_program_set *s)
{
    long long n = 0;
    for (int d = 0; d < s->n_devices; d++)
        n += s->programs[d].n_instrs > 0;
    return n;
}

/* simgrid_init wants argv-style options. */
static void init_simgrid(long long n_actors)
{
    static const char *const base[] = {
        "pipeshard-sim",
        /* exact alpha-beta transfers (FACTS.md): no latency or bandwidth
         * factors, no reverse-path traffic, no TCP window cap */
        "--cfg=network/model:CM02",
        "--cfg=network/crosstraffic:0",
        "--cfg=network/TCP-gamma:0",
#if defined(__SANITIZE_ADDRESS__)
        /* raw contexts switch stacks behind AddressSanitizer's back */
        "--cfg=contexts/factory:thread",
#else
        "--cfg=contexts/factory:raw",
        /* actors run shallow code (SimGrid's kernel runs on maestro's
         * stack; the tests pass with 16 KiB): 64 KiB instead of 8 MiB
         * halves the cost of creating and ending 16k actors, whose stacks
         * then come from the heap instead of a mapping each */
        "--cfg=contexts/stack-size:64",
#endif
    };
    /* SimGrid takes char **argv but does not write the strings */
    char *argv[32];
    int argc = 0;
    for (size_t i = 0; i < sizeof base / sizeof *base; i++)
        argv[argc++] = (char *)base[i];
    /* two guard mappings per actor would exceed vm.max_map_count; without
     * guards SimGrid zeroes the stacks (all resident): make them smaller */
    if (n_actors > 30000) {
        argv[argc++] = (char *)"--cfg=contexts/guard-size:0";
#if !defined(__SANITIZE_ADDRESS__)
        argv[argc++] = (char *)"--cfg=contexts/stack-size:32";
#endif
    }
    const char *log = getenv("PIPESHARD_LOG");
    if (log == NULL || strcmp(log, "debug") != 0)
        argv[argc++] = (char *)"--log=root.thres:critical";
    /* experiments: more SimGrid options, separated by spaces; they come
     * last and win (docs/simulator.md) */
    char extra[1024] = "";
    const char *env = getenv("PIPESHARD_SIMGRID_OPTIONS");
    if (env != NULL)
        snprintf(extra, sizeof extra, "%s", env);
    for (char *save = NULL, *tok = strtok_r(extra, " ", &save); tok != NULL && argc < 30;
         tok = strtok_r(NULL, " ", &save))
        argv[argc++] = tok;
    argv[argc] = NULL;
    simgrid_init(&argc, argv);
}

static ps_status map_hosts(sim_ctx *ctx, ps_error *err)
{
    /* sg_host_by_name searches zone by zone in SimGrid 3.32: map the list once */
    int n = (int)sg_host_count();
    sg_host_t *list = sg_host_list();
    for (int i = 0; i < n; i++) {
        const char *name = sg_host_get_name(list[i]);
        char *end = NULL;
        long d = strncmp(name, "dev", 3) == 0 ? strtol(name + 3, &end, 10) : -1;
        if (d >= 0 && d < ctx->set->n_devices && end != NULL && *end == '\0')
            ctx->hosts[d] = list[i];
    }
    for (int i = 0; i < n && ctx->node_cpus != NULL; i++) {
        const char *name = sg_host_get_name(list[i]);
        int k = -1, len = 0;
        if (sscanf(name, "node%d_cpu%n", &k, &len) == 1 && name[len] == '\0' && k >= 0 &&
            k < ctx->c->nodes)
            ctx->node_cpus[k] = list[i];
    }
    xbt_free(list);
    for (int d = 0; d < ctx->set->n_devices; d++)
        if (ctx->hosts[d] == NULL)
            return ps_error_set(err, PS_ERR_INTERNAL, "the platform has no host for device %d", d);
    for (int k = 0; ctx->node_cpus != NULL && k < ctx->c->nodes; k++)
        if (ctx->node_cpus[k] == NULL)
            return ps_error_set(err, PS_ERR_INTERNAL, "the platform has no cores for node %d", k);
    return PS_OK;
}

static ps_status open_trace(sim_ctx *ctx, ps_error *err)
{
    const ps_program_set *set = ctx->set;
    ps_status st = ps_trace_open(ctx->o->trace_path, ctx->c->devices_per_node, &ctx->trace, err);
    if (st != PS_OK)
        return st;
    st = ps_trace_set_info(ctx->trace, "source", "sim");
    if (st == PS_OK && set->plan_digest[0])
        st = ps_trace_set_info(ctx->trace, "plan", set->plan_digest);
    if (st == PS_OK && set->model[0])
        st = ps_trace_set_info(ctx->trace, "model", set->model);
    if (st == PS_OK && set->cluster[0])
        st = ps_trace_set_info(ctx->trace, "cluster", set->cluster);
    for (int d = 0; d < set->n_devices && st == PS_OK; d++) {
        if (set->programs[d].n_instrs == 0)
            continue;
        char name[64];
        snprintf(name, sizeof name, "device %d (stage %d)", d, set->programs[d].stage);
        st = ps_trace_name_device(ctx->trace, d, name);
    }
    if (st != PS_OK)
        ctx->trace_failed = true; /* close reports it */
    return PS_OK;
}

ps_status ps_sim_replay(const ps_program_set *s, const ps_cluster *c, const ps_sim_options *o,
                        const char *platform_path, ps_sim_result *res, ps_error *err)
{
    ps_status st = PS_OK;
    sim_ctx ctx = {.set = s, .c = c, .o = o, .wall_start_s = ps_monotonic_s()};
    ctx.actors = calloc((size_t)(s->n_devices > 0 ? s->n_devices : 1), sizeof *ctx.actors);
    ctx.hosts = calloc((size_t)(s->n_devices > 0 ? s->n_devices : 1), sizeof *ctx.hosts);
    PS_TRY_ALLOC(ctx.actors, err);
    PS_TRY_ALLOC(ctx.hosts, err);
    if (ps_cluster_compute_share(c) > 1) { /* else every device has a core of its own */
        ctx.node_cpus = calloc((size_t)c->nodes, sizeof *ctx.node_cpus);
        PS_TRY_ALLOC(ctx.node_cpus, err);
    }
    long long members = 0;
    for (int g = 0; g < s->n_groups; g++)
        members += s->groups[g].n > 0 ? s->groups[g].n : 0;
    ctx.ring_first = calloc((size_t)(s->n_groups > 0 ? s->n_groups : 1), sizeof *ctx.ring_first);
    ctx.ring_members = calloc((size_t)(members > 0 ? members : 1), sizeof *ctx.ring_members);
    ctx.ring_ends = calloc((size_t)(s->n_groups > 0 ? s->n_groups : 1), sizeof *ctx.ring_ends);
    if (ctx.ring_first == NULL || ctx.ring_members == NULL || ctx.ring_ends == NULL) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory for %lld ring members", members);
        goto out;
    }
    members = 0;
    for (int g = 0; g < s->n_groups; g++) {
        ctx.ring_first[g] = (int)members;
        members += s->groups[g].n > 0 ? s->groups[g].n : 0;
    }
    init_simgrid(count_actors(s));
    double t0 = ps_monotonic_s();
    simgrid_load_platform(platform_path);
    res->load_s = ps_monotonic_s() - t0;
    unlink(platform_path); /* gone even if the parent dies now (it unlinks too) */
    PS_TRY(map_hosts(&ctx, err));
    if (o->trace_path != NULL)
        PS_TRY(open_trace(&ctx, err));

    for (int d = 0; d < s->n_devices; d++) {
        sim_actor *a = &ctx.actors[d];
        a->ctx = &ctx;
        a->device = d;
        a->pc = 0;
        a->kpc = -1;
        a->cur_phase = a->cur_mb = -1;
        if (s->programs[d].n_instrs == 0) {
            a->blocked = true; /* never runs */
            continue;
        }
        a->prog = &s->programs[d];
        a->speed_flops_per_s = sg_host_get_speed(ctx.hosts[d]);
        if (ctx.node_cpus != NULL)
            a->cpu = ctx.node_cpus[d / c->devices_per_node];
        char name[32];
        snprintf(name, sizeof name, "dev%d", d);
        sg_actor_t actor = sg_actor_init(name, ctx.hosts[d]);
        sg_actor_set_data(actor, a);
        a->wake = sg_sem_init(0);
        sg_actor_start(actor, actor_main, 0, NULL);
    }
    if (o->progress) {
        sg_actor_t actor = sg_actor_init("progress", ctx.hosts[0]);
        sg_actor_set_data(actor, &ctx);
        sg_actor_daemonize(actor);
        sg_actor_start(actor, progress_main, 0, NULL);
    }

    simgrid_run();

    if (ctx.err.status != PS_OK) {
        st = ps_error_set(err, ctx.err.status, "%s", ctx.err.msg);
        goto out;
    }
    PS_TRY(check_finished(&ctx, err));
    res->iteration_s = 0;
    res->events = 0;
    for (int d = 0; d < s->n_devices && d < res->n_devices; d++) {
        const sim_actor *a = &ctx.actors[d];
        ps_sim_device_result *r = &res->devices[d];
        memset(r, 0, sizeof *r);
        r->has_program = a->prog != NULL;
        r->compute_s = a->compute_s;
        r->comm_s = a->comm_s;
        r->end_s = a->end_s;
        r->peak_memory_bytes = a->peak_mem_bytes;
        for (int ph = 0; ph < PS_PHASE_COUNT; ph++) {
            r->phase_sum_s[ph] = a->phase_sum_s[ph];
            r->phase_runs[ph] = a->phase_runs[ph];
        }
        res->iteration_s = fmax(res->iteration_s, a->end_s);
        res->events += a->events;
    }
out:
    if (ctx.trace != NULL) {
        ps_status cst = ps_trace_close(ctx.trace, err);
        if (st == PS_OK)
            st = cst;
    }
    if (ctx.actors != NULL)
        for (int d = 0; d < s->n_devices; d++) {
            if (ctx.actors[d].wake != NULL)
                sg_sem_destroy(ctx.actors[d].wake);
            free(ctx.actors[d].sends);
            free(ctx.actors[d].peers);
            free(ctx.actors[d].grp_key);
            free(ctx.actors[d].grp_rank);
        }
    free(ctx.actors);
    free(ctx.hosts);
    free(ctx.node_cpus);
    for (int g = 0; ctx.ring_ends != NULL && g < s->n_groups; g++)
        if (ctx.ring_ends[g].bar != NULL)
            sg_barrier_destroy(ctx.ring_ends[g].bar);
    free(ctx.ring_first);
    free(ctx.ring_members);
    free(ctx.ring_ends);
    res->wall_s = ps_monotonic_s() - ctx.wall_start_s;
    return st;
}
