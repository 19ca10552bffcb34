"""LMS for TensorFlow 2 training steps: `tf.function` code.

A `tf.function` runs one concrete function per input signature, each a
graph (`FuncGraph`) that holds the whole step: the forward pass, the
backward pass the `GradientTape` traced into it, and the optimizer's
updates. `function(step_fn, lms)` returns an `LMSFunction` that, at the
first call with a new signature, traces `step_fn` and has the function
graph rewritten (`tflms.tf.adapters.rewrite.rewrite_function_graph`:
its training step, the outputs and control outputs, i.e. the updates,
with captured variables resident, indexed and planned with the pipeline
`LMS.run` uses, auto-tuning or fixed parameters, and the graph edited by
`rewriter.apply_plan`), and builds a new function from it
(`tflms.tf.function_api`, the one place that uses TensorFlow's internal
function APIs). Later calls with that signature run the rewritten function::

    lms = LMS(swapout_threshold=40, swapin_ahead=3, swapin_groupby=2)
    train_step = lms.function(train_step)   # a Python function or tf.function
    for x, y in data:
        loss = train_step(x, y)             # called exactly like before

Keras 3 ``fit(callbacks=[lms])`` uses it the same way (tflms.tf.adapters.keras3
does ``model.train_step = lms.function(model.train_step)`` for the fit, with
XLA off); Keras' train function calls the step while it is traced, and
TensorFlow inlines the rewritten step there.

Where LMS cannot work it raises before anything is traced or changed:
``tf.function(jit_compile=True)``, or a call while XLA compiles the
caller (XLA ignores device placement, so swap ops would not run where
they are placed), calls under a `tf.distribute` strategy (a `MirroredStrategy`
or `MultiWorkerMirroredStrategy` custom loop works when LMS is given the
`tf.function` that calls ``strategy.run``, called outside the strategy's
scope; on each worker of the latter, tflms.tf.multi_worker names the devices
LMS manages and checks that every worker made the same rewrite), and a
step `tf.function` cannot trace. docs/tf2.md has the details.
"""

import time

import tensorflow as tf

from tflms import _gc
from tflms.errors import LMSError
from tflms.tf import function_api
from tflms.tf import host_slots
from tflms.tf import offload_rewrite
from tflms.tf.adapters.rewrite import Rewrites
from tflms.results import EagerModeError, Outcome

__all__ = ["function", "LMSFunction", "UnsupportedFunctionError"]


class UnsupportedFunctionError(LMSError, ValueError):
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


def function(step_fn, lms, optimizer=None):
    """Large Model Support for a TensorFlow 2 training step.

    Args:
      step_fn: the training step: a `tf.function`, or a Python function
        (wrapped in `tf.function`). It must not be compiled with XLA.
      lms: the `tflms.LMS` whose settings plan the step (``LMS()``
        auto-tunes, which needs `batch_size` only when the step's batch
        dimension is unknown). ``LMS(...).function(step_fn)`` calls this.
      optimizer: the Keras 3 optimizer whose updates the step makes, for
        ``offload_optimizer``: LMS moves its slots to the host before the
        step is traced for good (`tflms.tf.host_slots`). Not needed
        otherwise.

    Returns:
      An `LMSFunction`, called with the arguments `step_fn` takes.

    Raises:
      UnsupportedFunctionError: `lms` is not an LMS, `step_fn` is not
        callable, or a
        `tf.function` made with ``jit_compile=True``.
    """
    rewrites = getattr(lms, "rewrites", None)
    if not isinstance(rewrites, Rewrites):
        raise UnsupportedFunctionError(
            "lms must be a tflms.LMS; got %r. Use LMS(...).function("
            "step_fn)" % (lms,))
    return LMSFunction(step_fn, rewrites, optimizer)


def _name_of(fn):
    return getattr(fn, "__name__", None) or type(fn).__name__


class LMSFunction:
    """A training step whose concrete functions LMS has rewritten.

    Call it like the step it wraps. Each input signature is traced,
    planned and rewritten once, at its first call, through `rewrites`
    (a `tflms.tf.adapters.rewrite.Rewrites`: an LMS object's, ``lms.
    rewrites``); `results` maps each traced concrete function's name to
    the `tflms.RunResult` of its rewrite (the latest is also
    `rewrites.last_run`, `lms.last_run`).

    With ``offload_optimizer``, a step whose Keras 3 optimizer slots live
    on the device has them moved to the host (`optimizer`'s, through
    `tflms.tf.host_slots`) and is traced again before it is planned.
    """

    def __init__(self, step_fn, rewrites, optimizer=None):
        if not isinstance(rewrites, Rewrites):
            raise UnsupportedFunctionError(
                "rewrites must be a tflms.tf.adapters.rewrite.Rewrites (an "
                "LMS object's lms.rewrites); got %r. Use LMS(...).function("
                "step_fn)" % (rewrites,))
        if not callable(step_fn):
            raise UnsupportedFunctionError(
                "step_fn must be a training step: a Python function or a "
                "tf.function; got %r" % (step_fn,))
        self._name = _name_of(step_fn)
        if isinstance(step_fn, tf.types.experimental.GenericFunction):
            if function_api.is_jit_compiled(step_fn):
                raise UnsupportedFunctionError(_JIT_MESSAGE % self._name)
            self._function = step_fn
            self._wrapped = False
        else:
            self._function = tf.function(step_fn)
            self._wrapped = True
        self.rewrites = rewrites
        self.step_fn = step_fn
        self.optimizer = optimizer
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
        return function_api.call(self._function, self._entry(args, kwargs)[1],
                                 args, kwargs)

    def _entry(self, args, kwargs):
        if not tf.executing_eagerly() and function_api.in_xla_context(
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
        concrete = self._trace(args, kwargs)
        name = _text(concrete.name)
        entry = self._cache.get(name)
        if entry is None or entry[0] is not concrete:
            try:
                entry = self._rewrite(concrete)
            except offload_rewrite.SlotsOnDeviceError as e:
                concrete = self._with_slots_on_host(e, args, kwargs)
                name = _text(concrete.name)
                entry = self._rewrite(concrete)
            self._cache[name] = entry
        return entry

    def _trace(self, args, kwargs):
        try:
            return self._function.get_concrete_function(*args, **kwargs)
        except Exception as e:
            if not self._wrapped:
                raise
            raise EagerModeError(_TRACE_MESSAGE % (
                self._name, type(e).__name__, e)) from e

    def _with_slots_on_host(self, error, args, kwargs):
        """The step traced again once the slots `error` names are on the
        host (the optimizer's variables given new host variables)."""
        if self.optimizer is None:
            raise error
        keras_variables = host_slots.keras_variables_of(self.optimizer,
                                                        error.variables)
        host = self.rewrites.settings.cpu_device
        moved = host_slots.move_to_host(keras_variables, host)
        self.rewrites.log.info(
            "offload_optimizer: %d slots of %s moved to %s (their values "
            "kept); tracing %s again so that it updates them there"
            % (len(moved), type(self.optimizer).__name__, host, self._name))
        self._function = function_api.retraced(self._function)
        self._cache.clear()
        return self._trace(args, kwargs)

    def _rewrite(self, concrete):
        if function_api.is_jit_compiled(concrete=concrete):
            raise UnsupportedFunctionError(_JIT_MESSAGE % self._name)
        start = time.perf_counter()
        graph = concrete.graph
        self.rewrites.log.info(
            "Tracing %s: LMS rewrites its concrete function %s "
            "(%d operations)" % (self._name, _text(concrete.name),
                                 len(graph.get_operations())))
        with _gc.paused():
            # The adapter of this graph's entry point (a step on one
            # worker of a multi-worker strategy, or any function graph).
            result = self.rewrites.function_graph(graph, start)
            # A graph rewritten before (another LMSFunction of the same
            # tf.function) runs as rewritten too.
            rewritten = (concrete if result.outcome is Outcome.NOT_NEEDED
                         else function_api.rebuild(concrete, graph))
        return concrete, rewritten, result


def _text(name):
    return name.decode() if isinstance(name, bytes) else name
