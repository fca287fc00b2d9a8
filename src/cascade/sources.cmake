# src/cascade: the files of this layer (the one way through the tiers).  A
# file is built because it is listed here: configuring fails when a .c or
# .cu file under src/ is in no list.
kvo_sources(KVO_SOURCES cascade
  cascade.c
  direct.c
  dispatch.c
  lookup.c
  namespace.c
  poll.c
  presence.c
  promote.c
  store.c
  tierio.c
)
