/* Tests of the model description: JSON reading and writing, presets, the
 * Hugging Face import, and a corpus of broken inputs (run under ASan in CI). */
#include <stdlib.h>

#include "kvo_test.h"

static int models_equal(const kvo_model *a, const kvo_model *b) {
    if (strcmp(kvo_model_name(a), kvo_model_name(b)) || kvo_model_tokens_per_hash(a) != kvo_model_tokens_per_hash(b) ||
        kvo_model_num_groups(a) != kvo_model_num_groups(b))
        return 0;
    for (size_t i = 0; i < kvo_model_num_groups(a); i++) {
        const kvo_group_desc *x = kvo_model_group(a, i), *y = kvo_model_group(b, i);
        if (strcmp(x->name, y->name) || x->kind != y->kind || x->tokens_per_block != y->tokens_per_block ||
            x->layers != y->layers || x->page_bytes != y->page_bytes || x->window != y->window ||
            x->cacheable != y->cacheable || x->draft != y->draft)
            return 0;
    }
    return 1;
}

KVO_TEST(presets_equal_shared_files) {
    ASSERT_EQ_U64(kvo_model_preset_count(), 6);
    for (size_t i = 0; i < kvo_model_preset_count(); i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/%s.json", kvo_model_preset_name(i));
        const char *path = kvo_test_shared_path(rel);
        kvo_model *f = NULL, *p = NULL;
        ASSERT_OK(kvo_model_load_file(path, &f));
        ASSERT_OK(kvo_model_preset(kvo_model_preset_name(i), &p));
        ASSERT_TRUE(models_equal(f, p));
        kvo_model_destroy(f);
        kvo_model_destroy(p);
    }
}

KVO_TEST(preset_fields) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_preset("deepseek-v4-flash-like", &m));
    ASSERT_EQ_U64(kvo_model_num_groups(m), 9);
    ASSERT_EQ_U64(kvo_model_tokens_per_hash(m), 32);
    const kvo_group_desc *c = kvo_model_group(m, 8);
    ASSERT_EQ_STR(c->name, "circular");
    ASSERT_EQ_INT(c->kind, KVO_GROUP_SLIDING);
    ASSERT_EQ_U64(c->window, 8);
    ASSERT_FALSE(c->cacheable);
    ASSERT_EQ_U64(kvo_model_group(m, 7)->tokens_per_block, 64);
    kvo_model_destroy(m);
    ASSERT_ERR(kvo_model_preset("nope", &m), KVO_ENOTFOUND);
    ASSERT_CONTAINS(kvo_last_error(), "gemma-4-31b-like");
    ASSERT_ERR(kvo_model_open("nope", &m), KVO_ENOTFOUND);
    ASSERT_OK(kvo_model_open("gpt-oss-20b", &m));
    kvo_model_destroy(m);
}

KVO_TEST(json_round_trip) {
    for (size_t i = 0; i < kvo_model_preset_count(); i++) {
        kvo_model *a = NULL, *b = NULL;
        char *s = NULL;
        ASSERT_OK(kvo_model_preset(kvo_model_preset_name(i), &a));
        ASSERT_OK(kvo_model_to_json(a, &s));
        ASSERT_OK(kvo_model_from_json(s, strlen(s), "round-trip", &b));
        ASSERT_TRUE(models_equal(a, b));
        kvo_free(s);
        kvo_model_destroy(a);
        kvo_model_destroy(b);
    }
}

KVO_TEST(model_built_in_code) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_create("engine", 16, &m));
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "attn");
    g.tokens_per_block = 16;
    g.layers = 2;
    g.page_bytes = 4096;
    ASSERT_OK(kvo_model_add_group(m, &g));
    ASSERT_ERR(kvo_model_add_group(m, &g), KVO_EINVAL); /* duplicate name */
    ASSERT_CONTAINS(kvo_last_error(), "already used");
    snprintf(g.name, sizeof g.name, "swa");
    g.kind = KVO_GROUP_SLIDING;
    ASSERT_ERR(kvo_model_add_group(m, &g), KVO_EINVAL); /* window missing */
    ASSERT_CONTAINS(kvo_last_error(), "window");
    g.window = 64;
    ASSERT_OK(kvo_model_add_group(m, &g));
    g.kind = KVO_GROUP_STATE;
    snprintf(g.name, sizeof g.name, "st");
    ASSERT_ERR(kvo_model_add_group(m, &g), KVO_EINVAL); /* window on a state group */
    g.window = 0;
    g.page_bytes = 0;
    ASSERT_ERR(kvo_model_add_group(m, &g), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "page_bytes");
    ASSERT_EQ_U64(kvo_model_num_groups(m), 2);
    ASSERT_EQ_INT(kvo_model_find_group(m, "swa"), 1);
    ASSERT_ERR(kvo_model_find_group(m, "x"), KVO_ENOTFOUND);
    kvo_model_destroy(m);
    ASSERT_ERR(kvo_model_create("", 16, &m), KVO_EINVAL);
    ASSERT_ERR(kvo_model_create("x", 0, &m), KVO_EINVAL);
}

/* Each broken input must fail with the expected code and a message that names
 * the field (or gives a line for syntax errors), never crash. */
static const struct {
    const char *json;
    int err;
    const char *needle;
} corpus[] = {
    {"", KVO_EPARSE, "1:"},
    {"{", KVO_EPARSE, "malformed JSON"},
    {"{\"format\":\"kvoffload-model/1\",\n\"name\":\"x\",\n\"tokens_per_hash\":16,\n\"groups\":[{]}", KVO_EPARSE, ":4:"},
    {"[]", KVO_EINVAL, "object"},
    {"null", KVO_EPARSE, ""},
    {"{\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[]}", KVO_EINVAL, "'format'"},
    {"{\"format\":\"kvoffload-model/2\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[]}", KVO_EINVAL, "expected"},
    {"{\"format\":\"kvoffload-model/1\",\"tokens_per_hash\":16,\"groups\":[]}", KVO_EINVAL, "'name'"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"groups\":[]}", KVO_EINVAL, "'tokens_per_hash'"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":\"16\",\"groups\":[]}", KVO_EINVAL, "string"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16.5,\"groups\":[]}", KVO_EINVAL, "fractional"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":-16,\"groups\":[]}", KVO_EINVAL, "-16"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":0,\"groups\":[]}", KVO_EINVAL, "tokens_per_hash"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":99999999999999999999999,\"groups\":[]}", KVO_EPARSE, "too big"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16}", KVO_EINVAL, "'groups'"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[]}", KVO_EINVAL, "non-empty"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":{}}", KVO_EINVAL, "array"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[7]}", KVO_EINVAL, "groups[0]"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[{\"kind\":\"full\"}]}", KVO_EINVAL, "'name'"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"a\",\"kind\":\"dense\",\"tokens_per_block\":16,\"layers\":1,\"page_bytes\":1}]}", KVO_EINVAL, "'kind'"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"a\",\"kind\":\"full\",\"layers\":1,\"page_bytes\":1}]}", KVO_EINVAL, "'tokens_per_block'"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"a\",\"kind\":\"full\",\"tokens_per_block\":16,\"page_bytes\":1}]}", KVO_EINVAL, "'layers'"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"a\",\"kind\":\"full\",\"tokens_per_block\":16,\"layers\":1}]}", KVO_EINVAL, "'page_bytes'"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"a\",\"kind\":\"sliding\",\"tokens_per_block\":16,\"layers\":1,\"page_bytes\":1}]}", KVO_EINVAL, "'window'"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"a\",\"kind\":\"full\",\"tokens_per_block\":16,\"layers\":1,\"page_bytes\":1,\"cacheable\":\"no\"}]}", KVO_EINVAL, "'cacheable'"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"a\",\"kind\":\"full\",\"tokens_per_block\":4294967296,\"layers\":1,\"page_bytes\":1}]}", KVO_ERANGE, "tokens_per_block"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"a\",\"kind\":\"full\",\"tokens_per_block\":16,\"layers\":1,\"page_bytes\":9223372036854775807}]}", KVO_ERANGE, "page_bytes"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"a\",\"kind\":\"full\",\"tokens_per_block\":16,\"layers\":1,\"page_bytes\":1},{\"name\":\"a\",\"kind\":\"full\",\"tokens_per_block\":16,\"layers\":1,\"page_bytes\":1}]}", KVO_EINVAL, "already used"},
    {"{\"format\":\"kvoffload-model/1\",\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[]}", KVO_EPARSE, "duplicate"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"a\",\"kind\":\"full\",\"tokens_per_block\":16,\"layers\":1,\"page_bytes\":1}]}", KVO_EINVAL, "name"},
    {"{\"format\":\"kvoffload-model/1\",\"name\":\"x\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"a\",\"kind\":\"full\",\"tokens_per_block\":16,\"layers\":1,\"page_bytes\":1}]} trailing", KVO_EPARSE, "end of file"},
    {"\xff\xfe{}", KVO_EPARSE, ""},
};

KVO_TEST(broken_json_corpus) {
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++) {
        kvo_model *m = NULL;
        int rc = kvo_model_from_json(corpus[i].json, strlen(corpus[i].json), "corpus.json", &m);
        if (rc != corpus[i].err)
            FAILF("corpus[%zu]: got %s, expected %s: %s", i, kvo_error_name(rc), kvo_error_name(corpus[i].err),
                  kvo_last_error());
        ASSERT_NULL(m);
        ASSERT_CONTAINS(kvo_last_error(), "corpus.json");
        ASSERT_CONTAINS(kvo_last_error(), corpus[i].needle);
    }
}

KVO_TEST(truncations_and_byte_flips_never_crash) {
    kvo_model *p = NULL;
    char *s = NULL;
    ASSERT_OK(kvo_model_preset("glm-5.3-flash-like", &p));
    ASSERT_OK(kvo_model_to_json(p, &s));
    size_t n = strlen(s);
    char *buf = malloc(n + 1);
    int ok = 0;
    for (size_t cut = 0; cut < n; cut++) { /* every truncation fails cleanly */
        kvo_model *m = NULL;
        memcpy(buf, s, cut);
        ASSERT_NE_INT(kvo_model_from_json(buf, cut, "t", &m), 0);
        ASSERT_NULL(m);
    }
    for (int iter = 0; iter < 4000; iter++) { /* random byte flips: fail cleanly or parse */
        kvo_model *m = NULL;
        memcpy(buf, s, n);
        for (int k = 0; k < 3; k++) buf[kvo_test_rand() % n] = (char)(kvo_test_rand() & 0xff);
        int rc = kvo_model_from_json(buf, n, "f", &m);
        if (rc == 0) { ok++; kvo_model_destroy(m); }
        else ASSERT_NULL(m);
    }
    (void)ok;
    free(buf);
    kvo_free(s);
    kvo_model_destroy(p);
}

KVO_TEST(load_file_errors) {
    kvo_model *m = NULL;
    ASSERT_ERR(kvo_model_load_file("/nonexistent/model.json", &m), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "/nonexistent/model.json");
    ASSERT_ERR(kvo_model_load_file("/", &m), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "is a directory");
}

KVO_TEST(hf_config_import) {
    const char *cfg = "{\"num_hidden_layers\": 24, \"num_attention_heads\": 64, \"num_key_value_heads\": 8,"
                      " \"head_dim\": 64, \"sliding_window\": 128, \"torch_dtype\": \"bfloat16\","
                      " \"layer_types\": [" 
                      "\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\","
                      "\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\","
                      "\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\","
                      "\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\","
                      "\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\","
                      "\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\"]}";
    kvo_model *m = NULL, *ref = NULL;
    ASSERT_OK(kvo_model_from_hf_config(cfg, strlen(cfg), "gpt-oss-20b", 16, 16, &m));
    ASSERT_OK(kvo_model_preset("gpt-oss-20b", &ref));
    ASSERT_EQ_U64(kvo_model_num_groups(m), 2);
    const kvo_group_desc *full = kvo_model_group(m, (size_t)kvo_model_find_group(m, "full"));
    const kvo_group_desc *swa = kvo_model_group(m, (size_t)kvo_model_find_group(m, "sliding"));
    /* same geometry as the hand-written preset */
    ASSERT_EQ_U64(full->layers, kvo_model_group(ref, 0)->layers);
    ASSERT_EQ_U64(full->page_bytes, kvo_model_group(ref, 0)->page_bytes);
    ASSERT_EQ_U64(swa->layers, 12);
    ASSERT_EQ_U64(swa->window, 128);
    kvo_model_destroy(m);
    kvo_model_destroy(ref);
    const char *llama = "{\"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
                        " \"hidden_size\": 4096, \"torch_dtype\": \"bfloat16\"}";
    ASSERT_OK(kvo_model_from_hf_config(llama, strlen(llama), "llama", 16, 16, &m));
    ASSERT_EQ_U64(kvo_model_num_groups(m), 1);
    ASSERT_EQ_U64(kvo_model_group(m, 0)->page_bytes, 65536);
    kvo_model_destroy(m);
    const char *bad = "{\"num_hidden_layers\": 2, \"num_key_value_heads\": 8, \"head_dim\": 64,"
                      " \"layer_types\": [\"linear_attention\", \"full_attention\"]}";
    ASSERT_ERR(kvo_model_from_hf_config(bad, strlen(bad), "q", 16, 16, &m), KVO_ENOTSUP);
    ASSERT_CONTAINS(kvo_last_error(), "layer_types[0]");
    const char *missing = "{\"num_attention_heads\": 8}";
    ASSERT_ERR(kvo_model_from_hf_config(missing, strlen(missing), "q", 16, 16, &m), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "num_hidden_layers");
}

/* issue 18 item 14: 2 * 2^31 * (2^31 + 1) * 2 * 16 = 2^68 + 2^37 wrapped to
 * 2^37 and was accepted as a 128 GiB page; it must be refused, naming the
 * fields and their values. */
KVO_TEST(hf_config_page_bytes_overflow) {
    const char *huge = "{\"num_hidden_layers\": 2, \"num_key_value_heads\": 2147483648,"
                       " \"head_dim\": 2147483649, \"torch_dtype\": \"bfloat16\"}";
    kvo_model *m = NULL;
    ASSERT_ERR(kvo_model_from_hf_config(huge, strlen(huge), "huge", 16, 16, &m), KVO_ERANGE);
    ASSERT_NULL(m);
    ASSERT_CONTAINS(kvo_last_error(), "num_key_value_heads (2147483648)");
    ASSERT_CONTAINS(kvo_last_error(), "head_dim (2147483649)");
    ASSERT_CONTAINS(kvo_last_error(), "tokens_per_block (16)");
    /* no wrap, but above 2^62: refused too (float32, 2^31 * 2^31 * 2 * 4 * 4096) */
    const char *big = "{\"num_hidden_layers\": 2, \"num_key_value_heads\": 2147483648,"
                      " \"head_dim\": 2147483648, \"torch_dtype\": \"float32\"}";
    ASSERT_ERR(kvo_model_from_hf_config(big, strlen(big), "big", 4096, 16, &m), KVO_ERANGE);
    /* the largest page that fits is accepted */
    const char *ok = "{\"num_hidden_layers\": 2, \"num_key_value_heads\": 65536,"
                     " \"head_dim\": 65536, \"torch_dtype\": \"bfloat16\"}";
    ASSERT_OK(kvo_model_from_hf_config(ok, strlen(ok), "ok", 16, 16, &m));
    ASSERT_EQ_U64(kvo_model_group(m, 0)->page_bytes, UINT64_C(2) * 65536 * 65536 * 2 * 16);
    kvo_model_destroy(m);
}
