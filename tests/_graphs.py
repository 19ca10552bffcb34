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
