#include "exec/cpu/host_memory.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The first integer of a file; -1 when it is missing or says "max". */
static int64_t read_bytes(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    long long v = -1;
    if (fscanf(f, "%lld", &v) != 1)
        v = -1;
    fclose(f);
    return v;
}

/* Room under one group directory: limit - usage, or -1 without a limit
 * (a version 1 group without one reads as a huge page-aligned number). */
static int64_t group_room(const char *dir, const char *limit_file, const char *usage_file)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, limit_file);
    int64_t limit = read_bytes(path);
    if (limit < 0 || limit >= (int64_t)1 << 60)
        return -1;
    snprintf(path, sizeof path, "%s/%s", dir, usage_file);
    int64_t usage = read_bytes(path);
    if (usage < 0)
        usage = 0;
    return limit > usage ? limit - usage : 0;
}

/* The least room over `base`/`group` and each of its ancestors up to base. */
static int64_t path_room(const char *base, const char *group, const char *limit_file,
                         const char *usage_file)
{
    char dir[1024];
    int64_t least = -1;
    snprintf(dir, sizeof dir, "%s%s", base, group);
    size_t keep = strlen(base);
    for (;;) {
        size_t n = strlen(dir);
        while (n > keep && dir[n - 1] == '/') /* no trailing slash */
            dir[--n] = '\0';
        int64_t room = group_room(dir, limit_file, usage_file);
        if (room >= 0 && (least < 0 || room < least))
            least = room;
        char *slash = strrchr(dir + keep, '/');
        if (n <= keep || slash == NULL)
            break;
        *slash = '\0';
    }
    return least;
}

int64_t ps_cgroup_memory_room(const char *proc_cgroup, const char *root)
{
    int64_t least = -1;
    const char *line = proc_cgroup;
    while (line != NULL && *line != '\0') {
        const char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        char buf[1024];
        if (len < sizeof buf) {
            memcpy(buf, line, len);
            buf[len] = '\0';
            /* "ID:CONTROLLERS:PATH" */
            char *c1 = strchr(buf, ':'), *c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
            if (c2 != NULL && c2[1] == '/') {
                *c2 = '\0';
                const char *controllers = c1 + 1, *group = c2 + 1;
                char base[1024];
                int64_t room = -1;
                if (controllers[0] == '\0') { /* version 2 */
                    snprintf(base, sizeof base, "%s", root);
                    room = path_room(base, group, "memory.max", "memory.current");
                    if (room < 0) {
                        snprintf(base, sizeof base, "%s/unified", root);
                        room = path_room(base, group, "memory.max", "memory.current");
                    }
                } else {
                    bool memory = false;
                    char list[256];
                    snprintf(list, sizeof list, "%s", controllers);
                    for (char *save = NULL, *t = strtok_r(list, ",", &save); t != NULL;
                         t = strtok_r(NULL, ",", &save))
                        memory |= strcmp(t, "memory") == 0;
                    if (memory) {
                        snprintf(base, sizeof base, "%s/memory", root);
                        room = path_room(base, group, "memory.limit_in_bytes",
                                         "memory.usage_in_bytes");
                    }
                }
                if (room >= 0 && (least < 0 || room < least))
                    least = room;
            }
        }
        line = end != NULL ? end + 1 : NULL;
    }
    return least;
}

int64_t ps_host_memory_available(void)
{
    int64_t have = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f != NULL) {
        char line[256];
        long long kib = -1;
        while (kib < 0 && fgets(line, sizeof line, f) != NULL)
            if (sscanf(line, "MemAvailable: %lld kB", &kib) != 1)
                kib = -1;
        fclose(f);
        if (kib >= 0)
            have = (int64_t)kib * 1024;
    }
#ifdef _SC_AVPHYS_PAGES
    if (have < 0) {
        long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0)
            have = (int64_t)pages * page;
    }
#endif
    f = fopen("/proc/self/cgroup", "r");
    if (f != NULL) {
        char text[4096];
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        fclose(f);
        int64_t room = ps_cgroup_memory_room(text, "/sys/fs/cgroup");
        if (room >= 0 && (have < 0 || room < have))
            have = room;
    }
    return have;
}
