"""Section 2: device memory saved, measured by the Grappler oracle.

One model at one size, five ways, each measured by `tflms.tf.oracle` on a
simulated V100 (compute ops on ``/device:GPU:0``); the GPU peak is the
oracle's runtime peak (`benchmarks.measure.oracle_peaks`):

* no LMS;
* TensorFlow's swapping: Grappler ``memory_optimization =
  SWAPPING_HEURISTICS`` applied offline by ``tf_optimizer.OptimizeGraph`` on
  the oracle's virtual cluster, whose GPU has the case's budget as memory
  (the heuristic only acts when the step does not fit that memory);
* TensorFlow's recomputation: ``RECOMPUTATION_HEURISTICS`` the same way;
* tflms with fixed parameters;
* tflms auto-tuned to the budget (``autotune_gpu_mem``).

See `benchmarks.measure` for how TensorFlow's swap ops are measured.
"""

import time

from benchmarks import common

__all__ = ["CONFIGS", "run", "tables"]

CONFIGS = (
    ("none", "no LMS"),
    ("tf_swap", "TF swapping (SWAPPING_HEURISTICS)"),
    ("tf_recompute", "TF recomputation (RECOMPUTATION_HEURISTICS)"),
    ("tflms_fixed", "tflms, fixed parameters"),
    ("tflms_auto", "tflms, auto-tuned to the budget"),
)


def run(case):
    """Worker: measure one model five ways."""
    common.setup_tensorflow(case.get("control_flow", "v2"))
    from benchmarks import measure, models
    budget = int(case["budget_gib"] * common.GIB)
    out = {"case": case, "configs": {}, "done": False}

    def record(key, values):
        out["configs"][key] = values
        common.emit(out)

    from tflms.tf import reader
    built = models.build(case["model"], **case["kwargs"])
    levels = reader.build_index(built.graph).num_levels
    out.update(ops=built.num_ops, description=built.description,
               levels=levels)
    values = measure.oracle_peaks(built.graph, built.train_op)
    values["as_given_gpu_peak"] = measure.oracle_peaks(
        built.graph, built.train_op, forward=False)["gpu_peak"]
    record("none", values)

    for key, mode in (("tf_swap", "SWAPPING_HEURISTICS"),
                      ("tf_recompute", "RECOMPUTATION_HEURISTICS")):
        start = time.perf_counter()
        try:
            optimized, info = measure.grappler_memory_optimize(
                built.graph, built.train_op, mode, budget)
            values = measure.oracle_peaks(optimized, built.train_op.name,
                                          place=False)
            values.update(info)
            values["did_nothing"] = (info["swap_outs"] == 0
                                     and info["recomputed"] == 0)
        except Exception as err:
            values = {"error": "%s: %s" % (type(err).__name__, err)}
        values["method_s"] = time.perf_counter() - start
        record(key, values)

    auto = models.build(case["model"], **case["kwargs"])
    edit = measure.apply_tflms(auto, budget_gib=case["budget_gib"])
    values = dict(edit)
    if edit["status"] != "no fit":
        values.update(measure.oracle_peaks(auto.graph, auto.train_op))
    record("tflms_auto", values)

    fixed = common.fixed_params(case.get("fixed"), levels,
                                edit.get("params"))
    if fixed:
        again = models.build(case["model"], **case["kwargs"])
        edit = measure.apply_tflms(again, params=fixed)
        values = dict(edit)
        values.update(measure.oracle_peaks(again.graph, again.train_op))
        record("tflms_fixed", values)
    out["done"] = True
    return out


_gib = common.fmt_bytes


def _note(key, values, none, budget):
    if "error" in values:
        return "failed: %s" % values["error"][:80]
    none_peak = none.get("gpu_peak")
    none_raw = none.get("raw_gpu_peak")
    notes = []
    if key.startswith("tf_") and values.get("did_nothing"):
        notes.append("**TensorFlow's optimizer did nothing**")
    elif key.startswith("tf_") and none_peak and \
            values.get("gpu_peak", 0) >= none_peak:
        if none_raw and values.get("raw_gpu_peak", none_raw) < none_raw:
            notes.append("**saved nothing**: only Grappler's own count "
                         "goes down")
        else:
            notes.append("**changed the graph but saved nothing**")
    if key == "tf_recompute" and values.get("recomputed"):
        notes.append("%d ops recomputed" % values["recomputed"])
    if key.startswith("tflms"):
        status = values.get("status")
        if status == "no fit":
            notes.append("auto-tuning found no fit: %s"
                         % values.get("error", "")[:60])
        elif status == "not needed":
            notes.append("LMS not needed")
        if values.get("params"):
            notes.append("params %s" % "/".join(str(p) for p in
                                                values["params"]))
        if values.get("sim_peak"):
            text = "simulator: %s" % common.fmt_bytes(values["sim_peak"])
            instant = common.sim_beside_oracle(values)
            if instant != values["sim_peak"]:
                text += " (%s with copies instant)" % common.fmt_bytes(
                    instant)
            if values.get("gpu_peak"):
                text += " (oracle %+.1f%%)" % (
                    100.0 * (values["gpu_peak"] / float(instant) - 1))
            notes.append(text)
    if values.get("gpu_peak") is not None:
        notes.append("fits" if values["gpu_peak"] <= budget
                     else "over budget")
    return "; ".join(notes)


def tables(results):
    """Markdown for section 2: one table per model."""
    blocks = []
    for r in results:
        case = r.get("case", {})
        budget = int(case.get("budget_gib", 0) * common.GIB)
        head = "**%s** (%s ops), budget %s" % (
            r.get("description", case.get("model")), r.get("ops", "?"),
            common.fmt_bytes(budget))
        if r.get("error"):
            head += " (incomplete: %s)" % r["error"]
        lines = [head, "",
                 "| method | GPU peak | saved | Grappler's count | host peak "
                 "| swapped out | swapped in | swap-outs / swap-ins | note |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        configs = r.get("configs", {})
        none = configs.get("none", {})
        none_peak = none.get("gpu_peak")
        for key, label in CONFIGS:
            values = configs.get(key)
            if values is None:
                continue
            peak = values.get("gpu_peak")
            saved = "-"
            if peak is not None and none_peak:
                share = 100.0 * (none_peak - peak) / none_peak
                saved = "0%" if abs(share) < 0.5 else "%.0f%%" % share
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s / %s | %s "
                         "|" % (
                label, _gib(peak), saved, _gib(values.get("raw_gpu_peak")),
                _gib(values.get("host_peak")),
                _gib(values.get("swapout_bytes", 0)),
                _gib(values.get("swapin_bytes", 0)),
                values.get("swap_outs", 0), values.get("swap_ins", 0),
                _note(key, values, none, budget)))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def plot(results, path):
    """Grouped bars of GPU peaks per model and method."""
    axes = common.new_axes()
    if axes is None:
        return None
    fig, ax = axes
    width = 0.8 / len(CONFIGS)
    for j, (key, label) in enumerate(CONFIGS):
        xs, ys = [], []
        for i, r in enumerate(results):
            peak = r.get("configs", {}).get(key, {}).get("gpu_peak")
            if peak is not None:
                xs.append(i + j * width)
                ys.append(peak / common.GIB)
        ax.bar(xs, ys, width=width, label=label)
    for i, r in enumerate(results):
        b = r.get("case", {}).get("budget_gib")
        if b:
            ax.hlines(b, i - width / 2, i + 0.8 - width / 2, colors="k",
                      linestyles="dashed")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(results))])
    ax.set_xticklabels([r.get("case", {}).get("model", "?") for r in results])
    ax.set_ylabel("oracle GPU peak (GiB); dashed: budget")
    ax.legend(fontsize=7)
    return common.save_figure(fig, path)
