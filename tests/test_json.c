/* core/json: positioned diagnostics, typed access, lossless saving. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/json.h"

static ps_json_doc *parse_ok(const char *text)
{
    ps_json_doc *doc = NULL;
    ps_error err = {0};
    assert_int_equal(ps_json_doc_parse("t.json", text, &doc, &err), PS_OK);
    return doc;
}

static void syntax_errors_have_positions(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *want;
    } cases[] = {
        {"{\"a\": 1,\n \"b\": }", "t.json:2:"},
        {"", "t.json:1:"},
        {"{\"a\": 1} trailing", "t.json:1:"},
        {"{\"a\": 1, \"a\": 2}", "duplicate"},
        {"{\"a\": 123456789012345678901234567890}", "too big"},
        {"[1, 2", "t.json:1:"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ps_json_doc *doc = NULL;
        ps_error err = {0};
        assert_int_equal(ps_json_doc_parse("t.json", cases[i].text, &doc, &err), PS_ERR_PARSE);
        assert_null(doc);
        if (strstr(err.msg, cases[i].want) == NULL)
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err.msg, cases[i].want);
    }
}

static void semantic_errors_point_at_the_value(void **state)
{
    (void)state;
    const char *text = "{\n"
                       "  \"tensors\": [\n"
                       "    {\"shape\": [2, 3]},\n"
                       "    {\"shape\": [4, -5]}\n"
                       "  ]\n"
                       "}\n";
    ps_json_doc *doc = parse_ok(text);
    ps_jv root = ps_json_doc_root(doc), tensors, shape;
    ps_error err = {0};
    assert_int_equal(ps_jv_member(&root, "tensors", &tensors, &err), PS_OK);
    ps_jv t1 = ps_jv_element(&tensors, 1);
    assert_int_equal(ps_jv_member(&t1, "shape", &shape, &err), PS_OK);
    ps_jv dim = ps_jv_element(&shape, 1);
    int64_t v;
    assert_int_equal(ps_jv_int(&dim, 1, 100, &v, &err), PS_ERR_INVALID);
    /* line 4, column of "-5" in `    {"shape": [4, -5]}` is 19 */
    assert_non_null(strstr(err.msg, "t.json:4:19: tensors[1].shape[1]: -5 is out of range"));
    ps_json_doc_free(doc);
}

static void missing_and_unknown_keys(void **state)
{
    (void)state;
    ps_json_doc *doc = parse_ok("{\"name\": \"x\",\n \"nmae\": 3}");
    ps_jv root = ps_json_doc_root(doc), v;
    ps_error err = {0};
    assert_int_equal(ps_jv_member(&root, "size", &v, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "missing key \"size\""));
    ps_error_clear(&err);
    static const char *const allowed[] = {"name", "size", NULL};
    assert_int_equal(ps_jv_check_keys(&root, allowed, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "t.json:2:10: nmae: unknown key \"nmae\""));
    ps_json_doc_free(doc);
}

static void type_checks(void **state)
{
    (void)state;
    ps_json_doc *doc = parse_ok("{\"s\": \"x\", \"i\": 3, \"r\": 2.5, \"b\": true, \"a\": [1]}");
    ps_jv root = ps_json_doc_root(doc), v;
    ps_error err = {0};
    int64_t i;
    double d;
    bool b;
    const char *s;
    assert_int_equal(ps_jv_member(&root, "s", &v, &err), PS_OK);
    assert_int_equal(ps_jv_int(&v, 0, 10, &i, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "expected an integer, found a string"));
    ps_error_clear(&err);
    assert_int_equal(ps_jv_member(&root, "r", &v, &err), PS_OK);
    assert_int_equal(ps_jv_int(&v, 0, 10, &i, &err), PS_ERR_INVALID);
    ps_error_clear(&err);
    assert_int_equal(ps_jv_double(&v, 0, 10, &d, &err), PS_OK);
    assert_true(d == 2.5);
    assert_int_equal(ps_jv_member(&root, "i", &v, &err), PS_OK);
    assert_int_equal(ps_jv_double(&v, 0, 10, &d, &err), PS_OK); /* integers are numbers */
    assert_int_equal(ps_jv_bool(&v, &b, &err), PS_ERR_INVALID);
    ps_error_clear(&err);
    assert_int_equal(ps_jv_member(&root, "b", &v, &err), PS_OK);
    assert_int_equal(ps_jv_string(&v, &s, &err), PS_ERR_INVALID);
    ps_error_clear(&err);
    static const char *const names[] = {"red", "green"};
    int k;
    assert_int_equal(ps_jv_member(&root, "s", &v, &err), PS_OK);
    assert_int_equal(ps_jv_enum(&v, names, 2, &k, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "expected one of: red, green"));
    ps_error_clear(&err);
    size_t n;
    assert_int_equal(ps_jv_array(&root, &n, &err), PS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "(top level)"));
    ps_json_doc_free(doc);
}

static void first_error_wins(void **state)
{
    (void)state;
    ps_error err = {0};
    ps_error_set(&err, PS_ERR_INVALID, "inner %d", 1);
    ps_error_set(&err, PS_ERR_IO, "outer");
    assert_int_equal(err.status, PS_ERR_INVALID);
    assert_string_equal(err.msg, "inner 1");
    assert_int_equal(ps_error_set(NULL, PS_ERR_IO, "x"), PS_ERR_IO);
}

static void doubles_round_trip_exactly(void **state)
{
    (void)state;
    double values[] = {0.1, 1.0 / 3.0, 6.02214076e23, 1e-300, 123456789.123456789};
    json_t *arr = json_array();
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++)
        assert_int_equal(ps_json_append(arr, json_real(values[i])), PS_OK);
    char *text = ps_json_dumps(arr);
    ps_json_doc *doc = parse_ok(text);
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++)
        assert_true(json_real_value(json_array_get(doc->root, i)) == values[i]);
    free(text);
    json_decref(arr);
    ps_json_doc_free(doc);
}

static void missing_file(void **state)
{
    (void)state;
    ps_json_doc *doc = NULL;
    ps_error err = {0};
    assert_int_equal(ps_json_doc_load("/nonexistent/x.json", &doc, &err), PS_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/x.json: cannot open"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(syntax_errors_have_positions),
        cmocka_unit_test(semantic_errors_point_at_the_value),
        cmocka_unit_test(missing_and_unknown_keys),
        cmocka_unit_test(type_checks),
        cmocka_unit_test(first_error_wins),
        cmocka_unit_test(doubles_round_trip_exactly),
        cmocka_unit_test(missing_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
