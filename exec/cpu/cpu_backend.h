/* The CPU reference backend: every device of a plan is a thread of this
 * process with host memory; ops in fp32 through exec/cpu/cpu_ops.c
 * (OpenBLAS GEMMs), collectives and point-to-point transfers through shared
 * memory. It is the correctness oracle, not a performance model: a
 * collective sums its members' tiles in rank order (the same order on
 * every member), whatever ring the cluster would use. */
#ifndef PS_EXEC_CPU_CPU_BACKEND_H
#define PS_EXEC_CPU_CPU_BACKEND_H

#include "exec/backend.h"

/* slots[d]: timing slots of device d (ps_exec_timing_slots). Sets
 * OpenBLAS to one thread per call (the devices are the parallelism). */
ps_status ps_cpu_backend_create(int n_devices, const int *slots, ps_backend **out, ps_error *err);

#endif
