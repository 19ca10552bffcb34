"""The device and host budgets (tflms/budget.py): autotune_gpu_mem or the
GPU's memory times the ratio, the GPU a process plans for, the host memory
shared by a node's processes; and the device lister the TensorFlow wing
registers, without which only autotune_gpu_mem gives the device budget."""

import json
import os
import subprocess
import sys

import pytest

from tflms import autotune
from tflms import budget

from tests import _literal as L

EXACT = {autotune.MEM_RATIO_ENV: "1"}  # budget == autotune_gpu_mem exactly


class FakeDevice:
    def __init__(self, name, device_type, memory_limit):
        self.name, self.device_type = name, device_type
        self.memory_limit = memory_limit


def test_budget_from_autotune_gpu_mem_and_ratio():
    assert autotune.device_budget(2.0, env={}) == int(2 * 0.9 * (1 << 30))
    env = {autotune.MEM_RATIO_ENV: "0.5"}
    assert autotune.device_budget(2.0, env=env) == 1 << 30


def test_bad_ratio_names_the_variable():
    with pytest.raises(ValueError, match="TF_LMS_SIMULATOR_MEM_RATIO='2'"):
        autotune.device_budget(1.0, env={autotune.MEM_RATIO_ENV: "2"})


def test_no_gpu_and_no_budget_is_an_error():
    with pytest.raises(autotune.NoGpuError) as err:
        autotune.device_budget(None, env={}, list_devices=lambda: [
            FakeDevice("/device:CPU:0", "CPU", 1 << 34)])
    assert "no GPU" in str(err.value)
    assert "lms.autotune_gpu_mem = <GiB" in str(err.value)
    assert "by hand" in str(err.value)

def test_gpu_budget_picks_the_device_or_the_local_rank():
    devices = [FakeDevice("/device:CPU:0", "CPU", 1 << 34),
               FakeDevice("/device:GPU:0", "GPU", 1000),
               FakeDevice("/device:GPU:1", "GPU", 2000)]
    lister = lambda: devices  # noqa: E731
    assert autotune.device_budget(None, env=EXACT,
                                  list_devices=lister) == 1000
    assert autotune.device_budget(None, "/device:GPU:1", env=EXACT,
                                  list_devices=lister) == 2000
    env = dict(EXACT, HOROVOD_LOCAL_RANK="1")
    assert autotune.device_budget(None, env=env, list_devices=lister) == 2000
    env = dict(EXACT, OMPI_COMM_WORLD_LOCAL_RANK="1")
    assert autotune.device_budget(None, env=env, list_devices=lister) == 2000
    # The ratio applies to the local rank's GPU; a GPU named explicitly
    # wins over the local rank; a rank past the GPUs has none.
    env = {"HOROVOD_LOCAL_RANK": "1", autotune.MEM_RATIO_ENV: "0.5"}
    assert autotune.device_budget(None, env=env, list_devices=lister) == 1000
    env = dict(EXACT, HOROVOD_LOCAL_RANK="1")
    assert autotune.device_budget(None, "/device:GPU:0", env=env,
                                  list_devices=lister) == 1000
    with pytest.raises(autotune.NoGpuError, match="wants GPU 2"):
        autotune.device_budget(None, env=dict(EXACT, HOROVOD_LOCAL_RANK="2"),
                               list_devices=lister)


def test_rank_with_one_visible_gpu_uses_it():
    # CUDA_VISIBLE_DEVICES set per rank: local rank 3 sees one GPU, GPU:0.
    devices = [FakeDevice("/device:CPU:0", "CPU", 1 << 34),
               FakeDevice("/device:GPU:0", "GPU", 1000)]
    env = dict(EXACT, HOROVOD_LOCAL_RANK="3")
    assert autotune.device_budget(None, env=env,
                                  list_devices=lambda: devices) == 1000
    # Asked for a GPU by name, a missing one is still an error.
    with pytest.raises(autotune.NoGpuError, match="wants GPU 3"):
        autotune.device_budget(None, "/device:GPU:3", env=env,
                               list_devices=lambda: devices)


def test_host_budget_is_shared_by_local_ranks():
    one = autotune.host_budget({})
    assert one > 0
    for var in ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        assert autotune.host_budget({var: "4"}) == one // 4
    # Two workers of a TF_CONFIG cluster on this machine, one elsewhere.
    workers = {"TF_CONFIG": json.dumps({
        "cluster": {"worker": ["127.0.0.1:5", "localhost:6", "other:7"]},
        "task": {"type": "worker", "index": 0}})}
    assert autotune.host_budget(workers) == one // 2


def test_host_budget_is_autotune_host_mem_when_set_else_physical_memory():
    # conftest makes the machine a 64 GiB host; the real reading is kept.
    assert budget.host_budget({}) == 64 << 30
    assert budget.host_budget({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}) == 32 << 30
    assert budget.host_budget({"HOROVOD_LOCAL_SIZE": "4"}, 1.5) == 3 << 29
    context = L.context(L.chain(), budget_units=5, autotune_host_mem=2)
    assert context.budgets.host_bytes == 2 << 30
    assert L.context(L.chain(), budget_units=5).budgets.host_bytes == 64 << 30


def test_physical_memory_is_pages_times_page_size_or_unknown(monkeypatch):
    """The page count times the page size; 0 (no host limit) where the
    system cannot tell, as on platforms without sysconf."""
    monkeypatch.undo()  # conftest's 64 GiB host, for this test only
    values = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 3}
    monkeypatch.setattr(os, "sysconf", values.__getitem__)
    assert budget.physical_memory() == 12288
    assert budget.host_budget(env={}) == 12288

    def unknown(name):
        raise ValueError("unknown configuration name %s" % name)
    monkeypatch.setattr(os, "sysconf", unknown)
    assert budget.physical_memory() == 0
    assert budget.host_budget(env={}) == 0
    monkeypatch.delattr(os, "sysconf")
    assert budget.physical_memory() == 0




def test_the_tensorflow_wing_registers_its_device_lister():
    import tflms.tf
    assert budget._device_lister is tflms.tf.local_devices
    kinds = {d.device_type for d in tflms.tf.local_devices()}
    assert "CPU" in kinds


def test_without_the_wing_only_autotune_gpu_mem_gives_the_budget():
    """A process that never loads tflms.tf (the pure core planning a
    literal graph) has no device list: the error says to set the budget."""
    code = (
        "import sys\n"
        "from tflms import budget\n"
        "print(budget.device_budget(2.0, env={budget.MEM_RATIO_ENV: '1'}))\n"
        "try:\n"
        "    budget.device_budget(None, env={})\n"
        "except budget.NoGpuError as e:\n"
        "    print('ERROR', e)\n"
        "print('tensorflow' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[0] == str(2 << 30)
    assert out[1] == (
        "ERROR LMS auto-tuning needs the GPU memory size, and no device "
        "list is available in this process (TensorFlow was not loaded by "
        "tflms). Set autotune_gpu_mem = <GiB of the GPU you plan for>.")
    assert out[2] == "False"


def test_the_gpu_index_is_read_without_tensorflow():
    devices = [FakeDevice("/device:GPU:0", "GPU", 1000),
               FakeDevice("/device:GPU:2", "GPU", 3000)]
    assert budget.device_budget(None, "/job:worker/task:1/device:GPU:2",
                                env=EXACT,
                                list_devices=lambda: devices) == 3000
    assert budget.device_budget(None, "/gpu:2", env=EXACT,
                                list_devices=lambda: devices) == 3000
