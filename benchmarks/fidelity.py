"""Section 5: how well the tflms simulator predicts memory peaks.

For each model the step's peak without LMS, and with each plan of the case,
is given three ways:

* the simulator (`tflms.simulator.SimulationModel.replay`), which
  auto-tuning trusts;
* the oracle's runtime replay (`tflms.tf.oracle`,
  ``runtime_gpu_peak_bytes``): Grappler's virtual cluster schedules the
  step with every compute op on the GPU, and its step stats are replayed
  with TensorFlow's executor buffer rules (forwarding ops allocate nothing,
  variables are resident and counted once, a buffer is freed after its last
  reader, a swapped-in copy lives until its last GPU reader). This is the
  reference the simulator is held to: within 5%;
* Grappler's own count (``raw_gpu_peak_bytes``, `GraphMemory`), shown beside
  it: every Identity, Reshape and variable read is a buffer of its own, and
  no variable is counted.

Without LMS the real allocator of this machine's CPU is shown too, from the
FULL_TRACE allocation records of one training step
(`benchmarks.cpu_measure.cpu_allocator_peaks`), with Grappler off so the graph
that runs is the graph the others see. "outputs" counts allocations that
outlive their op (tensors); "all" includes kernel scratch (im2col buffers
and the like), which neither model counts. Both include variables and
constants. With LMS the real CPU run is not compared: on a CPU, host and
device memory are one, so a swap moves nothing.

Each case lists its plans in ``budgets``: dicts with ``budget_gib`` or
``budget_fraction`` (`benchmarks.timing.budget_gib`). Every plan is made on
a fresh build of the model by `pipeline.plan` (auto-tuned, what `LMS.run`
applies) and applied by the rewriter; if the tuner finds no plan, or none
is needed, the case's ``fallback_fixed`` parameters are used instead.
"""

from benchmarks import common
from benchmarks import timing

__all__ = ["run", "tables", "errors"]

# The bound section 5 states: the simulator within this share of the
# runtime replay, without LMS and with every plan.
TOLERANCE = 0.05


def _plan_and_measure(case, budget, models, oracle):
    """One auto-tuned plan on a fresh build: simulator and oracle peaks."""
    from tflms import autotune, pipeline
    from tflms.tf import rewriter
    from tflms.tf import reader as tf_reader
    from tflms.settings import Settings
    built = models.build(case["model"], **case["kwargs"])
    index = tf_reader.build_index(built.graph)
    roles = pipeline.classify(index, Settings())
    budget_gib, _ = timing.budget_gib(budget, index, roles, built.batch_size)
    row = {"budget_gib": budget_gib,
           "device_budget": autotune.device_budget(budget_gib)}
    planned = None
    try:
        planned = pipeline.plan(index, Settings(
            batch_size=built.batch_size, autotune_gpu_mem=budget_gib,
            autotune_host_mem=common.SERVER_HOST_MEM_GIB),
            roles=roles)
    except autotune.AutotuneError as err:
        row["lms_error"] = str(err).split(": the")[0]
    if planned is None or not planned.needed:
        # No tuned plan (nothing fits, or nothing needed): check the
        # simulator on a fixed-parameter plan instead.
        t, a, g, sync = common.fixed_params(case["fallback_fixed"],
                                            index.num_levels)
        planned = pipeline.plan(index, Settings(
            swapout_threshold=t, swapin_ahead=a, swapin_groupby=g,
            sync_mode=sync, batch_size=built.batch_size), roles=roles)
        row["fallback"] = [t, a, g, sync]
    planned = pipeline.simulate_plan(planned)
    # The oracle's runtime replay treats copies as instant; the tuner's
    # with_lms counts them at its interconnect. Compared like for like.
    row["sim"] = int(pipeline.instant_replay(planned).peak_device_bytes)
    row["sim_timed"] = int(planned.with_lms.peak_device_bytes)
    row["swaps"] = len(planned.plan.swaps)
    rewriter.apply_plan(built.graph, planned.index, planned.plan, "/cpu:0")
    measured = oracle.peak_memory(built.graph, built.train_op)
    row["runtime"] = int(measured.runtime_gpu_peak_bytes)
    row["raw"] = int(measured.raw_gpu_peak_bytes)
    row["runtime_top"] = [t.name for t in measured.runtime_live_at_peak[:3]]
    return row


def run(case):
    """Worker: simulator, oracle and real CPU peaks for one model, without
    LMS and with each plan of ``case["budgets"]``."""
    common.setup_tensorflow(case.get("control_flow", "v2"))
    from benchmarks import cpu_measure, models
    from tflms.tf import oracle
    from tflms import pipeline
    from tflms.tf import reader as tf_reader
    from tflms.settings import Settings
    out = {"case": case, "done": False, "plans": []}
    built = models.build(case["model"], **case["kwargs"])
    out.update(ops=built.num_ops, description=built.description)
    index = tf_reader.build_index(built.graph)
    roles = pipeline.classify(index, Settings())
    without = pipeline.simulate_without(
        index, roles, Settings(batch_size=built.batch_size))
    out["sim_none"] = int(without.peak_device_bytes)
    out["resident"] = int(without.resident_device_bytes)
    measured = oracle.peak_memory(built.graph, built.train_op)
    out["runtime_none"] = int(measured.runtime_gpu_peak_bytes)
    out["raw_none"] = int(measured.raw_gpu_peak_bytes)
    common.emit(out)
    if case.get("real", True):
        out["real_off"] = cpu_measure.cpu_allocator_peaks(built,
                                                          grappler=False)
        common.emit(out)
        out["real_on"] = cpu_measure.cpu_allocator_peaks(built, grappler=True)
        common.emit(out)
    for budget in case["budgets"]:
        out["plans"].append(_plan_and_measure(case, budget, models, oracle))
        common.emit(out)
    out["done"] = True
    return out


def _mib(nbytes):
    return "-" if nbytes is None else "%.1f" % (nbytes / common.MIB)


def _err(pred, ref):
    if pred is None or not ref:
        return "-"
    return "%+.1f%%" % (100.0 * (pred - ref) / ref)


def errors(results):
    """Relative errors ``sim / runtime - 1`` of every peak of the section:
    ``(label, error)``, without LMS and for every plan."""
    found = []
    for r in results:
        name = r.get("description", "?")
        if r.get("sim_none") is not None and r.get("runtime_none"):
            found.append((name + ", no LMS",
                          r["sim_none"] / float(r["runtime_none"]) - 1))
        for p in r.get("plans", ()):
            if p.get("sim") is not None and p.get("runtime"):
                found.append(("%s, %s MiB plan" % (
                    name, _mib(p["budget_gib"] * common.GIB)),
                              p["sim"] / float(p["runtime"]) - 1))
    return found


def tables(results):
    """Markdown for section 5: peaks without LMS, then with each plan."""
    lines = ["Without LMS:", "",
             "| model | simulator MiB | runtime replay MiB | sim vs runtime "
             "| Grappler raw MiB | real CPU outputs / all MiB | real CPU, "
             "Grappler on (outputs / all) | sim vs real outputs |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        off = r.get("real_off", {})
        on = r.get("real_on", {})
        err = " (incomplete: %s)" % r["error"] if r.get("error") else ""
        lines.append("| %s%s | %s | %s | %s | %s | %s / %s | %s / %s | %s |"
                     % (r.get("description", "?"), err,
                        _mib(r.get("sim_none")), _mib(r.get("runtime_none")),
                        _err(r.get("sim_none"), r.get("runtime_none")),
                        _mib(r.get("raw_none")),
                        _mib(off.get("outputs")), _mib(off.get("all")),
                        _mib(on.get("outputs")), _mib(on.get("all")),
                        _err(r.get("sim_none"), off.get("outputs"))))
    lines += ["", "With LMS (each plan auto-tuned for the budget, or the "
              "fixed fallback parameters where marked; the budget is what "
              "the GPU has, tflms plans for TF_LMS_SIMULATOR_MEM_RATIO of "
              "it, the planned budget):", "",
              "| model | budget MiB | swaps | simulator MiB | runtime replay "
              "MiB | sim vs runtime | Grappler raw MiB | runtime replay "
              "within the planned budget |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        for p in r.get("plans", ()):
            budget = _mib(p["budget_gib"] * common.GIB)
            if p.get("fallback"):
                budget += " (fixed %s)" % "/".join(
                    "%g" % v for v in p["fallback"])
            fits = "-"
            if p.get("runtime") is not None and not p.get("fallback"):
                fits = "yes" if p["runtime"] <= p["device_budget"] \
                    else "**no**"
            lines.append("| %s | %s | %d | %s | %s | %s | %s | %s |" % (
                r.get("description", "?"), budget, p.get("swaps", 0),
                _mib(p.get("sim")), _mib(p.get("runtime")),
                _err(p.get("sim"), p.get("runtime")), _mib(p.get("raw")),
                fits))
    return "\n".join(lines)
