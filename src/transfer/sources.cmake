# src/transfer: the files of this layer.  A file is built because it is listed
# here: configuring fails when a .c or .cu file under src/ is in no list.
kvo_sources(KVO_SOURCES transfer
  copy.c
  copy_auto.c
  device.c
  layout.c
  transfer.c
  transfer_queue.c
  transfer_submit.c
  transfer_worker.c
)
# The CUDA device's copy planning needs no CUDA: part of the core, so its
# tests run on every build.
kvo_sources(KVO_CUDA_PLAN_SOURCES transfer/cuda
  cuda_plan.c
)
# The CUDA device itself (KVO_CUDA): its own library.  Plain C, no CUDA
# header (the driver is loaded at run time); also compiled into
# tests/test_transfer_cuda_fake.c against a fake driver on every build.
kvo_sources(KVO_CUDA_SOURCES transfer/cuda
  cuda.c
  cuda_driver.c
  device_cuda.c
)
# The kernel: compiled by nvcc into embedded images (CMakeLists.txt, CUDA
# section), never into an object of its own.
kvo_sources(KVO_CUDA_KERNEL_SOURCES transfer/cuda
  kernels.cu
)
# Only in libkvoffload_cuda.so: the core functions through libkvoffload.so's
# table (kvo_xfer_device_attach).
kvo_sources(KVO_CUDA_SHARED_SOURCES transfer/cuda
  cuda_shared.c
)
