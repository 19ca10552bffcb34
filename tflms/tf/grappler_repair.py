"""``grappler_repair``: the plan tried on a copy of the step before the
rewrite, and the parts of it Grappler optimizes the step otherwise with
dropped (docs/tf2.md, "Checking what Grappler does with LMS's edits").

`repair` applies the plan to a copy of the step
(`rewriter.apply_plan_to_copy`; the step's own graph is edited only once,
with the plan left), compares Grappler's optimization of the copy with the
step's (`grappler_check.check`), and drops from the plan what `implicated`
finds next to each difference (`planner.prune.without_parts`), until
Grappler optimizes both alike or `REPAIR_ROUNDS` have run.
"""

import time

from tflms import pipeline
from tflms.planner import prune
from tflms.tf import grappler_check
from tflms.tf import rewriter
from tflms.tf.oracle import functions

__all__ = ["REPAIR_ROUNDS", "implicated", "repair"]

_GIB = float(1 << 30)


# Rounds of `repair`: a plan without the parts next to one round's
# differences rarely makes new ones.
REPAIR_ROUNDS = 3


def repair(found, planned, plan, target, log):
    """``grappler_repair``: `plan` (of `planned`, for `target`) tried on a
    copy of `found`'s step (before the rewrite) and compared by Grappler
    with the step (`grappler_check.check`), and the parts next to each
    difference dropped (`planner.prune.without_parts`), until
    Grappler optimizes both alike or `REPAIR_ROUNDS` have run.

    Returns:
      ``(planned, plan, report)``: `planned` with the plan left (replayed
      again when a part was dropped), that plan, and the last comparison
      (None, with a warning, when Grappler or the copy fails: the plan
      then stands as made).
    """
    started = time.perf_counter()
    fetch_names = [op.name for op in found.fetches.ops]
    config = grappler_check.config_for(found.graph)
    # The copy is imported from the step as it is (a function's inputs
    # as placeholders); the step as Grappler sees it, and each copy once
    # edited, get a function's input shapes from that one GraphDef.
    as_function = functions.is_function_graph(found.graph)
    step_def = grappler_check.graph_def_of(found.graph, function_inputs=False)
    before = grappler_check.graph_def_of(step_def, as_function)

    def try_plan(plan):
        copy, _ = rewriter.apply_plan_to_copy(
            step_def, planned.index, plan, target.swap_device, target.offload)
        return copy, grappler_check.check(
            before, grappler_check.graph_def_of(copy, as_function),
            fetch_names, config, optimized_original=optimized)

    dropped = prune.Dropped()
    report = None
    try:
        optimized = grappler_check.optimize_original(before, fetch_names,
                                                     config)
        for _ in range(REPAIR_ROUNDS):
            copy, report = try_plan(plan)
            if report.same:
                break
            plan, now = prune.without_parts(plan, *implicated(
                report, copy, planned.index, plan))
            if not now:
                break  # nothing of the plan stands next to what differs
            dropped = prune.Dropped(*(a + b for a, b in zip(dropped, now)))
            report = None
        if report is None:
            # The last round dropped parts: the plan left is compared once
            # more, so that the report is of the plan applied.
            _, report = try_plan(plan)
    except Exception as e:  # Grappler's errors have no common type
        log.warning("grappler_repair: could not try the plan on a copy of "
                    "the step (%s: %s); the plan stands as made"
                    % (type(e).__name__, e))
        return planned, planned.plan, None
    seconds = time.perf_counter() - started
    if dropped:
        planned = pipeline.with_part_of_plan(planned, plan)
        peak = planned.with_lms.peak_device_bytes
        budget = planned.budget_bytes
        log.info("grappler_repair: dropped %d swaps, %d recomputes and %d "
                 "control edges next to what Grappler optimized otherwise "
                 "with them; the plan's peak is now %.2f GiB (copies "
                 "instant)" % (len(dropped.swaps), len(dropped.recomputes),
                               len(dropped.edges), peak / _GIB))
        if budget is not None and peak > budget:
            log.warning("grappler_repair: the plan left needs %.2f GiB, over "
                        "the budget of %.2f GiB: the step may not fit. Set "
                        "grappler_repair=False for the plan as made (it "
                        "fits, and may round differently from the step "
                        "without LMS)" % (peak / _GIB, budget / _GIB))
    lines = report.lines()
    (log.info if report.same else log.warning)(
        "grappler_repair (%.2f s): %s" % (seconds, lines[0]))
    for line in lines[1:]:
        log.info(line)
    return planned, plan, report


def implicated(report, rewritten, index, plan):
    """What of `plan` stands next to `report`'s differences: the parts
    `grappler_repair` drops.

    Args:
      report: a `GrapplerReport` of `plan` applied to `rewritten`.
      rewritten: that `tf.Graph` (its LMS ops are looked up by name).
      index: the `GraphIndex` `plan` was made on.
      plan: the `planner.Plan`.

    Returns:
      ``(swaps, recomputes, edges)``, sets of op ids: the tensors
      ``(producer, output)`` whose swap-out or swap-in a difference names,
      the tensors recomputed by a plan that cloned an op whose clone a
      difference names, and the control edges ``(from, to)`` between the
      step's ops a difference names. Offload's ops are not among them:
      they are not the plan's.
    """
    id_of = index.id_of
    cloned_by = {}
    for r in plan.recomputes:
        for op in r.ops:
            cloned_by.setdefault(op, set()).add((r.producer, r.output))
    swaps, recomputes, edges = set(), set(), set()

    def add(lms_names):
        for name in lms_names:
            if grappler_check.CLONE_MARKER in name:
                op = id_of.get(grappler_check.clone_original(name))
                recomputes.update(cloned_by.get(op, ()))
            elif rewriter.OFFLOAD_SCOPE not in name:
                tensor = _swapped_tensor(rewritten, name, id_of)
                if tensor is not None:
                    swaps.add(tensor)

    for d in report.differences:
        add(d.swaps)
        for a, b in d.edges:
            if a in id_of and b in id_of:
                edges.add((id_of[a], id_of[b]))
    # An IdentityN kept for LMS's ops: those that read or feed it (a copy
    # to or from the host crosses devices, which Grappler does not remove)
    # and the plan's control edges on it.
    for name in report.identity_n_kept:
        try:
            node = rewritten.get_operation_by_name(name)
        except KeyError:
            continue
        near = [t.op for t in node.inputs] + list(node.control_inputs) + [
            c for out in node.outputs for c in out.consumers()] + list(
                node._control_outputs)  # a swap-in it triggers
        add(op.name for op in near if grappler_check.is_lms_name(op.name))
        mine = id_of.get(name)
        edges.update(e for e in plan.control_edges if mine in e)
    return swaps, recomputes, edges


def _swapped_tensor(graph, name, id_of):
    """``(producer id, output)`` of the tensor the swap op `name` of
    `graph` copies (a swap-in reads its swap-out, which reads it)."""
    try:
        op = graph.get_operation_by_name(name)
    except KeyError:
        return None
    for _ in range(8):
        if not op.inputs:
            return None
        tensor = op.inputs[0]
        op = tensor.op
        if not grappler_check.is_lms_name(op.name):
            producer = id_of.get(op.name)
            return None if producer is None else (producer,
                                                  tensor.value_index)
    return None
