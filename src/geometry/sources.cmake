# src/geometry: the files of this layer.  A file is built because it is listed
# here: configuring fails when a .c or .cu file under src/ is in no list.
kvo_sources(KVO_SOURCES geometry
  model.c
  model_json.c
  model_open.c
  plan.c
  presets.c
)
