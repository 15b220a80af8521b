/* A stage of several layers costed from its single layers' costs (Alpa's
 * "profile layers and compose"): times, weights and state add up; the
 * activations add up but for what the layers pass each other (below); a
 * micro-batch's temporaries peak during some layer's backward pass, when
 * the layers after it have freed their activations.
 *
 * A layer costed as a stage of its own holds what it receives from another
 * layer in the layout it chose to receive it in, and counts it among its
 * activations when its backward pass reads it. Inside a longer stage that
 * tensor is instead the earlier layer's output, kept once in the layout
 * that layer wrote it in, and a gradient passed back between two of its
 * layers is not kept at all. The composition corrects for both, so a range
 * composed from single layers keeps the activations a solve of the whole
 * range would count for the same layouts. */
#ifndef PS_PLANNER_RANGE_COMPOSE_H
#define PS_PLANNER_RANGE_COMPOSE_H

#include <stdbool.h>

#include "core/graph.h"
#include "core/status.h"

/* One layout's costs of a slice on a mesh (per micro-batch unless said). */
typedef struct ps_stage_entry {
    bool ok;                 /* false: absent (does not fit, or no such configuration) */
    double need_bytes;       /* the fastest layout's memory, even when it does not fit */
    double time_s, update_s; /* forward + backward per micro-batch; update per step */
    double forward_s;        /* the forward part of time_s */
    double static_bytes, act_bytes, transient_bytes;
    double update_bytes; /* above static_bytes in the update, when no activations are kept */
} ps_stage_entry;

/* What one entry's layouts make of each tensor of its layer's slice, in
 * the slice's numbering: bytes[t] as held on a device, bytes[n + t] what t
 * adds to act_bytes (n: the slice's tensor count). */
typedef struct ps_entry_tensors {
    int n;
    double *bytes; /* [2 * n] */
} ps_entry_tensors;

/* The tensors that pass between two of a step's layers (each layer's ops
 * by their layer tag), with their ids in both layers' slices. */
typedef struct ps_layer_crossings ps_layer_crossings;

ps_status ps_layer_crossings_build(const ps_graph *step, ps_layer_crossings **out,
                                   ps_error *err);
int ps_layer_crossings_layers(const ps_layer_crossings *x);
void ps_layer_crossings_free(ps_layer_crossings *x);
/* How many crossings (a tensor and a layer other than its producer's that
 * reads it); for tests and logs. */
int ps_layer_crossings_count(const ps_layer_crossings *x);

/* Composes the stages first..last for every last in first+1 .. n_layers-1:
 * out[last][e] from single[q][e] and tensors[q][e] of the layers q in
 * first..last, for each of the n_entries entries (the same submesh and
 * logical mesh in every layer). out[first] is not written. Uses x's
 * scratch: calls on one x must not overlap. PS_ERR_INTERNAL when a layer's
 * tensors are not its slice's. */
ps_status ps_range_compose(ps_layer_crossings *x, int first, int n_entries,
                           const ps_stage_entry *const *single,
                           const ps_entry_tensors *const *tensors, ps_stage_entry *const *out,
                           ps_error *err);

#endif
