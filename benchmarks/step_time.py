"""Check the step-time model (`tflms.steptime`) against published numbers.

    python benchmarks/step_time.py            # under a minute on 2 cores
    python benchmarks/step_time.py --doc docs/benchmarks.md
    python benchmarks/step_time.py --no-grappler --lms-case 224:256

Prints two markdown tables (docs/benchmarks.md, "Step-time model"):

1. Keras ResNet50 at 224x224, trained with SGD and momentum, at the batch
   sizes of NVIDIA's published single-GPU training throughput for ResNet50
   v1.5 in TensorFlow (`PUBLISHED`): the model's predicted images/s on
   V100 (FP32) and A100 (TF32), the published images/s in the same
   precision, and the step time of Grappler's virtual cluster for the same
   graph (`tflms.oracle`, its analytical cost model on device properties of
   the same GPU).
2. Auto-tuned LMS plans for ResNet50 at sizes that do not fit 16 GiB
   without LMS (224x224 at batch 384, 6592x6592 at batch 1): the predicted
   step without and with the plan, and the exposed transfer time, over
   PCIe 4.0 x16 and NVLink 2.0.

These are benchmarks, not tests: nothing here asserts a time. With
``--doc PATH`` the section ("Step-time model") replaces the one between
`BEGIN` and `END` in PATH, or is appended; ``benchmarks/run.py`` keeps it
when it rewrites docs/benchmarks.md.
"""

import argparse
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=wrong-import-position

__all__ = ["PUBLISHED", "BEGIN", "END", "main", "section_of",
           "with_section"]

BEGIN = "<!-- step-time section: benchmarks/step_time.py --doc -->"
END = "<!-- end of step-time section -->"

_SOURCE = ("NVIDIA DeepLearningExamples, TensorFlow/Classification/ConvNets/"
           "resnet50v1.5/README.md, \"Training performance results\" "
           "(TensorFlow 20.06-tf1-py3 NGC container, 1 GPU, XLA on, images/s "
           "averaged over a training epoch), "
           "https://github.com/NVIDIA/DeepLearningExamples/blob/master/"
           "TensorFlow/Classification/ConvNets/resnet50v1.5/README.md")

# (GPU, batch, precision, published images/s, where).
PUBLISHED = (
    ("V100-SXM2-16GB", 128, "FP32", 412.0, "DGX-1 (8x V100 16GB), 1 GPU"),
    ("A100-SXM4-40GB", 256, "TF32", 909.0, "DGX A100 (8x A100 40GB), 1 GPU"),
)


def _grappler_step_s(built, gpu):
    from tflms import oracle  # pylint: disable=import-outside-toplevel
    # The virtual cluster's GPU is the row's (tflms.hardware.GPUS).
    result = oracle.peak_memory(built.graph, [built.train_op], gpu=gpu)
    return result.run_time_s


def throughput_rows(grappler=True):
    """Predicted, published and Grappler's images/s per `PUBLISHED` row."""
    from benchmarks import models  # pylint: disable=import-outside-toplevel
    from tflms import graph_index as gi  # pylint: disable=import-outside-toplevel
    from tflms import pipeline, steptime  # pylint: disable=import-outside-toplevel
    from tflms.settings import Settings  # pylint: disable=import-outside-toplevel
    rows = []
    for gpu, batch, precision, published, where in PUBLISHED:
        start = time.perf_counter()
        built = models.resnet50(image=224, batch=batch, classes=1000)
        index = gi.build_index(built.graph)
        roles = pipeline.classify(index, Settings())
        model = steptime.StepTimeModel(index, roles, batch, gpu=gpu)
        step = model.predict()
        kernels = int((model.op_seconds > 0).sum())
        flops = sum(gi.op_flops(index, i, batch) or 0
                    for i in range(index.num_ops) if model.runs[i])
        # Time of the ops whose FLOPs bound them (convolutions, matmuls),
        # the rest being memory-bound or launch overhead.
        flop_bound_s = 0.0
        for i in range(index.num_ops):
            if model.op_seconds[i] > 0:
                by_flops = (gi.op_flops(index, i, batch) or 0) / \
                    model.peak_flops(i)
                by_bytes = (model.bytes_touched(i)
                            / model.gpu.memory_bandwidth)
                if by_flops > by_bytes:
                    flop_bound_s += by_flops
        row = {"gpu": gpu, "batch": batch, "precision": precision,
               "published": published, "where": where,
               "step_s": step.without_lms_s,
               "predicted": batch / step.without_lms_s,
               "kernels": kernels, "flops": flops,
               "flop_bound_s": flop_bound_s,
               "launch_s": kernels * model.launch_overhead_s}
        if grappler:
            row["grappler_step_s"] = _grappler_step_s(built, gpu)
            row["grappler"] = batch / row["grappler_step_s"]
        row["seconds"] = time.perf_counter() - start
        print("# %s batch %d done in %.0f s" % (gpu, batch, row["seconds"]),
              file=sys.stderr)
        rows.append(row)
    return rows


def lms_rows(batch, gpu_mem_gib, gpu="V100-SXM2-16GB",
             links=("pcie4", "nvlink2"), image=224):
    """The step without and with an auto-tuned plan over each link."""
    from benchmarks import models  # pylint: disable=import-outside-toplevel
    from tflms import graph_index as gi  # pylint: disable=import-outside-toplevel
    from tflms import pipeline, steptime  # pylint: disable=import-outside-toplevel
    from tflms.settings import Settings  # pylint: disable=import-outside-toplevel
    start = time.perf_counter()
    built = models.resnet50(image=image, batch=batch, classes=1000)
    index = gi.build_index(built.graph)
    planned = pipeline.plan(index, Settings(batch_size=batch,
                                            autotune_gpu_mem=gpu_mem_gib))
    print("# tuned ResNet50 %dx%d batch %d for %g GiB in %.0f s" % (
        image, image, batch, gpu_mem_gib, time.perf_counter() - start),
        file=sys.stderr)
    rows = []
    for link in links:
        step = steptime.predict_planned(planned, gpu=gpu, interconnect=link)
        rows.append({
            "batch": batch, "image": image, "gpu": gpu,
            "gpu_mem_gib": gpu_mem_gib,
            "link": steptime.interconnect_named(link).label,
            "params": planned.params,
            "swaps": len(planned.plan.swaps) if planned.plan else 0,
            "swap_ins": planned.plan.num_swap_ins if planned.plan else 0,
            "peak": planned.with_lms.peak_device_bytes
            if planned.with_lms is not None else None,
            "without_s": step.without_lms_s, "with_s": step.with_lms_s,
            "exposed_s": step.exposed_transfer_s,
            "out_bytes": step.swapout_bytes, "in_bytes": step.swapin_bytes,
            "out_busy_s": step.swapout_busy_s,
            "in_busy_s": step.swapin_busy_s})
    return rows


def _ms(seconds):
    return "%.1f ms" % (seconds * 1e3)


def throughput_table(rows):
    lines = ["| GPU | batch | precision | predicted | published | "
             "predicted / published | Grappler virtual cluster | "
             "predicted step | FLOP-bound ops in it | launch overhead in "
             "it | kernels | FLOPs per step |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        grappler = ("%.0f img/s (%s)" % (r["grappler"],
                                         _ms(r["grappler_step_s"]))
                    if "grappler" in r else "-")
        lines.append("| %s | %d | %s | %.0f img/s | %.0f img/s | %.2f | %s "
                     "| %s | %s | %s | %d | %.3g |" % (
                         r["gpu"], r["batch"], r["precision"],
                         r["predicted"], r["published"],
                         r["predicted"] / r["published"], grappler,
                         _ms(r["step_s"]), _ms(r["flop_bound_s"]),
                         _ms(r["launch_s"]), r["kernels"], r["flops"]))
    return "\n".join(lines)


def lms_table(rows):
    lines = ["| ResNet50 | link | plan | swapped out / in | step without "
             "LMS | step with LMS | exposed transfer | link busy out / in |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        p = r["params"]
        plan = ("no plan needed" if p is None else
                "%d swaps, %d swap-ins, sync_mode %d, peak %s" % (
                    r["swaps"], r["swap_ins"], p.sync_mode,
                    common.fmt_bytes(r["peak"])))
        lines.append("| %dx%d, batch %d | %s | %s | %s / %s | %s | %s | "
                     "%s (%+.0f%%) | %s / %s |" % (
                         r["image"], r["image"], r["batch"], r["link"],
                         plan,
                         common.fmt_bytes(r["out_bytes"]),
                         common.fmt_bytes(r["in_bytes"]),
                         _ms(r["without_s"]), _ms(r["with_s"]),
                         _ms(r["exposed_s"]),
                         100.0 * r["exposed_s"] / r["without_s"],
                         _ms(r["out_busy_s"]), _ms(r["in_busy_s"])))
    return "\n".join(lines)


_INTRO = """\
## Step-time model

`tflms.steptime` ([performance](performance.md#the-step-time-model))
predicts one training step from the graph alone: a roofline time per op at
the GPU's published peak FLOP/s and memory bandwidth plus 5 us per kernel,
one op at a time, and the copies of a plan on one stream each way beside
the compute. Below it is set against NVIDIA's published single-GPU training
throughput for ResNet50 in TensorFlow, and against Grappler's virtual
cluster (TensorFlow's analytical cost model, `tflms.oracle`) given the same
GPU's properties, for the same graph: Keras ResNet50 at 224x224, 1000
classes, SGD with momentum, batch norm in training mode, float32, at the
published batch sizes. Like with like: FP32 on the V100 (its tensor cores
take FP16 only), TF32 on the A100 (TensorFlow's default for float32
convolutions and matmuls there), never mixed precision. Two differences
remain: NVIDIA's model is ResNet50 v1.5 (stride 2 in the 3x3 instead of the
1x1 convolutions: about 6% more FLOPs than the Keras v1 here) and its
figures are with XLA, which fuses the memory-bound ops this model times one
by one.
"""

_READING = """\
How far off: on the V100 the prediction is within about 6% of the
published FP32 throughput, and would be closer still for v1.5's extra
FLOPs. Most of its predicted step is convolutions at the FP32 peak (the
FLOP-bound column), and the published step leaves little room below it, so
those kernels run near peak there. On the A100 it is far too fast: at
TF32's 156 TFLOP/s the convolutions take a small share of the predicted
step, the rest is memory-bound ops at full HBM bandwidth, and the published
step is about 1.6 times longer, so the kernels there run well below those
peaks (which of the two falls shorter, this comparison cannot say).
Grappler's virtual cluster knows no tensor cores
(its peak is SMs x FP32 cores x clock), so on the A100 it is slow by about
as much as the model is fast. Read the predictions as lower bounds on the
step time, tight on a V100 in FP32 and loose on tensor-core GPUs; they are
best used to compare plans of one model on one GPU (what the tuner needs),
where the roofline errors are common to both sides.

The plan table times auto-tuned plans on a 16 GiB V100 at sizes that need
LMS. At 224x224, batch 384 (198 fits without LMS) the tuner keeps the
copies asynchronous: over NVLink 2.0 they hide behind the compute, over
PCIe 4.0 x16 part of them does not. At 6592x6592, batch 1 (issue 15's
case; about 3072 fits without LMS) the tuner needs synchronous swap-ins
(sync_mode 2) and moves several times the step's device memory each way;
the device then waits for every copy back, and the step grows by the
exposed time shown even over NVLink 2.0. No GPU was used: every number here
is a prediction or a published figure.
"""


def section_of(text):
    """The step-time section of a document (with its markers), or None."""
    start = text.find(BEGIN)
    end = text.find(END, start)
    if start < 0 or end < 0:
        return None
    return text[start:end + len(END)]


def with_section(text, section):
    """`text` with its step-time section replaced by `section` (markers
    included), or with `section` appended."""
    old = section_of(text)
    if old is not None:
        return text.replace(old, section)
    return text.rstrip("\n") + "\n\n" + section + "\n"


def _section(throughput, plan, command):
    rows = [BEGIN, _INTRO,
            "Command: `%s` (%s).\n" % (command, time.strftime("%Y-%m-%d")),
            throughput_table(throughput), "",
            "Predicted: `StepTimeModel(...).predict()` at the published "
            "batch; images/s = batch / step. Published: " + _SOURCE + ".",
            "Grappler: `oracle.peak_memory(..., gpu=...).run_time_s` on "
            "the row's GPU as `tflms.hardware` describes it (the A100: 108 "
            "SMs at 1,410 MHz, compute capability 8.0, 1,555 GB/s).", "",
            plan_title(plan), "", lms_table(plan), "", _READING, END]
    return "\n".join(rows)


def plan_title(rows):
    r = rows[0]
    return "Auto-tuned plans for ResNet50 (%g GiB, sizes that do not fit "\
        "without LMS) on %s:" % (r["gpu_mem_gib"], r["gpu"])


def _case(text):
    try:
        image, batch = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            "--lms-case must be IMAGE:BATCH such as 224:384; got %r"
            % text) from None
    return image, batch


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-grappler", action="store_true",
                        help="skip the virtual cluster's estimate (slow)")
    parser.add_argument("--lms-case", action="append", default=None,
                        metavar="IMAGE:BATCH", type=_case,
                        help="ResNet50 input side and batch to tune an LMS "
                             "plan for (repeatable; default 224:384 and "
                             "6592:1: 198 is the largest batch at 224 and "
                             "about 3072 the largest side at batch 1 that "
                             "fit 16 GiB without LMS)")
    parser.add_argument("--gpu-mem", type=float, default=16.0,
                        help="GiB the plan is tuned for (default 16)")
    parser.add_argument("--doc", default=None, metavar="PATH",
                        help="also write the section into this markdown "
                             "file (e.g. docs/benchmarks.md)")
    args = parser.parse_args(argv)
    common.setup_tensorflow("v2")
    throughput = throughput_rows(grappler=not args.no_grappler)
    plan = []
    for image, batch in args.lms_case or [(224, 384), (6592, 1)]:
        plan.extend(lms_rows(batch, args.gpu_mem, image=image))
    command = "python benchmarks/step_time.py" + "".join(
        " " + a for a in (sys.argv[1:] if argv is None else argv)
        if not a.startswith("--doc") and a != args.doc)
    section = _section(throughput, plan, command)
    print(section)
    if args.doc:
        with open(args.doc, encoding="utf-8") as f:
            text = f.read()
        with open(args.doc, "w", encoding="utf-8") as f:
            f.write(with_section(text, section))
        print("# wrote %s" % args.doc, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
