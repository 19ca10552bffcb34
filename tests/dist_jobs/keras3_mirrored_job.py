"""Keras 3 ``model.fit(callbacks=[LMS(...)])`` under MirroredStrategy.

Started in a subprocess by tests/test_keras3_distributed.py (TensorFlow
2.16+, Keras 3, eager mode): three logical CPU devices, CPU:1 and CPU:2
holding the replicas and standing in for two GPUs, CPU:0 the host the swap
ops go to (``cpu_device``, `_common.HOST`). Each mode trains a model built
and compiled in ``strategy.scope()`` from the same seed on the same data.

Usage: keras3_mirrored_job.py OUT_DIR MODEL MODE[,MODE...]
  MODEL  cnn: a small CNN with batch norm (32x32x3, 4 classes);
         mobilenetv2: keras.applications.MobileNetV2(weights=None) at
         128x128, 10 classes (its activations outweigh its weights and
         optimizer slots there, so half of them can go; ResNet50's
         weights, slots and gradients are most of its peak below about
         200x200, which no plan moves).
  MODE   none: no LMS; fixed: LMS with fixed parameters that swap much;
         tuned: LMS auto-tuned to a budget for part of the activations
         of one replica's step (what stays resident, and `KEPT` of the
         rest of its predicted peak without LMS: 0.6 for cnn, 0.5 for
         mobilenetv2); a trailing '_spe' (none_spe, fixed_spe)
         trains under MirroredStrategy over CPU:1 alone with
         steps_per_execution=2 (Keras 3.15 itself fails to train with two
         replicas and steps_per_execution > 1, LMS or not).
Needs TF_DUMP_GRAPH_PREFIX (the witness that the swap ops ran: the partition
graphs each mode's fit added there). Writes
OUT_DIR/k3_MODE.npz (final weights) and .json (losses, replicas, per swap
the devices, the swap ops found in the partition graphs, the plan's
replicas and the peaks).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.pop("TF_USE_LEGACY_KERAS", None)

import faulthandler  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import FIXED, HOST, save_result, setup_cpu_devices  # noqa: E402
from tflms import LMS  # noqa: E402
from tflms.tf import swaps_ran  # noqa: E402

GLOBAL_BATCH = 4
STEPS = 3
SEED = 1


def _cnn(keras):
    layers = [keras.Input((32, 32, 3))]
    for width in (16, 16, 32, 32):
        layers.append(keras.layers.Conv2D(width, 3, padding="same"))
        layers.append(keras.layers.BatchNormalization())
        layers.append(keras.layers.ReLU())
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)]
    return keras.Sequential(layers), (32, 32, 3), 4


def _mobilenetv2(keras):
    return (keras.applications.MobileNetV2(weights=None,
                                           input_shape=(128, 128, 3),
                                           classes=10),
            (128, 128, 3), 10)


MODELS = {"cnn": _cnn, "mobilenetv2": _mobilenetv2}
# The share of one replica's activations the tuned mode plans to keep on
# the device: the small CNN's convolutions and biases are fused by
# Grappler and stay together on the device (fusions.grappler_groups), so
# it cannot go down to half.
KEPT = {"cnn": 0.6, "mobilenetv2": 0.5}


def _lms(mode, budget_bytes):
    if mode.startswith("fixed"):
        return LMS(**FIXED)
    lms = LMS(cpu_device=HOST)
    lms.autotune_gpu_mem = budget_bytes / float(1 << 30)
    return lms


def _part_of_the_activations(build, strategy, shape, classes, kept):
    """A device budget for one replica's step: what stays resident
    (variables, slots, constants) and the share `kept` of the rest of its
    predicted peak without LMS, found by planning with a budget that fits
    anything (LMS then finds itself not needed)."""
    lms = LMS(cpu_device=HOST)
    lms.autotune_gpu_mem = 1000.0
    model = _fit(build, strategy, shape, classes, lms, 1, steps=1)[0]
    del model
    result = lms.last_run
    assert result.outcome.name == "NOT_NEEDED", result.outcome
    without = max((r.planned.without_lms for _, r in result.replicas),
                  key=lambda w: w.peak_device_bytes)
    # The tuner plans for TF_LMS_SIMULATOR_MEM_RATIO (0.9) of the budget.
    return (without.resident_device_bytes
            + (without.peak_device_bytes - without.resident_device_bytes)
            * kept / 0.9)


def _fit(build, strategy, shape, classes, lms, spe, steps=STEPS):
    import keras
    keras.utils.set_random_seed(SEED)
    with strategy.scope():
        model = build(keras)[0]
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(
                          from_logits=True),
                      steps_per_execution=spe)
    rng = np.random.RandomState(0)
    x = rng.rand(GLOBAL_BATCH * steps, *shape).astype(np.float32)
    y = rng.randint(0, classes, GLOBAL_BATCH * steps)
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1,
                        shuffle=False, verbose=0,
                        callbacks=[lms] if lms is not None else [])
    return model, history


def train(out, model_name, mode):
    import keras
    build = MODELS[model_name]
    _, shape, classes = build(keras)
    spe = 2 if mode.endswith("_spe") else 1
    towers = ["/cpu:1"] if spe > 1 else ["/cpu:1", "/cpu:2"]
    strategy = tf.distribute.MirroredStrategy(towers)
    lms = None
    if not mode.startswith("none"):
        budget = (_part_of_the_activations(build, strategy, shape, classes,
                                           KEPT[model_name])
                  if mode.startswith("tuned") else 0)
        lms = _lms(mode, budget)
    dump = os.environ["TF_DUMP_GRAPH_PREFIX"]
    earlier = swaps_ran.partition_graph_files(dump)
    model, history = _fit(build, strategy, shape, classes, lms, spe)
    record = {"replicas": strategy.num_replicas_in_sync,
              "losses": [float(v) for v in history.history["loss"]],
              "swapins": [], "swapouts": [], "executed": {},
              "plans": []}
    if lms is not None:
        result = lms.last_run
        record["outcome"] = result.outcome.name
        record["swapins"] = list(result.swapin_ops)
        record["swapouts"] = list(result.swapout_ops)
        # The graphs this fit's train function ran (dumped after the
        # earlier modes').
        record["executed"] = swaps_ran.swap_ops_in_partition_graphs(
            swaps_ran.partition_graph_files(dump) - earlier,
            record["swapins"] + record["swapouts"])
        for device, replica in (result.replicas or (("", result),)):
            planned = replica.planned
            record["plans"].append({
                "device": device, "outcome": replica.outcome.name,
                "swapins": list(replica.swapin_ops),
                "budget_bytes": planned.budget_bytes,
                "resident_bytes": (
                    planned.without_lms.resident_device_bytes
                    if planned.without_lms is not None else None),
                "peak_bytes": (planned.with_lms.peak_device_bytes
                               if planned.with_lms is not None else None),
                "peak_without_lms_bytes": (
                    planned.without_lms.peak_device_bytes
                    if planned.without_lms is not None else None),
                "autotuned": bool(planned.autotuned),
            })
    save_result(out, "k3_" + mode, mode,
                {"%03d" % i: w.numpy() for i, w in enumerate(model.weights)},
                record)


if __name__ == "__main__":
    out_dir, model_arg, modes = sys.argv[1], sys.argv[2], sys.argv[3]
    faulthandler.dump_traceback_later(500, exit=True)
    setup_cpu_devices(3, graph_mode=False)
    tf.get_logger().setLevel("INFO")  # LMS's info lines, for the test
    for job_mode in modes.split(","):
        train(out_dir, model_arg, job_mode)
