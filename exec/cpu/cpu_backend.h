/* The CPU reference backend: every device of a plan is a thread of this
 * process with host memory; ops in fp32 through exec/cpu/cpu_ops.c
 * (OpenBLAS GEMMs), collectives and point-to-point transfers through shared
 * memory. It is the correctness oracle, not a performance model: a
 * collective sums its members' tiles in rank order (the same order on
 * every member), whatever ring the cluster would use.
 *
 * Across hosts (exec/hosts.h: one process per host under mpirun), the
 * devices of this process are threads as above, and a transfer or a
 * collective that involves a device of another process goes through MPI:
 * the members of such a collective send each other their tiles and every
 * member sums them in the same rank order, so the numbers are bit for bit
 * those of the single-process run. */
#ifndef PS_EXEC_CPU_CPU_BACKEND_H
#define PS_EXEC_CPU_CPU_BACKEND_H

#include "exec/backend.h"
#include "exec/hosts.h"

/* slots[d]: timing slots of device d (ps_exec_timing_slots). hosts: the
 * processes of the run after ps_hosts_assign, borrowed; NULL when every
 * device is in this process. Sets OpenBLAS to one thread per call (the
 * devices are the parallelism). */
ps_status ps_cpu_backend_create(int n_devices, const int *slots, ps_hosts *hosts,
                                ps_backend **out, ps_error *err);

/* The host memory check_memory lets the devices' tiles take (bytes; -1,
 * the default: what the system has available, MemAvailable on Linux). */
void ps_cpu_backend_set_host_memory(ps_backend *b, int64_t bytes);

#endif
