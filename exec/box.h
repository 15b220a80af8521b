/* Boxes of a tensor in global coordinates, and copies between host tiles:
 * the data movement of the CPU backend (the CUDA backend has the same on
 * the device). A box is (offset, size) per dimension. */
#ifndef PS_EXEC_BOX_H
#define PS_EXEC_BOX_H

#include <stdbool.h>
#include <stdint.h>

#include "exec/tile.h"

/* The intersection of two boxes; false when empty. */
bool ps_box_intersect(int rank, const int64_t *a_off, const int64_t *a_size,
                      const int64_t *b_off, const int64_t *b_size, int64_t *off, int64_t *size);
int64_t ps_box_numel(int rank, const int64_t *size);

/* Elements of box (inside both tiles, of one element type) from src to
 * dst; add: dst += src (float tiles; half tiles round each sum). Host
 * memory. */
void ps_box_copy_host(const ps_tile *src, ps_tile *dst, const int64_t *off, const int64_t *size,
                      bool add);

/* Flat elements [start, start + len) of the box (row-major over the box,
 * which must lie inside the tile) to or from a packed buffer of the tile's
 * element size. */
void ps_box_pack_host(const ps_tile *t, const int64_t *off, const int64_t *size, int64_t start,
                      int64_t len, void *packed);
void ps_box_unpack_host(ps_tile *t, const int64_t *off, const int64_t *size, int64_t start,
                        int64_t len, const void *packed);

/* The tile's own box. */
void ps_tile_box(const ps_tile *t, int64_t *off, int64_t *size);

/* Whether the boxes of the n tiles (their offsets and shapes; data unused)
 * cover every element of dst's box: 1 yes, 0 no, -1 out of memory. Exact
 * for any overlaps (what is still uncovered is kept as boxes, each member
 * cutting them up). A gather whose members leave part of its tile
 * uncovered would leave it unwritten. */
int ps_boxes_cover(const ps_tile *dst, int n, const ps_tile *members);

#endif
