/* GPT (pre-LayerNorm decoder, learned positions, tied input/output embedding)
 * and its GShard MoE variant, where every block's feed-forward network is a
 * top-k routed mixture of experts over groups of `expert_group` tokens.
 *
 * Layer tags: 0 = embeddings, 1..L = blocks, L+1 = final norm, logits, loss. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "planner/models/builder.h"
#include "planner/models/zoo.h"

static int attention(ps_model_builder *b, const ps_model_config *c, int x)
{
    int64_t B = c->batch, s = c->seq, h = c->hidden, a = c->heads, d = h / a;
    int64_t split[4] = {B, s, a, d};
    int ln = ps_mb_layernorm(b, "ln1", x);
    int q = ps_mb_reshape(b, "q.heads", ps_mb_dense(b, "q", ln, h, true), 4, split);
    int k = ps_mb_reshape(b, "k.heads", ps_mb_dense(b, "k", ln, h, true), 4, split);
    int v = ps_mb_reshape(b, "v.heads", ps_mb_dense(b, "v", ln, h, true), 4, split);
    /* labels: b batch, q/k query/key position, a head, d head dim */
    int scores = ps_mb_matmul(b, "scores", "bqad,bkad->baqk", q, k);
    ps_op_attrs sm = ps_op_attrs_default(PS_OP_SOFTMAX);
    sm.scale = 1.0 / sqrt((double)d);
    sm.causal = true;
    int probs = ps_mb_op(b, PS_OP_SOFTMAX, "probs", &sm, 1, &scores, 0);
    int ctx = ps_mb_matmul(b, "context", "baqk,bkad->bqad", probs, v);
    ctx = ps_mb_reshape(b, "context.merge", ctx, 3, (int64_t[]){B, s, h});
    int o = ps_mb_dense(b, "out", ctx, h, true);
    return ps_mb_binary(b, PS_OP_ADD, "residual1", x, o);
}

static int dense_ffn(ps_model_builder *b, const ps_model_config *c, int x)
{
    int f = ps_mb_dense(b, "fc1", x, c->ffn, true);
    f = ps_mb_unary(b, PS_OP_GELU, "gelu", f);
    return ps_mb_dense(b, "fc2", f, c->hidden, true);
}

/* Tokens per routing group: the configured group, shrunk to divide the
 * micro-batch's tokens (small micro-batches form fewer, smaller groups). */
static int64_t group_size(const ps_model_config *c)
{
    int64_t tokens = c->batch * c->seq;
    int64_t S = c->expert_group < tokens ? c->expert_group : tokens;
    while (tokens % S != 0)
        S--;
    return S;
}

static int moe_ffn(ps_model_builder *b, const ps_model_config *c, int x)
{
    int64_t h = c->hidden, E = c->experts, S = group_size(c);
    int64_t G = c->batch * c->seq / S;
    int64_t C = (int64_t)ceil(c->capacity_factor * (double)c->top_k * (double)S / (double)E);
    if (C < 1)
        C = 1;
    int t = ps_mb_reshape(b, "groups", x, 3, (int64_t[]){G, S, h});
    int wg = ps_mb_param(b, "gate.w", 2, (int64_t[]){h, E});
    int logits = ps_mb_matmul(b, "gate", "gsm,me->gse", t, wg);
    ps_op_attrs ga = ps_op_attrs_default(PS_OP_MOE_GATE);
    ga.top_k = (int)c->top_k;
    ga.experts = E;
    ga.capacity = C;
    int slot = ps_mb_op(b, PS_OP_MOE_GATE, "route", &ga, 1, &logits, 0);
    int weight = b->st == PS_OK ? b->g->tensors[slot].producer : -1;
    weight = weight >= 0 ? b->g->ops[weight].out[1] : -1;
    ps_op_attrs da = ps_op_attrs_default(PS_OP_MOE_DISPATCH);
    da.experts = E;
    da.capacity = C;
    int disp = ps_mb_op(b, PS_OP_MOE_DISPATCH, "dispatch", &da, 2, (int[]){t, slot}, 0);
    int w1 = ps_mb_param(b, "experts.w1", 3, (int64_t[]){E, h, c->ffn});
    int w2 = ps_mb_param(b, "experts.w2", 3, (int64_t[]){E, c->ffn, h});
    int f = ps_mb_matmul(b, "experts.fc1", "egcm,emf->egcf", disp, w1);
    f = ps_mb_unary(b, PS_OP_GELU, "experts.gelu", f);
    f = ps_mb_matmul(b, "experts.fc2", "egcf,efm->egcm", f, w2);
    int z = ps_mb_op(b, PS_OP_MOE_COMBINE, "combine", NULL, 3, (int[]){f, slot, weight}, 0);
    return ps_mb_reshape(b, "combine.merge", z, 3, (int64_t[]){c->batch, c->seq, h});
}

ps_status ps_model_build_transformer(const ps_model_config *c, ps_graph *g, ps_error *err)
{
    ps_model_builder mb, *b = &mb;
    ps_mb_init(b, g, c->dtype, err);
    int64_t B = c->batch, s = c->seq, h = c->hidden;
    int L = (int)c->layers;

    ps_mb_scope(b, 0, "");
    int tokens = ps_mb_input(b, "tokens", PS_DTYPE_I32, 2, (int64_t[]){B, s});
    int positions = ps_mb_input(b, "positions", PS_DTYPE_I32, 2, (int64_t[]){B, s});
    int wte = ps_mb_param(b, "wte", 2, (int64_t[]){c->vocab, h});
    int wpe = ps_mb_param(b, "wpe", 2, (int64_t[]){s, h});
    int x = ps_mb_binary(b, PS_OP_ADD, "embed",
                         ps_mb_binary(b, PS_OP_EMBEDDING, "embed.tokens", wte, tokens),
                         ps_mb_binary(b, PS_OP_EMBEDDING, "embed.positions", wpe, positions));
    for (int l = 1; l <= L; l++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "block%d.", l);
        ps_mb_scope(b, l, prefix);
        x = attention(b, c, x);
        int ln = ps_mb_layernorm(b, "ln2", x);
        int f = c->family == PS_MODEL_MOE ? moe_ffn(b, c, ln) : dense_ffn(b, c, ln);
        x = ps_mb_binary(b, PS_OP_ADD, "residual2", x, f);
    }
    ps_mb_scope(b, L + 1, "head.");
    int labels = ps_mb_input(b, "labels", PS_DTYPE_I32, 2, (int64_t[]){B, s});
    x = ps_mb_layernorm(b, "ln_f", x);
    int logits = ps_mb_matmul(b, "logits", "bsh,vh->bsv", x, wte);
    int loss = ps_mb_binary(b, PS_OP_SOFTMAX_XENT, "loss", logits, labels);
    if (b->st == PS_OK)
        g->loss = loss;
    return b->st;
}
