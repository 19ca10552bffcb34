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
  compared with running the level's ops one after another.
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
  (`GraphIndex.forwards_input`: ``x * 1.0``, ``x + 0``), so their output is the same
  buffer as their input (its life is extended by their readers, its bytes
  are not added again). ``ReadVariableOp`` outputs and the outputs of
  variable holders alias the variable and add nothing, and so do reference
  outputs (of a v1 ref variable, and of ``Assign``/``Apply*`` on one), to
  which the index gives 0 bytes. When a swap-in
  feeds such an op (Keras' optimizers pass every gradient through one
  ``IdentityN``), the op forwards the swap-in's device copy, so the readers
  of its output keep the copy alive, not the swapped-out original.
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
* **Not modelled.** Kernel scratch space (e.g. cuDNN workspaces), allocator
  fragmentation and the runtime's own reservations; callers leave headroom
  for these with a memory ratio below 1. Element-wise kernels that reuse
  their input buffer on a real GPU are counted as allocating a new one, which
  can only overestimate. Ops that only initialize variables
  (`initializer_only_ops`) run in their own session call, not in a step.

Sizes come from static shapes; the first unknown dimension is the batch
size. A tensor whose size needs the batch size when none is given raises
`BatchSizeError`. Tensors whose size stays unknown (unknown rank, or more
than one unknown dimension) count as zero bytes and are listed in
`SimulationModel.unknown_tensors`.
"""

import dataclasses

import numpy as np

from tflms import devices
from tflms import graph_index as gi
from tflms.analysis import initializer_only_ops
from tflms import topo

__all__ = [
    "DEVICE",
    "HOST",
    "OTHER",
    "ALIAS_TYPES",
    "BatchSizeError",
    "CopyLevels",
    "SimulationResult",
    "SimulationModel",
    "initializer_only_ops",
]

# Memory spaces.
DEVICE, HOST, OTHER = 0, 1, 2

# Ops whose output k is the buffer of their input k (input 0 unless
# IdentityN) when both live on the same memory space.
ALIAS_TYPES = frozenset({
    "Identity", "IdentityN", "StopGradient", "PreventGradient", "Reshape",
    "Squeeze", "ExpandDims",
})

# Ops whose outputs are the variable they read or hold.
_VARIABLE_VIEW_TYPES = frozenset({
    "ReadVariableOp", "VarHandleOp", "VariableV2", "Variable",
    "VarHandleOpV2",
})

_NO_BUFFER = -1

# v1 control flow hands buffers on too: both outputs of a Switch are its data
# input; Enter, Exit and NextIteration pass theirs on; a Merge outputs
# whichever input is alive (the active one).
_FORWARD_INPUT0_TYPES = frozenset({
    "Switch", "RefSwitch", "Enter", "RefEnter", "Exit", "RefExit",
    "NextIteration", "RefNextIteration",
})
_MERGE_TYPES = frozenset({"Merge", "RefMerge"})


def _alias_slot(op_type, output, inputs, inactive, forwards=None):
    """The input slot whose buffer output `output` of an op reuses, or None.
    `forwards`: the op's `GraphIndex.forwards_input`."""
    if forwards is not None and output == 0:
        return forwards
    if op_type in ALIAS_TYPES:
        return output if op_type == "IdentityN" else 0
    if op_type in _FORWARD_INPUT0_TYPES:
        return 0
    if op_type in _MERGE_TYPES and output == 0:
        for slot, (p, _) in enumerate(inputs):
            if p not in inactive:
                return slot
    return None



class BatchSizeError(ValueError):
    """A tensor size needs the mini-batch size, and none was given."""


@dataclasses.dataclass(frozen=True)
class CopyLevels:
    """How long a plan's copies occupy device memory, in levels of the
    plan's replay: what `SimulationModel.replay` needs to count copies that
    take time (`steptime.copy_levels` makes it from a predicted step).

    Attributes:
      held_through: per swap of the plan, in plan order, the last level
        that starts before its copy to the host has finished: the swapped
        tensor's device buffer is not freed before the end of this level
        (nor before its swap-out's level and its remaining readers, as
        without copy times).
      allocated_from: per swap, a tuple with one level per swap-in: the
        first level that starts after its copy to the device has started;
        the device copy is allocated no later than this level (nor later
        than the swap-in's own level, as without copy times: the runtime
        allocates the copy when it issues it, so a copy queued behind
        others holds its memory while it waits).
    """

    held_through: tuple
    allocated_from: tuple

    def check_against(self, plan):
        """Raise `ValueError` unless there is one entry per swap and
        swap-in of `plan`."""
        shape = [len(s.swap_ins) for s in plan.swaps]
        if (len(self.held_through) != len(shape)
                or [len(a) for a in self.allocated_from] != shape):
            raise ValueError(
                "copy_levels must have one held_through level per swap and "
                "one allocated_from level per swap-in of the plan (swap-ins "
                "per swap %s); got %d and %s; make it from the plan's own "
                "step time (steptime.copy_levels)" % (
                    shape, len(self.held_through),
                    [len(a) for a in self.allocated_from]))


@dataclasses.dataclass(frozen=True, eq=False)
class SimulationResult:
    """What one replay found. Byte counts are ints.

    Attributes:
      peak_device_bytes: highest device memory over the step.
      peak_level: level (of the rewritten graph) where it happens.
      peak_op: name of the op allocating the most device bytes in that level
        (swap ops are named as the rewriter names them).
      live_at_peak: ``(tensor name, bytes)`` of the device buffers live at
        the peak, largest first; resident memory is one entry named
        ``'<resident variables and constants>'``.
      peak_host_bytes: highest host memory over the step.
      device_timeline / host_timeline: int64 numpy arrays, bytes in use at
        each level (after the level's allocations, before its frees).
      resident_device_bytes / resident_host_bytes: variables and constants.
      num_levels: levels of the rewritten graph.
      levels: int64 numpy array, the level of every original op.
      swapout_bytes: bytes the plan moves to the host (one copy per tensor).
      swapin_bytes: bytes the plan moves back (one copy per swap-in).
      recompute_bytes: bytes of the tensors the plan makes again.
    """

    peak_device_bytes: int
    peak_level: int
    peak_op: str
    live_at_peak: tuple
    peak_host_bytes: int
    device_timeline: np.ndarray
    host_timeline: np.ndarray
    resident_device_bytes: int
    resident_host_bytes: int
    num_levels: int
    levels: np.ndarray
    swapout_bytes: int
    swapin_bytes: int
    recompute_bytes: int = 0

    def fits(self, budget_bytes):
        return self.peak_device_bytes <= budget_bytes


def _space_of(op_id, index, roles):
    if op_id in roles.device_ops:
        return DEVICE
    if devices.is_cpu_device(index.devices[op_id]):
        return HOST
    return OTHER


def _tensor_name(index, op_id, output):
    return "%s:%d" % (index.names[op_id], output)


def _size_error(index, op_id, output):
    shape = index.output_shapes[op_id][output]
    shown = "(%s)" % ", ".join("?" if d is None else str(d) for d in shape)
    return BatchSizeError(
        "LMS cannot size tensor %r (shape %s) without the mini-batch size: "
        "set lms.batch_size = <your mini-batch size> or set "
        "swapout_threshold, swapin_ahead and swapin_groupby by hand"
        % (_tensor_name(index, op_id, output), shown))


class _Additions:
    """What a plan adds to the graph one replay counts: nodes (swap ops and
    clones, numbered after the graph's), buffers, reads, rerouted inputs,
    and whether any original op may change level."""

    def __init__(self, model):
        self.node = model._num_base_nodes  # next node id  pylint: disable=protected-access
        self._first_buffer = len(model.buf_name)
        self._base_levels = model._base_levels  # pylint: disable=protected-access
        self.bytes, self.space, self.alloc, self.names = [], [], [], []
        self.use_buf, self.use_node = [], []
        self.new_levels = []     # levels of the new nodes, in node order
        self.swap_nodes = []     # (producer, swap-out node, waiters, swap-ins)
        self.swapin_of = {}      # (producer, output, k) -> (node, copy buffer)
        self.clone_nodes, self.clone_reroutes = [], []
        self.rerouted = {}       # (consumer, slot) -> buffer it reads now
        self.masked = []         # the graph's reads a reroute removes
        # (buffer, level) pairs from copy_levels: device buffers held until
        # a copy to the host ends, device copies allocated when it starts.
        self.held, self.allocated = [], []
        self.shortened = False   # a rerouted edge held up its consumer's level
        self.moved = False       # some original op must move (or may)
        self.swapout_bytes = self.swapin_bytes = self.recompute_bytes = 0

    def new_node(self):
        self.node += 1
        return self.node - 1

    def buffer(self, nbytes, space, maker):
        """A new buffer made by node `maker`; returns its id."""
        self.bytes.append(nbytes)
        self.space.append(space)
        self.alloc.append(maker)
        return self._first_buffer + len(self.bytes) - 1

    def read(self, buf, node):
        self.use_buf.append(buf)
        self.use_node.append(node)

    def reroute(self, consumer, slot, buf, producer, new_level):
        """`consumer`'s input `slot` reads `buf` (made at `new_level`)
        instead of `producer`'s tensor."""
        self.rerouted[(consumer, slot)] = buf
        levels = self._base_levels
        # The rerouted input no longer reads the producer. That can lower
        # the consumer only if the producer was its latest input (then
        # levels are computed afresh).
        if levels[consumer] - levels[producer] < 2:
            self.shortened = True
        if levels[consumer] <= new_level:
            self.moved = True
        if buf != _NO_BUFFER:
            self.read(buf, consumer)


class SimulationModel:
    """Everything about a graph's memory that does not depend on the plan.

    Build once per (index, roles, batch size), then call `replay` for each
    plan. Node ids ``0..num_ops-1`` are the index's op ids; replays add
    virtual nodes after them for swap ops.

    Args:
      index: a `GraphIndex`. The control edges LMS plans to add
        (serialization, `index.planned_edges`) are replayed with the
        graph's own.
      roles: the `OpRoles` of the same index.
      batch_size: the first unknown dimension of every shape, or None.
      extra_edges: more ``(from_id, to_id)`` control edges to replay.

    Raises:
      BatchSizeError: if a size needs the batch size and none was given.
      ValueError: if the index's levels do not follow from its edges (an
        index re-levelled by hand instead of by
        `graph_index.with_planned_edges`).
    """

    def __init__(self, index, roles, batch_size=None, extra_edges=()):
        self.index = index
        self.roles = roles
        self.batch_size = batch_size
        n = index.num_ops
        self.num_ops = n
        space = [_space_of(i, index, roles) for i in range(n)]
        self.space = space
        self.initializer_ops = initializer_only_ops(index)
        inactive = roles.inactive | self.initializer_ops

        # Tensor ids: out_base[op] + output.
        out_base = [0] * (n + 1)
        for i in range(n):
            out_base[i + 1] = out_base[i] + len(index.output_shapes[i])
        self._out_base = out_base
        tensor_bytes = [0] * out_base[n]
        tensor_buffer = [_NO_BUFFER] * out_base[n]

        buf_bytes, buf_space, buf_alloc, buf_name = [], [], [], []
        use_buf, use_node = [], []
        # A device read of a device buffer through a chain of aliases,
        # reader edge first: [(reader, slot), (alias op, slot), ...]. When
        # a swap-in reroutes any edge of the chain, the read moves to the
        # swap-in's device copy (an alias op fed by a swap-in forwards the
        # copy, not the original buffer).
        use_chain = {}       # use index -> tuple of (op, slot) edges
        alias_edge = {}      # alias tensor id -> (alias op, slot)
        copy_of = {}         # host tensor id -> its device copy buffer
        resident = [0, 0, 0]
        unknown = []

        for i in range(n):
            if index.variable_bytes[i]:
                resident[space[i]] += index.variable_bytes[i]

        for level_ops in index.ops_by_level:
            for i in level_ops:
                if i in inactive:
                    continue
                op_type = index.types[i]
                for k in range(len(index.output_shapes[i])):
                    t = out_base[i] + k
                    size = self._size(i, k, unknown)
                    tensor_bytes[t] = size
                    if op_type in _VARIABLE_VIEW_TYPES or size == 0:
                        continue
                    if op_type == "Const":
                        resident[space[i]] += size
                        continue
                    slot = _alias_slot(op_type, k, index.inputs[i],
                                       inactive, index.forwards_input[i])
                    if slot is not None:
                        if slot < len(index.inputs[i]):
                            p, pk = index.inputs[i][slot]
                            if space[p] == space[i] and p not in inactive:
                                # Same buffer (or resident: no buffer at all).
                                tensor_buffer[t] = tensor_buffer[
                                    out_base[p] + pk]
                                alias_edge[t] = (i, slot)
                                continue
                    tensor_buffer[t] = len(buf_bytes)
                    buf_bytes.append(size)
                    buf_space.append(space[i])
                    buf_alloc.append(i)
                    buf_name.append(_tensor_name(index, i, k))

                # Reads of this op's inputs.
                sp_c = space[i]
                for slot, (p, pk) in enumerate(index.inputs[i]):
                    if p in inactive:
                        continue
                    t = out_base[p] + pk
                    b = tensor_buffer[t]
                    if b == _NO_BUFFER:
                        continue
                    if sp_c == DEVICE and buf_space[b] != DEVICE:
                        copy = copy_of.get(t)
                        if copy is None:
                            copy = len(buf_bytes)
                            copy_of[t] = copy
                            buf_bytes.append(tensor_bytes[t])
                            buf_space.append(DEVICE)
                            buf_alloc.append(p)
                            buf_name.append("%s (device copy)"
                                            % _tensor_name(index, p, pk))
                        b = copy
                    if sp_c == DEVICE and buf_space[b] == DEVICE and \
                            b == tensor_buffer[t]:
                        use_chain[len(use_buf)] = self._alias_chain(
                            (i, slot), t, alias_edge)
                    use_buf.append(b)
                    use_node.append(i)

        self._tensor_bytes = tensor_bytes
        self._tensor_buffer = tensor_buffer
        # (op, slot) edge -> uses whose alias chain contains it.
        edge_uses = {}
        for u, edges in use_chain.items():
            for e in edges:
                edge_uses.setdefault(e, []).append(u)
        self._use_chain = use_chain
        self._edge_uses = edge_uses
        self.buf_bytes = np.asarray(buf_bytes, dtype=np.int64)
        self.buf_space = np.asarray(buf_space, dtype=np.int8)
        self.buf_alloc = np.asarray(buf_alloc, dtype=np.int64)
        self.buf_name = buf_name
        self.use_buf = np.asarray(use_buf, dtype=np.int64)
        self.use_node = np.asarray(use_node, dtype=np.int64)
        # Uses grouped by buffer, for `freed_levels`.
        order = np.argsort(self.use_buf, kind="stable")
        self._uses_by_buf = order
        self._uses_ptr = np.searchsorted(self.use_buf[order],
                                         np.arange(len(buf_bytes) + 1))
        self.resident_device_bytes = resident[DEVICE]
        self.resident_host_bytes = resident[HOST]
        self.unknown_tensors = tuple(unknown)
        self._freed_cache = (None, {})
        self._build_successors(extra_edges)

    # ---- construction helpers -------------------------------------------
    def _size(self, op_id, output, unknown):
        index = self.index
        if index.output_itemsizes[op_id][output] == 0:
            return 0
        size = gi.tensor_bytes(index, op_id, output, self.batch_size)
        if size is not None:
            return size
        if self.batch_size is None and gi.tensor_bytes(
                index, op_id, output, 1) is not None:
            raise _size_error(index, op_id, output)
        unknown.append(_tensor_name(index, op_id, output))
        return 0

    def _alias_chain(self, edge, tensor, alias_edge):
        chain = [edge]
        while tensor in alias_edge:
            op_id, slot = alias_edge[tensor]
            chain.append((op_id, slot))
            p, pk = self.index.inputs[op_id][slot]
            tensor = self._out_base[p] + pk
        return tuple(chain)

    def _rerouted_uses(self, rerouted):
        """Device reads that a set of rerouted edges moves to copies.

        Args:
          rerouted: dict ``(consumer, slot) -> key`` of the edges a plan
            reroutes to swap-ins.

        Returns:
          A list of ``(use index, key)``: each read goes to the copy of the
          rerouted edge nearest to the reader on its alias chain.
        """
        affected = set()
        for e in rerouted:
            affected.update(self._edge_uses.get(e, ()))
        moved = []
        for u in sorted(affected):
            for e in self._use_chain[u]:
                key = rerouted.get(e)
                if key is not None:
                    moved.append((u, key))
                    break
        return moved

    def _build_successors(self, extra_edges):
        index = self.index
        n = self.num_ops
        succ = []
        for i in range(n):
            s = [c for per_out in index.consumers[i] for c, _ in per_out]
            s.extend(index.control_outputs[i])
            succ.append(s)
        for a, b in tuple(index.planned_edges) + tuple(extra_edges):
            succ[a].append(b)
        levels = topo.kahn_levels(n, succ)
        if not extra_edges and any(a < b for a, b in zip(levels,
                                                         index.levels)):
            # Some level is higher than every edge explains: the index was
            # re-levelled with edges it does not hold, and a replay could
            # not put those ops where the plan expects them.
            raise ValueError(
                "the index's levels do not follow from its edges (e.g. %s is "
                "at level %d, its edges put it at %d); add planned control "
                "edges with graph_index.with_planned_edges(index, edges)"
                % next((index.names[i], b, a) for i, (a, b) in enumerate(
                    zip(levels, index.levels)) if a < b))
        self._base_succ = succ
        self._num_base_nodes = len(succ)
        self._base_levels = levels
        # The same levels as an array: a replay that moves no original op
        # appends the swap nodes' levels to it instead of converting the
        # whole list again.
        self._base_level_array = np.asarray(levels, dtype=np.int64)

    # ---- queries ----------------------------------------------------------
    def tensor_size(self, op_id, output):
        """Bytes of a tensor as the model counts it (0 if unknown)."""
        return self._tensor_bytes[self._out_base[op_id] + output]

    def buffer_of(self, op_id, output):
        """Buffer id of a tensor, or -1 if it has none (resident, empty)."""
        return self._tensor_buffer[self._out_base[op_id] + output]

    # ---- replay -----------------------------------------------------------
    def _levels_with(self, swap_nodes, control_edges, num_nodes, shortened,
                     clone_nodes=(), clone_reroutes=()):
        """Levels of the graph with the swap nodes, clone nodes (after the
        swap nodes, ``(node, predecessors)``), the clones' rerouted readers
        (``(producer, last clone, consumers)``) and control edges added,
        when some original op may move: pushed forward from the graph's
        levels, or by Kahn's algorithm when an edge was removed."""
        n = self.num_ops
        succ = list(self._base_succ)
        copied = set()

        def own(v):
            if v < n and v not in copied:
                succ[v] = list(succ[v])
                copied.add(v)
            return succ[v]

        for p, so, waiters, ins in swap_nodes:
            p_succ = own(p)
            p_succ.append(so)
            succ.append([])
            for si, sin in ins:
                succ.append([c for c, _ in sin.consumers])
                succ[so].append(si)
                for t in sin.triggers:
                    own(t).append(si)
                for c, _ in sin.consumers:
                    p_succ.remove(c)
            succ[so].extend(waiters)
        for cn, preds in clone_nodes:
            assert cn == len(succ)
            succ.append([])
            for v in preds:
                own(v).append(cn)
        for p, last, consumers in clone_reroutes:
            p_succ = own(p)
            for c, _ in consumers:
                succ[last].append(c)
                p_succ.remove(c)
        for a, b in control_edges:
            own(a).append(b)
        assert len(succ) == num_nodes
        levels = None
        if not shortened:
            levels = topo.raise_levels(
                self._base_levels, succ,
                copied | set(range(self._num_base_nodes, len(succ))),
                max_steps=len(succ))
        if levels is None:
            levels = topo.kahn_levels(len(succ), succ)
        return levels

    def replay(self, plan=None, detail=True, copy_levels=None):
        """Simulate one iteration of the graph rewritten with `plan`.

        Args:
          plan: a `planner.Plan`, or None for the graph without LMS.
          detail: compute `live_at_peak` and `peak_op` (a few ms on large
            graphs); searches that only need the peak pass False.
          copy_levels: a `CopyLevels` of this plan (at the levels of its
            replay without them) to count copies that take time: each
            swapped tensor's device buffer lives until its copy to the host
            has finished, each swap-in's device copy from the start of its
            copy. None: copies are instant (a swapped tensor is freed after
            its swap-out's level, a copy allocated at its swap-in's level).

        Returns:
          A `SimulationResult`.
        """
        if copy_levels is not None:
            copy_levels.check_against(plan)
        added = _Additions(self)
        if plan is not None:
            self._add_swaps(added, plan.swaps, copy_levels, detail)
            self._add_recomputes(added, plan.recomputes, detail)
        control_edges = plan.control_edges if plan is not None else ()
        self._add_rerouted_reads(added)
        levels = self._replay_levels(added, control_edges)
        num_levels = int(levels.max()) + 1 if len(levels) else 0
        buffers = self._buffers_with(added)
        alloc, free = self._lifetimes(added, buffers, levels, num_levels)
        return self._result(added, buffers, levels, num_levels, alloc, free,
                            detail)

    # ---- the steps of a replay -------------------------------------------
    def _add_swaps(self, added, swaps, copy_levels, detail):
        """Swap ops are nodes numbered after the graph's (and gate) nodes,
        in plan order: each swap-out, then its swap-ins. One pass records
        their edges, buffers and reads, and their levels from the graph's
        levels: a swap-out one above its source, a swap-in one above its
        swap-out and triggers. The swap-out reads the tensor and owns a
        host buffer; each swap-in reads it and owns a device copy, which
        its consumers read instead of the tensor."""
        out_base = self._out_base
        tensor_bytes = self._tensor_bytes
        tensor_buffer = self._tensor_buffer
        base_levels = self._base_levels
        for s_index, swap in enumerate(swaps):
            p = swap.producer
            t = out_base[p] + swap.output
            size = tensor_bytes[t]
            b = tensor_buffer[t]
            added.swapout_bytes += size
            added.swapin_bytes += size * len(swap.swap_ins)
            so = added.new_node()
            so_level = base_levels[p] + 1
            added.new_levels.append(so_level)
            if detail:
                tname = _safe(_tensor_name(self.index, p, swap.output))
                added.names.append("lms/swapout_%s" % tname)
            if b != _NO_BUFFER:
                added.read(b, so)
                if copy_levels is not None:
                    added.held.append((b, copy_levels.held_through[s_index]))
            host_buf = added.buffer(size, HOST, so)
            ins = []
            for sin in swap.swap_ins:
                si = added.new_node()
                ins.append((si, sin))
                si_level = so_level
                for trig in sin.triggers:
                    if base_levels[trig] > si_level:
                        si_level = base_levels[trig]
                si_level += 1
                added.new_levels.append(si_level)
                added.read(host_buf, si)
                copy_buf = added.buffer(size, DEVICE, si)
                if copy_levels is not None:
                    added.allocated.append((copy_buf, copy_levels.allocated_from[
                        s_index][len(ins) - 1]))
                added.swapin_of[(p, swap.output, len(ins) - 1)] = (si, copy_buf)
                if detail:
                    added.names.append("lms/swapin_%s (device copy)" % tname)
                for c, slot in sin.consumers:
                    added.reroute(c, slot, copy_buf, p, si_level)
            for w in swap.waiters:
                if base_levels[w] <= so_level:
                    added.moved = True
            added.swap_nodes.append((p, so, swap.waiters, ins))

    def _add_recomputes(self, added, recomputes, detail):
        """One node per clone, after the swap nodes. A clone runs one level
        after its trigger and its inputs; its outputs are device buffers
        from then to their last reader (aliasing types forward their
        input's buffer, as the originals do); the late readers read the
        last clone, so the original buffer is freed after its early
        readers."""
        out_base = self._out_base
        tensor_bytes = self._tensor_bytes
        tensor_buffer = self._tensor_buffer
        base_levels = self._base_levels
        base_nodes = self._num_base_nodes
        index = self.index
        for rec in recomputes:
            p = rec.producer
            added.recompute_bytes += tensor_bytes[out_base[p] + rec.output]
            if detail:
                rname = "lms/recompute_%s" % _safe(
                    _tensor_name(index, p, rec.output))
            nodes, bufs = [], []
            for op, sources in zip(rec.ops, rec.inputs):
                cn = added.new_node()
                preds = [rec.trigger]
                level = base_levels[rec.trigger]
                in_bufs = []
                for src in sources:
                    if src[0] == "clone":
                        v, b = nodes[src[1]], bufs[src[1]][src[2]]
                    elif src[0] == "swapin":
                        v, b = added.swapin_of[(src[1], src[2], src[3])]
                    else:
                        v = src[1]
                        b = tensor_buffer[out_base[v] + src[2]]
                    preds.append(v)
                    v_level = (base_levels[v] if v < base_nodes
                               else added.new_levels[v - base_nodes])
                    level = max(level, v_level)
                    in_bufs.append(b)
                    if b != _NO_BUFFER:
                        added.read(b, cn)
                added.new_levels.append(level + 1)
                out_bufs = []
                for k in range(len(index.output_shapes[op])):
                    slot = _alias_slot(index.types[op], k, index.inputs[op],
                                       (), index.forwards_input[op])
                    if slot is not None and slot < len(in_bufs):
                        out_bufs.append(in_bufs[slot])
                        continue
                    size = tensor_bytes[out_base[op] + k]
                    if size == 0:
                        out_bufs.append(_NO_BUFFER)
                        continue
                    out_bufs.append(added.buffer(size, DEVICE, cn))
                    if detail:
                        added.names.append("%s/%s:%d" % (
                            rname, _safe(index.names[op]), k))
                nodes.append(cn)
                bufs.append(out_bufs)
                added.clone_nodes.append((cn, preds))
            last = nodes[-1]
            last_level = added.new_levels[last - base_nodes]
            out_buf = bufs[-1][rec.output]
            for c, slot in rec.consumers:
                added.reroute(c, slot, out_buf, p, last_level)
            added.clone_reroutes.append((p, last, rec.consumers))

    def _add_rerouted_reads(self, added):
        """Reads the rerouted inputs no longer make of the producer's buffer
        (masked) move to the copy they now read, along the graph's alias
        chains."""
        for u, copy_buf in self._rerouted_uses(added.rerouted):
            added.masked.append(u)
            if copy_buf != _NO_BUFFER:
                added.read(copy_buf, int(self.use_node[u]))

    def _replay_levels(self, added, control_edges):
        """Levels of every node of the rewritten graph."""
        base_levels = self._base_levels
        for a, b in control_edges:
            if base_levels[b] <= base_levels[a]:
                added.moved = True
        if not (added.shortened or added.moved):
            # No original op moves: the levels are the graph's, plus the
            # swap nodes' computed above (what `raise_levels` would find).
            return np.concatenate((self._base_level_array,
                                   np.asarray(added.new_levels,
                                              dtype=np.int64)))
        return np.asarray(
            self._levels_with(added.swap_nodes, control_edges, added.node,
                              added.shortened, added.clone_nodes,
                              added.clone_reroutes),
            dtype=np.int64)

    def _buffers_with(self, added):
        """``(bytes, space, alloc node, use buffer, use node)`` arrays of the
        graph's buffers and reads with the plan's added and masked."""
        if added.bytes:
            buf_bytes = np.concatenate(
                [self.buf_bytes, np.asarray(added.bytes, dtype=np.int64)])
            buf_space = np.concatenate(
                [self.buf_space, np.asarray(added.space, dtype=np.int8)])
            buf_alloc = np.concatenate(
                [self.buf_alloc, np.asarray(added.alloc, dtype=np.int64)])
        else:
            buf_bytes, buf_space, buf_alloc = (self.buf_bytes, self.buf_space,
                                               self.buf_alloc)
        use_buf, use_node = self.use_buf, self.use_node
        if added.masked:
            keep = np.ones(len(use_buf), dtype=bool)
            keep[np.asarray(added.masked, dtype=np.int64)] = False
            use_buf, use_node = use_buf[keep], use_node[keep]
        if added.use_buf:
            use_buf = np.concatenate(
                [use_buf, np.asarray(added.use_buf, dtype=np.int64)])
            use_node = np.concatenate(
                [use_node, np.asarray(added.use_node, dtype=np.int64)])
        return buf_bytes, buf_space, buf_alloc, use_buf, use_node

    @staticmethod
    def _lifetimes(added, buffers, levels, num_levels):
        """Each buffer's first and last level: allocated at its maker's,
        freed after its last reader's, or as the copies' times say."""
        _, _, buf_alloc, use_buf, use_node = buffers
        alloc = levels[buf_alloc]
        free = alloc.copy()
        np.maximum.at(free, use_buf, levels[use_node])
        if added.held:
            bufs, until = np.asarray(added.held, dtype=np.int64).T
            np.maximum.at(free, bufs, np.minimum(until, num_levels - 1))
        if added.allocated:
            bufs, since = np.asarray(added.allocated, dtype=np.int64).T
            np.minimum.at(alloc, bufs, np.maximum(since, 0))
        return alloc, free

    def _result(self, added, buffers, levels, num_levels, alloc, free,
                detail):
        """The `SimulationResult`: timelines per space, the device peak and,
        with `detail`, what is live there and which op made the peak."""
        buf_bytes, buf_space, buf_alloc, _, _ = buffers
        n = self.num_ops
        device = buf_space == DEVICE
        host = buf_space == HOST
        dev_tl = _timeline(alloc[device], free[device], buf_bytes[device],
                           num_levels) + self.resident_device_bytes
        host_tl = _timeline(alloc[host], free[host], buf_bytes[host],
                            num_levels) + self.resident_host_bytes
        peak_level = int(np.argmax(dev_tl)) if num_levels else 0
        peak = int(dev_tl[peak_level]) if num_levels else \
            self.resident_device_bytes

        peak_op = ""
        live = ()
        if detail and num_levels:
            all_names = self.buf_name + added.names
            at = np.nonzero(device & (alloc <= peak_level)
                            & (free >= peak_level))[0]
            rows = sorted(((all_names[j], int(buf_bytes[j])) for j in at),
                          key=lambda r: (-r[1], r[0]))
            if self.resident_device_bytes:
                rows.append(("<resident variables and constants>",
                             self.resident_device_bytes))
                rows.sort(key=lambda r: (-r[1], r[0]))
            live = tuple(rows)
            fresh = np.nonzero(device & (alloc == peak_level))[0]
            if len(fresh):
                j = fresh[np.argmax(buf_bytes[fresh])]
                node = int(buf_alloc[j])
                peak_op = self.index.names[node] if node < n else \
                    all_names[j].split(" ")[0]
                if peak_op.startswith("lms/recompute_"):
                    peak_op = peak_op.rpartition(":")[0]  # the clone op
        return SimulationResult(
            peak_device_bytes=peak,
            peak_level=peak_level,
            peak_op=peak_op,
            live_at_peak=live,
            peak_host_bytes=int(host_tl.max()) if num_levels else
            self.resident_host_bytes,
            device_timeline=dev_tl,
            host_timeline=host_tl,
            resident_device_bytes=self.resident_device_bytes,
            resident_host_bytes=self.resident_host_bytes,
            num_levels=num_levels,
            levels=levels[:n],
            swapout_bytes=added.swapout_bytes,
            swapin_bytes=added.swapin_bytes,
            recompute_bytes=added.recompute_bytes)

    def freed_levels(self, swap, levels):
        """Levels at which swapping one tensor frees its device bytes.

        An estimate for choosing what to swap, computed from the levels of a
        previous replay (swap ops do not move original ops in asynchronous
        modes): the tensor's buffer is freed after its remaining readers and
        the swap-out, and comes back as a device copy from each swap-in
        (just after its triggers) to that swap-in's last reader.

        Args:
          swap: a `planner.SwapPlan`.
          levels: per-op levels, e.g. `SimulationResult.levels`.

        Returns:
          A list of inclusive ``(first, last)`` level ranges, ascending.
        """
        # The tuner asks again about the same swaps with the same levels
        # (every candidate pool starts from the replay without swaps).
        cached_levels, answers = self._freed_cache
        if cached_levels is not levels:
            answers = {}
            self._freed_cache = (levels, answers)
        found = answers.get(swap)
        if found is None:
            found = answers[swap] = self._freed_levels(swap, levels)
        return list(found)

    def _freed_levels(self, swap, levels):
        b = self.buffer_of(swap.producer, swap.output)
        if b == _NO_BUFFER:
            return []
        rerouted = {cs: k for k, sin in enumerate(swap.swap_ins)
                    for cs in sin.consumers}
        moved = dict(self._rerouted_uses(rerouted))
        lo, hi = self._uses_ptr[b], self._uses_ptr[b + 1]
        uses = self._uses_by_buf[lo:hi]
        alloc = int(levels[self.buf_alloc[b]])
        end = alloc
        near = max(alloc, int(levels[swap.producer]) + 1)
        last_read = [max(int(levels[c]) for c, _ in sin.consumers)
                     for sin in swap.swap_ins]
        for u in uses:
            lvl = int(levels[self.use_node[u]])
            end = max(end, lvl)
            k = moved.get(int(u))
            if k is None:
                near = max(near, lvl)
            else:
                last_read[k] = max(last_read[k], lvl)
        copies = []
        for sin, last in zip(swap.swap_ins, last_read):
            start = max([int(levels[t]) + 1 for t in sin.triggers]
                        + [int(levels[swap.producer]) + 2])
            copies.append((start, last))
        copies.sort()
        freed = []
        cursor = near + 1
        for start, last in copies:
            if start > cursor:
                freed.append((cursor, min(start - 1, end)))
            cursor = max(cursor, last + 1)
        if cursor <= end:
            freed.append((cursor, end))
        return [(a, z) for a, z in freed if a <= z]


def _safe(tensor_name):
    return tensor_name.replace("/", "_").replace(":", "_")


def _timeline(alloc, free, nbytes, num_levels):
    """Bytes live per level from [alloc, free] intervals (inclusive)."""
    diff = np.zeros(num_levels + 1, dtype=np.int64)
    np.add.at(diff, alloc, nbytes)
    np.add.at(diff, free + 1, -nbytes)
    return np.cumsum(diff[:num_levels])
