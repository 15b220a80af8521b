/* Logging to stderr with a level and a rank prefix; results go to stdout.
 * The threshold comes from PIPESHARD_LOG (debug|info|warn|error, default
 * warn) and is read once; the rank prefix is per thread (set by executors). */
#ifndef PS_CORE_LOG_H
#define PS_CORE_LOG_H

#include <stdbool.h>

typedef enum ps_log_level {
    PS_LOG_LEVEL_DEBUG = 0,
    PS_LOG_LEVEL_INFO = 1,
    PS_LOG_LEVEL_WARN = 2,
    PS_LOG_LEVEL_ERROR = 3,
} ps_log_level;

void ps_log_write(ps_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool ps_log_enabled(ps_log_level level);
/* Rank shown in the prefix of this thread's messages; -1 (default) hides it. */
void ps_log_set_thread_rank(int rank);
/* True when stderr is a terminal: long work then shows progress there. */
bool ps_log_progress_enabled(void);

#define PS_LOG_DEBUG(...) ps_log_write(PS_LOG_LEVEL_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define PS_LOG_INFO(...) ps_log_write(PS_LOG_LEVEL_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define PS_LOG_WARN(...) ps_log_write(PS_LOG_LEVEL_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define PS_LOG_ERROR(...) ps_log_write(PS_LOG_LEVEL_ERROR, __FILE__, __LINE__, __VA_ARGS__)

#endif
