"""Device strings, read without TensorFlow.

The analysis compares the placement of every op, the settings check the
devices users name, and a literal graph (`graph_index.from_edges`) has no
TensorFlow behind it: all of them parse device strings here, the way
`tf.DeviceSpec.from_string` does (`tests/test_graph_index.py` checks the
two agree). Standard library only.
"""

import collections
import functools

from tflms.errors import LMSError

__all__ = ["DeviceKey", "DeviceStringError", "parse_device",
           "parse_user_device", "is_cpu_device", "same_device",
           "SHORT_FORM_TYPES"]


class DeviceKey(collections.namedtuple(
        "DeviceKey", ["job", "replica", "task", "device_type",
                      "device_index"])):
    """A parsed device string; None for each part it does not give.
    `device_type` is upper case ('CPU', 'GPU'...)."""


_DEVICE_FIELDS = ("job", "replica", "task")


class DeviceStringError(LMSError, ValueError):
    """A string that cannot be a device string.

    Attributes:
      device: the string.
      reason: why, for messages that name the setting it came from.
    """

    def __init__(self, device, reason):
        super().__init__(
            "device string %r cannot be parsed (%s); use a string such as "
            "'/device:GPU:0' or '/job:worker/task:1/device:CPU:0'"
            % (device, reason))
        self.device = device
        self.reason = reason


@functools.lru_cache(maxsize=1024)
def parse_device(device):
    """Parse a device string as `tf.DeviceSpec.from_string` does, without
    TensorFlow: the analysis compares placements of every op, and a literal
    graph has no TensorFlow behind it.

    Accepts ``/job:<name>/replica:<int>/task:<int>/device:<TYPE>:<int|*>``
    with every part optional, and the short forms ``/cpu:0``, ``/GPU:1``,
    ``/GPU``. Short forms of other names are taken as device types (pluggable
    devices such as ``/XPU:0``), which TensorFlow checks against the devices
    it has; an op's device string has passed that check already.

    Args:
      device: a device string ('' or None: no part given).

    Returns:
      A `DeviceKey`.

    Raises:
      DeviceStringError: (a ValueError) if the string cannot be a device
        string.
    """
    parts = {"job": None, "replica": None, "task": None}
    device_type = device_index = None
    for piece in (device or "").split("/"):
        if not piece:
            continue
        y = piece.split(":")
        try:
            if len(y) == 2 and y[0] in _DEVICE_FIELDS:
                parts[y[0]] = y[1] if y[0] == "job" else int(y[1])
                continue
            if len(y) == 3 and y[0] == "device":
                kind, index = y[1], y[2]
            elif len(y) in (1, 2) and y[0] not in _DEVICE_FIELDS + (
                    "device",) and y[0].isidentifier():
                kind, index = y[0], (y[1] if len(y) == 2 else "*")
            else:
                raise ValueError("unknown part %r" % piece)
            if device_type is not None:
                raise ValueError("two device types")
            device_type = kind.upper()
            device_index = None if index == "*" else int(index)
        except ValueError as e:
            raise DeviceStringError(device, str(e)) from None
    return DeviceKey(parts["job"], parts["replica"], parts["task"],
                     device_type, device_index)


# Device types TensorFlow takes in a short form (``/gpu:0``) without asking
# its runtime (`tf.DeviceSpec`'s fixed list); the short form of a pluggable
# device's type is checked against the devices the runtime has.
SHORT_FORM_TYPES = frozenset({"CPU", "GPU", "TPU", "CUSTOM", "EPU"})


def parse_user_device(device):
    """`parse_device` for a string a user wrote (a setting): a short form
    must name one of `SHORT_FORM_TYPES`, as TensorFlow requires of a short
    form unless a pluggable device of that type is installed, which only
    TensorFlow's runtime knows. An op's device string has passed that check
    already; a user's has not, so ``'garbage'`` is refused here rather than
    read as a device type.

    Raises:
      DeviceStringError: as `parse_device`, and for an unknown short form
        (the long form ``/device:XPU:0`` names any type).
    """
    for piece in (device or "").split("/"):
        kind = piece.split(":")[0]
        if (piece and kind not in _DEVICE_FIELDS + ("device",)
                and kind.upper() not in SHORT_FORM_TYPES):
            raise DeviceStringError(
                device, "unknown device type %r; name another type in full, "
                "as in '/device:XPU:0'" % kind)
    return parse_device(device)


def is_cpu_device(device):
    """True if a device string names a CPU (``/cpu:0``,
    ``/device:CPU:0``...)."""
    if not device:
        return False
    return parse_device(device).device_type == "CPU"


def same_device(device, other):
    """True if two device strings name one device: the same type and
    index (a missing index is 0), and the same job, replica and task where
    both name them (``'/cpu:0'`` is the CPU of whatever task runs it)."""
    if not device or not other:
        return False
    a, b = parse_device(device), parse_device(other)
    for field in ("job", "replica", "task"):
        x, y = getattr(a, field), getattr(b, field)
        if x is not None and y is not None and x != y:
            return False
    return (a.device_type == b.device_type
            and (a.device_index or 0) == (b.device_index or 0))
