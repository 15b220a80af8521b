/* ps_sim_run: SimGrid keeps one engine per process that cannot be
 * restarted, so every simulation runs in a forked child. The parent writes
 * the platform XML (a temporary file it removes afterwards, whatever the
 * child did), forks, and reads back two pipes: the child's results (a
 * binary blob: header, then one record per device) and its stderr (kept
 * for error reports; forwarded live with progress or PIPESHARD_LOG=debug).
 * The child leaves with _exit, skipping atexit handlers: nothing of
 * SimGrid's is torn down, and LeakSanitizer does not run there. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/clock.h"
#include "sim/sim_internal.h"
#include "traces/program_summary.h"

#define BLOB_MAGIC 0x70737331u /* "pss1" */

typedef struct blob_header {
    uint32_t magic;
    int32_t status;
    int32_t n_devices;
    int32_t reserved;
    double iteration_s, load_s, wall_s, peak_rss_bytes, cpu_s;
    int64_t events;
    char error[PS_ERROR_MSG_MAX];
} blob_header;

/* The last bytes of the child's stderr, for error messages. */
#define TAIL_BYTES 16384

typedef struct child_output {
    unsigned char *blob;
    size_t blob_len, blob_cap;
    char tail[TAIL_BYTES];
    size_t tail_len;
} child_output;

ps_sim_options ps_sim_options_default(void)
{
    return (ps_sim_options){.trace_path = NULL, .collective_steps = false, .progress = false};
}


static bool write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

static void child_main(const ps_program_set *s, const ps_cluster *c, const ps_sim_options *o,
                       const char *platform_path, int out_fd)
{
    ps_error err = {0};
    ps_sim_result res = {.n_devices = s->n_devices};
    res.devices = calloc((size_t)(s->n_devices > 0 ? s->n_devices : 1), sizeof *res.devices);
    ps_status st = res.devices == NULL ? ps_error_set(&err, PS_ERR_NOMEM, "out of memory")
                                       : ps_sim_replay(s, c, o, platform_path, &res, &err);
    struct rusage ru;
    bool ru_ok = getrusage(RUSAGE_SELF, &ru) == 0;
    double rss = ru_ok ? (double)ru.ru_maxrss * 1024.0 : 0;
    /* CPU time of this process alone (it starts at zero after fork): what a
     * shared machine does not inflate the way it does wall time */
    double cpu = ru_ok ? (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
                             (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec
                       : 0;
    blob_header h = {.magic = BLOB_MAGIC,
                     .status = st,
                     .n_devices = s->n_devices,
                     .iteration_s = res.iteration_s,
                     .load_s = res.load_s,
                     .wall_s = res.wall_s,
                     .peak_rss_bytes = rss,
                     .cpu_s = cpu,
                     .events = res.events};
    if (st != PS_OK)
        snprintf(h.error, sizeof h.error, "%s", err.msg[0] ? err.msg : ps_status_str(st));
    bool ok = write_all(out_fd, &h, sizeof h);
    if (ok && st == PS_OK)
        ok = write_all(out_fd, res.devices, (size_t)s->n_devices * sizeof *res.devices);
    fflush(stderr);
    _exit(ok && st == PS_OK ? 0 : 1);
}

static void keep_tail(child_output *co, const char *buf, size_t n)
{
    if (n >= TAIL_BYTES) {
        memcpy(co->tail, buf + n - TAIL_BYTES, TAIL_BYTES);
        co->tail_len = TAIL_BYTES;
        return;
    }
    if (co->tail_len + n > TAIL_BYTES) {
        size_t drop = co->tail_len + n - TAIL_BYTES;
        memmove(co->tail, co->tail + drop, co->tail_len - drop);
        co->tail_len -= drop;
    }
    memcpy(co->tail + co->tail_len, buf, n);
    co->tail_len += n;
}

/* Reads both pipes to their end. */
static ps_status read_child(int blob_fd, int err_fd, bool forward, child_output *co, ps_error *err)
{
    struct pollfd fds[2] = {{.fd = blob_fd, .events = POLLIN}, {.fd = err_fd, .events = POLLIN}};
    char buf[65536];
    while (fds[0].fd >= 0 || fds[1].fd >= 0) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return ps_error_set(err, PS_ERR_IO, "reading the simulator process: %s",
                                strerror(errno));
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || fds[i].revents == 0)
                continue;
            ssize_t n = read(fds[i].fd, buf, sizeof buf);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                fds[i].fd = -1; /* poll ignores negative descriptors */
                continue;
            }
            if (i == 1) {
                keep_tail(co, buf, (size_t)n);
                if (forward)
                    (void)!write(STDERR_FILENO, buf, (size_t)n);
                continue;
            }
            if (co->blob_len + (size_t)n > co->blob_cap) {
                size_t cap = co->blob_cap ? 2 * co->blob_cap : 65536;
                while (cap < co->blob_len + (size_t)n)
                    cap *= 2;
                unsigned char *b = realloc(co->blob, cap);
                if (b == NULL)
                    return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
                co->blob = b;
                co->blob_cap = cap;
            }
            memcpy(co->blob + co->blob_len, buf, (size_t)n);
            co->blob_len += (size_t)n;
        }
    }
    return PS_OK;
}

static bool contains(const char *text, size_t len, const char *word)
{
    size_t w = strlen(word);
    for (size_t i = 0; i + w <= len; i++)
        if (memcmp(text + i, word, w) == 0)
            return true;
    return false;
}

/* "; it said: ..." from the child's stderr tail: its last lines that
 * report a failure (SimGrid marks them CRITICAL or ERROR), else its last
 * lines, backtraces left out; "" when it said nothing. */
static void tail_note(const child_output *co, char *out, size_t size)
{
    char kept[2][TAIL_BYTES + 1]; /* [0]: failure lines, [1]: any line */
    size_t n[2] = {0, 0};
    size_t i = 0;
    if (co->tail_len == TAIL_BYTES) /* the first line may be cut: skip it */
        while (i < co->tail_len && co->tail[i++] != '\n')
            ;
    while (i < co->tail_len) {
        size_t j = i;
        while (j < co->tail_len && co->tail[j] != '\n')
            j++;
        const char *line = co->tail + i;
        size_t len = j - i;
        i = j + 1;
        if (len == 0 || (len >= 4 && memcmp(line, "  ->", 4) == 0) ||
            (len >= 9 && memcmp(line, "Backtrace", 9) == 0))
            continue;
        bool failure = contains(line, len, "CRITICAL") || contains(line, len, "ERROR");
        for (int k = failure ? 0 : 1; k < 2; k++) {
            if (n[k] > 0)
                kept[k][n[k]++] = ' ';
            memcpy(kept[k] + n[k], line, len);
            n[k] += len;
        }
    }
    out[0] = '\0';
    int k = n[0] > 0 ? 0 : 1;
    if (n[k] == 0)
        return;
    size_t keep = n[k] < 400 ? n[k] : 400;
    snprintf(out, size, "; it said: %.*s", (int)keep, kept[k] + n[k] - keep);
}

static ps_status summarize(const ps_program_set *s, const ps_cluster *c, const blob_header *h,
                           const ps_sim_device_result *dev, ps_summary **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_summary *sum = NULL;
    PS_TRY(ps_summary_from_programs(s, "sim", c->name, c->devices_per_node, &sum, err));
    sum->iteration_s = h->iteration_s;
    sum->wall_s = h->wall_s;
    for (int d = 0; d < s->n_devices; d++) {
        ps_summary_device *sd = &sum->devices[d];
        const ps_sim_device_result *r = &dev[d];
        sd->compute_s = r->compute_s;
        sd->comm_s = r->comm_s;
        sd->idle_s = fmax(0.0, h->iteration_s - r->compute_s - r->comm_s);
        sd->peak_memory_bytes = r->peak_memory_bytes;
        sum->peak_memory_bytes = fmax(sum->peak_memory_bytes, r->peak_memory_bytes);
        if (sd->stage >= 0)
            sum->stages[sd->stage].peak_memory_bytes =
                fmax(sum->stages[sd->stage].peak_memory_bytes, r->peak_memory_bytes);
    }
    /* a stage's phase: its slowest device's mean run (each less its waits
     * for peers, sim/replay.c), as the executors measure it */
    for (int i = 0; i < s->n_stages; i++) {
        ps_summary_stage *g = &sum->stages[i];
        double slowest[PS_PHASE_COUNT] = {0};
        for (int d = 0; d < s->n_devices; d++) {
            if (sum->devices[d].stage != i)
                continue;
            for (int ph = 0; ph < PS_PHASE_COUNT; ph++)
                if (dev[d].phase_runs[ph] > 0)
                    slowest[ph] =
                        fmax(slowest[ph], dev[d].phase_sum_s[ph] / dev[d].phase_runs[ph]);
        }
        g->forward_s = slowest[PS_PHASE_FORWARD];
        g->backward_s = slowest[PS_PHASE_BACKWARD];
        g->update_s = slowest[PS_PHASE_UPDATE];
        g->time_s = g->forward_s + g->backward_s;
    }
    ps_summary_set_throughput(sum, s);
    *out = sum;
    sum = NULL;
out:
    ps_summary_free(sum);
    return st;
}

static ps_status write_platform(const ps_cluster *c, char *path, size_t size, ps_error *err)
{
    const char *dir = getenv("TMPDIR");
    if (dir == NULL || dir[0] == '\0')
        dir = "/tmp";
    if ((size_t)snprintf(path, size, "%s/pipeshard-sim-XXXXXX", dir) >= size)
        return ps_error_set(err, PS_ERR_IO, "TMPDIR is too long");
    int fd = mkstemp(path);
    if (fd < 0) {
        ps_status st = ps_error_set(err, PS_ERR_IO, "%s: %s", path, strerror(errno));
        path[0] = '\0';
        return st;
    }
    FILE *f = fdopen(fd, "w");
    if (f == NULL) {
        close(fd);
        return ps_error_set(err, PS_ERR_IO, "%s: %s", path, strerror(errno));
    }
    ps_status st = ps_sim_platform_write(c, f, err);
    if (fclose(f) != 0 && st == PS_OK)
        st = ps_error_set(err, PS_ERR_IO, "%s: %s", path, strerror(errno));
    return st;
}

ps_status ps_sim_run(const ps_program_set *programs, const ps_cluster *c, const ps_sim_options *o,
                     ps_summary **summary_out, ps_sim_stats *stats_out, ps_error *err)
{
    ps_status st = PS_OK;
    char path[4096] = "";
    int blob_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    child_output co = {0};
    pid_t pid = -1;
    ps_sim_options defaults = ps_sim_options_default();
    if (o == NULL)
        o = &defaults;
    *summary_out = NULL;
    if (programs->n_devices < 1 || programs->n_devices > ps_cluster_device_count(c)) {
        st = ps_error_set(err, PS_ERR_INVALID, "the programs are for %d devices, cluster %s has %d",
                          programs->n_devices, c->name, ps_cluster_device_count(c));
        goto out;
    }
    double t0 = ps_monotonic_s();
    PS_TRY(write_platform(c, path, sizeof path, err));
    double platform_write_s = ps_monotonic_s() - t0;

    if (pipe(blob_pipe) != 0 || pipe(err_pipe) != 0) {
        st = ps_error_set(err, PS_ERR_IO, "pipe: %s", strerror(errno));
        goto out;
    }
    fflush(NULL); /* or the child would write the parent's buffered output again */
    pid = fork();
    if (pid < 0) {
        st = ps_error_set(err, PS_ERR_IO, "fork: %s", strerror(errno));
        goto out;
    }
    if (pid == 0) {
        close(blob_pipe[0]);
        close(err_pipe[0]);
        dup2(err_pipe[1], STDERR_FILENO);
        close(err_pipe[1]);
        child_main(programs, c, o, path, blob_pipe[1]); /* does not return */
    }
    close(blob_pipe[1]);
    close(err_pipe[1]);
    blob_pipe[1] = err_pipe[1] = -1;
    /* meanwhile the child simulates: it may fill its pipes and wait for the
     * reads below, which only delays it */
    if (o->check_programs)
        PS_TRY(ps_program_set_check(programs, NULL, err));
    const char *log = getenv("PIPESHARD_LOG");
    bool forward = o->progress || (log != NULL && strcmp(log, "debug") == 0);
    ps_status read_st = read_child(blob_pipe[0], err_pipe[0], forward, &co, err);
    int wstatus = 0;
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR)
        ;
    pid = -1;
    PS_TRY(read_st);

    char note[512];
    tail_note(&co, note, sizeof note);
    const blob_header *h = co.blob_len >= sizeof(blob_header) ? (const blob_header *)co.blob : NULL;
    if (h != NULL && h->magic != BLOB_MAGIC)
        h = NULL;
    if (WIFSIGNALED(wstatus)) {
        int sig = WTERMSIG(wstatus);
        st = ps_error_set(err, PS_ERR_INTERNAL, "the simulator process died of signal %d (%s)%s",
                          sig, strsignal(sig), note);
        goto out;
    }
    if (h != NULL && h->status != PS_OK) {
        st = ps_error_set(err, (ps_status)h->status, "%.*s", (int)sizeof h->error, h->error);
        goto out;
    }
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0 || h == NULL ||
        co.blob_len != sizeof *h + (size_t)programs->n_devices * sizeof(ps_sim_device_result)) {
        st = ps_error_set(err, PS_ERR_INTERNAL,
                          "the simulator process exited with status %d without results%s",
                          WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1, note);
        goto out;
    }
    /* the records follow the header; copy them out to keep them aligned */
    ps_sim_device_result *dev = malloc((size_t)programs->n_devices * sizeof *dev);
    PS_TRY_ALLOC(dev, err);
    memcpy(dev, co.blob + sizeof *h, (size_t)programs->n_devices * sizeof *dev);
    st = summarize(programs, c, h, dev, summary_out, err);
    free(dev);
    if (st != PS_OK)
        goto out;
    if (stats_out != NULL) {
        stats_out->wall_s = h->wall_s;
        stats_out->platform_s = platform_write_s + h->load_s;
        stats_out->events = h->events;
        stats_out->events_per_s = h->wall_s > 0 ? (double)h->events / h->wall_s : 0;
        stats_out->peak_rss_bytes = h->peak_rss_bytes;
        stats_out->cpu_s = h->cpu_s;
    }
out:
    if (pid > 0) { /* failed after fork: do not leave the child behind */
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    for (int i = 0; i < 2; i++) {
        if (blob_pipe[i] >= 0)
            close(blob_pipe[i]);
        if (err_pipe[i] >= 0)
            close(err_pipe[i]);
    }
    if (path[0] != '\0')
        unlink(path);
    free(co.blob);
    return st;
}
