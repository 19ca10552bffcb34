"""One worker of a 2-worker MultiWorkerMirroredStrategy Estimator job.

Started twice by tests/test_distributed.py with TF_CONFIG naming two
workers on 127.0.0.1. What works on TensorFlow 2.15 (tensorflow-estimator
2.15): the v1 strategy ``tf.compat.v1.distribute.experimental.
MultiWorkerMirroredStrategy`` in ``RunConfig(train_distribute=...)`` driven
by ``tf.estimator.train_and_evaluate``; ``Estimator.train`` itself refuses
("Only `STANDALONE_CLIENT` mode is supported when you call
`estimator.train`"). LMS goes in ``TrainSpec(hooks=[lms])``.

Each worker has two logical CPU devices. The tower runs on CPU:0 (the
worker's only replica device) and stands in for a GPU; CPU:1 is the host
the swap ops go to, so for this job `tflms.graph_index.is_cpu_device`
answers True for CPU:1 alone.

Usage: mwms_job.py OUT_DIR MODE ('none' or 'lms'); TF_CONFIG must be set.
Writes OUT_DIR/MODE.worker<i>.npz and .json (swap ops added and executed).
"""

import faulthandler
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tflms import LMS  # noqa: E402
from tflms import graph_index  # noqa: E402

from _common import collective_contacts  # noqa: E402

FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0,
             cpu_device="/cpu:1")


def _host_only_is_cpu(real):
    def is_cpu_device(device):
        if not real(device):
            return False
        return (tf.DeviceSpec.from_string(device).device_index or 0) == 1
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


def make_input_fn(worker):
    def input_fn():
        rng = np.random.RandomState(10 + worker)
        x = rng.randn(64, 16).astype(np.float32)
        y = rng.randint(0, 3, 64).astype(np.int32)
        return tf.compat.v1.data.Dataset.from_tensor_slices(
            ({"x": x}, y)).batch(8, drop_remainder=True).repeat()
    return input_fn


class RecordHook(tf.compat.v1.train.SessionRunHook):
    """Traces every step and keeps the last values of the variables."""

    def __init__(self):
        self.executed = set()
        self.weights = {}
        self._variables = None
        self.graph = None

    def begin(self):
        self.graph = tf.compat.v1.get_default_graph()
        self._variables = list(tf.compat.v1.trainable_variables())

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(
            fetches=None, options=tf.compat.v1.RunOptions(
                trace_level=tf.compat.v1.RunOptions.FULL_TRACE))

    def after_run(self, run_context, run_values):
        for dev in run_values.run_metadata.step_stats.dev_stats:
            self.executed.update(n.node_name for n in dev.node_stats)

    def end(self, session):
        values = session.run(self._variables)
        self.weights = {v.op.name: w for v, w in zip(self._variables, values)}


def main():
    out, mode = sys.argv[1], sys.argv[2]
    faulthandler.dump_traceback_later(200, exit=True)
    worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.compat.v1.disable_eager_execution()
    graph_index.is_cpu_device = _host_only_is_cpu(graph_index.is_cpu_device)

    strategy = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy()
    lms = LMS(**FIXED) if mode == "lms" else None
    record = RecordHook()
    hooks = ([lms] if lms is not None else []) + [record]
    est = tf.compat.v1.estimator.Estimator(
        model_fn, model_dir=os.path.join(out, "model_" + mode),
        config=tf.compat.v1.estimator.RunConfig(
            tf_random_seed=1, train_distribute=strategy,
            save_checkpoints_steps=None, save_checkpoints_secs=None))
    tf.estimator.train_and_evaluate(
        est, tf.estimator.TrainSpec(make_input_fn(worker), max_steps=3,
                                    hooks=hooks),
        tf.estimator.EvalSpec(make_input_fn(worker), steps=1,
                              start_delay_secs=0, throttle_secs=0))
    stem = os.path.join(out, "%s.worker%d" % (mode, worker))
    np.savez(stem + ".npz", **record.weights)
    result = lms.last_result if lms is not None else None
    collectives, contacts = collective_contacts(record.graph, result)
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump({
            "replicas": strategy.num_replicas_in_sync,
            "swapout_ops": list(result.swapout_ops) if result else [],
            "swapin_ops": list(result.swapin_ops) if result else [],
            "executed": sorted(record.executed),
            "collectives": collectives,
            "collective_contacts": contacts}, f)
    print("done", mode, worker, flush=True)


if __name__ == "__main__":
    main()
