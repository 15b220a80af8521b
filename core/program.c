#include "core/program.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/array.h"

const char *const ps_instr_kind_names[PS_INSTR_KIND_COUNT] = {
    "run", "compute", "collective", "send", "recv", "alloc", "free", "load", "slice"};
const char *const ps_phase_names[PS_PHASE_COUNT] = {"forward", "backward", "update"};

ps_status ps_program_set_create(const ps_graph *step, int n_devices, int n_stages,
                                ps_program_set **out)
{
    *out = NULL;
    ps_program_set *s = calloc(1, sizeof *s);
    if (s == NULL)
        return PS_ERR_NOMEM;
    s->step = step;
    s->n_devices = n_devices;
    s->n_stages = n_stages;
    s->programs = calloc((size_t)(n_devices > 0 ? n_devices : 1), sizeof *s->programs);
    s->stages = calloc((size_t)(n_stages > 0 ? n_stages : 1), sizeof *s->stages);
    if (s->programs == NULL || s->stages == NULL) {
        ps_program_set_free(s);
        return PS_ERR_NOMEM;
    }
    for (int d = 0; d < n_devices; d++) {
        ps_program *p = &s->programs[d];
        p->device = d;
        p->stage = -1;
        p->coord[0] = p->coord[1] = -1;
        p->axis_group[0] = p->axis_group[1] = p->axis_group[2] = -1;
    }
    for (int i = 0; i < n_stages; i++)
        for (int ph = 0; ph < PS_PHASE_COUNT; ph++)
            s->stages[i].kernel[ph] = -1;
    s->micro_batches = 1;
    *out = s;
    return PS_OK;
}

void ps_program_set_free(ps_program_set *s)
{
    if (s == NULL)
        return;
    for (int d = 0; d < s->n_devices && s->programs; d++)
        free(s->programs[d].instrs);
    free(s->programs);
    for (int i = 0; i < s->n_stages && s->stages; i++)
        free(s->stages[i].devices);
    free(s->stages);
    for (int k = 0; k < s->n_kernels; k++)
        free(s->kernels[k].instrs);
    free(s->kernels);
    free(s->buffers);
    for (int g = 0; g < s->n_groups; g++)
        free(s->groups[g].devices);
    free(s->groups);
    free(s->group_slots);
    free(s->regions);
    free(s->operands);
    free(s);
}

ps_status ps_program_add_kernel(ps_program_set *s, int stage, ps_phase phase, int *index_out)
{
    ps_status st = ps_array_grow((void **)&s->kernels, &s->cap_kernels, s->n_kernels + 1,
                                 sizeof *s->kernels);
    if (st != PS_OK)
        return st;
    ps_kernel *k = &s->kernels[s->n_kernels];
    memset(k, 0, sizeof *k);
    k->stage = stage;
    k->phase = phase;
    if (index_out)
        *index_out = s->n_kernels;
    s->n_kernels++;
    return PS_OK;
}

ps_status ps_program_add_buffer(ps_program_set *s, const ps_buffer *b, int *index_out)
{
    ps_status st = ps_array_grow((void **)&s->buffers, &s->cap_buffers, s->n_buffers + 1,
                                 sizeof *s->buffers);
    if (st != PS_OK)
        return st;
    s->buffers[s->n_buffers] = *b;
    if (index_out)
        *index_out = s->n_buffers;
    s->n_buffers++;
    return PS_OK;
}

static uint64_t group_hash(const int *devices, int n)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint64_t)(unsigned)devices[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* Inserts group g into the hash index (which has room). */
static void group_slot_put(ps_program_set *s, int g)
{
    uint64_t mask = (uint64_t)s->cap_group_slots - 1;
    uint64_t h = group_hash(s->groups[g].devices, s->groups[g].n) & mask;
    while (s->group_slots[h] >= 0)
        h = (h + 1) & mask;
    s->group_slots[h] = g;
}

ps_status ps_program_add_group(ps_program_set *s, const int *devices, int n, int *index_out)
{
    /* a hash index over all groups: a lowering asks for the same mesh rows,
     * columns and replica sets once per device, and thousands of groups may
     * come between two requests for one list */
    if (s->cap_group_slots > 0) {
        uint64_t mask = (uint64_t)s->cap_group_slots - 1;
        for (uint64_t h = group_hash(devices, n) & mask; s->group_slots[h] >= 0;
             h = (h + 1) & mask) {
            const ps_group *g = &s->groups[s->group_slots[h]];
            if (g->n == n && memcmp(g->devices, devices, (size_t)n * sizeof(int)) == 0) {
                if (index_out)
                    *index_out = s->group_slots[h];
                return PS_OK;
            }
        }
    }
    if (2 * (s->n_groups + 1) > s->cap_group_slots) {
        if (s->cap_group_slots > (1 << 29))
            return PS_ERR_NOMEM;
        int cap = s->cap_group_slots ? 2 * s->cap_group_slots : 64;
        int *slots = malloc((size_t)(unsigned)cap * sizeof *slots);
        if (slots == NULL)
            return PS_ERR_NOMEM;
        for (int i = 0; i < cap; i++)
            slots[i] = -1;
        free(s->group_slots);
        s->group_slots = slots;
        s->cap_group_slots = cap;
        for (int g = 0; g < s->n_groups; g++)
            group_slot_put(s, g);
    }
    ps_status st = ps_array_grow((void **)&s->groups, &s->cap_groups, s->n_groups + 1,
                                 sizeof *s->groups);
    if (st != PS_OK)
        return st;
    int *copy = malloc((size_t)(n > 0 ? n : 1) * sizeof *copy);
    if (copy == NULL)
        return PS_ERR_NOMEM;
    memcpy(copy, devices, (size_t)n * sizeof *copy);
    s->groups[s->n_groups] = (ps_group){.n = n, .devices = copy};
    group_slot_put(s, s->n_groups);
    if (index_out)
        *index_out = s->n_groups;
    s->n_groups++;
    return PS_OK;
}

bool ps_region_equal(const ps_region *a, const ps_region *b)
{
    if (a->rank != b->rank)
        return false;
    for (int d = 0; d < a->rank; d++)
        if (a->offset[d] != b->offset[d] || a->size[d] != b->size[d])
            return false;
    return true;
}

ps_status ps_program_add_region(ps_program_set *s, const ps_region *r, int *index_out)
{
    ps_status st = ps_array_grow((void **)&s->regions, &s->cap_regions, s->n_regions + 1,
                                 sizeof *s->regions);
    if (st != PS_OK)
        return st;
    s->regions[s->n_regions] = *r;
    if (index_out)
        *index_out = s->n_regions;
    s->n_regions++;
    return PS_OK;
}

ps_status ps_program_add_operands(ps_program_set *s, const int *buffers, int n, int *index_out)
{
    ps_status st = ps_array_grow((void **)&s->operands, &s->cap_operands, s->n_operands + n + 1,
                                 sizeof *s->operands);
    if (st != PS_OK)
        return st;
    memcpy(s->operands + s->n_operands, buffers, (size_t)n * sizeof *buffers);
    if (index_out)
        *index_out = s->n_operands;
    s->n_operands += n;
    return PS_OK;
}

ps_status ps_kernel_append(ps_kernel *k, const ps_instr *in)
{
    ps_status st = ps_array_grow((void **)&k->instrs, &k->cap_instrs, k->n_instrs + 1,
                                 sizeof *k->instrs);
    if (st != PS_OK)
        return st;
    k->instrs[k->n_instrs++] = *in;
    k->seconds += in->seconds;
    return PS_OK;
}

ps_status ps_program_append(ps_program *p, const ps_instr *in)
{
    ps_status st = ps_array_grow((void **)&p->instrs, &p->cap_instrs, p->n_instrs + 1,
                                 sizeof *p->instrs);
    if (st != PS_OK)
        return st;
    p->instrs[p->n_instrs++] = *in;
    return PS_OK;
}

static void track(const ps_program_set *s, const ps_instr *in, double *bytes, double *peak)
{
    if (in->buffer < 0 || in->buffer >= s->n_buffers)
        return;
    if (in->kind == PS_INSTR_ALLOC) {
        *bytes += s->buffers[in->buffer].bytes;
        if (*bytes > *peak)
            *peak = *bytes;
    } else if (in->kind == PS_INSTR_FREE) {
        *bytes -= s->buffers[in->buffer].bytes;
    }
}

/* The device's peak, each kernel run either walked (net NULL) or taken
 * from its effect (ps_kernel_memory). */
static double peak_walk(const ps_program_set *s, int device, const double *net,
                        const double *rise)
{
    if (device < 0 || device >= s->n_devices)
        return 0;
    const ps_program *p = &s->programs[device];
    double bytes = 0, peak = 0;
    for (int i = 0; i < p->n_instrs; i++) {
        const ps_instr *in = &p->instrs[i];
        if (in->kind != PS_INSTR_RUN || in->kernel < 0 || in->kernel >= s->n_kernels) {
            track(s, in, &bytes, &peak);
        } else if (net != NULL) {
            if (bytes + rise[in->kernel] > peak)
                peak = bytes + rise[in->kernel];
            bytes += net[in->kernel];
        } else {
            const ps_kernel *k = &s->kernels[in->kernel];
            for (int j = 0; j < k->n_instrs; j++)
                track(s, &k->instrs[j], &bytes, &peak);
        }
    }
    return peak;
}

double ps_program_peak_bytes(const ps_program_set *s, int device)
{
    return peak_walk(s, device, NULL, NULL);
}

void ps_kernel_memory(const ps_program_set *s, double *net, double *rise)
{
    for (int k = 0; k < s->n_kernels; k++) {
        double bytes = 0, peak = 0;
        for (int j = 0; j < s->kernels[k].n_instrs; j++)
            track(s, &s->kernels[k].instrs[j], &bytes, &peak);
        net[k] = bytes;
        rise[k] = peak;
    }
}

double ps_program_peak_bytes_of(const ps_program_set *s, int device, const double *net,
                                const double *rise)
{
    return peak_walk(s, device, net, rise);
}

ps_instr ps_instr_init(ps_instr_kind kind)
{
    return (ps_instr){.kind = (uint8_t)kind, .axis = -1, .group = -1, .kernel = -1, .mb = -1,
                      .op = -1, .buffer = -1, .src_buffer = -1, .peer = -1, .region = -1,
                      .chunk = 0, .chunks = 1, .operands = -1};
}

int ps_instr_group(const ps_program_set *s, const ps_program *p, const ps_instr *in)
{
    (void)s;
    if (in->axis >= 0 && in->axis <= PS_MESH_AXES)
        return p->axis_group[in->axis];
    return in->group;
}

void ps_program_set_stats(const ps_program_set *s, ps_program_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int k = 0; k < s->n_kernels; k++)
        out->kernel_instrs += s->kernels[k].n_instrs;
    for (int d = 0; d < s->n_devices; d++) {
        const ps_program *p = &s->programs[d];
        out->program_instrs += p->n_instrs;
        for (int i = 0; i < p->n_instrs; i++) {
            const ps_instr *in = &p->instrs[i];
            if (in->kind == PS_INSTR_RUN) {
                const ps_kernel *k = &s->kernels[in->kernel];
                out->executed_instrs += k->n_instrs;
                for (int j = 0; j < k->n_instrs; j++)
                    if (k->instrs[j].kind == PS_INSTR_COLLECTIVE)
                        out->collectives_executed++;
            } else {
                out->executed_instrs++;
                if (in->kind == PS_INSTR_SEND)
                    out->sends++;
                else if (in->kind == PS_INSTR_COLLECTIVE)
                    out->collectives_executed++;
            }
        }
    }
}

static const char *tensor_name(const ps_program_set *s, int buffer)
{
    if (buffer < 0 || buffer >= s->n_buffers || s->step == NULL)
        return "?";
    int t = s->buffers[buffer].tensor;
    return t >= 0 && t < s->step->n_tensors ? s->step->tensors[t].name : "?";
}

static void dump_instr(const ps_program_set *s, const ps_instr *in, FILE *f)
{
    char spec[PS_SPEC_STR_MAX];
    fprintf(f, "  %-10s", ps_instr_kind_names[in->kind]);
    switch ((ps_instr_kind)in->kind) {
    case PS_INSTR_RUN:
        fprintf(f, " kernel %d (stage %d %s) mb %d", in->kernel, s->kernels[in->kernel].stage,
                ps_phase_names[s->kernels[in->kernel].phase], in->mb);
        break;
    case PS_INSTR_COMPUTE:
        fprintf(f, " %s%s", s->step ? s->step->ops[in->op].name : "?",
                in->flags & PS_INSTR_ACCUMULATE ? " (accumulate)" : "");
        break;
    case PS_INSTR_COLLECTIVE:
        fprintf(f, " %s", ps_collective_names[in->coll]);
        if (in->axis >= 0)
            fprintf(f, " axis %d", in->axis);
        else
            fprintf(f, " group %d", in->group);
        if (in->flags & PS_INSTR_FINITE_VOTE) {
            fprintf(f, " finite vote over");
            int n = 0;
            for (int i = in->operands; i >= 0 && i < s->n_operands && s->operands[i] >= 0; i++)
                fprintf(f, "%s %s", n++ ? "," : "", tensor_name(s, s->operands[i]));
            if (n == 0)
                fprintf(f, " nothing here");
            break;
        }
        if (in->buffer < 0) {
            fprintf(f, " inside %s", s->step && in->op >= 0 ? s->step->ops[in->op].name : "?");
            break;
        }
        if (in->src_buffer >= 0)
            fprintf(f, " %s %s ->", tensor_name(s, in->src_buffer),
                    ps_spec_format(&s->buffers[in->src_buffer].spec, spec, sizeof spec));
        else
            fprintf(f, " %s", tensor_name(s, in->buffer));
        fprintf(f, " %s", ps_spec_format(&s->buffers[in->buffer].spec, spec, sizeof spec));
        if (in->mb != -1 || in->region >= 0)
            fprintf(f, " mb %d region %d", in->mb, in->region);
        if (in->region >= 0 && in->chunks > 1)
            fprintf(f, "..%d", in->region + in->chunks - 1);
        break;
    case PS_INSTR_SEND:
    case PS_INSTR_RECV:
        fprintf(f, " %s %s mb %d %s device %d", tensor_name(s, in->buffer),
                ps_spec_format(&s->buffers[in->buffer].spec, spec, sizeof spec), in->mb,
                in->kind == PS_INSTR_SEND ? "to" : "from", in->peer);
        if (in->region >= 0) {
            const ps_region *r = &s->regions[in->region];
            fprintf(f, " [");
            for (int d = 0; d < r->rank; d++)
                fprintf(f, "%s%lld:%lld", d ? "," : "", (long long)r->offset[d],
                        (long long)(r->offset[d] + r->size[d]));
            fprintf(f, "]");
        }
        if (in->chunks > 1)
            fprintf(f, " chunk %d/%d", in->chunk, in->chunks);
        break;
    case PS_INSTR_SLICE:
        fprintf(f, " %s %s ->", tensor_name(s, in->src_buffer),
                ps_spec_format(&s->buffers[in->src_buffer].spec, spec, sizeof spec));
        fprintf(f, " %s", ps_spec_format(&s->buffers[in->buffer].spec, spec, sizeof spec));
        break;
    case PS_INSTR_ALLOC:
    case PS_INSTR_FREE:
    case PS_INSTR_LOAD:
        fprintf(f, " %s %s", tensor_name(s, in->buffer),
                ps_spec_format(&s->buffers[in->buffer].spec, spec, sizeof spec));
        if (in->mb != -1)
            fprintf(f, " mb %d", in->mb);
        break;
    case PS_INSTR_KIND_COUNT: break;
    }
    if (in->flops > 0)
        fprintf(f, "  %.4g GFLOP", in->flops / 1e9);
    if (in->bytes > 0)
        fprintf(f, "  %.4g MB", in->bytes / 1e6);
    if (in->seconds > 0)
        fprintf(f, "  %.4g ms", in->seconds * 1e3);
    fputc('\n', f);
}

static void dump_buffers(const ps_program_set *s, FILE *f)
{
    char spec[PS_SPEC_STR_MAX];
    fprintf(f, "# buffers: id stage tensor layout MB-per-device lifetime\n");
    for (int b = 0; b < s->n_buffers; b++) {
        const ps_buffer *bu = &s->buffers[b];
        fprintf(f, "%d stage %d %s %s %.4g %s\n", b, bu->stage, tensor_name(s, b),
                ps_spec_format(&bu->spec, spec, sizeof spec), bu->bytes / 1e6,
                bu->per_microbatch ? "per-micro-batch" : "per-step");
    }
}

static void dump_kernels(const ps_program_set *s, FILE *f)
{
    for (int k = 0; k < s->n_kernels; k++) {
        const ps_kernel *ke = &s->kernels[k];
        fprintf(f, "kernel %d: stage %d %s, %d instructions, %.4g ms\n", k, ke->stage,
                ps_phase_names[ke->phase], ke->n_instrs, ke->seconds * 1e3);
        for (int i = 0; i < ke->n_instrs; i++)
            dump_instr(s, &ke->instrs[i], f);
    }
}

static void dump_program(const ps_program_set *s, const ps_program *p, FILE *f)
{
    fprintf(f, "device %d: stage %d, mesh coordinate (%d, %d), %d instructions\n", p->device,
            p->stage, p->coord[0], p->coord[1], p->n_instrs);
    for (int i = 0; i < p->n_instrs; i++)
        dump_instr(s, &p->instrs[i], f);
}

ps_status ps_program_set_dump(const ps_program_set *s, FILE *f)
{
    fprintf(f, "# %d devices, %d stages, %d micro-batches, schedule %s\n", s->n_devices,
            s->n_stages, s->micro_batches, s->schedule);
    dump_buffers(s, f);
    dump_kernels(s, f);
    for (int d = 0; d < s->n_devices; d++)
        if (s->programs[d].n_instrs > 0)
            dump_program(s, &s->programs[d], f);
    return ferror(f) ? PS_ERR_IO : PS_OK;
}

static ps_status dump_file(const ps_program_set *s, const char *dir, const char *name, int device,
                           ps_error *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return ps_error_set(err, PS_ERR_IO, "%s: %s", path, strerror(errno));
    if (strcmp(name, "buffers.txt") == 0)
        dump_buffers(s, f);
    else if (strcmp(name, "kernels.txt") == 0)
        dump_kernels(s, f);
    else
        dump_program(s, &s->programs[device], f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad)
        return ps_error_set(err, PS_ERR_IO, "%s: write failed", path);
    return PS_OK;
}

/* The device a file name of ours names ("device-N.txt"), or -1. */
static int dumped_device(const char *name)
{
    if (strncmp(name, "device-", 7) != 0 || !isdigit((unsigned char)name[7]))
        return -1;
    char *end;
    long d = strtol(name + 7, &end, 10);
    return strcmp(end, ".txt") == 0 && d <= INT32_MAX ? (int)d : -1;
}

ps_status ps_program_set_dump_dir(const ps_program_set *s, const char *dir, ps_error *err)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ps_error_set(err, PS_ERR_IO, "%s: %s", dir, strerror(errno));
    /* an earlier dump's programs of devices this set leaves out go, so that
     * the directory holds this set's alone */
    DIR *old = opendir(dir);
    if (old == NULL)
        return ps_error_set(err, PS_ERR_IO, "%s: %s", dir, strerror(errno));
    for (struct dirent *e; (e = readdir(old)) != NULL;) {
        int d = dumped_device(e->d_name);
        if (d >= 0 && (d >= s->n_devices || s->programs[d].n_instrs == 0)) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (unlink(path) != 0 && errno != ENOENT) {
                ps_status st = ps_error_set(err, PS_ERR_IO, "%s: %s", path, strerror(errno));
                closedir(old);
                return st;
            }
        }
    }
    closedir(old);
    ps_status st = dump_file(s, dir, "buffers.txt", -1, err);
    if (st == PS_OK)
        st = dump_file(s, dir, "kernels.txt", -1, err);
    for (int d = 0; d < s->n_devices && st == PS_OK; d++) {
        if (s->programs[d].n_instrs == 0)
            continue;
        char name[64];
        snprintf(name, sizeof name, "device-%d.txt", d);
        st = dump_file(s, dir, name, d, err);
    }
    return st;
}
