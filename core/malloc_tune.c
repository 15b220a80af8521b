/* See malloc_tune.h. */
#include "core/malloc_tune.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void ps_malloc_tune(char **argv)
{
#if defined(__linux__) && defined(__GLIBC__)
    if (argv == NULL || argv[0] == NULL || getenv("GLIBC_TUNABLES") != NULL)
        return;
    char value[64];
    snprintf(value, sizeof value, "glibc.malloc.tcache_count=%d", PS_MALLOC_TCACHE_COUNT);
    if (setenv("GLIBC_TUNABLES", value, 1) != 0)
        return;
    execv("/proc/self/exe", argv); /* set above: the new image returns at once */
    unsetenv("GLIBC_TUNABLES");    /* no /proc: run on with the defaults */
#else
    (void)argv;
#endif
}
