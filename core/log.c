#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static _Thread_local int thread_rank = -1;

/* The threshold is a pure function of the environment, computed once. */
static pthread_once_t threshold_once = PTHREAD_ONCE_INIT;
static ps_log_level threshold = PS_LOG_LEVEL_WARN;

static void threshold_init(void)
{
    const char *env = getenv("PIPESHARD_LOG");
    if (env == NULL)
        return;
    if (strcasecmp(env, "debug") == 0)
        threshold = PS_LOG_LEVEL_DEBUG;
    else if (strcasecmp(env, "info") == 0)
        threshold = PS_LOG_LEVEL_INFO;
    else if (strcasecmp(env, "warn") == 0)
        threshold = PS_LOG_LEVEL_WARN;
    else if (strcasecmp(env, "error") == 0)
        threshold = PS_LOG_LEVEL_ERROR;
    else /* said once, when the level is first read (cli/main.c: at start); the default stays */
        fprintf(stderr, "pipeshard: PIPESHARD_LOG=%s is not a level (debug, info, warn, "
                        "error); using warn\n", env);
}

bool ps_log_enabled(ps_log_level level)
{
    pthread_once(&threshold_once, threshold_init);
    return level >= threshold;
}

void ps_log_set_thread_rank(int rank) { thread_rank = rank; }

bool ps_log_progress_enabled(void) { return isatty(STDERR_FILENO) != 0; }

void ps_log_write(ps_log_level level, const char *file, int line, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (!ps_log_enabled(level))
        return;
    char text[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    /* The source location is for developers: shown only at PIPESHARD_LOG=debug. */
    char where[96] = "";
    if (ps_log_enabled(PS_LOG_LEVEL_DEBUG)) {
        const char *base = strrchr(file, '/');
        base = base ? base + 1 : file;
        snprintf(where, sizeof where, " %s:%d", base, line);
    }
    if (thread_rank >= 0)
        fprintf(stderr, "pipeshard[%d] %s%s: %s\n", thread_rank, names[level], where, text);
    else
        fprintf(stderr, "pipeshard %s%s: %s\n", names[level], where, text);
}
