#include "exec/memory_need.h"

#include <stdlib.h>
#include <string.h>

#include "exec/buffer_tile.h"

/* One device's walk: live bytes of the step's buffer instances. */
typedef struct need_walk {
    const ps_program_set *s;
    const ps_backend *b;
    const ps_program *prog;
    int M;                  /* micro-batches (at least 1) */
    int64_t *live;          /* [n_buffers * (M + 1)]: bytes of an allocated instance, or -1 */
    uint8_t *written;       /* [same]: as the runtime's: a later accumulation adds */
    uint8_t *kept;          /* [n_buffers]: a persistent buffer already counted */
    int64_t persistent;     /* parameters and optimizer state */
    int64_t transient, peak_transient;
} need_walk;

static int64_t index_of(const need_walk *w, int buffer, int mb)
{
    int m = w->s->buffers[buffer].per_microbatch ? mb : -1;
    if (m < -1 || m >= w->M)
        m = -1;
    return (int64_t)buffer * (w->M + 1) + (m + 1);
}

static bool valid_buffer(const need_walk *w, int buffer)
{
    return buffer >= 0 && buffer < w->s->n_buffers;
}

static void hold(need_walk *w, int64_t bytes)
{
    w->transient += bytes;
    if (w->transient > w->peak_transient)
        w->peak_transient = w->transient;
}

/* Bytes held during one instruction only (a scratch tile, the vote's flag). */
static void hold_briefly(need_walk *w, int64_t bytes)
{
    hold(w, bytes);
    w->transient -= bytes;
}

static void alloc_instance(need_walk *w, int buffer, int mb, bool program_level)
{
    if (!valid_buffer(w, buffer))
        return; /* ps_program_set_check refuses it; the run fails there */
    int64_t i = index_of(w, buffer, mb);
    w->written[i] = 0;
    if (program_level && ps_exec_buffer_persistent(w->s, buffer)) {
        if (!w->kept[buffer]) { /* allocated once, before the first step */
            w->kept[buffer] = 1;
            w->persistent += ps_exec_buffer_bytes(w->s, w->b->half_storage, w->prog, buffer);
        }
        w->live[i] = 0;
        w->written[i] = 1;
        return;
    }
    w->live[i] = ps_exec_buffer_bytes(w->s, w->b->half_storage, w->prog, buffer);
    hold(w, w->live[i]);
}

static void free_instance(need_walk *w, int buffer, int mb)
{
    if (!valid_buffer(w, buffer))
        return;
    int64_t i = index_of(w, buffer, mb);
    if (w->live[i] > 0)
        w->transient -= w->live[i];
    w->live[i] = -1;
    w->written[i] = 0;
}

/* A write into `buffer`: accumulate into an instance already written takes
 * a scratch tile for the op unless the backend adds in place (op may be
 * NULL: a collective or a slice). Returns the scratch bytes. */
static int64_t write_scratch(const need_walk *w, int buffer, int mb, bool accumulate,
                             const ps_op *op, int out)
{
    if (!valid_buffer(w, buffer))
        return 0;
    int64_t i = index_of(w, buffer, mb);
    if (!accumulate || !w->written[i])
        return 0;
    ps_tile t = ps_exec_buffer_tile(w->s, w->b->half_storage, w->prog, buffer, NULL);
    if (op != NULL && w->b->ops->op_accumulates != NULL &&
        w->b->ops->op_accumulates((ps_backend *)w->b, op, out, &t))
        return 0;
    return ps_tile_numel(&t) * ps_tile_elem_bytes(&t);
}

static void mark_written(need_walk *w, int buffer, int mb)
{
    if (valid_buffer(w, buffer))
        w->written[index_of(w, buffer, mb)] = 1;
}

/* A collective's or a slice's write of a whole tile. */
static void write_whole(need_walk *w, int buffer, int mb, bool accumulate)
{
    hold_briefly(w, write_scratch(w, buffer, mb, accumulate, NULL, 0));
    mark_written(w, buffer, mb);
}

static void kernel_instr(need_walk *w, const ps_instr *in, int mb)
{
    const ps_program_set *s = w->s;
    bool acc = (in->flags & PS_INSTR_ACCUMULATE) != 0;
    switch ((ps_instr_kind)in->kind) {
    case PS_INSTR_COMPUTE: {
        if (in->op < 0 || in->op >= s->step->n_ops)
            return;
        const ps_op *op = &s->step->ops[in->op];
        const int *operand = &s->operands[in->operands];
        int64_t scratch = 0;
        for (int o = 0; o < op->n_out; o++)
            scratch += write_scratch(w, operand[op->n_in + o], mb, acc, op, o);
        hold_briefly(w, scratch); /* during the op, all outputs at once */
        for (int o = 0; o < op->n_out; o++)
            mark_written(w, operand[op->n_in + o], mb);
        return;
    }
    case PS_INSTR_COLLECTIVE:
        if (in->flags & PS_INSTR_FINITE_VOTE) {
            if (in->group >= 0 && in->group < s->n_groups && s->groups[in->group].n > 1) {
                hold_briefly(w, (int64_t)sizeof(float)); /* the flag all-reduced */
            }
            return;
        }
        if (in->buffer >= 0) /* else run inside its op's COMPUTE */
            write_whole(w, in->buffer, mb, acc);
        return;
    case PS_INSTR_SLICE: write_whole(w, in->buffer, mb, acc); return;
    case PS_INSTR_LOAD: mark_written(w, in->buffer, mb); return;
    case PS_INSTR_ALLOC: alloc_instance(w, in->buffer, mb, false); return;
    case PS_INSTR_FREE: free_instance(w, in->buffer, mb); return;
    default: return;
    }
}

ps_status ps_exec_memory_need(const ps_program_set *s, const ps_backend *b, int device,
                              int64_t *bytes, ps_error *err)
{
    *bytes = 0;
    if (device < 0 || device >= s->n_devices)
        return ps_error_set(err, PS_ERR_INVALID, "no device %d in a plan of %d", device,
                            s->n_devices);
    need_walk w;
    memset(&w, 0, sizeof w);
    w.s = s;
    w.b = b;
    w.prog = &s->programs[device];
    w.M = s->micro_batches > 0 ? s->micro_batches : 1;
    size_t n_inst = (size_t)s->n_buffers * (size_t)(w.M + 1);
    w.live = malloc((n_inst > 0 ? n_inst : 1) * sizeof *w.live);
    w.written = calloc(n_inst > 0 ? n_inst : 1, 1);
    w.kept = calloc((size_t)(s->n_buffers > 0 ? s->n_buffers : 1), 1);
    if (w.live == NULL || w.written == NULL || w.kept == NULL) {
        free(w.live);
        free(w.written);
        free(w.kept);
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n_inst; i++)
        w.live[i] = -1;
    for (int k = 0; k < w.prog->n_instrs; k++) {
        const ps_instr *in = &w.prog->instrs[k];
        switch ((ps_instr_kind)in->kind) {
        case PS_INSTR_RUN:
            if (in->kernel >= 0 && in->kernel < s->n_kernels)
                for (int i = 0; i < s->kernels[in->kernel].n_instrs; i++)
                    kernel_instr(&w, &s->kernels[in->kernel].instrs[i], in->mb);
            break;
        case PS_INSTR_ALLOC: alloc_instance(&w, in->buffer, in->mb, true); break;
        case PS_INSTR_FREE:
            if (valid_buffer(&w, in->buffer) && ps_exec_buffer_persistent(s, in->buffer)) {
                w.written[index_of(&w, in->buffer, in->mb)] = 0;
                break; /* kept for the next step */
            }
            free_instance(&w, in->buffer, in->mb);
            break;
        case PS_INSTR_RECV: mark_written(&w, in->buffer, in->mb); break;
        case PS_INSTR_COLLECTIVE:
            if (in->coll == PS_COLL_ALL_GATHER && in->region >= 0 && in->src_buffer < 0)
                break; /* the chunks' all-gather: in place */
            write_whole(&w, in->buffer, in->mb, (in->flags & PS_INSTR_ACCUMULATE) != 0);
            break;
        default: break;
        }
    }
    *bytes = w.persistent + w.peak_transient;
    free(w.live);
    free(w.written);
    free(w.kept);
    return PS_OK;
}

ps_status ps_exec_check_memory(const ps_program_set *s, ps_backend *b, ps_hosts *hosts,
                               ps_error *err)
{
    int n_hosts = ps_hosts_count(hosts) > 1 ? ps_hosts_count(hosts) : 1;
    /* first, so that no failure keeps this process from the verdict the
     * others wait for */
    double *verdict = calloc((size_t)n_hosts, sizeof *verdict);
    if (verdict == NULL && n_hosts > 1)
        ps_hosts_abort(hosts, 1);
    if (verdict == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    bool refused = false;
    ps_status st = PS_OK;
    int64_t *need = NULL;
    if (b->ops->check_memory != NULL) {
        need = calloc((size_t)(s->n_devices > 0 ? s->n_devices : 1), sizeof *need);
        if (need == NULL)
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        for (int d = 0; d < s->n_devices && st == PS_OK; d++)
            if (ps_hosts_is_local(hosts, d))
                st = ps_exec_memory_need(s, b, d, &need[d], err);
        if (st == PS_OK) {
            st = b->ops->check_memory(b, need, err);
            refused = st == PS_ERR_NOMEM;
        }
        free(need);
    }
    if (n_hosts > 1) {
        /* one verdict for all (every process takes part, whatever its own):
         * which hosts refused, or failed to answer */
        int me = ps_hosts_rank(hosts);
        verdict[me] = st == PS_OK ? 0.0 : refused ? 1.0 : 2.0;
        ps_error mine = *err;
        ps_status sum = ps_hosts_sum(hosts, verdict, n_hosts, err);
        if (sum != PS_OK) {
            free(verdict);
            return sum;
        }
        *err = mine;
        for (int h = 0; h < n_hosts && st == PS_OK; h++)
            if (verdict[h] > 0)
                st = ps_error_set(err, verdict[h] == 1.0 ? PS_ERR_NOMEM : PS_ERR_DEVICE,
                                  verdict[h] == 1.0
                                      ? "host %d refused the run: its devices' tiles do not "
                                        "fit in its memory (its message says by how much)"
                                      : "host %d could not check its devices' memory (its "
                                        "message says why)",
                                  h);
    }
    free(verdict);
    return st;
}
