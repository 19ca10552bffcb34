"""One rank of a small Horovod data-parallel job, with and without LMS.

Started by tests/test_distributed.py through ``horovodrun -np 2 -H
localhost:2 --gloo``. For each variant in --variants ('none' = without LMS,
or 'T,A,G[,S]' = LMS with swapout_threshold T, swapin_ahead A,
swapin_groupby G, sync_mode S) it trains the same model for a few steps
with ``hvd.DistributedOptimizer`` through the API given by --api (session,
keras or estimator) and writes, per rank and variant:

* ``<out>/<variant>.rank<r>.npz``: the final trainable weights by name;
* ``<out>/<variant>.rank<r>.json``: the swap ops LMS added, the swap ops
  executed in traced steps (RunMetadata step stats), and the rewrite's
  fingerprint.

Every rank starts from different random weights and reads different data,
so equal final weights show that the broadcast and the gradient averaging
both happened. --rank1-ahead gives rank 1 another swapin_ahead, to show
that `check_same_rewrite` stops a job whose ranks rewrote differently.
--rank0-prerewritten (Session API) hands rank 0 a graph that already has
LMS's swap ops, so its `LMS.run` takes another path than rank 1's, and
leaves out the job's own check: only the check inside `LMS.run` stands
between this job and a hang.
A watchdog ends the process if it runs longer than --watchdog seconds.
"""

import argparse
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
from tflms.tf import distributed  # noqa: E402

from _common import TraceHook, collective_contacts  # noqa: E402
from _common import executed_names  # noqa: E402

DEPTH, WIDTH, FEATURES, CLASSES, BATCH, STEPS = 6, 32, 16, 4, 8, 3


def parse_variant(text):
    if text == "none":
        return None
    values = [int(v) for v in text.split(",")]
    keys = ("swapout_threshold", "swapin_ahead", "swapin_groupby",
            "sync_mode")
    return dict(zip(keys, values))


def rank_data(rank):
    rng = np.random.RandomState(100 + rank)
    x = rng.randn(BATCH * STEPS, FEATURES).astype(np.float32)
    y = rng.randint(0, CLASSES, BATCH * STEPS).astype(np.int32)
    return x, y


def mlp(x, seed):
    h = x
    for i in range(DEPTH):
        h = tf.compat.v1.layers.dense(
            h, WIDTH, activation=tf.nn.relu, name="dense%d" % i,
            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
                seed=seed * 100 + i))
    return tf.compat.v1.layers.dense(
        h, CLASSES, name="logits",
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
            seed=seed * 100 + 99))


def make_lms(params, rank, args):
    if params is None:
        return None
    params = dict(params)
    if args.rank1_ahead is not None and rank == 1:
        params["swapin_ahead"] = args.rank1_ahead
    return LMS(**params)


def check(lms, graph):
    result = lms.last_run if lms is not None else None
    return distributed.check_same_rewrite(graph, result)


def prerewrite(graph, params):
    """Gives `graph` LMS's swap ops the way a graph restored from a meta
    graph exported after LMS has them: without an `LMS.run` on this rank,
    hence without its rank check (which the other rank would not match)."""
    check_ranks_agree = distributed.check_ranks_agree
    distributed.check_ranks_agree = lambda *args, **kwargs: None
    try:
        LMS(**params).run(graph)
    finally:
        distributed.check_ranks_agree = check_ranks_agree


# ---- Session ------------------------------------------------------------
def run_session(hvd, params, args):
    rank = hvd.rank()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [BATCH, FEATURES], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [BATCH], name="y")
        logits = mlp(x, seed=rank)
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits)
        opt = hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1))
        train = opt.minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
        broadcast = hvd.broadcast_global_variables(0)
        variables = tf.compat.v1.trainable_variables()
    lms = make_lms(params, rank, args)
    if args.rank0_prerewritten and rank == 0:
        prerewrite(graph, params)
    if lms is not None:
        lms.run(graph)
    fingerprint = None if args.rank0_prerewritten else check(lms, graph)
    xs, ys = rank_data(rank)
    executed = set()
    opts = tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        session.run(broadcast)
        for step in range(STEPS):
            md = tf.compat.v1.RunMetadata()
            sl = slice(step * BATCH, (step + 1) * BATCH)
            session.run(train, {x: xs[sl], y: ys[sl]}, options=opts,
                        run_metadata=md)
            executed |= executed_names(md)
        weights = dict(zip([v.op.name for v in variables],
                           session.run(variables)))
    return weights, lms, executed, fingerprint, graph


# ---- Keras --------------------------------------------------------------
def run_keras(hvd, params, args):
    import horovod.tensorflow.keras as hvd_keras
    rank = hvd.rank()
    tf.keras.backend.clear_session()
    md = tf.compat.v1.RunMetadata()
    layers = [tf.keras.layers.Dense(
        WIDTH, activation="relu", name="dense%d" % i,
        kernel_initializer=tf.keras.initializers.GlorotUniform(
            seed=rank * 100 + i)) for i in range(DEPTH)]
    layers.append(tf.keras.layers.Dense(
        CLASSES, name="logits",
        kernel_initializer=tf.keras.initializers.GlorotUniform(
            seed=rank * 100 + 99)))
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,))] + layers)
    opt = hvd_keras.DistributedOptimizer(
        tf.keras.optimizers.legacy.SGD(0.1))
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), options=tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
        run_metadata=md)
    lms = make_lms(params, rank, args)
    # Listed first on purpose: the broadcast (and the rewrite check) must
    # work whatever the order of the callbacks.
    callbacks = [distributed.BroadcastGlobalVariablesCallback(0, lms=lms)]
    callbacks += [lms] if lms is not None else []
    xs, ys = rank_data(rank)
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=callbacks)
    fingerprint = check(lms, tf.compat.v1.get_default_graph())
    names = [w.name.split(":")[0] for w in model.weights]
    weights = dict(zip(names, model.get_weights()))
    return (weights, lms, executed_names(md), fingerprint,
            tf.compat.v1.get_default_graph())


# ---- Estimator ----------------------------------------------------------
class _CheckHook(tf.compat.v1.train.SessionRunHook):
    """Runs check_same_rewrite once the hooks before it edited the graph."""

    def __init__(self, lms):
        self.lms = lms
        self.fingerprint = None
        self.graph = None

    def begin(self):
        self.graph = tf.compat.v1.get_default_graph()
        self.fingerprint = check(self.lms, self.graph)


def run_estimator(hvd, params, args):
    rank = hvd.rank()

    def model_fn(features, labels, mode):
        logits = mlp(features["x"], seed=rank)
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels,
                                                                logits)
        opt = hvd.DistributedOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(0.1))
        train = opt.minimize(loss,
                             global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

    def input_fn():
        xs, ys = rank_data(rank)
        return tf.compat.v1.data.Dataset.from_tensor_slices(
            ({"x": xs}, ys)).batch(BATCH, drop_remainder=True)

    lms = make_lms(params, rank, args)
    trace = TraceHook()
    checker = _CheckHook(lms)
    # The broadcast hook first: its ops exist when LMS edits the graph, and
    # LMS must leave them alone.
    hooks = [hvd.BroadcastGlobalVariablesHook(0)]
    hooks += ([lms] if lms is not None else []) + [checker, trace]
    model_dir = os.path.join(args.out, "est_%s_rank%d" % (
        args.current_variant.replace(",", "_"), rank))
    est = tf.compat.v1.estimator.Estimator(
        model_fn, model_dir=model_dir,
        config=tf.compat.v1.estimator.RunConfig(tf_random_seed=rank + 1))
    est.train(input_fn, steps=STEPS, hooks=hooks)
    names = [n for n in est.get_variable_names()
             if n.startswith(("dense", "logits"))]
    weights = {n: est.get_variable_value(n) for n in names}
    return weights, lms, trace.executed, checker.fingerprint, checker.graph


API = {"session": run_session, "keras": run_keras,
       "estimator": run_estimator}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--api", choices=sorted(API), required=True)
    parser.add_argument("--variants", default="none;1,1,0",
                        help="';'-separated: 'none' or 'T,A,G[,S]'")
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank1-ahead", type=int, default=None)
    parser.add_argument("--rank0-prerewritten", action="store_true")
    parser.add_argument("--watchdog", type=float, default=200.0)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.watchdog, exit=True)

    tf.compat.v1.disable_eager_execution()
    import horovod.tensorflow as hvd
    hvd.init()
    rank = hvd.rank()
    os.makedirs(args.out, exist_ok=True)
    for variant in args.variants.split(";"):
        args.current_variant = variant
        params = parse_variant(variant)
        try:
            weights, lms, executed, fingerprint, graph = API[args.api](
                hvd, params, args)
        except distributed.RankMismatchError as e:
            print("RANK_MISMATCH rank %d: %s" % (rank, e), flush=True)
            sys.exit(3)
        result = lms.last_run if lms is not None else None
        collectives, contacts = collective_contacts(graph, result)
        stem = os.path.join(args.out, "%s.rank%d" % (
            variant.replace(",", "_"), rank))
        np.savez(stem + ".npz", **weights)
        with open(stem + ".json", "w", encoding="utf-8") as f:
            json.dump({
                "swapout_ops": list(result.swapout_ops) if result else [],
                "swapin_ops": list(result.swapin_ops) if result else [],
                "executed": sorted(executed),
                "fingerprint": fingerprint,
                "collectives": collectives,
                "collective_contacts": contacts,
                "rank_info": list(distributed.rank_info().__dict__.values()),
            }, f)
        print("rank %d variant %s done" % (rank, variant), flush=True)


if __name__ == "__main__":
    main()
