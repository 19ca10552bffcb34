"""Keras 3 mixed precision with LMS: ``mixed_float16`` (with its
`LossScaleOptimizer`) and ``mixed_bfloat16``, in `fit` with the callback and
in a custom loop through `lms.function(train_step)`.

Each case runs in a subprocess (Keras 3 trains in eager mode; the test
process has eager execution off): ``python tests/test_keras3_mixed_precision.py
MODE POLICY`` trains a small CNN with batch norm from one seed without LMS
and with it (fixed parameters, so that it swaps), and prints what the test
compares: losses and weights of both, which swap ops ran (from the partition
graphs TensorFlow ran, `tflms.tf.swaps_ran.watch_swaps`), and the bytes the
planning index counts for the first convolution's output against its
element count: 2 bytes an element under both 16-bit policies, 4 under
float32.
"""

import json
import os
import sys

import pytest

from _keras3 import onednn, result_of

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)

SEED = 1
FIXED = dict(swapout_threshold=3, swapin_ahead=1, swapin_groupby=0)
SHAPE, BATCH, STEPS = (16, 16, 3), 4, 3


# ---- the script (runs in the subprocess) -------------------------------

def _model(keras, policy):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(SEED)
    layers = [keras.Input(SHAPE)]
    for width in (8, 8, 16):
        layers.append(keras.layers.Conv2D(width, 3, padding="same"))
        layers.append(keras.layers.BatchNormalization())
        layers.append(keras.layers.ReLU())
    layers += [keras.layers.GlobalAveragePooling2D(),
               # Logits in float32, as Keras advises for mixed precision.
               keras.layers.Dense(4, dtype="float32")]
    model = keras.Sequential(layers)
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    if policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return model, optimizer


def _data():
    import numpy as np
    rng = np.random.RandomState(0)
    n = BATCH * STEPS
    return (rng.rand(n, *SHAPE).astype("float32"),
            rng.randint(0, 4, n).astype("int32"))


def _train_fit(keras, tf, policy, lms):
    del tf
    model, optimizer = _model(keras, policy)
    model.compile(optimizer=optimizer, jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    x, y = _data()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False,
                        verbose=0, callbacks=[lms] if lms else [])
    return history.history["loss"], model, optimizer


def _train_loop(keras, tf, policy, lms):
    model, optimizer = _model(keras, policy)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            # The loss scale keeps float16 gradients from underflowing;
            # the optimizer divides it out again before the update.
            target = optimizer.scale_loss(loss) if scaled else loss
        grads = tape.gradient(target, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    step = lms.function(train_step) if lms else tf.function(train_step)
    x, y = _data()
    losses = []
    for k in range(STEPS):
        batch = slice(k * BATCH, (k + 1) * BATCH)
        losses.append(float(step(tf.constant(x[batch]),
                                 tf.constant(y[batch]))))
    return losses, model, optimizer


_MODES = {"fit": _train_fit, "loop": _train_loop}


def _first_conv_bytes(result):
    """(bytes the index counts, elements) of the first Conv2D's output."""
    from tflms.graph_index import tensor_bytes
    index = result.planned.index
    conv = min((k for k in range(index.num_ops)
                if index.types[k] == "Conv2D"),
               key=lambda k: index.levels[k])
    elements = 1
    for dim in index.output_shapes[conv][0]:
        elements *= BATCH if dim is None else dim
    return tensor_bytes(index, conv, 0, BATCH), elements


def _main(mode, policy):
    sys.path.insert(0, _ROOT)
    import numpy as np
    import tensorflow as tf
    import keras
    from tflms import LMS
    from tflms.tf.swaps_ran import watch_swaps
    train = _MODES[mode]
    def state(model, optimizer):
        # The model's weights; the optimizer's variables (the step count,
        # momentum, and under mixed_float16 the loss scale and its
        # counter).
        # In order: the second optimizer's names carry a suffix.
        return ([v.numpy() for v in model.weights],
                [(v.name, v.numpy()) for v in optimizer.variables])

    base_losses, base_model, base_optimizer = train(keras, tf, policy, None)
    base_weights, base_slots = state(base_model, base_optimizer)
    lms = LMS(**FIXED)
    with watch_swaps(lms) as swaps:
        losses, model, optimizer = train(keras, tf, policy, lms)
    weights, slots = state(model, optimizer)
    result = lms.last_run
    conv_bytes, conv_elements = _first_conv_bytes(result)
    print("RESULT " + json.dumps(dict(
        outcome=result.outcome.value, swapouts=len(result.swapout_ops),
        swapins=len(result.swapin_ops), all_ran=swaps.all_ran,
        missing=list(swaps.missing),
        off_cpu=[n for n, d in swaps.ran.items() if "CPU" not in d.upper()],
        base_losses=base_losses, losses=losses,
        weights_equal=len(weights) == len(base_weights) and all(
            np.array_equal(a, b) for a, b in zip(base_weights, weights)),
        weights_close=all(np.allclose(a, b, rtol=1e-3, atol=1e-5)
                          for a, b in zip(base_weights, weights)),
        num_weights=len(weights),
        slots_differing=[name for (name, a), (_, b) in zip(base_slots, slots)
                         if not np.array_equal(a, b)],
        slots_close=len(slots) == len(base_slots) and all(
            np.allclose(a, b, rtol=1e-6, atol=1e-9)
            for (_, a), (_, b) in zip(base_slots, slots)),
        loss_scale=[float(v) for name, v in slots if "scale" in name],
        base_loss_scale=[float(v) for name, v in base_slots
                         if "scale" in name],
        compute_dtype=model.layers[0].compute_dtype,
        variable_dtype=model.layers[0].kernel.dtype,
        conv_bytes=conv_bytes, conv_elements=conv_elements)))


# ---- the tests -----------------------------------------------------------

def _new_stack():
    from tflms.tf import compat
    return compat.TF_VERSION >= (2, 16, 0)


pytestmark = pytest.mark.skipif(
    not _new_stack(), reason="Keras 3 needs TensorFlow 2.16+; on 2.15 keras "
    "is Keras 2")


def _run(mode, policy):
    return result_of(os.path.abspath(__file__), mode, policy)[0]


_BYTES_PER_ELEMENT = {"float32": 4, "mixed_float16": 2, "mixed_bfloat16": 2}
_COMPUTE = {"float32": "float32", "mixed_float16": "float16",
            "mixed_bfloat16": "bfloat16"}


# float32 in fit pins the 4 bytes an element the 16-bit cases halve
# (float32 custom loops: tests/test_lms_function.py).
CASES = [(mode, policy) for policy in ("mixed_float16", "mixed_bfloat16")
         for mode in ("fit", "loop")] + [("fit", "float32")]


@pytest.mark.numerics
@pytest.mark.parametrize("mode,policy", CASES,
                         ids=["%s-%s" % case for case in CASES])
def test_mixed_precision_trains_the_same_with_swaps_that_run(mode, policy):
    """With LMS, the same losses, weights and optimizer variables (the loss
    scale too) as without it (bit for bit
    with oneDNN off), every swap op in the partition graphs TensorFlow ran
    (on the CPU), and activations sized in the policy's compute dtype:
    a float16 or bfloat16 convolution output is half the bytes of the same
    output in float32 (the float32 cases pin 4 bytes an element)."""
    r = _run(mode, policy)
    assert r["compute_dtype"] == _COMPUTE[policy]
    assert r["variable_dtype"] == "float32"
    assert r["outcome"] == "rewritten"
    assert r["swapouts"] > 0 and r["swapins"] >= r["swapouts"]
    assert r["all_ran"] and r["missing"] == [] and r["off_cpu"] == []
    assert r["conv_bytes"] == _BYTES_PER_ELEMENT[policy] * r["conv_elements"]
    assert r["num_weights"] > 0
    # The loss scale (mixed_float16) and the step count: exact.
    assert r["loss_scale"] == r["base_loss_scale"]
    if policy == "mixed_float16":
        assert r["loss_scale"]
    assert r["slots_close"]
    if onednn() == "1":
        # A swapped tensor may keep oneDNN from fusing two ops, which
        # rounds differently (more so in 16-bit).
        assert r["losses"] == pytest.approx(r["base_losses"], rel=1e-3)
        assert r["weights_close"]
    else:
        assert r["losses"] == r["base_losses"]
        assert r["weights_equal"]
        # The momentum of a few batch-norm scales may differ in the last
        # bit: Grappler groups the additions of their last gradient
        # differently with the swap-ins between them (with its arithmetic
        # or its dependency optimizer off they are equal); the weights,
        # updated with it, are equal.
        assert all("momentum" in k for k in r["slots_differing"]), (
            r["slots_differing"])


if __name__ == "__main__":
    _main(*sys.argv[1:3])
