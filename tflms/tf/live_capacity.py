"""`tflms capacity` from Python: the largest batches of a live `tf.Graph`
(a Session graph whose batch dimension is free) or of a live Keras 3
model, planned with an `LMS`'s settings (docs/capacity.md)::

    lms = LMS()
    lms.autotune_gpu_mem = 16
    lms.gpu = "V100-SXM2-16GB"
    found = live_capacity.of_graph(graph, lms)            # tf.compat.v1
    found = live_capacity.of_keras3_model(model, lms)     # Keras 3
    found.max_batch_with_lms, found.rows
    found = live_capacity.of_keras3_model(model, lms, dimension="sequence",
                                          batch_size=8)   # Keras 3
    found.max_sequence_with_lms, found.rows

Nothing is rewritten: each batch is planned (`capacity.plan_row`) as
`LMS.run` would plan it, on the step and target the rewrite reads
(`rewrite.session_graph_step`, `rewrite.function_graph_step`). A Session
graph is indexed once and planned at every batch (the simulator sizes the
first unknown dimension with it); a
Keras 3 model's ``train_step`` is traced once per batch
(`keras3_trace.trace`), or, searching the sequence, once per sequence
length with the batch fixed: axis 1 of every input the model leaves
unknown (`keras3_trace.sequence_inputs`), up to the longest the model was
built for (`keras3_trace.sequence_limit`, `sequence_bounds`).
"""

import dataclasses

from tflms import budget as budget_mod
from tflms import capacity
from tflms import offload
from tflms.tf.adapters import graph_step
from tflms.tf.adapters import rewrite
from tflms.tf import keras3_trace
from tflms import pipeline

__all__ = ["of_graph", "of_keras3_model", "graph_plan_at",
           "keras3_plan_at", "batch_is_free", "budget_of",
           "sequence_bounds", "search_sequence"]


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
    # Planned for a GPU's budget, as every step is planned
    # (`graph_step.step_target`): oneDNN's CPU passes do not run there.
    index, target = rewrite.session_graph_step(
        graph, settings, fetches,
        target=graph_step.step_target(settings, here=False))
    if not batch_is_free(index):
        raise ValueError(
            "%s has only static shapes, so its batch cannot change; the "
            "capacity search needs inputs with an unknown batch dimension "
            "(tf.compat.v1.placeholder(tf.float32, [None, ...]), a Keras "
            "model's Input)" % what)
    if settings.offload_optimizer:
        # Planned as LMS.run plans it: the slots and updates on the host
        # ('auto' too: the largest batch with it is the largest with them
        # there).
        index, target, _ = offload.planning_step(index, target,
                                                 settings.cpu_device)
    roles = pipeline.classify(index, settings, target)

    def plan_at(batch):
        return capacity.plan_row(index, roles, settings, batch, log,
                                 target=target)
    return plan_at


def keras3_plan_at(loaded, settings, path="the model", log=None,
                   dimension="batch"):
    """``plan_at(size) -> capacity.BatchRow`` for a Keras 3 model loaded
    by `keras3_trace.load_model` (or `keras3_trace.from_model`): its
    ``train_step`` traced once per batch; with ``dimension="sequence"``,
    once per sequence length at the batch `loaded` was made for. With
    ``offload_optimizer`` ('auto' too, as for a graph), each step is
    planned with its optimizer's element-wise updates and slots on the
    host (`offload.planning_index`).

    Raises:
      ValueError: no auto-tuning; no input with a sequence axis
        (`keras3_trace.Keras3PlanError`).
    """
    _check(settings)
    if dimension == "sequence":
        keras3_trace.sequence_inputs(loaded, path)

    def plan_at(size):
        if dimension == "sequence":
            batch, sequence = loaded.batch, size
            traced = _trace_at_length(loaded, sequence, path)
        else:
            batch, sequence = size, None
            traced = keras3_trace.trace(loaded, batch_size=batch, path=path)
        # Planned for a GPU's budget: oneDNN's CPU passes do not run there.
        index, target = rewrite.function_graph_step(
            traced.graph, settings,
            graph_step.step_target(settings, here=False))
        if settings.offload_optimizer:
            # The optimizer's element-wise updates and slots on the host
            # (`offload.find_updates`), where offload puts them; the
            # traced step has them on the device.
            index, target, _ = offload.planning_step(
                index, target, settings.cpu_device, target.manages)
        roles = pipeline.classify(index, settings, target)
        return capacity.plan_row(index, roles, settings, batch, log,
                                 sequence=sequence, target=target)
    return plan_at


def _trace_at_length(loaded, sequence, path):
    """`keras3_trace.trace` at `sequence`; a model that cannot be traced
    that long says which length and what to do."""
    try:
        return keras3_trace.trace(loaded, path=path, sequence=sequence)
    except keras3_trace.Keras3PlanError:
        raise
    except Exception as e:
        raise keras3_trace.Keras3PlanError(
            "tracing the training step of %s at sequence length %d (batch "
            "%d) failed: %s: %s. If the model cannot take sequences that "
            "long (a position table shorter than that), search below it: "
            "--max-sequence %d (limit=%d from Python)" % (
                path, sequence, loaded.batch, type(e).__name__, e,
                sequence - 1, sequence - 1)) from None


def search_sequence(plan_at, settings, batch_size, start, bounds,
                    max_overhead_pct=None, progress=None):
    """`capacity.search` over the sequence length: `bounds` is
    ``(limit, reason)`` (`sequence_bounds`); the `Capacity` records the
    fixed batch and the reason."""
    limit, reason = bounds
    found = capacity.search(plan_at, budget_of(settings), max_overhead_pct,
                            start, limit, progress, dimension="sequence")
    return dataclasses.replace(found, batch_size=batch_size,
                               limit_reason=reason)


def sequence_bounds(model, start, limit, start_flag="start",
                    limit_flag="limit"):
    """``(limit, reason)`` of a search over the sequence of `model`: the
    longest the model was built for (`keras3_trace.sequence_limit`) when
    it is below `limit` (or `limit` is None), with the reason the search
    reports; else `limit` (`capacity.DEFAULT_LIMIT` when None) and None.

    Raises:
      ValueError: `start` is past the model's longest (names
        `start_flag`).
    """
    longest, reason = keras3_trace.sequence_limit(model)
    if longest is not None and start > longest:
        raise ValueError(
            "%s %d is longer than the model takes: %s; give a %s of at "
            "most %d" % (start_flag, start, reason, start_flag, longest))
    if longest is not None and (limit is None or limit > longest):
        return longest, reason
    return (capacity.DEFAULT_LIMIT if limit is None else limit), None


def of_graph(graph, lms, fetches=None, max_overhead_pct=None, start=1,
             limit=capacity.DEFAULT_LIMIT):
    """The `capacity.Capacity` of a Session graph's training step (found by
    `tflms.step`'s rules, or `fetches`) with `lms`'s settings."""
    settings = lms.settings
    return capacity.search(graph_plan_at(graph, settings, fetches),
                           budget_of(settings), max_overhead_pct, start,
                           limit)


def of_keras3_model(model, lms, max_overhead_pct=None, start=1,
                    limit=None, dimension="batch", batch_size=None):
    """The `capacity.Capacity` of a compiled Keras 3 model's
    ``train_step`` with `lms`'s settings (eager mode).

    Args:
      model, lms: the compiled model; the `LMS` whose settings plan.
      max_overhead_pct, start, limit: as `capacity.search`; `limit`
        defaults to `capacity.DEFAULT_LIMIT`, and a search over the
        sequence stops at the longest the model was built for
        (`sequence_bounds`).
      dimension: "batch" (default) or "sequence": the sequence length
        (axis 1 of every input the model leaves unknown) with the batch
        fixed at `batch_size`.
      batch_size: the fixed batch of a search over the sequence.

    Raises:
      ValueError: `dimension` or `batch_size` wrong for each other, a model
        without a sequence axis, bounds out of range.
    """
    settings = lms.settings
    if dimension not in capacity.DIMENSIONS:
        raise ValueError("dimension must be one of %s; got %r" % (
            ", ".join(capacity.DIMENSIONS), dimension))
    if dimension == "batch":
        if batch_size is not None:
            raise ValueError(
                "batch_size=%r is the fixed batch of a search over the "
                "sequence; dimension='batch' searches the batch: drop "
                "batch_size, or pass dimension='sequence'" % (batch_size,))
        loaded = keras3_trace.from_model(model, start)
        return capacity.search(
            keras3_plan_at(loaded, settings), budget_of(settings),
            max_overhead_pct, start,
            capacity.DEFAULT_LIMIT if limit is None else limit)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            "dimension='sequence' searches the sequence length at a fixed "
            "batch: pass batch_size=N (a positive int, the batch you train "
            "with); got %r" % (batch_size,))
    bounds = sequence_bounds(model, start, limit)
    loaded = keras3_trace.from_model(model, batch_size, sequence=start)
    return search_sequence(
        keras3_plan_at(loaded, settings, dimension="sequence"), settings,
        batch_size, start, bounds, max_overhead_pct)
