/* What the bench/ programs share. Header-only: each program is an
 * executable of its own. */
#ifndef PS_BENCH_BENCH_COMMON_H
#define PS_BENCH_BENCH_COMMON_H

#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/cluster.h"

/* The preset's node, sliced to `gpus` devices when the case needs under one
 * node (else gpus / devices-per-node whole nodes), named PRESET:NODESxPER. */
static inline ps_status bench_cluster_slice(const char *preset, int gpus, ps_cluster **out,
                                            ps_error *err)
{
    ps_cluster *node = NULL;
    ps_status st = ps_cluster_from_preset(preset, &node, err);
    if (st != PS_OK)
        return st;
    int per_node = gpus < node->devices_per_node ? gpus : node->devices_per_node;
    char name[64];
    snprintf(name, sizeof name, "%s:%dx%d", preset, gpus / per_node, per_node);
    st = ps_cluster_create(name, gpus / per_node, per_node, &node->kinds[0], &node->intra,
                           &node->inter, out, err);
    ps_cluster_free(node);
    return st;
}

/* The machine a benchmark ran on, for the comment line that heads every
 * benchmark CSV: "nproc N; cpu MODEL; uname SYS RELEASE ARCH" (commas in
 * the CPU model become spaces, so the line stays one CSV field). */
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
