/* Charts: data files for the gnuplot scripts of traces/plots/, and running
 * gnuplot on them (docs/compare.md). */
#include "traces/plot.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/bytes_text.h"
#include "core/log.h"

#ifndef PS_PLOTS_DIR
#define PS_PLOTS_DIR "traces/plots"
#endif

extern char **environ;

/* ---- finding gnuplot and the scripts ------------------------------------ */

const char *ps_plot_scripts_dir(const ps_plot_options *o)
{
    if (o != NULL && o->scripts_dir != NULL)
        return o->scripts_dir;
    const char *env = getenv("PIPESHARD_PLOTS");
    return env != NULL && env[0] != '\0' ? env : PS_PLOTS_DIR;
}

ps_status ps_plot_check_scripts(const ps_plot_options *o, const char *const *scripts, int n,
                                ps_error *err)
{
    char path[1200];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", ps_plot_scripts_dir(o), scripts[i]);
        if (access(path, R_OK) != 0)
            return ps_error_set(err, PS_ERR_IO,
                                "%s: cannot read the chart's script: %s (the scripts live in "
                                "the source tree's traces/plots; --scripts DIR or "
                                "PIPESHARD_PLOTS points elsewhere)",
                                path, strerror(errno));
    }
    return PS_OK;
}

static bool executable(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && access(path, X_OK) == 0;
}

ps_status ps_plot_find_gnuplot(const ps_plot_options *o, char *path, size_t cap, ps_error *err)
{
    const char *given = o != NULL ? o->gnuplot : NULL;
    if (given == NULL) {
        const char *env = getenv("PIPESHARD_GNUPLOT");
        given = env != NULL && env[0] != '\0' ? env : NULL;
    }
    if (given != NULL && strchr(given, '/') != NULL) {
        if (!executable(given))
            return ps_error_set(err, PS_ERR_NOT_FOUND,
                                "gnuplot: %s is not an executable program (PIPESHARD_GNUPLOT)",
                                given);
        snprintf(path, cap, "%s", given);
        return PS_OK;
    }
    const char *name = given != NULL ? given : "gnuplot";
    const char *dirs = getenv("PATH");
    for (const char *p = dirs != NULL ? dirs : ""; *p != '\0';) {
        const char *end = strchr(p, ':');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        if (len > 0 && (size_t)snprintf(path, cap, "%.*s/%s", (int)len, p, name) < cap &&
            executable(path))
            return PS_OK;
        p += len + (end != NULL);
    }
    return ps_error_set(err, PS_ERR_NOT_FOUND,
                        "charts need gnuplot, and \"%s\" is not on PATH: install it (Debian: "
                        "apt-get install gnuplot-nox; scripts/install-deps does) or set "
                        "PIPESHARD_GNUPLOT to its path",
                        name);
}

/* ---- gnuplot variables -------------------------------------------------- */

/* The -e argument: "name='text'; name=1.5; ..." */
typedef struct gp_vars {
    char *buf;
    size_t len, cap;
    bool failed; /* out of memory */
} gp_vars;

static void gp_append(gp_vars *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void gp_append(gp_vars *v, const char *fmt, ...)
{
    if (v->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(v->buf != NULL ? v->buf + v->len : NULL,
                          v->buf != NULL ? v->cap - v->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            v->failed = true;
            return;
        }
        if (v->buf != NULL && v->len + (size_t)n < v->cap) {
            v->len += (size_t)n;
            return;
        }
        size_t cap = v->cap > 0 ? v->cap : 256;
        while (cap <= v->len + (size_t)n)
            cap *= 2;
        char *bigger = realloc(v->buf, cap);
        if (bigger == NULL) {
            v->failed = true;
            return;
        }
        v->buf = bigger;
        v->cap = cap;
    }
}

/* Text the charts show: gnuplot's enhanced text mode reads _ ^ @ & ~ { } as
 * markup (bench_scaling.csv came out with a subscript), so each is escaped. */
static bool enhanced_special(char c) { return c != '\0' && strchr("_^@&~{}", c) != NULL; }

/* A string variable, name='value': gnuplot's single quotes take everything
 * literally except a quote, which is doubled; `shown`: escape the markup. */
static void gp_quoted(gp_vars *v, const char *name, const char *value, bool shown)
{
    gp_append(v, "%s='", name);
    for (const char *p = value; *p != '\0'; p++) {
        if (shown && enhanced_special(*p))
            gp_append(v, "\\");
        gp_append(v, *p == '\'' ? "''" : "%c", *p);
    }
    gp_append(v, "'; ");
}

/* A path or a name the script reads. */
static void gp_str(gp_vars *v, const char *name, const char *value)
{
    gp_quoted(v, name, value, false);
}

/* Text the chart shows. */
static void gp_text(gp_vars *v, const char *name, const char *value)
{
    gp_quoted(v, name, value, true);
}

static void gp_num(gp_vars *v, const char *name, double value)
{
    gp_append(v, "%s=%.17g; ", name, value);
}

static void gp_int(gp_vars *v, const char *name, int value)
{
    gp_append(v, "%s=%d; ", name, value);
}

/* ---- running gnuplot ---------------------------------------------------- */

/* Keeps the last lines of gnuplot's stderr for the error message. */
#define GP_STDERR_KEEP 1500

/* Runs gnuplot -e VARS SCRIPT; its stderr is read through a pipe, shown
 * as warnings when it succeeds and in the error when it fails. */
/* Appends to DIR/NAME.dat (NAME: the script's name less .gp) the command
 * that redraws the chart from it by hand, every variable as set here (a
 * comment line, which gnuplot skips). */
static ps_status note_redraw(const char *dir, const char *script_name, const char *script,
                             const gp_vars *vars, ps_error *err)
{
    char data[1200];
    snprintf(data, sizeof data, "%s/%.*s.dat", dir, (int)(strlen(script_name) - 3), script_name);
    FILE *f = fopen(data, "a");
    if (f == NULL)
        return ps_error_set(err, PS_ERR_IO, "%s: cannot write: %s", data, strerror(errno));
    /* within the shell's double quotes, \ " $ ` are escaped */
    fputs("# redraw: gnuplot -e \"", f);
    for (size_t i = 0; i < vars->len; i++) {
        char c = vars->buf[i] == '\n' ? ' ' : vars->buf[i]; /* one comment line */
        if (c == '\\' || c == '"' || c == '$' || c == '`')
            fputc('\\', f);
        fputc(c, f);
    }
    fputs("\" '", f); /* the script's path in single quotes, a quote as '\'' */
    for (const char *p = script; *p != '\0'; p++) {
        if (*p == '\'')
            fputs("'\\''", f);
        else
            fputc(*p, f);
    }
    fputs("'\n", f);
    if (fclose(f) != 0)
        return ps_error_set(err, PS_ERR_IO, "%s: write failed: %s", data, strerror(errno));
    return PS_OK;
}

static ps_status run_gnuplot(const ps_plot_options *o, const char *script_name, const gp_vars *vars,
                             const char *dir, ps_error *err)
{
    ps_status st = PS_OK;
    char gnuplot[1024], script[1024], tail[GP_STDERR_KEEP + 1];
    size_t tail_len = 0;
    int pipefd[2] = {-1, -1};
    bool have_actions = false;
    posix_spawn_file_actions_t fa;
    pid_t pid = -1;
    if (vars->failed) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    PS_TRY(ps_plot_find_gnuplot(o, gnuplot, sizeof gnuplot, err));
    snprintf(script, sizeof script, "%s/%s", ps_plot_scripts_dir(o), script_name);
    if (access(script, R_OK) != 0) {
        st = ps_error_set(err, PS_ERR_IO,
                          "%s: cannot read the chart's script: %s (the scripts live in the "
                          "source tree's traces/plots; --scripts DIR or PIPESHARD_PLOTS "
                          "points elsewhere)",
                          script, strerror(errno));
        goto out;
    }
    PS_TRY(note_redraw(dir, script_name, script, vars, err));
    if (pipe(pipefd) != 0) {
        st = ps_error_set(err, PS_ERR_IO, "pipe: %s", strerror(errno));
        goto out;
    }
    if (posix_spawn_file_actions_init(&fa) != 0) {
        st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        goto out;
    }
    have_actions = true;
    int rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (rc == 0) /* results go to files; gnuplot prints nothing we need */
        rc = posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    if (rc == 0)
        rc = posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2);
    if (rc == 0)
        rc = posix_spawn_file_actions_addclose(&fa, pipefd[0]);
    if (rc == 0)
        rc = posix_spawn_file_actions_addclose(&fa, pipefd[1]);
    char *argv[] = {gnuplot, "-e", vars->buf != NULL ? vars->buf : "", script, NULL};
    if (rc == 0)
        rc = posix_spawn(&pid, gnuplot, &fa, NULL, argv, environ);
    if (rc != 0) {
        st = ps_error_set(err, PS_ERR_IO, "cannot run %s: %s", gnuplot, strerror(rc));
        goto out;
    }
    close(pipefd[1]);
    pipefd[1] = -1;
    /* read to the end before waiting, so a chatty gnuplot cannot block */
    char chunk[512];
    for (;;) {
        ssize_t got = read(pipefd[0], chunk, sizeof chunk);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        for (ssize_t i = 0; i < got; i++) {
            if (tail_len == GP_STDERR_KEEP) {
                memmove(tail, tail + 1, GP_STDERR_KEEP - 1);
                tail_len--;
            }
            tail[tail_len++] = chunk[i];
        }
    }
    tail[tail_len] = '\0';
    while (tail_len > 0 && (tail[tail_len - 1] == '\n' || tail[tail_len - 1] == ' '))
        tail[--tail_len] = '\0';
    int wstatus = 0;
    while (waitpid(pid, &wstatus, 0) < 0) {
        if (errno != EINTR) {
            st = ps_error_set(err, PS_ERR_IO, "waitpid: %s", strerror(errno));
            goto out;
        }
    }
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
        char how[64];
        if (WIFEXITED(wstatus))
            snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(wstatus));
        else
            snprintf(how, sizeof how, "signal %d", WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0);
        st = ps_error_set(err, PS_ERR_IO, "gnuplot failed on %s (%s)%s%s", script, how,
                          tail_len > 0 ? ":\n" : "", tail);
        goto out;
    }
    if (tail_len > 0)
        PS_LOG_WARN("gnuplot on %s: %s", script, tail);
out:
    if (have_actions)
        posix_spawn_file_actions_destroy(&fa);
    if (pipefd[0] >= 0)
        close(pipefd[0]);
    if (pipefd[1] >= 0)
        close(pipefd[1]);
    return st;
}

/* ---- output folder and data files --------------------------------------- */

/* mkdir -p */
static ps_status make_dir(const char *dir, ps_error *err)
{
    char path[1024];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return ps_error_set(err, PS_ERR_INVALID, "%s: path too long", dir);
    for (char *p = path + 1;; p++) {
        bool last = *p == '\0';
        if (*p == '/' || last) {
            char keep = *p;
            *p = '\0';
            if (mkdir(path, 0777) != 0 && errno != EEXIST)
                return ps_error_set(err, PS_ERR_IO, "%s: cannot create the folder: %s", path,
                                    strerror(errno));
            *p = keep;
        }
        if (last)
            break;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return ps_error_set(err, PS_ERR_IO, "%s: not a folder", dir);
    return PS_OK;
}

static ps_status open_data(const char *dir, const char *name, char *path, size_t cap, FILE **f,
                           ps_error *err)
{
    snprintf(path, cap, "%s/%s.dat", dir, name);
    *f = fopen(path, "w");
    if (*f == NULL)
        return ps_error_set(err, PS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return PS_OK;
}

static ps_status close_data(FILE *f, const char *path, ps_error *err)
{
    bool failed = ferror(f) != 0;
    failed = fclose(f) != 0 || failed;
    return failed ? ps_error_set(err, PS_ERR_IO, "%s: write failed", path) : PS_OK;
}

/* A label as a gnuplot data field: double-quoted, quotes made single, shown
 * as enhanced text (see gp_text); gnuplot reads a double-quoted string there
 * with backslash escapes, so the escape is doubled. */
static void data_text(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s != '\0'; s++) {
        if (enhanced_special(*s))
            fputs("\\\\", f);
        fputc(*s == '"' ? '\'' : *s, f);
    }
    fputc('"', f);
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash != NULL && slash[1] != '\0' ? slash + 1 : path;
}

/* ---- units and axes ----------------------------------------------------- */

typedef struct unit {
    const char *name;
    double per_base; /* values are divided by this */
} unit;

/* The unit that shows the largest of a set of seconds with 1 to 3 digits
 * before the point. */
static unit time_unit(double max_s)
{
    if (max_s >= 1)
        return (unit){"s", 1};
    if (max_s >= 1e-3)
        return (unit){"ms", 1e-3};
    return (unit){"µs", 1e-6};
}

/* Binary units, as the tables and the plans show memory. */
static unit bytes_unit(double max_bytes)
{
    ps_bytes_unit b = ps_bytes_unit_for(max_bytes);
    return (unit){b.bytes == 1 ? "bytes" : b.name, b.bytes};
}

/* The range of an axis holding values in [lo, hi] (already in the axis's
 * unit): logarithmic when they are positive and span more than 20x. */
typedef struct axis {
    double lo, hi;
    int log;
} axis;

static axis axis_for(double lo, double hi)
{
    axis a = {0, 1, 0};
    if (!(hi > 0))
        return a; /* all zero: a unit range keeps gnuplot from refusing an empty one */
    if (lo > 0 && hi / lo > 20) {
        a.log = 1;
        a.lo = lo / 1.5;
        a.hi = hi * 1.5;
    } else {
        /* values well away from 0 get room below them, not an empty corner */
        a.lo = lo > 0 ? lo * 0.75 : 0;
        a.hi = hi * 1.15;
    }
    return a;
}

static void gp_axis(gp_vars *v, const char *prefix, axis a)
{
    char name[32];
    snprintf(name, sizeof name, "%slo", prefix);
    gp_num(v, name, a.lo);
    snprintf(name, sizeof name, "%shi", prefix);
    gp_num(v, name, a.hi);
    snprintf(name, sizeof name, "%slog", prefix);
    gp_int(v, name, a.log);
}

static void run_label(const ps_compare *c, int r, bool with_file, char *buf, size_t cap)
{
    char id[8];
    snprintf(buf, cap, "%s %s%s%s%s", ps_compare_run_id(r, id), c->runs[r].summary->source,
             with_file ? " (" : "", with_file ? base_name(c->runs[r].file) : "",
             with_file ? ")" : "");
}

static void compare_title(const ps_compare *c, char *buf, size_t cap)
{
    const ps_summary *s = c->runs[0].summary;
    snprintf(buf, cap, "%s on %s, %d stage%s, %d micro-batches (plan %s)",
             s->model[0] ? s->model : "?", s->cluster[0] ? s->cluster : "?", c->n_stages,
             c->n_stages == 1 ? "" : "s", s->micro_batches, s->plan);
}

/* ---- compare: scatter and breakdown ------------------------------------- */

static ps_status plot_scatter(const ps_compare *c, const char *dir, const ps_plot_options *o,
                              ps_error *err)
{
    ps_status st = PS_OK;
    char path[1200], label[300], title[300];
    FILE *f = NULL;
    gp_vars v = {0};
    /* one unit and range per panel, over every value shown (the reference's too) */
    double tlo = INFINITY, thi = 0, mlo = INFINITY, mhi = 0;
    for (int k = 0; k < c->n_stages; k++)
        for (int r = 0; r < c->n_runs; r++) {
            const ps_compare_cell *cell = ps_compare_cell_at(c, k, r);
            tlo = fmin(tlo, cell->value[PS_CMP_TIME]);
            thi = fmax(thi, cell->value[PS_CMP_TIME]);
            mlo = fmin(mlo, cell->value[PS_CMP_MEMORY]);
            mhi = fmax(mhi, cell->value[PS_CMP_MEMORY]);
        }
    unit tu = time_unit(thi), mu = bytes_unit(mhi);
    PS_TRY(open_data(dir, "scatter", path, sizeof path, &f, err));
    fprintf(f,
            "# pipeshard compare: per stage, each run against the reference (%s)\n"
            "# one block per run: a title line, then\n"
            "# stage  reference_time  time  time_error  reference_memory  memory  "
            "memory_error\n"
            "# times in %s per micro-batch (forward + backward), memory in %s; errors are "
            "fractions (NaN: undefined)\n",
            c->runs[c->reference].file, tu.name, mu.name);
    int blocks = 0;
    for (int r = 0; r < c->n_runs; r++) {
        if (r == c->reference)
            continue;
        if (blocks++ > 0)
            fputs("\n\n", f); /* gnuplot's block separator: `index` selects a run */
        run_label(c, r, true, label, sizeof label);
        data_text(f, label);
        fputc('\n', f);
        for (int k = 0; k < c->n_stages; k++) {
            const ps_compare_cell *cell = ps_compare_cell_at(c, k, r);
            const ps_compare_cell *ref = ps_compare_cell_at(c, k, c->reference);
            fprintf(f, "%d %.9g %.9g %.9g %.9g %.9g %.9g\n", k,
                    ref->value[PS_CMP_TIME] / tu.per_base, cell->value[PS_CMP_TIME] / tu.per_base,
                    cell->error[PS_CMP_TIME], ref->value[PS_CMP_MEMORY] / mu.per_base,
                    cell->value[PS_CMP_MEMORY] / mu.per_base, cell->error[PS_CMP_MEMORY]);
        }
    }
    st = close_data(f, path, err);
    f = NULL;
    if (st != PS_OK)
        goto out;
    compare_title(c, title, sizeof title);
    run_label(c, c->reference, false, label, sizeof label);
    gp_str(&v, "data", path);
    snprintf(path, sizeof path, "%s/scatter", dir);
    gp_str(&v, "out", path);
    gp_text(&v, "title", title);
    gp_text(&v, "ref", label);
    gp_int(&v, "nruns", blocks);
    gp_str(&v, "tunit", tu.name);
    gp_str(&v, "munit", mu.name);
    gp_axis(&v, "t", axis_for(tlo / tu.per_base, thi / tu.per_base));
    gp_axis(&v, "m", axis_for(mlo / mu.per_base, mhi / mu.per_base));
    PS_TRY(run_gnuplot(o, "scatter.gp", &v, dir, err));
out:
    if (f != NULL)
        fclose(f);
    free(v.buf);
    return st;
}

static ps_status plot_breakdown(const ps_compare *c, const char *dir, const ps_plot_options *o,
                                ps_error *err)
{
    ps_status st = PS_OK;
    char path[1200], label[300], title[300];
    FILE *f = NULL;
    gp_vars v = {0};
    double most = 0, least = INFINITY;
    for (int i = 0; i < c->n_stages * c->n_runs; i++) {
        double total = c->cells[i].compute_s + c->cells[i].comm_s + c->cells[i].idle_s;
        most = fmax(most, total);
        if (total > 0)
            least = fmin(least, total);
    }
    /* runs thousands of times apart (V100 predictions beside a CPU run): each bar
     * in shares of its own total, or the small ones would not show */
    bool shares = most > 20 * least;
    unit u = time_unit(most);
    PS_TRY(open_data(dir, "breakdown", path, sizeof path, &f, err));
    fprintf(f,
            "# pipeshard compare: per stage and run, the mean over the stage's devices of\n"
            "# the time per step spent computing, communicating and idle, in %s\n"
            "# x = stage * (runs + 1) + run, so that a stage's bars stand together\n"
            "# x  stage  run  label  compute  comm  idle\n",
            u.name);
    for (int k = 0; k < c->n_stages; k++)
        for (int r = 0; r < c->n_runs; r++) {
            const ps_compare_cell *cell = ps_compare_cell_at(c, k, r);
            run_label(c, r, false, label, sizeof label);
            if (r == c->reference)
                strncat(label, " (ref)", sizeof label - strlen(label) - 1);
            fprintf(f, "%d %d %d ", k * (c->n_runs + 1) + r, k, r);
            data_text(f, label);
            fprintf(f, " %.9g %.9g %.9g\n", cell->compute_s / u.per_base, cell->comm_s / u.per_base,
                    cell->idle_s / u.per_base);
        }
    st = close_data(f, path, err);
    f = NULL;
    if (st != PS_OK)
        goto out;
    compare_title(c, title, sizeof title);
    gp_str(&v, "data", path);
    snprintf(path, sizeof path, "%s/breakdown", dir);
    gp_str(&v, "out", path);
    gp_text(&v, "title", title);
    gp_str(&v, "unit", u.name);
    gp_int(&v, "nruns", c->n_runs);
    gp_int(&v, "nstages", c->n_stages);
    gp_num(&v, "ymax", most > 0 ? most / u.per_base * 1.12 : 1);
    gp_int(&v, "shares", shares);
    PS_TRY(run_gnuplot(o, "breakdown.gp", &v, dir, err));
out:
    if (f != NULL)
        fclose(f);
    free(v.buf);
    return st;
}

ps_status ps_plot_compare(const ps_compare *c, const char *dir, const ps_plot_options *o,
                          ps_error *err)
{
    ps_status st = PS_OK;
    char gnuplot[1024];
    /* say that gnuplot is missing before writing anything */
    PS_TRY(ps_plot_find_gnuplot(o, gnuplot, sizeof gnuplot, err));
    PS_TRY(make_dir(dir, err));
    PS_TRY(plot_scatter(c, dir, o, err));
    PS_TRY(plot_breakdown(c, dir, o, err));
out:
    return st;
}

/* ---- timeline ----------------------------------------------------------- */

/* Categories in the order they are drawn (later ones on top) and listed. */
static const char *const timeline_cats[PS_TRACE_CATEGORY_COUNT + 1] = {
    "idle", "compute", "collective", "send", "recv", "other"};

static int timeline_cat_index(int category)
{
    const char *name =
        category < PS_TRACE_CATEGORY_COUNT ? ps_trace_category_names[category] : "other";
    for (int i = 0; i <= PS_TRACE_CATEGORY_COUNT; i++)
        if (strcmp(timeline_cats[i], name) == 0)
            return i;
    return PS_TRACE_CATEGORY_COUNT;
}

/* Whether a span shows in the window [from_s, to_s]. */
static bool in_window(const ps_trace_span *s, double from_s, double to_s)
{
    return s->start_s + s->duration_s >= from_s && s->start_s <= to_s;
}

ps_status ps_plot_timeline(const ps_trace_data *t, double from_s, double to_s, const char *dir,
                           const ps_plot_options *o, int *drawn, ps_error *err)
{
    ps_status st = PS_OK;
    char path[1200], title[300], cats[128] = "", gnuplot[1024];
    FILE *f = NULL;
    gp_vars v = {0};
    int count[PS_TRACE_CATEGORY_COUNT + 1] = {0};
    PS_TRY(ps_plot_find_gnuplot(o, gnuplot, sizeof gnuplot, err));
    double asked_to_s = to_s;
    if (to_s < 0 || to_s > t->end_s)
        to_s = t->end_s;
    if (!(from_s >= 0) || from_s >= to_s) {
        char upto[48] = "the end";
        if (asked_to_s >= 0)
            snprintf(upto, sizeof upto, "%g ms", asked_to_s * 1e3);
        st = ps_error_set(err, PS_ERR_INVALID,
                          "the window from %g ms to %s holds nothing: the trace's spans end at "
                          "%g ms",
                          from_s * 1e3, upto, t->end_s * 1e3);
        goto out;
    }
    PS_TRY(make_dir(dir, err));
    unit u = time_unit(to_s - from_s);
    int in = 0;
    for (int i = 0; i < t->n_spans; i++)
        if (in_window(&t->spans[i], from_s, to_s)) {
            count[timeline_cat_index(t->spans[i].category)]++;
            in++;
        }
    if (drawn != NULL)
        *drawn = in;
    PS_TRY(open_data(dir, "timeline", path, sizeof path, &f, err));
    fprintf(f,
            "# pipeshard timeline: block 0 names the rows (row, device name; beyond 100\n"
            "# devices every k-th); then one block per category present, in the order\n"
            "# of the variable cats:\n"
            "# row  start  end   (in %s from the first span)\n",
            u.name);
    /* beyond about 100 rows the names would overlap: name every stride-th */
    int stride = (t->n_devices + 99) / 100;
    for (int d = 0; d < t->n_devices; d += stride) {
        fprintf(f, "%d ", d);
        data_text(f, t->devices[d].name);
        fputc('\n', f);
    }
    for (int c = 0; c <= PS_TRACE_CATEGORY_COUNT; c++) {
        if (count[c] == 0)
            continue;
        size_t used = strlen(cats);
        snprintf(cats + used, sizeof cats - used, "%s%s", used > 0 ? " " : "", timeline_cats[c]);
        fprintf(f, "\n\n# %s\n", timeline_cats[c]);
        for (int i = 0; i < t->n_spans; i++) {
            const ps_trace_span *s = &t->spans[i];
            if (timeline_cat_index(s->category) != c || !in_window(s, from_s, to_s))
                continue;
            int row = 0; /* devices are sorted by id */
            for (int lo = 0, hi = t->n_devices - 1; lo <= hi;) {
                int mid = (lo + hi) / 2;
                if (t->devices[mid].id == s->device) {
                    row = mid;
                    break;
                }
                if (t->devices[mid].id < s->device)
                    lo = mid + 1;
                else
                    hi = mid - 1;
            }
            /* clipped to the window */
            fprintf(f, "%d %.9g %.9g\n", row, fmax(s->start_s, from_s) / u.per_base,
                    fmin(s->start_s + s->duration_s, to_s) / u.per_base);
        }
    }
    st = close_data(f, path, err);
    f = NULL;
    if (st != PS_OK)
        goto out;
    char window[96] = "";
    if (from_s > 0 || to_s < t->end_s)
        snprintf(window, sizeof window, ", from %.6g to %.6g %s", from_s / u.per_base,
                 to_s / u.per_base, u.name);
    snprintf(title, sizeof title, "%s%s%s%s%s%s", t->source[0] ? t->source : "trace",
             t->model[0] ? ": " : "", t->model, t->cluster[0] ? " on " : "", t->cluster, window);
    gp_str(&v, "data", path);
    snprintf(path, sizeof path, "%s/timeline", dir);
    gp_str(&v, "out", path);
    gp_text(&v, "title", title);
    gp_str(&v, "unit", u.name);
    gp_str(&v, "cats", cats);
    gp_int(&v, "ndevices", t->n_devices);
    gp_num(&v, "tstart", from_s / u.per_base);
    gp_num(&v, "tend", to_s / u.per_base);
    PS_TRY(run_gnuplot(o, "timeline.gp", &v, dir, err));
out:
    if (f != NULL)
        fclose(f);
    free(v.buf);
    return st;
}

/* ---- scaling ------------------------------------------------------------ */

#define CSV_MAX_FIELDS 64

/* Splits one CSV line in place (RFC 4180 quotes, no newlines inside
 * fields). Returns the number of fields, or -1 for an unterminated quote. */
static int csv_split(char *line, char **fields, int max)
{
    int n = 0;
    char *p = line;
    for (;;) {
        if (n == max)
            return n;
        char *start = p, *w = p;
        if (*p == '"') {
            p++;
            for (;;) {
                if (*p == '\0')
                    return -1;
                if (*p == '"' && p[1] == '"') {
                    *w++ = '"';
                    p += 2;
                } else if (*p == '"') {
                    p++;
                    break;
                } else {
                    *w++ = *p++;
                }
            }
            while (*p != ',' && *p != '\0')
                p++; /* text after the closing quote is dropped */
        } else {
            while (*p != ',' && *p != '\0')
                *w++ = *p++;
        }
        bool more = *p == ',';
        *w = '\0';
        fields[n++] = start;
        if (!more)
            return n;
        p++;
    }
}

typedef struct scaling_point {
    int series; /* index into the names */
    double devices, throughput;
    int line;   /* in the CSV, for messages */
} scaling_point;

static int point_cmp(const void *a, const void *b)
{
    const scaling_point *x = a, *y = b;
    if (x->series != y->series)
        return x->series < y->series ? -1 : 1;
    if (x->devices != y->devices)
        return (x->devices > y->devices) - (x->devices < y->devices);
    return (x->line > y->line) - (x->line < y->line);
}

ps_status ps_plot_scaling(const char *csv_path, const char *dir, const ps_plot_options *o,
                          ps_error *err)
{
    ps_status st = PS_OK;
    FILE *in = NULL, *f = NULL;
    char line[4096], ylabel[256] = "", path[1200], gnuplot[1024], note[512] = "";
    char **names = NULL;
    int n_names = 0, n_points = 0, cap_points = 0;
    scaling_point *pts = NULL;
    gp_vars v = {0};
    int col_series = -1, col_devices = -1, col_tp = -1, lineno = 0, n_header = 0;
    PS_TRY(ps_plot_find_gnuplot(o, gnuplot, sizeof gnuplot, err));
    in = fopen(csv_path, "r");
    if (in == NULL) {
        st = ps_error_set(err, PS_ERR_IO, "%s: cannot open: %s", csv_path, strerror(errno));
        goto out;
    }
    while (fgets(line, sizeof line, in) != NULL) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            st = ps_error_set(err, PS_ERR_PARSE, "%s:%d: line longer than %zu bytes", csv_path,
                              lineno, sizeof line - 2);
            goto out;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (line[0] == '#' && note[0] == '\0' && col_series < 0) {
            /* the first comment says what the points are (bench_plan: weak
             * scaling); the machine's description after it is left out */
            const char *text = line + 1 + strspn(line + 1, " ");
            size_t keep = strcspn(text, ";");
            snprintf(note, sizeof note, "%.*s", (int)(keep < 400 ? keep : 400), text);
        }
        if (len == 0 || line[0] == '#')
            continue; /* blank lines and comments (e.g. the machine's description) */
        char *fields[CSV_MAX_FIELDS];
        int n = csv_split(line, fields, CSV_MAX_FIELDS);
        if (n < 0) {
            st = ps_error_set(err, PS_ERR_PARSE, "%s:%d: unterminated quote", csv_path, lineno);
            goto out;
        }
        if (col_series < 0) { /* the header */
            for (int i = 0; i < n; i++) {
                /* a column named twice would leave which one is plotted to chance */
                int *col = strcmp(fields[i], "series") == 0    ? &col_series
                           : strcmp(fields[i], "devices") == 0 ? &col_devices
                           : strncmp(fields[i], "throughput", 10) == 0 ? &col_tp
                                                                      : NULL;
                if (col == NULL)
                    continue;
                if (*col >= 0) {
                    st = ps_error_set(err, PS_ERR_PARSE,
                                      "%s:%d: columns %d (\"%s\") and %d (\"%s\") are both "
                                      "a %s column; one column each for series, devices and "
                                      "throughput",
                                      csv_path, lineno, *col + 1, fields[*col], i + 1, fields[i],
                                      col == &col_series    ? "series"
                                      : col == &col_devices ? "devices"
                                                            : "throughput");
                    goto out;
                }
                *col = i;
                if (col == &col_tp)
                    snprintf(ylabel, sizeof ylabel, "%s", fields[i]);
            }
            n_header = n;
            if (col_series < 0 || col_devices < 0 || col_tp < 0) {
                char missing[64] = "";
                const int cols[3] = {col_series, col_devices, col_tp};
                const char *col_names[3] = {"series", "devices", "throughput"};
                for (int k = 0; k < 3; k++)
                    if (cols[k] < 0)
                        snprintf(missing + strlen(missing), sizeof missing - strlen(missing),
                                 "%s%s", missing[0] ? ", " : "", col_names[k]);
                st = ps_error_set(err, PS_ERR_PARSE,
                                  "%s:%d: the header must name the columns series, devices and "
                                  "throughput (e.g. \"throughput (PFLOP/s)\"); it has no %s",
                                  csv_path, lineno, missing);
                goto out;
            }
            continue;
        }
        if (n != n_header) {
            st = ps_error_set(err, PS_ERR_PARSE, "%s:%d: %d field%s, the header has %d",
                              csv_path, lineno, n, n == 1 ? "" : "s", n_header);
            goto out;
        }
        char *end;
        double devices = strtod(fields[col_devices], &end);
        if (end == fields[col_devices] || *end != '\0' || !(devices >= 1) || devices > 1e9 ||
            devices != floor(devices)) {
            st = ps_error_set(err, PS_ERR_PARSE, "%s:%d: devices: \"%s\" is not a count >= 1",
                              csv_path, lineno, fields[col_devices]);
            goto out;
        }
        double tp = strtod(fields[col_tp], &end);
        if (end == fields[col_tp] || *end != '\0' || !isfinite(tp) || tp < 0) {
            st = ps_error_set(err, PS_ERR_PARSE, "%s:%d: %s: \"%s\" is not a number >= 0", csv_path,
                              lineno, ylabel, fields[col_tp]);
            goto out;
        }
        if (fields[col_series][0] == '\0') {
            st = ps_error_set(err, PS_ERR_PARSE, "%s:%d: series: empty name", csv_path, lineno);
            goto out;
        }
        int s = 0;
        while (s < n_names && strcmp(names[s], fields[col_series]) != 0)
            s++;
        if (s == n_names) {
            char **bigger = realloc(names, (size_t)(n_names + 1) * sizeof *names);
            PS_TRY_ALLOC(bigger, err);
            names = bigger;
            names[n_names] = strdup(fields[col_series]);
            PS_TRY_ALLOC(names[n_names], err);
            n_names++;
        }
        if (n_points == cap_points) {
            int cap = cap_points > 0 ? cap_points * 2 : 64;
            scaling_point *bigger = realloc(pts, (size_t)cap * sizeof *bigger);
            PS_TRY_ALLOC(bigger, err);
            pts = bigger;
            cap_points = cap;
        }
        pts[n_points++] = (scaling_point){s, devices, tp, lineno};
    }
    if (ferror(in)) {
        st = ps_error_set(err, PS_ERR_IO, "%s: cannot read: %s", csv_path, strerror(errno));
        goto out;
    }
    if (n_points == 0) {
        st = ps_error_set(err, PS_ERR_INVALID, "%s: no data rows%s", csv_path,
                          col_series < 0 ? " (and no header)" : "");
        goto out;
    }
    qsort(pts, (size_t)n_points, sizeof *pts, point_cmp);
    for (int i = 1; i < n_points; i++)
        if (pts[i].series == pts[i - 1].series && pts[i].devices == pts[i - 1].devices) {
            /* a curve has one point per device count */
            st = ps_error_set(err, PS_ERR_PARSE,
                              "%s:%d: series \"%s\" has %.0f devices already (line %d)",
                              csv_path, pts[i].line, names[pts[i].series], pts[i].devices,
                              pts[i - 1].line);
            goto out;
        }
    PS_TRY(make_dir(dir, err));
    PS_TRY(open_data(dir, "scaling", path, sizeof path, &f, err));
    fprintf(f,
            "# pipeshard scaling from %s: one block per series, a title line, then\n"
            "# devices  throughput  ideal (linear from the series' smallest point)\n",
            csv_path);
    double dlo = INFINITY, dhi = 0, tlo = INFINITY, thi = 0;
    for (int i = 0; i < n_points; i++) {
        const scaling_point *p = &pts[i];
        bool first = i == 0 || pts[i - 1].series != p->series;
        int j = i;
        while (j > 0 && pts[j - 1].series == p->series)
            j--; /* the series' smallest point */
        double ideal = pts[j].throughput * p->devices / pts[j].devices;
        if (first) {
            fputs(i > 0 ? "\n\n" : "", f);
            data_text(f, names[p->series]);
            fputc('\n', f);
        }
        fprintf(f, "%.17g %.17g %.17g\n", p->devices, p->throughput, ideal);
        dlo = fmin(dlo, p->devices);
        dhi = fmax(dhi, p->devices);
        if (p->throughput > 0)
            tlo = fmin(tlo, p->throughput);
        thi = fmax(thi, fmax(p->throughput, ideal));
    }
    st = close_data(f, path, err);
    f = NULL;
    if (st != PS_OK)
        goto out;
    gp_str(&v, "data", path);
    snprintf(path, sizeof path, "%s/scaling", dir);
    gp_str(&v, "out", path);
    char title[1024];
    if (note[0] != '\0')
        snprintf(title, sizeof title, "%s (%s)", note, base_name(csv_path));
    else
        snprintf(title, sizeof title, "%s", base_name(csv_path));
    gp_text(&v, "title", title);
    gp_text(&v, "ylabel", ylabel);
    gp_int(&v, "nseries", n_names);
    /* devices come in powers of two: a log2 axis once they span 8x */
    gp_int(&v, "xlog", dhi / dlo >= 8);
    gp_num(&v, "xlo", dhi / dlo >= 8 ? dlo / 1.3 : 0);
    gp_num(&v, "xhi", dhi / dlo >= 8 ? dhi * 1.3 : dhi * 1.1);
    axis ya = axis_for(isfinite(tlo) ? tlo : 0, thi);
    /* a zero throughput cannot sit on a log axis */
    if (ya.log && tlo > 0 && tlo < INFINITY) {
        bool zero = false;
        for (int i = 0; i < n_points; i++)
            zero = zero || pts[i].throughput <= 0;
        if (zero)
            ya = (axis){0, thi * 1.15, 0};
    }
    gp_axis(&v, "y", ya);
    PS_TRY(run_gnuplot(o, "scaling.gp", &v, dir, err));
out:
    if (in != NULL)
        fclose(in);
    if (f != NULL)
        fclose(f);
    for (int i = 0; i < n_names; i++)
        free(names[i]);
    free(names);
    free(pts);
    free(v.buf);
    return st;
}
