"""How long tracing and planning take on KerasHub's transformers, and which
planning stage costs most (issue 47, item 4; TensorFlow 2.16+ with Keras 3
and KerasHub).

    env -u TF_USE_LEGACY_KERAS TF_ENABLE_ONEDNN_OPTS=0 \
        python benchmarks/transformer_plan_time.py \
        [--family gpt2 llama gemma bert] [--seq 1024 2048 4096] \
        [--batch 8] [--gpu-mem 16] [--size small|tiny]

Each model is built from a config with random weights (no downloads;
`keras_hub_models`, its `FAMILIES`), compiled with AdamW and sparse
cross-entropy from logits, and its ``model.train_step`` traced by
``tf.function`` for one batch of ``--batch`` sequences of each length; the
step is then indexed and planned for ``--gpu-mem`` GiB as
``lms.function`` plans it for a GPU (`tf_function.step_of`, then
`pipeline.plan` on ``graph_step.step_target(settings, here=False)``).
Each (model, length) runs in a process of its own, so no case pays for
another's memory or imports.

The table: model, sequence, the step's ops, the CPU seconds
(`time.process_time`, which a busy machine does not inflate) of building
the model (its layers, weights and optimizer slots: what training without
LMS pays too, so outside the goal), of tracing the step, of indexing and
of planning, the last three's total against the goal (`GOAL_CPU_S`),
the costliest
planning stage (`pipeline.Planned.stage_seconds`) and its seconds, and
what the plan came to (fits, or the smallest plan a failed search names).

``--size small`` (the default) is GPT-2 small's published config and the
other families at the same depth and width (`FAMILIES` says how each
differs); ``--size tiny`` is two layers 64 wide, for the tests.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import common  # noqa: E402
from benchmarks import keras_hub_models  # noqa: E402

GOAL_CPU_S = 30.0  # issue 47: tracing and planning, any model, up to 4096

# The families and sizes, and the one builder (`keras_hub_models`).
FAMILIES = keras_hub_models.FAMILIES
SIZES = keras_hub_models.SIZES
signature = keras_hub_models.signature


def build(family, seq, size="small", seed=0):
    """The compiled KerasHub model of `family` at `size`, built for
    sequences of `seq` tokens (`keras_hub_models.build` of
    `keras_hub_models.sized`)."""
    return keras_hub_models.build(family, seq,
                                  keras_hub_models.sized(family, size), seed)


def measure(family, seq, batch, gpu_mem, size="small"):
    """One row (a dict): the CPU seconds of tracing, indexing and
    planning `family`'s step at `seq`, and what planning said."""
    import keras_hub  # noqa: F401 (imported before the clocks start)
    import tensorflow  # noqa: F401 (imported before the clocks start)
    from tflms import LMS
    from tflms import autotune
    from tflms import pipeline
    from tflms.tf.adapters import graph_step, tf_function
    row = {"family": family, "seq": seq}
    began = time.process_time()
    model = build(family, seq, size)
    row["build_s"] = time.process_time() - began
    began = time.process_time()
    concrete = keras_hub_models.trace(model, family, seq, batch)
    row["trace_s"] = time.process_time() - began
    row["ops"] = len(concrete.graph.get_operations())
    lms = LMS()
    lms.autotune_gpu_mem = gpu_mem
    lms.autotune_host_mem = common.SERVER_HOST_MEM_GIB
    lms.batch_size = batch
    began = time.process_time()
    _, index = tf_function.step_of(concrete.graph)
    row["index_s"] = time.process_time() - began
    row["step_ops"] = len(index.names)
    began = time.process_time()
    try:
        planned = pipeline.plan(
            index, lms.settings, target=graph_step.step_target(
                lms.settings, here=False))
    except autotune.AutotuneError as err:
        stages = err.stage_seconds
        row["outcome"] = "no plan: smallest %s" % common.fmt_bytes(
            err.smallest_peak_bytes)
    else:
        stages = planned.stage_seconds
        if planned.plan is None:
            row["outcome"] = "fits without LMS"
        else:
            row["outcome"] = "fits: %s, %d swapped" % (
                common.fmt_bytes(planned.with_lms.peak_device_bytes),
                len(planned.plan.swaps))
    row["plan_s"] = time.process_time() - began
    row["stages"] = [list(s) for s in stages]
    row["total_s"] = row["trace_s"] + row["index_s"] + row["plan_s"]
    return row


def costliest(row):
    """``(name, seconds)`` of the stage of `row` that took longest."""
    if not row.get("stages"):
        return ("-", 0.0)
    return tuple(max(row["stages"], key=lambda s: s[1]))


def table(rows, gpu_mem):
    """The markdown table of `rows`."""
    lines = [
        "| model | sequence | ops | build s | trace s | index s | plan s | "
        "trace + index + plan s (goal %g) | costliest stage | its s | "
        "%g GiB plan |" % (GOAL_CPU_S, gpu_mem),
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append("| %s | %d | - | - | - | - | - | - | - | - | "
                         "failed: %s |" % (r["family"], r["seq"],
                                           r["error"]))
            continue
        name, secs = costliest(r)
        lines.append(
            "| %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f%s | %s | %.1f "
            "| %s |"
            % (r["family"], r["seq"], r["ops"], r["build_s"], r["trace_s"],
               r["index_s"],
               r["plan_s"], r["total_s"],
               "" if r["total_s"] <= GOAL_CPU_S else " (over)", name, secs,
               r["outcome"]))
    return "\n".join(lines)


def _one(family, seq, args):
    """`measure` in a process of its own: its row."""
    command = [sys.executable, os.path.abspath(__file__), "--one",
               "--family", family, "--seq", str(seq), "--batch",
               str(args.batch), "--gpu-mem", str(args.gpu_mem), "--size",
               args.size]
    done = subprocess.run(command, capture_output=True, text=True,
                          check=False)
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr.strip().splitlines() or ["exit %d"
                                                 % done.returncode])[-1]
    return {"family": family, "seq": seq, "error": tail[:200]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", nargs="+", default=["gpt2"],
                        choices=sorted(FAMILIES))
    parser.add_argument("--seq", type=int, nargs="+",
                        default=[1024, 2048, 4096])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gpu-mem", type=float, default=16.0,
                        help="GPU memory, GiB (autotune_gpu_mem)")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--one", action="store_true",
                        help=argparse.SUPPRESS)  # a row, in this process
    args = parser.parse_args(argv)
    if args.one:
        common.setup_tensorflow("eager")
        row = measure(args.family[0], args.seq[0], args.batch, args.gpu_mem,
                      args.size)
        print(json.dumps(row), flush=True)
        return 0
    rows = []
    for family in args.family:
        for seq in args.seq:
            row = _one(family, seq, args)
            rows.append(row)
            if "error" in row:
                print("%s %d: failed: %s" % (family, seq, row["error"]),
                      flush=True)
                continue
            print("%s %d: %d ops, build %.1f s, trace %.1f s, index %.1f s, "
                  "plan %.1f s (%s)  stages: %s" % (
                      family, seq, row["ops"], row["build_s"], row["trace_s"],
                      row["index_s"], row["plan_s"], row["outcome"],
                      ", ".join("%s %.1f" % (n, s) for n, s in row["stages"]
                                if s >= 0.05)), flush=True)
    print(table(rows, args.gpu_mem))
    return 0


if __name__ == "__main__":
    sys.exit(main())
