/* pipeshard exec: run a plan's per-device programs for real, on the CPU
 * reference backend (threads as devices) or on GPUs, and optionally check
 * the result against the unsharded single-device step. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/json.h"
#include "core/log.h"
#include "core/program.h"
#include "exec/check.h"
#include "exec/cpu/cpu_backend.h"
#include "exec/hosts.h"
#ifdef PS_HAVE_CUDA
#include "exec/cuda/cuda_backend.h"
#endif
#include "exec/half.h"
#include "exec/memory_need.h"
#include "exec/runtime.h"
#include "planner/lower.h"
#include "planner/plan_intra.h"
#include "planner/plan_model.h"
#include "traces/plan_summary.h"

static void help(void)
{
    printf("usage: pipeshard exec --plan PLAN.json --backend cpu|cuda [--steps N] [--warmup W]\n"
           "                      [--seed S] [--check | --check-fp32] [--tolerance T]\n"
           "                      [--param-atol A]\n"
           "                      [--trace T.json [--trace-ops]]\n"
           "                      [--summary S.json] [--no-local-allgather] [--share-gpu]\n"
           "                      [--tf32] [--fp32] [--no-memory-check] [--json]\n\n"
           "Lowers the plan to per-device programs and runs training steps of them: on the\n"
           "CPU backend every device is a thread with real numerics (fp32 arithmetic; fp16\n"
           "and bf16 tensors held in 2 bytes, rounded after every op); on the CUDA backend\n"
           "every device is a GPU (fp16/bf16 tensors also in 2 bytes; their GEMMs on cuBLAS's\n"
           "half inputs when no operand needs a transpose kernel first). Prints the\n"
           "measured iteration, per-stage times and memory beside the planner's prediction;\n"
           "the summary (each time the median over the steps) and the timeline (the last\n"
           "step) use the formats of `pipeshard sim` (docs/trace-format.md).\n\n"
           "Several hosts: start one process per node of the plan's cluster with an MPI\n"
           "launcher (mpirun -np NODES pipeshard exec ...); each runs its node's devices, rank 0\n"
           "prints and writes the results. Both backends run across hosts; the CUDA backend's\n"
           "processes each take their node's GPUs (with --share-gpu, GPU 0).\n\n"
           "options:\n"
           "  --plan P.json          the plan (pipeshard plan -o)\n"
           "  --backend cpu|cuda     where to run (default cpu)\n"
           "  --steps N              training steps (default 1), timed; the summary takes\n"
           "                         each time's median over them\n"
           "  --warmup W             steps run first, not timed (default 1): the first step\n"
           "                         touches fresh memory; parameters, optimizer state and\n"
           "                         loss scale then start again from their initial values,\n"
           "                         so the losses and the check do not depend on W\n"
           "  --seed S               parameters and synthetic data (default 1)\n"
           "  --check                also run the unsharded step on one device from the same\n"
           "                         parameters and batch; compare losses and updated\n"
           "                         parameters and gradients (exit 1 on a mismatch); a\n"
           "                         ReLU input within --tolerance of zero that rounds to\n"
           "                         the other side there follows the run, and fp32\n"
           "                         loss and gradients within what one ulp of the parameters\n"
           "                         moves them pass (docs/executors.md)\n"
           "  --check-fp32           as --check, against a step that holds fp16/bf16 tensors\n"
           "                         in fp32: what the dtype loses shows, not only what the\n"
           "                         sharding changes (not with dynamic loss scaling)\n"
           "  --tolerance T          relative tolerance of the loss and gradients (1e-4;\n"
           "                         fp16/bf16 held in half precision: 32 unit roundoffs)\n"
           "  --param-atol A         absolute tolerance of the updated parameters (5e-3;\n"
           "                         half precision: 5e-3 per step, plus 2 unit roundoffs\n"
           "                         of the value)\n"
           "  --trace T.json         Chrome trace of the last step (Perfetto)\n"
           "  --trace-ops            one span per op in the trace (default: one per run of\n"
           "                         a kernel's computations, as `pipeshard sim` writes)\n"
           "  --summary S.json       the run summary\n"
           "  --no-local-allgather   send every receiver its whole tile between stages\n"
           "  --share-gpu            cuda: run every device of the plan on GPU 0 (a test\n"
           "                         mode for checking multi-device plans on one GPU)\n"
           "  --tf32                 cuda: TF32 tensor-core GEMMs (default: exact fp32)\n"
           "  --fp32                 hold fp16/bf16 tensors in fp32 (default: in 2 bytes;\n"
           "                         computed in fp32 either way)\n"
           "  --no-memory-check      run even when the devices' tiles at the peak of a step\n"
           "                         exceed the memory available for them (host memory\n"
           "                         for the CPU backend, each GPU's free memory for CUDA);\n"
           "                         by default such a plan is refused before it starts\n"
           "  --json                 print the summary as JSON instead of a table, with\n"
           "                         each step's loss (\"steps\") and --check's comparison\n"
           "                         (\"check\"); --summary writes the summary alone\n"
           "  -h, --help             this help\n");
}

enum { OPT_PLAN = 256, OPT_BACKEND, OPT_STEPS, OPT_WARMUP, OPT_SEED, OPT_CHECK, OPT_TOL, OPT_ATOL, OPT_TRACE,
       OPT_SUMMARY, OPT_NO_LAG, OPT_JSON, OPT_SHARE_GPU, OPT_TF32,
       OPT_TRACE_OPS, OPT_FP32, OPT_CHECK_FP32, OPT_NO_MEMORY_CHECK };

static const struct option options[] = {
    {"plan", required_argument, NULL, OPT_PLAN},
    {"backend", required_argument, NULL, OPT_BACKEND},
    {"steps", required_argument, NULL, OPT_STEPS},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"seed", required_argument, NULL, OPT_SEED},
    {"check", no_argument, NULL, OPT_CHECK},
    {"check-fp32", no_argument, NULL, OPT_CHECK_FP32},
    {"tolerance", required_argument, NULL, OPT_TOL},
    {"param-atol", required_argument, NULL, OPT_ATOL},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"trace-ops", no_argument, NULL, OPT_TRACE_OPS},
    {"summary", required_argument, NULL, OPT_SUMMARY},
    {"no-local-allgather", no_argument, NULL, OPT_NO_LAG},
    {"json", no_argument, NULL, OPT_JSON},
    {"share-gpu", no_argument, NULL, OPT_SHARE_GPU},
    {"tf32", no_argument, NULL, OPT_TF32},
    {"fp32", no_argument, NULL, OPT_FP32},
    {"no-memory-check", no_argument, NULL, OPT_NO_MEMORY_CHECK},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Test mode PIPESHARD_STRAGGLER=DEVICE:SECONDS: that device starts every
 * timed step late (ps_exec_options.straggler_device). */
static bool parse_straggler(const char *text, int *device, double *seconds)
{
    const char *colon = strchr(text, ':');
    char head[32];
    int64_t d;
    if (colon == NULL || (size_t)(colon - text) >= sizeof head)
        return false;
    memcpy(head, text, (size_t)(colon - text));
    head[colon - text] = '\0';
    if (!ps_cli_parse_int(head, 0, INT32_MAX, &d) ||
        !ps_cli_parse_double(colon + 1, 0, 60, seconds))
        return false;
    *device = (int)d;
    return true;
}

typedef struct backend_choice {
    const char *kind; /* cpu, cuda */
    bool share_gpu, tf32;
    bool fp32;        /* hold fp16/bf16 tensors in fp32 (--fp32, or a reference's) */
    bool fp32_given;  /* --fp32 on the command line: refused for a plan without them */
    bool check_fp32_given; /* --check-fp32: refused for a plan without them, too */
    ps_hosts *hosts;  /* the launch's processes, or NULL */
    int fail_device;  /* test mode: this device fails (PIPESHARD_FAIL_DEVICE), or -1 */
    int64_t host_memory; /* test mode: bytes the CPU backend's memory check allows
                          * (PIPESHARD_HOST_MEMORY), or 0: what the host has */
    bool *stopped_together; /* set where every host agreed to stop (may be NULL) */
} backend_choice;

/* ---- test mode: a backend whose device `fail_device` fails in its first
 * backward op, so that the stop of every device (and host) can be tested
 * from the command line ---- */

static const ps_backend_ops *inject_real;
static ps_backend_ops inject_ops;
static int inject_device = -1;

static ps_status inject_op(ps_backend *b, int device, const ps_op *op, const ps_tile *in,
                           ps_tile *out, const ps_op_context *ctx, ps_error *err)
{
    if (device == inject_device && op->pass == PS_PASS_BACKWARD)
        return ps_error_set(err, PS_ERR_DEVICE, "injected failure (PIPESHARD_FAIL_DEVICE=%d)",
                            device);
    return inject_real->op(b, device, op, in, out, ctx, err);
}

/* A launch of several processes: the first failing device stops them all
 * at once, naming its rank (a peer in another process may wait where no
 * abort of this one reaches it). */
static void stop_every_host(void *arg, ps_status st, const ps_error *err)
{
    ps_hosts *hosts = arg;
    (void)st;
    fprintf(stderr, "pipeshard: exec: rank %d of %d: %s\n", ps_hosts_rank(hosts),
            ps_hosts_count(hosts), err->msg);
    ps_hosts_abort(hosts, 1);
}

static bool has_relu(const ps_graph *g)
{
    for (int i = 0; i < g->n_ops; i++)
        if (g->ops[i].kind == PS_OP_RELU)
            return true;
    return false;
}

/* Lowers, checks and runs a plan on a new backend; *storage (if not NULL):
 * what the run held its floating-point tensors in. */
static ps_status run_plan(const ps_plan *plan, const backend_choice *bc,
                          const ps_lower_options *lo, const ps_exec_options *eo,
                          ps_program_set **set_out, ps_plan_model **model_out,
                          ps_exec_result **out, ps_dtype *storage, ps_error *err)
{
    ps_status st = PS_OK;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_backend *b = NULL;
    int *slots = NULL;
    *out = NULL;
    PS_TRY(ps_cli_in_plan_file(plan, ps_plan_model_build(plan, &m, err), err));
    PS_TRY(ps_cli_in_plan_file(plan, ps_plan_lower(plan, m, lo, &set, err), err));
    if ((bc->fp32_given || bc->check_fp32_given) && !ps_exec_has_half(set->step)) {
        /* options that would change nothing are refused, not ignored */
        st = ps_cli_in_plan_file(
            plan,
            ps_error_set(err, PS_ERR_INVALID,
                         bc->fp32_given
                             ? "--fp32 changes nothing: the plan holds no fp16 or bf16 tensors"
                             : "--check-fp32 is --check here: the plan holds no fp16 or bf16 "
                               "tensors"),
            err);
        goto out;
    }
    PS_TRY(ps_program_set_check(set, NULL, err));
    if (bc->hosts != NULL)
        PS_TRY(ps_hosts_assign(bc->hosts, set->n_devices, plan->cluster->devices_per_node, err));
    slots = malloc((size_t)set->n_devices * sizeof *slots);
    PS_TRY_ALLOC(slots, err);
    for (int d = 0; d < set->n_devices; d++)
        slots[d] = ps_exec_timing_slots(set, d);
    if (strcmp(bc->kind, "cpu") == 0) {
        PS_TRY(ps_cpu_backend_create(set->n_devices, slots, bc->hosts, &b, err));
        if (bc->host_memory > 0)
            ps_cpu_backend_set_host_memory(b, bc->host_memory);
    } else {
#ifdef PS_HAVE_CUDA
        int most = 0;
        for (int d = 0; d < set->n_devices; d++)
            most = slots[d] > most ? slots[d] : most;
        ps_cuda_backend_options co = ps_cuda_backend_options_default();
        co.share_gpu = bc->share_gpu;
        co.allow_tf32 = bc->tf32;
        co.hosts = bc->hosts;
        PS_TRY(ps_cuda_backend_create(set->n_devices, most, &co, &b, err));
#else
        st = ps_error_set(err, PS_ERR_UNSUPPORTED,
                          "backend \"%s\" is not available in this build (built without "
                          "CUDA; have: cpu)",
                          bc->kind);
        goto out;
#endif
    }
    if (bc->fp32)
        b->half_storage = false;
    if (storage != NULL)
        *storage = ps_exec_storage(set->step, b->half_storage);
    if (bc->fail_device >= 0) {
        inject_real = b->ops;
        inject_ops = *b->ops;
        inject_ops.op = inject_op;
        inject_device = bc->fail_device;
        b->ops = &inject_ops;
    }
    ps_exec_options o = *eo;
    o.hosts = bc->hosts;
    if (ps_hosts_count(bc->hosts) > 1) {
        o.on_failure = stop_every_host;
        o.on_failure_arg = bc->hosts;
    }
    if (!o.skip_memory_check) {
        /* here rather than in ps_exec_run: a refusal every host agrees on
         * ends every process in order, each saying why (no abort) */
        st = ps_exec_check_memory(set, b, bc->hosts, err);
        if (st != PS_OK) {
            if (bc->stopped_together != NULL)
                *bc->stopped_together = true;
            goto out;
        }
        o.skip_memory_check = true;
    }
    PS_TRY(ps_exec_run(set, b, &o, out, err));
out:
    if (b != NULL) {
        if (b->ops == &inject_ops)
            b->ops = inject_real;
        b->ops->destroy(b);
    }
    free(slots);
    if (st == PS_OK && set_out != NULL) {
        *set_out = set;
        set = NULL;
    }
    if (st == PS_OK && model_out != NULL) {
        *model_out = m;
        m = NULL;
    }
    ps_program_set_free(set);
    ps_plan_model_free(m);
    return st;
}

/* One run of --check's passes, owned. */
typedef struct check_run {
    ps_plan_model *m;
    ps_program_set *set;
    ps_exec_result *r;
} check_run;

enum {
    CHECK_REF,
    CHECK_RUN_KEPT,
    CHECK_REF_ALIGNED,
    CHECK_REF_UP,   /* from parameters one ulp larger */
    CHECK_REF_DOWN, /* and one ulp smaller */
    CHECK_RUNS
};

/* How far past the larger of rounding's two samples a run may lie: the
 * run's difference is a third draw of the same noise, which two samples
 * bound only two times in three (docs/executors.md, "Two samples"). */
#define ROUNDING_MARGIN 2.0
#define ROUNDING_MARGIN_TEXT "twice"

typedef struct check_outcome {
    ps_exec_comparison cmp;     /* the comparison reported */
    const ps_exec_result *ref;  /* the reference reported */
    bool run_half;              /* the run held fp16/bf16 tensors in 2 bytes */
    bool rounding_pass;         /* noise below was measured */
    /* dynamic loss scaling: the first step the nudged reference skipped and
     * the reference did not, or the other way (0: none); its noise then
     * measures another training run, not rounding, and is not used */
    int noise_skips_differ;
    /* the nudged references against the reference: each metric the larger
     * of the two samples' (the worst gradient the larger one's) */
    ps_exec_comparison noise;
} check_outcome;

/* The passes of --check (docs/executors.md): the reference from the same
 * parameters and batch as the run `r`. Where that comparison fails and the
 * model has ReLUs, the run again keeping its ReLU outputs (not in the timed
 * run: the copies would be timed) and the reference following them where a
 * ReLU input within rounding of zero fell on the other side. Where then the
 * fp32 loss or gradients miss (the parameters within theirs), the reference
 * twice more, from parameters one ulp larger and one smaller: a run within
 * twice the larger sample is as close as the model's own rounding allows.
 * One process only for the second and third. */
static ps_status check_passes(const ps_plan *plan, const ps_plan *ref_plan,
                              const backend_choice *bc, const ps_lower_options *lo,
                              const ps_exec_options *eo, const ps_exec_options *ro,
                              const ps_program_set *set, const ps_exec_result *r,
                              ps_dtype storage, bool check_fp32, bool one_process,
                              const ps_exec_tolerance *t, check_run *runs, check_outcome *out,
                              ps_error *err)
{
    /* the reference holds what the run held, so both round alike (fp32
     * parameters with half Adam state included), or (--check-fp32) fp32, so
     * that what the half dtype loses shows */
    bool run_half = !bc->fp32 && ps_exec_has_half(set->step);
    backend_choice cpu = {.kind = "cpu",
                          .fp32 = check_fp32 || !run_half,
                          .fail_device = -1,
                          .host_memory = bc->host_memory};
    check_run *ref = &runs[CHECK_REF], *kept = &runs[CHECK_RUN_KEPT],
              *aligned = &runs[CHECK_REF_ALIGNED];
    memset(out, 0, sizeof *out);
    out->run_half = run_half;
    ps_status st = run_plan(ref_plan, &cpu, lo, ro, &ref->set, &ref->m, &ref->r, NULL, err);
    if (st == PS_ERR_NOMEM && !ro->skip_memory_check) { /* the whole model on one device */
        char msg[PS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return ps_error_set(err, st, "--check's single-device reference: %s", msg);
    }
    PS_TRY_RET(st);
    ps_exec_compare(set->step, r, ref->set->step, ref->r, t, &out->cmp);
    out->ref = ref->r;
    /* not where the run held half precision (--check-fp32 included: its
     * reference is fp32, the run's ReLUs were not): at half precision's
     * tolerance the rule would move outputs wholesale, not a few at zero */
    if (!out->cmp.ok && one_process && has_relu(set->step) && storage == PS_DTYPE_F32) {
        ps_exec_options eo2 = *eo, ro2 = *ro;
        eo2.trace_path = NULL;
        eo2.warmup_steps = 0;
        eo2.keep_relus = true;
        PS_TRY_RET(run_plan(plan, bc, lo, &eo2, &kept->set, &kept->m, &kept->r, NULL, err));
        ro2.align_relus = kept->r;
        ro2.align_graph = kept->set->step;
        ro2.align_tol = t->rel;
        ro2.keep_relus = true; /* for the nudged reference */
        PS_TRY_RET(run_plan(ref_plan, &cpu, lo, &ro2, &aligned->set, &aligned->m, &aligned->r,
                            NULL, err));
        if (aligned->r->relu_flips > 0) {
            ps_exec_compare(kept->set->step, kept->r, aligned->set->step, aligned->r, t,
                            &out->cmp);
            out->ref = aligned->r;
        }
    }
    /* the reference holds what the run held (not --check-fp32's fp32 against
     * a half run: what half precision loses is what that check shows) */
    out->rounding_pass = !out->cmp.ok && one_process &&
                         (!run_half || !check_fp32) &&
                         out->cmp.param_excess <= 1;
    if (!out->rounding_pass)
        return PS_OK;
    const check_run *base = aligned->r != NULL ? aligned : ref;
    static const ps_exec_nudge ways[2] = {PS_NUDGE_UP, PS_NUDGE_DOWN};
    for (int w = 0; w < 2; w++) {
        check_run *nudged = &runs[CHECK_REF_UP + w];
        ps_exec_options ro3 = *ro;
        ro3.nudge_params = ways[w];
        if (aligned->r != NULL) { /* its ReLUs at zero follow the reference's */
            ro3.align_relus = aligned->r;
            ro3.align_graph = aligned->set->step;
            ro3.align_tol = t->rel;
        }
        PS_TRY_RET(run_plan(ref_plan, &cpu, lo, &ro3, &nudged->set, &nudged->m, &nudged->r,
                            NULL, err));
        for (int s = 0; s < base->r->steps && set->loss_scale_window > 0; s++)
            if (nudged->r->skipped[s] != base->r->skipped[s]) {
                out->noise_skips_differ = s + 1;
                return PS_OK;
            }
        ps_exec_comparison sample;
        ps_exec_compare(nudged->set->step, nudged->r, base->set->step, base->r, t, &sample);
        /* compared: its result is not needed again (a whole model's worth) */
        ps_exec_result_free(nudged->r);
        nudged->r = NULL;
        PS_LOG_DEBUG("--check: from parameters one ulp %s, the reference's loss moves by "
                     "%.3g, its gradients by %.3g (worst %s)",
                     w == 0 ? "larger" : "smaller", sample.loss_rel, sample.grad_rel,
                     sample.grad_worst);
        double loss_rel = w == 0 ? sample.loss_rel : fmax(out->noise.loss_rel, sample.loss_rel);
        if (w == 0 || sample.grad_rel > out->noise.grad_rel)
            out->noise = sample;
        out->noise.loss_rel = loss_rel;
    }
    if (out->cmp.loss_rel <= fmax(t->rel, ROUNDING_MARGIN * out->noise.loss_rel) &&
        out->cmp.grad_rel <= fmax(t->rel, ROUNDING_MARGIN * out->noise.grad_rel))
        out->cmp.ok = true;
    return PS_OK;
}

int ps_cmd_exec(int argc, char **argv)
{
    const char *plan_path = NULL, *summary_path = NULL, *backend = "cpu";
    bool check = false, check_fp32 = false, json = false, share_gpu = false, tf32 = false;
    double tol = -1, param_atol = -1; /* -1: the storage's defaults */
    bool fp32 = false;
    ps_exec_options eo = ps_exec_options_default();
    eo.warmup_steps = 1;
    ps_lower_options lo = ps_lower_options_default();
    int64_t v;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (c) {
        case 'h': help(); return 0;
        case OPT_PLAN: plan_path = optarg; break;
        case OPT_BACKEND: backend = optarg; break;
        case OPT_STEPS:
            if (!ps_cli_parse_int(optarg, 1, 1000000, &v))
                return ps_cli_usage_error("exec",
                                          "--steps needs a count from 1 to 1000000, not \"%s\"",
                                          optarg);
            eo.steps = (int)v;
            break;
        case OPT_WARMUP:
            if (!ps_cli_parse_int(optarg, 0, 1000000, &v))
                return ps_cli_usage_error("exec",
                                          "--warmup needs a count from 0 to 1000000, not \"%s\"",
                                          optarg);
            eo.warmup_steps = (int)v;
            break;
        case OPT_SEED:
            if (!ps_cli_parse_int(optarg, 0, INT64_MAX, &v))
                return ps_cli_usage_error("exec", "--seed needs an integer >= 0, not \"%s\"",
                                          optarg);
            eo.seed = (uint64_t)v;
            break;
        case OPT_CHECK:
        case OPT_CHECK_FP32:
            if (check && check_fp32 != (c == OPT_CHECK_FP32))
                return ps_cli_usage_error("exec", "give one of --check and --check-fp32 (the "
                                                  "second holds the reference in fp32)");
            check = true;
            check_fp32 = c == OPT_CHECK_FP32;
            break;
        case OPT_TOL:
            if (!ps_cli_parse_double(optarg, 0, 1, &tol))
                return ps_cli_usage_error("exec", "--tolerance needs a number in [0, 1], not "
                                          "\"%s\"", optarg);
            break;
        case OPT_ATOL:
            if (!ps_cli_parse_double(optarg, 0, 1e9, &param_atol))
                return ps_cli_usage_error("exec", "--param-atol needs a number >= 0, not \"%s\"",
                                          optarg);
            break;
        case OPT_TRACE: eo.trace_path = optarg; break;
        case OPT_TRACE_OPS: eo.trace_ops = true; break;
        case OPT_SUMMARY: summary_path = optarg; break;
        case OPT_NO_LAG: lo.local_allgather = false; break;
        case OPT_JSON: json = true; break;
        case OPT_SHARE_GPU: share_gpu = true; break;
        case OPT_TF32: tf32 = true; break;
        case OPT_FP32: fp32 = true; break;
        case OPT_NO_MEMORY_CHECK: eo.skip_memory_check = true; break;
        default:
            return ps_cli_usage_error("exec", "unknown or incomplete option \"%s\"",
                                      argv[optind - 1]);
        }
    }
    if (optind < argc)
        return ps_cli_usage_error("exec", "unexpected argument \"%s\"", argv[optind]);
    if (plan_path == NULL)
        return ps_cli_usage_error("exec", "--plan PLAN.json is required");
    if (strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0)
        return ps_cli_usage_error("exec", "--backend is cpu or cuda, not \"%s\"", backend);
    /* options that would change nothing are refused, not ignored */
    if ((share_gpu || tf32) && strcmp(backend, "cuda") != 0)
        return ps_cli_usage_error("exec", "%s applies to --backend cuda",
                                  share_gpu ? "--share-gpu" : "--tf32");
    if (eo.trace_ops && eo.trace_path == NULL)
        return ps_cli_usage_error("exec", "--trace-ops needs --trace T.json");
    if ((tol >= 0 || param_atol >= 0) && !check)
        return ps_cli_usage_error("exec", "%s applies to --check",
                                  tol >= 0 ? "--tolerance" : "--param-atol");
    const ps_cli_path outs[] = {{"--trace", eo.trace_path}, {"--summary", summary_path}};
    FILE *report = stdout;
    int checked = ps_cli_check_run_outputs("exec", plan_path, json, outs, 2, &report);
    if (checked != 0)
        return checked;
    ps_status st = PS_OK;
    ps_error err = {0};
    ps_plan *plan = NULL, *ref_plan = NULL;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_exec_result *r = NULL;
    ps_summary *pred = NULL; /* the planner's, for the report */
    check_run runs[CHECK_RUNS];
    memset(runs, 0, sizeof runs);
    bool mismatch = false;
    json_t *check_json = NULL; /* --json with --check: the comparison */
    ps_hosts *hosts = NULL;
    int rank = 0;
    bool stopped_together = false; /* every host refused the run at once */
    char source[16];
    snprintf(source, sizeof source, "exec-%s", backend);
    eo.source = source;
    eo.keep_params = check;
    PS_TRY(ps_hosts_init(&hosts, &err));
    rank = ps_hosts_rank(hosts);
    PS_TRY(ps_plan_load(plan_path, &plan, &err));
    if (check_fp32 && !fp32 &&
        json_is_true(json_object_get(plan->training, "dynamic_loss_scale"))) {
        /* held in fp32 the reference overflows elsewhere: other steps skipped */
        st = ps_error_set(&err, PS_ERR_INVALID,
                          "--check-fp32: %s scales its loss dynamically, and a step held in "
                          "fp32 skips other steps; use --check",
                          plan_path);
        goto out;
    }
    eo.devices_per_node = plan->cluster->devices_per_node;
    backend_choice bc = {.kind = backend, .share_gpu = share_gpu, .tf32 = tf32, .fp32 = fp32,
                         .fp32_given = fp32, .check_fp32_given = check_fp32,
                         .hosts = hosts, .fail_device = -1,
                         .stopped_together = &stopped_together};
    ps_dtype storage = PS_DTYPE_F32;
    const char *fail_env = getenv("PIPESHARD_FAIL_DEVICE");
    if (fail_env != NULL && !ps_cli_parse_int(fail_env, 0, INT32_MAX, &v)) {
        st = ps_error_set(&err, PS_ERR_INVALID,
                          "PIPESHARD_FAIL_DEVICE needs a device number, not \"%s\"", fail_env);
        goto out;
    }
    if (fail_env != NULL)
        bc.fail_device = (int)v;
    const char *straggler_env = getenv("PIPESHARD_STRAGGLER");
    if (straggler_env != NULL &&
        !parse_straggler(straggler_env, &eo.straggler_device, &eo.straggler_s)) {
        st = ps_error_set(&err, PS_ERR_INVALID,
                          "PIPESHARD_STRAGGLER needs DEVICE:SECONDS (up to 60 s), not \"%s\"",
                          straggler_env);
        goto out;
    }
    const char *memory_env = getenv("PIPESHARD_HOST_MEMORY");
    if (memory_env != NULL && !ps_cli_parse_int(memory_env, 1, INT64_MAX, &v)) {
        st = ps_error_set(&err, PS_ERR_INVALID,
                          "PIPESHARD_HOST_MEMORY needs a count of bytes, not \"%s\"",
                          memory_env);
        goto out;
    }
    if (memory_env != NULL)
        bc.host_memory = v;
    PS_TRY(run_plan(plan, &bc, &lo, &eo, &set, &m, &r, &storage, &err));
    if (rank != 0) /* rank 0 prints, writes and checks */
        goto out;
    if (summary_path != NULL)
        PS_TRY(ps_summary_save(r->summary, summary_path, &err));
    if (!json) {
        ps_summary_print(r->summary, report);
        fprintf(report, "\nplanner       iteration %.4g s; measured / predicted = %.3f\n",
                plan->iteration_s,
                plan->iteration_s > 0 ? r->summary->iteration_s / plan->iteration_s : 0);
        /* per stage, the planner's schedule (predict's summary): on shared
         * cores the plan's stage times are the stage DP's bound */
        PS_TRY(ps_cli_planner_summary(plan, m, set, NULL, 0, &pred, &err));
        for (int k = 0; k < pred->n_stages && k < r->summary->n_stages; k++)
            fprintf(report, "  stage %d: measured %.4g ms, predicted %.4g ms per micro-batch\n", k,
                    r->summary->stages[k].time_s * 1e3, pred->stages[k].time_s * 1e3);
        int skipped = 0;
        for (int s = 0; s < r->steps; s++)
            skipped += set->loss_scale_window > 0 && r->skipped[s];
        if (skipped > 0)
            fprintf(report,
                    "  (%d of %d steps skipped by the loss scaling: no optimizer ran in them)\n",
                    skipped, r->steps);
        for (int s = 0; s < r->steps; s++) {
            fprintf(report, "step %d: loss %.9g", s + 1, r->loss[s]);
            if (set->loss_scale_window > 0)
                fprintf(report, " at loss scale %g%s", r->loss_scale[s],
                        r->skipped[s] ? ": a gradient overflowed, update skipped" : "");
            if (r->step_s[s] > 0) /* the kept steps: the last PS_EXEC_TIMES_KEPT */
                fprintf(report, " (%.4g ms)", r->step_s[s] * 1e3);
            fprintf(report, "\n");
        }
        int nh = ps_hosts_count(hosts);
        fprintf(report, "run           %.3g s wall, %d step%s on the %s backend", r->wall_s,
                r->steps, r->steps == 1 ? "" : "s", backend);
        if (nh > 1)
            fprintf(report, ", %d hosts (MPI)", nh);
        fprintf(report, "\n");
    }
    if (check) {
        ps_exec_options ro = eo;
        ro.trace_path = NULL;
        ro.warmup_steps = 0; /* not timed */
        ro.source = "exec-cpu";
        ro.devices_per_node = 1;
        PS_TRY(ps_plan_reference(plan, m, &ref_plan, &err));
        ps_exec_tolerance t = ps_exec_tolerance_default(storage, eo.steps);
        if (tol >= 0)
            t.rel = tol;
        if (param_atol >= 0)
            t.param_abs = param_atol;
        check_outcome co;
        PS_TRY(check_passes(plan, ref_plan, &bc, &lo, &eo, &ro, set, r, storage, check_fp32,
                            ps_hosts_count(hosts) == 1, &t, runs, &co, &err));
        const ps_exec_comparison cmp = co.cmp;
        const ps_exec_result *ref = co.ref;
        mismatch = !cmp.ok;
        FILE *f = json ? stderr : report;
        char ptol[64], scaled[48] = "";
        if (t.param_rel > 0)
            snprintf(ptol, sizeof ptol, "%.3g + %.3g |ref|", t.param_abs, t.param_rel);
        else
            snprintf(ptol, sizeof ptol, "%.3g", t.param_abs);
        if (m->train.dynamic_loss_scale)
            snprintf(scaled, sizeof scaled, ", dynamic loss scale from %g", m->train.loss_scale);
        else if (m->train.loss_scale != 1)
            snprintf(scaled, sizeof scaled, ", loss scale %g", m->train.loss_scale);
        /* dynamic scaling: both must have skipped the same steps */
        int skips = 0, ref_skips = 0, first_differ = 0;
        for (int s = 0; s < r->steps && set->loss_scale_window > 0; s++) {
            skips += r->skipped[s];
            ref_skips += ref->skipped[s];
            if (r->skipped[s] != ref->skipped[s] && first_differ == 0)
                first_differ = s + 1;
        }
        /* fp32 parameters with Adam's state in half precision */
        char state[64] = "";
        bool half_state =
            storage == PS_DTYPE_F32 && co.run_half && ps_half_dtype(m->train.optimizer_dtype);
        if (half_state)
            snprintf(state, sizeof state, ", Adam's state in %s",
                     ps_dtype_name(m->train.optimizer_dtype));
        fprintf(f,
                "check         against the single-device step (loss %.9g), %d parameters,\n"
                "              floating-point tensors held in %s%s%s%s:\n"
                "  loss        rel. diff %.3g (tolerance %.3g)\n"
                "  gradients   rel. diff %.3g, worst %s (tolerance %.3g)\n"
                "  parameters  abs. diff %.3g, worst %s (tolerance %s)\n",
                ref->loss[r->steps - 1], cmp.params, ps_dtype_name(storage), state,
                check_fp32 && (storage != PS_DTYPE_F32 || half_state) ? " (the reference in fp32)"
                                                                      : "",
                scaled,
                cmp.loss_rel, t.rel, cmp.grad_rel, cmp.grad_worst[0] ? cmp.grad_worst : "-",
                t.rel, cmp.param_abs, cmp.param_worst[0] ? cmp.param_worst : "-", ptol);
        if (ref->relu_flips > 0)
            fprintf(f,
                    "  relu        %lld output%s of the reference across zero from the run's "
                    "(within %.3g of the\n"
                    "              largest) took the run's value; first %s\n",
                    (long long)ref->relu_flips, ref->relu_flips == 1 ? "" : "s", t.rel,
                    ref->relu_first);
        if (co.rounding_pass && co.noise_skips_differ > 0)
            fprintf(f,
                    "  rounding    from parameters one ulp off the reference's loss scaling "
                    "skips other\n"
                    "              steps (first at step %d): no measure of rounding alone\n",
                    co.noise_skips_differ);
        else if (co.rounding_pass)
            fprintf(f,
                    "  rounding    from parameters one ulp larger or smaller the reference's "
                    "loss moves by up\n"
                    "              to %.3g, its gradients by up to %.3g (worst %s): the run is "
                    "%s\n",
                    co.noise.loss_rel, co.noise.grad_rel, co.noise.grad_worst,
                    cmp.ok ? "within " ROUNDING_MARGIN_TEXT " what rounding alone does"
                           : "beyond " ROUNDING_MARGIN_TEXT " what rounding alone does");
        if (set->loss_scale_window > 0)
            fprintf(f, "  loss scale  %d of %d steps skipped, the reference %d%s%.0d\n", skips,
                    r->steps, ref_skips, first_differ ? ": they first differ at step " : "",
                    first_differ);
        mismatch = mismatch || first_differ;
        fprintf(f, "  %s\n", mismatch ? "MISMATCH" : "ok");
        if (mismatch && storage == PS_DTYPE_F16 && m->train.loss_scale == 1)
            fprintf(f, "  (fp16 without loss scaling: gradients under 2^-14 lose bits to "
                       "underflow in the backward pass; plan with --loss-scale, e.g. 1024, or "
                       "use bf16, which keeps fp32's range)\n");
        else if (!check_fp32 && storage != PS_DTYPE_F32)
            fprintf(f, "  (the reference rounds to %s as this run does, so what both lose "
                       "cancels; --check-fp32 shows what %s loses)\n",
                    ps_dtype_name(storage), ps_dtype_name(storage));
        if (json) {
            check_json = json_pack("{s:b, s:f, s:f, s:s, s:f, s:s, s:f, s:f, s:f, s:i}", "ok",
                                   !mismatch, "loss_rel", cmp.loss_rel, "grad_rel",
                                   cmp.grad_rel, "grad_worst", cmp.grad_worst, "param_abs",
                                   cmp.param_abs, "param_worst", cmp.param_worst,
                                   "tolerance_rel", t.rel, "param_atol", t.param_abs,
                                   "reference_loss", ref->loss[r->steps - 1], "parameters",
                                   cmp.params);
            if (check_json == NULL) {
                st = ps_error_set(&err, PS_ERR_NOMEM, "out of memory");
                goto out;
            }
            if (co.rounding_pass && co.noise_skips_differ == 0)
                PS_TRY(ps_json_set(check_json, "rounding",
                                   json_pack("{s:f, s:f, s:f}", "loss_rel",
                                             co.noise.loss_rel, "grad_rel", co.noise.grad_rel,
                                             "margin", ROUNDING_MARGIN)));
            if (ref->relu_flips > 0)
                PS_TRY(ps_json_set(check_json, "relu_aligned",
                                   json_integer(ref->relu_flips)));
        }
    }
    if (json) {
        /* the summary's keys, then each step's loss and the check: --summary
         * writes the summary alone */
        json_t *j = NULL, *steps = json_array();
        PS_TRY(ps_summary_to_json(r->summary, &j));
        for (int k = 0; steps != NULL && k < r->steps; k++) {
            json_t *o = json_pack("{s:i, s:f}", "step", k + 1, "loss", r->loss[k]);
            if (o != NULL && set->loss_scale_window > 0) {
                json_object_set_new(o, "loss_scale", json_real(r->loss_scale[k]));
                json_object_set_new(o, "skipped", json_boolean(r->skipped[k]));
            }
            if (o != NULL && r->step_s[k] > 0)
                json_object_set_new(o, "step_s", json_real(r->step_s[k]));
            if (o == NULL || json_array_append_new(steps, o) != 0) {
                json_decref(steps);
                steps = NULL;
            }
        }
        if (steps == NULL) {
            json_decref(j);
            st = ps_error_set(&err, PS_ERR_NOMEM, "out of memory");
            goto out;
        }
        json_object_set_new(j, "steps", steps);
        if (check_json != NULL) {
            json_object_set_new(j, "check", check_json);
            check_json = NULL;
        }
        st = ps_json_save(j, "-", &err);
        json_decref(j);
        if (st != PS_OK)
            goto out;
    }
out:
    json_decref(check_json);
    ps_summary_free(pred);
    ps_exec_result_free(r);
    ps_program_set_free(set);
    ps_plan_model_free(m);
    for (int i = 0; i < CHECK_RUNS; i++) {
        ps_exec_result_free(runs[i].r);
        ps_program_set_free(runs[i].set);
        ps_plan_model_free(runs[i].m);
    }
    ps_plan_free(plan);
    ps_plan_free(ref_plan);
    if (st != PS_OK && ps_hosts_count(hosts) > 1) {
        /* the other hosts may wait for this one: name the rank, stop them all
         * (unless all stopped together) */
        fprintf(stderr, "pipeshard: exec: rank %d of %d: %s\n", rank, ps_hosts_count(hosts),
                err.msg);
        if (!stopped_together)
            ps_hosts_abort(hosts, 1);
        ps_hosts_finalize(hosts);
        return 1;
    }
    ps_hosts_finalize(hosts);
    if (st != PS_OK)
        return ps_cli_fail(&err, st);
    return mismatch ? 1 : 0;
}
