"""Today's swap-only plan beside the plan chosen by predicted step time, at
one size and budget (issue 15, item 4: "cheaper plans at the same size").

    python benchmarks/cheaper_plans.py resnet50 --size 6592
    python benchmarks/cheaper_plans.py unet3d --size 352
    python benchmarks/cheaper_plans.py resnet50 --size 224 --batch 384

Auto-tunes the model for ``--gpu-mem`` GiB (default 16) times
TF_LMS_SIMULATOR_MEM_RATIO (default 0.9) four ways through
`pipeline.plan`, the path `LMS.run` takes:

* ``swap only, by bytes``: the tuner as before the step-time model (the
  fitting plan moving the fewest bytes; recompute off);
* ``swap only, by time``: the tuner's choice by predicted step time
  (``recompute=False``);
* ``swap + recompute, by time``: with ``recompute=True`` as well;
* ``default settings``: ``recompute`` left at its default (None, which
  recomputes when auto-tuning), the plan a user gets without asking.

For each it prints the swaps, swap-ins, recomputes, bytes out and in, the
simulated peak, and the predicted step and exposed transfer time
(`tflms.steptime`, ``--gpu``, ``--interconnect``), as one JSON line, then
a markdown table and whether the best exposed transfer is at most half of
the first plan's. Nothing is run: sizes are static.
"""

import argparse
import json
import os
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import common  # noqa: E402
from benchmarks import models  # noqa: E402
from tflms.tf import reader as tf_reader  # noqa: E402
from tflms import pipeline  # noqa: E402
from tflms import steptime  # noqa: E402
from tflms.settings import Settings  # noqa: E402

_GIB = float(1 << 30)

# (label, by_step_time, recompute), the first is the baseline.
VARIANTS = (
    ("swap only, by bytes", False, False),
    ("swap only, by time", True, False),
    ("swap + recompute, by time", True, True),
    ("default settings", True, None),
)


def measure(model, size=None, batch=1, gpu_mem=16.0,
            gpu=steptime.DEFAULT_GPU,
            interconnect=steptime.DEFAULT_INTERCONNECT, echo=True, waits=0,
            variants=VARIANTS, measure_plan=None):
    """One row per entry of `variants` (of `VARIANTS`; dicts), for `model`
    at `size`; each printed as a JSON line when made, with `echo`. With
    `waits`, each row also has ``idle_ms`` and ``waits`` (`step_waits`).

    `measure_plan`, if given, is called as ``measure_plan(built, planned)``
    after each plan is made, with the model built here (whose graph the
    plan's index refers to) and the `Planned`; the dict it returns is added
    to the row. A hook that applies the plan edits ``built.graph``, which
    the next variant's plan could then not be applied to: pass one variant
    per call then (each call builds the model afresh)."""
    start = time.perf_counter()
    built = models.build_sized(model, size, batch)
    index = tf_reader.build_index(built.graph)
    print("# built %s (%d ops) in %.0f s" % (
        built.description, index.num_ops, time.perf_counter() - start),
        file=sys.stderr, flush=True)
    base = Settings(batch_size=built.batch_size, autotune_gpu_mem=gpu_mem,
                    autotune_host_mem=common.SERVER_HOST_MEM_GIB,
                    gpu=gpu, interconnect=interconnect)
    roles = pipeline.classify(index, base)
    rows = []
    for label, by_time, recompute in variants:
        start = time.perf_counter()
        planned = pipeline.plan(index, base.replace(recompute=recompute),
                                roles=roles, by_step_time=by_time)
        seconds = time.perf_counter() - start
        step = steptime.predict_planned(planned, gpu=gpu,
                                        interconnect=interconnect)
        plan = planned.plan
        params = plan.params if plan is not None else None
        rows.append({
            "model": built.description, "plan": label,
            "budget_gib": round(planned.budget_bytes / _GIB, 3),
            "params": None if params is None else [
                params.swapout_threshold, params.swapin_ahead,
                params.swapin_groupby, params.sync_mode],
            "selected_tensors": planned.only_tensors is not None,
            "swaps": len(plan.swaps) if plan else 0,
            "swap_ins": plan.num_swap_ins if plan else 0,
            "recomputes": len(plan.recomputes) if plan else 0,
            "out_gib": round(step.swapout_bytes / _GIB, 3),
            "in_gib": round(step.swapin_bytes / _GIB, 3),
            "peak_gib": round(planned.with_lms.peak_device_bytes / _GIB, 3)
            if planned.with_lms is not None else None,
            "gpu": gpu,
            "link": steptime.interconnect_named(interconnect).label,
            "without_lms_ms": round(step.without_lms_s * 1e3, 1),
            "step_ms": round(step.with_lms_s * 1e3, 1),
            "exposed_ms": round(step.exposed_transfer_s * 1e3, 1),
            "recompute_ms": round(step.recompute_s * 1e3, 1),
            "plan_s": round(seconds, 1)})
        if waits:
            rows[-1]["idle_ms"], rows[-1]["waits"] = step_waits(
                step, planned.index, waits)
        if measure_plan is not None:
            rows[-1].update(measure_plan(built, planned))
        if echo:
            print(json.dumps(rows[-1]), flush=True)
    return rows


def step_waits(step, index, count):
    """Where the predicted step waits: the time the graph's own ops do not
    run (ms; copies waited for, and the recompute clones' compute) and its
    `count` longest gaps, each as ``[ms, start ms, the copy ending nearest
    the gap's end: "out" or "in", the swapped tensor's producer]``, in
    step order. A gap that ends with a copy is the compute waiting for it
    (a swap-in its reader needs, or a swap-out a reader waits for)."""
    gaps, busy_until = [], 0.0
    for start, end in sorted(zip(step.op_start_s, step.op_end_s)):
        if start > busy_until + 1e-9:
            gaps.append((busy_until, start))
        busy_until = max(busy_until, end)
    ends = [(sw.out_end_s, "out", sw.producer) for sw in step.swaps]
    ends += [(si.end_s, "in", sw.producer) for sw in step.swaps
             for si in sw.swap_ins]
    longest = sorted(gaps, key=lambda g: g[0] - g[1])[:count]
    described = []
    for start, end in sorted(longest):
        near = min(ends, key=lambda e: abs(e[0] - end)) if ends else None
        described.append([
            round((end - start) * 1e3, 1), round(start * 1e3, 1),
            near[1] if near else None,
            index.names[near[2]] if near else None])
    return round(sum(b - a for a, b in gaps) * 1e3, 1), described


def table(rows):
    """Markdown lines of `rows` (from `measure`, possibly several models)."""
    lines = [
        "| model | plan | params (t, a, g, sync) | swaps / swap-ins | "
        "recomputes | out / in | peak | step | exposed transfer | "
        "vs swap only, by bytes |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    base = {}
    for row in rows:
        first = base.setdefault(row["model"], row)
        ratio = (row["exposed_ms"] / first["exposed_ms"]
                 if first["exposed_ms"] else float("nan"))
        lines.append(
            "| %s | %s | %s%s | %d / %d | %d | %.2f / %.2f GiB | %.2f GiB | "
            "%.1f ms | %.1f ms | %.2fx |" % (
                row["model"], row["plan"],
                ", ".join(str(v) for v in row["params"] or ()),
                " (selected)" if row["selected_tensors"] else "",
                row["swaps"], row["swap_ins"], row["recomputes"],
                row["out_gib"], row["in_gib"], row["peak_gib"] or 0.0,
                row["step_ms"], row["exposed_ms"], ratio))
    return lines


def verdict(rows):
    """Per model: is the best exposed transfer at most half of the first?"""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        first = mine[0]["exposed_ms"]
        best = min(mine[1:], key=lambda r: r["exposed_ms"])
        lines.append(
            "%s: %s exposes %.1f ms against %.1f ms (%.2fx): %s" % (
                model, best["plan"], best["exposed_ms"], first,
                best["exposed_ms"] / first if first else float("nan"),
                "at most half" if best["exposed_ms"] <= first / 2
                else "more than half (goal missed by %.1f ms)"
                % (best["exposed_ms"] - first / 2)))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=["resnet50", "unet3d"])
    parser.add_argument("--size", type=int, default=None,
                        help="image side (resnet50) or volume side (unet3d)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--gpu-mem", type=float, default=16.0,
                        help="GiB to plan for (default 16)")
    parser.add_argument("--gpu", default=steptime.DEFAULT_GPU,
                        choices=list(steptime.GPUS))
    parser.add_argument("--interconnect",
                        default=steptime.DEFAULT_INTERCONNECT,
                        choices=list(steptime.INTERCONNECTS))
    args = parser.parse_args(argv)
    rows = measure(args.model, args.size, args.batch, args.gpu_mem,
                   args.gpu, args.interconnect)
    print("\n".join(table(rows)))
    print("\n".join(verdict(rows)))


if __name__ == "__main__":
    main()
