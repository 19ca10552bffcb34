"""The simulator on graphs whose memory use is known in closed form.

Every activation below is a float32 [512, 512] tensor: exactly 1 MiB.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tflms.tf import reader as tf_reader
from tflms import analysis
from tflms import graph_index as gi
from tflms import planner
from tflms import simulator

MIB = 1 << 20


def own_buffer(a, b=None, name=None):
    """An op whose output is a buffer of its own: a matrix product, which no
    kernel writes into an input's buffer (`tflms.inplace`). The closed forms
    here count one buffer per op; `test_inplace.py` checks the ops that
    write in place."""
    return tf.linalg.matmul(a, a if b is None else b, name=name)


def chain(n=6):
    """Forward f1..fn, backward g_n from f_n, g_i from g_{i+1} and f_i,
    each op making a buffer of its own (`own_buffer`).

    Levels: x 0, f_i i, g_n n+1, g_i 2n+1-i. f_i lives from level i to the
    level of g_i, so without LMS the peak is n+1 MiB at level n+1
    (f_1..f_n and g_n).
    """
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
        f = [x]
        for i in range(1, n + 1):
            f.append(own_buffer(f[-1], name="f%d" % i))
        grad = own_buffer(f[n], name="g%d" % n)
        for i in range(n - 1, 0, -1):
            grad = own_buffer(grad, f[i], name="g%d" % i)
    index = tf_reader.build_index(g)
    return g, index, analysis.classify_ops(index)


def op(index, name):
    return index.id_of[name]


def swap_by_hand(index, producer, consumer, trigger):
    """One swap of producer:0 to consumer (slot 1), started by trigger."""
    p, c, t = op(index, producer), op(index, consumer), op(index, trigger)
    return planner.SwapPlan(
        producer=p, output=0, nbytes=MIB,
        swap_ins=(planner.SwapInPlan(((c, 1),), (t,), False),), waiters=())


def plan_of(*swaps):
    return planner.Plan(params=planner.SwapParams(1, 1, 0, 0),
                        swaps=tuple(swaps), serialization_edges=(),
                        num_levels=0)


def test_chain_without_lms_peaks_at_n_plus_one_mib():
    _, index, roles = chain(6)
    result = simulator.SimulationModel(index, roles).replay(None)
    assert result.peak_device_bytes == 7 * MIB
    assert result.peak_level == 7
    assert result.peak_op == "g6"
    assert result.peak_host_bytes == 0
    assert result.resident_device_bytes == 0
    names = [name for name, _ in result.live_at_peak]
    assert sorted(names) == sorted(["f%d:0" % i for i in range(1, 7)]
                                   + ["g6:0"])
    assert all(b == MIB for _, b in result.live_at_peak)
    # Forward: level L holds f_1..f_L (x is freed after level 1).
    assert result.device_timeline[:7].tolist() == [
        MIB, 2 * MIB, 2 * MIB, 3 * MIB, 4 * MIB, 5 * MIB, 6 * MIB]
    assert result.num_levels == 13


def test_one_swap_lowers_the_peak_by_exactly_one_mib():
    _, index, roles = chain(6)
    model = simulator.SimulationModel(index, roles)
    result = model.replay(plan_of(swap_by_hand(index, "f1", "g1", "g3")))
    assert result.peak_device_bytes == 6 * MIB
    # f1's host copy lives from its swap-out (level 2) to its swap-in.
    assert result.peak_host_bytes == MIB
    assert result.swapout_bytes == MIB and result.swapin_bytes == MIB
    # The device copy is live from the swap-in (level 11) to g1 (level 12).
    assert result.device_timeline[11] == 4 * MIB
    assert result.num_levels == 13  # async swap-ins do not move ops


def test_planned_swaps_lower_the_peak_by_exactly_two_mib():
    _, index, roles = chain(6)
    params = planner.SwapParams(swapout_threshold=8, swapin_ahead=1,
                                swapin_groupby=0, sync_mode=0)
    plan = planner.make_plan(index, roles, params)
    swapped = sorted(index.names[s.producer] for s in plan.swaps)
    assert swapped == ["f1", "f2"]  # distances 11 and 9 exceed 8
    result = simulator.SimulationModel(index, roles).replay(plan)
    assert result.peak_device_bytes == 5 * MIB
    assert result.peak_level == 7
    assert result.peak_host_bytes == 2 * MIB


def test_replay_is_deterministic_and_reusable():
    _, index, roles = chain(6)
    model = simulator.SimulationModel(index, roles)
    plan = plan_of(swap_by_hand(index, "f2", "g2", "g4"))
    a, b = model.replay(plan), model.replay(plan)
    assert a.live_at_peak == b.live_at_peak
    assert np.array_equal(a.device_timeline, b.device_timeline)
    assert model.replay(None).peak_device_bytes == 7 * MIB


def test_identity_and_reshape_alias_their_input():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
        a = own_buffer(x, name="a")
        b = tf.identity(a, name="b")
        c = tf.reshape(b, [1024, 256], name="c")
        tf.math.cos(c, name="d")
    index = tf_reader.build_index(g)
    result = simulator.SimulationModel(
        index, analysis.classify_ops(index)).replay(None)
    # x (freed after a) and a (= b = c, and d: cos writes into the buffer
    # its only reader holds): at most x + a.
    # The reshape's shape operand is a Const: 8 bytes, resident.
    assert result.resident_device_bytes == 8
    assert result.peak_device_bytes == 2 * MIB + 8


@pytest.mark.parametrize("handed_on_read", [False, True])
def test_an_identity_n_read_grappler_removes_holds_nothing(handed_on_read):
    # tf.custom_gradient's IdentityN in graph mode hands on the function's
    # input too, which nothing reads: Grappler removes that read before
    # the step runs (GraphIndex.hands_on_unread), so it holds nothing. a's
    # last real reader is b; the IdentityN n (level 5) reads it as well.
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
        a = own_buffer(x, name="a")
        b = own_buffer(a, name="b")
        c = own_buffer(b, name="c")
        d = own_buffer(c, name="d")
        n = tf.raw_ops.IdentityN(input=[d, a], name="n")
        e = own_buffer(n[0], name="e")
        if handed_on_read:
            own_buffer(e, n[1], name="late")
    index = tf_reader.build_index(g)
    assert index.hands_on_unread(op(index, "n"), 1) is not handed_on_read
    result = simulator.SimulationModel(
        index, analysis.classify_ops(index)).replay(None)
    at_d = result.device_timeline[index.levels[op(index, "d")]]
    if handed_on_read:
        # a is held for `late`: a, c and d at d's level.
        assert result.peak_device_bytes == at_d == 3 * MIB
        assert "a:0" in [name for name, _ in result.live_at_peak]
    else:
        # a is freed after b: c and d at d's level, two buffers at most.
        assert result.peak_device_bytes == at_d == 2 * MIB


def test_variables_are_resident_and_reads_add_nothing():
    g = tf.Graph()
    with g.as_default():
        v = tf.compat.v1.get_variable(
            "w", [512, 512], initializer=tf.compat.v1.zeros_initializer(),
            use_resource=True)
        x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
        own_buffer(x, v.read_value(), name="y")
    index = tf_reader.build_index(g)
    roles = analysis.classify_ops(index)
    model = simulator.SimulationModel(index, roles)
    assert model.resident_device_bytes >= MIB
    result = model.replay(None)
    # Resident: the variable only; its initializer (Consts, a 1 MiB Fill and
    # the Assign) runs in its own session call, not in a step.
    assert model.resident_device_bytes == MIB
    init = {index.names[i] for i in model.initializer_ops}
    assert {"w/Initializer/zeros", "w/Assign"} <= init
    # The step holds x and y (level 2) on top of the variable; the
    # ReadVariableOp (level 1) adds nothing.
    assert result.peak_device_bytes == 3 * MIB
    assert result.peak_op == "y"
    # Peak includes x, y and the variable once, not the ReadVariableOp.
    names = [n for n, _ in result.live_at_peak]
    assert not any("ReadVariableOp" in n or "Read/" in n for n in names)


def test_ref_variables_are_resident_and_their_references_add_nothing():
    """A v1 ref variable w (VariableV2, 1 MiB), y = x * w, assign(w, y),
    z = identity(assign) * 2, q = z x (a matrix product, `own_buffer`).

    Levels: x, w 0; w/read 1; y 2; assign 3; after 4; z 5; q 6. The
    VariableV2 and Assign outputs are references to w's buffer (0 bytes in
    the index), so w counts once, as resident; identity(assign) forwards
    that reference. Buffers: x [0, 6], y [2, 3], z [5, 6], q [6, 6].
    """
    g = tf.Graph()
    with g.as_default():
        w = tf.compat.v1.get_variable(
            "w", [512, 512], initializer=tf.compat.v1.zeros_initializer(),
            use_resource=False)
        x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
        y = tf.math.multiply(x, w, name="y")
        assign = tf.compat.v1.assign(w, y, name="assign")
        z = tf.math.multiply(tf.identity(assign, name="after"), 2.0, name="z")
        own_buffer(z, x, name="q")
    index = tf_reader.build_index(g)
    assert index.output_itemsizes[index.id_of["w"]] == (0,)
    assert index.output_itemsizes[index.id_of["assign"]] == (0,)
    assert index.variable_bytes[index.id_of["w"]] == MIB
    model = simulator.SimulationModel(index, analysis.classify_ops(index))
    result = model.replay(None)
    assert model.resident_device_bytes == MIB + 4  # w and the constant 2.0
    assert (result.device_timeline - model.resident_device_bytes).tolist() \
        == [m * MIB for m in (1, 1, 2, 2, 1, 2, 3)]
    assert result.peak_op == "q"


def test_cpu_tensor_read_on_device_gets_a_device_copy():
    g = tf.Graph()
    with g.as_default():
        with tf.device("/cpu:0"):
            x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
            h = tf.math.sin(x, name="h")
        tf.math.cos(h, name="d")
    index = tf_reader.build_index(g)
    result = simulator.SimulationModel(
        index, analysis.classify_ops(index)).replay(None)
    # Device: the copy of h (from level 1) and d (level 2).
    assert result.peak_device_bytes == 2 * MIB
    assert result.device_timeline.tolist() == [0, MIB, 2 * MIB]
    # Host: x and h together at level 1.
    assert result.peak_host_bytes == 2 * MIB


def test_unknown_batch_dimension_needs_the_batch_size():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 224, 224, 3],
                                     name="x")
        tf.math.sin(x, name="y")
    index = tf_reader.build_index(g)
    roles = analysis.classify_ops(index)
    with pytest.raises(simulator.BatchSizeError) as err:
        simulator.SimulationModel(index, roles)
    message = str(err.value)
    assert "'x:0'" in message and "(?, 224, 224, 3)" in message
    assert "lms.batch_size = <your mini-batch size>" in message
    assert "swapout_threshold, swapin_ahead and swapin_groupby" in message
    model = simulator.SimulationModel(index, roles, batch_size=2)
    # y = sin(x) is written into x's buffer (x's only reader): one tensor
    # of batch 2.
    assert model.replay(None).peak_device_bytes == 2 * 224 * 224 * 3 * 4


def test_serialization_edges_move_ops_to_later_levels():
    """An extra edge that no path implies moves its target (and only it)."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
        f1 = tf.math.sin(x, name="f1")
        f2 = tf.math.sin(f1, name="f2")
        f3 = tf.math.sin(f2, name="f3")
        side = tf.math.cos(x, name="side")
        tf.math.add(f3, side, name="out")
    index = tf_reader.build_index(g)
    roles = analysis.classify_ops(index)
    side_id, f2_id = op(index, "side"), op(index, "f2")
    before = simulator.SimulationModel(index, roles).replay(None)
    assert before.levels.tolist()[side_id] == 1
    model = simulator.SimulationModel(index, roles,
                                      extra_edges=((f2_id, side_id),))
    after = model.replay(None)
    assert after.levels.tolist()[side_id] == 3
    assert after.levels.tolist()[op(index, "f3")] == 3
    assert after.num_levels == before.num_levels == 5


def test_planned_edges_are_replayed_with_the_graphs_own():
    """An index with planned control edges (serialization) replays at the
    levels those edges give, without being told the edges again."""
    _, index, roles = chain(3)
    same = gi.with_planned_edges(index, [(op(index, "f3"), op(index, "g3"))])
    assert same.levels == index.levels  # already an edge: no change
    assert same.planned_edges == ((op(index, "f3"), op(index, "g3")),)
    x, f1 = op(index, "x"), op(index, "f1")
    moved = gi.with_planned_edges(index, [(op(index, "f2"), op(index, "g2")),
                                          (op(index, "f3"), op(index, "g2"))])
    model = simulator.SimulationModel(moved, analysis.classify_ops(moved))
    result = model.replay(None)
    assert result.levels.tolist()[x] == 0 and result.levels.tolist()[f1] == 1
    assert result.levels.tolist() == list(moved.levels)


def test_levels_that_no_edge_explains_are_refused():
    """Levels changed without their edges would make the replay disagree
    with the plan's levels: the simulator says how to make such an index."""
    _, index, roles = chain(3)
    g2 = op(index, "g2")
    levels = list(index.levels)
    levels[g2] += 2
    hidden = dataclasses.replace(index, levels=tuple(levels))
    with pytest.raises(ValueError, match=r"index's levels do not follow "
                       r"from its edges \(e.g. g2 is at level %d, its edges "
                       r"put it at %d\); add planned control edges with "
                       r"graph_index.with_planned_edges" % (
                           levels[g2], index.levels[g2])):
        simulator.SimulationModel(hidden, roles)


def identity_n_graph():
    """a = f(x) is read only through IdentityN, like the gradients Keras'
    optimizers pass through one IdentityN before the updates (every op but
    the IdentityN and the sums makes a buffer of its own, `own_buffer`).

    Levels: x 0, a 1, b 2, c 3, d 4, e 5, n = IdentityN(a, e) 6, the two
    sums 7. Without LMS a lives from 1 to 7 (its alias n:0 is read at 7).
    """
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [512, 512], name="x")
        a = own_buffer(x, name="a")
        h = a
        for name in "bcde":
            h = own_buffer(h, name=name)
        n = tf.identity_n([a, h], name="n")
        tf.reduce_sum(n[0], name="sum_a")
        tf.reduce_sum(n[1], name="sum_e")
    index = tf_reader.build_index(g)
    return index, analysis.classify_ops(index)


def test_swap_through_an_alias_frees_the_original():
    """Regression: a tensor read only by IdentityN was kept on the device
    after its swap-out (the IdentityN output's readers still counted as
    readers of the original), so its swap-in copy came on top and every such
    swap raised the peak: Keras ResNet50 (64x64, batch 4, Adam) needed
    0.367 GiB without LMS but 0.438 GiB with its smallest plan."""
    index, roles = identity_n_graph()
    model = simulator.SimulationModel(index, roles)
    without = model.replay(None)
    activations = (without.device_timeline
                   - without.resident_device_bytes).tolist()
    # a plus the chain's two newest tensors.
    assert activations == [MIB, 2 * MIB, 2 * MIB, 3 * MIB, 3 * MIB, 3 * MIB,
                           2 * MIB, 2 * MIB + 8]
    swap = planner.SwapPlan(
        producer=op(index, "a"), output=0, nbytes=MIB,
        swap_ins=(planner.SwapInPlan(((op(index, "n"), 0),),
                                     (op(index, "e"),), False),),
        waiters=())
    result = model.replay(plan_of(swap))
    # a is freed after b and the swap-out (level 2); its copy comes back
    # after e (level 6) and lives until sum_a reads the IdentityN output
    # that forwards it (level 8): never more than two tensors at once.
    assert (result.device_timeline - result.resident_device_bytes).tolist() \
        == [MIB, 2 * MIB, 2 * MIB, 2 * MIB, 2 * MIB, 2 * MIB, 2 * MIB,
            2 * MIB, 2 * MIB + 8]
    assert result.peak_device_bytes < without.peak_device_bytes
    names = [name for name, _ in result.live_at_peak]
    assert "a:0" not in names
    assert any(name.startswith("lms/swapin_a_0") for name in names)


@pytest.mark.parametrize("name, kwargs", [
    ("cnn_bn", dict(image=12, channels=6, depth=4, batch=2)),
    ("transformer_encoder", dict(layers=2, seq=8, d_model=16, heads=2,
                                 batch=2)),
    ("unet3d", dict(volume=8, base_filters=2, depth=2)),
])
def test_incremental_levels_equal_a_fresh_sort(name, kwargs, monkeypatch):
    """A replay derives the plan's levels from the graph's by levelling
    what its new nodes reach (`dag_levels.risen_levels`); over many plans
    (thresholds, lookahead, grouping, every sync mode, with and without
    serialization edges) those equal Kahn levels computed from scratch,
    and the fast path is taken at least once."""
    from zoo import models
    from tflms import dag_levels
    graph = tf.Graph()
    with graph.as_default():
        model = models.BUILDERS[name](seed=1, **kwargs)
    index = tf_reader.build_index(model.graph)
    roles = analysis.classify_ops(index)
    incremental = dag_levels.risen_levels
    outcomes = []

    def checked(levels, succ, tails, heads):
        got = incremental(levels, succ, tails, heads)
        if got is not None:
            assert got == dag_levels.kahn_levels(len(succ), succ)
        outcomes.append(got is not None)
        return got

    monkeypatch.setattr(dag_levels, "risen_levels", checked)
    sim = simulator.SimulationModel(index, roles, batch_size=2)
    ser = planner.serialization_edges(index, roles, (slice(0, None),))[0]
    for threshold in (1, 2, 5):
        for ahead in (1, 3):
            for groupby in (0, 4):
                for sync in range(4):
                    params = planner.SwapParams(threshold, ahead, groupby,
                                                sync)
                    plan = planner.make_plan(index, roles, params,
                                             batch_size=2)
                    assert plan.swaps
                    sim.replay(plan)
                    sim.replay(dataclasses.replace(
                        plan, serialization_edges=tuple(ser)))
    # Small graphs often need the full sort (a swap-in two levels after its
    # source moves its consumer, and everything after it); some plans here
    # move nothing else.
    assert any(outcomes), outcomes
