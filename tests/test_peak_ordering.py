"""Ordering edges (`tflms.peak_ordering`): one op of a crowded level before
another, found by replays, kept by the tuner when nothing fits without
them, and harmless to training."""

import pytest
import tensorflow as tf

from tflms.tf import reader as tf_reader
from tflms import LMS
from tflms import analysis
from tflms import autotune
from tflms import graph_index as gi
from tflms.stages import timed
from tflms.stages.order import peaks as peak_ordering
from tflms import pipeline
from tflms import planner
from tflms import simulator
from tflms.settings import Settings

from _graphs import assert_same_training, zoo_model
from test_equivalence import train

U = 1000


def crowded_graph():
    """x (U) -> a (4U) -> b (U) -> g (U); then f = filter-gradient-like
    Mul(a, g) (8 B) and i = input-gradient-like Relu(g) (4U) share level 4;
    out = AddN(f, i).

    Levels: x 0, a 1, b 2, g 3, f 4, i 4, out 5. g, b's only reader,
    writes into b's buffer, and out into f's (the other sizes differ).
    Buffers (inclusive): x [0, 1], a [1, 4], b = g [2, 4], f = out [4, 5],
    i [4, 5]. Level 4 holds a, g, f and i: 9U + 8, the peak. With f before
    i: f at 4, i at 5, out at 6; levels 1-3 hold a and x or b (5U); level 4
    holds a, g, f (5U + 8) and a is freed after it; level 5 holds g, f, i
    (5U + 8), the peak; level 6 f (= out) and i (4U + 8).
    """
    return gi.from_edges(
        [("x", "Placeholder", {"outputs": [U]}),
         ("a", "Relu", {"outputs": [4 * U]}),
         ("b", "Relu", {"outputs": [U]}),
         ("g", "Relu", {"outputs": [U]}),
         ("f", "Mul", {"outputs": [8]}),
         ("i", "Relu", {"outputs": [4 * U]}),
         ("out", "AddN", {"outputs": [8]})],
        edges=[("x", "a"), ("a", "b"), ("b", "g"), ("a", "f"), ("g", "f"),
               ("g", "i"), ("f", "out"), ("i", "out")])


def _no_swaps(index, roles):
    return planner.make_plan(index, roles, planner.SwapParams(100, 1, 0, 0))


def test_order_peaks_runs_the_freeing_op_first():
    index = crowded_graph()
    roles = analysis.classify_ops(index)
    model = simulator.SimulationModel(index, roles)
    plan = _no_swaps(index, roles)
    assert plan.swaps == ()
    found = peak_ordering.order_peaks(model, plan, budget=0)
    ids = {name: k for k, name in enumerate(index.names)}
    assert found.edges == ((ids["f"], ids["i"]),)
    assert found.peak_before == 9 * U + 8
    assert found.result.peak_device_bytes == 5 * U + 8
    # The replay with the edge in the plan is the one order_peaks judged.
    import dataclasses
    with_edge = dataclasses.replace(
        plan, serialization_edges=plan.serialization_edges + found.edges)
    replayed = model.replay(with_edge)
    assert replayed.device_timeline.tolist() == [
        U, 5 * U, 5 * U, 5 * U, 5 * U + 8, 5 * U + 8, 4 * U + 8]
    # Stops as soon as the target is met: nothing to do at 9U + 8.
    assert peak_ordering.order_peaks(model, plan, budget=9 * U + 8).edges == ()


def early_graph():
    """x (U) -> a (3U) -> b = Conv2D(a) (3U) -> c (U) -> d = AddN(c, e)
    (U), and e = Neg(x) (2U), made at level 1 from x alone and read only
    by d.

    b is a convolution, which never writes into its input (an element-wise
    b would write into a and leave no peak at level 2); d writes into c's
    buffer. Levels: x 0, a 1, e 1, b 2, c 3, d 4. Buffers: x [0, 1], a
    [1, 2], e [1, 4], b [2, 3], c = d [3, 4]: 1, 6, 8, 6, 3 U; the peak is
    8U at level 2 (a, b and e). The trigger for e is b, the data ancestor
    of d one level before c: e moves to level 3, x lives [0, 3]: 1, 4, 7,
    7, 3 U.
    """
    return gi.from_edges(
        [("x", "Placeholder", {"outputs": [U]}),
         ("a", "Relu", {"outputs": [3 * U]}),
         ("b", "Conv2D", {"outputs": [3 * U]}),
         ("c", "Relu", {"outputs": [U]}),
         ("e", "Neg", {"outputs": [2 * U]}),
         ("d", "AddN", {"outputs": [U]})],
        edges=[("x", "a"), ("a", "b"), ("b", "c"), ("x", "e"), ("c", "d"),
               ("e", "d")])


def test_order_peaks_delays_a_tensor_made_long_before_its_reader():
    index = early_graph()
    roles = analysis.classify_ops(index)
    model = simulator.SimulationModel(index, roles)
    plan = _no_swaps(index, roles)
    ids = {name: k for k, name in enumerate(index.names)}
    assert model.replay(plan).device_timeline.tolist() == [
        U, 6 * U, 8 * U, 6 * U, 3 * U]
    found = peak_ordering.order_peaks(model, plan, budget=0)
    # e -> b would undo it (b now reaches e): refused, so one edge.
    assert found.edges == ((ids["b"], ids["e"]),)
    assert found.peak_before == 8 * U
    assert found.result.device_timeline.tolist() == [
        U, 4 * U, 7 * U, 7 * U, 3 * U]


def test_an_edge_from_a_descendant_is_refused():
    """out reads i: ``out -> i`` would close a cycle; ``f -> i`` does not.
    Fusion partners count as one node: an edge into a partner of the first
    op's own reader is a cycle too."""
    index = crowded_graph()
    roles = analysis.classify_ops(index)
    ids = {name: k for k, name in enumerate(index.names)}
    assert peak_ordering._closes_cycle(index, roles, ids["out"], ids["i"])
    assert not peak_ordering._closes_cycle(index, roles, ids["f"], ids["i"])
    merged = dataclasses_replace_fused(roles, ids["out"], ids["f"])
    # f is now merged with out, which reads i: f -> i closes a cycle.
    assert peak_ordering._closes_cycle(index, merged, ids["f"], ids["i"])


def dataclasses_replace_fused(roles, a, b):
    import dataclasses
    fused = dict(roles.fused_with)
    fused[a] = frozenset({b})
    fused[b] = frozenset({a})
    return dataclasses.replace(roles, fused_with=fused)


def _resnet():
    # Two blocks in the second stage: with in-place writes counted, the one
    # ordering edge the tuner keeps for blocks (1, 1) (between two filter
    # gradients of stage 1's first block) goes into no op a synchronous
    # swap-in feeds, and `sync_mode` 3 would have nothing to wait for.
    return zoo_model("keras_resnet", image=16, batch=2, blocks=(1, 2))


def _aggressive_peaks(graph, from_sync=0):
    """Lowest peak of the most aggressive plans over the sync modes from
    `from_sync` up, without and with ordering edges."""
    index = tf_reader.build_index(graph)
    roles = pipeline.classify(index, Settings())
    model = simulator.SimulationModel(index, roles)
    plain, ordered = [], []
    for sync in range(from_sync, 4):
        plan = planner.make_plan(index, roles,
                                 planner.SwapParams(1, 1, 0, sync))
        found = peak_ordering.order_peaks(model, plan, budget=0)
        plain.append(found.peak_before)
        ordered.append(found.result.peak_device_bytes)
    return min(plain), min(ordered)


@pytest.mark.numerics
@pytest.mark.parametrize("sync_mode", [0, 3])
def test_tuner_orders_peaks_when_nothing_fits_and_training_is_equal(
        monkeypatch, sync_mode):
    """A budget between the lowest peak without ordering and with it: the
    tuner fails with `order_peaks` off, fits with it on, the edges are
    control inputs of the rewritten graph, and three training steps give
    the same losses and weights as without LMS, every swap op having run.
    With `sync_mode` 3 the swap-ins into the ordered ops also wait for the
    edges' first ops (`planner.wait_for_ordering`)."""
    monkeypatch.setenv(autotune.MEM_RATIO_ENV, "1")
    plain, ordered = _aggressive_peaks(_resnet().graph, sync_mode)
    assert ordered < plain
    budget_gib = (plain + ordered) / 2.0 / (1 << 30)

    refused = _resnet()
    lms = LMS(sync_mode=sync_mode)
    lms.autotune_gpu_mem = budget_gib
    lms.interconnect = "instant"
    lms.order_peaks = False
    with pytest.raises(autotune.AutotuneError, match="no parameter set"):
        lms.run(refused.graph)

    model = _resnet()
    lms = LMS(sync_mode=sync_mode)
    lms.autotune_gpu_mem = budget_gib
    lms.interconnect = "instant"
    result = lms.run(model.graph)
    planned = result.planned
    assert planned.ordering_edges
    assert planned.with_lms.peak_device_bytes <= budget_gib * (1 << 30)
    ops = model.graph.get_operations()
    for a, b in planned.ordering_edges:
        first = model.graph.get_operation_by_name(planned.index.names[a])
        then = model.graph.get_operation_by_name(planned.index.names[b])
        assert first in then.control_inputs
    assert len(ops) > 0
    if sync_mode == 3:
        firsts = {a for a, _ in planned.ordering_edges}
        assert any(set(sin.triggers) & firsts
                   for s in planned.plan.swaps for sin in s.swap_ins)
    assert_same_training(model.graph, result, train(_resnet()),
                         train(model))


def test_tflms_plan_lists_the_ordering_edges(tmp_path, monkeypatch, capsys):
    """`tflms plan` on the same model and budget: the JSON names the edges
    the tuner kept, and the text lists them."""
    import json
    from tflms import cli
    monkeypatch.setenv(autotune.MEM_RATIO_ENV, "1")
    model = _resnet()
    plain, ordered = _aggressive_peaks(model.graph)
    budget = "%.12f" % ((plain + ordered) / 2.0 / (1 << 30))
    meta = str(tmp_path / "resnet.meta")
    with model.graph.as_default():
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP,
                                       model.train_op)
        tf.compat.v1.train.export_meta_graph(filename=meta)
    argv = ["plan", meta, "--autotune-gpu-mem", budget, "--no-plots",
            "--interconnect", "instant"]
    assert cli.main(argv + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fits"] and report["ordering_edges"]
    names = {op.name for op in model.graph.get_operations()}
    assert all(a in names and b in names for a, b in report["ordering_edges"])
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "Ordered at the memory peaks (docs/autotuning.md, step 8): %d " \
        "control edges" % len(report["ordering_edges"]) in out
    first, then = report["ordering_edges"][0]
    assert "  %s before %s" % (first, then) in out


@pytest.mark.one_stack  # planning only: run once (tools/run_tests.sh)
def test_synchronous_swap_ins_give_way_when_ordering_is_faster():
    """Keras ResNet50 at 6592x6592 in 16 GiB (14.4 GiB planned): without
    ordering the tuner's plan waits for every swap-in (`sync_mode` 3);
    ordering the most aggressive plan's peak (the projection block's two
    batch-norm gradients) lets the search find asynchronous swap-ins at the
    same budget, and the tuner keeps that plan because its predicted step
    is shorter. Static shapes only: nothing runs."""
    from benchmarks import models as bench_models
    built = bench_models.build("resnet50", image=6592, batch=1)
    index = tf_reader.build_index(built.graph)
    settings = Settings(autotune_gpu_mem=16, batch_size=1)
    roles = pipeline.classify(index, settings)
    env = {autotune.MEM_RATIO_ENV: "0.9"}
    plain = pipeline.plan(index, Settings(autotune_gpu_mem=16, batch_size=1,
                                          order_peaks=False),
                          roles=roles, env=env)
    ordered = pipeline.plan(index, settings, roles=roles, env=env)
    assert plain.params.sync_mode == 3 and not plain.ordering_edges
    assert ordered.params.sync_mode < 2 and ordered.ordering_edges
    assert ordered.step_time.with_lms_s < plain.step_time.with_lms_s
    assert ordered.with_lms.peak_device_bytes <= ordered.budget_bytes
    assert set(ordered.ordering_edges) <= set(ordered.plan.control_edges)
    names = [(ordered.index.names[a], ordered.index.names[b])
             for a, b in ordered.ordering_edges]
    assert all("conv2_block1" in a and "conv2_block1" in b
               for a, b in names), names


def test_synchronous_swap_ins_also_wait_for_ordering_edges():
    """The U-shaped literal graph of test_simulator_literal: f1 is swapped
    for g1. A synchronous swap-in (sync_mode 2) waits for g1's other input
    g2; with an ordering edge ``(f3, g1)`` it waits for f3 too. An
    asynchronous swap-in keeps its trigger, and an edge into another op
    changes nothing."""
    from test_simulator_literal import u_graph
    index = u_graph()
    roles = analysis.classify_ops(index)
    ids = {name: k for k, name in enumerate(index.names)}
    edge = ((ids["f3"], ids["g1"]),)
    sync = planner.make_plan(index, roles, planner.SwapParams(5, 1, 0, 2))
    waited = planner.wait_for_ordering(sync, edge)
    assert [index.names[t] for t in sync.swaps[0].swap_ins[0].triggers] == [
        "g2"]
    assert [index.names[t] for t in waited.swaps[0].swap_ins[0].triggers] == [
        "g2", "f3"]
    assert planner.wait_for_ordering(sync, ((ids["f3"], ids["g2"]),)) is sync
    eager = planner.make_plan(index, roles, planner.SwapParams(5, 1, 0, 0))
    assert planner.wait_for_ordering(eager, edge) is eager
    # The simulator starts the copy after both: level of g2 (7) + 1.
    model = simulator.SimulationModel(index, roles)
    assert model.replay(waited).device_timeline.tolist() == \
        model.replay(sync).device_timeline.tolist()


@pytest.mark.one_stack  # planning only: run once (tools/run_tests.sh)
def test_resnet50_at_8000_fits_16_gib_with_copies_timed():
    """Keras ResNet50 at 8000x8000, batch 1, in 16 GiB (14.4 GiB planned),
    copies timed at PCIe 4.0: nothing fits without ordering (the first
    projection block's two branches hold four 3.8 GiB tensors at once);
    with it the tuner's plan fits with copies timed, its synchronous
    swap-ins wait for the ordering edges, and the search that copy times
    force (synchronous swap-outs) keeps the edges."""
    from benchmarks import models as bench_models
    built = bench_models.build("resnet50", image=8000, batch=1)
    index = tf_reader.build_index(built.graph)
    env = {autotune.MEM_RATIO_ENV: "0.9"}
    # The plan swaps 98.95 GiB at its host peak: planned for a GPU server's
    # host (the benchmarks' 256 GiB), not the tests' 64 GiB.
    settings = Settings(autotune_gpu_mem=16, batch_size=1,
                        autotune_host_mem=256)
    roles = pipeline.classify(index, settings)
    with pytest.raises(autotune.AutotuneError, match="no parameter set"):
        pipeline.plan(index, settings.replace(order_peaks=False),
                      roles=roles, env=env)
    planned = pipeline.plan(index, settings, roles=roles, env=env)
    assert planned.ordering_edges
    assert planned.params.sync_mode == 3
    assert planned.with_lms.peak_device_bytes <= planned.budget_bytes
    firsts = {a for a, _ in planned.ordering_edges}
    seconds = {b for _, b in planned.ordering_edges}
    waiting = [sin for s in planned.plan.swaps for sin in s.swap_ins
               if sin.synchronous and all(c in seconds
                                          for c, _ in sin.consumers)]
    assert waiting and all(set(sin.triggers) & firsts for sin in waiting)


def test_replay_bound_shrinks_with_the_graph():
    assert timed.replays_for(6000) == timed.MAX_REPLAYS
    assert timed.replays_for(50000) == 40
    assert timed.replays_for(200000) == 13
    assert timed.replays_for(0) == timed.MAX_REPLAYS
