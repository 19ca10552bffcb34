"""Keras 3 applications trained with ``fit(callbacks=[LMS(...)])`` as
without it: bit for bit, with oneDNN off and on.

Each application (``weights=None``, 4 classes, batch 2, 2 steps of
momentum SGD) is fit from the same seed without LMS and with it, over a
grid: at the smallest input it takes and at one twice as wide (`SIZES`;
InceptionV3 at 1.5 times, `SECOND_SIZES`); with fixed parameters that swap
nearly every activation (`FIXED`, ``swapout_threshold=1``: every tensor
read a level or more later) and auto-tuned to a budget LMS meets with
swaps between the peak of the smallest plan and the peak without LMS
(`auto_budget`); with oneDNN off and on. Each case must be rewritten,
train to the same losses and weights bit for bit, and every swap op must
be in the partition graphs TensorFlow ran (test_keras3_fit.py explains the
witness): `problems`.

CI trains a part of the grid (`SUITE`, each case in one oneDNN mode,
`ONEDNN_ON`): three applications at their smallest input with `FIXED`, and
issue 48's ResNet50V2 and Xception at their second size with the
auto-tuned budget. The whole grid is run by hand, in both modes, by
benchmarks/keras3_applications_grid.py, which also lists the AddNs
Grappler's memory optimizer accumulated in each fit (below); docs/tf2.md
holds the table of its last run and says which cases were run by hand.

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
tighter budgets can differ for that reason alone: InceptionV3 at 150
(AddN_20 accumulated without LMS, none with it; every weight differs, in
both modes and both budgets, and none with the memory optimizer off),
hence its second size of 112, where no fit accumulates any.
benchmarks/keras3_applications_grid.py lists the AddNs each fit of a case
accumulated, and its --no-memory-scheduling runs both with it off.

Keras 3 trains in eager mode and this test process has eager execution
off (conftest.py): each case runs this file as a script in a
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
# The two budgets: FIXED, or auto-tuned to a budget between the peak of the
# smallest plan and the peak without LMS that LMS meets with swaps
# (`auto_budget`).
BUDGETS = ("fixed", "auto")
# The smallest input each application accepts (Keras checks it), and a
# second twice as wide (four times the activations), but InceptionV3's: at
# 150, Grappler's memory optimizer accumulates AddN_20 in the fit without
# LMS and none in the fit with it, so the fits add in other orders for that
# reason alone (docs/tf2.md, "Grappler's memory optimizer"); at 112 in
# neither.
SIZES = {"ResNet50": 32, "InceptionV3": 75, "NASNetMobile": 32,
         "DenseNet121": 32, "EfficientNetB0": 32, "ConvNeXtTiny": 32,
         "ResNet50V2": 32, "Xception": 71}
SECOND_SIZES = dict({app: 2 * size for app, size in SIZES.items()},
                    InceptionV3=112)
# The grid: each application at both sizes with both budgets, in both
# oneDNN modes. What does not fit in CI's time is run by hand, as
#     env -u TF_USE_LEGACY_KERAS \
#         python benchmarks/keras3_applications_grid.py [APP ...]
# which runs this file as a script for each case and prints a table
# (docs/tf2.md holds the last one).

# What the suite trains (CI's time): EfficientNetB0, InceptionV3 and
# ResNet50 at their smallest input with FIXED, and ResNet50V2 and Xception,
# issue 48's, at their second size with the auto-tuned budget. The other
# cases (ConvNeXtTiny, NASNetMobile and DenseNet121, 1.5 to 5 minutes each
# on two CPU cores; ResNet50V2 and Xception at their smallest input) are
# the benchmark's.
SUITE = (("EfficientNetB0", SIZES["EfficientNetB0"], "fixed"),
         ("InceptionV3", SIZES["InceptionV3"], "fixed"),
         ("ResNet50", SIZES["ResNet50"], "fixed"),
         ("ResNet50V2", SECOND_SIZES["ResNet50V2"], "auto"),
         ("Xception", SECOND_SIZES["Xception"], "auto"))
# CI trains each suite case in one oneDNN mode (tools/run_tests.sh): with
# it on (the newest stack's pass) the two applications whose steps hold
# what oneDNN fuses or lays out (swish, convolutions with their batch norms
# and biases) and ResNet50V2 at its second size, with it off (the Python
# 3.13 pass) the others. Run by hand, every case trains in both modes.
ONEDNN_ON = (("EfficientNetB0", 32, "fixed"), ("ResNet50", 32, "fixed"),
             ("ResNet50V2", 64, "auto"))


def _suite_param(case):
    return pytest.param(*case, marks=() if case in ONEDNN_ON
                        else pytest.mark.onednn_off_pass,
                        id="%s-%d-%s" % case)


DUMP_FILTER = "multi_step_on_iterator"


def problems(r):
    """What keeps the case of RESULT `r` from training as without LMS:
    a list of sentences, empty when it does."""
    found = []
    if r["outcome"] != "rewritten":
        found.append("outcome %s, not rewritten" % r["outcome"])
    # FIXED swaps nearly everything; a budget below the peak, something.
    fewest = 51 if r["budget"] == "fixed" else 1
    if r["swapouts"] < fewest:
        found.append("%d tensors swapped, fewer than %d"
                     % (r["swapouts"], fewest))
    if r["missing"] or r["off_cpu"]:
        found.append("swap ops not run: %s; run off the CPU: %s" % (
            r["missing"][:5], r["off_cpu"][:5]))
    if r["num_weights"] == 0:
        found.append("no weights compared")
    if r["losses"] != r["base_losses"]:
        found.append("losses %s, without LMS %s"
                     % (r["losses"], r["base_losses"]))
    if r["different"]:
        found.append("%d of %d weights different (at most %.3g)" % (
            r["different"], r["num_weights"], r["largest_difference"]))
    return found

# ---- the script (runs in the subprocess) -------------------------------


def _model(keras, app, size):
    keras.backend.clear_session()  # the same layer (and op) names each time
    keras.utils.set_random_seed(SEED)
    model = getattr(keras.applications, app)(
        weights=None, input_shape=(size, size, 3), classes=4)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    return model


def _fit(keras, app, size, lms=None):
    """Losses and weights after `STEPS` steps of `app` from `SEED`."""
    import numpy as np
    model = _model(keras, app, size)
    rng = np.random.RandomState(0)
    x = rng.rand(BATCH, size, size, 3).astype("float32")
    y = rng.randint(0, 4, BATCH).astype("int32")
    history = model.fit(x, y, batch_size=BATCH, epochs=STEPS, shuffle=False,
                        verbose=0, callbacks=[lms] if lms else [])
    return history.history["loss"], [v.numpy() for v in model.weights]


def auto_budget(keras, app, size):
    """``(peak, smallest, budget)``: the simulated peak of a step of `app`
    at `size` without LMS and of the smallest plan LMS's search finds,
    and a device budget between them that LMS meets with swaps (bytes):
    halfway first, then, while LMS meets the budget without a swap
    (ordering the step's ops alone lowers the peak), halfway between the
    smallest plan's peak and that plan's. Planned as
    the fit plans the step (`graph_step.step_target`, Keras' train_step
    traced at the batch). At these sizes much of the peak is the update
    (weights, every gradient, the slots), which no plan lowers, so a share
    of the peak itself could be below every plan."""
    from tflms import LMS, capacity, pipeline
    from tflms.tf import keras3_trace
    from tflms.tf.adapters import graph_step, rewrite
    settings = LMS().settings.replace(batch_size=BATCH)
    loaded = keras3_trace.from_model(_model(keras, app, size), BATCH)
    index, target = rewrite.function_graph_step(
        keras3_trace.trace(loaded).graph, settings,
        graph_step.step_target(settings))
    roles = pipeline.classify(index, settings, target)

    def planned(nbytes):
        return capacity.plan_row(index, roles, settings.replace(
            autotune_gpu_mem=gpu_mem(nbytes)), BATCH, target=target)
    row = planned(1)  # no plan fits: the search's smallest
    peak, smallest = row.peak_without_bytes, row.smallest_peak_bytes
    budget = (peak + smallest) / 2.0
    for _ in range(6):
        row = planned(budget)
        if not row.fits_with or row.swapout_bytes:
            break
        budget = (row.peak_with_bytes + smallest) / 2.0
    if not row.fits_with or not row.swapout_bytes:
        raise ValueError("%s at %d: no budget between the smallest plan "
                         "(%d bytes) and the peak (%d) found that LMS meets "
                         "with swaps; the last, %d: %s" % (
                             app, size, smallest, peak, budget, row))
    return peak, smallest, budget


def gpu_mem(nbytes):
    """The ``autotune_gpu_mem`` (GiB) of a device budget of `nbytes`."""
    from tflms import autotune
    return nbytes / autotune.mem_ratio() / (1 << 30)


def _arguments(argv):
    import argparse
    parser = argparse.ArgumentParser(description="one case of the test")
    parser.add_argument("app")
    parser.add_argument("dump_dir", help="TF_DUMP_GRAPH_PREFIX's folder")
    parser.add_argument("mode", nargs="?", default="as-is", choices=(
        "as-is", "lms-names", "no-groups", "identity-n-edges"))
    parser.add_argument("--size", type=int, default=None,
                        help="default: the smallest (SIZES)")
    parser.add_argument("--budget", choices=BUDGETS, default="fixed")
    parser.add_argument("--dump-without", default=None,
                        help="a folder for the fit without LMS's graphs, "
                        "to list the AddNs it accumulated (default: none)")
    parser.add_argument("--no-memory-scheduling", action="store_true",
                        help="both fits with Grappler's memory optimizer "
                        "off (benchmarks/keras3_bitwise.py)")
    args = parser.parse_args(argv)
    if args.size is None:
        args.size = SIZES[args.app]
    return args


def _turn_back_on(mode):
    """Puts back one cause (the tests' `mode`) of the differences fixed."""
    from tflms import fusions
    from tflms.tf import rewriter
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


def _main(argv):
    args = _arguments(argv)
    sys.path.insert(0, _ROOT)
    import tensorflow as tf
    import keras
    from benchmarks.keras3_bitwise import (accumulated_addns,
                                           no_memory_scheduling)
    from tflms import LMS
    tf.config.threading.set_inter_op_parallelism_threads(1)
    _turn_back_on(args.mode)
    if args.no_memory_scheduling:
        no_memory_scheduling()
    times = [time.perf_counter()]
    peak = smallest = budget = None
    if args.budget == "auto":
        peak, smallest, budget = auto_budget(keras, args.app, args.size)
        lms = LMS()
        lms.autotune_gpu_mem = gpu_mem(budget)
        lms.batch_size = BATCH
    else:
        lms = LMS(**FIXED)
    # TensorFlow reads the dump folder at each dump: the fit without LMS
    # writes none unless asked (hundreds of MB less).
    prefix = os.environ.pop("TF_DUMP_GRAPH_PREFIX")
    if args.dump_without:
        os.environ["TF_DUMP_GRAPH_PREFIX"] = args.dump_without
    base_losses, base_weights = _fit(keras, args.app, args.size)
    os.environ["TF_DUMP_GRAPH_PREFIX"] = prefix
    times.append(time.perf_counter())
    losses, weights = _fit(keras, args.app, args.size, lms)
    times.append(time.perf_counter())
    result = lms.last_run
    missing, off_cpu = swaps_not_run(result, args.dump_dir)
    times.append(time.perf_counter())
    plan = result.planned.plan
    r = dict(
        app=args.app, size=args.size, budget=args.budget,
        outcome=result.outcome.value,
        swapouts=len(result.swapout_ops), swapins=len(result.swapin_ops),
        recomputes=len(result.rewrite.recompute_ops) if result.rewrite
        else 0,
        swapout_bytes=plan.swapout_bytes() if plan else 0,
        peak=peak, smallest=smallest, budget_bytes=budget,
        base_losses=base_losses, losses=losses,
        missing=missing, off_cpu=off_cpu,
        accumulated=accumulated_addns(args.dump_dir),
        base_accumulated=accumulated_addns(args.dump_without)
        if args.dump_without else None,
        **weights_compared(base_weights, weights),
        seconds=[round(b - a, 1) for a, b in zip(times, times[1:])])
    r["problems"] = problems(r)
    print("RESULT " + json.dumps(r))


# ---- the tests -----------------------------------------------------------

def _new_stack():
    from tflms.tf import compat
    return compat.TF_VERSION >= (2, 16, 0)


pytestmark = [pytest.mark.numerics, pytest.mark.skipif(
    not _new_stack(), reason="Keras 3 needs TensorFlow 2.16+; on 2.15 keras "
    "is Keras 2 (test_keras_models.py trains its applications)")]


def _run(app, tmp_path, *args):
    dump = tmp_path / "dump"
    dump.mkdir()
    return result_of(os.path.abspath(__file__), app, dump, *args,
                     timeout=900, TF_DUMP_GRAPH_PREFIX=str(dump),
                     TF_DUMP_GRAPH_NAME_FILTER=DUMP_FILTER)[0]


@pytest.mark.parametrize("app,size,budget", [_suite_param(c) for c in SUITE])
def test_applications_train_the_same_with_lms(app, size, budget, tmp_path):
    r = _run(app, tmp_path, "--size", size, "--budget", budget)
    assert problems(r) == []


# NASNetMobile's cause takes 4 to 5 minutes and is run by hand (oneDNN off;
# it prints the RESULT line the test reads, with "different" above 0):
#     TF_ENABLE_ONEDNN_OPTS=0 TF_DUMP_GRAPH_PREFIX=DUMP_DIR \
#     TF_DUMP_GRAPH_NAME_FILTER=multi_step_on_iterator \
#     python tests/test_keras3_applications.py NASNetMobile DUMP_DIR \
#         identity-n-edges
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
    r = _run(app, tmp_path, mode)
    assert r["outcome"] == "rewritten" and r["missing"] == []
    assert r["different"] > 0


if __name__ == "__main__":
    _main(sys.argv[1:])
