"""LMS for TensorFlow 2 training steps: `tf.function` code.

A `tf.function` runs one concrete function per input signature, each a
graph (`FuncGraph`) that holds the whole step: the forward pass, the
backward pass the `GradientTape` traced into it, and the optimizer's
updates. `function(step_fn, lms)` returns an `LMSFunction` that, at the
first call with a new signature, traces `step_fn`, indexes the function
graph's training step (its outputs and control outputs, i.e. the updates;
captured variables are resident), plans it with the pipeline `LMS.run`
uses (auto-tuning or fixed parameters), rewrites the graph with
`rewriter.apply_plan`, and builds a new function from it
(`tflms._tf_function`, the one place that uses TensorFlow's internal
function APIs). Later calls with that signature run the rewritten function::

    lms = LMS(swapout_threshold=40, swapin_ahead=3, swapin_groupby=2)
    train_step = lms.function(train_step)   # a Python function or tf.function
    for x, y in data:
        loss = train_step(x, y)             # called exactly like before

Keras 3 ``fit(callbacks=[lms])`` uses it the same way (tflms.keras3 does
``model.train_step = lms.function(model.train_step)`` for the fit, with
XLA off); Keras' train function calls the step while it is traced, and
TensorFlow inlines the rewritten step there.

Where LMS cannot work it raises before anything is traced or changed:
``tf.function(jit_compile=True)``, or a call while XLA compiles the
caller (XLA ignores device placement, so swap ops would not run where
they are placed), calls under a `tf.distribute` strategy (a `MirroredStrategy`
or `MultiWorkerMirroredStrategy` custom loop works when LMS is given the
`tf.function` that calls ``strategy.run``, called outside the strategy's
scope; on each worker of the latter, tflms.multi_worker names the devices
LMS manages and checks that every worker made the same rewrite), and a
step `tf.function` cannot trace. docs/tf2.md has the details.
"""

import dataclasses
import glob
import os
import time

import tensorflow as tf

from tflms import _gc
from tflms import analysis
from tflms import _tf_function
from tflms import graph_index as gi
from tflms import multi_worker
from tflms import step
from tflms.results import EagerModeError, Outcome, RunResult

__all__ = ["function", "LMSFunction", "UnsupportedFunctionError",
           "step_fetches", "step_of", "rewrite_graph",
           "partition_graph_files", "swap_ops_in_partition_graphs",
           "swap_ops_in_graph_defs"]


class UnsupportedFunctionError(ValueError):
    """LMS cannot rewrite this function (the message says what to do);
    nothing was traced or changed."""

    # Raised while an outer tf.function is traced, it reaches the caller
    # as itself: AutoGraph would otherwise turn it into a StagingError.
    ag_pass_through = True


_JIT_MESSAGE = (
    "%s is compiled with XLA (jit_compile=True). XLA places the whole "
    "function itself and ignores the host placement of LMS's swap "
    "operations, so nothing would be swapped. Make the tf.function "
    "without jit_compile (tf.function(step_fn) or jit_compile=False) and "
    "pass that, or the plain Python function, to lms.function().")
_XLA_CALLER_MESSAGE = (
    "%s was called inside a function compiled with XLA (jit_compile=True; "
    "Keras 3 compiles its train function with XLA when "
    "model.compile(jit_compile=...) is True or 'auto'). XLA ignores the "
    "host placement of LMS's swap operations, so nothing would be swapped. "
    "Make the calling function without jit_compile (for Keras 3: "
    "model.compile(..., jit_compile=False)).")
_STRATEGY_MESSAGE = (
    "%s was called under a tf.distribute strategy (%s): LMS cannot "
    "rewrite a step that runs inside strategy.scope() or strategy.run. "
    "Give lms.function the tf.function that calls strategy.run (and "
    "reduces the loss) and call it outside the scope: LMS then plans "
    "every replica, each on its own device (docs/distributed.md). Keras 3 "
    "fit under MirroredStrategy needs nothing of this: pass "
    "callbacks=[lms].")
_TRACE_MESSAGE = (
    "LMS traces %s with tf.function to get its graph, and tracing failed: "
    "%s: %s. LMS rewrites graphs, so it cannot act on eager code that "
    "tf.function cannot trace (reading tensor values with .numpy(), "
    "Python branches on tensor values); make the step traceable "
    "(docs/tf2.md) and pass it again.")


def function(step_fn, lms):
    """Large Model Support for a TensorFlow 2 training step.

    Args:
      step_fn: the training step: a `tf.function`, or a Python function
        (wrapped in `tf.function`). It must not be compiled with XLA.
      lms: the `tflms.LMS` whose settings plan the step (``LMS()``
        auto-tunes, which needs `batch_size` only when the step's batch
        dimension is unknown). ``LMS(...).function(step_fn)`` calls this.

    Returns:
      An `LMSFunction`, called with the arguments `step_fn` takes.

    Raises:
      UnsupportedFunctionError: `lms` is not an LMS, `step_fn` is not
        callable, or a
        `tf.function` made with ``jit_compile=True``.
    """
    return LMSFunction(step_fn, lms)


def _name_of(fn):
    return getattr(fn, "__name__", None) or type(fn).__name__


class LMSFunction:
    """A training step whose concrete functions LMS has rewritten.

    Call it like the step it wraps. Each input signature is traced,
    planned and rewritten once, at its first call; `results` maps each
    traced concrete function's name to the `tflms.RunResult` of its
    rewrite (the latest is also `lms.last_run`).
    """

    def __init__(self, step_fn, lms):
        # An LMS is recognised by what this class calls on it: tflms.lms
        # imports this module, so it cannot import tflms.lms back.
        if not callable(getattr(lms, "_run", None)):
            raise UnsupportedFunctionError(
                "lms must be a tflms.LMS; got %r. Use LMS(...).function("
                "step_fn)" % (lms,))
        if not callable(step_fn):
            raise UnsupportedFunctionError(
                "step_fn must be a training step: a Python function or a "
                "tf.function; got %r" % (step_fn,))
        self._name = _name_of(step_fn)
        if isinstance(step_fn, tf.types.experimental.GenericFunction):
            if _tf_function.is_jit_compiled(step_fn):
                raise UnsupportedFunctionError(_JIT_MESSAGE % self._name)
            self._function = step_fn
            self._wrapped = False
        else:
            self._function = tf.function(step_fn)
            self._wrapped = True
        self.lms = lms
        self.step_fn = step_fn
        # concrete function name -> (original, rewritten or original,
        # RunResult)
        self._cache = {}

    @property
    def results(self):
        """``{concrete function name: RunResult}`` of every signature
        traced so far."""
        return {name: entry[2] for name, entry in self._cache.items()}

    @property
    def concrete_functions(self):
        """``{traced concrete function name: the function that runs}``:
        the rewritten one, or the traced one itself where LMS found the
        step fits (NOT_NEEDED)."""
        return {name: entry[1] for name, entry in self._cache.items()}

    @property
    def python_function(self):
        return getattr(self._function, "python_function", self.step_fn)

    # Inside an outer tf.function, AutoGraph would otherwise convert these
    # calls, and with them every planning function LMS calls (tens of
    # seconds for nothing: LMS runs in Python at trace time).
    @tf.autograph.experimental.do_not_convert
    def get_concrete_function(self, *args, **kwargs):
        """The rewritten concrete function for these arguments (traced,
        planned and rewritten on first use)."""
        return self._entry(args, kwargs)[1]

    @tf.autograph.experimental.do_not_convert
    def __call__(self, *args, **kwargs):
        return _tf_function.call(self._function, self._entry(args, kwargs)[1],
                                 args, kwargs)

    def _entry(self, args, kwargs):
        if not tf.executing_eagerly() and _tf_function.in_xla_context(
                tf.compat.v1.get_default_graph()):
            raise UnsupportedFunctionError(_XLA_CALLER_MESSAGE % self._name)
        if tf.distribute.has_strategy():
            # Inside strategy.run each replica would trace and rewrite its
            # own copy of the step, and the strategy's cross-replica calls
            # cannot run in a graph LMS rebuilds apart: the function that
            # calls strategy.run, called outside the scope, holds every
            # replica and is planned instead.
            raise UnsupportedFunctionError(_STRATEGY_MESSAGE % (
                self._name, type(tf.distribute.get_strategy()).__name__))
        try:
            concrete = self._function.get_concrete_function(*args, **kwargs)
        except Exception as e:  # pylint: disable=broad-except
            if not self._wrapped:
                raise
            raise EagerModeError(_TRACE_MESSAGE % (
                self._name, type(e).__name__, e)) from e
        name = _text(concrete.name)
        entry = self._cache.get(name)
        if entry is None or entry[0] is not concrete:
            entry = self._rewrite(concrete)
            self._cache[name] = entry
        return entry

    def _rewrite(self, concrete):
        if _tf_function.is_jit_compiled(concrete=concrete):
            raise UnsupportedFunctionError(_JIT_MESSAGE % self._name)
        start = time.perf_counter()
        graph = concrete.graph
        lms = self.lms
        lms._log.info("Tracing %s: LMS rewrites its concrete function %s "
                      "(%d operations)" % (
                          self._name, _text(concrete.name),
                          len(graph.get_operations())))
        # Under a MultiWorkerMirroredStrategy: this worker's devices, and
        # every worker's rewrite compared before the step first runs.
        found = multi_worker.worker_of(graph, lms.settings.cpu_device)
        worker = found[1] if found else None
        with _gc.paused():
            result = rewrite_graph(lms, graph, start, worker=worker)
            if found:
                multi_worker.check_workers_agree(found[0], worker, graph,
                                                 result)
            # A graph rewritten before (another LMSFunction of the same
            # tf.function) runs as rewritten too.
            rewritten = (concrete if result.outcome is Outcome.NOT_NEEDED
                         else _tf_function.rebuild(concrete, graph))
        lms.last_run = result
        return concrete, rewritten, result


def step_fetches(graph):
    """The `step.StepFetches` of the function graph `graph`: its outputs
    and control outputs."""
    ops = _tf_function.fetch_ops(graph)
    return step.StepFetches(
        ops, "the function's outputs and control outputs (%d ops)"
        % len(ops))


def step_of(graph, variable_devices=False):
    """``(fetches, index)`` of the training step of the function graph
    `graph`: `step_fetches`, and the `GraphIndex` of their fan-in with the
    variables it captures resident (as `LMSFunction` plans each concrete
    function; `tflms plan` and the benchmarks plan a Keras 3 train step
    with it).

    `variable_devices`: the placeholder of a captured variable takes the
    variable's device when it has none of its own, so that a plan for
    one device of several counts on it the variables it holds (each
    replica of a tf.distribute strategy has its own copies)."""
    fetches = step_fetches(graph)
    index = _with_captured_variables(gi.build_index(graph, fetches), graph,
                                     variable_devices)
    # Trained as the step without LMS, bit for bit: LMS leaves alone what
    # Grappler merges (`fusions.grappler_groups`).
    return fetches, dataclasses.replace(index, keep_grappler_groups=True)


def rewrite_graph(lms, graph, start=None, worker=None):
    """Plan and rewrite the function graph `graph` in place with the
    settings of `lms` (the pipeline `LMS.run` uses, on `step_of`'s index);
    `worker`: the `worker_devices.WorkerDevices` of a step under a
    multi-worker strategy (`multi_worker.worker_of`).

    Nothing is rebuilt: the caller makes a function of the rewritten graph
    (`LMSFunction`) or only reads the plan (`tflms plan` on a Keras 3
    model).

    Returns:
      The `tflms.RunResult`.
    """
    if start is None:
        start = time.perf_counter()
    with _gc.paused():
        fetches, index = step_of(graph)
        devices = (analysis.compute_devices(index)
                   if lms.settings.gpu_device is None else ())
        if len(devices) < 2:
            return lms._run(graph, fetches, start, index=index,  # pylint: disable=protected-access
                            worker=worker)
        return _rewrite_per_device(lms, graph, devices, fetches, index,
                                   start, worker)


def _rewrite_per_device(lms, graph, devices, fetches, index, start, worker):
    """Plan and rewrite the step of `graph` one compute device at a time:
    a tf.distribute strategy puts each replica's ops on its own device,
    and each device has its own memory, so each replica is planned for its
    own budget (as an LMS with ``gpu_device`` set to that device would).
    `fetches`, `index`: `step_of(graph)`; `worker`: as for `rewrite_graph`
    (its host takes the swap ops)."""
    by_device = []
    # The index `rewrite_graph` built, with each captured variable on its
    # replica's device: nothing else differs, so it is not built again.
    index = _with_captured_variables(index, graph, variable_devices=True)
    for device in devices:
        replica = type(lms).from_settings(
            lms.settings.replace(gpu_device=device))
        lms._log.info("Planning the replica on %s (%d of %d devices)"  # pylint: disable=protected-access
                      % (device, len(by_device) + 1, len(devices)))
        result = replica._run(graph, fetches, time.perf_counter(),  # pylint: disable=protected-access
                              index=index, worker=worker)
        by_device.append((device, result))
        if result.rewritten:
            # The next replica is planned on the graph as now rewritten.
            fetches, index = step_of(graph, variable_devices=True)
    return RunResult.of_replicas(by_device, time.perf_counter() - start)


def _text(name):
    return name.decode() if isinstance(name, bytes) else name


def _with_captured_variables(index, graph, variable_devices=False):
    """`index` with the bytes of the variables the function graph reads
    through captured handles on their placeholders: resident for the
    whole step, as variable ops are in a Session graph
    (`GraphIndex.variable_bytes`, `trainable_bytes`); with
    `variable_devices`, each unplaced placeholder on its variable's
    device (`step_of`)."""
    variables = _tf_function.captured_variables(graph)
    if not variables:
        return index
    variable_bytes = list(index.variable_bytes)
    trainable_bytes = list(index.trainable_bytes)
    devices = list(index.devices)
    for name, v in variables.items():
        op_id = index.id_of.get(name)
        if op_id is None or not v.shape.is_fully_defined():
            continue
        nbytes = v.shape.num_elements() * v.dtype.base_dtype.size
        variable_bytes[op_id] = nbytes
        if getattr(v, "trainable", False):
            trainable_bytes[op_id] = nbytes
        if variable_devices and not devices[op_id]:
            devices[op_id] = v.device or ""
    return dataclasses.replace(index, variable_bytes=tuple(variable_bytes),
                               trainable_bytes=tuple(trainable_bytes),
                               devices=tuple(devices))


# ---- checking that the swaps ran (docs/tf2.md) ------------------------------
def partition_graph_files(dump_dir):
    """The per-device partition graphs (``.pbtxt`` paths) TensorFlow wrote
    into `dump_dir`, the folder of ``TF_DUMP_GRAPH_PREFIX``: the graphs its
    executors run."""
    return set(glob.glob(os.path.join(dump_dir, "*_partition_*.pbtxt")))


def swap_ops_in_partition_graphs(paths, names=()):
    """``{swap op name: device}`` of LMS's swap ops in the partition graphs
    at `paths`, reading only the last graph TensorFlow dumped per function
    and device (``<name>.<n>.pbtxt``, the highest ``n``); names as
    `swap_ops_in_graph_defs` gives them."""
    # Imported here: only this check reads text protos.
    from google.protobuf import text_format  # pylint: disable=import-outside-toplevel
    last = {}
    for path in paths:
        base = os.path.basename(path)[:-len(".pbtxt")]
        key, seq = base.split(".")[0], int(base.split(".")[1])
        if key not in last or seq > last[key][0]:
            last[key] = (seq, path)
    graph_defs = []
    for _, path in last.values():
        graph_def = tf.compat.v1.GraphDef()
        with open(path, encoding="utf-8") as f:
            text_format.Parse(f.read(), graph_def)
        graph_defs.append(graph_def)
    return swap_ops_in_graph_defs(graph_defs, names)


def swap_ops_in_graph_defs(graph_defs, names=()):
    """``{swap op name: device}`` of LMS's swap ops in `graph_defs`.

    Inlining prefixes the names of a function's ops, and a swap-in's name
    starts with its tensor's op (`rewriter.swapin_op_name`): a swap op is
    known by the part of its name from ``lms/`` on (``.../conv/Relu-lms/
    swapin_conv_Relu_0`` by ``lms/swapin_conv_Relu_0``), which is unique.
    The keys are the names in `names` (such as `RunResult.swapin_ops`)
    that were found, and ``lms/...`` for swap ops not in `names`."""
    given = {"lms/" + n.rpartition("lms/")[2]: n for n in names}
    found = {}
    for graph_def in graph_defs:
        for node in graph_def.node:
            # Swap ops are Identity ops: TensorFlow's own nodes named
            # after them (a NoOp grouping a swap-in's cross-device
            # triggers, sends and receives) are not.
            if node.op != "Identity":
                continue
            _, sep, own = node.name.rpartition("lms/")
            if sep and own.startswith(("swapout_", "swapin_")):
                key = "lms/" + own
                found[given.get(key, key)] = node.device
    return found
