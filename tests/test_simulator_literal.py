"""The simulator on literal graphs (`graph_index.from_edges`) whose memory
use is worked out by hand: exact timelines, peaks, and what is live there.
(`test_simulator.py` checks the same model on TensorFlow graphs.)"""

import pytest

from tflms import analysis
from tflms import graph_index as gi
from tflms import planner
from tflms import simulator

U = 1000


def model_of(index, batch_size=None):
    return simulator.SimulationModel(index, analysis.classify_ops(index),
                                     batch_size)


def chain_graph():
    """x (100 B) -> a (200) -> b (400) -> c (800) -> d (1600), with
    a = matmul(x, read(w)), d = c * k; w a 5000-byte variable, k a 7-byte
    constant (both resident); host = relu(b) on the CPU (50 B), read back
    on the device by back = host + c (10 B).

    Levels: x, w, k 0; read 1; a 2; b 3; c 4, host 4; d 5, back 5.
    Buffers (inclusive levels): x [0, 2], a [2, 3], b [3, 4], c [4, 5],
    d [5, 5], back [5, 5]; the device copy of host:0 [4, 5] (made when
    host runs, freed after back); host:0 on the host [4, 4].
    """
    return gi.from_edges(
        [("x", "Placeholder", {"outputs": [100]}),
         ("w", "VariableV2", {"outputs": [((25, 50), 4)],
                              "variable_bytes": 5000, "stateful": True}),
         ("k", "Const", {"outputs": [7]}),
         ("read", "Identity", {"outputs": [((25, 50), 4)]}),
         ("a", "MatMul", {"outputs": [200]}),
         ("b", "Relu", {"outputs": [400]}),
         ("c", "Relu", {"outputs": [800]}),
         ("host", "Relu", {"outputs": [50], "device": "/cpu:0"}),
         ("d", "Mul", {"outputs": [1600]}),
         ("back", "AddV2", {"outputs": [10]})],
        edges=[("w", "read"), ("x", "a"), ("read", "a"), ("a", "b"),
               ("b", "c"), ("c", "d"), ("k", "d"), ("b", "host"),
               ("host", "back"), ("c", "back")])


def test_chain_peak_in_closed_form():
    index = chain_graph()
    assert index.levels == (0, 0, 0, 1, 2, 3, 4, 4, 5, 5)
    result = model_of(index).replay(None)
    resident = 5000 + 7
    assert result.resident_device_bytes == resident
    assert result.resident_host_bytes == 0
    # Levels 0-5: x; x; x+a; a+b; b+c+copy; c+d+copy+back.
    assert result.device_timeline.tolist() == [
        resident + b for b in (100, 100, 300, 600, 1250, 2460)]
    assert result.peak_device_bytes == resident + 2460
    assert result.peak_level == 5
    assert result.peak_op == "d"
    assert result.live_at_peak == (
        ("<resident variables and constants>", resident), ("d:0", 1600),
        ("c:0", 800), ("host:0 (device copy)", 50), ("back:0", 10))
    assert result.host_timeline.tolist() == [0, 0, 0, 0, 50, 0]
    assert result.peak_host_bytes == 50
    assert result.swapout_bytes == result.swapin_bytes == 0


def test_unknown_batch_dimension_in_a_literal_graph():
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [((None, 10), 4)]}),
         ("y", "MatMul", {"outputs": [((None, 10), 4)]})],
        edges=[("x", "y")])
    with pytest.raises(simulator.BatchSizeError,
                       match=r"^LMS cannot size tensor 'x:0' \(shape "
                             r"\(\?, 10\)\) without the mini-batch size"):
        model_of(index)
    result = model_of(index, batch_size=3).replay(None)
    assert result.device_timeline.tolist() == [120, 240]


def test_shape_vectors_need_no_batch_size_and_counts_are_unknown():
    """A step with static shapes whose gradient computes broadcast
    reduction axes (BroadcastGradientArgs, shape (?), as Keras 3's
    MultiHeadAttention does) is sized without a batch size: the axes are
    at most as many as the longer shape; a Where's rows are counted by the
    data, so their size is unknown, not the batch's."""
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [((4, 6, 16), 4)]}),
         ("sx", "StridedSlice", {"outputs": [((1,), 4)]}),
         ("sy", "StridedSlice", {"outputs": [((0,), 4)]}),
         ("bga", "BroadcastGradientArgs",
          {"outputs": [((None,), 4), ((None,), 4)]}),
         ("sum", "Sum", {"outputs": [((4, 6, 16), 4)]}),
         ("where", "Where", {"outputs": [((None, 3), 8)]})],
        edges=[("x", "sx"), ("x", "sy"), ("sx", "bga"), ("sy", "bga"),
               ("x", "sum"), ("bga:0", "sum"), ("x", "where")])
    for batch_size in (None, 32):
        model = model_of(index, batch_size)
        assert model.tensor_size(index.id_of["bga"], 0) == 4
        assert model.tensor_size(index.id_of["bga"], 1) == 4
        assert model.unknown_tensors == ("where:0",)
        # At sum's level: x, sum and the axes it reads.
        assert model.replay(None).peak_device_bytes == 2 * 4 * 384 + 4


def u_graph(n=4):
    """f_i from f_{i-1} (f_0 = x), g_n from f_n, g_i from g_{i+1} and f_i;
    every tensor U bytes and every op a matrix product, whose output is a
    buffer of its own (no kernel writes it into an input's buffer,
    `tflms.inplace`; `test_inplace.py` checks those that do). Levels: x 0,
    f_i i, g_i 2n+1-i. f_i lives from level i to g_i's level 2n+1-i."""
    ops = [("x", "Placeholder", {"outputs": [U]})]
    edges = []
    for i in range(1, n + 1):
        ops.append(("f%d" % i, "MatMul", {"outputs": [U]}))
        edges.append(("f%d" % (i - 1) if i > 1 else "x", "f%d" % i))
    ops.append(("g%d" % n, "MatMul", {"outputs": [U]}))
    edges.append(("f%d" % n, "g%d" % n))
    for i in range(n - 1, 0, -1):
        ops.append(("g%d" % i, "MatMul", {"outputs": [U]}))
        edges += [("g%d" % (i + 1), "g%d" % i), ("f%d" % i, "g%d" % i)]
    return gi.from_edges(ops, edges)


def test_u_graph_without_lms():
    """Level L (n=4): x [0,1]; f1 [1,8], f2 [2,7], f3 [3,6], f4 [4,5];
    g4 [5,6], g3 [6,7], g2 [7,8], g1 [8,8]. The peak, f1..f4 and g4, is
    (n + 1) U at level n + 1."""
    result = model_of(u_graph()).replay(None)
    assert result.device_timeline.tolist() == [
        U * k for k in (1, 2, 2, 3, 4, 5, 5, 4, 3)]
    assert result.peak_device_bytes == 5 * U
    assert result.peak_level == 5
    assert result.peak_op == "g4"
    assert sorted(name for name, _ in result.live_at_peak) == [
        "f1:0", "f2:0", "f3:0", "f4:0", "g4:0"]


@pytest.mark.parametrize("sync_mode, timeline, peak_level", [
    # f1 lives [1, 2] (until f2 and the swap-out); its copy comes back at
    # level 7 (after the trigger g3) for g1 at 8.
    (0, (1, 2, 2, 2, 3, 4, 4, 4, 3), 5),
    # f2 waits for the swap-out (level 2): every later op moves down one
    # level, and f1 lives [1, 3].
    (1, (1, 2, 1, 2, 2, 3, 4, 4, 4, 3), 6),
    # The swap-in waits on g2 (level 7): it comes back at level 8 and g1
    # moves to level 9; g2 lives [7, 9].
    (2, (1, 2, 2, 2, 3, 4, 4, 3, 2, 3), 5),
])
def test_u_graph_with_one_swap(sync_mode, timeline, peak_level):
    """make_plan with swapout_threshold 5 swaps only f1 (read by g1 seven
    levels later); swapin_ahead 1 picks g3 (level 6) as its trigger. The
    peak drops from 5 U to 4 U."""
    index = u_graph()
    roles = analysis.classify_ops(index)
    plan = planner.make_plan(index, roles,
                             planner.SwapParams(5, 1, 0, sync_mode))
    assert [(index.names[s.producer], [index.names[t] for sin in s.swap_ins
                                       for t in sin.triggers])
            for s in plan.swaps] == [
        ("f1", ["g2"] if sync_mode == 2 else ["g3"])]
    result = simulator.SimulationModel(index, roles).replay(plan)
    assert result.device_timeline.tolist() == [U * k for k in timeline]
    assert result.peak_device_bytes == 4 * U
    assert result.peak_level == peak_level
    assert result.num_levels == len(timeline)
    assert result.swapout_bytes == result.swapin_bytes == U
    # The swap-out's host buffer lives from its level (2) to the swap-in's.
    swapin_level = {0: 7, 1: 8, 2: 8}[sync_mode]
    assert result.host_timeline.tolist() == [
        U if 2 <= lvl <= swapin_level else 0 for lvl in range(len(timeline))]
    assert result.peak_host_bytes == U


def sgd_layer(ref):
    """One SGD layer as `build_index` reads it, with a v1 ref variable
    (``ref``) or a resource variable: y = x @ w, g = x^T @ y (1024 B),
    dx = y @ w^T, then w -= lr * g. w holds 1024 bytes; the reference
    outputs of VariableV2 and ApplyGradientDescent count 0 bytes (item size
    0), as the resource handle does.

    Levels: x, w, lr 0; read 1; y 2; g 3, dx 3; update 4; train 5.
    Buffers: x [0, 3] (512 B), y [2, 3] (512), g [3, 4] (1024), dx [3, 3]
    (512, nobody reads it). Resident: w and lr, 1028 bytes.
    """
    if ref:
        holder = ("w", "VariableV2", {"outputs": [((16, 16), 0)],
                                      "variable_bytes": 1024,
                                      "trainable": True, "stateful": True})
        read = ("read", "Identity", {"outputs": [((16, 16), 4)]})
        update = ("update", "ApplyGradientDescent",
                  {"outputs": [((16, 16), 0)], "stateful": True})
    else:
        holder = ("w", "VarHandleOp", {"outputs": [((), 0)],
                                       "variable_bytes": 1024,
                                       "trainable": True, "stateful": True})
        read = ("read", "ReadVariableOp", {"outputs": [((16, 16), 4)],
                                           "stateful": True})
        update = ("update", "ResourceApplyGradientDescent",
                  {"outputs": [], "stateful": True})
    return gi.from_edges(
        [("x", "Placeholder", {"outputs": [((8, 16), 4)]}), holder,
         ("lr", "Const", {"outputs": [4]}), read,
         ("y", "MatMul", {"outputs": [((8, 16), 4)]}),
         ("g", "MatMul", {"outputs": [((16, 16), 4)]}),
         ("dx", "MatMul", {"outputs": [((8, 16), 4)]}),
         update, ("train", "NoOp", {"outputs": []})],
        edges=[("w", "read"), ("x", "y"), ("read", "y"), ("x", "g"),
               ("y", "g"), ("y", "dx"), ("read", "dx"), ("w", "update"),
               ("lr", "update"), ("g", "update")],
        control_edges=[("update", "train"), ("dx", "train")])


@pytest.mark.parametrize("ref", [True, False])
def test_each_variable_counts_once_whatever_its_kind(ref):
    index = sgd_layer(ref)
    assert index.levels == (0, 0, 0, 1, 2, 3, 3, 4, 5)
    result = model_of(index).replay(None)
    assert result.resident_device_bytes == 1024 + 4
    # Levels 0-5: x; x; x+y; x+y+g+dx; g; nothing.
    assert result.device_timeline.tolist() == [
        1028 + b for b in (512, 512, 1024, 2560, 1024, 0)]
    assert result.peak_device_bytes == 1028 + 2560
    assert dict(result.live_at_peak) == {
        "<resident variables and constants>": 1028, "x:0": 512, "y:0": 512,
        "g:0": 1024, "dx:0": 512}


def test_copy_levels_hold_the_swapped_tensor_and_allocate_its_copy_early():
    """The one-swap plan of `test_u_graph_with_one_swap` (sync_mode 0: f1
    swapped out at level 2, back at level 7 for g1) with copies that take
    time: f1 is still being copied to the host through level 4, so it
    lives [1, 4] instead of [1, 2]; its copy back starts in level 5, so the
    device copy lives [5, 8] instead of [7, 8]. Levels 3 and 4 gain f1,
    levels 5 and 6 the copy: 5 U at level 5 (f2, f3, f4, g4 and the copy),
    as much as without LMS."""
    index = u_graph()
    roles = analysis.classify_ops(index)
    plan = planner.make_plan(index, roles, planner.SwapParams(5, 1, 0, 0))
    model = simulator.SimulationModel(index, roles)
    timed = model.replay(plan, copy_levels=simulator.CopyLevels(
        held_through=(4,), allocated_from=((5,),)))
    assert timed.device_timeline.tolist() == [
        U * k for k in (1, 2, 2, 3, 4, 5, 5, 4, 3)]
    assert timed.peak_device_bytes == 5 * U
    assert timed.peak_level == 5
    assert sorted(name for name, _ in timed.live_at_peak) == [
        "f2:0", "f3:0", "f4:0", "g4:0", "lms/swapin_f1_0 (device copy)"]
    # Levels already inside the instant lifetimes change nothing.
    same = model.replay(plan, copy_levels=simulator.CopyLevels(
        held_through=(1,), allocated_from=((7,),)))
    assert same.device_timeline.tolist() == model.replay(
        plan).device_timeline.tolist()


def test_copy_levels_must_match_the_plan():
    index = u_graph()
    roles = analysis.classify_ops(index)
    plan = planner.make_plan(index, roles, planner.SwapParams(5, 1, 0, 0))
    with pytest.raises(ValueError, match=(
            r"^copy_levels must have one held_through level per swap and "
            r"one allocated_from level per swap-in of the plan \(swap-ins "
            r"per swap \[1\]\); got 2 and \[1, 1\]; make it from the plan's "
            r"own step time \(steptime.copy_levels\)$")):
        simulator.SimulationModel(index, roles).replay(
            plan, copy_levels=simulator.CopyLevels(
                held_through=(4, 4), allocated_from=((5,), (5,))))



def softmax_gradient_graph(product="Mul", square=False):
    """A softmax's gradient far from the softmax: y = Softmax(x) at level
    1, a chain c1..c4 of matrix products to g (level 5), then
    ``m = g * y``, ``s = Sum(m)``, ``d = g - s``, ``out = d * y`` and
    ``end = out @ w``; every tensor U bytes but s (40). With `product` a
    MatMul, ``m`` is a kernel that never writes into an input; with
    `square`, ``m = y * y``."""
    shape = {"outputs": [((10, 25), 4)]}
    ops = [("x", "Placeholder", shape), ("y", "Softmax", shape)]
    edges = [("x", "y")]
    last = "y"
    for i in range(1, 5):
        ops.append(("c%d" % i, "MatMul", shape))
        edges.append((last, "c%d" % i))
        last = "c%d" % i
    ops += [("g", "MatMul", shape), ("m", product, shape),
            ("s", "Sum", {"outputs": [((10, 1), 4)]}), ("d", "Sub", shape),
            ("out", "Mul", shape), ("end", "MatMul", shape)]
    edges += [(last, "g"), ("y" if square else "g", "m"), ("y", "m"),
              ("m", "s"), ("g", "d"), ("s", "d"), ("d", "out"),
              ("y", "out"), ("out", "end")]
    if square:
        edges.append(("g", "end"))
    return gi.from_edges(ops, edges)


def _swap(index, tensor, groups):
    """A `SwapPlan` of `tensor` (a name), each group of its late readers
    (``(name, slot)`` pairs) a swap-in triggered by the op named beside
    it."""
    ids = index.id_of
    return planner.SwapPlan(
        producer=ids[tensor], output=0, nbytes=U, waiters=(),
        swap_ins=tuple(planner.SwapInPlan(
            tuple((ids[c], slot) for c, slot in readers), (ids[trigger],),
            False) for readers, trigger in groups))


def _plan(index, *swaps):
    return planner.Plan(params=planner.SwapParams(1, 1, 0, 0), swaps=swaps,
                        serialization_edges=(), num_levels=index.num_levels)


def test_an_output_is_written_into_the_copy_its_op_alone_reads():
    """Levels: x 0, y 1, c1..c4 2-5, g 6, m 7, s 8, d 9, out 10, end 11.
    One swap-in of y for m and out (after g): g, the copy, m and s live
    at s's level, 3 U and s. Two swap-ins, the first for m alone (after
    g), the second for out (after s): m is written into its copy (the
    runtime's kernel takes a buffer only its launch holds), and the second
    copy comes back once m is gone: 2 U and s, the step's floor."""
    index = softmax_gradient_graph()
    model = model_of(index)
    shared = model.replay(_plan(index, _swap(
        index, "y", [((("m", 1), ("out", 1)), "g")])))
    assert shared.peak_device_bytes == 3 * U + 40
    assert shared.peak_op == "s"
    split = model.replay(_plan(index, _swap(
        index, "y", [((("m", 1),), "g"), ((("out", 1),), "s")])))
    assert split.peak_device_bytes == 2 * U + 40
    assert sorted(name for name, _ in split.live_at_peak) == [
        "g:0", "lms/swapin_y_0 (device copy)", "s:0"]
    assert split.swapin_bytes == 2 * U


def test_a_held_output_holds_the_copy_it_was_written_into():
    """The two swap-ins of the test above, with ``m`` held through level
    10 as a gradient an update on the host reads (`CopyLevels.
    gradients_held_through`, its copy to the host still running): m lives
    in y's first copy, so that copy stays through level 10, beside the
    second copy, d and s: 3 U and s there. Were the hold put on m's own
    buffer, which is never allocated, it would change nothing (2 U and s,
    as without the hold)."""
    index = softmax_gradient_graph()
    model = model_of(index)
    plan = _plan(index, _swap(
        index, "y", [((("m", 1),), "g"), ((("out", 1),), "s")]))
    assert model.replay(plan).device_timeline[10] == 2 * U + 40
    held = model.replay(plan, copy_levels=simulator.CopyLevels(
        held_through=(0,), allocated_from=((99, 99),),
        gradients_held_through=(((index.id_of["m"], 0), 10),)))
    assert held.device_timeline.tolist() == [
        U, U] + [2 * U] * 7 + [2 * U + 40, 3 * U + 40, 2 * U, 2 * U]
    assert [name for name, _ in held.live_at_peak].count(
        "lms/swapin_y_0 (device copy)") == 2


@pytest.mark.parametrize("case", ["matmul", "two_slots", "earlier_slot"])
def test_an_output_is_not_written_into_a_copy_it_cannot_take(case):
    """No kernel writes into the copy: a matrix product; a product that
    reads the copy through both slots (``y * y``); a product whose earlier
    candidate input (slot 0, g) is a swap-in too, which the kernel tries
    first. Each keeps a buffer of its own beside the copy."""
    index = softmax_gradient_graph("MatMul" if case == "matmul" else "Mul",
                                   square=case == "two_slots")
    first = (("m", 0), ("m", 1)) if case == "two_slots" else (("m", 1),)
    swaps = [_swap(index, "y", [(first, "g"), ((("out", 1),), "s")])]
    if case == "earlier_slot":
        swaps.append(_swap(index, "g", [((("m", 0),), "g")]))
    result = model_of(index).replay(_plan(index, *swaps))
    assert result.peak_device_bytes >= 3 * U
