/* JSON files through jansson, with diagnostics that point into the file.
 *
 * jansson parses; this module adds what users need from a loader: every
 * semantic error (wrong type, missing or unknown key, value out of range) is
 * reported as "FILE:LINE:COL: PATH: what is wrong", where LINE:COL is the
 * position of the offending value in the original text and PATH is its JSON
 * path (e.g. tensors[3].shape[1]). Readers walk the document with ps_jv
 * cursors, which live on the stack and link to their parent so that the path
 * can be rebuilt on failure without any allocation. */
#ifndef PS_CORE_JSON_H
#define PS_CORE_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* A parsed file: owns its name, its text (for locating values) and the tree. */
typedef struct ps_json_doc {
    char *name;
    char *text;
    json_t *root;
} ps_json_doc;

/* Reads and parses a file ("-" is standard input). Syntax errors, duplicate
 * keys and integers beyond 64 bits are reported with jansson's line:col. */
ps_status ps_json_doc_load(const char *path, ps_json_doc **out, ps_error *err);
/* Parses text held in memory; name is used in messages. */
ps_status ps_json_doc_parse(const char *name, const char *text, ps_json_doc **out, ps_error *err);
void ps_json_doc_free(ps_json_doc *doc);
/* A document over a value already in memory (a part of another file);
 * positions in messages refer to the value written out as by ps_json_save. */
ps_status ps_json_doc_from_value(const char *name, const json_t *v, ps_json_doc **out,
                                 ps_error *err);

/* A cursor on one value of a document (borrowed; valid while doc lives and,
 * through `parent`, while the parent cursor lives). */
typedef struct ps_jv {
    const ps_json_doc *doc;
    json_t *v;
    const struct ps_jv *parent;
    const char *key; /* member name when the parent is an object */
    size_t index;    /* element index when the parent is an array */
} ps_jv;

ps_jv ps_json_doc_root(const ps_json_doc *doc);

/* Fails with "FILE:LINE:COL: PATH: message" pointing at `at`. Returns st. */
ps_status ps_jv_fail(const ps_jv *at, ps_error *err, ps_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Type checks and element access. */
ps_status ps_jv_object(const ps_jv *v, ps_error *err);
ps_status ps_jv_array(const ps_jv *v, size_t *n_out, ps_error *err);
ps_jv ps_jv_element(const ps_jv *arr, size_t i);
bool ps_jv_has(const ps_jv *obj, const char *key);
/* Required member: fails with "missing key" when absent. */
ps_status ps_jv_member(const ps_jv *obj, const char *key, ps_jv *out, ps_error *err);
/* Before a reader looks at anything else: a document declaring another of
 * pipeshard's formats ("format": "pipeshard-...") is refused by what it is,
 * so that a file given in the wrong place says so ('a "pipeshard-summary"
 * file, not a plan') instead of naming its first unknown key. want: the
 * format the reader takes, or NULL for files without the key (cluster
 * files, profile DBs); what: the kind of file it takes ("a plan"). Other
 * values are left to the reader's own checks. */
ps_status ps_jv_expect_format(const ps_jv *root, const char *want, const char *what,
                              ps_error *err);
/* Every member of obj must be one of `allowed` (NULL-terminated): a typo in a
 * key is an error, not a silently ignored setting. */
ps_status ps_jv_check_keys(const ps_jv *obj, const char *const *allowed, ps_error *err);

/* Scalars, with range checks (inclusive). */
ps_status ps_jv_int(const ps_jv *v, int64_t min, int64_t max, int64_t *out, ps_error *err);
ps_status ps_jv_double(const ps_jv *v, double min, double max, double *out, ps_error *err);
ps_status ps_jv_bool(const ps_jv *v, bool *out, ps_error *err);
ps_status ps_jv_string(const ps_jv *v, const char **out, ps_error *err);
/* A string that must be one of names[0..count-1]; *out is its index. */
ps_status ps_jv_enum(const ps_jv *v, const char *const *names, int count, int *out, ps_error *err);

/* Optional members: when the key is absent, *out = def and PS_OK. */
ps_status ps_jv_opt_int(const ps_jv *obj, const char *key, int64_t def, int64_t min, int64_t max,
                        int64_t *out, ps_error *err);
ps_status ps_jv_opt_double(const ps_jv *obj, const char *key, double def, double min, double max,
                           double *out, ps_error *err);
ps_status ps_jv_opt_bool(const ps_jv *obj, const char *key, bool def, bool *out, ps_error *err);
ps_status ps_jv_opt_string(const ps_jv *obj, const char *key, const char *def, const char **out,
                           ps_error *err);

/* Writes a tree as indented JSON ("-" is standard output); doubles are
 * written with 17 significant digits so that a round trip is lossless. */
ps_status ps_json_save(const json_t *root, const char *path, ps_error *err);
/* Same text as ps_json_save, as a malloc'ed string (caller frees). */
char *ps_json_dumps(const json_t *root);

/* A 64-bit FNV-1a digest of the tree's compact text with sorted keys, as 16
 * hex digits in buf (cap >= 17): equal trees, equal digests. */
void ps_json_digest(const json_t *root, char *buf, int cap);

/* Builders that turn allocation failure into a status (jansson returns -1). */
ps_status ps_json_set(json_t *obj, const char *key, json_t *value_stolen);
ps_status ps_json_append(json_t *arr, json_t *value_stolen);

#endif
