"""Ordering an optimizer's per-variable updates (`tflms.update_order`) on
literal graphs shaped as Keras 3's momentum SGD at the end of a step."""


import pytest

from tflms import analysis
from tflms import fusions
from tflms import graph_index as gi
from tflms import simulator
from tflms.stages.order import updates as update_order
from tflms.target import Target

P = 1000      # one variable's bytes (and its gradient's, its products')
SMALL = 4     # the learning rate


def _variable(x, grad):
    """Ops and edges of the update of variable `x` from the tensor `grad`,
    as Keras 3's SGD with momentum makes it: ``m = m * momentum - grad *
    lr; v += m``."""
    def n(name):
        return "sgd/%s_%s" % (name, x)
    ops = [
        (n("v"), "VarHandleOp", {"outputs": [((), 0)], "variable_bytes": P,
                                 "trainable": True}),
        (n("m"), "VarHandleOp", {"outputs": [((), 0)], "variable_bytes": P}),
        (n("read_m"), "ReadVariableOp", {"outputs": [((), 0)]}),
        (n("times_momentum"), "Mul", {"outputs": [P]}),
        (n("read_lr"), "ReadVariableOp", {"outputs": [((), 0)]}),
        (n("times_lr"), "Mul", {"outputs": [P]}),
        (n("sub"), "Sub", {"outputs": [P]}),
        (n("assign_m"), "AssignVariableOp", {"outputs": []}),
        (n("read_m_again"), "ReadVariableOp", {"outputs": [((), 0)]}),
        (n("add_to_v"), "AssignAddVariableOp", {"outputs": []}),
    ]
    edges = [
        (n("m"), n("read_m")), (n("read_m"), n("times_momentum")),
        ("momentum", n("times_momentum")),
        ("lr", n("read_lr")),
        (grad, n("times_lr")), (n("read_lr"), n("times_lr")),
        (n("times_momentum"), n("sub")), (n("times_lr"), n("sub")),
        (n("m"), n("assign_m")), (n("sub"), n("assign_m")),
        (n("m"), n("read_m_again")),
        (n("v"), n("add_to_v")), (n("read_m_again"), n("add_to_v")),
    ]
    # Automatic control dependencies: a variable's read before its write,
    # the write before the next read; the step's end waits for them all.
    control = [(n("read_m"), n("assign_m")),
               (n("assign_m"), n("read_m_again")), (n("read_m"), "step"),
               (n("read_lr"), "step"), (n("read_m_again"), "step"),
               (n("add_to_v"), "step")]
    return ops, edges, control


def _step(variables=("a", "b", "c"), groups=True, barrier=True):
    """A backward pass making one gradient per variable, the last
    variable's first, a batch norm's moving-mean update in the forward
    pass, and the optimizer's updates. With `barrier`, every gradient goes
    through one ``IdentityN`` (Keras 3's optimizer); without, each update
    reads its gradient."""
    ops = [("x", "Placeholder", {"outputs": [P]}),
           ("lr", "VarHandleOp", {"outputs": [((), 0)],
                                  "variable_bytes": SMALL}),
           ("momentum", "Const", {"outputs": [SMALL]}),
           ("bn/mean", "Mean", {"outputs": [SMALL]}),
           ("bn/moving", "VarHandleOp", {"outputs": [((), 0)],
                                         "variable_bytes": SMALL}),
           ("bn/scaled", "Mul", {"outputs": [SMALL]}),
           ("bn/assign", "AssignVariableOp", {"outputs": []})]
    edges = [("x", "bn/mean"), ("bn/mean", "bn/scaled"),
             ("momentum", "bn/scaled"), ("bn/moving", "bn/assign"),
             ("bn/scaled", "bn/assign")]
    control = [("bn/assign", "step")]
    upstream = "x"
    grads = {}
    for x in reversed(variables):
        grad = "gradient_tape/layer_%s/Conv2DBackpropFilter" % x
        ops.append((grad, "Conv2DBackpropFilter", {"outputs": [P]}))
        edges.append((upstream, grad))
        # The layer's input gradient, three ops deep.
        for k in range(3):
            dx = "gradient_tape/layer_%s/dx_%d" % (x, k)
            ops.append((dx, "ReluGrad", {"outputs": [SMALL]}))
            edges.append((upstream, dx))
            upstream = dx
        grads[x] = grad
    if barrier:
        ops.append(("sgd/IdentityN", "IdentityN",
                    {"outputs": [P] * len(variables)}))
        edges += [(grads[x], "sgd/IdentityN") for x in variables]
        grads = {x: "sgd/IdentityN:%d" % k for k, x in enumerate(variables)}
    control.append((upstream, "step"))
    for x in variables:
        o, e, c = _variable(x, grads[x])
        ops += o
        edges += e
        control += c
    ops.append(("step", "NoOp"))
    index = gi.from_edges(ops, edges, control, fetches=["step"])
    return index, analysis.classify_ops(index,
                                        Target(grappler_groups=groups))


def _names(index, ops):
    return [index.names[op] for op in ops]


def test_finds_one_chain_per_variable_and_leaves_forward_writes():
    index, roles = _step()
    chains = update_order.update_chains(index, roles)
    # Every gradient is ready at the IdentityN: the one made last (the
    # first layer's) is updated first.
    assert [index.names[c.writes[0]] for c in chains] == [
        "sgd/assign_m_a", "sgd/assign_m_b", "sgd/assign_m_c"]
    a = chains[0]
    assert _names(index, a.writes) == ["sgd/assign_m_a", "sgd/add_to_v_a"]
    assert set(_names(index, a.ops)) == {
        "sgd/read_m_a", "sgd/times_momentum_a", "sgd/read_lr_a",
        "sgd/times_lr_a", "sgd/sub_a", "sgd/assign_m_a",
        "sgd/read_m_again_a", "sgd/add_to_v_a"}
    assert _names(index, a.heads) == ["sgd/read_m_a", "sgd/read_lr_a"]
    assert _names(index, a.gradients) == [
        "gradient_tape/layer_a/Conv2DBackpropFilter"]
    # The moving mean's update reads no gradient: not a chain.
    assert not any(index.id_of["bn/assign"] in c.ops for c in chains)


def test_edges_run_the_chains_one_after_another():
    index, roles = _step()
    edges = update_order.chain_edges(index, roles)
    named = {(index.names[a], index.names[b]) for a, b in edges}
    grad = "gradient_tape/layer_%s/Conv2DBackpropFilter"
    # Each chain after the one before, and after its own gradient.
    assert named == {
        ("sgd/sub_a", "sgd/read_m_b"), ("sgd/sub_a", "sgd/read_lr_b"),
        ("sgd/sub_b", "sgd/read_m_c"), ("sgd/sub_b", "sgd/read_lr_c")} | {
        (grad % x, "sgd/read_%s_%s" % (r, x)) for x in "abc"
        for r in ("m", "lr")}
    for a, b in edges:
        assert a in roles.triggers and b in roles.waiters
    merged = fusions.grappler_groups(index).members
    assert index.id_of["sgd/IdentityN"] in merged
    assert not {op for edge in edges for op in edge} & merged
    ordered = gi.with_planned_edges(index, edges)
    level = {name: ordered.levels[ordered.id_of[name]]
             for name in ordered.names}
    assert level["sgd/times_momentum_b"] > level["sgd/sub_a"]
    assert level["sgd/times_lr_c"] > level["sgd/sub_b"]


def _peak(index, roles):
    model = simulator.SimulationModel(index, roles, None)
    return model.replay(None).peak_device_bytes


@pytest.mark.parametrize("barrier, unordered, ordered", [
    # Every gradient meets at the IdentityN, and unordered every
    # ``m * momentum`` is made at the start of the step and held beside
    # them (``grad * lr``, then the difference, is written into its
    # gradient's buffer); ordered, one variable's product at a time.
    (True, 3 * P + 3 * P + 2 * SMALL, 3 * P + P + SMALL),
    # Each update reads its gradient: ordered, the products are made as
    # the backward pass makes the gradients; at the peak, one update's
    # gradient and product beside the next gradient.
    (False, P + 3 * P + 2 * SMALL, 3 * P + 2 * SMALL),
])
def test_the_ordered_step_holds_one_variables_products_at_a_time(
        barrier, unordered, ordered):
    index, roles = _step(barrier=barrier)
    # Weights, slots, the learning rate, the momentum, the moving mean.
    resident = 2 * 3 * P + 3 * SMALL
    assert _peak(index, roles) == resident + unordered
    edges = update_order.chain_edges(index, roles)
    planned = gi.with_planned_edges(index, edges)
    assert _peak(planned, analysis.classify_ops(planned)) == (
        resident + ordered)


def test_a_single_update_waits_for_its_gradient_only():
    index, roles = _step(variables=("a",))
    assert len(update_order.update_chains(index, roles)) == 1
    edges = update_order.chain_edges(index, roles)
    assert {(index.names[a], index.names[b]) for a, b in edges} == {
        ("gradient_tape/layer_a/Conv2DBackpropFilter", "sgd/read_m_a"),
        ("gradient_tape/layer_a/Conv2DBackpropFilter", "sgd/read_lr_a")}
    index = gi.from_edges([("a", "Relu"), ("b", "Relu")], [("a", "b")])
    roles = analysis.classify_ops(index)
    assert update_order.update_chains(index, roles) == []
    assert update_order.chain_edges(index, roles) == ()


def test_without_a_barrier_each_update_follows_its_gradient():
    index, roles = _step(barrier=False)
    chains = update_order.update_chains(index, roles)
    assert [index.names[c.writes[0]] for c in chains] == [
        "sgd/assign_m_c", "sgd/assign_m_b", "sgd/assign_m_a"]
    edges = update_order.chain_edges(index, roles)
    named = {(index.names[a], index.names[b]) for a, b in edges}
    assert ("sgd/sub_c", "sgd/read_m_b") in named
    assert ("sgd/sub_b", "sgd/read_m_a") in named
    ordered = gi.with_planned_edges(index, edges)
    level = {name: ordered.levels[ordered.id_of[name]]
             for name in ordered.names}
    # Waiting for the update before it holds no update back past its
    # gradient's making: c's update is done before a's gradient is made.
    assert (level["sgd/sub_c"]
            < level["gradient_tape/layer_a/Conv2DBackpropFilter"])


def test_apply_ops_are_left_alone():
    """A Session graph's optimizer: one ``ResourceApplyMomentum`` per
    variable reads its gradient and writes the variable and its slot in
    place; it makes no buffer, and ordering it would free nothing."""
    ops = [("x", "Placeholder", {"outputs": [P]})]
    edges = []
    for x in ("a", "b"):
        grad = "gradients/layer_%s/MatMul_grad/MatMul_1" % x
        ops += [(grad, "MatMul", {"outputs": [P]}),
                ("v_%s" % x, "VarHandleOp", {"outputs": [((), 0)],
                                             "variable_bytes": P}),
                ("m_%s" % x, "VarHandleOp", {"outputs": [((), 0)],
                                             "variable_bytes": P}),
                ("apply_%s" % x, "ResourceApplyMomentum", {"outputs": []})]
        edges += [("x", grad), ("v_%s" % x, "apply_%s" % x),
                  ("m_%s" % x, "apply_%s" % x), (grad, "apply_%s" % x)]
    ops.append(("step", "NoOp"))
    index = gi.from_edges(ops, edges, [("apply_a", "step"),
                                       ("apply_b", "step")],
                          fetches=["step"])
    roles = analysis.classify_ops(index)
    assert update_order.update_chains(index, roles) == []
    assert update_order.chain_edges(index, roles) == ()
