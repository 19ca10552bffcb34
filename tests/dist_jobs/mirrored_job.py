"""An Estimator trained with MirroredStrategy over two towers, with LMS.

Started in a subprocess by tests/test_distributed.py (logical devices must
be configured before TensorFlow initialises its runtime). The process has
three logical CPU devices: CPU:1 and CPU:2 hold the two towers and stand in
for two GPUs, CPU:0 is the host the swap ops go to. LMS only manages
accelerators, so for this job `tflms.graph_index.is_cpu_device` answers
True for CPU:0 alone; everything else is the real library on a real
mirrored graph.

Usage: mirrored_job.py OUT_DIR MODE[,MODE...], MODE one of 'none' (no
LMS), 'one' (one LMS for every tower) and 'per_device' (one LMS per tower,
gpu_device set); the modes run one after the other in this process. Writes
OUT_DIR/MODE.npz (final weights) and OUT_DIR/MODE.json (per swap-in:
devices of the swapped tensor's producer, of the swap op, of its consumers
and triggers; which swap ops ran).
"""

import faulthandler
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tflms import LMS  # noqa: E402
from tflms import graph_index  # noqa: E402

TOWERS = ("/cpu:1", "/cpu:2")
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


def _host_only_is_cpu(real):
    def is_cpu_device(device):
        if not real(device):
            return False
        return (tf.DeviceSpec.from_string(device).device_index or 0) == 0
    return is_cpu_device


def model_fn(features, labels, mode):
    h = features["x"]
    for i in range(4):
        h = tf.compat.v1.layers.dense(
            h, 32, activation=tf.nn.relu, name="dense%d" % i,
            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
                seed=i))
    logits = tf.compat.v1.layers.dense(
        h, 3, name="logits",
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=7))
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def input_fn():
    rng = np.random.RandomState(0)
    x = rng.randn(64, 16).astype(np.float32)
    y = rng.randint(0, 3, 64).astype(np.int32)
    return tf.compat.v1.data.Dataset.from_tensor_slices(
        ({"x": x}, y)).batch(8, drop_remainder=True).repeat()


class TraceHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.executed = set()

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(
            fetches=None, options=tf.compat.v1.RunOptions(
                trace_level=tf.compat.v1.RunOptions.FULL_TRACE))

    def after_run(self, run_context, run_values):
        for dev in run_values.run_metadata.step_stats.dev_stats:
            self.executed.update(n.node_name for n in dev.node_stats)


class DescribeHook(tf.compat.v1.train.SessionRunHook):
    """Records, after the LMS hooks edited the graph, where each swap is."""

    def __init__(self, lms_list):
        self.lms_list = lms_list
        self.swaps = []

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        for lms in self.lms_list:
            result = lms.last_result
            for name in (result.swapin_ops if result else ()):
                swapin = graph.get_operation_by_name(name)
                swapout = swapin.inputs[0].op
                source = swapout.inputs[0].op
                self.swaps.append({
                    "swapin": name, "swapout": swapout.name,
                    "source_device": source.device,
                    "swap_devices": [swapin.device, swapout.device],
                    "consumer_devices": sorted(
                        c.device for c in swapin.outputs[0].consumers()),
                    "trigger_devices": sorted(
                        c.device for c in swapin.control_inputs),
                })


def train(out, mode):
    strategy = tf.distribute.MirroredStrategy(list(TOWERS))
    if mode == "none":
        lms_list = []
    elif mode == "one":
        lms_list = [LMS(**FIXED)]
    else:
        lms_list = [LMS(gpu_device=d, **FIXED) for d in TOWERS]
    trace, describe = TraceHook(), DescribeHook(lms_list)
    est = tf.compat.v1.estimator.Estimator(
        model_fn, model_dir=os.path.join(out, "model_" + mode),
        config=tf.compat.v1.estimator.RunConfig(
            tf_random_seed=1, train_distribute=strategy))
    est.train(input_fn, steps=3, hooks=lms_list + [describe, trace])
    names = [n for n in est.get_variable_names()
             if n.startswith(("dense", "logits"))]
    np.savez(os.path.join(out, mode + ".npz"),
             **{n: est.get_variable_value(n) for n in names})
    with open(os.path.join(out, mode + ".json"), "w", encoding="utf-8") as f:
        json.dump({"replicas": strategy.num_replicas_in_sync,
                   "swaps": describe.swaps,
                   "executed": sorted(trace.executed)}, f)
    print("done", mode, flush=True)


def main():
    out, modes = sys.argv[1], sys.argv[2].split(",")
    faulthandler.dump_traceback_later(200, exit=True)
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * 3)
    tf.compat.v1.disable_eager_execution()
    graph_index.is_cpu_device = _host_only_is_cpu(graph_index.is_cpu_device)
    for mode in modes:
        train(out, mode)


if __name__ == "__main__":
    main()
