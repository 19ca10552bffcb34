"""One read-only index of a graph, built once, queried everywhere.

A `GraphIndex` records, per operation id (ids are positions in creation
order): names, types, devices, data inputs and consumers per tensor,
control inputs and outputs, static output shapes and element sizes,
variable sizes, the floating-point operations of matrix products and
convolutions (for the step-time model), and the few control-flow facts LMS
needs. Levels of the categorized topological sort are computed from it.
Every analysis (planning, simulation, tuning) answers its questions from
this index with integer ids, which keeps the analysis pure, deterministic
and O(V + E).

This module imports no TensorFlow (`tests/test_pure_core.py`), and nor do
the modules that query the index. Two constructors make an index:
`tflms.tf_reader.build_index` reads the training step of a `tf.Graph` (the
one reader of TensorFlow before the rewriter: whatever `analysis`,
`planner` and `simulator` need beyond the graph's structure, such as
collections, function libraries, control-flow contexts and op defs, it
reads once into plain per-op fields), and `from_edges` builds the same kind
of index from literal names and edges, with no graph behind it. Both end in
`assemble`. `graph_index.build_index` still works: it is handed on from
`tf_reader`, which loads TensorFlow, on first use.

The index holds the `tf.Operation` objects only so that the rewriter can map
ids back to ops (an index from `from_edges` has none, and the rewriter
refuses it); nothing here mutates the graph.
"""

import dataclasses
import numbers

from tflms import step as step_mod
from tflms import topo
from tflms.devices import DeviceKey, is_cpu_device, parse_device

__all__ = [
    "GraphIndex",
    "from_edges",
    "with_planned_edges",
    "DEFAULT_DEVICE",
    "FORWARDING_TYPES",
    "APPLY_PREFIXES",
    "tensor_bytes",
    "op_flops",
    "contraction_flops",
    "FLOP_TYPES",
    "is_cpu_device",
    "DeviceKey",
    "parse_device",
    "CONTROL_FLOW_V1_TYPES",
    "BACK_EDGE_TYPES",
    "COLLECTIVE_TYPES",
    "FUNCTION_CALL_TYPES",
]

# Names that moved to `tflms.tf_reader`, handed on from there on first use
# (PEP 562) so that `graph_index.build_index(graph, fetches)` keeps working
# for its callers while importing this module loads no TensorFlow.
_READER_NAMES = frozenset({"build_index"})


def __getattr__(name):
    if name in _READER_NAMES:
        from tflms import tf_reader  # pylint: disable=import-outside-toplevel
        return getattr(tf_reader, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


# v1 control-flow primitives: never triggers, never swap sources or sinks.
CONTROL_FLOW_V1_TYPES = frozenset({
    "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit",
    "RefExit", "NextIteration", "RefNextIteration", "LoopCond",
})

# A NextIteration op feeds its loop's Merge from the previous iteration: the
# only back edge of a v1 loop. Levels ignore it, as TensorFlow's own
# topological orders do.
BACK_EDGE_TYPES = frozenset({"NextIteration", "RefNextIteration"})

# Cross-process and cross-device collectives (Horovod, NCCL, TF collective
# ops). LMS never swaps their inputs or outputs and never hangs a control edge
# on them: every rank must submit the same collectives in a compatible order,
# and a data-parallel job gains nothing from moving a gradient that is about
# to be reduced and applied. Function-call ops whose bodies hold one count too
# (`GraphIndex.calls_collective`): Horovod wraps each allreduce in a `tf.cond`.
COLLECTIVE_TYPES = frozenset({
    "HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather",
    "HorovodGroupedAllgather", "HorovodBroadcast", "HorovodBroadcastInplace",
    "HorovodAlltoall", "HorovodReducescatter", "HorovodGroupedReducescatter",
    "HorovodJoin", "HorovodBarrier",
    "NcclAllReduce", "NcclReduce", "NcclBroadcast",
    "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3",
    "CollectiveGather", "CollectiveGatherV2", "CollectiveBcastSend",
    "CollectiveBcastRecv", "CollectiveBcastSendV2", "CollectiveBcastRecvV2",
    "CollectiveAllToAllV2", "CollectiveAllToAllV3",
    "CollectiveReduceScatterV2",
})

# Ops that run functions of the graph's library.
FUNCTION_CALL_TYPES = frozenset({
    "If", "StatelessIf", "Case", "StatelessCase", "While", "StatelessWhile",
    "PartitionedCall", "StatefulPartitionedCall",
})

# Contractions whose floating-point operations the index counts, each a
# function of (attr, input shapes, output shapes) with every dimension known,
# where attr(name) is the op's attribute (the reader passes
# `tf.Operation.get_attr`). A multiply-add is two operations, as in
# TensorFlow's registered "flops" statistics (``tf.compat.v1``
# ``ops.get_stats_for_node_def``), which cover the forward ops only, and need
# fully known shapes; the gradients here cost what their forward op does (the
# same multiply-adds in another order).
def prod(dims):
    """The product of a sequence of ints (1 for none)."""
    total = 1
    for d in dims:
        total *= d
    return total


def _matmul_flops(attr, ins, outs):
    a = ins[0]
    k = a[0] if attr("transpose_a") else a[1]
    return 2 * k * prod(outs[0])


def _batch_matmul_flops(attr, ins, outs):
    a = ins[0]
    k = a[-2] if attr("adj_x") else a[-1]
    return 2 * k * prod(outs[0])


def _conv_flops(attr, ins, outs):
    # filter (..., in_depth, out_depth): each output element is a dot
    # product over the window and the input depth.
    return 2 * prod(outs[0]) * prod(ins[1][:-1])


def _conv_backprop_input_flops(attr, ins, outs):
    # (input_sizes, filter, out_backprop)
    return 2 * prod(ins[2]) * prod(ins[1][:-1])


def _conv_backprop_filter_flops(attr, ins, outs):
    # (input, filter_sizes, out_backprop); the output is the filter.
    return 2 * prod(ins[2]) * prod(outs[0][:-1])


def _depthwise_flops(attr, ins, outs):
    return 2 * prod(outs[0]) * prod(ins[1][:-2])


def _depthwise_backprop_input_flops(attr, ins, outs):
    return 2 * prod(ins[2]) * prod(ins[1][:-2])


def _depthwise_backprop_filter_flops(attr, ins, outs):
    return 2 * prod(ins[2]) * prod(outs[0][:-2])


_FLOP_RULES = {
    "MatMul": _matmul_flops,
    "BatchMatMul": _batch_matmul_flops,
    "BatchMatMulV2": _batch_matmul_flops,
    "BatchMatMulV3": _batch_matmul_flops,
    "Conv2D": _conv_flops,
    "Conv3D": _conv_flops,
    "Conv2DBackpropInput": _conv_backprop_input_flops,
    "Conv3DBackpropInputV2": _conv_backprop_input_flops,
    "Conv2DBackpropFilter": _conv_backprop_filter_flops,
    "Conv3DBackpropFilterV2": _conv_backprop_filter_flops,
    "DepthwiseConv2dNative": _depthwise_flops,
    "DepthwiseConv2dNativeBackpropInput": _depthwise_backprop_input_flops,
    "DepthwiseConv2dNativeBackpropFilter": _depthwise_backprop_filter_flops,
}
FLOP_TYPES = frozenset(_FLOP_RULES)


def _with_batch(shape, batch_size):
    """A static shape with its first unknown dimension set to `batch_size`
    (the convention of `tensor_bytes`); None if it stays unknown."""
    if shape is None:
        return None
    dims = list(shape)
    for k, d in enumerate(dims):
        if d is None:
            dims[k] = batch_size
            break
    return None if None in dims else dims


def contraction_flops(op_type, attr, input_shapes, output_shapes):
    """``(fixed, per_example)`` FLOPs of a `FLOP_TYPES` op
    (`GraphIndex.flops`); (0, 0) when a shape it needs is unknown beyond the
    batch dimension.

    Every count here is linear in the batch dimension (it enters one factor
    of a product), so two evaluations, at batch sizes 1 and 2, give both
    parts.

    Args:
      op_type: a type of `FLOP_TYPES`.
      attr: ``attr(name)`` -> the op's attribute `name` (``transpose_a``,
        ``adj_x``).
      input_shapes, output_shapes: per tensor, None (unknown rank) or a
        tuple of dims with None for unknown dims.
    """
    rule = _FLOP_RULES[op_type]

    def at(batch_size):
        i = [_with_batch(s, batch_size) for s in input_shapes]
        o = [_with_batch(s, batch_size) for s in output_shapes]
        try:
            return rule(attr, i, o)
        except (TypeError, IndexError, ValueError):
            return None  # an unknown shape (None) or an unexpected rank

    one, two = at(1), at(2)
    if one is None or two is None:
        return (0, 0)
    return (int(2 * one - two), int(two - one))


# Where an op of a literal graph (`from_edges`) runs unless told otherwise.
DEFAULT_DEVICE = "/device:GPU:0"


@dataclasses.dataclass(frozen=True)
class GraphIndex:
    """Plain-data view of a graph; every per-op field is a list indexed by id.

    Attributes:
      ops: the `tf.Operation` of each id (only the rewriter uses these), or
        None for an index of a literal graph (`from_edges`).
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
        resource, variant and string tensors, which hold no activations,
        and for reference outputs, which are a variable's buffer, counted
        in `variable_bytes`; TemporaryVariable's own buffer is counted).
      variable_bytes: per op, bytes of the variable it holds (VarHandleOp,
        VariableV2), else 0. Variables are resident for the whole step.
      is_stateful: per op, True if its op def is stateful (random numbers,
        variables, queues...) or it takes a reference input (updates of v1
        ref variables): such an op is never a compile-time constant, and
        running it may have side effects.
      bn_is_training: per op, the ``is_training`` attribute of fused
        batch-norm ops, else None.
      forwards_input: per op, the data input slot whose value its output 0
        is, when TensorFlow's graph optimizer reduces the op to an identity
        of that input (`FORWARDING_TYPES`, and arithmetic with a constant
        neutral operand of a shape that changes nothing, such as ``x *
        1.0`` in the swish gradient); else None. Its output is the input's
        buffer at run time, and never a tensor of its own to swap.
      in_v1_cond / in_v1_loop: per op, True if the op was built inside a v1
        ``tf.cond`` branch / ``tf.while_loop`` body (Switch/Merge and
        Enter/Exit control flow).
      calls_collective: per op, True if it calls a function of the graph's
        library (`FUNCTION_CALL_TYPES`) that holds a `COLLECTIVE_TYPES` op,
        directly or through further calls.
      trainable_bytes: per op, bytes of the trainable variables (the graph's
        ``trainable_variables`` collection, static shapes) whose op it is.
      flops: per op, ``(fixed, per_example)``: floating-point operations of
        one run are ``fixed + per_example * batch_size`` (`op_flops`).
        Counted for matrix products and convolutions and their gradients
        (`FLOP_TYPES`), a multiply-add being two; 0 for every other op,
        whose time the step-time model takes from the bytes it touches.
      levels: per op, its level in the categorized topological sort.
      ops_by_level: per level, the op ids in increasing id order.
      id_of: op name -> id.
      planned_edges: ``(from_id, to_id)`` control edges LMS plans to add
        (serialization), not yet in the graph. `levels` count them, so
        levels always agree with the graph's edges plus these; make such an
        index with `with_planned_edges`.
      fetches: ids of the training step's fetch ops (`tflms.step`): the
        index holds their fan-in and nothing else. Empty when the whole
        graph is the step.
      step_rule: how the fetches were found, for the log.
      graph_num_ops: ops in the whole graph when it was indexed (the
        rewriter's check that the graph has not changed since).
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
    forwards_input: tuple
    in_v1_cond: tuple
    in_v1_loop: tuple
    calls_collective: tuple
    trainable_bytes: tuple
    flops: tuple
    levels: tuple
    ops_by_level: tuple
    id_of: dict
    planned_edges: tuple = ()
    fetches: tuple = ()
    step_rule: str = "the whole graph"
    graph_num_ops: int = 0

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


# Optimizer updates (`tflms.step` finds a training step by them).
APPLY_PREFIXES = step_mod.APPLY_PREFIXES

# Ops that are an identity of their input 0 for TensorFlow's graph
# optimizer (it removes them, and the readers read the input).
FORWARDING_TYPES = frozenset({"Identity", "StopGradient", "PreventGradient",
                              "Snapshot"})
# x * 1, 1 * x, x / 1, x + 0, 0 + x, x - 0: the neutral value, and the
# slots of x and of the constant (the reader checks the constant).
NEUTRAL_OPERANDS = {
    "Mul": (1.0, ((0, 1), (1, 0))), "MulNoNan": (1.0, ((0, 1), (1, 0))),
    "RealDiv": (1.0, ((0, 1),)), "Div": (1.0, ((0, 1),)),
    "Add": (0.0, ((0, 1), (1, 0))), "AddV2": (0.0, ((0, 1), (1, 0))),
    "BiasAdd": (0.0, ((0, 1),)), "Sub": (0.0, ((0, 1),)),
}


class Columns:
    """The per-op facts both constructors (`from_edges`,
    `tf_reader.build_index`) gather, one list per field, for `assemble`."""

    FIELDS = ("names", "types", "devices", "inputs", "control_inputs",
              "output_shapes", "output_itemsizes", "variable_bytes",
              "is_stateful", "bn_is_training", "forwards_input",
              "in_v1_cond", "in_v1_loop",
              "calls_collective", "trainable_bytes", "flops")

    def __init__(self):
        for f in self.FIELDS:
            setattr(self, f, [])

    def add(self, name, type, device, inputs, control_inputs, output_shapes,  # pylint: disable=redefined-builtin
            output_itemsizes, variable_bytes, is_stateful, bn_is_training,
            forwards_input, in_v1_cond, in_v1_loop, calls_collective,
            trainable_bytes,
            flops):
        values = (name, type, device, inputs, control_inputs, output_shapes,
                  output_itemsizes, variable_bytes, is_stateful,
                  bn_is_training, forwards_input, in_v1_cond, in_v1_loop,
                  calls_collective,
                  trainable_bytes, flops)
        for f, v in zip(self.FIELDS, values):
            getattr(self, f).append(v)


def _fan_in_ids(cols, roots):
    """Ids of the ops `roots` read through data and control inputs, with
    the roots, in increasing order."""
    seen = set(roots)
    stack = list(seen)
    inputs, control_inputs = cols.inputs, cols.control_inputs
    while stack:
        v = stack.pop()
        for p, _ in inputs[v]:
            if p not in seen:
                seen.add(p)
                stack.append(p)
        for p in control_inputs[v]:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return sorted(seen)


def _restricted(ops, cols, keep):
    """`ops`, `cols` and the name -> id map of the ops `keep` (increasing
    ids closed under inputs), renumbered in that order."""
    new_id = {old: new for new, old in enumerate(keep)}
    out = Columns()
    for f in Columns.FIELDS:
        column = getattr(cols, f)
        setattr(out, f, [column[i] for i in keep])
    out.inputs = [tuple((new_id[p], k) for p, k in ins) for ins in out.inputs]
    out.control_inputs = [tuple(new_id[c] for c in ctrl)
                          for ctrl in out.control_inputs]
    kept_ops = None if ops is None else tuple(ops[i] for i in keep)
    return kept_ops, out, {name: i for i, name in enumerate(out.names)}


def assemble(ops, cols, id_of, roots=(), step_rule="the whole graph"):
    """The derived fields (consumers, fan-outs, control outputs, levels) and
    the `GraphIndex` of the fan-in of `roots` (op ids; none: every op): one
    code path for `tf_reader.build_index` and `from_edges`, whose per-op
    facts `cols` (`Columns`) holds, with the ops (None for a literal graph)
    and the name -> id map."""
    graph_num_ops = len(cols.names)
    fetches = ()
    if roots:
        names = {cols.names[r] for r in roots}
        keep = _fan_in_ids(cols, roots)
        if len(keep) < graph_num_ops:  # else the ids stay as they are
            ops, cols, id_of = _restricted(ops, cols, keep)
        fetches = tuple(sorted(id_of[name] for name in names))
    n = len(cols.names)
    types = cols.types
    inputs = cols.inputs
    consumers = [[[] for _ in shapes] for shapes in cols.output_shapes]
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
        for c in cols.control_inputs[i]:
            control_outputs[c].append(i)

    successors = [
        [] if types[i] in BACK_EDGE_TYPES
        else list(fanouts[i]) + control_outputs[i]
        for i in range(n)
    ]
    levels = topo.kahn_levels(n, successors)

    return GraphIndex(
        ops=ops,
        names=tuple(cols.names),
        types=tuple(types),
        devices=tuple(cols.devices),
        inputs=tuple(inputs),
        consumers=tuple(tuple(tuple(c) for c in per_op)
                        for per_op in consumers),
        control_inputs=tuple(cols.control_inputs),
        control_outputs=tuple(tuple(c) for c in control_outputs),
        fanins=tuple(tuple(sorted({p for p, _ in ins})) for ins in inputs),
        fanouts=tuple(tuple(f) for f in fanouts),
        output_shapes=tuple(cols.output_shapes),
        output_itemsizes=tuple(cols.output_itemsizes),
        variable_bytes=tuple(cols.variable_bytes),
        is_stateful=tuple(cols.is_stateful),
        bn_is_training=tuple(cols.bn_is_training),
        in_v1_cond=tuple(cols.in_v1_cond),
        forwards_input=tuple(cols.forwards_input),
        in_v1_loop=tuple(cols.in_v1_loop),
        calls_collective=tuple(cols.calls_collective),
        trainable_bytes=tuple(cols.trainable_bytes),
        flops=tuple(cols.flops),
        levels=tuple(levels),
        ops_by_level=tuple(tuple(g) for g in topo.group_by_level(levels)),
        id_of=id_of,
        fetches=fetches,
        step_rule=step_rule,
        graph_num_ops=graph_num_ops,
    )


def with_planned_edges(index, edges):
    """The index with control edges ``(from_id, to_id)`` LMS plans to add
    (serialization) recorded in `planned_edges` and counted in its levels.

    The graph is not touched: the rewriter adds the edges (they travel in
    `planner.Plan.serialization_edges`), and the simulator replays them
    from the index.

    Raises:
      topo.GraphCycleError: if the edges close a cycle.
    """
    edges = tuple((int(a), int(b)) for a, b in edges)
    if not edges:
        return index
    planned = index.planned_edges + edges
    extra = [[] for _ in range(index.num_ops)]
    for a, b in planned:
        extra[a].append(b)
    successors = [list(index.level_successors(i)) + extra[i]
                  for i in range(index.num_ops)]
    levels = topo.kahn_levels(index.num_ops, successors)
    return dataclasses.replace(
        index, planned_edges=planned, levels=tuple(levels),
        ops_by_level=tuple(tuple(g) for g in topo.group_by_level(levels)))


# Facts `from_edges` takes per op, with their defaults.
_LITERAL_FACTS = {
    "device": None,  # None: from_edges' default_device
    "outputs": None,  # None: max(1, outputs the edges read), no bytes
    "variable_bytes": 0,
    "trainable": False,
    "stateful": False,
    "bn_is_training": None,
    "in_v1_cond": False,
    "in_v1_loop": False,
    "forwards_input": None,
    "calls_collective": False,
    "flops": 0,  # int, or a (fixed, per_example) pair
}
_BOOL_FACTS = ("trainable", "stateful", "in_v1_cond", "in_v1_loop",
               "calls_collective")


def from_edges(ops, edges=(), control_edges=(),
               default_device=DEFAULT_DEVICE, fetches=()):
    """Index a literal graph: names, types and edges, no `tf.Graph`.

    The index is the kind `tf_reader.build_index` makes (same fields,
    levels by the same code), with ``ops=None``: the analysis, the planner
    and the simulator work on it; the rewriter refuses it. Example, a 1 KiB
    tensor read by two ops::

        index = from_edges(
            [("x", "Placeholder", {"outputs": [1024]}),
             ("a", "Relu", {"outputs": [1024]}),
             ("b", "AddV2")],
            edges=[("x", "a"), ("x", "b"), ("a", "b")])

    Args:
      ops: sequence of ``(name, type)`` or ``(name, type, facts)``; op ids
        are positions in it. `facts` is a dict with any of:
        ``device`` (str, default `default_device`);
        ``outputs``: one entry per output, each either an int ``n`` (a
        tensor of ``n`` bytes, of shape ``(1, n)`` and 1-byte elements, so
        rank 2 and swappable) or a pair ``(shape, itemsize)`` with `shape`
        None (unknown rank) or a tuple of dims (None: unknown, the batch
        dimension; itemsize 0 for a tensor with no buffer of its own, such
        as a resource handle or a v1 ref variable's reference). Default: as
        many outputs as `edges` read (at least one), of unknown shape and no
        bytes;
        ``variable_bytes`` (int, bytes of the variable the op holds);
        ``trainable`` (bool: its `variable_bytes` are learning parameters);
        ``stateful``, ``in_v1_cond``, ``in_v1_loop``, ``calls_collective``
        (bool); ``bn_is_training`` (bool or None); ``forwards_input``
        (the input slot the op is an identity of, default 0 for
        `FORWARDING_TYPES` with an input, else None); ``flops``: an int (the
        op's floating-point operations) or a ``(fixed, per_example)`` pair
        of ints (``fixed + per_example * batch_size``), default 0. See
        `GraphIndex`.
      edges: data edges ``(tensor, consumer)``: `tensor` is ``'op'``
        (output 0) or ``'op:k'``; each consumer's input slots are numbered
        in the order its edges appear here.
      control_edges: ``(from_op, to_op)`` name pairs.
      default_device: device of ops whose facts give none.
      fetches: names of the training step's fetch ops: the index holds
        their fan-in only, renumbered in the order of `ops`, as
        `tf_reader.build_index` holds a graph's step. Empty: every op.

    Returns:
      A `GraphIndex` with ``ops=None``.

    Raises:
      ValueError: naming the bad entry and how to write it.
      topo.GraphCycleError: if the edges close a cycle.
    """
    specs = []
    id_of = {}
    for k, spec in enumerate(ops):
        if (not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3)
                or not all(isinstance(x, str) and x for x in spec[:2])):
            raise ValueError(
                "ops[%d] must be a (name, type) or (name, type, facts) "
                "tuple with non-empty strings; got %r" % (k, spec))
        name = spec[0]
        if name in id_of:
            raise ValueError(
                "ops[%d]: op name %r is already ops[%d]; names must be "
                "unique" % (k, name, id_of[name]))
        id_of[name] = k
        if len(spec) == 3 and not isinstance(spec[2], dict):
            raise ValueError(
                "ops[%d] (%r): facts must be a dict such as {'outputs': "
                "[1024]}; got %r" % (k, name, spec[2]))
        facts = dict(spec[2]) if len(spec) == 3 else {}
        unknown = sorted(set(facts) - set(_LITERAL_FACTS))
        if unknown:
            raise ValueError(
                "ops[%d] (%r): unknown fact %r; the facts are %s"
                % (k, name, unknown[0], ", ".join(sorted(_LITERAL_FACTS))))
        specs.append((name, spec[1], dict(_LITERAL_FACTS, **facts)))

    inputs = [[] for _ in specs]
    read = [0] * len(specs)  # outputs each op must have
    for k, edge in enumerate(edges):
        if not isinstance(edge, (tuple, list)) or len(edge) != 2:
            raise ValueError("edges[%d] must be a (tensor, consumer) pair "
                             "such as ('a:0', 'b'); got %r" % (k, edge))
        producer, out = _literal_tensor(edge[0], id_of, "edges[%d]" % k)
        consumer = _literal_op_id(edge[1], id_of, "edges[%d]" % k)
        inputs[consumer].append((producer, out))
        read[producer] = max(read[producer], out + 1)
    control_inputs = [set() for _ in specs]
    for k, edge in enumerate(control_edges):
        if not isinstance(edge, (tuple, list)) or len(edge) != 2:
            raise ValueError("control_edges[%d] must be a (from_op, to_op) "
                             "pair of names; got %r" % (k, edge))
        a = _literal_op_id(edge[0], id_of, "control_edges[%d]" % k)
        b = _literal_op_id(edge[1], id_of, "control_edges[%d]" % k)
        control_inputs[b].add(a)

    cols = Columns()
    for i, (name, op_type, facts) in enumerate(specs):
        where = "ops[%d] (%r)" % (i, name)
        shapes, itemsizes = _literal_outputs(facts["outputs"], read[i], where)
        for flag in _BOOL_FACTS:
            if not isinstance(facts[flag], bool):
                raise ValueError("%s: %s must be True or False; got %r"
                                 % (where, flag, facts[flag]))
        if facts["bn_is_training"] not in (None, True, False):
            raise ValueError("%s: bn_is_training must be None, True or "
                             "False; got %r" % (where, facts["bn_is_training"]))
        variable_bytes = facts["variable_bytes"]
        if (not isinstance(variable_bytes, numbers.Integral)
                or isinstance(variable_bytes, bool) or variable_bytes < 0):
            raise ValueError("%s: variable_bytes must be an int >= 0; got %r"
                             % (where, variable_bytes))
        device = facts["device"]
        if device is None:
            device = default_device
        if not isinstance(device, str):
            raise ValueError("%s: device must be a string such as "
                             "'/device:GPU:0' ('' for unplaced); got %r"
                             % (where, device))
        try:
            parse_device(device)
        except ValueError as e:
            raise ValueError("%s: %s" % (where, e)) from None
        cols.add(
            name=name, type=op_type, device=device,
            inputs=tuple(inputs[i]),
            control_inputs=tuple(sorted(control_inputs[i])),
            output_shapes=shapes, output_itemsizes=itemsizes,
            variable_bytes=int(variable_bytes),
            is_stateful=facts["stateful"],
            bn_is_training=facts["bn_is_training"],
            forwards_input=(
                _literal_slot(facts["forwards_input"], len(inputs[i]), where)
                if facts["forwards_input"] is not None
                else 0 if op_type in FORWARDING_TYPES and inputs[i]
                else None),
            in_v1_cond=facts["in_v1_cond"], in_v1_loop=facts["in_v1_loop"],
            calls_collective=facts["calls_collective"],
            trainable_bytes=int(variable_bytes) if facts["trainable"] else 0,
            flops=_literal_flops(facts["flops"], where))
    if isinstance(fetches, str):
        fetches = (fetches,)
    roots = [_literal_op_id(name, id_of, "fetches[%d]" % k)
             for k, name in enumerate(fetches)]
    return assemble(None, cols, id_of, roots,
                     "the fetches %s" % ", ".join(fetches) if roots
                     else "the whole graph")


def _literal_slot(slot, num_inputs, where):
    if slot is None:
        return None
    if (not isinstance(slot, numbers.Integral) or isinstance(slot, bool)
            or not 0 <= slot < num_inputs):
        raise ValueError("%s: forwards_input must be None or an input slot "
                         "below %d; got %r" % (where, num_inputs, slot))
    return int(slot)


def _literal_flops(flops, where):
    """`from_edges`' ``flops`` fact -> ``(fixed, per_example)``."""
    def count(v):
        return (isinstance(v, numbers.Integral) and not isinstance(v, bool)
                and v >= 0)
    if count(flops):
        return (int(flops), 0)
    if isinstance(flops, (tuple, list)) and len(flops) == 2 and all(
            count(v) for v in flops):
        return (int(flops[0]), int(flops[1]))
    raise ValueError(
        "%s: flops must be an int >= 0 or a (fixed, per_example) pair of "
        "ints >= 0 such as (0, 2048); got %r" % (where, flops))


def _literal_op_id(name, id_of, where):
    op_id = id_of.get(name) if isinstance(name, str) else None
    if op_id is None:
        raise ValueError("%s: no op named %r; edges name ops of `ops`"
                         % (where, name))
    return op_id


def _literal_tensor(tensor, id_of, where):
    """``'op'`` or ``'op:k'`` -> (op id, k)."""
    if isinstance(tensor, str) and tensor not in id_of and ":" in tensor:
        name, _, out = tensor.rpartition(":")
        if not out.isdigit():
            raise ValueError(
                "%s: tensor %r must be 'op' or 'op:k' with k an int >= 0"
                % (where, tensor))
        return _literal_op_id(name, id_of, where), int(out)
    return _literal_op_id(tensor, id_of, where), 0


def _literal_outputs(outputs, read, where):
    """`from_edges`' ``outputs`` fact -> (output shapes, item sizes)."""
    if outputs is None:
        count = max(1, read)
        return (None,) * count, (0,) * count
    if isinstance(outputs, (str, bytes)) or not hasattr(outputs, "__iter__"):
        raise ValueError("%s: outputs must be a list with one entry per "
                         "output, e.g. [1024]; got %r" % (where, outputs))
    outputs = list(outputs)
    if len(outputs) < read:
        raise ValueError(
            "%s: the edges read output %d but outputs lists %d; list one "
            "entry per output" % (where, read - 1, len(outputs)))
    shapes, itemsizes = [], []
    for k, entry in enumerate(outputs):
        if isinstance(entry, numbers.Integral) and not isinstance(
                entry, bool) and entry >= 0:
            shapes.append((1, int(entry)))
            itemsizes.append(1)
            continue
        if (isinstance(entry, (tuple, list)) and len(entry) == 2
                and _is_literal_shape(entry[0])
                and isinstance(entry[1], numbers.Integral)
                and not isinstance(entry[1], bool) and entry[1] >= 0):
            shape = None if entry[0] is None else tuple(entry[0])
            shapes.append(shape)
            itemsizes.append(int(entry[1]))
            continue
        raise ValueError(
            "%s: outputs[%d] must be a byte count (int >= 0) or a (shape, "
            "itemsize) pair such as ((None, 128), 4); got %r"
            % (where, k, entry))
    return tuple(shapes), tuple(itemsizes)


def _is_literal_shape(shape):
    if shape is None:
        return True
    return isinstance(shape, (tuple, list)) and all(
        d is None or (isinstance(d, numbers.Integral)
                      and not isinstance(d, bool) and d >= 0)
        for d in shape)


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


def op_flops(index, op_id, batch_size=None):
    """Floating-point operations of one run of an op (`GraphIndex.flops`).

    Args:
      index: a `GraphIndex`.
      op_id: the op.
      batch_size: the batch size, for counts that grow with it.

    Returns:
      ``fixed + per_example * batch_size`` as an int, or None when the
      count grows with the batch and no batch size is given.
    """
    fixed, per_example = index.flops[op_id]
    if not per_example:
        return fixed
    if batch_size is None:
        return None
    return fixed + per_example * batch_size
