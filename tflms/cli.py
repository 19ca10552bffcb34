"""``tflms plan GRAPH``: will this model fit on that GPU, and at what cost?

The planning command loads a saved training graph into a fresh `tf.Graph`,
lets `LMS` rewrite it exactly as it would before training (auto-tuning
included), and reports what the simulator expects of one training step:

* the graph summary (ops, edges, levels of the categorized topological sort,
  learning parameters);
* the device memory peak without LMS and with the plan LMS applied, against
  the budget (``--autotune-gpu-mem`` GiB, or the GPU's memory, times
  ``TF_LMS_SIMULATOR_MEM_RATIO``);
* the swapping parameters and the bytes moved per step, and what those bytes
  cost at common host-device link bandwidths;
* the memory plots (`tflms.plots`).

It needs no GPU: nothing is run, and no session is created except the one
Keras makes while loading weights.

Accepted graphs:

* a MetaGraph file (``.meta``, from ``tf.compat.v1.train.Saver`` or
  ``export_meta_graph``) of a training graph;
* a SavedModel folder written by ``tf.compat.v1.saved_model.Builder``; the
  MetaGraph tagged ``train`` is used when there is one;
* a Keras model: an ``.h5`` / ``.keras`` file or a Keras SavedModel folder
  (``model.save(folder)``). Its training graph is built as ``fit()`` would:
  compiled with the saved loss and optimizer (``--loss`` / ``--optimizer``
  when it was saved without them), then the train function is made.

Exit status: 0 when one step fits the budget (with or without LMS), 1 when
it cannot fit, 2 for bad arguments or a graph that cannot be planned.

While it works, ``tflms plan`` prints one short line per phase on stderr
(``tflms plan [  4.1 s] planning 12,345 ops: ...``) when stderr is a
terminal, or always with ``--progress`` (never with ``--no-progress``); the
report itself goes to stdout. Run as a program (``tflms``, ``python -m
tflms``), the command sets ``TF_CPP_MIN_LOG_LEVEL=2`` for its own process
unless the user set it or passed ``--verbose``, which hides TensorFlow's
C++ INFO and WARNING lines (CPU features, oneDNN, CUDA probing); importing
`tflms.cli` as a library changes nothing.
"""

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time

from tflms import hardware
from tflms import settings as S
from tflms._argparse_types import positive_int


class _Lazy:
    """A module imported on its first attribute access.

    TensorFlow takes seconds to import; ``tflms --help`` and argument errors
    must not wait for it, so this module imports only the standard library
    and the TensorFlow-free `tflms.settings` up front, and everything that
    loads TensorFlow through these stand-ins once a command runs."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self._name), attr)


tf = _Lazy("tensorflow")
text_format = _Lazy("google.protobuf.text_format")
saved_model_pb2 = _Lazy("tensorflow.core.protobuf.saved_model_pb2")
_compat = _Lazy("tflms._compat")
autotune = _Lazy("tflms.autotune")
gi = _Lazy("tflms.graph_index")
keras_models = _Lazy("tflms.keras_models")
pipeline = _Lazy("tflms.pipeline")
plotting = _Lazy("tflms.plots")
simulator = _Lazy("tflms.simulator")
steptime = _Lazy("tflms.steptime")
tf_reader = _Lazy("tflms.tf_reader")
_lms = _Lazy("tflms.lms")

__all__ = ["LINKS", "PlanError", "build_parser", "load_graph", "plan_graph",
           "main"]

_GIB = float(1 << 30)
_MIB = float(1 << 20)

# (name, GB/s per direction): `steptime.LINKS`, theoretical peak rates;
# real copies reach roughly 80-90% of them.
LINKS = hardware.LINKS

_KERAS_EXTENSIONS = (".h5", ".hdf5", ".keras")
_FUNCTION_CALL_TYPES = frozenset({"PartitionedCall",
                                  "StatefulPartitionedCall"})

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_ERROR = 0, 1, 2


class PlanError(Exception):
    """A graph that cannot be loaded or planned; the message says why and
    what to do."""


class _Progress:
    """`tflms plan`'s progress lines on stderr, one per phase, each with the
    seconds since the command started; silent when off."""

    def __init__(self, command, enabled, stream=None):
        self._prefix = "tflms %s" % command
        self._stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self._stream, "isatty", None)
                           and self._stream.isatty())
        self.enabled = enabled
        self._start = time.monotonic()

    def __call__(self, text):
        if self.enabled:
            print("%s [%5.1f s] %s" % (self._prefix,
                                       time.monotonic() - self._start, text),
                  file=self._stream, flush=True)


def _silent(_):
    """A progress callback that prints nothing."""


@dataclasses.dataclass
class LoadedGraph:
    """A training (or inference) graph ready for LMS.

    Attributes:
      graph: the `tf.Graph` (nothing has run in it).
      kind: human-readable description of the file.
      training: True if the graph has a backward phase.
      notes: lines to show the user about how it was loaded.
      fetches: what one step runs (`step.StepFetches`), when the file
        says (a Keras model's train function, or its outputs for
        inference); None: LMS finds it (`tflms.step`).
    """

    graph: object
    kind: str
    training: bool
    notes: list
    fetches: object = None


# ---- command line ----------------------------------------------------------
def build_parser():
    """The ``tflms`` argument parser (sub-command ``plan``)."""
    parser = argparse.ArgumentParser(
        prog="tflms",
        description="TensorFlow Large Model Support tools.")
    commands = parser.add_subparsers(dest="command", title="commands")
    commands.required = True
    plan = commands.add_parser(
        "plan",
        help="predict device memory with and without LMS for a saved graph",
        description=(
            "Load a saved training graph, let LMS plan it as it would before "
            "training, and print the expected device memory peak of one step "
            "without and with LMS, the swapping parameters, the bytes "
            "swapped and their transfer time per step, and write the memory "
            "plots. No GPU needed. Exit status 0: fits; 1: cannot fit; "
            "2: error."),
        epilog=("GRAPH is a MetaGraph file (.meta), a SavedModel folder, or a "
                "Keras model (.h5, .keras, or a Keras SavedModel folder). "
                "Example: tflms plan model.h5 --batch-size 32 "
                "--autotune-gpu-mem 16"))
    _graph_arguments(plan, plan_output=True)
    verify = commands.add_parser(
        "verify",
        help="train a saved graph a few steps with and without LMS and "
             "compare",
        description=(
            "Load a saved training graph twice, rewrite one copy with LMS, "
            "train both copies a few steps on this machine's CPU from the "
            "same variable values and the same random inputs (with oneDNN "
            "as TensorFlow has it here: TF_ENABLE_ONEDNN_OPTS), and compare "
            "losses, every variable, the global step and which ops ran. "
            "Exit status 0: identical; 1: any difference; 2: error."),
        epilog=("GRAPH as for `tflms plan`; the train op comes from the "
                "graph's train_op collection unless --train-op names it. "
                "Example: tflms verify model.meta --batch-size 8 "
                "--autotune-gpu-mem 4"))
    _graph_arguments(verify)
    for flag in _PLAN_ONLY_FLAGS:
        # No default: an unused flag sets no attribute, so the settings
        # read from the arguments keep their own defaults (plot_dir).
        verify.add_argument(flag, action=_PlanOnly, nargs=0,
                            default=argparse.SUPPRESS,
                            help=argparse.SUPPRESS)
    check = verify.add_argument_group("verification")
    check.add_argument("--steps", type=positive_int, default=3, metavar="N",
                       help="training steps per copy (default 3)")
    check.add_argument("--train-op", action="append", default=[],
                       metavar="NAME",
                       help="op that runs one training step (repeatable); "
                            "default: the train_op collection")
    check.add_argument("--loss-tensor", default=None, metavar="NAME",
                       help="tensor to compare at every step; default: the "
                            "first of the losses collection")
    check.add_argument("--rtol", type=float, default=0.0,
                       help="relative tolerance; default 0: bit-identical")
    return parser


# LMS settings `tflms plan` and `tflms verify` take, in --help order, and
# the spellings of earlier versions they still accept.
_SETTING_FLAGS = ("batch_size", "autotune_gpu_mem", "autotune_host_mem",
                  "swapout_threshold",
                  "swapin_ahead", "swapin_groupby", "sync_mode", "recompute",
                  "serialization", "serialization_by_size", "gpu_device",
                  "interconnect", "gpu")
_OLD_FLAGS = {"autotune_gpu_mem": ["--gpu-mem"]}


def _graph_arguments(sub, plan_output=False):
    """Arguments `plan` and `verify` share: the graph and LMS's settings;
    with `plan_output`, `plan`'s own flags for plots, the oracle and
    progress lines.

    The settings' flags come from `tflms.settings` (names, converters,
    defaults and help), like the example scripts'."""
    sub.add_argument("graph", metavar="GRAPH",
                     help="the saved model or graph to plan")
    lms = sub.add_argument_group(
        "LMS settings", "As the LMS settings of the same names "
        "(docs/parameters.md); -1 lets the auto-tuner choose.")
    S.add_arguments(lms, _SETTING_FLAGS, aliases=_OLD_FLAGS)
    keras = sub.add_argument_group("Keras models")
    keras.add_argument("--loss", default=None,
                       help="loss to compile with (default: the saved one, "
                            "else 'mse')")
    keras.add_argument("--optimizer", default=None,
                       help="optimizer to compile with (default: the saved "
                            "one, else 'adam')")
    other = sub.add_argument_group("graphs and output")
    other.add_argument("--tag", default=None,
                       help="SavedModel tag set to load, comma-separated "
                            "(default: 'train' if present, else the first)")
    other.add_argument("--inference", action="store_true",
                       help="plan for inference: lms.is_training = False, "
                            "and for Keras models the forward graph only "
                            "(no loss, no train function)")
    other.add_argument("--json", action="store_true",
                       help="print the report as one JSON object")
    other.add_argument("-v", "--verbose", action="store_true",
                       help="show LMS's own [LMS] log lines and "
                            "TensorFlow's INFO and WARNING lines (on "
                            "stderr)")
    if plan_output:
        _plan_output_arguments(other)


# `plan`'s output flags, which `verify` (it trains and compares, it draws
# and measures nothing) refuses instead of ignoring.
_PLAN_ONLY_FLAGS = ("--plot-dir", "--no-plots", "--oracle", "--progress",
                    "--no-progress")


def _plan_output_arguments(other):
    """`plan`'s flags for plots, the oracle and progress lines, added to
    its argument group `other`."""
    S.add_arguments(other, ("plot_dir",))
    other.add_argument("--no-plots", action="store_true",
                       help="do not write plots")
    other.add_argument("--oracle", action="store_true",
                       help="also measure the step without and with LMS on "
                            "Grappler's virtual GPU (tflms.oracle: "
                            "TensorFlow's own placement and schedule, "
                            "replayed with the executor's buffer rules); "
                            "slower than the simulator")
    other.add_argument("--progress", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="one line per phase (loading, planning, plots) "
                            "on stderr while it works; default: when stderr "
                            "is a terminal")


class _PlanOnly(argparse.Action):
    """`verify`'s answer to `plan`'s output flags: an argument error."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            "%s is an option of `tflms plan`, not of `tflms verify`: verify "
            "trains the graph on this machine's CPU with and without LMS and "
            "compares the results; it writes no plots and measures no "
            "memory. Remove %s, or run `tflms plan GRAPH %s` for that."
            % (option_string, option_string, option_string))


# ---- loading ---------------------------------------------------------------
def _has_backward(graph):
    """True if the graph computes gradients or applies an optimizer."""
    for op in graph.get_operations():
        if op.type.startswith(("Apply", "ResourceApply", "SparseApply",
                               "ResourceSparseApply")):
            return True
        if any(part == "gradients" or part.startswith("gradients_")
               for part in op.name.split("/")):
            return True
    return False


def _is_keras_savedmodel(path):
    return os.path.exists(os.path.join(path, "keras_metadata.pb"))


def _is_savedmodel(path):
    return any(os.path.exists(os.path.join(path, name))
               for name in ("saved_model.pb", "saved_model.pbtxt"))


_CLI_FIX = ("pass a graph-mode optimizer with --optimizer (a name such as "
            "sgd, adam, rmsprop, adagrad; optimizer slots count as device "
            "memory, so pick one with the same slots)")


def _shape_targets(model):
    """Give a compiled Keras 2 model's target placeholders the shape of
    their output (batch and, for sparse losses, the class dimension left
    out): Keras makes them with no known dimension, so neither the
    simulator nor `verify` could size or feed them."""
    for endpoint in getattr(model, "_training_endpoints", None) or ():
        target = getattr(getattr(endpoint, "training_target", None),
                         "target", None)
        output = getattr(endpoint, "output", None)
        if (target is None or output is None
                or getattr(target.op, "type", None) != "Placeholder"
                or target.shape.rank is None
                or target.shape.rank != output.shape.rank):
            continue
        loss = getattr(endpoint, "loss_fn", None)
        name = (getattr(loss, "name", None) or getattr(loss, "__name__", None)
                or type(loss).__name__)
        dims = output.shape.as_list()
        if "sparse" in str(name).lower() and dims:
            dims[-1] = 1  # one class index per example
        try:
            target.set_shape(dims)
        except ValueError:
            continue  # a shape the user gave that disagrees: keep theirs


def _load_keras(path, graph, args):
    """Notes and the step's fetches of a Keras model loaded into `graph`."""
    notes = []
    with graph.as_default():
        try:
            model, load_notes = keras_models._load(  # pylint: disable=protected-access
                path, compile=not args.inference,
                convert=args.optimizer is None, fix=_CLI_FIX)
        except _compat.UnsupportedStackError as e:
            raise PlanError(str(e)) from None
        except (ImportError, IOError, OSError, ValueError, TypeError) as e:
            problem = keras_models.not_a_model_file(path)
            if problem is not None:
                raise PlanError(problem) from None
            keras3 = ""
            if _compat.TF_VERSION >= (2, 16, 0) and \
                    keras_models.saved_keras_version(path) is None:
                # A file that does not name its Keras version may still
                # be Keras 3's (the ones that do are UnsupportedStackError).
                keras3 = (" A model saved by Keras 3 (tf.keras without "
                          "TF_USE_LEGACY_KERAS=1 on TensorFlow 2.16+) cannot "
                          "be loaded by Keras 2: save it from a tf_keras "
                          "model instead.")
            raise PlanError(
                "cannot load the Keras model %s: %s. Models with custom "
                "layers or losses cannot be loaded by this command; export "
                "the training graph with tf.compat.v1.train.export_meta_graph "
                "after model._make_train_function() and plan the .meta file.%s"
                % (path, e, keras3)) from None
        if args.inference:
            notes.append("--inference: planned the model's forward graph "
                         "only (not compiled, no train function).")
            return notes, tf_reader.find_fetches(
                graph, list(model.outputs), source="the model's outputs")
        notes.extend(note.replace("; compiled with", "; planned with")
                     + (" Change it with --optimizer." if "TF2" in note
                        else "") for note in load_notes)
        saved = getattr(model, "optimizer", None) is not None
        if saved and args.loss is None and args.optimizer is None:
            if not load_notes:
                notes.append("Compiled with the saved loss and optimizer "
                             "(%s)." % type(model.optimizer).__name__)
        else:
            loss = args.loss or getattr(model, "loss", None) or "mse"
            optimizer = args.optimizer or (
                model.optimizer if saved else "adam")
            try:
                model.compile(optimizer=optimizer, loss=loss)
            except (ValueError, TypeError) as e:
                raise PlanError("cannot compile the Keras model with loss=%r "
                                "and optimizer=%r: %s; choose others with "
                                "--loss and --optimizer"
                                % (loss, optimizer, e)) from None
            if not saved:
                notes.append(
                    "The model was saved without a training configuration; "
                    "compiled with loss=%r and optimizer=%r (change with "
                    "--loss and --optimizer; optimizer slots count as device "
                    "memory)." % (loss if isinstance(loss, str) else
                                  getattr(loss, "__name__", loss),
                                  optimizer if isinstance(optimizer, str)
                                  else type(optimizer).__name__))
        if not hasattr(model.optimizer, "get_updates"):
            raise PlanError(
                "the optimizer %s cannot build a graph-mode training step; "
                "%s" % (type(model.optimizer).__name__, _CLI_FIX))
        # The training graph fit() would run: forward, backward, updates.
        model._make_train_function()  # pylint: disable=protected-access
        _shape_targets(model)
        # Named as a MetaGraph's train op is, for --oracle and `verify`.
        updates = getattr(model.train_function, "updates_op", None)
        if updates is not None:
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP,
                                           updates)
    return notes, tf_reader.keras_train_fetches(graph, model)


def _pick_meta_graph(saved_model, path, tag):
    metas = list(saved_model.meta_graphs)
    if not metas:
        raise PlanError("the SavedModel %s holds no MetaGraph" % path)
    available = [sorted(m.meta_info_def.tags) for m in metas]
    if tag:
        wanted = sorted(t.strip() for t in tag.split(",") if t.strip())
        for meta, tags in zip(metas, available):
            if tags == wanted:
                return meta, tags
        raise PlanError("the SavedModel %s has no MetaGraph tagged %s; it has "
                        "%s. Pass one of those to --tag."
                        % (path, ",".join(wanted), "; ".join(
                            ",".join(t) for t in available)))
    for meta, tags in zip(metas, available):
        if "train" in tags:
            return meta, tags
    return metas[0], available[0]


def _load_savedmodel(path, graph, args):
    saved_model = saved_model_pb2.SavedModel()
    pb = os.path.join(path, "saved_model.pb")
    if os.path.exists(pb):
        with open(pb, "rb") as f:
            saved_model.ParseFromString(f.read())
    else:
        with open(os.path.join(path, "saved_model.pbtxt"),
                  encoding="utf-8") as f:
            text_format.Merge(f.read(), saved_model)
    meta, tags = _pick_meta_graph(saved_model, path, args.tag)
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta)
    return ["Loaded the MetaGraph tagged %s." % ",".join(tags)]


def load_graph(path, args):
    """Load `path` into a fresh graph.

    Args:
      path: a .meta file, a SavedModel folder or a Keras model.
      args: parsed ``plan`` arguments (for --loss, --optimizer, --tag).

    Returns:
      A `LoadedGraph`.

    Raises:
      PlanError: with what went wrong and what to do.
    """
    if not os.path.exists(path):
        raise PlanError("%s does not exist" % path)
    graph = tf.Graph()
    lower = path.lower()
    fetches = None
    if os.path.isdir(path):
        if _is_keras_savedmodel(path):
            kind = "Keras SavedModel"
            notes, fetches = _load_keras(path, graph, args)
        elif _is_savedmodel(path):
            kind = "SavedModel"
            notes = _load_savedmodel(path, graph, args)
        else:
            raise PlanError(
                "%s is a folder without saved_model.pb; GRAPH must be a "
                "MetaGraph file (.meta), a SavedModel folder or a Keras model "
                "(.h5, .keras, or a Keras SavedModel folder)" % path)
    elif lower.endswith(_KERAS_EXTENSIONS):
        kind = "Keras model (%s)" % os.path.splitext(lower)[1]
        notes, fetches = _load_keras(path, graph, args)
    elif lower.endswith(".meta"):
        kind = "MetaGraph"
        with graph.as_default():
            try:
                tf.compat.v1.train.import_meta_graph(path)
            except Exception as e:  # pylint: disable=broad-except
                raise PlanError("cannot import the MetaGraph %s: %s"
                                % (path, e)) from None
        notes = []
    else:
        raise PlanError(
            "cannot tell what %s is from its name; GRAPH must be a MetaGraph "
            "file (.meta), a SavedModel folder or a Keras model (.h5, .keras, "
            "or a Keras SavedModel folder)" % path)

    training = _has_backward(graph)
    if not training:
        calls = [op for op in graph.get_operations()
                 if op.type in _FUNCTION_CALL_TYPES]
        if calls:
            raise PlanError(
                "%s keeps its computation inside TensorFlow 2 functions "
                "(%d %s ops), which LMS cannot rewrite: LMS works on "
                "tf.compat.v1 graphs. Save a Keras model with model.save() "
                "(.h5 or a Keras SavedModel folder), or export the training "
                "graph as a MetaGraph (tf.compat.v1.train.export_meta_graph) "
                "and plan that." % (path, len(calls), calls[0].type))
    return LoadedGraph(graph=graph, kind=kind, training=training, notes=notes,
                       fetches=fetches)


# ---- planning --------------------------------------------------------------
@dataclasses.dataclass
class PlanReport:
    """Everything `plan_graph` found; `as_dict` is the --json output."""

    graph: str
    kind: str
    training: bool
    notes: list
    num_ops: int
    num_edges: int
    num_levels: int
    trainable_parameters: int
    trainable_bytes: int
    variable_bytes: int
    batch_size: object
    budget_bytes: int
    without_lms: dict
    with_lms: dict
    lms_needed: bool
    tuned: bool
    selected: bool
    params: object
    swapped_tensors: int
    swapout_bytes: int
    swapin_bytes: int
    swapout_ops: int
    swapin_ops: int
    transfer_ms: dict
    step_time: dict
    plots: list
    fits: bool
    error: object = None
    oracle: object = None
    recomputed_tensors: int = 0
    recompute_bytes: int = 0
    recompute_ops: int = 0
    ordering_edges: list = dataclasses.field(default_factory=list)
    plots_missing: object = None

    def as_dict(self):
        return dataclasses.asdict(self)


def _peak(result, budget):
    return {
        "peak_bytes": int(result.peak_device_bytes),
        "peak_level": int(result.peak_level),
        "peak_op": result.peak_op,
        "fits": bool(result.fits(budget)),
        "largest_live": [[name, int(nbytes)]
                         for name, nbytes in result.live_at_peak[:3]],
    }


def _trainable(graph):
    with graph.as_default():
        variables = tf.compat.v1.trainable_variables()
    count = nbytes = 0
    for v in variables:
        if v.shape.is_fully_defined():
            n = v.shape.num_elements()
            count += n
            nbytes += n * v.dtype.base_dtype.size
    return count, nbytes


def transfer_ms(nbytes):
    """Milliseconds to move `nbytes` over each of `LINKS`, one direction."""
    return {name: nbytes / (gbps * 1e9) * 1e3 for name, gbps in LINKS}


def plan_graph(loaded, args, graph_name, progress=_silent):
    """Run LMS on the loaded graph and measure the result.

    The graph is rewritten by `LMS.run` as it would be before training;
    the report reads the plan and the simulations from its `RunResult`
    (`pipeline.plan`, the same steps every user of LMS runs).
    A plan that does not fit is reported (``fits`` False, and ``error``
    holds the auto-tuner's message when it found nothing).

    `progress(text)` is called at the start of each phase.

    Raises:
      autotune.NoGpuError, simulator.BatchSizeError, ValueError: bad input.
    """
    graph = loaded.graph
    lms = _lms_from_args(args, loaded)
    settings = lms.settings
    params_count, params_bytes = _trainable(graph)
    before = fetches = None
    if args.oracle:
        fetches = _oracle_fetches(graph)
        before = graph.as_graph_def()
    error = None
    progress("planning %s ops: index, roles, %s, rewrite ..." % (
        "{:,}".format(len(graph.get_operations())),
        "auto-tuning" if settings.autotune_requested
        else "plan with the given parameters"))
    try:
        run = lms.run(graph, fetches=loaded.fetches)
    except autotune.AutotuneError as e:
        run, error = None, str(e)
    if run is not None and run.planned is None:
        raise PlanError(
            "%s already has LMS's swap operations (saved after LMS rewrote "
            "it); plan the model as it was before LMS, or save it without "
            "the LMS callback or hook" % (graph_name,))
    if run is not None:
        planned = pipeline.simulate_plan(run.planned)
        without, with_lms = planned.without_lms, planned.with_lms
        index, roles = planned.index, planned.roles
        budget = planned.budget_bytes
    else:
        # Nothing fits: the report still shows the step without LMS (the
        # graph is unchanged).
        index = gi.build_index(graph, loaded.fetches)
        roles = pipeline.classify(index, settings)
        without = pipeline.simulate_without(index, roles, settings)
        with_lms = None
        budget = None
    if budget is None:
        budget = autotune.device_budget(settings.autotune_gpu_mem,
                                        settings.gpu_device)
    plan = run.plan if run is not None else None

    plots = []
    plots_missing = None
    if not args.no_plots:
        progress("writing plots to %s ..." % settings.plot_dir)
        plots = list(plotting.write_plots(
            settings.plot_dir, index, roles, without,
            with_lms if plan is not None else None, budget,
            batch_size=settings.batch_size))
        if not any(p.endswith(".png") for p in plots):
            plots_missing = plotting.MISSING_MATPLOTLIB

    swapout = plan.swapout_bytes() if plan else 0
    swapin = plan.swapin_bytes() if plan else 0
    params = None
    if plan is not None:
        p = plan.params
        params = {"swapout_threshold": p.swapout_threshold,
                  "swapin_ahead": p.swapin_ahead,
                  "swapin_groupby": p.swapin_groupby,
                  "sync_mode": p.sync_mode}
    shown = with_lms if plan is not None else without
    progress("predicting the step time ...")
    if run is not None:
        step = steptime.predict_planned(planned, gpu=settings.gpu,
                                        interconnect=settings.interconnect)
    else:
        step = steptime.StepTimeModel(
            index, roles, settings.batch_size, gpu=settings.gpu,
            interconnect=settings.interconnect).predict()
    step_time = _step_time(step, plan)
    oracle_peaks = None
    if args.oracle:
        progress("measuring with the oracle (Grappler's virtual GPU) ...")
        oracle_peaks = _oracle_peaks(
            fetches, before, graph.as_graph_def() if plan else None,
            settings.batch_size, budget, settings.gpu)
        if plan is not None:
            # The oracle replays copies as instant; the simulator's peak
            # above counts them at the interconnect. Its count with
            # instant copies is the one to set beside the oracle's.
            oracle_peaks["with_lms"]["simulator_instant_peak_bytes"] = int(
                pipeline.instant_replay(planned).peak_device_bytes)
    return PlanReport(
        graph=graph_name, kind=loaded.kind, training=settings.is_training,
        notes=list(loaded.notes),
        num_ops=index.num_ops, num_edges=index.num_edges,
        num_levels=run.planned.original_num_levels if run else
        index.num_levels,
        trainable_parameters=params_count, trainable_bytes=params_bytes,
        variable_bytes=int(sum(index.variable_bytes)),
        batch_size=settings.batch_size, budget_bytes=int(budget),
        without_lms=_peak(without, budget), with_lms=_peak(shown, budget),
        lms_needed=plan is not None, tuned=settings.autotune_requested,
        params=params,
        selected=bool(plan is not None and run.planned.only_tensors
                      is not None),
        swapped_tensors=len(plan.swaps) if plan else 0,
        swapout_bytes=int(swapout), swapin_bytes=int(swapin),
        swapout_ops=len(run.swapout_ops) if run else 0,
        swapin_ops=len(run.swapin_ops) if run else 0,
        transfer_ms=transfer_ms(swapout + swapin),
        step_time=step_time,
        plots=[os.path.abspath(p) for p in plots],
        plots_missing=plots_missing,
        fits=error is None and bool(shown.fits(budget)), error=error,
        oracle=oracle_peaks,
        recomputed_tensors=len(plan.recomputes) if plan else 0,
        recompute_bytes=int(plan.recompute_bytes()) if plan else 0,
        recompute_ops=len(run.rewrite.recompute_ops)
        if run and run.rewrite else 0,
        ordering_edges=[[run.planned.index.names[a],
                         run.planned.index.names[b]]
                        for a, b in run.planned.ordering_edges]
        if run else [])


def _step_time(step, plan):
    """The step-time model's prediction for the report (milliseconds)."""
    return {
        "gpu": step.gpu,
        "interconnect": steptime.interconnect_named(step.interconnect).label,
        "without_lms_ms": step.without_lms_s * 1e3,
        "with_lms_ms": None if plan is None else step.with_lms_s * 1e3,
        "exposed_transfer_ms": (None if plan is None
                                else step.exposed_transfer_s * 1e3),
    }


def _static_batch(graph_def, fetches, batch_size):
    """`graph_def` with the unknown first dimension of every placeholder the
    step reads (those `fetches` depend on) set to `batch_size`, so that
    Grappler knows every tensor's size."""
    if batch_size is None:
        return graph_def
    fixed = type(graph_def)()
    fixed.CopyFrom(graph_def)
    nodes = {node.name: node for node in fixed.node}
    seen, todo = set(), list(fetches)
    while todo:
        name = todo.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        todo.extend(i.lstrip("^").split(":")[0] for i in nodes[name].input)
    for name in seen:
        node = nodes[name]
        if node.op in ("Placeholder", "PlaceholderWithDefault") and \
                "shape" in node.attr:
            dims = node.attr["shape"].shape.dim
            if dims and dims[0].size == -1:
                dims[0].size = batch_size
    return fixed


def _oracle_fetches(graph):
    """Names of the graph's train ops, which one oracle step runs."""
    names = [op.name for op in graph.get_collection(
        tf.compat.v1.GraphKeys.TRAIN_OP) if isinstance(op, tf.Operation)]
    if not names:
        raise PlanError(
            "--oracle needs the op that runs one training step: the graph "
            "has no train_op collection (tf.compat.v1.add_to_collection("
            "tf.compat.v1.GraphKeys.TRAIN_OP, train_op) before saving)")
    return names


def _oracle_peaks(fetches, before, rewritten, batch_size, budget, gpu):
    """The oracle's GPU peaks of one step without LMS (`before`, a GraphDef)
    and with it (`rewritten`, the GraphDef LMS edited, or None), each as the
    runtime replay and as Grappler's own count, on the virtual GPU of
    `gpu` (a `hardware.GPUS` name: the --gpu setting)."""
    # Imported here: the oracle loads Grappler's private modules.
    from tflms import oracle  # pylint: disable=import-outside-toplevel
    out = {}
    for label, graph_def in (("without_lms", before),
                             ("with_lms", rewritten)):
        if graph_def is None:
            continue
        result = oracle.peak_memory(_static_batch(graph_def, fetches,
                                                  batch_size),
                                    fetches, budget, gpu=gpu)
        out[label] = {
            "runtime_peak_bytes": int(result.runtime_gpu_peak_bytes),
            "grappler_peak_bytes": int(result.raw_gpu_peak_bytes),
            "fits": bool(result.runtime_gpu_peak_bytes <= budget)}
    return out


# ---- output ----------------------------------------------------------------
def _gib(nbytes):
    if abs(nbytes) < _GIB:
        return "%.1f MiB" % (nbytes / _MIB)
    return "%.3f GiB" % (nbytes / _GIB)


def _mem_ratio_text():
    return "%g" % autotune.mem_ratio()


def render(report, args):
    """The human-readable report, as a list of lines."""
    r = report
    lines = ["tflms plan: %s (%s)" % (r.graph, r.kind)]
    lines.extend("  " + note for note in r.notes)
    if r.training:
        lines.append("Training graph: forward and backward phase (one "
                     "training step is planned).")
    else:
        lines.append("No backward phase (no gradient or optimizer ops): "
                     "nothing is trained; planning one inference step "
                     "(is_training=False).")
    lines.append("Graph: %d ops, %d edges, %d levels; %s trainable "
                 "parameters (%s); all variables incl. optimizer slots %s"
                 % (r.num_ops, r.num_edges, r.num_levels,
                    "{:,}".format(r.trainable_parameters),
                    _gib(r.trainable_bytes), _gib(r.variable_bytes)))
    lines.append("Batch size: %s" % (r.batch_size if r.batch_size else
                                     "not given (shapes must be static)"))
    source = ("--autotune-gpu-mem %g GiB" % args.autotune_gpu_mem
              if args.autotune_gpu_mem
              else "the GPU's memory")
    lines.append("Device budget: %s = %s x %s (TF_LMS_SIMULATOR_MEM_RATIO)"
                 % (_gib(r.budget_bytes), source, _mem_ratio_text()))
    lines.append("")
    lines.append("Expected device memory peak of one step (simulator):")
    rows = [("without LMS", r.without_lms)]
    if r.error is None:
        rows.append(("with LMS", r.with_lms))
    for label, peak in rows:
        lines.append("  %-12s %10s  %-13s at level %d (%s)" % (
            label + ":", _gib(peak["peak_bytes"]),
            "fits" if peak["fits"] else "does NOT fit", peak["peak_level"],
            peak["peak_op"]))
    if r.error is not None:
        lines.append("  with LMS:    no plan fits (below)")
    if r.without_lms["largest_live"]:
        lines.append("  largest tensors live at the peak without LMS: " +
                     ", ".join("%s %s" % (name, _gib(n)) for name, n in
                               r.without_lms["largest_live"]))
    if r.oracle:
        lines.append("Oracle (Grappler's virtual GPU; runtime buffer rules, "
                     "and Grappler's own count with every Identity and "
                     "Reshape a new buffer):")
        for label, key in (("without LMS", "without_lms"),
                           ("with LMS", "with_lms")):
            peak = r.oracle.get(key)
            if peak is not None:
                instant = peak.get("simulator_instant_peak_bytes")
                lines.append("  %-12s %10s  %-13s (Grappler's count %s%s)" % (
                    label + ":", _gib(peak["runtime_peak_bytes"]),
                    "fits" if peak["fits"] else "does NOT fit",
                    _gib(peak["grappler_peak_bytes"]),
                    "" if instant is None else
                    "; simulator with copies instant, as the oracle "
                    "replays them: %s" % _gib(instant)))
    lines.append("")
    if r.error is not None:
        lines.append("LMS could not make one step fit: " + r.error)
    elif not r.lms_needed:
        lines.append("LMS is not needed: one step fits the budget without "
                     "swapping. Nothing would be swapped.")
    else:
        p = r.params
        how = "auto-tuned" if r.tuned else "as given"
        lines.append("LMS parameters (%s): LMS(swapout_threshold=%d, "
                     "swapin_ahead=%d, swapin_groupby=%d, sync_mode=%d)"
                     % (how, p["swapout_threshold"], p["swapin_ahead"],
                        p["swapin_groupby"], p["sync_mode"]))
        if r.selected:
            lines.append("  The auto-tuner chose which tensors to swap; set "
                         "by hand, these parameters would swap every tensor "
                         "past the threshold (more bytes).")
        lines.append("Swapped per step: %d tensors; %s out to the host (%d "
                     "swap-outs) and %s back in (%d swap-ins), %s moved"
                     % (r.swapped_tensors, _gib(r.swapout_bytes),
                        r.swapout_ops, _gib(r.swapin_bytes), r.swapin_ops,
                        _gib(r.swapout_bytes + r.swapin_bytes)))
        if r.recomputed_tensors:
            lines.append("Recomputed per step instead of swapped: %d tensors "
                         "(%s), made again by %d cloned operations just "
                         "before their far readers"
                         % (r.recomputed_tensors, _gib(r.recompute_bytes),
                            r.recompute_ops))
        if r.ordering_edges:
            # Kept when nothing fitted without them, or when they gave a
            # plan a shorter step than synchronous swap-ins.
            lines.append("Ordered at the memory peaks (docs/autotuning.md, "
                         "step 8): %d control edges, first op before "
                         "second:" % len(r.ordering_edges))
            for first, then in r.ordering_edges:
                lines.append("  %s before %s" % (first, then))
        lines.append("Predicted transfer time per step (bytes moved / link "
                     "bandwidth per direction):")
        for name, gbps in LINKS:
            lines.append("  %-36s %6.2f GB/s  %10.2f ms"
                         % (name, gbps, r.transfer_ms[name]))
        lines.append("  (theoretical peak rates; copies overlap with compute "
                     "when asynchronous, and a full-duplex link can move "
                     "swap-outs and swap-ins at the same time)")
    t = r.step_time
    lines.append("Predicted step time on %s, copies over %s (step-time "
                 "model: peak rates, one op at a time):"
                 % (t["gpu"], t["interconnect"]))
    lines.append("  without LMS: %10.2f ms" % t["without_lms_ms"])
    if t["with_lms_ms"] is not None:
        lines.append("  with LMS:    %10.2f ms  (exposed transfer time "
                     "%.2f ms)" % (t["with_lms_ms"],
                                   t["exposed_transfer_ms"]))
    if r.plots_missing:
        lines.append("")
        lines.append("Memory plots NOT written: %s. Written instead:"
                     % r.plots_missing)
        lines.extend("  " + path for path in r.plots)
    elif r.plots:
        lines.append("")
        lines.append("Memory plots written:")
        lines.extend("  " + path for path in r.plots)
    lines.append("")
    if r.fits:
        lines.append("RESULT: fits in %s %s." % (
            _gib(r.budget_bytes),
            "with LMS" if r.lms_needed else "without LMS"))
    elif r.error is not None:
        lines.append("RESULT: does NOT fit in %s, with or without LMS."
                     % _gib(r.budget_bytes))
    else:
        lines.append("RESULT: does NOT fit in %s: the plan needs %s. Try %s."
                     % (_gib(r.budget_bytes), _gib(r.with_lms["peak_bytes"]),
                        ", ".join(_untried(args))))
    return lines


def _untried(args):
    """What `plan` could still try when the plan it made does not fit: only
    the flags the command line did not already set that way."""
    hints = ["a smaller --batch-size"]
    if not (getattr(args, "serialization", None)
            or getattr(args, "serialization_by_size", None)):
        hints.append("--serialization or --serialization-by-size")
    if getattr(args, "sync_mode", None) != 3:
        hints.append("--sync-mode 3")
    fixed = [flag for name, flag in (
        ("swapout_threshold", "--swapout-threshold"),
        ("swapin_ahead", "--swapin-ahead"),
        ("swapin_groupby", "--swapin-groupby"))
        if getattr(args, name, None) not in (S.AUTO, None)]
    if fixed:
        hints.append("%s at -1 (auto) instead of fixed" % " and ".join(fixed))
    if len(hints) > 1:
        hints[-1] = "or " + hints[-1]
    return hints


def _run_command(args, work):
    """Set up a command's own process, run ``work()`` and turn the errors a
    user can fix into one line on stderr and exit status 2."""
    # Keras builds its training graph only in graph mode; this is the
    # command's own process, not a library import.
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(
        tf.compat.v1.logging.INFO if args.verbose
        else tf.compat.v1.logging.ERROR)
    prefix = "tflms %s: error:" % args.command
    try:
        return work()
    except autotune.NoGpuError as e:
        print("%s %s For this command: pass --autotune-gpu-mem <GiB of the "
              "GPU you plan for>." % (prefix, e), file=sys.stderr)
    except simulator.BatchSizeError as e:
        print("%s %s. For this command: pass --batch-size N." % (prefix, e),
              file=sys.stderr)
    except (PlanError, ValueError) as e:
        print("%s %s" % (prefix, e), file=sys.stderr)
    return EXIT_ERROR


def _plan_command(args):
    def work():
        progress = _Progress(args.command, args.progress)
        progress("loading %s ..." % args.graph)
        loaded = load_graph(args.graph, args)
        report = plan_graph(loaded, args, args.graph, progress)
        progress("done")
        if args.json:
            print(json.dumps(report.as_dict(), indent=1, sort_keys=True))
        else:
            print("\n".join(render(report, args)))
        return EXIT_FITS if report.fits else EXIT_DOES_NOT_FIT
    return _run_command(args, work)


def _lms_from_args(args, loaded=None):
    """An `LMS` with the command line's settings (`settings.from_arguments`);
    for a loaded graph without a backward phase, or with --inference, it
    plans for inference."""
    overrides = {}
    if loaded is not None:
        overrides["is_training"] = loaded.training and not args.inference
    return _lms.LMS.from_settings(S.from_arguments(args, **overrides))


def render_verify(report):
    """The lines `tflms verify` prints."""
    lines = ["oneDNN: %s" % ("on" if report.onednn else "off"),
             "Steps: %d with and without LMS" % report.steps]
    if report.losses_without:
        lines.append("Losses without LMS: %s" % ", ".join(
            "%.8g" % x for x in report.losses_without))
        lines.append("Losses with LMS:    %s" % ", ".join(
            "%.8g" % x for x in report.losses_with))
    lines.append("Variables compared: %d; largest difference %.3g" % (
        report.variables, report.max_abs_difference))
    if report.global_step is not None:
        lines.append("Global step advanced: %d without LMS, %d with LMS" %
                     report.global_step)
    lines.append("Swap ops that ran: %d of the %d LMS added" % (
        report.swap_ops_ran, report.swap_ops))
    if report.kernels_differ:
        lines.append(
            "TensorFlow fused differently with the swap ops (float rounding "
            "may differ; see --rtol): %s" % ", ".join(
                "%s %d->%d" % (k, a, b)
                for k, (a, b) in report.kernels_differ.items()))
    for name in report.different[:10]:
        lines.append("DIFFERENT: %s" % name)
    if report.ops_not_run:
        lines.append("NOT RUN with LMS (ran without it): %s" % ", ".join(
            report.ops_not_run[:10]))
    if report.swap_ops_not_run:
        lines.append("Swap ops that did not run: %s" % ", ".join(
            report.swap_ops_not_run[:10]))
    if report.swap_ops_removed:
        lines.append("Swap ops TensorFlow's graph optimizer removed: %s"
                     % ", ".join(report.swap_ops_removed[:10]))
    lines.append("Ops the training step runs with LMS and did not run "
                 "without it, other than LMS's own: %s" % (
                     ", ".join(report.ops_entering_step[:10])
                     if report.ops_entering_step else "none"))
    lines.append("VERDICT: %s" % (
        "PASS - training with LMS matched training without it"
        if report.ok else "FAIL - training with LMS differed"))
    return lines


def _verify_command(args):
    from tflms import verify as verifying  # pylint: disable=import-outside-toplevel

    def work():
        report = verifying.verify(
            lambda: load_graph(args.graph, args).graph, _lms_from_args(args),
            steps=args.steps, batch_size=args.batch_size,
            train_op_names=args.train_op, loss_name=args.loss_tensor,
            rtol=args.rtol)
        if args.json:
            print(json.dumps(dataclasses.asdict(report), indent=1,
                             sort_keys=True))
        else:
            print("\n".join(render_verify(report)))
        return 0 if report.ok else 1
    return _run_command(args, work)


def _quieten_tensorflow(args):
    """For the command's own process: TensorFlow's C++ INFO and WARNING
    lines hidden (``TF_CPP_MIN_LOG_LEVEL=2``) unless the user set the
    variable or asked for --verbose. Only before TensorFlow is imported,
    which reads the variable once."""
    if not args.verbose and "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None, program=False):
    """Entry point of ``tflms`` and ``python -m tflms``.

    Args:
      argv: the arguments (default: ``sys.argv[1:]``).
      program: True when this is the process's own program (`__main__`),
        which may then quieten TensorFlow's logging for itself; callers in
        a library process leave it False.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if program:
        _quieten_tensorflow(args)
    if args.command == "plan":
        return _plan_command(args)
    if args.command == "verify":
        return _verify_command(args)
    parser.error("unknown command %r" % args.command)
    return EXIT_ERROR
