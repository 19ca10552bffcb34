"""Training with LMS gives the same numbers as without it.

For each model of the zoo, fresh graphs built with the same seed train for
three steps without LMS and with LMS under many parameter sets; losses and
final weights must be equal, and every swap op LMS added must appear in the
step stats of a traced step (it really ran; see `assert_swaps_ran` for
what Grappler may legitimately merge). The comparison is exact: the swap
ops are identities, and on CPU Grappler does not fuse across them
differently for these models. The Transformer is the exception: an
identity between the attention softmax and its gradient changes which
multiplications Grappler's arithmetic optimizer folds together, so its
numbers may differ in the last bit (ROUNDING_TOLERANT).
"""

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS

import models
from _graphs import assert_swaps_ran, trace_options

SIZES = {
    "mlp": dict(depth=6, width=32, batch=8),
    "cnn_bn": dict(image=12, channels=6, depth=4, batch=2),
    "keras_resnet": dict(image=16, batch=2, blocks=(1, 1)),
    "lstm": dict(steps=5, units=8, batch=2),
    "lstm_unrolled": dict(steps=5, units=8, batch=2, unroll=True),
    "transformer_encoder": dict(layers=2, seq=8, d_model=16, heads=2,
                                batch=2),
    "unet3d": dict(volume=8, base_filters=2, depth=2),
}

PARAMS = {
    "t1a1g0": dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0),
    "t1a1g0s1": dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0,
                     sync_mode=1),
    "t1a1g0s2": dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0,
                     sync_mode=2),
    "t1a1g0s3": dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0,
                     sync_mode=3),
    "t4a3g5": dict(swapout_threshold=4, swapin_ahead=3, swapin_groupby=5),
    "t2a2g2ser": dict(swapout_threshold=2, swapin_ahead=2, swapin_groupby=2,
                      serialization=["0:"]),
}

# Models whose LMS run may differ from the baseline by float rounding, and
# the relative tolerance allowed (a few ulps of float32).
ROUNDING_TOLERANT = {"transformer_encoder": 1e-6}


def build(name):
    builder = models.BUILDERS[name.replace("_unrolled", "")]
    graph = tf.Graph()
    with graph.as_default():
        model = builder(seed=3, **SIZES[name])
    return model


def train(model, steps=3):
    opts = trace_options()
    md = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(model.init_op)
        losses = [sess.run(model.fetches, model.feed_dict, options=opts,
                           run_metadata=md)[1] for _ in range(steps)]
        weights = sess.run(model.variables)
    return losses, weights, md


_BASELINES = {}


def baseline(name):
    if name not in _BASELINES:
        _BASELINES[name] = train(build(name))[:2]
    return _BASELINES[name]


@pytest.mark.parametrize("params", sorted(PARAMS))
@pytest.mark.parametrize("name", sorted(SIZES))
def test_same_losses_and_weights(name, params):
    base_losses, base_weights = baseline(name)
    model = build(name)
    lms = LMS(**PARAMS[params])
    result = lms.run(model.graph)
    losses, weights, run_metadata = train(model)
    assert result.swapout_ops, "nothing was swapped"
    assert_swaps_ran(model.graph, result, run_metadata)
    assert len(weights) == len(base_weights)
    rtol = ROUNDING_TOLERANT.get(name)
    if rtol is None:
        assert losses == base_losses
        for a, b in zip(base_weights, weights):
            np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(losses, base_losses, rtol=rtol)
        for a, b in zip(base_weights, weights):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)
