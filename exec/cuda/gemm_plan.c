#include "exec/cuda/gemm_plan.h"

#include <string.h>

/* Where label c sits among n labels (-1 when absent). */
static int find(const char *labels, int n, char c)
{
    for (int i = 0; i < n; i++)
        if (labels[i] == c)
            return i;
    return -1;
}

ps_status ps_gemm_plan_make(const char *einsum, const int rank[3],
                            const int64_t shape[3][PS_MAX_RANK], ps_gemm_plan *out,
                            ps_error *err)
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
            if (where[l] != 0 && size[l] != shape[o][i])
                return ps_error_set(err, PS_ERR_INVALID,
                                    "einsum \"%s\": label '%c' has local extent %lld and %lld",
                                    einsum, 'a' + l, (long long)size[l],
                                    (long long)shape[o][i]);
            size[l] = shape[o][i];
            where[l] |= 1 << o;
        }
    }
    const int BATCH = 7, CONTRACTED = 3;
    int nfree[2] = {0, 0};
    for (int o = 0; o < 2; o++)
        for (int i = 0; i < e.rank[o]; i++)
            if (where[e.labels[o][i] - 'a'] == ((1 << o) | 4))
                nfree[o]++;
    int nb = 0;
    for (int i = 0; i < e.rank[2]; i++)
        nb += where[e.labels[2][i] - 'a'] == BATCH;

    /* The output as [batch][free of L][free of R] (L either operand), else
     * computed as [batch][free of a][free of b] and permuted. */
    int L = 0;
    bool direct = true;
    {
        int i = 0;
        while (i < e.rank[2] && where[e.labels[2][i] - 'a'] == BATCH)
            i++;
        if (i != nb) {
            direct = false;
        } else if (i < e.rank[2]) {
            L = where[e.labels[2][i] - 'a'] == (1 | 4) ? 0 : 1;
            int j = i;
            while (j < e.rank[2] && where[e.labels[2][j] - 'a'] == ((1 << L) | 4))
                j++;
            direct = j - i == nfree[L];
        }
    }
    /* canonical orders: batch and free labels in output order, contracted
     * labels in L's order */
    char batch[PS_MAX_RANK], P[PS_MAX_RANK], Q[PS_MAX_RANK], K[PS_MAX_RANK];
    int np = 0, nq = 0, nk = 0;
    nb = 0;
    for (int i = 0; i < e.rank[2]; i++) {
        char c = e.labels[2][i];
        int w = where[c - 'a'];
        if (w == BATCH)
            batch[nb++] = c;
        else if (w == ((1 << L) | 4))
            P[np++] = c;
        else
            Q[nq++] = c;
    }
    for (int i = 0; i < e.rank[L]; i++)
        if (where[e.labels[L][i] - 'a'] == CONTRACTED)
            K[nk++] = e.labels[L][i];
    out->batch = out->m = out->n = out->k = 1;
    for (int i = 0; i < nb; i++)
        out->batch *= size[batch[i] - 'a'];
    for (int i = 0; i < np; i++)
        out->m *= size[P[i] - 'a'];
    for (int i = 0; i < nq; i++)
        out->n *= size[Q[i] - 'a'];
    for (int i = 0; i < nk; i++)
        out->k *= size[K[i] - 'a'];
    out->left = L;

    /* L as [batch][P][K] (or [batch][K][P]: transposed), R as [batch][K][Q]
     * (or [batch][Q][K]); anything else is permuted into the first form. */
    bool l_kxm = false, r_nxk = false;
    for (int o = 0; o < 2; o++) {
        const char *fr = o == L ? P : Q;
        int nf = o == L ? np : nq;
        char fk[PS_MAX_RANK], kf[PS_MAX_RANK]; /* [batch][free][K], [batch][K][free] */
        int n = 0;
        for (int i = 0; i < nb; i++, n++)
            fk[n] = kf[n] = batch[i];
        memcpy(fk + n, fr, (size_t)nf);
        memcpy(fk + n + nf, K, (size_t)nk);
        memcpy(kf + n, K, (size_t)nk);
        memcpy(kf + n + nk, fr, (size_t)nf);
        bool is_fk = memcmp(fk, e.labels[o], (size_t)e.rank[o]) == 0;
        bool is_kf = memcmp(kf, e.labels[o], (size_t)e.rank[o]) == 0;
        const char *want = NULL;
        if (o == L) {
            if (!is_fk && is_kf)
                l_kxm = true;
            else if (!is_fk)
                want = fk;
        } else {
            if (!is_kf && is_fk)
                r_nxk = true;
            else if (!is_kf)
                want = kf;
        }
        if (want != NULL) {
            out->permute[o] = true;
            for (int i = 0; i < e.rank[o]; i++)
                out->perm[o][i] = find(e.labels[o], e.rank[o], want[i]);
        }
    }
    if (!direct) {
        out->out_permute = true;
        char have[PS_MAX_RANK];
        int n = 0;
        for (int i = 0; i < nb; i++)
            have[n++] = batch[i];
        for (int i = 0; i < np; i++)
            have[n++] = P[i];
        for (int i = 0; i < nq; i++)
            have[n++] = Q[i];
        out->out_rank = n;
        for (int i = 0; i < n; i++)
            out->out_tmp_shape[i] = size[have[i] - 'a'];
        for (int i = 0; i < e.rank[2]; i++)
            out->out_perm[i] = find(have, n, e.labels[2][i]);
    }

    /* column-major C^T[N, M] = R^T[N, K] L^T[K, M]:
     * R row-major [K][N] is column-major N x K (ld N, no transpose); R
     * row-major [N][K] is column-major K x N (ld K, transposed). L row-major
     * [M][K] is column-major K x M (ld K); [K][M] is M x K (ld M, transposed). */
    out->cm = out->n;
    out->cn = out->m;
    out->ck = out->k;
    out->transa = r_nxk;
    out->lda = r_nxk ? out->k : out->n;
    out->transb = l_kxm;
    out->ldb = l_kxm ? out->m : out->k;
    out->ldc = out->n;
    out->stride_a = out->k * out->n;
    out->stride_b = out->m * out->k;
    out->stride_c = out->m * out->n;
    return PS_OK;
}
