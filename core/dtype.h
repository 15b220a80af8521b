/* Element types of tensors. */
#ifndef PS_CORE_DTYPE_H
#define PS_CORE_DTYPE_H

#include <stddef.h>

typedef enum ps_dtype {
    PS_DTYPE_F32 = 0,
    PS_DTYPE_F16 = 1,
    PS_DTYPE_BF16 = 2,
    PS_DTYPE_I32 = 3, /* token ids and labels */
    PS_DTYPE_COUNT
} ps_dtype;

/* The floating-point types a device reports peak FLOP/s for. */
#define PS_FLOAT_DTYPE_COUNT 3

size_t ps_dtype_size(ps_dtype t);
const char *ps_dtype_name(ps_dtype t); /* "fp32", "fp16", "bf16", "i32" */
/* Returns 0 and sets *out for a known name, -1 otherwise. */
int ps_dtype_parse(const char *name, ps_dtype *out);
extern const char *const ps_dtype_names[PS_DTYPE_COUNT];

#endif
