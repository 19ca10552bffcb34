#!/usr/bin/env bash
# Install what the test suite needs into a virtualenv: tflms with its `test`
# extra, then Horovod built from PyPI against the installed TensorFlow (CPU
# operations over Gloo, no MPI, no GPU), for tests/test_distributed.py.
#
# Usage: tools/install_test_deps.sh [VENV]   (default: .venv)
#
# Idempotent: Horovod (about 6 minutes to build on 2 cores) is rebuilt only
# when `import horovod.tensorflow` fails in the venv. Needs a C++17 compiler
# and cmake (Debian: apt-get install g++ cmake).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PY="$VENV/bin/python"
PIP="$VENV/bin/pip"
HOROVOD_VERSION="0.28.1"

if [ ! -x "$PY" ]; then
    python3.11 -m venv "$VENV"
fi
"$PIP" install -q -e '.[test]'

if "$PY" -c 'import horovod.tensorflow as h; assert h.gloo_built()' \
        >/dev/null 2>&1; then
    echo "horovod.tensorflow already importable in $VENV; not rebuilding"
    exit 0
fi
for tool in cmake g++; do
    if ! command -v "$tool" >/dev/null; then
        echo "Building Horovod needs $tool; install it (Debian: apt-get install g++ cmake)" >&2
        exit 1
    fi
done
# --no-build-isolation: Horovod's setup.py imports TensorFlow to find its
# headers and ABI flags, so it must build inside this venv, next to the
# installed tensorflow-cpu (an isolated build environment has none).
HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS= \
    "$PIP" install -q --no-build-isolation --no-cache-dir \
    "horovod==$HOROVOD_VERSION"
"$PY" -c 'import horovod.tensorflow as h; assert h.gloo_built(), "Horovod built without Gloo"'
echo "horovod $HOROVOD_VERSION installed in $VENV"
