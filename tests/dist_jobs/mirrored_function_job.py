"""A TF2 custom training loop under MirroredStrategy over two towers, with
LMS on the loop's `tf.function` (`LMS.function`).

Started in a subprocess by tests/test_distributed.py, as mirrored_job.py
is: three logical CPU devices, CPU:1 and CPU:2 holding the two replicas and
standing in for two GPUs, CPU:0 the host the swap ops go to
(``cpu_device="/cpu:0"``, `_common.FIXED`: every other device is managed,
so the step is planned replica by replica as on two GPUs). Eager mode:
the step is the user's `tf.function` that calls `strategy.run` and reduces
the loss, and LMS rewrites that function's graph, where both replicas'
ops are.

Usage: mirrored_function_job.py OUT_DIR MODE[,MODE...], MODE 'none' (no
LMS) or 'one' (one LMS for every tower, fixed parameters). Needs
``TF_DUMP_GRAPH_PREFIX`` (the witness that the swap ops ran: the
partition graphs TensorFlow's executors ran). Writes OUT_DIR/function_MODE
.npz (final weights) and .json (losses; per swap-in, the devices of the
swapped tensor's producer, of the swap ops, of the consumers and
triggers; the swap ops found in the partition graphs).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import FIXED, TOWERS, describe_swaps, save_result  # noqa: E402
from _common import setup_cpu_devices  # noqa: E402
from tflms import LMS  # noqa: E402
from tflms.tf import swaps_ran  # noqa: E402

GLOBAL_BATCH = 8
STEPS = 3


def _without_job(value):
    if isinstance(value, list):
        return [_without_job(v) for v in value]
    return value.replace("/job:localhost", "")


def train(out, mode):
    strategy = tf.distribute.MirroredStrategy(list(TOWERS))
    with strategy.scope():
        init = tf.keras.initializers.GlorotUniform
        weights = []
        for i, (n_in, n_out) in enumerate(((16, 32), (32, 32), (32, 32),
                                           (32, 3))):
            weights.append(tf.Variable(init(seed=i)((n_in, n_out)),
                                       name="kernel%d" % i))
            weights.append(tf.Variable(tf.zeros([n_out]), name="bias%d" % i))
        optimizer = tf.keras.optimizers.SGD(0.1)

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            h = x
            for i in range(0, len(weights), 2):
                h = tf.matmul(h, weights[i]) + weights[i + 1]
                if i + 2 < len(weights):
                    h = tf.nn.relu(h)
            loss = tf.reduce_sum(
                tf.nn.sparse_softmax_cross_entropy_with_logits(y, h)) \
                / GLOBAL_BATCH
        grads = tape.gradient(loss, weights)
        optimizer.apply_gradients(zip(grads, weights))
        return loss

    @tf.function
    def train_step(x, y):
        per_replica = strategy.run(step_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                               axis=None)

    lms = LMS(**FIXED) if mode == "one" else None
    step = lms.function(train_step) if lms else train_step
    rng = np.random.RandomState(0)
    x = rng.randn(GLOBAL_BATCH * STEPS, 16).astype(np.float32)
    y = rng.randint(0, 3, GLOBAL_BATCH * STEPS).astype(np.int32)
    data = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))
    losses, batch = [], None
    for batch in data:
        losses.append(float(step(*batch)))
    record = {"replicas": strategy.num_replicas_in_sync, "losses": losses,
              "swaps": [], "executed": []}
    if lms:
        graph = step.get_concrete_function(*batch).graph
        # Placed in eager mode, the function's ops name their job too;
        # without it the devices read as the Session jobs' do.
        record["swaps"] = [
            {k: _without_job(v) for k, v in swap.items()}
            for swap in describe_swaps(graph, [lms])]
        names = [s[k] for s in record["swaps"] for k in ("swapin", "swapout")]
        record["executed"] = sorted(swaps_ran.swap_ops_in_partition_graphs(
            swaps_ran.partition_graph_files(
                os.environ["TF_DUMP_GRAPH_PREFIX"]), names))
    save_result(out, "function_" + mode, mode,
                {v.name: v.numpy() for v in weights}, record)


if __name__ == "__main__":
    out_dir, modes = sys.argv[1], sys.argv[2].split(",")
    setup_cpu_devices(3, graph_mode=False)
    for job_mode in modes:
        train(out_dir, job_mode)
