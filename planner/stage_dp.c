#include "planner/stage_dp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

ps_status ps_stage_table_create(int n_layers, int n_submeshes, int n_configs,
                                ps_stage_table **out)
{
    *out = NULL;
    if (n_layers < 1 || n_submeshes < 1 || n_configs < 1)
        return PS_ERR_INVALID;
    ps_stage_table *t = calloc(1, sizeof *t);
    if (t == NULL)
        return PS_ERR_NOMEM;
    size_t n = (size_t)n_layers * n_layers * n_submeshes * n_configs;
    t->n_layers = n_layers;
    t->n_submeshes = n_submeshes;
    t->n_configs = n_configs;
    t->sub_devices = calloc((size_t)n_submeshes, sizeof *t->sub_devices);
    t->cost = malloc(n * sizeof *t->cost);
    t->max_succ = malloc(n * sizeof *t->max_succ);
    if (t->sub_devices == NULL || t->cost == NULL || t->max_succ == NULL) {
        ps_stage_table_free(t);
        return PS_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        t->cost[i] = INFINITY;
        t->max_succ[i] = -1;
    }
    *out = t;
    return PS_OK;
}

void ps_stage_table_free(ps_stage_table *t)
{
    if (t == NULL)
        return;
    free(t->sub_devices);
    free(t->recv_s);
    free(t->no_cut_after);
    free(t->cost);
    free(t->max_succ);
    free(t);
}

size_t ps_stage_table_index(const ps_stage_table *t, int first, int last, int sub, int cfg)
{
    return (((size_t)first * t->n_layers + last) * t->n_submeshes + sub) * t->n_configs + cfg;
}

ps_status ps_stage_table_place_in_order(ps_stage_table *t, int devices_per_node)
{
    if (devices_per_node < 1)
        return PS_ERR_INVALID;
    if (t->recv_s == NULL) {
        t->recv_s = calloc((size_t)t->n_layers * t->n_submeshes * 2, sizeof *t->recv_s);
        if (t->recv_s == NULL)
            return PS_ERR_NOMEM;
    }
    t->devices_per_node = devices_per_node;
    return PS_OK;
}

bool ps_stage_fits_at(int size, int offset, int devices_per_node)
{
    int M = devices_per_node;
    return size < M ? offset / M == (offset + size - 1) / M : offset % M == 0;
}

/* What a stage on submesh sub receives across boundary b per micro-batch. */
static double recv_at(const ps_stage_table *t, int b, int sub, bool across)
{
    return t->recv_s[((size_t)b * t->n_submeshes + sub) * 2 + (across ? 1 : 0)];
}

/* Entry k (layers first..last on submesh sub) with what it receives under
 * in-order placement, its first edge across nodes where variant & 1, its
 * last where variant & 2; without placement, cost[k]. */
static double variant_cost(const ps_stage_table *t, size_t k, int first, int last, int sub,
                           int variant)
{
    double cost = t->cost[k];
    if (t->devices_per_node <= 0)
        return cost;
    if (first > 0)
        cost += recv_at(t, first, sub, variant & 1);
    if (last + 1 < t->n_layers)
        cost += recv_at(t, last + 1, sub, variant & 2);
    return cost;
}

double ps_stage_table_placed_cost(const ps_stage_table *t, size_t k, int first, int last,
                                  int sub, int offset)
{
    int M = t->devices_per_node;
    if (M <= 0 || !isfinite(t->cost[k]))
        return t->cost[k];
    int n = t->sub_devices[sub];
    if (!ps_stage_fits_at(n, offset, M))
        return INFINITY;
    return variant_cost(t, k, first, last, sub,
                        (offset % M == 0 ? 1 : 0) | ((offset + n) % M == 0 ? 2 : 0));
}

void ps_stage_plan_clear(ps_stage_plan *p)
{
    free(p->stages);
    memset(p, 0, sizeof *p);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* An entry admissible as a stage in dp_for: its configuration, what it
 * tolerates after it, and its cost at each kind of place (placed_cost's
 * variants; INFINITY where it may not sit or exceeds t_max). */
typedef struct admissible {
    int cfg, max_succ;
    double cost[4];
} admissible;

/* One DP for a given t_max. f[(s * (L + 1) + l) * (D + 1) + d]; choice arrays
 * record the argmin for reconstruction (extract). For each state the
 * candidates (last layer i, submesh, configuration) are tried in that order,
 * the first strictly best kept: the loops run over the candidates outside
 * and the device counts d inside, which visits each state's candidates in
 * the same order as a loop over them per state, in a tight loop over a row
 * of f. */
static void dp_for(const ps_stage_table *t, int D, double t_max, double *f, int *arg_i,
                   int *arg_sc, admissible *adm)
{
    int L = t->n_layers, S = t->n_submeshes, C = t->n_configs, M = t->devices_per_node;
    size_t n_f = (size_t)(L + 1) * (L + 1) * (D + 1);
    for (size_t i = 0; i < n_f; i++)
        f[i] = INFINITY;
#define F(s, l, d) f[((size_t)(s) * (L + 1) + (l)) * (D + 1) + (d)]
#define AI(s, l, d) arg_i[((size_t)(s) * (L + 1) + (l)) * (D + 1) + (d)]
#define ASC(s, l, d) arg_sc[((size_t)(s) * (L + 1) + (l)) * (D + 1) + (d)]
    F(0, L, 0) = 0;
    /* s stages hold at least a layer and a device each: at most min(L, D)
     * stages, on layers l <= L - s and d >= s devices, the first ending at
     * i <= L - s (with L in the hundreds, the states past D were most of
     * the work and all infinite); and a plan has at most 64 stages (the
     * planner refuses more, so the DP's best must be among them) */
    int s_max = L < D ? L : D;
    if (s_max > 64)
        s_max = 64;
    for (int s = 1; s <= s_max; s++) {
        for (int l = L - s; l >= 0; l--) {
            double *best = &F(s, l, 0);
            int *bi = &AI(s, l, 0), *bsc = &ASC(s, l, 0);
            for (int d = s; d <= D; d++) {
                bi[d] = -1;
                bsc[d] = -1;
            }
            for (int i = l; i <= L - s; i++) {
                if (i < L - 1 && t->no_cut_after != NULL && t->no_cut_after[i])
                    continue;
                const double *rest = &F(s - 1, i + 1, 0);
                for (int sub = 0; sub < S; sub++) {
                    int nd = t->sub_devices[sub], n_adm = 0;
                    for (int c = 0; c < C; c++) {
                        size_t k = ps_stage_table_index(t, l, i, sub, c);
                        if (t->max_succ[k] < s - 1 || !isfinite(t->cost[k]))
                            continue;
                        admissible *a = &adm[n_adm];
                        bool any = false;
                        for (int v = 0; v < (M > 0 ? 4 : 1); v++) {
                            double cost = variant_cost(t, k, l, i, sub, v);
                            a->cost[v] = cost <= t_max ? cost : INFINITY;
                            any = any || cost <= t_max;
                        }
                        if (any) {
                            a->cfg = c;
                            n_adm++;
                        }
                    }
                    if (n_adm == 0)
                        continue;
                    for (int d = s > nd ? s : nd; d <= D; d++) {
                        double r = rest[d - nd];
                        if (!isfinite(r))
                            continue;
                        int v = 0;
                        if (M > 0) {
                            int offset = D - d;
                            if (!ps_stage_fits_at(nd, offset, M))
                                continue;
                            v = (offset % M == 0 ? 1 : 0) | ((offset + nd) % M == 0 ? 2 : 0);
                        }
                        for (int q = 0; q < n_adm; q++) {
                            double cost = adm[q].cost[v];
                            if (cost + r < best[d]) {
                                best[d] = cost + r;
                                bi[d] = i;
                                bsc[d] = sub * C + adm[q].cfg;
                            }
                        }
                    }
                }
            }
        }
    }
#undef F
#undef AI
#undef ASC
}

/* The plan of s_count stages that the choice arrays of the last dp_for
 * hold for all D devices, each stage priced where it sits; iteration_s with
 * its real slowest stage (<= the t_max it was found at). */
static ps_status extract(const ps_stage_table *t, int D, int B, int s_count, const int *arg_i,
                         const int *arg_sc, ps_stage_plan *out)
{
    int L = t->n_layers, C = t->n_configs;
    ps_stage_choice *stages = calloc((size_t)s_count, sizeof *stages);
    if (stages == NULL)
        return PS_ERR_NOMEM;
    free(out->stages);
    out->stages = stages;
    out->n_stages = s_count;
    out->max_stage_s = 0;
    double sum = 0;
    int l = 0, d = D;
    for (int s = s_count, k = 0; s >= 1; s--, k++) {
        size_t idx = ((size_t)s * (L + 1) + l) * (D + 1) + d;
        int i = arg_i[idx], sc = arg_sc[idx];
        ps_stage_choice *ch = &stages[k];
        ch->first = l;
        ch->last = i;
        ch->sub = sc / C;
        ch->cfg = sc % C;
        ch->cost_s = ps_stage_table_placed_cost(
            t, ps_stage_table_index(t, l, i, ch->sub, ch->cfg), l, i, ch->sub, D - d);
        out->max_stage_s = fmax(out->max_stage_s, ch->cost_s);
        sum += ch->cost_s;
        d -= t->sub_devices[ch->sub];
        l = i + 1;
    }
    out->iteration_s = sum + (double)(B - 1) * out->max_stage_s;
    return PS_OK;
}

ps_status ps_stage_dp_by_count(const ps_stage_table *t, int D, int B, double within,
                               ps_stage_plan *by_count, ps_error *err)
{
    ps_status st = PS_OK;
    int L = t->n_layers, C = t->n_configs;
    for (int s = 0; s <= L; s++)
        memset(&by_count[s], 0, sizeof by_count[s]);
    if (!(within >= 1))
        return ps_error_set(err, PS_ERR_INVALID, "stage DP: within must be at least 1");
    /* under in-order placement an entry has up to 4 costs: each of its
     * neighbours on its node or another */
    int variants = t->devices_per_node > 0 ? 4 : 1;
    size_t n_entries = (size_t)L * L * t->n_submeshes * C * variants;
    size_t n_f = (size_t)(L + 1) * (L + 1) * (D + 1);
    double *costs = malloc(n_entries * sizeof *costs);
    double *f = malloc(n_f * sizeof *f);
    double *objective = malloc(((size_t)L + 1) * sizeof *objective);
    int *arg_i = malloc(n_f * sizeof *arg_i), *arg_sc = malloc(n_f * sizeof *arg_sc);
    admissible *adm = malloc((size_t)C * sizeof *adm);
    PS_TRY_ALLOC(adm, err);
    PS_TRY_ALLOC(costs, err);
    PS_TRY_ALLOC(f, err);
    PS_TRY_ALLOC(objective, err);
    PS_TRY_ALLOC(arg_i, err);
    PS_TRY_ALLOC(arg_sc, err);
    size_t n_costs = 0;
    for (int l = 0; l < L; l++)
        for (int i = l; i < L; i++)
            for (int s = 0; s < t->n_submeshes; s++)
                for (int c = 0; c < C; c++) {
                    size_t k = ps_stage_table_index(t, l, i, s, c);
                    if (!isfinite(t->cost[k]) || t->max_succ[k] < 0)
                        continue;
                    for (int v = 0; v < variants; v++)
                        costs[n_costs++] = variant_cost(t, k, l, i, s, v);
                }
    qsort(costs, n_costs, sizeof *costs, cmp_double);
    for (int s = 0; s <= L; s++)
        objective[s] = INFINITY;
    double best = INFINITY;
    int tried = 0;
    for (size_t j = 0; j < n_costs; j++) {
        double t_max = costs[j];
        if (j > 0 && t_max == costs[j - 1])
            continue;
        /* a plan whose slowest stage is t_max or slower takes at least
         * B * t_max: every later t_max is worse than `within` times the best */
        if ((double)B * t_max >= within * best)
            break;
        tried++;
        dp_for(t, D, t_max, f, arg_i, arg_sc, adm);
        for (int s = 1; s <= L; s++) {
            double total = f[((size_t)s * (L + 1)) * (D + 1) + D];
            if (!isfinite(total))
                continue;
            double iteration = total + (double)(B - 1) * t_max;
            if (iteration < objective[s]) {
                objective[s] = iteration;
                best = fmin(best, iteration);
                if (extract(t, D, B, s, arg_i, arg_sc, &by_count[s]) != PS_OK) {
                    st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
                    goto out;
                }
            }
        }
    }
    if (!isfinite(best)) {
        st = ps_error_set(err, PS_ERR_INFEASIBLE,
                          "no pipeline fits: no split of the %d layers into stages on submeshes "
                          "covering the %d devices fits in memory",
                          L, D);
        goto out;
    }
    /* a count whose best is not within the bound was not searched to the end */
    for (int s = 1; s <= L; s++) {
        if (objective[s] >= within * best && objective[s] > best)
            ps_stage_plan_clear(&by_count[s]);
        by_count[s].t_max_tried = tried;
    }
out:
    if (st != PS_OK)
        for (int s = 0; s <= L; s++)
            ps_stage_plan_clear(&by_count[s]);
    free(costs);
    free(f);
    free(objective);
    free(arg_i);
    free(arg_sc);
    free(adm);
    return st;
}

ps_status ps_stage_dp(const ps_stage_table *t, int D, int B, ps_stage_plan *out, ps_error *err)
{
    memset(out, 0, sizeof *out);
    int L = t->n_layers;
    ps_stage_plan *by_count = calloc((size_t)L + 1, sizeof *by_count);
    if (by_count == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    ps_status st = ps_stage_dp_by_count(t, D, B, 1.0, by_count, err);
    if (st == PS_OK) {
        int best = 0;
        for (int s = 1; s <= L; s++)
            if (by_count[s].n_stages > 0 &&
                (best == 0 || by_count[s].iteration_s < by_count[best].iteration_s))
                best = s;
        *out = by_count[best];
        memset(&by_count[best], 0, sizeof by_count[best]);
    }
    for (int s = 0; s <= L; s++)
        ps_stage_plan_clear(&by_count[s]);
    free(by_count);
    return st;
}

/* ---- brute force -------------------------------------------------------------- */

typedef struct brute {
    const ps_stage_table *t;
    int D, B, only_n;
    ps_stage_choice cur[64], best[64];
    int n_best;
    double best_iter;
} brute;

static void brute_rec(brute *b, int l, int n, int d_used)
{
    const ps_stage_table *t = b->t;
    if (l == t->n_layers) {
        if (d_used != b->D || (b->only_n > 0 && n != b->only_n))
            return;
        double sum = 0, mx = 0;
        for (int k = 0; k < n; k++) {
            /* stage k has n - 1 - k later stages */
            size_t idx = ps_stage_table_index(t, b->cur[k].first, b->cur[k].last, b->cur[k].sub,
                                              b->cur[k].cfg);
            if (t->max_succ[idx] < n - 1 - k)
                return;
            sum += b->cur[k].cost_s;
            mx = fmax(mx, b->cur[k].cost_s);
        }
        double iter = sum + (double)(b->B - 1) * mx;
        if (iter < b->best_iter) {
            b->best_iter = iter;
            b->n_best = n;
            memcpy(b->best, b->cur, (size_t)n * sizeof *b->cur);
        }
        return;
    }
    for (int i = l; i < t->n_layers; i++) {
        if (i < t->n_layers - 1 && t->no_cut_after != NULL && t->no_cut_after[i])
            continue;
        for (int s = 0; s < t->n_submeshes; s++) {
            if (d_used + t->sub_devices[s] > b->D)
                continue;
            for (int c = 0; c < t->n_configs; c++) {
                size_t idx = ps_stage_table_index(t, l, i, s, c);
                double cost = ps_stage_table_placed_cost(t, idx, l, i, s, d_used);
                if (!isfinite(cost) || t->max_succ[idx] < 0)
                    continue;
                b->cur[n] = (ps_stage_choice){l, i, s, c, cost};
                brute_rec(b, i + 1, n + 1, d_used + t->sub_devices[s]);
            }
        }
    }
}

ps_status ps_stage_brute_force(const ps_stage_table *t, int D, int B, int n_stages,
                               ps_stage_plan *out, ps_error *err)
{
    memset(out, 0, sizeof *out);
    if (t->n_layers > 12)
        return ps_error_set(err, PS_ERR_INVALID, "brute force: too many layers");
    brute *b = calloc(1, sizeof *b);
    if (b == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    b->t = t;
    b->D = D;
    b->B = B;
    b->only_n = n_stages;
    b->best_iter = INFINITY;
    brute_rec(b, 0, 0, 0);
    ps_status st = PS_OK;
    if (!isfinite(b->best_iter)) {
        st = ps_error_set(err, PS_ERR_INFEASIBLE, "no pipeline fits");
    } else {
        out->stages = malloc((size_t)b->n_best * sizeof *out->stages);
        if (out->stages == NULL) {
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        } else {
            memcpy(out->stages, b->best, (size_t)b->n_best * sizeof *b->best);
            out->n_stages = b->n_best;
            out->iteration_s = b->best_iter;
            for (int k = 0; k < b->n_best; k++)
                out->max_stage_s = fmax(out->max_stage_s, b->best[k].cost_s);
        }
    }
    free(b);
    return st;
}
