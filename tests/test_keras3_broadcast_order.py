"""Keras 3 fit with the broadcast terms of its batch-norm gradients ordered
(`tflms.broadcast_order`): a budget where the search finds a plan only with
those edges; the training is the training without LMS.

Keras 3 trains in eager mode, which the test process has off: the fits run
in a subprocess (this file run as a script), as in test_keras3_fit.py.
"""

import json
import os
import sys

import numpy as np
import pytest

import _keras3

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 4
# Plans found for this model: at 0.018 GiB without ordering, at 0.016 and
# below only after the broadcast edges (the search without them finds no
# plan).
BUDGET_GIB = 0.016


def _resnet(keras):
    """Two residual blocks with projection shortcuts: sibling batch norms
    whose gradients read the same incoming gradient."""
    layers = keras.layers
    x = inputs = keras.Input((64, 64, 3))
    x = layers.ReLU()(layers.BatchNormalization()(
        layers.Conv2D(16, 3, padding="same")(x)))
    for filters, stride in ((32, 1), (32, 2)):
        y = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(
            filters, 3, strides=stride, padding="same")(x)))
        y = layers.BatchNormalization()(layers.Conv2D(
            filters, 3, padding="same")(y))
        x = layers.BatchNormalization()(layers.Conv2D(
            filters, 1, strides=stride)(x))
        x = layers.ReLU()(layers.Add()([x, y]))
    return keras.Model(inputs, layers.Dense(4)(
        layers.GlobalAveragePooling2D()(x)))


def _fit(keras, lms=None):
    losses, model = _keras3.fit_seeded(keras, _resnet, BATCH, lms)
    return losses, [v.numpy() for v in model.weights]


def _main():
    sys.path.insert(0, _ROOT)
    import keras
    from tflms import LMS
    base_losses, base_weights = _fit(keras)
    lms = LMS()
    lms.autotune_gpu_mem = BUDGET_GIB
    losses, weights = _fit(keras, lms)
    planned = lms.last_run.planned
    names = planned.index.names
    edges = [(names[a], names[b]) for a, b in planned.ordering_edges]
    print("RESULT " + json.dumps(dict(
        base_losses=base_losses, losses=losses, edges=edges,
        swaps=len(lms.last_run.swapout_ops),
        weights_equal=all(np.array_equal(a, b)
                          for a, b in zip(base_weights, weights)),
        weights_close=all(np.allclose(a, b, rtol=1e-4, atol=1e-6)
                          for a, b in zip(base_weights, weights)))))


@pytest.mark.numerics
@_keras3.needs_keras3
def test_fit_with_broadcast_terms_ordered_trains_the_same():
    onednn = _keras3.onednn()
    r, _ = _keras3.result_of(os.path.abspath(__file__))
    # The plan holds the edges: a mean's broadcast after its layer's
    # variance chain, and a sibling layer's broadcast after the first sum.
    waits = {(a.rsplit("/", 1)[-1], b.rsplit("/", 1)[-1])
             for a, b in r["edges"]}
    assert ("truediv_1", "Tile") in waits, r["edges"]
    assert any(a.startswith("AddN") and b.startswith("Tile")
               for a, b in waits), r["edges"]
    assert r["swaps"] > 0
    if onednn == "1":
        assert r["losses"] == pytest.approx(r["base_losses"], rel=1e-5)
        assert r["weights_close"]
    else:
        assert r["losses"] == r["base_losses"]
        assert r["weights_equal"]


if __name__ == "__main__":
    _main()
