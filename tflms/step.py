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

This module holds what the step is (`StepFetches`, and the op types the
rules look for) and imports no TensorFlow: the graph index and the planning
built on it are pure. The rules are carried out by `tflms.tf.reader`, the
one reader of `tf.Graph`s: `find_fetches`, `keras_train_fetches`,
`fetch_ops_of`, and `fan_in`, which walks a `tf.Graph` from fetch ops
(`build_index` indexes the same set from its own integer edges).
"""

import dataclasses

__all__ = ["StepFetches", "APPLY_PREFIXES", "ASSIGN_TYPES"]


# Types of the ops that update variables with an optimizer's rule.
APPLY_PREFIXES = ("Apply", "ResourceApply", "SparseApply",
                   "ResourceSparseApply")
# Assignments; one to a trainable variable from a gradient is an update.
ASSIGN_TYPES = frozenset({
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
