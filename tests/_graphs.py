"""Small deterministic graphs for the core tests (explicit seeds, explicit
graphs, no global state)."""

import numpy as np
import tensorflow as tf


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

    Grappler may merge twin swap ops (common subexpressions, e.g. the three
    identical input reshapes of q/k/v projections) or drop a swap-in whose
    consumer it folded away (a product with a constant zero). What it must
    never do is feed a rerouted consumer the original tensor. So: every swap
    op still present in the optimized (partition) graphs was executed, every
    rerouted consumer still present reads no original tensor, and most planned swap
    ops ran.
    """
    nodes = {n.name: n for pg in run_metadata.partition_graphs
             for n in pg.node}
    executed = {n.node_name for d in run_metadata.step_stats.dev_stats
                for n in d.node_stats}
    added = list(result.swapout_ops) + list(result.swapin_ops)
    kept = [name for name in added if name in nodes]
    missing = [name for name in kept if name not in executed]
    assert not missing, "swap ops kept but not executed: %s" % missing[:5]
    assert len(kept) >= 0.75 * len(added), (
        "Grappler removed %d of %d swap ops" % (len(added) - len(kept),
                                               len(added)))
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
