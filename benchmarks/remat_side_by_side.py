"""The longest sequence a GPU trains without LMS, with Keras's own
rematerialization (``keras.RematScope``) and with LMS, side by side
(issue 47, item 6; TensorFlow 2.16+ with Keras 3 and KerasHub).

    env -u TF_USE_LEGACY_KERAS TF_ENABLE_ONEDNN_OPTS=0 \
        python benchmarks/remat_side_by_side.py [--family gpt2 llama] \
        [--batch 8] [--gpu-mem 16] [--step 128] [--lo 128] [--hi 4096] \
        [--columns none full activations larger_than list_of_layers lms] \
        [--size small|tiny] [--oracle]

Each family is built as `transformer_plan_time.build` builds it (GPT-2
small's published config; the others at its depth and width; random
weights), for sequences up to ``--hi``, and ``model.train_step`` is traced
by ``tf.function`` at batch ``--batch`` and each length a bisection over
multiples of ``--step`` in [``--lo``, ``--hi``] asks about (so the longest
is found to within ``--step`` tokens). The columns:

* ``none``: the step as Keras makes it, judged by tflms's simulator
  (one step's device peak, `pipeline.simulate_without`) against the budget
  LMS plans for (``--gpu-mem`` times ``TF_LMS_SIMULATOR_MEM_RATIO``, 0.9);
* a ``keras.RematScope`` mode: the model built inside the scope
  (``larger_than`` with ``output_size_threshold`` = ``--threshold``;
  ``list_of_layers`` naming every transformer block), judged as ``none``;
  a mode whose step cannot be traced by ``tf.function`` is reported with
  TensorFlow's message;
* ``lms``: the step planned by auto-tuning for the same budget
  (`capacity.plan_row`, what ``tflms capacity --dimension sequence``
  runs), the predicted step time with LMS against the step without it at
  the same length (V100, PCIe 4.0: `Settings.gpu`, `interconnect`).

With ``--oracle`` the longest length of each column is measured again by
the oracle's runtime replay (`tflms.tf.oracle`; the LMS column's rewritten
graph), about a minute each at GPT-2 small's size. Each column runs in a
process of its own.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import common  # noqa: E402
from benchmarks import transformer_plan_time as models  # noqa: E402

REMAT_MODES = ("full", "activations", "larger_than", "list_of_layers")
COLUMNS = ("none",) + REMAT_MODES + ("lms",)
# The transformer blocks of each family, for mode="list_of_layers".
_BLOCK = re.compile(r"(transformer_layer|transformer_decoder|"
                    r"decoder_block)_\d+$")


def _scope(keras, mode, threshold):
    """The `keras.RematScope` of `mode` (None: no scope)."""
    if mode == "larger_than":
        return keras.RematScope(mode=mode, output_size_threshold=threshold)
    if mode == "list_of_layers":
        return keras.RematScope(mode=mode, layer_names=_block_names)
    return keras.RematScope(mode=mode)


_block_names = []


def build(family, args, column):
    """The compiled model of `family` for `column`."""
    import keras
    if column not in REMAT_MODES:
        return models.build(family, args.hi, args.size)
    if column == "list_of_layers":
        # The blocks' names, from the same model built without the scope.
        plain = models.build(family, args.hi, args.size)
        _block_names[:] = [layer.name for layer in plain.backbone.layers
                           if _BLOCK.search(layer.name)]
        keras.backend.clear_session()
    with _scope(keras, column, args.threshold):
        return models.build(family, args.hi, args.size)


def error_line(err):
    """The line of `err`'s message that says what went wrong (Keras puts
    it in bold inside a long traceback)."""
    text = str(err)
    bold = re.search(r"\x1b\[1m(.*?)\x1b\[0m", text, re.S)
    if bold:
        return " ".join(bold.group(1).split())
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "%s: %s" % (type(err).__name__, lines[-1] if lines else "")


def probe(model, family, column, seq, args):
    """One length: a dict with ``fits``, ``peak`` (bytes) and, for LMS,
    the predicted steps; the traced graph under ``graph``."""
    import tensorflow as tf
    from tflms import LMS
    from tflms import capacity
    from tflms import pipeline
    from tflms import steptime
    from tflms.tf import live_capacity
    from tflms.tf.adapters import graph_step, tf_function
    began = time.process_time()
    concrete = tf.function(model.train_step, jit_compile=False) \
        .get_concrete_function(models.signature(family, seq, args.batch))
    _, index = tf_function.step_of(concrete.graph)
    lms = LMS()
    lms.autotune_gpu_mem = args.gpu_mem
    lms.autotune_host_mem = common.SERVER_HOST_MEM_GIB
    lms.batch_size = args.batch
    settings = lms.settings
    budget = live_capacity.budget_of(settings)
    # Planned for a GPU: oneDNN's CPU passes merge nothing there.
    target = graph_step.step_target(settings, here=False)
    roles = pipeline.classify(index, settings, target)
    out = {"seq": seq, "graph": concrete.graph}
    if column == "lms":
        row = capacity.plan_row(index, roles, settings, args.batch,
                                sequence=seq, target=target)
        out.update(fits=row.fits_with, peak=row.peak_with_bytes,
                   smallest=row.smallest_peak_bytes,
                   step_with_ms=row.step_with_ms,
                   step_without_ms=row.step_without_ms)
    else:
        without = pipeline.simulate_without(index, roles, settings)
        step = steptime.StepTimeModel(
            index, roles, args.batch, gpu=settings.gpu,
            interconnect=settings.interconnect).predict()
        out.update(fits=bool(without.fits(budget)),
                   peak=int(without.peak_device_bytes),
                   step_without_ms=step.without_lms_s * 1e3)
    out["cpu_s"] = time.process_time() - began
    out["lms"] = lms
    return out


def _oracle(found, column):
    """The oracle's runtime peak of the probe `found` (for LMS, of its
    graph rewritten by the plan)."""
    from benchmarks import transformer_plans
    from tflms.tf.adapters import graph_step, rewrite
    graph = found["graph"]
    if column == "lms":
        settings = found["lms"].settings
        rewrite.rewrite_function_graph(graph, settings, target=(
            graph_step.step_target(settings, here=False)))
    peak, _ = transformer_plans._oracle_peak(graph)
    return peak


def search_column(family, column, args):
    """The column's result (a dict): the longest length that fits, each
    probe, or the error that stopped it."""
    import keras
    keras.backend.clear_session()
    result = {"family": family, "column": column, "probes": []}
    try:
        model = build(family, args, column)
    except Exception as err:  # a scope Keras refuses: the column's result
        result["error"] = error_line(err)
        return result
    lo, hi = args.lo // args.step, args.hi // args.step
    best = None  # the longest probe that fit
    while lo <= hi:
        mid = (lo + hi) // 2
        try:
            found = probe(model, family, column, mid * args.step, args)
        except Exception as err:  # tracing refused: the column's result
            result["error"] = error_line(err)
            return result
        shown = {k: v for k, v in found.items()
                 if k not in ("graph", "lms")}
        result["probes"].append(shown)
        print("  %s %s %d: %s, %s (%.1f s)" % (
            family, column, found["seq"],
            "fits" if found["fits"] else "does not fit",
            common.fmt_bytes(found["peak"] or found.get("smallest")),
            found["cpu_s"]), file=sys.stderr, flush=True)
        if found["fits"]:
            if best is not None:
                del best["graph"]
            best = found
            lo = mid + 1
        else:
            hi = mid - 1
        del found
    if best is None:
        result["longest"] = None
        return result
    result["longest"] = best["seq"]
    result["peak"] = best["peak"]
    result["step_without_ms"] = best.get("step_without_ms")
    result["step_with_ms"] = best.get("step_with_ms")
    if args.oracle:
        result["oracle_peak"] = _oracle(best, column)
    return result


def table(results, args):
    """The markdown table of the columns' results, one row each."""
    lines = [
        "| model | how | longest sequence (batch %d, %g GiB) | peak there "
        "(simulator) | oracle | predicted step there | step without LMS "
        "at that length |" % (args.batch, args.gpu_mem),
        "|---|---|---|---|---|---|---|"]
    for r in results:
        how = ("without LMS" if r["column"] == "none" else "LMS"
               if r["column"] == "lms" else
               "`RematScope(mode=%r)`" % r["column"])
        if "error" in r:
            lines.append("| %s | %s | fails: %s | - | - | - | - |" % (
                r["family"], how, r["error"]))
            continue
        if r["longest"] is None:
            lines.append("| %s | %s | none from %d | - | - | - | - |" % (
                r["family"], how, args.lo))
            continue
        with_ms = r.get("step_with_ms")
        without_ms = r.get("step_without_ms")
        lines.append("| %s | %s | %d | %s | %s | %s | %s |" % (
            r["family"], how, r["longest"], common.fmt_bytes(r["peak"]),
            common.fmt_bytes(r.get("oracle_peak")),
            "%.0f ms (%.2fx)" % (with_ms, with_ms / without_ms)
            if with_ms and without_ms else
            "%.0f ms" % without_ms if without_ms else "-",
            "%.0f ms" % without_ms if without_ms else "-"))
    return "\n".join(lines)


def _one(family, column, argv):
    """`search_column` in a process of its own: its result."""
    command = [sys.executable, os.path.abspath(__file__), "--one",
               "--family", family, "--columns", column] + argv
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True,
                          check=False)
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    return {"family": family, "column": column,
            "error": "the process exited with %d" % done.returncode}


def _parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", nargs="+", default=["gpt2", "llama"],
                        choices=sorted(models.FAMILIES))
    parser.add_argument("--columns", nargs="+", default=list(COLUMNS),
                        choices=COLUMNS)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gpu-mem", type=float, default=16.0,
                        help="GPU memory, GiB (autotune_gpu_mem)")
    parser.add_argument("--step", type=int, default=128,
                        help="the lengths searched are its multiples")
    parser.add_argument("--lo", type=int, default=128)
    parser.add_argument("--hi", type=int, default=4096)
    parser.add_argument("--threshold", type=int, default=1024,
                        help="larger_than's output_size_threshold")
    parser.add_argument("--size", choices=sorted(models.SIZES),
                        default="small")
    parser.add_argument("--oracle", action="store_true",
                        help="measure each column's longest by the oracle")
    parser.add_argument("--one", action="store_true",
                        help=argparse.SUPPRESS)  # a column, here
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.one:
        common.setup_tensorflow("eager")
        result = search_column(args.family[0], args.columns[0], args)
        print(json.dumps(result), flush=True)
        return 0
    passed = ["--batch", str(args.batch), "--gpu-mem", str(args.gpu_mem),
              "--step", str(args.step), "--lo", str(args.lo), "--hi",
              str(args.hi), "--threshold", str(args.threshold), "--size",
              args.size] + (["--oracle"] if args.oracle else [])
    results = []
    for family in args.family:
        for column in args.columns:
            result = _one(family, column, passed)
            results.append(result)
            print(table([result], args).splitlines()[-1], flush=True)
    print(table(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
