/* Half-precision storage: fp16 and bf16 tensors are held in 2 bytes per
 * element and computed in fp32 (widened on the way in, rounded to nearest
 * even on the way out), as mixed-precision training does on GPUs. These are
 * the host conversions, bit-exact with CUDA's __float2half_rn and
 * __float2bfloat16_rn: the CPU backend's arithmetic and the runtime's
 * uploads and downloads of half tiles. */
#ifndef PS_EXEC_HALF_H
#define PS_EXEC_HALF_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"

/* fp16 or bf16: the dtypes held in 2 bytes. */
bool ps_half_dtype(ps_dtype t);

/* One value: float -> half bits (round to nearest even; NaN stays NaN,
 * beyond the largest finite value gives infinity) and back (exact). */
uint16_t ps_half_from_float(ps_dtype t, float x);
float ps_half_to_float(ps_dtype t, uint16_t h);

/* n values. Both may run in place (dst == (void *)src): narrowing walks
 * forwards (each 2-byte write trails its 4-byte read), widening backwards
 * (each 4-byte write lands past the 2-byte values still to read). */
void ps_half_narrow(ps_dtype t, const float *src, uint16_t *dst, int64_t n);
void ps_half_widen(ps_dtype t, const uint16_t *src, float *dst, int64_t n);

/* dst[i] = dst[i] + src[i], each sum in fp32 rounded once: a half add. */
void ps_half_add(ps_dtype t, uint16_t *dst, const uint16_t *src, int64_t n);

/* Index of the first inf or NaN of n half values, or -1. */
int64_t ps_half_find_nonfinite(ps_dtype t, const uint16_t *src, int64_t n);

/* The n-value functions run 8-wide AVX2/F16C kernels where the CPU has
 * them, with the scalar code's bits. Turns them on (where supported) or
 * off, before any thread converts; returns whether they now run. For
 * tests and measurements. */
bool ps_half_vector_kernels(bool on);

#endif
