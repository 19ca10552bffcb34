"""On a machine with a GPU: time the kernels the step-time model has no
facts for, beside its predictions.

    python benchmarks/kernel_measure.py                   # every case
    python benchmarks/kernel_measure.py --case conv --batch 256
    python benchmarks/kernel_measure.py --doc docs/benchmarks.md
    python benchmarks/kernel_measure.py --dry-run         # no GPU needed

The step-time model (`tflms.steptime`) is off by more than 15% on some
published runs (docs/benchmarks.md, "Not within 15%"), where it would
need facts about kernels that no source gives and no fitted row shows.
Each kernel case here is one small graph of exactly such kernels, run
forward and backward (the gradients given, `tf.gradients(...,
grad_ys=...)`) with Grappler off, so that each runs, in the layout it is
built in (TensorFlow's own kernels: a float16 convolution in NCHW may be
transposed by TensorFlow rather than by cuDNN, which is what a
TensorFlow step pays):

* ``conv``: ResNet50's 3x3 convolution of 64 channels at 56x56, in NHWC
  and in NCHW, float16 and float32 (TF32 on an A100 or H100). The model
  charges NCHW only cuDNN's transposes; the published NCHW runs on the
  A100 and H100 take about 30% longer than that, on the V100 not.
* ``batchnorm``: a training batch norm of 256 channels at 56x56 in NHWC
  and NCHW, float16 (cuDNN's kernels differ by layout).
* ``matmul``: a BERT-large feed-forward product (1024 x 4096) at 8,192
  tokens (NVIDIA's pretraining, where the float16 products' fraction of
  the peak was fitted: 0.515) and 43,008 tokens (Lambda's SQuAD step,
  whose published time implies about 0.79), float16 and float32.
* ``squad``: not a kernel but NVIDIA's whole BERT-large SQuAD
  fine-tuning step in FP32 (`benchmarks.models.bert`, as
  benchmarks/step_time.py builds it) at two batches (2 and 10, the
  published ones), with XLA as NVIDIA ran it (predicted with fusion),
  split into the part of the step that does not grow with the batch and
  the part per sequence: published, about 100 and 86 ms on the V100;
  predicted, about 53 and 72.

Per case it prints the median wall time of `--steps` runs (after
`--warmup`), the model's prediction for the same graph on `--gpu`
(default: the one the device's name gives), their ratio (above 1: the
model is too fast, as in docs/benchmarks.md's ratio of throughputs), the
part of the prediction that is layout transposes, and the share of the
peak FLOP/s the case's products reached: the fraction
`steptime.ACHIEVED` has one fitted value of per precision. The table is
markdown; ``--out`` writes it to a file, ``--doc`` puts it between the
``<!-- kernel_measure table -->`` markers of a page (docs/benchmarks.md).

Without a GPU it says so on stderr, predicts all the same, prints the
table with the measured column empty and exits with status 2; with
``--dry-run`` it does not look for a GPU and exits with 0. The project has
not run it on a GPU.
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
from benchmarks import gpu_measure
from tflms.tf import reader
from tflms import hardware

__all__ = ["CASES", "BEGIN", "END", "NO_GPU_MESSAGE", "Case", "cases",
           "predict", "session_config", "measure", "squad_split", "main"]

EXIT_OK, EXIT_CANNOT_RUN = 0, 2

BEGIN = "<!-- kernel_measure table -->"
END = "<!-- /kernel_measure table -->"

SCRIPT = "benchmarks/kernel_measure.py"

NO_GPU_MESSAGE = gpu_measure.no_gpu_message(SCRIPT)

CASES = ("conv", "batchnorm", "matmul", "squad")


class Case:
    """One graph of the kernels a case times: `graph`, the op to run
    (`step`), and what it is (`case`, `shape`, `layout`, `dtype`). A whole
    training step also has `init` (its variables' initializer), `feed`
    (a feed dict per run) and `batch`, and runs with XLA (`xla`) if its
    published runs did; a kernel case has none of these."""

    def __init__(self, case, shape, layout, dtype, graph, step, init=None,
                 feed=None, batch=None, xla=False):
        self.case = case
        self.shape = shape
        self.layout = layout
        self.dtype = dtype
        self.graph = graph
        self.step = step
        self.init = init
        self.feed = feed
        self.batch = batch
        self.xla = xla

    @property
    def label(self):
        return "%s %s" % (self.case, self.shape)


def _variable(tf, name, shape, dtype):
    """A variable of random values: the case reads it from device memory,
    as a step reads its activations, and needs no feed."""
    return tf.compat.v1.get_variable(
        name, shape, dtype,
        initializer=tf.compat.v1.random_normal_initializer(stddev=0.1))


def _backward(tf, name, outputs, wrt):
    """`outputs` and the gradients of `wrt` given random output gradients,
    grouped into one op."""
    grads = [_variable(tf, "d%s%d" % (name, k), y.shape, y.dtype)
             for k, y in enumerate(outputs)]
    dx = tf.gradients(outputs, wrt, grad_ys=grads)
    return tf.group(*(list(outputs) + dx), name=name)


def _conv(tf, batch, layout, dtype):
    channels, size = 64, 56
    shape = ([batch, size, size, channels] if layout == "NHWC"
             else [batch, channels, size, size])
    x = _variable(tf, "x", shape, dtype)
    w = _variable(tf, "w", [3, 3, channels, channels], dtype)
    y = tf.nn.conv2d(x, w, 1, "SAME", data_format=layout, name="conv")
    return _backward(tf, "step", [y], [x, w])


def _batchnorm(tf, batch, layout, dtype):
    channels, size = 256, 56
    shape = ([batch, size, size, channels] if layout == "NHWC"
             else [batch, channels, size, size])
    x = _variable(tf, "x", shape, dtype)
    scale = _variable(tf, "scale", [channels], tf.float32)
    offset = _variable(tf, "offset", [channels], tf.float32)
    y, _, _ = tf.compat.v1.nn.fused_batch_norm(
        x, scale, offset, data_format=layout, is_training=True, name="bn")
    return _backward(tf, "step", [y], [x, scale, offset])


def _matmul(tf, tokens, dtype):
    x = _variable(tf, "x", [tokens, 1024], dtype)
    w = _variable(tf, "w", [1024, 4096], dtype)
    y = tf.matmul(x, w, name="matmul")
    return _backward(tf, "step", [y], [x, w])


def _squad(batch, layers):
    """NVIDIA's TensorFlow BERT-large SQuAD fine-tuning step in FP32, as
    benchmarks/step_time.py times its published rows."""
    from benchmarks import models
    built = models.bert(layers=layers, seq=384, batch=batch, head="squad",
                        optimizer="adam-weight-decay")
    return Case("squad", "step, %d layers, seq 384, batch %d"
                % (layers, batch), "-", "float32", built.graph,
                built.train_op, built.init_op, built.make_feed, batch,
                xla=True)


def cases(names=CASES, batch=256, tokens=(8192, 43008),
          squad_batches=(2, 10), squad_layers=24):
    """The `Case` graphs of `names` (of `CASES`) at `batch` images, each
    of `tokens`, and each of `squad_batches` sequences (a BERT of
    `squad_layers` layers: 24 is BERT-large)."""
    import tensorflow as tf
    made = []

    def add(case, shape, layout, dtype, build):
        graph = tf.Graph()
        with graph.as_default():
            step = build()
        made.append(Case(case, shape, layout, dtype, graph, step))

    for name in names:
        if name not in CASES:
            raise ValueError("case must be one of %s; got %r"
                             % (", ".join(CASES), name))
        if name == "squad":
            made.extend(_squad(n, squad_layers) for n in squad_batches)
            continue
        for dtype in ((tf.float16,) if name == "batchnorm"
                      else (tf.float16, tf.float32)):
            if name == "matmul":
                for n in tokens:
                    add(name, "%d x 1024 x 4096" % n, "-", dtype.name,
                        lambda n=n, d=dtype: _matmul(tf, n, d))
                continue
            for layout in ("NHWC", "NCHW"):
                build = _conv if name == "conv" else _batchnorm
                shape = "batch %d, 56x56, %d channels" % (
                    batch, 64 if name == "conv" else 256)
                add(name, shape, layout, dtype.name,
                    lambda b=build, l=layout, d=dtype: b(tf, batch, l, d))
    return made


def predict(case, gpu):
    """The step-time model's time (s) for one run of `case` on `gpu`, the
    part of it that is layout transposes, and the case's FLOPs over the
    peak FLOP/s of its products' precision (s; 0 without FLOPs)."""
    from tflms import graph_index as gi
    from tflms import pipeline, steptime
    from tflms.settings import Settings
    index = reader.build_index(case.graph)
    roles = pipeline.classify(index, Settings(batch_size=case.batch))
    model = steptime.StepTimeModel(
        index, roles, case.batch, gpu=gpu, kernels=steptime.KernelOptions(
            fusion=case.xla,
            layout="NCHW" if case.layout == "NCHW" else "NHWC"))
    ran = [i for i in range(index.num_ops) if model.op_seconds[i] > 0]
    transposed = sum(model.transposed_bytes(i) for i in ran)
    at_peak = sum((gi.op_flops(index, i) or 0) / model.peak_flops(i)
                  for i in ran)
    return (model.predict().without_lms_s,
            transposed / model.achieved_bandwidth, at_peak)


def session_config(device=None, xla=False):
    """The session's configuration: Grappler off (each kernel runs, in
    the layout its graph has); no GPU if `device` is ``"/cpu:0"``; XLA's
    auto-clustering on with `xla` (as NVIDIA's BERT runs turn it on)."""
    import tensorflow as tf
    config = tf.compat.v1.ConfigProto()
    config.gpu_options.allow_growth = True
    # Its layout optimizer would change the layout a case is built in, and
    # its pruning drops stateless ops that only a control edge of the
    # fetched NoOp reads: the case's kernels themselves.
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    if device is not None and "cpu" in device.lower():
        config.device_count["GPU"] = 0
    if xla:
        config.graph_options.optimizer_options.global_jit_level = (
            tf.compat.v1.OptimizerOptions.ON_1)
    return config


def measure(case, steps, warmup, device=None):
    """The median wall time (s) of `steps` runs of `case` after `warmup`
    (`session_config`: every kernel runs, on `device`)."""
    import tensorflow as tf
    config = session_config(device, case.xla)
    with tf.compat.v1.Session(graph=case.graph, config=config) as sess:
        with case.graph.as_default():
            sess.run(case.init if case.init is not None
                     else tf.compat.v1.global_variables_initializer())
        for _ in range(warmup):
            sess.run(case.step, feed_dict=case.feed and case.feed())
        times = []
        for _ in range(steps):
            feed = case.feed and case.feed()
            start = time.perf_counter()
            sess.run(case.step, feed_dict=feed)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _table(rows, gpu):
    lines = ["| case | layout | dtype | measured | predicted (%s) | "
             "measured / predicted | of it transposes | products' share "
             "of the peak, measured |" % gpu,
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        measured = r.get("measured_s")
        if measured is None:
            cells = (r.get("error", gpu_measure.NOT_MEASURED), "-", "-")
        else:
            cells = ("%.3f ms" % (measured * 1e3),
                     "%.2f" % (measured / r["predicted_s"]),
                     "%.3f" % (r["at_peak_s"] / measured)
                     if r["at_peak_s"] else "-")
        lines.append("| %s | %s | %s | %s | %.3f ms | %s | %.3f ms | %s |" % (
            r["case"].label, r["case"].layout, r["case"].dtype, cells[0],
            r["predicted_s"] * 1e3, cells[1], r["transposes_s"] * 1e3,
            cells[2]))
    split = squad_split(rows)
    if split:
        lines.append("")
        lines.append(split)
    return "\n".join(lines)


def _fixed_and_per_sequence(pairs):
    """The part of a step that does not grow with the batch and the part
    per sequence (s), from ``(batch, step)`` at the smallest and largest
    batch."""
    (b1, t1), (b2, t2) = min(pairs), max(pairs)
    per = (t2 - t1) / (b2 - b1)
    return t1 - per * b1, per


def squad_split(rows):
    """The SQuAD step split into the part that does not grow with the
    batch and the part per sequence, predicted and (where both batches
    were) measured; None with fewer than two batches. NVIDIA's published
    FP32 rows on the V100 (batch 2 and 10) put them at about 100 and 86
    ms; the model at 53 and 72 (docs/benchmarks.md)."""
    squad = [r for r in rows if r["case"].case == "squad"]
    if len({r["case"].batch for r in squad}) < 2:
        return None
    text = ("SQuAD step, from batch %d and %d: predicted %.1f ms a step "
            "and %.1f ms a sequence" % (
                min(r["case"].batch for r in squad),
                max(r["case"].batch for r in squad),
                *(1e3 * x for x in _fixed_and_per_sequence(
                    [(r["case"].batch, r["predicted_s"]) for r in squad]))))
    if all(r.get("measured_s") is not None for r in squad):
        text += "; measured %.1f ms and %.1f ms" % tuple(
            1e3 * x for x in _fixed_and_per_sequence(
                [(r["case"].batch, r["measured_s"]) for r in squad]))
    return text + "."


def build_parser():
    parser = argparse.ArgumentParser(
        description="Time the kernels the step-time model has no facts "
                    "for on this machine's GPU, beside its predictions.")
    parser.add_argument("--case", action="append", choices=CASES,
                        help="case to run (repeatable; default all)")
    parser.add_argument("--batch", type=int, default=256,
                        help="images of the conv and batchnorm cases "
                             "(default 256, the published ResNet50 runs')")
    parser.add_argument("--tokens", type=int, action="append",
                        help="rows of the matmul case (repeatable; default "
                             "8192 and 43008)")
    parser.add_argument("--squad-batch", type=int, action="append",
                        help="sequences of the squad case (repeatable; "
                             "default 2 and 10, NVIDIA's published FP32 "
                             "batches on the V100 16GB and 32GB)")
    parser.add_argument("--steps", type=int, default=20,
                        help="timed runs per case (default 20)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed runs first (default 5)")
    parser.add_argument("--gpu", default=None, choices=list(hardware.GPUS),
                        help="GPU for the predictions (default: from the "
                             "device's name)")
    parser.add_argument("--dry-run", action="store_true",
                        help="do not look for a GPU: predict only")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="also write the table (markdown) to this file")
    parser.add_argument("--doc", default=None, metavar="PATH",
                        help="also put the table between the "
                             "<!-- kernel_measure table --> markers of "
                             "this page")
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("batch", "steps"):
        if getattr(args, name) < 1:
            parser.error("--%s must be at least 1; got %d"
                         % (name, getattr(args, name)))
    for name in ("tokens", "squad_batch"):
        if any(n < 1 for n in getattr(args, name) or ()):
            parser.error("--%s must be at least 1; got %s" % (
                name.replace("_", "-"), getattr(args, name)))
    tf = common.setup_tensorflow("v2")
    measuring, device_name, status = gpu_measure.find_gpu(
        tf, args, SCRIPT)
    if status is None:
        return EXIT_CANNOT_RUN
    rows = []
    for case in cases(args.case or CASES, args.batch,
                      tuple(args.tokens or (8192, 43008)),
                      tuple(args.squad_batch or (2, 10))):
        predicted, transposes, at_peak = predict(case, args.gpu)
        row = {"case": case, "predicted_s": predicted,
               "transposes_s": transposes, "at_peak_s": at_peak}
        if measuring:
            try:
                row["measured_s"] = measure(case, args.steps, args.warmup)
            except tf.errors.ResourceExhaustedError:
                row["error"] = "out of device memory"
        rows.append(row)
    gpu_measure.publish(gpu_measure.report(
        _table(rows, args.gpu), args, argv, device_name,
        SCRIPT, BEGIN, END), args, BEGIN, END)
    return status


if __name__ == "__main__":
    sys.exit(main())
