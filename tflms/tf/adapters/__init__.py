"""One adapter per TensorFlow entry point, and the order they are asked in.

Two kinds of entry point hand LMS work:

* Graph adapters (`graph_step.GraphAdapter`, made with the graph, the
  settings and a logger) serve a graph to rewrite: ``accepts(graph)``;
  ``find_step()`` -> `graph_step.TrainingStep`; ``index(step)`` ->
  `GraphIndex`; ``target(step)`` -> `tflms.target.Target`;
  ``apply(step, index, plan, target)`` -> the rewriter's result;
  ``rewrite()`` runs them around the planning pipeline
  (`graph_step.plan_and_rewrite`). `rewrite.rewrite_session_graph` and
  `rewrite.rewrite_function_graph` are the two ways to them. Each module
  says how to check that its swap ops ran (`tflms.tf.swaps_ran`).
* Fit adapters (`fit_adapter.FitAdapter`, made with a `rewrite.Rewrites`
  and the model) attach LMS to a Keras fit: ``accepts(model)``;
  ``set_model()``, ``set_params(params)``, ``train_begin()``,
  ``train_end()``, called from the `LMS` callback's methods; they find
  the graph or the function of the training step and have it rewritten
  through their `Rewrites`.

The adapters of each kind are asked in the order below and the first
that accepts serves. A new entry point is a new adapter module and one
line in one of these tuples (DEVELOPERS.md, "Adding an entry point").
"""

from tflms.tf.adapters import keras2
from tflms.tf.adapters import keras3
from tflms.tf.adapters import keras3_strategy
from tflms.tf.adapters import rewrite

__all__ = ["GRAPH_ADAPTERS", "FIT_ADAPTERS", "graph_adapter", "fit_adapter"]

# Function graphs (a step on one worker of a MultiWorkerMirroredStrategy,
# any tf.function's graph), then graph-mode tf.Graphs (run(graph), the
# Estimator hook, Keras 2): rewrite.py's two routes.
GRAPH_ADAPTERS = rewrite.FUNCTION_ADAPTERS + rewrite.SESSION_ADAPTERS

FIT_ADAPTERS = (
    # Keras 3 under a tf.distribute strategy.
    keras3_strategy.Keras3StrategyFit,
    # Keras 3 on one device.
    keras3.Keras3Fit,
    # Keras 2 in graph mode.
    keras2.Keras2Fit,
)


def graph_adapter(graph, settings, log, fetches=None, target=None):
    """The graph adapter that serves `graph`, made with `settings` and
    `log` (`target`: the `target.Target` to plan for; None: the step's on
    this machine, `graph_step.step_target`)."""
    for adapter in GRAPH_ADAPTERS:
        if adapter.accepts(graph):
            return adapter(graph, settings, log, fetches, target)
    raise ValueError("graph must be a tf.Graph; got %r" % (graph,))


def fit_adapter(rewrites, model):
    """The fit adapter that serves the fit of `model`, rewriting through
    `rewrites` (a `rewrite.Rewrites`)."""
    for adapter in FIT_ADAPTERS:
        if adapter.accepts(model):
            return adapter(rewrites, model)
    raise ValueError("model must be a Keras model; got %r" % (model,))
