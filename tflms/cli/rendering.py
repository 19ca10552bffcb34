"""The text `tflms plan` prints (`render`) from a `PlanReport`."""

from tflms import settings as S
from tflms.cli.planning import LINKS


_GIB = float(1 << 30)
_MIB = float(1 << 20)


def gib(nbytes):
    if abs(nbytes) < _GIB:
        return "%.1f MiB" % (nbytes / _MIB)
    return "%.3f GiB" % (nbytes / _GIB)


def _mem_ratio_text():
    from tflms import autotune
    return "%g" % autotune.mem_ratio()


def render(report, args):
    """The human-readable report, as a list of lines."""
    return (_header(report, args) + [""] + _memory(report) + [""]
            + _plan(report) + _step_time(report) + _plots(report) + [""]
            + _result(report, args))


def _header(r, args):
    """The graph, the batch and the budget."""
    lines = ["tflms plan: %s (%s)" % (r.graph, r.kind)]
    lines.extend("  " + note for note in r.notes)
    if r.training:
        lines.append("Training graph: forward and backward phase (one "
                     "training step is planned).")
    else:
        lines.append("No backward phase (no gradient or optimizer ops): "
                     "nothing is trained; planning one inference step "
                     "(is_training=False).")
    lines.append("Graph: %d ops, %d edges, %d levels; %s trainable "
                 "parameters (%s); all variables incl. optimizer slots %s"
                 % (r.num_ops, r.num_edges, r.num_levels,
                    "{:,}".format(r.trainable_parameters),
                    gib(r.trainable_bytes), gib(r.variable_bytes)))
    lines.append("Batch size: %s" % (r.batch_size if r.batch_size else
                                     "not given (shapes must be static)"))
    source = ("--autotune-gpu-mem %g GiB" % args.autotune_gpu_mem
              if args.autotune_gpu_mem
              else "the GPU's memory")
    lines.append("Device budget: %s = %s x %s (TF_LMS_SIMULATOR_MEM_RATIO)"
                 % (gib(r.budget_bytes), source, _mem_ratio_text()))
    if r.offload is not None:
        moved = r.offload
        lines.append(
            "Optimizer offload: %d variables' updates and their slots (%s) "
            "on %s; %s copied per step%s (every peak below counts them "
            "there)" % (
                len(moved["variables"]), gib(moved["slot_bytes"]),
                moved["host"], "an unknown size"
                if moved["moved_bytes"] is None
                else gib(moved["moved_bytes"]),
                "; %d updates stay on the device" % len(moved["left"])
                if moved["left"] else ""))
    return lines


def _memory(r):
    """The peaks: simulated without and with LMS, the floor, the oracle."""
    from tflms import floor as floor_mod
    lines = ["Expected device memory peak of one step (simulator):"]
    rows = [("without LMS", r.without_lms)]
    if r.error is None:
        rows.append(("with LMS", r.with_lms))
    for label, peak in rows:
        lines.append("  %-12s %10s  %-13s at level %d (%s)" % (
            label + ":", gib(peak["peak_bytes"]),
            "fits" if peak["fits"] else "does NOT fit", peak["peak_level"],
            peak["peak_op"]))
    if r.error is not None:
        lines.append("  with LMS:    no plan fits (below)")
    if r.floor is not None:
        lines.append("  floor:       %10s  no plan goes below it: %s" % (
            gib(r.floor["floor_bytes"]),
            floor_mod.StepFloor(**r.floor).reason()))
    if r.without_lms["largest_live"]:
        lines.append("  largest tensors live at the peak without LMS: " +
                     ", ".join("%s %s" % (name, gib(n)) for name, n in
                               r.without_lms["largest_live"]))
    if r.oracle:
        lines.append("Oracle (Grappler's virtual GPU; runtime buffer rules, "
                     "and Grappler's own count with every Identity and "
                     "Reshape a new buffer):")
        for label, key in (("without LMS", "without_lms"),
                           ("with LMS", "with_lms")):
            peak = r.oracle.get(key)
            if peak is not None:
                instant = peak.get("simulator_instant_peak_bytes")
                lines.append("  %-12s %10s  %-13s (Grappler's count %s%s)" % (
                    label + ":", gib(peak["runtime_peak_bytes"]),
                    "fits" if peak["fits"] else "does NOT fit",
                    gib(peak["grappler_peak_bytes"]),
                    "" if instant is None else
                    "; simulator with copies instant, as the oracle "
                    "replays them: %s" % gib(instant)))
    return lines


def _plan(r):
    """What the plan swaps and recomputes, and its transfer time."""
    lines = []
    if r.error is not None:
        lines.append("LMS could not make one step fit: " + r.error)
    elif not r.lms_needed:
        lines.append("LMS is not needed: one step fits the budget without "
                     "swapping. Nothing would be swapped.")
    else:
        p = r.params
        how = "auto-tuned" if r.tuned else "as given"
        lines.append("LMS parameters (%s): LMS(swapout_threshold=%d, "
                     "swapin_ahead=%d, swapin_groupby=%d, sync_mode=%d)"
                     % (how, p["swapout_threshold"], p["swapin_ahead"],
                        p["swapin_groupby"], p["sync_mode"]))
        if r.selected:
            lines.append("  The auto-tuner chose which tensors to swap; set "
                         "by hand, these parameters would swap every tensor "
                         "past the threshold (more bytes).")
        lines.append("Swapped per step: %d tensors; %s out to the host (%d "
                     "swap-outs) and %s back in (%d swap-ins), %s moved"
                     % (r.swapped_tensors, gib(r.swapout_bytes),
                        r.swapout_ops, gib(r.swapin_bytes), r.swapin_ops,
                        gib(r.swapout_bytes + r.swapin_bytes)))
        if r.recomputed_tensors:
            lines.append("Recomputed per step instead of swapped: %d tensors "
                         "(%s), made again by %d cloned operations just "
                         "before their far readers"
                         % (r.recomputed_tensors, gib(r.recompute_bytes),
                            r.recompute_ops))
        if r.ordering_edges:
            # Kept when nothing fitted without them, or when they gave a
            # plan a shorter step than synchronous swap-ins.
            lines.append("Ordered at the memory peaks (docs/autotuning.md, "
                         "step 8): %d control edges, first op before "
                         "second:" % len(r.ordering_edges))
            for first, then in r.ordering_edges:
                lines.append("  %s before %s" % (first, then))
        lines.append("Predicted transfer time per step (bytes moved / link "
                     "bandwidth per direction):")
        for name, gbps in LINKS:
            lines.append("  %-36s %6.2f GB/s  %10.2f ms"
                         % (name, gbps, r.transfer_ms[name]))
        lines.append("  (theoretical peak rates; copies overlap with compute "
                     "when asynchronous, and a full-duplex link can move "
                     "swap-outs and swap-ins at the same time)")
    return lines


def _step_time(r):
    """The predicted step time without and with LMS."""
    lines = []
    t = r.step_time
    lines.append("Predicted step time on %s, copies over %s (step-time "
                 "model: fitted rates, one op at a time):"
                 % (t["gpu"], t["interconnect"]))
    lines.append("  without LMS: %10.2f ms" % t["without_lms_ms"])
    if t["with_lms_ms"] is not None:
        lines.append("  with LMS:    %10.2f ms  (exposed transfer time "
                     "%.2f ms)" % (t["with_lms_ms"],
                                   t["exposed_transfer_ms"]))
    return lines


def _plots(r):
    """The memory plots written."""
    lines = []
    if r.plots_missing:
        lines.append("")
        lines.append("Memory plots NOT written: %s. Written instead:"
                     % r.plots_missing)
        lines.extend("  " + path for path in r.plots)
    elif r.plots:
        lines.append("")
        lines.append("Memory plots written:")
        lines.extend("  " + path for path in r.plots)
    return lines


def _result(r, args):
    """The one-line verdict."""
    lines = []
    if r.fits:
        lines.append("RESULT: fits in %s %s." % (
            gib(r.budget_bytes),
            "with LMS" if r.lms_needed else "without LMS"))
    elif r.error is not None:
        lines.append("RESULT: does NOT fit in %s, with or without LMS."
                     % gib(r.budget_bytes))
    else:
        lines.append("RESULT: does NOT fit in %s: the plan needs %s. Try %s."
                     % (gib(r.budget_bytes), gib(r.with_lms["peak_bytes"]),
                        ", ".join(_untried(args))))
    return lines


def _untried(args):
    """What `plan` could still try when the plan it made does not fit: only
    the flags the command line did not already set that way."""
    hints = ["a smaller --batch-size"]
    if not (getattr(args, "serialization", None)
            or getattr(args, "serialization_by_size", None)):
        hints.append("--serialization or --serialization-by-size")
    if getattr(args, "sync_mode", None) != 3:
        hints.append("--sync-mode 3")
    fixed = [flag for name, flag in (
        ("swapout_threshold", "--swapout-threshold"),
        ("swapin_ahead", "--swapin-ahead"),
        ("swapin_groupby", "--swapin-groupby"))
        if getattr(args, name, None) not in (S.AUTO, None)]
    if fixed:
        hints.append("%s at -1 (auto) instead of fixed" % " and ".join(fixed))
    if len(hints) > 1:
        hints[-1] = "or " + hints[-1]
    return hints
