/* Status codes and error reports shared by every module.
 *
 * Functions return ps_status (0 = OK, negative = failure) and hand results back
 * through out-parameters. Failures that a user must read (a bad file, a bad
 * option) also fill a ps_error, whose message is already formatted as
 * "FILE:LINE:COL: what is wrong" (or just "what is wrong" when no file is
 * involved); main prints it after "pipeshard: ". */
#ifndef PS_CORE_STATUS_H
#define PS_CORE_STATUS_H

#include <stdarg.h>

typedef enum ps_status {
    PS_OK = 0,
    PS_ERR_INVALID = -1,     /* bad argument or malformed input */
    PS_ERR_PARSE = -2,       /* syntactically broken file */
    PS_ERR_IO = -3,          /* cannot open, read or write a file */
    PS_ERR_NOMEM = -4,       /* allocation failed */
    PS_ERR_NOT_FOUND = -5,   /* unknown name (model, preset, key) */
    PS_ERR_UNSUPPORTED = -6, /* valid request this build cannot serve */
    PS_ERR_INFEASIBLE = -7,  /* no solution (e.g. memory budget) */
    PS_ERR_INTERNAL = -8,    /* a bug: an invariant did not hold */
    PS_ERR_DEVICE = -9,      /* accelerator or communication failure */
} ps_status;

#define PS_ERROR_MSG_MAX 1024

/* A user-facing error. Zero-initialize it; the first error set wins, so the
 * innermost (most precise) report survives while callers propagate. */
typedef struct ps_error {
    ps_status status;
    char msg[PS_ERROR_MSG_MAX];
} ps_error;

const char *ps_status_str(ps_status st);

/* Records an error (unless one is already recorded) and returns st, so that a
 * failing path can be written as `return ps_error_set(err, PS_ERR_INVALID, ...)`.
 * err may be NULL: the status is still returned. */
ps_status ps_error_set(ps_error *err, ps_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
ps_status ps_error_vset(ps_error *err, ps_status st, const char *fmt, va_list ap);
void ps_error_clear(ps_error *err);

/* Propagates a failure to the function's single `out:` label; the function
 * must declare `ps_status st`. */
#define PS_TRY(expr)                                                          \
    do {                                                                      \
        ps_status ps_try_st_ = (expr);                                        \
        if (ps_try_st_ != PS_OK) {                                            \
            st = ps_try_st_;                                                  \
            goto out;                                                         \
        }                                                                     \
    } while (0)

/* Returns a failure at once (functions without cleanup). */
#define PS_TRY_RET(expr)                                                      \
    do {                                                                      \
        ps_status ps_try_st_ = (expr);                                        \
        if (ps_try_st_ != PS_OK)                                              \
            return ps_try_st_;                                                \
    } while (0)

/* Jumps to `out:` with PS_ERR_NOMEM when an allocation returned NULL. */
#define PS_TRY_ALLOC(ptr, err)                                                \
    do {                                                                      \
        if ((ptr) == NULL) {                                                  \
            st = ps_error_set((err), PS_ERR_NOMEM, "out of memory");          \
            goto out;                                                         \
        }                                                                     \
    } while (0)

#endif
