#include "exec/half.h"

#include <stdatomic.h>
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
    if (e == 0x1f) { /* infinity, or NaN made quiet (as F16C's conversion does) */
        u = sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0);
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

/* ---- n values: vector kernels where the CPU has them ----
 * AVX2 and F16C (x86-64 since 2013) do 8 values an instruction. F16C's
 * conversions are IEEE's (round to nearest even, subnormals kept; MXCSR's
 * DAZ is never set here); bf16's are the scalar bit arithmetic above, 8
 * lanes at a time. Both give the scalar code's bits: test_exec checks every
 * half value and the rounding midpoints through each path. */

static void narrow_scalar(ps_dtype t, const float *src, uint16_t *dst, int64_t i, int64_t n)
{
    if (t == PS_DTYPE_BF16)
        for (; i < n; i++)
            dst[i] = bf16_from_float(src[i]);
    else
        for (; i < n; i++)
            dst[i] = f16_from_float(src[i]);
}

/* Backwards from n - 1 down to 0 (in place: see half.h). */
static void widen_scalar(ps_dtype t, const uint16_t *src, float *dst, int64_t n)
{
    if (t == PS_DTYPE_BF16)
        for (int64_t i = n - 1; i >= 0; i--)
            dst[i] = bf16_to_float(src[i]);
    else
        for (int64_t i = n - 1; i >= 0; i--)
            dst[i] = f16_to_float(src[i]);
}

static void add_scalar(ps_dtype t, uint16_t *dst, const uint16_t *src, int64_t i, int64_t n)
{
    for (; i < n; i++)
        dst[i] = ps_half_from_float(t, ps_half_to_float(t, dst[i]) + ps_half_to_float(t, src[i]));
}

#if defined(__x86_64__) && defined(__GNUC__)
#define PS_HALF_VEC 1
#include <cpuid.h>
#include <immintrin.h>

#define PS_VEC __attribute__((target("avx2,f16c")))

static PS_VEC __m256 vec_widen(ps_dtype t, const uint16_t *src)
{
    __m128i h = _mm_loadu_si128((const __m128i *)src);
    if (t == PS_DTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static PS_VEC __m128i vec_narrow(ps_dtype t, __m256 x)
{
    if (t == PS_DTYPE_F16)
        return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i u = _mm256_castps_si256(x);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    /* 32 -> 16 bits: packus works per 128-bit lane; gather the two low halves */
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(p);
}

/* Each vector kernel ends with vzeroupper before the scalar tail: with the
 * upper halves of the YMM registers left dirty, every later SSE instruction
 * of the (non-AVX) build waits on them, and the fp32 kernels ran 1.5x slower
 * (GCC 12 omits it before a tail call). */

/* Forwards, 8 at a time: in place, each 16-byte store lands at or before
 * the 32 bytes just loaded. */
static PS_VEC void narrow_vec(ps_dtype t, const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), vec_narrow(t, _mm256_loadu_ps(src + i)));
    _mm256_zeroupper();
    narrow_scalar(t, src, dst, i, n);
}

/* Backwards, 8 at a time, then the first n % 8 backwards: in place, each
 * store lands past the values still to read. */
static PS_VEC void widen_vec(ps_dtype t, const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = n;
    while (i >= 8) {
        i -= 8;
        _mm256_storeu_ps(dst + i, vec_widen(t, src + i));
    }
    _mm256_zeroupper();
    widen_scalar(t, src, dst, i);
}

static PS_VEC void add_vec(ps_dtype t, uint16_t *dst, const uint16_t *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 sum = _mm256_add_ps(vec_widen(t, dst + i), vec_widen(t, src + i));
        _mm_storeu_si128((__m128i *)(dst + i), vec_narrow(t, sum));
    }
    _mm256_zeroupper();
    add_scalar(t, dst, src, i, n);
}

static bool vec_supported(void)
{
    /* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
     * does not know it; "avx2" also checks that the OS saves YMM state */
    unsigned eax, ebx, ecx, edx;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
           (ecx & bit_F16C) != 0;
}
#else /* no vector kernels here: the scalar loops only */
static bool vec_supported(void) { return false; }
#endif

/* -1: not yet asked; then whether the vector kernels run. Set by
 * ps_half_vector_kernels at start-up, or by the first conversion: device
 * threads may each store the same answer, hence relaxed atomics. */
static _Atomic int use_vec = -1;

#ifdef PS_HALF_VEC
static bool vec_on(void)
{
    int v = atomic_load_explicit(&use_vec, memory_order_relaxed);
    if (v < 0) {
        v = vec_supported();
        atomic_store_explicit(&use_vec, v, memory_order_relaxed);
    }
    return v == 1;
}
#endif

bool ps_half_vector_kernels(bool on)
{
    int v = on && vec_supported();
    atomic_store_explicit(&use_vec, v, memory_order_relaxed);
    return v == 1;
}

void ps_half_narrow(ps_dtype t, const float *src, uint16_t *dst, int64_t n)
{
#ifdef PS_HALF_VEC
    if (vec_on()) {
        narrow_vec(t, src, dst, n);
        return;
    }
#endif
    narrow_scalar(t, src, dst, 0, n);
}

void ps_half_widen(ps_dtype t, const uint16_t *src, float *dst, int64_t n)
{
#ifdef PS_HALF_VEC
    if (vec_on()) {
        widen_vec(t, src, dst, n);
        return;
    }
#endif
    widen_scalar(t, src, dst, n);
}

void ps_half_add(ps_dtype t, uint16_t *dst, const uint16_t *src, int64_t n)
{
#ifdef PS_HALF_VEC
    if (vec_on()) {
        add_vec(t, dst, src, n);
        return;
    }
#endif
    add_scalar(t, dst, src, 0, n);
}

int64_t ps_half_find_nonfinite(ps_dtype t, const uint16_t *src, int64_t n)
{
    /* every exponent bit set: inf or NaN */
    uint16_t exponent = t == PS_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    for (int64_t i = 0; i < n; i++)
        if ((src[i] & exponent) == exponent)
            return i;
    return -1;
}
