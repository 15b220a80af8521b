#include "planner/stage_file.h"

#include <stdlib.h>
#include <string.h>

#include "core/json.h"

static ps_status read_pair(const ps_jv *obj, const char *key, int *out, int lo, ps_error *err)
{
    ps_jv v;
    size_t n;
    ps_status st = ps_jv_member(obj, key, &v, err);
    if (st == PS_OK)
        st = ps_jv_array(&v, &n, err);
    if (st != PS_OK)
        return st;
    if (n != 2)
        return ps_jv_fail(&v, err, PS_ERR_INVALID, "expected two numbers, found %zu", n);
    for (size_t i = 0; i < 2; i++) {
        ps_jv e = ps_jv_element(&v, i);
        int64_t x;
        if ((st = ps_jv_int(&e, lo, 1 << 20, &x, err)) != PS_OK)
            return st;
        out[i] = (int)x;
    }
    return PS_OK;
}

static ps_status stages_from_doc(const ps_json_doc *doc, ps_inter_options *o,
                                 ps_manual_stage **stages, int *n_stages, ps_error *err)
{
    static const char *const keys[] = {"format", "version", "layer_num", "stages", NULL};
    static const char *const stage_keys[] = {"layers", "submesh", "logical_mesh",
                                             "force_batch_axis0", "remat", NULL};
    ps_status st = PS_OK;
    ps_manual_stage *list = NULL;
    ps_jv v, sv;
    const char *s;
    int64_t x;
    size_t n;
    *stages = NULL;
    *n_stages = 0;
    ps_jv root = ps_json_doc_root(doc);
    PS_TRY(ps_jv_expect_format(&root, "pipeshard-stages", "a stage file (pipeshard-stages)",
                               err));
    PS_TRY(ps_jv_check_keys(&root, keys, err));
    PS_TRY(ps_jv_member(&root, "format", &v, err));
    PS_TRY(ps_jv_string(&v, &s, err));
    if (strcmp(s, "pipeshard-stages") != 0) {
        st = ps_jv_fail(&v, err, PS_ERR_INVALID, "expected \"pipeshard-stages\"");
        goto out;
    }
    PS_TRY(ps_jv_member(&root, "version", &v, err));
    PS_TRY(ps_jv_int(&v, 1, 1, &x, err));
    if (ps_jv_has(&root, "layer_num")) {
        PS_TRY(ps_jv_member(&root, "layer_num", &v, err));
        if (json_is_string(v.v)) {
            static const char *const manual[] = {"manual"};
            int k;
            PS_TRY(ps_jv_enum(&v, manual, 1, &k, err));
            o->manual_layers = true;
        } else {
            PS_TRY(ps_jv_int(&v, 1, 4096, &x, err));
            o->layer_num = (int)x;
            o->manual_layers = false;
        }
    }
    PS_TRY(ps_jv_member(&root, "stages", &sv, err));
    PS_TRY(ps_jv_array(&sv, &n, err));
    if (n < 1 || n > 64) {
        st = ps_jv_fail(&sv, err, PS_ERR_INVALID, "expected 1 to 64 stages, found %zu", n);
        goto out;
    }
    list = calloc(n, sizeof *list);
    PS_TRY_ALLOC(list, err);
    for (size_t i = 0; i < n; i++) {
        ps_jv e = ps_jv_element(&sv, i);
        int layers[2];
        PS_TRY(ps_jv_check_keys(&e, stage_keys, err));
        PS_TRY(read_pair(&e, "layers", layers, 0, err));
        PS_TRY(read_pair(&e, "submesh", list[i].submesh, 1, err));
        PS_TRY(read_pair(&e, "logical_mesh", list[i].logical_mesh, 1, err));
        PS_TRY(ps_jv_opt_bool(&e, "force_batch_axis0", list[i].logical_mesh[0] > 1,
                              &list[i].force_batch_axis0, err));
        list[i].remat_given = ps_jv_has(&e, "remat");
        PS_TRY(ps_jv_opt_bool(&e, "remat", false, &list[i].remat, err));
        list[i].first_layer = layers[0];
        list[i].last_layer = layers[1];
        if (list[i].logical_mesh[0] * list[i].logical_mesh[1] !=
            list[i].submesh[0] * list[i].submesh[1]) {
            st = ps_jv_fail(&e, err, PS_ERR_INVALID,
                            "logical mesh %dx%d does not have the submesh's %d devices",
                            list[i].logical_mesh[0], list[i].logical_mesh[1],
                            list[i].submesh[0] * list[i].submesh[1]);
            goto out;
        }
        if (list[i].force_batch_axis0 && list[i].logical_mesh[0] == 1) {
            ps_jv f;
            PS_TRY(ps_jv_member(&e, "force_batch_axis0", &f, err));
            st = ps_jv_fail(&f, err, PS_ERR_INVALID,
                            "a logical mesh of one row (1x%d) has no axis 0 to keep the batch "
                            "on",
                            list[i].logical_mesh[1]);
            goto out;
        }
    }
    *stages = list;
    *n_stages = (int)n;
    list = NULL;
out:
    free(list);
    return st;
}

ps_status ps_stage_file_load(const char *path, ps_inter_options *o, ps_manual_stage **stages,
                             int *n_stages, ps_error *err)
{
    ps_json_doc *doc = NULL;
    *stages = NULL;
    *n_stages = 0;
    ps_status st = ps_json_doc_load(path, &doc, err);
    if (st == PS_OK)
        st = stages_from_doc(doc, o, stages, n_stages, err);
    ps_json_doc_free(doc);
    return st;
}

ps_status ps_stage_file_parse(const char *name, const char *text, ps_inter_options *o,
                              ps_manual_stage **stages, int *n_stages, ps_error *err)
{
    ps_json_doc *doc = NULL;
    *stages = NULL;
    *n_stages = 0;
    ps_status st = ps_json_doc_parse(name, text, &doc, err);
    if (st == PS_OK)
        st = stages_from_doc(doc, o, stages, n_stages, err);
    ps_json_doc_free(doc);
    return st;
}
