/* Messages between the devices of a run, in host memory: a FIFO per
 * (source, destination, channel), in this process for two devices of it,
 * through ps_hosts (MPI) for a device of another process. A post never
 * waits for its receiver, so that programs free of deadlocks with buffered
 * sends stay so; a take waits for the next message or an abort.
 *
 * The CPU backend moves all its messages through it; the CUDA backend what
 * goes to a device of another process, staged through host memory. */
#ifndef PS_EXEC_MAILBOX_H
#define PS_EXEC_MAILBOX_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "exec/hosts.h"

typedef struct ps_mailbox ps_mailbox;

/* hosts is borrowed; NULL (or one process) keeps every device local. */
ps_status ps_mailbox_create(int n_devices, ps_hosts *hosts, ps_mailbox **out, ps_error *err);
/* Frees the messages never taken. NULL is a no-op. */
void ps_mailbox_destroy(ps_mailbox *mb);

/* Whether `device` runs in another process. */
bool ps_mailbox_is_remote(const ps_mailbox *mb, int device);

/* A payload of `bytes` bytes (16-byte aligned) for ps_mailbox_post, or
 * NULL when out of memory; ps_mailbox_discard frees one never posted. */
void *ps_mailbox_payload(size_t bytes);
void ps_mailbox_discard(void *payload);

/* Sends a payload of ps_mailbox_payload from src (local) to dst on
 * `channel` (PS_HOSTS_CHANNEL_*); takes ownership, also on failure. */
ps_status ps_mailbox_post(ps_mailbox *mb, int src, int dst, int channel, void *payload,
                          ps_error *err);
/* The next message from src to dst (local) on `channel`: *payload holds
 * *bytes bytes until free(*owner). Fails with PS_ERR_DEVICE after an abort. */
ps_status ps_mailbox_take(ps_mailbox *mb, int src, int dst, int channel, void **payload,
                          size_t *bytes, void **owner, ps_error *err);

/* Wakes every take, now and later, with PS_ERR_DEVICE. */
void ps_mailbox_abort(ps_mailbox *mb);
bool ps_mailbox_aborted(ps_mailbox *mb);

#endif
