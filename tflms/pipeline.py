"""The planning pipeline: from a graph index and settings to a complete plan.

`plan(index, settings)` is the one place where planning is strung together;
`LMS.run`, ``tflms plan``, ``tflms verify`` and every benchmark call it, so
what is measured is what users run. It builds one
`context.PlanningContext` (roles, budgets, log, models) and runs the stages
of `tflms.stages.STAGES` over a `Planned`, each ``stage(context, planned) ->
planned``:

    serialize    control edges chaining the chosen levels, recorded in the
                 planning index (graph_index.with_planned_edges)
    defer        control edges delaying fills made long before use
    swaps        the settings' parameters, or autotune.tune's when one is -1
                 (among the fitting plans its search ended with, the one
                 with the least predicted step time at the settings' `gpu`
                 and `interconnect`)
    order        when auto-tuning finds nothing that fits, or only plans
                 with synchronous swap-ins (and `Settings.order_peaks`):
                 control edges that order the ops of the most aggressive
                 plan's crowded levels, then the search again
    fewer_waits  swap-outs the tuned plan makes readers wait for, made
                 asynchronous where a replay with copies timed still fits
                 and the predicted step is shorter
    recompute    unless `Settings.recompute` is False, swaps replaced by
                 recomputes where they cost less and the budget (tuning) or the
                 swap-only plan's peak (fixed parameters) still holds

then replays the step without and with the plan when asked. It reads no
TensorFlow object and edits nothing: the rewriter applies `Planned.plan`
afterwards.
"""

import dataclasses

from tflms import floor
from tflms import simulator
from tflms import stages
from tflms.context import PlanningContext, classify
from tflms.settings import Settings
from tflms.stages.recompute import recompute_cost

__all__ = ["Planned", "PlanningContext", "classify", "plan", "simulate_plan",
           "instant_replay", "simulate_without", "recompute_cost",
           "step_floor"]


@dataclasses.dataclass(frozen=True, eq=False)
class Planned:
    """What planning decided, as plain data.

    Attributes:
      index: the planning index: the graph's ops and edges plus the control
        edges LMS will add for serialization (`index.planned_edges`), with
        levels that count them.
      given_index: the index of the step as given, without the edges LMS
        plans (serialization, ordering): what `without_lms` replays.
      roles: the `analysis.OpRoles` of the index.
      settings: the `Settings` planned with.
      serialized_levels: the levels chained by serialization (original
        levels), sorted.
      deferral_edges: `planner.deferral_edges` of the index (carried out by
        every plan).
      ordering_edges: the control edges `peak_ordering.order_peaks` added to
        the planning index when auto-tuning found nothing that fits
        without them, or a faster plan with them (also in
        `index.planned_edges`, and so in the plan's serialization edges,
        which the rewriter adds).
      unwaited: ``(producer, output)`` of the swapped tensors whose
        swap-outs the tuner's `sync_mode` would make their readers wait
        for, and whose waits were dropped because the plan fits without
        them and its predicted step is shorter (`stages.fewer_waits`).
      prefetched: ``(producer, output, j)`` of the swap-ins (the j-th of
        that tensor's) the prefetch stage started earlier than the tuner
        did, because a reader (or a recompute's clones) waited for them and
        the plan fits and runs faster with the earlier start
        (`stages.prefetch`).
      plan: the complete `planner.Plan` (swaps, serialization and deferral
        edges), or None when LMS is not needed (auto-tuning found that the
        step fits without swapping).
      autotuned: True when the tuner chose the parameters.
      tune: the `autotune.TuneOutcome`, or None without tuning.
      without_lms / with_lms: `simulator.SimulationResult` of one step
        without LMS (the step as given, whatever edges LMS plans, so the
        same for every budget) and with `plan` (None when not simulated; with_lms is
        also None when `plan` is None). The tuner's with_lms counts copies
        at `Settings.interconnect`; a fixed-parameter plan's
        (`simulate_plan`) counts them as instant.
      budget_bytes: device bytes the tuner planned for (None without
        tuning).
      step_time: `steptime.StepTime` of `plan` at the settings' `gpu` and
        `interconnect`, when auto-tuning chose the plan by it (None
        otherwise; `steptime.predict_planned` times any plan).
      failure: the `autotune.AutotuneError` of a search that found nothing
        that fits, while a later stage may still overcome it (None
        otherwise); `plan` raises it when no stage did.
      context: the `PlanningContext` it was planned in (None when made
        another way), whose simulation models `simulate_plan` and
        `instant_replay` reuse rather than build again.
    """

    index: object
    given_index: object
    roles: object
    settings: Settings
    serialized_levels: tuple = ()
    deferral_edges: tuple = ()
    ordering_edges: tuple = ()
    unwaited: tuple = ()
    prefetched: tuple = ()
    plan: object = None
    autotuned: bool = False
    tune: object = None
    without_lms: object = None
    with_lms: object = None
    budget_bytes: object = None
    step_time: object = None
    failure: object = None
    context: object = dataclasses.field(default=None, repr=False)

    @property
    def original_num_levels(self):
        """Levels of the step as given."""
        return self.given_index.num_levels

    @property
    def needed(self):
        """False when auto-tuning found that the step fits without LMS."""
        return self.plan is not None

    @property
    def params(self):
        """The `planner.SwapParams` of the plan (None when not needed)."""
        return None if self.plan is None else self.plan.params

    @property
    def only_tensors(self):
        """The tensors the tuner chose to swap (None: every tensor past the
        threshold)."""
        return None if self.tune is None else self.tune.only_tensors



def plan(index, settings, roles=None, log=None, simulate=False, env=None,
         list_devices=None, by_step_time=True):
    """Plan LMS for a graph: pure, deterministic, no graph edits.

    Args:
      index: `graph_index.build_index` of the graph as given.
      settings: a `Settings`.
      roles: `classify(index, settings)` if already computed.
      log: a `Logger` for the planning log lines (default: quiet).
      simulate: also replay the step without and with the plan when the
        tuner did not (the tuner always does).
      env, list_devices: for the device budget (tests).
      by_step_time: let the tuner choose among the fitting plans by
        predicted step time (`Settings.gpu`, `Settings.interconnect`);
        False: by bytes moved, as before the step-time model (benchmarks
        compare the two).

    Returns:
      A `Planned`.

    Raises:
      ValueError: bad filters or device, or serialization that closes a
        cycle.
      autotune.NoGpuError, autotune.AutotuneError, simulator.BatchSizeError:
        from auto-tuning, when it is asked for.
    """
    context = PlanningContext.create(index, settings, roles=roles, log=log,
                                     env=env, list_devices=list_devices,
                                     by_step_time=by_step_time)
    planned = Planned(index=index, given_index=index, roles=context.roles,
                      settings=settings, context=context)
    for stage in stages.STAGES:
        planned = stage(context, planned)
    if planned.failure is not None:
        raise planned.failure
    if simulate and not planned.autotuned:
        planned = simulate_plan(planned)
    return planned


def simulate_plan(planned):
    """`planned` with `without_lms` and `with_lms` replayed, if the tuner
    did not already (fixed parameters)."""
    if planned.without_lms is not None:
        return planned
    model = _model_of(planned, planned.index)
    given = planned.given_index
    return dataclasses.replace(
        planned, without_lms=_model_of(planned, given).replay(None,
                                                              detail=True),
        with_lms=(None if planned.plan is None
                  else model.replay(planned.plan, detail=True)))


def instant_replay(planned):
    """The simulator's replay of `planned`'s plan with copies that take no
    time (`SimulationResult`), or None without a plan. The tuner's
    `Planned.with_lms` counts copies at `Settings.interconnect`; this is
    the count to set beside a replay that treats copies as instant, such
    as `tflms.oracle`'s runtime peak."""
    if planned.plan is None:
        return None
    if not planned.autotuned and planned.with_lms is not None:
        return planned.with_lms  # `simulate_plan` replayed it so already
    return _model_of(planned, planned.index).replay(planned.plan, detail=True)


def step_floor(planned):
    """The `floor.StepFloor` of `planned`'s step as given: device memory
    no plan goes below, and the op that sets it."""
    return floor.step_floor(_model_of(planned, planned.given_index))


def simulate_without(index, roles, settings):
    """The `simulator.SimulationResult` of one step without LMS."""
    return _model(index, roles, settings).replay(None, detail=True)


def _model(index, roles, settings):
    return simulator.SimulationModel(index, roles, settings.batch_size)


def _model_of(planned, index):
    """The simulation model of `index` (the planning or the given index of
    `planned`): its planning context's, made once, when it has one."""
    if planned.context is not None:
        return planned.context.model(index)
    return _model(index, planned.roles, planned.settings)
