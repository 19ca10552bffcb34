"""The original TFLMSv2 (IBM), run beside tflms on the same graphs.

IBM's TensorFlow Large Model Support v2 is public
(https://github.com/IBM/tensorflow-large-model-support, branch ``tflmsv2``:
the ``tensorflow_large_model_support`` package, class ``LMS``). None of its
code is in this repository: `load` imports it from a checkout the user
names, with ``--tflmsv2 PATH`` (this script, ``benchmarks/run.py``) or the
environment variable ``TFLMSV2_PATH`` (what the benchmark workers read).
Without it the capacity benchmark says "not measured: TFLMSV2_PATH not set"
in every TFLMSv2 cell.

`apply` edits a `benchmarks.models.Built` graph as its README tells a
Session user to: ``LMS()`` with every swap parameter on auto,
``lms.batch_size`` the mini-batch, ``lms.autotune_gpu_mem`` the budget in
GiB, then ``lms.run(graph)`` (what its ``SessionRunHook.begin`` calls, with
the graph as the default graph). The caller judges the rewritten graph with
`benchmarks.measure.oracle_peaks`, exactly as it judges tflms.

What share of the budget TFLMSv2 plans for (its ``simulator.py``,
``Simulator._initialize``): the budget minus the bytes of
``tf.trainable_variables()``, times ``TF_LMS_SIMULATOR_MEM_RATIO`` (default
0.9; 0.8 when ``DDL_OPTIONS`` is set). tflms reads the same variable, so
``benchmarks/run.py --mem-ratio`` sets both. Its simulator then counts every
op of the graph that is not on a CPU (not only the step's), skips the ops
named like trainable variables, and rejects a plan when one allocation
reaches the free memory. The row `apply` returns carries that count
(``v2_sim_peak``: its largest total over the chosen plan's replay, plus the
trainable variables it subtracted) so that it can be set beside the oracle.

Shims (each applied only while TFLMSv2 is imported or runs; none of its
files is edited):

* ``tf.compat.v1.disable_v2_behavior`` is a no-op while its modules are
  imported. Each of its four modules calls it at import time, which would
  switch the whole process to v1 control flow, reference variables and v1
  shapes, so that graphs built afterwards would not be the graphs tflms is
  given (`benchmarks.common.setup_tensorflow` chooses the mode).
* v1 tensor shapes while ``LMS.run`` runs (``disable_v2_tensorshape``, put
  back afterwards): it reads ``tensor.shape[i].value``, which only a v1
  ``Dimension`` has (a v2 shape yields plain ints). This changes how shapes
  are read, not the graph.
* TensorFlow's Python logger is raised to INFO and its output collected
  while ``LMS.run`` runs: TFLMSv2 reports through ``tf.logging.info``
  (including "LMS is not necessary"), which the workers silence. The last
  lines are kept in the row (``log``).

Instrumentation (not a shim): ``lms.Simulator`` in the loaded module is
replaced by a subclass that records each ``play`` (parameters, verdict, its
largest count) so that the chosen plan's predicted peak can be reported.

Everything else ran unchanged on TensorFlow 2.15.1 with Python 3.11
(``distutils.version.LooseVersion`` and ``six`` are still importable; the
private ``Operation._update_input``, ``_add_control_inputs`` and
``_set_attr`` it calls still exist).

Command line (one probe: build, TFLMSv2 or tflms, oracle)::

    python benchmarks/tflmsv2.py --tflmsv2 /path/to/checkout \\
        --model keras_app --kwargs '{"app": "ResNet50"}' --dimension image \\
        --sizes 6720,7360 --budget-gib 16 --methods tflmsv2,tflms

Capacity searches with TFLMSv2 run through the capacity benchmark
(`benchmarks.capacity`, method ``tflmsv2``).
"""

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

__all__ = ["ENV_VAR", "NOT_SET", "PACKAGE", "path_from", "load", "apply"]

ENV_VAR = "TFLMSV2_PATH"
NOT_SET = "not measured: %s not set" % ENV_VAR
PACKAGE = "tensorflow_large_model_support"

# The log lines of one run kept in a row.
_LOG_LINES = 12

_loaded = {}  # checkout root -> the loaded lms module


def path_from(arg=None):
    """The TFLMSv2 checkout to use: `arg` (a ``--tflmsv2`` value) if given,
    else ``$TFLMSV2_PATH``; None when neither is set."""
    return arg or os.environ.get(ENV_VAR) or None


def _root_of(path):
    """The folder holding the ``tensorflow_large_model_support`` package:
    `path` itself, or its parent when `path` is the package."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isfile(os.path.join(path, PACKAGE, "lms.py")):
        return path
    if os.path.basename(path.rstrip(os.sep)) == PACKAGE and \
            os.path.isfile(os.path.join(path, "lms.py")):
        return os.path.dirname(path.rstrip(os.sep))
    raise ValueError(
        "%s (or --tflmsv2) must name a checkout of IBM's "
        "tensorflow-large-model-support, branch tflmsv2, or its %s folder; "
        "no %s/lms.py under %r" % (ENV_VAR, PACKAGE, PACKAGE, path))


@contextlib.contextmanager
def _v2_behavior_kept():
    """Shim: TFLMSv2's import-time ``disable_v2_behavior()`` does nothing."""
    import tensorflow.compat.v1 as v1
    original = v1.disable_v2_behavior
    v1.disable_v2_behavior = lambda: None
    try:
        yield
    finally:
        v1.disable_v2_behavior = original


@contextlib.contextmanager
def _v1_shapes():
    """Shim: v1 `TensorShape` (``shape[i].value``) while TFLMSv2 runs."""
    from tensorflow.python.framework import tensor_shape
    was_v2 = tensor_shape._TENSORSHAPE_V2_OVERRIDE
    tensor_shape.disable_v2_tensorshape()
    try:
        yield
    finally:
        if was_v2:
            tensor_shape.enable_v2_tensorshape()
        else:
            tensor_shape._TENSORSHAPE_V2_OVERRIDE = was_v2


class _Collector(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _collected_log():
    """Shim: TensorFlow's logger at INFO, its records collected, not
    printed. Yields the list of lines."""
    from tensorflow.python.platform import tf_logging
    logger = tf_logging.get_logger()
    level, handlers, propagate = logger.level, logger.handlers[:], \
        logger.propagate
    collector = _Collector()
    logger.handlers = [collector]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield collector.lines
    finally:
        logger.handlers = handlers
        logger.propagate = propagate
        logger.setLevel(level)


def _recording_simulator(base):
    """A subclass of TFLMSv2's ``Simulator`` recording every ``play`` on
    the LMS object it simulates for (``_bench_plays``)."""

    class Recording(base):
        def play(self, threshold, ahead, groupby, sync_mode):
            passed, warning = super().play(threshold, ahead, groupby,
                                           sync_mode)
            plays = getattr(self._lms, "_bench_plays", None)
            if plays is not None:
                plays.append({
                    "params": [threshold, ahead, groupby, sync_mode],
                    "passed": bool(passed),
                    "peak": int(max(self._mem_traces, default=0)),
                    "planned_for": int(self._max_mem),
                })
            return passed, warning

    return Recording


def load(path):
    """The ``tensorflow_large_model_support.lms`` module of the checkout at
    `path`, imported with the shims of this module's docstring.

    Raises:
      ValueError: `path` holds no TFLMSv2 package (or the master branch's
        TFLMS for TensorFlow 2 patches, which has no ``LMS`` class).
    """
    root = _root_of(path)
    if root in _loaded:
        return _loaded[root]
    held = sys.modules.get(PACKAGE)
    if held is not None:
        where = os.path.dirname(os.path.dirname(os.path.abspath(
            held.__file__)))
        if where != root:
            raise ValueError("%s is already imported from %s; cannot load "
                             "%s too" % (PACKAGE, where, root))
    sys.path.insert(0, root)
    try:
        with _v2_behavior_kept():
            module = importlib.import_module(PACKAGE + ".lms")
    finally:
        sys.path.remove(root)
    lms_class = getattr(module, "LMS", None)
    if lms_class is None or not hasattr(lms_class, "autotune_gpu_mem"):
        raise ValueError("%s under %s is not TFLMSv2 (no LMS class with "
                         "autotune_gpu_mem); check out branch tflmsv2"
                         % (PACKAGE, root))
    module.Simulator = _recording_simulator(module.Simulator)
    _loaded[root] = module
    return module


def _bytes_of(tensors, batch_size, util):
    return int(sum(util.get_tensor_size(t, batch_size) for t in tensors))


def apply(built, budget_gib, path=None):
    """Rewrite `built.graph` in place with TFLMSv2 auto-tuned to
    `budget_gib`.

    Args:
      built: a `benchmarks.models.Built`.
      budget_gib: ``LMS.autotune_gpu_mem`` (GiB).
      path: the checkout (default `path_from()`).

    Returns:
      dict with status ("swapped", "not needed" or "no plan"), edit_s,
      params (``[swapout_threshold, swapin_ahead, swapin_groupby,
      sync_mode]`` it chose), swap_outs, swap_ins, swapout_bytes,
      swapin_bytes (its own size rule), v2_sim_peak (its simulator's count
      for the chosen plan plus the trainable variables), v2_planned_for
      (the activations budget it planned for plus those variables),
      trainable_bytes, plays (simulator runs), log (its last lines) and,
      for "no plan", error (its message).

    Raises:
      ValueError: no checkout given or found (see `load`).
    """
    where = path_from(path)
    if where is None:
        raise ValueError(NOT_SET + "; give --tflmsv2 PATH or set %s"
                         % ENV_VAR)
    module = load(where)
    util = importlib.import_module(PACKAGE + ".util")
    lms = module.LMS()
    lms.batch_size = built.batch_size
    lms.autotune_gpu_mem = budget_gib
    lms._bench_plays = []
    row = {"status": None, "params": None, "swap_outs": 0, "swap_ins": 0,
           "swapout_bytes": 0, "swapin_bytes": 0}
    start = time.perf_counter()
    with _collected_log() as log, _v1_shapes(), built.graph.as_default():
        try:
            lms.run(built.graph)
            # Its tuner marks "no LMS needed" by a threshold of every level.
            needed = lms._swapout_threshold != lms._topo_sort.size
            row["status"] = "swapped" if needed else "not needed"
        except ValueError as err:
            if "Auto-tuning" not in str(err):
                raise
            row["status"] = "no plan"
            row["error"] = str(err)
        trainable = _bytes_of(
            built.graph.get_collection("trainable_variables"),
            built.batch_size, util)
        if lms._swap_ops:
            outs = {s[1] for s in lms._swap_ops}
            ins = {s[2] for s in lms._swap_ops}
            row.update(
                swap_outs=len(outs), swap_ins=len(ins),
                swapout_bytes=_bytes_of([t for o in outs for t in o.outputs],
                                        built.batch_size, util),
                swapin_bytes=_bytes_of([t for o in ins for t in o.inputs],
                                       built.batch_size, util))
    row["edit_s"] = time.perf_counter() - start
    plays = lms._bench_plays
    if row["status"] == "swapped":
        row["params"] = [lms._swapout_threshold, lms._swapin_ahead,
                         lms._swapin_groupby, lms._sync_mode]
    passed = [p for p in plays if p["passed"]]
    chosen = passed if row["status"] == "not needed" else [
        p for p in passed if p["params"] == row["params"]]
    if not chosen and row["params"]:
        # In a swap-in sync mode it leaves ahead and groupby at -1; the
        # plan is the last one played with its threshold and mode.
        chosen = [p for p in passed
                  if p["params"][::3] == row["params"][::3]]
    if chosen:
        row["v2_sim_peak"] = chosen[-1]["peak"] + trainable
    if plays:
        row["v2_planned_for"] = plays[0]["planned_for"] + trainable
    row["trainable_bytes"] = trainable
    row["plays"] = len(plays)
    row["log"] = [l for l in log if "[LMS]" in l][-_LOG_LINES:]
    return row


def measured(built, budget_gib, path=None):
    """`apply`, then the oracle's runtime replay of the rewritten graph
    unless TFLMSv2 found no plan ("no plan"): the capacity search's probe
    of the original."""
    from benchmarks import measure
    row = apply(built, budget_gib, path)
    if row["status"] != "no plan":
        row.update(measure.oracle_peaks(built.graph, built.train_op))
    return row


def probe(method, model, kwargs, budget_gib, path=None):
    """One capacity probe outside the benchmark runner: build `model` with
    `kwargs`, apply `method` ("tflmsv2", "tflms" or "none") and judge it with
    the oracle's runtime replay, as `benchmarks.capacity.measure_probe`
    does."""
    from benchmarks import measure, models
    start = time.perf_counter()
    built = models.build(model, **kwargs)
    row = (measured(built, budget_gib, path) if method == "tflmsv2"
           else measure.probe_peaks(method, built, budget_gib))
    row["probe_s"] = time.perf_counter() - start
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Capacity probes of IBM's TFLMSv2 beside tflms: build a "
        "model, rewrite it, judge it with the oracle's runtime replay.")
    parser.add_argument("--tflmsv2", default=None,
                        help="checkout of IBM's tensorflow-large-model-"
                        "support, branch tflmsv2 (default $%s)" % ENV_VAR)
    parser.add_argument("--model", required=True,
                        help="a benchmarks.models builder name")
    parser.add_argument("--kwargs", default="{}",
                        help="builder keyword arguments, JSON")
    parser.add_argument("--dimension", default="image",
                        help="image, volume, batch or seq")
    parser.add_argument("--sizes", required=True,
                        help="comma-separated sizes of the dimension")
    parser.add_argument("--budget-gib", type=float, default=16.0)
    parser.add_argument("--methods", default="tflmsv2,tflms",
                        help="comma-separated: tflmsv2, tflms, none")
    parser.add_argument("--control-flow", default="v2", choices=("v1", "v2"))
    args = parser.parse_args(argv)
    path = path_from(args.tflmsv2)
    if path is not None:
        os.environ[ENV_VAR] = path
    from benchmarks import common, models
    common.setup_tensorflow(args.control_flow)
    budget = int(args.budget_gib * common.GIB)
    key = models.size_key(args.dimension)
    for size in [int(s) for s in args.sizes.split(",") if s.strip()]:
        for method in [m.strip() for m in args.methods.split(",")]:
            kwargs = dict(json.loads(args.kwargs), **{key: size})
            row = probe(method, args.model, kwargs, args.budget_gib, path)
            row.update(size=size, method=method, budget=budget)
            row.pop("top", None)
            print(json.dumps(row, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
