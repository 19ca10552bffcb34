"""Small deterministic graphs for the core tests (explicit seeds, explicit
graphs, no global state)."""

import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

# The same checks `tflms verify` makes for users.
from tflms.tf.verify import (executed_nodes, kernel_counts,  # noqa: F401
                             unexecuted_nodes)
from zoo import models as zoo_models


def zoo_model(name, seed=3, **sizes):
    """The model zoo's `name` (`zoo.models.BUILDERS`) built with `seed` and
    `sizes` in a graph of its own; returns the builder's model."""
    graph = tf.Graph()
    with graph.as_default():
        return zoo_models.BUILDERS[name](seed=seed, **sizes)


# Saves a small Keras 2 model compiled, in eager mode, with a TF2 optimizer
# (Keras 2.11+ `keras.optimizers.SGD`, ...), which cannot build a graph-mode
# train function: what users hand to `keras_models.load_model` and `tflms
# plan`. In a subprocess because this test process has eager mode off.
_SAVE_TF2_SCRIPT = """
import sys
import tensorflow as tf
from tflms.tf import compat
keras = compat.keras2()
keras.utils.set_random_seed(5)
model = keras.Sequential([
    keras.Input((12, 12, 3)),
    keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
    keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(3)])
optimizer = {
    "sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.002, beta_1=0.8),
    "adamw": lambda: keras.optimizers.AdamW(0.001, weight_decay=0.01),
}[sys.argv[1]]()
model.compile(optimizer, "mse", metrics=["mae"])
assert tf.executing_eagerly()
assert not hasattr(model.optimizer, "get_updates"), type(model.optimizer)
model.save(sys.argv[2])
print("KERNEL0:", repr(model.weights[0].numpy().ravel().tolist()))
"""


def save_tf2_keras_model(optimizer, path):
    """Saves the model above, compiled with `optimizer` ("sgd": SGD with
    momentum 0.9, Nesterov, rate 0.05; "adam": Adam, rate 0.002, beta_1 0.8;
    "adamw": AdamW, which has no legacy twin), to `path` (the suffix picks
    the format). Input 12x12x3, 3 outputs, "mse" loss and an "mae" metric.

    Returns:
      (path as str, the first kernel's saved values, flattened).
    """
    out = subprocess.run([sys.executable, "-c", _SAVE_TF2_SCRIPT, optimizer,
                          str(path)], capture_output=True, text=True,
                         timeout=300, check=False,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert out.returncode == 0, out.stderr[-3000:]
    kernel = out.stdout.split("KERNEL0:")[1].strip().splitlines()[0]
    return str(path), np.array(eval(kernel))


def dense_net(depth=6, width=64, classes=10, batch=None, optimizer="sgd",
              seed=0, device=None):
    """An MLP training graph in a new tf.Graph.

    Returns:
      (graph, handles) where handles has x, y, loss, train, init, feed.
    """
    g = tf.Graph()
    with g.as_default(), tf.device(device):
        x = tf.compat.v1.placeholder(tf.float32, [batch, 32], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [batch, classes], name="y")
        h = x
        for i in range(depth):
            h = tf.compat.v1.layers.dense(
                h, width, activation=tf.nn.relu, name="dense%d" % i,
                kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
                    seed=seed * 100 + i))
        logits = tf.compat.v1.layers.dense(
            h, classes, name="logits",
            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
                seed=seed * 100 + 99))
        loss = tf.reduce_mean(
            tf.compat.v1.nn.softmax_cross_entropy_with_logits_v2(
                labels=y, logits=logits), name="loss")
        if optimizer == "sgd":
            opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        else:
            opt = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)
        train = opt.minimize(loss, name="train")
        init = tf.compat.v1.global_variables_initializer()
    rng = np.random.RandomState(seed)
    n = batch or 16
    feed = {x: rng.randn(n, 32).astype(np.float32),
            y: np.eye(classes, dtype=np.float32)[rng.randint(0, classes, n)]}
    return g, dict(x=x, y=y, loss=loss, train=train, init=init, feed=feed)


def train_steps(graph, handles, steps=3, trace=True):
    """Run `steps` training steps; returns (losses, weights, executed names).

    The executed names come from the FULL_TRACE step stats of the last step.
    """
    with graph.as_default():
        variables = tf.compat.v1.global_variables()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(handles["init"])
        losses = []
        md = tf.compat.v1.RunMetadata()
        opts = tf.compat.v1.RunOptions(
            trace_level=tf.compat.v1.RunOptions.FULL_TRACE) if trace else None
        for _ in range(steps):
            loss, _ = sess.run([handles["loss"], handles["train"]],
                               handles["feed"], options=opts, run_metadata=md)
            losses.append(loss)
        weights = {v.op.name: w for v, w in zip(variables,
                                                 sess.run(variables))}
    return losses, weights, executed_nodes(md)


def trace_options():
    """RunOptions for a traced step that also returns the partition graphs."""
    return tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
        output_partition_graphs=True)


def assert_swaps_ran(graph, result, run_metadata):
    """The swap ops did their job in a traced step.

    Grappler may legitimately drop a swap op together with what it copies:
    common-subexpression elimination merges twin ops (the three identical
    input reshapes of q/k/v projections, and then their swap-outs), and
    constant folding removes a consumer (a product with a constant zero)
    and then its swap-in. So every swap op added must either have run in
    the traced step, or be missing from the optimized (partition) graphs
    together with its input op or with all of its readers, or have a twin
    swap op that is there (same computation from the same inputs); any
    other missing swap op is named. A rerouted consumer must never read the
    original tensor.
    """
    nodes = {n.name: n for pg in run_metadata.partition_graphs
             for n in pg.node}
    executed = executed_nodes(run_metadata)
    added = list(result.swapout_ops) + list(result.swapin_ops)
    kept = [name for name in added if name in nodes]
    missing = [name for name in kept if name not in executed]
    assert not missing, "swap ops kept but not executed: %s" % missing[:5]
    unexplained = []
    for name in added:
        if name in nodes:
            continue
        op = graph.get_operation_by_name(name)
        source_gone = op.inputs[0].op.name not in nodes
        readers = op.outputs[0].consumers()
        readers_gone = bool(readers) and all(r.name not in nodes
                                             for r in readers)
        twin = any(other != name and other in nodes
                   and _signature(graph.get_operation_by_name(other))
                   == _signature(op) for other in added)
        if not (source_gone or readers_gone or twin):
            unexplained.append(name)
    assert not unexplained, (
        "Grappler removed %d swap ops whose input and readers are still "
        "there: %s" % (len(unexplained), unexplained[:5]))
    for name in result.swapin_ops:
        swapin = graph.get_operation_by_name(name)
        source = swapin.inputs[0].op.inputs[0]  # swap-in <- swap-out <- source
        source_name = (source.op.name if source.value_index == 0
                       else source.name)
        for consumer in swapin.outputs[0].consumers():
            node = nodes.get(consumer.name)
            if node is None:
                continue
            reads = [i for i in node.input if not i.startswith("^")]
            assert source_name not in reads, (
                "%s reads %s directly instead of through %s" % (
                    consumer.name, source_name, name))


def _signature(op, depth=6):
    """What `op` computes, up to `depth` ops back: type, attributes and
    inputs, with constants by value (Grappler's common-subexpression
    elimination merges ops with equal signatures)."""
    if op.type == "Const":
        return ("Const", op.get_attr("value").SerializeToString())
    if depth == 0 or op.type in ("Placeholder", "VarHandleOp"):
        return ("op", op.name)
    attrs = tuple(sorted((k, v.SerializeToString())
                         for k, v in op.node_def.attr.items()
                         if not k.startswith("_")))
    return (op.type, attrs,
            tuple((_signature(t.op, depth - 1), t.value_index)
                  for t in op.inputs))


# Relative tolerance when TensorFlow runs different kernels with and without
# LMS: float32 rounding of a fused against an unfused kernel, grown over
# three steps of training. See tests/test_equivalence.py.
FUSION_RTOL = 1e-4


def assert_same_training(graph, result, base, run, always_tolerant=False):
    """Training with LMS matched training without it.

    Args:
      graph: the rewritten graph.
      result: what `LMS.run` returned for it.
      base / run: ``(losses, weights, run_metadata)`` of the same number of
        traced steps without and with LMS, from the same seed.
      always_tolerant: allow float rounding even when the kernels are the
        same (a model where Grappler's arithmetic optimizer folds
        differently around a swap op).

    Every node that ran without LMS must run with it, the swap ops must
    have run (`assert_swaps_ran`), and losses and weights must be equal:
    exactly when the optimized graphs run the same kernels, within
    `FUSION_RTOL` when a swap op changed what TensorFlow fused.
    """
    base_losses, base_weights, base_md = base
    losses, weights, run_metadata = run
    unrun = unexecuted_nodes(run_metadata) - unexecuted_nodes(base_md)
    assert not unrun, "ops that ran without LMS did not run with it: %s" % (
        sorted(unrun)[:8])
    assert_swaps_ran(graph, result, run_metadata)
    assert len(weights) == len(base_weights)
    if not always_tolerant and (
            kernel_counts(run_metadata) == kernel_counts(base_md)):
        assert losses == base_losses
        for a, b in zip(base_weights, weights):
            np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(losses, base_losses, rtol=FUSION_RTOL)
        for a, b in zip(base_weights, weights):
            np.testing.assert_allclose(a, b, rtol=FUSION_RTOL, atol=1e-6)


def tune(index, roles, requested, gpu_mem_gib=None, env=None, log=None,
         list_devices=None, plot_dir=None, select=True, by_step_time=True,
         serialization_edges=(), deferral_edges=(), ordering_edges=(),
         gpu=None, interconnect=None, **settings):
    """`autotune.tune` as its tests used to call it: the `PlanningContext`
    made from `requested` (`planner.SwapParams`, -1 for auto), the budget
    and the other `Settings` given as keywords (`batch_size`, `gpu`,
    `interconnect`...); `serialization_edges` are control edges only the
    simulator sees; `gpu` and `interconnect` may be names or hardware
    objects of the test's own."""
    from tflms import autotune
    from tflms.context import Budgets, Judging, PlanningContext
    from tflms.settings import Settings
    settings = Settings(
        swapout_threshold=requested.swapout_threshold,
        swapin_ahead=requested.swapin_ahead,
        swapin_groupby=requested.swapin_groupby,
        sync_mode=int(requested.sync_mode), autotune_gpu_mem=gpu_mem_gib,
        autotune_plot=plot_dir is not None,
        plot_dir=plot_dir if plot_dir is not None else ".lms", **settings)
    context = PlanningContext.create(
        index, settings, roles=roles, log=log,
        budgets=Budgets.read(settings, env, list_devices),
        judging=Judging(by_step_time=by_step_time, select=select,
                        extra_edges=serialization_edges, gpu=gpu,
                        interconnect=interconnect))
    return autotune.tune(context, index, deferral_edges=deferral_edges,
                         ordering_edges=ordering_edges)


def tiny_step():
    """A dense layer trained with a v1 optimizer, and an evaluation head
    beside the train op. Returns (graph, train_op, loss)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 16], name="x")
        w = tf.compat.v1.get_variable("w", [16, 16])
        h = tf.nn.relu(tf.matmul(x, w))
        loss = tf.reduce_sum(h)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(
            0.1).minimize(loss)
        tf.identity(h, name="eval_head")
    return graph, train_op, loss


def v1_cnn():
    """A tf.compat.v1 training graph: images of an unknown batch, three
    convolutions, a dense layer, cross-entropy and SGD."""
    v1 = tf.compat.v1
    x = v1.placeholder(tf.float32, [None, 16, 16, 3], name="x")
    y = v1.placeholder(tf.int32, [None], name="y")
    h = x
    for k in range(3):
        h = tf.nn.relu(v1.layers.conv2d(
            h, 16, 3, padding="same", name="conv%d" % k,
            kernel_initializer=v1.glorot_uniform_initializer(seed=k)))
    logits = v1.layers.dense(tf.reduce_mean(h, axis=[1, 2]), 10,
                             name="dense")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=logits))
    train_op = v1.train.GradientDescentOptimizer(0.01).minimize(loss)
    v1.add_to_collection(v1.GraphKeys.TRAIN_OP, train_op)
    return train_op


def rewritten_mlp(**params):
    """A five-layer MLP training graph rewritten by ``LMS(**params)``:
    ``(graph, RunResult)``. The same settings give the same rewrite, which
    the multi-process checks compare."""
    from tflms import LMS
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        h = x
        for i in range(5):
            h = tf.compat.v1.layers.dense(h, 8, activation=tf.nn.relu,
                                          name="d%d" % i)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(h))
    lms = LMS(**params)
    lms.run(graph)
    return graph, lms.last_run
