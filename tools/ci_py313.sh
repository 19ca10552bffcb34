#!/usr/bin/env bash
# The TensorFlow 2 and Keras 3 tests on Python 3.13 with the newest
# TensorFlow (setup.py allows Python 3.11 to 3.13; the other runs of
# tools/run_tests.sh use 3.11).
#
# Usage: tools/ci_py313.sh [VENV] [PYTEST ARGS...]   (default .venv-py313)
#
# Creates VENV with python3.13 (from PATH, else pyenv's 3.13) if it does
# not exist, installs tflms with the `tf` and `test` extras
# (tools/install_test_deps.sh VENV tf), then runs, with oneDNN off: the
# imports, the pure core and the swap check (tflms on Python 3.13), and
# the Keras 3 numerics cases marked `onednn_off_pass` (Keras 3 `fit` with
# the callback, KerasHub's transformers and the Grappler causes that need
# oneDNN off, MirroredStrategy, offload_optimizer's trainings, a part of
# the Keras applications). Each Keras 3 case trains in one oneDNN mode in
# CI: the Python 3.11 pass of the newest stack trains the others with it
# on. As tools/ci_tf_latest.sh, with TF_USE_LEGACY_KERAS=1 (tf.keras is
# Keras 2; the Keras 3 tests import keras themselves).
# INSTALL_ONLY=1: install, then stop (tools/run_tests.sh installs both
# newest-TensorFlow venvs this way while the first pass runs).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-py313}"
shift || true
if [ ! -x "$VENV/bin/python" ]; then
    # A python3.13 that runs: pyenv's shim is on the PATH even where 3.13
    # is not the selected version, and then fails, so each is tried.
    PY313=""
    for cand in "$(command -v python3.13 || true)" \
            "$HOME"/.pyenv/versions/3.13*/bin/python3.13; do
        if [ -n "$cand" ] && [ -x "$cand" ] && \
                "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 13)' \
                >/dev/null 2>&1; then
            PY313="$cand"
            break
        fi
    done
    if [ -z "$PY313" ]; then
        echo "tools/ci_py313.sh needs a python3.13 that runs (on the PATH, or" \
             "pyenv's 3.13 under ~/.pyenv/versions)" >&2
        exit 1
    fi
    "$PY313" -m venv "$VENV"
fi
bash tools/install_test_deps.sh "$VENV" tf
if [ "${INSTALL_ONLY:-0}" = 1 ]; then exit 0; fi
"$VENV/bin/python" -c 'import sys, tensorflow as tf, keras; print("Python", sys.version.split()[0], "TensorFlow", tf.__version__, "Keras", keras.__version__)'
status=0
TF_ENABLE_ONEDNN_OPTS=0 TF_USE_LEGACY_KERAS=1 "$VENV/bin/python" -m pytest \
    tests/test_imports.py tests/test_pure_core.py tests/test_swaps_ran.py \
    "$@" || status=1
TF_ENABLE_ONEDNN_OPTS=0 TF_USE_LEGACY_KERAS=1 "$VENV/bin/python" -m pytest \
    tests/test_keras3_fit.py tests/test_keras3_transformers.py \
    tests/test_keras3_distributed.py tests/test_keras3_applications.py \
    tests/test_offload_keras3_training.py \
    -m onednn_off_pass "$@" || status=1
exit $status
