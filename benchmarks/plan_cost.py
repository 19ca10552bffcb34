"""What a plan costs per step at the issue-26 sizes, over two links.

    python benchmarks/plan_cost.py                  # the three cases below
    python benchmarks/plan_cost.py --cases unet3d:352:1 --links pcie4

For each case (model, size, batch) and each link, the model is auto-tuned
for 16 GiB (``--gpu-mem``) (times TF_LMS_SIMULATOR_MEM_RATIO, default 0.9) through
`pipeline.plan`, planned *for that link* (`interconnect`), as
`benchmarks/cheaper_plans.py` does: by predicted step time without and
with ``recompute=True``. It prints one JSON line per plan (with where the
step waits: the time the graph's own ops do not run and its longest gaps,
each with the copy that ends nearest, `cheaper_plans.step_waits`) and a
markdown table of the predicted step (`tflms.steptime`, V100-SXM2-16GB)
against the same graph's step without LMS, with issue 26's goals beside
it (at most 1.4x over PCIe 4.0 x16, 1.1x over NVLink 2.0). Nothing is run on a GPU;
the step without LMS is the graph's compute alone, as if it fitted.
"""

import argparse
import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import cheaper_plans  # noqa: E402

# Issue 26, item 2: the cases and the goal per link (step with LMS over
# step without).
CASES = (("resnet50", 6592, 1), ("unet3d", 352, 1), ("resnet50", 224, 1000))
GOALS = {"pcie4": 1.4, "nvlink2": 1.1}
# The plans compared (labels of `cheaper_plans.VARIANTS`).
PLANS = ("swap only, by time", "swap + recompute, by time")


def measure(cases=CASES, links=tuple(GOALS), gpu_mem=16.0, waits=5):
    """Rows (dicts from `cheaper_plans.measure`, with ``interconnect`` and
    ``ratio`` added) for every case, link and plan of `PLANS`, planned for
    `gpu_mem` GiB, each with its idle time and `waits` longest waits
    (`cheaper_plans.step_waits`)."""
    rows = []
    for model, size, batch in cases:
        for link in links:
            for row in cheaper_plans.measure(
                    model, size, batch, gpu_mem, interconnect=link,
                    echo=False, waits=waits, variants=[
                        v for v in cheaper_plans.VARIANTS if v[0] in PLANS]):
                row["interconnect"] = link
                row["ratio"] = round(row["step_ms"] / row["without_lms_ms"],
                                     3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def table(rows):
    """Markdown lines: one row per model, link and plan."""
    lines = ["| model | link | plan | swaps / recomputes | out / in | "
             "step without LMS | step with LMS | idle | ratio | goal |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        goal = GOALS.get(row["interconnect"])
        verdict = ("-" if goal is None else "%.1fx: %s" % (
            goal, "met" if row["ratio"] <= goal else "missed"))
        lines.append(
            "| %s | %s | %s | %d / %d | %.2f / %.2f GiB | %.1f ms | "
            "%.1f ms | %.1f ms | %.2fx | %s |" % (
                row["model"], row["link"], row["plan"], row["swaps"],
                row["recomputes"], row["out_gib"], row["in_gib"],
                row["without_lms_ms"], row["step_ms"], row["idle_ms"],
                row["ratio"], verdict))
    return lines


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
    args = parser.parse_args(argv)
    rows = measure(args.cases, args.links, args.gpu_mem)
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
