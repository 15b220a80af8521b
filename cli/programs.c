/* Lowering a plan from the command line: `plan --dump-programs` and `sim`
 * share it. */
#include <stdio.h>

#include "cli/cli.h"
#include "core/program.h"
#include "planner/lower.h"

ps_status ps_cli_dump_programs(const ps_plan *plan, const char *dir, ps_error *err)
{
    ps_status st = PS_OK;
    ps_plan_model *m = NULL;
    ps_program_set *set = NULL;
    ps_lower_options lo = ps_lower_options_default();
    PS_TRY(ps_plan_model_build(plan, &m, err));
    PS_TRY(ps_plan_lower(plan, m, &lo, &set, err));
    PS_TRY(ps_program_set_dump_dir(set, dir, err));
    PS_TRY(ps_program_set_check(set, NULL, err));
    ps_program_stats stats;
    ps_program_set_stats(set, &stats);
    fprintf(stderr,
            "pipeshard: programs written to %s and checked: %d kernels (%lld instructions), "
            "%lld program instructions, %lld executed\n",
            dir, set->n_kernels, stats.kernel_instrs, stats.program_instrs, stats.executed_instrs);
out:
    ps_program_set_free(set);
    ps_plan_model_free(m);
    return st;
}
