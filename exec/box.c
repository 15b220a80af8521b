#include "exec/box.h"

#include <stdlib.h>
#include <string.h>

#include "exec/half.h"

bool ps_box_intersect(int rank, const int64_t *a_off, const int64_t *a_size,
                      const int64_t *b_off, const int64_t *b_size, int64_t *off, int64_t *size)
{
    for (int k = 0; k < rank; k++) {
        int64_t lo = a_off[k] > b_off[k] ? a_off[k] : b_off[k];
        int64_t ha = a_off[k] + a_size[k], hb = b_off[k] + b_size[k];
        int64_t hi = ha < hb ? ha : hb;
        if (hi <= lo)
            return false;
        off[k] = lo;
        size[k] = hi - lo;
    }
    return true;
}

int64_t ps_box_numel(int rank, const int64_t *size)
{
    int64_t n = 1;
    for (int k = 0; k < rank; k++)
        n *= size[k];
    return n;
}

void ps_tile_box(const ps_tile *t, int64_t *off, int64_t *size)
{
    for (int k = 0; k < t->rank; k++) {
        off[k] = t->offset[k];
        size[k] = t->shape[k];
    }
}

typedef struct box {
    int64_t off[PS_MAX_RANK], size[PS_MAX_RANK];
} box;

int ps_boxes_cover(const ps_tile *dst, int n, const ps_tile *members)
{
    /* what no member has covered yet; on the stack while it fits (every
     * gather of the CPU backend asks, and grid-aligned tiles leave few) */
    box stack[16];
    box *left = stack;
    int rank = dst->rank, cap = 16, used = 1;
    ps_tile_box(dst, left[0].off, left[0].size);
    if (ps_box_numel(rank, left[0].size) == 0)
        used = 0;
    for (int m = 0; m < n && used > 0; m++) {
        int64_t mo[PS_MAX_RANK], ms[PS_MAX_RANK];
        ps_tile_box(&members[m], mo, ms);
        for (int i = used - 1; i >= 0; i--) {
            box u = left[i], cut;
            if (!ps_box_intersect(rank, u.off, u.size, mo, ms, cut.off, cut.size))
                continue;
            /* u less the cut: per dimension, the slabs below and above the
             * cut, within the cut's extent in the dimensions before */
            left[i] = left[--used];
            for (int k = 0; k < rank; k++) {
                int64_t lo = u.off[k], hi = u.off[k] + u.size[k];
                int64_t clo = cut.off[k], chi = cut.off[k] + cut.size[k];
                for (int side = 0; side < 2; side++) {
                    int64_t a = side == 0 ? lo : chi, z = side == 0 ? clo : hi;
                    if (z <= a)
                        continue;
                    if (used == cap) {
                        box *grown = left == stack ? malloc((size_t)cap * 2 * sizeof *left)
                                                   : realloc(left, (size_t)cap * 2 * sizeof *left);
                        if (grown == NULL) {
                            if (left != stack)
                                free(left);
                            return -1;
                        }
                        if (left == stack)
                            memcpy(grown, stack, sizeof stack);
                        left = grown;
                        cap *= 2;
                    }
                    box piece = u;
                    piece.off[k] = a;
                    piece.size[k] = z - a;
                    left[used++] = piece;
                }
                u.off[k] = clo;
                u.size[k] = chi - clo;
            }
        }
    }
    if (left != stack)
        free(left);
    return used == 0;
}

/* Local linear index in t of global coordinate c. */
static int64_t local_index(const ps_tile *t, const int64_t *c)
{
    int64_t i = 0;
    for (int k = 0; k < t->rank; k++)
        i = i * t->shape[k] + (c[k] - t->offset[k]);
    return i;
}

/* How many trailing dimensions of the box every tile holds whole: their
 * elements, and those of the dimension before them within the box, are
 * contiguous in each tile, so one run covers them. Without this a weight
 * [O, C, 1, 1] went element by element, 4x the time of the 1x1
 * convolution's gradient that it accumulated. */
static int whole_trailing_dims(int rank, const int64_t *size, const ps_tile *a, const ps_tile *b)
{
    int n = 0;
    for (int k = rank - 1; k > 0; k--, n++)
        if (size[k] != a->shape[k] || (b != NULL && size[k] != b->shape[k]))
            break;
    return n;
}

/* Walks the box in row-major runs: calls fn for each run of the last
 * dimension, or of the last `fold` + 1 dimensions when the tiles hold the
 * last `fold` whole (whole_trailing_dims). */
typedef void (*row_fn)(void *arg, const int64_t *coord, int64_t len, int64_t flat);

static void walk_rows(int rank, const int64_t *off, const int64_t *size, int fold, row_fn fn,
                      void *arg)
{
    int64_t c[PS_MAX_RANK] = {0};
    if (rank == 0) {
        fn(arg, c, 1, 0);
        return;
    }
    for (int k = 0; k < rank; k++)
        if (size[k] <= 0)
            return;
    memcpy(c, off, (size_t)rank * sizeof *c);
    int last = rank - 1 - fold; /* the dimension the runs step through */
    int64_t row = 1, flat = 0;
    for (int k = last; k < rank; k++)
        row *= size[k];
    for (;;) {
        fn(arg, c, row, flat);
        flat += row;
        int k = last - 1;
        for (; k >= 0; k--) {
            if (++c[k] < off[k] + size[k])
                break;
            c[k] = off[k];
        }
        if (k < 0)
            return;
    }
}

typedef struct copy_arg {
    const ps_tile *src;
    ps_tile *dst;
    bool add;
} copy_arg;

static void copy_row(void *arg, const int64_t *c, int64_t len, int64_t flat)
{
    (void)flat;
    copy_arg *a = arg;
    int64_t si = a->src->rank ? local_index(a->src, c) : 0;
    int64_t di = a->dst->rank ? local_index(a->dst, c) : 0;
    int eb = ps_tile_elem_bytes(a->dst);
    if (!a->add) {
        memcpy((char *)a->dst->data + di * eb, (const char *)a->src->data + si * eb,
               (size_t)len * (size_t)eb);
    } else if (ps_tile_is_half(a->dst)) { /* each sum rounded, as a half-precision add */
        ps_half_add(a->dst->dtype, (uint16_t *)a->dst->data + di,
                    (const uint16_t *)a->src->data + si, len);
    } else {
        const float *s = (const float *)a->src->data + si;
        float *d = (float *)a->dst->data + di;
        for (int64_t i = 0; i < len; i++)
            d[i] += s[i];
    }
}

void ps_box_copy_host(const ps_tile *src, ps_tile *dst, const int64_t *off, const int64_t *size,
                      bool add)
{
    copy_arg a = {src, dst, add};
    walk_rows(dst->rank, off, size, whole_trailing_dims(dst->rank, size, src, dst), copy_row, &a);
}

typedef struct pack_arg {
    ps_tile *t;
    int64_t start, end;
    char *packed;
    bool unpack;
} pack_arg;

static void pack_row(void *arg, const int64_t *c, int64_t len, int64_t flat)
{
    pack_arg *a = arg;
    int64_t lo = flat > a->start ? flat : a->start;
    int64_t hi = flat + len < a->end ? flat + len : a->end;
    if (hi <= lo)
        return;
    int64_t ti = (a->t->rank ? local_index(a->t, c) : 0) + (lo - flat);
    int eb = ps_tile_elem_bytes(a->t);
    char *tile = (char *)a->t->data + ti * eb, *p = a->packed + (lo - a->start) * eb;
    if (a->unpack)
        memcpy(tile, p, (size_t)(hi - lo) * (size_t)eb);
    else
        memcpy(p, tile, (size_t)(hi - lo) * (size_t)eb);
}

void ps_box_pack_host(const ps_tile *t, const int64_t *off, const int64_t *size, int64_t start,
                      int64_t len, void *packed)
{
    pack_arg a = {(ps_tile *)t, start, start + len, packed, false};
    walk_rows(t->rank, off, size, whole_trailing_dims(t->rank, size, t, NULL), pack_row, &a);
}

void ps_box_unpack_host(ps_tile *t, const int64_t *off, const int64_t *size, int64_t start,
                        int64_t len, const void *packed)
{
    pack_arg a = {t, start, start + len, (char *)packed, true};
    walk_rows(t->rank, off, size, whole_trailing_dims(t->rank, size, t, NULL), pack_row, &a);
}
