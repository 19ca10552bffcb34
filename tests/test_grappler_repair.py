"""``grappler_repair`` on a Session graph LMS's rules do not cover: the
plan is tried on a copy of the step, the swaps next to what Grappler
optimizes otherwise are dropped, and the step trains bit for bit as
without LMS, every swap op left seen to run.

Each layer computes ``tanh(m) + m + h``: Grappler's arithmetic optimizer
makes one ``AddN`` of each sum and of its gradient's. With nearly every
tensor swapped, the swap-ins LMS reroutes the sums' operands to make
Grappler group them otherwise (no rule of `fusions.grappler_groups` covers
this Session graph), and with oneDNN off the losses differ in their last
bits; the repaired plan keeps only the swaps Grappler optimizes around
alike.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

if tf.executing_eagerly():
    tf.compat.v1.disable_eager_execution()

import _graphs
from tflms import LMS

pytestmark = pytest.mark.numerics

# Swaps nearly every tensor read a level or more after it is made.
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
STEPS = 4


def _step(width=64, depth=6):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        x = tf.compat.v1.placeholder(tf.float32, [8, width], name="x")
        h = x
        for i in range(depth):
            w = tf.compat.v1.get_variable(
                "w%d" % i, [width, width],
                initializer=tf.compat.v1.initializers.random_normal(
                    0, .1, seed=i))
            m = tf.matmul(h, w)
            h = tf.tanh(m) + m + h
        loss = tf.reduce_mean(h * h, name="loss")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
            loss)
        init = tf.compat.v1.global_variables_initializer()
    feed = {x: np.random.RandomState(0).randn(8, width).astype(np.float32)}
    return graph, dict(loss=loss, train=train, init=init, feed=feed)


def _train(repair=None):
    """``(losses, weights, run_metadata, graph, result)`` of `STEPS` steps:
    without LMS (`repair` None), or with `FIXED` and ``grappler_repair``
    set to `repair` (the Grappler check on either way)."""
    graph, handles = _step()
    result = None
    if repair is not None:
        lms = LMS(**FIXED)
        lms.grappler_check = True
        lms.grappler_repair = repair
        result = lms.run(graph, fetches=[handles["train"], handles["loss"]])
        assert result.rewritten
    with graph.as_default():
        variables = tf.compat.v1.global_variables()
    run_metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(handles["init"])
        losses = [sess.run([handles["loss"], handles["train"]],
                           handles["feed"], options=_graphs.trace_options(),
                           run_metadata=run_metadata)[0]
                  for _ in range(STEPS)]
        weights = sess.run(variables)
    return losses, weights, run_metadata, graph, result


def test_the_repaired_plan_trains_bit_for_bit():
    base_losses, base_weights, _, _, _ = _train()
    plain = _train(repair=False)
    repaired = _train(repair=True)
    plain_result, result = plain[4], repaired[4]
    assert not plain_result.grappler.same
    assert result.grappler.same, "\n".join(result.grappler.lines())
    assert 0 < len(result.swapout_ops) < len(plain_result.swapout_ops)
    _graphs.assert_swaps_ran(repaired[3], result, repaired[2])
    assert repaired[0] == base_losses
    for a, b in zip(base_weights, repaired[1]):
        np.testing.assert_array_equal(a, b)
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0":
        # What the repair takes away: the plan as made rounds otherwise.
        assert plain[0] != base_losses
