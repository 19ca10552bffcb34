"""`tflms.offload_elementwise`: element-wise optimizer updates (Keras 3's)
found on literal graphs, one rule or ambiguous case per test; the real
traced Keras 3 steps are in tests/test_offload_keras3.py."""

from tflms import analysis
from tflms import graph_index as gi
from tflms import offload
from tflms import simulator
from tflms.floor import step_floor
from tflms.target import Target

DEVICE = "/device:GPU:0"
HOST = "/cpu:0"
SHAPE = (8, 32)  # the variable's: 256 float32 elements
NBYTES = 256 * 4


def _tensor(shape=SHAPE):
    return {"outputs": [(shape, 4)]}


def _handle(trainable=False, nbytes=NBYTES):
    facts = {"outputs": [((), 0)], "variable_bytes": nbytes}
    if trainable:
        facts["trainable"] = True
    return facts


class Step:
    """A literal step built a piece at a time: ops, data edges, control
    edges; `index()` makes the `GraphIndex`."""

    def __init__(self):
        self.ops, self.edges, self.controls, self.fetch = [], [], [], []
        self.add("x", "Placeholder", _tensor((4, 8)))
        self.add("lr_var", "Placeholder", _handle(nbytes=4))
        self.add("lr", "ReadVariableOp", _tensor(()), ["lr_var"])

    def add(self, name, op_type, facts=None, inputs=(), after=()):
        self.ops.append((name, op_type, facts or {}))
        self.edges += [(i, name) for i in inputs]
        self.controls += [(a, name) for a in after]
        return name

    def variable(self, w, handle="Placeholder"):
        """`w`, its forward read and its gradient (a MatMul of the backward
        pass, as Keras' IdentityN hands it on)."""
        self.add(w, handle, _handle(trainable=True))
        self.add(w + "/read", "ReadVariableOp", _tensor(), [w])
        self.add(w + "/y", "MatMul", _tensor((4, 32)), ["x", w + "/read"])
        return self.add(w + "/grad", "MatMul", _tensor(),
                        ["x", w + "/y"])

    def slot(self, name, handle="Placeholder"):
        return self.add(name, handle, _handle())

    def adam(self, w, grad, m=None, v=None):
        """Keras 3's Adam update of `w` (slots `m`, `v`): the moments
        written, read again after their writes, the variable written
        last."""
        m = m or self.slot(w + "/m")
        v = v or self.slot(w + "/v")
        p = w + "/adam/"
        self.add(p + "c", "Const", _tensor(()))
        self.add(p + "m_read", "ReadVariableOp", _tensor(), [m])
        self.add(p + "m_sub", "Sub", _tensor(), [grad, p + "m_read"])
        self.add(p + "m_mul", "Mul", _tensor(), [p + "m_sub", p + "c"])
        self.add(p + "m_write", "AssignAddVariableOp", {},
                 [m, p + "m_mul"], after=[p + "m_read"])
        self.add(p + "square", "Square", _tensor(), [grad])
        self.add(p + "v_read", "ReadVariableOp", _tensor(), [v])
        self.add(p + "v_sub", "Sub", _tensor(), [p + "square", p + "v_read"])
        self.add(p + "v_mul", "Mul", _tensor(), [p + "v_sub", p + "c"])
        self.add(p + "v_write", "AssignAddVariableOp", {},
                 [v, p + "v_mul"], after=[p + "v_read"])
        self.add(p + "m_again", "ReadVariableOp", _tensor(), [m],
                 after=[p + "m_write"])
        self.add(p + "step", "Mul", _tensor(), [p + "m_again", "lr"])
        self.add(p + "v_again", "ReadVariableOp", _tensor(), [v],
                 after=[p + "v_write"])
        self.add(p + "sqrt", "Sqrt", _tensor(), [p + "v_again"])
        self.add(p + "div", "RealDiv", _tensor(), [p + "step", p + "sqrt"])
        return p + "div"

    def write(self, w, value, op_type="AssignSubVariableOp"):
        name = self.add(w + "/write%d" % len(self.ops), op_type, {},
                        [w, value], after=[w + "/read"])
        self.fetch.append(name)
        return name

    def index(self):
        self.add("train", "NoOp", {}, after=self.fetch)
        return gi.from_edges(self.ops, self.edges, self.controls,
                             default_device=DEVICE, fetches=["train"])


def _adam_step():
    step = Step()
    grad = step.variable("w")
    step.write("w", step.adam("w", grad))
    return step.index()


def _names(index, ops):
    return sorted(index.names[o] for o in ops)


def test_an_adam_update_its_slots_gradient_and_host_ops():
    index = _adam_step()
    found = offload.find_updates(index, HOST)
    (u,) = found.updates
    assert found.left == ()
    n = index.names
    assert n[u.variable] == "w" and n[u.apply].startswith("w/write")
    assert _names(index, u.slots) == ["w/m", "w/v"]
    assert (n[u.gradient[0]], u.gradient[1]) == ("w/grad", 0)
    assert _names(index, u.host_ops) == sorted(
        "w/adam/" + s for s in (
            "m_read", "m_sub", "m_mul", "m_write", "square", "v_read",
            "v_sub", "v_mul", "v_write", "m_again", "step", "v_again",
            "sqrt", "div"))
    # The shared scalars (lr, the constants) stay on the device; so do the
    # variable's forward read and its write.
    assert not {"lr", "w/adam/c", "w/read"} & set(_names(index, u.host_ops))
    assert u.apply not in u.host_ops and not u.fused
    assert u.moved_ops == u.host_ops and not u.reads_weights
    # Nothing of the variable goes out: the gradient out, the new value
    # back.
    assert (found.slot_bytes, found.weight_bytes, found.weights_out_bytes,
            found.gradient_bytes) == (2 * NBYTES, NBYTES, 0, NBYTES)
    assert found.moved_bytes() == 2 * NBYTES
    assert "gradients out, 0.0 MiB of weights out, new weights back" in \
        found.describe()


def test_the_planning_index_puts_the_update_and_slots_on_the_host():
    index = _adam_step()
    found = offload.find_updates(index, HOST)
    (u,) = found.updates
    planned = offload.planning_index(index, found)
    on_host = {o for o in range(index.num_ops) if planned.devices[o] == HOST}
    assert on_host == set(u.host_ops) | set(u.slots)
    assert planned.devices[u.apply] == DEVICE
    # No host copy of the weights: nothing held but the variables.
    assert planned.variable_bytes == index.variable_bytes
    roles = analysis.classify_ops(planned, Target(host=HOST))
    base = analysis.classify_ops(index, Target(host=HOST))
    before = simulator.SimulationModel(index, base, None)
    after = simulator.SimulationModel(planned, roles, None)
    assert after.resident_device_bytes == \
        before.resident_device_bytes - 2 * NBYTES
    assert after.resident_host_bytes == before.resident_host_bytes \
        + 2 * NBYTES
    assert (step_floor(before).resident_bytes
            - step_floor(after).resident_bytes) == 2 * NBYTES
    assert before.replay(None).peak_device_bytes > \
        after.replay(None).peak_device_bytes
    # The write-back lands at the variable's write, on the device.
    assert offload.write_back_buffers(found, planned) == (
        (u.apply, NBYTES, "w (new weights from the host)"),)


def test_a_decay_write_before_the_update_stays_on_the_device():
    """AdamW: the variable decays (its own read times a scalar, written
    first), then Adam writes it from the gradient: the update is that
    second write; the decay reads no gradient and stays."""
    step = Step()
    grad = step.variable("w")
    step.add("w/decay_read", "ReadVariableOp", _tensor(), ["w"])
    step.add("w/decay", "Mul", _tensor(), ["w/decay_read", "lr"])
    decay = step.write("w", "w/decay")
    update = step.write("w", step.adam("w", grad))
    index = step.index()
    (u,) = offload.find_updates(index, HOST).updates
    assert index.names[u.apply] == update
    assert index.id_of[decay] not in u.host_ops
    assert index.id_of["w/decay"] not in u.host_ops
    assert not u.reads_weights


def test_an_update_that_reads_the_variable_needs_the_weights():
    """Decay inside the update: the read of the variable stays on the
    device, and the host needs the weights."""
    step = Step()
    grad = step.variable("w")
    div = step.adam("w", grad)
    step.add("w/w_read", "ReadVariableOp", _tensor(), ["w"])
    step.add("w/decayed", "AddV2", _tensor(), [div, "w/w_read"])
    step.write("w", "w/decayed")
    index = step.index()
    found = offload.find_updates(index, HOST)
    (u,) = found.updates
    assert u.reads_weights
    assert index.id_of["w/w_read"] not in u.host_ops
    assert index.id_of["w/decayed"] in u.host_ops
    assert found.weights_out_bytes == NBYTES
    assert found.moved_bytes() == 3 * NBYTES


def test_momentum_writes_the_slots_value_into_the_variable():
    """Keras 3's SGD with momentum: m = m * c - g * lr, then the variable
    adds m's value as read again: the variable's write reads a slot."""
    step = Step()
    grad = step.variable("w")
    m = step.slot("w/m")
    step.add("c", "Const", _tensor(()))
    step.add("m_read", "ReadVariableOp", _tensor(), [m])
    step.add("m_scaled", "Mul", _tensor(), ["m_read", "c"])
    step.add("g_lr", "Mul", _tensor(), [grad, "lr"])
    step.add("m_new", "Sub", _tensor(), ["m_scaled", "g_lr"])
    step.add("m_write", "AssignVariableOp", {}, [m, "m_new"],
             after=["m_read"])
    step.add("m_again", "ReadVariableOp", _tensor(), [m], after=["m_write"])
    step.write("w", "m_again", "AssignAddVariableOp")
    index = step.index()
    (u,) = offload.find_updates(index, HOST).updates
    assert _names(index, u.host_ops) == [
        "g_lr", "m_again", "m_new", "m_read", "m_scaled", "m_write"]
    assert index.names[u.gradient[0]] == "w/grad"


def test_plain_sgd_has_nothing_to_move():
    step = Step()
    grad = step.variable("w")
    step.add("neg", "Neg", _tensor(), [grad])
    step.add("scaled", "Mul", _tensor(), ["neg", "lr"])
    step.write("w", "scaled", "AssignAddVariableOp")
    found = offload.find_updates(step.index(), HOST)
    assert found.updates == () and found.left == ()


def test_the_walk_stops_at_the_backward_pass():
    """The gradient is scaled element-wise (clipping) after the MatMul
    that makes it: the Mul is the update's, the MatMul is the gradient."""
    step = Step()
    grad = step.variable("w")
    step.add("clipped", "Mul", _tensor(), [grad, "lr"])
    step.write("w", step.adam("w", "clipped"))
    index = step.index()
    (u,) = offload.find_updates(index, HOST).updates
    assert index.names[u.gradient[0]] == "w/grad"
    assert index.id_of["clipped"] in u.host_ops
    assert index.id_of["w/grad"] not in u.host_ops
    assert index.id_of["w/y"] not in u.host_ops


def test_a_slot_shared_by_two_variables_stays():
    step = Step()
    g1 = step.variable("w1")
    g2 = step.variable("w2")
    m = step.slot("shared/m")
    step.write("w1", step.adam("w1", g1, m=m))
    step.write("w2", step.adam("w2", g2, m=m))
    found = offload.find_updates(step.index(), HOST)
    assert found.updates == ()
    assert len(found.left) == 2
    assert found.left[0].endswith(
        "its slot shared/m is used outside the update, by w2/adam/m_again")
    assert found.left[1].endswith(
        "its slot shared/m is used outside the update, by w1/adam/m_again")
    assert found.left[0].startswith("w1: ")


def test_two_gradient_candidates_stay():
    step = Step()
    grad = step.variable("w")
    step.add("other", "MatMul", _tensor(), ["x", "w/y"])
    step.add("both", "AddV2", _tensor(), [grad, "other"])
    step.write("w", step.adam("w", "both"))
    (line,) = offload.find_updates(step.index(), HOST).left
    assert line.startswith("w: ") and "two gradient candidates " \
        "(w/grad:0 and other:0)" in line


def test_an_update_without_a_gradient_stays():
    step = Step()
    step.variable("w")
    m = step.slot("w/m")
    step.add("m_read", "ReadVariableOp", _tensor(), [m])
    step.add("m_half", "Mul", _tensor(), ["m_read", "lr"])
    step.add("m_write", "AssignVariableOp", {}, [m, "m_half"],
             after=["m_read"])
    step.add("m_again", "ReadVariableOp", _tensor(), [m], after=["m_write"])
    step.write("w", "m_again", "AssignAddVariableOp")
    (line,) = offload.find_updates(step.index(), HOST).left
    assert "no gradient (no tensor of the variable's size from outside " \
        "the update)" in line


def test_two_writes_from_the_gradient_stay():
    step = Step()
    grad = step.variable("w")
    first = step.write("w", step.adam("w", grad))
    step.add("again", "Mul", _tensor(), [grad, "lr"])
    second = step.write("w", "again")
    (line,) = offload.find_updates(step.index(), HOST).left
    assert line == "w: written twice from tensors of its size (%s and " \
        "%s)" % (first, second)


def test_a_value_of_the_update_read_elsewhere_stays():
    step = Step()
    grad = step.variable("w")
    div = step.adam("w", grad)
    step.write("w", div)
    step.add("metric", "Sum", _tensor(()), [div])
    step.fetch.append("metric")
    (line,) = offload.find_updates(step.index(), HOST).left
    assert line.endswith("w/adam/div is read outside the update, by metric")


def test_an_update_inside_a_function_call_stays():
    """A LossScaleOptimizer applies the update in a cond: the variable's
    handle goes into an If and nothing outside writes it."""
    step = Step()
    grad = step.variable("w")
    step.slot("w/m")
    step.add("finite", "Placeholder", _tensor(()))
    cond = step.add("cond", "If", {"outputs": []},
                    ["finite", "w", "w/m", grad])
    step.fetch.append(cond)
    (line,) = offload.find_updates(step.index(), HOST).left
    assert line == "w: its update is inside cond (If), a function call " \
        "LMS does not look into"


def test_only_managed_devices_and_trainable_variables():
    index = _adam_step()
    assert not offload.find_updates(
        index, HOST, lambda d: d == "/device:GPU:1").updates
    step = Step()
    step.add("frozen", "Placeholder", _handle())  # not trainable
    step.add("frozen/read", "ReadVariableOp", _tensor(), ["frozen"])
    step.add("frozen/grad", "Relu", _tensor(), ["frozen/read"])
    step.write("frozen", step.adam("frozen", "frozen/grad"))
    assert offload.find_updates(step.index(), HOST).updates == ()


def test_fused_and_element_wise_updates_in_one_step():
    """A VarHandleOp updated by ResourceApplyAdam beside an element-wise
    update: both move, in the order of their writes; the fused one holds
    its host copy in the planning index."""
    step = Step()
    grad = step.variable("w", handle="VarHandleOp")
    step.slot("w/m", "VarHandleOp")
    step.slot("w/v", "VarHandleOp")
    step.add("fused", "ResourceApplyAdam", {"outputs": []},
             ["w", "w/m", "w/v"] + ["lr"] * 6 + [grad])
    step.fetch.append("fused")
    g2 = step.variable("u")
    step.write("u", step.adam("u", g2))
    index = step.index()
    found = offload.find_updates(index, HOST)
    fused, elementwise = found.updates
    assert fused.fused and fused.moved_ops == (fused.apply,)
    assert not elementwise.fused
    assert fused.apply < elementwise.apply
    assert found.weights_out_bytes == NBYTES  # the fused update's copy
    planned = offload.planning_index(index, found)
    assert planned.variable_bytes[fused.apply] == NBYTES
    assert planned.variable_bytes[elementwise.apply] == 0


def test_a_sparse_gradient_crosses_as_its_rows():
    """An embedding's gradient: rows and their indices, summed into the
    variable's shape for each use (Adam squares the rows before). The
    sums and the square run on the host; the gradient is the rows (what
    crosses the link), the indices stay on the device."""
    step = Step()
    step.add("emb", "Placeholder", _handle(trainable=True))
    step.add("emb/read", "ReadVariableOp", _tensor(), ["emb"])
    step.add("rows", "Reshape", _tensor((4, 32)), ["x"])
    step.add("ids", "Reshape", _tensor((4,)), ["x"])
    step.add("n", "Const", _tensor(()))
    step.add("dense", "UnsortedSegmentSum", _tensor(), ["rows", "ids", "n"])
    step.add("square", "Square", _tensor((4, 32)), ["rows"])
    step.add("dense_sq", "UnsortedSegmentSum", _tensor(),
             ["square", "ids", "n"])
    m, v = step.slot("m"), step.slot("v")
    for slot, grad in ((m, "dense"), (v, "dense_sq")):
        step.add(slot + "_read", "ReadVariableOp", _tensor(), [slot])
        step.add(slot + "_sub", "Sub", _tensor(), [grad, slot + "_read"])
        step.add(slot + "_write", "AssignAddVariableOp", {},
                 [slot, slot + "_sub"], after=[slot + "_read"])
        step.add(slot + "_again", "ReadVariableOp", _tensor(), [slot],
                 after=[slot + "_write"])
    step.add("sqrt", "Sqrt", _tensor(), ["v_again"])
    step.add("div", "RealDiv", _tensor(), ["m_again", "sqrt"])
    step.write("emb", "div")
    index = step.index()
    found = offload.find_updates(index, HOST)
    (u,) = found.updates
    assert (index.names[u.gradient[0]], u.gradient[1]) == ("rows", 0)
    assert {"dense", "dense_sq", "square"} <= set(_names(index, u.host_ops))
    assert not {"ids", "n", "rows"} & set(_names(index, u.host_ops))
    assert found.gradient_bytes == 4 * 32 * 4
