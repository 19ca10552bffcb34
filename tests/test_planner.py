"""make_plan, deferral and serialization on literal graphs
(`graph_index.from_edges`): which tensors are swapped, how their readers are
grouped, what starts each swap-in and what waits. Levels are given in each
graph's docstring; every expectation follows from them by hand."""

import pytest

from tflms import analysis
from tflms import graph_index as gi
from tflms import planner
from tflms import settings

KB = 1000
MAT = ((4, 8), 4)  # a rank-2 float32 tensor of 128 bytes


def plan_for(index, threshold, ahead=1, groupby=0, sync_mode=0, **kwargs):
    roles = analysis.classify_ops(index)
    return planner.make_plan(
        index, roles,
        planner.SwapParams(threshold, ahead, groupby, sync_mode), **kwargs)


def describe(index, plan):
    """Each swap as (tensor, [(reader names, trigger names, synchronous)],
    waiter names), with names instead of ids."""
    name = index.names
    return [
        ("%s:%d" % (name[s.producer], s.output),
         [(tuple(name[c] for c, _ in sin.consumers),
           tuple(name[t] for t in sin.triggers), sin.synchronous)
          for sin in s.swap_ins],
         tuple(name[w] for w in s.waiters))
        for s in plan.swaps]


def u_graph(n=6, devices=None, side=False):
    """Forward f1..fn = sin, backward g_n = cos(f_n), g_i = g_{i+1} * f_i.

    Levels: x 0, f_i i, g_i 2n+1-i. f_i is read by g_i (slot 1) at distance
    2n+1-2i: 11, 9, 7, 5, 3, 1 for n=6. With `side`, an op
    ``side = relu(g4)`` (level 10, an id below g3's) is a *control* input of
    g1, so it is an ancestor of g1 but not a data ancestor.
    """
    devices = devices or {}
    ops = [("x", "Placeholder", {"outputs": [KB]})]
    edges = []
    prev = "x"
    for i in range(1, n + 1):
        ops.append(("f%d" % i, "Sin", {"outputs": [KB]}))
        edges.append((prev, "f%d" % i))
        prev = "f%d" % i
    ops.append(("g%d" % n, "Cos", {"outputs": [KB]}))
    edges.append(("f%d" % n, "g%d" % n))
    for i in range(n - 1, 0, -1):
        ops.append(("g%d" % i, "Mul", {"outputs": [KB]}))
        edges += [("g%d" % (i + 1), "g%d" % i), ("f%d" % i, "g%d" % i)]
        if side and i == 4:
            ops.append(("side", "Relu", {"outputs": [KB]}))
            edges.append(("g4", "side"))
    ops = [(name, t, dict(facts, device=devices[name]))
           if name in devices else (name, t, facts)
           for name, t, facts in ops]
    return gi.from_edges(ops, edges,
                         control_edges=[("side", "g1")] if side else ())


def test_u_graph_levels():
    index = u_graph(side=True)
    level = dict(zip(index.names, index.levels))
    assert [level["f%d" % i] for i in range(1, 7)] == [1, 2, 3, 4, 5, 6]
    assert [level["g%d" % i] for i in range(6, 0, -1)] == [
        7, 8, 9, 10, 11, 12]
    assert level["side"] == 10
    assert index.id_of["side"] < index.id_of["g3"]


@pytest.mark.parametrize("threshold, swapped, unplanned", [
    (0, ["f1", "f2", "f3", "f4", "f5"], 11),
    (1, ["f1", "f2", "f3", "f4", "f5"], 0),
    (4, ["f1", "f2", "f3", "f4"], 0),
    (6, ["f1", "f2", "f3"], 0),
    (9, ["f1"], 0),
    (10, ["f1"], 0),
    (11, [], 0),
])
def test_threshold_selects_tensors_by_level_distance(threshold, swapped,
                                                     unplanned):
    """A tensor is swapped for its readers more than `threshold` levels
    after it. With threshold 0 the edges of distance 1 qualify too, but no
    op can hold back a swap-in for a reader one level later (no trigger
    fits, and the reader's other input is no later than the source): those
    11 groups (f_i -> f_i+1, f6 -> g6, g_i+1 -> g_i) are left unplanned,
    and f6 (read only at distance 1) is not swapped."""
    index = u_graph()
    plan = plan_for(index, threshold)
    assert [t for t, _, _ in describe(index, plan)] == [
        name + ":0" for name in swapped]
    assert plan.unplanned_groups == unplanned


def test_threshold_4_swap_ins_and_triggers():
    """f_i -> g_i with swapin_ahead=1: the trigger is the latest data
    ancestor of g_i below level(g_i) - 1, which is g_{i+2}."""
    index = u_graph()
    plan = plan_for(index, 4)
    assert describe(index, plan) == [
        ("f1:0", [(("g1",), ("g3",), False)], ()),
        ("f2:0", [(("g2",), ("g4",), False)], ()),
        ("f3:0", [(("g3",), ("g5",), False)], ()),
        ("f4:0", [(("g4",), ("g6",), False)], ()),
    ]
    assert [s.nbytes for s in plan.swaps] == [KB] * 4
    assert plan.swapout_bytes() == plan.swapin_bytes() == 4 * KB
    assert plan.num_levels == 13
    assert plan.unplanned_groups == 0


@pytest.mark.parametrize("ahead, trigger, synchronous", [
    (1, "g3", False),   # below level 11: level 10
    (3, "g5", False),   # below level 9: level 8
    (6, "f5", False),   # below level 6: level 5, on the forward side
    (10, "g2", True),   # no level between f1 and 12 - 10: synchronous
])
def test_swapin_ahead_moves_the_trigger(ahead, trigger, synchronous):
    """For f1 -> g1 (level 12) the trigger sits below level 12 - ahead. When
    no level is left between the source and that, the swap-in waits on the
    consumer's other inputs (g2) instead."""
    index = u_graph()
    plan = plan_for(index, 10, ahead=ahead)
    assert describe(index, plan) == [
        ("f1:0", [(("g1",), (trigger,), synchronous)], ())]


def test_trigger_is_a_data_ancestor():
    """g3 may not start the swap-in for g1 (other device); the latest op
    below level 11 is then `side` (level 10, a control input of g1), but
    only data ancestors may trigger, so the trigger is g4 (level 9)."""
    index = u_graph(side=True, devices={"g3": "/device:GPU:1"})
    g1 = index.id_of["g1"]
    control_ancestors = analysis.ancestors_within(index, g1, 10)
    assert index.id_of["side"] in control_ancestors
    plan = plan_for(index, 10, ahead=1)
    assert describe(index, plan) == [
        ("f1:0", [(("g1",), ("g4",), False)], ())]


@pytest.mark.parametrize("sync_mode, swap_in, waiters", [
    (0, (("g1",), ("g3",), False), ()),
    # Sync swap-out: the tensor's other readers wait for the swap-out.
    (1, (("g1",), ("g3",), False), ("f2",)),
    # Sync swap-in: it waits on the consumer's inputs above the source.
    (2, (("g1",), ("g2",), True), ()),
    (3, (("g1",), ("g2",), True), ("f2",)),
])
def test_sync_modes(sync_mode, swap_in, waiters):
    index = u_graph()
    plan = plan_for(index, 10, sync_mode=sync_mode)
    assert describe(index, plan) == [("f1:0", [swap_in], waiters)]
    assert plan.params.sync_swapout == (sync_mode in (1, 3))
    assert plan.params.sync_swapin == (sync_mode in (2, 3))


def test_only_tensors_limits_the_plan():
    index = u_graph()
    plan = plan_for(index, 4, only_tensors={(index.id_of["f2"], 0)})
    assert describe(index, plan) == [("f2:0", [(("g2",), ("g4",), False)],
                                      ())]


def spine_graph(readers, branch=0, controls=()):
    """x -> s1 -> ... -> s16 (s_k at level k); t = relu(x) (level 1, 1 KB).

    `readers` maps a reader name to the spine op it also reads: reader
    ``c = mul(s_k, t)`` sits at level k + 1 and reads t at slot 1. A
    spine name ``b_k`` means a second branch x -> b1 -> ... -> b_branch.
    `controls` are extra (from, to) control edges.
    """
    ops = [("x", "Placeholder", {"outputs": [MAT]}),
           ("t", "Relu", {"outputs": [KB]})]
    edges = [("x", "t")]
    for prefix, length in (("s", 16), ("b", branch)):
        prev = "x"
        for k in range(1, length + 1):
            ops.append(("%s%d" % (prefix, k), "Sin", {"outputs": [MAT]}))
            edges.append((prev, "%s%d" % (prefix, k)))
            prev = "%s%d" % (prefix, k)
    for name, spine in readers.items():
        ops.append((name, "Mul", {"outputs": [MAT]}))
        edges += [(spine, name), ("t", name)]
    return gi.from_edges(ops, edges, control_edges=controls)


FOUR_READERS = {"c5": "s4", "c6": "s5", "c9": "s8", "c15": "s14"}


@pytest.mark.parametrize("groupby, expected", [
    (0, [(("c5",), ("s3",)), (("c6",), ("s4",)), (("c9",), ("s7",)),
         (("c15",), ("s13",))]),
    (1, [(("c5", "c6"), ("s3",)), (("c9",), ("s7",)),
         (("c15",), ("s13",))]),
    (3, [(("c5", "c6", "c9"), ("s3",)), (("c15",), ("s13",))]),
    (5, [(("c5", "c6", "c9"), ("s3",)), (("c15",), ("s13",))]),
    (6, [(("c5", "c6", "c9", "c15"), ("s3",))]),
])
def test_swapin_groupby_groups_readers_by_level_gaps(groupby, expected):
    """t is read at levels 5, 6, 9 and 15 (gaps 1, 3, 6). A group starts
    when the gap to the previous reader exceeds `swapin_groupby`; its
    trigger is found for its first reader (level L: s_{L-2})."""
    index = spine_graph(FOUR_READERS)
    plan = plan_for(index, 3, groupby=groupby)
    assert describe(index, plan) == [
        ("t:0", [readers + (False,) for readers in expected], ())]
    assert all(slot == 1 for s in plan.swaps for sin in s.swap_ins
               for _, slot in sin.consumers)


def test_sync_swapin_ignores_groupby():
    index = spine_graph(FOUR_READERS)
    plan = plan_for(index, 3, groupby=6, sync_mode=2)
    assert describe(index, plan) == [("t:0", [
        (("c5",), ("s4",), True), (("c6",), ("s5",), True),
        (("c9",), ("s8",), True), (("c15",), ("s14",), True)], ())]


def test_a_group_splits_where_its_trigger_cannot_reach():
    """cx = mul(b5, t) is at level 6 like c6, so groupby=1 puts c5, c6 and
    cx in one group; its trigger s3 reaches c6 but not cx (another
    branch), so cx gets a swap-in of its own, started by b4."""
    index = spine_graph({"c5": "s4", "c6": "s5", "cx": "b5"}, branch=5)
    plan = plan_for(index, 3, groupby=1)
    assert describe(index, plan) == [("t:0", [
        (("c5", "c6"), ("s3",), False), (("cx",), ("b4",), False)], ())]


def test_groups_with_the_same_trigger_are_merged():
    """c6 = mul(s5, t) (level 6) and c9 = mul(s4, t) held at level 9 by a
    control edge from s8. With groupby=0 they are two groups, but both
    triggers are s4 (c9's latest data ancestor is s4), so they share one
    swap-in. (s4 -> c9 is long too; only t is asked for.)"""
    index = spine_graph({"c6": "s5", "c9": "s4"}, controls=[("s8", "c9")])
    assert index.levels[index.id_of["c9"]] == 9
    plan = plan_for(index, 3, groupby=0,
                    only_tensors={(index.id_of["t"], 0)})
    assert describe(index, plan) == [
        ("t:0", [(("c6", "c9"), ("s4",), False)], ())]
    assert plan.num_swap_ins == 1


@pytest.mark.parametrize("sync_mode", [0, 2])
def test_a_swap_in_nothing_can_hold_back_is_not_planned(sync_mode):
    """lone = mul(t, x) is one level after t: no trigger fits, and its other
    input is below t, so a swap-in would run right after the swap-out."""
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [MAT]}),
         ("t", "Relu", {"outputs": [KB]}), ("lone", "Mul")],
        edges=[("x", "t"), ("t", "lone"), ("x", "lone")])
    plan = plan_for(index, 0, sync_mode=sync_mode)
    assert plan.swaps == ()
    assert plan.unplanned_groups == 1


def fill_graph():
    """Spine s1..s9; dims (placeholder) and value feed Fill ops.

    fill  [4, 8] read by r = mul(s8, fill) at level 9: deferrable.
    fill_vec [8] (rank 1), read at level 9: not deferrable.
    fill_near [4, 8] read by r_near = mul(s2, fill_near) at level 3: too
    close. fill_cpu [4, 8] on the CPU, read at level 9: not a device op.
    """
    ops = [("x", "Placeholder", {"outputs": [MAT]}),
           ("dims", "Placeholder", {"outputs": [((2,), 4)]}),
           ("value", "Const", {"outputs": [((), 4)]})]
    edges = []
    prev = "x"
    for k in range(1, 10):
        ops.append(("s%d" % k, "Sin", {"outputs": [MAT]}))
        edges.append((prev, "s%d" % k))
        prev = "s%d" % k
    for name, shape, spine, device in [
            ("fill", (4, 8), "s8", None), ("fill_vec", (8,), "s8", None),
            ("fill_near", (4, 8), "s2", None),
            ("fill_cpu", (4, 8), "s8", "/cpu:0")]:
        facts = {"outputs": [(shape, 4)]}
        if device:
            facts["device"] = device
        ops.append((name, "Fill", facts))
        ops.append(("r_" + name, "Mul", {"outputs": [MAT]}))
        edges += [("dims", name), ("value", name), (spine, "r_" + name),
                  (name, "r_" + name)]
    return gi.from_edges(ops, edges)


def test_deferral_edges_delay_fills_until_shortly_before_use():
    index = fill_graph()
    roles = analysis.classify_ops(index)
    assert index.levels[index.id_of["fill"]] == 1
    assert index.levels[index.id_of["r_fill"]] == 9
    edges = planner.deferral_edges(index, roles)
    # The trigger: r_fill's latest data ancestor below level 8.
    assert [(index.names[a], index.names[b]) for a, b in edges] == [
        ("s7", "fill")]


def test_deferred_ops_are_not_swapped():
    index = fill_graph()
    roles = analysis.classify_ops(index)
    deferral = planner.deferral_edges(index, roles)
    params = planner.SwapParams(2, 1, 0, 0)
    plain = planner.make_plan(index, roles, params)
    assert [t for t, _, _ in describe(index, plain)] == ["fill:0"]
    deferred = planner.make_plan(index, roles, params, deferral=deferral)
    assert deferred.swaps == ()
    assert deferred.deferral_edges == deferral
    assert deferred.control_edges == deferral


def held_inputs_graph():
    """Keras 3's NaN check over the logits: ``eq = Equal(x, c)`` is made
    at once, but its reader ``both`` waits for a chain of three ops, and
    ``x`` is read again after ``both`` (by ``select``)."""
    ops = [("x", "Placeholder", {"outputs": [MAT]}),
           ("c", "Const", {"outputs": [((), 4)]}),
           ("eq", "Equal", {"outputs": [((4, 8), 1)]}),
           ("a", "Sin", {"outputs": [MAT]}),
           ("b", "Sin", {"outputs": [MAT]}),
           ("less", "Less", {"outputs": [((4, 8), 1)]}),
           ("both", "LogicalAnd", {"outputs": [((4, 8), 1)]}),
           ("select", "SelectV2", {"outputs": [MAT]})]
    edges = [("x", "eq"), ("c", "eq"), ("x", "a"), ("a", "b"),
             ("b", "less"), ("c", "less"), ("eq", "both"),
             ("less", "both"), ("both", "select"), ("x", "select"),
             ("b", "select")]
    return gi.from_edges(ops, edges)


def test_an_op_whose_inputs_are_held_waits_until_just_before_its_reader():
    """``eq`` reads a constant and ``x``, which ``select`` reads after
    ``both``: made just before ``both`` (after ``less``, the reader's
    latest other input) it holds nothing longer, and its mask is not
    beside ``a`` and ``b``."""
    index = held_inputs_graph()
    roles = analysis.classify_ops(index)
    assert index.levels[index.id_of["eq"]] == 1
    assert index.levels[index.id_of["both"]] == 4
    edges = planner.deferral_edges(index, roles)
    assert [(index.names[a], index.names[b]) for a, b in edges] == [
        ("less", "eq")]


def test_an_op_whose_input_is_freed_by_it_is_not_delayed():
    """Without the late reader of ``x``, making ``eq`` later would hold
    ``x`` longer: no edge."""
    index = held_inputs_graph()
    ops = [(n, t, {"outputs": [(s, i)]}) for n, t, s, i in zip(
        index.names, index.types,
        [o[0] for o in index.output_shapes],
        [o[0] for o in index.output_itemsizes])]
    edges = [("x", "eq"), ("c", "eq"), ("x", "a"), ("a", "b"),
             ("b", "less"), ("c", "less"), ("eq", "both"),
             ("less", "both"), ("both", "select"), ("b", "select")]
    index = gi.from_edges(ops, edges)
    assert planner.deferral_edges(index, analysis.classify_ops(index)) == ()


def test_a_tensor_held_by_a_view_is_not_swapped_for_readers_before_it():
    """``x`` is read by ``early``, by ``mid`` and, through the view
    ``flat`` (a Reshape, its buffer), by ``late``: its buffer stays on the
    device until ``late``, so a swap-in for ``mid`` would be a second
    copy beside it. ``flat`` itself is still a candidate."""
    ops = [("x", "Sin", {"outputs": [MAT]}),
           ("early", "Sin", {"outputs": [MAT]}),
           ("flat", "Reshape", {"outputs": [MAT]}),
           ("s1", "Sin", {"outputs": [MAT]}),
           ("s2", "Sin", {"outputs": [MAT]}),
           ("mid", "Mul", {"outputs": [MAT]}),
           ("s3", "Sin", {"outputs": [MAT]}),
           ("late", "Mul", {"outputs": [MAT]})]
    edges = [("x", "early"), ("x", "flat"), ("early", "s1"), ("s1", "s2"),
             ("s2", "mid"), ("x", "mid"), ("mid", "s3"), ("s3", "late"),
             ("flat", "late")]
    index = gi.from_edges(ops, edges)
    roles = analysis.classify_ops(index)
    candidates = {(index.names[p], index.names[c])
                  for p, _, c, _, _ in planner.candidate_edges(index, roles)}
    assert ("x", "mid") not in candidates
    assert ("flat", "late") in candidates


def serialization_graph():
    """Level 0: x, y (placeholders), k (const). Level 1: a = sin(x),
    b = cos(x), c = sin(y), d = x + y, kk = relu(k) (needs no input),
    st = random(x) (stateful)."""
    return gi.from_edges(
        [("x", "Placeholder"), ("y", "Placeholder"), ("k", "Const"),
         ("a", "Sin"), ("b", "Cos"), ("c", "Sin"), ("d", "AddV2"),
         ("kk", "Relu"), ("st", "RandomUniform", {"stateful": True})],
        edges=[("x", "a"), ("x", "b"), ("y", "c"), ("x", "d"), ("y", "d"),
               ("k", "kk"), ("x", "st")])


@pytest.mark.parametrize("excluded, extra, expected", [
    # b waits for a (same inputs); c needs y only, so it waits for neither;
    # d needs x and y and waits for the latest of them, c.
    ((), (), [("a", "b"), ("c", "d")]),
    (("b",), (), [("c", "d")]),
    ((), (0,), [("a", "b"), ("c", "d")]),  # level 0 has nothing to chain
])
def test_serialization_edges(excluded, extra, expected):
    index = serialization_graph()
    roles = analysis.classify_ops(index)
    slices = settings.serialization_slices([1])
    edges, chosen = planner.serialization_edges(
        index, roles, slices, extra_levels=extra,
        excluded=frozenset(index.id_of[n] for n in excluded))
    assert [(index.names[a], index.names[b]) for a, b in edges] == expected
    assert chosen == sorted({1} | set(extra))


def test_requirement_masks():
    index = serialization_graph()
    masks = dict(zip(index.names, planner.requirement_masks(index)))
    # Bits in (level, id) order: x 1, y 2, st 4.
    assert masks == {"x": 1, "y": 2, "k": 0, "a": 1, "b": 1, "c": 2,
                     "d": 3, "kk": 0, "st": 5}


def custom_gradient_graph(handed_on_read):
    """``tf.custom_gradient``'s IdentityN in graph mode: ``n =
    IdentityN(m, f)`` hands on the result ``m = f * sigmoid(f)`` and the
    input ``f``; ``g`` reads ``f`` late. With `handed_on_read`, ``neg``
    reads ``n:1`` and feeds ``g``.

    Levels: x 0, f 1, s 2, m 3, n 4, r (and neg) 5, g 6.
    """
    ops = [("x", "Placeholder", {"outputs": [MAT]}),
           ("f", "Sin", {"outputs": [MAT]}),
           ("s", "Sigmoid", {"outputs": [MAT]}),
           ("m", "Mul", {"outputs": [MAT]}),
           ("n", "IdentityN", {"outputs": [MAT, MAT]}),
           ("r", "Relu", {"outputs": [MAT]}),
           ("g", "Mul", {"outputs": [MAT]})]
    edges = [("x", "f"), ("f", "s"), ("f", "m"), ("s", "m"), ("m", "n"),
             ("f", "n"), ("n:0", "r"), ("r", "g"), ("f", "g")]
    if handed_on_read:
        ops.insert(-1, ("neg", "Neg", {"outputs": [MAT]}))
        edges += [("n:1", "neg"), ("neg", "g")]
    return gi.from_edges(ops, edges)


@pytest.mark.parametrize("handed_on_read", [False, True])
def test_an_identity_n_slot_no_op_reads_is_no_late_reader(handed_on_read):
    # Grappler removes an IdentityN whose output 1 nothing reads, and its
    # read of f with it: a swap-in rerouted there would never run.
    index = custom_gradient_graph(handed_on_read)
    roles = analysis.classify_ops(index)
    name = index.names
    readers = [(name[c], slot, d)
               for p, _, c, slot, d in planner.candidate_edges(index, roles)
               if name[p] == "f"]
    expected = [("s", 0, 1), ("m", 0, 2), ("g", 1, 5)]
    if handed_on_read:
        expected.insert(2, ("n", 1, 3))
    assert readers == expected
    n = index.id_of["n"]
    assert index.hands_on_unread(n, 1) is not handed_on_read
    assert not index.hands_on_unread(n, 0)
    # Swapping every tensor never reroutes the unread slot.
    plan = plan_for(index, threshold=1)
    rerouted = {(name[c], slot) for s in plan.swaps for sin in s.swap_ins
                for c, slot in sin.consumers}
    assert (("n", 1) in rerouted) is handed_on_read


def test_a_plan_without_a_swap_loses_the_recomputes_that_read_it():
    from tflms.planner import prune
    P = planner
    params = P.SwapParams(1, 1, 0, P.SyncMode(0))
    swap_a = P.SwapPlan(1, 0, 8, (P.SwapInPlan(((5, 0),), (3,), False),),
                        ())
    swap_b = P.SwapPlan(2, 0, 8, (P.SwapInPlan(((6, 0),), (4,), False),),
                        ())
    # r1 reads a swap-in of a; r2 reads r1's clone; r3 reads b's.
    r1 = P.RecomputePlan(7, 0, 8, (7,), ((("swapin", 1, 0, 0),),),
                         ((9, 0),), 4)
    r2 = P.RecomputePlan(8, 0, 8, (8,), ((("recompute", 7, 0, 0, 0),),),
                         ((9, 1),), 4)
    r3 = P.RecomputePlan(10, 0, 8, (10,), ((("swapin", 2, 0, 0),),),
                         ((11, 0),), 4)
    plan = P.Plan(params=params, swaps=(swap_a, swap_b),
                  serialization_edges=((3, 4), (4, 5)), num_levels=12,
                  deferral_edges=((6, 7),), recomputes=(r1, r2, r3))
    left, dropped = prune.without_parts(plan, swaps={(1, 0)},
                                        edges={(4, 5), (6, 7), (0, 1)})
    assert left.swaps == (swap_b,) and left.recomputes == (r3,)
    assert left.serialization_edges == ((3, 4),) and not left.deferral_edges
    assert dropped == prune.Dropped(swaps=((1, 0),),
                                    recomputes=((7, 0), (8, 0)),
                                    edges=((4, 5), (6, 7)))
    same, nothing = prune.without_parts(plan)
    assert same == plan and not nothing
