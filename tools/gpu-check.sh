#!/usr/bin/env bash
# The GPU check of the CUDA transfer device (docs/gpu.md), one script for a
# machine with one NVIDIA GPU; under 4 minutes, most of it the build (each
# step is cut off at 150 s):
#   1. configure and build with -DKVO_CUDA=ON (build-gpu/),
#   2. ctest -L cuda (device tests must PASS here, not skip),
#   3. the byte-exact round trip device -> host slot -> device for the
#      layouts of every preset (= shared/models), verbose,
#   4. kvoffload bench transfer --device cuda --json (ratios to
#      cudaMemcpyAsync of the same bytes between the same pinned buffers).
# Results go to $OUT (the device tool's output folder) when set, else to
# build-gpu/gpu-check/.  Exit status 0 only when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build-gpu/gpu-check}"
mkdir -p "$out"
t0=$(date +%s)
status=0
step() { # name, command...: run, log to $out/name.log, record the result
    local name=$1; shift
    local s0; s0=$(date +%s)
    if timeout 150 "$@" > "$out/$name.log" 2>&1; then r=ok; else r="FAILED($?)"; status=1; fi
    echo "$name: $r ($(( $(date +%s) - s0 )) s)" | tee -a "$out/summary.txt"
}
# nvcc where the toolkit installs it, when not on PATH.
command -v nvcc >/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"; }
: > "$out/summary.txt"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
    --format=csv 2>&1; nvcc --version 2>&1 | tail -1; } > "$out/machine.txt"
step configure cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVO_CUDA=ON
step build cmake --build build-gpu -j"$(nproc)" --target test_cuda test_transfer_cuda_plan kvoffload_cli
step ctest_cuda ctest --test-dir build-gpu -L cuda --output-on-failure --timeout 120
# A device test that skipped on a GPU machine is a failure of this check
# (only no_device_fails_cleanly skips when a device is present).
if grep -E "cuda\.[a-z_]+ .*Skipped" "$out/ctest_cuda.log" | grep -v no_device_fails_cleanly > "$out/skipped.txt"; then
    echo "skipped device tests: FAILED (see skipped.txt)" | tee -a "$out/summary.txt"
    status=1
fi
step roundtrip build-gpu/test_cuda roundtrip_every_preset_byte_exact
step bench_transfer_cuda sh -c "build-gpu/kvoffload bench transfer --device cuda --json > '$out/bench-transfer-cuda.json'"
echo "total: $(( $(date +%s) - t0 )) s, status $status" | tee -a "$out/summary.txt"
exit $status
