"""Recompute beside swap on literal graphs (`graph_index.from_edges`): what
`planner.Recomputer.plan` clones, what it refuses, and the simulator's
memory for recomputes in closed form."""

import dataclasses

from tflms import analysis
from tflms import graph_index as gi
from tflms import planner
from tflms import simulator

import _literal as L

PARAMS = planner.SwapParams(1, 1, 0, 0)


def resnet_like(z_type="Relu", bn_is_training=True,
                mids=(3000,) * 4 + (10,) * 2):
    """relu(batchnorm(conv(x))) = z, read by ReluGrad (gz) after a chain of
    forward ops m1..m6, the conv output read by the batch-norm gradient
    (gbn) after that: the case recompute is for.

    Levels: x 0, conv 1, bn 2, z 3, m1..m6 4..9, gz 10, gbn 11.
    """
    ops = [("x", "Placeholder", {"outputs": [100]}),
           ("conv", "Conv2D", {"outputs": [1000]}),
           ("bn", "FusedBatchNormV3", {"outputs": [2000, 10, 10],
                                       "bn_is_training": bn_is_training}),
           ("z", z_type, {"outputs": [4000]})]
    edges = [("x", "conv"), ("conv", "bn"), ("bn:0", "z"), ("z", "m1")]
    for k, size in enumerate(mids, 1):
        ops.append(("m%d" % k, "Tanh", {"outputs": [size]}))
        if k > 1:
            edges.append(("m%d" % (k - 1), "m%d" % k))
    last = "m%d" % len(mids)
    ops += [("gz", "ReluGrad", {"outputs": [1]}),
            ("gbn", "FusedBatchNormGradV3", {"outputs": [1]})]
    edges += [(last, "gz"), ("z", "gz"), ("gz", "gbn"), ("conv", "gbn")]
    return gi.from_edges(ops, edges)


def ids(index, *names):
    return tuple(index.id_of[n] for n in names)


def recompute_of(index, tensor_name, reader, **kwargs):
    roles = analysis.classify_ops(index)
    p = index.id_of[tensor_name]
    consumers = tuple((c, s) for c, s in index.consumers[p][0]
                      if c == index.id_of[reader])
    return planner.Recomputer(index, roles).plan(p, 0, consumers, **kwargs)


def test_relu_of_batch_norm_is_recomputed_from_the_kept_conv_output():
    index = resnet_like()
    assert index.levels == (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
    conv, bn, z, m4, gz = ids(index, "conv", "bn", "z", "m4", "gz")
    rec = recompute_of(index, "z", "gz")
    assert rec == planner.RecomputePlan(
        producer=z, output=0, nbytes=4000, ops=(bn, z),
        inputs=((("tensor", conv, 0),), (("clone", 0, 0),)),
        consumers=((gz, 1),),
        # Two clones: the trigger is the latest ancestor of gz more than
        # two levels before it.
        trigger=m4)


def test_recompute_lowers_the_peak_in_closed_form():
    index = resnet_like()
    model = simulator.SimulationModel(index, analysis.classify_ops(index))
    without = model.replay(None)
    # conv [1, 11]; z [3, 10]; m2..m4 write into m1's buffer (each is its
    # input's only reader), m6 into m5's: one 3000-byte buffer [4, 8], one
    # of 10 bytes [8, 10]; bn's three outputs at level 2 (its mean and
    # variance only there). The peak is 8010 bytes at level 8.
    assert without.device_timeline.tolist() == [
        100, 1100, 3020, 7000, 8000, 8000, 8000, 8000, 8010, 5010, 5011,
        1002]
    rec = recompute_of(index, "z", "gz")
    plan = planner.Plan(params=PARAMS, swaps=(), serialization_edges=(),
                        num_levels=index.num_levels, recomputes=(rec,))
    result = model.replay(plan)
    # z is freed after m1 (level 4); the clone of bn runs at 8 (after m4,
    # its trigger), its outputs 2000 + 10 + 10 until z's clone at 9 reads
    # output 0; z's clone lives until gz at 10; conv is read at 8 by the
    # clone and at 11 as before. The peak is level 4's conv, z and m1.
    assert result.device_timeline.tolist() == [
        100, 1100, 3020, 7000, 8000, 4000, 4000, 4000, 6030, 7010, 5011,
        1002]
    assert result.peak_device_bytes == 8000
    assert result.peak_level == 4
    assert result.num_levels == 12
    assert result.recompute_bytes == 4000
    assert result.swapout_bytes == result.swapin_bytes == 0
    assert plan.moved_bytes() == 0 and plan.recompute_bytes() == 4000


def test_live_at_peak_names_the_clones():
    # With small forward ops the peak is where z's clone is made. m2..m6
    # write into m1's buffer: one 10-byte buffer.
    index = resnet_like(mids=(10,) * 6)
    model = simulator.SimulationModel(index, analysis.classify_ops(index))
    rec = recompute_of(index, "z", "gz")
    plan = planner.Plan(params=PARAMS, swaps=(), serialization_edges=(),
                        num_levels=index.num_levels, recomputes=(rec,))
    result = model.replay(plan)
    assert result.peak_device_bytes == 1000 + 10 + 2000 + 4000
    assert result.peak_level == 9
    assert result.peak_op == "lms/recompute_z_0/z"
    assert result.live_at_peak == (
        ("lms/recompute_z_0/z:0", 4000), ("lms/recompute_z_0/bn:0", 2000),
        ("conv:0", 1000), ("m1:0", 10))


def test_nothing_is_cloned_when_an_input_is_gone():
    # Without the batch-norm gradient the conv output is freed after bn:
    # cloning bn would need the conv too, which is not a cheap op.
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [100]}),
         ("conv", "Conv2D", {"outputs": [1000]}),
         ("bn", "FusedBatchNormV3", {"outputs": [2000, 10, 10],
                                     "bn_is_training": True}),
         ("z", "Relu", {"outputs": [4000]})]
        + [("m%d" % k, "Tanh", {"outputs": [10]}) for k in range(1, 7)]
        + [("gz", "ReluGrad", {"outputs": [1]})],
        edges=[("x", "conv"), ("conv", "bn"), ("bn:0", "z"), ("z", "m1"),
               ("m1", "m2"), ("m2", "m3"), ("m3", "m4"), ("m4", "m5"),
               ("m5", "m6"), ("m6", "gz"), ("z", "gz")])
    assert recompute_of(index, "z", "gz") is None


def test_inference_batch_norm_and_stateful_ops_are_not_cloned():
    assert recompute_of(resnet_like(bn_is_training=False), "z", "gz") is None
    assert recompute_of(resnet_like(bn_is_training=None), "z", "gz") is None
    # A Conv2D is not cheap: a tensor it makes is never recomputed.
    assert recompute_of(resnet_like(z_type="Conv2D"), "z", "gz") is None


def test_at_most_max_recompute_ops_are_cloned():
    # z = relu(relu(...relu(x)...)) with MAX_RECOMPUTE_OPS + 1 relus, x read
    # late: z needs every relu cloned, one more than allowed.
    n = planner.MAX_RECOMPUTE_OPS
    for count, expected in ((n, n), (n + 1, None)):
        ops = [("x", "Placeholder", {"outputs": [100]})]
        edges = []
        prev = "x"
        for k in range(count):
            ops.append(("r%d" % k, "Relu", {"outputs": [100]}))
            edges.append((prev, "r%d" % k))
            prev = "r%d" % k
        ops += [("m%d" % k, "Tanh", {"outputs": [10]}) for k in range(12)]
        edges += [(prev, "m0")] + [("m%d" % k, "m%d" % (k + 1))
                                   for k in range(11)]
        ops += [("late", "ReluGrad", {"outputs": [1]}),
                ("later", "AddV2", {"outputs": [1]})]
        edges += [("m11", "late"), (prev, "late"), ("late", "later"),
                  ("x", "later")]
        index = gi.from_edges(ops, edges)
        rec = recompute_of(index, prev, "late")
        if expected is None:
            assert rec is None
        else:
            assert len(rec.ops) == expected
            assert rec.inputs[0] == (("tensor", index.id_of["x"], 0),)


def test_a_swapped_input_is_read_from_its_swap_in():
    # conv is swapped for gbn with a swap-in triggered before gz: the clone
    # of bn reads that device copy. Without the swap-in the conv output
    # would not be on the device (the plan reroutes its late reader).
    index = resnet_like()
    roles = analysis.classify_ops(index)
    conv, m2, gbn = ids(index, "conv", "m2", "gbn")
    swap = planner.SwapPlan(
        producer=conv, output=0, nbytes=1000,
        swap_ins=(planner.SwapInPlan(((gbn, 1),), (m2,), False),),
        waiters=())
    rec = recompute_of(index, "z", "gz", swaps=(swap,))
    assert rec.inputs[0] == (("swapin", conv, 0, 0),)
    late = planner.SwapPlan(
        producer=conv, output=0, nbytes=1000,
        swap_ins=(planner.SwapInPlan(((gbn, 1),), (index.id_of["gz"],),
                                     False),), waiters=())
    # A swap-in started after gz is started earlier instead, by the
    # recompute's trigger (three levels ahead: swap-in, bn, relu).
    rec_late = recompute_of(index, "z", "gz", swaps=(late,))
    assert rec_late.inputs[0] == (("swapin", conv, 0, 0),)
    assert rec_late.earlier_swap_ins == ((conv, 0, 0),)
    assert rec_late.trigger == index.id_of["m3"]
    assert planner.retrigger_swaps((late,), rec_late) == (
        dataclasses.replace(late, swap_ins=(planner.SwapInPlan(
            ((gbn, 1),), (index.id_of["m3"],), False),)),)
    assert rec.earlier_swap_ins == ()
    plan = planner.Plan(params=PARAMS, swaps=(swap,), serialization_edges=(),
                        num_levels=index.num_levels, recomputes=(rec,))
    result = simulator.SimulationModel(index, roles).replay(plan)
    # conv on the device [1, 2] (bn), on the host from the swap-out at 2;
    # its device copy from level 6 (after m2 at 5) to gbn at 11. m1..m4
    # share one buffer, m5 and m6 another (as without a plan).
    assert result.device_timeline.tolist() == [
        100, 1100, 3020, 6000, 7000, 3000, 4000, 4000, 6030, 7010, 5011,
        1002]
    assert result.swapout_bytes == result.swapin_bytes == 1000


def test_with_recomputes_replaces_accepted_swaps_only():
    index = resnet_like()
    roles = analysis.classify_ops(index)
    z, conv = ids(index, "z", "conv")
    plan = planner.make_plan(index, roles, planner.SwapParams(3, 1, 0, 0),
                             only_tensors={(z, 0)})
    assert [(s.producer, s.output) for s in plan.swaps] == [(z, 0)]
    offered = []

    def accept(candidate, current):
        offered.append((candidate, current))
        return True

    hybrid = planner.Recomputer(index, roles).with_recomputes(plan, accept)
    assert hybrid.swaps == ()
    assert hybrid.recomputes == (recompute_of(index, "z", "gz"),)
    assert offered == [(hybrid, plan)]
    refused = planner.Recomputer(index, roles).with_recomputes(
        plan, lambda candidate, current: False)
    assert refused is plan


def test_a_second_pass_keeps_the_swaps_earlier_recomputes_read():
    # A first pass recomputes f3 from f2's swap-in. A second pass over that
    # plan (the host stage runs two; recompute then host is another) must
    # keep f2's swap: f3's clones read it. Replacing it too left f3's clone
    # reading a swap-in that no longer existed (the simulator raised
    # KeyError on such a plan).
    index = L.chain()
    roles = analysis.classify_ops(index)
    f2, f3 = L.ids(index)["f2"], L.ids(index)["f3"]
    plan = planner.make_plan(index, roles, planner.SwapParams(2, 1, 0, 0))
    first = planner.Recomputer(index, roles).with_recomputes(
        plan,
        lambda candidate, current: candidate.recomputes[-1].producer == f3)
    assert first.recomputes[0].inputs == ((("swapin", f2, 0, 0),),)
    second = planner.Recomputer(index, roles).with_recomputes(
        first, lambda candidate, current: True)
    assert f2 in [s.producer for s in second.swaps]
    assert len(second.recomputes) > 1  # the pass did recompute others
    simulator.SimulationModel(index, roles).replay(second)


def test_a_conv_output_swapped_for_the_bn_gradient_comes_back_earlier():
    # Threshold 3 swaps the conv output too, brought back for gbn after gz:
    # the hybrid plan starts that swap-in before the clones instead (it
    # feeds the clone of bn and gbn) and recomputes z.
    index = resnet_like()
    roles = analysis.classify_ops(index)
    plan = planner.make_plan(index, roles, planner.SwapParams(3, 1, 0, 0))
    z, conv, m3 = ids(index, "z", "conv", "m3")
    assert {(s.producer, s.output) for s in plan.swaps} == {(z, 0), (conv, 0)}
    hybrid = planner.Recomputer(index, roles).with_recomputes(
        plan, lambda candidate, current: True)
    assert [(s.producer, [sin.triggers for sin in s.swap_ins])
            for s in hybrid.swaps] == [(conv, [(m3,)])]
    assert [(r.producer, r.earlier_swap_ins) for r in hybrid.recomputes] == [
        (z, ((conv, 0, 0),))]
    assert hybrid.moved_bytes() == 2000
    result = simulator.SimulationModel(index, roles).replay(hybrid)
    # conv's device copy [7, 11] (after m3 at 6, read by bn's clone at 8
    # and gbn at 11); bn's clone at 8, z's at 9. m1..m4 share one buffer,
    # m5 and m6 another.
    assert result.device_timeline.tolist() == [
        100, 1100, 3020, 6000, 7000, 3000, 3000, 4000, 6030, 7010, 5011,
        1002]


def test_an_aliasing_clone_forwards_its_input_buffer():
    # s = reshape(relu(x)) read late; x is read later still. The clone of
    # the Reshape forwards the clone of the Relu's buffer, as the original
    # forwards the original's: the recompute adds one 400-byte buffer.
    # m2..m4 write into m1's buffer and later into late's.
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [100]}),
         ("shape", "Const", {"outputs": [8]}),
         ("r", "Relu", {"outputs": [400]}),
         ("s", "Reshape", {"outputs": [400]})]
        + [("m%d" % k, "Tanh", {"outputs": [10]}) for k in range(1, 5)]
        + [("late", "Mul", {"outputs": [1]}),
           ("later", "AddV2", {"outputs": [1]})],
        edges=[("x", "r"), ("r", "s"), ("shape", "s"), ("s", "m1"),
               ("m1", "m2"), ("m2", "m3"), ("m3", "m4"), ("m4", "late"),
               ("s", "late"), ("late", "later"), ("x", "later")])
    roles = analysis.classify_ops(index)
    x, shape, r, s, m2, late = ids(index, "x", "shape", "r", "s", "m2",
                                   "late")
    rec = recompute_of(index, "s", "late")
    assert rec == planner.RecomputePlan(
        producer=s, output=0, nbytes=400, ops=(r, s),
        inputs=((("tensor", x, 0),),
                (("clone", 0, 0), ("tensor", shape, 0))),
        consumers=((late, 1),), trigger=m2)
    model = simulator.SimulationModel(index, roles)
    resident = 8  # the shape constant
    assert model.replay(None).device_timeline.tolist() == [
        resident + b for b in (100, 500, 500, 510, 510, 510, 510, 511, 101)]
    plan = planner.Plan(params=PARAMS, swaps=(), serialization_edges=(),
                        num_levels=index.num_levels, recomputes=(rec,))
    # r freed after m1 reads it through s (level 3); the clones at 5, 6;
    # one buffer of 400 bytes until late at 7.
    assert model.replay(plan).device_timeline.tolist() == [
        resident + b for b in (100, 500, 500, 510, 110, 510, 510, 511, 101)]
