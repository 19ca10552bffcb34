"""tflms.worker_devices: the devices one worker of a multi-worker strategy
computes on, and its host CPU, where the swap ops go (standard library
only)."""

import pytest

from tflms import worker_devices

TASK1 = "/job:worker/replica:0/task:1"
CPU_WORKER = worker_devices.for_worker([TASK1 + "/device:CPU:0"], "/cpu:0")
GPU_WORKER = worker_devices.for_worker(
    [TASK1 + "/device:GPU:0", TASK1 + "/device:GPU:1"], "/cpu:0")


def test_a_cpu_only_worker_computes_on_its_cpu():
    assert CPU_WORKER.task == TASK1 and CPU_WORKER.task_index == 1
    assert CPU_WORKER.compute_cpus == (TASK1 + "/device:CPU:0",)
    assert CPU_WORKER.host == TASK1 + "/device:CPU:0"
    assert CPU_WORKER.computes_on(TASK1 + "/device:CPU:0")
    assert CPU_WORKER.computes_on(TASK1 + "/cpu:0")
    # Full names are compared: another task's CPU, the worker's other CPU
    # and a bare '/cpu:0' the user pinned are not the replica's device.
    for other in ("/job:worker/replica:0/task:0/device:CPU:0",
                  TASK1 + "/device:CPU:1", "/device:CPU:0", "/cpu:0", ""):
        assert not CPU_WORKER.computes_on(other), other


def test_a_gpu_worker_keeps_its_cpu_as_the_host():
    assert GPU_WORKER.compute_cpus == ()
    assert GPU_WORKER.host == TASK1 + "/device:CPU:0"
    assert not GPU_WORKER.computes_on(TASK1 + "/device:CPU:0")
    assert worker_devices.for_worker([TASK1 + "/device:GPU:0"],
                                     "/device:CPU:1").host == \
        TASK1 + "/device:CPU:1"


@pytest.mark.parametrize("replica_devices, message", [
    ([], "replica_devices must name at least one device; got none"),
    (["/device:CPU:0"], "replica_devices must be full names of one "
     "worker's devices, such as '/job:worker/replica:0/task:1/device:CPU:0';"
     " got \\('/device:CPU:0',\\)"),
    (["/job:worker/replica:0/task:0/device:GPU:0", TASK1 + "/device:GPU:0"],
     "replica_devices must be full names of one worker's devices"),
])
def test_for_worker_refuses_other_devices(replica_devices, message):
    with pytest.raises(ValueError, match=message):
        worker_devices.for_worker(replica_devices, "/cpu:0")


def test_full_key_reads_a_device_whatever_its_spelling():
    assert worker_devices.full_key(TASK1 + "/device:GPU:1") == \
        ("worker", 0, 1, "GPU", 1)
    assert worker_devices.full_key(TASK1 + "/gpu:1") == \
        worker_devices.full_key(TASK1 + "/device:GPU:1")
    # A type without an index is device 0; a bare device has no task.
    assert worker_devices.full_key(TASK1 + "/cpu") == \
        ("worker", 0, 1, "CPU", 0)
    assert worker_devices.full_key("/cpu:0")[:3] == (None, None, None)


def test_describe_says_what_lms_manages_and_where_swaps_go():
    assert CPU_WORKER.describe() == (
        "Worker 1 (%s) of a multi-worker strategy: LMS plans for its CPU "
        "%s/device:CPU:0 (the worker has no accelerator, so its replica "
        "computes there, as unplaced ops do on a machine without a GPU); "
        "swap operations go to %s/device:CPU:0" % (TASK1, TASK1, TASK1))
    assert GPU_WORKER.describe() == (
        "Worker 1 (%s) of a multi-worker strategy: LMS plans for its "
        "replica devices %s/device:GPU:0, %s/device:GPU:1; swap operations "
        "go to %s/device:CPU:0" % (TASK1, TASK1, TASK1, TASK1))
