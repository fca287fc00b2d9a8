# src/tiers: the files of this layer.  A file is built because it is listed
# here: configuring fails when a .c or .cu file under src/ is in no list.
kvo_sources(KVO_SOURCES tiers
  arena.c
  file_common.c
  file_format.c
  file_ops.c
  file_pin.c
  file_probe.c
  file_queue.c
  file_quota.c
  file_scan.c
  file_share.c
  file_testing.c
  file_tier.c
  file_workers.c
  remote_stub.c
  seal.c
)
# io_uring back end of the file tier (liburing; KVO_WITH_URING)
kvo_sources(KVO_URING_SOURCES tiers/uring
  file_uring.c
)
# Redis Cluster tier (hiredis; KVO_WITH_REDIS); without it remote_stub.c
# provides the public functions, returning KVO_ENOTSUP.
kvo_sources(KVO_REDIS_SOURCES tiers/remote
  cluster.c
  pipeline.c
  remote_completions.c
  remote_tier.c
  reply.c
)
