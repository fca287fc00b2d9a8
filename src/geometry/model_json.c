/*
 * kvoffload-model/1 JSON reading and writing (jansson), and the Hugging Face
 * config.json import.
 *
 * The parser is strict about what it reads and lenient about what it ignores:
 * every known field is type- and range-checked and every error names the
 * field (and the group); unknown fields are ignored so that newer writers stay
 * readable.  Syntax errors carry jansson's line and column.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <jansson.h>

#include "geometry/geometry_internal.h"

#define KVO__FORMAT "kvoffload-model/1"

/* Read an integer field in [lo, hi].  required=0: absent leaves *out as is. */
static int kvo__get_uint(json_t *obj, const char *key, uint64_t lo, uint64_t hi, int required,
                         const char *where, uint64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (!required) return 0;
        return kvo__error(KVO_EINVAL, "%s: missing field '%s'", where, key);
    }
    if (!json_is_integer(v))
        return kvo__error(KVO_EINVAL, "%s: field '%s' must be an integer, got %s", where, key,
                          json_is_real(v) ? "a fractional number" :
                          json_is_string(v) ? "a string" :
                          json_is_boolean(v) ? "a boolean" :
                          json_is_null(v) ? "null" : json_is_array(v) ? "an array" : "an object");
    json_int_t x = json_integer_value(v);
    if (x < 0 || (uint64_t)x < lo || (uint64_t)x > hi)
        return kvo__error(x < 0 || (uint64_t)x < lo ? KVO_EINVAL : KVO_ERANGE,
                          "%s: field '%s' is %lld, must be in %llu..%llu", where, key, (long long)x,
                          (unsigned long long)lo, (unsigned long long)hi);
    *out = (uint64_t)x;
    return 0;
}

static int kvo__get_bool(json_t *obj, const char *key, const char *where, bool *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) return 0;
    if (!json_is_boolean(v))
        return kvo__error(KVO_EINVAL, "%s: field '%s' must be true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

static int kvo__get_string(json_t *obj, const char *key, const char *where, const char **out) {
    json_t *v = json_object_get(obj, key);
    if (!v) return kvo__error(KVO_EINVAL, "%s: missing field '%s'", where, key);
    if (!json_is_string(v)) return kvo__error(KVO_EINVAL, "%s: field '%s' must be a string", where, key);
    *out = json_string_value(v);
    return 0;
}

static int kvo__parse_group(json_t *jg, size_t i, kvo_model *m) {
    char where[128];
    snprintf(where, sizeof where, "groups[%zu]", i);
    if (!json_is_object(jg)) return kvo__error(KVO_EINVAL, "%s: must be an object", where);
    kvo_group_desc g = kvo_group_desc_default();
    const char *name = NULL, *kind = NULL;
    int rc = kvo__get_string(jg, "name", where, &name);
    if (rc) return rc;
    if (kvo__strlcpy(g.name, name, sizeof g.name) || !name[0])
        return kvo__error(KVO_EINVAL, "%s: field 'name' must be 1..%d bytes", where, KVO_NAME_MAX - 1);
    snprintf(where, sizeof where, "groups[%zu] ('%s')", i, g.name);
    if ((rc = kvo__get_string(jg, "kind", where, &kind))) return rc;
    if (strcmp(kind, "full") == 0) g.kind = KVO_GROUP_FULL;
    else if (strcmp(kind, "sliding") == 0) g.kind = KVO_GROUP_SLIDING;
    else if (strcmp(kind, "state") == 0) g.kind = KVO_GROUP_STATE;
    else return kvo__error(KVO_EINVAL, "%s: field 'kind' is '%s', must be full, sliding or state", where, kind);
    uint64_t tpb = 0, layers = 0, page = 0, window = 0;
    if ((rc = kvo__get_uint(jg, "tokens_per_block", 1, KVO_MAX_TOKENS_PER_CHUNK, 1, where, &tpb))) return rc;
    if ((rc = kvo__get_uint(jg, "layers", 1, UINT32_MAX, 1, where, &layers))) return rc;
    if ((rc = kvo__get_uint(jg, "page_bytes", 1, UINT64_C(1) << 62, 1, where, &page))) return rc;
    if ((rc = kvo__get_uint(jg, "window", 1, UINT32_MAX, g.kind == KVO_GROUP_SLIDING, where, &window)))
        return rc;
    if ((rc = kvo__get_bool(jg, "cacheable", where, &g.cacheable))) return rc;
    if ((rc = kvo__get_bool(jg, "draft", where, &g.draft))) return rc;
    g.tokens_per_block = (uint32_t)tpb;
    g.layers = (uint32_t)layers;
    g.page_bytes = page;
    g.window = (uint32_t)window;
    return kvo_model_add_group(m, &g);
}

int kvo_model_from_json(const char *text, size_t len, const char *source, kvo_model **out) {
    if (!text || !out) return kvo__error(KVO_EINVAL, "kvo_model_from_json: text and out must not be NULL");
    const char *src = source ? source : "<model>";
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return kvo__error(KVO_EPARSE, "%s:%d:%d: malformed JSON: %s", src, jerr.line, jerr.column, jerr.text);
    int rc;
    kvo_model *m = NULL;
    const char *fmt = NULL, *name = NULL;
    uint64_t tph = 0;
    json_t *groups;
    if (!json_is_object(root)) { rc = kvo__error(KVO_EINVAL, "top level must be an object"); goto out; }
    if ((rc = kvo__get_string(root, "format", "model", &fmt))) goto out;
    if (strcmp(fmt, KVO__FORMAT) != 0) {
        rc = kvo__error(KVO_EINVAL, "field 'format' is '%s', expected '%s'", fmt, KVO__FORMAT);
        goto out;
    }
    if ((rc = kvo__get_string(root, "name", "model", &name))) goto out;
    if ((rc = kvo__get_uint(root, "tokens_per_hash", 1, KVO_MAX_TOKENS_PER_CHUNK, 1, "model", &tph))) goto out;
    groups = json_object_get(root, "groups");
    if (!groups) { rc = kvo__error(KVO_EINVAL, "missing field 'groups'"); goto out; }
    if (!json_is_array(groups) || json_array_size(groups) == 0) {
        rc = kvo__error(KVO_EINVAL, "field 'groups' must be a non-empty array");
        goto out;
    }
    if (json_array_size(groups) > KVO_MAX_GROUPS) {
        rc = kvo__error(KVO_ERANGE, "field 'groups' has %zu entries, at most %d are supported",
                        json_array_size(groups), KVO_MAX_GROUPS);
        goto out;
    }
    if ((rc = kvo_model_create(name, (uint32_t)tph, &m))) goto out;
    for (size_t i = 0; i < json_array_size(groups); i++)
        if ((rc = kvo__parse_group(json_array_get(groups, i), i, m))) goto out;
    *out = m;
    m = NULL;
out:
    if (rc) kvo__error_prefix(rc, "%s", src);
    kvo_model_destroy(m);
    json_decref(root);
    return rc;
}

int kvo_model_load_file(const char *path, kvo_model **out) {
    if (!path || !out) return kvo__error(KVO_EINVAL, "kvo_model_load_file: NULL argument");
    char *buf = NULL;
    size_t len = 0;
    int rc = kvo__read_file(path, 64u << 20, "a kvoffload-model/1 JSON file", &buf, &len);
    if (!rc) rc = kvo_model_from_json(buf ? buf : "", len, path, out);
    kvo__free(buf);
    return rc;
}

static char *kvo__dump(json_t *j) {
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    char *r = s ? kvo__strdup(s) : NULL;
    free(s);
    return r;
}

int kvo_model_to_json(const kvo_model *m, char **out) {
    if (!m || !out) return kvo__error(KVO_EINVAL, "kvo_model_to_json: NULL argument");
    json_t *root = json_object(), *groups = json_array();
    json_object_set_new(root, "format", json_string(KVO__FORMAT));
    json_object_set_new(root, "name", json_string(m->name));
    json_object_set_new(root, "tokens_per_hash", json_integer(m->tokens_per_hash));
    for (size_t i = 0; i < m->n_groups; i++) {
        const kvo_group_desc *g = &m->groups[i];
        json_t *jg = json_object();
        json_object_set_new(jg, "name", json_string(g->name));
        json_object_set_new(jg, "kind", json_string(kvo_group_kind_name(g->kind)));
        json_object_set_new(jg, "tokens_per_block", json_integer(g->tokens_per_block));
        json_object_set_new(jg, "layers", json_integer(g->layers));
        json_object_set_new(jg, "page_bytes", json_integer((json_int_t)g->page_bytes));
        if (g->kind == KVO_GROUP_SLIDING) json_object_set_new(jg, "window", json_integer(g->window));
        if (!g->cacheable) json_object_set_new(jg, "cacheable", json_false());
        if (g->draft) json_object_set_new(jg, "draft", json_true());
        json_array_append_new(groups, jg);
    }
    json_object_set_new(root, "groups", groups);
    *out = kvo__dump(root);
    json_decref(root);
    return *out ? 0 : kvo__error(KVO_ENOMEM, "kvo_model_to_json: out of memory");
}

/* ------------------------------------------------ Hugging Face config.json */

static int kvo__hf_uint(json_t *root, const char *key, uint64_t *out) {
    return kvo__get_uint(root, key, 1, UINT32_MAX, 1, "config.json", out);
}

int kvo_model_from_hf_config(const char *text, size_t len, const char *name, uint32_t tokens_per_block,
                             uint32_t tokens_per_hash, kvo_model **out) {
    if (!text || !name || !out || tokens_per_block == 0)
        return kvo__error(KVO_EINVAL, "kvo_model_from_hf_config: NULL argument or zero tokens_per_block");
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) return kvo__error(KVO_EPARSE, "config.json:%d:%d: %s", jerr.line, jerr.column, jerr.text);
    int rc;
    kvo_model *m = NULL;
    uint64_t layers, heads = 0, kv_heads = 0, head_dim = 0, hidden = 0, window = 0;
    uint64_t dtype_bytes = 2;
    uint32_t n_full = 0, n_sliding = 0;
    if (!json_is_object(root)) { rc = kvo__error(KVO_EINVAL, "config.json: top level must be an object"); goto out; }
    if ((rc = kvo__hf_uint(root, "num_hidden_layers", &layers))) goto out;
    if ((rc = kvo__get_uint(root, "num_attention_heads", 1, UINT32_MAX, 0, "config.json", &heads))) goto out;
    if ((rc = kvo__get_uint(root, "num_key_value_heads", 1, UINT32_MAX, 0, "config.json", &kv_heads))) goto out;
    if ((rc = kvo__get_uint(root, "head_dim", 1, UINT32_MAX, 0, "config.json", &head_dim))) goto out;
    if ((rc = kvo__get_uint(root, "hidden_size", 1, UINT32_MAX, 0, "config.json", &hidden))) goto out;
    if (!kv_heads) kv_heads = heads;
    if (!kv_heads) { rc = kvo__error(KVO_EINVAL, "config.json: missing field 'num_key_value_heads'"); goto out; }
    if (!head_dim && heads && hidden) head_dim = hidden / heads;
    if (!head_dim) { rc = kvo__error(KVO_EINVAL, "config.json: missing field 'head_dim' (or hidden_size and num_attention_heads)"); goto out; }
    json_t *jw = json_object_get(root, "sliding_window");
    if (jw && !json_is_null(jw) &&
        (rc = kvo__get_uint(root, "sliding_window", 1, UINT32_MAX, 1, "config.json", &window))) goto out;
    json_t *dt = json_object_get(root, "torch_dtype");
    if (!dt) dt = json_object_get(root, "dtype");
    if (dt && json_is_string(dt)) {
        const char *d = json_string_value(dt);
        if (!strcmp(d, "float32")) dtype_bytes = 4;
        else if (!strcmp(d, "bfloat16") || !strcmp(d, "float16")) dtype_bytes = 2;
        else if (strstr(d, "float8") || strstr(d, "fp8")) dtype_bytes = 1;
        else { rc = kvo__error(KVO_ENOTSUP, "config.json: dtype '%s' not understood", d); goto out; }
    }
    json_t *lt = json_object_get(root, "layer_types");
    if (lt) {
        if (!json_is_array(lt) || json_array_size(lt) != layers) {
            rc = kvo__error(KVO_EINVAL, "config.json: 'layer_types' must be an array of num_hidden_layers (%llu) strings",
                            (unsigned long long)layers);
            goto out;
        }
        for (size_t i = 0; i < layers; i++) {
            const char *t = json_string_value(json_array_get(lt, i));
            if (t && !strcmp(t, "full_attention")) n_full++;
            else if (t && !strcmp(t, "sliding_attention")) n_sliding++;
            else {
                rc = kvo__error(KVO_ENOTSUP, "config.json: layer_types[%zu] '%s' cannot be imported; "
                                "describe the model in kvoffload-model/1 JSON instead", i, t ? t : "?");
                goto out;
            }
        }
        if (n_sliding && !window) {
            rc = kvo__error(KVO_EINVAL, "config.json: sliding layers need 'sliding_window'");
            goto out;
        }
    } else {
        n_full = (uint32_t)layers;
    }
    /* page_bytes = 2 * kv_heads * head_dim * dtype_bytes * tokens_per_block,
     * each factor up to 2^32: checked, so that a huge config cannot wrap to a
     * small accepted size (kvo_model_add_group then bounds it by 2^62). */
    uint64_t page;
    if (kvo__mul_u64(2 * kv_heads, head_dim, &page) || kvo__mul_u64(page, dtype_bytes, &page) ||
        kvo__mul_u64(page, tokens_per_block, &page) || page > (UINT64_C(1) << 62)) {
        rc = kvo__error(KVO_ERANGE, "config.json: page_bytes = 2 * num_key_value_heads (%llu) * head_dim (%llu) * "
                        "dtype bytes (%llu) * tokens_per_block (%u) exceeds 2^62; check those fields",
                        (unsigned long long)kv_heads, (unsigned long long)head_dim,
                        (unsigned long long)dtype_bytes, tokens_per_block);
        goto out;
    }
    if ((rc = kvo_model_create(name, tokens_per_hash, &m))) goto out;
    if (n_full) {
        kvo_group_desc g = kvo_group_desc_default();
        kvo__strlcpy(g.name, "full", sizeof g.name);
        g.tokens_per_block = tokens_per_block; g.layers = n_full; g.page_bytes = page;
        if ((rc = kvo_model_add_group(m, &g))) goto out;
    }
    if (n_sliding) {
        kvo_group_desc g = kvo_group_desc_default();
        kvo__strlcpy(g.name, "sliding", sizeof g.name);
        g.kind = KVO_GROUP_SLIDING; g.window = (uint32_t)window;
        g.tokens_per_block = tokens_per_block; g.layers = n_sliding; g.page_bytes = page;
        if ((rc = kvo_model_add_group(m, &g))) goto out;
    }
    *out = m;
    m = NULL;
out:
    kvo_model_destroy(m);
    json_decref(root);
    return rc;
}
