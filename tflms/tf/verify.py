"""Check LMS's promise on a user's own graph: training is the same with it.

`verify` loads the graph twice, rewrites one copy with LMS, gives both the
same variable values and the same random inputs, trains both a few steps on
this machine's CPU (with oneDNN as this process has it, which is how the
host side of a GPU job runs too), and compares losses, every variable
(weights, optimizer slots, the global step) and what ran. Used by
``tflms verify``; it never edits the caller's graph.

What counts as a difference:

* a loss or a variable not bit-identical (beyond ``rtol`` if given);
* the global step not advancing by one per step;
* an op that ran without LMS but not with it (TensorFlow ends a step
  without an error when ops sit on a cycle; see
  `fusions.fusion_partners`);
* a swap op LMS added that is in TensorFlow's optimized graph but did not
  run;
* an op that the training step did not run before the rewrite and runs
  after it (LMS may add its own ops to the step, nothing else).

Besides the training, the step is optimized by Grappler with LMS's edits
and without (`tflms.tf.grappler_check`) and what Grappler did differently
is reported (`VerifyReport.grappler`): a structural check, which names
the swaps next to each difference. It does not decide the verdict: a
different fusion or grouping shows in the numbers when it changes them
(and some do not: a product by 0.5 in another order).

The training step is found as `LMS.run` finds it (`tflms.step`): the ops
named with ``--train-op``, else the ``train_op`` collection, else the
optimizer updates. Only the placeholders the step reads get inputs.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tflms.errors import LMSError
from tflms.tf import compat
from tflms.tf import grappler_check
from tflms.tf import reader

__all__ = ["VerifyReport", "VerifyError", "compare", "grappler_of",
           "kernel_counts", "random_value", "unexecuted_nodes", "verify"]

_TRACE = tf.compat.v1.RunOptions(
    trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
    output_partition_graphs=True)


class VerifyError(LMSError, ValueError):
    """The graph cannot be trained by `verify` (no train op, no feed...)."""


@dataclasses.dataclass
class VerifyReport:
    """What `verify` measured.

    Attributes:
      steps: training steps run in each copy.
      onednn: True if oneDNN ran (TF_ENABLE_ONEDNN_OPTS / the CPU default).
      losses_without / losses_with: per step, the compared loss (empty when
        the graph names no loss).
      variables: number of variables compared.
      max_abs_difference: largest absolute difference over losses and
        variables.
      different: names of the variables that differ.
      global_step: how far the global step advanced (without, with), or
        None when the graph has none.
      swap_ops: swap ops LMS added.
      swap_ops_ran: of those, how many ran in the last step.
      swap_ops_not_run: swap ops in the optimized graph that did not run.
      swap_ops_removed: swap ops TensorFlow's graph optimizer removed (not
        in the optimized graph, so they neither ran nor moved memory).
      ops_entering_step: ops that the training step runs after the rewrite
        and did not run before, other than LMS's own (always empty unless
        LMS has a bug).
      ops_not_run: ops that ran without LMS but not with it.
      kernels_differ: op types TensorFlow ran a different number of times
        with LMS (a swap op changed what it fused), as
        ``{type: (without, with)}``.
      notes: lines about how the model was loaded and trained (a Keras 3
        model: `tflms.tf.verify_keras3`).
      grappler: the `tflms.tf.grappler_check.GrapplerReport` of the step
        optimized by Grappler with LMS's edits and without (None when LMS
        did not rewrite it); informative, not part of `ok`.
    """

    steps: int
    onednn: bool
    losses_without: list
    losses_with: list
    variables: int
    max_abs_difference: float
    different: list
    global_step: object
    swap_ops: int
    swap_ops_ran: int
    swap_ops_not_run: list
    ops_not_run: list
    kernels_differ: dict
    swap_ops_removed: list = dataclasses.field(default_factory=list)
    ops_entering_step: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    grappler: object = None

    @property
    def ok(self):
        """True if training with LMS matched training without it."""
        steps_ok = (self.global_step is None
                    or self.global_step == (self.steps, self.steps))
        return (not self.different and steps_ok and not self.ops_not_run
                and not self.swap_ops_not_run and not self.ops_entering_step)


def _fetches(graph, train_op_names, loss_name):
    with graph.as_default():
        try:
            found = reader.find_fetches(
                graph, list(train_op_names) or None, source="--train-op")
        except ValueError as e:
            raise VerifyError(str(e)) from None
        train_ops = list(found.ops)
        if not train_ops:
            raise VerifyError(
                "the graph names no training step (no train_op collection, "
                "no optimizer update): name the op that runs one training "
                "step with --train-op NAME")
        loss = None
        if loss_name:
            try:
                loss = graph.as_graph_element(loss_name, allow_tensor=True,
                                              allow_operation=False)
            except (KeyError, ValueError) as e:
                raise VerifyError("--loss-tensor: %s" % e) from None
        else:
            losses = tf.compat.v1.get_collection(
                tf.compat.v1.GraphKeys.LOSSES)
            if losses:
                loss = losses[0]
        variables = list(tf.compat.v1.global_variables())
        global_step = tf.compat.v1.train.get_global_step()
    return train_ops, loss, variables, global_step


def _feed(graph, fetches, batch_size, seed):
    """Random inputs for the placeholders the step (`fetches`) reads."""
    rng = np.random.RandomState(seed)
    feed = {}
    train_ops, loss = fetches[0], fetches[1]
    step = reader.fan_in(train_ops + ([loss.op] if loss is not None
                                        else []))
    for op in graph.get_operations():
        if op.type != "Placeholder" or op.name not in step:
            continue
        t = op.outputs[0]
        if t.shape.rank is None:
            raise VerifyError(
                "placeholder %s has an unknown rank; verify cannot make "
                "inputs for it" % op.name)
        dims = list(t.shape.as_list())
        if dims and dims[0] is None:
            if batch_size is None:
                raise VerifyError(
                    "placeholder %s, which the training step reads, has an "
                    "unknown batch dimension: pass --batch-size N" % op.name)
            dims[0] = batch_size
        if any(d is None for d in dims):
            raise VerifyError(
                "placeholder %s, which the training step reads, has unknown "
                "dimensions %s besides the batch: verify cannot make inputs "
                "for it; save the model with a fully defined input shape"
                % (op.name, dims))
        feed[t] = random_value(rng, dims, t.dtype, "placeholder %s"
                               % op.name)
    return feed


def random_value(rng, dims, dtype, what):
    """A random input of shape `dims` and type `dtype` drawn from the
    `np.random.RandomState` `rng`, valid for any model: floats in [0, 1)
    (valid as images, weights and probabilities, and as Keras' float class
    labels, which its sparse losses cast to 0), integers and booleans 0
    (valid labels and indices for any class count or table). `what` names
    the input in the error for another type."""
    dtype = tf.as_dtype(dtype).base_dtype
    if dtype.is_floating:
        return rng.uniform(0.0, 1.0, dims).astype(dtype.as_numpy_dtype)
    if dtype.is_integer:
        return np.zeros(dims, dtype.as_numpy_dtype)
    if dtype == tf.bool:
        return np.zeros(dims, bool)
    raise VerifyError("%s has type %s; verify cannot make inputs for it"
                      % (what, dtype.name))


def _train(graph, fetches, feed, steps, values=None):
    train_ops, loss, variables, global_step = fetches
    metadata = tf.compat.v1.RunMetadata()
    with graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        if values is None:
            values = sess.run(variables)
        else:
            for v, value in zip(variables, values):
                v.load(value, sess)
        start = int(sess.run(global_step)) if global_step is not None else 0
        losses = []
        for _ in range(steps):
            out = sess.run([train_ops, loss] if loss is not None
                           else [train_ops], feed, options=_TRACE,
                           run_metadata=metadata)
            if loss is not None:
                losses.append(np.asarray(out[1]))
        final = sess.run(variables)
        step = (int(sess.run(global_step)) - start
                if global_step is not None else None)
    return values, losses, final, step, metadata


def _node_names(metadata):
    return {n.name: n.op for pg in metadata.partition_graphs for n in pg.node}


def executed_nodes(metadata):
    """Names of the nodes that ran in the step traced into `metadata`
    (its step stats)."""
    return {n.node_name for d in metadata.step_stats.dev_stats
            for n in d.node_stats}


def unexecuted_nodes(metadata):
    """Names of the nodes of the optimized graphs that did not run in the
    traced step: ops on a cycle (or after one) never run, and TensorFlow
    ends the step without an error."""
    return set(_node_names(metadata)) - executed_nodes(metadata)


def kernel_counts(metadata):
    """How many nodes of each op type the optimized graphs run, without the
    Identity and NoOp nodes that LMS adds: equal counts with and without LMS
    mean TensorFlow fused the same ops into the same kernels."""
    counts = {}
    for op in _node_names(metadata).values():
        if op not in ("Identity", "NoOp"):
            counts[op] = counts.get(op, 0) + 1
    return counts


def compare(pairs, rtol=0.0):
    """``(names that differ, largest absolute difference)`` of `pairs`,
    ``(name, without LMS, with LMS)`` values: bit-identical, or within
    `rtol` (relative, no absolute tolerance) when it is not 0."""
    different = []
    worst = 0.0
    for name, a, b in pairs:
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            different.append(name)
            continue
        if a.dtype.kind in "fc":
            diff = float(np.max(np.abs(a - b))) if a.size else 0.0
            worst = max(worst, diff)
            same = np.allclose(a, b, rtol=rtol, atol=0.0) if rtol else (
                np.array_equal(a, b))
        else:
            same = np.array_equal(a, b)
        if not same:
            different.append(name)
    return different, worst


def verify(load, lms, steps=3, batch_size=None, train_op_names=(),
           loss_name=None, rtol=0.0, seed=0):
    """Train a graph with and without LMS and compare.

    Args:
      load: callable returning a fresh `tf.Graph` with the training graph
        (called twice; the two graphs must be identical).
      lms: the `LMS` to rewrite one copy with (its settings are the user's).
      steps: training steps per copy.
      batch_size: for placeholders with an unknown batch dimension.
      train_op_names: ops that run one step; default the train_op
        collection.
      loss_name: tensor to compare per step; default the first of the
        losses collection (variables are compared either way).
      rtol: relative tolerance for losses and variables; 0 means
        bit-identical.
      seed: for the random inputs.

    Returns:
      A `VerifyReport`.
    """
    if steps < 1:
        raise VerifyError("steps must be at least 1, got %r" % (steps,))
    plain, rewritten = load(), load()
    graph_ops = {op.name for op in plain.get_operations()}
    plain_fetches = _fetches(plain, train_op_names, loss_name)
    lms_fetches = _fetches(rewritten, train_op_names, loss_name)
    plain_feed = _feed(plain, plain_fetches, batch_size, seed)
    before = set(reader.fan_in(lms_fetches[0]))
    result = lms.run(rewritten, fetches=lms_fetches[0])
    grappler = grappler_of(result, plain, rewritten,
                           [op.name for op in lms_fetches[0]])
    values, base_losses, base_final, base_step, base_md = _train(
        plain, plain_fetches, plain_feed, steps)
    _, losses, final, step, md = _train(
        rewritten, lms_fetches,
        _feed(rewritten, lms_fetches, batch_size, seed), steps, values)

    different, worst = compare(
        [("loss at step %d" % (i + 1), a, b)
         for i, (a, b) in enumerate(zip(base_losses, losses))]
        + [(v.op.name, a, b)
           for v, a, b in zip(plain_fetches[2], base_final, final)], rtol)

    nodes, executed = _node_names(md), executed_nodes(md)
    # Recompute clones count as swap ops here: each one Grappler kept must
    # have run (one fused into another clone or merged with a twin is gone
    # from the optimized graph, as a merged swap op is).
    added = list(result.swapout_ops) + list(result.swapin_ops) + list(
        result.rewrite.recompute_ops if result.rewrite else ())
    not_run = sorted(unexecuted_nodes(md) - unexecuted_nodes(base_md))
    swaps_not_run = [n for n in added if n in nodes and n not in executed]
    entering = sorted(set(reader.fan_in(lms_fetches[0])) - before
                      - set(added))
    kernels, base_kernels = kernel_counts(md), kernel_counts(base_md)
    kernels_differ = {k: (base_kernels.get(k, 0), kernels.get(k, 0))
                      for k in sorted(set(kernels) | set(base_kernels))
                      if kernels.get(k, 0) != base_kernels.get(k, 0)}
    return VerifyReport(
        steps=steps, onednn=compat.onednn_enabled(),
        losses_without=[float(x) for x in base_losses],
        losses_with=[float(x) for x in losses],
        variables=len(base_final), max_abs_difference=worst,
        different=different,
        global_step=None if base_step is None else (base_step, step),
        swap_ops=len(added),
        swap_ops_ran=sum(1 for n in added if n in executed),
        swap_ops_not_run=swaps_not_run,
        # Ops of the user's graph only: nodes Grappler made itself (such as
        # ConstantFoldingCtrl/...) are named anew in every optimization.
        ops_not_run=[n for n in not_run if n in graph_ops],
        kernels_differ=kernels_differ,
        swap_ops_removed=[n for n in added if n not in nodes],
        ops_entering_step=entering, grappler=grappler)


def grappler_of(result, original, rewritten, fetch_names):
    """The `grappler_check.GrapplerReport` of `result` (an `LMS.run` of
    `rewritten`; `original` the same step unrewritten): the one the
    rewrite made with the ``grappler_check`` setting on, else made now;
    None when nothing was rewritten."""
    if not result.rewritten:
        return None
    if result.grappler is not None:
        return result.grappler
    return grappler_check.check(original, rewritten, fetch_names)
