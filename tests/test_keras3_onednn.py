"""What oneDNN merges at run time, which a Keras 3 step planned by LMS
leaves whole (`fusions.grappler_groups` on `Target.onednn_cpu`).

With oneDNN on, TensorFlow runs two rewrites the plain CPU build does not:
the remapper makes one ``_MklSwish`` of ``x * sigmoid(x)`` (Keras'
``silu``, EfficientNet's activation) while the Sigmoid has no control edge
and the Mul reads ``x`` itself, and the layout pass gives a MaxPoolGrad
its pool's workspace (where the maxima were) while it reads the pool's own
output; without it, TensorFlow's MaxPoolGrad kernel sums the gradients of
overlapping windows in another order. A swap-in read by the Mul or by the
MaxPoolGrad, or a trigger's control edge on the Sigmoid, undoes the merge
and the step rounds differently. LMS leaves them whole, and
tests/test_keras3_applications.py trains EfficientNetB0 and NASNetMobile
bit for bit with oneDNN on.

Here a small CNN with both patterns is fit from one seed without LMS, with
fixed parameters that swap nearly everything, and with the same parameters
but each rule turned off alone (`Target.onednn_cpu` forced False for
that rule): with the rules, bit for bit and every swap op ran; each rule
off, the weights differ (the proof that these were the causes). The rules
matter only with oneDNN on: with it off this file skips (tools/run_tests.sh
runs the TensorFlow 2.21 suite, which holds it, with oneDNN on).

Each case runs this file as a script in a subprocess (Keras 3 trains in
eager mode; the test process has eager execution off), which prints one
``RESULT`` JSON line.
"""

import json
import os
import sys

import pytest

from _keras3 import (needs_keras3, onednn, result_of, swaps_not_run,
                     weights_compared)

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)

SEED = 1
BATCH = 4
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
DUMP_FILTER = "multi_step_on_iterator"


# ---- the script (runs in the subprocess) -------------------------------

def _fit(keras, lms=None):
    """Losses and weights after two steps of a CNN with a swish and an
    overlapping max pool."""
    import numpy as np
    keras.backend.clear_session()
    keras.utils.set_random_seed(SEED)
    layers = keras.layers
    model = keras.Sequential([
        keras.Input((24, 24, 3)),
        layers.Conv2D(8, 3, padding="same"),
        layers.BatchNormalization(),
        layers.Activation("silu"),
        layers.MaxPooling2D(3, strides=2, padding="same"),
        layers.Conv2D(16, 3, padding="same"),
        layers.Activation("silu"),
        layers.MaxPooling2D(3, strides=2, padding="same"),
        layers.Conv2D(16, 3, padding="same"),
        layers.GlobalAveragePooling2D(),
        layers.Dense(4, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    rng = np.random.RandomState(0)
    x = rng.rand(BATCH, 24, 24, 3).astype("float32")
    y = rng.randint(0, 4, BATCH).astype("int32")
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                        verbose=0, callbacks=[lms] if lms else [])
    return history.history["loss"], [v.numpy() for v in model.weights]


def _without(rule):
    """`fusions.grappler_groups` without one of its oneDNN rules."""
    from tflms import fusions
    groups = fusions.grappler_groups
    pattern = {"swish": fusions.swishes,
               "pool": fusions.pools_with_workspace}[rule]

    def grappler_groups(index, onednn_cpu=False):
        found = groups(index, onednn_cpu)
        if not onednn_cpu:
            return found
        if rule == "swish":
            pairs = list(pattern(index))
            sigmoids = {s for s, _ in pairs}
            muls = {m for _, m in pairs}
            return found._replace(
                inner=found.inner - sigmoids,
                members=found.members - sigmoids - muls,
                direct_readers=found.direct_readers - muls)
        return found._replace(inner=found.inner - set(pattern(index)))
    fusions.grappler_groups = grappler_groups


def _main(mode, dump_dir):
    sys.path.insert(0, _ROOT)
    import tensorflow as tf
    import keras
    from tflms import LMS
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if mode != "as-is":
        _without(mode)
    prefix = os.environ.pop("TF_DUMP_GRAPH_PREFIX")
    base_losses, base_weights = _fit(keras)
    os.environ["TF_DUMP_GRAPH_PREFIX"] = prefix
    lms = LMS(**FIXED)
    losses, weights = _fit(keras, lms)
    result = lms.last_run
    missing, _ = swaps_not_run(result, dump_dir)
    print("RESULT " + json.dumps(dict(
        outcome=result.outcome.value, swapouts=len(result.swapout_ops),
        base_losses=base_losses, losses=losses, missing=missing,
        **weights_compared(base_weights, weights))))


# ---- the tests -----------------------------------------------------------

pytestmark = [pytest.mark.numerics, needs_keras3, pytest.mark.skipif(
    onednn() != "1", reason="oneDNN's passes run only with "
    "TF_ENABLE_ONEDNN_OPTS=1 (tools/run_tests.sh runs this stack's suite "
    "with it on)")]


def _run(mode, tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    return result_of(os.path.abspath(__file__), mode, dump,
                     TF_DUMP_GRAPH_PREFIX=str(dump),
                     TF_DUMP_GRAPH_NAME_FILTER=DUMP_FILTER)[0]


def test_swishes_and_pools_stay_merged_and_train_bit_for_bit(tmp_path):
    r = _run("as-is", tmp_path)
    assert r["outcome"] == "rewritten" and r["swapouts"] > 5
    assert r["missing"] == []
    assert r["losses"] == r["base_losses"]
    assert r["different"] == 0


@pytest.mark.parametrize("rule", ["swish", "pool"])
def test_each_onednn_rule_turned_off_changes_the_numbers(rule, tmp_path):
    r = _run(rule, tmp_path)
    assert r["outcome"] == "rewritten" and r["missing"] == []
    assert r["different"] > 0


if __name__ == "__main__":
    _main(*sys.argv[1:])
