"""What a plan costs per step at the issue-26 sizes, over two links.

    python benchmarks/plan_cost.py                  # the three cases below
    python benchmarks/plan_cost.py --cases unet3d:352:1 --links pcie4

For each case (model, size, batch) and each link, the model is auto-tuned
for 16 GiB (``--gpu-mem``) (times TF_LMS_SIMULATOR_MEM_RATIO, default 0.9)
through `pipeline.plan`, planned *for that link* (`interconnect`), as
`benchmarks/cheaper_plans.py` does: by predicted step time without and
with ``recompute=True``. It prints one JSON line per plan (with where the
step waits: the time the graph's own ops do not run and its longest gaps,
each with the copy that ends nearest, `cheaper_plans.step_waits`) and a
markdown table of the predicted step (`tflms.steptime`, V100-SXM2-16GB)
against the same graph's step without LMS, with issue 26's goals beside
it (at most 1.4x over PCIe 4.0 x16, 1.1x over NVLink 2.0). Nothing is run on a
GPU; the step without LMS is the graph's compute alone, as if it fitted.

    python benchmarks/plan_cost.py --oracle         # each plan also replayed

With ``--oracle`` each plan is also judged by the oracle's runtime replay
(`tflms.tf.oracle`, through `benchmarks.measure.oracle_peaks`, as
`benchmarks/goal_plans.py` measures plans): the model is built afresh for
each plan, the plan is applied to that graph as `LMS.run` applies it
(`rewriter.apply_plan` with the planning index and the settings' CPU
device), and the rewritten step is replayed with copies instant. The row
gains ``oracle_gib`` (that runtime peak), ``grappler_gib`` (Grappler's own
``GraphMemory`` count of the same schedule, shown beside it, not judged),
``sim_instant_gib`` (the simulator's peak of the plan with copies instant,
the like-for-like count; ``peak_gib`` is the tuner's, copies timed at the
link), ``oracle_s`` and ``oracle_fits``, and the table the columns.

The verdict: a plan fits when the oracle's instant-copies peak is at most
the budget it was planned for, ``budget_bytes`` (``budget_gib`` in the
row: ``--gpu-mem`` times TF_LMS_SIMULATOR_MEM_RATIO, 14.4 GiB for 16), not
the GPU's whole memory. The tuner promised that bound, and the headroom
above it is kept for what neither the simulator nor the oracle counts
(kernel workspace, the CUDA context, allocator fragmentation), so a plan
that needs the headroom does not fit. The instant replay is the oracle's
judging replay: its timed replays never make an op wait for a copy, so
they overstate every plan whose readers wait for their swap-outs
(docs/benchmarks.md, "The goal plans with copies timed in the oracle").
The oracle's replay takes up to about 5 s per plan on these cases, the
whole run about a minute and a half (2026-11-26).
"""

import argparse
import json
import os
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import cheaper_plans  # noqa: E402

# Issue 26, item 2: the cases and the goal per link (step with LMS over
# step without).
CASES = (("resnet50", 6592, 1), ("unet3d", 352, 1), ("resnet50", 224, 1000))
GOALS = {"pcie4": 1.4, "nvlink2": 1.1}
# The plans compared (labels of `cheaper_plans.VARIANTS`).
PLANS = ("swap only, by time", "swap + recompute, by time",
         "default settings")
_GIB = float(1 << 30)


def oracle_of_plan(built, planned):
    """The oracle's judgement of `planned`'s plan (made on `built.graph`):
    the plan applied to `built.graph` as `LMS.run` applies it, then the
    step replayed by the oracle with copies instant (`measure.oracle_peaks`).

    Returns:
      dict with oracle_gib (the runtime peak), grappler_gib (Grappler's
      count), sim_instant_gib (the simulator's peak with copies instant),
      oracle_fits (the runtime peak at most ``planned.budget_bytes``) and
      oracle_s; without a plan (nothing needed) the graph is replayed as
      given.
    """
    # Imported here: the oracle pulls in Grappler, which the default run
    # does not need.
    from benchmarks import measure as measure_mod
    from tflms import pipeline
    from tflms.tf import rewriter
    if built.function is not None:
        raise ValueError("%s is a tf.function's step, which LMS rewrites "
                         "through tflms.tf.lms_function; plan_cost measures "
                         "Session graphs" % built.description)
    start = time.perf_counter()
    out = {}
    if planned.plan is not None:
        rewriter.apply_plan(built.graph, planned.index, planned.plan,
                            planned.context.settings.cpu_device)
        out["sim_instant_gib"] = round(
            pipeline.instant_replay(planned).peak_device_bytes / _GIB, 3)
    peaks = measure_mod.oracle_peaks(built.graph, built.train_op)
    out.update(
        oracle_gib=round(peaks["gpu_peak"] / _GIB, 3),
        grappler_gib=round(peaks["raw_gpu_peak"] / _GIB, 3),
        oracle_fits=peaks["gpu_peak"] <= planned.budget_bytes,
        oracle_s=round(time.perf_counter() - start, 1))
    print("# oracle of %s: %.3f GiB in %.0f s" % (
        built.description, out["oracle_gib"], out["oracle_s"]),
        file=sys.stderr, flush=True)
    return out


def measure(cases=CASES, links=tuple(GOALS), gpu_mem=16.0, waits=5,
            oracle=False):
    """Rows (dicts from `cheaper_plans.measure`, with ``interconnect`` and
    ``ratio`` added) for every case, link and plan of `PLANS`, planned for
    `gpu_mem` GiB, each with its idle time and `waits` longest waits
    (`cheaper_plans.step_waits`). With `oracle`, each plan is made on a
    build of its own and judged by `oracle_of_plan`."""
    variants = [v for v in cheaper_plans.VARIANTS if v[0] in PLANS]
    # The oracle's measurement applies each plan to the graph it was made
    # on, so each plan needs a build of its own: one variant per call.
    groups = [[v] for v in variants] if oracle else [variants]
    rows = []
    for model, size, batch in cases:
        for link in links:
            for row in (row for group in groups
                        for row in cheaper_plans.measure(
                            model, size, batch, gpu_mem, interconnect=link,
                            echo=False, waits=waits, variants=group,
                            measure_plan=oracle_of_plan if oracle
                            else None)):
                row["interconnect"] = link
                row["ratio"] = round(row["step_ms"] / row["without_lms_ms"],
                                     3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def table(rows):
    """Markdown lines: one row per model, link and plan; with the oracle's
    columns when the rows have them (`measure` with `oracle`)."""
    oracle = any("oracle_gib" in row for row in rows)
    lines = ["| model | link | plan | swaps / recomputes | out / in | "
             "step without LMS | step with LMS | idle | ratio | goal |"
             + (" budget | simulator, timed / instant | oracle, instant | "
                "Grappler's count | fits (oracle) |" if oracle else ""),
             "|---|---|---|---|---|---|---|---|---|---|"
             + ("---|" * 5 if oracle else "")]
    for row in rows:
        goal = GOALS.get(row["interconnect"])
        verdict = ("-" if goal is None else "%.1fx: %s" % (
            goal, "met" if row["ratio"] <= goal else "missed"))
        line = (
            "| %s | %s | %s | %d / %d | %.2f / %.2f GiB | %.1f ms | "
            "%.1f ms | %.1f ms | %.2fx | %s |" % (
                row["model"], row["link"], row["plan"], row["swaps"],
                row["recomputes"], row["out_gib"], row["in_gib"],
                row["without_lms_ms"], row["step_ms"], row["idle_ms"],
                row["ratio"], verdict))
        if oracle:
            line += " %s |" % " | ".join(_oracle_cells(row))
        lines.append(line)
    return lines


def _oracle_cells(row):
    """The oracle's cells of `table`, GiB."""
    def gib(value):
        return "-" if value is None else "%.2f" % value
    return [gib(row.get("budget_gib")),
            "%s / %s" % (gib(row.get("peak_gib")),
                         gib(row.get("sim_instant_gib"))),
            gib(row.get("oracle_gib")), gib(row.get("grappler_gib")),
            "-" if "oracle_fits" not in row
            else "yes" if row["oracle_fits"] else "**no**"]


def _case(text):
    try:
        model, size, batch = text.split(":")
        return model, int(size), int(batch)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "--cases takes MODEL:SIZE:BATCH (such as unet3d:352:1); got %r"
            % text) from None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", type=_case, default=CASES,
                        help="MODEL:SIZE:BATCH (model resnet50 or unet3d)")
    parser.add_argument("--links", nargs="+", default=list(GOALS),
                        choices=sorted(cheaper_plans.steptime.INTERCONNECTS))
    parser.add_argument("--gpu-mem", type=float, default=16.0,
                        help="GiB to plan for (default 16)")
    parser.add_argument("--oracle", action="store_true",
                        help="also apply each plan to a build of its own "
                             "and judge it by the oracle's runtime replay "
                             "(copies instant) against its budget")
    args = parser.parse_args(argv)
    rows = measure(args.cases, args.links, args.gpu_mem, oracle=args.oracle)
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
