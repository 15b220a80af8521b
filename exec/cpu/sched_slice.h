/* The operating system scheduler's slice as the CPU backend's device threads
 * meet it: how long a busy thread runs before its core goes to another when
 * more threads compute than there are cores. The simulator's lockstep delay
 * on shared cores scales with it (core/cluster.h scheduler_slice_s). */
#ifndef PS_EXEC_CPU_SCHED_SLICE_H
#define PS_EXEC_CPU_SCHED_SLICE_H

#include "core/status.h"

/* Runs `threads` busy threads (>= 2) for `seconds` of wall time each; every
 * thread reads the clock continuously and a gap of more than 20 µs between
 * two readings is a preemption. *slice_s: the median time a thread ran
 * between two preemptions (ps_median), or 0 when fewer than 20 such runs
 * were seen (the threads had a core each). */
ps_status ps_measure_scheduler_slice(int threads, double seconds, double *slice_s,
                                     ps_error *err);

#endif
