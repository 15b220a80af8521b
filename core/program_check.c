/* The program checker (ps_program_set_check): runs every device's program
 * abstractly, with asynchronous sends, blocking receives and collectives
 * that complete when all members have entered them, and checks buffers,
 * memory and matching along the way. */
#include <stdlib.h>
#include <string.h>

#include "core/array.h"
#include "core/program.h"

/* ---- a set of live buffer instances per device (open addressing) ---- */

typedef struct live_set {
    int64_t *keys; /* -1 = empty, -2 = deleted */
    int cap, n, used;
} live_set;

static int64_t instance_key(int buffer, int mb)
{
    return ((int64_t)buffer << 21) | (int64_t)(mb + 1);
}

static uint64_t mix(int64_t k)
{
    uint64_t x = (uint64_t)k * 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

/* Rehashes into a table at most a quarter full, dropping the deleted
 * slots: a device allocates and frees its per-micro-batch buffers again and
 * again, so most slots that fill the table are tombstones, and doubling on
 * each refill would grow it with the allocations instead of the live set. */
static bool live_grow(live_set *s)
{
    int cap = s->cap ? s->cap : 64;
    while ((s->n + 1) * 4 > cap)
        cap *= 2;
    int64_t *keys = malloc((size_t)cap * sizeof *keys);
    if (keys == NULL)
        return false;
    for (int i = 0; i < cap; i++)
        keys[i] = -1;
    for (int i = 0; i < s->cap; i++)
        if (s->keys[i] >= 0) {
            uint64_t h = mix(s->keys[i]) & (uint64_t)(cap - 1);
            while (keys[h] != -1)
                h = (h + 1) & (uint64_t)(cap - 1);
            keys[h] = s->keys[i];
        }
    free(s->keys);
    s->keys = keys;
    s->cap = cap;
    s->used = s->n;
    return true;
}

/* Slot of k, or -1 when absent. */
static int live_find(const live_set *s, int64_t k)
{
    if (s->cap == 0)
        return -1;
    uint64_t h = mix(k) & (uint64_t)(s->cap - 1);
    while (s->keys[h] != -1) {
        if (s->keys[h] == k)
            return (int)h;
        h = (h + 1) & (uint64_t)(s->cap - 1);
    }
    return -1;
}

static bool live_add(live_set *s, int64_t k)
{
    if ((s->used + 1) * 2 > s->cap && !live_grow(s))
        return false;
    uint64_t h = mix(k) & (uint64_t)(s->cap - 1);
    while (s->keys[h] >= 0)
        h = (h + 1) & (uint64_t)(s->cap - 1);
    if (s->keys[h] == -1)
        s->used++;
    s->keys[h] = k;
    s->n++;
    return true;
}

/* ---- point-to-point queues, one per ordered device pair ---- */

typedef struct message {
    int tensor, mb, region, chunk, chunks;
    double bytes;
    int send_index; /* instruction index at the sender, for reports */
} message;

typedef struct queue {
    int64_t key; /* src * n_devices + dst; -1 = empty slot */
    message *items;
    int head, n, cap;
} queue;

typedef struct queue_table {
    queue *slots;
    int cap, n;
} queue_table;

static queue *queue_get(queue_table *t, int64_t key, bool create)
{
    if (create && (t->n + 1) * 2 > t->cap) {
        int cap = t->cap ? t->cap * 2 : 256;
        queue *slots = malloc((size_t)cap * sizeof *slots);
        if (slots == NULL)
            return NULL;
        for (int i = 0; i < cap; i++)
            slots[i].key = -1;
        for (int i = 0; i < t->cap; i++)
            if (t->slots[i].key >= 0) {
                uint64_t h = mix(t->slots[i].key) & (uint64_t)(cap - 1);
                while (slots[h].key >= 0)
                    h = (h + 1) & (uint64_t)(cap - 1);
                slots[h] = t->slots[i];
            }
        free(t->slots);
        t->slots = slots;
        t->cap = cap;
    }
    if (t->cap == 0)
        return NULL;
    uint64_t h = mix(key) & (uint64_t)(t->cap - 1);
    while (t->slots[h].key >= 0) {
        if (t->slots[h].key == key)
            return &t->slots[h];
        h = (h + 1) & (uint64_t)(t->cap - 1);
    }
    if (!create)
        return NULL;
    queue *q = &t->slots[h];
    memset(q, 0, sizeof *q);
    q->key = key;
    t->n++;
    return q;
}

/* ---- the abstract run ---- */

typedef struct group_state {
    int done;     /* completed instances */
    int arrived;  /* members in the current one */
    ps_instr sig; /* what its first member entered */
    int first_device;
} group_state;

typedef struct device_state {
    int pc;          /* program instruction */
    int kpc;         /* kernel instruction inside a RUN, -1 outside */
    bool done;
    bool waiting;    /* entered the current collective, waits for the others */
    int wait_group, wait_instance;
    int *group_count; /* [n_groups] collectives entered per group; lazily allocated */
    live_set live;
    double bytes, peak;
} device_state;

typedef struct checker {
    const ps_program_set *s;
    device_state *dev;
    group_state *groups;
    queue_table queues;
    ps_error *err;
} checker;

static const char *tensor_of(const ps_program_set *s, int buffer)
{
    if (s->step == NULL || buffer < 0 || buffer >= s->n_buffers)
        return "?";
    int t = s->buffers[buffer].tensor;
    return t >= 0 && t < s->step->n_tensors ? s->step->tensors[t].name : "?";
}

static ps_status fail_at(checker *c, int device, const char *fmt, const char *what)
{
    const device_state *d = &c->dev[device];
    const ps_program *p = &c->s->programs[device];
    if (d->kpc >= 0)
        return ps_error_set(c->err, PS_ERR_INTERNAL,
                            "program check: device %d, instruction %d (kernel %d, instruction %d): %s%s",
                            device, d->pc, p->instrs[d->pc].kernel, d->kpc, fmt, what);
    return ps_error_set(c->err, PS_ERR_INTERNAL, "program check: device %d, instruction %d: %s%s",
                        device, d->pc, fmt, what);
}

static ps_status use(checker *c, int device, int buffer, int mb)
{
    const ps_program_set *s = c->s;
    if (buffer < 0 || buffer >= s->n_buffers)
        return fail_at(c, device, "buffer index out of range", "");
    int inst = s->buffers[buffer].per_microbatch ? mb : -1;
    if (live_find(&c->dev[device].live, instance_key(buffer, inst)) < 0)
        return fail_at(c, device, "uses a buffer that is not allocated: ", tensor_of(s, buffer));
    return PS_OK;
}

static ps_status alloc_free(checker *c, int device, const ps_instr *in, int mb)
{
    const ps_program_set *s = c->s;
    device_state *d = &c->dev[device];
    if (in->buffer < 0 || in->buffer >= s->n_buffers)
        return fail_at(c, device, "buffer index out of range", "");
    const ps_buffer *b = &s->buffers[in->buffer];
    int inst = b->per_microbatch ? mb : -1;
    if (b->per_microbatch && inst < 0)
        return fail_at(c, device, "a per-micro-batch buffer outside a micro-batch: ",
                       tensor_of(s, in->buffer));
    int64_t key = instance_key(in->buffer, inst);
    int slot = live_find(&d->live, key);
    if (in->kind == PS_INSTR_ALLOC) {
        if (slot >= 0)
            return fail_at(c, device, "allocates a live buffer again: ", tensor_of(s, in->buffer));
        if (!live_add(&d->live, key))
            return ps_error_set(c->err, PS_ERR_NOMEM, "out of memory");
        d->bytes += b->bytes;
        if (d->bytes > d->peak)
            d->peak = d->bytes;
    } else {
        if (slot < 0)
            return fail_at(c, device, "frees a buffer that is not allocated: ",
                           tensor_of(s, in->buffer));
        d->live.keys[slot] = -2;
        d->live.n--;
        d->bytes -= b->bytes;
        if (d->bytes < -1e-6 * (d->peak + 1))
            return fail_at(c, device, "memory goes negative", "");
    }
    return PS_OK;
}

static bool same_region(const ps_program_set *s, int a, int b)
{
    if (a == b)
        return true;
    if (a < 0 || b < 0 || a >= s->n_regions || b >= s->n_regions)
        return false;
    return ps_region_equal(&s->regions[a], &s->regions[b]);
}

static bool same_collective(const ps_program_set *s, const ps_instr *a, const ps_instr *b)
{
    /* a gather of whole parts names chunks regions */
    int regions = a->region >= 0 && a->chunks > 1 ? a->chunks : 1;
    if (a->coll != b->coll || a->bytes != b->bytes ||
        regions != (b->region >= 0 && b->chunks > 1 ? b->chunks : 1) ||
        (a->flags & PS_INSTR_FINITE_VOTE) != (b->flags & PS_INSTR_FINITE_VOTE))
        return false;
    for (int k = 0; k < regions; k++)
        if (!same_region(s, a->region + k, b->region + k))
            return false;
    return true;
}

/* Executes one instruction of device `device` (mb: the micro-batch of the
 * enclosing RUN for kernel instructions). *blocked: it cannot proceed yet. */
static ps_status step(checker *c, int device, const ps_instr *in, int mb, bool *blocked)
{
    const ps_program_set *s = c->s;
    const ps_program *p = &s->programs[device];
    device_state *d = &c->dev[device];
    ps_status st = PS_OK;
    *blocked = false;
    switch ((ps_instr_kind)in->kind) {
    case PS_INSTR_ALLOC:
    case PS_INSTR_FREE:
        return alloc_free(c, device, in, mb);
    case PS_INSTR_LOAD:
        return use(c, device, in->buffer, mb);
    case PS_INSTR_SLICE:
        if ((st = use(c, device, in->src_buffer, mb)) != PS_OK)
            return st;
        return use(c, device, in->buffer, mb);
    case PS_INSTR_COMPUTE: {
        if (s->step == NULL || in->op < 0 || in->op >= s->step->n_ops)
            return fail_at(c, device, "op index out of range", "");
        const ps_op *op = &s->step->ops[in->op];
        if (in->operands < 0 || in->operands + op->n_in + op->n_out > s->n_operands)
            return fail_at(c, device, "operands out of range", "");
        for (int q = 0; q < op->n_in + op->n_out; q++)
            if ((st = use(c, device, s->operands[in->operands + q], mb)) != PS_OK)
                return st;
        return PS_OK;
    }
    case PS_INSTR_SEND:
    case PS_INSTR_RECV: {
        if (in->peer < 0 || in->peer >= s->n_devices || in->peer == device)
            return fail_at(c, device, "peer out of range", "");
        if ((st = use(c, device, in->buffer, mb)) != PS_OK)
            return st;
        int src = in->kind == PS_INSTR_SEND ? device : in->peer;
        int dst = in->kind == PS_INSTR_SEND ? in->peer : device;
        int64_t key = (int64_t)src * s->n_devices + dst;
        message m = {.tensor = s->buffers[in->buffer].tensor, .mb = mb, .region = in->region,
                     .chunk = in->chunk, .chunks = in->chunks, .bytes = in->bytes,
                     .send_index = d->pc};
        if (in->kind == PS_INSTR_SEND) {
            queue *q = queue_get(&c->queues, key, true);
            if (q == NULL || ps_array_grow((void **)&q->items, &q->cap, q->n + 1,
                                           sizeof *q->items) != PS_OK)
                return ps_error_set(c->err, PS_ERR_NOMEM, "out of memory");
            q->items[q->n++] = m;
            return PS_OK;
        }
        queue *q = queue_get(&c->queues, key, false);
        if (q == NULL || q->head == q->n) {
            *blocked = true;
            return PS_OK;
        }
        const message *x = &q->items[q->head++];
        if (x->tensor != m.tensor || x->mb != m.mb || x->region != m.region ||
            x->chunk != m.chunk || x->chunks != m.chunks || x->bytes != m.bytes) {
            char what[512];
            snprintf(what, sizeof what,
                     "%s mb %d (%g bytes), device %d sent %s mb %d (%g bytes) at instruction %d",
                     tensor_of(s, in->buffer), mb, in->bytes, src,
                     s->step && x->tensor >= 0 ? s->step->tensors[x->tensor].name : "?", x->mb,
                     x->bytes, x->send_index);
            return fail_at(c, device, "receive does not match the send: expects ", what);
        }
        return PS_OK;
    }
    case PS_INSTR_COLLECTIVE: {
        int g = ps_instr_group(s, p, in);
        if (g < 0 || g >= s->n_groups)
            return fail_at(c, device, "collective on an unknown group", "");
        const ps_group *gr = &s->groups[g];
        bool member = false;
        for (int i = 0; i < gr->n && !member; i++)
            member = gr->devices[i] == device;
        if (!member)
            return fail_at(c, device, "collective on a group the device is not in", "");
        if (in->buffer >= 0 && (st = use(c, device, in->buffer, mb)) != PS_OK)
            return st;
        if (in->src_buffer >= 0 && (st = use(c, device, in->src_buffer, mb)) != PS_OK)
            return st;
        if (in->flags & PS_INSTR_FINITE_VOTE) { /* the gradients it checks */
            if (in->operands < 0 || in->operands >= s->n_operands)
                return fail_at(c, device, "finite vote without its list of buffers", "");
            for (int i = in->operands; s->operands[i] >= 0; i++) {
                if (i + 1 >= s->n_operands)
                    return fail_at(c, device, "finite vote: its list of buffers has no end", "");
                if ((st = use(c, device, s->operands[i], mb)) != PS_OK)
                    return st;
            }
        }
        if (gr->n == 1)
            return PS_OK;
        if (d->group_count == NULL) {
            d->group_count = calloc((size_t)s->n_groups, sizeof *d->group_count);
            if (d->group_count == NULL)
                return ps_error_set(c->err, PS_ERR_NOMEM, "out of memory");
        }
        group_state *gs = &c->groups[g];
        if (d->waiting) {
            if (gs->done > d->wait_instance) {
                d->waiting = false;
                return PS_OK;
            }
            *blocked = true;
            return PS_OK;
        }
        int inst = d->group_count[g]++;
        if (inst != gs->done)
            return fail_at(c, device, "collective entered out of order", "");
        ps_instr sig = *in;
        sig.bytes = in->bytes;
        if (gs->arrived == 0) {
            gs->sig = sig;
            gs->first_device = device;
        } else if (!same_collective(s, &gs->sig, &sig)) {
            char what[256];
            snprintf(what, sizeof what, "%s of %g bytes, device %d entered %s of %g bytes",
                     ps_collective_names[in->coll], in->bytes, gs->first_device,
                     ps_collective_names[gs->sig.coll], gs->sig.bytes);
            return fail_at(c, device, "collectives of a group differ: ", what);
        }
        if (++gs->arrived == gr->n) {
            gs->arrived = 0;
            gs->done++;
            return PS_OK;
        }
        d->waiting = true;
        d->wait_group = g;
        d->wait_instance = inst;
        *blocked = true;
        return PS_OK;
    }
    case PS_INSTR_RUN:
    case PS_INSTR_KIND_COUNT: break;
    }
    return fail_at(c, device, "unexpected instruction kind", "");
}

/* Runs device `device` until it blocks or ends; *progress is set when it moved. */
static ps_status advance(checker *c, int device, bool *progress)
{
    const ps_program_set *s = c->s;
    const ps_program *p = &s->programs[device];
    device_state *d = &c->dev[device];
    while (!d->done) {
        if (d->pc >= p->n_instrs) {
            d->done = true;
            *progress = true;
            break;
        }
        const ps_instr *in = &p->instrs[d->pc];
        bool blocked = false;
        ps_status st;
        if (in->kind == PS_INSTR_RUN) {
            if (in->kernel < 0 || in->kernel >= s->n_kernels)
                return fail_at(c, device, "kernel index out of range", "");
            const ps_kernel *k = &s->kernels[in->kernel];
            if (k->stage != p->stage)
                return fail_at(c, device, "runs another stage's kernel", "");
            if (d->kpc < 0)
                d->kpc = 0;
            if (d->kpc >= k->n_instrs) {
                d->kpc = -1;
                d->pc++;
                *progress = true;
                continue;
            }
            const ps_instr *ki = &k->instrs[d->kpc];
            if (ki->kind == PS_INSTR_RUN || ki->kind == PS_INSTR_SEND || ki->kind == PS_INSTR_RECV)
                return fail_at(c, device, "a kernel holds a program instruction", "");
            if ((st = step(c, device, ki, in->mb, &blocked)) != PS_OK)
                return st;
            if (blocked)
                return PS_OK;
            d->kpc++;
        } else {
            if ((st = step(c, device, in, in->mb, &blocked)) != PS_OK)
                return st;
            if (blocked)
                return PS_OK;
            d->pc++;
        }
        *progress = true;
    }
    return PS_OK;
}

/* The instruction device d is blocked at (a kernel's when inside a RUN). */
static const ps_instr *blocked_instr(const checker *c, int d)
{
    const ps_program_set *s = c->s;
    const device_state *ds = &c->dev[d];
    const ps_instr *in = &s->programs[d].instrs[ds->pc];
    return ds->kpc >= 0 ? &s->kernels[in->kernel].instrs[ds->kpc] : in;
}

/* Whom blocked device d waits for: the peer of its receive, or a member of
 * its collective's group that has not entered it; -1 if none is found. */
static int blocker_of(const checker *c, int d)
{
    const ps_program_set *s = c->s;
    const device_state *ds = &c->dev[d];
    const ps_instr *in = blocked_instr(c, d);
    if (in->kind == PS_INSTR_RECV)
        return in->peer;
    if (!ds->waiting)
        return -1;
    const ps_group *g = &s->groups[ds->wait_group];
    for (int i = 0; i < g->n; i++) {
        const device_state *m = &c->dev[g->devices[i]];
        if (!(m->waiting && m->wait_group == ds->wait_group))
            return g->devices[i];
    }
    return -1;
}

/* "instruction 5 (kernel 2, instruction 7): receive of x from device 3" */
static void describe_wait(const checker *c, int d, char *buf, size_t n)
{
    const ps_program_set *s = c->s;
    const device_state *ds = &c->dev[d];
    const ps_instr *in = blocked_instr(c, d);
    int len = ds->kpc >= 0
                  ? snprintf(buf, n, "instruction %d (kernel %d, instruction %d): ", ds->pc,
                             s->programs[d].instrs[ds->pc].kernel, ds->kpc)
                  : snprintf(buf, n, "instruction %d: ", ds->pc);
    if (len < 0 || (size_t)len >= n)
        return;
    if (in->kind == PS_INSTR_RECV)
        snprintf(buf + len, n - (size_t)len, "receive of %s from device %d",
                 tensor_of(s, in->buffer), in->peer);
    else if (in->kind == PS_INSTR_COLLECTIVE && ds->waiting)
        snprintf(buf + len, n - (size_t)len, "%s on group %d (%d devices)",
                 ps_collective_names[in->coll], ds->wait_group, s->groups[ds->wait_group].n);
    else
        snprintf(buf + len, n - (size_t)len, "%s", ps_instr_kind_names[in->kind]);
}

/* Deadlock: device d (the first blocked one) waits for a chain of devices
 * that ends at one that has finished or closes into a cycle; names the
 * first wait and the one where the chain closes, which is where the fault
 * usually is (a first blocked receive is often only a consequence). */
static ps_status deadlock_report(checker *c, int d)
{
    const ps_program_set *s = c->s;
    char first[512], last[512], next[512];
    describe_wait(c, d, first, sizeof first);
    unsigned char *seen = calloc((size_t)s->n_devices + 1, 1);
    if (seen == NULL)
        return ps_error_set(c->err, PS_ERR_NOMEM, "out of memory");
    const char *hint = "";
    int cur = d, hops = 0;
    seen[cur] = 1;
    for (;;) {
        int b = blocker_of(c, cur);
        if (b < 0 || b >= s->n_devices || c->dev[b].done || seen[b]) {
            describe_wait(c, cur, last, sizeof last);
            if (b >= 0 && b < s->n_devices && c->dev[b].done)
                snprintf(next, sizeof next, "device %d, which has ended", b);
            else if (b >= 0 && b < s->n_devices) {
                char bw[400];
                describe_wait(c, b, bw, sizeof bw);
                snprintf(next, sizeof next, "device %d, blocked at %s", b, bw);
                /* members that name different groups of the same devices */
                const device_state *x = &c->dev[cur], *y = &c->dev[b];
                if (x->waiting && y->waiting && x->wait_group != y->wait_group) {
                    const ps_group *gx = &s->groups[x->wait_group], *gy = &s->groups[y->wait_group];
                    if (gx->n == gy->n &&
                        memcmp(gx->devices, gy->devices, (size_t)gx->n * sizeof(int)) == 0)
                        hint = " (the two groups hold the same devices: the members of a "
                               "collective must name one group)";
                }
            } else
                snprintf(next, sizeof next, "no device");
            break;
        }
        seen[b] = 1;
        cur = b;
        hops++;
    }
    free(seen);
    if (hops == 0)
        return ps_error_set(c->err, PS_ERR_INTERNAL,
                            "program check: deadlock: device %d, %s, waits for %s%s", d, first,
                            next, hint);
    char via[64] = "";
    if (hops > 1)
        snprintf(via, sizeof via, " (through %d other device%s)", hops - 1, hops > 2 ? "s" : "");
    return ps_error_set(c->err, PS_ERR_INTERNAL,
                        "program check: deadlock: device %d, %s, waits%s for device %d, %s, "
                        "which waits for %s%s",
                        d, first, via, cur, last, next, hint);
}

ps_status ps_program_set_check(const ps_program_set *s, double *peak_bytes_out, ps_error *err)
{
    ps_status st = PS_OK;
    checker c = {.s = s, .err = err};
    c.dev = calloc((size_t)s->n_devices + 1, sizeof *c.dev);
    c.groups = calloc((size_t)s->n_groups + 1, sizeof *c.groups);
    PS_TRY_ALLOC(c.dev, err);
    PS_TRY_ALLOC(c.groups, err);
    for (int d = 0; d < s->n_devices; d++)
        c.dev[d].kpc = -1;
    for (bool progress = true; progress;) {
        progress = false;
        for (int d = 0; d < s->n_devices; d++)
            PS_TRY(advance(&c, d, &progress));
    }
    for (int d = 0; d < s->n_devices; d++) {
        const device_state *ds = &c.dev[d];
        if (!ds->done) {
            st = deadlock_report(&c, d);
            goto out;
        }
        if (ds->live.n > 0) {
            for (int i = 0; i < ds->live.cap; i++)
                if (ds->live.keys[i] >= 0) {
                    int b = (int)(ds->live.keys[i] >> 21);
                    st = ps_error_set(err, PS_ERR_INTERNAL,
                                      "program check: device %d never frees %s (micro-batch %d)",
                                      d, tensor_of(s, b), (int)(ds->live.keys[i] & 0x1FFFFF) - 1);
                    goto out;
                }
        }
    }
    for (int i = 0; i < c.queues.cap; i++) {
        const queue *q = &c.queues.slots[i];
        if (q->key >= 0 && q->head < q->n) {
            st = ps_error_set(err, PS_ERR_INTERNAL,
                              "program check: device %d sends %s (micro-batch %d) to device %d, "
                              "which never receives it",
                              (int)(q->key / s->n_devices),
                              s->step ? s->step->tensors[q->items[q->head].tensor].name : "?",
                              q->items[q->head].mb, (int)(q->key % s->n_devices));
            goto out;
        }
    }
    if (peak_bytes_out)
        for (int d = 0; d < s->n_devices; d++)
            peak_bytes_out[d] = c.dev[d].peak;
out:
    if (c.dev)
        for (int d = 0; d < s->n_devices; d++) {
            free(c.dev[d].live.keys);
            free(c.dev[d].group_count);
        }
    free(c.dev);
    free(c.groups);
    for (int i = 0; i < c.queues.cap; i++)
        if (c.queues.slots[i].key >= 0)
            free(c.queues.slots[i].items);
    free(c.queues.slots);
    return st;
}
