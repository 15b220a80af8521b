#include "planner/models/zoo.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"

const char *const ps_model_family_names[PS_MODEL_FAMILY_COUNT] = {"mlp", "gpt", "moe",
                                                                  "wresnet"};

#define F32 PS_DTYPE_F32
#define F16 PS_DTYPE_F16

/* GPT: seq 1024, vocab 51200, global batch 1024 (Alpa's suite); the GPT-3
 * family uses seq 2048 and the global batches of GPT-3 / MT-NLG / Megatron. */
#define GPT(n, h, l, a, s, gb, desc)                                                          \
    {n, desc,                                                                                 \
     {.family = PS_MODEL_GPT, .name = n, .batch = gb, .global_batch = gb, .hidden = h,        \
      .layers = l, .heads = a, .seq = s, .vocab = 51200, .ffn = 4 * (h), .dtype = F16}}
/* MoE: seq 1024, 16 heads, vocab 32000, expert group 2048, top-2, batch 1024. */
#define MOE(n, h, l, e, desc)                                                                 \
    {n, desc,                                                                                 \
     {.family = PS_MODEL_MOE, .name = n, .batch = 1024, .global_batch = 1024, .hidden = h,    \
      .layers = l, .heads = 16, .seq = 1024, .vocab = 32000, .ffn = 4 * (h), .experts = e,    \
      .expert_group = 2048, .top_k = 2, .capacity_factor = 1.0, .dtype = F16}}
/* Wide-ResNet: 224 px images, fp32, 1024 classes, global batch 1536. */
#define WRN(n, l, c, w, desc)                                                                 \
    {n, desc,                                                                                 \
     {.family = PS_MODEL_WRESNET, .name = n, .batch = 1536, .global_batch = 1536,             \
      .layers = l, .image_size = 224, .channels = c, .width_factor = w, .classes = 1024,      \
      .dtype = F32}}

static const ps_zoo_entry zoo[] = {
    {"mlp", "Alpa pipeshard tutorial: 2 x (Dense(4h)-relu-Dense(h)-relu), MSE, 1 boundary",
     {.family = PS_MODEL_MLP, .name = "mlp", .batch = 2048, .global_batch = 2048,
      .hidden = 2048, .layers = 2, .dtype = F32}},
    GPT("gpt-350m", 1024, 24, 16, 1024, 1024, "GPT 350M (Alpa suite)"),
    GPT("gpt-760m", 1536, 24, 16, 1024, 1024, "GPT 760M (Alpa suite)"),
    GPT("gpt-1.3b", 2048, 24, 32, 1024, 1024, "GPT 1.3B (Alpa suite)"),
    GPT("gpt-2.6b", 2560, 32, 32, 1024, 1024, "GPT 2.6B (Alpa suite)"),
    GPT("gpt-6.7b", 4096, 32, 32, 1024, 1024, "GPT 6.7B (Alpa suite)"),
    GPT("gpt-15b", 5120, 48, 40, 1024, 1024, "GPT 15B (Alpa suite)"),
    GPT("gpt-39b", 8192, 48, 64, 1024, 1024, "GPT 39B (Alpa suite)"),
    GPT("gpt-76b", 10240, 60, 80, 1024, 1024, "GPT 76B (Alpa suite)"),
    GPT("gpt-175b", 12288, 96, 96, 2048, 1536, "GPT-3 175B"),
    GPT("gpt-530b", 20480, 105, 128, 2048, 1920, "Megatron-Turing NLG 530B"),
    GPT("gpt-1t", 25600, 128, 160, 2048, 3072, "GPT 1T (Megatron-LM scaling study)"),
    MOE("moe-380m", 768, 8, 8, "GShard MoE 380M (Alpa suite)"),
    MOE("moe-690m", 768, 8, 16, "GShard MoE 690M (Alpa suite)"),
    MOE("moe-1.3b", 768, 16, 16, "GShard MoE 1.3B (Alpa suite)"),
    MOE("moe-2.4b", 1024, 16, 16, "GShard MoE 2.4B (Alpa suite)"),
    MOE("moe-10b", 1536, 16, 32, "GShard MoE 10B (Alpa suite)"),
    MOE("moe-27b", 2048, 16, 48, "GShard MoE 27B (Alpa suite)"),
    MOE("moe-70b", 2048, 32, 64, "GShard MoE 70B (Alpa suite)"),
    WRN("wresnet-250m", 50, 160, 2, "Wide-ResNet 250M (Alpa suite)"),
    WRN("wresnet-500m", 50, 224, 2, "Wide-ResNet 500M (Alpa suite)"),
    WRN("wresnet-1b", 50, 320, 2, "Wide-ResNet 1B (Alpa suite)"),
    WRN("wresnet-2b", 50, 448, 2, "Wide-ResNet 2B (Alpa suite)"),
    WRN("wresnet-4b", 50, 640, 2, "Wide-ResNet 4B (Alpa suite)"),
    WRN("wresnet-6.8b", 50, 320, 16, "Wide-ResNet 6.8B (Alpa suite)"),
    WRN("wresnet-13b", 101, 320, 16, "Wide-ResNet 13B (Alpa suite)"),
};

int ps_zoo_count(void) { return (int)(sizeof zoo / sizeof zoo[0]); }

const ps_zoo_entry *ps_zoo_get(int i)
{
    return i >= 0 && i < ps_zoo_count() ? &zoo[i] : NULL;
}

ps_status ps_zoo_lookup(const char *name, ps_model_config *out, ps_error *err)
{
    for (int i = 0; i < ps_zoo_count(); i++) {
        if (strcmp(zoo[i].name, name) == 0) {
            *out = zoo[i].config;
            return PS_OK;
        }
    }
    char list[1024] = "";
    size_t used = 0;
    for (int i = 0; i < ps_zoo_count() && used + 1 < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                 zoo[i].name);
    return ps_error_set(err, PS_ERR_NOT_FOUND, "unknown model \"%s\" (known: %s)", name, list);
}

#define LIMIT (INT64_C(1) << 31)
#define NEED(cond, ...)                                                                       \
    do {                                                                                      \
        if (!(cond))                                                                          \
            return ps_error_set(err, PS_ERR_INVALID, __VA_ARGS__);                            \
    } while (0)

static bool in_range(int64_t v) { return v >= 1 && v <= LIMIT; }

ps_status ps_model_config_validate(const ps_model_config *c, ps_error *err)
{
    const char *n = c->name;
    NEED(in_range(c->batch), "%s: batch must be 1 to %lld", n, (long long)LIMIT);
    NEED(c->dtype != PS_DTYPE_I32 && (unsigned)c->dtype < PS_DTYPE_COUNT,
         "%s: dtype must be fp32, fp16 or bf16", n);
    switch (c->family) {
    case PS_MODEL_MLP:
        NEED(in_range(c->hidden), "%s: hidden must be 1 to %lld, not %lld", n, (long long)LIMIT,
             (long long)c->hidden);
        NEED(c->layers >= 1 && c->layers <= 4096, "%s: layers must be 1 to 4096", n);
        return PS_OK;
    case PS_MODEL_GPT:
    case PS_MODEL_MOE:
        /* each named on its own: a huge hidden makes ffn (4 hidden by default) the one
         * past the limit */
        NEED(in_range(c->hidden), "%s: hidden must be 1 to %lld, not %lld", n, (long long)LIMIT,
             (long long)c->hidden);
        NEED(in_range(c->seq), "%s: seq must be 1 to %lld, not %lld", n, (long long)LIMIT,
             (long long)c->seq);
        NEED(in_range(c->vocab), "%s: vocab must be 1 to %lld, not %lld", n, (long long)LIMIT,
             (long long)c->vocab);
        NEED(in_range(c->ffn), "%s: ffn must be 1 to %lld, not %lld%s", n, (long long)LIMIT,
             (long long)c->ffn,
             c->ffn == 4 * c->hidden ? " (4 x hidden, as --hidden sets it; give --ffn)" : "");
        NEED(c->layers >= 1 && c->layers <= 4096, "%s: layers must be 1 to 4096", n);
        NEED(in_range(c->heads) && c->hidden % c->heads == 0,
             "%s: heads (%lld) must divide hidden (%lld)", n, (long long)c->heads,
             (long long)c->hidden);
        if (c->family == PS_MODEL_MOE) {
            NEED(c->experts >= 1 && c->experts <= 65536, "%s: experts must be 1 to 65536", n);
            NEED(c->top_k >= 1 && c->top_k <= c->experts && c->top_k <= 8,
                 "%s: top_k must be 1 to min(experts, 8)", n);
            NEED(in_range(c->expert_group), "%s: expert_group must be positive", n);
            NEED(c->capacity_factor > 0 && c->capacity_factor <= 64,
                 "%s: capacity_factor must be in (0, 64]", n);
        }
        return PS_OK;
    case PS_MODEL_WRESNET:
        NEED(c->layers == 50 || c->layers == 101 || c->layers == 152,
             "%s: Wide-ResNet depth must be 50, 101 or 152", n);
        NEED(c->image_size >= 32 && c->image_size <= 4096, "%s: image_size must be 32 to 4096",
             n);
        NEED(c->channels >= 1 && c->channels <= 65536, "%s: channels must be 1 to 65536", n);
        NEED(c->width_factor >= 1 && c->width_factor <= 64, "%s: width_factor must be 1 to 64",
             n);
        NEED(c->classes >= 1 && c->classes <= LIMIT, "%s: classes must be positive", n);
        return PS_OK;
    case PS_MODEL_FAMILY_COUNT: break;
    }
    return ps_error_set(err, PS_ERR_INVALID, "%s: unknown model family", n);
}

ps_status ps_model_build(const ps_model_config *c, ps_graph **out, ps_error *err)
{
    ps_status st = PS_OK;
    ps_graph *g = NULL;
    *out = NULL;
    PS_TRY(ps_model_config_validate(c, err));
    if ((st = ps_graph_create(c->name, &g)) != PS_OK) {
        st = ps_error_set(err, st, "out of memory");
        goto out;
    }
    switch (c->family) {
    case PS_MODEL_MLP: PS_TRY(ps_model_build_mlp(c, g, err)); break;
    case PS_MODEL_GPT:
    case PS_MODEL_MOE: PS_TRY(ps_model_build_transformer(c, g, err)); break;
    case PS_MODEL_WRESNET: PS_TRY(ps_model_build_wresnet(c, g, err)); break;
    case PS_MODEL_FAMILY_COUNT: break;
    }
    ps_graph_update_layers(g);
    PS_TRY(ps_graph_check(g, err));
    *out = g;
    g = NULL;
out:
    ps_graph_free(g);
    return st;
}

/* The integer sizes of a config, by JSON key. */
static const struct {
    const char *key;
    size_t offset;
} size_fields[] = {
    {"hidden", offsetof(ps_model_config, hidden)},
    {"layers", offsetof(ps_model_config, layers)},
    {"heads", offsetof(ps_model_config, heads)},
    {"seq", offsetof(ps_model_config, seq)},
    {"vocab", offsetof(ps_model_config, vocab)},
    {"ffn", offsetof(ps_model_config, ffn)},
    {"experts", offsetof(ps_model_config, experts)},
    {"expert_group", offsetof(ps_model_config, expert_group)},
    {"top_k", offsetof(ps_model_config, top_k)},
    {"image_size", offsetof(ps_model_config, image_size)},
    {"channels", offsetof(ps_model_config, channels)},
    {"width_factor", offsetof(ps_model_config, width_factor)},
    {"classes", offsetof(ps_model_config, classes)},
};
#define N_SIZE_FIELDS (sizeof size_fields / sizeof *size_fields)

ps_status ps_model_config_to_json(const ps_model_config *c, json_t **out)
{
    ps_status st = PS_OK;
    json_t *o = json_object();
    *out = NULL;
    if (o == NULL)
        return PS_ERR_NOMEM;
    PS_TRY(ps_json_set(o, "family", json_string(ps_model_family_names[c->family])));
    PS_TRY(ps_json_set(o, "batch", json_integer(c->batch)));
    PS_TRY(ps_json_set(o, "dtype", json_string(ps_dtype_name(c->dtype))));
    for (size_t i = 0; i < N_SIZE_FIELDS; i++) {
        int64_t v = *(const int64_t *)((const char *)c + size_fields[i].offset);
        if (v != 0)
            PS_TRY(ps_json_set(o, size_fields[i].key, json_integer(v)));
    }
    if (c->family == PS_MODEL_MOE)
        PS_TRY(ps_json_set(o, "capacity_factor", json_real(c->capacity_factor)));
    *out = o;
    o = NULL;
out:
    json_decref(o);
    return st;
}

ps_status ps_model_config_from_json(const ps_jv *v, const char *zoo_name, ps_model_config *out,
                                    ps_error *err)
{
    static const char *const keys[] = {"family", "batch", "dtype", "hidden", "layers", "heads",
                                       "seq", "vocab", "ffn", "experts", "expert_group", "top_k",
                                       "image_size", "channels", "width_factor", "classes",
                                       "capacity_factor", NULL};
    ps_status st = PS_OK;
    ps_jv x;
    int k;
    /* start from the zoo entry (names, global batch), then apply the file */
    PS_TRY(ps_zoo_lookup(zoo_name, out, err));
    PS_TRY(ps_jv_check_keys(v, keys, err));
    PS_TRY(ps_jv_member(v, "family", &x, err));
    PS_TRY(ps_jv_enum(&x, ps_model_family_names, PS_MODEL_FAMILY_COUNT, &k, err));
    out->family = (ps_model_family)k;
    PS_TRY(ps_jv_member(v, "batch", &x, err));
    PS_TRY(ps_jv_int(&x, 1, INT64_C(1) << 31, &out->batch, err));
    PS_TRY(ps_jv_member(v, "dtype", &x, err));
    PS_TRY(ps_jv_enum(&x, ps_dtype_names, PS_FLOAT_DTYPE_COUNT, &k, err));
    out->dtype = (ps_dtype)k;
    for (size_t i = 0; i < N_SIZE_FIELDS; i++) {
        int64_t *field = (int64_t *)((char *)out + size_fields[i].offset);
        PS_TRY(ps_jv_opt_int(v, size_fields[i].key, 0, 0, INT64_C(1) << 31, field, err));
    }
    PS_TRY(ps_jv_opt_double(v, "capacity_factor", out->capacity_factor, 0, 64,
                            &out->capacity_factor, err));
    PS_TRY(ps_model_config_validate(out, err));
out:
    return st;
}
