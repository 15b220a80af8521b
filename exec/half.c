#include "exec/half.h"

#include <string.h>

bool ps_half_dtype(ps_dtype t) { return t == PS_DTYPE_F16 || t == PS_DTYPE_BF16; }

static uint16_t bf16_from_float(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep the sign, set the quiet bit */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* to nearest, ties to even; overflows to inf */
    return (uint16_t)(u >> 16);
}

static float bf16_to_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* fp16 (IEEE binary16) by bit arithmetic: the compiler's _Float16 is a
 * soft-float call per value on x86-64 without F16C, 4x slower in a step. */
static uint16_t f16_from_float(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* 65520 and beyond round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal: rebias the exponent, round at bit 13 */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    /* subnormal or zero: adding 0.5 (ulp 2^-24, fp16's subnormal step)
     * rounds to nearest even in hardware; the mantissa is the count */
    float f;
    memcpy(&f, &a, sizeof f);
    f += 0.5f;
    memcpy(&a, &f, sizeof a);
    return (uint16_t)(sign | (a - 0x3f000000u));
}

static float f16_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) { /* zero or subnormal: m * 2^-24, exact in float */
        float f = (float)m * 0x1p-24f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    } else {
        u = sign | ((e + 112u) << 23) | (m << 13);
    }
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t ps_half_from_float(ps_dtype t, float x)
{
    return t == PS_DTYPE_BF16 ? bf16_from_float(x) : f16_from_float(x);
}

float ps_half_to_float(ps_dtype t, uint16_t h)
{
    return t == PS_DTYPE_BF16 ? bf16_to_float(h) : f16_to_float(h);
}

void ps_half_narrow(ps_dtype t, const float *src, uint16_t *dst, int64_t n)
{
    if (t == PS_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++)
            dst[i] = bf16_from_float(src[i]);
    else
        for (int64_t i = 0; i < n; i++)
            dst[i] = f16_from_float(src[i]);
}

void ps_half_widen(ps_dtype t, const uint16_t *src, float *dst, int64_t n)
{
    if (t == PS_DTYPE_BF16)
        for (int64_t i = n - 1; i >= 0; i--)
            dst[i] = bf16_to_float(src[i]);
    else
        for (int64_t i = n - 1; i >= 0; i--)
            dst[i] = f16_to_float(src[i]);
}
