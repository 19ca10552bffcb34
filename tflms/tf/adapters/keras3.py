"""The Keras 3 fit entry point, one device (TensorFlow backend):
`Keras3Fit`. Under a tf.distribute strategy,
`keras3_strategy.Keras3StrategyFit` serves the fit with the changes and checks
defined here.

Keras 3 has no graph mode: `model.fit` runs a train function Keras makes
with `tf.function`, and that function calls ``model.train_step`` while it
is traced. For the fit it is given to, the callback replaces the model's
step by LMS's version of it (`tflms.tf.lms_function.LMSFunction`): Keras then
traces the rewritten step into its train function (with
``steps_per_execution`` > 1, into the loop body there), and every step of
the fit runs with the swaps. At the end of the fit the model gets its own
step back.

What `model.fit(x, y, callbacks=[lms])` does, in order::

    CallbackList(...)      lms.set_model(model): the model is recorded
                           (checked: a TensorFlow backend)
    make_train_function()  Keras makes its train function (not traced yet)
    on_train_begin         the adapter for the model is chosen (this one,
                           or Keras3StrategyFit under a strategy);
                           train_begin(): checks (eager, a supported
                           strategy, not run_eagerly); XLA off for the train
                           function; model.train_step =
                           LMSFunction(model.train_step) (under a strategy:
                           Keras' one_step_on_data wrapped instead, below);
                           model.make_train_function(force=True), guarded
                           so that an error in it undoes all this too
    first train step       Keras traces its train function, which calls the
                           LMSFunction: the step is traced, planned and
                           rewritten (logged), and the rewritten step runs
    on_train_end           train_end(): model.train_step, model.jit_compile and
                           model.train_function as they were (Keras' own
                           train function, made without LMS)

Under a tf.distribute strategy (MirroredStrategy, MultiWorkerMirroredStrategy,
OneDeviceStrategy) Keras calls ``model.train_step`` inside ``strategy.run``,
once per replica, from a tf.function of its own (``one_step_on_data``) whose
graph holds every replica's step and the reductions between them. There the
callback leaves ``train_step`` alone and puts an `LMSFunction` of that
tf.function in its place in the train function Keras made: each replica's
device is planned for its own memory (`tflms.tf.lms_function`).

Keras traces its train function the way every tf.function with
``reduce_retracing=True`` is traced: the first call with the batch's exact
shapes, a later call with another shape with that dimension unknown (a
second fit at another batch size, a last smaller batch). The step's ops
differ between the two (TensorFlow's gradients of a mean divide by a
constant when the shapes are known, by a computed count when not, and
Grappler turns only the first into a product by the reciprocal), so LMS's
step must be traced at the shapes Keras would trace it at. The callback
therefore keeps the train function it had Keras make and runs it again at
the next fit of the same model with the same callback, as long as Keras
itself keeps its own (no ``compile`` or ``make_train_function(force=True)``
since, which make Keras trace from scratch): Keras' own tf.functions then
relax the batch dimension exactly when they would without LMS, and the
`LMSFunction` traces the step at that signature.

XLA (``jit_compile``) ignores device placement, so the swap ops would not
run where LMS puts them: when it is on, `train_begin` turns it off for the
train function with a warning line and `end` turns it back on.

This module reads the model through its attributes only and imports no
Keras: LMS imports and works where Keras 3 is not installed.
"""

import sys

import tensorflow as tf

from tflms.results import EagerModeError
from tflms.tf import compat
from tflms.tf import lms_function
from tflms.tf.adapters.fit_adapter import FitAdapter

__all__ = ["Keras3Fit", "FitChanges", "check_backend", "check_model",
           "strategy_of", "end"]

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
        raise compat.UnsupportedStackError(_BACKEND_MESSAGE % (name,))


def strategy_of(model):
    """The non-default tf.distribute strategy `model` trains under, or
    None."""
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    return strategy


class FitChanges:
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
      keras_function: the train function Keras had for this fit before
        the callback replaced it (made from the model's own step), which
        `end` gives back; None if it was LMS's own, left by a fit that
        ended without ``on_train_end``.
      train_function: the train function Keras made of `step` (unguarded),
        run again by the next fit that `continues` this one.
    """

    def __init__(self, model, step, own_step, jit_compile, strategy=None,
                 keras_function=None, train_function=None):
        self.model = model
        self.step = step
        self.own_step = own_step
        self.jit_compile = jit_compile
        self.strategy = strategy
        self.keras_function = keras_function
        self.train_function = train_function

    def continues(self, model, own_step, keras_function, strategy=None):
        """True if a fit of `model` whose own step is `own_step`, whose
        train function Keras kept or made is `keras_function`, under
        `strategy`, carries on from this one: the same model, step and
        strategy, and Keras' train function not made again since (by
        ``compile`` or ``make_train_function(force=True)``). Keras then
        keeps tracing its own train function where it left off, and the
        callback runs its own train function again, traced so far as
        Keras' would have been."""
        return (self.model is model and self.own_step is own_step
                and self.strategy is strategy
                and self.keras_function is not None
                and self.keras_function is keras_function
                and self.train_function is not None)


def check_model(model):
    """Raise before anything is changed if LMS cannot serve this Keras 3
    fit.

    Raises:
      EagerModeError: eager execution is off, or the model is compiled
        with ``run_eagerly=True``.
      UnsupportedStackError: a backend other than TensorFlow.
    """
    check_backend()
    if not tf.executing_eagerly():
        raise EagerModeError(_GRAPH_MODE_MESSAGE)
    if getattr(model, "run_eagerly", False):
        raise EagerModeError(_RUN_EAGERLY_MESSAGE)


class Keras3Fit(FitAdapter):
    """Keras 3 ``fit(callbacks=[lms])`` on one device: for the fit,
    ``model.train_step`` is replaced by its `LMSFunction` (see the module
    docstring); `train_end` puts the model's own step back."""

    @classmethod
    def accepts(cls, model):
        return compat.is_keras3_model(model) and strategy_of(model) is None

    def __init__(self, rewrites, model):
        super().__init__(rewrites, model)
        self.changes = None  # the FitChanges of the fit under way or the last
        self._active = False

    def set_model(self):
        check_backend()

    def train_begin(self):
        check_model(self.model)
        self.changes = self.attach(self.changes)
        self._active = True

    def train_end(self):
        if self._active:
            self._active = False
            end(self.changes)

    def attach(self, previous):
        """Make the next train function of the model run LMS's rewrite of
        ``model.train_step``: the `FitChanges` that `end` takes.
        `previous`: the changes of an earlier fit, whose step is reused
        when it belongs to the same model."""
        model, rewrites = self.model, self.rewrites
        log = rewrites.log
        current = model.train_step
        if isinstance(current, lms_function.LMSFunction):
            # A fit that ended without on_train_end (an exception) left
            # the step replaced: take the model's own step back first.
            own_step = model.__dict__.get("_tflms_own_train_step")
            _restore_step(model, own_step)
            current = model.train_step
        own_step = model.__dict__.get("train_step")
        keras_function = keras_train_function(model)
        jit_compile = xla_off(model, log)
        if previous is not None and previous.continues(
                model, own_step, keras_function):
            # Keras would go on tracing its train function: so does LMS's.
            step_fn, train_function = previous.step, previous.train_function
            model.train_step = step_fn
        else:
            # The optimizer: with offload_optimizer, its slots move to
            # the host before the step is traced for good.
            step_fn = lms_function.LMSFunction(
                current, rewrites, getattr(model, "optimizer", None))
            model.train_step = step_fn
            model.make_train_function(force=True)
            train_function = model.train_function
        if own_step is not None:
            model.__dict__["_tflms_own_train_step"] = own_step
        model.train_function = guarded(train_function, self.train_end)
        log.info("Keras 3 fit: LMS rewrites the model's training step "
                 "(model.train_step) when Keras traces its train "
                 "function%s; the model gets its own step back after the "
                 "fit" % loop_note(model))
        return FitChanges(model, step_fn, own_step, jit_compile,
                          keras_function=keras_function,
                          train_function=train_function)


def keras_train_function(model):
    """The train function Keras has for this fit (``fit`` makes it, or
    keeps the one it had, before ``on_train_begin``), or None if it is one
    of LMS's, left by a fit that ended without ``on_train_end``."""
    function = getattr(model, "train_function", None)
    if getattr(function, "tflms_guarded", False):
        return None
    return function


def xla_off(model, log):
    """Turn XLA off for the model's next train function (logged); returns
    ``model.jit_compile`` as it was, for `end`."""
    jit_compile = bool(model.jit_compile)
    if jit_compile:
        log.warning(_JIT_MESSAGE)
        model.jit_compile = False
    return jit_compile


def loop_note(model):
    """The log's note on Keras' step loop, or '' for one step a call."""
    spe = getattr(model, "steps_per_execution", 1)
    return " (steps_per_execution=%d: in its loop)" % spe if spe > 1 else ""


def guarded(train_function, on_error):
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
    function.tflms_guarded = True  # LMS's, not Keras' own
    return function


def _restore_step(model, own_step):
    if own_step is not None:
        model.train_step = own_step
    elif "train_step" in model.__dict__:
        del model.train_step
    model.__dict__.pop("_tflms_own_train_step", None)


def end(fit):
    """Undo a fit adapter's changes (`FitChanges`) on ``fit.model``: its
    own train step, its ``jit_compile``, and Keras' own train function
    (traced as far as Keras traced it; None, for the next fit or
    train_on_batch to make one without LMS, if Keras had none of its
    own)."""
    model = fit.model
    if model.__dict__.get("train_step") is fit.step:
        _restore_step(model, fit.own_step)
    if fit.jit_compile:
        model.jit_compile = True
    model.train_function = fit.keras_function
