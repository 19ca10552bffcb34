"""The one reader of TensorFlow graphs: a `tf.Graph` -> `GraphIndex`.

Everything the planning needs from TensorFlow is read here, once, into the
plain per-op fields of a `graph_index.GraphIndex`: which ops the training
step runs (the rules of `tflms.step`: fetches given, the ``train_op``
collection, the optimizer updates), names, types, devices, edges, static
shapes and element sizes, variable sizes, statefulness from op defs,
control-flow contexts, collectives inside called functions, the trainable
variables, the flops of contractions. The rest of tflms below the
rewriter (`graph_index`, `analysis`, `planner`, `simulator`, `steptime`,
`stages`) is pure Python and imports no TensorFlow
(`tests/test_pure_core.py`), so it also works on literal graphs
(`graph_index.from_edges`) and on any other reader's index. A
`tf.function`'s `FuncGraph` is a `tf.Graph`, so this reader reads those
too.

Nothing here mutates the graph: the rewriter alone does.
"""

import tensorflow as tf

from tflms import graph_index as gi
from tflms.graph_index.build import Columns, OpFacts, assemble
from tflms.graph_index.index import NEUTRAL_OPERANDS
from tflms.graph_index.sizes import prod
from tflms.step import APPLY_PREFIXES, ASSIGN_TYPES, StepFetches

__all__ = ["build_index", "find_fetches", "fetch_ops_of",
           "keras_train_fetches", "fan_in"]


# ---- the training step: the ops one run of the fetches executes ----------
def fetch_ops_of(graph, fetches, what="fetches"):
    """The `tf.Operation`s of `fetches`, in graph order without repeats.

    Args:
      graph: the `tf.Graph` they belong to.
      fetches: what `Session.run` takes: an op, a tensor, a variable, a
        name (``"train_op"``, ``"loss:0"``), or a list, tuple or dict of
        them, nested.
      what: the parameter's name, for errors.

    Raises:
      ValueError: naming the entry that is not of `graph` or not a fetch.
    """
    flat = tf.nest.flatten(fetches)
    if not flat:
        raise ValueError(
            "%s is empty: pass the train op (or a list of what one training "
            "step runs, as given to Session.run), or None to let LMS find "
            "it" % what)
    found = {}
    for item in flat:
        op = _as_op(graph, item, what)
        found[op.name] = op
    order = {op.name: i for i, op in enumerate(graph.get_operations())}
    return tuple(sorted(found.values(), key=lambda op: order[op.name]))


def _as_op(graph, item, what):
    if isinstance(item, str):
        try:
            element = graph.as_graph_element(item, allow_tensor=True,
                                             allow_operation=True)
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(
                "%s: %r names nothing in the graph (%s); pass an op name "
                "such as 'train_op' or a tensor name such as 'loss:0'"
                % (what, item, e)) from None
        return element if isinstance(element, tf.Operation) else element.op
    if isinstance(item, tf.Operation):
        op = item
    else:
        op = getattr(item, "op", None)
        if not isinstance(op, tf.Operation):
            raise ValueError(
                "%s: %r is not an op, a tensor, a variable or a name; pass "
                "what one training step runs, as given to Session.run"
                % (what, item))
    if op.graph is not graph:
        raise ValueError(
            "%s: %s belongs to another graph than the one LMS edits; pass "
            "ops of that graph" % (what, op.name))
    return op


def find_fetches(graph, fetches=None, source="the fetches passed to run()"):
    """The `step.StepFetches` of `graph` by the rules of the module docstring.

    Args:
      graph: a `tf.Graph`.
      fetches: what one training step runs (see `fetch_ops_of`), or None.
      source: where `fetches` came from, for the rule's text.
    """
    if fetches is not None:
        ops = fetch_ops_of(graph, fetches)
        return StepFetches(ops, "%s (%s)" % (source, _count(ops)))
    losses = [t for t in graph.get_collection(
        tf.compat.v1.GraphKeys.LOSSES) if getattr(t, "graph", None) is graph]
    with_losses = " and its losses collection" if losses else ""
    train_ops = graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
    if train_ops:
        ops = fetch_ops_of(graph, train_ops + losses,
                           "the train_op collection")
        return StepFetches(ops, "the graph's train_op collection%s (%s)"
                           % (with_losses, _count(ops)))
    ops = _optimizer_updates(graph)
    if ops:
        ops = fetch_ops_of(graph, list(ops) + losses, "the updates")
        return StepFetches(ops, "the optimizer updates of the graph%s (%s)"
                           % (with_losses, _count(ops)))
    return StepFetches((), "the whole graph: it has no train_op collection "
                           "and no optimizer update LMS recognises")


def keras_train_fetches(graph, model):
    """The `step.StepFetches` of a Keras 2 model's graph-mode train function
    (its outputs, updates and extra fetches), or None (then found by the
    default rules) when the model has none, as in predict() or
    evaluate()."""
    function = getattr(model, "train_function", None)
    if function is None:
        return None
    parts = list(getattr(function, "outputs", None) or ())
    updates = getattr(function, "updates_op", None)
    if updates is not None:
        parts.append(updates)
    parts.extend(getattr(function, "fetches", None) or ())
    parts = [p for p in parts if getattr(p, "graph", None) is graph]
    if not parts:
        return None
    return find_fetches(graph, parts,
                        source="the Keras train function's fetches")


def _count(ops):
    return "%d op%s" % (len(ops), "" if len(ops) == 1 else "s")


def _optimizer_updates(graph):
    """`Apply*` ops, and assignments to trainable variables whose value
    depends on an op in a ``gradients`` name scope."""
    ops = graph.get_operations()
    trainable_handles = set()
    for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES):
        handle = getattr(v, "handle", None)
        op = getattr(handle, "op", None) or getattr(v, "op", None)
        if isinstance(op, tf.Operation):
            trainable_handles.add(op.name)
    updates = [op for op in ops if op.type.startswith(APPLY_PREFIXES)]
    if updates:
        return tuple(updates)
    # Hand-written updates (``v.assign_sub(lr * grad)``): one pass in
    # creation order, in which every op comes after its data inputs (a
    # loop's NextIteration input is the one exception, and no gradient is
    # made inside a loop that feeds an assignment outside it).
    from_gradients = set()
    found = []
    for op in ops:
        grad = (any(part.startswith("gradients")
                    for part in op.name.split("/")[:-1])
                or any(t.op.name in from_gradients for t in op.inputs))
        if grad:
            from_gradients.add(op.name)
        if (grad and op.type in ASSIGN_TYPES and op.inputs
                and op.inputs[0].op.name in trainable_handles):
            found.append(op)
    return tuple(found)


def fan_in(ops):
    """Every op `ops` read, directly or not, through data and control
    inputs, with `ops` themselves: what a `Session.run` of them executes."""
    seen = {op.name: op for op in ops}
    stack = list(seen.values())
    while stack:
        op = stack.pop()
        for t in op.inputs:
            p = t.op
            if p.name not in seen:
                seen[p.name] = p
                stack.append(p)
        for p in op.control_inputs:
            if p.name not in seen:
                seen[p.name] = p
                stack.append(p)
    return seen


# ---- the index -----------------------------------------------------------
# Ops that hold a variable's buffer (its bytes are `variable_bytes`).
_VARIABLE_HOLDER_TYPES = frozenset({
    "VarHandleOp", "VariableV2", "Variable", "VarHandleOpV2",
})

# Element sizes of dtypes whose tensors are not plain buffers of numbers.
_OPAQUE_DTYPES = frozenset({tf.resource, tf.variant, tf.string})

# A reference output (a v1 ref variable's VariableV2, and the ref outputs of
# Assign, Apply*, Scatter*, RefSwitch... that update or route it) is the
# variable's own buffer handed on (the kernels call set_output_ref or
# forward_ref_input_to_ref_output), so it counts no bytes: the variable is
# counted once, in `variable_bytes`. TemporaryVariable is the exception: its
# ref output is a buffer it allocates during the step
# (`graph_index.ALLOCATING_REF_TYPES`).

# Types whose output 0 may be an identity of an input (`_forwarded_slot`).
_MAY_FORWARD = gi.GRAPPLER_IDENTITY_TYPES | frozenset(NEUTRAL_OPERANDS)


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



def _forwarded_slot(op):
    """`GraphIndex.forwards_input` of one op."""
    if op.type in gi.GRAPPLER_IDENTITY_TYPES:
        return 0 if op.inputs else None
    neutral, pairs = NEUTRAL_OPERANDS[op.type]
    out = op.outputs[0]
    for kept, other in pairs:
        x, const = op.inputs[kept], op.inputs[other]
        # The output is x itself only if broadcasting changes nothing.
        if (const.op.type != "Const" or x.dtype != out.dtype
                or not x.shape.is_fully_defined()
                or x.shape != out.shape):
            continue
        if holds_only(const.op.get_attr("value"), neutral):
            return kept
    return None


def holds_only(value, neutral):
    """True if the constant `value` (a TensorProto) holds `neutral` in
    every element: a small constant only (a large one is no neutral
    scalar, and is not worth decoding)."""
    if prod(d.size for d in value.tensor_shape.dim) > 1024:
        return False
    try:
        array = tf.make_ndarray(value)
    except (TypeError, ValueError):
        return False
    return bool(array.size) and bool((array == neutral).all())


def _static_shape(tensor):
    shape = tensor.shape
    if shape.rank is None:
        return None
    return tuple(shape.as_list())


def _itemsize(dtype):
    if dtype in _OPAQUE_DTYPES or dtype != dtype.base_dtype:
        return 0  # opaque, or a reference to a variable's buffer
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


def _flops_of(op):
    """`GraphIndex.flops` of a `graph_index.FLOP_TYPES` op, from its static
    shapes and attributes."""
    return gi.contraction_flops(
        op.type, op.get_attr, [_static_shape(t) for t in op.inputs],
        [_static_shape(t) for t in op.outputs])


def _called_functions(node_def):
    names = []
    for key in sorted(node_def.attr):
        value = node_def.attr[key]
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return names


def _function_has_collective(graph, name, memo):
    if name not in memo:
        memo[name] = False  # guards against recursive functions
        function = graph._get_function(name)
        nodes = function.definition.node_def if function is not None else ()
        memo[name] = any(
            node.op in gi.COLLECTIVE_TYPES or any(
                _function_has_collective(graph, f, memo)
                for f in _called_functions(node))
            for node in nodes)
    return memo[name]


def _trainable_bytes_by_op(graph, id_of):
    """Bytes of the ``trainable_variables`` collection, summed per op."""
    found = {}
    for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES):
        shape = v.shape
        if not shape.is_fully_defined():
            continue
        try:
            op_id = id_of.get(v.op.name)
        except AttributeError:  # not a variable; nothing to attribute
            continue
        if op_id is not None:
            found[op_id] = (found.get(op_id, 0)
                            + shape.num_elements() * v.dtype.base_dtype.size)
    return found


def build_index(graph, fetches=None):
    """Index the training step of a graph once.

    Args:
      graph: a `tf.Graph`.
      fetches: what one training step runs, as `Session.run` takes it (ops,
        tensors, variables, names, nested lists), or a `step.StepFetches`;
        None: found by the rules of `tflms.step`. The index holds the fan-in
        of the fetch ops (data and control inputs) and nothing else: ops the
        step never runs are neither planned nor counted.

    Returns:
      A `graph_index.GraphIndex`; ids are positions in the step's ops, in
      graph order.

    Raises:
      ValueError: a fetch that is not of `graph`.
      dag_levels.GraphCycleError: if the graph has a cycle.
    """
    if not isinstance(fetches, StepFetches):
        fetches = find_fetches(graph, fetches)
    ops = tuple(graph.get_operations())
    id_of = {op.name: i for i, op in enumerate(ops)}

    cols = Columns()
    stateful_by_type = {}  # an op def is per type
    memo = {}  # function name -> holds a collective
    trainable = _trainable_bytes_by_op(graph, id_of)
    # Each TensorFlow accessor is a call into C; on graphs of 10^5 ops they
    # are most of the indexing time, so itemsizes are asked once per dtype
    # and variable sizes only of variable ops.
    itemsize_of = {}
    for i, op in enumerate(ops):
        op_type = op.type
        outs = op.outputs
        dtypes = [t.dtype for t in outs]
        for dtype in dtypes:
            if dtype not in itemsize_of:
                itemsize_of[dtype] = _itemsize(dtype)
        # Ops that write through a reference input (Assign, ApplyMomentum...
        # on v1 ref variables) are not stateful in their op defs, but they
        # change state all the same.
        stateful = stateful_by_type.get(op_type)
        if stateful is None:
            op_def = op.op_def
            stateful = bool(op_def.is_stateful) or any(
                arg.is_ref for arg in op_def.input_arg)
            stateful_by_type[op_type] = stateful
        kind = _control_flow_kind(op)
        cols.add(OpFacts(
            name=op.name, type=op_type, device=op.device,
            inputs=tuple((id_of[t.op.name], t.value_index)
                         for t in op.inputs),
            control_inputs=tuple(sorted({id_of[c.name]
                                         for c in op.control_inputs})),
            output_shapes=tuple(_static_shape(t) for t in outs),
            output_itemsizes=(
                tuple(itemsize_of[d] for d in dtypes)
                if op_type not in gi.ALLOCATING_REF_TYPES
                else tuple(_itemsize(d.base_dtype) for d in dtypes)),
            variable_bytes=(_variable_bytes(op)
                            if op_type in _VARIABLE_HOLDER_TYPES else 0),
            is_stateful=stateful,
            bn_is_training=(bool(op.get_attr("is_training"))
                            if op_type.startswith("FusedBatchNorm")
                            else None),
            forwards_input=(_forwarded_slot(op) if op_type in _MAY_FORWARD
                            else None),
            in_v1_cond=kind == "cond",
            in_v1_loop=kind == "while",
            calls_collective=op_type in gi.FUNCTION_CALL_TYPES and any(
                _function_has_collective(graph, f, memo)
                for f in _called_functions(op.node_def)),
            trainable_bytes=trainable.get(i, 0),
            flops=(_flops_of(op) if op_type in gi.FLOP_TYPES else (0, 0))))
    roots = [id_of[op.name] for op in fetches.ops]
    return assemble(ops, cols, id_of, roots, fetches.rule)
