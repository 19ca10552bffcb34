"""Ordering the broadcast terms of sums (`tflms.broadcast_order`) on literal
graphs shaped as Keras 3's unfused batch-norm gradients."""

from tflms import analysis
from tflms.stages.order import broadcast as broadcast_order
from tflms import fusions
from tflms import graph_index as gi
from tflms.target import Target

BIG = 1000    # an activation
SMALL = 10    # a per-channel vector


def _bn_gradient(b):
    """Ops and edges of one batch-norm input gradient, branch `b`, reading
    the shared incoming gradient ``dy``: the scaled gradient, the mean's
    broadcast chain and the variance's (ending in a ``Mul`` chain Grappler
    merges), summed by an ``AddN``."""
    def n(name):
        return "%s_%s" % (name, b)
    ops = [
        (n("x"), "BiasAdd", {"outputs": [BIG]}),
        (n("inv"), "Rsqrt", {"outputs": [SMALL]}),
        (n("scaled"), "Mul", {"outputs": [BIG]}),
        (n("dvec"), "Sum", {"outputs": [SMALL]}),
        (n("tile_m"), "Tile", {"outputs": [BIG]}),
        (n("div_m"), "RealDiv", {"outputs": [BIG]}),
        (n("tile_v"), "Tile", {"outputs": [BIG]}),
        (n("div_v"), "RealDiv", {"outputs": [BIG]}),
        (n("twice"), "Mul", {"outputs": [BIG]}),
        (n("sub"), "Sub", {"outputs": [BIG]}),
        (n("times_sub"), "Mul", {"outputs": [BIG]}),
        (n("dx"), "AddN", {"outputs": [BIG]}),
        (n("out"), "Relu", {"outputs": [SMALL]}),
    ]
    edges = [
        ("dy", n("scaled")), (n("inv"), n("scaled")),
        ("dy", n("dvec")),
        (n("dvec"), n("tile_m")), (n("tile_m"), n("div_m")),
        (n("dvec"), n("tile_v")), (n("tile_v"), n("div_v")),
        (n("div_v"), n("twice")),
        (n("x"), n("sub")), (n("twice"), n("times_sub")),
        (n("sub"), n("times_sub")),
        (n("scaled"), n("dx")), (n("div_m"), n("dx")),
        (n("times_sub"), n("dx")),
        (n("dx"), n("out")),
    ]
    # As tf.gradients makes it: x - mean after the variance's division.
    control = [(n("div_v"), n("sub"))]
    return ops, edges, control


def _two_branches(groups=True):
    ops = [("dy", "ReluGrad", {"outputs": [BIG]})]
    edges, control = [], []
    for b in ("p", "q"):
        o, e, c = _bn_gradient(b)
        ops += o
        edges += e
        control += c
    ops.append(("step", "NoOp"))
    control += [("out_p", "step"), ("out_q", "step")]
    index = gi.from_edges(ops, edges, control, fetches=["step"])
    return index, analysis.classify_ops(index,
                                        Target(grappler_groups=groups))


def _names(index, ops):
    return [index.names[op] for op in ops]


def test_finds_each_sum_with_the_merged_chain_first():
    index, roles = _two_branches()
    sums = broadcast_order.broadcast_sums(index, roles)
    assert [index.names[s.total] for s in sums] == ["dx_p", "dx_q"]
    # The variance's chain ends in the Mul chain Grappler merges (no
    # edge may leave it), so it is made first.
    assert [_names(index, c) for c in sums[0].chains] == [
        ["times_sub_p", "twice_p", "div_v_p", "tile_v_p"],
        ["div_m_p", "tile_m_p"]]


def test_edges_make_one_broadcast_at_a_time_and_order_siblings():
    index, roles = _two_branches()
    edges = broadcast_order.sum_edges(index, roles)
    named = {(index.names[a], index.names[b]) for a, b in edges}
    assert ("div_v_p", "tile_m_p") in named
    assert ("div_v_q", "tile_m_q") in named
    # The later sum's earliest broadcast (by level, then id) waits.
    assert ("dx_p", "tile_m_q") in named
    for a, b in edges:
        assert a in roles.triggers and b in roles.waiters
    ordered = gi.with_planned_edges(index, edges)
    level = {name: ordered.levels[ordered.id_of[name]]
             for name in ordered.names}
    assert level["tile_m_p"] > level["div_v_p"]
    assert level["tile_m_q"] > level["dx_p"]


def test_no_edge_leaves_an_op_grappler_merges():
    index, roles = _two_branches()
    members = fusions.grappler_groups(index).members
    assert index.id_of["times_sub_p"] in members
    edges = broadcast_order.sum_edges(index, roles)
    assert not {a for a, _ in edges} & members
    # Without the groups (a Session graph) the chain's own end may lead.
    index, roles = _two_branches(groups=False)
    edges = broadcast_order.sum_edges(index, roles)
    named = {(index.names[a], index.names[b]) for a, b in edges}
    assert ("div_m_p", "tile_v_p") in named


def test_a_sum_of_products_or_of_a_large_tile_is_left_alone():
    index = gi.from_edges(
        [("a", "Relu", {"outputs": [BIG]}),
         ("b", "Relu", {"outputs": [BIG]}),
         ("t1", "Tile", {"outputs": [BIG]}),
         ("t2", "Tile", {"outputs": [BIG]}),
         ("s", "AddN", {"outputs": [BIG]}),
         ("u", "AddN", {"outputs": [BIG]})],
        # The tiles repeat activations, not per-channel vectors; u sums
        # plain activations.
        [("a", "t1"), ("b", "t2"), ("t1", "s"), ("t2", "s"), ("a", "u"),
         ("b", "u")])
    roles = analysis.classify_ops(index)
    assert broadcast_order.broadcast_sums(index, roles) == []
    assert broadcast_order.sum_edges(index, roles) == ()
