#include "exec/loss_scale.h"

#include "core/op.h"

void ps_loss_scaler_init(ps_loss_scaler *s, double initial, int window)
{
    s->scale = initial;
    s->floor = initial < 1 ? initial : 1;
    s->window = window > 0 ? window : 1;
    s->good = s->applied = s->skipped = 0;
}

ps_status ps_loss_scaler_update(ps_loss_scaler *s, bool overflow, int step, ps_error *err)
{
    if (overflow) {
        if (s->scale <= s->floor)
            return ps_error_set(err, PS_ERR_INVALID,
                                "step %d: a gradient holds inf or NaN at the loss scale %g, the "
                                "lowest the dynamic scaling goes to: the step diverged",
                                step, s->scale);
        s->scale = s->scale / 2 > s->floor ? s->scale / 2 : s->floor;
        s->good = 0;
        s->skipped++;
        return PS_OK;
    }
    s->applied++;
    if (++s->good >= s->window) {
        s->good = 0;
        if (s->scale * 2 <= PS_LOSS_SCALE_MAX)
            s->scale *= 2;
    }
    return PS_OK;
}
