/* Tests of the configuration loader (kvo_config.h, src/connector/config.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
