#!/usr/bin/env bash
# Install what the test suite needs into a virtualenv: tflms with a
# TensorFlow stack extra and the `test` extra, then (on the 2.15 stack)
# Horovod built from PyPI against the installed TensorFlow (CPU operations
# over Gloo, no MPI, no GPU), for tests/test_distributed.py.
#
# Usage: tools/install_test_deps.sh [VENV [STACK]]
#   VENV   default .venv
#   STACK  tf215 (default): TensorFlow 2.15.1 and Horovod
#          tf: the newest TensorFlow with tf-keras, without Horovod
#              (Horovod 0.28.1 does not build against TensorFlow 2.16+; run
#              the tests with TF_USE_LEGACY_KERAS=1, see tools/ci_tf_latest.sh)
#
# Idempotent: Horovod (about 6 minutes to build on 2 cores) is rebuilt only
# when `import horovod.tensorflow` fails in the venv. Needs a C++17 compiler
# and cmake (Debian: apt-get install g++ cmake).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
STACK="${2:-tf215}"
case "$STACK" in
    tf215|tf) ;;
    *) echo "STACK must be tf215 or tf, not '$STACK'" >&2; exit 2 ;;
esac
PY="$VENV/bin/python"
PIP="$VENV/bin/pip"
HOROVOD_VERSION="0.28.1"

if [ ! -x "$PY" ]; then
    python3.11 -m venv "$VENV"
fi
"$PIP" install -q -e ".[$STACK,test]"

if [ "$STACK" = tf ]; then
    echo "stack tf: not building Horovod (0.28.1 does not build against" \
         "TensorFlow 2.16+; see docs/install.md)"
    exit 0
fi

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
