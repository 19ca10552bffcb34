"""The graph's buffers and reads, made once per model: what a replay
counts without any plan (see `tflms.simulator` for the memory model).

`GraphBuffers` sizes every tensor (from static shapes and the batch size),
gives each output of an active op a buffer on its memory space, or the
buffer it aliases, records who reads which buffer (device copies of host
tensors included) and the alias chains a swap-in can reroute, and sums the
resident bytes (variables and constants).
"""

import numpy as np

from tflms import devices
from tflms.errors import LMSError
from tflms import graph_index as gi
from tflms.initializers import initializer_only_ops
from tflms.inplace import inplace_candidates

# Memory spaces.
DEVICE, HOST, OTHER = 0, 1, 2

# Ops whose outputs are the variable they read or hold.
_VARIABLE_VIEW_TYPES = frozenset({
    "ReadVariableOp", "VarHandleOp", "VariableV2", "Variable",
    "VarHandleOpV2",
})

NO_BUFFER = -1

# v1 control flow hands buffers on too: both outputs of a Switch are its data
# input; Enter, Exit and NextIteration pass theirs on; a Merge outputs
# whichever input is alive (the active one).
_FORWARD_INPUT0_TYPES = frozenset({
    "Switch", "RefSwitch", "Enter", "RefEnter", "Exit", "RefExit",
    "NextIteration", "RefNextIteration",
})
_MERGE_TYPES = frozenset({"Merge", "RefMerge"})


def alias_slot(op_type, output, inputs, inactive, forwards=None):
    """The input slot whose buffer output `output` of an op reuses, or None.
    `forwards`: the op's `GraphIndex.forwards_input`."""
    if forwards is not None and output == 0:
        return forwards
    if op_type in gi.BUFFER_FORWARDING_TYPES:
        return output if op_type == "IdentityN" else 0
    if op_type in _FORWARD_INPUT0_TYPES:
        return 0
    if op_type in _MERGE_TYPES and output == 0:
        for slot, (p, _) in enumerate(inputs):
            if p not in inactive:
                return slot
    return None


class BatchSizeError(LMSError, ValueError):
    """A tensor size needs the mini-batch size, and none was given."""


def space_of(op_id, index, roles):
    if op_id in roles.device_ops:
        return DEVICE
    if devices.is_cpu_device(index.devices[op_id]):
        return HOST
    return OTHER


def tensor_name(index, op_id, output):
    return "%s:%d" % (index.names[op_id], output)


def size_error(index, op_id, output):
    shape = index.output_shapes[op_id][output]
    shown = "(%s)" % ", ".join("?" if d is None else str(d) for d in shape)
    return BatchSizeError(
        "LMS cannot size tensor %r (shape %s) without the mini-batch size: "
        "set lms.batch_size = <your mini-batch size> or set "
        "swapout_threshold, swapin_ahead and swapin_groupby by hand"
        % (tensor_name(index, op_id, output), shown))


class _BufferLayout:
    """Lays a graph's tensors out in buffers and records their reads, op
    by op in level order: what `GraphBuffers` holds, as Python lists.

    Every tensor of a buffer is made before its last reader's level, so
    the per-buffer read counts an in-place write asks for
    (`_inplace_slot`) are complete when it asks.
    """

    def __init__(self, index, roles, batch_size, landings=()):
        self.index = index
        self.batch_size = batch_size
        n = index.num_ops
        self.space = [space_of(i, index, roles) for i in range(n)]
        self.initializer_ops = initializer_only_ops(index)
        self.inactive = roles.inactive | self.initializer_ops
        # Reads Grappler removes before the step runs
        # (`GraphIndex.hands_on_unread`: an IdentityN's read of an input it
        # hands on to no reader, as tf.custom_gradient's in graph mode):
        # they hold nothing, as no swap-in serves them.
        self.unread_handoffs = frozenset(
            (i, slot) for i, op_type in enumerate(index.types)
            if op_type == "IdentityN"
            for slot in range(len(index.inputs[i]))
            if index.hands_on_unread(i, slot))
        # Tensor ids: out_base[op] + output.
        out_base = [0] * (n + 1)
        for i in range(n):
            out_base[i + 1] = out_base[i] + len(index.output_shapes[i])
        self.out_base = out_base
        self.tensor_bytes = [0] * out_base[n]
        self.tensor_buffer = [NO_BUFFER] * out_base[n]
        self.buf_bytes, self.buf_space = [], []
        self.buf_alloc, self.buf_name = [], []
        self.use_buf, self.use_node = [], []
        # A device read of a device buffer through a chain of aliases,
        # reader edge first: [(reader, slot), (alias op, slot), ...]. When
        # a swap-in reroutes any edge of the chain, the read moves to the
        # swap-in's device copy (an alias op fed by a swap-in forwards the
        # copy, not the original buffer).
        self.use_chain = {}       # use index -> tuple of (op, slot) edges
        self.alias_edge = {}      # alias tensor id -> (alias op, slot)
        self.copy_of = {}         # host tensor id -> its device copy buffer
        self.resident = [0, 0, 0]
        self.unknown = []
        # Per buffer, the latest level that reads it, the ops reading it
        # there and the tensors it holds: an element-wise op at that level
        # that is its only reader there may write its output into it
        # (`tflms.inplace`).
        self.last_read = []       # buffer -> [level, {reader: slots}]
        self.buf_tensors = []     # buffer -> tensor ids held in it
        self.overwritten_by = {}  # tensor id -> op that wrote over its buffer
        for i in range(n):
            if index.variable_bytes[i]:
                self.resident[self.space[i]] += index.variable_bytes[i]
        for level_ops in index.ops_by_level:
            for i in level_ops:
                if i in self.inactive:
                    continue
                for k in range(len(index.output_shapes[i])):
                    self._place_output(i, k)
                self._read_inputs(i)
        for i, nbytes, name in landings:
            if i not in self.inactive and nbytes:
                # Read by nothing the graph shows: alive at i's level only.
                self._new_buffer(nbytes, DEVICE, i, name, -1)

    def _place_output(self, i, k):
        """Output `k` of op `i`: resident, an alias of an input's buffer,
        written in place over one, or a buffer of its own."""
        index, space, inactive = self.index, self.space, self.inactive
        op_type = index.types[i]
        t = self.out_base[i] + k
        size = self._size(i, k)
        self.tensor_bytes[t] = size
        if op_type in _VARIABLE_VIEW_TYPES or size == 0:
            return
        if op_type == "Const":
            self.resident[space[i]] += size
            return
        slot = alias_slot(op_type, k, index.inputs[i], inactive,
                          index.forwards_input[i])
        if slot is not None:
            if slot < len(index.inputs[i]):
                p, pk = index.inputs[i][slot]
                if space[p] == space[i] and p not in inactive:
                    # Same buffer (or resident: no buffer at all).
                    b = self.tensor_buffer[self.out_base[p] + pk]
                    self.tensor_buffer[t] = b
                    self.alias_edge[t] = (i, slot)
                    if b != NO_BUFFER:
                        self._add_tensor(b, t, i, k)
                    return
        elif k == 0 and space[i] == DEVICE:
            slot = self._inplace_slot(i, size)
            if slot is not None:
                p, pk = index.inputs[i][slot]
                b = self.tensor_buffer[self.out_base[p] + pk]
                for old in self.buf_tensors[b]:
                    self.overwritten_by.setdefault(old, i)
                self.tensor_buffer[t] = b
                self.alias_edge[t] = (i, slot)
                self._add_tensor(b, t, i, k)
                return
        self.tensor_buffer[t] = b = self._new_buffer(
            size, space[i], i, tensor_name(index, i, k), index.levels[i])
        self._add_tensor(b, t, i, k)

    def _new_buffer(self, size, space, maker, name, last_level):
        b = len(self.buf_bytes)
        self.buf_bytes.append(size)
        self.buf_space.append(space)
        self.buf_alloc.append(maker)
        self.buf_name.append(name)
        self.last_read.append([last_level, {}])
        self.buf_tensors.append([])
        return b

    def _read_inputs(self, i):
        """The reads of op `i`'s inputs; a device op reading a tensor of
        another space reads a device copy of it, made once."""
        sp_c = self.space[i]
        buf_space = self.buf_space
        unread = self.unread_handoffs
        for slot, (p, pk) in enumerate(self.index.inputs[i]):
            if p in self.inactive or (unread and (i, slot) in unread):
                continue
            t = self.out_base[p] + pk
            b = self.tensor_buffer[t]
            if b == NO_BUFFER:
                continue
            if sp_c == DEVICE and buf_space[b] != DEVICE:
                copy = self.copy_of.get(t)
                if copy is None:
                    # Never written over in place (the copy's readers are
                    # not counted per level here): last level -1.
                    copy = self.copy_of[t] = self._new_buffer(
                        self.tensor_bytes[t], DEVICE, p,
                        "%s (device copy)" % tensor_name(self.index, p, pk),
                        -1)
                b = copy
            if sp_c == DEVICE and buf_space[b] == DEVICE and \
                    b == self.tensor_buffer[t]:
                self.use_chain[len(self.use_buf)] = self._alias_chain(
                    (i, slot), t)
            self.use_buf.append(b)
            self.use_node.append(i)

    def _add_tensor(self, b, t, op_id, output):
        """Tensor `t` (output `output` of `op_id`) is held in buffer `b`:
        its readers read `b`."""
        self.buf_tensors[b].append(t)
        levels = self.index.levels
        entry = self.last_read[b]
        unread = self.unread_handoffs
        for c, slot in self.index.consumers[op_id][output]:
            if c in self.inactive or (unread and (c, slot) in unread):
                continue
            level = levels[c]
            if level > entry[0]:
                entry[0] = level
                entry[1] = {c: 1}
            elif level == entry[0]:
                entry[1][c] = entry[1].get(c, 0) + 1

    def _inplace_slot(self, op_id, size):
        """The input slot whose device buffer op `op_id` writes its output
        0 (of `size` bytes) into, or None (`tflms.inplace`): the first
        candidate slot whose buffer has the output's size and element size
        and whose only read at the latest level that reads it is this op's,
        through this one slot."""
        index = self.index
        inputs = index.inputs[op_id]
        slots = inplace_candidates(index.types[op_id], len(inputs))
        if not slots or size == 0:
            return None
        itemsize = index.output_itemsizes[op_id][0]
        level = index.levels[op_id]
        out_base, inactive = self.out_base, self.inactive
        tensor_bytes, tensor_buffer = self.tensor_bytes, self.tensor_buffer
        for slot in slots:
            p, pk = inputs[slot]
            if p in inactive or index.output_itemsizes[p][pk] != itemsize:
                continue
            t = out_base[p] + pk
            b = tensor_buffer[t]
            if (b == NO_BUFFER or self.buf_space[b] != DEVICE
                    or tensor_bytes[t] != size):
                continue
            last_level, readers = self.last_read[b]
            if last_level == level and readers == {op_id: 1}:
                return slot
        return None

    def _size(self, op_id, output):
        index = self.index
        if index.output_itemsizes[op_id][output] == 0:
            return 0
        size = gi.tensor_bytes(index, op_id, output, self.batch_size)
        if size is not None:
            return size
        if self.batch_size is None and gi.tensor_bytes(
                index, op_id, output, 1) is not None:
            raise size_error(index, op_id, output)
        self.unknown.append(tensor_name(index, op_id, output))
        return 0

    def _alias_chain(self, edge, tensor):
        chain = [edge]
        while tensor in self.alias_edge:
            op_id, slot = self.alias_edge[tensor]
            chain.append((op_id, slot))
            p, pk = self.index.inputs[op_id][slot]
            tensor = self.out_base[p] + pk
        return tuple(chain)


class GraphBuffers:
    """The buffers and reads of a graph without a plan.

    Args:
      index: a `GraphIndex`.
      roles: the `OpRoles` of the same index.
      batch_size: the first unknown dimension of every shape, or None.

    Raises:
      BatchSizeError: if a size needs the batch size and none was given.

    Attributes:
      num_ops, space (per op), initializer_ops: the index's ops, their
        memory spaces and the ops that only initialize variables.
      out_base: tensor ids, ``out_base[op] + output``.
      tensor_bytes, tensor_buffer: per tensor id, its bytes and its buffer
        (`NO_BUFFER` if none).
      buf_bytes, buf_space, buf_alloc, buf_name: per buffer, its bytes,
        space, maker op and name.
      use_buf, use_node: the reads, one entry per (buffer, reader).
      uses_by_buf, uses_ptr: the reads grouped by buffer.
      use_chain, edge_uses: device reads through chains of aliases, and
        the reads each ``(op, slot)`` edge of such a chain carries.
      alias_edge: tensor id -> the ``(op, slot)`` edge whose input buffer
        the tensor is (an alias, or an output written in place).
      overwritten_by: tensor id -> the op that wrote its output into the
        tensor's buffer in place (`tflms.inplace`): the tensor's value is
        gone after that op, so a read a plan adds later needs a buffer of
        its own (`Additions`).
      resident_device_bytes, resident_host_bytes, unknown_tensors.
    """

    def __init__(self, index, roles, batch_size=None, landings=()):
        self.index = index
        self.batch_size = batch_size
        self.num_ops = index.num_ops
        layout = _BufferLayout(index, roles, batch_size, landings)
        self.space = layout.space
        self.inactive = layout.inactive
        self.initializer_ops = layout.initializer_ops
        self.out_base = layout.out_base
        self.tensor_bytes = layout.tensor_bytes
        self.tensor_buffer = layout.tensor_buffer
        self.overwritten_by = layout.overwritten_by
        self.alias_edge = layout.alias_edge
        # (op, slot) edge -> uses whose alias chain contains it.
        edge_uses = {}
        for u, edges in layout.use_chain.items():
            for e in edges:
                edge_uses.setdefault(e, []).append(u)
        self.use_chain = layout.use_chain
        self.edge_uses = edge_uses
        self.buf_bytes = np.asarray(layout.buf_bytes, dtype=np.int64)
        self.buf_space = np.asarray(layout.buf_space, dtype=np.int8)
        self.buf_alloc = np.asarray(layout.buf_alloc, dtype=np.int64)
        self.buf_name = layout.buf_name
        self.use_buf = np.asarray(layout.use_buf, dtype=np.int64)
        self.use_node = np.asarray(layout.use_node, dtype=np.int64)
        # Uses grouped by buffer, for `freed_levels`.
        order = np.argsort(self.use_buf, kind="stable")
        self.uses_by_buf = order
        self.uses_ptr = np.searchsorted(self.use_buf[order],
                                        np.arange(len(layout.buf_bytes) + 1))
        self.resident_device_bytes = layout.resident[DEVICE]
        self.resident_host_bytes = layout.resident[HOST]
        self.unknown_tensors = tuple(layout.unknown)

    def buffer_read(self, t, rerouted):
        """The buffer a read that a plan adds of tensor `t` reads: the copy
        of the rerouted edge nearest to `t` on its alias chain (an alias or
        in-place op fed by a swap-in holds its output in the copy), else
        `t`'s own buffer. `rerouted`: ``(consumer, slot) -> buffer``."""
        tensor = t
        while tensor in self.alias_edge:
            edge = self.alias_edge[tensor]
            if edge in rerouted:
                return rerouted[edge]
            op_id, slot = edge
            p, pk = self.index.inputs[op_id][slot]
            tensor = self.out_base[p] + pk
        return self.tensor_buffer[t]

    def rerouted_uses(self, rerouted):
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
            affected.update(self.edge_uses.get(e, ()))
        moved = []
        for u in sorted(affected):
            for e in self.use_chain[u]:
                key = rerouted.get(e)
                if key is not None:
                    moved.append((u, key))
                    break
        return moved
