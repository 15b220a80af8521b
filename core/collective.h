/* Collectives: their kinds, byte conventions, closed-form ring times, and
 * the expansion of one collective into the point-to-point steps of a ring
 * (all-to-all: pairwise exchanges), which the simulator and the CPU executor
 * share so that both move the same chunks.
 *
 * Byte conventions (the cost model's): all-reduce and all-to-all: the local
 * size; all-gather: the gathered (output) size; reduce-scatter: the input
 * size. With n members every step moves a 1/n chunk of that size. */
#ifndef PS_CORE_COLLECTIVE_H
#define PS_CORE_COLLECTIVE_H

#include <stdbool.h>
#include <stdint.h>

typedef enum ps_collective {
    PS_COLL_ALL_REDUCE = 0,
    PS_COLL_ALL_GATHER = 1,
    PS_COLL_REDUCE_SCATTER = 2,
    PS_COLL_ALL_TO_ALL = 3,
    PS_COLL_COUNT
} ps_collective;

extern const char *const ps_collective_names[PS_COLL_COUNT];

/* Ring time with per-step latency alpha_s and seconds per byte beta:
 *   all-reduce 2(n-1)(alpha + B/n beta), the others (n-1)(alpha + B/n beta). */
double ps_coll_ring_s(ps_collective kind, int n, double bytes, double alpha_s,
                      double beta_s_per_byte);

/* Number of point-to-point steps of a collective among n members
 * (0 when n <= 1). */
int ps_coll_step_count(ps_collective kind, int n);

/* Step j of member `rank`: it sends chunk send_chunk to member send_to and
 * receives chunk recv_chunk from member recv_from (ranks within the group);
 * `reduce`: the received chunk is added to the local one, else copied. Chunk
 * i is the i-th of n near-equal parts of the buffer (ps_coll_chunk). For
 * all-to-all, the chunk sent is an index into the input and the one received
 * an index into the output. At the end, reduce-scatter leaves member r with
 * chunk r and all-gather fills every chunk. */
typedef struct ps_coll_step {
    int send_to, recv_from;
    int send_chunk, recv_chunk;
    bool reduce;
} ps_coll_step;
ps_coll_step ps_coll_step_of(ps_collective kind, int n, int rank, int j);

/* Elements [*start, *start + *len) of chunk i of n of a buffer of count
 * elements (the first count % n chunks are one longer). */
void ps_coll_chunk(int64_t count, int n, int i, int64_t *start, int64_t *len);

#endif
