#!/usr/bin/env bash
# The Python package as a user gets it, in fresh venvs under build/package/
# (removed first), with KVO_LIBRARY and PYTHONPATH unset:
#   1. `pip install ./python` (the checkout; pip builds the C library with
#      CMake through scikit-build-core), then the binding tests
#      (test_binding.py, test_hot.py, test_security.py, test_fork.py) run from a directory
#      outside the checkout against the installed package;
#   2. `python -m build python`: the sdist, then a wheel built from the sdist
#      alone; `auditwheel show` and `auditwheel repair` (a manylinux wheel
#      carrying its libraries); the repaired wheel replaces the installed
#      package and the tests run again.
# Tools pinned in python/requirements-wheel.txt (also the constraints of
# pip's isolated build environments); the tests' packages in
# python/requirements-test.txt.  The remote tier's tests get a loopback Redis
# Cluster (KVO_TEST_REDIS_PORT, default 7400; tools/test-redis.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
unset KVO_LIBRARY KVO_CUDA_LIBRARY PYTHONPATH
export PIP_CONSTRAINT="$root/python/requirements-wheel.txt" PIP_DISABLE_PIP_VERSION_CHECK=1
out="$root/build/package"
rm -rf "$out"
mkdir -p "$out"
away=$(mktemp -d "${TMPDIR:-/tmp}/kvo-package.XXXXXX")  # outside the checkout
. tools/test-redis.sh
kvo_test_redis_start 7400
trap 'rm -rf "$away"; [ -z "${kvo_redis_dir:-}" ] || tools/redis-cluster.sh stop "$kvo_redis_dir" >/dev/null 2>&1 || true' EXIT

step() { echo "test-package: $1 took $(( $(date +%s) - t0 )) s"; t0=$(date +%s); }
binding_tests() {  # what: the installed package's binding tests, run from $away
  (cd "$away" && "$out/venv/bin/python" - "$root/python" <<'EOF'
import sys
import kvoffload
where = kvoffload.__file__
assert not where.startswith(sys.argv[1]), f"the checkout's package was imported: {where}"
assert kvoffload.__version__ == kvoffload.library_version(), (kvoffload.__version__, kvoffload.library_version())
print(f"test-package: kvoffload {kvoffload.__version__} from {where}, library {kvoffload.LIBRARY_PATH}")
EOF
  )
  set +e
  (cd "$away" && "$out/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/python/tests/test_binding.py" \
     "$root/python/tests/test_hot.py" "$root/python/tests/test_security.py" "$root/python/tests/test_fork.py")
  local rc=$?
  set -e
  [ $rc -ne 5 ] || { echo "test-package: no tests were collected (pytest exit 5)" >&2; return 1; }
  [ $rc -eq 0 ] || return $rc
  step "$1"
}

t0=$(date +%s)
python3 -m venv "$out/venv"
"$out/venv/bin/pip" install -q -r python/requirements-test.txt
python3 -m venv "$out/tools"
"$out/tools/bin/pip" install -q -r python/requirements-wheel.txt
step "the venvs"

"$out/venv/bin/pip" install -q ./python
step "pip install ./python"
binding_tests "the binding tests on pip install ./python"

"$out/tools/bin/python" -m build --outdir "$out/dist" python >"$out/build.log" 2>&1 \
  || { tail -n 40 "$out/build.log"; exit 1; }
ls "$out/dist"
step "python -m build (the sdist, then a wheel from the sdist)"
whl=$(ls "$out"/dist/*.whl)
PATH="$out/tools/bin:$PATH" "$out/tools/bin/auditwheel" show "$whl"
PATH="$out/tools/bin:$PATH" "$out/tools/bin/auditwheel" repair -w "$out/wheelhouse" "$whl" 2>&1 | tail -n 1
repaired=$(ls "$out"/wheelhouse/*.whl)
case "$repaired" in *manylinux*) ;; *) echo "test-package: $repaired is not a manylinux wheel" >&2; exit 1 ;; esac
step "auditwheel show + repair"
"$out/venv/bin/pip" install -q --force-reinstall --no-deps "$repaired"
binding_tests "the binding tests on $(basename "$repaired")"
