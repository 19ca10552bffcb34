"""One adapter per TensorFlow entry point, and the order they are asked in.

Two kinds of entry point hand LMS work:

* Graph adapters (`graph_step.GraphAdapter`) serve a graph to rewrite:
  ``accepts(graph)``; ``find_step()`` -> `graph_step.TrainingStep`;
  ``index(step)`` -> `GraphIndex`; ``apply(step, index, plan)`` -> the
  rewriter's result; ``rewrite()`` runs them around the planning pipeline
  (`graph_step.plan_and_rewrite`). Each module says how to check that its
  swap ops ran (`tflms.tf.swaps_ran`).
* Fit adapters (`fit_adapter.FitAdapter`) attach LMS to a Keras fit:
  ``accepts(model)``; ``set_model()``, ``set_params(params)``,
  ``train_begin()``, ``train_end()``, called from the `LMS` callback's
  methods; they find the graph or the function of the training step and
  hand it to a graph adapter.

`LMS` asks the adapters of each kind in the order below and uses the first
that accepts. A new entry point is a new adapter module and one line in
one of these tuples (DEVELOPERS.md, "Adding an entry point").
"""

from tflms.tf.adapters import keras2
from tflms.tf.adapters import keras3
from tflms.tf.adapters import keras3_strategy
from tflms.tf.adapters import multi_worker_step
from tflms.tf.adapters import session
from tflms.tf.adapters import tf_function

__all__ = ["GRAPH_ADAPTERS", "FIT_ADAPTERS", "graph_adapter", "fit_adapter"]

GRAPH_ADAPTERS = (
    # A step on one worker of a MultiWorkerMirroredStrategy.
    multi_worker_step.MultiWorkerStep,
    # A tf.function's graph (lms.function, Keras 3's train step); a
    # strategy's replicas in it are planned device by device.
    tf_function.FunctionStep,
    # A graph-mode tf.Graph: run(graph), the Estimator hook, Keras 2.
    session.SessionGraph,
)

FIT_ADAPTERS = (
    # Keras 3 under a tf.distribute strategy.
    keras3_strategy.Keras3StrategyFit,
    # Keras 3 on one device.
    keras3.Keras3Fit,
    # Keras 2 in graph mode.
    keras2.Keras2Fit,
)


def graph_adapter(lms, graph, fetches=None, target=None):
    """The graph adapter that serves `graph`, made for `lms` (`target`:
    the `target.Target` to plan for; None: the step's on this machine,
    `graph_step.step_target`)."""
    for adapter in GRAPH_ADAPTERS:
        if adapter.accepts(graph):
            return adapter(lms, graph, fetches, target)
    raise ValueError("graph must be a tf.Graph; got %r" % (graph,))


def fit_adapter(lms, model):
    """The fit adapter that serves the fit of `model`, made for `lms`."""
    for adapter in FIT_ADAPTERS:
        if adapter.accepts(model):
            return adapter(lms, model)
    raise ValueError("model must be a Keras model; got %r" % (model,))
