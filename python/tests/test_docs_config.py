"""The configuration examples of README.md and docs/ that a Python reader
takes (docs/config.md, "Which reader takes which keys"): LMCache's
native_plugin adapter config, whose adapter_params are
kvoffload.lmcache.KvoffloadL2Connector's keyword arguments.  The others are
fed to kvo_config_from_json by tests/test_config.c."""
import glob
import json
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def json_blocks():
    for path in DOCS:
        with open(path) as f:
            for i, m in enumerate(re.finditer(r"```json\n(.*?)\n```", f.read(), re.S)):
                yield f"{os.path.basename(path)} json block {i + 1}", m.group(1)


def lmcache_examples():
    return [(where, json.loads(text)) for where, text in json_blocks() if '"native_plugin"' in text]


def test_docs_have_an_lmcache_example():
    if not os.path.isdir(os.path.join(ROOT, "docs")):
        pytest.skip("no docs/ here (an sdist)")
    assert [w for w, _ in lmcache_examples()], "the LMCache adapter example of docs/engines.md was not found"


@pytest.mark.parametrize("where,cfg", lmcache_examples())
def test_lmcache_adapter_params_are_the_connector_arguments(where, cfg, tmp_path):
    from kvoffload.lmcache import KvoffloadL2Connector
    assert cfg["module_path"] == "kvoffload.lmcache" and cfg["class_name"] == KvoffloadL2Connector.__name__, where
    params = dict(cfg["adapter_params"])
    params["file_root"] = str(tmp_path)  # the docs' directory and cluster made to fit the test
    if os.environ.get("KVO_TEST_REDIS"):
        params["redis_url"] = "redis://" + os.environ["KVO_TEST_REDIS"]
        params["redis_prefix"] = "kvo-test-docs-lmcache"
    else:
        params.pop("redis_url", None)
    conn = KvoffloadL2Connector(**params)
    try:
        assert conn.object_bytes == int(cfg["adapter_params"]["object_bytes"])
        assert conn.file_bytes == int(float(cfg["adapter_params"]["file_bytes"]))
    finally:
        conn.close()
