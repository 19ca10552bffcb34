"""Section 4: what swapping costs per training step.

Two parts:

* Predicted transfer time (`transfer_table`, no worker): from the bytes a
  plan moves per step (section 2's swap-out and swap-in bytes) and the
  link's bandwidth per direction. Links are full duplex, so copies out and
  copies in can overlap: ``max(out, in) / bandwidth`` is the least time the
  copies need, a lower bound on the overhead when compute cannot hide them.
  It stands next to the simulated compute time of the step (the Grappler
  cost model's V100 estimate for the graph without LMS).
* Measured CPU step time (`run`, a worker): median wall time of training
  steps on this machine's CPU, without LMS and after the tflms rewrite
  (auto-tuned to a share of the step's memory). Here host and "device" are
  the same memory, so the swap ops are plain ``Identity`` ops that forward
  their buffer: the difference is the cost of the extra ops and control
  dependencies, which should be about zero. The swap ops are checked to run
  (they appear in the traced step's stats). TensorFlow's own swap kernels
  exist only in GPU builds, so its swapping cannot be run here.
"""

from benchmarks import common
from benchmarks import timing
# One table of links for the library and the benchmarks: (label, GB/s per
# direction, theoretical peak), with its sources in tflms/hardware.py.
from tflms.tf import reader
from tflms.steptime import LINKS

__all__ = ["LINKS", "run", "transfer_table", "tables"]

_PLANS = (("tf_swap", "TF swapping"), ("tflms_fixed", "tflms fixed"),
          ("tflms_auto", "tflms auto"))


def run(case):
    """Worker: CPU step time without and with tflms."""
    common.setup_tensorflow(case.get("control_flow", "v2"))
    from benchmarks import cpu_measure, measure, models
    from tflms import pipeline
    from tflms.settings import Settings
    out = {"case": case, "done": False}
    plain = models.build(case["model"], **case["kwargs"])
    out.update(ops=plain.num_ops, description=plain.description)
    index = reader.build_index(plain.graph)
    roles = pipeline.classify(index, Settings())
    budget, _ = timing.budget_gib(case, index, roles, plain.batch_size)
    out["budget_gib"] = budget
    rewritten = models.build(case["model"], **case["kwargs"])
    edit = measure.apply_tflms(rewritten, budget_gib=budget)
    if edit["status"] != "swapped":
        # Too small to need (or allow) tuning: swap with fixed parameters,
        # the point here is what the swap ops cost.
        rewritten = models.build(case["model"], **case["kwargs"])
        edit = measure.apply_tflms(rewritten, params=common.fixed_params(
            case["fallback_fixed"], index.num_levels))
        edit["fallback"] = True
    out["edit"] = edit
    common.emit(out)
    out["without"], out["with"] = cpu_measure.cpu_step_pair(
        plain, rewritten, steps=case["steps"])
    out["done"] = True
    return out


def transfer_table(memory_results):
    """Markdown: predicted transfer time per step for each link."""
    head = ("| model | method | out | in | simulated V100 step | "
            + " | ".join(name for name, _ in LINKS) + " |")
    rule = "|---|---|---:|---:|---:|" + "---:|" * len(LINKS)
    lines = [head, rule]
    for r in memory_results:
        configs = r.get("configs", {})
        compute = configs.get("none", {}).get("step_s")
        for key, label in _PLANS:
            v = configs.get(key)
            if not v or "error" in v:
                continue
            out_b = v.get("swapout_bytes", 0) or 0
            in_b = v.get("swapin_bytes", 0) or 0
            if not out_b and not in_b:
                continue  # nothing swapped (see section 2)
            cells = []
            for _, gbps in LINKS:
                secs = max(out_b, in_b) / (gbps * 1e9)
                text = _ms(secs)
                if compute:
                    text += " (%.2fx)" % (secs / compute)
                cells.append(text)
            lines.append("| %s | %s | %s | %s | %s | %s |" % (
                r.get("case", {}).get("model"), label,
                common.fmt_bytes(out_b), common.fmt_bytes(in_b),
                _ms(compute) if compute else "-", " | ".join(cells)))
    return "\n".join(lines)


def _ms(seconds):
    if seconds is None:
        return "-"
    if seconds >= 1:
        return "%.2f s" % seconds
    return "%.1f ms" % (seconds * 1000)


def tables(memory_results, step_results):
    """Markdown for section 4."""
    text = transfer_table(memory_results)
    text += ("\n\nTime = max(swap-out bytes, swap-in bytes) / bandwidth per "
             "direction (GB/s: " + ", ".join(
                 "%s %g" % (n, g) for n, g in LINKS) + "); in brackets, the "
             "ratio to the simulated compute time of the step. Below 1 the "
             "copies can hide behind compute if they overlap perfectly.")
    lines = ["| model | steps | CPU step without LMS | with tflms | "
             "overhead | swap ops run | swapped out |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in step_results:
        w = r.get("without", {})
        l = r.get("with", {})
        over = "-"
        if w.get("step_s") and l.get("step_s"):
            over = "%+.1f%%" % (100.0 * (l["step_s"] - w["step_s"])
                                / w["step_s"])
        err = " (incomplete: %s)" % r["error"] if r.get("error") else ""
        lines.append("| %s%s | %s | %s | %s | %s | %s | %s |" % (
            r.get("description", r.get("case", {}).get("model")), err,
            w.get("steps", "-"), _ms(w.get("step_s")), _ms(l.get("step_s")),
            over, l.get("swap_ops_run", "-"),
            common.fmt_bytes(r.get("edit", {}).get("swapout_bytes") or 0)))
    return text + "\n\n" + "\n".join(lines)
