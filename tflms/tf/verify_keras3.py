"""``tflms verify`` on a model saved by Keras 3: its ``train_step`` trained
with and without LMS and compared.

Keras 3 has no Session graph: ``fit()`` runs the model's ``train_step`` as
a `tf.function`. `verify` loads the file twice (`keras3_trace.load_model`:
the same saved weights, compiled with the saved or given loss and
optimizer, the optimizer built), makes one batch of random inputs and
targets (seeded; the shapes `keras3_trace` traces with, values as
`tflms.tf.verify.random_value` makes them for a Session graph), and trains
each copy the same number of steps in eager mode: one with
``tf.function(model.train_step)``, the other with
``lms.function(model.train_step)``. Before each step the models' metrics
are reset, so the ``loss`` a step returns is that step's loss.

What counts as a difference (`tflms.tf.verify.VerifyReport.ok`):

* a loss or a variable (the model's weights, the optimizer's variables,
  its iteration count included, and the metrics' variables) not
  bit-identical (beyond ``rtol`` if given);
* the optimizer's iteration count not advancing by one per step (reported
  as the global step);
* a swap op of ``lms.last_run`` missing from the partition graphs
  TensorFlow ran: the per-device graphs it dumps into ``dump_dir`` when
  ``TF_DUMP_GRAPH_PREFIX`` is that folder and ``TF_DUMP_GRAPH_NAME_FILTER``
  matches the rewritten function (``_tflms_``), after every optimization,
  Grappler's included (`tflms.tf.swaps_ran.swap_ops_in_partition_graphs`).
  TensorFlow reads the filter once, at the first function a process
  runs, so the variables must be set before that (``tflms verify`` sees to
  it);
* an op that the training step runs after the rewrite and did not run
  before, other than LMS's own.

TensorFlow returns no step statistics for an eager function call, so,
unlike a Session graph's verification, which ops ran is not compared
(``ops_not_run`` stays empty) and neither are the kernels it ran
(``kernels_differ``). What Grappler makes of the step is compared instead,
on the traced steps (`tflms.tf.grappler_check`, reported as
``VerifyReport.grappler``, informative): Grappler's arithmetic optimizer
may group the additions next to a swap-in differently, which changes the
last bits of a few gradients (docs/tf2.md); ``rtol`` accepts that.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tflms.tf.adapters import tf_function
from tflms.tf import compat
from tflms.tf import swaps_ran
from tflms.tf import keras3_trace
from tflms.tf import reader
from tflms.tf import verify as verify_mod

__all__ = ["DUMP_FILTER", "verify"]

# TF_DUMP_GRAPH_NAME_FILTER for the rewritten function (its name has
# _tflms_, tflms.tf.function_api.rebuild) and nothing else.
DUMP_FILTER = "_tflms_"


def _inputs(loaded, seed):
    """One batch ``(x, y)`` of random tensors for `loaded`'s specs."""
    rng = np.random.RandomState(seed)
    keras = loaded.keras

    def make(spec):
        return tf.constant(verify_mod.random_value(
            rng, spec.shape.as_list(), spec.dtype, "an input or target"))
    return (keras.tree.map_structure(make, loaded.x),
            keras.tree.map_structure(make, loaded.y))


def _variables(model):
    """The model's weights, its optimizer's and its metrics' variables,
    each once, in a fixed order."""
    seen, out = set(), []
    for v in (list(model.variables) + list(model.optimizer.variables)
              + list(model.metrics_variables)):
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _train(model, step, data, steps):
    """``(losses, iterations advanced)`` of `steps` calls of `step`."""
    start = int(model.optimizer.iterations.numpy())
    losses = []
    for _ in range(steps):
        model.reset_metrics()
        logs = step(data)
        if isinstance(logs, dict) and "loss" in logs:
            losses.append(np.asarray(logs["loss"]))
    return losses, int(model.optimizer.iterations.numpy()) - start


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """How the model file is loaded for training: the batch (the model's
    own fixed batch when None), and the loss and optimizer that replace
    the saved ones (`keras3_trace.load_model`)."""

    batch_size: object = None
    loss: object = None
    optimizer: object = None


def verify(path, lms, dump_dir, steps=3, options=ModelOptions(), rtol=0.0,
           seed=0):
    """Train the Keras 3 model `path` with and without LMS and compare.

    Args:
      path: a ``.keras`` (or ``.h5``) file written by Keras 3.
      lms: the `LMS` whose ``function`` rewrites one copy's step.
      dump_dir: the folder TensorFlow dumps the graphs of the rewritten
        function into (``TF_DUMP_GRAPH_PREFIX``, set with
        ``TF_DUMP_GRAPH_NAME_FILTER`` = `DUMP_FILTER` before this process
        ran its first function).
      steps: training steps per copy.
      options: `ModelOptions`: the batch, and a loss and optimizer that
        replace the saved ones.
      rtol: relative tolerance for losses and variables; 0 means
        bit-identical.
      seed: for the random inputs.

    Returns:
      A `tflms.tf.verify.VerifyReport`.

    Raises:
      Keras3PlanError: the file cannot be loaded, compiled or fed.
      VerifyError: `steps` below 1.
    """
    if steps < 1:
        raise verify_mod.VerifyError("steps must be at least 1, got %r"
                                     % (steps,))
    plain = keras3_trace.load_model(path, options.batch_size, options.loss,
                                   options.optimizer)
    rewritten = keras3_trace.load_model(path, options.batch_size,
                                       options.loss, options.optimizer)
    data = _inputs(plain, seed)

    plain_step = tf.function(plain.model.train_step, jit_compile=False)
    base_losses, base_step = _train(plain.model, plain_step, data, steps)

    # Traced first, so that the step's ops before the rewrite are known;
    # lms.function rewrites this very concrete function at its first call.
    traced = tf.function(rewritten.model.train_step, jit_compile=False)
    graph = traced.get_concrete_function(data).graph
    fetch_ops = tf_function.step_fetches(graph).ops
    before = set(reader.fan_in(fetch_ops))
    losses, step = _train(rewritten.model, lms.function(traced), data, steps)
    result = lms.last_run

    base_vars, lms_vars = (_variables(plain.model),
                           _variables(rewritten.model))
    pairs = ([("loss at step %d" % (i + 1), a, b)
              for i, (a, b) in enumerate(zip(base_losses, losses))]
             + [(v.path, v.numpy(), w.numpy())
                for v, w in zip(base_vars, lms_vars)])
    different, worst = verify_mod.compare(pairs, rtol)
    if len(base_vars) != len(lms_vars) or len(base_losses) != len(losses):
        different.append("the number of variables or losses")

    added = (list(result.swapout_ops) + list(result.swapin_ops)
             if result is not None else [])
    ran = swaps_ran.swap_ops_in_partition_graphs(
        swaps_ran.partition_graph_files(dump_dir), added)
    # The rewrite edits `graph` in place; its fetches stay the same ops.
    entering = sorted(set(reader.fan_in(fetch_ops)) - before
                      - set(added))
    # The plain step as traced for its training (the same concrete
    # function), against the rewritten one.
    grappler = verify_mod.grappler_of(
        result, plain_step.get_concrete_function(data).graph, graph,
        [op.name for op in fetch_ops]) if result is not None else None
    notes = list(plain.notes) + [
        "Trained model.train_step (the step fit() runs) %d steps on one "
        "random batch of %d with tf.function and with lms.function; swap "
        "ops that ran: those in the partition graphs TensorFlow ran."
        % (steps, plain.batch)]
    if different and not rtol and not verify_mod.compare(pairs, 1e-5)[0]:
        notes.append(
            "The values differ by float rounding only (--rtol 1e-5 accepts "
            "them): Grappler's arithmetic optimizer may group the additions "
            "next to a swap-in differently (docs/tf2.md).")
    return verify_mod.VerifyReport(
        steps=steps, onednn=compat.onednn_enabled(),
        losses_without=[float(x) for x in base_losses],
        losses_with=[float(x) for x in losses],
        variables=len(base_vars), max_abs_difference=worst,
        different=different, global_step=(base_step, step),
        swap_ops=len(added), swap_ops_ran=sum(1 for n in added if n in ran),
        swap_ops_not_run=[n for n in added if n not in ran],
        ops_not_run=[], kernels_differ={}, ops_entering_step=entering,
        notes=notes, grappler=grappler)
