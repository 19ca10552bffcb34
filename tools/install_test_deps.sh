#!/usr/bin/env bash
# Install what the test suite needs into a virtualenv: tflms with a
# TensorFlow stack extra and the `test` extra, then (on the 2.15 stack)
# Horovod built from PyPI against the installed TensorFlow (CPU operations
# over Gloo, no MPI, no GPU), for tests/test_distributed.py.
#
# Usage: tools/install_test_deps.sh [VENV [STACK]]
#   VENV   default .venv
#   STACK  tf215 (default): TensorFlow 2.15.1 and Horovod
#          tf: the newest TensorFlow with tf-keras and KerasHub (the `hub`
#              extra, for the transformer tests), without Horovod
#              (Horovod 0.28.1 does not build against TensorFlow 2.16+; run
#              the tests with TF_USE_LEGACY_KERAS=1, see tools/ci_tf_latest.sh)
#
# Afterwards it checks the venv and fails (exit 1) unless `pip check` passes
# and exactly one TensorFlow distribution (tensorflow or tensorflow-cpu) is
# installed: two of them own the same files, and removing either breaks the
# other. A venv made by an earlier setup.py, whose `tf` extra installed
# tensorflow-cpu beside tf-keras's tensorflow, is repaired first: both are
# uninstalled and the extra installs one again.
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
# The one TensorFlow distribution each stack's extra installs (setup.py).
case "$STACK" in
    tf) WANT_TF=tensorflow; OTHER_TF=tensorflow-cpu ;;
    tf215) WANT_TF=tensorflow-cpu; OTHER_TF=tensorflow ;;
esac
if "$PIP" show -q "$OTHER_TF" >/dev/null 2>&1; then
    echo "$VENV has $OTHER_TF, which the '$STACK' extra does not install;" \
         "uninstalling it and $WANT_TF (they share files) before installing"
    "$PIP" uninstall -q -y "$OTHER_TF" "$WANT_TF"
fi
# KerasHub (the `hub` extra: models built from configs, no downloads, in
# the transformer tests and docs/capacity.md's GPT-2) needs Keras 3: the
# newest stack only.
case "$STACK" in
    tf) EXTRAS="$STACK,test,hub" ;;
    tf215) EXTRAS="$STACK,test" ;;
esac
"$PIP" install -q -e ".[$EXTRAS]"

# Exactly one TensorFlow distribution, and consistent requirements.
if ! "$PIP" check; then
    echo "pip check failed in $VENV (above); fix the requirements or" \
         "remove the venv and run $0 again" >&2
    exit 1
fi
"$PY" - "$VENV" "$STACK" "$WANT_TF" <<'PYEOF'
import importlib.metadata as md
import sys

venv, stack, want = sys.argv[1:]
found = sorted({d.metadata["Name"].lower().replace("_", "-")
                for d in md.distributions()} &
               {"tensorflow", "tensorflow-cpu", "tensorflow-gpu",
                "tf-nightly", "tf-nightly-cpu", "intel-tensorflow"})
if found != [want]:
    sys.exit("%s must hold exactly one TensorFlow distribution, %s (the "
             "'%s' extra); it holds %s. Remove the venv and run "
             "tools/install_test_deps.sh %s %s again."
             % (venv, want, stack, ", ".join(found) or "none", venv, stack))
print("%s: one TensorFlow distribution, %s %s; pip check passed"
      % (venv, want, md.version(want)))
PYEOF

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
