"""CPU time of `LMS.run` by phase on one benchmark graph, for speed work.

    python benchmarks/plan_speed.py deep_mlp 200000               # auto-tuned
    python benchmarks/plan_speed.py layered 200000 --fixed 30768,8,4
    python benchmarks/plan_speed.py deep_mlp 50000 --profile out.prof
    python benchmarks/plan_speed.py layered 200000 --no-recompute
    python benchmarks/plan_speed.py resnet50 --kwargs '{"image": 1024,
        "learning_phase": "placeholder", "optimizer": "adam"}' --budget-gib 1

Builds the graph (not timed), then runs `LMS.run` once and prints its CPU
time (`time.process_time`) and that of each phase: indexing, roles,
deferral, tuning, planning (every `make_plan`, tuning's included) and the
rewrite. Synthetic families take `num_ops`; the budget is, as in the timing
suites, `--fraction` of the step's activation memory above the resident
bytes. The section 1 suites (`benchmarks/run.py`) are the reference
numbers; this is the quick loop for one graph.
"""

import argparse
import collections
import cProfile
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# (module, function) pairs timed inside LMS.run; patched on the modules
# `tflms.lms` calls through, so the library itself carries no timers.
_PHASES = (("tf.reader", "build_index"), ("analysis", "classify_ops"),
           ("planner", "deferral_edges"), ("autotune", "tune"),
           ("planner", "make_plan"), ("tf.rewriter", "apply_plan"))


def _timed(totals, func):
    def wrapper(*args, **kwargs):
        start = time.process_time()
        try:
            return func(*args, **kwargs)
        finally:
            totals[func.__name__] += time.process_time() - start
    return wrapper


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("num_ops", type=int, nargs="?", default=None)
    parser.add_argument("--kwargs", default="{}",
                        help="builder keyword arguments as JSON")
    parser.add_argument("--fixed", default=None,
                        help="threshold,ahead,groupby: no tuning")
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--budget-gib", type=float, default=None)
    parser.add_argument("--control-flow", default="v2")
    parser.add_argument("--recompute", action=argparse.BooleanOptionalAction,
                        default=None,
                        help="plan with recompute=True (--recompute) or "
                             "False (--no-recompute); default: LMS's "
                             "default, which recomputes when auto-tuning")
    parser.add_argument("--profile", default=None,
                        help="write cProfile stats of LMS.run here")
    args = parser.parse_args(argv)

    from benchmarks import common
    common.setup_tensorflow(args.control_flow)
    from benchmarks import models, timing
    import importlib
    from tflms import LMS, analysis
    from tflms.tf import reader

    kwargs = json.loads(args.kwargs)
    if args.num_ops is not None:
        kwargs["num_ops"] = args.num_ops
    built = models.build(args.model, **kwargs)
    num_ops = built.num_ops  # before the rewrite adds swap ops
    if args.fixed:
        t, a, g = (int(x) for x in args.fixed.split(","))
        lms = LMS(swapout_threshold=t, swapin_ahead=a, swapin_groupby=g,
                  recompute=args.recompute)
        budget = None
    else:
        lms = LMS(recompute=args.recompute)
        if args.budget_gib is not None:
            budget = args.budget_gib
        else:
            index = reader.build_index(built.graph)
            roles = analysis.classify_ops(index)
            budget, _ = timing.budget_gib(
                {"budget_fraction": args.fraction}, index, roles,
                built.batch_size)
        lms.autotune_gpu_mem = budget
        lms.autotune_host_mem = common.SERVER_HOST_MEM_GIB
    lms.batch_size = built.batch_size

    totals = collections.Counter()
    patched = []
    for module_name, func_name in _PHASES:
        module = importlib.import_module("tflms." + module_name)
        func = getattr(module, func_name)
        patched.append((module, func_name, func))
        setattr(module, func_name, _timed(totals, func))
    profiler = cProfile.Profile() if args.profile else None
    try:
        start = time.process_time()
        if profiler:
            profiler.enable()
        result = lms.run(built.graph)
        if profiler:
            profiler.disable()
        total = time.process_time() - start
    finally:
        for module, func_name, func in patched:
            setattr(module, func_name, func)
    if profiler:
        profiler.dump_stats(args.profile)
    plan = result.plan
    print("%s: %d ops, %s" % (built.description, num_ops,
                              "fixed %s" % args.fixed if args.fixed
                              else "auto-tuned to %.4f GiB" % budget))
    print("LMS.run %.2f s CPU; %s" % (total, ", ".join(
        "%s %.2f" % (name, totals[name]) for _, name in _PHASES
        if name in totals)))
    if plan is not None:
        print("plan: %s, %d swaps, %d swap-ins, %d recomputes, %d bytes out"
              % (plan.params, len(plan.swaps), plan.num_swap_ins,
                 len(plan.recomputes), plan.swapout_bytes()))
        step = result.planned.step_time
        if step is not None:
            print("predicted step %.1f ms on %s over %s, %.1f ms exposed "
                  "transfer" % (step.with_lms_s * 1e3, step.gpu,
                                step.interconnect,
                                step.exposed_transfer_s * 1e3))
    else:
        print("plan: none (LMS not needed or nothing changed)")


if __name__ == "__main__":
    main()
