/* Wall-clock time for measuring durations (solver limits, planning and
 * simulation times, executor timelines). */
#ifndef PS_CORE_CLOCK_H
#define PS_CORE_CLOCK_H

/* Seconds on a monotonic clock (CLOCK_MONOTONIC): only differences mean anything. */
double ps_monotonic_s(void);

#endif
