"""One read-only index of a `tf.Graph`, built once, queried everywhere.

`build_index` walks the graph a single time and records, per operation id
(ids are positions in ``graph.get_operations()``, i.e. creation order):
names, types, devices, data inputs and consumers per tensor, control inputs
and outputs, static output shapes and element sizes, variable sizes, and
the few control-flow facts LMS needs. Levels of the categorized topological
sort are computed from it. Every analysis (planning, simulation, tuning)
answers its questions from this index with integer ids and never touches
the `tf.Graph` again, which keeps the analysis pure, deterministic and
O(V + E).

The index holds the `tf.Operation` objects only so that the rewriter can map
ids back to ops; nothing here mutates the graph.
"""

import dataclasses

import tensorflow as tf

from tflms import topo

__all__ = [
    "GraphIndex",
    "build_index",
    "tensor_bytes",
    "is_cpu_device",
    "CONTROL_FLOW_V1_TYPES",
    "BACK_EDGE_TYPES",
]

# v1 control-flow primitives: never triggers, never swap sources or sinks.
CONTROL_FLOW_V1_TYPES = frozenset({
    "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit",
    "RefExit", "NextIteration", "RefNextIteration", "LoopCond",
})

_VARIABLE_HOLDER_TYPES = frozenset({
    "VarHandleOp", "VariableV2", "Variable", "VarHandleOpV2",
})

# A NextIteration op feeds its loop's Merge from the previous iteration: the
# only back edge of a v1 loop. Levels ignore it, as TensorFlow's own
# topological orders do.
BACK_EDGE_TYPES = frozenset({"NextIteration", "RefNextIteration"})

# Element sizes of dtypes whose tensors are not plain buffers of numbers.
_OPAQUE_DTYPES = frozenset({tf.resource, tf.variant, tf.string})


def is_cpu_device(device):
    """True if a device string names a CPU (``/cpu:0``, ``/device:CPU:0``...)."""
    if not device:
        return False
    spec = tf.DeviceSpec.from_string(device)
    return (spec.device_type or "").upper() == "CPU"


@dataclasses.dataclass(frozen=True)
class GraphIndex:
    """Plain-data view of a graph; every per-op field is a list indexed by id.

    Attributes:
      ops: the `tf.Operation` of each id (only the rewriter uses these).
      names, types, devices: per-op strings.
      inputs: per op, a tuple of ``(producer_id, output_index)``, one per data
        input slot, in slot order.
      consumers: per op, a tuple (one entry per output) of tuples of
        ``(consumer_id, input_slot)``.
      control_inputs / control_outputs: per op, tuples of op ids.
      fanins / fanouts: per op, sorted tuples of distinct data producers /
        consumers.
      output_shapes: per op, a tuple per output: ``None`` for unknown rank,
        else a tuple of dims with ``None`` for unknown dims.
      output_itemsizes: per op, bytes per element of each output (0 for
        resource, variant and string tensors, which hold no activations).
      variable_bytes: per op, bytes of the variable it holds (VarHandleOp,
        VariableV2), else 0. Variables are resident for the whole step.
      is_stateful: per op, True if its op def is stateful (random numbers,
        variables, queues...) or it takes a reference input (updates of v1
        ref variables): such an op is never a compile-time constant, and
        running it may have side effects.
      bn_is_training: per op, the ``is_training`` attribute of fused
        batch-norm ops, else None.
      in_v1_cond / in_v1_loop: per op, True if the op was built inside a v1
        ``tf.cond`` branch / ``tf.while_loop`` body (Switch/Merge and
        Enter/Exit control flow).
      levels: per op, its level in the categorized topological sort.
      ops_by_level: per level, the op ids in increasing id order.
      id_of: op name -> id.
    """

    ops: tuple
    names: tuple
    types: tuple
    devices: tuple
    inputs: tuple
    consumers: tuple
    control_inputs: tuple
    control_outputs: tuple
    fanins: tuple
    fanouts: tuple
    output_shapes: tuple
    output_itemsizes: tuple
    variable_bytes: tuple
    is_stateful: tuple
    bn_is_training: tuple
    in_v1_cond: tuple
    in_v1_loop: tuple
    levels: tuple
    ops_by_level: tuple
    id_of: dict

    @property
    def num_ops(self):
        return len(self.names)

    @property
    def num_levels(self):
        return len(self.ops_by_level)

    @property
    def num_edges(self):
        """Data edges between distinct ops plus control edges."""
        return (sum(len(f) for f in self.fanouts)
                + sum(len(c) for c in self.control_outputs))

    def successors(self, op_id):
        """Distinct data consumers and control outputs of an op."""
        return _merge_sorted(self.fanouts[op_id], self.control_outputs[op_id])

    def level_successors(self, op_id):
        """Successors that count for levels: all but loop back edges."""
        if self.types[op_id] in BACK_EDGE_TYPES:
            return ()
        return self.successors(op_id)

    def predecessors(self, op_id):
        """Distinct data producers and control inputs of an op."""
        return _merge_sorted(self.fanins[op_id], self.control_inputs[op_id])


def _merge_sorted(a, b):
    if not b:
        return a
    if not a:
        return b
    return tuple(sorted(set(a) | set(b)))


def _control_flow_kind(op):
    """'cond', 'while' or None for the innermost v1 control-flow context."""
    ctx = getattr(op, "_control_flow_context", None)
    if ctx is None:
        return None
    # A cond nested in a while loop is still inside the loop.
    kind = None
    while ctx is not None:
        if ctx.IsWhileContext():
            return "while"
        if ctx.IsCondContext() and kind is None:
            kind = "cond"
        ctx = ctx.outer_context
    return kind


def _static_shape(tensor):
    shape = tensor.shape
    if shape.rank is None:
        return None
    return tuple(shape.as_list())


def _itemsize(dtype):
    if dtype in _OPAQUE_DTYPES:
        return 0
    try:
        return dtype.size
    except (TypeError, ValueError):
        return 0


def _variable_bytes(op):
    if op.type not in _VARIABLE_HOLDER_TYPES:
        return 0
    try:
        shape = tf.TensorShape(op.get_attr("shape"))
        dtype = tf.as_dtype(op.get_attr("dtype"))
    except (ValueError, TypeError):
        return 0
    if not shape.is_fully_defined():
        return 0
    return shape.num_elements() * _itemsize(dtype)


def build_index(graph, extra_control_edges=()):
    """Index a graph once.

    Args:
      graph: a `tf.Graph`.
      extra_control_edges: ``(from_id, to_id)`` pairs treated as control edges
        in addition to the graph's own. Used to compute the levels of a plan
        (e.g. serialization) before the graph is edited.

    Returns:
      A `GraphIndex`.

    Raises:
      topo.GraphCycleError: if the graph (with the extra edges) has a cycle.
    """
    ops = tuple(graph.get_operations())
    id_of = {op.name: i for i, op in enumerate(ops)}
    n = len(ops)

    names, types, devices = [], [], []
    inputs, control_inputs = [], []
    output_shapes, output_itemsizes = [], []
    variable_bytes, bn_is_training, is_stateful = [], [], []
    in_cond, in_loop = [], []
    consumers = []
    stateful_by_type = {}  # an op def is per type
    # Each TensorFlow accessor is a call into C; on graphs of 10^5 ops they
    # are most of the indexing time, so each is asked once per op and
    # itemsizes once per dtype.
    itemsize_of = {}
    for op in ops:
        op_type = op.type
        names.append(op.name)
        types.append(op_type)
        devices.append(op.device)
        inputs.append(tuple((id_of[t.op.name], t.value_index)
                            for t in op.inputs))
        control_inputs.append(tuple(sorted({id_of[c.name]
                                            for c in op.control_inputs})))
        outs = op.outputs
        output_shapes.append(tuple(_static_shape(t) for t in outs))
        sizes = []
        for t in outs:
            dtype = t.dtype
            size = itemsize_of.get(dtype)
            if size is None:
                size = itemsize_of[dtype] = _itemsize(dtype)
            sizes.append(size)
        output_itemsizes.append(tuple(sizes))
        consumers.append([[] for _ in outs])
        variable_bytes.append(_variable_bytes(op)
                              if op_type in _VARIABLE_HOLDER_TYPES else 0)
        # Ops that write through a reference input (Assign, ApplyMomentum...
        # on v1 ref variables) are not stateful in their op defs, but they
        # change state all the same.
        stateful = stateful_by_type.get(op_type)
        if stateful is None:
            op_def = op.op_def
            stateful = bool(op_def.is_stateful) or any(
                arg.is_ref for arg in op_def.input_arg)
            stateful_by_type[op_type] = stateful
        is_stateful.append(stateful)
        if op_type.startswith("FusedBatchNorm"):
            bn_is_training.append(bool(op.get_attr("is_training")))
        else:
            bn_is_training.append(None)
        kind = _control_flow_kind(op)
        in_cond.append(kind == "cond")
        in_loop.append(kind == "while")

    control_outputs = [[] for _ in range(n)]
    # Consumers come in increasing id order, so each fanout list is sorted
    # and a repeated consumer is its last entry.
    fanouts = [[] for _ in range(n)]
    for i in range(n):
        for slot, (producer, out) in enumerate(inputs[i]):
            consumers[producer][out].append((i, slot))
            fanout = fanouts[producer]
            if not fanout or fanout[-1] != i:
                fanout.append(i)
        for c in control_inputs[i]:
            control_outputs[c].append(i)

    extra_out = [[] for _ in range(n)]
    for a, b in extra_control_edges:
        extra_out[a].append(b)
    successors = [
        [] if types[i] in BACK_EDGE_TYPES
        else list(fanouts[i]) + control_outputs[i] + extra_out[i]
        for i in range(n)
    ]
    levels = topo.kahn_levels(n, successors)

    return GraphIndex(
        ops=ops,
        names=tuple(names),
        types=tuple(types),
        devices=tuple(devices),
        inputs=tuple(inputs),
        consumers=tuple(tuple(tuple(c) for c in per_op)
                        for per_op in consumers),
        control_inputs=tuple(control_inputs),
        control_outputs=tuple(tuple(c) for c in control_outputs),
        fanins=tuple(tuple(sorted({p for p, _ in ins})) for ins in inputs),
        fanouts=tuple(tuple(f) for f in fanouts),
        output_shapes=tuple(output_shapes),
        output_itemsizes=tuple(output_itemsizes),
        variable_bytes=tuple(variable_bytes),
        is_stateful=tuple(is_stateful),
        bn_is_training=tuple(bn_is_training),
        in_v1_cond=tuple(in_cond),
        in_v1_loop=tuple(in_loop),
        levels=tuple(levels),
        ops_by_level=tuple(tuple(g) for g in topo.group_by_level(levels)),
        id_of=id_of,
    )


def tensor_bytes(index, op_id, output, batch_size=None):
    """Static size in bytes of an output tensor.

    The first unknown dimension is taken as the batch size; any further
    unknown dimension makes the size unknown.

    Args:
      index: a `GraphIndex`.
      op_id: producer id.
      output: output index.
      batch_size: value for the first unknown dimension, or None.

    Returns:
      The size in bytes, or None if it cannot be known statically.
    """
    itemsize = index.output_itemsizes[op_id][output]
    if itemsize == 0:
        return 0
    shape = index.output_shapes[op_id][output]
    if shape is None:
        return None
    elements = 1
    batch_used = False
    for dim in shape:
        if dim is None:
            if batch_used or batch_size is None:
                return None
            dim = batch_size
            batch_used = True
        elements *= dim
    return elements * itemsize
