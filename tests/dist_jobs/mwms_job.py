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
the swap ops go to (``cpu_device="/cpu:1"``): LMS manages the replica's
CPU as it would a worker's GPU.

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

from _common import TraceHook, make_input_fn, model_fn  # noqa: E402
from _common import collective_contacts, setup_cpu_devices  # noqa: E402

FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0,
             cpu_device="/cpu:1")


class RecordHook(TraceHook):
    """Traces every step and keeps the last values of the variables."""

    def __init__(self):
        super().__init__()
        self.weights = {}
        self._variables = None
        self.graph = None

    def begin(self):
        self.graph = tf.compat.v1.get_default_graph()
        self._variables = list(tf.compat.v1.trainable_variables())

    def end(self, session):
        values = session.run(self._variables)
        self.weights = {v.op.name: w for v, w in zip(self._variables, values)}


def main():
    out, mode = sys.argv[1], sys.argv[2]
    faulthandler.dump_traceback_later(200, exit=True)
    worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    setup_cpu_devices(2)

    strategy = (tf.compat.v1.distribute.experimental
                .MultiWorkerMirroredStrategy())
    lms = LMS(**FIXED) if mode == "lms" else None
    record = RecordHook()
    hooks = ([lms] if lms is not None else []) + [record]
    est = tf.compat.v1.estimator.Estimator(
        model_fn, model_dir=os.path.join(out, "model_" + mode),
        config=tf.compat.v1.estimator.RunConfig(
            tf_random_seed=1, train_distribute=strategy,
            save_checkpoints_steps=None, save_checkpoints_secs=None))
    tf.estimator.train_and_evaluate(
        est, tf.estimator.TrainSpec(make_input_fn(10 + worker), max_steps=3,
                                    hooks=hooks),
        tf.estimator.EvalSpec(make_input_fn(10 + worker), steps=1,
                              start_delay_secs=0, throttle_secs=0))
    stem = os.path.join(out, "%s.worker%d" % (mode, worker))
    np.savez(stem + ".npz", **record.weights)
    result = lms.last_run if lms is not None else None
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
