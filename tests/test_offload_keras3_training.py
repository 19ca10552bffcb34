"""``offload_optimizer`` on Keras 3 steps (issue 49): ``fit(callbacks=
[LMS(offload_optimizer=True)])`` and ``lms.function(step, optimizer=...)``
train bit for bit as without LMS, with every trainable variable's
optimizer slots in host memory and its element-wise update run there.

The GPU is emulated through the public rule of docs/offload.md: the
machine's CPU is split into two logical CPUs, the model and its fit live
on ``/cpu:1`` (the device LMS manages), and ``LMS(cpu_device="/cpu:0")``
is the host. Each case runs this file as a script in a subprocess
(Keras 3 trains in eager mode; this test process has eager execution
off), with one inter-op thread, and prints one ``RESULT`` line: losses
and weights with and without LMS, the devices of the optimizer's
variables afterwards, and where the update ops ran (the partition graphs
TensorFlow made, `tflms.tf.function_api.partition_graphs_made`).

Exact in both oneDNN modes (CI: the newest stack's pass with it on, the
Python 3.13 pass with it off). The model holds a convolution with batch
norm (whose moving statistics are written in the step too, and are not
slots), dense layers and their biases; 2 epochs of 2 batches. LMS also
swaps nearly every activation (``swapout_threshold=1``), so swaps and the
offload are in one plan.
"""

import json
import os
import sys

import pytest

from _keras3 import needs_keras3, result_of, weights_compared

_HERE = os.path.abspath(__file__)
_ROOT = os.path.dirname(os.path.dirname(_HERE))

OPTIMIZERS = ("sgd_momentum", "adam", "adamw", "rmsprop", "adagrad")
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


# ---- the script (runs in the subprocess) -------------------------------

def _optimizer(keras, name):
    return {
        "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        "sgd": lambda: keras.optimizers.SGD(0.05),
        "adam": lambda: keras.optimizers.Adam(0.01),
        "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
        "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
        "adagrad": lambda: keras.optimizers.Adagrad(0.05),
    }[name]()


def _model(keras):
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(4, 3, name="conv"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.ReLU(),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu", name="hidden"),
        keras.layers.Dense(4, name="logits"),
    ])


def _data():
    import numpy as np
    rng = np.random.RandomState(0)
    return (rng.rand(8, 8, 8, 3).astype("float32"),
            rng.randint(0, 4, 8).astype("int32"))


def _fit(keras, tf, name, lms=None):
    x, y = _data()
    with tf.device("/cpu:1"):
        model = _model(keras)
        optimizer = _optimizer(keras, name)
        model.compile(optimizer=optimizer, jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(
                          from_logits=True))
        history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False,
                            verbose=0, callbacks=[lms] if lms else [])
    return history.history["loss"], model, optimizer


def _custom_loop(keras, tf, name, lms=None, give_optimizer=True):
    x, y = _data()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.device("/cpu:1"):
        model = _model(keras)
        optimizer = _optimizer(keras, name)
        optimizer.build(model.trainable_variables)

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        run = (tf.function(step) if lms is None else
               lms.function(step, optimizer if give_optimizer else None))
        losses = [float(run(tf.constant(x[:4]), tf.constant(y[:4])))
                  for _ in range(3)]
    return losses, model, optimizer


def _slot_values(optimizer):
    return [v.numpy() for v in optimizer.variables]


def _host_ops_ran(result, graph_defs):
    """``(names of the offloaded updates' host ops, those found in no
    partition graph on CPU:0)``. Inlining prefixes the names of a
    function's ops: an op is found by its name's end."""
    names = result.planned.index.names
    expected = sorted({names[op] for u in result.offload.updates
                       for op in u.host_ops})
    on_host = set()
    for graph_def in graph_defs:
        for node in graph_def.node:
            if node.device.upper().endswith("CPU:0"):
                on_host.add(node.name)
    missing = [n for n in expected
               if not any(h == n or h.endswith("/" + n) for h in on_host)]
    return expected, missing


def _main(entry, name, ckpt_dir=None):
    sys.path.insert(0, _ROOT)
    import tensorflow as tf
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    from tflms import LMS
    from tflms.tf import function_api
    if entry == "fit-identities-kept":
        # The cause, turned back on: host ops read the IdentityN's outputs.
        from tflms.tf import offload_rewrite
        offload_rewrite._read_past_identities = lambda op, moved: None
        entry = "fit"
    run = _fit if entry == "fit" else _custom_loop
    base_losses, base_model, base_opt = run(keras, tf, name)
    lms = LMS(offload_optimizer=True, cpu_device="/cpu:0", **FIXED)
    out = {}
    if entry == "function-without-optimizer":
        try:
            _custom_loop(keras, tf, name, lms, give_optimizer=False)
        except Exception as e:  # what the user sees
            out["error"] = [type(e).__name__, str(e)]
        print("RESULT " + json.dumps(out))
        return
    with function_api.partition_graphs_made() as graph_defs:
        losses, model, opt = run(keras, tf, name, lms)
    result = lms.last_run
    expected, missing = _host_ops_ran(result, graph_defs)
    slots = [v for v in opt.variables
             if v is not opt.iterations and len(v.shape) > 0]
    out.update(
        base_losses=base_losses, losses=losses,
        updates=len(result.offload.updates),
        trainable=len(model.trainable_variables),
        left=list(result.offload.left),
        offloaded_slots=sum(len(u.slots) for u in result.offload.updates),
        slots_on_host=sum(v.value.device.upper().endswith("CPU:0")
                          for v in slots),
        slot_bytes=result.offload.slot_bytes,
        host_ops=len(expected), host_ops_missing=missing,
        swapouts=len(result.swapout_ops),
        **weights_compared([v.numpy() for v in base_model.weights],
                           [v.numpy() for v in model.weights]))
    out["slots_different"] = weights_compared(
        _slot_values(base_opt), _slot_values(opt))["different"]
    if ckpt_dir:
        # Written with offload, restored without it, and the other way.
        base_path = tf.train.Checkpoint(
            model=base_model, optimizer=base_opt).write(
                os.path.join(ckpt_dir, "without"))
        lms_path = tf.train.Checkpoint(model=model, optimizer=opt).write(
            os.path.join(ckpt_dir, "with"))
        _, fresh_model, fresh_opt = run(keras, tf, name)
        tf.train.Checkpoint(model=fresh_model, optimizer=fresh_opt).read(
            lms_path).assert_consumed()
        out["restored_without"] = weights_compared(
            _slot_values(opt), _slot_values(fresh_opt))["different"]
        tf.train.Checkpoint(model=model, optimizer=opt).read(
            base_path).assert_consumed()
        out["restored_with"] = weights_compared(
            _slot_values(base_opt), _slot_values(opt))["different"]
        out["slots_on_host_after_restore"] = sum(
            v.value.device.upper().endswith("CPU:0") for v in slots)
    print("RESULT " + json.dumps(out))


# ---- the tests -----------------------------------------------------------

pytestmark = [pytest.mark.numerics, needs_keras3]


def _run(*argv):
    return result_of(_HERE, *argv, timeout=600)[0]


def _check_trained_the_same(r):
    # Every update moves, except where Grappler merges the gradient's last
    # product into the update's (momentum SGD's batch-norm scale).
    assert r["updates"] > 0, r
    assert r["updates"] + len(r["left"]) == r["trainable"], r
    assert all("Grappler merges" in line for line in r["left"]), r
    assert r["slots_on_host"] == r["offloaded_slots"] > 0, r
    assert r["slot_bytes"] > 0
    assert r["host_ops"] > 0 and r["host_ops_missing"] == [], r
    assert r["swapouts"] > 0
    assert r["losses"] == r["base_losses"]
    assert r["num_weights"] > 0 and r["different"] == 0, r
    assert r["slots_different"] == 0, r


def test_momentum_leaves_the_update_grappler_merges_on_the_device():
    """Momentum SGD multiplies the gradient by the learning rate; for the
    batch norm's scale that gradient is itself a product, and Grappler
    reorders the chain of the two on one device. Moved to the host, the
    update would round differently: it stays, named in the log."""
    r = _run("fit", "sgd_momentum")
    _check_trained_the_same(r)
    (line,) = r["left"]
    assert "bn" in line and "Grappler merges" in line


# Each case trains in one of CI's oneDNN modes (tools/run_tests.sh): those
# marked `onednn_off_pass` with it off (the Python 3.13 pass), the others
# with it on; each optimizer trains in both, once through fit and once
# through the custom loop (Adam's loop: the checkpoint test's).
_OFF = pytest.mark.onednn_off_pass
_FIT_OFF = ("adam", "adamw")
_LOOP_OFF = ("sgd_momentum", "rmsprop", "adagrad")


def _in_mode(names, off):
    return [pytest.param(n, marks=_OFF) if n in off else n for n in names]


@pytest.mark.parametrize("name", _in_mode(OPTIMIZERS, _FIT_OFF))
def test_fit_offloads_every_update_and_trains_the_same(name):
    _check_trained_the_same(_run("fit", name))


def test_custom_loop_offloads_and_checkpoints_restore_both_ways(tmp_path):
    r = _run("function", "adam", tmp_path)
    _check_trained_the_same(r)
    assert r["restored_without"] == 0 and r["restored_with"] == 0, r
    assert r["slots_on_host_after_restore"] == r["offloaded_slots"], r


@pytest.mark.parametrize("name", _in_mode(
    [n for n in OPTIMIZERS if n != "adam"], _LOOP_OFF))
def test_custom_loop_offloads_each_optimizer(name):
    _check_trained_the_same(_run("function", name))


def test_custom_loop_without_the_optimizer_says_what_to_pass():
    r = _run("function-without-optimizer", "adam")
    kind, message = r["error"]
    assert kind == "SlotsOnDeviceError", r
    assert "optimizer=" in message and "offload_optimizer=False" in message


@_OFF
def test_reading_through_the_gradients_identity_n_is_what_keeps_it_exact():
    """With the host ops reading Keras's IdentityN of the gradients (as
    traced), Grappler keeps that IdentityN (its readers are on another
    device) and no longer merges the batch norm's gradient with the
    update left on the device: the momenta differ."""
    r = _run("fit-identities-kept", "sgd_momentum")
    assert r["updates"] > 0 and r["host_ops_missing"] == []
    assert r["slots_different"] > 0, r


if __name__ == "__main__":
    _main(*sys.argv[1:])
