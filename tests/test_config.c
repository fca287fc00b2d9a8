/* Tests of the configuration loader (kvo_config.h, src/connector/config.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kvo_test.h"

static int load(const char *json, kvo_config **out) { return kvo_config_from_json(json, strlen(json), out); }

/* The three params structs from their defaults with the config applied. */
typedef struct applied {
    kvo_plan_params plan;
    kvo_connector_params conn;
    kvo_file_tier_params file;
} applied;

static applied load_apply(const char *json, kvo_config **c) {
    applied a = {kvo_plan_default_params(), kvo_connector_default_params(), kvo_file_tier_default_params()};
    ASSERT_OK(load(json, c));
    ASSERT_OK(kvo_config_apply_plan(*c, &a.plan));
    ASSERT_OK(kvo_config_apply_connector(*c, &a.conn));
    ASSERT_OK(kvo_config_apply_file_tier(*c, &a.file));
    return a;
}

/* vLLM's kv_connector_extra_config names fill the plan and connector. */
KVO_TEST(vllm_names) {
    kvo_config *c = NULL;
    applied a = load_apply("{\"block_size\": 64, \"cpu_bytes_to_use\": 1073741824, \"eviction_policy\": \"arc\","
                           " \"store_threshold\": 2}", &c);
    kvo_plan_params pp = a.plan;
    kvo_connector_params cp = a.conn;
    uint64_t target = kvo_plan_default_params().target_chunk_bytes;
    ASSERT_EQ_U64(pp.block_size, 64);
    ASSERT_EQ_U64(pp.blocks_per_chunk, 0);
    ASSERT_EQ_U64(pp.target_chunk_bytes, target); /* not named: left alone */
    ASSERT_EQ_U64(cp.host_bytes, 1073741824ull);
    ASSERT_EQ_INT(cp.policy, KVO_POLICY_ARC);
    ASSERT_EQ_INT(cp.admit_after, 2);
    ASSERT_EQ_INT(cp.transfer_threads, kvo_connector_default_params().transfer_threads);
    ASSERT_FALSE(kvo_config_has_file_tier(c));
    ASSERT_NULL(kvo_config_model(c));
    kvo_config_destroy(c);
}

/* The whole kv_transfer_config object: the extra config is read. */
KVO_TEST(vllm_kv_transfer_config_wrapper) {
    kvo_config *c = NULL;
    applied a = load_apply("{\"kv_connector\": \"OffloadingConnector\", \"kv_role\": \"kv_both\","
                           " \"kv_connector_extra_config\": {\"blocks_per_chunk\": 4, \"cpu_bytes_to_use\": 4096}}",
                           &c);
    ASSERT_EQ_U64(a.plan.blocks_per_chunk, 4);
    ASSERT_EQ_U64(a.conn.host_bytes, 4096);
    kvo_config_destroy(c);
    /* nested once only */
    ASSERT_ERR(load("{\"kv_connector_extra_config\": {\"kv_connector_extra_config\": {}}}", &c), KVO_EINVAL);
}

/* LMCache's names: sizes in GB (GiB), local_disk as a file:// URL. */
KVO_TEST(lmcache_names) {
    kvo_config *c = NULL;
    applied a = load_apply("{\"chunk_size\": 256, \"local_cpu\": true, \"max_local_cpu_size\": 0.5,"
                           " \"local_disk\": \"file:///tmp/kvo-disk/\", \"max_local_disk_size\": 2,"
                           " \"remote_url\": \"redis://localhost:6379\"}", &c);
    ASSERT_EQ_U64(a.plan.block_size, 256);
    ASSERT_EQ_U64(a.conn.host_bytes, 512ull << 20);
    ASSERT_TRUE(kvo_config_has_file_tier(c));
    ASSERT_EQ_STR(a.file.root, "/tmp/kvo-disk/");
    ASSERT_EQ_U64(a.file.quota_bytes, 2ull << 30);
    ASSERT_EQ_STR(kvo_config_remote_url(c), "redis://localhost:6379");
    kvo_config_destroy(c);
    /* null disk: no file tier */
    ASSERT_OK(load("{\"local_disk\": null}", &c));
    ASSERT_FALSE(kvo_config_has_file_tier(c));
    kvo_config_destroy(c);
    /* local_cpu false cannot be honoured */
    ASSERT_ERR(load("{\"local_cpu\": false}", &c), KVO_ENOTSUP);
    ASSERT_CONTAINS(kvo_last_error(), "local_cpu");
}

/* kvoffload's own names, including enums and strings. */
KVO_TEST(own_names) {
    kvo_config *c = NULL;
    applied a = load_apply("{\"model\": \"gemma-4-31b-like\", \"host_bytes\": 65536, \"policy\": \"s3fifo\","
                           " \"transfer_threads\": 3, \"verify_checksums\": true, \"file_mode\": \"write_back\","
                           " \"sliding_store\": \"checkpoints\", \"checkpoint_interval\": 512, \"salt\": \"tenant-a\","
                           " \"file_root\": \"/var/tmp/kvo\", \"file_quota_bytes\": 1048576, \"prefault\": false,"
                           " \"snapshot_groups\": 4, \"file_zero_copy\": true}",
                           &c);
    const kvo_connector_params cp = a.conn;
    const kvo_file_tier_params fp = a.file;
    ASSERT_EQ_STR(kvo_config_model(c), "gemma-4-31b-like");
    ASSERT_EQ_U64(cp.host_bytes, 65536);
    ASSERT_EQ_INT(cp.policy, KVO_POLICY_S3FIFO);
    ASSERT_EQ_INT(cp.transfer_threads, 3);
    ASSERT_TRUE(cp.verify_checksums);
    ASSERT_TRUE(cp.file_zero_copy);
    ASSERT_FALSE(cp.prefault);
    ASSERT_EQ_INT(cp.file_mode, KVO_FILE_WRITE_BACK);
    ASSERT_EQ_INT(cp.sliding_store, KVO_SLIDING_STORE_CHECKPOINTS);
    ASSERT_EQ_U64(cp.checkpoint_interval, 512);
    ASSERT_EQ_U64(cp.snapshot_groups, 4);
    ASSERT_EQ_U64(cp.salt_len, 8);
    ASSERT_MEM_EQ(cp.salt, "tenant-a", 8);
    ASSERT_EQ_STR(fp.root, "/var/tmp/kvo");
    ASSERT_EQ_U64(fp.quota_bytes, 1048576);
    kvo_config_destroy(c);
}

/* An unknown key names itself and the nearest valid key. */
KVO_TEST(unknown_key_names_nearest) {
    kvo_config *c = NULL;
    ASSERT_ERR(load("{\"chunk_sise\": 256}", &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "'chunk_sise'");
    ASSERT_CONTAINS(kvo_last_error(), "'chunk_size'");
    ASSERT_ERR(load("{\"evicton_policy\": \"lru\"}", &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "'eviction_policy'");
    ASSERT_ERR(load("{\"kv_connector_extra_config\": {\"cpu_byte_to_use\": 1}}", &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "'cpu_bytes_to_use'");
    ASSERT_NULL(c);
}

/* Wrong types, ranges, enum values and malformed JSON are refused with the key named. */
KVO_TEST(bad_values) {
    kvo_config *c = NULL;
    ASSERT_ERR(load("{\"block_size\": \"64\"}", &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "block_size");
    ASSERT_ERR(load("{\"block_size\": -1}", &c), KVO_EINVAL);
    ASSERT_ERR(load("{\"transfer_threads\": 0}", &c), KVO_EINVAL);
    ASSERT_ERR(load("{\"admit_after\": 5000000000}", &c), KVO_EINVAL);
    ASSERT_ERR(load("{\"max_local_cpu_size\": 0}", &c), KVO_EINVAL);
    ASSERT_ERR(load("{\"max_local_cpu_size\": \"5GB\"}", &c), KVO_EINVAL);
    ASSERT_ERR(load("{\"eviction_policy\": \"fifo\"}", &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "eviction_policy");
    ASSERT_ERR(load("{\"file_mode\": \"async\"}", &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "write_back");
    ASSERT_ERR(load("{\"verify_checksums\": 1}", &c), KVO_EINVAL);
    ASSERT_ERR(load("{\"model\": \"\"}", &c), KVO_EINVAL);
    ASSERT_ERR(load("{\"block_size\": 64,}", &c), KVO_EPARSE);
    ASSERT_CONTAINS(kvo_last_error(), "line 1");
    ASSERT_ERR(load("[1, 2]", &c), KVO_EPARSE);
    ASSERT_ERR(load("{\"block_size\": 64, \"block_size\": 32}", &c), KVO_EPARSE);
    ASSERT_NULL(c);
}

/* Two names of one setting: same value accepted, different values refused naming both. */
KVO_TEST(aliases_must_agree) {
    kvo_config *c = NULL;
    ASSERT_OK(load("{\"block_size\": 256, \"chunk_size\": 256}", &c));
    kvo_config_destroy(c);
    c = NULL;
    ASSERT_OK(load("{\"host_bytes\": 1073741824, \"max_local_cpu_size\": 1}", &c));
    kvo_config_destroy(c);
    c = NULL;
    ASSERT_ERR(load("{\"block_size\": 256, \"chunk_size\": 128}", &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "block_size");
    ASSERT_CONTAINS(kvo_last_error(), "chunk_size");
    ASSERT_ERR(load("{\"policy\": \"lru\", \"eviction_policy\": \"arc\"}", &c), KVO_EINVAL);
    ASSERT_NULL(c);
}

/* A config file drives a real plan and connector. */
KVO_TEST(file_to_connector) {
    char path[512];
    snprintf(path, sizeof path, "%s/kvo.json", kvo_test_tmpdir());
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    fputs("{\"model\": \"gemma-4-31b-like\", \"max_local_cpu_size\": 0.25, \"eviction_policy\": \"lru\"}\n", f);
    fclose(f);
    kvo_config *c = NULL;
    ASSERT_OK(kvo_config_from_file(path, &c));
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    kvo_connector *conn = NULL;
    ASSERT_OK(kvo_model_open(kvo_config_model(c), &m));
    kvo_plan_params pp = kvo_plan_default_params();
    ASSERT_OK(kvo_config_apply_plan(c, &pp));
    ASSERT_OK(kvo_plan_create(m, &pp, &p));
    kvo_connector_params cp = kvo_connector_default_params();
    ASSERT_OK(kvo_config_apply_connector(c, &cp));
    cp.plan = p;
    cp.prefault = false;
    ASSERT_OK(kvo_connector_create(&cp, &conn));
    kvo_connector_destroy(conn);
    kvo_plan_destroy(p);
    kvo_model_destroy(m);
    kvo_config_destroy(c);
    snprintf(path, sizeof path, "%s/missing.json", kvo_test_tmpdir());
    ASSERT_ERR(kvo_config_from_file(path, &c), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "missing.json");
}

/* docs/config.md's table names every key the loader accepts. */
KVO_TEST(docs_list_every_key) {
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/config.md", KVO_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    ASSERT_NOT_NULL(f);
    static char doc[65536];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = '\0';
    ASSERT_GT_U64(kvo_config_key_count(), 30);
    for (size_t i = 0; i < kvo_config_key_count(); i++) {
        char cell[96];
        snprintf(cell, sizeof cell, "`%s`", kvo_config_key_name(i));
        ASSERT_CONTAINS(doc, cell);
    }
    ASSERT_NULL(kvo_config_key_name(kvo_config_key_count()));
}

/* -- every configuration example of the docs, fed to its reader ------------
 * The examples are the ```json blocks of README.md and docs/NAME.md and, in
 * ```python blocks, the dict given as vLLM's kv_transfer_config (its
 * comments dropped, `a << b` computed).  Readers (docs/config.md, "Which
 * reader takes which keys"): kvo_config_from_json takes every one but
 * LMCache's native_plugin adapter config (kvoffload.lmcache's keyword
 * arguments: python/tests/test_docs_config.py) and TieringOffloadingSpec's
 * (vLLM's reader: refused here with KVO_ENOTSUP naming it); the file tier's
 * header in docs/file-format.md is not a configuration. */

typedef struct doc_config {
    char where[256];  /* file and block */
    char *json;
} doc_config;

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ASSERT_NOT_NULL(buf);
    for (size_t r; (r = fread(buf + n, 1, cap - 1 - n, f)) > 0;) {
        n += r;
        if (n == cap - 1 && !(buf = realloc(buf, cap *= 2))) FAILF("out of memory reading %s", path);
    }
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* The Python dict literal at p ('{') as JSON: comments dropped, `a << b`
 * computed, trailing commas removed, True/False/None spelled as JSON. */
static char *py_dict_to_json(const char *p) {
    size_t cap = strlen(p) * 2 + 64, n = 0;
    char *o = malloc(cap);
    ASSERT_NOT_NULL(o);
    int depth = 0;
    for (; *p; p++) {
        if (*p == '"' || *p == '\'') {  /* a string, copied with double quotes */
            char q = *p++;
            o[n++] = '"';
            for (; *p && *p != q; p++) {
                if (*p == '\\' && p[1]) o[n++] = *p++;
                o[n++] = *p;
            }
            o[n++] = '"';
            continue;
        }
        if (*p == '#') {
            while (*p && *p != '\n') p++;
            if (!*p) break;
        }
        if (*p >= '0' && *p <= '9') {
            char *end;
            unsigned long long v = strtoull(p, &end, 10);
            const char *q = end;
            while (*q == ' ') q++;
            if (q[0] == '<' && q[1] == '<') {
                v <<= strtoull(q + 2, &end, 10);
            }
            n += (size_t)snprintf(o + n, cap - n, "%llu", v);
            p = end - 1;
            continue;
        }
        if (!strncmp(p, "True", 4) || !strncmp(p, "False", 5) || !strncmp(p, "None", 4)) {
            const char *w = *p == 'T' ? "true" : *p == 'F' ? "false" : "null";
            n += (size_t)snprintf(o + n, cap - n, "%s", w);
            p += strlen(*p == 'T' ? "True" : *p == 'F' ? "False" : "None") - 1;
            continue;
        }
        if (*p == ',') {  /* a trailing comma: JSON has none */
            const char *q = p + 1;
            while (*q == ' ' || *q == '\n' || *q == '#') {
                if (*q == '#') while (*q && *q != '\n') q++;
                else q++;
            }
            if (*q == '}' || *q == ']') continue;
        }
        o[n++] = *p;
        if (*p == '{' || *p == '[') depth++;
        if ((*p == '}' || *p == ']') && --depth == 0) break;
    }
    o[n] = '\0';
    return o;
}

/* Every example of one document, appended to out[*n]. */
static void doc_examples(const char *name, doc_config *out, size_t cap, size_t *n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", KVO_SOURCE_DIR, name);
    char *doc = slurp(path);
    if (!doc) FAILF("cannot read %s", path);
    int block = 0;
    for (char *p = doc; (p = strstr(p, "```")) != NULL;) {
        char *lang = p + 3, *body = strchr(lang, '\n'), *end = body ? strstr(body, "\n```") : NULL;
        if (!end) break;
        block++;
        *end = '\0';
        if (!strncmp(lang, "json\n", 5)) {
            if (*n == cap) FAILF("more than %zu examples", cap);
            snprintf(out[*n].where, sizeof out[*n].where, "%s, block %d (json)", name, block);
            out[*n].json = strdup(body + 1);
            (*n)++;
        } else if (!strncmp(lang, "python\n", 7) && strstr(body, "kv_connector_extra_config")) {
            char *k = strstr(body, "kv_transfer_config");
            char *brace = k ? strchr(k, '{') : NULL;
            if (!brace) FAILF("%s block %d: no kv_transfer_config dict", name, block);
            if (*n == cap) FAILF("more than %zu examples", cap);
            snprintf(out[*n].where, sizeof out[*n].where, "%s, block %d (python)", name, block);
            out[*n].json = py_dict_to_json(brace);
            (*n)++;
        }
        p = end + 4;
    }
    free(doc);
}

static size_t all_doc_examples(doc_config *out, size_t cap) {
    size_t n = 0;
    doc_examples("README.md", out, cap, &n);
    char cmd[1200], *list = NULL;
    snprintf(cmd, sizeof cmd, "cd '%s' && ls docs/*.md", KVO_SOURCE_DIR);
    ASSERT_EQ_INT(kvo_test_run(cmd, &list), 0);
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) doc_examples(line, out, cap, &n);
    free(list);
    return n;
}

KVO_TEST(docs_config_examples_read) {
    static doc_config ex[64];
    size_t n = all_doc_examples(ex, 64), read = 0, tiering = 0, lmcache = 0, other = 0;
    for (size_t i = 0; i < n; i++) {
        kvo_config *c = NULL;
        if (strstr(ex[i].json, "\"format\": \"kvoffload-file\"")) {
            other++;  /* the file tier's header (docs/file-format.md) */
        } else if (strstr(ex[i].json, "\"native_plugin\"")) {
            lmcache++;  /* kvoffload.lmcache's (python/tests/test_docs_config.py) */
        } else if (strstr(ex[i].json, "TieringOffloadingSpec")) {
            int rc = load(ex[i].json, &c);
            if (rc != KVO_ENOTSUP || !strstr(kvo_last_error(), "kvoffload.vllm.tiering"))
                FAILF("%s: %d (%s), expected KVO_ENOTSUP naming its reader", ex[i].where, rc, kvo_last_error());
            tiering++;
        } else {
            int rc = load(ex[i].json, &c);
            if (rc) FAILF("%s: %s (%s)\n%s", ex[i].where, kvo_error_name(rc), kvo_last_error(), ex[i].json);
            kvo_config_destroy(c);
            read++;
        }
        free(ex[i].json);
    }
    /* docs/config.md's two, docs/python.md's two whole-spec configs; its tiering one; engines.md's LMCache */
    if (read < 4 || tiering < 1 || lmcache < 1 || other < 1)
        FAILF("%zu examples: %zu read, %zu tiering, %zu LMCache, %zu others: the extraction lost some",
              n, read, tiering, lmcache, other);
}

/* The vLLM config of docs/python.md, as a user writes it to a JSON file, in
 * `kvoffload demo --config` (its sizes, directory and Redis made to fit the
 * test: a 64 MiB host tier, a 256 MiB file tier in a temporary directory,
 * the test cluster or none). */
KVO_TEST(demo_takes_the_docs_vllm_config) {
    static doc_config ex[64];
    size_t n = all_doc_examples(ex, 64);
    json_t *cfg = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!cfg && strstr(ex[i].where, "python.md") && strstr(ex[i].json, "kvo_file_root"))
            cfg = json_loads(ex[i].json, 0, NULL);
        free(ex[i].json);
    }
    ASSERT_NOT_NULL(cfg);
    json_t *extra = json_object_get(cfg, "kv_connector_extra_config");
    ASSERT_NOT_NULL(extra);
    char dir[600], path[700], url[128], args[1600];
    snprintf(dir, sizeof dir, "%s/docs-files", kvo_test_tmpdir());
    json_object_set_new(extra, "kvo_file_root", json_string(dir));
    json_object_set_new(extra, "cpu_bytes_to_use", json_integer(64 << 20));
    json_object_set_new(extra, "kvo_file_bytes", json_integer(256 << 20));
    const char *redis = getenv("KVO_TEST_REDIS");
    if (redis) {
        snprintf(url, sizeof url, "redis://%s", redis);
        json_object_set_new(extra, "kvo_redis_url", json_string(url));
        json_object_set_new(extra, "kvo_redis_prefix", json_string("kvo-test-docs-config"));
    } else {
        json_object_del(extra, "kvo_redis_url");
    }
    snprintf(path, sizeof path, "%s/vllm.json", kvo_test_tmpdir());
    ASSERT_EQ_INT(json_dump_file(cfg, path, JSON_INDENT(2)), 0);
    json_decref(cfg);
    snprintf(args, sizeof args, "'%s' demo --quiet --requests 12 --config '%s' 2>&1", KVO_CLI_PATH, path);
    char *out = NULL;
    int st = kvo_test_run(args, &out);
    if (st != 0) FAILF("demo --config %s: exit %d: %s", path, st, out ? out : "");
    ASSERT_CONTAINS(out, "MATCH");
    ASSERT_CONTAINS(out, "host tier 64 MiB");
    ASSERT_CONTAINS(out, dir);  /* the file tier where the config says */
    free(out);
}

/* tenant_host_bytes: labels (never salts) and positive byte counts, once. */
KVO_TEST(tenant_host_bytes_takes_labels_and_bytes) {
    kvo_config *c = NULL;
    ASSERT_OK(load("{\"tenant_host_bytes\": {\"t-0123456789ab\": 8192, \"default\": 4096}}", &c));
    kvo_connector_params p = kvo_connector_default_params();
    ASSERT_OK(kvo_config_apply_connector(c, &p));
    ASSERT_EQ_U64(p.n_tenants, 2);
    ASSERT_EQ_STR(p.tenants[0].label, "t-0123456789ab");
    ASSERT_EQ_U64(p.tenants[0].host_bytes, 8192);
    ASSERT_EQ_STR(p.tenants[1].label, "default");
    kvo_config_destroy(c);
    ASSERT_ERR(load("{\"tenant_host_bytes\": {\"acme-secret\": 8192}}", &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "not a tenant label");
    ASSERT_NULL(strstr(kvo_last_error(), "acme")); /* a salt put there by mistake is not echoed */
    ASSERT_ERR(load("{\"tenant_host_bytes\": {\"t-0123456789ab\": \"8k\"}}", &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "positive number of bytes");
    ASSERT_ERR(load("{\"tenant_host_bytes\": [1]}", &c), KVO_EINVAL);
    ASSERT_ERR(load("{\"tenant_host_bytes\": {}, \"kv_connector_extra_config\": {\"tenant_host_bytes\": {}}}", &c),
               KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "given twice");
}
