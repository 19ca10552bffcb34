"""pipeline.plan: the one planning function LMS.run, the CLI and the
benchmarks share; and LMS.run's RunResult."""

import time

import pytest
import tensorflow as tf

from tflms.tf import reader
from tflms import LMS, Outcome
from tflms import analysis
from tflms import autotune
from tflms import graph_index as gi
from tflms import pipeline
from tflms import planner
from tflms import simulator
from tflms import stages
from tflms import steptime
from tflms.settings import Settings
from tflms.stages import recompute as recompute_stage
from tflms.stages import records

from zoo import models

FIXED = dict(swapout_threshold=3, swapin_ahead=2, swapin_groupby=1)


def cnn(batch=8):
    graph = tf.Graph()
    with graph.as_default():
        model = models.cnn_bn(image=16, channels=8, depth=4, batch=batch,
                              seed=3)
    return graph, model


def peak_without(graph, batch):
    index = reader.build_index(graph)
    roles = pipeline.classify(index, Settings())
    return pipeline.simulate_without(index, roles, Settings(
        batch_size=batch)).peak_device_bytes


def gib_for(nbytes):
    return nbytes / autotune.mem_ratio() / float(1 << 30)


def test_plan_is_pure_and_deterministic():
    graph, _ = cnn()
    version = graph.version
    index = reader.build_index(graph)
    settings = Settings(serialization=(2, "5:7"), **FIXED)
    first = pipeline.plan(index, settings)
    second = pipeline.plan(reader.build_index(graph), settings)
    assert graph.version == version  # nothing was added to the graph
    assert first.plan == second.plan
    assert first.plan.swaps and first.plan.serialization_edges
    # The planning index holds the serialization edges its levels count.
    assert first.index.planned_edges == first.plan.serialization_edges
    assert first.original_num_levels == index.num_levels
    assert first.index.num_levels > index.num_levels
    assert first.record(records.Serialized).levels == (2, 5, 6)
    assert not first.autotuned and first.tune is None
    assert first.without_lms is None  # not asked to simulate


def test_simulations_replay_the_planning_index():
    graph, _ = cnn()
    settings = Settings(serialization=("3:6",), batch_size=8, **FIXED)
    given = reader.build_index(graph)
    planned = pipeline.plan(given, settings, simulate=True)
    # The plan is replayed on the planning index (serialized), the step
    # without LMS on the index as given: serialization is LMS's own edit.
    assert planned.context.given_index is given
    assert planned.index.num_levels > given.num_levels
    assert planned.without_lms.num_levels == given.num_levels
    assert planned.with_lms.num_levels == planned.index.num_levels
    roles = planned.context.roles
    assert (planned.without_lms.peak_device_bytes
            == simulator.SimulationModel(given, roles, 8).replay(
                None).peak_device_bytes)
    model = simulator.SimulationModel(planned.index, roles, 8)
    assert (model.replay(planned.plan).peak_device_bytes
            == planned.with_lms.peak_device_bytes)
    assert (planned.with_lms.peak_device_bytes
            < planned.without_lms.peak_device_bytes)


def test_run_applies_the_plan_the_tuner_replayed():
    """The plan LMS.run applies is the one whose replay the tuner judged,
    not a plan made again from the chosen parameters."""
    graph, _ = cnn()
    budget = gib_for(0.7 * peak_without(graph, 8))
    twin, _ = cnn()
    planned = pipeline.plan(reader.build_index(twin), Settings(
        batch_size=8, autotune_gpu_mem=budget))
    assert planned.autotuned and planned.needed
    assert planned.plan is planned.tune.plan
    assert planned.with_lms is planned.tune.with_lms
    assert planned.with_lms.peak_device_bytes <= planned.budget_bytes

    lms = LMS()
    lms.batch_size = 8
    lms.autotune_gpu_mem = budget
    result = lms.run(graph)
    assert result.outcome is Outcome.REWRITTEN and result.rewritten
    assert result is lms.last_run
    assert result.plan == planned.plan  # same graph, same settings
    assert len(result.swapout_ops) == len(planned.plan.swaps)
    assert len(result.swapin_ops) == planned.plan.num_swap_ins


def test_not_needed_carries_the_simulation_that_decided_it():
    graph, _ = cnn()
    lms = LMS()
    lms.batch_size = 8
    lms.autotune_gpu_mem = gib_for(2 * peak_without(graph, 8))
    version = graph.version
    result = lms.run(graph)
    assert result.outcome is Outcome.NOT_NEEDED and not result.rewritten
    assert result.plan is None and result.swapout_ops == ()
    assert result.planned.without_lms.fits(result.planned.budget_bytes)
    assert graph.version == version


def test_already_rewritten_plans_nothing():
    graph, _ = cnn()
    assert LMS(**FIXED).run(graph).rewritten
    again = LMS(**FIXED).run(graph)
    assert again.outcome is Outcome.ALREADY_REWRITTEN
    assert again.planned is None and again.plan is None


def test_classify_names_a_device_that_matches_nothing():
    graph, _ = cnn()
    index = reader.build_index(graph)
    with pytest.raises(ValueError, match=r"gpu_device='/device:GPU:3' "
                       r"matches no operation in the graph"):
        pipeline.classify(index, Settings(gpu_device="/device:GPU:3"))


@pytest.mark.parametrize("enabled", [True, False])
def test_run_pauses_the_garbage_collector_and_restores_it(enabled,
                                                          monkeypatch):
    """LMS.run plans with Python's cyclic collector off (see tflms._gc) and
    leaves it as it found it, also when planning raises."""
    import gc
    seen = []
    real_plan = pipeline.plan

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(pipeline, "plan", spy)
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        graph, _ = cnn()
        assert LMS(**FIXED).run(graph).rewritten
        assert gc.isenabled() is enabled
        graph, _ = cnn()
        with pytest.raises(ValueError, match="gpu_device"):
            LMS(gpu_device="/device:GPU:7", **FIXED).run(graph)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False]


def test_the_tuned_plan_is_judged_with_its_copies_timed():
    """`with_lms` is the replay with the copies' duration on the settings'
    gpu and interconnect, and it fits; with 'instant' it is the replay
    without."""
    graph, _ = cnn()
    budget = gib_for(0.7 * peak_without(graph, 8))
    index = reader.build_index(graph)
    for link in ("pcie3", "instant"):
        planned = pipeline.plan(index, Settings(
            batch_size=8, autotune_gpu_mem=budget, interconnect=link))
        roles = planned.context.roles
        memory = simulator.SimulationModel(planned.index, roles, 8)
        if link == "instant":
            expected = memory.replay(planned.plan)
        else:
            expected, _ = steptime.replay_in_time(
                memory, steptime.StepTimeModel(
                    planned.index, roles, 8, interconnect=link),
                planned.plan)
        assert planned.with_lms.peak_device_bytes == \
            expected.peak_device_bytes <= planned.budget_bytes
        assert planned.with_lms.device_timeline.tolist() == \
            expected.device_timeline.tolist()
        # The count beside the oracle's instant replay: copies instant.
        instant = pipeline.instant_replay(planned)
        assert instant.device_timeline.tolist() == \
            memory.replay(planned.plan).device_timeline.tolist()
        assert instant.peak_device_bytes <= planned.with_lms.peak_device_bytes


def test_instant_replay_of_a_fixed_plan_is_its_simulated_peak():
    """A fixed-parameter plan's `with_lms` (from `simulate_plan`) already
    counts copies as instant: `instant_replay` gives that result, equal to
    a replay of the plan."""
    graph, _ = cnn()
    index = reader.build_index(graph)
    planned = pipeline.simulate_plan(pipeline.plan(index, Settings(
        batch_size=8, sync_mode=0, **FIXED)))
    memory = simulator.SimulationModel(planned.index, planned.context.roles,
                                       8)
    replayed = memory.replay(planned.plan).device_timeline.tolist()
    assert planned.with_lms.device_timeline.tolist() == replayed
    assert pipeline.instant_replay(planned).device_timeline.tolist() == \
        replayed


def test_replays_after_planning_reuse_the_planning_contexts_model(
        monkeypatch):
    """`simulate_plan` and `instant_replay` replay with the simulation
    model the planning context made, not a new one per call (each is a
    pass over the whole graph)."""
    graph, _ = cnn()
    index = reader.build_index(graph)
    made = []
    real_init = simulator.SimulationModel.__init__

    def counting_init(self, *args, **kwargs):
        made.append(args[0])
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(simulator.SimulationModel, "__init__", counting_init)
    planned = pipeline.plan(index, Settings(batch_size=8, sync_mode=0,
                                            **FIXED), simulate=False)
    assert planned.with_lms is None
    before = len(made)
    planned = pipeline.simulate_plan(planned)
    pipeline.instant_replay(planned)
    # At most the model of the given index is new (planning made the
    # planning index's), and it is made once.
    new = made[before:]
    given = planned.context.given_index
    assert all(i is given for i in new) and len(new) <= 1
    assert planned.with_lms is not None


def test_tuned_plan_carries_its_predicted_step_time_at_the_settings_hardware():
    graph, _ = cnn()
    budget = gib_for(0.7 * peak_without(graph, 8))
    index = reader.build_index(graph)
    for gpu, link in (("V100-SXM2-16GB", "pcie4"),
                      ("A100-SXM4-40GB", "nvlink2")):
        planned = pipeline.plan(index, Settings(
            batch_size=8, autotune_gpu_mem=budget, gpu=gpu,
            interconnect=link))
        step = planned.step_time
        assert planned.tune.step_time is step and planned.tune.timed_plans
        assert (step.gpu, step.interconnect) == (gpu, link)
        again = steptime.predict_planned(planned, gpu=gpu, interconnect=link)
        assert step.with_lms_s == again.with_lms_s
        assert step.exposed_transfer_s == again.exposed_transfer_s
    # Chosen by bytes (as before the step-time model), nothing is timed.
    by_bytes = pipeline.plan(index, Settings(
        batch_size=8, autotune_gpu_mem=budget), by_step_time=False)
    assert by_bytes.step_time is None and by_bytes.tune.timed_plans == 0


def test_recompute_cost_is_the_predicted_step_then_the_bytes_moved():
    graph, _ = cnn()
    budget = gib_for(0.7 * peak_without(graph, 8))
    planned = pipeline.plan(reader.build_index(graph), Settings(
        batch_size=8, autotune_gpu_mem=budget))
    plan = planned.plan
    assert pipeline.recompute_cost(plan) == plan.moved_bytes()
    timer = steptime.StepTimeModel(planned.index, planned.context.roles, 8)
    assert pipeline.recompute_cost(plan, timer, planned.with_lms) == (
        planned.step_time.with_lms_s, plan.moved_bytes())
    with pytest.raises(ValueError, match=r"recompute_cost needs the plan's "
                                         r"replay \(result=\)"):
        pipeline.recompute_cost(plan, timer)


def test_bad_gpu_or_interconnect_names_the_known_ones():
    with pytest.raises(ValueError, match=r"gpu must be one of V100-SXM2-16GB"
                                         r", .*; got 'V100'"):
        Settings(gpu="V100")
    with pytest.raises(ValueError, match=r"interconnect must be one of "
                                         r"pcie3, pcie4, pcie5, nvlink2, "
                                         r"nvlink-c2c, or 'instant' .*; got "
                                         r"'pcie'"):
        Settings(interconnect="pcie")


def test_a_recompute_is_not_timed_when_the_compute_alone_is_slower():
    # x -> a (Relu) -> b -> c -> d(a, c): every op 2000 bytes touched, 2 s
    # at 1000 bytes/s; the step is 6 s of compute (a, b, c) + 3 s (d).
    # Recomputing a adds its 2 s clone: at least 11 s, so never faster
    # than a plan taking 9 s; against 11 s (a tie, which fewer bytes moved
    # may break) or 12 s it is replayed and timed.
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [1000]}),
         ("a", "Relu", {"outputs": [1000]}),
         ("b", "Relu", {"outputs": [1000]}),
         ("c", "Relu", {"outputs": [1000]}),
         ("d", "AddV2", {"outputs": [1000]})],
        edges=[("x", "a"), ("a", "b"), ("b", "c"), ("a", "d"), ("c", "d")])
    roles = analysis.classify_ops(index)
    gpu = steptime.Gpu("round", 1000.0, 1000.0, 1000.0, 1000.0, 1 << 20,
                       "a round test device")
    timer = steptime.StepTimeModel(index, roles, gpu=gpu,
                                   kernels=steptime.KernelOptions(
                                       launch_overhead_s=0.0))
    i = index.id_of
    rec = planner.RecomputePlan(
        producer=i["a"], output=0, nbytes=1000, ops=(i["a"],),
        inputs=((("tensor", i["x"], 0),),), consumers=((i["d"], 1),),
        trigger=i["c"])
    candidate = planner.Plan(params=planner.SwapParams(1, 1, 0, 0),
                             swaps=(), serialization_edges=(),
                             num_levels=index.num_levels, recomputes=(rec,))
    compute_s = 9.0
    assert timer.op_seconds.tolist() == [0, 2, 2, 2, 3]
    assert recompute_stage.slower_than(candidate, 9.0, timer, compute_s)
    assert not recompute_stage.slower_than(candidate, 11.0, timer, compute_s)
    assert not recompute_stage.slower_than(candidate, 12.0, timer, compute_s)


def test_plan_records_the_cpu_seconds_of_each_stage():
    graph, _ = cnn()
    index = reader.build_index(graph)
    began = time.process_time()
    planned = pipeline.plan(index, Settings(**FIXED))
    spent = time.process_time() - began
    names = [name for name, _ in planned.stage_seconds]
    assert names == ["context", "serialize", "reduce_first", "defer",
                     "swaps", "order", "fewer_waits", "recompute",
                     "fewer_waits.after_recompute", "prefetch", "host"]
    assert names[1:] == [s.name for s in stages.STAGES]
    seconds = [s for _, s in planned.stage_seconds]
    assert all(s >= 0.0 for s in seconds)
    assert 0.0 < sum(seconds) <= spent


def test_a_failed_search_carries_the_stage_seconds_until_it_gave_up():
    graph, _ = cnn()
    index = reader.build_index(graph)
    # A budget far below the step's resident bytes: nothing fits.
    settings = Settings(autotune_gpu_mem=1e-6, batch_size=8)
    with pytest.raises(autotune.AutotuneError) as info:
        pipeline.plan(index, settings, env={})
    names = [name for name, _ in info.value.stage_seconds]
    assert names[0] == "context" and "swaps" in names
    assert all(s >= 0.0 for _, s in info.value.stage_seconds)
