# src/connector: the files of this layer.  A file is built because it is listed
# here: configuring fails when a .c or .cu file under src/ is in no list.
kvo_sources(KVO_SOURCES connector
  agree.c
  config.c
  controls.c
  cq.c
  create.c
  lifecycle.c
  load.c
  lookup.c
  map.c
  metrics.c
  poll.c
  relayout.c
  request.c
  tenant.c
  update.c
)
