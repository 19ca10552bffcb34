"""Optimizer updates made of element-wise ops (Keras 3's), found for
``offload_optimizer`` (`tflms.offload.find_updates` calls
`find_elementwise`).

A Keras 3 optimizer traced into a `tf.function` step updates each
variable with no fused kernel: per variable, the reads of its slots (the
optimizer's variables of its size: Adam's two moments, momentum's
velocity), element-wise arithmetic on them and the gradient, writes of the
slots (``AssignAddVariableOp``...), reads of the slots again (after those
writes, by a control input) and last one write of the variable
(``AssignSubVariableOp``, ``AssignAddVariableOp`` or ``AssignVariableOp``).
Adam's, with ``g`` the gradient (an output of the step's one
``IdentityN``) and ``lr`` the scalars every update shares::

    m0 = read(m);  AssignAdd(m, (g - m0) * c1)          # the slots' writes
    v0 = read(v);  AssignAdd(v, (Square(g) - v0) * c2)
    m1 = read(m);  v1 = read(v)                 # after them (control inputs)
    AssignSub(w, m1 * lr / (Sqrt(v1) + eps))     # the variable's write

The *region* of the update is what runs on the host: the slots' reads and
writes and the arithmetic between them and the variable's write, found by
walking back from that write through

* element-wise ops (`UPDATE_ARITHMETIC_TYPES`) whose output has the
  variable's element count and whose inputs are no larger (so never into the
  backward pass: a ``MatMul`` or ``BiasAddGrad`` making the gradient ends
  the walk);
* reads of other handles (`HOLDER_TYPES`: a ``VarHandleOp``, or a
  ``Placeholder`` holding a captured variable's bytes) that are not
  trainable: the slots; every write of a slot is the update's too (before
  the variable's write, or after it: Lion writes its moment last), and
  the values it writes are walked back in the same way.

* a densification of a sparse gradient (`DENSIFY_TYPES`: an embedding's
  gradient, rows and their indices, summed into a dense tensor for each
  use Keras makes of it, ``Square`` of the rows for Adam's second moment
  included): the walk goes on behind it through the rows' element-wise
  ops, and the rows are the gradient (what crosses the link), the indices
  staying on the device.

Tensors of another size (the learning rate, the iteration's bias
corrections: scalars every update shares) stay on the device and are
read from there; reads of the variable itself stay too (the update then
needs the weights on the host: ``reads_weights``). The *gradient* is the
one tensor of the variable's size (or a sparse gradient's rows) that the
region reads from outside it.

A variable written twice (AdamW's weight decay, which reads the variable
and not the gradient, before the Adam update) keeps the write the walk
finds no gradient or slot for on the device. Whatever is ambiguous stays
on the device and is named, with the reason, in the `Offload`'s ``left``:
a slot another update or op reads or writes, no gradient or two, two
writes from tensors of the variable's size, a value of the region read
outside it, an update inside a function call (a ``LossScaleOptimizer``'s
cond), an op of the device that Grappler merges into one of the update's
(a batch norm's gradient ``Mul(AddN, Rsqrt)`` and the update's
``Mul(gradient, lr)``: Grappler reorders such a chain only on one device,
so apart they would round differently). An update without slots (SGD
without momentum) has nothing to move and is left out silently.

Each walk is bounded by its update's ops: finding every update is linear
in the size of the updates, plus one pass over the ops for the handles.
Pure: no TensorFlow.
"""

import dataclasses

from tflms import fusions
from tflms.graph_index import FUNCTION_CALL_TYPES

__all__ = ["WRITE_TYPES", "UPDATE_ARITHMETIC_TYPES", "DENSIFY_TYPES",
           "HOLDER_TYPES",
           "Found", "find_elementwise"]

# Writes of a resource variable's whole value (input 0 the handle, input
# 1 the value).
WRITE_TYPES = frozenset({"AssignVariableOp", "AssignAddVariableOp",
                         "AssignSubVariableOp"})
# The arithmetic optimizers update with, element by element. Not AddN
# (gradients of a shared weight are summed with it) nor the activations'
# gradient ops: the walk must stop at the gradient.
UPDATE_ARITHMETIC_TYPES = frozenset({
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Neg",
    "Abs", "Sign", "Maximum", "Minimum", "Pow", "Reciprocal", "Square",
    "SquaredDifference", "Sqrt", "Rsqrt", "Exp", "Log", "Cast", "Identity",
    "Select", "SelectV2", "ClipByValue", "Greater", "GreaterEqual", "Less",
    "LessEqual", "Equal", "NotEqual", "LogicalAnd", "LogicalOr",
    "LogicalNot", "ZerosLike", "OnesLike", "MulNoNan",
})
# Ops that make a dense gradient of a sparse one's rows (input 0) and
# indices: Keras' arithmetic on an embedding's gradient densifies it.
DENSIFY_TYPES = frozenset({"UnsortedSegmentSum"})
# Ops that hold a resource variable: a Session graph's VarHandleOp, or a
# tf.function's placeholder of a captured handle (given the variable's
# bytes by the function step's index).
HOLDER_TYPES = frozenset({"VarHandleOp", "Placeholder"})


@dataclasses.dataclass(frozen=True)
class Found:
    """One element-wise update (op ids); `tflms.offload.Update`'s fields."""

    apply: int
    variable: int
    slots: tuple
    gradient: tuple
    host_ops: tuple
    reads_weights: bool


@dataclasses.dataclass
class _Walk:
    """What the walk back from one write of a variable found."""

    region: set
    candidates: set
    slots: set
    reads_weights: bool = False


def _elements(index, op, output):
    """Elements of a tensor, None when its shape is not fully known."""
    shape = index.output_shapes[op][output]
    if shape is None or None in shape:
        return None
    count = 1
    for dim in shape:
        count *= dim
    return count


def _is_handle(index, op):
    return index.types[op] in HOLDER_TYPES and index.variable_bytes[op] > 0


def _slot_read(index, op, var):
    """The handle `op` (a ``ReadVariableOp``) reads when it is a slot's:
    another non-trainable variable; else None."""
    handle = index.inputs[op][0][0]
    if (handle != var and _is_handle(index, handle)
            and not index.trainable_bytes[handle]):
        return handle
    return None


def _densifies(index, op, count):
    """The data input's element count when `op` makes a tensor of `count`
    elements out of a sparse gradient's rows (an ``UnsortedSegmentSum``,
    as TensorFlow turns an embedding's gradient into a dense one for
    Keras' arithmetic) no larger than it; else None."""
    if index.types[op] not in DENSIFY_TYPES:
        return None
    rows = _elements(index, *index.inputs[op][0])
    if rows is None or rows > count:
        return None
    return rows


def _walk(index, var, write, count):
    """The `_Walk` back from `write` (of `var`, `count` elements)."""
    found = _Walk(region=set(), candidates=set(), slots=set())
    # (tensor, the element count the walk goes through there: the
    # variable's, or a sparse gradient's rows' behind a densification)
    stack = [(index.inputs[write][1], count)]
    seen = set()
    while stack:
        tensor, count = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        op, output = tensor
        if _elements(index, op, output) != count:
            continue  # a shared scalar: read from the device
        kind = index.types[op]
        rows = _densifies(index, op, count)
        if rows is not None:
            # The rows cross the link, not the dense tensor; their
            # indices (and the dense shape) stay on the device.
            found.region.add(op)
            stack.append((index.inputs[op][0], rows))
            continue
        if kind == "ReadVariableOp":
            if index.inputs[op][0][0] == var:
                found.reads_weights = True
                continue
            handle = _slot_read(index, op, var)
            if handle is None:
                found.candidates.add(tensor)
                continue
            found.region.add(op)
            if handle not in found.slots:
                # Every write of the slot is the update's, before the
                # variable's write or after it (Lion writes its moment
                # last).
                found.slots.add(handle)
                for c, slot in index.consumers[handle][0]:
                    if slot == 0 and index.types[c] in WRITE_TYPES:
                        found.region.add(c)
                        stack.append((index.inputs[c][1], count))
            continue
        if kind in UPDATE_ARITHMETIC_TYPES and all(
                (n := _elements(index, p, k)) is not None and n <= count
                for p, k in index.inputs[op]):
            found.region.add(op)
            stack.extend((t, count) for t in index.inputs[op])
            continue
        found.candidates.add(tensor)
    return found


def _outside(index, walk, write, var):
    """Why the region of `walk` cannot move (a value of it, or a slot,
    used outside it), or None."""
    names = index.names
    region = walk.region
    for op in sorted(region):
        for consumers in index.consumers[op]:
            for c, _ in consumers:
                if c not in region and c != write:
                    return "%s is read outside the update, by %s" % (
                        names[op], names[c])
        for c in index.control_outputs[op]:
            if (c not in region and c != write
                    and index.types[c] in WRITE_TYPES
                    and index.inputs[c][0][0] != var):
                return "%s orders the write %s of another variable" % (
                    names[op], names[c])
    for slot in sorted(walk.slots):
        for consumers in index.consumers[slot]:
            for c, _ in consumers:
                if c not in region:
                    return "its slot %s is used outside the update, by %s" \
                        % (names[slot], names[c])
    return None


def _merged_across(index, walk, inner):
    """Why the update cannot leave the device because Grappler merges an
    op the update reads into one of the update's (a gradient's last
    product ``Mul(AddN, Rsqrt)`` and the update's ``Mul(gradient, lr)``,
    which its arithmetic optimizer reorders as one chain), or None.
    Grappler groups ops on one device only: moved apart they would round
    differently from the step without LMS (`fusions.grappler_groups`)."""
    names = index.names
    for op in sorted(walk.region):
        for producer, output in index.inputs[op]:
            if producer in walk.region:
                continue
            merged, _ = fusions.through_identities(index, producer, output)
            if merged in inner:
                return ("Grappler merges %s into the update's %s, and it "
                        "would round differently with the two on other "
                        "devices" % (names[merged], names[op]))
    return None


def _update_of(index, var, managed, inner=frozenset()):
    """``(Found or None, reason or None)`` for the trainable `var`."""
    names = index.names
    users = index.consumers[var][0] if index.consumers[var] else ()
    writes = [c for c, slot in users
              if slot == 0 and index.types[c] in WRITE_TYPES]
    calls = sorted({c for c, _ in users
                    if index.types[c] in FUNCTION_CALL_TYPES})
    if not writes:
        if calls:
            return None, ("its update is inside %s (%s), a function call "
                          "LMS does not look into" % (
                              names[calls[0]], index.types[calls[0]]))
        return None, None
    walks = []
    for write in sorted(writes):
        value = index.inputs[write][1]
        count = _elements(index, *value)
        if count is None or count * index.output_itemsizes[value[0]][
                value[1]] != index.variable_bytes[var]:
            continue  # not a write of the whole variable
        walk = _walk(index, var, write, count)
        if walk.candidates or walk.slots:
            walks.append((write, walk))
    if not walks:
        return None, None
    if len(walks) > 1:
        return None, "written twice from tensors of its size (%s and %s)" % (
            names[walks[0][0]], names[walks[1][0]])
    write, walk = walks[0]
    if not walk.slots:
        return None, None  # no optimizer state: nothing to move
    if not managed(index.devices[write]):
        return None, None
    trouble = (_outside(index, walk, write, var)
               or _merged_across(index, walk, inner))
    if trouble is not None:
        return None, "%s: %s" % (names[write], trouble)
    if not walk.candidates:
        return None, "%s: no gradient (no tensor of the variable's size " \
            "from outside the update)" % names[write]
    if len(walk.candidates) > 1:
        first, second = sorted(walk.candidates)[:2]
        return None, "%s: two gradient candidates (%s:%d and %s:%d)" % (
            names[write], names[first[0]], first[1], names[second[0]],
            second[1])
    (gradient,) = walk.candidates
    return Found(apply=write, variable=var, slots=tuple(sorted(walk.slots)),
                 gradient=gradient, host_ops=tuple(sorted(walk.region)),
                 reads_weights=walk.reads_weights), None


def find_elementwise(index, managed, skip=frozenset()):
    """``(found, left)``: a `Found` per element-wise update of a trainable
    variable on a `managed` device (``managed(device) -> bool``), in
    variable id order, and a line per update that stays on the device
    (the variable, then why). `skip`: variables updated otherwise (a
    fused kernel), not looked at."""
    names = index.names
    found, left = [], []
    inner = fusions.grappler_groups(index).inner
    for var in range(index.num_ops):
        if (not index.trainable_bytes[var] or not _is_handle(index, var)
                or var in skip or not managed(index.devices[var])):
            continue
        update, reason = _update_of(index, var, managed, inner)
        if reason is not None:
            left.append("%s: %s" % (names[var], reason))
        elif update is not None:
            found.append(update)
    owners = {}
    for u in found:
        for s in u.slots:
            owners.setdefault(s, []).append(u.variable)
    kept = []
    for u in found:
        shared = [s for s in u.slots if len(owners[s]) > 1]
        if shared:
            other = [v for v in owners[shared[0]] if v != u.variable][0]
            left.append("%s: its slot %s is shared with the update of %s"
                        % (names[u.variable], names[shared[0]], names[other]))
        else:
            kept.append(u)
    return kept, left
