/* How much host memory this process can still take: the system's available
 * memory (Linux's MemAvailable), and less where the process's control group
 * (a container, a batch job) sets a lower limit. What the CPU backend's
 * memory check compares a plan's tiles against. */
#ifndef PS_EXEC_CPU_HOST_MEMORY_H
#define PS_EXEC_CPU_HOST_MEMORY_H

#include <stdint.h>

/* Bytes; -1 where nothing tells. */
int64_t ps_host_memory_available(void);

/* The least room any memory control group of the process leaves (limit
 * minus usage, over the group and its ancestors), from the text of
 * /proc/self/cgroup and the cgroup file systems under `root` (normally
 * "/sys/fs/cgroup": version 2's memory.max and memory.current there or
 * under unified/, version 1's memory.limit_in_bytes and
 * memory.usage_in_bytes under memory/). -1: no limit found. */
int64_t ps_cgroup_memory_room(const char *proc_cgroup, const char *root);

#endif
