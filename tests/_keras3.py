"""What the Keras 3 test files share (test_keras3_trace, test_verify_keras3).

Keras 3 exists on TensorFlow 2.16+ only and trains in eager mode, while the
test process has eager execution off (and, on the new stack,
TF_USE_LEGACY_KERAS set): every Keras 3 step runs in a subprocess started
by `python`, with TF_USE_LEGACY_KERAS unset. The subprocesses inherit
TF_ENABLE_ONEDNN_OPTS (conftest.py).
"""

import os
import subprocess
import sys

import pytest

from tflms.tf import compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_keras3 = pytest.mark.skipif(
    compat.TF_VERSION < (2, 16, 0),
    reason="Keras 3 needs TensorFlow 2.16+; TensorFlow %s has Keras 2 only"
    % ".".join(map(str, compat.TF_VERSION)))

# Saves a Sequential model of the given layers (Keras 3 source after
# "keras.Input(...),") twice: compiled with momentum SGD and sparse
# categorical cross-entropy to argv[1], uncompiled to argv[2].
_SAVE = r"""
import sys
import keras

def cnn():
    keras.utils.set_random_seed(1)
    return keras.Sequential([
%s
    ])

model = cnn()
model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.save(sys.argv[1])
cnn().save(sys.argv[2])
"""


def _env():
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def python(*argv):
    """Runs ``python ARGV`` (each converted with str) with Keras 3 as
    `keras`, from the repository root; the `subprocess.CompletedProcess`."""
    return subprocess.run([sys.executable] + [str(a) for a in argv],
                          capture_output=True, text=True, timeout=600,
                          env=_env(), cwd=ROOT)


def save_models(folder, layers):
    """Saves ``cnn.keras`` (compiled) and ``bare.keras`` (no training
    configuration) in `folder`, a Sequential of `layers` (lines of Keras 3
    source, one layer each); returns ``{"compiled": path, "bare": path}``."""
    compiled, bare = folder / "cnn.keras", folder / "bare.keras"
    out = python("-c", _SAVE % "\n".join(
        "        %s," % layer for layer in layers), compiled, bare)
    assert out.returncode == 0, out.stderr[-3000:]
    return {"compiled": str(compiled), "bare": str(bare)}
