"""How many bytes a plan may use: on the device it manages, and on the host.

The device budget is ``autotune_gpu_mem`` GiB, or the memory TensorFlow
reports for the GPU this process drives, times ``TF_LMS_SIMULATOR_MEM_RATIO``
(default 0.9: the allocator's own overhead and fragmentation need the rest).
The host budget is ``autotune_host_mem`` GiB, or the machine's physical
memory shared by the processes of this node.

This module imports no TensorFlow: the planning core reads budgets from
here. Asking TensorFlow for the GPU's memory is the TensorFlow wing's
(`tflms.tf.local_devices`), which registers itself here with
`register_device_lister` when the wing is imported; without it (a process
that plans literal graphs), only ``autotune_gpu_mem`` gives the device
budget.
"""

import os

from tflms.devices import parse_device
from tflms.errors import LMSError
from tflms import ranks

__all__ = ["MEM_RATIO_ENV", "DEFAULT_MEM_RATIO", "NoGpuError", "mem_ratio",
           "device_budget", "host_budget", "local_processes",
           "physical_memory"]

MEM_RATIO_ENV = "TF_LMS_SIMULATOR_MEM_RATIO"
DEFAULT_MEM_RATIO = 0.9
_GIB = float(1 << 30)


class NoGpuError(LMSError, ValueError):
    """The device budget is unknown: no GPU and no autotune_gpu_mem."""


def mem_ratio(env=None):
    """The share of device memory plans may use
    (``TF_LMS_SIMULATOR_MEM_RATIO``).

    Raises:
      ValueError: if the variable is not a number in (0, 1].
    """
    env = os.environ if env is None else env
    text = env.get(MEM_RATIO_ENV)
    if text is None or text == "":
        return DEFAULT_MEM_RATIO
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise ValueError(
            "%s=%r must be a number in (0, 1], the share of GPU memory LMS "
            "may plan for; unset it to use %.1f" % (MEM_RATIO_ENV, text,
                                                    DEFAULT_MEM_RATIO))
    return value


# The callable that lists this process's devices (each with name,
# device_type and memory_limit, as TensorFlow's DeviceAttributes), set by
# the TensorFlow wing; None where no TensorFlow was loaded.
_device_lister = None


def register_device_lister(lister):
    """Make `lister` (a callable returning the local devices' attributes)
    the source of the GPU's memory when ``autotune_gpu_mem`` is not set."""
    global _device_lister
    _device_lister = lister


def _list_local_devices():
    if _device_lister is None:
        raise NoGpuError(
            "LMS auto-tuning needs the GPU memory size, and no device list "
            "is available in this process (TensorFlow was not loaded by "
            "tflms). Set autotune_gpu_mem = <GiB of the GPU you plan for>.")
    return _device_lister()


def _gpu_index(gpu_device, env):
    if gpu_device:
        index = parse_device(gpu_device).device_index
        if index is not None:
            return index
    return ranks.rank_info(env).local_rank


def device_budget(gpu_mem_gib=None, gpu_device=None, env=None,
                  list_devices=None):
    """Device bytes a plan may use.

    Args:
      gpu_mem_gib: ``autotune_gpu_mem`` in GiB, or None to ask TensorFlow
        for the GPU's memory.
      gpu_device: the device LMS manages (its index picks the GPU); with
        None, the local rank's GPU under Horovod / MPI (or the only visible
        GPU, when the launcher gave each rank one), else GPU 0.
      env: environment mapping (default `os.environ`).
      list_devices: callable returning `DeviceAttributes` (for tests);
        default `device_lib.list_local_devices`.

    Returns:
      ``int(memory * mem_ratio(env))``.

    Raises:
      NoGpuError: with no GPU and no `gpu_mem_gib`.
    """
    env = os.environ if env is None else env
    ratio = mem_ratio(env)
    if gpu_mem_gib is not None:
        return int(gpu_mem_gib * _GIB * ratio)
    devices = (list_devices or _list_local_devices)()
    gpus = [d for d in devices if d.device_type == "GPU"]
    if not gpus:
        raise NoGpuError(
            "LMS auto-tuning needs the GPU memory size, but TensorFlow sees "
            "no GPU on this machine. Set lms.autotune_gpu_mem = <GiB of the "
            "GPU you plan for>, or set swapout_threshold, swapin_ahead and "
            "swapin_groupby by hand.")
    want = _gpu_index(gpu_device, env)
    chosen = None
    for d in gpus:
        if d.name.rsplit(":", 1)[-1] == str(want):
            chosen = d
    if chosen is None and gpu_device is None and len(gpus) == 1:
        # A launcher that sets CUDA_VISIBLE_DEVICES per rank leaves each
        # process one GPU, numbered 0 whatever the local rank.
        chosen = gpus[0]
    if chosen is None:
        raise NoGpuError(
            "LMS auto-tuning wants GPU %d (from gpu_device=%r or the local "
            "rank) but TensorFlow sees only %s. Set gpu_device to one of "
            "those, or set lms.autotune_gpu_mem = <GiB>."
            % (want, gpu_device, ", ".join(d.name for d in gpus)))
    return int(chosen.memory_limit * ratio)


def local_processes(env=None):
    """How many training processes share this node (1 without a launcher)."""
    return ranks.rank_info(env).local_size


def physical_memory():
    """This machine's physical memory in bytes (0 if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def host_budget(env=None, host_mem_gib=None):
    """Host bytes the swapped tensors of a plan may use at once.

    Args:
      env: environment mapping (default `os.environ`), for the number of
        processes on this node.
      host_mem_gib: ``autotune_host_mem`` in GiB, or None for this
        machine's physical memory divided by the processes on this node.

    Returns:
      Bytes; 0 when None was given and the physical memory is unknown (no
      host limit then).
    """
    if host_mem_gib is not None:
        return int(host_mem_gib * _GIB)
    return int(physical_memory() // local_processes(env))
