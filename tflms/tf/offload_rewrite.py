"""The graph edits of ``offload_optimizer``, made for `tflms.tf.rewriter`.

Only `rewriter.apply_plan` calls `apply_offload`, in its single pass of
edits, after `check_offload` passed with the plan's other checks: this
module is the rewriter's, split off so that neither module passes 600
lines, and no other module edits a graph.

What TensorFlow allows decides the edits (`tflms.offload` says which
updates move). An optimizer of ``tf.compat.v1.train`` makes its slots
after the graph is built, each colocated with its variable (the
``_class: loc:@<variable>`` attribute), and TensorFlow places every op
that takes a resource handle with the handle's variable. So, per update:

* each slot's handle op, every op that takes the handle (its
  initializer, its reads, the Saver's ops, whenever they were made) and
  the ops of its initializer's name scope are placed on the host, their
  colocation with the variable cleared. Only their device changes: the
  slots keep their names and values, so a checkpoint written with offload
  restores without it and the other way round;
* the fused kernel (``ResourceApplyAdam``) needs the variable and its
  slots on one device, and the variable stays on the device. The kernel
  runs on the host on a host copy of the weights
  (``lms/offload/<var>/host``: the rewriter's `offload_op_name`, as every
  name below, a variable of no collection, so no Saver
  or initializer sees it): the copy is filled from the variable before
  the update, and the new value written back to the device variable
  after it (``.../write_back``). Every op that waited for the update
  (the train op, Adam's step counters) waits for the write-back. The
  host runs the same kernel the device would, element for element; on a
  GPU the host's kernel may round differently from the GPU's;
* the gradient reaches the update through an ``Identity`` on the host
  (``.../gradient``), the swap-out of the gradient, made as soon as the
  gradient is.

A Keras 3 optimizer updates element-wise (reads of its slots, products,
``AssignAddVariableOp``s, one write of the variable: an `Update` with
``host_ops``), in a `tf.function` step whose slots are captured handles.
Those slots must already live on the host (`tflms.tf.host_slots` moves
them and the step is traced again; `check_slots_on_host` says which do
not; a Session graph's slots are placed there as for a fused kernel):
the update's ops are placed on the host, and the variable's write
stays on the device, reading the new value (or the step to subtract)
from the host. TensorFlow copies the gradient out and the value back
where an edge crosses the devices; no op is added.

The ops added carry the rewriter's markers (``_tflms``, and
``_grappler_do_not_remove``), so a second run finds the graph rewritten.
"""

import bisect

import tensorflow as tf

from tflms import devices
from tflms import offload as offload_rules
from tflms.tf import function_api

__all__ = ["SlotsOnDeviceError", "check_slots_on_host", "check_offload",
           "apply_offload"]


class SlotsOnDeviceError(offload_rules.OffloadUnsupportedError):
    """Slots of element-wise updates that live on the device: the step
    must be traced again once they are on the host.

    Attributes:
      placeholders: names of the slots' captured handles in the step.
      variables: their `tf.Variable`s.
    """

    def __init__(self, message, placeholders, variables):
        super().__init__(message)
        self.placeholders = tuple(placeholders)
        self.variables = tuple(variables)


def _elementwise(u):
    return bool(getattr(u, "host_ops", ()))


def check_slots_on_host(graph, index, offload):
    """Raise `SlotsOnDeviceError` if a slot of an element-wise update of
    `offload` is a variable captured by the function graph `graph` that
    does not live on the host (nothing is edited)."""
    captured = function_api.captured_variables(graph)
    names, variables = [], []
    for u in offload.updates:
        if not _elementwise(u):
            continue
        for s in u.slots:
            name = index.names[s]
            v = captured.get(name)
            if v is not None and not devices.same_device(v.device,
                                                         offload.host):
                names.append(name)
                variables.append(v)
    if names:
        raise SlotsOnDeviceError(
            "offload_optimizer=True: %d optimizer slots of the step live on "
            "%s, not on the host %s (e.g. %s); a Keras 3 optimizer's slots "
            "must be moved before the step is traced. Keras 3 fit does it "
            "for you; with lms.function pass the optimizer "
            "(lms.function(step, optimizer=optimizer)), or set "
            "offload_optimizer=False"
            % (len(names), variables[0].device, offload.host,
               variables[0].name), names, variables)


def check_offload(graph, index, offload):
    """Raise (nothing edited yet) unless `offload` can be applied to
    `graph` as indexed."""
    ops = index.ops
    for u in offload.updates:
        apply_op = ops[u.apply]
        if _elementwise(u):
            if apply_op.inputs[0].op is not ops[u.variable]:
                raise ValueError(
                    "%s does not write the variable %s any more; index the "
                    "graph again" % (apply_op.name, ops[u.variable].name))
            continue
        if apply_op.inputs[0].op is not ops[u.variable]:
            raise ValueError(
                "input 0 of %s is not the variable %s any more; index the "
                "graph again" % (apply_op.name, ops[u.variable].name))
        slots, grad = offload_rules.APPLY_INPUTS[apply_op.type]
        for slot, s in zip(slots, u.slots):
            if apply_op.inputs[slot].op is not ops[s]:
                raise ValueError(
                    "%s does not read the slot %s any more; index the graph "
                    "again" % (apply_op.name, ops[s].name))
        producer, output = u.gradient
        if apply_op.inputs[grad] is not ops[producer].outputs[output]:
            raise ValueError(
                "%s does not read the gradient %s:%d any more; index the "
                "graph again" % (apply_op.name, ops[producer].name, output))


class _ByName:
    """The graph's ops sorted by name, to find a name scope's ops."""

    def __init__(self, graph):
        self.ops = sorted(graph.get_operations(), key=lambda op: op.name)
        self.names = [op.name for op in self.ops]

    def under(self, prefix):
        start = bisect.bisect_left(self.names, prefix)
        end = start
        while end < len(self.names) and self.names[end].startswith(prefix):
            end += 1
        return self.ops[start:end]


def _slot_ops(by_name, handle):
    """The ops that must be on the slot's device: its handle, every op
    taking the handle, and the ops of its name scope (its initializer)."""
    moved = {handle}
    for t in handle.outputs:
        moved.update(t.consumers())
    moved.update(by_name.under(handle.name + "/"))
    return sorted(moved, key=lambda op: op.name)


def _place_on(op, device):
    op._set_device(device)
    if "_class" in op.node_def.attr:
        op._clear_attr("_class")


def _identity_source(tensor):
    """The tensor an identity without control inputs hands on as
    `tensor` (through a chain of them), or `tensor` itself."""
    while (tensor.op.type in ("Identity", "IdentityN")
           and not tensor.op.control_inputs):
        tensor = tensor.op.inputs[tensor.value_index]
    return tensor


def _read_past_identities(op, moved):
    """Have the host op `op` read past the identities in front of its
    inputs from the device. Grappler removes an identity (Keras 3's
    optimizer passes every gradient through one ``IdentityN``) only where
    its readers are on its device: kept, it would hide the gradients'
    last products from the arithmetic optimizer, which merges them with
    the update's products without LMS. Grappler would have read past it
    too."""
    for k, tensor in enumerate(op.inputs):
        if tensor.op in moved:
            continue
        source = _identity_source(tensor)
        if source is not tensor:
            op._update_input(k, source)


def apply_offload(graph, index, offload, new_ops_context, edits, op_name):
    """Move `offload`'s updates and slots to its host (module docstring).

    Args:
      graph: the `tf.Graph` `index` was built from.
      index: its `GraphIndex` (`offload`'s ids refer to it).
      offload: a `tflms.offload.Offload`.
      new_ops_context: ``new_ops_context(device)``, the rewriter's context
        in which its ops are made (outside the user's scopes, marked).
      edits: the rewriter's pending control edges (``add_controls``).
      op_name: ``op_name(variable name, part)``, the rewriter's names of
        the ops added (`rewriter.offload_op_name`: one place names every
        op LMS adds, and `grappler_check` knows them from there).

    Returns:
      The names of the ops added, in update order.
    """
    ops = index.ops
    host = offload.host
    waiting = {}  # update op -> ops with a control input on it
    updates = {ops[u.apply] for u in offload.updates}
    for op in graph.get_operations():
        for c in op.control_inputs:
            if c in updates:
                waiting.setdefault(c, []).append(op)
    by_name = _ByName(graph)
    added = []
    for u in offload.updates:
        if _elementwise(u):
            # The slots are on the host already (`check_slots_on_host`):
            # their reads and writes are placed with them by TensorFlow,
            # the arithmetic here; the variable's write stays.
            moved = {ops[op] for op in u.host_ops}
            for s in u.slots:
                if ops[s].type == "VarHandleOp":
                    # A Session graph's slot: placed on the host here (a
                    # function's slots are captured, moved before).
                    moved.update(_slot_ops(by_name, ops[s]))
            for op in moved:
                _place_on(op, host)
            for op in moved:
                _read_past_identities(op, moved)
            continue
        apply_op, variable = ops[u.apply], ops[u.variable]
        for s in u.slots:
            for op in _slot_ops(by_name, ops[s]):
                _place_on(op, host)
        dtype = variable.get_attr("dtype")
        host_name = op_name(variable.name, "host")
        with new_ops_context(host):
            copy = tf.raw_ops.VarHandleOp(
                dtype=dtype, shape=variable.get_attr("shape"),
                shared_name=host_name.replace("/", "_"), name=host_name)
        with new_ops_context(variable.device):
            weights = tf.raw_ops.ReadVariableOp(
                resource=variable.outputs[0], dtype=dtype,
                name=op_name(variable.name, "read"))
        grad_slot = offload_rules.APPLY_INPUTS[apply_op.type][1]
        with new_ops_context(host):
            fill = tf.raw_ops.AssignVariableOp(
                resource=copy, value=weights,
                name=op_name(variable.name, "fill"))
            gradient = tf.raw_ops.Identity(
                input=apply_op.inputs[grad_slot],
                name=op_name(variable.name, "gradient"))
        apply_op._update_input(0, copy)
        apply_op._update_input(grad_slot, gradient)
        _place_on(apply_op, host)
        edits.add_controls(apply_op, [fill])
        with new_ops_context(host):
            new = tf.raw_ops.ReadVariableOp(
                resource=copy, dtype=dtype,
                name=op_name(variable.name, "updated"))
        with new_ops_context(variable.device):
            back = tf.raw_ops.AssignVariableOp(
                resource=variable.outputs[0], value=new,
                name=op_name(variable.name, "write_back"))
        edits.add_controls(new.op, [apply_op])
        for op in waiting.get(apply_op, ()):
            edits.add_controls(op, [back])
        added.extend(op.name for op in (copy.op, weights.op, fill,
                                        gradient.op, new.op, back))
    return added

