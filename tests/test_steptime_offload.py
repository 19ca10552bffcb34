"""The step-time model with ``offload_optimizer``: the offloaded updates'
copies and host compute in the predicted step, worked out by hand on a
literal step (round hardware, as in tests/test_steptime.py)."""

import dataclasses

import pytest

from tflms import analysis
from tflms import graph_index as gi
from tflms import hardware
from tflms import offload
from tflms import planner
from tflms import simulator
from tflms import steptime
from tflms.target import Target

DEVICE = "/device:GPU:0"
HOST = "/cpu:0"
# Memory at 1000 bytes/s: an op reading one 1000-byte tensor and writing
# another takes 2 s.
GPU = steptime.Gpu("test-gpu", fp32_flops=1000.0, tensor_flops=1000.0,
                   half_flops=4000.0, memory_bandwidth=1000.0,
                   memory_bytes=1 << 20, source="a round test device")
EXACT = steptime.KernelOptions(launch_overhead_s=0.0,
                               efficiency=steptime.PEAK, fusion=False)
# Adam's update touches 7024 bytes (below): 2 s on this host.
RATE = hardware.HostUpdateRate(bytes_per_s=3512.0, overhead_s=0.0,
                            source="a round test host")


def link(bytes_per_s):
    return steptime.Interconnect("test-link", "test link", bytes_per_s,
                                 "a round test link")


def adam_step(tail2_bytes=None):
    """x + w -> y -> g (w's gradient) -> tail; Adam's update of w (1000
    bytes, moments m and v of 1000 bytes each) reads g; the train op waits
    for the update and the tail.

    Device times: y 3 s (two tensors in, one out), g and tail 2 s, the
    update 7.024 s: it reads the six 4-byte scalars and g (1024 bytes) and
    reads and writes w, m and v (6000 bytes). Levels: read 1, y 2, g 3,
    tail and apply 4, train 5.

    With `tail2_bytes`, tail2 = relu(tail) of that many bytes (level 5)
    comes after tail, and the train op (level 6) waits for it instead."""
    handle = {"outputs": [((), 0)], "device": DEVICE}
    last = "tail"
    extra_ops, extra_edges = [], []
    if tail2_bytes is not None:
        last = "tail2"
        extra_ops = [("tail2", "Relu", {"outputs": [tail2_bytes]})]
        extra_edges = [("tail", "tail2")]
    return gi.from_edges(
        [("w", "VarHandleOp", dict(handle, variable_bytes=1000,
                                   trainable=True)),
         ("m", "VarHandleOp", dict(handle, variable_bytes=1000)),
         ("v", "VarHandleOp", dict(handle, variable_bytes=1000)),
         ("x", "Placeholder", {"outputs": [1000]}),
         ("read", "ReadVariableOp", {"outputs": [1000]}),
         ("y", "AddV2", {"outputs": [1000]}),
         ("g", "Relu", {"outputs": [1000]}),
         ("tail", "Relu", {"outputs": [1000]})] + extra_ops + [
         ("lr", "Const", {"outputs": [4]}),
         ("apply", "ResourceApplyAdam", {"outputs": []}),
         ("train", "NoOp", {"outputs": []})],
        edges=[("w", "read"), ("x", "y"), ("read", "y"), ("y", "g"),
               ("g", "tail"), ("w", "apply"), ("m", "apply"),
               ("v", "apply")] + [("lr", "apply")] * 6 + [("g", "apply")]
        + extra_edges,
        control_edges=[("apply", "train"), (last, "train")],
        fetches=["train"], default_device=DEVICE)


def models(index, bytes_per_s):
    """The step-time models without and with the update on the host."""
    found = offload.find_updates(index, HOST)
    moved = offload.planning_index(index, found)
    without = steptime.StepTimeModel(
        index, analysis.classify_ops(index, Target(host=HOST)), gpu=GPU,
        interconnect=link(bytes_per_s), kernels=EXACT)
    with_offload = steptime.StepTimeModel(
        moved, analysis.classify_ops(moved, Target(host=HOST)), gpu=GPU,
        interconnect=link(bytes_per_s), kernels=EXACT, offload=found,
        host=RATE)
    return without, with_offload


def test_the_offload_lengthens_the_step_by_its_copies_and_host_time():
    index = adam_step()
    without, with_offload = models(index, 250.0)
    apply = index.id_of["apply"]
    assert without.bytes_touched(apply) == 7024
    plain = without.predict()
    assert plain.with_lms_s == plain.without_lms_s == 3.0 + 2.0 + 2.0 + 7.024

    step = with_offload.predict()
    # Without LMS the update runs on the device: the same step.
    assert step.without_lms_s == plain.without_lms_s
    assert step.compute_s == 3.0 + 2.0 + 2.0  # the update left the device
    # At 250 bytes/s: the weights go out at the start (0-4 s); g is made
    # at 5 s and copied out 5-9 s; the host updates 9-11 s; the new
    # weights come back 11-15 s, and the train op waits for them.
    (update,) = step.host_updates
    assert (update.weights_out_start_s, update.weights_out_end_s) == (0, 4)
    assert (update.gradient_out_start_s,
            update.gradient_out_end_s) == (5, 9)
    assert (update.host_start_s, update.host_end_s) == (9, 11)
    assert (update.back_start_s, update.back_end_s) == (11, 15)
    assert step.op_start_s[index.id_of["train"]] == 15
    assert step.with_lms_s == 15
    assert step.with_lms_s - plain.with_lms_s == 15 - (3.0 + 2.0 + 2.0 + 7.024)
    assert (step.offload_out_bytes, step.offload_in_bytes) == (2000, 1000)
    assert step.host_update_s == 2
    assert (step.swapout_bytes, step.swapin_bytes) == (0, 0)


def test_a_fast_link_hides_the_copies_behind_the_backward_phase():
    """At 1000 bytes/s the update finishes on the host (6-8 s, write-back
    8-9 s) before it would have on the device (7-14.024 s)."""
    index = adam_step()
    without, with_offload = models(index, 1000.0)
    step = with_offload.predict()
    (update,) = step.host_updates
    assert (update.gradient_out_end_s, update.host_end_s,
            update.back_end_s) == (6, 8, 9)
    assert step.with_lms_s == 9
    assert without.predict().with_lms_s == pytest.approx(14.024)


def test_swap_outs_queue_behind_the_offloads_copies():
    """The weights' copy takes the device-to-host stream first (0-4 s):
    y's swap-out, made at 3 s, waits for it (4-8 s); its swap-in comes
    back 8-12 s, g runs 12-14 s and its copy goes out 14-18 s."""
    index = adam_step()
    _, with_offload = models(index, 250.0)
    i = index.id_of
    plan = planner.Plan(
        params=planner.SwapParams(1, 1, 0, 0),
        swaps=(planner.SwapPlan(
            producer=i["y"], output=0, nbytes=1000,
            swap_ins=(planner.SwapInPlan(consumers=((i["g"], 0),),
                                         triggers=(i["read"],),
                                         synchronous=False),),
            waiters=()),),
        serialization_edges=(), num_levels=index.num_levels)
    step = with_offload.predict(plan)
    (swap,) = step.swaps
    assert (swap.out_start_s, swap.out_end_s) == (4, 8)
    (update,) = step.host_updates
    assert (update.gradient_out_start_s, update.gradient_out_end_s) == (
        14, 18)


def test_without_offload_nothing_changes():
    index = adam_step()
    model = steptime.StepTimeModel(
        index, analysis.classify_ops(index, Target(host=HOST)), gpu=GPU,
        interconnect=link(250.0), kernels=EXACT)
    step = model.predict()
    assert step.host_updates == ()
    assert step.offload_out_bytes == step.offload_in_bytes == 0


def test_an_update_costs_its_overhead_on_the_host_too():
    index = adam_step()
    found = offload.find_updates(index, HOST)
    moved = offload.planning_index(index, found)
    host = hardware.HostUpdateRate(bytes_per_s=3512.0, overhead_s=0.5,
                                source="a round test host")
    step = steptime.StepTimeModel(
        moved, analysis.classify_ops(moved, Target(host=HOST)), gpu=GPU,
        interconnect=link(250.0), kernels=EXACT, offload=found,
        host=host).predict()
    (update,) = step.host_updates
    assert (update.host_start_s, update.host_end_s) == (9, 11.5)
    assert step.with_lms_s == 15.5


def test_the_default_host_is_the_documented_measurement():
    host = hardware.HOST_UPDATE_RATE
    assert (host.bytes_per_s, host.overhead_s) == (11e9, 6.3e-6)
    assert "11.0 GB/s" in host.source and "6.3 us" in host.source


def test_a_gradient_stays_on_the_device_until_its_copy_has_ended():
    """The adam step with a second tail op (tail2, 2000 bytes: 3 s) after
    tail. At 250 bytes/s g is copied out 5-9 s, after its last device
    reader (tail, level 4, 5-7 s): tail2's level starts at 7 s, before the
    copy ends, so the replay with the copies timed holds g through it.
    Device bytes at tail2's level: w, lr (4 bytes), tail's output, tail2's
    and g: 5004; with instant copies g is freed after level 4: 4004. Level
    4 holds w, lr, g, tail's output and the new weights' landing buffer:
    4004 both ways."""
    index = adam_step(tail2_bytes=2000)
    _, timer = models(index, 250.0)
    moved = timer.index
    found = offload.find_updates(index, HOST)
    memory = simulator.SimulationModel(
        moved, analysis.classify_ops(moved, Target(host=HOST)), None,
        landings=offload.write_back_buffers(found, moved))
    plan = planner.Plan(params=planner.SwapParams(1, 1, 0, 0), swaps=(),
                        serialization_edges=(), num_levels=moved.num_levels)
    instant = memory.replay(plan)
    timed, step = steptime.replay_in_time(memory, timer, plan)
    i = moved.id_of
    (update,) = step.host_updates
    assert update.gradient == (i["g"], 0)
    assert (update.gradient_out_start_s, update.gradient_out_end_s) == (5, 9)
    tail2 = int(timed.levels[i["tail2"]])
    assert tail2 == int(timed.levels[i["tail"]]) + 1
    assert step.level_start_s[tail2] == 7
    assert steptime.copy_levels(step).gradients_held_through == (
        ((i["g"], 0), tail2),)
    assert instant.device_timeline[tail2] == 4004
    assert timed.device_timeline[tail2] == 5004
    assert timed.peak_device_bytes == 5004
    assert instant.peak_device_bytes == 4004
    level4 = tail2 - 1
    assert instant.device_timeline[level4] == timed.device_timeline[
        level4] == 4004


def momentum_step():
    """x + w -> y -> g (w's gradient, a Relu: the update's walk stops
    there); Keras 3's momentum update of w (1000 one-byte elements) by
    element-wise ops: m_new = m * g written to the slot m, read again and
    added to w by the device's write of w (apply), which the train op
    waits for.

    Device times: y 3 s, g 2 s, m_new 3 s (two tensors in, one out),
    m_write 2 s (its value read, the slot written), apply 3 s (its value
    read, w read and written); reads run no kernel. The host runs
    m_new and m_write: 5000 bytes."""
    handle = {"outputs": [((), 0)], "device": DEVICE}
    return gi.from_edges(
        [("w", "Placeholder", dict(handle, variable_bytes=1000,
                                   trainable=True)),
         ("m", "Placeholder", dict(handle, variable_bytes=1000)),
         ("x", "Placeholder", {"outputs": [1000]}),
         ("read", "ReadVariableOp", {"outputs": [1000]}),
         ("y", "AddV2", {"outputs": [1000]}),
         ("g", "Relu", {"outputs": [1000]}),
         ("m_read", "ReadVariableOp", {"outputs": [1000]}),
         ("m_new", "Mul", {"outputs": [1000]}),
         ("m_write", "AssignVariableOp", {"outputs": []}),
         ("m_again", "ReadVariableOp", {"outputs": [1000]}),
         ("apply", "AssignSubVariableOp", {"outputs": []}),
         ("train", "NoOp", {"outputs": []})],
        edges=[("w", "read"), ("x", "y"), ("read", "y"), ("y", "g"),
               ("m", "m_read"), ("m_read", "m_new"), ("g", "m_new"),
               ("m", "m_write"), ("m_new", "m_write"), ("m", "m_again"),
               ("w", "apply"), ("m_again", "apply")],
        control_edges=[("m_read", "m_write"), ("m_write", "m_again"),
                       ("read", "apply"), ("apply", "train")],
        fetches=["train"], default_device=DEVICE)


def test_an_element_wise_update_runs_its_ops_on_the_host():
    """At 250 bytes/s: no weights go out (the update does not read w); g
    is made at 5 s and copied out 5-9 s; the host runs m_new and m_write
    (5000 bytes at 1000 bytes/s) 9-14 s; the new value comes back 14-18
    s, and apply, which reads it on the device, runs 18-21 s."""
    index = momentum_step()
    found = offload.find_updates(index, HOST)
    (u,) = found.updates
    assert [index.names[o] for o in u.host_ops] == [
        "m_read", "m_new", "m_write", "m_again"]
    moved = offload.planning_index(index, found)
    host = hardware.HostUpdateRate(bytes_per_s=1000.0, overhead_s=0.0,
                                   source="a round test host")
    model = steptime.StepTimeModel(
        moved, analysis.classify_ops(moved, Target(host=HOST)), gpu=GPU,
        interconnect=link(250.0), kernels=EXACT, offload=found, host=host)
    step = model.predict()
    (update,) = step.host_updates
    assert (update.weights_out_start_s, update.weights_out_end_s) == (0, 0)
    assert (update.gradient_out_start_s,
            update.gradient_out_end_s) == (5, 9)
    assert (update.host_start_s, update.host_end_s) == (9, 14)
    assert (update.back_start_s, update.back_end_s) == (14, 18)
    i = index.id_of
    assert (step.op_start_s[i["apply"]], step.op_end_s[i["apply"]]) == (
        18, 21)
    assert step.with_lms_s == 21
    assert step.compute_s == 3 + 2 + 3  # y, g and apply on the device
    assert (step.offload_out_bytes, step.offload_in_bytes) == (1000, 1000)
    assert step.host_update_s == 5
    # Without LMS the update's ops run on the device: y, g, m_new,
    # m_write and apply.
    plain = steptime.StepTimeModel(
        index, analysis.classify_ops(index, Target(host=HOST)), gpu=GPU,
        interconnect=link(250.0), kernels=EXACT).predict()
    assert step.without_lms_s == plain.without_lms_s == 3 + 2 + 3 + 2 + 3


def test_an_element_wise_update_that_reads_the_weights_copies_them():
    """The same update as one that reads the variable
    (`Update.reads_weights`, as Ftrl's does): the weights go out at the
    start, 0-4 s."""
    index = momentum_step()
    found = offload.find_updates(index, HOST)
    (u,) = found.updates
    assert not u.reads_weights
    reads = offload.Offload(
        found.host, (dataclasses.replace(u, reads_weights=True),),
        found.slot_bytes, found.weight_bytes, found.gradient_bytes)
    moved = offload.planning_index(index, reads)
    step = steptime.StepTimeModel(
        moved, analysis.classify_ops(moved, Target(host=HOST)), gpu=GPU,
        interconnect=link(250.0), kernels=EXACT, offload=reads,
        host=RATE).predict()
    (update,) = step.host_updates
    assert (update.weights_out_start_s, update.weights_out_end_s) == (0, 4)
    assert step.offload_out_bytes == 2000
