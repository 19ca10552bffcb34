#!/usr/bin/env bash
# The linter, then the test suite on both TensorFlow stacks and in both
# oneDNN modes (the README's test command runs this after
# tools/install_test_deps.sh).
#
# First `ruff check .` (the rules of ruff.toml, over the whole tree): a lint
# failure stops the run at once, before any test.
#
# TensorFlow turns oneDNN on by default only on CPUs with AVX512_VNNI,
# AVX512_BF16 or AMX, and oneDNN changes both the kernels and the graph
# rewrites that run. So the mode is never left to the CPU. The newest
# TensorFlow runs the whole suite; TensorFlow 2.15 runs what can differ
# there, so that no test does the same work twice:
#   1. TensorFlow 2.15.1 (VENV, made by tools/install_test_deps.sh),
#      TF_ENABLE_ONEDNN_OPTS=0: the tests that train with and without LMS
#      (marker `numerics`), those whose checks TensorFlow's own code decides
#      (`both_stacks`: how graphs are built, what Grappler merges, what the
#      runtime allocates, the Keras 2 each stack carries) and those that
#      need it alone (`one_stack`); then the README's programs as a
#      newcomer runs them (tools/newcomer.py: bare environment);
#   2. the newest TensorFlow with tf-keras (.venv-tf-latest, installed by
#      tools/ci_tf_latest.sh), TF_ENABLE_ONEDNN_OPTS=1: the whole suite,
#      but for `one_stack` and the Keras 3 cases marked `onednn_off_pass`
#      (pass 4 trains them); it writes the ids of the tests it skipped
#      (tf.estimator, Horovod: 2.15 only) for pass 3;
#   3. TensorFlow 2.15.1 again with TF_ENABLE_ONEDNN_OPTS=1: the tests
#      pass 2 skipped, so that every numerics test runs with oneDNN off
#      (pass 1) and on (pass 2 or 3), and every test runs somewhere;
#   4. the newest TensorFlow on Python 3.13 (.venv-py313, installed by
#      tools/ci_py313.sh), oneDNN off: the imports, the pure core and the
#      swap check, and the Keras 3 numerics cases marked `onednn_off_pass`
#      (each Keras 3 case trains in one mode: pass 2 trains the others).
# The README's programs are run by tools/newcomer.py after passes 1 and 2
# (TFLMS_README_BY_NEWCOMER=1: tests/test_docs.py leaves them to it).
# The venvs of passes 2 and 4 are installed in the background during pass 1.
#
# Usage: tools/run_tests.sh [VENV]   (default: .venv-tf215); extra pytest
# arguments may follow the venv and are passed to every run.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-tf215}"
shift || true
PY="$VENV/bin/python"
status=0
echo "== lint: ruff check . (ruff.toml)"
if ! "$PY" -m ruff check .; then
    echo "LINT FAILED: fix the lines ruff lists above (\`ruff check --fix .\`" \
         "fixes some of them), then run again; no test was run." >&2
    exit 1
fi
# The newest TensorFlow's two venvs are installed in the background while
# the first passes run (pip mostly waits on the network and the disk);
# each pass that needs one waits for it. The install logs are shown if
# they fail.
INSTALL_LOG="$(mktemp -t tflms-installs.XXXXXX)"
( INSTALL_ONLY=1 bash tools/ci_tf_latest.sh .venv-tf-latest && \
  INSTALL_ONLY=1 bash tools/ci_py313.sh .venv-py313 ) >"$INSTALL_LOG" 2>&1 &
INSTALLS=$!
echo "== installing .venv-tf-latest and .venv-py313 in the background" \
     "(log: $INSTALL_LOG)"
echo "== TensorFlow $("$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null), oneDNN off: numerics, both_stacks and one_stack"
export TFLMS_README_BY_NEWCOMER=1
TF_ENABLE_ONEDNN_OPTS=0 "$PY" -m pytest \
    -m "numerics or both_stacks or one_stack" "$@" || status=1
echo "== the README's programs as a newcomer runs them"
"$PY" tools/newcomer.py "$VENV" || status=1
if ! wait "$INSTALLS"; then
    cat "$INSTALL_LOG"
    echo "installing the newest TensorFlow's venvs failed (above); the" \
         "passes below install again and say why" >&2
fi
# Not made here: conftest.py makes it when the pass starts.
SKIPPED="$(mktemp -d -t tflms-skipped.XXXXXX)/skipped"
echo "== newest TensorFlow with tf-keras, oneDNN on: whole suite"
TF_ENABLE_ONEDNN_OPTS=1 TFLMS_WRITE_SKIPPED="$SKIPPED" \
    bash tools/ci_tf_latest.sh .venv-tf-latest \
    -m "not one_stack and not onednn_off_pass" "$@" || status=1
if [ -e "$SKIPPED" ]; then
    echo "== TensorFlow 2.15, oneDNN on: the $(sort -u "$SKIPPED" | wc -l)" \
         "tests the newest TensorFlow skipped"
    if [ -s "$SKIPPED" ]; then
        TF_ENABLE_ONEDNN_OPTS=1 TFLMS_ONLY_TESTS="$SKIPPED" \
            "$PY" -m pytest "$@" || status=1
    fi
else
    # The newest stack's pass never started: what it runs, here.
    echo "== TensorFlow 2.15, oneDNN on: the newest stack's pass" \
         "did not run; what it runs, on 2.15"
    status=1
    TF_ENABLE_ONEDNN_OPTS=1 "$PY" -m pytest -m "not one_stack" "$@" || status=1
fi
echo "== Python 3.13, newest TensorFlow, oneDNN off: imports, pure core, swap check, Keras 3 cases marked onednn_off_pass"
bash tools/ci_py313.sh .venv-py313 "$@" || status=1
exit $status
