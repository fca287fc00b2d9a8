/*
 * Built-in model presets: the kvoffload-model/1 geometries of shared/models,
 * embedded verbatim (minus the notes) so that the tool works without the files.
 * tests/test_model.c checks that each preset equals its file.
 */
#include "geometry/geometry_internal.h"

static const struct { const char *name; const char *json; } kvo__presets[] = {
    {"deepseek-v4-flash-like",
     "{\"format\":\"kvoffload-model/1\",\"name\":\"deepseek-v4-flash-like\",\"tokens_per_hash\":32,\"groups\":[{\"name\":\"mla0\",\"kind\":\"full\",\"tokens_per_block\":32,\"layers\":4,\"page_bytes\":20992},{\"name\":\"mla1\",\"kind\":\"full\",\"tokens_per_block\":32,\"layers\":4,\"page_bytes\":20992},{\"name\":\"mla2\",\"kind\":\"full\",\"tokens_per_block\":32,\"layers\":4,\"page_bytes\":20992},{\"name\":\"mla3\",\"kind\":\"full\",\"tokens_per_block\":32,\"layers\":3,\"page_bytes\":20992},{\"name\":\"swa0\",\"kind\":\"sliding\",\"tokens_per_block\":32,\"layers\":8,\"page_bytes\":20992,\"window\":128},{\"name\":\"swa1\",\"kind\":\"sliding\",\"tokens_per_block\":32,\"layers\":8,\"page_bytes\":20992,\"window\":128},{\"name\":\"swa2\",\"kind\":\"sliding\",\"tokens_per_block\":32,\"layers\":8,\"page_bytes\":20992,\"window\":128},{\"name\":\"indexer\",\"kind\":\"full\",\"tokens_per_block\":64,\"layers\":15,\"page_bytes\":8448},{\"name\":\"circular\",\"kind\":\"sliding\",\"tokens_per_block\":8,\"layers\":15,\"page_bytes\":2048,\"window\":8,\"cacheable\":false}]}"},
    {"gemma-4-31b-like",
     "{\"format\":\"kvoffload-model/1\",\"name\":\"gemma-4-31b-like\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"sliding\",\"kind\":\"sliding\",\"tokens_per_block\":16,\"layers\":50,\"page_bytes\":65536,\"window\":1024},{\"name\":\"full\",\"kind\":\"full\",\"tokens_per_block\":64,\"layers\":10,\"page_bytes\":65536}]}"},
    {"glm-5.3-flash-like",
     "{\"format\":\"kvoffload-model/1\",\"name\":\"glm-5.3-flash-like\",\"tokens_per_hash\":64,\"groups\":[{\"name\":\"mla\",\"kind\":\"full\",\"tokens_per_block\":3584,\"layers\":22,\"page_bytes\":2351104},{\"name\":\"tail\",\"kind\":\"full\",\"tokens_per_block\":4,\"layers\":11,\"page_bytes\":528},{\"name\":\"state0\",\"kind\":\"state\",\"tokens_per_block\":3584,\"layers\":6,\"page_bytes\":2359296},{\"name\":\"state1\",\"kind\":\"state\",\"tokens_per_block\":3584,\"layers\":6,\"page_bytes\":2359296},{\"name\":\"state2\",\"kind\":\"state\",\"tokens_per_block\":3584,\"layers\":6,\"page_bytes\":2359296},{\"name\":\"state3\",\"kind\":\"state\",\"tokens_per_block\":3584,\"layers\":6,\"page_bytes\":2359296},{\"name\":\"draft\",\"kind\":\"full\",\"tokens_per_block\":64,\"layers\":1,\"page_bytes\":262144,\"draft\":true}]}"},
    {"gpt-oss-20b",
     "{\"format\":\"kvoffload-model/1\",\"name\":\"gpt-oss-20b\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"full\",\"kind\":\"full\",\"tokens_per_block\":16,\"layers\":12,\"page_bytes\":32768},{\"name\":\"sliding\",\"kind\":\"sliding\",\"tokens_per_block\":16,\"layers\":12,\"page_bytes\":32768,\"window\":128}]}"},
    {"llama-3.1-8b",
     "{\"format\":\"kvoffload-model/1\",\"name\":\"llama-3.1-8b\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"attn\",\"kind\":\"full\",\"tokens_per_block\":16,\"layers\":32,\"page_bytes\":65536}]}"},
    {"qwen3-next-80b-like",
     "{\"format\":\"kvoffload-model/1\",\"name\":\"qwen3-next-80b-like\",\"tokens_per_hash\":16,\"groups\":[{\"name\":\"full\",\"kind\":\"full\",\"tokens_per_block\":16,\"layers\":12,\"page_bytes\":32768},{\"name\":\"state\",\"kind\":\"state\",\"tokens_per_block\":512,\"layers\":36,\"page_bytes\":1081344}]}"},
};

size_t kvo_model_preset_count(void) { return sizeof kvo__presets / sizeof kvo__presets[0]; }

const char *kvo_model_preset_name(size_t i) {
    return i < kvo_model_preset_count() ? kvo__presets[i].name : NULL;
}

int kvo_model_preset(const char *name, kvo_model **out) {
    char list[512] = "";
    if (!name || !out) return kvo__error(KVO_EINVAL, "kvo_model_preset: name and out must not be NULL");
    for (size_t i = 0; i < kvo_model_preset_count(); i++) {
        if (strcmp(kvo__presets[i].name, name) == 0)
            return kvo_model_from_json(kvo__presets[i].json, strlen(kvo__presets[i].json), name, out);
        if (i) strncat(list, ", ", sizeof list - strlen(list) - 1);
        strncat(list, kvo__presets[i].name, sizeof list - strlen(list) - 1);
    }
    return kvo__error(KVO_ENOTFOUND, "no preset named '%s'; presets: %s", name, list);
}
