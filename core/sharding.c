#include "core/sharding.h"

#include <stdio.h>
#include <string.h>

ps_sharding_spec ps_spec_replicated(int rank)
{
    ps_sharding_spec s;
    memset(&s, 0, sizeof s);
    s.rank = rank;
    return s;
}

bool ps_spec_equal(const ps_sharding_spec *a, const ps_sharding_spec *b)
{
    if (a->rank != b->rank || a->partial != b->partial)
        return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dim_axes[d] != b->dim_axes[d])
            return false;
    return true;
}

int ps_spec_dim_of_axis(const ps_sharding_spec *s, int axis)
{
    for (int d = 0; d < s->rank; d++)
        if (s->dim_axes[d] & (1u << axis))
            return d;
    return -1;
}

bool ps_spec_well_formed(const ps_sharding_spec *s)
{
    if (s->rank < 0 || s->rank > PS_MAX_RANK || s->partial > 3)
        return false;
    unsigned used = s->partial;
    for (int d = 0; d < s->rank; d++) {
        if (s->dim_axes[d] > 3 || (used & s->dim_axes[d]))
            return false;
        used |= s->dim_axes[d];
    }
    return true;
}

int64_t ps_spec_parts(const ps_sharding_spec *s, int d, const int mesh[PS_MESH_AXES])
{
    int64_t parts = 1;
    for (int a = 0; a < PS_MESH_AXES; a++)
        if (s->dim_axes[d] & (1u << a))
            parts *= mesh[a];
    return parts;
}

bool ps_spec_tile(const ps_sharding_spec *s, const ps_tensor_desc *t,
                  const int mesh[PS_MESH_AXES], ps_tensor_desc *tile)
{
    if (s->rank != t->rank)
        return false;
    *tile = *t;
    for (int d = 0; d < t->rank; d++) {
        int64_t parts = ps_spec_parts(s, d, mesh);
        if (t->shape[d] % parts != 0)
            return false;
        tile->shape[d] = t->shape[d] / parts;
    }
    return true;
}

double ps_spec_tile_bytes(const ps_sharding_spec *s, const ps_tensor_desc *t,
                          const int mesh[PS_MESH_AXES])
{
    double bytes = (double)ps_dtype_size(t->dtype);
    for (int d = 0; d < t->rank; d++)
        bytes *= (double)t->shape[d] / (double)ps_spec_parts(s, d, mesh);
    return bytes;
}

void ps_spec_tile_offset(const ps_sharding_spec *s, const ps_tensor_desc *t,
                         const int mesh[PS_MESH_AXES], int i0, int i1, int64_t *offset)
{
    for (int d = 0; d < t->rank; d++) {
        int64_t block = 0;
        switch (s->dim_axes[d]) {
        case 1: block = i0; break;
        case 2: block = i1; break;
        case 3: block = (int64_t)i0 * mesh[1] + i1; break;
        default: block = 0; break;
        }
        offset[d] = block * (t->shape[d] / ps_spec_parts(s, d, mesh));
    }
}

static const char *const dim_names[4] = {"R", "S0", "S1", "S01"};

const char *ps_spec_format(const ps_sharding_spec *s, char *buf, int cap)
{
    int used = 0;
    if (s->rank == 0)
        used = snprintf(buf, (size_t)cap, "-");
    for (int d = 0; d < s->rank && used < cap; d++)
        used += snprintf(buf + used, (size_t)(cap - used), "%s%s", d ? "," : "",
                         dim_names[s->dim_axes[d] & 3]);
    if (s->partial && used < cap)
        snprintf(buf + used, (size_t)(cap - used), "|P%s",
                 s->partial == 1 ? "0" : s->partial == 2 ? "1" : "01");
    return buf;
}

int ps_spec_text_rank(const char *text)
{
    if (text[0] == '-' && (text[1] == '\0' || text[1] == '|'))
        return 0;
    int rank = 1;
    for (const char *c = text; *c != '\0' && *c != '|'; c++)
        rank += *c == ',';
    return rank;
}

bool ps_spec_parse(const char *text, int rank, ps_sharding_spec *out)
{
    ps_sharding_spec s = ps_spec_replicated(0);
    const char *p = text;
    const char *bar = strchr(text, '|');
    size_t body = bar ? (size_t)(bar - text) : strlen(text);
    if (rank == 0) { /* a scalar is written "-" */
        if (body != 1 || text[0] != '-')
            return false;
        p = text + 1;
    }
    while ((size_t)(p - text) < body) {
        if (s.rank == PS_MAX_RANK)
            return false;
        int mask;
        if (strncmp(p, "S01", 3) == 0)
            mask = 3, p += 3;
        else if (strncmp(p, "S0", 2) == 0)
            mask = 1, p += 2;
        else if (strncmp(p, "S1", 2) == 0)
            mask = 2, p += 2;
        else if (*p == 'R')
            mask = 0, p += 1;
        else
            return false;
        s.dim_axes[s.rank++] = (uint8_t)mask;
        if ((size_t)(p - text) < body) {
            if (*p != ',')
                return false;
            p++;
            if ((size_t)(p - text) == body)
                return false;
        }
    }
    if (bar != NULL) {
        if (strcmp(bar, "|P0") == 0)
            s.partial = 1;
        else if (strcmp(bar, "|P1") == 0)
            s.partial = 2;
        else if (strcmp(bar, "|P01") == 0)
            s.partial = 3;
        else
            return false;
    }
    if (s.rank != rank || !ps_spec_well_formed(&s))
        return false;
    *out = s;
    return true;
}
