/* Growable arrays: the one helper behind every (items, n, cap) triple. */
#ifndef PS_CORE_ARRAY_H
#define PS_CORE_ARRAY_H

#include <stddef.h>

#include "core/status.h"

/* Makes room for `need` items of `size` bytes in *items (capacity *cap),
 * doubling from 64; PS_ERR_NOMEM leaves the array as it was. */
ps_status ps_array_grow(void **items, int *cap, int need, size_t size);

#endif
