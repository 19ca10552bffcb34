"""The rewriter's side of recompute: clones made beside the originals, late
readers rerouted, the trigger's control edge, the same values, and the
guard against rewriting twice when a plan has recomputes only."""

import numpy as np
import tensorflow as tf

from tflms.tf import reader
from tflms import LMS
from tflms.tf import rewriter


def relu_read_late():
    """a = relu(x) read by `late` after six sines; x is read last by `out`,
    so a can be made again from x just before `late`."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        a = tf.nn.relu(x, name="a")
        f = a
        for i in range(1, 7):
            f = tf.math.sin(f, name="f%d" % i)
        late = tf.math.multiply(f, a, name="late")
        tf.math.add(late, x, name="out")
    return graph


def run_out(graph, value):
    with tf.compat.v1.Session(graph=graph) as sess:
        return sess.run("out:0", {"x:0": value})


def test_late_reader_reads_a_clone_and_the_original_stays():
    graph = relu_read_late()
    value = np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)
    expected = run_out(graph, value)
    before = len(graph.get_operations())
    result = LMS(swapout_threshold=3, swapin_ahead=1, swapin_groupby=0,
                 recompute=True).run(graph)
    plan = result.planned.plan
    assert plan.swaps == () and len(plan.recomputes) == 1
    assert result.rewrite.recompute_ops == ("a-lms/recompute_a_0/a",)
    assert result.swapout_ops == () and result.swapin_ops == ()
    assert len(graph.get_operations()) == before + 1
    clone = graph.get_operation_by_name("a-lms/recompute_a_0/a")
    assert clone.type == "Relu"
    assert [t.name for t in clone.inputs] == ["x:0"]
    assert clone.get_attr("T") == tf.float32
    assert clone.get_attr(rewriter.SWAP_MARKER_ATTR)
    trigger = result.planned.index.names[plan.recomputes[0].trigger]
    assert [c.name for c in clone.control_inputs] == [trigger]
    assert trigger in ("f3", "f4", "f5")
    late = graph.get_operation_by_name("late")
    assert [t.name for t in late.inputs] == ["f6:0",
                                             "a-lms/recompute_a_0/a:0"]
    assert [c.name for c in graph.get_tensor_by_name("a:0").consumers()] \
        == ["f1"]
    np.testing.assert_array_equal(run_out(graph, value), expected)


def test_a_graph_with_recomputes_only_is_not_rewritten_twice():
    graph = relu_read_late()
    LMS(swapout_threshold=3, swapin_ahead=1, swapin_groupby=0,
        recompute=True).run(graph)
    assert rewriter.is_rewritten(graph)
    assert not rewriter.is_rewritten(graph, lambda device: "GPU" in device)
    snapshot = graph.as_graph_def().SerializeToString(deterministic=True)
    again = LMS(swapout_threshold=3, swapin_ahead=1, swapin_groupby=0,
                recompute=True).run(graph)
    assert again.outcome.name == "ALREADY_REWRITTEN"
    assert graph.as_graph_def().SerializeToString(
        deterministic=True) == snapshot


def test_without_recompute_the_same_tensor_is_swapped():
    graph = relu_read_late()
    result = LMS(swapout_threshold=3, swapin_ahead=1,
                 swapin_groupby=0).run(graph)
    assert result.swapout_ops == ("lms/swapout_a_0",)
    assert result.planned.plan.recomputes == ()


def test_tuned_plan_recomputes_within_the_budget():
    # A Keras ResNet, auto-tuned for 60% of its simulated peak, timed for a
    # fast GPU on a slow link (H100, PCIe 3.0), where copies are exposed: a
    # recompute is taken when the predicted step is shorter, convolutions
    # included; the plan
    # still fits (replayed again here) and moves fewer bytes than the
    # swap-only plan at the same budget.
    from tflms import pipeline
    from tflms import simulator
    from tflms import steptime
    from tflms.settings import Settings
    from zoo import models

    graph = tf.Graph()
    with graph.as_default():
        models.keras_resnet(image=64, batch=4, blocks=(2, 2), seed=1)
    index = reader.build_index(graph)
    base = Settings(gpu="H100-SXM5-80GB", interconnect="pcie3")
    without = pipeline.simulate_without(index, pipeline.classify(index, base),
                                        base)
    gib = 0.6 * without.peak_device_bytes / float(1 << 30)
    env = {"TF_LMS_SIMULATOR_MEM_RATIO": "1"}
    swap_only = pipeline.plan(index, base.replace(autotune_gpu_mem=gib,
                                                  recompute=False), env=env)
    hybrid = pipeline.plan(index, base.replace(autotune_gpu_mem=gib,
                                               recompute=True), env=env)
    assert swap_only.plan.recomputes == ()
    assert len(hybrid.plan.recomputes) == 4
    # Each recompute is timed, so convolutions may be cloned: here the
    # stem's and three of the first stage's, each a single clone reading
    # the convolution's input.
    cloned = [hybrid.index.types[o] for rec in hybrid.plan.recomputes
              for o in rec.ops]
    assert cloned == ["Conv2D"] * 4
    assert hybrid.budget_bytes == swap_only.budget_bytes
    assert hybrid.plan.moved_bytes() < swap_only.plan.moved_bytes()
    assert (hybrid.step_time.with_lms_s
            < swap_only.step_time.with_lms_s)
    assert hybrid.step_time.recompute_s > 0
    # Replayed as the tuner judges plans: copies timed at the default
    # interconnect on the default GPU.
    replayed, _ = steptime.replay_in_time(
        simulator.SimulationModel(hybrid.index, hybrid.context.roles),
        steptime.StepTimeModel(hybrid.index, hybrid.context.roles),
        hybrid.plan)
    assert replayed.peak_device_bytes == hybrid.with_lms.peak_device_bytes
    assert replayed.fits(hybrid.budget_bytes)
    assert replayed.recompute_bytes == hybrid.plan.recompute_bytes() > 0


def test_fixed_parameters_recompute_only_within_the_swap_plans_peak():
    # Swapping every tensor (threshold 1) brings each back just in time;
    # recomputing all of them would hold the clones' inputs and
    # intermediates longer (a higher peak), so only those that keep the
    # swap-only plan's simulated peak are recomputed.
    from tflms import pipeline
    from tflms.settings import Settings
    from zoo import models

    graph = tf.Graph()
    with graph.as_default():
        models.keras_resnet(image=64, batch=4, blocks=(2, 2), seed=1)
    index = reader.build_index(graph)
    fixed = Settings(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
    swap_only = pipeline.plan(index, fixed, simulate=True)
    hybrid = pipeline.plan(index, fixed.replace(recompute=True),
                           simulate=True)
    assert hybrid.plan.recomputes
    assert hybrid.with_lms.peak_device_bytes <= \
        swap_only.with_lms.peak_device_bytes
    assert hybrid.plan.moved_bytes() < swap_only.plan.moved_bytes()
    # Every replaceable swap replaced would peak higher: the check matters.
    from tflms import planner
    from tflms import simulator
    everything = planner.Recomputer(
        hybrid.index, hybrid.context.roles).with_recomputes(
            swap_only.plan, lambda candidate, current: True)
    assert len(everything.recomputes) > len(hybrid.plan.recomputes)
    model = simulator.SimulationModel(hybrid.index, hybrid.context.roles)
    assert model.replay(everything).peak_device_bytes > \
        swap_only.with_lms.peak_device_bytes


def test_fixed_parameters_without_sizes_warn_and_only_swap(lms_log):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        a = tf.nn.relu(x, name="a")
        f = a
        for i in range(1, 7):
            f = tf.math.sin(f, name="f%d" % i)
        tf.math.add(tf.math.multiply(f, a, name="late"), x, name="out")
    result = LMS(swapout_threshold=3, swapin_ahead=1, swapin_groupby=0,
                 recompute=True).run(graph)
    assert result.swapout_ops == ("lms/swapout_a_0",)
    assert result.planned.plan.recomputes == ()
    assert any("Not recomputing: choosing what to recompute needs every "
               "tensor's size" in line and "set lms.batch_size" in line
               for line in lms_log())


def test_recompute_looks_only_for_free_clones_when_every_copy_is_hidden(
        monkeypatch):
    # Timed on a slow link the copies are exposed and clones through
    # convolutions are looked for; on NVLink-C2C the compute hides every
    # copy, a step cannot get shorter, and only clones that take no time
    # (which alone could keep the step as it is) are looked for.
    from tflms import pipeline
    from tflms import planner
    from tflms import steptime
    from tflms.settings import Settings
    from zoo import models

    graph = tf.Graph()
    with graph.as_default():
        models.keras_resnet(image=64, batch=4, blocks=(2, 2), seed=1)
    index = reader.build_index(graph)
    looked_for = []
    real = planner.Recomputer.with_recomputes

    def spy(self, plan, accept, latest_first=False, unpin=False):
        looked_for.append((self.clone_types, latest_first, unpin))
        return real(self, plan, accept, latest_first=latest_first,
                    unpin=unpin)

    monkeypatch.setattr(planner.Recomputer, "with_recomputes", spy)
    env = {"TF_LMS_SIMULATOR_MEM_RATIO": "1"}
    results = {}
    for link in ("pcie3", "nvlink-c2c"):
        base = Settings(gpu="H100-SXM5-80GB", interconnect=link)
        without = pipeline.simulate_without(
            index, pipeline.classify(index, base), base)
        gib = 0.6 * without.peak_device_bytes / float(1 << 30)
        results[link] = pipeline.plan(index, base.replace(
            autotune_gpu_mem=gib, recompute=True), env=env)
    # Exposed copies: four searches (the graph's order or latest-made
    # first, each keeping or unpinning swaps recomputes read; no clone is
    # repeated here, so no search after sharing clones); hidden ones: one,
    # for clones that take no time.
    timed = planner.TIMED_RECOMPUTABLE_TYPES
    assert looked_for == [
        (timed, False, False), (timed, True, False), (timed, False, True),
        (timed, True, True), (timed & steptime.NO_KERNEL_TYPES, False, False)]
    assert results["pcie3"].plan.recomputes
    hidden = results["nvlink-c2c"]
    assert hidden.plan.recomputes == ()
    assert hidden.step_time.exposed_transfer_s == 0
