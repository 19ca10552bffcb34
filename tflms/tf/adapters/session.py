"""The Session entry point: ``lms.run(graph)`` and the Estimator hook.

`SessionGraph` serves a `tf.Graph` built in graph mode (not a function's
graph): the step is what the fetches given to `run()` execute, else the
graph's ``train_op`` collection, else its optimizer updates (`tflms.step`).
`StepGuard` is what the hook adds to it: a training loop whose global step
stopped advancing stops with an error instead of looping for ever.
Checking that the swaps ran: `swaps_in_run_metadata` on the `RunMetadata`
of a traced ``Session.run``.
"""

import tensorflow as tf

from tflms.results import EagerModeError
from tflms.tf import reader
from tflms.tf import rewriter
from tflms.tf import swaps_ran
from tflms.tf import verify
from tflms.tf.adapters.graph_step import GraphAdapter, TrainingStep

__all__ = ["SessionGraph", "StepGuard", "graph_to_edit",
           "swaps_in_run_metadata", "EAGER_MESSAGE"]

EAGER_MESSAGE = (
    "LMS rewrites TensorFlow graphs and cannot work in eager mode. Call "
    "tf.compat.v1.disable_eager_execution() at the start of your program, "
    "before building the model, then use LMS as a Keras callback, an "
    "Estimator hook, or with lms.run(graph) before creating the Session.")
_FUNCTION_MESSAGE = (
    "LMS cannot edit the graph of a tf.function (FuncGraph %r): TensorFlow "
    "builds and runs such functions itself, and edits to their graphs are "
    "ignored or break them. Call tf.compat.v1.disable_eager_execution() at "
    "the start of your program, before building the model, and use LMS as a "
    "Keras callback, an Estimator hook, or with lms.run(graph) before "
    "creating the Session. To keep the tf.function, pass the training step "
    "itself to lms.function(step_fn) instead (docs/tf2.md).")


def graph_to_edit(graph):
    """`graph`, or the default graph for None, after checking that LMS can
    edit it in place."""
    if graph is None:
        if tf.executing_eagerly():
            raise EagerModeError(EAGER_MESSAGE)
        graph = tf.compat.v1.get_default_graph()
    if not isinstance(graph, tf.Graph):
        raise ValueError("graph must be a tf.Graph or None (the default "
                         "graph); got %r" % (graph,))
    if getattr(graph, "_building_function", False):
        raise EagerModeError(_FUNCTION_MESSAGE % (graph.name,))
    if graph.finalized:
        raise ValueError(
            "the graph is finalized, so LMS cannot edit it. Call "
            "lms.run(graph) before creating the Session or "
            "MonitoredTrainingSession, or pass LMS as a hook "
            "(hooks=[lms]) so it runs in begin().")
    return graph


class SessionGraph(GraphAdapter):
    """A graph-mode `tf.Graph`, run by a Session (``lms.run(graph)``, the
    Estimator hook, the Keras 2 callback's graph)."""

    offload_supported = True

    @classmethod
    def accepts(cls, graph):
        return (isinstance(graph, tf.Graph)
                and not getattr(graph, "_building_function", False))

    def find_step(self):
        fetches = self.fetches
        if fetches is None or not hasattr(fetches, "ops"):
            fetches = reader.find_fetches(self.graph, fetches)
        return TrainingStep(self.graph, fetches)


def swaps_in_run_metadata(result, metadata):
    """A `swaps_ran.SwapsRan`: which swap ops of `result` (a `RunResult`)
    ran in the ``Session.run`` traced into `metadata` (``RunMetadata``
    with ``output_partition_graphs`` and a full trace): found in the
    partition graphs and executed by the step."""
    executed = verify.executed_nodes(metadata)
    checked = swaps_ran.checked(result, list(metadata.partition_graphs))
    ran = {name: device for name, device in checked.ran.items()
           if name in executed}
    return swaps_ran.SwapsRan(
        expected=checked.expected, ran=ran,
        missing=tuple(n for n in checked.expected if n not in ran),
        partition_graphs=checked.partition_graphs)


class StepGuard:
    """Stops a hooked training loop whose global step stopped advancing.

    Estimator.train(steps=N) loops until the global step reaches N; if a
    rewritten graph skipped the step's `AssignAdd` (as once happened when
    oneDNN merged ops around LMS's edges, see `fusions.fusion_partners`),
    it would loop for ever. With LMS's swap ops in a training graph whose
    train op increments the global step, three runs in a row that see the
    same step value raise instead, with what to do. (Not under a
    tf.distribute strategy, whose global step is a distributed variable.)
    """

    RUNS = 3

    def __init__(self, global_step):
        self.global_step = global_step
        self._last = None
        self._same = 0

    @classmethod
    def for_graph(cls, graph):
        """A guard for `graph`, or None when it has nothing to guard."""
        if not rewriter.is_rewritten(graph):
            return None
        with graph.as_default():
            if not tf.compat.v1.get_collection(
                    tf.compat.v1.GraphKeys.TRAIN_OP):
                return None  # evaluation and prediction graphs
            global_step = tf.compat.v1.train.get_global_step()
        if global_step is None:
            return None
        handle = global_step.op
        if not isinstance(handle, tf.Operation):
            # A tf.distribute strategy's global step is a distributed
            # variable (no graph op of its own, and not a fetch like any
            # other): no guard there.
            return None
        increments = any(c.type.startswith("AssignAdd")
                         for t in handle.outputs for c in t.consumers())
        return cls(global_step) if increments else None

    def check(self, value):
        """Called with the global step's value after each training step."""
        if self._last is not None and value == self._last:
            self._same += 1
        else:
            self._same = 0
        self._last = value
        if self._same >= self.RUNS - 1:
            raise RuntimeError(
                "[LMS] The global step stayed at %s for %d training steps "
                "although the train op increments it: part of the training "
                "step rewritten by LMS is not running, and training would "
                "never end. Check the graph with `tflms verify` (see "
                "docs/plan.md) and report it; train without the LMS hook "
                "meanwhile." % (value, self.RUNS))
