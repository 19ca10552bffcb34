"""The `Target` of a step: the device rule (the host is ``cpu_device``,
every other device the step computes on is managed), a worker's devices,
and the target made from the settings. Pure: no TensorFlow."""

import pytest

from tflms import worker_devices
from tflms.settings import Settings
from tflms.target import Target

TASK1 = "/job:worker/replica:0/task:1"
CPU_WORKER = worker_devices.for_worker([TASK1 + "/device:CPU:0"], "/cpu:0")
GPU_WORKER = worker_devices.for_worker(
    [TASK1 + "/device:GPU:0", TASK1 + "/device:GPU:1"], "/cpu:0")


@pytest.mark.parametrize("device, expected", [
    ("/cpu:0", False),                       # the host
    ("/device:CPU:0", False),
    ("/job:localhost/replica:0/task:0/device:CPU:0", False),
    ("/cpu:1", True),                        # another (logical) CPU
    ("/job:localhost/replica:0/task:0/device:CPU:1", True),
    ("/device:GPU:0", True),
    ("", True),                              # unplaced: the GPU's
])
def test_every_device_but_the_host_is_managed(device, expected):
    assert Target().manages(device) is expected
    assert Target(host="/cpu:0").is_host(device) is (
        not expected and device != "")
    # A device set names the one device managed.
    assert not Target(device="/device:GPU:1").manages(device)


def test_the_host_is_cpu_device():
    # With the host on CPU:1, CPU:0 computes like a GPU (a CPU split into
    # logical devices, as the distributed tests' jobs split it).
    target = Target(host="/cpu:1")
    assert target.manages("/cpu:0")
    assert target.manages("/job:localhost/replica:0/task:0/device:CPU:0")
    assert not target.manages("/device:CPU:1")
    assert target.swap_device == "/cpu:1"


@pytest.mark.parametrize("device, planned, expected", [
    ("/device:GPU:0", None, True),
    ("/device:GPU:1", "/device:GPU:0", False),
    ("/gpu:0", "/device:GPU:0", True),
    ("/job:w/device:GPU:0", "/device:GPU:0", True),
    ("/job:w/device:GPU:0", "/job:v/device:GPU:0", False),
    ("", "/device:GPU:0", False),
    # A logical CPU beside the host may be the device planned.
    ("/cpu:1", "/cpu:1", True),
    ("/cpu:2", "/cpu:1", False),
    ("/cpu:0", "/cpu:1", False),
])
def test_a_device_planned_alone(device, planned, expected):
    assert Target(device=planned).manages(device) is expected


@pytest.mark.parametrize("device, worker, expected", [
    (TASK1 + "/device:CPU:0", None, False),
    (TASK1 + "/device:CPU:0", CPU_WORKER, True),
    ("/job:worker/replica:0/task:0/device:CPU:0", CPU_WORKER, False),
    ("/device:CPU:0", CPU_WORKER, False),
    (TASK1 + "/device:CPU:0", GPU_WORKER, False),
    (TASK1 + "/device:GPU:0", GPU_WORKER, True),
    ("", CPU_WORKER, True),
])
def test_a_workers_replica_devices_are_managed(device, worker, expected):
    assert Target(worker=worker).manages(device) is expected


def test_a_workers_swap_ops_go_to_its_own_host():
    assert Target(worker=CPU_WORKER).swap_device == (
        TASK1 + "/device:CPU:0")
    assert Target(worker=GPU_WORKER).swap_device == (
        TASK1 + "/device:CPU:0")


def test_target_of_settings():
    target = Target.of(Settings(gpu_device="/device:GPU:1",
                                cpu_device="/cpu:2"), grappler_groups=True)
    assert target == Target(device="/device:GPU:1", host="/cpu:2",
                            grappler_groups=True, onednn_cpu=False)
    assert target.replace(device=None).manages("/device:GPU:0")
    # The settings refuse the host as the device planned, not another CPU.
    assert Target.of(Settings(gpu_device="/cpu:1")).manages("/cpu:1")
    with pytest.raises(ValueError, match=(
            r"gpu_device must name an accelerator such as '/device:GPU:0', "
            r"or a CPU other than the host cpu_device='/cpu:1' \(or be None "
            r"for every device but the host\); got '/device:CPU:1'")):
        Settings(gpu_device="/device:CPU:1", cpu_device="/cpu:1")
