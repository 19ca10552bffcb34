"""The training step: what one run of the step's fetches executes.

A `tf.Session` runs the fan-in of what it is asked to fetch (every op they
read, through data and control inputs) and nothing else. A training graph
often holds more than its training step: the symbolic forward pass Keras
builds when a model is made on its own `Input` placeholder, evaluation and
prediction heads, summaries, initializers. LMS analyses, plans, simulates
and edits the fan-in of the step's fetches only, so that after the rewrite
the step runs the same ops as before plus LMS's own.

`find_fetches` says which ops those fetches are, by the first rule that
applies:

1. the fetches given (``LMS.run(graph, fetches=...)``; the Keras callback
   passes the train function's fetches);
2. the graph's ``train_op`` collection (TensorFlow's v1 optimizers add
   their update op to it);
3. the optimizer updates of the graph: every ``Apply*`` op
   (``ResourceApplyAdam``, ``ApplyMomentum``...) and every assignment to a
   trainable variable of a value computed from gradients;

   with 2 and 3, the ``losses`` collection too (``tf.compat.v1.losses``
   adds to it): a step's loss is fetched with its train op, and the
   gradients do not read the loss value itself;
4. none: the whole graph is the step (an inference graph, or one whose
   updates LMS cannot recognise), which the log says.

`fan_in` walks a `tf.Graph` from fetch ops; `graph_index.build_index`
indexes the same set from its own integer edges.
"""

import dataclasses

import tensorflow as tf

__all__ = ["StepFetches", "find_fetches", "fan_in", "fetch_ops_of",
           "keras_train_fetches", "APPLY_PREFIXES"]

# Types of the ops that update variables with an optimizer's rule.
APPLY_PREFIXES = ("Apply", "ResourceApply", "SparseApply",
                   "ResourceSparseApply")
# Assignments; one to a trainable variable from a gradient is an update.
_ASSIGN_TYPES = frozenset({
    "Assign", "AssignAdd", "AssignSub", "AssignVariableOp",
    "AssignAddVariableOp", "AssignSubVariableOp",
})


@dataclasses.dataclass(frozen=True)
class StepFetches:
    """The ops whose fan-in is the training step.

    Attributes:
      ops: the fetch `tf.Operation`s, in graph order; empty when the whole
        graph is the step.
      rule: how they were found, for the log (a phrase such as "the
        graph's train_op collection (1 op)").
    """

    ops: tuple
    rule: str

    @property
    def whole_graph(self):
        return not self.ops


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
    """The `StepFetches` of `graph` by the rules of the module docstring.

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
    """The `StepFetches` of a Keras 2 model's graph-mode train function
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
        if (grad and op.type in _ASSIGN_TYPES and op.inputs
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
