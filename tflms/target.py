"""What the machine that runs a step decides for its plan: the `Target`.

The graph index says what the step is; the target says where and how it
runs: the device planned, the host the swap ops go to, the worker of a
multi-worker strategy, whether its kernels are oneDNN's CPU kernels and
which of TensorFlow's run-time merges LMS leaves whole. Each adapter
decides it once for its step (`tflms.tf.adapters`), and the op
classification (`analysis.classify_ops`) and the planning pipeline
(`pipeline.plan`) take it. Pure: standard library and tflms' pure
modules only, so a literal graph plans with a target made by hand.

The device rule lives here (`Target.manages`): the host is ``cpu_device``
and every other device the step computes on is managed, a logical
``/cpu:1`` included, so a CPU split into logical devices plans as GPUs
would.
"""

import dataclasses
from typing import TYPE_CHECKING, Optional

from tflms import devices

if TYPE_CHECKING:
    from tflms.offload import Offload
    from tflms.worker_devices import WorkerDevices

__all__ = ["Target"]


@dataclasses.dataclass(frozen=True)
class Target:
    """Where and how a step runs, as its plan needs to know.

    Attributes:
      device: the device planned (``gpu_device``, or one replica's device
        of a step planned device by device); None: every device `manages`
        answers True for.
      host: ``cpu_device``, where the swap ops go: the one CPU that is not
        managed (`swap_device` for a worker's full name).
      worker: the `worker_devices.WorkerDevices` of a step on one worker
        of a multi-worker strategy (its replica devices are what is
        managed, its host where the swap ops go); None otherwise.
      onednn_cpu: the step runs on oneDNN's CPU kernels (oneDNN on and no
        GPU): the remapper makes one ``_MklSwish`` of a swish, and a
        MaxPoolGrad reads its pool's workspace (`fusions.grappler_groups`).
      grappler_groups: LMS swaps nothing out of, and adds no control edge
        to, the ops Grappler merges with a neighbour
        (`fusions.grappler_groups`), so the step trains bit for bit as
        without LMS: every adapter's step, a Session graph's as a
        tf.function's (`tflms.tf.adapters.graph_step.step_target`); off
        only in a target made by hand (a literal graph's).
      offload: the optimizer's updates that run on the host
        (``offload_optimizer``): the `tflms.offload.Offload` the planning
        index was made with (`offload.planning_index`), whose copies and
        host compute every predicted step counts; None: every update runs
        where its variable is.
    """

    device: Optional[str] = None
    host: str = "/cpu:0"
    worker: Optional["WorkerDevices"] = None
    onednn_cpu: bool = False
    grappler_groups: bool = False
    offload: Optional["Offload"] = None

    @classmethod
    def of(cls, settings, **changes):
        """The target of `settings` (its ``gpu_device`` and
        ``cpu_device``), with `changes` to the other fields."""
        return cls(device=settings.gpu_device, host=settings.cpu_device,
                   **changes)

    def replace(self, **changes):
        """A copy with `changes`."""
        return dataclasses.replace(self, **changes)

    @property
    def swap_device(self):
        """The device of the swap ops (and of offloaded updates): the
        worker's own host by its full name, else `host`."""
        return self.host if self.worker is None else self.worker.host

    def is_host(self, device):
        """True if `device` is the host: `host` (or, on a worker, any CPU
        that is not one of its replica devices)."""
        if not devices.is_cpu_device(device):
            return False
        if self.worker is not None:
            return not self.worker.computes_on(device)
        return devices.same_device(device, self.host)

    def manages(self, device):
        """True if LMS plans for the ops placed on `device`.

        Every device but the host is managed, including the empty
        (unplaced) device string, which TensorFlow places on the GPU when
        one exists, or on the only CPU; a logical ``/cpu:1`` beside the
        host ``/cpu:0`` is managed as a GPU is. On a worker of a
        multi-worker strategy, a CPU is managed when the strategy runs a
        replica there (`worker_devices.WorkerDevices.computes_on`, full
        names compared). With `device` set, only the ops placed on that
        device are (job, replica and task compared where both name them;
        an unplaced op is not).
        """
        if self.is_host(device):
            return False
        if self.device is None:
            return True
        if not device:
            return False
        have = devices.parse_device(device)
        want = devices.parse_device(self.device)
        for field in ("job", "replica", "task"):
            a, b = getattr(have, field), getattr(want, field)
            if a is not None and b is not None and a != b:
                return False
        return ((have.device_type or "") == (want.device_type or "")
                and (have.device_index or 0) == (want.device_index or 0))
