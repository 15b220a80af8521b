/* pipeshard demo: the main job on an embedded default. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int ps_cmd_demo(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: pipeshard demo\n\nRuns the main job on an embedded default: the "
               "training step of the\nbuilt-in GPT-2.6B (Alpa's benchmark suite), per layer.\n");
        return 0;
    }
    if (argc > 1)
        return ps_cli_usage_error("demo", "takes no arguments");
    printf("pipeshard demo: the training step of GPT-2.6B (Alpa suite), one micro-batch of "
           "1024 sequences\n\n");
    fflush(stdout);
    char *args[] = {"graph", "--model", "gpt-2.6b", "--per-layer", NULL};
    return ps_cmd_graph(4, args);
}
