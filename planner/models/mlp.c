/* The MLP of Alpa's pipeshard tutorial: per layer Dense(4h)-relu-Dense(h)-relu,
 * a manual pipeline boundary between layers, MSE against a target y. */
#include <stdio.h>

#include "planner/models/builder.h"
#include "planner/models/zoo.h"

ps_status ps_model_build_mlp(const ps_model_config *c, ps_graph *g, ps_error *err)
{
    ps_model_builder mb, *b = &mb;
    ps_mb_init(b, g, c->dtype, err);
    int64_t h = c->hidden;
    int x = ps_mb_input(b, "x", c->dtype, 2, (int64_t[]){c->batch, h});
    int y = ps_mb_input(b, "y", c->dtype, 2, (int64_t[]){c->batch, h});
    for (int l = 0; l < c->layers; l++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "layer%d.", l);
        ps_mb_scope(b, l, prefix);
        x = ps_mb_dense(b, "dense1", x, 4 * h, true);
        x = ps_mb_unary(b, PS_OP_RELU, "relu1", x);
        x = ps_mb_dense(b, "dense2", x, h, true);
        x = ps_mb_unary(b, PS_OP_RELU, "relu2", x);
        if (l + 1 < c->layers)
            ps_mb_boundary(b);
    }
    ps_mb_scope(b, (int)c->layers - 1, "");
    int loss = ps_mb_binary(b, PS_OP_MSE_LOSS, "loss", x, y);
    if (b->st == PS_OK)
        g->loss = loss;
    return b->st;
}
