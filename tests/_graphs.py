"""Small deterministic graphs for the core tests (explicit seeds, explicit
graphs, no global state)."""

import numpy as np
import tensorflow as tf

# The same checks `tflms verify` makes for users.
from tflms.verify import kernel_counts, unexecuted_nodes  # noqa: F401


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
    executed = {n.node_name for d in md.step_stats.dev_stats
                for n in d.node_stats}
    return losses, weights, executed


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
    executed = {n.node_name for d in run_metadata.step_stats.dev_stats
                for n in d.node_stats}
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
