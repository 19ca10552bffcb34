"""Keras 3 fit with the optimizer's updates applied one variable after
another (`tflms.update_order`): a budget where the search finds a plan only
with those edges; the training is the training without LMS, and every swap
op ran.

Keras 3 trains in eager mode, which the test process has off: the fits run
in a subprocess (this file run as a script, `_keras3.result_of`).
"""

import os

import numpy as np
import pytest

import _keras3

BATCH = 4
# The model's end of step: 4 MiB of weights, as much momentum, every
# gradient (Keras 3's IdentityN reads them all) and, unordered, every
# ``m * momentum`` swapped back in at once: the smallest plan needs 16.1
# MiB. Ordered, one variable's products at a time: 12.3 MiB, set by the
# convolutions' gradient, which swaps bring under 0.9 of this budget.
BUDGET_GIB = 0.015


def _model(keras):
    """Two convolutions (activations to swap) and sixteen dense layers
    (many variables of equal size, updated at the end of the step)."""
    layers = keras.layers
    x = inputs = keras.Input((64, 64, 3))
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = layers.Flatten()(layers.MaxPooling2D(16)(x))
    for _ in range(16):
        x = layers.Dense(256, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(4)(x))


def _fit(keras, lms=None):
    losses, model = _keras3.fit_seeded(keras, _model, BATCH, lms)
    # The weights, then the optimizer's variables (step count, momentum).
    return losses, [v.numpy() for v in list(model.weights) + list(
        model.optimizer.variables)]


def _main():
    import json
    import keras
    from tflms import LMS
    from tflms.tf.swaps_ran import watch_swaps
    base_losses, base_weights = _fit(keras)
    lms = LMS()
    lms.autotune_gpu_mem = BUDGET_GIB
    with watch_swaps(lms) as swaps:
        losses, weights = _fit(keras, lms)
    planned = lms.last_run.planned
    names = planned.index.names
    edges = [(names[a], names[b]) for a, b in planned.ordering_edges]
    print("RESULT " + json.dumps(dict(
        base_losses=base_losses, losses=losses, edges=edges,
        swaps=len(lms.last_run.swapout_ops), all_ran=swaps.all_ran,
        ran=str(swaps),
        weights_equal=all(np.array_equal(a, b)
                          for a, b in zip(base_weights, weights)))))


@pytest.mark.numerics
@_keras3.needs_keras3
def test_fit_with_updates_ordered_trains_the_same():
    r, log = _keras3.result_of(os.path.abspath(__file__))
    # Every variable's update chain after the one before: its first
    # products (``m * momentum``'s read of the slot, the learning rate's
    # read) wait for the previous variable's difference (``Sub``).
    waits = [(a, b) for a, b in r["edges"]
             if a.split("/")[-1].startswith("Sub")
             and b.endswith("/ReadVariableOp")]
    assert len(waits) >= 2 * 16, (r["edges"], log[-3000:])
    assert r["swaps"] > 0
    assert r["all_ran"], r["ran"]
    # Bit for bit with oneDNN off and on (its max pool keeps its output
    # for its gradient on oneDNN's CPU kernels, `fusions.grappler_groups`).
    assert r["losses"] == r["base_losses"]
    assert r["weights_equal"]


if __name__ == "__main__":
    _main()
