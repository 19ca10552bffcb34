"""The stages of `pipeline.plan` (`tflms.stages`): each is
``stage(context, planned) -> planned``; a stage that does not apply returns
its input; one that cannot finish leaves `Planned.failure` for a later
stage or for `pipeline.plan` to raise."""

import dataclasses

import pytest

from tflms import autotune
from tflms import graph_index as gi
from tflms import pipeline
from tflms import planner
from tflms import stages
from tflms.settings import Settings
from tflms.stages import (defer, fewer_waits, host, order, recompute,
                          serialize, swaps)
from tflms.stages import contract, records, timed, tuning

import _literal as L
from test_peak_ordering import U as OU, crowded_graph


def _start(context):
    return pipeline.Planned(context=context, index=context.given_index)


def _through(context, *names):
    """`_start` run through the stages named (in `STAGES` order)."""
    planned = _start(context)
    for stage in stages.STAGES:
        if stage.run.__module__.rsplit(".", 1)[-1] in names:
            planned = stage(context, planned)
    return planned


def test_the_pipeline_hands_each_stage_what_the_one_before_returned(
        monkeypatch):
    """`pipeline.plan` runs every stage of `STAGES` once, in its order, in
    one context, each on the `Planned` the stage before returned; the
    last one's is the result."""
    calls = []

    def recording(stage):
        def run(context, planned):
            calls.append((stage, context, planned))
            return planned.with_record(records.Serialized((len(calls),)))
        return contract.Stage(stage.name, run,
                              writes=frozenset({records.Serialized}))

    real = stages.STAGES
    monkeypatch.setattr(stages, "STAGES",
                        tuple(recording(s) for s in real))
    index = L.chain()
    planned = pipeline.plan(index, Settings(swapout_threshold=1,
                                            swapin_ahead=1, swapin_groupby=0))
    assert [c[0] for c in calls] == list(real)
    assert len({id(c[1]) for c in calls}) == 1
    assert calls[0][2].index is index
    for k, (_, _, given) in enumerate(calls[1:], 1):
        assert given.record(records.Serialized).levels == (k,)
    assert planned.record(records.Serialized).levels == (len(real),)


# ---- serialize ------------------------------------------------------------
def test_serialize_plans_edges_in_the_index_and_names_the_levels(lms_log):
    # Level 4 of the crowded graph holds f and i: chained, one after the
    # other, they make one level more.
    index = crowded_graph()
    context = L.context(index, swapout_threshold=3, swapin_ahead=1,
                        swapin_groupby=0, serialization=[4])
    planned = serialize.stage(context, _start(context))
    ids = L.ids(index)
    assert planned.record(records.Serialized).levels == (4,)
    assert set(planned.index.planned_edges) in (
        {(ids["f"], ids["i"])}, {(ids["i"], ids["f"])})
    assert planned.index.num_levels == index.num_levels + 1
    assert planned.context.given_index is index
    assert any("Serializing 1 levels: [4]" in line for line in lms_log())
    untouched = L.context(index, swapout_threshold=3, swapin_ahead=1,
                          swapin_groupby=0)
    start = _start(untouched)
    assert serialize.stage(untouched, start) is start


# ---- defer ----------------------------------------------------------------
def test_defer_delays_a_fill_made_long_before_its_reader():
    # z, a Fill of a constant, is made at level 1 and read only at level 5.
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [L.U]}),
         ("c", "Const", {"outputs": [8]}),
         ("z", "Fill", {"outputs": [L.U]})]
        + [("f%d" % k, "Relu", {"outputs": [L.U]}) for k in range(1, 5)]
        + [("g", "AddN", {"outputs": [L.U]})],
        edges=[("x", "f1"), ("f1", "f2"), ("f2", "f3"), ("f3", "f4"),
               ("c", "z"), ("f4", "g"), ("z", "g")])
    context = L.context(index, swapout_threshold=100, swapin_ahead=1,
                        swapin_groupby=0)
    planned = defer.stage(context, _start(context))
    ids = L.ids(index)
    assert planned.record(records.Deferred).edges == ((ids["f3"], ids["z"]),)
    # Nothing to delay on the chain: the stage records no edges.
    chain = L.chain()
    context = L.context(chain, swapout_threshold=100, swapin_ahead=1,
                        swapin_groupby=0)
    start = _start(context)
    assert defer.stage(context, start) is start


# ---- swaps ----------------------------------------------------------------
def test_swaps_with_fixed_parameters_is_the_planners_plan():
    index = L.chain()
    context = L.context(index, swapout_threshold=3, swapin_ahead=1,
                        swapin_groupby=0)
    planned = swaps.stage(context, _start(context))
    assert not planned.autotuned
    assert planned.plan == planner.make_plan(
        index, context.roles, planner.SwapParams(3, 1, 0, 0))
    # f{k} is read by g{k} 2 * (6 - k) + 1 levels later: f5 only 3.
    assert [index.names[s.producer] for s in planned.plan.swaps] == [
        "f1", "f2", "f3", "f4"]


def _chain():
    """`_literal.chain` one step deeper: x -> f1 .. f7 and back. f1 writes
    into x's buffer and g7 .. g1 into f7's, so its peak without LMS is 7U
    (f1 .. f7, at levels 7-9), as the six-deep chain's was before in-place
    writes were counted: the budgets below (5U: swap f1 and f2, the f2 one
    a Relu that can be recomputed from f1) were chosen for that."""
    return L.chain(depth=7)


def test_swaps_tunes_to_the_budget():
    index = _chain()
    context = L.context(index, budget_units=6)
    planned = swaps.stage(context, _start(context))
    assert planned.autotuned and planned.budget_bytes == 6 * L.U
    assert planned.with_lms.peak_device_bytes <= 6 * L.U
    assert planned.without_lms.peak_device_bytes == 7 * L.U
    # Fits without swapping: no plan, LMS not needed.
    roomy = L.context(index, budget_units=7)
    assert swaps.stage(roomy, _start(roomy)).plan is None


def test_swaps_leaves_a_failure_for_ordering_or_raises_without_it():
    index = crowded_graph()
    context = L.context(index, budget_units=7 * OU / L.U)
    planned = swaps.stage(context, _start(context))
    assert isinstance(planned.failure, autotune.AutotuneError)
    assert planned.plan is None
    strict = L.context(index, budget_units=7 * OU / L.U, order_peaks=False)
    with pytest.raises(autotune.AutotuneError, match="found no parameter set"):
        swaps.stage(strict, _start(strict))


def test_a_failure_no_stage_overcame_is_raised(monkeypatch):
    index = crowded_graph()
    settings = Settings(autotune_gpu_mem=7 * OU / float(1 << 30))
    assert pipeline.plan(index, settings, env=L.EXACT).needed
    # Without the ordering stage, the search's failure reaches the caller.
    monkeypatch.setattr(stages, "STAGES", tuple(
        s for s in stages.STAGES if s.run is not order.stage))
    with pytest.raises(autotune.AutotuneError, match="found no parameter set"):
        pipeline.plan(index, settings, env=L.EXACT)


# ---- order ----------------------------------------------------------------
def test_order_makes_the_step_fit_and_keeps_the_edges_without_swaps():
    # The crowded graph peaks at 9U + 8 bytes; no swap helps, but f before
    # i brings it to 5U + 8 (test_peak_ordering). The step then fits without
    # swapping only with that edge, so the plan is that edge alone (LMS must
    # not turn itself off).
    index = crowded_graph()
    context = L.context(index, budget_units=7 * OU / L.U)
    planned = _through(context, "serialize", "defer", "swaps", "order")
    ids = L.ids(index)
    assert planned.failure is None
    assert planned.ordering_edges == ((ids["f"], ids["i"]),)
    assert planned.needed and planned.plan.swaps == ()
    assert planned.plan.serialization_edges == ((ids["f"], ids["i"]),)
    assert planned.with_lms.peak_device_bytes == 5 * OU + 8
    assert planned.without_lms.peak_device_bytes == 9 * OU + 8


def test_order_does_nothing_with_fixed_parameters_or_when_turned_off():
    index = crowded_graph()
    for context in (L.context(index, swapout_threshold=1, swapin_ahead=1,
                              swapin_groupby=0),
                    L.context(index, budget_units=7 * OU / L.U,
                              order_peaks=False)):
        start = _start(context)
        assert order.stage(context, start) is start


def test_order_raises_the_last_search_failure_when_no_round_fits():
    index = crowded_graph()
    context = L.context(index, budget_units=5 * OU / L.U)
    planned = swaps.stage(context, _start(context))
    assert planned.failure is not None
    with pytest.raises(autotune.AutotuneError):
        order.stage(context, planned)


# ---- fewer_waits ----------------------------------------------------------
def test_fewer_waits_drops_the_waits_memory_does_not_need():
    index = _chain()
    context = L.context(index, budget_units=5)
    tuned = _through(context, "serialize", "defer", "swaps", "order")
    assert tuned.params.sync_mode == planner.SyncMode.SWAPOUT
    waited = [s for s in tuned.plan.swaps if s.waiters]
    assert waited and tuned.unwaited == ()
    planned = fewer_waits.stage(context, tuned)
    assert planned.unwaited == ((L.ids(index)["f1"], 0),)
    assert planned.step_time.with_lms_s < tuned.step_time.with_lms_s
    assert planned.with_lms.fits(5 * L.U)
    # By bytes moved, not step time: the waits stay.
    by_bytes = dataclasses.replace(context, judging=dataclasses.replace(
        context.judging, by_step_time=False))
    assert fewer_waits.stage(by_bytes, tuned) is tuned


def test_fewer_waits_runs_again_only_where_recomputes_replaced_swaps():
    index = _chain()
    context = L.context(index, budget_units=5, recompute=True)
    tuned = _through(context, "serialize", "defer", "swaps", "order")
    assert [s for s in tuned.plan.swaps if s.waiters]
    # No recomputes: the pass before the recompute stage had its turn.
    assert fewer_waits.after_recompute(context, tuned) is tuned
    replaced = recompute.stage(context, tuned)
    assert replaced.plan.recomputes
    again = fewer_waits.after_recompute(context, replaced)
    once = fewer_waits.stage(context, replaced)
    assert (again.plan, again.unwaited) == (once.plan, once.unwaited)
    assert replaced.step_time.exposed_transfer_s >= (
        timed.MIN_EXPOSED_SHARE * replaced.step_time.with_lms_s)
    # A step that (as predicted) waits for no copy has no wait to drop.
    step = replaced.step_time
    unwaiting = dataclasses.replace(replaced, step_time=dataclasses.replace(
        step, with_lms_s=step.without_lms_s + step.recompute_s))
    assert fewer_waits.after_recompute(context, unwaiting) is unwaiting
    # What the earlier pass freed stays listed.
    first = fewer_waits.stage(context, tuned)
    assert first.unwaited
    later = fewer_waits.stage(context, recompute.stage(context, first))
    assert later.unwaited[:len(first.unwaited)] == first.unwaited


# ---- recompute ------------------------------------------------------------
def test_recompute_replaces_a_swap_within_the_budget():
    index = _chain()
    context = L.context(index, budget_units=5, recompute=True)
    tuned = _through(context, "serialize", "defer", "swaps", "order",
                     "fewer_waits")
    planned = recompute.stage(context, tuned)
    assert len(planned.plan.recomputes) == 1
    assert len(planned.plan.swaps) == len(tuned.plan.swaps) - 1
    assert planned.with_lms.fits(5 * L.U)
    assert planned.plan.moved_bytes() < tuned.plan.moved_bytes()
    # The default (None) recomputes when auto-tuning, as True does;
    # recompute=False opts out.
    default = recompute.stage(L.context(index, budget_units=5), tuned)
    assert default.plan == planned.plan
    off = L.context(index, budget_units=5, recompute=False)
    assert recompute.stage(off, tuned) is tuned


def test_recompute_with_fixed_parameters_stays_within_the_swap_plans_peak():
    index = L.chain()
    # Swap-ins two levels ahead hold memory a recompute just before the
    # reader does not.
    context = L.context(index, swapout_threshold=3, swapin_ahead=2,
                        swapin_groupby=0, recompute=True)
    swapped = _through(context, "serialize", "defer", "swaps")
    planned = recompute.stage(context, swapped)
    model = context.model(index)
    assert planned.plan.recomputes
    assert (model.replay(planned.plan).peak_device_bytes
            <= model.replay(swapped.plan).peak_device_bytes)
    assert planned.plan.moved_bytes() < swapped.plan.moved_bytes()
    # With fixed parameters only True recomputes: the default (None)
    # applies the parameters as given.
    default = L.context(index, swapout_threshold=3, swapin_ahead=2,
                        swapin_groupby=0)
    assert recompute.stage(default, swapped) is swapped


# ---- host -----------------------------------------------------------------
def _host_units(units):
    return {"autotune_host_mem": units * L.U / float(1 << 30)}


def _tuned_on_chain(**settings):
    # Swaps only before the host stage, so that every recompute is the
    # host stage's own.
    settings.setdefault("recompute", False)
    index = _chain()
    context = L.context(index, budget_units=5, **settings)
    return context, _through(context, "serialize", "defer", "swaps",
                             "order", "fewer_waits", "recompute")


def test_host_leaves_a_plan_within_the_host_budget_and_says_device_bound(
        lms_log):
    # The tuned plan on the chain swaps f1 and f2: 2U of host memory.
    context, tuned = _tuned_on_chain(**_host_units(2))
    assert len(tuned.plan.swaps) == 2
    assert tuned.with_lms.peak_host_bytes == 2 * L.U
    assert host.stage(context, tuned) is tuned
    assert any("Device memory bounds the plan" in line for line in lms_log())


def test_host_recomputes_swapped_tensors_until_the_host_budget_fits(lms_log):
    # 1.5U of host: one of the two swaps must become a recompute (Relu
    # outputs, cheap to make again), and the plan still fits 5U of device.
    context, tuned = _tuned_on_chain(**_host_units(1.5))
    assert not tuned.plan.recomputes  # `recompute=False`: only host asks
    planned = host.stage(context, tuned)
    assert planned.failure is None
    assert len(planned.plan.swaps) == 1 and len(planned.plan.recomputes) == 1
    assert planned.with_lms.peak_host_bytes == L.U
    assert planned.with_lms.fits(5 * L.U)
    model = context.model(planned.index)
    assert model.replay(planned.plan).peak_host_bytes == L.U
    assert any("Host memory bounds the plan: 1 swapped tensors" in line
               for line in lms_log())
    # The record names the tensor recomputed for the host; a device-bound
    # plan has none.
    (rec,) = planned.plan.recomputes
    assert planned.record(records.HostBound) == records.HostBound(
        recomputed=((rec.producer, rec.output),), peak_host_bytes=L.U)
    assert tuned.record(records.HostBound) == records.HostBound()


def test_host_fails_with_what_to_change_when_no_recompute_is_enough():
    context, tuned = _tuned_on_chain(**_host_units(0.5))
    planned = host.stage(context, tuned)
    assert isinstance(planned.failure, host.HostMemoryError)
    assert planned.plan is tuned.plan  # the failure is raised, not applied
    # Its plots (the caller's to draw) show the plan that fits the device.
    shown = planned.failure.plot_data
    assert shown.with_lms is tuned.with_lms and shown.with_lms_fits
    message = str(planned.failure)
    assert "needs 0.00 GiB of host memory" in message
    assert "with 1 of its swapped tensors recomputed" in message
    assert "autotune_host_mem=0.000488281" in message
    assert "lms.autotune_host_mem = <GiB>" in message
    with pytest.raises(host.HostMemoryError):
        pipeline.plan(_chain(), context.settings, env=L.EXACT)
    # An AutotuneError: code that handles a failed search handles it.
    assert issubclass(host.HostMemoryError, autotune.AutotuneError)


def test_host_warns_when_fixed_parameters_need_more_than_the_host_budget(
        lms_log):
    index = L.chain()
    context = L.context(index, swapout_threshold=3, swapin_ahead=1,
                        swapin_groupby=0, **_host_units(0.5))
    swapped = _through(context, "serialize", "defer", "swaps")
    assert swapped.plan.swaps
    assert host.stage(context, swapped) is swapped
    warned = [line for line in lms_log() if "host memory" in line]
    assert len(warned) == 1
    assert "more than the 0.00 GiB budget (autotune_host_mem" in warned[0]
    roomy = L.context(index, swapout_threshold=3, swapin_ahead=1,
                      swapin_groupby=0, **_host_units(64))
    assert host.stage(roomy, swapped) is swapped
    assert len([line for line in lms_log() if "host memory" in line]) == 1


def test_order_reports_the_failed_search_closest_to_the_budget(monkeypatch):
    # Nothing fits 5U even ordered; of every search tried (the first and
    # each ordering round's) the error names the smallest plan of all.
    index = crowded_graph()
    context = L.context(index, budget_units=5 * OU / L.U)
    seen = []
    real = tuning.tune

    def recording(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except autotune.AutotuneError as err:
            seen.append(err.smallest_peak_bytes)
            raise

    monkeypatch.setattr(tuning, "tune", recording)
    planned = swaps.stage(context, _start(context))
    with pytest.raises(autotune.AutotuneError) as err:
        order.stage(context, planned)
    assert len(seen) >= 2 and None not in seen
    assert err.value.smallest_peak_bytes == min(seen)
    assert "needs %.3f GiB" % (min(seen) / float(1 << 30)) in str(err.value)


def test_of_two_failed_searches_the_closer_one_is_kept():
    near = autotune.AutotuneError("near", smallest_peak_bytes=10)
    far = autotune.AutotuneError("far", smallest_peak_bytes=12)
    other = autotune.AutotuneError("other")
    assert order._closest(near, far) is near
    assert order._closest(far, near) is near
    assert order._closest(other, far) is far
    assert order._closest(far, other) is far


# ---- contracts --------------------------------------------------------------
def test_the_stages_run_in_an_order_their_contracts_allow():
    contract.check_order(stages.STAGES)
    names = [s.name for s in stages.STAGES]
    # Each record type is written by exactly the stage that owns it.
    writers = {}
    for stage in stages.STAGES:
        for part in stage.writes:
            if not isinstance(part, str):
                writers.setdefault(part, set()).add(stage.name)
    assert writers[records.Deferred] == {"defer"}
    assert writers[records.Ordered] == {"order"}
    assert names.index("defer") < names.index("swaps")


def test_a_stage_moved_before_what_it_reads_is_refused():
    by_name = {s.name: s for s in stages.STAGES}
    moved = [by_name["swaps"], by_name["defer"]]
    with pytest.raises(contract.StageContractError,
                       match="'swaps' reads Deferred, which no stage before "
                       "it writes"):
        contract.check_order(moved)


def test_a_stage_that_writes_what_it_did_not_declare_is_refused():
    context = L.context(L.chain(), swapout_threshold=1, swapin_ahead=1,
                        swapin_groupby=0)
    start = _start(context)

    def records_levels(context, planned):
        return planned.with_record(records.Serialized((1,)))

    def drops_the_index(context, planned):
        return dataclasses.replace(planned, index=L.chain())

    declared = contract.Stage("s", records_levels,
                              writes=frozenset({records.Serialized}))
    assert declared(context, start).record(records.Serialized).levels == (1,)
    with pytest.raises(contract.StageContractError,
                       match="'s' changed Serialized, which its contract "
                       "does not declare"):
        contract.Stage("s", records_levels)(context, start)
    with pytest.raises(contract.StageContractError, match="changed index"):
        contract.Stage("i", drops_the_index,
                       writes=frozenset({"plan"}))(context, start)
    with pytest.raises(contract.StageContractError, match="no field"):
        contract.Stage("bad", records_levels, reads=frozenset({"plans"}))
