#include "core/status.h"

#include <stdio.h>
#include <string.h>

const char *ps_status_str(ps_status st)
{
    switch (st) {
    case PS_OK: return "ok";
    case PS_ERR_INVALID: return "invalid input";
    case PS_ERR_PARSE: return "parse error";
    case PS_ERR_IO: return "i/o error";
    case PS_ERR_NOMEM: return "out of memory";
    case PS_ERR_NOT_FOUND: return "not found";
    case PS_ERR_UNSUPPORTED: return "unsupported";
    case PS_ERR_INFEASIBLE: return "infeasible";
    case PS_ERR_INTERNAL: return "internal error";
    case PS_ERR_DEVICE: return "device error";
    }
    return "unknown status";
}

ps_status ps_error_vset(ps_error *err, ps_status st, const char *fmt, va_list ap)
{
    if (err == NULL || err->status != PS_OK)
        return st;
    err->status = st;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return st;
}

ps_status ps_error_set(ps_error *err, ps_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ps_error_vset(err, st, fmt, ap);
    va_end(ap);
    return st;
}

void ps_error_clear(ps_error *err)
{
    if (err == NULL)
        return;
    err->status = PS_OK;
    err->msg[0] = '\0';
}
