/* Collectives combined in host memory: every member of a group sends its
 * copy (with its tile's geometry) to every other member through a mailbox,
 * and each member computes its result from all copies in member order, so
 * that every member, in any process, gets the same numbers as the
 * single-process rendezvous of the CPU backend.
 *
 * The CPU backend uses the combination for every collective and the
 * exchange for groups that span processes; the CUDA backend uses both for
 * groups that span processes when its devices share one GPU (downloading
 * its copy first and uploading the result). */
#ifndef PS_EXEC_HOST_COLLECTIVE_H
#define PS_EXEC_HOST_COLLECTIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "exec/backend.h"
#include "exec/mailbox.h"

/* The members' copies of one collective, by member. */
typedef struct ps_exchange {
    int n;
    void **copy;    /* [n] host data (copy[rank] is the caller's, borrowed) */
    ps_tile *geo;   /* [n] their tiles' geometry (data pointers unused) */
    int64_t *count; /* [n] elements */
    void **owner;   /* [n] what holds each received copy (freed by ps_exchange_free) */
} ps_exchange;

/* Whether every member of the group runs in this process. */
bool ps_group_is_local(const ps_mailbox *mb, const ps_exec_group *g);

/* Sends `count` elements of `elem` bytes at `data` (and the geometry of geo,
 * which may be NULL) to every other member of g, and receives theirs; `kind`
 * names the collective, and members that entered different ones fail with
 * a named error. Sends never wait, so the exchange cannot deadlock. On
 * failure x holds nothing (ps_exchange_free is still allowed). */
ps_status ps_exchange_run(ps_mailbox *mb, int device, const ps_exec_group *g, int kind,
                          const void *data, size_t elem, int64_t count, const ps_tile *geo,
                          ps_exchange *x, ps_error *err);
void ps_exchange_free(ps_exchange *x);

/* Writes dst (fp32) from the n members' fp32 copies (copy[m], tile geometry
 * geo[m]) in member order: all-reduce and reduce-scatter sum over dst's
 * box, all-gather and all-to-all copy each element from the lowest member
 * holding it (and fail when an element of dst is held by none). */
/* PS_ERR_INTERNAL naming the collective when the members' boxes leave part
 * of dst's box uncovered (a gather would leave it unwritten; every backend
 * asks this of all-gather and all-to-all). */
ps_status ps_gather_check_cover(int device, int group, ps_collective kind, int n,
                                const ps_tile *members, const ps_tile *dst, ps_error *err);

ps_status ps_combine_tiles(int device, int group, ps_collective kind, int n, const ps_tile *geo,
                           void *const *copy, ps_tile *dst, ps_error *err);
/* Combines n values of float (dbl false) or double from every member, in
 * member order and in the values' precision (floats add in float), into
 * data; every member must give n values. */
ps_status ps_combine_values(int device, int n_members, void *const *copy, const int64_t *count,
                            void *data, int64_t n, ps_reduce_op op, bool dbl, ps_error *err);

#endif
