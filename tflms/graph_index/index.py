"""The `GraphIndex` type and the op types whose meaning the index's users
share (v1 control flow, collectives, function calls, ops TensorFlow's
optimizer reduces to an identity).
"""

import dataclasses

from tflms import step as step_mod


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
# Calls of a function of the graph's library by name (a tf.function's call
# site in a graph).
PARTITIONED_CALL_TYPES = frozenset({"PartitionedCall",
                                    "StatefulPartitionedCall"})
FUNCTION_CALL_TYPES = frozenset({
    "If", "StatelessIf", "Case", "StatelessCase", "While", "StatelessWhile",
}) | PARTITIONED_CALL_TYPES


# Optimizer updates (`tflms.step` finds a training step by them).
APPLY_PREFIXES = step_mod.APPLY_PREFIXES

# Ops that are an identity of their input 0 for TensorFlow's graph
# optimizer: Grappler removes them before the runtime's graph passes run,
# and their readers read the input. What a tensor read through them is read
# as in the step that runs (`GraphIndex.forwards_input`, the analysis'
# readers).
GRAPPLER_IDENTITY_TYPES = frozenset({"Identity", "StopGradient",
                                     "PreventGradient", "Snapshot"})
# Kernels that return their input's buffer as their output
# (context->set_output(k, context->input(k)), or Tensor::CopyFrom with a new
# shape) instead of allocating one, when both live in the same memory
# space. IdentityN forwards input k to output k, the others input 0 to
# output 0. ``Bitcast`` is a view too (``Tensor::BitcastFrom`` shares the
# input's buffer): Keras 3's NaN-aware ``argmax`` bitcasts the logits. The
# simulator and the oracle's runtime replay both alias them.
BUFFER_FORWARDING_TYPES = frozenset({
    "Identity", "IdentityN", "StopGradient", "PreventGradient", "Reshape",
    "Squeeze", "ExpandDims", "Bitcast",
})
# The one op whose reference output is a buffer of its own, allocated in the
# step; every other ref output (the kernels call set_output_ref or
# forward_ref_input_to_ref_output) refers to a variable's resident buffer.
ALLOCATING_REF_TYPES = frozenset({"TemporaryVariable"})
# x * 1, 1 * x, x / 1, x + 0, 0 + x, x - 0: the neutral value, and the
# slots of x and of the constant (the reader checks the constant).
# Grappler's constant folding replaces such an op by an Identity of x when
# the output has x's shape, so in a real step its output is x's buffer. The
# gradient of tf.nn.swish computes x * 1.0 (a FULL_TRACE of a Keras
# EfficientNet step with Grappler on has no such op).
NEUTRAL_OPERANDS = {
    "Mul": (1.0, ((0, 1), (1, 0))), "MulNoNan": (1.0, ((0, 1), (1, 0))),
    "RealDiv": (1.0, ((0, 1),)), "Div": (1.0, ((0, 1),)),
    "Add": (0.0, ((0, 1), (1, 0))), "AddV2": (0.0, ((0, 1), (1, 0))),
    "BiasAdd": (0.0, ((0, 1),)), "Sub": (0.0, ((0, 1),)),
}


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
        of that input (`GRAPPLER_IDENTITY_TYPES`, and arithmetic with a
        constant neutral operand of a shape that changes nothing, such as
        ``x * 1.0`` in the swish gradient); else None. Its output is the
        input's buffer at run time, and never a tensor of its own to swap.
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
      unbatched_elements: per op, one entry per output: None where the
        first unknown dimension of the output's shape is the batch (the rule
        of `tensor_bytes`), else what the simulator sizes it by: the elements
        of a shape vector of unknown length (a rank, not a batch), or
        `unbatched.DATA_DEPENDENT` for a count of rows the data decides, whose
        size stays unknown (`tflms.graph_index.unbatched`). Made by `assemble`.
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

    The index describes the graph only; where and how the step runs (its
    devices, host, kernels and the merges LMS leaves whole) is its
    `target.Target`.
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
    unbatched_elements: tuple = ()
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

    def hands_on_unread(self, reader, slot):
        """True if `reader` reads its input `slot` only to hand it on as an
        output no op of the step reads: an ``IdentityN`` (output k is
        input k) whose output `slot` has no reader here and which is not
        a fetch. Grappler's model pruner and dependency optimizer remove
        such an ``IdentityN`` (the one ``tf.custom_gradient`` builds in
        graph mode, ``tf.nn.silu``'s: it hands on the function's inputs
        too, read by the gradient's ``ZerosLike`` alone, outside the
        step) and the read with it, so what fed that slot is not read
        there at run time."""
        return (self.types[reader] == "IdentityN"
                and slot < len(self.consumers[reader])
                and not self.consumers[reader][slot]
                and reader not in self.fetches)

    def readers_through(self, tensor, passing, ignored=frozenset()):
        """The ops that read `tensor` (a ``(producer, output)`` pair)
        directly or through ops of the types in `passing`, which hand the
        value on: output 0 of most, output k for input k of an
        ``IdentityN`` (when `passing` names it). Readers of a type in
        `ignored` are left out; each reader is listed once."""
        readers, stack, seen = [], [tensor], set()
        while stack:
            producer, output = stack.pop()
            for reader, slot in self.consumers[producer][output]:
                if reader in seen:
                    continue
                seen.add(reader)
                kind = self.types[reader]
                if kind in ignored:
                    continue
                if kind in passing:
                    stack.append((reader, slot if kind == "IdentityN"
                                  else 0))
                else:
                    readers.append(reader)
        return readers


def _merge_sorted(a, b):
    if not b:
        return a
    if not a:
        return b
    return tuple(sorted(set(a) | set(b)))
