"""Trains a Session-graph CNN whose ops TensorFlow merges at run time
without LMS, with LMS (`LMS.run`) and with LMS planned without the fusion
rules, and prints what `test_session_fusions.py` checks, as JSON.

Run as a script (``python tests/_session_fusions.py``) in a subprocess:
the test chooses `TF_ENABLE_ONEDNN_OPTS` for it, which TensorFlow reads
once, when it loads.

The model has the merges `fusions.grappler_groups` knows in a CNN: a
convolution with its bias and ReLU (the remapper's ``_FusedConv2D``), an
overlapping max pool whose gradient reads the pool's workspace (oneDNN's
layout pass, while the MaxPoolGrad reads the pool's own output), a chain
of products with a broadcast (the arithmetic optimizer reorders it) and a
sum of three branches (one ``AddN``).
"""

import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tflms import LMS  # noqa: E402
from tflms.target import Target  # noqa: E402
from tflms.tf.adapters import rewrite, session  # noqa: E402

from _graphs import trace_options, unexecuted_nodes  # noqa: E402

BATCH, IMAGE, CHANNELS, STEPS = 4, 12, 8, 3
# Every tensor swapped, each swap-in as early as it can be: the plan that
# reaches into every merge the rules leave alone.
PARAMS = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


def _conv(x, name, channels, seed):
    kernel = tf.compat.v1.get_variable(
        name + "/kernel", [3, 3, int(x.shape[-1]), channels],
        initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed))
    bias = tf.compat.v1.get_variable(
        name + "/bias", [channels],
        initializer=tf.compat.v1.random_normal_initializer(
            stddev=0.1, seed=seed + 1))
    return tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME"), bias)


def build():
    """``(graph, train_op, loss, init, feed)``: the model, seeded."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(7)
        x = tf.compat.v1.placeholder(
            tf.float32, [BATCH, IMAGE, IMAGE, 3], name="x")
        h = tf.nn.relu(_conv(x, "c1", CHANNELS, 1))
        z = _conv(h, "c2", CHANNELS, 3)
        h = tf.nn.relu(z)
        # Overlapping windows: the gradient sums them in the kernel's
        # order.
        h = tf.nn.max_pool2d(h, 3, 2, "SAME")
        scale = tf.compat.v1.get_variable(
            "scale", [CHANNELS],
            initializer=tf.compat.v1.ones_initializer())
        h = (h * scale) * 0.5  # a product chain with a broadcast
        a = tf.nn.relu(_conv(h, "b1", CHANNELS, 5))
        b = tf.nn.relu(_conv(h, "b2", CHANNELS, 7))
        c = tf.nn.relu(_conv(h, "b3", CHANNELS, 9))
        h = (a + b) + c  # one AddN
        h = tf.nn.relu(_conv(h, "c3", CHANNELS, 11))
        loss = tf.reduce_mean(tf.square(h - 0.3))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(
            loss, global_step=global_step)
        init = tf.compat.v1.global_variables_initializer()
    feed = np.random.RandomState(0).uniform(
        -1, 1, (BATCH, IMAGE, IMAGE, 3)).astype(np.float32)
    return graph, train_op, loss, init, {"x:0": feed}


def train(model):
    """``(losses, weights, run_metadata)`` of `STEPS` traced steps."""
    graph, train_op, loss, init, feed = model
    opts = trace_options()
    md = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        losses = [float(sess.run([train_op, loss], feed, options=opts,
                                 run_metadata=md)[1])
                  for _ in range(STEPS)]
        with graph.as_default():
            weights = sess.run(tf.compat.v1.global_variables())
    return losses, weights, md


def compare(base, run, result):
    """What the test checks of one training with LMS against `base`."""
    base_losses, base_weights, base_md = base
    losses, weights, md = run
    ran = session.swaps_in_run_metadata(result, md)
    return {
        "swap_ops": len(ran.expected),
        "swaps_missing": list(ran.missing),
        "unrun": sorted(unexecuted_nodes(md) - unexecuted_nodes(base_md)),
        "same_losses": losses == base_losses,
        "losses": losses,
        "base_losses": base_losses,
        "same_weights": all(np.array_equal(a, b)
                            for a, b in zip(base_weights, weights)),
        "target": {"grappler_groups": result.planned.context.target
                   .grappler_groups,
                   "onednn_cpu": result.planned.context.target.onednn_cpu},
    }


def main():
    tf.compat.v1.disable_eager_execution()
    base = train(build())
    # As users run it: the Session graph's own target.
    model = build()
    lms = LMS(**PARAMS)
    result = lms.run(model[0])
    with_rules = compare(base, train(model), result)
    # The same plan but for the fusion rules (a target without them), to
    # show that the model needs them.
    model = build()
    lms = LMS(**PARAMS)
    result = rewrite.rewrite_session_graph(
        model[0], lms.settings, target=Target.of(lms.settings))
    without_rules = compare(base, train(model), result)
    print(json.dumps({
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "with_rules": with_rules,
        "without_rules": without_rules,
    }))


if __name__ == "__main__":
    main()
