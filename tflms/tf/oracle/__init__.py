"""An independent GPU memory oracle built on Grappler's virtual cluster.

LMS makes claims such as "this rewritten graph peaks at N bytes of GPU
memory". Those claims must be checked by something that does not share code
with the rewriter. This package asks TensorFlow itself: it hands the graph to a
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
      ``graph_index.NEUTRAL_OPERANDS``), such as the ``x * 1.0`` of
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
    model on the device `gpu_properties` makes of ``peak_memory``'s
    ``gpu`` (the V100 unless told; or the ``cluster.gpu_props`` given), not a
    measurement, and ops are not delayed by the copies (a
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

Placement. By default every op pinned to a CPU is on the oracle's CPU and
everything else on its GPU, and a `tf.function`'s captured variables
(unplaced in its graph) are on the GPU. ``peak_memory(..., place=HOST)``
(`place_on_gpu`'s ``host``, LMS's ``cpu_device``) applies LMS's own rule
instead: the ops on that one device are the host's, every other device
(a logical ``/cpu:1`` standing for the GPU included) is the GPU, and each
captured variable is placed on its own device first. So a Keras 3 step
rewritten with ``offload_optimizer`` on a machine split into logical
CPUs is measured with its weights on the GPU and its slots in host
memory (``benchmarks/offload_llama.py --oracle``).

Placeholders must have fully defined shapes; tensors of unknown size count
as zero bytes.
"""

# The oracle is a package of its own: the virtual cluster and its devices
# (virtual_cluster.py), what it reports (oracle_result.py), the replay of
# GraphMemory::InferFromTrace (trace.py), the replay with the runtime's
# buffer rules (runtime.py) and its timed copies (copies.py), and the
# measurement that runs them all (peak.py). Every name callers used from
# the single module it was is re-exported here.
from tflms.tf.oracle.virtual_cluster import (CPU_DEVICE, GPU_DEVICE,
                                          VirtualCluster, cpu_properties,
                                          gpu_properties, place_on_gpu)
from tflms.tf.oracle.functions import graph_def
from tflms.tf.oracle.peak import peak_memory
from tflms.tf.oracle.oracle_result import (LiveTensor, OracleResult, TimedCopy,
                                        Transfer)
from tflms.tf.oracle.runtime import VARIABLE_READ_TYPES, VARIABLE_TYPES

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
    "VirtualCluster",
    "peak_memory",
    "graph_def",
    "VARIABLE_READ_TYPES",
    "VARIABLE_TYPES",
]
