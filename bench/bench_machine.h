/* The machine a benchmark ran on, for the comment line that heads every
 * benchmark CSV: "nproc N; cpu MODEL; uname SYS RELEASE ARCH" (commas in
 * the CPU model become spaces, so the line stays one CSV field). Header-only:
 * each bench/ program is an executable of its own. */
#ifndef PS_BENCH_BENCH_MACHINE_H
#define PS_BENCH_BENCH_MACHINE_H

#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

static inline void machine_describe(char *buf, size_t len)
{
    char cpu[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f != NULL) {
        char line[512];
        while (fgets(line, sizeof line, f) != NULL) {
            if (strncmp(line, "model name", 10) == 0) {
                const char *c = strchr(line, ':');
                if (c != NULL) {
                    c++;
                    while (*c == ' ' || *c == '\t')
                        c++;
                    snprintf(cpu, sizeof cpu, "%s", c);
                    cpu[strcspn(cpu, "\n")] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    for (char *p = cpu; *p; p++)
        if (*p == ',')
            *p = ' ';
    struct utsname u;
    char un[256] = "unknown";
    if (uname(&u) == 0)
        snprintf(un, sizeof un, "%s %s %s", u.sysname, u.release, u.machine);
    snprintf(buf, len, "nproc %ld; cpu %s; uname %s", sysconf(_SC_NPROCESSORS_ONLN), cpu, un);
}

#endif
