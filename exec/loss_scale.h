/* Dynamic loss scaling's state machine (the runtime keeps one per device;
 * every device sees the same overflow votes, so all of them agree).
 *
 * A step runs at `scale`: the loss gradient is seeded with it and Adam
 * divides it out. After the step's vote:
 * - overflow (some gradient of the plan held inf or NaN): the optimizer
 *   ops were skipped; the scale halves. An overflow at the floor (1, or the
 *   initial scale when that is lower) is an error: no scale can make such a
 *   gradient finite, the step diverged;
 * - no overflow: the update was applied; after `window` of them in a row the
 *   scale doubles (up to PS_LOSS_SCALE_MAX).
 * Powers of two keep the scaling exact. */
#ifndef PS_EXEC_LOSS_SCALE_H
#define PS_EXEC_LOSS_SCALE_H

#include <stdbool.h>

#include "core/status.h"

typedef struct ps_loss_scaler {
    double scale;  /* the scale of the next step */
    double floor;  /* lowest scale before an overflow is an error */
    int window;    /* applied steps in a row that double the scale */
    int good;      /* applied steps since the last change of scale */
    int applied;   /* updates applied so far (Adam's step counter is applied + 1) */
    int skipped;   /* steps skipped so far */
} ps_loss_scaler;

void ps_loss_scaler_init(ps_loss_scaler *s, double initial, int window);
/* After step `step` (1-based, for the message), with its vote. */
ps_status ps_loss_scaler_update(ps_loss_scaler *s, bool overflow, int step, ps_error *err);

#endif
