/* Wide-ResNet as in Alpa's benchmark (a Flax ResNet-v1 with bottleneck
 * blocks): stem conv7x7/2 + BN + relu + maxpool3x3/2, then stages of
 * bottlenecks conv1x1(f) - conv3x3(f * width, stride) - conv1x1(4f) with a
 * projection shortcut when the shape changes, f = channels * 2^stage; global
 * average pool, dense classifier, softmax cross-entropy. Convolutions have no
 * bias (BatchNorm follows each).
 *
 * Layer tags: 0 = stem, 1..n = one per bottleneck block, n+1 = head. */
#include <stdio.h>

#include "planner/models/builder.h"
#include "planner/models/zoo.h"

static int conv_bn(ps_model_builder *b, const char *name, int x, int64_t out_ch, int k,
                   int stride, bool relu)
{
    if (b->st != PS_OK || x < 0)
        return -1;
    int64_t in_ch = b->g->tensors[x].desc.shape[1];
    char n[128];
    snprintf(n, sizeof n, "%s.w", name);
    int w = ps_mb_param(b, n, 4, (int64_t[]){out_ch, in_ch, k, k});
    ps_op_attrs a = ps_op_attrs_default(PS_OP_CONV2D);
    a.stride[0] = a.stride[1] = stride;
    a.pad[0] = a.pad[1] = k / 2;
    int y = ps_mb_op(b, PS_OP_CONV2D, name, &a, 2, (int[]){x, w}, 0);
    snprintf(n, sizeof n, "%s.bn.gamma", name);
    int gamma = ps_mb_param(b, n, 1, &out_ch);
    snprintf(n, sizeof n, "%s.bn.beta", name);
    int beta = ps_mb_param(b, n, 1, &out_ch);
    snprintf(n, sizeof n, "%s.bn", name);
    y = ps_mb_op(b, PS_OP_BATCHNORM, n, NULL, 3, (int[]){y, gamma, beta}, 0);
    if (relu) {
        snprintf(n, sizeof n, "%s.relu", name);
        y = ps_mb_unary(b, PS_OP_RELU, n, y);
    }
    return y;
}

static int bottleneck(ps_model_builder *b, int x, int64_t f, int64_t width, int stride)
{
    if (b->st != PS_OK)
        return -1;
    const ps_tensor_desc in = b->g->tensors[x].desc;
    int y = conv_bn(b, "conv1", x, f, 1, 1, true);
    y = conv_bn(b, "conv2", y, f * width, 3, stride, true);
    y = conv_bn(b, "conv3", y, 4 * f, 1, 1, false);
    int shortcut = x;
    if (in.shape[1] != 4 * f || stride != 1)
        shortcut = conv_bn(b, "proj", x, 4 * f, 1, stride, false);
    y = ps_mb_binary(b, PS_OP_ADD, "residual", shortcut, y);
    return ps_mb_unary(b, PS_OP_RELU, "relu", y);
}

ps_status ps_model_build_wresnet(const ps_model_config *c, ps_graph *g, ps_error *err)
{
    static const int stages50[4] = {3, 4, 6, 3}, stages101[4] = {3, 4, 23, 3},
                     stages152[4] = {3, 8, 36, 3};
    const int *stages = c->layers == 50 ? stages50 : c->layers == 101 ? stages101 : stages152;
    ps_model_builder mb, *b = &mb;
    ps_mb_init(b, g, c->dtype, err);
    int64_t B = c->batch, px = c->image_size;

    ps_mb_scope(b, 0, "stem.");
    int x = ps_mb_input(b, "images", c->dtype, 4, (int64_t[]){B, 3, px, px});
    x = conv_bn(b, "conv", x, c->channels, 7, 2, true);
    ps_op_attrs pool = ps_op_attrs_default(PS_OP_POOL);
    pool.pool = PS_POOL_MAX;
    pool.window[0] = pool.window[1] = 3;
    pool.stride[0] = pool.stride[1] = 2;
    pool.pad[0] = pool.pad[1] = 1;
    x = ps_mb_op(b, PS_OP_POOL, "maxpool", &pool, 1, &x, 0);
    int layer = 1;
    for (int s = 0; s < 4; s++) {
        for (int j = 0; j < stages[s]; j++, layer++) {
            char prefix[48];
            snprintf(prefix, sizeof prefix, "stage%d.block%d.", s + 1, j + 1);
            ps_mb_scope(b, layer, prefix);
            x = bottleneck(b, x, c->channels << s, c->width_factor, s > 0 && j == 0 ? 2 : 1);
        }
    }
    ps_mb_scope(b, layer, "head.");
    ps_op_attrs mean = ps_op_attrs_default(PS_OP_REDUCE);
    mean.reduce = PS_REDUCE_MEAN;
    mean.axes = (1u << 2) | (1u << 3);
    x = ps_mb_op(b, PS_OP_REDUCE, "avgpool", &mean, 1, &x, 0);
    x = ps_mb_dense(b, "fc", x, c->classes, true);
    int labels = ps_mb_input(b, "labels", PS_DTYPE_I32, 1, &B);
    int loss = ps_mb_binary(b, PS_OP_SOFTMAX_XENT, "loss", x, labels);
    if (b->st == PS_OK)
        g->loss = loss;
    return b->st;
}
