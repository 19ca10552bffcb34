"""The planning pipeline: from a graph index and settings to a complete plan.

`plan(index, settings, target=...)` is the one place where planning is
strung together; `LMS.run`, ``tflms plan``, ``tflms verify`` and every
benchmark call it, so what is measured is what users run. The
`target.Target` is where the step runs, as its adapter decided it. It
builds one
`context.PlanningContext` (roles, budgets, log, models) and runs the stages
of `tflms.stages.STAGES` (serialize, defer, swaps, order, fewer_waits,
recompute, fewer_waits again, prefetch, host; their docstring says what
each does) over a `Planned`, each ``stage(context, planned) -> planned``;
then replays the step without and with the plan when asked.

It reads no TensorFlow object, edits nothing and writes no file: the
rewriter applies `Planned.plan` afterwards, and the memory plots of
`Planned.plot_data` (or of a failed search's `AutotuneError.plot_data`)
are the caller's to draw (`tflms.plots`, from `LMS.run`).
"""

import dataclasses
import time
from typing import TYPE_CHECKING, Optional, Tuple, Type, TypeVar

from tflms import floor
from tflms import offload as offload_rules
from tflms import simulator
from tflms import stages
from tflms.autotune.report import AutotuneError, PlotData
from tflms.context import Budgets, Judging, PlanningContext, classify
from tflms.stages.recompute import recompute_cost
from tflms.stages.records import (Deferred, Ordered, StageRecord, Tuned,
                                  Unwaited)
from tflms.target import Target

if TYPE_CHECKING:
    from tflms.autotune import TuneOutcome
    from tflms.graph_index.index import GraphIndex
    from tflms.planner import Plan, SwapParams
    from tflms.steptime import StepTime

__all__ = ["Planned", "PlanningContext", "classify", "plan", "simulate_plan",
           "instant_replay", "simulate_without", "recompute_cost",
           "step_floor", "with_part_of_plan"]

R = TypeVar("R", bound=StageRecord)


@dataclasses.dataclass(frozen=True, eq=False)
class Planned:
    """What planning decided, as plain data: the plan, how it replays, and
    one record per stage that had something to say.

    The inputs (settings, the step as given, roles, budgets) are the
    context's, and only there; a stage's own facts are its `StageRecord`
    (`record`), never a field of their own here.

    Attributes:
      context: the `PlanningContext` it was planned in: settings, the
        index of the step as given, roles, budgets, and the simulation
        models `simulate_plan` and `instant_replay` reuse.
      index: the planning index: the graph's ops and edges plus the control
        edges LMS will add (serialization, ordering: `index.planned_edges`),
        with levels that count them.
      plan: the complete `planner.Plan` (swaps, recomputes, serialization
        and deferral edges), or None when LMS is not needed (auto-tuning
        found that the step fits without swapping).
      without_lms, with_lms: `simulator.SimulationResult` of one step
        without LMS (the step as given, whatever edges LMS plans, so the
        same for every budget) and with `plan` (None when not simulated;
        with_lms is also None when `plan` is None). A tuned plan's
        with_lms counts copies at `Settings.interconnect`; a
        fixed-parameter plan's (`simulate_plan`) counts them as instant.
      step_time: `steptime.StepTime` of `plan` at the settings' `gpu` and
        `interconnect`, when auto-tuning chose the plan by it (None
        otherwise; `steptime.predict_planned` times any plan).
      records: the `StageRecord` of each stage that recorded one, in the
        order they first did (`record` finds one by its type).
      failure: the `autotune.AutotuneError` of a stage that could not do
        its part while a later one may still overcome it (None
        otherwise); `plan` raises it when no stage did.
      stage_seconds: ``(name, CPU seconds)`` of making the context
        (``"context"``: roles when not given, budgets, models) and of each
        stage of `stages.STAGES` (its `contract.Stage.name`), in the order
        they ran; the process's CPU time (`time.process_time`), so that a busy
        machine does not inflate it. An `AutotuneError` that `plan`
        raises carries the same, up to the stage that raised it.
    """

    context: PlanningContext
    index: "GraphIndex"
    plan: Optional["Plan"] = None
    without_lms: Optional[simulator.SimulationResult] = None
    with_lms: Optional[simulator.SimulationResult] = None
    step_time: Optional["StepTime"] = None
    records: Tuple[StageRecord, ...] = ()
    failure: Optional[AutotuneError] = None
    stage_seconds: Tuple[Tuple[str, float], ...] = ()

    def record(self, kind: Type[R]) -> R:
        """The record of type `kind` a stage made, or ``kind()`` (the stage
        did nothing) when none did."""
        for record in self.records:
            if isinstance(record, kind):
                return record
        return kind()

    def with_record(self, record: StageRecord) -> "Planned":
        """This with `record` in place of the record of its type, or added
        after the others."""
        kind = type(record)
        if any(isinstance(r, kind) for r in self.records):
            records = tuple(record if isinstance(r, kind) else r
                            for r in self.records)
        else:
            records = self.records + (record,)
        return dataclasses.replace(self, records=records)

    def with_plan(self, plan, with_lms, step_time) -> "Planned":
        """This with `plan` (its timed replay `with_lms` and predicted
        `step_time`) in place of the plan, each record as it holds for
        `plan` (`StageRecord.for_plan`)."""
        return dataclasses.replace(
            self, plan=plan, with_lms=with_lms, step_time=step_time,
            records=tuple(r.for_plan(plan) for r in self.records))

    # Shorthands for what readers of a plan ask most (`tflms plan`'s
    # report, the plan digests of tests/test_same_plans.py).
    @property
    def tune(self) -> Optional["TuneOutcome"]:
        """The `autotune.TuneOutcome` of the swaps stage, or None without
        tuning."""
        return self.record(Tuned).outcome

    @property
    def autotuned(self) -> bool:
        """True when the tuner chose the parameters."""
        return self.tune is not None

    @property
    def budget_bytes(self) -> Optional[int]:
        """Device bytes the tuner planned for (None with fixed
        parameters): the context's budget."""
        return self.context.budget_bytes

    @property
    def ordering_edges(self):
        """The control edges the order stage added (`records.Ordered`)."""
        return self.record(Ordered).edges

    @property
    def deferral_edges(self):
        """The deferral edges of the planning index: the order stage's for
        the index it ordered (`records.Ordered.deferral`), else the defer
        stage's (`records.Deferred`)."""
        ordered = self.record(Ordered)
        if ordered.edges:
            return ordered.deferral
        return self.record(Deferred).edges

    @property
    def unwaited(self):
        """The swap-outs whose waits were dropped (`records.Unwaited`)."""
        return self.record(Unwaited).tensors

    @property
    def original_num_levels(self) -> int:
        """Levels of the step as given."""
        return self.context.given_index.num_levels

    @property
    def needed(self) -> bool:
        """False when auto-tuning found that the step fits without LMS."""
        return self.plan is not None

    @property
    def params(self) -> Optional["SwapParams"]:
        """The `planner.SwapParams` of the plan (None when not needed)."""
        return None if self.plan is None else self.plan.params

    @property
    def only_tensors(self):
        """The tensors the tuner chose to swap (None: every tensor past the
        threshold)."""
        return None if self.tune is None else self.tune.only_tensors

    def plot_data(self) -> PlotData:
        """What the memory plots of this plan show (`tflms.plots`)."""
        context = self.context
        return PlotData(index=self.index, roles=context.roles,
                        batch_size=context.batch_size,
                        without_lms=self.without_lms,
                        with_lms=self.with_lms if self.plan else None,
                        budget_bytes=self.budget_bytes)


def plan(index, settings, roles=None, log=None, simulate=False, env=None,
         by_step_time=True, target=None):
    """Plan LMS for a graph: pure, deterministic, no graph edits.

    Args:
      index: `reader.build_index` of the graph as given.
      settings: a `Settings`.
      roles: `classify(index, settings, target)` if already computed.
      log: a `Logger` for the planning log lines (default: quiet).
      simulate: also replay the step without and with the plan when the
        tuner did not (the tuner always does).
      env: the environment the device budget reads (default
        `os.environ`; tests give their own).
      by_step_time: let the tuner choose among the fitting plans by
        predicted step time (`Settings.gpu`, `Settings.interconnect`);
        False: by bytes moved (benchmarks compare the two).
      target: the `target.Target` the step runs on, as its adapter
        decided it (default: `Target.of(settings)`: the settings' devices,
        no fusion rules, no offload); with ``offload_optimizer``, its
        `offload` is what `index` is the `offload.planning_index` of, and
        every predicted step time counts its copies and host compute.

    Returns:
      A `Planned`.

    Raises:
      ValueError: bad filters or device, or serialization that closes a
        cycle.
      autotune.NoGpuError, autotune.AutotuneError, simulator.BatchSizeError:
        from auto-tuning, when it is asked for.
    """
    began = time.process_time()
    if target is None:
        target = Target.of(settings)
    if roles is None:
        roles = classify(index, settings, target)
    context = PlanningContext.create(
        index, settings, roles=roles, log=log,
        budgets=Budgets.read(settings, env, device=target.device),
        judging=Judging(by_step_time=by_step_time), target=target)
    seconds = [("context", time.process_time() - began)]
    planned = Planned(context=context, index=index)
    try:
        for stage in stages.STAGES:
            began = time.process_time()
            try:
                planned = stage(context, planned)
            finally:
                seconds.append((stage.name,
                                time.process_time() - began))
        if planned.failure is not None:
            raise planned.failure
    except AutotuneError as err:
        # What planning cost until it gave up, for the benchmarks and
        # anyone asking why a failed search took long.
        err.stage_seconds = tuple(seconds)
        raise
    planned = dataclasses.replace(planned, stage_seconds=tuple(seconds))
    if simulate and not planned.autotuned:
        planned = simulate_plan(planned)
    return planned


def simulate_plan(planned):
    """`planned` with `without_lms` and `with_lms` replayed, if the tuner
    did not already (fixed parameters)."""
    if planned.without_lms is not None:
        return planned
    model = _model_of(planned, planned.index)
    given = planned.context.given_index
    return dataclasses.replace(
        planned, without_lms=_model_of(planned, given).replay(None,
                                                              detail=True),
        with_lms=(None if planned.plan is None
                  else model.replay(planned.plan, detail=True)))


def with_part_of_plan(planned, plan):
    """`planned` with `plan`, a part of its plan (what
    `planner.prune.without_parts` leaves), in the plan's place, replayed
    with copies that take no time, and no predicted step time (the tuner
    did not choose it)."""
    with_lms = _model_of(planned, planned.index).replay(plan, detail=True)
    return planned.with_plan(plan, with_lms, None)


def instant_replay(planned):
    """The simulator's replay of `planned`'s plan with copies that take no
    time (`SimulationResult`), or None without a plan. The tuner's
    `Planned.with_lms` counts copies at `Settings.interconnect`; this is
    the count to set beside a replay that treats copies as instant, such
    as `tflms.tf.oracle`'s runtime peak."""
    if planned.plan is None:
        return None
    if not planned.autotuned and planned.with_lms is not None:
        return planned.with_lms  # `simulate_plan` replayed it so already
    return _model_of(planned, planned.index).replay(planned.plan, detail=True)


def step_floor(planned):
    """The `floor.StepFloor` of `planned`'s step as given: device memory
    no plan goes below, and the op that sets it."""
    return floor.step_floor(_model_of(planned, planned.context.given_index))


def simulate_without(index, roles, settings, offload=None):
    """The `simulator.SimulationResult` of one step without LMS (with
    `offload`'s updates on the host when `index` is its
    `offload.planning_index`)."""
    return _model(index, roles, settings, offload).replay(None, detail=True)


def _model(index, roles, settings, offload=None):
    return simulator.SimulationModel(
        index, roles, settings.batch_size,
        landings=offload_rules.write_back_buffers(offload, index))


def _model_of(planned, index):
    """The simulation model of `index` (the planning or the given index of
    `planned`): its planning context's, made once."""
    return planned.context.model(index)
