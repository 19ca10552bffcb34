"""One worker of a 2-worker MultiWorkerMirroredStrategy custom loop (TF2,
eager): the user's `tf.function` calls ``strategy.run`` and reduces the
loss, and ``LMS.function`` rewrites it.

Started twice by tests/test_distributed.py with TF_CONFIG naming two
workers on 127.0.0.1 (CPU collectives). Each worker is a CPU-only machine:
the strategy places its replica on ``/job:worker/replica:0/task:N/device:
CPU:0``, which LMS manages as it manages unplaced ops on a machine without
a GPU; no logical devices, no redefinition of `tflms.devices`. Each worker
reads its own data (``distribute_datasets_from_function``), so equal
weights on both show the gradient all-reduce ran.

Usage: mwms_function_job.py OUT_DIR MODE[,MODE...], MODE 'none' (no LMS),
'lms' (fixed parameters), 'tuned' (auto-tuned for a budget the step does
not fit in), 'lms_ahead3_on_worker1' (worker 1 with another
swapin_ahead: the workers must stop with an error) or 'keras3_fit' (Keras
3's own fit without LMS, TensorFlow 2.16+: the error it raises). The modes run
one after the other with one strategy. Needs ``TF_DUMP_GRAPH_PREFIX`` (this
worker's own folder: the partition graphs it ran). Writes
OUT_DIR/MODE.worker<i>.npz (final weights) and .json (losses, swap ops added,
the swap ops found in the partition graphs with their devices, the worker's
devices).
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

from _common import FIXED, save_result  # noqa: E402
from tflms import LMS  # noqa: E402
from tflms.tf import swaps_ran  # noqa: E402

GLOBAL_BATCH = 8
STEPS = 3
TUNED_GIB = 80e3 / 2**30  # 80 kB


def make_weights(strategy):
    """A tiny CNN's variables (two 3x3 convolutions, a dense layer), the
    same on every worker (seeded)."""
    init = tf.keras.initializers.GlorotUniform
    with strategy.scope():
        weights = [tf.Variable(init(seed=1)((3, 3, 3, 8)), name="conv1"),
                   tf.Variable(init(seed=2)((3, 3, 8, 8)), name="conv2"),
                   tf.Variable(init(seed=3)((8 * 8 * 8, 10)), name="dense"),
                   tf.Variable(tf.zeros([10]), name="bias")]
    return weights


def make_step(strategy, weights):
    """The custom loop's `tf.function`: SGD on the CNN's cross-entropy
    over the global batch, the gradients all-reduced by the strategy."""
    def step_fn(x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.nn.conv2d(x, weights[0], 1, "SAME"))
            h = tf.nn.relu(tf.nn.conv2d(h, weights[1], 1, "SAME"))
            logits = tf.matmul(tf.reshape(h, [-1, 8 * 8 * 8]),
                               weights[2]) + weights[3]
            loss = tf.reduce_sum(
                tf.nn.sparse_softmax_cross_entropy_with_logits(
                    y, logits)) / GLOBAL_BATCH
        # Summed over every replica of every worker: the loss is already
        # divided by the global batch.
        grads = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tape.gradient(loss, weights))
        for w, g in zip(weights, grads):
            w.assign_sub(0.1 * g)
        return loss

    @tf.function
    def train_step(x, y):
        per_replica = strategy.run(step_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                               axis=None)
    return train_step


def make_data(strategy):
    """Each worker's own batches (seeded by its input pipeline)."""
    def dataset_fn(context):
        rng = np.random.RandomState(10 + context.input_pipeline_id)
        batch = context.get_per_replica_batch_size(GLOBAL_BATCH)
        x = rng.randn(batch * STEPS, 8, 8, 3).astype(np.float32)
        y = rng.randint(0, 10, batch * STEPS).astype(np.int32)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    return strategy.distribute_datasets_from_function(dataset_fn)


def settings_for(mode, worker):
    if mode == "none":
        return None
    if mode == "lms":
        return dict(FIXED)
    if mode == "tuned":
        # Auto-tuned for a device budget the step does not fit in.
        return dict(autotune_gpu_mem=TUNED_GIB)
    if mode == "lms_ahead3_on_worker1":
        return dict(FIXED, swapin_ahead=3 if worker == 1 else 1)
    raise ValueError("MODE must be 'none', 'lms', 'tuned' or "
                     "'lms_ahead3_on_worker1'; got %r" % (mode,))


def train(strategy, out, mode, worker):
    weights = make_weights(strategy)
    train_step = make_step(strategy, weights)
    params = settings_for(mode, worker)
    lms = None
    if params is not None:
        gib = params.pop("autotune_gpu_mem", None)
        lms = LMS(**params)
        if gib is not None:
            lms.autotune_gpu_mem = gib
    step = lms.function(train_step) if lms else train_step
    losses = []
    batch = None
    for batch in make_data(strategy):
        losses.append(float(step(*batch)))
    record = {"replicas": strategy.num_replicas_in_sync, "losses": losses,
              "worker_devices": list(strategy.extended.worker_devices),
              "swapout_ops": [], "swapin_ops": [], "executed": {}}
    if lms:
        record["swapout_ops"] = list(lms.last_run.swapout_ops)
        record["swapin_ops"] = list(lms.last_run.swapin_ops)
        # Where the rewrite placed them (the partition graphs show where
        # they ran).
        graph = step.get_concrete_function(*batch).graph
        record["swap_devices"] = sorted({
            graph.get_operation_by_name(name).device
            for name in record["swapout_ops"] + record["swapin_ops"]})
        record["executed"] = swaps_ran.swap_ops_in_partition_graphs(
            swaps_ran.partition_graph_files(
                os.environ["TF_DUMP_GRAPH_PREFIX"]),
            record["swapout_ops"] + record["swapin_ops"])
    save_result(out, "%s.worker%d" % (mode, worker), mode,
                {v.name.split(":")[0]: v.numpy() for v in weights}, record)


def keras3_fit(strategy, out, worker):
    """What Keras 3's own fit does under this strategy, without LMS: the
    error it raises, or None (docs/distributed.md says it cannot train)."""
    import keras
    rng = np.random.RandomState(10 + worker)
    x = rng.randn(GLOBAL_BATCH * STEPS, 8, 8, 3).astype(np.float32)
    y = rng.randint(0, 10, GLOBAL_BATCH * STEPS).astype(np.int32)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((8, 8, 3)), keras.layers.Conv2D(8, 3),
            keras.layers.Flatten(), keras.layers.Dense(10)])
        model.compile(optimizer="sgd", jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(
                          from_logits=True))
    error = None
    try:
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    except Exception as e:
        error = "%s: %s" % (type(e).__name__, str(e).splitlines()[0])
    save_result(out, "keras3_fit.worker%d" % worker, "keras3_fit", {},
                {"keras": keras.__version__, "fit_error": error})


def main():
    out, modes = sys.argv[1], sys.argv[2].split(",")
    faulthandler.dump_traceback_later(200, exit=True)
    worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.
            CommunicationImplementation.RING))
    for mode in modes:
        if mode == "keras3_fit":
            keras3_fit(strategy, out, worker)
        else:
            train(strategy, out, mode, worker)


if __name__ == "__main__":
    main()
