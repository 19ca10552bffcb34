"""What the oracle reports: `OracleResult` and the tensors and copies it
lists."""

import dataclasses
from typing import Optional

from tflms.tf.oracle.virtual_cluster import GPU_DEVICE


@dataclasses.dataclass(frozen=True)
class LiveTensor:
    """One tensor live at a device's memory peak.

    Attributes:
      name: ``"node:port"`` of the tensor. For a GPU copy of a CPU tensor this
        is the scheduler's ``Recv_...`` node.
      nbytes: bytes allocated for it.
      alloc_ns: allocation time in the replay, nanoseconds.
      dealloc_ns: deallocation time in the replay, nanoseconds.
      transferred: True for a GPU copy of a tensor produced on another device.
      variable: True for a variable resident for the whole step (only in
        ``runtime_live_at_peak``); ``name`` is then the variable's node.
    """

    name: str
    nbytes: int
    alloc_ns: int
    dealloc_ns: int
    transferred: bool = False
    variable: bool = False


@dataclasses.dataclass(frozen=True)
class Transfer:
    """A copy of a tensor onto the GPU inserted by the virtual scheduler.

    Attributes:
      source: ``"node:port"`` of the tensor on the producing device.
      recv_node: name of the scheduler's ``_Recv`` node on the GPU.
      nbytes: size of the copy.
      start_ns: when the copy is allocated on the GPU.
      raw_end_ns: when ``DeterminePeakMemoryUsage`` frees it.
      corrected_end_ns: when the corrected replay frees it (after its last
        GPU consumer).
      consumers: GPU nodes that read the copy.
    """

    source: str
    recv_node: str
    nbytes: int
    start_ns: int
    raw_end_ns: int
    corrected_end_ns: int
    consumers: tuple


@dataclasses.dataclass(frozen=True)
class TimedCopy:
    """A copy between the GPU and the host, timed on a link.

    Only ``peak_memory(..., interconnect=...)`` makes these. Times are the
    virtual cluster's model times (see the `tflms.tf.oracle` docstring),
    nanoseconds.

    Attributes:
      tensor: ``"node:port"`` of the tensor copied, on the device it leaves:
        the GPU tensor a CPU op (an LMS swap-out) reads, or the CPU tensor
        (an LMS swap-in) a GPU op reads.
      to_host: True for a device-to-host copy, False for host-to-device.
      nbytes: bytes copied.
      ready_ns: when the copy could start. Device to host: when the first
        CPU op reading the tensor starts. Host to device: when the GPU
        copy is allocated (the host sends the tensor: the swap-in op has
        ended, or the scheduler's ``_Recv`` on the GPU starts, if that is
        earlier), and not before the device-to-host copy of the same data
        (its swap-out's) has ended.
      start_ns: when it starts on its direction's FIFO copy stream.
      end_ns: ``start_ns`` plus ``nbytes`` at the link's rate, rounded up.
      buffer: ``"node:port"`` of the GPU buffer the copy holds (the source
        for device to host, the ``_Recv`` copy for host to device), or
        ``""`` if it holds none (a variable's buffer is resident anyway).
    """

    tensor: str
    to_host: bool
    nbytes: int
    ready_ns: int
    start_ns: int
    end_ns: int
    buffer: str = ""


@dataclasses.dataclass(frozen=True)
class OracleResult:
    """What the oracle measured for one graph.

    Attributes:
      gpu_peak_bytes: corrected GPU peak (see the `tflms.tf.oracle` docstring).
      raw_gpu_peak_bytes: GPU peak from ``Cluster.DeterminePeakMemoryUsage``.
      replayed_raw_gpu_peak_bytes: the oracle's own replay without the
        correction; equal to ``raw_gpu_peak_bytes`` unless TensorFlow's
        accounting changed.
      host_peak_bytes: CPU peak from ``DeterminePeakMemoryUsage``. It keeps a
        CPU tensor alive until its GPU readers finish, so it is an upper
        bound for the host memory LMS needs.
      scheduler_gpu_peak_bytes: the virtual scheduler's own GPU count
        (non-persistent tensors only), or None if not requested.
      live_at_peak: tensors live at the corrected GPU peak, largest first.
      raw_live_at_peak: tensors live at the raw GPU peak, largest first.
      transfers: copies onto the GPU, in order of their start time.
      run_time_s: the cost model's estimate of the step time.
      gpu_memory_bytes: the capacity the graph is judged against, or None.
      gpu_device: the full name of the simulated GPU.
      runtime_gpu_peak_bytes: GPU peak of the same schedule under the
        TensorFlow runtime's buffer rules (forwarding, resident variables,
        release when the last reader is launched, swapped-in copies
        allocated when sent; see the `tflms.tf.oracle` docstring).
      runtime_live_at_peak: buffers live at the runtime peak, largest first;
        variables have ``variable=True``.
      runtime_peak_ns: when (model time, ns) the runtime replay reached
        ``runtime_gpu_peak_bytes``.
      interconnect: the link the runtime replay timed copies on: a name
        from `tflms.hardware.INTERCONNECTS`, ``"<rate> B/s"`` for a rate
        given as a number, or None for instant copies (the default).
      interconnect_bytes_per_s: that link's rate per direction, or None.
      timed_copies: the copies the runtime replay timed, `TimedCopy`, in
        order of their start (device to host first at equal starts); empty
        without ``interconnect``.
    """

    gpu_peak_bytes: int
    raw_gpu_peak_bytes: int
    replayed_raw_gpu_peak_bytes: int
    host_peak_bytes: int
    scheduler_gpu_peak_bytes: Optional[int]
    live_at_peak: tuple
    raw_live_at_peak: tuple
    transfers: tuple
    run_time_s: float
    gpu_memory_bytes: Optional[int]
    gpu_device: str = GPU_DEVICE
    runtime_gpu_peak_bytes: int = 0
    runtime_live_at_peak: tuple = ()
    runtime_peak_ns: int = 0
    interconnect: Optional[str] = None
    interconnect_bytes_per_s: Optional[float] = None
    timed_copies: tuple = ()

    @property
    def correction_bytes(self) -> int:
        """How much the blind-spot correction added to the GPU peak."""
        return self.gpu_peak_bytes - self.raw_gpu_peak_bytes

    @property
    def fits(self) -> Optional[bool]:
        """Whether the corrected peak fits ``gpu_memory_bytes`` (None if
        unset)."""
        if self.gpu_memory_bytes is None:
            return None
        return self.gpu_peak_bytes <= self.gpu_memory_bytes

    def largest_live_tensors(self, k: int = 10) -> list:
        """Names of the ``k`` largest tensors live at the corrected peak."""
        return [t.name for t in self.live_at_peak[:k]]
