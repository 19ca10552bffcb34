"""The LMS Keras callback for Keras 3 models (TensorFlow backend).

Keras 3 has no graph mode: `model.fit` runs a train function Keras makes
with `tf.function`, and that function calls ``model.train_step`` while it
is traced. For the fit it is given to, the callback replaces the model's
step by LMS's version of it (`tflms.function.LMSFunction`): Keras then
traces the rewritten step into its train function (with
``steps_per_execution`` > 1, into the loop body there), and every step of
the fit runs with the swaps. At the end of the fit the model gets its own
step back.

What `model.fit(x, y, callbacks=[lms])` does, in order::

    CallbackList(...)      lms.set_model(model): the model is recorded
                           (checked: a TensorFlow backend)
    make_train_function()  Keras makes its train function (not traced yet)
    on_train_begin         begin(): checks (eager, a supported strategy or
                           none, not run_eagerly); XLA off for the train
                           function; model.train_step =
                           LMSFunction(model.train_step) (under a strategy:
                           Keras' one_step_on_data wrapped instead, below);
                           model.make_train_function(force=True), guarded
                           so that an error in it undoes all this too
    first train step       Keras traces its train function, which calls the
                           LMSFunction: the step is traced, planned and
                           rewritten (logged), and the rewritten step runs
    on_train_end           end(): model.train_step, model.jit_compile as
                           they were; the train function is made again
                           (without LMS) by the next fit

Under a tf.distribute strategy (MirroredStrategy, MultiWorkerMirroredStrategy,
OneDeviceStrategy) Keras calls ``model.train_step`` inside ``strategy.run``,
once per replica, from a tf.function of its own (``one_step_on_data``) whose
graph holds every replica's step and the reductions between them. There the
callback leaves ``train_step`` alone and puts an `LMSFunction` of that
tf.function in its place in the train function Keras made: each replica's
device is planned for its own memory (`tflms.function`).

XLA (``jit_compile``) ignores device placement, so the swap ops would not
run where LMS puts them: when it is on, `begin` turns it off for the
train function with a warning line and `end` turns it back on.

This module reads the model through its attributes only and imports no
Keras: LMS imports and works where Keras 3 is not installed.
"""

import sys

import tensorflow as tf

from tflms import _compat
from tflms import function as function_mod
from tflms.results import EagerModeError

__all__ = ["check_backend", "begin", "end", "Keras3Fit"]

_BACKEND_MESSAGE = (
    "LMS was given a Keras 3 model of the %r backend. LMS rewrites "
    "TensorFlow graphs, so it needs the TensorFlow backend: set the "
    "environment variable KERAS_BACKEND=tensorflow before Python starts "
    "(or \"backend\": \"tensorflow\" in ~/.keras/keras.json).")
_GRAPH_MODE_MESSAGE = (
    "LMS was given a Keras 3 model while eager execution is off "
    "(tf.compat.v1.disable_eager_execution()). Keras 3 trains with "
    "tf.function in eager mode, and that is how LMS serves it: remove the "
    "disable_eager_execution() call. (Graph mode is for Keras 2: tf_keras, "
    "docs/usage.md.)")
_RUN_EAGERLY_MESSAGE = (
    "The model is compiled with run_eagerly=True: Keras 3 then runs "
    "model.train_step eagerly, without a graph for LMS to rewrite. Compile "
    "it with run_eagerly=False (the default) to train with LMS.")
_STRATEGY_MESSAGE = (
    "The model trains under %s: LMS plans Keras 3 fit under "
    "MirroredStrategy, MultiWorkerMirroredStrategy and OneDeviceStrategy, "
    "whose train function runs every replica's step in one graph. Train "
    "under one of those, or without a strategy (docs/distributed.md).")
_KERAS_FUNCTION_MESSAGE = (
    "The model trains under %s, and LMS did not find the function of one "
    "step on every replica (the tf.function that calls strategy.run) in "
    "the train function Keras %s made: LMS knows how Keras 3.0 to 3.15 "
    "build it. Train without the strategy, or write the loop yourself "
    "(a tf.function that calls strategy.run, given to lms.function; "
    "docs/distributed.md).")
_JIT_MESSAGE = (
    "The model's train function would be compiled with XLA "
    "(model.jit_compile is True: model.compile(jit_compile=True), or "
    "'auto' on a GPU). XLA ignores the host placement of LMS's swap "
    "operations, so nothing would be swapped: LMS turns XLA off for the "
    "train function of this fit (model.jit_compile = False; it is True "
    "again after the fit).")


def backend_name():
    """The Keras 3 backend in use, or None if Keras 3 is not loaded."""
    keras = sys.modules.get("keras")
    backend = getattr(keras, "backend", None)
    name = getattr(backend, "backend", None)
    return name() if callable(name) else None


def check_backend():
    """Raise `UnsupportedStackError` unless Keras 3 runs on TensorFlow."""
    name = backend_name()
    if name != "tensorflow":
        raise _compat.UnsupportedStackError(_BACKEND_MESSAGE % (name,))


def _strategy_of(model):
    """The non-default tf.distribute strategy `model` trains under, or
    None."""
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    return strategy


class Keras3Fit:
    """What the callback changed on a Keras 3 model for one fit, so that
    `end` can put it back.

    Attributes:
      model: the model.
      step: the `LMSFunction` that replaced ``model.train_step`` (kept by
        the callback and reused by its later fits of the same model, so the
        step is planned once per input signature).
      own_step: ``model.train_step`` as the instance had it before (a
        step assigned to the instance), or None when it was the class's.
      jit_compile: ``model.jit_compile`` before the fit.
      strategy: the tf.distribute strategy the model trains under, or
        None. With one, `step` wraps Keras' function of one step on every
        replica and ``model.train_step`` is not replaced.
    """

    def __init__(self, model, step, own_step, jit_compile, strategy=None):
        self.model = model
        self.step = step
        self.own_step = own_step
        self.jit_compile = jit_compile
        self.strategy = strategy


def begin(lms, model, previous=None, on_error=None):
    """Make the next train function of `model` run LMS's rewrite of
    ``model.train_step``; returns the `Keras3Fit` that `end` takes.

    `previous`: the `Keras3Fit` of an earlier fit of the same LMS, whose
    step is reused when it belongs to `model`. `on_error`: called when
    the train function raises (fit then ends without on_train_end), before
    the error goes on, so that the model gets its own step back then too.

    Raises (before anything is changed):
      EagerModeError: eager execution is off, or the model is compiled
        with ``run_eagerly=True``.
      UnsupportedFunctionError: the model trains under a tf.distribute
        strategy other than MirroredStrategy, MultiWorkerMirroredStrategy
        or OneDeviceStrategy, or Keras built its train function in a way
        this module does not know.
      UnsupportedStackError: a backend other than TensorFlow.
    """
    check_backend()
    if not tf.executing_eagerly():
        raise EagerModeError(_GRAPH_MODE_MESSAGE)
    if getattr(model, "run_eagerly", False):
        raise EagerModeError(_RUN_EAGERLY_MESSAGE)
    strategy = _strategy_of(model)
    if strategy is not None and not isinstance(strategy, _STRATEGIES):
        raise function_mod.UnsupportedFunctionError(
            _STRATEGY_MESSAGE % type(strategy).__name__)
    log = lms._log  # pylint: disable=protected-access
    if strategy is not None:
        return _begin_distributed(lms, model, strategy, previous, on_error)
    current = model.train_step
    if isinstance(current, function_mod.LMSFunction):
        # A fit that ended without on_train_end (an exception) left the
        # step replaced: take the model's own step back first.
        own_step = model.__dict__.get("_tflms_own_train_step")
        _restore_step(model, own_step)
        current = model.train_step
    own_step = model.__dict__.get("train_step")
    if (previous is not None and previous.model is model
            and previous.own_step is own_step):
        step_fn = previous.step
    else:
        step_fn = function_mod.LMSFunction(current, lms)
    jit_compile = _xla_off(model, log)
    model.train_step = step_fn
    if own_step is not None:
        model.__dict__["_tflms_own_train_step"] = own_step
    model.make_train_function(force=True)
    if on_error is not None:
        model.train_function = _guarded(model.train_function, on_error)
    log.info("Keras 3 fit: LMS rewrites the model's training step "
             "(model.train_step) when Keras traces its train function%s; "
             "the model gets its own step back after the fit"
             % _loop_note(model))
    return Keras3Fit(model, step_fn, own_step, jit_compile)


def _begin_distributed(lms, model, strategy, previous, on_error):
    """`begin` for a model that trains under a tf.distribute strategy.

    Keras 3 runs ``model.train_step`` inside ``strategy.run``, once per
    replica, in a tf.function of its own (``one_step_on_data``) that the
    train function calls once per step. That function's graph holds every
    replica's step, each on its replica's device, and the strategy's
    reductions between them: LMS rewrites that graph, planning each
    replica's device for its own budget (`tflms.function`). The model's
    ``train_step`` is left as it is."""
    log = lms._log  # pylint: disable=protected-access
    name = type(strategy).__name__
    own_step = model.__dict__.get("train_step")
    jit_compile = _xla_off(model, log)
    model.make_train_function(force=True)
    cell = _one_step_cell(model.train_function)
    if cell is None:
        model.train_function = None
        if jit_compile:
            model.jit_compile = True
        raise function_mod.UnsupportedFunctionError(
            _KERAS_FUNCTION_MESSAGE % (name, _keras_version()))
    if (previous is not None and previous.model is model
            and previous.strategy is strategy
            and previous.own_step is own_step):
        # The same model, strategy and step: the function planned for an
        # earlier fit runs again (Keras' new one would trace the same).
        step_fn = previous.step
    else:
        step_fn = function_mod.LMSFunction(cell.cell_contents, lms)
    cell.cell_contents = step_fn
    if on_error is not None:
        model.train_function = _guarded(model.train_function, on_error)
    log.info("Keras 3 fit under %s (%d replicas): LMS rewrites the function "
             "Keras runs each step on every replica (one_step_on_data, "
             "which calls strategy.run), each replica's device planned for "
             "its own memory, when Keras traces its train function%s"
             % (name, strategy.num_replicas_in_sync, _loop_note(model)))
    return Keras3Fit(model, step_fn, own_step, jit_compile, strategy)


def _xla_off(model, log):
    """Turn XLA off for the model's next train function (logged); returns
    ``model.jit_compile`` as it was, for `end`."""
    jit_compile = bool(model.jit_compile)
    if jit_compile:
        log.warning(_JIT_MESSAGE)
        model.jit_compile = False
    return jit_compile


def _loop_note(model):
    """The log's note on Keras' step loop, or '' for one step a call."""
    spe = getattr(model, "steps_per_execution", 1)
    return " (steps_per_execution=%d: in its loop)" % spe if spe > 1 else ""


def _closure(fn):
    """``{free variable name: cell}`` of a Python function."""
    code = getattr(fn, "__code__", None)
    if code is None or not fn.__closure__:
        return {}
    return dict(zip(code.co_freevars, fn.__closure__))


def _one_step_cell(train_function):
    """The closure cell that holds the tf.function Keras 3 made of one
    step on every replica, or None when the train function is not built
    as this module knows.

    Keras' train function (``function(iterator)``) and its tf.function
    ``multi_step_on_iterator`` both call ``one_step_on_data``: the
    tf.function that calls ``strategy.run(model.train_step)``, which Keras
    may wrap in a plain function (``_autoconvert_optionals``, its
    tf.function in the wrapper's cell ``step_func``). Replacing the
    tf.function in its cell makes every caller run LMS's rewrite."""
    cell = _closure(train_function).get("one_step_on_data")
    for _ in range(3):
        if cell is None:
            return None
        content = cell.cell_contents
        if isinstance(content, (tf.types.experimental.GenericFunction,
                                function_mod.LMSFunction)):
            return cell
        cell = _closure(content).get("step_func")
    return None


def _keras_version():
    keras = sys.modules.get("keras")
    return getattr(keras, "__version__", "(unknown version)")


def _guarded(train_function, on_error):
    """`train_function`, calling `on_error` before an error other than the
    end of the data (StopIteration) goes on."""

    def function(iterator):
        try:
            return train_function(iterator)
        except StopIteration:
            raise
        except BaseException:
            on_error()
            raise
    return function


def _restore_step(model, own_step):
    if own_step is not None:
        model.train_step = own_step
    elif "train_step" in model.__dict__:
        del model.train_step
    model.__dict__.pop("_tflms_own_train_step", None)


# The strategies whose Keras 3 train function runs every replica's step in
# one graph, on devices of this process (or of this worker).
_STRATEGIES = (tf.distribute.MirroredStrategy,
               tf.distribute.MultiWorkerMirroredStrategy,
               tf.distribute.OneDeviceStrategy)


def end(fit):
    """Undo `begin` on ``fit.model``: its own train step, its
    ``jit_compile``, and no train function (the next fit or
    train_on_batch makes one without LMS)."""
    model = fit.model
    if model.__dict__.get("train_step") is fit.step:
        _restore_step(model, fit.own_step)
    if fit.jit_compile:
        model.jit_compile = True
    model.train_function = None
