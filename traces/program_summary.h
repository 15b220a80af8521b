/* The shape of a run summary from the program set that ran: what the
 * simulator and the executors fill alike, so that their summaries of one
 * plan join in `pipeshard compare` by construction. */
#ifndef PS_TRACES_PROGRAM_SUMMARY_H
#define PS_TRACES_PROGRAM_SUMMARY_H

#include "core/program.h"
#include "traces/summary.h"

/* A new summary with source, plan digest, model, cluster (cluster_name when
 * the set records none), micro-batches; each device's stage; each stage's
 * device count, first device, submesh (hosts of devices_per_node devices;
 * device ids are node-major) and logical mesh. Times, memory and throughput
 * are left at zero. */
ps_status ps_summary_from_programs(const ps_program_set *set, const char *source,
                                   const char *cluster_name, int devices_per_node,
                                   ps_summary **out, ps_error *err);

/* TFLOP/s per device and MFU from the summary's iteration_s and the set's
 * FLOPs per step, over the devices that have a stage. */
void ps_summary_set_throughput(ps_summary *s, const ps_program_set *set);

#endif
