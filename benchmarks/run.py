"""Benchmarks of tflms: rewrite time, memory saved, capacity, cost, fidelity.

One entry point::

    python benchmarks/run.py --suite quick          # < 10 min on 2 cores
    python benchmarks/run.py --suite full           # writes docs/benchmarks.md
    python -m benchmarks.run --suite smoke --out /tmp/bench

It prints markdown tables and writes, into ``--out`` (default ``.bench/``),
``results.json`` (every number, every probe), ``report.md`` (the tables)
and PNG plots. Sections (``--sections``, default all):

1. ``timing``: analysis, auto-tuning and rewrite time against graph size.
2. ``memory``: GPU / host peaks measured by the Grappler oracle: no LMS,
   TensorFlow's swapping and recomputation heuristics, tflms.
3. ``capacity``: largest image side, volume side and batch that fit a
   budget, without LMS, with TensorFlow's swapping, with tflms and, given
   ``--tflmsv2 PATH`` or ``$TFLMSV2_PATH``, with IBM's original TFLMSv2
   (`benchmarks.tflmsv2`).
4. ``cost``: transfer time per step on common links; CPU step time with and
   without LMS.
5. ``fidelity``: simulator peaks against the oracle and the real CPU
   allocator.

Every case runs in its own process (see `benchmarks.common`); ``--jobs``
runs that many cases of sections 2, 3 and 5 at once (sections 1 and 4
measure time and run one case at a time). ``--from-json`` renders the
report of an earlier run again without measuring anything; ``--update``
re-runs some sections of an earlier run and replaces them.
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import sys
import time

if __package__ in (None, ""):
    # Run as a script: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402
from benchmarks import report  # noqa: E402
from benchmarks import suites  # noqa: E402
from benchmarks import step_time  # noqa: E402

SECTIONS = ("timing", "memory", "capacity", "cost", "fidelity")
DEFAULT_DOC = os.path.join(common.ROOT, "docs", "benchmarks.md")


def _worker(section, case_json):
    import importlib
    module = importlib.import_module("benchmarks." + section)
    case = json.loads(case_json)
    common.emit(module.run(case))


def _parse(argv):
    parser = argparse.ArgumentParser(
        description="tflms benchmarks: rewrite time, memory saved, "
        "capacity, cost per step, simulator fidelity.")
    parser.add_argument("--suite", default="quick",
                        choices=sorted(suites.SUITES),
                        help="which sizes to run (default quick)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help="comma-separated subset of %s" % (SECTIONS,))
    parser.add_argument("--out", default=".bench",
                        help="folder for results.json, report.md and plots "
                        "(default .bench)")
    parser.add_argument("--doc", default=None,
                        help="also write the report as this markdown file "
                        "(the full suite writes %s unless --doc is given)"
                        % os.path.relpath(DEFAULT_DOC, common.ROOT))
    parser.add_argument("--no-doc", action="store_true",
                        help="do not write the doc even for --suite full")
    parser.add_argument("--jobs", type=int, default=1,
                        help="cases of sections 2-5 run at once (default 1)")
    parser.add_argument("--mem-ratio", type=float, default=0.9,
                        help="TF_LMS_SIMULATOR_MEM_RATIO for tflms "
                        "auto-tuning: the share of the budget it plans for "
                        "(default 0.9, the library's default; TensorFlow's "
                        "optimizer is always given the whole budget)")
    parser.add_argument("--tflmsv2", default=None, metavar="PATH",
                        help="a checkout of IBM's original TFLMSv2 "
                        "(tensorflow-large-model-support, branch tflmsv2) "
                        "for the capacity section's TFLMSv2 column (default "
                        "$TFLMSV2_PATH; without either that column says "
                        "it was not measured)")
    parser.add_argument("--timeout-scale", type=float, default=1.0,
                        help="multiply every case's time limit")
    parser.add_argument("--from-json", default=None,
                        help="render the report of an earlier results.json")
    parser.add_argument("--update", default=None,
                        help="run --sections again and replace them in this "
                        "earlier results.json (the command is recorded)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error("--sections: unknown %s; use names from %s"
                     % (", ".join(unknown), ", ".join(SECTIONS)))
    args.sections = sections
    if not 0 < args.mem_ratio <= 1:
        parser.error("--mem-ratio must be in (0, 1]; got %g" % args.mem_ratio)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1; got %d" % args.jobs)
    return args


def _run_section(section, cases, args, log):
    env = {"TF_LMS_SIMULATOR_MEM_RATIO": repr(args.mem_ratio)}
    if args.tflmsv2:  # else the workers inherit $TFLMSV2_PATH, if set
        env["TFLMSV2_PATH"] = os.path.abspath(args.tflmsv2)
    # Sections that time things run one case at a time.
    jobs = 1 if section in ("timing", "cost") else args.jobs

    def one(case):
        timeout = case.get("timeout_s", 600) * args.timeout_scale
        case = dict(case, timeout_s=timeout)
        result = common.run_case(section, case, timeout, env=env)
        result.setdefault("case", case)
        log("  %s %s: %.0f s%s" % (
            section, case.get("label") or case.get("model"),
            result["wall_s"],
            " (%s)" % result["error"] if result.get("error") else ""))
        return result

    if jobs == 1:
        return [one(c) for c in cases]
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, cases))


def main(argv=None):
    args = _parse(argv if argv is not None else sys.argv[1:])
    if args.worker:
        _worker(args.worker, args.case)
        return 0

    def log(text):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    command = "python benchmarks/run.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            data = json.load(f)
    elif args.update:
        with open(args.update, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("suite") != args.suite:
            raise SystemExit("--update: %s holds suite %r, not %r"
                             % (args.update, data.get("suite"), args.suite))
        cases = suites.suite(args.suite)
        data.setdefault("updates", []).append({
            "command": command, "sections": args.sections,
            "mem_ratio": args.mem_ratio,
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": common.machine_info()})
        os.makedirs(args.out, exist_ok=True)
        for section in args.sections:
            log("[bench] %s: %d cases (update)" % (section,
                                                   len(cases[section])))
            data["sections"][section] = _run_section(section, cases[section],
                                                     args, log)
            _write_json(args.out, data)
    else:
        cases = suites.suite(args.suite)
        start = time.perf_counter()
        data = {
            "suite": args.suite,
            "command": command,
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": common.machine_info(),
            "mem_ratio": args.mem_ratio,
            "sections": {},
        }
        os.makedirs(args.out, exist_ok=True)
        for section in args.sections:
            log("[bench] %s: %d cases" % (section, len(cases[section])))
            t0 = time.perf_counter()
            data["sections"][section] = _run_section(section, cases[section],
                                                     args, log)
            data.setdefault("section_s", {})[section] = \
                time.perf_counter() - t0
            _write_json(args.out, data)
        data["total_s"] = time.perf_counter() - start
    os.makedirs(args.out, exist_ok=True)
    data["plots"] = report.write_plots(data, args.out)
    _write_json(args.out, data)
    text = report.render(data)
    with open(os.path.join(args.out, "report.md"), "w",
              encoding="utf-8") as f:
        f.write(text)
    print(text)
    doc = args.doc
    if doc is None and data.get("suite") == "full" and not args.no_doc \
            and not args.from_json:
        doc = DEFAULT_DOC
    if doc:
        # The step-time section comes from benchmarks/step_time.py, not
        # from this suite: keep it.
        kept = None
        if os.path.exists(doc):
            with open(doc, encoding="utf-8") as f:
                kept = step_time.section_of(f.read())
        text = report.render(data, for_doc=True)
        if kept:
            text = step_time.with_section(text, kept)
        with open(doc, "w", encoding="utf-8") as f:
            f.write(text)
        log("[bench] wrote %s" % doc)
    return 0


def _write_json(out, data):
    path = os.path.join(out, "results.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
