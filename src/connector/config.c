/*
 * The configuration loader (kvo_config.h): JSON -> plan, connector and file
 * tier parameters, under kvoffload's own key names and vLLM's and LMCache's.
 *
 * Layout.  One table, kvo__keys, lists every accepted key: its name, the
 * setting it fills (an enum kvo__cfg_field), how its value is read (a
 * kvo__cfg_type) and where the name comes from.  Several keys may fill one
 * setting (host_bytes, cpu_bytes_to_use, max_local_cpu_size); the config
 * keeps one value per setting plus the key that set it, so that a second key
 * giving a different value is an error naming both.  docs/config.md is the
 * same table in prose; a test checks that every key of this table appears
 * there.
 *
 * vLLM's extra config is read as kvoffload's vLLM spec (kvoffload.vllm) reads
 * it: its kvo_* keys that have a meaning for the C connector and tiers fill
 * those settings, and the ones that only tell vLLM's scheduler and workers how
 * to share the arena (kvo_arena_name, kvo_shm_dir, ...) are accepted and
 * ignored (F_IGNORED, listed together in the table).  A spec_name other than
 * kvoffload's or vLLM's CPU spec, and TieringOffloadingSpec's secondary_tiers,
 * are KVO_ENOTSUP: their keys are another reader's.
 *
 * Values are kept as uint64 (numbers, booleans, enums) or owned strings; the
 * apply functions copy the settings given into the caller's params structs
 * and leave every other field alone.
 *
 * Why this lives in src/connector/: it fills kvo_connector_params, the top
 * layer, and reads the lower layers' enums (policy, file mode); nothing below
 * the connector depends on it.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "cascade/cascade_internal.h"
#include "core/internal.h"
#include "kvoffload/kvo_remote_tier.h"

typedef enum kvo__cfg_field {
    F_MODEL, F_BLOCK_SIZE, F_BLOCKS_PER_CHUNK, F_TARGET_CHUNK_BYTES,
    F_HOST_BYTES, F_POLICY, F_ADMIT_AFTER, F_EVENT_CAPACITY, F_HUGE_PAGES, F_LOCK_MEMORY,
    F_PREFAULT, F_SHM_PATH, F_TRANSFER_THREADS, F_MAX_QUEUED_JOBS, F_SALT, F_MIN_HIT_TOKENS,
    F_SCRATCH_GROUPS, F_SLIDING_STORE, F_CHECKPOINT_INTERVAL, F_VERIFY_CHECKSUMS, F_MAX_REQUESTS,
    F_FILE_MODE, F_FILE_PERSIST, F_FILE_ROOT, F_FILE_QUOTA, F_REMOTE_URL, F_LOCAL_CPU,
    F_REMOTE_PREFIX, F_REMOTE_BUDGET, F_SNAPSHOT_GROUPS, F_FILE_ZERO_COPY,
    F_FILE_SHARED, F_FILE_MAX_PENDING, F_FILE_STAGING, F_REMOTE_TTL, F_REMOTE_IO_THREADS, F_REMOTE_MAX_PENDING,
    F_REMOTE_EXISTS_TTL, F_SPEC,
    F_REMOTE_SECRET, F_REMOTE_SECRET_PREV, F_FILE_SECRET, F_TENANTS,
    F_IGNORED, F_NESTED,
    KVO__CFG_NFIELDS
} kvo__cfg_field;
_Static_assert(KVO__CFG_NFIELDS <= 64, "kvo_config.set has one bit per setting");

typedef enum kvo__cfg_type {
    T_U64,        /* integer >= 0 */
    T_U32,        /* integer 0 .. UINT32_MAX */
    T_POS32,      /* integer 1 .. UINT32_MAX */
    T_GIB,        /* number of GiB (LMCache sizes), > 0, stored as bytes */
    T_BOOL,
    T_STR,
    T_DISK,       /* LMCache local_disk: "file:///path", a path, or null (no disk) */
    T_POLICY,     /* "lru", "arc", "s3fifo", "prefix", "ensemble", "branch" */
    T_FILE_MODE,  /* "write_through", "write_back" */
    T_SLIDING,    /* "all", "checkpoints" */
    T_SPEC,       /* vLLM's spec_name: a spec whose keys this table reads, else KVO_ENOTSUP */
    T_TIERING,    /* vLLM's secondary_tiers: TieringOffloadingSpec's, read by vLLM (KVO_ENOTSUP) */
    T_ANY,        /* accepted and ignored (vLLM's kv_transfer_config fields, engine-only keys) */
    T_OBJECT,     /* kv_connector_extra_config: parsed as a config itself */
    T_TENANTS     /* {"t-<12 hex>": bytes, ...}: each tenant's own part of the host tier */
} kvo__cfg_type;

typedef struct kvo__cfg_key {
    const char *name;
    kvo__cfg_field field;
    kvo__cfg_type type;
} kvo__cfg_key;

static const kvo__cfg_key kvo__keys[] = {
    /* kvoffload's own names */
    {"model", F_MODEL, T_STR},
    {"block_size", F_BLOCK_SIZE, T_U64},            /* also vLLM's */
    {"blocks_per_chunk", F_BLOCKS_PER_CHUNK, T_U64}, /* also vLLM's */
    {"target_chunk_bytes", F_TARGET_CHUNK_BYTES, T_U64},
    {"host_bytes", F_HOST_BYTES, T_U64},
    {"policy", F_POLICY, T_POLICY},
    {"admit_after", F_ADMIT_AFTER, T_U32},
    {"event_capacity", F_EVENT_CAPACITY, T_U32},
    {"huge_pages", F_HUGE_PAGES, T_BOOL},
    {"lock_memory", F_LOCK_MEMORY, T_BOOL},
    {"prefault", F_PREFAULT, T_BOOL},
    {"shm_path", F_SHM_PATH, T_STR},
    {"transfer_threads", F_TRANSFER_THREADS, T_POS32},
    {"max_queued_jobs", F_MAX_QUEUED_JOBS, T_POS32},
    {"salt", F_SALT, T_STR},
    {"min_hit_tokens", F_MIN_HIT_TOKENS, T_U64},
    {"scratch_groups", F_SCRATCH_GROUPS, T_U64},
    {"snapshot_groups", F_SNAPSHOT_GROUPS, T_U64},
    {"sliding_store", F_SLIDING_STORE, T_SLIDING},
    {"checkpoint_interval", F_CHECKPOINT_INTERVAL, T_U64},
    {"verify_checksums", F_VERIFY_CHECKSUMS, T_BOOL},
    {"max_requests", F_MAX_REQUESTS, T_POS32},
    {"file_mode", F_FILE_MODE, T_FILE_MODE},
    {"file_persist_on_destroy", F_FILE_PERSIST, T_BOOL},
    {"file_zero_copy", F_FILE_ZERO_COPY, T_BOOL},
    {"file_root", F_FILE_ROOT, T_STR},
    {"file_quota_bytes", F_FILE_QUOTA, T_U64},
    {"remote_key_prefix", F_REMOTE_PREFIX, T_STR},
    {"remote_lookup_budget_us", F_REMOTE_BUDGET, T_U32},
    {"remote_secret", F_REMOTE_SECRET, T_STR},          /* never in a message */
    {"remote_secret_previous", F_REMOTE_SECRET_PREV, T_STR},
    {"file_secret", F_FILE_SECRET, T_STR},
    {"tenant_host_bytes", F_TENANTS, T_TENANTS},        /* also in vLLM's extra config */
    /* vLLM kv_connector_extra_config */
    {"cpu_bytes_to_use", F_HOST_BYTES, T_U64},
    {"eviction_policy", F_POLICY, T_POLICY},
    {"store_threshold", F_ADMIT_AFTER, T_U32},
    {"spec_name", F_SPEC, T_SPEC},
    {"secondary_tiers", F_SPEC, T_TIERING},
    /* ... and kvoffload's vLLM spec (kvoffload.vllm, docs/python.md) */
    {"kvo_file_root", F_FILE_ROOT, T_STR},
    {"kvo_file_bytes", F_FILE_QUOTA, T_U64},
    {"kvo_file_mode", F_FILE_MODE, T_FILE_MODE},
    {"kvo_file_shared", F_FILE_SHARED, T_BOOL},
    {"kvo_file_zero_copy", F_FILE_ZERO_COPY, T_BOOL},
    {"kvo_file_max_pending_writes", F_FILE_MAX_PENDING, T_U32},
    {"kvo_file_staging_bytes", F_FILE_STAGING, T_U64},
    {"kvo_transfer_threads", F_TRANSFER_THREADS, T_POS32},
    {"kvo_redis_url", F_REMOTE_URL, T_STR},
    {"kvo_redis_prefix", F_REMOTE_PREFIX, T_STR},
    {"kvo_redis_ttl_s", F_REMOTE_TTL, T_U32},
    {"kvo_redis_io_threads", F_REMOTE_IO_THREADS, T_POS32},
    {"kvo_redis_max_pending_writes", F_REMOTE_MAX_PENDING, T_U32},
    {"kvo_redis_answer_ttl_ms", F_REMOTE_EXISTS_TTL, T_U32},
    /* engine-only: how vLLM's scheduler and workers share the arena and size
     * a step; they have no meaning for the C connector (accepted, ignored) */
    {"spec_module_path", F_IGNORED, T_ANY},
    {"kvo_arena_name", F_IGNORED, T_ANY},
    {"kvo_shm_dir", F_IGNORED, T_ANY},
    {"kvo_arena_processes", F_IGNORED, T_ANY},
    {"kvo_scheduler_maps_arena", F_IGNORED, T_ANY},
    {"kvo_group_bytes_per_block", F_IGNORED, T_ANY},
    {"kvo_step_tokens", F_IGNORED, T_ANY},
    {"kvo_staging_bytes", F_IGNORED, T_ANY},
    /* the tenants' own file tiers are made by whoever makes the file tier
     * (kvo_cascade_tenant.file_tier; the Python adapters from this key) */
    {"tenant_file_bytes", F_IGNORED, T_ANY},
    /* LMCache */
    {"chunk_size", F_BLOCK_SIZE, T_U64},
    {"max_local_cpu_size", F_HOST_BYTES, T_GIB},
    {"local_cpu", F_LOCAL_CPU, T_BOOL},
    {"local_disk", F_FILE_ROOT, T_DISK},
    {"max_local_disk_size", F_FILE_QUOTA, T_GIB},
    {"remote_url", F_REMOTE_URL, T_STR},
    /* vLLM kv_transfer_config (the whole object may be given) */
    {"kv_connector_extra_config", F_NESTED, T_OBJECT},
    {"kv_connector", F_IGNORED, T_ANY},
    {"kv_role", F_IGNORED, T_ANY},
    {"kv_connector_module_path", F_IGNORED, T_ANY},
    {"engine_id", F_IGNORED, T_ANY},
};
#define KVO__NKEYS (sizeof kvo__keys / sizeof kvo__keys[0])

struct kvo_config {
    uint64_t set;                         /* bit f: setting f given */
    uint64_t u[KVO__CFG_NFIELDS];         /* numbers, booleans, enums */
    char *s[KVO__CFG_NFIELDS];            /* owned strings (NULL = none) */
    const char *by[KVO__CFG_NFIELDS];     /* the key that set it (kvo__keys) */
    /* tenant_host_bytes: the tenants' parts (labels in lab) */
    kvo_cascade_tenant tenants[KVO_CASCADE_TENANTS_MAX];
    char lab[KVO_CASCADE_TENANTS_MAX][KVO_TENANT_LABEL_MAX];
    uint32_t n_tenants;
};

size_t kvo_config_key_count(void) { return KVO__NKEYS; }
const char *kvo_config_key_name(size_t i) { return i < KVO__NKEYS ? kvo__keys[i].name : NULL; }

/* Levenshtein distance, two rows on the stack (keys are short; longer input
 * is compared on its first 63 characters, enough to rank suggestions). */
static size_t kvo__edit_distance(const char *a, const char *b) {
    size_t la = strnlen(a, 63), lb = strnlen(b, 63), prev[64], cur[64];
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
    }
    return prev[lb];
}

static const char *kvo__nearest_key(const char *name) {
    const char *best = kvo__keys[0].name;
    size_t bd = (size_t)-1;
    for (size_t i = 0; i < KVO__NKEYS; i++) {
        size_t d = kvo__edit_distance(name, kvo__keys[i].name);
        if (d < bd) { bd = d; best = kvo__keys[i].name; }
    }
    return best;
}

static const char *kvo__json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a fractional number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

static int kvo__enum_value(const char *key, const char *s, const char *const *names, size_t n, uint64_t *out) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s, names[i])) { *out = i; return 0; }
    char list[128] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", i ? ", " : "", names[i]);
    return kvo__error(KVO_EINVAL, "config: %s is '%s'; use one of %s", key, s, list);
}

/* Read one value as its key's type into *u or *s (owned copy). */
static int kvo__read_value(const kvo__cfg_key *k, json_t *v, uint64_t *u, char **s) {
    static const char *const file_modes[] = {"write_through", "write_back"};
    static const char *const sliding[] = {"all", "checkpoints"};
    const char *want = NULL;
    switch (k->type) {
    case T_U64: case T_U32: case T_POS32: {
        if (!json_is_integer(v)) { want = "a non-negative integer"; break; }
        json_int_t x = json_integer_value(v);
        uint64_t lo = k->type == T_POS32, hi = k->type == T_U64 ? (uint64_t)INT64_MAX : UINT32_MAX;
        if (x < 0 || (uint64_t)x < lo || (uint64_t)x > hi)
            return kvo__error(KVO_EINVAL, "config: %s is %lld, must be in %llu..%llu", k->name, (long long)x,
                              (unsigned long long)lo, (unsigned long long)hi);
        *u = (uint64_t)x;
        return 0;
    }
    case T_GIB: {
        if (!json_is_number(v)) { want = "a number of GB (GiB, e.g. 5 or 0.5)"; break; }
        double g = json_number_value(v), bytes = g * 1073741824.0;
        if (!(g > 0) || !(bytes < 9.2e18) || bytes < 1)
            return kvo__error(KVO_EINVAL, "config: %s is %g GB; must be more than 0 and below 8e9 GB (e.g. 5)",
                              k->name, g);
        *u = (uint64_t)llround(bytes);
        return 0;
    }
    case T_BOOL:
        if (!json_is_boolean(v)) { want = "true or false"; break; }
        *u = json_is_true(v);
        return 0;
    case T_DISK:
        if (json_is_null(v) || json_is_false(v)) { *u = 0; return 0; } /* no disk tier */
        /* fall through */
    case T_STR: case T_POLICY: case T_FILE_MODE: case T_SLIDING: {
        if (!json_is_string(v)) { want = k->type == T_DISK ? "a path, \"file:///path\" or null" : "a string"; break; }
        const char *str = json_string_value(v);
        if (!*str) return kvo__error(KVO_EINVAL, "config: %s is an empty string", k->name);
        if (k->type == T_POLICY) {
            kvo_policy_kind pk;
            if (kvo_policy_parse(str, &pk)) return kvo__error_prefix(KVO_EINVAL, "config: %s", k->name);
            *u = (uint64_t)pk;
            return 0;
        }
        if (k->type == T_FILE_MODE) return kvo__enum_value(k->name, str, file_modes, 2, u);
        if (k->type == T_SLIDING) return kvo__enum_value(k->name, str, sliding, 2, u);
        if (k->type == T_DISK && !strncmp(str, "file://", 7)) str += 7;
        if (!*str) return kvo__error(KVO_EINVAL, "config: %s names no path", k->name);
        *s = kvo__strdup(str);
        if (!*s) return kvo__error(KVO_ENOMEM, "config: out of memory copying %s", k->name);
        *u = 1;
        return 0;
    }
    case T_SPEC: {
        static const char *const specs[] = {"KvoffloadOffloadingSpec", "CPUOffloadingSpec"};
        if (!json_is_string(v)) { want = "a string"; break; }
        const char *str = json_string_value(v);
        for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
            if (!strcmp(str, specs[i])) { *u = i; return 0; }
        return kvo__error(KVO_ENOTSUP, "config: spec_name is '%s'; this reader takes the keys of "
                          "'KvoffloadOffloadingSpec' and 'CPUOffloadingSpec' (TieringOffloadingSpec's "
                          "secondary_tiers are read by vLLM and kvoffload.vllm.tiering: docs/config.md)", str);
    }
    case T_TIERING:
        return kvo__error(KVO_ENOTSUP, "config: secondary_tiers is TieringOffloadingSpec's: vLLM reads it and "
                          "kvoffload.vllm.tiering makes the tiers (docs/config.md, \"Which reader takes which "
                          "keys\"); this reader takes KvoffloadOffloadingSpec's keys");
    case T_ANY: case T_OBJECT: case T_TENANTS:
        return 0;
    }
    return kvo__error(KVO_EINVAL, "config: %s is %s; it must be %s", k->name, kvo__json_kind(v), want);
}

static int kvo__config_object(kvo_config *c, json_t *obj, int depth);

/* tenant_host_bytes: an object of tenant labels (kvo_tenant_label: never a
 * salt in a config file) and byte counts. */
static int kvo__config_tenants(kvo_config *c, const kvo__cfg_key *k, json_t *v) {
    if (c->set & (1ull << k->field)) return kvo__error(KVO_EINVAL, "config: %s is given twice", k->name);
    if (!json_is_object(v))
        return kvo__error(KVO_EINVAL, "config: %s is %s; it must be an object of tenant labels and bytes",
                          k->name, kvo__json_kind(v));
    if (json_object_size(v) > KVO_CASCADE_TENANTS_MAX)
        return kvo__error(KVO_EINVAL, "config: %s names %zu tenants; at most %u have parts of their own", k->name,
                          json_object_size(v), (unsigned)KVO_CASCADE_TENANTS_MAX);
    const char *label;
    json_t *b;
    json_object_foreach(v, label, b) {
        if (!kvo__tenant_label_ok(label))
            return kvo__error(KVO_EINVAL, /* not echoed: it may be a salt put there by mistake */
                              "config: %s: a key is not a tenant label (\"default\" or \"t-\" and 12 hex digits: "
                              "kvo_tenant_label of the salt, as the per-tenant metrics show it)",
                              k->name);
        if (!json_is_integer(b) || json_integer_value(b) <= 0)
            return kvo__error(KVO_EINVAL, "config: %s: %s is %s; it must be a positive number of bytes", k->name,
                              label, kvo__json_kind(b));
        uint32_t i = c->n_tenants++;
        (void)kvo__strlcpy(c->lab[i], label, sizeof c->lab[i]);
        c->tenants[i].label = c->lab[i];
        c->tenants[i].host_bytes = (uint64_t)json_integer_value(b);
    }
    c->set |= 1ull << k->field;
    c->by[k->field] = k->name;
    return 0;
}

static int kvo__config_key(kvo_config *c, const char *name, json_t *v, int depth) {
    const kvo__cfg_key *k = NULL;
    for (size_t i = 0; i < KVO__NKEYS && !k; i++)
        if (!strcmp(kvo__keys[i].name, name)) k = &kvo__keys[i];
    if (!k)
        return kvo__error(KVO_EINVAL, "config: unknown key '%s' (nearest valid key: '%s'; docs/config.md lists "
                          "every key)", name, kvo__nearest_key(name));
    if (k->type == T_OBJECT) {
        if (!json_is_object(v))
            return kvo__error(KVO_EINVAL, "config: %s is %s; it must be an object", name, kvo__json_kind(v));
        if (depth > 0) return kvo__error(KVO_EINVAL, "config: %s may only appear at the top level", name);
        return kvo__config_object(c, v, depth + 1);
    }
    if (k->type == T_ANY) return 0;
    if (k->type == T_TENANTS) return kvo__config_tenants(c, k, v);
    uint64_t u = 0;
    char *s = NULL;
    int rc = kvo__read_value(k, v, &u, &s);
    if (rc) return rc;
    uint64_t bit = 1ull << k->field;
    if (c->set & bit) {
        bool same = c->u[k->field] == u && (!s == !c->s[k->field]) && (!s || !strcmp(s, c->s[k->field]));
        kvo__free(s);
        if (!same)
            return kvo__error(KVO_EINVAL, "config: %s and %s name one setting and give different values; "
                              "keep one of them", c->by[k->field], name);
        return 0;
    }
    if (k->field == F_LOCAL_CPU && !u)
        return kvo__error(KVO_ENOTSUP, "config: local_cpu is false, but kvoffload always keeps chunks in host "
                          "memory (size it with max_local_cpu_size or host_bytes)");
    c->set |= bit;
    c->u[k->field] = u;
    c->s[k->field] = s;
    c->by[k->field] = k->name;
    return 0;
}

static int kvo__config_object(kvo_config *c, json_t *obj, int depth) {
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        int rc = kvo__config_key(c, name, v, depth);
        if (rc) return rc;
    }
    return 0;
}

void kvo_config_destroy(kvo_config *c) {
    if (!c) return;
    for (size_t f = 0; f < KVO__CFG_NFIELDS; f++) {
        if (c->s[f] && (f == F_REMOTE_SECRET || f == F_REMOTE_SECRET_PREV || f == F_FILE_SECRET))
            explicit_bzero(c->s[f], strlen(c->s[f])); /* secrets do not outlive the config in freed memory */
        kvo__free(c->s[f]);
    }
    kvo__free(c);
}

int kvo_config_from_json(const char *text, size_t len, kvo_config **out) {
    if (!text || !out) return kvo__error(KVO_EINVAL, "kvo_config_from_json: text and out must not be NULL");
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kvo__error(KVO_EPARSE, "config: line %d, column %d: %s", je.line, je.column, je.text);
    int rc;
    kvo_config *c = NULL;
    if (!json_is_object(root)) {
        rc = kvo__error(KVO_EPARSE, "config: the top level is %s; it must be an object of keys",
                        kvo__json_kind(root));
        goto out;
    }
    c = kvo__calloc(1, sizeof *c);
    if (!c) { rc = kvo__error(KVO_ENOMEM, "config: out of memory"); goto out; }
    rc = kvo__config_object(c, root, 0);
    if (rc) {
        kvo_config_destroy(c);
        goto out;
    }
    *out = c;
out:
    json_decref(root);
    return rc;
}

int kvo_config_from_file(const char *path, kvo_config **out) {
    if (!path || !out) return kvo__error(KVO_EINVAL, "kvo_config_from_file: path and out must not be NULL");
    char *buf = NULL;
    size_t len = 0;
    int rc = kvo__read_file(path, 16u << 20, "a kvoffload configuration (JSON object)", &buf, &len);
    if (!rc) {
        rc = kvo_config_from_json(buf ? buf : "", len, out);
        if (rc) kvo__error_prefix(rc, "%s", path);
    }
    kvo__free(buf);
    return rc;
}

#define KVO__HAS(c, f) (((c)->set >> (f)) & 1u)

int kvo_config_apply_plan(const kvo_config *c, kvo_plan_params *p) {
    if (!c || !p) return kvo__error(KVO_EINVAL, "kvo_config_apply_plan: config and params must not be NULL");
    if (KVO__HAS(c, F_BLOCK_SIZE)) p->block_size = c->u[F_BLOCK_SIZE];
    if (KVO__HAS(c, F_BLOCKS_PER_CHUNK)) p->blocks_per_chunk = c->u[F_BLOCKS_PER_CHUNK];
    if (KVO__HAS(c, F_TARGET_CHUNK_BYTES)) p->target_chunk_bytes = c->u[F_TARGET_CHUNK_BYTES];
    return 0;
}

int kvo_config_apply_connector(const kvo_config *c, kvo_connector_params *p) {
    if (!c || !p) return kvo__error(KVO_EINVAL, "kvo_config_apply_connector: config and params must not be NULL");
    const uint64_t *u = c->u;
    if (KVO__HAS(c, F_HOST_BYTES)) p->host_bytes = u[F_HOST_BYTES];
    if (KVO__HAS(c, F_POLICY)) p->policy = (kvo_policy_kind)u[F_POLICY];
    if (KVO__HAS(c, F_ADMIT_AFTER)) p->admit_after = (uint32_t)u[F_ADMIT_AFTER];
    if (KVO__HAS(c, F_EVENT_CAPACITY)) p->event_capacity = (uint32_t)u[F_EVENT_CAPACITY];
    if (KVO__HAS(c, F_HUGE_PAGES)) p->huge_pages = u[F_HUGE_PAGES];
    if (KVO__HAS(c, F_LOCK_MEMORY)) p->lock_memory = u[F_LOCK_MEMORY];
    if (KVO__HAS(c, F_PREFAULT)) p->prefault = u[F_PREFAULT];
    if (KVO__HAS(c, F_SHM_PATH)) p->shm_path = c->s[F_SHM_PATH];
    if (KVO__HAS(c, F_TRANSFER_THREADS)) p->transfer_threads = (uint32_t)u[F_TRANSFER_THREADS];
    if (KVO__HAS(c, F_MAX_QUEUED_JOBS)) p->max_queued_jobs = (uint32_t)u[F_MAX_QUEUED_JOBS];
    if (KVO__HAS(c, F_TENANTS)) {
        p->tenants = c->tenants;
        p->n_tenants = c->n_tenants;
    }
    if (KVO__HAS(c, F_SALT)) {
        p->salt = c->s[F_SALT];
        p->salt_len = strlen(c->s[F_SALT]);
    }
    if (KVO__HAS(c, F_MIN_HIT_TOKENS)) p->min_hit_tokens = u[F_MIN_HIT_TOKENS];
    if (KVO__HAS(c, F_SCRATCH_GROUPS)) p->scratch_groups = u[F_SCRATCH_GROUPS];
    if (KVO__HAS(c, F_SNAPSHOT_GROUPS)) p->snapshot_groups = u[F_SNAPSHOT_GROUPS];
    if (KVO__HAS(c, F_SLIDING_STORE)) p->sliding_store = (kvo_sliding_store)u[F_SLIDING_STORE];
    if (KVO__HAS(c, F_CHECKPOINT_INTERVAL)) p->checkpoint_interval = u[F_CHECKPOINT_INTERVAL];
    if (KVO__HAS(c, F_VERIFY_CHECKSUMS)) p->verify_checksums = u[F_VERIFY_CHECKSUMS];
    if (KVO__HAS(c, F_MAX_REQUESTS)) p->max_requests = (uint32_t)u[F_MAX_REQUESTS];
    if (KVO__HAS(c, F_FILE_MODE)) p->file_mode = (kvo_file_mode)u[F_FILE_MODE];
    if (KVO__HAS(c, F_FILE_PERSIST)) p->file_persist_on_destroy = u[F_FILE_PERSIST];
    if (KVO__HAS(c, F_FILE_ZERO_COPY)) p->file_zero_copy = u[F_FILE_ZERO_COPY];
    if (KVO__HAS(c, F_REMOTE_BUDGET)) p->remote_lookup_budget_us = (uint32_t)u[F_REMOTE_BUDGET];
    if (KVO__HAS(c, F_REMOTE_EXISTS_TTL)) p->remote_exists_ttl_ms = (uint32_t)u[F_REMOTE_EXISTS_TTL];
    return 0;
}

int kvo_config_apply_file_tier(const kvo_config *c, kvo_file_tier_params *p) {
    if (!c || !p) return kvo__error(KVO_EINVAL, "kvo_config_apply_file_tier: config and params must not be NULL");
    if (kvo_config_has_file_tier(c)) p->root = c->s[F_FILE_ROOT];
    if (KVO__HAS(c, F_FILE_QUOTA)) p->quota_bytes = c->u[F_FILE_QUOTA];
    if (KVO__HAS(c, F_FILE_SHARED)) p->shared = c->u[F_FILE_SHARED];
    if (KVO__HAS(c, F_FILE_MAX_PENDING)) p->max_pending_writes = (uint32_t)c->u[F_FILE_MAX_PENDING];
    if (KVO__HAS(c, F_FILE_STAGING)) p->max_staging_bytes = c->u[F_FILE_STAGING];
    if (c->s[F_FILE_SECRET]) p->file_secret = c->s[F_FILE_SECRET];
    return 0;
}

int kvo_config_apply_remote_tier(const kvo_config *c, kvo_remote_tier_params *p) {
    if (!c || !p) return kvo__error(KVO_EINVAL, "kvo_config_apply_remote_tier: config and params must not be NULL");
    if (c->s[F_REMOTE_URL]) p->url = c->s[F_REMOTE_URL];
    if (c->s[F_REMOTE_PREFIX]) p->key_prefix = c->s[F_REMOTE_PREFIX];
    if (KVO__HAS(c, F_REMOTE_TTL)) p->ttl_s = (uint32_t)c->u[F_REMOTE_TTL];
    if (KVO__HAS(c, F_REMOTE_IO_THREADS)) p->io_threads = (uint32_t)c->u[F_REMOTE_IO_THREADS];
    if (KVO__HAS(c, F_REMOTE_MAX_PENDING)) p->max_pending_writes = (uint32_t)c->u[F_REMOTE_MAX_PENDING];
    if (c->s[F_REMOTE_SECRET]) p->secret = c->s[F_REMOTE_SECRET]; /* else the tier reads KVO_REMOTE_SECRET */
    if (c->s[F_REMOTE_SECRET_PREV]) p->secret_previous = c->s[F_REMOTE_SECRET_PREV];
    return 0;
}

bool kvo_config_has_file_tier(const kvo_config *c) { return c && c->s[F_FILE_ROOT] != NULL; }
const char *kvo_config_model(const kvo_config *c) { return c ? c->s[F_MODEL] : NULL; }
const char *kvo_config_remote_url(const kvo_config *c) { return c ? c->s[F_REMOTE_URL] : NULL; }
