#include "core/array.h"

#include <stdlib.h>

ps_status ps_array_grow(void **items, int *cap, int need, size_t size)
{
    if (need <= *cap)
        return PS_OK;
    int cap2 = *cap ? *cap : 64;
    while (cap2 < need)
        cap2 *= 2;
    void *bigger = realloc(*items, (size_t)cap2 * size);
    if (bigger == NULL)
        return PS_ERR_NOMEM;
    *items = bigger;
    *cap = cap2;
    return PS_OK;
}
