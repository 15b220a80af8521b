#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/bytes_text.h"
#include "core/cluster.h"
#include "core/json.h"
#include "core/log.h"
#include "core/plan.h"
#include "core/profile_db.h"

ps_status ps_cli_attach_profile(const char *path, ps_cluster *c, ps_profile_db **out,
                                ps_error *err)
{
    ps_status st = ps_profile_db_load(path, out, err);
    if (st != PS_OK)
        return st;
    c->profile = *out;
    if (ps_cluster_find_kind(c, (*out)->device) < 0)
        PS_LOG_WARN("%s: the cluster \"%s\" has no device kind \"%s\"; the profile DB's "
                    "measurements (backend %s) stand for all of its devices",
                    path, c->name, (*out)->device, (*out)->backend);
    if (ps_cluster_compute_share(c) > 1 && (*out)->devices_at_once > 1)
        PS_LOG_WARN("%s was timed with %d devices computing at once (profile "
                    "--gemm-all-devices), and the devices of cluster \"%s\" share %d cores, "
                    "which the planner and the simulator model: the sharing counts twice; "
                    "profile without --gemm-all-devices",
                    path, (*out)->devices_at_once, c->name, c->shared_cores_per_node);
    return PS_OK;
}

ps_status ps_cli_in_plan_file(const ps_plan *plan, ps_status st, ps_error *err)
{
    if (st == PS_OK || err == NULL || plan->source == NULL)
        return st;
    const char *name = plan->source->name;
    size_t n = strlen(name);
    if (strncmp(err->msg, name, n) == 0 && (err->msg[n] == ':' || err->msg[n] == '\0'))
        return st;
    char msg[PS_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", err->msg);
    ps_error_clear(err); /* ps_error_set keeps a first error */
    return ps_error_set(err, st, "%s: %s", name, msg);
}

int ps_cli_fail(const ps_error *err, ps_status st)
{
    if (err != NULL && err->status != PS_OK && err->msg[0] != '\0')
        fprintf(stderr, "pipeshard: %s\n", err->msg);
    else
        fprintf(stderr, "pipeshard: %s\n", ps_status_str(st));
    return 1;
}

int ps_cli_usage_error(const char *command, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pipeshard: %s: ", command);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nRun 'pipeshard %s --help' for its options.\n", command);
    va_end(ap);
    return 2;
}

bool ps_cli_parse_int(const char *text, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max)
        return false;
    *out = v;
    return true;
}

bool ps_cli_parse_double(const char *text, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || v < min || v > max)
        return false;
    *out = v;
    return true;
}

const char *ps_cli_bytes(double bytes, char *buf, int cap)
{
    return ps_bytes_text(bytes, buf, cap);
}

const char *ps_cli_si(double v, const char *unit, char *buf, int cap)
{
    static const char *const prefixes[] = {"", "K", "M", "G", "T", "P", "E", "Z"};
    int p = 0;
    while (fabs(v) >= 1000 && p < 7) {
        v /= 1000;
        p++;
    }
    snprintf(buf, (size_t)cap, "%.3g %s%s", v, prefixes[p], unit);
    return buf;
}

const char *ps_cli_count(double v, char *buf, int cap)
{
    static const char *const suffixes[] = {"", " K", " M", " B", " T"};
    int p = 0;
    while (v >= 1000 && p < 4) {
        v /= 1000;
        p++;
    }
    snprintf(buf, (size_t)cap, "%.3g%s", v, suffixes[p]);
    return buf;
}
