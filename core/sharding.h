/* Sharding specs: how one tensor is laid out over a logical 2-D device mesh.
 *
 * Per tensor dimension, a bitmask of the mesh axes that split it: 0 =
 * replicated, 1 = split over axis 0, 2 = over axis 1, 3 = over both (axis 0
 * major: the dimension is cut into d0 * d1 blocks and device (i0, i1) holds
 * block i0 * d1 + i1). A tensor may also be a partial sum over some axes: the
 * devices along such an axis hold addends whose sum is the value. Each mesh
 * axis is used at most once in a spec. Written as in Alpa: "S0,R,S01" per
 * dimension, then "|P1" for partial sums ("-" for a scalar). */
#ifndef PS_CORE_SHARDING_H
#define PS_CORE_SHARDING_H

#include <stdbool.h>
#include <stdint.h>

#include "core/op.h"

#define PS_MESH_AXES 2
#define PS_SPEC_STR_MAX 64

typedef struct ps_sharding_spec {
    int rank;
    uint8_t dim_axes[PS_MAX_RANK]; /* bitmask of mesh axes splitting each dimension */
    uint8_t partial;               /* bitmask of mesh axes with pending sums */
} ps_sharding_spec;

ps_sharding_spec ps_spec_replicated(int rank);
bool ps_spec_equal(const ps_sharding_spec *a, const ps_sharding_spec *b);
/* The dimension split by mesh axis `axis`, -1 if none. */
int ps_spec_dim_of_axis(const ps_sharding_spec *s, int axis);
/* Each axis used at most once, masks within 0..3, rank in range. */
bool ps_spec_well_formed(const ps_sharding_spec *s);
/* Number of blocks dimension d is cut into on a d0 x d1 mesh. */
int64_t ps_spec_parts(const ps_sharding_spec *s, int d, const int mesh[PS_MESH_AXES]);
/* Local tile shape; false when a dimension is not divisible by its parts. */
bool ps_spec_tile(const ps_sharding_spec *s, const ps_tensor_desc *t,
                  const int mesh[PS_MESH_AXES], ps_tensor_desc *tile);
/* Bytes of the local tile (assumes ps_spec_tile succeeds). */
double ps_spec_tile_bytes(const ps_sharding_spec *s, const ps_tensor_desc *t,
                          const int mesh[PS_MESH_AXES]);
/* Start index, per dimension, of the tile held by mesh coordinate (i0, i1). */
void ps_spec_tile_offset(const ps_sharding_spec *s, const ps_tensor_desc *t,
                         const int mesh[PS_MESH_AXES], int i0, int i1, int64_t *offset);

/* "S0,R,S01|P1" into buf (at least PS_SPEC_STR_MAX bytes). */
const char *ps_spec_format(const ps_sharding_spec *s, char *buf, int cap);
/* The rank a spec text describes (its number of dimensions). */
int ps_spec_text_rank(const char *text);
/* Parses the same notation for a tensor of the given rank; false on
 * malformed text or a different number of dimensions. */
bool ps_spec_parse(const char *text, int rank, ps_sharding_spec *out);

#endif
