"""The capacity goals' plans, measured by the oracle with copies instant
and timed (docs/benchmarks.md, section 3, "The goal plans with copies timed
in the oracle").

    TF_LMS_SIMULATOR_MEM_RATIO=0.9 python benchmarks/goal_plans.py

For each case (Keras ResNet50 at 8000x8000, the 3D U-Net at 384^3,
ResNet50 at 224x224 with batch 1400; or ``--case MODEL:SIZE`` with MODEL
resnet50, unet3d or resnet50-batch), auto-tunes with the public
`tflms.LMS` for ``--gpu-mem`` GiB (default 16) and prints, in GiB: the
simulator's peak of the plan with copies timed (what the tuner fits to the
budget) and with copies instant, the oracle's runtime peak with instant
copies and with copies timed on each ``--links`` link, and Grappler's own
count. One JSON line per case, then a markdown table. About a minute per
case on 2 cores. Nothing is run: sizes are static.
"""

import argparse
import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import common  # noqa: E402

_GIB = float(1 << 30)
CASES = ("resnet50:8000", "unet3d:384", "resnet50-batch:1400")
_LABELS = {"resnet50": "ResNet50 %dx%d", "unet3d": "3D U-Net %d^3",
           "resnet50-batch": "ResNet50 224x224, batch %d"}


def _build(case):
    from benchmarks import models
    name, size = case.split(":")
    size = int(size)
    if name == "resnet50":
        return models.build("resnet50", image=size, batch=1), \
            _LABELS[name] % (size, size)
    if name == "resnet50-batch":
        return models.build("resnet50", image=224, batch=size), \
            _LABELS[name] % size
    if name == "unet3d":
        return models.build("unet3d", volume=size, base_filters=16, depth=4,
                            batch=1), _LABELS[name] % size
    raise SystemExit("--case %r: use resnet50:SIZE, unet3d:SIZE or "
                     "resnet50-batch:BATCH" % case)


def measure_case(case, gpu_mem, links):
    """One case's row (dict)."""
    from benchmarks import measure
    built, label = _build(case)
    row = measure.apply_tflms(built, budget_gib=gpu_mem)
    out = {"case": case, "label": label, "status": row["status"],
           "params": row.get("params"),
           "sim_peak_gib": round(row.get("sim_peak", 0) / _GIB, 3),
           "sim_instant_gib": round(row.get("sim_instant_peak", 0) / _GIB,
                                    3)}
    if row["status"] == "no fit":
        out["error"] = row.get("error")
        return out
    for link in (None,) + tuple(links):
        peaks = measure.oracle_peaks(built.graph, built.train_op,
                                     interconnect=link)
        out["oracle_%s_gib" % (link or "instant")] = round(
            peaks["gpu_peak"] / _GIB, 3)
        out["grappler_gib"] = round(peaks["raw_gpu_peak"] / _GIB, 3)
    return out


def table(rows, links):
    head = ("| plan | params (t, a, g, sync) | simulator, copies timed | "
            "simulator, instant | oracle, instant | "
            + " | ".join("oracle, %s" % link for link in links)
            + " | Grappler's count |")
    lines = [head, "|" + "---|" * (6 + len(links))]
    for r in rows:
        if r["status"] == "no fit":
            lines.append("| %s | no plan fits: %s |" % (r["label"],
                                                         r.get("error")))
            continue
        cells = [r["label"], ", ".join(str(p) for p in r["params"] or ()),
                 "%.2f" % r["sim_peak_gib"], "%.2f" % r["sim_instant_gib"],
                 "%.2f" % r["oracle_instant_gib"]]
        cells += ["%.2f" % r["oracle_%s_gib" % link] for link in links]
        cells.append("%.2f" % r["grappler_gib"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", action="append",
                        help="MODEL:SIZE (repeatable; default: the three "
                             "goals %s)" % ", ".join(CASES))
    parser.add_argument("--gpu-mem", type=float, default=16.0,
                        help="GiB to auto-tune for (times "
                             "TF_LMS_SIMULATOR_MEM_RATIO)")
    parser.add_argument("--links", default="nvlink2,pcie4",
                        help="comma-separated links for the oracle's timed "
                             "replay (default nvlink2,pcie4)")
    args = parser.parse_args(argv)
    common.setup_tensorflow("v2")
    links = tuple(l for l in args.links.split(",") if l)
    rows = []
    for case in args.case or CASES:
        rows.append(measure_case(case, args.gpu_mem, links))
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows, links))
    return 0


if __name__ == "__main__":
    sys.exit(main())
