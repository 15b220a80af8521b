#include "core/dtype.h"

#include <string.h>

const char *const ps_dtype_names[PS_DTYPE_COUNT] = {"fp32", "fp16", "bf16", "i32"};

size_t ps_dtype_size(ps_dtype t)
{
    switch (t) {
    case PS_DTYPE_F32: return 4;
    case PS_DTYPE_F16: return 2;
    case PS_DTYPE_BF16: return 2;
    case PS_DTYPE_I32: return 4;
    case PS_DTYPE_COUNT: break;
    }
    return 0;
}

const char *ps_dtype_name(ps_dtype t)
{
    return (unsigned)t < PS_DTYPE_COUNT ? ps_dtype_names[t] : "?";
}

int ps_dtype_parse(const char *name, ps_dtype *out)
{
    for (int i = 0; i < PS_DTYPE_COUNT; i++) {
        if (strcmp(name, ps_dtype_names[i]) == 0) {
            *out = (ps_dtype)i;
            return 0;
        }
    }
    return -1;
}
