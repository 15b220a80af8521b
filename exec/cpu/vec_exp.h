/* exp() over an array of doubles, vectorized where the machine allows it.
 * The CPU backend's exponentials (GELU, softmax, the cross-entropy loss) were
 * about a third of a small GPT step's compute as scalar exp() calls; glibc's
 * vector math library (libmvec) computes four at a time with AVX2, which made
 * those ops 1.6-2.7 times faster here (docs/executors.md, "Exponentials"). */
#ifndef PS_EXEC_CPU_VEC_EXP_H
#define PS_EXEC_CPU_VEC_EXP_H

#include <stdbool.h>
#include <stdint.h>

/* x[i] = exp(x[i]) for i < n: libmvec's 4-wide exp (at most 4 ulp from the
 * exact value, glibc's bound; exp() is within 1) where the build found it
 * and the CPU has AVX2, exp() otherwise. Special values as exp(): -inf -> 0,
 * +inf and overflow -> +inf, NaN -> NaN. */
void ps_exp_inplace(double *x, int64_t n);

/* Whether ps_exp_inplace takes the vector path on this machine. */
bool ps_exp_is_vectorized(void);

#endif
