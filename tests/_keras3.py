"""What the Keras 3 test files share (test_keras3_trace, test_verify_keras3,
test_live_capacity, test_keras3_fit, test_keras3_mixed_precision,
test_keras3_distributed).

Keras 3 exists on TensorFlow 2.16+ only and trains in eager mode, while the
test process has eager execution off (and, on the new stack,
TF_USE_LEGACY_KERAS set): every Keras 3 step runs in a subprocess started
by `python` (or `result_of`, for a script that prints one ``RESULT`` JSON
line), with TF_USE_LEGACY_KERAS and KERAS_BACKEND unset. The subprocesses
get TF_ENABLE_ONEDNN_OPTS explicitly (conftest.py sets it).
"""

import importlib.util
import json
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

# KerasHub (keras-hub, on the newest stack: tools/install_test_deps.sh VENV
# tf installs it) for the tests that build its models from configs.
needs_keras_hub = pytest.mark.skipif(
    compat.TF_VERSION < (2, 16, 0)
    or importlib.util.find_spec("keras_hub") is None,
    reason="KerasHub needs Keras 3 (TensorFlow 2.16+) and the keras-hub "
    "package, which tools/install_test_deps.sh VENV tf installs")

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


def onednn():
    """``TF_ENABLE_ONEDNN_OPTS`` of this run, "0" or "1"."""
    return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "0")


def error_of(call):
    """``[type name, message]`` of the exception `call()` raises, or None:
    for a script's RESULT line, which carries no exception objects."""
    try:
        call()
    except Exception as e:
        return [type(e).__name__, str(e)]
    return None


def fit_seeded(keras, build, batch, lms=None):
    """``(losses, model)`` after `build(keras)`, built from seed 3, is fit
    two epochs of momentum SGD on three batches of `batch` random 64x64
    RGB images of 4 classes (its logits), with `lms` as a callback if
    given: the same training each call, with LMS or without."""
    import numpy as np
    keras.utils.set_random_seed(3)
    model = build(keras)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True), jit_compile=False)
    rng = np.random.RandomState(0)
    x = rng.rand(3 * batch, 64, 64, 3).astype("float32")
    y = rng.randint(0, 4, 3 * batch).astype("int32")
    history = model.fit(x, y, batch_size=batch, epochs=2, shuffle=False,
                        verbose=0, callbacks=[lms] if lms else [])
    return history.history["loss"], model


def keras3_env(**extra):
    """This process's environment for a Keras 3 subprocess: `keras` is
    Keras 3 on TensorFlow (TF_USE_LEGACY_KERAS and KERAS_BACKEND unset),
    tflms from this repository first, the oneDNN mode explicit, and the
    variables in `extra`."""
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)
    env.pop("KERAS_BACKEND", None)  # TensorFlow, Keras' default
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["TF_ENABLE_ONEDNN_OPTS"] = onednn()
    env.update(extra)
    return env


def python(*argv, timeout=600, **env):
    """Runs ``python ARGV`` (each converted with str) with Keras 3 as
    `keras`, from the repository root, with the variables `env` set; the
    `subprocess.CompletedProcess`."""
    return subprocess.run([sys.executable] + [str(a) for a in argv],
                          capture_output=True, text=True, timeout=timeout,
                          env=keras3_env(**env), cwd=ROOT)


def result_of(*argv, timeout=600, **env):
    """Runs ``python ARGV`` as `python` does, for a script that prints its
    findings as one line ``RESULT <json>``: that JSON, and the script's
    standard error (its log). Fails the test with the end of the error
    output if the script fails or prints no result."""
    out = python(*argv, timeout=timeout, **env)
    assert out.returncode == 0, out.stderr[-4000:]
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, out.stdout + out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):]), out.stderr


def save_models(folder, layers):
    """Saves ``cnn.keras`` (compiled) and ``bare.keras`` (no training
    configuration) in `folder`, a Sequential of `layers` (lines of Keras 3
    source, one layer each); returns ``{"compiled": path, "bare": path}``."""
    compiled, bare = folder / "cnn.keras", folder / "bare.keras"
    out = python("-c", _SAVE % "\n".join(
        "        %s," % layer for layer in layers), compiled, bare)
    assert out.returncode == 0, out.stderr[-3000:]
    return {"compiled": str(compiled), "bare": str(bare)}


def swaps_not_run(result, dump_dir, before=frozenset()):
    """``(missing, off_cpu)``: the swap ops of `result` (an `LMS.last_run`)
    absent from the partition graphs TensorFlow dumped into `dump_dir`
    (those files in `before` aside), and those that ran on no CPU. Both
    empty means every swap op LMS added ran, on the host."""
    from tflms.tf import swaps_ran
    swap_ops = list(result.swapout_ops) + list(result.swapin_ops)
    ran = swaps_ran.swap_ops_in_partition_graphs(
        swaps_ran.partition_graph_files(dump_dir) - set(before), swap_ops)
    return ([n for n in swap_ops if n not in ran],
            [n for n in swap_ops if n in ran and "CPU" not in ran[n].upper()])


def weights_compared(base_weights, weights):
    """How two lists of weight arrays differ, for a RESULT line: the count
    not bit-identical and the largest absolute difference."""
    import numpy as np
    return dict(
        num_weights=len(weights),
        different=sum(not np.array_equal(a, b)
                      for a, b in zip(base_weights, weights)),
        largest_difference=max(
            (float(np.max(np.abs(a.astype("float64")
                                 - b.astype("float64"))))
             for a, b in zip(base_weights, weights)), default=0.0))
