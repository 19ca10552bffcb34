"""`tflms capacity`: the largest batch a GPU trains without LMS, with LMS
and within an overhead (`tflms.capacity.search`), for every format
`tflms plan` loads; the table of the batches tried, the plot, the JSON
file and, with --oracle, the oracle's peaks at the two largest batches
(`tflms plan --oracle` at each). With --dimension sequence, the longest
sequence of a Keras 3 model at the batch --batch-size fixes, in the same
words for the sequence. With --offload-optimizer the search runs twice,
with the optimizer's state on the device and on the host, and both
answers are reported with their predicted steps."""

import argparse
import dataclasses
import json
import os

from tflms import setting_flags
from tflms import settings as S
from tflms.cli.loading import PlanError, is_keras3_plan, load_graph
from tflms.cli.planning import plan_graph
from tflms.cli.rendering import gib


def find(args, progress):
    """The `capacity.Capacity` of ``args.graph`` with the command line's
    settings; with ``offload_optimizer``, its ``without_offload`` the
    same search with the optimizer's state on the device (searched
    first, without the oracle).

    Raises:
      PlanError, ValueError: a graph that cannot be searched.
    """
    settings = setting_flags.from_arguments(args, is_training=True)
    if not settings.offload_optimizer:
        return _find(args, settings, progress)
    progress("searching with the optimizer's state on the device ...")
    on_device = _find(args, settings.replace(offload_optimizer=False),
                      progress, oracle=False)
    progress("searching with the optimizer's state on the host "
             "(--offload-optimizer) ...")
    found = _find(args, settings, progress)
    return dataclasses.replace(found, without_offload=on_device)


def _find(args, settings, progress, oracle=True):
    """`find`'s search with `settings`; the oracle's peaks too when
    `oracle` and --oracle."""
    from tflms import capacity
    from tflms.tf import keras3_trace
    from tflms.tf import live_capacity
    if args.dimension == "sequence":
        return _find_sequence(args, settings, progress)
    if is_keras3_plan(args.graph, args):
        progress("loading the Keras 3 model %s ..." % args.graph)
        loaded = keras3_trace.load_model(args.graph, args.start_batch,
                                        args.loss, args.optimizer)
        plan_at = live_capacity.keras3_plan_at(loaded, settings, args.graph)
    else:
        progress("loading %s ..." % args.graph)
        loaded = load_graph(args.graph, args)
        if not loaded.training:
            raise PlanError(
                "%s has no backward phase (no gradient or optimizer ops): "
                "the capacity search plans a training step; save the "
                "training graph" % args.graph)
        plan_at = live_capacity.graph_plan_at(
            loaded.graph, settings, loaded.fetches, what=args.graph)
    found = capacity.search(plan_at, live_capacity.budget_of(settings),
                            args.max_overhead, args.start_batch,
                            args.max_batch, progress)
    if args.oracle and oracle:
        _with_oracle(found, args, progress)
    return found


def _find_sequence(args, settings, progress):
    """The `capacity.Capacity` of a search over the sequence length of the
    Keras 3 model ``args.graph`` at ``args.batch_size``."""
    from tflms.tf import keras3_trace
    from tflms.tf import live_capacity
    if not is_keras3_plan(args.graph, args):
        raise PlanError(
            "--dimension sequence traces a Keras 3 model at each sequence "
            "length, and %s is not a model saved by Keras 3 (or Keras 3 is "
            "not installed here): save it with Keras 3 (model.save("
            "'model.keras'), TensorFlow 2.16+), or search the batch with "
            "--dimension batch" % args.graph)
    progress("loading the Keras 3 model %s ..." % args.graph)
    loaded = keras3_trace.load_model(args.graph, args.batch_size, args.loss,
                                     args.optimizer,
                                     sequence=args.start_sequence)
    bounds = live_capacity.sequence_bounds(
        loaded.model, args.start_sequence, args.max_sequence,
        "--start-sequence", "--max-sequence")
    plan_at = live_capacity.keras3_plan_at(loaded, settings, args.graph,
                                           dimension="sequence")
    return live_capacity.search_sequence(
        plan_at, settings, args.batch_size, args.start_sequence, bounds,
        args.max_overhead, progress)


def _with_oracle(found, args, progress):
    """The oracle's peaks (`tflms plan --oracle`) at the largest batch
    without LMS and the largest with LMS, in their rows."""
    batches = sorted({b for b in (found.largest_without_lms,
                                  found.largest_with_lms)
                      if b is not None})
    for batch in batches:
        progress("batch %d with the oracle ..." % batch)
        given = argparse.Namespace(**vars(args))
        given.batch_size, given.oracle, given.no_plots = batch, True, True
        report = plan_graph(load_graph(args.graph, given), given, args.graph)
        row = found.row(batch)
        row.oracle = dict(report.oracle or {})
        row.oracle["simulator_without_lms_peak_bytes"] = \
            report.without_lms["peak_bytes"]
        measured = row.oracle.get("with_lms")
        if measured is not None:
            # The oracle replays copies as instant: the simulator's count
            # with instant copies is the one to set beside it.
            row.oracle["simulator_with_lms_peak_bytes"] = measured.pop(
                "simulator_instant_peak_bytes")


def _ms(value):
    return "-" if value is None else "%.1f" % value


def _rate(value):
    return "-" if value is None else "%.1f" % value


# The words of the report for each dimension searched.
_WORDS = {
    "batch": {"tried": "Batches", "column": "batch", "rate": "smp/s",
              "rates": "samples/s", "answer": "Largest batch",
              "first": "batch", "flag": "--max-batch", "many": "batches",
              "rate_attr": "samples_per_s"},
    "sequence": {"tried": "Sequence lengths", "column": "seq",
                 "rate": "tok/s", "rates": "tokens/s",
                 "answer": "Longest sequence", "first": "sequence length",
                 "flag": "--max-sequence", "many": "sequence lengths",
                 "rate_attr": "tokens_per_s"},
}


def render(found, args):
    """The lines `tflms capacity` prints."""
    words = _WORDS[found.dimension]
    rate = words["rate"]
    lines = ["tflms capacity: %s" % args.graph,
             "Device budget: %s (%s x TF_LMS_SIMULATOR_MEM_RATIO); step "
             "times on %s, copies over %s" % (
                 gib(found.budget_bytes),
                 ("--autotune-gpu-mem %g GiB" % args.autotune_gpu_mem
                  if args.autotune_gpu_mem else "the GPU's memory"),
                 args.gpu or S.Settings().gpu,
                 args.interconnect or S.Settings().interconnect)]
    if found.dimension == "sequence":
        lines.append("Sequence length searched at batch %d: axis 1 of every "
                     "input whose axis 1 the model leaves unknown"
                     % found.batch_size)
    lines += ["",
              "%s tried (predictions: peaks by the simulator, steps by "
              "the step-time model):" % words["tried"],
              "  %6s %11s %11s %4s %4s %10s %10s %10s %10s %10s %10s %11s" % (
                  words["column"], "peak w/o", "peak LMS", "w/o", "LMS",
                  "step w/o", "step LMS", rate + " w/o", rate + " LMS", "out",
                  "in", "floor")]
    for r in found.rows:
        lines.append(
            "  %6d %11s %11s %4s %4s %10s %10s %10s %10s %10s %10s %11s" % (
                found.size_of(r), gib(r.peak_without_bytes),
                "no plan" if r.peak_with_bytes is None
                else gib(r.peak_with_bytes),
                "fits" if r.fits_without else "-",
                "fits" if r.fits_with else "-",
                _ms(r.step_without_ms), _ms(r.step_with_ms),
                _rate(getattr(r, words["rate_attr"] + "_without")),
                _rate(getattr(r, words["rate_attr"] + "_with")),
                gib(r.swapout_bytes), gib(r.swapin_bytes),
                gib(r.floor_bytes)))
    lines.append("  (steps in ms; out/in: bytes LMS moves to the host and "
                 "back per step; floor: device memory no plan goes below)")
    lines.append("")

    def without_lms(row):
        return "needs %s without LMS" % gib(row.peak_without_bytes)

    def with_lms(row):
        if row.floor_bytes > found.budget_bytes:
            return "its floor, %s, is over the budget" % gib(row.floor_bytes)
        if row.smallest_peak_bytes is None:
            # The search found plans, but none once its copies were timed
            # (the row's error says so): there is no smallest to name.
            return "no plan"
        return "no plan; the smallest needs %s" % gib(
            row.smallest_peak_bytes)

    def overhead(row):
        if not row.fits_with:
            return "no plan"
        return "predicted step %.0f%% over the step without LMS" % (
            row.overhead_pct or 0.0)

    def answer(label, size, above, why, extra=""):
        if size is None:
            # The first size tried is the smallest.
            return "%s: none (not even %s %d)" % (
                label, words["first"], found.size_of(found.rows[0]))
        text = "%s: %d%s" % (label, size, extra)
        if above is None and found.limit_reason:
            return text + (" (the search stopped at %d, the longest the "
                           "model takes: %s)" % (found.limit,
                                                 found.limit_reason))
        if above is None:
            return text + " (the search stopped at %s %d)" % (
                words["flag"], found.limit)
        return text + " (%d does not: %s)" % (above, why(found.row(above)))
    lines.append(answer("%s without LMS" % words["answer"],
                        found.largest_without_lms,
                        found.next_without_lms, without_lms))
    best = found.largest_with_lms
    extra = ""
    if best is not None:
        row = found.row(best)
        extra = (", %.1f %s predicted; its floor is %s, set by %s"
                 % (getattr(row, words["rate_attr"] + "_with") or 0.0,
                    words["rates"], gib(row.floor_bytes),
                    row.floor_op or "the resident bytes"))
    lines.append(answer("%s with LMS" % words["answer"], best,
                        found.next_with_lms, with_lms, extra))
    if found.max_overhead_pct is not None:
        lines.append(answer(
            "%s with LMS within %g%% of the step without it"
            % (words["answer"], found.max_overhead_pct),
            found.largest_within_overhead, found.next_within_overhead,
            overhead))
    if found.without_offload is not None:
        lines += [""] + _offload_lines(found, words)
    oracle_rows = [r for r in found.rows if r.oracle]
    if oracle_rows:
        lines.append("")
        lines.append("Oracle (Grappler's virtual GPU, runtime buffer rules) "
                     "beside the simulator:")
        for r in oracle_rows:
            for label, key in (("without LMS", "without_lms"),
                               ("with LMS", "with_lms")):
                measured = r.oracle.get(key)
                if measured is None:
                    continue
                lines.append("  batch %d %-12s oracle %s (%s), simulator %s"
                             % (r.batch, label + ":", gib(
                                 measured["runtime_peak_bytes"]),
                                "fits" if measured["fits"] else
                                "does NOT fit", gib(r.oracle.get(
                                    "simulator_%s_peak_bytes" % key, 0))))
    lines.append("Searched %d %s in %.1f s." % (len(found.rows),
                                                words["many"],
                                                found.seconds))
    return lines


def _offload_lines(found, words):
    """The answers with the optimizer's state on the device (the search
    ``found.without_offload``) beside those with it on the host
    (``found``, --offload-optimizer), each with its predicted step."""
    rates = words["rate_attr"]

    def answer(search, largest, with_lms):
        size = getattr(search, largest)
        if size is None:
            return "none (not even %s %d)" % (words["first"],
                                             search.size_of(search.rows[0]))
        row = search.row(size)
        step = row.step_with_ms if with_lms else row.step_without_ms
        rate = getattr(row, rates + ("_with" if with_lms else "_without"))
        return "%d, predicted step %s ms, %s %s" % (
            size, _ms(step), _rate(rate), words["rates"])

    device, host = found.without_offload, found
    label = words["answer"]
    return [
        "The optimizer's state on the device and on the host "
        "(--offload-optimizer; with it on the device: %d %s searched in "
        "%.1f s):" % (len(device.rows), words["many"], device.seconds),
        "  %s without LMS, state on the device: %s" % (
            label, answer(device, "largest_without_lms", False)),
        "  %s with LMS, state on the device:    %s" % (
            label, answer(device, "largest_with_lms", True)),
        "  %s with LMS, state on the host:      %s" % (
            label, answer(host, "largest_with_lms", True)),
    ]


def write_outputs(found, args):
    """The --json file and the --plot picture; returns notes to print."""
    from tflms import capacity
    from tflms import plots as plotting
    notes = []
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(found.as_dict(), f, indent=1, sort_keys=True)
        notes.append("JSON written: %s" % os.path.abspath(args.json))
    if args.plot:
        try:
            capacity.write_plot(found, args.plot, title="%s: %s" % (
                os.path.basename(args.graph.rstrip("/")),
                "tokens per second by sequence length (batch %d)"
                % found.batch_size if found.dimension == "sequence"
                else "samples per second by batch"))
            notes.append("Plot written: %s" % os.path.abspath(args.plot))
        except ImportError:
            notes.append("Plot NOT written: %s"
                         % plotting.MISSING_MATPLOTLIB)
    return notes
