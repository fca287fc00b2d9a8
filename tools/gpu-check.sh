#!/usr/bin/env bash
# The GPU check of the CUDA transfer device (docs/gpu.md), in two halves:
#
#   tools/gpu-check.sh prepare DIR   here, on a build machine with the CUDA
#       toolkit: a Release build with -DKVO_CUDA=ON (build-gpucheck/), then
#       into DIR (at most 20 MiB, checked; plain files only): the CUDA test
#       programs (tests/test_cuda*.c, test_transfer_cuda_plan and
#       test_transfer_cuda_fake) and the list of their tests, the `kvoffload`
#       CLI (for `bench transfer --device cuda`), a GPU probe,
#       libkvoffload.so and libkvoffload_cuda.so, the Python package with a
#       stand-in for the few vLLM types its worker uses (the GPU machine has
#       torch, not vLLM), the shared libraries the programs load that a
#       machine with only the NVIDIA driver may lack (libcudart for the test
#       programs, jansson, xxhash, ...; never libcuda, which is the driver's),
#       and this script.
#   DIR/gpu-check.sh run DIR         there, on the GPU machine (bash,
#       coreutils and the NVIDIA driver; python3 with torch and numpy for the
#       worker step; no cmake, no compiler), in at most 8 minutes:
#         - the probe (card, driver, runtime);
#         - every CUDA test, one line each (byte-exact round trips of every
#           preset and of the engine shapes with one batch or launch per
#           job, the ordering tests with their negative controls, the
#           completion timeout fault, kvo_cuda_job_event, the shapes);
#         - a round trip through the vLLM worker (python/kvoffload/vllm/
#           worker.py) with torch CUDA tensors of 64 layers x 32 KiB pages,
#           torch's CUDA runtime and libkvoffload_cuda.so in one process;
#         - `kvoffload bench transfer --device cuda --json` at the engine
#           shapes 64x32KiB, 160x8KiB, 61x18KiB, 1x2MiB, both directions,
#           each figure against one contiguous copy of the same bytes (goal
#           >= 0.85) and vLLM's way, one cuMemcpyBatchAsync per job (goal
#           >= 1.0), measured in the same run: a figure under its goal is a
#           failure.
#       Each result is one line; the last is `gpu-check: N passed, M failed`.
#       Exit 0 only when nothing failed (a wrong byte fails its test).  Logs,
#       bench-transfer-cuda.json and summary.txt go to $OUT when set, else
#       DIR/out.
#
# Without a usable device every device step is reported as skipped (that is
# the dry run: `tools/gpu-check.sh prepare /tmp/g && /tmp/g/gpu-check.sh run
# /tmp/g` here; .ci/run does it).  With a GPU (nvidia-smi lists one) a device
# step that skips is a failure, except those that need two devices (or
# 4.5 GiB to spare) and no_device_fails_cleanly, which can only run without
# one.
set -uo pipefail

usage() { echo "usage: gpu-check.sh prepare DIR | run DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
mode=$1
dir=$2
MAX_MIB=20
GOAL_CONTIGUOUS=0.85 # of one contiguous copy of the same bytes, each shape and direction
GOAL_VLLM=1.0        # of vLLM's way (one cuMemcpyBatchAsync per job), each shape and direction

# The stand-in for vLLM's interface types the worker imports (vllm.v1.
# kv_offload.base and .config, as vLLM 0.33 defines them, only the fields
# used), and the worker round trip.  Written into DIR/py by prepare.
write_python() { # DIR/py
    local py=$1
    mkdir -p "$py/vllm/v1/kv_offload"
    : > "$py/vllm/__init__.py"
    : > "$py/vllm/v1/__init__.py"
    : > "$py/vllm/v1/kv_offload/__init__.py"
    cat > "$py/vllm/v1/kv_offload/base.py" <<'EOF'
"""Stand-in for vllm.v1.kv_offload.base (vLLM 0.33): the types kvoffload's
worker uses, for tools/gpu-check.sh on a machine with torch and no vLLM."""
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np


class LoadStoreSpec:
    pass


class GPULoadStoreSpec(LoadStoreSpec):
    def __init__(self, block_ids, group_sizes: Sequence[int], block_indices: Sequence[int]) -> None:
        self.block_ids = np.array(block_ids, dtype=np.int32)
        assert sum(group_sizes) == len(block_ids) and len(block_indices) == len(group_sizes)
        self.group_sizes = group_sizes
        self.block_indices = block_indices


@dataclass
class CanonicalKVCacheTensor:
    tensor: Any
    page_size_bytes: int


@dataclass
class CanonicalKVCacheRef:
    tensor_idx: int
    page_size_bytes: int
    mapping: Optional[Any] = None


@dataclass
class CanonicalKVCaches:
    tensors: list
    group_data_refs: list


@dataclass
class TransferResult:
    job_id: int
    success: bool
    transfer_size: Optional[int] = None
    transfer_time: Optional[float] = None


@dataclass
class OffloadingEvent:
    keys: list
    medium: Any
    removed: bool


class OffloadingWorker:
    pass
EOF
    cat > "$py/vllm/v1/kv_offload/config.py" <<'EOF'
"""Stand-in for vllm.v1.kv_offload.config (vLLM 0.33), see base.py."""
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class OffloadingGroupConfig:
    tokens_per_block: int
    layer_names: tuple
    group_id: int
    sliding_window_size_in_chunks: Optional[int] = None


@dataclass(frozen=True)
class OffloadingModelConfig:
    name: str
    dtype: str
    max_model_len: int = 0


@dataclass(frozen=True)
class OffloadingCacheConfig:
    tokens_per_hash: int
    blocks_per_chunk: int


@dataclass(frozen=True)
class OffloadingParallelConfig:
    rank: int
    world_size: int
    tp_size: int = 1
    pp_size: int = 1
    pcp_size: int = 1
    dcp_size: int = 1
    data_parallel_index: int = 0
    data_parallel_size: int = 1
    data_parallel_rank_local: Optional[int] = None
    is_parallelism_agnostic: bool = True


@dataclass(frozen=True)
class OffloadingConfig:
    groups: tuple
    worker_kv_bytes_per_block: int
    enable_kv_cache_events: bool
    extra_config: Mapping[str, Any]
    engine_id: str
    model: OffloadingModelConfig
    cache: OffloadingCacheConfig
    parallel: OffloadingParallelConfig
    replicated_layout: bool = False
    canonical_layout: bool = False
    kv_cache_layout: Optional[str] = None
EOF
    cat > "$py/worker_check.py" <<'EOF'
"""GPU check: kvoffload's vLLM worker (python/kvoffload/vllm/worker.py) with
torch CUDA tensors, in a process where torch's CUDA runtime and
libkvoffload_cuda.so (which opens the driver itself) both run.  64 layer
tensors of 32 KiB pages: 2 chunks of 16 scattered blocks stored, then loaded
into other blocks; every byte compared on the GPU.  Exit 0 ok, 77 no GPU."""
import os
import sys
import time
import types

import numpy as np
import torch

# KVO_GPUCHECK_CPU=1: the same steps with CPU tensors (the host device), to
# check this script itself on a machine without a GPU.
cpu = os.environ.get("KVO_GPUCHECK_CPU") == "1"
if not cpu and not torch.cuda.is_available():
    print("worker check: torch sees no CUDA device")
    sys.exit(77)
dev = "cpu" if cpu else "cuda"
here = os.path.dirname(os.path.abspath(__file__))
# kvoffload.vllm without its package __init__ (the scheduler's manager needs
# a compiled module built for another Python): the worker and its config
import kvoffload  # noqa: E402
pkg = types.ModuleType("kvoffload.vllm")
pkg.__path__ = [os.path.join(here, "kvoffload", "vllm")]
sys.modules["kvoffload.vllm"] = pkg
from kvoffload.shm import SharedArena  # noqa: E402
from kvoffload.vllm import config as C  # noqa: E402
from kvoffload.vllm import worker as W  # noqa: E402
from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor,  # noqa: E402
                                     GPULoadStoreSpec)
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,  # noqa: E402
                                       OffloadingModelConfig, OffloadingParallelConfig)

L, PAGE, BPC, NB = 64, 32 << 10, 16, 80
cfg = OffloadingConfig(groups=(OffloadingGroupConfig(16, tuple(f"l{i}" for i in range(L)), 0),),
                       worker_kv_bytes_per_block=L * PAGE, enable_kv_cache_events=False,
                       extra_config={"kvo_transfer_threads": 2}, engine_id=f"gpucheck-{os.getpid()}",
                       model=OffloadingModelConfig("gpu-check", "bfloat16"), cache=OffloadingCacheConfig(16, BPC),
                       parallel=OffloadingParallelConfig(0, 1), kv_cache_layout="NHD")
plan = C.build_plan(cfg)
sb = plan.groups[0]["slot_bytes"]
arena = SharedArena(C.arena_name(cfg), 2 * sb, plan.fingerprint, expected=1)
spec = types.SimpleNamespace(config=cfg, plan=plan)
if not cpu:
    torch.cuda.set_device(0)
g = torch.Generator(device=dev).manual_seed(7)
tens = [torch.randint(-128, 127, (NB, PAGE), dtype=torch.int8, device=dev, generator=g) for _ in range(L)]
orig = [t.clone() for t in tens]
kv = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(t, PAGE) for t in tens],
                       group_data_refs=[[CanonicalKVCacheRef(i, PAGE) for i in range(L)]])
w = W.KvoffloadOffloadingWorker(spec, kv, arena)
assert cpu or (w.cuda is not None and w.pinned), "the worker did not open the CUDA device with the arena pinned"
src = [2 * i for i in range(2 * BPC)]                   # scattered: nothing merges
dst = [2 * (2 * BPC - 1 - i) + 1 for i in range(2 * BPC)]
assert not set(src) & set(dst)
slots = C.KvoffloadLoadStoreSpec(np.array([0, sb], dtype=np.uint64), np.zeros(2, dtype=np.uint32))
t0 = time.time()
assert w.submit_store(1, GPULoadStoreSpec(src, [2 * BPC], [0]), slots)
w.wait({1})
res = w.get_finished()
assert [(r.job_id, r.success, r.transfer_size) for r in res] == [(1, True, 2 * BPC * L * PAGE)], res
for t in tens:
    t[dst] = 0
assert w.submit_load(2, slots, GPULoadStoreSpec(dst, [2 * BPC], [0]))
w.wait({2})
res = w.get_finished()
assert [(r.job_id, r.success, r.transfer_size) for r in res] == [(2, True, 2 * BPC * L * PAGE)], res
if not cpu:
    torch.cuda.synchronize()
bad = [l for l in range(L) if not torch.equal(tens[l][dst], orig[l][src])]
assert not bad, f"layers {bad[:8]}: loaded bytes differ"
st = w.cuda.stats() if w.cuda is not None else {}
w.shutdown()
kernel = {True: "loaded", False: "not loaded"}.get(st.get("kernel_available"), "not reported")
print(f"worker check: {L} x {PAGE >> 10} KiB, {2 * BPC} blocks stored and loaded byte-exact in "
      f"{time.time() - t0:.2f} s on {dev} with torch {torch.__version__} (CUDA {torch.version.cuda}); device "
      f"stats: jobs {st.get('units')}, batch calls {st.get('batch_calls')}, kernel launches "
      f"{st.get('kernel_launches')}, kernel {kernel}")
EOF
}

prepare() {
    set -e
    local src build
    src=$(cd "$(dirname "$0")/.." && pwd)
    build="$src/build-gpucheck"
    command -v nvcc >/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"; }
    command -v nvcc >/dev/null || { echo "gpu-check prepare: nvcc not found (install the CUDA toolkit)" >&2; exit 1; }
    local gen=""
    command -v ninja >/dev/null && [ ! -f "$build/CMakeCache.txt" ] && gen="-G Ninja"
    echo "gpu-check prepare: configure and build $build (Release, KVO_CUDA=ON)"
    # No Redis or io_uring: the check needs neither, and the GPU machine may
    # not have their libraries.
    cmake -S "$src" -B "$build" $gen -DCMAKE_BUILD_TYPE=Release -DKVO_CUDA=ON -DKVO_BUILD_TESTS=ON \
          -DKVO_WITH_REDIS=OFF -DKVO_WITH_URING=OFF -DKVO_BUILD_SHARED=ON >/dev/null
    local tests
    tests=$(cd "$src/tests" && ls test_cuda*.c test_transfer_cuda_plan.c test_transfer_cuda_fake.c | sed 's/\.c$//')
    # shellcheck disable=SC2086
    cmake --build "$build" -j"$(nproc)" --target kvoffload_cli kvoffload_shared kvoffload_cuda_shared $tests >/dev/null
    rm -rf "$dir"
    mkdir -p "$dir/bin" "$dir/lib" "$dir/py"
    : > "$dir/tests.txt"
    for t in $tests; do
        cp "$build/$t" "$dir/bin/"
        # one line per test: program name
        grep -o '^KVO_TEST([A-Za-z0-9_]*)' "$src/tests/$t.c" | sed "s/^KVO_TEST(\(.*\))/$t \1/" >> "$dir/tests.txt"
    done
    cp "$build/kvoffload" "$dir/bin/"
    # The probe: what the driver and runtime say, and nothing of kvoffload.
    cat > "$build/gpu_probe.c" <<'EOF'
#include <stdio.h>
#include <cuda_runtime_api.h>
int main(void) {
    int n = 0, drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    cudaError_t e = cudaGetDeviceCount(&n);
    printf("driver %d.%d, runtime %d.%d\n", drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
    if (e != cudaSuccess || n == 0) {
        printf("no usable CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return 77;
    }
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) return 1;
        printf("device %d: %s, sm_%d%d, %.1f GiB, PCI %04x:%02x:%02x\n", i, p.name, p.major, p.minor,
               (double)p.totalGlobalMem / (1 << 30), p.pciDomainID, p.pciBusID, p.pciDeviceID);
    }
    return 0;
}
EOF
    local cuda_home
    cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
    cc -O2 -I"$cuda_home/include" -o "$dir/bin/gpu_probe" "$build/gpu_probe.c" -L"$cuda_home/lib64" -lcudart \
       -Wl,-rpath,'$ORIGIN/../lib'
    # The libraries, as plain files under their SONAMEs (links do not travel).
    cp -L "$build/libkvoffload.so" "$dir/lib/$(readelf -d "$build/libkvoffload.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')"
    cp -L "$build/libkvoffload_cuda.so" \
          "$dir/lib/$(readelf -d "$build/libkvoffload_cuda.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')"
    # The shared libraries they load, but the C library, the dynamic loader
    # and the driver (libcuda comes with the GPU machine's driver).
    local libs
    libs=$(for f in "$dir"/bin/* "$dir"/lib/*; do ldd "$f"; done | awk '/=> \// {print $3}' | sort -u |
           grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libnvidia[^/]*|libkvoffload[^/]*)\.so' || true)
    for l in $libs; do cp -L "$l" "$dir/lib/"; done
    strip --strip-unneeded "$dir"/bin/* "$dir"/lib/* 2>/dev/null || true
    # The Python package (without compiled modules) and the vLLM stand-in.
    (cd "$src/python" && find kvoffload -name '*.py' -o -name 'py.typed') | while read -r f; do
        mkdir -p "$dir/py/$(dirname "$f")"
        cp "$src/python/$f" "$dir/py/$f"
    done
    write_python "$dir/py"
    cp "$src/tools/gpu-check.sh" "$dir/gpu-check.sh"
    chmod +x "$dir/gpu-check.sh"
    git -C "$src" log -1 --format='%H %cd' > "$dir/commit.txt" 2>/dev/null || true
    local kib
    kib=$(du -sk "$dir" | cut -f1)
    echo "gpu-check prepare: $dir: $(wc -l < "$dir/tests.txt") tests in $(ls "$dir/bin" | wc -l) programs," \
         "$(ls "$dir/lib" | wc -l) libraries ($(ls "$dir/lib" | tr '\n' ' ')), $((kib / 1024)) MiB"
    if [ "$kib" -gt $((MAX_MIB * 1024)) ]; then
        echo "gpu-check prepare: FAILED: $dir is $((kib / 1024)) MiB, more than $MAX_MIB MiB" >&2
        exit 1
    fi
    echo "gpu-check prepare: done; on the GPU machine: $dir/gpu-check.sh run $dir"
}

run() {
    [ -f "$dir/tests.txt" ] || { echo "gpu-check run: $dir has no tests.txt (run prepare first)" >&2; exit 2; }
    dir=$(cd "$dir" && pwd)
    local out="${OUT:-$dir/out}" t0 passed=0 failed=0 skipped=0 gpu=0
    mkdir -p "$out"
    t0=$(date +%s)
    # 8 minutes in all: a step's limit is its own cap, or what is left of
    # 470 s after keeping `reserve` seconds for the steps after it.
    cap() { # cap reserve
        local left=$(( t0 + 470 - $(date +%s) - $2 ))
        left=$(( left < $1 ? left : $1 ))
        echo $(( left < 1 ? 1 : left ))
    }
    export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    result() { # name PASS|FAIL|SKIP detail
        echo "gpu-check: $1: $2${3:+ ($3)}" | tee -a "$out/summary.txt"
        case $2 in PASS) passed=$((passed + 1)) ;; FAIL) failed=$((failed + 1)) ;; *) skipped=$((skipped + 1)) ;; esac
    }
    : > "$out/summary.txt"
    echo "gpu-check: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n)"
    sed 's/^/gpu-check: built from /' "$dir/commit.txt" 2>/dev/null
    if command -v nvidia-smi >/dev/null && nvidia-smi -L > "$out/nvidia-smi.txt" 2>&1 && grep -q '^GPU' "$out/nvidia-smi.txt"; then
        gpu=1
        nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
                   --format=csv >> "$out/nvidia-smi.txt" 2>&1
        sed 's/^/gpu-check: nvidia-smi: /' "$out/nvidia-smi.txt"
    fi
    local rc
    timeout 60 "$dir/bin/gpu_probe" > "$out/probe.txt" 2>&1
    rc=$?
    sed 's/^/gpu-check: probe: /' "$out/probe.txt"
    local device=0
    if [ $rc -eq 0 ]; then
        device=1
        result probe PASS "$(grep -c '^device' "$out/probe.txt") device(s)"
    elif [ $gpu -eq 1 ]; then
        result probe FAIL "nvidia-smi lists a GPU but CUDA cannot use it (exit $rc): $(tail -n1 "$out/probe.txt")"
    else
        result probe SKIP "no GPU: every device step below is a dry run"
    fi
    # Each test alone, with its own limit; 77 = skipped.
    local prog name allowed why limit
    while read -r prog name; do
        limit=$(cap 120 210) # 210 s kept for the worker and the bandwidth
        if [ "$limit" -lt 10 ]; then
            result "${prog#test_}.$name" FAIL "not run: the 8-minute budget is spent"
            continue
        fi
        timeout "$limit" "$dir/bin/$prog" "$name" > "$out/$prog.$name.log" 2>&1
        rc=$?
        allowed=0
        case $name in no_device_fails_cleanly | *two_devices* | second_device* | engine_offsets_above_4_gib) allowed=1 ;; esac
        why=$(grep -m1 -E 'SKIP|skip|FAIL' "$out/$prog.$name.log" | cut -c1-160)
        if [ $rc -eq 0 ]; then
            result "${prog#test_}.$name" PASS "$(grep -m1 -E 'ok|control|exact' "$out/$prog.$name.log" | cut -c1-120)"
        elif [ $rc -eq 77 ] && { [ $device -eq 0 ] || [ $allowed -eq 1 ]; }; then
            result "${prog#test_}.$name" SKIP "$why"
        elif [ $rc -eq 77 ]; then
            result "${prog#test_}.$name" FAIL "skipped on a machine with a device: $why"
        elif [ $rc -ge 124 ]; then
            result "${prog#test_}.$name" FAIL "exit $rc (timeout or signal); see $out/$prog.$name.log"
        else
            result "${prog#test_}.$name" FAIL "$why"
        fi
    done < "$dir/tests.txt"
    # The vLLM worker with torch CUDA tensors (python3 with torch and numpy).
    local py=${PYTHON:-python3}
    if [ $device -eq 0 ]; then
        result worker_torch_cuda SKIP "no GPU"
    elif ! "$py" -c 'import torch, numpy' > "$out/worker.log" 2>&1; then
        result worker_torch_cuda FAIL "$py cannot import torch and numpy (set PYTHON): $(tail -n1 "$out/worker.log")"
    else
        PYTHONPATH="$dir/py" KVO_LIBRARY="$(ls "$dir"/lib/libkvoffload.so.*)" \
            KVO_CUDA_LIBRARY="$(ls "$dir"/lib/libkvoffload_cuda.so.*)" \
            timeout "$(cap 90 150)" "$py" "$dir/py/worker_check.py" > "$out/worker.log" 2>&1
        rc=$?
        sed 's/^/gpu-check: worker: /' "$out/worker.log" | tail -n 5
        if [ $rc -eq 0 ]; then result worker_torch_cuda PASS "$(tail -n1 "$out/worker.log" | cut -c1-160)"
        else result worker_torch_cuda FAIL "exit $rc: $(tail -n1 "$out/worker.log" | cut -c1-160)"; fi
    fi
    # Bandwidth at the engine shapes, both directions, 1 GiB per job, best
    # of 5, each against one contiguous copy and vLLM's way in the same run.
    timeout "$(cap 180 0)" "$dir/bin/kvoffload" bench transfer --device cuda --json --total-mib 1024 --reps 5 \
        > "$out/bench-transfer-cuda.json" 2> "$out/bench-transfer-cuda.log"
    rc=$?
    if grep -q '"skipped"' "$out/bench-transfer-cuda.json" 2>/dev/null; then
        why=$(sed -n 's/.*"skipped":"\([^"]*\)".*/\1/p' "$out/bench-transfer-cuda.json" | cut -c1-160)
        if [ $device -eq 0 ] && [ $rc -eq 0 ]; then result bench_transfer_cuda SKIP "$why"
        else result bench_transfer_cuda FAIL "skipped on a machine with a device: $why"; fi
    elif [ $rc -ne 0 ] || ! grep -q '"name"' "$out/bench-transfer-cuda.json"; then
        result bench_transfer_cuda FAIL "exit $rc: $(tail -n1 "$out/bench-transfer-cuda.log" | cut -c1-160)"
    else
        # name value ratio: the ratio to the contiguous copy (goal
        # GOAL_CONTIGUOUS) or, for .vs_vllm, to vLLM's way (GOAL_VLLM);
        # .vllm_way, .copy_engine_only and .kernel_stores have no goal
        local n v r goal
        while read -r n v r; do
            case $n in
                *.vllm_way | *.copy_engine_only* | *.kernel_stores*) goal="" ;;
                *.vs_vllm) goal=$GOAL_VLLM ;;
                *) goal=$GOAL_CONTIGUOUS ;;
            esac
            if [ -z "$goal" ]; then
                echo "gpu-check: bandwidth: $n: $v GB/s, $r of its limit (no goal)"
            elif awk -v r="$r" -v g="$goal" 'BEGIN { exit !(r + 0 >= g + 0) }'; then
                result "bandwidth.$n" PASS "$v GB/s, $r of its limit, goal $goal"
            else
                result "bandwidth.$n" FAIL "$v GB/s, $r of its limit, under the goal $goal"
            fi
        done < <(sed -n 's/.*"name":"transfer\.cuda\.\([^"]*\)","value":\([^,]*\),.*"ratio":\([^}]*\)}.*/\1 \2 \3/p' \
                     "$out/bench-transfer-cuda.json")
    fi
    echo "gpu-check: $skipped skipped, $(( $(date +%s) - t0 )) s; logs in $out"
    echo "gpu-check: $passed passed, $failed failed"
    [ $failed -eq 0 ]
}

case $mode in
    prepare) prepare ;;
    run) run ;;
    *) usage ;;
esac
