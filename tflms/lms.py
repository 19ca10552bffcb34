"""The public `LMS` object: the settings, and `run()` / `function()`,
which hand the work down to the two functions below it
(`tflms.tf.adapters.rewrite`: one rewrites a Session graph, one a function
graph), through the object's `Rewrites` (the settings as they are now and
the one record of what it rewrote).

The same object is a `SessionRunHook` and a Keras callback, because users
pass it as one; each of those methods is a line or two that hands the call
down: `begin()` rewrites the default graph with `run()` (the Session
adapter); the Keras methods go to the fit adapter that accepts the model
(Keras 2 in graph mode, Keras 3 on one device or under a strategy), which
finds the step and has it rewritten through the same `Rewrites`.
"""

import tensorflow as tf

from tflms import settings as S
from tflms.results import EagerModeError, Outcome, RunResult
from tflms.tf import adapters
from tflms.tf import compat
from tflms.tf import lms_function
from tflms.tf.adapters import rewrite
from tflms.tf.adapters import session

__all__ = ["LMS", "RunResult", "Outcome", "EagerModeError",
           "UnsupportedStackError"]

UnsupportedStackError = compat.UnsupportedStackError


def _setting_property(field):
    """The `LMS` attribute of one setting: read from `LMS.settings`;
    settable (checked) when the setting is a property rather than a
    constructor argument."""
    name = field.name

    def getter(self):
        return getattr(self._settings, name)

    def setter(self, value):
        self._settings = self._settings.replace(**{name: value})

    def constructor_only(self, value):
        raise AttributeError(
            "%s is set once, in the constructor: LMS(%s=%r). Make a new LMS "
            "object to change it." % (name, name, value))

    writable = field.metadata["kind"] == S.PROPERTY
    return property(getter, setter if writable else constructor_only,
                    doc=field.metadata["doc"])


class LMS(compat.CallbackBase, tf.compat.v1.train.SessionRunHook):
    """Large Model Support: swap tensors between device and host memory.

    LMS edits a graph so that tensors made in the forward phase and read
    much later in the backward phase go to host memory in between: a
    swap-out `Identity` on `cpu_device` copies the tensor out after it is
    made, and a swap-in `Identity` on `cpu_device` brings it back for its
    late consumers, started by a control dependency from an op shortly
    before them. Levels are those of the categorized topological sort.

    Use it in one of three ways (graph mode only):

    * Session: ``LMS(...).run(tf.compat.v1.get_default_graph())`` after
      building the training graph and before creating the session.
    * Estimator: ``estimator.train(input_fn, hooks=[lms])``.
    * Keras: ``model.fit(..., callbacks=[lms])``. Keras 2 (``tf.keras`` on
      TensorFlow 2.15; the tf-keras package on 2.16+, as ``tf.keras`` with
      ``TF_USE_LEGACY_KERAS=1`` or as ``import tf_keras``) in graph mode:
      the callback rewrites the train function's graph. Keras 3 on the
      TensorFlow backend (eager mode): for the fit, the model's
      ``train_step`` is replaced by ``lms.function(model.train_step)``
      (docs/tf2.md, "Keras 3 fit").
    * TensorFlow 2 steps: ``lms.function(step_fn)`` (docs/tf2.md).

    Args:
      swapout_threshold: a consumer more than this many levels after the
        producer of a tensor reads it through swap ops. -1: auto-tune.
      swapin_groupby: consumers of a tensor whose levels are within this
        distance of each other share one swap-in. -1: auto-tune.
      swapin_ahead: a swap-in is started by an op more than this many levels
        before its first consumer, so it completes at least this many levels
        ahead. -1: auto-tune.
      sync_mode: 0 asynchronous transfers; 1 device ops wait for swap-outs;
        2 swap-ins wait for their consumer's other inputs (swapin_ahead and
        swapin_groupby are then ignored); 3 both.
      recompute: None (default): when auto-tuning, make swapped tensors
        again just before their far readers (cloning the ops that made
        them, convolutions included) instead of swapping them, where the
        plan still fits and the predicted step is shorter; with fixed
        parameters nothing is recomputed. True: also with fixed
        parameters (cheap stateless ops, where the simulated peak allows).
        False: swaps only (see docs/parameters.md).
      serialization: levels whose ops are chained by control dependencies so
        they run one at a time: ints and Python slice strings, e.g.
        ``[1, '3:5']`` is levels 1, 3 and 4.
      serialization_by_size: also serialize every level whose device ops'
        outputs exceed this many GiB; 0 turns it off.
      debug: log per-op details (levels 1 and 2).
      debug_level: 1 or 2.
      cpu_device: where swap ops run: the host. Every other device the
        step computes on is managed, a logical ``/cpu:1`` included.
      gpu_device: only ops placed on this device are swapped; None means
        every op not on the host (`cpu_device`). Multi-tower models run
        one LMS per device.
      offload_optimizer: True: the optimizer's slots live on
        `cpu_device` and each variable's update runs there, the new
        weights written back to the device (Session graphs with
        ``tf.compat.v1.train`` optimizers; docs/offload.md). 'auto':
        only when no plan fits without it. False: on the device.
    """

    def __init__(self,
                 swapout_threshold=-1,
                 swapin_groupby=-1,
                 swapin_ahead=-1,
                 sync_mode=0,
                 recompute=None,
                 serialization=(),
                 serialization_by_size=0,
                 debug=False,
                 debug_level=1,
                 cpu_device="/cpu:0",
                 gpu_device=None,
                 offload_optimizer=False):
        compat.CallbackBase.__init__(self)
        self._settings = S.Settings(
            swapout_threshold=swapout_threshold,
            swapin_groupby=swapin_groupby, swapin_ahead=swapin_ahead,
            sync_mode=sync_mode, recompute=recompute,
            serialization=serialization,
            serialization_by_size=serialization_by_size, debug=debug,
            debug_level=debug_level, cpu_device=cpu_device,
            gpu_device=gpu_device, offload_optimizer=offload_optimizer)
        self._model = None
        # What this object rewrote, read with its settings as they are at
        # each rewrite; the hook, the callback and lms.function rewrite
        # through it.
        self.rewrites = rewrite.Rewrites(lambda: self._settings)
        self._step_guard = None  # set by begin() (SessionRunHook)
        # The fit adapter of the model Keras gave the callback (it keeps
        # what an earlier fit of the same model planned).
        self._fit = None

    @classmethod
    def from_settings(cls, settings):
        """An `LMS` with every value of `settings` (a
        `tflms.settings.Settings`)."""
        if not isinstance(settings, S.Settings):
            raise ValueError("settings must be a tflms.settings.Settings; "
                             "got %r" % (settings,))
        lms = cls()
        lms._settings = settings
        return lms

    @property
    def settings(self):
        """Every setting, as one frozen `tflms.settings.Settings`."""
        return self._settings

    @property
    def last_run(self):
        """The `RunResult` of the latest rewrite (`run()`, the hook, the
        callback or a step of `function`): the hook and the callback call
        run() themselves, so this is where their users find it."""
        return self.rewrites.last_run

    @last_run.setter
    def last_run(self, result):
        self.rewrites.last_run = result

    # ---- the work -----------------------------------------------------
    def run(self, graph=None, keras=False, fetches=None):
        """Rewrite `graph` in place for Large Model Support.

        LMS reads, plans and edits the training step only: the ops that a
        `Session.run` of the step's `fetches` executes (their fan-in).
        After the rewrite that step runs the same ops plus LMS's swap ops
        (and recompute clones); ops outside it, such as evaluation heads,
        summaries or the symbolic model Keras builds on its own `Input`,
        are left alone. See docs/usage.md, "The training step".

        Args:
          graph: the training `tf.Graph`; the default graph when None.
          keras: True when the graph was built by Keras 2 in graph mode,
            as TFLMSv2's ``run(graph, keras=True)`` is called: after a
            rewrite, a Keras session that already ran the graph is
            replaced by one that sees the edits, with the variables'
            values (as the Keras callback does). The plan is the same
            either way: LMS leaves out the ops of the learning phase it
            does not run (the inactive branch of each
            ``keras_learning_phase`` switch, by `is_training`) in every
            graph.
          fetches: what one training step runs, as given to `Session.run`
            (the train op, or a list of ops, tensors or names). None: the
            graph's ``train_op`` collection, else its optimizer updates,
            else the whole graph; the log says which.

        Returns:
          A `RunResult` whose `outcome` says what happened: REWRITTEN,
          NOT_NEEDED (auto-tuning found that the step fits as it is) or
          ALREADY_REWRITTEN; it holds the plan, the tuning and the ops
          added. Also kept in `last_run`.

        Raises:
          EagerModeError: when called in eager mode without a graph, or on
            the graph of a tf.function.
          ValueError: for bad settings or fetches, or a graph that cannot
            be edited; the graph is then unchanged.
        """
        if not isinstance(keras, bool):
            raise ValueError(
                "keras must be True (a Keras 2 graph, as TFLMSv2's "
                "run(keras=True)) or False; got %r. Pass the step's "
                "fetches as fetches=..." % (keras,))
        return self.rewrites.session_graph(graph, fetches, renew_keras=keras)

    def function(self, step_fn, optimizer=None):
        """LMS for a TensorFlow 2 training step: `step_fn` (a Python
        function or a `tf.function`) traced per input signature, each
        concrete function's graph rewritten like `run()` rewrites a
        graph. Returns a callable used like `step_fn`; see
        `tflms.tf.lms_function.function` and docs/tf2.md. `optimizer`:
        the step's Keras 3 optimizer, with ``offload_optimizer``
        (docs/offload.md)."""
        return lms_function.function(step_fn, lms=self, optimizer=optimizer)

    # ---- SessionRunHook (tflms.tf.adapters.session) -------------------
    def begin(self):
        """Rewrite the default graph before the session is created."""
        graph = tf.compat.v1.get_default_graph()
        self.run(graph)
        self._step_guard = session.StepGuard.for_graph(graph)

    def before_run(self, run_context):
        """Read the global step with every training step (`StepGuard`)."""
        if self._step_guard is None:
            return None
        return tf.compat.v1.train.SessionRunArgs(self._step_guard.global_step)

    def after_run(self, run_context, run_values):
        if self._step_guard is not None:
            self._step_guard.check(run_values.results)

    # ---- Keras callback (tflms.tf.adapters.keras2, keras3...) ---------
    def set_params(self, params):
        """Keras passes the fit parameters; the batch size is taken from
        them unless `batch_size` was set."""
        self.params = params
        if (self._settings.batch_size is None and params
                and params.get("batch_size")):
            self.batch_size = params["batch_size"]
        if self._fit is not None:
            self._fit.set_params(params)

    def set_model(self, model):
        """Keras passes the model; the fit adapter that serves it acts
        (Keras 2: the graph is rewritten once the batch size is known;
        Keras 3: at `on_train_begin`)."""
        self.model = model
        self._fit = self._fit_adapter(model)
        self._fit.set_model()

    def on_train_begin(self, logs=None):
        """Keras 3: from now until `on_train_end`, the model's train
        function runs LMS's rewrite of its training step."""
        if self._fit is not None:
            # A strategy is known once the fit runs: the adapter is chosen
            # again for it.
            self._fit = self._fit_adapter(self._fit.model)
            self._fit.train_begin()

    def on_train_end(self, logs=None):
        """Keras 3: the model gets its own training step back (and its
        ``jit_compile``); a later fit without LMS trains without it."""
        if self._fit is not None:
            self._fit.train_end()

    def _fit_adapter(self, model):
        """The fit adapter of `model`: the one this object already has when
        it serves the same model the same way (it keeps what an earlier
        fit planned), else a new one."""
        made = adapters.fit_adapter(self.rewrites, model)
        old = self._fit
        if (old is not None and old.model is model
                and type(old) is type(made)):
            return old
        return made


for _field in S.fields():
    setattr(LMS, _field.name, _setting_property(_field))
del _field
