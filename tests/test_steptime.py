"""The step-time model on literal graphs whose timing is worked out by hand.

Hardware with round numbers keeps every time exact: memory at 1000 bytes/s
and 1000 FLOP/s, so an op reading one 1000-byte tensor and writing another
takes 2 s; a link of 1000 bytes/s (or 250) moves a 1000-byte tensor in 1 s
(or 4 s); no launch overhead unless a test sets one. These models run at the
peak rates (`steptime.PEAK`) without fusion unless a test says otherwise.
"""

import dataclasses

import numpy as np
import pytest

from tflms.tf import reader as tf_reader
from tflms import analysis
from tflms import graph_index as gi
from tflms import planner
from tflms import simulator
from tflms import steptime

SLOW_GPU = steptime.Gpu("test-gpu", fp32_flops=1000.0, tensor_flops=1000.0,
                        half_flops=4000.0, memory_bandwidth=1000.0,
                        memory_bytes=1 << 20, source="a round test device")


# Kernels at the datasheet's rates with no launch overhead and no fusion:
# op times are closed-form numbers.
EXACT = steptime.KernelOptions(launch_overhead_s=0.0, efficiency=steptime.PEAK,
                               fusion=False)


def link(bytes_per_s, d2h=None):
    return steptime.Interconnect("test-link", "test link", bytes_per_s,
                                 "a round test link", d2h_bytes_per_s=d2h)


def model(index, bytes_per_s=1000.0, overhead=0.0, batch_size=None,
          **kwargs):
    kwargs.setdefault("efficiency", steptime.PEAK)
    kwargs.setdefault("fusion", False)
    return steptime.StepTimeModel(
        index, analysis.classify_ops(index), batch_size, gpu=SLOW_GPU,
        interconnect=link(bytes_per_s),
        kernels=steptime.KernelOptions(launch_overhead_s=overhead, **kwargs))


def chain(extra_reader_of_a=False):
    """x -> a -> b -> c -> e -> d(a, e), 1000 bytes per tensor.

    Levels x 0, a 1, b 2, c 3, e 4, d 5. Op times: a, b, c, e 2 s (one
    tensor in, one out); d 3 s (two in, one out). With
    `extra_reader_of_a`, b also reads a (3 s)."""
    edges = [("x", "a"), ("a", "b"), ("b", "c"), ("c", "e"), ("a", "d"),
             ("e", "d")]
    if extra_reader_of_a:
        edges.append(("a", "b"))
    return gi.from_edges(
        [("x", "Placeholder", {"outputs": [1000]}),
         ("a", "Relu", {"outputs": [1000]}),
         ("b", "AddV2" if extra_reader_of_a else "Relu",
          {"outputs": [1000]}),
         ("c", "Relu", {"outputs": [1000]}),
         ("e", "Relu", {"outputs": [1000]}),
         ("d", "AddV2", {"outputs": [1000]})],
        edges=edges)


def plan_of(index, swaps, sync_mode=0):
    return planner.Plan(params=planner.SwapParams(1, 1, 0, sync_mode),
                        swaps=tuple(swaps), serialization_edges=(),
                        num_levels=index.num_levels)


def swap(index, tensor, readers, triggers, waiters=(), sync=False):
    i = index.id_of
    return planner.SwapPlan(
        producer=i[tensor], output=0, nbytes=1000,
        swap_ins=(planner.SwapInPlan(
            consumers=tuple((i[r], slot) for r, slot in readers),
            triggers=tuple(i[t] for t in triggers), synchronous=sync),),
        waiters=tuple(i[w] for w in waiters))


def test_compute_only_chain_is_the_sum_of_rooflines():
    index = chain()
    step = model(index).predict()
    assert model(index).op_seconds.tolist() == [0, 2, 2, 2, 2, 3]
    assert step.without_lms_s == step.with_lms_s == step.compute_s == 11
    assert step.exposed_transfer_s == 0
    assert step.level_start_s.tolist() == [0, 0, 2, 4, 6, 8]
    assert step.op_end_s.tolist() == [0, 2, 4, 6, 8, 11]
    assert step.swapout_bytes == step.swapin_bytes == 0 and step.swaps == ()


def test_flops_bound_ops_and_launch_overhead():
    # m: 1000 B in and out (2 s of memory) but 6000 FLOPs (6 s): compute
    # bound; h: 2-byte outputs use the half-precision peak, 12000 / 4000 =
    # 3 s (12 s at the float32 peak).
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [1000]}),
         ("m", "MatMul", {"outputs": [1000], "flops": 6000}),
         ("h", "MatMul", {"outputs": [((1, 500), 2)], "flops": 12000}),
         ("per_example", "MatMul", {"outputs": [((None, 250), 4)],
                                    "flops": (1000, 500)}),
         ("v", "Identity", {"outputs": [1000]})],
        edges=[("x", "m"), ("m", "h"), ("h", "per_example"),
               ("per_example", "v")])
    times = model(index, overhead=0.25, batch_size=2).op_seconds.tolist()
    # per_example: 1000 + 500 * 2 FLOPs = 2 s; reads 1000 B and writes
    # 2 x 250 x 4 = 2000 B: 3 s of memory. v forwards its input: no kernel.
    assert times == [0, 6.25, 3.25, 3.25, 0]


def test_a_hidden_swap_costs_nothing():
    # a's swap-out runs 2-3 s beside b; its swap-in, triggered by b (done at
    # 4 s), runs 4-5 s, long before d starts at 8 s.
    index = chain()
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["b"])])
    levels = simulator.SimulationModel(
        index, analysis.classify_ops(index)).replay(plan)
    step = model(index).predict(plan, levels.levels, levels.num_levels)
    assert step.with_lms_s == step.without_lms_s == 11
    assert step.exposed_transfer_s == 0
    assert step.swapout_bytes == step.swapin_bytes == 1000
    assert step.swapout_busy_s == step.swapin_busy_s == 1
    (timing,) = step.swaps
    assert (timing.out_start_s, timing.out_end_s) == (2, 3)
    # Level 3 (c) is the first to start after the copy to the host ends.
    assert timing.out_done_level == 3
    (sin,) = timing.swap_ins
    assert (sin.ready_s, sin.start_s, sin.end_s) == (4, 4, 5)
    assert sin.start_level == 3
    # d, its reader, could start at 8 s: needed then, there since 5 s.
    assert sin.needed_s == 8


def test_a_swap_in_triggered_just_before_its_reader_is_fully_exposed():
    # Triggered by e (d's other input, as sync_mode 2 plans it): the copy
    # runs 8-9 s and d waits for all of it.
    index = chain()
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["e"], sync=True)],
                   sync_mode=2)
    step = model(index).predict(plan)
    assert step.with_lms_s == 12
    assert step.exposed_transfer_s == 1
    assert step.op_start_s[index.id_of["d"]] == 9
    assert step.swaps[0].swap_ins[0].start_s == 8
    # Needed when e ended, a second before the copy did.
    assert step.swaps[0].swap_ins[0].needed_s == 8


def test_sync_mode_2_from_the_planner_waits_for_the_whole_copy():
    index = chain()
    roles = analysis.classify_ops(index)
    plan = planner.make_plan(index, roles, planner.SwapParams(2, 1, 0, 2))
    assert [(s.producer, s.swap_ins[0].triggers, s.swap_ins[0].synchronous)
            for s in plan.swaps] == [(index.id_of["a"],
                                      (index.id_of["e"],), True)]
    # 1 s of copy at 1000 B/s, exposed; 4 s at 250 B/s.
    assert model(index).predict(plan).exposed_transfer_s == 1
    assert model(index, 250.0).predict(plan).exposed_transfer_s == 4


def test_a_planned_step_from_the_pipeline():
    from tflms import pipeline
    from tflms.settings import Settings
    settings = Settings(swapout_threshold=2, swapin_ahead=1,
                        swapin_groupby=0, sync_mode=2)
    planned = pipeline.plan(chain(), settings)
    with pytest.raises(ValueError, match=r"^the plan has not been "
                       r"simulated, and its levels are needed; pass "
                       r"pipeline.simulate_plan\(planned\)$"):
        steptime.predict_planned(planned)
    step = steptime.predict_planned(
        pipeline.simulate_plan(planned), gpu=SLOW_GPU,
        interconnect=link(1000.0), kernels=EXACT)
    assert (step.without_lms_s, step.with_lms_s) == (11, 12)


def test_two_swap_ins_queue_on_one_link():
    # d reads a, b and e (3000 B in, 1000 out: 4 s); without LMS 12 s.
    # At 250 B/s a copy takes 4 s. Out: a 2-6 s; b, made at 4 s, waits for
    # the link: 6-10 s. In, both triggered by e (done at 8 s): a is ready
    # at 8 s and copies 8-12 s; b is ready at 10 s (its swap-out) but the
    # link is busy until 12 s: 12-16 s. d starts at 16 s and ends at 20 s.
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [1000]}),
         ("a", "Relu", {"outputs": [1000]}),
         ("b", "Relu", {"outputs": [1000]}),
         ("c", "Relu", {"outputs": [1000]}),
         ("e", "Relu", {"outputs": [1000]}),
         ("d", "AddN", {"outputs": [1000]})],
        edges=[("x", "a"), ("a", "b"), ("b", "c"), ("c", "e"), ("a", "d"),
               ("b", "d"), ("e", "d")])
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["e"]),
                           swap(index, "b", [("d", 1)], ["e"])])
    step = model(index, 250.0).predict(plan)
    assert step.without_lms_s == 12
    a, b = step.swaps
    assert (a.out_start_s, a.out_end_s, b.out_start_s, b.out_end_s) == (
        2, 6, 6, 10)
    assert [(s.ready_s, s.start_s, s.end_s) for s in
            a.swap_ins + b.swap_ins] == [(8, 8, 12), (10, 12, 16)]
    assert step.op_start_s[index.id_of["d"]] == 16
    assert [s.needed_s for s in a.swap_ins + b.swap_ins] == [8, 8]
    assert step.with_lms_s == 20
    assert step.exposed_transfer_s == 8
    assert step.swapout_busy_s == step.swapin_busy_s == 8


def test_sync_mode_1_waiters_wait_for_the_swap_out():
    # b reads a too (3 s) and waits for a's swap-out (2-3 s): b 3-6 s, c
    # 6-8, e 8-10; the swap-in (triggered by b) is long done; d 10-13 s.
    index = chain(extra_reader_of_a=True)
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["b"],
                                waiters=["b"])], sync_mode=1)
    step = model(index).predict(plan)
    assert step.without_lms_s == 12
    assert step.op_start_s[index.id_of["b"]] == 3
    assert step.with_lms_s == 13
    assert step.exposed_transfer_s == 1


def test_sync_mode_3_waits_both_ways():
    # As above, and the swap-in is triggered by e (10 s): 10-11 s; d
    # 11-14 s.
    index = chain(extra_reader_of_a=True)
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["e"],
                                waiters=["b"], sync=True)], sync_mode=3)
    step = model(index).predict(plan)
    assert step.op_start_s[index.id_of["d"]] == 11
    assert step.with_lms_s == 14
    assert step.exposed_transfer_s == 2


def test_a_copy_still_running_when_compute_ends_extends_the_step():
    # The swap-in of a for d is triggered by b at 4 s; at 100 B/s the
    # swap-out alone runs 2-12 s, the swap-in 12-22 s, so d waits until
    # 22 s: 22-25 s.
    index = chain()
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["b"])])
    step = model(index, 100.0).predict(plan)
    assert step.with_lms_s == 25
    assert step.exposed_transfer_s == 14


def test_levels_that_are_not_the_plans_are_refused():
    index = chain()
    plan = plan_of(index, [swap(index, "a", [("b", 0)], ["e"])])
    with pytest.raises(ValueError, match=r"^levels put a reader of the "
                       r"swap-in of a:0 before its triggers or its "
                       r"swap-out; pass the levels of the plan's replay"):
        model(index).predict(plan)


def test_levels_of_another_graph_are_refused():
    step_model = model(chain())
    with pytest.raises(ValueError, match=r"^levels must give one level per "
                       r"op of the index \(6\); got 2$"):
        step_model.predict(None, levels=[0, 1])
    with pytest.raises(ValueError, match=r"^num_levels must be at least one "
                       r"past the highest op level \(6\); got 5; pass the "
                       r"replay's num_levels with its levels$"):
        step_model.predict(None, num_levels=5)


def test_named_hardware_and_bad_names():
    gpu = steptime.gpu_named("A100-SXM4-40GB")
    assert (gpu.tensor_flops, gpu.memory_bandwidth) == (156e12, 1555e9)
    assert steptime.gpu_named("V100-SXM2-16GB").tensor_flops == 15.7e12
    assert steptime.interconnect_named("pcie4").bytes_per_s == 31.5e9
    assert [gbps for _, gbps in steptime.LINKS] == [15.75, 31.5, 63.0, 75.0,
                                                    450.0]
    with pytest.raises(ValueError, match=r"^gpu 'P100' is not known; use "
                       r"one of V100-SXM2-16GB, V100-SXM2-32GB, "
                       r"A100-SXM4-40GB, A100-SXM4-80GB, H100-SXM5-80GB, "
                       r"H100-PCIe-80GB$"):
        steptime.gpu_named("P100")
    with pytest.raises(ValueError, match=r"^interconnect 'pcie6' is not "
                       r"known; use one of pcie3, pcie4, pcie5, nvlink2, "
                       r"nvlink-c2c, or 'instant' for copies that take no "
                       r"time$"):
        steptime.interconnect_named("pcie6")
    with pytest.raises(ValueError, match=r"^launch_overhead_s must be >= 0 "
                       r"seconds; got -1"):
        model(chain(), overhead=-1)


def test_level_starts_fill_levels_without_timed_ops():
    index = chain()
    step = model(index).predict(None, num_levels=8)
    assert np.array_equal(step.level_start_s, [0, 0, 2, 4, 6, 8, 11, 11])


def test_a_hidden_plan_exposes_exactly_nothing_with_inexact_times():
    # Op times in thirds of a second do not add up exactly in floating
    # point; the step without LMS is summed in the plan's order, so a plan
    # whose copies all hide still shows exactly 0.
    index = chain()
    gpu = steptime.Gpu("thirds", 1.0, 1.0, 1.0, 3000.0, 1, "test")
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["b"])])
    step = steptime.StepTimeModel(
        index, analysis.classify_ops(index), gpu=gpu,
        interconnect=link(1e6),
        kernels=dataclasses.replace(EXACT, launch_overhead_s=0.1),
    ).predict(plan)
    assert step.exposed_transfer_s == 0.0
    assert step.with_lms_s == step.without_lms_s


def test_an_update_reads_and_writes_the_variables_behind_its_handles():
    """Adam's update op takes handles (0 bytes) to the variable and its two
    slots, and reads and writes each of them: 6 times the gradient's bytes
    beyond its tensors; an assignment that adds reads and writes its
    variable (twice its value), a plain one writes it (once)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [8, 64], name="x")
        w = v1.get_variable("w", [64, 32], use_resource=True)
        acc = v1.get_variable("acc", [64, 32], use_resource=True)
        loss = tf.reduce_sum(tf.matmul(x, w))
        grad, = v1.gradients(loss, [w])
        updates = [acc.assign_add(grad, read_value=False),
                   acc.assign(grad, read_value=False)]
        train = tf.group(v1.train.AdamOptimizer(1e-3).apply_gradients(
            [(grad, w)]), *updates, name="train")
        v1.add_to_collection(v1.GraphKeys.TRAIN_OP, train)
    index = tf_reader.build_index(graph)
    model = steptime.StepTimeModel(index, analysis.classify_ops(index))
    gbytes = 64 * 32 * 4
    apply = next(i for i in range(index.num_ops)
                 if index.types[i] == "ResourceApplyAdam")
    inputs = sum(gi.tensor_bytes(index, p, k) or 0
                 for p, k in index.inputs[apply])
    assert model.state_bytes(apply) == 6 * gbytes
    assert model.bytes_touched(apply) == inputs + 6 * gbytes
    add, put = (index.id_of[op.name] for op in updates)
    assert index.types[add] == "AssignAddVariableOp"
    assert model.state_bytes(add) == 2 * gbytes
    assert model.state_bytes(put) == gbytes
    matmul = next(i for i in range(index.num_ops)
                  if index.types[i] == "MatMul")
    assert model.state_bytes(matmul) == 0


def test_a_convolution_of_a_tensorflow_graph_at_its_roofline():
    """On a real graph: the convolution's time is its FLOPs at the peak or
    its bytes at the bandwidth, whichever is larger, plus the overhead;
    the reshape forwards its buffer and costs nothing."""
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 16, 16, 8], name="x")
        w = tf.compat.v1.get_variable("w", [3, 3, 8, 32])
        y = tf.nn.conv2d(x, w, 1, "SAME", name="conv")
        tf.reshape(y, [-1, 16 * 16 * 32], name="flat")
    index = tf_reader.build_index(graph)
    roles = analysis.classify_ops(index)
    batch = 4
    flops = 2 * batch * 16 * 16 * 32 * 3 * 3 * 8
    nbytes = 4 * (batch * 16 * 16 * 8 + 3 * 3 * 8 * 32 + batch * 16 * 16 * 32)
    fitted = steptime.ACHIEVED
    for gpu, precision in (("V100-SXM2-16GB", "fp32"),
                           ("A100-SXM4-80GB", "tf32")):
        model = steptime.StepTimeModel(index, roles, batch, gpu=gpu)
        spec = steptime.GPUS[gpu]
        conv = index.id_of["conv"]
        assert gi.op_flops(index, conv, batch) == flops
        assert model.bytes_touched(conv) == nbytes
        assert model.precision(conv) == precision
        assert model.op_seconds[conv] == max(
            flops / (spec.tensor_flops * fitted.of(precision, True)),
            nbytes / (spec.memory_bandwidth * fitted.memory)) \
            + steptime.LAUNCH_OVERHEAD_S
        assert model.op_seconds[index.id_of["flat"]] == 0
        assert model.predict().without_lms_s == model.op_seconds[conv]


def test_copy_levels_of_a_step():
    # a's swap-out ends at 3 s, after level 2 (b) started at 2 s and before
    # level 3 (c) at 4 s: held through level 2. Its swap-in starts at 4 s,
    # when level 3 starts.
    index = chain()
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["b"])])
    memory = simulator.SimulationModel(index, analysis.classify_ops(index))
    replayed = memory.replay(plan)
    step = model(index).predict(plan, replayed.levels, replayed.num_levels)
    assert steptime.copy_levels(step) == simulator.CopyLevels(
        held_through=(2,), allocated_from=((3,),))
    # At 250 bytes/s the swap-out runs 2-6 s: level 3 (c, from 4 s) starts
    # before it ends, level 4 (e, 6 s) does not; the swap-in waits for it
    # and starts at 6 s, in level 4.
    step = model(index, bytes_per_s=250.0).predict(
        plan, replayed.levels, replayed.num_levels)
    assert steptime.copy_levels(step) == simulator.CopyLevels(
        held_through=(3,), allocated_from=((4,),))


@pytest.mark.parametrize("bytes_per_s, timeline", [
    # 1000 bytes/s, or 10^12: every copy ends within the level the
    # simulator already gives it; exactly the replay with instant copies.
    # Each Relu is its input's last reader but b (a is read again by d)
    # and writes into it: a into x's buffer, c and e into b's; d writes
    # into the swap-in's copy of a. Level 1 holds x (= a), level 2 x and
    # b, levels 3-5 b (= c = e) and the swap-in's copy (= d).
    (1000.0, (1, 1, 2, 2, 2, 2)),
    (1e12, (1, 1, 2, 2, 2, 2)),
    # 250 bytes/s: a (1000 B, in x's buffer) is still being copied during
    # level 3, on top of b (= c) and the swap-in's copy: 1000 bytes more at
    # the peak.
    (250.0, (1, 1, 2, 3, 2, 2)),
])
def test_replay_in_time_counts_the_copy_to_the_host(bytes_per_s, timeline):
    index = chain()
    roles = analysis.classify_ops(index)
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["b"])])
    memory = simulator.SimulationModel(index, roles)
    instant = memory.replay(plan)
    assert instant.device_timeline.tolist() == [1000, 1000, 2000, 2000,
                                                2000, 2000]
    result, step = steptime.replay_in_time(memory, model(index, bytes_per_s),
                                           plan)
    assert result.device_timeline.tolist() == [1000 * k for k in timeline]
    assert result.peak_device_bytes == 1000 * max(timeline)
    assert result.levels.tolist() == instant.levels.tolist()
    assert step.swaps[0].nbytes == 1000
    if bytes_per_s == 250.0:
        assert result.peak_level == 3
        assert ("x:0", 1000) in result.live_at_peak  # a is written in x


def test_instant_is_a_link_of_infinite_speed():
    assert steptime.interconnect_named("instant") is steptime.INSTANT
    index = chain()
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["b"])])
    step = steptime.StepTimeModel(
        index, analysis.classify_ops(index), gpu=SLOW_GPU,
        interconnect="instant", kernels=EXACT).predict(plan)
    assert step.exposed_transfer_s == 0
    assert step.swapout_busy_s == step.swapin_busy_s == 0
    assert (step.swaps[0].out_start_s, step.swaps[0].out_end_s) == (2, 2)


def test_recompute_clones_run_before_their_first_late_reader():
    # a is made again from x just before d: its clone takes a's 2 s on the
    # compute stream (a plan of recomputes moves nothing).
    index = chain()
    i = index.id_of
    rec = planner.RecomputePlan(
        producer=i["a"], output=0, nbytes=1000, ops=(i["a"],),
        inputs=((("tensor", i["x"], 0),),), consumers=((i["d"], 0),),
        trigger=i["e"])
    plan = dataclasses.replace(plan_of(index, ()), recomputes=(rec,))
    step = model(index).predict(plan)
    assert step.without_lms_s == 11 and step.with_lms_s == 13
    assert step.recompute_s == 2 and step.exposed_transfer_s == 0
    assert step.op_start_s[i["d"]] == 10 and step.op_end_s[i["d"]] == 13
    assert step.swapout_bytes == step.swapin_bytes == 0


def test_a_swap_in_clones_read_is_needed_when_the_clones_would_start():
    # b is made again from a's swap-in just before d, which reads a's
    # swap-in and b's clone. a 0-2 s, b 2-4, c 4-6, e 6-8, g 8-10. At 250
    # B/s a's swap-out runs 2-6 s and its swap-in, triggered by g, 10-14 s:
    # the clone, which would have started at 10 s, runs 14-16 s and d
    # (4 s: three inputs, one output) 16-20 s.
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [1000]}),
         ("a", "Relu", {"outputs": [1000]}),
         ("b", "Relu", {"outputs": [1000]}),
         ("c", "Relu", {"outputs": [1000]}),
         ("e", "Relu", {"outputs": [1000]}),
         ("g", "Relu", {"outputs": [1000]}),
         ("d", "AddN", {"outputs": [1000]})],
        edges=[("x", "a"), ("a", "b"), ("b", "c"), ("c", "e"), ("e", "g"),
               ("a", "d"), ("b", "d"), ("g", "d")])
    i = index.id_of
    rec = planner.RecomputePlan(
        producer=i["b"], output=0, nbytes=1000, ops=(i["b"],),
        inputs=((("swapin", i["a"], 0, 0),),), consumers=((i["d"], 1),),
        trigger=i["g"])
    plan = dataclasses.replace(
        plan_of(index, [swap(index, "a", [("d", 0)], ["g"])]),
        recomputes=(rec,))
    step = model(index, 250.0).predict(plan)
    (sin,) = step.swaps[0].swap_ins
    assert (sin.start_s, sin.end_s, sin.needed_s) == (10, 14, 10)
    assert step.op_start_s[i["d"]] == 16 and step.with_lms_s == 20


def test_a_clone_another_recompute_reads_runs_before_that_ones():
    # b's recompute (for c) reads the clone of a that a's recompute (for d)
    # makes: that clone runs before c, with b's after it, not before d.
    # a 0-2 s, b 2-4, a's clone 4-6, b's 6-8, c 8-10, e 10-12, d 12-15.
    index = chain()
    i = index.id_of
    rec_a = planner.RecomputePlan(
        producer=i["a"], output=0, nbytes=1000, ops=(i["a"],),
        inputs=((("tensor", i["x"], 0),),), consumers=((i["d"], 0),),
        trigger=i["e"])
    rec_b = planner.RecomputePlan(
        producer=i["b"], output=0, nbytes=1000, ops=(i["b"],),
        inputs=((("recompute", i["a"], 0, 0, 0),),),
        consumers=((i["c"], 0),), trigger=i["b"])
    plan = dataclasses.replace(plan_of(index, ()), recomputes=(rec_a, rec_b))
    step = model(index).predict(plan)
    assert step.recompute_s == 4 and step.with_lms_s == 15
    assert step.op_start_s[i["c"]] == 8 and step.op_start_s[i["d"]] == 12


def test_swap_outs_go_at_the_device_to_host_rate():
    # As in test_a_hidden_swap_costs_nothing, but copies to the host at
    # 250 B/s: a's swap-out runs 2-6 s. Its swap-in (triggered by b at 4 s)
    # waits for it and runs 6-7 s at 1000 B/s host to device; d starts at
    # 8 s as without LMS. The other way round (a slow host-to-device
    # direction) the swap-in would take 4 s.
    index = chain()
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["b"])])
    slow_out = steptime.StepTimeModel(
        index, analysis.classify_ops(index), gpu=SLOW_GPU,
        interconnect=link(1000.0, d2h=250.0), kernels=EXACT).predict(plan)
    (timing,) = slow_out.swaps
    assert (timing.out_start_s, timing.out_end_s) == (2, 6)
    (sin,) = timing.swap_ins
    assert (sin.ready_s, sin.start_s, sin.end_s) == (6, 6, 7)
    assert slow_out.with_lms_s == 11
    assert (slow_out.swapout_busy_s, slow_out.swapin_busy_s) == (4, 1)
    slow_in = steptime.StepTimeModel(
        index, analysis.classify_ops(index), gpu=SLOW_GPU,
        interconnect=steptime.Interconnect(
            "t", "t", 1000.0, "t", h2d_bytes_per_s=250.0),
        kernels=EXACT).predict(plan)
    (timing,) = slow_in.swaps
    assert (timing.out_start_s, timing.out_end_s) == (2, 3)
    assert (timing.swap_ins[0].start_s, timing.swap_ins[0].end_s) == (4, 8)
    assert (slow_in.swapout_busy_s, slow_in.swapin_busy_s) == (1, 4)


def test_grace_hopper_copies_out_slower_than_in():
    index = chain()
    gh = steptime.StepTimeModel(index, analysis.classify_ops(index),
                                gpu="H100-SXM5-80GB",
                                interconnect="nvlink-c2c")
    plan = plan_of(index, [swap(index, "a", [("d", 0)], ["b"])])
    step = gh.predict(plan)
    assert step.swapout_busy_s == 1000 / 170e9
    assert step.swapin_busy_s == 1000 / 416e9


def half_and_single_products():
    """f: a float32 product, h: a 2-byte one; 12000 FLOPs each, 1000 bytes
    out and 1000 in (h reads f's output)."""
    return gi.from_edges(
        [("x", "Placeholder", {"outputs": [1000]}),
         ("f", "MatMul", {"outputs": [1000], "flops": 12000}),
         ("h", "MatMul", {"outputs": [((1, 500), 2)], "flops": 12000})],
        edges=[("x", "f"), ("f", "h")])


def test_the_precision_of_products():
    index = half_and_single_products()
    f, h = index.id_of["f"], index.id_of["h"]
    # A GPU with TF32 (tensor_flops above fp32_flops) and bfloat16 units.
    gpu = steptime.Gpu("tc", fp32_flops=1000.0, tensor_flops=2000.0,
                       half_flops=4000.0, memory_bandwidth=1000.0,
                       memory_bytes=1, source="test", bf16_flops=3000.0)
    def times(**kwargs):
        m = steptime.StepTimeModel(
            index, analysis.classify_ops(index), gpu=gpu,
            interconnect=link(1.0), kernels=steptime.KernelOptions(
                launch_overhead_s=0.0, efficiency=steptime.PEAK,
                fusion=False, **kwargs))
        return (m.precision(f), m.precision(h),
                m.op_seconds[f], m.op_seconds[h])
    assert times() == ("tf32", "fp16", 6, 3)
    assert times(tf32=False) == ("fp32", "fp16", 12, 3)
    assert times(half="bf16") == ("tf32", "bf16", 6, 4)
    # Without TF32 on the GPU (V100), float32 products are FP32 whatever
    # the setting; without bfloat16 units, bfloat16 runs at the FP32 rate.
    v100_like = dataclasses.replace(gpu, tensor_flops=1000.0,
                                    bf16_flops=None)
    m = steptime.StepTimeModel(
        index, analysis.classify_ops(index), gpu=v100_like,
        interconnect=link(1.0),
        kernels=dataclasses.replace(EXACT, half="bf16"))
    assert (m.precision(f), m.op_seconds[f], m.op_seconds[h]) == (
        "fp32", 12, 12)
    with pytest.raises(ValueError, match=r"^half must be 'fp16' or 'bf16' "
                       r"\(the precision of 2-byte products\); got 'fp8'$"):
        steptime.StepTimeModel(index, analysis.classify_ops(index),
                               kernels=steptime.KernelOptions(half="fp8"))


def test_efficiency_scales_each_precision_and_memory():
    index = half_and_single_products()
    f, h = index.id_of["f"], index.id_of["h"]
    eff = steptime.Efficiency(memory=0.5, fp32=0.5, tf32=0.5, fp16=0.25,
                              conv_fp32=0.1)
    m = model(index, efficiency=eff)
    # f: 12000 / (1000 x 0.5) = 24 s; h: 12000 / (4000 x 0.25) = 12 s.
    assert (m.op_seconds[f], m.op_seconds[h]) == (24, 12)
    # A convolution of the same FLOPs gets conv_fp32: 12000 / 100 = 120 s.
    conv = gi.from_edges(
        [("x", "Placeholder", {"outputs": [1000]}),
         ("c", "Conv2D", {"outputs": [1000], "flops": 12000})],
        edges=[("x", "c")])
    assert model(conv, efficiency=eff).op_seconds[conv.id_of["c"]] == 120
    # Memory-bound at half the bandwidth: 2000 B / 500 B/s.
    assert model(chain(), efficiency=eff).op_seconds.tolist() == [
        0, 4, 4, 4, 4, 6]
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"^Efficiency.conv_tf32 must "
                           r"be a fraction of the peak in \(0, 1\]; got %r$"
                           % bad):
            steptime.Efficiency(conv_tf32=bad)
    # The fitted fractions derate the published GPUs; a GPU made elsewhere
    # keeps the rates it was given.
    assert steptime.StepTimeModel(
        index, analysis.classify_ops(index)).efficiency is steptime.ACHIEVED
    assert steptime.StepTimeModel(
        index, analysis.classify_ops(index),
        gpu=SLOW_GPU).efficiency is steptime.PEAK
    assert steptime.StepTimeModel(
        index, analysis.classify_ops(index), gpu=dataclasses.replace(
            steptime.GPUS["V100-SXM2-16GB"], memory_bandwidth=1.0),
    ).efficiency is steptime.PEAK
    assert steptime.PEAK == steptime.Efficiency(*[1.0] * 9)


def test_fusion_keeps_a_chain_of_elementwise_ops_in_one_kernel():
    # x -> a -> b -> c -> e -> d(a, e), all Relu/AddV2 (elementwise): every
    # output but d's is read by elementwise ops only, so it stays inside
    # the fused kernel (a is computed again inside d's). What goes through
    # memory: x read (by a, 1 s) and d written (1 s); only d launches a
    # kernel of its own.
    index = chain()
    fused = model(index, overhead=0.5, fusion=True)
    i = index.id_of
    assert fused.fused == {(i[n], 0) for n in "abce"}
    assert fused.op_seconds.tolist() == [0, 1, 0, 0, 0, 1.5]
    assert model(index, overhead=0.5).op_seconds.tolist() == [
        0, 2.5, 2.5, 2.5, 2.5, 3.5]
    # A reader that is no elementwise op or reduction (a matrix product)
    # keeps its input in memory: a is written (and read by m and r); r's
    # output, read by a reduction only, is not.
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [1000]}),
         ("a", "Relu", {"outputs": [1000]}),
         ("m", "MatMul", {"outputs": [1000], "flops": 1}),
         ("r", "Relu", {"outputs": [1000]}),
         ("s", "Sum", {"outputs": [4]})],
        edges=[("x", "a"), ("a", "m"), ("a", "r"), ("r", "s")])
    fused = model(index, fusion=True)
    assert fused.fused == {(index.id_of["r"], 0)}
    assert fused.op_seconds[index.id_of["a"]] == 2
    assert fused.op_seconds[index.id_of["r"]] == 1
    assert fused.op_seconds[index.id_of["s"]] == 0.004


def test_nchw_transposes_around_half_precision_convolutions():
    # cuDNN runs 2-byte convolutions on tensor cores in NHWC: with NCHW
    # tensors, each 4-D input and output of such a convolution is
    # transposed by a kernel of its own that reads and writes it once.
    # Every product here is compute-bound (40000 FLOPs at the 4000 FLOP/s
    # half peak: 10 s; f 10000 at the 1000 FLOP/s FP32 peak: 10 s), so
    # its time in NHWC is 10 s plus the 0.25 s launch.
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [((1, 1, 10, 50), 2)]}),  # 1000 B
         ("w", "Placeholder", {"outputs": [((1, 1, 5, 50), 2)]}),  # 500 B
         ("s", "Placeholder", {"outputs": [((4,), 4)]}),  # a shape, 16 B
         ("c", "Conv2D", {"outputs": [((1, 1, 10, 50), 2)],
                          "flops": 40000}),
         ("bi", "Conv2DBackpropInput", {"outputs": [((1, 1, 10, 50), 2)],
                                        "flops": 40000}),
         ("bf", "Conv2DBackpropFilter", {"outputs": [((1, 1, 5, 50), 2)],
                                         "flops": 40000}),
         ("f", "Conv2D", {"outputs": [((1, 1, 10, 25), 4)],
                          "flops": 10000}),
         ("m", "MatMul", {"outputs": [((10, 50), 2)], "flops": 40000})],
        edges=[("x", "c"), ("w", "c"),
               ("s", "bi"), ("w", "bi"), ("c", "bi"),
               ("x", "bf"), ("s", "bf"), ("c", "bf"),
               ("x", "f"), ("w", "f"), ("c", "m")])
    i = index.id_of
    nhwc = model(index, overhead=0.25)
    nchw = model(index, overhead=0.25, layout="NCHW")
    assert nhwc.layout == "NHWC"
    assert model(index, overhead=0.25, layout="NHWC").op_seconds.tolist() \
        == nhwc.op_seconds.tolist() == [0, 0, 0, 10.25, 10.25, 10.25,
                                        10.25, 10.25]
    # c: x 1000 B, w 500 B in, 1000 B out; bi: w, dy (c) in, dx out (its
    # rank-1 input sizes are no activation); bf: x and dy in, the 500 B
    # filter gradient out. Each 2500 B transposed, read and written: 5000
    # B, 5 s at 1000 B/s, in three kernels of 0.25 s launch each.
    for op in ("c", "bi", "bf"):
        assert nchw.transposed_bytes(i[op]) == 5000
        assert nchw.op_seconds[i[op]] == 10 + 5 + 4 * 0.25
    assert sorted(nchw.transposed_tensors(i["bi"])) == [500, 1000, 1000]
    # The float32 convolution and the float16 matrix product transpose
    # nothing, nor does any op in NHWC.
    for op in ("f", "m"):
        assert nchw.transposed_bytes(i[op]) == 0
        assert nchw.op_seconds[i[op]] == 10.25
    assert all(nhwc.transposed_bytes(k) == 0 for k in range(index.num_ops))
    assert nchw.predict().without_lms_s == 3 * 16 + 2 * 10.25
    with pytest.raises(ValueError, match=r"^layout must be 'NHWC' or 'NCHW' "
                       r"\(the layout of the convolutions' tensors\); got "
                       r"'NDHWC'$"):
        model(index, layout="NDHWC")


def _one_convolution(dtype):
    """A TensorFlow graph of one 3x3 convolution ("conv") of a batch of 4
    16x16x8 inputs into 32 channels in `dtype`: its index, roles, batch
    and the bytes of its input, filter and output."""
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(dtype, [None, 16, 16, 8], name="x")
        w = tf.cast(tf.compat.v1.get_variable("w", [3, 3, 8, 32]), dtype)
        tf.nn.conv2d(x, w, 1, "SAME", name="conv")
    index = tf_reader.build_index(graph)
    batch = 4
    itemsize = tf.as_dtype(dtype).size
    nbytes = itemsize * (batch * 16 * 16 * 8 + 3 * 3 * 8 * 32
                         + batch * 16 * 16 * 32)
    return index, analysis.classify_ops(index), batch, nbytes


def test_nchw_transposes_of_a_tensorflow_float16_convolution():
    """On a real graph: a float16 convolution in NCHW on an A100 pays its
    input, filter and output through memory twice more (each transposed:
    read and written), and launches three more kernels."""
    index, roles, batch, nbytes = _one_convolution("float16")
    conv = index.id_of["conv"]
    nhwc = steptime.StepTimeModel(index, roles, batch, gpu="A100-SXM4-80GB")
    nchw = steptime.StepTimeModel(index, roles, batch, gpu="A100-SXM4-80GB",
                                  kernels=steptime.KernelOptions(
                                      layout="NCHW"))
    assert nchw.precision(conv) == "fp16"
    assert nchw.bytes_touched(conv) == nhwc.bytes_touched(conv) == nbytes
    assert nchw.transposed_bytes(conv) == 2 * nbytes
    # (approx: the same terms, added in another order)
    assert nchw.op_seconds[conv] == pytest.approx(
        nhwc.op_seconds[conv] + 2 * nbytes / nchw.achieved_bandwidth
        + 3 * steptime.LAUNCH_OVERHEAD_S, rel=1e-12)


def test_nchw_transposes_of_a_tf32_convolution_only():
    """A float32 convolution runs on the tensor cores in TF32 on an A100:
    in NCHW it pays the same transposes as a float16 one. On a V100 (FP32
    on the CUDA cores), or with TF32 off, it pays none."""
    index, roles, batch, nbytes = _one_convolution("float32")
    conv = index.id_of["conv"]

    def nchw(gpu, tf32=True):
        return steptime.StepTimeModel(
            index, roles, batch, gpu=gpu,
            kernels=steptime.KernelOptions(layout="NCHW", tf32=tf32))
    a100 = nchw(gpu="A100-SXM4-80GB")
    assert a100.precision(conv) == "tf32"
    assert a100.transposed_bytes(conv) == 2 * nbytes
    assert len(a100.transposed_tensors(conv)) == 3
    fp32 = nchw(gpu="A100-SXM4-80GB", tf32=False)
    assert fp32.precision(conv) == "fp32"
    assert fp32.transposed_bytes(conv) == 0
    v100 = nchw(gpu="V100-SXM2-16GB")
    assert v100.precision(conv) == "fp32"
    assert v100.transposed_bytes(conv) == 0
