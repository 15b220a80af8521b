#include "core/profile_db.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/median.h"

const char *const ps_profile_comm_names[PS_PROFILE_COMM_COUNT] = {
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv"};
const char *const ps_profile_backend_names[2] = {"cpu", "cuda"};

/* Entries beyond these are typos, not measurements (2^40 elements per
 * dimension, a PiB message, 2^20 devices). */
#define MAX_DIM ((int64_t)1 << 40)
#define MAX_BYTES ((int64_t)1 << 50)
#define MAX_GROUP (1 << 20)
/* Times far below any measurement (subnormal ones) make rates overflow, and
 * ones above 30 years the extrapolated times. */
#define MIN_SECONDS 1e-30
#define MAX_SECONDS 1e9
/* Derived figures in a file must match the ones recomputed from seconds. */
#define DERIVED_RTOL 1e-6

double ps_profile_busbw_factor(ps_profile_comm kind, int n)
{
    if (n < 2)
        return 0;
    switch (kind) {
    case PS_PROFILE_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case PS_PROFILE_ALL_GATHER:
    case PS_PROFILE_REDUCE_SCATTER:
    case PS_PROFILE_ALL_TO_ALL: return (double)(n - 1) / n;
    case PS_PROFILE_SEND_RECV: return 1;
    case PS_PROFILE_COMM_COUNT: break;
    }
    return 0;
}

bool ps_profile_gemm_kind(ps_op_kind kind)
{
    return kind == PS_OP_MATMUL || kind == PS_OP_CONV2D || kind == PS_OP_CONV2D_GRAD_INPUT ||
           kind == PS_OP_CONV2D_GRAD_FILTER;
}

/* The n of an entry's GEMM table (kind -1): the dtype alone for MATMULs. */
static int gemm_table_n(ps_op_kind op, ps_dtype dtype)
{
    return (int)op * PS_FLOAT_DTYPE_COUNT + (int)dtype;
}

double ps_profile_gemm_flops(const ps_profile_gemm *g)
{
    ps_gemm_shape sh = {.m = g->m, .n = g->n, .k = g->k, .batch = g->batch};
    return ps_gemm_shape_flops(&sh);
}

/* "m x n x k", " (batch b)" for a batch, "conv2d m x n x k" for a
 * convolution. */
static const char *gemm_text(const ps_profile_gemm *g, char buf[128])
{
    int len = snprintf(buf, 128, "%s%s%lld x %lld x %lld",
                       g->op != PS_OP_MATMUL ? ps_op_kind_get(g->op)->name : "",
                       g->op != PS_OP_MATMUL ? " " : "", (long long)g->m, (long long)g->n,
                       (long long)g->k);
    if (g->batch > 1)
        snprintf(buf + len, (size_t)(128 - len), " (batch %lld)", (long long)g->batch);
    return buf;
}

/* FLOPs per element read or written, of one GEMM of the batch. */
static double intensity(int64_t m, int64_t n, int64_t k)
{
    double dm = (double)m, dn = (double)n, dk = (double)k;
    return 2 * dm * dn * dk / (dm * dk + dk * dn + dm * dn);
}

/* ---- construction ------------------------------------------------------ */

static ps_status copy_name(char out[PS_PROFILE_NAME_MAX], const char *s, const char *what,
                           ps_error *err)
{
    size_t len = s != NULL ? strlen(s) : 0;
    if (len == 0 || len >= PS_PROFILE_NAME_MAX)
        return ps_error_set(err, PS_ERR_INVALID,
                            "profile DB: a %s name must have 1 to %d "
                            "characters (found %zu)",
                            what, PS_PROFILE_NAME_MAX - 1, len);
    memcpy(out, s, len + 1);
    return PS_OK;
}

static int backend_index(const char *s)
{
    for (int i = 0; i < 2; i++)
        if (s != NULL && strcmp(s, ps_profile_backend_names[i]) == 0)
            return i;
    return -1;
}

ps_status ps_profile_db_create(const char *device, const char *backend, int devices,
                               ps_profile_db **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_profile_db *db = NULL;
    *out = NULL;
    if (backend_index(backend) < 0)
        return ps_error_set(err, PS_ERR_INVALID, "profile DB: unknown backend \"%s\" (cpu or cuda)",
                            backend != NULL ? backend : "");
    if (devices < 1 || devices > MAX_GROUP)
        return ps_error_set(err, PS_ERR_INVALID, "profile DB: %d devices", devices);
    db = calloc(1, sizeof *db);
    PS_TRY_ALLOC(db, err);
    PS_TRY(copy_name(db->device, device, "device", err));
    PS_TRY(copy_name(db->backend, backend, "backend", err));
    db->devices = devices;
    db->devices_at_once = 1;
    *out = db;
    db = NULL;
out:
    ps_profile_db_free(db);
    return st;
}

static void free_tables(ps_profile_db *db)
{
    for (int i = 0; i < db->n_tables; i++) {
        free(db->tables[i].size);
        free(db->tables[i].seconds);
    }
    free(db->tables);
    db->tables = NULL;
    db->n_tables = 0;
    db->finished = false;
}

void ps_profile_db_free(ps_profile_db *db)
{
    if (db == NULL)
        return;
    free_tables(db);
    free(db->gemm);
    free(db->comm);
    free(db->ops);
    free(db);
}

static bool valid_seconds(double x)
{
    return x >= MIN_SECONDS && x <= MAX_SECONDS;
}

static ps_status check_gemm(const ps_profile_gemm *e, ps_error *err)
{
    if ((int)e->op < 0 || (int)e->op >= PS_OP_KIND_COUNT || !ps_profile_gemm_kind(e->op))
        return ps_error_set(err, PS_ERR_INVALID,
                            "profile DB: a GEMM entry of op kind %d: only matmul and the "
                            "convolutions are timed as GEMMs",
                            (int)e->op);
    if (e->m < 1 || e->n < 1 || e->k < 1 || e->m > MAX_DIM || e->n > MAX_DIM || e->k > MAX_DIM)
        return ps_error_set(err, PS_ERR_INVALID,
                            "profile DB: GEMM %lld x %lld x %lld: sizes must be 1 to 2^40",
                            (long long)e->m, (long long)e->n, (long long)e->k);
    if (e->batch < 0 || e->batch > MAX_DIM)
        return ps_error_set(err, PS_ERR_INVALID,
                            "profile DB: GEMM batch %lld must be 1 to 2^40 (0: one GEMM)",
                            (long long)e->batch);
    if ((int)e->dtype < 0 || (int)e->dtype >= PS_FLOAT_DTYPE_COUNT)
        return ps_error_set(err, PS_ERR_INVALID,
                            "profile DB: GEMM dtype %d is not fp32, fp16 "
                            "or bf16",
                            (int)e->dtype);
    if (!valid_seconds(e->seconds))
        return ps_error_set(err, PS_ERR_INVALID,
                            "profile DB: GEMM time %g s must be 1e-30 to 1e9 s", e->seconds);
    return PS_OK;
}

static ps_status check_comm(const ps_profile_comm_entry *e, ps_error *err)
{
    if ((int)e->kind < 0 || (int)e->kind >= PS_PROFILE_COMM_COUNT)
        return ps_error_set(err, PS_ERR_INVALID, "profile DB: unknown communication kind %d",
                            (int)e->kind);
    const char *name = ps_profile_comm_names[e->kind];
    if (e->n < 2 || e->n > MAX_GROUP)
        return ps_error_set(err, PS_ERR_INVALID, "profile DB: %s over %d devices (2 to %d)", name,
                            e->n, MAX_GROUP);
    if (e->kind == PS_PROFILE_SEND_RECV && e->n != 2)
        return ps_error_set(err, PS_ERR_INVALID,
                            "profile DB: send-recv is between 2 devices, "
                            "not %d",
                            e->n);
    if (e->bytes < 1 || e->bytes > MAX_BYTES)
        return ps_error_set(err, PS_ERR_INVALID, "profile DB: %s of %lld bytes (1 to 2^50)", name,
                            (long long)e->bytes);
    if (!valid_seconds(e->seconds))
        return ps_error_set(err, PS_ERR_INVALID, "profile DB: %s time %g s must be at least "
                            "1e-30 to 1e9 s", name, e->seconds);
    return PS_OK;
}

static ps_status check_op(const ps_profile_op *e, ps_error *err)
{
    if ((int)e->op < 0 || (int)e->op >= PS_OP_KIND_COUNT || ps_profile_gemm_kind(e->op))
        return ps_error_set(err, PS_ERR_INVALID,
                            "profile DB: op kind %d is not a non-GEMM op (GEMMs and "
                            "convolutions have their own entries)",
                            (int)e->op);
    const char *name = ps_op_kind_get(e->op)->name;
    if (e->bytes < 1 || e->bytes > MAX_BYTES)
        return ps_error_set(err, PS_ERR_INVALID, "profile DB: %s of %lld bytes (1 to 2^50)", name,
                            (long long)e->bytes);
    if (!valid_seconds(e->seconds))
        return ps_error_set(err, PS_ERR_INVALID, "profile DB: %s time %g s must be at least "
                            "1e-30 to 1e9 s", name, e->seconds);
    return PS_OK;
}

/* Grows *arr (of *cap elements of size `size`) to hold `need`. */
static ps_status grow(void **arr, int *cap, int need, size_t size, ps_error *err)
{
    if (need <= *cap)
        return PS_OK;
    int next = *cap > 0 ? *cap * 2 : 16;
    while (next < need)
        next *= 2;
    void *p = realloc(*arr, (size_t)next * size);
    if (p == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    *arr = p;
    *cap = next;
    return PS_OK;
}

/* Appends entry e of `size` bytes to *arr (*n of *cap) once checked. */
static ps_status append(ps_profile_db *db, ps_status checked, void **arr, int *n, int *cap,
                        const void *e, size_t size, ps_error *err)
{
    ps_status st = checked;
    if (st == PS_OK)
        st = grow(arr, cap, *n + 1, size, err);
    if (st != PS_OK)
        return st;
    memcpy((char *)*arr + (size_t)*n * size, e, size);
    (*n)++;
    db->finished = false;
    return PS_OK;
}

ps_status ps_profile_db_add_gemm(ps_profile_db *db, const ps_profile_gemm *e, ps_error *err)
{
    ps_profile_gemm g = *e;
    g.batch = e->batch > 1 ? e->batch : 1; /* stored as 1 and up: 0 is one GEMM */
    return append(db, check_gemm(e, err), (void **)&db->gemm, &db->n_gemm, &db->cap_gemm, &g,
                  sizeof g, err);
}

ps_status ps_profile_db_add_comm(ps_profile_db *db, const ps_profile_comm_entry *e, ps_error *err)
{
    return append(db, check_comm(e, err), (void **)&db->comm, &db->n_comm, &db->cap_comm, e,
                  sizeof *e, err);
}

ps_status ps_profile_db_add_op(ps_profile_db *db, const ps_profile_op *e, ps_error *err)
{
    return append(db, check_op(e, err), (void **)&db->ops, &db->n_op, &db->cap_op, e, sizeof *e,
                  err);
}

/* ---- passes --------------------------------------------------------------- */

static bool same_gemm_key(const ps_profile_gemm *a, const ps_profile_gemm *b)
{
    return a->op == b->op && a->m == b->m && a->n == b->n && a->k == b->k && a->batch == b->batch &&
           a->dtype == b->dtype;
}

ps_status ps_profile_db_median_passes(ps_profile_db *const *dbs, int n, ps_error *err)
{
    if (n < 1 || n > PS_PROFILE_MAX_PASSES)
        return ps_error_set(err, PS_ERR_INVALID, "profile: %d passes (1 to %d)", n,
                            PS_PROFILE_MAX_PASSES);
    ps_profile_db *db = dbs[0];
    for (int p = 0; p < n; p++) {
        const ps_profile_db *q = dbs[p];
        if (q->finished || q->n_gemm != db->n_gemm || q->n_comm != db->n_comm ||
            q->n_op != db->n_op || q->devices != db->devices ||
            q->devices_at_once != db->devices_at_once)
            return ps_error_set(err, PS_ERR_INTERNAL,
                                "profile: pass %d measured other entries than pass 1", p + 1);
        for (int i = 0; i < db->n_gemm; i++)
            if (!same_gemm_key(&q->gemm[i], &db->gemm[i]))
                return ps_error_set(err, PS_ERR_INTERNAL,
                                    "profile: pass %d measured another GEMM than pass 1 at %d",
                                    p + 1, i);
        for (int i = 0; i < db->n_comm; i++)
            if (q->comm[i].kind != db->comm[i].kind || q->comm[i].n != db->comm[i].n ||
                q->comm[i].bytes != db->comm[i].bytes)
                return ps_error_set(err, PS_ERR_INTERNAL,
                                    "profile: pass %d measured another transfer than pass 1 at %d",
                                    p + 1, i);
        for (int i = 0; i < db->n_op; i++)
            if (q->ops[i].op != db->ops[i].op || q->ops[i].bytes != db->ops[i].bytes)
                return ps_error_set(err, PS_ERR_INTERNAL,
                                    "profile: pass %d measured another op than pass 1 at %d", p + 1,
                                    i);
    }
    double v[PS_PROFILE_MAX_PASSES];
    for (int i = 0; i < db->n_gemm; i++) {
        for (int p = 0; p < n; p++)
            v[p] = dbs[p]->gemm[i].seconds;
        db->gemm[i].seconds = ps_median(v, n);
    }
    for (int i = 0; i < db->n_comm; i++) {
        for (int p = 0; p < n; p++)
            v[p] = dbs[p]->comm[i].seconds;
        db->comm[i].seconds = ps_median(v, n);
    }
    for (int i = 0; i < db->n_op; i++) {
        for (int p = 0; p < n; p++)
            v[p] = dbs[p]->ops[i].seconds;
        db->ops[i].seconds = ps_median(v, n);
    }
    return PS_OK;
}

/* ---- sorting and tables ------------------------------------------------ */

static int cmp_i64(int64_t a, int64_t b)
{
    return (a > b) - (a < b);
}

static int cmp_gemm(const void *pa, const void *pb)
{
    const ps_profile_gemm *a = pa, *b = pb;
    if (a->op != b->op)
        return (int)a->op - (int)b->op;
    if (a->dtype != b->dtype)
        return (int)a->dtype - (int)b->dtype;
    double fa = ps_profile_gemm_flops(a), fb = ps_profile_gemm_flops(b);
    if (fa != fb)
        return fa < fb ? -1 : 1;
    int c = cmp_i64(a->batch, b->batch);
    if (c == 0)
        c = cmp_i64(a->m, b->m);
    if (c == 0)
        c = cmp_i64(a->n, b->n);
    return c != 0 ? c : cmp_i64(a->k, b->k);
}

static int cmp_op(const void *pa, const void *pb)
{
    const ps_profile_op *a = pa, *b = pb;
    if (a->op != b->op)
        return (int)a->op - (int)b->op;
    return cmp_i64(a->bytes, b->bytes);
}

static int cmp_comm(const void *pa, const void *pb)
{
    const ps_profile_comm_entry *a = pa, *b = pb;
    if (a->kind != b->kind)
        return (int)a->kind - (int)b->kind;
    if (a->n != b->n)
        return a->n - b->n;
    return cmp_i64(a->bytes, b->bytes);
}

/* A table from (size, seconds) points sorted by size: equal sizes are
 * averaged (GEMMs of one FLOP count and different shapes), then each time
 * is raised to the largest time of any smaller size. */
static ps_status make_table(ps_profile_table *t, int kind, int n, const double *size,
                            const double *seconds, int count, ps_error *err)
{
    t->kind = kind;
    t->n = n;
    t->count = 0;
    t->size = malloc((size_t)count * sizeof *t->size);
    t->seconds = malloc((size_t)count * sizeof *t->seconds);
    if (t->size == NULL || t->seconds == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    for (int i = 0; i < count;) {
        int j = i;
        double sum = 0;
        while (j < count && size[j] == size[i])
            sum += seconds[j++];
        double s = sum / (j - i);
        if (t->count > 0 && s < t->seconds[t->count - 1])
            s = t->seconds[t->count - 1];
        t->size[t->count] = size[i];
        t->seconds[t->count] = s;
        t->count++;
        i = j;
    }
    return PS_OK;
}

ps_status ps_profile_db_finish(ps_profile_db *db, ps_error *err)
{
    ps_status st = PS_OK;
    double *size = NULL, *secs = NULL;
    free_tables(db);
    if (db->n_gemm == 0 && db->n_comm == 0 && db->n_op == 0)
        return ps_error_set(err, PS_ERR_INVALID, "profile DB \"%s\" holds no measurements",
                            db->device);
    if (db->n_op > 0)
        qsort(db->ops, (size_t)db->n_op, sizeof *db->ops, cmp_op);
    for (int i = 1; i < db->n_op; i++)
        if (cmp_op(&db->ops[i - 1], &db->ops[i]) == 0)
            return ps_error_set(err, PS_ERR_INVALID, "profile DB: %s of %lld bytes measured twice",
                                ps_op_kind_get(db->ops[i].op)->name,
                                (long long)db->ops[i].bytes);
    if (db->n_gemm > 0)
        qsort(db->gemm, (size_t)db->n_gemm, sizeof *db->gemm, cmp_gemm);
    if (db->n_comm > 0)
        qsort(db->comm, (size_t)db->n_comm, sizeof *db->comm, cmp_comm);
    for (int i = 1; i < db->n_gemm; i++) {
        const ps_profile_gemm *a = &db->gemm[i - 1], *b = &db->gemm[i];
        char text[128];
        if (cmp_gemm(a, b) == 0)
            return ps_error_set(err, PS_ERR_INVALID, "profile DB: GEMM %s %s measured twice",
                                gemm_text(a, text), ps_dtype_name(a->dtype));
    }
    for (int i = 1; i < db->n_comm; i++)
        if (cmp_comm(&db->comm[i - 1], &db->comm[i]) == 0)
            return ps_error_set(err, PS_ERR_INVALID,
                                "profile DB: %s over %d devices of %lld bytes measured twice",
                                ps_profile_comm_names[db->comm[i].kind], db->comm[i].n,
                                (long long)db->comm[i].bytes);
    int max_count = db->n_gemm > db->n_comm ? db->n_gemm : db->n_comm;
    if (db->n_op > max_count)
        max_count = db->n_op;
    /* one table per dtype, per (kind, n) and per op kind: at most one per entry */
    db->tables = calloc((size_t)(db->n_gemm + db->n_comm + db->n_op), sizeof *db->tables);
    size = malloc((size_t)max_count * sizeof *size);
    secs = malloc((size_t)max_count * sizeof *secs);
    PS_TRY_ALLOC(db->tables, err);
    PS_TRY_ALLOC(size, err);
    PS_TRY_ALLOC(secs, err);
    for (int i = 0; i < db->n_gemm;) {
        int j = i, count = 0;
        for (; j < db->n_gemm && db->gemm[j].op == db->gemm[i].op &&
               db->gemm[j].dtype == db->gemm[i].dtype;
             j++) {
            size[count] = ps_profile_gemm_flops(&db->gemm[j]);
            secs[count++] = db->gemm[j].seconds;
        }
        PS_TRY(make_table(&db->tables[db->n_tables++], -1,
                          gemm_table_n(db->gemm[i].op, db->gemm[i].dtype), size, secs, count,
                          err));
        i = j;
    }
    for (int i = 0; i < db->n_comm;) {
        int j = i, count = 0;
        for (; j < db->n_comm && db->comm[j].kind == db->comm[i].kind &&
               db->comm[j].n == db->comm[i].n;
             j++) {
            size[count] = (double)db->comm[j].bytes;
            secs[count++] = db->comm[j].seconds;
        }
        PS_TRY(make_table(&db->tables[db->n_tables++], (int)db->comm[i].kind, db->comm[i].n, size,
                          secs, count, err));
        i = j;
    }
    for (int i = 0; i < db->n_op;) {
        int j = i, count = 0;
        for (; j < db->n_op && db->ops[j].op == db->ops[i].op; j++) {
            size[count] = (double)db->ops[j].bytes;
            secs[count++] = db->ops[j].seconds;
        }
        PS_TRY(make_table(&db->tables[db->n_tables++], -2, (int)db->ops[i].op, size, secs, count,
                          err));
        i = j;
    }
    db->finished = true;
out:
    free(size);
    free(secs);
    if (st != PS_OK)
        free_tables(db);
    return st;
}

/* ---- lookups ----------------------------------------------------------- */

/* The interpolation of the header: latency below, linear between,
 * bandwidth above. */
static double table_s(const ps_profile_table *t, double x)
{
    int last = t->count - 1;
    if (x <= t->size[0])
        return t->seconds[0];
    if (x >= t->size[last])
        return x * (t->seconds[last] / t->size[last]);
    int lo = 0, hi = last; /* size[lo] < x < size[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (t->size[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    double f = (x - t->size[lo]) / (t->size[hi] - t->size[lo]);
    return t->seconds[lo] + f * (t->seconds[hi] - t->seconds[lo]);
}

/* The time at x in the one table of (kind, n): 0 for x <= 0, -1 when the
 * DB has no such table (GEMMs: kind -1, n the dtype; ops: kind -2, n the
 * op kind). */
static double one_table_s(const ps_profile_db *db, int kind, int n, double x)
{
    if (db == NULL || !db->finished)
        return -1;
    for (int i = 0; i < db->n_tables; i++)
        if (db->tables[i].kind == kind && db->tables[i].n == n)
            return x > 0 ? table_s(&db->tables[i], x) : 0;
    return -1;
}

double ps_profile_gemm_s(const ps_profile_db *db, ps_dtype dtype, double flops)
{
    return one_table_s(db, -1, gemm_table_n(PS_OP_MATMUL, dtype), flops);
}

double ps_profile_gemm_flops_per_s(const ps_profile_db *db, ps_dtype dtype, double flops)
{
    double s = ps_profile_gemm_s(db, dtype, flops);
    return s > 0 && flops > 0 ? flops / s : 0;
}

/* What the GEMMs of one dtype whose intensity lies within the band around
 * a query's say about its FLOPs: their own table (equal FLOPs averaged,
 * each time raised to every smaller one's), or, where it says nothing,
 * bounds that keep the time monotone in FLOPs across the band's edges. */
typedef struct band_answer {
    double s;        /* the band's time; -1: it says nothing */
    double at_most;  /* then: the band's smallest time, all its GEMMs being far larger */
    double at_least; /* or: its time extrapolated to the edge, all being far smaller */
} band_answer;

/* g[0..count) sorted by FLOPs. The band answers when its points bracket
 * `flops` or one lies within PS_PROFILE_GEMM_FLOPS_NEAR of it, as table_s
 * would: linear between points, the smallest's time below, the largest's
 * rate above. */
static band_answer band_s(const ps_profile_gemm *g, int count, double flops, double in)
{
    band_answer a = {.s = -1, .at_most = INFINITY, .at_least = 0};
    double prev_f = 0, prev_s = 0; /* the last point below flops (prev_f 0: none) */
    bool near = false;
    for (int i = 0; i < count;) {
        double f = ps_profile_gemm_flops(&g[i]), sum = 0;
        int n = 0, j = i;
        for (; j < count && ps_profile_gemm_flops(&g[j]) == f; j++) {
            double r = intensity(g[j].m, g[j].n, g[j].k) / in;
            if (r <= PS_PROFILE_GEMM_INTENSITY_BAND && r >= 1 / PS_PROFILE_GEMM_INTENSITY_BAND) {
                sum += g[j].seconds;
                n++;
            }
        }
        i = j;
        if (n == 0)
            continue;
        double sec = fmax(sum / n, prev_s);
        near = near || (f <= flops * PS_PROFILE_GEMM_FLOPS_NEAR &&
                        f >= flops / PS_PROFILE_GEMM_FLOPS_NEAR);
        if (f >= flops) { /* the first point at or above */
            if (f == flops || prev_f > 0) /* measured, or bracketed */
                a.s = f == flops ? sec
                                 : prev_s + (flops - prev_f) * (sec - prev_s) / (f - prev_f);
            else if (near) /* every point above, the first near */
                a.s = sec;
            else
                a.at_most = sec;
            return a;
        }
        prev_f = f;
        prev_s = sec;
    }
    if (prev_f > 0 && near) /* every point below, the last near */
        a.s = flops * (prev_s / prev_f);
    else if (prev_f > 0)
        a.at_least = PS_PROFILE_GEMM_FLOPS_NEAR * prev_s;
    return a;
}

double ps_profile_gemm_shape_s(const ps_profile_db *db, ps_dtype dtype, const ps_gemm_shape *shape)
{
    return ps_profile_gemm_op_shape_s(db, PS_OP_MATMUL, dtype, shape);
}

double ps_profile_gemm_op_shape_s(const ps_profile_db *db, ps_op_kind op, ps_dtype dtype,
                                  const ps_gemm_shape *shape)
{
    ps_profile_gemm q = {.op = op, .m = shape->m, .n = shape->n, .k = shape->k,
                         .batch = shape->batch > 1 ? shape->batch : 1, .dtype = dtype};
    if (db == NULL || !db->finished)
        return -1;
    int lo = 0;
    while (lo < db->n_gemm && (db->gemm[lo].op != op || db->gemm[lo].dtype != dtype))
        lo++;
    int hi = lo;
    while (hi < db->n_gemm && db->gemm[hi].op == op && db->gemm[hi].dtype == dtype)
        hi++;
    if (lo == hi)
        return -1;
    if (q.m < 1 || q.n < 1 || q.k < 1)
        return 0;
    for (int i = lo; i < hi; i++)
        if (cmp_gemm(&db->gemm[i], &q) == 0)
            return db->gemm[i].seconds;
    double flops = ps_profile_gemm_flops(&q);
    /* A convolution far beyond its kind's largest entry: those entries (a
     * profile's small training steps) stop where the kind's rate still
     * climbs steeply, so their largest rate would make a large convolution
     * many times too slow; the MATMULs, measured to where the rate levels
     * off, answer instead (the caller's fallback). */
    if (op != PS_OP_MATMUL &&
        flops > PS_PROFILE_GEMM_FLOPS_NEAR * ps_profile_gemm_flops(&db->gemm[hi - 1]))
        return -1;
    band_answer a = band_s(&db->gemm[lo], hi - lo, flops, intensity(q.m, q.n, q.k));
    if (a.s >= 0)
        return a.s;
    double s = one_table_s(db, -1, gemm_table_n(op, dtype), flops);
    return fmax(fmin(s, a.at_most), a.at_least);
}

double ps_profile_op_s(const ps_profile_db *db, ps_op_kind kind, double bytes)
{
    return one_table_s(db, -2, (int)kind, bytes);
}

double ps_profile_collective_s(const ps_profile_db *db, ps_profile_comm kind, int n, double bytes)
{
    if (db == NULL || !db->finished)
        return -1;
    if (kind == PS_PROFILE_SEND_RECV)
        n = 2;
    /* the measured group sizes just below and above n */
    const ps_profile_table *below = NULL, *above = NULL;
    for (int i = 0; i < db->n_tables; i++) {
        const ps_profile_table *t = &db->tables[i];
        if (t->kind != (int)kind)
            continue;
        if (t->n <= n && (below == NULL || t->n > below->n))
            below = t;
        if (t->n >= n && (above == NULL || t->n < above->n))
            above = t;
    }
    if (below == NULL && above == NULL)
        return -1;
    if (n < 2 || bytes <= 0)
        return 0;
    if (below != NULL && above != NULL) {
        double s_lo = table_s(below, bytes);
        if (below == above)
            return s_lo;
        double f = (double)(n - below->n) / (above->n - below->n);
        return s_lo + f * (table_s(above, bytes) - s_lo);
    }
    /* outside the measured group sizes: the nearest one's busbw */
    const ps_profile_table *t = below != NULL ? below : above;
    return table_s(t, bytes) * ps_profile_busbw_factor(kind, n) /
           ps_profile_busbw_factor(kind, t->n);
}

/* ---- reading JSON ------------------------------------------------------ */

static ps_status read_int(const ps_jv *obj, const char *key, int64_t min, int64_t max, int64_t *out,
                          ps_error *err)
{
    ps_jv v;
    ps_status st = ps_jv_member(obj, key, &v, err);
    if (st == PS_OK)
        st = ps_jv_int(&v, INT64_MIN, INT64_MAX, out, err);
    if (st != PS_OK)
        return st;
    if (*out < min)
        return ps_jv_fail(&v, err, PS_ERR_INVALID, "must be at least %lld (found %lld)",
                          (long long)min, (long long)*out);
    if (*out > max)
        return ps_jv_fail(&v, err, PS_ERR_INVALID, "%lld is too large (at most %lld)",
                          (long long)*out, (long long)max);
    return PS_OK;
}

static ps_status read_seconds(const ps_jv *obj, double *out, ps_error *err)
{
    ps_jv v;
    ps_status st = ps_jv_member(obj, "seconds", &v, err);
    if (st == PS_OK)
        st = ps_jv_double(&v, -DBL_MAX, DBL_MAX, out, err);
    if (st != PS_OK)
        return st;
    if (!valid_seconds(*out))
        return ps_jv_fail(&v, err, PS_ERR_INVALID, "must be 1e-30 to 1e9 (found %g)", *out);
    return PS_OK;
}

/* An optional derived figure: when present, it must equal `want`. */
static ps_status check_derived(const ps_jv *obj, const char *key, double want, ps_error *err)
{
    ps_jv v;
    double x;
    if (!ps_jv_has(obj, key))
        return PS_OK;
    ps_status st = ps_jv_member(obj, key, &v, err);
    if (st == PS_OK)
        st = ps_jv_double(&v, -DBL_MAX, DBL_MAX, &x, err);
    if (st != PS_OK)
        return st;
    if (!(fabs(x - want) <= DERIVED_RTOL * fabs(want)))
        return ps_jv_fail(&v, err, PS_ERR_INVALID,
                          "%.9g does not match the one derived from seconds (%.9g); fix it or "
                          "leave it out",
                          x, want);
    return PS_OK;
}

static const char *const top_keys[] = {"version",     "device", "backend",
                                       "devices",     "gemm",   "collectives",
                                       "ops",         "devices_at_once", NULL};
static const char *const op_keys[] = {"op", "bytes", "seconds", "bytes_per_s", NULL};
static const char *const gemm_keys[] = {"op",    "m",       "n",           "k",
                                        "batch", "dtype",   "seconds",     "flops_per_s",
                                        NULL};
static const char *const comm_keys[] = {
    "kind", "n", "bytes", "seconds", "algbw_bytes_per_s", "busbw_bytes_per_s", NULL};

static ps_status read_gemm(ps_profile_db *db, const ps_jv *arr, ps_error *err)
{
    ps_status st = PS_OK;
    size_t count;
    PS_TRY(ps_jv_array(arr, &count, err));
    for (size_t i = 0; i < count; i++) {
        ps_jv e = ps_jv_element(arr, i), dt;
        ps_profile_gemm g;
        int d;
        PS_TRY(ps_jv_object(&e, err));
        PS_TRY(ps_jv_check_keys(&e, gemm_keys, err));
        g.op = PS_OP_MATMUL; /* absent: a GEMM proper */
        if (ps_jv_has(&e, "op")) {
            ps_jv kv;
            const char *name;
            PS_TRY(ps_jv_member(&e, "op", &kv, err));
            PS_TRY(ps_jv_string(&kv, &name, err));
            if (ps_op_kind_parse(name, &g.op) != 0 || !ps_profile_gemm_kind(g.op)) {
                st = ps_jv_fail(&kv, err, PS_ERR_INVALID,
                                "\"%s\" is not timed as a GEMM: want matmul, conv2d, "
                                "conv2d_grad_input or conv2d_grad_filter",
                                name);
                goto out;
            }
        }
        PS_TRY(read_int(&e, "m", 1, MAX_DIM, &g.m, err));
        PS_TRY(read_int(&e, "n", 1, MAX_DIM, &g.n, err));
        PS_TRY(read_int(&e, "k", 1, MAX_DIM, &g.k, err));
        g.batch = 1;
        if (ps_jv_has(&e, "batch"))
            PS_TRY(read_int(&e, "batch", 1, MAX_DIM, &g.batch, err));
        PS_TRY(ps_jv_member(&e, "dtype", &dt, err));
        PS_TRY(ps_jv_enum(&dt, ps_dtype_names, PS_FLOAT_DTYPE_COUNT, &d, err));
        g.dtype = (ps_dtype)d;
        PS_TRY(read_seconds(&e, &g.seconds, err));
        PS_TRY(check_derived(&e, "flops_per_s", ps_profile_gemm_flops(&g) / g.seconds, err));
        for (int j = 0; j < db->n_gemm; j++) {
            const ps_profile_gemm *o = &db->gemm[j];
            char text[128];
            if (cmp_gemm(o, &g) == 0) {
                st = ps_jv_fail(&e, err, PS_ERR_INVALID, "GEMM %s %s is also gemm[%d]",
                                gemm_text(&g, text), ps_dtype_name(g.dtype), j);
                goto out;
            }
        }
        PS_TRY(ps_profile_db_add_gemm(db, &g, err));
    }
out:
    return st;
}

static ps_status read_comm(ps_profile_db *db, const ps_jv *arr, ps_error *err)
{
    ps_status st = PS_OK;
    size_t count;
    PS_TRY(ps_jv_array(arr, &count, err));
    for (size_t i = 0; i < count; i++) {
        ps_jv e = ps_jv_element(arr, i), kv, nv;
        ps_profile_comm_entry c;
        int kind;
        int64_t n = 2;
        PS_TRY(ps_jv_object(&e, err));
        PS_TRY(ps_jv_check_keys(&e, comm_keys, err));
        PS_TRY(ps_jv_member(&e, "kind", &kv, err));
        PS_TRY(ps_jv_enum(&kv, ps_profile_comm_names, PS_PROFILE_COMM_COUNT, &kind, err));
        c.kind = (ps_profile_comm)kind;
        if (c.kind != PS_PROFILE_SEND_RECV || ps_jv_has(&e, "n"))
            PS_TRY(read_int(&e, "n", 2, MAX_GROUP, &n, err));
        if (c.kind == PS_PROFILE_SEND_RECV && n != 2) {
            PS_TRY(ps_jv_member(&e, "n", &nv, err));
            st = ps_jv_fail(&nv, err, PS_ERR_INVALID, "send-recv is between 2 devices (found %lld)",
                            (long long)n);
            goto out;
        }
        c.n = (int)n;
        PS_TRY(read_int(&e, "bytes", 1, MAX_BYTES, &c.bytes, err));
        PS_TRY(read_seconds(&e, &c.seconds, err));
        double algbw = (double)c.bytes / c.seconds;
        PS_TRY(check_derived(&e, "algbw_bytes_per_s", algbw, err));
        PS_TRY(check_derived(&e, "busbw_bytes_per_s", algbw * ps_profile_busbw_factor(c.kind, c.n),
                             err));
        for (int j = 0; j < db->n_comm; j++)
            if (cmp_comm(&db->comm[j], &c) == 0) {
                st = ps_jv_fail(&e, err, PS_ERR_INVALID,
                                "%s over %d devices of %lld bytes is also collectives[%d]",
                                ps_profile_comm_names[c.kind], c.n, (long long)c.bytes, j);
                goto out;
            }
        PS_TRY(ps_profile_db_add_comm(db, &c, err));
    }
out:
    return st;
}

static ps_status read_ops(ps_profile_db *db, const ps_jv *arr, ps_error *err)
{
    ps_status st = PS_OK;
    size_t count;
    PS_TRY(ps_jv_array(arr, &count, err));
    for (size_t i = 0; i < count; i++) {
        ps_jv e = ps_jv_element(arr, i), kv;
        ps_profile_op o;
        const char *name;
        PS_TRY(ps_jv_object(&e, err));
        PS_TRY(ps_jv_check_keys(&e, op_keys, err));
        PS_TRY(ps_jv_member(&e, "op", &kv, err));
        PS_TRY(ps_jv_string(&kv, &name, err));
        if (ps_op_kind_parse(name, &o.op) != 0 || ps_profile_gemm_kind(o.op)) {
            st = ps_jv_fail(&kv, err, PS_ERR_INVALID,
                            "\"%s\" is not an op kind other than matmul and the convolutions "
                            "(GEMMs and convolutions go in \"gemm\")",
                            name);
            goto out;
        }
        PS_TRY(read_int(&e, "bytes", 1, MAX_BYTES, &o.bytes, err));
        PS_TRY(read_seconds(&e, &o.seconds, err));
        PS_TRY(check_derived(&e, "bytes_per_s", (double)o.bytes / o.seconds, err));
        for (int j = 0; j < db->n_op; j++)
            if (cmp_op(&db->ops[j], &o) == 0) {
                st = ps_jv_fail(&e, err, PS_ERR_INVALID, "%s of %lld bytes is also ops[%d]", name,
                                (long long)o.bytes, j);
                goto out;
            }
        PS_TRY(ps_profile_db_add_op(db, &o, err));
    }
out:
    return st;
}

static ps_status read_name(const ps_jv *obj, const char *key, char out[PS_PROFILE_NAME_MAX],
                           ps_error *err)
{
    ps_jv v;
    const char *s;
    ps_status st = ps_jv_member(obj, key, &v, err);
    if (st == PS_OK)
        st = ps_jv_string(&v, &s, err);
    if (st != PS_OK)
        return st;
    size_t len = strlen(s);
    if (len == 0 || len >= PS_PROFILE_NAME_MAX)
        return ps_jv_fail(&v, err, PS_ERR_INVALID,
                          "a name must have 1 to %d characters (found %zu)",
                          PS_PROFILE_NAME_MAX - 1, len);
    memcpy(out, s, len + 1);
    return PS_OK;
}

static ps_status from_json(const ps_jv *root, ps_profile_db **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_profile_db *db = NULL;
    ps_jv v;
    int64_t version, devices;
    int backend;
    char device[PS_PROFILE_NAME_MAX];
    *out = NULL;
    PS_TRY(ps_jv_object(root, err));
    PS_TRY(ps_jv_expect_format(root, NULL, "a profile DB", err));
    PS_TRY(ps_jv_check_keys(root, top_keys, err));
    PS_TRY(ps_jv_member(root, "version", &v, err));
    PS_TRY(ps_jv_int(&v, INT64_MIN, INT64_MAX, &version, err));
    if (version != PS_PROFILE_DB_VERSION) {
        st = ps_jv_fail(&v, err, PS_ERR_UNSUPPORTED,
                        "profile DB version %lld is not supported (this pipeshard reads "
                        "version %d)",
                        (long long)version, PS_PROFILE_DB_VERSION);
        goto out;
    }
    PS_TRY(read_name(root, "device", device, err));
    PS_TRY(ps_jv_member(root, "backend", &v, err));
    PS_TRY(ps_jv_enum(&v, ps_profile_backend_names, 2, &backend, err));
    PS_TRY(ps_jv_opt_int(root, "devices", 1, 1, MAX_GROUP, &devices, err));
    PS_TRY(ps_profile_db_create(device, ps_profile_backend_names[backend], (int)devices, &db, err));
    if (ps_jv_has(root, "devices_at_once")) {
        int64_t at_once = 1;
        PS_TRY(ps_jv_opt_int(root, "devices_at_once", 1, 1, devices, &at_once, err));
        db->devices_at_once = (int)at_once;
    }
    if (ps_jv_has(root, "gemm")) {
        PS_TRY(ps_jv_member(root, "gemm", &v, err));
        PS_TRY(read_gemm(db, &v, err));
    }
    if (ps_jv_has(root, "collectives")) {
        PS_TRY(ps_jv_member(root, "collectives", &v, err));
        PS_TRY(read_comm(db, &v, err));
    }
    if (ps_jv_has(root, "ops")) {
        PS_TRY(ps_jv_member(root, "ops", &v, err));
        PS_TRY(read_ops(db, &v, err));
    }
    if (db->n_gemm == 0 && db->n_comm == 0 && db->n_op == 0) {
        st = ps_jv_fail(root, err, PS_ERR_INVALID,
                        "the profile DB holds no measurements (\"gemm\", \"collectives\" and "
                        "\"ops\" are empty or missing)");
        goto out;
    }
    PS_TRY(ps_profile_db_finish(db, err));
    *out = db;
    db = NULL;
out:
    ps_profile_db_free(db);
    return st;
}

ps_status ps_profile_db_load(const char *path, ps_profile_db **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_json_doc *doc = NULL;
    *out = NULL;
    PS_TRY(ps_json_doc_load(path, &doc, err));
    ps_jv root = ps_json_doc_root(doc);
    PS_TRY(from_json(&root, out, err));
out:
    ps_json_doc_free(doc);
    return st;
}

ps_status ps_profile_db_parse(const char *name, const char *text, ps_profile_db **out,
                              ps_error *err)
{
    ps_status st = PS_OK;
    ps_json_doc *doc = NULL;
    *out = NULL;
    PS_TRY(ps_json_doc_parse(name, text, &doc, err));
    ps_jv root = ps_json_doc_root(doc);
    PS_TRY(from_json(&root, out, err));
out:
    ps_json_doc_free(doc);
    return st;
}

/* ---- writing JSON ------------------------------------------------------ */

ps_status ps_profile_db_to_json(const ps_profile_db *db, json_t **out)
{
    ps_status st = PS_OK;
    json_t *root = NULL, *gemm = NULL, *comm = NULL, *ops = NULL;
    *out = NULL;
    if (db == NULL || !db->finished)
        return PS_ERR_INVALID;
    root = json_object();
    gemm = json_array();
    comm = json_array();
    ops = json_array();
    PS_TRY_ALLOC(root, NULL);
    PS_TRY_ALLOC(gemm, NULL);
    PS_TRY_ALLOC(comm, NULL);
    PS_TRY_ALLOC(ops, NULL);
    PS_TRY(ps_json_set(root, "version", json_integer(PS_PROFILE_DB_VERSION)));
    PS_TRY(ps_json_set(root, "device", json_string(db->device)));
    PS_TRY(ps_json_set(root, "backend", json_string(db->backend)));
    PS_TRY(ps_json_set(root, "devices", json_integer(db->devices)));
    if (db->devices_at_once > 1) /* absent: 1, so older DBs read and digest the same */
        PS_TRY(ps_json_set(root, "devices_at_once", json_integer(db->devices_at_once)));
    for (int i = 0; i < db->n_gemm; i++) {
        const ps_profile_gemm *g = &db->gemm[i];
        json_t *e = json_pack("{s:I, s:I, s:I, s:s, s:f, s:f}", "m", (json_int_t)g->m, "n",
                              (json_int_t)g->n, "k", (json_int_t)g->k, "dtype",
                              ps_dtype_name(g->dtype), "seconds", g->seconds, "flops_per_s",
                              ps_profile_gemm_flops(g) / g->seconds);
        if (e != NULL && g->batch > 1 && ps_json_set(e, "batch", json_integer(g->batch)) != PS_OK) {
            json_decref(e);
            e = NULL;
        }
        /* absent for a MATMUL, so that older DBs read and digest the same */
        if (e != NULL && g->op != PS_OP_MATMUL &&
            ps_json_set(e, "op", json_string(ps_op_kind_get(g->op)->name)) != PS_OK) {
            json_decref(e);
            e = NULL;
        }
        PS_TRY(ps_json_append(gemm, e));
    }
    for (int i = 0; i < db->n_comm; i++) {
        const ps_profile_comm_entry *c = &db->comm[i];
        double algbw = (double)c->bytes / c->seconds;
        PS_TRY(ps_json_append(comm, json_pack("{s:s, s:i, s:I, s:f, s:f, s:f}", "kind",
                                              ps_profile_comm_names[c->kind], "n", c->n, "bytes",
                                              (json_int_t)c->bytes, "seconds", c->seconds,
                                              "algbw_bytes_per_s", algbw, "busbw_bytes_per_s",
                                              algbw * ps_profile_busbw_factor(c->kind, c->n))));
    }
    for (int i = 0; i < db->n_op; i++) {
        const ps_profile_op *o = &db->ops[i];
        PS_TRY(ps_json_append(ops, json_pack("{s:s, s:I, s:f, s:f}", "op",
                                             ps_op_kind_get(o->op)->name, "bytes",
                                             (json_int_t)o->bytes, "seconds", o->seconds,
                                             "bytes_per_s", (double)o->bytes / o->seconds)));
    }
    PS_TRY(ps_json_set(root, "gemm", gemm));
    gemm = NULL;
    PS_TRY(ps_json_set(root, "collectives", comm));
    comm = NULL;
    if (db->n_op > 0) { /* a DB without op entries keeps its earlier form */
        PS_TRY(ps_json_set(root, "ops", ops));
        ops = NULL;
    }
    *out = root;
    root = NULL;
out:
    json_decref(root);
    json_decref(gemm);
    json_decref(comm);
    json_decref(ops);
    return st;
}

ps_status ps_profile_db_save(const ps_profile_db *db, const char *path, ps_error *err)
{
    json_t *root = NULL;
    ps_status st = ps_profile_db_to_json(db, &root);
    if (st != PS_OK)
        return ps_error_set(err, st, "%s: cannot write the profile DB: %s", path,
                            db != NULL && !db->finished ? "it is not finished" : ps_status_str(st));
    st = ps_json_save(root, path, err);
    json_decref(root);
    return st;
}

bool ps_profile_db_equal(const ps_profile_db *a, const ps_profile_db *b)
{
    if (strcmp(a->device, b->device) != 0 || strcmp(a->backend, b->backend) != 0 ||
        a->devices != b->devices || a->devices_at_once != b->devices_at_once ||
        a->n_gemm != b->n_gemm || a->n_comm != b->n_comm ||
        a->n_op != b->n_op)
        return false;
    for (int i = 0; i < a->n_op; i++)
        if (a->ops[i].op != b->ops[i].op || a->ops[i].bytes != b->ops[i].bytes ||
            a->ops[i].seconds != b->ops[i].seconds)
            return false;
    for (int i = 0; i < a->n_gemm; i++) {
        const ps_profile_gemm *x = &a->gemm[i], *y = &b->gemm[i];
        if (cmp_gemm(x, y) != 0 || x->seconds != y->seconds)
            return false;
    }
    for (int i = 0; i < a->n_comm; i++) {
        const ps_profile_comm_entry *x = &a->comm[i], *y = &b->comm[i];
        if (x->kind != y->kind || x->n != y->n || x->bytes != y->bytes || x->seconds != y->seconds)
            return false;
    }
    return true;
}

ps_status ps_profile_db_digest(const ps_profile_db *db, char *buf, int cap)
{
    json_t *j = NULL;
    ps_status st = ps_profile_db_to_json(db, &j);
    if (st == PS_OK)
        ps_json_digest(j, buf, cap);
    else if (cap > 0)
        buf[0] = '\0';
    json_decref(j);
    return st;
}
