/* The memory a run will ask its backend for, known before it starts: the
 * runtime's own rules (exec/runtime.c) walked over each device's program
 * without running it. A plan whose tiles do not fit is refused with a
 * message instead of failing part-way (a GPU's allocation) or being killed
 * by the system (host memory, which Linux hands out before it has it). */
#ifndef PS_EXEC_MEMORY_NEED_H
#define PS_EXEC_MEMORY_NEED_H

#include <stdint.h>

#include "core/program.h"
#include "exec/backend.h"
#include "exec/hosts.h"

/* Bytes device `device` holds at the peak of a step on backend b: every
 * parameter and optimizer-state tile (kept from step to step), plus the
 * most the step's other buffers hold at once, with the scratch tile of a
 * gradient accumulated where the backend cannot add in place and the
 * overflow vote's flag. It is what the backend's peak_bytes reports after
 * the run. */
ps_status ps_exec_memory_need(const ps_program_set *s, const ps_backend *b, int device,
                              int64_t *bytes, ps_error *err);

/* Asks the backend whether the needs of this process's devices fit
 * (ps_backend_ops.check_memory; a backend without it: no check). Across
 * several processes (hosts, may be NULL) every process must call it, and
 * every one answers the same: one host that does not fit (or cannot tell)
 * fails them all, the others' message naming it, so that they can all stop
 * in order. */
ps_status ps_exec_check_memory(const ps_program_set *s, ps_backend *b, ps_hosts *hosts,
                               ps_error *err);

#endif
