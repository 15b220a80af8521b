/* Shared by the tests: a deterministic random generator (xorshift64), so
 * that a failing random case reproduces. */
#ifndef PS_TESTS_TEST_UTIL_H
#define PS_TESTS_TEST_UTIL_H

#include <stdint.h>

static uint64_t test_rng_state = 0x9e3779b97f4a7c15ull;

static inline void test_rng_seed(uint64_t seed) { test_rng_state = seed ? seed : 1; }

/* Uniform in [0, 1). */
static inline double uniform(void)
{
    test_rng_state ^= test_rng_state << 13;
    test_rng_state ^= test_rng_state >> 7;
    test_rng_state ^= test_rng_state << 17;
    return (double)(test_rng_state >> 11) / 9007199254740992.0;
}

/* Uniform in 0..n-1. */
static inline int below(int n) { return (int)(uniform() * n); }

#endif
