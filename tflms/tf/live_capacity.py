"""`tflms capacity` from Python: the largest batches of a live `tf.Graph`
(a Session graph whose batch dimension is free) or of a live Keras 3
model, planned with an `LMS`'s settings (docs/capacity.md)::

    lms = LMS()
    lms.autotune_gpu_mem = 16
    lms.gpu = "V100-SXM2-16GB"
    found = live_capacity.of_graph(graph, lms)            # tf.compat.v1
    found = live_capacity.of_keras3_model(model, lms)     # Keras 3
    found.max_batch_with_lms, found.rows

Nothing is rewritten: each batch is planned (`capacity.plan_row`) as
`LMS.run` would plan it. A Session graph is indexed once and planned at
every batch (the simulator sizes the first unknown dimension with it); a
Keras 3 model's ``train_step`` is traced once per batch
(`keras3_trace.trace`).
"""

from tflms import budget as budget_mod
from tflms import capacity
from tflms.tf.adapters import tf_function
from tflms.tf import keras3_trace
from tflms import pipeline
from tflms.tf import reader

__all__ = ["of_graph", "of_keras3_model", "graph_plan_at",
           "keras3_plan_at", "batch_is_free", "budget_of"]


def batch_is_free(index):
    """True if some tensor of the step has an unknown dimension, which the
    simulator sizes with the batch."""
    return any(shape is not None and None in shape
               for shapes in index.output_shapes for shape in shapes)


def budget_of(settings):
    """The device budget `settings` plan for (bytes)."""
    return budget_mod.device_budget(settings.autotune_gpu_mem,
                                    settings.gpu_device)


def _check(settings):
    if not settings.autotune_requested:
        raise ValueError(
            "the capacity search needs auto-tuning: leave swapout_threshold, "
            "swapin_ahead or swapin_groupby at -1 (auto); got %d, %d, %d"
            % (settings.swapout_threshold, settings.swapin_ahead,
               settings.swapin_groupby))


def graph_plan_at(graph, settings, fetches=None, log=None, what="the graph"):
    """``plan_at(batch) -> capacity.BatchRow`` for a Session graph, indexed
    once.

    Raises:
      ValueError: the graph's shapes fix the batch, or no auto-tuning.
    """
    _check(settings)
    index = reader.build_index(graph, fetches)
    if not batch_is_free(index):
        raise ValueError(
            "%s has only static shapes, so its batch cannot change; the "
            "capacity search needs inputs with an unknown batch dimension "
            "(tf.compat.v1.placeholder(tf.float32, [None, ...]), a Keras "
            "model's Input)" % what)
    roles = pipeline.classify(index, settings)

    def plan_at(batch):
        return capacity.plan_row(index, roles, settings, batch, log)
    return plan_at


def keras3_plan_at(loaded, settings, path="the model", log=None):
    """``plan_at(batch) -> capacity.BatchRow`` for a Keras 3 model loaded
    by `keras3_trace.load_model` (or `keras3_trace.from_model`): its
    ``train_step`` traced once per batch."""
    _check(settings)

    def plan_at(batch):
        traced = keras3_trace.trace(loaded, batch_size=batch, path=path)
        # Planned for a GPU's budget: oneDNN's CPU passes do not run there.
        _, index = tf_function.step_of(traced.graph, onednn_cpu=False)
        roles = pipeline.classify(index, settings)
        return capacity.plan_row(index, roles, settings, batch, log)
    return plan_at


def of_graph(graph, lms, fetches=None, max_overhead_pct=None, start=1,
             limit=capacity.DEFAULT_LIMIT):
    """The `capacity.Capacity` of a Session graph's training step (found by
    `tflms.step`'s rules, or `fetches`) with `lms`'s settings."""
    settings = lms.settings
    return capacity.search(graph_plan_at(graph, settings, fetches),
                           budget_of(settings), max_overhead_pct, start,
                           limit)


def of_keras3_model(model, lms, max_overhead_pct=None, start=1,
                    limit=capacity.DEFAULT_LIMIT):
    """The `capacity.Capacity` of a compiled Keras 3 model's
    ``train_step`` with `lms`'s settings (eager mode)."""
    settings = lms.settings
    loaded = keras3_trace.from_model(model, start)
    return capacity.search(keras3_plan_at(loaded, settings), budget_of(
        settings), max_overhead_pct, start, limit)
