"""Training with LMS gives the same numbers as without it.

For each model of the zoo, fresh graphs built with the same seed train for
three steps without LMS and with LMS under many parameter sets; losses and
final weights must be equal, every node of the optimized graph that ran
without LMS must run with it (nothing silently skipped: see
`fusions.fusion_partners` for how oneDNN's graph pass once made LMS's
edges into a cycle), the global step must advance, and every swap op LMS
added must appear in the step stats of a traced step (it really ran; see
`assert_swaps_ran` for what Grappler may legitimately merge).

The tests run with oneDNN off and on (`numerics` marker, see
tools/run_tests.sh). The comparison is exact whenever TensorFlow runs the
same kernels with and without LMS (`kernel_counts` equal). A control edge
or a second reader that LMS adds can stop Grappler's remapper from fusing
ops (with oneDNN: batch norm with its ReLU, a MatMul with its bias), and
the fused and unfused kernels round differently; then the numbers may
differ by float rounding, within `_graphs.FUSION_RTOL`. The Transformer is
allowed that tolerance always: an identity between the attention softmax and
its gradient changes which multiplications Grappler's arithmetic optimizer
folds together, with oneDNN on or off.
"""

import pytest
import tensorflow as tf

from tflms import LMS

from _graphs import assert_same_training, trace_options, zoo_model

pytestmark = pytest.mark.numerics

SIZES = {
    "mlp": dict(depth=6, width=32, batch=8),
    "cnn_bn": dict(image=12, channels=6, depth=4, batch=2),
    "cnn_bias": dict(image=12, channels=4, depth=2, batch=4),
    "cnn_branchy": dict(image=8, channels=3, depth=2, branches=3, batch=2),
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

# Models whose LMS run may differ by rounding whatever the kernels.
ROUNDING_TOLERANT = {"transformer_encoder"}

_BUILDER_OF = {"lstm_unrolled": "lstm", "cnn_branchy": "cnn_bias"}


def build(name):
    return zoo_model(_BUILDER_OF.get(name, name), **SIZES[name])


def train(model, steps=3):
    opts = trace_options()
    md = tf.compat.v1.RunMetadata()
    with model.graph.as_default():
        global_step = tf.compat.v1.train.get_global_step()
    with tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(model.init_op)
        losses = [sess.run(model.fetches, model.feed_dict, options=opts,
                           run_metadata=md)[1] for _ in range(steps)]
        weights = sess.run(model.variables)
        if global_step is not None:
            assert sess.run(global_step) == steps, (
                "the global step did not advance with every step: parts of "
                "the training step did not run")
    return losses, weights, md


_BASELINES = {}


def baseline(name):
    if name not in _BASELINES:
        _BASELINES[name] = train(build(name))
    return _BASELINES[name]


@pytest.mark.parametrize("params", sorted(PARAMS))
@pytest.mark.parametrize("name", sorted(SIZES))
def test_same_losses_and_weights(name, params):
    model = build(name)
    result = LMS(**PARAMS[params]).run(model.graph)
    assert result.swapout_ops, "nothing was swapped"
    assert_same_training(model.graph, result, baseline(name), train(model),
                         always_tolerant=name in ROUNDING_TOLERANT)
