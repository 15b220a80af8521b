#include "core/json.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loading ---------------------------------------------------------- */

static char *read_stream(FILE *f, size_t *len_out)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (buf == NULL)
        return NULL;
    for (;;) {
        if (len + 1 >= cap) {
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                return NULL;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    *len_out = len;
    return buf;
}

ps_status ps_json_doc_parse(const char *name, const char *text, ps_json_doc **out, ps_error *err)
{
    ps_status st = PS_OK;
    *out = NULL;
    ps_json_doc *doc = calloc(1, sizeof *doc);
    PS_TRY_ALLOC(doc, err);
    doc->name = strdup(name);
    doc->text = strdup(text);
    PS_TRY_ALLOC(doc->name, err);
    PS_TRY_ALLOC(doc->text, err);
    json_error_t jerr;
    doc->root = json_loads(doc->text, JSON_REJECT_DUPLICATES, &jerr);
    if (doc->root == NULL) {
        st = ps_error_set(err, PS_ERR_PARSE, "%s:%d:%d: %s", name, jerr.line < 1 ? 1 : jerr.line,
                          jerr.column < 1 ? 1 : jerr.column, jerr.text);
        goto out;
    }
    *out = doc;
    doc = NULL;
out:
    ps_json_doc_free(doc);
    return st;
}

ps_status ps_json_doc_load(const char *path, ps_json_doc **out, ps_error *err)
{
    ps_status st = PS_OK;
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    bool is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (f == NULL)
        return ps_error_set(err, PS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    errno = 0;
    text = read_stream(f, &len);
    if (text == NULL) {
        /* a directory opens but does not read (EISDIR) */
        int e = errno;
        st = ps_error_set(err, e == ENOMEM || e == 0 ? PS_ERR_NOMEM : PS_ERR_IO,
                          "%s: cannot read: %s", path, strerror(e != 0 ? e : ENOMEM));
        goto out;
    }
    /* binary data gets a plain answer instead of a parser message quoting
     * control bytes */
    for (size_t i = 0, line = 1, col = 1; i < len; i++, col++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch == '\n') {
            line++;
            col = 0;
        } else if ((ch < 0x20 && ch != '\t' && ch != '\r') || ch == 0x7f) {
            st = ps_error_set(err, PS_ERR_PARSE,
                              "%s:%zu:%zu: control byte 0x%02x; this is not a JSON text file",
                              path, line, col, ch);
            goto out;
        }
    }
    st = ps_json_doc_parse(is_stdin ? "<stdin>" : path, text, out, err);
out:
    if (!is_stdin)
        fclose(f);
    free(text);
    return st;
}

ps_status ps_json_doc_from_value(const char *name, const json_t *v, ps_json_doc **out,
                                 ps_error *err)
{
    *out = NULL;
    char *text = ps_json_dumps(v);
    if (text == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    ps_status st = ps_json_doc_parse(name, text, out, err);
    free(text);
    return st;
}

void ps_json_doc_free(ps_json_doc *doc)
{
    if (doc == NULL)
        return;
    json_decref(doc->root);
    free(doc->name);
    free(doc->text);
    free(doc);
}

ps_jv ps_json_doc_root(const ps_json_doc *doc)
{
    return (ps_jv){.doc = doc, .v = doc->root, .parent = NULL, .key = NULL, .index = 0};
}

/* ---- locating a value in the text -------------------------------------
 * jansson keeps no positions, so on failure the cursor's path is replayed over
 * the (already validated) text with a small lexer that only skips values. */

typedef struct scan {
    const char *s;
    size_t pos;
} scan;

static void skip_ws(scan *sc)
{
    while (sc->s[sc->pos] == ' ' || sc->s[sc->pos] == '\t' || sc->s[sc->pos] == '\n' ||
           sc->s[sc->pos] == '\r')
        sc->pos++;
}

/* Skips a string starting at '"'; returns the position after it. */
static void skip_string(scan *sc)
{
    sc->pos++;
    while (sc->s[sc->pos] != '\0' && sc->s[sc->pos] != '"') {
        if (sc->s[sc->pos] == '\\' && sc->s[sc->pos + 1] != '\0')
            sc->pos++;
        sc->pos++;
    }
    if (sc->s[sc->pos] == '"')
        sc->pos++;
}

static void skip_value(scan *sc)
{
    skip_ws(sc);
    char c = sc->s[sc->pos];
    if (c == '"') {
        skip_string(sc);
        return;
    }
    if (c == '{' || c == '[') {
        int depth = 0;
        while (sc->s[sc->pos] != '\0') {
            c = sc->s[sc->pos];
            if (c == '"') {
                skip_string(sc);
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if (c == '}' || c == ']') {
                depth--;
                if (depth == 0) {
                    sc->pos++;
                    return;
                }
            }
            sc->pos++;
        }
        return;
    }
    while (sc->s[sc->pos] != '\0' && strchr(",]} \t\r\n", sc->s[sc->pos]) == NULL)
        sc->pos++;
}

/* Compares the JSON string literal at sc (on its opening quote) with key;
 * keys with escapes never match, which only costs precision. */
static bool string_equals(const scan *sc, const char *key)
{
    size_t n = strlen(key);
    return strncmp(sc->s + sc->pos + 1, key, n) == 0 && sc->s[sc->pos + 1 + n] == '"';
}

/* Moves sc to the value selected by one path step; false if not found. */
static bool descend(scan *sc, const ps_jv *step)
{
    skip_ws(sc);
    char open = sc->s[sc->pos];
    bool in_object = step->key != NULL;
    if ((in_object && open != '{') || (!in_object && open != '['))
        return false;
    sc->pos++;
    for (size_t i = 0;; i++) {
        skip_ws(sc);
        if (sc->s[sc->pos] == '}' || sc->s[sc->pos] == ']' || sc->s[sc->pos] == '\0')
            return false;
        bool hit;
        if (in_object) {
            if (sc->s[sc->pos] != '"')
                return false;
            hit = string_equals(sc, step->key);
            skip_string(sc);
            skip_ws(sc);
            if (sc->s[sc->pos] != ':')
                return false;
            sc->pos++;
        } else {
            hit = i == step->index;
        }
        skip_ws(sc);
        if (hit)
            return true;
        skip_value(sc);
        skip_ws(sc);
        if (sc->s[sc->pos] == ',')
            sc->pos++;
    }
}

static void locate(const ps_jv *at, size_t *line, size_t *col)
{
    const ps_jv *chain[256];
    size_t depth = 0;
    for (const ps_jv *p = at; p != NULL && p->parent != NULL && depth < 256; p = p->parent)
        chain[depth++] = p;
    scan sc = {.s = at->doc->text, .pos = 0};
    skip_ws(&sc);
    while (depth > 0) {
        size_t before = sc.pos;
        if (!descend(&sc, chain[--depth])) {
            sc.pos = before;
            break;
        }
    }
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < sc.pos && sc.s[i] != '\0'; i++) {
        if (sc.s[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static void format_path(const ps_jv *at, char *buf, size_t cap)
{
    if (at == NULL || at->parent == NULL) {
        snprintf(buf, cap, "(top level)");
        return;
    }
    char rest[512];
    if (at->parent->parent == NULL)
        rest[0] = '\0';
    else
        format_path(at->parent, rest, sizeof rest);
    if (at->key != NULL)
        snprintf(buf, cap, "%s%s%s", rest, rest[0] ? "." : "", at->key);
    else
        snprintf(buf, cap, "%s[%zu]", rest, at->index);
}

ps_status ps_jv_fail(const ps_jv *at, ps_error *err, ps_status st, const char *fmt, ...)
{
    if (err == NULL || err->status != PS_OK)
        return st;
    char what[512], path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    format_path(at, path, sizeof path);
    size_t line, col;
    locate(at, &line, &col);
    return ps_error_set(err, st, "%s:%zu:%zu: %s: %s", at->doc->name, line, col, path, what);
}

/* ---- typed access ------------------------------------------------------ */

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

ps_status ps_jv_object(const ps_jv *v, ps_error *err)
{
    if (!json_is_object(v->v))
        return ps_jv_fail(v, err, PS_ERR_INVALID, "expected an object, found %s", type_name(v->v));
    return PS_OK;
}

ps_status ps_jv_array(const ps_jv *v, size_t *n_out, ps_error *err)
{
    if (!json_is_array(v->v))
        return ps_jv_fail(v, err, PS_ERR_INVALID, "expected an array, found %s", type_name(v->v));
    *n_out = json_array_size(v->v);
    return PS_OK;
}

ps_jv ps_jv_element(const ps_jv *arr, size_t i)
{
    return (ps_jv){.doc = arr->doc, .v = json_array_get(arr->v, i), .parent = arr, .key = NULL,
                   .index = i};
}

bool ps_jv_has(const ps_jv *obj, const char *key)
{
    return json_is_object(obj->v) && json_object_get(obj->v, key) != NULL;
}

ps_status ps_jv_member(const ps_jv *obj, const char *key, ps_jv *out, ps_error *err)
{
    ps_status st = ps_jv_object(obj, err);
    if (st != PS_OK)
        return st;
    json_t *v = json_object_get(obj->v, key);
    if (v == NULL)
        return ps_jv_fail(obj, err, PS_ERR_INVALID, "missing key \"%s\"", key);
    *out = (ps_jv){.doc = obj->doc, .v = v, .parent = obj, .key = key, .index = 0};
    return PS_OK;
}

ps_status ps_jv_check_keys(const ps_jv *obj, const char *const *allowed, ps_error *err)
{
    ps_status st = ps_jv_object(obj, err);
    if (st != PS_OK)
        return st;
    const char *key;
    json_t *value;
    json_object_foreach(obj->v, key, value) {
        bool known = false;
        for (const char *const *a = allowed; *a != NULL && !known; a++)
            known = strcmp(*a, key) == 0;
        if (!known) {
            ps_jv at = {.doc = obj->doc, .v = value, .parent = obj, .key = key, .index = 0};
            char list[400] = "";
            size_t used = 0;
            for (const char *const *a = allowed; *a != NULL && used + 1 < sizeof list; a++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                                         a == allowed ? "" : ", ", *a);
            return ps_jv_fail(&at, err, PS_ERR_INVALID, "unknown key \"%s\" (known keys: %s)", key,
                              list);
        }
    }
    return PS_OK;
}

ps_status ps_jv_int(const ps_jv *v, int64_t min, int64_t max, int64_t *out, ps_error *err)
{
    if (!json_is_integer(v->v))
        return ps_jv_fail(v, err, PS_ERR_INVALID, "expected an integer, found %s",
                          type_name(v->v));
    json_int_t x = json_integer_value(v->v);
    if (x < min || x > max)
        return ps_jv_fail(v, err, PS_ERR_INVALID,
                          "%lld is out of range (allowed %lld to %lld)", (long long)x,
                          (long long)min, (long long)max);
    *out = (int64_t)x;
    return PS_OK;
}

ps_status ps_jv_double(const ps_jv *v, double min, double max, double *out, ps_error *err)
{
    if (!json_is_number(v->v))
        return ps_jv_fail(v, err, PS_ERR_INVALID, "expected a number, found %s", type_name(v->v));
    double x = json_number_value(v->v);
    if (!isfinite(x) || x < min || x > max)
        return ps_jv_fail(v, err, PS_ERR_INVALID, "%g is out of range (allowed %g to %g)", x, min,
                          max);
    *out = x;
    return PS_OK;
}

ps_status ps_jv_bool(const ps_jv *v, bool *out, ps_error *err)
{
    if (!json_is_boolean(v->v))
        return ps_jv_fail(v, err, PS_ERR_INVALID, "expected true or false, found %s",
                          type_name(v->v));
    *out = json_is_true(v->v);
    return PS_OK;
}

ps_status ps_jv_string(const ps_jv *v, const char **out, ps_error *err)
{
    if (!json_is_string(v->v))
        return ps_jv_fail(v, err, PS_ERR_INVALID, "expected a string, found %s", type_name(v->v));
    *out = json_string_value(v->v);
    return PS_OK;
}

ps_status ps_jv_enum(const ps_jv *v, const char *const *names, int count, int *out, ps_error *err)
{
    const char *s = "";
    ps_status st = ps_jv_string(v, &s, err);
    if (st != PS_OK)
        return st;
    for (int i = 0; i < count; i++) {
        if (names[i] != NULL && strcmp(names[i], s) == 0) {
            *out = i;
            return PS_OK;
        }
    }
    char list[400] = "";
    size_t used = 0;
    for (int i = 0; i < count && used + 1 < sizeof list; i++)
        if (names[i] != NULL)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "",
                                     names[i]);
    return ps_jv_fail(v, err, PS_ERR_INVALID, "unknown value \"%s\" (expected one of: %s)", s,
                      list);
}

ps_status ps_jv_opt_int(const ps_jv *obj, const char *key, int64_t def, int64_t min, int64_t max,
                        int64_t *out, ps_error *err)
{
    if (!ps_jv_has(obj, key)) {
        *out = def;
        return PS_OK;
    }
    ps_jv v;
    ps_status st = ps_jv_member(obj, key, &v, err);
    return st != PS_OK ? st : ps_jv_int(&v, min, max, out, err);
}

ps_status ps_jv_opt_double(const ps_jv *obj, const char *key, double def, double min, double max,
                           double *out, ps_error *err)
{
    if (!ps_jv_has(obj, key)) {
        *out = def;
        return PS_OK;
    }
    ps_jv v;
    ps_status st = ps_jv_member(obj, key, &v, err);
    return st != PS_OK ? st : ps_jv_double(&v, min, max, out, err);
}

ps_status ps_jv_opt_bool(const ps_jv *obj, const char *key, bool def, bool *out, ps_error *err)
{
    if (!ps_jv_has(obj, key)) {
        *out = def;
        return PS_OK;
    }
    ps_jv v;
    ps_status st = ps_jv_member(obj, key, &v, err);
    return st != PS_OK ? st : ps_jv_bool(&v, out, err);
}

ps_status ps_jv_opt_string(const ps_jv *obj, const char *key, const char *def, const char **out,
                           ps_error *err)
{
    if (!ps_jv_has(obj, key)) {
        *out = def;
        return PS_OK;
    }
    ps_jv v;
    ps_status st = ps_jv_member(obj, key, &v, err);
    return st != PS_OK ? st : ps_jv_string(&v, out, err);
}

/* ---- saving ------------------------------------------------------------ */

#define DUMP_FLAGS (JSON_INDENT(1) | JSON_REAL_PRECISION(17))

char *ps_json_dumps(const json_t *root) { return json_dumps(root, DUMP_FLAGS); }

ps_status ps_jv_expect_format(const ps_jv *root, const char *want, const char *what,
                              ps_error *err)
{
    if (!json_is_object(root->v))
        return PS_OK;
    json_t *f = json_object_get(root->v, "format");
    const char *s = json_string_value(f);
    if (s == NULL || strncmp(s, "pipeshard-", 10) != 0 || (want != NULL && strcmp(s, want) == 0))
        return PS_OK;
    ps_jv at = {root->doc, f, root, "format", 0};
    return ps_jv_fail(&at, err, PS_ERR_INVALID, "a \"%s\" file, not %s", s, what);
}

ps_status ps_json_save(const json_t *root, const char *path, ps_error *err)
{
    char *text = ps_json_dumps(root);
    if (text == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory while writing %s", path);
    bool is_stdout = strcmp(path, "-") == 0;
    FILE *f = is_stdout ? stdout : fopen(path, "wb");
    ps_status st = PS_OK;
    if (f == NULL) {
        st = ps_error_set(err, PS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    } else {
        if (fputs(text, f) < 0 || fputc('\n', f) == EOF)
            st = ps_error_set(err, PS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        if (is_stdout)
            fflush(f);
        else if (fclose(f) != 0 && st == PS_OK)
            st = ps_error_set(err, PS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    free(text);
    return st;
}

ps_status ps_json_set(json_t *obj, const char *key, json_t *value_stolen)
{
    if (value_stolen == NULL || json_object_set_new(obj, key, value_stolen) != 0)
        return PS_ERR_NOMEM;
    return PS_OK;
}

ps_status ps_json_append(json_t *arr, json_t *value_stolen)
{
    if (value_stolen == NULL || json_array_append_new(arr, value_stolen) != 0)
        return PS_ERR_NOMEM;
    return PS_OK;
}

void ps_json_digest(const json_t *root, char *buf, int cap)
{
    uint64_t h = 1469598103934665603ull;
    char *text = root != NULL ? json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    for (const char *c = text; c != NULL && *c != '\0'; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    free(text);
    snprintf(buf, (size_t)cap, "%016llx", (unsigned long long)h);
}
