/* What a measured step's communication spent waiting for peers: a receive
 * until its sender began sending, a collective until its last member
 * entered it. The simulator counts such waits as idle time, not as
 * communication (sim/replay.c); the executors measure every transfer and
 * collective whole, and this module splits the wait off afterwards, from the
 * events of all the run's devices on their common clock (exec/runtime.c
 * stamps every event from the step's origin).
 *
 * Matching follows the programs' order: the k-th receive on device q from
 * device p is the k-th send from p to q (the messages between two devices
 * are first in, first out), and the k-th collective of group g on one
 * member is its k-th on every member. A pair that does not match (a
 * receive of another size than its send, another kind of collective, a
 * device without such an event) and a peer
 * whose events are not at hand (the runtime exchanges the processes' events
 * at each step's end) leave the event's wait at zero: unknown, it stays
 * communication. Sends are not split: a buffered send
 * does not wait, and a send that waits for its receiver posts first. */
#ifndef PS_EXEC_PEER_WAITS_H
#define PS_EXEC_PEER_WAITS_H

#include <stdint.h>

#include "core/program.h"
#include "core/status.h"

typedef enum ps_wait_kind {
    PS_WAIT_NONE = 0,       /* compute: never waits for a peer here */
    PS_WAIT_COLLECTIVE = 1, /* `with`: the group (an index into the set's groups) */
    PS_WAIT_SEND = 2,       /* `with`: the receiving device */
    PS_WAIT_RECV = 3,       /* `with`: the sending device */
} ps_wait_kind;

/* One event of a device's step. */
typedef struct ps_timed_event {
    int kind;       /* ps_wait_kind */
    int with;       /* group or peer device, by kind */
    int what;       /* a collective's kind (ps_collective); checked equal across members */
    double bytes;   /* checked equal between a send and its receive */
    double t0, dur; /* seconds from the step's origin, shared by the devices compared */
} ps_timed_event;

/* One device's step: its events, and (built by ps_step_events_index) its
 * communication events sorted by what they match on. */
typedef struct ps_step_events {
    const ps_timed_event *ev; /* [n], borrowed */
    int n;
    struct ps_wait_ref *refs; /* owned */
    int n_refs, cap_refs;
} ps_step_events;

/* Indexes s->ev[0..s->n) (set them first); keeps its allocation from step
 * to step. PS_ERR_NOMEM. */
ps_status ps_step_events_index(ps_step_events *s, ps_error *err);
void ps_step_events_free(ps_step_events *s);

/* wait[i] (seconds, 0 <= wait[i] <= ev[i].dur) for every event i of
 * `device`. steps[j]: device j's indexed step, or NULL where its events are
 * not at hand (another process). Reads the other devices' steps only. */
void ps_peer_waits(const ps_step_events *const *steps, int n_devices, int device,
                   const ps_program_set *set, double *wait);

#endif
