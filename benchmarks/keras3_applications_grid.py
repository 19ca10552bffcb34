"""Keras 3 applications trained with and without LMS, bit for bit, over
the whole grid of tests/test_keras3_applications.py: each application at
its smallest input and at a second (twice as wide but InceptionV3's:
the test's SECOND_SIZES), with fixed parameters that
swap nearly every activation and with an auto-tuned budget between the
smallest plan and the peak, in both oneDNN modes. CI trains the part of
it that fits in its time (the test file's SUITE); this runs the rest by
hand (issue 48, item 3).

    env -u TF_USE_LEGACY_KERAS python benchmarks/keras3_applications_grid.py \\
        [APP ...] [--sizes smallest second] [--budgets fixed auto] \\
        [--onednn 0 1] [--no-memory-scheduling] [--timeout 1800]

Each case runs the test file as a script in a process of its own, as the
test does (``python tests/test_keras3_applications.py APP DUMP_DIR --size
S --budget B``: the fit without LMS and the fit with it from the same
seed, one inter-op thread), with the graphs of both fits dumped, so that
the row lists the ``AddN`` nodes Grappler's memory optimizer accumulated
in each (docs/tf2.md, "Grappler's memory optimizer": where they differ,
the fits add in other orders for that reason alone). A row's verdict is
``same`` when the test's checks (`problems`) find nothing, else what they
found. ``--no-memory-scheduling`` runs both fits with the memory
optimizer off (`keras3_bitwise.no_memory_scheduling`), to see whether a
difference is its alone. A case takes half a minute to 5 minutes on two
CPU cores; the whole grid (8 applications, 2 sizes, 2 budgets, 2 modes)
about 2 hours.
Returns 1 if any case does not train the same.
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TEST = os.path.join(_ROOT, "tests", "test_keras3_applications.py")
_MIB = float(1 << 20)


def _test_module():
    """tests/test_keras3_applications.py, for its grid and its checks."""
    sys.path[:0] = [os.path.dirname(_TEST), _ROOT]
    spec = importlib.util.spec_from_file_location("_applications", _TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(test, case, onednn, args):
    """One case's RESULT (a dict with ``onednn`` and ``verdict`` added),
    with `args`' timeout and memory optimizer."""
    app, size, budget = case
    folder = tempfile.mkdtemp(prefix="keras3_grid_")
    dump, without = (os.path.join(folder, d) for d in ("with", "without"))
    os.makedirs(dump)
    os.makedirs(without)
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=str(onednn),
               TF_CPP_MIN_LOG_LEVEL="2", TF_DUMP_GRAPH_PREFIX=dump,
               TF_DUMP_GRAPH_NAME_FILTER=test.DUMP_FILTER)
    env.pop("TF_USE_LEGACY_KERAS", None)
    env.pop("KERAS_BACKEND", None)
    row = dict(app=app, size=size, budget=budget, onednn=onednn)
    start = time.perf_counter()
    command = [sys.executable, _TEST, app, dump, "--size", str(size),
               "--budget", budget, "--dump-without", without]
    if args.no_memory_scheduling:
        command.append("--no-memory-scheduling")
    try:
        proc = subprocess.run(command, env=env, capture_output=True,
                              text=True, timeout=args.timeout, check=False,
                              cwd=_ROOT)
    except subprocess.TimeoutExpired:
        row.update(verdict="timed out", wall=args.timeout)
        return row
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    row["wall"] = time.perf_counter() - start
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
        row["verdict"] = "failed (status %d): %s" % (
            proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1])
        return row
    row.update(json.loads(lines[-1][len("RESULT "):]))
    row["verdict"] = "; ".join(row["problems"]) or "same"
    return row


def _budget(r):
    if r["budget"] == "fixed" or r.get("peak") is None:
        return r["budget"]
    return "auto: %.0f MiB (%.0f to %.0f)" % (
        r["budget_bytes"] / _MIB, r["smallest"] / _MIB, r["peak"] / _MIB)


def table(rows):
    """The rows as a Markdown table."""
    lines = ["| application | size | budget | oneDNN | swapped (recomputed) "
             "| swap ops ran | weights different | losses equal | AddNs "
             "accumulated (without / with LMS) | verdict | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mode = "on" if r["onednn"] else "off"
        if "outcome" not in r:
            lines.append("| %s | %d | %s | %s | | | | | | %s | %.0f |" % (
                r["app"], r["size"], r["budget"], mode, r["verdict"],
                r["wall"]))
            continue
        added = r["swapouts"] + r["swapins"]
        lines.append(
            "| %s | %d | %s | %s | %d (%d) | %d of %d | %d of %d | %s | "
            "%s / %s | %s | %.0f |" % (
                r["app"], r["size"], _budget(r), mode, r["swapouts"],
                r["recomputes"], added - len(r["missing"]), added,
                r["different"], r["num_weights"],
                "yes" if r["losses"] == r["base_losses"] else "no",
                ", ".join(r["base_accumulated"]) or "none",
                ", ".join(r["accumulated"]) or "none", r["verdict"],
                r["wall"]))
    return "\n".join(lines)


def main(argv=None):
    test = _test_module()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("apps", nargs="*", default=sorted(test.SIZES),
                        help="keras.applications names (default: all %d "
                        "of the test)" % len(test.SIZES))
    parser.add_argument("--sizes", nargs="+", default=["smallest", "second"],
                        choices=("smallest", "second"))
    parser.add_argument("--budgets", nargs="+", default=list(test.BUDGETS),
                        choices=test.BUDGETS)
    parser.add_argument("--onednn", type=int, nargs="+", choices=(0, 1),
                        default=[0, 1])
    parser.add_argument("--no-memory-scheduling", action="store_true",
                        help="both fits with Grappler's memory optimizer "
                        "off")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds per case")
    args = parser.parse_args(argv)
    unknown = [a for a in args.apps if a not in test.SIZES]
    if unknown:
        parser.error("%s not in the test's grid; one of %s"
                     % (", ".join(unknown), ", ".join(sorted(test.SIZES))))
    sizes = {"smallest": test.SIZES, "second": test.SECOND_SIZES}
    rows = []
    for app in args.apps:
        for which in args.sizes:
            for budget in args.budgets:
                for onednn in args.onednn:
                    case = (app, sizes[which][app], budget)
                    row = run_case(test, case, onednn, args)
                    print("%s %d %s oneDNN %d: %s (%.0f s)" % (
                        app, case[1], budget, onednn, row["verdict"],
                        row["wall"]), flush=True)
                    rows.append(row)
    if args.no_memory_scheduling:
        print("Grappler's memory optimizer off in both fits of each case")
    print(table(rows))
    return 0 if all(r["verdict"] == "same" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
