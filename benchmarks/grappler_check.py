"""What `tflms.tf.grappler_check` costs, and what it finds, on Keras 3
applications' ``fit()`` steps (TensorFlow 2.16+ with Keras 3).

    env -u TF_USE_LEGACY_KERAS python benchmarks/grappler_check.py \
        [ResNet50 MobileNetV2 ...] [--image 64] [--repeat 3] [--repair]

Each application's ``train_step`` is traced as a `tf.function`
(`benchmarks.models.keras3_app`, batch 1: the graph, and so the check's
cost, is the same at every image size), planned and rewritten as
``lms.function`` does with nearly every activation swapped (swap-out
threshold 1, swap-in ahead 1, no grouping), then checked: Grappler's meta
optimizer on the step before and after the rewrite, compared. A row per
application: the step's ops, the swaps, the rewrite's time, one Grappler
optimization of the step alone, the whole check (best of ``--repeat``;
two optimizations and the comparison) and the differences it found.

``--repair`` adds a row per application with ``grappler_repair`` on, on a
step traced again: the swaps the repaired plan kept, the rewrite's time
with the repair in it (the plan tried on a copy of the step, Grappler's
optimizations and the rounds of dropping), and the differences left.
"""

import argparse
import os
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from benchmarks import common  # noqa: E402

FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


def measure(app, image, repeat):
    """A dict of the row of `app` (see the module docstring)."""
    from benchmarks import models
    from tflms import LMS
    from tflms.tf import grappler_check
    from tflms.tf.adapters import rewrite, tf_function
    built = models.build("keras3_app", app=app, image=image, batch=1,
                         classes=10)
    graph = built.graph
    fetches = [op.name for op in tf_function.step_fetches(graph).ops]
    before = grappler_check.graph_def_of(graph)
    config = grappler_check.config_for(graph)
    start = time.perf_counter()
    grappler_check.optimize(before, fetches, config)
    once = time.perf_counter() - start
    lms = LMS(**FIXED)
    start = time.perf_counter()
    result = rewrite.rewrite_function_graph(graph, lms.settings)
    rewrite = time.perf_counter() - start
    reports = [grappler_check.check(before, graph, fetches, config)
               for _ in range(repeat)]
    report = min(reports, key=lambda r: r.seconds)
    return dict(app=app, ops=len(before.node),
                swaps=len(result.swapout_ops), rewrite_s=rewrite,
                optimize_s=once, check_s=report.seconds,
                differences=len(report.differences), report=report)


def measure_repair(app, image):
    """The ``--repair`` row of `app`: the same step rewritten with
    ``grappler_repair`` on."""
    from benchmarks import models
    from tflms import LMS
    from tflms.tf.adapters import rewrite
    built = models.build("keras3_app", app=app, image=image, batch=1,
                         classes=10)
    lms = LMS(**FIXED)
    lms.grappler_repair = True
    start = time.perf_counter()
    result = rewrite.rewrite_function_graph(built.graph, lms.settings)
    seconds = time.perf_counter() - start
    report = result.grappler
    return dict(app=app + " repaired", ops=len(built.graph.get_operations()),
                swaps=len(result.swapout_ops), rewrite_s=seconds,
                differences=(-1 if report is None
                             else len(report.differences)), report=report)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("apps", nargs="*", default=["ResNet50"],
                        help="keras.applications names (default ResNet50)")
    parser.add_argument("--image", type=int, default=64,
                        help="image height and width (default 64)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="checks per application; the best is shown")
    parser.add_argument("--show", type=int, default=5,
                        help="differences to print per application")
    parser.add_argument("--repair", action="store_true",
                        help="also rewrite each step with grappler_repair "
                        "on and show what it kept")
    args = parser.parse_args(argv)
    common.setup_tensorflow("eager")
    print("%-14s %6s %6s %10s %11s %8s %6s" % (
        "application", "ops", "swaps", "rewrite s", "optimize s", "check s",
        "diffs"))
    for app in args.apps:
        row = measure(app, args.image, args.repeat)
        print("%-14s %6d %6d %10.2f %11.2f %8.2f %6d" % (
            row["app"], row["ops"], row["swaps"], row["rewrite_s"],
            row["optimize_s"], row["check_s"], row["differences"]))
        for line in row["report"].lines(limit=args.show)[1:]:
            print("    " + line[:160])
        if args.repair:
            row = measure_repair(app, args.image)
            print("%-14s %6d %6d %10.2f %11s %8s %6d" % (
                row["app"], row["ops"], row["swaps"], row["rewrite_s"], "-",
                "-", row["differences"]))
            if row["report"] is not None:
                for line in row["report"].lines(limit=args.show)[1:]:
                    print("    " + line[:160])
    return 0


if __name__ == "__main__":
    sys.exit(main())
