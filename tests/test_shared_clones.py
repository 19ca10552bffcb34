"""A recompute reading another recompute's clone instead of cloning the same
op again (``('recompute', ...)`` sources): what `planner.Recomputer.plan` and
`Recomputer.with_shared_clones` plan, the simulator's memory for it in closed
form, and the rewrite in a real graph (same values, the clones run, a plan
whose order cannot work refused before any edit)."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tflms.tf import reader as tf_reader
from tflms import analysis
from tflms import graph_index as gi
from tflms import planner
from tflms.tf import rewriter
from tflms import simulator

PARAMS = planner.SwapParams(1, 1, 0, 0)


def two_readers():
    """bn(conv(x)) read by z = relu and w = sigmoid, each read late: z by gz,
    w by gw one level later; conv's output by gbn after both (so it stays
    on the device, and a clone of bn can read it).

    Levels: x 0, conv 1, bn 2, z and w 3, m1..m6 4..9, gz 10, gw 11,
    gbn 12.
    """
    ops = [("x", "Placeholder", {"outputs": [100]}),
           ("conv", "Conv2D", {"outputs": [1000]}),
           ("bn", "FusedBatchNormV3", {"outputs": [2000, 10, 10],
                                       "bn_is_training": True}),
           ("z", "Relu", {"outputs": [4000]}),
           ("w", "Sigmoid", {"outputs": [3000]})]
    edges = [("x", "conv"), ("conv", "bn"), ("bn:0", "z"), ("bn:0", "w"),
             ("z", "m1"), ("w", "m1")]
    for k in range(1, 7):
        ops.append(("m%d" % k, "Tanh", {"outputs": [10]}))
        if k > 1:
            edges.append(("m%d" % (k - 1), "m%d" % k))
    ops += [("gz", "ReluGrad", {"outputs": [1]}),
            ("gw", "SigmoidGrad", {"outputs": [1]}),
            ("gbn", "FusedBatchNormGradV3", {"outputs": [1]})]
    edges += [("m6", "gz"), ("z", "gz"), ("gz", "gw"), ("w", "gw"),
              ("gw", "gbn"), ("conv", "gbn")]
    return gi.from_edges(ops, edges)


def late_readers(index, tensor, reader):
    p = index.id_of[tensor]
    return tuple((c, s) for c, s in index.consumers[p][0]
                 if c == index.id_of[reader])


def recompute(index, tensor, reader, **kwargs):
    return planner.Recomputer(index, analysis.classify_ops(index)).plan(
        index.id_of[tensor], 0, late_readers(index, tensor, reader),
        **kwargs)


def plan_of(index, *recomputes):
    return planner.Plan(params=PARAMS, swaps=(), serialization_edges=(),
                        num_levels=index.num_levels, recomputes=recomputes)


def test_a_later_recompute_reads_the_earlier_ones_clone():
    index = two_readers()
    assert index.levels == (0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
    n = index.id_of
    first = recompute(index, "z", "gz")
    assert first.ops == (n["bn"], n["z"])
    # Alone, w's recompute clones bn too.
    alone = recompute(index, "w", "gw")
    assert alone.ops == (n["bn"], n["w"])
    assert alone.inputs == ((("tensor", n["conv"], 0),), (("clone", 0, 0),))
    # With z's recompute in the plan (its clones run before gz at 10, gw is
    # at 11), w's reads z's clone of bn (clone 0, output 0) and clones w
    # only, one level ahead of gw: m6 at 9 is its trigger.
    shared = recompute(index, "w", "gw", recomputes=(first,))
    assert shared == planner.RecomputePlan(
        producer=n["w"], output=0, nbytes=3000, ops=(n["w"],),
        inputs=((("recompute", n["z"], 0, 0, 0),),),
        consumers=((n["gw"], 1),), trigger=n["m6"])
    # A recompute whose readers come first cannot read the clones of one
    # that runs after it.
    assert recompute(index, "z", "gz", recomputes=(alone,)) == first


def test_the_shared_clone_is_kept_until_it_is_read_in_closed_form():
    index = two_readers()
    model = simulator.SimulationModel(index, analysis.classify_ops(index))
    first = recompute(index, "z", "gz")
    shared = recompute(index, "w", "gw", recomputes=(first,))
    alone = recompute(index, "w", "gw")
    # Both plans: conv 1000 until gbn; z and w freed after m1 (4); the
    # m-chain one 10-byte buffer; z's clone of bn at 8 (after m4, its
    # trigger), 2000 + 10 + 10, the statistics unread; z's clone at 9,
    # 4000; w's clone at 10, 3000, read by gw at 11 with gz's 1 byte.
    # Shared: bn's clone (2000) is kept until w's clone reads it at 10,
    # and no second clone of bn is made: level 9 holds conv, bn's clone,
    # z's clone and m5: 1000 + 2000 + 4000 + 10.
    assert model.replay(plan_of(index, first, shared)) \
        .device_timeline.tolist() == [
            100, 1100, 3020, 10000, 8010, 1010, 1010, 1010, 3030, 7010,
            10011, 4001, 1002]
    # Not shared: w's own clone of bn at 9 (after m5) beside z's: level 9
    # holds 2020 more; at 10 the second bn clone replaces the first.
    assert model.replay(plan_of(index, first, alone)) \
        .device_timeline.tolist() == [
            100, 1100, 3020, 10000, 8010, 1010, 1010, 1010, 3030, 9030,
            10011, 4001, 1002]


def test_with_shared_clones_plans_again_in_the_order_clones_run():
    index = two_readers()
    first = recompute(index, "z", "gz")
    alone = recompute(index, "w", "gw")
    shared = recompute(index, "w", "gw", recomputes=(first,))
    # A search that took w's recompute first holds both bn clones.
    plan = plan_of(index, alone, first)
    roles = analysis.classify_ops(index)
    offered = []

    def accept(candidate, current):
        offered.append((candidate.recomputes, current.recomputes))
        return True

    again = planner.Recomputer(index, roles).with_shared_clones(plan, accept)
    assert again.recomputes == (first, shared)
    assert offered == [((first, shared), (alone, first))]
    refused = planner.Recomputer(index, roles).with_shared_clones(
        plan, lambda candidate, current: False)
    assert refused is plan
    # Nothing cloned twice: nothing to offer.
    single = plan_of(index, first)
    assert planner.Recomputer(index, roles).with_shared_clones(
        single, accept) is single
    assert len(offered) == 1


def tf_two_readers():
    """a = relu(x) read by z = tanh(a) and w = sigmoid(a), each read late
    (gz, then gw); x is read at the end, so clones can read it."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
        a = tf.nn.relu(x, name="a")
        z = tf.math.tanh(a, name="z")
        w = tf.math.sigmoid(a, name="w")
        m = tf.math.add(z, w, name="m1")
        for k in range(2, 7):
            m = tf.math.sin(m, name="m%d" % k)
        gz = tf.math.multiply(m, z, name="gz")
        gw = tf.math.multiply(gz, w, name="gw")
        tf.math.multiply(gw, x, name="out")
    return graph


def test_a_shared_clone_is_rewritten_runs_and_computes_the_same():
    feed = np.linspace(-2, 2, 16, dtype=np.float32).reshape(4, 4)
    graph = tf_two_readers()
    with tf.compat.v1.Session(graph=graph) as sess:
        expected = sess.run("out:0", {"x:0": feed})
    graph = tf_two_readers()
    index = tf_reader.build_index(graph)
    n = index.id_of
    first = recompute(index, "z", "gz")
    shared = recompute(index, "w", "gw", recomputes=(first,))
    assert first.ops == (n["a"], n["z"])
    assert shared.ops == (n["w"],)
    assert shared.inputs == ((("recompute", n["z"], 0, 0, 0),),)
    result = rewriter.apply_plan(graph, index, plan_of(index, first, shared),
                                 "/cpu:0")
    assert len(result.recompute_ops) == 3
    w_clone = graph.get_operation_by_name(result.recompute_ops[2])
    a_clone = graph.get_operation_by_name(result.recompute_ops[0])
    assert w_clone.type == "Sigmoid" and a_clone.type == "Relu"
    assert w_clone.inputs[0] is a_clone.outputs[0]
    assert graph.get_operation_by_name("gw").inputs[1] is w_clone.outputs[0]
    options = tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    metadata = tf.compat.v1.RunMetadata()
    # Grappler would fold the clones into their twins: off, so they run.
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        got = sess.run("out:0", {"x:0": feed}, options=options,
                       run_metadata=metadata)
    np.testing.assert_array_equal(got, expected)
    ran = {s.node_name for d in metadata.step_stats.dev_stats
           for s in d.node_stats}
    assert set(result.recompute_ops) <= ran


def test_a_plan_reading_a_clone_not_made_yet_is_refused_unedited():
    graph = tf_two_readers()
    index = tf_reader.build_index(graph)
    first = recompute(index, "z", "gz")
    shared = recompute(index, "w", "gw", recomputes=(first,))
    before = graph.as_graph_def().SerializeToString(deterministic=True)
    with pytest.raises(ValueError, match=(
            r"^the recompute of w:0 reads clone 0 of the recompute of z:0, "
            r"which no earlier recompute of the plan makes; nothing was "
            r"edited$")):
        rewriter.apply_plan(graph, index, plan_of(index, shared, first),
                            "/cpu:0")
    assert graph.as_graph_def().SerializeToString(
        deterministic=True) == before


def chain_read_twice():
    """p = relu(x), t = sigmoid(p), u = tanh(t); u read late by gu, t later
    by gt; x read last (so clones can read it). Levels: x 0, p 1, t 2,
    u 3, m1..m6 4..9, gu 10, gt 11, out 12."""
    ops = [("x", "Placeholder", {"outputs": [100]}),
           ("p", "Relu", {"outputs": [1000]}),
           ("t", "Sigmoid", {"outputs": [1000]}),
           ("u", "Tanh", {"outputs": [1000]})]
    edges = [("x", "p"), ("p", "t"), ("t", "u"), ("u", "m1")]
    for k in range(1, 7):
        ops.append(("m%d" % k, "Sin", {"outputs": [10]}))
        if k > 1:
            edges.append(("m%d" % (k - 1), "m%d" % k))
    ops += [("gu", "TanhGrad", {"outputs": [1]}),
            ("gt", "SigmoidGrad", {"outputs": [1]}),
            ("out", "AddV2", {"outputs": [1]})]
    edges += [("m6", "gu"), ("u", "gu"), ("gu", "gt"), ("t", "gt"),
              ("gt", "out"), ("x", "out")]
    return gi.from_edges(ops, edges)


def test_a_swap_recomputes_read_is_recomputed_with_them_when_unpinned():
    index = chain_read_twice()
    assert index.levels == (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
    n = index.id_of
    roles = analysis.classify_ops(index)
    # t swapped for gt, its swap-in started after m2 (5): on the device
    # when u's recompute runs before gu, which reads it.
    swap_t = planner.SwapPlan(
        producer=n["t"], output=0, nbytes=1000,
        swap_ins=(planner.SwapInPlan(((n["gt"], 1),), (n["m2"],), False),),
        waiters=())
    rec_u = recompute(index, "u", "gu", swaps=(swap_t,))
    assert rec_u.inputs == ((("swapin", n["t"], 0, 0),),)
    plan = dataclasses.replace(plan_of(index, rec_u), swaps=(swap_t,))

    def accept(candidate, current):
        return True

    # The search keeps a swap a recompute reads...
    assert planner.Recomputer(index, roles).with_recomputes(
        plan, accept) is plan
    # ...unless unpinned: u's recompute clones p and t from x, and t's
    # recompute reads its clone of p (clone 0) and clones t alone.
    unpinned = planner.Recomputer(index, roles).with_recomputes(
        plan, accept, unpin=True)
    assert unpinned.swaps == ()
    again, rec_t = unpinned.recomputes
    assert again.ops == (n["p"], n["t"], n["u"])
    assert again.inputs[0] == (("tensor", n["x"], 0),)
    assert rec_t.ops == (n["t"],)
    assert rec_t.inputs == ((("recompute", n["u"], 0, 0, 0),),)
    assert rec_t.consumers == ((n["gt"], 1),)
    result = simulator.SimulationModel(index, roles).replay(unpinned)
    assert result.swapout_bytes == result.swapin_bytes == 0
    assert result.recompute_bytes == 2000
