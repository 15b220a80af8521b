#include "core/collective.h"

const char *const ps_collective_names[PS_COLL_COUNT] = {"all-reduce", "all-gather",
                                                        "reduce-scatter", "all-to-all"};

double ps_coll_ring_s(ps_collective kind, int n, double bytes, double alpha_s,
                      double beta_s_per_byte)
{
    if (n <= 1 || bytes <= 0)
        return 0;
    double steps = ps_coll_step_count(kind, n);
    return steps * (alpha_s + bytes / n * beta_s_per_byte);
}

int ps_coll_step_count(ps_collective kind, int n)
{
    if (n <= 1)
        return 0;
    return kind == PS_COLL_ALL_REDUCE ? 2 * (n - 1) : n - 1;
}

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

ps_coll_step ps_coll_step_of(ps_collective kind, int n, int rank, int j)
{
    ps_coll_step s = {.send_to = mod(rank + 1, n), .recv_from = mod(rank - 1, n)};
    switch (kind) {
    case PS_COLL_ALL_REDUCE:
        /* reduce-scatter phase leaves rank r with the sum of chunk r + 1;
         * the all-gather phase then circulates the sums */
        if (j < n - 1) {
            s.send_chunk = mod(rank - j, n);
            s.recv_chunk = mod(rank - j - 1, n);
            s.reduce = true;
        } else {
            int k = j - (n - 1);
            s.send_chunk = mod(rank + 1 - k, n);
            s.recv_chunk = mod(rank - k, n);
        }
        break;
    case PS_COLL_REDUCE_SCATTER:
        /* shifted by one so that rank r ends with chunk r */
        s.send_chunk = mod(rank - j - 1, n);
        s.recv_chunk = mod(rank - j - 2, n);
        s.reduce = true;
        break;
    case PS_COLL_ALL_GATHER:
        s.send_chunk = mod(rank - j, n);
        s.recv_chunk = mod(rank - j - 1, n);
        break;
    case PS_COLL_ALL_TO_ALL:
        /* pairwise exchange: step j pairs r with r + j + 1 and r - j - 1 */
        s.send_to = mod(rank + j + 1, n);
        s.recv_from = mod(rank - j - 1, n);
        s.send_chunk = s.send_to;
        s.recv_chunk = s.recv_from;
        break;
    case PS_COLL_COUNT: break;
    }
    return s;
}

void ps_coll_chunk(int64_t count, int n, int i, int64_t *start, int64_t *len)
{
    int64_t base = count / n, extra = count % n;
    *len = base + (i < extra ? 1 : 0);
    *start = i * base + (i < extra ? i : extra);
}
