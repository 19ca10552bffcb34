"""On a machine with a GPU: measure the examples' models, then compare.

    python benchmarks/gpu_measure.py                      # both models
    python benchmarks/gpu_measure.py --model resnet50 --image-size 448 \\
        --batch-size 16 --steps 20 --gpu V100-SXM2-16GB --interconnect nvlink2
    python benchmarks/gpu_measure.py --out gpu.md --doc docs/performance.md
    python benchmarks/gpu_measure.py --dry-run            # no GPU needed

For each model of the examples that LMS is for (`Keras_ResNet50.py`: Keras
ResNet50; `unet3d_lms.py`: a 3D U-Net; both built by `benchmarks/models.py`
as the benchmarks build them; ``--model tiny``: a small MLP, for trying the
command out), trains a few steps on GPU:0 without LMS and then, in a fresh
graph, with LMS auto-tuned for `--budget-fraction` of the simulator's peak
without LMS (so that LMS has to swap), and prints per run:

* the real device peak, ``tf.config.experimental.get_memory_info('GPU:0')
  ['peak']`` over the timed steps (after ``reset_memory_stats``), beside the
  simulator's peak for the same graph and plan;
* the median wall time of the timed steps, beside the step-time model's
  prediction (`tflms.steptime`) for `--gpu` over `--interconnect`.

The table is markdown; ``--out PATH`` writes it to a file, ``--doc PATH``
replaces the one between the ``<!-- gpu_measure table -->`` markers of a
page (docs/performance.md shows it). A run that runs out of device memory
is reported as such.

Without a GPU (none visible to TensorFlow) it says so on stderr, plans and
predicts all the same, prints the table with the measured columns empty and
exits with status 2 (nothing was measured); ``--dry-run`` does the same
without looking for a GPU and exits with 0. It has not been run on a GPU by
the project (docs/performance.md).
"""

import argparse
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from benchmarks import common
from tflms.tf import reader
from tflms import hardware

__all__ = ["NO_GPU_MESSAGE", "NOT_MEASURED", "BEGIN", "END", "find_gpu",
           "guess_gpu", "main", "no_gpu_message", "publish", "report",
           "with_table"]

EXIT_OK, EXIT_CANNOT_RUN = 0, 2

def no_gpu_message(script):
    """What `script` says on stderr when TensorFlow sees no GPU."""
    return (
        "%s found no GPU: TensorFlow sees none here "
        "(tf.config.list_physical_devices('GPU') is empty), so nothing is "
        "measured and the table has the predictions only. To measure, run "
        "it on a machine with an NVIDIA GPU and a GPU build of TensorFlow "
        "(pip install 'tensorflow[and-cuda]')." % script)


SCRIPT = "benchmarks/gpu_measure.py"

NO_GPU_MESSAGE = no_gpu_message(SCRIPT)

NOT_MEASURED = "not measured"

BEGIN = "<!-- gpu_measure table -->"
END = "<!-- /gpu_measure table -->"


def _families():
    """``(family, key)`` for each family of `hardware.GPUS` (``"V100"``...),
    its first GPU: the one a device name that gives only the family (not
    the memory) is taken for."""
    families = {}
    for key in hardware.GPUS:
        families.setdefault(key.split("-")[0], key)
    return tuple(families.items())


_GPU_NAMES = _families()


def _builders(args):
    from benchmarks import models
    cases = {
        "resnet50": lambda: models.resnet50(
            image=args.image_size, batch=args.batch_size, classes=1000),
        "unet3d": lambda: models.unet3d(
            volume=args.volume_size, batch=args.unet_batch_size),
        "tiny": lambda: models.mlp(depth=8, width=128, batch=1024),
    }
    return [(name, cases[name]) for name in args.model]


def guess_gpu(tf, device):
    """The `hardware.GPUS` entry the device's name gives."""
    try:
        name = tf.config.experimental.get_device_details(device).get(
            "device_name", "")
    except (ValueError, AttributeError):
        name = ""
    # The name CUDA reports picks the GPU itself, and so does a key inside
    # it (older drivers spell "A100-SXM4-40GB" without "NVIDIA "); failing
    # both, its family.
    for key, gpu in hardware.GPUS.items():
        if gpu.device_name == name or key in name:
            return key, name
    for family, key in _GPU_NAMES:
        if family in name:
            return key, name
    return None, name


def _train(tf, built, steps, warmup):
    """Median step time and the device peak over the timed steps."""
    with built.graph.as_default():
        config = tf.compat.v1.ConfigProto()
        config.gpu_options.allow_growth = True
        with tf.compat.v1.Session(graph=built.graph, config=config) as sess:
            sess.run(built.init_op)
            for _ in range(warmup):
                sess.run(built.train_op, feed_dict=built.make_feed())
            tf.config.experimental.reset_memory_stats("GPU:0")
            times = []
            for _ in range(steps):
                feed = built.make_feed()
                start = time.perf_counter()
                sess.run(built.train_op, feed_dict=feed)
                times.append(time.perf_counter() - start)
            peak = tf.config.experimental.get_memory_info("GPU:0")["peak"]
    return statistics.median(times), int(peak)


def _measure(tf, name, build, args):
    from tflms import LMS, autotune
    from tflms import pipeline, steptime
    from tflms.settings import Settings
    rows = []
    plain = build()
    index = reader.build_index(plain.graph)
    settings = Settings(batch_size=plain.batch_size)
    roles = pipeline.classify(index, settings)
    without = pipeline.simulate_without(index, roles, settings)
    model = steptime.StepTimeModel(index, roles, plain.batch_size,
                                   gpu=args.gpu,
                                   interconnect=args.interconnect)
    row = {"model": plain.description, "run": "without LMS",
           "sim_peak": without.peak_device_bytes,
           "predicted_s": model.predict().without_lms_s}
    rows.append(_run(tf, plain, args, row))
    if args.fixed_budget_gib is not None:
        budget_gib = args.fixed_budget_gib
    else:
        budget_gib = (args.budget_fraction * without.peak_device_bytes
                      / common.GIB)

    swapped = build()
    lms = LMS()
    lms.autotune_gpu_mem = budget_gib
    lms.batch_size = swapped.batch_size
    row = {"model": plain.description,
           "run": "LMS, tuned for %s" % common.fmt_bytes(
               int(budget_gib * common.GIB))}
    try:
        result = lms.run(swapped.graph)
    except autotune.AutotuneError as err:
        row["error"] = "no plan: %s" % str(err).split(" (searched")[0]
        rows.append(row)
        return rows
    if result.planned.plan is not None:
        row["run"] += " (%d swaps)" % len(result.planned.plan.swaps)
    planned = pipeline.simulate_plan(result.planned)
    row["sim_peak"] = (planned.without_lms if planned.plan is None
                       else planned.with_lms).peak_device_bytes
    row["predicted_s"] = steptime.predict_planned(
        planned, gpu=args.gpu, interconnect=args.interconnect).with_lms_s
    rows.append(_run(tf, swapped, args, row))
    return rows


def _run(tf, built, args, row):
    if not args.measure:
        return row
    try:
        row["step_s"], row["peak"] = _train(tf, built, args.steps,
                                            args.warmup)
    except tf.errors.ResourceExhaustedError:
        row["error"] = "out of device memory"
    return row


def _table(rows, args):
    lines = ["| model | run | real peak | simulator peak | median step | "
             "predicted step (%s, %s) |" % (args.gpu, args.interconnect),
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            real = step = r["error"]
        elif "step_s" not in r:
            real = step = NOT_MEASURED
        else:
            real = common.fmt_bytes(r["peak"])
            step = "%.1f ms" % (r["step_s"] * 1e3)
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            r["model"], r["run"], real, common.fmt_bytes(r.get("sim_peak")),
            step, "%.1f ms" % (r["predicted_s"] * 1e3)
            if "predicted_s" in r else "-"))
    return "\n".join(lines)


def report(table, args, argv, device_name, script=SCRIPT, begin=BEGIN,
           end=END):
    """`table` between `begin` and `end` with what it was made with: the
    command (`script` and `argv`, less ``--out`` and ``--doc``), the date,
    the device (`device_name`; None: that none was used) and the
    TensorFlow version."""
    import tensorflow as tf
    command = "python " + script + "".join(
        " " + a for a in argv if not a.startswith(("--out", "--doc"))
        and a not in (args.out, args.doc))
    if device_name is not None:
        where = "measured on %s (predictions for %s)" % (device_name,
                                                        args.gpu)
    else:
        where = ("no GPU used: the measured columns are empty, the "
                 "predictions are for %s" % args.gpu)
    return "%s\n\n`%s` (%s; TensorFlow %s; %s)\n\n%s\n%s" % (
        begin, command, time.strftime("%Y-%m-%d"), tf.__version__, where,
        table, end)


def with_table(text, table, begin=BEGIN, end=END):
    """`text` with what stands between `begin` and `end` (markers
    included; by default this script's) replaced by `table` (a
    `report`).

    Raises:
      ValueError: `text` has no such markers.
    """
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        raise ValueError("the page has no %s ... %s markers to put the "
                         "table between" % (begin, end))
    return text[:start] + table + text[stop + len(end):]


def build_parser():
    from tflms import steptime
    parser = argparse.ArgumentParser(
        description="Measure the examples' models on this machine's GPU "
                    "without and with LMS, beside tflms's predictions.")
    parser.add_argument("--model", action="append",
                        choices=["resnet50", "unet3d", "tiny"],
                        help="model to run (repeatable; default resnet50 "
                             "and unet3d; tiny: an 8-layer MLP, to try the "
                             "command out)")
    parser.add_argument("--dry-run", action="store_true",
                        help="do not look for a GPU: plan and predict only, "
                             "with the measured columns empty")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="also write the table (markdown) to this file")
    parser.add_argument("--doc", default=None, metavar="PATH",
                        help="also put the table between the "
                             "<!-- gpu_measure table --> markers of this "
                             "page (e.g. docs/performance.md)")
    parser.add_argument("--fixed-budget-gib", type=float, default=None,
                        metavar="GIB",
                        help="tune LMS for this many GiB instead of a "
                             "fraction of the simulator's peak")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64,
                        help="ResNet50 batch (default 64)")
    parser.add_argument("--volume-size", type=int, default=64)
    parser.add_argument("--unet-batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10,
                        help="timed steps per run (default 10)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps first (default 3)")
    parser.add_argument("--budget-fraction", type=float, default=0.6,
                        help="LMS is tuned for this share of the simulator's "
                             "peak without LMS (default 0.6)")
    parser.add_argument("--gpu", default=None, choices=list(steptime.GPUS),
                        help="GPU for the predictions (default: from the "
                             "device's name)")
    parser.add_argument("--interconnect",
                        default=steptime.DEFAULT_INTERCONNECT,
                        choices=list(steptime.INTERCONNECTS),
                        help="CPU-GPU link for the predictions (default "
                             "%(default)s)")
    return parser


def find_gpu(tf, args, script):
    """Look for GPU:0 (not with `args.dry_run`) and set `args.gpu`, the
    GPU predicted for, from its name unless given (`hardware.DEFAULT_GPU`
    without a GPU). Returns ``(measure, device_name, status)``: whether
    there is a GPU to measure on, its name, and the exit status so far:
    `EXIT_CANNOT_RUN` without a GPU (`no_gpu_message` on stderr; the
    predictions are made all the same), or None when GPU:0 is one tflms
    has no figures for and `args.gpu` is not given (`script` says so on
    stderr; nothing can be predicted)."""
    gpus = [] if args.dry_run else tf.config.list_physical_devices("GPU")
    device_name = None
    status = EXIT_OK
    if not gpus and not args.dry_run:
        print(no_gpu_message(script), file=sys.stderr)
        status = EXIT_CANNOT_RUN
    if gpus:
        guessed, device_name = guess_gpu(tf, gpus[0])
        args.gpu = args.gpu or guessed
        if args.gpu is None:
            print("%s: GPU:0 is %r, which tflms has no figures for; pass "
                  "--gpu with the nearest of its GPUs for the predictions"
                  % (script, device_name), file=sys.stderr)
            return True, device_name, None
    args.gpu = args.gpu or hardware.DEFAULT_GPU
    return bool(gpus), device_name, status


def publish(text, args, begin=BEGIN, end=END):
    """Print `text` (a `report`), write it to `args.out` and put it
    between the `begin` and `end` markers of the page `args.doc`, each if
    given."""
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if args.doc:
        with open(args.doc, encoding="utf-8") as f:
            page = f.read()
        with open(args.doc, "w", encoding="utf-8") as f:
            f.write(with_table(page, text, begin, end))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.model = args.model or ["resnet50", "unet3d"]
    tf = common.setup_tensorflow("v2")
    args.measure, device_name, status = find_gpu(tf, args, SCRIPT)
    if status is None:
        return EXIT_CANNOT_RUN
    rows = []
    for name, build in _builders(args):
        rows.extend(_measure(tf, name, build, args))
    publish(report(_table(rows, args), args, argv, device_name), args)
    return status


if __name__ == "__main__":
    sys.exit(main())
