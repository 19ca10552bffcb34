"""An independent GPU memory oracle built on Grappler's virtual cluster.

LMS makes claims such as "this rewritten graph peaks at N bytes of GPU
memory". Those claims must be checked by something that does not share code
with the rewriter. This module asks TensorFlow itself: it hands the graph to a
Grappler *virtual* cluster (one simulated GPU and one simulated CPU, no real
hardware needed), which places every op, schedules it with an analytical cost
model and reports when each tensor is allocated and freed.

Users reach it through ``tflms plan --oracle`` (a second opinion on a
plan's predicted peak, before renting the GPU) or by calling `peak_memory`;
the tests and benchmarks use it to check the simulator. ``LMS.run`` never
calls it: it relies on private TensorFlow APIs
(``tensorflow.python.grappler``), which training must not depend on.

Four numbers come out of one call to `peak_memory`:

``raw_gpu_peak_bytes``
    What ``Cluster.DeterminePeakMemoryUsage(item)`` reports for the GPU. It is
    computed by ``GraphMemory::InferFromTrace`` from the virtual scheduler's
    step stats: every output of every executed node is live from the
    (microsecond-truncated) start of its producer to one nanosecond after the
    end of the latest of its consumers, where "consumers" are the data inputs
    recorded in the *original* graph.

``gpu_peak_bytes`` (the corrected peak)
    ``InferFromTrace`` has a blind spot that matters exactly for LMS. When a
    GPU op reads a tensor produced on the CPU (a swapped-in tensor), the
    scheduler inserts a ``_Send`` (on a pseudo "Channel" device) and a
    ``_Recv`` on the GPU; the ``_Recv``'s output is the GPU-resident copy.
    ``InferFromTrace`` only extends a tensor's life through consumers that
    exist in the original graph, and the GPU consumer's original input names
    the *CPU* node, not the ``_Recv``. So the GPU copy is freed one nanosecond
    after the (essentially instantaneous) transfer, and the CPU tensor is kept
    alive instead. In reality the GPU copy stays allocated until its last GPU
    consumer has run. The oracle therefore replays the trace itself, with the
    same rules as ``InferFromTrace`` (same microsecond timestamps, same
    "+1 ns" deallocation, same rule that the peak is sampled after all
    events of one timestamp), and one change: the output of every
    ``Recv_<src>_<port>_on_<gpu>`` node is kept live until one nanosecond
    after the end of the last op on that GPU that reads ``<src>:<port>``.
    Because the rules are otherwise identical, the replay *without* the
    change reproduces ``raw_gpu_peak_bytes`` exactly (recorded in
    ``replayed_raw_gpu_peak_bytes`` as a self-check), and on a graph with no
    CPU-to-GPU transfers the corrected peak equals the raw one. The
    correction can only add live intervals, so ``gpu_peak_bytes >=
    raw_gpu_peak_bytes`` always.

``runtime_gpu_peak_bytes`` (the runtime peak)
    The same step stats and graph, replayed with the buffer rules of
    TensorFlow's executor instead of ``InferFromTrace``'s. No second
    simulation is run. Three rules differ, and sizes are checked:

    * Ops that forward their input's buffer (``Identity``, ``IdentityN``,
      ``StopGradient``, ``PreventGradient``, ``Reshape``, ``Squeeze``,
      ``ExpandDims``: their kernels call ``set_output(k, input(k))`` or
      share the buffer under a new shape) allocate nothing; their readers
      extend the life of the forwarded buffer. ``ReadVariableOp`` returns the
      variable's own buffer, so it allocates nothing either, and neither
      does any reference output (a v1 ref variable's ``VariableV2``, and
      the ref outputs of ``Assign``, ``Apply*``, ``Scatter*``,
      ``RefSwitch``...): the kernels hand on a reference to the variable's
      buffer (``set_output_ref``, ``forward_ref_input_to_ref_output``).
      ``TemporaryVariable``, whose ref output is a buffer it allocates, is
      the exception. Ops that Grappler's constant folding replaces by
      an ``Identity`` before a real step (``x * 1``, ``x + 0``, ``x / 1``
      with a constant of ones or zeros and the output of x's shape,
      ``NEUTRAL_OPERAND_TYPES``), such as the ``x * 1.0`` of
      ``tf.nn.swish``'s gradient, allocate nothing either: their output
      is x's buffer.
    * Variables (``VarHandleOp``, ``VariableV2``) not placed on a CPU occupy
      the GPU for the whole step, at the size of their ``shape`` attribute
      (``InferFromTrace`` counts no variable, only each read's output).
    * A GPU op releases the buffers it is the last reader of when it is
      launched, right after allocating its outputs, so an op's inputs and
      outputs are always counted together and nothing else is: TensorFlow
      allocates and frees a GPU tensor on the host as kernels are queued
      (the stream's order keeps a freed buffer from being overwritten
      while a queued kernel still reads it), not when the kernel has run.
      The GPU's ops take turns in its execution order. ``InferFromTrace``
      releases a buffer 1 ns after its reader ends instead; ops shorter
      than 1 us share a truncated timestamp, so there each op of a chain
      overlaps the input of the op before it, and a chain of zero-cost
      forwarding ops keeps several inputs live together. A host op that
      reads a GPU buffer (an LMS swap-out) releases it when it ends, after
      everything the GPU launches in that microsecond if it took no time.

    * Sizes: a tensor whose static shape TensorFlow's shape inference
      knows is counted at that size. Grappler's own inference, which sizes
      the virtual scheduler's outputs, gives up on some shapes that
      construction-time inference resolves (a gradient ``Transpose`` whose
      permutation comes from ``InvertPermutation``: 4 bytes in the step
      stats, 8 MiB in a 12-layer Transformer, 48 of them per step).

    The swapped-in-copy correction is kept: a ``Recv_..._on_<gpu>`` copy is
    a GPU buffer live until its last GPU reader (through forwarding ops)
    is launched. It is allocated when the host sends the tensor, at the end
    of the host op that made it (an LMS swap-in), if that comes before the
    ``_Recv``'s turn in the GPU's schedule: TensorFlow's ``_Recv`` has no
    inputs and waits from the start of the step, and the intra-process
    rendezvous allocates the GPU copy in its callback as soon as the
    ``_Send`` runs, while the virtual scheduler queues the ``_Recv`` behind
    the GPU ops ready before it. The host op's end is the latest end of it
    and of everything it waits for: the scheduler may start a host op
    before a GPU op it waits for (a swap-in's trigger) has ended. The copy
    comes after the GPU ops launched in that microsecond that were ready
    before it was sent (they were queued first) and before those that
    became ready then (a reader of another swapped-in copy, which on a GPU
    waits for that copy to arrive). A GPU buffer read by a CPU op (an LMS
    swap-out) lives until that read ends. For a chain ``x -> sin ->
    Identity -> Reshape -> cos`` the runtime peak is two tensors where
    ``InferFromTrace`` counts five. ``runtime_live_at_peak`` lists the
    buffers live at this peak.

    Copies take no time in this replay unless ``interconnect`` names a
    link (below).

    This is the number to compare with what a GPU would allocate; it is not
    an upper bound. ``gpu_peak_bytes`` (raw plus the correction) remains the
    conservative number: it is never below what ``InferFromTrace`` reports,
    but may exceed the runtime peak by tens of percent on graphs with many
    ``IdentityN``/``ReadVariableOp`` outputs (and may be below it when
    variables dominate).

``peak_memory(..., interconnect=...)`` (timed copies in the runtime replay)
    By default (``interconnect=None``) the runtime replay, like the virtual
    cluster, treats a copy between the GPU and the host as instant: a
    swapped-out tensor's GPU buffer is freed as soon as its swap-out has
    run, and a swapped-in copy is complete when its ``_Recv`` runs. With a
    link (a name from `tflms.hardware.INTERCONNECTS` such as ``"pcie4"``,
    or a rate in bytes/s per direction) the replay times the copies the
    way `tflms.simulator` does with ``copy_levels``: one FIFO copy stream
    each way, a copy taking ``nbytes / rate``.

    * Device to host: one copy per GPU tensor that a CPU op (an LMS
      swap-out) reads, ready when the first such op starts in the virtual
      cluster's schedule, queued behind earlier device-to-host copies. The
      tensor's GPU buffer is held until the copy ends (and its GPU readers,
      as without).
    * Host to device: one copy per ``Recv_..._on_<gpu>``, ready when the
      GPU copy is allocated (when the host sends the tensor, above; this
      is when the runtime issues the copy) and not before the
      device-to-host copy of the same data has ended (a swap-in reads its
      swap-out), queued behind earlier host-to-device copies. The GPU copy
      is allocated when it is issued, as without times, so a copy waiting
      in the queue holds its memory, and it is held until the copy ends or
      its last GPU reader is launched, whichever is later.
    * A copy's end releases like a zero-length op off the GPU: after
      everything the GPU does at that nanosecond.

    The times are the virtual cluster's model times: its analytical cost
    model on the V100-like device of `gpu_properties` (or the ``gpu_props``
    given), not a measurement, and ops are not delayed by the copies (a
    reader of a swapped-in tensor is not made to wait for its copy; the
    GPU copy is only held longer instead). Allocations never move and
    releases only move later, so the timed peak is at least the instant
    one. Ops start on whole microseconds, so a link fast enough that
    every copy ends before the microsecond after it became ready moves no
    release past an allocation and gives the instant peak exactly.
    ``interconnect="instant"`` (or an infinite rate) is the same as None.
    ``OracleResult.timed_copies`` lists each copy's ready, start and end
    times, ``OracleResult.interconnect`` the link used.

``scheduler_gpu_peak_bytes`` (optional, ``scheduler_check=True``)
    The virtual scheduler also keeps its own running memory count, which
    frees an input when its last consumer in the *scheduled* graph (including
    ``_Recv`` nodes) has executed, so it does not have the blind spot. It is
    not exported to Python, but ``VirtualCluster::Run`` returns
    ``RESOURCE_EXHAUSTED: Graph requires <N> bytes of memory on device <d>``
    when ``N >= memory_size``; running once more with a one-byte GPU yields
    ``N``. It excludes persistent tensors (constants, variables) and counts
    an output from the end of its producer, so it is a differently-defined
    cross-check, not the same number.

Things the virtual cluster does that a reader should know:

* Its transfers are (almost) free: ``_Send``/``_Recv`` take about 1 ns,
  and nothing in the schedule waits for a copy. The raw and corrected
  peaks keep that; the runtime peak counts copy durations at a named link
  when ``peak_memory`` is given ``interconnect`` (above), still on the
  cluster's schedule.
* ``Identity`` allocates a fresh output in ``InferFromTrace``'s memory model
  (real TensorFlow forwards the buffer, as ``runtime_gpu_peak_bytes``
  does), so swap ops on the GPU side would be over-counted in the raw and
  corrected peaks; LMS's swap ops live on the CPU, which is accounted
  separately.
* Timestamps are truncated to microseconds before the interval replay, so
  ops shorter than 1 us collapse onto one timestamp; a chain of element-wise
  ops peaks at three live outputs (the input of the previous op is freed
  1 ns after the next op starts).
* Unplaced ops default to the GPU, and the Item path does not run the
  Grappler meta optimizer (``ItemConfig.apply_optimizations`` is false and
  no pruning is done), so the measured graph is the graph given.

Placeholders must have fully defined shapes; tensors of unknown size count
as zero bytes.
"""

import dataclasses
import functools
import math
import numbers
import re
from typing import Iterable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import device_properties_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.framework import op_def_registry
from tensorflow.python.grappler import cluster as gcluster
from tensorflow.python.grappler import item as gitem

from tflms import hardware

__all__ = [
    "GPU_DEVICE",
    "CPU_DEVICE",
    "LiveTensor",
    "Transfer",
    "TimedCopy",
    "OracleResult",
    "gpu_properties",
    "cpu_properties",
    "place_on_gpu",
    "peak_memory",
]

GPU_DEVICE = "/job:localhost/replica:0/task:0/device:GPU:0"
CPU_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"

# Large enough that no realistic graph trips the virtual cluster's
# RESOURCE_EXHAUSTED check during measurement; capacity is judged afterwards.
_UNLIMITED = 1 << 50

_GraphLike = Union[tf.Graph, graph_pb2.GraphDef]

# Kernels that return their input's buffer as their output
# (context->set_output(k, context->input(k)), or Tensor::CopyFrom with a new
# shape) instead of allocating one. IdentityN forwards input k to output k,
# the others input 0 to output 0.
FORWARDING_TYPES = frozenset({
    "Identity", "IdentityN", "StopGradient", "PreventGradient", "Reshape",
    "Squeeze", "ExpandDims",
})
# x * 1, 1 * x, x / 1, x + 0, 0 + x, x - 0 with a constant neutral operand
# (slots of x and of the constant): Grappler's constant folding replaces such
# an op by an Identity of x when the output has x's shape, so in a real step
# its output is x's buffer. The gradient of tf.nn.swish computes x * 1.0
# (Keras EfficientNet: FULL_TRACE of a step with Grappler on has no such op).
NEUTRAL_OPERAND_TYPES = {
    "Mul": (1.0, ((0, 1), (1, 0))), "MulNoNan": (1.0, ((0, 1), (1, 0))),
    "RealDiv": (1.0, ((0, 1),)), "Div": (1.0, ((0, 1),)),
    "Add": (0.0, ((0, 1), (1, 0))), "AddV2": (0.0, ((0, 1), (1, 0))),
    "BiasAdd": (0.0, ((0, 1),)), "Sub": (0.0, ((0, 1),)),
}
# ReadVariableOp returns the variable's own buffer (outside copy-on-read
# mode, which only sparse gathers turn on).
VARIABLE_READ_TYPES = frozenset({"ReadVariableOp"})
# The one op whose reference output is a buffer of its own, allocated in the
# step; every other ref output refers to a variable's resident buffer.
ALLOCATING_REF_TYPES = frozenset({"TemporaryVariable"})
VARIABLE_TYPES = frozenset({"VarHandleOp", "VariableV2"})


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
    virtual cluster's model times (see the module docstring), nanoseconds.

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
      gpu_peak_bytes: corrected GPU peak (see the module docstring).
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
        allocated when sent; see the module docstring).
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
        """Whether the corrected peak fits ``gpu_memory_bytes`` (None if unset)."""
        if self.gpu_memory_bytes is None:
            return None
        return self.gpu_peak_bytes <= self.gpu_memory_bytes

    def largest_live_tensors(self, k: int = 10) -> list:
        """Names of the ``k`` largest tensors live at the corrected peak."""
        return [t.name for t in self.live_at_peak[:k]]


def gpu_properties(memory_bytes: int = 16 << 30) -> device_properties_pb2.DeviceProperties:
    """Properties of a V100-class GPU for the analytical cost model.

    Args:
      memory_bytes: device memory size.

    Returns:
      A ``DeviceProperties`` proto of type ``"GPU"``.
    """
    props = device_properties_pb2.DeviceProperties()
    props.type = "GPU"
    props.vendor = "NVIDIA"
    props.model = "Tesla V100-SXM2-16GB"
    props.frequency = 1530          # MHz
    props.num_cores = 80            # streaming multiprocessors
    props.environment["architecture"] = "7.0"
    props.environment["cuda"] = "12020"
    props.num_registers = 65536
    props.l1_cache_size = 24576
    props.l2_cache_size = 6 * 1024 * 1024
    props.shared_memory_size_per_multiprocessor = 98304
    props.memory_size = memory_bytes
    props.bandwidth = 900 * 1000 * 1000  # KB/s, i.e. 900 GB/s
    return props


def cpu_properties(memory_bytes: int = 256 << 30) -> device_properties_pb2.DeviceProperties:
    """Properties of a server CPU for the analytical cost model.

    Args:
      memory_bytes: host memory size.

    Returns:
      A ``DeviceProperties`` proto of type ``"CPU"``.
    """
    props = device_properties_pb2.DeviceProperties()
    props.type = "CPU"
    props.vendor = "GenuineIntel"
    props.model = "default"
    props.frequency = 2500
    props.num_cores = 16
    props.environment["cpu_instruction_set"] = "AVX2"
    props.l1_cache_size = 32 * 1024
    props.l2_cache_size = 1024 * 1024
    props.l3_cache_size = 32 * 1024 * 1024
    props.memory_size = memory_bytes
    props.bandwidth = 100 * 1000 * 1000  # KB/s
    return props


def _is_cpu_device(device: str) -> bool:
    if not device:
        return False
    try:
        spec = tf.DeviceSpec.from_string(device)
    except ValueError:
        return "cpu" in device.lower()
    return (spec.device_type or "").upper() == "CPU"


def _as_graph_def(graph: _GraphLike) -> graph_pb2.GraphDef:
    if isinstance(graph, tf.Graph):
        return graph.as_graph_def()
    if isinstance(graph, graph_pb2.GraphDef):
        copy = graph_pb2.GraphDef()
        copy.CopyFrom(graph)
        return copy
    raise TypeError(f"expected a tf.Graph or GraphDef, got {type(graph)!r}")


def place_on_gpu(graph: _GraphLike, gpu: str = "/device:GPU:0",
                 cpu: str = "/cpu:0") -> graph_pb2.GraphDef:
    """Returns a copy of ``graph`` with every non-CPU op placed on the GPU.

    Ops pinned to a CPU (for example LMS swap ops on ``/cpu:0``) are kept on
    the CPU, with their device rewritten to ``cpu``; every other op, placed or
    not, gets ``gpu``. The virtual cluster would put unplaced ops on the GPU
    anyway, but explicit devices make the measured placement unambiguous.

    Args:
      graph: a ``tf.Graph`` or ``GraphDef``; it is not modified.
      gpu: device string for compute ops.
      cpu: device string for CPU-pinned ops.

    Returns:
      A new ``GraphDef``.
    """
    graph_def = _as_graph_def(graph)
    for node in graph_def.node:
        node.device = cpu if _is_cpu_device(node.device) else gpu
    return graph_def


def _fetch_names(fetches) -> list:
    if isinstance(fetches, (str, tf.Tensor, tf.Operation)):
        fetches = [fetches]
    names = []
    for fetch in fetches:
        if isinstance(fetch, (tf.Tensor, tf.Operation)):
            name = fetch.op.name if isinstance(fetch, tf.Tensor) else fetch.name
        elif isinstance(fetch, str):
            name = fetch.lstrip("^").split(":")[0]
        else:
            raise TypeError(f"cannot fetch {fetch!r}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("peak_memory needs at least one fetch")
    return names


def _metagraph(graph_def: graph_pb2.GraphDef, fetch_names: Sequence[str]):
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    # Grappler's item builder takes its fetch nodes from this collection.
    meta.collection_def["train_op"].node_list.value.extend(fetch_names)
    return meta


def _cluster(gpu_props, cpu_props, gpu_device, cpu_device):
    gpu = device_properties_pb2.NamedDevice(name=gpu_device)
    gpu.properties.CopyFrom(gpu_props)
    cpu = device_properties_pb2.NamedDevice(name=cpu_device)
    cpu.properties.CopyFrom(cpu_props)
    return gcluster.Cluster(devices=[gpu, cpu], disable_timeline=False,
                            disable_detailed_stats=False)


def _with_memory(props, memory_bytes):
    copy = device_properties_pb2.DeviceProperties()
    copy.CopyFrom(props)
    copy.memory_size = memory_bytes
    return copy


def _sanitized(device: str) -> str:
    return device.replace(":", "_")


def _recv_name(source: str, port, gpu_device: str) -> str:
    """The virtual scheduler's _Recv node that copies ``source:port`` onto
    `gpu_device`; its output 0 is the GPU copy."""
    return f"Recv_{source}_{port}_on_{_sanitized(gpu_device)}"


def _neutral_operand_slot(node, nodes, sizes):
    """The data input whose buffer `node` (x op neutral constant) returns
    once Grappler folds it (`NEUTRAL_OPERAND_TYPES`), or None."""
    neutral, pairs = NEUTRAL_OPERAND_TYPES[node.op]
    data = [i for i in node.input if not i.startswith("^")]
    for kept, other in pairs:
        if max(kept, other) >= len(data):
            continue
        const = nodes.get(_parse_input(data[other])[0])
        x_key = _parse_input(data[kept])
        # Same bytes as x (the same dtype): broadcasting changed nothing.
        if (const is None or const.op != "Const"
                or sizes.get(x_key) != sizes.get((node.name, 0))):
            continue
        value = const.attr["value"].tensor
        if math.prod(d.size for d in value.tensor_shape.dim) > 1024:
            continue  # a large constant is no neutral scalar
        try:
            array = tf.make_ndarray(value)
        except (TypeError, ValueError):
            continue
        if array.size and (array == neutral).all():
            return kept
    return None


def _parse_input(name: str):
    """Returns (node, port) of a data input, or None for a control input."""
    if name.startswith("^"):
        return None
    node, _, port = name.partition(":")
    return node, int(port) if port else 0


class _Interval:
    __slots__ = ("device", "nbytes", "alloc", "dealloc", "transferred")

    def __init__(self, device):
        self.device = device
        self.nbytes = 0
        self.alloc = 0
        self.dealloc = 0
        self.transferred = False


def _replay(step_stats, graph_def, gpu_device, correct):
    """Replays GraphMemory::InferFromTrace, optionally fixing the blind spot.

    Args:
      step_stats: the virtual scheduler's ``StepStats``.
      graph_def: the graph the item was built from.
      gpu_device: full name of the GPU device.
      correct: if True, keep GPU copies of transferred tensors alive until
        their last GPU consumer ends.

    Returns:
      ``(peak_bytes, live_at_peak, transfers)`` for the GPU, where
      ``live_at_peak`` is a list of ``LiveTensor`` and ``transfers`` a list of
      ``Transfer`` (empty if not ``correct``).
    """
    placement = {}
    times = {}   # node -> (start_ns, end_ns) with InferFromTrace's rounding.
    for dev_stats in step_stats.dev_stats:
        for ns in dev_stats.node_stats:
            placement[ns.node_name] = dev_stats.device
            start = ns.all_start_micros * 1000
            times[ns.node_name] = (start,
                                   start + ns.op_end_rel_micros * 1000)

    tensors = {}

    def interval(key, device):
        if key not in tensors:
            tensors[key] = _Interval(device)
        return tensors[key]

    for dev_stats in step_stats.dev_stats:
        for ns in dev_stats.node_stats:
            start, end = times[ns.node_name]
            for port, out in enumerate(ns.output):
                live = interval((ns.node_name, port), dev_stats.device)
                live.nbytes = out.tensor_description.allocation_description.allocated_bytes
                live.alloc = start
                live.dealloc = max(live.dealloc, end + 1)

    # Consumers as recorded in the original graph; TF-inserted _Send/_Recv
    # nodes are not in it and therefore extend nobody's life.
    gpu_readers = {}  # (src, port) -> [consumer names on the GPU]
    for node in graph_def.node:
        if node.name not in times:
            continue
        _, end = times[node.name]
        swapped = set()
        if "_swap_to_host" in node.attr:
            swapped = set(node.attr["_swap_to_host"].list.i)
        for index, inp in enumerate(node.input):
            if index in swapped:
                continue
            parsed = _parse_input(inp)
            if parsed is None:
                continue
            live = interval(parsed, placement.get(parsed[0], ""))
            live.dealloc = max(live.dealloc, end + 1)
            if (placement[node.name] == gpu_device
                    and placement.get(parsed[0]) != gpu_device):
                gpu_readers.setdefault(parsed, []).append(node.name)

    transfers = []
    if correct:
        for (src, port), readers in gpu_readers.items():
            recv = _recv_name(src, port, gpu_device)
            live = tensors.get((recv, 0))
            if live is None:
                continue
            raw_end = live.dealloc
            for reader in readers:
                live.dealloc = max(live.dealloc, times[reader][1] + 1)
            live.transferred = True
            transfers.append(Transfer(
                source=f"{src}:{port}", recv_node=recv, nbytes=live.nbytes,
                start_ns=live.alloc, raw_end_ns=raw_end,
                corrected_end_ns=live.dealloc, consumers=tuple(readers)))
        transfers.sort(key=lambda t: (t.start_ns, t.source))

    events = {}
    for key, live in tensors.items():
        if live.device != gpu_device:
            continue
        events.setdefault(live.alloc, []).append((key, live.nbytes))
        events.setdefault(live.dealloc, []).append((key, -live.nbytes))
    # As in InferFromTrace, the peak is sampled only after every event of a
    # timestamp, and only a strictly larger total moves it.
    peak, current, live_keys, peak_keys = 0, 0, set(), set()
    for stamp in sorted(events):
        for key, delta in events[stamp]:
            current += delta
            if delta >= 0:
                live_keys.add(key)
            else:
                live_keys.discard(key)
        if current > peak:
            peak, peak_keys = current, set(live_keys)
    at_peak = [LiveTensor(name=f"{k[0]}:{k[1]}", nbytes=tensors[k].nbytes,
                          alloc_ns=tensors[k].alloc,
                          dealloc_ns=tensors[k].dealloc,
                          transferred=tensors[k].transferred)
               for k in peak_keys]
    at_peak.sort(key=lambda t: (-t.nbytes, t.name))
    return peak, at_peak, transfers


@functools.lru_cache(maxsize=None)
def _ref_output_ports(op_type: str) -> frozenset:
    """Output ports of `op_type` that are references to a variable's buffer.

    Ports are counted through the op def's output args up to the first
    list-valued one (no registered op has a reference output after one).
    Unknown op types (functions of the graph's library) have none.
    """
    op_def = op_def_registry.get(op_type)
    if op_def is None or op_type in ALLOCATING_REF_TYPES:
        return frozenset()
    ports = set()
    for port, arg in enumerate(op_def.output_arg):
        if arg.number_attr or arg.type_list_attr:
            break
        if arg.is_ref:
            ports.add(port)
    return frozenset(ports)


def _variable_bytes(node) -> int:
    dtype = tf.as_dtype(node.attr["dtype"].type)
    dims = [d.size for d in node.attr["shape"].shape.dim]
    if any(d < 0 for d in dims):
        return 0  # unknown size counts as zero, as everywhere in the oracle
    return int(np.prod(dims, dtype=np.int64)) * dtype.base_dtype.size


def _static_output_bytes(graph: _GraphLike) -> dict:
    """Bytes of every tensor whose static shape TensorFlow fully knows.

    Shapes come from TensorFlow's own shape inference on graph
    construction (a `GraphDef` is imported into a scratch graph), which
    evaluates small constant subgraphs such as the ``InvertPermutation``
    that gives a gradient ``Transpose`` its permutation. Grappler's static
    inference, which sizes the virtual scheduler's outputs, does not, and
    records such an output as 4 bytes.

    Returns:
      dict ``(node name, port) -> bytes``; resource, variant and string
      tensors and tensors with an unknown dimension are left out.
    """
    if isinstance(graph, graph_pb2.GraphDef):
        graph_def = graph_pb2.GraphDef()
        graph_def.CopyFrom(graph)
        # The measurement ignores colocation; so does this import, which
        # would reject a constraint naming a node that was dropped.
        for node in graph_def.node:
            if "_class" in node.attr:
                del node.attr["_class"]
        scratch = tf.Graph()
        with scratch.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        graph = scratch
    sizes = {}
    for op in graph.get_operations():
        for port, tensor in enumerate(op.outputs):
            dtype = tensor.dtype.base_dtype
            if (dtype in (tf.resource, tf.variant, tf.string)
                    or not tensor.shape.is_fully_defined()):
                continue
            sizes[(op.name, port)] = (tensor.shape.num_elements()
                                      * dtype.size)
    return sizes


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


def _runtime_replay(step_stats, graph_def, gpu_device, static_bytes=None,
                    bytes_per_s=None):
    """Replays the step with the TensorFlow runtime's buffer rules.

    Same step stats, microsecond times and swapped-in-copy correction as
    `_replay`; forwarding ops and variable reads allocate nothing, variables
    are resident, a buffer is released when its last GPU reader is launched
    (or its last host reader ends), and a host tensor's GPU copy is
    allocated when the host sends it. See the module docstring.

    With ``bytes_per_s``, copies between the GPU and the host take time on
    one FIFO stream per direction: a GPU buffer read by a CPU op is held
    until its copy to the host has ended, and a GPU copy of a CPU tensor
    until its copy from the host has ended (and its last GPU reader, as
    without). Allocations do not move.

    Args:
      step_stats: the virtual scheduler's ``StepStats``.
      graph_def: the graph the item was built from.
      gpu_device: full name of the GPU device.
      static_bytes: `_static_output_bytes` of the graph, or None. A tensor
        (or a GPU copy of one) is counted at least at this size.
      bytes_per_s: the link's rate per direction, or None for copies that
        take no time.

    Returns:
      ``(peak_bytes, live_at_peak, peak_ns, timed_copies)`` for the GPU:
      ``live_at_peak`` a list of ``LiveTensor``, largest first; ``peak_ns``
      when the peak was reached; ``timed_copies`` a list of `TimedCopy`
      (empty without ``bytes_per_s``).
    """
    nodes = {node.name: node for node in graph_def.node}
    placement, times, sizes = {}, {}, {}
    order = {}  # GPU op -> position in the GPU's execution order
    for dev_stats in step_stats.dev_stats:
        for ns in dev_stats.node_stats:
            placement[ns.node_name] = dev_stats.device
            if dev_stats.device == gpu_device:
                order[ns.node_name] = len(order)
            start = ns.all_start_micros * 1000
            times[ns.node_name] = (start,
                                   start + ns.op_end_rel_micros * 1000)
            for port, out in enumerate(ns.output):
                sizes[(ns.node_name, port)] = (
                    out.tensor_description.allocation_description
                    .allocated_bytes)
    recv_suffix = "_on_" + _sanitized(gpu_device)
    for (name, port), nbytes in (static_bytes or {}).items():
        for key in ((name, port), (_recv_name(name, port, gpu_device), 0)):
            if key in sizes and sizes[key] < nbytes:
                sizes[key] = nbytes

    def gpu_buffer(key):
        # The GPU buffer a GPU reader of tensor `key` reads: the scheduler's
        # _Recv copy for a tensor from another device, the forwarded
        # buffer's owner for a forwarding op, None for a variable.
        while True:
            name, port = key
            if placement.get(name) != gpu_device:
                return (_recv_name(name, port, gpu_device), 0)
            node = nodes.get(name)
            if node is not None and (node.op in VARIABLE_READ_TYPES
                                     or port in _ref_output_ports(node.op)):
                return None
            if node is not None and node.op in NEUTRAL_OPERAND_TYPES:
                slot = _neutral_operand_slot(node, nodes, sizes)
            elif node is not None and node.op in FORWARDING_TYPES:
                slot = port if node.op == "IdentityN" else 0
            else:
                slot = None
            if slot is None:
                return key
            data = [i for i in node.input if not i.startswith("^")]
            key = _parse_input(data[slot])

    def release_key(name):
        # When op `name` lets go of its inputs. A GPU op: when it is
        # launched (its start), right after its own allocations, in the
        # GPU's execution order. Host ops that took time: when they end,
        # before any op that starts in that microsecond. A zero-length op
        # elsewhere (an LMS swap-out, whose copy takes time on a real
        # machine): after everything the GPU does in that microsecond.
        start, end = times[name]
        if name in order:
            return (start, 1, order[name], 1)
        if start < end:
            return (end, 0, 0, 0)
        return (end, 2, 0, 0)

    def host_copy_origin(key):
        # The GPU tensor of which CPU tensor `key` is the host copy (an LMS
        # swap-in forwards its swap-out, which reads the swapped tensor), or
        # None for a tensor made on the host.
        while placement.get(key[0]) != gpu_device:
            node = nodes.get(key[0])
            if node is None or node.op not in FORWARDING_TYPES:
                return None
            data = [i for i in node.input if not i.startswith("^")]
            key = _parse_input(data[key[1] if node.op == "IdentityN" else 0])
        return key

    # The host tensor each _Recv copies. TensorFlow's intra-process
    # rendezvous allocates the GPU copy when the tensor is sent, at the end
    # of its producer on the host (the _Recv, which has no inputs, waits
    # from the start of the step), not when the virtual scheduler gets to
    # the _Recv in the GPU's queue, which may be after GPU ops that were
    # ready earlier.
    sent_from = {}
    for key in sizes:
        if placement[key[0]] != gpu_device:
            sent_from[(_recv_name(*key, gpu_device), 0)] = key
    sent_early = set()  # copies allocated before their _Recv ran
    host_done = {}  # host op -> when it has ended, see _host_done

    live = {}  # buffer -> [alloc ns, release key, transferred]
    for key in sizes:
        name = key[0]
        if placement[name] != gpu_device:
            continue
        if name in nodes and gpu_buffer(key) != key:
            continue  # forwarded (or a variable read): no allocation
        transferred = name not in nodes and name.endswith(recv_suffix)
        alloc = times[name][0]
        source = sent_from.get(key) if transferred else None
        if source is not None:
            sent = _host_done(source[0], nodes, times, placement, gpu_device,
                              host_done)
            if sent < alloc:
                alloc = sent
                sent_early.add(key)
        live[key] = [alloc, release_key(name), transferred]
    to_host_ready = {}  # GPU tensor read by a CPU op -> first such read
    for name in times:
        node = nodes.get(name)
        if node is None:
            continue
        reader_on_gpu = placement[name] == gpu_device
        for text in node.input:
            parsed = _parse_input(text)
            if parsed is None or parsed[0] not in placement:
                continue
            # A GPU reader reads a GPU buffer (maybe a copy); a CPU reader
            # (an LMS swap-out) keeps the GPU tensor it copies alive.
            if not reader_on_gpu and placement[parsed[0]] != gpu_device:
                continue
            if not reader_on_gpu:
                # The runtime sends a tensor to the host once, for its
                # first CPU reader.
                to_host_ready[parsed] = min(
                    to_host_ready.get(parsed, times[name][0]), times[name][0])
            buffer = gpu_buffer(parsed)
            if buffer in live:
                live[buffer][1] = max(live[buffer][1], release_key(name))

    timed_copies = []
    if bytes_per_s is not None:
        timed_copies = _hold_for_copies(
            live, sizes, times, order, to_host_ready, sent_from, gpu_buffer,
            host_copy_origin, bytes_per_s)

    step_end = max((end for _, end in times.values()), default=0)
    resident = []
    for node in graph_def.node:
        if node.op not in VARIABLE_TYPES:
            continue
        device = placement.get(node.name)
        on_gpu = (device == gpu_device if device is not None
                  else not _is_cpu_device(node.device))
        if on_gpu:
            resident.append(LiveTensor(
                name=node.name, nbytes=_variable_bytes(node), alloc_ns=0,
                dealloc_ns=step_end, variable=True))

    # An allocation sorts with the ops launched in its microsecond, by
    # execution order, before the releases of its own op. A copy sent from
    # the host before its _Recv's turn comes after the GPU ops launched in
    # that microsecond that were ready before it was sent, and before those
    # that became ready then (a reader of another copy, which waits for
    # that copy to arrive).
    launched_at = {}
    for name, position in order.items():
        launched_at.setdefault(times[name][0], []).append((position, name))

    ready_ns = {}  # GPU op -> when it could start, see _gpu_ready

    def sent_position(sent_ns):
        later = []
        for position, name in launched_at.get(sent_ns, ()):
            if name not in ready_ns:
                ready_ns[name] = _gpu_ready(name, nodes, times, placement,
                                            gpu_device, host_done)
            if ready_ns[name] >= sent_ns:
                later.append(position)
        return min(later) - 0.5 if later else len(order)

    events = []
    for key, (alloc, release, _) in live.items():
        position = (sent_position(alloc) if key in sent_early
                    else order.get(key[0], 0))
        events.append(((alloc, 1, position, 0), sizes[key], key))
        events.append((release, -sizes[key], key))
    current = sum(t.nbytes for t in resident)
    peak, count, peak_keys, peak_ns = current, {}, [], 0
    for when, nbytes, key in sorted(events):
        current += nbytes
        count[key] = count.get(key, 0) + (1 if nbytes >= 0 else -1)
        if current > peak:
            peak, peak_ns = current, when[0]
            peak_keys = [k for k, n in count.items() if n > 0]
    at_peak = [LiveTensor(name=f"{k[0]}:{k[1]}", nbytes=sizes[k],
                          alloc_ns=live[k][0], dealloc_ns=live[k][1][0],
                          transferred=live[k][2])
               for k in peak_keys]
    at_peak.extend(resident)
    at_peak.sort(key=lambda t: (-t.nbytes, t.name))
    return peak, at_peak, peak_ns, timed_copies


def _host_done(name, nodes, times, placement, gpu_device, memo):
    """When host op `name` has really ended, in the step stats' times.

    The virtual scheduler makes an op ready at the end of the input it
    processed last, not of the one that ended last, so a host op may start
    in the schedule before a GPU op it waits for (an LMS swap-in's trigger)
    has ended. An op ends no earlier than its own end and every input's,
    data or control, host inputs counted the same way (`memo` keeps them).
    """
    stack = [name]
    while stack:
        op = stack[-1]
        if op in memo:
            stack.pop()
            continue
        node = nodes.get(op)
        inputs = [] if node is None else [
            text.lstrip("^").partition(":")[0] for text in node.input]
        inputs = [i for i in inputs if i in times]
        pending = [i for i in inputs
                   if placement[i] != gpu_device and i not in memo]
        if pending:
            stack.extend(pending)
            continue
        done = times[op][1]
        for i in inputs:
            done = max(done, memo[i] if placement[i] != gpu_device
                       else times[i][1])
        memo[op] = done
        stack.pop()
    return memo[name]


def _gpu_ready(name, nodes, times, placement, gpu_device, host_done):
    """When GPU op `name` could start: every input has ended (a GPU input),
    been copied (a host tensor: its _Recv has run) or been done on the host
    (a control input from a host op, `_host_done`)."""
    ready = 0
    node = nodes.get(name)
    for text in ([] if node is None else node.input):
        control = text.startswith("^")
        source, _, port = text.lstrip("^").partition(":")
        if source not in times:
            continue
        if placement[source] == gpu_device:
            ready = max(ready, times[source][1])
            continue
        recv = _recv_name(source, port or 0, gpu_device)
        if not control and recv in times:
            ready = max(ready, times[recv][0])
        else:
            ready = max(ready, _host_done(source, nodes, times, placement,
                                          gpu_device, host_done))
    return ready


def _hold_for_copies(live, sizes, times, order, to_host_ready, sent_from,
                     gpu_buffer, host_copy_origin, bytes_per_s):
    """Times the step's copies and extends the GPU buffers they hold.

    Part of `_runtime_replay` (its names): updates the release keys in
    `live` and returns the `TimedCopy` list, by start.
    """
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


_REQUIRES = re.compile(r"Graph requires (\d+) bytes of memory on device (\S+)")


def _scheduler_peak(meta, gpu_props, cpu_props, gpu_device, cpu_device):
    # A one-byte GPU (and a CPU of unknown size, which the check skips) makes
    # VirtualCluster::Run fail with the scheduler's own GPU peak in the text.
    cluster = _cluster(_with_memory(gpu_props, 1), _with_memory(cpu_props, 0),
                       gpu_device, cpu_device)
    try:
        cluster.DeterminePeakMemoryUsage(gitem.Item(meta))
    except tf.errors.ResourceExhaustedError as err:
        match = _REQUIRES.search(str(err))
        if match is None:
            raise
        return int(match.group(1))
    finally:
        cluster.Shutdown()
    return 0


def peak_memory(graph: _GraphLike,
                fetches: Union[str, tf.Tensor, tf.Operation, Iterable],
                gpu_memory_bytes: Optional[int] = None,
                *,
                place: bool = True,
                gpu_props: Optional[device_properties_pb2.DeviceProperties] = None,
                cpu_props: Optional[device_properties_pb2.DeviceProperties] = None,
                gpu_device: str = GPU_DEVICE,
                cpu_device: str = CPU_DEVICE,
                scheduler_check: bool = False,
                interconnect=None) -> OracleResult:
    """Measures the GPU and host memory peaks of one step of ``graph``.

    Args:
      graph: a ``tf.Graph`` or ``GraphDef``; it is not modified.
      fetches: what one step runs (train op, loss, ...): ops, tensors or
        names. Only their transitive fan-in is simulated.
      gpu_memory_bytes: capacity to judge the result against (see
        ``OracleResult.fits``). Measurement itself always uses an unlimited
        simulated device so that it never aborts.
      place: if True, apply `place_on_gpu` first; if False, use the graph's
        devices as they are (unplaced ops still land on the GPU).
      gpu_props: ``DeviceProperties`` of the GPU; default `gpu_properties`.
      cpu_props: ``DeviceProperties`` of the CPU; default `cpu_properties`.
      gpu_device: full name of the simulated GPU.
      cpu_device: full name of the simulated CPU.
      scheduler_check: if True, also obtain the virtual scheduler's own GPU
        peak (one more simulation).
      interconnect: None (the default) for copies that take no time in the
        runtime replay; or the link to time them on, by name (a key of
        `tflms.hardware.INTERCONNECTS` such as ``"pcie4"``, or ``"instant"``),
        as a `tflms.hardware.Interconnect`, or as a rate in bytes/s per
        direction. Only ``runtime_gpu_peak_bytes`` (and its live tensors and
        time) changes: swapped-out GPU buffers are held until their copies
        to the host end (see the module docstring).

    Returns:
      An `OracleResult`.

    Raises:
      ValueError: for an unknown ``interconnect`` name or a rate that is
        not positive.
    """
    link_name, bytes_per_s = _link(interconnect)
    graph_def = place_on_gpu(graph) if place else _as_graph_def(graph)
    fetch_names = _fetch_names(fetches)
    meta = _metagraph(graph_def, fetch_names)
    gpu_props = gpu_props if gpu_props is not None else gpu_properties()
    cpu_props = cpu_props if cpu_props is not None else cpu_properties()

    cluster = _cluster(_with_memory(gpu_props, _UNLIMITED),
                       _with_memory(cpu_props, _UNLIMITED),
                       gpu_device, cpu_device)
    try:
        item = gitem.Item(meta, ignore_colocation=True,
                          ignore_user_placement=False)
        reported = cluster.DeterminePeakMemoryUsage(item)
        _, run_time, step_stats = cluster.MeasureCosts(item)
    finally:
        cluster.Shutdown()

    # GraphMemory reports -1 for a device that ran nothing.
    raw_gpu, raw_live = reported.get(gpu_device, (0, []))
    raw_gpu = max(0, raw_gpu)
    host_peak = max(0, reported.get(cpu_device, (0, []))[0])
    raw_live_at_peak = sorted(
        (LiveTensor(name=f"{node}:{port}", nbytes=int(nbytes),
                    alloc_ns=int(alloc), dealloc_ns=int(dealloc))
         for node, port, nbytes, alloc, dealloc in raw_live),
        key=lambda t: (-t.nbytes, t.name))

    replayed_raw, _, _ = _replay(step_stats, graph_def, gpu_device,
                                 correct=False)
    corrected, live_at_peak, transfers = _replay(step_stats, graph_def,
                                                 gpu_device, correct=True)
    runtime, runtime_live, runtime_peak_ns, timed_copies = _runtime_replay(
        step_stats, graph_def, gpu_device, _static_output_bytes(graph),
        bytes_per_s)

    scheduler_gpu = None
    if scheduler_check:
        scheduler_gpu = _scheduler_peak(meta, gpu_props, cpu_props,
                                        gpu_device, cpu_device)

    return OracleResult(
        gpu_peak_bytes=int(corrected),
        raw_gpu_peak_bytes=int(raw_gpu),
        replayed_raw_gpu_peak_bytes=int(replayed_raw),
        host_peak_bytes=int(host_peak),
        scheduler_gpu_peak_bytes=scheduler_gpu,
        live_at_peak=tuple(live_at_peak),
        raw_live_at_peak=tuple(raw_live_at_peak),
        transfers=tuple(transfers),
        run_time_s=float(run_time),
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_device=gpu_device,
        runtime_gpu_peak_bytes=int(runtime),
        runtime_live_at_peak=tuple(runtime_live),
        runtime_peak_ns=int(runtime_peak_ns),
        interconnect=link_name,
        interconnect_bytes_per_s=bytes_per_s,
        timed_copies=tuple(timed_copies),
    )
