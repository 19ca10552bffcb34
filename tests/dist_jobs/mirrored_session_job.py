"""A Session training loop with MirroredStrategy over two towers, with LMS.

The tf.distribute check that needs no Estimator, so it runs on TensorFlow
2.16+ as well: the graph is built in graph mode with
``strategy.extended.call_for_each_replica`` (as the Estimator does inside),
rewritten with ``LMS.run`` and trained with a plain ``tf.compat.v1.Session``.
Devices as in mirrored_job.py: CPU:1 and CPU:2 hold the towers and stand in
for GPUs, CPU:0 is the host.

Usage: mirrored_session_job.py OUT_DIR MODE[,MODE...], MODE one of 'none',
'one' and 'per_device' (as mirrored_job.py). Writes OUT_DIR/session_MODE.npz
(final weights) and OUT_DIR/session_MODE.json (replicas, swaps with devices,
which ops ran, losses).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import TOWERS, describe_swaps, executed_names  # noqa: E402
from _common import lms_for_mode, mlp_loss, run_mirrored_modes  # noqa: E402
from _common import save_result  # noqa: E402

STEPS = 3


def _step_fn(x_all, y_all):
    # Each replica trains on its own half of the batch.
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    x = tf.gather(tf.reshape(x_all, [2, 8, 16]), replica)
    y = tf.gather(tf.reshape(y_all, [2, 8]), replica)
    loss = mlp_loss(x, y)
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.control_dependencies([train]):
        return tf.identity(loss)


def train(out, mode):
    strategy = tf.distribute.MirroredStrategy(list(TOWERS))
    rng = np.random.RandomState(0)
    x = rng.randn(64, 16).astype(np.float32)
    y = rng.randint(0, 3, 64).astype(np.int32)
    graph = tf.Graph()
    with graph.as_default(), strategy.scope():
        tf.compat.v1.set_random_seed(1)
        with tf.device("/cpu:0"):
            features, labels = tf.constant(x[:16]), tf.constant(y[:16])
        per_replica = strategy.extended.call_for_each_replica(
            _step_fn, args=(features, labels))
        loss = strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica,
                               axis=None)
        variables = [v for v in tf.compat.v1.global_variables()
                     if v.name.startswith(("dense", "logits"))]
        init = tf.compat.v1.global_variables_initializer()
    lms_list = lms_for_mode(mode)
    for lms in lms_list:
        lms.run(graph)
    options = tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    executed = set()
    losses = []
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        for _ in range(STEPS):
            metadata = tf.compat.v1.RunMetadata()
            losses.append(float(sess.run(loss, options=options,
                                         run_metadata=metadata)))
            executed |= executed_names(metadata)
        values = sess.run(variables)
    save_result(out, "session_" + mode, mode,
                {v.name: value for v, value in zip(variables, values)},
                {"replicas": strategy.num_replicas_in_sync,
                 "swaps": describe_swaps(graph, lms_list), "losses": losses,
                 "executed": sorted(executed)})


if __name__ == "__main__":
    run_mirrored_modes(train)
