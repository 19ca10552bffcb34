"""The optimizer's updates on the host (``offload_optimizer``) in a
predicted step: their copies on the link and their time on the host.

`tflms.offload` moves each offloaded update to the host; per update the
step then (`tflms.tf.offload_rewrite` makes the ops):

* copies the weights from the device to the host copy. Nothing in the
  step comes before that copy (the variable's read and the host copy's
  fill have no other input), so these copies go first on the
  device-to-host stream, at the start of the step; an element-wise update
  (`offload.Update.host_ops`, Keras 3's) copies them only when it reads
  the variable (`Update.reads_weights`);
* copies the gradient to the host once it is made, on the same stream
  after what is queued there (swap-outs included);
* runs the update on the host once both have arrived, updates one after
  another (`HostUpdates` is one host stream): the bytes its ops touch
  (`OpCosts.bytes_touched`: the fused kernel's weights and slots read
  and written, the gradient read; each element-wise op's tensors and
  slot writes) at `hardware.HOST_UPDATE_RATE`, plus its overhead per op
  (`Update.moved_ops`: the fused kernel, or each op of an element-wise
  update);
* copies the new weights back on the host-to-device stream once the
  update has finished, queued with the swap-ins; the ops that waited for
  the update on the device (the train op, Adam's step counters) wait for
  that copy, and so does an element-wise update's write of the variable
  (`Update.apply`), which reads the new value.

So the copies and host updates overlap the backward phase as far as the
gradients allow: an update waits for its own gradient only. Pure: plain
data, like the rest of `tflms.steptime`.
"""

import dataclasses

__all__ = ["HostUpdates", "HostUpdateTiming", "WRITE_BACK"]

# First element of a write-back's key on the host-to-device stream (a
# swap-in's key is ``(swap, k)``).
WRITE_BACK = "write_back"


@dataclasses.dataclass(frozen=True)
class HostUpdateTiming:
    """When one offloaded update's copies and host compute ran (seconds).

    Attributes:
      apply: the update op's id.
      gradient: ``(producer, output)`` of the gradient it reads.
      gradient_bytes, weight_bytes: bytes of its gradient and variable.
      host_s: its time on the host.
      weights_out_start_s, weights_out_end_s: the weights to the host
        copy, on the device-to-host stream.
      gradient_out_start_s, gradient_out_end_s: the gradient, on that
        stream.
      host_start_s, host_end_s: the update on the host.
      back_start_s, back_end_s: the new weights to the device, on the
        host-to-device stream.
    """

    apply: int
    gradient: tuple
    gradient_bytes: int
    weight_bytes: int
    host_s: float
    weights_out_start_s: float
    weights_out_end_s: float
    gradient_out_start_s: float
    gradient_out_end_s: float
    host_start_s: float
    host_end_s: float
    back_start_s: float
    back_end_s: float


class HostUpdates:
    """The offloaded updates of one step, timed as the step is walked.

    Args:
      index: the planning index (`offload.planning_index`: the updates on
        the host).
      updates: the `offload.Offload.updates` (op ids of `index`).
      gradient_bytes: ``(producer, output) -> bytes``.
      host_seconds: ``op id -> seconds`` of one of an update's
        `moved_ops` on the host; an update's time is their sum.
      runs: per op, whether it runs in the step.

    Attributes:
      by_producer: op -> updates whose gradient it makes.
      waiting: op -> write-back keys it waits for (the ops that had a
        control input on the update, or read it).
      free: when the host has finished its last update so far.
    """

    def __init__(self, index, updates, gradient_bytes, host_seconds, runs):
        self._updates = tuple(updates)
        self._gradient = [gradient_bytes(*u.gradient) for u in updates]
        self._weights = [index.variable_bytes[u.variable] for u in updates]
        self._weights_out = [w if u.reads_weights else 0
                             for w, u in zip(self._weights, updates)]
        self._host_s = [sum(host_seconds(op) for op in u.moved_ops)
                        for u in updates]
        self.by_producer = {}
        self.waiting = {}
        for n, u in enumerate(self._updates):
            producer = u.gradient[0]
            if runs[producer]:
                self.by_producer.setdefault(producer, []).append(n)
            if u.fused:
                readers = set(index.control_outputs[u.apply])
                for consumers in index.consumers[u.apply]:
                    readers.update(c for c, _ in consumers)
            else:
                # The device's write of the variable reads the new value.
                readers = {u.apply}
            for op in readers:
                self.waiting.setdefault(op, []).append((WRITE_BACK, n))
        self.free = 0.0
        self._times = [None] * len(self._updates)

    @property
    def count(self):
        return len(self._updates)

    @property
    def out_bytes(self):
        """Bytes to the host per step: the gradients and the weights the
        updates read."""
        return sum(self._gradient) + sum(self._weights_out)

    @property
    def in_bytes(self):
        """Bytes back to the device per step: the new weights."""
        return sum(self._weights)

    @property
    def host_s(self):
        """The host's busy time per step."""
        return sum(self._host_s)

    def start(self, rate, stream):
        """Queue the weights' copies at the start of the step on the
        device-to-host stream (`rate` bytes/s); updates whose gradient no
        running op makes are ready then too. Returns when that stream is
        free."""
        free = 0.0
        for n in range(self.count):
            start, free = free, free + self._weights_out[n] / rate
            self._times[n] = [start, free]
        timed = {n for ns in self.by_producer.values() for n in ns}
        for n in range(self.count):
            if n not in timed:
                self._gradient_at(n, 0.0, 0.0, stream)
        return free

    def gradient_made(self, producer, when, d2h_free, rate, stream):
        """`producer` finished at `when`: copy its gradients out after
        `d2h_free` and run their updates. Returns when the device-to-host
        stream is free."""
        for n in self.by_producer[producer]:
            start = max(when, d2h_free)
            d2h_free = start + self._gradient[n] / rate
            self._gradient_at(n, start, d2h_free, stream)
        return d2h_free

    def _gradient_at(self, n, start, end, stream):
        times = self._times[n]
        times.extend((start, end))
        host_start = max(end, times[1], self.free)
        self.free = host_start + self._host_s[n]
        times.extend((host_start, self.free))
        stream.ready((WRITE_BACK, n), self.free, self._weights[n])

    def timings(self, stream):
        """A `HostUpdateTiming` per update, once the step has been
        walked (`stream`: its host-to-device stream)."""
        timings = []
        for n, u in enumerate(self._updates):
            _, back_start, back_end = stream.in_times[(WRITE_BACK, n)]
            timings.append(HostUpdateTiming(
                u.apply, u.gradient, self._gradient[n], self._weights[n],
                self._host_s[n], *self._times[n], back_start, back_end))
        return tuple(timings)
