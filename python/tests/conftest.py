"""pytest setup: the vLLM tests (test_vllm.py, marker 'vllm') are collected
only when KVO_TEST_VLLM=1 (tools/test-python.sh --vllm), so the binding tests
run where vLLM is not installed."""
import os

import pytest

collect_ignore = [] if os.environ.get("KVO_TEST_VLLM") == "1" else ["test_vllm.py", "test_vllm_connector.py"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: needs vLLM (run with tools/test-python.sh --vllm)")
