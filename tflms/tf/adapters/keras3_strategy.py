"""The Keras 3 fit entry point under a tf.distribute strategy:
`Keras3StrategyFit`.

Keras 3 runs ``model.train_step`` inside ``strategy.run``, once per
replica, in a tf.function of its own (``one_step_on_data``) that the train
function calls once per step. That function's graph holds every replica's
step, each on its replica's device, and the strategy's reductions between
them: LMS rewrites that graph (`tflms.tf.adapters.tf_function` plans each
replica's device for its own budget). The model's ``train_step`` is left
as it is; the rest of the fit (XLA off, the guard, the end) is as on one
device (`tflms.tf.adapters.keras3`).
"""

import sys

import tensorflow as tf

from tflms.tf import compat
from tflms.tf import lms_function
from tflms.tf.adapters import keras3

__all__ = ["Keras3StrategyFit"]

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


# The strategies whose Keras 3 train function runs every replica's step in
# one graph, on devices of this process (or of this worker).
_STRATEGIES = (tf.distribute.MirroredStrategy,
               tf.distribute.MultiWorkerMirroredStrategy,
               tf.distribute.OneDeviceStrategy)


class Keras3StrategyFit(keras3.Keras3Fit):
    """Keras 3 ``fit(callbacks=[lms])`` under MirroredStrategy,
    MultiWorkerMirroredStrategy or OneDeviceStrategy (see the module
    docstring)."""

    @classmethod
    def accepts(cls, model):
        return (compat.is_keras3_model(model)
                and keras3.strategy_of(model) is not None)

    def attach(self, previous):
        """Put an `LMSFunction` of Keras' function of one step on every
        replica in its place in the train function Keras made; the
        `FitChanges` that `keras3.end` takes.

        Raises (before anything is changed):
          UnsupportedFunctionError: another strategy, or Keras built its
            train function in a way this module does not know.
        """
        model, rewrites = self.model, self.rewrites
        strategy = keras3.strategy_of(model)
        name = type(strategy).__name__
        if not isinstance(strategy, _STRATEGIES):
            raise lms_function.UnsupportedFunctionError(
                _STRATEGY_MESSAGE % name)
        log = rewrites.log
        own_step = model.__dict__.get("train_step")
        keras_function = keras3.keras_train_function(model)
        jit_compile = keras3.xla_off(model, log)
        if previous is not None and previous.continues(
                model, own_step, keras_function, strategy):
            # Keras would go on tracing its train function: so does LMS's
            # (keras3's module docstring).
            step_fn, train_function = previous.step, previous.train_function
        else:
            model.make_train_function(force=True)
            train_function = model.train_function
            cell = _one_step_cell(train_function)
            if cell is None:
                model.train_function = keras_function
                if jit_compile:
                    model.jit_compile = True
                raise lms_function.UnsupportedFunctionError(
                    _KERAS_FUNCTION_MESSAGE % (name, _keras_version()))
            step_fn = lms_function.LMSFunction(cell.cell_contents,
                                                 rewrites)
            cell.cell_contents = step_fn
        model.train_function = keras3.guarded(train_function, self.train_end)
        log.info("Keras 3 fit under %s (%d replicas): LMS rewrites the "
                 "function Keras runs each step on every replica "
                 "(one_step_on_data, which calls strategy.run), each "
                 "replica's device planned for its own memory, when Keras "
                 "traces its train function%s"
                 % (name, strategy.num_replicas_in_sync,
                    keras3.loop_note(model)))
        return keras3.FitChanges(model, step_fn, own_step, jit_compile,
                                 strategy, keras_function=keras_function,
                                 train_function=train_function)


def _keras_version():
    keras = sys.modules.get("keras")
    return getattr(keras, "__version__", "(unknown version)")


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
                                lms_function.LMSFunction)):
            return cell
        cell = _closure(content).get("step_func")
    return None
