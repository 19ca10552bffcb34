"""The public `LMS` object: configuration, `run()`, and thin adapters that
make it a `SessionRunHook` and a Keras callback.

`run()` is the only entry point that does work; `begin()` (Estimator) and
`set_model()` / `set_params()` (Keras 2) only find the graph and call it;
for a Keras 3 model, `on_train_begin()` / `on_train_end()` hand the
model's training step to `function()` for the fit (tflms.keras3).
"""

import time

import tensorflow as tf

from tflms import _compat
from tflms import _gc
from tflms import _keras
from tflms import analysis
from tflms import autotune
from tflms import distributed
from tflms import function as function_mod
from tflms import graph_index as gi
from tflms import keras3
from tflms import pipeline
from tflms import plots
from tflms import rewriter
from tflms import run_log
from tflms import settings as S
from tflms import step
from tflms._logging import Logger
from tflms.results import EagerModeError, Outcome, RunResult

__all__ = ["LMS", "RunResult", "Outcome", "EagerModeError",
           "UnsupportedStackError"]

UnsupportedStackError = _compat.UnsupportedStackError

_GIB = float(1 << 30)


_EAGER_MESSAGE = (
    "LMS rewrites TensorFlow graphs and cannot work in eager mode. Call "
    "tf.compat.v1.disable_eager_execution() at the start of your program, "
    "before building the model, then use LMS as a Keras callback, an "
    "Estimator hook, or with lms.run(graph) before creating the Session.")
_FUNCTION_MESSAGE = (
    "LMS cannot edit the graph of a tf.function (FuncGraph %r): TensorFlow "
    "builds and runs such functions itself, and edits to their graphs are "
    "ignored or break them. Call tf.compat.v1.disable_eager_execution() at "
    "the start of your program, before building the model, and use LMS as a "
    "Keras callback, an Estimator hook, or with lms.run(graph) before "
    "creating the Session. To keep the tf.function, pass the training step "
    "itself to lms.function(step_fn) instead (docs/tf2.md).")


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


class LMS(_compat.CallbackBase, tf.compat.v1.train.SessionRunHook):
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
      cpu_device: where swap ops run.
      gpu_device: only ops placed on this device are swapped; None means
        every op not on a CPU. Multi-tower models run one LMS per device.
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
                 gpu_device=None):
        _compat.CallbackBase.__init__(self)
        self._settings = S.Settings(
            swapout_threshold=swapout_threshold,
            swapin_groupby=swapin_groupby, swapin_ahead=swapin_ahead,
            sync_mode=sync_mode, recompute=recompute,
            serialization=serialization,
            serialization_by_size=serialization_by_size, debug=debug,
            debug_level=debug_level, cpu_device=cpu_device,
            gpu_device=gpu_device)
        self._model = None
        # The `RunResult` of the latest `run()`: the hook and the callback
        # call run() themselves, so this is where their users find it.
        self.last_run = None
        # (graph, graph.version after run, RunResult) of the latest run
        # that planned: a second call for the same graph (Keras calls
        # set_model and then set_params) answers with the same result
        # instead of analysing it again, unless tuning found LMS unneeded
        # and the graph has changed since.
        self._decided = None
        self._step_guard = None  # set by begin() (SessionRunHook)
        # The tflms.keras3.Keras3Fit of the Keras 3 fit under way (or the
        # last one: its step is reused by the next fit of the model).
        self._keras3_fit = None
        self._keras3_active = False

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
    def _log(self):
        return Logger(self._settings.debug, self._settings.debug_level)

    # ---- the work -----------------------------------------------------
    def _device_filter(self, device):
        return analysis.device_matches(device, self._settings.gpu_device)

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
        start = time.perf_counter()
        if not isinstance(keras, bool):
            raise ValueError(
                "keras must be True (a Keras 2 graph, as TFLMSv2's "
                "run(keras=True)) or False; got %r. Pass the step's "
                "fetches as fetches=..." % (keras,))
        graph = _graph_to_edit(graph)
        if not isinstance(fetches, step.StepFetches):
            fetches = step.find_fetches(graph, fetches)
        decided = self._decided
        decided_before = decided[2] if decided is not None else None
        if (decided is not None and decided[0] is graph
                and (decided[1] == graph.version or decided[2].rewritten)):
            # This object planned this graph before: the same answer (a
            # graph it rewrote stays rewritten when ops are added later).
            self._log.info("LMS has already planned this graph: %s."
                           % decided[2].outcome.value, 1)
            result = decided[2]
        else:
            with _gc.paused():
                result = self._run(graph, fetches, start)
            if result.planned is not None:
                self._decided = (graph, graph.version, result)
        self.last_run = result
        if keras and result.rewritten and result is not decided_before:
            self._log.info("run(keras=True): the graph's Keras session, if "
                           "it has one, is renewed to see LMS's edits")
            _keras.renew_keras_session(graph, self._log)
        # Every rank of a multi-process job reaches this line whatever it
        # decided, so a rank that decided otherwise is an error here rather
        # than a hang at the first collective.
        distributed.check_ranks_agree(graph, result.outcome.value,
                                      result.rewrite)
        return result

    def _run(self, graph, fetches, start, index=None, worker=None):
        """Plan and rewrite `graph`; `index`: its index when the caller
        built it (`tflms.function` adds what a function graph captures);
        `worker`: the `worker_devices.WorkerDevices` of a step that runs
        under a multi-worker strategy (tflms.multi_worker), whose CPUs
        LMS may manage and whose host takes the swap ops."""
        log = self._log
        settings = self._settings
        device_filter = self._device_filter
        if worker is not None:
            log.info(worker.describe())

            def device_filter(device):
                return analysis.device_matches(device, settings.gpu_device,
                                               worker)
        if rewriter.is_rewritten(graph, device_filter):
            log.info("This model already has LMS swap operations; LMS "
                     "will not process it again.")
            return RunResult(Outcome.ALREADY_REWRITTEN,
                             seconds=time.perf_counter() - start)
        log.info("Editing model for LMS")
        if index is None:
            index = gi.build_index(graph, fetches)
        run_log.log_step(log, index)
        roles = pipeline.classify(index, settings, worker)
        run_log.log_graph_facts(log, index, roles, settings)
        try:
            planned = pipeline.plan(index, settings, roles=roles, log=log)
        except autotune.AutotuneError as err:
            raise plots.with_plots(err, settings, log) from None
        plots.write_planned(planned, log)
        if not planned.needed:
            return RunResult(Outcome.NOT_NEEDED, planned,
                             seconds=time.perf_counter() - start)

        plan = planned.plan
        if plan.swaps or plan.recomputes:
            run_log.log_parameters(log, planned)
        else:
            log.info("LMS will swap nothing: the step fits with the %d "
                     "control edges it adds (serialization, ordering, "
                     "deferred fills) alone" % len(plan.control_edges))
        if plan.unplanned_groups:
            log.info("%d swap-in groups had no op to start them in time and "
                     "were left on the device" % plan.unplanned_groups, 1)
        run_log.log_plan_details(log, planned.index, plan)
        rewrite = rewriter.apply_plan(
            graph, planned.index, plan,
            settings.cpu_device if worker is None else worker.host)
        log.info(
            "Added %d operations to the model (%d swap-out operations "
            "(%.2f GiB) and %d swap-in operations (%.2f GiB))"
            % (len(rewrite.swapout_ops) + len(rewrite.swapin_ops)
               + len(rewrite.recompute_ops),
               len(rewrite.swapout_ops), plan.swapout_bytes() / _GIB,
               len(rewrite.swapin_ops), plan.swapin_bytes() / _GIB))
        if plan.recomputes:
            log.info("Recomputing %d tensors (%.2f GiB) instead of swapping "
                     "them, with %d cloned operations"
                     % (len(plan.recomputes), plan.recompute_bytes() / _GIB,
                        len(rewrite.recompute_ops)))
        seconds = time.perf_counter() - start
        log.info("Editing model for LMS, took: %.1f ms" % (seconds * 1000))
        log.warning(run_log.summary_line(planned, rewrite, seconds))
        return RunResult(Outcome.REWRITTEN, planned, rewrite, seconds)

    def function(self, step_fn):
        """LMS for a TensorFlow 2 training step: `step_fn` (a Python
        function or a `tf.function`) traced per input signature, each
        concrete function's graph rewritten like `run()` rewrites a
        graph. Returns a callable used like `step_fn`; see
        `tflms.function.function` and docs/tf2.md."""
        return function_mod.function(step_fn, lms=self)

    # ---- SessionRunHook -----------------------------------------------
    def begin(self):
        """Rewrite the default graph before the session is created."""
        graph = tf.compat.v1.get_default_graph()
        self.run(graph)
        self._step_guard = _StepGuard.for_graph(graph)

    def before_run(self, run_context):  # pylint: disable=unused-argument
        """Read the global step with every training step (see `_StepGuard`)."""
        if self._step_guard is None:
            return None
        return tf.compat.v1.train.SessionRunArgs(self._step_guard.global_step)

    def after_run(self, run_context, run_values):  # pylint: disable=unused-argument
        if self._step_guard is not None:
            self._step_guard.check(run_values.results)

    # ---- Keras callback -----------------------------------------------
    def set_params(self, params):
        """Keras passes the fit parameters; the batch size is taken from
        them unless `batch_size` was set."""
        self.params = params
        if (self._settings.batch_size is None and params
                and params.get("batch_size")):
            self.batch_size = params["batch_size"]
        self._run_for_keras()

    def set_model(self, model):
        """Keras passes the model. Keras 2: rewrite its graph once the
        train function exists (it is made here if Keras has not made it
        yet). Keras 3: the model is recorded; `on_train_begin` acts."""
        if _compat.is_keras3_model(model):
            keras3.check_backend()
            self.model = model
            self._model = model
            return
        self.model = model
        self._model = model
        if tf.executing_eagerly():
            raise EagerModeError(_EAGER_MESSAGE)
        if (self._settings.autotune_requested
                and self._settings.batch_size is None):
            # fit() calls set_params with the batch size right after this.
            return
        self._run_for_keras()

    def on_train_begin(self, logs=None):  # pylint: disable=unused-argument
        """Keras 3: from now until `on_train_end`, the model's train
        function runs LMS's rewrite of its training step (tflms.keras3)."""
        model = self._model
        if model is None or not _compat.is_keras3_model(model):
            return
        self._keras3_fit = keras3.begin(self, model, self._keras3_fit,
                                        on_error=self.on_train_end)
        self._keras3_active = True

    def on_train_end(self, logs=None):  # pylint: disable=unused-argument
        """Keras 3: the model gets its own training step back (and its
        ``jit_compile``); a later fit without LMS trains without it."""
        if self._keras3_active:
            self._keras3_active = False
            keras3.end(self._keras3_fit)

    def _run_for_keras(self):
        model = self._model
        if model is None or _compat.is_keras3_model(model):
            return
        if tf.executing_eagerly():
            raise EagerModeError(_EAGER_MESSAGE)
        # Only a compiled model being trained gets a train function: predict()
        # with the callback must not add a whole training graph.
        if (self._settings.is_training
                and getattr(model, "train_function", None) is None
                and getattr(model, "optimizer", None) is not None
                and hasattr(model, "_make_train_function")):
            self._log.info("Making the Keras train function before editing",
                           1)
            model._make_train_function()  # pylint: disable=protected-access
        graph = tf.compat.v1.get_default_graph()
        before = self.last_run
        result = self.run(graph, fetches=step.keras_train_fetches(graph, model))
        if result.rewritten and result is not before:
            _keras.renew_keras_session(graph, self._log, model)


class _StepGuard:
    """Stops a hooked training loop whose global step stopped advancing.

    Estimator.train(steps=N) loops until the global step reaches N; if a
    rewritten graph skipped the step's `AssignAdd` (as once happened when
    oneDNN merged ops around LMS's edges, see `analysis.fusion_partners`),
    it would loop for ever. With LMS's swap ops in a training graph whose
    train op increments the global step, three runs in a row that see the
    same step value raise instead, with what to do. (Not under a
    tf.distribute strategy, whose global step is a distributed variable.)
    """

    RUNS = 3

    def __init__(self, global_step):
        self.global_step = global_step
        self._last = None
        self._same = 0

    @classmethod
    def for_graph(cls, graph):
        """A guard for `graph`, or None when it has nothing to guard."""
        if not rewriter.is_rewritten(graph):
            return None
        with graph.as_default():
            if not tf.compat.v1.get_collection(
                    tf.compat.v1.GraphKeys.TRAIN_OP):
                return None  # evaluation and prediction graphs
            step = tf.compat.v1.train.get_global_step()
        if step is None:
            return None
        handle = step.op
        if not isinstance(handle, tf.Operation):
            # A tf.distribute strategy's global step is a distributed
            # variable (no graph op of its own, and not a fetch like any
            # other): no guard there.
            return None
        increments = any(c.type.startswith("AssignAdd")
                         for t in handle.outputs for c in t.consumers())
        return cls(step) if increments else None

    def check(self, value):
        if self._last is not None and value == self._last:
            self._same += 1
        else:
            self._same = 0
        self._last = value
        if self._same >= self.RUNS - 1:
            raise RuntimeError(
                "[LMS] The global step stayed at %s for %d training steps "
                "although the train op increments it: part of the training "
                "step rewritten by LMS is not running, and training would "
                "never end. Check the graph with `tflms verify` (see "
                "docs/plan.md) and report it; train without the LMS hook "
                "meanwhile." % (value, self.RUNS))


for _field in S.fields():
    setattr(LMS, _field.name, _setting_property(_field))
del _field


def _graph_to_edit(graph):
    """`graph`, or the default graph for None, after checking that LMS can
    edit it."""
    if graph is None:
        if tf.executing_eagerly():
            raise EagerModeError(_EAGER_MESSAGE)
        graph = tf.compat.v1.get_default_graph()
    if not isinstance(graph, tf.Graph):
        raise ValueError("graph must be a tf.Graph or None (the default "
                         "graph); got %r" % (graph,))
    if getattr(graph, "_building_function", False):
        raise EagerModeError(_FUNCTION_MESSAGE % (graph.name,))
    if graph.finalized:
        raise ValueError(
            "the graph is finalized, so LMS cannot edit it. Call "
            "lms.run(graph) before creating the Session or "
            "MonitoredTrainingSession, or pass LMS as a hook "
            "(hooks=[lms]) so it runs in begin().")
    return graph
