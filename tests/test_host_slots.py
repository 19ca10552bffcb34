"""`tflms.tf.host_slots`: a Keras 3 optimizer's slots given new
`tf.Variable`s on the host, their values, names and Keras objects kept.

Keras 3 runs in eager mode and this test process has eager execution off:
the checks run in a subprocess (this file as a script), on a CPU split in
two logical devices, the optimizer built on ``/cpu:1``.
"""

import json
import os
import sys

from _keras3 import needs_keras3, result_of

_HERE = os.path.abspath(__file__)
_ROOT = os.path.dirname(os.path.dirname(_HERE))


def _main():
    sys.path.insert(0, _ROOT)
    import tensorflow as tf
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    from tflms.tf import host_slots
    with tf.device("/cpu:1"):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        optimizer = keras.optimizers.Adam(0.1)
        optimizer.build(model.trainable_variables)
        for v in optimizer.variables:
            if len(v.shape):
                v.assign(tf.fill(v.shape, 0.5))
    slots = [v for v in optimizer.variables if len(v.shape)]
    before = [(v._value.name, v.numpy().tolist()) for v in slots]
    found = host_slots.keras_variables_of(
        optimizer, [v._value for v in slots])
    moved = host_slots.move_to_host(found, "/cpu:0")
    again = host_slots.move_to_host(found, "/cpu:0")
    try:
        host_slots.keras_variables_of(optimizer, [model.weights[0]._value])
        error = None
    except Exception as e:
        error = [type(e).__name__, str(e)]
    print("RESULT " + json.dumps(dict(
        same_objects=all(a is b for a, b in zip(found, slots)),
        moved=moved, moved_again=again,
        devices=sorted({v._value.device for v in slots}),
        iteration_device=optimizer.iterations._value.device,
        after=[(v._value.name, v.numpy().tolist()) for v in slots],
        before=before, error=error)))


pytestmark = needs_keras3


def test_slots_move_to_the_host_with_their_names_and_values():
    r = result_of(_HERE, timeout=300)[0]
    assert r["same_objects"]
    assert len(r["moved"]) == 4 and r["moved_again"] == []
    assert all(p.startswith("adam/") for p in r["moved"])
    assert r["devices"] == ["/job:localhost/replica:0/task:0/device:CPU:0"]
    # Only what was asked for moves: the step counter stays.
    assert r["iteration_device"].endswith("CPU:1")
    assert r["after"] == r["before"]
    kind, message = r["error"]
    assert kind == "OffloadUnsupportedError"
    assert "optimizer=" in message and "offload_optimizer=False" in message


if __name__ == "__main__":
    _main()
