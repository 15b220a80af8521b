#include "exec/cpu/vec_exp.h"

#include <math.h>

#if defined(PS_HAVE_LIBMVEC)
#include <immintrin.h>

/* libmvec's AVX2 variant of exp (the vector function ABI's name: 'd' for
 * AVX2, N4 four lanes, v one vector argument). Declared here: no header
 * declares it (glibc's math.h only marks exp as having SIMD variants under
 * -ffast-math, for the compiler's vectorizer). */
__attribute__((target("avx2"))) extern __m256d _ZGVdN4v_exp(__m256d x);

__attribute__((target("avx2"))) static void exp_avx2(double *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        _mm256_storeu_pd(x + i, _ZGVdN4v_exp(_mm256_loadu_pd(x + i)));
    if (i < n) { /* the tail through the same function, so every element rounds alike */
        double pad[4] = {0, 0, 0, 0};
        for (int64_t k = i; k < n; k++)
            pad[k - i] = x[k];
        _mm256_storeu_pd(pad, _ZGVdN4v_exp(_mm256_loadu_pd(pad)));
        for (int64_t k = i; k < n; k++)
            x[k] = pad[k - i];
    }
}

/* Asked once per call: __builtin_cpu_supports reads a table that the
 * compiler's runtime fills before main, no CPUID per call. */
bool ps_exp_is_vectorized(void)
{
    return __builtin_cpu_supports("avx2");
}
#else
bool ps_exp_is_vectorized(void)
{
    return false;
}
#endif

void ps_exp_inplace(double *x, int64_t n)
{
#if defined(PS_HAVE_LIBMVEC)
    if (ps_exp_is_vectorized()) {
        exp_avx2(x, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        x[i] = exp(x[i]);
}
