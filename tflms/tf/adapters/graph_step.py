"""What every graph adapter shares: the `TrainingStep` it finds and the
one path from a step to a rewritten graph (`plan_and_rewrite`).

A graph adapter (`tflms.tf.adapters`) serves one kind of graph: it finds
the training step (`find_step`), indexes it (`index`), applies the plan
(`apply`) and says how to check what ran (`swaps_ran`). `GraphAdapter`
holds the defaults (the reader's index, the rewriter's `apply_plan` with the
swap ops on ``cpu_device``); `rewrite` runs them in that order around the
planning pipeline, which knows nothing of TensorFlow. Every step, a
Session graph's and a tf.function's alike, is planned on `step_target`:
LMS leaves Grappler's and oneDNN's merges whole, so each trains bit for
bit as without LMS.
"""

import dataclasses
import time
from typing import Optional

from tflms import autotune
from tflms import hardware
from tflms import offload as offload_rules
from tflms import pipeline
from tflms import planner
from tflms import plots
from tflms import run_log
from tflms import step as step_rules
from tflms import worker_devices
from tflms.results import Outcome, RunResult
from tflms.target import Target
from tflms.tf import compat
from tflms.tf import grappler_check
from tflms.tf import grappler_repair
from tflms.tf import reader
from tflms.tf import rewriter

__all__ = ["TrainingStep", "GraphAdapter", "plan_and_rewrite",
           "step_target"]

_GIB = float(1 << 30)


@dataclasses.dataclass(frozen=True)
class TrainingStep:
    """One training step found in a graph.

    Attributes:
      graph: the `tf.Graph` (or `FuncGraph`) that holds it; edited in place.
      fetches: its `step.StepFetches` (what one run of the step fetches).
      worker: the `worker_devices.WorkerDevices` of a step that runs on one
        worker of a multi-worker strategy (its devices, its host for the
        swap ops); None otherwise.
      gpu_device: the device planned when it is not the settings' own (one
        replica of a step planned device by device); None: the settings'.
    """

    graph: object
    fetches: step_rules.StepFetches
    worker: Optional[worker_devices.WorkerDevices] = None
    gpu_device: Optional[str] = None


class GraphAdapter:
    """The protocol of an entry point that hands LMS a graph to rewrite.

    Subclasses set `accepts` (which graphs they serve) and `find_step`;
    `index`, `apply` and `swaps_ran` have defaults that serve a graph read
    by the reader and edited by the rewriter.
    """

    # True where ``offload_optimizer`` is carried out (`tflms.offload`);
    # elsewhere asking for it raises `offload.OffloadUnsupportedError`.
    offload_supported = False
    # What the error says to do instead, where it is not.
    offload_instead = (
        "train the step as a Session graph with a tf.compat.v1.train "
        "optimizer (lms.run(graph) or the Estimator hook), or set "
        "offload_optimizer=False")

    def __init__(self, graph, settings, log, fetches=None, target=None):
        self.graph = graph
        self.settings = settings
        self.log = log
        self.fetches = fetches
        # The `target.Target` to plan for (each step's device and worker
        # are its own); None: `step_target`'s, decided at the first ask.
        self._target = target

    @classmethod
    def accepts(cls, graph):
        """True if this adapter serves `graph`."""
        raise NotImplementedError

    def describe_entry(self):
        """The entry point, for messages: ``"a tf.function step"``."""
        return "this kind of step (%s)" % type(self).__name__

    def find_step(self):
        """The `TrainingStep` of the graph."""
        raise NotImplementedError

    def index(self, found):
        """The `GraphIndex` of `found`'s step (its fetches' fan-in)."""
        return reader.build_index(found.graph, found.fetches)

    def target(self, found):
        """The `target.Target` of `found`'s step: the one given, else
        `step_target`'s (decided once, for this machine), with `found`'s
        device and worker when it has them."""
        if self._target is None:
            self._target = step_target(self.settings)
        base = self._target
        return base.replace(device=found.gpu_device or base.device,
                            worker=found.worker)

    def check_offload_ready(self, index, offload):
        """Raise before planning if `offload` (found on `index`) cannot
        be applied to this step as it is (`offload_rewrite`'s
        `SlotsOnDeviceError` for a function step whose slots must move
        first); by default every update can."""

    def apply(self, found, index, plan, target):
        """Edit `found.graph` by `plan` (made on `index`) and
        `target.offload` (a `tflms.offload.Offload` or None), with the
        swap ops on `target`'s host: the `rewriter.RewriteResult`."""
        return rewriter.apply_plan(found.graph, index, plan,
                                   target.swap_device, target.offload)

    def rewrite(self, start=None):
        """Find, index, plan and rewrite the step: a `RunResult`."""
        start = time.perf_counter() if start is None else start
        found = self.find_step()
        return plan_and_rewrite(self, found, start)


def step_target(settings, here=True):
    """The `target.Target` of a training step planned with `settings`,
    whatever its entry point (a Session graph, a tf.function): the
    settings' devices; LMS leaves alone what Grappler merges
    (`Target.grappler_groups`), so the step trains bit for bit as without
    LMS; with `here`, on oneDNN's CPU kernels when the step runs on them
    on this machine (`compat.runs_on_onednn_cpu`: oneDNN on and no GPU);
    else (a plan for a GPU, made on a machine without one) not."""
    return Target.of(settings, grappler_groups=True,
                     onednn_cpu=here and compat.runs_on_onednn_cpu())


def plan_and_rewrite(adapter, found, start, index=None):
    """Plan `found` with `adapter.settings` and apply the plan through
    `adapter`: the `RunResult` (REWRITTEN, NOT_NEEDED, or
    ALREADY_REWRITTEN when the graph holds LMS's swap ops for these
    devices already). `index`: the step's index when the adapter built it
    already."""
    log = adapter.log
    settings = adapter.settings
    target = adapter.target(found)
    if found.worker is not None:
        log.info(found.worker.describe())
    if rewriter.is_rewritten(found.graph, target.manages):
        log.info("This model already has LMS swap operations; LMS "
                 "will not process it again.")
        return RunResult(Outcome.ALREADY_REWRITTEN,
                         seconds=time.perf_counter() - start)
    log.info("Editing model for LMS")
    if index is None:
        index = adapter.index(found)
    # The optimizer's updates on the host are part of where the step runs:
    # the target carries them from here on, to the plan and the rewrite.
    planning, target = _offload(adapter, settings, target, index)
    try:
        planned = _plan(planning, settings, target, log)
    except autotune.AutotuneError as err:
        step = _offload_when_nothing_fits(adapter, settings, target,
                                          index, err, log)
        if step is None:
            # The plots of the search that found nothing are the caller's
            # to write (the planning core writes no file).
            raise plots.with_plots(err, settings, log) from None
        planning, target = step
        try:
            planned = _plan(planning, settings, target, log)
        except autotune.AutotuneError as again:
            raise plots.with_plots(again, settings, log) from None
    plots.write_planned(planned, log)
    offload = target.offload
    offloads = offload is not None and bool(offload.updates)
    if not planned.needed and not offloads:
        return RunResult(Outcome.NOT_NEEDED, planned,
                         seconds=time.perf_counter() - start,
                         offload=offload)
    if planned.needed:
        plan = planned.plan
        _log_plan(log, planned, plan)
    else:
        # Nothing to swap, but the updates move: an empty plan.
        log.info("No swaps needed with the optimizer's updates on the "
                 "host: LMS adds only the ops that put them there")
        plan = planner.Plan(params=None, swaps=(), serialization_edges=(),
                            num_levels=planned.index.num_levels)
    # With grappler_repair, the last plan tried on a copy of the step is
    # the plan applied, and its comparison the report.
    grappler = None
    if settings.grappler_repair and (
            plan.swaps or plan.recomputes or plan.control_edges):
        planned, plan, grappler = grappler_repair.repair(
            found, planned, plan, target, log)
    # The step as it was, for Grappler's before-and-after comparison (the
    # rewrite edits the graph in place).
    before = (grappler_check.graph_def_of(found.graph)
              if grappler is None and (settings.grappler_check
                                       or settings.grappler_repair)
              else None)
    rewrite = adapter.apply(found, planned.index, plan, target)
    _log_rewrite(log, plan, rewrite)
    seconds = time.perf_counter() - start
    log.info("Editing model for LMS, took: %.1f ms" % (seconds * 1000))
    if planned.needed:
        log.warning(run_log.summary_line(planned, rewrite, seconds))
    if before is not None:
        grappler = _check_grappler(log, before, found)
    return RunResult(Outcome.REWRITTEN, planned, rewrite, seconds,
                     offload=offload, grappler=grappler)


def _plan(index, settings, target, log):
    """`pipeline.plan` of the step on `target`; when `target.offload` is
    not None, `index` is the planning index with its updates on the host
    (`offload.planning_step`)."""
    offload = target.offload
    if offload is not None:
        log.info(offload.describe())
        link = hardware.interconnect_named(settings.interconnect)
        seconds = offload.link_seconds(link)
        if seconds is not None:
            log.info("The offload's copies take at least %.1f ms per step "
                     "on %s (the predicted step times count them, and the "
                     "updates' time on the host)"
                     % (seconds * 1000, link.label))
    run_log.log_step(log, index)
    roles = pipeline.classify(index, settings, target)
    run_log.log_graph_facts(log, index, roles, settings)
    return pipeline.plan(index, settings, roles=roles, log=log,
                         target=target)


def _offload(adapter, settings, target, index):
    """``(index to plan, target)`` of the step: `offload.planning_step`'s
    when ``offload_optimizer`` is True, else `index` and `target` with no
    offload."""
    if settings.offload_optimizer is not True:
        return index, target.replace(offload=None)
    _check_offload(adapter)
    planning, target, offload = offload_rules.planning_step(
        index, target, target.swap_device, target.manages)
    adapter.check_offload_ready(index, offload)
    return planning, target


def _offload_when_nothing_fits(adapter, settings, target, index, err, log):
    """With ``offload_optimizer='auto'``, ``(index to plan, target)`` to
    plan again with when no plan fits the device (`err`)
    (`offload.planning_step`), if its offload moves any update; else
    None."""
    if settings.offload_optimizer != "auto":
        return None
    if not adapter.offload_supported:
        log.info("offload_optimizer='auto': no plan fits, and %s cannot "
                 "offload the optimizer yet" % adapter.describe_entry())
        return None
    try:
        planning, target, offload = offload_rules.planning_step(
            index, target, target.swap_device, target.manages)
    except offload_rules.OffloadUnsupportedError as e:
        log.info("offload_optimizer='auto': no plan fits, and %s" % e)
        return None
    if not offload.updates:
        return None
    adapter.check_offload_ready(index, offload)
    log.info("offload_optimizer='auto': no plan fits with the optimizer's "
             "slots on the device (%s); planning again with them on the "
             "host" % str(err).split("\n")[0])
    return planning, target


def _check_offload(adapter):
    """Raise where ``offload_optimizer`` is not carried out."""
    if not adapter.offload_supported:
        raise offload_rules.OffloadUnsupportedError(
            "offload_optimizer=True is not supported yet for %s (only "
            "Session graphs with tf.compat.v1.train optimizers are, "
            "docs/offload.md); %s" % (adapter.describe_entry(),
                                      adapter.offload_instead))


def _check_grappler(log, before, found):
    """The `grappler_check.GrapplerReport` of the rewrite of `found`
    (`before`: its GraphDef before), logged; None, with a warning, when
    Grappler fails on the step (the rewrite stands: the check only
    reports)."""
    try:
        report = grappler_check.check(
            before, found.graph, [op.name for op in found.fetches.ops],
            config=grappler_check.config_for(found.graph))
    except Exception as e:  # Grappler's errors have no common type
        log.warning("grappler_check: Grappler could not optimize the step "
                    "(%s: %s); the rewrite stands unchecked"
                    % (type(e).__name__, e))
        return None
    lines = report.lines()
    (log.info if report.same else log.warning)(lines[0])
    for line in lines[1:]:
        log.info(line)
    return report


def _log_plan(log, planned, plan):
    if plan.swaps or plan.recomputes:
        run_log.log_parameters(log, planned)
    else:
        log.info("LMS will swap nothing: the step fits with the %d "
                 "control edges it adds (serialization, ordering, "
                 "deferred fills) alone" % len(plan.control_edges))
    if plan.unplanned_groups:
        log.info("%d swap-in groups had no op to start them in time and "
                 "were left on the device" % plan.unplanned_groups, 1)
    run_log.log_plan_details(log, planned.index, plan)


def _log_rewrite(log, plan, rewrite):
    log.info(
        "Added %d operations to the model (%d swap-out operations "
        "(%.2f GiB) and %d swap-in operations (%.2f GiB))"
        % (len(rewrite.swapout_ops) + len(rewrite.swapin_ops)
           + len(rewrite.recompute_ops),
           len(rewrite.swapout_ops), plan.swapout_bytes() / _GIB,
           len(rewrite.swapin_ops), plan.swapin_bytes() / _GIB))
    if rewrite.offload_ops:
        log.info("Added %d operations that run the optimizer's updates on "
                 "the host (offload_optimizer)" % len(rewrite.offload_ops))
    if plan.recomputes:
        log.info("Recomputing %d tensors (%.2f GiB) instead of swapping "
                 "them, with %d cloned operations"
                 % (len(plan.recomputes), plan.recompute_bytes() / _GIB,
                    len(rewrite.recompute_ops)))

