#include "core/bytes_text.h"

#include <stdio.h>

const char *ps_bytes_text(double bytes, char *buf, int cap)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (bytes >= 1024 && u < 5) {
        bytes /= 1024;
        u++;
    }
    snprintf(buf, (size_t)cap, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
    return buf;
}
