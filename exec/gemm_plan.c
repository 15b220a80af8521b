#include "exec/gemm_plan.h"

#include <string.h>

/* What one more GEMM call costs, in elements permuted: a launch's few
 * microseconds of host time against memory moved at a few TB/s. */
#define CALL_COST_ELEMENTS ((int64_t)1 << 20)

/* A label's class, by where it is: bit 0 operand 0, bit 1 operand 1, bit 2
 * the output. */
enum { FREE_OF_0 = 1 | 4, FREE_OF_1 = 2 | 4, CONTRACTED = 1 | 2, BATCH = 1 | 2 | 4 };

/* Where label c sits among n labels (-1 when absent). */
static int find(const char *labels, int n, char c)
{
    for (int i = 0; i < n; i++)
        if (labels[i] == c)
            return i;
    return -1;
}

/* Element strides by label ('a' + index) of a dense row-major array. */
typedef struct layout {
    int64_t stride[26];
} layout;

static void dense(layout *ly, const char *labels, int n, const int64_t *size)
{
    int64_t s = 1;
    for (int i = n - 1; i >= 0; i--) {
        ly->stride[labels[i] - 'a'] = s;
        s *= size[labels[i] - 'a'];
    }
}

/* Whether the labels g[0..n-1], in that order, span one stride: each of
 * extent other than 1 lies the next one's stride times its extent from it.
 * *stride: the innermost one's, 0 when every extent is 1 (any does). */
static bool spans(const layout *ly, const char *g, int n, const int64_t *size, int64_t *stride)
{
    int64_t inner = 0, next = 0;
    bool any = true;
    for (int i = n - 1; i >= 0; i--) {
        int l = g[i] - 'a';
        if (size[l] == 1)
            continue;
        if (any) {
            inner = ly->stride[l];
            any = false;
        } else if (ly->stride[l] != next) {
            return false;
        }
        next = ly->stride[l] * size[l];
    }
    *stride = inner;
    return true;
}

/* Whether the array reads as row-major [rows][cols] matrices: the cols span
 * stride 1, the rows one stride, the leading dimension *ld (at least the
 * cols' extent, as cuBLAS asks, and within its int). */
static bool matrix(const layout *ly, const char *rows, int nr, const char *cols, int nc,
                   const int64_t *size, int64_t cols_extent, int64_t *ld)
{
    int64_t rs, cs;
    if (!spans(ly, rows, nr, size, &rs) || !spans(ly, cols, nc, size, &cs) || cs > 1)
        return false;
    int64_t least = cols_extent > 1 ? cols_extent : 1;
    if (rs == 0)
        rs = least;
    if (rs < least || rs > INT32_MAX)
        return false;
    *ld = rs;
    return true;
}

static int64_t product(const char *labels, int n, const int64_t *size)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        p *= size[labels[i] - 'a'];
    return p;
}

/* Operand o (its layout ly) read as row-major [rows][cols] matrices where
 * it lies (*trans false), or as [cols][rows] (*trans true), the leading
 * dimension *ld; with `whole` only where its batch labels span one stride
 * too. Else it is permuted into [batch][rows][cols] (perm, ly updated) and
 * its elements added to *cost. Returns whether it was permuted. */
static bool place(const ps_einsum *e, int o, const char *batch, int nb, const char *rows, int nr,
                  const char *cols, int nc, const int64_t *size, bool whole, layout *ly,
                  bool *trans, int64_t *ld, int *perm, int64_t *cost)
{
    int64_t unused, n_rows = product(rows, nr, size), n_cols = product(cols, nc, size);
    bool batch_ok = !whole || spans(ly, batch, nb, size, &unused);
    *trans = false;
    if (batch_ok && matrix(ly, rows, nr, cols, nc, size, n_cols, ld))
        return false;
    *trans = true;
    if (batch_ok && matrix(ly, cols, nc, rows, nr, size, n_rows, ld))
        return false;
    char want[PS_MAX_RANK];
    memcpy(want, batch, (size_t)nb);
    memcpy(want + nb, rows, (size_t)nr);
    memcpy(want + nb + nr, cols, (size_t)nc);
    for (int i = 0; i < e->rank[o]; i++)
        perm[i] = find(e->labels[o], e->rank[o], want[i]);
    dense(ly, want, e->rank[o], size);
    *trans = false;
    *ld = n_cols > 1 ? n_cols : 1;
    *cost += product(e->labels[o], e->rank[o], size);
    return true;
}

/* The plan with L = operand `L`, contracted labels in the order K, and the
 * whole batch in one call (`whole`: operands and output whose batch labels
 * do not span one stride are permuted) or looped over where it does not
 * span one stride in all three. false when the calls would exceed
 * PS_GEMM_MAX_CALLS. *cost: elements permuted, plus the calls beyond the
 * first at call_cost each. */
static bool build(const ps_einsum *e, const int64_t *size, const int *where, int L, const char *K,
                  int nk, bool whole, int64_t call_cost, ps_gemm_plan *out, int64_t *cost)
{
    int R = 1 - L;
    char batch[PS_MAX_RANK], P[PS_MAX_RANK], Q[PS_MAX_RANK];
    int nb = 0, np = 0, nq = 0;
    for (int i = 0; i < e->rank[2]; i++) {
        char c = e->labels[2][i];
        int w = where[c - 'a'];
        if (w == BATCH)
            batch[nb++] = c;
        else if (w == (L == 0 ? FREE_OF_0 : FREE_OF_1))
            P[np++] = c;
        else
            Q[nq++] = c;
    }
    memset(out, 0, sizeof *out);
    out->left = L;
    out->m = product(P, np, size);
    out->n = product(Q, nq, size);
    out->k = product(K, nk, size);
    layout ly[3];
    for (int o = 0; o < 3; o++)
        dense(&ly[o], e->labels[o], e->rank[o], size);
    int64_t unused;
    *cost = 0;
    /* L as [M][K] (B untransposed) or [K][M]; R as [K][N] (A untransposed)
     * or [N][K]; else permuted to [batch][M][K], [batch][K][N] */
    out->permute[L] = place(e, L, batch, nb, P, np, K, nk, size, whole, &ly[L], &out->transb,
                            &out->ldb, out->perm[L], cost);
    out->permute[R] = place(e, R, batch, nb, K, nk, Q, nq, size, whole, &ly[R], &out->transa,
                            &out->lda, out->perm[R], cost);
    /* the output as [M][N]; else a temporary [batch][M][N], permuted after */
    bool batch_ok = !whole || spans(&ly[2], batch, nb, size, &unused);
    if (!batch_ok || !matrix(&ly[2], P, np, Q, nq, size, out->n, &out->ldc)) {
        char have[PS_MAX_RANK];
        memcpy(have, batch, (size_t)nb);
        memcpy(have + nb, P, (size_t)np);
        memcpy(have + nb + np, Q, (size_t)nq);
        out->out_permute = true;
        out->out_rank = nb + np + nq;
        for (int i = 0; i < out->out_rank; i++)
            out->out_tmp_shape[i] = size[have[i] - 'a'];
        for (int i = 0; i < e->rank[2]; i++)
            out->out_perm[i] = find(have, out->out_rank, e->labels[2][i]);
        dense(&ly[2], have, out->out_rank, size);
        out->ldc = out->n > 1 ? out->n : 1;
        *cost += product(e->labels[2], e->rank[2], size);
    }

    /* cuBLAS's one batch stride: the longest run of batch labels (of extent
     * other than 1, in the output's order) that spans one stride in all
     * three; the others are looped over */
    char live[PS_MAX_RANK];
    int nl = 0;
    for (int i = 0; i < nb; i++)
        if (size[batch[i] - 'a'] != 1)
            live[nl++] = batch[i];
    int best_i = 0, best_j = -1; /* the run live[best_i..best_j] */
    int64_t best = 1;
    for (int i = 0; i < nl; i++) {
        int j = i;
        int64_t count = size[live[i] - 'a'];
        for (; j + 1 < nl; j++) {
            int64_t s1 = size[live[j + 1] - 'a'];
            bool along = true;
            for (int o = 0; o < 3; o++)
                along &= ly[o].stride[live[j] - 'a'] == ly[o].stride[live[j + 1] - 'a'] * s1;
            if (!along)
                break;
            count *= s1;
        }
        if (count > best || best_j < 0) {
            best = count;
            best_i = i;
            best_j = j;
        }
    }
    out->batch = best_j >= 0 ? best : 1;
    if (out->batch > INT32_MAX)
        return false;
    out->stride_a = best_j >= 0 ? ly[R].stride[live[best_j] - 'a'] : out->k * out->n;
    out->stride_b = best_j >= 0 ? ly[L].stride[live[best_j] - 'a'] : out->m * out->k;
    out->stride_c = best_j >= 0 ? ly[2].stride[live[best_j] - 'a'] : out->m * out->n;
    out->calls = 1;
    for (int i = 0; i < nl; i++) {
        if (best_j >= 0 && i >= best_i && i <= best_j)
            continue;
        int l = live[i] - 'a';
        out->loop_size[out->n_loop] = size[l];
        for (int o = 0; o < 3; o++)
            out->loop_stride[o][out->n_loop] = ly[o].stride[l];
        out->n_loop++;
        out->calls *= size[l];
        if (out->calls > PS_GEMM_MAX_CALLS)
            return false;
    }
    *cost += (out->calls - 1) * call_cost;

    /* column-major C^T[N, M] = R^T[N, K] L^T[K, M]: R row-major [K][N] is
     * column-major N x K (no transpose), [N][K] is K x N (transposed); L
     * row-major [M][K] is column-major K x M, [K][M] is M x K (transposed) */
    out->cm = out->n;
    out->cn = out->m;
    out->ck = out->k;
    return true;
}

/* The plan of an einsum with an empty label: the problem's sizes (L the
 * first operand), one call that nothing runs, nothing permuted. */
static ps_status empty_plan(const int64_t *size, const int *where, ps_gemm_plan *out)
{
    memset(out, 0, sizeof *out);
    out->batch = out->m = out->n = out->k = 1;
    for (int l = 0; l < 26; l++) {
        if (where[l] == BATCH)
            out->batch *= size[l];
        else if (where[l] == FREE_OF_0)
            out->m *= size[l];
        else if (where[l] == FREE_OF_1)
            out->n *= size[l];
        else if (where[l] == CONTRACTED)
            out->k *= size[l];
    }
    out->calls = 1;
    out->cm = out->n;
    out->cn = out->m;
    out->ck = out->k;
    out->lda = out->ldc = out->n > 1 ? out->n : 1;
    out->ldb = out->k > 1 ? out->k : 1;
    return PS_OK;
}

ps_status ps_gemm_plan_make(const char *einsum, const int rank[3],
                            const int64_t shape[3][PS_MAX_RANK], ps_gemm_plan *out,
                            ps_error *err)
{
    return ps_gemm_plan_make_costed(einsum, rank, shape, CALL_COST_ELEMENTS, out, err);
}

ps_status ps_gemm_plan_make_costed(const char *einsum, const int rank[3],
                                   const int64_t shape[3][PS_MAX_RANK], int64_t call_cost,
                                   ps_gemm_plan *out, ps_error *err)
{
    ps_einsum e;
    ps_status st = ps_einsum_parse(einsum, &e, err);
    if (st != PS_OK)
        return st;
    memset(out, 0, sizeof *out);
    int64_t size[26];
    int where[26]; /* bit o: the label is in operand o (bit 2: the output) */
    for (int l = 0; l < 26; l++) {
        size[l] = 0;
        where[l] = 0;
    }
    for (int o = 0; o < 3; o++) {
        if (rank[o] != e.rank[o])
            return ps_error_set(err, PS_ERR_INVALID,
                                "einsum \"%s\": %s %d has rank %d but %d labels", einsum,
                                o == 2 ? "the output" : "operand", o, rank[o], e.rank[o]);
        for (int i = 0; i < e.rank[o]; i++) {
            int l = e.labels[o][i] - 'a';
            if (shape[o][i] < 0)
                return ps_error_set(err, PS_ERR_INVALID,
                                    "einsum \"%s\": label '%c' has extent %lld", einsum, 'a' + l,
                                    (long long)shape[o][i]);
            if (where[l] != 0 && size[l] != shape[o][i])
                return ps_error_set(err, PS_ERR_INVALID,
                                    "einsum \"%s\": label '%c' has local extent %lld and %lld",
                                    einsum, 'a' + l, (long long)size[l],
                                    (long long)shape[o][i]);
            size[l] = shape[o][i];
            where[l] |= 1 << o;
        }
    }
    /* an extent of 0: nothing to multiply (an empty output, or zeros where
     * only a contracted label is empty, which the callers write themselves) */
    for (int o = 0; o < 3; o++)
        for (int i = 0; i < e.rank[o]; i++)
            if (shape[o][i] == 0)
                return empty_plan(size, where, out);
    /* first choice of L: the operand whose free labels come first in the
     * output (then [batch][M][N] is the output's order where it has one) */
    int first = 0;
    for (int i = 0; i < e.rank[2]; i++) {
        int w = where[e.labels[2][i] - 'a'];
        if (w == FREE_OF_0 || w == FREE_OF_1) {
            first = w == FREE_OF_0 ? 0 : 1;
            break;
        }
    }
    /* the contracted labels in each operand's order */
    char K[2][PS_MAX_RANK];
    int nk = 0;
    for (int o = 0; o < 2; o++) {
        nk = 0;
        for (int i = 0; i < e.rank[o]; i++)
            if (where[e.labels[o][i] - 'a'] == CONTRACTED)
                K[o][nk++] = e.labels[o][i];
    }
    bool same_order = memcmp(K[0], K[1], (size_t)nk) == 0;
    /* every L, the contracted labels in either operand's order (the other
     * only where it differs), the batch whole or looped over: the cheapest
     * (the first of equals) */
    int64_t best_cost = INT64_MAX;
    for (int li = 0; li < 2; li++) {
        int L = li == 0 ? first : 1 - first;
        for (int ko = 0; ko < (same_order ? 1 : 2); ko++) {
            const char *order = K[ko == 0 ? L : 1 - L];
            for (int whole = 1; whole >= 0; whole--) {
                ps_gemm_plan p;
                int64_t cost;
                if (build(&e, size, where, L, order, nk, whole != 0, call_cost, &p, &cost) &&
                    cost < best_cost) {
                    best_cost = cost;
                    *out = p;
                }
            }
        }
    }
    if (best_cost == INT64_MAX)
        return ps_error_set(err, PS_ERR_INVALID, "einsum \"%s\": its batch exceeds one GEMM's",
                            einsum);
    return PS_OK;
}

void ps_gemm_plan_offsets(const ps_gemm_plan *p, int64_t call, int64_t off[3])
{
    off[0] = off[1] = off[2] = 0;
    for (int i = p->n_loop - 1; i >= 0; i--) {
        int64_t c = call % p->loop_size[i];
        call /= p->loop_size[i];
        for (int o = 0; o < 3; o++)
            off[o] += c * p->loop_stride[o][i];
    }
}
