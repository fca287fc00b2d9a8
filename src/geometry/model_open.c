/*
 * kvo_model_open: the one entry point that takes "a preset name or a path"
 * (the CLI's --model, the Python package, the engine) and dispatches to
 * presets.c or model_json.c.  It is the top of the geometry folder: nothing
 * calls up into it (geometry_internal.h states the layering).
 *
 * The rule: an exact preset name wins; else a name that exists as a file,
 * contains '/' or ends in ".json" is loaded as a file; else the preset
 * lookup's error (which lists the presets) is returned, prefixed.
 */
#include <unistd.h>

#include "geometry/geometry_internal.h"

int kvo_model_open(const char *preset_or_path, kvo_model **out) {
    if (!preset_or_path || !out) return kvo__error(KVO_EINVAL, "kvo_model_open: NULL argument");
    for (size_t i = 0; i < kvo_model_preset_count(); i++)
        if (strcmp(kvo_model_preset_name(i), preset_or_path) == 0)
            return kvo_model_preset(preset_or_path, out);
    size_t n = strlen(preset_or_path);
    if (access(preset_or_path, F_OK) == 0 || strchr(preset_or_path, '/') ||
        (n > 5 && strcmp(preset_or_path + n - 5, ".json") == 0))
        return kvo_model_load_file(preset_or_path, out);
    int rc = kvo_model_preset(preset_or_path, out); /* sets the "presets: ..." message */
    return kvo__error_prefix(rc, "'%s' is neither a preset nor an existing file", preset_or_path);
}
