"""Analysis on literal graphs (`graph_index.from_edges`): no TensorFlow graph,
no session; every expected set is worked out by hand in the docstrings."""


import pytest

from tflms import analysis
from tflms import graph_index as gi
from tflms import dag_levels
from tflms.target import Target

F32_4x8 = ((4, 8), 4)


def ids(index, *names):
    return frozenset(index.id_of[n] for n in names)


def names_of(index, op_ids):
    return {index.names[i] for i in op_ids}


def training_graph():
    """A step with a variable, a CPU op, a collective and an update.

    x, w, w/read -> mm -> relu -> shape (static: a constant)
                          relu -> cpu (on /cpu:0) ; grad = relu * cpu
    grad -> allreduce (HorovodAllreduce), grad -> call (calls a collective)
    apply(w, lr, allreduce); train (NoOp) waits on apply.
    """
    return gi.from_edges(
        [("x", "Placeholder", {"outputs": [F32_4x8]}),
         ("w", "VariableV2", {"outputs": [((8, 8), 4)], "stateful": True,
                              "variable_bytes": 256}),
         ("w/read", "Identity", {"outputs": [((8, 8), 4)]}),
         ("mm", "MatMul", {"outputs": [F32_4x8]}),
         ("relu", "Relu", {"outputs": [F32_4x8]}),
         ("shape", "Shape", {"outputs": [((2,), 4)]}),
         ("lr", "Const", {"outputs": [((), 4)]}),
         ("cpu", "Relu", {"outputs": [F32_4x8], "device": "/cpu:0"}),
         ("grad", "Mul", {"outputs": [F32_4x8]}),
         ("allreduce", "HorovodAllreduce", {"outputs": [F32_4x8]}),
         ("call", "StatefulPartitionedCall", {"calls_collective": True}),
         ("apply", "ApplyGradientDescent", {"stateful": True}),
         ("train", "NoOp")],
        edges=[("x", "mm"), ("w", "w/read"), ("w/read", "mm"),
               ("mm", "relu"), ("relu", "shape"), ("relu", "cpu"),
               ("relu", "grad"), ("cpu", "grad"), ("grad", "allreduce"),
               ("grad", "call"), ("w", "apply"), ("lr", "apply"),
               ("allreduce", "apply")],
        control_edges=[("apply", "train")])


def test_classify_ops_roles():
    """device ops: all but `cpu`. Usable: device ops that are active and no
    collective (not allreduce, not call). Sources: usable ops that are not
    inputs, constants, variables or identities (shape is a constant);
    sinks: the same minus shape-only ops; triggers may be identities but
    not inputs, constants or variables; waiters: every usable op."""
    index = training_graph()
    roles = analysis.classify_ops(index)
    every = frozenset(range(index.num_ops))
    assert roles.device_ops == every - ids(index, "cpu")
    assert roles.inactive == frozenset()
    assert names_of(index, roles.sources) == {"mm", "relu", "grad", "apply"}
    assert names_of(index, roles.sinks) == {"mm", "relu", "grad", "apply"}
    assert names_of(index, roles.triggers) == {
        "w/read", "mm", "relu", "shape", "grad", "apply"}
    assert names_of(index, roles.waiters) == {
        "x", "w", "w/read", "mm", "relu", "shape", "lr", "grad", "apply",
        "train"}
    assert roles.has_loops is False
    assert roles.fused_with == {}
    assert not roles.orderable(index, index.id_of["cpu"])
    assert roles.orderable(index, index.id_of["mm"])
    assert analysis.collective_ops(index) == ids(index, "allreduce", "call")


def test_classify_ops_device_and_filters():
    index = training_graph()
    other = analysis.classify_ops(index, Target(device="/device:GPU:1"))
    assert other.device_ops == frozenset()
    assert other.sources == other.sinks == other.triggers == frozenset()
    cpu = analysis.classify_ops(index, Target(device="/device:CPU:0"))
    assert cpu.device_ops == frozenset()
    filtered = analysis.classify_ops(index, filters={
        "excl_sources": ids(index, "relu"),
        "incl_sinks": ids(index, "grad", "apply", "x")})
    assert names_of(index, filtered.sources) == {"mm", "grad", "apply"}
    # incl_sinks only narrows: x never was a sink.
    assert names_of(index, filtered.sinks) == {"grad", "apply"}


def test_ops_in_a_v1_loop_get_no_role_but_enter_reads():
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [F32_4x8]}),
         ("enter", "Enter", {"outputs": [F32_4x8], "in_v1_loop": True}),
         ("body", "Relu", {"outputs": [F32_4x8], "in_v1_loop": True})],
        edges=[("x", "enter"), ("enter", "body")])
    roles = analysis.classify_ops(index)
    assert roles.has_loops is True
    assert names_of(index, roles.sinks) == {"enter"}
    assert roles.sources == roles.triggers == frozenset()
    assert names_of(index, roles.waiters) == {"x"}
    # Control edges of LMS's own: device ops outside the loop only.
    assert [roles.orderable(index, op) for op in range(3)] == [
        True, False, False]


def batch_norm_cond_graph():
    """A v1 cond choosing a training or an inference batch norm, and a
    frozen batch norm outside any cond.

    sw = Switch(x, pred): output 0 (false) -> bn_infer, 1 -> bn_train.
    merge = Merge(bn_infer, bn_train) -> after.
    grad_infer = bn_infer * c (c Const): fed only by an inactive op and a
    constant. mixed = bn_infer + relu_x: has an active input.
    frozen = FusedBatchNorm(x, is_training=False), outside the cond.
    """
    return gi.from_edges(
        [("x", "Placeholder", {"outputs": [F32_4x8]}),
         ("pred", "Placeholder", {"outputs": [((), 1)]}),
         ("c", "Const", {"outputs": [((), 4)]}),
         ("sw", "Switch", {"outputs": [F32_4x8, F32_4x8]}),
         ("bn_train", "FusedBatchNormV3", {"outputs": [F32_4x8],
                                           "bn_is_training": True,
                                           "in_v1_cond": True}),
         ("bn_infer", "FusedBatchNormV3", {"outputs": [F32_4x8],
                                           "bn_is_training": False,
                                           "in_v1_cond": True}),
         ("merge", "Merge", {"outputs": [F32_4x8, ((), 4)]}),
         ("after", "Relu", {"outputs": [F32_4x8]}),
         ("grad_infer", "Mul", {"outputs": [F32_4x8]}),
         ("relu_x", "Relu", {"outputs": [F32_4x8]}),
         ("mixed", "AddV2", {"outputs": [F32_4x8]}),
         ("frozen", "FusedBatchNormV3", {"outputs": [F32_4x8],
                                         "bn_is_training": False})],
        edges=[("x", "sw"), ("pred", "sw"), ("sw:1", "bn_train"),
               ("sw:0", "bn_infer"), ("bn_infer", "merge"),
               ("bn_train", "merge"), ("merge", "after"),
               ("bn_infer", "grad_infer"), ("c", "grad_infer"),
               ("x", "relu_x"), ("bn_infer", "mixed"), ("relu_x", "mixed"),
               ("x", "frozen")])


def test_inactive_ops_follow_the_learning_mode():
    index = batch_norm_cond_graph()
    assert names_of(index, analysis.inactive_ops(index, True)) == {
        "bn_infer", "grad_infer"}
    # In inference the training batch norm is the one that does not run;
    # the frozen one runs in both modes.
    assert names_of(index, analysis.inactive_ops(index, False)) == {
        "bn_train"}


def test_maybe_dead_ops_stop_at_merge():
    index = batch_norm_cond_graph()
    assert names_of(index, analysis.maybe_dead_ops(index)) == {
        "bn_train", "bn_infer", "grad_infer", "mixed"}
    roles = analysis.classify_ops(index)
    # Possibly dead ops and control flow never wait, trigger or hold back.
    assert not roles.waiters & ids(index, "sw", "merge", "bn_train",
                                   "grad_infer", "mixed")
    assert names_of(index, roles.triggers) == {"after", "relu_x", "frozen"}
    # The Switch is a source: the batch norm gradient reads through it.
    assert names_of(index, roles.sources) == {
        "sw", "bn_train", "after", "relu_x", "mixed", "frozen"}


def test_a_loop_switch_is_no_source_of_deadness():
    index = gi.from_edges(
        [("x", "Placeholder"), ("cond", "LoopCond"),
         ("sw", "Switch", {"outputs": [F32_4x8, F32_4x8]}),
         ("exit", "Exit"), ("after", "Relu")],
        edges=[("x", "sw"), ("cond", "sw"), ("sw:0", "exit"),
               ("exit", "after")])
    assert analysis.maybe_dead_ops(index) == frozenset()


def keras_learning_phase_graph():
    """Keras' learning-phase cond: Switch(data, Identity(phase))."""
    return gi.from_edges(
        [("keras_learning_phase", "PlaceholderWithDefault"),
         ("phase", "Identity"),
         ("x", "Placeholder", {"outputs": [F32_4x8]}),
         ("sw", "Switch", {"outputs": [F32_4x8, F32_4x8]}),
         ("when_false", "Relu"), ("when_true", "Relu"),
         ("false_next", "Relu"), ("merge", "Merge")],
        edges=[("keras_learning_phase", "phase"), ("x", "sw"),
               ("phase", "sw"), ("sw:0", "when_false"),
               ("sw:1", "when_true"), ("when_false", "false_next"),
               ("false_next", "merge"), ("when_true", "merge")])


def test_keras_learning_phase_untaken_branch_is_inactive():
    index = keras_learning_phase_graph()
    assert names_of(index, analysis.inactive_ops(index, True)) == {
        "when_false", "false_next"}
    assert names_of(index, analysis.inactive_ops(index, False)) == {
        "when_true"}


def test_constant_ops():
    """Consts, shape queries of static shapes, and stateless ops fed only by
    constants; not: a shape with an unknown dimension, random numbers,
    stateful ops, anything reading a placeholder."""
    index = gi.from_edges(
        [("c1", "Const", {"outputs": [((2, 2), 4)]}),
         ("c2", "Const", {"outputs": [((), 4)]}),
         ("add", "AddV2"),
         ("x", "Placeholder", {"outputs": [((None, 2), 4)]}),
         ("shape_x", "Shape"),
         ("y", "Placeholder", {"outputs": [((3, 2), 4)]}),
         ("shape_y", "Shape"),
         ("zeros_y", "ZerosLike"),
         ("random", "RandomUniform"),
         ("mixed", "AddV2"),
         ("fill", "Fill"),
         ("effect", "MyStatefulOp", {"stateful": True})],
        edges=[("c1", "add"), ("c2", "add"), ("x", "shape_x"),
               ("y", "shape_y"), ("y", "zeros_y"), ("shape_y", "random"),
               ("add", "mixed"), ("x", "mixed"), ("shape_y", "fill"),
               ("c2", "fill"), ("c1", "effect")])
    assert names_of(index, analysis.constant_ops(index)) == {
        "c1", "c2", "add", "shape_y", "zeros_y", "fill"}


def test_ancestors_within():
    """x -> a -> b -> c, x -> s ~> c (control). Levels x 0, a 1, s 1, b 2,
    c 3."""
    index = gi.from_edges(
        [("x", "Placeholder"), ("a", "Relu"), ("b", "Relu"), ("s", "Relu"),
         ("c", "Relu")],
        edges=[("x", "a"), ("a", "b"), ("b", "c"), ("x", "s")],
        control_edges=[("s", "c")])
    assert index.levels == (0, 1, 2, 1, 3)
    c = index.id_of["c"]

    def within(*args, **kwargs):
        return names_of(index, analysis.ancestors_within(index, c, *args,
                                                         **kwargs))

    assert within(0) == {"x", "a", "b", "s"}
    assert within(1) == {"a", "b", "s"}
    assert within(2) == {"b"}
    assert within(4) == set()
    assert within(0, data_only=True) == {"x", "a", "b"}
    assert within(1, data_only=True) == {"a", "b"}
    extra = {index.id_of["b"]: (index.id_of["s"],)}
    assert within(1, extra_preds=extra, data_only=True) == {"a", "b", "s"}


def test_planned_edges_relevel_the_index():
    index = gi.from_edges([("x", "Placeholder"), ("a", "Relu"),
                           ("b", "Relu")],
                          edges=[("x", "a"), ("x", "b")])
    assert index.levels == (0, 1, 1) and index.planned_edges == ()
    assert gi.with_planned_edges(index, ()) is index
    moved = gi.with_planned_edges(index, [(1, 2)])
    assert moved.levels == (0, 1, 2)
    assert moved.ops_by_level == ((0,), (1,), (2,))
    assert moved.planned_edges == ((1, 2),)
    assert moved.inputs == index.inputs
    assert moved.control_inputs == index.control_inputs == ((), (), ())
    # Planned edges accumulate, and one that closes a cycle is refused.
    assert gi.with_planned_edges(moved, [(0, 1)]).planned_edges == (
        (1, 2), (0, 1))
    with pytest.raises(dag_levels.GraphCycleError):
        gi.with_planned_edges(moved, [(2, 1)])


@pytest.mark.parametrize("a, b, expected", [
    ("", "/cpu:0", True),
    ("/device:GPU:0", "/device:GPU:1", False),
    ("/gpu:0", "/device:GPU:0", True),
    ("/job:a/device:GPU:0", "/device:GPU:0", True),
    ("/job:a/device:GPU:0", "/job:b/device:GPU:0", False),
    ("/device:CPU:0", "/device:GPU:0", False),
])
def test_same_device(a, b, expected):
    assert analysis.same_device(a, b) is expected


def test_compute_devices_names_each_replica_device_once():
    """A strategy's step: two replicas on two GPUs (one spelled two ways),
    a reduction on the host, an unplaced op: the two GPUs, in op order,
    each in its first op's spelling."""
    ops = [("x", "Placeholder", {"device": ""}),
           ("a1", "Relu", {"device": "/job:localhost/replica:0/task:0/"
                                     "device:GPU:1"}),
           ("a0", "Relu", {"device": "/device:GPU:0"}),
           ("b0", "Relu", {"device": "/gpu:0"}),
           ("b1", "Relu", {"device": "/job:localhost/replica:0/task:0/"
                                     "device:GPU:1"}),
           ("sum", "AddV2", {"device": "/device:CPU:0"})]
    index = gi.from_edges(ops, edges=[("x", "a1"), ("x", "a0"),
                                      ("a0", "b0"), ("a1", "b1"),
                                      ("b0", "sum"), ("b1", "sum")])
    assert analysis.compute_devices(index) == (
        "/job:localhost/replica:0/task:0/device:GPU:1", "/device:GPU:0")
    one = gi.from_edges(ops[:1] + ops[2:4], edges=[("x", "a0"),
                                                    ("a0", "b0")])
    assert analysis.compute_devices(one) == ("/device:GPU:0",)


@pytest.mark.parametrize("ops, expected", [
    ([("gradients/mul", "Mul")], True),
    ([("a/gradients_1/b", "Mul")], True),
    ([("step", "ApplyAdam")], True),
    ([("step", "ResourceSparseApplyAdagrad")], True),
    ([("gradients", "Mul")], False),
    ([("a/b", "Mul")], False),
])
def test_has_training_ops(ops, expected):
    assert analysis.has_training_ops(gi.from_edges(ops)) is expected


@pytest.mark.parametrize("name, expected", [
    ("gradients/mul", True),
    ("a/gradients_1/b", True),
    ("gradient_tape/model/dense/MatMul", True),
    ("gradients", False),          # the op itself, not its scope
    ("sgd/IdentityN", False),
    ("model/gradient/Mul", False),
])
def test_in_gradient_scope(name, expected):
    assert analysis.in_gradient_scope(name) is expected


def test_op_bytes_and_largest_device_op():
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [100]}),
         ("a", "Relu", {"outputs": [300]}),
         ("b", "Relu", {"outputs": [((None, 5), 4)]}),
         ("cpu", "Relu", {"outputs": [10000], "device": "/cpu:0"})],
        edges=[("x", "a"), ("a", "b"), ("b", "cpu")])
    assert analysis.op_bytes(index, 1) == 400
    assert analysis.op_bytes(index, 2) == 300  # unknown batch counts 0
    assert analysis.op_bytes(index, 2, batch_size=10) == 500
    roles = analysis.classify_ops(index)
    assert analysis.largest_device_op(index, roles.device_ops) == (1, 400)
    assert analysis.largest_device_op(index, roles.device_ops, 100) == (
        2, 2300)
    assert analysis.largest_device_op(index, roles.device_ops,
                                      excluded=[1]) == (2, 300)
