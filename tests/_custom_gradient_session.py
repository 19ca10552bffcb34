"""Trains a Session-graph MLP whose activations are ``tf.nn.silu`` without
LMS and with it (`LMS.run`, fixed parameters that swap every tensor), and
prints what `test_custom_gradient_swaps.py` checks, as JSON.

Run as a script in a subprocess: the test chooses `TF_ENABLE_ONEDNN_OPTS`,
which TensorFlow reads once, when it loads.

In graph mode ``tf.nn.silu`` is a ``tf.custom_gradient`` function:
TensorFlow passes its result *and its inputs* through one ``IdentityN``
(``IdentityN(x * sigmoid(x), x, beta)``) to attach the gradient. The
outputs handing on the inputs are read only by the gradient's
``ZerosLike`` ops, which the train op does not need, so inside the step
the ``IdentityN`` reads ``x`` for nothing; Grappler's model pruner and
dependency optimizer remove it, and that read with it.
"""

import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tflms import LMS  # noqa: E402

from _session_fusions import PARAMS, compare, train  # noqa: E402

BATCH, WIDTH, LAYERS = 8, 32, 4


def build():
    """``(graph, train_op, loss, init, feed)``: the model, seeded."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(7)
        x = tf.compat.v1.placeholder(tf.float32, [BATCH, WIDTH], name="x")
        h = x
        for i in range(LAYERS):
            kernel = tf.compat.v1.get_variable(
                "kernel%d" % i, [WIDTH, WIDTH],
                initializer=tf.compat.v1.glorot_uniform_initializer(seed=i))
            bias = tf.compat.v1.get_variable(
                "bias%d" % i, [WIDTH],
                initializer=tf.compat.v1.random_normal_initializer(
                    stddev=0.1, seed=i + 10))
            h = tf.nn.silu(tf.nn.bias_add(tf.matmul(h, kernel), bias))
        loss = tf.reduce_mean(tf.square(h - 0.3))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.AdamOptimizer(0.01).minimize(
            loss, global_step=global_step)
        init = tf.compat.v1.global_variables_initializer()
    feed = np.random.RandomState(0).uniform(
        -1, 1, (BATCH, WIDTH)).astype(np.float32)
    return graph, train_op, loss, init, {"x:0": feed}


def identity_n_reads(graph):
    """``(IdentityN ops, those reading a swap-in)`` of the graph."""
    ops = [op for op in graph.get_operations() if op.type == "IdentityN"]
    return len(ops), sum(
        any("lms/swapin" in t.op.name for t in op.inputs) for op in ops)


def main():
    tf.compat.v1.disable_eager_execution()
    base = train(build())
    model = build()
    result = LMS(**PARAMS).run(model[0])
    out = compare(base, train(model), result)
    out["identity_n"], out["identity_n_swapped_in"] = identity_n_reads(
        model[0])
    out["onednn"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
