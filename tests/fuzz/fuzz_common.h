/* Shared by the fuzz targets (tests/fuzz/fuzz_*.c; docs/fuzzing.md).
 *
 * Each target defines LLVMFuzzerTestOneInput. Built with clang's libFuzzer
 * (`make fuzz`) it explores; linked with replay_main.c (every build) it runs
 * the stored corpus as a CTest test, so that what the fuzzer once found stays
 * fixed. A target returns quietly when the input is refused with an error, and
 * aborts (FUZZ_ASSERT) when a property every accepted input must have fails:
 * what loads must save, and what it saves must load back equal. */
#ifndef PS_TESTS_FUZZ_COMMON_H
#define PS_TESTS_FUZZ_COMMON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A target calls this when an input went all the way through (loaded,
 * saved and loaded back, planned or lowered: each target says how far).
 * The replay checks that stored inputs named valid-* do, so that a parser
 * that came to refuse everything fails the corpus test; under libFuzzer it
 * does nothing. */
void fuzz_accepted(void);
__attribute__((weak)) void fuzz_accepted(void) {}

#define FUZZ_ASSERT(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond);            \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* The input as a NUL-terminated string (owned by the caller); inputs with a
 * NUL inside are cut there, as a C string reader would see them. */
static inline char *fuzz_text(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (s == NULL)
        abort(); /* not the code under test: the harness itself */
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* j written out as the project's files are (owned by the caller). */
static inline char *fuzz_dump(const json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    FUZZ_ASSERT(s != NULL, "json_dumps failed");
    return s;
}

/* Refusals are the expected outcome of most inputs: warnings about those
 * that pass would drown the fuzzer's own output (core/log.c reads the
 * threshold once, at the first message). */
static inline void fuzz_quiet(void)
{
    setenv("PIPESHARD_LOG", "error", 0);
}

#endif
