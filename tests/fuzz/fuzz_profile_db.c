/* Fuzz target: profile DB files (core/profile_db.c) and the lookups the
 * cost model makes in them.
 * Properties: a loaded DB saves and loads back equal; every lookup is -1
 * (no entry) or a finite, non-negative time, at any size and GEMM shape; a
 * measured GEMM shape is answered with its own time. */
#include <math.h>

#include "core/profile_db.h"
#include "tests/fuzz/fuzz_common.h"

static void check_time(double s, const char *what, double size)
{
    FUZZ_ASSERT(s == -1 || (isfinite(s) && s >= 0), "%s of size %g: %g s", what, size, s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *text = fuzz_text(data, size);
    ps_error err = {0};
    ps_profile_db *db = NULL, *back = NULL;
    ps_status st = ps_profile_db_parse("input.json", text, &db, &err);
    free(text);
    if (st != PS_OK)
        return 0;
    json_t *j = NULL;
    FUZZ_ASSERT(ps_profile_db_to_json(db, &j) == PS_OK, "a loaded DB did not save");
    char *saved = fuzz_dump(j);
    json_decref(j);
    FUZZ_ASSERT(ps_profile_db_parse("saved.json", saved, &back, &err) == PS_OK,
                "saved, then refused: %s\n%s", err.msg, saved);
    FUZZ_ASSERT(ps_profile_db_equal(db, back), "loaded back different:\n%s", saved);
    /* sizes from below the smallest entry to beyond the largest */
    static const double sizes[] = {1e-3, 1, 1e3, 1e6, 1e9, 1e12, 1e15, 1e18, 1e24};
    static const int groups[] = {2, 3, 8, 1024};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        double x = sizes[i];
        for (int d = 0; d < PS_DTYPE_COUNT; d++) {
            check_time(ps_profile_gemm_s(db, (ps_dtype)d, x), "gemm", x);
            double rate = ps_profile_gemm_flops_per_s(db, (ps_dtype)d, x);
            FUZZ_ASSERT(isfinite(rate) && rate >= 0, "gemm rate at %g FLOPs: %g", x, rate);
        }
        for (int k = 0; k < PS_OP_KIND_COUNT; k++)
            check_time(ps_profile_op_s(db, (ps_op_kind)k, x), "op", x);
        /* shapes from tiny to beyond any entry, thin and batched */
        int64_t e = (int64_t)fmin(x, 1e12) + 1, big = (int64_t)1 << 40;
        const ps_gemm_shape shapes[] = {
            {e, e, e, 1}, {e, e, 64, 32}, {64, e, e, e}, {big, big, big, big}};
        for (size_t q = 0; q < sizeof shapes / sizeof *shapes; q++)
            for (int d = 0; d < PS_DTYPE_COUNT; d++)
                for (int k = 0; k < PS_OP_KIND_COUNT; k++)
                    if (ps_profile_gemm_kind((ps_op_kind)k))
                        check_time(ps_profile_gemm_op_shape_s(db, (ps_op_kind)k, (ps_dtype)d,
                                                              &shapes[q]),
                                   "gemm shape", x);
        for (int k = 0; k < PS_PROFILE_COMM_COUNT; k++)
            for (size_t n = 0; n < sizeof groups / sizeof *groups; n++)
                check_time(ps_profile_collective_s(db, (ps_profile_comm)k, groups[n], x),
                           "collective", x);
    }
    for (int i = 0; i < db->n_gemm; i++) {
        const ps_profile_gemm *g = &db->gemm[i];
        ps_gemm_shape sh = {g->m, g->n, g->k, g->batch};
        FUZZ_ASSERT(ps_profile_gemm_op_shape_s(db, g->op, g->dtype, &sh) == g->seconds,
                    "gemm[%d]: not its own time", i);
    }
    fuzz_accepted();
    free(saved);
    ps_profile_db_free(back);
    ps_profile_db_free(db);
    return 0;
}
