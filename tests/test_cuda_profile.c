/* exec/profile on the CUDA backend: a measurement over two devices (two GPUs,
 * or GPU 0 shared in the backend's test mode), and cuBLAS GEMMs per dtype
 * through a gemm_timer. Entries are positive, a 65536x larger message takes
 * longer, a 512x larger GEMM too, and bf16 tensor cores beat full fp32 on a
 * large GEMM; nothing is compared with a fixed time.
 * Needs a GPU: exits 77 (skipped) when ps_cuda_device_count() is 0. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "exec/cuda/cuda_backend.h"
#include "exec/profile.h"

static const ps_profile_comm_entry *find_comm(const ps_profile_db *db, ps_profile_comm kind, int n,
                                              int64_t bytes)
{
    for (int i = 0; i < db->n_comm; i++)
        if (db->comm[i].kind == kind && db->comm[i].n == n && db->comm[i].bytes == bytes)
            return &db->comm[i];
    return NULL;
}

static void through_the_backend(void **state)
{
    (void)state;
    ps_cuda_backend_options co = ps_cuda_backend_options_default();
    co.share_gpu = ps_cuda_device_count() < 2;
    ps_backend *b = NULL;
    ps_error err = {0};
    if (ps_cuda_backend_create(2, PS_PROFILE_SLOTS, &co, &b, &err) != PS_OK)
        fail_msg("%s", err.msg);
    static const ps_gemm_shape shapes[] = {{256, 256, 256, 1}, {2048, 2048, 2048, 1}};
    ps_profile_options o = ps_profile_options_quick();
    o.shapes = shapes;
    o.n_shapes = 2;
    o.min_bytes = 1024;
    o.max_bytes = 64 << 20;
    o.size_factor = 256;
    o.min_rep_s = 1e-3;
    o.device_name = "test-gpu";
    ps_profile_db *db = NULL;
    if (ps_profile_measure(b, &o, &db, &err) != PS_OK)
        fail_msg("%s", err.msg);
    assert_string_equal(db->backend, "cuda");
    assert_int_equal(db->n_gemm, 2);
    assert_int_equal(db->n_comm, 5 * 3);
    assert_true(db->gemm[0].seconds > 0 && db->gemm[1].seconds > db->gemm[0].seconds);
    printf("# %s GEMM 2048^3 fp32 (backend op): %.1f TFLOP/s\n",
           co.share_gpu ? "shared GPU" : "2 GPUs",
           2.0 * 2048 * 2048 * 2048 / db->gemm[1].seconds / 1e12);
    for (int k = 0; k < PS_PROFILE_COMM_COUNT; k++) {
        const ps_profile_comm_entry *lo = find_comm(db, (ps_profile_comm)k, 2, 1024);
        const ps_profile_comm_entry *hi = find_comm(db, (ps_profile_comm)k, 2, 64 << 20);
        if (lo == NULL || hi == NULL)
            fail_msg("%s: missing sizes", ps_profile_comm_names[k]);
        assert_true(lo->seconds > 0 && isfinite(hi->seconds));
        if (!(hi->seconds > lo->seconds))
            fail_msg("%s: 64 MiB in %g s, 1 KiB in %g s", ps_profile_comm_names[k], hi->seconds,
                     lo->seconds);
        printf("# %-14s 1 KiB %8.2f us, 64 MiB %8.2f us, busbw %.1f GB/s\n",
               ps_profile_comm_names[k], lo->seconds * 1e6, hi->seconds * 1e6,
               (double)hi->bytes / hi->seconds * ps_profile_busbw_factor((ps_profile_comm)k, 2) /
                   1e9);
    }
    ps_profile_db_free(db);
    b->ops->destroy(b);
}

static ps_status cublas_timer(void *arg, const ps_gemm_shape *sh, ps_dtype dtype, int reps,
                              double *seconds, ps_error *err)
{
    (void)arg;
    return ps_cuda_profile_gemm_batched(0, sh->batch > 1 ? (int)sh->batch : 1, (int)sh->m,
                                        (int)sh->n, (int)sh->k, dtype, 0, reps, seconds, err);
}

/* A DB of the given GEMMs timed by cuBLAS on GPU 0 (--native-gemm), no
 * communication. */
static ps_profile_db *native_db(const ps_gemm_shape *shapes, int n_shapes, const ps_dtype *dtypes,
                                int n_dtypes)
{
    ps_cuda_backend_options co = ps_cuda_backend_options_default();
    ps_backend *b = NULL;
    ps_error err = {0};
    if (ps_cuda_backend_create(1, PS_PROFILE_SLOTS, &co, &b, &err) != PS_OK)
        fail_msg("%s", err.msg);
    ps_profile_options o = ps_profile_options_quick();
    o.shapes = shapes;
    o.n_shapes = n_shapes;
    o.dtypes = dtypes;
    o.n_dtypes = n_dtypes;
    o.max_bytes = 0;
    o.gemm_timer = cublas_timer;
    ps_profile_db *db = NULL;
    if (ps_profile_measure(b, &o, &db, &err) != PS_OK)
        fail_msg("%s", err.msg);
    b->ops->destroy(b);
    assert_int_equal(db->n_gemm, n_shapes * n_dtypes);
    assert_int_equal(db->n_comm, 0);
    return db;
}

static void native_dtypes(void **state)
{
    (void)state;
    static const ps_gemm_shape shapes[] = {{4096, 4096, 4096, 1}};
    static const ps_dtype dtypes[] = {PS_DTYPE_F32, PS_DTYPE_BF16, PS_DTYPE_F16};
    ps_profile_db *db = native_db(shapes, 1, dtypes, 3);
    double f = 2.0 * 4096 * 4096 * 4096;
    double fp32 = ps_profile_gemm_flops_per_s(db, PS_DTYPE_F32, f);
    double bf16 = ps_profile_gemm_flops_per_s(db, PS_DTYPE_BF16, f);
    double fp16 = ps_profile_gemm_flops_per_s(db, PS_DTYPE_F16, f);
    printf("# cuBLAS 4096^3: fp32 %.1f, bf16 %.1f, fp16 %.1f TFLOP/s\n", fp32 / 1e12, bf16 / 1e12,
           fp16 / 1e12);
    assert_true(fp32 > 0 && bf16 > fp32 && fp16 > fp32);
    ps_profile_db_free(db);
}

/* Batched shapes through cuBLAS's strided batched GEMM: 64 heads of
 * attention's per-head product take longer than one, and a bad batch is
 * refused. */
static void native_batched(void **state)
{
    (void)state;
    static const ps_gemm_shape shapes[] = {{1024, 1024, 64, 1}, {1024, 1024, 64, 64}};
    static const ps_dtype dtypes[] = {PS_DTYPE_BF16};
    ps_profile_db *db = native_db(shapes, 2, dtypes, 1);
    assert_int_equal(db->gemm[1].batch, 64); /* sorted by FLOPs */
    printf("# cuBLAS bf16 1024 x 1024 by 64: one %.2f us, 64 heads %.2f us\n",
           db->gemm[0].seconds * 1e6, db->gemm[1].seconds * 1e6);
    assert_true(db->gemm[1].seconds > db->gemm[0].seconds);
    ps_profile_db_free(db);
    double sec = 0;
    ps_error err = {0};
    assert_int_equal(ps_cuda_profile_gemm_batched(0, 0, 64, 64, 64, PS_DTYPE_F32, 0, 1, &sec, &err),
                     PS_ERR_INVALID);
}

int main(void)
{
    if (ps_cuda_device_count() == 0) {
        printf("no usable GPU: the CUDA profile tests are skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(through_the_backend),
        cmocka_unit_test(native_dtypes),
        cmocka_unit_test(native_batched),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
