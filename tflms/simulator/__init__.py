"""Replay one training step of a (planned) rewritten graph and count memory.

The simulator answers one question for the auto-tuner: if the graph were
rewritten with this `planner.Plan`, how much device memory would one
training iteration need at its worst moment, and what is live then?

It never touches the `tf.Graph` or the `LMS` object. A `SimulationModel` is
built once from plain data (`GraphIndex`, `OpRoles`, batch size) and holds
everything that does not depend on the plan: buffer sizes, which tensors
share a buffer, who reads what, and the successor lists used for levels.
`SimulationModel.replay(plan)` then only adds the plan's virtual swap nodes,
recomputes levels (Kahn, O(V + E)) and counts memory with a few vectorised
numpy passes.

Memory model (what is counted, and why):

* **Execution order.** Ops run level by level in the categorized
  topological sort of the rewritten graph. All ops of one level may run
  concurrently on a real device, so a level first allocates the outputs of
  all its ops, the peak is sampled, and only then are buffers freed whose
  last reader ran in that level or earlier. This is never optimistic
  compared with running the level's ops one after another, with one known
  exception: a swap-in's device copy is allocated at the level after its
  triggers', while TensorFlow sends it as soon as the trigger has run, so
  where other ops of the trigger's level run after it, the copy and their
  inputs are live together and the simulator does not count that. The
  default headroom (`TF_LMS_SIMULATOR_MEM_RATIO` 0.9) is there to cover
  it; docs/benchmarks.md, "Capacity of models written by others", measures
  the difference against the oracle's runtime replay.
* **Buffers.** Each output of an active op with a non-zero static size is
  one buffer on the producer's memory space: the managed device (the ops in
  `OpRoles.device_ops`), the host (ops placed on a CPU) or another device
  (not counted). A buffer lives from its producer's level to the level of
  its last reader. Outputs nobody reads live for their producer's level
  only. Ops in `OpRoles.inactive` do not run and allocate nothing.
* **Aliases are counted once.** ``Identity``, ``IdentityN``,
  ``StopGradient``, ``Reshape``, ``Squeeze`` and ``ExpandDims`` forward
  their input buffer on the same memory space, and so do the ops that
  TensorFlow's graph optimizer reduces to an identity of an input
  (`GraphIndex.forwards_input`: ``x * 1.0``, ``x + 0``), so their output is the
  same buffer as their input (its life is extended by their readers, its bytes
  are not added again). ``ReadVariableOp`` outputs and the outputs of
  variable holders alias the variable and add nothing, and so do reference
  outputs (of a v1 ref variable, and of ``Assign``/``Apply*`` on one), to
  which the index gives 0 bytes. When a swap-in
  feeds such an op (Keras' optimizers pass every gradient through one
  ``IdentityN``), the op forwards the swap-in's device copy, so the readers
  of its output keep the copy alive, not the swapped-out original.
* **Outputs written into an input's buffer.** Element-wise kernels
  (`tflms.inplace`: arithmetic, activations and their gradients, ``AddN``)
  take an input's buffer for their output when nothing else holds it. A
  device op does so here when, in the graph without a plan, it is the only
  reader of that buffer at the latest level that reads it, reads it
  through one slot, and the sizes match: its output is then that buffer
  (counted once, its life extended by the output's readers; its input
  chain carries reads to a swap-in's copy as an alias's does). A read a
  plan adds later of a tensor so written over (a recompute's input) gets
  a buffer of its own from the writer's level on, as the runtime, seeing
  the extra reference, would not write into it. A plan can also make an
  op the only reader of a buffer: a swap-in's device copy read by one op
  alone, through one slot its kernel may take (no earlier candidate slot
  rerouted), is written over by that op's output when the graph gives the
  output a buffer of its own of the same size (`Additions.written_into`:
  a softmax gradient's ``g * y`` in its own copy of ``y``, while a second
  swap-in brings ``y`` back for ``(g - sum) * y``).
* **Resident memory.** Variables (``variable_bytes``: weights and optimizer
  slots, which are variables too) and ``Const`` outputs are allocated for
  the whole step on the space of their op.
* **Transfers.** A buffer read by an op on another space keeps living until
  that reader runs. When a device op reads a tensor made on the host (a
  swap-in, or any CPU op), the device gets its own copy: allocated when the
  host op runs, freed after the copy's last device reader. A swap-out
  (CPU ``Identity`` of a device tensor) owns a host buffer of the tensor's
  size; its swap-ins forward that host buffer.
* **Copies that take time.** Without `CopyLevels` a copy is instant: a
  swapped tensor is freed after its swap-out's level (and its remaining
  readers'), a swap-in's copy is allocated at the swap-in's level. With
  them (`replay(plan, copy_levels=...)`, made by `steptime.copy_levels`
  from a predicted step) the swapped tensor also lives through every level
  that starts before its copy to the host has finished, and the device
  copy from the first level that starts after its copy has started, if
  that is earlier. The levels do not change. The model stays plain data:
  it never times anything itself.
* **Recomputes.** Each clone of a `planner.RecomputePlan` is a node
  one level after its trigger and its inputs; its outputs are device
  buffers (or, for aliasing types, its input's) living until their last
  reader. The late readers read the last clone, so the original buffer is
  freed after its early readers, and the inputs the clones read live until
  the clones ran (a swap-in read by a clone keeps its device copy).
* **Optimizer updates on the host.** With ``offload_optimizer`` the
  planning index has the updates and their slots on the host
  (`offload.planning_index`), so the slots and host copies count in host
  memory. The new weights each update sends back land in a device buffer
  of the variable's size before the write-back puts them in the variable:
  the model's ``landings`` (`offload.write_back_buffers`) count it on the
  device at the update's level, the level of the update and its
  write-back in that index. With `CopyLevels` each gradient an update on
  the host reads lives, as a swapped tensor, until its copy to the host
  has finished (``gradients_held_through``).
* **Not modelled.** Kernel scratch space (e.g. cuDNN workspaces), allocator
  fragmentation and the runtime's own reservations; callers leave headroom
  for these with a memory ratio below 1. An element-wise op whose input's
  other readers share its level is counted as allocating, though the
  runtime may run them first and let it write in place. Ops that only
  initialize variables
  (`initializer_only_ops`) run in their own session call, not in a step.

Sizes come from static shapes (`graph_index.tensor_bytes`); the first
unknown dimension is the batch size, but for shape vectors of unknown
length (a rank: their inputs bound their elements) and data-dependent
counts (`Where`, `Unique`, `tf.boolean_mask`: unknown size;
`tflms.graph_index.unbatched`). A tensor whose size needs the batch size
when none is given raises `BatchSizeError`. Tensors whose size stays
unknown (unknown rank, more than one unknown dimension, a data-dependent
count) count as zero bytes and are listed in
`SimulationModel.unknown_tensors`.

The modules:

  simulation_model.py   `SimulationModel`: made once from the two below;
                        `replay` runs the named steps of one replay;
                        `freed_levels`
  buffers.py            `GraphBuffers`: every tensor's size and buffer, the
                        reads, the alias chains, the resident bytes (laid
                        out by `_BufferLayout`); the memory spaces and
                        `BatchSizeError`
  levels.py             `GraphLevels`: the graph's successors and levels,
                        and a rewritten graph's levels (pushed forward, or
                        Kahn's)
  additions.py          `Additions`: what one plan adds (swap nodes, clones,
                        their buffers and reads, rerouted inputs)
  simulation_result.py  `SimulationResult`, `CopyLevels`, and the counting
                        of buffers into lifetimes and timelines
"""

from tflms.initializers import initializer_only_ops
from tflms.simulator.buffers import DEVICE, HOST, OTHER, BatchSizeError
from tflms.simulator.simulation_model import SimulationModel
from tflms.simulator.simulation_result import CopyLevels, SimulationResult

__all__ = [
    "DEVICE",
    "HOST",
    "OTHER",
    "BatchSizeError",
    "CopyLevels",
    "SimulationResult",
    "SimulationModel",
    "initializer_only_ops",
]
