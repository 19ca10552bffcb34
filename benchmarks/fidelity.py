"""Section 5: how well the tflms simulator predicts memory peaks.

For each model the step's peak is given three ways:

* the simulator (`tflms.simulator.SimulationModel.replay`), which
  auto-tuning trusts;
* the oracle (Grappler's virtual cluster, GPU placement; `tflms.oracle`);
* the real allocator of this machine's CPU, from the FULL_TRACE allocation
  records of one training step (`benchmarks.measure.cpu_allocator_peaks`),
  with Grappler off so the graph that runs is the graph the others see.
  "outputs" counts allocations that outlive their op (tensors); "all"
  includes kernel scratch (im2col buffers and the like), which neither model
  counts. Both include variables and constants.

With LMS (auto-tuned to a share of the step's memory) the simulator's
prediction is compared with the oracle. The real CPU run is not: on a CPU,
host and device memory are one, so a swap moves nothing.
"""

from benchmarks import common
from benchmarks import timing

__all__ = ["run", "tables"]


def run(case):
    """Worker: simulator, oracle and real CPU peaks for one model."""
    common.setup_tensorflow(case.get("control_flow", "v2"))
    from benchmarks import measure, models  # pylint: disable=import-outside-toplevel
    from tflms import autotune, pipeline, rewriter  # pylint: disable=import-outside-toplevel
    from tflms import graph_index as gi  # pylint: disable=import-outside-toplevel
    from tflms.settings import Settings  # pylint: disable=import-outside-toplevel
    out = {"case": case, "done": False}
    built = models.build(case["model"], **case["kwargs"])
    out.update(ops=built.num_ops, description=built.description)
    index = gi.build_index(built.graph)
    roles = pipeline.classify(index, Settings())
    out["sim_none"] = int(pipeline.simulate_without(
        index, roles, Settings(batch_size=built.batch_size))
        .peak_device_bytes)
    out["oracle_none"] = measure.oracle_peaks(built.graph,
                                              built.train_op)["gpu_peak"]
    out["oracle_none_as_given"] = measure.oracle_peaks(
        built.graph, built.train_op, forward=False)["gpu_peak"]
    common.emit(out)
    if case.get("real", True):
        out["real_off"] = measure.cpu_allocator_peaks(built, grappler=False)
        common.emit(out)
        out["real_on"] = measure.cpu_allocator_peaks(built, grappler=True)
        common.emit(out)

    budget_gib, _ = timing.budget_gib(
        case, index, roles, built.batch_size)
    out["budget_gib"] = budget_gib
    # The plan LMS.run would apply: pipeline.plan, auto-tuned to the budget.
    planned = None
    try:
        planned = pipeline.plan(index, Settings(
            batch_size=built.batch_size, autotune_gpu_mem=budget_gib),
            roles=roles)
    except autotune.AutotuneError as err:
        out["lms_error"] = str(err).split(": the")[0]
    if planned is None or not planned.needed:
        # No tuned plan (nothing fits, or nothing needed): check the
        # simulator on a fixed-parameter plan instead.
        t, a, g, sync = common.fixed_params(case["fallback_fixed"],
                                            index.num_levels)
        planned = pipeline.plan(index, Settings(
            swapout_threshold=t, swapin_ahead=a, swapin_groupby=g,
            sync_mode=sync, batch_size=built.batch_size), roles=roles)
        out["fallback"] = [t, a, g, sync]
    planned = pipeline.simulate_plan(planned)
    out["sim_lms"] = int(planned.with_lms.peak_device_bytes)
    rewriter.apply_plan(built.graph, planned.index, planned.plan, "/cpu:0")
    out["oracle_lms"] = measure.oracle_peaks(built.graph,
                                             built.train_op)["gpu_peak"]
    out["swaps"] = len(planned.plan.swaps)
    out["done"] = True
    return out


def _mib(nbytes):
    return "-" if nbytes is None else "%.1f" % (nbytes / common.MIB)


def _err(pred, ref):
    if pred is None or not ref:
        return "-"
    return "%+.1f%%" % (100.0 * (pred - ref) / ref)


def tables(results):
    """Markdown for section 5."""
    lines = ["| model | simulator MiB | oracle MiB (as given) | real CPU "
             "outputs MiB | real CPU all MiB | real CPU, Grappler on "
             "(outputs / all) | sim vs oracle | sim vs real outputs | with "
             "LMS: simulator / oracle MiB | error |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        off = r.get("real_off", {})
        on = r.get("real_on", {})
        err = " (incomplete: %s)" % r["error"] if r.get("error") else ""
        lms = "-"
        if r.get("sim_lms") is not None:
            lms = "%s / %s" % (_mib(r["sim_lms"]), _mib(r.get("oracle_lms")))
        lines.append("| %s%s | %s | %s | %s | %s | %s / %s | %s | %s | %s | "
                     "%s |" % (
                         r.get("description", "?"), err,
                         _mib(r.get("sim_none")), "%s (%s)" % (
                             _mib(r.get("oracle_none")),
                             _mib(r.get("oracle_none_as_given"))),
                         _mib(off.get("outputs")), _mib(off.get("all")),
                         _mib(on.get("outputs")), _mib(on.get("all")),
                         _err(r.get("sim_none"), r.get("oracle_none")),
                         _err(r.get("sim_none"), off.get("outputs")),
                         lms, _err(r.get("sim_lms"), r.get("oracle_lms"))))
    return "\n".join(lines)
