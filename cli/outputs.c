/* The command line's output files, checked before any work (see cli.h). */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

/* path's directory ("." when it has none) into buf. */
static void directory_of(const char *path, char *buf, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(buf, cap, ".");
    else if (slash == path)
        snprintf(buf, cap, "/");
    else
        snprintf(buf, cap, "%.*s", (int)(slash - path), path);
}

/* The file path names, whether or not it exists yet: its directory
 * resolved, then its own name; false when the directory does not exist. */
static bool canonical(const char *path, char *buf, size_t cap)
{
    char dir[PATH_MAX], real[PATH_MAX];
    directory_of(path, dir, sizeof dir);
    if (realpath(dir, real) == NULL)
        return false;
    const char *slash = strrchr(path, '/');
    snprintf(buf, cap, "%s/%s", strcmp(real, "/") == 0 ? "" : real,
             slash != NULL ? slash + 1 : path);
    return true;
}

/* Whether a and b name one file: the same device and inode where both
 * exist, else the same canonical path. */
static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
    return canonical(a, ca, sizeof ca) && canonical(b, cb, sizeof cb) && strcmp(ca, cb) == 0;
}

static bool is_file(const ps_cli_path *p)
{
    return p->path != NULL && strcmp(p->path, "-") != 0;
}

int ps_cli_check_outputs(const char *command, const ps_cli_path *outs, int n_outs,
                         const ps_cli_path *ins, int n_ins)
{
    for (int i = 0; i < n_outs; i++) {
        const ps_cli_path *o = &outs[i];
        for (int k = 0; k < i && o->path != NULL && strcmp(o->path, "-") == 0; k++)
            if (outs[k].path != NULL && strcmp(outs[k].path, "-") == 0)
                return ps_cli_usage_error(command, "%s and %s both want stdout (\"-\"); give one "
                                                   "of them a file",
                                          outs[k].option, o->option);
        if (!is_file(o))
            continue;
        if (o->path[0] == '\0')
            return ps_cli_usage_error(command, "%s needs a file name", o->option);
        char dir[PATH_MAX];
        directory_of(o->path, dir, sizeof dir);
        struct stat st;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "pipeshard: %s: cannot write %s \"%s\": no directory \"%s\"\n",
                    command, o->option, o->path, dir);
            return 1;
        }
        if (stat(o->path, &st) == 0 && S_ISDIR(st.st_mode)) {
            fprintf(stderr, "pipeshard: %s: cannot write %s \"%s\": it is a directory\n",
                    command, o->option, o->path);
            return 1;
        }
        bool exists = access(o->path, F_OK) == 0;
        if (exists ? access(o->path, W_OK) != 0 : access(dir, W_OK | X_OK) != 0) {
            fprintf(stderr, "pipeshard: %s: cannot write %s \"%s\": %s\n", command, o->option,
                    o->path, strerror(errno));
            return 1;
        }
        for (int k = 0; k < n_ins; k++)
            if (is_file(&ins[k]) && same_file(o->path, ins[k].path))
                return ps_cli_usage_error(command,
                                          "%s \"%s\" would overwrite the input %s \"%s\"; write "
                                          "it elsewhere",
                                          o->option, o->path, ins[k].option, ins[k].path);
        for (int k = 0; k < i; k++)
            if (is_file(&outs[k]) && same_file(o->path, outs[k].path))
                return ps_cli_usage_error(command,
                                          "%s and %s both name \"%s\": one would overwrite the "
                                          "other",
                                          outs[k].option, o->option, o->path);
    }
    return 0;
}

bool ps_cli_stdout_taken(const ps_cli_path *outs, int n_outs)
{
    for (int i = 0; i < n_outs; i++)
        if (outs[i].path != NULL && strcmp(outs[i].path, "-") == 0)
            return true;
    return false;
}

int ps_cli_check_run_outputs(const char *command, const char *plan_path, bool json,
                             const ps_cli_path *outs, int n_outs, FILE **report)
{
    const ps_cli_path ins[] = {{"--plan", plan_path}};
    if (json && ps_cli_stdout_taken(outs, n_outs))
        return ps_cli_usage_error(command, "--json and an output to \"-\" both want stdout; "
                                           "give the output a file");
    int checked = ps_cli_check_outputs(command, outs, n_outs, ins, 1);
    *report = ps_cli_stdout_taken(outs, n_outs) ? stderr : stdout;
    return checked;
}
