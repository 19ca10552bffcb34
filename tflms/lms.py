"""The public `LMS` object: configuration, `run()`, and thin adapters that
make it a `SessionRunHook` and a Keras callback.

`run()` is the only entry point that does work; `begin()` (Estimator) and
`set_model()` / `set_params()` (Keras) only find the graph and call it.
"""

import time

import tensorflow as tf

from tflms import _compat
from tflms import _keras
from tflms import analysis
from tflms import distributed
from tflms import graph_index as gi
from tflms import params as P
from tflms import planner
from tflms import rewriter
from tflms._logging import Logger

__all__ = ["LMS", "EagerModeError", "UnsupportedStackError"]

UnsupportedStackError = _compat.UnsupportedStackError

_GIB = float(1 << 30)
_MIB = float(1 << 20)

_SYNC_MODE_TEXT = {
    0: "asynchronous copies between host and device",
    1: "device waits for swap-outs, swap-ins asynchronous",
    2: "swap-outs asynchronous, device waits for swap-ins",
    3: "device waits for swap-outs and swap-ins",
}

_FILTERS = (
    "excl_output_by_scopes", "excl_output_by_types",
    "excl_input_by_scopes", "excl_input_by_types",
    "incl_output_by_scopes", "incl_output_by_types",
    "incl_input_by_scopes", "incl_input_by_types",
)


class EagerModeError(RuntimeError):
    """LMS rewrites graphs; it cannot act on eagerly executed code."""


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
    "creating the Session.")


def _filter_property(name):
    attr = "_" + name

    def getter(self):
        return getattr(self, attr)

    def setter(self, value):
        setattr(self, attr, P.check_name_set(name, value))

    return property(getter, setter, doc="Set of strings; see `LMS` docs.")


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
    * Keras: ``model.fit(..., callbacks=[lms])``. This needs Keras 2: on
      TensorFlow 2.15 ``tf.keras``; on 2.16+ the tf-keras package, as
      ``tf.keras`` with ``TF_USE_LEGACY_KERAS=1`` or as ``import tf_keras``.
      The callback derives from that Keras 2's ``Callback``; a Keras 3 model
      raises `UnsupportedStackError`.

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

    excl_output_by_scopes = _filter_property("excl_output_by_scopes")
    excl_output_by_types = _filter_property("excl_output_by_types")
    excl_input_by_scopes = _filter_property("excl_input_by_scopes")
    excl_input_by_types = _filter_property("excl_input_by_types")
    incl_output_by_scopes = _filter_property("incl_output_by_scopes")
    incl_output_by_types = _filter_property("incl_output_by_types")
    incl_input_by_scopes = _filter_property("incl_input_by_scopes")
    incl_input_by_types = _filter_property("incl_input_by_types")

    def __init__(self,
                 swapout_threshold=-1,
                 swapin_groupby=-1,
                 swapin_ahead=-1,
                 sync_mode=0,
                 serialization=(),
                 serialization_by_size=0,
                 debug=False,
                 debug_level=1,
                 cpu_device="/cpu:0",
                 gpu_device=None):
        _compat.CallbackBase.__init__(self)
        self._swapout_threshold = P.check_threshold(swapout_threshold)
        self._swapin_groupby = P.check_groupby(swapin_groupby)
        self._swapin_ahead = P.check_ahead(swapin_ahead)
        self._sync_mode = P.check_sync_mode(sync_mode)
        self._serialization_slices = planner.parse_serialization(serialization)
        self._serialization = list(serialization)
        self._serialization_by_size = P.check_serialization_by_size(
            serialization_by_size)
        self._debug = P.check_bool("debug", debug)
        self._debug_level = P.check_debug_level(debug_level)
        self._cpu_device = P.check_cpu_device(cpu_device)
        self._gpu_device = P.check_gpu_device(gpu_device)
        self._log = Logger(self._debug, self._debug_level)

        self._batch_size = None
        self._is_training = True
        self._autotune_gpu_mem = None
        self._autotune_plot = False
        self._plot_dir = ".lms"
        for name in _FILTERS:
            setattr(self, "_" + name, set())

        self._model = None
        self.last_plan = None
        self.last_result = None
        self.last_tune = None
        # (graph, graph.version) for which tuning found LMS unnecessary, so a
        # second call on the unchanged graph (Keras calls set_model and then
        # set_params) does not analyse it again.
        self._not_needed = None
        self._step_guard = None  # set by begin() (SessionRunHook)

    # ---- settable properties ------------------------------------------
    @property
    def swapout_threshold(self):
        return self._swapout_threshold

    @property
    def swapin_ahead(self):
        return self._swapin_ahead

    @property
    def swapin_groupby(self):
        return self._swapin_groupby

    @property
    def sync_mode(self):
        return self._sync_mode

    @property
    def batch_size(self):
        """Mini-batch size, used for the first unknown dimension of shapes."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value):
        self._batch_size = P.check_batch_size(value)

    @property
    def is_training(self):
        """True to plan for training, False for inference-only graphs."""
        return self._is_training

    @is_training.setter
    def is_training(self, value):
        self._is_training = P.check_bool("is_training", value)

    @property
    def autotune_gpu_mem(self):
        """GiB of device memory auto-tuning plans for (None: the GPU's)."""
        return self._autotune_gpu_mem

    @autotune_gpu_mem.setter
    def autotune_gpu_mem(self, value):
        self._autotune_gpu_mem = P.check_gpu_mem(value)

    @property
    def autotune_plot(self):
        """Write memory-usage plots while auto-tuning."""
        return self._autotune_plot

    @autotune_plot.setter
    def autotune_plot(self, value):
        self._autotune_plot = P.check_bool("autotune_plot", value)

    @property
    def plot_dir(self):
        """Folder for plots and the distance histogram (default '.lms')."""
        return self._plot_dir

    @plot_dir.setter
    def plot_dir(self, value):
        if not isinstance(value, str) or not value:
            raise ValueError("plot_dir must be a folder path; got %r"
                             % (value,))
        self._plot_dir = value

    # ---- the work -----------------------------------------------------
    def _autotune_requested(self):
        return P.AUTO in (self._swapout_threshold, self._swapin_ahead,
                          self._swapin_groupby)

    def _device_filter(self, device):
        return analysis.device_matches(device, self._gpu_device)

    def run(self, graph=None, keras=False):
        """Rewrite `graph` in place for Large Model Support.

        Args:
          graph: the training `tf.Graph`; the default graph when None.
          keras: True when called for a Keras model (for logs only).

        Returns:
          A `rewriter.RewriteResult`, or None when nothing was changed
          (already rewritten, or LMS is not needed).

        Raises:
          EagerModeError: when called in eager mode without a graph, or on
            the graph of a tf.function.
          ValueError: for bad settings or a graph that cannot be edited; the
            graph is then unchanged.
        """
        del keras  # The graph tells all we need.
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
        if rewriter.is_rewritten(graph, self._device_filter):
            self._log.info("This model already has LMS swap operations; LMS "
                           "will not process it again.")
            distributed.check_ranks_agree(graph, distributed.ALREADY_REWRITTEN)
            return None
        if self._not_needed == (graph, graph.version):
            self._log.info("LMS is not necessary for this unchanged graph "
                           "(decided before).", 1)
            distributed.check_ranks_agree(graph, distributed.NOT_NEEDED)
            return None

        log = self._log
        log.info("Editing model for LMS")
        start = time.perf_counter()
        index = gi.build_index(graph)
        roles = self._roles(index)
        if self._is_training and not analysis.has_training_ops(index):
            log.warning(
                "The graph has no training operations (no gradients, no "
                "optimizer updates), but LMS plans for a training step "
                "(is_training=True). For an inference-only graph, set "
                "lms.is_training = False.")
        self._log_graph_facts(graph, index, roles)
        if roles.has_loops:
            log.info("The graph has loops: LMS leaves tensors inside loops "
                     "alone. For RNNs, also pass swap_memory=True to "
                     "tf.compat.v1.nn.dynamic_rnn / tf.while_loop so "
                     "TensorFlow swaps loop tensors itself.")
        if roles.fused_with:
            pairs = sorted({tuple(sorted((index.types[a], index.types[b])))
                            for a, partners in roles.fused_with.items()
                            for b in partners})
            log.info("%d operations may be merged in pairs by TensorFlow at "
                     "run time when oneDNN is on (%s): LMS never starts a "
                     "swap-in from one of a pair for the other, which would "
                     "make the merged operation wait for itself." % (
                         len(roles.fused_with),
                         ", ".join("+".join(p) for p in pairs)))

        ser_edges, ser_levels = self._serialization_plan(index, roles)
        if ser_edges:
            log.info("Serializing %d levels: %s" % (
                len(ser_levels), _compact_levels(ser_levels)))
            index = analysis.relevel(index, ser_edges)
            log.info("New categorized topological sort has %d levels"
                     % index.num_levels)

        deferral = planner.deferral_edges(index, roles, ser_edges)
        if deferral:
            log.info("Delaying %d tensor fills (%.2f GiB), such as the "
                     "gradient zeros of the untaken branch of v1 conds, until "
                     "just before their first reader" % (
                         len(deferral), sum(
                             gi.tensor_bytes(index, op, 0, self._batch_size)
                             or 0 for _, op in deferral) / _GIB), 1)

        only_tensors = None
        autotuned = False
        if self._autotune_requested():
            outcome = self._autotune(index, roles, ser_edges, deferral)
            if outcome is None:
                self._not_needed = (graph, graph.version)
                distributed.check_ranks_agree(graph, distributed.NOT_NEEDED)
                return None
            swap_params, only_tensors = outcome
            autotuned = True
        else:
            swap_params = planner.SwapParams(
                self._swapout_threshold, self._swapin_ahead,
                self._swapin_groupby, self._sync_mode)
        self._log_parameters(swap_params, autotuned, only_tensors)

        plan = planner.make_plan(index, roles, swap_params,
                                 batch_size=self._batch_size,
                                 only_tensors=only_tensors,
                                 deferral=deferral)
        plan = _with_serialization(plan, ser_edges)
        if plan.unplanned_groups:
            log.info("%d swap-in groups had no op to start them in time and "
                     "were left on the device" % plan.unplanned_groups, 1)
        self._log_plan_details(index, plan)
        result = rewriter.apply_plan(graph, index, plan, self._cpu_device)
        self.last_plan = plan
        self.last_result = result
        log.info(
            "Added %d operations to the model (%d swap-out operations "
            "(%.2f GiB) and %d swap-in operations (%.2f GiB))"
            % (len(result.swapout_ops) + len(result.swapin_ops),
               len(result.swapout_ops), plan.swapout_bytes() / _GIB,
               len(result.swapin_ops), plan.swapin_bytes() / _GIB))
        log.info("Editing model for LMS, took: %.1f ms"
                 % ((time.perf_counter() - start) * 1000))
        distributed.check_ranks_agree(graph, distributed.REWRITTEN, result)
        return result

    def _roles(self, index):
        filters = {}
        pairs = (
            ("incl_sources", "incl_output_by_scopes", "incl_output_by_types"),
            ("excl_sources", "excl_output_by_scopes", "excl_output_by_types"),
            ("incl_sinks", "incl_input_by_scopes", "incl_input_by_types"),
            ("excl_sinks", "excl_input_by_scopes", "excl_input_by_types"),
        )
        for key, scopes_name, types_name in pairs:
            scopes = P.check_name_set(scopes_name, getattr(self, scopes_name))
            types = P.check_name_set(types_name, getattr(self, types_name))
            if scopes or types:
                filters[key] = analysis.ops_matching(
                    index, scopes, types, "%s/%s" % (scopes_name, types_name))
        roles = analysis.classify_ops(index, self._gpu_device,
                                      self._is_training, filters)
        if self._gpu_device is not None and not roles.device_ops:
            raise ValueError(
                "gpu_device=%r matches no operation in the graph; ops are "
                "placed on %s. Use one of those, or None for every non-CPU "
                "device." % (self._gpu_device, _device_summary(index)))
        return roles

    def _serialization_plan(self, index, roles):
        extra = ()
        if self._serialization_by_size:
            extra = planner.levels_over_size(
                index, roles, self._serialization_by_size, self._batch_size)
        if not self._serialization_slices and not extra:
            return (), []
        excluded = analysis.initializer_inputs(index)
        return planner.serialization_edges(
            index, roles, self._serialization_slices, extra, excluded)

    def _autotune(self, index, roles, serialization_edges, deferral):
        # Imported here: tuning pulls in the simulator, which fixed-parameter
        # users never need.
        from tflms import autotune  # pylint: disable=import-outside-toplevel
        outcome = autotune.tune(
            index, roles,
            requested=planner.SwapParams(
                self._swapout_threshold, self._swapin_ahead,
                self._swapin_groupby, self._sync_mode),
            batch_size=self._batch_size,
            gpu_mem_gib=self._autotune_gpu_mem,
            gpu_device=self._gpu_device,
            plot_dir=self._plot_dir if self._autotune_plot else None,
            log=self._log,
            serialization_edges=serialization_edges,
            deferral_edges=deferral)
        self.last_tune = outcome
        if outcome.params is None:
            self._log.info("LMS is not necessary: the model fits in %.2f GiB "
                           "without swapping. Turned LMS off."
                           % (outcome.budget_bytes / _GIB))
            return None
        return outcome.params, outcome.only_tensors

    # ---- logging ------------------------------------------------------
    def _log_graph_facts(self, graph, index, roles):
        log = self._log
        log.info("The graph has %d vertices and %d edges."
                 % (index.num_ops, index.num_edges))
        log.info("The graph has %.2f MiB of learning parameters"
                 % (analysis.learning_parameter_bytes(graph) / _MIB))
        op, nbytes = analysis.largest_device_op(
            index, roles.device_ops, self._batch_size,
            excluded=analysis.initializer_only_ops(index))
        if op is not None:
            log.info("The largest operation is %s consuming %.2f GiB"
                     % (index.names[op], nbytes / _GIB))
        log.info("Original categorized topological sort has %d levels"
                 % index.num_levels)
        if log.enabled(1):
            for lvl, ops in enumerate(index.ops_by_level):
                log.info("[%d]: %s" % (lvl, ", ".join(
                    "%s (%s)" % (index.names[o], index.types[o])
                    for o in ops)), 1)

    def _log_parameters(self, p, autotuned, only_tensors=None):
        log = self._log
        hand_set = ("LMS(swapout_threshold=%d, swapin_ahead=%d, "
                    "swapin_groupby=%d, sync_mode=%d)"
                    % (p.swapout_threshold, p.swapin_ahead, p.swapin_groupby,
                       p.sync_mode))
        if autotuned and only_tensors is not None:
            log.info("LMS will swap %d tensors chosen by the simulator with "
                     "the parameters below. Set by hand, %s would swap "
                     "every tensor past the threshold instead (more bytes "
                     "moved; that plan was not simulated): only auto-tuning "
                     "reproduces this selection."
                     % (len(only_tensors), hand_set))
        elif autotuned:
            log.info("LMS will use the parameters found by the simulator; to "
                     "skip tuning next time, pass: %s" % hand_set)
        else:
            log.info("LMS will use the following parameter set:")
        ignored = " (ignored: sync_mode %d)" % p.sync_mode if p.sync_swapin \
            else ""
        log.info("sync_mode: %d (%s)" % (p.sync_mode,
                                         _SYNC_MODE_TEXT[p.sync_mode]), indent=2)
        log.info("swapout_threshold: %d" % p.swapout_threshold, indent=2)
        log.info("swapin_ahead: %d%s" % (p.swapin_ahead, ignored), indent=2)
        log.info("swapin_groupby: %d%s" % (p.swapin_groupby, ignored),
                 indent=2)

    def _log_plan_details(self, index, plan):
        log = self._log
        if not log.enabled(1):
            return
        lv = index.levels
        for swap in plan.swaps:
            name = "%s:%d" % (index.names[swap.producer], swap.output)
            log.info("Swap-out: %s (level %d, %s bytes)"
                     % (name, lv[swap.producer], swap.nbytes), 1, 2)
            for sin in swap.swap_ins:
                kind = "sync on" if sin.synchronous else "triggered by"
                log.info("Swap-in for %s %s %s" % (
                    ", ".join("%s (level %d)" % (index.names[c], lv[c])
                              for c, _ in sin.consumers), kind,
                    ", ".join("%s (level %d)" % (index.names[t], lv[t])
                              for t in sin.triggers)), 1, 4)
            if swap.waiters:
                log.info("Waiting for the swap-out: %s" % ", ".join(
                    index.names[w] for w in swap.waiters), 2, 4)

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
        if self._batch_size is None and params and params.get("batch_size"):
            self._batch_size = P.check_batch_size(params["batch_size"])
        self._run_for_keras()

    def set_model(self, model):
        """Keras passes the model; rewrite its graph once the train function
        exists (it is made here if Keras has not made it yet)."""
        if _compat.is_keras3_model(model):
            raise UnsupportedStackError(_compat.keras3_model_message(model))
        self.model = model
        self._model = model
        if tf.executing_eagerly():
            raise EagerModeError(_EAGER_MESSAGE)
        if self._autotune_requested() and self._batch_size is None:
            # fit() calls set_params with the batch size right after this.
            return
        self._run_for_keras()

    def _run_for_keras(self):
        model = self._model
        if model is None:
            return
        if tf.executing_eagerly():
            raise EagerModeError(_EAGER_MESSAGE)
        # Only a compiled model being trained gets a train function: predict()
        # with the callback must not add a whole training graph.
        if (self._is_training
                and getattr(model, "train_function", None) is None
                and getattr(model, "optimizer", None) is not None
                and hasattr(model, "_make_train_function")):
            self._log.info("Making the Keras train function before editing",
                           1)
            model._make_train_function()  # pylint: disable=protected-access
        graph = tf.compat.v1.get_default_graph()
        if self.run(graph, keras=True) is not None:
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


def _with_serialization(plan, edges):
    if not edges:
        return plan
    import dataclasses  # pylint: disable=import-outside-toplevel
    return dataclasses.replace(plan, serialization_edges=tuple(edges))


def _device_summary(index):
    devices = sorted({d or "(unplaced)" for d in index.devices})
    return ", ".join(devices[:6]) + (" ..." if len(devices) > 6 else "")


def _compact_levels(levels):
    if len(levels) <= 12:
        return str(list(levels))
    return "%s ... %s" % (list(levels[:6]), list(levels[-3:]))
