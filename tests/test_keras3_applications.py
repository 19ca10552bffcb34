"""Keras 3 applications trained with ``fit(callbacks=[LMS(...)])`` as
without it: bit for bit, with oneDNN off and on.

Each application (``weights=None``, 4 classes, the smallest input it
takes, batch 2, 2 steps of momentum SGD) is fit from the same seed without
LMS and with fixed parameters that swap nearly every activation
(``swapout_threshold=1``: every tensor read a level or more later), and
every swap op must be in the partition graphs TensorFlow ran
(test_keras3_fit.py explains the witness).

What these tests guard: Grappler sorts the inputs of commutative ops
(AddN, Add, Mul) by name before its common-subexpression and arithmetic
passes, and an AddN adds its inputs in that order. A swap-in named
``lms/...`` sorted elsewhere than the tensor it replaced, so the gradients
an AddN sums (InceptionV3's and NASNetMobile's branches, DenseNet's
concatenations) rounded differently; `rewriter.swapin_op_name` gives
swap-ins names that sort where their tensors do.
Grappler's arithmetic optimizer and remapper merge an op into its one
reader (an addition into the next, a convolution with its bias) only where
the op has no other reader and no control edge; LMS leaves such groups
alone (`fusions.grappler_groups`). With a swap or a trigger inside them,
ResNet50's residual additions were grouped differently.
`test_each_cause_turned_back_on_changes_the_numbers` puts each back alone
and sees the difference (the proof that these were the causes).
Keras 3's optimizer passes every gradient through one IdentityN, which
Grappler's dependency optimizer removes only while it has no control edge;
then the arithmetic optimizer multiplies a gradient's last product and
the update's ``learning_rate * gradient`` in another order (NASNetMobile's
batch norms). LMS gives that IdentityN no control edge either.
With oneDNN on, two more merges of oneDNN's (a swish's ``_MklSwish``,
EfficientNetB0; a MaxPoolGrad given its pool's workspace, NASNetMobile)
are left whole; test_keras3_onednn.py turns each off and sees the
difference.

Exactness also needs Grappler's memory optimizer to accumulate the same
AddNs in both fits: above 80% of the device's memory by its own estimate
(205 MiB of the 256 MiB TensorFlow's CPU device declares), it turns the
AddNs live at its estimated peak into accumulations, and LMS's swaps move
that peak (docs/tf2.md, "Grappler's memory optimizer"). Larger inputs or
tighter budgets can differ for that reason alone;
benchmarks/keras3_bitwise.py compares them with it off.

Keras 3 trains in eager mode and this test process has eager execution
off (conftest.py): each application runs this file as a script in a
subprocess, which prints one JSON line. The subprocess uses one inter-op
thread: with TensorFlow's default, InceptionV3's fit without LMS is not
reproducible from run to run on a CPU, so no comparison could be exact.
"""

import json
import os
import sys
import time

import pytest

from _keras3 import (onednn, result_of, swaps_not_run,
                     weights_compared)

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)

SEED = 1
STEPS = 2
BATCH = 2
# Swaps nearly every activation: every tensor read one level or more after
# it is made, each swap-in started one level before its reader.
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
# The smallest input each application accepts (Keras checks it).
SIZES = {"ResNet50": 32, "InceptionV3": 75, "NASNetMobile": 32,
         "DenseNet121": 32, "EfficientNetB0": 32, "ConvNeXtTiny": 32,
         "ResNet50V2": 32, "Xception": 71}
# What the suite trains (CI's time): NASNetMobile and DenseNet121 take 4 to
# 5 minutes each on two CPU cores and are run by hand, as
#     TF_ENABLE_ONEDNN_OPTS=0|1 TF_DUMP_GRAPH_PREFIX=DUMP_DIR \
#     TF_DUMP_GRAPH_NAME_FILTER=multi_step_on_iterator \
#     python tests/test_keras3_applications.py NASNetMobile DUMP_DIR as-is
# (it prints the RESULT line the test reads; with oneDNN off and the mode
# identity-n-edges instead of as-is, NASNetMobile's cause below).
SUITE_APPS = sorted(set(SIZES) - {"NASNetMobile", "DenseNet121"})
# CI trains each suite application in one oneDNN mode (tools/run_tests.sh):
# with it on (the newest stack's pass) the three whose steps hold what
# oneDNN fuses or lays out (swish, convolutions with their batch norms
# and biases), with it off (the Python 3.13 pass) the other three. Every
# application trains bit for bit in both modes when run by hand.
ONEDNN_ON_APPS = ("ConvNeXtTiny", "EfficientNetB0", "ResNet50")


def _suite_param(app):
    return pytest.param(app, marks=pytest.mark.onednn_on_pass
                        if app in ONEDNN_ON_APPS
                        else pytest.mark.onednn_off_pass)
DUMP_FILTER = "multi_step_on_iterator"

# ---- the script (runs in the subprocess) -------------------------------

def _fit(keras, app, lms=None):
    """Losses and weights after `STEPS` steps of `app` from `SEED`."""
    import numpy as np
    keras.backend.clear_session()  # the same layer (and op) names each time
    keras.utils.set_random_seed(SEED)
    size = SIZES[app]
    model = getattr(keras.applications, app)(
        weights=None, input_shape=(size, size, 3), classes=4)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    rng = np.random.RandomState(0)
    x = rng.rand(BATCH, size, size, 3).astype("float32")
    y = rng.randint(0, 4, BATCH).astype("int32")
    history = model.fit(x, y, batch_size=BATCH, epochs=STEPS, shuffle=False,
                        verbose=0, callbacks=[lms] if lms else [])
    return history.history["loss"], [v.numpy() for v in model.weights]


def _main(app, dump_dir, mode):
    sys.path.insert(0, _ROOT)
    import tensorflow as tf
    import keras
    from tflms import LMS, fusions
    from tflms.tf import rewriter
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if mode == "lms-names":
        # The names swap-ins had before: lms/swapin_<tensor>.
        rewriter.swapin_op_name = lambda t: rewriter.swap_op_name(
            "swapin", t)
    elif mode == "no-groups":
        # Swaps and control edges inside what Grappler merges, as before.
        fusions.grappler_groups = lambda index, onednn_cpu=False: (
            fusions.GrapplerGroups(frozenset(), frozenset(), frozenset()))
    elif mode == "identity-n-edges":
        # Control edges on the IdentityN of the gradients, as before.
        groups = fusions.grappler_groups

        def without_identity_n(index, onednn_cpu=False):
            found = groups(index, onednn_cpu)
            return found._replace(members=frozenset(
                m for m in found.members if index.types[m] != "IdentityN"))
        fusions.grappler_groups = without_identity_n
    times = [time.perf_counter()]
    # TensorFlow reads the dump folder at each dump: the fit without LMS
    # writes none (hundreds of MB less).
    prefix = os.environ.pop("TF_DUMP_GRAPH_PREFIX")
    base_losses, base_weights = _fit(keras, app)
    os.environ["TF_DUMP_GRAPH_PREFIX"] = prefix
    times.append(time.perf_counter())
    lms = LMS(**FIXED)
    losses, weights = _fit(keras, app, lms)
    times.append(time.perf_counter())
    result = lms.last_run
    missing, off_cpu = swaps_not_run(result, dump_dir)
    times.append(time.perf_counter())
    plan = result.planned.plan
    print("RESULT " + json.dumps(dict(
        outcome=result.outcome.value, swapouts=len(result.swapout_ops),
        swapins=len(result.swapin_ops),
        swapout_bytes=plan.swapout_bytes(),
        base_losses=base_losses, losses=losses,
        missing=missing, off_cpu=off_cpu,
        **weights_compared(base_weights, weights),
        seconds=[round(b - a, 1) for a, b in zip(times, times[1:])])))


# ---- the tests -----------------------------------------------------------

def _new_stack():
    from tflms.tf import compat
    return compat.TF_VERSION >= (2, 16, 0)


pytestmark = [pytest.mark.numerics, pytest.mark.skipif(
    not _new_stack(), reason="Keras 3 needs TensorFlow 2.16+; on 2.15 keras "
    "is Keras 2 (test_keras_models.py trains its applications)")]


def _run(app, tmp_path, mode="as-is"):
    dump = tmp_path / "dump"
    dump.mkdir()
    return result_of(os.path.abspath(__file__), app, dump, mode,
                     timeout=900, TF_DUMP_GRAPH_PREFIX=str(dump),
                     TF_DUMP_GRAPH_NAME_FILTER=DUMP_FILTER)[0]


@pytest.mark.parametrize("app", [_suite_param(a) for a in SUITE_APPS])
def test_applications_train_the_same_with_nearly_everything_swapped(
        app, tmp_path):
    r = _run(app, tmp_path)
    assert r["outcome"] == "rewritten"
    assert r["swapouts"] > 50
    assert r["missing"] == [] and r["off_cpu"] == []
    assert r["num_weights"] > 0
    assert r["losses"] == r["base_losses"]
    assert r["different"] == 0


# NASNetMobile's cause ("identity-n-edges") takes 4 to 5 minutes and is
# run by hand, as its application is (the command at SUITE_APPS).
@pytest.mark.onednn_off_pass
@pytest.mark.parametrize("app,mode", [
    ("InceptionV3", "lms-names"), ("ResNet50", "no-groups")])
def test_each_cause_turned_back_on_changes_the_numbers(app, mode, tmp_path):
    """The causes, each turned back on alone, oneDNN off. With swap-ins
    named ``lms/swapin_...`` (sorting after the model's own op names),
    Grappler orders the inputs of InceptionV3's AddNs of gradients
    differently. With swaps and control edges inside the groups Grappler
    merges (`fusions.grappler_groups`), it groups ResNet50's residual
    additions differently and leaves its first convolution unfused.
    With control edges on the IdentityN of the gradients, Grappler keeps
    it, and multiplies NASNetMobile's batch norms' gradients by the
    learning rate in another order than without LMS."""
    if onednn() == "1":
        pytest.skip("exact comparisons need oneDNN off: CI runs this test "
                    "in its Keras 3 pass with it off (tools/run_tests.sh, "
                    "Python 3.13)")
    r = _run(app, tmp_path, mode=mode)
    assert r["outcome"] == "rewritten" and r["missing"] == []
    assert r["different"] > 0


if __name__ == "__main__":
    _main(*sys.argv[1:])
