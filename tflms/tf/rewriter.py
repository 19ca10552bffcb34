"""Apply a `Plan` to a `tf.Graph`: the only module that edits a graph
(with `offload_rewrite`, its part for ``offload_optimizer``, which only
`apply_plan` calls).

Functions here directly manipulate the internals of the `tf.Graph`
(`Operation._update_input`, `Operation._add_control_inputs`). They check
everything they can before the first edit, so an error leaves the graph as
it was.

A swap-out and its swap-ins are `Identity` ops pinned to the CPU device,
named ``lms/swapout_<tensor>`` / ``<op>-lms/swapin_<tensor>``, and carry the
``_grappler_do_not_remove`` attribute so that Grappler's dependency and
arithmetic optimizers keep them (without it, on a machine where everything
runs on the CPU, an Identity between two CPU ops would be folded away).
They also carry ``_tflms`` so a later run recognises the graph, and
``_tflms_op``, their own name: TensorFlow's common-subexpression pass (the
classic one, run after Grappler) merges nodes of equal type, attributes and
inputs, and Grappler may make two swap ops equal (the swap-outs of a
tensor and of a copy of it that constant folding reduces to the tensor,
such as ``x * 1.0`` in the swish gradient; two swap-ins of one tensor whose
triggers the dependency optimizer pruned). A merged swap op would not
run where the plan put it.

A swap-in's name starts with the name of the op whose tensor it brings
back (`swapin_op_name`), and so does a recompute's clone (`clone_op_name`):
Grappler sorts the inputs of commutative ops by name (AddN, Add, Mul,
...; its canonicalization, before common-subexpression elimination and
the arithmetic optimizer) and an AddN adds its inputs in that order. An
``lms/...`` input would sort elsewhere than the tensor it replaces, and
the gradients summed by an AddN would round differently from the step
without LMS. ``<op>-...`` sorts exactly where ``<op>`` does against every
other name (``-`` sorts before every other character of op names), and
``<op>>k-...`` where ``<op>:k`` does against the other ops' names. A plan that
only serializes levels adds no swap op, so it leaves a marker instead: an
unconnected ``NoOp`` named ``lms/serialization`` on the device of the
serialized ops (never fetched, so it never runs)::

    before:  (src) --t--> (consumer)
    after:   (src) --t--> [lms/swapout_t] --> [src-lms/swapin_t] --> (consumer)
                                                   ^ ctrl
                                               (trigger)

A recompute clones the ops that made a tensor (same type, attributes,
device and output types) under ``lms/recompute_<tensor>/<op>``, with a
control edge from its trigger to every clone, and reroutes the late
readers to the last clone; the original ops are not touched::

    before:  (x) --> (bn) --y--> (relu) --z--> (near) ...... (late)
    after:   (x) --> (bn) --y--> (relu) --z--> (near)
              |
              +--> [bn-lms/recompute_z/bn] --> [relu-lms/recompute_z/relu]
                         ^ ctrl                    ^ ctrl         |
                     (trigger)                 (trigger)          +--> (late)
"""

import contextlib
import dataclasses

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tflms.tf import offload_rewrite
from tflms.tf import reader

__all__ = ["SWAP_MARKER_ATTR", "SERIALIZATION_MARKER", "OFFLOAD_SCOPE",
           "OP_NAME_MARKERS", "RewriteResult", "apply_plan",
           "apply_plan_to_copy", "is_rewritten",
           "swap_op_name", "swapin_op_name", "clone_op_name",
           "offload_op_name", "offloaded_variable"]

# Attribute set on every op LMS adds; its presence means "already rewritten".
SWAP_MARKER_ATTR = "_tflms"
# Attribute holding a swap op's own name (module docstring).
UNIQUE_ATTR = "_tflms_op"
# Name of the NoOp marking a graph whose levels LMS serialized.
SERIALIZATION_MARKER = "lms/serialization"

_PROTECT_ATTRS = {
    "_grappler_do_not_remove": attr_value_pb2.AttrValue(b=True),
    SWAP_MARKER_ATTR: attr_value_pb2.AttrValue(b=True),
}
# Clones carry the marker only: Grappler must stay free to fuse them as it
# fuses the originals (oneDNN's remapper makes batch norm + ReLU one
# kernel, and a clone pair left unfused would round differently). Their
# trigger's control edge, which the originals lack, keeps common-
# subexpression elimination from merging a clone into its original.
_CLONE_ATTRS = {SWAP_MARKER_ATTR: attr_value_pb2.AttrValue(b=True)}


@dataclasses.dataclass(frozen=True)
class RewriteResult:
    """What `apply_plan` added.

    Attributes:
      swapout_ops / swapin_ops: names of the added ops, in plan order.
      control_edges: number of control edges added (triggers, sync waits,
        serialization).
      rerouted_inputs: number of consumer inputs now reading a swap-in or
        a clone.
      recompute_ops: names of the clones of recomputes, in plan order.
      offload_ops: names of the ops ``offload_optimizer`` added
        (`offload_rewrite`), in update order.
    """

    swapout_ops: tuple
    swapin_ops: tuple
    control_edges: int
    rerouted_inputs: int
    recompute_ops: tuple = ()
    offload_ops: tuple = ()


def swap_op_name(kind, tensor_name):
    """``lms/swapout_conv1_Relu_0`` style names, one per tensor."""
    return "lms/%s_%s" % (kind,
                          tensor_name.replace("/", "_").replace(":", "_"))


# Name scope of the ops ``offload_optimizer`` adds (`offload_op_name`).
OFFLOAD_SCOPE = "lms/offload/"
# The part of `offload_op_name` that names a variable's host copy.
_HOST_COPY = "host"


def offload_op_name(variable_name, part):
    """``lms/offload/dense/kernel/write_back`` style names: the ops
    `offload_rewrite` adds for the update of the variable named
    `variable_name` (`part`: ``host``, its host copy; ``read``, ``fill``,
    ``gradient``, ``updated``, ``write_back``)."""
    return "%s%s/%s" % (OFFLOAD_SCOPE, variable_name, part)


def offloaded_variable(name):
    """The name of the variable whose host copy the op named `name` is
    (``offload_op_name(variable, "host")``; under an import scope, the
    variable's name under that scope), or None for any other name."""
    scope, marker, rest = name.partition(OFFLOAD_SCOPE)
    suffix = "/" + _HOST_COPY
    if not marker or not rest.endswith(suffix):
        return None
    return scope + rest[:-len(suffix)]


# What every op LMS adds in a step has in its name, whatever scope and
# sorting prefix it got: ``lms/swapout_``, ``lms/swapin_``,
# ``lms/recompute_`` (`swap_op_name` of an empty tensor name), and
# ``lms/offload/`` (`offload_op_name`).
OP_NAME_MARKERS = tuple(swap_op_name(kind, "")
                        for kind in ("swapout", "swapin", "recompute")) + (
                            OFFLOAD_SCOPE,)


def _sorting_prefix(tensor_name):
    """A name prefix that sorts, against other ops' names, where
    `tensor_name` (``op`` or ``op:k``, as an input of a NodeDef) sorts."""
    op_name, _, output = tensor_name.rpartition(":")
    if output in ("", "0"):
        return op_name + "-"
    return "%s>%s-" % (op_name, output)


def swapin_op_name(tensor_name):
    """``conv1/Relu-lms/swapin_conv1_Relu_0`` style names: a swap-in of
    `tensor_name`, sorting where it does (module docstring)."""
    return _sorting_prefix(tensor_name) + swap_op_name("swapin", tensor_name)


def clone_op_name(tensor_name, op_name, output=0):
    """``bn-lms/recompute_relu_0/bn`` style names: the clone of `op_name`
    made to recompute `tensor_name`, sorting where ``op_name:output`` does
    (module docstring)."""
    return "%s%s/%s" % (_sorting_prefix("%s:%d" % (op_name, output)),
                        swap_op_name("recompute", tensor_name),
                        op_name.replace("/", "_"))


def is_rewritten(graph, gpu_device_filter=None):
    """True if the graph has swap ops or recompute clones added by LMS.

    Args:
      graph: a `tf.Graph`.
      gpu_device_filter: optional callable(device string) -> bool; when given
        only swap-outs of tensors produced on a matching device count, so one
        LMS per device can run on a multi-tower graph.
    """
    for op in graph.get_operations():
        # Every op LMS adds is named lms/... (under an import scope when the
        # graph was imported): reading attributes of the others is slow.
        if "lms/" not in op.name:
            continue
        if not op.name.startswith("lms/") and not _has_marker(op):
            continue
        if op.name.startswith(OFFLOAD_SCOPE) and _has_marker(op):
            # Optimizer updates moved to the host: the write-back is on
            # the variable's device.
            if gpu_device_filter is None or gpu_device_filter(op.device):
                return True
            continue
        if op.type == "NoOp" and _has_marker(op):
            # Serialization without swaps (see SERIALIZATION_MARKER).
            if gpu_device_filter is None or gpu_device_filter(op.device):
                return True
            continue
        if "lms/recompute_" in op.name and _has_marker(op):
            if gpu_device_filter is None or gpu_device_filter(op.device):
                return True
            continue
        if op.type != "Identity" or not op.name.split("/")[-1].startswith(
                "swapout"):
            continue
        if gpu_device_filter is None or gpu_device_filter(
                op.inputs[0].op.device):
            return True
    return False


def _has_marker(op):
    try:
        return bool(op.get_attr(SWAP_MARKER_ATTR))
    except ValueError:
        return False


@contextlib.contextmanager
def _outside_user_context(graph, device, attrs=None):
    """Build ops on `device` outside any user context: no control
    dependencies, no name scope, no control-flow context inherited from
    where run() was called; with the attributes that mark LMS's ops."""
    saved_ctx = graph._get_control_flow_context()
    graph._set_control_flow_context(None)
    try:
        with graph.as_default(), tf.control_dependencies(None), \
                graph.name_scope(None), tf.device(device), \
                graph._attr_scope(_PROTECT_ATTRS if attrs is None else attrs):
            yield
    finally:
        graph._set_control_flow_context(saved_ctx)


def _new_identity(graph, tensor, name):
    """An Identity of `tensor`; call inside `_outside_user_context` (entered
    once for all swap ops: entering it costs as much as making the op)."""
    # The op itself, without tf.identity's op-def library pass, which is a
    # third of the cost of a swap op on large graphs.
    dtype = tensor.dtype.base_dtype
    # The name the op will get (the graph makes repeated names unique):
    # unique per op, so no two swap ops are ever equal for common-
    # subexpression elimination (module docstring).
    final = graph.unique_name(name, mark_as_used=False)
    return graph._create_op_internal(
        "Identity", [tensor], [dtype], name=name,
        attrs={"T": attr_value_pb2.AttrValue(type=dtype.as_datatype_enum),
               UNIQUE_ATTR: attr_value_pb2.AttrValue(
                   s=final.encode())}).outputs[0]


def _new_clone(graph, op, inputs, name):
    """A copy of `op` reading `inputs`: same type, attributes and output
    types, on the device of the `_outside_user_context` it is made in.
    Private attributes (``_class`` colocation and the like) are not copied:
    they tie the original to its neighbours, not the clone."""
    attrs = {k: v for k, v in op.node_def.attr.items()
             if not k.startswith("_")}
    return graph._create_op_internal(
        op.type, list(inputs), [t.dtype for t in op.outputs], name=name,
        attrs=attrs)


def _new_marker(graph, device):
    with _outside_user_context(graph, device):
        return tf.no_op(name=SERIALIZATION_MARKER)


def apply_plan(graph, index, plan, cpu_device, offload=None):
    """Edit `graph` so that it performs `plan`.

    This function directly manipulates the internals of the `tf.Graph`.

    Args:
      graph: the `tf.Graph` that `index` was built from.
      index: the `GraphIndex` of `graph` (ids of `plan` refer to it).
      plan: a `planner.Plan`.
      cpu_device: device string for the swap ops.
      offload: a `tflms.offload.Offload` whose updates and slots move to
        the host (`offload_rewrite`), or None.

    Returns:
      A `RewriteResult`.

    Raises:
      ValueError: if the index has no ops (a literal graph), the graph
        changed since it was indexed, or an edit would bring into the
        training step an op it did not run (nothing is edited then).
    """
    # Validate and snapshot before the first edit.
    _check_before_editing(graph, index, plan)
    if offload is not None:
        offload_rewrite.check_offload(graph, index, offload)
    ops = index.ops
    edits = _Edits()
    for a, b in plan.control_edges:
        edits.add_controls(ops[b], [ops[a]])
    with _outside_user_context(graph, cpu_device):
        swapouts, swapins, swapin_of = _add_swaps(graph, ops, plan, edits)
    clones = _add_recomputes(graph, ops, plan, swapin_of, edits)
    offloaded = () if offload is None else tuple(
        offload_rewrite.apply_offload(
            graph, index, offload,
            lambda device: _outside_user_context(graph, device), edits,
            offload_op_name))
    control_edges = edits.apply_controls()
    # Element-wise updates moved to the host add no op (only devices
    # change), nor do control edges alone.
    moved = [u for u in (() if offload is None else offload.updates)
             if getattr(u, "host_ops", ())]
    if (plan.control_edges or moved) and not (swapouts or clones
                                              or offloaded):
        # Nothing else would tell a second run that this graph is done.
        _new_marker(graph, ops[plan.control_edges[0][0]].device
                    if plan.control_edges else ops[moved[0].apply].device)
    return RewriteResult(swapout_ops=tuple(swapouts),
                         swapin_ops=tuple(swapins),
                         control_edges=control_edges,
                         rerouted_inputs=edits.rerouted,
                         recompute_ops=tuple(clones),
                         offload_ops=offloaded)


def apply_plan_to_copy(graph_def, index, plan, cpu_device, offload=None):
    """`apply_plan` on a new `tf.Graph` imported from `graph_def` (the
    step's graph as `index` was built from it, every node under its own
    name: a `grappler_check.graph_def_of` made before the rewrite), so
    that a plan can be tried without editing the step's graph.

    Returns:
      ``(copy, RewriteResult)``: the edited copy and what was added to it.

    Raises:
      ValueError: as `apply_plan`; or if `graph_def` lacks an op of
        `index`.
    """
    copy = tf.Graph()
    with copy.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    by_name = {op.name: op for op in copy.get_operations()}
    missing = [op.name for op in index.ops if op.name not in by_name]
    if missing:
        raise ValueError(
            "the GraphDef to try the plan on lacks %d ops of the step (%s); "
            "make it with grappler_check.graph_def_of(graph) before the "
            "rewrite" % (len(missing), ", ".join(missing[:3])))
    copied = dataclasses.replace(
        index, ops=tuple(by_name[op.name] for op in index.ops),
        graph_num_ops=len(by_name))
    return copy, apply_plan(copy, copied, plan, cpu_device, offload)


def _check_before_editing(graph, index, plan):
    """Raise (nothing edited yet) unless `plan` can be applied to `graph`
    as indexed."""
    ops = index.ops
    if ops is None:
        raise ValueError(
            "the index has no tf.Operations (it was built from literal "
            "edges by graph_index.from_edges), so there is nothing to "
            "rewrite; index the graph with "
            "tflms.tf.reader.build_index(graph)")
    if graph.finalized:
        raise ValueError("the graph is finalized and cannot be edited")
    if ops and ops[0].graph is not graph:
        raise ValueError(
            "the index was built from another graph than the one to edit; "
            "index this graph with tflms.tf.reader.build_index(graph)")
    if len(graph.get_operations()) != index.graph_num_ops:
        raise ValueError(
            "the graph has %d ops but was indexed with %d; index it again "
            "before applying a plan" % (len(graph.get_operations()),
                                        index.graph_num_ops))
    _check_step(index, plan)
    _check_shared_clones(index, plan)
    for producer, output, consumers in _rerouted(plan):
        tensor = ops[producer].outputs[output]
        for consumer, slot in consumers:
            if ops[consumer].inputs[slot] is not tensor:
                raise ValueError(
                    "input %d of %s is not %s any more; index the graph "
                    "again" % (slot, ops[consumer].name, tensor.name))


class _Edits:
    """The control inputs to add, gathered per op so that each op gets
    them in one call, and the count of inputs rerouted."""

    def __init__(self):
        self.pending = {}  # op -> control inputs to add, in order
        self.rerouted = 0

    def add_controls(self, op, controls):
        current = set(op.control_inputs)
        pending = self.pending.setdefault(op, [])
        for c in controls:
            if c not in current and c not in pending:
                pending.append(c)

    def reroute(self, consumer, slot, tensor):
        consumer._update_input(slot, tensor)
        self.rerouted += 1

    def apply_controls(self):
        """Add the gathered control inputs; how many were added."""
        added = 0
        for op, controls in self.pending.items():
            if controls:
                op._add_control_inputs(controls)
                added += len(controls)
        return added


def _add_swaps(graph, ops, plan, edits):
    """The swap-out and swap-in ops of `plan`, their readers rerouted:
    ``(swap-out names, swap-in names, {(producer, output, k): k-th
    swap-in})``."""
    swapouts, swapins, swapin_of = [], [], {}
    for swap in plan.swaps:
        tensor = ops[swap.producer].outputs[swap.output]
        swapout = _new_identity(graph, tensor,
                                swap_op_name("swapout", tensor.name))
        swapouts.append(swapout.op.name)
        for k, sin in enumerate(swap.swap_ins):
            swapin = _new_identity(graph, swapout,
                                   swapin_op_name(tensor.name))
            swapins.append(swapin.op.name)
            swapin_of[(swap.producer, swap.output, k)] = swapin
            for consumer, slot in sin.consumers:
                edits.reroute(ops[consumer], slot, swapin)
            edits.add_controls(swapin.op, [ops[t] for t in sin.triggers])
        for w in swap.waiters:
            edits.add_controls(ops[w], [swapout.op])
    return swapouts, swapins, swapin_of


def _add_recomputes(graph, ops, plan, swapin_of, edits):
    """The clones of `plan`'s recomputes, their readers rerouted: the
    clones' names."""
    clones = []
    clones_of = {}  # (producer, output) -> that recompute's clones
    for rec in plan.recomputes:
        tensor = ops[rec.producer].outputs[rec.output]
        made = []
        for op_id, sources in zip(rec.ops, rec.inputs):
            op = ops[op_id]
            inputs = []
            for src in sources:
                if src[0] == "clone":
                    inputs.append(made[src[1]].outputs[src[2]])
                elif src[0] == "swapin":
                    inputs.append(swapin_of[src[1:]])
                elif src[0] == "recompute":
                    inputs.append(
                        clones_of[src[1:3]][src[3]].outputs[src[4]])
                else:
                    inputs.append(ops[src[1]].outputs[src[2]])
            # The last clone is read at the recomputed tensor's output.
            read = rec.output if op_id == rec.ops[-1] else 0
            with _outside_user_context(graph, op.device, _CLONE_ATTRS):
                clone = _new_clone(graph, op, inputs,
                                   clone_op_name(tensor.name, op.name, read))
            made.append(clone)
            clones.append(clone.name)
            edits.add_controls(clone, [ops[rec.trigger]])
        for consumer, slot in rec.consumers:
            edits.reroute(ops[consumer], slot, made[-1].outputs[rec.output])
        clones_of[(rec.producer, rec.output)] = made
    return clones


def _check_step(index, plan):
    """Nothing enters the training step but LMS's own ops.

    The step is the fan-in of the index's fetches, read again from the
    graph as it is now: it must be the ops indexed. Every edge the plan
    adds (control edges, swap-in triggers, swap-out waiters, reroutes,
    clone inputs) starts and ends at ops of the index, so the step after
    the rewrite is those ops plus the swap ops and clones. An index of the
    whole graph (no fetches found) has no step to check.
    """
    n = index.num_ops
    for op_id in _plan_op_ids(plan):
        if not 0 <= op_id < n:
            raise ValueError(
                "the plan refers to op id %d, but the index has %d ops: "
                "apply a plan to the index it was made from" % (op_id, n))
    if not index.fetches:
        return
    ops = index.ops
    step = reader.fan_in([ops[f] for f in index.fetches])
    indexed = {op.name for op in ops}
    outside = sorted(set(step) - indexed)
    missing = sorted(indexed - set(step))
    problems = []
    if outside:
        problems.append("%d ops would enter the step (%s)"
                        % (len(outside), ", ".join(outside[:3])))
    if missing:
        problems.append("%d indexed ops are not in it (%s)"
                        % (len(missing), ", ".join(missing[:3])))
    if problems:
        raise ValueError(
            "the training step (the fan-in of %s) is not the set of ops "
            "that was indexed: %s. Index the graph again before applying a "
            "plan; nothing was edited" % (
                ", ".join(ops[f].name for f in index.fetches),
                "; ".join(problems)))


def _check_shared_clones(index, plan):
    """Each clone a recompute reads from another (``('recompute', ...)``
    sources) is one that recompute makes, and it is made first: earlier
    in `Plan.recomputes`."""
    made = {}
    for rec in plan.recomputes:
        for src in rec.sources("recompute"):
            ops = made.get(src[1:3])
            if ops is None or not 0 <= src[3] < len(ops):
                raise ValueError(
                    "the recompute of %s reads clone %d of the recompute of "
                    "%s, which no earlier recompute of the plan makes; "
                    "nothing was edited" % (
                        "%s:%d" % (index.names[rec.producer], rec.output),
                        src[3], "%s:%d" % (index.names[src[1]], src[2])))
        made[(rec.producer, rec.output)] = rec.ops


def _plan_op_ids(plan):
    """Every op id `plan` names."""
    for a, b in plan.control_edges:
        yield a
        yield b
    for swap in plan.swaps:
        yield swap.producer
        yield from swap.waiters
        for sin in swap.swap_ins:
            yield from sin.triggers
            for consumer, _ in sin.consumers:
                yield consumer
    for rec in plan.recomputes:
        yield rec.producer
        yield rec.trigger
        yield from rec.ops
        for consumer, _ in rec.consumers:
            yield consumer
        for src in rec.sources("tensor"):
            yield src[1]


def _rerouted(plan):
    """``(producer, output, consumers)`` of every tensor whose readers the
    plan reroutes (to swap-ins or to clones)."""
    for swap in plan.swaps:
        for sin in swap.swap_ins:
            yield swap.producer, swap.output, sin.consumers
    for rec in plan.recomputes:
        yield rec.producer, rec.output, rec.consumers
