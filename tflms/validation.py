"""The checks behind `tflms.settings.Settings`: Python value -> normalised
value, or a `ValueError` naming the setting, the value and what is allowed.

Each field of `Settings` names its check here directly. Standard library
only (devices are parsed by `tflms.devices`, without TensorFlow), so the
example scripts, which load the settings to build their ``--help``, load
neither TensorFlow nor numpy, and the settings import nothing that imports
them back.
"""

import math
import numbers
import sys

from tflms import devices
from tflms import hardware

# A swap parameter set to AUTO is chosen by the auto-tuner (also
# `tflms.settings.AUTO`, where users read it).
AUTO = -1

__all__ = [
    "AUTO",
    "check_threshold",
    "check_ahead",
    "check_groupby",
    "check_sync_mode",
    "check_bool",
    "check_recompute",
    "check_debug_level",
    "check_serialization_by_size",
    "check_cpu_device",
    "check_gpu_not_host",
    "check_gpu_device",
    "check_batch_size",
    "check_gpu_mem",
    "check_host_mem",
    "check_gpu",
    "check_interconnect",
    "check_name_set",
    "check_plot_dir",
    "check_offload_optimizer",
]



def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_positive_real(value):
    """A finite number > 0 (a bool is no number here)."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def check_threshold(value):
    if not _is_int(value) or (value < 1 and value != AUTO):
        raise ValueError(
            "swapout_threshold must be a positive int or -1 (auto); got %r"
            % (value,))
    return int(value)


def check_ahead(value):
    if not _is_int(value) or (value < 1 and value != AUTO):
        raise ValueError(
            "swapin_ahead must be a positive int or -1 (auto); got %r. "
            "(1 starts a swap-in as late as possible, right before its "
            "consumer's level)" % (value,))
    return int(value)


def check_groupby(value):
    if not _is_int(value) or (value < 0 and value != AUTO):
        raise ValueError(
            "swapin_groupby must be an int >= 0 or -1 (auto); got %r"
            % (value,))
    return int(value)


def check_sync_mode(value):
    if not _is_int(value) or value not in (0, 1, 2, 3):
        raise ValueError(
            "sync_mode must be 0 (async), 1 (sync swap-outs), 2 (sync "
            "swap-ins) or 3 (both); got %r" % (value,))
    return int(value)


def _is_numpy_bool(value):
    # A numpy bool can exist only once numpy is loaded: asking sys.modules
    # keeps this module from loading numpy itself.
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.bool_)


def check_bool(name, value):
    # None is refused: is_training=None would silently plan for inference.
    if isinstance(value, bool) or _is_numpy_bool(value) or (
            _is_int(value) and value in (0, 1)):
        return bool(value)
    raise ValueError("%s must be True or False; got %r" % (name, value))


def check_recompute(value):
    # None is the default: recompute when auto-tuning, where each recompute
    # is judged by the predicted step, and not with fixed parameters.
    if value is None:
        return None
    if isinstance(value, bool) or _is_numpy_bool(value) or (
            _is_int(value) and value in (0, 1)):
        return bool(value)
    raise ValueError(
        "recompute must be None (recompute where it shortens an auto-tuned "
        "plan's predicted step), True (also with fixed parameters) or "
        "False (never); got %r" % (value,))


def check_debug_level(value):
    if not _is_int(value) or value not in (1, 2):
        raise ValueError("debug_level must be 1 or 2; got %r" % (value,))
    return int(value)


def check_serialization_by_size(value):
    if (not isinstance(value, numbers.Real) or isinstance(value, bool)
            or math.isnan(value) or value < 0):
        raise ValueError(
            "serialization_by_size must be a number of GiB >= 0 (0 turns it "
            "off); got %r" % (value,))
    return float(value)


def _parse_device(name, value):
    if not isinstance(value, str) or not value:
        raise ValueError("%s must be a device string such as '/cpu:0'; got %r"
                         % (name, value))
    try:
        return devices.parse_user_device(value)
    except devices.DeviceStringError as e:
        raise ValueError("%s=%r is not a device string (%s); use e.g. "
                         "'/cpu:0' or '/device:GPU:1'"
                         % (name, value, e.reason)) from None


def check_cpu_device(value):
    spec = _parse_device("cpu_device", value)
    if spec.device_type != "CPU":
        raise ValueError("cpu_device must name a CPU device such as '/cpu:0';"
                         " got %r" % (value,))
    return value


def check_gpu_device(value):
    if value is None:
        return None
    spec = _parse_device("gpu_device", value)
    if spec.device_type is None:
        raise ValueError(
            "gpu_device must name a device type and index such as "
            "'/device:GPU:0' (or be None for every device but the host "
            "cpu_device); got %r"
            % (value,))
    return value


def check_gpu_not_host(gpu_device, cpu_device):
    """`gpu_device` may name any device but the host, ``cpu_device``
    (`target.Target.manages`: a logical CPU beside the host is managed as
    a GPU is)."""
    if gpu_device is not None and devices.same_device(gpu_device,
                                                      cpu_device):
        raise ValueError(
            "gpu_device must name an accelerator such as '/device:GPU:0', "
            "or a CPU other than the host cpu_device=%r (or be None for "
            "every device but the host); got %r" % (cpu_device, gpu_device))


def check_batch_size(value):
    if value is None:
        return None
    if not _is_int(value) or value < 1:
        raise ValueError("batch_size must be a positive int or None; got %r"
                         % (value,))
    return int(value)


def check_gpu_mem(value):
    if value is None:
        return None
    if not _is_positive_real(value):
        raise ValueError(
            "autotune_gpu_mem must be a positive number of GiB or None (use "
            "the GPU's own memory); got %r" % (value,))
    return float(value)


def check_host_mem(value):
    if value is None:
        return None
    if not _is_positive_real(value):
        raise ValueError(
            "autotune_host_mem must be a positive number of GiB or None (this "
            "machine's physical memory divided by the processes on it); got "
            "%r" % (value,))
    return float(value)


def check_gpu(value):
    if value not in hardware.GPUS:
        raise ValueError(
            "gpu must be one of %s (the GPU whose op times pace the copies "
            "when counting their memory); got %r"
            % (", ".join(hardware.GPUS), value))
    return value


def check_interconnect(value):
    if value != hardware.INSTANT.name and value not in hardware.INTERCONNECTS:
        raise ValueError(
            "interconnect must be one of %s, or %r to count copies as "
            "taking no time; got %r" % (
                ", ".join(hardware.INTERCONNECTS), hardware.INSTANT.name,
                value))
    return value


def check_name_set(name, value):
    """Filters take a set (or list/tuple) of strings; a bare string is
    refused because it would be read as a set of characters."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(
            "%s must be a set of strings, e.g. {'conv1'}; got %r"
            % (name, value))
    items = frozenset(value)
    bad = sorted(repr(v) for v in items if not isinstance(v, str) or not v)
    if bad:
        raise ValueError("%s must hold non-empty strings; got %s"
                         % (name, ", ".join(bad)))
    return items


def check_plot_dir(name, value):
    if not isinstance(value, str) or not value:
        raise ValueError("%s must be a folder path; got %r" % (name, value))
    return value



def check_offload_optimizer(value):
    if isinstance(value, str) and value == "auto":
        return value
    if isinstance(value, bool) or _is_numpy_bool(value) or (
            _is_int(value) and value in (0, 1)):
        return bool(value)
    raise ValueError(
        "offload_optimizer must be True (optimizer slots and updates on "
        "the host, cpu_device), 'auto' (there only when no plan fits "
        "without) or False (on the device, the default); got %r"
        % (value,))
