"""Copies between the GPU and the host timed on a link, for the runtime
replay (``peak_memory(..., interconnect=...)``; the ``tflms.tf.oracle``
docstring)."""

import math
import numbers

from tflms import hardware
from tflms.tf.oracle.oracle_result import TimedCopy


def _link(interconnect):
    """``(name, bytes_per_s)`` of the `peak_memory` ``interconnect`` argument.

    None, ``"instant"`` and an infinite rate are instant copies:
    ``(None, None)``.

    Raises:
      ValueError: for an unknown link name or a rate that is not positive.
      TypeError: for anything but None, a name, an `Interconnect` or a
        number.
    """
    if interconnect is None:
        return None, None
    if isinstance(interconnect, (str, hardware.Interconnect)):
        link = hardware.interconnect_named(interconnect)
        if math.isinf(link.bytes_per_s):
            return None, None
        return link.name, float(link.bytes_per_s)
    if (isinstance(interconnect, numbers.Real)
            and not isinstance(interconnect, bool)):
        rate = float(interconnect)
        if not rate > 0:  # also rejects NaN
            raise ValueError(
                "interconnect must be a positive rate in bytes/s, got %r; "
                "pass e.g. 31.5e9 (PCIe 4.0 x16), a link name (%s) or None "
                "for instant copies"
                % (interconnect, ", ".join(hardware.INTERCONNECTS)))
        if math.isinf(rate):
            return None, None
        return "%g B/s" % rate, rate
    raise TypeError(
        "interconnect must be None, a link name (%s), a "
        "tflms.hardware.Interconnect or a rate in bytes/s; got %r"
        % (", ".join(hardware.INTERCONNECTS), interconnect))


def _fifo_stream(requests, bytes_per_s):
    """Times copies on one copy stream that runs them first in, first out.

    Args:
      requests: ``(ready_ns, tiebreak, key, nbytes)`` per copy. A copy
        starts when it is ready and every copy ready before it (at equal
        readiness: with a smaller tiebreak) has ended.
      bytes_per_s: the stream's rate.

    Returns:
      dict ``key -> (start_ns, end_ns)``; ends are rounded up to whole
      nanoseconds, so a copy of any bytes ends after it starts.
    """
    times = {}
    free = 0.0
    for ready, _, key, nbytes in sorted(requests, key=lambda r: r[:2]):
        start = max(float(ready), free)
        free = start + nbytes * 1e9 / bytes_per_s
        times[key] = (int(math.ceil(start)), int(math.ceil(free)))
    return times


def _hold_for_copies(step, live, to_host_ready, sent_from, bytes_per_s):
    """Times the step's copies and extends the GPU buffers they hold.

    Part of `_runtime_replay` (its names; `step` its `_RuntimeStep`):
    updates the release keys in `live` and returns the `TimedCopy` list,
    by start.
    """
    sizes, order = step.sizes, step.order
    gpu_buffer, host_copy_origin = step.gpu_buffer, step.host_copy_origin
    def name(key):
        return f"{key[0]}:{key[1]}"

    # Device to host, in the order the scheduler reached the reads.
    out_ready = dict(to_host_ready)
    out_times = _fifo_stream(
        [(ready, (order.get(key[0], 0), key), key, sizes.get(key, 0))
         for key, ready in out_ready.items()], bytes_per_s)

    # Host to device: the scheduler's _Recv copies. The runtime allocates
    # the GPU copy when it issues it (when the host tensor is sent), so a
    # copy queued behind others holds its memory while it waits; its data
    # cannot leave the host before it arrived there (a swap-in's copy
    # waits for its swap-out's).
    source_of = {recv: key for recv, key in sent_from.items() if recv in live}
    in_ready = {}
    for recv, source in source_of.items():
        ready = live[recv][0]  # when the copy was allocated and issued
        origin = host_copy_origin(source)
        if origin in out_times:
            ready = max(ready, out_times[origin][1])
        in_ready[recv] = ready
    in_times = _fifo_stream(
        [(ready, order.get(recv[0], 0), recv, sizes[recv])
         for recv, ready in in_ready.items()], bytes_per_s)

    # A copy's end releases like a zero-length op off the GPU: after
    # everything the GPU does at that nanosecond.
    copies = []
    for key, (start, end) in out_times.items():
        buffer = gpu_buffer(key)
        held = buffer is not None and buffer in live
        if held:
            live[buffer][1] = max(live[buffer][1], (end, 2, 0, 0))
        copies.append(TimedCopy(
            tensor=name(key), to_host=True, nbytes=int(sizes.get(key, 0)),
            ready_ns=int(out_ready[key]), start_ns=start, end_ns=end,
            buffer=name(buffer) if held else ""))
    for recv, (start, end) in in_times.items():
        live[recv][1] = max(live[recv][1], (end, 2, 0, 0))
        copies.append(TimedCopy(
            tensor=name(source_of[recv]), to_host=False,
            nbytes=int(sizes[recv]), ready_ns=int(in_ready[recv]),
            start_ns=start, end_ns=end, buffer=name(recv)))
    copies.sort(key=lambda c: (c.start_ns, not c.to_host, c.tensor))
    return copies
