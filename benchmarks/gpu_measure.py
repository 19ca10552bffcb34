"""On a machine with a GPU: measure the examples' models, then compare.

    python benchmarks/gpu_measure.py                      # both models
    python benchmarks/gpu_measure.py --model resnet50 --image-size 448 \\
        --batch-size 16 --steps 20 --gpu V100-SXM2-16GB --interconnect nvlink2

For each model of the examples that LMS is for (`Keras_ResNet50.py`: Keras
ResNet50; `unet3d_lms.py`: a 3D U-Net; both built by `benchmarks/models.py`
as the benchmarks build them), trains a few steps on GPU:0 without LMS and
then, in a fresh graph, with LMS auto-tuned for `--budget-fraction` of the
simulator's peak without LMS (so that LMS has to swap), and prints per run:

* the real device peak, ``tf.config.experimental.get_memory_info('GPU:0')
  ['peak']`` over the timed steps (after ``reset_memory_stats``), beside the
  simulator's peak for the same graph and plan;
* the median wall time of the timed steps, beside the step-time model's
  prediction (`tflms.steptime`) for `--gpu` over `--interconnect`.

A run that runs out of device memory is reported as such. On a machine
where TensorFlow sees no GPU it prints why it cannot run and exits with
status 2 before building anything. It has not been run on a GPU by the
project (docs/performance.md).
"""

import argparse
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=wrong-import-position
from tflms import hardware  # pylint: disable=wrong-import-position

__all__ = ["NO_GPU_MESSAGE", "main"]

EXIT_OK, EXIT_CANNOT_RUN = 0, 2

NO_GPU_MESSAGE = (
    "benchmarks/gpu_measure.py needs a GPU: TensorFlow sees none here "
    "(tf.config.list_physical_devices('GPU') is empty). Run it on a machine "
    "with an NVIDIA GPU and a GPU build of TensorFlow (pip install "
    "'tensorflow[and-cuda]'); for predictions without a GPU use `tflms "
    "plan` or benchmarks/step_time.py.")


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
    from benchmarks import models  # pylint: disable=import-outside-toplevel
    cases = {
        "resnet50": lambda: models.resnet50(
            image=args.image_size, batch=args.batch_size, classes=1000),
        "unet3d": lambda: models.unet3d(
            volume=args.volume_size, batch=args.unet_batch_size),
    }
    return [(name, cases[name]) for name in args.model]


def _guess_gpu(tf, device):
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
    from tflms import LMS, autotune  # pylint: disable=import-outside-toplevel
    from tflms import graph_index as gi  # pylint: disable=import-outside-toplevel
    from tflms import pipeline, steptime  # pylint: disable=import-outside-toplevel
    from tflms.settings import Settings  # pylint: disable=import-outside-toplevel
    rows = []
    plain = build()
    index = gi.build_index(plain.graph)
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

    budget_gib = args.budget_fraction * without.peak_device_bytes / common.GIB
    swapped = build()
    lms = LMS()
    lms.autotune_gpu_mem = budget_gib
    lms.batch_size = swapped.batch_size
    row = {"model": plain.description,
           "run": "LMS, tuned for %.2f GiB" % budget_gib}
    try:
        result = lms.run(swapped.graph)
    except autotune.AutotuneError as err:
        row["error"] = "no plan: %s" % str(err).split(". ")[0]
        rows.append(row)
        return rows
    planned = pipeline.simulate_plan(result.planned)
    row["sim_peak"] = (planned.without_lms if planned.plan is None
                       else planned.with_lms).peak_device_bytes
    row["predicted_s"] = steptime.predict_planned(
        planned, gpu=args.gpu, interconnect=args.interconnect).with_lms_s
    rows.append(_run(tf, swapped, args, row))
    return rows


def _run(tf, built, args, row):
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
        else:
            real = common.fmt_bytes(r["peak"])
            step = "%.1f ms" % (r["step_s"] * 1e3)
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            r["model"], r["run"], real, common.fmt_bytes(r.get("sim_peak")),
            step, "%.1f ms" % (r["predicted_s"] * 1e3)
            if "predicted_s" in r else "-"))
    return "\n".join(lines)


def build_parser():
    from tflms import steptime  # pylint: disable=import-outside-toplevel
    parser = argparse.ArgumentParser(
        description="Measure the examples' models on this machine's GPU "
                    "without and with LMS, beside tflms's predictions.")
    parser.add_argument("--model", action="append",
                        choices=["resnet50", "unet3d"],
                        help="model to run (repeatable; default both)")
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


def main(argv=None):
    args = build_parser().parse_args(argv)
    args.model = args.model or ["resnet50", "unet3d"]
    tf = common.setup_tensorflow("v2")
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return EXIT_CANNOT_RUN
    if args.gpu is None:
        args.gpu, device_name = _guess_gpu(tf, gpus[0])
        if args.gpu is None:
            print("benchmarks/gpu_measure.py: GPU:0 is %r, which tflms has "
                  "no figures for; pass --gpu with the nearest of its GPUs "
                  "for the predictions" % device_name, file=sys.stderr)
            return EXIT_CANNOT_RUN
    rows = []
    for name, build in _builders(args):
        rows.extend(_measure(tf, name, build, args))
    print(_table(rows, args))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
