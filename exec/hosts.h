/* The processes of a run: one per host, joined through MPI when pipeshard is
 * started by an MPI launcher (mpirun, mpiexec, srun); one process otherwise.
 * exec/hosts.c is the only file that includes mpi.h.
 *
 * Devices belong to hosts node-major, as in the cluster: device d runs in
 * the process of rank d / devices_per_host. A process runs the threads of
 * its own devices; devices of other processes are reached through
 * ps_hosts_send / ps_hosts_recv, which any device thread may call at any
 * time (MPI_THREAD_MULTIPLE). The process-wide calls (barrier, sum, gather,
 * broadcast) are made by one thread of every process, in the same order on
 * every process. */
#ifndef PS_EXEC_HOSTS_H
#define PS_EXEC_HOSTS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"

typedef struct ps_hosts ps_hosts;

/* Message channels between a pair of devices; each is ordered on its own. */
enum { PS_HOSTS_CHANNEL_P2P = 0, PS_HOSTS_CHANNEL_COLLECTIVE = 1, PS_HOSTS_CHANNELS = 2 };

/* True when an MPI launcher started this process (its environment says so). */
bool ps_hosts_launched(void);
/* True when this build can join an MPI launch. */
bool ps_hosts_have_mpi(void);

/* Joins the launch (MPI_Init_thread with MPI_THREAD_MULTIPLE) when there is
 * one, else makes a single-process group. Call once per process. */
ps_status ps_hosts_init(ps_hosts **out, ps_error *err);
/* Waits for sends still in flight, then leaves (MPI_Finalize). NULL is a no-op. */
void ps_hosts_finalize(ps_hosts *h);
/* Stops every process of the launch (MPI_Abort) with exit code `code`. */
void ps_hosts_abort(ps_hosts *h, int code);

int ps_hosts_rank(const ps_hosts *h);
int ps_hosts_count(const ps_hosts *h);
/* This process's rank among the launch's processes on this machine (0 when
 * each host runs one, as intended; more when a test starts several on one
 * machine, which then share its GPUs). */
int ps_hosts_node_rank(const ps_hosts *h);
/* Devices per process (after ps_hosts_assign; the last may have fewer). */
int ps_hosts_per_host(const ps_hosts *h);

/* Gives the plan's devices to the processes: the launch must have exactly
 * ceil(n_devices / per_host) processes. */
ps_status ps_hosts_assign(ps_hosts *h, int n_devices, int per_host, ps_error *err);
/* Rank of the process that runs `device` (after assign). */
int ps_hosts_owner(const ps_hosts *h, int device);
bool ps_hosts_is_local(const ps_hosts *h, int device);

/* A message of `bytes` bytes at `data` from device `src` (local) to device
 * `dst` (on another process). Takes ownership of `owner`, the malloc'd block
 * that holds the data (freed once sent, or on failure), and returns at once. */
ps_status ps_hosts_send(ps_hosts *h, int src, int dst, int channel, const void *data,
                        size_t bytes, void *owner, ps_error *err);
/* Waits for the next message from `src` to `dst` (local) on `channel`, or
 * until stop(arg) says to give up (PS_ERR_DEVICE). *data is malloc'd; the
 * caller frees it. */
ps_status ps_hosts_recv(ps_hosts *h, int src, int dst, int channel, bool (*stop)(void *),
                        void *arg, void **data, size_t *bytes, ps_error *err);

/* Process-wide, one thread per process. */
ps_status ps_hosts_barrier(ps_hosts *h, ps_error *err);
/* In-place sum of n doubles over the processes; every process gets it. */
ps_status ps_hosts_sum(ps_hosts *h, double *values, int n, ps_error *err);
/* Every process gives `bytes` bytes; rank 0 gets them all, concatenated in
 * rank order, in *all (malloc'd) with each rank's size in sizes[rank] (an
 * array of ps_hosts_count entries, the caller's). Other ranks get NULL. */
ps_status ps_hosts_gather(ps_hosts *h, const void *mine, size_t bytes, void **all,
                          size_t *sizes, ps_error *err);
/* The same, every process getting them all (sizes too). */
ps_status ps_hosts_allgather(ps_hosts *h, const void *mine, size_t bytes, void **all,
                             size_t *sizes, ps_error *err);
/* `bytes` bytes of rank `root` copied to every process. */
ps_status ps_hosts_bcast(ps_hosts *h, void *buf, size_t bytes, int root, ps_error *err);

#endif
