#include "core/bytes_text.h"

#include <math.h>
#include <stdio.h>

ps_bytes_unit ps_bytes_unit_for(double max_bytes)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    double scale = 1;
    while (isfinite(max_bytes) && max_bytes >= scale * 1024 && u < 5) {
        scale *= 1024;
        u++;
    }
    return (ps_bytes_unit){names[u], scale};
}

const char *ps_bytes_text(double bytes, char *buf, int cap)
{
    ps_bytes_unit u = ps_bytes_unit_for(bytes);
    snprintf(buf, (size_t)cap, u.bytes == 1 ? "%.0f %s" : "%.2f %s", bytes / u.bytes, u.name);
    return buf;
}
