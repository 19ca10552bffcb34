"""Every model in the zoo builds, trains on CPU and is reproducible."""

import numpy as np
import pytest
import tensorflow as tf

if tf.executing_eagerly():
    tf.compat.v1.disable_eager_execution()

from zoo import models

# Tiny sizes: the point is graph structure, not compute.
TINY = {
    "mlp": dict(depth=2, width=16, batch=4),
    "cnn_bn": dict(image=8, channels=4, depth=3, batch=2),
    "cnn_bias": dict(image=8, channels=2, depth=2, batch=2),
    "cnn_branchy": dict(image=8, channels=2, depth=2, branches=3, batch=2),
    "keras_resnet": dict(image=16, batch=2, blocks=(1, 1)),
    "keras_resnet50": dict(image=32, batch=1),
    "lstm": dict(steps=4, units=8, batch=2),
    "lstm_unrolled": dict(steps=4, units=8, batch=2, unroll=True),
    "unet3d": dict(volume=8, base_filters=2, depth=2),
    "transformer_encoder": dict(layers=1, seq=8, d_model=16, heads=2, batch=2),
}


def _build(name, seed=0):
    builder = models.BUILDERS[{"lstm_unrolled": "lstm",
                               "cnn_branchy": "cnn_bias"}.get(name, name)]
    graph = tf.Graph()
    with graph.as_default():
        model = builder(seed=seed, **TINY[name])
    assert model.graph is graph
    return model


def _train(model, steps=2):
    with tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(model.init_op)
        initial = sess.run(model.variables)
        losses = [sess.run(model.fetches, model.feed_dict)[1]
                  for _ in range(steps)]
    return initial, losses


def test_builders_cover_the_zoo():
    assert set(models.BUILDERS) == {
        "mlp", "cnn_bn", "cnn_bias", "keras_resnet", "keras_resnet50", "lstm",
        "unet3d", "transformer_encoder"}


@pytest.mark.parametrize("name", sorted(TINY))
def test_two_steps_finite_and_reproducible(name):
    first = _build(name, seed=1)
    initial_a, losses_a = _train(first)
    assert all(np.isfinite(loss) for loss in losses_a)
    assert np.ndim(losses_a[0]) == 0
    # A training step must change the loss on the same batch.
    assert losses_a[0] != losses_a[1]

    second = _build(name, seed=1)
    initial_b, losses_b = _train(second)
    assert len(initial_a) == len(initial_b)
    for a, b in zip(initial_a, initial_b):
        np.testing.assert_array_equal(a, b)
    for ph in first.inputs:
        twin = second.graph.get_tensor_by_name(ph.name)
        np.testing.assert_array_equal(first.inputs[ph], second.inputs[twin])
    assert losses_a == losses_b


@pytest.mark.parametrize("name", ["mlp", "keras_resnet"])
def test_seed_changes_weights(name):
    initial_a, _ = _train(_build(name, seed=0), steps=0)
    initial_b, _ = _train(_build(name, seed=5), steps=0)
    assert any(not np.array_equal(a, b) for a, b in zip(initial_a, initial_b))


def test_placeholders_fully_defined():
    for name in TINY:
        model = _build(name)
        placeholders = [op for op in model.graph.get_operations()
                        if op.type == "Placeholder"]
        assert placeholders
        for op in placeholders:
            assert op.outputs[0].shape.is_fully_defined(), (name, op.name)
        assert {t.op for t in model.inputs} == set(placeholders)


def test_cnn_bn_updates_moving_statistics():
    model = _build("cnn_bn")
    moving = [v for v in model.variables if "moving_mean" in v.name]
    assert moving
    with tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(model.init_op)
        before = sess.run(moving)
        sess.run(model.train_op, model.feed_dict)
        after = sess.run(moving)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))


def test_keras_builders_do_not_leak_seed_state():
    import random
    random.seed(1234)
    expected = random.Random(1234).random()
    _build("keras_resnet")
    assert random.random() == expected


def _mlp(**kwargs):
    graph = tf.Graph()
    with graph.as_default():
        return models.mlp(seed=3, **dict(TINY["mlp"], **kwargs))


def test_mlp_with_ref_variables_trains_like_resource_variables():
    ref = _mlp(optimizer="sgd", resource_variables=False)
    resource = _mlp(optimizer="sgd")
    types = {op.type for op in ref.graph.get_operations()}
    assert {"VariableV2", "ApplyGradientDescent"} <= types
    assert "VarHandleOp" not in types
    assert "ResourceApplyGradientDescent" in {
        op.type for op in resource.graph.get_operations()}
    initial_ref, losses_ref = _train(ref, steps=3)
    initial_res, losses_res = _train(resource, steps=3)
    for a, b in zip(initial_ref, initial_res):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(losses_ref, losses_res, rtol=1e-6)


def test_mlp_refuses_an_unknown_optimizer():
    with pytest.raises(ValueError,
                       match=r"^optimizer must be 'momentum' or 'sgd'; "
                             r"got 'adam'$"):
        _mlp(optimizer="adam")
