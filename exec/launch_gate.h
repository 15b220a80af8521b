/* Collective launches made by several threads, kept apart from device
 * memory operations.
 *
 * Where GPUs of one process have peer access to each other (the CUDA
 * backend's NCCL mode), cudaMalloc and cudaFree may wait for the kernels of
 * every peer GPU; an NCCL kernel waits for its group's other members to
 * launch theirs, each from its own thread. A memory operation between a
 * group's first and last launch can so wait for a kernel that waits for a
 * launch stuck behind the memory operation: a deadlock.
 *
 * The gate keeps them apart. A group's launch window opens once every
 * member of this process has arrived and no memory operation runs or
 * waits, and closes when the last of them has launched (left). Memory
 * operations wait for open windows to close; they do not exclude each
 * other. Between entering and leaving a window a thread makes no memory
 * operation (it would wait for its own window).
 *
 * Host-only (no CUDA): the CUDA backend is its user, tests/test_launch_gate.c
 * checks it with threads. */
#ifndef PS_EXEC_LAUNCH_GATE_H
#define PS_EXEC_LAUNCH_GATE_H

#include <stdbool.h>

#include "core/status.h"

typedef struct ps_launch_gate ps_launch_gate;

/* One group's window state: `members`, the group's members in this
 * process, set before first use; the rest zero. Owned by the caller, used
 * under the gate's lock only. */
typedef struct ps_launch_window {
    int members;
    int arrived;   /* members waiting for the window to open */
    int launching; /* members inside the open window */
    unsigned gen;  /* windows opened so far */
} ps_launch_window;

ps_status ps_launch_gate_create(ps_launch_gate **out, ps_error *err);
/* NULL is a no-op. No thread may be inside. */
void ps_launch_gate_destroy(ps_launch_gate *g);

/* Around each device memory operation (allocation, free, a library's
 * setup that allocates). A NULL gate: nothing (no peer access, no NCCL). */
void ps_launch_gate_mem_enter(ps_launch_gate *g);
void ps_launch_gate_mem_exit(ps_launch_gate *g);

/* Waits for every member of w, then for the memory operations running or
 * waiting, and opens the window: true, and the caller launches and then
 * calls ps_launch_gate_window_leave. false after ps_launch_gate_abort (the
 * caller does not leave). A NULL gate: true at once. */
bool ps_launch_gate_window_enter(ps_launch_gate *g, ps_launch_window *w);
void ps_launch_gate_window_leave(ps_launch_gate *g, ps_launch_window *w);

/* Members waiting for a window (now or later) give up: a member stopped
 * before arriving must not hold the others. Memory operations still wait
 * for windows already open, which close as their members leave. */
void ps_launch_gate_abort(ps_launch_gate *g);

/* For tests: windows open now, memory operations running, and waiting. */
int ps_launch_gate_open_windows(ps_launch_gate *g);
int ps_launch_gate_mem_running(ps_launch_gate *g);
int ps_launch_gate_mem_waiting(ps_launch_gate *g);

#endif
