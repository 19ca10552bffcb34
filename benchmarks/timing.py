"""Section 1: how long LMS takes before training starts, against graph size.

For each graph, every repetition builds the model afresh (building is timed
but is not LMS time) and measures the three steps of `tflms.LMS.run`, called
as it calls them (with Python's cyclic garbage collector paused, as
`LMS.run` pauses it):

* analysis: `tflms.tf.reader.build_index`;
* tune: `pipeline.plan` with every swap parameter on auto and the case's
  budget (roles, serialization and deferral edges, auto-tuning, the plan);
* rewrite: `rewriter.apply_plan` of that plan;
* fixed edit: ``LMS(swapout_threshold=..., swapin_ahead=...,
  swapin_groupby=..., sync_mode=...).run(graph)`` end to end on another
  fresh build, the edit a user pays on every start once the parameters are
  known.

The reported time of each phase is the median over the repetitions. The
growth exponent is the slope of log(time) against log(ops) over the
graphs of one synthetic family (same structure, different sizes), by least
squares, reported per family.
"""

import math
import os
import time

from benchmarks import common

__all__ = ["run", "growth_exponent", "tables", "exponents",
           "exponents_by_family", "SYNTHETIC_FAMILIES"]

# Model families built at many sizes with the same structure: the graphs
# the growth exponents are fitted over.
SYNTHETIC_FAMILIES = ("layered", "deep_mlp")


def budget_gib(case, index, roles, batch):
    """The tuning budget: given in GiB, or as a share of the step's
    activation memory (resident bytes stay), from one simulator replay."""
    if case.get("budget_gib") is not None:
        return float(case["budget_gib"]), None
    from tflms import simulator
    model = simulator.SimulationModel(index, roles, batch)
    start = time.perf_counter()
    result = model.replay(None, detail=False)
    replay_s = time.perf_counter() - start
    resident = result.resident_device_bytes
    target = resident + case["budget_fraction"] * (
        result.peak_device_bytes - resident)
    ratio = float(os.environ.get("TF_LMS_SIMULATOR_MEM_RATIO", "0.9"))
    return target / common.GIB / ratio, replay_s


class _Clock:
    """Wall and CPU time of one phase, stored in a row as ``<name>_s`` and
    ``<name>_cpu_s``. CPU time (this process) is what the phase costs on an
    idle machine; wall time includes waiting for a busy one."""

    def __init__(self, row, name):
        self.row, self.name = row, name

    def __enter__(self):
        self.wall = time.perf_counter()
        self.cpu = time.process_time()
        return self

    def __exit__(self, *exc):
        self.row[self.name + "_s"] = time.perf_counter() - self.wall
        self.row[self.name + "_cpu_s"] = time.process_time() - self.cpu


def run(case):
    """Worker: time LMS on one model, `case["reps"]` times."""
    common.setup_tensorflow(case.get("control_flow", "v2"))
    # Imported once the graph mode is chosen.
    from benchmarks import models
    from tflms import LMS
    from tflms import _gc, autotune, pipeline
    from tflms.tf import rewriter
    from tflms.tf import reader
    from tflms.settings import Settings

    out = {"case": case, "runs": [], "done": False}
    start_case = time.perf_counter()
    tuned = None

    def fixed_edit(row, params):
        fresh = models.build(case["model"], **case["kwargs"])
        lms = LMS(swapout_threshold=params[0], swapin_ahead=params[1],
                  swapin_groupby=params[2], sync_mode=params[3])
        lms.batch_size = fresh.batch_size
        with _Clock(row, "fixed"):
            result = lms.run(fresh.graph)
        row["fixed_swaps"] = len(result.swapout_ops)
        out["fixed_params"] = params

    for rep in range(case["reps"]):
        row = {}
        with _Clock(row, "build"):
            built = models.build(case["model"], **case["kwargs"])
        out.update(ops=built.num_ops, description=built.description)

        with _Clock(row, "analysis"), _gc.paused():
            index = reader.build_index(built.graph)
        out.update(levels=index.num_levels, edges=index.num_edges)
        if rep == 0:
            roles = pipeline.classify(index, Settings())
            budget, replay_s = budget_gib(case, index, roles,
                                          built.batch_size)
            out["budget_gib"] = budget
            out["replay_s"] = replay_s

        fixed = common.fixed_params(case.get("fixed"), index.num_levels)
        if fixed is not None:
            # Before tuning, which may not finish in time on large graphs.
            fixed_edit(row, fixed)
            out["runs"].append(row)
            common.emit(out)
            out["runs"].pop()

        planned = None
        settings = Settings(batch_size=built.batch_size,
                            autotune_gpu_mem=out["budget_gib"],
                            autotune_host_mem=common.SERVER_HOST_MEM_GIB)
        try:
            with _Clock(row, "tune"), _gc.paused():
                planned = pipeline.plan(index, settings)
            row["simulations"] = planned.tune.simulations
        except autotune.AutotuneError as err:
            out["tune_error"] = str(err).split(": the")[0]
        if planned is not None:  # no rewrite when nothing fits
            swaps = 0
            with _Clock(row, "rewrite"), _gc.paused():
                if planned.needed:
                    result = rewriter.apply_plan(built.graph, planned.index,
                                                 planned.plan,
                                                 settings.cpu_device)
                    swaps = len(result.swapout_ops)
            if planned.needed:
                p = planned.params
                tuned = [p.swapout_threshold, p.swapin_ahead,
                         p.swapin_groupby, p.sync_mode]
                out["swapout_bytes"] = int(planned.plan.swapout_bytes())
            row["tuned_swaps"] = swaps
        out["tuned_params"] = tuned
        if fixed is None and case.get("fixed") == "tuned" and tuned:
            fixed_edit(row, tuned)
        out["runs"].append(row)
        common.emit(out)
        elapsed = time.perf_counter() - start_case
        if elapsed * (rep + 2) / (rep + 1) > case.get("soft_limit_s", 1e9):
            break  # another repetition would overrun the case's time
    out["done"] = True
    return out


def _med(runs, key):
    values = [r[key] for r in runs if key in r]
    return common.median(values) if values else None


PHASES = ("build", "analysis", "tune", "rewrite", "fixed")


def summarize(result):
    """Medians of one case's repetitions: ``<phase>_s`` (wall) and
    ``<phase>_cpu_s``, plus ``auto_total_s`` / ``auto_total_cpu_s``
    (analysis + tune + rewrite; None if tuning found no plan)."""
    runs = result.get("runs", [])
    row = {}
    for phase in PHASES:
        for suffix in ("_s", "_cpu_s"):
            row[phase + suffix] = _med(runs, phase + suffix)
    row["reps"] = len(runs)
    for suffix in ("_s", "_cpu_s"):
        parts = [row[p + suffix] for p in ("analysis", "tune", "rewrite")]
        row["auto_total" + suffix] = (None if None in parts
                                      else sum(parts))
    return row


def growth_exponent(points):
    """Least-squares slope of log(seconds) on log(ops); None if < 2 points."""
    pts = [(math.log(n), math.log(s)) for n, s in points if s and s > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:
        return None
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def _fmt_s(value, error=None, limit=None):
    if value is None:
        if error and "timed out" in error:
            return "> %d s (limit)" % limit if limit else "timed out"
        return "n/a"
    if value < 1:
        return "%.0f ms" % (value * 1000)
    return "%.2f s" % value


def _cell(summary, phase, error=None, limit=None):
    """``wall (cpu)`` of a phase."""
    wall = summary.get(phase + "_s")
    cpu = summary.get(phase + "_cpu_s")
    if wall is None:
        return _fmt_s(None, error, limit)
    return "%s (%s)" % (_fmt_s(wall), _fmt_s(cpu))


def exponents(results, family="layered"):
    """Growth exponents of CPU time per phase over the graphs of one
    synthetic family: {phase: (exponent or None, number of sizes)}."""
    exps = {}
    for phase in ("analysis", "tune", "rewrite", "fixed", "auto_total"):
        pts = []
        for r in results:
            if r.get("case", {}).get("model") != family:
                continue
            value = summarize(r).get(phase + "_cpu_s")
            if value:
                pts.append((r["ops"], value))
        exps[phase] = (growth_exponent(pts), len(pts))
    return exps


def exponents_by_family(results):
    """`exponents` of every synthetic family measured at two sizes or more:
    {family: {phase: (exponent or None, number of sizes)}}."""
    out = {}
    for family in SYNTHETIC_FAMILIES:
        exps = exponents(results, family)
        if any(value is not None for value, _ in exps.values()):
            out[family] = exps
    return out


def tables(results):
    """Markdown for section 1."""
    lines = [
        "| graph | ops | levels | budget | build | analysis | tune | "
        "rewrite | auto total | fixed edit | swaps (tuned / fixed) | runs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s = summarize(r)
        case = r.get("case", {})
        err = r.get("error")
        limit = case.get("timeout_s")
        runs = r.get("runs", [])
        last = runs[-1] if runs else {}
        budget = r.get("budget_gib")
        cells = [_cell(s, p, err, limit) for p in
                 ("analysis", "tune", "rewrite", "auto_total", "fixed")]
        if r.get("tune_error"):
            cells[2] = cells[3] = "no plan"
        lines.append(
            "| %s | %s | %s | %s | %s | %s | %s / %s | %d |" % (
                case.get("label", case.get("model")), r.get("ops", "?"),
                r.get("levels", "?"),
                common.fmt_bytes(budget * common.GIB)
                if budget is not None else "?",
                _fmt_s(s["build_s"]), " | ".join(cells),
                last.get("tuned_swaps", "-"), last.get("fixed_swaps", "-"),
                s["reps"]))
    text = "\n".join(lines)
    notes = ["- %s: %s (tuning took %s)." % (
        r.get("case", {}).get("label"), r["tune_error"],
        _cell(summarize(r), "tune")) for r in results
             if r.get("tune_error")]
    if notes:
        text += "\n\n" + "\n".join(notes)
    lines = []
    for family, exps in exponents_by_family(results).items():
        parts = []
        for key, label in (("analysis", "analysis"), ("tune", "tune"),
                           ("rewrite", "rewrite"), ("fixed", "fixed edit"),
                           ("auto_total", "auto total")):
            value, _ = exps[key]
            if value is not None:
                parts.append("%s %.2f" % (label, value))
        lines.append("| %s | %d | %s |" % (
            family, max(n for _, n in exps.values()), ", ".join(parts)))
    if lines:
        text += ("\n\nGrowth exponent k per synthetic family (time ~ ops^k, "
                 "least squares on log CPU time over the graphs of the "
                 "family that finished each phase):\n\n"
                 "| family | sizes | exponents |\n|---|---:|---|\n"
                 + "\n".join(lines))
    return text


def plot(results, path):
    """Log-log plot of phase times against ops; returns the path or None."""
    axes = common.new_axes(width=7.0)
    if axes is None:
        return None
    fig, ax = axes
    drawn = False
    for key, label, marker in (("analysis_cpu_s", "analysis", "o"),
                               ("tune_cpu_s", "tune", "s"),
                               ("rewrite_cpu_s", "rewrite", "^"),
                               ("fixed_cpu_s", "fixed edit", "D")):
        pts = sorted((r["ops"], summarize(r)[key]) for r in results
                     if r.get("ops") and summarize(r)[key])
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker,
                    linestyle="none", label=label)
            drawn = True
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ops in the graph")
    ax.set_ylabel("CPU seconds (median)")
    ax.set_title("LMS time against graph size")
    ax.grid(True, which="both", alpha=0.3)
    if not drawn:
        return None
    ax.legend()
    return common.save_figure(fig, path)
