"""Device strings a user writes (`devices.parse_user_device`, behind the
`cpu_device` and `gpu_device` settings) are accepted exactly when
TensorFlow accepts them, without TensorFlow. (`parse_device`, for the
strings of ops, is checked against TensorFlow in test_graph_index.py.)"""

import pytest
import tensorflow as tf

from tflms import devices


# What TensorFlow itself decides: run on both stacks (tools/run_tests.sh).
pytestmark = pytest.mark.both_stacks


@pytest.mark.parametrize("device", [
    "/cpu:0", "/GPU:1", "/gpu", "CPU:0", "/tpu:0", "/device:XPU:0",
    "/job:worker/replica:0/task:1/device:CPU:0", "/job:localhost",
    "/task:1/cpu:0",
])
def test_user_devices_tensorflow_accepts(device):
    spec = tf.DeviceSpec.from_string(device)
    key = devices.parse_user_device(device)
    assert key.device_type == (spec.device_type.upper()
                               if spec.device_type else None)
    assert key.device_index == spec.device_index


@pytest.mark.parametrize("device, reason", [
    ("garbage", r"unknown device type 'garbage'; name another type in "
                r"full, as in '/device:XPU:0'"),
    ("/xpu:0", r"unknown device type 'xpu'"),
    ("/gpu:x", r"invalid literal"),
    ("/gpu:0/cpu:0", r"two device types"),
])
def test_user_devices_tensorflow_refuses(device, reason):
    # No pluggable device is installed here, so TensorFlow knows only its
    # fixed short forms.
    with pytest.raises(ValueError):
        tf.DeviceSpec.from_string(device)
    with pytest.raises(devices.DeviceStringError,
                       match=r"^device string %r cannot be parsed \(%s"
                       % (device, reason)) as raised:
        devices.parse_user_device(device)
    assert raised.value.device == device


@pytest.mark.parametrize("a, b, expected", [
    ("/cpu:0", "/device:CPU:0", True),
    ("/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:0", True),
    ("/job:worker/task:1/cpu:0", "/job:worker/task:0/cpu:0", False),
    ("/cpu:0", "/cpu:1", False),
    ("/device:GPU:0", "/gpu", True),
    ("/cpu:0", "/gpu:0", False),
    ("", "/cpu:0", False),
])
def test_same_device(a, b, expected):
    assert devices.same_device(a, b) is expected
    assert devices.same_device(b, a) is expected
