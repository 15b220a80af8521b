/* Manual stage files (Alpa's ManualStageOption): which layers each stage
 * runs on which submesh and logical mesh. Format in docs/plan-format.md. */
#ifndef PS_PLANNER_STAGE_FILE_H
#define PS_PLANNER_STAGE_FILE_H

#include "planner/inter_pass.h"

/* Reads a stage file; its layer option (a count, or "manual") goes into o. */
ps_status ps_stage_file_load(const char *path, ps_inter_options *o, ps_manual_stage **stages,
                             int *n_stages, ps_error *err);
/* The same from text held in memory; name is used in messages. */
ps_status ps_stage_file_parse(const char *name, const char *text, ps_inter_options *o,
                              ps_manual_stage **stages, int *n_stages, ps_error *err);

#endif
