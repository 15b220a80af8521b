/* The allocator settings a long simulation wants, for a program's main(). */
#ifndef PS_CORE_MALLOC_TUNE_H
#define PS_CORE_MALLOC_TUNE_H

/* Call first thing in main(). With glibc on Linux, when the environment has
 * no GLIBC_TUNABLES, re-executes the program (same pid, same argv) with
 * glibc's per-thread cache of freed blocks raised from 7 to
 * PS_MALLOC_TCACHE_COUNT blocks per size: SimGrid allocates and frees a few
 * small objects per simulated event, in bursts of thousands, and the larger
 * cache makes a large simulation about 1.35x faster at the same peak memory
 * (docs/simulator.md). glibc reads tunables only at start-up, hence the
 * re-execution. Set GLIBC_TUNABLES (even to "") to keep glibc's defaults,
 * and under a tool that would not follow an exec of /proc/self/exe
 * (valgrind without --trace-children=yes). 
 * Returns only when nothing was re-executed (or the exec failed). */
void ps_malloc_tune(char **argv);

#define PS_MALLOC_TCACHE_COUNT 2000

#endif
