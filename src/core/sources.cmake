# src/core: the files of this layer.  A file is built because it is listed
# here: configuring fails when a .c or .cu file under src/ is in no list.
kvo_sources(KVO_SOURCES core
  alloc.c
  error.c
  grow.c
  hmap.c
  log.c
  readfile.c
  ring.c
)
