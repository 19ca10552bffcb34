"""LMS on every worker of a MultiWorkerMirroredStrategy, two workers on this
machine, one command:

    python examples/multiworker_lms.py

The script starts two worker processes of itself, each with a ``TF_CONFIG``
naming both on 127.0.0.1 (two free ports) and CPU collectives. Each worker
builds the same Keras model in ``strategy.scope()`` and trains it with a
custom loop: a ``tf.function`` that calls ``strategy.run`` on the step
(forward, ``GradientTape``, the optimizer's update, which all-reduces the
gradients) and reduces the loss. It trains once without LMS and once with
the same ``tf.function`` given to ``LMS(...).function``, from the same
seed, each worker on its own data. The script then prints, per worker, the
losses of both runs, how many tensors LMS swapped, and whether every swap
operation ran on that worker's own host CPU (the partition graphs
TensorFlow ran, dumped with ``TF_DUMP_GRAPH_PREFIX``), and ends with
``VERDICT: PASS`` when the losses with and without LMS are the same on
every worker, the workers agree, and every swap operation ran; otherwise
``VERDICT: FAIL - ...`` and exit status 1.

Why a custom loop and not ``model.fit``: Keras 3's ``fit`` cannot train
under ``MultiWorkerMirroredStrategy`` on TensorFlow 2.16+ even without LMS
(docs/distributed.md, "Several workers").

On a real cluster run the worker part on each machine with that machine's
``TF_CONFIG`` (``--worker-out DIR``), or copy ``train`` into your program.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile

from tflms._argparse_types import positive_int
from tflms.settings import Settings  # no TensorFlow: the launcher needs none

SCRIPT = os.path.abspath(__file__)
WORKERS = 2


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Train a small Keras CNN on two "
        "MultiWorkerMirroredStrategy workers of this machine, without and "
        "with LMS, and compare.")
    parser.add_argument("--steps", type=positive_int, default=3,
                        help="training steps per run (default 3)")
    parser.add_argument("--batch-size", type=positive_int, default=8,
                        help="global batch size, split over the workers "
                        "(default 8)")
    parser.add_argument("--image-size", type=positive_int, default=16,
                        help="height and width of the synthetic images "
                        "(default 16)")
    parser.add_argument("--swapout-threshold", type=int, default=1)
    parser.add_argument("--swapin-ahead", type=int, default=1)
    parser.add_argument("--swapin-groupby", type=int, default=0)
    parser.add_argument("--timeout", type=positive_int, default=300,
                        help="seconds the workers may take (default 300)")
    parser.add_argument("--worker-out", metavar="DIR",
                        help="run as one worker (TF_CONFIG must be set) and "
                        "write its results into DIR")
    return parser.parse_args(argv)


# ---- one worker ---------------------------------------------------------
def train(args, strategy, lms=None):
    """Trains the model for `args.steps` steps; the losses, the final
    weights and, with `lms`, the swap ops it added."""
    import numpy as np
    import tensorflow as tf
    import keras

    size = args.image_size
    with strategy.scope():
        keras.utils.set_random_seed(7)
        model = keras.Sequential([
            keras.Input((size, size, 3)),
            keras.layers.Conv2D(8, 3, padding="same"),
            keras.layers.ReLU(),
            keras.layers.Conv2D(8, 3, padding="same"),
            keras.layers.ReLU(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10)])
        optimizer = keras.optimizers.SGD(0.1)
    per_example = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none")

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(
                per_example(y, model(x, training=True)),
                global_batch_size=args.batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(x, y):
        per_replica = strategy.run(step_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                               axis=None)

    def dataset_fn(context):
        # Each worker's own images: equal results on both show that the
        # gradients were all-reduced.
        rng = np.random.RandomState(100 + context.input_pipeline_id)
        batch = context.get_per_replica_batch_size(args.batch_size)
        x = rng.randn(batch * args.steps, size, size, 3).astype(np.float32)
        y = rng.randint(0, 10, batch * args.steps).astype(np.int32)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)

    step = lms.function(train_step) if lms is not None else train_step
    losses = [float(step(x, y)) for x, y in
              strategy.distribute_datasets_from_function(dataset_fn)]
    swap_ops = []
    if lms is not None:
        swap_ops = list(lms.last_run.swapout_ops) + list(
            lms.last_run.swapin_ops)
    weights = float(sum(np.abs(v.numpy()).sum() for v in model.weights))
    return losses, weights, swap_ops


def run_worker(args):
    """One worker: trains without and with LMS under one strategy and
    writes what it saw to ``<worker-out>/worker<i>.json``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tflms import LMS
    from tflms.tf import swaps_ran

    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.
            CommunicationImplementation.RING))
    base_losses, base_weights, _ = train(args, strategy)
    lms = LMS(swapout_threshold=args.swapout_threshold,
              swapin_ahead=args.swapin_ahead,
              swapin_groupby=args.swapin_groupby)
    losses, weights, swap_ops = train(args, strategy, lms)
    dump = os.environ.get("TF_DUMP_GRAPH_PREFIX")
    ran = swaps_ran.swap_ops_in_partition_graphs(
        swaps_ran.partition_graph_files(dump), swap_ops) if dump else {}
    result = {"worker": index,
              "replica_devices": list(strategy.extended.worker_devices),
              "losses_without_lms": base_losses, "losses_with_lms": losses,
              "weights_without_lms": base_weights,
              "weights_with_lms": weights, "swap_ops": swap_ops,
              "ran": {name: ran[name] for name in swap_ops if name in ran}}
    with open(os.path.join(args.worker_out, "worker%d.json" % index), "w",
              encoding="utf-8") as f:
        json.dump(result, f)


# ---- the launcher ---------------------------------------------------------
def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def launch(args, out):
    """Starts the workers and waits for them; [(exit status, output)]."""
    cluster = {"worker": ["127.0.0.1:%d" % p for p in free_ports(WORKERS)]}
    procs = []
    for i in range(WORKERS):
        dump = os.path.join(out, "graphs%d" % i)
        os.makedirs(dump)
        env = dict(os.environ, TF_CONFIG=json.dumps({
            "cluster": cluster, "task": {"type": "worker", "index": i}}),
            TF_DUMP_GRAPH_PREFIX=dump, TF_DUMP_GRAPH_NAME_FILTER="_tflms_")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        worker_args = [
            "--worker-out", out, "--steps", str(args.steps),
            "--batch-size", str(args.batch_size),
            "--image-size", str(args.image_size),
            "--swapout-threshold", str(args.swapout_threshold),
            "--swapin-ahead", str(args.swapin_ahead),
            "--swapin-groupby", str(args.swapin_groupby)]
        procs.append(subprocess.Popen(
            [sys.executable, SCRIPT] + worker_args, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True))
    finished = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            output += "\n(killed after %d s)" % args.timeout
        finished.append((proc.returncode, output))
    return finished


def verdict(results):
    """``(line, ok)`` for the workers' results (a list of their JSON
    records, by worker)."""
    for r in results:
        host = r["replica_devices"][0].rsplit("/device:", 1)[0] + \
            "/device:CPU:0"
        if r["losses_with_lms"] != r["losses_without_lms"]:
            return ("VERDICT: FAIL - worker %d's losses differ with LMS: "
                    "%s, without: %s" % (r["worker"], r["losses_with_lms"],
                                         r["losses_without_lms"]), False)
        if not r["swap_ops"]:
            return ("VERDICT: FAIL - LMS swapped nothing on worker %d"
                    % r["worker"], False)
        missing = sorted(set(r["swap_ops"]) - set(r["ran"]))
        if missing:
            return ("VERDICT: FAIL - %d swap operations of worker %d did not "
                    "run, e.g. %s" % (len(missing), r["worker"], missing[0]),
                    False)
        elsewhere = sorted(n for n, d in r["ran"].items() if d != host)
        if elsewhere:
            return ("VERDICT: FAIL - worker %d ran %s on %s, not on its host "
                    "%s" % (r["worker"], elsewhere[0], r["ran"][elsewhere[0]],
                            host), False)
    if len({tuple(r["losses_with_lms"]) for r in results}) != 1 or len(
            {r["weights_with_lms"] for r in results}) != 1:
        return ("VERDICT: FAIL - the workers ended with different losses or "
                "weights", False)
    return ("VERDICT: PASS - on each of the %d workers the losses with LMS "
            "equal those without, and every swap operation ran on the "
            "worker's own host CPU" % len(results), True)


def main(argv=None):
    args = parse_args(argv)
    try:
        # The settings' own checks, before any worker starts.
        Settings(swapout_threshold=args.swapout_threshold,
                 swapin_ahead=args.swapin_ahead,
                 swapin_groupby=args.swapin_groupby)
    except ValueError as e:
        print("error: %s" % e, file=sys.stderr)
        return 2
    if args.worker_out:
        run_worker(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="tflms_multiworker_") as out:
        finished = launch(args, out)
        for i, (code, output) in enumerate(finished):
            if code != 0:
                print(output[-3000:])
                print("VERDICT: FAIL - worker %d exited with status %s"
                      % (i, code))
                return 1
        for _, output in finished:
            for line in output.splitlines():
                if "[LMS]" in line:
                    print(line[line.index("["):])
        results = []
        for i in range(WORKERS):
            with open(os.path.join(out, "worker%d.json" % i),
                      encoding="utf-8") as f:
                results.append(json.load(f))
    for r in results:
        print("worker %d (%s): %d swap operations, all ran: %s"
              % (r["worker"], r["replica_devices"][0], len(r["swap_ops"]),
                 sorted(set(r["ran"].values())) or "none"))
        print("  losses without LMS: %s" % ", ".join(
            "%.6f" % v for v in r["losses_without_lms"]))
        print("  losses with LMS:    %s" % ", ".join(
            "%.6f" % v for v in r["losses_with_lms"]))
    line, ok = verdict(results)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
