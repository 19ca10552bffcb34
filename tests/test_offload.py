"""`tflms.offload`: which updates move to the host, on literal graphs,
and its table of fused kernels against TensorFlow's op registry."""

import pytest
from tensorflow.python.framework import op_def_registry

from tflms import analysis
from tflms import graph_index as gi
from tflms import hardware
from tflms import offload
from tflms import simulator
from tflms.context import Budgets, PlanningContext
from tflms.floor import step_floor
from tflms.settings import Settings
from tflms.target import Target

DEVICE = "/device:GPU:0"
HOST = "/cpu:0"


@pytest.mark.parametrize("op_type", sorted(offload.APPLY_INPUTS))
def test_the_table_names_the_kernels_inputs(op_type):
    op_def = op_def_registry.get(op_type)
    names = [arg.name for arg in op_def.input_arg]
    slots, grad = offload.APPLY_INPUTS[op_type]
    assert names[0] == "var"
    assert names[grad] == "grad"
    resources = [i for i, arg in enumerate(op_def.input_arg)
                 if arg.type == 20]  # DT_RESOURCE
    assert resources == [0] + list(slots)
    # Its reference-variable form, where TensorFlow has one, is refused
    # by name (`find_updates`).
    if op_type not in ("ResourceApplyAdamWithAmsgrad",
                       "ResourceApplyKerasMomentum"):
        assert op_def_registry.get(op_type[len("Resource"):]) is not None


def _adam_step(var_device=DEVICE, slot_type="VarHandleOp"):
    """A literal step: a 1 MiB weight, its Adam moments, its gradient and
    the fused update."""
    mib = 1 << 20
    handle = {"outputs": [((), 0)], "device": var_device}
    return gi.from_edges(
        [("w", "VarHandleOp", dict(handle, variable_bytes=mib,
                                   trainable=True)),
         ("m", slot_type, dict(handle, variable_bytes=mib)),
         ("v", "VarHandleOp", dict(handle, variable_bytes=mib)),
         ("x", "Placeholder", {"outputs": [mib]}),
         ("read", "ReadVariableOp", {"outputs": [mib]}),
         ("y", "MatMul", {"outputs": [mib]}),
         ("grad", "MatMul", {"outputs": [mib]}),
         ("lr", "Const", {"outputs": [4]}),
         ("apply", "ResourceApplyAdam", {"outputs": []})],
        edges=[("w", "read"), ("x", "y"), ("read", "y"), ("y", "grad"),
               ("x", "grad"),
               ("w", "apply"), ("m", "apply"), ("v", "apply")]
        + [("lr", "apply")] * 6 + [("grad", "apply")],
        fetches=["apply"], default_device=DEVICE)


def test_find_updates_and_the_planning_index():
    index = _adam_step()
    found = offload.find_updates(index, HOST)
    names = index.names
    (update,) = found.updates
    assert names[update.apply] == "apply"
    assert names[update.variable] == "w"
    assert [names[s] for s in update.slots] == ["m", "v"]
    assert names[update.gradient[0]] == "grad"
    mib = 1 << 20
    assert (found.slot_bytes, found.weight_bytes, found.gradient_bytes) == (
        2 * mib, mib, mib)
    assert found.moved_bytes() == 3 * mib
    assert "the updates of 1 variables and their 2 slots (2.0 MiB) run " \
           "on /cpu:0; per step 3.0 MiB cross the link" in found.describe()

    link = hardware.interconnect_named("pcie4")
    assert found.link_seconds(link) == 2 * mib / link.d2h_bytes_per_s
    assert found.link_seconds(hardware.INSTANT) == 0

    planned = offload.planning_index(index, found)
    roles = analysis.classify_ops(planned, Target(host=HOST))
    base_roles = analysis.classify_ops(index, Target(host=HOST))
    assert {names[i] for i in base_roles.device_ops - roles.device_ops} == {
        "m", "v", "apply"}
    before = simulator.SimulationModel(index, base_roles, None)
    after = simulator.SimulationModel(planned, roles, None)
    assert after.resident_device_bytes == before.resident_device_bytes \
        - 2 * mib
    assert after.resident_host_bytes == before.resident_host_bytes + 3 * mib
    assert (step_floor(before).resident_bytes
            - step_floor(after).resident_bytes) == 2 * mib


def test_updates_on_the_host_or_of_other_slots_stay():
    assert not offload.find_updates(_adam_step(var_device=HOST),
                                    HOST).updates
    found = offload.find_updates(_adam_step(slot_type="Placeholder"), HOST)
    assert not found.updates and found.left == ("apply",)
    index = _adam_step()
    nothing = offload.Offload(HOST, (), 0, 0, 0)
    assert offload.planning_index(index, nothing) is index


def test_a_logical_cpu_other_than_the_host_is_offloaded():
    found = offload.find_updates(_adam_step(var_device="/cpu:1"), HOST)
    assert len(found.updates) == 1


def test_reference_variable_updates_are_refused():
    index = gi.from_edges(
        [("w", "VariableV2"), ("m", "VariableV2"), ("g", "Const"),
         ("apply", "ApplyMomentum")],
        edges=[("w", "apply"), ("m", "apply"), ("g", "apply"),
               ("g", "apply"), ("g", "apply")],
        default_device=DEVICE)
    with pytest.raises(offload.OffloadUnsupportedError,
                       match=r"cannot move the update 'apply' "
                             r"\(ApplyMomentum\): it updates a reference "
                             r"variable.*or set offload_optimizer=False"):
        offload.find_updates(index, HOST)


def test_only_the_managed_devices_updates_move():
    index = _adam_step()
    gpu1 = offload.find_updates(index, HOST,
                                lambda d: d == "/device:GPU:1")
    assert not gpu1.updates
    gpu0 = offload.find_updates(
        index, HOST, Target(device=DEVICE, host=HOST).manages)
    assert len(gpu0.updates) == 1


def test_the_new_weights_land_in_a_device_buffer_at_the_updates_level():
    """The write-back's device buffer: the variable's bytes, at the level
    of the update (4: after the gradient, level 3), on the device."""
    mib = 1 << 20
    index = _adam_step()
    found = offload.find_updates(index, HOST)
    planned = offload.planning_index(index, found)
    roles = analysis.classify_ops(planned, Target(host=HOST))
    apply = planned.id_of["apply"]
    landings = offload.write_back_buffers(found, planned)
    assert landings == ((apply, mib, "w (new weights from the host)"),)
    assert offload.write_back_buffers(None, planned) == ()
    plain = simulator.SimulationModel(planned, roles, None).replay()
    landed = simulator.SimulationModel(planned, roles, None,
                                       landings=landings).replay()
    assert planned.levels[apply] == 4
    added = (landed.device_timeline - plain.device_timeline).tolist()
    assert added == [0, 0, 0, 0, mib]
    # At level 4: the weights (resident), the gradient the update reads
    # and the new weights (and the 4-byte learning rate); the peak stays
    # at level 3 (x, y, the gradient and the weights).
    assert landed.device_timeline[4] == 3 * mib + 4
    assert (landed.peak_level, landed.peak_device_bytes) == (3, 4 * mib + 4)
    # The planning context's models count it with the offload they plan.
    context = PlanningContext.create(
        planned, Settings(), roles=roles, budgets=Budgets(),
        target=Target(host=HOST, offload=found))
    assert context.model(planned).replay().device_timeline.tolist() == \
        landed.device_timeline.tolist()


@pytest.mark.parametrize("device", [DEVICE, "/device:GPU:1"])
def test_the_planning_step_is_the_manual_sequence(device):
    """`planning_step` is `find_updates`, `planning_index` and the target
    with its ``offload``, `managed` passed on: the GPU:1 target manages
    none of the step's ops, so nothing moves."""
    index = _adam_step()
    target = Target(device=device, host=HOST, grappler_groups=True)
    planned, placed, found = offload.planning_step(index, target, HOST,
                                                   target.manages)
    manual = offload.find_updates(index, HOST, target.manages)
    assert found == manual
    assert placed == target.replace(offload=manual)
    assert placed.grappler_groups and placed.device == device
    expected = offload.planning_index(index, manual)
    assert (planned.devices, planned.variable_bytes) == (
        expected.devices, expected.variable_bytes)
    moved = {index.names[i] for i in range(index.num_ops)
             if planned.devices[i] == HOST}
    assert moved == ({"m", "v", "apply"} if device == DEVICE else set())
    assert (planned is index) == (device != DEVICE)
