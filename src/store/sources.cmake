# src/store: the files of this layer.  A file is built because it is listed
# here: configuring fails when a .c or .cu file under src/ is in no list.
kvo_sources(KVO_SOURCES store
  index.c
  minisim.c
  policy_arc.c
  policy_lru.c
  policy_prefix.c
  policy_s3fifo.c
  slots.c
  store.c
  store_prepare.c
  store_stats.c
)
