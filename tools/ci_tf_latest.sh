#!/usr/bin/env bash
# The test suite on the newest TensorFlow stack: TensorFlow 2.16+ with
# tf-keras (Keras 2), as `pip install 'tflms[tf,test]'` installs it.
#
# Usage: tools/ci_tf_latest.sh [VENV] [PYTEST ARGS...]   (default .venv-tf-latest)
#
# Creates VENV with python3.11 if it does not exist, installs tflms with the
# `tf` and `test` extras (tools/install_test_deps.sh VENV tf: no Horovod, which
# does not build against TensorFlow 2.16+), then runs pytest with
# TF_USE_LEGACY_KERAS=1 so that tf.keras is Keras 2 (tf_keras), the Keras LMS
# works with. tflms itself never sets that variable, and the docs' programs
# run without it (tests/test_docs.py), as a reader runs them. Tests that need
# tf.estimator or Horovod skip there with the reason (tests/_stack.py).
# Then tools/newcomer.py runs the README's programs in a bare environment.
# INSTALL_ONLY=1: install, then stop (tools/run_tests.sh installs both
# newest-TensorFlow venvs this way while the first pass runs).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-tf-latest}"
shift || true
bash tools/install_test_deps.sh "$VENV" tf
if [ "${INSTALL_ONLY:-0}" = 1 ]; then exit 0; fi
"$VENV/bin/python" -c 'import tensorflow as tf, tf_keras; print("TensorFlow", tf.__version__, "tf_keras", tf_keras.__version__)'
status=0
TF_USE_LEGACY_KERAS=1 "$VENV/bin/python" -m pytest "$@" || status=1
echo "== the README's programs as a newcomer runs them"
"$VENV/bin/python" tools/newcomer.py "$VENV" || status=1
exit $status
