"""The planning pipeline: from a graph index and settings to a complete plan.

`plan(index, settings)` is the one place where the steps of planning are
strung together; `LMS.run`, ``tflms plan``, ``tflms verify`` and every
benchmark call it, so what is measured is what users run::

    roles          analysis.classify_ops with the settings' device and filters
    serialization  control edges chaining the chosen levels, recorded in the
                   planning index (graph_index.with_planned_edges)
    deferral       control edges delaying fills made long before use
    parameters     the settings' own, or autotune.tune's when one is -1
    ordering       when auto-tuning finds nothing that fits, or only plans
                   with synchronous swap-ins (and `Settings.order_peaks`):
                   control edges that order the ops of the most aggressive
                   plan's crowded levels (ordering.order_peaks), recorded
                   in the planning index like serialization, then the
                   search again (kept, in the second case, when its plan's
                   predicted step is shorter)
    plan           planner.make_plan (or the tuner's chosen plan: of the
                   fitting plans its search ended with, the one with the
                   least predicted step time at the settings' `gpu` and
                   `interconnect`, replayed again with its copies timed
                   there and searched again if it no longer fits): swaps,
                   serialization and deferral edges, all in one Plan
    fewer waits    when the tuner chose by step time and its plan makes
                   readers wait for swap-outs (`sync_mode` 1 or 3): each
                   of those swap-outs, most bytes first, made asynchronous
                   where a replay with copies timed still fits the budget
                   and the predicted step is shorter
    recompute      with `Settings.recompute`, swaps replaced by recomputes
                   (planner.with_recomputes) where `recompute_cost` is
                   lower (tuning: the predicted step time; fixed
                   parameters: the bytes moved) and a replay still fits
                   the budget with copies timed (tuning) or peaks no
                   higher than the swap-only plan (fixed)
    simulations    the step without and with the plan, when asked for

It reads no TensorFlow object and edits nothing: the rewriter applies
`Planned.plan` afterwards.
"""

import dataclasses
import math
import sys

from tflms import analysis
from tflms import graph_index as gi
from tflms import planner
from tflms._logging import Logger
from tflms.settings import AUTO, Settings

__all__ = ["Planned", "classify", "plan", "simulate_plan",
           "instant_replay", "simulate_without", "recompute_cost"]

_GIB = float(1 << 30)

# `Settings` filter name -> the `analysis.classify_ops` filter it feeds, as
# (key, scopes setting, types setting).
_FILTER_PAIRS = (
    ("incl_sources", "incl_output_by_scopes", "incl_output_by_types"),
    ("excl_sources", "excl_output_by_scopes", "excl_output_by_types"),
    ("incl_sinks", "incl_input_by_scopes", "incl_input_by_types"),
    ("excl_sinks", "excl_input_by_scopes", "excl_input_by_types"),
)


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
      ordering_edges: the control edges `ordering.order_peaks` added to
        the planning index when auto-tuning found nothing that fits
        without them, or a faster plan with them (also in
        `index.planned_edges`, and so in the plan's serialization edges,
        which the rewriter adds).
      unwaited: ``(producer, output)`` of the swapped tensors whose
        swap-outs the tuner's `sync_mode` would make their readers wait
        for, and whose waits were dropped because the plan fits without
        them and its predicted step is shorter (`_fewer_swapout_waits`).
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
    """

    index: object
    given_index: object
    roles: object
    settings: Settings
    serialized_levels: tuple = ()
    deferral_edges: tuple = ()
    ordering_edges: tuple = ()
    unwaited: tuple = ()
    plan: object = None
    autotuned: bool = False
    tune: object = None
    without_lms: object = None
    with_lms: object = None
    budget_bytes: object = None
    step_time: object = None

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


def classify(index, settings):
    """The `OpRoles` of `index` under `settings` (device and filters).

    Raises:
      ValueError: a filter or `gpu_device` that matches no operation.
    """
    filters = {}
    for key, scopes_name, types_name in _FILTER_PAIRS:
        scopes = getattr(settings, scopes_name)
        types = getattr(settings, types_name)
        if scopes or types:
            filters[key] = analysis.ops_matching(
                index, scopes, types, "%s/%s" % (scopes_name, types_name))
    roles = analysis.classify_ops(index, settings.gpu_device,
                                  settings.is_training, filters)
    if settings.gpu_device is not None and not roles.device_ops:
        raise ValueError(
            "gpu_device=%r matches no operation in the graph; ops are "
            "placed on %s. Use one of those, or None for every non-CPU "
            "device." % (settings.gpu_device, _device_summary(index)))
    return roles


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
    log = log or Logger()
    if roles is None:
        roles = classify(index, settings)
    given = index

    ser_edges, ser_levels = _serialization(index, roles, settings)
    if ser_edges:
        log.info("Serializing %d levels: %s" % (
            len(ser_levels), _compact_levels(ser_levels)))
        index = gi.with_planned_edges(index, ser_edges)
        log.info("New categorized topological sort has %d levels"
                 % index.num_levels)

    deferral = planner.deferral_edges(index, roles)
    if deferral:
        log.info("Delaying %d tensor fills (%.2f GiB), such as the "
                 "gradient zeros of the untaken branch of v1 conds, until "
                 "just before their first reader" % (
                     len(deferral), sum(
                         gi.tensor_bytes(index, op, 0, settings.batch_size)
                         or 0 for _, op in deferral) / _GIB), 1)

    planned = Planned(index=index, given_index=given, roles=roles,
                      settings=settings,
                      serialized_levels=tuple(ser_levels),
                      deferral_edges=deferral)
    if settings.autotune_requested:
        outcome, index, deferral, ordering_edges = _tune_ordered(
            index, roles, settings, deferral, log, env, list_devices,
            by_step_time)
        planned = dataclasses.replace(
            planned, index=index, deferral_edges=deferral,
            ordering_edges=ordering_edges,
            plan=outcome.plan, autotuned=True, tune=outcome,
            without_lms=(outcome.without_lms if index is given
                         else simulate_without(given, roles, settings)),
            with_lms=outcome.with_lms,
            budget_bytes=outcome.budget_bytes, step_time=outcome.step_time)
        if by_step_time and outcome.plan is not None:
            planned = _fewer_swapout_waits(planned, log)
        if settings.recompute and outcome.plan is not None:
            planned = _recompute_within_budget(planned, log)
        return planned

    chosen = planner.make_plan(index, roles, _requested(settings),
                               batch_size=settings.batch_size,
                               deferral=deferral)
    planned = dataclasses.replace(planned, plan=chosen)
    if settings.recompute and chosen.swaps:
        planned = _recompute_within_peak(planned, log)
    return simulate_plan(planned) if simulate else planned


def recompute_cost(plan, timer=None, result=None):
    """What planning minimises when it replaces swaps by recomputes (lower
    is better).

    Args:
      plan: a `planner.Plan`.
      timer: a `steptime.StepTimeModel` of the planning index, or None.
      result: the plan's `simulator.SimulationResult` (its levels time the
        plan), needed with `timer`.

    Returns:
      With `timer`: ``(predicted step seconds, bytes moved)``, so a
      recompute is taken when its clones cost less time than the copies they
      save, and equal times go to fewer bytes moved. Without: the bytes a
      plan copies between device and host per step.
    """
    if timer is None:
        return plan.moved_bytes()
    if result is None:
        raise ValueError("recompute_cost needs the plan's replay (result=) "
                         "to time it with a step-time model; got None")
    step = timer.predict(plan, result.levels, result.num_levels)
    return (step.with_lms_s, plan.moved_bytes())


def _step_time_model(planned):
    # Imported here: only tuned plans and recomputes are timed.
    from tflms import steptime  # pylint: disable=import-outside-toplevel
    settings = planned.settings
    return steptime.StepTimeModel(planned.index, planned.roles,
                                  settings.batch_size, gpu=settings.gpu,
                                  interconnect=settings.interconnect)


def _recompute_within_budget(planned, log, cost=recompute_cost):
    """`planned` with the tuner's swaps replaced by recomputes where a
    replay of the plan still fits the budget with its copies timed (as the
    tuner judges its own plan) and `cost` (by predicted step time at the
    settings' GPU and link) is lower."""
    model = _model(planned.index, planned.roles, planned.settings)
    timer = _step_time_model(planned)
    budget = planned.budget_bytes
    start = model.replay(planned.plan, detail=False)
    # Plans accepted so far and their cost (kept alive, so ids stay theirs).
    costs = {id(planned.plan): (planned.plan,
                                cost(planned.plan, timer, start))}
    compute_s = math.fsum(timer.op_seconds)

    def accept(candidate, current):
        if (cost is recompute_cost
                and _slower_than(candidate, costs[id(current)][1][0], timer,
                                 compute_s)):
            return False
        result = model.replay(candidate, detail=False)
        # Copies that take time only hold memory longer: a plan over the
        # budget with instant copies is not timed.
        if not result.fits(budget):
            return False
        timed, step = _replay_in_time(model, timer, candidate, detail=False,
                                      instant=result)
        if not timed.fits(budget):
            return False
        value = ((step.with_lms_s, candidate.moved_bytes())
                 if cost is recompute_cost else cost(candidate, timer, result))
        if value < costs[id(current)][1]:
            costs[id(candidate)] = (candidate, value)
            return True
        return False

    # Each recompute here is timed, so clones of convolutions and matrix
    # products are offered too: one is taken only where it shortens the
    # predicted step.
    clone_types = planner.RECOMPUTABLE_TYPES
    if cost is recompute_cost:
        clone_types = planner.TIMED_RECOMPUTABLE_TYPES
        step_s = costs[id(planned.plan)][1][0]
        if step_s - compute_s <= 1e-9 * step_s:
            # The compute hides every copy, and no recompute can change
            # that (a step is never shorter than its compute): only clones
            # that take no time pass `_slower_than`, so only those are
            # looked for. The 200,000-op deep MLP (`benchmarks/plan_speed.py
            # deep_mlp 200000 --recompute`) plans in 18.9 s, not 39.1 s.
            from tflms import steptime  # pylint: disable=import-outside-toplevel
            clone_types = clone_types & steptime.NO_KERNEL_TYPES
    chosen = planner.with_recomputes(planned.index, planned.roles,
                                     planned.plan, accept,
                                     planned.settings.batch_size,
                                     clone_types=clone_types)
    if chosen is planned.plan:
        log.info("[Simulator] No swapped tensor can be recomputed within "
                 "the budget in less predicted time than it is swapped")
        return planned
    final, step = _replay_in_time(model, timer, chosen)
    if not final.fits(budget):
        # Every recompute taken was judged with its copies timed; this
        # only guards the plan returned. The tuner's plan fits with its
        # copies timed, so it stays.
        log.info("[Simulator] With recomputes and copies timed at %s one "
                 "step would peak at %.2f GiB, over the %.2f GiB budget; "
                 "keeping the swap-only plan" % (
                     planned.settings.interconnect,
                     final.peak_device_bytes / _GIB, budget / _GIB))
        return planned
    _log_recomputes(log, chosen)
    log.info("[Simulator] With LMS and recomputes one step peaks at %.2f "
             "GiB of %.2f GiB at level %d (%s); predicted step %.1f ms, "
             "%.1f ms of it exposed transfer, %.1f ms recomputing" % (
                 final.peak_device_bytes / _GIB, budget / _GIB,
                 final.peak_level, final.peak_op, step.with_lms_s * 1e3,
                 step.exposed_transfer_s * 1e3, step.recompute_s * 1e3))
    return _replaced_plan(planned, chosen, final, step, log)


def _fewer_swapout_waits(planned, log):
    """`planned` (auto-tuned, chosen by step time) with the swap-outs its
    readers wait for made asynchronous one by one, most bytes first, where
    a replay with copies timed still fits the budget and the predicted step
    is shorter.

    A synchronous mode holds every early reader of a swapped tensor back
    until its copy to the host has finished, so that nothing new is
    allocated while the tensor still occupies the device. The tuner sets
    the mode for the whole plan; where the budget has room for the
    allocations made during one copy, its wait only costs time (the U-Net
    at 352^3 waited 177 ms for one 5.2 GiB copy). Each swap-out is one
    replay; `ordering.replays_for` bounds how many are tried."""
    plan = planned.plan
    waited = sorted((s for s in plan.swaps if s.waiters),
                    key=lambda s: (-(s.nbytes or 0), s.producer, s.output))
    # Without a predicted step (copies instant) a wait costs no time, so
    # no dropped wait could shorten it.
    if not waited or planned.step_time is None:
        return planned
    # Imported here: only tuned plans with synchronous swap-outs need it.
    from tflms import ordering  # pylint: disable=import-outside-toplevel
    model = _model(planned.index, planned.roles, planned.settings)
    timer = _step_time_model(planned)
    budget = planned.budget_bytes
    # The tuner timed its plan at the levels of its replay, as
    # `_replay_in_time` does.
    best = planned.step_time.with_lms_s
    current = plan
    freed = []
    for swap in waited[:ordering.replays_for(planned.index.num_ops)]:
        candidate = dataclasses.replace(current, swaps=tuple(
            dataclasses.replace(s, waiters=()) if s is swap else s
            for s in current.swaps))
        timed, step = _replay_in_time(model, timer, candidate, detail=False)
        if timed.fits(budget) and step.with_lms_s < best:
            current, best = candidate, step.with_lms_s
            freed.append(swap)
    if not freed:
        return planned
    final, step = _replay_in_time(model, timer, current)
    log.info("[Simulator] %d of %d swap-outs no longer make their readers "
             "wait (%.2f GiB): one step peaks at %.2f GiB of %.2f GiB with "
             "copies timed at %s; predicted step %.1f ms instead of %.1f ms"
             % (len(freed), len(waited),
                sum(s.nbytes or 0 for s in freed) / _GIB,
                final.peak_device_bytes / _GIB, budget / _GIB,
                planned.settings.interconnect, step.with_lms_s * 1e3,
                planned.step_time.with_lms_s * 1e3))
    return _replaced_plan(
        dataclasses.replace(planned, unwaited=tuple(
            (s.producer, s.output) for s in freed)),
        current, final, step, log)


def _replaced_plan(planned, plan, replay, step, log):
    """`planned` with the tuner's plan replaced by `plan` (its timed
    `replay` and predicted `step`); the memory plots, which the tuner drew
    for its own plan, are drawn again for the one applied."""
    settings = planned.settings
    if settings.autotune_plot:
        from tflms import plots  # pylint: disable=import-outside-toplevel
        plots.write_plots(settings.plot_dir, planned.index, planned.roles,
                          planned.without_lms, replay, planned.budget_bytes,
                          batch_size=settings.batch_size, log=log)
    # A tensor recomputed instead is no longer swapped: no wait to drop.
    swapped = {(s.producer, s.output) for s in plan.swaps}
    return dataclasses.replace(
        planned, plan=plan, with_lms=replay, step_time=step,
        unwaited=tuple(t for t in planned.unwaited if t in swapped))


def _slower_than(candidate, step_s, timer, compute_s):
    """True if `candidate` cannot take less than `step_s` seconds: the
    compute stream alone runs every op and every clone one after the other,
    so the step is never shorter than that sum. When the current plan's
    copies are all hidden, every recompute fails this test, and neither its
    replay nor its timing (each about a replay) is spent on it."""
    # Clones count as `StepTimeModel.predict` times them: before a reader
    # that runs.
    clones_s = math.fsum(timer.op_seconds[op] for rec in candidate.recomputes
                         if any(timer.runs[c] for c, _ in rec.consumers)
                         for op in rec.ops)
    bound = compute_s + clones_s
    # Clear of float rounding: the sums are made in different orders.
    return bound - step_s > 1e-9 * step_s


def _replay_in_time(model, timer, plan, detail=True, instant=None):
    """The replay of `plan` with its copies timed by `timer` (a
    `steptime.StepTimeModel` on the settings' gpu and interconnect; copies
    count as instant on ``'instant'``), as the tuner judges its own plan,
    and its predicted `steptime.StepTime`."""
    # Imported here, like the simulator: only tuning times copies.
    from tflms import steptime  # pylint: disable=import-outside-toplevel
    if timer.interconnect is steptime.INSTANT:
        if instant is None or detail:
            instant = model.replay(plan, detail=detail)
        return instant, timer.predict(plan, instant.levels,
                                      instant.num_levels)
    return steptime.replay_in_time(model, timer, plan, detail=detail,
                                   instant=instant)


def _recompute_within_peak(planned, log, cost=recompute_cost):
    """`planned` (fixed parameters) with swaps replaced by recomputes where
    a replay peaks no higher than the swap-only plan and `cost` is lower:
    fixed parameters give no budget, so the swap plan's own peak is the
    memory a recompute must free as well. The cost is the bytes moved:
    the parameters were set by hand, so no step-time choice was asked for,
    and a recompute here is a way to move less at the same peak."""
    # Imported here: fixed-parameter edits without recompute never need
    # the simulator.
    from tflms import simulator  # pylint: disable=import-outside-toplevel
    try:
        model = _model(planned.index, planned.roles, planned.settings)
        limit = model.replay(planned.plan, detail=False).peak_device_bytes
    except simulator.BatchSizeError:
        log.warning("Not recomputing: choosing what to recompute needs "
                    "every tensor's size, and some shapes have an unknown "
                    "batch dimension; set lms.batch_size = <your mini-batch "
                    "size> to recompute with fixed parameters (the swaps "
                    "are applied as planned)")
        return planned

    def accept(candidate, current):
        if cost(candidate) >= cost(current):
            return False
        return model.replay(candidate, detail=False).fits(limit)

    chosen = planner.with_recomputes(planned.index, planned.roles,
                                     planned.plan, accept,
                                     planned.settings.batch_size)
    _log_recomputes(log, chosen)
    return dataclasses.replace(planned, plan=chosen)


def _log_recomputes(log, plan):
    if plan.recomputes:
        log.info("Recomputing %d swapped tensors (%.3f GiB) by cloning the "
                 "operations that made them instead: %.3f GiB moved per step"
                 % (len(plan.recomputes), plan.recompute_bytes() / _GIB,
                    plan.moved_bytes() / _GIB))


def simulate_plan(planned):
    """`planned` with `without_lms` and `with_lms` replayed, if the tuner
    did not already (fixed parameters)."""
    if planned.without_lms is not None:
        return planned
    model = _model(planned.index, planned.roles, planned.settings)
    given = planned.given_index
    return dataclasses.replace(
        planned, without_lms=(
            model.replay(None, detail=True) if given is planned.index
            else simulate_without(given, planned.roles, planned.settings)),
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
    model = _model(planned.index, planned.roles, planned.settings)
    return model.replay(planned.plan, detail=True)


def simulate_without(index, roles, settings):
    """The `simulator.SimulationResult` of one step without LMS."""
    return _model(index, roles, settings).replay(None, detail=True)


def _model(index, roles, settings):
    # Imported here: fixed-parameter edits never need the simulator.
    from tflms import simulator  # pylint: disable=import-outside-toplevel
    return simulator.SimulationModel(index, roles, settings.batch_size)


def _requested(settings):
    return planner.SwapParams(settings.swapout_threshold,
                              settings.swapin_ahead, settings.swapin_groupby,
                              settings.sync_mode)


def _serialization(index, roles, settings):
    extra = ()
    if settings.serialization_by_size:
        extra = planner.levels_over_size(
            index, roles, settings.serialization_by_size, settings.batch_size)
    if not settings.serialization_levels and not extra:
        return (), []
    excluded = analysis.initializer_inputs(index)
    return planner.serialization_edges(
        index, roles, settings.serialization_levels, extra, excluded)


def _tune(index, roles, settings, deferral, log, env, list_devices,
          by_step_time=True, ordering_edges=()):
    # Imported here: tuning pulls in the simulator, which fixed-parameter
    # users never need.
    from tflms import autotune  # pylint: disable=import-outside-toplevel
    outcome = autotune.tune(
        index, roles, requested=_requested(settings),
        batch_size=settings.batch_size,
        gpu_mem_gib=settings.autotune_gpu_mem,
        gpu_device=settings.gpu_device,
        plot_dir=settings.plot_dir if settings.autotune_plot else None,
        log=log, deferral_edges=deferral, env=env,
        list_devices=list_devices, gpu=settings.gpu,
        interconnect=settings.interconnect, by_step_time=by_step_time,
        ordering_edges=ordering_edges)
    if outcome.params is None:
        log.info("LMS is not necessary: the model fits in %.2f GiB "
                 "without swapping. Turned LMS off."
                 % (outcome.budget_bytes / _GIB))
    return outcome


# Rounds of ordering and searching again when nothing fits: each round
# orders the peak of the plan the last search could not fit.
_ORDERING_ROUNDS = 3


def _tune_ordered(index, roles, settings, deferral, log, env, list_devices,
                  by_step_time):
    """`_tune`, and when it finds nothing that fits, rounds of
    `_peak_orderings` and `_tune` again on the index with each set of
    edges.

    Returns:
      ``(outcome, index, deferral, ordering_edges)``: the index and
      deferral edges the outcome was planned on.

    Raises:
      autotune.AutotuneError: from the last search, when no round fits.
    """
    from tflms import autotune  # pylint: disable=import-outside-toplevel
    try:
        outcome = _tune(index, roles, settings, deferral, log, env,
                        list_devices, by_step_time)
    except autotune.AutotuneError:
        if not settings.order_peaks:
            raise
        error = sys.exc_info()
    else:
        return _faster_ordered(outcome, index, roles, settings, deferral,
                               log, env, list_devices, by_step_time)
    found = ()
    for _ in range(_ORDERING_ROUNDS):
        candidates = _peak_orderings(index, roles, settings, deferral, log,
                                     env, list_devices, found=found)
        if not candidates:
            break
        lowest = None
        for edges in candidates:
            ordered, ordered_deferral = _with_ordering(index, roles, edges)
            lowest = lowest or (ordered, ordered_deferral)
            log.info("[Simulator] Searching again with %d ordering edges"
                     % len(found + edges))
            try:
                return (_tune(ordered, roles, settings, ordered_deferral,
                              log, env, list_devices, by_step_time,
                              found + edges), ordered, ordered_deferral,
                        found + edges)
            except autotune.AutotuneError:
                error = sys.exc_info()
        # Nothing fitted with any of them: order the lowest peak further.
        found += candidates[0]
        index, deferral = lowest
    raise error[1].with_traceback(error[2])


def _with_ordering(index, roles, edges):
    """The planning index with ordering `edges` planned, and its deferral
    edges (the delayed fills' triggers follow the new levels)."""
    ordered = gi.with_planned_edges(index, edges)
    return ordered, planner.deferral_edges(ordered, roles)


def _faster_ordered(outcome, index, roles, settings, deferral, log, env,
                    list_devices, by_step_time):
    """A plan that fits only with synchronous swap-ins (`sync_mode` 2 or
    3) waits for every copy back: memory, not the link, decides its step.
    Ordering the crowded levels of the most aggressive plan as far as it
    goes leaves room for earlier, asynchronous swap-ins; the search runs
    again with those edges and its plan is kept when its predicted step is
    shorter. Returns what `_tune_ordered` returns."""
    from tflms import autotune  # pylint: disable=import-outside-toplevel
    plain = (outcome, index, deferral, ())
    if (not settings.order_peaks or outcome.params is None
            or outcome.params.sync_mode < 2 or outcome.step_time is None):
        return plain
    candidates = _peak_orderings(index, roles, settings, deferral, log,
                                 env, list_devices, target=0)
    if not candidates:
        return plain
    edges = candidates[0]
    ordered, ordered_deferral = _with_ordering(index, roles, edges)
    try:
        other = _tune(ordered, roles, settings, ordered_deferral, Logger(),
                      env, list_devices, by_step_time, edges)
    except autotune.AutotuneError:
        return plain
    before = outcome.step_time.with_lms_s
    after = (other.step_time.with_lms_s if other.step_time is not None
             else float("inf"))
    keep = other.params is not None and after < before
    log.info("[Simulator] The plan needs synchronous swap-ins (sync_mode "
             "%d); with %d ordering edges the search finds sync_mode %s, "
             "predicted step %.1f ms instead of %.1f ms: %s" % (
                 outcome.params.sync_mode, len(edges),
                 other.params.sync_mode if other.params else "-",
                 after * 1e3, before * 1e3,
                 "keeping the ordered plan" if keep else
                 "keeping the plan without them"))
    return (other, ordered, ordered_deferral, edges) if keep else plain


def _peak_orderings(index, roles, settings, deferral, log, env,
                    list_devices, target=None, found=()):
    """Ordering edges for the most aggressive plans the settings allow
    (every parameter on auto at its smallest), one set per sync mode from
    the requested one up, each lowering that plan's peak to `target` bytes
    (default: the budget) or as far as the replays go. `found`: ordering
    edges already in the index (earlier rounds).

    Returns:
      The distinct non-empty edge tuples, lowest ordered peak first (then
      the higher sync mode: its plans also fit when copies take time).
      Different sync modes may order the same level in opposite ways, so
      the sets are tried one at a time, never merged.
    """
    # pylint: disable=import-outside-toplevel
    from tflms import autotune, ordering
    budget = autotune.device_budget(settings.autotune_gpu_mem,
                                    settings.gpu_device, env, list_devices)
    model = _model(index, roles, settings)
    requested = _requested(settings)

    def given(value, smallest):
        return smallest if value == AUTO else value

    results = []
    for sync in range(requested.sync_mode, 4):
        params = planner.SwapParams(
            given(requested.swapout_threshold, 1),
            given(requested.swapin_ahead, 1),
            given(requested.swapin_groupby, 0), sync)
        plan = planner.wait_for_ordering(
            planner.make_plan(index, roles, params,
                              batch_size=settings.batch_size,
                              deferral=deferral), found)
        result = ordering.order_peaks(
            model, plan, budget, target=target,
            max_replays=ordering.replays_for(index.num_ops))
        if result.edges:
            results.append((result.result.peak_device_bytes, -sync, result,
                            params))
    results.sort(key=lambda r: (r[0], r[1]))
    orderings, seen = [], set()
    for _, _, result, params in results:
        if result.edges in seen:
            continue
        seen.add(result.edges)
        orderings.append(result.edges)
        log.info("[Simulator] %s; ordering %d pairs of operations at the "
                 "memory peaks lowers the plan with swapout_threshold %d, "
                 "swapin_ahead %d, swapin_groupby %d, sync_mode %d from "
                 "%.2f to %.2f GiB (%s)" % (
                     ("Nothing fits in %.2f GiB" % (budget / _GIB)
                      if target is None else "Ordering the memory peaks"),
                     len(result.edges), params.swapout_threshold,
                     params.swapin_ahead, params.swapin_groupby,
                     params.sync_mode, result.peak_before / _GIB,
                     result.result.peak_device_bytes / _GIB,
                     "; ".join("%s before %s" % (index.names[a],
                                                 index.names[b])
                               for a, b in result.edges[:3])
                     + (" ..." if len(result.edges) > 3 else "")), 1)
    return orderings


def _device_summary(index):
    devices = sorted({d or "(unplaced)" for d in index.devices})
    return ", ".join(devices[:6]) + (" ..." if len(devices) > 6 else "")


def _compact_levels(levels):
    if len(levels) <= 12:
        return str(list(levels))
    return "%s ... %s" % (list(levels[:6]), list(levels[-3:]))
