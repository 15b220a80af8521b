#include "traces/summary.h"

#include <stdlib.h>
#include <string.h>

ps_status ps_summary_create(int n_devices, int n_stages, ps_summary **out)
{
    *out = NULL;
    if (n_devices < 0 || n_stages < 0)
        return PS_ERR_INVALID;
    ps_summary *s = calloc(1, sizeof *s);
    if (s == NULL)
        return PS_ERR_NOMEM;
    s->devices = calloc((size_t)(n_devices > 0 ? n_devices : 1), sizeof *s->devices);
    s->stages = calloc((size_t)(n_stages > 0 ? n_stages : 1), sizeof *s->stages);
    if (s->devices == NULL || s->stages == NULL) {
        ps_summary_free(s);
        return PS_ERR_NOMEM;
    }
    s->n_devices = n_devices;
    s->n_stages = n_stages;
    for (int d = 0; d < n_devices; d++) {
        s->devices[d].id = d;
        s->devices[d].stage = -1;
    }
    for (int i = 0; i < n_stages; i++)
        s->stages[i].index = i;
    *out = s;
    return PS_OK;
}

void ps_summary_free(ps_summary *s)
{
    if (s == NULL)
        return;
    free(s->devices);
    free(s->stages);
    free(s);
}
