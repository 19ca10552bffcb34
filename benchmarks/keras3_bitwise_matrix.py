"""Keras 3 applications trained with and without LMS, bit for bit, across
input sizes, budgets and both oneDNN modes, as issue 48 found its cases
(10 classes, 3 steps, a budget at a share of the peak) and at the large
sizes where Grappler's memory optimizer steps in; the grid of
tests/test_keras3_applications.py itself is run by
benchmarks/keras3_applications_grid.py.

    env -u TF_USE_LEGACY_KERAS python benchmarks/keras3_bitwise_matrix.py \\
        [ResNet50V2 Xception ...] [--sizes 224 320] [--ratios 0.6 0.8] \\
        [--of peak|activations] [--onednn 0 1] [--steps 3] \\
        [--grappler-repair] [--no-memory-scheduling] [--timeout 3600]

Each case is one run of `benchmarks/keras3_bitwise.py` in a process of its
own: an application at an input size, ``TF_ENABLE_ONEDNN_OPTS`` set, the
fit without LMS and the fit with it from the same seed (one inter-op
thread), LMS auto-tuned to a ratio of the peak its simulator predicts
without LMS (``--of activations``: of the peak's part above the
variables, slots and constants that stay on the device). Each of
``--sizes`` is raised to the application's smallest input (`SMALLEST`)
where it is below it. The default sizes are those of issue 48's cases:
at the smallest inputs, where the test trains each application, and up
to about 96 pixels, a Keras 3 step's peak is its update (the weights,
every gradient and the optimizer's slots), which no plan lowers
(ResNet50V2 at 32 and 96: the smallest plan is 95% of the peak or more).
The table: application, size, budget ratio, oneDNN, tensors swapped, swap
ops that ran, weights that differ, whether the losses are equal, the
``AddN`` nodes Grappler's memory optimizer accumulated in each fit (above
80% of the 256 MiB TensorFlow's CPU device declares, by its estimate; LMS's
swaps move the estimate, and no rule of LMS's keeps it: docs/tf2.md,
"Grappler's memory optimizer"; ``--no-memory-scheduling`` turns it off in
both fits), the verdict (``same`` only when every swap op ran and
nothing differs) and the seconds. A case takes 2 to 20 minutes at these
sizes on two CPU cores.
"""

import argparse
import os
import re
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))

# The smallest input each application accepts (Keras checks it), as
# tests/test_keras3_applications.py trains them.
SMALLEST = {"ResNet50": 32, "InceptionV3": 75, "NASNetMobile": 32,
            "DenseNet121": 32, "EfficientNetB0": 32, "ConvNeXtTiny": 32,
            "ResNet50V2": 32, "Xception": 71}

_SUMMARY = re.compile(r"^\S+ \d+, \d+ steps[^:]*: (\d+) tensors swapped, "
                      r"(\d+) recomputes, (\d+) of (\d+) swap ops ran", re.M)
_RUNS = re.compile(r"^\| (without LMS|with LMS) \| ([^|]*) \| ([^|]*) \|",
                   re.M)
_DIFFERENT = re.compile(r"^weights different: (\d+) of (\d+)", re.M)


def run_case(app, size, ratio, onednn, args):
    """One case's row (a dict), from `keras3_bitwise.py`'s output."""
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=str(onednn),
               TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_USE_LEGACY_KERAS", None)
    command = [sys.executable, os.path.join(_HERE, "keras3_bitwise.py"),
               app, str(size), "--ratio", str(ratio), "--of", args.of,
               "--steps", str(args.steps)]
    if args.grappler_repair:
        command.append("--grappler-repair")
    if args.no_memory_scheduling:
        command.append("--no-memory-scheduling")
    row = dict(app=app, size=size, ratio=ratio, onednn=onednn)
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, env=env, capture_output=True,
                              text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        row.update(verdict="timed out", seconds=args.timeout)
        return row
    row["seconds"] = time.perf_counter() - start
    summary = _SUMMARY.search(proc.stdout)
    different = _DIFFERENT.search(proc.stdout)
    runs = {run: (losses.strip(), addns.strip())
            for run, losses, addns in _RUNS.findall(proc.stdout)}
    if summary is None or different is None or len(runs) != 2:
        row["verdict"] = "failed (status %d): %s" % (
            proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1])
        return row
    swapped, _, ran, added = (int(g) for g in summary.groups())
    row.update(swapped=swapped, ran=ran, added=added,
               different=int(different.group(1)),
               weights=int(different.group(2)),
               losses_equal=runs["without LMS"][0] == runs["with LMS"][0],
               accumulated=(runs["without LMS"][1], runs["with LMS"][1]))
    row["verdict"] = ("same" if ran == added and row["different"] == 0
                      and row["losses_equal"] else "differs")
    return row


def table(rows):
    lines = ["| application | size | budget ratio | oneDNN | swapped | "
             "swap ops ran | weights different | losses equal | AddNs "
             "accumulated (without / with LMS) | verdict | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "swapped" not in r:
            lines.append("| %s | %d | %g | %s | | | | | | %s | %.0f |" % (
                r["app"], r["size"], r["ratio"],
                "on" if r["onednn"] else "off", r["verdict"], r["seconds"]))
            continue
        lines.append(
            "| %s | %d | %g | %s | %d | %d of %d | %d of %d | %s | %s / %s "
            "| %s | %.0f |" % (
                r["app"], r["size"], r["ratio"],
                "on" if r["onednn"] else "off", r["swapped"], r["ran"],
                r["added"], r["different"], r["weights"],
                "yes" if r["losses_equal"] else "no", r["accumulated"][0],
                r["accumulated"][1], r["verdict"], r["seconds"]))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("apps", nargs="*", default=sorted(SMALLEST),
                        help="keras.applications names (default: %s)"
                        % ", ".join(sorted(SMALLEST)))
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 320],
                        help="input heights and widths (each at least the "
                        "application's smallest)")
    parser.add_argument("--ratios", type=float, nargs="+",
                        default=[0.6, 0.8],
                        help="budgets as shares of the predicted peak (or "
                        "of its activations: --of)")
    parser.add_argument("--of", choices=("peak", "activations"),
                        default="peak",
                        help="what --ratios are shares of (keras3_bitwise.py "
                        "--of)")
    parser.add_argument("--onednn", type=int, nargs="+", choices=(0, 1),
                        default=[0, 1])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--grappler-repair", action="store_true")
    parser.add_argument("--no-memory-scheduling", action="store_true",
                        help="both fits with Grappler's memory optimizer "
                        "off (keras3_bitwise.py --no-memory-scheduling)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds per case")
    args = parser.parse_args(argv)
    unknown = [a for a in args.apps if a not in SMALLEST]
    if unknown:
        parser.error("no smallest input known for %s; one of %s"
                     % (", ".join(unknown), ", ".join(sorted(SMALLEST))))
    rows = []
    for app in args.apps:
        for asked in args.sizes:
            size = max(asked, SMALLEST[app])
            for ratio in args.ratios:
                for onednn in args.onednn:
                    row = run_case(app, size, ratio, onednn, args)
                    print("%s %d ratio %g oneDNN %d: %s (%.0f s)" % (
                        app, size, ratio, onednn, row["verdict"],
                        row["seconds"]), flush=True)
                    rows.append(row)
    print(table(rows))
    return 0 if all(r["verdict"] == "same" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
